"""CumProd (ONNX opset 26) as an unrolled or doubling scan of Mul, for targets below 26.

Matches ``CumProd(x, axis; exclusive:int=0, reverse:int=0)`` in any custom domain, and in
the default domain below opset 26 (at 26+ it is standard and never offered to patterns;
``--target-opset`` below 26 sends it here). Semantics are ONNX's (its reference:
``numpy.cumprod`` along ``axis``, shifted by one for ``exclusive``, from the end for
``reverse``). ``axis`` must be a constant; the length along it must be static.

Before -> after (n the length along the axis, inclusive, forward)::

    n <= 256 (SEQUENTIAL_LIMIT):
        s_0 .. s_{n-1} = Split(x, n ones)            # one slice per step
        y = Concat(s_0, s_0*s_1, (s_0*s_1)*s_2, ...)  # n - 1 Mul, left to right
    n > 256:
        y = x
        for d in 1, 2, 4, ... < n:                    # ceil(log2 n) steps
            y = y * Pad(y[0 : n - d], d ones in front)  # y[i] *= y[i - d]
    exclusive: y = Pad(y[0 : n - 1], one 1 in front)  (n = 1: Expand(1, Shape(x)))
    reverse:   the same from the other end

Integer products are exact (wrapping multiplication is associative). Up to 256 steps float
products are taken left to right, as numpy's cumprod takes them, so they equal it bit for
bit (torch's kernel differs from both in the last bit); the doubling scan takes them in a
tree order, within float rounding of the same product. The unrolled form costs 2n nodes and
about 1.9x ONNX Runtime's kernel (the Split and the Concat each one pass; the doubling scan
was 9.5x: 7 passes of Pad, Slice and Mul for 128 steps). No Loop or Scan: every engine in
the suite runs Split, Concat, Pad, Slice and Mul.

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


# the longest axis unrolled one slice per step (2n nodes); longer ones take the doubling scan
SEQUENTIAL_LIMIT = 256


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
        if axis_value is None or axis_value.size != 1 or \
                not np.issubdtype(axis_value.dtype, np.integer):
            raise Reject("axis must be a constant integer scalar (the scan is unrolled "
                         "along it)")
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

        if 1 < n <= SEQUENTIAL_LIMIT:
            y = self._sequential(b, y, facts)
        else:
            step = 1
            while step < n:
                y = b.Mul(y, shifted(y, step, f"shift{step}"), hint=f"scan{step}")
                step *= 2
        if facts.exclusive and n == 1:
            # all ones; a Slice of nothing would be an empty tensor engines cannot fold
            y = b.Expand(np.ones([1] * facts.rank, dtype), b.Shape(y, hint="x_shape"),
                         hint="ones")
        elif facts.exclusive and n > 0:
            y = shifted(y, 1, "exclusive")
        b.op("Identity", y, hint="result", out=node.outputs[0])

    @staticmethod
    def _sequential(b: Builder, x: Value, facts: Facts) -> Value:
        """The inclusive scan as one slice per step along the axis, each the running
        product times the next slice, then one Concat: numpy's order of products, so a
        float result equals numpy's bit for bit."""
        pieces = b.Split(x, [1] * facts.length, facts.axis, hint="step")
        order = pieces[::-1] if facts.reverse else pieces
        running = [order[0]]
        for index, piece in enumerate(order[1:], 1):
            running.append(b.Mul(running[-1], piece, hint=f"product{index}"))
        return b.Concat(*(running[::-1] if facts.reverse else running), axis=facts.axis,
                        hint="scanned")

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
