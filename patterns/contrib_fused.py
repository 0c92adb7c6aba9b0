"""ONNX Runtime's fused contrib ops (com.microsoft FusedMatMul, FusedGemm, FusedConv) unfused
into the standard ops they stand for.

Matches, with the inputs and attributes of the schemas ONNX Runtime 1.32 registers
(``get_all_operator_schema()``; docs/ContribOperators.md) and the numbers of its CPU
kernels (the transposes and activations below were pinned by running them):
- ``FusedMatMul(A, B; alpha=1, transA=0, transB=0, transBatchA=0, transBatchB=0)``:
  ``alpha * opA(A) @ opB(B)`` with MatMul's broadcasting. ``transBatch`` moves the first
  dim in front of the last (perm ``[1, ..., r-2, 0, r-1]``, rank 3+), then ``trans`` swaps
  the last two. What ORT's optimizer writes for a MatMul whose operand is transposed or
  scaled (attention scores).
- ``FusedGemm(A, B[, C]; alpha, beta, transA, transB, activation, activation_alpha,
  activation_beta)``: ``Gemm`` then the activation: Relu, Tanh, Sigmoid, LeakyRelu (alpha),
  HardSigmoid (alpha, beta), Elu (alpha), ThresholdedRelu (alpha), Softplus, Softsign,
  ScaledTanh (``alpha * tanh(beta * x)``), ParametricSoftplus (``alpha * softplus(beta *
  x)``). ONNX Runtime's kernel has no defaults: an activation's
  ``activation_alpha``/``activation_beta`` must be given. It refuses Clip and Selu here,
  and so does the pattern.
- ``FusedConv(X, W[, B][, Z]; Conv's attributes, activation, activation_params)``:
  ``activation(Conv(X, W, B) + Z)``, activation Relu, Tanh, Sigmoid, LeakyRelu (one
  param), HardSigmoid (two: alpha, beta), Clip (two: min, max), or none. What ORT writes when
  it saves a model optimized at its ``all`` level.

Before -> after (FusedMatMul with transA and alpha)::

    FusedMatMul(A, B; transA=1, alpha=a)  ->  Mul(MatMul(Transpose(A, [.., -1, -2]), B), a)

Envelope: opsets 11+ (bfloat16 13+); the dtypes of the schemas (FusedGemm's integer types:
no activation, as ONNX's Gemm); FusedMatMul needs the ranks known when a transpose is
asked for; every dim dynamic. ``--target ort`` keeps the nodes, as for every contrib op.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import Shape, require_broadcastable, require_shape, require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

MS = frozenset({"com.microsoft"})
_FLOATS = (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)
_GEMM_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.UINT32,
               TensorProto.UINT64, TensorProto.INT32, TensorProto.INT64)
_CONV_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)

# activation: how many of activation_alpha, activation_beta it reads (ONNX Runtime's kernel
# requires them: it has no defaults)
GEMM_ACTIVATIONS: dict[str, int] = {
    "Relu": 0, "Tanh": 0, "Sigmoid": 0, "Softplus": 0, "Softsign": 0, "LeakyRelu": 1,
    "Elu": 1, "ThresholdedRelu": 1, "HardSigmoid": 2, "ScaledTanh": 2, "ParametricSoftplus": 2,
}
CONV_ACTIVATIONS: dict[str, int] = {"Relu": 0, "Tanh": 0, "Sigmoid": 0, "LeakyRelu": 1,
                                    "HardSigmoid": 2, "Clip": 2}


def apply_activation(b: Builder, x: Value, name: str, params: tuple[float, ...],
                     out: str | None) -> Value:
    """``name`` (a fused activation) applied to x with its parameters, as standard ops."""
    dtype = x.dtype
    scalar = (lambda v: np.asarray(v, dtype)) if dtype is not None else float
    if name in ("Relu", "Tanh", "Sigmoid"):
        return b.op(name, x, out=out, dtype=dtype)
    if name in ("Softplus", "Softsign"):
        return b.op(name, x, out=out, dtype=dtype)
    if name in ("LeakyRelu", "Elu", "ThresholdedRelu"):
        return b.op(name, x, alpha=float(params[0]), out=out, dtype=dtype)
    if name == "HardSigmoid":
        return b.op(name, x, alpha=float(params[0]), beta=float(params[1]), out=out,
                    dtype=dtype)
    if name == "Clip":
        return b.Clip(x, scalar(params[0]), scalar(params[1]), out=out)
    inner = b.Mul(x, scalar(params[1]), hint="act_in")
    if name == "ScaledTanh":
        return b.Mul(b.Tanh(inner, hint="act_tanh"), scalar(params[0]), out=out)
    if name == "ParametricSoftplus":
        return b.Mul(b.op("Softplus", inner, hint="act_softplus", dtype=dtype),
                     scalar(params[0]), out=out)
    raise AssertionError(name)


def activation_reference(x: np.ndarray, name: str, params: tuple[float, ...]) -> np.ndarray:
    """The activations in numpy (float64)."""
    if name == "Relu":
        return np.maximum(x, 0)
    if name == "Tanh":
        return np.tanh(x)
    if name == "Sigmoid":
        return 1 / (1 + np.exp(-x))
    if name == "Softplus":
        return np.logaddexp(0, x)
    if name == "Softsign":
        return x / (1 + np.abs(x))
    if name == "LeakyRelu":
        return np.where(x >= 0, x, params[0] * x)
    if name == "Elu":
        return np.where(x > 0, x, params[0] * np.expm1(x))
    if name == "ThresholdedRelu":
        return np.where(x > params[0], x, 0)
    if name == "HardSigmoid":
        return np.clip(params[0] * x + params[1], 0, 1)
    if name == "Clip":
        return np.clip(x, params[0], params[1])
    if name == "ScaledTanh":
        return params[0] * np.tanh(params[1] * x)
    if name == "ParametricSoftplus":
        return params[0] * np.logaddexp(0, params[1] * x)
    raise AssertionError(name)


def batch_perm(rank: int, trans: bool, trans_batch: bool) -> list[int]:
    """FusedMatMul's operand transpose: transBatch moves dim 0 in front of the last, then
    trans swaps the last two (pinned against ONNX Runtime's kernel)."""
    perm = list(range(1, rank - 1)) + [0, rank - 1] if trans_batch else list(range(rank))
    if trans:
        perm[-1], perm[-2] = perm[-2], perm[-1]
    return perm


class MatMulFacts(NamedTuple):
    elem_type: int
    perm_a: list[int] | None
    perm_b: list[int] | None


class FusedMatMul(Pattern[MatMulFacts]):
    op_type = "FusedMatMul"
    forms = (Form("FusedMatMul", domains=MS, inputs=(In("A"), In("B")),
                  attributes={"alpha": Attr("float", default=1.0),
                              "transA": Attr("int", default=0, choices=(0, 1)),
                              "transB": Attr("int", default=0, choices=(0, 1)),
                              "transBatchA": Attr("int", default=0, choices=(0, 1)),
                              "transBatchB": Attr("int", default=0, choices=(0, 1))}),)
    examples = (
        Example((("a", F, ("N", 4, "K")), ("b", F, ("N", "M", "K"))),
                attrs={"transB": 1, "alpha": 0.125}, domains=(("com.microsoft", 17),)),
        Example((("a", F, ("N", 3, 4, 5)), ("b", F, (5, 6))),
                attrs={"transBatchA": 1}, domains=(("com.microsoft", 13),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> MatMulFacts:
        args = node.args
        elem_type = require_type(ctx, node.tensor("A"), "A", _FLOATS)
        require_type(ctx, node.tensor("B"), "B", (elem_type,))
        if elem_type == TensorProto.BFLOAT16 and ctx.opset < 13:
            raise Reject("bfloat16 needs opset 13 or newer (MatMul has none before)")
        perms: list[list[int] | None] = []
        for side in "AB":
            trans, batch = bool(args[f"trans{side}"]), bool(args[f"transBatch{side}"])
            if not (trans or batch):
                perms.append(None)
                continue
            shape = require_shape(ctx, node.tensor(side), side, f"to transpose it (trans"
                                  f"{'Batch' if batch else ''}{side})",
                                  min_rank=3 if batch else 2)
            perms.append(batch_perm(len(shape), trans, batch))
        _check_matmul_shapes(ctx.shape(node.tensor("A")), ctx.shape(node.tensor("B")),
                             perms[0], perms[1])
        return MatMulFacts(elem_type, perms[0], perms[1])

    def build(self, b: Builder, node: MatchedNode, facts: MatMulFacts) -> None:
        dtype = numpy_dtype(facts.elem_type)
        operands = []
        for side, perm in (("A", facts.perm_a), ("B", facts.perm_b)):
            value = b.input(node.tensor(side), dtype)
            operands.append(value if perm is None else
                            b.Transpose(value, perm, hint=f"{side}_t"))
        alpha = float(node.args["alpha"])
        out = node.outputs[0]
        product = b.MatMul(operands[0], operands[1], hint="product",
                           out=out if alpha == 1.0 else None)
        if alpha != 1.0:
            b.Mul(product, np.asarray(alpha, dtype), hint="scaled", out=out)

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        a, c = tensors["A"], tensors["B"]
        assert a is not None and c is not None
        ops = []
        for side, array in (("A", a), ("B", c)):
            trans, batch = bool(args[f"trans{side}"]), bool(args[f"transBatch{side}"])
            ops.append(np.transpose(array, batch_perm(array.ndim, trans, batch))
                       if trans or batch else array)
        result = np.matmul(ops[0].astype(np.float64), ops[1].astype(np.float64))
        return [(result * float(args["alpha"])).astype(a.dtype)]


def _mismatch(a: Any, b: Any) -> bool:
    return isinstance(a, int) and isinstance(b, int) and a != b


def _check_matmul_shapes(a: Shape | None, b: Shape | None, perm_a: list[int] | None,
                         perm_b: list[int] | None) -> None:
    """MatMul's rules on the static dims after the transposes: contracted dims equal, batch
    dims broadcastable."""
    if a is None or b is None or not a or not b:
        return
    a = tuple(a[p] for p in perm_a) if perm_a else tuple(a)
    b = tuple(b[p] for p in perm_b) if perm_b else tuple(b)
    k_b = b[-2] if len(b) >= 2 else b[0]
    if _mismatch(a[-1], k_b):
        raise Reject(f"A's last dim {a[-1]} does not match B's contracted dim {k_b} "
                     f"(after the transposes)")
    for x, y in zip(reversed(a[:-2]), reversed(b[:-2]), strict=False):
        if _mismatch(x, y) and 1 not in (x, y):
            raise Reject(f"A's and B's batch dims {list(a[:-2])} and {list(b[:-2])} do not "
                         f"broadcast")


class GemmFacts(NamedTuple):
    elem_type: int
    activation: str | None
    params: tuple[float, ...]


def _gemm_activation(args: dict[str, Any]) -> tuple[str | None, tuple[float, ...]]:
    name = args.get("activation")
    if not name:
        return None, ()
    if name not in GEMM_ACTIVATIONS:
        raise Reject(f"activation {name!r} is not one ONNX Runtime's FusedGemm applies "
                     f"({', '.join(GEMM_ACTIVATIONS)})")
    params = []
    for key in ("activation_alpha", "activation_beta")[:GEMM_ACTIVATIONS[name]]:
        if args.get(key) is None:
            raise Reject(f"activation {name} needs {key} (ONNX Runtime's kernel has no "
                         f"default)")
        params.append(float(args[key]))
    return name, tuple(params)


class FusedGemm(Pattern[GemmFacts]):
    op_type = "FusedGemm"
    forms = (Form("FusedGemm", domains=MS, inputs=(In("A"), In("B"), In("C", optional=True)),
                  attributes={"alpha": Attr("float", default=1.0),
                              "beta": Attr("float", default=1.0),
                              "transA": Attr("int", default=0, choices=(0, 1)),
                              "transB": Attr("int", default=0, choices=(0, 1)),
                              "activation": Attr("string", default=None),
                              "activation_alpha": Attr("float", default=None),
                              "activation_beta": Attr("float", default=None),
                              "activation_gamma": Attr("float", default=None)}),)
    examples = (
        Example((("a", F, ("N", 4)), ("b", F, (4, 6)), ("c", F, (6,))),
                attrs={"activation": "LeakyRelu", "activation_alpha": 0.1, "transB": 0},
                domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> GemmFacts:
        elem_type = require_type(ctx, node.tensor("A"), "A", _GEMM_TYPES)
        for side in ("B", "C"):
            if node.tensor(side):
                require_type(ctx, node.tensor(side), side, (elem_type,))
        a, c = ctx.shape(node.tensor("A")), ctx.shape(node.tensor("B"))
        for label, shape in (("A", a), ("B", c)):
            if shape is not None and len(shape) != 2:
                raise Reject(f"{label} must be 2-D (Gemm), got rank {len(shape)}")
        if a is not None and c is not None:
            rows, k_a = (a[1], a[0]) if node.args["transA"] else (a[0], a[1])
            k_b, cols = (c[1], c[0]) if node.args["transB"] else (c[0], c[1])
            if _mismatch(k_a, k_b):
                raise Reject(f"A's inner dim {k_a} does not match B's {k_b}")
            if node.tensor("C"):
                require_broadcastable(ctx, node.tensor("C"), "C", (rows, cols),
                                      "the product (M, N)")
        name, params = _gemm_activation(node.args)
        if name and elem_type not in _CONV_TYPES:
            raise Reject(f"activation {name} on an integer Gemm (ONNX's activations are for "
                         f"floats)")
        return GemmFacts(elem_type, name, params)

    def build(self, b: Builder, node: MatchedNode, facts: GemmFacts) -> None:
        dtype = numpy_dtype(facts.elem_type)
        args = node.args
        inputs = [b.input(node.tensor(side), dtype) for side in ("A", "B", "C")
                  if node.tensor(side)]
        out = node.outputs[0]
        gemm = b.op("Gemm", *inputs, alpha=float(args["alpha"]), beta=float(args["beta"]),
                    transA=int(args["transA"]), transB=int(args["transB"]), dtype=dtype,
                    hint="gemm", out=None if facts.activation else out)
        if facts.activation:
            apply_activation(b, gemm, facts.activation, facts.params, out)

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        a, c, bias = tensors["A"], tensors["B"], tensors.get("C")
        assert a is not None and c is not None
        a64 = a.T if args["transA"] else a
        c64 = c.T if args["transB"] else c
        y = float(args["alpha"]) * (a64.astype(np.float64) @ c64.astype(np.float64))
        if bias is not None:
            y = y + float(args["beta"]) * bias.astype(np.float64)
        name, params = _gemm_activation(args)
        if name:
            y = activation_reference(y, name, params)
        return [y.astype(a.dtype)]


class ConvFacts(NamedTuple):
    elem_type: int
    activation: str | None
    params: tuple[float, ...]


def _check_conv_shapes(node: MatchedNode, ctx: MatchContext) -> None:
    """Conv's rules on the static shapes: X (N, C, ...), W (M, C / group, ...) of X's rank,
    B (M,), Z of X's rank."""
    x = require_shape(ctx, node.tensor("X"), "X", "Conv's spatial rank", min_rank=3)
    spatial = len(x) - 2
    for key, count in (("kernel_shape", spatial), ("strides", spatial),
                       ("dilations", spatial), ("pads", 2 * spatial)):
        values = node.args.get(key)
        if values is not None and len(values) != count:
            raise Reject(f"{key} has {len(values)} values; a {spatial}-D Conv takes {count}")
    w = ctx.shape(node.tensor("W"))
    if w is not None:
        if len(w) != len(x):
            raise Reject(f"W has rank {len(w)}, X rank {len(x)}")
        group = int(node.args.get("group") or 1)
        if isinstance(x[1], int) and isinstance(w[1], int) and w[1] * group != x[1]:
            raise Reject(f"W's {w[1]} input channels x group {group} do not match X's "
                         f"{x[1]} channels")
    bias = ctx.shape(node.tensor("B")) if node.tensor("B") else None
    if bias is not None and (len(bias) != 1 or (w is not None and _mismatch(bias[0], w[0]))):
        raise Reject(f"B must be 1-D with W's output channels, got shape {list(bias)}")
    z = ctx.shape(node.tensor("Z")) if node.tensor("Z") else None
    if z is not None and len(z) != len(x):
        raise Reject(f"Z has rank {len(z)}, the output rank {len(x)}")


_CONV_ATTRIBUTES = ("group", "pads", "strides", "dilations", "kernel_shape", "auto_pad")


class FusedConv(Pattern[ConvFacts]):
    op_type = "FusedConv"
    forms = (Form("FusedConv", domains=MS,
                  inputs=(In("X"), In("W"), In("B", optional=True), In("Z", optional=True)),
                  attributes={"activation": Attr("string", default=None),
                              "activation_params": Attr("floats", default=None),
                              "group": Attr("int", default=None),
                              "pads": Attr("ints", default=None),
                              "strides": Attr("ints", default=None),
                              "dilations": Attr("ints", default=None),
                              "kernel_shape": Attr("ints", default=None),
                              "auto_pad": Attr("string", default=None)}),)
    examples = (
        Example((("x", F, ("N", 2, "H", "W")), ("w", F, (3, 2, 3, 3)), ("b", F, (3,))),
                attrs={"activation": "Clip", "activation_params": [0.0, 6.0],
                       "pads": [1, 1, 1, 1]}, domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> ConvFacts:
        elem_type = require_type(ctx, node.tensor("X"), "X", _CONV_TYPES)
        for side in ("W", "B", "Z"):
            if node.tensor(side):
                require_type(ctx, node.tensor(side), side, (elem_type,))
        _check_conv_shapes(node, ctx)
        name = node.args.get("activation")
        params = tuple(float(p) for p in node.args.get("activation_params") or ())
        if name:
            if name not in CONV_ACTIVATIONS:
                raise Reject(f"activation {name!r} is not one ONNX Runtime's FusedConv applies "
                             f"({', '.join(CONV_ACTIVATIONS)})")
            if len(params) != CONV_ACTIVATIONS[name]:
                raise Reject(f"activation {name} takes {CONV_ACTIVATIONS[name]} "
                             f"activation_params, got {len(params)}")
        return ConvFacts(elem_type, name or None, params)

    def build(self, b: Builder, node: MatchedNode, facts: ConvFacts) -> None:
        dtype = numpy_dtype(facts.elem_type)
        attrs = {key: node.args[key] for key in _CONV_ATTRIBUTES
                 if node.args.get(key) is not None}
        inputs = [b.input(node.tensor(side), dtype) for side in ("X", "W", "B")
                  if node.tensor(side)]
        out = node.outputs[0]
        z = node.tensor("Z")
        last = out if not (facts.activation or z) else None
        y = b.op("Conv", *inputs, dtype=dtype, hint="conv", out=last, **attrs)
        if z:
            y = b.Add(y, b.input(z, dtype), hint="plus_z",
                      out=out if not facts.activation else None)
        if facts.activation:
            apply_activation(b, y, facts.activation, facts.params, out)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: ConvFacts
                     ) -> list[OutputType]:
        return [(facts.elem_type, None)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["X"]
        assert x is not None
        attrs = {key: args[key] for key in _CONV_ATTRIBUTES if args.get(key) is not None}
        inputs = [tensors[side] for side in ("X", "W", "B") if tensors.get(side) is not None]
        y = _standard_reference("Conv", inputs, attrs).astype(np.float64)
        if tensors.get("Z") is not None:
            y = y + tensors["Z"].astype(np.float64)  # type: ignore[union-attr]
        name = args.get("activation")
        if name:
            y = activation_reference(y, name, tuple(args.get("activation_params") or ()))
        return [y.astype(x.dtype)]


def _standard_reference(op_type: str, inputs: list[Any], attrs: dict[str, Any]) -> np.ndarray:
    """A standard op on ONNX's own reference implementation (``onnx.reference``)."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    names = [f"input{i}" for i in range(len(inputs))]
    node = helper.make_node(op_type, names, ["output"], **attrs)
    outputs: Any = ReferenceEvaluator(node).run(None, dict(zip(names, inputs, strict=True)))
    return np.asarray(outputs[0])


PATTERNS = [FusedMatMul(), FusedGemm(), FusedConv()]
