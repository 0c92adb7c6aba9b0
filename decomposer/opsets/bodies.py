"""Ops the target lacks: folded to Constants when their inputs are constants, else replaced by
ONNX's own function body for the op, bound to the node and taken down in turn.

In: a node, the source and target opsets, the facts of its name space. Out: the nodes that
replace it (or None: a pattern or a refusal is then its fate).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from decomposer.graphs import all_graphs, norm_domain, subgraphs
from decomposer.opsets.core import _FOLDABLE, _Facts, _schema, evaluate_node

_RANDOM = frozenset({"Bernoulli", "Multinomial", "RandomNormal", "RandomNormalLike",
                     "RandomUniform", "RandomUniformLike"})
_NEW_OP_FOLD_LIMIT = 1 << 20  # elements: a mel filter bank or a window, not a weight


def _folded_new_op(node: onnx.NodeProto, source: int, target: int, facts: _Facts
                   ) -> list[onnx.NodeProto] | None:
    """An op the target lacks whose inputs are all constants (a MelWeightMatrix or a window
    of constant sizes) as Constant nodes of its outputs, computed by ONNX's reference
    implementation; None otherwise."""
    if _schema(node.op_type, target) is not None or node.op_type in _RANDOM or \
            _schema(node.op_type, source) is None or any(subgraphs(node)):
        return None
    values = [facts.constants.get(name) if name else None for name in node.input]
    if any(value is None for name, value in zip(node.input, values, strict=True) if name):
        return None
    outputs = evaluate_node(node, values, source)
    if outputs is None or sum(a.size for a in outputs) > _NEW_OP_FOLD_LIMIT:
        return None  # the op is lowered otherwise
    written = [name for name in node.output if name]
    arrays = [a for name, a in zip(node.output, outputs, strict=True) if name]
    for name, array in zip(written, arrays, strict=True):
        facts.constants[name] = array
    return [helper.make_node("Constant", [], [name], name=node.name if i == 0 else
                             f"{node.name}_{i}", value=numpy_helper.from_array(array, name))
            for i, (name, array) in enumerate(zip(written, arrays, strict=False))]



def _expansion(node: onnx.NodeProto, source: int, target: int, facts: _Facts,
               fresh: Callable[[str], str], has_pattern: Callable[[str], bool]
               ) -> tuple[list[onnx.NodeProto], int] | None:
    """The nodes of ONNX's function body for ``node`` (an op the target lacks, that no
    pattern lowers), bound to its inputs, outputs and attributes, and the body's opset;
    None where there is no body (or its context is unknown)."""
    if _schema(node.op_type, target) is not None or has_pattern(node.op_type):
        return None
    schema = _schema(node.op_type, source)
    if schema is None:
        return None
    function = _function_body(node, schema, facts)
    if function is None:
        return None
    version = next((int(i.version) for i in function.opset_import
                    if norm_domain(i.domain) == ""), source)
    prefix = node.name or (node.output[0] if node.output else node.op_type)
    return _bind(function, node, schema, fresh, prefix), version


def _function_body(node: onnx.NodeProto, schema: Any, facts: _Facts
                   ) -> onnx.FunctionProto | None:
    if schema.has_function:
        versions = sorted(schema.function_opset_versions)
        body = schema.get_function_with_opset_version(versions[0]) if versions else \
            schema.function_body
        if isinstance(body, bytes):
            parsed = onnx.FunctionProto()
            parsed.ParseFromString(body)
            body = parsed
        return body if body.node else None
    if not schema.has_context_dependent_function:
        return None
    types = []
    for name in node.input:
        type_proto = onnx.TypeProto()
        if name:
            elem = facts.types.get(name)
            if elem is None:
                return None
            type_proto.tensor_type.elem_type = elem
            shape = facts.shapes.get(name)
            if shape is not None:
                type_proto.tensor_type.shape.SetInParent()
                for dim in shape:
                    entry = type_proto.tensor_type.shape.dim.add()
                    if isinstance(dim, int):
                        entry.dim_value = dim
                    elif dim:
                        entry.dim_param = dim
        types.append(type_proto.SerializeToString())
    versions = sorted(schema.context_dependent_function_opset_versions)
    try:
        raw = schema.get_context_dependent_function_with_opset_version(
            versions[0], node.SerializeToString(), types) if versions else \
            schema.get_context_dependent_function(node.SerializeToString(), types)
    except Exception:  # the body's builder refused this context  # noqa: BLE001
        return None
    function = onnx.FunctionProto()
    function.ParseFromString(raw)
    return function if function.node else None


def _bind(function: onnx.FunctionProto, node: onnx.NodeProto, schema: Any,
          fresh: Callable[[str], str], prefix: str) -> list[onnx.NodeProto]:
    """The body's nodes with formal names bound to the node's, internal names fresh and
    attribute references resolved (the caller's value, else the schema's default, else
    the attribute is left out)."""
    names: dict[str, str] = {"": ""}
    for index, formal in enumerate(function.input):
        names[formal] = node.input[index] if index < len(node.input) else ""
    for index, formal in enumerate(function.output):
        names[formal] = node.output[index] if index < len(node.output) and \
            node.output[index] else fresh(f"{prefix}/{formal}")
    given = {a.name: a for a in node.attribute}
    for name, declared in schema.attributes.items():
        if name not in given and declared.default_value.name:
            given[name] = declared.default_value

    def rename(name: str) -> str:
        if name not in names:
            names[name] = fresh(f"{prefix}/{name}")
        return names[name]

    def bind_node(body_node: onnx.NodeProto) -> onnx.NodeProto | None:
        out = onnx.NodeProto()
        out.CopyFrom(body_node)
        out.input[:] = [rename(n) for n in body_node.input]
        out.output[:] = [rename(n) for n in body_node.output]
        out.name = fresh(f"{prefix}/{body_node.name or body_node.op_type}")
        del out.attribute[:]
        for attribute in body_node.attribute:
            if attribute.ref_attr_name:
                value = given.get(attribute.ref_attr_name)
                if value is None:
                    continue
                bound = onnx.AttributeProto()
                bound.CopyFrom(value)
                bound.name = attribute.name
                out.attribute.append(bound)
            else:
                copied = out.attribute.add()
                copied.CopyFrom(attribute)
                if copied.type == onnx.AttributeProto.GRAPH:
                    bind_graph(copied.g)
                elif copied.type == onnx.AttributeProto.GRAPHS:
                    for graph in copied.graphs:
                        bind_graph(graph)
        if body_node.op_type == "Constant" and not out.attribute:
            return None  # a Constant of an attribute the caller left out: unread
        return out

    def bind_graph(graph: onnx.GraphProto) -> None:
        for value in [*graph.input, *graph.output]:
            value.name = rename(value.name)
        bound_nodes = [bind_node(n) for n in graph.node]
        del graph.node[:]
        graph.node.extend(n for n in bound_nodes if n is not None)

    return [n for n in (bind_node(b) for b in function.node) if n is not None]


def _fold_body(holder: onnx.GraphProto, facts: _Facts) -> None:
    """A function body's Shape/Size/Range chains over static shapes become Constants:
    the body computes sizes at run time for every context, and some engines (TVM) cannot
    take a Size of a shape."""
    folded: list[onnx.NodeProto] = []
    for node in holder.node:
        outputs = [name for name in node.output if name]
        values = [facts.constant(name) for name in outputs] \
            if node.op_type in _FOLDABLE and node.op_type != "Constant" and outputs else []
        if values and all(v is not None for v in values):
            folded.extend(helper.make_node("Constant", [], [name], name=f"{node.name}_{i}"
                                           if i else node.name,
                                           value=numpy_helper.from_array(
                                               np.asarray(value), name))
                          for i, (name, value) in enumerate(zip(outputs, values,
                                                                strict=True)))
        else:
            folded.append(node)
    del holder.node[:]
    holder.node.extend(folded)


def _drop_dead_body(holder: onnx.GraphProto, outputs: set[str]) -> None:
    """The body's size computations that nothing reads once folded or turned into
    attributes (its names are its own: only its nodes read them, besides ``outputs``)."""
    while True:
        read = {name for node in holder.node for name in node.input} | outputs
        for node in holder.node:
            for _, sub in subgraphs(node):
                read.update(name for inner in sub.node for name in inner.input)
        kept = [node for node in holder.node if not (
            node.op_type in _FOLDABLE and node.output and
            not any(name in read for name in node.output if name))]
        if len(kept) == len(holder.node):
            return
        del holder.node[:]
        holder.node.extend(kept)


def _learn_body(holder: onnx.GraphProto, facts: _Facts, version: int) -> None:
    """Types and shapes inside an expanded body, by shape inference on the body alone with
    its inputs typed from what is known."""
    produced = {name for node in holder.node for name in node.output}
    read = [name for node in holder.node for name in node.input if name and
            name not in produced]
    graph = onnx.GraphProto()
    graph.CopyFrom(holder)
    graph.name = "body"
    for name in dict.fromkeys(read):
        elem = facts.types.get(name)
        if elem is None:
            continue
        shape = facts.shapes.get(name)
        graph.input.append(helper.make_tensor_value_info(
            name, elem, None if shape is None else list(shape)))
    graph.output.extend(onnx.ValueInfoProto(name=n.output[0]) for n in holder.node
                        if n.output)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)])
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - inference is a help here
        inferred = model
    for graph in all_graphs(inferred.graph):  # the body's own subgraphs (a Loop's) too
        facts.learn(graph)
    for node in holder.node:
        for name in node.output:
            if name:
                facts.producer_opsets[name] = version


