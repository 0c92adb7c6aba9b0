"""The rewrite engine: find non-standard nodes, ask the registry, splice in standard ops.

In: an ``onnx.ModelProto`` (never mutated), a :class:`Registry` and a target
(``"portable"``: every engine; ``"ort"``: ONNX Runtime).
Out: a new ``ModelProto`` in which every node a pattern could rewrite is replaced by
standard ONNX ops, plus a :class:`Report`.

How it works:
- A node is a candidate when it is not a standard op at the opset its domain is imported
  at (``onnx.defs``; under the ``ort`` target, ONNX Runtime's own contrib kernels count as
  standard). A call to a model-local function of a custom domain is one too, except under
  ``ort`` (which inlines calls itself): :mod:`decomposer.functions` inlines it from its
  definition, and a definition no call is left for is dropped. The engine looks in the main
  graph, in every graph-valued attribute (If/Loop/Scan bodies) at any depth, and in the
  model-local functions it keeps. It knows no op by name.
- A replacement that writes candidates itself (a function body calling another function)
  is followed by another pass over the model, up to ``MAX_PASSES``.
- A replacement subgraph writes the replaced node's own output names, so consumers and
  graph outputs are untouched. New names start with the replaced node's name and never
  collide with any name in the model.
- Everything else is copied as it is, in order; :mod:`decomposer.cleanup` then removes
  Constant nodes and initializers that fed only replaced nodes, and opset imports that only
  replaced nodes used. :mod:`decomposer.checking` validates the input and the result.
- A model with no candidate comes back byte-identical, so a second run changes nothing.

Neighbours: :mod:`decomposer.context` answers patterns' questions about the graph;
:mod:`decomposer.builder` builds the replacement nodes.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from decomposer import memo
from decomposer.builder import MIN_OPSET, Builder, ConstantPool, NameAllocator
from decomposer.checking import (
    CLASH,
    check_input,
    check_output,
    checker_failure,
    clear_minus_one_dims,
    minus_one_dims,
    replacement_failure,
    stale_value_info,
    validate_structure,
)
from decomposer.cleanup import (
    cancel_inverse_transposes,
    drop_unused_imports,
    function_domains,
    node_signature,
    remove_orphans,
    used_domains,
)
from decomposer.context import NodeContext, Scope, TypeTables, function_label
from decomposer.errors import (
    CheckFailedError,
    InvalidModelError,
    PatternBugError,
    UnsupportedNodeError,
)
from decomposer.forms import UnknownTypes
from decomposer.freezing import fix_inputs, fold
from decomposer.functions import (
    drop_inlined_functions,
    function_key,
    function_patterns,
    is_custom_function,
    reachable_calls,
    with_model_functions,
)
from decomposer.graphs import (
    OpClassifier,
    all_graphs,
    all_nodes,
    function_nodes,
    function_opsets,
    has_schema,
    is_default_domain,
    norm_domain,
    opset_map,
    subgraphs,
    walk_nodes,
)
from decomposer.opsets import LOWERING_DOMAIN, NEWEST_OPSET, take_down
from decomposer.pattern import Reject
from decomposer.registry import Registry, default_registry
from decomposer.report import NodeIssue, ReplacedNode, Report
from decomposer.targets import Lowering
from decomposer.targets import resolve as resolve_target

RUNTIME_ONLY_DOMAINS = ("com.microsoft", "com.microsoft.nchwc")
# Passes over the model at most: each pass also rewrites what the one before wrote (calls
# nested in function bodies), so this bounds how deep definitions may nest.
MAX_PASSES = 64
# Replay one build for identical nodes (decomposer.memo); tests turn it off to compare.
REUSE_TEMPLATES = True


@dataclass
class _Usage:
    """What one graph of the result (with the graphs nested in it) holds after a pass: the
    graphs, the names its nodes read, their domains. The last pass sees every node it keeps
    or writes, so the clean-up need not walk the result again."""

    graphs: list[onnx.GraphProto]
    reads: set[str] = field(default_factory=set)
    domains: set[str] = field(default_factory=set)  # as written (normalize before use)

    def add_nodes(self, nodes: Iterable[onnx.NodeProto]) -> None:
        for node in nodes:
            self.reads.update(node.input)
            self.domains.add(node.domain)
            for _, sub in subgraphs(node):
                self.graphs.append(sub)
                self.add_nodes(sub.node)

    def merge(self, other: _Usage) -> None:
        self.graphs.extend(other.graphs)
        self.reads |= other.reads
        self.domains |= other.domains


@dataclass
class _Namespace:
    """One name space (the main graph with its subgraphs, or one local function): its nodes
    before the rewrite, and the inputs of replaced nodes, which may now be orphans."""

    nodes_before: list[onnx.NodeProto]
    orphan_candidates: set[str] = field(default_factory=set)


class _Rewriter:
    def __init__(self, model: onnx.ModelProto, registry: Registry, report: Report,
                 classifier: OpClassifier, schema_classifier: OpClassifier, target: str,
                 base_dir: str | None = None,
                 type_hints: dict[str, onnx.TypeProto] | None = None) -> None:
        self.registry = registry
        self.base_dir = base_dir
        self.report = report
        self.type_hints = type_hints
        self.types = TypeTables(model, type_hints)
        self.classifier = classifier
        # Whether the result holds a node onnx.checker cannot judge, or external data (then
        # the check masks them): the pass sees every node it keeps or writes, which spares
        # the check a walk over the whole result. Reset at each pass.
        self.schema_classifier = schema_classifier
        self.needs_masking = False
        self.target = target
        self.ir_version = model.ir_version
        tensor_names, node_names = _collect_names(model)
        self.tensor_names = NameAllocator(tensor_names)
        self.node_names = NameAllocator(node_names)
        self.rewritten_outputs: set[str] = set()  # output names of replaced nodes
        # Whether a replacement of this pass wrote a node that is itself a candidate (a
        # function body calling another function): the engine then runs another pass.
        self.emitted_candidates = False
        self.opsets: dict[str, int] = {}
        self.reuse = REUSE_TEMPLATES
        self.target_lowering = Lowering()  # the standard nodes the --target lowers
        # op types the output should not hold, and the --target's engines (MatchContext)
        self.avoid: frozenset[str] = frozenset()
        self.engines: tuple[str, ...] = ()
        # weights patterns built, by content: an equal one is stored once (as a replayed
        # template shares its template's), so building and replaying give the same bytes
        self.weight_pool: dict[tuple[str, bytes], str] = {}

    def rewrite_graph(self, scope: Scope, opsets: dict[str, int], ns: _Namespace) -> _Usage:
        graph = scope.graph
        usage = _Usage([graph])
        pool: ConstantPool = {}  # constants shared by this graph's replacements, this pass
        templates: dict[tuple[Any, ...], list[memo.Template]] = {}  # same scope as the pool
        if any(init.data_location == onnx.TensorProto.EXTERNAL for init in graph.initializer):
            self.needs_masking = True
        nodes = list(graph.node)
        standard = [self.classifier.is_standard(node, opsets) for node in nodes]
        rebuild = not all(standard)
        if rebuild:
            # The node list is written afresh, in place: replacements go straight into it
            # (the removed nodes stay valid objects, and kept ones are copied back).
            # Constant lookups and type inference must see the graph as it was, not half
            # rebuilt.
            scope.index_constants()
            self.types.load()
            del graph.node[:]
        for node, is_standard in zip(nodes, standard, strict=True):
            inner = [self.rewrite_graph(scope.child(
                sub, f"{scope.label} > {node.op_type} '{node.name}' {attr_label}"), opsets, ns)
                for attr_label, sub in subgraphs(node)]
            if not is_standard and \
                    self._rewrite_node(node, scope, opsets, pool, templates, usage, graph):
                ns.orphan_candidates.update(name for name in node.input if name)
                continue
            if not self.schema_classifier.is_standard(node, opsets):
                self.needs_masking = True
            if rebuild:
                graph.node.append(node)  # a copy: its graphs are the copy's from now on
                if inner:
                    usage.add_nodes(graph.node[-1:])
                    continue
            usage.reads.update(node.input)
            usage.domains.add(node.domain)
            for nested in inner:
                usage.merge(nested)
        return usage

    def _rewrite_node(self, node: onnx.NodeProto, scope: Scope, opsets: dict[str, int],
                      pool: ConstantPool, templates: dict[tuple[Any, ...], list[memo.Template]],
                      usage: _Usage, into: onnx.GraphProto) -> bool:
        """Whether ``node`` is replaced: then its replacement is appended to the nodes of
        ``into`` (its graph) and recorded in ``usage``."""
        def reject(reason: str) -> None:
            issue = NodeIssue(node.name, node.op_type, node.domain, scope.label, reason)
            if node.output and node.output[0] in self.target_lowering.soft and \
                    norm_domain(node.domain) == "":
                # --target portable's lowering of an op most engines compute wrongly: the
                # node is kept (ONNX Runtime and the engines that compute it right run it)
                why = self.target_lowering.reason(node.output[0])
                self.report.warnings.append(f"kept {issue.describe()} ({why})")
                return
            self.report.unsupported.append(issue)

        found = self.registry.lookup(node)
        if found is None:
            reject(_no_pattern_reason(node, self.target, opsets.get("", 0)))
            return False
        pattern, form = found
        opset = opsets.get("", 0)
        if opset == 0:
            reject("the model imports no default-domain opset, so standard ops cannot be "
                   f"added; import one (opset {MIN_OPSET} or newer) in opset_import")
            return False
        if opset < MIN_OPSET:
            reject(f"the model's default opset is {opset}; decomposer emits opset "
                   f"{MIN_OPSET}+ ops: convert the model first with "
                   f"onnx.version_converter.convert_version(model, {MIN_OPSET})")
            return False
        prefix = node.name or (node.output[0] if node.output else node.op_type)
        context = NodeContext(scope, self.types, opset, self.target, self.base_dir,
                              self.avoid, self.engines)
        key = memo.key(pattern, form, node) if self.reuse else None
        asked: dict[tuple[str, tuple[str, int]], Any] = {}  # this node's answers, by role
        variants = templates.get(key, []) if key is not None else []
        for index, earlier in enumerate(variants):
            count = memo.replay(earlier, node, context, prefix, self.tensor_names,
                                self.node_names, asked, into)
            if count is not None:
                # Most recent first: runs of alike nodes (a block repeated) then try the
                # matching template first. Any matching template gives the same nodes.
                variants.insert(0, variants.pop(index))
                if any(norm_domain(domain) for domain in earlier.domains):
                    self.emitted_candidates = True  # (a custom domain: maybe a candidate)
                usage.reads.update(memo.outside_reads(earlier, node))
                usage.domains |= earlier.domains
                self._replaced(node, scope, pattern.name, count, earlier.declared)
                return True
        builder = Builder(opset, prefix, self.tensor_names, self.node_names,
                          constant_pool=pool, target=self.target)
        try:
            try:
                recorder = memo.Recorder(context, node)
                matched = pattern.match(node, form)
                pattern.bind(matched, recorder)
                facts = pattern.check(matched, recorder)
            except UnknownTypes:
                # ONNX's inference left a tensor untyped (a contrib producer no pattern
                # knows, say): ask ONNX Runtime's, once per run, then try again
                if not self.types.add_runtime_inference():
                    raise
                recorder = memo.Recorder(context, node)
                matched = pattern.match(node, form)
                pattern.bind(matched, recorder)
                facts = pattern.check(matched, recorder)
            pattern.build(builder, matched, facts)
            declared = pattern.output_types(matched, recorder, facts) or []
        except Reject as why:
            # a contrib op's refused form still runs somewhere: say where it was measured
            where = f" ({_measured_engines(node)})" if contrib_support_known(node) else ""
            reject(f"pattern {pattern.name}: {why}{where}")
            return False
        except MemoryError:
            # a pattern that sized a constant from implausible attributes or shapes (each
            # should bound them first: checks.require_size); the model is at fault, not us
            reject(f"pattern {pattern.name}: the node's sizes ask for more memory than this "
                   "machine has for the constants it would build")
            return False
        except Exception as exc:
            if _is_too_big(exc):  # numpy's "array is too big": the MemoryError case above
                reject(f"pattern {pattern.name}: the node's sizes ask for more memory than "
                       "this machine has for the constants it would build")
                return False
            raise PatternBugError(_crash_message(pattern, node, exc, self.registry)) from exc
        produced = {out for new in builder.nodes for out in new.output}
        missing = [out for out in node.output if out and out not in produced]
        if missing:
            raise PatternBugError(f"pattern {pattern.name} did not write output(s) {missing} "
                                  f"of node '{node.name}'")
        failure = self._shapes_refused(node, builder, scope, opsets)
        if failure:
            reject(f"pattern {pattern.name}: the node's input shapes do not fit the standard "
                   f"ops it becomes ({failure})")
            return False
        builder.commit()
        if any(not self.classifier.is_standard(new, opsets)
               for new in walk_nodes(builder.nodes)):
            self.emitted_candidates = True
        # (replays copy these same ops, so checking the build covers them)
        if any(not self.schema_classifier.is_standard(new, opsets) for new in builder.nodes):
            self.needs_masking = True
        # A function body holds no initializers; below IR 4 every initializer must also be a
        # graph input, which a caller could then feed: weights become Constant nodes there.
        if scope.is_function or self.ir_version < 4:
            builder.nodes[:0] = [onnx.helper.make_node("Constant", [], [weight.name],
                                                       name=self.node_names.fresh(weight.name),
                                                       value=weight)
                                 for weight in builder.initializers]
            builder.bases[:0] = [None] * len(builder.initializers)
        else:
            scope.graph.initializer.extend(self._pooled_weights(builder, scope))
        if key is not None:
            kept = memo.template(node, builder, recorder, declared)
            variants = templates.setdefault(key, [])
            if kept is not None and len(variants) < memo.MAX_VARIANTS:
                variants.append(kept)
        into.node.extend(builder.nodes)
        usage.add_nodes(into.node[len(into.node) - len(builder.nodes):])  # the copies
        self._replaced(node, scope, pattern.name, len(builder.nodes), declared)
        return True

    def _pooled_weights(self, builder: Builder, scope: Scope) -> list[onnx.TensorProto]:
        """The builder's weights not yet stored in this name space; the builder's nodes read
        an equal one stored earlier instead of its own copy."""
        kept: list[onnx.TensorProto] = []
        renamed: dict[str, str] = {}
        for weight in builder.initializers:
            anonymous = onnx.TensorProto()
            anonymous.CopyFrom(weight)
            anonymous.name = ""
            key = (scope.namespace, hashlib.sha256(
                anonymous.SerializeToString(deterministic=True)).digest())
            earlier = self.weight_pool.get(key)
            if earlier is None:
                self.weight_pool[key] = weight.name
                kept.append(weight)
            else:
                renamed[weight.name] = earlier
        if renamed:
            for new in builder.nodes:
                for index, name in enumerate(new.input):
                    if name in renamed:
                        new.input[index] = renamed[name]
            builder.initializers[:] = kept
        return kept

    def _shapes_refused(self, node: onnx.NodeProto, builder: Builder, scope: Scope,
                        opsets: dict[str, int]) -> str | None:
        """ONNX shape inference on the replacement alone (see checking.replacement_failure);
        run once per build, so identical nodes replaying it pay nothing."""
        for name in node.output:
            if name and self.types.is_non_tensor(scope.namespace, name):
                # a pattern writes tensors: a declared sequence, map or optional stays wrong
                return f"output '{name}' is declared as a non-tensor value"
        produced = {out for new in builder.nodes for out in new.output}
        read = {name for new in builder.nodes for name in new.input if name}
        inputs = []
        pooled = builder.pool_constants(read - produced)
        pooled_names = {n.output[0] for n in pooled}
        for weight in builder.initializers:
            inputs.append(onnx.helper.make_tensor_value_info(weight.name, weight.data_type,
                                                             list(weight.dims)))
        weights = {weight.name for weight in builder.initializers}
        for name in sorted(read - produced - pooled_names - weights):
            if self.types.is_non_tensor(scope.namespace, name):
                return f"input '{name}' is not a tensor"
            tensor = self.types.tensor_type(scope.namespace, name)
            if tensor is None or not tensor.elem_type:
                return None  # an input of unknown type (a function body's): nothing to say
            value = onnx.ValueInfoProto(name=name)
            value.type.tensor_type.CopyFrom(tensor)
            inputs.append(value)
        used = {norm_domain(new.domain) for new in builder.nodes} | {""}
        imports = [onnx.helper.make_opsetid(domain, opsets.get(domain, 1))
                   for domain in sorted(used)]
        return replacement_failure(pooled + list(builder.nodes), inputs, imports)

    def _replaced(self, node: onnx.NodeProto, scope: Scope, pattern_name: str,
                  count: int, declared: Sequence[tuple[int | None, Any]]) -> None:
        self.rewritten_outputs.update(name for name in node.output if name)
        for name, (elem_type, shape) in zip(node.output, declared, strict=False):
            if name:
                self.types.record(scope.namespace, name, elem_type, shape)
        self.report.replaced.append(ReplacedNode(node.name, node.op_type, node.domain,
                                                 scope.label, pattern_name, count))


def _is_too_big(exc: BaseException) -> bool:
    """numpy's ValueError for an array larger than the address space."""
    return isinstance(exc, ValueError) and "array is too big" in str(exc)


def _crash_message(pattern: Any, node: onnx.NodeProto, exc: Exception,
                   registry: Registry) -> str:
    """What a pattern's crash says: the pattern, where it came from, the node, and the line
    of the pattern's own file the error came from (a user's pattern is theirs to fix)."""
    import inspect
    import traceback

    source = next((entry.source for entry in registry if entry.pattern is pattern),
                  "built-in")
    try:
        own_file = inspect.getfile(type(pattern))
    except (TypeError, OSError):
        own_file = ""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [frame for frame in frames if own_file and frame.filename == own_file]
    where = f" at {mine[-1].filename}:{mine[-1].lineno} (in {mine[-1].name})" if mine else ""
    whose = "" if source == "built-in" else \
        f" (from {source}: an error in that pattern, not in the model)"
    return (f"pattern {pattern.name}{whose} failed on node '{node.name}' "
            f"({node.domain or '<default domain>'}::{node.op_type}){where}: "
            f"{type(exc).__name__}: {exc}")


def _no_pattern_reason(node: onnx.NodeProto, target: str, opset: int = 0) -> str:
    if norm_domain(node.domain) == "" and onnx.defs.has(node.op_type):
        first = int(onnx.defs.get_schema(node.op_type, NEWEST_OPSET, "").since_version)
        for version in range(1, NEWEST_OPSET + 1):
            if has_schema(node.op_type, version, ""):
                first = version
                break
        return (f"ONNX defines {node.op_type} from opset {first}; opset {opset} has no such "
                f"op and no pattern lowers it; the lowest target that keeps it is {first}")
    if norm_domain(node.domain) in RUNTIME_ONLY_DOMAINS and target != "ort":
        return (f"an ONNX Runtime contrib op no pattern rewrites; {_measured_engines(node)}; "
                "target 'ort' (CLI: --target ort) keeps it for ONNX Runtime")
    return "no pattern rewrites this op; add one (see 'Writing a pattern' in the README)"


def contrib_support_known(node: onnx.NodeProto) -> bool:
    """Whether engine_support.json records the engines that run ``node``'s contrib op."""
    from decomposer.engine_support import contrib_support

    return contrib_support(node.domain, node.op_type) is not None


def _measured_engines(node: onnx.NodeProto) -> str:
    """What is measured about the engines running ``node``'s op (engine_support.json)."""
    from decomposer.engine_support import contrib_support, engine_label

    entry = contrib_support(node.domain, node.op_type)
    if entry is None:
        return "ONNX Runtime runs it; no other engine was measured with it"
    runs = ", ".join(engine_label(name) for name in entry["runs"])
    refused = "; ".join(f"{engine_label(name)} refuses it ({why})"
                        for name, why in entry.get("refused", {}).items())
    return f"measured: {runs} run it" + (f"; {refused}" if refused else "")


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


def _has_candidate(model: onnx.ModelProto, classifier: OpClassifier) -> bool:
    opsets = opset_map(list(model.opset_import))
    if any(not classifier.is_standard(n, opsets) for n in all_nodes(model.graph)):
        return True
    return any(not classifier.is_standard(node, function_opsets(opsets, function))
               for function in model.functions for node in function_nodes(function))


def run(model: onnx.ModelProto, *, registry: Registry | None = None,
        allow_unsupported: bool = False, check: bool = True, target: str = "portable",
        lower: Iterable[str] = (), base_dir: str | os.PathLike[str] | None = None,
        target_opset: int | None = None, input_shapes: Mapping[str, Any] | None = None,
        freeze_inputs: Mapping[str, Any] | None = None) -> tuple[onnx.ModelProto, Report]:
    """Rewrite ``model``; return the new model and the report. ``model`` is not mutated.

    ``input_shapes`` (input name -> dims) and ``freeze_inputs`` (input name -> values) fix
    the model's inputs first and fold what that decides (:mod:`decomposer.freezing`); so
    does a ``target`` whose engine needs static shape arithmetic (its profile's ``fold``).

    ``target_opset`` (11 to the newest) takes a model at a newer default-domain opset down
    to it (:mod:`decomposer.opsets`): its standard ops are rewritten to that opset's
    signatures, ops it does not define go to the lowering patterns, and custom nodes are
    decomposed straight at it. A node the target cannot say is an unsupported node (exit
    3, even with ``allow_unsupported``). At or above the model's opset nothing changes:
    decomposer never upgrades.

    ``base_dir`` is the folder of the file ``model`` came from: a pattern that repacks
    weights (``MatchContext.weight``) reads external ones from there.

    ``lower`` names standard default-domain op types to decompose even where the model's
    opset defines them (for an engine without a kernel for them); each must be an ONNX op
    that a registered pattern rewrites.

    Python's cyclic garbage collector is paused for the call (with calls overlapping in
    several threads, until the last one ends) and turned back on after if it was on: a
    rewrite allocates hundreds of thousands of short-lived objects, which
    reference counting frees, and the collector's passes over them are wasted work
    (measured in docs/performance.md, Tool cost).
    """
    with _collector_paused():
        return _run(model, registry=registry, allow_unsupported=allow_unsupported,
                    check=check, target=target, lower=lower, base_dir=base_dir,
                    target_opset=target_opset, input_shapes=input_shapes,
                    freeze_inputs=freeze_inputs)


_pause_lock = threading.Lock()
_pause_depth = 0  # calls of run() in progress, across threads
_resume_collector = False  # whether the collector was on when the first of them began


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off until the last of concurrent ``run()`` calls ends;
    back on then if it was on when the first began."""
    global _pause_depth, _resume_collector
    with _pause_lock:
        if _pause_depth == 0:
            _resume_collector = gc.isenabled()
            gc.disable()
        _pause_depth += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pause_depth -= 1
            if _pause_depth == 0 and _resume_collector:
                gc.enable()


def _run(model: onnx.ModelProto, *, registry: Registry | None,
         allow_unsupported: bool, check: bool, target: str,
         lower: Iterable[str], base_dir: str | os.PathLike[str] | None,
         target_opset: int | None = None, input_shapes: Mapping[str, Any] | None = None,
         freeze_inputs: Mapping[str, Any] | None = None) -> tuple[onnx.ModelProto, Report]:
    minus_one = minus_one_dims(model) if isinstance(model, onnx.ModelProto) else []
    if minus_one:  # an exporter's spelling of a dynamic dim (paddle2onnx): say it, keep going
        model = clear_minus_one_dims(model)
    validate_structure(model)
    chosen = resolve_target(target)
    target = chosen.mode
    if input_shapes or freeze_inputs or chosen.fold:
        model = fix_inputs(model, input_shapes, freeze_inputs, always_fold=chosen.fold)
    _check_target_opset(target_opset)
    registry = registry if registry is not None else default_registry()
    lowered = _lowerable(lower, registry)
    opsets = opset_map(list(model.opset_import))
    report = Report(opset=opsets.get("", 0), target=chosen.spelling, lowered=sorted(lowered))
    report.fixed_inputs = sorted({*(input_shapes or {}), *(freeze_inputs or {})})
    if minus_one:
        report.warnings.append(
            f"{', '.join(repr(name) for name in minus_one[:3])}"
            f"{' and others' if len(minus_one) > 3 else ''} declared a dim of -1, which ONNX "
            "does not define: written as a dynamic dim")
    report.folded = bool(input_shapes or freeze_inputs or chosen.fold)
    cap = chosen.opset_cap(model)
    if cap is not None and opsets.get("", 0) > cap:
        if cap < MIN_OPSET:
            raise InvalidModelError(f"target {chosen.spelling!r} needs opset {cap}, below "
                                    f"the {MIN_OPSET} decomposer writes")
        target_opset = min(target_opset or cap, cap)
    # The nodes the target's engines run wrongly or refuse, where a pattern lowers them.
    # Found at the opset the model will have, and again once it is taken down.
    landing = min(opsets.get("", 0), target_opset or opsets.get("", 0))
    target_lowering = _registered(chosen.lowering(model, landing), registry)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    local_functions = {(f.domain, f.name) for f in model.functions}
    # What onnx.checker can judge never depends on the target: it knows no runtime's
    # contrib ops, so those are always set aside as custom when checking.
    schema_classifier = OpClassifier(local_functions)
    # Calls of a model-local function of a custom domain are inlined for every target but
    # ONNX Runtime, which inlines them itself (OpenVINO's and TVM's importers refuse them).
    inline_functions = target != "ort"
    kept_calls = {(f.domain, f.name) for f in model.functions
                  if not (inline_functions and is_custom_function(f))}
    if kept_calls != local_functions:
        registry = with_model_functions(registry, model)
    classifier = OpClassifier(kept_calls, runtime_ops=_runtime_ops(target),
                              lowered=lowered | target_lowering.keys)
    source_opset = opsets.get("", 0)
    going_down = target_opset is not None and 0 < target_opset < source_opset
    type_hints: dict[str, onnx.TypeProto] | None = None
    if going_down:
        assert target_opset is not None
        if check:
            try:
                check_input(model, schema_classifier, full=True)
            except InvalidModelError:
                if not _drop_stale_value_info(out, schema_classifier, report, set()):
                    raise
        if inline_functions and reachable_calls(out):
            # Inlined at their own opset first: a body taken down on its own knows no
            # tensor types, which some down-conversions need (CastLike's target type).
            out = _inline_calls(out, target, base_dir, report)
        type_hints = {}
        _take_down(out, target_opset, report, registry, type_hints)
        if chosen.fold:  # the function bodies it wrote compute sizes at run time
            out = fold(out)
        opsets = opset_map(list(out.opset_import))
        target_lowering = target_lowering.union(_registered(chosen.lowering(out), registry))
        classifier = OpClassifier(kept_calls, runtime_ops=_runtime_ops(target),
                                  lowered=lowered | target_lowering.keys)
    elif not _has_candidate(out, classifier) and not report.folded:
        # Nothing to rewrite: hand the model back as it is, after the structural check
        # (full_check's strict shape inference rejects even some of ONNX's own test models).
        if check:
            check_input(model, schema_classifier, full=False)
        return out, report
    if check and not going_down:
        try:
            check_input(model, schema_classifier, full=True)
        except InvalidModelError:
            if not _drop_stale_value_info(out, schema_classifier, report, set()):
                raise

    report.lowered_nodes = sorted(target_lowering.keys)
    rewriter = _Rewriter(out, registry, report, classifier, schema_classifier, target,
                         None if base_dir is None else os.fspath(base_dir), type_hints)
    rewriter.target_lowering = target_lowering
    rewriter.avoid = lowered | chosen.lacked(opsets.get("", 0))
    rewriter.engines = chosen.engines
    main = _Namespace(list(all_nodes(model.graph)))
    # A custom function the main graph calls is inlined from its definition, and dropped
    # once no call is left: its body is not rewritten in place first.
    inlined = reachable_calls(model) if inline_functions else set()
    functions = [_FunctionJob(function, opsets) for function in out.functions
                 if not (is_custom_function(function) and function_key(function) in inlined)]
    # Passes: a node whose input types are only known once an upstream custom node is
    # rewritten (custom -> standard -> custom) is retried with fresh shape inference.
    # Patterns that declare their output types let plain chains resolve in one pass.
    # A replacement that writes candidates itself (a function body calling another
    # function) is followed by another pass, up to a depth no honest model reaches.
    for _ in range(MAX_PASSES):
        replaced_before = len(report.replaced)
        report.unsupported.clear()
        rewriter.needs_masking = False
        rewriter.emitted_candidates = False
        usage = rewriter.rewrite_graph(Scope(out.graph, "main graph", None), opsets, main)
        for job in functions:
            job.rewrite(rewriter)
        progress = len(report.replaced) > replaced_before
        if not progress or not (report.unsupported or rewriter.emitted_candidates):
            break
        rewriter.types = TypeTables(out, rewriter.type_hints)
    for job in functions:
        job.finish(report, opsets.get("", 0))
    if inline_functions and report.replaced:
        drop_inlined_functions(out, model, report)

    stuck = [issue for issue in report.unsupported if issue.domain == LOWERING_DOMAIN]
    if report.unsupported and (not allow_unsupported or stuck):
        lines = "\n  ".join(issue.describe() for issue in report.unsupported)
        raise UnsupportedNodeError(
            f"{len(report.unsupported)} node(s) cannot be decomposed:\n  {lines}",
            report.unsupported, report)

    if going_down:  # the hand-over domain of decomposer.opsets is empty now
        kept = [entry for entry in out.opset_import if entry.domain != LOWERING_DOMAIN]
        del out.opset_import[:]
        out.opset_import.extend(kept)
    remove_orphans(usage.graphs, main.orphan_candidates, report, usage.reads)
    if report.replaced:
        cancel_inverse_transposes(out.graph, {node_signature(node)
                                              for node in main.nodes_before})
    drop_unused_imports(out.opset_import, used_domains(main.nodes_before),
                        {norm_domain(domain) for domain in usage.domains}, report,
                        keep=function_domains(out))
    if chosen.fold and report.replaced:  # the replacements' size arithmetic, folded too
        folded = fold(out)
        out.CopyFrom(folded)
    if check:
        try:
            check_output(out, schema_classifier, rewriter.rewritten_outputs,
                         rewriter.needs_masking)
        except CheckFailedError:
            # The input's own stale value_info, hidden from its check behind a custom node
            # (onnx.checker skips inference past a domain it does not know).
            if not _drop_stale_value_info(out, schema_classifier, report,
                                          rewriter.rewritten_outputs):
                _blame_the_input(model, out, rewriter.rewritten_outputs)
                raise
            check_output(out, schema_classifier, rewriter.rewritten_outputs)
    return out, report


def _inline_calls(model: onnx.ModelProto, target: str,
                  base_dir: str | os.PathLike[str] | None, report: Report) -> onnx.ModelProto:
    """``model`` with the calls of its custom model-local functions inlined (nothing else
    rewritten); what was inlined is added to ``report``."""
    only_functions = Registry()
    for pattern in function_patterns(model.functions, "model-local function"):
        only_functions.register(pattern, source="model-local function")
    inlined, first = _run(model, registry=only_functions, allow_unsupported=True,
                          check=False, target=target, lower=(), base_dir=base_dir)
    report.replaced.extend(first.replaced)
    report.inlined_functions = first.inlined_functions
    return inlined


def _check_target_opset(target_opset: int | None) -> None:
    if target_opset is None:
        return
    if isinstance(target_opset, bool) or not isinstance(target_opset, int) or \
            not MIN_OPSET <= target_opset <= NEWEST_OPSET:
        raise InvalidModelError(f"target opset {target_opset!r} is out of range: decomposer "
                                f"writes default-domain opsets {MIN_OPSET} to {NEWEST_OPSET}")


def _take_down(out: onnx.ModelProto, target_opset: int, report: Report,
               registry: Registry, source_types: dict[str, onnx.TypeProto]) -> None:
    """Standard ops down to ``target_opset`` (decomposer.opsets); what the target cannot
    say stops the run whatever ``allow_unsupported`` says: no engine could read it."""
    report.source_opset = report.opset
    report.opset = target_opset
    def has_pattern(op_type: str) -> bool:
        return registry.lookup(onnx.helper.make_node(op_type, [], [])) is not None

    refusals = take_down(out, target_opset, has_pattern, source_types)
    report.taken_down = True
    if refusals:
        issues = [NodeIssue(r.name, r.op_type, "", r.graph, r.describe(target_opset))
                  for r in refusals]
        report.unsupported.extend(issues)
        lines = "\n  ".join(issue.describe() for issue in issues)
        raise UnsupportedNodeError(
            f"{len(issues)} node(s) cannot go down to opset {target_opset}:\n  {lines}",
            issues, report)


def _blame_the_input(model: onnx.ModelProto, out: onnx.ModelProto,
                     rewritten: set[str]) -> None:
    """Raise InvalidModelError if the output's check fails at a node the input already had
    (same name, none of its outputs rewritten): the input's declared types contradict it,
    which its own check could not see past a custom node."""
    failure = checker_failure(out, OpClassifier(set()), full=True)
    if not failure:
        return
    clash = set(CLASH.findall(failure))
    original = {node.name for node in model.graph.node if node.name}
    ours = {node.name for node in out.graph.node if node.name in original
            and not any(o in rewritten for o in node.output)}
    if clash and clash <= ours:
        raise InvalidModelError(
            f"the input model is invalid (onnx.checker, once its custom nodes were "
            f"rewritten): {failure}; fix the declared type or shape in the export")


def _drop_stale_value_info(model: onnx.ModelProto, classifier: OpClassifier, report: Report,
                           rewritten: set[str]) -> bool:
    """Drop the main graph's value_info entries that contradict their (not rewritten)
    producers, if that is what makes ``model`` fail the check; record them in ``report``."""
    stale = [name for name in stale_value_info(model, classifier) if name not in rewritten]
    if not stale:
        return False
    kept = [value for value in model.graph.value_info if value.name not in stale]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    report.dropped_value_info = sorted({*report.dropped_value_info, *stale})
    return True


def _registered(lowering: Lowering, registry: Registry) -> Lowering:
    """``lowering`` without the nodes no registered pattern rewrites (a user's registry
    that lacks the built-in lowering patterns)."""
    def known(op_type: str) -> bool:
        return registry.lookup(onnx.helper.make_node(op_type, [], [])) is not None

    return lowering.only(known)


def _lowerable(names: Iterable[str], registry: Registry) -> frozenset[str]:
    """The op types of ``lower``, checked: each is a standard ONNX op a pattern rewrites."""
    if isinstance(names, str):  # a lone name, not its letters
        names = [names]
    lowered = frozenset(names)
    for op_type in sorted(lowered):
        if not onnx.defs.has(op_type):
            raise InvalidModelError(f"cannot lower {op_type!r}: it is not a standard ONNX op "
                                    "(custom ops are decomposed without asking)")
        if registry.lookup(onnx.helper.make_node(op_type, [], [])) is None:
            choices = sorted({op for entry in registry for form in entry.pattern.spellings()
                              if form.domains is None or "" in form.domains
                              for op in form.op_types if onnx.defs.has(op)})
            raise InvalidModelError(f"cannot lower {op_type!r}: no pattern rewrites it"
                                    + (f" (lowerable: {', '.join(choices)})" if choices else ""))
    return lowered


def _runtime_ops(target: str) -> frozenset[tuple[str, str]]:
    """(domain, op_type) of the non-ONNX kernels the target runtime has: under ``ort``, ONNX
    Runtime's contrib ops, and its own default-domain registrations that no ONNX schema
    covers (an op ONNX lacks, or one ONNX Runtime registered before ONNX defined it); none
    under ``portable``."""
    if target != "ort":
        return frozenset()
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
    except ImportError:  # pragma: no cover - onnxruntime is a dependency
        return frozenset()
    found = set()
    for kernel in ort_state.get_all_opkernel_def():
        if not is_default_domain(kernel.domain) or \
                not has_schema(kernel.op_name, kernel.version_range[0], ""):
            found.add((norm_domain(kernel.domain), kernel.op_name))
    return frozenset(found)


class _FunctionJob:
    """Rewrites one model-local function body, in as many passes as the main graph."""

    def __init__(self, function: onnx.FunctionProto, model_opsets: dict[str, int]) -> None:
        self.function = function
        self.opsets = function_opsets(model_opsets, function)
        self.label = function_label(function)
        self.ns = _Namespace(list(function_nodes(function)))
        self.domains_before = used_domains(self.ns.nodes_before)
        self.changed = False

    def _as_graph(self) -> onnx.GraphProto:
        """The body wrapped in a graph (outputs named), so graph code can walk it."""
        shell = onnx.GraphProto()
        shell.node.extend(self.function.node)
        shell.output.extend(onnx.ValueInfoProto(name=o) for o in self.function.output)
        return shell

    def _take_nodes(self, shell: onnx.GraphProto) -> None:
        del self.function.node[:]
        self.function.node.extend(shell.node)

    def rewrite(self, rewriter: _Rewriter) -> None:
        shell = self._as_graph()
        before = len(rewriter.report.replaced)
        rewriter.rewrite_graph(Scope(shell, self.label, None, namespace=self.label,
                                     is_function=True), self.opsets, self.ns)
        if len(rewriter.report.replaced) > before:
            self.changed = True
            self._take_nodes(shell)

    def finish(self, report: Report, default_opset: int) -> None:
        if not self.changed:
            return
        shell = self._as_graph()
        remove_orphans(list(all_graphs(shell)), self.ns.orphan_candidates, report)
        self._take_nodes(shell)
        function = self.function
        if not any(norm_domain(i.domain) == "" for i in function.opset_import):
            function.opset_import.append(onnx.helper.make_opsetid("", default_opset))
        drop_unused_imports(function.opset_import, self.domains_before,
                            used_domains(function_nodes(function)), report)
