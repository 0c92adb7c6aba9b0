"""TensorRT's thin-wrapper plugins, decomposed, each against torch (``F.leaky_relu``,
``torch.clamp``, an L2 norm, ``F.interpolate(mode="nearest")``, ``torch.cat``, slicing,
``expand``, ``F.group_norm``) or, for Reorg_TRT, the plugin README's own example; plus the
numpy references."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns import tensorrt_wrappers as wrappers

from _helpers import make_model, run_onnxruntime

FLOAT = TensorProto.FLOAT
OPSETS = [11, onnx.defs.onnx_opset_version()]


def _run(op, arrays, attrs, opset, out_dims=None):
    def dims(a):  # batch and, for images, H and W dynamic; channels static
        if a.ndim == 1:
            return list(a.shape)
        return ["N", a.shape[1], f"H{a.ndim}", f"W{a.ndim}"] if a.ndim == 4 else \
            ["N", *a.shape[1:]]
    inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype),
                                            dims(a)) for name, a in arrays]
    outputs = [helper.make_tensor_value_info("y", inputs[0].type.tensor_type.elem_type,
                                             out_dims)]
    node = helper.make_node(op, [n for n, _ in arrays], ["y"], name="plugin",
                            plugin_version="1", **attrs)
    out = decomposer.decompose(make_model([node], inputs, outputs, opset))
    onnx.checker.check_model(out, full_check=True)
    assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
    return out


def _check(pattern, op, arrays_list, attrs, torch_fn, opset, out_dims=None, atol=1e-6):
    out = _run(op, arrays_list[0], attrs, opset, out_dims)
    args = pattern.forms[0].coerce_attributes(attrs)
    for arrays in arrays_list:
        (got,) = run_onnxruntime(out, dict(arrays))
        want = torch_fn(*[torch.from_numpy(a) for _, a in arrays]).numpy()
        np.testing.assert_allclose(got, want, atol=atol)
        ref = pattern.evaluate(pattern.forms[0], [a for _, a in arrays], args)[0]
        np.testing.assert_allclose(ref, want, atol=atol)


def _x(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("opset", OPSETS)
def test_leaky_relu_and_clip(opset):
    rng = np.random.default_rng(0)
    sets = [[("x", _x(rng, 2, 5))], [("x", _x(rng, 3, 5))]]
    _check(wrappers.LeakyReluPlugin(), "LReLU_TRT", sets, {"negSlope": 0.1},
           lambda x: F.leaky_relu(x, 0.1), opset, [None, 5])
    _check(wrappers.ClipPlugin(), "Clip_TRT", sets, {"clipMin": -0.5, "clipMax": 0.7},
           lambda x: torch.clamp(x, -0.5, 0.7), opset, [None, 5])


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("across, shared", [(0, 1), (0, 0), (1, 1)])
def test_normalize_is_ssd_l2norm(across, shared, opset):
    rng = np.random.default_rng(across + 2 * shared)
    weights = [20.0] if shared else rng.uniform(1, 3, 3).tolist()
    attrs = {"weights": weights, "acrossSpatial": across, "channelShared": shared,
             "nbWeights": len(weights), "eps": 1e-10}

    def l2norm(x):
        dims = (1, 2, 3) if across else (1,)
        norm = torch.sqrt((x.double() ** 2).sum(dims, keepdim=True) + 1e-10)
        return (x.double() / norm * torch.tensor(weights).double().reshape(1, -1, 1, 1)
                ).float()

    sets = [[("x", _x(rng, 2, 3, 4, 5))], [("x", _x(rng, 1, 3, 2, 2))]]
    _check(wrappers.NormalizePlugin(), "Normalize_TRT", sets, attrs, l2norm, opset,
           [None, 3, None, None], atol=1e-4)


@pytest.mark.parametrize("opset", OPSETS)
def test_reorg_matches_the_readme_example(opset):
    """plugin/reorgPlugin/README.md: an arange input of (1, 4, 6, 6), stride 2, gives
    [[0, 2, 4], [6, 8, 10], [24, 26, 28]] as the output's channel 0."""
    x = np.arange(144, dtype=np.float32).reshape(1, 4, 6, 6)
    out = _run("Reorg_TRT", [("x", x)], {"stride": 2}, opset, [None, 16, 3, 3])
    (got,) = run_onnxruntime(out, {"x": x})
    assert got.shape == (1, 16, 3, 3)
    np.testing.assert_array_equal(got[0, 0], [[0, 2, 4], [6, 8, 10], [24, 26, 28]])
    np.testing.assert_array_equal(got, wrappers.ReorgPlugin().compute({"stride": 2}, x=x)[0])
    bigger = np.arange(2 * 8 * 4 * 6, dtype=np.float32).reshape(2, 8, 4, 6)
    (got,) = run_onnxruntime(_run("Reorg_TRT", [("x", bigger)], {"stride": 2}, opset,
                                  [None, 32, 2, 3]), {"x": bigger})
    np.testing.assert_array_equal(got, wrappers.ReorgPlugin().compute({"stride": 2},
                                                                      x=bigger)[0])


@pytest.mark.parametrize("opset", OPSETS)
def test_resize_nearest(opset):
    rng = np.random.default_rng(2)
    sets = [[("x", _x(rng, 2, 3, 4, 5))], [("x", _x(rng, 1, 3, 2, 3))]]
    _check(wrappers.ResizeNearestPlugin(), "ResizeNearest_TRT", sets, {"scale": 2.0},
           lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), opset,
           [None, 3, None, None])


@pytest.mark.parametrize("opset", OPSETS)
def test_flatten_concat_slice_tile_group_norm(opset):
    rng = np.random.default_rng(3)
    sets = [[("a", _x(rng, n, 2, 3, 3)), ("b", _x(rng, n, 4, 2, 2))] for n in (2, 1)]
    _check(wrappers.FlattenConcatPlugin(), "FlattenConcat_TRT", sets, {},
           lambda a, b: torch.cat([a.flatten(1), b.flatten(1)], 1)[..., None, None], opset,
           [None, 34, 1, 1])
    sets = [[("d", _x(rng, n, 7, 6))] for n in (2, 1)]
    _check(wrappers.SpecialSlicePlugin(), "SpecialSlice_TRT", sets, {},
           lambda d: d[..., :4], opset, [None, 7, 4])
    sets = [[("a", _x(rng, n, 3)), ("b", _x(rng, 1, 2, 2, 2))] for n in (3, 1)]
    out = _run("BatchTilePlugin_TRT", sets[0], {}, opset, [None, 2, 2, 2])
    for arrays in sets:
        (got,) = run_onnxruntime(out, dict(arrays))
        np.testing.assert_array_equal(got, torch.from_numpy(arrays[1][1]).expand(
            arrays[0][1].shape[0], 2, 2, 2).numpy())
    scale, bias = _x(rng, 4), _x(rng, 4)
    sets = [[("x", _x(rng, n, 4, 3, 5)), ("scale", scale), ("bias", bias)] for n in (2, 1)]
    _check(wrappers.GroupNormPlugin(), "GroupNormalizationPlugin", sets,
           {"eps": 1e-5, "num_groups": 2},
           lambda x, s, b: F.group_norm(x, 2, s, b, 1e-5), opset, [None, 4, 3, 5], atol=2e-5)


@pytest.mark.parametrize("op, attrs, shape, message", [
    ("LReLU_TRT", {"negSlope": -0.1}, (2, 3), "negSlope"),
    ("Reorg_TRT", {"stride": 2}, (1, 6, 4, 4), "multiple of stride"),
    ("ResizeNearest_TRT", {"scale": 1.5}, (1, 2, 4, 4), "integer scales"),
    ("Normalize_TRT", {"weights": [1.0, 2.0], "acrossSpatial": 0, "channelShared": 1,
                       "eps": 1e-5}, (1, 2, 4, 4), "one weight"),
])
def test_rejections(op, attrs, shape, message):
    rng = np.random.default_rng(0)
    with pytest.raises(decomposer.UnsupportedNodeError, match=message):
        _run(op, [("x", _x(rng, *shape))], attrs, 13, [None] * len(shape))


def portability_cases():
    """A chain of wrapper plugins: Normalize_TRT -> LReLU_TRT -> Reorg_TRT ->
    ResizeNearest_TRT -> GroupNormalizationPlugin, dynamic batch and spatial size."""
    rng = np.random.default_rng(23)
    scale, bias = _x(rng, 16), _x(rng, 16)
    nodes = [helper.make_node("Normalize_TRT", ["x"], ["n"], weights=[2.0], acrossSpatial=0,
                              channelShared=1, nbWeights=1, eps=1e-10),
             helper.make_node("LReLU_TRT", ["n"], ["l"], negSlope=0.1),
             helper.make_node("Reorg_TRT", ["l"], ["r"], stride=2),
             helper.make_node("ResizeNearest_TRT", ["r"], ["u"], scale=2.0),
             helper.make_node("GroupNormalizationPlugin", ["u", "scale", "bias"], ["y"],
                              eps=1e-5, num_groups=4)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", FLOAT, ["N", 4, "H", "W"])],
                       [helper.make_tensor_value_info("y", FLOAT, ["N", 16, None, None])], 13,
                       initializers=[onnx.numpy_helper.from_array(scale, "scale"),
                                     onnx.numpy_helper.from_array(bias, "bias")])
    feeds, expected = [], []
    for n, h, w in [(2, 6, 8), (1, 4, 4)]:
        x = _x(rng, n, 4, h, w)
        t = torch.from_numpy(x).double()
        t = t / torch.sqrt((t ** 2).sum(1, keepdim=True) + 1e-10) * 2
        t = F.leaky_relu(t, 0.1)
        t = t.reshape(n, 1, h, 2, w, 2).permute(0, 3, 5, 1, 2, 4).reshape(n, 16, h // 2,
                                                                          w // 2)
        t = F.interpolate(t, scale_factor=2, mode="nearest")
        t = F.group_norm(t, 4, torch.from_numpy(scale).double(),
                         torch.from_numpy(bias).double(), 1e-5)
        feeds.append({"x": x})
        expected.append([t.float().numpy()])
    return [{"id": "TensorRT wrapper plugins (Normalize, LReLU, Reorg, ResizeNearest, "
                   "GroupNormalizationPlugin)", "model": model, "feeds": feeds,
             "expected": expected, "atol": 2e-5}]
