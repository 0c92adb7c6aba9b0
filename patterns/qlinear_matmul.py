"""ONNX's QLinearMatMul (opset 10) as QDQ, for ``--lower QLinearMatMul`` and the engines that
lack the op: TVM 0.27's ONNX frontend ("not supported for frontend ONNX: QLinearMatMul",
measured on quantize_static's QOperator BERT) and TensorRT (documented: not supported).

Matches ``QLinearMatMul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
y_zero_point) -> y`` in the default domain (standard, so only under ``--lower`` or a target
that lacks it): a and b uint8 or int8 of rank 2 and up (y a's type), float32 scales and
constant scales and zero points: a's and y's one value, b's one value or one per column of
a 2-D b (what ONNX Runtime's kernel takes; per-row a and y are refused with the reason).

Before -> after::

    y = QuantizeLinear(MatMul(DequantizeLinear(a, a_scale, a_zero_point),
                              DequantizeLinear(b, b_scale, b_zero_point[, axis=-1])),
                       y_scale, y_zero_point)

ONNX Runtime fuses that group back into its QLinearMatMul kernel (bit for bit its numbers,
checked against it); an engine that runs it in float computes the same real-valued product
and rounds it once, half to even and saturating as the kernel does, so it agrees within a
quantization step. For TensorRT the QDQ form is what its int8 path reads, for int8 tensors
with zero points 0 only (its matrix: DequantizeLinear ``x_zero_point must be zero``).
Per-column scales need DequantizeLinear's ``axis`` (opset 13): below it they are refused.

Envelope: opsets 10+ (lowered at 11+); dims dynamic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, numpy_dtype
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example
from decomposer.forms import Form, In, Reject
from decomposer.opsets import LOWERING_DOMAIN
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

U8, I8 = TensorProto.UINT8, TensorProto.INT8
_ROLES = ("a_scale", "a_zero_point", "b_scale", "b_zero_point", "y_scale", "y_zero_point")


class Facts(NamedTuple):
    elem_type: int  # of a and y
    rank: int  # of y
    values: dict[str, np.ndarray]  # the scales and zero points
    per_column: bool


class QLinearMatMul(Pattern[Facts]):
    op_type = "QLinearMatMul"
    forms = (Form("QLinearMatMul", domains=frozenset({"", LOWERING_DOMAIN}),
                  inputs=(In("a"), In("a_scale"), In("a_zero_point"), In("b"), In("b_scale"),
                          In("b_zero_point"), In("y_scale"), In("y_zero_point"))),)
    examples = (
        Example((("a", U8, ("N", 3, 6)),), ((U8, 3),),
                args=("a", np.array(0.05, np.float32), np.array(120, np.uint8),
                      (np.arange(24).reshape(6, 4) * 37 % 255 - 127).astype(np.int8),
                      np.array([0.01, 0.02, 0.015, 0.03], np.float32),
                      np.array([0, 0, 0, 0], np.int8), np.array(0.4, np.float32),
                      np.array(128, np.uint8)),
                domains=((LOWERING_DOMAIN, 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        elem_type = require_type(ctx, node.tensor("a"), "a", (U8, I8))
        b_type = require_type(ctx, node.tensor("b"), "b", (U8, I8))
        a_shape = require_shape(ctx, node.tensor("a"), "a", "(..., M, K)", 2)
        b_shape = require_shape(ctx, node.tensor("b"), "b", "(..., K, N)", 2)
        for role in ("a_scale", "b_scale", "y_scale"):
            require_type(ctx, node.tensor(role), role, (TensorProto.FLOAT,))
        for role, elem in (("a_zero_point", elem_type), ("b_zero_point", b_type),
                           ("y_zero_point", elem_type)):
            require_type(ctx, node.tensor(role), role, (elem,))
        values: dict[str, np.ndarray] = {}
        for role in _ROLES:
            value = ctx.constant(node.tensor(role))
            if value is None:
                raise Reject(f"{role} must be a constant")
            values[role] = value
        for role in ("a_scale", "a_zero_point", "y_scale", "y_zero_point"):
            if values[role].size != 1:
                raise Reject(f"{role} must be one value (per-row quantization is refused, as "
                             f"ONNX Runtime's kernel refuses it), got shape "
                             f"{list(values[role].shape)}")
        columns = max(values["b_scale"].size, values["b_zero_point"].size)
        per_column = columns > 1
        if per_column:
            if len(b_shape) != 2 or values["b_scale"].ndim > 1 or \
                    values["b_zero_point"].ndim > 1 or (isinstance(b_shape[1], int) and
                                                        columns != b_shape[1]):
                raise Reject(f"b's scale and zero point must be one value or one per column "
                             f"of a 2-D b, got {list(values['b_scale'].shape)} and "
                             f"{list(values['b_zero_point'].shape)} for b {list(b_shape)}")
            if ctx.opset < 13:
                raise Reject("per-column scales need DequantizeLinear's axis (opset 13); "
                             "take the model to 13 or later")
        return Facts(elem_type, max(len(a_shape), len(b_shape)), values, per_column)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        f32 = np.dtype(np.float32)
        values = facts.values

        def scalar(role: str) -> Any:
            value = values[role].reshape(())
            return b.const(value.astype(f32) if role.endswith("scale") else value, hint=role)

        a = b.op("DequantizeLinear", node.tensor("a"), scalar("a_scale"),
                 scalar("a_zero_point"), hint="a_float", dtype=f32)
        if facts.per_column:
            width = max(values["b_scale"].size, values["b_zero_point"].size)
            weights = b.op("DequantizeLinear", node.tensor("b"),
                           b.const(np.broadcast_to(values["b_scale"].reshape(-1), (width,))
                                   .astype(f32), hint="b_scale"),
                           b.const(np.broadcast_to(values["b_zero_point"].reshape(-1),
                                                   (width,)).copy(), hint="b_zero_point"),
                           hint="b_float", dtype=f32, axis=1)
        else:
            weights = b.op("DequantizeLinear", node.tensor("b"), scalar("b_scale"),
                           scalar("b_zero_point"), hint="b_float", dtype=f32)
        product = b.MatMul(a, weights, hint="product")
        b.op("QuantizeLinear", product, scalar("y_scale"), scalar("y_zero_point"),
             hint="quantized", dtype=numpy_dtype(facts.elem_type), out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(facts.elem_type, [None] * facts.rank)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        """ONNX's reference QLinearMatMul (``onnx.reference``) on the node."""
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        names = ("a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "y_scale",
                 "y_zero_point")
        node = helper.make_node("QLinearMatMul", list(names), ["y"])
        (y,) = ReferenceEvaluator(node).run(None, {n: tensors[n] for n in names})
        return [np.asarray(y)]


PATTERNS = [QLinearMatMul()]
