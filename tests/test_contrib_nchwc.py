"""ONNX Runtime's com.microsoft.nchwc region (a float CNN saved from an ORT_ENABLE_ALL
session) back to plain NCHW standard ops, against ONNX Runtime's nchwc kernels on the saved
model and torch on the float model: a plain 3-channel input and a reordered 16-channel one,
grouped and depthwise Convs, fused activations (Relu, LeakyRelu, Sigmoid, Clip), a fused
residual Add (Conv's Sum input), MaxPool, AveragePool and GlobalAveragePool in the blocked
layout, dynamic batch; and on OpenVINO and TVM (TVM under ``exhaustive``)."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import decomposer
from decomposer import engines
from decomposer.patterns.contrib_nchwc import block_size

from _helpers import save_optimized


class Blocks(torch.nn.Module):
    def __init__(self, inputs: int) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(inputs, 20, 3, padding=1)
        self.b = torch.nn.Conv2d(20, 24, 3, padding=1)
        self.c = torch.nn.Conv2d(24, 24, 3, padding=1, groups=24)
        self.d = torch.nn.Conv2d(24, 24, 1)
        self.e = torch.nn.Conv2d(24, 32, 3, padding=1, groups=2)

    def forward(self, x):
        a = torch.nn.functional.leaky_relu(self.a(x), 0.2)
        b = torch.sigmoid(self.b(a))
        c = torch.relu(self.c(b) + b)  # a residual: the Conv's Sum input
        c = torch.nn.functional.max_pool2d(c, 2)
        d = torch.clamp(self.d(c), 0, 6)
        d = torch.nn.functional.avg_pool2d(d, 2)
        e = self.e(d)
        return torch.nn.functional.adaptive_avg_pool2d(e, 1)


def _saved(tmp_path, inputs):
    torch.manual_seed(inputs)
    net = Blocks(inputs).eval()
    source, target = tmp_path / "float.onnx", tmp_path / "all.onnx"
    torch.onnx.export(net, (torch.randn(1, inputs, 16, 16),), str(source), opset_version=17,
                      dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    return net, save_optimized(source, target)


def _run(model, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


pytestmark = pytest.mark.skipif(block_size() is None,
                                reason="this ONNX Runtime has no NCHWc kernels")


@pytest.mark.parametrize("inputs", [3, 16], ids=["plain input", "reordered input"])
def test_equals_the_nchwc_kernels_and_torch(tmp_path, inputs):
    net, model = _saved(tmp_path, inputs)
    kinds = collections.Counter(f"{n.domain}:{n.op_type}" for n in model.graph.node
                                if n.domain)
    assert {"com.microsoft.nchwc:Conv", "com.microsoft.nchwc:ReorderOutput"} <= set(kinds)
    if inputs == 16:
        assert "com.microsoft.nchwc:ReorderInput" in kinds
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    assert {n.domain for n in out.graph.node} <= {""}
    rng = np.random.default_rng(inputs)
    for batch in (2, 1):
        x = rng.standard_normal((batch, inputs, 16, 16)).astype(np.float32)
        got = _run(out, {"x": x})
        np.testing.assert_allclose(got, _run(model, {"x": x}), rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            want = net(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("engine", ["openvino", pytest.param("tvm", marks=pytest.mark.exhaustive)])
def test_runs_on(tmp_path, engine):
    if not engines.available(engine):
        pytest.skip(f"{engine} is not installed")
    net, model = _saved(tmp_path, 16)
    out = decomposer.decompose(model)
    x = np.random.default_rng(4).standard_normal((2, 16, 16, 16)).astype(np.float32)
    (got,) = engines.run_model(engine, out, {"x": x})
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_run_writes_nothing_into_the_working_directory(tmp_path, monkeypatch):
    """This model leaves ONNX Runtime's symbolic shape inference incomplete, and its
    infer_shapes then saves sym_shape_infer_temp.onnx (and external data) into the working
    directory; decomposer runs the tool's loop without that step."""
    folder = tmp_path / "model"
    folder.mkdir()
    _, model = _saved(folder, 16)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    decomposer.decompose(model)
    assert list(work.iterdir()) == []


class Upsampling(torch.nn.Module):
    """A segmentation/FPN head's upsampling between Convs, as ORT's NCHWc transformer turns
    it into com.microsoft.nchwc Upsample."""

    def __init__(self, align_corners: bool) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 20, 3, padding=1)
        self.b = torch.nn.Conv2d(20, 8, 3, padding=1)
        self.align_corners = align_corners

    def forward(self, x):
        a = torch.relu(self.a(x))
        up = torch.nn.functional.interpolate(a, scale_factor=(2, 3), mode="bilinear",
                                             align_corners=self.align_corners)
        return self.b(up)


@pytest.mark.parametrize("align_corners", [False, True])
def test_upsample_equals_the_nchwc_kernel_and_torch(tmp_path, align_corners):
    torch.manual_seed(5)
    net = Upsampling(align_corners).eval()
    source, target = tmp_path / "float.onnx", tmp_path / "all.onnx"
    torch.onnx.export(net, (torch.randn(1, 3, 7, 9),), str(source), opset_version=13,
                      dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    model = save_optimized(source, target)
    upsample = [n for n in model.graph.node if n.op_type == "Upsample"]
    assert [n.domain for n in upsample] == ["com.microsoft.nchwc"]
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    assert {n.domain for n in out.graph.node} <= {""}
    assert "Resize" in {n.op_type for n in out.graph.node}
    rng = np.random.default_rng(6)
    for batch in (2, 1):
        x = rng.standard_normal((batch, 3, 7, 9)).astype(np.float32)
        got = _run(out, {"x": x})
        np.testing.assert_allclose(got, _run(model, {"x": x}), rtol=1e-5, atol=1e-5)
        with torch.no_grad():
            want = net(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        for engine in ("openvino", "tvm"):
            if engines.available(engine):
                (there,) = engines.run_model(engine, out, {"x": x})
                np.testing.assert_allclose(there, want, rtol=1e-4, atol=1e-4, err_msg=engine)


@pytest.mark.parametrize("opset", [11, 17])
def test_nearest_upsample_equals_the_nchwc_kernel(opset):
    """Nearest (the schema's default mode, which ORT 1.32's transformer does not write from
    a Resize, so the node is written here): input pixel floor(y / scale), against ONNX
    Runtime's own nchwc Upsample kernel between a ReorderInput and a ReorderOutput (12
    channels: its ReorderInput takes multiples of 4, padded to the block size)."""
    nodes = [onnx.helper.make_node("ReorderInput", ["x"], ["blocked"],
                                   domain="com.microsoft.nchwc"),
             onnx.helper.make_node("Upsample", ["blocked"], ["up"], domain="com.microsoft.nchwc",
                                   scales=[1, 1, 3, 2]),
             onnx.helper.make_node("ReorderOutput", ["up"], ["y"], domain="com.microsoft.nchwc",
                                   channels=12)]
    graph = onnx.helper.make_graph(
        nodes, "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                        ["n", 12, 4, 6])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 12, 12, 12])])
    model = onnx.helper.make_model(graph, opset_imports=[
        onnx.helper.make_opsetid("", opset), onnx.helper.make_opsetid("com.microsoft.nchwc", 1)])
    model.ir_version = 7
    out = decomposer.decompose(model)
    assert {n.domain for n in out.graph.node} <= {""}
    x = np.random.default_rng(7).standard_normal((2, 12, 4, 6)).astype(np.float32)
    got = _run(out, {"x": x})
    np.testing.assert_array_equal(got, _run(model, {"x": x}))
    np.testing.assert_array_equal(got, np.repeat(np.repeat(x, 3, axis=2), 2, axis=3))
