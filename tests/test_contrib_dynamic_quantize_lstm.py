"""ONNX Runtime's DynamicQuantizeLSTM as unrolled cells on standard integer ops. Oracles:
ONNX Runtime's own kernel on the original node (one intra-op thread: the kernel splits the
batch across threads and quantizes each part on its own) on models written by its own
``quantize_dynamic`` from a torch LSTM and on hand-written nodes for the forms the tool
does not write (uint8 weights with a zero point, peepholes, clip, other activations);
torch's float LSTM bounds the quantization error."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

import decomposer
from decomposer import engines
from decomposer.cli import main

torch = pytest.importorskip("torch")


def _session(model, threads=1):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    """quantize_dynamic's output for a torch LSTM (bidirectional, 2 layers, dynamic
    batch), per tensor and per channel, with the float export and torch's module."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = tmp_path_factory.mktemp("dynamic_lstm")
    torch.manual_seed(0)
    module = torch.nn.LSTM(8, 16, num_layers=2, bidirectional=True).eval()
    source = folder / "float.onnx"
    torch.onnx.export(module, (torch.randn(5, 2, 8),), str(source), opset_version=17,
                      dynamo=False, input_names=["x"], output_names=["y", "y_h", "y_c"],
                      dynamic_axes={"x": {1: "N"}})
    models = {}
    for per_channel in (False, True):
        target = folder / f"quantized_{per_channel}.onnx"
        quantize_dynamic(str(source), str(target), weight_type=QuantType.QInt8,
                         per_channel=per_channel, op_types_to_quantize=["LSTM"])
        models[per_channel] = onnx.load(target)
    return models, module


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_quantize_dynamic_output_bit_for_bit(quantized, per_channel):
    models, _ = quantized
    model = models[per_channel]
    assert [n.op_type for n in model.graph.node].count("DynamicQuantizeLSTM") == 2
    out, report = decomposer.decompose_with_report(model)
    onnx.checker.check_model(out, full_check=True)
    assert {n.domain for n in out.graph.node} <= {""}
    assert report.unsupported == []
    kernel, ours = _session(model), _session(out)
    rng = np.random.default_rng(1)
    for batch in (1, 2, 3):
        feeds = {"x": rng.standard_normal((5, batch, 8)).astype(np.float32)}
        for want, got in zip(kernel.run(None, feeds), ours.run(None, feeds), strict=True):
            np.testing.assert_array_equal(got, want)
    # batch 1 (streaming) is the kernel's at any thread count
    feeds = {"x": rng.standard_normal((5, 1, 8)).astype(np.float32)}
    for want, got in zip(_session(model, 2).run(None, feeds), ours.run(None, feeds),
                         strict=True):
        np.testing.assert_array_equal(got, want)


def test_close_to_torch_float_lstm(quantized):
    """Independent of ONNX Runtime: int8 weights and activations stay near torch's float
    LSTM (the error is the quantization's, measured 0.02 here)."""
    models, module = quantized
    out = decomposer.decompose(models[True])
    x = torch.randn(5, 3, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = module(x)[0].numpy()
    (got, *_) = _session(out).run(None, {"x": x.numpy()})
    assert np.abs(got - want).max() < 0.05


def _node_model(*, direction="forward", weight_type=TensorProto.UINT8, zero=7,
                per_channel=False, peepholes=False, initial=False, clip=None,
                activations=None, bias=True, seed=0, steps=4, features=3, hidden=5):
    rng = np.random.default_rng(seed)
    count = 2 if direction == "bidirectional" else 1
    dtype = np.uint8 if weight_type == TensorProto.UINT8 else np.int8
    zero = zero if dtype == np.uint8 else 0
    low, high = (0, 255) if dtype == np.uint8 else (-127, 127)
    columns = 4 * hidden
    shape = (count, columns) if per_channel else (count,)
    inits = [nh.from_array(rng.integers(low, high, (count, features, columns)).astype(dtype),
                           "W"),
             nh.from_array(rng.integers(low, high, (count, hidden, columns)).astype(dtype),
                           "R"),
             nh.from_array((rng.uniform(0.002, 0.01, shape)).astype(np.float32), "W_scale"),
             nh.from_array(np.full(shape, zero, dtype), "W_zero_point"),
             nh.from_array((rng.uniform(0.002, 0.01, shape)).astype(np.float32), "R_scale"),
             nh.from_array(np.full(shape, zero, dtype), "R_zero_point")]
    inputs = ["x", "W", "R", "", "", "", "", "", "W_scale", "W_zero_point", "R_scale",
              "R_zero_point"]
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                  [steps, "N", features])]
    if bias:
        inputs[3] = "B"
        inits.append(nh.from_array(rng.standard_normal((count, 8 * hidden)).astype(
            np.float32) * 0.3, "B"))
    if peepholes:
        inputs[7] = "P"
        inits.append(nh.from_array(rng.standard_normal((count, 3 * hidden)).astype(
            np.float32) * 0.3, "P"))
    if initial:
        inputs[5:7] = ["h0", "c0"]
        graph_inputs += [helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                       [count, "N", hidden])
                         for name in ("h0", "c0")]
    attrs = {"hidden_size": hidden, "direction": direction}
    if clip is not None:
        attrs["clip"] = clip
    if activations is not None:
        attrs["activations"] = activations
    node = helper.make_node("DynamicQuantizeLSTM", inputs, ["y", "y_h", "y_c"],
                            domain="com.microsoft", name="qlstm", **attrs)
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [None] * rank)
               for n, rank in (("y", 4), ("y_h", 3), ("y_c", 3))]
    graph = helper.make_graph([node], "g", graph_inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


def _feeds(model, batch, seed):
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        dims = [batch if d.dim_param else d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


NODE_CASES = {
    "uint8 weights, zero point 7": {},
    "uint8, per channel, reverse": {"per_channel": True, "direction": "reverse"},
    "int8, bidirectional, states, peepholes": {"weight_type": TensorProto.INT8,
                                               "direction": "bidirectional",
                                               "initial": True, "peepholes": True},
    "clip, no bias": {"clip": 0.7, "bias": False},
    "other activations": {"activations": ["Relu", "Tanh", "Sigmoid"], "initial": True},
    "zero point at the range end": {"zero": 255, "per_channel": True},
}


@pytest.mark.parametrize("case", list(NODE_CASES))
def test_node_forms_against_the_kernel(case):
    model = _node_model(**NODE_CASES[case])
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    assert {n.domain for n in out.graph.node} <= {""}
    kernel, ours = _session(model), _session(out)
    for batch, seed in ((1, 3), (3, 4)):
        feeds = _feeds(model, batch, seed)
        for want, got in zip(kernel.run(None, feeds), ours.run(None, feeds), strict=True):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", ["uint8 weights, zero point 7",
                                  "int8, bidirectional, states, peepholes"])
def test_reference_follows_the_kernel(case):
    """The pattern's numpy reference (its ``compute``) is the kernel's arithmetic."""
    from decomposer.patterns.contrib_dynamic_quantize_lstm import DynamicQuantizeLSTM

    model = _node_model(**NODE_CASES[case])
    feeds = _feeds(model, 2, 5)
    inits = {i.name: nh.to_array(i) for i in model.graph.initializer}
    node = model.graph.node[0]
    roles = ["X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P", "W_scale",
             "W_zero_point", "R_scale", "R_zero_point"]
    tensors = {role: (feeds.get(name, inits.get(name)) if name else None)
               for role, name in zip(roles, node.input, strict=True)}
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    args = {"activations": None, "clip": attrs.get("clip"),
            "direction": attrs["direction"].decode()}
    got = DynamicQuantizeLSTM().compute(args, **tensors)
    want = _session(model).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)


@pytest.mark.parametrize("engine", ["openvino", "tvm"])
def test_runs_on_other_engines(quantized, engine):
    if not engines.available(engine):
        pytest.skip(f"{engine} is not installed")
    models, _ = quantized
    out = decomposer.decompose(models[True])
    feeds = {"x": np.random.default_rng(6).standard_normal((5, 1, 8)).astype(np.float32)}
    want = _session(models[True]).run(None, feeds)
    got = engines.run_model(engine, out, feeds)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5)


def test_bad_forms_exit_3_with_the_reason(tmp_path, capsys):
    model = _node_model()
    scale = next(i for i in model.graph.initializer if i.name == "W_scale")
    scale.CopyFrom(nh.from_array(np.full((1, 3), 0.01, np.float32), "W_scale"))
    source = tmp_path / "bad.onnx"
    onnx.save(model, source)
    assert main([str(source), str(tmp_path / "out.onnx")]) == 3
    err = capsys.readouterr().err
    assert "W_scale must be (1) or (1, 20)" in err and not (tmp_path / "out.onnx").exists()


def test_a_fixed_sequence_length_makes_a_dynamic_export_decompose(tmp_path):
    """torch's export with a dynamic time axis: refused with the engines that run it and
    the flag that fixes the length; with --overwrite-input-shape it decomposes."""
    from onnxruntime.quantization import quantize_dynamic

    torch.manual_seed(3)
    source, target = tmp_path / "lstm.onnx", tmp_path / "lstm_dynamic.onnx"
    torch.onnx.export(torch.nn.LSTM(8, 16), (torch.randn(5, 2, 8),), str(source),
                      opset_version=17, dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "steps", 1: "N"}})
    quantize_dynamic(str(source), str(target))
    model = onnx.load(target)
    with pytest.raises(decomposer.UnsupportedNodeError) as refused:
        decomposer.decompose(model)
    assert "--overwrite-input-shape" in str(refused.value)
    assert "OpenVINO" in str(refused.value)
    out = decomposer.decompose(model, input_shapes={"x": [5, "N", 8]})
    assert {n.domain for n in out.graph.node} <= {""}
    feeds = {"x": np.random.default_rng(7).standard_normal((5, 2, 8)).astype(np.float32)}
    for want, got in zip(_session(model).run(None, feeds), _session(out).run(None, feeds),
                         strict=True):
        np.testing.assert_array_equal(got, want)


def portability_cases():
    """A bidirectional DynamicQuantizeLSTM with states and peepholes on every engine of the
    portability suite: ONNX Runtime's kernel (one thread) on the original the oracle."""
    model = _node_model(**NODE_CASES["int8, bidirectional, states, peepholes"])
    feeds = [_feeds(model, 1, 8), _feeds(model, 3, 9)]
    kernel = _session(model)
    expected = [kernel.run(None, f) for f in feeds]
    return [{"id": "contrib DynamicQuantizeLSTM", "model": model, "feeds": feeds,
             "expected": expected, "atol": 1e-4}]
