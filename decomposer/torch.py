"""Export a PyTorch model with today's exporter and get a dynamic, plugin-free ONNX model.

In: a ``torch.nn.Module``, its example inputs and an output path (:func:`export`); or a
user's ``torch.autograd.Function`` whose ``symbolic()`` emits an opaque node
(:func:`opaque_function`). Out: an ONNX file of standard ops at the opset asked for, with
every size declared dynamic still dynamic, checked on ONNX Runtime against the model in
eager mode, and the run's :class:`decomposer.Report`.

What plain ``torch.onnx.export`` (torch 2.13, dynamo by default) gets wrong, and what
:func:`export` does instead:

- ``F.affine_grid`` is traced through its Python decomposition, which freezes H and W to
  the example's sizes (``Dim.AUTO``: silently; named dims: an error) and writes a base grid
  26-390x slower than a native kernel. ``export`` routes it, during the export only,
  through a ``torch.library`` custom op that the ONNX translation writes as
  ``custom.ops::AffineGrid(theta, Concat(sizes))``, every size symbolic, then decomposes it.
- ``F.grid_sample`` and ``torch.rot90`` go the same way (``custom.ops::GridSample``,
  ``custom.ops::Rot90``) where that is better than torch's own export: below the opset
  that has GridSample, where ONNX Runtime's kernel is slow or differs from torch (see
  :func:`grid_sample_stays_native`), and for rot90 because torch writes a ``Slice`` with
  step -1, which onnx2tf silently turns into Identity. An op is routed only when a
  registered pattern rewrites that exact node (asked with a one-node probe model), so an op
  no pattern knows is exported as torch would export it.
- ``torch.linalg.inv`` / ``torch.inverse`` / ``Tensor.inverse``, ``torch.linalg.inv_ex``
  (``check_errors=False``), ``torch.linalg.solve``, ``torch.searchsorted`` (tensor values)
  and ``torch.cummax`` / ``torch.cummin`` have no ONNX function in torch's exporter at all
  ("No ONNX function found for aten.linalg_inv_ex"). ``export`` routes them the same way,
  to ``custom.ops::Inverse`` / ``Solve`` / ``SearchSorted`` / ``CumMax`` / ``CumMin`` and
  ``org.pytorch.aten::linalg_inv_ex``.
- ``opset_version`` below 18 silently stays 18 (the exporter's conversion fails and is only
  logged). ``export`` exports at 18 and converts itself, or raises :class:`ExportError`.
- A dim declared dynamic that torch froze (in the exported program, the ONNX inputs or
  outputs) raises :class:`ExportError` naming the input and dim, before anything is
  written; one frozen only inside the graph fails verification, which runs a second input
  set in which every dim declared dynamic has another size.

With ``dynamo=False`` the same nodes come from symbolic functions registered for the
duration of the export (``aten::affine_grid_generator``, ``aten::grid_sampler``,
``aten::rot90``).

:func:`opaque_function` is the seeds' recipe on modern torch: it turns an
``autograd.Function`` with a ``symbolic()`` into one that exports the same opaque node
(domain, op type, typed attributes) under the dynamo exporter too, by running that
``symbolic()`` inside the custom op's ONNX translation; the legacy exporter and eager mode
keep calling the original Function.

torch is imported by this module only; ``import decomposer`` never imports it.
Not thread-safe: the routing is a torch function mode of the exporting thread, and the
legacy symbolics are process-wide while an export runs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import tempfile
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper
from torch.overrides import TorchFunctionMode

from decomposer.api import decompose_with_report
from decomposer.errors import (
    DecomposerError,
    ExportError,
    InvalidModelError,
    ModelIOError,
    VerificationError,
)
from decomposer.modelio import load_model, save_model
from decomposer.report import Report
from decomposer.verification import TensorCheck, VerifyReport, compare, require_passed

__all__ = ["OPAQUE_DOMAIN", "ExportError", "data_dependent_size", "export",
           "grid_sample_stays_native", "opaque_function", "translation_table"]

logger = logging.getLogger(__name__)

# torch's untyped or not re-exported corners, reached through Any (mypy --strict)
_TORCH_ONNX: Any = torch.onnx
_TORCH_LIBRARY: Any = torch.library
_TORCH_JIT: Any = torch.jit

OPAQUE_DOMAIN = "custom.ops"  # where routed ops go; the patterns accept any domain
ATEN_DOMAIN = "org.pytorch.aten"  # for ops whose patterns take only torch's fallback forms
TORCHLIB_OPSET = 18  # the opset torch's ONNX functions are written in; lower ones are converted
DEFAULT_ATOL = 1e-3  # whole models vs eager: ORT and torch kernels round differently
DEFAULT_RTOL = 1e-3
_ROUTING_NAMESPACE = "decomposer"
_USER_NAMESPACE = "decomposer_opaque"
_ALL_TENSOR_TYPES = [f"tensor({name})" for name in (
    "float", "double", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8",
    "uint16", "uint32", "uint64", "bool", "string")]
_TORCH_TO_ONNX = {torch.float32: TensorProto.FLOAT, torch.float16: TensorProto.FLOAT16,
                  torch.float64: TensorProto.DOUBLE, torch.bfloat16: TensorProto.BFLOAT16,
                  torch.int64: TensorProto.INT64, torch.int32: TensorProto.INT32,
                  torch.int16: TensorProto.INT16, torch.int8: TensorProto.INT8,
                  torch.uint8: TensorProto.UINT8, torch.bool: TensorProto.BOOL}
_JIT_TO_ONNX = {"Float": TensorProto.FLOAT, "Half": TensorProto.FLOAT16,
                "Double": TensorProto.DOUBLE, "BFloat16": TensorProto.BFLOAT16}
_GRID_MODES = ("bilinear", "nearest", "bicubic")  # torch's enum order in aten::grid_sampler
_GRID_PADDINGS = ("zeros", "border", "reflection")
# Reduce ops whose noop_with_empty_axes attribute appeared at opset 18 (ReduceSum: 13);
# onnx's version converter keeps it when it moves the axes input back to an attribute.
# Ops whose axes (or split sizes) became an input: below this opset they are an attribute.
_AXES_INPUT_SINCE = {"ReduceSum": 13, "Squeeze": 13, "Unsqueeze": 13, "Split": 13,
                     **{name: 18 for name in (
                         "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                         "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
                         "ReduceLogSumExp")}}


# -- inputs and the dims declared dynamic ---------------------------------------------------


@dataclass(frozen=True)
class _Leaf:
    """One flattened model input, in the order torch's exporters flatten them."""

    label: str  # "x", "inputs[0]", "batch['image']"
    path: tuple[Any, ...]  # (top-level name, nested keys...)
    value: Any


@dataclass(frozen=True)
class DynamicDim:
    """A dim the user declared dynamic. ``tensor`` indexes the tensor inputs."""

    label: str
    tensor: int
    dim: int
    group: str  # dims of one group get the same new size in the second input set
    low: int = 2
    high: int | None = None

    def describe(self) -> str:
        return f"input '{self.label}' dim {self.dim}"


def _top_level(model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]
               ) -> list[tuple[str, Any]]:
    """(name, value) of every argument: the forward parameter's name where there is one."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    named: list[tuple[str, Any]] = []
    for position, value in enumerate(args):
        param = params[position] if position < len(params) else None
        usable = param is not None and param.kind in (
            inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        named.append((param.name if usable and param else f"args[{position}]", value))
    named.extend(kwargs.items())
    return named


def _flatten(label: str, path: tuple[Any, ...], value: Any) -> Iterator[_Leaf]:
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _flatten(f"{label}[{index}]", (*path, index), item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _flatten(f"{label}[{key!r}]", (*path, key), item)
    else:
        yield _Leaf(label, path, value)


def _input_leaves(model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[_Leaf]:
    leaves: list[_Leaf] = []
    for name, value in _top_level(model, args, kwargs):
        leaves.extend(_flatten(name, (name,), value))
    return leaves


def _tensor_leaves(leaves: Sequence[_Leaf]) -> list[_Leaf]:
    return [leaf for leaf in leaves if isinstance(leaf.value, torch.Tensor)]


def _spec_for(leaf: _Leaf, spec: Any, top_names: list[str]) -> Any:
    """The part of a ``dynamic_shapes`` structure that describes ``leaf``."""
    name, nested = leaf.path[0], leaf.path[1:]
    if isinstance(spec, Mapping):
        node = spec.get(name)
    elif isinstance(spec, (list, tuple)):
        position = top_names.index(name)
        node = spec[position] if position < len(spec) else None
    else:
        return None
    for key in nested:
        if isinstance(node, Mapping) and key in node and not isinstance(key, int):
            node = node[key]
        elif isinstance(node, (list, tuple)) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            return None
    return node


def _dim_specs(tensor_spec: Any) -> dict[int, Any]:
    """{dim: spec} of one tensor's spec: a dict, or a list/tuple with one entry per dim."""
    if isinstance(tensor_spec, Mapping):
        return {int(k): v for k, v in tensor_spec.items()}
    if isinstance(tensor_spec, (list, tuple)):
        return dict(enumerate(tensor_spec))
    return {}


def _bound(value: Any) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError, AttributeError):
        # AttributeError: sympy's infinity, which ``Dim("b")`` without a max carries,
        # fails int() that way (sympy 1.14).
        return None
    return number if abs(number) < (1 << 40) else None


def _classify_dim(spec: Any) -> tuple[bool, str | None, int, int | None]:
    """(dynamic, name, low, high) of one dim's spec: None/int static, a string or
    ``Dim("h")`` named, ``Dim.AUTO``/``Dim.DYNAMIC`` anonymous, ``Dim.STATIC`` static."""
    if spec is None or isinstance(spec, (int, bool)):
        return False, None, 0, None
    if isinstance(spec, str):
        return True, spec, 2, None
    hint_type = getattr(spec, "type", None)
    if hint_type is not None and not hasattr(spec, "__name__"):  # a Dim.AUTO-style hint
        if "STATIC" in str(hint_type):
            return False, None, 0, None
        return True, None, _bound(getattr(spec, "min", None)) or 2, \
            _bound(getattr(spec, "max", None))
    name = getattr(spec, "__name__", None)
    return True, str(name) if name else None, _bound(getattr(spec, "min", None)) or 2, \
        _bound(getattr(spec, "max", None))


def _declared_dynamic(leaves: Sequence[_Leaf], dynamic_shapes: Any,
                      dynamic_axes: Mapping[str, Any] | None,
                      input_names: Sequence[str] | None) -> list[DynamicDim]:
    """Every tensor-input dim declared dynamic, from ``dynamic_shapes`` (torch.export style)
    and/or legacy ``dynamic_axes`` (keyed by ``input_names`` or parameter names)."""
    tensors = _tensor_leaves(leaves)
    top_names = list(dict.fromkeys(leaf.path[0] for leaf in leaves))
    found: dict[tuple[int, int], DynamicDim] = {}
    for index, leaf in enumerate(tensors):
        shape = tuple(leaf.value.shape)
        specs: dict[int, Any] = {}
        if dynamic_shapes is not None:
            specs.update(_dim_specs(_spec_for(leaf, dynamic_shapes, top_names)))
        onnx_name = input_names[index] if input_names and index < len(input_names) \
            else leaf.label
        axes = (dynamic_axes or {}).get(onnx_name)
        if isinstance(axes, Mapping):
            specs.update({int(k): str(v) for k, v in axes.items()})
        elif isinstance(axes, (list, tuple)):
            specs.update({int(k): f"{onnx_name}_dim{k}" for k in axes})
        for dim, spec in sorted(specs.items()):
            dynamic, name, low, high = _classify_dim(spec)
            if not dynamic or not -len(shape) <= dim < len(shape):
                continue
            dim %= len(shape)
            # Anonymous dims of equal example size move together: torch unifies them when
            # the model relates them (a batch shared by two inputs).
            group = name if name else f"#size{shape[dim]}"
            found[(index, dim)] = DynamicDim(leaf.label, index, dim, group, low, high)
    return list(found.values())


def _second_size(size: int, low: int, high: int | None) -> int | None:
    """Another size for a dynamic dim: a step of the largest power of two dividing it (at
    most 16), so models that need multiples (strided convs, pooling) still run."""
    step = min(size & -size, 16) if size > 0 else 1
    for candidate in (size + step, size - step, size + 1, size - 1, size + 2):
        if candidate >= max(low, 2) and (high is None or candidate <= high) \
                and candidate != size:
            return candidate
    return None


def _second_inputs(leaves: Sequence[_Leaf], dynamic: Sequence[DynamicDim], seed: int
                   ) -> tuple[list[Any], list[str]]:
    """Leaf values with every dynamic dim resized, and a description of each change.

    Float tensors get seeded random values with the example's mean and spread; other
    tensors repeat the example's values (indices and flags stay in range). An example
    sorted along its last dim (a searchsorted sequence, bin edges) gets sorted values."""
    rng = np.random.default_rng(seed)
    tensors = _tensor_leaves(leaves)
    new_sizes: dict[str, int] = {}
    changes: list[str] = []
    shapes = [list(leaf.value.shape) for leaf in tensors]
    for dim in dynamic:
        old = shapes[dim.tensor][dim.dim]
        if dim.group not in new_sizes:
            size = _second_size(int(tensors[dim.tensor].value.shape[dim.dim]), dim.low,
                                dim.high)
            if size is None:
                continue
            new_sizes[dim.group] = size
        shapes[dim.tensor][dim.dim] = new_sizes[dim.group]
        changes.append(f"{dim.label}[{dim.dim}]: {old} -> {new_sizes[dim.group]}")
    values: list[Any] = []
    position = 0
    for leaf in leaves:
        if not isinstance(leaf.value, torch.Tensor):
            values.append(leaf.value)
            continue
        example, shape = leaf.value.detach().cpu(), shapes[position]
        position += 1
        if list(example.shape) == shape:
            values.append(example)
        elif example.is_floating_point():
            data = example.double()
            spread = float(data.std()) if data.numel() > 1 else 1.0
            mean = float(data.mean()) if data.numel() else 0.0
            noise = rng.normal(mean, spread or 1.0, size=shape)
            values.append(torch.from_numpy(noise).to(example.dtype))
        else:
            flat = example.reshape(-1).numpy()
            repeated = np.resize(flat, shape) if flat.size else np.zeros(shape, flat.dtype)
            # np.array, not np.ascontiguousarray, which turns a 0-d input into 1-d
            values.append(torch.from_numpy(np.array(repeated, order="C")))
        if _sorted_rows(example):
            values[-1] = torch.sort(values[-1], dim=-1).values
    return values, changes


def _sorted_rows(example: Any) -> bool:
    """Whether a tensor with rows of 2+ elements is non-decreasing along its last dim."""
    if example.dim() == 0 or example.shape[-1] < 2 or example.dtype == torch.bool \
            or example.is_complex():
        return False
    return bool((example[..., 1:] >= example[..., :-1]).all())


def _rebuild(leaves: Sequence[_Leaf], values: Sequence[Any], args: tuple[Any, ...],
             kwargs: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args``/``kwargs`` with every leaf replaced by the matching one of ``values``."""
    replacement = iter(values)

    def rebuild(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            items = [rebuild(item) for item in value]
            return type(value)(items) if isinstance(value, list) else tuple(items)
        if isinstance(value, dict):
            return {key: rebuild(item) for key, item in value.items()}
        return next(replacement)

    new_args = tuple(rebuild(value) for value in args)
    new_kwargs = {key: rebuild(value) for key, value in kwargs.items()}
    return new_args, new_kwargs


# -- probing the registry: would a pattern rewrite this node? --------------------------------


def _onnx_type(dtype: Any) -> int | None:
    return _TORCH_TO_ONNX.get(dtype)


@functools.lru_cache(maxsize=256)
def _pattern_rewrites(op_type: str, inputs: tuple[tuple[int, tuple[int | str, ...]], ...],
                      attrs: tuple[tuple[str, Any], ...], opset: int, target: str,
                      outputs: int = 1, domain: str = OPAQUE_DOMAIN) -> bool:
    """Whether the registered patterns rewrite ``domain::op_type`` with these input
    types, shapes and attributes at ``opset``: a one-node model is decomposed to find out."""
    names = [f"in{i}" for i in range(len(inputs))]
    graph_inputs = [helper.make_tensor_value_info(name, elem_type, list(shape))
                    for name, (elem_type, shape) in zip(names, inputs, strict=True)]
    output_names = [f"out{i}" for i in range(outputs)]
    node = helper.make_node(op_type, names, output_names, domain=domain)
    node.attribute.extend(helper.make_attribute(key, list(value) if isinstance(value, tuple)
                                                else value) for key, value in attrs)
    imports = [helper.make_opsetid("", opset), helper.make_opsetid(domain, 1)]
    graph = helper.make_graph([node], "probe", graph_inputs,
                              [helper.make_empty_tensor_value_info(name)
                               for name in output_names])
    probe = helper.make_model(graph, opset_imports=imports,
                              ir_version=helper.find_min_ir_version_for(imports[:1], True))
    try:
        _, report = decompose_with_report(probe, allow_unsupported=True, check=False,
                                          target=target)
    except DecomposerError:
        return False
    return bool(report.replaced)


def grid_sample_stays_native(rank: int, mode: str, padding_mode: str, align_corners: bool,
                             opset: int) -> bool:
    """Whether torch's own export (a standard GridSample) is the better choice.

    It is when the opset has GridSample for this rank (16 for 4-D, 20 for 5-D) and ONNX
    Runtime has its fast path: bilinear, zeros, align_corners=False on 4-D input, where the
    decomposition measured 1.2-2.4x slower. Every other combination runs ONNX Runtime's
    generic per-channel loop, which the decomposition beats (0.14-0.89x), and nearest with
    reflection padding and align_corners=False rounds ties differently from torch.
    """
    has_op = opset >= (16 if rank == 4 else 20)
    fast_path = rank == 4 and mode == "bilinear" and padding_mode == "zeros" \
        and not align_corners
    return has_op and fast_path


def _symbolic_shape(rank: int, fixed: Mapping[int, int] | None = None) -> tuple[int | str, ...]:
    fixed = fixed or {}
    return tuple(fixed.get(axis, f"d{axis}") for axis in range(rank))


# -- routing under the dynamo exporter: custom ops and their ONNX translations ---------------


class _RoutingOps:
    """The custom ops torch.export keeps opaque, with shapes that stay symbolic."""

    def __init__(self) -> None:
        namespace = _ROUTING_NAMESPACE

        @torch.library.custom_op(f"{namespace}::affine_grid", mutates_args=())
        def affine_grid(theta: torch.Tensor, size: Sequence[int],
                        align_corners: bool) -> torch.Tensor:
            return F.affine_grid(theta, list(size), align_corners=align_corners)

        @affine_grid.register_fake
        def _(theta: torch.Tensor, size: Sequence[int], align_corners: bool) -> torch.Tensor:
            # (N, H, W, 2) or (N, D, H, W, 3) straight from the (symbolic) sizes: torch's
            # own decomposition guards on them, which is what freezes H and W.
            return theta.new_empty((size[0], *size[2:], len(size) - 2))

        # ``native`` asks the translation for a standard GridSample instead of the opaque
        # node. grid_sample is routed either way: torch's fake kernel for it runs its Python
        # decomposition on symbolic shapes, which takes seconds per call.
        @torch.library.custom_op(f"{namespace}::grid_sample", mutates_args=())
        def grid_sample(x: torch.Tensor, grid: torch.Tensor, mode: str, padding_mode: str,
                        align_corners: bool, native: bool) -> torch.Tensor:
            return F.grid_sample(x, grid, mode=mode, padding_mode=padding_mode,
                                 align_corners=align_corners)

        @grid_sample.register_fake
        def _(x: torch.Tensor, grid: torch.Tensor, mode: str, padding_mode: str,
              align_corners: bool, native: bool) -> torch.Tensor:
            return x.new_empty((x.shape[0], x.shape[1], *grid.shape[1:-1]))

        @torch.library.custom_op(f"{namespace}::rot90", mutates_args=())
        def rot90(x: torch.Tensor, k: int, dims: Sequence[int]) -> torch.Tensor:
            return torch.rot90(x, k, list(dims)).clone()

        @rot90.register_fake
        def _(x: torch.Tensor, k: int, dims: Sequence[int]) -> torch.Tensor:
            shape = list(x.shape)
            if k % 2:
                a, b = dims[0] % x.dim(), dims[1] % x.dim()
                shape[a], shape[b] = shape[b], shape[a]
            return x.new_empty(shape)

        # Linear algebra, searchsorted and cummax/cummin: torch's exporter has no ONNX
        # function for them at all (aten.linalg_inv_ex, aten.linalg_solve_ex,
        # aten.searchsorted, aten.cummax / cummin). Their fake kernels are torch's own meta
        # kernels, which read the shapes without guarding on them.
        @torch.library.custom_op(f"{namespace}::inverse", mutates_args=())
        def inverse(a: torch.Tensor) -> torch.Tensor:
            result: torch.Tensor = torch.linalg.inv(a)
            return result

        @inverse.register_fake
        def _(a: torch.Tensor) -> torch.Tensor:
            return torch.empty_like(a)

        @torch.library.custom_op(f"{namespace}::inv_ex", mutates_args=())
        def inv_ex(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            result, info = torch.linalg.inv_ex(a)
            return result, info

        @inv_ex.register_fake
        def _(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.empty_like(a), a.new_empty(a.shape[:-2], dtype=torch.int32)

        @torch.library.custom_op(f"{namespace}::solve", mutates_args=())
        def solve(a: torch.Tensor, b: torch.Tensor, left: bool) -> torch.Tensor:
            result: torch.Tensor = torch.linalg.solve(a, b, left=left)
            return result

        @solve.register_fake
        def _(a: torch.Tensor, b: torch.Tensor, left: bool) -> torch.Tensor:
            # torch's meta kernel: its broadcasting rules for B, on the symbolic shapes
            result: torch.Tensor = torch.linalg.solve(a, b, left=left)
            return result

        @torch.library.custom_op(f"{namespace}::searchsorted", mutates_args=())
        def searchsorted(sorted_sequence: torch.Tensor, values: torch.Tensor, out_int32: bool,
                         right: bool, sorter: torch.Tensor | None) -> torch.Tensor:
            return torch.searchsorted(sorted_sequence, values, out_int32=out_int32,
                                      right=right, sorter=sorter)

        @searchsorted.register_fake
        def _(sorted_sequence: torch.Tensor, values: torch.Tensor, out_int32: bool,
              right: bool, sorter: torch.Tensor | None) -> torch.Tensor:
            return values.new_empty(values.shape,
                                    dtype=torch.int32 if out_int32 else torch.int64)

        @torch.library.custom_op(f"{namespace}::cumulative_extreme", mutates_args=())
        def cumulative_extreme(x: torch.Tensor, dim: int, largest: bool
                               ) -> tuple[torch.Tensor, torch.Tensor]:
            values, indices = (torch.cummax if largest else torch.cummin)(x, dim)
            return values, indices

        @cumulative_extreme.register_fake
        def _(x: torch.Tensor, dim: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.empty_like(x), x.new_empty(x.shape, dtype=torch.int64)

        self.affine_grid = affine_grid
        self.grid_sample = grid_sample
        self.rot90 = rot90
        self.inverse = inverse
        self.inv_ex = inv_ex
        self.solve = solve
        self.searchsorted = searchsorted
        self.cumulative_extreme = cumulative_extreme

    def translations(self, opset: int) -> dict[Any, Callable[..., Any]]:
        """ONNX translations for an export that writes default-domain ``opset``."""

        def translate_grid_sample(x: Any, grid: Any, mode: str, padding_mode: str,
                                  align_corners: bool, native: bool) -> Any:
            if not native:
                return _emit_opaque(OPAQUE_DOMAIN, 1, "GridSample", [x, grid],
                                    {"mode": mode, "padding_mode": padding_mode,
                                     "align_corners": int(align_corners)})
            if opset >= 20:  # GridSample-20 renamed the modes
                from onnxscript import opset20

                renamed = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
                return opset20.GridSample(x, grid, mode=renamed, padding_mode=padding_mode,
                                          align_corners=int(align_corners))
            from onnxscript import opset18

            return opset18.GridSample(x, grid, mode=mode, padding_mode=padding_mode,
                                      align_corners=int(align_corners))

        return {self.affine_grid._opoverload: _translate_affine_grid,
                self.grid_sample._opoverload: translate_grid_sample,
                self.rot90._opoverload: _translate_rot90,
                self.inverse._opoverload: _translate_inverse,
                self.inv_ex._opoverload: _translate_inv_ex,
                self.solve._opoverload: _translate_solve,
                self.searchsorted._opoverload: _translate_searchsorted,
                self.cumulative_extreme._opoverload: _translate_cumulative_extreme}


@functools.lru_cache(maxsize=1)
def _routing_ops() -> _RoutingOps:
    return _RoutingOps()  # custom ops are process-wide: define them once


def _attribute_type(value: Any) -> Any:
    from onnx.defs import OpSchema

    kinds = OpSchema.AttrType
    if isinstance(value, TensorProto):
        return kinds.TENSOR
    if isinstance(value, (bool, int)):
        return kinds.INT
    if isinstance(value, float):
        return kinds.FLOAT
    if isinstance(value, (str, bytes)):
        return kinds.STRING
    items = list(value)
    if items and all(isinstance(item, float) for item in items):
        return kinds.FLOATS
    if items and all(isinstance(item, (str, bytes)) for item in items):
        return kinds.STRINGS
    return kinds.INTS


def _emit_opaque(domain: str, version: int, op_type: str, inputs: Sequence[Any],
                 attributes: Mapping[str, Any], outputs: int = 1) -> Any:
    """Record ``domain::op_type`` in the graph torch's exporter is building.

    onnxscript needs a schema to record a node; a private one is built here rather than
    registered with ``onnx.defs.register_schema``, which would make the node look standard
    to decomposer (and to every other tool) in this process."""
    import onnxscript
    from onnx.defs import OpSchema

    schema = OpSchema(
        op_type, domain, version,
        inputs=[OpSchema.FormalParameter(f"input{i}", f"T{i}") for i in range(len(inputs))],
        outputs=[OpSchema.FormalParameter(f"output{i}", f"U{i}") for i in range(outputs)],
        type_constraints=[(f"T{i}", _ALL_TENSOR_TYPES, "") for i in range(len(inputs))]
        + [(f"U{i}", _ALL_TENSOR_TYPES, "") for i in range(outputs)],
        attributes=[OpSchema.Attribute(name, _attribute_type(value), "", required=False)
                    for name, value in attributes.items()])
    opset = onnxscript.values.Opset(domain, version)
    return onnxscript.values.Op(opset, op_type, schema)(*inputs, **dict(attributes))


def _shape_range(size: Any) -> tuple[Any, int, int] | None:
    """(x, i, i + 1) when a 0-d symbolic size is ``Squeeze(Shape(x, start=i, end=i+1))``,
    which is how torch's exporter spells ``x.shape[i]``."""
    try:
        squeeze = size.producer()
        if squeeze is None or squeeze.op_type != "Squeeze" or len(squeeze.inputs) != 1:
            return None
        shape = squeeze.inputs[0].producer()
        if shape is None or shape.op_type != "Shape":
            return None
        start, end = shape.attributes["start"].value, shape.attributes["end"].value
    except (AttributeError, KeyError, IndexError):
        return None
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start and end == start + 1):
        return None
    return shape.inputs[0], start, end


def _concat_sizes(sizes: Sequence[Any]) -> Any:
    """A 1-D int64 tensor from a list of ints and 0-d symbolic sizes (how SymInt[] arguments
    reach a translation function). Runs of ints become one constant; runs of ``x.shape[i]``
    become one ``Shape(x, start, end)``, so a size taken from ``x.size()`` is read straight
    from x (TVM's importer cannot Reshape the 0-d sizes; it reads Shape fine)."""
    from onnxscript import opset18 as op

    runs: list[list[Any]] = []  # ["int", values] | ["shape", x, start, end] | ["value", v]
    for size in sizes:
        last = runs[-1] if runs else None
        if isinstance(size, int):
            if last is not None and last[0] == "int":
                last[1].append(size)
            else:
                runs.append(["int", [size]])
            continue
        found = _shape_range(size)
        if found is None:
            runs.append(["value", size])
        elif last is not None and last[0] == "shape" and last[1] is found[0] \
                and last[3] == found[1]:
            last[3] = found[2]
        else:
            runs.append(["shape", *found])
    one: Any = None
    pieces: list[Any] = []
    for run in runs:
        if run[0] == "int":
            pieces.append(op.Constant(value_ints=run[1]))
        elif run[0] == "shape":
            pieces.append(op.Shape(run[1], start=run[2], end=run[3]))
        else:
            one = one if one is not None else op.Constant(value_ints=[1])
            pieces.append(op.Reshape(run[1], one))
    return pieces[0] if len(pieces) == 1 else op.Concat(*pieces, axis=0)


def _translate_affine_grid(theta: Any, size: Sequence[Any], align_corners: bool) -> Any:
    return _emit_opaque(OPAQUE_DOMAIN, 1, "AffineGrid", [theta, _concat_sizes(size)],
                        {"align_corners": int(align_corners)})


def _translate_rot90(x: Any, k: int, dims: Sequence[int]) -> Any:
    return _emit_opaque(OPAQUE_DOMAIN, 1, "Rot90", [x], {"k": int(k), "dims": list(dims)})


def _translate_inverse(a: Any) -> Any:
    return _emit_opaque(OPAQUE_DOMAIN, 1, "Inverse", [a], {})


def _translate_inv_ex(a: Any) -> Any:
    # (inverse, info) has no custom-domain spelling: torch's own fallback name, as the
    # legacy exporter writes it with ONNX_FALLTHROUGH.
    return _emit_opaque(ATEN_DOMAIN, 1, "linalg_inv_ex", [a], {}, outputs=2)


def _translate_solve(a: Any, b: Any, left: bool) -> Any:
    return _emit_opaque(OPAQUE_DOMAIN, 1, "Solve", [a, b], {"left": int(left)})


def _translate_searchsorted(sorted_sequence: Any, values: Any, out_int32: bool, right: bool,
                            sorter: Any) -> Any:
    inputs = [sorted_sequence, values] + ([sorter] if sorter is not None else [])
    return _emit_opaque(OPAQUE_DOMAIN, 1, "SearchSorted", inputs,
                        {"out_int32": int(out_int32), "right": int(right)})


def _translate_cumulative_extreme(x: Any, dim: int, largest: bool) -> Any:
    return _emit_opaque(OPAQUE_DOMAIN, 1, "CumMax" if largest else "CumMin", [x],
                        {"dim": int(dim)}, outputs=2)


_NOT_ROUTED = object()


def _bind(function: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
          ) -> dict[str, Any] | None:
    try:
        bound = inspect.signature(function).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


class _Router(TorchFunctionMode):
    """While torch.export traces the model, sends F.affine_grid, F.grid_sample,
    torch.rot90 and the linear algebra / searchsorted / cummax-cummin calls to the routing
    custom ops when a pattern rewrites the node they become."""

    def __init__(self, opset: int, target: str) -> None:
        super().__init__()
        self.opset = opset
        self.target = target
        self.ops = _routing_ops()
        self.routed: list[str] = []
        self.handlers: dict[Any, Callable[[Sequence[Any], Mapping[str, Any]], Any]] = {
            F.affine_grid: self._affine_grid, F.grid_sample: self._grid_sample,
            torch.rot90: self._rot90, torch.Tensor.rot90: self._rot90,
            torch.linalg.inv: self._inverse, torch.inverse: self._inverse,
            torch.Tensor.inverse: self._inverse, torch.linalg.inv_ex: self._inv_ex,
            torch.linalg.solve: self._solve, torch.searchsorted: self._searchsorted,
            torch.cummax: functools.partial(self._cumulative_extreme, largest=True),
            torch.Tensor.cummax: functools.partial(self._cumulative_extreme, largest=True),
            torch.cummin: functools.partial(self._cumulative_extreme, largest=False),
            torch.Tensor.cummin: functools.partial(self._cumulative_extreme, largest=False)}

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        handler = self.handlers.get(func)
        if handler is not None:
            result = handler(args, kwargs)
            if result is not _NOT_ROUTED:
                return result
        return func(*args, **kwargs)

    def _affine_grid(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        bound = _bind(F.affine_grid, args, kwargs)
        if bound is None:
            return _NOT_ROUTED
        theta, size = bound["theta"], list(bound["size"])
        elem_type = _onnx_type(theta.dtype)
        if len(size) not in (4, 5) or elem_type is None:
            return _NOT_ROUTED
        spatial = len(size) - 2
        probe = ((elem_type, _symbolic_shape(3, {1: spatial, 2: spatial + 1})),
                 (TensorProto.INT64, (len(size),)))
        align = bool(bound["align_corners"])
        if not _pattern_rewrites("AffineGrid", probe, (("align_corners", int(align)),),
                                 self.opset, self.target):
            return _NOT_ROUTED
        self.routed.append("AffineGrid")
        return self.ops.affine_grid(theta, size, align)

    def _grid_sample(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        bound = _bind(F.grid_sample, args, kwargs)
        if bound is None:
            return _NOT_ROUTED
        x, grid = bound["input"], bound["grid"]
        mode, padding, align = bound["mode"], bound["padding_mode"], bool(bound["align_corners"])
        elem_type = _onnx_type(x.dtype)
        rank = x.dim()
        if rank not in (4, 5) or elem_type is None or grid.dtype != x.dtype \
                or mode not in _GRID_MODES or padding not in _GRID_PADDINGS:
            return _NOT_ROUTED
        has_op = self.opset >= (16 if rank == 4 else 20)
        native = grid_sample_stays_native(rank, mode, padding, align, self.opset)
        if not native:
            probe = ((elem_type, _symbolic_shape(rank)),
                     (elem_type, _symbolic_shape(rank, {rank - 1: rank - 2})))
            attrs = (("align_corners", int(align)), ("mode", mode), ("padding_mode", padding))
            native = not _pattern_rewrites("GridSample", probe, attrs, self.opset,
                                           self.target)
            if native and not has_op:
                return _NOT_ROUTED  # torch's own export then fails, saying why
        self.routed.append("GridSample (standard)" if native else "GridSample")
        return self.ops.grid_sample(x, grid, mode, padding, align, native)

    def _rot90(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        x = args[0] if args else kwargs.get("input", kwargs.get("self"))
        k = args[1] if len(args) > 1 else kwargs.get("k", 1)
        dims = args[2] if len(args) > 2 else kwargs.get("dims", (0, 1))
        if not isinstance(x, torch.Tensor) or not isinstance(k, int) \
                or not all(isinstance(d, int) for d in dims) or len(dims) != 2:
            return _NOT_ROUTED
        elem_type = _onnx_type(x.dtype)
        if elem_type is None:
            return _NOT_ROUTED
        probe = ((elem_type, _symbolic_shape(x.dim())),)
        attrs = (("dims", tuple(int(d) for d in dims)), ("k", int(k)))
        if not _pattern_rewrites("Rot90", probe, attrs, self.opset, self.target):
            return _NOT_ROUTED
        self.routed.append("Rot90")
        return self.ops.rot90(x, int(k), [int(d) for d in dims])

    def _probe(self, op_type: str, tensors: Sequence[Any], attrs: tuple[tuple[str, Any], ...],
               outputs: int = 1, domain: str = OPAQUE_DOMAIN) -> bool:
        """Whether a pattern rewrites the node these tensors would feed: each dim static
        where torch.export has it as an int (a matrix size must be, for the linear
        algebra, and the pattern says so), symbolic where it is a SymInt."""
        inputs = []
        for tensor in tensors:
            elem_type = _onnx_type(tensor.dtype) if isinstance(tensor, torch.Tensor) else None
            if elem_type is None:
                return False
            inputs.append((elem_type, tuple(dim if isinstance(dim, int) else f"d{axis}"
                                            for axis, dim in enumerate(tensor.shape))))
        return _pattern_rewrites(op_type, tuple(inputs), attrs, self.opset, self.target,
                                 outputs, domain)

    def _inverse(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        a = args[0] if args else kwargs.get("input", kwargs.get("A"))
        if len(args) > 1 or set(kwargs) - {"input", "A"} or not self._probe("Inverse", [a], ()):
            return _NOT_ROUTED
        self.routed.append("Inverse")
        return self.ops.inverse(a)

    def _inv_ex(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        bound = _bind(lambda A, *, check_errors=False: None, args, kwargs)
        if bound is None or bound["check_errors"] or \
                not self._probe("linalg_inv_ex", [bound["A"]], (), outputs=2,
                                domain=ATEN_DOMAIN):
            return _NOT_ROUTED  # check_errors=True raises in eager mode; a graph cannot
        self.routed.append("linalg_inv_ex")
        return self.ops.inv_ex(bound["A"])

    def _solve(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        bound = _bind(lambda A, B, *, left=True, out=None: None, args, kwargs)
        if bound is None or bound["out"] is not None or not isinstance(bound["B"], torch.Tensor):
            return _NOT_ROUTED
        a, b, left = bound["A"], bound["B"], bool(bound["left"])
        if not self._probe("Solve", [a, b], (("left", int(left)),)):
            return _NOT_ROUTED
        self.routed.append("Solve")
        return self.ops.solve(a, b, left)

    def _searchsorted(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        bound = _bind(lambda sorted_sequence, input, *, out_int32=False, right=False,
                      side=None, out=None, sorter=None: None, args, kwargs)
        if bound is None or bound["out"] is not None:
            return _NOT_ROUTED
        sequence, values, sorter = bound["sorted_sequence"], bound["input"], bound["sorter"]
        if not isinstance(values, torch.Tensor) or bound["side"] not in (None, "left", "right"):
            return _NOT_ROUTED  # a Python number: torch's own export path, and its error
        right = bool(bound["right"]) or bound["side"] == "right"
        if bound["side"] == "left" and bound["right"]:
            return _NOT_ROUTED  # torch raises on the contradiction; let it
        tensors = [sequence, values] + ([sorter] if sorter is not None else [])
        attrs = (("out_int32", int(bool(bound["out_int32"]))), ("right", int(right)))
        if not self._probe("SearchSorted", tensors, attrs):
            return _NOT_ROUTED
        self.routed.append("SearchSorted")
        return self.ops.searchsorted(sequence, values, bool(bound["out_int32"]), right, sorter)

    def _cumulative_extreme(self, args: Sequence[Any], kwargs: Mapping[str, Any], *,
                            largest: bool) -> Any:
        bound = _bind(lambda input, dim, *, out=None: None, args, kwargs)
        if bound is None or bound["out"] is not None or not isinstance(bound["dim"], int):
            return _NOT_ROUTED
        x, dim = bound["input"], bound["dim"]
        op_type = "CumMax" if largest else "CumMin"
        if not self._probe(op_type, [x], (("dim", int(dim)),), outputs=2):
            return _NOT_ROUTED
        self.routed.append(op_type)
        return self.ops.cumulative_extreme(x, int(dim), largest)


# -- routing under the legacy (TorchScript) exporter -----------------------------------------


def _legacy_registry() -> Any:
    try:
        from torch.onnx._internal.torchscript_exporter import registration, utils
    except ImportError:  # a torch that moved it: no built-in fall-backs, no override check
        return None
    # The built-in symbolics register when their modules are imported, which the exporter
    # does only once it runs; the fall-backs must be looked up before ours are installed.
    getattr(utils, "_trigger_symbolic_function_registration", lambda: None)()
    return registration.registry


def _builtin_symbolic(name: str, opset: int) -> Callable[..., Any] | None:
    registry = _legacy_registry()
    group = registry.get_function_group(name) if registry is not None else None
    return group.get(opset) if group is not None else None


def _user_overrode(name: str, opset: int) -> bool:
    registry = _legacy_registry()
    group = registry.get_function_group(name) if registry is not None else None
    try:
        return bool(group is not None and group._functions.overridden(opset))
    except AttributeError:
        return False


def _jit_elem_type(value: Any) -> int:
    try:
        return _JIT_TO_ONNX.get(value.type().scalarType(), TensorProto.FLOAT)
    except (AttributeError, RuntimeError):
        return TensorProto.FLOAT


@contextlib.contextmanager
def _legacy_routing(opset: int, target: str) -> Iterator[None]:
    """Symbolic functions that write the routed ops' opaque nodes, for this export only."""
    from torch.onnx import symbolic_helper as sh

    native_grid_sampler = _builtin_symbolic("aten::grid_sampler", opset)
    native_affine_grid = _builtin_symbolic("aten::affine_grid_generator", opset)

    def affine_grid(g: Any, theta: Any, size: Any, align_corners: Any) -> Any:
        align = bool(sh._maybe_get_const(align_corners, "b"))
        node = size.node()
        if node.kind() == "prim::ListConstruct":  # traced sizes: the exporter Concats them
            rank, size_value = len(list(node.inputs())), size
        else:
            values = sh._maybe_get_const(size, "is")
            rank = len(values)
            size_value = g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))
        spatial = rank - 2
        probe = ((_jit_elem_type(theta), _symbolic_shape(3, {1: spatial, 2: spatial + 1})),
                 (TensorProto.INT64, (rank,)))
        if native_affine_grid is not None and not _pattern_rewrites(
                "AffineGrid", probe, (("align_corners", int(align)),), opset, target):
            return native_affine_grid(g, theta, size, align_corners)
        return g.op(f"{OPAQUE_DOMAIN}::AffineGrid", theta, size_value,
                    align_corners_i=int(align))

    def grid_sampler(g: Any, x: Any, grid: Any, mode: Any, padding: Any, align: Any) -> Any:
        mode_name = _GRID_MODES[sh._maybe_get_const(mode, "i")]
        padding_name = _GRID_PADDINGS[sh._maybe_get_const(padding, "i")]
        aligned = bool(sh._maybe_get_const(align, "b"))
        rank = sh._get_tensor_rank(x) or 4
        elem_type = _jit_elem_type(x)
        probe = ((elem_type, _symbolic_shape(rank)),
                 (elem_type, _symbolic_shape(rank, {rank - 1: rank - 2})))
        attrs = (("align_corners", int(aligned)), ("mode", mode_name),
                 ("padding_mode", padding_name))
        native = grid_sample_stays_native(rank, mode_name, padding_name, aligned, opset) \
            or not _pattern_rewrites("GridSample", probe, attrs, opset, target)
        if native and native_grid_sampler is not None:
            return native_grid_sampler(g, x, grid, mode, padding, align)
        return g.op(f"{OPAQUE_DOMAIN}::GridSample", x, grid, mode_s=mode_name,
                    padding_mode_s=padding_name, align_corners_i=int(aligned))

    def rot90(g: Any, x: Any, k: Any, dims: Any) -> Any:
        turns = int(sh._maybe_get_const(k, "i"))
        axes = [int(d) for d in sh._maybe_get_const(dims, "is")]
        return g.op(f"{OPAQUE_DOMAIN}::Rot90", x, k_i=turns, dims_i=axes)

    symbolics: dict[str, Callable[..., Any]] = {
        "aten::affine_grid_generator": affine_grid, "aten::grid_sampler": grid_sampler,
        "aten::rot90": rot90}
    registered = []
    try:
        for name, function in symbolics.items():
            if _user_overrode(name, opset):  # the user's own symbolic wins
                continue
            _TORCH_ONNX.register_custom_op_symbolic(name, function, opset)
            registered.append(name)
        yield
    finally:
        for name in registered:
            _TORCH_ONNX.unregister_custom_op_symbolic(name, opset)


# -- the seeds' recipe on modern torch: opaque_function ---------------------------------------


@dataclass
class _OpaqueOp:
    function: Any
    parameters: list[inspect.Parameter]
    overload: Any
    custom_opsets: dict[str, int] = field(default_factory=dict)


_OPAQUE_OPS: dict[Any, _OpaqueOp] = {}
_LIBRARIES: list[Any] = []  # keep the torch.library fragments alive


class _NoContext:
    """Stands in for ``ctx`` when a Function's forward runs on fake tensors."""

    def save_for_backward(self, *tensors: Any) -> None:
        pass

    def mark_non_differentiable(self, *tensors: Any) -> None:
        pass


def _schema_type(param: inspect.Parameter, hints: Mapping[str, Any]) -> str:
    """The torch schema type of one ``forward`` parameter, from its annotation, else its
    default, else Tensor."""
    hint = hints.get(param.name)
    if hint is not None:
        origin, members = typing.get_origin(hint), typing.get_args(hint)
        if hint is torch.Tensor:
            return "Tensor"
        if origin is typing.Union or type(hint).__name__ == "UnionType":
            inner = [m for m in members if m is not type(None)]
            if len(inner) == 1 and inner[0] is torch.Tensor:
                return "Tensor?"
        scalars = {bool: "bool", int: "int", float: "float", str: "str"}
        if hint in scalars:
            return scalars[hint]
        if origin in (list, tuple, Sequence, typing.Sequence) and members:
            element = scalars.get(members[0])
            if element in ("int", "float", "bool", "str"):
                return f"{element}[]"
        raise ExportError(f"parameter '{param.name}': annotation {hint!r} has no torch "
                          f"schema type; use Tensor, int, float, bool, str or list[int]")
    default = param.default
    if default is inspect.Parameter.empty:
        return "Tensor"
    if default is None:
        return "Tensor?"
    for kind, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
        if isinstance(default, kind):
            return name
    if isinstance(default, (list, tuple)) and default:
        element = {bool: "bool", int: "int", float: "float", str: "str"}.get(type(default[0]))
        if element:
            return f"{element}[]"
    raise ExportError(f"parameter '{param.name}': cannot tell its type from the default "
                      f"{default!r}; annotate it")


def _schema_default(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, str):
        return repr(value).replace("'", '"')
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_schema_default(item) for item in value) + "]"
    return repr(value)


def _unique_op_name(base: str) -> str:
    name = re.sub(r"\W+", "_", base).strip("_") or "op"
    taken = {overload._schema.name.split("::")[-1] for overload in _OPAQUE_OPS}
    candidate, counter = name, 1
    while candidate in taken:
        counter += 1
        candidate = f"{name}_{counter}"
    return candidate


class _SymbolicGraph:
    """The ``g`` a user's ``symbolic(g, ...)`` gets under the dynamo exporter: ``g.op``
    records an opaque node with typed attributes, spelled as the legacy exporter spells it
    (``name_i``, ``_f``, ``_s``, ``_t``, ``_is``, ``_fs``, ``_ss``; no suffix: by value)."""

    _SUFFIXES: dict[str, Callable[[Any], Any]] = {
        "i": int, "f": float, "s": str, "is": lambda v: [int(x) for x in v],
        "fs": lambda v: [float(x) for x in v], "ss": lambda v: [str(x) for x in v]}

    def __init__(self, default_opset: int, custom_opsets: Mapping[str, int]) -> None:
        self.default_opset = default_opset
        self.custom_opsets = custom_opsets

    def op(self, name: str, *inputs: Any, outputs: int = 1, **attributes: Any) -> Any:
        domain, _, op_type = name.rpartition("::")
        domain = "" if domain in ("onnx", "ai.onnx") else domain
        typed: dict[str, Any] = {}
        for key, value in attributes.items():
            base, _, suffix = key.rpartition("_")
            if base and suffix in self._SUFFIXES:
                typed[base] = self._SUFFIXES[suffix](value)
            elif base and suffix == "t":
                typed[base] = onnx.numpy_helper.from_array(
                    value.detach().cpu().numpy() if isinstance(value, torch.Tensor)
                    else np.asarray(value))
            else:
                typed[key] = int(value) if isinstance(value, bool) else value
        version = self.default_opset if domain == "" else self.custom_opsets.get(domain, 1)
        return _emit_opaque(domain, version, op_type, [i for i in inputs if i is not None],
                            typed, outputs)


def _translation_for(entry: _OpaqueOp, default_opset: int) -> Callable[..., Any]:
    def translate(*args: Any, **kwargs: Any) -> Any:
        graph = _SymbolicGraph(default_opset, entry.custom_opsets)
        return entry.function.symbolic(graph, *args, **kwargs)

    # torch's exporter reads the parameter names to pass the op's arguments.
    translate.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [param.replace(annotation=inspect.Parameter.empty) for param in entry.parameters])
    return translate


def data_dependent_size() -> Any:
    """A new symbolic size for a ``fake=`` function whose output size depends on tensor
    values (the seeds' AffineGrid reads H and W from its ``size`` tensor)."""
    return torch.library.get_ctx().new_dynamic_size()


def opaque_function(function: Any = None, /, *, fake: Callable[..., Any] | None = None,
                    name: str | None = None,
                    custom_opsets: Mapping[str, int] | None = None) -> Any:
    """Make an ``autograd.Function`` whose ``symbolic()`` emits an opaque node export that
    same node under torch's dynamo exporter too. Use as a decorator or a call::

        @decomposer.torch.opaque_function
        class RotateScale(torch.autograd.Function): ...   # forward + symbolic, unchanged

        AffineGridOp = decomposer.torch.opaque_function(CustomAffineGrid._Function,
                                                        fake=affine_grid_shape)

    Returns a subclass whose ``apply`` calls the original in eager mode and under the legacy
    exporter (which then uses ``symbolic()``), and under ``torch.export`` a ``torch.library``
    custom op (``decomposer_opaque::<name>``) whose ONNX translation runs ``symbolic()``
    with a ``g`` that records the node: same domain, op type and typed attributes.

    ``fake(*args)`` returns an empty tensor of the output's shape and dtype; by default
    ``forward`` runs on fake tensors, which fails when it reads tensor values (then return
    ``theta.new_empty((n, data_dependent_size(), ...))``). Argument types come from
    ``forward``'s annotations, else its defaults, else Tensor. ``custom_opsets`` gives
    domain versions other than 1.
    """
    if function is None:
        return functools.partial(opaque_function, fake=fake, name=name,
                                 custom_opsets=custom_opsets)
    if not (isinstance(function, type) and issubclass(function, torch.autograd.Function)):
        raise ExportError(f"opaque_function expects a torch.autograd.Function subclass, got "
                          f"{function!r}")
    if not callable(getattr(function, "symbolic", None)):
        raise ExportError(f"{function.__qualname__} has no symbolic(g, ...) to say which "
                          f"node to export")
    parameters = list(inspect.signature(function.forward).parameters.values())[1:]  # no ctx
    if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in parameters):
        raise ExportError(f"{function.__qualname__}.forward takes *args/**kwargs; a custom op "
                          f"needs named parameters")
    try:
        hints = typing.get_type_hints(function.forward)
    except Exception:  # unresolvable string annotations: fall back to defaults
        hints = {}
    declared = []
    for param in parameters:
        text = f"{_schema_type(param, hints)} {param.name}"
        if param.default is not inspect.Parameter.empty:
            text += f"={_schema_default(param.default)}"
        declared.append(text)
    op_name = _unique_op_name(name or function.__qualname__)
    library = _TORCH_LIBRARY.Library(_USER_NAMESPACE, "FRAGMENT")
    _LIBRARIES.append(library)
    library.define(f"{op_name}({', '.join(declared)}) -> Tensor")
    original_apply: Any = function.apply

    def eager(*args: Any) -> Any:
        return original_apply(*args)

    def fake_output(*args: Any) -> Any:
        if fake is not None:
            return fake(*args)
        try:
            return function.forward(_NoContext(), *args)
        except Exception as exc:
            raise ExportError(
                f"{function.__qualname__}.forward cannot run on fake tensors during export "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                f"pass fake= to opaque_function, returning an empty tensor of the output's "
                f"shape (decomposer.torch.data_dependent_size() for sizes read from "
                f"tensor values)") from exc

    library.impl(op_name, eager, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{_USER_NAMESPACE}::{op_name}", fake_output, lib=library)
    overload = getattr(getattr(torch.ops, _USER_NAMESPACE), op_name).default
    _OPAQUE_OPS[overload] = _OpaqueOp(function, parameters, overload,
                                      dict(custom_opsets or {}))
    signature = inspect.Signature(parameters)

    def apply(cls: Any, *args: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_exporting() and not _TORCH_JIT.is_tracing():
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return overload(*bound.arguments.values())
        return original_apply(*args, **kwargs)

    return type(function.__name__, (function,), {
        "apply": classmethod(apply), "opaque_op": overload,
        "__module__": function.__module__, "__qualname__": function.__qualname__,
        "__doc__": function.__doc__})


def translation_table(opset_version: int = TORCHLIB_OPSET) -> dict[Any, Callable[..., Any]]:
    """``custom_translation_table`` entries for every :func:`opaque_function` op, for users
    of plain ``torch.onnx.export(..., dynamo=True)``; :func:`export` adds them itself.
    ``opset_version`` is the default-domain opset the exporter writes (at least 18)."""
    return {overload: _translation_for(entry, max(opset_version, TORCHLIB_OPSET))
            for overload, entry in _OPAQUE_OPS.items()}


# -- checks on what torch wrote --------------------------------------------------------------


def _graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {init.name for init in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


def _dims(value: onnx.ValueInfoProto) -> list[onnx.TensorShapeProto.Dimension]:
    tensor_type = value.type.tensor_type
    return list(tensor_type.shape.dim) if tensor_type.HasField("shape") else []


_FREEZE_HINT = ("torch traced an op whose Python code guards on this size (TORCH_LOGS=+dynamic "
                "names the line); decomposer.torch routes F.affine_grid, F.grid_sample and "
                "torch.rot90, and decomposer.torch.opaque_function keeps your own op opaque")


def _frozen_in_program(program: Any, dynamic: Sequence[DynamicDim], n_tensors: int
                       ) -> list[str]:
    """Dims declared dynamic that the exported program fixed: a plain int, or a symbol whose
    range collapsed to one value (torch.onnx keeps such a placeholder symbolic)."""
    try:
        from torch.export.graph_signature import InputKind

        exported = program.exported_program
        placeholders = {node.name: node for node in exported.graph.nodes
                        if node.op == "placeholder"}
        values = [placeholders[spec.arg.name].meta.get("val")
                  for spec in exported.graph_signature.input_specs
                  if spec.kind == InputKind.USER_INPUT]
        ranges = exported.range_constraints
    except (AttributeError, KeyError, ImportError):
        return []
    tensors = [value for value in values if isinstance(value, torch.Tensor)]
    if len(tensors) != n_tensors:
        return []
    problems = []
    for dim in dynamic:
        size = tensors[dim.tensor].shape[dim.dim]
        fixed: int | None = None
        if isinstance(size, int):
            fixed = size
        else:
            expr = size.node.expr
            if expr.is_number:
                fixed = int(expr)
            elif expr in ranges and ranges[expr].lower == ranges[expr].upper:
                fixed = int(ranges[expr].lower)
        if fixed is not None:
            problems.append(f"{dim.describe()} is declared dynamic but torch.export fixed it "
                            f"to {fixed}: {_FREEZE_HINT}")
    return problems


def _frozen_in_graph(model: onnx.ModelProto, dynamic: Sequence[DynamicDim], n_tensors: int,
                     output_axes: Mapping[str, Any]) -> list[str]:
    problems = []
    inputs = _graph_inputs(model)
    if len(inputs) == n_tensors:
        for dim in dynamic:
            dims = _dims(inputs[dim.tensor])
            if dim.dim < len(dims) and dims[dim.dim].HasField("dim_value"):
                size = dims[dim.dim].dim_value
                problems.append(f"{dim.describe()} is declared dynamic but the ONNX input "
                                f"'{inputs[dim.tensor].name}' fixes it to {size}: "
                                f"{_FREEZE_HINT}")
    for output in model.graph.output:
        axes = output_axes.get(output.name)
        declared = list(axes) if isinstance(axes, (Mapping, list, tuple)) else []
        dims = _dims(output)
        for axis in declared:
            axis = int(axis)
            if axis < len(dims) and dims[axis].HasField("dim_value"):
                problems.append(f"output '{output.name}' dim {axis} is declared dynamic but "
                                f"the ONNX graph fixes it to {dims[axis].dim_value}")
    return problems


def _refuse(problems: Sequence[str]) -> None:
    if problems:
        raise ExportError("the export froze dims declared dynamic; refusing a model that "
                          "only runs at the example's sizes:\n  " + "\n  ".join(problems))


def _default_opset(model: onnx.ModelProto) -> int | None:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return None


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _graphs(attribute.g)
            for sub in attribute.graphs:
                yield from _graphs(sub)


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Inline initializers and Constant-node values of every graph, by name."""
    from onnx import numpy_helper

    found: dict[str, np.ndarray] = {}
    for graph in _graphs(model.graph):
        for tensor in graph.initializer:
            if tensor.data_location != TensorProto.EXTERNAL:
                found[tensor.name] = numpy_helper.to_array(tensor)
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    found[node.output[0]] = numpy_helper.to_array(value)
    return found


def _convert_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """Rewrite torch's opset-18 model for an older ``opset`` (11-17).

    onnx's own version converter has no down-adapter for most ops (Add-14, Shape-15,
    Split-18, Pad-18, BatchNormalization-15 ...), though between 11 and 18 torch's ops
    changed meaning only where an attribute became an input. So: axes/split inputs become
    attributes again (they must be constants); Shape(start, end) becomes Shape -> Slice;
    an attribute the older op lacks must hold its default and is dropped, as is an empty
    trailing input; an op the older opset does not have is an :class:`ExportError`."""
    from onnx import defs

    source_opset = _default_opset(model) or TORCHLIB_OPSET
    out = onnx.ModelProto()
    out.CopyFrom(model)
    constants = _constants(out)
    taken = {name for graph in _graphs(out.graph) for node in graph.node
             for name in node.output}
    detached: set[str] = set()
    ranks = {value.name: len(value.type.tensor_type.shape.dim)
             for graph in _graphs(out.graph)
             for value in [*graph.input, *graph.value_info, *graph.output]
             if value.type.tensor_type.HasField("shape")}
    for graph in _graphs(out.graph):
        nodes: list[onnx.NodeProto] = []
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                nodes.append(node)
                continue
            try:
                target_schema = defs.get_schema(node.op_type, opset, "")
                source_schema = defs.get_schema(node.op_type, source_opset, "")
            except defs.SchemaError:
                first = _first_opset(node.op_type)
                raise ExportError(f"node '{node.name}' is {node.op_type}, which ONNX defines "
                                  f"from opset {first} on; export at opset >= {first}") from None
            if target_schema.since_version == source_schema.since_version:
                nodes.append(node)
                continue
            detached.update(_axes_to_attribute(node, opset, constants))
            _softmax_axis(node, opset, ranks)
            nodes.extend(_resize_inputs(node, opset, taken))
            _reshape_allowzero(node, constants)
            bounds = _fit_attributes(node, opset, target_schema, source_schema)
            while len(node.input) > target_schema.max_input and not node.input[-1]:
                node.input.pop()
            if len(node.input) > target_schema.max_input:
                raise ExportError(f"node '{node.name}' ({node.op_type}) has "
                                  f"{len(node.input)} inputs; opset {opset} takes "
                                  f"{target_schema.max_input}; export at a newer opset")
            nodes.append(node)
            if bounds:
                nodes.extend(_slice_shape(node, bounds, taken))
        del graph.node[:]
        graph.node.extend(nodes)
    for entry in out.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = opset
    _drop_unused(out, detached)
    return out


def _drop_unused(model: onnx.ModelProto, names: set[str]) -> None:
    """Remove the initializers and Constant nodes in ``names`` that nothing reads now."""
    used = {name for graph in _graphs(model.graph) for node in graph.node
            for name in node.input}
    used.update(output.name for output in model.graph.output)
    unused = names - used
    if not unused:
        return
    for graph in _graphs(model.graph):
        kept_tensors = [t for t in graph.initializer if t.name not in unused]
        kept_nodes = [n for n in graph.node
                      if not (n.op_type == "Constant" and n.output[0] in unused)]
        del graph.initializer[:]
        graph.initializer.extend(kept_tensors)
        del graph.node[:]
        graph.node.extend(kept_nodes)


def _axes_to_attribute(node: onnx.NodeProto, opset: int, constants: Mapping[str, np.ndarray]
                       ) -> list[str]:
    """Move an axes/split input back to an attribute; returns the tensor it detached."""
    since = _AXES_INPUT_SINCE.get(node.op_type)
    if since is None or opset >= since or len(node.input) < 2:
        return []
    name = node.input[1]
    if name:
        if name not in constants:
            raise ExportError(f"node '{node.name}' ({node.op_type}) reads its "
                              f"{'split' if node.op_type == 'Split' else 'axes'} from "
                              f"'{name}', which is not a constant; opset {opset} needs an "
                              f"attribute there; export at opset >= {since}")
        values = [int(v) for v in np.asarray(constants[name]).reshape(-1)]
        key = "split" if node.op_type == "Split" else "axes"
        node.attribute.append(helper.make_attribute(key, values))
    del node.input[1]
    return [name] if name else []


def _resize_inputs(node: onnx.NodeProto, opset: int, taken: set[str]
                   ) -> list[onnx.NodeProto]:
    """Resize before opset 13 requires its roi and scales inputs, which torch leaves empty:
    they get empty float tensors (what "not given" meant then). Returns their Constants."""
    if node.op_type != "Resize" or opset >= 13:
        return []
    constants = []
    for position in (1, 2):
        if position < len(node.input) and not node.input[position]:
            name = _fresh(f"{node.name or 'resize'}_empty{position}", taken)
            constants.append(helper.make_node("Constant", [], [name], name=name, value=(
                helper.make_tensor(name, TensorProto.FLOAT, [0], []))))
            node.input[position] = name
    return constants


def _reshape_allowzero(node: onnx.NodeProto, constants: Mapping[str, np.ndarray]) -> None:
    """torch writes Reshape(allowzero=1), which opsets before 14 cannot say; it means the
    same as the older Reshape when the target shape holds no 0, so a constant shape without
    0 drops it."""
    if node.op_type != "Reshape" or not any(a.name == "allowzero" and a.i
                                            for a in node.attribute):
        return
    shape = constants.get(node.input[1]) if len(node.input) > 1 else None
    if shape is None or (np.asarray(shape) == 0).any():
        raise ExportError(f"node '{node.name}' (Reshape) takes a literal 0 in its target "
                          f"shape (allowzero=1) that opsets before 14 cannot say; export at "
                          f"opset >= 14")
    kept = [a for a in node.attribute if a.name != "allowzero"]
    del node.attribute[:]
    node.attribute.extend(kept)


def _softmax_axis(node: onnx.NodeProto, opset: int, ranks: Mapping[str, int]) -> None:
    """Before opset 13 Softmax, LogSoftmax and Hardmax flatten the input to 2-D around
    ``axis`` (default 1); from 13 they work along ``axis`` (default -1). They agree only
    along the last axis, which is then written out."""
    if node.op_type not in ("Softmax", "LogSoftmax", "Hardmax") or opset >= 13:
        return
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
    if axis != -1 and axis != ranks.get(node.input[0], 0) - 1:
        raise ExportError(f"node '{node.name}' ({node.op_type}) works along axis {axis}; "
                          f"before opset 13 only the last axis means the same; export at "
                          f"opset >= 13")
    kept = [a for a in node.attribute if a.name != "axis"]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute("axis", -1)])


def _fit_attributes(node: onnx.NodeProto, opset: int, target: Any, source: Any
                    ) -> dict[str, int]:
    """Drop attributes ``target`` lacks (they must hold ``source``'s default); returns a
    Shape's start/end, which need a Slice instead."""
    bounds: dict[str, int] = {}
    kept = []
    for attribute in node.attribute:
        if attribute.name in target.attributes:
            kept.append(attribute)
        elif node.op_type == "Shape" and attribute.name in ("start", "end"):
            bounds[attribute.name] = attribute.i
        elif node.op_type == "Split" and attribute.name == "num_outputs":
            continue  # without split sizes, older Splits cut evenly into the outputs
        elif not _is_default(attribute, source.attributes.get(attribute.name)):
            raise ExportError(f"node '{node.name}' ({node.op_type}) sets {attribute.name}, "
                              f"which opset {opset} does not have; export at a newer opset")
    del node.attribute[:]
    node.attribute.extend(kept)
    return bounds


def _first_opset(op_type: str) -> int | str:
    from onnx import defs

    try:
        return int(defs.get_schema(op_type, defs.onnx_opset_version(), "").since_version)
    except defs.SchemaError:
        return "?"


def _is_default(attribute: onnx.AttributeProto, declared: Any) -> bool:
    if declared is None or not declared.default_value.name:
        return False
    return bool(helper.get_attribute_value(attribute)
                == helper.get_attribute_value(declared.default_value))


def _slice_shape(node: onnx.NodeProto, bounds: Mapping[str, int], taken: set[str]
                 ) -> list[onnx.NodeProto]:
    """Shape(start, end) for opsets before 15: the node keeps the full shape, a Slice after
    it writes the original output."""
    sliced_output = node.output[0]
    node.output[0] = _fresh(f"{sliced_output}_full", taken)
    constants = []
    for label, value in (("starts", bounds.get("start", 0)),
                         ("ends", bounds.get("end", 1 << 62)), ("axes", 0)):
        name = _fresh(f"{sliced_output}_{label}", taken)
        constants.append(helper.make_node("Constant", [], [name], name=name, value=(
            helper.make_tensor(name, TensorProto.INT64, [1], [value]))))
    slice_node = helper.make_node("Slice", [node.output[0], *(c.output[0] for c in constants)],
                                  [sliced_output],
                                  name=_fresh(f"{node.name or sliced_output}_slice", taken))
    return [*constants, slice_node]


def _fresh(base: str, taken: set[str]) -> str:
    name, counter = base, 1
    while name in taken:
        counter += 1
        name = f"{base}_{counter}"
    taken.add(name)
    return name


def _require_opset(model: onnx.ModelProto, opset: int | None, what: str) -> None:
    produced = _default_opset(model)
    if opset is not None and produced != opset:
        raise ExportError(f"{what} is at opset {produced}, not the opset_version={opset} "
                          f"asked for; refusing to change the opset silently")


def _torch_error(exc: Exception) -> ExportError:
    """torch's export errors are pages long; keep the summary."""
    text = str(exc)
    summary = text.split("## Exception summary", 1)[-1].split("(Refer to the full", 1)[0]
    lines = [line.strip() for line in summary.strip().splitlines() if line.strip()]
    detail = " ".join(lines[:6]) if lines else type(exc).__name__
    return ExportError(f"torch.onnx.export failed: {detail}")


# -- verification against eager --------------------------------------------------------------


def _output_tensors(value: Any) -> list[Any]:
    return [leaf.value for leaf in _flatten("out", ("out",), value)
            if isinstance(leaf.value, torch.Tensor)]


def _eager(model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[np.ndarray]:
    with torch.no_grad():
        outputs = model(*args, **kwargs)
    return [t.detach().cpu().numpy() for t in _output_tensors(outputs)]


def _feeds(model: onnx.ModelProto, tensors: Sequence[Any]) -> dict[str, np.ndarray]:
    inputs = _graph_inputs(model)
    arrays = [t.detach().cpu().numpy() for t in tensors]
    if len(inputs) != len(arrays):
        raise VerificationError(
            f"cannot verify: the ONNX graph has {len(inputs)} inputs for {len(arrays)} tensor "
            f"inputs of the model (torch dropped unused ones?); pass verify=False")
    return {value.name: array for value, array in zip(inputs, arrays, strict=True)}


def _verify_options(verify: bool | Mapping[str, Any]) -> dict[str, Any] | None:
    if verify is False:
        return None
    options = {"atol": DEFAULT_ATOL, "rtol": DEFAULT_RTOL, "inputs": (), "seed": 0}
    if isinstance(verify, Mapping):
        unknown = set(verify) - set(options)
        if unknown:
            raise InvalidModelError(f"verify: unknown option(s) {sorted(unknown)}; known: "
                                    f"{sorted(options)}")
        options.update(verify)
    return options


def _run_checks(model: Any, path: Path, onnx_model: onnx.ModelProto, leaves: Sequence[_Leaf],
                dynamic: Sequence[DynamicDim], args: tuple[Any, ...],
                kwargs: Mapping[str, Any], options: Mapping[str, Any]) -> VerifyReport:
    """Run ``path`` on ONNX Runtime and the model in eager mode on the example inputs, on a
    second set with every dynamic dim resized, and on ``options['inputs']``."""
    import onnxruntime as ort

    atol, rtol = float(options["atol"]), float(options["rtol"])
    # (args, kwargs, what this set is, whether decomposer resized dims declared dynamic)
    runs: list[tuple[tuple[Any, ...], dict[str, Any], str, bool]] = [
        (args, dict(kwargs), "", False)]
    if dynamic:
        values, changes = _second_inputs(leaves, dynamic, int(options["seed"]))
        if changes:
            second_args, second_kwargs = _rebuild(leaves, values, args, kwargs)
            runs.append((second_args, second_kwargs,
                         f" (dims changed: {', '.join(changes)})", True))
    for extra in options["inputs"]:
        extra_args, extra_kwargs = (extra if isinstance(extra, tuple) and len(extra) == 2
                                    and isinstance(extra[1], Mapping) else (extra, {}))
        runs.append((tuple(extra_args) if isinstance(extra_args, (list, tuple))
                     else (extra_args,), dict(extra_kwargs), " (from verify['inputs'])",
                     False))

    options_ort = ort.SessionOptions()
    options_ort.log_severity_level = 3
    session = ort.InferenceSession(str(path), options_ort, providers=["CPUExecutionProvider"])
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # a failure is raised with ONNX Runtime's message, not logged
    output_names = [o.name for o in onnx_model.graph.output]
    report = VerifyReport(runs=len(runs))
    for run, (run_args, run_kwargs, sizes, resized) in enumerate(runs):
        try:
            expected = _eager(model, run_args, run_kwargs)
        except Exception as exc:
            raise VerificationError(
                f"the model fails in eager mode on verification input set {run}{sizes}: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. "
                f"Pass verify={{'inputs': [...]}} with inputs of other sizes, or "
                f"verify=False") from exc
        run_leaves = _input_leaves(model, run_args, run_kwargs)
        feeds = _feeds(onnx_model, [leaf.value for leaf in _tensor_leaves(run_leaves)])
        if len(expected) != len(output_names):
            raise VerificationError(f"the model returns {len(expected)} tensors, the ONNX "
                                    f"graph {len(output_names)} outputs")
        for output, array in zip(onnx_model.graph.output, expected, strict=True):
            for axis, dim in enumerate(_dims(output)):
                if dim.HasField("dim_value") and axis < array.ndim \
                        and array.shape[axis] != dim.dim_value:
                    raise VerificationError(
                        f"output '{output.name}' dim {axis} is fixed to {dim.dim_value} in "
                        f"the ONNX graph, but is {array.shape[axis]} in eager mode on input "
                        f"set {run}{sizes}: the export froze a size declared dynamic")
        try:
            actual = session.run(None, feeds, quiet)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            frozen = " A dim declared dynamic is frozen inside the graph." if resized else ""
            raise VerificationError(f"ONNX Runtime cannot run {path} on input set "
                                    f"{run}{sizes}.{frozen} ONNX Runtime: {first}") from exc
        for name, got, want in zip(output_names, actual, expected, strict=True):
            result = compare(np.asarray(got), want, atol, rtol)
            report.checks.append(TensorCheck(
                tensor=name, kind="expected", node=None, pattern=None, run=run,
                shape=tuple(np.asarray(got).shape), max_abs_error=float(result.max_abs),
                max_rel_error=float(result.max_rel), atol=atol, rtol=rtol,
                passed=bool(result.passed),
                note=(result.note or "vs torch eager") + sizes))
    return report


# -- the one call ----------------------------------------------------------------------------


_OWN_KEYWORDS = ("opset_version", "dynamic_shapes", "dynamo")


def export(model: Any, args: Any, f: str | Path, *, opset_version: int | None = None,
           dynamic_shapes: Any = None, dynamo: bool = True,
           verify: bool | Mapping[str, Any] = True, target: str = "portable",
           **export_kwargs: Any) -> Report:
    """Export ``model`` with ``torch.onnx.export``, decompose the opaque nodes, write ``f``.

    ``args`` (a tuple, or one tensor), ``opset_version``, ``dynamic_shapes`` and ``dynamo``
    mean what they mean to ``torch.onnx.export``; every other keyword (``input_names``,
    ``dynamic_axes``, ``kwargs``, ``external_data``, ``custom_translation_table`` ...) is
    passed on. ``dynamic_shapes`` works with ``dynamo=False`` too (as ``dynamic_axes``).
    ``target`` is passed to :func:`decomposer.decompose_with_report`.

    Raises :class:`ExportError` (nothing written) when torch fails, when a dim declared
    dynamic comes out static, or when the opset differs from ``opset_version``;
    :class:`decomposer.UnsupportedNodeError` when an opaque node has no pattern. With
    ``verify`` (True, or options ``{"atol", "rtol", "inputs", "seed"}``) the written model
    runs on ONNX Runtime against ``model`` in eager mode on the example inputs and on a
    second set with every dynamic dim resized (plus ``inputs``: more ``args`` tuples); a
    mismatch raises :class:`decomposer.VerificationError` after ``f`` is written (kept for
    inspection, as ``decompose_file`` does) and the report is on ``error.report``.
    """
    if not isinstance(model, torch.nn.Module):
        raise ExportError(f"expected a torch.nn.Module, got {type(model).__name__}")
    clash = sorted(set(export_kwargs) & set(_OWN_KEYWORDS))
    if clash:
        raise InvalidModelError(f"export(): {clash} given twice")
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    kwargs = dict(export_kwargs.pop("kwargs", None) or {})
    options = _verify_options(verify)
    destination = Path(f)
    folder = destination.parent if str(destination.parent) else Path(".")
    if not folder.is_dir():
        raise ModelIOError(f"{destination}: output folder '{folder}' does not exist; create "
                           f"it first")
    if opset_version is not None and opset_version < 11:
        raise InvalidModelError(f"opset_version={opset_version}: decomposer writes opset 11 "
                                f"and newer")
    leaves = _input_leaves(model, args, kwargs)
    n_tensors = len(_tensor_leaves(leaves))
    dynamic = _declared_dynamic(leaves, dynamic_shapes, export_kwargs.get("dynamic_axes"),
                                export_kwargs.get("input_names"))
    export_kwargs.setdefault("verbose", False)
    _pattern_rewrites.cache_clear()  # patterns registered since the last export count

    with tempfile.TemporaryDirectory(prefix=".decomposer-export-", dir=folder) as scratch:
        exported = Path(scratch) / destination.name
        program = None
        if dynamo:
            program = _export_dynamo(model, args, kwargs, exported, opset_version,
                                     dynamic_shapes, target, export_kwargs)
        else:
            _export_legacy(model, args, kwargs, exported, opset_version, dynamic_shapes,
                           leaves, target, export_kwargs)
        onnx_model = load_model(exported)
        problems = _frozen_in_program(program, dynamic, n_tensors) if program else []
        problems += _frozen_in_graph(onnx_model, dynamic, n_tensors,
                                     _output_axes(export_kwargs))
        _refuse(problems)
        produced = _default_opset(onnx_model)
        if opset_version is not None and produced != opset_version:
            if not dynamo or produced is None or produced < opset_version:
                _require_opset(onnx_model, opset_version, "torch's export")
            onnx_model = _convert_opset(onnx_model, opset_version)
        out, report = decompose_with_report(onnx_model, target=target)
        _require_opset(out, opset_version, "the decomposed model")
        save_model(out, destination, source_dir=scratch)
    report.output_path = str(destination)
    if options is None:
        return report
    report.verification = _run_checks(model, destination, out, leaves, dynamic, args, kwargs,
                                      options)
    try:
        require_passed(report.verification)
    except VerificationError as exc:
        exc.report = report  # type: ignore[attr-defined]
        raise
    return report


def _output_axes(export_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    axes = export_kwargs.get("dynamic_axes") or {}
    outputs = set(export_kwargs.get("output_names") or ())
    return {name: value for name, value in axes.items() if name in outputs}


def _export_dynamo(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], path: Path,
                   opset_version: int | None, dynamic_shapes: Any, target: str,
                   export_kwargs: dict[str, Any]) -> Any:
    from torch.onnx import _constants

    final_opset = opset_version or _constants.ONNX_DEFAULT_OPSET
    torch_opset = max(final_opset, TORCHLIB_OPSET)  # lower ones are converted afterwards
    # One file unless the weights pass 2 GiB (torch then writes them apart anyway), as the
    # legacy exporter does; torch's dynamo default always writes a separate data file.
    export_kwargs.setdefault("external_data", False)
    table = {**_routing_ops().translations(torch_opset), **translation_table(torch_opset),
             **dict(export_kwargs.pop("custom_translation_table", None) or {})}
    router = _Router(final_opset, target)
    try:
        with router:
            program = torch.onnx.export(model, args, str(path), kwargs=kwargs or None,
                                        dynamo=True, opset_version=torch_opset,
                                        dynamic_shapes=dynamic_shapes,
                                        custom_translation_table=table, **export_kwargs)
    except DecomposerError:
        raise
    except Exception as exc:
        raise _torch_error(exc) from exc
    logger.info("routed through opaque nodes: %s", ", ".join(router.routed) or "nothing")
    return program


def _export_legacy(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], path: Path,
                   opset_version: int | None, dynamic_shapes: Any, leaves: Sequence[_Leaf],
                   target: str, export_kwargs: dict[str, Any]) -> None:
    import warnings

    from torch.onnx import _constants

    opset = opset_version or _constants.ONNX_DEFAULT_OPSET
    if dynamic_shapes is not None:  # the legacy exporter speaks dynamic_axes
        names = list(export_kwargs.get("input_names") or [])
        tensors = _tensor_leaves(leaves)
        if not names:
            names = [re.sub(r"\W+", "_", leaf.label).strip("_") for leaf in tensors]
            export_kwargs["input_names"] = names
        axes = dict(export_kwargs.get("dynamic_axes") or {})
        for dim in _declared_dynamic(leaves, dynamic_shapes, None, names):
            axes.setdefault(names[dim.tensor], {})[dim.dim] = dim.group.lstrip("#")
        export_kwargs["dynamic_axes"] = axes
    export_kwargs["custom_opsets"] = {OPAQUE_DOMAIN: 1,
                                      **dict(export_kwargs.get("custom_opsets") or {})}
    export_kwargs.pop("custom_translation_table", None)
    call_args = (*args, kwargs) if kwargs else args
    try:
        with _legacy_routing(opset, target), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, call_args, str(path), dynamo=False, opset_version=opset,
                              **export_kwargs)
    except DecomposerError:
        raise
    except Exception as exc:
        raise _torch_error(exc) from exc
