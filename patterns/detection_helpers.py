"""The small TensorRT / mmdeploy helper plugins of detection exports, each a thin wrapper over
standard ops: ``GatherTopk``, ``GridPriorsTRT``, ``TRTBicubicInterpolate``,
``TRTInstanceNormalization``, ``InstanceNormalization_TRT`` and mmcv's ``MMCVCornerPool``.

Matches (any domain; semantics read from each plugin's kernel, cited per pattern below):
- ``GatherTopk(data, index)`` (mmdeploy ``csrc/mmdeploy/backend_ops/tensorrt/gather_topk``):
  a batched gather along axis ``rank(index) - 1`` with the dims before it as batch:
  ``out[b.., k, c..] = data[b.., index[b.., k], c..]``; index int32 or int64 ->
  ``GatherElements`` along that axis with the index spread over the trailing dims (not
  GatherND with batch dims: onnx2torch 1.5 converts none).
- ``GridPriorsTRT(base_anchors, feat_h, feat_w; stride_h, stride_w)`` (mmdeploy
  ``grid_priors`` plugin; mmdet's ``AnchorGenerator.single_level_grid_priors``): only the
  lengths of ``feat_h`` / ``feat_w`` are read (H and W); output (H * W * A, 4), y outermost,
  then x, anchor innermost: ``base[a] + (x * stride_w, y * stride_h, x * stride_w,
  y * stride_h)``.
- ``TRTBicubicInterpolate(x; scale_factor, align_corners)`` (mmdeploy
  ``bicubic_interpolate`` plugin, torch's ``upsample_bicubic2d``): ``Resize`` cubic with
  ``cubic_coeff_a=-0.75``, borders repeated (``exclude_outside=0``), ``half_pixel`` or
  ``align_corners`` (the plugin's default is 1); integer scales only (the plugin stores the
  output size as an integer product; a fractional scale's size could not be confirmed, so
  it is refused rather than guessed).
- ``TRTInstanceNormalization(x, scale, bias; epsilon)`` (mmdeploy, written for
  ``group_norm`` between two reshapes) -> ``InstanceNormalization``.
- ``InstanceNormalization_TRT(x; epsilon, scales, bias, relu, alpha)`` (TensorRT OSS
  ``plugin/instanceNormalizationPlugin``; the creator's field is ``scales``, its README says
  ``scale``) -> ``InstanceNormalization`` with constant scale and bias, then
  ``LeakyRelu(alpha)`` when ``relu`` > 0.
- ``MMCVCornerPool(x; mode)`` (mmcv ``corner_pool``; mode 0 top, 1 bottom, 2 left, 3 right):
  a running max along H (top: from the bottom up, bottom: top down) or W (left: from the
  right, right: from the left) -> one ``MaxPool`` of stride 1 whose window spans the whole
  axis on one side (H or W static; the padding counts as -inf, so every output sees exactly
  its own run).

Envelope: opsets 11+; float types as each plugin
(float16 where the standard op takes it).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, numpy_dtype
from decomposer.checks import require_shape, require_type
from decomposer.examples import I64, Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._sampling import positions

_FLOATS = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)
_PLUGIN = frozenset({"plugin_version", "plugin_namespace"})


class Facts(NamedTuple):
    elem_type: int
    rank: int
    size: int | None  # corner pool: the pooled axis' length; GatherTopk: data's rank


def _x_type(ctx: MatchContext, node: MatchedNode, name: str, allowed: Any = _FLOATS
            ) -> tuple[int, tuple[int | str | None, ...]]:
    elem_type = require_type(ctx, node.tensor(name), name, allowed)
    return elem_type, require_shape(ctx, node.tensor(name), name, "its rank")


class GatherTopk(Pattern[Facts]):
    op_type = "GatherTopk"
    forms = (Form("GatherTopk", inputs=(In("data"), In("index")), extra_attributes=_PLUGIN),)
    examples = (Example((("data", F, ("B", "N", 4)), ("index", I64, ("B", 3))), ((F, 3),),
                        domains=(("mmdeploy", 13),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        elem_type = require_type(ctx, node.tensor("data"), "data",
                                 (*_FLOATS, TensorProto.INT32, TensorProto.INT64))
        data = require_shape(ctx, node.tensor("data"), "data", "the gather axis", min_rank=1)
        require_type(ctx, node.tensor("index"), "index", (TensorProto.INT32, TensorProto.INT64))
        index = require_shape(ctx, node.tensor("index"), "index", "the batch dims", min_rank=1)
        if len(index) > len(data):
            raise Reject(f"index has rank {len(index)}, data only {len(data)}")
        return Facts(elem_type, len(index), len(data))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        index = b.Cast(b.input(node.tensor("index")), np.int64, hint="index_i64")
        data_rank = facts.size or facts.rank
        if data_rank > facts.rank:  # the same row index for every trailing element
            index = b.Expand(
                b.Unsqueeze(index, list(range(facts.rank, data_rank)), hint="index_spread"),
                b.Concat(b.Shape(index, hint="index_shape"),
                         b.Shape(node.tensor("data"), facts.rank, data_rank,
                                 hint="trailing"), axis=0, hint="spread_shape"),
                hint="indices")
        b.GatherElements(node.tensor("data"), index, facts.rank - 1, out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        data, index = ctx.shape(node.tensor("data")), ctx.shape(node.tensor("index"))
        dims = None if data is None or index is None else \
            list(index) + list(data[facts.rank:])
        return [(facts.elem_type, dims)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        data, index = tensors["data"], tensors["index"]
        assert data is not None and index is not None
        axis = index.ndim - 1
        expanded = index.astype(np.int64).reshape(index.shape + (1,) * (data.ndim - index.ndim))
        return [np.take_along_axis(data, np.broadcast_to(
            expanded, index.shape + data.shape[index.ndim:]), axis)]


class GridPriors(Pattern[Facts]):
    op_type = "GridPriorsTRT"
    forms = (Form("GridPriorsTRT", inputs=(In("base_anchors"), In("feat_h"), In("feat_w")),
                  attributes={"stride_h": Attr("int"), "stride_w": Attr("int")},
                  extra_attributes=_PLUGIN),)
    examples = (Example((("base", F, (3, 4)), ("h", I64, ("H",)), ("w", I64, ("W",))),
                        ((F, 2),), attrs={"stride_h": 8, "stride_w": 8},
                        domains=(("mmdeploy", 13),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        elem_type = require_type(ctx, node.tensor("base_anchors"), "base_anchors", _FLOATS)
        base = require_shape(ctx, node.tensor("base_anchors"), "base_anchors", "(A, 4)",
                             min_rank=2, max_rank=2)
        if isinstance(base[1], int) and base[1] != 4:
            raise Reject("base_anchors must be (A, 4)")
        for name in ("feat_h", "feat_w"):
            require_shape(ctx, node.tensor(name), name, "its length is the grid size",
                          min_rank=1, max_rank=1)
        return Facts(elem_type, 2, None)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        dtype = numpy_dtype(facts.elem_type)
        height = b.Shape(node.tensor("feat_h"), hint="grid_h")
        width = b.Shape(node.tensor("feat_w"), hint="grid_w")
        grid = b.Concat(height, width, np.array([1, 1], np.int64), axis=0, hint="grid_shape")
        ys = b.Mul(b.Cast(positions(b, grid, 0, np.dtype(np.int64), hint="rows"), dtype,
                          hint="rows_f"), np.array(node.args["stride_h"], dtype), hint="shift_y")
        xs = b.Mul(b.Cast(positions(b, grid, 1, np.dtype(np.int64), hint="columns"), dtype,
                          hint="columns_f"), np.array(node.args["stride_w"], dtype),
                   hint="shift_x")
        shifts = b.Concat(xs, ys, xs, ys, axis=3, hint="shifts")  # (H, W, 1, 4)
        anchors = b.Add(shifts, b.input(node.tensor("base_anchors"), dtype), hint="anchors")
        b.Reshape(anchors, np.array([-1, 4], np.int64), out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(facts.elem_type, [None, 4])]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        base, feat_h, feat_w = tensors["base_anchors"], tensors["feat_h"], tensors["feat_w"]
        assert base is not None and feat_h is not None and feat_w is not None
        rows = []
        for y in range(len(feat_h)):
            for x in range(len(feat_w)):
                shift = np.array([x * args["stride_w"], y * args["stride_h"]] * 2, base.dtype)
                rows.append(base + shift)
        return [np.concatenate(rows, 0) if rows else np.zeros((0, 4), base.dtype)]


def _integer_scales(value: Any) -> list[int]:
    scales = [float(v) for v in value]
    # (NaN fails s >= 1; inf is no integer: both are refused before int() sees them)
    if len(scales) != 2 or any(not s >= 1 or s == float("inf") or s != int(s)
                               for s in scales):
        raise Reject(f"{scales}: only integer scales >= 1, [h, w], are pinned (the plugin's "
                     "output size for a fractional scale could not be confirmed)")
    return [int(s) for s in scales]


class BicubicInterpolate(Pattern[Facts]):
    op_type = "TRTBicubicInterpolate"
    forms = (Form("TRTBicubicInterpolate", inputs=(In("x"),), attributes={
        "scale_factor": Attr("floats", normalize=_integer_scales),
        "align_corners": Attr("int", default=1, choices=(0, 1))},
        extra_attributes=_PLUGIN),)
    examples = (Example((("x", F, ("N", 3, "H", "W")),), ((F, 4),),
                        attrs={"scale_factor": [2.0, 2.0], "align_corners": 0},
                        domains=(("mmdeploy", 13),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        elem_type = require_type(ctx, node.tensor("x"), "x",
                                 (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16))
        require_shape(ctx, node.tensor("x"), "x", "(N, C, H, W)", min_rank=4, max_rank=4)
        return Facts(elem_type, 4, None)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        sh, sw = node.args["scale_factor"]
        mode = "align_corners" if node.args["align_corners"] else "half_pixel"
        roi = b.const(np.zeros(0, np.float32), hint="no_roi")
        scales = b.const(np.array([1, 1, sh, sw], np.float32), hint="scales")
        b.op("Resize", node.tensor("x"), roi, scales, mode="cubic", cubic_coeff_a=-0.75,
             exclude_outside=0, coordinate_transformation_mode=mode, out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        shape = ctx.shape(node.tensor("x"))
        sh, sw = node.args["scale_factor"]
        if shape is None:
            return [(facts.elem_type, None)]
        dims = [d * s if isinstance(d, int) else None for d, s in zip(shape[2:], (sh, sw),
                                                                       strict=True)]
        return [(facts.elem_type, [shape[0], shape[1], *dims])]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        sh, sw = args["scale_factor"]
        rows = _cubic_matrix(x.shape[2], x.shape[2] * sh, bool(args["align_corners"]))
        columns = _cubic_matrix(x.shape[3], x.shape[3] * sw, bool(args["align_corners"]))
        return [(rows @ x.astype(np.float64) @ columns.T).astype(x.dtype)]


def _cubic_matrix(size: int, out: int, align_corners: bool) -> np.ndarray:
    """(out, size) weights of torch's bicubic resampling along one axis (A = -0.75, indices
    clamped to the border)."""
    a = -0.75
    matrix = np.zeros((out, size))
    for i in range(out):
        if align_corners:
            source = i * (size - 1) / (out - 1) if out > 1 else 0.0
        else:
            source = (i + 0.5) * size / out - 0.5
        base = int(np.floor(source))
        t = source - base
        for k, d in zip(range(-1, 3), (1 + t, t, 1 - t, 2 - t), strict=True):
            d = abs(d)
            w = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a if d > 1 else \
                ((a + 2) * d - (a + 3)) * d * d + 1
            matrix[i, min(max(base + k, 0), size - 1)] += w
    return matrix


class _InstanceNorm(Pattern[Facts]):
    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        elem_type, shape = _x_type(ctx, node, "x")
        if len(shape) < 3:
            raise Reject("x must be (N, C, ...)")
        return Facts(elem_type, len(shape), shape[1] if isinstance(shape[1], int) else None)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(facts.elem_type, ctx.shape(node.tensor("x")))]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        wide = x.astype(np.float64)
        axes = tuple(range(2, x.ndim))
        mean = wide.mean(axes, keepdims=True)
        var = ((wide - mean) ** 2).mean(axes, keepdims=True)
        scale = tensors.get("scale")
        bias = tensors.get("bias")
        shape = (1, -1) + (1,) * (x.ndim - 2)
        gamma = np.asarray(args.get("scales") if scale is None else scale, np.float64)
        beta = np.asarray(args.get("bias") if bias is None else bias, np.float64)
        y = (wide - mean) / np.sqrt(var + args["epsilon"]) * gamma.reshape(shape) + \
            beta.reshape(shape)
        if args.get("relu", 0) > 0:
            y = np.where(y >= 0, y, y * args["alpha"])
        return [y.astype(x.dtype)]


class MMDeployInstanceNorm(_InstanceNorm):
    op_type = "TRTInstanceNormalization"
    forms = (Form("TRTInstanceNormalization", inputs=(In("x"), In("scale"), In("bias")),
                  attributes={"epsilon": Attr("float", default=1e-5)},
                  extra_attributes=_PLUGIN),)
    examples = (Example((("x", F, ("N", 4, "L")), ("s", F, (4,)), ("b", F, (4,))), None,
                        attrs={"epsilon": 1e-5}, domains=(("mmdeploy", 13),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        facts = super().check(node, ctx)
        for name in ("scale", "bias"):
            require_type(ctx, node.tensor(name), name, (facts.elem_type,))
            require_shape(ctx, node.tensor(name), name, "(C,)", min_rank=1, max_rank=1)
        return facts

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        b.op("InstanceNormalization", node.tensor("x"), node.tensor("scale"),
             node.tensor("bias"), epsilon=float(node.args["epsilon"]), out=node.outputs[0])


class TensorRTInstanceNorm(_InstanceNorm):
    op_type = "InstanceNormalization_TRT"
    forms = (Form("InstanceNormalization_TRT", inputs=(In("x"),), attributes={
        "epsilon": Attr("float", default=1e-5), "scales": Attr("floats"),
        "bias": Attr("floats"), "relu": Attr("int", default=0),
        "alpha": Attr("float", default=0.0)}, extra_attributes=_PLUGIN),)
    examples = (Example((("x", F, ("N", 2, "H", "W")),), None,
                        attrs={"epsilon": 1e-5, "scales": [1.0, 2.0], "bias": [0.0, 1.0],
                               "relu": 1, "alpha": 0.1}, domains=(("", 13),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        facts = super().check(node, ctx)
        for name in ("scales", "bias"):
            count = len(node.args[name])
            if facts.size is not None and count != facts.size:
                raise Reject(f"{name} has {count} values for {facts.size} channels")
        return facts

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        dtype = numpy_dtype(facts.elem_type)
        leaky = node.args["relu"] > 0
        y = b.op("InstanceNormalization", node.tensor("x"),
                 b.const(np.array(node.args["scales"], dtype), hint="scales"),
                 b.const(np.array(node.args["bias"], dtype), hint="bias"),
                 epsilon=float(node.args["epsilon"]), out=None if leaky else node.outputs[0])
        if leaky:
            b.op("LeakyRelu", y, alpha=float(node.args["alpha"]), out=node.outputs[0])


_CORNER_AXES = {0: (2, True), 1: (2, False), 2: (3, True), 3: (3, False)}  # axis, from the end


class CornerPool(Pattern[Facts]):
    op_type = "MMCVCornerPool"
    forms = (Form("MMCVCornerPool", inputs=(In("x"),),
                  attributes={"mode": Attr("int", choices=(0, 1, 2, 3))},
                  extra_attributes=_PLUGIN),)
    examples = (Example((("x", F, ("N", 2, 5, 6)),), None, attrs={"mode": 0},
                        domains=(("mmcv", 13),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        elem_type, shape = _x_type(ctx, node, "x")
        if len(shape) != 4:
            raise Reject("x must be (N, C, H, W)")
        axis, _ = _CORNER_AXES[node.args["mode"]]
        size = shape[axis]
        if not isinstance(size, int):
            raise Reject(f"dim {axis} must be static (the pooling window spans it)")
        return Facts(elem_type, 4, size)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        axis, reverse = _CORNER_AXES[node.args["mode"]]
        span = max(facts.size or 1, 1)
        kernel = [span, 1] if axis == 2 else [1, span]
        pads = [0, 0, 0, 0]  # top, left, bottom, right
        # A running max towards the start looks at what follows: pad after; else before.
        pads[(2 if reverse else 0) + (axis - 2)] = span - 1
        b.op("MaxPool", node.tensor("x"), kernel_shape=kernel, pads=pads, strides=[1, 1],
             out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(facts.elem_type, ctx.shape(node.tensor("x")))]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        axis, reverse = _CORNER_AXES[args["mode"]]
        flipped = np.flip(x, axis) if reverse else x
        running = np.maximum.accumulate(flipped, axis=axis)
        return [np.ascontiguousarray(np.flip(running, axis) if reverse else running)]


PATTERNS = [GatherTopk(), GridPriors(), BicubicInterpolate(), MMDeployInstanceNorm(),
            TensorRTInstanceNorm(), CornerPool()]
