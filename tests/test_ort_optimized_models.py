"""Float models as ONNX Runtime's own tools rewrite them, decomposed for every engine:

- a diffusers-style VAE decoder (GroupNorm, SiLU, residual blocks, nearest upsampling)
  exported by torch and put through ``onnxruntime.transformers.optimizer`` with
  ``model_type="vae"``: com.microsoft ``NhwcConv`` (its weights transposed channels last by
  the optimizer), ``GroupNorm`` and ``SkipGroupNorm``, which ONNX Runtime runs on CUDA only;
  the oracle is torch on the module;
- a MobileViT (transformers, random weights) saved from an ORT_ENABLE_ALL session:
  com.microsoft.nchwc Convs and reorders, ``QuickGelu``, ``FusedMatMul``; the oracle is ONNX
  Runtime's run of the saved model (its own kernels) and of the float export.

Each is decomposed under the default portable target (no non-standard node left, the full
checker passes) and run on ONNX Runtime, OpenVINO and TVM (TVM under ``exhaustive``) at two
input sizes."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import decomposer
from decomposer import engines

from _helpers import save_optimized

F = torch.nn.functional


class _ResnetBlock(torch.nn.Module):
    """diffusers' ResnetBlock2D without the time embedding, as its VAE decoder has it."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm1 = torch.nn.GroupNorm(8, channels, eps=1e-6)
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.norm2 = torch.nn.GroupNorm(8, channels, eps=1e-6)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        return x + self.conv2(F.silu(self.norm2(h)))


class VaeDecoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv_in = torch.nn.Conv2d(4, 32, 3, padding=1)
        self.block1 = _ResnetBlock(32)
        self.upsample = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.block2 = _ResnetBlock(32)
        self.norm_out = torch.nn.GroupNorm(8, 32, eps=1e-6)
        self.conv_out = torch.nn.Conv2d(32, 3, 3, padding=1)

    def forward(self, z):
        h = self.block1(self.conv_in(z))
        h = self.block2(self.upsample(F.interpolate(h, scale_factor=2.0, mode="nearest")))
        return self.conv_out(F.silu(self.norm_out(h)))


def _ops(model: onnx.ModelProto) -> set[str]:
    return {f"{n.domain}:{n.op_type}" for n in model.graph.node if n.domain}


def _run_ort(model, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.fixture(scope="module")
def vae(tmp_path_factory):
    from onnxruntime.transformers import optimizer

    folder = tmp_path_factory.mktemp("vae")
    torch.manual_seed(0)
    net = VaeDecoder().eval()
    source, optimized = folder / "vae.onnx", folder / "vae_opt.onnx"
    torch.onnx.export(net, (torch.randn(1, 4, 8, 8),), str(source), opset_version=17,
                      dynamo=False, input_names=["z"], output_names=["y"],
                      dynamic_axes={"z": {0: "n", 2: "h", 3: "w"},
                                    "y": {0: "n", 2: "H", 3: "W"}})
    optimizer.optimize_model(str(source), model_type="vae", num_heads=0, hidden_size=0,
                             opt_level=0).save_model_to_file(str(optimized))
    model = onnx.load(str(optimized))
    assert {"com.microsoft:NhwcConv", "com.microsoft:GroupNorm",
            "com.microsoft:SkipGroupNorm"} <= _ops(model), _ops(model)
    return net, model


VAE_SIZES = [(2, 4, 8, 8), (1, 4, 6, 10)]


def test_vae_decoder_is_torch_on_onnx_runtime(vae):
    net, model = vae
    out, report = decomposer.decompose_with_report(model)
    onnx.checker.check_model(out, full_check=True)
    assert _ops(out) == set() and report.unsupported == []
    for seed, shape in enumerate(VAE_SIZES):
        z = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        with torch.no_grad():
            want = net(torch.from_numpy(z)).numpy()
        assert np.abs(want).max() > 0.1
        np.testing.assert_allclose(_run_ort(out, {"z": z}), want, rtol=1e-4, atol=1e-5)


# TVM's compile is the slow cell (6-8 s each): the full run has it
@pytest.mark.parametrize("engine", ["openvino", pytest.param("tvm", marks=pytest.mark.exhaustive)])
def test_vae_decoder_runs_on(vae, engine):
    if not engines.available(engine):
        pytest.skip(f"{engine} is not installed")
    net, model = vae
    out = decomposer.decompose(model)
    for seed, shape in enumerate(VAE_SIZES):
        z = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        with torch.no_grad():
            want = net(torch.from_numpy(z)).numpy()
        (got,) = engines.run_model(engine, out, {"z": z})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def mobilevit(tmp_path_factory):
    import transformers

    folder = tmp_path_factory.mktemp("mobilevit")
    torch.manual_seed(0)
    config = transformers.MobileViTConfig(
        image_size=64, neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 48], hidden_sizes=[16, 24, 32],
        num_attention_heads=2, mlp_ratio=2.0, expand_ratio=2.0, patch_size=2)
    backbone = transformers.MobileViTModel(config).eval()
    _keep_alive(backbone)

    class Features(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.backbone = backbone

        def forward(self, x):
            return self.backbone(pixel_values=x).last_hidden_state

    source, saved = folder / "mobilevit.onnx", folder / "mobilevit_all.onnx"
    torch.onnx.export(Features().eval(), (torch.randn(1, 3, 64, 64),), str(source),
                      opset_version=17, dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    model = save_optimized(source, saved)
    kinds = collections.Counter(f"{n.domain}:{n.op_type}" for n in model.graph.node)
    if "com.microsoft.nchwc:Conv" not in kinds:
        pytest.skip("this ONNX Runtime wrote no NCHWc Convs (no NCHWc kernels here)")
    assert {"com.microsoft:QuickGelu", "com.microsoft:FusedMatMul"} <= set(kinds), kinds
    return onnx.load(str(source)), model


def _keep_alive(model: torch.nn.Module) -> None:
    """Weights under which the features stay alive: transformers' initializer gives
    MobileViT's BatchNorms scales of about 0.02, and after its 20-odd of them every output
    is exactly 0 (measured), which any rewrite would match."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                c = module.num_features
                module.weight.copy_(torch.rand(c, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(c, generator=generator) * 0.1)
                module.running_mean.copy_(torch.randn(c, generator=generator) * 0.1)
                module.running_var.copy_(torch.rand(c, generator=generator) + 0.5)
            elif isinstance(module, torch.nn.Conv2d):
                torch.nn.init.kaiming_normal_(module.weight, generator=generator)


def _mobilevit_feeds(seed, batch):
    return {"x": np.random.default_rng(seed).standard_normal((batch, 3, 64, 64))
            .astype(np.float32)}


def test_mobilevit_is_onnx_runtime_on_the_saved_model(mobilevit):
    exported, model = mobilevit
    out, report = decomposer.decompose_with_report(model)
    onnx.checker.check_model(out, full_check=True)
    assert _ops(out) == set() and report.unsupported == []
    for seed, batch in ((1, 2), (2, 1)):
        feeds = _mobilevit_feeds(seed, batch)
        got, want = _run_ort(out, feeds), _run_ort(model, feeds)
        assert np.abs(want).max() > 1  # features, not an underflow to zeros
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(got, _run_ort(exported, feeds), rtol=1e-5, atol=1e-4)


def test_mobilevit_runs_on_openvino(mobilevit):
    if not engines.available("openvino"):
        pytest.skip("openvino is not installed")
    _, model = mobilevit
    out = decomposer.decompose(model)
    for seed, batch in ((1, 2), (2, 1)):
        feeds = _mobilevit_feeds(seed, batch)
        (got,) = engines.run_model("openvino", out, feeds)
        np.testing.assert_allclose(got, _run_ort(model, feeds), rtol=1e-4, atol=1e-4)


@pytest.mark.exhaustive
def test_mobilevit_runs_on_tvm_with_its_target(mobilevit):
    """TVM 0.27's importer refuses the export itself ("relax.ceil requires argument 0 (x) to
    be a tensor": a Ceil of a constant size from MobileViT's patch arithmetic, measured on
    the float export too); ``--target tvm`` folds it."""
    if not engines.available("tvm"):
        pytest.skip("tvm is not installed")
    _, model = mobilevit
    out = decomposer.decompose(model, target="tvm")
    feeds = _mobilevit_feeds(1, 2)
    (got,) = engines.run_model("tvm", out, feeds)
    np.testing.assert_allclose(got, _run_ort(model, feeds), rtol=1e-4, atol=1e-4)
