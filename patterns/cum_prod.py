"""CumProd (ONNX opset 26) as a doubling scan of Mul, for targets below 26.

Matches ``CumProd(x, axis; exclusive:int=0, reverse:int=0)`` in any custom domain, and in
the default domain below opset 26 (at 26+ it is standard and never offered to patterns;
``--target-opset`` below 26 sends it here). Semantics are ONNX's (its reference:
``numpy.cumprod`` along ``axis``, shifted by one for ``exclusive``, from the end for
``reverse``). ``axis`` must be a constant; the length along it must be static.

Before -> after (n the length along the axis, inclusive, forward)::

    y = x
    for d in 1, 2, 4, ... < n:                      # ceil(log2 n) steps
        y = y * Pad(y[0 : n - d], d ones in front)  # y[i] *= y[i - d]
    exclusive: y = Pad(y[0 : n - 1], one 1 in front)
    reverse:   the same from the other end (the pad behind, the slice from d)

Integer products are exact (wrapping multiplication is associative); floating-point
products are taken in a tree order instead of left to right, so they may differ from a
sequential product in the last bits (within float rounding of the same product). No Loop or
Scan: every engine in the suite runs Pad, Slice and Mul.

Envelope: opsets 11+; float16/32/64, int32/int64, uint32/uint64; any rank (known); the
length along the axis static, other dims dynamic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_shape, require_type
from decomposer.examples import I64, Example, F, i64
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32,
          TensorProto.INT64, TensorProto.UINT32, TensorProto.UINT64)


class Facts(NamedTuple):
    elem_type: int
    rank: int
    axis: int  # non-negative
    length: int
    exclusive: bool
    reverse: bool


class CumProd(Pattern[Facts]):
    op_type = "CumProd"
    forms = (Form("CumProd", inputs=(In("x"), In("axis")), attributes={
        "exclusive": Attr("int", default=0, choices=(0, 1)),
        "reverse": Attr("int", default=0, choices=(0, 1))}),)
    examples = (
        Example((("x", F, ("N", 5)),), args=("x", i64(1)), attrs={"reverse": 1},
                domains=(("", 17), ("custom.ops", 13))),
        Example((("x", I64, (4, "M")),), args=("x", i64(0)), attrs={"exclusive": 1},
                domains=(("", 11),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        elem_type = require_type(ctx, node.tensor("x"), "x", _TYPES)
        shape = require_shape(ctx, node.tensor("x"), "x", "the axis is counted in it",
                              min_rank=1)
        axis_value = ctx.constant(node.tensor("axis"))
        if axis_value is None or axis_value.size != 1:
            raise Reject("axis must be a constant scalar (the scan is unrolled along it)")
        axis = int(axis_value.reshape(()))
        if not -len(shape) <= axis < len(shape):
            raise Reject(f"axis {axis} is out of range for rank {len(shape)}")
        axis %= len(shape)
        length = shape[axis]
        if not isinstance(length, int):
            raise Reject(f"the length along axis {axis} is not static (the doubling scan "
                         "takes ceil(log2 n) steps)")
        return Facts(elem_type, len(shape), axis, length, bool(node.args["exclusive"]),
                     bool(node.args["reverse"]))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        dtype = numpy_dtype(facts.elem_type)
        y: Value = b.input(node.tensor("x"), dtype)
        n, axis = facts.length, facts.axis

        def shifted(value: Value, by: int, hint: str) -> Value:
            """value moved ``by`` along the axis (forward: towards the end), ones coming in."""
            pads = [0] * (2 * facts.rank)
            if facts.reverse:
                kept = b.Slice(value, [by], [n], [axis], hint=f"{hint}_kept")
                pads[facts.rank + axis] = by
            else:
                kept = b.Slice(value, [0], [n - by], [axis], hint=f"{hint}_kept")
                pads[axis] = by
            return b.pad(kept, pads, 1, dtype, hint=hint)

        step = 1
        while step < n:
            y = b.Mul(y, shifted(y, step, f"shift{step}"), hint=f"scan{step}")
            step *= 2
        if facts.exclusive and n > 0:
            y = shifted(y, 1, "exclusive")
        b.op("Identity", y, hint="result", out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(facts.elem_type, ctx.shape(node.tensor("x")))]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, axis_value = tensors["x"], tensors["axis"]
        assert x is not None and axis_value is not None
        return [cumprod_reference(x, int(np.asarray(axis_value).reshape(())),
                                  bool(args["exclusive"]), bool(args["reverse"]))]


def cumprod_reference(x: np.ndarray, axis: int, exclusive: bool, reverse: bool
                      ) -> np.ndarray:
    """numpy's sequential cumulative product with ONNX's exclusive and reverse."""
    data = np.flip(x, axis) if reverse else x
    result = np.cumprod(data, axis=axis, dtype=x.dtype)
    if exclusive:
        ones = np.ones_like(np.take(result, [0], axis=axis))
        result = np.concatenate([ones, np.take(result, range(result.shape[axis] - 1),
                                               axis=axis)], axis=axis)
    return np.flip(result, axis) if reverse else result


PATTERNS = [CumProd()]
