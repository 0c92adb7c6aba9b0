"""ONNX Runtime's com.microsoft QAttention (what ``quantize_dynamic`` writes for the fused
Attention of ONNX Runtime's transformer optimizer) as an integer product and the float
attention of :mod:`contrib_attention`.

Matches ``QAttention(input, weight, bias, input_scale, weight_scale[, mask_index]
[, input_zero_point][, weight_zero_point][, past]; num_heads, unidirectional=0, scale,
mask_filter_value)`` -> ``output[, present]`` in com.microsoft (the schema ONNX Runtime 1.32
registers; docs/ContribOperators.md): input uint8/int8 (B, S, H), quantized by a
DynamicQuantizeLinear in front, weight int8/uint8 (H, 3H) packed Q, K, V, bias float32
(3H,), the scales float32, per tensor (weight_scale also per column, 3H values), the zero
points of the input's and the weight's types. ``QKV = (input - input_zero_point)(weight -
weight_zero_point) * (input_scale * weight_scale) + bias``; the rest is ONNX Runtime's
Attention (mask forms, ``unidirectional``, ``past``/``present``, ``scale``,
``mask_filter_value``), decomposed as :mod:`contrib_attention` does.

Before -> after::

    QAttention(q, W, b, s_in, s_w, mask, z_in, z_w)
      ->  QKV = Cast(MatMulInteger(q, W, z_in, z_w), float) * (s_in * s_w) + b
      ->  contrib_attention's Split / MatMul / Softmax / MatMul on QKV

The integer product is exact; the float steps are the kernel's (the combined scale first),
so the output agrees with ONNX Runtime's kernel to float rounding (checked against it).

Envelope: as contrib_attention (opsets 11+, B and S dynamic); float32 (float16 refused:
ONNX Runtime's CPU QAttention takes float32 only).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_shape, require_type
from decomposer.examples import I32, Example
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode

from ._compute import ComputeType
from .contrib_attention import Attention, Facts

MS = frozenset({"com.microsoft"})
U8, I8 = TensorProto.UINT8, TensorProto.INT8


class QAttention(Attention):
    op_type = "QAttention"
    forms = (Form("QAttention", domains=MS, inputs=(
        In("input"), In("weights"), In("bias"), In("input_scale"), In("weight_scale"),
        In("mask_index", optional=True), In("input_zero_point", optional=True),
        In("weight_zero_point", optional=True), In("past", optional=True)), attributes={
            "num_heads": Attr("int"), "unidirectional": Attr("int", default=0, choices=(0, 1)),
            "scale": Attr("float", default=None),
            "mask_filter_value": Attr("float", default=-10000.0),
            "do_rotary": Attr("int", default=0, choices=(0,)),
            "past_present_share_buffer": Attr("int", default=0, choices=(0,))},
        outputs=(1, 2)),)
    examples = (
        Example((("x", U8, ("B", "S", 8)), ("m", I32, ("B",))),
                args=("x", np.arange(192, dtype=np.int8).reshape(8, 24) % 7,
                      np.zeros(24, np.float32), np.array(0.1, np.float32),
                      np.array(0.02, np.float32), "m", np.array(128, np.uint8),
                      np.array(0, np.int8)),
                outputs=((TensorProto.FLOAT, 3),),
                attrs={"num_heads": 2}, domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        input_type = require_type(ctx, node.tensor("input"), "input", (U8, I8))
        weight_type = require_type(ctx, node.tensor("weights"), "weight", (U8, I8))
        for role in ("bias", "input_scale", "weight_scale", "past"):
            if node.tensor(role):
                require_type(ctx, node.tensor(role), role, (TensorProto.FLOAT,),
                             "ONNX Runtime's CPU QAttention takes float32")
        if node.tensor("input_zero_point"):
            require_type(ctx, node.tensor("input_zero_point"), "input_zero_point",
                         (input_type,))
        if node.tensor("weight_zero_point"):
            require_type(ctx, node.tensor("weight_zero_point"), "weight_zero_point",
                         (weight_type,))
        shape = require_shape(ctx, node.tensor("input"), "input", "(batch, sequence, hidden)",
                              3, 3)
        weights = require_shape(ctx, node.tensor("weights"), "weight", "(hidden, 3 hidden)",
                                2, 2)
        heads = int(node.args["num_heads"])
        if heads <= 0 or not isinstance(weights[1], int) or weights[1] % (3 * heads):
            raise Reject("the weight's last dim must be static and a multiple of 3 * num_heads")
        for role in ("input_scale", "input_zero_point", "weight_zero_point"):
            dims = ctx.shape(node.tensor(role)) if node.tensor(role) else None
            if dims is not None and dims not in ((), (1,)):
                raise Reject(f"{role} must be per tensor, got shape {list(dims)}")
        scale_dims = ctx.shape(node.tensor("weight_scale"))
        if scale_dims is not None and scale_dims not in ((), (1,), (weights[1],)):
            raise Reject(f"weight_scale must be per tensor or per column ({weights[1]}), "
                         f"got shape {list(scale_dims)}")
        size = weights[1] // 3
        scale = node.args["scale"]
        scale = float(scale) if scale is not None else 1.0 / math.sqrt(size // heads)
        return Facts(TensorProto.FLOAT, heads, (size, size, size), scale,
                     self._mask_form(node, ctx, shape))

    def projection(self, b: Builder, node: MatchedNode, facts: Facts, compute: ComputeType
                   ) -> tuple[Value, Value]:
        x = b.input(node.tensor("input"))
        inputs: list[str | Value] = [x, node.tensor("weights")]
        input_zero, weight_zero = node.tensor("input_zero_point"), \
            node.tensor("weight_zero_point")
        if input_zero or weight_zero:
            inputs.append(_scalar(b, input_zero, "input_zero") if input_zero else
                          b.const(np.zeros((), np.uint8), hint="input_zero"))
        if weight_zero:
            inputs.append(_scalar(b, weight_zero, "weight_zero"))
        product = b.op("MatMulInteger", *inputs, hint="qkv_integer", dtype=np.int32)
        floats = b.Cast(product, np.float32, hint="qkv_float")
        scale = b.Mul(_scalar(b, node.tensor("input_scale"), "input_scale"),
                      b.input(node.tensor("weight_scale"), np.float32), hint="qkv_scale")
        qkv = b.Add(b.Mul(floats, scale, hint="qkv_scaled"), node.tensor("bias"),
                    hint="qkv_bias")
        return qkv, x

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, weights = tensors["input"], tensors["weights"]
        assert x is not None and weights is not None
        x_scale, w_scale = tensors["input_scale"], tensors["weight_scale"]
        assert x_scale is not None and w_scale is not None
        x_zero = tensors.get("input_zero_point")
        w_zero = tensors.get("weight_zero_point")
        product = (x.astype(np.int64) - (0 if x_zero is None else int(x_zero.reshape(-1)[0]))
                   ) @ (weights.astype(np.int64) -
                        (0 if w_zero is None else int(w_zero.reshape(-1)[0])))
        scale = np.float32(x_scale.reshape(-1)[0]) * w_scale.astype(np.float32).reshape(-1)
        qkv = product.astype(np.float32) * scale
        identity = np.eye(qkv.shape[-1], dtype=np.float32)
        float_args = dict(args, qkv_hidden_sizes=None)
        return super().compute(float_args, **{**tensors, "input": qkv, "weights": identity})


def _scalar(b: Builder, name: str, hint: str) -> Value:
    """A per-tensor parameter as a scalar (MatMulInteger wants scalar zero points)."""
    return b.Reshape(b.input(name), np.array([], np.int64), hint=f"{hint}_scalar")


PATTERNS = [QAttention()]
