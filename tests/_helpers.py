"""Shared test helpers: model builders and an ORT runner.

In: parameters of a small model. Out: ``onnx.ModelProto`` s built with ``onnx.helper`` and
outputs of stock ONNX Runtime; nothing here computes expected values.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from decomposer.testing import ir_version_for, run_onnxruntime

__all__ = ["make_model", "run_onnxruntime", "op_types", "custom_nodes"]


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
