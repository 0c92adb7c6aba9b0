"""ONNX Runtime's channels-last ops (what its NHWC transformer writes in a session at
ORT_ENABLE_ALL: com.microsoft ``QLinearConv`` with ``channels_last=1``, ``NhwcMaxPool``;
diffusers' VAE through the transformer optimizer: ``NhwcConv``) as the standard op between
two Transposes.

Matches, in com.microsoft (the schemas ONNX Runtime 1.32 registers; docs/ContribOperators.md):

- ``QLinearConv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
  B; auto_pad, channels_last=0, dilations, group, kernel_shape, pads, strides)``: ONNX's
  QLinearConv (weights (M, C/group, kH, kW) as there), x and y channels last when
  ``channels_last`` is 1; with ``--lower QLinearConv`` ONNX's own QLinearConv too, as QDQ
  (OpenVINO 2026.4's import refuses it with per-channel weights when the input and output
  channel counts differ: "The number of dequantization scale elements '8' must match the
  input shape dimension '3'", measured on quantize_static's QOperator output);
- ``NhwcMaxPool(x; auto_pad, ceil_mode, dilations, kernel_shape, pads, strides)``: ONNX's
  MaxPool of an int8/uint8 NHWC tensor;
- ``NhwcConv(X, W, B; auto_pad, dilations, group, kernel_shape, pads, strides)``: ONNX's Conv
  of an NHWC float tensor whose weights are channels last too, (M, kH, kW, C/group) (any
  spatial rank: channels on the last axis). That is the layout ONNX Runtime's transformer
  optimizer writes (``fusion_nhwc_conv.py``: the Conv's weights transposed (0, 2, 3, 1),
  as an initializer or a Transpose node) and its CUDA kernel reads (``Conv<T, NHWC>::PrePack``
  transposes weights only for the internal NHWC domain, not for this op; there is no CPU
  kernel). Constant weights are transposed back when decomposing, others by a Transpose.

Before -> after::

    op(x NHWC)  ->  Transpose(op(Transpose(x, to NCHW)), to NHWC)     (any spatial rank)
    QLinearConv, opset 13+, constant scales and zero points:
                ->  QuantizeLinear(Conv(DequantizeLinear(x), DequantizeLinear(w, axis 0),
                                        DequantizeLinear(B, x_scale * w_scale, 0)))
    QLinearConv otherwise  ->  ONNX's QLinearConv (the same inputs)

The Transposes move int8 values (or floats) unchanged, and the standard op is the one ONNX
Runtime's kernel implements in the other layout; ONNX Runtime fuses the QDQ Conv back into
its QLinearConv: the result equals the kernel's bit for bit (checked against it). MaxPool
takes int8/uint8 from opset 12; below it the values go through float32 (exact for 8-bit
integers).

Envelope: opsets 11+; ranks known (3 to 5); dims dynamic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

MS = frozenset({"com.microsoft"})
U8, I8 = TensorProto.UINT8, TensorProto.INT8

CONV_ATTRIBUTES = {
    "auto_pad": Attr("string", default="NOTSET",
                     choices=("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")),
    "dilations": Attr("ints", default=()),
    "group": Attr("int", default=1),
    "kernel_shape": Attr("ints", default=()),
    "pads": Attr("ints", default=()),
    "strides": Attr("ints", default=())}


class Facts(NamedTuple):
    elem_type: int
    rank: int
    # QLinearConv as QDQ: the scales and zero points (constants), else None
    quantization: tuple[np.ndarray, ...] | None = None
    # NhwcConv: its constant weights back in ONNX's (M, C/group, k...) layout, else None
    weights: np.ndarray | None = None


def standard_attributes(args: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The attributes ``names`` of a node's parsed ``args`` as the standard op takes them
    (strings decoded, sequences as lists), defaults and absent ones left out."""
    found: dict[str, Any] = {}
    for name in names:
        value = args.get(name)
        if isinstance(value, bytes):
            value = value.decode()
        if value in ((), None, "NOTSET") or (name == "group" and value == 1) or \
                (name == "ceil_mode" and value == 0):
            continue
        found[name] = list(value) if isinstance(value, (tuple, list)) else value
    return found


def channels_first_order(rank: int) -> list[int]:
    """The permutation of a channels-last tensor (N, spatial..., C) to (N, C, spatial...);
    NhwcConv's (M, spatial..., C/group) weights move the same way."""
    return [0, rank - 1, *range(1, rank - 1)]


def channels_last_order(rank: int) -> list[int]:
    """The inverse of :func:`channels_first_order`."""
    return [0, *range(2, rank), 1]


def to_channels_first(b: Builder, x: str | Value, rank: int, hint: str) -> Value:
    return b.Transpose(x, channels_first_order(rank), hint=hint)


def to_channels_last(b: Builder, x: Value, rank: int, out: str, hint: str) -> Value:
    return b.Transpose(x, channels_last_order(rank), hint=hint, out=out)


class _ChannelsLast(Pattern[Facts]):
    data = "x"
    allowed: tuple[int, ...] = (U8, I8)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        elem_type = require_type(ctx, node.tensor(self.data), self.data, self.allowed)
        shape = require_shape(ctx, node.tensor(self.data), self.data, "(N, spatial..., C)",
                              3, 5)
        return Facts(elem_type, len(shape))

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(facts.elem_type, [None] * facts.rank)]

    def channels_last(self, node: MatchedNode) -> bool:
        return True

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        if not self.channels_last(node):
            self.standard(b, node, facts, node.tensor(self.data), node.outputs[0])
            return
        first = to_channels_first(b, node.tensor(self.data), facts.rank, "channels_first")
        result = self.standard(b, node, facts, first, None)
        to_channels_last(b, result, facts.rank, node.outputs[0], "channels_last")

    def standard(self, b: Builder, node: MatchedNode, facts: Facts, x: str | Value,
                 out: str | None) -> Value:
        raise NotImplementedError

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        x = tensors[self.data]
        assert x is not None
        rank = x.ndim
        last = self.channels_last_args(args)
        first = np.transpose(x, channels_first_order(rank)) if last else x
        names = [name for name, value in tensors.items() if value is not None]
        feeds = {name: (first if name == self.data else tensors[name]) for name in names}
        op, attrs = self.reference_op(args)
        node = helper.make_node(op, [n if tensors.get(n) is not None else "" for n in
                                     self.reference_inputs()], ["y"], **attrs)
        (y,) = ReferenceEvaluator(node).run(None, feeds)
        y = np.asarray(y)
        return [np.transpose(y, channels_last_order(rank)) if last else y]

    def channels_last_args(self, args: dict[str, Any]) -> bool:
        return True

    def reference_op(self, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def reference_inputs(self) -> tuple[str, ...]:
        return (self.data,)


CONV_NAMES = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")


class QLinearConv(_ChannelsLast):
    op_type = "QLinearConv"
    # the standard QLinearConv too, under --lower QLinearConv: OpenVINO 2026.4 cannot import
    # it with per-channel weights whose channel counts differ (measured); the QDQ form runs
    forms = (Form("QLinearConv", domains=MS | {""}, inputs=(
        In("x"), In("x_scale"), In("x_zero_point"), In("w"), In("w_scale"),
        In("w_zero_point"), In("y_scale"), In("y_zero_point"), In("B", optional=True)),
        attributes={**CONV_ATTRIBUTES,
                    "channels_last": Attr("int", default=0, choices=(0, 1))}),)
    examples = (
        Example((("x", U8, ("N", 5, 5, 2)),), ((U8, 4),), attrs={"channels_last": 1},
                args=("x", np.array(0.1, np.float32), np.array(128, np.uint8),
                      np.ones((3, 2, 3, 3), np.int8), np.array(0.02, np.float32),
                      np.array(0, np.int8), np.array(0.5, np.float32),
                      np.array(10, np.uint8)), domains=(("com.microsoft", 17),)),
    )

    def channels_last(self, node: MatchedNode) -> bool:
        return bool(node.args["channels_last"])

    def channels_last_args(self, args: dict[str, Any]) -> bool:
        return bool(args["channels_last"])

    _ROLES = ("x_scale", "x_zero_point", "w_scale", "w_zero_point", "y_scale", "y_zero_point")

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        facts = super().check(node, ctx)
        for role in ("x_scale", "w_scale", "y_scale"):
            require_type(ctx, node.tensor(role), role, (TensorProto.FLOAT,))
        for role in ("x_zero_point", "y_zero_point"):
            require_type(ctx, node.tensor(role), role, (facts.elem_type,))
        w_type = require_type(ctx, node.tensor("w"), "w", (U8, I8))
        require_type(ctx, node.tensor("w_zero_point"), "w_zero_point", (w_type,))
        if node.tensor("B"):
            require_type(ctx, node.tensor("B"), "B", (TensorProto.INT32,))
        for role in ("x_scale", "x_zero_point", "y_scale", "y_zero_point"):
            shape = ctx.shape(node.tensor(role))
            if shape is not None and int(np.prod([d if isinstance(d, int) else 2
                                                  for d in shape])) != 1:
                raise Reject(f"{role} must be per tensor (one value), got shape {list(shape)}")
        weights = ctx.shape(node.tensor("w"))
        for role in ("w_scale", "w_zero_point"):
            shape = ctx.shape(node.tensor(role))
            if shape is not None and weights is not None and len(shape) <= 1 and \
                    (not shape or shape[0] in (1, weights[0])):
                continue
            if shape is not None:
                raise Reject(f"{role} must be per tensor or per output channel, got shape "
                             f"{list(shape)}")
        values = [ctx.constant(node.tensor(role)) for role in self._ROLES]
        if ctx.opset < 13 or any(value is None for value in values):
            return facts  # ONNX's QLinearConv (per-axis DequantizeLinear is 13+)
        return facts._replace(quantization=tuple(v for v in values if v is not None))

    def standard(self, b: Builder, node: MatchedNode, facts: Facts, x: str | Value,
                 out: str | None) -> Value:
        if facts.quantization is not None:
            return self._qdq(b, node, facts, x, out)
        inputs: list[str | Value] = [x] + [node.tensor(role) for role in (
            "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale",
            "y_zero_point")]
        if node.tensor("B"):
            inputs.append(node.tensor("B"))
        return b.op("QLinearConv", *inputs, hint="conv", out=out,
                    dtype=numpy_dtype(facts.elem_type),
                    **standard_attributes(node.args, CONV_NAMES))

    def _qdq(self, b: Builder, node: MatchedNode, facts: Facts, x: str | Value,
             out: str | None) -> Value:
        """DequantizeLinear -> Conv -> QuantizeLinear, the weights per output channel along
        axis 0 and the int32 bias with scale x_scale * w_scale: ONNX Runtime fuses it back
        into its QLinearConv, and OpenVINO runs it (its QLinearConv import dequantizes a
        per-channel weight along the wrong axis when the channel counts differ, measured)."""
        assert facts.quantization is not None
        x_scale, x_zero, w_scale, w_zero, y_scale, y_zero = facts.quantization
        dtype = numpy_dtype(facts.elem_type)
        f32 = np.dtype(np.float32)
        floats = b.op("DequantizeLinear", x, b.const(x_scale.astype(f32).reshape(()),
                                                     hint="x_scale"),
                      b.const(x_zero.reshape(()), hint="x_zero"), hint="x_float", dtype=f32)
        per_channel = w_scale.size > 1 or w_zero.size > 1
        width = max(w_scale.size, w_zero.size)
        if per_channel:
            w_args = [b.const(np.broadcast_to(w_scale.reshape(-1), (width,)).astype(f32),
                              hint="w_scale"),
                      b.const(np.broadcast_to(w_zero.reshape(-1), (width,)).copy(),
                              hint="w_zero")]
        else:
            w_args = [b.const(w_scale.astype(f32).reshape(()), hint="w_scale"),
                      b.const(w_zero.reshape(()), hint="w_zero")]
        axis: dict[str, Any] = {"axis": 0} if per_channel else {}
        weights = b.op("DequantizeLinear", node.tensor("w"), *w_args, hint="w_float",
                       dtype=f32, **axis)
        inputs: list[str | Value] = [floats, weights]
        if node.tensor("B"):
            combined = np.float32(x_scale.reshape(-1)[0]) * \
                np.broadcast_to(w_scale.reshape(-1), (width,)).astype(f32)
            bias_args = [b.const(combined if per_channel else combined.reshape(()),
                                 hint="bias_scale"),
                         b.const(np.zeros(width if per_channel else (), np.int32),
                                 hint="bias_zero")]
            inputs.append(b.op("DequantizeLinear", node.tensor("B"), *bias_args,
                               hint="bias_float", dtype=f32, **axis))
        conv = b.op("Conv", *inputs, hint="conv", dtype=f32,
                    **standard_attributes(node.args, CONV_NAMES))
        return b.op("QuantizeLinear", conv, b.const(y_scale.astype(f32).reshape(()),
                                                    hint="y_scale"),
                    b.const(y_zero.reshape(()), hint="y_zero"), hint="quantized", out=out,
                    dtype=dtype)

    def reference_op(self, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "QLinearConv", standard_attributes(args, CONV_NAMES)

    def reference_inputs(self) -> tuple[str, ...]:
        return ("x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale",
                "y_zero_point", "B")


_POOL_NAMES = ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides")


class NhwcMaxPool(_ChannelsLast):
    op_type = "NhwcMaxPool"
    forms = (Form("NhwcMaxPool", domains=MS, inputs=(In("x"),), attributes={
        "auto_pad": Attr("string", default="NOTSET",
                         choices=("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")),
        "ceil_mode": Attr("int", default=0, choices=(0, 1)),
        "dilations": Attr("ints", default=()),
        "kernel_shape": Attr("ints"),
        "pads": Attr("ints", default=()),
        "strides": Attr("ints", default=())}),)
    examples = (
        Example((("x", U8, ("N", 6, 6, 3)),), attrs={"kernel_shape": [2, 2],
                                                     "strides": [2, 2]},
                domains=(("com.microsoft", 17), ("com.microsoft", 11))),
    )

    def standard(self, b: Builder, node: MatchedNode, facts: Facts, x: str | Value,
                 out: str | None) -> Value:
        attrs = standard_attributes(node.args, _POOL_NAMES)
        dtype = numpy_dtype(facts.elem_type)
        if b.opset >= 12:
            return b.op("MaxPool", x, hint="pooled", out=out, dtype=dtype, **attrs)
        # MaxPool-11 takes floats only: 8-bit integers are exact in float32
        pooled = b.op("MaxPool", b.Cast(x, np.float32, hint="x_float"), hint="pooled_float",
                      dtype=np.float32, **attrs)
        return b.Cast(pooled, dtype, hint="pooled", out=out)

    def reference_op(self, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "MaxPool", standard_attributes(args, _POOL_NAMES)


class NhwcConv(_ChannelsLast):
    op_type = "NhwcConv"
    data = "X"
    allowed = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)
    forms = (Form("NhwcConv", domains=MS, inputs=(In("X"), In("W"), In("B", optional=True)),
                  attributes=CONV_ATTRIBUTES),)
    examples = (
        Example((("x", F, ("N", 5, 5, 2)), ("w", F, (3, 3, 3, 2))),
                attrs={"pads": [1, 1, 1, 1]}, domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        facts = super().check(node, ctx)
        require_type(ctx, node.tensor("W"), "W", (facts.elem_type,))
        require_shape(ctx, node.tensor("W"), "W", "(M, spatial..., C/group)", facts.rank,
                      facts.rank)
        if node.tensor("B"):
            require_type(ctx, node.tensor("B"), "B", (facts.elem_type,))
        stored = ctx.weight(node.tensor("W"))
        if stored is not None:
            return facts._replace(weights=np.ascontiguousarray(
                np.transpose(stored, channels_first_order(facts.rank))))
        return facts

    def standard(self, b: Builder, node: MatchedNode, facts: Facts, x: str | Value,
                 out: str | None) -> Value:
        weights: str | Value
        if facts.weights is not None:
            weights = b.weight(onnx.numpy_helper.from_array(facts.weights), hint="weights")
        else:
            weights = b.Transpose(node.tensor("W"), channels_first_order(facts.rank),
                                  hint="weights")
        inputs: list[str | Value] = [x, weights]
        if node.tensor("B"):
            inputs.append(node.tensor("B"))
        return b.op("Conv", *inputs, hint="conv", out=out, dtype=numpy_dtype(facts.elem_type),
                    **standard_attributes(node.args, CONV_NAMES))

    def reference_op(self, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return "Conv", standard_attributes(args, CONV_NAMES)

    def reference_inputs(self) -> tuple[str, ...]:
        return ("X", "W", "B")

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        w = tensors["W"]
        assert w is not None
        return super().compute(args, **{**tensors,
                                        "W": np.transpose(w, channels_first_order(w.ndim))})




PATTERNS = [QLinearConv(), NhwcMaxPool(), NhwcConv()]
