"""``F.grid_sample`` -> ``custom.ops::GridSample(x, grid, mode, padding_mode, align_corners)``,
or a standard GridSample where that is the better choice.

The call is routed either way under torch.export: torch's fake kernel for grid_sample runs
its Python decomposition on symbolic shapes, which takes seconds per call. The custom op's
``native`` flag asks the translation for a standard GridSample (renamed modes at 20) when
:func:`decomposer.torch.probe.grid_sample_stays_native` says so or no pattern rewrites the
node. The legacy exporter's ``aten::grid_sampler`` makes the same choice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from decomposer.torch import probe
from decomposer.torch.emit import emit_opaque
from decomposer.torch.probe import (
    OPAQUE_DOMAIN,
    grid_sample_stays_native,
    jit_elem_type,
    onnx_type,
    symbolic_shape,
)
from decomposer.torch.routes import (
    NOT_ROUTED,
    ROUTING_NAMESPACE,
    Exporting,
    Route,
    builtin_symbolic,
)

GRID_MODES = ("bilinear", "nearest", "bicubic")  # torch's enum order in aten::grid_sampler
GRID_PADDINGS = ("zeros", "border", "reflection")


@torch.library.custom_op(f"{ROUTING_NAMESPACE}::grid_sample", mutates_args=())
def grid_sample_op(x: torch.Tensor, grid: torch.Tensor, mode: str, padding_mode: str,
                   align_corners: bool, native: bool) -> torch.Tensor:
    return F.grid_sample(x, grid, mode=mode, padding_mode=padding_mode,
                         align_corners=align_corners)


@grid_sample_op.register_fake
def _(x: torch.Tensor, grid: torch.Tensor, mode: str, padding_mode: str,
      align_corners: bool, native: bool) -> torch.Tensor:
    return x.new_empty((x.shape[0], x.shape[1], *grid.shape[1:-1]))


def _rewritten(elem_type: int, rank: int, mode: str, padding: str, align: bool, opset: int,
               target: str) -> bool:
    inputs = ((elem_type, symbolic_shape(rank)),
              (elem_type, symbolic_shape(rank, {rank - 1: rank - 2})))
    attrs = (("align_corners", int(align)), ("mode", mode), ("padding_mode", padding))
    return probe.pattern_rewrites("GridSample", inputs, attrs, opset, target)


class GridSampleRoute(Route):
    functions = (F.grid_sample,)
    signature = staticmethod(F.grid_sample)

    def route(self, export: Exporting, function: Any, bound: dict[str, Any]) -> Any:
        x, grid = bound["input"], bound["grid"]
        mode, padding, align = bound["mode"], bound["padding_mode"], bool(bound["align_corners"])
        elem_type = onnx_type(x.dtype)
        rank = x.dim()
        if rank not in (4, 5) or elem_type is None or grid.dtype != x.dtype \
                or mode not in GRID_MODES or padding not in GRID_PADDINGS:
            return NOT_ROUTED
        has_op = export.opset >= (16 if rank == 4 else 20)
        native = grid_sample_stays_native(rank, mode, padding, align, export.opset) or not \
            _rewritten(elem_type, rank, mode, padding, align, export.opset, export.target)
        if native and not has_op:
            return NOT_ROUTED  # torch's own export then fails, saying why
        export.note("GridSample (standard)" if native else "GridSample")
        return grid_sample_op(x, grid, mode, padding, align, native)

    def translations(self, opset: int) -> dict[Any, Callable[..., Any]]:
        def translate(x: Any, grid: Any, mode: str, padding_mode: str, align_corners: bool,
                      native: bool) -> Any:
            if not native:
                return emit_opaque(OPAQUE_DOMAIN, 1, "GridSample", [x, grid],
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

        return {grid_sample_op._opoverload: translate}

    def legacy_symbolics(self, opset: int, target: str) -> dict[str, Callable[..., Any]]:
        from torch.onnx import symbolic_helper as sh

        native_symbolic = builtin_symbolic("aten::grid_sampler", opset)

        def grid_sampler(g: Any, x: Any, grid: Any, mode: Any, padding: Any, align: Any
                         ) -> Any:
            mode_name = GRID_MODES[sh._maybe_get_const(mode, "i")]
            padding_name = GRID_PADDINGS[sh._maybe_get_const(padding, "i")]
            aligned = bool(sh._maybe_get_const(align, "b"))
            rank = sh._get_tensor_rank(x) or 4
            native = grid_sample_stays_native(rank, mode_name, padding_name, aligned, opset) \
                or not _rewritten(jit_elem_type(x), rank, mode_name, padding_name, aligned,
                                  opset, target)
            if native and native_symbolic is not None:
                return native_symbolic(g, x, grid, mode, padding, align)
            return g.op(f"{OPAQUE_DOMAIN}::GridSample", x, grid, mode_s=mode_name,
                        padding_mode_s=padding_name, align_corners_i=int(aligned))

        return {"aten::grid_sampler": grid_sampler}
