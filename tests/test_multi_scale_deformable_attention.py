"""Multi-scale deformable attention: every spelling against torch (float64, mmcv's pure-torch
formula with F.grid_sample), the pattern's numpy reference, rejections, and the portability
cases."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import decomposer
from decomposer.patterns.multi_scale_deformable_attention import MultiScaleDeformableAttention

from _helpers import make_model, run_onnxruntime

FLOAT = {np.float16: TensorProto.FLOAT16, np.float32: TensorProto.FLOAT,
         np.float64: TensorProto.DOUBLE}
SPELLINGS = {"mmdeploy": ("MMCVMultiScaleDeformableAttention", "mmdeploy", 3),
             "trt": ("MultiscaleDeformableAttnPlugin_TRT", "trt", 4),
             "trt_default": ("MultiscaleDeformableAttnPlugin_TRT", "", 4),
             "trt_microsoft": ("MultiscaleDeformableAttnPlugin_TRT", "com.microsoft", 4),
             "vad": ("MultiScaleDeformableAttentionPlugin", "custom_op", 3)}


def torch_msda(value, shapes, locations, weights) -> np.ndarray:
    """mmcv's multi_scale_deform_attn_pytorch, in float64: (N, Lq, M*D)."""
    return msda_on_tensors(torch.from_numpy(value.astype(np.float64)), shapes,
                           torch.from_numpy(locations.astype(np.float64)),
                           torch.from_numpy(weights.astype(np.float64))).numpy()


def msda_on_tensors(value, shapes, locations, weights):
    """mmcv's multi_scale_deform_attn_pytorch on torch tensors (pure torch: traceable)."""
    n, _, heads, channels = value.shape
    _, queries, _, levels, points, _ = locations.shape
    value_list = value.split([h * w for h, w in shapes], dim=1)
    grids = 2 * locations - 1
    sampled = []
    for level, (h, w) in enumerate(shapes):
        v = value_list[level].flatten(2).transpose(1, 2).reshape(n * heads, channels, h, w)
        g = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        sampled.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros",
                                     align_corners=False))
    weights = weights.reshape(n, queries, heads, levels * points).transpose(1, 2).reshape(
        n * heads, 1, queries, levels * points)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1)
    return out.view(n, heads * channels, queries).transpose(1, 2).contiguous()


def make_inputs(rng, shapes, n=2, queries=7, heads=3, channels=4, points=3,
                dtype=np.float32, spread=(-0.2, 1.2), flat_weights=False):
    total = sum(h * w for h, w in shapes)
    value = rng.standard_normal((n, total, heads, channels)).astype(dtype)
    locations = rng.uniform(*spread, (n, queries, heads, len(shapes), points, 2)).astype(dtype)
    weights = rng.random((n, queries, heads, len(shapes), points)).astype(dtype)
    if flat_weights:
        weights = weights.reshape(n, queries, heads, len(shapes) * points)
    return value, locations, weights


def msda_model(spelling, shapes, heads, channels, levels, points, dtype=np.float32,
               index_type=np.int64, flat_weights=False, opset=17, runtime_shapes=False):
    op, domain, rank = SPELLINGS[spelling]
    starts = np.cumsum([0] + [h * w for h, w in shapes[:-1]]).astype(index_type)
    elem = FLOAT[np.dtype(dtype).type]
    weight_dims = ["N", "Lq", heads, levels * points] if flat_weights \
        else ["N", "Lq", heads, levels, points]
    inputs = [helper.make_tensor_value_info("value", elem, ["N", "S", heads, channels]),
              helper.make_tensor_value_info("locations", elem,
                                            ["N", "Lq", heads, levels, points, 2]),
              helper.make_tensor_value_info("weights", elem, weight_dims)]
    index_elem = TensorProto.INT32 if index_type == np.int32 else TensorProto.INT64
    initializers = []
    if runtime_shapes:  # fed at run time, as a graph computing them from Shape would
        inputs += [helper.make_tensor_value_info("shapes", index_elem, [levels, 2]),
                   helper.make_tensor_value_info("starts", index_elem, [levels])]
    else:
        initializers += [numpy_helper.from_array(np.array(shapes, index_type), "shapes"),
                         numpy_helper.from_array(starts, "starts")]
    attrs = {"im2col_step": 64} if spelling == "mmdeploy" else {}
    node = helper.make_node(op, ["value", "shapes", "starts", "locations", "weights"], ["y"],
                            name="msda", domain=domain, **attrs)
    out = helper.make_tensor_value_info("y", elem, [None] * rank)
    return make_model([node], inputs, [out], opset, extra_opsets=[domain] if domain else [],
                      initializers=initializers)


def _expected(spelling, value, shapes, locations, weights):
    want = torch_msda(value, shapes, locations, weights)
    if SPELLINGS[spelling][2] == 4:
        want = want.reshape(*want.shape[:2], value.shape[2], value.shape[3])
    return want


@pytest.mark.parametrize("spelling", list(SPELLINGS))
def test_every_spelling_matches_torch(spelling):
    rng = np.random.default_rng(len(spelling))
    shapes = [(6, 5), (3, 4), (1, 7), (2, 2)]  # unequal levels, one of height 1
    model = msda_model(spelling, shapes, 3, 4, 4, 3)
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {"MultiScaleDeformableAttention": 1}
    assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
    assert "GridSample" not in {n.op_type for n in out.graph.node}
    onnx.checker.check_model(out, full_check=True)
    pattern = MultiScaleDeformableAttention()
    node = model.graph.node[0]
    _, form = decomposer.default_registry().lookup(node)
    for n, queries in [(2, 7), (1, 13)]:  # dynamic batch and queries
        value, locations, weights = make_inputs(rng, shapes, n=n, queries=queries)
        got = run_onnxruntime(out, {"value": value, "locations": locations,
                                    "weights": weights})[0]
        want = _expected(spelling, value, shapes, locations, weights)
        np.testing.assert_allclose(got.astype(np.float64), want, atol=1e-5, rtol=1e-5)
        starts = np.cumsum([0] + [h * w for h, w in shapes[:-1]])
        reference = pattern.evaluate(form, [value, np.array(shapes), starts, locations,
                                            weights], pattern.match_attributes(node, form))[0]
        np.testing.assert_allclose(got, reference, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("label, params", [
    ("one level, one point", dict(shapes=[(4, 4)], heads=1, channels=2, points=1)),
    ("float16", dict(dtype=np.float16)),
    ("float64", dict(dtype=np.float64)),
    ("int32 shapes, flat weights (N, Lq, M, L*P)", dict(index_type=np.int32,
                                                        flat_weights=True)),
    ("far outside and NaN-free edges", dict(spread=(-3.0, 4.0))),
    ("opset 11", dict(opset=11)),
])
def test_sizes_and_types(label, params):
    rng = np.random.default_rng(len(label))
    shapes = params.pop("shapes", [(5, 3), (2, 6), (1, 1)])
    heads, channels, points = (params.pop(k, d) for k, d in
                               (("heads", 2), ("channels", 8), ("points", 4)))
    dtype = params.get("dtype", np.float32)
    spread = params.pop("spread", (-0.2, 1.2))
    model = msda_model("mmdeploy", shapes, heads, channels, len(shapes), points, **params)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    value, locations, weights = make_inputs(
        rng, shapes, heads=heads, channels=channels, points=points, dtype=dtype,
        spread=spread, flat_weights=params.get("flat_weights", False))
    got = run_onnxruntime(out, {"value": value, "locations": locations, "weights": weights})[0]
    assert got.dtype == dtype
    tolerance = 5e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64),
                               torch_msda(value, shapes, locations, weights),
                               atol=tolerance, rtol=tolerance)


def test_value_of_unknown_shape_and_float64_locations():
    """What a legacy export writes: value from a Reshape to computed dims (rank unknown, D
    read at run time, M from the locations) and float64 locations (torch.linspace's
    constant); the sum is computed in float64 and rounded to value's float32."""
    rng = np.random.default_rng(6)
    shapes = [(4, 5), (2, 3)]
    model = msda_model("mmdeploy", shapes, 3, 4, 2, 3)
    value_input = model.graph.input[0]
    value_input.name = "value_flat"
    value_input.type.tensor_type.shape.ClearField("dim")
    value_input.type.tensor_type.shape.dim.add().dim_param = "flat"
    model.graph.input[1].type.tensor_type.elem_type = TensorProto.DOUBLE
    model.graph.node.insert(0, helper.make_node("Reshape", ["value_flat", "value_shape"],
                                                ["value"], name="unflatten"))
    model.graph.input.append(helper.make_tensor_value_info("value_shape", TensorProto.INT64,
                                                           [4]))
    out = decomposer.decompose(model)
    value, locations, weights = make_inputs(rng, shapes)
    got = run_onnxruntime(out, {"value_flat": value.reshape(-1),
                                "value_shape": np.array(value.shape, np.int64),
                                "locations": locations.astype(np.float64),
                                "weights": weights})[0]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, torch_msda(value, shapes, locations, weights),
                               atol=1e-5, rtol=1e-5)


def test_nan_locations_never_crash():
    rng = np.random.default_rng(4)
    shapes = [(4, 5), (2, 3)]
    value, locations, weights = make_inputs(rng, shapes)
    locations[0, 0, 0, 0, 0, 0] = np.nan
    locations[1, 2, 1, 1, 2, 1] = np.inf
    out = decomposer.decompose(msda_model("mmdeploy", shapes, 3, 4, 2, 3))
    got = run_onnxruntime(out, {"value": value, "locations": locations, "weights": weights})[0]
    want = torch_msda(value, shapes, locations, weights)
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], atol=1e-5, rtol=1e-5)


def _rejected(model) -> str:
    with pytest.raises(decomposer.UnsupportedNodeError) as caught:
        decomposer.decompose(model)
    return str(caught.value)


@pytest.mark.parametrize("index_type", [np.int64, np.int32])
def test_run_time_spatial_shapes(index_type):
    """One decomposed model serves feature maps of any size: the level sizes are inputs."""
    rng = np.random.default_rng(8)
    out = decomposer.decompose(msda_model("mmdeploy", [(1, 1)] * 3, 2, 4, 3, 2,
                                          index_type=index_type, runtime_shapes=True))
    onnx.checker.check_model(out, full_check=True)
    for shapes in ([(6, 5), (3, 4), (1, 7)], [(2, 9), (1, 1), (4, 4)]):
        value, locations, weights = make_inputs(rng, shapes, heads=2, channels=4, points=2)
        starts = np.cumsum([0] + [h * w for h, w in shapes[:-1]]).astype(index_type)
        got = run_onnxruntime(out, {"value": value, "locations": locations,
                                    "weights": weights, "shapes": np.array(shapes, index_type),
                                    "starts": starts})[0]
        np.testing.assert_allclose(got, torch_msda(value, shapes, locations, weights),
                                   atol=1e-5, rtol=1e-5)


def test_rejections_name_the_node_and_the_reason():
    shapes = [(4, 5), (2, 3)]
    model = msda_model("mmdeploy", shapes, 3, 4, 2, 3, runtime_shapes=True)
    for index, axis in ((-2, 0), (1, 3), (2, 3)):  # shapes, locations, weights
        model.graph.input[index].type.tensor_type.shape.dim[axis].dim_param = "L"
    why = _rejected(model)
    assert "node 'msda'" in why and "the number of levels L must be static" in why

    model = msda_model("trt", shapes, 3, 4, 2, 3)
    model.graph.initializer[1].CopyFrom(numpy_helper.from_array(np.array([0, 7], np.int64),
                                                                "starts"))
    assert "level_start_index [0, 7] does not match spatial_shapes" in _rejected(model)

    model = msda_model("mmdeploy", shapes, 3, 4, 2, 3)
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(
        np.array([[4, 5, 1], [2, 3, 1]], np.int64), "shapes"))
    assert "spatial_shapes must be (L, 2) integers [H, W]" in _rejected(model)

    model = msda_model("mmdeploy", shapes, 3, 4, 2, 3)
    model.graph.input[1].type.tensor_type.shape.dim[4].dim_param = "P"
    assert "with P static" in _rejected(model)

    model = msda_model("mmdeploy", shapes, 3, 4, 3, 3)  # locations say 3 levels
    assert "sampling_locations has 3 for L" in _rejected(model)

    model = msda_model("mmdeploy", shapes, 3, 4, 2, 3)
    for index in (0, 1, 2):  # value, locations, weights
        model.graph.input[index].type.tensor_type.shape.dim[2].dim_param = "M"
    assert "the number of heads M must be static" in _rejected(model)

    model = msda_model("mmdeploy", shapes, 3, 4, 2, 3)
    del model.graph.input[1].type.tensor_type.shape.dim[:]
    model.graph.input[1].type.tensor_type.shape.dim.add().dim_param = "flat"
    assert "the rank of" not in (why := _rejected(model)) and "rank 1" in why


def portability_cases():
    """mmdeploy's spelling, four unequal levels (one of height 1), dynamic N and Lq;
    oracle: mmcv's pure-torch formula above."""
    rng = np.random.default_rng(12)
    shapes = [(6, 5), (3, 4), (1, 7), (2, 2)]
    model = msda_model("mmdeploy", shapes, 2, 4, 4, 2)
    feeds, expected = [], []
    for n, queries in [(2, 5), (1, 9)]:
        value, locations, weights = make_inputs(rng, shapes, n=n, queries=queries, heads=2,
                                                channels=4, points=2)
        feeds.append({"value": value, "locations": locations, "weights": weights})
        expected.append([torch_msda(value, shapes, locations, weights).astype(np.float32)])
    cases = [{"id": "MultiScaleDeformableAttention 4 levels (mmdeploy)", "model": model,
              "feeds": feeds, "expected": expected, "atol": 1e-5}]
    # level sizes fed at run time (one model for every input size)
    model = msda_model("trt", [(1, 1)] * 2, 2, 4, 2, 2, runtime_shapes=True)
    feeds, expected = [], []
    for shapes in ([(5, 4), (2, 3)], [(3, 7), (1, 2)]):
        value, locations, weights = make_inputs(rng, shapes, n=1, queries=6, heads=2,
                                                channels=4, points=2)
        feeds.append({"value": value, "locations": locations, "weights": weights,
                      "shapes": np.array(shapes, np.int64),
                      "starts": np.array([0, shapes[0][0] * shapes[0][1]], np.int64)})
        expected.append([torch_msda(value, shapes, locations, weights)
                         .reshape(1, 6, 2, 4).astype(np.float32)])
    cases.append({"id": "MultiScaleDeformableAttention run-time level sizes (TensorRT)",
                  "model": model, "feeds": feeds, "expected": expected, "atol": 1e-5})
    return cases
