"""Reusing one replacement for identical custom nodes.

In: a custom node about to be rewritten, and the templates of the nodes already rewritten
in the same graph and pass. Out: either the replacement nodes, appended to the graph from
a template with the names the builder would have made, or None (build it, and keep it as
a template).

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
output is exactly what building would give. When no name under the new prefix is taken
yet (the usual case), that is the template's names with the prefix swapped, all taken in
one set operation, and the nodes are written as bytes: a %-format per template and byte
length of the prefix and role names, parsed into the graph in one call. Otherwise the
names are allocated one by one and the nodes copied one by one.

Constants the template emitted are already in the graph's constant pool, which an
identical build would also have reused. Weights a pattern repacked
(``MatchContext.weight``, ``Builder.weight``) are compared by digest and shared: the
replay reads the template's initializer, so equal weights are stored once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np
import onnx

from decomposer.builder import Builder, NameAllocator
from decomposer.pattern import MatchContext

MAX_VARIANTS = 8  # templates kept per key (nodes alike but for shapes or constants)
MAX_FORMATS = 64  # compiled formats kept per template (one per prefix / role name length)


class Recorder:
    """A :class:`MatchContext` that forwards to ``inner`` and logs each question by the
    role of the tensor asked about (input i, output j); a question about any other tensor
    makes the node unfit for a template."""

    def __init__(self, inner: MatchContext, node: onnx.NodeProto) -> None:
        self.opset = inner.opset
        self.target = inner.target
        self.avoid = inner.avoid
        self.engines = inner.engines
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
    """One non-constant node of a template, ready to copy: its op type, domain and
    attributes, and where its names come from in a replay's name list."""

    proto: onnx.NodeProto  # op type, domain (if set) and attributes; no names
    inputs: list[int]  # indices into the replay's names
    outputs: list[int]


@dataclass
class Template:
    """One built replacement: the nodes to copy, the questions its pattern asked, and what
    to record for its outputs.

    A replay's names are a list: the new node's own inputs and outputs (by role), then the
    tensors the steps write (made from ``tensor_bases``), then names taken as they are
    (pooled constants, weights). Steps refer to them by index."""

    node: onnx.NodeProto  # the custom node it replaced
    steps: list[_Step]
    log: list[tuple[str, tuple[str, int], Any]]
    declared: list[tuple[int | None, Any]]
    roles: list[tuple[str, int]]
    literals: list[str]
    node_bases: list[str]  # each step's name, relative to the prefix ("/Mul")
    tensor_bases: list[str]  # each new output's name, relative to the prefix
    # What the allocators make of those bases when no name under the new prefix is taken
    # yet ("/Mul", "/Mul_1"): a replay checks that once and takes them all.
    node_names: list[str]
    tensor_names: list[str]
    read_inputs: list[int]  # which of the replaced node's inputs the steps read
    domains: set[str]  # the steps' domains
    # The steps serialized, by the byte lengths of the prefix and the role names (see
    # _serialized): a replay is then one bytes format and one parse.
    formats: dict[tuple[int, ...], tuple[bytes, Callable[[tuple[bytes, ...]], Any]]] = \
        field(default_factory=dict)


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
    cut = len(prefix) - 1  # bases keep their leading "/"
    roles = _roles(node)
    slots: dict[str, int] = {}  # template name -> index in a replay's names
    role_list: list[tuple[str, int]] = []
    literals: list[str] = []
    node_bases: list[str] = []
    tensor_bases: list[str] = []
    written: list[tuple[onnx.NodeProto, list[tuple[str, str | None]]]] = []
    for proto, entry in zip(builder.nodes, builder.bases, strict=True):
        if entry is None:
            continue  # a constant: in the pool from now on
        node_base, out_bases = entry
        if not node_base.startswith(prefix) or any(
                field.name not in _PLAIN_FIELDS for field, _ in proto.ListFields()):
            return None
        outputs = list(zip(proto.output, out_bases, strict=True))
        for name, base in outputs:
            # a name the builder made, or one of the replaced node's own outputs
            if (base is None and name not in roles) or \
                    (base is not None and not base.startswith(prefix)):
                return None
        node_bases.append(node_base[cut:])
        written.append((proto, outputs))

    def slot_of_role(name: str) -> int:
        if name not in slots:
            slots[name] = len(role_list)
            role_list.append(roles[name])
        return slots[name]

    # Roles first, then new tensors, then literals: indices are fixed once all are known.
    new_index: dict[str, int] = {}
    for proto, outputs in written:
        for name in proto.input:
            if name in roles and name not in new_index:
                slot_of_role(name)
        for name, base in outputs:
            if base is None:
                slot_of_role(name)
            else:
                new_index[name] = len(tensor_bases)
                tensor_bases.append(base[cut:])
    literal_index: dict[str, int] = {}
    steps = []
    for proto, outputs in written:
        inputs = []
        for name in proto.input:
            if name in new_index:
                inputs.append(len(role_list) + new_index[name])
            elif name in roles:
                inputs.append(slots[name])
            else:
                if name not in literal_index:
                    literal_index[name] = len(literals)
                    literals.append(name)
                inputs.append(len(role_list) + len(tensor_bases) + literal_index[name])
        outs = [slots[name] if base is None else len(role_list) + new_index[name]
                for name, base in outputs]
        bare = onnx.NodeProto()
        bare.CopyFrom(proto)
        for name_field in ("name", "input", "output"):
            bare.ClearField(name_field)
        steps.append(_Step(bare, inputs, outs))
    node_alloc, tensor_alloc = NameAllocator(), NameAllocator()
    read_inputs = sorted({roles[name][1] for proto, _ in written for name in proto.input
                          if name in roles and roles[name][0] == "input"})
    return Template(node, steps, recorder.log, list(declared), role_list, literals,
                    node_bases, tensor_bases,
                    [node_alloc.fresh(base) for base in node_bases],
                    [tensor_alloc.fresh(base) for base in tensor_bases],
                    read_inputs, {proto.domain for proto, _ in written})


def outside_reads(found: Template, node: onnx.NodeProto) -> list[str]:
    """The names a replay of ``found`` for ``node`` reads from outside itself."""
    return [node.input[index] for index in found.read_inputs] + found.literals


def replay(found: Template, node: onnx.NodeProto, context: MatchContext, prefix: str,
           tensor_names: NameAllocator, node_names: NameAllocator,
           asked: dict[tuple[str, tuple[str, int]], Any], into: onnx.GraphProto
           ) -> int | None:
    """Append ``found``'s nodes renamed for ``node`` to ``into`` (a graph) and
    return how many, or return None (appending nothing) if a context answer differs.
    ``asked`` keeps ``node``'s answers across the templates tried for it (a weight is read
    and hashed once, not once per template)."""
    by_role = {role: name for name, role in _roles(node).items()}
    for query, role, answer in found.log:
        if (query, role) not in asked:
            now = getattr(context, query)(by_role[role])
            asked[query, role] = digest(now) if query == "weight" else now
        if not _same(asked[query, role], answer):
            return None
    step_names = [prefix + name for name in found.node_names]
    new_tensors = [prefix + name for name in found.tensor_names]
    if node_names.free(step_names) and tensor_names.free(new_tensors):
        node_names.take(step_names)
        tensor_names.take(new_tensors)
        # Every new name is the prefix and a fixed suffix: the steps' bytes depend only on
        # the prefix and the role names, so a compiled format writes them all at once,
        # which is much cheaper than copying and naming each node (docs/performance.md).
        args = (prefix.encode(), *(by_role[role].encode() for role in found.roles))
        shape = tuple(len(arg) for arg in args)
        compiled = found.formats.get(shape)
        if compiled is None:
            compiled = _serialized(found, shape)
            if len(found.formats) < MAX_FORMATS:
                found.formats[shape] = compiled
        layout, pick = compiled
        into.MergeFromString(layout % pick(args))
        return len(found.steps)
    # A name under this prefix is taken: allocate one by one, as a build would.
    step_names = [node_names.fresh(prefix + base) for base in found.node_bases]
    new_tensors = [tensor_names.fresh(prefix + base) for base in found.tensor_bases]
    names = [by_role[role] for role in found.roles] + new_tensors + found.literals
    for step, name in zip(found.steps, step_names, strict=True):
        new = into.node.add()
        new.CopyFrom(step.proto)
        new.name = name
        new.input.extend([names[index] for index in step.inputs])
        new.output.extend([names[index] for index in step.outputs])
    return len(found.steps)


# NodeProto's name fields (input = 1, output = 2, name = 3) and GraphProto.node (1), as
# protobuf tags of length-delimited fields.
_INPUT_TAG, _OUTPUT_TAG, _NAME_TAG, _NODE_TAG = b"\x0a", b"\x12", b"\x1a", b"\x0a"


def _serialized(found: Template, shape: tuple[int, ...]
                ) -> tuple[bytes, Callable[[tuple[bytes, ...]], Any]]:
    """A bytes %-format of the steps as GraphProto ``node`` entries, and the function that
    picks its arguments from ``(prefix, *role names)`` (UTF-8), for arguments of the byte
    lengths ``shape``. New names are written as ``%b`` (the prefix) then their suffix;
    literal names and each step's op type, domain and attributes are in the format."""
    prefix_length, role_lengths = shape[0], shape[1:]
    first_tensor, first_literal = len(found.roles), len(found.roles) + len(found.tensor_names)
    tensor_suffixes = [name.encode() for name in found.tensor_names]
    node_suffixes = [name.encode() for name in found.node_names]
    layout: list[bytes] = []
    order: list[int] = []  # argument index of each %b
    for step, suffix in zip(found.steps, node_suffixes, strict=True):
        fields: list[tuple[bytes, int, bytes]] = []  # (tag, argument or -1, constant bytes)
        for tag, indices in ((_INPUT_TAG, step.inputs), (_OUTPUT_TAG, step.outputs)):
            for index in indices:
                if index < first_tensor:
                    fields.append((tag, 1 + index, b""))
                elif index < first_literal:
                    fields.append((tag, 0, tensor_suffixes[index - first_tensor]))
                else:
                    fields.append((tag, -1, found.literals[index - first_literal].encode()))
        fields.append((_NAME_TAG, 0, suffix))
        tail = step.proto.SerializeToString(deterministic=True)
        pieces: list[bytes] = []
        body_length = len(tail)
        for tag, argument, constant in fields:
            if argument < 0:  # a literal name
                length = len(constant)
            elif argument == 0:  # the prefix, then a suffix
                length = prefix_length + len(constant)
            else:  # a role name
                length = role_lengths[argument - 1]
            header = tag + _varint(length)
            body_length += len(header) + length
            if argument >= 0:
                pieces.append(_escaped(header) + b"%b" + _escaped(constant))
                order.append(argument)
            else:
                pieces.append(_escaped(header + constant))
        layout.append(_escaped(_NODE_TAG + _varint(body_length)))
        layout.extend(pieces)
        layout.append(_escaped(tail))
    if len(order) == 1:
        only = order[0]
        return b"".join(layout), lambda args: (args[only],)
    return b"".join(layout), itemgetter(*order)


def _escaped(constant: bytes) -> bytes:
    """``constant`` as it is written in a bytes %-format (a length byte may be 0x25, "%")."""
    return constant.replace(b"%", b"%%")


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


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
