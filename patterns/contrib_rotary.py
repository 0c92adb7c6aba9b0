"""ONNX Runtime's com.microsoft RotaryEmbedding (RoPE, as the onnxruntime-genai builder and
ORT's optimizer write it) as standard ops.

Matches ``RotaryEmbedding(input, position_ids, cos_cache, sin_cache; interleaved=0,
num_heads, rotary_embedding_dim, scale, is_packed_batching)`` -> ``output``, with the inputs
and attributes of the schema ONNX Runtime 1.32 registers and the numbers of its CPU kernel
(each form below pinned by running it):
- input (B, N, S, h), or (B, S, H) read as (B, S, H / h, h) with the head size h from
  ``num_heads`` (``H / num_heads``) or, without it, twice the caches' last dim;
- position_ids (B, S), or (1,): an offset, positions ``offset + 0 .. S-1`` for every row;
- cos_cache, sin_cache (max positions, r / 2) with r = ``rotary_embedding_dim`` (default h):
  the first r dims of each head are rotated, the rest passed through;
- not interleaved: halves ``x1, x2`` of the rotated dims become ``x1 cos - x2 sin`` and
  ``x2 cos + x1 sin``; interleaved: the same on pairs (x[2i], x[2i+1]).
``scale`` is refused unless 1 (ONNX Runtime's CPU kernel ignores it, so a model that sets it
means something the kernel does not do), as is ``is_packed_batching``.

Before -> after (not interleaved)::

    RotaryEmbedding(x, pos, cos, sin)  ->  c, s = Gather(cos, pos), Gather(sin, pos)
        x1, x2 = Split(x[..., :r]);  Concat(x1 c - x2 s, x2 c + x1 s, x[..., r:])

ONNX's own ``RotaryEmbedding(X, cos_cache, sin_cache[, position_ids]; interleaved,
num_heads, rotary_embedding_dim)`` (opset 23) is matched too, in the default domain below 23
(``--target-opset``): the same rotation, and without position_ids the caches are
(B, S, r / 2) per row already. It is not emitted: ONNX Runtime and OpenVINO load it, TVM
0.27 has no converter ("not supported for frontend ONNX: RotaryEmbedding", measured).

Envelope: opsets 11+ (bfloat16 13+); float16/32 (computed in float32); the head size and r
static; batch, sequence and heads dynamic. ``--target ort`` keeps the node.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_shape, require_type
from decomposer.examples import I64, Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._compute import ComputeType
from ._sampling import positions

MS = frozenset({"com.microsoft"})
_TYPES = (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT)


class Facts(NamedTuple):
    elem_type: int
    rank: int  # 3 or 4
    head: int
    rotary: int
    offset_positions: bool  # position_ids is (1,)


class RotaryEmbedding(Pattern[Facts]):
    op_type = "RotaryEmbedding"
    forms = (Form("RotaryEmbedding", domains=MS,
                  inputs=(In("input"), In("position_ids"), In("cos_cache"), In("sin_cache")),
                  attributes={"interleaved": Attr("int", default=0, choices=(0, 1)),
                              "num_heads": Attr("int", default=0),
                              "rotary_embedding_dim": Attr("int", default=0),
                              "scale": Attr("float", default=1.0, choices=(1.0,)),
                              "is_packed_batching": Attr("int", default=0, choices=(0,))}),)
    examples = (
        Example((("x", F, ("B", "S", 16)), ("p", I64, ("B", "S")), ("c", F, (32, 4)),
                 ("s", F, (32, 4))), attrs={"num_heads": 2}, domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        args = node.args
        elem_type = require_type(ctx, node.tensor("input"), "input", _TYPES)
        if elem_type == TensorProto.BFLOAT16 and ctx.opset < 13:
            raise Reject("bfloat16 needs opset 13 or newer")
        for name in ("cos_cache", "sin_cache"):
            require_type(ctx, node.tensor(name), name, (elem_type,))
        if node.tensor("position_ids"):
            require_type(ctx, node.tensor("position_ids"), "position_ids",
                         (TensorProto.INT64,))
        shape = require_shape(ctx, node.tensor("input"), "input", "(B, S, H) or (B, N, S, h)",
                              3, 4)
        cache = require_shape(ctx, node.tensor("cos_cache"), "cos_cache",
                              "(positions, rotary dim / 2)", 2,
                              2 if node.tensor("position_ids") else 3)
        per_row = len(cache) == 3  # (B, S, r/2): ONNX's form without position_ids
        cache = cache[-2:]
        heads, rotary = int(args["num_heads"]), int(args["rotary_embedding_dim"])
        if len(shape) == 4:
            head = shape[3]
        elif heads > 0:
            head = shape[2] // heads if isinstance(shape[2], int) else None
        else:
            head = 2 * cache[1] if isinstance(cache[1], int) else None
        if not isinstance(head, int) or head <= 0:
            raise Reject("the head size must be static (from the input, num_heads or the "
                         "caches)")
        if len(shape) == 3 and isinstance(shape[2], int) and shape[2] % head:
            raise Reject(f"hidden size {shape[2]} is not a multiple of the head size {head}")
        rotary = rotary or head
        if rotary > head or rotary % 2:
            raise Reject(f"rotary_embedding_dim {rotary} must be even and at most the head "
                         f"size {head}")
        if isinstance(cache[1], int) and cache[1] != rotary // 2:
            raise Reject(f"the caches hold {cache[1]} values per position; rotating {rotary} "
                         f"dims takes {rotary // 2}")
        if not node.tensor("position_ids"):  # ONNX's form: caches per (batch, position)
            if not per_row:
                raise Reject("without position_ids the caches must be (B, S, rotary dim / 2)")
            return Facts(elem_type, len(shape), head, rotary, False)
        ids = require_shape(ctx, node.tensor("position_ids"), "position_ids", "(B, S) or (1,)",
                            1, 2)
        if len(ids) == 1 and ids[0] != 1:
            raise Reject(f"a 1-D position_ids must hold one offset, got shape {list(ids)}")
        return Facts(elem_type, len(shape), head, rotary, len(ids) == 1)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        compute = ComputeType(b, node, facts.elem_type)

        def read(name: str) -> Value:
            value = compute.read(name)
            assert value is not None  # a required input
            return value

        x = read("input")
        head = facts.head
        if facts.rank == 3:  # (B, S, H) -> (B, S, N, h)
            heads_shape = b.Concat(b.Shape(x, 0, 2, hint="batch_sequence"),
                                   np.array([-1, head], np.int64), axis=0, hint="heads_shape")
            view = b.Reshape(x, heads_shape, hint="heads")
            sequence_axis = 1
        else:
            view, sequence_axis = x, 2
        heads_axis = 2 if facts.rank == 3 else 1
        if not node.tensor("position_ids"):  # (B, S, r/2) caches, per batch row already
            cos = b.Unsqueeze(read("cos_cache"), [heads_axis], hint="cos_heads")
            sin = b.Unsqueeze(read("sin_cache"), [heads_axis], hint="sin_heads")
            self._finish(b, node, facts, compute, x, view, cos, sin)
            return
        ids = b.input(node.tensor("position_ids"), np.int64)
        if facts.offset_positions:  # offset + 0 .. S-1, as a (1, S) row
            steps = positions(b, b.Shape(view, sequence_axis, sequence_axis + 1,
                                         hint="sequence"), 0, np.dtype(np.int64),
                              hint="steps")
            ids = b.Unsqueeze(b.Add(steps, ids, hint="positions"), [0], hint="position_row")
        # (B or 1, S, r/2), with a heads axis where the view has one
        cos = b.Unsqueeze(b.Gather(read("cos_cache"), ids, axis=0, hint="cos"), [heads_axis],
                          hint="cos_heads")
        sin = b.Unsqueeze(b.Gather(read("sin_cache"), ids, axis=0, hint="sin"), [heads_axis],
                          hint="sin_heads")
        self._finish(b, node, facts, compute, x, view, cos, sin)

    def _finish(self, b: Builder, node: MatchedNode, facts: Facts, compute: ComputeType,
                x: Value, view: Value, cos: Value, sin: Value) -> None:
        narrow, original = compute.narrow, compute.original
        result = rotate(b, view, cos, sin, facts.rotary, facts.head,
                        bool(node.args["interleaved"]))
        out = node.outputs[0]
        if facts.rank == 3:
            result = b.Reshape(result, b.Shape(x, hint="input_shape"), hint="merged",
                               out=None if narrow else out)
        if narrow:
            b.Cast(result, original, out=out)
        elif facts.rank == 4:
            b.Identity(result, out=out)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        shape = ctx.shape(node.tensor("input"))
        return [(facts.elem_type, None if shape is None else list(shape))]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, ids = tensors["input"], tensors.get("position_ids")
        cos, sin = tensors["cos_cache"], tensors["sin_cache"]
        assert x is not None and cos is not None and sin is not None
        wide = x.astype(np.float64)
        if x.ndim == 3:
            heads = int(args["num_heads"])
            head = x.shape[2] // heads if heads else 2 * cos.shape[1]
            view = wide.reshape(x.shape[0], x.shape[1], -1, head).transpose(0, 2, 1, 3)
        else:
            view = wide
        head = view.shape[-1]
        rotary = int(args["rotary_embedding_dim"]) or head
        sequence = view.shape[2]
        if ids is None:  # ONNX's form: (B, S, r/2) caches
            c, s = cos.astype(np.float64)[:, None], sin.astype(np.float64)[:, None]
        else:
            if ids.ndim == 1:
                ids = (ids[0] + np.arange(sequence))[None]
            c = cos.astype(np.float64)[ids][:, None]
            s = sin.astype(np.float64)[ids][:, None]
        y = rotate_numpy(view, c, s, rotary, bool(args["interleaved"]))
        if x.ndim == 3:
            y = y.transpose(0, 2, 1, 3).reshape(x.shape)
        return [y.astype(x.dtype)]


def rotate(b: Builder, view: Value, cos: Value, sin: Value, rotary: int, head: int,
           interleaved: bool) -> Value:
    """RoPE on the last axis of ``view`` (..., head): the first ``rotary`` dims turned by
    ``cos``/``sin`` (broadcastable to (..., rotary / 2)), the rest passed through. Not
    interleaved: halves ``x1, x2`` -> ``x1 cos - x2 sin, x2 cos + x1 sin``; interleaved: the
    same on pairs (x[2i], x[2i+1]). Shared by RotaryEmbedding and GroupQueryAttention."""
    half = rotary // 2
    rotated = view if rotary == head else b.Slice(view, [0], [rotary], [-1],
                                                  hint="rotated_part")
    if interleaved:
        rank_before = b.Shape(rotated, 0, -1, hint="lead")
        pairs = b.Reshape(rotated, b.Concat(rank_before, np.array([half, 2], np.int64), axis=0,
                                            hint="pairs_shape"), hint="pairs")
        first, second = b.Split(pairs, [1, 1], axis=-1, hint="pair")
        cos = b.Unsqueeze(cos, [-1], hint="cos_pairs")
        sin = b.Unsqueeze(sin, [-1], hint="sin_pairs")
    else:
        first, second = b.Split(rotated, [half, half], axis=-1, hint="halves")
    out_first = b.Sub(b.Mul(first, cos, hint="a_cos"), b.Mul(second, sin, hint="b_sin"),
                      hint="rot_first")
    out_second = b.Add(b.Mul(second, cos, hint="b_cos"), b.Mul(first, sin, hint="a_sin"),
                       hint="rot_second")
    result = b.Concat(out_first, out_second, axis=-1, hint="rot_pairs" if interleaved else "rot")
    if interleaved:
        result = b.Reshape(result, b.Shape(rotated, hint="rotated_shape"), hint="rot")
    if rotary < head:
        result = b.Concat(result, b.Slice(view, [rotary], [head], [-1], hint="passed"),
                          axis=-1, hint="rot_and_passed")
    return result


def rotate_numpy(view: np.ndarray, c: np.ndarray, s: np.ndarray, rotary: int,
                 interleaved: bool) -> np.ndarray:
    """numpy twin of :func:`rotate`; ``c``/``s`` broadcastable to (..., rotary / 2)."""
    part = view[..., :rotary]
    if interleaved:
        a, bb = part[..., 0::2], part[..., 1::2]
        turned = np.stack([a * c - bb * s, bb * c + a * s], -1).reshape(part.shape)
    else:
        a, bb = part[..., :rotary // 2], part[..., rotary // 2:]
        turned = np.concatenate([a * c - bb * s, bb * c + a * s], -1)
    return np.concatenate([turned, view[..., rotary:]], -1)


class OnnxRotaryEmbedding(RotaryEmbedding):
    """ONNX's RotaryEmbedding (opset 23) below 23: the same rotation, its inputs in ONNX's
    order and position_ids optional."""

    forms = (Form("RotaryEmbedding", domains=frozenset({""}),
                  inputs=(In("input"), In("cos_cache"), In("sin_cache"),
                          In("position_ids", optional=True)),
                  attributes={"interleaved": Attr("int", default=0, choices=(0, 1)),
                              "num_heads": Attr("int", default=0),
                              "rotary_embedding_dim": Attr("int", default=0)}),)
    examples = (
        Example((("x", F, ("B", 2, "S", 8)), ("c", F, (32, 4)), ("s", F, (32, 4)),
                 ("p", I64, ("B", "S"))), domains=(("", 17),)),
    )

    @property
    def name(self) -> str:
        return "RotaryEmbedding (ONNX)"

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        node.args.setdefault("scale", 1.0)
        return super().check(node, ctx)


PATTERNS = [RotaryEmbedding(), OnnxRotaryEmbedding()]
