"""ONNX Runtime's QGemm, MatMulIntegerToFloat and DynamicQuantizeMatMul as standard QDQ and
integer ops, against ONNX Runtime's own kernels on the original node: uint8/int8 A, int8/uint8
B (the pairs the kernels take), per-tensor and per-column B, with and without an int32 bias,
quantized and float outputs, transB, alpha, dynamic batch at two sizes. ONNX Runtime fuses
the groups back (exact); where alpha != 1 scales a bias, the float Gemm runs unfused
(within float rounding); unfused, every form stays within one quantization step."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

import decomposer

K, N = 8, 6


def _session(model, optimized=True):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL \
        if optimized else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _model(nodes, inputs, outputs, initializers):
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializers),
                             opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])


def _compare(model, feeds_list, exact):
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    assert {n.domain for n in out.graph.node} <= {""}
    kernel, fused, plain = _session(model), _session(out), _session(out, optimized=False)
    for feeds in feeds_list:
        (want,) = kernel.run(None, feeds)
        (got,) = fused.run(None, feeds)
        (unfused,) = plain.run(None, feeds)
        assert got.dtype == want.dtype and got.shape == want.shape
        if want.dtype == np.float32:
            scale = max(1.0, float(np.abs(want).max()))
            tolerance = 0 if exact else 1e-6 * scale
            np.testing.assert_allclose(got, want, rtol=0, atol=tolerance)
            np.testing.assert_allclose(unfused, want, rtol=0, atol=1e-6 * scale)
        else:
            np.testing.assert_array_equal(got, want)
            assert np.abs(unfused.astype(np.int32) - want.astype(np.int32)).max() <= 1


QGEMM_CASES = list(itertools.product(
    [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)], [0, 1],
    [False, True], [False, True], [False, True], [1.0, 0.75]))


@pytest.mark.parametrize("types, trans_b, per_column, bias, quantized_out, alpha",
                         QGEMM_CASES, ids=[
                             f"{a.__name__}x{b.__name__}-tB{t}-{'col' if c else 'tensor'}"
                             f"{'-bias' if bi else ''}{'-q' if q else '-float'}-alpha{al}"
                             for (a, b), t, c, bi, q, al in QGEMM_CASES])
def test_qgemm_equals_the_kernel(types, trans_b, per_column, bias, quantized_out, alpha):
    a_dtype, b_dtype = types
    a_info, b_info = np.iinfo(a_dtype), np.iinfo(b_dtype)
    rng = np.random.default_rng(trans_b + 2 * per_column + 4 * bias)
    weights = rng.integers(b_info.min, b_info.max + 1, (N, K) if trans_b else (K, N))
    b_scale = rng.uniform(0.01, 0.05, N).astype(np.float32) if per_column else \
        np.array(0.02, np.float32)
    b_zero = rng.integers(b_info.min, b_info.max + 1, N).astype(b_dtype) if per_column else \
        np.array(b_info.max // 2, b_dtype)
    initializers = [nh.from_array(np.array(0.1, np.float32), "as"),
                    nh.from_array(np.array(a_info.min + 7, a_dtype), "az"),
                    nh.from_array(weights.astype(b_dtype), "B"), nh.from_array(b_scale, "bs"),
                    nh.from_array(b_zero, "bz")]
    names = ["A", "as", "az", "B", "bs", "bz"]
    if bias:
        initializers.append(nh.from_array(rng.integers(-5000, 5000, N).astype(np.int32), "C"))
        names.append("C")
    else:
        names.append("")
    out_type = TensorProto.FLOAT
    if quantized_out:
        # a small output scale: the range ends saturate
        initializers += [nh.from_array(np.array(0.05, np.float32), "ys"),
                         nh.from_array(np.array(a_info.max // 2, a_dtype), "yz")]
        names += ["ys", "yz"]
        out_type = helper.np_dtype_to_tensor_dtype(np.dtype(a_dtype))
    a_type = helper.np_dtype_to_tensor_dtype(np.dtype(a_dtype))
    model = _model([helper.make_node("QGemm", names, ["y"], domain="com.microsoft",
                                     transB=trans_b, alpha=alpha)],
                   [helper.make_tensor_value_info("A", a_type, ["m", K])],
                   [helper.make_tensor_value_info("y", out_type, ["m", N])], initializers)
    feeds = []
    for rows in (5, 1):
        values = rng.integers(a_info.min, a_info.max + 1, (rows, K)).astype(a_dtype)
        values.reshape(-1)[:2] = (a_info.min, a_info.max)
        feeds.append({"A": values})
    _compare(model, feeds, exact=not (bias and alpha != 1.0))


@pytest.mark.parametrize("role", ["az", "yz", "ys"])
def test_qgemm_refuses_a_per_row_parameter_with_the_reason(role):
    """A fuzz finding: a zero point of three values reached a reshape to a scalar (exit 4).
    A's and Y's scales and zero points are one value each in ONNX Runtime's kernel."""
    values = {"as": np.array(0.1, np.float32), "az": np.array(7, np.uint8),
              "B": np.ones((K, N), np.int8), "bs": np.array(0.02, np.float32),
              "bz": np.array(0, np.int8), "ys": np.array(0.05, np.float32),
              "yz": np.array(9, np.uint8)}
    values[role] = np.repeat(values[role], 3)
    model = _model([helper.make_node("QGemm", ["A", "as", "az", "B", "bs", "bz", "", "ys",
                                              "yz"], ["y"], domain="com.microsoft")],
                   [helper.make_tensor_value_info("A", TensorProto.UINT8, ["m", K])],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, ["m", N])],
                   [nh.from_array(v, k) for k, v in values.items()])
    with pytest.raises(decomposer.UnsupportedNodeError, match="must be per tensor"):
        decomposer.decompose(model, check=False)


@pytest.mark.parametrize("a_dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_column", [False, True], ids=["tensor", "column"])
def test_matmul_integer_to_float_equals_the_kernel(a_dtype, per_column):
    rng = np.random.default_rng(per_column)
    b_scale = rng.uniform(0.01, 0.05, N).astype(np.float32) if per_column else \
        np.array(0.02, np.float32)
    initializers = [nh.from_array(rng.integers(-128, 128, (K, N)).astype(np.int8), "B"),
                    nh.from_array(b_scale, "bs"), nh.from_array(np.array(3, a_dtype), "az"),
                    nh.from_array(np.array(-2, np.int8), "bz"),
                    nh.from_array(rng.standard_normal(N).astype(np.float32), "bias")]
    a_type = helper.np_dtype_to_tensor_dtype(np.dtype(a_dtype))
    model = _model([helper.make_node("MatMulIntegerToFloat",
                                     ["A", "B", "as", "bs", "az", "bz", "bias"], ["y"],
                                     domain="com.microsoft")],
                   [helper.make_tensor_value_info("A", a_type, ["b", "s", K]),
                    helper.make_tensor_value_info("as", TensorProto.FLOAT, [])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", N])],
                   initializers)
    info = np.iinfo(a_dtype)
    feeds = [{"A": rng.integers(info.min, info.max + 1, (b, 3, K)).astype(a_dtype),
              "as": np.array(0.037, np.float32)} for b in (2, 1)]
    _compare(model, feeds, exact=True)


@pytest.mark.parametrize("b_dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("per_column", [False, True], ids=["tensor", "column"])
def test_dynamic_quantize_matmul_equals_the_kernel(b_dtype, per_column):
    rng = np.random.default_rng(7 + per_column)
    info = np.iinfo(b_dtype)
    b_scale = rng.uniform(0.01, 0.05, N).astype(np.float32) if per_column else \
        np.array(0.02, np.float32)
    initializers = [nh.from_array(rng.integers(info.min, info.max + 1, (K, N)).astype(b_dtype),
                                  "B"), nh.from_array(b_scale, "bs"),
                    nh.from_array(np.array(info.max // 2, b_dtype), "bz"),
                    nh.from_array(rng.standard_normal(N).astype(np.float32), "bias")]
    model = _model([helper.make_node("DynamicQuantizeMatMul", ["A", "B", "bs", "bz", "bias"],
                                     ["y"], domain="com.microsoft")],
                   [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["b", K])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", N])],
                   initializers)
    feeds = [{"A": (rng.standard_normal((b, K)) * 3).astype(np.float32)} for b in (5, 1)]
    # an all-positive input: the range widened to hold 0
    feeds.append({"A": np.abs(feeds[0]["A"]) + 1})
    _compare(model, feeds, exact=True)


def portability_cases():
    """A dynamically quantized MatMul and a QGemm with a float output, on every engine
    (DynamicQuantizeLinear and MatMulInteger are standard): ONNX Runtime's kernels on the
    original the oracle."""
    rng = np.random.default_rng(3)
    initializers = [nh.from_array(rng.integers(-128, 128, (K, N)).astype(np.int8), "B"),
                    nh.from_array(np.array(0.02, np.float32), "bs"),
                    nh.from_array(np.array(0, np.int8), "bz"),
                    nh.from_array(rng.standard_normal(N).astype(np.float32), "bias")]
    model = _model([helper.make_node("DynamicQuantizeMatMul", ["A", "B", "bs", "bz", "bias"],
                                     ["y"], domain="com.microsoft")],
                   [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["b", K])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", N])],
                   initializers)
    feeds = [{"A": (rng.standard_normal((b, K)) * 3).astype(np.float32)} for b in (4, 1)]
    expected = [[_session(model).run(None, f)[0]] for f in feeds]
    return [{"id": "contrib DynamicQuantizeMatMul", "model": model, "feeds": feeds,
             "expected": expected, "atol": 1e-4}]
