"""ONNX Runtime's quantized matrix products (com.microsoft ``QGemm``, ``MatMulIntegerToFloat``
and ``DynamicQuantizeMatMul``: what ``quantize_static(..., quant_format=QOperator)`` and
``quantize_dynamic`` followed by an ORT_ENABLE_ALL session write) as standard QDQ and
integer ops.

Matches, in com.microsoft (the schemas ONNX Runtime 1.32 registers; docs/ContribOperators.md):

- ``QGemm(A, a_scale, a_zero_point, B, b_scale, b_zero_point, C, y_scale, y_zero_point;
  alpha=1, transA=0, transB=0)``: ``Y = alpha * (A' B' + C')`` (alpha scales the bias too,
  measured against the kernel) with ``A' = (A - a_zp) * a_scale``,
  ``B'`` alike (b_scale and b_zero_point per tensor or per output column), C an int32 bias
  quantized with scale ``a_scale * b_scale`` and zero point 0; Y quantized with y_scale and
  y_zero_point, or float when y_scale is absent;
- ``MatMulIntegerToFloat(A, B, a_scale, b_scale, a_zero_point, b_zero_point, bias)``:
  ``Y = (A - a_zp)(B - b_zp) * (a_scale * b_scale) + bias``, float32;
- ``DynamicQuantizeMatMul(A, B, b_scale, b_zero_point, bias)``: A quantized at run time as
  ``DynamicQuantizeLinear`` does (uint8, scale and zero point from A's range), then the
  product above.

Before -> after::

    QGemm                  ->  Gemm(DequantizeLinear(A), DequantizeLinear(B),
                                    DequantizeLinear(C, a_scale * b_scale, 0); alpha,
                                    beta = alpha, transA, transB)
                               [-> QuantizeLinear(y_scale, y_zero_point)]
    MatMulIntegerToFloat   ->  Cast(MatMulInteger(A, B, a_zp, b_zp), float) *
                               (a_scale * b_scale) [+ bias]
    DynamicQuantizeMatMul  ->  q, s, z = DynamicQuantizeLinear(A); the line above with
                               (q, s, z)

Exactness: ONNX Runtime fuses each of these groups back into the kernel it replaces (QGemm
with and without bias and output quantization, MatMulIntegerToFloat, DynamicQuantizeMatMul;
measured, ORT_ENABLE_EXTENDED), so on ONNX Runtime the output is the kernel's (a QGemm with
a bias and alpha != 1 stays a float Gemm: within float rounding of it); unfused, the
integer product is exact and the float steps are the kernels' (the combined scale first).
``--lower DynamicQuantizeLinear`` writes that standard op in arithmetic for engines that
lack it (TensorRT).

Envelope: opsets 13+ (a per-column scale needs DequantizeLinear-13's axis); float32 scales;
B's per-column parameters 1-D of its output width; dims dynamic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from .contrib_qlinear import (
    dequantize_reference,
    per_tensor_constants,
    quantize_reference,
    scalar,
)

MS = frozenset({"com.microsoft"})
U8, I8 = TensorProto.UINT8, TensorProto.INT8
_QUANTIZED = (U8, I8)


class Facts(NamedTuple):
    a_type: int
    b_type: int
    out_type: int  # float32, or the quantized output's type
    columns: int | None  # B's output width where per-column, else None
    constants: tuple[tuple[str, np.ndarray | None], ...]


def _per_column(ctx: MatchContext, name: str, label: str, width: int | str | None
                ) -> bool:
    """Whether ``name`` (a scale or zero point of B) is per output column; Reject if it is
    neither that nor per tensor."""
    if not name:
        return False
    shape = ctx.shape(name)
    if shape is None:
        raise Reject(f"the shape of {label} must be known")
    if len(shape) == 0 or list(shape) == [1]:
        return False
    if len(shape) == 1 and (not isinstance(width, int) or shape[0] == width):
        return True
    raise Reject(f"{label} must be per tensor or per output column, got {list(shape)}")


def _scalar_of(b: Builder, name: str, facts: Facts, dtype: Any, hint: str) -> Value:
    return scalar(b, name, facts.constants, np.dtype(dtype), hint)


def _vector_or_scalar(b: Builder, name: str, facts: Facts, dtype: Any, hint: str) -> Value:
    """A per-column parameter as it is (1-D), a per-tensor one as a scalar."""
    if name and facts.columns is not None:
        value = dict(facts.constants).get(name)
        if value is not None and value.size > 1:
            return b.input(name, dtype)
    return _scalar_of(b, name, facts, dtype, hint)


def _combined_scale(b: Builder, a_scale: str, b_scale: str, facts: Facts) -> Value:
    """a_scale * b_scale: a constant when both are, the kernels' order (a first)."""
    known = dict(facts.constants)
    a_value, b_value = known.get(a_scale), known.get(b_scale)
    if a_value is not None and b_value is not None:
        product = np.float32(a_value.reshape(-1)[0]) * b_value.astype(np.float32)
        return b.const(product.reshape(-1) if product.size > 1 else product.reshape(()),
                       hint="combined_scale")
    return b.Mul(_scalar_of(b, a_scale, facts, np.float32, "a_scale"),
                 _vector_or_scalar(b, b_scale, facts, np.float32, "b_scale"),
                 hint="combined_scale")


class QGemm(Pattern[Facts]):
    op_type = "QGemm"
    forms = (Form("QGemm", domains=MS, inputs=(
        In("A"), In("a_scale"), In("a_zero_point"), In("B"), In("b_scale"),
        In("b_zero_point"), In("C", optional=True), In("y_scale", optional=True),
        In("y_zero_point", optional=True)), attributes={
            "alpha": Attr("float", default=1.0), "transA": Attr("int", default=0,
                                                                  choices=(0, 1)),
            "transB": Attr("int", default=0, choices=(0, 1))}),)
    examples = (
        Example((("a", U8, ("N", 4)),), ((F, 2),), attrs={"transB": 1},
                args=("a", np.array(0.1, np.float32), np.array(128, np.uint8),
                      np.arange(12, dtype=np.int8).reshape(3, 4), np.array(0.02, np.float32),
                      np.array(0, np.int8)), domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        a_type = require_type(ctx, node.tensor("A"), "A", _QUANTIZED)
        b_type = require_type(ctx, node.tensor("B"), "B", _QUANTIZED)
        require_type(ctx, node.tensor("a_zero_point"), "a_zero_point", (a_type,))
        require_type(ctx, node.tensor("b_zero_point"), "b_zero_point", (b_type,))
        for role in ("a_scale", "b_scale"):
            require_type(ctx, node.tensor(role), role, (TensorProto.FLOAT,))
        b_shape = require_shape(ctx, node.tensor("B"), "B", "(K, N) or (N, K)", 2, 2)
        width = b_shape[0] if node.args["transB"] else b_shape[1]
        require_shape(ctx, node.tensor("A"), "A", "(M, K) or (K, M)", 2, 2)
        for role in ("a_scale", "a_zero_point", "y_scale", "y_zero_point"):
            if node.tensor(role) and ctx.shape(node.tensor(role)) not in ((), (1,)):
                raise Reject(f"{role} must be per tensor (one value), got shape "
                             f"{ctx.shape(node.tensor(role))}")
        per_column = _per_column(ctx, node.tensor("b_scale"), "b_scale", width) | \
            _per_column(ctx, node.tensor("b_zero_point"), "b_zero_point", width)
        if per_column and ctx.opset < 13:
            raise Reject("a per-column b_scale needs DequantizeLinear-13's axis (opset 13)")
        out_type: int = TensorProto.FLOAT
        if node.tensor("y_scale"):
            require_type(ctx, node.tensor("y_scale"), "y_scale", (TensorProto.FLOAT,))
            if not node.tensor("y_zero_point"):
                raise Reject("y_scale without y_zero_point: the output type is unknown")
            out_type = require_type(ctx, node.tensor("y_zero_point"), "y_zero_point",
                                    _QUANTIZED)
        if node.tensor("C"):
            require_type(ctx, node.tensor("C"), "C", (TensorProto.INT32,))
        if per_column and not isinstance(width, int):
            raise Reject("a per-column b_scale needs B's static output width")
        columns = width if per_column and isinstance(width, int) else None
        names = [node.tensor(role) for role in ("a_scale", "a_zero_point", "b_scale",
                                                "b_zero_point", "y_scale", "y_zero_point")]
        return Facts(a_type, b_type, out_type, columns, per_tensor_constants(ctx, names))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        f32 = np.dtype(np.float32)
        a = b.op("DequantizeLinear", node.tensor("A"),
                 _scalar_of(b, node.tensor("a_scale"), facts, f32, "a_scale"),
                 _scalar_of(b, node.tensor("a_zero_point"), facts, numpy_dtype(facts.a_type),
                            "a_zero"), hint="a_float", dtype=f32)
        per_axis: dict[str, Any] = {"axis": 0 if node.args["transB"] else 1} \
            if facts.columns is not None else {}
        b_inputs = self._column_parameters(b, node, facts)
        weights = b.op("DequantizeLinear", node.tensor("B"), *b_inputs, hint="b_float",
                       dtype=f32, **per_axis)
        inputs: list[Value | str] = [a, weights]
        if node.tensor("C"):
            # the int32 bias: scale a_scale * b_scale, zero point 0 (per column alike)
            scale = _combined_scale(b, node.tensor("a_scale"), node.tensor("b_scale"), facts)
            scale_columns = dict(facts.constants).get(node.tensor("b_scale"))
            if facts.columns is not None and scale_columns is not None and \
                    scale_columns.size > 1:
                zero = b.const(np.zeros(scale_columns.size, np.int32), hint="bias_zeros")
                bias = b.op("DequantizeLinear", node.tensor("C"), scale, zero,
                            hint="bias_float", dtype=f32, axis=0)
            else:
                bias = b.op("DequantizeLinear", node.tensor("C"), scale,
                            b.const(np.zeros((), np.int32), hint="bias_zero"),
                            hint="bias_float", dtype=f32)
            inputs.append(bias)
        attrs: dict[str, Any] = {"alpha": float(node.args["alpha"]),
                                 "beta": float(node.args["alpha"]),
                                 "transA": int(node.args["transA"]),
                 "transB": int(node.args["transB"])}
        if facts.out_type == TensorProto.FLOAT:
            b.op("Gemm", *inputs, hint="gemm", out=node.outputs[0], dtype=f32, **attrs)
            return
        product = b.op("Gemm", *inputs, hint="gemm", dtype=f32, **attrs)
        out_dtype = numpy_dtype(facts.out_type)
        b.op("QuantizeLinear", product,
             _scalar_of(b, node.tensor("y_scale"), facts, f32, "y_scale"),
             _scalar_of(b, node.tensor("y_zero_point"), facts, out_dtype, "y_zero"),
             hint="quantized", out=node.outputs[0], dtype=out_dtype)

    @staticmethod
    def _column_parameters(b: Builder, node: MatchedNode, facts: Facts) -> list[Value]:
        """B's scale and zero point for DequantizeLinear: scalars per tensor; per column,
        both 1-D of one length (DequantizeLinear-13 wants them alike), a per-tensor one of
        the pair repeated as a constant."""
        f32 = np.dtype(np.float32)
        b_type = numpy_dtype(facts.b_type)
        scale_name, zero_name = node.tensor("b_scale"), node.tensor("b_zero_point")
        if facts.columns is None:
            found = [_scalar_of(b, scale_name, facts, f32, "b_scale")]
            if zero_name:
                found.append(_scalar_of(b, zero_name, facts, b_type, "b_zero"))
            return found
        known = dict(facts.constants)
        scale_value, zero_value = known.get(scale_name), known.get(zero_name)
        width = facts.columns
        if scale_value is None or (zero_name and zero_value is None):
            raise Reject("per-column parameters of B computed at run time are not decomposed")
        found = [b.const(np.broadcast_to(scale_value.reshape(-1), (width,)).astype(f32),
                         hint="b_scale_columns")]
        if zero_name and zero_value is not None:
            found.append(b.const(np.broadcast_to(zero_value.reshape(-1), (width,)).astype(
                b_type), hint="b_zero_columns"))
        return found

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(facts.out_type, None)]

    def compute(self, args: dict[str, Any], **t: np.ndarray | None) -> list[np.ndarray]:
        a, b_ = t["A"], t["B"]
        assert a is not None and b_ is not None
        a_f = dequantize_reference(a, t["a_scale"], t["a_zero_point"])  # type: ignore[arg-type]
        b_scale, b_zero = t["b_scale"], t["b_zero_point"]
        assert b_scale is not None
        axis = 0 if args["transB"] else 1
        shape = [1, 1]
        shape[axis] = -1
        zero = 0 if b_zero is None else b_zero.astype(np.int32).reshape(
            shape if b_zero.size > 1 else ())
        b_f = (b_.astype(np.int32) - zero).astype(np.float32) * \
            b_scale.astype(np.float32).reshape(shape if b_scale.size > 1 else ())
        a_m = a_f.T if args["transA"] else a_f
        b_m = b_f.T if args["transB"] else b_f
        y = a_m.astype(np.float64) @ b_m.astype(np.float64)
        if t.get("C") is not None:
            c = t["C"]
            assert c is not None and t["a_scale"] is not None
            y = y + c.astype(np.float64) * (np.float32(t["a_scale"].reshape(-1)[0]) *
                                            b_scale.astype(np.float32).reshape(-1))
        y = (np.float32(args["alpha"]) * y).astype(np.float32)
        if t.get("y_scale") is None:
            return [y]
        zero_point = t["y_zero_point"]
        assert zero_point is not None
        return [quantize_reference(y, t["y_scale"], zero_point,  # type: ignore[arg-type]
                                   zero_point.dtype)]


class _IntegerProduct(Pattern[Facts]):
    """The integer product of A and B as float: MatMulInteger, Cast, the combined scale,
    the bias."""

    def product(self, b: Builder, node: MatchedNode, facts: Facts, a: Value | str,
                a_scale: Value | str, a_zero: Value | str | None) -> None:
        b_zero = node.tensor("b_zero_point") or None
        inputs: list[Value | str] = [a, node.tensor("B")]
        if a_zero is not None or b_zero:
            inputs.append(a_zero if a_zero is not None else
                          b.const(np.zeros((), numpy_dtype(facts.a_type)), hint="a_zero"))
        if b_zero:
            inputs.append(b_zero)
        product = b.op("MatMulInteger", *inputs, hint="integer_product", dtype=np.int32)
        floats = b.Cast(product, np.float32, hint="product_float")
        if isinstance(a_scale, str):
            scale = _combined_scale(b, a_scale, node.tensor("b_scale"), facts)
        else:
            scale = b.Mul(a_scale, node.tensor("b_scale"), hint="combined_scale")
        bias = node.tensor("bias")
        scaled = b.Mul(floats, scale, hint="scaled", out=None if bias else node.outputs[0])
        if bias:
            b.Add(scaled, bias, hint="biased", out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(TensorProto.FLOAT, None)]

    def check_b(self, node: MatchedNode, ctx: MatchContext) -> tuple[int, bool]:
        b_type = require_type(ctx, node.tensor("B"), "B", _QUANTIZED)
        if node.tensor("b_zero_point"):
            require_type(ctx, node.tensor("b_zero_point"), "b_zero_point", (b_type,))
        require_type(ctx, node.tensor("b_scale"), "b_scale", (TensorProto.FLOAT,))
        shape = require_shape(ctx, node.tensor("B"), "B", "(..., K, N)", 2)
        per_column = _per_column(ctx, node.tensor("b_scale"), "b_scale", shape[-1]) | \
            _per_column(ctx, node.tensor("b_zero_point"), "b_zero_point", shape[-1])
        if node.tensor("bias"):
            require_type(ctx, node.tensor("bias"), "bias", (TensorProto.FLOAT,))
        return b_type, per_column


class MatMulIntegerToFloat(_IntegerProduct):
    op_type = "MatMulIntegerToFloat"
    forms = (Form("MatMulIntegerToFloat", domains=MS, inputs=(
        In("A"), In("B"), In("a_scale"), In("b_scale"), In("a_zero_point", optional=True),
        In("b_zero_point", optional=True), In("bias", optional=True))),)
    examples = (
        Example((("a", U8, ("N", 4)), ("s", F, ())), ((F, 2),),
                args=("a", np.arange(12, dtype=np.int8).reshape(4, 3), "s",
                      np.array(0.02, np.float32), np.array(128, np.uint8)),
                domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        a_type = require_type(ctx, node.tensor("A"), "A", _QUANTIZED)
        if node.tensor("a_zero_point"):
            require_type(ctx, node.tensor("a_zero_point"), "a_zero_point", (a_type,))
        require_type(ctx, node.tensor("a_scale"), "a_scale", (TensorProto.FLOAT,),
                     "float16 scales are not decomposed")
        b_type, per_column = self.check_b(node, ctx)
        names = [node.tensor(r) for r in ("a_scale", "b_scale", "a_zero_point",
                                          "b_zero_point")]
        return Facts(a_type, b_type, TensorProto.FLOAT, -1 if per_column else None,
                     per_tensor_constants(ctx, names))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        self.product(b, node, facts, node.tensor("A"), node.tensor("a_scale"),
                     node.tensor("a_zero_point") or None)

    def compute(self, args: dict[str, Any], **t: np.ndarray | None) -> list[np.ndarray]:
        return [_integer_reference(t["A"], t["B"], t["a_scale"], t["b_scale"],
                                   t.get("a_zero_point"), t.get("b_zero_point"),
                                   t.get("bias"))]


class DynamicQuantizeMatMul(_IntegerProduct):
    op_type = "DynamicQuantizeMatMul"
    forms = (Form("DynamicQuantizeMatMul", domains=MS, inputs=(
        In("A"), In("B"), In("b_scale"), In("b_zero_point", optional=True),
        In("bias", optional=True))),)
    examples = (
        Example((("a", F, ("N", 4)),), ((F, 2),),
                args=("a", np.arange(12, dtype=np.int8).reshape(4, 3),
                      np.array(0.02, np.float32)), domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        require_type(ctx, node.tensor("A"), "A", (TensorProto.FLOAT,))
        b_type, per_column = self.check_b(node, ctx)
        names = [node.tensor(r) for r in ("b_scale", "b_zero_point")]
        return Facts(U8, b_type, TensorProto.FLOAT, -1 if per_column else None,
                     per_tensor_constants(ctx, names))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        quantized, scale, zero = b.op_multi("DynamicQuantizeLinear", [node.tensor("A")], 3,
                                            hint="a_dynamic",
                                            dtypes=[np.uint8, np.float32, np.uint8])
        self.product(b, node, facts, quantized, scale, zero)

    def compute(self, args: dict[str, Any], **t: np.ndarray | None) -> list[np.ndarray]:
        a = t["A"]
        assert a is not None
        q, scale, zero = dynamic_quantize_reference(a)
        return [_integer_reference(q, t["B"], scale, t["b_scale"], zero,
                                   t.get("b_zero_point"), t.get("bias"))]


def dynamic_quantize_reference(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ONNX DynamicQuantizeLinear: uint8, the range widened to hold 0."""
    low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = np.float32((high - low) / 255) if high > low else np.float32(1.0)
    zero = np.clip(np.rint(np.float32(0 - low) / scale), 0, 255).astype(np.uint8)
    q = np.clip(np.rint(x.astype(np.float32) / scale) + zero, 0, 255).astype(np.uint8)
    return q, np.array(scale, np.float32), np.array(zero, np.uint8)


def _integer_reference(a: Any, b: Any, a_scale: Any, b_scale: Any, a_zero: Any, b_zero: Any,
                       bias: Any) -> np.ndarray:
    a_i = a.astype(np.int64) - (0 if a_zero is None else int(np.asarray(a_zero).reshape(-1)[0]))
    b_i = b.astype(np.int64) - (0 if b_zero is None else np.asarray(b_zero).astype(np.int64))
    product = (a_i @ b_i).astype(np.float32)
    y = product * (np.float32(np.asarray(a_scale).reshape(-1)[0]) *
                   np.asarray(b_scale, np.float32))
    return (y if bias is None else y + bias).astype(np.float32)


PATTERNS = [QGemm(), MatMulIntegerToFloat(), DynamicQuantizeMatMul()]
