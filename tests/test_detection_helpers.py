"""The small detection helper plugins, decomposed, each against torch: ``torch.gather``
(GatherTopk), mmdet's grid-prior formula written in torch (GridPriorsTRT),
``F.interpolate(mode="bicubic")`` (TRTBicubicInterpolate), ``F.instance_norm`` /
``F.group_norm`` (the instance norms) and ``torch.cummax`` (MMCVCornerPool)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.detection_helpers import (
    BicubicInterpolate,
    CornerPool,
    GatherTopk,
    GridPriors,
)

from _helpers import make_model, run_onnxruntime

FLOAT = TensorProto.FLOAT
OPSETS = [13, onnx.defs.onnx_opset_version()]


def _one_node(op, inputs, outputs, attrs, opset, domain="mmdeploy", initializers=()):
    node = helper.make_node(op, [i.name for i in inputs] + [t.name for t in initializers],
                            [o.name for o in outputs], name="op", domain=domain, **attrs)
    return make_model([node], inputs, outputs, opset,
                      extra_opsets=[domain] if domain else [], initializers=initializers)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("index_type", [np.int32, np.int64])
def test_gather_topk_matches_torch_gather(index_type, opset):
    rng = np.random.default_rng(0)
    model = _one_node("GatherTopk", [
        helper.make_tensor_value_info("data", FLOAT, ["B", "N", 5]),
        helper.make_tensor_value_info("index", helper.np_dtype_to_tensor_dtype(
            np.dtype(index_type)), ["B", "K"])],
        [helper.make_tensor_value_info("out", FLOAT, ["B", "K", 5])], {}, opset)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    for batch, count, k in [(2, 9, 4), (3, 5, 5)]:
        data = rng.standard_normal((batch, count, 5)).astype(np.float32)
        index = rng.integers(0, count, (batch, k)).astype(index_type)
        (got,) = run_onnxruntime(out, {"data": data, "index": index})
        want = torch.gather(torch.from_numpy(data), 1, torch.from_numpy(
            index.astype(np.int64))[..., None].expand(batch, k, 5)).numpy()
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, GatherTopk().compute({}, data=data, index=index)[0])


@pytest.mark.parametrize("opset", OPSETS)
def test_grid_priors_match_mmdet(opset):
    base = np.array([[-4, -4, 4, 4], [-8, -4, 8, 4], [-2.5, -6, 2.5, 6]], np.float32)
    model = _one_node("GridPriorsTRT", [
        helper.make_tensor_value_info("feat_h", TensorProto.INT64, ["H"]),
        helper.make_tensor_value_info("feat_w", TensorProto.INT64, ["W"])],
        [helper.make_tensor_value_info("priors", FLOAT, [None, 4])],
        {"stride_h": 8, "stride_w": 16}, opset,
        initializers=[onnx.numpy_helper.from_array(base, "base")])
    model.graph.node[0].input[:] = ["base", "feat_h", "feat_w"]
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    for h, w in [(3, 5), (1, 2)]:
        (got,) = run_onnxruntime(out, {"feat_h": np.zeros(h, np.int64),
                                       "feat_w": np.zeros(w, np.int64)})
        # mmdet AnchorGenerator.single_level_grid_priors
        shift_x = torch.arange(0, w).float() * 16
        shift_y = torch.arange(0, h).float() * 8
        yy, xx = torch.meshgrid(shift_y, shift_x, indexing="ij")
        shifts = torch.stack([xx.reshape(-1), yy.reshape(-1)] * 2, dim=-1)
        want = (torch.from_numpy(base)[None] + shifts[:, None]).reshape(-1, 4).numpy()
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, GridPriors().compute(
            {"stride_h": 8, "stride_w": 16}, base_anchors=base, feat_h=np.zeros(h),
            feat_w=np.zeros(w))[0])


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("align_corners", [0, 1])
@pytest.mark.parametrize("scale", [(2.0, 2.0), (3.0, 1.0)])
def test_bicubic_matches_torch(scale, align_corners, opset):
    rng = np.random.default_rng(int(scale[0]) + align_corners)
    model = _one_node("TRTBicubicInterpolate",
                      [helper.make_tensor_value_info("x", FLOAT, ["N", 3, "H", "W"])],
                      [helper.make_tensor_value_info("y", FLOAT, ["N", 3, None, None])],
                      {"scale_factor": list(scale), "align_corners": align_corners}, opset)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    for shape in [(2, 3, 5, 6), (1, 3, 4, 3)]:
        x = rng.standard_normal(shape).astype(np.float32)
        (got,) = run_onnxruntime(out, {"x": x})
        want = F.interpolate(torch.from_numpy(x), scale_factor=scale, mode="bicubic",
                             align_corners=bool(align_corners)).numpy()
        np.testing.assert_allclose(got, want, atol=2e-5)
        ref = BicubicInterpolate().compute({"scale_factor": [int(s) for s in scale],
                                            "align_corners": align_corners}, x=x)[0]
        np.testing.assert_allclose(ref, want, atol=2e-5)


@pytest.mark.parametrize("scale", [1.5, float("nan"), float("inf")])
def test_bicubic_fractional_or_non_finite_scale_is_refused(scale):
    # NaN and inf crashed the check (int() of them) before: the fuzzer found it
    model = _one_node("TRTBicubicInterpolate",
                      [helper.make_tensor_value_info("x", FLOAT, ["N", 3, "H", "W"])],
                      [helper.make_tensor_value_info("y", FLOAT, ["N", 3, None, None])],
                      {"scale_factor": [scale, scale]}, 13)
    with pytest.raises(decomposer.UnsupportedNodeError, match="integer scales"):
        decomposer.decompose(model)


@pytest.mark.parametrize("opset", OPSETS)
def test_mmdeploy_instance_norm_is_group_norm(opset):
    """mmdeploy writes group_norm as Reshape -> TRTInstanceNormalization -> Reshape."""
    rng = np.random.default_rng(4)
    groups, channels = 2, 6
    gamma = rng.standard_normal(channels).astype(np.float32)
    beta = rng.standard_normal(channels).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(np.ones(groups, np.float32), "ones"),
             onnx.numpy_helper.from_array(np.zeros(groups, np.float32), "zeros"),
             onnx.numpy_helper.from_array(np.array([0, groups, -1], np.int64), "grouped"),
             onnx.numpy_helper.from_array(gamma.reshape(channels, 1, 1), "gamma"),
             onnx.numpy_helper.from_array(beta.reshape(channels, 1, 1), "beta")]
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Reshape", ["x", "grouped"], ["g"]),
             helper.make_node("TRTInstanceNormalization", ["g", "ones", "zeros"], ["n"],
                              domain="mmdeploy", epsilon=1e-5),
             helper.make_node("Reshape", ["n", "shape"], ["r"]),
             helper.make_node("Mul", ["r", "gamma"], ["m"]),
             helper.make_node("Add", ["m", "beta"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("x", FLOAT,
                                                             ["N", channels, "H", "W"])],
                       [helper.make_tensor_value_info("y", FLOAT, ["N", channels, "H", "W"])],
                       opset, extra_opsets=["mmdeploy"], initializers=inits)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    for shape in [(2, channels, 4, 5), (1, channels, 3, 3)]:
        x = rng.standard_normal(shape).astype(np.float32)
        (got,) = run_onnxruntime(out, {"x": x})
        want = F.group_norm(torch.from_numpy(x), groups, torch.from_numpy(gamma),
                            torch.from_numpy(beta), 1e-5).numpy()
        np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("relu, alpha", [(0, 0.0), (1, 0.0), (1, 0.2)])
def test_tensorrt_instance_norm_matches_torch(relu, alpha, opset):
    rng = np.random.default_rng(relu + int(alpha * 10))
    scales, bias = rng.standard_normal(3).tolist(), rng.standard_normal(3).tolist()
    model = _one_node("InstanceNormalization_TRT",
                      [helper.make_tensor_value_info("x", FLOAT, ["N", 3, "H", "W"])],
                      [helper.make_tensor_value_info("y", FLOAT, ["N", 3, "H", "W"])],
                      {"epsilon": 1e-4, "scales": scales, "bias": bias, "relu": relu,
                       "alpha": alpha, "plugin_version": "1"}, opset, domain="")
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    for shape in [(2, 3, 5, 4), (1, 3, 2, 7)]:
        x = rng.standard_normal(shape).astype(np.float32)
        (got,) = run_onnxruntime(out, {"x": x})
        want = F.instance_norm(torch.from_numpy(x), weight=torch.tensor(scales).float(),
                               bias=torch.tensor(bias).float(), eps=1e-4)
        if relu:
            want = F.leaky_relu(want, alpha)
        np.testing.assert_allclose(got, want.numpy(), atol=2e-5)


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("mode", [0, 1, 2, 3])
def test_corner_pool_matches_torch_cummax(mode, opset):
    rng = np.random.default_rng(mode)
    model = _one_node("MMCVCornerPool",
                      [helper.make_tensor_value_info("x", FLOAT, ["N", "C", 6, 7])],
                      [helper.make_tensor_value_info("y", FLOAT, ["N", "C", 6, 7])],
                      {"mode": mode}, opset, domain="mmcv")
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    for shape in [(2, 3, 6, 7), (1, 1, 6, 7)]:
        x = rng.standard_normal(shape).astype(np.float32)
        (got,) = run_onnxruntime(out, {"x": x})
        dim, reverse = {0: (2, True), 1: (2, False), 2: (3, True), 3: (3, False)}[mode]
        t = torch.from_numpy(x)
        t = t.flip(dim) if reverse else t
        want = torch.cummax(t, dim).values
        want = (want.flip(dim) if reverse else want).numpy()
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, CornerPool().compute({"mode": mode}, x=x)[0])


def test_corner_pool_needs_a_static_axis():
    model = _one_node("MMCVCornerPool",
                      [helper.make_tensor_value_info("x", FLOAT, ["N", "C", "H", 7])],
                      [helper.make_tensor_value_info("y", FLOAT, ["N", "C", "H", 7])],
                      {"mode": 1}, 13, domain="mmcv")
    with pytest.raises(decomposer.UnsupportedNodeError, match="must be static"):
        decomposer.decompose(model)


def portability_cases():
    """GatherTopk, corner pooling and a bicubic upsample in one small head."""
    rng = np.random.default_rng(21)
    nodes = [helper.make_node("MMCVCornerPool", ["x"], ["p"], domain="mmcv", mode=0),
             helper.make_node("TRTBicubicInterpolate", ["p"], ["u"], domain="mmdeploy",
                              scale_factor=[2.0, 2.0], align_corners=0),
             helper.make_node("GatherTopk", ["rows", "index"], ["g"], domain="mmdeploy")]
    inputs = [helper.make_tensor_value_info("x", FLOAT, ["N", 2, 5, 6]),
              helper.make_tensor_value_info("rows", FLOAT, ["N", "M", 4]),
              helper.make_tensor_value_info("index", TensorProto.INT64, ["N", 3])]
    outputs = [helper.make_tensor_value_info("u", FLOAT, ["N", 2, 10, 12]),
               helper.make_tensor_value_info("g", FLOAT, ["N", 3, 4])]
    model = make_model(nodes, inputs, outputs, 17, extra_opsets=["mmcv", "mmdeploy"])
    feeds, expected = [], []
    for batch, rows in [(2, 7), (1, 4)]:
        x = rng.standard_normal((batch, 2, 5, 6)).astype(np.float32)
        table = rng.standard_normal((batch, rows, 4)).astype(np.float32)
        index = rng.integers(0, rows, (batch, 3))
        pooled = torch.cummax(torch.from_numpy(x).flip(2), 2).values.flip(2)
        up = F.interpolate(pooled, scale_factor=2.0, mode="bicubic", align_corners=False)
        gathered = torch.gather(torch.from_numpy(table), 1,
                                torch.from_numpy(index)[..., None].expand(batch, 3, 4))
        feeds.append({"x": x, "rows": table, "index": index})
        expected.append([up.numpy(), gathered.numpy()])
    return [{"id": "detection helpers (corner pool, bicubic, GatherTopk)", "model": model,
             "feeds": feeds, "expected": expected, "atol": 2e-5}]
