"""ONNX's MatMulInteger (opset 10) as a float32 MatMul, exactly, for ``--lower
MatMulInteger``: TensorRT documents no MatMulInteger (onnx-tensorrt docs/operators.md), and
``quantize_dynamic`` writes it with DynamicQuantizeLinear for every MatMul of a transformer
(NVIDIA/TensorRT#3963: such models do not build; DynamicQuantizeLinear has its own
lowering).

Matches ``MatMulInteger(A, B[, a_zero_point][, b_zero_point]) -> Y`` (int32) in the default
domain (standard, so only under ``--lower`` or a target that lacks it): A (..., M, K) and
B (..., K, N) uint8 or int8, ranks 2 and up; a_zero_point one value, one per row of a 2-D A
(M,) or A's rank with K as 1; b_zero_point one value, one per column (N,) or B's rank with
K as 1. ``Y = (A - a_zero_point) @ (B - b_zero_point)`` in int32, numpy broadcasting of
the leading dims.

Before -> after::

    Af = Cast(A, float32) - a_zero_point;   Bf = B - b_zero_point   (folded if B is constant)
    Y  = Cast(Round(MatMul(Af, Bf)), int32)                         (one chunk)
    Y  = Cast(Round(MatMul(Af[..., chunk], Bf[chunk, :])), int32) + ...   (several)

Exact for every input (``._integer_products``): K is cut into chunks so that, for every
column of B, the weights' magnitudes over a chunk times A's reach (from its zero point; 255
when it is a run-time tensor, as DynamicQuantizeLinear gives it) stay within float32's
exact integers (2**24): with quantize_dynamic's int8 weights (magnitudes averaging about
30), one chunk up to a K of about 2,000, two for BERT's 3072.

Envelope: opsets 10+ (lowered at 11+); K static; other dims dynamic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder
from decomposer.checks import require_shape, require_type
from decomposer.examples import I32, Example
from decomposer.forms import Form, In, Reject
from decomposer.opsets import LOWERING_DOMAIN
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._integer_products import (
    EIGHT_BIT,
    chunked_products,
    constant_or_none,
    magnitude,
    reduction_chunks,
    shifted,
)

U8, I8 = TensorProto.UINT8, TensorProto.INT8


class Facts(NamedTuple):
    rank: int  # of Y
    weights: np.ndarray | None  # (B - b_zero_point) in float32 when B is constant
    a_zero_shape: list[int] | None  # a per-row zero point of a 2-D A, as (M, 1)
    chunks: list[tuple[int, int]]  # of K


def _points(ctx: MatchContext, node: MatchedNode, role: str) -> tuple[int | str | None, ...]:
    shape = ctx.shape(node.tensor(role))
    if shape is None:
        raise Reject(f"{role}'s shape must be known")
    return shape


class MatMulInteger(Pattern[Facts]):
    op_type = "MatMulInteger"
    forms = (Form("MatMulInteger", domains=frozenset({"", LOWERING_DOMAIN}),
                  inputs=(In("A"), In("B"), In("a_zero_point", optional=True),
                          In("b_zero_point", optional=True))),)
    examples = (
        Example((("a", U8, ("N", 3, 6)),), ((I32, 3),),
                args=("a", (np.arange(24).reshape(6, 4) * 37 % 255 - 127).astype(np.int8),
                      np.array(128, np.uint8), np.array([0, 1, -1, 2], np.int8)),
                domains=((LOWERING_DOMAIN, 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        a_type = require_type(ctx, node.tensor("A"), "A", EIGHT_BIT)
        b_type = require_type(ctx, node.tensor("B"), "B", EIGHT_BIT)
        a_shape = require_shape(ctx, node.tensor("A"), "A", "(..., M, K)", 2)
        b_shape = require_shape(ctx, node.tensor("B"), "B", "(..., K, N)", 2)
        depth = b_shape[-2]
        if not isinstance(depth, int):
            raise Reject(f"B's K (its dim -2) must be static, got {depth!r}")
        a_zero_shape: list[int] | None = None
        if node.tensor("a_zero_point"):
            require_type(ctx, node.tensor("a_zero_point"), "a_zero_point", (a_type,))
            points = _points(ctx, node, "a_zero_point")
            if len(points) == 1 and points[0] != 1:
                if len(a_shape) != 2 or points[0] != a_shape[0]:
                    raise Reject(f"a 1-D a_zero_point {list(points)} is per row of a 2-D A "
                                 f"only (A is {list(a_shape)})")
                a_zero_shape = [-1, 1]
            elif len(points) > 1 and (len(points) != len(a_shape) or points[-1] != 1):
                raise Reject(f"a_zero_point {list(points)} must be one value, (M,) or A's "
                             f"rank with K as 1")
        if node.tensor("b_zero_point"):
            require_type(ctx, node.tensor("b_zero_point"), "b_zero_point", (b_type,))
            points = _points(ctx, node, "b_zero_point")
            if len(points) > 1 and (len(points) != len(b_shape) or points[-2] != 1):
                raise Reject(f"b_zero_point {list(points)} must be one value, (N,) or B's "
                             f"rank with K as 1")
        a_zero = constant_or_none(ctx, node, "a_zero_point")
        b_zero = constant_or_none(ctx, node, "b_zero_point")
        data = magnitude(a_type, a_zero, known=a_zero is not None or
                         not node.tensor("a_zero_point"))
        stored = ctx.weight(node.tensor("B"))
        weights = None
        if stored is not None and (b_zero is not None or not node.tensor("b_zero_point")):
            weights = stored.astype(np.float32) - (
                np.float32(0) if b_zero is None else b_zero.astype(np.float32))
            # (K, every other index of B): each column's magnitudes along K
            bounds = np.moveaxis(np.abs(weights), -2, 0).reshape(depth, -1)
        else:
            bounds = np.full((depth, 1), magnitude(b_type, None, known=False))
        chunks = reduction_chunks(bounds, data, "MatMulInteger")
        return Facts(max(len(a_shape), len(b_shape)), weights, a_zero_shape, chunks)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        a = shifted(b, node.tensor("A"), node.tensor("a_zero_point") or None,
                    facts.a_zero_shape, "a")
        run_time = None if facts.weights is not None else shifted(
            b, node.tensor("B"), node.tensor("b_zero_point") or None, None, "b")
        chunked_products(b, a, facts.weights, run_time, facts.chunks, -1, -2,
                         lambda part, weights: b.MatMul(part, weights, hint="matmul"),
                         node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(TensorProto.INT32, [None] * facts.rank)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        a, b = tensors["A"], tensors["B"]
        assert a is not None and b is not None
        a_zero, b_zero = tensors.get("a_zero_point"), tensors.get("b_zero_point")
        left = a.astype(np.int64)
        if a_zero is not None:
            left = left - (a_zero.astype(np.int64).reshape(-1, 1)
                           if a_zero.ndim == 1 and a_zero.size > 1 else a_zero.astype(np.int64))
        right = b.astype(np.int64) - (0 if b_zero is None else b_zero.astype(np.int64))
        return [np.matmul(left, right).astype(np.int32)]


PATTERNS = [MatMulInteger()]
