"""TensorRT's ``EfficientNMS_TRT`` (the NMS YOLO exports end in) as ONNX NonMaxSuppression,
TopK and gathers.

Matches ``EfficientNMS_TRT(boxes, scores[, anchors])`` in any domain (YOLO exporters write
``TRT::``; TensorRT's ONNX parser reads only the op type) with four outputs and the plugin's
attributes: ``score_threshold`` (0.5), ``iou_threshold`` (0.5), ``max_output_boxes`` (100),
``background_class`` (-1: none), ``score_activation`` (0), ``class_agnostic`` (0),
``box_coding`` (0); ``plugin_version`` / ``plugin_namespace`` are the parser's and ignored.
An int attribute may be a one-element list (yolov7's exporter writes ``background_class``
and ``box_coding`` as tuples; TensorRT reads element 0).

Semantics, read from TensorRT OSS ``plugin/efficientNMSPlugin`` (README.md,
efficientNMSPlugin.cpp, efficientNMSInference.cu/.cuh) and checked against the plugin's own
golden data (``EfficientNMSPlugin_PluginGoldenIO.json``, in tests/test_efficient_nms.py):
- boxes (B, N, 4), (B, N, 1, 4) (shared by the classes) or (B, N, C, 4); scores (B, N, C)
  or (B, N, C, 1); anchors (1 or B, N, 4); float32 or float16.
- A candidate is an (anchor, class) pair with ``score >= score_threshold``, not of the
  background class. With ``score_activation`` the raw score is compared with
  ``log(t / (1 - t))`` (-32768 for t <= 0) and the outputs are ``sigmoid(raw)``.
- Only the best 5000 candidates of an image (all classes together) enter NMS (the plugin's
  cap on most devices; the README's 4096 was TensorRT 8.0-8.1's).
- Greedy NMS in score order: a candidate is suppressed by a kept one of the same class (any
  class with ``class_agnostic``) when their IoU is ``>= iou_threshold``. IoU has no +1 and
  takes the corners in either order.
- ``box_coding`` 1 means (x, y, w, h) centres: corners ``(x - w/2, y - h/2, x + w/2,
  y + h/2)``. With anchors, coding 1 decodes ``(p0 * a2 + a0, p1 * a3 + a1, a2 * exp(p2),
  a3 * exp(p3))`` and coding 0 adds the anchor to the corner-sorted box (no variances).
- Outputs: ``num_detections`` int32 (B, 1); ``detection_boxes`` (B, M, 4) (the input box
  for coding 0 without anchors, else the decoded corners), ``detection_scores`` (B, M),
  ``detection_classes`` int32 (B, M), M = ``max_output_boxes``, best score first; rows past
  the count are zeros (the plugin clears its outputs).

Ties: the plugin sorts candidates with a stable radix sort of an order that depends on
thread timing, so it defines no order for equal scores; here equal scores go to the lower
anchor, then the lower class (anchor-major), the order the plugin's dense path
(thresholds below 0.007) gives.

Not matched to the plugin, documented: (1) thresholds below 0.007 send the plugin down a
dense path that seems (from the source, not run on a GPU) to keep below-threshold
candidates with a score of -32768 and let them fill empty rows; here they are dropped as the
README says. (2) The plugin's sigmoid uses the fast ``__expf``: output scores may differ in
the last bits. (3) float16 inputs are compared in float32 here.
``EfficientNMS_ONNX_TRT`` (removed in TensorRT 10.16) is not matched: its padding repeats
the last valid row and rows of different images interleave in an order that depends on
thread timing.

Before -> after::

    scores' = score >= t and class != background ? score : lowest   # (B, N, C)
    scores' = all but the 5000 best of each image -> lowest          # N * C > 5000 only
    kept    = NonMaxSuppression(corner boxes, scores' (B, C, N), M, below(iou), lowest)
    table   = ScatterND(lowest (B, N * C), kept cells, kept scores)
    scores, cell = TopK(Concat(table, lowest (B, M)), M)             # ._nms.take_top
    boxes   = GatherElements(boxes, anchor of cell), zeros past the count

Envelope: opsets 11+; the class count C static; B and N dynamic.
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
    below,
    gather_rows,
    greedy_nms,
    iou,
    keep_top,
    select_candidates,
    suppress,
    take_top,
)

CANDIDATE_CAP = 5000  # efficientNMSPlugin.cpp initialize(): numSelectedBoxes on most devices
_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16)


def _one(value: Any) -> int:
    """An int attribute TensorRT reads as element 0 of what the exporter wrote."""
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(values) != 1:
        raise Reject(f"expected one value, got {values}")
    return int(values[0])


def _flag(default: int) -> Attr:
    return Attr("int_or_ints", default=default, normalize=_one, choices=(0, 1))


ATTRIBUTES = {
    "score_threshold": Attr("float", default=0.5),
    "iou_threshold": Attr("float", default=0.5),
    "max_output_boxes": Attr("int_or_ints", default=100, normalize=_one),
    "background_class": Attr("int_or_ints", default=-1, normalize=_one),
    "score_activation": _flag(0),
    "class_agnostic": _flag(0),
    "box_coding": _flag(0),
}


class Facts(NamedTuple):
    elem_type: int
    classes: int
    per_class_boxes: bool
    box_rank: int  # 3 or 4 (a (B, N, 1, 4) box input is squeezed)
    score_rank: int  # 3 or 4 ((B, N, C, 1))
    anchors: int  # 0: none, else the anchors' batch (1 or B)
    pairs: int | None  # N * C candidates per image, when N is static


def score_cut(args: dict[str, Any], elem_type: int) -> float:
    """The value a raw score must reach (``>=``): the threshold, or its logit with
    ``score_activation``, rounded to the scores' type as the plugin does."""
    threshold = float(args["score_threshold"])
    if args["score_activation"]:
        threshold = float(np.log(np.float32(threshold) / (np.float32(1) - np.float32(
            threshold)))) if threshold > 0 else -32768.0
    dtype = np.float16 if elem_type == TensorProto.FLOAT16 else np.float32
    return float(dtype(threshold))


class EfficientNMS(Pattern[Facts]):
    op_type = "EfficientNMS_TRT"
    forms = (Form("EfficientNMS_TRT", inputs=(In("boxes"), In("scores"),
                                              In("anchors", optional=True)),
                  attributes=ATTRIBUTES, outputs=4,
                  extra_attributes=frozenset({"plugin_version", "plugin_namespace"})),)
    examples = (
        Example((("boxes", F, ("B", "N", 4)), ("scores", F, ("B", "N", 3))),
                ((I32, 2), (F, 3), (F, 2), (I32, 2)),
                attrs={"score_threshold": 0.25, "iou_threshold": 0.45, "max_output_boxes": 10,
                       "background_class": [-1], "score_activation": 0, "box_coding": [0],
                       "plugin_version": "1"},
                domains=(("TRT", 13),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        args = node.args
        if args["score_threshold"] < 0 or not np.isfinite(args["score_threshold"]):
            raise Reject("score_threshold must be finite and >= 0 (the plugin's check)")
        if not 0 < args["iou_threshold"] <= 1:
            raise Reject("iou_threshold must be in (0, 1] (the plugin's check)")
        if args["max_output_boxes"] <= 0:
            raise Reject("max_output_boxes must be > 0 (the plugin's check)")
        elem_type = require_type(ctx, node.tensor("scores"), "scores", _TYPES)
        require_type(ctx, node.tensor("boxes"), "boxes", (elem_type,))
        scores = require_shape(ctx, node.tensor("scores"), "scores", "to find the classes",
                               min_rank=3, max_rank=4)
        classes = scores[2]
        if not isinstance(classes, int) or classes < 1:
            raise Reject("the class count (scores dim 2) must be static")
        if len(scores) == 4 and scores[3] != 1:
            raise Reject("4-D scores must be (B, N, C, 1)")
        boxes = require_shape(ctx, node.tensor("boxes"), "boxes", "to read the box layout",
                              min_rank=3, max_rank=4)
        if boxes[-1] != 4 and isinstance(boxes[-1], int):
            raise Reject(f"boxes must end in 4 coordinates, got {boxes[-1]}")
        per_class = len(boxes) == 4 and boxes[2] != 1
        if per_class and boxes[2] != classes:
            raise Reject(f"per-class boxes have {boxes[2]} classes, scores {classes}")
        anchors = 0
        if node.tensor("anchors"):
            require_type(ctx, node.tensor("anchors"), "anchors", (elem_type,))
            shape = require_shape(ctx, node.tensor("anchors"), "anchors", "(1 or B, N, 4)",
                                  min_rank=3, max_rank=3)
            if shape[2] != 4 and isinstance(shape[2], int):
                raise Reject("anchors must be (1 or B, N, 4)")
            anchors = 1 if shape[0] == 1 else 2
        pairs = scores[1] * classes if isinstance(scores[1], int) else None
        return Facts(elem_type, classes, per_class, len(boxes), len(scores), anchors, pairs)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        args = node.args
        original = numpy_dtype(facts.elem_type)
        narrow = facts.elem_type != TensorProto.FLOAT
        f32 = np.dtype(np.float32)

        def read(name: str) -> Value:
            value = b.input(node.tensor(name), original)
            return b.Cast(value, f32, hint=f"{name}_f32") if narrow else value

        scores = read("scores")
        if facts.score_rank == 4:
            scores = b.Squeeze(scores, [3], hint="scores_3d")
        raw_boxes = b.input(node.tensor("boxes"), original)
        if facts.box_rank == 4 and not facts.per_class_boxes:
            raw_boxes = b.Squeeze(raw_boxes, [2], hint="boxes_3d")
        boxes = b.Cast(raw_boxes, f32, hint="boxes_f32") if narrow else raw_boxes
        corners, decoded = _decode(b, boxes, read("anchors") if facts.anchors else None,
                                   bool(args["box_coding"]), facts.per_class_boxes)
        candidates = select_candidates(b, scores, below(score_cut(args, facts.elem_type)),
                                       int(args["background_class"]), facts.classes)
        flat = b.Reshape(candidates, b.Concat(b.Shape(scores, 0, 1, hint="batch"),
                                              np.array([-1], np.int64), axis=0,
                                              hint="flat_target"), hint="flat_candidates")
        capped = keep_top(b, flat, CANDIDATE_CAP, facts.pairs, 2, hint="capped")
        if capped != flat:
            candidates = b.Reshape(capped, b.Shape(scores, hint="scores_shape"),
                                   hint="capped_candidates")
        limit = int(args["max_output_boxes"])
        survivors = suppress(b, corners, candidates, classes=facts.classes,
                             per_class_boxes=facts.per_class_boxes,
                             class_agnostic=bool(args["class_agnostic"]),
                             iou_threshold=below(float(args["iou_threshold"])),
                             score_threshold=DROPPED, most_per_class=limit, class_major=False)
        top = take_top(b, survivors, limit)
        out_count, out_boxes, out_scores, out_classes = node.outputs
        if out_count:
            b.Cast(top.detections, np.int32, out=out_count)
        if out_boxes:
            rows = decoded if decoded is not None else raw_boxes
            index = top.anchor
            if facts.per_class_boxes:
                rows = b.Reshape(rows, b.Concat(b.Shape(scores, 0, 1, hint="batch"),
                                                np.array([-1, 4], np.int64), axis=0,
                                                hint="box_rows_target"), hint="box_rows")
                index = b.Add(b.Mul(top.anchor, np.array(facts.classes, np.int64),
                                    hint="box_row_base"), top.klass, hint="box_row")
            cast = decoded is not None and narrow
            picked = gather_rows(b, rows, index, top.valid, hint="picked_boxes",
                                 out=None if cast else out_boxes)
            if cast:
                b.Cast(picked, original, out=out_boxes)
        if out_scores:
            values = top.scores
            if args["score_activation"]:
                values = b.Where(top.valid, b.Sigmoid(values, hint="probability"),
                                 np.array(0, np.float32), hint="probability_or_zero",
                                 out=None if narrow else out_scores)
            if narrow:
                b.Cast(values, original, out=out_scores)
            elif values != out_scores:
                b.Identity(values, out=out_scores)
        if out_classes:
            b.Cast(top.klass, np.int32, out=out_classes)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        shape = ctx.shape(node.tensor("scores"))
        batch = shape[0] if shape else None
        limit = int(node.args["max_output_boxes"])
        return [(TensorProto.INT32, [batch, 1]), (facts.elem_type, [batch, limit, 4]),
                (facts.elem_type, [batch, limit]), (TensorProto.INT32, [batch, limit])]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        boxes, scores = tensors["boxes"], tensors["scores"]
        assert boxes is not None and scores is not None
        return efficient_nms_reference(boxes, scores, tensors.get("anchors"), args)


def _decode(b: Builder, boxes: Value, anchors: Value | None, centre_size: bool,
            per_class: bool) -> tuple[Value, Value | None]:
    """(corner boxes for the IoU, the output boxes or None when they are the input's)."""
    axis = 3 if per_class else 2
    first, second = b.Split(boxes, 2, axis, hint="box_pairs")
    if anchors is not None:
        if per_class:
            anchors = b.Unsqueeze(anchors, [2], hint="anchors_per_class")
        origin, size = b.Split(anchors, 2, axis, hint="anchor_pairs")
        if centre_size:  # (p0 * a2 + a0, p1 * a3 + a1, a2 * exp(p2), a3 * exp(p3))
            first = b.Add(b.Mul(first, size, hint="scaled_offset"), origin, hint="centre")
            second = b.Mul(size, b.Exp(second, hint="growth"), hint="size")
        else:  # the corner-sorted box plus the anchor, elementwise
            low, high = b.Min(first, second, hint="low"), b.Max(first, second, hint="high")
            first = b.Add(low, origin, hint="low_decoded")
            second = b.Add(high, size, hint="high_decoded")
    if centre_size:
        half = b.Mul(second, np.array(0.5, np.float32), hint="half_size")
        first, second = b.Sub(first, half, hint="corner_low"), b.Add(first, half,
                                                                      hint="corner_high")
    if anchors is None and not centre_size:
        return boxes, None
    corners = b.Concat(first, second, axis=axis, hint="corners")
    return corners, corners


# -- numpy reference: the plugin's algorithm, from its documentation and source ----------

def efficient_nms_reference(boxes: np.ndarray, scores: np.ndarray,
                            anchors: np.ndarray | None, args: dict[str, Any]
                            ) -> list[np.ndarray]:
    dtype = scores.dtype
    scores32 = scores.astype(np.float32).reshape(scores.shape[:3])
    shape: tuple[int, ...] = tuple(scores32.shape)
    batch, count, classes = shape
    box_rows = boxes.astype(np.float32).reshape(
        batch, count, boxes.shape[2] if boxes.ndim == 4 else 1, 4)
    coded = np.asarray(box_rows)
    if anchors is not None:
        a = anchors.astype(np.float32)[:, :, None, :]
        a = np.broadcast_to(a, (batch, count, 1, 4))
        if args["box_coding"]:
            coded = np.concatenate([coded[..., :2] * a[..., 2:] + a[..., :2],
                                    a[..., 2:] * np.exp(coded[..., 2:])], axis=-1)
        else:
            coded = np.concatenate([np.minimum(coded[..., :2], coded[..., 2:]) + a[..., :2],
                                    np.maximum(coded[..., :2], coded[..., 2:]) + a[..., 2:]],
                                   axis=-1)
    if args["box_coding"]:
        half = coded[..., 2:] * np.float32(0.5)
        coded = np.concatenate([coded[..., :2] - half, coded[..., :2] + half], axis=-1)
    decoded = anchors is not None or bool(args["box_coding"])
    out_rows = coded if decoded else box_rows
    cut = score_cut(args, TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT)
    limit = int(args["max_output_boxes"])
    agnostic = bool(args["class_agnostic"])
    threshold = float(args["iou_threshold"])
    num = np.zeros((batch, 1), np.int32)
    out_boxes = np.zeros((batch, limit, 4), np.float32)
    out_scores = np.zeros((batch, limit), np.float32)
    out_classes = np.zeros((batch, limit), np.int32)
    for image in range(batch):
        pairs = [(n, c) for n in range(count) for c in range(classes)
                 if scores32[image, n, c] >= cut and c != args["background_class"]]
        pairs.sort(key=lambda p: -scores32[image, p[0], p[1]])  # stable: anchor-major ties
        pairs = pairs[:CANDIDATE_CAP]

        corner = coded[image]
        same_box = corner.shape[1] == 1
        chosen = [corner[n, 0 if same_box else c] for n, c in pairs]
        labels = [c for _, c in pairs]
        kept = greedy_nms(list(range(len(pairs))), lambda k, i, chosen=chosen, labels=labels: (
            (agnostic or labels[k] == labels[i]) and iou(chosen[k], chosen[i]) >= threshold),
            limit)
        num[image, 0] = len(kept)
        for row, index in enumerate(kept):
            n, c = pairs[index]
            out_boxes[image, row] = out_rows[image, n, c if out_rows.shape[2] > 1 else 0]
            raw = scores32[image, n, c]
            out_scores[image, row] = 1 / (1 + np.exp(-raw)) if args["score_activation"] \
                else raw
            out_classes[image, row] = c
    return [num, out_boxes.astype(dtype), out_scores.astype(dtype), out_classes]


PATTERNS = [EfficientNMS()]
