"""BitwiseAnd / BitwiseOr / BitwiseXor / BitwiseNot (ONNX opset 18) in arithmetic and byte
tables, for targets below 18.

Matches ``BitwiseAnd(A, B)``, ``BitwiseOr(A, B)``, ``BitwiseXor(A, B)`` and
``BitwiseNot(X)`` in any custom domain, and in the default domain below opset 18 (at 18+
they are standard and never offered to patterns; ``--target-opset`` below 18 sends them
here). Semantics are ONNX's (its reference: numpy's ``bitwise_and`` etc.) on int8-int64
and uint8-uint64, with numpy broadcasting.

Before -> after::

    BitwiseNot(x)     ->  signed: -x - 1;  unsigned: max - x   (in int64 for 8-32 bits,
                                                               uint64 for uint64)
    BitwiseAnd(a, b)  ->  a, b as uint64 bit patterns (a signed value sign-extended);
                          for each of the type's bytes k:
                            r += Gather(TABLE, (a >> 8k) % 256 * 256 + (b >> 8k) % 256)
                                 << 8k
                          then Cast to the type (its low bits)

``TABLE`` is the 256 x 256 uint8 table of the byte operation (64 KiB, one per op and
graph). Every step is exact integer arithmetic; no float is involved. The bytes above the
type's width are never read, so a sign-extended pattern cannot leak into the result.

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


def byte_table(op_type: str) -> np.ndarray:
    """TABLE[a * 256 + b] = a op b for bytes a, b."""
    values = np.arange(256, dtype=np.uint16)
    return _BYTE_OPS[op_type](values[:, None], values[None, :]).astype(np.uint8).reshape(-1)


class _Bitwise(Pattern[Facts]):
    tensors: tuple[str, ...] = ("A", "B")

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        elem_type = require_type(ctx, node.tensor(self.tensors[0]), self.tensors[0],
                                 tuple(_WIDTH))
        for name in self.tensors[1:]:
            require_type(ctx, node.tensor(name), name, (elem_type,))
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


class _BinaryBitwise(_Bitwise):
    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
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
        dtype = numpy_dtype(facts.elem_type)
        x = b.input(node.tensor("X"), dtype)
        if facts.elem_type == TensorProto.UINT64:
            b.Sub(np.array(np.iinfo(np.uint64).max, np.uint64), x, hint="not",
                  out=node.outputs[0])
            return
        wide = x if facts.elem_type == TensorProto.INT64 else b.Cast(x, np.int64,
                                                                     hint="x_i64")
        if facts.elem_type in _SIGNED:
            flipped = b.Sub(b.Neg(wide, hint="minus_x"), np.array(1, np.int64), hint="not")
        else:
            flipped = b.Sub(np.array(np.iinfo(dtype).max, np.int64), wide, hint="not")
        if facts.elem_type == TensorProto.INT64:
            b.op("Identity", flipped, hint="result", out=node.outputs[0])
        else:
            b.Cast(flipped, dtype, hint="result", out=node.outputs[0])

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["X"]
        assert x is not None
        return [np.bitwise_not(x)]


PATTERNS = [BitwiseAnd(), BitwiseOr(), BitwiseXor(), BitwiseNot()]
