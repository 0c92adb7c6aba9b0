"""ReduceL1, ReduceLogSum and ReduceLogSumExp as Abs/Log/Exp around ReduceSum, for
``--lower ReduceL1`` (``ReduceLogSum``, ``ReduceLogSumExp``).

Why: OpenVINO 2026.4's ONNX frontend ignores the ``axes`` attribute of these three at
opsets 13 to 17 and reduces over every axis ((2, 3, 4, 5) with ``axes=[2]`` comes out
(1, 1, 1, 1), measured; opsets 11 and 18 are right), silently. ReduceSum and ReduceMax,
which it reads right at every opset, carry the reduction instead.

Matches the default-domain ops (standard from opset 1, so only under ``--lower``), both
spellings: ``axes`` as an attribute (before 18) or as a constant second input (18+, with
``noop_with_empty_axes``); ``keepdims``.

Before -> after::

    ReduceL1(x)         ->  ReduceSum(Abs(x))
    ReduceLogSum(x)     ->  Log(ReduceSum(x))
    ReduceLogSumExp(x)  ->  Log(ReduceSum(Exp(x - m))) + m,  m = ReduceMax(x), 0 where
                            it is infinite (ONNX Runtime's kernel subtracts the maximum
                            too, so large inputs do not overflow)

Envelope: opsets 11+; float16/32/64 (ReduceL1 also int32/int64); the input's rank known
when ``axes`` is absent; a run-time ``axes`` input is refused.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Const, Form, In, Reject
from decomposer.opsets import LOWERING_DOMAIN
from decomposer.pattern import MatchContext, MatchedNode, Pattern

_FLOATS = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)
_ARGS = {"keepdims": Attr("int", 1), "axes": Attr("ints", None),
         "noop_with_empty_axes": Attr("int", 0)}


class Facts(NamedTuple):
    axes: list[int] | None  # None: the reduction is the identity (noop_with_empty_axes)
    keepdims: bool
    elem_type: int


def _form(op: str) -> Form:
    # the default domain (under --lower) and the take-down's hand-over domain (the examples
    # the fuzzer seeds from, which must decompose without --lower)
    return Form(op, domains=frozenset({"", LOWERING_DOMAIN}),
                inputs=(In("x"), Const("axes_input", "ints", default=None,
                                       why="the reduced axes decide the graph")),
                attributes=_ARGS)


class _Reduction(Pattern[Facts]):
    types: tuple[int, ...] = _FLOATS

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        x = node.tensor("x")
        elem_type = require_type(ctx, x, "x", self.types)
        axes = node.args["axes_input"] if node.args["axes_input"] is not None \
            else node.args["axes"]
        if axes is not None and len(axes) == 0:
            axes = None
        if axes is None:
            if node.args["noop_with_empty_axes"]:
                return Facts(None, bool(node.args["keepdims"]), elem_type)
            shape = ctx.shape(x)
            if shape is None:
                raise Reject("no axes given and the input's rank is unknown")
            axes = list(range(len(shape)))
        return Facts([int(a) for a in axes], bool(node.args["keepdims"]), elem_type)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        x = b.input(node.tensor("x"), facts.elem_type)
        out = node.outputs[0]
        if facts.axes is None:  # noop_with_empty_axes: the input as it is, mapped
            self.identity(b, x, out)
            return
        self.reduce(b, x, facts.axes, facts.keepdims, out)

    def identity(self, b: Builder, x: Value, out: str) -> None:
        raise NotImplementedError

    def reduce(self, b: Builder, x: Value, axes: list[int], keepdims: bool, out: str) -> None:
        raise NotImplementedError

    @staticmethod
    def _axes(args: dict[str, Any], x: np.ndarray) -> tuple[int, ...] | None:
        axes = args["axes_input"] if args["axes_input"] is not None else args["axes"]
        if axes is None or len(axes) == 0:
            return None if args["noop_with_empty_axes"] else tuple(range(x.ndim))
        return tuple(int(a) for a in axes)


class ReduceL1(_Reduction):
    op_type = "ReduceL1"
    forms = (_form("ReduceL1"),)
    types = (*_FLOATS, TensorProto.INT32, TensorProto.INT64)
    examples = (Example((("x", F, ("N", 4, 5)),), attrs={"axes": [1]},
                        domains=((LOWERING_DOMAIN, 13),)),)

    def identity(self, b: Builder, x: Value, out: str) -> None:
        b.Abs(x, out=out)

    def reduce(self, b: Builder, x: Value, axes: list[int], keepdims: bool, out: str) -> None:
        b.ReduceSum(b.Abs(x, hint="magnitude"), axes, keepdims, hint="l1", out=out)

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        axes = self._axes(args, x)
        if axes is None:
            return [np.abs(x)]
        return [np.sum(np.abs(x), axis=axes, keepdims=bool(args["keepdims"])).astype(x.dtype)]


class ReduceLogSum(_Reduction):
    op_type = "ReduceLogSum"
    forms = (_form("ReduceLogSum"),)
    examples = (Example((("x", F, ("N", 4, 5)),), ((F, 2),), attrs={"axes": [2], "keepdims": 0},
                        domains=((LOWERING_DOMAIN, 13),)),)

    def identity(self, b: Builder, x: Value, out: str) -> None:
        b.Log(x, out=out)

    def reduce(self, b: Builder, x: Value, axes: list[int], keepdims: bool, out: str) -> None:
        b.Log(b.ReduceSum(x, axes, keepdims, hint="sum"), hint="log_sum", out=out)

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        axes = self._axes(args, x)
        with np.errstate(divide="ignore", invalid="ignore"):
            if axes is None:
                return [np.log(x)]
            total = np.sum(x, axis=axes, keepdims=bool(args["keepdims"]))
            return [np.log(total).astype(x.dtype)]


class ReduceLogSumExp(_Reduction):
    op_type = "ReduceLogSumExp"
    forms = (_form("ReduceLogSumExp"),)
    examples = (Example((("x", F, ("N", 4, 5)),), attrs={"axes": [1, 2]},
                        domains=((LOWERING_DOMAIN, 17),)),)

    def identity(self, b: Builder, x: Value, out: str) -> None:
        b.Identity(x, out=out)  # log(exp(x)), exactly as the kernel leaves it

    def reduce(self, b: Builder, x: Value, axes: list[int], keepdims: bool, out: str) -> None:
        peak = b.ReduceMax(x, axes, True, hint="peak")
        zero = np.asarray(0, x.dtype)
        # an infinite maximum (a row of -inf, or +inf in it) shifts nothing: x - inf is NaN
        # (|peak| == inf rather than IsInf, which takes float16 only from opset 20)
        infinite = b.Equal(b.Abs(peak, hint="peak_size"), np.asarray(np.inf, x.dtype),
                           hint="peak_inf")
        shift = b.Where(infinite, zero, peak, hint="shift")
        summed = b.ReduceSum(b.Exp(b.Sub(x, shift, hint="shifted"), hint="exp"), axes, True,
                             hint="sum")
        result = b.Add(b.Log(summed, hint="log_sum"), shift, hint="log_sum_exp")
        if keepdims:
            b.Identity(result, out=out)
        else:
            b.Squeeze(result, axes, hint="log_sum_exp", out=out)

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        axes = self._axes(args, x)
        if axes is None:
            return [x.copy()]
        wide = x.astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            peak = np.max(wide, axis=axes, keepdims=True)
            shift = np.where(np.isinf(peak), 0.0, peak)
            value = np.log(np.sum(np.exp(wide - shift), axis=axes, keepdims=True)) + shift
        if not args["keepdims"]:
            value = np.squeeze(value, axis=axes)
        return [value.astype(x.dtype)]


PATTERNS = [ReduceL1(), ReduceLogSum(), ReduceLogSumExp()]
