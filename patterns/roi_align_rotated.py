"""mmcv / mmdeploy ``MMCVRoIAlignRotated`` (rotated RoI heads: mmrotate, oriented R-CNN) as
gathers of bilinear taps and two averaging MatMuls.

Matches ``MMCVRoIAlignRotated(X, rois)`` in any domain (mmcv's exporter writes
``mmcv::``, mmdeploy's ``mmdeploy::``; ``mmcv/ops/roi_align_rotated.py``,
``mmdeploy/mmcv/ops/roi_align_rotated.py``): X (N, C, H, W), rois (R, 6)
``[batch_index, cx, cy, w, h, theta]`` (theta in radians); attributes ``output_height``,
``output_width``, ``spatial_scale`` (1.0), ``sampling_ratio``, ``aligned`` (1),
``clockwise`` (0). mmcv's own exporter writes ``output_width`` equal to
``output_height`` (a bug in its symbolic; the node then means what it says).

Semantics: mmcv's kernel (``roi_align_rotated_cuda_kernel.cuh``; the CPU kernel and
mmdeploy's ONNX Runtime op are the same): centre ``(cx, cy) * scale - 0.5`` when
``aligned`` (else ``- 0``), size ``(w, h) * scale`` (at least 1 unless ``aligned``),
``theta`` negated when ``clockwise``; bin (ph, pw) averages g x g samples at
``(yy, xx) = (-h/2 + (ph + (iy + 0.5) / g) * h / PH, -w/2 + ...)`` rotated by theta about the
centre: ``y = yy cos - xx sin + cy``, ``x = yy sin + xx cos + cx``; each sample is mmcv's
bilinear rule (0 outside [-1, H] x [-1, W], coordinates below 0 read as 0, the last row
and column repeated).

Before -> after::

    samples (R, PH * g, PW * g) of y, x  ->  four corner rows of X as (N * H * W, C),
    Gather, weighted sum, zero outside  ->  (R, C, PH * g, PW * g)  ->  bin means as
    MatMul((PH, PH * g) of 1/g, samples, (PW * g, PW) of 1/g)

Refused with the reason: an adaptive ``sampling_ratio`` (0; the grid then varies per roi,
which a fixed-shape graph cannot sample without padding every roi to the largest).

Envelope: opsets 11+; X float32 (float16 computed in float32); N, C, H, W, R dynamic but C
at run time only through shapes; sample positions round differently from the kernel's order
of operations (about 1e-6 relative).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from .roi_align import mmcv_bilinear_terms, pooled_type

_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT)

MAX_SAMPLES = 1 << 20  # per roi: (output_height x output_width) x sampling_ratio^2


class Facts(NamedTuple):
    elem_type: int
    ratio: int


class RoIAlignRotated(Pattern[Facts]):
    op_type = "MMCVRoIAlignRotated"
    forms = (Form("MMCVRoIAlignRotated", inputs=(In("X"), In("rois")), attributes={
        "output_height": Attr("int"), "output_width": Attr("int"),
        "spatial_scale": Attr("float", default=1.0), "sampling_ratio": Attr("int", default=0),
        "aligned": Attr("int", default=1, choices=(0, 1)),
        "clockwise": Attr("int", default=0, choices=(0, 1))},
        extra_attributes=frozenset({"plugin_version", "plugin_namespace"})),)
    examples = (
        Example((("x", F, ("N", 3, "H", "W")), ("rois", F, ("R", 6))), ((F, 4),),
                attrs={"output_height": 2, "output_width": 3, "spatial_scale": 0.5,
                       "sampling_ratio": 2, "aligned": 1, "clockwise": 0},
                domains=(("mmcv", 13), ("mmdeploy", 13))),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        args = node.args
        if args["output_height"] <= 0 or args["output_width"] <= 0:
            raise Reject("output_height and output_width must be > 0")
        if args["sampling_ratio"] <= 0:
            raise Reject("an adaptive sampling_ratio (0) samples a different grid per roi; "
                         "only a fixed sampling_ratio > 0 is decomposed")
        samples = args["output_height"] * args["output_width"] * args["sampling_ratio"] ** 2
        if samples > MAX_SAMPLES:
            raise Reject(f"{samples} samples per roi (output size x sampling_ratio^2) is over "
                         f"{MAX_SAMPLES}: the sample grid is built as constants")
        elem_type = require_type(ctx, node.tensor("X"), "X", _TYPES)
        require_shape(ctx, node.tensor("X"), "X", "(N, C, H, W)", min_rank=4, max_rank=4)
        require_type(ctx, node.tensor("rois"), "rois", (elem_type,))
        rois = require_shape(ctx, node.tensor("rois"), "rois", "(R, 6)", min_rank=2,
                             max_rank=2)
        if isinstance(rois[1], int) and rois[1] != 6:
            raise Reject(f"rois must be (R, 6), got {list(rois)}")
        return Facts(elem_type, int(args["sampling_ratio"]))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        args = node.args
        f = np.dtype(np.float32)
        original = numpy_dtype(facts.elem_type)
        narrow = facts.elem_type != TensorProto.FLOAT
        x = b.input(node.tensor("X"), original)
        rois = b.input(node.tensor("rois"), original)
        if narrow:
            x, rois = b.Cast(x, f, hint="x_f32"), b.Cast(rois, f, hint="rois_f32")
        g = facts.ratio
        rows, columns = int(args["output_height"]) * g, int(args["output_width"]) * g
        scale, offset = float(args["spatial_scale"]), 0.5 if args["aligned"] else 0.0

        def column(index: int, hint: str) -> Value:  # rois[:, index] as (R, 1, 1)
            return b.Unsqueeze(b.Slice(rois, [index], [index + 1], [1], hint=f"{hint}_col"),
                               [2], hint=hint)

        image = b.Cast(column(0, "image"), np.int64, hint="image_index")
        cx = b.Sub(b.Mul(column(1, "cx"), np.array(scale, f), hint="cx_scaled"),
                   np.array(offset, f), hint="centre_x")
        cy = b.Sub(b.Mul(column(2, "cy"), np.array(scale, f), hint="cy_scaled"),
                   np.array(offset, f), hint="centre_y")
        width = b.Mul(column(3, "w"), np.array(scale, f), hint="roi_width")
        height = b.Mul(column(4, "h"), np.array(scale, f), hint="roi_height")
        if not args["aligned"]:
            width = b.Max(width, np.array(1, f), hint="roi_width_1")
            height = b.Max(height, np.array(1, f), hint="roi_height_1")
        theta = column(5, "theta")
        if args["clockwise"]:
            theta = b.Neg(theta, hint="theta_ccw")
        cos, sin = b.op("Cos", theta, hint="cos", dtype=f), b.op("Sin", theta, hint="sin",
                                                                 dtype=f)
        # sample offsets from the roi's corner, (k + 0.5) / count of the size: (1, rows, 1)
        # and (1, 1, columns)
        fraction_y = ((np.arange(rows, dtype=np.float32) + 0.5) / rows - 0.5).reshape(1, -1, 1)
        fraction_x = ((np.arange(columns, dtype=np.float32) + 0.5) / columns - 0.5).reshape(
            1, 1, -1)
        yy = b.Mul(height, fraction_y, hint="yy")  # (R, rows, 1)
        xx = b.Mul(width, fraction_x, hint="xx")  # (R, 1, columns)
        y = b.Add(b.Sub(b.Mul(yy, cos, hint="yy_cos"), b.Mul(xx, sin, hint="xx_sin"),
                        hint="y_rotated"), cy, hint="y")
        xs = b.Add(b.Add(b.Mul(yy, sin, hint="yy_sin"), b.Mul(xx, cos, hint="xx_cos"),
                         hint="x_rotated"), cx, hint="x")
        shape = b.Shape(x, hint="x_shape")
        size_h = b.Cast(b.Gather(shape, [2], hint="size_h"), f, hint="size_h_f")
        size_w = b.Cast(b.Gather(shape, [3], hint="size_w"), f, hint="size_w_f")
        inside = b.And(
            b.And(b.GreaterOrEqual(y, np.array(-1, f), hint="y_low_ok"),
                  b.LessOrEqual(y, size_h, hint="y_high_ok"), hint="y_ok"),
            b.And(b.GreaterOrEqual(xs, np.array(-1, f), hint="x_low_ok"),
                  b.LessOrEqual(xs, size_w, hint="x_high_ok"), hint="x_ok"), hint="inside")
        taps_y = _taps(b, y, size_h, "y")
        taps_x = _taps(b, xs, size_w, "x")
        table = b.Reshape(b.Transpose(x, [0, 2, 3, 1], hint="x_nhwc"),
                          b.Concat(np.array([-1], np.int64), b.Shape(x, 1, 2, hint="channels"),
                                   axis=0, hint="table_shape"), hint="pixel_rows")
        h_int = b.Gather(shape, [2], hint="h_int")
        w_int = b.Gather(shape, [3], hint="w_int")
        base = b.Mul(image, b.Mul(h_int, w_int, hint="pixels"), hint="image_base")
        total: Value | None = None
        for row, weight_y in taps_y:
            for col, weight_x in taps_x:
                index = b.Add(b.Add(base, b.Mul(row, w_int, hint="row_base"), hint="row_at"),
                              col, hint="pixel_index")
                weight = b.Unsqueeze(b.Mul(weight_y, weight_x, hint="tap_weight"), [3],
                                     hint="tap_weight_c")
                term = b.Mul(b.Gather(table, index, hint="tap"), weight, hint="weighted_tap")
                total = term if total is None else b.Add(total, term, hint="tap_sum")
        assert total is not None
        sampled = b.Where(b.Unsqueeze(inside, [3], hint="inside_c"), total,
                          np.array(0, f), hint="samples")  # (R, rows, columns, C)
        # The g x g samples of each bin averaged by two MatMuls with constant (1/g) bin
        # matrices over (R, C, PH * g, PW * g): no pooling op, whose input rank onnx2torch
        # must read from value_info it does not have here.
        ph_count, pw_count = int(args["output_height"]), int(args["output_width"])
        mean_rows = np.kron(np.eye(ph_count, dtype=np.float32), np.full((1, g), 1 / g,
                                                                       np.float32))
        mean_columns = np.kron(np.eye(pw_count, dtype=np.float32), np.full((g, 1), 1 / g,
                                                                          np.float32))
        planes = b.Transpose(sampled, [0, 3, 1, 2], hint="samples_nchw")
        rows_mean = b.MatMul(mean_rows, planes, hint="row_means")  # (R, C, PH, PW * g)
        pooled = b.MatMul(rows_mean, mean_columns, hint="bin_mean",
                          out=None if narrow else node.outputs[0])
        if narrow:
            b.Cast(pooled, original, out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [pooled_type(node, ctx, facts.elem_type)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, rois = tensors["X"], tensors["rois"]
        assert x is not None and rois is not None
        return [roi_align_rotated_reference(x, rois, args)]


def _taps(b: Builder, u: Value, size: Value, hint: str) -> list[tuple[Value, Value]]:
    """mmcv's two taps along one axis: (int64 index, float weight) for the low and the high
    neighbour, with coordinates below 0 read as 0 and the last line repeated."""
    f = np.dtype(np.float32)
    u = b.Max(u, np.array(0, f), hint=f"{hint}_clamped")
    last = b.Sub(size, np.array(1, f), hint=f"{hint}_last")
    low = b.Floor(u, hint=f"{hint}_floor")
    at_end = b.GreaterOrEqual(low, last, hint=f"{hint}_at_end")
    low = b.Where(at_end, last, low, hint=f"{hint}_low")
    u = b.Where(at_end, last, u, hint=f"{hint}_edge")
    high = b.Where(at_end, last, b.Add(low, np.array(1, f), hint=f"{hint}_next"),
                   hint=f"{hint}_high")
    fraction = b.Sub(u, low, hint=f"{hint}_fraction")
    return [(b.Cast(low, np.int64, hint=f"{hint}_low_i"),
             b.Sub(np.array(1, f), fraction, hint=f"{hint}_low_w")),
            (b.Cast(high, np.int64, hint=f"{hint}_high_i"), fraction)]


def roi_align_rotated_reference(x: np.ndarray, rois: np.ndarray, args: dict[str, Any]
                                ) -> np.ndarray:
    """mmcv's kernel, per roi, bin and sample (float64)."""
    ph_count, pw_count = int(args["output_height"]), int(args["output_width"])
    scale, g = float(args["spatial_scale"]), int(args["sampling_ratio"])
    offset = 0.5 if args["aligned"] else 0.0
    out = np.zeros((len(rois), x.shape[1], ph_count, pw_count))
    for r, roi in enumerate(rois.astype(np.float64)):
        image = x[int(roi[0])].astype(np.float64)
        cx, cy = roi[1] * scale - offset, roi[2] * scale - offset
        width, height = roi[3] * scale, roi[4] * scale
        theta = -roi[5] if args["clockwise"] else roi[5]
        if not args["aligned"]:
            width, height = max(width, 1.0), max(height, 1.0)
        bin_h, bin_w = height / ph_count, width / pw_count
        cos, sin = np.cos(theta), np.sin(theta)
        for ph in range(ph_count):
            for pw in range(pw_count):
                total = np.zeros(x.shape[1])
                for iy in range(g):
                    yy = -height / 2 + ph * bin_h + (iy + 0.5) * bin_h / g
                    for ix in range(g):
                        xx = -width / 2 + pw * bin_w + (ix + 0.5) * bin_w / g
                        y, xs = yy * cos - xx * sin + cy, yy * sin + xx * cos + cx
                        for w, v in mmcv_bilinear_terms(image, y, xs):
                            total += w * v
                out[r, :, ph, pw] = total / (g * g)
    return out.astype(x.dtype)


PATTERNS = [RoIAlignRotated()]
