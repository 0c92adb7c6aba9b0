"""``torch.linalg.inv`` / ``torch.inverse`` / ``Tensor.inverse`` -> ``custom.ops::Inverse``;
``torch.linalg.inv_ex`` (``check_errors=False``) -> ``org.pytorch.aten::linalg_inv_ex``
(two outputs); ``torch.linalg.solve`` -> ``custom.ops::Solve(A, B, left)``.

torch's exporter has no ONNX function for them at all ("No ONNX function found for
aten.linalg_inv_ex"). The fake kernels are torch's own meta kernels, which read the shapes
without guarding on them. The patterns need static matrix sizes and say so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from decomposer.torch.emit import emit_opaque
from decomposer.torch.probe import ATEN_DOMAIN, OPAQUE_DOMAIN
from decomposer.torch.routes import NOT_ROUTED, ROUTING_NAMESPACE, Exporting, Route


@torch.library.custom_op(f"{ROUTING_NAMESPACE}::inverse", mutates_args=())
def inverse_op(a: torch.Tensor) -> torch.Tensor:
    result: torch.Tensor = torch.linalg.inv(a)
    return result


@inverse_op.register_fake
def _(a: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(a)


@torch.library.custom_op(f"{ROUTING_NAMESPACE}::inv_ex", mutates_args=())
def inv_ex_op(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    result, info = torch.linalg.inv_ex(a)
    return result, info


@inv_ex_op.register_fake
def _(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(a), a.new_empty(a.shape[:-2], dtype=torch.int32)


@torch.library.custom_op(f"{ROUTING_NAMESPACE}::solve", mutates_args=())
def solve_op(a: torch.Tensor, b: torch.Tensor, left: bool) -> torch.Tensor:
    result: torch.Tensor = torch.linalg.solve(a, b, left=left)
    return result


@solve_op.register_fake
def _(a: torch.Tensor, b: torch.Tensor, left: bool) -> torch.Tensor:
    # torch's meta kernel: its broadcasting rules for B, on the symbolic shapes
    result: torch.Tensor = torch.linalg.solve(a, b, left=left)
    return result


class InverseRoute(Route):
    functions = (torch.linalg.inv, torch.inverse, torch.Tensor.inverse)

    # torch.inverse names its argument input, torch.linalg.inv A
    signature = staticmethod(lambda input=None, *, A=None: None)

    def route(self, export: Exporting, function: Any, bound: dict[str, Any]) -> Any:
        a = bound["input"] if bound["input"] is not None else bound["A"]
        if a is None or not export.rewrites("Inverse", [a], ()):
            return NOT_ROUTED
        export.note("Inverse")
        return inverse_op(a)

    def translations(self, opset: int) -> dict[Any, Callable[..., Any]]:
        return {inverse_op._opoverload:
                lambda a: emit_opaque(OPAQUE_DOMAIN, 1, "Inverse", [a], {})}


class InvExRoute(Route):
    functions = (torch.linalg.inv_ex,)

    signature = staticmethod(lambda A, *, check_errors=False: None)

    def route(self, export: Exporting, function: Any, bound: dict[str, Any]) -> Any:
        if bound["check_errors"] or \
                not export.rewrites("linalg_inv_ex", [bound["A"]], (), outputs=2,
                                    domain=ATEN_DOMAIN):
            return NOT_ROUTED  # check_errors=True raises in eager mode; a graph cannot
        export.note("linalg_inv_ex")
        return inv_ex_op(bound["A"])

    def translations(self, opset: int) -> dict[Any, Callable[..., Any]]:
        # (inverse, info) has no custom-domain spelling: torch's own fallback name, as the
        # legacy exporter writes it with ONNX_FALLTHROUGH.
        return {inv_ex_op._opoverload:
                lambda a: emit_opaque(ATEN_DOMAIN, 1, "linalg_inv_ex", [a], {}, outputs=2)}


class SolveRoute(Route):
    functions = (torch.linalg.solve,)

    signature = staticmethod(lambda A, B, *, left=True, out=None: None)

    def route(self, export: Exporting, function: Any, bound: dict[str, Any]) -> Any:
        if bound["out"] is not None or not isinstance(bound["B"], torch.Tensor):
            return NOT_ROUTED
        a, b, left = bound["A"], bound["B"], bool(bound["left"])
        if not export.rewrites("Solve", [a, b], (("left", int(left)),)):
            return NOT_ROUTED
        export.note("Solve")
        return solve_op(a, b, left)

    def translations(self, opset: int) -> dict[Any, Callable[..., Any]]:
        return {solve_op._opoverload: lambda a, b, left: emit_opaque(
            OPAQUE_DOMAIN, 1, "Solve", [a, b], {"left": int(left)})}
