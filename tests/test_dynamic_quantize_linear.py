"""``--lower DynamicQuantizeLinear`` (for TensorRT, which refuses the op) against ONNX
Runtime's own kernel: random ranges and magnitudes, all-positive, all-negative and all-zero
inputs (the kernel's scale is then 1), every output, opsets 11, 13 and 17; and a
quantize_dynamic'd MatMul model lowered whole."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

import decomposer


def _session(model):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _model(opset):
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, ["n", 5]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
         helper.make_tensor_value_info("z", TensorProto.UINT8, [])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_equals_the_kernel(opset):
    model = _model(opset)
    assert decomposer.decompose(model).graph.node[0].op_type == "DynamicQuantizeLinear"
    out = decomposer.decompose(model, lower=["DynamicQuantizeLinear"])
    onnx.checker.check_model(out, full_check=True)
    assert "DynamicQuantizeLinear" not in {n.op_type for n in out.graph.node}
    kernel, lowered = _session(model), _session(out)
    rng = np.random.default_rng(opset)
    inputs = [np.zeros((3, 5), np.float32), np.zeros((1, 5), np.float32) + 2.5,
              -np.ones((2, 5), np.float32)]
    for index in range(200):
        x = (rng.standard_normal((3, 5)) * rng.uniform(0.01, 100)).astype(np.float32)
        inputs.append(np.abs(x) if index % 7 == 0 else -np.abs(x) if index % 11 == 0 else x)
    for x in inputs:
        for got, want in zip(lowered.run(None, {"x": x}), kernel.run(None, {"x": x}),
                             strict=True):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


def test_a_dynamically_quantized_matmul_lowered_whole():
    rng = np.random.default_rng(5)
    graph = helper.make_graph(
        [helper.make_node("DynamicQuantizeLinear", ["a"], ["q", "s", "z"]),
         helper.make_node("MatMulInteger", ["q", "w", "z", "wz"], ["i"]),
         helper.make_node("Cast", ["i"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["s", "ws"], ["scale"]),
         helper.make_node("Mul", ["f", "scale"], ["y"])], "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [nh.from_array(rng.integers(-128, 128, (8, 4)).astype(np.int8), "w"),
         nh.from_array(np.array(0, np.int8), "wz"), nh.from_array(np.array(0.02, np.float32),
                                                                   "ws")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = decomposer.decompose(model, lower=["DynamicQuantizeLinear"])
    onnx.checker.check_model(out, full_check=True)
    for batch in (3, 1):
        a = rng.standard_normal((batch, 8)).astype(np.float32)
        np.testing.assert_array_equal(_session(out).run(None, {"a": a})[0],
                                      _session(model).run(None, {"a": a})[0])


def portability_cases():
    """The lowering on every engine (the kernel's outputs the oracle); the lowered op is a
    standard one, so the case asks for it with ``lower``."""
    model = _model(17)
    rng = np.random.default_rng(2)
    feeds = [{"x": (rng.standard_normal((b, 5)) * 3).astype(np.float32)} for b in (3, 1)]
    expected = [_session(model).run(None, f) for f in feeds]
    return [{"id": "DynamicQuantizeLinear lowered", "model": model, "feeds": feeds,
             "expected": expected, "atol": 1, "lower": ("DynamicQuantizeLinear",)}]
