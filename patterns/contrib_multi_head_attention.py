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

Other layouts: key and value already split into heads, (B, N, L, head) (cross-attention
caches; ``bias`` is then added to Q only, as the kernel does: pinned); packed QKV, a query
(B, S, N, 3, H) with no key or value, and packed KV, a key (B, L, N, 2, H) with no value, as
docs/ContribOperators.md lays them out (ONNX Runtime runs them on CUDA only: "not implemented
for CPU"; tested against torch), without ``bias`` (refused: nothing to pin it against).

Refused with the reason: the ``past_sequence_length`` / ``cache_indirection`` (beam search)
inputs and the ``qk`` output. float16 and bfloat16 are computed in float32.

Envelope: opsets 11+ (bfloat16 13+); D, Dv static and divisible by num_heads; B, S, L and
the past length dynamic. ``--target ort`` keeps the node.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._compute import ComputeType
from .contrib_attention import Attention
from .contrib_attention import Facts as AttentionFacts

MS = frozenset({"com.microsoft"})
_TYPES = (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT)


class Facts(NamedTuple):
    elem_type: int
    heads: int
    sizes: tuple[int, int, int]
    scale: float
    mask: str | None
    layout: str  # "separate", "packed_qkv", "packed_kv" or "heads_kv" (4-D key/value)


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
        elem_type = require_type(ctx, node.tensor("query"), "query", _TYPES)
        if elem_type == TensorProto.BFLOAT16 and ctx.opset < 13:
            raise Reject("bfloat16 needs opset 13 or newer")
        for name in ("key", "value", "bias", "attention_bias", "past_key", "past_value"):
            if node.tensor(name):
                require_type(ctx, node.tensor(name), name, (elem_type,))
        query = require_shape(ctx, node.tensor("query"), "query", "(B, S, D) or (B, S, N, 3, H)",
                              3, 5)
        layout, sizes = self._layout(node, ctx, query, heads)
        scale = args["scale"]
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(sizes[0] // heads)
        mask = Attention._mask_form(node, ctx, query, start_positions=False)
        return Facts(elem_type, heads, sizes, scale, mask, layout)

    @staticmethod
    def _layout(node: MatchedNode, ctx: MatchContext, query: Any, heads: int
                ) -> tuple[str, tuple[int, int, int]]:
        """The Q/K/V layout and the hidden sizes (D, D, Dv)."""
        has_key, has_value = bool(node.tensor("key")), bool(node.tensor("value"))
        key = require_shape(ctx, node.tensor("key"), "key", "(B, L, D)", 3, 5) \
            if has_key else None
        if len(query) == 5 or key is not None and len(key) == 5:
            packed = query if len(query) == 5 else key
            assert packed is not None
            kind = "packed_qkv" if len(query) == 5 else "packed_kv"
            parts = 3 if kind == "packed_qkv" else 2
            if (kind == "packed_qkv" and (has_key or has_value)) or \
                    (kind == "packed_kv" and has_value):
                raise Reject(f"a packed {'QKV query' if parts == 3 else 'KV key'} comes "
                             f"without {'key and value' if parts == 3 else 'value'}")
            if len(query) != (5 if kind == "packed_qkv" else 3) or packed[2] != heads or \
                    packed[3] != parts or not isinstance(packed[4], int):
                raise Reject(f"a packed {'QKV' if parts == 3 else 'KV'} input must be "
                             f"(B, L, {heads}, {parts}, static head size), got {list(packed)}")
            if node.tensor("bias"):
                raise Reject("bias with packed inputs is not supported (ONNX Runtime's CPU "
                             "kernel has no packed forms to pin it against)")
            size = heads * packed[4]
            if kind == "packed_kv" and query[2] != size:
                raise Reject(f"the query's hidden size {query[2]} must be num_heads * the "
                             f"packed head size ({size})")
            return kind, (size, size, size)
        if len(query) != 3 or key is None or not has_value:
            raise Reject("key and value are needed unless the query is packed QKV "
                         "(B, S, N, 3, H) or the key packed KV (B, L, N, 2, H)")
        value = require_shape(ctx, node.tensor("value"), "value", "(B, L, Dv)", 3, 4)
        if len(key) == 4 and len(value) == 4:
            if key[1] != heads or value[1] != heads or not isinstance(key[3], int) or \
                    not isinstance(value[3], int):
                raise Reject(f"key/value split into heads must be (B, {heads}, L, static "
                             f"head size), got {list(key)} and {list(value)}")
            dims: tuple[Any, ...] = (query[2], heads * key[3], heads * value[3])
            layout = "heads_kv"
        elif len(key) == 3 and len(value) == 3:
            dims, layout = (query[2], key[2], value[2]), "separate"
        else:
            raise Reject(f"key and value must both be 3-D or both 4-D (split into heads), "
                         f"got ranks {len(key)} and {len(value)}")
        sizes = tuple(size for size in dims if isinstance(size, int) and size > 0
                      and size % heads == 0)
        if len(sizes) != 3:
            raise Reject(f"hidden sizes {list(dims)} must be static multiples of num_heads "
                         f"{heads}")
        if sizes[0] != sizes[1]:
            raise Reject(f"query and key hidden sizes differ ({sizes[0]}, {sizes[1]})")
        return layout, (sizes[0], sizes[1], sizes[2])

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        compute = ComputeType(b, node, facts.elem_type)
        narrow, dtype, original, read = (compute.narrow, compute.dtype, compute.original,
                                         compute.read)

        heads = facts.heads
        query = read("query")
        assert query is not None

        def split_heads(value: Value, source: Value, size: int, label: str) -> Value:
            target = b.Concat(b.Shape(source, 0, 2, hint=f"{label}_rows"),
                              np.array([heads, size // heads], np.int64), axis=0,
                              hint=f"{label}_heads_shape")
            return b.Transpose(b.Reshape(value, target, hint=f"{label}_heads"), [0, 2, 1, 3],
                               hint=f"{label}_bnsh")

        def unpack(packed: Value, count: int, label: str) -> list[Value]:
            """(B, L, N, count, H) -> count tensors (B, N, L, H)."""
            return [b.Transpose(b.Squeeze(part, [3], hint=f"{label}{i}_squeezed"),
                                [0, 2, 1, 3], hint=f"{label}{i}_bnsh")
                    for i, part in enumerate(b.Split(packed, [1] * count, axis=3,
                                                     hint=f"{label}_parts"))]

        bias = read("bias")
        bias_parts: list[Value | None] = [None, None, None]
        if bias is not None:
            bias_parts = list(b.Split(bias, list(facts.sizes), axis=0, hint="bias_parts"))
        if facts.layout == "packed_qkv":
            q, k, v = unpack(query, 3, "qkv")
        else:
            q_in = query if bias_parts[0] is None else b.Add(query, bias_parts[0],
                                                             hint="q_bias")
            q = split_heads(q_in, query, facts.sizes[0], "q")
            key, value = read("key"), read("value")
            assert key is not None
            if facts.layout == "packed_kv":
                k, v = unpack(key, 2, "kv")
            elif facts.layout == "heads_kv":  # already projected: the bias is Q's only
                assert value is not None
                k, v = key, value
            else:
                assert value is not None
                if bias_parts[1] is not None and bias_parts[2] is not None:
                    key = b.Add(key, bias_parts[1], hint="k_bias")
                    value = b.Add(value, bias_parts[2], hint="v_bias")
                k = split_heads(key, key, facts.sizes[1], "k")
                v = split_heads(value, value, facts.sizes[2], "v")
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
        y = b.Reshape(context, merged, hint="output", out=compute.direct(outputs[0]))
        compute.finish(y, outputs[0])

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
        query, key, value = tensors["query"], tensors["key"], tensors["value"]
        assert query is not None
        dtype = query.dtype
        heads = int(args["num_heads"])
        bias = tensors.get("bias")

        def heads_of(t: np.ndarray) -> np.ndarray:
            return t.reshape(t.shape[0], t.shape[1], heads, -1).transpose(0, 2, 1, 3)

        def unpacked(t: np.ndarray, index: int) -> np.ndarray:  # (B, L, N, n, H) -> BNSH
            return t[:, :, :, index].astype(np.float64).transpose(0, 2, 1, 3)

        if query.ndim == 5:  # packed QKV
            qh, kh, vh = (unpacked(query, i) for i in range(3))
        else:
            q = query.astype(np.float64)
            width = q.shape[-1]
            if bias is not None:
                q = q + bias[:width]
            qh = heads_of(q)
            assert key is not None
            if key.ndim == 5:  # packed KV
                kh, vh = unpacked(key, 0), unpacked(key, 1)
            elif key.ndim == 4:  # split into heads already: no bias
                assert value is not None
                kh, vh = key.astype(np.float64), value.astype(np.float64)
            else:
                assert value is not None
                k, v = key.astype(np.float64), value.astype(np.float64)
                if bias is not None:
                    k = k + bias[width:2 * width]
                    v = v + bias[2 * width:]
                kh, vh = heads_of(k), heads_of(v)
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
        out = (probs @ vh).transpose(0, 2, 1, 3).reshape(query.shape[0], sequence, -1)
        return [out.astype(dtype), kh.astype(dtype), vh.astype(dtype)]


PATTERNS = [MultiHeadAttention()]
