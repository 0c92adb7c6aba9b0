"""Multi-scale deformable attention (Deformable DETR, DINO, BEVFormer) as one gather + MatMuls.

Matches (every spelling normalizes to value, spatial_shapes, level_start_index,
sampling_locations, attention_weights):
- mmdeploy's ``MMCVMultiScaleDeformableAttention(value, value_spatial_shapes,
  value_level_start_index, sampling_locations, attention_weights; im2col_step)``
  (mmdeploy/mmcv/ops/multi_scale_deform_attn.py; mmcv itself has no symbolic) in any domain:
  output (N, Lq, M*D);
- TensorRT OSS ``MultiscaleDeformableAttnPlugin_TRT`` (plugin/multiscaleDeformableAttnPlugin:
  the same five inputs, no attributes) in any domain (``trt``, ``trt.plugins``, ``""``,
  ``com.microsoft`` as exporters borrow it): output (N, Lq, M, D);
- NVIDIA DL4AGX vad-trt's ``MultiScaleDeformableAttentionPlugin`` (the same five inputs) in
  any domain: output (N, Lq, M*D).
The output's rank comes from the spelling (3 or 4); spatial_shapes and level_start_index may
be int32 (what the TensorRT plugins take) or int64 (mmdeploy's export).

Not matched, so refused with "no pattern": DerryHub/BEVFormer_tensorrt's
``MultiScaleDeformableAttnTRT``/``TRT2`` (reference points plus pixel offsets and the
attention softmax folded in; its pixel convention was not pinned from the kernel source),
Ascend's ``npu::MultiScaleDeformableAttn`` (output layout not pinned), and ONNX Runtime's
unmerged ``com.microsoft`` proposal.

Semantics are mmcv's ``multi_scale_deform_attn_pytorch``: value (N, S, M, D) split per
level l into (H_l, W_l) maps (level l at rows sum_{j<l} H_j*W_j; spatial_shapes (L, 2) is
[H, W]); locations (N, Lq, M, L, P, 2) in [0, 1] as (x, y) sample value's level l bilinearly
like ``grid_sample(2 * loc - 1, align_corners=False, padding_mode="zeros")``, i.e. at pixel
``(loc_y * H_l - 0.5, loc_x * W_l - 0.5)`` with zeros outside (:mod:`._sampling`); the samples
are weighted by attention_weights (N, Lq, M, L, P) (or (N, Lq, M, L*P)) and summed over levels
and points.

Before -> after::

    MSDA(value, shapes, starts, loc, w)
      ->  rows  = value as (N*S*M, D): no copy of the maps (the samples are fewer)
          y, x  = loc * [H_l, W_l] - 0.5      # (N, M, L, P, Lq), per-level constants
          taps  = Gather(rows, row(n, l, m, corner y, corner x))   # (N*M*Lq, L*P*4, D)
                  (._sampling.bilinear_pixels: a corner outside is clamped in, weight 0)
          out   = MatMul(corner weights * w (.., 1, L*P*4), taps)  # (N*M*Lq, 1, D)
                  -> Transpose, Reshape (N, Lq, M*D) (or (N, Lq, M, D))

One GatherND-free gather and one MatMul for all levels and points, no GridSample (TensorRT
10.14/11.1 miscompile GridSample-based deformable attention, NVIDIA/TensorRT#4813), at every
opset and target.

Envelope: opsets 11+; value float16/32/64 (float16 computed in float32); N and Lq dynamic;
M, D, L and P static; spatial_shapes and level_start_index constant (initializers or
Constants: the common export, folded into the graph) or computed at run time (from ``Shape``
of the feature maps: read in the graph; level_start_index is then trusted to be the
cumulative H*W, as the plugins trust it). Memory:
the gathered corners are 4 * N * M * Lq * L * P * D elements.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import FLOAT_TYPES, require_shape, require_type
from decomposer.examples import Example, F, i64
from decomposer.forms import Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._sampling import bilinear_pixels, positions

_INPUTS = (In("value"), In("spatial_shapes"), In("level_start_index"),
           In("sampling_locations"), In("attention_weights"))
_INDEX_TYPES = (TensorProto.INT32, TensorProto.INT64)


def _heads_apart(args: dict[str, Any]) -> dict[str, Any]:
    return {**args, "output_rank": 4}


def _heads_joined(args: dict[str, Any]) -> dict[str, Any]:
    return {**args, "output_rank": 3}


class Facts(NamedTuple):
    elem_type: int  # of value and the output
    locations_type: int
    weights_type: int
    compute_type: int
    levels: tuple[tuple[int, int], ...] | None  # (H, W) per level; None: read at run time
    level_count: int  # L
    heads: int  # M
    channels: int | None  # D, or None: read at run time
    points: int  # P
    weights_rank: int  # 5: (N, Lq, M, L, P); 4: (N, Lq, M, L*P)
    output_rank: int  # 3: (N, Lq, M*D); 4: (N, Lq, M, D)


class MultiScaleDeformableAttention(Pattern[Facts]):
    """Arguments: ``output_rank`` (3 or 4, from the spelling)."""

    op_type = "MultiScaleDeformableAttention"
    forms = (
        Form("MMCVMultiScaleDeformableAttention", inputs=_INPUTS, convert=_heads_joined,
             extra_attributes=frozenset({"im2col_step"}),
             label="MMCVMultiScaleDeformableAttention (mmdeploy; any domain)"),
        Form("MultiscaleDeformableAttnPlugin_TRT", inputs=_INPUTS, convert=_heads_apart,
             label="MultiscaleDeformableAttnPlugin_TRT (TensorRT OSS; any domain)"),
        Form("MultiScaleDeformableAttentionPlugin", inputs=_INPUTS, convert=_heads_joined,
             label="MultiScaleDeformableAttentionPlugin (DL4AGX vad-trt; any domain)"),
    )
    examples = (
        Example(
            (
                ("v", F, ("N", 29, 2, 4)),
                ("loc", F, ("N", "Lq", 2, 2, 3, 2)),
                ("w", F, ("N", "Lq", 2, 2, 3)),
            ),
            ((F, 3),),
            domains=(("mmdeploy", 16),),
            op_type="MMCVMultiScaleDeformableAttention",
            args=("v", i64([[5, 5], [1, 4]]), i64([0, 25]), "loc", "w"),
        ),
        Example(
            (
                ("v", F, ("N", 29, 2, 4)),
                ("loc", F, ("N", "Lq", 2, 2, 3, 2)),
                ("w", F, ("N", "Lq", 2, 2, 3)),
            ),
            ((F, 4),),
            domains=(("trt", 13), ("", 11)),
            op_type="MultiscaleDeformableAttnPlugin_TRT",
            args=(
                "v",
                np.array([[5, 5], [1, 4]], np.int32),
                np.array([0, 25], np.int32),
                "loc",
                "w",
            ),
        ),
        Example(
            (
                ("v", F, ("N", 16, 1, 2)),
                ("loc", F, ("N", "Lq", 1, 1, 1, 2)),
                ("w", F, ("N", "Lq", 1, 1)),
            ),
            ((F, 3),),
            domains=(("custom_op", 17),),
            op_type="MultiScaleDeformableAttentionPlugin",
            args=("v", i64([[4, 4]]), i64([0]), "loc", "w"),
        ),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        value = node.tensor("value")
        elem_type = require_type(ctx, value, "value", FLOAT_TYPES)
        # Every spelling's value is (N, S, M, D): an unknown rank (a legacy export's Reshape
        # to computed dims) is taken at its word; M must be static somewhere, D may come at
        # run time.
        value_shape = ctx.shape(value) or (None, None, None, None)
        if len(value_shape) != 4:
            raise Reject(f"value '{value}' must be (N, S, M, D), got rank {len(value_shape)}")
        heads = _static_heads(node, ctx, value_shape)
        channels = value_shape[3] if isinstance(value_shape[3], int) else None
        count, levels = _levels(node, ctx)
        for name in ("spatial_shapes", "level_start_index"):
            elem = ctx.elem_type(node.tensor(name))
            if elem is not None and elem not in _INDEX_TYPES:
                raise Reject(f"{name} must be int32 or int64")
        locations = node.tensor("sampling_locations")
        loc_type = require_type(ctx, locations, "sampling_locations", FLOAT_TYPES)
        loc_shape = require_shape(ctx, locations, "sampling_locations",
                                  "(N, Lq, M, L, P, 2)", 6, 6)
        points = loc_shape[4]
        if not isinstance(points, int) or loc_shape[5] != 2:
            raise Reject(f"sampling_locations must be (N, Lq, M, L, P, 2) with P static, got "
                         f"{list(loc_shape)}")
        for axis, want, what in ((2, heads, "M"), (3, count, "L")):
            if isinstance(loc_shape[axis], int) and loc_shape[axis] != want:
                raise Reject(f"sampling_locations has {loc_shape[axis]} for {what}; value and "
                             f"spatial_shapes say {want}")
        weights = node.tensor("attention_weights")
        weights_type = require_type(ctx, weights, "attention_weights", FLOAT_TYPES)
        w_shape = require_shape(ctx, weights, "attention_weights",
                                "(N, Lq, M, L, P) or (N, Lq, M, L*P)", 4, 5)
        tail = [count, points] if len(w_shape) == 5 else [count * points]
        if any(isinstance(d, int) and d != t for d, t in zip(w_shape[3:], tail, strict=True)):
            raise Reject(f"attention_weights {list(w_shape)} does not match L={count} "
                         f"levels of P={points} points")
        # mixed float types (a legacy export's float64 locations) compute in the widest
        compute = TensorProto.DOUBLE if TensorProto.DOUBLE in (elem_type, loc_type,
                                                               weights_type) \
            else TensorProto.FLOAT
        return Facts(elem_type, loc_type, weights_type, compute, levels, count, heads,
                     channels, points, len(w_shape),
                     int(node.args["output_rank"]))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        build_msda(b, node, facts)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        loc = ctx.shape(node.tensor("sampling_locations"))
        batch, queries = (loc[0], loc[1]) if loc else (None, None)
        channels = facts.channels
        tail = [facts.heads * channels if channels is not None else None] \
            if facts.output_rank == 3 else [facts.heads, channels]
        return [(facts.elem_type, [batch, queries, *tail])]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        value, shapes = tensors["value"], tensors["spatial_shapes"]
        locations, weights = tensors["sampling_locations"], tensors["attention_weights"]
        assert value is not None and shapes is not None
        assert locations is not None and weights is not None
        out = msda_reference(value, shapes, locations, weights)
        if int(args["output_rank"]) == 4:
            out = out.reshape(*out.shape[:2], value.shape[2], value.shape[3])
        return [out]


def _static_heads(node: MatchedNode, ctx: MatchContext, value_shape: Sequence[Any]) -> int:
    """M, from value's, the locations' or the weights' static shape."""
    candidates = [value_shape[2]]
    for name in ("sampling_locations", "attention_weights"):
        shape = ctx.shape(node.tensor(name))
        if shape is not None and len(shape) >= 3:
            candidates.append(shape[2])
    known = {d for d in candidates if isinstance(d, int)}
    if len(known) > 1:
        raise Reject(f"value, sampling_locations and attention_weights disagree on the "
                     f"number of heads M: {sorted(known)}")
    if not known:
        raise Reject("the number of heads M must be static (value's, sampling_locations' or "
                     "attention_weights' dim 2); give them typed graph inputs or value_info")
    return known.pop()


def _levels(node: MatchedNode, ctx: MatchContext
            ) -> tuple[int, tuple[tuple[int, int], ...] | None]:
    """(L, the constant (H, W) of each level or None when they come at run time)."""
    shapes_name = node.tensor("spatial_shapes")
    shapes = ctx.constant(shapes_name)
    if shapes is None:  # run time: only L must be static
        static = ctx.shape(shapes_name)
        locations = ctx.shape(node.tensor("sampling_locations"))
        count = static[0] if static is not None and len(static) == 2 else None
        if not isinstance(count, int) and locations is not None and len(locations) == 6:
            count = locations[3]
        if static is not None and (len(static) != 2 or static[1] not in (2, None, "2")):
            raise Reject(f"spatial_shapes must be (L, 2) [H, W], got shape {list(static)}")
        if not isinstance(count, int):
            raise Reject("the number of levels L must be static (spatial_shapes' or "
                         "sampling_locations' shape)")
        return count, None
    if shapes.ndim != 2 or shapes.shape[1] != 2 or shapes.dtype.kind not in "iu":
        raise Reject(f"spatial_shapes must be (L, 2) integers [H, W], got {shapes.dtype} "
                     f"of shape {list(shapes.shape)}")
    levels = tuple((int(h), int(w)) for h, w in shapes.tolist())
    if any(h < 1 or w < 1 for h, w in levels):
        raise Reject(f"every level needs H, W >= 1, got {[list(x) for x in levels]}")
    starts = ctx.constant(node.tensor("level_start_index"))
    expected = np.cumsum([0] + [h * w for h, w in levels[:-1]])
    if starts is not None and (starts.shape != (len(levels),)
                               or not np.array_equal(starts, expected)):
        raise Reject(f"level_start_index {starts.tolist()} does not match spatial_shapes "
                     f"(expected {expected.tolist()})")
    return len(levels), levels


# -- the decomposition --------------------------------------------------------------------


def build_msda(b: Builder, node: MatchedNode, facts: Facts) -> None:
    dtype = numpy_dtype(facts.compute_type)
    narrow = facts.elem_type != facts.compute_type
    heads, channels, points = facts.heads, facts.channels, facts.points
    count = facts.level_count

    def computed(name: str, hint: str, elem_type: int) -> Value:
        value = b.input(node.tensor(name), numpy_dtype(elem_type))
        return b.Cast(value, dtype, hint=f"{hint}_compute") \
            if elem_type != facts.compute_type else value

    value = computed("value", "value", facts.elem_type)
    batch = b.Shape(value, 0, 1, hint="batch")
    # value as gather rows of D channels: row ((n * S + pixel) * M + m), pixel = the level's
    # start + y * W_l + x. No copy of the maps: the samples are far fewer than the pixels.
    # D: static, or (1,) read from value's Shape (a legacy export that lost value's shape)
    depth: int | Value = channels if channels is not None else \
        b.Shape(value, 3, 4, hint="channels")
    rows = b.Reshape(value, [-1, channels] if channels is not None else
                     b.Concat(np.asarray([-1], np.int64), depth, axis=0, hint="rows_shape"),
                     hint="value_rows")

    def per_level(values: Sequence[float], kind: Any) -> np.ndarray:
        return np.asarray(values, kind).reshape(1, 1, count, 1, 1)

    sizes_h: Value | np.ndarray
    sizes_w: Value | np.ndarray
    level_rows: Value | np.ndarray
    image_rows: Value | np.ndarray
    heads_i = np.asarray(heads, np.int64)
    if facts.levels is not None:  # constants: folded into the graph
        starts = [sum(h * w for h, w in facts.levels[:level]) for level in range(count)]
        sizes_h = per_level([h for h, _ in facts.levels], dtype)
        sizes_w = per_level([w for _, w in facts.levels], dtype)
        level_rows = per_level([start * heads for start in starts], np.int64)
        image_rows = np.asarray(sum(h * w for h, w in facts.levels) * heads, np.int64)
    else:  # read at run time: (L, 2) [H, W] and (L,) starts, as (1, 1, L, 1, 1) each
        grid = [1, 1, count, 1, 1]
        shapes_f = b.Cast(b.input(node.tensor("spatial_shapes")), dtype, hint="shapes_f")
        sizes_h = b.Reshape(b.Gather(shapes_f, 0, axis=1, hint="heights"), grid,
                            hint="level_heights")
        sizes_w = b.Reshape(b.Gather(shapes_f, 1, axis=1, hint="widths"), grid,
                            hint="level_widths")
        level_rows = b.Reshape(b.Cast(b.input(node.tensor("level_start_index")), np.int64,
                                      hint="starts_i64"), grid, hint="level_starts") * heads_i
        image_rows = b.Gather(b.Shape(value, 1, 2, hint="pixels"), 0, axis=0,
                              hint="pixel_count") * heads_i

    # Points as (N, M, L, P, Lq): the point math broadcasts over whole rows of queries.
    locations = computed("sampling_locations", "locations",
                         facts.locations_type)  # (N, Lq, M, L, P, 2)
    queries = b.Shape(locations, 1, 2, hint="queries")
    # x and y by strided Slices of a 4-D view (onnx2tf's flatbuffer_direct lowers a 6-D
    # Split to a SLICE that LiteRT runs up to 5-D only)
    flat = b.Reshape(locations, b.Concat(batch, queries, np.asarray([heads, count * points * 2],
                                                                    np.int64),
                                         axis=0, hint="loc_flat_shape"), hint="loc_flat")
    points_shape = b.Concat(batch, queries, np.asarray([heads, count, points], np.int64),
                            axis=0, hint="loc_points_shape")
    loc_x, loc_y = (b.Transpose(b.Reshape(b.Slice(flat, [start], [2**62], [3], [2],
                                                  hint=f"loc_{name}_flat"),
                                          points_shape, hint=f"loc_{name}_points"),
                                [0, 2, 3, 4, 1], hint=f"loc_{name}")
                    for start, name in ((0, "x"), (1, "y")))
    y = loc_y * sizes_h - 0.5  # align_corners=False: grid_sample's pixel of 2*loc - 1
    x = loc_x * sizes_w - 0.5
    weights = computed("attention_weights", "weights", facts.weights_type)
    if facts.weights_rank == 4:  # (N, Lq, M, L*P)
        weights = b.Reshape(weights, [0, 0, heads, count, points], hint="weights_levels")
    weights = b.Transpose(weights, [0, 2, 3, 4, 1], hint="weights_points")  # (N, M, L, P, Lq)
    image_index = positions(b, batch, 0, np.dtype(np.int64), hint="batch_index")  # (N,)
    base = b.Unsqueeze(image_index, [1, 2, 3, 4], hint="image_row") * image_rows \
        + level_rows \
        + np.arange(heads, dtype=np.int64).reshape(1, heads, 1, 1, 1)
    sampled = bilinear_pixels(b, rows, y, x, base, sizes_h, sizes_w, heads, depth,
                              weights, [batch, np.asarray([heads], np.int64), queries],
                              hint="sample", perm=[0, 1, 4, 2, 3],
                              summed=count * points)  # (N, M, Lq, D)
    final = None if narrow else node.outputs[0]
    joined = b.Transpose(sampled, [0, 2, 1, 3], hint="heads_last",
                         out=final if facts.output_rank == 4 else None)  # (N, Lq, M, D)
    if facts.output_rank == 3:
        joined = b.Reshape(joined, b.Concat(batch, queries,
                                            np.asarray([heads * channels if channels
                                                        else -1], np.int64), axis=0,
                                            hint="out_shape"), hint="heads_joined", out=final)
    if narrow:
        b.Cast(joined, facts.elem_type, out=node.outputs[0])


# -- numpy reference ----------------------------------------------------------------------


def msda_reference(value: np.ndarray, spatial_shapes: np.ndarray, locations: np.ndarray,
                   weights: np.ndarray) -> np.ndarray:
    """mmcv's multi_scale_deform_attn_pytorch in float64, rounded to value's dtype:
    (N, Lq, M*D). Bilinear zeros padding at pixel (loc * size - 0.5), written directly."""
    n_batch, _, heads, channels = value.shape
    _, queries, _, count, points, _ = locations.shape
    weights = weights.reshape(n_batch, queries, heads, count, points).astype(np.float64)
    out = np.zeros((n_batch, queries, heads, channels), np.float64)
    start = 0
    for level, (height, width) in enumerate(np.asarray(spatial_shapes).tolist()):
        maps = value[:, start:start + height * width].astype(np.float64)
        maps = maps.reshape(n_batch, height, width, heads, channels)
        start += height * width
        y = locations[:, :, :, level, :, 1].astype(np.float64) * height - 0.5  # (N,Lq,M,P)
        x = locations[:, :, :, level, :, 0].astype(np.float64) * width - 0.5
        y0, x0 = np.floor(y), np.floor(x)
        for dy in (0, 1):
            for dx in (0, 1):
                ty, tx = y0 + dy, x0 + dx
                wy = 1 - np.abs(y - ty)
                wx = 1 - np.abs(x - tx)
                inside = (ty >= 0) & (ty < height) & (tx >= 0) & (tx < width)
                iy = np.clip(np.nan_to_num(ty), 0, height - 1).astype(np.int64)
                ix = np.clip(np.nan_to_num(tx), 0, width - 1).astype(np.int64)
                n_idx = np.arange(n_batch)[:, None, None, None]
                m_idx = np.arange(heads)[None, None, :, None]
                picked = maps[n_idx, iy, ix, m_idx]  # (N, Lq, M, P, D)
                factor = np.where(inside, wy * wx, 0.0) * weights[:, :, :, level]
                out += np.einsum("nqmp,nqmpd->nqmd", factor, np.where(
                    inside[..., None], picked, 0.0))
    return out.reshape(n_batch, queries, heads * channels).astype(value.dtype)


PATTERNS = [MultiScaleDeformableAttention()]
