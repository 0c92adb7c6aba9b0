"""ONNX Runtime's com.microsoft Attention (BERT-style packed QKV self-attention) as standard
MatMul/Softmax/MatMul.

Matches ``com.microsoft::Attention(input, weights[, bias][, mask_index][, past]
[, attention_bias]; num_heads, qkv_hidden_sizes, scale, mask_filter_value=-10000,
unidirectional=0)`` -> ``output[, present]``, with the inputs and attributes of the schema
ONNX Runtime 1.32 registers (``get_all_operator_schema()``; docs/ContribOperators.md) and the
numbers of its CPU kernel (each mask form below was pinned by running it):
- ``QKV = input @ weights + bias``, split into Q, K, V by ``qkv_hidden_sizes`` (equal thirds
  by default), each viewed as (B, num_heads, S, head size);
- ``past`` (2, B, N, P, head) is prepended to K and V; ``present`` is the new (2, B, N,
  P + S, head);
- ``scores = Q K^T * scale`` (default ``1 / sqrt(head size)``), then **added**:
  ``mask_filter_value`` where the mask says no, the same where ``unidirectional`` forbids a
  later key (key j of query i beyond P + i), and ``attention_bias`` (B or 1, N, S, T);
- ``mask_index``: 1-D (B,) key lengths (keys at or after the length are masked), 1-D (2B,)
  end then start positions (keys before the start are masked too: left padding), 2-D
  (B, T) or 3-D (B, S, T) raw masks (0: masked). The 4-D Megatron form is refused (ONNX
  Runtime's CPU kernel does not implement it: "4D mask in attention cpu kernel is not
  supported", so its numbers cannot be pinned), as is ``do_rotary`` (the CPU kernel refuses
  it too: "Rotary embedding is not supported in Attention CPU kernel. Please fuse the model
  with MHA + RotaryEmbedding", both of which decompose), and ``past_present_share_buffer``
  and ``past_sequence_length``;
- ``output = softmax(scores) V``, heads merged back: (B, S, N * v head size).

ONNX's own Attention (opset 23) is not emitted: ONNX Runtime and OpenVINO load it, TVM 0.27's
converter fails on it (3-D and 4-D inputs: "'num_heads'", measured).

The mask is additive as in ONNX Runtime's kernel (a fully masked row is a softmax over
``scores + mask_filter_value``, not zeros). float16 and bfloat16 are computed in float32
and rounded once. Before -> after::

    Attention(x, W, b, mask)  ->  Split(MatMul(x, W) + b) -> Q, K, V (Reshape, Transpose)
        -> Softmax(MatMul(Q, Transpose(K)) * scale + additive mask) -> MatMul(., V)
        -> Transpose, Reshape

Envelope: opsets 11+ (bfloat16 13+); input (B, S, H) of known rank, the weights' last dim
(or ``qkv_hidden_sizes``) static and divisible by num_heads; B, S and the past length
dynamic; a 1-D mask of (B,) or (2B,) is told apart at run time. ``--target ort`` keeps the
node.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_shape, require_type
from decomposer.examples import I32, Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._compute import ComputeType
from ._sampling import positions

MS = frozenset({"com.microsoft"})
_TYPES = (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT)


class Facts(NamedTuple):
    elem_type: int
    heads: int
    sizes: tuple[int, int, int]  # hidden sizes of Q, K, V
    scale: float
    mask: str | None  # "lengths", "raw2", "raw3"


class Attention(Pattern[Facts]):
    op_type = "Attention"
    forms = (Form("Attention", domains=MS,
                  inputs=(In("input"), In("weights"), In("bias", optional=True),
                          In("mask_index", optional=True), In("past", optional=True),
                          In("attention_bias", optional=True),
                          In("past_sequence_length", optional=True)),
                  attributes={"num_heads": Attr("int"),
                              "qkv_hidden_sizes": Attr("ints", default=None),
                              "scale": Attr("float", default=None),
                              "mask_filter_value": Attr("float", default=-10000.0),
                              "unidirectional": Attr("int", default=0, choices=(0, 1)),
                              "do_rotary": Attr("int", default=0, choices=(0,)),
                              "rotary_embedding_dim": Attr("int", default=None),
                              "past_present_share_buffer": Attr("int", default=0,
                                                                choices=(0,))},
                  outputs=(1, 2)),)
    examples = (
        Example((("x", F, ("B", "S", 8)), ("w", F, (8, 24)), ("b", F, (24,)),
                 ("m", I32, ("B",))), attrs={"num_heads": 2},
                domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        args = node.args
        elem_type = require_type(ctx, node.tensor("input"), "input", _TYPES)
        if elem_type == TensorProto.BFLOAT16 and ctx.opset < 13:
            raise Reject("bfloat16 needs opset 13 or newer")
        for name in ("weights", "bias", "past", "attention_bias"):
            if node.tensor(name):
                require_type(ctx, node.tensor(name), name, (elem_type,))
        if node.tensor("past_sequence_length"):
            raise Reject("past_sequence_length (a shared past/present buffer) is not supported")
        shape = require_shape(ctx, node.tensor("input"), "input", "(batch, sequence, hidden)",
                              3, 3)
        weights = require_shape(ctx, node.tensor("weights"), "weights", "(hidden, 3 hidden)",
                                2, 2)
        heads = int(args["num_heads"])
        if heads <= 0:
            raise Reject(f"num_heads must be positive, got {heads}")
        if args["qkv_hidden_sizes"] is not None:
            sizes = tuple(int(v) for v in args["qkv_hidden_sizes"])
            if len(sizes) != 3 or sizes[0] != sizes[1]:
                raise Reject(f"qkv_hidden_sizes must be 3 sizes with Q's equal to K's, got "
                             f"{list(sizes)}")
        elif isinstance(weights[1], int) and weights[1] % 3 == 0:
            sizes = (weights[1] // 3,) * 3
        else:
            raise Reject("the weights' last dim must be static and a multiple of 3 (or give "
                         "qkv_hidden_sizes)")
        if isinstance(weights[1], int) and weights[1] != sum(sizes):
            raise Reject(f"the weights have {weights[1]} columns, qkv_hidden_sizes sum to "
                         f"{sum(sizes)}")
        if any(size <= 0 or size % heads for size in sizes):
            raise Reject(f"hidden sizes {list(sizes)} must be positive multiples of num_heads "
                         f"{heads}")
        if (len(node.outputs) > 1 and node.outputs[1] or node.tensor("past")) \
                and sizes[1] != sizes[2]:
            raise Reject(f"past/present need K and V of one size, got qkv_hidden_sizes "
                         f"{list(sizes)}")
        scale = args["scale"]
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(sizes[0] // heads)
        return Facts(elem_type, heads, sizes, scale,
                     self._mask_form(node, ctx, shape))

    @staticmethod
    def _mask_form(node: MatchedNode, ctx: MatchContext, shape: Any,
                   start_positions: bool = True) -> str | None:
        """The mask_index form: "lengths" (1-D: (B,) end positions, or with
        ``start_positions`` also (2B,) end then start positions, told apart at run time),
        "raw2" or "raw3"."""
        mask = node.tensor("mask_index")
        if not mask:
            return None
        require_type(ctx, mask, "mask_index", (TensorProto.INT32,))
        dims = require_shape(ctx, mask, "mask_index", "its form (1-D lengths, 2-D, 3-D)")
        if len(dims) == 1:
            batch = shape[0]
            allowed = (batch, 2 * batch) if start_positions and isinstance(batch, int) \
                else (batch,)
            if start_positions and not (isinstance(dims[0], int) and isinstance(batch, int)):
                return "lengths"  # B or 2B: decided at run time
            if dims[0] is None or dims[0] not in allowed:
                forms = "the batch dim or twice it" if start_positions else "the batch dim"
                raise Reject(f"a 1-D mask_index of length {dims[0]} must have {forms} "
                             f"({batch}) as its length")
            return "lengths"
        if len(dims) in (2, 3):
            return f"raw{len(dims)}"
        raise Reject(f"a {len(dims)}-D mask_index (Megatron's 4-D form) is not supported: "
                     f"ONNX Runtime's CPU kernel does not implement it, so its numbers cannot "
                     f"be pinned here")

    def projection(self, b: Builder, node: MatchedNode, facts: Facts, compute: ComputeType
                   ) -> tuple[Value, Value]:
        """(QKV = input @ weights + bias, the input): subclasses that project otherwise
        (QAttention's integer product) override it."""
        x, weights, bias = compute.read("input"), compute.read("weights"), compute.read("bias")
        assert x is not None and weights is not None
        qkv = b.MatMul(x, weights, hint="qkv")
        if bias is not None:
            qkv = b.Add(qkv, bias, hint="qkv_bias")
        return qkv, x

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        compute = ComputeType(b, node, facts.elem_type)
        dtype, read = compute.dtype, compute.read

        qkv, x = self.projection(b, node, facts, compute)
        rows = b.Shape(x, 0, 2, hint="batch_sequence")
        heads = facts.heads

        def split_heads(value: Value, size: int, label: str) -> Value:
            target = b.Concat(rows, np.array([heads, size // heads], np.int64), axis=0,
                              hint=f"{label}_heads_shape")
            return b.Transpose(b.Reshape(value, target, hint=f"{label}_heads"), [0, 2, 1, 3],
                               hint=f"{label}_bnsh")

        q, k, v = (split_heads(part, size, label) for part, size, label in zip(
            b.Split(qkv, list(facts.sizes), axis=-1, hint="qkv_parts"), facts.sizes, "qkv",
            strict=True))
        past = read("past")
        if past is not None:
            k = b.Concat(b.Gather(past, 0, axis=0, hint="past_k"), k, axis=2, hint="k_all")
            v = b.Concat(b.Gather(past, 1, axis=0, hint="past_v"), v, axis=2, hint="v_all")
        outputs = list(node.outputs) + [""]
        if outputs[1]:
            present = b.Concat(b.Unsqueeze(k, [0], hint="k_present"),
                               b.Unsqueeze(v, [0], hint="v_present"), axis=0,
                               hint="present", out=compute.direct(outputs[1]))
            compute.finish(present, outputs[1])
        scores = b.Mul(b.MatMul(q, b.Transpose(k, [0, 1, 3, 2], hint="k_t"), hint="qk"),
                       np.asarray(facts.scale, dtype), hint="scores")
        for term in self._additive_terms(b, node, facts, x, k, dtype, read):
            scores = b.Add(scores, term, hint="masked_scores")
        probs = b.Softmax(scores, -1, hint="probs")
        merged_shape = b.Concat(rows, np.array([facts.sizes[2]], np.int64), axis=0,
                                hint="output_shape")
        context = b.Transpose(b.MatMul(probs, v, hint="context"), [0, 2, 1, 3],
                              hint="context_bsnh")
        y = b.Reshape(context, merged_shape, hint="output", out=compute.direct(outputs[0]))
        compute.finish(y, outputs[0])

    @staticmethod
    def _additive_terms(b: Builder, node: MatchedNode, facts: Facts, x: Value, k: Value,
                        dtype: Any, read: Any) -> list[Value]:
        """What ONNX Runtime adds to the scores: the mask's and unidirectional's filter
        value where they forbid a key, and attention_bias."""
        filtered = np.asarray(float(node.args["mask_filter_value"]), dtype)
        zero = np.asarray(0.0, dtype)
        terms = []
        key_index = None
        if facts.mask == "lengths" or node.args["unidirectional"]:
            key_index = positions(b, b.Shape(k, 2, 3, hint="total_length"), 0,
                                  np.dtype(np.int32), hint="key_index")  # (T,)
        mask = node.tensor("mask_index")
        if facts.mask == "lengths":
            # (B,) end positions, or (2B,) end then start positions: the starts are
            # mask[B:2B] of the mask padded with B zeros, zeros for the (B,) form.
            assert key_index is not None
            # Gathers, not Slices with run-time bounds (TVM cannot compile those).
            positions_1d = b.input(mask, np.int32)
            rows = positions(b, b.Shape(x, 0, 1, hint="mask_batch_dim"), 0,
                             np.dtype(np.int64), hint="mask_rows")  # 0 .. B-1
            ends = b.Gather(positions_1d, rows, hint="mask_ends")
            padded = b.Concat(positions_1d, b.Sub(ends, ends, hint="no_starts"), axis=0,
                              hint="mask_padded")
            batch = b.Gather(b.Shape(x, hint="mask_batch_shape"), [0], hint="mask_batch")
            starts = b.Gather(padded, b.Add(rows, batch, hint="start_rows"),
                              hint="mask_starts")
            key_row = b.Unsqueeze(key_index, [0], hint="key_row")  # (1, T)
            keep = b.And(b.Less(key_row, b.Unsqueeze(ends, [1], hint="lengths"),
                                hint="before_end"),
                         b.Not(b.Less(key_row, b.Unsqueeze(starts, [1], hint="start_col"),
                                      hint="before_start"), hint="after_start"),
                         hint="key_kept")  # (B, T)
            terms.append(b.Unsqueeze(b.Where(keep, zero, filtered, hint="length_mask"),
                                     [1, 2], hint="length_mask_4d"))
        elif facts.mask in ("raw2", "raw3"):
            dropped = b.Sub(np.asarray(1.0, dtype), b.Cast(b.input(mask, np.int32), dtype,
                                                             hint="mask_f"), hint="dropped")
            term = b.Mul(dropped, filtered, hint="raw_mask")
            axes = [1, 2] if facts.mask == "raw2" else [1]
            terms.append(b.Unsqueeze(term, axes, hint="raw_mask_4d"))
        if node.args["unidirectional"]:
            assert key_index is not None
            query_index = positions(b, b.Shape(x, 1, 2, hint="sequence"), 0,
                                    np.dtype(np.int32), hint="query_index")  # (S,)
            past_length = b.Sub(b.Cast(b.Shape(k, 2, 3, hint="total"), np.int32,
                                       hint="total_i32"),
                                b.Cast(b.Shape(x, 1, 2, hint="new"), np.int32,
                                       hint="new_i32"), hint="past_length")  # (1,)
            last_key = b.Add(b.Unsqueeze(query_index, [1], hint="query_col"), past_length,
                             hint="last_key")  # (S, 1)
            later = b.Greater(b.Unsqueeze(key_index, [0], hint="key_row_c"), last_key,
                              hint="later_key")  # (S, T)
            # far below the filter value: where the raw mask also hides every earlier key,
            # ONNX Runtime's kernel still gives the later keys no weight (measured; with the
            # filter value they would share it)
            lowest = np.asarray(np.finfo(dtype).min, dtype)
            terms.append(b.Where(later, lowest, zero, hint="causal_mask"))
        bias = read("attention_bias")
        if bias is not None:
            terms.append(bias)
        return terms

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        shape = ctx.shape(node.tensor("input"))
        batch, sequence = (shape[0], shape[1]) if shape else (None, None)
        types: list[OutputType] = [(facts.elem_type, [batch, sequence, facts.sizes[2]])]
        if len(node.outputs) > 1:
            types.append((facts.elem_type, [2, batch, facts.heads, None,
                                            facts.sizes[0] // facts.heads]))
        return types

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, weights = tensors["input"], tensors["weights"]
        assert x is not None and weights is not None
        wide = np.float64
        heads = int(args["num_heads"])
        qkv = x.astype(wide) @ weights.astype(wide)
        if tensors.get("bias") is not None:
            qkv = qkv + tensors["bias"].astype(wide)  # type: ignore[union-attr]
        sizes = [int(v) for v in args["qkv_hidden_sizes"]] if args["qkv_hidden_sizes"] \
            else [qkv.shape[-1] // 3] * 3
        batch, sequence = x.shape[:2]
        parts = np.split(qkv, np.cumsum(sizes)[:2], axis=-1)
        q, k, v = (p.reshape(batch, sequence, heads, -1).transpose(0, 2, 1, 3) for p in parts)
        past = tensors.get("past")
        if past is not None:
            k = np.concatenate([past[0].astype(wide), k], axis=2)
            v = np.concatenate([past[1].astype(wide), v], axis=2)
        total = k.shape[2]
        scale = args["scale"] if args["scale"] is not None else 1 / math.sqrt(sizes[0] // heads)
        scores = (q @ k.transpose(0, 1, 3, 2)) * float(scale)
        filtered = float(args["mask_filter_value"])
        mask = tensors.get("mask_index")
        if mask is not None and mask.ndim == 1:
            starts = mask[batch:2 * batch] if mask.shape[0] == 2 * batch else 0 * mask
            keys = np.arange(total)[None]
            keep = (keys < mask[:batch, None]) & (keys >= starts[:, None])
            scores = scores + np.where(keep, 0.0, filtered)[:, None, None, :]
        elif mask is not None:
            term = (1.0 - mask.astype(wide)) * filtered
            scores = scores + (term[:, None, None, :] if mask.ndim == 2 else term[:, None])
        if args["unidirectional"]:
            later = np.arange(total)[None, :] > np.arange(sequence)[:, None] + total - sequence
            scores = np.where(later, -np.inf, scores)  # no weight, whatever the mask says
        if tensors.get("attention_bias") is not None:
            scores = scores + tensors["attention_bias"].astype(wide)  # type: ignore[union-attr]
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs = probs / probs.sum(-1, keepdims=True)
        y = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, sequence, sizes[2])
        if k.shape != v.shape:
            return [y.astype(x.dtype)]
        return [y.astype(x.dtype), np.stack([k, v]).astype(x.dtype)]


PATTERNS = [Attention()]
