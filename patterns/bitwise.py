"""BitwiseAnd / BitwiseOr / BitwiseXor / BitwiseNot (ONNX opset 18) in arithmetic and byte
tables, for targets below 18.

Matches ``BitwiseAnd(A, B)``, ``BitwiseOr(A, B)``, ``BitwiseXor(A, B)`` and
``BitwiseNot(X)`` in any custom domain, and in the default domain below opset 18 (at 18+
they are standard and never offered to patterns; ``--target-opset`` below 18 sends them
here). Semantics are ONNX's (its reference: numpy's ``bitwise_and`` etc.) on int8-int64
and uint8-uint64, with numpy broadcasting.

Before -> after::

    BitwiseNot(x)        ->  -1 - x (signed; uint32 through its int32 pattern),
                             max - x (other unsigned); in int32 below 32 bits
    BitwiseAnd(x, 2**k - 1), BitwiseOr(..), BitwiseXor(..)   with a constant mask:
                         ->  r = x mod 2**k;  And: r;  Or: (x - r) + m;  Xor: (x - r) + (m - r)
    BitwiseAnd(a, b), 8-32 bits:
                         ->  the bytes a_k, b_k of each operand (int32, the operands' shape);
                             r_k = Gather(TABLE, a_k * 256 + b_k)  (top byte of a signed
                             result: Gather(SIGNED_TABLE, (a_k + 128) * 256 + b_k + 128));
                             r = ((r_3 * 256 + r_2) * 256 + r_1) * 256 + r_0;  Cast to the type
    BitwiseAnd(a, b), 64 bits:
                         ->  the same byte by byte in uint64 with BitShift and Mod

``TABLE`` is the 256 x 256 byte table of the operation (64 KiB, one per op and graph).
Every step is exact integer arithmetic; no float is involved, and up to 32 bits no Mod,
Div or sum sees a number of 2**24 or more unless it is an exact multiple of 256: OpenVINO's
CPU plugin computes integer Mod, Div and ReduceSum through float32 and int64 in 32 bits
(measured), so the bytes are cut with bit-truncating Casts through uint8 (ONNX's Cast
truncates, and so do ONNX Runtime and OpenVINO). A 64-bit op holds on ONNX Runtime only
(OpenVINO computes any int64 arithmetic in 32 bits).

Speed (ONNX Runtime, 256 x 1024 int32): two tensors about 40x the native op (a bitwise
result needs each byte cut, looked up and placed: some 40 elementwise passes where the
native op makes one); a constant low-bit mask about 4.6x. docs/performance.md has the
figures.

Envelope: opsets 11+; the eight integer types; any shapes that broadcast; dims dynamic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_type
from decomposer.examples import I32, I64, Example
from decomposer.forms import Form, In
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

_WIDTH: dict[int, int] = {TensorProto.INT8: 8, TensorProto.UINT8: 8, TensorProto.INT16: 16,
          TensorProto.UINT16: 16, TensorProto.INT32: 32, TensorProto.UINT32: 32,
          TensorProto.INT64: 64, TensorProto.UINT64: 64}
_SIGNED = {TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64}
_BYTE_OPS = {"BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or,
             "BitwiseXor": np.bitwise_xor}


class Facts(NamedTuple):
    elem_type: int
    # a low-bit mask operand ``2**bits - 1`` (every element equal), for the one-op form
    mask: MaskOperand | None = None


class MaskOperand(NamedTuple):
    variable: str        # the other operand's role ("A" or "B")
    value: np.ndarray    # the mask as given (its shape keeps the broadcast)
    bits: int


def byte_table(op_type: str) -> np.ndarray:
    """TABLE[a * 256 + b] = a op b for bytes a, b."""
    values = np.arange(256, dtype=np.uint16)
    return _BYTE_OPS[op_type](values[:, None], values[None, :]).astype(np.uint8).reshape(-1)


def signed_byte_table(op_type: str) -> np.ndarray:
    """TABLE[(a + 128) * 256 + (b + 128)] = a op b for signed bytes a, b (-128..127)."""
    values = np.arange(-128, 128, dtype=np.int16)
    return _BYTE_OPS[op_type](values[:, None], values[None, :]).astype(np.int8).reshape(-1)


def low_bit_mask(value: np.ndarray | None, elem_type: int) -> int | None:
    """k when every element of ``value`` is ``2**k - 1`` with ``2**k`` representable in the
    type (1 <= k < width, k < width - 1 when signed); else None."""
    if value is None or value.size == 0:
        return None
    first = int(value.reshape(-1)[0])
    if first <= 0 or first & (first + 1) or not (value == first).all():
        return None
    bits = first.bit_length()
    limit = _WIDTH[elem_type] - (1 if elem_type in _SIGNED else 0)
    return bits if bits < limit else None


class _Bitwise(Pattern[Facts]):
    tensors: tuple[str, ...] = ("A", "B")

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        elem_type = require_type(ctx, node.tensor(self.tensors[0]), self.tensors[0],
                                 tuple(_WIDTH))
        for name in self.tensors[1:]:
            require_type(ctx, node.tensor(name), name, (elem_type,))
        if len(self.tensors) == 2:
            for mask_role, variable in (("B", "A"), ("A", "B")):
                value = ctx.constant(node.tensor(mask_role))
                bits = low_bit_mask(value, elem_type)
                if value is not None and bits is not None:
                    return Facts(elem_type, MaskOperand(variable, value, bits))
        return Facts(elem_type)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        shapes = [ctx.shape(node.tensor(name)) for name in self.tensors]
        return [(facts.elem_type, shapes[0] if len(shapes) == 1 else None)]


def _bit_pattern(b: Builder, x: Value, elem_type: int, hint: str) -> Value:
    """``x`` as a uint64 bit pattern (signed values sign-extended through int64)."""
    if elem_type == TensorProto.UINT64:
        return x
    if elem_type in _SIGNED and elem_type != TensorProto.INT64:
        x = b.Cast(x, np.int64, hint=f"{hint}_i64")
    return b.Cast(x, np.uint64, hint=f"{hint}_bits")


def _low_bits_32(b: Builder, x: Value, bits: int, shape: tuple[int, ...], hint: str
                 ) -> Value:
    """``x mod 2**bits`` (1 <= bits <= 8) of a 32-bit ``x``, as int32, without a Mod of
    a large number: a bit-truncating Cast to uint8 (ONNX's Cast truncates; ONNX Runtime
    and OpenVINO do), then an int32 Mod of the byte. uint8, not uint16: OpenVINO's CPU
    plugin computes uint16 in int32 and then folds Cast(Cast(x, uint16), int32) away
    (measured)."""
    low = b.Cast(b.Cast(x, np.uint8, hint=f"{hint}_low_byte"), np.int32,
                 hint=f"{hint}_low_i32")
    if bits == 8 and not shape:
        return low
    # byte - 2**bits * (byte / 2**bits): three fast passes where ONNX Runtime's Mod is slow
    unit = np.full(shape, 2 ** bits, np.int32)
    above = b.Mul(b.Div(low, unit, hint=f"{hint}_above"), unit, hint=f"{hint}_above_placed")
    return b.Sub(low, above, hint=f"{hint}_low_bits")


def _split_32(b: Builder, x: Value, hint: str) -> tuple[Value, Value]:
    """A 32-bit ``x`` as its low byte (int32 0..255) and ``floor(x / 256)`` (int32, below
    2**23 in magnitude for int32, 2**24 for uint32), so that the byte arithmetic after it
    sees small numbers only: OpenVINO's CPU plugin computes integer Mod, Div and ReduceSum
    through float32 (measured: Mod(2**31 - 1, 256) = 0) and int64 arithmetic in 32 bits
    (Add(2**40 + 1, 3) = 4). ``x - low`` is a multiple of 256, so its truncating Div is
    exact, in ints and in float32 alike."""
    low = _low_bits_32(b, x, 8, (), hint)
    wide_low = low if x.dtype == np.int32 else b.Cast(low, x.dtype, hint=f"{hint}_low_wide")
    rest = b.Div(b.Sub(x, wide_low, hint=f"{hint}_high_bits"), np.array(256, x.dtype),
                 hint=f"{hint}_rest_wide")
    return low, b.Cast(rest, np.int32, hint=f"{hint}_rest")


def _next_byte(b: Builder, x: Value, hint: str) -> tuple[Value, Value]:
    """``x mod 256`` and ``floor(x / 256)`` of int32 ``x`` (|x| < 2**24). The byte comes
    from bit-truncating Casts through uint8 (ONNX Runtime's Mod is 4x slower); the floor is
    written ``(x - byte) / 256``: the difference is a multiple, so the truncating Div is
    exact."""
    byte = b.Cast(b.Cast(x, np.uint8, hint=f"{hint}_byte_u8"), np.int32, hint=f"{hint}_byte")
    return byte, b.Div(b.Sub(x, byte, hint=f"{hint}_above"), np.array(256, np.int32),
                       hint=f"{hint}_shifted")


def _bytes(b: Builder, x: Value, elem_type: int, hint: str) -> list[Value]:
    """The bytes of 8-32-bit ``x``'s two's-complement pattern, least significant first, as
    int32 tensors of x's shape: 0..255, except the top byte of a signed type (and of
    uint32, whose result is built as its int32 pattern), which is -128..127."""
    width = _WIDTH[elem_type]
    if width == 32:
        low, rest = _split_32(b, x, hint)
        found = [low]
        for k in (1, 2):
            byte, rest = _next_byte(b, rest, f"{hint}{k}")
            found.append(byte)
        if elem_type == TensorProto.UINT32:
            # ONNX Runtime holds 0..255 here, OpenVINO (uint32 computed as int32) the
            # signed byte: both to the signed byte
            rest = b.Sub(b.Mod(b.Add(rest, np.array(128, np.int32), hint=f"{hint}3_offset"),
                               np.array(256, np.int32), hint=f"{hint}3_wrapped"),
                         np.array(128, np.int32), hint=f"{hint}3_signed")
        return [*found, rest]
    wide = b.Cast(x, np.int32, hint=f"{hint}_wide")
    if width == 8:
        return [wide]
    byte, top = _next_byte(b, wide, f"{hint}0")
    return [byte, top]


class _BinaryBitwise(_Bitwise):
    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        if facts.mask is not None:
            self._build_masked(b, node, facts, facts.mask)
        elif _WIDTH[facts.elem_type] == 64:
            self._build_64(b, node, facts)
        else:
            self._build_narrow(b, node, facts)

    def _build_masked(self, b: Builder, node: MatchedNode, facts: Facts,
                      mask: MaskOperand) -> None:
        """x & m = r; x | m = (x - r) + m; x ^ m = (x - r) + (m - r), with r = x mod 2**k
        in 0..m: no partial result leaves the type's range. Below 32 bits in int32 (ONNX
        Runtime has no narrower arithmetic); for 32 bits ``r`` is taken from small numbers
        only (OpenVINO's Mod goes through float32, see :func:`_split_32`): up to 8 bits
        as :func:`_low_bits_32`, else the low byte and ``floor(x / 256) mod 2**(k - 8)``."""
        dtype = numpy_dtype(facts.elem_type)
        width = _WIDTH[facts.elem_type]
        x = b.input(node.tensor(mask.variable), dtype)
        work = np.dtype(np.int32) if width < 32 else dtype
        if work != dtype:
            x = b.Cast(x, work, hint="x_wide")
        if width != 32:
            low = b.Mod(x, np.full(mask.value.shape, 2 ** mask.bits, dtype=work),
                        hint="low_bits")
        elif mask.bits <= 8:
            low = _low_bits_32(b, x, mask.bits, mask.value.shape, "x")
        else:
            low_byte, rest = _split_32(b, x, "x")
            above = b.Mod(rest, np.full(mask.value.shape, 2 ** (mask.bits - 8), np.int32),
                          hint="kept_above")
            low = b.Add(b.Mul(above, np.array(256, np.int32), hint="kept_placed"), low_byte,
                        hint="low_bits")
        if low.dtype != work:
            low = b.Cast(low, work, hint="low_bits_typed")
        if self.op_type == "BitwiseAnd":
            result = low
        else:
            ones = mask.value.astype(work)
            high = b.Sub(x, low, hint="high_bits")
            if self.op_type == "BitwiseOr":
                result = b.Add(high, ones, hint="or")
            else:
                result = b.Add(high, b.Sub(ones, low, hint="flipped_low"), hint="xor")
        if work != dtype:
            b.Cast(result, dtype, hint="result", out=node.outputs[0])
        else:
            b.op("Identity", result, hint="result", out=node.outputs[0])

    def _build_narrow(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        """8-32 bits: byte k of the result is TABLE[a_k * 256 + b_k] (the top byte, when
        signed, from a second table indexed by the bytes plus 128, holding the signed
        result), and the result is their sum in int32 from the top byte down (Horner, so
        no partial sum leaves the type's range; a uint32 result is its int32 pattern,
        reinterpreted by a bit-truncating Cast). Every tensor is of the operands' shape:
        ONNX Runtime's broadcast over a short last axis is several times slower."""
        dtype = numpy_dtype(facts.elem_type)
        a_bytes = _bytes(b, b.input(node.tensor("A"), dtype), facts.elem_type, "a")
        b_bytes = _bytes(b, b.input(node.tensor("B"), dtype), facts.elem_type, "b")
        signed_top = facts.elem_type in _SIGNED or facts.elem_type == TensorProto.UINT32
        unsigned_table = byte_table(self.op_type)
        looked = []
        for k, (left, right) in enumerate(zip(a_bytes, b_bytes, strict=True)):
            index = b.Add(b.Mul(left, np.array(256, np.int32), hint=f"row{k}"), right,
                          hint=f"index{k}")
            table = unsigned_table
            if signed_top and k == len(a_bytes) - 1:
                index = b.Add(index, np.array(128 * 256 + 128, np.int32), hint=f"index{k}_signed")
                table = signed_byte_table(self.op_type)
            # one-byte tables (64 KiB) stay in cache; the Cast after is cheaper
            looked.append(b.Cast(b.Gather(b.const(table, hint="byte_table"), index,
                                          hint=f"byte{k}_looked"), np.int32,
                                 hint=f"byte{k}"))
        total = looked[-1]
        for k in range(len(looked) - 2, -1, -1):
            total = b.Add(b.Mul(total, np.array(256, np.int32), hint=f"placed{k}"),
                          looked[k], hint=f"sum{k}")
        b.Cast(total, dtype, hint="result", out=node.outputs[0])

    def _build_64(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        """64 bits: byte by byte in uint64 with BitShift, the bytes added one by one (ONNX
        Runtime's int64 ReduceSum is inexact beyond 2**53: it gives 2**62 + 12288 for
        2**62 + 12345, measured)."""
        dtype = numpy_dtype(facts.elem_type)
        a = _bit_pattern(b, b.input(node.tensor("A"), dtype), facts.elem_type, "a")
        c = _bit_pattern(b, b.input(node.tensor("B"), dtype), facts.elem_type, "b")
        table = b.const(byte_table(self.op_type), np.uint8, hint="byte_table")
        total: Value | None = None
        for k in range(_WIDTH[facts.elem_type] // 8):
            shift = b.const(np.array(8 * k, np.uint64), hint=f"shift{k}")
            a_byte, b_byte = ((b.op("BitShift", v, shift, direction="RIGHT", hint=f"{n}{k}")
                               if k else v) for v, n in ((a, "a_shift"), (c, "b_shift")))
            index = b.Add(b.Mul(b.Mod(a_byte, np.array(256, np.uint64), hint=f"a_byte{k}"),
                                np.array(256, np.uint64), hint=f"a_row{k}"),
                          b.Mod(b_byte, np.array(256, np.uint64), hint=f"b_byte{k}"),
                          hint=f"index{k}")
            looked = b.Cast(b.Gather(table, b.Cast(index, np.int64, hint=f"index{k}_i64")),
                            np.uint64, hint=f"byte{k}")
            if k:
                looked = b.op("BitShift", looked, shift, direction="LEFT", hint=f"placed{k}")
            total = looked if total is None else b.Add(total, looked, hint=f"sum{k}")
        assert total is not None
        b.Cast(total, dtype, hint="result", out=node.outputs[0])

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        a, c = tensors["A"], tensors["B"]
        assert a is not None and c is not None
        return [_BYTE_OPS[self.op_type](a, c)]


def _binary_forms(op_type: str) -> tuple[Form, ...]:
    return (Form(op_type, inputs=(In("A"), In("B"))),)


_BINARY_EXAMPLES = (
    Example((("a", I32, ("N", 4)), ("b", I32, (4,))), domains=(("", 17), ("custom.ops", 13))),
    Example((("a", I64, ("N",)), ("b", I64, ("N",))), domains=(("", 11),)),
)


class BitwiseAnd(_BinaryBitwise):
    op_type = "BitwiseAnd"
    forms = _binary_forms("BitwiseAnd")
    examples = _BINARY_EXAMPLES


class BitwiseOr(_BinaryBitwise):
    op_type = "BitwiseOr"
    forms = _binary_forms("BitwiseOr")
    examples = _BINARY_EXAMPLES


class BitwiseXor(_BinaryBitwise):
    op_type = "BitwiseXor"
    forms = _binary_forms("BitwiseXor")
    examples = _BINARY_EXAMPLES


class BitwiseNot(_Bitwise):
    op_type = "BitwiseNot"
    tensors = ("X",)
    forms = (Form("BitwiseNot", inputs=(In("X"),)),)
    examples = (Example((("x", I32, ("N", 3)),), domains=(("", 13), ("custom.ops", 17))),)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        """~x = -1 - x (signed) or max - x (unsigned): neither overflows. In int32 up to 32
        bits (ONNX Runtime has no narrower Sub; a uint32 goes through its int32 pattern by
        bit-truncating Casts, as OpenVINO saturates a uint32 constant above 2**31 - 1 to it,
        measured), in the type itself for 64."""
        dtype = numpy_dtype(facts.elem_type)
        x = b.input(node.tensor("X"), dtype)
        work = dtype if _WIDTH[facts.elem_type] == 64 else np.dtype(np.int32)
        if work != dtype:
            x = b.Cast(x, work, hint="x_wide")
        # all ones: -1 in a signed type or in uint32's int32 pattern, else the type's max
        ones = -1 if facts.elem_type in _SIGNED or facts.elem_type == TensorProto.UINT32 \
            else np.iinfo(dtype).max
        flipped = b.Sub(np.array(ones, work), x, hint="not")
        if work != dtype:
            b.Cast(flipped, dtype, hint="result", out=node.outputs[0])
        else:
            b.op("Identity", flipped, hint="result", out=node.outputs[0])

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["X"]
        assert x is not None
        return [np.bitwise_not(x)]


PATTERNS = [BitwiseAnd(), BitwiseOr(), BitwiseXor(), BitwiseNot()]
