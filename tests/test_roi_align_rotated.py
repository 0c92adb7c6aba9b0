"""mmcv's MMCVRoIAlignRotated, decomposed: against a torch implementation of mmcv's kernel
written here (the rotated sample grid of each roi, sampled by ``grid_sample`` with border
padding and zeros outside [-1, H] x [-1, W], mmcv's bilinear rule, then the bin means),
aligned or not, clockwise or not, at two sizes with dynamic images and rois."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.roi_align_rotated import roi_align_rotated_reference

from _helpers import make_model, run_onnxruntime


def torch_roi_align_rotated(x, rois, height, width, scale, ratio, aligned, clockwise):
    x = torch.from_numpy(x).double()
    size_h, size_w = x.shape[2:]
    out = torch.zeros(len(rois), x.shape[1], height, width, dtype=torch.float64)
    for r, roi in enumerate(torch.from_numpy(rois).double()):
        offset = 0.5 if aligned else 0.0
        cx, cy = roi[1] * scale - offset, roi[2] * scale - offset
        w, h = roi[3] * scale, roi[4] * scale
        if not aligned:
            w, h = w.clamp(min=1), h.clamp(min=1)
        theta = -roi[5] if clockwise else roi[5]
        k_y = (torch.arange(height * ratio, dtype=torch.float64) + 0.5) / (height * ratio)
        k_x = (torch.arange(width * ratio, dtype=torch.float64) + 0.5) / (width * ratio)
        yy, xx = torch.meshgrid(-h / 2 + k_y * h, -w / 2 + k_x * w, indexing="ij")
        y = yy * torch.cos(theta) - xx * torch.sin(theta) + cy
        xs = yy * torch.sin(theta) + xx * torch.cos(theta) + cx
        grid = torch.stack([2 * xs.clamp(min=0) / (size_w - 1) - 1,
                            2 * y.clamp(min=0) / (size_h - 1) - 1], -1)
        samples = F.grid_sample(x[int(roi[0])][None], grid[None], mode="bilinear",
                                padding_mode="border", align_corners=True)[0]
        samples = samples * ((y >= -1) & (y <= size_h) & (xs >= -1) & (xs <= size_w))
        out[r] = F.avg_pool2d(samples[None], ratio)[0]
    return out.numpy()


def _rois(rng, count, images):
    return np.concatenate([rng.integers(0, images, (count, 1)), rng.uniform(-4, 30, (count, 2)),
                           rng.uniform(0.5, 20, (count, 2)), rng.uniform(-3.2, 3.2, (count, 1))],
                          1).astype(np.float32)


def _model(attrs, opset=13, domain="mmcv"):
    node = helper.make_node("MMCVRoIAlignRotated", ["x", "rois"], ["y"], name="rotated",
                            domain=domain, **attrs)
    return make_model([node], [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"]),
        helper.make_tensor_value_info("rois", TensorProto.FLOAT, ["R", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [
            "R", 3, attrs["output_height"], attrs["output_width"]])], opset,
        extra_opsets=[domain])


@pytest.mark.parametrize("opset", [11, onnx.defs.onnx_opset_version()])
@pytest.mark.parametrize("aligned, clockwise, ratio", [(1, 0, 2), (0, 1, 1), (1, 1, 3)])
def test_matches_torch(aligned, clockwise, ratio, opset):
    rng = np.random.default_rng(aligned + 2 * clockwise + ratio)
    attrs = {"output_height": 3, "output_width": 4, "spatial_scale": 0.5,
             "sampling_ratio": ratio, "aligned": aligned, "clockwise": clockwise}
    out = decomposer.decompose(_model(attrs, opset))
    onnx.checker.check_model(out, full_check=True)
    for images, size, count in [(2, (12, 14), 9), (1, (7, 9), 3)]:
        x = rng.standard_normal((images, 3, *size)).astype(np.float32)
        rois = _rois(rng, count, images)
        (got,) = run_onnxruntime(out, {"x": x, "rois": rois})
        want = torch_roi_align_rotated(x, rois, 3, 4, 0.5, ratio, aligned, clockwise)
        np.testing.assert_allclose(got, want, atol=1e-5)
        ref = roi_align_rotated_reference(x, rois, attrs)
        np.testing.assert_allclose(ref, want, atol=1e-5)


@pytest.mark.parametrize("attrs, message", [
    ({"output_height": 2, "output_width": 2, "sampling_ratio": 0}, "adaptive sampling_ratio"),
    # found by scripts/fuzz.py: the sample grid of 2^32 rows would be built as constants
    ({"output_height": 2 ** 32, "output_width": 2, "sampling_ratio": 1}, "samples per roi")])
def test_refusals(attrs, message):
    with pytest.raises(decomposer.UnsupportedNodeError, match=message):
        decomposer.decompose(_model(attrs))


def portability_cases():
    """An oriented RoI head: MMCVRoIAlignRotated (mmdeploy spelling), ratio 2, aligned."""
    rng = np.random.default_rng(19)
    attrs = {"output_height": 2, "output_width": 3, "spatial_scale": 0.5, "sampling_ratio": 2,
             "aligned": 1, "clockwise": 0}
    feeds, expected = [], []
    for images, size, count in [(2, (12, 14), 6), (1, (8, 8), 2)]:
        x = rng.standard_normal((images, 3, *size)).astype(np.float32)
        rois = _rois(rng, count, images)
        feeds.append({"x": x, "rois": rois})
        expected.append([torch_roi_align_rotated(x, rois, 2, 3, 0.5, 2, 1, 0).astype(
            np.float32)])
    return [{"id": "MMCVRoIAlignRotated (mmdeploy)", "model": _model(attrs, 13, "mmdeploy"),
             "feeds": feeds, "expected": expected, "atol": 1e-5}]
