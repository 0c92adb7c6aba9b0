"""decomposer.torch.define: a pure-torch function becomes the ONNX function that defines a
custom op, and a model holding that op decomposes with it (no Python pattern).

Oracle: the torch function itself in eager mode.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from test_multi_scale_deformable_attention import msda_on_tensors

import decomposer
from decomposer import engines
from decomposer.torch.define import define, write_library

BATCH = torch.export.Dim("batch", min=1, max=64)
QUERIES = torch.export.Dim("queries", min=2, max=512)


def scaled_mish(x, alpha):
    return alpha * x * torch.tanh(F.softplus(x))


LEVELS = ((8, 8), (4, 4))  # the levels' spatial sizes, fixed per model


def deform_attn(value, sampling_locations, attention_weights):
    """mmcv's multi_scale_deform_attn_pytorch with the level sizes of this model."""
    return msda_on_tensors(value, LEVELS, sampling_locations, attention_weights)


def _deform_inputs(batch: int, queries: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    value = torch.randn(batch, sum(h * w for h, w in LEVELS), 2, 4, generator=g)
    locations = torch.rand(batch, queries, 2, len(LEVELS), 3, 2, generator=g)
    weights = torch.softmax(torch.randn(batch, queries, 2, len(LEVELS) * 3, generator=g), -1)
    return value, locations, weights.view(batch, queries, 2, len(LEVELS), 3)


def _call_model(function: onnx.FunctionProto, inputs, opset: int, out_dims
                ) -> onnx.ModelProto:
    names = [f"in{i}" for i in range(len(inputs))]
    dims = [[f"d{i}_{j}" for j in range(t.dim())] for i, t in enumerate(inputs)]
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node(function.name, names, ["out"], domain=function.domain,
                               name="call")],
        "g", [onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, d)
              for n, d in zip(names, dims, strict=True)],
        [onnx.helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, out_dims)])
    model = onnx.helper.make_model(graph, opset_imports=[
        onnx.helper.make_opsetid("", opset), onnx.helper.make_opsetid(function.domain, 1)])
    model.ir_version = 8
    return model


def test_define_with_a_float_attribute_and_dynamic_dims(tmp_path):
    x = torch.randn(2, 5, 7)
    function = define(scaled_mish, (x,), domain="mylab", name="ScaledMish",
                      attributes={"alpha": 1.0},
                      dynamic_shapes=({0: BATCH, 2: torch.export.Dim("width")},))
    assert function.domain == "mylab" and list(function.attribute_proto)[0].f == 1.0
    library = write_library([function], tmp_path / "lib.onnx")
    registry = decomposer.registry.build_registry(entry_points=False)
    decomposer.plugins.load_pattern_source(str(library), registry)
    model = _call_model(function, [x], 17, ["d0_0", "d0_1", "d0_2"])
    model.graph.node[0].attribute.append(onnx.helper.make_attribute("alpha", 0.25))
    out = decomposer.decompose(model, registry=registry)
    for shape in [(2, 5, 7), (3, 5, 11)]:
        value = torch.randn(*shape)
        want = scaled_mish(value, 0.25).numpy()
        for engine in ("ort", "openvino", "tvm"):
            got = engines.run_model(engine, out, {"in0": value.numpy()})[0]
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=engine)


def test_define_mmcv_deformable_attention_reference():
    inputs = _deform_inputs(2, 6)
    function = define(deform_attn, inputs, domain="mmcv", name="MultiScaleDeformAttnRef",
                      dynamic_shapes=({0: BATCH}, {0: BATCH, 1: QUERIES},
                                      {0: BATCH, 1: QUERIES}))
    registry = decomposer.registry.build_registry(entry_points=False)
    for pattern in decomposer.functions.function_patterns([function], "test"):
        registry.register(pattern)
    for opset in (16, 18):
        out = decomposer.decompose(_call_model(function, inputs, opset, ["d0_0", "d1_1", 8]),
                                   registry=registry)
        for batch, queries in [(2, 6), (1, 9)]:
            feeds = _deform_inputs(batch, queries, seed=batch)
            want = deform_attn(*feeds).numpy()
            for engine in ("ort", "openvino"):
                got = engines.run_model(engine, out, {f"in{i}": t.numpy()
                                                      for i, t in enumerate(feeds)})[0]
                np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=engine)


def test_data_dependent_shapes_are_refused_with_the_reason():
    def take_first(x, counts):
        if counts.tolist()[0] > 2:  # a branch on tensor values: no static graph has it
            return x * 2
        return x

    with pytest.raises(decomposer.ExportError, match=r"define\(take_first\)") as refused:
        define(take_first, (torch.randn(6, 2), torch.tensor([3, 1])), domain="mylab")
    text = str(refused.value)
    assert "torch.export.export failed" in text and "data-dependent" in text
    assert "\n" not in text.strip()


def test_a_frozen_dynamic_dim_is_refused():
    def flatten_fixed(x):
        return x.reshape(2, -1)  # batch frozen at 2

    with pytest.raises(decomposer.ExportError):
        define(flatten_fixed, (torch.randn(2, 3),), domain="mylab",
               dynamic_shapes=({0: BATCH},))


class _LegacyMish(torch.autograd.Function):
    """The seeds' recipe: an opaque node from symbolic(), a torch forward."""

    @staticmethod
    def forward(ctx, x, alpha):
        return scaled_mish(x, alpha)

    @staticmethod
    def symbolic(g, x, alpha):
        return g.op("custom.ops::ScaledMish", x, alpha_f=alpha)


class _Net(torch.nn.Module):
    def forward(self, x):
        return _LegacyMish.apply(torch.relu(x) - 0.5, 0.75) * 2


def test_the_seeds_recipe_end_to_end(tmp_path):
    """An already-exported legacy model holding custom.ops::ScaledMish, the op's pure-torch
    forward, a library from define(), and the CLI with --patterns FILE.onnx."""
    legacy = tmp_path / "legacy.onnx"
    x = torch.randn(2, 3, 8)
    torch.onnx.export(_Net(), (x,), str(legacy), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "n"}},
                      custom_opsets={"custom.ops": 1})
    assert {n.op_type for n in onnx.load(legacy).graph.node} >= {"ScaledMish"}
    function = define(scaled_mish, (x,), domain="custom.ops", name="ScaledMish",
                      attributes={"alpha": 1.0}, dynamic_shapes=({0: BATCH},))
    write_library([function], tmp_path / "ops.onnx")
    target = tmp_path / "plain.onnx"
    run = subprocess.run([sys.executable, "-m", "decomposer", str(legacy), str(target),
                          "--patterns", str(tmp_path / "ops.onnx"), "--verify"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = onnx.load(target)
    assert all(node.domain == "" for node in out.graph.node)
    for batch in (2, 5):
        value = torch.randn(batch, 3, 8)
        want = _Net()(value).numpy()
        for engine in ("ort", "openvino", "tvm"):
            got = engines.run_model(engine, out, {"x": value.numpy()})[0]
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=engine)


def test_torch_export_takes_patterns(tmp_path):
    """decomposer.torch.export(..., patterns=[library]) decomposes the opaque node with the
    definition; without it the node has no pattern."""
    from decomposer.torch import export

    x = torch.randn(2, 3, 8)
    function = define(scaled_mish, (x,), domain="custom.ops", name="ScaledMish",
                      attributes={"alpha": 1.0}, dynamic_shapes=({0: BATCH},))
    library = write_library([function], tmp_path / "ops.onnx")
    with pytest.raises(decomposer.UnsupportedNodeError, match="ScaledMish"):
        export(_Net(), (x,), tmp_path / "no.onnx", dynamo=False, opset_version=17)
    report = export(_Net(), (x,), tmp_path / "net.onnx", dynamo=False, opset_version=17,
                    patterns=[str(library)], input_names=["x"],
                    dynamic_shapes=({0: BATCH},))
    assert report.counts == {"function custom.ops::ScaledMish": 1}
    assert report.verification.passed
    assert all(check.atol == 1e-5 and check.rtol == 1e-5
               for check in report.verification.checks)
