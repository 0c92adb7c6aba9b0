"""Rot90AndScale: torch.rot90 over the last two axes, clockwise or not, then a scale.

Matches ``Rot90AndScale(x; k:int=1, scale:float=1.0, clockwise:string="no")`` in any domain,
including the default domain (torch emits it there when ``symbolic()`` names no domain).

Semantics (the contract)::

    y = torch.rot90(x, k', dims=(-2, -1)) * scale,   k' = -k if clockwise == "yes" else k

torch.rot90 turns from the first axis toward the second, which is counter-clockwise as an
image is displayed; ``clockwise="yes"`` turns the other way. Any integer k is accepted and
reduced mod 4. ``clockwise`` accepts "yes"/"no" and also "true"/"false", in any letter
case and with surrounding spaces; anything else is rejected with the node named.

Before -> after::

    Rot90AndScale(x)  ->  [row flips (Gather of a reversed index) and Transposes of the last
                        two axes, see patterns/_rotation.py] -> [Mul(scale)]

k = 0 emits no flip/Transpose, scale = 1 emits no Mul. Envelope: opsets 11+, any rank >= 2
(known), every dim dynamic; float16/32/64, and integer inputs when the scale is integral.
The scale constant has x's dtype.
"""

from __future__ import annotations

from typing import Any

from decomposer.examples import Example, F
from decomposer.pattern import Attr, Form, In

from ._rotation import RotationPattern

_CLOCKWISE = {"yes": True, "true": True, "no": False, "false": False}


def _normalize_clockwise(value: str) -> str:
    return value.strip().lower()


def _rotation(args: dict[str, Any]) -> dict[str, Any]:
    turns = -args["k"] if _CLOCKWISE[args["clockwise"]] else args["k"]
    return {"turns": int(turns), "dims": (-2, -1), "scale": float(args["scale"])}


class Rot90AndScale(RotationPattern):
    op_type = "Rot90AndScale"
    forms = (Form("Rot90AndScale", inputs=(In("x"),), convert=_rotation, attributes={
        "k": Attr("int", default=1, doc="quarter turns, any integer (mod 4)"),
        "scale": Attr("float", default=1.0, doc="multiplier applied after the rotation"),
        "clockwise": Attr("string", default="no", normalize=_normalize_clockwise,
                          choices=tuple(_CLOCKWISE), doc='"yes" turns clockwise'),
    }),)
    examples = (
        Example(
            (("x", F, ("N", 3, "H", "W")),),
            attrs={"k": 3, "scale": 2.0, "clockwise": "yes"},
            domains=(("custom.ops", 17), ("", 11)),
        ),
    )


PATTERNS = [Rot90AndScale()]
