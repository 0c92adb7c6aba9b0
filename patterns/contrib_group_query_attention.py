"""ONNX Runtime's com.microsoft GroupQueryAttention (the decoder attention the onnxruntime-genai
model builder writes for Llama-, Mistral-, Phi- and Qwen-like models: grouped KV heads, a KV
cache, rotary embedding inside) as standard ops.

Matches ``GroupQueryAttention(query[, key][, value][, past_key][, past_value], seqlens_k,
total_sequence_length[, cos_cache][, sin_cache][, position_ids][, attention_bias]
[, head_sink]; num_heads, kv_num_heads, scale, softcap, local_window_size, do_rotary,
rotary_interleaved, smooth_softmax, causal)`` -> ``output[, present_key][, present_value]``
with the inputs and attributes of the schema ONNX Runtime 1.32 registers and the numbers of its
CPU kernel (group_query_attention.cc, gqa_attention_base.h and group_query_attention_helper.h
in microsoft/onnxruntime; every rule below was pinned by running the kernel). With N =
num_heads, Nk = kv_num_heads, h the head size and, per batch row b, T_b = seqlens_k[b] + 1
(the tokens in the cache after this step):
- ``query`` (B, S, N h) with ``key``/``value`` (B, S, Nk h), or packed (B, S, (N + 2 Nk) h)
  laid out [Q | K | V]; query head n reads KV head ``n // (N / Nk)``;
- the step is a **first prompt** when S equals ``total_sequence_length``: nothing was cached
  before it (P_b = 0, ``past_key`` ignored); otherwise P_b = T_b - S tokens were;
- ``do_rotary``: Q and the new K (not V, not the past) are turned by RoPE with
  ``cos_cache``/``sin_cache`` (positions, r / 2), the first r dims of each head, at position
  P_b + s, or ``position_ids[b, s]`` when given (in a first prompt only ``position_ids[0, 0]
  + s``, as the kernel reads it); the rotation is :func:`contrib_rotary.rotate`;
- ``present_key``/``present_value`` (B, Nk, C, h) with C = max(total_sequence_length, past
  length): rows [0, P_b) from the past, rows [P_b, P_b + S) the new K/V (after rotary;
  right padding rows of a prompt included), every other row **zero**;
- query s sits at P_b + s and sees keys [e - W, e) with e = min(P_b + s + 1, T_b) (``causal``
  1) or e = T_b (``causal`` 0), W = ``local_window_size`` (-1: from key 0);
- ``scores = scale * q k^T`` (default ``1 / sqrt(h)``), then ``softcap * tanh(scores /
  softcap)`` when softcap > 0, then ``attention_bias`` (B or 1, N or 1, S, total length) is
  added, the keys outside the window are dropped, and a softmax with one extra logit
  ``head_sink[n]`` (or 0 with ``smooth_softmax`` 1) when either is given;
- ``output`` (B, S, N h): the softmax times V, heads merged.

Refused, with the reason: ``qk_output`` and the ``output_qk`` output (a fourth output: "1 to
3 outputs"), a quantized cache (``k_scale``/``v_scale``, quant types other than NONE),
``q_norm_weight``/``k_norm_weight`` (the CPU kernel refuses them too), ``query_seqlens``,
``sliding_window_cache``,
``local_window_size`` 0 (every row empty) and a window with ``causal`` 0 (the schema forbids
it). Rows of a right-padded prompt past T_b are unspecified by the schema; these give what
the kernel's default (flash) path gives.

Before -> after::

    GroupQueryAttention(qkv, past_k, past_v, seqlens_k, total, cos, sin)
      ->  Split -> Q, K, V;  RoPE(Q), RoPE(K) at positions P_b + s
          rows = Gather(Concat(past, K_new, zero row) flattened over (B, Nk),
                        the source row of each (b, n, j), j < L + S)
          Softmax(MatMul(Q grouped by KV head: (B, Nk, G S, h), rows^T) * scale
                  + Where(window, 0, -inf))      # rank 4: OpenVINO fuses it
          -> MatMul(., V rows) -> heads merged;  present = rows[:, :, :C]

ONNX's own Attention (opset 23) is not emitted: TVM 0.27's converter fails on it
("'num_heads'", measured), and it has no per-row cache offset P_b. The speed of this form
against the kernel is in docs/performance.md.

float16 and bfloat16 are computed in float32 and rounded once (the kernel accumulates in
float32). Envelope: opsets 11+ (bfloat16 13+); query of rank 3 with a static last dim; the
cos/sin caches' last dim static; batch, sequence, cache and total lengths dynamic.
``--target ort`` keeps the node.
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
from .contrib_rotary import rotate, rotate_numpy

MS = frozenset({"com.microsoft"})
_TYPES = (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT)
_REFUSED_INPUTS = (("k_scale", "a quantized KV cache"), ("v_scale", "a quantized KV cache"),
                   ("q_norm_weight", "per-head Q/K RMS normalization"),
                   ("k_norm_weight", "per-head Q/K RMS normalization"),
                   ("query_seqlens", "right-padded query chunks"))


class Facts(NamedTuple):
    elem_type: int
    heads: int
    kv_heads: int
    head: int
    packed: bool
    rotary: int  # rotated dims; 0 without do_rotary
    scale: float
    bias_heads: int  # attention_bias's heads dim: num_heads or 1 (0: no bias)
    past_head_static: bool  # the past's declared head size is a number


class GroupQueryAttention(Pattern[Facts]):
    op_type = "GroupQueryAttention"
    forms = (Form("GroupQueryAttention", domains=MS, inputs=(
        In("query"), In("key", optional=True), In("value", optional=True),
        In("past_key", optional=True), In("past_value", optional=True), In("seqlens_k"),
        In("total_sequence_length"), In("cos_cache", optional=True),
        In("sin_cache", optional=True), In("position_ids", optional=True),
        In("attention_bias", optional=True), In("head_sink", optional=True),
        In("k_scale", optional=True), In("v_scale", optional=True),
        In("q_norm_weight", optional=True), In("k_norm_weight", optional=True),
        In("query_seqlens", optional=True)), attributes={
        "num_heads": Attr("int"), "kv_num_heads": Attr("int"),
        "scale": Attr("float", default=None), "softcap": Attr("float", default=0.0),
        "local_window_size": Attr("int", default=-1),
        "do_rotary": Attr("int", default=0, choices=(0, 1)),
        "rotary_interleaved": Attr("int", default=0, choices=(0, 1)),
        "smooth_softmax": Attr("int", default=-1),
        "causal": Attr("int", default=1, choices=(0, 1)),
        "qk_output": Attr("int", default=0, choices=(0,)),
        "sliding_window_cache": Attr("int", default=0, choices=(0,)),
        "k_quant_type": Attr("string", default="NONE", choices=("NONE",)),
        "v_quant_type": Attr("string", default="NONE", choices=("NONE",)),
        "kv_cache_bit_width": Attr("int", default=None),
        "qk_norm_epsilon": Attr("float", default=None),
        "q_norm_epsilon": Attr("float", default=None),
        "k_norm_epsilon": Attr("float", default=None)}, outputs=(1, 3)),)
    examples = (
        Example((("qkv", F, ("B", "S", 32)), ("past_key", F, ("B", 1, "P", 8)),
                 ("past_value", F, ("B", 1, "P", 8)), ("seqlens_k", I32, ("B",)),
                 ("total", I32, ())), outputs=((TensorProto.FLOAT, 3),
                                               (TensorProto.FLOAT, 4),
                                               (TensorProto.FLOAT, 4)),
                args=("qkv", "", "", "past_key", "past_value", "seqlens_k", "total"),
                attrs={"num_heads": 2, "kv_num_heads": 1}, domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        args = node.args
        heads, kv_heads = int(args["num_heads"]), int(args["kv_num_heads"])
        if heads <= 0 or kv_heads <= 0 or heads % kv_heads:
            raise Reject(f"num_heads {heads} must be a positive multiple of kv_num_heads "
                         f"{kv_heads}")
        for name, why in _REFUSED_INPUTS:
            if node.tensor(name):
                raise Reject(f"{name} ({why}) is not supported")
        window = int(args["local_window_size"])
        if window == 0 or window < -1:
            raise Reject(f"local_window_size {window} leaves no key to attend to; use -1 or "
                         f"a positive window")
        if window > 0 and not args["causal"]:
            raise Reject("local_window_size needs causal 1 (the schema's rule)")
        elem_type = require_type(ctx, node.tensor("query"), "query", _TYPES)
        if elem_type == TensorProto.BFLOAT16 and ctx.opset < 13:
            raise Reject("bfloat16 needs opset 13 or newer")
        for name in ("key", "value", "past_key", "past_value", "cos_cache", "sin_cache",
                     "attention_bias", "head_sink"):
            if node.tensor(name):
                require_type(ctx, node.tensor(name), name, (elem_type,))
        for name in ("seqlens_k", "total_sequence_length"):
            require_type(ctx, node.tensor(name), name, (TensorProto.INT32,))
        if node.tensor("position_ids"):
            require_type(ctx, node.tensor("position_ids"), "position_ids",
                         (TensorProto.INT64,))
        query = require_shape(ctx, node.tensor("query"), "query", "(B, S, D)", 3, 3)
        packed = not node.tensor("key")
        if packed != (not node.tensor("value")):
            raise Reject("key and value must be given together")
        if bool(node.tensor("past_key")) != bool(node.tensor("past_value")):
            raise Reject("past_key and past_value must be given together")
        width = query[2]
        parts = heads + 2 * kv_heads if packed else heads
        if not isinstance(width, int) or width <= 0 or width % parts:
            raise Reject(f"the query's last dim {width} must be static and a multiple of "
                         f"{'num_heads + 2 kv_num_heads' if packed else 'num_heads'} "
                         f"({parts})")
        head = width // parts
        if not packed:
            for name in ("key", "value"):
                dims = require_shape(ctx, node.tensor(name), name, "(B, S, Nk h)", 3, 3)
                if dims[2] != kv_heads * head:
                    raise Reject(f"{name}'s last dim must be kv_num_heads * head size "
                                 f"({kv_heads * head}), got {dims[2]}")
        past_head_static = True
        if node.tensor("past_key"):
            for name in ("past_key", "past_value"):
                dims = require_shape(ctx, node.tensor(name), name, "(B, Nk, L, h)", 4, 4)
                past_head_static = past_head_static and isinstance(dims[3], int)
                if any(isinstance(got, int) and got != want
                       for got, want in ((dims[1], kv_heads), (dims[3], head))):
                    raise Reject(f"{name} must be (B, {kv_heads}, L, {head}), got "
                                 f"{list(dims)}")
        rotary = 0
        if args["do_rotary"]:
            if not node.tensor("cos_cache") or not node.tensor("sin_cache"):
                raise Reject("do_rotary needs cos_cache and sin_cache")
            cache = require_shape(ctx, node.tensor("cos_cache"), "cos_cache",
                                  "(positions, rotary dim / 2)", 2, 2)
            if not isinstance(cache[1], int) or not 0 < 2 * cache[1] <= head:
                raise Reject(f"the caches' last dim must be static and at most half the head "
                             f"size {head}, got {cache[1]}")
            rotary = 2 * cache[1]
        if node.tensor("position_ids"):
            require_shape(ctx, node.tensor("position_ids"), "position_ids", "(B, S)", 2, 2)
        bias_heads = 0
        if node.tensor("attention_bias"):
            dims = require_shape(ctx, node.tensor("attention_bias"), "attention_bias",
                                 "(B or 1, N or 1, S, total)", 4, 4)
            if dims[1] not in (1, heads):
                raise Reject(f"attention_bias's heads dim must be static, 1 or {heads}; got "
                             f"{dims[1]}")
            bias_heads = int(dims[1])
        if node.tensor("head_sink"):
            require_shape(ctx, node.tensor("head_sink"), "head_sink", "(num_heads,)", 1, 1)
        scale = args["scale"]
        scale = float(scale) if scale else 1.0 / math.sqrt(head)
        return Facts(elem_type, heads, kv_heads, head, packed, rotary, scale, bias_heads,
                     past_head_static)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        compute = ComputeType(b, node, facts.elem_type)
        narrow, dtype, read = compute.narrow, compute.dtype, compute.read
        heads, kv_heads, head = facts.heads, facts.kv_heads, facts.head
        i64 = np.dtype(np.int64)

        query = read("query")
        assert query is not None
        if facts.packed:
            q, k, v = b.Split(query, [heads * head, kv_heads * head, kv_heads * head],
                              axis=-1, hint="qkv_parts")
        else:
            k_in, v_in = read("key"), read("value")
            assert k_in is not None and v_in is not None
            q, k, v = query, k_in, v_in
        rows = b.Shape(query, 0, 2, hint="batch_sequence")  # [B, S]
        batch_dim = b.Shape(query, 0, 1, hint="batch_dim")  # [B]
        sequence_dim = b.Shape(query, 1, 2, hint="sequence_dim")  # [S]

        def split_heads(value: Value, count: int, label: str) -> Value:  # (B, S, n, h)
            target = b.Concat(rows, np.array([count, head], np.int64), axis=0,
                              hint=f"{label}_heads_shape")
            return b.Reshape(value, target, hint=f"{label}_heads")

        q, k, v = split_heads(q, heads, "q"), split_heads(k, kv_heads, "k"), \
            split_heads(v, kv_heads, "v")

        # Lengths, as (1,) or (B,) int64: S, the total, T_b, the first-prompt flag, P_b.
        # Sizes meeting arithmetic are gathered from the shape (TVM folds a static Shape
        # slice into a shape value that its Equal/Max converters refuse).
        query_shape = b.Shape(query, hint="query_shape")
        sequence = b.Gather(query_shape, [1], hint="sequence")
        # (1,) by broadcasting, not Reshape: TVM folds a static total into a scalar value
        # that its Reshape (and Max) refuse, but adds it to a tensor.
        total = b.Add(b.Cast(b.input(node.tensor("total_sequence_length"), np.int32), i64,
                             hint="total_i64"), np.zeros(1, i64), hint="total")
        lengths = b.Add(b.Cast(b.input(node.tensor("seqlens_k"), np.int32), i64,
                               hint="seqlens_i64"), np.asarray(1, i64), hint="lengths")  # T_b
        first_prompt = b.Equal(sequence, total, hint="first_prompt")
        cached = b.Where(first_prompt, np.zeros(1, i64),
                         b.Sub(lengths, sequence, hint="cached_if_not_prompt"),
                         hint="cached")  # P_b, (B,)
        cached_col = b.Unsqueeze(cached, [1], hint="cached_col")  # (B, 1)
        steps = positions(b, sequence_dim, 0, i64, hint="steps")  # (S,)
        steps_row = b.Unsqueeze(steps, [0], hint="steps_row")  # (1, S)

        if facts.rotary:
            ids = b.input(node.tensor("position_ids"), np.int64) \
                if node.tensor("position_ids") else None
            if ids is None:
                where = b.Add(cached_col, steps_row, hint="rotary_positions")  # (B, S)
            else:
                start = b.Slice(ids, [0, 0], [1, 1], [0, 1], hint="first_position")
                where = b.Where(first_prompt, b.Add(start, steps_row, hint="prompt_positions"),
                                ids, hint="rotary_positions")
            cos_cache, sin_cache = read("cos_cache"), read("sin_cache")
            assert cos_cache is not None and sin_cache is not None
            cos = b.Unsqueeze(b.Gather(cos_cache, where, axis=0, hint="cos"), [2],
                              hint="cos_heads")  # (B, S, 1, r/2)
            sin = b.Unsqueeze(b.Gather(sin_cache, where, axis=0, hint="sin"), [2],
                              hint="sin_heads")
            interleaved = bool(node.args["rotary_interleaved"])
            # Reshaped to their own shapes: TVM loses the shape through the gathered cos/sin.
            q = b.Reshape(rotate(b, q, cos, sin, facts.rotary, head, interleaved),
                          b.Shape(q, hint="q_shape"), hint="q_rotated")
            k = b.Reshape(rotate(b, k, cos, sin, facts.rotary, head, interleaved),
                          b.Shape(k, hint="k_shape"), hint="k_rotated")

        # The caches: rows [0, P_b) from the past, [P_b, P_b + S) new, the rest zero, C =
        # max(total, L) rows (L + S or L: ONNX Runtime refuses any other total with a
        # past). One Gather of whole rows from [past | new | one zero row] stacked along
        # the rows and flattened over (B, Nk, rows), for the R = L + S rows TVM can size
        # from shapes; rows at or after T_b are never visible.
        new_k = b.Transpose(k, [0, 2, 1, 3], hint="k_bnsh")  # (B, Nk, S, h)
        new_v = b.Transpose(v, [0, 2, 1, 3], hint="v_bnsh")
        past_k, past_v = read("past_key"), read("past_value")
        if past_k is not None and past_v is not None and not facts.past_head_static:
            # The head size as a constant (the genai builder declares it symbolic): TVM
            # cannot concatenate a symbolic dim with a static one.
            past_shape = b.Concat(b.Shape(past_k, 0, 3, hint="past_lead"),
                                  np.array([head], np.int64), axis=0, hint="past_4d")
            past_k = b.Reshape(past_k, past_shape, hint="past_k_sized")
            past_v = b.Reshape(past_v, past_shape, hint="past_v_sized")
        # (B, Nk, 1, h), sized from an input's shape where there is one (TVM cannot
        # concatenate what it cannot size)
        zero_row = b.ConstantOfShape(b.Concat(b.Shape(new_k if past_k is None else past_k,
                                                      0, 2, hint="batch_heads"),
                                              np.array([1, head], np.int64), axis=0,
                                              hint="zero_row_shape"), 0.0, dtype,
                                     hint="zero_row")
        parts_k, parts_v = [new_k, zero_row], [new_v, zero_row]
        past_length: Value | None = None
        capacity: Value | None = None
        if past_k is not None and past_v is not None:
            past_length = b.Gather(b.Shape(past_k, hint="past_shape"), [2], hint="past_length")
            parts_k.insert(0, past_k)
            parts_v.insert(0, past_v)
        stacked_k = b.Concat(*parts_k, axis=2, hint="k_rows")  # (B, Nk, R + 1, h)
        stacked_v = b.Concat(*parts_v, axis=2, hint="v_rows")
        stacked_rows = sequence if past_length is None else \
            b.Add(past_length, sequence, hint="stacked_rows")  # R
        # 0 .. R-1 as the past's rows then the new ones, each counted over an input's own
        # shape: TVM can size neither the stacked rows' Shape nor a sum of two shapes.
        # The past's count is an inclusive running sum minus one: onnx2torch's exclusive
        # CumSum fails on an empty past (a first prompt's).
        row = steps
        if past_k is not None and past_length is not None:
            past_rows = b.Sub(b.CumSum(b.ConstantOfShape(b.Shape(past_k, 2, 3,
                                                                 hint="past_rows_dim"),
                                                         1, i64, hint="past_ones"), 0,
                                       hint="past_count"), np.asarray(1, i64),
                              hint="past_rows")
            row = b.Concat(past_rows, b.Add(steps, past_length, hint="new_rows"), axis=0,
                           hint="cache_rows")
        row = b.Unsqueeze(row, [0], hint="cache_row")  # (1, R)
        offset = b.Sub(row, cached_col, hint="new_row")  # j - P_b, (B, R)
        source = b.Where(b.Less(offset, sequence, hint="is_new_or_past"),
                         offset if past_length is None else
                         b.Add(offset, past_length, hint="new_source"),
                         stacked_rows, hint="new_or_zero")  # the zero row past the new ones
        if past_length is not None:
            source = b.Where(b.Less(row, cached_col, hint="is_past"), row, source,
                             hint="source_row")
            # C = L + max(total - L, 0): TVM's Max and Where converters take no static total.
            beyond = b.Sub(total, past_length, hint="total_beyond_past")
            capacity = b.Add(past_length, b.Where(b.Less(beyond, np.zeros(1, i64),
                                                         hint="total_within_past"),
                                                  np.zeros(1, i64), beyond, hint="growth"),
                             hint="capacity")
        outputs = list(node.outputs) + ["", ""]
        # Flat row of (b, n, source): (b * Nk + n) * (R + 1) + source, (B, Nk, R); a Gather
        # of whole rows (not GatherND with batch_dims, which onnx2torch lacks).
        pairs = b.Add(b.Mul(b.Unsqueeze(positions(b, batch_dim, 0, i64, hint="batch_index"),
                                        [1, 2], hint="batch_b11"), np.asarray(kv_heads, i64),
                            hint="batch_first_head"),
                      np.arange(kv_heads, dtype=np.int64).reshape(1, kv_heads, 1),
                      hint="batch_head")  # (B, Nk, 1)
        flat_source = b.Add(b.Mul(pairs, b.Add(stacked_rows, np.asarray(1, i64),
                                               hint="stacked_rows_and_zero"),
                                  hint="pair_start"),
                            b.Unsqueeze(source, [1], hint="source_b1r"),
                            hint="flat_source")  # (B, Nk, R)

        def gather_rows(stacked: Value, label: str, out: str | None) -> Value:
            flat = b.Reshape(stacked, np.array([-1, head], np.int64), hint=f"{label}_flat")
            return b.Gather(flat, flat_source, axis=0, hint=f"{label}_cache", out=out)

        def cache(stacked: Value, label: str, out: str) -> Value:
            """The R cache rows attention runs on (TVM compiles no arithmetic on a run-time
            size such as C); the present output is their first C."""
            rows = gather_rows(stacked, label,
                               None if narrow or capacity is not None else out or None)
            if out:
                present = rows if capacity is None else \
                    b.Slice(rows, [0], capacity, [2], hint=f"present_{label}",
                            out=compute.direct(out))
                compute.finish(present, out)
            return rows

        present_k = cache(stacked_k, "k", outputs[1])
        present_v = cache(stacked_v, "v", outputs[2])

        # Each KV head against its group of G query heads in rank 4, the G heads' rows
        # stacked: Q (B, Nk, G S, h) x K^T (B, Nk, h, C). Rank 4 with the mask added (not
        # selected by a Where on the scores) is what OpenVINO compiles into its fused
        # attention kernel, and both engines run an Add over the scores faster than a Where
        # (docs/performance.md). G S is left to Reshape's -1: no shape is computed from it.
        group = heads // kv_heads
        q_heads = b.Transpose(q, [0, 2, 1, 3], hint="q_bnsh")  # (B, N, S, h)
        grouped = b.Reshape(q_heads, b.Concat(
            batch_dim, np.array([kv_heads, -1, head], np.int64),
            axis=0, hint="grouped_shape"), hint="q_grouped")  # (B, Nk, G S, h)
        keys_t = b.Transpose(present_k, [0, 1, 3, 2], hint="k_t")  # (B, Nk, h, C)
        scores = b.Mul(b.MatMul(grouped, keys_t, hint="qk"), np.asarray(facts.scale, dtype),
                       hint="scores")  # (B, Nk, G S, C)
        softcap = float(node.args["softcap"])
        if softcap > 0:
            scores = b.Mul(b.Tanh(b.Div(scores, np.asarray(softcap, dtype),
                                        hint="capped_in"), hint="capped"),
                           np.asarray(softcap, dtype), hint="softcapped")
        bias = read("attention_bias")
        if bias is not None:  # (B|1, N|1, S, total) -> (B|1, Nk|1, G S, C); the columns
            # from the total to C are never visible
            if facts.bias_heads == heads:  # head n = k G + g: rows (g, s) stack in order
                bias = b.Reshape(bias, b.Concat(b.Shape(bias, 0, 1, hint="bias_batch"),
                                                np.array([kv_heads, -1], np.int64),
                                                b.Shape(bias, 3, 4, hint="bias_width"),
                                                axis=0, hint="bias_4d_shape"), hint="bias_4d")
            elif group > 1:  # one head for all: the same rows for each of the G
                bias = b.Tile(bias, np.array([1, 1, group, 1], np.int64), hint="bias_rows")
            width = b.Sub(b.Gather(b.Shape(present_k, hint="present_shape"), [2],
                                   hint="present_rows"),
                          b.Gather(b.Shape(bias, hint="bias_shape"), [3], hint="bias_width"),
                          hint="bias_gap")
            pads = b.Concat(np.zeros(7, np.int64), width, axis=0, hint="bias_pads")
            scores = b.Add(scores, b.Pad(bias, pads, hint="bias_to_capacity"),
                           hint="biased_scores")
        # Visible keys [e - W, e), e = min(P_b + s + 1, T_b) (causal) or T_b.
        length_col = b.Unsqueeze(lengths, [1, 2], hint="length_b11")  # (B, 1, 1)
        if node.args["causal"]:
            reach = b.Add(b.Unsqueeze(b.Add(cached_col, steps_row, hint="query_position"),
                                      [2], hint="query_position_col"),
                          np.asarray(1, i64), hint="reach")  # (B, S, 1)
            end = b.Min(reach, length_col, hint="window_end")
        else:
            end = length_col
        key = b.Unsqueeze(row, [0], hint="key_b")  # (1, 1, C)
        visible = b.Less(key, end, hint="before_end")  # (B, S, C)
        window = int(node.args["local_window_size"])
        if window > 0:
            start = b.Sub(end, np.asarray(window, i64), hint="window_start")
            visible = b.And(visible, b.Not(b.Less(key, start, hint="before_start"),
                                           hint="after_start"), hint="in_window")
        # 0 where visible, -inf elsewhere, (B, 1, G S, C) (causal) or (B, 1, 1, C): every
        # row sees >= 1 key
        mask = b.Unsqueeze(b.Where(visible, np.zeros((), dtype), np.asarray(-np.inf, dtype),
                                   hint="mask"), [1], hint="mask_b1sc")
        if group > 1 and node.args["causal"]:
            mask = b.Tile(mask, np.array([1, 1, group, 1], np.int64), hint="mask_rows")
        scores = b.Add(scores, mask, hint="masked_scores")
        sink = read("head_sink")
        if sink is not None or int(node.args["smooth_softmax"]) == 1:
            # A softmax with one more logit (head_sink[n], or 0): exp(x - M) / (sum + exp(
            # extra - M)), M the larger of the row's max and the extra logit; in rank 5,
            # (B, Nk, G, S, C), where the logit of head n = k G + g broadcasts over S.
            shape_4d = b.Shape(scores, hint="scores_shape")
            scores = b.Reshape(scores, b.Concat(
                batch_dim, np.array([kv_heads, group], np.int64), sequence_dim,
                np.array([-1], np.int64), axis=0, hint="scores_5d_shape"), hint="scores_5d")
            top = b.ReduceMax(scores, [-1], keepdims=True, hint="row_max")  # finite: >= 1 key
            if sink is None:
                extra: Value | np.ndarray = np.zeros((1, 1, 1, 1, 1), dtype)
            else:
                extra = b.Reshape(sink, np.array([1, kv_heads, group, 1, 1], np.int64),
                                  hint="sink_5d")
            shift = b.Max(top, extra, hint="shift")
            weights = b.Exp(b.Sub(scores, shift, hint="shifted"), hint="weights")
            denominator = b.Add(b.ReduceSum(weights, [-1], keepdims=True, hint="weight_sum"),
                                b.Exp(b.Sub(extra, shift, hint="extra_shifted"),
                                      hint="extra_weight"), hint="denominator")
            probs = b.Reshape(b.Div(weights, denominator, hint="probs_5d"), shape_4d,
                              hint="probs")
        else:
            probs = b.Softmax(scores, -1, hint="probs")
        context = b.MatMul(probs, present_v, hint="context")  # (B, Nk, G S, h)
        context = b.Transpose(b.Reshape(context, b.Concat(
            batch_dim, np.array([heads], np.int64), sequence_dim,
            np.array([head], np.int64),
            axis=0, hint="context_shape"), hint="context_bnsh"), [0, 2, 1, 3],
            hint="context_bsnh")  # (B, S, N, h)
        merged = b.Concat(rows, np.array([heads * head], np.int64), axis=0,
                          hint="output_shape")
        y = b.Reshape(context, merged, hint="output", out=compute.direct(outputs[0]))
        compute.finish(y, outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        shape = ctx.shape(node.tensor("query"))
        batch, sequence = (shape[0], shape[1]) if shape else (None, None)
        types: list[OutputType] = [(facts.elem_type, [batch, sequence,
                                                      facts.heads * facts.head])]
        for _ in node.outputs[1:]:
            types.append((facts.elem_type, [batch, facts.kv_heads, None, facts.head]))
        return types

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        query = tensors["query"]
        assert query is not None
        heads, kv_heads = int(args["num_heads"]), int(args["kv_num_heads"])
        wide = query.astype(np.float64)
        batch, sequence, width = query.shape
        if tensors.get("key") is None:
            head = width // (heads + 2 * kv_heads)
            q, k, v = np.split(wide, [heads * head, (heads + kv_heads) * head], -1)
        else:
            head = width // heads
            q = wide
            k, v = (tensors[n].astype(np.float64) for n in ("key", "value"))  # type: ignore[union-attr]
        q = q.reshape(batch, sequence, heads, head)
        k = k.reshape(batch, sequence, kv_heads, head)
        v = v.reshape(batch, sequence, kv_heads, head)
        total = int(np.asarray(tensors["total_sequence_length"]).reshape(-1)[0])
        lengths = tensors["seqlens_k"].astype(np.int64) + 1  # type: ignore[union-attr]
        past_k, past_v = tensors.get("past_key"), tensors.get("past_value")
        past = 0 if past_k is None else past_k.shape[2]
        capacity = max(total, past)
        prompt = sequence == total
        cached = np.zeros(batch, np.int64) if prompt else lengths - sequence
        if args["do_rotary"]:
            cos, sin = (tensors[n].astype(np.float64) for n in ("cos_cache", "sin_cache"))  # type: ignore[union-attr]
            ids = tensors.get("position_ids")
            steps = np.arange(sequence)
            if ids is None:
                where = cached[:, None] + steps[None]
            elif prompt:
                where = np.broadcast_to(ids[0, 0] + steps[None], (batch, sequence))
            else:
                where = ids
            c, s = cos[where][:, :, None], sin[where][:, :, None]
            rotary = 2 * cos.shape[1]
            interleaved = bool(args["rotary_interleaved"])
            q = rotate_numpy(q, c, s, rotary, interleaved)
            k = rotate_numpy(k, c, s, rotary, interleaved)
        present_k = np.zeros((batch, kv_heads, capacity, head))
        present_v = np.zeros((batch, kv_heads, capacity, head))
        for row in range(batch):
            p = int(cached[row])
            if p and past_k is not None and past_v is not None:
                present_k[row, :, :p] = past_k[row, :, :p]
                present_v[row, :, :p] = past_v[row, :, :p]
            present_k[row, :, p:p + sequence] = k[row].transpose(1, 0, 2)
            present_v[row, :, p:p + sequence] = v[row].transpose(1, 0, 2)
        scale = float(args["scale"]) if args["scale"] else 1.0 / math.sqrt(head)
        group = heads // kv_heads
        keys = np.repeat(present_k, group, axis=1)  # (B, N, C, h)
        values = np.repeat(present_v, group, axis=1)
        scores = q.transpose(0, 2, 1, 3) @ keys.transpose(0, 1, 3, 2) * scale
        softcap = float(args["softcap"])
        if softcap > 0:
            scores = softcap * np.tanh(scores / softcap)
        bias = tensors.get("attention_bias")
        if bias is not None:
            padded = np.zeros(bias.shape[:3] + (capacity,))
            padded[..., :bias.shape[3]] = bias
            scores = scores + padded
        position = cached[:, None] + np.arange(sequence)[None]  # (B, S)
        end = np.minimum(position + 1, lengths[:, None]) if args["causal"] \
            else np.broadcast_to(lengths[:, None], position.shape)
        key = np.arange(capacity)
        visible = key[None, None] < end[..., None]
        window = int(args["local_window_size"])
        if window > 0:
            visible &= key[None, None] >= (end - window)[..., None]
        scores = np.where(visible[:, None], scores, -np.inf)
        sink = tensors.get("head_sink")
        extra = None
        if sink is not None:
            extra = np.broadcast_to(sink.astype(np.float64)[None, :, None, None],
                                    scores.shape[:3] + (1,))
        elif int(args["smooth_softmax"]) == 1:
            extra = np.zeros(scores.shape[:3] + (1,))
        if extra is not None:
            scores = np.concatenate([scores, extra], -1)
        top = scores.max(-1, keepdims=True)
        probs = np.exp(scores - top)
        probs = (probs / probs.sum(-1, keepdims=True))[..., :capacity]
        out = (probs @ values).transpose(0, 2, 1, 3).reshape(batch, sequence, heads * head)
        dtype = query.dtype
        return [out.astype(dtype), present_k.astype(dtype), present_v.astype(dtype)]


PATTERNS = [GroupQueryAttention()]
