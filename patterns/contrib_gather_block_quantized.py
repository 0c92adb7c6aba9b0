"""ONNX Runtime's com.microsoft GatherBlockQuantized (a block-quantized embedding table, as
the onnxruntime-genai model builder writes int4 embeddings) as Gather, integer unpacking
and a dequantization.

Matches ``GatherBlockQuantized(data, indices, scales[, zero_points]; bits, block_size,
gather_axis, quantize_axis)`` in com.microsoft (the schema ONNX Runtime 1.32 registers;
docs/ContribOperators.md) in its uint8 form: data uint8 (V, E * bits / 8), E values per
row packed along the last axis low bits first (bits 2, 4 or 8), ``gather_axis`` 0,
``quantize_axis`` 1 (the last), scales (V, E / block_size) of the output's type,
zero_points uint8 (V, ceil(E / block_size * bits / 8)) packed the same way, or absent
(``2^(bits - 1)``); indices int32/int64 of any rank, negative ones counting from the end,
and, unlike ONNX Gather, an index out of [-V, V) gives a row of zeros.
``output[i..., e] = (q[row, e] - zero_point[row, e // block_size]) * scale[row, e //
block_size]`` with ``row`` the index, shape ``indices.shape + (E,)``.

int4/uint4-typed data (V, E), as 4-bit weight quantization writes it, is decomposed when it
is an initializer: its values are repacked at decompose time into the uint8 form (a signed
value v stored as v + 8 and its zero point z as z + 8; the default zero point is 0 for both
types, measured on ONNX Runtime 1.32), since no op below opset 21 reads int4 at run time.
Refused with the reason: int4 data computed at run time, FP8/FP4 typed data, other axes,
and sizes past ``checks.MAX_CONSTANT_ELEMENTS`` (before anything is allocated).

Before -> after::

    row   = index < 0 ? index + V : index; valid = 0 <= row < V; row = valid ? row : 0
    q     = unpack(Gather(data, row))                   # (..., E) int32
    out   = valid ? (q - unpack(Gather(zero, row))[e // block]) * Gather(scales, row)[e // block]
                  : 0

Envelope: opsets 11+ (bfloat16 13+); V dynamic, E and block_size static.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_shape, require_size, require_type
from decomposer.examples import I64, Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from .contrib_matmul_nbits import _unpack

U8 = TensorProto.UINT8
_OUT = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)


class Facts(NamedTuple):
    elem_type: int
    width: int  # E
    blocks: int  # E / block_size
    index_rank: int
    # int4/uint4 data (an initializer): its values and zero points repacked in the uint8
    # form (4-bit unsigned nibbles, low first, zero points always given)
    repacked: tuple[np.ndarray, np.ndarray] | None = None


def pack_nibbles(values: np.ndarray) -> np.ndarray:
    """(rows, n) integers 0..15 -> (rows, ceil(n / 2)) uint8, each row packed low nibble
    first on its own (the uint8 form's layout)."""
    rows, n = values.shape
    padded = np.zeros((rows, n + n % 2), np.uint8)
    padded[:, :n] = values
    return (padded[:, 0::2] | (padded[:, 1::2] << 4)).astype(np.uint8)


def repack_4bit(data: np.ndarray, zero_points: np.ndarray | None, signed: bool, block: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """int4/uint4 (V, E) values and (V, E / block) zero points (ONNX Runtime's default: 0
    for both types, measured) as the uint8 form: a signed value v is stored as v + 8 and its
    zero point z as z + 8, so (v + 8) - (z + 8) = v - z."""
    shift = 8 if signed else 0
    values = data.astype(np.int16) + shift
    blocks = data.shape[1] // block
    zero = np.zeros((data.shape[0], blocks), np.int16) if zero_points is None \
        else zero_points.astype(np.int16)
    return pack_nibbles(values), pack_nibbles(zero + shift)


class GatherBlockQuantized(Pattern[Facts]):
    op_type = "GatherBlockQuantized"
    forms = (Form("GatherBlockQuantized", domains=frozenset({"com.microsoft"}), inputs=(
        In("data"), In("indices"), In("scales"), In("zero_points", optional=True)),
        attributes={"bits": Attr("int", default=4), "block_size": Attr("int", default=128),
                    "gather_axis": Attr("int", default=0),
                    "quantize_axis": Attr("int", default=1)}),)
    examples = (
        Example((("d", U8, (10, 16)), ("i", I64, ("B", "S")), ("s", F, (10, 2))), ((F, 3),),
                attrs={"bits": 4, "block_size": 16}, domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        args = node.args
        bits, block = int(args["bits"]), int(args["block_size"])
        data_type = require_type(ctx, node.tensor("data"), "data",
                                 (U8, TensorProto.INT4, TensorProto.UINT4))
        if data_type != U8:
            return self._check_4bit(node, ctx, data_type, block)
        if bits not in (2, 4, 8):
            raise Reject(f"bits = {bits}: uint8 data takes 2, 4 or 8")
        if block < 16 or block & (block - 1):
            raise Reject(f"block_size = {block} must be a power of 2 >= 16 (the schema)")
        data = require_shape(ctx, node.tensor("data"), "data", "(V, packed E)", 2, 2)
        if args["gather_axis"] != 0 or args["quantize_axis"] not in (1, -1):
            raise Reject("only gather_axis 0 and quantize_axis 1 (uint8 data) are decomposed")
        if not isinstance(data[1], int):
            raise Reject("the packed row width must be static")
        width = require_size(data[1] * 8 // bits, "the row's per-value block index")
        if width % block:
            raise Reject(f"the row width {width} is not a multiple of block_size {block}")
        elem_type = require_type(ctx, node.tensor("scales"), "scales", _OUT)
        if elem_type == TensorProto.BFLOAT16 and ctx.opset < 13:
            raise Reject("bfloat16 needs opset 13")
        if node.tensor("zero_points"):
            require_type(ctx, node.tensor("zero_points"), "zero_points", (U8,))
        require_type(ctx, node.tensor("indices"), "indices",
                     (TensorProto.INT32, TensorProto.INT64))
        indices = require_shape(ctx, node.tensor("indices"), "indices", "its rank")
        return Facts(elem_type, width, width // block, len(indices))

    def _check_4bit(self, node: MatchedNode, ctx: MatchContext, data_type: int, block: int
                    ) -> Facts:
        """int4/uint4 data: a (V, E) initializer, repacked here (no op below opset 21 reads
        an int4 tensor at run time)."""
        if node.args["gather_axis"] != 0 or node.args["quantize_axis"] not in (1, -1):
            raise Reject("only gather_axis 0 and quantize_axis 1 are decomposed")
        if block < 16 or block & (block - 1):
            raise Reject(f"block_size = {block} must be a power of 2 >= 16 (the schema)")
        data = ctx.weight(node.tensor("data"))
        if data is None or data.ndim != 2:
            raise Reject("int4/uint4 data must be a 2-D initializer (no op below opset 21 "
                         "reads int4 at run time)")
        require_size(int(data.size), "the repacked int4 table")
        width = data.shape[1]
        if width % block:
            raise Reject(f"the row width {width} is not a multiple of block_size {block}")
        zero = None
        if node.tensor("zero_points"):
            require_type(ctx, node.tensor("zero_points"), "zero_points", (data_type,))
            zero = ctx.weight(node.tensor("zero_points"))
            if zero is None or zero.shape != (data.shape[0], width // block):
                raise Reject("int4/uint4 zero_points must be an initializer of shape "
                             "(V, E / block_size)")
        elem_type = require_type(ctx, node.tensor("scales"), "scales", _OUT)
        if elem_type == TensorProto.BFLOAT16 and ctx.opset < 13:
            raise Reject("bfloat16 needs opset 13")
        require_type(ctx, node.tensor("indices"), "indices",
                     (TensorProto.INT32, TensorProto.INT64))
        indices = require_shape(ctx, node.tensor("indices"), "indices", "its rank")
        return Facts(elem_type, width, width // block, len(indices),
                     repack_4bit(data, zero, data_type == TensorProto.INT4, block))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        args = node.args
        bits, block = int(args["bits"]), int(args["block_size"])
        data: str | Value = node.tensor("data")
        zero_source: str | Value | None = node.tensor("zero_points") or None
        if facts.repacked is not None:
            bits = 4
            data = b.weight(onnx.numpy_helper.from_array(facts.repacked[0]), hint="data_u8")
            zero_source = b.weight(onnx.numpy_helper.from_array(facts.repacked[1]),
                                   hint="zero_points_u8")
        f32 = np.dtype(np.float32)
        original = numpy_dtype(facts.elem_type)
        count = b.Gather(b.Shape(data, hint="table_shape"), [0], hint="rows")  # (1,) V
        index = b.Cast(node.tensor("indices"), np.int64, hint="index_i64")
        row = b.Where(b.Less(index, np.array(0, np.int64), hint="negative"),
                      b.Add(index, count, hint="wrapped"), index, hint="row_any")
        valid = b.And(b.GreaterOrEqual(row, np.array(0, np.int64), hint="row_low_ok"),
                      b.Less(row, count, hint="row_high_ok"), hint="row_valid")
        row = b.Where(valid, row, np.array(0, np.int64), hint="row")
        flat = b.Reshape(row, np.array([-1], np.int64), hint="rows_flat")  # (M,)
        q = _unpack(b, b.Gather(data, flat, hint="packed_rows"), bits, hint="q")  # (M, E)
        scales = b.Gather(node.tensor("scales"), flat, hint="row_scales")  # (M, blocks)
        if facts.elem_type != TensorProto.FLOAT:
            scales = b.Cast(scales, f32, hint="scales_f32")
        per_value = np.arange(facts.width, dtype=np.int64) // block
        scale = b.Gather(scales, per_value, axis=1, hint="scale_per_value")
        zero: Value | np.ndarray
        if zero_source is not None:
            zero = _unpack(b, b.Gather(zero_source, flat, hint="zero_rows"),
                           bits, hint="zero")
            zero = b.Gather(b.Cast(zero, f32, hint="zero_f32"), per_value, axis=1,
                            hint="zero_per_value")
        else:
            zero = np.array(2 ** (bits - 1), np.float32)
        values = b.Mul(b.Sub(b.Cast(q, f32, hint="q_f32"), zero, hint="centered"), scale,
                       hint="dequantized")  # (M, E)
        shape = b.Concat(b.Shape(node.tensor("indices"), hint="index_shape"),
                         np.array([facts.width], np.int64), axis=0, hint="out_shape")
        shaped = b.Reshape(values, shape, hint="values")
        kept = b.Unsqueeze(valid, [facts.index_rank], hint="valid_rows")
        narrow = facts.elem_type != TensorProto.FLOAT
        result = b.Where(kept, shaped, np.array(0, np.float32), hint="gathered",
                         out=None if narrow else node.outputs[0])
        if narrow:
            b.Cast(result, original, out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        indices = ctx.shape(node.tensor("indices"))
        dims = None if indices is None else [*indices, facts.width]
        return [(facts.elem_type, dims)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        data, indices, scales = tensors["data"], tensors["indices"], tensors["scales"]
        assert data is not None and indices is not None and scales is not None
        bits, block = int(args["bits"]), int(args["block_size"])
        rows = data.shape[0]

        def unpack(raw: np.ndarray) -> np.ndarray:
            wide = raw.astype(np.int64)
            parts = [(wide >> (bits * i)) & (2 ** bits - 1) for i in range(8 // bits)]
            return np.stack(parts, -1).reshape(raw.shape[0], -1)

        q = unpack(data).astype(np.float64)
        zero_points = tensors.get("zero_points")
        blocks = q.shape[1] // block
        zero = unpack(zero_points)[:, :blocks].astype(np.float64) if zero_points is not None \
            else np.full((rows, blocks), 2 ** (bits - 1), np.float64)
        per = np.arange(q.shape[1]) // block
        table = (q - zero[:, per]) * scales.astype(np.float64)[:, per]
        flat = indices.reshape(-1).astype(np.int64)
        out = np.zeros((flat.size, q.shape[1]))
        for i, index in enumerate(flat):
            if -rows <= index < rows:
                out[i] = table[index % rows]
        return [out.reshape(*indices.shape, q.shape[1]).astype(scales.dtype)]


PATTERNS = [GatherBlockQuantized()]
