"""cummax / cummin (torch.cummax, torch.cummin): running extreme and its index, two outputs.

Matches:
- torch's fallbacks ``org.pytorch.aten::cummax(x, dim)`` / ``cummin`` and
  ``ATen(operator="cummax" | "cummin")``, two outputs (values, indices), ``dim`` a constant
  int64 input;
- ``CumMax(x; dim:int)`` and ``CumMin(x; dim:int)`` in any domain, two outputs;
- mmcv's ``mmcv::cummax(x; dim)`` / ``mmcv::cummin`` (what mmcv's corner pooling exports
  with torch >= 1.5; its kernel is a copy of torch's), two outputs.

Semantics are exactly torch's CPU kernel: walking along ``dim``, the running value is
replaced by the current element when the current element is NaN, or when the running value
is not NaN and ``current >= running`` (cummax; ``<=`` for cummin). So on ties the index is
the LAST equal element, a NaN wins from the moment it appears and later NaNs take over its
index, and ``values == x[indices]`` bit for bit (signed zeros and NaN payloads included).
Indices are int64. Equivalently the index at i is the lexicographic arg-max over j <= i of
(is NaN, value, j) (cummin: arg-min of the value, same NaN and tie rules).

Before -> after: doubling scans (Hillis-Steele: steps s = 1, 2, 4, ... < n), each step
one shift by s and one elementwise Max (Min for cummin); a static length shifts with one Pad
(s fill elements in front, a negative pad of s at the end), a dynamic one with Slice +
Concat + Slice (see ``_Shifter.shifted``)::

    key = x in an exact key type (float32/64 and int64 as is, float16, bfloat16 and
          small ints -> float32, int32 as is from opset 12, -> float64 below), NaN -> -inf
          (cummin: +inf)
    running = scan_max(key)                                       # the running extreme
    integer inputs: indices = scan_max(key == running ? position : -1)   # ties: the later
    float inputs, one scan for the last NaN or else the last record:
        code    = IsNaN(x) ? position : key == running ? position - n : -n
        last    = scan_max(code)               # any NaN (code >= 0) beats every record
        indices = last >= 0 ? last : last + n
    values  = GatherElements(x, Cast(indices, int64))             # bit-exact

That is 2 scans (2 nodes per static step, 5 per dynamic one) and O(n log n) work, never
an (n x n) table: the (n x n) mask-and-reduce form (``scripts/bench_aten.py``, variant
``mask``) is slower from n = 4 on and O(n^2) in memory; carrying (value, index) pairs
through one scan with Greater + Where is slower too (variant ``pair_scan``). Positions scan
as float32 while exact (a static length below 2**24), else as int32 (float64 below opset
12, where Max has no int32 kernel): LiteRT has no float64 CumSum or Max. int64 keys are
compared with Greater/Less + Where (no int64 Max/Min kernel below opset 12).

Envelope: opsets 11+, the dtypes torch's cummax takes (bool, uint8, int8, int16, int32,
int64, float16, bfloat16, float32, float64), any rank >= 0 (known), any dim, every dim
dynamic. A static length n along ``dim`` gives ceil(log2 n) steps; a dynamic one gets the
31 steps of the longest supported length, 2**31 (about 340 nodes for floats, most of them
no-ops at run time for short inputs), each shift a Slice, a Concat, a Slice and a Reshape
instead of one Pad (a shift may pass the end).
Empty tensors give empty outputs, as in torch. ``dim`` must be a constant.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_shape
from decomposer.examples import I32, I64, Example, F, i64
from decomposer.forms import Attr, Const, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

MAX_RANK = 64
DYNAMIC_SCAN_BITS = 31  # a scan over a dynamic length gets the steps of length 2**31

_FLOATS = {TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE}
# The key type the running extreme is scanned in: it holds every value of the input type
# exactly, and Pad, Max/Min and Equal have ONNX Runtime kernels for it at every opset
# (int64 has no Max/Min kernel below opset 12: it is compared with Greater/Less + Where;
# float16 has few kernels, ONNX Runtime would insert float32 casts around each op anyway).
# int32 is scanned as int32 from opset 12 on (Max/Min kernels; LiteRT has no float64 ones).
_KEY_TYPE: dict[int, Any] = {
    TensorProto.FLOAT16: np.float32, TensorProto.BFLOAT16: np.float32,
    TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64,
    TensorProto.BOOL: np.float32, TensorProto.INT8: np.float32, TensorProto.UINT8: np.float32,
    TensorProto.INT16: np.float32, TensorProto.INT32: np.float64, TensorProto.INT64: np.int64,
}


class CumFacts(NamedTuple):
    axis: int  # normalised to 0..rank-1 (0 for a scalar)
    rank: int
    length: int | None  # static length along axis, or None
    elem_type: int
    shape: tuple[int | str | None, ...]


class _CumExtreme(Pattern):
    """Shared check/build/compute of the cummax and cummin spellings (argument ``dim``)."""

    largest: bool = True  # cummax; False for cummin

    def check(self, node: MatchedNode, ctx: MatchContext) -> CumFacts:
        dim = int(node.args["dim"])
        x = node.tensor("x")
        shape = require_shape(ctx, x, "input", max_rank=MAX_RANK)
        rank = len(shape)
        if not -max(rank, 1) <= dim < max(rank, 1):
            raise Reject(f"dim {dim} is out of range for rank {rank}")
        elem_type = ctx.elem_type(x)
        if elem_type not in _KEY_TYPE:
            name = "unknown" if elem_type is None else \
                TensorProto.DataType.Name(elem_type).lower()
            raise Reject(f"element type {name} is not supported (torch's cummax/cummin take "
                         "bool, int8/16/32/64, uint8, float16, bfloat16, float32, float64)")
        if elem_type == TensorProto.BFLOAT16 and ctx.opset < 13:
            raise Reject(f"bfloat16 needs opset 13 or newer (Cast has no bfloat16 at opset "
                         f"{ctx.opset})")
        axis = dim % rank if rank else 0
        length: int | None = 1  # a scalar is a length-1 scan
        if rank:
            static = shape[axis]
            length = static if isinstance(static, int) else None
        if length is not None and length >= 2**31:
            raise Reject(f"a scan of {length} elements: positions are int32, so the scanned "
                         f"dim must be below 2**31")
        return CumFacts(axis, rank, length, elem_type, tuple(shape))

    def build(self, b: Builder, node: MatchedNode, facts: CumFacts) -> None:
        x = b.input(node.tensor("x"), facts.elem_type)
        values_out, indices_out = node.outputs
        if facts.length is not None and facts.length <= 1:  # x itself, index 0
            if values_out:
                b.Identity(x, hint="values", out=values_out)
            if indices_out:
                b.ConstantOfShape(b.Shape(x), 0, np.int64, hint="indices", out=indices_out)
            return
        index = self._index(b, x, facts, indices_out or None)
        if values_out:
            # Gathered, not scanned: bit-exact (ONNX Runtime's Where would turn a -0.0 taken
            # from its then-branch into +0.0).
            b.GatherElements(x, index, facts.axis, hint="values", out=values_out)

    def _index(self, b: Builder, x: Value, facts: CumFacts, out: str | None) -> Value:
        """The int64 indices: the last record (or, for floats, the last NaN) at or before
        each position."""
        n = facts.length
        key_type = _KEY_TYPE[facts.elem_type]
        if facts.elem_type == TensorProto.INT32 and b.opset >= 12:
            key_type = np.int32
        key = x if key_type == x.dtype else b.Cast(x, key_type, hint="key")
        largest = self.largest
        if key_type == np.int32 and not largest and n is not None:
            # OpenVINO 2026.4 reads an int32 Pad fill through float32: INT32_MAX came out as
            # INT32_MIN (measured: wrong results). -1 - x reverses the order without
            # overflow, so a running max of it with the fill INT32_MIN (exact) is the min.
            key = b.Sub(np.int32(-1), key, hint="key_reversed")
            largest = True
        beyond = _beyond(key_type, largest)  # beats nothing: the fill of every shift
        position_type = _position_type(n, b.opset)
        positions = _positions(b, x, facts, position_type)
        shifter = _Shifter(b, x, facts)
        if facts.elem_type not in _FLOATS:
            running = shifter.scan(key, largest, beyond, "running", positions)
            # A record is where the running extreme equals the element (ties included: the
            # later one wins); the index at i is the last record at or before i.
            record = b.Where(b.Equal(key, running, hint="is_record"), positions,
                             position_type(-1), hint="record_at")
            index = shifter.scan(record, True, position_type(-1), "last_record", positions)
            return b.Cast(index, np.int64, hint="indices", out=out)
        # NaN takes over whenever it appears, so NaNs stay out of the running extreme (a NaN
        # key becomes the fill, which beats nothing) and one scan finds the last NaN or, if
        # there is none yet, the last record: it keeps the largest code, position - n for a
        # record (negative), the position itself for a NaN (never negative). Any other
        # position gets -n, position 0's code as a record: that changes nothing (position 0
        # is a record or a NaN) and keeps the index in range should an engine miss every
        # record (TVM 0.27 with dynamic rank-3 shapes computed Max(-inf, -inf) as -FLT_MAX).
        is_nan = b.IsNaN(x, hint="is_nan")
        key = b.Where(is_nan, beyond, key, hint="key_without_nan")
        running = shifter.scan(key, largest, beyond, "running", positions)
        length: Any
        lowest: Any
        if n is None:
            # Cast: TVM's importer does no arithmetic on a Shape's output as such.
            length = b.Cast(b.Shape(x, facts.axis, facts.axis + 1, hint="length"),
                            position_type, hint="length_cast")
            lowest = b.Neg(length, hint="lowest_code")
        else:
            length, lowest = position_type(n), position_type(-n)
        if n is not None and n <= _MAX_CONSTANT_POSITIONS:
            from_end = b.const(np.arange(-n, 0, dtype=position_type).reshape(
                [n if a == facts.axis else 1 for a in range(facts.rank)]), hint="from_end")
        else:
            from_end = b.Sub(positions, length, hint="from_end")
            if n is None:
                # -length at every position, not a (1,) tensor: onnx2tf's flatbuffer_direct
                # lowers Where to LiteRT's SELECT, which refuses an operand of lower rank.
                lowest = b.Sub(from_end, positions, hint="lowest_code_full")
        code = b.Where(b.Equal(key, running, hint="is_record"), from_end, lowest,
                       hint="record_code")
        code = b.Where(is_nan, positions, code, hint="code")
        last = shifter.scan(code, True, _beyond(position_type, True), "last", positions)
        index = b.Where(b.Less(last, position_type(0), hint="is_record_code"),
                        b.Add(last, length, hint="record_at"), last, hint="index")
        return b.Cast(index, np.int64, hint="indices", out=out)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: CumFacts
                     ) -> list[OutputType]:
        return [(facts.elem_type, facts.shape), (TensorProto.INT64, facts.shape)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        return list(cumulative_extreme_reference(x, int(args["dim"]), self.largest))


def _beyond(key_type: Any, largest: bool) -> Any:
    """The key value no element beats: the lowest for cummax, the highest for cummin."""
    dtype = np.dtype(key_type)
    if dtype.kind == "f":
        return dtype.type(-np.inf if largest else np.inf)
    info = np.iinfo(dtype)
    return dtype.type(info.min if largest else info.max)


def _doublings(n: int | None) -> list[int]:
    """1, 2, 4, ... below n: the shifts of a doubling (Hillis-Steele) scan of length n. A
    dynamic length gets the shifts of the longest one supported; the shifts past the actual
    length change nothing."""
    longest = 2**DYNAMIC_SCAN_BITS if n is None else n
    return [1 << k for k in range(max(longest - 1, 0).bit_length())]


class _Shifter:
    """Doubling (Hillis-Steele) scans along the axis, sharing what their shifts need."""

    def __init__(self, b: Builder, x: Value, facts: CumFacts) -> None:
        self.b, self.x, self.facts = b, x, facts
        self.shifts = _doublings(facts.length)
        self._length: Value | None = None
        self._shape: Value | None = None

    def scan(self, t: Value, largest: bool, fill: Any, hint: str, positions: Value) -> Value:
        """Inclusive running max (or min) of t along the axis: per step s one shift by s
        and one elementwise Max/Min."""
        b = self.b
        for shift in self.shifts:
            if t.dtype == np.int64:
                # No int64 Max/Min kernel below opset 12: Greater/Less + Where. A static
                # length's shifted-in elements are masked out rather than filled with
                # INT64_MIN/MAX, which OpenVINO 2026.4 wraps to int32 in Pad (measured:
                # wrong results); a dynamic length shifts in no fill (see ``shifted``).
                earlier = self.shifted(t, shift, np.int64(0), f"{hint}_earlier{shift}")
                beats = (b.Greater(earlier, t, hint=f"{hint}_beats{shift}") if largest
                         else b.Less(earlier, t, hint=f"{hint}_beats{shift}"))
                if self.facts.length is not None:
                    assert positions.dtype is not None
                    beats = b.And(beats, b.Greater(positions, positions.dtype.type(shift - 1),
                                                   hint=f"{hint}_has_earlier{shift}"),
                                  hint=f"{hint}_takes{shift}")
                t = b.Where(beats, earlier, t, hint=f"{hint}{shift}")
            else:
                earlier = self.shifted(t, shift, fill, f"{hint}_earlier{shift}")
                t = (b.Max if largest else b.Min)(t, earlier, hint=f"{hint}{shift}")
        return t

    def shifted(self, t: Value, shift: int, fill: Any, hint: str) -> Value:
        """t moved ``shift`` places later along the axis.

        A static length (shift < n) is one Pad: ``shift`` fill elements in front, a negative
        pad of ``shift`` at the end. A dynamic length may be shorter than the shift, and a
        Pad cannot follow it: a negative pad larger than the dim crashes OpenVINO 2026.4
        (memory corruption, measured), a positive one as large as 2**30 would allocate that
        much, and TVM cannot Pad by a run-time amount. There the scans' idempotence helps
        (Max/Min of an element with itself changes nothing): position i may take any element
        j in [i - shift, i], so the shift is ``Concat(t[:shift], t)[:n]``, t's own first
        elements standing in for the fill. No Slice there can come out empty: onnx2tf's
        ``tf_converter`` reads a Slice end that comes to 0 as "to the end" (the former
        ``Concat(fill[:shift], t[:-shift])`` came out twice as long once shift >= n). The
        end n is run-time, so a Reshape to t's shape (free on ONNX Runtime) tells TVM the
        length (its VM cannot Concat or Max tensors of unknown shape)."""
        b, axis, rank = self.b, self.facts.axis, self.facts.rank
        if self.facts.length is not None:
            pads = [0] * (2 * rank)
            pads[axis], pads[rank + axis] = shift, -shift
            return b.Pad(t, pads, fill, hint=hint)
        if self._length is None or self._shape is None:
            self._length = b.Shape(self.x, axis, axis + 1, hint="scan_length")
            self._shape = b.Shape(self.x, hint="x_shape")
        front = b.Slice(t, [0], [shift], [axis], hint=f"{hint}_front")
        joined = b.Concat(front, t, axis=axis, hint=f"{hint}_joined")
        cut = b.Slice(joined, [0], self._length, [axis], hint=f"{hint}_cut")
        return b.Reshape(cut, self._shape, hint=hint)


def _position_type(n: int | None, opset: int) -> Any:
    """The type positions are scanned in: float32 while exact (static n below 2**24), else
    int32 (every position of the longest supported length, 2**31, fits; LiteRT has no
    float64 CumSum or Max) where Max has an int32 kernel (opset 12), else float64."""
    if n is not None and n < 2**24:
        return np.float32
    return np.int32 if opset >= 12 else np.float64


_MAX_CONSTANT_POSITIONS = 2**16


def _positions(b: Builder, x: Value, facts: CumFacts, dtype: Any) -> Value:
    """0, 1, ..., n-1 along the scanned axis, in ``dtype``: unit dims elsewhere for a
    static length, x's shape for a dynamic one."""
    axis, rank, n = facts.axis, facts.rank, facts.length
    # A static length's positions are a constant, but only while that constant is small:
    # a length of 2**30 would bake gigabytes into the model.
    if n is not None and n <= _MAX_CONSTANT_POSITIONS:
        return b.const(np.arange(n, dtype=dtype).reshape(
            [n if a == axis else 1 for a in range(rank)]), hint="positions")
    # Counted along the axis over x's own shape rather than a Range of the length: TVM
    # (Relax, 0.27) loses the shape of a Range with a run-time limit, and then cannot Pad.
    ones = b.ConstantOfShape(b.Shape(x, hint="x_shape"), 1, dtype, hint="ones")
    return b.CumSum(ones, axis, exclusive=True, hint="positions")


def cumulative_extreme_reference(x: np.ndarray, dim: int, largest: bool
                                 ) -> tuple[np.ndarray, np.ndarray]:
    """numpy reference: torch's sequential loop, written out (independent of the build)."""
    x = np.asarray(x)
    if x.ndim == 0:
        return x.copy(), np.zeros((), np.int64)
    moved = np.moveaxis(x, dim, -1)
    values = np.empty_like(moved)
    indices = np.empty(moved.shape, np.int64)
    is_float = np.issubdtype(x.dtype, np.floating)
    for row in np.ndindex(*moved.shape[:-1]):
        line = moved[row]
        if not line.size:
            continue
        best, best_index = line[0], 0
        for i, current in enumerate(line):
            current_nan = bool(is_float and np.isnan(current))
            best_nan = bool(is_float and np.isnan(best))
            if current_nan or (not best_nan and (current >= best if largest
                                                 else current <= best)):
                best, best_index = current, i
            values[row + (i,)] = best
            indices[row + (i,)] = best_index
    return np.moveaxis(values, -1, dim), np.moveaxis(indices, -1, dim)


def _cumulative_forms(op_type: str, aten: str) -> tuple[Form, Form, Form]:
    """``CumMax``/``CumMin(x; dim)`` natively; torch's ``cummax``/``cummin(self, dim)``;
    mmcv's ``mmcv::cummax``/``cummin(x; dim)`` (``mmcv/onnx/symbolic.py``, written for
    torch >= 1.5 corner pooling; its ONNX Runtime kernel, ``reduce_ops.cpp``, is torch's
    ``cummax_helper``). Two outputs: values and int64 indices."""
    dim = {"dim": Attr("int", doc="the axis to scan, negative counts from the end")}
    return (Form(op_type, inputs=(In("x"),), outputs=2, attributes=dim),
            Form(aten=aten, inputs=(In("x"), Const("dim", "int", why="it picks the axis")),
                 outputs=2),
            Form(aten, domains=frozenset({"mmcv"}), inputs=(In("x"),), outputs=2,
                 attributes=dim, label=f"{aten} (mmcv)"))


class CumMax(_CumExtreme):
    op_type = "CumMax"
    forms = _cumulative_forms("CumMax", "cummax")
    largest = True
    examples = (
        Example((("x", F, ("N", 5)),), ((F, 2), (I64, 2)), attrs={"dim": 1}, aten=("x", i64(1))),
        Example((("x", F, ("N", 2, 5, 6)),), ((F, 4), (I64, 4)), attrs={"dim": 2},
                domains=(("mmcv", 13),), op_type="cummax"),
    )


class CumMin(_CumExtreme):
    op_type = "CumMin"
    forms = _cumulative_forms("CumMin", "cummin")
    largest = False
    examples = (
        Example(
            (("x", I32, (3, "L")),),
            ((I32, 2), (I64, 2)),
            attrs={"dim": -1},
            domains=(("custom.ops", 11),),
            aten=("x", i64(-1)),
        ),
        Example((("x", F, ("N", 5)),), ((F, 2), (I64, 2)), attrs={"dim": 1},
                domains=(("mmcv", 13),), op_type="cummin"),
    )


PATTERNS = [CumMax(), CumMin()]
