"""ONNX Runtime's com.microsoft QOperator ops (what ``quantize_static(...,
quant_format=QOperator)`` writes) as standard QDQ: DequantizeLinear -> the float op ->
QuantizeLinear.

Matches, in com.microsoft (the schemas ONNX Runtime 1.32 registers; docs/ContribOperators.md):

- ``QLinearAdd`` / ``QLinearMul(A, A_scale, A_zero_point, B, B_scale, B_zero_point,
  C_scale, C_zero_point)``, numpy broadcasting;
- ``QLinearSigmoid(X, X_scale, X_zero_point, Y_scale, Y_zero_point)`` and
  ``QLinearLeakyRelu`` (``alpha``, default 0.01);
- ``QLinearSoftmax(X, X_scale, x_zero_point, y_scale, y_zero_point; axis=-1, opset)``: the
  softmax of ONNX's opset ``opset`` (below 13 the input coerced to 2-D at ``axis``);
- ``QLinearConcat(Y_scale, Y_zero_point, (X_i, X_i_scale, X_i_zero_point)...; axis)``;
- ``QLinearAveragePool`` (ONNX AveragePool's attributes, ``count_include_pad``, plus
  ``channels_last``) and ``QLinearGlobalAveragePool(channels_last)``;
- ``QLinearWhere(condition, X, x_scale, x_zero_point, Y, y_scale, y_zero_point, z_scale,
  z_zero_point)``;
- ``QLinearReduceMean(data, data_scale, data_zero_point, reduced_scale,
  reduced_zero_point; axes, keepdims)``.

Types: uint8 or int8 tensors, float32 scales; every scale and zero point per tensor (the
kernels take scalars; a one-element vector is taken too, as its scalar); an absent zero
point is 0.

Before -> after (QLinearAdd; the others alike)::

    QLinearAdd(a, sa, za, b, sb, zb, sc, zc)
      ->  QuantizeLinear(Add(DequantizeLinear(a, sa, za), DequantizeLinear(b, sb, zb)), sc, zc)

    channels_last pools: Transpose (NHWC -> NCHW) on the quantized input, the QDQ pool,
    Transpose back on the quantized output (the DQ / op / Q group stays adjacent)

Exactness: ONNX Runtime's QDQ transformer fuses each of these groups back into the very
kernel it replaces (QLinearAdd, QLinearMul, QLinearSigmoid, QLinearLeakyRelu,
QLinearSoftmax, QLinearConcat, QLinearAveragePool, QLinearGlobalAveragePool, QLinearWhere;
measured with ORT_ENABLE_ALL, uint8 and int8), so on ONNX Runtime the output is the
kernel's, bit for bit. QLinearReduceMean's group is not fused: it runs as float
ReduceMean, then QuantizeLinear (round half to even, saturate), within one quantization
step of the kernel. Engines that run int8 from QDQ (TensorRT, OpenVINO) keep the model
quantized; elsewhere the float path is the same arithmetic as the kernels' reference:
``(q - zero) * scale`` in float32, the op, ``saturate(round(x / scale) + zero)``.

Envelope: opsets 13+ (per-tensor QuantizeLinear/DequantizeLinear of uint8/int8 exist from
10, the one-element-vector scale form is normalized to a scalar); ranks known where an
axis is counted; dims dynamic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

MS = frozenset({"com.microsoft"})
U8, I8 = TensorProto.UINT8, TensorProto.INT8
_QUANTIZED = (U8, I8)


def f32(value: Any) -> np.ndarray:
    return np.array(value, np.float32)


def u8(value: Any) -> np.ndarray:
    return np.array(value, np.uint8)


class Facts(NamedTuple):
    elem_type: int  # the quantized type (uint8 or int8)
    rank: int | None  # the first quantized input's rank, where known
    # each scale and zero point given: its constant value (None if computed at run time)
    constants: tuple[tuple[str, np.ndarray | None], ...] = ()
    # binary ops: a quantized operand that is a constant (a bias), dequantized here
    folded: tuple[tuple[str, np.ndarray], ...] = ()


def per_tensor_constants(ctx: MatchContext, names: list[str]
                         ) -> tuple[tuple[str, np.ndarray | None], ...]:
    """The scales' and zero points' values, where constant (what :func:`scalar` reads)."""
    return tuple((name, ctx.constant(name)) for name in names if name)


def scalar(b: Builder, name: str, constants: tuple[tuple[str, np.ndarray | None], ...],
           dtype: np.dtype, hint: str) -> Value:
    """A per-tensor scale or zero point as the scalar QuantizeLinear and DequantizeLinear
    take: the tensor itself if it is a scalar, a scalar constant of its value if it is a
    one-element constant, 0 of the type when absent, else the tensor reshaped to ().
    ``constants``: what :func:`per_tensor_constants` found."""
    if not name:
        return b.const(np.zeros((), dtype), hint=f"{hint}_zero")
    value = dict(constants).get(name)
    if value is not None and value.ndim == 0:
        return b.input(name, dtype)
    if value is not None:
        return b.const(np.asarray(value, dtype).reshape(()), hint=hint)
    return b.Reshape(b.input(name, dtype), np.array([], np.int64), hint=f"{hint}_scalar")


class Quantized(NamedTuple):
    """The roles of one quantized tensor: the values, their scale and zero point."""
    values: str
    scale: str
    zero: str


def quantize_reference(x: np.ndarray, scale: np.ndarray, zero: np.ndarray | None,
                       dtype: np.dtype) -> np.ndarray:
    """ONNX QuantizeLinear: saturate(round_half_even(x / scale) + zero), in float32."""
    info = np.iinfo(dtype)
    z = 0.0 if zero is None else float(np.asarray(zero).reshape(-1)[0])
    scaled = np.rint(x.astype(np.float32) / np.float32(np.asarray(scale).reshape(-1)[0]))
    return np.clip(scaled + z, info.min, info.max).astype(dtype)


def dequantize_reference(q: np.ndarray, scale: np.ndarray, zero: np.ndarray | None
                         ) -> np.ndarray:
    """ONNX DequantizeLinear: (q - zero) * scale, in float32."""
    z = 0 if zero is None else int(np.asarray(zero).reshape(-1)[0])
    return ((q.astype(np.int32) - z).astype(np.float32) *
            np.float32(np.asarray(scale).reshape(-1)[0]))


class _QLinear(Pattern[Facts]):
    """A QOperator op: its quantized inputs (``sources``), its quantized output
    (``target``); subclasses write the float op (``float_op``) and its numpy twin
    (``float_reference``)."""

    sources: tuple[Quantized, ...] = ()
    target: Quantized | None = None

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        elem_type = require_type(ctx, node.tensor(self.sources[0].values),
                                 self.sources[0].values, _QUANTIZED)
        for source in self.sources:
            self._check_quantized(node, ctx, source, elem_type)
        if self.target is not None:
            self._check_scale(node, ctx, self.target.scale)
            self._check_zero(node, ctx, self.target.zero, elem_type)
        shape = ctx.shape(node.tensor(self.sources[0].values))
        roles = [role for source in (*self.sources, self.target) if source is not None
                 for role in (source.scale, source.zero)]
        facts = Facts(elem_type, None if shape is None else len(shape),
                      per_tensor_constants(ctx, [node.tensor(role) for role in roles]))
        self.check_more(node, ctx, facts)
        return facts

    def check_more(self, node: MatchedNode, ctx: MatchContext, facts: Facts) -> None:
        """Op-specific checks (axes, ranks)."""

    def _check_quantized(self, node: MatchedNode, ctx: MatchContext, source: Quantized,
                         elem_type: int) -> None:
        require_type(ctx, node.tensor(source.values), source.values, (elem_type,))
        self._check_scale(node, ctx, source.scale)
        self._check_zero(node, ctx, source.zero, elem_type)

    @staticmethod
    def _check_scale(node: MatchedNode, ctx: MatchContext, role: str) -> None:
        require_type(ctx, node.tensor(role), role, (TensorProto.FLOAT,))
        _require_per_tensor(node, ctx, role)

    @staticmethod
    def _check_zero(node: MatchedNode, ctx: MatchContext, role: str, elem_type: int) -> None:
        if node.tensor(role):
            require_type(ctx, node.tensor(role), role, (elem_type,),
                         "it must match the quantized tensor's type")
            _require_per_tensor(node, ctx, role)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(facts.elem_type, None)]

    # -- build -----------------------------------------------------------------------------

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        folded = dict(facts.folded)
        floats = [b.const(folded[source.values], hint=f"{source.values}_float")
                  if source.values in folded else
                  self.dequantized(b, node, facts, source, node.tensor(source.values),
                                   f"{source.values}_float")
                  for source in self.sources]
        result = self.float_op(b, node, floats, facts)
        assert self.target is not None
        self.quantized(b, node, facts, result, self.target, node.outputs[0])

    def float_op(self, b: Builder, node: MatchedNode, floats: list[Value], facts: Facts
                 ) -> Value:
        raise NotImplementedError

    @staticmethod
    def dequantized(b: Builder, node: MatchedNode, facts: Facts, source: Quantized,
                    values: str | Value, hint: str) -> Value:
        dtype = numpy_dtype(facts.elem_type)
        return b.op("DequantizeLinear", values,
                    scalar(b, node.tensor(source.scale), facts.constants, np.dtype(np.float32),
                           f"{hint}_scale"),
                    scalar(b, node.tensor(source.zero), facts.constants, dtype, f"{hint}_zero"),
                    hint=hint, dtype=np.float32)

    @staticmethod
    def quantized(b: Builder, node: MatchedNode, facts: Facts, value: Value,
                  target: Quantized, out: str | None = None) -> Value:
        dtype = numpy_dtype(facts.elem_type)
        return b.op("QuantizeLinear", value,
                    scalar(b, node.tensor(target.scale), facts.constants, np.dtype(np.float32),
                           "out_scale"),
                    scalar(b, node.tensor(target.zero), facts.constants, dtype, "out_zero"),
                    hint="quantized", out=out, dtype=dtype)

    # -- reference -------------------------------------------------------------------------

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        first = tensors[self.sources[0].values]
        assert first is not None and self.target is not None
        floats = []
        for source in self.sources:
            values, scale = tensors[source.values], tensors[source.scale]
            assert values is not None and scale is not None
            floats.append(dequantize_reference(values, scale, tensors.get(source.zero)))
        result = self.float_reference(args, floats, tensors)
        scale = tensors[self.target.scale]
        assert scale is not None
        return [quantize_reference(result, scale, tensors.get(self.target.zero),
                                   first.dtype)]

    def float_reference(self, args: dict[str, Any], floats: list[np.ndarray],
                        tensors: dict[str, np.ndarray | None]) -> np.ndarray:
        raise NotImplementedError


def _require_per_tensor(node: MatchedNode, ctx: MatchContext, role: str) -> None:
    shape = ctx.shape(node.tensor(role))
    if shape is not None and (len(shape) > 1 or (len(shape) == 1 and shape[0] != 1)):
        raise Reject(f"{role} must be per tensor (a scalar or one element), as the kernel "
                     f"takes it; got shape {list(shape)}")


def _elementwise_examples(*names: str) -> tuple[Example, ...]:
    """uint8 and int8 examples for an op whose quantized inputs are ``names``."""
    u8_args: list[Any] = []
    i8_args: list[Any] = []
    for index, name in enumerate(names):
        u8_args += [name, f32(0.05 * (index + 1)), u8(3 + 100 * index)]
        i8_args += [name, f32(0.05 * (index + 1)), np.array(-3 + 7 * index, np.int8)]
    u8_args += [f32(0.1), u8(128)]
    i8_args += [f32(0.1), np.array(0, np.int8)]
    return (Example(tuple((name, U8, ("N", 4)) for name in names), ((U8, 2),),
                    args=tuple(u8_args), domains=(("com.microsoft", 17),)),
            Example(tuple((name, I8, ("N", 4)) for name in names), ((I8, 2),),
                    args=tuple(i8_args), domains=(("com.microsoft", 13),)))


def _inputs(*sources: Quantized, target: Quantized | None = None,
            optional_zero: bool = True) -> tuple[In, ...]:
    found: list[In] = []
    for source in (*sources, *(() if target is None else (target,))):
        found += [In(source.values), In(source.scale),
                  In(source.zero, optional=optional_zero)]
    return tuple(found)


_A = Quantized("A", "A_scale", "A_zero_point")
_B = Quantized("B", "B_scale", "B_zero_point")
_C = Quantized("", "C_scale", "C_zero_point")


class _Binary(_QLinear):
    """A constant operand (quantize_static's quantized bias of a MatMul, say) is dequantized
    at decompose time, into a float constant: OpenVINO 2026.4's low-precision pass crashes
    on a DequantizeLinear of a constant beside one of an activation in an Add
    ("[AddTransformation] ... index '0' out of range", measured on a QOperator BERT)."""

    sources = (_A, _B)
    target = _C
    float_op_type = ""

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        facts = super().check(node, ctx)
        known = dict(facts.constants)
        folded = []
        for source in self.sources:
            values = ctx.constant(node.tensor(source.values))
            scale = known.get(node.tensor(source.scale))
            if values is None or scale is None or values.size > (1 << 20):
                continue
            zero = known.get(node.tensor(source.zero)) if node.tensor(source.zero) else None
            if node.tensor(source.zero) and zero is None:
                continue
            folded.append((source.values, dequantize_reference(values, scale, zero)))
        if len(folded) == len(self.sources):
            return facts  # both constant: leave it to the standard form (folded later)
        return facts._replace(folded=tuple(folded))

    float_numpy: Any = None  # the numpy twin of float_op_type (a ufunc)

    def float_op(self, b: Builder, node: MatchedNode, floats: list[Value], facts: Facts
                 ) -> Value:
        return b.op(self.float_op_type, *floats, hint=self.float_op_type.lower(),
                    dtype=np.float32)

    def float_reference(self, args: dict[str, Any], floats: list[np.ndarray],
                        tensors: dict[str, np.ndarray | None]) -> np.ndarray:
        return np.asarray(self.float_numpy(floats[0], floats[1]), np.float32)


def _binary_inputs() -> tuple[In, ...]:
    return (*_inputs(_A, _B), In("C_scale"), In("C_zero_point", optional=True))


class QLinearAdd(_Binary):
    op_type = "QLinearAdd"
    float_op_type = "Add"
    float_numpy = np.add
    forms = (Form("QLinearAdd", domains=MS, inputs=_binary_inputs()),)
    examples = _elementwise_examples("a", "b")


class QLinearMul(_Binary):
    op_type = "QLinearMul"
    float_op_type = "Mul"
    float_numpy = np.multiply
    forms = (Form("QLinearMul", domains=MS, inputs=_binary_inputs()),)
    examples = _elementwise_examples("a", "b")


_X = Quantized("X", "X_scale", "X_zero_point")
_Y = Quantized("", "Y_scale", "Y_zero_point")


def _unary_inputs(x: Quantized = _X, y: Quantized = _Y, optional_zero: bool = True
                  ) -> tuple[In, ...]:
    return (In(x.values), In(x.scale), In(x.zero, optional=optional_zero), In(y.scale),
            In(y.zero, optional=optional_zero))


class QLinearSigmoid(_QLinear):
    op_type = "QLinearSigmoid"
    sources = (_X,)
    target = _Y
    forms = (Form("QLinearSigmoid", domains=MS, inputs=_unary_inputs()),)
    examples = _elementwise_examples("x")

    def float_op(self, b: Builder, node: MatchedNode, floats: list[Value], facts: Facts
                 ) -> Value:
        return b.Sigmoid(floats[0], hint="sigmoid")

    def float_reference(self, args: dict[str, Any], floats: list[np.ndarray],
                        tensors: dict[str, np.ndarray | None]) -> np.ndarray:
        return (1 / (1 + np.exp(-floats[0].astype(np.float64)))).astype(np.float32)


class QLinearLeakyRelu(_QLinear):
    op_type = "QLinearLeakyRelu"
    sources = (_X,)
    target = _Y
    forms = (Form("QLinearLeakyRelu", domains=MS, inputs=_unary_inputs(),
                  attributes={"alpha": Attr("float", default=0.01)}),)
    examples = _elementwise_examples("x")

    def float_op(self, b: Builder, node: MatchedNode, floats: list[Value], facts: Facts
                 ) -> Value:
        return b.op("LeakyRelu", floats[0], alpha=float(node.args["alpha"]),
                    hint="leaky_relu", dtype=np.float32)

    def float_reference(self, args: dict[str, Any], floats: list[np.ndarray],
                        tensors: dict[str, np.ndarray | None]) -> np.ndarray:
        x = floats[0]
        return np.where(x >= 0, x, x * np.float32(args["alpha"])).astype(np.float32)


_XS = Quantized("X", "X_scale", "x_zero_point")
_YS = Quantized("", "y_scale", "y_zero_point")


class QLinearSoftmax(_QLinear):
    """``opset`` (required) says whose Softmax: below 13 the input is coerced to 2-D at
    ``axis`` (the softmax runs over every axis from it), from 13 over ``axis`` alone."""

    op_type = "QLinearSoftmax"
    sources = (_XS,)
    target = _YS
    forms = (Form("QLinearSoftmax", domains=MS, inputs=(
        In("X"), In("X_scale"), In("x_zero_point", optional=True), In("y_scale"),
        In("y_zero_point")), attributes={"axis": Attr("int", default=-1),
                                         "opset": Attr("int")}),)
    examples = tuple(Example(e.inputs, e.outputs, attrs={"opset": 13}, args=e.args,
                             domains=e.domains) for e in _elementwise_examples("x"))

    def check_more(self, node: MatchedNode, ctx: MatchContext, facts: Facts) -> None:
        shape = require_shape(ctx, node.tensor("X"), "X", "softmax's axis is counted in it",
                              min_rank=1)
        axis = int(node.args["axis"])
        if not -len(shape) <= axis < len(shape):
            raise Reject(f"axis {axis} is out of range for rank {len(shape)}")

    def float_op(self, b: Builder, node: MatchedNode, floats: list[Value], facts: Facts
                 ) -> Value:
        assert facts.rank is not None
        axis = int(node.args["axis"]) % facts.rank
        if int(node.args["opset"]) >= 13 or axis == facts.rank - 1:
            return b.Softmax(floats[0], axis=axis, hint="softmax")
        # the opset-11 softmax: over every axis from ``axis``, as one flattened axis
        shape = b.Shape(floats[0], hint="x_shape")
        flat = b.Reshape(floats[0], np.array([0] * axis + [-1], np.int64), hint="x_rows")
        return b.Reshape(b.Softmax(flat, axis=axis, hint="softmax_rows"), shape,
                         hint="softmax")

    def float_reference(self, args: dict[str, Any], floats: list[np.ndarray],
                        tensors: dict[str, np.ndarray | None]) -> np.ndarray:
        x = floats[0].astype(np.float64)
        axis = int(args["axis"]) % x.ndim
        axes = tuple(range(axis, x.ndim)) if int(args["opset"]) < 13 else (axis,)
        e = np.exp(x - x.max(axis=axes, keepdims=True))
        return (e / e.sum(axis=axes, keepdims=True)).astype(np.float32)


class QLinearWhere(_QLinear):
    op_type = "QLinearWhere"
    sources = (Quantized("X", "x_scale", "x_zero_point"),
               Quantized("Y", "y_scale", "y_zero_point"))
    target = Quantized("", "z_scale", "z_zero_point")
    forms = (Form("QLinearWhere", domains=MS, inputs=(
        In("condition"), In("X"), In("x_scale"), In("x_zero_point"), In("Y"), In("y_scale"),
        In("y_zero_point"), In("z_scale"), In("z_zero_point"))),)
    examples = (Example((("c", TensorProto.BOOL, ("N", 4)), ("x", U8, ("N", 4)),
                         ("y", U8, (4,))), ((U8, 2),),
                        args=("c", "x", f32(0.05), u8(3), "y", f32(0.1), u8(200), f32(0.2),
                              u8(128)), domains=(("com.microsoft", 17),)),)

    def check_more(self, node: MatchedNode, ctx: MatchContext, facts: Facts) -> None:
        require_type(ctx, node.tensor("condition"), "condition", (TensorProto.BOOL,))

    def float_op(self, b: Builder, node: MatchedNode, floats: list[Value], facts: Facts
                 ) -> Value:
        return b.Where(node.tensor("condition"), floats[0], floats[1], hint="where")

    def float_reference(self, args: dict[str, Any], floats: list[np.ndarray],
                        tensors: dict[str, np.ndarray | None]) -> np.ndarray:
        condition = tensors["condition"]
        assert condition is not None
        return np.where(condition, floats[0], floats[1]).astype(np.float32)


class QLinearReduceMean(_QLinear):
    """Not fused back by ONNX Runtime: float ReduceMean, then QuantizeLinear (within one
    quantization step of the kernel, which rounds its integer mean its own way)."""

    op_type = "QLinearReduceMean"
    sources = (Quantized("data", "data_scale", "data_zero_point"),)
    target = Quantized("", "reduced_scale", "reduced_zero_point")
    forms = (Form("QLinearReduceMean", domains=MS, inputs=(
        In("data"), In("data_scale"), In("data_zero_point", optional=True),
        In("reduced_scale"), In("reduced_zero_point", optional=True)),
        attributes={"axes": Attr("ints"), "keepdims": Attr("int")}),)
    examples = (Example((("x", U8, ("N", 4, 6)),), ((U8, 3),), attrs={"axes": [2],
                                                                    "keepdims": 1},
                        args=("x", f32(0.05), u8(3), f32(0.05), u8(3)),
                        domains=(("com.microsoft", 17),)),)

    def check_more(self, node: MatchedNode, ctx: MatchContext, facts: Facts) -> None:
        shape = require_shape(ctx, node.tensor("data"), "data", "the axes are counted in it")
        for axis in node.args["axes"]:
            if not -len(shape) <= int(axis) < len(shape):
                raise Reject(f"axis {axis} is out of range for rank {len(shape)}")

    def float_op(self, b: Builder, node: MatchedNode, floats: list[Value], facts: Facts
                 ) -> Value:
        return b.ReduceMean(floats[0], [int(a) for a in node.args["axes"]],
                            keepdims=bool(node.args["keepdims"]), hint="mean")

    def float_reference(self, args: dict[str, Any], floats: list[np.ndarray],
                        tensors: dict[str, np.ndarray | None]) -> np.ndarray:
        return floats[0].mean(axis=tuple(int(a) for a in args["axes"]),
                              keepdims=bool(args["keepdims"])).astype(np.float32)


class _Pool(_QLinear):
    sources = (Quantized("X", "x_scale", "x_zero_point"),)
    target = Quantized("", "y_scale", "y_zero_point")

    def check_more(self, node: MatchedNode, ctx: MatchContext, facts: Facts) -> None:
        require_shape(ctx, node.tensor("X"), "X", "(N, C, spatial...)", 3)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        if not node.args["channels_last"]:
            super().build(b, node, facts)
            return
        # channels last: Transposes on the quantized tensors, so the DQ / pool / Q group
        # stays adjacent (ONNX Runtime fuses it back into its kernel)
        assert facts.rank is not None and self.target is not None
        rank = facts.rank
        first = b.Transpose(node.tensor("X"), [0, rank - 1, *range(1, rank - 1)],
                            hint="channels_first")
        floats = self.dequantized(b, node, facts, self.sources[0], first, "x_float")
        pooled = self.float_op(b, node, [floats], facts)
        quantized = self.quantized(b, node, facts, pooled, self.target)
        b.Transpose(quantized, [0, *range(2, rank), 1], hint="channels_last",
                    out=node.outputs[0])

    def float_reference(self, args: dict[str, Any], floats: list[np.ndarray],
                        tensors: dict[str, np.ndarray | None]) -> np.ndarray:
        x = floats[0]
        if args["channels_last"]:
            x = np.moveaxis(x, -1, 1)
        pooled = self.pool_reference(args, x)
        return np.moveaxis(pooled, 1, -1) if args["channels_last"] else pooled

    def pool_reference(self, args: dict[str, Any], x: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class QLinearGlobalAveragePool(_Pool):
    op_type = "QLinearGlobalAveragePool"
    forms = (Form("QLinearGlobalAveragePool", domains=MS, inputs=(
        In("X"), In("x_scale"), In("x_zero_point"), In("y_scale"), In("y_zero_point")),
        attributes={"channels_last": Attr("int", default=0, choices=(0, 1))}),)
    examples = (Example((("x", U8, ("N", 3, 4, 5)),), ((U8, 4),),
                        args=("x", f32(0.05), u8(3), f32(0.02), u8(128)),
                        domains=(("com.microsoft", 17),)),
                Example((("x", I8, ("N", 4, 5, 3)),), ((I8, 4),), attrs={"channels_last": 1},
                        args=("x", f32(0.05), np.array(-3, np.int8), f32(0.02),
                              np.array(1, np.int8)), domains=(("com.microsoft", 13),)))

    def float_op(self, b: Builder, node: MatchedNode, floats: list[Value], facts: Facts
                 ) -> Value:
        return b.op("GlobalAveragePool", floats[0], hint="pooled", dtype=np.float32)

    def pool_reference(self, args: dict[str, Any], x: np.ndarray) -> np.ndarray:
        return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True).astype(np.float32)


class QLinearAveragePool(_Pool):
    op_type = "QLinearAveragePool"
    forms = (Form("QLinearAveragePool", domains=MS, inputs=(
        In("X"), In("x_scale"), In("x_zero_point", optional=True), In("y_scale"),
        In("y_zero_point", optional=True)), attributes={
            "auto_pad": Attr("string", default="NOTSET",
                             choices=("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")),
            "ceil_mode": Attr("int", default=0, choices=(0, 1)),
            "channels_last": Attr("int", default=0, choices=(0, 1)),
            "count_include_pad": Attr("int", default=0, choices=(0, 1)),
            "kernel_shape": Attr("ints"),
            "pads": Attr("ints", default=()),
            "strides": Attr("ints", default=())}),)
    examples = (Example((("x", U8, ("N", 3, 6, 6)),), ((U8, 4),),
                        attrs={"kernel_shape": [3, 3], "pads": [1, 1, 1, 1],
                               "count_include_pad": 1},
                        args=("x", f32(0.05), u8(3), f32(0.02), u8(128)),
                        domains=(("com.microsoft", 17),)),)

    def float_op(self, b: Builder, node: MatchedNode, floats: list[Value], facts: Facts
                 ) -> Value:
        attrs: dict[str, Any] = {"kernel_shape": list(node.args["kernel_shape"]),
                                 "ceil_mode": int(node.args["ceil_mode"]),
                                 "count_include_pad": int(node.args["count_include_pad"])}
        auto_pad = node.args["auto_pad"]
        auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
        if auto_pad != "NOTSET":
            attrs["auto_pad"] = auto_pad
        if node.args["pads"]:
            attrs["pads"] = list(node.args["pads"])
        if node.args["strides"]:
            attrs["strides"] = list(node.args["strides"])
        return b.op("AveragePool", floats[0], hint="pooled", dtype=np.float32, **attrs)

    def pool_reference(self, args: dict[str, Any], x: np.ndarray) -> np.ndarray:
        from onnx import helper
        from onnx.reference import ReferenceEvaluator

        attrs = {k: v for k, v in args.items() if k not in ("channels_last",)
                 and v not in ((), None)}
        if isinstance(attrs.get("auto_pad"), bytes):
            attrs["auto_pad"] = attrs["auto_pad"].decode()
        node = helper.make_node("AveragePool", ["x"], ["y"], **attrs)
        (y,) = ReferenceEvaluator(node).run(None, {"x": x})
        return np.asarray(y, np.float32)


class QLinearConcat(_QLinear):
    """``QLinearConcat(Y_scale, Y_zero_point, X_0, X_0_scale, X_0_zero_point, ...; axis)``:
    every input quantized (the schema also admits float inputs; refused)."""

    op_type = "QLinearConcat"
    # variadic: the older spelling that reads the inputs itself
    domains = MS
    attributes = {"axis": Attr("int")}
    examples = (Example((("a", U8, ("N", 2)), ("b", U8, ("N", 3))), ((U8, 2),),
                        attrs={"axis": 1},
                        args=(f32(0.1), u8(128), "a", f32(0.05), u8(3), "b", f32(0.2),
                              u8(250)), domains=(("com.microsoft", 17),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        names = list(node.inputs)
        if len(names) < 5 or (len(names) - 2) % 3:
            raise Reject("QLinearConcat takes Y_scale, Y_zero_point and (X, scale, zero "
                         f"point) triples; got {len(names)} inputs")
        elem_type = require_type(ctx, names[2], "input 0", _QUANTIZED)
        for index in range(2, len(names), 3):
            label = f"input {(index - 2) // 3}"
            require_type(ctx, names[index], label, (elem_type,),
                         "float inputs to QLinearConcat are not decomposed")
            require_type(ctx, names[index + 1], f"{label}'s scale", (TensorProto.FLOAT,))
            require_type(ctx, names[index + 2], f"{label}'s zero point", (elem_type,))
        require_type(ctx, names[1], "Y_zero_point", (elem_type,))
        require_type(ctx, names[0], "Y_scale", (TensorProto.FLOAT,))
        shape = require_shape(ctx, names[2], "input 0", "the axis is counted in it")
        axis = int(node.args["axis"])
        if not -len(shape) <= axis < len(shape):
            raise Reject(f"axis {axis} is out of range for rank {len(shape)}")
        per_tensor = names[:2] + names[3::3] + names[4::3]
        for name in per_tensor:
            shape_of = ctx.shape(name)
            if shape_of is not None and len(shape_of) and list(shape_of) != [1]:
                raise Reject(f"'{name}' must be per tensor (a scalar or one element)")
        return Facts(elem_type, len(shape), per_tensor_constants(ctx, per_tensor))

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(facts.elem_type, None)]

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        dtype = numpy_dtype(facts.elem_type)
        names = list(node.inputs)
        f32_type = np.dtype(np.float32)
        floats = [b.op("DequantizeLinear", names[index],
                       scalar(b, names[index + 1], facts.constants, f32_type, f"x{index}_scale"),
                       scalar(b, names[index + 2], facts.constants, dtype, f"x{index}_zero"),
                       hint=f"x{(index - 2) // 3}_float", dtype=np.float32)
                  for index in range(2, len(names), 3)]
        joined = b.Concat(*floats, axis=int(node.args["axis"]), hint="joined")
        b.op("QuantizeLinear", joined, scalar(b, names[0], facts.constants, f32_type, "out_scale"),
             scalar(b, names[1], facts.constants, dtype, "out_zero"), hint="quantized",
             out=node.outputs[0], dtype=dtype)

    def reference(self, *values: np.ndarray, **attrs: Any) -> list[np.ndarray]:
        floats = []
        for index in range(2, len(values), 3):
            q, scale, zero = values[index], values[index + 1], values[index + 2]
            assert q is not None and scale is not None
            floats.append(dequantize_reference(q, scale, zero))
        first = values[2]
        assert first is not None and values[0] is not None
        joined = np.concatenate(floats, axis=int(attrs["axis"]))
        return [quantize_reference(joined, values[0], values[1], first.dtype)]


PATTERNS = [QLinearAdd(), QLinearMul(), QLinearSigmoid(), QLinearLeakyRelu(),
            QLinearSoftmax(), QLinearWhere(), QLinearReduceMean(),
            QLinearGlobalAveragePool(), QLinearAveragePool(), QLinearConcat()]
