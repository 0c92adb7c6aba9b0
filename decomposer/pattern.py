"""The Pattern API: what a decomposition declares and what the engine hands it.

In: a pattern module subclasses :class:`Pattern`, declaring its op, domains, attribute
schema, ``check``, ``build`` and a numpy ``reference``.
Out: the engine calls ``pattern.match_attributes`` then ``pattern.check`` (which returns
facts or raises :class:`Reject` with a reason) and ``pattern.build`` (which emits standard
nodes through a :class:`decomposer.builder.Builder`).

A pattern holds no state between ``check`` and ``build``: everything ``build`` needs comes
back from ``check`` as its return value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np
import onnx
from onnx import AttributeProto, helper

from decomposer.builder import Builder

ATEN_DOMAIN = "org.pytorch.aten"

# (ONNX element type or None, static shape or None) of one output; dims are ints, symbolic
# names, or None for unknown.
OutputType = tuple[int | None, Sequence[int | str | None] | None]


class Reject(Exception):
    """Raised by ``Pattern.check`` when a node matches by name but cannot be rewritten.

    The message is the reason; the engine adds the node, op and domain to it.
    """


_REQUIRED = object()

_ATTR_KINDS = {
    "int": (AttributeProto.INT,),
    # A float attribute written with an int value (``scale_f=2`` spelled ``scale_i=2``) is
    # still a number; accept it rather than make users re-export.
    "float": (AttributeProto.FLOAT, AttributeProto.INT),
    "string": (AttributeProto.STRING,),
    "ints": (AttributeProto.INTS,),
    "floats": (AttributeProto.FLOATS, AttributeProto.INTS),
}


@dataclass(frozen=True)
class Attr:
    """One attribute in a pattern's schema.

    ``kind`` is ``"int" | "float" | "string" | "ints" | "floats"``; ``default`` is used when
    the node lacks the attribute (omit it to make the attribute required); ``choices``
    lists the accepted values after ``normalize`` has been applied.
    """

    kind: str
    default: Any = _REQUIRED
    choices: Sequence[Any] | None = None
    normalize: Callable[[Any], Any] | None = None
    doc: str = ""

    def __post_init__(self) -> None:
        if self.kind not in _ATTR_KINDS:
            raise ValueError(f"unknown attribute kind {self.kind!r}; "
                             f"use one of {list(_ATTR_KINDS)}")

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def coerce(self, name: str, value: Any) -> Any:
        """A plain Python value (``None`` = absent) defaulted and normalized like ``parse``;
        raises ValueError. For references called outside the engine (test kit, users)."""
        if value is None:
            if self.required:
                raise ValueError(f"required attribute '{name}' is missing")
            return self.default
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        if self.normalize is not None:
            value = self.normalize(value)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"attribute '{name}' = {value!r} is not one of {list(self.choices)}")
        return value

    def parse(self, name: str, proto: AttributeProto | None) -> Any:
        """The attribute's value, defaulted, type-checked and normalized; raises Reject."""
        if proto is None:
            if self.required:
                raise Reject(f"required attribute '{name}' is missing")
            return self.default
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
        if self.normalize is not None:
            value = self.normalize(value)
        if self.choices is not None and value not in self.choices:
            raise Reject(f"attribute '{name}' = {value!r} is not one of {list(self.choices)}")
        return value


class MatchContext(Protocol):
    """What a pattern may ask the engine about the graph around a node.

    ``opset`` is the model's default-domain opset (the replacement's); ``target`` is
    ``"portable"`` or ``"ort"`` (see :mod:`decomposer.builder`).
    """

    opset: int
    target: str

    def constant(self, name: str) -> np.ndarray | None:
        """The value of tensor ``name`` if it is an initializer or Constant output."""

    def shape(self, name: str) -> tuple[int | str | None, ...] | None:
        """Static shape of ``name`` (ints, symbolic names, or None per dim); None if unknown."""

    def elem_type(self, name: str) -> int | None:
        """ONNX element type of ``name``, or None if unknown."""

    def is_model_input(self, name: str) -> bool:
        """Whether ``name`` is fed by the caller at run time (a main-graph input with no
        initializer), so no runtime optimizer can treat it as a constant."""

    def is_model_output(self, name: str) -> bool:
        """Whether ``name`` is an output of the main graph (not of a subgraph or function
        body): the caller receives it in a buffer of its own, so a runtime must copy into it
        whatever the producing node does not write itself."""


@dataclass
class MatchedNode:
    """A node as a pattern sees it: inputs, outputs, parsed attributes, and its form.

    ``form`` is ``"native"`` for ``Domain::OpType`` nodes and ``"aten"`` for torch's
    ``org.pytorch.aten`` fallbacks, whose non-tensor arguments arrive as constant inputs.
    """

    proto: onnx.NodeProto
    form: str
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.proto.name

    @property
    def inputs(self) -> list[str]:
        return list(self.proto.input)

    @property
    def outputs(self) -> list[str]:
        return list(self.proto.output)


FactsT = TypeVar("FactsT")


class Pattern(Generic[FactsT]):
    """Base class of every decomposition. Subclasses set the class attributes and methods.

    ``Pattern[Facts]`` types what ``check`` returns and ``build`` receives (a NamedTuple or
    dataclass of everything ``build`` needs); a plain ``Pattern`` subclass means ``Any``.

    - ``op_type``: the node's op_type in its native form.
    - ``domains``: accepted domains; ``None`` means any domain, including the default
      domain when the op is not standard at the model's opset (the engine only offers
      non-standard nodes).
    - ``aten_operator``: torch's ATen name, so ``org.pytorch.aten::<name>`` and
      ``ATen(operator=<name>)`` match too; ``None`` for none.
    - ``attributes``: the attribute schema of the native form.
    - ``num_outputs``: how many outputs the node must have.
    """

    op_type: ClassVar[str]
    domains: ClassVar[frozenset[str] | None] = None
    aten_operator: ClassVar[str | None] = None
    attributes: ClassVar[Mapping[str, Attr]] = {}
    num_outputs: ClassVar[int] = 1

    @property
    def name(self) -> str:
        """Name shown in reports; the op_type unless a subclass says otherwise."""
        return self.op_type

    @property
    def summary(self) -> str:
        """First line of the pattern module's docstring (what ``--list-patterns`` prints)."""
        import sys

        module = sys.modules.get(type(self).__module__)
        doc = (module.__doc__ if module else None) or type(self).__doc__ or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""

    def keys(self) -> list[tuple[str | None, str]]:
        """(domain or None for any, op_type) keys this pattern answers to in the registry."""
        keys: list[tuple[str | None, str]] = []
        if self.domains is None:
            keys.append((None, self.op_type))
        else:
            keys.extend((domain, self.op_type) for domain in sorted(self.domains))
        return keys

    def match_attributes(self, node: onnx.NodeProto, form: str) -> dict[str, Any]:
        """Parse the node's attributes against the schema; raises Reject on any mismatch."""
        if form == "aten":
            # ATen fallbacks carry only `operator`/`overload_name`; arguments are inputs.
            return {}
        given = {a.name: a for a in node.attribute}
        unknown = sorted(set(given) - set(self.attributes))
        if unknown:
            expected = ", ".join(sorted(self.attributes)) or "none"
            raise Reject(f"unknown attribute(s) {unknown}; expected: {expected}")
        if len(node.output) != self.num_outputs:
            raise Reject(f"expected {self.num_outputs} output(s), got {len(node.output)}")
        return {name: spec.parse(name, given.get(name)) for name, spec in self.attributes.items()}

    def check(self, node: MatchedNode, ctx: MatchContext) -> FactsT:
        """Decide whether ``node`` can be rewritten; return facts for ``build`` or raise Reject."""
        return None  # type: ignore[return-value]  # a pattern with no facts

    def build(self, b: Builder, node: MatchedNode, facts: FactsT) -> None:
        """Emit standard nodes through ``b``; the last ones must write ``node.outputs``."""
        raise NotImplementedError

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: FactsT
                     ) -> list[OutputType] | None:
        """Optional: (ONNX element type, shape) of each output, or None if unknown.

        Declaring them lets a custom node fed by this one (a chain of custom nodes, whose
        outputs ONNX shape inference cannot see through) be rewritten in the same pass.
        """
        return None

    def reference(self, *inputs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
        """numpy reference of the op's native form, for verification and tests."""
        raise NotImplementedError
