"""The take-down's machinery: the walk over graphs and functions, one node's steps down its
op's versions, the signature fitting and the type carriers (:mod:`decomposer.opsets`).

In: a model, the source and target opsets. Out: the model at the target, and the
:class:`Refusal` s; the per-version adapters live in :mod:`.adapters`, the function-body
expansion and folding of ops the target lacks in :mod:`.bodies`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, defs, helper, numpy_helper

from decomposer.graphs import all_graphs, norm_domain, subgraphs

NEWEST_OPSET = defs.onnx_opset_version()
# Where a standard node goes that the target's op cannot say but a pattern lowers (GridSample
# on 5-D input at 16-19): no engine reads this domain, so its nodes must all be rewritten.
LOWERING_DOMAIN = "ai.decomposer.lowering"


@dataclass(frozen=True)
class Refusal:
    """A standard node that opset ``target`` cannot say, why, and the lowest opset that can
    (None when no older opset can: then only a newer target keeps it)."""

    name: str
    op_type: str
    graph: str
    reason: str
    lowest: int | None

    def describe(self, target: int) -> str:
        fix = f"; the lowest target that keeps it is {self.lowest}" if self.lowest else ""
        return f"opset {target} cannot say it: {self.reason}{fix}"


class CannotSay(Exception):
    """Raised by an adapter: the node's meaning has no spelling below ``since``."""

    def __init__(self, reason: str, since: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.since = since


def default_opset(model: onnx.ModelProto) -> int | None:
    for entry in model.opset_import:
        if norm_domain(entry.domain) == "":
            return int(entry.version)
    return None


def ir_version_for(opset: int) -> int:
    """The IR version that the runtimes of default-domain ``opset`` read: the one the ONNX
    release that introduced ``opset`` wrote (older runtimes refuse a newer IR)."""
    for _release, ir_version, ai_onnx, *_ in helper.VERSION_TABLE:
        if ai_onnx >= opset:
            return int(ir_version)
    return int(onnx.IR_VERSION)


# -- type facts --------------------------------------------------------------------------

# Wider types that hold every value of a narrower one, in the order they are tried. Only
# integer carriers for integers first: integer arithmetic wraps, and a wrapped int32 cast
# back to int8 wraps the same way; a float carrier would not.
_CARRIERS: dict[int, tuple[int, ...]] = {
    TensorProto.BFLOAT16: (TensorProto.FLOAT, TensorProto.DOUBLE),
    TensorProto.FLOAT16: (TensorProto.FLOAT, TensorProto.DOUBLE),
    TensorProto.INT8: (TensorProto.INT32, TensorProto.INT64, TensorProto.FLOAT,
                       TensorProto.DOUBLE),
    TensorProto.UINT8: (TensorProto.INT32, TensorProto.INT64, TensorProto.FLOAT,
                        TensorProto.DOUBLE),
    TensorProto.INT16: (TensorProto.INT32, TensorProto.INT64, TensorProto.FLOAT,
                        TensorProto.DOUBLE),
    TensorProto.UINT16: (TensorProto.INT32, TensorProto.INT64, TensorProto.FLOAT,
                         TensorProto.DOUBLE),
    TensorProto.INT32: (TensorProto.INT64, TensorProto.DOUBLE),
    TensorProto.UINT32: (TensorProto.INT64, TensorProto.DOUBLE),
    TensorProto.BOOL: (TensorProto.INT32, TensorProto.UINT8, TensorProto.FLOAT),
}
# Ops that create or reinterpret a type: computing them in another type changes them.
_NO_CARRIER = frozenset({"Cast", "CastLike", "Constant", "ConstantOfShape", "EyeLike",
                         "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial",
                         "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
                         "BitShift", "BitwiseNot", "Mod"})
# What a Shape/Range chain is made of, for folding when the sizes are static.
_FOLDABLE = frozenset({"Shape", "Size", "Gather", "Concat", "Unsqueeze", "Squeeze", "Slice",
                       "Range", "Cast", "Add", "Sub", "Mul", "Div", "Neg", "Abs", "Identity",
                       "Reshape", "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin",
                       "Equal", "Less", "Greater", "Where", "Not", "And", "Or", "Max", "Min",
                       "Mod", "Sign", "Floor", "Ceil", "ConstantOfShape", "Expand", "Tile",
                       "Constant", "Flatten", "CastLike"})
_FOLD_LIMIT = 4096  # elements: folding is for shapes and axes, not for data
# Ops whose result on a bool tensor is not the cast of the result on its 0/1 values.
_NO_BOOL_CARRIER = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Sum", "Mean", "CumSum",
                              "ReduceSum", "ReduceMean", "ReduceProd"})


def _type_name(elem_type: int) -> str:
    return str(helper.tensor_dtype_to_string(elem_type)).removeprefix("TensorProto.").lower()


def _type_str(elem_type: int) -> str:
    name = {"float": "float", "double": "double", "bfloat16": "bfloat16"}.get(
        _type_name(elem_type), _type_name(elem_type))
    return f"tensor({name})"


# -- the walk ----------------------------------------------------------------------------


@dataclass
class _Facts:
    """Element types, shapes and constant values of one name space, from ONNX shape
    inference on the model as it was (at its own opset)."""

    types: dict[str, int] = field(default_factory=dict)
    shapes: dict[str, tuple[int | str | None, ...]] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    producers: dict[str, onnx.NodeProto] = field(default_factory=dict)
    producer_opsets: dict[str, int] = field(default_factory=dict)  # what each is written at
    written: set[str] = field(default_factory=set)  # names of nodes written at the target
    opset: int = 0  # the default for producers not in producer_opsets
    _folding: set[str] = field(default_factory=set)

    def constant(self, name: str) -> np.ndarray | None:
        """The value of ``name`` if it is a constant, or computed only from constants and
        static shapes (a Shape/Range chain): folded here with ONNX's reference evaluator."""
        if not name:
            return None
        if name in self.constants:
            return self.constants[name]
        node = self.producers.get(name)
        if node is None or name in self._folding or norm_domain(node.domain) != "" or \
                node.op_type not in _FOLDABLE:
            return None
        self._folding.add(name)
        try:
            value = self._fold(node, name)
        finally:
            self._folding.discard(name)
        if value is not None:
            self.constants[name] = value
        return value

    def _fold(self, node: onnx.NodeProto, name: str) -> np.ndarray | None:
        if node.op_type == "Shape":
            shape = self.shapes.get(node.input[0])
            if shape is None or not all(isinstance(d, int) for d in shape):
                return None
            full = np.array(shape, dtype=np.int64)
            start = next((a.i for a in node.attribute if a.name == "start"), 0)
            end = next((a.i for a in node.attribute if a.name == "end"), None)
            return full[start:end]
        if node.op_type == "Size":
            shape = self.shapes.get(node.input[0])
            if shape is None or not all(isinstance(d, int) for d in shape):
                return None
            return np.array(int(np.prod([int(d) for d in shape if d is not None])),
                            dtype=np.int64)
        values = []
        for input_name in node.input:
            value = self.constant(input_name) if input_name else None
            if input_name and value is None:
                return None
            values.append(value)
        if sum(v.size for v in values if v is not None) > _FOLD_LIMIT:
            return None
        outputs = evaluate_node(node, values, self.producer_opsets.get(name, self.opset) or 11)
        if outputs is None:
            return None
        result = outputs[list(node.output).index(name)]
        return result if result.size <= _FOLD_LIMIT else None

    def learn(self, graph: onnx.GraphProto) -> None:
        for value in [*graph.input, *graph.value_info, *graph.output]:
            tensor = value.type.tensor_type
            if value.type.HasField("tensor_type") and tensor.elem_type:
                self.types[value.name] = tensor.elem_type
                if tensor.HasField("shape"):
                    self.shapes[value.name] = tuple(
                        d.dim_value if d.HasField("dim_value") else
                        (d.dim_param or None) for d in tensor.shape.dim)
        fed = {value.name for value in graph.input}  # an initializer a caller may override
        for tensor in graph.initializer:
            self.types[tensor.name] = tensor.data_type
            self.shapes[tensor.name] = tuple(tensor.dims)
            if tensor.data_location != TensorProto.EXTERNAL and tensor.name not in fed:
                self.constants[tensor.name] = numpy_helper.to_array(tensor)
        for node in graph.node:
            if node.op_type == "Constant" and norm_domain(node.domain) == "":
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    self.constants[node.output[0]] = numpy_helper.to_array(value)
                    self.types[node.output[0]] = value.data_type
                    self.shapes[node.output[0]] = tuple(value.dims)


def evaluate_node(node: onnx.NodeProto, values: list[np.ndarray | None], opset: int
                  ) -> list[np.ndarray] | None:
    """The outputs of ``node`` (every output named) on constant input ``values`` (None for
    an absent input), by ONNX's reference evaluator at ``opset``; None if it cannot."""
    from onnx.reference import ReferenceEvaluator

    single = onnx.NodeProto()
    single.CopyFrom(node)
    single.input[:] = [f"in{i}" if n else "" for i, n in enumerate(node.input)]
    single.output[:] = [f"out{i}" for i in range(len(node.output))]
    inits = [numpy_helper.from_array(np.asarray(v), f"in{i}") for i, v in enumerate(values)
             if v is not None]
    model = helper.make_model(helper.make_graph(
        [single], "fold", [], [onnx.ValueInfoProto(name=o) for o in single.output], inits),
        opset_imports=[helper.make_opsetid("", opset)])
    try:
        return [np.asarray(v) for v in ReferenceEvaluator(model).run(None, {})]
    except Exception:  # noqa: BLE001 - then the caller keeps the node
        return None


class Site:
    """One node being taken down, with what an adapter may ask and write around it."""

    def __init__(self, node: onnx.NodeProto, facts: _Facts, fresh: Callable[[str], str],
                 target: int, has_pattern: Callable[[str], bool] | None = None) -> None:
        self.node = node
        self.facts = facts
        self.fresh = fresh
        self.target = target
        self.has_pattern = has_pattern  # None where a node cannot be marked (a function)
        self.before: list[onnx.NodeProto] = []
        self.after: list[onnx.NodeProto] = []
        self.replacement: list[onnx.NodeProto] | None = None  # the node becomes these

    # what an adapter reads
    @property
    def label(self) -> str:
        return self.node.name or (self.node.output[0] if self.node.output else self.node.op_type)

    def attr(self, name: str, default: Any = None) -> Any:
        for attribute in self.node.attribute:
            if attribute.name == name:
                return helper.get_attribute_value(attribute)
        return default

    def input(self, index: int) -> str:
        return self.node.input[index] if index < len(self.node.input) else ""

    def constant(self, name: str) -> np.ndarray | None:
        return self.facts.constant(name)

    def rank(self, name: str) -> int | None:
        shape = self.facts.shapes.get(name)
        return None if shape is None else len(shape)

    def shape(self, name: str) -> tuple[int | str | None, ...] | None:
        return self.facts.shapes.get(name)

    def elem_type(self, name: str) -> int | None:
        return self.facts.types.get(name)

    def lower_by_pattern(self, reason: str, since: int) -> None:
        """The target has the op but not this form of it: the node is handed to the op's
        lowering pattern (moved to :data:`LOWERING_DOMAIN`, which the engine rewrites like
        any other non-standard node), or refused with ``reason`` if no pattern lowers it."""
        if self.has_pattern is None or not self.has_pattern(self.node.op_type):
            raise CannotSay(reason, since)
        self.node.domain = LOWERING_DOMAIN
        self.replacement = [self.node]

    # what an adapter writes
    def set_attr(self, name: str, value: Any) -> None:
        self.drop_attr(name)
        self.node.attribute.append(helper.make_attribute(name, value))

    def drop_attr(self, *names: str) -> None:
        kept = [a for a in self.node.attribute if a.name not in names]
        del self.node.attribute[:]
        self.node.attribute.extend(kept)

    def const(self, hint: str, value: np.ndarray) -> str:
        name = self.fresh(f"{self.label}/{hint}")
        self.before.append(helper.make_node("Constant", [], [name], name=name,
                                            value=numpy_helper.from_array(
                                                np.asarray(value), name)))
        return name

    def add(self, where: list[onnx.NodeProto], op_type: str, inputs: list[str],
            hint: str, **attrs: Any) -> str:
        name = self.fresh(f"{self.label}/{hint}")
        where.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def cast_after(self, index: int, to: int, hint: str = "cast") -> None:
        """Output ``index`` is computed in another type: the node writes a fresh name and
        a Cast to ``to`` writes the original one."""
        original = self.node.output[index]
        inner = self.fresh(f"{self.label}/{hint}{index}")
        self.node.output[index] = inner
        self.after.append(helper.make_node("Cast", [inner], [original],
                                           name=self.fresh(f"{self.label}/{hint}_back{index}"),
                                           to=to))


Adapter = Callable[[Site], None]


def take_down(model: onnx.ModelProto, target: int,
              has_pattern: Callable[[str], bool] = lambda op_type: False,
              source_types: dict[str, onnx.TypeProto] | None = None) -> list[Refusal]:
    """Rewrite ``model`` in place for default-domain opset ``target`` (see the module
    docstring). Returns what could not go down; ``model`` is at ``target`` either way.

    ``has_pattern(op_type)`` says whether a registered pattern lowers a default-domain op;
    an op the target lacks that no pattern lowers is replaced by ONNX's own function body
    for it, where its schema has one, and the body taken down in turn. ``source_types``,
    if given, receives the tensor types that shape inference found at the model's own
    opset (the target's inference can know less: a Reshape to a Shape before 13)."""
    source = default_opset(model)
    if source is None or target >= source:
        return []
    refusals: list[Refusal] = []
    taken = _names(model)

    def fresh(base: str) -> str:
        name, counter = base, 0
        while name in taken:
            counter += 1
            name = f"{base}_{counter}"
        taken.add(name)
        return name

    if model.functions and ir_version_for(target) < 8:
        # IR 7 and older (opsets 12-14) have no model-local functions.
        from onnx import inliner

        inlined = inliner.inline_local_functions(model)
        model.CopyFrom(inlined)
    facts = _infer(model)
    facts.opset = source
    if source_types is not None:
        for name, elem in facts.types.items():
            shape = facts.shapes.get(name)
            source_types[name] = helper.make_tensor_type_proto(
                elem, None if shape is None else list(shape))
    read_before = _reads(model)
    for graph, label in _graphs(model.graph, "main graph", facts.written):
        _take_down_nodes(graph.node, source, target, facts, fresh, label, refusals,
                         has_pattern)
    for function in model.functions:
        version = next((int(i.version) for i in function.opset_import
                        if norm_domain(i.domain) == ""), None)
        if version is None or version <= target:
            continue
        function_facts = _Facts(opset=version)
        shell = onnx.GraphProto()
        shell.node.extend(function.node)
        function_facts.learn(shell)
        for graph, label in _graphs(shell, f"function {function.domain}::{function.name}",
                                    function_facts.written):
            _take_down_nodes(graph.node, version, target, function_facts, fresh, label,
                             refusals, has_pattern)
        read = {name for node in shell.node for name in node.input} | set(function.output)
        kept = [node for node in shell.node if not (
            node.op_type == "Constant" and node.output[0] not in read)]
        del function.node[:]
        function.node.extend(kept)
        for entry in function.opset_import:
            if norm_domain(entry.domain) == "":
                entry.version = target
    for entry in model.opset_import:
        if norm_domain(entry.domain) == "":
            entry.version = target
    model.ir_version = min(model.ir_version, ir_version_for(target))
    if any(node.domain == LOWERING_DOMAIN for graph in all_graphs(model.graph)
           for node in graph.node) and \
            not any(entry.domain == LOWERING_DOMAIN for entry in model.opset_import):
        model.opset_import.append(helper.make_opsetid(LOWERING_DOMAIN, 1))
    unread = read_before - _reads(model)
    _drop_initializers(model, unread)
    _drop_detached(model, unread)
    return refusals


def _reads(model: onnx.ModelProto) -> set[str]:
    names = {name for graph in all_graphs(model.graph) for node in graph.node
             for name in node.input}
    names.update(output.name for graph in all_graphs(model.graph) for output in graph.output)
    return names


def _drop_detached(model: onnx.ModelProto, unread: set[str]) -> None:
    """Initializers, Constants and the Shape/Range chains (folded) that only fed an input
    now turned into an attribute (axes, split, pads): nothing reads them any more.
    ``unread``: names read before the take-down and not after."""
    while unread:
        freed: set[str] = set()
        for graph in all_graphs(model.graph):
            kept = []
            for node in graph.node:
                outputs = [o for o in node.output if o]
                if outputs and norm_domain(node.domain) == "" and \
                        node.op_type in _FOLDABLE and all(o in unread for o in outputs):
                    freed.update(name for name in node.input if name)
                else:
                    kept.append(node)
            if len(kept) != len(graph.node):
                del graph.node[:]
                graph.node.extend(kept)
        if not freed:
            break
        now = _reads(model)
        unread = {name for name in freed if name not in now}
        _drop_initializers(model, unread)


def _drop_initializers(model: onnx.ModelProto, unread: set[str]) -> None:
    for graph in all_graphs(model.graph):
        if any(t.name in unread for t in graph.initializer):
            kept_tensors = [t for t in graph.initializer if t.name not in unread]
            del graph.initializer[:]
            graph.initializer.extend(kept_tensors)


def _graphs(graph: onnx.GraphProto, label: str, skip: set[str] | None = None
            ) -> Iterator[tuple[onnx.GraphProto, str]]:
    """``graph`` and every graph nested in it, walked after the caller rewrote each one;
    the graphs of nodes named in ``skip`` (written at the target already) are left out."""
    yield graph, label
    for node in graph.node:
        if skip is not None and node.name in skip:
            continue
        for attr_label, sub in subgraphs(node):
            yield from _graphs(sub, f"{label} > {node.op_type} '{node.name}' {attr_label}",
                               skip)


def _names(model: onnx.ModelProto) -> set[str]:
    names: set[str] = set()
    for graph in all_graphs(model.graph):
        names.update(value.name for value in [*graph.input, *graph.output, *graph.value_info])
        names.update(t.name for t in graph.initializer)
        for node in graph.node:
            names.update(node.input)
            names.update(node.output)
            names.add(node.name)
    for function in model.functions:
        names.update(function.input)
        names.update(function.output)
        for node in function.node:
            names.update(node.input)
            names.update(node.output)
            names.add(node.name)
    return names


def _infer(model: onnx.ModelProto) -> _Facts:
    facts = _Facts()
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # inference is a help here, not a requirement  # noqa: BLE001
        inferred = model
    for graph in all_graphs(inferred.graph):
        facts.learn(graph)
    return facts


def _take_down_nodes(nodes: Any, source: int, target: int, facts: _Facts,
                     fresh: Callable[[str], str], label: str, refusals: list[Refusal],
                     has_pattern: Callable[[str], bool]) -> None:
    from decomposer.opsets import bodies  # (it imports this module)

    rebuilt: list[onnx.NodeProto] = []
    changed = False
    for node in list(nodes):
        if node.op_type in _FOLDABLE:  # as written: the take-down edits nodes in place
            snapshot = onnx.NodeProto()
            snapshot.CopyFrom(node)
            facts.producers.update((name, snapshot) for name in node.output if name)
    for node in list(nodes):
        if norm_domain(node.domain) != "":
            rebuilt.append(node)
            continue
        constants = bodies._folded_new_op(node, source, target, facts)
        if constants is not None:
            rebuilt.extend(constants)
            changed = True
            continue
        body = bodies._expansion(node, source, target, facts, fresh, has_pattern)
        if body is not None:
            nodes_of_body, version = body
            holder = onnx.GraphProto()
            holder.node.extend(nodes_of_body)
            bodies._learn_body(holder, facts, version)
            for body_node in holder.node:
                if body_node.op_type in _FOLDABLE:
                    facts.producers.update((name, body_node) for name in body_node.output
                                           if name)
            bodies._fold_body(holder, facts)
            _take_down_nodes(holder.node, version, target, facts, fresh, label, refusals,
                             has_pattern)
            bodies._drop_dead_body(holder, {name for name in node.output if name})
            rebuilt.extend(holder.node)
            changed = True
            continue
        site = Site(node, facts, fresh, target, has_pattern if label.startswith("main graph")
                    else None)
        try:
            touched = _take_down_node(site, source, target)
        except CannotSay as why:
            refusals.append(Refusal(node.name, node.op_type, label, why.reason,
                                    why.since if why.since > target else None))
            rebuilt.append(node)
            continue
        if touched:
            changed = True
        written = [*site.before, *(site.replacement or []), *site.after]
        facts.written.update(n.name for n in written if n.name and n.name != node.name)
        rebuilt.extend(site.before)
        rebuilt.extend(site.replacement if site.replacement is not None else [site.node])
        rebuilt.extend(site.after)
    if changed:
        del nodes[:]
        nodes.extend(rebuilt)




def _history(op_type: str) -> list[int]:
    """The since-versions of ``op_type`` in the default domain, oldest first."""
    return _HISTORY.get(op_type, [])


def _schema(op_type: str, version: int) -> Any | None:
    """The op's schema at ``version``; None where ONNX has none, or a deprecated one (the
    checker refuses it: GroupNormalization-18 at opsets 18-20, since 21 replaced it)."""
    try:
        schema = defs.get_schema(op_type, version, "")
    except defs.SchemaError:
        return None
    return None if schema.deprecated else schema


def _take_down_node(site: Site, source: int, target: int) -> bool:
    """Bring ``site.node`` from its schema at ``source`` to its schema at ``target``;
    returns whether anything was written. Raises CannotSay."""
    from decomposer.opsets import adapters  # (it imports this module)

    node = site.node
    source_schema = _schema(node.op_type, source)
    target_schema = _schema(node.op_type, target)
    if source_schema is None:
        return False  # not a standard op at all: the engine's business
    if target_schema is None:
        # Not defined at the target: a lowering pattern's business. The node is still
        # brought to its op's first version, so patterns meet one signature (DFT-17's
        # axis attribute, GridSample-16's mode names).
        first = _history(node.op_type)[0]
        target_schema = _schema(node.op_type, first)
        if target_schema is None or source_schema.since_version == first:
            return False
    if source_schema.since_version == target_schema.since_version:
        return False
    op_type = node.op_type
    versions = [v for v in _history(op_type)
                if target_schema.since_version < v <= source_schema.since_version]
    for since in reversed(versions):
        adapter = adapters.ADAPTERS.get((op_type, since))
        if adapter is not None:
            adapter(site)
        if site.replacement is not None or node.op_type != op_type:
            return True  # the node became other ops, standard at the target
        older = _schema(op_type, since - 1)
        newer = _schema(op_type, since)
        if older is None or newer is None:
            raise CannotSay(f"{op_type} has no version before {since}", since)
        _fit_signature(site, newer, older, since)
    _carry_types(site, target_schema, source_schema.since_version)
    return True


def _fit_signature(site: Site, newer: Any, older: Any, since: int) -> None:
    """Drop what ``older`` lacks where it holds its default; refuse anything else."""
    node = site.node
    kept = []
    for attribute in node.attribute:
        if attribute.name in older.attributes:
            kept.append(attribute)
        elif not _is_default(attribute, newer.attributes.get(attribute.name)):
            value = helper.get_attribute_value(attribute)
            shown = value.decode() if isinstance(value, bytes) else value
            raise CannotSay(f"{node.op_type} sets {attribute.name}={shown!r}, which "
                            f"{node.op_type} before opset {since} does not have", since)
    if len(kept) != len(node.attribute):
        del node.attribute[:]
        node.attribute.extend(kept)
    while len(node.input) > older.max_input and not node.input[-1]:
        node.input.pop()
    for index, formal in enumerate(older.inputs[:len(node.input) or 1]):
        single = str(formal.option).endswith("Single")
        if single and (index >= len(node.input) or not node.input[index]):
            raise CannotSay(f"{node.op_type} leaves out its '{formal.name}' input, which "
                            f"{node.op_type} before opset {since} requires", since)
    if len(node.input) > older.max_input:
        extra = newer.inputs[min(older.max_input, len(newer.inputs) - 1)].name
        raise CannotSay(f"{node.op_type} is given its '{extra}' input, which {node.op_type} "
                        f"before opset {since} does not take", since)
    while len(node.output) > older.max_output and not node.output[-1]:
        node.output.pop()
    if len(node.output) > older.max_output:
        raise CannotSay(f"{node.op_type} writes {len(node.output)} outputs; before opset "
                        f"{since} it has {older.max_output}", since)


def _is_default(attribute: onnx.AttributeProto, declared: Any) -> bool:
    if declared is None or not declared.default_value.name:
        return False
    return bool(helper.get_attribute_value(attribute)
                == helper.get_attribute_value(declared.default_value))


def _carry_types(site: Site, schema: Any, source_since: int) -> None:
    """Cast inputs and outputs whose element type ``schema`` does not allow into a wider
    type it allows that holds every value, and the outputs back. Slots that share a type
    parameter at the target share the carrier."""
    node = site.node
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    groups: dict[str, list[tuple[str, int, int]]] = {}  # key -> (kind, index, elem type)
    accepted: dict[str, set[str]] = {}
    for kind, formals, names in (("in", schema.inputs, node.input),
                                 ("out", schema.outputs, node.output)):
        for index, name in enumerate(names):
            elem = site.elem_type(name) if name else None
            if elem is None or not formals:
                continue
            type_str = formals[min(index, len(formals) - 1)].type_str
            key = type_str if type_str in allowed else f"{kind}{index}"
            accepted[key] = allowed.get(type_str, {type_str})
            groups.setdefault(key, []).append((kind, index, elem))
    cast = _schema("Cast", site.target)
    castable = {t for c in cast.type_constraints for t in c.allowed_type_strs} if cast else set()
    plans: dict[str, int] = {}
    for key, slots in groups.items():
        elems = list(dict.fromkeys(elem for _, _, elem in slots))
        if len(elems) == 1 and _type_str(elems[0]) in accepted[key]:
            continue
        carrier = _common_carrier(elems, accepted[key])
        refused = next((e for e in elems if _type_str(e) not in accepted[key]), elems[0])
        since = _type_since(node.op_type, refused, source_since)
        if carrier is None or node.op_type in _NO_CARRIER or (
                TensorProto.BOOL in elems and node.op_type in _NO_BOOL_CARRIER):
            raise CannotSay(f"{node.op_type} on {_type_name(refused)} is defined from opset "
                            f"{since}", since)
        if any(_type_str(e) not in castable for e in elems):
            raise CannotSay(f"{node.op_type} on {_type_name(refused)} is defined from opset "
                            f"{since}, and Cast at opset {site.target} cannot carry "
                            f"{_type_name(refused)}", max(since, _type_since(
                                "Cast", refused, NEWEST_OPSET)))
        plans[key] = carrier
    for key, carrier in plans.items():
        for kind, index, elem in groups[key]:
            if elem == carrier:
                continue
            if kind == "in":
                node.input[index] = site.add(site.before, "Cast", [node.input[index]],
                                             f"carry{index}", to=carrier)
            else:
                site.cast_after(index, elem, "carried")


def _common_carrier(elems: list[int], accepted: set[str]) -> int | None:
    """A type in ``accepted`` that holds every value of each of ``elems``."""
    candidates = [*elems, *(c for e in elems for c in _CARRIERS.get(e, ()))]
    for candidate in dict.fromkeys(candidates):
        if _type_str(candidate) in accepted and all(
                e == candidate or candidate in _CARRIERS.get(e, ()) for e in elems):
            return candidate
    return None


def _type_since(op_type: str, elem: int, newest: int) -> int:
    """The first version of ``op_type`` (up to ``newest``) that takes ``elem`` anywhere."""
    for version in _history(op_type):
        if version > newest:
            break
        schema = _schema(op_type, version)
        if schema is None:
            continue
        if any(_type_str(elem) in c.allowed_type_strs for c in schema.type_constraints) or \
                any(f.type_str == _type_str(elem) for f in [*schema.inputs, *schema.outputs]):
            return version
    return newest


def _build_history() -> dict[str, list[int]]:
    found: dict[str, set[int]] = {}
    for schema in defs.get_all_schemas_with_history():
        if schema.domain == "":
            found.setdefault(schema.name, set()).add(int(schema.since_version))
    return {name: sorted(versions) for name, versions in found.items()}


_HISTORY = _build_history()

