"""``torch.cummax`` / ``torch.cummin`` (and the Tensor methods) ->
``custom.ops::CumMax`` / ``CumMin(x, dim)`` with two outputs (values, int64 indices).

torch's exporter has no ONNX function for aten.cummax / cummin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from decomposer.torch.emit import emit_opaque
from decomposer.torch.probe import OPAQUE_DOMAIN
from decomposer.torch.routes import NOT_ROUTED, ROUTING_NAMESPACE, Exporting, Route


@torch.library.custom_op(f"{ROUTING_NAMESPACE}::cumulative_extreme", mutates_args=())
def cumulative_extreme_op(x: torch.Tensor, dim: int, largest: bool
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    values, indices = (torch.cummax if largest else torch.cummin)(x, dim)
    return values, indices


@cumulative_extreme_op.register_fake
def _(x: torch.Tensor, dim: int, largest: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), x.new_empty(x.shape, dtype=torch.int64)


def _translate(x: Any, dim: int, largest: bool) -> Any:
    return emit_opaque(OPAQUE_DOMAIN, 1, "CumMax" if largest else "CumMin", [x],
                       {"dim": int(dim)}, outputs=2)


class CumulativeExtremeRoute(Route):
    functions = (torch.cummax, torch.Tensor.cummax, torch.cummin, torch.Tensor.cummin)

    signature = staticmethod(lambda input, dim, *, out=None: None)

    def route(self, export: Exporting, function: Any, bound: dict[str, Any]) -> Any:
        if bound["out"] is not None or not isinstance(bound["dim"], int):
            return NOT_ROUTED
        x, dim = bound["input"], bound["dim"]
        largest = function in (torch.cummax, torch.Tensor.cummax)
        op_type = "CumMax" if largest else "CumMin"
        if not export.rewrites(op_type, [x], (("dim", int(dim)),), outputs=2):
            return NOT_ROUTED
        export.note(op_type)
        return cumulative_extreme_op(x, int(dim), largest)

    def translations(self, opset: int) -> dict[Any, Callable[..., Any]]:
        return {cumulative_extreme_op._opoverload: _translate}
