"""TensorRT's PyramidROIAlign_TRT and MultilevelCropAndResize_TRT, decomposed: against torch
implementations of the two kernels written here (``maskRCNNKernels.cu``: the level rule,
the per-axis scale, each transform's sample points, sampled with ``grid_sample`` and border
padding, which is the kernels' clamped bilinear rule), and the numpy references, at two
sizes with dynamic images, rois and maps."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.pyramid_roi_align import crop_and_resize_reference, pyramid_reference

from _helpers import make_model, run_onnxruntime


def _sample(image, ys, xs):
    """(C, len(ys), len(xs)) clamped-bilinear samples of (C, H, W) at the grid ys x xs."""
    height, width = image.shape[1:]
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    grid = torch.stack([2 * xx / max(width - 1, 1) - 1, 2 * yy / max(height - 1, 1) - 1], -1)
    return F.grid_sample(image[None], grid[None], mode="bilinear", padding_mode="border",
                         align_corners=True)[0]


def torch_pyramid(rois, maps, image_size, pooled, ratio, transform, swap=0, plusone=0,
                  fpn=224):
    height, width = image_size
    first = fpn * fpn / (height * width) / 4
    out = torch.zeros(*rois.shape[:2], maps[0].shape[1], pooled, pooled, dtype=torch.float64)
    for n in range(rois.shape[0]):
        for r in range(rois.shape[1]):
            v = torch.from_numpy(rois[n, r]).double()
            if swap:
                v = v[[1, 0, 3, 2]]
            lo = torch.minimum(v[:2], v[2:]).clamp(min=0) / torch.tensor([width, height])
            hi = torch.maximum(v[:2], v[2:]).clamp(min=0) / torch.tensor([width, height])
            lo, hi = lo.clamp(max=1), hi.clamp(max=1)
            extra = torch.tensor([1 / width, 1 / height]) * plusone
            area = float(((hi - lo) + extra).prod())
            level = int(area > first) + int(area > 4 * first) + int(area > 16 * first)
            image = torch.from_numpy(maps[level][n]).double()
            fh, fw = image.shape[1:]
            axes = []
            for a, b, size in ((lo[1], hi[1], fh), (lo[0], hi[0], fw)):
                if transform == -1:
                    start, end = float(a) * (size - 1), float(b) * (size - 1)
                    step, offset = (end - start) / (pooled - 1), 0.0
                else:
                    shift = 0.5 if transform == 2 else 0.0
                    start, end = float(a) * size - shift, float(b) * size - shift
                    step, offset = (end - start) / pooled, 0.0 if transform == 0 else 0.5
                g = ratio if ratio > 0 else max(1, int(np.ceil((end - start) / pooled)))
                points = torch.tensor([start + step * p + step * (i + offset) / g
                                       for p in range(pooled) for i in range(g)],
                                      dtype=torch.float64)
                axes.append((points, g))
            (ys, gy), (xs, gx) = axes
            samples = _sample(image, ys, xs).reshape(-1, pooled, gy, pooled, gx)
            out[n, r] = samples.mean((2, 4))
    return out.numpy()


def torch_crop_and_resize(rois, maps, pooled):
    out = torch.zeros(*rois.shape[:2], maps[0].shape[1], pooled, pooled, dtype=torch.float64)
    for n in range(rois.shape[0]):
        for r in range(rois.shape[1]):
            y1, x1, y2, x2 = (float(v) for v in rois[n, r])
            area = (y2 - y1) * (x2 - x1)
            level = sum(int(area > s * s) for s in (112.0, 224.0, 448.0, 896.0))
            stride = 4 * 2 ** level
            image = torch.from_numpy(maps[level][n]).double()
            centres = (torch.arange(pooled, dtype=torch.float64) + 0.5) / pooled
            ys = y1 / stride + centres * (y2 - y1) / stride
            xs = x1 / stride + centres * (x2 - x1) / stride
            out[n, r] = _sample(image, ys, xs)
    return out.numpy()


def _model(op, attrs, count, pooled, opset=17):
    names = [f"p{i}" for i in range(count)]
    node = helper.make_node(op, ["rois", *names], ["y"], name="pool", **attrs)
    inputs = [helper.make_tensor_value_info("rois", TensorProto.FLOAT, ["N", "R", 4])] + [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 3, f"H{i}", f"W{i}"])
        for i, n in enumerate(names)]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT,
                                             ["N", "R", 3, pooled, pooled])]
    return make_model([node], inputs, outputs, opset)


def _pyramid_inputs(rng, images, count, height, width, inside=False):
    maps = [rng.standard_normal((images, 3, -(-height // s), -(-width // s))).astype(
        np.float32) for s in (4, 8, 16, 32)]
    low = rng.uniform(0 if inside else -0.05, 1, (images, count, 2)) * [width - 40, height - 40]
    size = np.exp(rng.uniform(np.log(3), np.log(500), (images, count, 2)))
    rois = np.concatenate([low, low + size], -1).astype(np.float32)
    return rois, maps


@pytest.mark.parametrize("transform, ratio, swap, plusone", [
    (2, 2, 0, 0), (2, 0, 0, 0), (1, 2, 0, 1), (0, 2, 1, 0), (0, 3, 0, 0), (-1, 1, 0, 0)])
def test_pyramid_roi_align_matches_torch(transform, ratio, swap, plusone):
    rng = np.random.default_rng(transform + 5 * ratio + swap)
    attrs = {"pooled_size": 4, "image_size": [300, 396], "sampling_ratio": ratio,
             "roi_coords_transform": transform, "roi_coords_swap": swap,
             "roi_coords_plusone": plusone}
    out = decomposer.decompose(_model("PyramidROIAlign_TRT", attrs, 4, 4))
    onnx.checker.check_model(out, full_check=True)
    for images, count in [(2, 16), (1, 3)]:
        # adaptive sampling: keep the clipped boxes non-empty (documented difference)
        rois, maps = _pyramid_inputs(rng, images, count, 300, 396, inside=ratio == 0)
        feeds = {"rois": rois, **{f"p{i}": m for i, m in enumerate(maps)}}
        (got,) = run_onnxruntime(out, feeds)
        want = torch_pyramid(rois, maps, (300, 396), 4, ratio, transform, swap, plusone)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
        ref = pyramid_reference(rois, maps, {**attrs, "fpn_scale": 224,
                                             "roi_coords_absolute": 1, "legacy": 0})
        np.testing.assert_allclose(ref, want, atol=1e-4, rtol=1e-4)


def test_crop_and_resize_matches_torch():
    rng = np.random.default_rng(9)
    out = decomposer.decompose(_model("MultilevelCropAndResize_TRT",
                                      {"pooled_size": 5, "image_size": [3, 512, 640]}, 5, 5))
    onnx.checker.check_model(out, full_check=True)
    for images, count in [(2, 20), (1, 4)]:
        maps = [rng.standard_normal((images, 3, 512 // s, 640 // s)).astype(np.float32)
                for s in (4, 8, 16, 32, 64)]
        low = rng.uniform(0, 400, (images, count, 2))
        size = np.exp(rng.uniform(np.log(4), np.log(600), (images, count, 2)))
        rois = np.concatenate([low, np.minimum(low + size, [512, 640])], -1).astype(
            np.float32)
        feeds = {"rois": rois, **{f"p{i}": m for i, m in enumerate(maps)}}
        (got,) = run_onnxruntime(out, feeds)
        want = torch_crop_and_resize(rois, maps, 5)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(crop_and_resize_reference(rois, maps, {"pooled_size": 5}),
                                   want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("attrs, opset, message", [
    ({"legacy": 1}, 17, "legacy=1"),
    ({"roi_coords_transform": 0, "sampling_ratio": 0}, 17, "fixed sampling_ratio"),
    ({"roi_coords_transform": -1, "sampling_ratio": 2}, 17, "sampling_ratio 1"),
    ({}, 13, "opsets 16-21"),
    ({}, 22, "opsets 16-21"),
])
def test_pyramid_rejections(attrs, opset, message):
    model = _model("PyramidROIAlign_TRT", {"pooled_size": 2, **attrs}, 4, 2, opset)
    with pytest.raises(decomposer.UnsupportedNodeError, match=message):
        decomposer.decompose(model)


def test_wrong_map_count_is_refused():
    model = _model("PyramidROIAlign_TRT", {"pooled_size": 2}, 3, 2)
    with pytest.raises(decomposer.UnsupportedNodeError, match="4 feature maps"):
        decomposer.decompose(model)


def portability_cases():
    """PyramidROIAlign_TRT (transform 2, ratio 2) over four maps of a 300 x 396 image."""
    rng = np.random.default_rng(17)
    attrs = {"pooled_size": 3, "image_size": [300, 396], "sampling_ratio": 2}
    feeds, expected = [], []
    for images, count in [(2, 10), (1, 3)]:
        rois, maps = _pyramid_inputs(rng, images, count, 300, 396)
        feeds.append({"rois": rois, **{f"p{i}": m for i, m in enumerate(maps)}})
        expected.append([torch_pyramid(rois, maps, (300, 396), 3, 2, 2).astype(np.float32)])
    return [{"id": "PyramidROIAlign_TRT (4 levels)", "model": _model(
        "PyramidROIAlign_TRT", attrs, 4, 3), "feeds": feeds, "expected": expected,
        "atol": 1e-4, "opsets": (16, 21)}]
