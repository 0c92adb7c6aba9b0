"""DeformConv: every spelling against torch (float64, from the definition) and ONNX Runtime's
own DeformConv-19 kernel; rejections; the portability cases.

The torch oracle samples with ``grid_sample(align_corners=True)`` on the input padded with a
zero border (pixel coordinates, so H or W of 1 works), multiplies by the mask and convolves
by ``einsum``: nothing from the pattern. ORT's DeformConv-19 runs the equivalent native
node for every spelling.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import decomposer
from decomposer.patterns.deform_conv import DeformConv

from _helpers import make_model, run_onnxruntime

FLOAT = {np.float16: TensorProto.FLOAT16, np.float32: TensorProto.FLOAT,
         np.float64: TensorProto.DOUBLE}


@dataclass
class Conv:
    """One deformable convolution's arrays and parameters (canonical, ONNX order)."""

    x: np.ndarray
    weight: np.ndarray
    offset: np.ndarray
    mask: np.ndarray | None
    bias: np.ndarray | None
    strides: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    dilations: tuple[int, int] = (1, 1)
    group: int = 1
    offset_group: int = 1
    more: list[Conv] = field(default_factory=list)  # other sizes, same parameters


def make_conv(rng, *, n=2, c=4, h=7, w=6, co=6, kernel=(3, 3), strides=(1, 1),
              pads=(1, 1, 1, 1), dilations=(1, 1), group=1, offset_group=1, mask=True,
              bias=True, dtype=np.float32, spread=3.0, sizes=()) -> Conv:
    """Random arrays; offsets of ``spread`` pixels push samples outside the image."""
    def one(n, h, w, weight=None, bias_value=None):
        kh, kw = kernel
        ho = (h + pads[0] + pads[2] - (dilations[0] * (kh - 1) + 1)) // strides[0] + 1
        wo = (w + pads[1] + pads[3] - (dilations[1] * (kw - 1) + 1)) // strides[1] + 1
        taps = kh * kw
        return Conv(
            rng.standard_normal((n, c, h, w)).astype(dtype),
            weight if weight is not None else
            (rng.standard_normal((co, c // group, kh, kw)) * 0.3).astype(dtype),
            (rng.standard_normal((n, 2 * offset_group * taps, ho, wo)) * spread).astype(dtype),
            rng.random((n, offset_group * taps, ho, wo)).astype(dtype) if mask else None,
            bias_value if bias_value is not None else
            (rng.standard_normal(co).astype(dtype) if bias else None),
            strides, pads, dilations, group, offset_group)
    first = one(n, h, w)
    first.more = [one(n2, h2, w2, first.weight, first.bias) for n2, h2, w2 in sizes]
    return first


# -- the oracles ----------------------------------------------------------------------------


def torch_deform_conv(conv: Conv) -> np.ndarray:
    x = torch.from_numpy(conv.x.astype(np.float64))
    weight = torch.from_numpy(conv.weight.astype(np.float64))
    offset = torch.from_numpy(conv.offset.astype(np.float64))
    n, c, h, w = x.shape
    co, per_group, kh, kw = weight.shape
    ho, wo = offset.shape[2:]
    taps, og = kh * kw, conv.offset_group
    ii, jj = torch.meshgrid(torch.arange(kh), torch.arange(kw), indexing="ij")
    tap_y = (ii.reshape(-1) * conv.dilations[0]).double().view(1, 1, taps, 1, 1)
    tap_x = (jj.reshape(-1) * conv.dilations[1]).double().view(1, 1, taps, 1, 1)
    base_y = (torch.arange(ho) * conv.strides[0] - conv.pads[0]).double().view(1, 1, 1, ho, 1)
    base_x = (torch.arange(wo) * conv.strides[1] - conv.pads[1]).double().view(1, 1, 1, 1, wo)
    pairs = offset.view(n, og, taps, 2, ho, wo)
    y = base_y + tap_y + pairs[:, :, :, 0]  # (N, OG, K, Ho, Wo)
    xs = base_x + tap_x + pairs[:, :, :, 1]
    padded = F.pad(x, (1, 1, 1, 1))  # a zero border: pixel -1 and H are zeros
    grid = torch.stack([2 * (xs + 1) / (w + 1) - 1, 2 * (y + 1) / (h + 1) - 1], dim=-1)
    columns = []
    for g in range(og):
        part = padded[:, g * c // og:(g + 1) * c // og]
        sampled = F.grid_sample(part, grid[:, g].reshape(n, taps * ho, wo, 2),
                                mode="bilinear", padding_mode="zeros", align_corners=True)
        columns.append(sampled.view(n, c // og, taps, ho, wo))
    cols = torch.cat(columns, dim=1)  # (N, C, K, Ho, Wo)
    if conv.mask is not None:
        mask = torch.from_numpy(conv.mask.astype(np.float64)).view(n, og, 1, taps, ho, wo)
        cols = (cols.view(n, og, c // og, taps, ho, wo) * mask).view(n, c, taps, ho, wo)
    cols = cols.view(n, conv.group, per_group, taps, ho, wo)
    w_groups = weight.view(conv.group, co // conv.group, per_group, taps)
    out = torch.einsum("ngckhw,gock->ngohw", cols, w_groups).reshape(n, co, ho, wo)
    if conv.bias is not None:
        out = out + torch.from_numpy(conv.bias.astype(np.float64)).view(1, co, 1, 1)
    return out.numpy()


def native_model(conv: Conv, opset: int = 19, symbolic: bool = True) -> onnx.ModelProto:
    """ONNX DeformConv of ``conv`` (the ORT oracle at 19+; below 19 the pattern's input)."""
    names = ["x", "weight", "offset", "bias", "mask"]
    arrays = [conv.x, conv.weight, conv.offset, conv.bias, conv.mask]
    used = [name if a is not None else "" for name, a in zip(names, arrays, strict=True)]
    while used[-1] == "":
        used.pop()
    node = helper.make_node("DeformConv", used, ["y"], name="dcn", strides=list(conv.strides),
                            pads=list(conv.pads), dilations=list(conv.dilations),
                            group=conv.group, offset_group=conv.offset_group)
    inputs = [_input(name, a, symbolic) for name, a in zip(names, arrays, strict=True)
              if a is not None]
    return make_model([node], inputs, [_output(conv)], opset)


def _input(name: str, array: np.ndarray, symbolic: bool) -> onnx.ValueInfoProto:
    dims: list[int | str] = list(array.shape)
    if symbolic and name in ("x", "offset", "mask", "offset_mask"):
        dims = [f"{name}_{i}" if i != 1 else d for i, d in enumerate(dims)]
    return helper.make_tensor_value_info(name, FLOAT[array.dtype.type], dims)


def _output(conv: Conv) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info("y", FLOAT[conv.x.dtype.type], [None] * 4)


def ort_deform_conv(conv: Conv) -> np.ndarray:
    feeds = {k: v for k, v in [("x", conv.x), ("weight", conv.weight), ("offset", conv.offset),
                               ("bias", conv.bias), ("mask", conv.mask)] if v is not None}
    return run_onnxruntime(native_model(conv), feeds)[0]


# -- the spellings --------------------------------------------------------------------------


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p.astype(np.float64), 1e-3, 1 - 1e-3)
    return np.log(p / (1 - p))


def spelled(spelling: str, conv: Conv, opset: int = 13) -> tuple[onnx.ModelProto, dict]:
    """(model, feeds) holding ``conv`` in ``spelling``; feeds for conv and its ``more``."""
    sh, sw = conv.strides
    ph, pw = conv.pads[:2]
    dh, dw = conv.dilations
    domain = {"mmcv": "mmcv", "mmdeploy": "mmdeploy", "mmcv_deform": "mmcv",
              "mmdeploy_deform": "mmdeploy", "torchvision": "torchvision", "trt": "trt",
              "dcnv2": "", "dcnv2_trt": "", "onnx": "", "onnx_custom": "custom.ops"}[spelling]
    extra = [] if domain == "" else [domain]
    nodes, initializers = [], []
    mask, bias = conv.mask, conv.bias

    def feeds_of(c: Conv) -> dict:
        table = {"x": c.x, "weight": c.weight, "offset": c.offset, "mask": c.mask,
                 "bias": c.bias}
        if spelling == "dcnv2_trt":
            table["offset_mask"] = np.concatenate(
                [c.offset, _logit(c.mask).astype(c.x.dtype)], axis=1)
        if spelling == "torchvision":
            table["mask"] = c.mask if c.mask is not None else np.zeros(
                (c.offset.shape[0], c.offset.shape[1] // 2, *c.offset.shape[2:]), c.x.dtype)
            table["bias"] = c.bias if c.bias is not None else np.zeros(
                c.weight.shape[0], c.x.dtype)
        return table

    table = feeds_of(conv)
    if spelling in ("onnx", "onnx_custom"):
        model = native_model(conv, opset)
        if domain:
            model.graph.node[0].domain = domain
            model.opset_import.append(helper.make_opsetid(domain, 1))
        names = [i.name for i in model.graph.input]
    else:
        if spelling in ("mmcv", "mmdeploy"):
            names = ["x", "offset", "mask", "weight"] + (["bias"] if bias is not None else [])
            attrs = dict(stride=[sh, sw], padding=[ph, pw], dilation=[dh, dw],
                         groups=conv.group, deform_groups=conv.offset_group)
            op = "MMCVModulatedDeformConv2d"
        elif spelling == "mmcv_deform":
            names = ["x", "offset", "weight"]
            attrs = dict(stride=[sh, sw], padding=[ph, pw], dilation=[dh, dw],
                         groups=conv.group, deform_groups=conv.offset_group, bias=0,
                         im2col_step=32)
            op = "MMCVDeformConv2d"
        elif spelling == "mmdeploy_deform":
            names = ["x", "offset", "weight"]
            attrs = dict(stride=[sh, sw], padding=[ph, ph, pw, pw], dilation=[dh, dw],
                         groups=conv.group, deform_groups=conv.offset_group)
            op = "MMCVDeformConv2d"
        elif spelling == "trt":
            names = ["x", "offset", "mask", "weight"] + (["bias"] if bias is not None else [])
            attrs = dict(stride=[sh, sw], padding=[ph, pw], dilation=[dh, dw],
                         group=conv.group, deformable_group=conv.offset_group)
            op = "ModulatedDeformConv2d"
        elif spelling == "dcnv2":
            names = ["x", "offset", "mask", "weight", "bias"]
            attrs = dict(stride=sh, padding=ph, dilation=dh, groups=conv.group,
                         deformable_group=conv.offset_group)
            op = "DCNv2"
        elif spelling == "dcnv2_trt":
            names = ["x", "offset_mask", "weight", "bias"]
            attrs = dict(stride=[sh, sw], padding=[ph, pw], dilation=[dh, dw],
                         deformable_groups=conv.offset_group)
            op = "DCNv2_TRT"
        else:  # torchvision, as the FALLTHROUGH export writes it: Constant scalars
            names = ["x", "weight", "offset", "mask", "bias"]
            for index, (label, value, dtype) in enumerate([
                    ("stride_h", sh, np.int64), ("stride_w", sw, np.int64),
                    ("pad_h", ph, np.int64), ("pad_w", pw, np.int64),
                    ("dilation_h", dh, np.int64), ("dilation_w", dw, np.int64),
                    ("groups", conv.group, np.int64),
                    ("offset_groups", conv.offset_group, np.int64),
                    ("use_mask", mask is not None, np.bool_)]):
                nodes.append(helper.make_node("Constant", [], [label], name=f"c{index}",
                                              value=numpy_helper.from_array(
                                                  np.array(value, dtype), label)))
                names.append(label)
            attrs = {}
            op = "deform_conv2d"
        nodes.append(helper.make_node(op, names, ["y"], name="dcn", domain=domain, **attrs))
        inputs = [_input(name, table[name], True) for name in names if name in table]
        model = make_model(nodes, inputs, [_output(conv)], opset, extra_opsets=extra,
                           initializers=initializers)
        names = [i.name for i in model.graph.input]
    all_feeds = [{name: c_table[name] for name in names}
                 for c_table in [table] + [feeds_of(c) for c in conv.more]]
    return model, all_feeds


SPELLINGS = ["onnx", "onnx_custom", "mmcv", "mmdeploy", "mmcv_deform", "mmdeploy_deform",
             "torchvision", "trt", "dcnv2", "dcnv2_trt"]


def _for_spelling(spelling: str, conv: Conv) -> Conv:
    """What the spelling can express: no mask or bias for MMCVDeformConv2d, a bias always
    for DCNv2, a mask always for the modulated plugins."""
    if spelling in ("mmcv_deform", "mmdeploy_deform"):
        return _without(conv, mask=True, bias=True)
    return conv


def _without(conv: Conv, mask: bool = False, bias: bool = False) -> Conv:
    def strip(c: Conv) -> Conv:
        return Conv(c.x, c.weight, c.offset, None if mask else c.mask,
                    None if bias else c.bias, c.strides, c.pads, c.dilations, c.group,
                    c.offset_group)
    first = strip(conv)
    first.more = [strip(c) for c in conv.more]
    return first


def check_spelling(spelling: str, conv: Conv, opset: int = 13, atol: float = 1e-4) -> None:
    model, feeds = spelled(spelling, conv, opset)
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {"DeformConv": 1}, report.summary()
    assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
    ops = [n.op_type for n in out.graph.node]
    assert not {"DeformConv", "Conv"} & set(ops)
    # the GridSample form from opset 16 (float16/32), the gathers below it and for float64;
    # sizes are dynamic here, so the form samples one kernel row at a time
    sampler = opset >= 16 and conv.x.dtype != np.float64
    assert ops.count("GridSample") == (conv.weight.shape[2] if sampler else 0), ops
    onnx.checker.check_model(out, full_check=True)
    pattern = DeformConv()
    for c, feed in zip([conv, *conv.more], feeds, strict=True):
        got = run_onnxruntime(out, feed)[0]
        assert got.dtype == c.x.dtype
        want = torch_deform_conv(c)
        np.testing.assert_allclose(got.astype(np.float64), want, atol=atol, rtol=atol,
                                   err_msg=f"{spelling} vs torch")
        np.testing.assert_allclose(got, ort_deform_conv(c), atol=atol, rtol=atol,
                                   err_msg=f"{spelling} vs ORT DeformConv-19")
        node = next(n for n in model.graph.node if n.name == "dcn")
        _, form = decomposer.default_registry().lookup(node)
        ref = pattern.evaluate(form, [feed.get(name) if name in feed else _const(model, name)
                                      for name in node.input],
                               pattern.match_attributes(node, form))[0]
        np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64),
                                   atol=atol, rtol=atol, err_msg=f"{spelling} vs reference")


def _const(model: onnx.ModelProto, name: str) -> np.ndarray | None:
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return numpy_helper.to_array(node.attribute[0].t)
    return None


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_every_spelling_matches_torch_and_ort(spelling):
    rng = np.random.default_rng(SPELLINGS.index(spelling))
    symmetric = spelling in ("trt", "dcnv2", "dcnv2_trt")
    conv = make_conv(rng, c=4, co=6, strides=(2, 2) if symmetric else (2, 1),
                     pads=(1, 1, 1, 1), dilations=(2, 2) if symmetric else (1, 2),
                     group=1 if spelling == "dcnv2_trt" else 2,
                     offset_group=2, sizes=[(1, 5, 9)])
    for opset in (13, 18):  # the gather form, the GridSample form
        check_spelling(spelling, _for_spelling(spelling, conv), opset)


@pytest.mark.parametrize("label, params", [
    ("group 1, offset group 1, no mask", dict(group=1, offset_group=1, mask=False)),
    ("offset groups 4, 8 channels", dict(c=8, co=4, offset_group=4)),
    ("groups 4 = channels", dict(c=4, co=8, group=4, offset_group=2)),
    ("H of 1", dict(h=1, w=5, sizes=[(3, 1, 8)])),
    ("W of 1", dict(h=6, w=1, kernel=(1, 3), pads=(0, 1, 0, 1), sizes=[(1, 4, 1)])),
    ("1x1 kernel, stride 3", dict(kernel=(1, 1), pads=(0, 0, 0, 0), strides=(3, 3))),
    ("5x3 kernel, dilation (2, 1), asymmetric pads", dict(kernel=(5, 3), dilations=(2, 1),
                                                          pads=(2, 0, 1, 2))),
    ("no bias, far offsets", dict(bias=False, spread=20.0)),
    ("float64", dict(dtype=np.float64)),
    ("float16", dict(dtype=np.float16, spread=1.0)),
])
def test_sizes_groups_and_types(label, params):
    rng = np.random.default_rng(len(label))
    params.setdefault("sizes", [(1, 9, 4)])
    conv = make_conv(rng, **params)
    atol = 2e-2 if params.get("dtype") == np.float16 else 1e-4
    for spelling, opset in (("onnx", 11), ("mmcv", 18)):
        if spelling == "mmcv" and conv.mask is None:
            continue
        check_spelling(spelling, conv, opset, atol=atol)


def test_onnx_deform_conv_19_is_kept_unless_lowered():
    conv = make_conv(np.random.default_rng(5))
    model = native_model(conv, 19)
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {} and [n.op_type for n in out.graph.node] == ["DeformConv"]
    lowered = decomposer.decompose(model, lower=["DeformConv"])
    assert "DeformConv" not in {n.op_type for n in lowered.graph.node}
    feeds = {k: v for k, v in [("x", conv.x), ("weight", conv.weight), ("offset", conv.offset),
                               ("bias", conv.bias), ("mask", conv.mask)]}
    np.testing.assert_allclose(run_onnxruntime(lowered, feeds)[0], torch_deform_conv(conv),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("opset", [13, 18])
def test_nan_and_inf_offsets_never_crash(opset):
    conv = make_conv(np.random.default_rng(9), sizes=[])
    conv.offset[0, 0, 0, 0] = np.nan
    conv.offset[0, 1, 1, 1] = np.inf
    conv.offset[1, 3, 2, 2] = -np.inf
    conv.offset[1, 4, 3, 3] = 1e30
    model, feeds = spelled("onnx", conv, opset)
    got = run_onnxruntime(decomposer.decompose(model), feeds[0])[0]
    want = torch_deform_conv(conv)
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("how", [{"lower": ["DeformConv", "GridSample"]},
                                 {"lower": ["DeformConv"], "target": "tensorrt"},
                                 {"lower": ["DeformConv"], "target": "onnx2torch"}])
def test_gather_form_where_grid_sample_is_unwanted(how):
    """--lower GridSample, a TensorRT target (NVIDIA/TensorRT#4813) and an engine without
    GridSample (onnx2torch) get the GridSample-free form, not a GridSample lowered after."""
    conv = make_conv(np.random.default_rng(6), offset_group=2, sizes=[])
    model = native_model(conv, 19)
    out = decomposer.decompose(model, **how)
    ops = [n.op_type for n in out.graph.node]
    assert "GridSample" not in ops and "DeformConv" not in ops
    names = [n.name for n in out.graph.node]
    # the gather form's own quad table, not the GridSample form with its GridSample lowered
    assert any("/quad" in name for name in names) and \
        not any("grid_rows" in name for name in names), names
    feeds = {"x": conv.x, "weight": conv.weight, "offset": conv.offset, "bias": conv.bias,
             "mask": conv.mask}
    np.testing.assert_allclose(run_onnxruntime(out, feeds)[0], torch_deform_conv(conv),
                               atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("size, channels, samplers", [(8, 4, 1), (48, 256, 3), (80, 256, 9)])
def test_grid_sample_form_bounds_its_columns_at_static_sizes(size, channels, samplers):
    """Static sizes: every tap in one GridSample while the columns (N*C*K*Ho*Wo float32)
    fit COLUMN_BUDGET (16 MiB), else a kernel row (3 taps), else one tap per GridSample;
    each way within float32 rounding of torch's float64 result: 1e-5 of the output's scale
    (a sum of C*K = 2304 products; ORT's own kernel is off by half of that)."""
    conv = make_conv(np.random.default_rng(size), n=1, c=channels, co=4, h=size, w=size,
                     kernel=(3, 3))
    model = native_model(conv, 19, symbolic=False)
    columns = conv.x.shape[0] * channels * 9 * size * size * 4
    assert (columns <= 16 << 20) == (samplers == 1)
    out = decomposer.decompose(model, lower=["DeformConv"])
    assert [n.op_type for n in out.graph.node].count("GridSample") == samplers
    feeds = {"x": conv.x, "weight": conv.weight, "offset": conv.offset, "bias": conv.bias,
             "mask": conv.mask}
    want = torch_deform_conv(conv)
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(run_onnxruntime(out, feeds)[0], want, atol=1e-5 * scale, rtol=0)
    np.testing.assert_allclose(run_onnxruntime(model, feeds)[0], want, atol=1e-5 * scale,
                               rtol=0)


def test_grid_sample_form_puts_no_weight_across_a_pixel_at_static_sizes():
    """Taps on whole pixels (integer offsets) next to the zero border: where ONNX Runtime's
    DeformConv-19 gives an exact 0, so does the GridSample form (its image is padded to
    powers of two, where the normalized coordinates round trip exactly)."""
    rng = np.random.default_rng(3)
    conv = make_conv(rng, n=1, c=2, co=2, h=3, w=6, pads=(1, 1, 1, 1), spread=0.0)
    conv.x = np.zeros_like(conv.x)
    conv.x[..., 1, 1] = 5  # one pixel: a tap on its neighbour must put no weight on it
    conv.offset = rng.integers(-1, 2, conv.offset.shape).astype(np.float32)
    conv.mask = np.ones_like(conv.mask)
    conv.weight = np.abs(conv.weight)
    conv.bias = None
    model = native_model(conv, 19, symbolic=False)
    out = decomposer.decompose(model, lower=["DeformConv"])
    assert [n.op_type for n in out.graph.node].count("GridSample") == 1
    feeds = {"x": conv.x, "weight": conv.weight, "offset": conv.offset, "mask": conv.mask}
    got, native = run_onnxruntime(out, feeds)[0], run_onnxruntime(model, feeds)[0]
    zeros = native == 0
    assert zeros.any() and (got[zeros] == 0).all()
    np.testing.assert_allclose(got, native, rtol=1e-6, atol=0)


@pytest.mark.parametrize("size, offset_group", [(64, 1), (48, 4)])
def test_grid_sample_form_at_deployment_sizes(size, offset_group):
    """Normalized coordinates round at large sizes: still within the float32 tolerance of
    ONNX Runtime's own DeformConv-19 kernel and of torch in float64."""
    conv = make_conv(np.random.default_rng(size), n=1, c=16, co=8, h=size, w=size,
                     offset_group=offset_group, spread=4.0)
    model = native_model(conv, 19)
    out = decomposer.decompose(model, lower=["DeformConv"])
    assert [n.op_type for n in out.graph.node].count("GridSample") == 3  # a kernel row each
    feeds = {"x": conv.x, "weight": conv.weight, "offset": conv.offset, "bias": conv.bias,
             "mask": conv.mask}
    got = run_onnxruntime(out, feeds)[0]
    np.testing.assert_allclose(got, run_onnxruntime(model, feeds)[0], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(got, torch_deform_conv(conv), atol=1e-4, rtol=1e-4)


# -- rejections -----------------------------------------------------------------------------


def _rejected(model: onnx.ModelProto) -> str:
    with pytest.raises(decomposer.UnsupportedNodeError) as caught:
        decomposer.decompose(model)
    return str(caught.value)


def test_rejections_name_the_node_and_the_reason():
    rng = np.random.default_rng(3)
    conv = make_conv(rng, c=4, group=2, offset_group=2, sizes=[])
    def attribute(model, name):
        return next(a for a in model.graph.node[0].attribute if a.name == name)

    model, _ = spelled("onnx", conv)
    attribute(model, "offset_group").i = 3
    assert "offset_group 3 does not divide the 4 input channels" in _rejected(model)

    model, _ = spelled("onnx", conv)
    attribute(model, "group").i = 3
    assert "'dcn'" in (why := _rejected(model)) and "2 per group x 3 groups" in why

    wrong = make_conv(rng, c=4, offset_group=1, sizes=[])
    wrong.offset = wrong.offset[:, :10]
    model, _ = spelled("onnx", wrong)
    assert "offset 'offset' has 10 channels; expected 18" in _rejected(model)

    wrong = make_conv(rng, c=4, sizes=[])
    wrong.mask = wrong.mask[:, :4]
    model, _ = spelled("mmcv", wrong)
    assert "mask 'mask' has 4 channels; expected 9" in _rejected(model)

    model, _ = spelled("torchvision", conv)
    stride = next(n for n in model.graph.node if n.output[0] == "stride_h")
    model.graph.node.remove(stride)
    model.graph.input.append(helper.make_tensor_value_info("stride_h", TensorProto.INT64, []))
    assert "stride_h (input 6) must be a constant scalar" in _rejected(model)

    model, _ = spelled("mmcv", conv)  # the weight passed as the bias (a fuzzer find)
    node = next(n for n in model.graph.node if n.name == "dcn")
    node.input[4] = "weight"
    assert "bias 'weight' must be 1-D with the weight's 6 output channels" in _rejected(model)

    asymmetric = make_conv(rng, strides=(2, 1), sizes=[])
    model, _ = spelled("trt", asymmetric)
    assert "reads element 0 as the width" in _rejected(model)


# -- portability ----------------------------------------------------------------------------


def portability_cases():
    """ONNX DeformConv below 19 (dynamic N, H, W) and mmcv's modulated spelling with
    groups; oracle: the torch float64 implementation above."""
    cases = []
    rng = np.random.default_rng(11)
    for label, spelling, params in [
            ("DeformConv opset 17 (custom domain)", "onnx_custom",
             dict(strides=(2, 1), dilations=(1, 2), offset_group=2, sizes=[(1, 9, 5)])),
            ("MMCVModulatedDeformConv2d groups 2", "mmcv",
             dict(group=2, offset_group=2, sizes=[(1, 5, 8)]))]:
        conv = make_conv(rng, **params)
        model, feeds = spelled(spelling, conv, 17)
        cases.append({"id": label, "model": model, "feeds": feeds,
                      "expected": [[torch_deform_conv(c).astype(np.float32)]
                                   for c in [conv, *conv.more]], "atol": 1e-4})
    # ONNX's own DeformConv-19, lowered (OpenVINO, TVM and onnx2torch have no DeformConv)
    conv = make_conv(rng, offset_group=2, sizes=[(1, 6, 9)])
    feeds = [{"x": c.x, "weight": c.weight, "offset": c.offset, "bias": c.bias, "mask": c.mask}
             for c in [conv, *conv.more]]
    cases.append({"id": "DeformConv-19, --lower DeformConv", "model": native_model(conv, 19),
                  "feeds": feeds, "lower": ["DeformConv"],
                  "expected": [[torch_deform_conv(c).astype(np.float32)]
                               for c in [conv, *conv.more]], "atol": 1e-4})
    return cases


# -- torchvision's export spelling, reproduced ------------------------------------------------

_TORCHVISION_SCHEMA = (
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, "
    "int groups, int offset_groups, bool use_mask) -> Tensor")
_libraries = []  # keeps the stand-in library alive for the session


def _torchvision_op():
    """``torch.ops.torchvision.deform_conv2d``: torchvision's own when it loads, else a
    stand-in with torchvision's schema (torchvision's native ops cannot load next to the
    CPU torch pinned here), whose export spelling is the same."""
    try:
        return torch.ops.torchvision.deform_conv2d
    except (AttributeError, RuntimeError):
        pass
    library = torch.library.Library("torchvision", "DEF")
    library.define(_TORCHVISION_SCHEMA)

    def shape_only(x, weight, offset, *_):
        return x.new_zeros((x.shape[0], weight.shape[0], *offset.shape[2:]))

    library.impl("deform_conv2d", shape_only, "CPU")
    _libraries.append(library)
    return torch.ops.torchvision.deform_conv2d


def test_torchvision_fallthrough_export_decomposes(tmp_path):
    import io

    op = _torchvision_op()
    conv = make_conv(np.random.default_rng(21), c=4, co=6, strides=(2, 1), dilations=(1, 2),
                     group=2, offset_group=2, sizes=[(1, 9, 7)])

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.from_numpy(conv.weight))
            self.bias = torch.nn.Parameter(torch.from_numpy(conv.bias))

        def forward(self, x, offset, mask):
            return op(x, self.weight, offset, mask, self.bias, *conv.strides, *conv.pads[:2],
                      *conv.dilations, conv.group, conv.offset_group, True)

    buffer = io.BytesIO()
    dims = {"x": {0: "N", 2: "H", 3: "W"}, "offset": {0: "N", 2: "h", 3: "w"},
            "mask": {0: "N", 2: "h", 3: "w"}}
    torch.onnx.export(Net(), tuple(torch.from_numpy(a) for a in (conv.x, conv.offset,
                                                                  conv.mask)),
                      buffer, dynamo=False, opset_version=17, input_names=list(dims),
                      dynamic_axes=dims,
                      operator_export_type=torch.onnx.OperatorExportTypes.ONNX_FALLTHROUGH)
    model = onnx.load_from_string(buffer.getvalue())
    custom = [n for n in model.graph.node if n.domain == "torchvision"]
    assert [n.op_type for n in custom] == ["deform_conv2d"] and len(custom[0].input) == 14
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {"DeformConv": 1}
    for c in [conv, *conv.more]:
        got = run_onnxruntime(out, {"x": c.x, "offset": c.offset, "mask": c.mask})[0]
        np.testing.assert_allclose(got, torch_deform_conv(c), atol=1e-4, rtol=1e-4)
