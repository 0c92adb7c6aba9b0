"""The seeds' recipe on modern torch: an ``autograd.Function`` with a ``symbolic()``,
exported as the same opaque node under the dynamo exporter too.

In: a user's ``torch.autograd.Function`` subclass (forward + ``symbolic(g, ...)``). Out: a
subclass whose ``apply`` is a ``torch.library`` custom op during ``torch.export`` and the
original otherwise, and :func:`translation_table` entries whose translation runs the
user's ``symbolic()`` with a ``g`` that records the node (same domain, op type and typed
attributes).
"""

from __future__ import annotations

import functools
import inspect
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import torch

from decomposer.errors import ExportError
from decomposer.torch.emit import emit_opaque
from decomposer.torch.probe import TORCHLIB_OPSET

# torch's untyped corners, reached through Any (mypy --strict)
_TORCH_LIBRARY: Any = torch.library
_TORCH_JIT: Any = torch.jit


_USER_NAMESPACE = "decomposer_opaque"


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
        return emit_opaque(domain, version, op_type, [i for i in inputs if i is not None],
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
