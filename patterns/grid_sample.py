"""GridSample (torch F.grid_sample semantics) as point-sized coordinate math + GatherElements.

Matches:
- ``GridSample(X, grid; mode:string="bilinear", padding_mode:string="zeros",
  align_corners:int=0)`` in any domain, with opset 16's mode names (``bilinear``,
  ``nearest``, ``bicubic``) or opset 20's (``linear``, ``cubic``), and in the default domain
  where the model's opset does not define it (below 16: at 16+ the engine never offers it);
- torch's fallbacks ``org.pytorch.aten::grid_sampler(X, grid, mode, padding_mode,
  align_corners)`` and ``ATen(operator="grid_sampler")``, whose last three inputs are
  constants (int mode 0 bilinear / 1 nearest / 2 bicubic; int padding 0 zeros / 1 border /
  2 reflection; bool align_corners);
- OpenMMLab's ``mmcv::grid_sampler(X, grid; interpolation_mode:int=0, padding_mode:int=0,
  align_corners:int=0)`` (same integer codes), in any domain.

Semantics are exactly ``torch.nn.functional.grid_sample`` (its CPU kernels):
- X (N, C, H, W), grid (N, Ho, Wo, 2) -> (N, C, Ho, Wo); bilinear, nearest, bicubic;
- X (N, C, D, H, W), grid (N, Do, Ho, Wo, 3) -> (N, C, Do, Ho, Wo); bilinear, nearest;
- grid[..., 0] indexes W, grid[..., 1] H, grid[..., 2] D; padding zeros/border/reflection;
- the coordinate is unnormalized as torch does, ``(g + 1) * ((n - 1) / 2)`` (align_corners)
  or ``(g + 1) * (n / 2) - 0.5`` (bilinear, bicubic: ``g * s + (s - 0.5)``, within an ulp,
  which moves their results continuously); border clips it to [0, n-1]; reflection
  reflects it, then clips; nearest rounds half to even AFTER reflecting (as torch; ONNX
  Runtime's own kernel differs at exact ties); bicubic (A = -0.75) pads each of its 4x4
  taps, not the coordinate.
- NaN in the grid never crashes, and gives what torch's CPU kernels give: 2-D zeros padding
  NaN (bilinear, bicubic) or 0 (nearest); 2-D border/reflection sample coordinate 0 on that
  axis; 3-D zeros padding 0; 3-D border/reflection sample coordinate n-1 on that axis;
  bicubic is NaN for every padding. +-inf behaves like a far out-of-range coordinate.

Before -> after (2-D bilinear, zeros padding; every axis alike, T taps per axis)::

    GridSample(X, grid)  ->  gx, gy = Split(grid as (N, P, 2))       # (N, 1, 1, P) each
                             u = unnormalize(g)  (+ padding: clip / reflect + clip)
                             taps = Floor(u) + [0, 1];  w = |[1, 0] - (u - Floor(u))|
                             index = ty * W + tx;  weight = wy * wx  # (N, 2, 2, P)
                             G = GatherElements(X as (N, C, H*W), Tile(index over C))
                             Y = ReduceSum(G as (N, C, 4, P) * weight, axis 2)
                                 as (N, C, Ho, Wo)

(P = Ho*Wo, the output positions flattened.) Everything before the GatherElements is
point-sized (N x P x taps), not channel-sized, and broadcasts only over whole rows of P.
Nearest gathers one tap; bicubic 4x4 taps with its cubic weights as polynomials in the
fraction. Out-of-range taps under zeros
padding are either clipped onto a zero border padded around X (static C below
MIN_CHUNKED_CHANNELS: fewer point-sized ops) or masked (index 0, weight 0; nearest: Where on
the result). Zeros padding of NaN keeps torch's NaN/0 (see above) both ways.
Where it pays on ONNX Runtime (docs/performance.md, GridSample): a static C of 8+
is gathered in channel chunks (Slices, one GatherElements + weighted sum each, a rank-2
Concat, one Reshape) so each chunk's taps stay in cache and the index is expanded once per
chunk size; otherwise 16+ taps (bicubic) are gathered one row of taps at a time and summed.

Envelope: opsets 11+; X and grid float16/32/64 (float16 computes in float32 and rounds
once; mixed types compute in the wider one); every dim dynamic (batch, channels, input and
output spatial sizes). The spatial rank is read from X's or the grid's static rank (and must
agree with the grid's last dim when that is static). Flat indices are int32 (exact while
the input's spatial size, D*H*W + padding, is below 2**31, i.e. 8 GiB per float32 channel
image; a static size beyond that gets int64). Memory: the gathered taps and their index
take T x one chunk's output (T = 4 bilinear, 8 trilinear, 4 per bicubic row).
The output runs on ONNX Runtime, OpenVINO and TVM Relax, static or dynamic shapes: no
Slice step -1, no Conv, no contrib ops, and a Shape's output is only sliced, gathered or
cast before any arithmetic (TVM's importer cannot add to a Shape's output itself). It also
converts with onnx2torch (Clip bounds are constants: the run-time upper bound is a Min) and
with onnx2tf to LiteRT on both backends, even without onnxsim, given a static C: every shape
but the output's follows from the inputs' by ONNX shape inference (constant Reshape targets,
a constant Tile), tensors are rank k + 2 at most, constants broadcast from the right
without leading 1s, and no Split carries Constant-node sizes (Flex SplitV).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import FLOAT_TYPES, require_type
from decomposer.examples import FALSE, TRUE, Example, F, i64
from decomposer.forms import Attr, Const, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._sampling import (
    CUBIC_A,
    clamp,
    finite,
    grid_sample_reference,
    reflect,
    split_pieces,
)

MODES = ("bilinear", "nearest", "bicubic")  # torch's integer codes 0, 1, 2
PADDINGS = ("zeros", "border", "reflection")  # torch's integer codes 0, 1, 2
_MODE_ALIASES = {"linear": "bilinear", "cubic": "bicubic"}  # GridSample-20 spellings

TAP_OFFSETS = {"nearest": (0,), "bilinear": (0, 1), "bicubic": (-1, 2, 0, 1)}
# Chunking, measured on ONNX Runtime 1.32 at 1 thread (scripts/bench_grid_sample.py):
MIN_CHUNKED_CHANNELS = 8  # a static C from 8 on is gathered in channel chunks ...
CHUNK_CHANNELS = 2  # ... of at least 2 channels ...
MAX_CHUNKS = 16  # ... and at most 16 chunks; smaller C zero-pads X for zeros padding
MIN_GROUPED_TAPS = 16  # unchunked, 16+ taps (bicubic) are gathered one tap row at a time
INT32_LIMIT = 2**31 - 1  # flat indices are int32 while the spatial size fits


class Facts(NamedTuple):
    mode: str  # one of MODES
    padding: str  # one of PADDINGS
    align_corners: bool
    spatial_rank: int  # 2 or 3
    x_type: int  # ONNX element type of X (and of the output)
    grid_type: int  # ONNX element type of the grid
    compute_type: int  # FLOAT or DOUBLE: what the coordinates and the sum are computed in
    channels: int | None  # static C, or None
    wide_index: bool  # int64 flat indices (the static spatial size needs them)
    pad_input: bool  # zeros padding spelled as a zero border on the input (few channels)


def _mode_name(value: Any) -> Any:
    """A mode as written (opset 16 or 20 name, any case) -> one of MODES."""
    if isinstance(value, str):
        value = value.strip().lower()
        return _MODE_ALIASES.get(value, value)
    return value


def _lower_name(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _code(names: tuple[str, ...], what: str) -> Any:
    """torch's integer option code -> its name; an unknown code is a Reject."""
    def name_of(code: int) -> str:
        if code not in range(len(names)):
            listed = ", ".join(f"{i} ({n})" for i, n in enumerate(names))
            raise Reject(f"{what} {code} is not one of {listed}")
        return names[code]
    return name_of


_ALIGN_DOC = "1: -1 and 1 are the centers of the corner pixels"
_X_GRID = (In("x"), In("grid"))


class GridSample(Pattern):
    """``GridSample`` (opset-16/20 attribute spellings), torch's ``grid_sampler`` and
    OpenMMLab's ``mmcv::grid_sampler``: arguments ``mode``, ``padding_mode``,
    ``align_corners`` (bool)."""

    op_type = "GridSample"
    forms = (
        Form("GridSample", inputs=_X_GRID, attributes={
            "mode": Attr("string", default="bilinear", choices=MODES, normalize=_mode_name,
                         doc="bilinear|linear, nearest, bicubic|cubic"),
            "padding_mode": Attr("string", default="zeros", choices=PADDINGS,
                                 normalize=_lower_name, doc="zeros, border, reflection"),
            "align_corners": Attr("int", default=0, choices=(0, 1), normalize=int,
                                  doc=_ALIGN_DOC)}),
        Form(aten="grid_sampler", inputs=(
            *_X_GRID, Const("mode", "int", normalize=_code(MODES, "interpolation mode")),
            Const("padding_mode", "int", normalize=_code(PADDINGS, "padding mode")),
            Const("align_corners", "int", choices=(0, 1)))),
        Form("grid_sampler", label="grid_sampler (mmcv; any domain)", inputs=_X_GRID,
             attributes={
                 "interpolation_mode": Attr("int", default=0, arg="mode",
                                            normalize=_code(MODES, "interpolation mode"),
                                            doc="0 bilinear, 1 nearest, 2 bicubic"),
                 "padding_mode": Attr("int", default=0,
                                      normalize=_code(PADDINGS, "padding mode"),
                                      doc="0 zeros, 1 border, 2 reflection"),
                 "align_corners": Attr("int", default=0, choices=(0, 1), doc=_ALIGN_DOC)}),
    )
    examples = (
        Example(
            (("x", F, ("N", 3, "H", "W")), ("grid", F, ("N", "h", "w", 2))),
            attrs={"mode": "bilinear", "padding_mode": "border", "align_corners": 1},
            domains=(("custom.ops", 16), ("", 13)),
            aten=("x", "grid", i64(0), i64(1), TRUE),
        ),
        Example(
            (("x", F, ("N", 2, "D", "H", "W")), ("grid", F, ("N", "d", "h", "w", 3))),
            attrs={"mode": "nearest", "padding_mode": "reflection"},
            domains=(("custom.ops", 20),),
            aten=("x", "grid", i64(1), i64(2), FALSE),
            aten_opset=17,
        ),
        Example(
            (("x", F, ("N", 3, "H", "W")), ("grid", F, ("N", "h", "w", 2))),
            attrs={"interpolation_mode": 2, "padding_mode": 2},
            domains=(("mmcv", 11),),
            op_type="grid_sampler",
        ),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        mode, padding = node.args["mode"], node.args["padding_mode"]
        align = bool(node.args["align_corners"])
        x, grid = node.tensor("x"), node.tensor("grid")
        x_type = require_type(ctx, x, "input", FLOAT_TYPES)
        grid_type = require_type(ctx, grid, "grid", FLOAT_TYPES) if ctx.elem_type(grid) \
            else x_type
        k = _spatial_rank(x, grid, ctx)
        if k == 3 and mode == "bicubic":
            raise Reject("bicubic needs a 4-D input (torch has no 3-D bicubic)")
        compute = TensorProto.DOUBLE if TensorProto.DOUBLE in (x_type, grid_type) \
            else TensorProto.FLOAT
        x_shape = ctx.shape(x)
        channels = x_shape[1] if x_shape is not None and isinstance(x_shape[1], int) else None
        if x_shape is not None and any(isinstance(d, int) and d == 0 for d in x_shape[:2]):
            # torch samples nothing there either; an empty batch is not worth a graph.
            raise Reject(f"input '{x}' has an empty batch or channel axis {list(x_shape)}")
        if channels is not None and channels >= 2**31:
            raise Reject(f"input '{x}' has {channels} channels; at most 2**31 - 1 are supported")
        spatial = x_shape[2:] if x_shape is not None else ()
        static = [d for d in spatial if isinstance(d, int)]
        wide = len(static) == k and math.prod(static) > INT32_LIMIT
        pad_input = padding == "zeros" and channels is not None \
            and channels < MIN_CHUNKED_CHANNELS
        return Facts(mode, padding, align, k, x_type, grid_type, compute, channels, wide,
                     pad_input)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        build_grid_sample(b, node.tensor("x"), node.tensor("grid"), node.outputs[0], facts)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        k = facts.spatial_rank
        x_shape = ctx.shape(node.tensor("x"))
        grid_shape = ctx.shape(node.tensor("grid"))
        batch = x_shape[0] if x_shape else (grid_shape[0] if grid_shape else None)
        channels = x_shape[1] if x_shape else None
        spatial = list(grid_shape[1:1 + k]) if grid_shape else [None] * k
        return [(facts.x_type, [batch, channels, *spatial])]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, grid = tensors["x"], tensors["grid"]
        assert x is not None and grid is not None
        return [grid_sample_reference(x, grid, args["mode"], args["padding_mode"],
                                      bool(args["align_corners"]))]


def _spatial_rank(x: str, grid: str, ctx: MatchContext) -> int:
    """2 or 3, from X's and the grid's static ranks and the grid's last dim; must agree."""
    x_shape, grid_shape = ctx.shape(x), ctx.shape(grid)
    votes: dict[str, int] = {}
    if x_shape is not None:
        if len(x_shape) not in (4, 5):
            raise Reject(f"input '{x}' must have rank 4 (N, C, H, W) or 5 (N, C, D, H, W), "
                         f"got rank {len(x_shape)}")
        votes["input rank"] = len(x_shape) - 2
    if grid_shape is not None:
        if len(grid_shape) not in (4, 5):
            raise Reject(f"grid '{grid}' must have rank 4 (N, Ho, Wo, 2) or 5 "
                         f"(N, Do, Ho, Wo, 3), got rank {len(grid_shape)}")
        votes["grid rank"] = len(grid_shape) - 2
        last = grid_shape[-1]
        if isinstance(last, int):
            votes["grid last dim"] = last
    if "input rank" not in votes and "grid rank" not in votes:
        raise Reject("cannot tell 2-D from 3-D: the ranks of the input and the grid are both "
                     "unknown; give them typed graph inputs or value_info")
    if len(set(votes.values())) > 1:
        said = ", ".join(f"{label} says {value}-D" for label, value in votes.items())
        raise Reject(f"the grid does not match the input: {said} (the grid's last dim must "
                     f"be the input's spatial rank)")
    return next(iter(votes.values()))


# -- the decomposition --------------------------------------------------------------------


class _Axis(NamedTuple):
    """One spatial axis of the input, as the build sees it."""

    position: int  # 0 for the first spatial axis (D or H) ... k-1 for W
    taps: Value  # float tap coordinates, in range for the (maybe padded) input
    weights: Value | None  # per-tap weights, or None (nearest)
    valid: Value | None  # bool mask (nearest + zeros on an unpadded input), else None
    # Tap offsets added in the flat integer index instead (padded bilinear): ``taps`` is
    # then the lowest tap only, point-sized (N, 1, ..., 1, P), and the index is
    # ``sum(Cast(taps) * stride) + sum(offsets * stride)`` (a tiny tap-sized tensor).
    offsets: tuple[int, ...] | None = None


# Zeros padding with a padded input: one zero pixel before and two after every spatial axis,
# so that clipped taps land on zeros (see _axis).
PAD_BEFORE, PAD_AFTER = 1, 2


def build_grid_sample(b: Builder, x_name: str, grid_name: str, out: str, facts: Facts) -> None:
    """Emit the decomposition of one grid sample into ``out``."""
    k = facts.spatial_rank
    dtype = numpy_dtype(facts.compute_type)
    index_type = np.dtype(np.int64) if facts.wide_index else np.dtype(np.int32)
    x = b.input(x_name, numpy_dtype(facts.x_type))
    grid = b.input(grid_name, numpy_dtype(facts.grid_type))
    if facts.x_type != facts.compute_type:
        x = b.Cast(x, dtype, hint="x_compute")
    if facts.grid_type != facts.compute_type:
        grid = b.Cast(grid, dtype, hint="grid_compute")

    sizes_i = b.Shape(x, 2, 2 + k, hint="in_sizes")  # (k,) int64
    sizes_f = b.Cast(sizes_i, dtype, hint="in_sizes_f")
    out_sizes = b.Shape(grid, 1, 1 + k, hint="out_sizes")  # (k,): (Do,) Ho, Wo
    # Point tensors are (N, taps_0, ..., taps_{k-1}, P), P = the output positions
    # flattened: one tap axis per input axis (size 1 until that axis adds its taps). Every
    # broadcast between them is over whole rows of P, which ONNX Runtime does at full speed
    # (a small innermost axis, like the grid's own x/y axis, is 5-10x slower). Every shape
    # up to the output's is a constant or follows from the inputs' by ONNX shape inference
    # (rank k + 2 at most), so converters that need static shapes (onnx2tf; LiteRT's ranks)
    # get them; only the output is reshaped to (N, C, *out_sizes) at run time.
    # The grid's components come from one equal Split of (N, P, k): a Split with
    # Constant-node sizes becomes Flex SplitV in onnx2tf's tf_converter (LiteRT's builtin
    # interpreter cannot run it), pieces sliced off a dynamic last dim get sizes TVM's
    # importer cannot prove equal (it then cannot broadcast them against each other), and
    # a Gather along the last axis is 4x slower on ONNX Runtime.
    points = b.Reshape(grid, [0, -1, k], hint="grid_points")  # (N, P, k)
    components = b.Split(points, k, axis=2, hint="grid_xyz")  # (N, P, 1) each

    axes = []
    for position in range(k):
        component = components[k - 1 - position]  # grid[..., 0] is x, which indexes W (last)
        g = b.Reshape(component, [0] + [1] * k + [-1], hint=f"g{position}")  # (N, 1.., P)
        size = b.Gather(sizes_f, position, axis=0, hint=f"n{position}")
        axes.append(_axis(b, g, size, position, k, facts, dtype))

    if facts.pad_input:
        x = b.Pad(x, [0, 0] + [PAD_BEFORE] * k + [0, 0] + [PAD_AFTER] * k,
                  np.asarray(0, dtype), hint="x_padded")
        # Read back, not added: TVM's importer cannot do arithmetic on a Shape's output.
        sizes_i = b.Shape(x, 2, 2 + k, hint="padded_sizes")
    # Flat index into the (N, C, prod(sizes)) view (exact integer math) and the weights of
    # every tap. With tap groups, the first axis' taps are gathered group by group and
    # summed, so each group's taps stay in cache (few channels, many taps: bicubic).
    taps_per_axis = len(TAP_OFFSETS[facts.mode])
    chunks = channel_chunks(facts.channels)
    grouped = len(chunks) <= 1 and taps_per_axis ** k >= MIN_GROUPED_TAPS
    sizes_index = b.Cast(sizes_i, index_type, hint="in_sizes_index")
    strides: list[Value | None] = [None] * k
    for position in range(k - 2, -1, -1):  # W has stride 1; H: W; D: H*W
        size_i = b.Gather(sizes_index, position + 1, axis=0, hint=f"n{position + 1}_i")
        after = strides[position + 1]
        strides[position] = size_i if after is None else after * size_i
    index_terms = []
    offset_terms: list[Value | np.ndarray] = []
    for axis in axes:
        term = b.Cast(axis.taps, index_type, hint=f"tap{axis.position}_index")
        stride = strides[axis.position]
        index_terms.append(term if stride is None else term * stride)
        if axis.offsets is not None:  # (taps, 1, ..., 1) as tap_constant lays it out
            offset = np.asarray(axis.offsets, index_type).reshape(
                [len(axis.offsets)] + [1] * (k - axis.position))
            offset_terms.append(offset if stride is None else b.Mul(stride, offset))
    if offset_terms:  # the base index (point-sized) once, then every tap by one Add
        assert len(offset_terms) == k and not grouped
        base = index_terms[0]
        for term in index_terms[1:]:
            base = base + term
        offsets_all: Value | np.ndarray = offset_terms[0]
        for offset_term in offset_terms[1:]:
            offsets_all = b.Add(offset_term, offsets_all)
        index_terms = [b.Add(base, offsets_all, hint="index_taps")]
    firsts: list[tuple[Value | None, Value | None]] = [(None, None)]
    if grouped:
        first_weights = axes[0].weights
        assert first_weights is not None
        firsts = list(zip(b.Split(index_terms[0], taps_per_axis, axis=1, hint="tap_groups"),
                          b.Split(first_weights, taps_per_axis, axis=1, hint="weight_groups"),
                          strict=True))
    group_taps = taps_per_axis ** (k - 1) if grouped else taps_per_axis ** k

    valid = None
    for axis in axes:
        if axis.valid is not None:
            valid = axis.valid if valid is None else b.And(valid, axis.valid)
    if valid is not None:
        valid = b.Reshape(valid, [0, 1, -1], hint="valid")  # (N, 1, P)

    groups: list[tuple[Value, Value | None]] = []  # (index (N, 1, 1, T*P), weights or None)
    for first_index, first_weight in firsts:
        index: Value | None = first_index
        for term in index_terms[1:] if grouped else index_terms:
            index = term if index is None else index + term
        assert index is not None
        weights: Value | None = None
        if taps_per_axis > 1:
            first = first_weight if grouped else axes[0].weights
            rest = [axis.weights for axis in axes[1:] if axis.weights is not None]
            assert first is not None and len(rest) == k - 1
            if k == 2:  # torch's product order: w_y * w_x ...
                weights = first * rest[0]
            else:  # ... and (w_x * w_y) * w_z
                weights = (rest[1] * rest[0]) * first
            weights = b.Reshape(weights, [0, 1, group_taps, -1], hint="weights")  # (N,1,T,P)
        groups.append((b.Reshape(index, [0, 1, 1, -1], hint="index_flat"), weights))

    # Gather channel chunks, so that each chunk's taps stay in cache from GatherElements to
    # the weighted sum, and the index is expanded once, to one chunk's channels.
    # x as (N, C, 1, S), not (N, C, S): onnx2tf takes a rank-3+ tensor whose dims after the
    # first are all equal ((N, C, S) with S == C, e.g. 16 channels of 4x4) for channels-last
    # and moves its Slice axis (1 -> last), slicing S; the 1 keeps the dims unequal.
    x_flat = b.Reshape(x, [0, 0, 1, -1], hint="x_flat")  # (N, C, 1, S)
    pieces = split_pieces(b, x_flat, chunks, 1, "x_chunks") if len(chunks) > 1 else [x_flat]
    cast = facts.compute_type != facts.x_type
    results = []
    for number, piece in enumerate(pieces):
        # The index is repeated over the chunk's channels (N, 1, T*P) -> (N, c, T*P): a
        # static count by a constant Tile (static shapes for onnx2tf; TVM's importer fails on
        # a constant Expand shape against symbolic dims), a dynamic one by an Expand to the
        # count read from the chunk's shape.
        expand_shape = None if chunks else b.Concat(
            b.ints([1]), b.Shape(piece, 1, 2), b.ints([1, 1]), axis=0, hint="expand_shape")
        parts = []
        for group_index, group_weights in groups:
            if expand_shape is None:
                expanded = b.Tile(group_index, [1, chunks[number], 1, 1], hint="index")
            else:
                expanded = b.Expand(group_index, expand_shape, hint="index")
            gathered = b.GatherElements(piece, expanded, axis=3, hint="taps")  # (N,c,1,T*P)
            if group_weights is None:
                gathered = b.Reshape(gathered, [0, 0, -1], hint="taps_flat")
            else:  # (N, c, T, P) weighted, summed over T
                gathered = b.Reshape(gathered, [0, 0, group_taps, -1], hint="taps_by_tap")
                gathered = b.ReduceSum(gathered * group_weights, [2], keepdims=False,
                                       hint="sampled")
            parts.append(gathered)  # (N, c, P)
        sampled = parts[0]
        for part in parts[1:]:
            sampled = b.Add(sampled, part, hint="sampled_sum")
        if valid is not None:
            sampled = b.Where(valid, sampled, np.asarray(0, dtype), hint="sampled_zeros")
        if cast:
            sampled = b.Cast(sampled, facts.x_type, hint="sampled_cast")
        results.append(sampled)
    # (N, c, P) chunks -> (N, C, *out_sizes): the only run-time shapes. The chunks are
    # joined flat, (N, c*P) on axis 1, then reshaped once: onnx2tf takes a rank-3..5 Concat
    # axis for channels-last and moves it (1 -> last) even after a Reshape that kept the
    # ONNX layout, and only repairs that when the result's dims differ as a set (a 4-D
    # (N, c, Ho, Wo) Concat with N == Wo came out (N, c, Ho, C)); a rank-2 axis is kept.
    out_shape = b.Concat(b.Shape(x, 0, 2), out_sizes, axis=0, hint="out_shape")
    if len(results) == 1:
        b.Reshape(results[0], out_shape, hint="sampled", out=out)
    else:
        b.Reshape(b.Concat(*[b.Reshape(r, [0, -1], hint="sampled_chunk") for r in results],
                           axis=1, hint="sampled_all"), out_shape, hint="sampled", out=out)


def channel_chunks(channels: int | None) -> list[int]:
    """Channel counts of the gather chunks: [] (one chunk, C read at run time) when C is not
    static, [C] below MIN_CHUNKED_CHANNELS, else at most MAX_CHUNKS chunks of at least
    CHUNK_CHANNELS channels."""
    if channels is None:
        return []
    if channels < MIN_CHUNKED_CHANNELS:
        return [channels]
    count = min(MAX_CHUNKS, -(-channels // CHUNK_CHANNELS))
    size = -(-channels // count)
    count = -(-channels // size)
    return [size] * (count - 1) + [channels - size * (count - 1)]


def _axis(b: Builder, g: Value, n: Value, position: int, k: int, facts: Facts,
          dtype: np.dtype) -> _Axis:
    """Tap coordinates and weights of one axis from its normalized grid coordinate ``g``.

    Zeros padding has two spellings. With ``facts.pad_input`` (few static channels) the
    input gets a zero border (PAD_BEFORE/PAD_AFTER) and taps are clipped onto it: a few
    point-sized ops. Otherwise every tap gets a validity mask (zero weight, index 0),
    which costs more point-sized ops but no input-sized copy.
    """
    zero, one, half = (np.asarray(v, dtype) for v in (0, 1, 0.5))
    top = n - one  # n - 1, the last valid coordinate
    # What a NaN coordinate becomes under border/reflection padding: torch's 2-D kernel
    # clamps NaN to 0, its 3-D kernel to n - 1.
    nan_to = zero if k == 2 else top
    padded = facts.padding == "zeros" and facts.pad_input
    padded_top = n + np.asarray(PAD_BEFORE, dtype)  # the last zero before PAD_AFTER's 2nd

    def tap_constant(values: Any) -> np.ndarray:
        # (taps, 1, ..., 1): broadcast from the right onto this axis' tap axis of the point
        # tensors (N, taps_0, ..., taps_{k-1}, P). No leading 1s: onnx2tf's tf_converter
        # moves axis 1 of a rank-3-5 constant last, which leaves this shape as it is.
        return np.asarray(values, dtype).reshape([len(values)] + [1] * (k - position))

    padded_linear = padded and facts.mode == "bilinear"
    # torch's unnormalization: nearest in torch's operation order (its ties depend on it);
    # bilinear and bicubic as g * scale + (scale - shift), one point-sized op fewer, with
    # padded bilinear's shift onto the border folded in (u moves by an ulp at most, which
    # moves their results continuously).
    scale = top * half if facts.align_corners else n * half
    if facts.mode != "nearest":
        shift = (zero if facts.align_corners else half) - (
            np.asarray(PAD_BEFORE, dtype) if padded_linear else zero)
        u = g * scale + (scale - shift)
    elif facts.align_corners:
        u = (g + one) * scale
    else:
        u = (g + one) * scale - half

    if facts.mode == "bicubic":
        # torch pads every tap, not the coordinate.
        floor = b.Floor(u, hint=f"floor{position}")
        t = u - floor  # NaN stays NaN: torch's bicubic is NaN for a NaN coordinate
        offsets = TAP_OFFSETS["bicubic"]
        # The cubic convolution weights of the 4 taps as polynomials in t (Horner, one
        # chain over all taps; torch evaluates the same polynomials in another form, equal
        # to within a few ulps).
        c3, c2, c1, c0 = (tap_constant(c) for c in _cubic_coefficients(offsets))
        weights = ((t * c3 + c2) * t + c1) * t + c0
        if padded:
            shifted_offsets = [offset + PAD_BEFORE for offset in offsets]
            taps = clamp(b, finite(b, floor, -one) + tap_constant(shifted_offsets), zero,
                          padded_top, hint=f"taps{position}")
            return _Axis(position, taps, weights, None)
        if facts.padding == "border":  # NaN replaced once per point, not per tap (the
            # weights stay NaN); +-inf is clipped
            taps = finite(b, floor, zero) + tap_constant(offsets)
            return _Axis(position, clamp(b, taps, zero, top, hint=f"taps{position}"),
                         weights, None)
        taps = floor + tap_constant(offsets)
        if facts.padding == "zeros":
            return _masked_taps(b, taps, weights, top, position, k)
        taps = reflect(b, taps, n, top, facts.align_corners, dtype)
        taps = clamp(b, finite(b, taps, zero), zero, top, hint=f"taps{position}")
        return _Axis(position, taps, weights, None)

    if facts.padding == "border":
        u = clamp(b, finite(b, u, nan_to), zero, top, hint=f"u{position}")
    elif facts.padding == "reflection":
        u = clamp(b, finite(b, reflect(b, u, n, top, facts.align_corners, dtype), nan_to),
                   zero, top, hint=f"u{position}")

    if facts.mode == "nearest":
        nearest = b.Round(u, hint=f"round{position}")  # half to even, as torch
        if facts.padding != "zeros":
            return _Axis(position, nearest, None, None)
        if padded:  # outside (and NaN) -> a zero of the border
            taps = clamp(b, finite(b, nearest, -one) + PAD_BEFORE, zero, padded_top,
                          hint=f"taps{position}")
            return _Axis(position, taps, None, None)
        valid = b.Equal(clamp(b, nearest, zero, top), nearest)  # NaN: False
        taps = b.Where(valid, nearest, zero, hint=f"taps{position}")
        return _Axis(position, taps, None, valid)

    if padded_linear:
        # u clipped to [-1, n] (in padded coordinates [0, n+1]) keeps every weight that
        # lands on a pixel; beyond, both taps read zeros. NaN reads zeros too, and its
        # weights stay NaN (torch's 2-D kernel) or not (its 3-D kernel gives 0).
        shifted = u  # already in padded coordinates
        clipped = clamp(b, finite(b, shifted, zero), zero, padded_top, hint=f"u{position}")
        floor = b.Floor(clipped, hint=f"floor{position}")
        fraction = clipped - floor
        if k == 2:
            fraction = fraction + (shifted - shifted)  # NaN (and inf) -> NaN, else + 0
        # Taps floor + [0, 1] (the upper one may be n + 2: the 2nd zero), offset in the
        # integer index.
        weights = b.Abs(b.Sub(tap_constant([1, 0]), fraction), hint=f"w{position}")
        return _Axis(position, floor, weights, None, (0, 1))
    floor = b.Floor(u, hint=f"floor{position}")
    taps = floor + tap_constant([0, 1])
    weights = b.Abs(b.Sub(tap_constant([1, 0]), u - floor), hint=f"w{position}")  # 1-f, f
    if facts.padding == "zeros":
        return _masked_taps(b, taps, weights, top, position, k)
    # u is in [0, n-1], so only the upper tap can leave the input, and only when u = n-1,
    # where its weight is 0.
    return _Axis(position, b.Min(taps, top, hint=f"taps{position}"), weights, None)


def _cubic_coefficients(offsets: Any) -> list[list[float]]:
    """[c3, c2, c1, c0] per tap offset: the weight of tap ``floor + offset`` is
    ``((c3 t + c2) t + c1) t + c0`` with t = u - floor: torch's cubic convolution
    (A = CUBIC_A) at distance |t - offset|, expanded in t."""
    a = CUBIC_A
    by_offset = {-1: [a, -2 * a, a, 0.0],  # a d^3 - 5a d^2 + 8a d - 4a at d = t + 1
                 0: [a + 2, -(a + 3), 0.0, 1.0],  # (a+2) d^3 - (a+3) d^2 + 1 at d = t
                 1: [-(a + 2), 2 * a + 3, -a, 0.0],  # the same at d = 1 - t
                 2: [-a, a, 0.0, 0.0]}  # the first at d = 2 - t
    return [[by_offset[offset][power] for offset in offsets] for power in range(4)]


def _masked_taps(b: Builder, taps: Value, weights: Value, top: Value, position: int, k: int
                 ) -> _Axis:
    """Zeros padding on an unpadded input: taps outside [0, n-1] read index 0, weight 0."""
    dtype = taps.dtype
    zero = np.asarray(0, dtype)
    valid = b.Equal(clamp(b, taps, zero, top), taps, hint=f"valid{position}")  # NaN: False
    safe = b.Where(valid, taps, zero, hint=f"taps{position}")
    if k == 2:  # torch's 2-D kernel multiplies: a NaN weight stays NaN
        weights = weights * b.Cast(valid, dtype)
    else:  # its 3-D kernel skips out-of-range taps: their NaN weight is dropped
        weights = b.Where(valid, weights, zero)
    return _Axis(position, safe, weights, None)


PATTERNS = [GridSample()]
