"""IsNaN as comparisons, for ``--lower IsNaN`` and the engine targets whose engine lacks it
(MNN's converter: measured in docs/portability.md).

Matches ``IsNaN(X)`` in the default domain where it is lowered. Semantics are ONNX's: true
exactly where an element is NaN. Under IEEE 754, NaN is the one value unequal to itself,
and every ordered comparison with it is false, while every other value, infinities
included, is below +inf or above -inf. Either test alone says IsNaN; engines break one
each, the same way (measured):

- MNN answers ``x == x`` with true for NaN;
- OpenVINO answers ``x < +inf`` (and ``x <= 0 or x > 0``, ``|x| <= +inf``) with true
  for NaN.

Each engine's broken test misses the NaNs and never flags another value, so the union of
the two is exact on both, and on every other engine of the suite. Speed: about 2x the
native kernel on ONNX Runtime (four elementwise passes and a Not for one; docs/performance.md).

Before -> after::

    IsNaN(x)  ->  Not(And(Equal(x, x), Or(Less(x, +inf), Greater(x, -inf))))

Envelope: opsets 11+; float16/32/64 (bfloat16 from opset 13, where Less and Greater take
it); any shape, dims dynamic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, numpy_dtype
from decomposer.checks import require_type
from decomposer.examples import Example, F
from decomposer.forms import Form, In
from decomposer.opsets import LOWERING_DOMAIN
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.BFLOAT16)


class Facts(NamedTuple):
    elem_type: int
    shape: tuple[Any, ...] | None


class IsNaN(Pattern[Facts]):
    op_type = "IsNaN"
    forms = (Form("IsNaN", domains=frozenset({"", LOWERING_DOMAIN}), inputs=(In("X"),)),)
    examples = (Example((("x", F, ("N", 5)),), ((TensorProto.BOOL, 2),),
                        domains=((LOWERING_DOMAIN, 13),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        x = node.tensor("X")
        types = _TYPES if ctx.opset >= 13 else _TYPES[:-1]
        return Facts(require_type(ctx, x, "X", types), ctx.shape(x))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        x = b.input(node.tensor("X"), facts.elem_type)
        dtype = numpy_dtype(facts.elem_type)
        equal = b.op("Equal", x, x, hint="equal_self")
        # (not |x| <= inf: MNN answers that with true for NaN as well)
        bounded = b.op("Or", b.op("Less", x, b.const(np.array(np.inf, dtype)),
                                  hint="below_inf"),
                       b.op("Greater", x, b.const(np.array(-np.inf, dtype)),
                            hint="above_minus_inf"), hint="ordered")
        b.op("Not", b.op("And", equal, bounded, hint="a_number"), out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(TensorProto.BOOL, list(facts.shape) if facts.shape is not None else None)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None) -> list[np.ndarray]:
        x = tensors["X"]
        assert x is not None
        return [np.isnan(x)]


PATTERNS = [IsNaN()]
