"""Routes: torch calls sent to an opaque node while torch exports, one module per op.

A route holds everything about one op in one place: the torch callables it intercepts,
its ``torch.library`` custom op and fake kernel (defined once, at import), the ONNX
translation that writes the opaque node under the dynamo exporter, and the symbolic that
writes it under the legacy exporter. It routes a call only when a registered pattern
rewrites the node the call would become (:meth:`Exporting.rewrites`).

Adding a route: write a module here with a ``Route`` subclass and list its instance in
:data:`decomposer.torch.routing.ROUTES`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from decomposer.torch.probe import OPAQUE_DOMAIN

NOT_ROUTED = object()  # what ``intercept`` returns to let torch run the call as usual
ROUTING_NAMESPACE = "decomposer"  # the torch.library namespace of the routing custom ops


class Exporting(Protocol):
    """What a route sees of the export in progress."""

    opset: int  # the default-domain opset the user asked for
    target: str  # decompose_with_report's target

    def rewrites(self, op_type: str, tensors: Sequence[Any], attrs: tuple[tuple[str, Any], ...],
                 outputs: int = 1, domain: str = OPAQUE_DOMAIN, symbolic: bool = False
                 ) -> bool:
        """Whether a pattern rewrites ``domain::op_type`` fed by ``tensors``: each dim static
        where torch.export has it as an int, symbolic where it is a SymInt (every dim with
        ``symbolic``); False for a tensor type ONNX lacks."""
        ...

    def note(self, name: str) -> None: ...


class Route:
    """One routed op; subclasses set ``functions`` and override what they use."""

    functions: tuple[Any, ...] = ()  # the torch callables intercepted under torch.export
    # A callable whose parameters name the call's arguments (with torch's defaults); a call
    # that does not bind to it is left to torch.
    signature: Callable[..., Any] = staticmethod(lambda *args, **kwargs: None)

    def intercept(self, export: Exporting, function: Any, args: Sequence[Any],
                  kwargs: Mapping[str, Any]) -> Any:
        """The custom op's result for this call, or :data:`NOT_ROUTED`."""
        bound = bind(self.signature, args, kwargs)
        return NOT_ROUTED if bound is None else self.route(export, function, bound)

    def route(self, export: Exporting, function: Any, bound: dict[str, Any]) -> Any:
        """The custom op's result for a call whose arguments are ``bound`` (by name, defaults
        applied), or :data:`NOT_ROUTED`."""
        return NOT_ROUTED

    def translations(self, opset: int) -> dict[Any, Callable[..., Any]]:
        """{custom op overload: ONNX translation} for an export at default-domain ``opset``."""
        return {}

    def legacy_symbolics(self, opset: int, target: str) -> dict[str, Callable[..., Any]]:
        """{``aten::name``: symbolic} registered while the legacy exporter runs."""
        return {}


def bind(function: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
         ) -> dict[str, Any] | None:
    """``function``'s parameters bound to a call's arguments (defaults applied), or None
    when the call does not fit its signature."""
    try:
        bound = inspect.signature(function).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


def builtin_symbolic(name: str, opset: int) -> Callable[..., Any] | None:
    """torch's own legacy symbolic for ``aten::name`` at ``opset``: a route's fall-back."""
    registry = legacy_registry()
    group = registry.get_function_group(name) if registry is not None else None
    return group.get(opset) if group is not None else None


def legacy_registry() -> Any:
    try:
        from torch.onnx._internal.torchscript_exporter import registration, utils
    except ImportError:  # a torch that moved it: no built-in fall-backs, no override check
        return None
    # The built-in symbolics register when their modules are imported, which the exporter
    # does only once it runs; the fall-backs must be looked up before ours are installed.
    getattr(utils, "_trigger_symbolic_function_registration", lambda: None)()
    return registration.registry
