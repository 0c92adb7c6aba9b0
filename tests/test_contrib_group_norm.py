"""ONNX Runtime's GroupNorm and SkipGroupNorm (CUDA kernels only in ONNX Runtime), decomposed:
against torch's ``F.group_norm`` (+ SiLU) in float64, channels last and first, 2-D and 3-D
spatial, float16/32, skips of every documented shape, dynamic batch and positions."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.contrib_group_norm import GroupNorm, SkipGroupNorm
from decomposer.testing import Case, check_pattern

from _helpers import make_model, run_onnxruntime

TOLERANCE = {np.float32: 2e-5, np.float16: 4e-3}


def _model(op, arrays, attrs, outputs=1):
    channel_axis = -1 if attrs.get("channels_last", 1) else 1
    inputs = []
    for name, a in arrays:
        if a is None:
            continue
        symbolic = name in ("X", "skip")
        channel = a.ndim - 1 if channel_axis == -1 else 1
        dims = [f"{name}_d{i}" if symbolic and 0 < i != channel and a.shape[i] != 1 else s
                for i, s in enumerate(a.shape)]
        if symbolic:
            dims[0] = "N"
        inputs.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(a.dtype), dims))
    x = arrays[0][1]
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    outs = [helper.make_tensor_value_info(n, elem, [None] * x.ndim)
            for n in ("Y", "S")[:outputs]]
    node = helper.make_node(op, [n if a is not None else "" for n, a in arrays],
                            [o.name for o in outs], name="gn", domain="com.microsoft", **attrs)
    return make_model([node], inputs, outs, 17, extra_opsets=["com.microsoft"])


def _torch(x, gamma, beta, groups, activation, channels_last, eps=1e-5):
    t = torch.from_numpy(x.astype(np.float64))
    if channels_last:
        t = t.movedim(-1, 1)
    y = F.group_norm(t, groups, torch.from_numpy(gamma.astype(np.float64)),
                     torch.from_numpy(beta.astype(np.float64)), eps)
    if activation:
        y = F.silu(y)
    return (y.movedim(1, -1) if channels_last else y).numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("channels_last", [1, 0])
@pytest.mark.parametrize("spatial", [(5, 6), (3, 4, 2)])
@pytest.mark.parametrize("activation", [0, 1])
def test_group_norm_matches_torch(activation, spatial, channels_last, dtype):
    rng = np.random.default_rng(activation + len(spatial) + 2 * channels_last)
    channels, groups = 8, 4

    def arrays(batch, positions):
        shape = (batch, *positions, channels) if channels_last else (batch, channels,
                                                                     *positions)
        return [("X", (rng.standard_normal(shape) * 2).astype(dtype)),
                ("gamma", rng.standard_normal(channels).astype(dtype)),
                ("beta", rng.standard_normal(channels).astype(dtype))]

    attrs = {"groups": groups, "activation": activation, "channels_last": channels_last,
             "epsilon": 1e-5}
    out = decomposer.decompose(_model("GroupNorm", arrays(2, spatial), attrs))
    onnx.checker.check_model(out, full_check=True)
    for batch, positions in [(2, spatial), (3, tuple(s + 1 for s in spatial))]:
        feeds = dict(arrays(batch, positions))
        (got,) = run_onnxruntime(out, feeds)
        want = _torch(feeds["X"], feeds["gamma"], feeds["beta"], groups, activation,
                      channels_last)
        np.testing.assert_allclose(got.astype(np.float64), want, atol=TOLERANCE[dtype],
                                   rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("skip_shape", ["NHWC", "N11C", "NC"])
@pytest.mark.parametrize("bias", [False, True])
def test_skip_group_norm_matches_torch(skip_shape, bias):
    rng = np.random.default_rng(len(skip_shape) + bias)
    x = rng.standard_normal((2, 5, 6, 8)).astype(np.float32)
    skip = rng.standard_normal({"NHWC": (2, 5, 6, 8), "N11C": (2, 1, 1, 8),
                                "NC": (2, 8)}[skip_shape]).astype(np.float32)
    gamma, beta = rng.standard_normal(8).astype(np.float32), \
        rng.standard_normal(8).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32) if bias else None
    arrays = [("X", x), ("gamma", gamma), ("beta", beta), ("skip", skip), ("bias", b)]
    model = _model("SkipGroupNorm", arrays, {"groups": 2, "activation": 1}, outputs=2)
    out = decomposer.decompose(model)
    feeds = {n: a for n, a in arrays if a is not None}
    got = run_onnxruntime(out, feeds)
    total = x + (skip if skip.ndim == 4 else skip[:, None, None, :]) + (0 if b is None else b)
    np.testing.assert_allclose(got[1], total, atol=1e-6)
    np.testing.assert_allclose(got[0], _torch(total, gamma, beta, 2, 1, True), atol=2e-5,
                               rtol=2e-5)


@pytest.mark.parametrize("pattern, cases", [
    (GroupNorm(), [Case([np.random.default_rng(1).standard_normal(s).astype(np.float32)
                         for s in [(2, 4, 4, 6), (6,), (6,)]],
                        attrs={"groups": 3, "activation": 1}, symbolic={0: (0, 1, 2)})]),
    (SkipGroupNorm(), [Case([np.random.default_rng(2).standard_normal(s).astype(np.float32)
                             for s in [(2, 4, 4, 6), (6,), (6,), (2, 4, 4, 6), (6,)]],
                            attrs={"groups": 2, "activation": 0},
                            output_dtype=[np.float32] * 2)]),
], ids=lambda value: getattr(value, "op_type", ""))
def test_kit_at_the_opset_ends(pattern, cases):
    check_pattern(pattern, cases, opsets=(11, onnx.defs.onnx_opset_version()), atol=2e-5,
                  rtol=2e-5)


def test_rejections():
    x = np.ones((2, 4, 4, 6), np.float32)
    arrays = [("X", x), ("gamma", x[0, 0, 0]), ("beta", x[0, 0, 0])]
    with pytest.raises(decomposer.UnsupportedNodeError, match="node 'gn'.*6 channels do not"):
        decomposer.decompose(_model("GroupNorm", arrays, {"groups": 4, "activation": 0}))
    model = _model("GroupNorm", arrays, {"groups": 3, "activation": 0})
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "C"
    with pytest.raises(decomposer.UnsupportedNodeError, match="channel dim must be static"):
        decomposer.decompose(model)


# -- portability (the hook of scripts/portability_cases.py) ---------------------------------


def portability_cases():
    """A UNet block as ORT's optimizer leaves it: SkipGroupNorm (its sum kept) then GroupNorm
    with SiLU, channels last, dynamic batch and positions."""
    rng = np.random.default_rng(31)
    vectors = {n: rng.standard_normal(8).astype(np.float32) for n in ("g1", "b1", "g2", "b2")}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", "H", "W", 8])
              for n in ("x", "skip")]
    nodes = [helper.make_node("SkipGroupNorm", ["x", "g1", "b1", "skip"], ["y1", "s"],
                              domain="com.microsoft", groups=2, activation=0),
             helper.make_node("GroupNorm", ["y1", "g2", "b2"], ["y"], domain="com.microsoft",
                              groups=4, activation=1)]
    model = make_model(nodes, inputs, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, ["N", "H", "W", 8])], 17, extra_opsets=["com.microsoft"],
        initializers=[onnx.numpy_helper.from_array(v, n) for n, v in vectors.items()])
    feeds, expected = [], []
    for batch, h, w in [(2, 5, 6), (1, 3, 4)]:
        x = rng.standard_normal((batch, h, w, 8)).astype(np.float32)
        skip = rng.standard_normal((batch, h, w, 8)).astype(np.float32)
        y1 = _torch(x + skip, vectors["g1"], vectors["b1"], 2, 0, True)
        feeds.append({"x": x, "skip": skip})
        expected.append([_torch(y1, vectors["g2"], vectors["b2"], 4, 1, True).astype(
            np.float32)])
    return [{"id": "contrib GroupNorm / SkipGroupNorm (UNet block)", "model": model,
             "feeds": feeds, "expected": expected, "atol": 2e-5}]
