"""ReduceL1, ReduceLogSum and ReduceLogSumExp lowered (``--lower``) for OpenVINO, which
ignores their axes at opsets 13-17. Oracle: ONNX Runtime's own kernels for the ops (and the
ONNX backend node tests' expected outputs, through the kit's reference)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import decomposer
from decomposer import engines
from decomposer.testing import run_onnxruntime

OPS = ["ReduceL1", "ReduceLogSum", "ReduceLogSumExp"]


def _model(op: str, opset: int, axes, keepdims: int, noop: int = 0) -> onnx.ModelProto:
    nodes, attrs = [], {"keepdims": keepdims}
    inputs = ["x"]
    if opset >= 18:
        if axes is not None:
            nodes.append(helper.make_node("Constant", [], ["axes"], value_ints=axes))
            inputs.append("axes")
        if noop:
            attrs["noop_with_empty_axes"] = noop
    elif axes is not None:
        attrs["axes"] = axes
    nodes.append(helper.make_node(op, inputs, ["y"], name="reduce", **attrs))
    dims: list = ["N", 3, 4, 5]
    if not (noop and axes is None):
        reduced = {a % 4 for a in axes} if axes is not None else set(range(4))
        dims = [1 if i in reduced else d for i, d in enumerate(dims) if keepdims or
                i not in reduced]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["N", 3, 4, 5])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, dims)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _inputs(op: str) -> list[np.ndarray]:
    rng = np.random.default_rng(len(op))
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    if op == "ReduceLogSum":
        x = np.abs(x) + 0.1
    big = (x * 40).astype(np.float32)  # exp overflows float32 unless the maximum is shifted
    inf = x.copy()
    inf[0, 0] = -np.inf
    inf[1, 1, 0, 0] = np.inf
    return [x, big, inf] if op == "ReduceLogSumExp" else [x]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("opset", [11, 13, 17, 18])
@pytest.mark.parametrize("axes, keepdims", [([2], 1), ([1, -1], 0), (None, 1), (None, 0)])
def test_equals_onnx_runtime_kernel(op, opset, axes, keepdims):
    model = _model(op, opset, axes, keepdims)
    out, report = decomposer.decompose_with_report(model, lower=[op])
    onnx.checker.check_model(out, full_check=True)
    assert report.counts == {op: 1} and op not in {n.op_type for n in out.graph.node}
    for x in _inputs(op):
        (want,) = run_onnxruntime(model, {"x": x})
        (got,) = run_onnxruntime(out, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", OPS)
def test_noop_with_empty_axes(op):
    model = _model(op, 18, None, 1, noop=1)
    out = decomposer.decompose(model, lower=[op])
    x = _inputs(op)[0]
    np.testing.assert_allclose(run_onnxruntime(out, {"x": x})[0],
                               run_onnxruntime(model, {"x": x})[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("opset", [13, 17])
def test_openvino_is_right_once_lowered(op, opset):
    model = _model(op, opset, [2], 1)
    x = _inputs(op)[0]
    (want,) = run_onnxruntime(model, {"x": x})
    (wrong,) = engines.run_model("openvino", model, {"x": x})
    assert wrong.shape != want.shape  # the gap engine_support.json records
    (got,) = engines.run_model("openvino", decomposer.decompose(model, lower=[op]), {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_float16_log_sum_exp_below_opset_20_is_valid():
    # IsInf takes float16 only from opset 20: the shift's infinity test must not use it
    model = _model("ReduceLogSumExp", 17, [2], 1)
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.elem_type = TensorProto.FLOAT16
    out = decomposer.decompose(model, lower=["ReduceLogSumExp"])
    onnx.checker.check_model(out, full_check=True)
    x = _inputs("ReduceLogSumExp")[2].astype(np.float16)
    (got,) = run_onnxruntime(out, {"x": x})
    wide = x.astype(np.float64)
    peak = np.max(wide, axis=2, keepdims=True)
    shift = np.where(np.isinf(peak), 0.0, peak)
    with np.errstate(invalid="ignore"):
        want = np.log(np.sum(np.exp(wide - shift), axis=2, keepdims=True)) + shift
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3)


def portability_cases():
    """The three reductions at opset 13 (where OpenVINO ignores their axes), lowered;
    torch's sum of magnitudes, log of the sum and logsumexp the oracle."""
    import torch

    nodes = [helper.make_node("ReduceL1", ["x"], ["l1"], axes=[2], keepdims=1),
             helper.make_node("ReduceLogSum", ["p"], ["ls"], axes=[1, -1], keepdims=0),
             helper.make_node("ReduceLogSumExp", ["x"], ["lse"], axes=[-1], keepdims=1)]
    graph = helper.make_graph(
        nodes, "reductions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 4, 5]),
         helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 3, 4, 5])],
        [helper.make_tensor_value_info("l1", TensorProto.FLOAT, ["N", 3, 1, 5]),
         helper.make_tensor_value_info("ls", TensorProto.FLOAT, ["N", 4]),
         helper.make_tensor_value_info("lse", TensorProto.FLOAT, ["N", 3, 4, 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    rng = np.random.default_rng(9)
    feeds, expected = [], []
    for batch in (2, 1):
        x = (rng.standard_normal((batch, 3, 4, 5)) * 30).astype(np.float32)
        p = rng.uniform(0.1, 2.0, (batch, 3, 4, 5)).astype(np.float32)
        feeds.append({"x": x, "p": p})
        tx, tp = torch.from_numpy(x), torch.from_numpy(p)
        expected.append([tx.abs().sum(2, keepdim=True).numpy(),
                         torch.log(tp.sum((1, 3))).numpy(),
                         torch.logsumexp(tx, -1, keepdim=True).numpy()])
    return [{"id": "ReduceL1/LogSum/LogSumExp at 13, lowered", "model": model,
             "feeds": feeds, "expected": expected, "atol": 1e-4, "lower": OPS}]
