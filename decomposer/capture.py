"""Which custom nodes a decomposition replaced, and a copy of the decomposed model that hands
their inputs and outputs back as graph outputs, wherever the nodes live.

In: the original model, the decomposed model and the registry that decomposed it.
Out: :func:`find_replaced` lists every replaced node (original node, pattern, parsed
attributes, where it lives, inputs the rewrite removed); :func:`instrument` returns a copy of
the decomposed model with extra graph outputs and one :class:`NodeTap` per replaced node,
saying which graph output holds each of its inputs and outputs and how to cut them into one
record per execution of the node (:func:`executions`).

How a value comes out of a nested graph, one level at a time up to the main graph:

- main graph: the value becomes a graph output;
- If branch: the branch outputs it, the other branch outputs a placeholder of the same
  type (its static dims, 0 for the dynamic ones), and both output a flag saying whether the
  then-branch ran; the If node gains those outputs;
- Loop / Scan body: the body outputs it as one more scan output, so the node gains an output
  stacked over iterations (ONNX Runtime needs the same shape in every iteration; if not, the
  run fails and the caller falls back);
- model-local function: the function outputs it and every call site gains an output, so
  each call site is checked on its own.

Inputs the engine removed (Constants and initializers that fed only the replaced node) are
read from the original model. Graph attributes of other ops (a custom op's own body, say) are
not followed: :class:`CannotTap` says so. The decomposed model given is never modified.

Measured (ORT 1.32, OpenVINO 2026.4, TVM 0.27): ONNX Runtime runs all four forms exposed;
OpenVINO runs If, Loop and Scan exposed but did not convert a model-local function at all;
TVM's importer takes no Loop, Scan or local function (and our runner fails on the If test
model's 0-d condition feed), so on TVM only main-graph nodes were checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from decomposer.functions import with_model_functions
from decomposer.graphs import OpClassifier, norm_domain, opset_map, subgraphs
from decomposer.pattern import Form, Pattern, Reject
from decomposer.registry import Registry

Body = onnx.GraphProto | onnx.FunctionProto
ScopeKey = tuple[str, ...]

# How a body hands values to the node that owns it (ONNX's control-flow ops).
_BRANCHES = {("If", "then_branch"): "then", ("If", "else_branch"): "else"}
_ITERATED = {("Loop", "body"): "loop", ("Scan", "body"): "scan"}


class CannotTap(Exception):
    """A value cannot be exposed as a graph output; the message says why."""


@dataclass(eq=False)
class Scope:
    """One body of nodes: the main graph, a subgraph of an If/Loop/Scan/other node, or a
    model-local function. ``key`` names it the same way in the original and the decomposed
    model (their control-flow nodes are the same nodes)."""

    body: Body
    key: ScopeKey
    kind: str  # "main", "then", "else", "loop", "scan", "function" or "other"
    parent: Scope | None  # the scope holding ``owner`` (None: main graph, functions)
    owner: onnx.NodeProto | None
    label: str
    opsets: dict[str, int]

    def defined(self) -> set[str]:
        """Names this body defines (inputs, initializers, node outputs)."""
        names: set[str] = set()
        if isinstance(self.body, onnx.FunctionProto):
            names.update(self.body.input)
        else:
            names.update(value.name for value in self.body.input)
            names.update(init.name for init in self.body.initializer)
        for node in self.body.node:
            names.update(out for out in node.output if out)
        return names

    def chain(self) -> Iterator[Scope]:
        """This scope, then the scopes whose names it can see."""
        scope: Scope | None = self
        while scope is not None:
            yield scope
            scope = scope.parent


def walk_scopes(model: onnx.ModelProto) -> list[Scope]:
    """Every scope of ``model``, main graph first, parents before their subgraphs."""
    opsets = opset_map(list(model.opset_import))
    scopes: list[Scope] = []

    def visit(scope: Scope) -> None:
        scopes.append(scope)
        for node in scope.body.node:
            owner_id = next((out for out in node.output if out), f"#{node.name}")
            for attr, sub in subgraphs(node):
                control = (node.op_type, attr) if norm_domain(node.domain) == "" else None
                kind = _BRANCHES.get(control or ("", "")) or _ITERATED.get(control or ("", ""),
                                                                           "other")
                label = f"{node.op_type} '{node.name or owner_id}' {attr}"
                if scope.kind != "main":
                    label = f"{label} in {scope.label}"
                visit(Scope(sub, (*scope.key, owner_id, attr), kind, scope, node, label,
                            scope.opsets))

    visit(Scope(model.graph, ("main",), "main", None, None, "main graph", opsets))
    for function in model.functions:
        f_opsets = {**opsets, **opset_map(list(function.opset_import))}
        visit(Scope(function, ("function", function.domain, function.name), "function", None,
                    None, f"function '{function.domain}::{function.name}'", f_opsets))
    return scopes


@dataclass
class ReplacedNode:
    """A custom node of the original that the decomposition replaced."""

    node: onnx.NodeProto  # as in the original model
    pattern: Pattern[Any]
    attrs: dict[str, Any]
    scope_key: ScopeKey
    where: str  # "main graph", "Loop 'l' body", ...
    form: Form  # the spelling it matched
    removed_inputs: dict[int, np.ndarray] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.node.name or next((o for o in self.node.output if o), self.node.op_type)

    @property
    def in_main_graph(self) -> bool:
        return self.scope_key == ("main",)

    def describe(self) -> str:
        where = "" if self.in_main_graph else f" in {self.where}"
        return f"'{self.name}' ({self.pattern.name}){where}"


def find_replaced(original: onnx.ModelProto, decomposed: onnx.ModelProto, registry: Registry,
                  base_dir: str | Path | None = None, lowered: Iterable[str] = ()
                  ) -> tuple[list[ReplacedNode], list[str]]:
    """The replaced nodes, and one note per custom node that is not one (kept, unknown).
    ``lowered``: standard op types the run decomposed on request (they count as custom)."""
    # A model-local function the decomposed model no longer holds was inlined: its calls
    # are replaced nodes, checked against the definition (decomposer.functions).
    still_defined = {(f.domain, f.name) for f in decomposed.functions}
    local = {(f.domain, f.name) for f in original.functions}
    classifier = OpClassifier(local & still_defined, lowered=frozenset(lowered))
    if local - still_defined:
        registry = with_model_functions(registry, original)
    after = {scope.key: scope for scope in walk_scopes(decomposed)}
    replaced: list[ReplacedNode] = []
    notes: list[str] = []
    visible: dict[ScopeKey, set[str]] = {}  # names a decomposed scope can see
    inlined = local - still_defined
    for scope in walk_scopes(original):
        if _root(scope).key[0] == "function" and _root(scope).key[1:] in inlined:
            continue  # an inlined body: checked through its calls, against the definition
        counterpart = after.get(scope.key)
        kept = set() if counterpart is None else {
            (norm_domain(n.domain), n.op_type, tuple(n.output)) for n in counterpart.body.node}
        for node in scope.body.node:
            if classifier.is_standard(node, scope.opsets):
                continue
            label = f"node '{node.name}' ({node.domain or '<default>'}::{node.op_type})"
            where = "" if scope.kind == "main" else f" in {scope.label}"
            if (norm_domain(node.domain), node.op_type, tuple(node.output)) in kept:
                notes.append(f"{label}{where} was kept, not decomposed: not verified")
                continue
            found = registry.lookup(node)
            if found is None or counterpart is None:
                why = "no pattern answers for it" if found is None else \
                    "the graph holding it is gone from the decomposed model"
                notes.append(f"{label}{where}: {why}; not verified per node")
                continue
            pattern, form = found
            try:
                attrs = pattern.match_attributes(node, form)
            except Reject as why:
                notes.append(f"{label}{where}: {why}; not verified per node")
                continue
            item = ReplacedNode(node, pattern, attrs, scope.key, scope.label, form)
            if counterpart.key not in visible:
                visible[counterpart.key] = set().union(
                    *(outer.defined() for outer in counterpart.chain()))
            defined = visible[counterpart.key]
            for index, name in enumerate(node.input):
                if name and name not in defined:
                    value = _original_constant(scope, name, base_dir)
                    if value is None:
                        notes.append(f"{label}{where}: its input '{name}' is gone from the "
                                     f"decomposed model and is no constant; not verified per "
                                     f"node")
                        break
                    item.removed_inputs[index] = value
            else:
                replaced.append(item)
    return replaced, notes


def _root(scope: Scope) -> Scope:
    while scope.parent is not None:
        scope = scope.parent
    return scope


def _original_constant(scope: Scope, name: str, base_dir: str | Path | None
                       ) -> np.ndarray | None:
    """The value of ``name`` if a Constant node or an initializer in ``scope``'s chain of
    the original model defines it."""
    folder = str(base_dir) if base_dir is not None else ""
    for outer in scope.chain():
        if isinstance(outer.body, onnx.GraphProto):
            for init in outer.body.initializer:
                if init.name == name:
                    return numpy_helper.to_array(init, folder)
        for node in outer.body.node:
            if name in node.output and node.op_type == "Constant" \
                    and norm_domain(node.domain) == "":
                return _constant_node_value(node, folder)
    return None


def _constant_node_value(node: onnx.NodeProto, folder: str) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.ref_attr_name:  # a function attribute: differs per call site
            return None
        if attr.name == "value":
            return numpy_helper.to_array(attr.t, folder)
        if attr.name in ("value_int", "value_ints", "value_float", "value_floats",
                         "value_string", "value_strings"):
            value = helper.get_attribute_value(attr)
            kind = np.int64 if "int" in attr.name else np.float32 if "float" in attr.name \
                else object
            return np.array(value, dtype=kind)
    return None


# -- exposing values --------------------------------------------------------------------


@dataclass(frozen=True)
class Level:
    """One enclosing body between a node and the main graph, outermost first.

    ``"stack"``: a Loop/Scan body; captured values gain a leading axis, one per iteration.
    ``"gate"``: an If branch; ``flag`` is the graph output saying whether the then-branch
    ran (itself stacked over the enclosing stack levels), and ``expect`` the value meaning
    this branch ran.
    """

    kind: str
    label: str
    flag: str = ""
    expect: bool = True


Taps = dict[str, tuple[str, tuple[Level, ...]]]  # call path -> (graph output, levels)


@dataclass
class NodeTap:
    """Where one replaced node's values come out of the instrumented model, per call path
    (the empty path outside functions)."""

    replaced: ReplacedNode
    paths: dict[str, tuple[Level, ...]]
    inputs: list[dict[str, str] | np.ndarray | None]  # per input: path -> output, or a value
    outputs: list[tuple[str, dict[str, str]]]  # (output name, path -> graph output)

    def graph_outputs(self) -> set[str]:
        names = {out for _, taps in self.outputs for out in taps.values()}
        for source in self.inputs:
            if isinstance(source, dict):
                names.update(source.values())
        names.update(level.flag for levels in self.paths.values() for level in levels
                     if level.flag)
        return names


class _Names:
    """Fresh tensor and node names that collide with nothing in the model."""

    def __init__(self, model: onnx.ModelProto) -> None:
        taken: set[str] = set()
        for scope in walk_scopes(model):
            body = scope.body
            if isinstance(body, onnx.FunctionProto):
                taken.update(body.input)
                taken.update(body.output)
            else:
                taken.update(v.name for v in [*body.input, *body.output, *body.value_info])
                taken.update(init.name for init in body.initializer)
            for node in body.node:
                taken.update([*node.input, *node.output, node.name])
        self._taken = taken

    def new(self, hint: str) -> str:
        base = f"verify/{hint}"
        name, count = base, 1
        while name in self._taken:
            count += 1
            name = f"{base}_{count}"
        self._taken.add(name)
        return name


class _Instrumenter:
    """Adds outputs to a copy of the decomposed model, one level at a time."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.model = model
        self.scopes = walk_scopes(model)
        self.by_key = {scope.key: scope for scope in self.scopes}
        self.names = _Names(model)
        self._memo: dict[tuple[ScopeKey, str], Taps] = {}
        self._flags: dict[int, str] = {}  # id(If node) -> its flag output in the parent
        self._types: dict[str, tuple[int, list[int | None] | None]] | None = None
        self._main_outputs = {value.name for value in model.graph.output}
        # Fed inputs come back as they are (the caller has them); no output needed.
        initialized = {init.name for init in model.graph.initializer}
        self._fed = {v.name for v in model.graph.input if v.name not in initialized}

    def expose(self, scope: Scope, name: str) -> Taps:
        key = (scope.key, name)
        if key not in self._memo:
            self._memo[key] = self._expose(scope, name)
        return self._memo[key]

    def _expose(self, scope: Scope, name: str) -> Taps:
        if scope.kind == "main":
            if name not in self._main_outputs and name not in self._fed:
                self.model.graph.output.append(onnx.ValueInfoProto(name=name))
                self._main_outputs.add(name)
            return {"": (name, ())}
        if scope.kind == "function":
            return self._expose_from_function(scope, name)
        owner, parent = scope.owner, scope.parent
        assert owner is not None and parent is not None
        if scope.kind in ("loop", "scan"):
            body = scope.body
            assert isinstance(body, onnx.GraphProto)
            # Loop bodies output (cond, carried..., scans...), Scan bodies (carried...,
            # scans...); the node's outputs are the same without the condition.
            _pad(owner, len(body.output) - (1 if scope.kind == "loop" else 0))
            body.output.append(onnx.ValueInfoProto(name=self._identity(body, name)))
            out = self.names.new(name)
            owner.output.append(out)
            for attr in owner.attribute:
                if attr.name in ("scan_output_axes", "scan_output_directions"):
                    attr.ints.append(0)
            level = Level("stack", f"{owner.op_type} '{owner.name}' iteration")
            return {path: (o, (*levels, level))
                    for path, (o, levels) in self.expose(parent, out).items()}
        if scope.kind in ("then", "else"):
            elem_type, dims = self._type_of(name)
            this, other = _branches(owner, scope.kind)
            flag = self._flag(owner)
            _pad(owner, len(this.output))
            # Typed branch outputs, and a placeholder of a compatible shape (the static dims,
            # 0 for the others): OpenVINO refuses an If whose branches disagree on a static
            # dim or a rank. ConstantOfShape allocates it only if that branch runs.
            this.output.append(helper.make_tensor_value_info(self._identity(this, name),
                                                             elem_type, dims))
            placeholder = self.names.new(f"{name}_not_run")
            shape = self.names.new(f"{name}_not_run_shape")
            fill = helper.make_tensor("fill", elem_type, [1], [0])
            other.node.extend([
                helper.make_node("Constant", [], [shape], name=self.names.new("shape"),
                                 value=helper.make_tensor(
                                     shape, onnx.TensorProto.INT64,
                                     [len(dims) if dims is not None else 1],
                                     [d or 0 for d in dims] if dims is not None else [0])),
                helper.make_node("ConstantOfShape", [shape], [placeholder],
                                 name=self.names.new("empty"), value=fill)])
            other.output.append(helper.make_tensor_value_info(placeholder, elem_type, dims))
            out = self.names.new(name)
            owner.output.append(out)
            flags = self.expose(parent, flag)
            label = f"If '{owner.name}' {scope.kind}_branch"
            return {path: (o, (*levels, Level("gate", label, flags[path][0],
                                              scope.kind == "then")))
                    for path, (o, levels) in self.expose(parent, out).items()}
        raise CannotTap(f"it lives in a graph attribute of {owner.op_type} '{owner.name}', "
                        f"which only If, Loop and Scan bodies can be exposed from")

    def _expose_from_function(self, scope: Scope, name: str) -> Taps:
        function = scope.body
        assert isinstance(function, onnx.FunctionProto)
        inner = self._identity(function, name)
        position = len(function.output)
        function.output.append(inner)
        found: Taps = {}
        for call, call_scope in self._call_sites(function):
            _pad(call, position)
            out = self.names.new(name)
            call.output.append(out)
            label = f"call '{call.name}' in {call_scope.label}"
            for path, tap in self.expose(call_scope, out).items():
                found[f"{path}, {label}" if path else label] = tap
        if not found:
            raise CannotTap(f"function '{function.domain}::{function.name}' is never called")
        return found

    def _call_sites(self, function: onnx.FunctionProto
                    ) -> list[tuple[onnx.NodeProto, Scope]]:
        return [(node, scope) for scope in self.scopes for node in scope.body.node
                if node.op_type == function.name and node.domain == function.domain]

    def _identity(self, body: Body, name: str) -> str:
        """A fresh name for ``name`` inside ``body`` (a body output may not be an outer-scope
        name or a body input in every engine, so values pass through an Identity)."""
        out = self.names.new(name)
        body.node.append(helper.make_node("Identity", [name], [out],
                                          name=self.names.new("identity")))
        return out

    def _flag(self, owner: onnx.NodeProto) -> str:
        """The If node's output saying whether its then-branch ran (added once per If)."""
        if id(owner) not in self._flags:
            then_branch, else_branch = _branches(owner, "then")
            _pad(owner, len(then_branch.output))
            for branch, taken in ((then_branch, True), (else_branch, False)):
                flag = self.names.new("then_branch_ran")
                branch.node.append(helper.make_node(
                    "Constant", [], [flag], name=self.names.new("flag"),
                    value=helper.make_tensor(flag, onnx.TensorProto.BOOL, [], [taken])))
                branch.output.append(helper.make_tensor_value_info(flag, onnx.TensorProto.BOOL,
                                                                   []))
            out = self.names.new("then_branch_ran")
            owner.output.append(out)
            self._flags[id(owner)] = out
        return self._flags[id(owner)]

    def _type_of(self, name: str) -> tuple[int, list[int | None] | None]:
        """Element type and dims (None for a dynamic dim; None if the rank is unknown) of
        ``name``; CannotTap without an element type."""
        if self._types is None:
            self._types = _infer_types(self.model)
        elem_type, dims = self._types.get(name, (0, None))
        if not elem_type:
            raise CannotTap(f"the element type of '{name}' is unknown (needed to expose a "
                            f"value from an If branch)")
        return elem_type, dims


def _pad(node: onnx.NodeProto, count: int) -> None:
    """Give ``node`` at least ``count`` outputs, so appended ones land at the right position
    (trailing optional outputs may be omitted)."""
    while len(node.output) < count:
        node.output.append("")


def _branches(owner: onnx.NodeProto, kind: str) -> tuple[onnx.GraphProto, onnx.GraphProto]:
    graphs = {attr.name: attr.g for attr in owner.attribute}
    then_branch, else_branch = graphs["then_branch"], graphs["else_branch"]
    return (then_branch, else_branch) if kind == "then" else (else_branch, then_branch)


def _infer_types(model: onnx.ModelProto) -> dict[str, tuple[int, list[int | None] | None]]:
    """Element type and dims of every named value, from ONNX shape inference on a copy
    without weights."""
    light = onnx.ModelProto()
    light.CopyFrom(model)
    declared = {value.name for value in light.graph.input}
    weights = list(light.graph.initializer)
    del light.graph.initializer[:]
    for init in weights:
        if init.name not in declared:
            light.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type,
                                                                   list(init.dims)))
    try:
        light = onnx.shape_inference.infer_shapes(light)
    except Exception:  # inference is best effort; declared types still count
        pass
    types: dict[str, tuple[int, list[int | None] | None]] = {}
    for scope in walk_scopes(light):
        body = scope.body
        values = list(getattr(body, "value_info", []))
        if isinstance(body, onnx.GraphProto):
            values += [*body.input, *body.output]
        for value in values:
            tensor_type = value.type.tensor_type
            if value.type.HasField("tensor_type") and tensor_type.elem_type:
                dims = [d.dim_value if d.HasField("dim_value") else None
                        for d in tensor_type.shape.dim] \
                    if tensor_type.HasField("shape") else None
                types.setdefault(value.name, (tensor_type.elem_type, dims))
    return types


def instrument(decomposed: onnx.ModelProto, replaced: Sequence[ReplacedNode]
               ) -> tuple[onnx.ModelProto, list[NodeTap], dict[int, str]]:
    """A copy of ``decomposed`` exposing every input and output of ``replaced``; the taps,
    and why each node that could not be exposed was skipped (by index in ``replaced``)."""
    model = onnx.ModelProto()
    model.CopyFrom(decomposed)
    tool = _Instrumenter(model)
    taps: list[NodeTap] = []
    skipped: dict[int, str] = {}
    for index, item in enumerate(replaced):
        scope = tool.by_key.get(item.scope_key)
        if scope is None:
            skipped[index] = "its graph is gone from the decomposed model"
            continue
        try:
            inputs: list[dict[str, str] | np.ndarray | None] = []
            paths: dict[str, tuple[Level, ...]] = {}
            for position, name in enumerate(item.node.input):
                if position in item.removed_inputs:
                    inputs.append(item.removed_inputs[position])
                elif not name:
                    inputs.append(None)
                else:
                    found = tool.expose(scope, name)
                    paths.update({path: levels for path, (_, levels) in found.items()})
                    inputs.append({path: out for path, (out, _) in found.items()})
            outputs: list[tuple[str, dict[str, str]]] = []
            for name in item.node.output:
                if name:
                    found = tool.expose(scope, name)
                    paths.update({path: levels for path, (_, levels) in found.items()})
                    outputs.append((name, {path: out for path, (out, _) in found.items()}))
        except CannotTap as why:
            skipped[index] = str(why)
            continue
        taps.append(NodeTap(item, paths, inputs, outputs))
    return model, taps, skipped


# -- cutting captured values into executions ---------------------------------------------


@dataclass
class Execution:
    """One execution of a replaced node: its input and output values, and where it ran."""

    path: str  # the call sites leading to it ("" outside functions)
    iteration: str  # the enclosing Loop/Scan iterations ("" outside them)
    inputs: list[np.ndarray | None]
    outputs: dict[str, np.ndarray]


def executions(tap: NodeTap, fetched: Mapping[str, np.ndarray]) -> Iterator[Execution]:
    """Every execution of ``tap``'s node in one run: one per call path, per iteration of
    each enclosing Loop/Scan, when every enclosing If took the node's branch."""
    for path, levels in tap.paths.items():
        named: dict[str, np.ndarray] = {}
        for position, source in enumerate(tap.inputs):
            if isinstance(source, dict):
                named[f"in{position}"] = fetched[source[path]]
        for name, taps in tap.outputs:
            named[f"out:{name}"] = fetched[taps[path]]
        stacks = [level for level in levels if level.kind == "stack"]
        for index, values in _walk(levels, 0, (), named, fetched):
            iteration = ", ".join(f"{level.label} {i}"
                                  for level, i in zip(stacks, index, strict=True))
            inputs = [source if isinstance(source, np.ndarray) or source is None
                      else values[f"in{position}"] for position, source in enumerate(tap.inputs)]
            outputs = {name: values[f"out:{name}"] for name, _ in tap.outputs}
            yield Execution(path, iteration, inputs, outputs)


def _walk(levels: tuple[Level, ...], depth: int, index: tuple[int, ...],
          values: dict[str, np.ndarray], fetched: Mapping[str, np.ndarray]
          ) -> Iterator[tuple[tuple[int, ...], dict[str, np.ndarray]]]:
    if depth == len(levels):
        yield index, values
        return
    level = levels[depth]
    if level.kind == "gate":
        ran = np.asarray(fetched[level.flag])[index]  # stacked over the enclosing loops
        if bool(ran) == level.expect:
            yield from _walk(levels, depth + 1, index, values, fetched)
        return
    count = min((array.shape[0] if array.ndim else 0 for array in values.values()),
                default=0)
    for i in range(count):
        yield from _walk(levels, depth + 1, (*index, i),
                         {key: array[i] for key, array in values.items()}, fetched)


__all__ = ["CannotTap", "Execution", "Level", "NodeTap", "ReplacedNode", "Scope",
           "executions", "find_replaced", "instrument", "walk_scopes"]
