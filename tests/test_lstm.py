"""LSTM unrolled into cells (``--lower LSTM``, the TVM target). Oracles: ONNX Runtime's own
LSTM kernel (layout 0), ONNX's reference evaluator (layout 1, which ONNX Runtime refuses)
and torch's nn.LSTM."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import decomposer
from decomposer import engines
from decomposer.errors import UnsupportedNodeError
from decomposer.testing import run_onnxruntime


def _model(steps, batch, features, hidden, *, direction="forward", layout=0, opset=14,
           peepholes=False, initial=False, clip=None, activations=None, seed=0,
           dynamic_batch=False):
    rng = np.random.default_rng(seed)
    count = 2 if direction == "bidirectional" else 1
    weights = [numpy_helper.from_array(
        (rng.standard_normal(shape) * 0.5).astype(np.float32), name) for name, shape in
        [("W", (count, 4 * hidden, features)), ("R", (count, 4 * hidden, hidden)),
         ("B", (count, 8 * hidden))]]
    inputs = ["x", "W", "R", "B", "", "", "", ""]
    batch_dim = "N" if dynamic_batch else batch
    x_dims = [batch_dim, steps, features] if layout else [steps, batch_dim, features]
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)]
    feeds = {"x": rng.standard_normal((batch, steps, features) if layout else
                                      (steps, batch, features)).astype(np.float32)}
    if initial:
        inputs[5:7] = ["h0", "c0"]
        for name in ("h0", "c0"):
            shape = (batch, count, hidden) if layout else (count, batch, hidden)
            graph_inputs.append(helper.make_tensor_value_info(
                name, TensorProto.FLOAT, [batch_dim, count, hidden] if layout else
                [count, batch_dim, hidden]))
            feeds[name] = rng.standard_normal(shape).astype(np.float32)
    if peepholes:
        inputs[7] = "P"
        weights.append(numpy_helper.from_array(
            rng.standard_normal((count, 3 * hidden)).astype(np.float32), "P"))
    while inputs[-1] == "":
        inputs.pop()
    attrs = {"hidden_size": hidden, "direction": direction}
    if opset >= 14:
        attrs["layout"] = layout
    if clip is not None:
        attrs["clip"] = clip
    if activations is not None:
        attrs["activations"] = activations
    node = helper.make_node("LSTM", inputs, ["y", "y_h", "y_c"], name="lstm", **attrs)
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None] * rank)
               for name, rank in (("y", 4), ("y_h", 3), ("y_c", 3))]
    graph = helper.make_graph([node], "lstm", graph_inputs, outputs, weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]), feeds


CASES = {
    "forward": {"steps": 5, "batch": 2, "features": 3, "hidden": 4},
    "reverse": {"steps": 4, "batch": 3, "features": 2, "hidden": 3, "direction": "reverse"},
    "bidirectional, states, peepholes": {"steps": 3, "batch": 2, "features": 3, "hidden": 2,
                                         "direction": "bidirectional", "initial": True,
                                         "peepholes": True},
    "clip": {"steps": 5, "batch": 1, "features": 3, "hidden": 4, "clip": 0.5},
    "other activations": {"steps": 3, "batch": 2, "features": 3, "hidden": 2,
                          "direction": "bidirectional",
                          "activations": ["Relu", "Tanh", "Sigmoid", "Sigmoid", "Relu",
                                          "Tanh"]},
    "opset 11": {"steps": 6, "batch": 2, "features": 3, "hidden": 5, "opset": 11},
    "dynamic batch": {"steps": 4, "batch": 3, "features": 3, "hidden": 2,
                      "dynamic_batch": True, "initial": True},
}


@pytest.mark.parametrize("case", list(CASES))
def test_equals_onnx_runtime_kernel(case):
    model, feeds = _model(**CASES[case])
    out, report = decomposer.decompose_with_report(model, lower=["LSTM"])
    onnx.checker.check_model(out, full_check=True)
    assert report.counts == {"LSTM": 1} and "LSTM" not in {n.op_type for n in out.graph.node}
    for want, got in zip(run_onnxruntime(model, feeds), run_onnxruntime(out, feeds),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_batch_major_layout_equals_onnx_reference(direction):
    # ONNX Runtime's kernel refuses layout=1 ("Batchwise recurrent operations ... are not
    # supported"): ONNX's reference evaluator is the oracle
    model, feeds = _model(4, 2, 3, 2, direction=direction, layout=1, initial=True)
    out = decomposer.decompose(model, lower=["LSTM"])
    want = ReferenceEvaluator(model).run(None, feeds)
    for expected, got in zip(want, run_onnxruntime(out, feeds), strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_torch_lstm_exported_and_lowered_runs_on_tvm():
    import io

    import torch

    torch.manual_seed(0)
    net = torch.nn.LSTM(8, 16, num_layers=2, bidirectional=True).eval()
    x = torch.randn(10, 1, 8)
    buffer = io.BytesIO()
    torch.onnx.export(net, (x,), buffer, dynamo=False, opset_version=14, input_names=["x"])
    model = onnx.load_from_string(buffer.getvalue())
    with torch.no_grad():
        want = [t.numpy() for t in (net(x)[0], *net(x)[1])]
    out = decomposer.decompose(model, target="tvm")
    assert "LSTM" not in {n.op_type for n in out.graph.node}
    feeds = {"x": x.numpy()}
    with pytest.raises(Exception, match="LSTM"):
        engines.run_model("tvm", model, feeds)
    for engine in ("ort", "tvm"):
        got = engines.run_model(engine, out, feeds)
        for expected, value in zip(want, got, strict=True):
            np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("change, reason", [
    ({"input_forget": 1}, "input_forget"),
    ({"activations": ["HardSigmoid", "Tanh", "Tanh"]}, "HardSigmoid"),
])
def test_refusals_name_the_reason(change, reason):
    model, _ = _model(3, 1, 2, 2)
    for key, value in change.items():
        model.graph.node[0].attribute.append(helper.make_attribute(key, value))
    with pytest.raises(UnsupportedNodeError, match=reason):
        decomposer.decompose(model, lower=["LSTM"])


def test_dynamic_sequence_length_is_refused():
    model, _ = _model(3, 1, 2, 2)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "S"
    with pytest.raises(UnsupportedNodeError, match="sequence length is not static"):
        decomposer.decompose(model, lower=["LSTM"])


def test_an_empty_sequence_is_refused():
    """A fuzz finding (on DynamicQuantizeLSTM, which shares the cells): 0 steps unrolled no
    cell and failed an assertion (exit 4)."""
    model, _ = _model(3, 1, 2, 2)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 0
    with pytest.raises(UnsupportedNodeError, match="empty sequence"):
        decomposer.decompose(model, lower=["LSTM"], check=False)


def portability_cases():
    """A bidirectional LSTM with initial states and peepholes, lowered; ONNX Runtime's
    kernel on the original the oracle."""
    model, feeds = _model(4, 2, 3, 3, direction="bidirectional", initial=True,
                          peepholes=True, seed=3)
    return [{"id": "LSTM bidirectional, lowered", "model": model, "feeds": [feeds],
             "expected": [run_onnxruntime(model, feeds)], "atol": 1e-5, "lower": ["LSTM"]}]
