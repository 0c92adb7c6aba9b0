"""ONNX Runtime's com.microsoft QuantizeLinear / DequantizeLinear (16-bit and 4-bit QDQ),
against ONNX Runtime's own kernels on the original node: int16, uint16, int8 and uint8,
per tensor and per axis, zero points at the range ends, saturating and half-way inputs, at
opsets 13 and 17 (the arithmetic form for 16 bits) and 21 (the standard ops); int4
initializers below 21 unpacked to int8; what cannot be said refused."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

import decomposer

TYPES = [(TensorProto.INT16, np.int16), (TensorProto.UINT16, np.uint16),
         (TensorProto.UINT8, np.uint8), (TensorProto.INT8, np.int8)]


def _run(model, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _model(op, elem, dtype, per_axis, opset):
    info = np.iinfo(dtype)
    scale = np.array([0.01, 0.02, 0.003], np.float32) if per_axis else \
        np.array(0.0123, np.float32)
    zero = np.array([info.min, 0 if info.min < 0 else 5, info.max], dtype) if per_axis else \
        np.array(info.max // 3, dtype)
    quantized, real = (elem, TensorProto.FLOAT)
    source, result = (quantized, real) if op == "DequantizeLinear" else (real, quantized)
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "s", "z"], ["y"], domain="com.microsoft", axis=1)], "g",
        [helper.make_tensor_value_info("x", source, ["n", 3, 4])],
        [helper.make_tensor_value_info("y", result, ["n", 3, 4])],
        [nh.from_array(scale, "s"), nh.from_array(zero, "z")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("opset", [13, 17, 21])
@pytest.mark.parametrize("per_axis", [False, True], ids=["per tensor", "per axis"])
@pytest.mark.parametrize("elem, dtype", TYPES, ids=lambda v: getattr(v, "__name__", v))
def test_equals_the_kernels(elem, dtype, per_axis, opset):
    info = np.iinfo(dtype)
    rng = np.random.default_rng(opset)
    for op in ("DequantizeLinear", "QuantizeLinear"):
        model = _model(op, elem, dtype, per_axis, opset)
        out = decomposer.decompose(model)
        onnx.checker.check_model(out, full_check=True)
        assert {n.domain for n in out.graph.node} <= {""}
        kinds = {n.op_type for n in out.graph.node}
        sixteen = dtype in (np.int16, np.uint16) and opset < 21
        assert (op in kinds) != sixteen, kinds
        for batch in (2, 1):
            if op == "DequantizeLinear":
                x = rng.integers(info.min, info.max + 1, (batch, 3, 4)).astype(dtype)
                x.reshape(-1)[:2] = (info.min, info.max)
            else:
                x = (rng.standard_normal((batch, 3, 4)) * 600).astype(np.float32)
                # half-way values (round half to even) and saturating ones
                x.reshape(-1)[:4] = [0.5 * 0.0123, 1.5 * 0.0123, 1e9, -1e9]
            got, want = _run(out, {"x": x}), _run(model, {"x": x})
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("elem", [TensorProto.INT4, TensorProto.UINT4], ids=["int4", "uint4"])
def test_int4_weights_below_21_are_unpacked_to_int8(elem):
    low, high = (-8, 7) if elem == TensorProto.INT4 else (0, 15)
    rng = np.random.default_rng(4)
    values = rng.integers(low, high + 1, (6, 5))
    values[0, :2] = (low, high)
    zeros = rng.integers(low, high + 1, (6,))
    scales = rng.uniform(0.01, 0.1, (6,)).astype(np.float32)
    initializers = [helper.make_tensor("w", elem, [6, 5], values.reshape(-1)),
                    helper.make_tensor("z", elem, [6], zeros), nh.from_array(scales, "s")]
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["w", "s", "z"], ["wf"], domain="com.microsoft",
                          axis=0),
         helper.make_node("MatMul", ["x", "wf"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    assert not any(t.data_type in (TensorProto.INT4, TensorProto.UINT4)
                   for t in out.graph.initializer)
    x = rng.standard_normal((3, 6)).astype(np.float32)
    np.testing.assert_array_equal(_run(out, {"x": x}), _run(model, {"x": x}))
    weights = (values - zeros[:, None]) * scales[:, None].astype(np.float64)
    np.testing.assert_allclose(_run(out, {"x": x}), x @ weights, rtol=1e-5, atol=1e-5)


def test_what_opset_17_cannot_hold_is_refused():
    # an int4 output, and int4 values computed at run time
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], domain="com.microsoft")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.INT4, ["n"])],
        [nh.from_array(np.array(0.1, np.float32), "s"),
         helper.make_tensor("z", TensorProto.INT4, [], [0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(decomposer.UnsupportedNodeError, match="opset 21"):
        decomposer.decompose(model)
    graph = helper.make_graph(
        [helper.make_node("DequantizeLinear", ["x", "s"], ["y"], domain="com.microsoft")],
        "g", [helper.make_tensor_value_info("x", TensorProto.INT4, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
        [nh.from_array(np.array(0.1, np.float32), "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    with pytest.raises(decomposer.UnsupportedNodeError, match="opset 21"):
        decomposer.decompose(model)


def portability_cases():
    """16-bit QDQ with the contrib ops around a float op, at opset 17: the arithmetic form
    on every engine (ONNX Runtime's kernels on the original the oracle)."""
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], domain="com.microsoft"),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], domain="com.microsoft"),
         helper.make_node("Relu", ["d"], ["y"])], "qdq16",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, 4])],
        [nh.from_array(np.array(0.001, np.float32), "s"),
         nh.from_array(np.array(-1000, np.int16), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    rng = np.random.default_rng(16)
    feeds = [{"x": (rng.standard_normal((b, 3, 4)) * 20).astype(np.float32)} for b in (2, 1)]
    return [{"id": "contrib 16-bit QuantizeLinear/DequantizeLinear", "model": model,
             "feeds": feeds, "expected": [[_run(model, f)] for f in feeds], "atol": 1e-6}]
