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

from decomposer.graphs import function_nodes, norm_domain
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
