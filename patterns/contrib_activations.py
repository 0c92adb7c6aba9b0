"""ONNX Runtime's contrib activations (com.microsoft Gelu, BiasGelu, FastGelu, QuickGelu,
BiasAdd, BiasSplitGelu), and ONNX's Gelu below opset 20, as standard elementwise ops.

Matches, in the ``com.microsoft`` domain (what ONNX Runtime's transformer optimizer, Olive and
the onnxruntime-genai builder write), with the semantics of ONNX Runtime's CPU/CUDA kernels as
docs/ContribOperators.md states them:
- ``Gelu(X)``: ``0.5 * X * (1 + erf(X / sqrt(2)))``;
- ``BiasGelu(A, B)``: ``Gelu(A + B)``, B broadcast over A's last axis;
- ``FastGelu(X[, bias])``: ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))``,
  ``x = X + bias``;
- ``QuickGelu(X; alpha=1.702)``: ``X * Sigmoid(alpha * X)``;
- ``BiasAdd(X, bias, skip)``: ``X + bias + skip`` (X and skip (N, S, C), bias (C,));
- ONNX's ``Gelu(X; approximate="none"|"tanh")`` (opset 20) in the default domain below 20
  (``--target-opset``): ``none`` as com.microsoft Gelu, ``tanh`` as FastGelu without bias;
- ``BiasSplitGelu(X, bias)``: with ``h = X + bias`` split in two halves along the last axis,
  ``left * Gelu(right)`` (Stable Diffusion's GEGLU).

Before -> after (Gelu)::

    com.microsoft::Gelu(X)  ->  Mul(Mul(X, Add(Erf(Div(X, sqrt(2))), 1)), 0.5)

Always the elementwise form, at every opset: ONNX's own Gelu (opset 20) loads on ONNX
Runtime, OpenVINO and TVM 0.27 (measured), but it has not been run through onnx2torch and
onnx2tf yet, and every engine must run the portable output. float16 and bfloat16 are
computed in float32 and rounded once (ONNX Runtime's float16 kernels accumulate in float32
too); float32 and float64 as they are, except float64's erf, taken in float32 (ONNX Runtime
has no float64 Erf kernel; relative error ~1e-7).

Envelope: opsets 11+; any shape (BiasSplitGelu: an even last dim); every dim dynamic.
``--target ort`` keeps these nodes for ONNX Runtime, as for every contrib op.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._kernels import ort_runs

MS = frozenset({"com.microsoft"})
DEFAULT = frozenset({""})
_TYPES = (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)
_NARROW = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
FAST_GELU_CUBIC = 0.044715


class Facts(NamedTuple):
    elem_type: int  # of the inputs and the output
    rank: int | None
    alpha: float  # QuickGelu's
    approximate: str = "none"  # ONNX Gelu's
    # the output is a graph output: ONNX Runtime fuses nothing there, so the cheapest
    # elementwise form is written instead of the one its fusions recognize
    graph_output: bool = False


class _Activation(Pattern[Facts]):
    """Shared check/build: the tensors (x, then the op's others) share x's float type;
    ``formula`` builds the op on compute-type values."""

    tensors: tuple[str, ...] = ("x",)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        x = node.tensor("x")
        elem_type = require_type(ctx, x, "input", _TYPES)
        for name in self.tensors[1:]:
            if node.tensor(name):
                require_type(ctx, node.tensor(name), name, (elem_type,))
        shape = ctx.shape(x)
        self.check_shapes(node, ctx)
        return Facts(elem_type, None if shape is None else len(shape),
                     float(node.args.get("alpha", 1.0)),
                     str(node.args.get("approximate", "none")),
                     ctx.is_model_output(node.outputs[0]))

    def check_shapes(self, node: MatchedNode, ctx: MatchContext) -> None:
        """Op-specific shape requirements (raise Reject)."""

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        narrow = facts.elem_type in _NARROW
        dtype = np.dtype(np.float32) if narrow else numpy_dtype(facts.elem_type)
        values = {}
        for name in self.tensors:
            if node.tensor(name):
                value = b.input(node.tensor(name), numpy_dtype(facts.elem_type))
                values[name] = b.Cast(value, dtype, hint=f"{name}_f32") if narrow else value
        out = None if narrow else node.outputs[0]
        y = self.formula(b, values, facts, out)
        if narrow:
            b.Cast(y, facts.elem_type, out=node.outputs[0])

    def formula(self, b: Builder, values: dict[str, Value], facts: Facts,
                out: str | None) -> Value:
        raise NotImplementedError

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        shape = ctx.shape(node.tensor("x"))
        return [(facts.elem_type, None if shape is None else list(shape))]


def _gelu(b: Builder, x: Value, out: str | None = None) -> Value:
    """0.5 * x * (1 + erf(x / sqrt(2))), in the order ONNX Runtime's GeluFusion recognizes
    (Div, Erf, Add, Mul, Mul), so it runs ONNX Runtime's Gelu kernel again. ONNX Runtime has
    no float64 Erf kernel (patterns/_kernels.py): a float64 x takes its erf in float32
    (relative error ~1e-7)."""
    scaled = b.Div(x, np.asarray(math.sqrt(2.0), x.dtype), hint="x_over_sqrt2")
    if not ort_runs("Erf", TensorProto.DOUBLE) and x.dtype == np.float64:
        erf = b.Cast(b.Erf(b.Cast(scaled, np.float32, hint="erf_in"), hint="erf"), np.float64,
                     hint="erf_f64")
    else:
        erf = b.Erf(scaled, hint="erf")
    return b.Mul(b.Mul(x, erf + 1.0, hint="x_erf"), 0.5, hint="gelu", out=out)


def _tanh_gelu(b: Builder, x: Value, out: str | None = None, fusable: bool = True
               ) -> Value:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))): FastGelu, and ONNX's Gelu
    with approximate="tanh", written as the second formula of ONNX Runtime's
    FastGeluFusion (Pow(x, 3), Mul, Add x, Mul, Tanh, Add 1, Mul by 0.5 * x), which fuses
    it back into FastGelu. The fusion skips a subgraph whose result is a graph output: there
    (``fusable`` False) the formula writes a tensor of its own and ``Sub(y, 0)``, exact for
    every value, copies it out (1.2-1.5x the kernel, against 2-4x unfused;
    docs/performance.md)."""
    if not fusable:
        inner_value = _tanh_gelu(b, x, None, fusable=True)
        return b.Sub(inner_value, np.asarray(0, x.dtype), hint="fast_gelu_out", out=out)
    cubed = b.Pow(x, np.asarray(3.0, x.dtype), hint="cubed")
    inner = b.Mul(b.Add(x, b.Mul(cubed, np.asarray(FAST_GELU_CUBIC, x.dtype), hint="cubic"),
                        hint="inner"), np.asarray(SQRT_2_OVER_PI, x.dtype), hint="scaled")
    return b.Mul(b.Mul(x, np.asarray(0.5, x.dtype), hint="half"),
                 b.Add(b.Tanh(inner, hint="tanh"), np.asarray(1.0, x.dtype), hint="one_plus"),
                 hint="fast_gelu", out=out)


class Gelu(_Activation):
    op_type = "Gelu"
    forms = (Form("Gelu", domains=MS, inputs=(In("x"),)),)
    examples = (Example((("x", F, ("N", 8)),), domains=(("com.microsoft", 17),)),)

    def formula(self, b: Builder, values: dict[str, Value], facts: Facts,
                out: str | None) -> Value:
        return _gelu(b, values["x"], out)

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        return [gelu_reference(x)]


class BiasGelu(_Activation):
    op_type = "BiasGelu"
    tensors = ("x", "bias")
    forms = (Form("BiasGelu", domains=MS, inputs=(In("x"), In("bias"))),)
    examples = (Example((("x", F, ("N", 8)), ("b", F, (8,))), domains=(("com.microsoft", 13),)),)

    def check_shapes(self, node: MatchedNode, ctx: MatchContext) -> None:
        _bias_like_last_axis(node, ctx, "bias")

    def formula(self, b: Builder, values: dict[str, Value], facts: Facts,
                out: str | None) -> Value:
        return _gelu(b, values["x"] + values["bias"], out)

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None) -> list[np.ndarray]:
        x, bias = tensors["x"], tensors["bias"]
        assert x is not None and bias is not None
        return [gelu_reference(_widened(x) + _widened(bias), x.dtype)]


class FastGelu(_Activation):
    op_type = "FastGelu"
    tensors = ("x", "bias")
    forms = (Form("FastGelu", domains=MS, inputs=(In("x"), In("bias", optional=True))),)
    examples = (Example((("x", F, ("N", 8)), ("b", F, (8,))), domains=(("com.microsoft", 11),)),)

    def check_shapes(self, node: MatchedNode, ctx: MatchContext) -> None:
        if node.tensor("bias"):
            _bias_like_last_axis(node, ctx, "bias")

    def formula(self, b: Builder, values: dict[str, Value], facts: Facts,
                out: str | None) -> Value:
        x = values["x"] + values["bias"] if "bias" in values else values["x"]
        return _tanh_gelu(b, x, out, fusable=not facts.graph_output)

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None) -> list[np.ndarray]:
        x, bias = tensors["x"], tensors.get("bias")
        assert x is not None
        h = _widened(x) + (0 if bias is None else _widened(bias))
        y = 0.5 * h * (1 + np.tanh(SQRT_2_OVER_PI * (h + FAST_GELU_CUBIC * h ** 3)))
        return [y.astype(x.dtype)]


class OnnxGelu(_Activation):
    """ONNX's Gelu (opset 20) below 20: approximate "none" in GeluFusion's order, "tanh"
    as FastGelu's formula (the same tanh approximation)."""

    op_type = "Gelu"
    forms = (Form("Gelu", domains=DEFAULT, inputs=(In("x"),), attributes={
        "approximate": Attr("string", default="none", choices=("none", "tanh"))}),)
    examples = (Example((("x", F, ("N", 8)),), attrs={"approximate": "tanh"},
                        domains=(("", 17),)),)

    @property
    def name(self) -> str:
        return "Gelu (ONNX)"

    def formula(self, b: Builder, values: dict[str, Value], facts: Facts,
                out: str | None) -> Value:
        return _gelu(b, values["x"], out) if facts.approximate == "none" else \
            _tanh_gelu(b, values["x"], out, fusable=not facts.graph_output)

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        if args["approximate"] == "none":
            return [gelu_reference(x)]
        h = _widened(x)
        y = 0.5 * h * (1 + np.tanh(SQRT_2_OVER_PI * (h + FAST_GELU_CUBIC * h ** 3)))
        return [y.astype(x.dtype)]


class QuickGelu(_Activation):
    op_type = "QuickGelu"
    forms = (Form("QuickGelu", domains=MS, inputs=(In("x"),),
                  attributes={"alpha": Attr("float", default=1.702)}),)
    examples = (
        Example((("x", F, ("N", 8)),), attrs={"alpha": 1.5}, domains=(("com.microsoft", 17),)),
    )

    def formula(self, b: Builder, values: dict[str, Value], facts: Facts,
                out: str | None) -> Value:
        x = values["x"]
        return b.Mul(x, b.Sigmoid(x * facts.alpha, hint="sigmoid"), hint="quick_gelu",
                     out=out)

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        h = _widened(x)
        return [(h / (1 + np.exp(-float(args["alpha"]) * h))).astype(x.dtype)]


class BiasAdd(_Activation):
    op_type = "BiasAdd"
    tensors = ("x", "bias", "skip")
    forms = (Form("BiasAdd", domains=MS, inputs=(In("x"), In("bias"), In("skip"))),)
    examples = (
        Example(
            (("x", F, ("N", "S", 8)), ("b", F, (8,)), ("s", F, ("N", "S", 8))),
            domains=(("com.microsoft", 17),),
        ),
    )

    def check_shapes(self, node: MatchedNode, ctx: MatchContext) -> None:
        _bias_like_last_axis(node, ctx, "bias")
        require_shape(ctx, node.tensor("x"), "input", "(N, S, C)", 3, 3)

    def formula(self, b: Builder, values: dict[str, Value], facts: Facts,
                out: str | None) -> Value:
        return b.Add(values["x"] + values["bias"], values["skip"], hint="bias_add", out=out)

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None) -> list[np.ndarray]:
        x, bias, skip = tensors["x"], tensors["bias"], tensors["skip"]
        assert x is not None and bias is not None and skip is not None
        return [(_widened(x) + _widened(bias) + _widened(skip)).astype(x.dtype)]


class BiasSplitGelu(_Activation):
    op_type = "BiasSplitGelu"
    tensors = ("x", "bias")
    forms = (Form("BiasSplitGelu", domains=MS, inputs=(In("x"), In("bias"))),)
    examples = (
        Example(
            (("x", F, ("N", "S", 8)), ("b", F, (8,))), ((F, 3),), domains=(("com.microsoft", 17),)
        ),
    )

    def check_shapes(self, node: MatchedNode, ctx: MatchContext) -> None:
        width = _bias_like_last_axis(node, ctx, "bias")
        if isinstance(width, int) and width % 2:
            raise Reject(f"the last dim {width} must be even (split in two halves)")
        if width is None:
            raise Reject("the last dim must be static (the halves are split at its middle)")

    def formula(self, b: Builder, values: dict[str, Value], facts: Facts,
                out: str | None) -> Value:
        h = values["x"] + values["bias"]
        left, right = b.Split(h, 2, axis=-1, hint="halves")
        return b.Mul(left, _gelu(b, right), hint="split_gelu", out=out)

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None) -> list[np.ndarray]:
        x, bias = tensors["x"], tensors["bias"]
        assert x is not None and bias is not None
        h = _widened(x) + _widened(bias)
        left, right = np.split(h, 2, axis=-1)
        return [(left * gelu_reference(right, np.float64)).astype(x.dtype)]


def _bias_like_last_axis(node: MatchedNode, ctx: MatchContext, name: str) -> int | None:
    """The bias must be 1-D of x's last dim; returns that dim (None if not static)."""
    shape = ctx.shape(node.tensor(name))
    x_shape = ctx.shape(node.tensor("x"))
    last = x_shape[-1] if x_shape else None
    if shape is not None and len(shape) != 1:
        raise Reject(f"{name} must be 1-D (x's last dim), got rank {len(shape)}")
    if shape is not None and isinstance(shape[0], int) and isinstance(last, int) \
            and shape[0] != last:
        raise Reject(f"{name} has {shape[0]} values; x's last dim is {last}")
    if isinstance(last, int):
        return last
    return shape[0] if shape is not None and isinstance(shape[0], int) else None


def _widened(x: np.ndarray) -> np.ndarray:
    return np.asarray(x).astype(np.float64)


_ERF = np.frompyfunc(math.erf, 1, 1)


def gelu_reference(x: np.ndarray, dtype: Any = None) -> np.ndarray:
    """0.5 * x * (1 + erf(x / sqrt(2))) in float64, in ``dtype`` (default: x's)."""
    h = _widened(x)
    y = 0.5 * h * (1 + np.asarray(_ERF(h / math.sqrt(2.0)), np.float64))
    return y.astype(dtype or np.asarray(x).dtype)


PATTERNS = [Gelu(), BiasGelu(), FastGelu(), QuickGelu(), BiasAdd(), BiasSplitGelu(),
            OnnxGelu()]
