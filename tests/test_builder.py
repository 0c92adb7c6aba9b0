"""The builder's opset-specific spellings compute the same thing at every opset, checked
on ONNX Runtime against numpy (the oracle), plus the Value API's dtype rules."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from decomposer.builder import Builder, NameAllocator
from decomposer.testing import ir_version_for, run_onnxruntime

X = np.array([[1, 3, 3, 0], [5, 5, np.nan, 5], [0, 1, 2, 2]], np.float32)


def run(opset, build, out_type=TensorProto.FLOAT, x=X, rank=2):
    b = Builder(opset, "t", NameAllocator(["x", "y"]), NameAllocator())
    build(b, b.input("x", np.float32))
    graph = helper.make_graph(
        b.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b"])],
        [helper.make_tensor_value_info("y", out_type, [None] * rank)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=ir_version_for(opset))
    onnx.checker.check_model(model, full_check=True)
    return run_onnxruntime(model, {"x": x})[0]


@pytest.mark.parametrize("opset", [11, 12, 13, 18, 21])
def test_argmax_last_index_at_every_opset(opset):
    x = np.array([[1, 3, 3, 0], [5, 5, 5, 5], [0, 1, 2, 2]], np.float32)
    got = run(opset, lambda b, v: b.ArgMax(v, 1, keepdims=False, select_last_index=True,
                                           out="y"), TensorProto.INT64, x, rank=1)
    expected = x.shape[1] - 1 - np.argmax(x[:, ::-1], axis=1)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("opset", [11, 12, 17])
def test_less_or_equal_keeps_nan_false(opset):
    got = run(opset, lambda b, v: b.LessOrEqual(v, 3.0, out="y"), TensorProto.BOOL)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got, X <= 3.0)


def built(opset, build, target="portable"):
    b = Builder(opset, "t", NameAllocator(["x", "y"]), NameAllocator(), target=target)
    build(b, b.input("x", np.float32))
    return [n.op_type for n in b.nodes]


@pytest.mark.parametrize("opset", [11, 12, 13, 16, 17, 21])
@pytest.mark.parametrize("target", ["portable", "ort"])
def test_or_equal_comparisons_keep_nan_false_for_floats_and_ints(opset, target):
    """From opset 16 portable output spells >= and <= (onnx2torch converts only their
    opset-12 versions); the results must not change, NaN included."""
    for method, expected in (("GreaterOrEqual", X >= 3.0), ("LessOrEqual", X <= 3.0)):
        got = run(opset, lambda b, v, m=method: getattr(b, m)(v, 3.0, out="y"),
                  TensorProto.BOOL)
        np.testing.assert_array_equal(got, expected)
        ints = np.nan_to_num(X).astype(np.int64)
        got = run(opset, lambda b, v, m=method: getattr(b, m)(b.Cast(v, np.int64), np.int64(3),
                                                              out="y"), TensorProto.BOOL,
                  x=ints.astype(np.float32))
        np.testing.assert_array_equal(got, ints >= 3 if method == "GreaterOrEqual" else ints <= 3)
        ops = built(opset, lambda b, v, m=method: getattr(b, m)(v, 3.0, out="y"), target)
        assert (method in ops) == (12 <= opset < 16 or (opset >= 16 and target == "ort"))


@pytest.mark.parametrize("opset", [11, 12, 13])
def test_integer_min_and_max_at_every_opset(opset):
    """ONNX's Min/Max take integers from opset 12; below that they are spelled with Where."""
    ints = np.array([[1, -3, 7, 0], [5, 5, 9, -2], [0, 1, 2, 2]], np.float32)
    for method, reduce in (("Min", np.minimum), ("Max", np.maximum)):
        got = run(opset, lambda b, v, m=method: getattr(b, m)(
            b.Cast(v, np.int64), np.int64(2), b.Cast(v * 2.0 - 3.0, np.int64), out="y"),
            TensorProto.INT64, x=ints)
        as_int = ints.astype(np.int64)
        np.testing.assert_array_equal(got, reduce(reduce(as_int, 2), as_int * 2 - 3))
        ops = built(opset, lambda b, v, m=method: getattr(b, m)(b.Cast(v, np.int64), np.int64(2),
                                                                out="y"))
        assert (method in ops) == (opset >= 12)


@pytest.mark.parametrize("opset", [11, 14, 15, 21])
def test_shape_slice_at_every_opset(opset):
    got = run(opset, lambda b, v: b.Shape(v, 1, out="y"), TensorProto.INT64, rank=1)
    np.testing.assert_array_equal(got, [4])


@pytest.mark.parametrize("opset", [11, 12, 13])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax_one_axis_at_every_opset(opset, axis):
    x = np.nan_to_num(X)
    got = run(opset, lambda b, v: b.Softmax(v, axis, out="y"), x=x)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(got, e / e.sum(axis=axis, keepdims=True), rtol=1e-6)


def test_value_arithmetic_types_constants_like_the_other_operand():
    b = Builder(17, "t", NameAllocator(), NameAllocator())
    x = b.input("x", np.float64)
    y = (1 - x) * 2 / x
    assert y.dtype == np.float64 and isinstance(y, str)
    constants = [n for n in b.nodes if n.op_type == "Constant"]
    assert all(n.attribute[0].t.data_type == TensorProto.DOUBLE for n in constants)
    with pytest.raises(TypeError, match="dtype"):
        b.input("unknown") + 1


@pytest.mark.parametrize("opset", [11, 12, 13])
def test_clip_of_float64_runs_on_onnx_runtime_at_every_opset(opset):
    b = Builder(opset, "t", NameAllocator(["x", "y"]), NameAllocator())
    b.Clip(b.input("x", np.float64), 0.5, 2.0, out="y")
    graph = helper.make_graph(
        b.nodes, "g", [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [4])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=ir_version_for(opset))
    onnx.checker.check_model(model, full_check=True)
    x = np.array([0.0, 1.0, 3.0, -1.0])
    np.testing.assert_array_equal(run_onnxruntime(model, {"x": x})[0], np.clip(x, 0.5, 2.0))


@pytest.mark.parametrize("dtype, op_types", [
    (np.float32, ["Reshape", "Sub"]), (np.float64, ["Reshape", "Sub"]),
    (np.float16, ["Reshape"]), (np.int64, ["Reshape"]), (np.bool_, ["Reshape"])])
def test_reshape_to_the_caller_ends_in_an_exact_sub_for_float32_and_float64(dtype, op_types):
    """to_caller=True: Sub(view, 0) writes the output (bit for bit, -0 and NaN included)
    where ONNX Runtime has a parallel kernel; other types keep the plain Reshape."""
    values = [[-0.0, 0.0, np.nan, -1.5], [np.inf, -np.inf, 2.0, 3.25]] \
        if np.issubdtype(dtype, np.floating) else [[0, 1, 1, 0], [1, 0, 0, 1]]
    x = np.array(values).astype(dtype)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    b = Builder(13, "t", NameAllocator(["x", "y"]), NameAllocator())
    b.Reshape(b.input("x", dtype), [4, 2], out="y", to_caller=True)
    assert [n.op_type for n in b.nodes if n.op_type != "Constant"] == op_types
    graph = helper.make_graph(b.nodes, "g", [helper.make_tensor_value_info("x", elem, [2, 4])],
                              [helper.make_tensor_value_info("y", elem, [4, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)],
                              ir_version=ir_version_for(13))
    onnx.checker.check_model(model, full_check=True)
    got = run_onnxruntime(model, {"x": x})[0]
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got.view(np.uint8), x.reshape(4, 2).view(np.uint8))
