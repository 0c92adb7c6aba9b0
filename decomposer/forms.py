"""Declarative op spellings: which nodes a pattern answers for, and what their arguments mean.

In: a pattern's ``forms``, one :class:`Form` per spelling (a custom-domain node with
attributes, torch's ATen/FALLTHROUGH fallback with positional constants, a plugin's name with
its own attribute names), and a node matched by one of them.
Out: one normalized call: ``tensors`` (argument name -> tensor name, ``""`` when an optional
input is absent) and ``args`` (argument name -> plain Python value, defaulted, checked and
converted), the same whichever spelling the node used. The engine hands it to ``check`` and
``build``; the verifier and the test kit hand the numpy form of it (arrays instead of names)
to the pattern's ``compute``. A spelling the node breaks raises
:class:`decomposer.pattern.Reject` with the reason.

Example (a sampler op in three spellings, one set of arguments)::

    forms = (
        Form("Sample", inputs=(In("x"), In("grid")),
             attributes={"mode": Attr("string", "linear", normalize=_mode_name)}),
        Form(aten="sampler", inputs=(In("x"), In("grid"),
                                     Const("mode", "int", normalize=_mode_code))),
        Form("mm_sampler", attributes={"interpolation": Attr("int", 0, arg="mode",
                                                             normalize=_mode_code)}),
    )

Inputs are positional: a node may omit trailing optional ones and write ``""`` for an absent
optional one in the middle. Attributes the form does not declare are an error (a typo in an
exporter's attribute name must not pass silently) unless ``extra_attributes`` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, helper

ATEN_DOMAIN = "org.pytorch.aten"


class Reject(Exception):
    """Raised when a node matches a pattern by name but cannot be rewritten.

    The message is the reason; the engine adds the node, op and domain to it.
    """


class UnknownTypes(Reject):
    """A Reject because a tensor's element type or rank is unknown (``checks.require_type``
    and ``require_shape``): the engine then asks ONNX Runtime's symbolic shape inference
    once (it knows the contrib ops ONNX's own inference does not) and tries the node again.
    """


_REQUIRED: Any = object()

_ATTR_KINDS = {
    "int": (AttributeProto.INT,),
    # A float attribute written with an int value (``scale_f=2`` spelled ``scale_i=2``) is
    # still a number; accept it rather than make users re-export.
    "float": (AttributeProto.FLOAT, AttributeProto.INT),
    "string": (AttributeProto.STRING,),
    "strings": (AttributeProto.STRINGS,),
    "ints": (AttributeProto.INTS,),
    "floats": (AttributeProto.FLOATS, AttributeProto.INTS),
    # One int or a list of them, read as a list (plugins write a square stride either way).
    "int_or_ints": (AttributeProto.INT, AttributeProto.INTS),
}


def _finish(label: str, value: Any, normalize: Callable[[Any], Any] | None,
            choices: Sequence[Any] | None) -> Any:
    if normalize is not None:
        try:
            value = normalize(value)
        except Reject as why:
            raise Reject(f"{label}: {why}") from None
    if choices is not None and value not in choices:
        raise Reject(f"{label} = {value!r} is not one of {list(choices)}")
    return value


@dataclass(frozen=True)
class Attr:
    """One attribute of a spelling.

    ``kind`` is ``"int" | "float" | "string" | "strings" | "ints" | "floats" |
    "int_or_ints"`` (the last
    reads one int as a 1-element list); ``default`` is used when
    the node lacks the attribute (omit it to make the attribute required), written like a
    value and normalized like one (``None`` is passed through as "absent"); ``normalize``
    maps the written value to the argument's value (it may raise :class:`Reject`);
    ``choices`` lists the accepted values after ``normalize``; ``arg`` names the argument it
    sets when that differs from the attribute's name (``interpolation_mode`` -> ``mode``).
    """

    kind: str
    default: Any = _REQUIRED
    choices: Sequence[Any] | None = None
    normalize: Callable[[Any], Any] | None = None
    doc: str = ""
    arg: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in _ATTR_KINDS:
            raise ValueError(f"unknown attribute kind {self.kind!r}; "
                             f"use one of {list(_ATTR_KINDS)}")

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def _default(self, label: str) -> Any:
        """The default, in the written spelling's units like any value (None stays None)."""
        if self.default is None:
            return None
        return _finish(label, self.default, self.normalize, self.choices)

    def coerce(self, name: str, value: Any) -> Any:
        """A plain Python value (``None`` = absent) defaulted and normalized like ``parse``
        (for references called outside the engine); raises Reject."""
        if value is None:
            if self.required:
                raise Reject(f"required attribute '{name}' is missing")
            return self._default(f"attribute '{name}'")
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        if isinstance(value, np.ndarray):
            value = value.tolist()
        return _finish(f"attribute '{name}'", value, self.normalize, self.choices)

    def parse(self, name: str, proto: AttributeProto | None) -> Any:
        """The attribute's value, defaulted, type-checked and normalized; raises Reject."""
        if proto is None:
            if self.required:
                raise Reject(f"required attribute '{name}' is missing")
            return self._default(f"attribute '{name}'")
        if proto.type not in _ATTR_KINDS[self.kind]:
            got = AttributeProto.AttributeType.Name(proto.type).lower()
            raise Reject(f"attribute '{name}' must be {self.kind}, got {got}")
        value = helper.get_attribute_value(proto)
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        if self.kind == "float":
            value = float(value)
        elif self.kind == "floats":
            value = [float(v) for v in value]
        elif self.kind == "ints":
            value = [int(v) for v in value]
        elif self.kind == "int_or_ints":
            value = [int(v) for v in (value if isinstance(value, list) else [value])]
        elif self.kind == "strings":
            value = [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else str(v)
                     for v in value]
        return _finish(f"attribute '{name}'", value, self.normalize, self.choices)


@dataclass(frozen=True)
class In:
    """A tensor input at this position, named ``name`` in the normalized call."""

    name: str
    optional: bool = False


_CONST_KINDS: dict[str, tuple[str, str, Callable[[np.ndarray], Any]]] = {
    # kind: (numpy kinds accepted, what the message calls them, how the value is read)
    "int": ("iub", "an integer or bool", lambda a: int(a.reshape(()).item())),
    "bool": ("iub", "a bool or integer", lambda a: bool(a.reshape(()).item())),
    "float": ("iubf", "a number", lambda a: float(a.reshape(()).item())),
    "ints": ("iub", "integers", lambda a: [int(v) for v in a.reshape(-1).tolist()]),
    "floats": ("iubf", "numbers", lambda a: [float(v) for v in a.reshape(-1).tolist()]),
    "string": ("OSU", "a string", lambda a: _text(a.reshape(()).item())),
}


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Const:
    """A non-tensor argument written as a constant input at this position (torch's ATen
    fallbacks and FALLTHROUGH exports pass ints, floats and bools that way).

    ``kind`` is ``"int" | "bool" | "float" | "ints" | "floats" | "string"``; an absent input
    (``""``
    or past the node's last input) takes ``default`` (omit it to make the input required).
    ``normalize`` and ``choices`` work as for :class:`Attr`; ``why`` ends the message of a
    non-constant input (why the pattern needs the value, e.g. "it sets the output's shape").
    """

    name: str
    kind: str
    default: Any = _REQUIRED
    choices: Sequence[Any] | None = None
    normalize: Callable[[Any], Any] | None = None
    why: str = ""

    def __post_init__(self) -> None:
        if self.kind not in _CONST_KINDS:
            raise ValueError(f"unknown constant kind {self.kind!r}; "
                             f"use one of {list(_CONST_KINDS)}")

    @property
    def optional(self) -> bool:
        return self.default is not _REQUIRED

    def read(self, position: int, value: np.ndarray | None, present: bool) -> Any:
        """The argument from the input's value (None: not a constant); raises Reject."""
        label = f"{self.name} (input {position + 1})"
        if not present:
            if not self.optional:
                raise Reject(f"{label} is missing")
            if self.default is None:
                return None
            return _finish(label, self.default, self.normalize, self.choices)
        if value is None:
            what = "a constant scalar" if self.kind in ("int", "bool", "float") else \
                "a constant"
            raise Reject(f"{label} must be {what} (an initializer or Constant)"
                         + (f": {self.why}" if self.why else ""))
        value = np.asarray(value)
        scalar = self.kind in ("int", "bool", "float", "string")
        if scalar and value.size != 1:
            raise Reject(f"{label} must be a scalar, got shape {list(value.shape)}")
        if not scalar and value.ndim > 1:
            raise Reject(f"{label} must be a scalar or 1-D, got shape {list(value.shape)}")
        accepted, wanted, convert = _CONST_KINDS[self.kind]
        if value.dtype.kind not in accepted:
            raise Reject(f"{label} must be {wanted}, got {value.dtype}")
        return _finish(label, convert(value), self.normalize, self.choices)


@dataclass(frozen=True)
class Form:
    """One spelling of an op.

    - ``op_types``: the node's op_type(s) in a custom or default domain; leave it empty for
      a pure ATen form.
    - ``domains``: accepted domains; ``None`` means any, including the default domain where
      the op is not standard at the model's opset (the engine offers only non-standard
      nodes). ``frozenset()`` with ``aten`` set: the ATen fallback only.
    - ``aten``: torch's ATen name: ``org.pytorch.aten::<aten>`` and
      ``ATen(operator=<aten>)`` match this form.
    - ``inputs``: the positional inputs, :class:`In` (tensor) or :class:`Const` (constant
      argument); ``None`` leaves the inputs unchecked (legacy patterns read them raw).
    - ``attributes``: attribute name -> :class:`Attr`.
    - ``outputs``: the output count, or a ``(fewest, most)`` range (optional outputs).
    - ``extra_attributes``: attribute names accepted and ignored (exporter bookkeeping such
      as mmcv's ``im2col_step``); ATen nodes' ``operator``/``overload_name`` always are.
    - ``convert``: maps the collected arguments to the pattern's normalized ones, for
      spellings whose arguments do not map one to one (it may raise :class:`Reject`).
    - ``label``: how reports and ``--list-patterns`` name the spelling.
    """

    op_types: tuple[str, ...] | str = ()
    domains: frozenset[str] | None = None
    aten: str | None = None
    inputs: tuple[In | Const, ...] | None = None
    attributes: Mapping[str, Attr] = field(default_factory=dict)
    outputs: int | tuple[int, int] = 1
    extra_attributes: frozenset[str] = frozenset()
    convert: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    label: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.op_types, str):
            object.__setattr__(self, "op_types", (self.op_types,))
        if not self.op_types and self.aten is None:
            raise ValueError("a Form needs op_types, an aten name, or both")

    # -- what the registry reads ---------------------------------------------------------

    @property
    def kind(self) -> str:
        """``"aten"`` for a pure ATen form, else ``"native"`` (what ``MatchedNode.form``
        says; a form with both answers ``"native"`` for its op_types)."""
        return "aten" if not self.op_types else "native"

    def keys(self) -> list[tuple[str | None, str]]:
        """(domain or None for any, op_type) keys of the native spelling."""
        if self.domains is None:
            return [(None, op) for op in self.op_types]
        return [(domain, op) for op in self.op_types
                for domain in sorted(self.domains)]

    def describe(self, op_type: str = "") -> str:
        """How ``--list-patterns`` shows the spelling (``op_type``: the pattern's own name,
        left out when it is the spelling's only op_type)."""
        if self.label:
            return self.label
        parts = []
        if self.op_types:
            where = "any domain" if self.domains is None else \
                ", ".join(sorted(d or "<default>" for d in self.domains))
            ops = "/".join(self.op_types)
            parts.append(where if self.op_types == (op_type,) else f"{ops} ({where})")
        if self.aten:
            parts.append(f"ATen {self.aten}")
        return "; ".join(parts)

    @property
    def output_range(self) -> tuple[int, int]:
        return (self.outputs, self.outputs) if isinstance(self.outputs, int) else self.outputs

    # -- binding a node -------------------------------------------------------------------

    def parse_attributes(self, node: onnx.NodeProto, aten_node: bool) -> dict[str, Any]:
        """Attributes by argument name, defaulted and checked, plus the output and input
        counts; raises Reject. ATen nodes carry only ``operator``/``overload_name``."""
        given = {a.name: a for a in node.attribute}
        if aten_node:
            given = {k: v for k, v in given.items() if k not in ("operator", "overload_name")}
        known = set(self.attributes) | set(self.extra_attributes)
        unknown = sorted(set(given) - known)
        if unknown:
            expected = ", ".join(sorted(self.attributes)) or "none"
            raise Reject(f"unknown attribute(s) {unknown}; expected: {expected}")
        fewest, most = self.output_range
        count = len(node.output)
        if not fewest <= count <= most:
            want = str(fewest) if fewest == most else f"{fewest} to {most}"
            raise Reject(f"expected {want} output(s), got {count}")
        if count and not any(node.output):
            raise Reject("no output is named (the node computes nothing used)")
        if self.inputs is not None:
            self._check_input_count(list(node.input))
        return {spec.arg or name: spec.parse(name, given.get(name))
                for name, spec in self.attributes.items()}

    def _check_input_count(self, names: Sequence[str]) -> None:
        assert self.inputs is not None
        fewest = max((i + 1 for i, slot in enumerate(self.inputs) if not slot.optional),
                     default=0)
        most = len(self.inputs)
        if not fewest <= len(names) <= most:
            want = str(fewest) if fewest == most else f"{fewest} to {most}"
            slots = ", ".join(s.name + ("?" if s.optional else "") for s in self.inputs)
            raise Reject(f"expected {want} inputs ({slots}), got {len(names)}")
        for position, slot in enumerate(self.inputs):
            if isinstance(slot, In) and not slot.optional and not names[position]:
                raise Reject(f"input {position + 1} ({slot.name}) is required but empty")

    def bind(self, names: Sequence[str], attrs: Mapping[str, Any],
             constant: Callable[[str], np.ndarray | None]) -> tuple[dict[str, str],
                                                                     dict[str, Any]]:
        """(tensors, args) of a node with input ``names``; ``constant`` reads a constant
        input's value (None: not constant). Raises Reject."""
        if self.inputs is None:
            return {}, dict(attrs)
        self._check_input_count(names)
        tensors: dict[str, str] = {}
        args = dict(attrs)
        for position, slot in enumerate(self.inputs):
            name = names[position] if position < len(names) else ""
            if isinstance(slot, In):
                tensors[slot.name] = name
            else:
                args[slot.name] = slot.read(position, constant(name) if name else None,
                                            bool(name))
        return tensors, self._converted(args)

    def coerce_attributes(self, attrs: Mapping[str, Any]) -> dict[str, Any]:
        """Plain attribute values by attribute name (absent or None = default) -> values by
        argument name, as :meth:`parse_attributes` gives them. Raises Reject."""
        unknown = sorted(set(attrs) - set(self.attributes) - set(self.extra_attributes))
        if unknown:
            raise Reject(f"unknown attribute(s) {unknown}; expected: "
                         f"{', '.join(sorted(self.attributes)) or 'none'}")
        return {spec.arg or name: spec.coerce(name, attrs.get(name))
                for name, spec in self.attributes.items()}

    def bind_values(self, inputs: Sequence[np.ndarray | None], attrs: Mapping[str, Any]
                    ) -> tuple[dict[str, np.ndarray | None], dict[str, Any]]:
        """(tensors, args) from input arrays (``None`` for an absent optional input) and
        the parsed attributes (by argument name): the numpy side of :meth:`bind`, for
        references. Raises Reject."""
        args = dict(attrs)
        if self.inputs is None:
            return {}, args
        if len(inputs) > len(self.inputs):
            raise Reject(f"expected at most {len(self.inputs)} inputs, got {len(inputs)}")
        tensors: dict[str, np.ndarray | None] = {}
        for position, slot in enumerate(self.inputs):
            value = inputs[position] if position < len(inputs) else None
            if isinstance(slot, In):
                if value is None and not slot.optional:
                    raise Reject(f"input {position + 1} ({slot.name}) is required")
                tensors[slot.name] = value
            else:
                args[slot.name] = slot.read(position, value, value is not None)
        return tensors, self._converted(args)

    def _converted(self, args: dict[str, Any]) -> dict[str, Any]:
        return self.convert(args) if self.convert is not None else args


def aten_operator(node: onnx.NodeProto) -> str | None:
    """The ATen op name of a torch fallback node, or None if it is not one."""
    if node.op_type == "ATen":
        for attr in node.attribute:
            if attr.name == "operator":
                return str(attr.s.decode("utf-8", errors="replace"))
        return None
    if node.domain == ATEN_DOMAIN:
        return node.op_type
    return None
