"""``--lower QLinearMatMul`` (as QDQ, for TVM and TensorRT, which lack the op) against ONNX
Runtime's own QLinearMatMul kernel: uint8/int8 operands, per-tensor and per-column weight
scales and zero points, zero points near the ends of their ranges, batched a, dynamic
leading dims at two sizes, opsets 11 (per tensor), 13 and 17, with ONNX Runtime's
optimizations on (it fuses the group back into its kernel: bit for bit) and off (the float
path: within one step); the refusals; and quantize_static's QOperator BERT under ``--target
tvm``, on TVM."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

import decomposer
from decomposer import engines

from _helpers import random_integers


def _session(model, optimized=True):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimized:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _model(a_dtype, a_dims, b, b_scale, b_zero, a_zero, y_zero, opset=17, constant=True):
    elem = helper.np_dtype_to_tensor_dtype
    values = {"as": np.array(0.05, np.float32), "az": np.array(a_zero, a_dtype), "b": b,
              "bs": b_scale, "bz": b_zero, "ys": np.array(0.9, np.float32),
              "yz": np.array(y_zero, a_dtype)}
    inputs = [helper.make_tensor_value_info("a", elem(np.dtype(a_dtype)), a_dims)]
    if not constant:  # the y scale fed at run time
        inputs.append(helper.make_tensor_value_info("ys", TensorProto.FLOAT, []))
        del values["ys"]
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"],
                            ["y"])
    graph = helper.make_graph(
        [node], "g", inputs,
        [helper.make_tensor_value_info("y", elem(np.dtype(a_dtype)), [None] * len(a_dims))],
        [nh.from_array(v, k) for k, v in values.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _weights(rng, b_dtype, k, n, per_column):
    b = random_integers(rng, b_dtype, (k, n))
    if per_column:
        scale = rng.uniform(0.005, 0.02, n).astype(np.float32)
        zero = (rng.integers(-3, 4, n) if b_dtype == np.int8 else rng.integers(120, 136, n)
                ).astype(b_dtype)
    else:
        scale = np.array(0.01, np.float32)
        zero = np.array(0 if b_dtype == np.int8 else 128, b_dtype)
    return b, scale, zero


CASES = [
    # (a dtype, b dtype, per column, a zero, y zero)
    (np.uint8, np.int8, False, 131, 5),
    (np.uint8, np.int8, True, 0, 250),
    (np.int8, np.int8, True, -128, 120),
    (np.uint8, np.uint8, False, 255, 128),
    (np.uint8, np.uint8, True, 3, 200),  # (ONNX Runtime has no int8 a with uint8 b)
]


# per-column scales need opset 13 (refused below it: test_refusals_name_the_reason)
GRID = [pytest.param(opset, *case, id=f"case{index}-{opset}")
        for index, case in enumerate(CASES) for opset in (11, 13, 17)
        if opset >= 13 or not case[2]]


@pytest.mark.parametrize("opset, a_dtype, b_dtype, per_column, a_zero, y_zero", GRID)
def test_equals_the_kernel(opset, a_dtype, b_dtype, per_column, a_zero, y_zero):
    rng = np.random.default_rng(opset + len(CASES) * int(per_column) + a_zero % 7)
    b, scale, zero = _weights(rng, b_dtype, 48, 6, per_column)
    model = _model(a_dtype, ["n", "m", 48], b, scale, zero, a_zero, y_zero, opset)
    assert decomposer.decompose(model).graph.node[0].op_type == "QLinearMatMul"
    out = decomposer.decompose(model, lower=["QLinearMatMul"])
    onnx.checker.check_model(out, full_check=True)
    assert "QLinearMatMul" not in {n.op_type for n in out.graph.node}
    kernel, fused, unfused = _session(model), _session(out), _session(out, optimized=False)
    for shape in ((3, 5, 48), (1, 2, 48)):
        feeds = {"a": random_integers(rng, a_dtype, shape)}
        want = kernel.run(None, feeds)[0]
        got = fused.run(None, feeds)[0]
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
        steps = np.abs(unfused.run(None, feeds)[0].astype(np.int32) - want.astype(np.int32))
        assert steps.max() <= 1


@pytest.mark.parametrize("change, reason", [
    ("per-row a", "a_scale must be one value"),
    ("run-time scale", "y_scale must be a constant"),
    ("per-column at 11", "per-column scales need DequantizeLinear's axis"),
])
def test_refusals_name_the_reason(change, reason):
    rng = np.random.default_rng(5)
    b, scale, zero = _weights(rng, np.int8, 8, 3, per_column=change == "per-column at 11")
    model = _model(np.uint8, [4, 8], b, scale, zero, 10, 20,
                   opset=11 if change == "per-column at 11" else 17,
                   constant=change != "run-time scale")
    if change == "per-row a":
        a_scale = next(i for i in model.graph.initializer if i.name == "as")
        a_scale.CopyFrom(nh.from_array(np.full(4, 0.05, np.float32), "as"))
    with pytest.raises(decomposer.UnsupportedNodeError, match=reason):
        decomposer.decompose(model, lower=["QLinearMatMul"])


@pytest.fixture(scope="module")
def bert_qoperator(tmp_path_factory):
    from hf_models import bert_qoperator

    model = bert_qoperator(tmp_path_factory.mktemp("qlinear_matmul"), sequence=8,
                           vocab_size=100, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=64,
                           max_position_embeddings=32)
    assert "QLinearMatMul" in {n.op_type for n in model.graph.node}
    return model


def _bert_feeds(seed, batch, sequence):
    rng = np.random.default_rng(seed)
    mask = (rng.random((batch, sequence)) > 0.25).astype(np.int64)
    mask[:, 0] = 1
    return {"ids": rng.integers(0, 100, (batch, sequence)).astype(np.int64), "mask": mask}


def test_qoperator_bert_lowered_whole_is_the_kernels(bert_qoperator):
    out = decomposer.decompose(bert_qoperator, lower=["QLinearMatMul"])
    onnx.checker.check_model(out, full_check=True)
    assert "QLinearMatMul" not in {n.op_type for n in out.graph.node}
    for seed, batch, sequence in ((1, 2, 8), (2, 1, 5)):
        feeds = _bert_feeds(seed, batch, sequence)
        np.testing.assert_array_equal(_session(out).run(None, feeds)[0],
                                      _session(bert_qoperator).run(None, feeds)[0])


@pytest.mark.skipif(not engines.available("tvm"), reason="TVM is not installed")
def test_tvm_target_runs_the_qoperator_bert(bert_qoperator):
    """TVM 0.27 refuses QLinearMatMul ("not supported for frontend ONNX", measured); its
    target lowers it, and TVM gives ONNX Runtime's numbers on the original."""
    out = decomposer.decompose(bert_qoperator, target="tvm")
    assert "QLinearMatMul" not in {n.op_type for n in out.graph.node}
    feeds = _bert_feeds(3, 2, 8)
    (got,) = engines.run_model("tvm", out, feeds)
    np.testing.assert_allclose(got, _session(bert_qoperator).run(None, feeds)[0], rtol=0,
                               atol=1e-5)


def portability_cases():
    """The lowering on every engine, ONNX Runtime's kernel the oracle (within one step of
    the output's scale, 0.9: an engine computing the float path may round a tie the other
    way)."""
    rng = np.random.default_rng(9)
    b, scale, zero = _weights(rng, np.int8, 32, 5, per_column=True)
    model = _model(np.uint8, ["n", 32], b, scale, zero, 131, 7)
    feeds = [{"a": random_integers(rng, np.uint8, (n, 32))} for n in (3, 1)]
    expected = [_session(model).run(None, f) for f in feeds]
    return [{"id": "QLinearMatMul lowered", "model": model, "feeds": feeds,
             "expected": expected, "atol": 1, "lower": ("QLinearMatMul",)}]
