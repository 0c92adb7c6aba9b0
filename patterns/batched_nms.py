"""TensorRT's ``BatchedNMS_TRT`` / ``BatchedNMSDynamic_TRT`` and mmdeploy's ``TRTBatchedNMS``
(two-stage and SSD-style detectors exported for TensorRT) as ONNX NonMaxSuppression, TopK
and gathers.

Matches:
- ``BatchedNMS_TRT(boxes, scores)`` and ``BatchedNMSDynamic_TRT`` in any domain, four
  outputs, attributes (TensorRT OSS ``plugin/batchedNMSPlugin``, README.md and
  batchedNMSPlugin.cpp at v10.15, the last release that has it): ``shareLocation``,
  ``backgroundLabelId``, ``numClasses``, ``topK``, ``keepTopK``, ``scoreThreshold``,
  ``iouThreshold`` (required), ``isNormalized`` (required here: the creator leaves it
  uninitialized when absent, README and header disagree on a default), ``clipBoxes`` (1),
  ``caffeSemantics`` (1), ``scoreBits`` (16; float16 sorting only, accepted and ignored).
- mmdeploy ``TRTBatchedNMS(boxes, scores)`` (``mmdeploy/mmcv/ops/nms.py``
  ``TRTBatchedNMSop.symbolic``; kernel ``csrc/mmdeploy/backend_ops/tensorrt/batched_nms``),
  two or three outputs, attributes ``num_classes``, ``background_label_id``,
  ``iou_threshold``, ``score_threshold``, ``topk``, ``keep_topk``, ``is_normalized``,
  ``clip_boxes``, ``return_index`` (snake case: mmdeploy's docs spell them in camel case,
  its exporter does not).

Semantics (both read from the kernels: sortScoresPerClass, allClassNMS, sortScoresPerImage,
gatherNMSOutputs):
- boxes (B, N, 1, 4) shared by the classes or (B, N, C, 4) (``shareLocation`` 0), corners;
  scores (B, N, C) (or (B, N, C, 1)); float32 or float16.
- Per class (not the background class): candidates with ``score > scoreThreshold``
  (strict), sorted by score (stable: the lower box first), the first ``topK`` kept; greedy
  NMS suppressing ``IoU > iouThreshold`` (strict). Then all classes' survivors of an image
  sorted by score, ties to the lower class, then the lower box; the first ``keepTopK``.
- IoU: plain, with the corners sorted; TensorRT with ``isNormalized=0`` and
  ``caffeSemantics=1`` counts pixels inclusively (+1 on widths and heights, Caffe's rule).
  mmdeploy never adds 1.
- ``clipBoxes`` clips the output boxes to [0, 1] (TensorRT does so whatever
  ``isNormalized`` says; the IoU uses the unclipped boxes).
- Outputs, TensorRT: ``num_detections`` int32 (B, 1); ``nmsed_boxes`` (B, K, 4) zeros past
  the count; ``nmsed_scores`` (B, K) zeros; ``nmsed_classes`` (B, K) floating, -1 past the
  count. mmdeploy: ``dets`` (B, K, 5) ``[x1, y1, x2, y2, score]`` zeros past the count,
  ``labels`` int32 (B, K) -1, ``index`` int32 (B, K) (the box's row in N) -1. K =
  ``keepTopK`` (mmdeploy: ``keep_topk``; ``topk`` <= 0 or > N means N).

Refused with the reason: ``keepTopK > topK`` (the TensorRT plugin then writes no output),
``topK > 4096`` (its limit), TensorRT's ``isNormalized=0`` with ``caffeSemantics=0`` (the
intersection without +1 over areas with it: no standard NonMaxSuppression computes that),
a ``numClasses`` other than the scores' class count.

Not exact, documented: with Caffe's +1 the plugin gives two disjoint boxes the IoU
``1 / (A1 + A2 - 1)`` (their zeroed intersection box counts one pixel); here they have
IoU 0, so the results differ only for boxes smaller than about ``1 / iouThreshold`` pixels
in area. Where mmdeploy's plugin leaves its outputs unwritten (fewer boxes than
``keep_topk``), the outputs here are the padding. Boxes with a max corner below the min
corner: mmdeploy's kernel gives them area 0, NonMaxSuppression sorts the corners.

Before -> after::

    scores' = score > t and class != background ? score : lowest
    scores' = all but each class's topK best -> lowest              # ._nms.keep_top
    kept    = NonMaxSuppression(boxes (+1 max corner for Caffe), scores', min(topK, K))
    table   = ScatterND(lowest (B, C * N), kept cells, kept scores)  # class-major
    scores, cell = TopK(table + K lowest columns, K)                 # ._nms.take_top

Envelope: opsets 11+; C static; B and N dynamic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_shape, require_type
from decomposer.examples import I32, Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._nms import (
    DROPPED,
    Top,
    gather_rows,
    greedy_nms,
    iou,
    keep_top,
    select_candidates,
    suppress,
    take_top,
)

_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16)
TENSORRT_TOPK_LIMIT = 4096  # batchedNMSPlugin.cpp: maxTopK{512 * 8}

_TENSORRT = {
    "shareLocation": Attr("int", choices=(0, 1), arg="share_location"),
    "backgroundLabelId": Attr("int", arg="background"),
    "numClasses": Attr("int", arg="classes"),
    "topK": Attr("int", arg="topk"),
    "keepTopK": Attr("int", arg="keep"),
    "scoreThreshold": Attr("float", arg="score_threshold"),
    "iouThreshold": Attr("float", arg="iou_threshold"),
    "isNormalized": Attr("int", choices=(0, 1), arg="normalized"),
    "clipBoxes": Attr("int", default=1, choices=(0, 1), arg="clip"),
    "caffeSemantics": Attr("int", default=1, choices=(0, 1), arg="caffe"),
    "scoreBits": Attr("int", default=16),
}
_MMDEPLOY = {
    "num_classes": Attr("int", arg="classes"),
    "background_label_id": Attr("int", default=-1, arg="background"),
    "iou_threshold": Attr("float"),
    "score_threshold": Attr("float"),
    "topk": Attr("int", default=-1),
    "keep_topk": Attr("int", default=-1, arg="keep"),
    "is_normalized": Attr("int", default=0, choices=(0, 1), arg="normalized"),
    "clip_boxes": Attr("int", default=0, choices=(0, 1), arg="clip"),
    "return_index": Attr("int", default=0, choices=(0, 1)),
}
_PLUGIN_FIELDS = frozenset({"plugin_version", "plugin_namespace"})


class Facts(NamedTuple):
    elem_type: int
    classes: int
    per_class_boxes: bool
    box_rank: int
    score_rank: int
    anchors: int | None  # N when static
    topk: int | None  # per-class cap; None: none
    keep: int
    plus_one: bool


class _BatchedNMS(Pattern[Facts]):
    mmdeploy = False

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        args = node.args
        for name in ("score_threshold", "iou_threshold"):
            if not np.isfinite(args[name]):
                raise Reject(f"{name} must be finite")
        elem_type = require_type(ctx, node.tensor("scores"), "scores", _TYPES)
        require_type(ctx, node.tensor("boxes"), "boxes", (elem_type,))
        scores = require_shape(ctx, node.tensor("scores"), "scores", "to find the classes",
                               min_rank=3, max_rank=4)
        classes = scores[2]
        if not isinstance(classes, int):
            raise Reject("the class count (scores dim 2) must be static")
        if classes != args["classes"]:
            raise Reject(f"the class-count attribute says {args['classes']}, the scores have "
                         f"{classes} classes")
        if len(scores) == 4 and scores[3] != 1:
            raise Reject("4-D scores must be (B, N, C, 1)")
        boxes = require_shape(ctx, node.tensor("boxes"), "boxes", "to read the box layout",
                              min_rank=3, max_rank=4)
        per_class = len(boxes) == 4 and boxes[2] != 1
        if per_class and boxes[2] != classes:
            raise Reject(f"per-class boxes have {boxes[2]} classes, scores {classes}")
        if not self.mmdeploy and args["share_location"] == int(per_class):
            raise Reject(f"shareLocation={args['share_location']} but the boxes are "
                         f"{'per class' if per_class else 'shared'} ({list(boxes)})")
        anchors = scores[1] if isinstance(scores[1], int) else None
        topk: int | None = args["topk"]
        keep = int(args["keep"])
        if self.mmdeploy:
            if topk is not None and topk <= 0:
                topk = None  # the kernel: topk <= 0 or > N means N
            if keep < 0:
                if anchors is None:
                    raise Reject("keep_topk < 0 means N, which must then be static")
                keep = anchors
            plus_one = False
        else:
            assert topk is not None
            if topk > TENSORRT_TOPK_LIMIT:
                raise Reject(f"topK = {topk} is above the plugin's limit of "
                             f"{TENSORRT_TOPK_LIMIT}")
            if keep > topk:
                raise Reject(f"keepTopK = {keep} > topK = {topk}: the plugin then writes no "
                             "detections")
            if topk <= 0:
                raise Reject("topK must be > 0")
            plus_one = not args["normalized"]
            if plus_one and not args["caffe"]:
                raise Reject("isNormalized=0 with caffeSemantics=0 (an IoU whose areas "
                             "count +1 and whose intersection does not) is not a "
                             "NonMaxSuppression IoU")
        if keep <= 0:
            raise Reject("the kept count must be > 0")
        return Facts(elem_type, classes, per_class, len(boxes), len(scores), anchors, topk,
                     keep, plus_one)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        args = node.args
        original = numpy_dtype(facts.elem_type)
        narrow = facts.elem_type != TensorProto.FLOAT
        f32 = np.dtype(np.float32)
        scores = b.input(node.tensor("scores"), original)
        if narrow:
            scores = b.Cast(scores, f32, hint="scores_f32")
        if facts.score_rank == 4:
            scores = b.Squeeze(scores, [3], hint="scores_3d")
        raw_boxes = b.input(node.tensor("boxes"), original)
        if facts.box_rank == 4 and not facts.per_class_boxes:
            raw_boxes = b.Squeeze(raw_boxes, [2], hint="boxes_3d")
        boxes = b.Cast(raw_boxes, f32, hint="boxes_f32") if narrow else raw_boxes
        if facts.plus_one:  # Caffe's inclusive pixels: the max corner one further
            axis = 3 if facts.per_class_boxes else 2
            first, second = b.Split(boxes, 2, axis, hint="box_pairs")
            boxes = b.Concat(b.Min(first, second, hint="low"),
                             b.Add(b.Max(first, second, hint="high"), np.array(1, np.float32),
                                   hint="high_inclusive"), axis=axis, hint="inclusive_boxes")
        candidates = select_candidates(b, scores, float(args["score_threshold"]),
                                       int(args["background"]), facts.classes)
        most = facts.keep if facts.topk is None else min(facts.topk, facts.keep)
        if facts.topk is not None:
            by_class = b.Transpose(candidates, [0, 2, 1], hint="candidates_by_class")
            capped = keep_top(b, by_class, facts.topk, facts.anchors, 3, hint="class_topk")
            if capped != by_class:
                candidates = b.Transpose(capped, [0, 2, 1], hint="capped_candidates")
        survivors = suppress(b, boxes, candidates, classes=facts.classes,
                             per_class_boxes=facts.per_class_boxes, class_agnostic=False,
                             iou_threshold=float(args["iou_threshold"]),
                             score_threshold=DROPPED, most_per_class=most, class_major=True)
        top = take_top(b, survivors, facts.keep)
        rows_out = raw_boxes
        index = top.anchor
        if facts.per_class_boxes:
            rows_out = b.Reshape(raw_boxes, b.Concat(b.Shape(scores, 0, 1, hint="batch"),
                                                     np.array([-1, 4], np.int64), axis=0,
                                                     hint="box_rows_target"), hint="box_rows")
            index = b.Add(b.Mul(top.anchor, np.array(facts.classes, np.int64),
                                hint="box_row_base"), top.klass, hint="box_row")
        if self.mmdeploy:
            self._mmdeploy_outputs(b, node, facts, top, rows_out, index)
        else:
            self._tensorrt_outputs(b, node, facts, top, rows_out, index)

    def _boxes(self, b: Builder, node: MatchedNode, facts: Facts, top: Top, rows: Value,
               index: Value, out: str | None) -> Value:
        """The detections' boxes in float32 (zeros past the count), clipped if asked."""
        narrow = facts.elem_type != TensorProto.FLOAT
        clip = bool(node.args["clip"])
        picked = gather_rows(b, rows, index, top.valid, hint="picked_boxes",
                             out=None if narrow or clip else out)
        if narrow:
            picked = b.Cast(picked, np.float32, hint="picked_f32")
        if clip:
            picked = b.Clip(picked, np.array(0, np.float32), np.array(1, np.float32),
                            hint="clipped_boxes", out=None if narrow else out)
        return picked

    def _tensorrt_outputs(self, b: Builder, node: MatchedNode, facts: Facts, top: Top,
                          rows: Value, index: Value) -> None:
        original = numpy_dtype(facts.elem_type)
        narrow = facts.elem_type != TensorProto.FLOAT
        out_count, out_boxes, out_scores, out_classes = node.outputs
        if out_count:
            b.Cast(top.detections, np.int32, out=out_count)
        if out_boxes:
            picked = self._boxes(b, node, facts, top, rows, index,
                                 None if narrow else out_boxes)
            if narrow:
                b.Cast(picked, original, out=out_boxes)
        if out_scores:
            b.Cast(top.scores, original, out=out_scores) if narrow else \
                b.Identity(top.scores, out=out_scores)
        if out_classes:
            b.Where(top.valid, b.Cast(top.klass, original, hint="class_value"),
                    np.array(-1, original), out=out_classes)

    def _mmdeploy_outputs(self, b: Builder, node: MatchedNode, facts: Facts, top: Top,
                          rows: Value, index: Value) -> None:
        original = numpy_dtype(facts.elem_type)
        outputs = list(node.outputs) + [""] * (3 - len(node.outputs))
        out_dets, out_labels, out_index = outputs
        if out_dets:
            picked = self._boxes(b, node, facts, top, rows, index, None)
            dets = b.Concat(picked, b.Unsqueeze(top.scores, [2], hint="score_column"),
                            axis=2, hint="dets_f32",
                            out=out_dets if facts.elem_type == TensorProto.FLOAT else None)
            if facts.elem_type != TensorProto.FLOAT:
                b.Cast(dets, original, out=out_dets)
        minus_one = np.array(-1, np.int64)
        if out_labels:
            b.Cast(b.Where(top.valid, top.klass, minus_one, hint="labels_i64"), np.int32,
                   out=out_labels)
        if out_index:
            b.Cast(b.Where(top.valid, top.anchor, minus_one, hint="index_i64"), np.int32,
                   out=out_index)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        shape = ctx.shape(node.tensor("scores"))
        batch = shape[0] if shape else None
        k = facts.keep
        if self.mmdeploy:
            types: list[OutputType] = [(facts.elem_type, [batch, k, 5]),
                                       (TensorProto.INT32, [batch, k]),
                                       (TensorProto.INT32, [batch, k])]
            return types[:len(node.outputs)]
        return [(TensorProto.INT32, [batch, 1]), (facts.elem_type, [batch, k, 4]),
                (facts.elem_type, [batch, k]), (facts.elem_type, [batch, k])]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        boxes, scores = tensors["boxes"], tensors["scores"]
        assert boxes is not None and scores is not None
        return batched_nms_reference(boxes, scores, args, self.mmdeploy)


class BatchedNMS(_BatchedNMS):
    op_type = "BatchedNMS_TRT"
    forms = (Form(("BatchedNMS_TRT", "BatchedNMSDynamic_TRT"),
                  inputs=(In("boxes"), In("scores")), attributes=_TENSORRT, outputs=4,
                  extra_attributes=_PLUGIN_FIELDS),)
    examples = (
        Example((("boxes", F, ("B", "N", 1, 4)), ("scores", F, ("B", "N", 3))),
                ((I32, 2), (F, 3), (F, 2), (F, 2)),
                attrs={"shareLocation": 1, "backgroundLabelId": 0, "numClasses": 3,
                       "topK": 20, "keepTopK": 10, "scoreThreshold": 0.3,
                       "iouThreshold": 0.5, "isNormalized": 1, "clipBoxes": 0},
                domains=(("", 13), ("trt", 13))),
        Example((("boxes", F, ("B", "N", 3, 4)), ("scores", F, ("B", "N", 3))),
                ((I32, 2), (F, 3), (F, 2), (F, 2)),
                attrs={"shareLocation": 0, "backgroundLabelId": -1, "numClasses": 3,
                       "topK": 20, "keepTopK": 10, "scoreThreshold": 0.3,
                       "iouThreshold": 0.5, "isNormalized": 0, "clipBoxes": 1},
                domains=(("", 13),), op_type="BatchedNMSDynamic_TRT"),
    )


class MMDeployBatchedNMS(_BatchedNMS):
    op_type = "TRTBatchedNMS"
    mmdeploy = True
    forms = (Form("TRTBatchedNMS", inputs=(In("boxes"), In("scores")), attributes=_MMDEPLOY,
                  outputs=(2, 3), extra_attributes=_PLUGIN_FIELDS),)
    examples = (
        Example((("boxes", F, ("B", "N", 1, 4)), ("scores", F, ("B", "N", 3))),
                ((F, 3), (I32, 2)),
                attrs={"num_classes": 3, "background_label_id": -1, "iou_threshold": 0.5,
                       "score_threshold": 0.05, "topk": 30, "keep_topk": 10,
                       "is_normalized": 0, "clip_boxes": 0, "return_index": 0},
                domains=(("mmdeploy", 13),)),
    )


# -- numpy reference: the plugins' algorithm, from their kernels ------------------------

def batched_nms_reference(boxes: np.ndarray, scores: np.ndarray, args: dict[str, Any],
                          mmdeploy: bool) -> list[np.ndarray]:
    dtype = scores.dtype
    s = scores.astype(np.float32).reshape(scores.shape[:3])
    shape: tuple[int, ...] = tuple(s.shape)
    batch, count, classes = shape
    rows = boxes.astype(np.float32).reshape(batch, count, boxes.shape[2] if boxes.ndim == 4
                                            else 1, 4)
    topk = int(args["topk"])
    if mmdeploy and (topk <= 0 or topk > count):
        topk = count
    keep = int(args["keep"])
    if mmdeploy and keep < 0:
        keep = count
    plus_one = not mmdeploy and not args["normalized"]
    threshold = np.float32(args["score_threshold"])
    out_boxes = np.zeros((batch, keep, 4), np.float32)
    out_scores = np.zeros((batch, keep), np.float32)
    out_classes = np.full((batch, keep), -1, np.int64)
    out_index = np.full((batch, keep), -1, np.int64)
    num = np.zeros((batch, 1), np.int32)
    for image in range(batch):
        found = []  # (score, class, rank, box)
        for c in range(classes):
            if c == args["background"]:
                continue
            column = s[image, :, c]
            order = [n for n in np.argsort(-column, kind="stable") if column[n] > threshold]
            order = order[:topk]
            picked = rows[image, :, c if rows.shape[2] > 1 else 0]

            def suppresses(k: int, i: int, order: list[Any] = order,
                           picked: np.ndarray = picked) -> bool:
                return iou(picked[order[k]], picked[order[i]], plus_one=plus_one) > \
                    args["iou_threshold"]

            kept = greedy_nms(list(range(len(order))), suppresses)
            found += [(column[order[k]], c, rank, int(order[k]))
                      for rank, k in enumerate(kept)]
        found.sort(key=lambda f: (-f[0], f[1], f[2]))
        found = found[:keep]
        num[image, 0] = len(found)
        for row, (score, c, _, n) in enumerate(found):
            box = rows[image, n, c if rows.shape[2] > 1 else 0]
            out_boxes[image, row] = np.clip(box, 0, 1) if args["clip"] else box
            out_scores[image, row] = score
            out_classes[image, row] = c
            out_index[image, row] = n
    if mmdeploy:
        dets = np.concatenate([out_boxes, out_scores[..., None]], -1).astype(dtype)
        return [dets, out_classes.astype(np.int32), out_index.astype(np.int32)]
    return [num, out_boxes.astype(dtype), out_scores.astype(dtype),
            out_classes.astype(dtype)]


PATTERNS = [BatchedNMS(), MMDeployBatchedNMS()]
