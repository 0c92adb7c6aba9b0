"""A model's inputs as torch's exporters flatten them, and the dims declared dynamic.

In: the model, its example ``args``/``kwargs``, and ``dynamic_shapes`` (torch.export style)
and/or legacy ``dynamic_axes``. Out: flattened :class:`Leaf` inputs, every
:class:`DynamicDim`, and a second input set in which each declared-dynamic dim has another
size (dims of one group move together), for verification.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch


@dataclass(frozen=True)
class Leaf:
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


def flatten(label: str, path: tuple[Any, ...], value: Any) -> Iterator[Leaf]:
    if isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from flatten(f"{label}[{index}]", (*path, index), item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from flatten(f"{label}[{key!r}]", (*path, key), item)
    else:
        yield Leaf(label, path, value)


def input_leaves(model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[Leaf]:
    leaves: list[Leaf] = []
    for name, value in _top_level(model, args, kwargs):
        leaves.extend(flatten(name, (name,), value))
    return leaves


def tensor_leaves(leaves: Sequence[Leaf]) -> list[Leaf]:
    return [leaf for leaf in leaves if isinstance(leaf.value, torch.Tensor)]


def _spec_for(leaf: Leaf, spec: Any, top_names: list[str]) -> Any:
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


def declared_dynamic(leaves: Sequence[Leaf], dynamic_shapes: Any,
                      dynamic_axes: Mapping[str, Any] | None,
                      input_names: Sequence[str] | None) -> list[DynamicDim]:
    """Every tensor-input dim declared dynamic, from ``dynamic_shapes`` (torch.export style)
    and/or legacy ``dynamic_axes`` (keyed by ``input_names`` or parameter names)."""
    tensors = tensor_leaves(leaves)
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


def second_size(size: int, low: int, high: int | None) -> int | None:
    """Another size for a dynamic dim: a step of the largest power of two dividing it (at
    most 16), so models that need multiples (strided convs, pooling) still run."""
    step = min(size & -size, 16) if size > 0 else 1
    for candidate in (size + step, size - step, size + 1, size - 1, size + 2):
        if candidate >= max(low, 2) and (high is None or candidate <= high) \
                and candidate != size:
            return candidate
    return None


def second_inputs(leaves: Sequence[Leaf], dynamic: Sequence[DynamicDim], seed: int
                   ) -> tuple[list[Any], list[str]]:
    """Leaf values with every dynamic dim resized, and a description of each change.

    Float tensors get seeded random values with the example's mean and spread; other
    tensors repeat the example's values (indices and flags stay in range). An example
    sorted along its last dim (a searchsorted sequence, bin edges) gets sorted values."""
    rng = np.random.default_rng(seed)
    tensors = tensor_leaves(leaves)
    new_sizes: dict[str, int] = {}
    changes: list[str] = []
    shapes = [list(leaf.value.shape) for leaf in tensors]
    for dim in dynamic:
        old = shapes[dim.tensor][dim.dim]
        if dim.group not in new_sizes:
            size = second_size(int(tensors[dim.tensor].value.shape[dim.dim]), dim.low,
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


def rebuild(leaves: Sequence[Leaf], values: Sequence[Any], args: tuple[Any, ...],
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


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {init.name for init in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


def onnx_dims(value: onnx.ValueInfoProto) -> list[onnx.TensorShapeProto.Dimension]:
    tensor_type = value.type.tensor_type
    return list(tensor_type.shape.dim) if tensor_type.HasField("shape") else []


def output_tensors(value: Any) -> list[Any]:
    return [leaf.value for leaf in flatten("out", ("out",), value)
            if isinstance(leaf.value, torch.Tensor)]
