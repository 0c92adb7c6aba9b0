"""A real model: transformers' Deformable DETR (tiny config, random weights, nothing
downloaded) exported with its deformable attention as mmdeploy's custom node, decomposed,
and run on ONNX Runtime and OpenVINO (TVM under ``-m exhaustive``: ~30 s per compile),
against eager torch.

transformers computes multi-scale deformable attention in pure PyTorch
(``modeling_deformable_detr.MultiScaleDeformableAttention``, one ``grid_sample`` per
level), so its plain export writes GridSample (opset 16) or ``aten::grid_sampler``
(opset 13, FALLTHROUGH). A user migrating from mmdeploy routes that module through an
``autograd.Function`` whose ``symbolic()`` writes ``mmdeploy::MMCVMultiScaleDeformableAttention``;
that is the node decomposed here. The legacy exporter leaves the node's ``value`` without a
static shape and makes the encoder's sampling locations float64: the pattern takes both.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator

import numpy as np
import onnx
import pytest
import torch

import decomposer
from decomposer import engines

from _helpers import run_onnxruntime

transformers = pytest.importorskip("transformers")
detr_module = pytest.importorskip(
    "transformers.models.deformable_detr.modeling_deformable_detr")

MSDA = "mmdeploy::MMCVMultiScaleDeformableAttention"
IMAGE = (1, 3, 128, 128)  # levels of 16x16, 8x8, 4x4, 2x2


def build_model() -> torch.nn.Module:
    """d_model 32, one encoder and one decoder layer, 2 heads, 4 levels, 2 points, 20
    queries; a small ResNet backbone from transformers' own config (no timm, no weights)."""
    backbone = transformers.ResNetConfig(
        embedding_size=8, hidden_sizes=[8, 16, 16, 32], depths=[1, 1, 1, 1],
        layer_type="basic", out_features=["stage2", "stage3", "stage4"])
    config = transformers.DeformableDetrConfig(
        backbone_config=backbone, d_model=32, encoder_layers=1, decoder_layers=1,
        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
        decoder_ffn_dim=32, num_feature_levels=4, encoder_n_points=2, decoder_n_points=2,
        num_queries=20, num_labels=5,
        # one decoder layer leaves no box head to tie; transformers 5 refuses an empty tie
        tie_word_embeddings=False)
    torch.manual_seed(0)
    return transformers.DeformableDetrForObjectDetection(config).eval()


class TwoOutputs(torch.nn.Module):
    def __init__(self, detr: torch.nn.Module) -> None:
        super().__init__()
        self.detr = detr

    def forward(self, pixel_values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.detr(pixel_values=pixel_values)
        return out.logits, out.pred_boxes


_ORIGINAL = detr_module.MultiScaleDeformableAttention.forward


class MMCVMultiScaleDeformableAttention(torch.autograd.Function):
    """What an mmdeploy user writes: transformers' own computation in forward, mmdeploy's
    node in symbolic (output (N, Lq, M*D))."""

    @staticmethod
    def forward(ctx, value, spatial_shapes, level_start_index, sampling_locations,
                attention_weights):
        shapes = [(int(h), int(w)) for h, w in spatial_shapes.tolist()]
        return _ORIGINAL(None, value, spatial_shapes, shapes, level_start_index,
                         sampling_locations, attention_weights, 64)

    @staticmethod
    def symbolic(g, value, spatial_shapes, level_start_index, sampling_locations,
                 attention_weights):
        return g.op(MSDA, value, spatial_shapes, level_start_index, sampling_locations,
                    attention_weights, im2col_step_i=64)


@contextlib.contextmanager
def mmdeploy_attention() -> Iterator[None]:
    def forward(self, value, value_spatial_shapes, value_spatial_shapes_list,
                level_start_index, sampling_locations, attention_weights, im2col_step):
        return MMCVMultiScaleDeformableAttention.apply(
            value, value_spatial_shapes.long(), level_start_index.long(), sampling_locations,
            attention_weights)

    detr_module.MultiScaleDeformableAttention.forward = forward
    try:
        yield
    finally:
        detr_module.MultiScaleDeformableAttention.forward = _ORIGINAL


@pytest.fixture(scope="module")
def detr():
    """(model, image, eager outputs, {opset: decomposed model})."""
    model = TwoOutputs(build_model()).eval()
    image = torch.randn(*IMAGE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = [t.numpy().astype(np.float64) for t in model(image)]
    decomposed = {}
    for opset in (16, 13):
        buffer = io.BytesIO()
        extra = {} if opset >= 16 else {
            "operator_export_type": torch.onnx.OperatorExportTypes.ONNX_FALLTHROUGH}
        with mmdeploy_attention(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (image,), buffer, dynamo=False, opset_version=opset,
                              input_names=["pixel_values"], output_names=["logits", "boxes"],
                              **extra)
        exported = onnx.load_from_string(buffer.getvalue())
        custom = [n for n in exported.graph.node if f"{n.domain}::{n.op_type}" == MSDA]
        assert len(custom) == 2  # the encoder's and the decoder's attention
        out, report = decomposer.decompose_with_report(exported)
        assert report.counts.get("MultiScaleDeformableAttention") == 2
        assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
        assert "GridSample" not in {n.op_type for n in out.graph.node}
        decomposed[opset] = out
    return model, image.numpy(), want, decomposed


def _close(got, want) -> None:
    for actual, expected in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(actual, np.float64), expected, atol=1e-4,
                                   rtol=1e-4)


@pytest.mark.parametrize("opset", [16, 13])
def test_decomposed_detr_matches_eager_on_onnxruntime(detr, opset):
    _, image, want, decomposed = detr
    _close(run_onnxruntime(decomposed[opset], {"pixel_values": image}), want)


@pytest.mark.parametrize("opset", [16, 13])
@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_decomposed_detr_runs_on_openvino(detr, opset, static):
    pytest.importorskip("openvino")
    _, image, want, decomposed = detr
    _close(engines.run_model("openvino", decomposed[opset], {"pixel_values": image},
                             static_shapes=static), want)


@pytest.mark.exhaustive
@pytest.mark.parametrize("opset", [16, 13])
def test_decomposed_detr_runs_on_tvm(detr, opset):
    pytest.importorskip("tvm")
    _, image, want, decomposed = detr
    _close(engines.run_model("tvm", decomposed[opset], {"pixel_values": image},
                             static_shapes=True), want)
