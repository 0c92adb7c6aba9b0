"""ONNX's DynamicQuantizeLinear (opset 11) in float arithmetic, for ``--lower
DynamicQuantizeLinear``: TensorRT refuses the op (NVIDIA/TensorRT#3963, microsoft/
onnxruntime#21169), and ``quantize_dynamic`` writes it in front of every MatMulInteger and
ConvInteger.

Matches ``DynamicQuantizeLinear(x) -> (y, y_scale, y_zero_point)`` in the default domain
(standard from opset 11, so only under ``--lower``). Semantics are ONNX Runtime's kernel's
(its GetQuantizationParameter and MlasQuantizeLinear), which differ from ONNX's reference
for an all-zero input: the scale is then 1, not 1/255 (measured).

Before -> after::

    low  = Min(ReduceMin(x), 0);  high = Max(ReduceMax(x), 0)
    y_scale      = high == low ? 1 : (high - low) / 255
    y_zero_point = Cast(Round(Clip(0 - low / y_scale, 0, 255)), uint8)
    y            = Cast(Clip(Round(x / y_scale) + y_zero_point, 0, 255), uint8)

Round is ONNX's (half to even), as the kernel rounds; every step is one float32 operation
in the kernel's order, so the three outputs equal the kernel's (checked against it).

Envelope: opsets 11+; float32 input of any rank; dims dynamic.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder
from decomposer.checks import require_type
from decomposer.examples import Example, F
from decomposer.forms import Form, In
from decomposer.opsets import LOWERING_DOMAIN
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern


class DynamicQuantizeLinear(Pattern[None]):
    op_type = "DynamicQuantizeLinear"
    # the default domain (under --lower) and the take-down's hand-over domain (its examples)
    forms = (Form("DynamicQuantizeLinear", domains=frozenset({"", LOWERING_DOMAIN}),
                  inputs=(In("x"),), outputs=3),)
    num_outputs = 3
    examples = (Example((("x", F, ("N", 4)),),
                        ((TensorProto.UINT8, 2), (F, 0), (TensorProto.UINT8, 0)),
                        domains=((LOWERING_DOMAIN, 17),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> None:
        require_type(ctx, node.tensor("x"), "x", (TensorProto.FLOAT,))

    def build(self, b: Builder, node: MatchedNode, facts: None) -> None:
        f32 = np.dtype(np.float32)
        x = b.input(node.tensor("x"), f32)
        zero = np.array(0, np.float32)
        low = b.Min(b.op("ReduceMin", x, keepdims=0, hint="x_min", dtype=f32), zero,
                    hint="low")
        high = b.Max(b.op("ReduceMax", x, keepdims=0, hint="x_max", dtype=f32), zero,
                     hint="high")
        spread = b.Sub(high, low, hint="spread")
        scale = b.Where(b.Equal(spread, zero, hint="flat"), np.array(1, np.float32),
                        b.Div(spread, np.array(255, np.float32), hint="ratio"),
                        hint="scale", out=node.outputs[1] or None)
        lowest, highest = np.array(0, np.float32), np.array(255, np.float32)
        start = b.Sub(zero, b.Div(low, scale, hint="low_steps"), hint="zero_float")
        zero_point = b.op("Round", b.Clip(start, lowest, highest, hint="zero_clipped"),
                          hint="zero_rounded", dtype=f32)
        if node.outputs[2]:
            b.Cast(zero_point, np.uint8, hint="zero_point", out=node.outputs[2])
        steps = b.op("Round", b.Div(x, scale, hint="steps"), hint="rounded", dtype=f32)
        shifted = b.Add(steps, zero_point, hint="shifted")
        b.Cast(b.Clip(shifted, lowest, highest, hint="saturated"), np.uint8, hint="y",
               out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: None
                     ) -> list[OutputType]:
        return [(TensorProto.UINT8, ctx.shape(node.tensor("x"))), (TensorProto.FLOAT, []),
                (TensorProto.UINT8, [])]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        low = np.float32(min(float(x.min()), 0.0)) if x.size else np.float32(0)
        high = np.float32(max(float(x.max()), 0.0)) if x.size else np.float32(0)
        scale = np.float32(1) if high == low else np.float32(high - low) / np.float32(255)
        zero = np.rint(np.clip(np.float32(0) - low / scale, 0, 255)).astype(np.float32)
        y = np.clip(np.rint(x.astype(np.float32) / scale) + zero, 0, 255).astype(np.uint8)
        return [y, np.array(scale, np.float32), np.array(zero, np.uint8)]


PATTERNS = [DynamicQuantizeLinear()]
