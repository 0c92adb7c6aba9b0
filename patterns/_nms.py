"""Shared non-maximum suppression: a detection plugin's NMS as ONNX ``NonMaxSuppression``, and
its fixed-size, score-sorted, padded result.

In: float32 candidate ``scores`` (B, N, C) in which every candidate the plugin drops before
NMS (below its threshold, the background class, past its top-k) holds :data:`DROPPED`;
float32 corner ``boxes`` (B, N, 4) shared by the classes or (B, N, C, 4) one per class;
the NMS settings (per class or across classes, IoU threshold, the most a class may keep).
Out: :func:`suppress` gives the survivors as a dense (B, L) score table (``DROPPED``
elsewhere) laid out anchor-major (``n * C + c``) or class-major (``c * N + n``), the order
the plugin breaks score ties in; :func:`take_top` turns that into the plugin's fixed
``keep`` rows per image: scores descending, ties to the lower table position, and each row's
anchor and class (0 past the image's detection count, which :func:`take_top` also gives).

Why this shape: ``NonMaxSuppression``'s output has a data-dependent length, which no output
of these plugins has. Scattering the survivors into a table of known shape and taking one
``TopK`` of a constant ``keep`` keeps every later tensor shaped by the inputs, no gather
of a data-dependent length and no Loop: the form every engine's importer takes. The score
and IoU comparisons are ``NonMaxSuppression``'s: keep a score strictly above the threshold,
suppress an IoU strictly above it (ONNX Runtime's and OpenVINO's kernels; a plugin that
compares with ``>=`` passes :func:`below`). Equal scores: ONNX Runtime and OpenVINO visit
the lower box index first (measured); the per-class and class-agnostic layouts below keep
the plugin's candidate order in that index.

``greedy_nms`` is the numpy twin: the textbook greedy loop, written from the definition,
not from the graph.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from decomposer.builder import Builder, Value

from ._sampling import positions

# What a dropped candidate's score becomes: the lowest finite float32. A candidate keeps a
# score strictly above a finite threshold, so no surviving score equals it.
DROPPED = float(np.finfo(np.float32).min)


def below(threshold: float) -> float:
    """The float32 just below ``threshold``: ``x > below(t)`` is ``x >= t`` for float32 x."""
    return float(np.nextafter(np.float32(threshold), np.float32(-np.inf)))


def select_candidates(b: Builder, scores: Value, threshold: float, background: int,
                      classes: int) -> Value:
    """``scores`` (B, N, C) float32 with those not above ``threshold`` and those of the
    ``background`` class (when it is one of the C) set to DROPPED."""
    kept = b.Where(b.Greater(scores, np.array(threshold, np.float32), hint="passes"),
                   scores, np.array(DROPPED, np.float32), hint="candidates")
    if 0 <= background < classes:
        foreground = np.ones((1, 1, classes), bool)
        foreground[..., background] = False
        kept = b.Where(foreground, kept, np.array(DROPPED, np.float32), hint="foreground")
    return kept


def keep_top(b: Builder, scores: Value, k: int, size: int | None, rank: int, hint: str
             ) -> Value:
    """``scores`` (..., L) of ``rank`` with all but the ``k`` highest of each last-axis row
    set to ``DROPPED`` (ties to the lower position); unchanged when the rows are statically
    no longer than ``k``. Rows of unknown length get ``k`` dropped columns first, so that
    ``TopK``'s k is a constant (TVM takes no other) and never exceeds the row."""
    if size is not None and size <= k:
        return scores
    last = rank - 1
    leading = b.Shape(scores, 0, last, hint=f"{hint}_rows")
    padded = scores
    if size is None:
        filler = b.ConstantOfShape(b.Concat(leading, np.array([k], np.int64), axis=0,
                                            hint=f"{hint}_filler_shape"), DROPPED,
                                   hint=f"{hint}_filler")
        padded = b.Concat(scores, filler, axis=last, hint=f"{hint}_padded")
    # Only the kept set matters (it is scattered back in place), and ONNX's TopK breaks
    # ties by the lower index whether or not it sorts: for ONNX Runtime (--target ort) it
    # selects without sorting, 4.2 ms instead of 7.8 ms for 80 rows of 8400, k 1000
    # (measured; the same sets on rows full of ties). TVM's importer refuses sorted=0.
    values, columns = b.TopK(padded, k, axis=last, sorted=b.target != "ort",
                             hint=f"{hint}_top")
    dropped = b.ConstantOfShape(b.Shape(padded, hint=f"{hint}_padded_shape"), DROPPED,
                                hint=f"{hint}_dropped")
    # ScatterND, not ScatterElements: onnx2torch 1.5 converts only the former. A cell is
    # (row index along each leading axis..., column).
    cell_shape = b.Concat(leading, np.array([k, 1], np.int64), axis=0,
                          hint=f"{hint}_cells_shape")
    ids = [positions(b, cell_shape, axis, np.dtype(np.int64), hint=f"{hint}_ids{axis}")
           for axis in range(last)]
    cells = b.Concat(*ids, b.Unsqueeze(columns, [rank], hint=f"{hint}_columns"), axis=rank,
                     hint=f"{hint}_cells")
    kept = b.ScatterND(dropped, cells, values, hint=f"{hint}_scattered")
    if size is None:
        return b.Slice(kept, [0], b.Shape(scores, last, rank, hint=f"{hint}_length"), [last],
                       hint=hint)
    return kept


class Survivors(NamedTuple):
    table: Value  # (B, L) float32: the surviving scores, DROPPED elsewhere
    classes: int
    class_major: bool  # the table's layout: c * N + n (True) or n * C + c


def suppress(b: Builder, boxes: Value, scores: Value, *, classes: int, per_class_boxes: bool,
             class_agnostic: bool, iou_threshold: float, score_threshold: float,
             most_per_class: int, class_major: bool) -> Survivors:
    """Greedy NMS of ``scores`` (B, N, C) over ``boxes`` (see the module docstring).

    Per class with shared boxes: one ``NonMaxSuppression`` of (B, N, 4) boxes and (B, C, N)
    scores. Per class with a box per class: the classes move into the batch, (B * C, N, 4)
    and (B * C, 1, N). Across classes (``class_agnostic``): each (anchor, class) candidate is
    one box of one class, (B, N * C, 4) and (B, 1, N * C), anchor-major, so the
    lower-index-first visit order of equal scores is the anchor-major order.
    """
    batch = b.Shape(scores, 0, 1, hint="batch")
    anchors = b.Shape(scores, 1, 2, hint="anchors")
    if class_agnostic:
        if not per_class_boxes:  # every class of an anchor shares its box
            full = b.Concat(batch, anchors, np.array([classes, 4], np.int64), axis=0,
                            hint="candidate_boxes_shape")
            boxes = b.Expand(b.Unsqueeze(boxes, [2], hint="box_per_class"), full,
                             hint="candidate_boxes_4d")
        flat_boxes = b.Reshape(boxes, b.Concat(batch, np.array([-1, 4], np.int64), axis=0,
                                               hint="candidate_boxes_target"),
                               hint="candidate_boxes")
        flat_scores = b.Reshape(scores, b.Concat(batch, np.array([1, -1], np.int64), axis=0,
                                                 hint="candidate_scores_target"),
                                hint="candidate_scores")
        selected = b.NonMaxSuppression(flat_boxes, flat_scores, most_per_class, iou_threshold,
                                       score_threshold)
        image = b.Gather(selected, [0], axis=1, hint="selected_image")
        candidate = b.Gather(selected, [2], axis=1, hint="selected_candidate")
        table = b.Reshape(scores, b.Concat(batch, np.array([-1], np.int64), axis=0,
                                           hint="table_target"), hint="anchor_major_scores")
        if class_major:
            raise ValueError("a class-agnostic table is anchor-major")
        position = candidate
    else:
        by_class = b.Transpose(scores, [0, 2, 1], hint="scores_by_class")  # (B, C, N)
        if per_class_boxes:
            boxes = b.Reshape(b.Transpose(boxes, [0, 2, 1, 3], hint="boxes_by_class"),
                              b.Concat(np.array([-1], np.int64), anchors,
                                       np.array([4], np.int64), axis=0,
                                       hint="class_batch_boxes_target"),
                              hint="class_batch_boxes")
            nms_scores = b.Reshape(by_class, b.Concat(np.array([-1, 1], np.int64), anchors,
                                                      axis=0, hint="class_batch_scores_target"),
                                   hint="class_batch_scores")
        else:
            nms_scores = by_class
        selected = b.NonMaxSuppression(boxes, nms_scores, most_per_class, iou_threshold,
                                       score_threshold)
        if per_class_boxes:  # row (b * C + c, 0, n)
            image_class = b.Gather(selected, [0], axis=1, hint="selected_image_class")
            image = b.Div(image_class, np.array(classes, np.int64), hint="selected_image")
            klass = b.Mod(image_class, np.array(classes, np.int64), hint="selected_class")
        else:
            image = b.Gather(selected, [0], axis=1, hint="selected_image")
            klass = b.Gather(selected, [1], axis=1, hint="selected_class")
        anchor = b.Gather(selected, [2], axis=1, hint="selected_anchor")
        if class_major:
            table = b.Reshape(by_class, b.Concat(batch, np.array([-1], np.int64), axis=0,
                                                 hint="table_target"),
                              hint="class_major_scores")
            position = b.Add(b.Mul(klass, anchors, hint="class_offset"), anchor,
                             hint="selected_position")
        else:
            table = b.Reshape(scores, b.Concat(batch, np.array([-1], np.int64), axis=0,
                                               hint="table_target"),
                              hint="anchor_major_scores")
            position = b.Add(b.Mul(anchor, np.array(classes, np.int64), hint="anchor_offset"),
                             klass, hint="selected_position")
    where = b.Concat(image, position, axis=1, hint="selected_cells")  # (K, 2)
    kept = b.GatherND(table, where, hint="selected_scores")
    dropped = b.ConstantOfShape(b.Shape(table, hint="table_shape"), DROPPED,
                                hint="dropped_table")
    return Survivors(b.ScatterND(dropped, where, kept, hint="survivor_table"), classes,
                     class_major)


class Top(NamedTuple):
    scores: Value  # (B, keep) float32, 0 in padding rows
    anchor: Value  # (B, keep) int64, 0 in padding rows
    klass: Value  # (B, keep) int64, 0 in padding rows
    valid: Value  # (B, keep) bool
    detections: Value  # (B, 1) int64


def take_top(b: Builder, survivors: Survivors, keep: int) -> Top:
    """The ``keep`` best survivors of each image, best first (ties: the lower table
    position), with padding rows past each image's count."""
    table = survivors.table
    padding = b.ConstantOfShape(b.Concat(b.Shape(table, 0, 1, hint="batch"),
                                         np.array([keep], np.int64), axis=0,
                                         hint="padding_shape"), DROPPED, hint="padding")
    padded = b.Concat(table, padding, axis=1, hint="padded_table")  # keep >= any count
    values, positions = b.TopK(padded, keep, axis=1, hint="best")
    valid = b.Greater(values, np.array(DROPPED, np.float32), hint="valid")
    position = b.Where(valid, positions, np.array(0, np.int64), hint="position")
    if survivors.class_major:
        anchors = b.Gather(b.Shape(table, hint="table_shape"), [1], hint="table_width")
        anchors = b.Div(anchors, np.array([survivors.classes], np.int64), hint="anchor_count")
        # N = 0 leaves only padding rows (position 0); divide by 1 there, not by 0.
        anchors = b.Max(anchors, np.array([1], np.int64), hint="anchor_divisor")
        klass = b.Div(position, anchors, hint="best_class")
        anchor = b.Mod(position, anchors, hint="best_anchor")
    else:
        classes = np.array(survivors.classes, np.int64)
        anchor = b.Div(position, classes, hint="best_anchor")
        klass = b.Mod(position, classes, hint="best_class")
    scores = b.Where(valid, values, np.array(0, np.float32), hint="best_scores")
    detections = b.ReduceSum(b.Cast(valid, np.int64, hint="valid_count"), [1],
                             keepdims=True, hint="detections")
    return Top(scores, anchor, klass, valid, detections)


def gather_rows(b: Builder, rows: Value, index: Value, valid: Value, hint: str,
                out: str | None = None) -> Value:
    """``rows`` (B, M, 4) at ``index`` (B, K) along axis 1, zeros where ``valid`` is false:
    one gather from the rows behind a zero row (also right when M is 0)."""
    padded = b.Pad(rows, [0, 1, 0, 0, 0, 0], 0, hint=f"{hint}_zero_row")
    shifted = b.Where(valid, b.Add(index, np.array(1, np.int64), hint=f"{hint}_past_zero"),
                      np.array(0, np.int64), hint=f"{hint}_row")
    target = b.Concat(b.Shape(index, hint=f"{hint}_index_shape"), np.array([4], np.int64),
                      axis=0, hint=f"{hint}_shape")
    spread = b.Expand(b.Unsqueeze(shifted, [2], hint=f"{hint}_index"), target,
                      hint=f"{hint}_indices")
    return b.GatherElements(padded, spread, axis=1, hint=hint, out=out)


# -- numpy twin ---------------------------------------------------------------------------

def iou(a: np.ndarray, c: np.ndarray, plus_one: bool = False, reorder: bool = True) -> float:
    """Intersection over union of two corner boxes in float32 (``plus_one``: pixel-inclusive
    widths, Caffe's rule; ``reorder``: corners given in either order)."""
    a, c = a.astype(np.float32), c.astype(np.float32)
    if reorder:
        a = np.concatenate([np.minimum(a[:2], a[2:]), np.maximum(a[:2], a[2:])])
        c = np.concatenate([np.minimum(c[:2], c[2:]), np.maximum(c[:2], c[2:])])
    one = np.float32(1 if plus_one else 0)
    width = np.float32(min(a[2], c[2]) - max(a[0], c[0]) + one)
    height = np.float32(min(a[3], c[3]) - max(a[1], c[1]) + one)
    if width <= 0 or height <= 0:
        return 0.0
    inter = np.float32(width * height)
    area_a = np.float32((a[2] - a[0] + one) * (a[3] - a[1] + one))
    area_c = np.float32((c[2] - c[0] + one) * (c[3] - c[1] + one))
    if area_a <= 0 or area_c <= 0:
        return 0.0
    return float(np.float32(inter / np.float32(area_a + area_c - inter)))


def greedy_nms(order: list[int], suppresses: Any, limit: int | None = None) -> list[int]:
    """Visit candidates in ``order`` (best first); keep one unless ``suppresses(kept,
    candidate)`` holds for an earlier kept one; stop after ``limit`` kept."""
    kept: list[int] = []
    for candidate in order:
        if limit is not None and len(kept) >= limit:
            break
        if not any(suppresses(k, candidate) for k in kept):
            kept.append(candidate)
    return kept
