"""The rewrite engine: find non-standard nodes, ask the registry, splice in standard ops.

In: an ``onnx.ModelProto`` (never mutated) and a :class:`Registry`.
Out: a new ``ModelProto`` in which every node a pattern could rewrite is replaced by
standard ONNX ops, plus a :class:`Report`.

How it works:
- A node is a candidate when it is not a standard op at the opset its domain is imported
  at (``onnx.defs``) and not a call to a model-local function. The engine looks in the
  main graph, in every graph-valued attribute (If/Loop/Scan bodies) at any depth, and in
  model-local functions. It knows no op by name.
- A replacement subgraph writes the replaced node's own output names, so consumers and
  graph outputs are untouched. New names start with the replaced node's name and never
  collide with any name in the model.
- Everything else is copied as it is, in order. Constant nodes and initializers that fed
  only replaced nodes are removed, and so are opset imports that only replaced nodes used.
- A model with no candidate comes back byte-identical, so a second run changes nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from decomposer.builder import MIN_OPSET, Builder, ConstantPool, NameAllocator
from decomposer.errors import (
    CheckFailedError,
    InvalidModelError,
    PatternError,
    UnsupportedNodeError,
)
from decomposer.graphs import (
    OpClassifier,
    all_graphs,
    all_nodes,
    norm_domain,
    opset_map,
    subgraphs,
)
from decomposer.pattern import MatchedNode, Reject
from decomposer.registry import Registry, default_registry
from decomposer.report import NodeIssue, ReplacedNode, Report

log = logging.getLogger("decomposer")

_MAX_OPSET_VERSION = 2**31 - 1  # onnx.defs takes a C int


# -- what patterns may ask about the graph ------------------------------------------------


class _Scope:
    """One graph being rewritten, with its enclosing scopes for outer-name lookups."""

    def __init__(self, graph: onnx.GraphProto, label: str, parent: _Scope | None,
                 is_function: bool = False) -> None:
        self.graph = graph
        self.label = label
        self.parent = parent
        # A function body's "inputs" are its call sites' arguments, not the model's inputs.
        self.is_function: bool = parent.is_function if parent is not None else is_function
        self._constants: dict[str, onnx.TensorProto | onnx.NodeProto] | None = None

    def constant_source(self, name: str) -> onnx.TensorProto | onnx.NodeProto | None:
        scope: _Scope | None = self
        while scope is not None:
            if scope._constants is None:
                scope._constants = {}
                for init in scope.graph.initializer:
                    scope._constants[init.name] = init
                for node in scope.graph.node:
                    if node.op_type == "Constant" and norm_domain(node.domain) == "":
                        for out in node.output:
                            scope._constants[out] = node
                # A graph input with the initializer's name may be overridden at run time:
                # such an initializer is a default, not a constant.
                for value in scope.graph.input:
                    scope._constants.pop(value.name, None)
            found = scope._constants.get(name)
            if found is not None:
                return found
            scope = scope.parent
        return None


class _TypeInfo:
    """Static types and shapes of tensors, from the model's own annotations plus ONNX shape
    inference. Inference runs lazily, once, and only if a pattern asks."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self._model = model
        self._types: dict[str, onnx.TypeProto] | None = None

    def _load(self) -> dict[str, onnx.TypeProto]:
        if self._types is not None:
            return self._types
        types: dict[str, onnx.TypeProto] = {}
        inferred = self._model
        try:
            inferred = onnx.shape_inference.infer_shapes(_light_copy(self._model))
        except Exception as exc:  # inference is a best effort; declared types still count
            log.debug("shape inference failed, using declared types only: %s", exc)
        for graph in all_graphs(inferred.graph):
            for value in [*graph.input, *graph.output, *graph.value_info]:
                if value.type.HasField("tensor_type"):
                    types.setdefault(value.name, value.type)
            for init in graph.initializer:
                tp = onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims))
                types.setdefault(init.name, tp)
        for function in self._model.functions:
            for value in getattr(function, "value_info", []):
                if value.type.HasField("tensor_type"):
                    types.setdefault(value.name, value.type)
        self._types = types
        return types

    def record(self, name: str, elem_type: int | None,
               shape: Sequence[int | str | None] | None) -> None:
        """Remember a rewritten node's output type, unless inference already knows it."""
        types = self._load()
        if name not in types:
            types[name] = onnx.helper.make_tensor_type_proto(
                elem_type or 0, None if shape is None else list(shape))

    def tensor_type(self, name: str) -> onnx.TypeProto.Tensor | None:
        tp = self._load().get(name)
        return tp.tensor_type if tp is not None else None


def _light_copy(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy for shape inference in which large initializers become typed graph inputs,
    so inference never copies weight bytes (shape tensors are small and stay)."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    source = model.graph
    graph.name = source.name
    graph.node.extend(source.node)
    graph.input.extend(source.input)
    graph.output.extend(source.output)
    graph.value_info.extend(source.value_info)
    declared = {value.name for value in source.input}
    for init in source.initializer:
        small = init.data_location != onnx.TensorProto.EXTERNAL and init.ByteSize() <= 4096
        if small:
            graph.initializer.append(init)
        elif init.name not in declared:
            graph.input.append(onnx.helper.make_tensor_value_info(
                init.name, init.data_type, list(init.dims)))
    return light


class _NodeContext:
    """The :class:`decomposer.pattern.MatchContext` handed to ``Pattern.check``."""

    def __init__(self, scope: _Scope, types: _TypeInfo, opset: int) -> None:
        self._scope = scope
        self._types = types
        self.opset = opset

    def constant(self, name: str) -> np.ndarray | None:
        if not name:
            return None
        source = self._scope.constant_source(name)
        if source is None:
            return None
        try:
            if isinstance(source, onnx.TensorProto):
                if source.data_location == onnx.TensorProto.EXTERNAL:
                    return None
                return numpy_helper.to_array(source)
            return _constant_node_value(source)
        except Exception:  # a malformed constant is simply not a usable constant
            return None

    def shape(self, name: str) -> tuple[int | str | None, ...] | None:
        tensor = self._types.tensor_type(name) if name else None
        if tensor is None or not tensor.HasField("shape"):
            const = self.constant(name)
            return tuple(const.shape) if const is not None else None
        dims: list[int | str | None] = []
        for dim in tensor.shape.dim:
            if dim.HasField("dim_value"):
                dims.append(dim.dim_value)
            elif dim.HasField("dim_param"):
                dims.append(dim.dim_param)
            else:
                dims.append(None)
        return tuple(dims)

    def is_model_input(self, name: str) -> bool:
        scope = self._scope
        while scope.parent is not None:
            scope = scope.parent
        if scope.is_function:  # its inputs are call-site arguments, possibly constants
            return False
        graph = scope.graph
        return (any(value.name == name for value in graph.input)
                and not any(init.name == name for init in graph.initializer))

    def elem_type(self, name: str) -> int | None:
        tensor = self._types.tensor_type(name) if name else None
        if tensor is not None and tensor.elem_type:
            return tensor.elem_type
        source = self._scope.constant_source(name) if name else None
        if isinstance(source, onnx.TensorProto):
            return source.data_type
        const = self.constant(name)
        if const is not None:
            return onnx.helper.np_dtype_to_tensor_dtype(const.dtype)
        return None


def _constant_node_value(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
        if attr.name == "value_int":
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints":
            return np.array(list(attr.ints), dtype=np.int64)
        if attr.name == "value_float":
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats":
            return np.array(list(attr.floats), dtype=np.float32)
    return None


# -- the rewrite ------------------------------------------------------------------------------


@dataclass
class _Namespace:
    """One name space (the main graph with its subgraphs, or one local function): its nodes
    before the rewrite, and the inputs of replaced nodes, which may now be orphans."""

    nodes_before: list[onnx.NodeProto]
    orphan_candidates: set[str] = field(default_factory=set)


class _Rewriter:
    def __init__(self, model: onnx.ModelProto, registry: Registry, report: Report,
                 classifier: OpClassifier) -> None:
        self.registry = registry
        self.report = report
        self.types = _TypeInfo(model)
        self.classifier = classifier
        tensor_names, node_names = _collect_names(model)
        self.tensor_names = NameAllocator(tensor_names)
        self.node_names = NameAllocator(node_names)

    def rewrite_graph(self, scope: _Scope, opsets: dict[str, int], ns: _Namespace) -> None:
        graph = scope.graph
        new_nodes: list[onnx.NodeProto] = []
        changed = False
        pool: ConstantPool = {}  # constants shared by this graph's replacements, this pass
        for node in graph.node:
            for attr_label, sub in subgraphs(node):
                label = f"{scope.label} > {node.op_type} '{node.name}' {attr_label}"
                self.rewrite_graph(_Scope(sub, label, scope), opsets, ns)
            if self.classifier.is_standard(node, opsets):
                new_nodes.append(node)
                continue
            replacement = self._rewrite_node(node, scope, opsets, pool)
            if replacement is None:
                new_nodes.append(node)
                continue
            new_nodes.extend(replacement)
            ns.orphan_candidates.update(name for name in node.input if name)
            changed = True
        if changed:
            del graph.node[:]
            graph.node.extend(new_nodes)

    def _rewrite_node(self, node: onnx.NodeProto, scope: _Scope, opsets: dict[str, int],
                      pool: ConstantPool) -> list[onnx.NodeProto] | None:
        def reject(reason: str) -> None:
            self.report.unsupported.append(
                NodeIssue(node.name, node.op_type, node.domain, scope.label, reason))

        found = self.registry.lookup(node)
        if found is None:
            reject("no pattern rewrites this op; add one with --patterns FILE "
                   "(see 'Writing a pattern' in the README) or pass --allow-unsupported")
            return None
        pattern, form = found
        opset = opsets.get("", 0)
        if opset == 0:
            reject("the model imports no default-domain opset, so standard ops cannot be "
                   f"added; import one (opset {MIN_OPSET} or newer) in opset_import")
            return None
        if opset < MIN_OPSET:
            reject(f"the model's default opset is {opset}; decomposer emits opset "
                   f"{MIN_OPSET}+ ops: convert the model first with "
                   f"onnx.version_converter.convert_version(model, {MIN_OPSET})")
            return None
        prefix = node.name or (node.output[0] if node.output else node.op_type)
        builder = Builder(opset, prefix, self.tensor_names, self.node_names,
                          constant_pool=pool)
        try:
            attrs = pattern.match_attributes(node, form)
            matched = MatchedNode(node, form, attrs)
            context = _NodeContext(scope, self.types, opset)
            facts = pattern.check(matched, context)
            pattern.build(builder, matched, facts)
            declared = pattern.output_types(matched, context, facts) or []
        except Reject as why:
            reject(f"pattern {pattern.name}: {why}")
            return None
        except Exception as exc:
            raise PatternError(
                f"pattern {pattern.name} failed on node '{node.name}' "
                f"({node.domain or '<default domain>'}::{node.op_type}): "
                f"{type(exc).__name__}: {exc}") from exc
        produced = {out for new in builder.nodes for out in new.output}
        missing = [out for out in node.output if out and out not in produced]
        if missing:
            raise PatternError(f"pattern {pattern.name} did not write output(s) {missing} of "
                               f"node '{node.name}'")
        builder.commit()
        for name, (elem_type, shape) in zip(node.output, declared, strict=False):
            if name:
                self.types.record(name, elem_type, shape)
        self.report.replaced.append(ReplacedNode(node.name, node.op_type, node.domain,
                                                 scope.label, pattern.name,
                                                 len(builder.nodes)))
        return builder.nodes


def _collect_names(model: onnx.ModelProto) -> tuple[set[str], set[str]]:
    tensors: set[str] = set()
    nodes: set[str] = set()

    def visit_nodes(node_list: Iterable[onnx.NodeProto]) -> None:
        for node in node_list:
            nodes.add(node.name)
            tensors.update(node.input)
            tensors.update(node.output)
            for _, sub in subgraphs(node):
                visit_graph(sub)

    def visit_graph(graph: onnx.GraphProto) -> None:
        for value in [*graph.input, *graph.output, *graph.value_info]:
            tensors.add(value.name)
        tensors.update(init.name for init in graph.initializer)
        for sparse in graph.sparse_initializer:
            tensors.add(sparse.values.name)
        visit_nodes(graph.node)

    visit_graph(model.graph)
    for function in model.functions:
        tensors.update(function.input)
        tensors.update(function.output)
        visit_nodes(function.node)
    return tensors, nodes


def _used_domains(nodes: Iterator[onnx.NodeProto]) -> set[str]:
    return {norm_domain(node.domain) for node in nodes}


def _has_candidate(model: onnx.ModelProto, classifier: OpClassifier) -> bool:
    opsets = opset_map(list(model.opset_import))
    if any(not classifier.is_standard(n, opsets) for n in all_nodes(model.graph)):
        return True
    for function in model.functions:
        f_opsets = {**opsets, **opset_map(list(function.opset_import))}
        for node in function.node:
            if not classifier.is_standard(node, f_opsets):
                return True
            for _, sub in subgraphs(node):
                if any(not classifier.is_standard(n, f_opsets) for n in all_nodes(sub)):
                    return True
    return False


def _validate(model: onnx.ModelProto) -> None:
    if not isinstance(model, onnx.ModelProto):
        raise InvalidModelError(f"expected an onnx.ModelProto, got {type(model).__name__}")
    if model.ir_version <= 0:
        raise InvalidModelError("the model has no ir_version (0): it is empty or not an ONNX "
                                "model")
    if not model.HasField("graph"):
        raise InvalidModelError("the model has no graph")
    # A negative static dim is not ONNX, and onnx's own shape inference aborts the process
    # on some (std::clamp assertion in 1.23): refuse them before anything infers shapes.
    for graph in all_graphs(model.graph):
        for value in [*graph.input, *graph.output, *graph.value_info]:
            if value.type.HasField("tensor_type"):
                for dim in value.type.tensor_type.shape.dim:
                    if dim.HasField("dim_value") and dim.dim_value < 0:
                        raise InvalidModelError(
                            f"tensor '{value.name}' declares dimension {dim.dim_value}; "
                            f"dimensions must be >= 0 (use a dim_param name for a dynamic "
                            f"one)")
    # onnx.proto is proto2: a string field may hold bytes that are not UTF-8, which
    # protobuf then hands back as bytes. Such names cannot be matched or written safely.
    nodes = [*all_nodes(model.graph), *(n for f in model.functions for n in _function_nodes(f))]
    for node in nodes:
        fields = [node.op_type, node.domain, node.name, *node.input, *node.output]
        if not all(isinstance(text, str) for text in fields):
            raise InvalidModelError(f"node {node.name!r} ({node.domain!r}::{node.op_type!r}) "
                                    f"has a name, op_type, domain or tensor name that is not "
                                    f"valid UTF-8")
    imports = [*model.opset_import, *(i for f in model.functions for i in f.opset_import)]
    for imp in imports:
        if not 1 <= imp.version <= _MAX_OPSET_VERSION:
            raise InvalidModelError(f"opset_import of domain '{imp.domain}' has version "
                                    f"{imp.version}; versions run from 1 (ONNX's newest is "
                                    f"{onnx.defs.onnx_opset_version()})")


def run(model: onnx.ModelProto, *, registry: Registry | None = None,
        allow_unsupported: bool = False, check: bool = True) -> tuple[onnx.ModelProto, Report]:
    """Rewrite ``model``; return the new model and the report. ``model`` is not mutated."""
    _validate(model)
    registry = registry if registry is not None else default_registry()
    opsets = opset_map(list(model.opset_import))
    report = Report(opset=opsets.get("", 0))
    out = onnx.ModelProto()
    out.CopyFrom(model)
    classifier = OpClassifier({(f.domain, f.name) for f in model.functions})
    if not _has_candidate(out, classifier):
        # Nothing to rewrite: hand the model back as it is, after the structural check
        # (full_check's strict shape inference rejects even some of ONNX's own test models).
        if check:
            _check_input(model, classifier, full=False)
        return out, report
    if check:
        _check_input(model, classifier, full=True)

    rewriter = _Rewriter(out, registry, report, classifier)
    main = _Namespace(list(all_nodes(model.graph)))
    functions = [_FunctionJob(function, opsets) for function in out.functions]
    # Passes: a node whose input types are only known once an upstream custom node is
    # rewritten (custom -> standard -> custom) is retried with fresh shape inference.
    # Patterns that declare their output types let plain chains resolve in one pass.
    while True:
        replaced_before = len(report.replaced)
        report.unsupported.clear()
        rewriter.rewrite_graph(_Scope(out.graph, "main graph", None), opsets, main)
        for job in functions:
            job.rewrite(rewriter)
        progress = len(report.replaced) > replaced_before
        if not report.unsupported or not progress:
            break
        rewriter.types = _TypeInfo(out)
    for job in functions:
        job.finish(report, opsets.get("", 0))

    if report.unsupported and not allow_unsupported:
        lines = "\n  ".join(issue.describe() for issue in report.unsupported)
        raise UnsupportedNodeError(
            f"{len(report.unsupported)} node(s) cannot be decomposed:\n  {lines}",
            report.unsupported, report)

    _remove_orphans(list(all_graphs(out.graph)), main.orphan_candidates, report)
    _drop_unused_imports(out.opset_import, _used_domains(iter(main.nodes_before)),
                         _used_domains(all_nodes(out.graph)), report,
                         keep=_function_domains(out))
    if check:
        _check_output(out, classifier)
    return out, report


class _FunctionJob:
    """Rewrites one model-local function body, in as many passes as the main graph."""

    def __init__(self, function: onnx.FunctionProto, model_opsets: dict[str, int]) -> None:
        self.function = function
        self.opsets = {**model_opsets, **opset_map(list(function.opset_import))}
        self.label = f"function '{function.domain}::{function.name}'"
        self.ns = _Namespace(list(_function_nodes(function)))
        self.domains_before = _used_domains(iter(self.ns.nodes_before))
        self.changed = False

    def rewrite(self, rewriter: _Rewriter) -> None:
        shell = onnx.GraphProto()
        shell.node.extend(self.function.node)
        shell.output.extend(onnx.ValueInfoProto(name=o) for o in self.function.output)
        before = len(rewriter.report.replaced)
        rewriter.rewrite_graph(_Scope(shell, self.label, None, is_function=True), self.opsets,
                               self.ns)
        if len(rewriter.report.replaced) > before:
            self.changed = True
            del self.function.node[:]
            self.function.node.extend(shell.node)

    def finish(self, report: Report, default_opset: int) -> None:
        if not self.changed:
            return
        function = self.function
        shell = onnx.GraphProto()
        shell.node.extend(function.node)
        shell.output.extend(onnx.ValueInfoProto(name=o) for o in function.output)
        _remove_orphans(list(all_graphs(shell)), self.ns.orphan_candidates, report)
        del function.node[:]
        function.node.extend(shell.node)
        if not any(norm_domain(i.domain) == "" for i in function.opset_import):
            function.opset_import.append(onnx.helper.make_opsetid("", default_opset))
        _drop_unused_imports(function.opset_import, self.domains_before,
                             _used_domains(_function_nodes(function)), report)


def _function_nodes(function: onnx.FunctionProto) -> Iterator[onnx.NodeProto]:
    for node in function.node:
        yield node
        for _, sub in subgraphs(node):
            yield from all_nodes(sub)


def _function_domains(model: onnx.ModelProto) -> set[str]:
    """Domains a model-level import must keep because local functions' nodes use them."""
    used: set[str] = set()
    for function in model.functions:
        used |= _used_domains(_function_nodes(function))
        used.add(norm_domain(function.domain))
    return used


def _drop_unused_imports(imports: Any, before: set[str], after: set[str],
                         report: Report, keep: set[str] | None = None) -> None:
    """Remove imports of domains that replaced nodes used and nothing uses any more."""
    gone = (before - after - (keep or set())) - {""}
    if not gone:
        return
    kept = [imp for imp in imports if norm_domain(imp.domain) not in gone]
    dropped = [imp.domain for imp in imports if norm_domain(imp.domain) in gone]
    del imports[:]
    imports.extend(kept)
    report.dropped_opset_imports.extend(d for d in dropped if d not in report.dropped_opset_imports)


def _remove_orphans(graphs: list[onnx.GraphProto], candidates: set[str],
                    report: Report) -> None:
    """Drop Constant nodes and initializers that fed only replaced nodes.

    ``graphs`` is one name space (a main graph with all its subgraphs, or a function body
    wrapped in a graph); ``candidates`` are the replaced nodes' input names.
    """
    if not candidates:
        return
    used: set[str] = set()
    for graph in graphs:
        for node in graph.node:
            used.update(node.input)
        used.update(value.name for value in graph.output)
    orphans = candidates - used
    if not orphans:
        return
    for graph in graphs:
        inputs = {value.name for value in graph.input}
        dead = {n.output[0] for n in graph.node
                if n.op_type == "Constant" and norm_domain(n.domain) == ""
                and len(n.output) == 1 and n.output[0] in orphans}
        dead |= {i.name for i in graph.initializer if i.name in orphans and i.name not in inputs}
        if not dead:
            continue
        keep_nodes = [n for n in graph.node if not (n.op_type == "Constant" and
                                                    len(n.output) == 1 and n.output[0] in dead)]
        keep_inits = [i for i in graph.initializer if i.name not in dead]
        keep_info = [v for v in graph.value_info if v.name not in dead]
        del graph.node[:]
        graph.node.extend(keep_nodes)
        if len(keep_inits) != len(graph.initializer):
            del graph.initializer[:]
            graph.initializer.extend(keep_inits)
        if len(keep_info) != len(graph.value_info):
            del graph.value_info[:]
            graph.value_info.extend(keep_info)
        report.removed_constants += len(dead)


OPAQUE_DOMAIN = "decomposer.opaque"


def _checkable(model: onnx.ModelProto, classifier: OpClassifier) -> onnx.ModelProto:
    """A copy of ``model`` that ``onnx.checker`` can judge on everything but custom nodes.

    Non-standard nodes move to a domain the checker does not know (it skips those), and
    external initializers become typed graph inputs: the checker would resolve their files
    against the working directory, and weights are copied byte for byte, not rewritten.
    """
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    opsets = opset_map(list(copy.opset_import))
    opaque = False
    for node in all_nodes(copy.graph):
        if not classifier.is_standard(node, opsets):
            node.domain, opaque = OPAQUE_DOMAIN, True
    for function in copy.functions:
        f_opsets = {**opsets, **opset_map(list(function.opset_import))}
        for node in _function_nodes(function):
            if not classifier.is_standard(node, f_opsets):
                node.domain = OPAQUE_DOMAIN
                if not any(i.domain == OPAQUE_DOMAIN for i in function.opset_import):
                    function.opset_import.append(onnx.helper.make_opsetid(OPAQUE_DOMAIN, 1))
                opaque = True
    if opaque:
        copy.opset_import.append(onnx.helper.make_opsetid(OPAQUE_DOMAIN, 1))
    external = [i for i in copy.graph.initializer
                if i.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        declared = {value.name for value in copy.graph.input}
        kept = [i for i in copy.graph.initializer
                if i.data_location != onnx.TensorProto.EXTERNAL]
        del copy.graph.initializer[:]
        copy.graph.initializer.extend(kept)
        for init in external:
            if init.name not in declared:
                copy.graph.input.append(onnx.helper.make_tensor_value_info(
                    init.name, init.data_type, list(init.dims)))
    return copy


def _checker_failure(model: onnx.ModelProto, classifier: OpClassifier,
                     full: bool) -> str | None:
    """The checker's complaint about ``model`` outside its custom nodes, or None."""
    try:
        onnx.checker.check_model(_checkable(model, classifier), full_check=full)
    except Exception as exc:
        return _first_line(exc)
    return None


def _check_input(model: onnx.ModelProto, classifier: OpClassifier, full: bool) -> None:
    """Refuse an input that is invalid apart from its custom nodes: that is not ours to fix,
    and it would otherwise look like a decomposer bug once rewritten."""
    failure = _checker_failure(model, classifier, full)
    if failure:
        raise InvalidModelError(f"the input model is invalid (onnx.checker, ignoring its "
                                f"custom nodes): {failure}; fix the export, or pass "
                                f"--no-check to rewrite it anyway")


def _check_output(out: onnx.ModelProto, classifier: OpClassifier) -> None:
    failure = _checker_failure(out, classifier, full=True)
    if failure:
        raise CheckFailedError(f"the decomposed model fails onnx.checker (full_check) although "
                               f"the input passed: {failure}; this is a decomposer or pattern "
                               f"bug: please report it with the model")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
