"""Walking ONNX graphs, and telling standard ops from custom ones.

In: ``ModelProto`` / ``GraphProto`` / ``NodeProto`` objects. Out: iterators over every node
and graph at any depth (If/Loop/Scan bodies included), opset maps, and ``OpClassifier``,
which answers "is this node a standard op at its imported opset?" from ``onnx.defs``
alone: nothing here knows any op by name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import onnx
from onnx import AttributeProto

DEFAULT_DOMAINS = ("", "ai.onnx")


def norm_domain(domain: str) -> str:
    return "" if domain in DEFAULT_DOMAINS else domain


# -- walking ------------------------------------------------------------------------------


def subgraphs(node: onnx.NodeProto) -> Sequence[tuple[str, onnx.GraphProto]]:
    """(attribute label, graph) of each graph-valued attribute of ``node``."""
    if not node.attribute or not _may_hold_graphs(node.domain, node.op_type):
        return ()
    found = []
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            found.append((attr.name, attr.g))
        elif attr.type == AttributeProto.GRAPHS:
            found.extend((f"{attr.name}[{index}]", graph)
                         for index, graph in enumerate(attr.graphs))
    return found


_ATTRIBUTE_TYPES: dict[tuple[str, str], frozenset[int] | None] = {}
_GRAPH_TYPES = frozenset({AttributeProto.GRAPH, AttributeProto.GRAPHS})


def may_hold(domain: str, op_type: str, types: frozenset[int]) -> bool:
    """Whether a node of this op may carry an attribute of one of ``types``
    (``AttributeProto`` type codes): False for a standard op whose schema declares none
    (onnx.checker and every runtime reject any other attribute on it), so walking a large
    model need not look through every node's attributes; True for a custom op."""
    key = (domain, op_type)
    if key not in _ATTRIBUTE_TYPES:
        try:
            schema = onnx.defs.get_schema(op_type, norm_domain(domain))
        except (onnx.defs.SchemaError, TypeError):  # TypeError: a name that is not UTF-8
            _ATTRIBUTE_TYPES[key] = None
        else:
            _ATTRIBUTE_TYPES[key] = frozenset(int(attribute.type.value)  # type: ignore[attr-defined]
                                              for attribute in schema.attributes.values())
    declared = _ATTRIBUTE_TYPES[key]
    return declared is None or not declared.isdisjoint(types)


def _may_hold_graphs(domain: str, op_type: str) -> bool:
    return may_hold(domain, op_type, _GRAPH_TYPES)


def walk_nodes(nodes: Iterable[onnx.NodeProto]) -> Iterator[onnx.NodeProto]:
    """The given nodes and every node nested in their graph attributes, depth first."""
    for node in nodes:
        yield node
        for _, sub in subgraphs(node):
            yield from walk_nodes(sub.node)


def all_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    return walk_nodes(graph.node)


def all_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for _, sub in subgraphs(node):
            yield from all_graphs(sub)


# -- which nodes are standard ---------------------------------------------------------------


class OpClassifier:
    """Answers "is this node a standard op?" with a cache, since models repeat ops."""

    def __init__(self, local_functions: set[tuple[str, str]],
                 runtime_ops: frozenset[tuple[str, str]] = frozenset(),
                 lowered: frozenset[str] = frozenset()) -> None:
        # runtime_ops: (domain, op_type) of non-ONNX ops the target runtime implements
        # itself (ONNX Runtime's contrib ops under --target ort); they need no rewrite.
        # lowered: default-domain op types the user asked to decompose even where the
        # opset defines them (--lower), for engines that lack a kernel for them; an entry
        # "OpType:output" names one node (by its first output), which its --target's
        # engine computes wrongly or refuses under a condition (its attributes, say).
        self._local_functions = local_functions
        self._runtime_ops = runtime_ops
        self._lowered = frozenset(entry for entry in lowered if ":" not in entry)
        self._lowered_nodes = frozenset(entry for entry in lowered if ":" in entry)
        self._cache: dict[tuple[str, str, int | None], bool] = {}  # (raw domain, op, version)

    def is_standard(self, node: onnx.NodeProto, opsets: dict[str, int]) -> bool:
        domain = node.domain
        if self._lowered_nodes and node.output and norm_domain(domain) == "" and \
                lowered_node_key(node) in self._lowered_nodes:
            return False
        version = opsets.get(norm_domain(domain))
        key = (domain, node.op_type, version)
        known = self._cache.get(key)
        if known is None:
            known = self._classify(domain, node.op_type, version)
            self._cache[key] = known
        return known

    def _classify(self, raw_domain: str, op_type: str, version: int | None) -> bool:
        domain = norm_domain(raw_domain)
        if (raw_domain, op_type) in self._local_functions:
            return True
        if (domain, op_type) in self._runtime_ops:
            return True
        if domain == "" and op_type in self._lowered:
            return False
        return version is not None and has_schema(op_type, version, domain)


def lowered_node_key(node: onnx.NodeProto) -> str:
    """How a ``lowered`` set names one node: ``"OpType:first output"``."""
    return f"{node.op_type}:{node.output[0]}"


def has_schema(op_type: str, version: int, domain: str) -> bool:
    try:
        onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return False
    return True


def opset_map(imports: list[onnx.OperatorSetIdProto]) -> dict[str, int]:
    return {norm_domain(imp.domain): imp.version for imp in imports}


def is_default_domain(domain: str) -> bool:
    return domain in DEFAULT_DOMAINS


def function_nodes(function: onnx.FunctionProto) -> Iterator[onnx.NodeProto]:
    """Every node of a function body, at any depth."""
    return walk_nodes(function.node)


def function_subgraphs(function: onnx.FunctionProto) -> Iterator[onnx.GraphProto]:
    """Every graph nested in a function body (If/Loop/Scan bodies), at any depth."""
    for node in function.node:
        for _, sub in subgraphs(node):
            yield from all_graphs(sub)


def model_nodes(model: onnx.ModelProto) -> Iterator[onnx.NodeProto]:
    """Every node of the model: main graph, nested graphs and local functions."""
    yield from all_nodes(model.graph)
    for function in model.functions:
        yield from function_nodes(function)


def function_opsets(model_opsets: dict[str, int], function: onnx.FunctionProto
                    ) -> dict[str, int]:
    """The opsets a function body sees: the model's, overridden by the function's own."""
    return {**model_opsets, **opset_map(list(function.opset_import))}


def externals_as_inputs(source: onnx.GraphProto, target: onnx.GraphProto,
                        keep: Callable[[onnx.TensorProto], bool]) -> None:
    """Copy ``source``'s initializers into ``target``, except that those ``keep`` refuses
    become typed graph inputs (unless already declared as inputs): their bytes are not
    needed to check or infer the graph, and external ones may not be readable from here."""
    declared = {value.name for value in target.input}
    for init in source.initializer:
        if keep(init):
            target.initializer.append(init)
        elif init.name not in declared:
            target.input.append(onnx.helper.make_tensor_value_info(
                init.name, init.data_type, list(init.dims)))
