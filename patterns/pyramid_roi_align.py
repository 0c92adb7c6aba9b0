"""TensorRT's Mask R-CNN RoI poolers ``PyramidROIAlign_TRT`` and
``MultilevelCropAndResize_TRT`` as one ONNX ``RoiAlign`` per pyramid level and a ``Where``.

Matches, in any domain (semantics read from TensorRT OSS ``plugin/pyramidROIAlignPlugin``
and ``plugin/multilevelCropAndResizePlugin``, README.md and the creators, and the kernels in
``plugin/common/kernels/maskRCNNKernels.cu``: ``roiAlign_kernel`` and
``roiAlignHalfCenter_kernel``):
- ``PyramidROIAlign_TRT(rois, P2, P3, P4, P5)``: rois (N, R, 4), roi r of image n, corners
  in either order (``roi_coords_swap=1``: ``[y1, x1, y2, x2]``), in pixels of
  ``image_size`` ([H, W], default 1024 x 1024) when ``roi_coords_absolute=1`` (the default)
  else normalized; clipped to the image. Level: P2, P3 when the clipped normalized area
  ``> t``, P4 when ``> 4t``, P5 when ``> 16t``, ``t = fpn_scale^2 / (4 * H * W)``
  (``fpn_scale`` 224; ``roi_coords_plusone`` widens the box by one pixel for this choice
  only). Sampling: each axis scaled by the map's size over the image's,
  ``roi_coords_transform`` 2 (default) is ``half_pixel``, 1 the same with no -0.5 and no
  clamp of the roi size, 0 samples at the bins' starts, -1 is align-corners crop-and-resize
  (``(P - 1)`` steps); ``sampling_ratio`` 0 adaptive (``ceil(roi / P)``); average.
  Output (N, R, C, P, P), ``P = pooled_size`` (7).
- ``MultilevelCropAndResize_TRT(rois, P2, ..., P6)``: rois (N, R, 4) ``[y1, x1, y2, x2]`` in
  input pixels; level P2..P6 by the area in pixels (``> 112^2``, ``> 224^2``, ...; strict);
  strides 4..64 fixed by the kernel; one sample at each bin's centre, no roi size clamp.
  Output (N, R, C, P, P).

Written as: boxes in each level's pixels, a ``RoiAlign`` (``half_pixel``, the box moved so
that ONNX's sample points are the kernel's) per level over all rois, a ``Where`` on the
level. Transforms 0 and -1 move the box by half a sample step (``0.5 - 0.5 * step / g``),
so they need a fixed ``sampling_ratio`` (-1: 1, as ``legacy`` forces; more samples run past
the box's end, where the kernel clamps and RoiAlign gives zeros).

Refused with the reason: ``legacy=1`` (its threshold constant and forced settings could not
be pinned from the README alone), transforms 0 / -1 with an adaptive sampling ratio, a map
count other than 4 (Pyramid) or 5 (CropAndResize), a model at opset 22+ (RoiAlign-22 has no
ONNX Runtime kernel) or below 16 (``half_pixel`` is RoiAlign-16's).

Not exact, documented: a roi whose clipped box has zero area samples once in the plugin
(``max(1, ceil(0))``) and zero times in ONNX's RoiAlign (output 0); CropAndResize leaves the
rows of invalid rois (outside the image, or empty) unwritten, here they are computed like
the others; ``sampling_ratio`` 0 with ``roi_coords_transform`` 2 or 1 on a roi whose
clipped box is empty (the same zero-area case); RoiAlign's sample positions round
differently from the kernel's (about 1e-4 at 1000-pixel coordinates, float32).

Envelope: opsets 16-21; float32; N, R and the map sizes dynamic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Form, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

_PLUGIN = frozenset({"plugin_version", "plugin_namespace"})
CROP_STRIDES = (4, 8, 16, 32, 64)  # maskRCNNKernels.cu: scale_to_level = 2^iP, iP = 2..6


class Facts(NamedTuple):
    levels: int
    pooled: int


class _Pooler(Pattern[Facts]):
    maps = 4

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        if len(node.inputs) != self.maps + 1:
            raise Reject(f"expected rois and {self.maps} feature maps, got "
                         f"{len(node.inputs) - 1} maps")
        if not 16 <= ctx.opset <= 21:
            raise Reject(f"needs RoiAlign-16 (half_pixel) and an ONNX Runtime kernel: opsets "
                         f"16-21, the model is at {ctx.opset}; convert it first")
        require_type(ctx, node.inputs[0], "rois", (TensorProto.FLOAT,))
        rois = require_shape(ctx, node.inputs[0], "rois", "(N, R, 4)", min_rank=3,
                             max_rank=3)
        if isinstance(rois[2], int) and rois[2] != 4:
            raise Reject(f"rois must be (N, R, 4), got {list(rois)}")
        for level, name in enumerate(node.inputs[1:]):
            require_type(ctx, name, f"feature map {level}", (TensorProto.FLOAT,))
            require_shape(ctx, name, f"feature map {level}", "(N, C, H, W)", min_rank=4,
                          max_rank=4)
        pooled = int(node.args["pooled_size"])
        if pooled <= 0:
            raise Reject("pooled_size must be > 0")
        return Facts(self.maps, pooled)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        rois, x = ctx.shape(node.inputs[0]), ctx.shape(node.inputs[1])
        return [(TensorProto.FLOAT, [rois[0] if rois else None, rois[1] if rois else None,
                                     x[1] if x else None, facts.pooled, facts.pooled])]

    def pool(self, b: Builder, node: MatchedNode, facts: Facts, corners: Value, level: Value,
             boxes_on: Any, ratio: int) -> None:
        """One RoiAlign per level of (N * R) rois ``corners`` (x1, y1, x2, y2 in the
        caller's units), each moved by ``boxes_on(b, corners, map, number)`` into that
        map's pixels, then the (N * R, C, P, P) results chosen by ``level`` (N * R, 1, 1, 1)
        and shaped (N, R, C, P, P)."""
        rois = node.inputs[0]
        flat_count = b.Shape(corners, 0, 1, hint="roi_count")
        ones = b.ConstantOfShape(b.Shape(rois, 0, 2, hint="roi_grid"), 1, np.int64,
                                 hint="roi_ones")
        images = b.Reshape(b.CumSum(ones, 0, exclusive=True, hint="image_of_roi"), flat_count,
                           hint="batch_indices")
        result: Value | None = None
        for number, feature in enumerate(node.inputs[1:]):
            boxes = boxes_on(b, corners, feature, number)
            pooled = b.op("RoiAlign", feature, boxes, images, hint=f"level{number}_RoiAlign",
                          output_height=facts.pooled, output_width=facts.pooled,
                          sampling_ratio=ratio, spatial_scale=1.0, mode="avg",
                          coordinate_transformation_mode="half_pixel")
            result = pooled if result is None else b.Where(
                b.Equal(level, np.array(number, np.int64), hint=f"on_level{number}"), pooled,
                result, hint=f"up_to_level{number}")
        assert result is not None
        target = b.Concat(b.Shape(rois, 0, 2, hint="rois_nr"), b.Shape(result, 1, 4,
                                                                         hint="pooled_chw"),
                          axis=0, hint="output_shape")
        b.Reshape(result, target, out=node.outputs[0])


def _feature_size(b: Builder, feature: str, number: int) -> tuple[Value, Value]:
    """(W, H) of a map as float32 (1,) tensors."""
    shape = b.Cast(b.Shape(feature, 2, 4, hint=f"level{number}_hw"), np.float32,
                   hint=f"level{number}_hw_f")
    return b.Gather(shape, [1], hint=f"level{number}_w"), b.Gather(shape, [0],
                                                                   hint=f"level{number}_h")


class PyramidROIAlign(_Pooler):
    op_type = "PyramidROIAlign_TRT"
    forms = (Form("PyramidROIAlign_TRT", attributes={
        "pooled_size": Attr("int", default=7),
        "image_size": Attr("ints", default=[1024, 1024]),
        "fpn_scale": Attr("int", default=224),
        "sampling_ratio": Attr("int", default=0),
        "roi_coords_absolute": Attr("int", default=1, choices=(0, 1)),
        "roi_coords_swap": Attr("int", default=0, choices=(0, 1)),
        "roi_coords_plusone": Attr("int", default=0, choices=(0, 1)),
        "roi_coords_transform": Attr("int", default=2, choices=(-1, 0, 1, 2)),
        "legacy": Attr("int", default=0, choices=(0, 1))}, extra_attributes=_PLUGIN),)
    examples = (
        Example((("rois", F, ("N", "R", 4)), ("p2", F, ("N", 2, 16, 16)),
                 ("p3", F, ("N", 2, 8, 8)), ("p4", F, ("N", 2, 4, 4)),
                 ("p5", F, ("N", 2, 2, 2))), ((F, 5),),
                attrs={"pooled_size": 2, "image_size": [64, 64], "sampling_ratio": 2},
                domains=(("", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        args = node.args
        if args["legacy"]:
            raise Reject("legacy=1 is not pinned (its threshold constant and forced settings "
                         "are from the README only)")
        if len(args["image_size"]) != 2 or min(args["image_size"]) <= 0:
            raise Reject("image_size must be [H, W], both > 0")
        if args["roi_coords_transform"] in (-1, 0) and args["sampling_ratio"] <= 0:
            raise Reject("roi_coords_transform 0 and -1 need a fixed sampling_ratio (the box "
                         "is moved by half a sample step)")
        if args["roi_coords_transform"] == -1 and (args["pooled_size"] < 2 or
                                                   args["sampling_ratio"] != 1):
            raise Reject("align-corners sampling (transform -1) is pinned for pooled_size >= 2 "
                         "and sampling_ratio 1 (more samples run past the box, which the "
                         "kernel clamps and RoiAlign zeroes)")
        return super().check(node, ctx)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        args = node.args
        f32 = np.float32
        height, width = (float(v) for v in args["image_size"])
        flat = b.Reshape(node.inputs[0], np.array([-1, 4], np.int64), hint="flat_rois")
        a, c = b.Split(flat, 2, 1, hint="corner_pairs")
        if args["roi_coords_swap"]:  # (y, x) pairs -> (x, y)
            a = b.Concat(b.Slice(a, [1], [2], [1], hint="a_x"), b.Slice(a, [0], [1], [1],
                                                                         hint="a_y"),
                         axis=1, hint="a_xy")
            c = b.Concat(b.Slice(c, [1], [2], [1], hint="c_x"), b.Slice(c, [0], [1], [1],
                                                                         hint="c_y"),
                         axis=1, hint="c_xy")
        low, high = b.Min(a, c, hint="low"), b.Max(a, c, hint="high")
        if args["roi_coords_absolute"]:  # clip to the image, then / its size: the same as
            extent = np.array([width, height], f32)  # / its size, then clip to [0, 1]
            low = b.Div(low, extent, hint="low_scaled")
            high = b.Div(high, extent, hint="high_scaled")
        low = b.Clip(low, np.array(0, f32), np.array(1, f32), hint="low_norm")
        high = b.Clip(high, np.array(0, f32), np.array(1, f32), hint="high_norm")
        size = b.Sub(high, low, hint="norm_size")
        if args["roi_coords_plusone"]:
            size = b.Add(size, np.array([1 / width, 1 / height], f32), hint="size_plus_one")
        area = b.ReduceProd(size, [1], keepdims=False, hint="norm_area")
        norm_scale = np.sqrt(float(args["fpn_scale"]) ** 2 / (height * width))
        first = norm_scale * norm_scale / 4
        level = b.Add(b.Add(b.Cast(b.Greater(area, np.array(first, f32), hint="above_p2"),
                                   np.int64, hint="p3"),
                            b.Cast(b.Greater(area, np.array(4 * first, f32), hint="above_p3"),
                                   np.int64, hint="p4"), hint="p34"),
                      b.Cast(b.Greater(area, np.array(16 * first, f32), hint="above_p4"),
                             np.int64, hint="p5"), hint="level")
        level = b.Unsqueeze(level, [1, 2, 3], hint="level_4d")
        corners = b.Concat(low, high, axis=1, hint="norm_corners")
        transform = int(args["roi_coords_transform"])
        ratio = int(args["sampling_ratio"])
        pooled = facts.pooled

        def boxes_on(b: Builder, corners: Value, feature: str, number: int) -> Value:
            w, h = _feature_size(b, feature, number)
            if transform == -1:  # align corners: (size - 1) pixels across
                w = b.Sub(w, np.array([1], f32), hint=f"level{number}_w1")
                h = b.Sub(h, np.array([1], f32), hint=f"level{number}_h1")
            scale = b.Concat(w, h, w, h, axis=0, hint=f"level{number}_scale")
            pixels = b.Mul(corners, scale, hint=f"level{number}_pixels")
            if transform == 2:
                return pixels
            if transform == 1:  # no -0.5: half_pixel on boxes half a pixel further on
                return b.Add(pixels, np.array(0.5, f32), hint=f"level{number}_boxes")
            # transforms 0 and -1: samples at start + step * (bin + i / g); half_pixel puts
            # them at start' - 0.5 + step * (bin + (i + 0.5) / g)
            start = b.Slice(pixels, [0], [2], [1], hint=f"level{number}_start")
            span = b.Sub(b.Slice(pixels, [2], [4], [1], hint=f"level{number}_end"), start,
                         hint=f"level{number}_span")
            steps = pooled - 1 if transform == -1 else pooled
            step = b.Div(span, np.array(steps, f32), hint=f"level{number}_step")
            moved = b.Sub(b.Add(start, np.array(0.5, f32), hint=f"level{number}_half"),
                          b.Mul(step, np.array(0.5 / ratio, f32), hint=f"level{number}_shift"),
                          hint=f"level{number}_moved")
            return b.Concat(moved, b.Add(moved, b.Mul(step, np.array(pooled, f32),
                                                      hint=f"level{number}_extent"),
                                         hint=f"level{number}_moved_end"), axis=1,
                            hint=f"level{number}_boxes")

        self.pool(b, node, facts, corners, level, boxes_on, ratio)

    def evaluate(self, form: Form, inputs: Sequence[np.ndarray | None],
                 attrs: Mapping[str, Any]) -> list[np.ndarray]:
        rois, *maps = inputs
        assert rois is not None
        return [pyramid_reference(rois, [m for m in maps if m is not None], dict(attrs))]


class MultilevelCropAndResize(_Pooler):
    op_type = "MultilevelCropAndResize_TRT"
    maps = 5
    forms = (Form("MultilevelCropAndResize_TRT", attributes={
        "pooled_size": Attr("int"), "image_size": Attr("ints", default=[3, 832, 1344])},
        extra_attributes=_PLUGIN),)
    examples = (
        Example((("rois", F, ("N", "R", 4)), ("p2", F, ("N", 2, 16, 16)),
                 ("p3", F, ("N", 2, 8, 8)), ("p4", F, ("N", 2, 4, 4)),
                 ("p5", F, ("N", 2, 2, 2)), ("p6", F, ("N", 2, 1, 1))), ((F, 5),),
                attrs={"pooled_size": 2, "image_size": [3, 64, 64]}, domains=(("", 17),)),
    )

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        f32 = np.float32
        flat = b.Reshape(node.inputs[0], np.array([-1, 4], np.int64), hint="flat_rois")
        # [y1, x1, y2, x2] -> [x1, y1, x2, y2]
        corners = b.Gather(flat, [1, 0, 3, 2], axis=1, hint="xy_corners")
        size = b.Sub(b.Slice(corners, [2], [4], [1], hint="high"),
                     b.Slice(corners, [0], [2], [1], hint="low"), hint="size")
        area = b.ReduceProd(size, [1], keepdims=False, hint="area")
        level: Value | None = None
        for number, side in enumerate((112.0, 224.0, 448.0, 896.0)):
            step = b.Cast(b.Greater(area, np.array(side * side, f32), hint=f"above{number}"),
                          np.int64, hint=f"step{number}")
            level = step if level is None else b.Add(level, step, hint=f"level_{number}")
        assert level is not None
        level = b.Unsqueeze(level, [1, 2, 3], hint="level_4d")

        def boxes_on(b: Builder, corners: Value, feature: str, number: int) -> Value:
            # one sample at the bin centre of the box / stride: half_pixel with sr=1 on the
            # box moved half a stride (its -0.5 then cancels)
            stride = float(CROP_STRIDES[number])
            return b.Mul(b.Add(corners, np.array(0.5 * stride, f32),
                               hint=f"level{number}_moved"), np.array(1 / stride, f32),
                         hint=f"level{number}_boxes")

        self.pool(b, node, facts, corners, level, boxes_on, 1)

    def evaluate(self, form: Form, inputs: Sequence[np.ndarray | None],
                 attrs: Mapping[str, Any]) -> list[np.ndarray]:
        rois, *maps = inputs
        assert rois is not None
        return [crop_and_resize_reference(rois, [m for m in maps if m is not None],
                                          dict(attrs))]


# -- numpy references: the two kernels, per roi and sample (float64) -------------------

def _clamped_bilinear(image: np.ndarray, y: float, x: float) -> np.ndarray:
    """The kernels' sample: coordinates clamped into the map, no zeros outside."""
    height, width = image.shape[1:]
    y, x = min(max(y, 0.0), height - 1.0), min(max(x, 0.0), width - 1.0)
    y0, x0 = int(np.floor(y)), int(np.floor(x))
    y1, x1 = min(y0 + 1, height - 1), min(x0 + 1, width - 1)
    ly, lx = y - y0, x - x0
    return ((1 - ly) * (1 - lx) * image[:, y0, x0] + (1 - ly) * lx * image[:, y0, x1]
            + ly * (1 - lx) * image[:, y1, x0] + ly * lx * image[:, y1, x1])


def pyramid_reference(rois: np.ndarray, maps: list[np.ndarray], args: dict[str, Any]
                      ) -> np.ndarray:
    height, width = (float(v) for v in args["image_size"])
    pooled, ratio = int(args["pooled_size"]), int(args["sampling_ratio"])
    transform = int(args["roi_coords_transform"])
    scale = np.sqrt(float(args["fpn_scale"]) ** 2 / (height * width))
    first = scale * scale / 4
    out = np.zeros((*rois.shape[:2], maps[0].shape[1], pooled, pooled))
    for n in range(rois.shape[0]):
        for r in range(rois.shape[1]):
            v = rois[n, r].astype(np.float64)
            if args["roi_coords_swap"]:
                v = v[[1, 0, 3, 2]]
            x1, x2 = min(v[0], v[2]), max(v[0], v[2])
            y1, y2 = min(v[1], v[3]), max(v[1], v[3])
            if args["roi_coords_absolute"]:
                x1, x2 = np.clip([x1, x2], 0, width) / width
                y1, y2 = np.clip([y1, y2], 0, height) / height
            x1, x2, y1, y2 = np.clip([x1, x2, y1, y2], 0, 1)
            one = 1.0 if args["roi_coords_plusone"] else 0.0
            area = (y2 - y1 + one / height) * (x2 - x1 + one / width)
            level = int(area > first) + int(area > 4 * first) + int(area > 16 * first)
            image = maps[level][n].astype(np.float64)
            fh, fw = image.shape[1:]
            if transform == -1:
                ys, ye, xs, xe = y1 * (fh - 1), y2 * (fh - 1), x1 * (fw - 1), x2 * (fw - 1)
                dy, dx, offset = (ye - ys) / (pooled - 1), (xe - xs) / (pooled - 1), 0.0
            else:
                shift = 0.5 if transform == 2 else 0.0
                ys, ye, xs, xe = y1 * fh - shift, y2 * fh - shift, x1 * fw - shift, \
                    x2 * fw - shift
                dy, dx = (ye - ys) / pooled, (xe - xs) / pooled
                offset = 0.0 if transform == 0 else 0.5
            gy = ratio if ratio > 0 else max(1, int(np.ceil((ye - ys) / pooled)))
            gx = ratio if ratio > 0 else max(1, int(np.ceil((xe - xs) / pooled)))
            for py in range(pooled):
                for px in range(pooled):
                    total = np.zeros(image.shape[0])
                    for iy in range(gy):
                        for ix in range(gx):
                            total += _clamped_bilinear(
                                image, ys + dy * py + dy * (iy + offset) / gy,
                                xs + dx * px + dx * (ix + offset) / gx)
                    out[n, r, :, py, px] = total / (gy * gx)
    return out.astype(np.float32)


def crop_and_resize_reference(rois: np.ndarray, maps: list[np.ndarray],
                              args: dict[str, Any]) -> np.ndarray:
    pooled = int(args["pooled_size"])
    out = np.zeros((*rois.shape[:2], maps[0].shape[1], pooled, pooled))
    for n in range(rois.shape[0]):
        for r in range(rois.shape[1]):
            y1, x1, y2, x2 = rois[n, r].astype(np.float64)
            area = (y2 - y1) * (x2 - x1)
            level = sum(int(area > side * side) for side in (112.0, 224.0, 448.0, 896.0))
            stride = CROP_STRIDES[level]
            image = maps[level][n].astype(np.float64)
            ys, xs = y1 / stride, x1 / stride
            dy, dx = (y2 - y1) / stride / pooled, (x2 - x1) / stride / pooled
            for py in range(pooled):
                for px in range(pooled):
                    out[n, r, :, py, px] = _clamped_bilinear(image, ys + dy * (py + 0.5),
                                                             xs + dx * (px + 0.5))
    return out.astype(np.float32)


PATTERNS = [PyramidROIAlign(), MultilevelCropAndResize()]
