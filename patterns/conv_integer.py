"""ONNX's ConvInteger (opset 10) as a float32 Conv, exactly, for ``--lower ConvInteger``:
TensorRT documents no ConvInteger (onnx-tensorrt docs/operators.md) and TVM 0.27's ONNX
frontend has none ("not supported for frontend ONNX: ConvInteger", measured on what
``quantize_dynamic`` writes for a CNN's Convs).

Matches ``ConvInteger(x, w[, x_zero_point][, w_zero_point]; auto_pad, dilations, group,
kernel_shape, pads, strides) -> y`` (int32) in the default domain (standard, so only under
``--lower`` or a target that lacks it): x and w uint8 or int8, x_zero_point one value,
w_zero_point one value or one per output channel (ONNX Runtime's kernel takes one value
only; ONNX's reference takes both). ``y = sum (x - x_zero_point) * (w - w_zero_point)``
over the window, padding contributing 0 (ONNX Runtime pads with the zero point, the
reference pads the shifted input with 0: the same).

Before -> after::

    xf = Cast(x, float32) - x_zero_point;   wf = w - w_zero_point   (folded if w is constant)
    y  = Cast(Round(Conv(xf, wf)), int32)                           (one chunk)
    y  = Sum(Cast(Round(Conv(xf[:, chunk], wf[:, chunk])), int32) ...)   (several)

Exact for every input (``._integer_products``): the input channels are cut into chunks so
that, for every output channel, the weights' magnitudes over a chunk times the data's reach
(from the zero point; 255 when it is a run-time tensor, as DynamicQuantizeLinear gives it)
stay within float32's exact integers (2**24). quantize_dynamic's 3x3 convolutions (weight
magnitudes averaging about 30) are one chunk up to about 240 input channels. Refused: a
grouped convolution that would need chunks, and a window whose one channel alone can
exceed 2**24.

Envelope: opsets 10+ (lowered at 11+); rank 3 to 5; w's shape static; x's dims dynamic.
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
from .contrib_nhwc import CONV_ATTRIBUTES, CONV_NAMES, standard_attributes

U8 = TensorProto.UINT8


class Facts(NamedTuple):
    rank: int
    weights: np.ndarray | None  # (w - w_zero_point) in float32 when w is constant
    w_zero_shape: list[int] | None  # a per-channel run-time zero point's (M, 1, ...)
    chunks: list[tuple[int, int]]  # of the input channels of a group


class ConvInteger(Pattern[Facts]):
    op_type = "ConvInteger"
    forms = (Form("ConvInteger", domains=frozenset({"", LOWERING_DOMAIN}),
                  inputs=(In("x"), In("w"), In("x_zero_point", optional=True),
                          In("w_zero_point", optional=True)),
                  attributes=CONV_ATTRIBUTES),)
    examples = (
        Example((("x", U8, ("N", 3, 5, 5)),), ((I32, 4),), attrs={"pads": [1, 1, 1, 1]},
                args=("x", (np.arange(54).reshape(2, 3, 3, 3) % 251 - 120).astype(np.int8),
                      np.array(7, np.uint8), np.array(3, np.int8)),
                domains=((LOWERING_DOMAIN, 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        x_type = require_type(ctx, node.tensor("x"), "x", EIGHT_BIT)
        w_type = require_type(ctx, node.tensor("w"), "w", EIGHT_BIT)
        shape = require_shape(ctx, node.tensor("x"), "x", "(N, C, spatial...)", 3, 5)
        w_shape = require_shape(ctx, node.tensor("w"), "w", "(M, C/group, kernel...)",
                                len(shape), len(shape))
        dims = [d for d in w_shape if isinstance(d, int)]
        if len(dims) != len(w_shape):
            raise Reject(f"w's shape must be static, got {list(w_shape)}")
        out_channels, per_group = dims[0], dims[1]
        taps = int(np.prod(dims[2:]))
        x_zero = constant_or_none(ctx, node, "x_zero_point")
        w_zero = constant_or_none(ctx, node, "w_zero_point")
        for role, elem in (("x_zero_point", x_type), ("w_zero_point", w_type)):
            if node.tensor(role):
                require_type(ctx, node.tensor(role), role, (elem,))
        zero_shape = ctx.shape(node.tensor("x_zero_point")) if node.tensor("x_zero_point") \
            else ()
        if zero_shape is not None and int(np.prod([d if isinstance(d, int) else 2
                                                   for d in zero_shape])) != 1:
            raise Reject(f"x_zero_point must be one value, got shape {list(zero_shape)}")
        w_zero_shape: list[int] | None = None
        if node.tensor("w_zero_point"):
            points = ctx.shape(node.tensor("w_zero_point"))
            count = int(np.prod([d if isinstance(d, int) else 0 for d in points])) \
                if points is not None else None
            if count is None or (count != 1 and (len(points or ()) != 1 or
                                                 count != out_channels)):
                raise Reject(f"w_zero_point must be one value or one per output channel "
                             f"({out_channels}), got shape {points}")
            if count != 1:
                w_zero_shape = [out_channels] + [1] * (len(shape) - 1)
        data = magnitude(x_type, x_zero, known=x_zero is not None or
                         not node.tensor("x_zero_point"))
        stored = ctx.weight(node.tensor("w"))
        weights = None
        if stored is not None and (w_zero is not None or not node.tensor("w_zero_point")):
            shifts = (np.zeros(1) if w_zero is None else w_zero).reshape(
                [-1] + [1] * (len(shape) - 1))
            weights = stored.astype(np.float32) - shifts.astype(np.float32)
            # (input channel of a group, output channel): the taps' magnitudes summed
            bounds = np.abs(weights).reshape(out_channels, per_group, taps).sum(2).T
        else:
            bounds = np.full((per_group, 1), taps * magnitude(w_type, None, known=False))
        chunks = reduction_chunks(bounds, data, "ConvInteger")
        if len(chunks) > 1 and int(node.args["group"]) != 1:
            raise Reject(f"a grouped ConvInteger whose sums can exceed float32's exact "
                         f"integers would need {len(chunks)} chunks per group")
        return Facts(len(shape), weights, w_zero_shape, chunks)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        attrs = standard_attributes(node.args, CONV_NAMES)
        x = shifted(b, node.tensor("x"), node.tensor("x_zero_point") or None, None, "x")
        run_time = None if facts.weights is not None else shifted(
            b, node.tensor("w"), node.tensor("w_zero_point") or None, facts.w_zero_shape, "w")
        chunked_products(
            b, x, facts.weights, run_time, facts.chunks, 1, 1,
            lambda part, weights: b.op("Conv", part, weights, hint="conv",
                                       dtype=np.dtype(np.float32), **attrs),
            node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(TensorProto.INT32, [None] * facts.rank)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        """ONNX's reference ConvInteger (``onnx.reference``) on the node."""
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        names = ("x", "w", "x_zero_point", "w_zero_point")
        node = helper.make_node("ConvInteger", [n if tensors.get(n) is not None else ""
                                                for n in names], ["y"],
                                **standard_attributes(args, CONV_NAMES))
        feeds = {n: tensors[n] for n in names if tensors.get(n) is not None}
        (y,) = ReferenceEvaluator(node).run(None, feeds)
        return [np.asarray(y).astype(np.int32)]


PATTERNS = [ConvInteger()]
