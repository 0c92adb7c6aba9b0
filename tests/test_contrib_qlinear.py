"""ONNX Runtime's QOperator ops (QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
QLinearSoftmax, QLinearConcat, QLinearAveragePool, QLinearGlobalAveragePool, QLinearWhere,
QLinearReduceMean) as standard QDQ, against ONNX Runtime's own kernel on the original node:
uint8 and int8, zero points at the range ends, scales that saturate, dynamic batch at two
sizes; exact where ONNX Runtime fuses the group back (its default optimizations), within one
quantization step with its optimizations off. QLinearReduceMean has no CPU kernel in ONNX
Runtime 1.32: torch's quantize_per_tensor is its oracle."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

import decomposer

TYPES = [(np.uint8, TensorProto.UINT8), (np.int8, TensorProto.INT8)]
SHAPE = ["n", 8, 5, 5]


def _session(model, optimized=True):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL \
        if optimized else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _cases(dtype):
    """(op, inputs, scales and zero points, graph inputs, attributes) per form."""
    info = np.iinfo(dtype)

    def s(name, value):
        return nh.from_array(np.array(value, np.float32), name)

    def z(name, value):
        return nh.from_array(np.array(value, dtype), name)

    two = [("a", SHAPE), ("b", SHAPE)]
    one = [("a", SHAPE)]
    binary = ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"]
    unary = ["a", "sa", "za", "sc", "zc"]
    return [
        # zero points at both range ends, an output scale small enough to saturate
        ("QLinearAdd", binary, [s("sa", 0.05), z("za", info.min), s("sb", 0.11),
                                z("zb", info.max), s("sc", 0.02), z("zc", info.min + 5)],
         two, {}),
        ("QLinearMul", binary, [s("sa", 0.05), z("za", 3), s("sb", 0.11), z("zb", info.max),
                                s("sc", 0.3), z("zc", 0)], two, {}),
        ("QLinearSigmoid", unary, [s("sa", 0.05), z("za", 3), s("sc", 1 / 256),
                                   z("zc", info.min)], one, {}),
        ("QLinearLeakyRelu", unary, [s("sa", 0.05), z("za", 3), s("sc", 0.04),
                                     z("zc", 10)], one, {"alpha": 0.2}),
        ("QLinearSoftmax", unary, [s("sa", 0.05), z("za", 3), s("sc", 1 / 256),
                                   z("zc", info.min)], one, {"opset": 13, "axis": -1}),
        ("QLinearSoftmax", unary, [s("sa", 0.05), z("za", 3), s("sc", 1 / 256),
                                   z("zc", info.min)], one, {"opset": 11, "axis": 1}),
        ("QLinearGlobalAveragePool", unary, [s("sa", 0.05), z("za", 3), s("sc", 0.02),
                                             z("zc", 7)], one, {}),
        ("QLinearGlobalAveragePool", unary, [s("sa", 0.05), z("za", 3), s("sc", 0.02),
                                             z("zc", 7)], one, {"channels_last": 1}),
        ("QLinearAveragePool", unary, [s("sa", 0.05), z("za", 3), s("sc", 0.02), z("zc", 7)],
         one, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
        ("QLinearAveragePool", unary, [s("sa", 0.05), z("za", 3), s("sc", 0.02), z("zc", 7)],
         one, {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}),
        ("QLinearAveragePool", unary, [s("sa", 0.05), z("za", 3), s("sc", 0.02), z("zc", 7)],
         one, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "channels_last": 1}),
        ("QLinearConcat", ["sc", "zc", "a", "sa", "za", "b", "sb", "zb"],
         [s("sa", 0.05), z("za", 3), s("sb", 0.11), z("zb", info.max), s("sc", 0.1),
          z("zc", 0)], two, {"axis": 1}),
        ("QLinearWhere", ["c", "a", "sa", "za", "b", "sb", "zb", "sc", "zc"],
         [s("sa", 0.05), z("za", 3), s("sb", 0.11), z("zb", info.max), s("sc", 0.1),
          z("zc", 0)], [("c", SHAPE), *two], {}),
    ]


def _model(op, inputs, initializers, graph_inputs, attrs, elem, opset=17):
    values = [helper.make_tensor_value_info(name, TensorProto.BOOL if name == "c" else elem,
                                            shape) for name, shape in graph_inputs]
    graph = helper.make_graph(
        [helper.make_node(op, inputs, ["y"], domain="com.microsoft", name="q", **attrs)],
        "qlinear", values, [helper.make_tensor_value_info("y", elem, [None] * 4)],
        initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _feeds(dtype, batch, graph_inputs, seed):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    feeds = {}
    for name, _ in graph_inputs:
        if name == "c":
            feeds[name] = rng.random((batch, 8, 5, 5)) > 0.5
        else:
            values = rng.integers(info.min, info.max + 1, (batch, 8, 5, 5)).astype(dtype)
            values.reshape(-1)[:2] = (info.min, info.max)  # the range ends
            feeds[name] = values
    return feeds


def _label(case):
    op, _, _, _, attrs = case
    return op + "".join(f" {k}={v}" for k, v in attrs.items())


@pytest.mark.parametrize("index", range(len(_cases(np.uint8))),
                         ids=[_label(c) for c in _cases(np.uint8)])
@pytest.mark.parametrize("dtype, elem", TYPES, ids=["uint8", "int8"])
def test_qdq_form_equals_the_kernel(dtype, elem, index):
    op, inputs, initializers, graph_inputs, attrs = _cases(dtype)[index]
    for opset, target in ((17, None), (13, None), (17, 11)):
        model = _model(op, inputs, initializers, graph_inputs, attrs, elem, opset)
        out = decomposer.decompose(model) if target is None else \
            decomposer.decompose(model, target_opset=target)
        onnx.checker.check_model(out, full_check=True)
        assert {n.domain for n in out.graph.node} <= {""}
        kinds = {n.op_type for n in out.graph.node}
        assert {"DequantizeLinear", "QuantizeLinear"} <= kinds
        kernel, fused, plain = _session(model), _session(out), _session(out, optimized=False)
        for batch, seed in ((2, index), (1, index + 50)):
            feeds = _feeds(dtype, batch, graph_inputs, seed)
            (want,) = kernel.run(None, feeds)
            (got,) = fused.run(None, feeds)
            (unfused,) = plain.run(None, feeds)
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_array_equal(got, want)  # the kernel, fused back
            assert np.abs(unfused.astype(np.int32) - want.astype(np.int32)).max() <= 1


@pytest.mark.parametrize("dtype, elem", TYPES, ids=["uint8", "int8"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_mean_against_torch(dtype, elem, keepdims):
    info = np.iinfo(dtype)
    initializers = [nh.from_array(np.array(0.05, np.float32), "sa"),
                    nh.from_array(np.array(info.min + 3, dtype), "za"),
                    nh.from_array(np.array(0.01, np.float32), "sc"),
                    nh.from_array(np.array(info.max - 4, dtype), "zc")]
    graph = helper.make_graph(
        [helper.make_node("QLinearReduceMean", ["a", "sa", "za", "sc", "zc"], ["y"],
                          domain="com.microsoft", axes=[2, 3], keepdims=keepdims)], "mean",
        [helper.make_tensor_value_info("a", elem, SHAPE)],
        [helper.make_tensor_value_info("y", elem, [None] * (4 if keepdims else 2))],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    for batch in (2, 1):
        (feed,) = _feeds(dtype, batch, [("a", SHAPE)], batch).values()
        (got,) = _session(out).run(None, {"a": feed})
        floats = (torch.from_numpy(feed.astype(np.float32)) - (info.min + 3)) * 0.05
        mean = floats.mean(dim=(2, 3), keepdim=bool(keepdims))
        torch_type = torch.quint8 if dtype == np.uint8 else torch.qint8
        want = torch.quantize_per_tensor(mean, 0.01, int(info.max - 4), torch_type)
        np.testing.assert_array_equal(got, want.int_repr().numpy())


def test_per_channel_scales_are_refused_with_the_reason():
    initializers = [nh.from_array(np.full(8, 0.05, np.float32), "sa"),
                    nh.from_array(np.array(3, np.uint8), "za"),
                    nh.from_array(np.array(0.02, np.float32), "sc"),
                    nh.from_array(np.array(7, np.uint8), "zc")]
    model = _model("QLinearSigmoid", ["a", "sa", "za", "sc", "zc"], initializers,
                   [("a", SHAPE)], {}, TensorProto.UINT8)
    with pytest.raises(decomposer.UnsupportedNodeError, match="per tensor"):
        decomposer.decompose(model)


def test_run_time_scales_are_reshaped_to_scalars():
    """A scale fed at run time (one element) goes through a Reshape to ()."""
    graph = helper.make_graph(
        [helper.make_node("QLinearSigmoid", ["a", "sa", "za", "sc", "zc"], ["y"],
                          domain="com.microsoft")], "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, SHAPE),
         helper.make_tensor_value_info("sa", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [None] * 4)],
        [nh.from_array(np.array(3, np.uint8), "za"),
         nh.from_array(np.array(1 / 256, np.float32), "sc"),
         nh.from_array(np.array(0, np.uint8), "zc")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    out = decomposer.decompose(model)
    feeds = {"a": _feeds(np.uint8, 2, [("a", SHAPE)], 3)["a"],
             "sa": np.array([0.05], np.float32)}
    (want,) = _session(model).run(None, feeds)
    (got,) = _session(out).run(None, feeds)
    assert np.abs(got.astype(np.int32) - want.astype(np.int32)).max() <= 1


def portability_cases():
    """A QOperator block (Add, LeakyRelu, AveragePool, Concat, Sigmoid, GlobalAveragePool)
    as QDQ on every engine, ONNX Runtime's kernels on the original the oracle (within one
    quantization step, as an engine computes the float op its own way)."""
    dtype, elem = np.uint8, TensorProto.UINT8
    f = {"s1": 0.05, "s2": 0.04, "s3": 0.03, "s4": 1 / 256}
    initializers = [nh.from_array(np.array(v, np.float32), k) for k, v in f.items()]
    initializers += [nh.from_array(np.array(v, dtype), k)
                     for k, v in (("z1", 3), ("z2", 128), ("z3", 10), ("z4", 0))]
    nodes = [
        helper.make_node("QLinearAdd", ["a", "s1", "z1", "b", "s1", "z1", "s2", "z2"], ["t1"],
                         domain="com.microsoft"),
        helper.make_node("QLinearLeakyRelu", ["t1", "s2", "z2", "s3", "z3"], ["t2"],
                         domain="com.microsoft", alpha=0.1),
        helper.make_node("QLinearAveragePool", ["t2", "s3", "z3", "s3", "z3"], ["t3"],
                         domain="com.microsoft", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("QLinearConcat", ["s3", "z3", "t3", "s3", "z3", "t2", "s3", "z3"],
                         ["t4"], domain="com.microsoft", axis=1),
        helper.make_node("QLinearSigmoid", ["t4", "s3", "z3", "s4", "z4"], ["t5"],
                         domain="com.microsoft"),
        helper.make_node("QLinearGlobalAveragePool", ["t5", "s4", "z4", "s4", "z4"], ["y"],
                         domain="com.microsoft")]
    graph = helper.make_graph(nodes, "qoperator", [
        helper.make_tensor_value_info("a", elem, SHAPE),
        helper.make_tensor_value_info("b", elem, SHAPE)],
        [helper.make_tensor_value_info("y", elem, ["n", 16, 1, 1])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    feeds, expected = [], []
    for batch in (2, 1):
        feed = _feeds(dtype, batch, [("a", SHAPE), ("b", SHAPE)], batch)
        feeds.append(feed)
        expected.append([_session(model).run(None, feed)[0]])
    return [{"id": "contrib QOperator block as QDQ", "model": model, "feeds": feeds,
             "expected": expected, "atol": 1}]


@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
def test_a_constant_operand_is_dequantized_at_decompose_time(op):
    """A quantized bias (a constant B) becomes a float constant, no DequantizeLinear of a
    constant (OpenVINO's low-precision pass crashes on one in an Add); the kernel's numbers
    within one quantization step."""
    rng = np.random.default_rng(3)
    initializers = [nh.from_array(np.array(0.05, np.float32), "sa"),
                    nh.from_array(np.array(120, np.uint8), "za"),
                    nh.from_array(rng.integers(0, 256, (5,)).astype(np.uint8), "b"),
                    nh.from_array(np.array(0.02, np.float32), "sb"),
                    nh.from_array(np.array(7, np.uint8), "zb"),
                    nh.from_array(np.array(0.06, np.float32), "sc"),
                    nh.from_array(np.array(128, np.uint8), "zc")]
    graph = helper.make_graph(
        [helper.make_node(op, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"],
                          domain="com.microsoft")], "g",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, ["n", 5])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, ["n", 5])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    dequantized = [n for n in out.graph.node if n.op_type == "DequantizeLinear"]
    assert [n.input[0] for n in dequantized] == ["a"]
    for batch in (4, 1):
        a = rng.integers(0, 256, (batch, 5)).astype(np.uint8)
        (want,) = _session(model).run(None, {"a": a})
        (got,) = _session(out).run(None, {"a": a})
        assert np.abs(got.astype(np.int32) - want.astype(np.int32)).max() <= 1


def test_a_quantized_tied_bias_is_a_constant_operand_too():
    """quantize_static's QOperator BERT: a bias torch tied to another layer's (an Identity
    of it), quantized by a standard QuantizeLinear, feeding QLinearAdd. The QuantizeLinear
    of that constant is computed at decompose time as ONNX Runtime's kernel computes it, so
    no DequantizeLinear(QuantizeLinear(constant)) is left for OpenVINO's low-precision pass
    (it fails to compile that form: docs/performance.md); the kernel's numbers bit for bit
    with ONNX Runtime's optimizations on, and OpenVINO compiles and runs it (within a
    step)."""
    rng = np.random.default_rng(4)
    bias = (rng.standard_normal(6) * 0.3).astype(np.float32)
    bias[:3] = [0.05, -0.15, 0.25]  # exact halves of the 0.1 step below: ties round to even
    initializers = [nh.from_array(bias, "bias_0"),
                    nh.from_array(np.array(0.1, np.float32), "sb"),
                    nh.from_array(np.array(3, np.int8), "zb"),
                    nh.from_array(np.array(0.05, np.float32), "sa"),
                    nh.from_array(np.array(-5, np.int8), "za"),
                    nh.from_array(np.array(0.07, np.float32), "sc"),
                    nh.from_array(np.array(2, np.int8), "zc")]
    nodes = [helper.make_node("Identity", ["bias_0"], ["bias_1"]),
             helper.make_node("QuantizeLinear", ["bias_1", "sb", "zb"], ["bias_q"]),
             helper.make_node("QLinearAdd", ["bias_q", "sb", "zb", "a", "sa", "za", "sc", "zc"],
                              ["y"], domain="com.microsoft")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("a", TensorProto.INT8, ["n", 6])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, ["n", 6])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    assert [n.input[0] for n in out.graph.node if n.op_type == "DequantizeLinear"] == ["a"]
    a = rng.integers(-128, 128, (3, 6)).astype(np.int8)
    (want,) = _session(model).run(None, {"a": a})
    (got,) = _session(out).run(None, {"a": a})
    np.testing.assert_array_equal(got, want)
    # the folded bias is ONNX Runtime's own QuantizeLinear of it, bit for bit
    probe = helper.make_model(helper.make_graph(
        [helper.make_node("QuantizeLinear", ["b", "sb", "zb"], ["q"])], "q",
        [helper.make_tensor_value_info("b", TensorProto.FLOAT, [6])],
        [helper.make_tensor_value_info("q", TensorProto.INT8, [6])], initializers[1:3]),
        opset_imports=[helper.make_opsetid("", 17)])
    (kernel,) = _session(probe).run(None, {"b": bias})
    from decomposer.context import _quantized_constant
    folded = _quantized_constant(nodes[1], {"bias_1": initializers[0], "sb": initializers[1],
                                            "zb": initializers[2]}.get)
    assert folded is not None
    np.testing.assert_array_equal(nh.to_array(folded), kernel)
    from decomposer import engines
    if engines.available("openvino"):
        (there,) = engines.run_model("openvino", out, {"a": a})
        assert np.abs(there.astype(np.int32) - want.astype(np.int32)).max() <= 1
