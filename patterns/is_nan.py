"""IsNaN as ``Not(Equal(x, x))``, for ``--lower IsNaN`` and the engine targets whose engine
lacks it (MNN's converter: measured in docs/portability.md).

Matches ``IsNaN(X)`` in the default domain where it is lowered. Semantics are ONNX's: true
exactly where an element is NaN. IEEE 754 makes NaN the one value unequal to itself, and
``Equal`` compares by value (no engine in the suite folds ``x == x`` to true: each runs
the portability case).

Before -> after::

    IsNaN(x)  ->  Not(Equal(x, x))

Envelope: opsets 11+; float16/32/64 (bfloat16 from opset 13, where Equal takes it); any
shape, dims dynamic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder
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
        b.op("Not", b.op("Equal", x, x, hint="is_number"), out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(TensorProto.BOOL, list(facts.shape) if facts.shape is not None else None)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None) -> list[np.ndarray]:
        x = tensors["X"]
        assert x is not None
        return [np.isnan(x)]


PATTERNS = [IsNaN()]
