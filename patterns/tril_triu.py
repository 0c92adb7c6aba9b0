"""tril / triu (torch.tril, torch.triu, ONNX Trilu): an index mask and Where.

Under ``--target ort`` opsets 14+ emit ONNX's Trilu instead (see below).

Matches:
- torch's fallbacks ``org.pytorch.aten::tril(x, diagonal)`` / ``triu`` and
  ``ATen(operator="tril" | "triu")``: ``diagonal`` is an int64 scalar input, constant or
  computed at run time (e.g. from ``x.shape``); torch's legacy exporter emits these below
  opset 14, where ONNX has no Trilu;
- ``Tril(x; diagonal:int=0)`` and ``Triu(x; diagonal:int=0)`` in any domain;
- ``Trilu(x, [k]; upper:int=1)`` in any custom domain, and in the default domain below
  opset 14 (at 14+ it is standard and never offered to patterns).

Semantics are torch's: on the last two axes (i = row, j = column), ``tril`` keeps
``x[..., i, j]`` where ``j - i <= diagonal`` and ``triu`` where ``j - i >= diagonal``; every
other element becomes 0 (False for bool), whatever it was (NaN and inf included); kept
elements are bit-exact (-0.0 stays -0.0). Leading axes are a batch.

Before -> after::

    tril(x, d)  ->  rows = Range(0, H) + d;  cols = Range(0, W)              # (H,), (W,)
                    drop = Greater(cols[None, :], rows[:, None])           # (H, W) bool
                    y = Where(Expand(drop, Shape(x)), 0, x)                # one x-sized pass
    triu: Less instead.
    --target ort, opset 14+ and a dtype ONNX Runtime's Trilu kernel has:
                    y = Trilu(x, d, upper)

Only the (H, W) mask is built from sizes; the Where is the only float pass over x (the
mask is expanded to x's shape for TVM, which cannot broadcast a Where's condition over
dynamic dims; ``--target ort`` broadcasts it instead). ONNX Runtime's Where is slow, so
the mask form costs several times its Trilu kernel (docs/performance.md, ATen ops), which
is why ``--target ort`` emits Trilu at 14+ (for the dtypes ONNX Runtime's Trilu has).
Portable output keeps the mask form at every opset: onnx2torch has no Trilu converter. For
dtypes its Where lacks: bool is And(x, Not drop); int16/uint16 and bfloat16 go through
int32/float32 and back (exact); uint64 is Mul by the 0/1 mask.

Envelope: opsets 11+, rank >= 2 (an unknown rank is fine), every dim dynamic, every dtype
torch's tril accepts (bool, ints, floats; not complex) plus uint16/32/64. A constant
diagonal is clamped to +-2**62 (same result, no overflow); a run-time diagonal must be an
int32/int64 scalar within +-2**62.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.examples import I32, I64, Example, F, i64
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._kernels import ORT_CPU_TYPES

# Where and Trilu lack some types on ONNX Runtime (patterns/_kernels.py); those get the
# detours described in the module docstring.
_WHERE_TYPES = ORT_CPU_TYPES["Where"] - {TensorProto.STRING}
_TRILU_TYPES = ORT_CPU_TYPES["Trilu"]
_VIA_INT32 = {TensorProto.INT16, TensorProto.UINT16}
_SUPPORTED = _WHERE_TYPES | _TRILU_TYPES | _VIA_INT32 | {TensorProto.UINT64,
                                                         TensorProto.BFLOAT16}
_INT_TYPES = {TensorProto.INT32, TensorProto.INT64}
DIAGONAL_LIMIT = 2**62  # beyond any real dimension; keeps rows + diagonal from overflowing


class TriFacts(NamedTuple):
    upper: bool
    diagonal: int | None  # the constant diagonal, or None when it comes at run time
    diagonal_input: str | None  # the run-time diagonal's tensor name
    diagonal_type: int | None
    diagonal_needs_reshape: bool  # the run-time diagonal is not known to be 0-d
    elem_type: int
    shape: tuple[int | str | None, ...] | None  # None when the rank is unknown


class _TriangleBase(Pattern):
    """Shared check/build/compute of the tril, triu and Trilu spellings. Arguments: ``upper``
    (bool) and ``diagonal`` (an int, from an attribute), or the tensor ``k`` (the diagonal
    at run time or as a constant input; absent: the ``diagonal`` argument, default 0)."""

    def check(self, node: MatchedNode, ctx: MatchContext) -> TriFacts:
        upper = bool(node.args["upper"])
        diagonal_name: str | None = node.tensor("k") or None
        diagonal = None if diagonal_name else int(node.args.get("diagonal", 0))
        x = node.tensor("x")
        shape = ctx.shape(x)
        if shape is not None and len(shape) < 2:
            raise Reject(f"input '{x}' has rank {len(shape)}; tril/triu need rank >= 2")
        elem_type = ctx.elem_type(x)
        if elem_type is None:
            raise Reject(f"the element type of input '{x}' is unknown, so the zero fill "
                         "cannot be typed; give it a typed graph input or value_info")
        if elem_type not in _SUPPORTED:
            raise Reject(f"element type {TensorProto.DataType.Name(elem_type).lower()} is "
                         "not supported (torch's tril/triu take real and bool tensors)")
        if elem_type == TensorProto.BFLOAT16 and ctx.opset < 13:
            raise Reject(f"bfloat16 needs opset 13 or newer (Shape has no bfloat16 at opset "
                         f"{ctx.opset})")
        diagonal_type, needs_reshape = None, False
        if diagonal_name:
            value = ctx.constant(diagonal_name)
            if value is not None:
                if value.size != 1 or not np.issubdtype(value.dtype, np.integer):
                    raise Reject(f"diagonal must be one integer, got {value.dtype} of shape "
                                 f"{value.shape}")
                diagonal, diagonal_name = int(value.reshape(())), None
            else:
                diagonal_type = ctx.elem_type(diagonal_name)
                if diagonal_type not in _INT_TYPES:
                    raise Reject(f"run-time diagonal '{diagonal_name}' must be int32 or int64, "
                                 f"got {_type_name(diagonal_type)}")
                diagonal_shape = ctx.shape(diagonal_name)
                if diagonal_shape is not None and (
                        len(diagonal_shape) > 1 or any(isinstance(d, int) and d != 1
                                                       for d in diagonal_shape)):
                    raise Reject(f"run-time diagonal '{diagonal_name}' must be a scalar, got "
                                 f"shape {list(diagonal_shape)}")
                # A Reshape of a shape-derived scalar breaks TVM's importer: only if needed.
                needs_reshape = diagonal_shape != ()
        if diagonal is not None:
            diagonal = int(np.clip(diagonal, -DIAGONAL_LIMIT, DIAGONAL_LIMIT))
        return TriFacts(upper, diagonal, diagonal_name or None, diagonal_type, needs_reshape,
                        elem_type,
                        None if shape is None else tuple(shape))

    def build(self, b: Builder, node: MatchedNode, facts: TriFacts) -> None:
        x = b.input(node.tensor("x"), facts.elem_type)
        out = node.outputs[0]
        diagonal: Value | int
        if facts.diagonal_input is not None:
            diagonal = b.input(facts.diagonal_input, facts.diagonal_type)
            if facts.diagonal_type != TensorProto.INT64:
                diagonal = b.Cast(diagonal, np.int64, hint="diagonal_i64")
            if facts.diagonal_needs_reshape:  # Trilu wants a 0-d k; a [1] one works too
                diagonal = b.Reshape(diagonal, [], hint="diagonal")
        else:
            assert facts.diagonal is not None
            diagonal = facts.diagonal
        if b.target == "ort" and b.opset >= 14 and facts.elem_type in _TRILU_TYPES:
            # Standard from 14 on and a single pass, 4-5x faster than the mask form on ONNX
            # Runtime; not portable: onnx2torch has no Trilu converter.
            k = b.ints(diagonal, "diagonal") if isinstance(diagonal, int) else diagonal
            b.op("Trilu", x, k, upper=int(facts.upper), hint="trilu", out=out)
            return
        _zero_where(b, x, _drop_mask(b, x, diagonal, facts), facts.elem_type, out)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: TriFacts
                     ) -> list[OutputType]:
        return [(facts.elem_type, facts.shape)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, k = tensors["x"], tensors.get("k")
        assert x is not None
        diagonal = int(np.asarray(k).reshape(())) if k is not None \
            else int(args.get("diagonal", 0))
        return [triangle_reference(x, diagonal, bool(args["upper"]))]


def _drop_mask(b: Builder, x: Value, diagonal: Value | int, facts: TriFacts) -> Value:
    """(H, W) bool mask (unsqueezed to x's rank when known) of the elements zeroed."""
    shape = b.Shape(x, hint="x_shape")
    height = b.Gather(shape, -2, hint="height")
    width = b.Gather(shape, -1, hint="width")
    rows = b.Range(0, height, 1, hint="rows")
    cols = b.Range(0, width, 1, hint="cols")
    if not (isinstance(diagonal, int) and diagonal == 0):
        rows = rows + diagonal  # column bound per row: tril keeps j <= i + d, triu j >= i + d
    rows = b.Unsqueeze(rows, [1], hint="rows_col")  # (H, 1)
    cols = b.Unsqueeze(cols, [0], hint="cols_row")  # (1, W)
    drop = (b.Less(cols, rows, hint="drop") if facts.upper
            else b.Greater(cols, rows, hint="drop"))
    rank = None if facts.shape is None else len(facts.shape)
    if rank == 2:
        return drop
    if rank is not None:
        drop = b.Unsqueeze(drop, list(range(rank - 2)), hint="drop_full_rank")
    if b.target == "ort":  # ONNX Runtime broadcasts the mask itself
        return drop
    # TVM (Relax, 0.27) cannot lower a Where whose condition broadcasts against a dynamic
    # shape: the mask is expanded to x's shape first (about a quarter more on ONNX Runtime),
    # after the Unsqueeze to full rank, since onnx2tf's flatbuffer_direct turns an Expand
    # that adds axes into a Reshape to a guessed size that LiteRT rejects. (Measured: its
    # older tf_converter backend then transposes the target shape, and TVM refuses a Tile
    # by repeats read from the shape, so neither of those is a way out.)
    return b.Expand(drop, shape, hint="drop_full")


def _zero_where(b: Builder, x: Value, drop: Value, elem_type: int, out: str) -> None:
    """out = 0 where drop, else x, with an op ONNX Runtime has a kernel for.

    x goes in Where's *else* branch: ONNX Runtime 1.32's Where turns a -0.0 taken from its
    then-branch into +0.0 (measured), and torch keeps the sign of the kept elements."""
    if elem_type in _WHERE_TYPES:
        b.Where(drop, np.zeros((), numpy_dtype(elem_type)), x, hint="masked", out=out)
    elif elem_type == TensorProto.BOOL:
        b.And(x, b.Not(drop, hint="keep"), hint="masked", out=out)
    elif elem_type == TensorProto.UINT64:
        b.Mul(x, b.Cast(b.Not(drop, hint="keep"), np.uint64, hint="keep_u64"), hint="masked",
              out=out)
    else:  # int16/uint16 through int32, bfloat16 through float32: both exact both ways
        wide = np.int32 if elem_type in _VIA_INT32 else np.float32
        widened = b.Cast(x, wide, hint="widened")
        masked = b.Where(drop, np.zeros((), wide), widened, hint="masked_wide")
        b.Cast(masked, elem_type, hint="masked", out=out)


def _type_name(elem_type: int | None) -> str:
    return "unknown" if elem_type is None else TensorProto.DataType.Name(elem_type).lower()


def triangle_reference(x: np.ndarray, diagonal: int, upper: bool) -> np.ndarray:
    """numpy reference of torch.tril/triu on the last two axes (independent of the build)."""
    x = np.asarray(x)
    keep_lower = np.tril(np.ones(x.shape[-2:], dtype=bool), int(diagonal)) if not upper \
        else np.triu(np.ones(x.shape[-2:], dtype=bool), int(diagonal))
    return np.where(keep_lower, x, np.zeros((), x.dtype)).astype(x.dtype)


def _triangle(upper: bool) -> Any:
    """The torch spellings name the triangle by op: ``upper`` is fixed."""
    return lambda args: {**args, "upper": upper}


def _torch_forms(op_type: str, aten: str, upper: bool) -> tuple[Form, Form]:
    """``Tril``/``Triu(x; diagonal)`` natively, ``tril``/``triu(x, diagonal)`` from torch
    (the diagonal a constant or a run-time integer scalar)."""
    return (Form(op_type, inputs=(In("x"),), convert=_triangle(upper), attributes={
                "diagonal": Attr("int", default=0, doc="0 = main diagonal, > 0 above it")}),
            Form(aten=aten, inputs=(In("x"), In("k")), convert=_triangle(upper)))


class Tril(_TriangleBase):
    op_type = "Tril"
    forms = _torch_forms("Tril", "tril", upper=False)
    examples = (
        Example((("x", F, ("N", "H", "W")),), attrs={"diagonal": 1}, aten=("x", i64(1))),
        Example((("x", F, ("H", "W")), ("d", I64, ())), domains=(), aten=("x", "d")),
    )


class Triu(_TriangleBase):
    op_type = "Triu"
    forms = _torch_forms("Triu", "triu", upper=True)
    examples = (
        Example(
            (("x", I32, ("N", 4, "W")),),
            attrs={"diagonal": -1},
            domains=(("custom.ops", 14),),
            aten=("x", i64(-1)),
            aten_opset=11,
        ),
    )


class Trilu(_TriangleBase):
    """ONNX's own spelling, for custom domains and for the default domain below opset 14."""

    op_type = "Trilu"
    forms = (Form("Trilu", inputs=(In("x"), In("k", optional=True)), attributes={
        "upper": Attr("int", default=1, choices=(0, 1),
                      doc="1 keeps the upper triangle (triu), 0 the lower (tril)")}),)
    examples = (
        Example(
            (("x", F, ("N", "H", "W")), ("k", I64, ())),
            attrs={"upper": 0},
            domains=(("custom.ops", 16), ("", 13)),
        ),
    )


PATTERNS = [Tril(), Triu(), Trilu()]
