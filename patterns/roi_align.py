"""mmcv/mmdeploy ``MMCVRoiAlign`` and TensorRT's ``ROIAlign_TRT`` (two-stage detectors' RoI
heads exported for TensorRT) as ONNX ``RoiAlign``.

Matches:
- ``MMCVRoiAlign(X, rois)`` in any domain (mmdeploy writes ``mmcv::`` for its TensorRT and
  PPLNN backends, ``mmdeploy/mmcv/ops/roi_align.py``; mmcv 1.x wrote it for its ONNX Runtime
  ops, same domain): rois (R, 5) ``[batch_index, x1, y1, x2, y2]``; attributes
  ``output_height``, ``output_width`` (required), ``spatial_scale`` (1.0),
  ``sampling_ratio`` (0: adaptive; below 0 too, as mmcv), ``mode`` ("avg" | "max"),
  ``aligned`` (1). Semantics: mmcv's ``roi_align`` kernel (``roi_align_cuda_kernel.cuh``),
  whose average pooling is ONNX ``RoiAlign``'s: ``aligned=1`` is
  ``coordinate_transformation_mode="half_pixel"``, ``aligned=0`` is
  ``"output_half_pixel"`` (roi sizes clamped to 1), bit for bit on ONNX Runtime. Its max
  pooling is the max over the sampled bilinear values; ONNX's max (ONNX Runtime's kernel and
  the ONNX reference) is a max of weighted corners instead (onnx/onnx#4764,
  microsoft/onnxruntime#6146), so the max is written as an average ``RoiAlign`` with one
  sample per sub-bin (output ``h * g`` by ``w * g``) and a ``MaxPool`` of g x g.
  The batch index is truncated to an integer, as the kernel's ``(int)`` cast does.
- ``ROIAlign_TRT(X, rois, batch_indices)`` in any domain (TensorRT OSS
  ``plugin/roiAlignPlugin``, README.md, ``ROIAlign_PluginConfig.yaml``, roiAlignKernel.cu):
  ONNX ``RoiAlign`` with int attributes ``coordinate_transformation_mode`` (1 half_pixel,
  0 output_half_pixel; default 1), ``mode`` (1 avg, 0 max; default 1), ``output_height``,
  ``output_width`` (1), ``sampling_ratio`` (0), ``spatial_scale`` (1.0); int32 or int64
  batch indices. Its max is ONNX Runtime's weighted-corner max.

- ``MMCVMultiLevelRoiAlign(rois, feat_0, ..., feat_{L-1})`` in any domain (mmdeploy's
  TensorRT export of mmdet's ``SingleRoIExtractor``,
  ``mmdeploy/codebase/mmdet/models/roi_heads/single_level_roi_extractor.py``; kernel
  ``csrc/mmdeploy/backend_ops/tensorrt/multi_level_roi_align``): attributes
  ``output_height``, ``output_width``, ``featmap_strides`` (one per map), ``pool_mode``
  (0 max, 1 avg), ``sampling_ratio``, ``roi_scale_factor``, ``finest_scale`` (56),
  ``aligned``. Each roi's level is mmdet's ``map_roi_levels``:
  ``clip(floor(log2(sqrt(w * h) / finest_scale + 1e-6)), 0, L - 1)`` of the unscaled roi;
  then a ``roi_scale_factor`` other than 1 (and > 0) rescales it about its centre with the
  kernel's legacy ``(w + 1) * factor / 2 - 0.5`` half-width; then mmcv's RoI align (max as
  above) on its level with ``spatial_scale = 1 / stride``. Written as one ``RoiAlign`` per
  level over all rois and a ``Where`` on the level (L times the sampling, no data-dependent
  split). The kernel clamps an inverted roi's size to 0 when aligned (ONNX keeps it
  negative): inverted rois are out of the envelope.

Refused with the reason: a model at opset 22 or later (its RoiAlign is RoiAlign-22,
which ONNX Runtime 1.32 has no kernel for; measured); mmcv max pooling with an adaptive
sampling ratio (the samples per bin vary per roi: no standard op takes that max);
``ROIAlign_TRT``'s ``half_pixel`` below opset 16 (RoiAlign-10 always clamps roi sizes to
1, so shifting the rois is exact only for rois of a pixel or more); ``ROIAlign_TRT`` max
pooling under the portable target: OpenVINO's ``RoiAlign`` max is mmcv's rule, ONNX
Runtime's the plugin's, so no one graph means the same on both (``--target ort`` emits
``RoiAlign`` max, exact on ONNX Runtime).

mmcv ``aligned=1`` below opset 16 (mmdeploy's default export: opset 11) is RoiAlign-10
(output_half_pixel) on rois shifted by -0.5 after scaling: the same sample points, exact
for every roi at least one pixel wide and high on its feature map after ``spatial_scale``
(RoiAlign-10 clamps smaller ones to one pixel; mmcv does not).

Not exact, documented: the plugin's average of an empty sampling grid (a zero-size roi,
``half_pixel``, adaptive ratio) is 0/0 = NaN in ``ROIAlign_TRT``, 0 here (ONNX Runtime);
mmcv's max of an empty grid is -FLT_MAX (CUDA) or -10000 (CPU), never reached with a
sampling ratio > 0.

Before -> after::

    MMCVRoiAlign(X, rois; avg)   ->  RoiAlign(X, rois[:, 1:5], int64(rois[:, 0]); ctm)
    MMCVRoiAlign(X, rois; max g) ->  MaxPool_gxg(RoiAlign(...; avg, h*g x w*g, ratio 1))
    ROIAlign_TRT(X, rois, idx)   ->  RoiAlign(X, rois, int64(idx); ctm, mode)

Envelope: opsets 11-21 (``ROIAlign_TRT`` ``half_pixel`` 16-21); X float16/32/64 (float16
computed in float32); R, N, H, W dynamic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_shape, require_type
from decomposer.examples import I32, Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)


class Facts(NamedTuple):
    elem_type: int
    half_pixel: bool
    max_pool: bool  # mmcv's max: average sub-bins, then MaxPool
    ort_max: bool  # RoiAlign's own max (ROIAlign_TRT under --target ort)
    ratio: int
    int64_indices: bool  # ROIAlign_TRT's batch_indices already int64


class _RoiAlign(Pattern[Facts]):
    mmcv = True

    def settings(self, args: dict[str, Any]) -> tuple[bool, bool, int]:
        """(half_pixel, max mode, sampling ratio)."""
        raise NotImplementedError

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        args = node.args
        half_pixel, maximum, ratio = self.settings(args)
        if args["output_height"] <= 0 or args["output_width"] <= 0:
            raise Reject("output_height and output_width must be > 0")
        elem_type = require_type(ctx, node.tensor("X"), "X", _TYPES)
        shape = require_shape(ctx, node.tensor("X"), "X", "(N, C, H, W)", min_rank=4,
                              max_rank=4)
        del shape
        rois = require_shape(ctx, node.tensor("rois"), "rois", "its layout", min_rank=2,
                             max_rank=2)
        width = 5 if self.mmcv else 4
        if isinstance(rois[1], int) and rois[1] != width:
            raise Reject(f"rois must be (R, {width}), got {list(rois)}")
        require_type(ctx, node.tensor("rois"), "rois", (elem_type,))
        int64_indices = False
        if not self.mmcv:
            int64_indices = require_type(ctx, node.tensor("batch_indices"), "batch_indices",
                                         (TensorProto.INT32, TensorProto.INT64)) \
                == TensorProto.INT64
        if ctx.opset >= 22:
            raise Reject(f"at opset {ctx.opset} RoiAlign is RoiAlign-22, which ONNX Runtime "
                         "1.32 has no kernel for; convert the model to opset 16-21 first")
        if half_pixel and ctx.opset < 16 and not self.mmcv:
            raise Reject("half-pixel rois need RoiAlign-16; below opset 16 RoiAlign clamps "
                         "every roi to at least one pixel; target opset 16 or newer")
        max_pool = ort_max = False
        if maximum and self.mmcv:
            if ratio <= 0:
                raise Reject("mmcv's max pooling with an adaptive sampling_ratio (0) has no "
                             "standard-op form: the samples per bin vary per roi")
            max_pool = True
        elif maximum:
            if ctx.target != "ort":
                raise Reject("RoiAlign's max mode means the plugin's (and ONNX Runtime's) "
                             "weighted-corner max on ONNX Runtime but mmcv's max of samples "
                             "on OpenVINO: no portable graph; --target ort emits it")
            ort_max = True
        return Facts(elem_type, half_pixel, max_pool, ort_max, max(ratio, 0), int64_indices)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        args = node.args
        original = numpy_dtype(facts.elem_type)
        narrow = facts.elem_type == TensorProto.FLOAT16
        x = b.input(node.tensor("X"), original)
        rois = b.input(node.tensor("rois"), original)
        if narrow:
            x = b.Cast(x, np.float32, hint="x_f32")
            rois = b.Cast(rois, np.float32, hint="rois_f32")
        if self.mmcv:
            index = b.Cast(b.Squeeze(b.Slice(rois, [0], [1], [1], hint="roi_batch_column"),
                                     [1], hint="roi_batch"), np.int64, hint="batch_indices")
            boxes = b.Slice(rois, [1], [5], [1], hint="roi_boxes")
        else:
            index = b.input(node.tensor("batch_indices"))
            if not facts.int64_indices:
                index = b.Cast(index, np.int64, hint="batch_indices")
            boxes = rois
        height, width = int(args["output_height"]), int(args["output_width"])
        grid = facts.ratio if facts.max_pool else 1
        scale = float(args["spatial_scale"])
        if scale != 1.0:  # RoiAlign multiplies the same way; TVM needs spatial_scale 1
            boxes = b.Mul(boxes, np.array(scale, np.float32 if narrow else original),
                          hint="scaled_boxes")
        if facts.half_pixel and b.opset < 16:
            # RoiAlign-10 is output_half_pixel: half_pixel's -0.5 goes on the rois instead
            boxes = b.Sub(boxes, np.array(0.5, np.float32 if narrow else original),
                          hint="half_pixel_boxes")
        attrs: dict[str, Any] = {
            "output_height": height * grid, "output_width": width * grid,
            "sampling_ratio": 1 if facts.max_pool else facts.ratio, "spatial_scale": 1.0,
            "mode": "max" if facts.ort_max else "avg"}
        if b.opset >= 16:
            attrs["coordinate_transformation_mode"] = \
                "half_pixel" if facts.half_pixel else "output_half_pixel"
        final = node.outputs[0]
        last = not facts.max_pool and not narrow
        pooled = b.op("RoiAlign", x, boxes, index, hint="RoiAlign",
                      out=final if last else None, **attrs)
        if facts.max_pool:
            pooled = b.op("MaxPool", pooled, hint="bin_max", out=None if narrow else final,
                          kernel_shape=[grid, grid], strides=[grid, grid])
        if narrow:
            b.Cast(pooled, original, out=final)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [pooled_type(node, ctx, facts.elem_type)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, rois = tensors["X"], tensors["rois"]
        assert x is not None and rois is not None
        half_pixel, maximum, ratio = self.settings(args)
        if self.mmcv:
            index, boxes = rois[:, 0].astype(np.int64), rois[:, 1:5]
        else:
            given = tensors["batch_indices"]
            assert given is not None
            index, boxes = given.astype(np.int64), rois
        return [roi_align_reference(x, boxes, index.astype(np.int64),
                                    int(args["output_height"]), int(args["output_width"]),
                                    float(args["spatial_scale"]), ratio, half_pixel,
                                    "mmcv_max" if maximum and self.mmcv else
                                    "corner_max" if maximum else "avg")]


class MMCVRoiAlign(_RoiAlign):
    op_type = "MMCVRoiAlign"
    forms = (Form("MMCVRoiAlign", inputs=(In("X"), In("rois")), attributes={
        "output_height": Attr("int"), "output_width": Attr("int"),
        "spatial_scale": Attr("float", default=1.0),
        "sampling_ratio": Attr("int", default=0),
        "mode": Attr("string", default="avg", choices=("avg", "max")),
        "aligned": Attr("int", default=1, choices=(0, 1))},
        extra_attributes=frozenset({"plugin_version", "plugin_namespace"})),)
    examples = (
        Example((("x", F, ("N", 4, "H", "W")), ("rois", F, ("R", 5))), ((F, 4),),
                attrs={"output_height": 3, "output_width": 3, "spatial_scale": 0.25,
                       "sampling_ratio": 2, "mode": "max", "aligned": 1},
                domains=(("mmcv", 17),)),
    )

    def settings(self, args: dict[str, Any]) -> tuple[bool, bool, int]:
        return bool(args["aligned"]), args["mode"] == "max", int(args["sampling_ratio"])


class TensorRTRoiAlign(_RoiAlign):
    op_type = "ROIAlign_TRT"
    mmcv = False
    forms = (Form("ROIAlign_TRT", inputs=(In("X"), In("rois"), In("batch_indices")),
                  attributes={
                      "coordinate_transformation_mode": Attr("int", default=1,
                                                             choices=(0, 1)),
                      "mode": Attr("int", default=1, choices=(0, 1)),
                      "output_height": Attr("int", default=1),
                      "output_width": Attr("int", default=1),
                      "sampling_ratio": Attr("int", default=0),
                      "spatial_scale": Attr("float", default=1.0)},
                  extra_attributes=frozenset({"plugin_version", "plugin_namespace"})),)
    examples = (
        Example((("x", F, ("N", 4, "H", "W")), ("rois", F, ("R", 4)), ("idx", I32, ("R",))),
                ((F, 4),), attrs={"output_height": 2, "output_width": 3,
                                  "spatial_scale": 0.5, "sampling_ratio": 0},
                domains=(("", 17), ("trt", 17))),
    )

    def settings(self, args: dict[str, Any]) -> tuple[bool, bool, int]:
        if args["sampling_ratio"] < 0:
            raise Reject("sampling_ratio must be >= 0")
        return bool(args["coordinate_transformation_mode"]), args["mode"] == 0, \
            int(args["sampling_ratio"])


# -- numpy reference: mmcv's roi_align kernel (and the weighted-corner max), float64 -----

def pooled_type(node: MatchedNode, ctx: MatchContext, elem_type: int) -> OutputType:
    """(R, C, output_height, output_width) from the rois (R, ...) and X (N, C, H, W)."""
    x, rois = ctx.shape(node.tensor("X")), ctx.shape(node.tensor("rois"))
    return (elem_type, [rois[0] if rois else None, x[1] if x else None,
                        int(node.args["output_height"]), int(node.args["output_width"])])


def mmcv_bilinear_terms(image: np.ndarray, y: float, x: float) -> list[tuple[float, np.ndarray]]:
    """(weight, C-vector) of the four corners of one sample, mmcv's border rule: outside
    [-1, H] x [-1, W] nothing; coordinates clamped to 0 below; the last row/column repeated."""
    height, width = image.shape[1:]
    if y < -1.0 or y > height or x < -1.0 or x > width:
        return []
    y, x = max(y, 0.0), max(x, 0.0)
    y_low, x_low = int(y), int(x)
    if y_low >= height - 1:
        y_low = y_high = height - 1
        y = float(y_low)
    else:
        y_high = y_low + 1
    if x_low >= width - 1:
        x_low = x_high = width - 1
        x = float(x_low)
    else:
        x_high = x_low + 1
    ly, lx = y - y_low, x - x_low
    hy, hx = 1 - ly, 1 - lx
    return [(hy * hx, image[:, y_low, x_low]), (hy * lx, image[:, y_low, x_high]),
            (ly * hx, image[:, y_high, x_low]), (ly * lx, image[:, y_high, x_high])]


def roi_align_reference(x: np.ndarray, boxes: np.ndarray, index: np.ndarray, height: int,
                        width: int, scale: float, ratio: int, half_pixel: bool, mode: str
                        ) -> np.ndarray:
    """RoI align of (N, C, H, W) over boxes (R, 4) of images ``index``; ``mode`` "avg",
    "mmcv_max" (max of bilinear samples) or "corner_max" (ONNX Runtime's max)."""
    wide = x.astype(np.float64)
    out = np.zeros((len(boxes), x.shape[1], height, width))
    offset = 0.5 if half_pixel else 0.0
    for r, (box, image_index) in enumerate(zip(boxes.astype(np.float64), index, strict=True)):
        image = wide[int(image_index)]
        x1, y1, x2, y2 = box * scale - offset
        roi_w, roi_h = x2 - x1, y2 - y1
        if not half_pixel:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / height, roi_w / width
        grid_h = ratio if ratio > 0 else int(np.ceil(roi_h / height))
        grid_w = ratio if ratio > 0 else int(np.ceil(roi_w / width))
        count = max(grid_h * grid_w, 1)
        for ph in range(height):
            for pw in range(width):
                total = np.zeros(x.shape[1])
                best = np.full(x.shape[1], -np.inf)
                for iy in range(grid_h):
                    y = y1 + ph * bin_h + (iy + 0.5) * bin_h / grid_h
                    for ix in range(grid_w):
                        xx = x1 + pw * bin_w + (ix + 0.5) * bin_w / grid_w
                        terms = mmcv_bilinear_terms(image, y, xx)
                        value = sum((w * v for w, v in terms), np.zeros(x.shape[1]))
                        total += value
                        if mode == "mmcv_max":
                            best = np.maximum(best, value)
                        elif mode == "corner_max":
                            corner = np.max([w * v for w, v in terms], axis=0) if terms \
                                else np.zeros(x.shape[1])
                            best = np.maximum(best, corner)
                out[r, :, ph, pw] = total / count if mode == "avg" else \
                    np.where(np.isfinite(best), best, 0.0)
    return out.astype(x.dtype)


class LevelFacts(NamedTuple):
    elem_type: int
    levels: int
    max_pool: bool
    ratio: int


class MMDeployMultiLevelRoiAlign(Pattern[LevelFacts]):
    op_type = "MMCVMultiLevelRoiAlign"
    forms = (Form("MMCVMultiLevelRoiAlign", attributes={
        "output_height": Attr("int"), "output_width": Attr("int"),
        "featmap_strides": Attr("floats"),
        "pool_mode": Attr("int", default=1, choices=(0, 1)),
        "sampling_ratio": Attr("int", default=0),
        "roi_scale_factor": Attr("float", default=1.0),
        "finest_scale": Attr("int", default=56),
        "aligned": Attr("int", default=1, choices=(0, 1))},
        extra_attributes=frozenset({"plugin_version", "plugin_namespace"})),)
    examples = (
        Example((("rois", F, ("R", 5)), ("p2", F, ("N", 4, "H2", "W2")),
                 ("p3", F, ("N", 4, "H3", "W3"))), ((F, 4),),
                attrs={"output_height": 2, "output_width": 2, "featmap_strides": [4.0, 8.0],
                       "pool_mode": 1, "sampling_ratio": 2, "finest_scale": 56,
                       "aligned": 1}, domains=(("mmdeploy", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> LevelFacts:
        args = node.args
        levels = len(node.inputs) - 1
        if levels < 1 or len(args["featmap_strides"]) != levels:
            raise Reject(f"{levels} feature maps but {len(args['featmap_strides'])} "
                         "featmap_strides")
        if min(args["featmap_strides"]) <= 0 or args["finest_scale"] <= 0:
            raise Reject("featmap_strides and finest_scale must be > 0")
        if args["output_height"] <= 0 or args["output_width"] <= 0:
            raise Reject("output_height and output_width must be > 0")
        if ctx.opset >= 22:
            raise Reject(f"at opset {ctx.opset} RoiAlign is RoiAlign-22, which ONNX Runtime "
                         "1.32 has no kernel for; convert the model to opset 16-21 first")
        if args["aligned"] and ctx.opset < 16:
            raise Reject("aligned rois need RoiAlign-16 (half_pixel); convert the model to "
                         "opset 16 (onnx.version_converter) first")
        elem_type = require_type(ctx, node.inputs[0], "rois", _TYPES)
        rois = require_shape(ctx, node.inputs[0], "rois", "its layout", min_rank=2,
                             max_rank=2)
        if isinstance(rois[1], int) and rois[1] != 5:
            raise Reject(f"rois must be (R, 5), got {list(rois)}")
        for level, name in enumerate(node.inputs[1:]):
            require_type(ctx, name, f"feature map {level}", (elem_type,))
            require_shape(ctx, name, f"feature map {level}", "(N, C, H, W)", min_rank=4,
                          max_rank=4)
        ratio = int(args["sampling_ratio"])
        max_pool = args["pool_mode"] == 0
        if max_pool and ratio <= 0:
            raise Reject("mmcv's max pooling with an adaptive sampling_ratio (0) has no "
                         "standard-op form: the samples per bin vary per roi")
        return LevelFacts(elem_type, levels, max_pool, max(ratio, 0))

    def build(self, b: Builder, node: MatchedNode, facts: LevelFacts) -> None:
        args = node.args
        original = numpy_dtype(facts.elem_type)
        narrow = facts.elem_type == TensorProto.FLOAT16
        f = np.dtype(np.float32) if narrow else original
        rois = b.input(node.inputs[0], original)
        if narrow:
            rois = b.Cast(rois, f, hint="rois_f32")
        index = b.Cast(b.Squeeze(b.Slice(rois, [0], [1], [1], hint="roi_batch_column"), [1],
                                 hint="roi_batch"), np.int64, hint="batch_indices")
        low = b.Slice(rois, [1], [3], [1], hint="roi_low")  # (R, 2): x1, y1
        high = b.Slice(rois, [3], [5], [1], hint="roi_high")
        size = b.Sub(high, low, hint="roi_size")
        area = b.ReduceProd(size, [1], keepdims=False, hint="roi_area")
        scale = b.Div(b.Sqrt(area, hint="roi_scale"), np.array(args["finest_scale"], f),
                      hint="scale_ratio")
        level = b.Floor(b.Div(b.Log(b.Add(scale, np.array(1e-6, f), hint="scale_eps"),
                                    hint="log_scale"), np.array(np.log(2.0), f),
                              hint="log2_scale"), hint="level_f")
        level = b.Clip(level, np.array(0, f), np.array(facts.levels - 1, f),
                       hint="level_clipped")
        level = b.Unsqueeze(level, [1, 2, 3], hint="level_4d")  # against (R, C, h, w)
        boxes = b.Slice(rois, [1], [5], [1], hint="roi_boxes")
        factor = float(args["roi_scale_factor"])
        if factor > 0 and factor != 1:  # the kernel's legacy half-width (w + 1) * f / 2 - 0.5
            centre = b.Mul(b.Add(low, high, hint="roi_sum"), np.array(0.5, f),
                           hint="roi_centre")
            half = b.Sub(b.Mul(b.Add(size, np.array(1, f), hint="size_plus_one"),
                               np.array(factor * 0.5, f), hint="half_scaled"),
                         np.array(0.5, f), hint="half_size")
            boxes = b.Concat(b.Sub(centre, half, hint="low_scaled"),
                             b.Add(centre, half, hint="high_scaled"), axis=1,
                             hint="rescaled_boxes")
        height, width = int(args["output_height"]), int(args["output_width"])
        grid = facts.ratio if facts.max_pool else 1
        result: Value | None = None
        for number, (stride, feature) in enumerate(zip(args["featmap_strides"],
                                                       node.inputs[1:], strict=True)):
            x = b.input(feature, original)
            if narrow:
                x = b.Cast(x, f, hint=f"level{number}_f32")
            attrs: dict[str, Any] = {
                "output_height": height * grid, "output_width": width * grid,
                "sampling_ratio": 1 if facts.max_pool else facts.ratio,
                "spatial_scale": 1.0, "mode": "avg"}
            # the rois in this map's pixels (RoiAlign's own spatial_scale trips TVM)
            level_boxes = b.Mul(boxes, np.array(1.0 / float(stride), f),
                                hint=f"level{number}_boxes")
            if b.opset >= 16:
                attrs["coordinate_transformation_mode"] = \
                    "half_pixel" if args["aligned"] else "output_half_pixel"
            pooled = b.op("RoiAlign", x, level_boxes, index, hint=f"level{number}_RoiAlign",
                          **attrs)
            if facts.max_pool:
                pooled = b.op("MaxPool", pooled, hint=f"level{number}_bin_max",
                              kernel_shape=[grid, grid], strides=[grid, grid])
            if result is None:
                result = pooled
                continue
            last = number == facts.levels - 1 and not narrow
            result = b.Where(b.Equal(level, np.array(number, f), hint=f"on_level{number}"),
                             pooled, result, hint=f"up_to_level{number}",
                             out=node.outputs[0] if last else None)
        assert result is not None
        if narrow:
            b.Cast(result, original, out=node.outputs[0])
        elif result != node.outputs[0]:
            b.Identity(result, out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: LevelFacts
                     ) -> list[OutputType]:
        rois = ctx.shape(node.inputs[0])
        x = ctx.shape(node.inputs[1])
        return [(facts.elem_type, [rois[0] if rois else None, x[1] if x else None,
                                   int(node.args["output_height"]),
                                   int(node.args["output_width"])])]

    def evaluate(self, form: Form, inputs: Sequence[np.ndarray | None],
                 attrs: Mapping[str, Any]) -> list[np.ndarray]:
        """Variadic inputs (rois, then the maps), so the reference takes them positionally."""
        rois, *features = inputs
        assert rois is not None and all(f is not None for f in features)
        return [multi_level_roi_align_reference(rois, [f for f in features if f is not None],
                                                dict(attrs))]


def multi_level_roi_align_reference(rois: np.ndarray, features: list[np.ndarray],
                                    args: dict[str, Any]) -> np.ndarray:
    """The kernel per roi: mmdet's level, the legacy rescale, mmcv's RoI align there."""
    out = []
    f32 = np.float32
    for roi in rois.astype(f32):
        x0, y0, x1, y1 = (float(v) for v in roi[1:])
        scale = np.sqrt(f32((y1 - y0) * (x1 - x0)))
        level = int(np.floor(np.log2(f32(scale / f32(args["finest_scale"]) + f32(1e-6)))))
        level = min(len(features) - 1, max(0, level))
        factor = float(args["roi_scale_factor"])
        box = np.array([x0, y0, x1, y1])
        if factor > 0 and factor != 1:
            cx, cy = (x0 + x1) * 0.5, (y0 + y1) * 0.5
            hw, hh = (x1 - x0 + 1) * factor * 0.5 - 0.5, (y1 - y0 + 1) * factor * 0.5 - 0.5
            box = np.array([cx - hw, cy - hh, cx + hw, cy + hh])
        out.append(roi_align_reference(
            features[level], box[None].astype(f32), np.array([int(roi[0])]),
            int(args["output_height"]), int(args["output_width"]),
            1.0 / float(args["featmap_strides"][level]), int(args["sampling_ratio"]),
            bool(args["aligned"]), "mmcv_max" if args["pool_mode"] == 0 else "avg")[0])
    shape = (0, features[0].shape[1], int(args["output_height"]), int(args["output_width"]))
    return np.stack(out) if out else np.zeros(shape, features[0].dtype)


PATTERNS = [MMCVRoiAlign(), TensorRTRoiAlign(), MMDeployMultiLevelRoiAlign()]
