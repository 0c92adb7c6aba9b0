"""ONNX Runtime's com.microsoft MultiHeadAttention (separate Q, K, V: ORT's optimizer for
encoder-decoder and diffusion models, cross-attention) as standard MatMul/Softmax/MatMul.

Matches ``MultiHeadAttention(query, key, value[, bias][, key_padding_mask]
[, attention_bias][, past_key][, past_value]; num_heads, scale, mask_filter_value=-10000,
unidirectional=0)`` -> ``output[, present_key][, present_value]`` (the schema ONNX Runtime
1.32 registers; docs/ContribOperators.md), with the numbers of its CPU kernel (tested
against it):
- query (B, S, D), key (B, L, D), value (B, L, Dv); ``bias`` (D + D + Dv,) added to Q, K, V
  before the heads split (each (B, N, ., head size));
- ``past_key`` / ``past_value`` (B, N, P, head) are prepended to K and V; the presents are
  the new (B, N, P + L, head);
- ``scores = Q K^T * scale`` (default ``1 / sqrt(head size)``) plus, as in
  :mod:`.contrib_attention` (shared code): ``mask_filter_value`` where ``key_padding_mask``
  forbids a key ((B,) key lengths, or (B, T) / (B, S, T) raw masks, 0 = masked), where
  ``unidirectional`` forbids a later key, and ``attention_bias`` (B or 1, N or 1, S, T);
- ``output = softmax(scores) V``, heads merged: (B, S, N * v head size).

Refused with the reason: packed forms (query (B, S, N, 3, H) with no key, key (B, L, N, 2,
H)), key and value already split into heads (4-D, cross-attention caches), the
``past_sequence_length`` / ``cache_indirection`` (beam search) inputs and the ``qk``
output: not pinned against the kernel yet. float16 and bfloat16 are computed in float32.

Envelope: opsets 11+ (bfloat16 13+); D, Dv static and divisible by num_heads; B, S, L and
the past length dynamic. ``--target ort`` keeps the node.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from .contrib_attention import Attention
from .contrib_attention import Facts as AttentionFacts

MS = frozenset({"com.microsoft"})
_TYPES = (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT)
_NARROW = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


class Facts(NamedTuple):
    elem_type: int
    heads: int
    sizes: tuple[int, int, int]
    scale: float
    mask: str | None


class MultiHeadAttention(Pattern[Facts]):
    op_type = "MultiHeadAttention"
    forms = (Form("MultiHeadAttention", domains=MS, inputs=(
        In("query"), In("key", optional=True), In("value", optional=True),
        In("bias", optional=True), In("mask_index", optional=True),
        In("attention_bias", optional=True), In("past_key", optional=True),
        In("past_value", optional=True), In("past_sequence_length", optional=True),
        In("cache_indirection", optional=True)), attributes={
        "num_heads": Attr("int"), "scale": Attr("float", default=None),
        "mask_filter_value": Attr("float", default=-10000.0),
        "unidirectional": Attr("int", default=0, choices=(0, 1))}, outputs=(1, 3)),)
    examples = (
        Example((("q", F, ("B", "S", 8)), ("k", F, ("B", "L", 8)), ("v", F, ("B", "L", 8))),
                attrs={"num_heads": 2}, domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        args = node.args
        heads = int(args["num_heads"])
        if heads <= 0:
            raise Reject(f"num_heads must be positive, got {heads}")
        for name, why in (("past_sequence_length", "a shared past/present buffer"),
                          ("cache_indirection", "beam search's cache indirection")):
            if node.tensor(name):
                raise Reject(f"{name} ({why}) is not supported")
        if len(node.outputs) > 3:
            raise Reject("the qk output is not supported")
        if not node.tensor("key") or not node.tensor("value"):
            raise Reject("packed QKV (a query with no key/value) is not supported")
        elem_type = require_type(ctx, node.tensor("query"), "query", _TYPES)
        if elem_type == TensorProto.BFLOAT16 and ctx.opset < 13:
            raise Reject("bfloat16 needs opset 13 or newer")
        for name in ("key", "value", "bias", "attention_bias", "past_key", "past_value"):
            if node.tensor(name):
                require_type(ctx, node.tensor(name), name, (elem_type,))
        query = require_shape(ctx, node.tensor("query"), "query", "(B, S, D)", 3, 3)
        key = require_shape(ctx, node.tensor("key"), "key", "(B, L, D)", 3, 5)
        value = require_shape(ctx, node.tensor("value"), "value", "(B, L, Dv)", 3, 5)
        if len(key) != 3 or len(value) != 3:
            raise Reject("key/value split into heads (4-D) or packed (5-D) are not supported")
        dims = (query[2], key[2], value[2])
        sizes = tuple(size for size in dims if isinstance(size, int) and size > 0
                      and size % heads == 0)
        if len(sizes) != 3:
            raise Reject(f"hidden sizes {list(dims)} must be static multiples of num_heads "
                         f"{heads}")
        if sizes[0] != sizes[1]:
            raise Reject(f"query and key hidden sizes differ ({sizes[0]}, {sizes[1]})")
        scale = args["scale"]
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(sizes[0] // heads)
        mask = Attention._mask_form(node, ctx, query, start_positions=False)
        return Facts(elem_type, heads, (sizes[0], sizes[1], sizes[2]), scale, mask)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        narrow = facts.elem_type in _NARROW
        dtype = np.dtype(np.float32) if narrow else numpy_dtype(facts.elem_type)
        original = numpy_dtype(facts.elem_type)

        def read(name: str) -> Value | None:
            if not node.tensor(name):
                return None
            value = b.input(node.tensor(name), original)
            return b.Cast(value, dtype, hint=f"{name}_f32") if narrow else value

        q, k, v = read("query"), read("key"), read("value")
        assert q is not None and k is not None and v is not None
        bias = read("bias")
        if bias is not None:
            bq, bk, bv = b.Split(bias, list(facts.sizes), axis=0, hint="bias_parts")
            q, k, v = (b.Add(q, bq, hint="q_bias"), b.Add(k, bk, hint="k_bias"),
                       b.Add(v, bv, hint="v_bias"))
        heads = facts.heads

        def split_heads(value: Value, source: Value, size: int, label: str) -> Value:
            target = b.Concat(b.Shape(source, 0, 2, hint=f"{label}_rows"),
                              np.array([heads, size // heads], np.int64), axis=0,
                              hint=f"{label}_heads_shape")
            return b.Transpose(b.Reshape(value, target, hint=f"{label}_heads"), [0, 2, 1, 3],
                               hint=f"{label}_bnsh")

        query = q
        q = split_heads(q, query, facts.sizes[0], "q")
        k = split_heads(k, k, facts.sizes[1], "k")
        v = split_heads(v, v, facts.sizes[2], "v")
        past_key, past_value = read("past_key"), read("past_value")
        if past_key is not None:
            k = b.Concat(past_key, k, axis=2, hint="k_all")
        if past_value is not None:
            v = b.Concat(past_value, v, axis=2, hint="v_all")
        outputs = list(node.outputs) + ["", ""]
        for value, out in ((k, outputs[1]), (v, outputs[2])):
            if out:
                b.Cast(value, original, out=out) if narrow else b.Identity(value, out=out)
        scores = b.Mul(b.MatMul(q, b.Transpose(k, [0, 1, 3, 2], hint="k_t"), hint="qk"),
                       np.asarray(facts.scale, dtype), hint="scores")
        shared = AttentionFacts(facts.elem_type, heads, facts.sizes, facts.scale, facts.mask)
        for term in Attention._additive_terms(b, node, shared, query, k, dtype, read):
            scores = b.Add(scores, term, hint="masked_scores")
        probs = b.Softmax(scores, -1, hint="probs")
        merged = b.Concat(b.Shape(query, 0, 2, hint="output_rows"),
                          np.array([facts.sizes[2]], np.int64), axis=0, hint="output_shape")
        context = b.Transpose(b.MatMul(probs, v, hint="context"), [0, 2, 1, 3],
                              hint="context_bsnh")
        y = b.Reshape(context, merged, hint="output", out=None if narrow else outputs[0])
        if narrow:
            b.Cast(y, original, out=outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        shape = ctx.shape(node.tensor("query"))
        batch, sequence = (shape[0], shape[1]) if shape else (None, None)
        head = [facts.sizes[1] // facts.heads, facts.sizes[2] // facts.heads]
        types: list[OutputType] = [(facts.elem_type, [batch, sequence, facts.sizes[2]])]
        for index in (1, 2):
            if len(node.outputs) > index:
                types.append((facts.elem_type, [batch, facts.heads, None, head[index - 1]]))
        return types

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        q, k, v = tensors["query"], tensors["key"], tensors["value"]
        assert q is not None and k is not None and v is not None
        dtype = q.dtype
        wide = [t.astype(np.float64) for t in (q, k, v)]
        heads = int(args["num_heads"])
        bias = tensors.get("bias")
        if bias is not None:
            sizes = [t.shape[-1] for t in wide]
            parts = np.split(bias.astype(np.float64), np.cumsum(sizes)[:-1])
            wide = [t + p for t, p in zip(wide, parts, strict=True)]

        def heads_of(t: np.ndarray) -> np.ndarray:
            return t.reshape(t.shape[0], t.shape[1], heads, -1).transpose(0, 2, 1, 3)

        qh, kh, vh = (heads_of(t) for t in wide)
        if tensors.get("past_key") is not None:
            kh = np.concatenate([tensors["past_key"].astype(np.float64), kh], 2)  # type: ignore[union-attr]
        if tensors.get("past_value") is not None:
            vh = np.concatenate([tensors["past_value"].astype(np.float64), vh], 2)  # type: ignore[union-attr]
        scale = args["scale"] if args["scale"] is not None else 1 / math.sqrt(qh.shape[-1])
        scores = qh @ kh.transpose(0, 1, 3, 2) * scale
        filtered = float(args["mask_filter_value"])
        total, sequence = kh.shape[2], qh.shape[2]
        mask = tensors.get("mask_index")
        if mask is not None:
            if mask.ndim == 1:
                keep = np.arange(total)[None, :] < mask[:, None]
                scores = scores + np.where(keep, 0.0, filtered)[:, None, None, :]
            elif mask.ndim == 2:
                scores = scores + ((1 - mask) * filtered)[:, None, None, :]
            else:
                scores = scores + ((1 - mask) * filtered)[:, None, :, :]
        if args["unidirectional"]:
            past = total - sequence
            later = np.arange(total)[None, :] > (np.arange(sequence)[:, None] + past)
            scores = scores + np.where(later, filtered, 0.0)
        if tensors.get("attention_bias") is not None:
            scores = scores + tensors["attention_bias"].astype(np.float64)  # type: ignore[union-attr]
        scores = scores - scores.max(-1, keepdims=True)
        probs = np.exp(scores)
        probs = probs / probs.sum(-1, keepdims=True)
        out = (probs @ vh).transpose(0, 2, 1, 3).reshape(q.shape[0], sequence, -1)
        return [out.astype(dtype), kh.astype(dtype), vh.astype(dtype)]


PATTERNS = [MultiHeadAttention()]
