"""rot90 (torch.rot90): quarter turns over any pair of axes, as a reversed Gather + Transpose.

Matches:
- torch's fallbacks ``org.pytorch.aten::rot90(x, k, dims)`` and ``ATen(operator="rot90")``,
  whose ``k`` (int64 scalar) and ``dims`` (int64 pair) are constant inputs;
- ``Rot90(x; k:int=1, dims:ints=[0, 1])`` in any domain (torch's defaults).

Semantics are exactly ``torch.rot90(x, k, dims)``: turn ``k`` times from axis ``dims[0]``
toward ``dims[1]`` (negative axes count from the end, any integer k, taken mod 4):

    k = 1: flip(dims[1]) then swap the two axes    k = 2: flip both axes
    k = 3: flip(dims[0]) then swap the two axes    k = 0: the input itself

Before -> after::

    rot90(x, k, (a, b))  ->  dims (-2, -1) or (-1, -2): the shared rotation base
                             (patterns/_rotation.py, as Rot90AndScale builds it)
                             any other pair, o = min(a, b) the outer position:
                               k = 1, 3: Gather(reversed, axis=o) and Transpose(swap a, b),
                                         in the order that flips the right data at o
                               k = 2: Gather(reversed, axis=a) -> Gather(reversed, axis=b)
                                      (--target ort: one Slice with steps -1, -1)
                             reversed = (n - 1) - Range(0, n, 1) with n read from Shape

No Slice with step -1 in the portable output (onnx2tf turns some into Identity). For
k = 1, 3 the flip gathers along the outer axis of the two, so each index copies a block;
for k = 2 one Gather may run along the last axis (one element per index), which is still
faster than moving that axis out and back with two Transposes. ``--target ort`` uses a
step -1 Slice for k = 2, faster on ONNX Runtime (docs/performance.md, ATen ops).

Envelope: opsets 11+, every dtype, every dim dynamic (empty dims too); the rank must be
known (to resolve negative dims and write the Transpose), and k and dims must be constants
(the node is rejected otherwise, as are dims torch refuses: not two, equal, out of range).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_shape
from decomposer.examples import I64, Example, F, i64
from decomposer.forms import Attr, Const, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._rotation import build_rotation, rotation_facts

MAX_RANK = 64
INT64_MIN = -(2**63)


class Rot90Facts(NamedTuple):
    turns: int  # 0..3, from dims[0] toward dims[1]
    dims: tuple[int, int]  # normalised to 0..rank-1
    shape: tuple[int | str | None, ...]
    elem_type: int | None
    last_two: Any  # the rotation base's facts when dims are the last two axes, else None

    def output_type(self) -> OutputType:
        shape = list(self.shape)
        if self.turns % 2:
            a, b = self.dims
            shape[a], shape[b] = shape[b], shape[a]
        return self.elem_type, shape


_SHAPE = "it sets the graph's shape"


class Rot90(Pattern[Rot90Facts]):
    op_type = "Rot90"
    forms = (
        Form("Rot90", inputs=(In("x"),), attributes={
            "k": Attr("int", default=1, doc="quarter turns from dims[0] toward dims[1], any int"),
            "dims": Attr("ints", default=[0, 1], doc="the two axes of the rotation plane")}),
        # torch's rot90(self, k, dims): both set the graph's shape, so both are constants
        Form(aten="rot90", inputs=(In("x"), Const("k", "int", why=_SHAPE),
                                   Const("dims", "ints", why=_SHAPE))),
    )
    examples = (
        Example(
            (("x", F, ("N", "C", 4, "W")),),
            attrs={"k": 1, "dims": [1, 3]},
            aten=("x", i64(1), i64([1, 3])),
        ),
        Example(
            (("x", I64, (2, "H", "W")),),
            attrs={"k": -1, "dims": [-1, -2]},
            domains=(("custom.ops", 11),),
            aten=("x", i64(3), i64([-2, -1])),
            aten_opset=17,
        ),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Rot90Facts:
        k, dims = int(node.args["k"]), list(node.args["dims"])
        x = node.tensor("x")
        shape = require_shape(ctx, x, "input", "it resolves the rotation axes", min_rank=2,
                              max_rank=MAX_RANK)
        rank = len(shape)
        if len(dims) != 2:
            raise Reject(f"dims must name exactly 2 axes, got {dims}")
        if not all(-rank <= d < rank for d in dims):
            raise Reject(f"dims {dims} out of range for rank {rank}")
        first, second = (d % rank for d in dims)
        if first == second:
            raise Reject(f"dims {dims} name the same axis twice")
        if ctx.elem_type(x) == TensorProto.BFLOAT16 and ctx.opset < 13 and k % 4:
            raise Reject(f"bfloat16 needs opset 13 or newer (Transpose and Gather have no "
                         f"bfloat16 at opset {ctx.opset})")
        turns = k % 4
        last_two = None
        if {first, second} == {rank - 2, rank - 1}:
            torch_dims = (-2, -1) if first == rank - 2 else (-1, -2)
            last_two = rotation_facts(x, turns, torch_dims, 1.0, ctx)
        return Rot90Facts(turns, (first, second), tuple(shape), ctx.elem_type(x), last_two)

    def build(self, b: Builder, node: MatchedNode, facts: Rot90Facts) -> None:
        x, out = b.input(node.tensor("x")), node.outputs[0]
        if facts.last_two is not None:
            build_rotation(b, x, out, facts.last_two)
            return
        a, c = facts.dims
        rank = len(facts.shape)
        perm = list(range(rank))
        perm[a], perm[c] = c, a
        outer = min(a, c)  # flips gather along this position: whole blocks, never elements

        def swap(v: Value, hint: str, out: str | None = None) -> Value:
            return b.Transpose(v, perm, hint=hint, out=out)

        if facts.turns == 0:
            b.Identity(x, out=out)
        elif facts.turns == 2 and b.target == "ort":
            # ONNX Runtime only: one Slice with steps -1 (onnx2tf may drop it), measured
            # 6-14x faster than two Gathers at 8x64x56x56 with dims (1, 3).
            b.Slice(x, [-1, -1], [INT64_MIN, INT64_MIN], [a, c], [-1, -1], hint="flip_both",
                    out=out)
        elif facts.turns == 2:
            # Two Gathers, even when one is the last axis (one element per index): measured
            # 1.4-1.6x faster than moving that axis out and back with two Transposes.
            _flip(b, _flip(b, x, a, "flip_first"), c, "flip_second", out)
        else:
            # k = 1 flips the data of axis c, k = 3 that of axis a, then swaps the two; the
            # flip is done before the swap if that data sits at the outer position, after it
            # otherwise (a swap moves it there).
            flipped_axis = c if facts.turns == 1 else a
            if flipped_axis == outer:
                swap(_flip(b, x, outer, "flip"), "swap", out)
            else:
                _flip(b, swap(x, "swap"), outer, "flip", out)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Rot90Facts
                     ) -> list[OutputType]:
        return [facts.output_type()]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, k, dims = tensors["x"], int(args["k"]), list(args["dims"])
        assert x is not None
        return [np.ascontiguousarray(np.rot90(x, k, axes=(dims[0] % x.ndim,
                                                          dims[1] % x.ndim)))]


def _flip(b: Builder, x: Value, axis: int, hint: str, out: str | None = None) -> Value:
    """x reversed along ``axis`` (the builder's portable Reverse)."""
    return b.Reverse(x, axis, hint=hint, out=out)


PATTERNS = [Rot90()]
