"""``torch.rot90`` / ``Tensor.rot90`` -> ``custom.ops::Rot90(x, k, dims)``.

torch writes rot90 as a ``Slice`` with step -1, which onnx2tf silently turns into Identity;
the Rot90 pattern writes a portable flip instead. The legacy exporter's ``aten::rot90``
writes the same node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from decomposer.torch.emit import emit_opaque
from decomposer.torch.probe import OPAQUE_DOMAIN
from decomposer.torch.routes import NOT_ROUTED, ROUTING_NAMESPACE, Exporting, Route


@torch.library.custom_op(f"{ROUTING_NAMESPACE}::rot90", mutates_args=())
def rot90_op(x: torch.Tensor, k: int, dims: Sequence[int]) -> torch.Tensor:
    return torch.rot90(x, k, list(dims)).clone()


@rot90_op.register_fake
def _(x: torch.Tensor, k: int, dims: Sequence[int]) -> torch.Tensor:
    shape = list(x.shape)
    if k % 2:
        a, b = dims[0] % x.dim(), dims[1] % x.dim()
        shape[a], shape[b] = shape[b], shape[a]
    return x.new_empty(shape)


def _translate(x: Any, k: int, dims: Sequence[int]) -> Any:
    return emit_opaque(OPAQUE_DOMAIN, 1, "Rot90", [x], {"k": int(k), "dims": list(dims)})


class Rot90Route(Route):
    functions = (torch.rot90, torch.Tensor.rot90)

    signature = staticmethod(lambda input, k=1, dims=(0, 1): None)

    def route(self, export: Exporting, function: Any, bound: dict[str, Any]) -> Any:
        x, k, dims = bound["input"], bound["k"], bound["dims"]
        if not isinstance(x, torch.Tensor) or not isinstance(k, int) \
                or not all(isinstance(d, int) for d in dims) or len(dims) != 2:
            return NOT_ROUTED
        attrs = (("dims", tuple(int(d) for d in dims)), ("k", int(k)))
        if not export.rewrites("Rot90", [x], attrs, symbolic=True):
            return NOT_ROUTED
        export.note("Rot90")
        return rot90_op(x, int(k), [int(d) for d in dims])

    def translations(self, opset: int) -> dict[Any, Callable[..., Any]]:
        return {rot90_op._opoverload: _translate}

    def legacy_symbolics(self, opset: int, target: str) -> dict[str, Callable[..., Any]]:
        from torch.onnx import symbolic_helper as sh

        def rot90(g: Any, x: Any, k: Any, dims: Any) -> Any:
            turns = int(sh._maybe_get_const(k, "i"))
            axes = [int(d) for d in sh._maybe_get_const(dims, "is")]
            return g.op(f"{OPAQUE_DOMAIN}::Rot90", x, k_i=turns, dims_i=axes)

        return {"aten::rot90": rot90}
