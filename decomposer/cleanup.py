"""Clean-up after a rewrite: constants and opset imports that only replaced nodes used.

In: the rewritten graphs of one name space (a main graph with its subgraphs, or a function
body wrapped in a graph), the replaced nodes' input names, the domains in use before and
after. Out: the same protos, minus Constant nodes / initializers that fed only replaced
nodes and opset imports of domains nothing uses any more; the report counts what went.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import onnx

from decomposer.graphs import all_graphs, function_nodes, norm_domain
from decomposer.report import Report


def used_domains(nodes: Iterable[onnx.NodeProto]) -> set[str]:
    return {norm_domain(node.domain) for node in nodes}


def function_domains(model: onnx.ModelProto) -> set[str]:
    """Domains a model-level import must keep because local functions' nodes use them."""
    used: set[str] = set()
    for function in model.functions:
        used |= used_domains(function_nodes(function))
        used.add(norm_domain(function.domain))
    return used


def drop_unused_imports(imports: Any, before: set[str],
                        after: set[str], report: Report, keep: set[str] | None = None) -> None:
    """Remove imports of domains that replaced nodes used and nothing uses any more."""
    gone = (before - after - (keep or set())) - {""}
    if not gone:
        return
    current = list(imports)
    kept = [imp for imp in current if norm_domain(imp.domain) not in gone]
    dropped = [imp.domain for imp in current if norm_domain(imp.domain) in gone]
    del imports[:]
    imports.extend(kept)
    report.dropped_opset_imports.extend(d for d in dropped
                                        if d not in report.dropped_opset_imports)


def remove_orphans(graphs: list[onnx.GraphProto], candidates: set[str],
                   report: Report, reads: set[str] | None = None) -> None:
    """Drop Constant nodes and initializers that fed only replaced nodes.

    ``graphs`` is one name space; ``candidates`` are the replaced nodes' input names;
    ``reads``, if the caller knows them, the names the graphs' nodes read (else a walk
    finds them).
    """
    if not candidates:
        return
    used: set[str] = set()
    for graph in graphs:
        if reads is None:
            for node in graph.node:
                used.update(node.input)
        used.update(value.name for value in graph.output)
    used |= reads or set()
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


def node_signature(node: onnx.NodeProto) -> tuple[Any, ...]:
    """What tells a node of the input model from one a pattern wrote."""
    return (node.name, node.op_type, node.domain, tuple(node.input), tuple(node.output))


def cancel_inverse_transposes(graph: onnx.GraphProto, originals: set[tuple[Any, ...]]) -> int:
    """Remove Transpose pairs that undo each other, where a pattern wrote at least one of
    the two (a layout pattern's Transpose back to NHWC meeting the next one's to NCHW, or
    the model's own layout Transpose): the second one's readers read the first one's input,
    and the first one goes too when nothing else reads it. ``originals``: the input model's
    :func:`node_signature` set (a pair of the model's own is left as it was). Graph outputs,
    and tensors a subgraph reads, are never renamed. How many Transposes went."""
    outer_reads = {name for inner in list(all_graphs(graph))[1:] for node in inner.node
                   for name in node.input}
    graph_outputs = {value.name for value in graph.output}
    protected = graph_outputs | outer_reads
    removed = 0
    while True:
        producer = {out: node for node in graph.node for out in node.output}
        readers: dict[str, int] = {}
        for node in graph.node:
            for name in node.input:
                readers[name] = readers.get(name, 0) + 1
        pair = next((found for found in (_inverse_pair(node, producer, originals,
                                                       outer_reads)
                                         for node in graph.node) if found), None)
        if pair is None:
            return removed
        first, second = pair
        source, gone = first.input[0], second.output[0]
        drop = [second]
        if gone in graph_outputs:
            # the graph output keeps its name: the second Transpose becomes an Identity
            second.op_type = "Identity"
            del second.attribute[:]
            second.input[0] = source
            drop = []
        else:
            for node in graph.node:
                for index, name in enumerate(node.input):
                    if name == gone:
                        node.input[index] = source
        if readers.get(first.output[0], 0) == 1 and first.output[0] not in protected:
            drop.append(first)
        dead = {out for node in drop for out in node.output}
        kept_nodes = [node for node in graph.node if all(node is not d for d in drop)]
        del graph.node[:]
        graph.node.extend(kept_nodes)
        kept_info = [value for value in graph.value_info if value.name not in dead]
        del graph.value_info[:]
        graph.value_info.extend(kept_info)
        removed += len(drop) + (1 if gone in graph_outputs else 0)


def _perm(node: onnx.NodeProto) -> list[int] | None:
    for attr in node.attribute:
        if attr.name == "perm":
            return list(attr.ints)
    return None  # the default reverses the axes: its rank is not known here


def _inverse_pair(second: onnx.NodeProto, producer: dict[str, onnx.NodeProto],
                  originals: set[tuple[Any, ...]], protected: set[str]
                  ) -> tuple[onnx.NodeProto, onnx.NodeProto] | None:
    if second.op_type != "Transpose" or norm_domain(second.domain) != "" or \
            second.output[0] in protected:
        return None
    first = producer.get(second.input[0])
    if first is None or first.op_type != "Transpose" or norm_domain(first.domain) != "":
        return None
    if node_signature(first) in originals and node_signature(second) in originals:
        return None
    inner, outer = _perm(first), _perm(second)
    if inner is None or outer is None or len(inner) != len(outer):
        return None
    if [inner[axis] for axis in outer] != list(range(len(inner))):
        return None
    return first, second

