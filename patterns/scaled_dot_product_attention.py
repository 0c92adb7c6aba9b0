"""Scaled dot-product attention (torch F.scaled_dot_product_attention) as MatMul/Softmax/MatMul.

Matches:
- ``ScaledDotProductAttention(query, key, value[, attn_mask]; is_causal:int=0,
  scale:float=(1/sqrt(E)), dropout_p:float=0.0, enable_gqa:int=0)`` in any domain;
- torch's fallbacks ``org.pytorch.aten::scaled_dot_product_attention`` and
  ``ATen(operator="scaled_dot_product_attention")``, what the legacy exporter emits below
  opset 14: inputs ``(query, key, value, attn_mask or "", dropout_p, is_causal,
  scale or "", enable_gqa)`` with the non-tensor arguments as constants (exports from
  older torch versions without ``scale``/``enable_gqa`` are accepted too).

Semantics are torch's: query ``(*, L, E)``, key ``(*, S, E)``, value ``(*, S, Ev)``, batch
dims broadcast -> ``(*, L, Ev)``::

    scores = (query * scale) @ key^T                    # scale defaults to 1/sqrt(E)
    is_causal: scores[i, j] = -inf for j > i            # top-left aligned, as torch
    bool attn_mask: scores = -inf where the mask is False; float attn_mask: scores += mask
    out = softmax(scores, -1) @ value
    rows whose every score is masked out give 0 (torch's CPU kernels do; plain softmax
    would give NaN); NaN inputs still give NaN
    enable_gqa: key/value heads (dim -3) are repeated to the query's (repeat_interleave)

Before -> after::

    SDPA(q, k, v, mask)  ->  Mul(q, scale) -> MatMul(., Transpose(k)) -> Where/Add(mask)
                             -> Softmax(-1) -> MatMul(., v) -> Where(row fully masked, 0)

float16/bfloat16 are computed in float32 and rounded once at the end (torch's CPU kernels
accumulate in float32 too). The causal mask comes from two Ranges over the run-time L and S;
a fully-masked row is detected on the mask (small when it broadcasts), not on the scores.

The native form's ``scale`` is an ONNX float attribute (float32 precision); the ATen form's
is a double constant.

Envelope: opsets 11+; every dim dynamic; the ranks of query and key must be known.
``dropout_p`` must be a constant 0 (training-mode dropout is random and is rejected);
``is_causal``, ``scale`` and ``enable_gqa`` must be constants; ``is_causal`` with an
``attn_mask`` is rejected, as torch rejects it. Masks: bool, float32 or query's dtype (as
torch). With ``enable_gqa`` and query heads not a multiple of key heads, ONNX Runtime fails
at run time where torch raises.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.examples import FALSE, TRUE, B, Example, F, f64
from decomposer.forms import Attr, Const, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

_FLOAT_TYPES = (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT,
                TensorProto.DOUBLE)
_NARROW_TYPES = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


class AttentionFacts(NamedTuple):
    elem_type: int  # of query, key, value and the output
    q_rank: int
    k_rank: int
    mask: str | None  # the mask tensor name, if any
    mask_is_bool: bool
    mask_type: int | None
    causal: bool
    scale: float | None  # None: 1/sqrt(E)
    head_dim: int | None  # E when static
    gqa_groups: int | None  # 1: no repetition; None: computed at run time (enable_gqa)

    @property
    def compute_type(self) -> int:
        return TensorProto.FLOAT if self.elem_type in _NARROW_TYPES else self.elem_type


def _check_static_dims(q_shape: Sequence[int | str | None],
                       k_shape: Sequence[int | str | None],
                       v_shape: Sequence[int | str | None] | None, gqa: bool) -> None:
    """Reject static sizes torch refuses: query and key head sizes (E), key and value
    lengths (S), and head counts (dim -3) unless grouped-query attention repeats them."""
    def clash(a: int | str | None, c: int | str | None) -> bool:
        return isinstance(a, int) and isinstance(c, int) and a != c

    if clash(q_shape[-1], k_shape[-1]):
        raise Reject(f"query's head size {q_shape[-1]} differs from key's {k_shape[-1]}")
    if v_shape is not None and len(v_shape) >= 2 and clash(k_shape[-2], v_shape[-2]):
        raise Reject(f"key has {k_shape[-2]} positions but value has {v_shape[-2]}")
    if not gqa and len(q_shape) >= 3 and len(k_shape) >= 3 and clash(q_shape[-3], k_shape[-3]) \
            and k_shape[-3] != 1 and q_shape[-3] != 1:
        raise Reject(f"query has {q_shape[-3]} heads and key {k_shape[-3]}; that needs "
                     f"enable_gqa")


def _type_name(elem_type: int | None) -> str:
    return "unknown" if elem_type is None else TensorProto.DataType.Name(elem_type).lower()


_QKV_MASK = (In("query"), In("key"), In("value"), In("attn_mask", optional=True))


class ScaledDotProductAttention(Pattern[AttentionFacts]):
    """Arguments: ``dropout_p`` (float), ``is_causal`` and ``enable_gqa`` (bool), ``scale``
    (float or None: 1/sqrt(E))."""

    op_type = "ScaledDotProductAttention"
    forms = (
        Form("ScaledDotProductAttention", inputs=_QKV_MASK, attributes={
            "is_causal": Attr("int", default=0, choices=(0, 1), doc="1: mask j > i"),
            "scale": Attr("float", default=None, doc="absent: 1/sqrt(E)"),
            "dropout_p": Attr("float", default=0.0, doc="must be 0 (inference)"),
            "enable_gqa": Attr("int", default=0, choices=(0, 1),
                               doc="1: repeat key/value heads to the query's")}),
        # The legacy exporter below opset 14: (query, key, value, attn_mask or "",
        # dropout_p, is_causal, scale or "", enable_gqa); older torch has no scale/enable_gqa.
        Form(aten="scaled_dot_product_attention", inputs=(
            *_QKV_MASK, Const("dropout_p", "float", default=0.0),
            Const("is_causal", "bool", default=False), Const("scale", "float", default=None),
            Const("enable_gqa", "bool", default=False))),
    )
    examples = (
        Example(
            (
                ("q", F, ("N", "H", "L", 8)),
                ("k", F, ("N", "H", "S", 8)),
                ("v", F, ("N", "H", "S", 8)),
            ),
            attrs={"is_causal": 1, "scale": 0.25},
            aten=("q", "k", "v", "", f64(0.0), TRUE, f64(0.25), FALSE),
        ),
        Example(
            (
                ("q", F, ("N", 4, "L", 8)),
                ("k", F, ("N", 2, "S", 8)),
                ("v", F, ("N", 2, "S", 8)),
                ("m", B, ("L", "S")),
            ),
            attrs={"enable_gqa": 1},
            domains=(("custom.ops", 11),),
            aten=("q", "k", "v", "m", f64(0.0), FALSE, "", TRUE),
        ),
        # An older torch's export: no scale and enable_gqa arguments.
        Example(
            (("q", F, ("N", "L", 4)), ("k", F, ("N", "S", 4)), ("v", F, ("N", "S", 6))),
            domains=(),
            aten=("q", "k", "v", "", f64(0.0), TRUE),
        ),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> AttentionFacts:
        args = node.args
        mask = node.tensor("attn_mask") or None
        dropout, causal = float(args["dropout_p"]), bool(args["is_causal"])
        scale = None if args["scale"] is None else float(args["scale"])
        gqa = bool(args["enable_gqa"])
        if dropout != 0.0:
            raise Reject(f"dropout_p = {dropout}: only inference (dropout_p = 0) can be "
                         f"rewritten; dropout is random")
        if causal and mask is not None:
            raise Reject("is_causal with an attn_mask: torch rejects this combination")
        if scale is not None and not math.isfinite(scale):
            raise Reject(f"scale {scale} is not finite")
        query, key, value = node.tensor("query"), node.tensor("key"), node.tensor("value")
        elem_type = ctx.elem_type(query)
        if elem_type not in _FLOAT_TYPES:
            raise Reject(f"query must be float16, bfloat16, float32 or float64, got "
                         f"{_type_name(elem_type)}")
        for label, name in (("key", key), ("value", value)):
            if ctx.elem_type(name) != elem_type:
                raise Reject(f"{label} must have query's dtype ({_type_name(elem_type)}), got "
                             f"{_type_name(ctx.elem_type(name))}")
        q_shape, k_shape = ctx.shape(query), ctx.shape(key)
        if q_shape is None or k_shape is None:
            raise Reject("the ranks of query and key must be known (give them value_info "
                         "or typed graph inputs)")
        if len(q_shape) < 2 or len(k_shape) < 2:
            raise Reject(f"query and key need rank >= 2, got {len(q_shape)} and "
                         f"{len(k_shape)}")
        mask_type = None
        mask_is_bool = False
        if mask is not None:
            mask_type = ctx.elem_type(mask)
            mask_is_bool = mask_type == TensorProto.BOOL
            if not mask_is_bool and mask_type not in (TensorProto.FLOAT, elem_type):
                raise Reject(f"attn_mask must be bool, float32 or query's dtype "
                             f"({_type_name(elem_type)}), got {_type_name(mask_type)}")
        _check_static_dims(q_shape, k_shape, ctx.shape(value), gqa)
        head_dim = q_shape[-1] if isinstance(q_shape[-1], int) else None
        groups: int | None = 1
        if gqa:
            groups = _gqa_groups(q_shape, k_shape)
        return AttentionFacts(elem_type, len(q_shape), len(k_shape), mask, mask_is_bool,
                              mask_type, causal, scale, head_dim, groups)

    def build(self, b: Builder, node: MatchedNode, facts: AttentionFacts) -> None:
        compute = facts.compute_type
        dtype = numpy_dtype(compute)
        narrow = compute != facts.elem_type
        query, key, value = (b.input(node.tensor(name), numpy_dtype(facts.elem_type))
                             for name in ("query", "key", "value"))
        if narrow:
            query, key, value = (b.Cast(x, compute, hint=f"{label}_f32") for x, label in
                                 ((query, "query"), (key, "key"), (value, "value")))
        if facts.gqa_groups != 1:
            key = _repeat_heads(b, key, query, facts, "key")
            value = _repeat_heads(b, value, query, facts, "value")
        scale: Value | float
        if facts.scale is not None:
            scale = facts.scale
        elif facts.head_dim is not None:
            scale = 1.0 / math.sqrt(facts.head_dim) if facts.head_dim else math.inf
        else:
            head_dim = b.Cast(b.Shape(query, facts.q_rank - 1, facts.q_rank), compute,
                              hint="head_dim")
            scale = b.Reciprocal(b.Sqrt(head_dim), hint="scale")
        if isinstance(scale, float):
            scaled_query = query * np.asarray(scale, dtype) if scale != 1.0 else query
        else:
            scaled_query = b.Mul(query, scale, hint="query_scaled")
        k_rank = facts.k_rank
        key_t = b.Transpose(key, [*range(k_rank - 2), k_rank - 1, k_rank - 2], hint="key_T")
        scores = b.MatMul(scaled_query, key_t, hint="scores")  # (*, L, S)
        rank = max(facts.q_rank, facts.k_rank)
        minus_inf = np.asarray(-np.inf, dtype)
        dead_rows: Value | None = None
        if facts.causal:
            scores = b.Where(_causal_keep(b, query, key, scores, facts, rank), scores,
                             minus_inf, hint="scores_causal")
        elif facts.mask is not None:
            mask = b.input(facts.mask, None if facts.mask_type is None
                           else numpy_dtype(facts.mask_type))
            if facts.mask_is_bool:
                scores = b.Where(mask, scores, minus_inf, hint="scores_masked")
                # A row with no True cannot attend anywhere: torch gives 0 there.
                alive = b.ReduceMax(b.Cast(mask, np.int32, hint="mask_i32"), [-1],
                                    hint="mask_row_any")
                dead_rows = b.Equal(alive, np.int32(0), hint="dead_rows")
            else:
                if facts.mask_type != compute:
                    mask = b.Cast(mask, compute, hint="mask_cast")
                scores = b.Add(scores, mask, hint="scores_masked")
                dead_rows = b.Equal(b.ReduceMax(mask, [-1], hint="mask_row_max"),
                                    minus_inf, hint="dead_rows")
        weights = b.Softmax(scores, -1, hint="weights")
        final = None if narrow or dead_rows is not None else node.outputs[0]
        out = b.MatMul(weights, value, hint="attention", out=final)  # (*, L, Ev)
        if dead_rows is not None:
            final = None if narrow else node.outputs[0]
            out = b.Where(dead_rows, np.zeros((), dtype), out, hint="attention_dead_rows",
                          out=final)
        if narrow:
            b.Cast(out, facts.elem_type, hint="attention_cast", out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: AttentionFacts
                     ) -> list[OutputType]:
        rank = max(facts.q_rank, facts.k_rank)
        return [(facts.elem_type, [None] * rank)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        query, key, value = (np.asarray(tensors[name]) for name in ("query", "key", "value"))
        mask = tensors.get("attn_mask")
        if args["dropout_p"]:
            raise ValueError("dropout_p must be 0")
        return [attention_reference(query, key, value, None if mask is None else
                                    np.asarray(mask), bool(args["is_causal"]), args["scale"],
                                    bool(args["enable_gqa"]))]


def _gqa_groups(q_shape: tuple, k_shape: tuple) -> int | None:
    """How many query heads share one key head: static if both head counts are."""
    if len(q_shape) < 3 or len(k_shape) < 3:
        raise Reject("enable_gqa needs query and key of rank >= 3 (heads at dim -3)")
    q_heads, k_heads = q_shape[-3], k_shape[-3]
    if isinstance(q_heads, int) and isinstance(k_heads, int):
        if k_heads == 0 or q_heads % k_heads:
            raise Reject(f"enable_gqa: query heads {q_heads} are not a multiple of key "
                         f"heads {k_heads}")
        return q_heads // k_heads
    if q_heads is not None and q_heads == k_heads:
        return 1  # the same symbolic dim
    return None


def _repeat_heads(b: Builder, x: Value, query: Value, facts: AttentionFacts,
                  label: str) -> Value:
    """repeat_interleave(x, groups, dim=-3): (*, H, S, D) -> (*, H*groups, S, D), as
    Unsqueeze -> Expand over a new axis -> Reshape (a broadcast copy, no Gather)."""
    rank, q_rank = facts.k_rank, facts.q_rank
    spread = b.Unsqueeze(x, [rank - 2], hint=f"{label}_heads")  # (*, H, 1, S, D)
    ones = [1] * (rank - 2)
    if facts.gqa_groups is not None:
        repeats: Any = [*ones, facts.gqa_groups, 1, 1]
    else:
        # G = Hq / H, read off Hq ones viewed as (H, G) rather than computed with a Div
        # of shape values (which TVM's importer cannot do); not off the query itself,
        # whose -1 cannot be inferred when a batch dim is 0.
        head_ones = b.ConstantOfShape(b.Shape(query, q_rank - 3, q_rank - 2,
                                              hint="query_head_count"), 1, np.int64,
                                      hint="query_head_ones")
        grouped = b.Reshape(head_ones, b.Concat(
            b.Shape(x, rank - 3, rank - 2, hint=f"{label}_head_count"),
            np.asarray([-1], np.int64), axis=0, hint="query_grouped_shape"),
            hint="query_grouped")
        repeats = b.Concat(np.asarray(ones, np.int64),
                           b.Shape(grouped, 1, 2, hint="groups"),
                           np.asarray([1, 1], np.int64), axis=0, hint=f"{label}_repeats")
    spread = b.Expand(spread, repeats, hint=f"{label}_repeated")  # (*, H, G, S, D)
    # The head dim is the query's own (not -1), so engines tracking symbolic dims see the
    # same head count on both sides of the scores MatMul.
    shape = b.Concat(b.Shape(x, 0, rank - 3, hint=f"{label}_batch"),
                     b.Shape(query, q_rank - 3, q_rank - 2, hint="query_heads"),
                     b.Shape(x, rank - 2, rank, hint=f"{label}_SD"),
                     axis=0, hint=f"{label}_shape")
    return b.Reshape(spread, shape, hint=f"{label}_gqa")


def _causal_keep(b: Builder, query: Value, key: Value, scores: Value, facts: AttentionFacts,
                 rank: int) -> Value:
    """keep[i, j] = j <= i over (L, S), as a (1, ..., 1, L, S) bool tensor; both index
    ranges are unsqueezed to the full rank explicitly. The result is reshaped to the
    scores' own (L, S): a Range's length is a new symbolic dim to engines that track them
    (TVM), which then cannot broadcast it against the scores."""
    q_len = b.Gather(b.Shape(query, hint="query_shape"), facts.q_rank - 2, hint="L")
    k_len = b.Gather(b.Shape(key, hint="key_shape"), facts.k_rank - 2, hint="S")
    rows = b.Unsqueeze(b.Range(np.int64(0), q_len, np.int64(1), hint="rows"),
                       [*range(rank - 2), rank - 1], hint="rows_col")  # (1.., L, 1)
    cols = b.Unsqueeze(b.Range(np.int64(0), k_len, np.int64(1), hint="cols"),
                       list(range(rank - 1)), hint="cols_row")  # (1.., 1, S)
    keep = b.LessOrEqual(cols, rows, hint="causal_keep_ranges")
    shape = b.Concat(np.ones(rank - 2, np.int64), b.Shape(scores, rank - 2, rank), axis=0,
                     hint="causal_shape")
    return b.Reshape(keep, shape, hint="causal_keep")


def attention_reference(query: np.ndarray, key: np.ndarray, value: np.ndarray,
                        mask: np.ndarray | None = None, is_causal: bool = False,
                        scale: float | None = None, enable_gqa: bool = False) -> np.ndarray:
    """numpy reference of torch's scaled_dot_product_attention, in float64."""
    dtype = query.dtype
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (query, key, value))
    if enable_gqa:
        groups = q.shape[-3] // k.shape[-3]
        k, v = np.repeat(k, groups, axis=-3), np.repeat(v, groups, axis=-3)
    factor = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    scores = (q @ np.swapaxes(k, -1, -2)) * factor
    length, source = scores.shape[-2], scores.shape[-1]
    allowed = np.ones((length, source), dtype=bool)
    bias = np.zeros((length, source))
    if is_causal:
        allowed = np.tril(allowed)
    if mask is not None:
        if mask.dtype == np.bool_:
            allowed = allowed & mask
        else:
            bias = bias + mask.astype(np.float64)
    if source == 0:  # nothing to attend to: torch gives zeros
        return np.zeros((*scores.shape[:-1], v.shape[-1]), dtype=dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        scores = np.where(allowed, scores + bias, -np.inf)
        top = np.max(scores, axis=-1, keepdims=True)
        dead = np.isneginf(top)  # every score masked out: torch gives 0
        exp = np.exp(scores - np.where(dead, 0.0, top))
        weights = exp / np.where(dead, 1.0, np.sum(exp, axis=-1, keepdims=True))
    return (weights @ v).astype(dtype)


PATTERNS = [ScaledDotProductAttention()]
