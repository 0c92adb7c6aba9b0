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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

import numpy as np
import onnx

from decomposer.builder import Builder
from decomposer.examples import Example
from decomposer.forms import ATEN_DOMAIN, Attr, Const, Form, In, Reject, aten_operator

__all__ = ["ATEN_DOMAIN", "Attr", "Const", "Form", "In", "MatchContext", "MatchedNode",
           "OutputType", "Pattern", "Reject"]

# (ONNX element type or None, static shape or None) of one output; dims are ints, symbolic
# names, or None for unknown.
OutputType = tuple[int | None, Sequence[int | str | None] | None]


class MatchContext(Protocol):
    """What a pattern may ask the engine about the graph around a node.

    ``opset`` is the model's default-domain opset (the replacement's); ``target`` is
    ``"portable"``, ``"ort"`` or ``"qdq"`` (see :mod:`decomposer.builder`). ``avoid``: the
    standard op types the output should not hold (``--lower``'s, and those the target's
    engines lack outright at this opset), so a pattern that could write one writes another
    form instead; ``engines``: the engines ``--target`` names (empty for a mode).
    """

    opset: int
    target: str
    avoid: frozenset[str]
    engines: tuple[str, ...]

    def constant(self, name: str) -> np.ndarray | None:
        """The value of tensor ``name`` if it is an initializer or Constant output, or an
        Identity or a uint8/int8 QuantizeLinear of such constants (computed as ONNX
        Runtime's kernel does)."""

    def weight(self, name: str) -> np.ndarray | None:
        """Like :meth:`constant`, but also reads an initializer stored in the model's external
        data file (when the model came from a file): for a pattern that rewrites weights
        themselves (a repacking), not for one that merely inspects small constants."""

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
    """A node as a pattern sees it: inputs, outputs, its spelling and normalized arguments.

    ``form`` is ``"native"`` for ``Domain::OpType`` nodes and ``"aten"`` for torch's
    ``org.pytorch.aten`` fallbacks; ``spelling`` is the :class:`Form` that matched.
    ``attrs`` holds the parsed attributes (by argument name); for a pattern with declared
    ``forms``, ``args`` holds every normalized argument (attributes and constant inputs)
    and ``tensors`` the tensor inputs by argument name (``""``: an absent optional input).
    """

    proto: onnx.NodeProto
    form: str
    attrs: dict[str, Any] = field(default_factory=dict)
    spelling: Form | None = None
    tensors: dict[str, str] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.proto.name

    @property
    def inputs(self) -> list[str]:
        return list(self.proto.input)

    @property
    def outputs(self) -> list[str]:
        return list(self.proto.output)

    def tensor(self, name: str) -> str:
        """The tensor feeding argument ``name`` (``""`` if the optional input is absent)."""
        return self.tensors.get(name, "")


FactsT = TypeVar("FactsT")

# Legacy ATen forms take their arguments unchecked (the pattern reads the inputs itself).
_UNCHECKED_OUTPUTS = (0, 1 << 16)


class Pattern(Generic[FactsT]):
    """Base class of every decomposition. Subclasses set the class attributes and methods.

    ``Pattern[Facts]`` types what ``check`` returns and ``build`` receives (a NamedTuple or
    dataclass of everything ``build`` needs); a plain ``Pattern`` subclass means ``Any``.

    - ``op_type``: the op's name (reports, the test kit's single-node models).
    - ``forms``: the spellings the pattern answers to (:class:`Form`); the mechanism parses
      each into one normalized call (``node.tensors``, ``node.args``) for ``check`` and
      ``build``, and into arrays plus the same ``args`` for ``compute``.
    - ``examples``: small valid uses (:class:`decomposer.examples.Example`) that together
      write every spelling; the fuzz harness is seeded from them and a test checks each
      decomposes cleanly.

    Older patterns may instead declare one native spelling and one ATen name (below) and
    parse arguments themselves in ``check`` and ``reference``:

    - ``domains``: accepted domains; ``None`` means any domain, including the default
      domain when the op is not standard at the model's opset.
    - ``aten_operator``: torch's ATen name, so ``org.pytorch.aten::<name>`` and
      ``ATen(operator=<name>)`` match too; ``None`` for none.
    - ``attributes``: the attribute schema of the native form.
    - ``num_outputs``: how many outputs the node must have.

    The contract every pattern keeps: ``check``, ``build`` and ``output_types`` depend on
    the node only through its attributes and the answers of the :class:`MatchContext`
    about its own inputs and outputs (never on names, never on other graph state). The
    engine relies on it to build identical nodes once (:mod:`decomposer.memo`); a question
    about another tensor is allowed but makes the node build anew every time.
    """

    op_type: ClassVar[str]
    forms: ClassVar[Sequence[Form]] = ()
    examples: ClassVar[Sequence[Example]] = ()
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

    @property
    def declarative(self) -> bool:
        """Whether the pattern declares ``forms`` (the mechanism binds its arguments)."""
        return bool(self.forms)

    def spellings(self) -> list[Form]:
        """The forms this pattern answers to (declared, or derived from the older class
        attributes)."""
        if self.forms:
            return list(self.forms)
        spellings = []
        if self.domains is None or self.domains:
            spellings.append(Form(self.op_type, domains=self.domains,
                                  attributes=self.attributes, outputs=self.num_outputs))
        if self.aten_operator:
            spellings.append(Form(aten=self.aten_operator, outputs=_UNCHECKED_OUTPUTS))
        return spellings

    def spelling(self, name: str) -> Form:
        """The spelling with op_type or ATen name ``name`` (KeyError if none)."""
        for form in self.spellings():
            if name in form.op_types or form.aten == name:
                return form
        raise KeyError(f"pattern {self.name} has no spelling {name!r}")

    def native_form(self) -> Form:
        """The first spelling with op_types (what the test kit builds nodes of)."""
        return next(f for f in self.spellings() if f.op_types)

    def keys(self) -> list[tuple[str | None, str]]:
        """(domain or None for any, op_type) keys this pattern answers to in the registry."""
        return [key for form in self.spellings() for key in form.keys()]

    def match_attributes(self, node: onnx.NodeProto, form: Form) -> dict[str, Any]:
        """Parse the node's attributes (and output and input counts) against ``form``;
        raises Reject on any mismatch."""
        aten_node = form.aten is not None and aten_operator(node) == form.aten
        if aten_node and not self.forms:
            return {}  # a legacy ATen form: the pattern reads its inputs itself
        return form.parse_attributes(node, aten_node)

    def match(self, node: onnx.NodeProto, form: Form) -> MatchedNode:
        """``node`` as ``check`` sees it, before :meth:`bind`; raises Reject."""
        attrs = self.match_attributes(node, form)
        kind = "aten" if form.aten and aten_operator(node) == form.aten else form.kind
        return MatchedNode(node, kind, attrs, spelling=form)

    def bind(self, node: MatchedNode, ctx: MatchContext) -> None:
        """Fill ``node.tensors`` and ``node.args`` from its spelling; raises Reject."""
        if node.spelling is None or not self.forms:
            node.args = dict(node.attrs)
            return
        node.tensors, node.args = node.spelling.bind(node.inputs, node.attrs, ctx.constant)

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

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        """numpy reference on the normalized call (patterns with ``forms``): the tensor
        inputs by argument name (None: absent) and ``args`` as ``check`` sees them."""
        raise NotImplementedError(
            f"pattern {self.name} has no numpy reference: define compute(self, args, "
            f"**tensors) returning the list of output arrays (docs/writing-a-pattern.md)")

    def evaluate(self, form: Form, inputs: Sequence[np.ndarray | None],
                 attrs: Mapping[str, Any]) -> list[np.ndarray]:
        """The reference outputs of a node of spelling ``form`` with these input arrays and
        its parsed attributes (what :meth:`match_attributes` returned)."""
        if not self.forms:
            return self.reference(*inputs, **attrs)  # type: ignore[arg-type]
        tensors, args = form.bind_values(inputs, attrs)
        return self.compute(args, **tensors)

    def reference(self, *inputs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
        """numpy reference of the op's first native spelling (inputs in order, attributes
        by name); patterns with ``forms`` get it from ``compute``."""
        if not self.forms:
            raise NotImplementedError(
                f"pattern {self.name} has no numpy reference: define reference(self, "
                f"*inputs, **attrs) returning the list of output arrays "
                f"(docs/writing-a-pattern.md)")
        form = self.native_form()
        return self.evaluate(form, inputs, form.coerce_attributes(attrs))
