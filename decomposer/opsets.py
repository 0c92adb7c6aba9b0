"""Moving a model at opset 18 down to an older default-domain opset (11-17).

In: a ``ModelProto`` whose default-domain import is newer than the target (torch's
exporter writes 18 whatever opset is asked for). Out: a copy at the target opset with the
same meaning, or :class:`decomposer.ExportError` naming the node that the older opset
cannot say and the opset that can.

onnx's own version converter has no down-adapter for most ops (Add-14, Shape-15,
Split-18, Pad-18, BatchNormalization-15 ...), though between 11 and 18 the ops torch writes
changed meaning only where an attribute became an input. So: axes/split inputs become
attributes again (they must be constants); Shape(start, end) becomes Shape -> Slice; an
attribute the older op lacks must hold its default and is dropped, as is an empty trailing
input; an op the older opset does not have is refused. Needs no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from decomposer.errors import ExportError
from decomposer.graphs import all_graphs

__all__ = ["convert_opset", "default_opset"]

# Ops whose axes (or split sizes) became an input: below this opset they are an attribute.
# (The Reduce ops' noop_with_empty_axes appeared with the input; onnx keeps it as is.)
_AXES_INPUT_SINCE = {"ReduceSum": 13, "Squeeze": 13, "Unsqueeze": 13, "Split": 13,
                     **{name: 18 for name in (
                         "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                         "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum",
                         "ReduceLogSumExp")}}


def default_opset(model: onnx.ModelProto) -> int | None:
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return None


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Inline initializers and Constant-node values of every graph, by name."""
    from onnx import numpy_helper

    found: dict[str, np.ndarray] = {}
    for graph in all_graphs(model.graph):
        for tensor in graph.initializer:
            if tensor.data_location != TensorProto.EXTERNAL:
                found[tensor.name] = numpy_helper.to_array(tensor)
        for node in graph.node:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    found[node.output[0]] = numpy_helper.to_array(value)
    return found


def convert_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` (default-domain opset 18 or older) rewritten for the older ``opset``, as
    the module docstring says; ``model`` itself is not changed."""
    from onnx import defs

    source_opset = default_opset(model) or 18
    out = onnx.ModelProto()
    out.CopyFrom(model)
    constants = _constants(out)
    taken = {name for graph in all_graphs(out.graph) for node in graph.node
             for name in node.output}
    detached: set[str] = set()
    ranks = {value.name: len(value.type.tensor_type.shape.dim)
             for graph in all_graphs(out.graph)
             for value in [*graph.input, *graph.value_info, *graph.output]
             if value.type.tensor_type.HasField("shape")}
    for graph in all_graphs(out.graph):
        nodes: list[onnx.NodeProto] = []
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                nodes.append(node)
                continue
            try:
                target_schema = defs.get_schema(node.op_type, opset, "")
                source_schema = defs.get_schema(node.op_type, source_opset, "")
            except defs.SchemaError:
                first = _first_opset(node.op_type)
                raise ExportError(f"node '{node.name}' is {node.op_type}, which ONNX defines "
                                  f"from opset {first} on; export at opset >= {first}") from None
            if target_schema.since_version == source_schema.since_version:
                nodes.append(node)
                continue
            detached.update(_axes_to_attribute(node, opset, constants))
            _softmax_axis(node, opset, ranks)
            nodes.extend(_resize_inputs(node, opset, taken))
            _reshape_allowzero(node, constants)
            bounds = _fit_attributes(node, opset, target_schema, source_schema)
            while len(node.input) > target_schema.max_input and not node.input[-1]:
                node.input.pop()
            if len(node.input) > target_schema.max_input:
                raise ExportError(f"node '{node.name}' ({node.op_type}) has "
                                  f"{len(node.input)} inputs; opset {opset} takes "
                                  f"{target_schema.max_input}; export at a newer opset")
            nodes.append(node)
            if bounds:
                nodes.extend(_slice_shape(node, bounds, taken))
        del graph.node[:]
        graph.node.extend(nodes)
    for entry in out.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = opset
    _drop_unused(out, detached)
    return out


def _drop_unused(model: onnx.ModelProto, names: set[str]) -> None:
    """Remove the initializers and Constant nodes in ``names`` that nothing reads now."""
    used = {name for graph in all_graphs(model.graph) for node in graph.node
            for name in node.input}
    used.update(output.name for output in model.graph.output)
    unused = names - used
    if not unused:
        return
    for graph in all_graphs(model.graph):
        kept_tensors = [t for t in graph.initializer if t.name not in unused]
        kept_nodes = [n for n in graph.node
                      if not (n.op_type == "Constant" and n.output[0] in unused)]
        del graph.initializer[:]
        graph.initializer.extend(kept_tensors)
        del graph.node[:]
        graph.node.extend(kept_nodes)


def _axes_to_attribute(node: onnx.NodeProto, opset: int, constants: Mapping[str, np.ndarray]
                       ) -> list[str]:
    """Move an axes/split input back to an attribute; returns the tensor it detached."""
    since = _AXES_INPUT_SINCE.get(node.op_type)
    if since is None or opset >= since or len(node.input) < 2:
        return []
    name = node.input[1]
    if name:
        if name not in constants:
            raise ExportError(f"node '{node.name}' ({node.op_type}) reads its "
                              f"{'split' if node.op_type == 'Split' else 'axes'} from "
                              f"'{name}', which is not a constant; opset {opset} needs an "
                              f"attribute there; export at opset >= {since}")
        values = [int(v) for v in np.asarray(constants[name]).reshape(-1)]
        key = "split" if node.op_type == "Split" else "axes"
        node.attribute.append(helper.make_attribute(key, values))
    del node.input[1]
    return [name] if name else []


def _resize_inputs(node: onnx.NodeProto, opset: int, taken: set[str]
                   ) -> list[onnx.NodeProto]:
    """Resize before opset 13 requires its roi and scales inputs, which torch leaves empty:
    they get empty float tensors (what "not given" meant then). Returns their Constants."""
    if node.op_type != "Resize" or opset >= 13:
        return []
    constants = []
    for position in (1, 2):
        if position < len(node.input) and not node.input[position]:
            name = _fresh(f"{node.name or 'resize'}_empty{position}", taken)
            constants.append(helper.make_node("Constant", [], [name], name=name, value=(
                helper.make_tensor(name, TensorProto.FLOAT, [0], []))))
            node.input[position] = name
    return constants


def _reshape_allowzero(node: onnx.NodeProto, constants: Mapping[str, np.ndarray]) -> None:
    """torch writes Reshape(allowzero=1), which opsets before 14 cannot say; it means the
    same as the older Reshape when the target shape holds no 0, so a constant shape without
    0 drops it."""
    if node.op_type != "Reshape" or not any(a.name == "allowzero" and a.i
                                            for a in node.attribute):
        return
    shape = constants.get(node.input[1]) if len(node.input) > 1 else None
    if shape is None or (np.asarray(shape) == 0).any():
        raise ExportError(f"node '{node.name}' (Reshape) takes a literal 0 in its target "
                          f"shape (allowzero=1) that opsets before 14 cannot say; export at "
                          f"opset >= 14")
    kept = [a for a in node.attribute if a.name != "allowzero"]
    del node.attribute[:]
    node.attribute.extend(kept)


def _softmax_axis(node: onnx.NodeProto, opset: int, ranks: Mapping[str, int]) -> None:
    """Before opset 13 Softmax, LogSoftmax and Hardmax flatten the input to 2-D around
    ``axis`` (default 1); from 13 they work along ``axis`` (default -1). They agree only
    along the last axis, which is then written out."""
    if node.op_type not in ("Softmax", "LogSoftmax", "Hardmax") or opset >= 13:
        return
    axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
    if axis != -1 and axis != ranks.get(node.input[0], 0) - 1:
        raise ExportError(f"node '{node.name}' ({node.op_type}) works along axis {axis}; "
                          f"before opset 13 only the last axis means the same; export at "
                          f"opset >= 13")
    kept = [a for a in node.attribute if a.name != "axis"]
    del node.attribute[:]
    node.attribute.extend([*kept, helper.make_attribute("axis", -1)])


def _fit_attributes(node: onnx.NodeProto, opset: int, target: Any, source: Any
                    ) -> dict[str, int]:
    """Drop attributes ``target`` lacks (they must hold ``source``'s default); returns a
    Shape's start/end, which need a Slice instead."""
    bounds: dict[str, int] = {}
    kept = []
    for attribute in node.attribute:
        if attribute.name in target.attributes:
            kept.append(attribute)
        elif node.op_type == "Shape" and attribute.name in ("start", "end"):
            bounds[attribute.name] = attribute.i
        elif node.op_type == "Split" and attribute.name == "num_outputs":
            continue  # without split sizes, older Splits cut evenly into the outputs
        elif not _is_default(attribute, source.attributes.get(attribute.name)):
            raise ExportError(f"node '{node.name}' ({node.op_type}) sets {attribute.name}, "
                              f"which opset {opset} does not have; export at a newer opset")
    del node.attribute[:]
    node.attribute.extend(kept)
    return bounds


def _first_opset(op_type: str) -> int | str:
    from onnx import defs

    try:
        return int(defs.get_schema(op_type, defs.onnx_opset_version(), "").since_version)
    except defs.SchemaError:
        return "?"


def _is_default(attribute: onnx.AttributeProto, declared: Any) -> bool:
    if declared is None or not declared.default_value.name:
        return False
    return bool(helper.get_attribute_value(attribute)
                == helper.get_attribute_value(declared.default_value))


def _slice_shape(node: onnx.NodeProto, bounds: Mapping[str, int], taken: set[str]
                 ) -> list[onnx.NodeProto]:
    """Shape(start, end) for opsets before 15: the node keeps the full shape, a Slice after
    it writes the original output."""
    sliced_output = node.output[0]
    node.output[0] = _fresh(f"{sliced_output}_full", taken)
    constants = []
    for label, value in (("starts", bounds.get("start", 0)),
                         ("ends", bounds.get("end", 1 << 62)), ("axes", 0)):
        name = _fresh(f"{sliced_output}_{label}", taken)
        constants.append(helper.make_node("Constant", [], [name], name=name, value=(
            helper.make_tensor(name, TensorProto.INT64, [1], [value]))))
    slice_node = helper.make_node("Slice", [node.output[0], *(c.output[0] for c in constants)],
                                  [sliced_output],
                                  name=_fresh(f"{node.name or sliced_output}_slice", taken))
    return [*constants, slice_node]


def _fresh(base: str, taken: set[str]) -> str:
    name, counter = base, 1
    while name in taken:
        counter += 1
        name = f"{base}_{counter}"
    taken.add(name)
    return name
