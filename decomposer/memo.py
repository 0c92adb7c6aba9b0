"""Reusing one replacement for identical custom nodes.

In: a custom node about to be rewritten, and the templates of the nodes already rewritten
in the same graph and pass. Out: either the replacement nodes, copied from a template
with the names the builder would have made, or None (build it, and keep it as a template).

Models repeat their blocks, so the same custom node (same op, attributes, input types and
shapes, constant inputs) is decomposed hundreds of times; copying a built replacement
costs a fraction of building it again (docs/performance.md, Tool cost). Two nodes share a
template when they have the same pattern, form, op type, domain, attributes and
input/output layout, and every question the pattern asked the graph about the first one
(:class:`Recorder` logs them: constant values, shapes, element types, whether a tensor is
a model input/output) has the same answer for the second. That holds because a pattern
sees a node only through its attributes and that context (the contract in
:mod:`decomposer.pattern`); ``tests/test_memo.py`` checks every pattern's examples give
byte-identical models with and without templates.

Names are replayed: every name the template's builder made from ``<prefix>/<hint>`` is
made again from ``<new prefix>/<hint>`` by the same allocators in the same order, so the
output is exactly what building would give. Constants the template emitted are already in
the graph's constant pool, which an identical build would also have reused. Weights a
pattern repacked (``MatchContext.weight``, ``Builder.weight``) are compared by digest and
shared: the replay reads the template's initializer, so equal weights are stored once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from decomposer.builder import Builder, NameAllocator
from decomposer.pattern import MatchContext

MAX_VARIANTS = 8  # templates kept per key (nodes alike but for shapes or constants)


class Recorder:
    """A :class:`MatchContext` that forwards to ``inner`` and logs each question by the
    role of the tensor asked about (input i, output j); a question about any other tensor
    makes the node unfit for a template."""

    def __init__(self, inner: MatchContext, node: onnx.NodeProto) -> None:
        self.opset = inner.opset
        self.target = inner.target
        self._inner = inner
        self._roles = _roles(node)
        self.log: list[tuple[str, tuple[str, int], Any]] = []
        self.reusable = True

    def _ask(self, query: str, name: str) -> Any:
        answer = getattr(self._inner, query)(name)
        self._log_as(query, name, answer)
        return answer

    def _log_as(self, query: str, name: str, logged: Any) -> None:
        role = self._roles.get(name)
        if role is None:
            self.reusable = False
        else:
            self.log.append((query, role, logged))

    def constant(self, name: str) -> np.ndarray | None:
        answer: np.ndarray | None = self._ask("constant", name)
        return answer

    def weight(self, name: str) -> np.ndarray | None:
        answer: np.ndarray | None = self._inner.weight(name)
        self._log_as("weight", name, digest(answer))  # a template keeps no weights
        return answer

    def shape(self, name: str) -> tuple[int | str | None, ...] | None:
        answer: tuple[int | str | None, ...] | None = self._ask("shape", name)
        return answer

    def elem_type(self, name: str) -> int | None:
        answer: int | None = self._ask("elem_type", name)
        return answer

    def is_model_input(self, name: str) -> bool:
        return bool(self._ask("is_model_input", name))

    def is_model_output(self, name: str) -> bool:
        return bool(self._ask("is_model_output", name))


@dataclass
class _Step:
    """One non-constant node of a template, ready to copy: names by role or base."""

    op_type: str
    domain: str | None  # None: not set (proto2 tells an unset field from "")
    attributes: list[onnx.AttributeProto]
    inputs: list[str]  # the template's names
    node_base: str  # without the template's prefix
    outputs: list[tuple[str, str | None]]  # (template name, base without prefix or None)


@dataclass
class Template:
    """One built replacement: the nodes to copy, the questions its pattern asked, and what
    to record for its outputs."""

    node: onnx.NodeProto  # the custom node it replaced
    steps: list[_Step]
    log: list[tuple[str, tuple[str, int], Any]]
    declared: list[tuple[int | None, Any]]


_PLAIN_FIELDS = {"op_type", "domain", "name", "input", "output", "attribute"}


def key(pattern: object, form: object, node: onnx.NodeProto) -> tuple[Any, ...]:
    """What two nodes must share before their context answers are compared."""
    first: dict[str, int] = {}
    layout = tuple(first.setdefault(name, index) if name else -1
                   for index, name in enumerate(node.input))
    return (id(pattern), id(form), node.op_type, node.domain, layout,
            tuple(bool(name) for name in node.output),
            tuple(attribute.SerializeToString() for attribute in node.attribute))


def template(node: onnx.NodeProto, builder: Builder, recorder: Recorder,
             declared: Sequence[tuple[int | None, Any]]) -> Template | None:
    """The template of a finished build, or None when it cannot be replayed."""
    if not recorder.reusable or any(
            attribute.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
            for new in builder.nodes for attribute in new.attribute):
        return None
    prefix = f"{builder.prefix}/"
    cut = len(prefix)
    roles = _roles(node)
    steps = []
    for proto, entry in zip(builder.nodes, builder.bases, strict=True):
        if entry is None:
            continue  # a constant: in the pool from now on
        node_base, out_bases = entry
        if not node_base.startswith(prefix) or any(
                field.name not in _PLAIN_FIELDS for field, _ in proto.ListFields()):
            return None
        outputs: list[tuple[str, str | None]] = []
        for name, base in zip(proto.output, out_bases, strict=True):
            # a name the builder made, or one of the replaced node's own outputs
            if base is None and name not in roles:
                return None
            if base is not None and not base.startswith(prefix):
                return None
            outputs.append((name, None if base is None else base[cut:]))
        steps.append(_Step(proto.op_type, proto.domain if proto.HasField("domain") else None,
                           list(proto.attribute),
                           list(proto.input), node_base[cut:], outputs))
    return Template(node, steps, recorder.log, list(declared))


def replay(found: Template, node: onnx.NodeProto, context: MatchContext, prefix: str,
           tensor_names: NameAllocator, node_names: NameAllocator,
           asked: dict[tuple[str, tuple[str, int]], Any]) -> list[onnx.NodeProto] | None:
    """``found``'s nodes renamed for ``node``, or None if a context answer differs.
    ``asked`` keeps ``node``'s answers across the templates tried for it (a weight is read
    and hashed once, not once per template)."""
    roles = {role: name for name, role in _roles(node).items()}
    for query, role, answer in found.log:
        if (query, role) not in asked:
            now = getattr(context, query)(roles[role])
            asked[query, role] = digest(now) if query == "weight" else now
        if not _same(asked[query, role], answer):
            return None
    renamed = {name: roles[role] for name, role in _roles(found.node).items()}
    nodes = []
    for step in found.steps:
        name = node_names.fresh(f"{prefix}/{step.node_base}")
        outputs = []
        for old, base in step.outputs:
            if base is not None:
                renamed[old] = tensor_names.fresh(f"{prefix}/{base}")
            outputs.append(renamed[old])
        new = onnx.NodeProto(op_type=step.op_type, name=name, output=outputs,
                             input=[renamed.get(old, old) for old in step.inputs],
                             attribute=step.attributes)
        if step.domain is not None:
            new.domain = step.domain
        nodes.append(new)
    return nodes


def digest(array: np.ndarray | None) -> tuple[str, tuple[int, ...], bytes] | None:
    """What a template logs for a weight: its type, shape and SHA-256, not the bytes (a
    model's weights would otherwise stay in memory with its templates)."""
    if array is None:
        return None
    return (array.dtype.str, array.shape,
            hashlib.sha256(np.ascontiguousarray(array).tobytes()).digest())


def _roles(node: onnx.NodeProto) -> dict[str, tuple[str, int]]:
    roles: dict[str, tuple[str, int]] = {}
    for index, name in enumerate(node.output):
        if name:
            roles.setdefault(name, ("output", index))
    for index, name in enumerate(node.input):
        if name:
            roles.setdefault(name, ("input", index))
    roles[""] = ("absent", 0)
    return roles


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
                and a.dtype == b.dtype and a.shape == b.shape):
            return False
        if a.dtype == object:  # strings: tobytes() would compare pointers
            return bool(a.tolist() == b.tolist())
        return a.tobytes() == b.tobytes()  # bit for bit: NaN payloads and -0.0 count
    return type(a) is type(b) and bool(a == b)
