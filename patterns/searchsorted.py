"""searchsorted (torch.searchsorted): insertion indices, by torch's own binary search.

Matches:
- torch's fallbacks ``org.pytorch.aten::searchsorted(sorted_sequence, values, out_int32,
  right, side, sorter)`` and ``ATen(operator="searchsorted")``, both overloads (``values`` a
  tensor, or a Python number, which the exporter writes as a 0-d Constant); ``out_int32``
  and ``right`` are constant bools, ``side`` a constant string or absent, ``sorter`` an
  int64 tensor or absent;
- ``SearchSorted(sorted_sequence, values, [sorter]; right:int=0, side:string="",
  out_int32:int=0)`` in any domain.

Semantics are exactly torch's CPU kernel, including inputs it calls undefined (a NaN tail
from torch.sort, unsorted rows): the result is what torch's binary search returns,
    lower bound (right=0, side "left"): first index where the search stops on
                                         NOT (s[mid] >= v), i.e. moves right past it
    upper bound (right=1 or side "right"): moves right on NOT (s[mid] > v)
so a NaN value gives n, values outside the range give 0 or n, ties go to the first
(left) or past the last (right) equal element. ``sorter`` reads s[sorter[mid]].
A 1-D sequence (n,) serves values of any shape (a 0-d value gives a 0-d result); an N-D
sequence (..., n) serves values (..., m) with the same leading dims. Both are compared in
torch's promoted dtype (a 0-d Constant value is a Python number: it does not widen the
sequence's dtype within its category, and an int sequence with a float number compares in
float32, torch's default dtype). Indices are int64, or int32 with out_int32.

Before -> after::

    static n <= 2**16: torch's loop as a walk down its decision tree (exact on any input)
        s = Pad(sequence[sorter], one extra element)      # a finished search reads s[n]
        at_node = Gather(s, MIDS)                         # (..., 2**K), K = n.bit_length()
        node = 1; K times:  stop = at_node[node] >= v    # (> for right)
                            node = Where(stop, 2 node, 2 node + 1)
        result = Gather(LEAF_STARTS, node)                # in the output dtype
      MIDS and LEAF_STARTS are constants from simulating torch's loop on every path
      (``search_tree``): 5 cheap ops per step on values-sized int32 tensors, O(m log n).
    static n > 2**16: the same loop tracking (start, end) per value (no tables, 8 ops/step)
    dynamic n: count the elements that send the search right, in O(m (5 (k - 1) + n / 2**16)):
        s = Pad(sequence[sorter], one element in front, the dtype's maximum behind)
        count = 2**16 * sum(s[2**16 j] < v for j = 1 .. n // 2**16 + 1)  # (<= right), a MatMul
        k = the smallest k >= 2 with k**5 > min(n, 2**16 - 1)         # at run time: 2 .. 10
        5 levels, size = k**4 .. 1:  probes = count + size * (1 .. k - 1)   # ((k - 1), m)
                                     count += size * sum(s[probes] < v)  # (<=), a MatMul
          (the first levels' probes clamped to the first sentinel, min(probe, n + 1))
        result = min(count, n), and n for a NaN value; positions in int32

The dynamic form equals torch's search exactly when the sequence is sorted with no NaN
(which torch requires); with a NaN inside a run-time-length sequence it may differ.

Envelope: opsets 11+; sequence and values uint8/int8/int16/int32/int64/float16/bfloat16/
float32/float64 (compared in the promoted type, widened to int32/float32 where ONNX
Runtime lacks a kernel or merges casts: exact); ranks must be known; every dim dynamic (the
search length n static for the exact unrolled forms; a dynamic n costs 1 + 5 (k - 1) reads
per value, k from 2 (n < 32) to 10 (n >= 59049), one more per further 2**16 elements, and
must stay below 2**31 - 10**5 - 1: MAX_DYNAMIC_LENGTH, int32 positions; batched rows are
searched in one flat row, so rows x (n + 129) must stay below that too: 8 GiB of float32).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.examples import FALSE, I32, I64, TRUE, D, Example, F, f64
from decomposer.forms import Attr, Const, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

T = TensorProto
_CATEGORY: dict[int, int] = {T.BOOL: 0, T.UINT8: 1, T.INT8: 1, T.INT16: 1, T.INT32: 1,
                             T.INT64: 1, T.FLOAT16: 2, T.BFLOAT16: 2, T.FLOAT: 2, T.DOUBLE: 2}
_INT_ORDER: list[int] = [T.INT8, T.INT16, T.INT32, T.INT64]
_BITS: dict[int, int] = {T.UINT8: 8, T.INT8: 8, T.INT16: 16, T.INT32: 32, T.INT64: 64,
                         T.FLOAT16: 16, T.BFLOAT16: 16, T.FLOAT: 32, T.DOUBLE: 64}
# The type comparisons run in, per promoted type: exact widenings to types every op used has
# an ONNX Runtime kernel for. float16 too: ONNX Runtime runs float16 comparisons by inserting
# casts to float32 and then merges Cast(float64 -> float16) -> Cast(float16 -> float32) into
# one cast, losing the float16 rounding torch compares with; an explicit widening is kept.
_COMPUTE_TYPE: dict[int, int] = {
    T.UINT8: T.INT32, T.INT8: T.INT32, T.INT16: T.INT32, T.INT32: T.INT32, T.INT64: T.INT64,
    T.FLOAT16: T.FLOAT, T.BFLOAT16: T.FLOAT, T.FLOAT: T.FLOAT, T.DOUBLE: T.DOUBLE}
MAX_RANK = 64
# Static lengths up to this walk the decision tree (constant tables of 4n int32 values);
# longer ones track (start, end) per value, which needs no tables (2 more ops per step).
TREE_MAX_LENGTH = 2**16
# Batched rows: a tree of up to this many nodes is read into a per-row table (s at every
# node: rows x nodes reads, cheap next to the values when rows are short); a deeper tree
# looks each step's mid up in the constant table and reads s there (two reads per step),
# so the cost follows the values, not the rows' length.
ROW_TABLE_MAX_NODES = 2**12
# A run-time length is searched in blocks of 2**BLOCK_STEPS: one block-boundary read per value
# (plus one per further block), then KARY_LEVELS levels of a k-ary search inside the block,
# k chosen at run time from n: the smallest k with k**KARY_LEVELS > min(n, BLOCK - 1), so a
# short row costs few reads (k = 2 up to n = 31) and a full block at most (KARY_MAX - 1) per
# level. Five levels: four cost 1.2-1.3x more at n = 16 (the per-level ops), six or seven
# 1.1-1.2x more at n = 16 and 0.7-0.9x at n = 2**16 (fewer probes per level).
BLOCK_STEPS = 16
BLOCK = 2**BLOCK_STEPS
KARY_LEVELS = 5
KARY_MAX = next(k for k in range(2, BLOCK) if k**KARY_LEVELS >= BLOCK)  # 10
# Sentinels behind each row of a batched run-time-length sequence: levels whose probes reach
# fewer than this past the row read unclamped (see _kary).
BATCH_PAD = 2**7
# The run-time-length form counts in int32: n + KARY_MAX**KARY_LEVELS must fit.
MAX_DYNAMIC_LENGTH = 2**31 - KARY_MAX**KARY_LEVELS - 2


def torch_promote_types(a: int, b: int) -> int:
    """torch.promote_types for the real dtypes (differs from numpy: int64 + float32 is
    float32, float16 + bfloat16 is float32)."""
    if a == b:
        return a
    ca, cb = _CATEGORY[a], _CATEGORY[b]
    if ca != cb:
        return a if ca > cb else b
    if ca == 2:
        if {a, b} == {T.FLOAT16, T.BFLOAT16}:
            return T.FLOAT
        return a if _BITS[a] > _BITS[b] else b
    if T.UINT8 in (a, b):  # uint8 with a signed int: a signed type holding both
        other = b if a == T.UINT8 else a
        return T.INT16 if other == T.INT8 else other
    return max(a, b, key=_INT_ORDER.index)


def comparison_type(sequence_type: int, values_type: int, values_kind: str) -> int:
    """torch.result_type of (sequence, values): ``values_kind`` is "tensor" (dimensioned),
    "zero_dim" (a 0-d tensor) or "number" (a Python scalar, a 0-d Constant in exports)."""
    if values_kind == "tensor":
        return torch_promote_types(sequence_type, values_type)
    if _CATEGORY[values_type] <= _CATEGORY[sequence_type]:
        return sequence_type
    if values_kind == "zero_dim":
        return values_type
    return T.FLOAT if _CATEGORY[values_type] == 2 else T.INT64  # torch's default dtypes


class SearchFacts(NamedTuple):
    right: bool
    out_type: int  # INT64 or INT32
    sequence_type: int
    values_type: int
    compare_type: int  # torch's promoted type
    compute_type: int  # the type the graph compares in
    sequence_rank: int
    values_shape: tuple[int | str | None, ...]
    length: int | None  # static n, or None
    sorter: str | None


class SearchSorted(Pattern):
    """Arguments: ``right``, ``out_int32`` (bool), ``side`` ("", "left" or "right"),
    ``aten_scalar`` (the ATen Scalar overload: a 0-d ``values`` is a Python number)."""

    op_type = "SearchSorted"
    forms = (
        Form("SearchSorted", inputs=(In("sequence"), In("values"), In("sorter", optional=True)),
             attributes={
                 "right": Attr("int", default=0, choices=(0, 1),
                               doc="1: upper bound (side='right')"),
                 "side": Attr("string", default="", choices=("", "left", "right"),
                              doc='"left", "right" or "" (then right decides)'),
                 "out_int32": Attr("int", default=0, choices=(0, 1), doc="1: int32 indices")}),
        # searchsorted(sorted_sequence, self, out_int32, right, side, sorter): both overloads
        Form(aten="searchsorted", convert=lambda args: {**args, "aten_scalar": True}, inputs=(
            In("sequence"), In("values"), Const("out_int32", "bool", default=False),
            Const("right", "bool", default=False),
            Const("side", "string", default="", choices=("", "left", "right"), why=(
                "torch's legacy exporter writes side= as a Constant with a string attribute, "
                "which is not valid ONNX: pass right=True instead of side='right' when "
                "exporting")),
            In("sorter", optional=True))),
    )
    examples = (
        Example(
            (("s", F, (6,)), ("v", F, ("M",))),
            ((I32, 1),),
            attrs={"side": "right", "out_int32": 1},
            aten=("s", "v", TRUE, FALSE, np.array(b"right", dtype=object), ""),
        ),
        Example(
            (("s", I64, (2, "n")), ("v", I64, (2, "M")), ("sorter", I64, (2, "n"))),
            ((I64, 2),),
            attrs={"right": 1},
            domains=(("custom.ops", 11),),
            aten=("s", "v", FALSE, TRUE, "", "sorter"),
        ),
        # The Scalar overload: values is a Python number, a 0-d Constant.
        Example(
            (("s", D, (5,)),), ((I64, 0),), domains=(), aten=("s", f64(0.5), FALSE, FALSE, "", "")
        ),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> SearchFacts:
        args = node.args
        out_int32, right, side = bool(args["out_int32"]), bool(args["right"]), args["side"]
        sorter = node.tensor("sorter") or None
        if side == "left" and right:
            raise Reject("side 'left' and right=True contradict each other (torch raises)")
        right = right or side == "right"

        sequence, values = node.tensor("sequence"), node.tensor("values")
        sequence_shape, values_shape = ctx.shape(sequence), ctx.shape(values)
        if sequence_shape is None or values_shape is None:
            raise Reject("the ranks of sorted_sequence and values must be known; give them "
                         "typed graph inputs or value_info")
        rank = len(sequence_shape)
        if rank == 0:
            raise Reject("sorted_sequence must have at least one dimension")
        if max(rank, len(values_shape)) > MAX_RANK:
            raise Reject(f"ranks above {MAX_RANK} are refused")
        if rank > 1:
            if not values_shape:
                raise Reject("a 0-d value needs a 1-D sorted_sequence (torch raises)")
            if len(values_shape) != rank:
                raise Reject(f"an N-D sorted_sequence (rank {rank}) needs values of the same "
                             f"rank, got rank {len(values_shape)}")
            for s_dim, v_dim in zip(sequence_shape[:-1], values_shape[:-1], strict=True):
                if isinstance(s_dim, int) and isinstance(v_dim, int) and s_dim != v_dim:
                    raise Reject(f"leading dims differ: sorted_sequence {sequence_shape}, "
                                 f"values {values_shape}")
        if sorter is not None:
            sorter_type = ctx.elem_type(sorter)
            if sorter_type != T.INT64:
                raise Reject(f"sorter must be int64, got {_name(sorter_type)}")
            sorter_shape = ctx.shape(sorter)
            if sorter_shape is not None and (len(sorter_shape) != rank or (any(
                        isinstance(a, int) and isinstance(c, int) and a != c
                        for a, c in zip(sorter_shape, sequence_shape, strict=False)))):
                raise Reject(f"sorter must have the shape of sorted_sequence, got "
                             f"{list(sorter_shape)} and {list(sequence_shape or [])}")

        sequence_type, values_type = ctx.elem_type(sequence), ctx.elem_type(values)
        for label, elem_type in (("sorted_sequence", sequence_type), ("values", values_type)):
            if elem_type not in _CATEGORY or (label == "sorted_sequence"
                                              and elem_type == T.BOOL):
                raise Reject(f"{label} has element type {_name(elem_type)}; supported: "
                             "uint8, int8/16/32/64, float16, bfloat16, float32, float64")
        assert sequence_type is not None and values_type is not None
        if T.BFLOAT16 in (sequence_type, values_type) and ctx.opset < 13:
            raise Reject(f"bfloat16 needs opset 13 or newer (Cast has no bfloat16 at opset "
                         f"{ctx.opset})")
        if values_shape == ():
            kind = "number" if ctx.constant(values) is not None else "zero_dim"
        else:
            kind = "tensor"
        compare_type = comparison_type(sequence_type, values_type, kind)
        last = sequence_shape[-1]
        return SearchFacts(right, T.INT32 if out_int32 else T.INT64, sequence_type,
                           values_type, compare_type, _COMPUTE_TYPE[compare_type], rank,
                           tuple(values_shape), last if isinstance(last, int) else None,
                           sorter)

    def build(self, b: Builder, node: MatchedNode, facts: SearchFacts) -> None:
        sequence = self._typed(b, node.tensor("sequence"), facts.sequence_type, facts,
                               "sequence")
        values = self._typed(b, node.tensor("values"), facts.values_type, facts, "values")
        if facts.sorter is not None:
            sorter = b.input(facts.sorter, np.int64)
            sequence = (b.Gather(sequence, sorter, axis=0, hint="sequence_sorted")
                        if facts.sequence_rank == 1 else
                        b.GatherElements(sequence, sorter, -1, hint="sequence_sorted"))
        out = node.outputs[0]
        # Per-value reads are GatherElements, which needs the values' rank to be the
        # sequence's: values of any other shape against a 1-D sequence are searched flat.
        flat = facts.sequence_rank == 1 and len(facts.values_shape) != 1
        if flat:
            values_shape = b.Shape(values, hint="values_shape")
            values = b.Reshape(values, [-1], hint="values_flat")
        found = None if flat else out
        if facts.length is None:
            result = self._build_dynamic(b, sequence, values, facts, found)
        else:
            result = self._build_search(b, sequence, values, facts, found)
        if flat:
            b.Reshape(result, values_shape, hint="result", out=out)

    @staticmethod
    def _typed(b: Builder, name: str, elem_type: int, facts: SearchFacts, hint: str) -> Value:
        """The input cast to torch's comparison type, then widened to the compute type."""
        value = b.input(name, elem_type)
        if elem_type != facts.compare_type:
            value = b.Cast(value, facts.compare_type, hint=f"{hint}_promoted")
        if facts.compare_type != facts.compute_type:
            value = b.Cast(value, facts.compute_type, hint=f"{hint}_widened")
        return value

    def _goes_left(self, b: Builder, middle: Value, values: Value, facts: SearchFacts,
                   hint: str) -> Value:
        """torch's test for ending the search at or before mid: s[mid] >= v (> for right).
        NaN on either side compares False, so the search moves right, as in torch."""
        if facts.right:
            return b.Greater(middle, values, hint=hint)
        return b.GreaterOrEqual(middle, values, hint=hint)

    def _build_search(self, b: Builder, sequence: Value, values: Value, facts: SearchFacts,
                      out: str | None) -> Value:
        n = facts.length
        assert n is not None
        batched = facts.sequence_rank > 1
        if n == 0:  # torch returns 0 everywhere
            zeros = b.ConstantOfShape(b.Shape(values), 0, np.int64, hint="empty")
            return b.Cast(zeros, facts.out_type, hint="result", out=out)
        # One element past the end: a finished search (start == end == n) still reads s[n].
        pads = [0] * (2 * facts.sequence_rank)
        pads[-1] = 1
        padded = b.Pad(sequence, pads, np.zeros((), sequence.dtype), hint="sequence_padded")
        if n <= TREE_MAX_LENGTH:
            return self._build_tree(b, padded, values, facts, out)

        def read(index: Value | int, hint: str) -> Value:
            if isinstance(index, int):  # the first step: one column, same for all values
                column = b.Gather(padded, index, axis=-1, hint=hint)
                return b.Unsqueeze(column, [facts.sequence_rank - 1],
                                   hint=f"{hint}_col") if batched else column
            return b.GatherElements(padded, index, -1, hint=hint)

        # Step 1 is the same for every value: mid = n // 2.
        mid0 = n // 2
        left = self._goes_left(b, read(mid0, "s_mid1"), values, facts, "left1")
        end = b.Where(left, np.int64(mid0), np.int64(n), hint="end1")
        start = b.Where(left, np.int64(0), np.int64(mid0 + 1), hint="start1")
        steps = n.bit_length()
        written = False
        for step in range(2, steps + 1):
            last = step == steps
            mid = start + b.Div(end - start, np.int64(2), hint=f"half{step}")
            left = self._goes_left(b, read(mid, f"s_mid{step}"), values, facts,
                                   f"left{step}")
            # A finished search (start == end) must stay put: mid + 1 only while mid < end.
            right_start = b.Where(b.Less(mid, end, hint=f"open{step}"), mid + 1, end,
                                  hint=f"next{step}")
            written = last and facts.out_type == T.INT64
            start = b.Where(left, start, right_start, hint=f"start{step}",
                            out=out if written else None)
            if not last:
                end = b.Where(left, mid, end, hint=f"end{step}")
        if facts.out_type != T.INT64:
            return b.Cast(start, facts.out_type, hint="result", out=out)
        if not written:  # n == 1: the first step was the whole search
            return b.Identity(start, hint="result", out=out)
        return start

    def _build_tree(self, b: Builder, padded: Value, values: Value, facts: SearchFacts,
                    out: str | None) -> Value:
        """torch's search as a walk down its decision tree (see ``search_tree``), with the
        children swapped so that the step is pure arithmetic: node 2i goes right, 2i + 1
        stops. Per step: read s at the node, compare, node = 2 node + stop. (GatherElements
        and Cast/Add rather than Gather and Where, which ONNX Runtime runs much slower.)"""
        n = facts.length
        assert n is not None
        depth = n.bit_length()
        mids, leaf_starts = swapped_children(*search_tree(n))
        mids = mids.astype(np.int32)
        out_dtype = np.int32 if facts.out_type == T.INT32 else np.int64
        batched = facts.sequence_rank > 1
        if not batched or mids.size <= ROW_TABLE_MAX_NODES:
            # s at every node's mid, once: (..., 2**depth).
            at_node = b.Gather(padded, mids, axis=-1, hint="s_at_node")

            def read(node: Value, hint: str) -> Value:
                return b.GatherElements(at_node, node, -1, hint=hint)
        else:
            values_shape = b.Shape(values, hint="values_shape")

            def read(node: Value, hint: str) -> Value:
                # The mid of each value's node (a 1-D constant table, read flat), then s.
                flat = b.Reshape(node, [-1], hint=f"{hint}_flat")
                mid = b.GatherElements(mids, flat, 0, hint=f"{hint}_mid")
                return b.GatherElements(padded, b.Reshape(mid, values_shape,
                                                          hint=f"{hint}_mids"), -1, hint=hint)
        # The root (node 1) is the same for every value: one column.
        root = b.Gather(padded, int(mids[1]), axis=-1, hint="s_root")
        if batched:
            root = b.Unsqueeze(root, [facts.sequence_rank - 1], hint="s_root_col")
        stop = self._goes_left(b, root, values, facts, "stop1")
        node = b.Cast(stop, np.int32, hint="stop1_int") + np.int32(2)
        for step in range(2, depth + 1):
            here = read(node, f"s_node{step}")
            stop = self._goes_left(b, here, values, facts, f"stop{step}")
            doubled = b.Add(node, node, hint=f"down{step}")
            node = b.Add(doubled, b.Cast(stop, np.int32, hint=f"stop{step}_int"),
                         hint=f"node{step}")
        # Leaves are nodes 2**depth .. 2**(depth+1) - 1; the table holds their answers.
        table = np.zeros(2 ** (depth + 1), out_dtype)
        table[2**depth:] = leaf_starts
        if batched:  # a 1-D table for (..., m) nodes
            return b.Gather(table, node, axis=0, hint="result", out=out)
        return b.GatherElements(table, node, 0, hint="result", out=out)

    def _build_dynamic(self, b: Builder, sequence: Value, values: Value, facts: SearchFacts,
                       out: str | None) -> Value:
        """A run-time length n: count the elements that send the search right (exact for a
        sorted row, as torch requires) without an (m, n) table, in two stages:
        1. blocks of BLOCK = 2**BLOCK_STEPS elements: count the blocks whose last element
           sends the search right (n // BLOCK + 1 reads per value: one unless n >= BLOCK);
        2. a k-ary search inside the block (``_kary``): KARY_LEVELS levels, k from n at run
           time, so that a short row is searched in few reads (a fixed-depth bisection
           made 17 reads per value at any n, far more than the (m x n) count at small n).
        The row is padded with one element in front (so s[i] sits at i + 1 and a count c
        reads its own index) and sentinels behind (the dtype's maximum): a read past the end
        stops the search, unless the value is NaN (or equals the maximum, for right=True),
        and then min(count, n) is the answer. A 1-D sequence gets BLOCK sentinels, batched
        rows BATCH_PAD (BLOCK per row would cost rows * BLOCK elements per run); a level
        whose probes can reach past them is clamped to the first sentinel.
        Positions are int32 (ONNX Runtime runs them ~25% faster than int64), which bounds a
        run-time length to MAX_DYNAMIC_LENGTH. Values are (..., m) against a (..., n)
        sequence: 1-D sequences get flat values."""
        rank = facts.sequence_rank
        dtype = sequence.dtype
        assert dtype is not None
        sentinel = (np.array(np.inf, dtype) if dtype.kind == "f"
                    else np.array(np.iinfo(dtype).max, dtype))
        one_d = rank == 1
        pads = [0] * (2 * rank)
        pads[rank - 1] = 1
        pads[-1] = BLOCK if one_d else BATCH_PAD
        padded = b.Pad(sequence, pads, sentinel, hint="sequence_guarded")
        # n twice: a 0-d one for Range, a (1,) one for the clamps (TVM's importer keeps a 0-d
        # size as a PrimValue, which its Min cannot take).
        sequence_shape = b.Shape(sequence, hint="sequence_shape")
        length = b.Gather(sequence_shape, rank - 1, hint="length")
        length_1d = b.Gather(sequence_shape, [rank - 1], hint="length_1d")
        length_32 = b.Cast(length_1d, np.int32, hint="length_int32")

        # Stage 1: block boundaries BLOCK, 2 BLOCK, ... (counts), the last one past the end;
        # (..., blocks, 1) against (..., 1, m), summed over the blocks by a MatMul with a row
        # of ones (ONNX Runtime's ReduceSum over a short axis is ~5x slower; float32 sums
        # are exact: the block count is below 2**24 for any n below 2**40).
        blocks = b.Div(length, np.int64(BLOCK), hint="full_blocks")
        ends = b.Range(np.int64(1), blocks + 2, np.int64(1),
                       hint="block_numbers") * np.int64(BLOCK)
        if not one_d:
            ends = b.Min(ends, length_1d + 1, hint="block_ends")
        if rank > 1:
            # Read the boundaries per row of the *values*, whose leading dims equal the
            # sequence's: TVM cannot broadcast two different symbolic dims. The row indices
            # come from zeros of the values' leading shape (a sum over nothing, even at m=0).
            lowest = (np.array(-np.inf, dtype) if dtype.kind == "f"
                      else np.array(np.iinfo(dtype).min, dtype))
            row_zeros = b.Cast(b.ReduceSum(b.Cast(b.Less(values, lowest, hint="never"),
                                                  np.float32, hint="never_float"),
                                           [rank - 1], keepdims=True, hint="row_zeros_float"),
                               np.int64, hint="row_zeros")
            ends = b.Add(row_zeros, ends, hint="block_ends_per_row")  # (..., blocks)
            block_last = b.GatherElements(padded, ends, -1, hint="block_last")
        else:
            block_last = b.Gather(padded, ends, axis=0, hint="block_last")
        # ones shaped like the boundaries (so that TVM sees the same symbolic dim), (..., 1, k)
        ones = b.Unsqueeze(b.Cast(b.Not(b.Less(block_last, block_last, hint="no_boundary"),
                                        hint="every_boundary"), np.float32, hint="ones"),
                           [rank - 1], hint="ones_row")
        block_last = b.Unsqueeze(block_last, [rank], hint="block_last_col")
        row = b.Unsqueeze(values, [rank - 1], hint="values_row")
        # Left: "moves right" is s < v, one comparison at every opset (a NaN value is
        # fixed at the end); right: "stops" is s > v, and a NaN value passes everything.
        if facts.right:
            passed = b.Not(b.Greater(block_last, row, hint="block_stop"),
                           hint="block_passed")
        else:
            passed = b.Less(block_last, row, hint="block_passed")
        passed_sum = b.MatMul(ones, b.Cast(passed, np.float32, hint="block_passed_float"),
                              hint="blocks_passed_float")  # (..., 1, m)
        count = b.Cast(b.Squeeze(passed_sum, [rank - 1], hint="blocks_passed_row"), np.int32,
                       hint="blocks_passed")
        if one_d and facts.right:  # a value >= the sentinel passed it: stay inside the pad
            count = b.Min(count, b.Cast(b.Div(length_1d, np.int64(BLOCK)), np.int32,
                                        hint="full_blocks_1d"),
                          hint="blocks_passed_inside")
        count = count * np.int32(BLOCK)

        # Stage 2: a k-ary search inside the block.
        count = self._kary(b, padded, values, facts, count, length_32,
                           length_32 + np.int32(1), None if one_d else row_zeros)
        fix_nan = not facts.right and dtype.kind == "f"
        last = facts.out_type == T.INT32 and not fix_nan
        count = b.Min(count, length_32, hint="result" if last else "count",
                      out=out if last else None)
        if fix_nan:  # a NaN value passed nothing (Less is False); torch runs it to the end
            nan_to_end = b.Cast(b.IsNaN(values, hint="nan_value"), np.int32,
                                hint="nan_value_int") * length_32
            last = facts.out_type == T.INT32
            count = b.Max(count, nan_to_end, hint="result" if last else "count_nan",
                          out=out if last else None)
        if not last:
            count = b.Cast(count, facts.out_type, hint="result", out=out)
        return count

    @staticmethod
    def _kary(b: Builder, padded: Value, values: Value, facts: SearchFacts, count: Value,
              length_32: Value, sentinel_at: Value, row_zeros: Value | None) -> Value:
        """KARY_LEVELS levels of a k-ary search with a run-time k: the smallest k >= 2 with
        k**L > min(n, BLOCK - 1). Level l (size = k**(L-1-l)) reads the k - 1 probes
        count + j * size, j = 1 .. k - 1, and moves count by size for each that passes
        (a sorted row passes a prefix of them)."""
        levels = KARY_LEVELS
        rank = facts.sequence_rank
        span = b.Add(b.Min(length_32, np.array([BLOCK - 1], np.int32), hint="span_n"),
                     np.int32(1), hint="span")  # (1,) int32: values a block search can give
        root = b.Ceil(b.Pow(b.Cast(span, np.float32, hint="span_f"),
                            np.float32(1.0 / levels), hint="span_root"), hint="k_f")
        k = b.Cast(root, np.int32, hint="k_rough")
        power = k
        for _ in range(levels - 1):
            power = b.Mul(power, k, hint="k_power")
        # Pow may round the root down past an integer: one more then.
        k = b.Add(k, b.Cast(b.Less(power, span, hint="k_short"), np.int32, hint="k_fix"),
                  hint="k_exact")
        k = b.Max(k, np.array([2], np.int32), hint="k")  # (1,): at least one probe
        probe_ids = b.Range(np.int32(1), b.Squeeze(k, [0], hint="k_0d"), np.int32(1),
                            hint="probe_ids")  # 1 .. k - 1
        offsets = b.Unsqueeze(probe_ids, [1], hint="offsets")  # (k - 1, 1)
        ones = b.Unsqueeze(b.Cast(b.Greater(probe_ids, np.int32(0), hint="every_probe"),
                                  np.float32, hint="ones_f"), [0], hint="ones")  # (1, k - 1)
        sizes: list[Value | None] = [None]  # 1, k, k**2, ... (None: 1)
        for _ in range(levels - 1):
            sizes.append(k if sizes[-1] is None else b.Mul(sizes[-1], k, hint="size"))
        sizes.reverse()
        # Everything 2-D: the values (and their counts) as one (1, M) row, the sequence as
        # one (1, L) row (batched rows one after the other; a value's probes are offset to
        # its row's start). A probe grid (k - 1, M) reads with one GatherElements on a flat
        # (1, (k - 1) M) index and comes back by Reshape to the grid's own Shape: TVM's
        # importer takes no computed reshape target, and the only dim that can be 0 (M) is
        # copied from the read's, which is 0 then too. onnx2tf mislaid the same search on
        # (rows, k - 1, m) grids (wrong numbers from tf_converter).
        flat_row = np.array([1, -1], np.int64)
        data = b.Reshape(padded, flat_row, hint="sequence_row")  # (1, L)
        values_row = b.Reshape(values, flat_row, hint="values_row")  # (1, M)
        one_d = row_zeros is None
        guard = BLOCK if one_d else BATCH_PAD
        row_start = count_rows = None
        if row_zeros is not None:
            # Batched: the count runs in flat positions (its row's start + count), and so do
            # the bounds, which saves an Add per level. Row starts from an exclusive CumSum
            # down the values' (rows, 1) zeros plus one: a Range over the row count would
            # carry a dim TVM's importer cannot match to the values'.
            row_length = b.Cast(b.Shape(padded, rank - 1, rank, hint="row_length_64"),
                                np.int32, hint="row_length")
            # (A float CumSum, exact below 2**24 rows: TensorRT lists CumSum for floats.)
            row_ids = b.Cast(b.CumSum(b.Flatten(b.Cast(row_zeros, np.float32,
                                                       hint="row_zeros_f") + np.float32(1),
                                                rank - 1, hint="row_ones"),
                                      0, exclusive=True, hint="row_ids_f"),
                             np.int32, hint="row_ids")  # (rows, 1)
            count_rows = b.Flatten(count, rank - 1, hint="count_rows")  # (rows, m)
            at_rows = b.Add(count_rows, b.Mul(row_ids, row_length, hint="row_starts"),
                            hint="count_at_rows")
            count = b.Reshape(at_rows, flat_row, hint="count_at")
            row_start = b.Sub(count, b.Reshape(count_rows, flat_row, hint="count_local"),
                              hint="row_start")  # (1, M)
            sentinel_at = b.Add(row_start, sentinel_at, hint="sentinel_at")
            if facts.right:
                length_32 = b.Add(row_start, length_32, hint="row_end")
        else:
            count = b.Reshape(count, flat_row, hint="count_row")
        for level, size in enumerate(sizes):
            steps = offsets if size is None else b.Mul(offsets, size, hint=f"steps{level}")
            unclamped = (KARY_MAX - 1) * KARY_MAX**(levels - 1 - level) < guard
            if facts.right and unclamped and level > 0 and \
                    (KARY_MAX - 1) * KARY_MAX**(levels - level) >= guard:
                # A value >= the sentinel (right) passed it: back inside the pad.
                count = b.Min(count, length_32, hint="count_inside")
            # Probes on the first axis, (k - 1, M): every broadcast repeats whole rows of
            # values (ONNX Runtime broadcasting a short inner axis, (M, k - 1), ran 10x
            # slower), and the passes are summed by a (1, k - 1) MatMul.
            at = b.Add(count, steps, hint=f"probes{level}")  # (k - 1, M)
            if not unclamped:
                at = b.Min(at, sentinel_at, hint=f"probes{level}_clamped")
            read = b.Reshape(
                b.GatherElements(data, b.Reshape(at, flat_row, hint=f"probes{level}_flat"),
                                 1, hint=f"s_probes{level}"),
                b.Shape(at, hint=f"probes{level}_shape"), hint=f"s_probes{level}_grid")
            if facts.right:
                passes = b.Not(b.Greater(read, values_row, hint=f"stops{level}"),
                               hint=f"passes{level}")
            else:
                passes = b.Less(read, values_row, hint=f"passes{level}")
            # passes . (size, ..., size): the count's move, exact in float32 (< 2**24)
            weights = ones if size is None else b.Mul(
                ones, b.Cast(size, np.float32, hint=f"size{level}_f"), hint=f"weights{level}")
            moved = b.MatMul(weights, b.Cast(passes, np.float32, hint=f"passes{level}_f"),
                             hint=f"moved{level}_f")  # (1, M)
            count = count + b.Cast(moved, np.int32, hint=f"moved{level}")
        if one_d:
            return b.Reshape(count, [-1], hint="count_flat")
        assert row_start is not None and count_rows is not None
        count = b.Sub(count, row_start, hint="count_in_row")
        # Back to (rows, m). Reshape's 0 copies the input's dim: (1, M) gives m = 0 right
        # (M = 0 then), and rows = 0 once the 1 is sliced to rows (a Slice of ends >= 1
        # keeps it); a computed (or Min-clamped) target would stop TVM's importer.
        count = b.Reshape(b.Slice(count, np.zeros(1, np.int64),
                                  b.Shape(count_rows, 0, 1, hint="rows_end"), [0],
                                  hint="count_rows_kept"),
                          b.Shape(count_rows, hint="rows_shape"), hint="count_rows_out")
        if rank == 2:
            return count
        return b.ReshapeBatchFirst(count, b.Shape(values, hint="values_shape"),
                                   facts.values_shape[:-1], hint="count_shaped")

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: SearchFacts
                     ) -> list[OutputType]:
        return [(facts.out_type, facts.values_shape)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        sequence, values = np.asarray(tensors["sequence"]), np.asarray(tensors["values"])
        number = bool(args.get("aten_scalar")) and values.ndim == 0
        return [searchsorted_reference(sequence, values,
                                       bool(args["right"]) or args["side"] == "right",
                                       bool(args["out_int32"]), tensors.get("sorter"), number)]


def search_tree(n: int) -> tuple[np.ndarray, np.ndarray]:
    """torch's binary search over n elements unrolled into a complete binary tree of depth
    ``n.bit_length()`` (the most iterations its loop makes): node 1 is the root, node 2i
    follows "stop" (s[mid] >= v, so end = mid) and 2i + 1 "go right" (start = mid + 1).
    Returns ``mids`` (position read at each node, by node number) and the final ``start``
    at each leaf (leaf number - 2**depth). A search that has finished (start == end)
    keeps reading s[start] and both of its children repeat its state, as torch stops."""
    depth = n.bit_length()
    mids = np.zeros(2**depth, np.int64)
    start, end = np.zeros(1, np.int64), np.full(1, n, np.int64)
    for level in range(depth):
        active = start < end
        mid = np.where(active, start + ((end - start) >> 1), start)
        mids[2**level:2**(level + 1)] = mid
        next_start, next_end = np.empty(2 * start.size, np.int64), np.empty(2 * start.size,
                                                                            np.int64)
        next_start[0::2], next_end[0::2] = start, np.where(active, mid, end)
        next_start[1::2], next_end[1::2] = np.where(active, mid + 1, start), end
        start, end = next_start, next_end
    return mids, start


def swapped_children(mids: np.ndarray, leaf_starts: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``search_tree``'s tables renumbered so that node 2i + 1 is the "stop" child and 2i the
    "go right" one: at each level, node k takes the place of k with every bit below the
    leading one flipped (the mirror image of the level)."""
    swapped = mids.copy()
    for level in range(1, int(np.log2(mids.size)) if mids.size > 1 else 0):
        first = 2**level
        swapped[first:2 * first] = mids[first:2 * first][::-1]
    return swapped, leaf_starts[::-1].copy()


def searchsorted_reference(sequence: np.ndarray, values: np.ndarray, right: bool,
                           out_int32: bool, sorter: np.ndarray | None = None,
                           number: bool = False) -> np.ndarray:
    """numpy reference: torch's cus_lower_bound / cus_upper_bound loop, per value."""
    sequence_type = _onnx_type(sequence.dtype)
    values_type = _onnx_type(values.dtype)
    kind = "tensor" if values.ndim else ("number" if number else "zero_dim")
    compare = _numpy(comparison_type(sequence_type, values_type, kind))
    s = sequence.astype(compare)
    v = values.astype(compare)
    if sorter is not None:
        s = np.take_along_axis(s, np.asarray(sorter, np.int64), axis=-1)
    n = s.shape[-1]
    result = np.zeros(v.shape, np.int64)
    for position in np.ndindex(*v.shape):
        row = s if s.ndim == 1 else s[position[:-1]]
        value = v[position]
        start, end = 0, n
        while start < end:
            mid = start + ((end - start) >> 1)
            stop = row[mid] > value if right else row[mid] >= value
            if not stop:
                start = mid + 1
            else:
                end = mid
        result[position] = start
    return result.astype(np.int32 if out_int32 else np.int64)


def _onnx_type(dtype: np.dtype) -> int:
    if dtype == np.dtype("bool"):
        return T.BOOL
    if dtype.name == "bfloat16":
        return T.BFLOAT16
    return {np.dtype(np.uint8): T.UINT8, np.dtype(np.int8): T.INT8, np.dtype(np.int16): T.INT16,
            np.dtype(np.int32): T.INT32, np.dtype(np.int64): T.INT64,
            np.dtype(np.float16): T.FLOAT16, np.dtype(np.float32): T.FLOAT,
            np.dtype(np.float64): T.DOUBLE}[np.dtype(dtype)]


def _numpy(elem_type: int) -> Any:
    if elem_type == T.BFLOAT16:
        import ml_dtypes  # onnx's own dependency, for its bfloat16 arrays

        return ml_dtypes.bfloat16
    types: dict[int, Any] = {T.UINT8: np.uint8, T.INT8: np.int8, T.INT16: np.int16,
                             T.INT32: np.int32, T.INT64: np.int64, T.FLOAT16: np.float16,
                             T.FLOAT: np.float32, T.DOUBLE: np.float64}
    return types[elem_type]


def _name(elem_type: int | None) -> str:
    return "unknown" if elem_type is None else T.DataType.Name(elem_type).lower()


PATTERNS = [SearchSorted()]
