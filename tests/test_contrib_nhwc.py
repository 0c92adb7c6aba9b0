"""ONNX Runtime's channels-last ops (com.microsoft QLinearConv with channels_last,
NhwcMaxPool, NhwcConv) as the standard op between Transposes, against ONNX Runtime's own
kernels on the original node (NhwcConv: torch, as ONNX Runtime has it on CUDA only):
uint8/int8, per-channel weights, bias, groups, strides, pads, auto_pad, dilations, dynamic
batch at two sizes; exact. A chain of channels-last ops keeps no Transpose pair that undoes
itself."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

import decomposer


def _run(model, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _model(nodes, inputs, outputs, initializers, opset=17):
    return helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, initializers),
                             opset_imports=[helper.make_opsetid("", opset),
                                            helper.make_opsetid("com.microsoft", 1)])


def _conv_initializers(rng, x_dtype, w_dtype, out_channels, in_per_group, kernel, per_channel,
                       bias, prefix=""):
    w_info = np.iinfo(w_dtype)
    x_info = np.iinfo(x_dtype)
    weights = rng.integers(w_info.min, w_info.max + 1, (out_channels, in_per_group, *kernel))
    scale = rng.uniform(0.005, 0.02, out_channels).astype(np.float32) if per_channel else \
        np.array(0.01, np.float32)
    zero = np.zeros(out_channels, w_dtype) if per_channel else np.array(0, w_dtype)
    found = [nh.from_array(np.array(0.05, np.float32), f"{prefix}xs"),
             nh.from_array(np.array(x_info.min + 9, x_dtype), f"{prefix}xz"),
             nh.from_array(weights.astype(w_dtype), f"{prefix}w"),
             nh.from_array(scale, f"{prefix}ws"), nh.from_array(zero, f"{prefix}wz"),
             nh.from_array(np.array(0.08, np.float32), f"{prefix}ys"),
             nh.from_array(np.array(x_info.max // 2, x_dtype), f"{prefix}yz")]
    names = [f"{prefix}{n}" for n in ("xs", "xz", "w", "ws", "wz", "ys", "yz")]
    if bias:
        found.append(nh.from_array(rng.integers(-2000, 2000, out_channels).astype(np.int32),
                                   f"{prefix}b"))
        names.append(f"{prefix}b")
    return found, names


CONV_CASES = [
    # (x dtype, w dtype, channels_last, attrs, per_channel, bias, group)
    (np.uint8, np.int8, 1, {"pads": [1, 1, 1, 1], "kernel_shape": [3, 3]}, True, True, 1),
    (np.uint8, np.uint8, 1, {"strides": [2, 2]}, False, False, 1),
    (np.int8, np.int8, 1, {"auto_pad": "SAME_UPPER"}, True, True, 1),
    (np.int8, np.int8, 1, {"pads": [2, 2, 2, 2], "dilations": [2, 2]}, True, True, 1),
    (np.uint8, np.int8, 1, {"pads": [0, 1, 1, 0]}, True, False, 2),
    (np.uint8, np.int8, 0, {"pads": [1, 1, 1, 1]}, True, True, 1),
]


@pytest.mark.parametrize("x_dtype, w_dtype, last, attrs, per_channel, bias, group",
                         CONV_CASES, ids=[f"case{i}" for i in range(len(CONV_CASES))])
def test_qlinear_conv_equals_the_kernel(x_dtype, w_dtype, last, attrs, per_channel, bias,
                                        group):
    rng = np.random.default_rng(len(attrs) + group)
    channels, out_channels = 4, 6
    initializers, names = _conv_initializers(rng, x_dtype, w_dtype, out_channels,
                                             channels // group, (3, 3), per_channel, bias)
    x_type = helper.np_dtype_to_tensor_dtype(np.dtype(x_dtype))
    shape = ["n", 7, 7, channels] if last else ["n", channels, 7, 7]
    node = helper.make_node("QLinearConv", ["x", *names[:7], *names[7:]], ["y"],
                            domain="com.microsoft", channels_last=last, group=group, **attrs)
    model = _model([node], [helper.make_tensor_value_info("x", x_type, shape)],
                   [helper.make_tensor_value_info("y", x_type, [None] * 4)], initializers)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    assert {n.domain for n in out.graph.node} <= {""}
    info = np.iinfo(x_dtype)
    for batch in (2, 1):
        dims = (batch, 7, 7, channels) if last else (batch, channels, 7, 7)
        x = rng.integers(info.min, info.max + 1, dims).astype(x_dtype)
        np.testing.assert_array_equal(_run(out, {"x": x}), _run(model, {"x": x}))


@pytest.mark.parametrize("opset", [11, 17])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("attrs", [{"kernel_shape": [2, 2], "strides": [2, 2]},
                                   {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                                    "ceil_mode": 1, "strides": [2, 2]},
                                   {"kernel_shape": [3, 3], "auto_pad": "SAME_LOWER"}],
                         ids=["2x2", "padded ceil", "same lower"])
def test_nhwc_max_pool_equals_the_kernel(dtype, attrs, opset):
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    model = _model([helper.make_node("NhwcMaxPool", ["x"], ["y"], domain="com.microsoft",
                                     **attrs)],
                   [helper.make_tensor_value_info("x", elem, ["n", 7, 6, 3])],
                   [helper.make_tensor_value_info("y", elem, [None] * 4)], [], opset)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    info = np.iinfo(dtype)
    rng = np.random.default_rng(opset)
    for batch in (2, 1):
        x = rng.integers(info.min, info.max + 1, (batch, 7, 6, 3)).astype(dtype)
        np.testing.assert_array_equal(_run(out, {"x": x}), _run(model, {"x": x}))


@pytest.mark.parametrize("constant_weights", [True, False], ids=["initializer", "run-time"])
def test_nhwc_conv_against_torch(constant_weights):
    """ONNX Runtime 1.32 has NhwcConv on CUDA only: torch's conv2d is the oracle. The weights
    are channels last, (M, kH, kW, C/group), as ONNX Runtime's optimizer writes them (the
    torch weights transposed (0, 2, 3, 1)); a weight fed at run time goes through a
    Transpose."""
    import torch

    rng = np.random.default_rng(2)
    weights = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)  # torch's (M, C/g, kH, kW)
    stored = np.ascontiguousarray(weights.transpose(0, 2, 3, 1))
    bias = rng.standard_normal(6).astype(np.float32)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 5, 6, 4])]
    initializers = [nh.from_array(bias, "b")]
    if constant_weights:
        initializers.append(nh.from_array(stored, "w"))
    else:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [6, 3, 3, 2]))
    model = _model([helper.make_node("NhwcConv", ["x", "w", "b"], ["y"], domain="com.microsoft",
                                     pads=[1, 1, 1, 1], group=2)],
                   inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)],
                   initializers)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    # constant weights are transposed when decomposing: only the data's two Transposes run
    transposes = sum(n.op_type == "Transpose" for n in out.graph.node)
    assert transposes == (2 if constant_weights else 3)
    for batch in (2, 1):
        x = rng.standard_normal((batch, 5, 6, 4)).astype(np.float32)
        want = torch.nn.functional.conv2d(torch.from_numpy(x).permute(0, 3, 1, 2),
                                          torch.from_numpy(weights), torch.from_numpy(bias),
                                          padding=1, groups=2).permute(0, 2, 3, 1).numpy()
        feeds = {"x": x} if constant_weights else {"x": x, "w": stored}
        np.testing.assert_allclose(_run(out, feeds), want, rtol=1e-5, atol=1e-5)


def test_a_channels_last_chain_keeps_no_transpose_pair():
    """Transpose (the model's) -> QLinearConv -> QLinearConv -> NhwcMaxPool -> Transpose
    (the model's): one Transpose in, one out, and the kernels' numbers."""
    rng = np.random.default_rng(9)
    first, first_names = _conv_initializers(rng, np.uint8, np.int8, 4, 4, (3, 3), True, True,
                                            "a_")
    second, second_names = _conv_initializers(rng, np.uint8, np.int8, 4, 4, (3, 3), True,
                                              False, "b_")
    # the second conv reads the first's output with the first's output scale
    second_names[0], second_names[1] = first_names[5], first_names[6]
    nodes = [helper.make_node("Transpose", ["x"], ["x_nhwc"], perm=[0, 2, 3, 1], name="in"),
             helper.make_node("QLinearConv", ["x_nhwc", *first_names], ["c1"],
                              domain="com.microsoft", channels_last=1, pads=[1, 1, 1, 1]),
             helper.make_node("QLinearConv", ["c1", *second_names], ["c2"],
                              domain="com.microsoft", channels_last=1, pads=[1, 1, 1, 1]),
             helper.make_node("NhwcMaxPool", ["c2"], ["p"], domain="com.microsoft",
                              kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Transpose", ["p"], ["y"], perm=[0, 3, 1, 2], name="out")]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8,
                                                         ["n", 4, 6, 6])],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, [None] * 4)],
                   first + second)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    kinds = [n.op_type for n in out.graph.node if n.op_type != "Constant"]
    # the graph output's Transpose became an Identity: the output keeps its name
    assert "Transpose" not in kinds and kinds[-2:] == ["MaxPool", "Identity"], kinds
    x = rng.integers(0, 256, (2, 4, 6, 6)).astype(np.uint8)
    np.testing.assert_array_equal(_run(out, {"x": x}), _run(model, {"x": x}))
    again = decomposer.decompose(out)
    assert [n.op_type for n in again.graph.node] == [n.op_type for n in out.graph.node]


def portability_cases():
    """A channels-last quantized block as ORT_ENABLE_ALL leaves it, on every engine (the
    standard QLinearConv and MaxPool), ONNX Runtime's kernels on the original the oracle."""
    rng = np.random.default_rng(12)
    initializers, names = _conv_initializers(rng, np.uint8, np.int8, 4, 3, (3, 3), True, True)
    nodes = [helper.make_node("QLinearConv", ["x", *names], ["c"], domain="com.microsoft",
                              channels_last=1, pads=[1, 1, 1, 1]),
             helper.make_node("NhwcMaxPool", ["c"], ["y"], domain="com.microsoft",
                              kernel_shape=[2, 2], strides=[2, 2])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.UINT8,
                                                         ["n", 6, 6, 3])],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, ["n", 3, 3, 4])],
                   initializers)
    feeds = [{"x": rng.integers(0, 256, (b, 6, 6, 3)).astype(np.uint8)} for b in (2, 1)]
    # from 13 (the QDQ form): below it ONNX's QLinearConv is written, whose per-channel
    # weights OpenVINO 2026.4's import dequantizes along the wrong axis when the channel
    # counts differ (measured; docs/portability.md)
    return [{"id": "contrib channels-last QLinearConv and NhwcMaxPool", "model": model,
             "feeds": feeds, "expected": [[_run(model, f)] for f in feeds], "atol": 1,
             "opsets": (13, 10**6)}]


def test_onnx_qlinear_conv_under_lower_becomes_qdq():
    """--lower QLinearConv: ONNX's own QLinearConv (per-channel weights, 3 -> 6 channels,
    the form OpenVINO cannot import) as QDQ, equal to ONNX Runtime's kernel."""
    rng = np.random.default_rng(21)
    initializers, names = _conv_initializers(rng, np.uint8, np.int8, 6, 3, (3, 3), True, True)
    model = _model([helper.make_node("QLinearConv", ["x", *names], ["y"], pads=[1, 1, 1, 1])],
                   [helper.make_tensor_value_info("x", TensorProto.UINT8, ["n", 3, 5, 5])],
                   [helper.make_tensor_value_info("y", TensorProto.UINT8, [None] * 4)],
                   initializers)
    assert decomposer.decompose(model).graph.node[0].op_type == "QLinearConv"
    out = decomposer.decompose(model, lower=["QLinearConv"])
    onnx.checker.check_model(out, full_check=True)
    kinds = {n.op_type for n in out.graph.node}
    assert "QLinearConv" not in kinds and {"Conv", "QuantizeLinear"} <= kinds
    for batch in (2, 1):
        x = rng.integers(0, 256, (batch, 3, 5, 5)).astype(np.uint8)
        np.testing.assert_array_equal(_run(out, {"x": x}), _run(model, {"x": x}))
