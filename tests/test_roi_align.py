"""mmcv's MMCVRoiAlign and TensorRT's ROIAlign_TRT, decomposed: against a torch implementation
of mmcv's roi_align written here (the bin's sample points, ``grid_sample`` with border
padding and zeros outside [-1, H] x [-1, W], which is mmcv's bilinear rule; then the mean or
the max), against the numpy reference, at two sizes with dynamic rois and images."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.roi_align import roi_align_reference

from _helpers import make_model, run_onnxruntime


def torch_roi_align(x, boxes, index, height, width, scale, ratio, aligned, maximum):
    """mmcv roi_align (forward) in torch, float64."""
    x = torch.from_numpy(x).double()
    out = torch.zeros(len(boxes), x.shape[1], height, width, dtype=torch.float64)
    size_h, size_w = x.shape[2:]
    for r, box in enumerate(torch.from_numpy(boxes).double()):
        x1, y1, x2, y2 = (box * scale - (0.5 if aligned else 0.0)).tolist()
        roi_w, roi_h = x2 - x1, y2 - y1
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        gh = ratio if ratio > 0 else math.ceil(roi_h / height)
        gw = ratio if ratio > 0 else math.ceil(roi_w / width)
        ys = y1 + (torch.arange(height * gh, dtype=torch.float64) + 0.5) * roi_h / (height * gh)
        xs = x1 + (torch.arange(width * gw, dtype=torch.float64) + 0.5) * roi_w / (width * gw)
        yy, xx = torch.meshgrid(ys, xs, indexing="ij")
        grid = torch.stack([2 * xx / max(size_w - 1, 1) - 1, 2 * yy / max(size_h - 1, 1) - 1],
                           -1)
        image = x[int(index[r])][None]
        samples = F.grid_sample(image, grid[None], mode="bilinear", padding_mode="border",
                                align_corners=True)[0]
        inside = (yy >= -1) & (yy <= size_h) & (xx >= -1) & (xx <= size_w)
        samples = samples * inside
        blocks = samples.reshape(x.shape[1], height, gh, width, gw)
        if gh * gw == 0:
            continue
        out[r] = blocks.amax((2, 4)) if maximum else blocks.mean((2, 4))
    return out.numpy()


def _rois(rng, count, images, extent=48.0, smallest=0.3):
    centre = rng.uniform(-4, extent, (count, 2))
    size = rng.uniform(smallest, 24, (count, 2))
    boxes = np.concatenate([centre, centre + size], 1).astype(np.float32)
    index = rng.integers(0, images, count)
    return boxes, index


def _mmcv_model(attrs, opset, elem=TensorProto.FLOAT):
    node = helper.make_node("MMCVRoiAlign", ["x", "rois"], ["y"], name="roi_align",
                            domain="mmcv", **attrs)
    inputs = [helper.make_tensor_value_info("x", elem, ["N", 3, "H", "W"]),
              helper.make_tensor_value_info("rois", elem, ["R", 5])]
    outputs = [helper.make_tensor_value_info(
        "y", elem, ["R", 3, attrs["output_height"], attrs["output_width"]])]
    return make_model([node], inputs, outputs, opset, extra_opsets=["mmcv"])


@pytest.mark.parametrize("opset, mode, aligned, ratio", [
    (opset, mode, aligned, ratio) for opset in (11, 13, 16, 21)
    for mode, aligned, ratio in [("avg", 1, 2), ("avg", 1, 0), ("avg", 0, 2), ("avg", 0, 0),
                                 ("max", 1, 2), ("max", 0, 3)]])
def test_mmcv_roi_align_matches_torch(mode, aligned, ratio, opset):
    rng = np.random.default_rng(ratio + 3 * aligned + (mode == "max"))
    attrs = {"output_height": 3, "output_width": 4, "spatial_scale": 0.25,
             "sampling_ratio": ratio, "mode": mode, "aligned": aligned}
    out = decomposer.decompose(_mmcv_model(attrs, opset))
    onnx.checker.check_model(out, full_check=True)
    for images, size, count in [(2, (10, 12), 9), (1, (7, 5), 4)]:
        x = rng.standard_normal((images, 3, *size)).astype(np.float32)
        # below 16, aligned rois are exact from one feature-map pixel (4 at scale 0.25) on
        boxes, index = _rois(rng, count, images, smallest=4.0 if opset < 16 else 0.3)
        rois = np.concatenate([index[:, None], boxes], 1).astype(np.float32)
        (got,) = run_onnxruntime(out, {"x": x, "rois": rois})
        want = torch_roi_align(x, boxes, index, 3, 4, 0.25, ratio, aligned, mode == "max")
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
        ref = roi_align_reference(x, boxes, index, 3, 4, 0.25, ratio, bool(aligned),
                                  "mmcv_max" if mode == "max" else "avg")
        np.testing.assert_allclose(got, ref, atol=2e-5, rtol=1e-5)


def test_mmcv_float16():
    rng = np.random.default_rng(7)
    attrs = {"output_height": 2, "output_width": 2, "spatial_scale": 0.5,
             "sampling_ratio": 2, "mode": "max", "aligned": 1}
    out = decomposer.decompose(_mmcv_model(attrs, 17, TensorProto.FLOAT16))
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float16)
    boxes, index = _rois(rng, 5, 1, extent=12)
    rois = np.concatenate([index[:, None], boxes], 1).astype(np.float16)
    (got,) = run_onnxruntime(out, {"x": x, "rois": rois})
    assert got.dtype == np.float16
    want = torch_roi_align(x.astype(np.float32), rois[:, 1:].astype(np.float32), index, 2, 2,
                           0.5, 2, 1, True)
    np.testing.assert_allclose(got.astype(np.float64), want, atol=1e-2)


def _trt_model(attrs, opset, index_type=TensorProto.INT32):
    node = helper.make_node("ROIAlign_TRT", ["x", "rois", "idx"], ["y"], name="roi_align",
                            **attrs)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"]),
              helper.make_tensor_value_info("rois", TensorProto.FLOAT, ["R", 4]),
              helper.make_tensor_value_info("idx", index_type, ["R"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["R", 3, 2, 3])]
    return make_model([node], inputs, outputs, opset)


@pytest.mark.parametrize("half_pixel", [1, 0])
@pytest.mark.parametrize("index_type", [TensorProto.INT32, TensorProto.INT64])
def test_tensorrt_roi_align_average_matches_torch(half_pixel, index_type):
    rng = np.random.default_rng(half_pixel)
    attrs = {"coordinate_transformation_mode": half_pixel, "mode": 1, "output_height": 2,
             "output_width": 3, "sampling_ratio": 0, "spatial_scale": 0.5}
    out = decomposer.decompose(_trt_model(attrs, 17, index_type))
    for images, size, count in [(2, (9, 11), 6), (3, (6, 6), 2)]:
        x = rng.standard_normal((images, 3, *size)).astype(np.float32)
        boxes, index = _rois(rng, count, images, extent=20)
        feeds = {"x": x, "rois": boxes,
                 "idx": index.astype(np.int32 if index_type == TensorProto.INT32 else np.int64)}
        (got,) = run_onnxruntime(out, feeds)
        want = torch_roi_align(x, boxes, index, 2, 3, 0.5, 0, half_pixel, False)
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


def test_tensorrt_max_mode_needs_the_ort_target():
    attrs = {"mode": 0, "output_height": 2, "output_width": 3, "sampling_ratio": 2}
    with pytest.raises(decomposer.UnsupportedNodeError, match="--target ort"):
        decomposer.decompose(_trt_model(attrs, 17))
    out = decomposer.decompose(_trt_model(attrs, 17), target="ort")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 7, 7)).astype(np.float32)
    boxes, index = _rois(rng, 5, 2, extent=6)
    (got,) = run_onnxruntime(out, {"x": x, "rois": boxes, "idx": index.astype(np.int32)})
    want = roi_align_reference(x, boxes, index, 2, 3, 1.0, 2, True, "corner_max")
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_mmcv_aligned_below_16_differs_only_under_one_pixel():
    # The documented envelope: RoiAlign-10 clamps a roi under one feature-map pixel to one.
    attrs = {"output_height": 2, "output_width": 2, "spatial_scale": 1.0,
             "sampling_ratio": 2, "mode": "avg", "aligned": 1}
    out = decomposer.decompose(_mmcv_model(attrs, 11))
    x = np.random.default_rng(5).standard_normal((1, 3, 8, 8)).astype(np.float32)
    boxes = np.array([[1.0, 1.0, 4.0, 3.5], [2.0, 2.0, 2.5, 5.0]], np.float32)
    rois = np.concatenate([np.zeros((2, 1), np.float32), boxes], 1)
    (got,) = run_onnxruntime(out, {"x": x, "rois": rois})
    want = torch_roi_align(x, boxes, np.zeros(2, np.int64), 2, 2, 1.0, 2, 1, False)
    np.testing.assert_allclose(got[0], want[0], atol=2e-5, rtol=1e-5)  # 3 x 2.5 px
    assert np.abs(got[1] - want[1]).max() > 1e-3  # 0.5 px wide: clamped to 1


@pytest.mark.parametrize("attrs, opset, message", [
    ({"mode": "max", "sampling_ratio": 0}, 17, "adaptive sampling_ratio"),
    ({"output_height": 0}, 17, "must be > 0"),
    ({}, 22, "RoiAlign-22"),
])
def test_mmcv_rejections(attrs, opset, message):
    full = {"output_height": 2, "output_width": 2, "spatial_scale": 1.0, "sampling_ratio": 2,
            "mode": "avg", "aligned": 0, **attrs}
    with pytest.raises(decomposer.UnsupportedNodeError, match=message):
        decomposer.decompose(_mmcv_model(full, opset))


def _head_case(aligned: int, seed: int):
    """An mmcv RoI head: MMCVRoiAlign max (the MaxPool form) and avg, rois from the input."""
    rng = np.random.default_rng(seed)
    nodes = [helper.make_node("MMCVRoiAlign", ["x", "rois"], ["a"], domain="mmcv",
                              output_height=2, output_width=2, spatial_scale=0.5,
                              sampling_ratio=2, mode="max", aligned=aligned),
             helper.make_node("MMCVRoiAlign", ["x", "rois"], ["b"], domain="mmcv",
                              output_height=2, output_width=2, spatial_scale=0.5,
                              sampling_ratio=0, mode="avg", aligned=aligned)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"]),
              helper.make_tensor_value_info("rois", TensorProto.FLOAT, ["R", 5])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["R", 3, 2, 2])
               for n in "ab"]
    model = make_model(nodes, inputs, outputs, 17, extra_opsets=["mmcv"])
    feeds, expected = [], []
    for images, size, count in [(2, (10, 12), 6), (1, (8, 8), 3)]:
        x = rng.standard_normal((images, 3, *size)).astype(np.float32)
        # at least one feature-map pixel (2 at scale 0.5): exact below opset 16 too
        boxes, index = _rois(rng, count, images, extent=20, smallest=2.0)
        feeds.append({"x": x, "rois": np.concatenate([index[:, None], boxes], 1).astype(
            np.float32)})
        expected.append([torch_roi_align(x, boxes, index, 2, 2, 0.5, ratio, aligned,
                                         maximum).astype(np.float32)
                         for ratio, maximum in ((2, True), (0, False))])
    # RoiAlign-22 has no ONNX Runtime kernel. aligned=1 at 11 is mmdeploy's default.
    case = {"id": f"MMCVRoiAlign aligned={aligned} (max and avg)", "model": model,
            "feeds": feeds, "expected": expected, "atol": 2e-5, "opsets": (11, 21)}
    return case


def _multi_level_case():
    """A Mask R-CNN-style RoI extractor: MMCVMultiLevelRoiAlign over four levels."""
    rng = np.random.default_rng(13)
    attrs = {"output_height": 2, "output_width": 2, "pool_mode": 1, "sampling_ratio": 2,
             "aligned": 0}
    feeds, expected = [], []
    for images, count in [(2, 12), (1, 4)]:
        features = _pyramid(rng, images)
        rois = _multi_level_rois(rng, count, images)
        feeds.append({"rois": rois, **{f"p{i}": f for i, f in enumerate(features)}})
        expected.append([torch_multi_level(rois, features, 2, 2, 2, 0, False).astype(
            np.float32)])
    return {"id": "MMCVMultiLevelRoiAlign (4 levels)", "model": _multi_level_model(attrs),
            "feeds": feeds, "expected": expected, "atol": 2e-5, "opsets": (11, 21)}


def portability_cases():
    return [_head_case(0, 11), _head_case(1, 12), _multi_level_case()]


# -- mmdeploy's MMCVMultiLevelRoiAlign -------------------------------------------------------

STRIDES = [4.0, 8.0, 16.0, 32.0]


def torch_multi_level(rois, features, height, width, ratio, aligned, maximum, factor=1.0,
                      finest=56):
    """mmdet SingleRoIExtractor: map_roi_levels (torch), the kernel's legacy rescale, then
    mmcv's roi_align on the level (torch_roi_align above)."""
    t = torch.from_numpy(rois)
    scale = torch.sqrt((t[:, 3] - t[:, 1]) * (t[:, 4] - t[:, 2]))
    levels = torch.floor(torch.log2(scale / finest + 1e-6)).clamp(min=0, max=len(features) - 1)
    boxes = t[:, 1:].clone()
    if factor > 0 and factor != 1:
        centre = (boxes[:, :2] + boxes[:, 2:]) * 0.5
        half = (boxes[:, 2:] - boxes[:, :2] + 1) * factor * 0.5 - 0.5
        boxes = torch.cat([centre - half, centre + half], 1)
    out = np.zeros((len(rois), features[0].shape[1], height, width))
    for r in range(len(rois)):
        level = int(levels[r])
        out[r] = torch_roi_align(features[level], boxes[r:r + 1].numpy(), [int(t[r, 0])],
                                 height, width, 1 / STRIDES[level], ratio, aligned, maximum)[0]
    return out


def _pyramid(rng, images, height=64, width=80):
    return [rng.standard_normal((images, 3, height // int(s), width // int(s))).astype(
        np.float32) for s in STRIDES]


def _multi_level_rois(rng, count, images):
    centre = rng.uniform(0, 300, (count, 2))
    size = np.exp(rng.uniform(np.log(4), np.log(400), (count, 2)))
    return np.concatenate([rng.integers(0, images, (count, 1)), centre, centre + size],
                          1).astype(np.float32)


def _multi_level_model(attrs, opset=17):
    names = [f"p{i}" for i in range(len(STRIDES))]
    node = helper.make_node("MMCVMultiLevelRoiAlign", ["rois", *names], ["y"], name="extract",
                            domain="mmdeploy", featmap_strides=STRIDES, finest_scale=56,
                            **attrs)
    inputs = [helper.make_tensor_value_info("rois", TensorProto.FLOAT, ["R", 5])] + [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 3, f"H{i}", f"W{i}"])
        for i, n in enumerate(names)]
    outputs = [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, ["R", 3, attrs["output_height"], attrs["output_width"]])]
    return make_model([node], inputs, outputs, opset, extra_opsets=["mmdeploy"])


@pytest.mark.parametrize("pool_mode, aligned, ratio, factor", [
    (1, 1, 2, 1.0), (1, 0, 0, 1.0), (0, 1, 2, 1.0), (1, 1, 0, 1.5)])
def test_multi_level_roi_align_matches_torch(pool_mode, aligned, ratio, factor):
    rng = np.random.default_rng(pool_mode + 2 * aligned + ratio)
    attrs = {"output_height": 3, "output_width": 2, "pool_mode": pool_mode,
             "sampling_ratio": ratio, "roi_scale_factor": factor, "aligned": aligned}
    out = decomposer.decompose(_multi_level_model(attrs))
    onnx.checker.check_model(out, full_check=True)
    for images, count in [(2, 30), (1, 5)]:
        features = _pyramid(rng, images)
        rois = _multi_level_rois(rng, count, images)
        feeds = {"rois": rois, **{f"p{i}": f for i, f in enumerate(features)}}
        (got,) = run_onnxruntime(out, feeds)
        want = torch_multi_level(rois, features, 3, 2, ratio, aligned, pool_mode == 0, factor)
        np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


def test_multi_level_rejections():
    attrs = {"output_height": 2, "output_width": 2, "pool_mode": 0, "sampling_ratio": 0,
             "aligned": 1}
    with pytest.raises(decomposer.UnsupportedNodeError, match="adaptive sampling_ratio"):
        decomposer.decompose(_multi_level_model(attrs))
    model = _multi_level_model({**attrs, "pool_mode": 1})
    del model.graph.node[0].input[-1]
    with pytest.raises(decomposer.UnsupportedNodeError, match="3 feature maps but 4"):
        decomposer.decompose(model)
