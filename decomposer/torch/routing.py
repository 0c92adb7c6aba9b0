"""The routing in force while torch exports: which routes exist, and how they are applied.

In: the default-domain opset asked for and the decompose target. Out: under the dynamo
exporter, :class:`Router` (a torch function mode that sends each intercepted call to its
route) and :func:`translations` (the routes' ONNX translations); under the legacy
exporter, :func:`legacy_routing`, which registers the routes' symbolics for the export only
(a user's own symbolic for the same aten op wins).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from decomposer.torch import probe
from decomposer.torch.probe import OPAQUE_DOMAIN, onnx_type
from decomposer.torch.routes import NOT_ROUTED, Route, legacy_registry
from decomposer.torch.routes.affine_grid import AffineGridRoute
from decomposer.torch.routes.cumulative import CumulativeExtremeRoute
from decomposer.torch.routes.grid_sample import GridSampleRoute
from decomposer.torch.routes.linalg import InverseRoute, InvExRoute, SolveRoute
from decomposer.torch.routes.rot90 import Rot90Route
from decomposer.torch.routes.searchsorted import SearchSortedRoute

_TORCH_ONNX: Any = torch.onnx  # not fully typed (mypy --strict)

ROUTES: tuple[Route, ...] = (
    AffineGridRoute(), GridSampleRoute(), Rot90Route(), InverseRoute(), InvExRoute(),
    SolveRoute(), SearchSortedRoute(), CumulativeExtremeRoute())


class Router(TorchFunctionMode):
    """While torch.export traces the model, hands every call a route intercepts to that
    route; ``routed`` lists the nodes written, for the log."""

    def __init__(self, opset: int, target: str) -> None:
        super().__init__()
        self.opset = opset
        self.target = target
        self.routed: list[str] = []
        self.routes = {function: route for route in ROUTES for function in route.functions}

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        route = self.routes.get(func)
        if route is not None:
            result = route.intercept(self, func, args, kwargs)
            if result is not NOT_ROUTED:
                return result
        return func(*args, **kwargs)

    def rewrites(self, op_type: str, tensors: Sequence[Any], attrs: tuple[tuple[str, Any], ...],
                 outputs: int = 1, domain: str = OPAQUE_DOMAIN, symbolic: bool = False
                 ) -> bool:
        inputs = []
        for tensor in tensors:
            elem_type = onnx_type(tensor.dtype) if isinstance(tensor, torch.Tensor) else None
            if elem_type is None:
                return False
            inputs.append((elem_type, tuple(
                dim if isinstance(dim, int) and not symbolic else f"d{axis}"
                for axis, dim in enumerate(tensor.shape))))
        return probe.pattern_rewrites(op_type, tuple(inputs), attrs, self.opset, self.target,
                                      outputs, domain)

    def note(self, name: str) -> None:
        self.routed.append(name)


def translations(opset: int) -> dict[Any, Callable[..., Any]]:
    """Every route's ONNX translation, for an export that writes default-domain ``opset``."""
    table: dict[Any, Callable[..., Any]] = {}
    for route in ROUTES:
        table.update(route.translations(opset))
    return table


def _user_overrode(name: str, opset: int) -> bool:
    registry = legacy_registry()
    group = registry.get_function_group(name) if registry is not None else None
    try:
        return bool(group is not None and group._functions.overridden(opset))
    except AttributeError:
        return False


@contextlib.contextmanager
def legacy_routing(opset: int, target: str) -> Iterator[None]:
    """The routes' legacy symbolics, registered for the duration of one export."""
    symbolics: dict[str, Callable[..., Any]] = {}
    for route in ROUTES:
        symbolics.update(route.legacy_symbolics(opset, target))
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
