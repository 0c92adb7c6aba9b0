"""Shared base of the rotate-and-scale patterns: quarter turns over the last two axes.

In: a tensor of known rank >= 2, a number of quarter turns, the turn direction as torch
``dims`` (``(-2, -1)`` or ``(-1, -2)``), and a scale.
Out: standard nodes computing ``torch.rot90(x, k, dims) * scale``, where ``flip`` reverses
the rows (axis -2) with a ``Gather`` of the index ``(n-1) - Range(0, n, 1)``, n read from
``Shape`` at run time, and ``T`` transposes the last two axes::

    k = 0: (nothing)          k = 1: T -> flip          k = 3: flip -> T
    k = 2: T -> flip -> T -> flip    (target ort: one Slice with steps -1, -1)
    then Mul(scale) unless scale == 1; Identity if nothing else is left to write the output.

Portable by construction (docs/portability.md): no ``Slice`` with a negative step, which
onnx2tf silently turns into Identity; only row flips, which every engine gathers in
whole-row copies (flipping the last axis with a Gather copies one element at a time, which
is slower). The index is built ascending and subtracted, not as ``Range(n-1, -1, -1)``:
ONNX Runtime 1.32's GatherToSliceFusion rewrites a Gather of that descending Range into an
empty Slice. Under ``--target ort``, k = 2 keeps the double step -1 Slice, faster there
than four passes (docs/performance.md, ATen ops). ``RotationPattern`` holds the check,
build, output types and reference; a subclass only declares its attributes and maps them
to (turns, dims, scale). Not a pattern module itself (leading underscore).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_shape
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern, Reject

INT64_MIN = -(2**63)
MAX_RANK = 64

# Mul's types at every opset >= 11, and the ones Mul-14 added.
_MUL_TYPES = {TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32,
              TensorProto.INT64, TensorProto.UINT32, TensorProto.UINT64}
_MUL_TYPES_14 = {TensorProto.INT8, TensorProto.INT16, TensorProto.UINT8, TensorProto.UINT16}
_FLOAT_TYPES = {TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE}


class RotationFacts(NamedTuple):
    turns: int  # quarter turns from H toward W, in 0..3
    shape: tuple[int | str | None, ...]  # the input's static shape (rank known)
    scale: float
    elem_type: int | None

    @property
    def rank(self) -> int:
        return len(self.shape)

    def output_type(self) -> tuple[int | None, tuple[int | str | None, ...]]:
        """Same dtype; H and W swap for an odd number of turns."""
        shape = self.shape
        if self.turns % 2:
            shape = (*shape[:-2], shape[-1], shape[-2])
        return self.elem_type, shape


def rotation_facts(x: str, turns: int, dims: tuple[int, int], scale: float,
                   ctx: MatchContext) -> RotationFacts:
    """Validate the input and normalise the rotation; raises Reject with a reason."""
    # The Transpose perm grows with the rank: absurd ranks are refused rather than built.
    shape = require_shape(ctx, x, "input", "to transpose the last two axes", min_rank=2,
                          max_rank=MAX_RANK)
    if not np.isfinite(scale):
        raise Reject(f"scale {scale} is not finite")
    # dims (-1, -2) turns the other way: rot90(x, k, (-1, -2)) == rot90(x, -k, (-2, -1)).
    normalized = (turns if dims == (-2, -1) else -turns) % 4
    elem_type = ctx.elem_type(x)
    if elem_type == TensorProto.BFLOAT16 and ctx.opset < 13 and normalized:
        raise Reject(f"bfloat16 needs opset 13 or newer (Transpose and Gather have no "
                     f"bfloat16 at opset {ctx.opset})")
    if scale != 1.0:
        if elem_type is None:
            raise Reject(f"the element type of input '{x}' is unknown, so the scale constant "
                         f"cannot be typed; give the input a typed value_info")
        allowed = _MUL_TYPES | (_MUL_TYPES_14 if ctx.opset >= 14 else set())
        name = TensorProto.DataType.Name(elem_type).lower()
        if elem_type not in allowed:
            raise Reject(f"cannot scale a {name} tensor at opset {ctx.opset}")
        if elem_type not in _FLOAT_TYPES and not float(scale).is_integer():
            raise Reject(f"scale {scale} is not an integer, but the input is {name}; the "
                         f"result would not be {name}")
    return RotationFacts(normalized, tuple(shape), float(scale), elem_type)


def build_rotation(b: Builder, x: str, out: str, facts: RotationFacts) -> None:
    """Emit the rotation and scale of ``x`` into ``out``."""
    rank, turns = facts.rank, facts.turns
    rows_axis = rank - 2
    swap_last_two = [*range(rank - 2), rank - 1, rank - 2]
    dtype = None if facts.elem_type is None else numpy_dtype(facts.elem_type)
    scaled = facts.scale != 1.0
    rotated_out = None if scaled else out  # the last rotation op writes `out` if no Mul follows

    def flip_rows(v: Value, hint: str, out: str | None = None) -> Value:
        """v reversed along axis -2 (whole rows at once)."""
        return b.Reverse(v, rows_axis, hint=hint, out=out)

    def swap(v: Value, hint: str, out: str | None = None) -> Value:
        return b.Transpose(v, swap_last_two, hint=hint, out=out)

    y = b.input(x, dtype)
    if turns == 1:  # flip W, then swap == swap, then flip the new rows (old W)
        y = flip_rows(swap(y, "swap_hw"), "flip_w", out=rotated_out)
    elif turns == 3:
        y = swap(flip_rows(y, "flip_h"), "swap_hw", out=rotated_out)
    elif turns == 2 and b.target == "ort":
        y = b.Slice(y, [-1, -1], [INT64_MIN, INT64_MIN], [rows_axis, rank - 1], [-1, -1],
                    hint="flip_hw", out=rotated_out)
    elif turns == 2:  # flip W (as swap, flip rows, swap back), then flip H
        flipped_w = swap(flip_rows(swap(y, "swap_hw"), "flip_w"), "swap_back")
        y = flip_rows(flipped_w, "flip_h", out=rotated_out)
    if scaled:
        assert dtype is not None  # rotation_facts guarantees it
        b.Mul(y, np.asarray(facts.scale).astype(dtype), hint="scaled", out=out)
    elif turns == 0:
        b.Identity(x, out=out)  # nothing to compute, but the output name must be written


class RotationPattern(Pattern[RotationFacts]):
    """Base of patterns computing ``torch.rot90(x, turns, dims) * scale``: their forms
    normalize to the tensor ``x`` and the arguments ``turns`` (int), ``dims`` (the torch
    dims, (-2, -1) or (-1, -2)) and ``scale`` (float)."""

    def check(self, node: MatchedNode, ctx: MatchContext) -> RotationFacts:
        args = node.args
        return rotation_facts(node.tensor("x"), int(args["turns"]), tuple(args["dims"]),
                              float(args["scale"]), ctx)

    def build(self, b: Builder, node: MatchedNode, facts: RotationFacts) -> None:
        build_rotation(b, node.tensor("x"), node.outputs[0], facts)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: RotationFacts
                     ) -> list[OutputType]:
        return [facts.output_type()]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        return [rot90_reference(x, int(args["turns"]), tuple(args["dims"]),
                                float(args["scale"]))]


def rot90_reference(x: np.ndarray, turns: int, dims: tuple[int, int], scale: float
                    ) -> np.ndarray:
    """numpy reference: ``torch.rot90(x, turns, dims) * scale`` in x's dtype."""
    axes = (x.ndim + dims[0], x.ndim + dims[1])
    rotated = np.rot90(x, turns, axes=axes)
    if scale == 1.0:
        return np.ascontiguousarray(rotated)
    return (rotated * np.asarray(scale).astype(x.dtype)).astype(x.dtype)
