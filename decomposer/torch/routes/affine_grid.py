"""``F.affine_grid`` -> ``custom.ops::AffineGrid(theta, Concat(sizes), align_corners)``.

torch.export traces ``F.affine_grid`` through its Python decomposition, which guards on H
and W (freezing them) and writes a slow base grid. The custom op's fake kernel reads the
output shape straight from the symbolic sizes; the translation writes the sizes as one
int64 tensor, reading runs of ``x.shape[i]`` as one ``Shape(x, start, end)`` so a size
taken from ``x.size()`` stays tied to x (TVM cannot Reshape the 0-d sizes). The legacy
exporter's ``aten::affine_grid_generator`` writes the same node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from onnx import TensorProto

from decomposer.torch import probe
from decomposer.torch.emit import emit_opaque
from decomposer.torch.probe import OPAQUE_DOMAIN, jit_elem_type, onnx_type, symbolic_shape
from decomposer.torch.routes import (
    NOT_ROUTED,
    ROUTING_NAMESPACE,
    Exporting,
    Route,
    builtin_symbolic,
)


@torch.library.custom_op(f"{ROUTING_NAMESPACE}::affine_grid", mutates_args=())
def affine_grid_op(theta: torch.Tensor, size: Sequence[int],
                   align_corners: bool) -> torch.Tensor:
    return F.affine_grid(theta, list(size), align_corners=align_corners)


@affine_grid_op.register_fake
def _(theta: torch.Tensor, size: Sequence[int], align_corners: bool) -> torch.Tensor:
    # (N, H, W, 2) or (N, D, H, W, 3) straight from the (symbolic) sizes
    return theta.new_empty((size[0], *size[2:], len(size) - 2))


def _probe_inputs(elem_type: int, rank: int) -> tuple[tuple[int, tuple[int | str, ...]], ...]:
    spatial = rank - 2
    return ((elem_type, symbolic_shape(3, {1: spatial, 2: spatial + 1})),
            (TensorProto.INT64, (rank,)))


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
    reach a translation function): runs of ints become one constant, runs of ``x.shape[i]``
    one ``Shape(x, start, end)``."""
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


def _translate(theta: Any, size: Sequence[Any], align_corners: bool) -> Any:
    return emit_opaque(OPAQUE_DOMAIN, 1, "AffineGrid", [theta, _concat_sizes(size)],
                       {"align_corners": int(align_corners)})


class AffineGridRoute(Route):
    functions = (F.affine_grid,)
    signature = staticmethod(F.affine_grid)

    def route(self, export: Exporting, function: Any, bound: dict[str, Any]) -> Any:
        theta, size = bound["theta"], list(bound["size"])
        elem_type = onnx_type(theta.dtype)
        if len(size) not in (4, 5) or elem_type is None:
            return NOT_ROUTED
        align = bool(bound["align_corners"])
        if not probe.pattern_rewrites("AffineGrid", _probe_inputs(elem_type, len(size)),
                                (("align_corners", int(align)),), export.opset, export.target):
            return NOT_ROUTED
        export.note("AffineGrid")
        return affine_grid_op(theta, size, align)

    def translations(self, opset: int) -> dict[Any, Callable[..., Any]]:
        return {affine_grid_op._opoverload: _translate}

    def legacy_symbolics(self, opset: int, target: str) -> dict[str, Callable[..., Any]]:
        from torch.onnx import symbolic_helper as sh

        native = builtin_symbolic("aten::affine_grid_generator", opset)

        def affine_grid(g: Any, theta: Any, size: Any, align_corners: Any) -> Any:
            align = bool(sh._maybe_get_const(align_corners, "b"))
            node = size.node()
            if node.kind() == "prim::ListConstruct":  # traced sizes: the exporter Concats
                rank, size_value = len(list(node.inputs())), size
            else:
                values = sh._maybe_get_const(size, "is")
                rank = len(values)
                size_value = g.op("Constant", value_t=torch.tensor(values, dtype=torch.int64))
            if native is not None and not probe.pattern_rewrites(
                    "AffineGrid", _probe_inputs(jit_elem_type(theta), rank),
                    (("align_corners", int(align)),), opset, target):
                return native(g, theta, size, align_corners)
            return g.op(f"{OPAQUE_DOMAIN}::AffineGrid", theta, size_value,
                        align_corners_i=int(align))

        return {"aten::affine_grid_generator": affine_grid}
