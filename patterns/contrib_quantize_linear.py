"""ONNX Runtime's com.microsoft QuantizeLinear / DequantizeLinear (what ``quantize_static(...,
extra_options={"UseQDQContribOps": True})`` writes, for 16-bit and 4-bit activations and
weights) as the standard ops where the model's opset has the type, else their arithmetic.

Matches, in com.microsoft (the schemas ONNX Runtime 1.32 registers; docs/ContribOperators.md):

- ``DequantizeLinear(x, x_scale, x_zero_point; axis=1)``: x int8/uint8/int16/uint16/int32/
  int4/uint4, scale float32 (or float16), per tensor (a scalar) or per axis (1-D along
  ``axis``); ``y = (x - zero_point) * scale``;
- ``QuantizeLinear(x, y_scale, y_zero_point; axis=1)``: x float32 (or float16), the output
  the zero point's type (uint8 when absent); ``y = saturate(round_half_even(x / scale) +
  zero_point)``.

Before -> after::

    standard QuantizeLinear/DequantizeLinear, same inputs   where the opset holds the form:
        8-bit per tensor from 10, per axis from 13; float16 from 19; 16-bit and 4-bit from 21
    DequantizeLinear of 16 bits below 21:  (Cast(x, f32) - Cast(zp, f32)) * scale
    QuantizeLinear to 16 bits below 21:    Cast(Clip(Round(x / scale) + Cast(zp, f32),
                                                     type min, type max), the type)
    DequantizeLinear of an int4/uint4 initializer below 21: the values unpacked into an
        int8 initializer (and the zero point likewise), then the 8-bit form

(a per-axis scale and zero point are reshaped to lie along ``axis`` for the arithmetic.)
Round-11 rounds half to even, as QuantizeLinear does; every integer of 16 bits is exact in
float32, so the arithmetic equals the kernels' (checked against ONNX Runtime's kernels).

Refused with the reason: int4/uint4 outputs or run-time int4 inputs below opset 21 (no op
before it holds int4); a float16 scale or input below 19 where the arithmetic would change
the rounding.

Envelope: opsets 11+; ranks known for per-axis forms; dims dynamic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import onnx.numpy_helper
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

MS = frozenset({"com.microsoft"})
U8, I8, U16, I16 = TensorProto.UINT8, TensorProto.INT8, TensorProto.UINT16, TensorProto.INT16
I32, I4, U4 = TensorProto.INT32, TensorProto.INT4, TensorProto.UINT4
F16 = TensorProto.FLOAT16
_RANGES: dict[int, tuple[int, int]] = {
    U8: (0, 255), I8: (-128, 127), U16: (0, 65535), I16: (-32768, 32767), I4: (-8, 7),
    U4: (0, 15)}


class Facts(NamedTuple):
    quantized: int  # the integer type (x of DequantizeLinear, y of QuantizeLinear)
    real: int  # the float type (the scale's)
    rank: int | None
    axis: int | None  # non-negative; None for a per-tensor scale
    arithmetic: bool  # the target's op lacks the form: written in arithmetic
    unpacked: tuple[np.ndarray, np.ndarray | None] | None = None  # int4 initializer, int8


def _first_opset(quantized: int, real: int, per_axis: bool) -> int:
    """The first opset whose standard op holds this form."""
    opset = 10
    if per_axis:
        opset = 13
    if real == F16:
        opset = max(opset, 19)
    if quantized in (U16, I16, I4, U4):
        opset = max(opset, 21)
    return opset


def _scale_layout(node: MatchedNode, ctx: MatchContext, data: str
                  ) -> tuple[int | None, int | None]:
    """(rank of ``data``, the axis of a per-axis scale or None)."""
    scale = ctx.shape(node.tensor("scale"))
    shape = ctx.shape(data)
    rank = None if shape is None else len(shape)
    if scale is not None and (len(scale) == 0 or list(scale) == [1]):
        return rank, None
    if scale is None or len(scale) != 1:
        raise Reject("the scale must be a scalar or 1-D (per axis), of known shape")
    if rank is None:
        raise Reject("a per-axis scale needs the input's rank")
    axis = int(node.args["axis"])
    if not -rank <= axis < rank:
        raise Reject(f"axis {axis} is out of range for rank {rank}")
    return rank, axis % rank


def _along(b: Builder, value: str | Value, facts: Facts, dtype: Any, hint: str) -> Value:
    """A per-axis parameter reshaped to broadcast along the axis (per tensor: as it is)."""
    tensor = b.input(value, dtype) if isinstance(value, str) else value
    if facts.axis is None or facts.rank is None:
        return tensor
    shape = [-1 if a == facts.axis else 1 for a in range(facts.rank)]
    return b.Reshape(tensor, np.array(shape, np.int64), hint=hint)


class _QuantizeOp(Pattern[Facts]):
    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        out = facts.real if self.op_type == "DequantizeLinear" else facts.quantized
        return [(out, ctx.shape(node.tensor("x")))]

    def standard(self, b: Builder, node: MatchedNode, facts: Facts, x: str | Value,
                 zero: str | Value | None) -> None:
        attrs: dict[str, Any] = {} if facts.axis is None else {"axis": facts.axis}
        inputs: list[str | Value] = [x, node.tensor("scale")]
        if zero is not None:
            inputs.append(zero)
        out_type = facts.real if self.op_type == "DequantizeLinear" else facts.quantized
        b.op(self.op_type, *inputs, hint="standard", out=node.outputs[0],
             dtype=numpy_dtype(out_type), **attrs)


class ContribDequantizeLinear(_QuantizeOp):
    op_type = "DequantizeLinear"
    forms = (Form("DequantizeLinear", domains=MS, inputs=(
        In("x"), In("scale"), In("zero_point", optional=True)),
        attributes={"axis": Attr("int", default=1)}),)
    examples = (
        Example((("x", I16, ("N", 4)),), ((F, 2),),
                args=("x", np.array(0.01, np.float32), np.array(-300, np.int16)),
                domains=(("com.microsoft", 17), ("com.microsoft", 21))),
        Example((("x", U8, ("N", 3)),), ((F, 2),),
                args=("x", np.array([0.1, 0.2, 0.3], np.float32),
                      np.array([1, 128, 255], np.uint8)), domains=(("com.microsoft", 13),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        quantized = require_type(ctx, node.tensor("x"), "x", (U8, I8, U16, I16, I32, I4, U4))
        real = require_type(ctx, node.tensor("scale"), "scale", (TensorProto.FLOAT, F16))
        if node.tensor("zero_point"):
            require_type(ctx, node.tensor("zero_point"), "zero_point", (quantized,))
        rank, axis = _scale_layout(node, ctx, node.tensor("x"))
        first = _first_opset(quantized, real, axis is not None)
        if ctx.opset >= first:
            return Facts(quantized, real, rank, axis, False)
        if real == F16:
            raise Reject(f"a float16 scale is defined from opset {first}; convert the "
                         f"model to opset {first}")
        if quantized in (I4, U4):
            return self._unpacked(node, ctx, quantized, real, rank, axis)
        return Facts(quantized, real, rank, axis, True)

    @staticmethod
    def _unpacked(node: MatchedNode, ctx: MatchContext, quantized: int, real: int,
                  rank: int | None, axis: int | None) -> Facts:
        values = ctx.weight(node.tensor("x"))
        if values is None:
            raise Reject("int4/uint4 values computed at run time are defined from opset 21 "
                         "(no op before it reads int4); convert the model to opset 21")
        zero = ctx.weight(node.tensor("zero_point")) if node.tensor("zero_point") else None
        if node.tensor("zero_point") and zero is None:
            raise Reject("an int4 zero point must be an initializer below opset 21")
        as_int8 = (values.astype(np.int8), None if zero is None else zero.astype(np.int8))
        if ctx.opset < _first_opset(I8, real, axis is not None):
            raise Reject("a per-axis scale is defined from opset 13")
        return Facts(quantized, real, rank, axis, False, as_int8)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        zero_name = node.tensor("zero_point") or None
        if facts.unpacked is not None:
            x = b.weight(onnx.numpy_helper.from_array(facts.unpacked[0]), hint="x_int8")
            zero = None if facts.unpacked[1] is None else b.weight(
                onnx.numpy_helper.from_array(facts.unpacked[1]), hint="zero_int8")
            self.standard(b, node, facts, x, zero)
            return
        if not facts.arithmetic:
            self.standard(b, node, facts, node.tensor("x"), zero_name)
            return
        f32 = np.dtype(np.float32)
        x = b.Cast(node.tensor("x"), f32, hint="x_float")
        if zero_name:
            x = b.Sub(x, _along(b, b.Cast(zero_name, f32, hint="zero_float"), facts, f32,
                                "zero_along"), hint="centered")
        b.Mul(x, _along(b, node.tensor("scale"), facts, f32, "scale_along"),
              hint="dequantized", out=node.outputs[0])

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, scale, zero = tensors["x"], tensors["scale"], tensors.get("zero_point")
        assert x is not None and scale is not None
        shape = _reference_shape(x.ndim, scale, int(args["axis"]))
        centered = x.astype(np.int64) - (0 if zero is None else
                                         zero.astype(np.int64).reshape(shape))
        return [(centered.astype(np.float32) * scale.reshape(shape)).astype(scale.dtype)]


class ContribQuantizeLinear(_QuantizeOp):
    op_type = "QuantizeLinear"
    forms = (Form("QuantizeLinear", domains=MS, inputs=(
        In("x"), In("scale"), In("zero_point", optional=True)),
        attributes={"axis": Attr("int", default=1)}),)
    examples = (
        Example((("x", F, ("N", 4)),), ((U16, 2),),
                args=("x", np.array(0.01, np.float32), np.array(30000, np.uint16)),
                domains=(("com.microsoft", 17), ("com.microsoft", 21))),
        Example((("x", F, ("N", 3)),), ((I8, 2),),
                args=("x", np.array([0.1, 0.2, 0.3], np.float32),
                      np.array([1, -128, 127], np.int8)), domains=(("com.microsoft", 13),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        real = require_type(ctx, node.tensor("x"), "x", (TensorProto.FLOAT, F16))
        require_type(ctx, node.tensor("scale"), "scale", (real,))
        quantized: int = U8
        if node.tensor("zero_point"):
            quantized = require_type(ctx, node.tensor("zero_point"), "zero_point",
                                     (U8, I8, U16, I16, I4, U4))
        rank, axis = _scale_layout(node, ctx, node.tensor("x"))
        first = _first_opset(quantized, real, axis is not None)
        if ctx.opset >= first:
            return Facts(quantized, real, rank, axis, False)
        if quantized in (I4, U4):
            raise Reject("an int4/uint4 output is defined from opset 21 (no op before it "
                         "holds int4); convert the model to opset 21")
        if real == F16:
            raise Reject(f"a float16 input is defined from opset {first}; convert the model "
                         f"to opset {first}")
        return Facts(quantized, real, rank, axis, True)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        zero_name = node.tensor("zero_point") or None
        if not facts.arithmetic:
            self.standard(b, node, facts, node.tensor("x"), zero_name)
            return
        f32 = np.dtype(np.float32)
        scaled = b.Div(b.input(node.tensor("x"), f32),
                       _along(b, node.tensor("scale"), facts, f32, "scale_along"),
                       hint="scaled")
        q = b.op("Round", scaled, hint="rounded", dtype=f32)
        if zero_name:
            q = b.Add(q, _along(b, b.Cast(zero_name, f32, hint="zero_float"), facts, f32,
                                "zero_along"), hint="shifted")
        low, high = _RANGES[facts.quantized]
        q = b.Clip(q, np.array(low, np.float32), np.array(high, np.float32), hint="saturated")
        b.Cast(q, numpy_dtype(facts.quantized), hint="quantized", out=node.outputs[0])

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, scale, zero = tensors["x"], tensors["scale"], tensors.get("zero_point")
        assert x is not None and scale is not None
        shape = _reference_shape(x.ndim, scale, int(args["axis"]))
        dtype = np.uint8 if zero is None else zero.dtype
        low, high = _RANGES[TensorProto.UINT8 if zero is None else
                            onnx.helper.np_dtype_to_tensor_dtype(zero.dtype)]
        q = np.rint(x.astype(np.float32) / scale.reshape(shape).astype(np.float32))
        if zero is not None:
            q = q + zero.astype(np.float32).reshape(shape)
        return [np.clip(q, low, high).astype(dtype)]


def _reference_shape(rank: int, scale: np.ndarray, axis: int) -> tuple[int, ...]:
    if scale.ndim == 0 or scale.size == 1:
        return ()
    return tuple(-1 if a == axis % rank else 1 for a in range(rank))


PATTERNS = [ContribDequantizeLinear(), ContribQuantizeLinear()]
