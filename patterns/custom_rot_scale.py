"""CustomRotScale: torch.rot90 over (H, W) in either order (a dims string), then a scale.

Matches ``CustomRotScale(x; rotations:int=1, scale_factor:float=1.0,
dims:string="height,width")`` in any domain, including the default domain (the article's
``symbolic()`` names none, so torch exports it there).

Semantics (the contract)::

    y = torch.rot90(x, rotations, dims) * scale_factor

where ``dims="height,width"`` means axes (-2, -1) and ``"width,height"`` means (-1, -2),
the opposite direction. ``dims`` is compared in lower case with spaces removed; any other
value is rejected with the node named. Any integer ``rotations`` is reduced mod 4.

Before -> after::

    CustomRotScale(x)  ->  [row flips (Gather of a reversed index) and Transposes of the last
                        two axes, see patterns/_rotation.py] -> [Mul(scale_factor)]

rotations = 0 (mod 4) emits no flip/Transpose, scale_factor = 1 emits no Mul. Envelope:
opsets 11+, any rank >= 2 (known), every dim dynamic; float16/32/64, and integer inputs
when the scale is integral. The scale constant has x's dtype.
"""

from __future__ import annotations

from decomposer.examples import Example, F
from decomposer.pattern import Attr, Form, In, Reject

from ._rotation import RotationPattern

_DIMS = {"height,width": (-2, -1), "width,height": (-1, -2)}


def _dims(value: str) -> tuple[int, int]:
    """"height,width" (any case and spacing) -> torch dims (-2, -1); "width,height" ->
    (-1, -2)."""
    key = "".join(value.split()).lower()
    if key not in _DIMS:
        raise Reject(f"{value!r} is not one of {list(_DIMS)}")
    return _DIMS[key]


class CustomRotScale(RotationPattern):
    op_type = "CustomRotScale"
    forms = (Form("CustomRotScale", inputs=(In("x"),), attributes={
        "rotations": Attr("int", default=1, arg="turns",
                          doc="quarter turns, any integer (mod 4)"),
        "scale_factor": Attr("float", default=1.0, arg="scale",
                             doc="multiplier applied after rotating"),
        "dims": Attr("string", default="height,width", normalize=_dims,
                     doc='"height,width" or "width,height"'),
    }),)
    examples = (
        Example(
            (("x", F, ("N", 3, "H", "W")),),
            attrs={"rotations": 2, "scale_factor": 1.5, "dims": "width,height"},
        ),
    )


PATTERNS = [CustomRotScale()]
