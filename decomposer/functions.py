"""ONNX functions as patterns: a custom op defined once by a ``FunctionProto`` is inlined.

In: ``FunctionProto`` definitions of custom ops: a model's own ``functions`` (model-local
functions), the ``functions`` of a library ``.onnx`` file, or a Python module's onnxscript
functions / ``FUNCTIONS`` list (:mod:`decomposer.plugins` loads the last two).
Out: one :class:`FunctionPattern` per definition. It answers for nodes of the function's
(domain, name) and writes the body in the node's place:

- attributes are bound: a body attribute that refers to a function attribute
  (``ref_attr_name``) takes the node's value, else the declared default, else is left out
  (ONNX's rule), at any depth of the body's If/Loop/Scan graphs;
- an absent optional input reads as ``""`` in the body; an output the node leaves out gets
  a fresh name;
- every name the body defines (its subgraphs' too) is new and starts with the replaced
  node's name, so nothing collides; node names follow the body's;
- a ``Constant`` of any form (``value_float=@alpha`` included) is written as a tensor
  constant, the one form every engine in the suite reads (TVM reads only ``value``);
- a body written at another default-domain opset than the model's is converted first:
  down with ``--target-opset``'s machinery (:func:`decomposer.engine.run`), up with
  ``onnx.version_converter``; what cannot be converted is refused with the reason.

Calls the body makes to other functions (nested definitions) are written as calls; the
engine rewrites them in its next pass, so nesting needs nothing here. The numpy reference
(:meth:`FunctionPattern.evaluate`, what ``--verify`` compares with) runs ONNX's reference
evaluator on the definition itself, not on this module's inlining.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from decomposer.builder import Builder
from decomposer.forms import Form, Reject
from decomposer.graphs import has_schema, norm_domain, opset_map, walk_nodes
from decomposer.pattern import MatchContext, MatchedNode, Pattern

FunctionKey = tuple[str, str]  # (normalized domain, name)

# Constant attributes other than ``value`` and the dtype each holds.
_CONSTANT_FORMS = {"value_float": np.float32, "value_floats": np.float32,
                   "value_int": np.int64, "value_ints": np.int64}
_STRING_FORMS = ("value_string", "value_strings")
MAX_POOLED_BYTES = 4096  # a body's larger constants are written as weights (initializers)


def function_key(function: onnx.FunctionProto) -> FunctionKey:
    return norm_domain(function.domain), function.name


def is_custom_function(function: onnx.FunctionProto) -> bool:
    """Whether ``function`` defines an op outside the ONNX standard domains (what
    decomposer inlines; a function of a standard domain is ONNX's own business)."""
    return norm_domain(function.domain) not in ("", "ai.onnx.ml", "ai.onnx.preview.training")


@dataclass(frozen=True)
class _Body:
    """A definition bound for one node: the nodes (attributes resolved) and the formal
    input and output names they read and write."""

    nodes: list[onnx.NodeProto]
    inputs: list[str]
    outputs: list[str]


class FunctionPattern(Pattern[_Body]):
    """Inlines calls of one function definition (see the module docstring).

    Instances come from :func:`function_patterns`; each has a class of its own whose
    ``op_type`` is the function's name (the registry keys patterns by class attributes).
    """

    op_type = "function"
    registry: Any = None  # where the references of custom ops the body calls are looked up
    function: onnx.FunctionProto
    library: Mapping[FunctionKey, onnx.FunctionProto]
    origin: str

    @property
    def name(self) -> str:
        return f"function {self.function.domain}::{self.function.name}"

    @property
    def summary(self) -> str:
        doc = self.function.doc_string.strip()
        first = doc.splitlines()[0] if doc else ""
        return first or f"defined by an ONNX function ({self.origin})"

    def spellings(self) -> list[Form]:
        return [Form(self.function.name, domains=frozenset({self.function.domain}),
                     outputs=(0, len(self.function.output)),
                     label=f"{self.function.domain} ({self.origin})")]

    # -- matching ---------------------------------------------------------------------------

    def match_attributes(self, node: onnx.NodeProto, form: Form) -> dict[str, Any]:
        """The node's attributes by name, the declared defaults filled in (AttributeProtos);
        raises Reject for an undeclared attribute or too many inputs or outputs."""
        function = self.function
        defaults = {attr.name: attr for attr in function.attribute_proto}
        declared = set(function.attribute) | set(defaults)
        given = {attr.name: attr for attr in node.attribute}
        unknown = sorted(set(given) - declared)
        if unknown:
            listed = ", ".join(sorted(declared)) or "none"
            raise Reject(f"attribute(s) {', '.join(unknown)} are not declared by the function "
                         f"(it declares: {listed})")
        if len(node.input) > len(function.input):
            raise Reject(f"{len(node.input)} inputs given; the function declares "
                         f"{len(function.input)}")
        if len(node.output) > len(function.output):
            raise Reject(f"{len(node.output)} outputs given; the function declares "
                         f"{len(function.output)}")
        bound = dict(defaults)
        bound.update(given)
        return bound

    def check(self, node: MatchedNode, ctx: MatchContext) -> _Body:
        function = self.function
        absent = {formal for index, formal in enumerate(function.input)
                  if index >= len(node.inputs) or not node.inputs[index]}
        nodes = _bind(function.node, node.attrs, absent, self.name)
        _require_closed(nodes, [name for name in function.input if name not in absent],
                        function.output, self.name)
        body_opset = _default_opset(function.opset_import)
        if body_opset is not None and body_opset != ctx.opset:
            nodes = self._converted(nodes, node, ctx, absent, body_opset)
        return _Body(nodes, list(function.input), list(function.output))

    def _converted(self, nodes: list[onnx.NodeProto], node: MatchedNode, ctx: MatchContext,
                   absent: set[str], body_opset: int) -> list[onnx.NodeProto]:
        """The bound body taken from its own opset to the model's, typed by the node's
        inputs (what the conversion's shape inference needs)."""
        from decomposer import engine
        from decomposer.errors import DecomposerError

        function = self.function
        inputs = []
        for index, formal in enumerate(function.input):
            if formal in absent:
                continue
            actual = node.inputs[index]
            elem_type = ctx.elem_type(actual)
            if elem_type is None:
                raise Reject(f"its body is written at opset {body_opset}, the model is at "
                             f"{ctx.opset}, and converting it needs the element type of "
                             f"input '{actual}', which is unknown")
            shape = ctx.shape(actual)
            inputs.append(helper.make_tensor_value_info(
                formal, elem_type, None if shape is None else list(shape)))
        graph = helper.make_graph(nodes, "body", inputs,
                                  [onnx.ValueInfoProto(name=name) for name in function.output])
        imports = [entry for entry in function.opset_import if norm_domain(entry.domain)]
        model = helper.make_model(graph, opset_imports=[
            helper.make_opsetid("", body_opset), *imports])
        model.functions.extend(other for key, other in sorted(self.library.items())
                               if key != function_key(function))
        try:
            if body_opset > ctx.opset:
                converted, _ = engine.run(model, target_opset=ctx.opset,
                                          allow_unsupported=True, check=False)
            else:
                converted = onnx.version_converter.convert_version(model, ctx.opset)
        except DecomposerError as exc:
            raise Reject(f"its body is written at opset {body_opset} and cannot go down to "
                         f"the model's {ctx.opset}: {_first_line(exc)}") from exc
        except Exception as exc:
            raise Reject(f"its body is written at opset {body_opset}; ONNX's version "
                         f"converter cannot take it to the model's {ctx.opset}: "
                         f"{_first_line(exc)}") from exc
        unsaid = sorted({node.op_type for node in walk_nodes(converted.graph.node)
                         if not norm_domain(node.domain)
                         and not has_schema(node.op_type, ctx.opset, "")})
        if unsaid:
            raise Reject(f"its body is written at opset {body_opset} and cannot go down to "
                         f"the model's {ctx.opset}: opset {ctx.opset} has no "
                         f"{', '.join(unsaid)} and no pattern lowers it")
        return list(converted.graph.node) + [
            helper.make_node("Constant", [], [init.name], value=init)
            for init in converted.graph.initializer]

    # -- building ---------------------------------------------------------------------------

    def build(self, b: Builder, node: MatchedNode, facts: _Body) -> None:
        names: dict[str, str] = {}
        for index, formal in enumerate(facts.inputs):
            names[formal] = node.inputs[index] if index < len(node.inputs) else ""
        outputs = {formal: node.outputs[index]
                   for index, formal in enumerate(facts.outputs)
                   if index < len(node.outputs) and node.outputs[index]}
        _emit(b, _ordered(facts.nodes, names), names, outputs)
        for formal, actual in outputs.items():
            if formal in names and names[formal] != actual:
                b.op("Identity", names[formal], out=actual)  # an input passed straight out

    # -- the reference ----------------------------------------------------------------------

    def evaluate(self, form: Form, inputs: Sequence[np.ndarray | None],
                 attrs: Mapping[str, Any]) -> list[np.ndarray]:
        """The definition run by ``onnx.reference`` on one call with these inputs and
        attributes (every definition of the library available to nested calls)."""
        from onnx.reference import ReferenceEvaluator

        function = self.function
        feeds = {f"in{i}": array for i, array in enumerate(inputs) if array is not None}
        call_inputs = [f"in{i}" if array is not None else "" for i, array in enumerate(inputs)]
        while call_inputs and not call_inputs[-1]:
            call_inputs.pop()
        outs = [f"out{i}" for i in range(len(function.output))]
        call = helper.make_node(function.name, call_inputs, outs, domain=function.domain)
        call.attribute.extend(attrs[name] for name in sorted(attrs))
        graph = helper.make_graph(
            [call], "reference",
            [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(
                feeds[name].dtype), None) for name in feeds],
            [onnx.ValueInfoProto(name=name) for name in outs])
        imports = {norm_domain(entry.domain): entry.version
                   for other in self.library.values() for entry in other.opset_import}
        imports.setdefault(norm_domain(function.domain), 1)
        imports.setdefault("", _default_opset(function.opset_import) or 18)
        model = helper.make_model(graph, opset_imports=[
            helper.make_opsetid(domain, version) for domain, version in sorted(imports.items())])
        model.functions.extend(self.library[key] for key in sorted(self.library))
        if not any(calls(f.node) - set(self.library) - _standard_calls(f) for f in
                   model.functions):
            results = ReferenceEvaluator(model).run(None, feeds)
            return [np.asarray(result) for result in results]
        # a body calling custom ops that patterns know: their references stand in for them
        from decomposer.registry import default_registry
        from decomposer.verification import reference_run

        registry = self.registry if self.registry is not None else default_registry()
        # inlined by ONNX's own inliner: the reference evaluator runs new ops only in the
        # main graph
        from onnx import inliner

        inlined = inliner.inline_local_functions(model)
        found = reference_run(inlined, registry).run(feeds, outs)
        return [np.asarray(found[name]) for name in outs]


def function_patterns(functions: Iterable[onnx.FunctionProto], origin: str
                      ) -> list[FunctionPattern]:
    """One pattern per custom-domain definition in ``functions`` (they may call each
    other). Raises :class:`decomposer.errors.PatternError` for a definition that calls
    itself, directly or not (ONNX forbids it; inlining it would never end)."""
    from decomposer.errors import PatternError

    custom = [function for function in functions if is_custom_function(function)]
    library = {function_key(function): function for function in custom}
    cycle = _call_cycle(library)
    if cycle:
        raise PatternError(f"{origin}: function {' -> '.join(cycle)} calls itself; ONNX "
                           f"functions may not recurse")
    patterns = []
    for function in custom:
        digest = hashlib.sha1(function.SerializeToString(deterministic=True)).hexdigest()[:12]
        # One class per definition: the registry keys a pattern by its class's op_type, and
        # tells two definitions of one op apart by the class's qualified name.
        cls = type(f"FunctionPattern_{function.name}", (FunctionPattern,),
                   {"op_type": function.name, "__module__": __name__,
                    "__qualname__": f"FunctionPattern[{function.domain}::{function.name}"
                                    f"@{digest}]"})
        pattern = cls()
        pattern.function = function
        pattern.library = library
        pattern.origin = origin
        patterns.append(pattern)
    return patterns


def calls(nodes: Iterable[onnx.NodeProto]) -> set[FunctionKey]:
    """(domain, op_type) of every node in ``nodes``, at any depth."""
    return {(norm_domain(node.domain), node.op_type) for node in walk_nodes(nodes)}


def _standard_calls(function: onnx.FunctionProto) -> set[FunctionKey]:
    """The (domain, op_type) of the body's nodes that are standard ONNX ops."""
    opsets = opset_map(list(function.opset_import))
    return {(norm_domain(n.domain), n.op_type) for n in walk_nodes(function.node)
            if norm_domain(n.domain) in opsets
            and has_schema(n.op_type, opsets[norm_domain(n.domain)], norm_domain(n.domain))}


def _call_cycle(library: Mapping[FunctionKey, onnx.FunctionProto]) -> list[str]:
    """A chain of definitions that ends where it began, or [] if none does."""
    state: dict[FunctionKey, int] = {}  # 1: on the current path, 2: done

    def visit(key: FunctionKey, path: list[FunctionKey]) -> list[str]:
        if state.get(key) == 1:
            start = path.index(key)
            return [f"{domain}::{name}" for domain, name in path[start:] + [key]]
        if state.get(key) == 2:
            return []
        state[key] = 1
        for callee in sorted(calls(library[key].node) & set(library)):
            found = visit(callee, path + [key])
            if found:
                return found
        state[key] = 2
        return []

    for key in sorted(library):
        found = visit(key, [])
        if found:
            return found
    return []


def _default_opset(imports: Iterable[onnx.OperatorSetIdProto]) -> int | None:
    for entry in imports:
        if norm_domain(entry.domain) == "":
            return int(entry.version)
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- binding ------------------------------------------------------------------------------


def _bind(nodes: Iterable[onnx.NodeProto], attrs: Mapping[str, onnx.AttributeProto],
          absent: set[str], label: str) -> list[onnx.NodeProto]:
    """Copies of ``nodes`` with attribute references resolved and reads of ``absent``
    formal inputs made ``""``, at any depth."""
    bound = []
    for node in nodes:
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        del copy.attribute[:]
        for attr in node.attribute:
            if attr.ref_attr_name:
                value = attrs.get(attr.ref_attr_name)
                if value is None:
                    continue  # no value and no default: the attribute is left out
                if attr.type and value.type != attr.type:
                    raise Reject(f"attribute '{attr.ref_attr_name}' is given as "
                                 f"{onnx.AttributeProto.AttributeType.Name(value.type)}; "
                                 f"node '{node.name}' of the body reads it as "
                                 f"{onnx.AttributeProto.AttributeType.Name(attr.type)}")
                resolved = copy.attribute.add()
                resolved.CopyFrom(value)
                resolved.name = attr.name
                continue
            kept = copy.attribute.add()
            kept.CopyFrom(attr)
            if attr.type == onnx.AttributeProto.GRAPH:
                _bind_graph(kept.g, attrs, absent, label)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for graph in kept.graphs:
                    _bind_graph(graph, attrs, absent, label)
        for index, name in enumerate(copy.input):
            if name in absent:
                copy.input[index] = ""
        bound.append(copy)
    return bound


def _bind_graph(graph: onnx.GraphProto, attrs: Mapping[str, onnx.AttributeProto],
                absent: set[str], label: str) -> None:
    own = {value.name for value in graph.input} | {init.name for init in graph.initializer}
    own |= {out for node in graph.node for out in node.output}
    new = _bind(graph.node, attrs, absent - own, label)
    del graph.node[:]
    graph.node.extend(new)


def _require_closed(nodes: Sequence[onnx.NodeProto], inputs: Iterable[str],
                    outputs: Iterable[str], label: str) -> None:
    """Reject a body that reads a name it never defines or leaves an output unwritten."""
    defined = set(inputs) | {""}
    for node in _ordered(nodes, {name: name for name in defined}):
        missing = sorted(_outer_reads(node) - defined)
        if missing:
            raise Reject(f"its body reads '{missing[0]}', which the function neither "
                         f"takes nor computes")
        defined.update(node.output)
    unwritten = [name for name in outputs if name not in defined]
    if unwritten:
        raise Reject(f"its body never writes output '{unwritten[0]}'")


def _outer_reads(node: onnx.NodeProto) -> set[str]:
    """Names ``node`` reads from its scope (its own inputs and what its subgraphs read
    from outside themselves)."""
    reads = set(node.input)
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else \
            list(attr.graphs) if attr.type == onnx.AttributeProto.GRAPHS else []
        for graph in graphs:
            own = {value.name for value in graph.input} | {i.name for i in graph.initializer}
            inner: set[str] = set()
            for sub in graph.node:
                inner |= _outer_reads(sub) - own
                own.update(sub.output)
            inner |= {value.name for value in graph.output} - own
            reads |= inner
    reads.discard("")
    return reads


def _ordered(nodes: Sequence[onnx.NodeProto], known: Mapping[str, str]
             ) -> list[onnx.NodeProto]:
    """``nodes`` in an order where each reads only what is known or written before it
    (ONNX requires a function body to be sorted already; a converted one may not be)."""
    defined = set(known) | {""}
    for node in nodes:
        if not _outer_reads(node) <= defined:
            break
        defined.update(node.output)
    else:
        return list(nodes)  # sorted already: kept in its order
    defined = set(known) | {""}
    pending = list(nodes)
    ordered: list[onnx.NodeProto] = []
    while pending:
        ready = [node for node in pending if _outer_reads(node) <= defined]
        if not ready:
            ordered.extend(pending)  # a cycle or an undefined read: _require_closed says
            break
        for node in ready:
            defined.update(node.output)
        ordered.extend(ready)
        pending = [node for node in pending if all(node is not r for r in ready)]
    return ordered


# -- emitting -----------------------------------------------------------------------------


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a numeric Constant of any form, or None (a string or sparse one, or a
    node that is no Constant)."""
    if node.op_type != "Constant" or norm_domain(node.domain) or len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value":
        array = numpy_helper.to_array(attr.t)
        return None if array.dtype == object else array
    dtype = _CONSTANT_FORMS.get(attr.name)
    if dtype is None:
        return None
    return np.asarray(helper.get_attribute_value(attr), dtype=dtype)


def _emit(b: Builder, nodes: Sequence[onnx.NodeProto], names: dict[str, str],
          outputs: Mapping[str, str]) -> None:
    """Append ``nodes`` to ``b``, renaming what they read through ``names`` (updated with
    what they write); a formal output in ``outputs`` is written under the node's name."""
    for node in nodes:
        value = _constant_value(node)
        if value is not None:
            # small constants join the graph's pool (equal ones are stored once); weights
            # become initializers, where engines and writers expect them
            pooled = b.const(value, hint=node.output[0]) if value.nbytes <= MAX_POOLED_BYTES \
                else b.weight(numpy_helper.from_array(value), hint=node.output[0])
            if node.output[0] in outputs:
                b.op("Identity", pooled, out=outputs[node.output[0]])
                names[node.output[0]] = outputs[node.output[0]]
            else:
                names[node.output[0]] = pooled
            continue
        proto = _string_constant(node) or node
        proto = _renamed_subgraphs(b, proto, names)
        outs: list[str | None] = [outputs.get(out, "" if not out else None)
                                  for out in proto.output]
        written = b.copy_node(proto, [names.get(name, name) if name else ""
                                      for name in proto.input], outs)
        for formal, actual in zip(proto.output, written, strict=True):
            if formal:
                names[formal] = actual


def _string_constant(node: onnx.NodeProto) -> onnx.NodeProto | None:
    """A string Constant in its ``value`` form, or None for any other node."""
    if node.op_type != "Constant" or norm_domain(node.domain) or len(node.attribute) != 1 \
            or node.attribute[0].name not in _STRING_FORMS:
        return None
    raw = helper.get_attribute_value(node.attribute[0])
    array = np.asarray(raw, dtype=object)
    strings: list[Any] = [item if isinstance(item, bytes) else str(item).encode()
                          for item in array.reshape(-1)]
    tensor = helper.make_tensor("value", onnx.TensorProto.STRING, list(array.shape), strings)
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    del copy.attribute[:]
    copy.attribute.append(helper.make_attribute("value", tensor))
    return copy


def _renamed_subgraphs(b: Builder, node: onnx.NodeProto, names: Mapping[str, str]
                       ) -> onnx.NodeProto:
    """``node`` with each graph attribute's names made new (what it reads from outside
    renamed through ``names``), or ``node`` itself when it holds no graph."""
    if not any(attr.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for attr in node.attribute):
        return node
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for attr in copy.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            _rename_graph(b, attr.g, names)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            for graph in attr.graphs:
                _rename_graph(b, graph, names)
    return copy


def _rename_graph(b: Builder, graph: onnx.GraphProto, outer: Mapping[str, str]) -> None:
    """Rename, in place, every name ``graph`` defines to a new one and every name it reads
    from outside through ``outer``; Constants take the tensor form."""
    names = dict(outer)
    for value in graph.input:
        names[value.name] = value.name = b.fresh_name(value.name)
    for init in graph.initializer:
        names[init.name] = init.name = b.fresh_name(init.name)
    nodes = []
    for node in graph.node:
        proto = _string_constant(node) or node
        value = _constant_value(proto)
        if value is not None and proto.attribute[0].name != "value":
            proto = helper.make_node("Constant", [], list(proto.output), name=proto.name,
                                     value=numpy_helper.from_array(value))
        proto = _renamed_subgraphs(b, proto, names)
        copy = onnx.NodeProto()
        copy.CopyFrom(proto)
        for index, name in enumerate(copy.input):
            copy.input[index] = names.get(name, name) if name else ""
        for index, name in enumerate(copy.output):
            if name:
                names[name] = copy.output[index] = b.fresh_name(name)
        copy.name = b.fresh_node_name(copy.name or copy.op_type)
        nodes.append(copy)
    del graph.node[:]
    graph.node.extend(nodes)
    for value in graph.output:
        value.name = names.get(value.name, value.name)
    kept = [value for value in graph.value_info if value.name in names]
    for value in kept:
        value.name = names[value.name]
    del graph.value_info[:]
    graph.value_info.extend(kept)


# -- model-local functions ----------------------------------------------------------------


def with_model_functions(registry: Any, model: onnx.ModelProto) -> Any:
    """A copy of ``registry`` in which each custom-domain model-local function of ``model``
    answers for its calls, unless a pattern is registered for exactly its (domain, name):
    the user's pattern wins over the model's definition, and the definition over a pattern
    that accepts any domain."""
    from decomposer.errors import InvalidModelError, PatternError

    try:
        patterns = function_patterns(model.functions, "model-local function")
    except PatternError as exc:
        raise InvalidModelError(f"the model is invalid: {exc}") from exc
    chosen = [pattern for pattern in patterns
              if not registry.answers_exactly(pattern.function.domain, pattern.function.name)]
    if not chosen:
        return registry
    extended = registry.copy()
    for pattern in chosen:
        pattern.registry = extended
        extended.register(pattern, source="model-local function", override=True)
    return extended


def reachable_calls(model: onnx.ModelProto) -> set[FunctionKey]:
    """(domain, name) of the model-local functions the main graph calls, directly or
    through other functions, at any depth."""
    library = {function_key(function): function for function in model.functions}
    found: set[FunctionKey] = set()
    frontier = calls(model.graph.node) & set(library)
    while frontier:
        key = frontier.pop()
        found.add(key)
        frontier |= (calls(library[key].node) & set(library)) - found
    return found


def drop_inlined_functions(out: onnx.ModelProto, original: onnx.ModelProto,
                           report: Any) -> None:
    """Remove from ``out`` the custom-domain functions ``original`` called that ``out``
    calls no more (every call was inlined); record them in ``report.inlined_functions``.
    A function the original never called is kept, as everything else is."""
    before = reachable_calls(original)
    now = reachable_calls(out)
    gone = {function_key(function) for function in out.functions
            if is_custom_function(function) and function_key(function) in before
            and function_key(function) not in now}
    if not gone:
        return
    kept = [function for function in out.functions if function_key(function) not in gone]
    del out.functions[:]
    out.functions.extend(kept)
    report.inlined_functions = sorted(f"{domain}::{name}" for domain, name in gone)
