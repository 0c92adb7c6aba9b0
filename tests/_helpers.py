"""Shared test helpers: model builders and an ORT runner.

In: parameters of a small model. Out: ``onnx.ModelProto`` s built with ``onnx.helper`` and
outputs of stock ONNX Runtime; nothing here computes expected values.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from decomposer.testing import ir_version_for, run_onnxruntime

__all__ = ["make_model", "run_onnxruntime", "op_types", "custom_nodes", "random_integers",
           "integer_product_model", "save_optimized"]


def make_model(nodes, inputs, outputs, opset, *, extra_opsets=(), initializers=(),
               functions=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    imports = [helper.make_opsetid("", opset)]
    imports += [helper.make_opsetid(domain, 1) for domain in extra_opsets]
    return helper.make_model(graph, opset_imports=imports, ir_version=ir_version_for(opset),
                             functions=list(functions), producer_name="decomposer-tests")


def op_types(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def custom_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain not in ("", "ai.onnx")]


FLOAT_TYPES = {np.float16: TensorProto.FLOAT16, np.float32: TensorProto.FLOAT,
               np.float64: TensorProto.DOUBLE}


def random_integers(rng: np.random.Generator, dtype, shape) -> np.ndarray:
    """Integers over ``dtype``'s whole range."""
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def integer_product_model(op: str, data_dtype, data_dims, weights: np.ndarray,
                          data_zero: np.ndarray | None, weights_zero: np.ndarray | None,
                          constant_weights: bool, out_rank: int, opset: int,
                          **attrs) -> onnx.ModelProto:
    """One ConvInteger / MatMulInteger node: data fed at run time ("x"), the weights ("w")
    an initializer or a graph input, each zero point an initializer or absent."""
    elem = helper.np_dtype_to_tensor_dtype
    inputs = [helper.make_tensor_value_info("x", elem(np.dtype(data_dtype)), data_dims)]
    initializers = []
    names = ["x", "w", "", ""]
    if constant_weights:
        initializers.append(onnx.numpy_helper.from_array(weights, "w"))
    else:
        inputs.append(helper.make_tensor_value_info("w", elem(weights.dtype),
                                                    list(weights.shape)))
    for position, (name, value) in enumerate((("xz", data_zero), ("wz", weights_zero)), 2):
        if value is not None:
            initializers.append(onnx.numpy_helper.from_array(value, name))
            names[position] = name
    while names[-1] == "":
        names.pop()
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"], **attrs)], "g", inputs,
        [helper.make_tensor_value_info("y", TensorProto.INT32, [None] * out_rank)],
        initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def save_optimized(source, target) -> onnx.ModelProto:
    """The model at ``source`` as an ONNX Runtime session at ORT_ENABLE_ALL saves it (its
    contrib and layout-optimized ops: what users bring), written to ``target`` and loaded."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(target)
    options.log_severity_level = 3
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    return onnx.load(str(target))
