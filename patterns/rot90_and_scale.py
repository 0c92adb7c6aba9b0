"""Rot90AndScale (seed article 000): torch.rot90 over the last two axes, then a scale.

Matches ``Rot90AndScale(x; k:int=1, scale:float=1.0, clockwise:string="no")`` in any domain,
including the default domain (torch emits it there when ``symbolic()`` names no domain).

Semantics (the contract)::

    y = torch.rot90(x, k', dims=(-2, -1)) * scale,   k' = -k if clockwise == "yes" else k

torch.rot90 turns from the first axis toward the second, which is counter-clockwise as an
image is displayed; ``clockwise="yes"`` turns the other way. Any integer k is accepted and
reduced mod 4. ``clockwise`` accepts "yes"/"no" and also "true"/"false", in any letter
case and with surrounding spaces; anything else is rejected with the node named.

Before -> after::

    Rot90AndScale(x)  ->  [Slice(step -1) -> Transpose(last two)] -> [Mul(scale)]

k = 0 emits no Slice/Transpose, scale = 1 emits no Mul. Envelope: opsets 11+, any rank >= 2
(known), every dim dynamic; float16/32/64, and integer inputs when the scale is integral.
The scale constant has x's dtype.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from decomposer.builder import Builder
from decomposer.pattern import Attr, MatchContext, MatchedNode, OutputType, Pattern, Reject
from decomposer.patterns._rotation import (
    RotationFacts,
    build_rotation,
    rot90_reference,
    rotation_facts,
)

_CLOCKWISE = {"yes": True, "true": True, "no": False, "false": False}


def _normalize_clockwise(value: str) -> str:
    return value.strip().lower()


class Rot90AndScale(Pattern):
    op_type = "Rot90AndScale"
    attributes = {
        "k": Attr("int", default=1, doc="quarter turns, any integer (mod 4)"),
        "scale": Attr("float", default=1.0, doc="multiplier applied after the rotation"),
        "clockwise": Attr("string", default="no", normalize=_normalize_clockwise,
                          choices=tuple(_CLOCKWISE), doc='"yes" turns clockwise'),
    }

    def check(self, node: MatchedNode, ctx: MatchContext) -> RotationFacts:
        if len(node.inputs) != 1 or not node.inputs[0]:
            raise Reject(f"expected 1 input, got {len(node.inputs)}")
        turns = -node.attrs["k"] if _CLOCKWISE[node.attrs["clockwise"]] else node.attrs["k"]
        return rotation_facts(node.inputs[0], turns, (-2, -1), node.attrs["scale"], ctx)

    def build(self, b: Builder, node: MatchedNode, facts: RotationFacts) -> None:
        build_rotation(b, node.inputs[0], node.outputs[0], facts)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: RotationFacts
                     ) -> list[OutputType]:
        return [facts.output_type()]

    def reference(self, *inputs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
        k = int(attrs.get("k", 1))
        clockwise = _CLOCKWISE.get(_normalize_clockwise(str(attrs.get("clockwise", "no"))))
        if clockwise is None:
            raise ValueError(f"clockwise must be one of {list(_CLOCKWISE)}")
        return [rot90_reference(inputs[0], -k if clockwise else k, (-2, -1),
                                float(attrs.get("scale", 1.0)))]


PATTERNS = [Rot90AndScale()]
