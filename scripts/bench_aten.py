"""Benchmark the torch ATen-op decompositions against hand-written ONNX graphs and torch.

In: ``--ops rot90 tril cummax searchsorted`` (default: all), ``--threads 1 2``,
``--rounds N``, ``--quick`` (fewer rounds, no large cases), ``--json FILE``. Needs torch
(the test extra).
Out: one table per op on stdout, and the same numbers as JSON
(default ``bench-results/bench_aten.json``): per case and thread count, the median time of
each variant and the median of its per-round ratios to the baseline ``hand``.

Variants, all timed in one process, interleaved in a shuffled order each round:
- ``decomposer``: the ``org.pytorch.aten::<op>`` node torch's fallback export emits,
  decomposed at the case's opset, every input dim symbolic except where the case says so;
- ``decomposer_dynamic`` (cummax, searchsorted): the same with the scanned / searched
  length symbolic too, which selects the length-independent form; ``*_opset17``
  (searchsorted): at opset 17, where portable output spells ``>=`` as Or(Greater, Equal);
  ``decomposer_ort`` (rot90): decomposed with ``target="ort"``; ``decomposer_opset17``
  (tril): at opset 17 (still the mask form), and ``decomposer_opset17_ort`` with
  ``target="ort"``, where the pattern emits Trilu;
- ``hand``: the fastest equivalent I could write by hand with standard ops, built here
  with ``onnx.helper`` and static shapes (constants precomputed), independent of the
  pattern's code: the baseline. ``hand_*``: other hand-written forms (``hand_slice``: a
  Slice with step -1, fast on ONNX Runtime but not portable; ``hand_trilu``: Trilu-14;
  ``hand_mask``: an (n x n) mask-and-reduce cummax; ``hand_scan_dynamic``: the cummax pair
  scan with the length at run time (31 steps), whose ratio ``decomposer_dynamic`` reports
  under ``vs_hand_dynamic``; ``hand_count_dynamic``: searchsorted
  as (n x m) compares and a sum, n at run time; ``hand_bisect_dynamic``: a fixed-depth
  bisection with n at run time, clamped probes; searchsorted also reports
  ``vs_hand_dynamic``, the ratios to the faster of those two, the honest baseline for
  ``decomposer_dynamic``). The baselines: rot90 Gathers with constant reversed
  indices, tril a Where with a constant mask, cummax a (value, index) pair scan,
  searchsorted the textbook branchless bisection with GatherElements and arithmetic
  steps, n baked in (exact for sorted NaN-free rows only);
- ``torch_eager``: the torch op itself, same thread count.

ORT sessions use pre-made OrtValue feeds, intra-op spinning off, 1 or 2 intra-op threads.
The machine this runs on may be shared: repeated runs move single cells by 10-30%.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import decomposer  # noqa: E402

from benchlib import OrtRunner, interleaved_rounds
from benchlib import time_calls as _time

ATEN = "org.pytorch.aten"
F32 = TensorProto.FLOAT


# -- harness ----------------------------------------------------------------------------------


def measure(variants: dict[str, Callable[[], Any]], rounds: int, baseline: str = "hand"
            ) -> dict[str, Any]:
    """Interleaved rounds in a shuffled order; medians of times and of per-round ratios."""
    repeats, times, ratios = interleaved_rounds(variants, baseline, rounds, _time)
    return {"baseline": baseline, "rounds": rounds, "repeats": repeats,
            "median_ms": {n: statistics.median(v) * 1e3 for n, v in times.items()},
            "ratio_to_baseline": {n: statistics.median(v) for n, v in ratios.items()}}


def model_of(nodes, inputs, outputs, opset: int, inits=(), extra_domains=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "bench", inputs, outputs, initializer=list(inits))
    imports = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1)
                                                 for d in extra_domains)]
    return helper.make_model(graph, opset_imports=imports, ir_version=8)


def ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def info(name: str, elem_type: int, dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem_type, dims)


def aten_model(op: str, tensors: list[tuple[str, np.ndarray, list]], args: list,
               outputs: list[tuple[str, int, int]], opset: int, target: str = "portable"
               ) -> onnx.ModelProto:
    """One ``org.pytorch.aten::op`` node as torch's fallback export writes it: tensor inputs
    (name, example, dims), then constant arguments (None = absent)."""
    nodes, names = [], [name for name, _, _ in tensors]
    for index, value in enumerate(args):
        if value is None:
            names.append("")
            continue
        names.append(f"arg{index}")
        nodes.append(helper.make_node("Constant", [], [f"arg{index}"],
                                      value=numpy_helper.from_array(np.asarray(value))))
    nodes.append(helper.make_node(op, names, [o for o, _, _ in outputs], domain=ATEN,
                                  name=op))
    inputs = [info(name, helper.np_dtype_to_tensor_dtype(a.dtype), dims)
              for name, a, dims in tensors]
    outs = [info(o, t, [None] * rank) for o, t, rank in outputs]
    return decomposer.decompose(model_of(nodes, inputs, outs, opset, extra_domains=[ATEN]),
                                target=target)


def symbolic(x: np.ndarray, prefix: str, static=()) -> list:
    return [d if i in static else f"{prefix}{i}" for i, d in enumerate(x.shape)]


def check_equal(variants: dict[str, Any], expected: list[np.ndarray], label: str) -> None:
    """Every ONNX variant computes torch's answer (bit-exact) before anything is timed."""
    for name, runner in variants.items():
        if isinstance(runner, OrtRunner):
            for got, want in zip(runner.results(), expected, strict=False):
                if not np.array_equal(got, want, equal_nan=got.dtype.kind == "f"):
                    raise AssertionError(f"{label}: variant {name} differs from torch")


# -- rot90 ----------------------------------------------------------------------------------


def rot90_hand_slice(shape, k: int, dims, opset: int) -> onnx.ModelProto:
    """torch's own recipe with Slice step -1 (not portable: onnx2tf drops it)."""
    rank = len(shape)
    a, c = (d % rank for d in dims)
    perm = list(range(rank))
    perm[a], perm[c] = c, a
    nodes, inits = [], []
    flip_axes = {1: [c], 2: [a, c], 3: [a]}[k]
    inits += [ints("s", [-1] * len(flip_axes)), ints("e", [-2**63] * len(flip_axes)),
              ints("ax", flip_axes), ints("st", [-1] * len(flip_axes))]
    if k == 2:
        nodes.append(helper.make_node("Slice", ["x", "s", "e", "ax", "st"], ["y"]))
    else:
        nodes.append(helper.make_node("Slice", ["x", "s", "e", "ax", "st"], ["f"]))
        nodes.append(helper.make_node("Transpose", ["f"], ["y"], perm=perm))
    return model_of(nodes, [info("x", F32, list(shape))], [info("y", F32, [None] * rank)],
                    opset, inits)


def rot90_hand_gather(shape, k: int, dims, opset: int) -> onnx.ModelProto:
    """Portable by hand: Gather with a constant reversed index (static shapes), at the outer
    position; k = 2 flips both axes with two Gathers."""
    rank = len(shape)
    a, c = (d % rank for d in dims)
    perm = list(range(rank))
    perm[a], perm[c] = c, a
    out_shape = list(shape)
    out_shape[a], out_shape[c] = shape[c], shape[a]
    nodes, inits = [], []
    if k == 2:
        inits += [ints("ra", np.arange(shape[a])[::-1].copy()),
                  ints("rc", np.arange(shape[c])[::-1].copy())]
        nodes += [helper.make_node("Gather", ["x", "ra"], ["f"], axis=a),
                  helper.make_node("Gather", ["f", "rc"], ["y"], axis=c)]
    else:
        flipped = c if k == 1 else a  # the axis whose data is reversed
        outer = min(a, c)
        if flipped == outer:
            inits.append(ints("r", np.arange(shape[outer])[::-1].copy()))
            nodes += [helper.make_node("Gather", ["x", "r"], ["f"], axis=outer),
                      helper.make_node("Transpose", ["f"], ["y"], perm=perm)]
        else:
            inits.append(ints("r", np.arange(out_shape[outer])[::-1].copy()))
            nodes += [helper.make_node("Transpose", ["x"], ["t"], perm=perm),
                      helper.make_node("Gather", ["t", "r"], ["y"], axis=outer)]
    return model_of(nodes, [info("x", F32, list(shape))], [info("y", F32, [None] * rank)],
                    opset, inits)


ROT90_CASES = [  # (label, shape, k, dims)
    ("k=1 dims=(1,2) 8x64x56x56", (8, 64, 56, 56), 1, (1, 2)),
    ("k=3 dims=(0,2) 2x64x128x96", (2, 64, 128, 96), 3, (0, 2)),
    ("k=2 dims=(1,3) 8x64x56x56", (8, 64, 56, 56), 2, (1, 3)),
    ("k=1 dims=(2,3) 8x3x224x224", (8, 3, 224, 224), 1, (2, 3)),
]


def bench_rot90(threads: int, rounds: int, quick: bool) -> list[dict]:
    import torch

    results = []
    for label, shape, k, dims in ROT90_CASES[:2] if quick else ROT90_CASES:
        x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
        def decomposed(target: str, x=x, k=k, dims=dims, shape=shape) -> onnx.ModelProto:
            return aten_model("rot90", [("x", x, symbolic(x, "d"))], [
                np.int64(k), np.array(dims, np.int64)], [("y", F32, len(shape))], 13, target)

        variants: dict[str, Any] = {
            "decomposer": OrtRunner(decomposed("portable"), {"x": x}, threads),
            "decomposer_ort": OrtRunner(decomposed("ort"), {"x": x}, threads),
            "hand": OrtRunner(rot90_hand_gather(shape, k, dims, 13), {"x": x}, threads),
            "hand_slice": OrtRunner(rot90_hand_slice(shape, k, dims, 13), {"x": x}, threads)}
        xt = torch.from_numpy(x)
        check_equal(variants, [torch.rot90(xt, k, list(dims)).numpy()], label)
        variants["torch_eager"] = lambda xt=xt, k=k, dims=dims: torch.rot90(
            xt, k, list(dims)).contiguous()
        results.append({"op": "rot90", "case": label, "threads": threads,
                        **measure(variants, rounds)})
    return results


# -- tril / triu --------------------------------------------------------------------------------


TRIL_CASES = [  # (label, shape, diagonal, upper)
    ("tril d=1 16x256x256", (16, 256, 256), 1, False),
    ("triu d=-2 64x64x64", (64, 64, 64), -2, True),
    ("tril d=0 4x1024x1024", (4, 1024, 1024), 0, False),
]


def tril_hand_mask(shape, diagonal: int, upper: bool, opset: int) -> onnx.ModelProto:
    """Where with the (H, W) drop mask precomputed as a constant (static shapes)."""
    h, w = shape[-2:]
    keep = np.triu(np.ones((h, w), bool), diagonal) if upper else \
        np.tril(np.ones((h, w), bool), diagonal)
    nodes = [helper.make_node("Where", ["drop", "zero", "x"], ["y"])]
    inits = [const("drop", ~keep), const("zero", np.float32(0))]
    return model_of(nodes, [info("x", F32, list(shape))], [info("y", F32, [None] * 3)],
                    opset, inits)


def tril_hand_trilu(shape, diagonal: int, upper: bool) -> onnx.ModelProto:
    nodes = [helper.make_node("Trilu", ["x", "k"], ["y"], upper=int(upper))]
    return model_of(nodes, [info("x", F32, list(shape))], [info("y", F32, [None] * 3)], 17,
                    [ints("k", diagonal)])


def bench_tril(threads: int, rounds: int, quick: bool) -> list[dict]:
    import torch

    results = []
    for label, shape, diagonal, upper in TRIL_CASES[:2] if quick else TRIL_CASES:
        x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
        op = "triu" if upper else "tril"

        def decomposed(opset: int, target: str = "portable", x=x, op=op, diagonal=diagonal
                       ) -> onnx.ModelProto:
            return aten_model(op, [("x", x, symbolic(x, "d"))], [np.int64(diagonal)],
                              [("y", F32, 3)], opset, target)

        variants: dict[str, Any] = {
            "decomposer": OrtRunner(decomposed(13), {"x": x}, threads),
            "decomposer_opset17": OrtRunner(decomposed(17), {"x": x}, threads),
            "decomposer_opset17_ort": OrtRunner(decomposed(17, "ort"), {"x": x}, threads),
            "hand": OrtRunner(tril_hand_mask(shape, diagonal, upper, 13), {"x": x}, threads),
            "hand_trilu": OrtRunner(tril_hand_trilu(shape, diagonal, upper), {"x": x},
                                    threads)}
        xt = torch.from_numpy(x)
        fn = torch.triu if upper else torch.tril
        check_equal(variants, [fn(xt, diagonal).numpy()], label)
        variants["torch_eager"] = lambda fn=fn, xt=xt, diagonal=diagonal: fn(xt, diagonal)
        results.append({"op": op, "case": label, "threads": threads,
                        **measure(variants, rounds)})
    return results


# -- cummax -------------------------------------------------------------------------------------


CUMMAX_CASES = [  # (label, shape, dim)
    ("256x16 dim=1", (256, 16), 1),
    ("64x64 dim=1", (64, 64), 1),
    ("16x256 dim=1", (16, 256), 1),
    ("4096x64 dim=0", (4096, 64), 0),
    ("64x4096 dim=1", (64, 4096), 1),
]


def _pair_scan_step(v: str, i: str, s: int) -> list[onnx.NodeProto]:
    """One doubling step over (value, index) pairs v/i and their shifted copies ev{s}/ei{s}:
    take the earlier pair when it is strictly greater, or NaN over a number."""
    return [helper.make_node("Greater", [f"ev{s}", v], [f"gt{s}"]),
            helper.make_node("IsNaN", [f"ev{s}"], [f"en{s}"]),
            helper.make_node("IsNaN", [v], [f"n{s}"]),
            helper.make_node("Not", [f"n{s}"], [f"nn{s}"]),
            helper.make_node("And", [f"en{s}", f"nn{s}"], [f"nh{s}"]),
            helper.make_node("Or", [f"gt{s}", f"nh{s}"], [f"take{s}"]),
            helper.make_node("Where", [f"take{s}", f"ev{s}", v], [f"v{s}"]),
            helper.make_node("Where", [f"take{s}", f"ei{s}", i], [f"i{s}"])]


def cummax_hand_pair_scan(shape, dim: int) -> onnx.ModelProto:
    """(value, index) pairs through one doubling scan: take the earlier pair when it is
    strictly greater, or NaN over a number (torch's rule); shifts by negative Pad."""
    rank, n = len(shape), shape[dim]
    nodes, inits = [], [const("lowest", np.float32(-np.inf)), const("minus1", np.int64(-1))]
    positions = np.arange(n).reshape([n if a == dim else 1 for a in range(rank)])
    inits.append(const("i0", positions.astype(np.int64)))
    v, i = "x", "i0"
    s = 1
    while s < n:
        pads = [0] * (2 * rank)
        pads[dim], pads[rank + dim] = s, -s
        inits.append(ints(f"p{s}", pads))
        nodes += [helper.make_node("Pad", [v, f"p{s}", "lowest"], [f"ev{s}"]),
                  helper.make_node("Pad", [i, f"p{s}", "minus1"], [f"ei{s}"]),
                  *_pair_scan_step(v, i, s)]
        v, i = f"v{s}", f"i{s}"
        s *= 2
    nodes += [helper.make_node("Identity", [i], ["indices"]),
              helper.make_node("GatherElements", ["x", i], ["values"], axis=dim)]
    return model_of(nodes, [info("x", F32, list(shape))],
                    [info("values", F32, [None] * rank),
                     info("indices", TensorProto.INT64, [None] * rank)], 13, inits)


def cummax_hand_pair_scan_dynamic(shape, dim: int) -> onnx.ModelProto:
    """The pair scan with the length along ``dim`` known only at run time: without control
    flow it runs the 31 steps of the longest int32 length, each shift as
    ``Concat(t[:s], t)[:n]`` (Pad cannot shift by more than a run-time length; taking an
    element with itself changes nothing, so t's own first elements stand in for the fill)."""
    rank = len(shape)
    nodes = [helper.make_node("Shape", ["x"], ["x_shape"]),
             helper.make_node("Gather", ["x_shape", "dim_index"], ["n_1d"], axis=0),
             helper.make_node("Squeeze", ["n_1d", "zero_axis"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["range"]),
             helper.make_node("Unsqueeze", ["range", "other_axes"], ["i0"])
             if rank > 1 else helper.make_node("Identity", ["range"], ["i0"])]
    inits = [ints("dim_index", [dim]), ints("zero_axis", [0]), const("zero", np.int64(0)),
             const("one", np.int64(1)), ints("axis_list", [dim]), ints("starts", [0]),
             ints("other_axes", [a for a in range(rank) if a != dim])]
    v, i = "x", "i0"
    for bit in range(31):
        s = 1 << bit
        inits.append(ints(f"s{s}", [s]))
        for name, t in (("ev", v), ("ei", i)):
            nodes += [
                helper.make_node("Slice", [t, "starts", f"s{s}", "axis_list"],
                                 [f"{name}{s}_front"]),
                helper.make_node("Concat", [f"{name}{s}_front", t], [f"{name}{s}_joined"],
                                 axis=dim),
                helper.make_node("Slice", [f"{name}{s}_joined", "starts", "n_1d", "axis_list"],
                                 [f"{name}{s}"])]
        nodes += _pair_scan_step(v, i, s)
        v, i = f"v{s}", f"i{s}"
    nodes += [helper.make_node("Identity", [i], ["indices"]),
              helper.make_node("GatherElements", ["x", i], ["values"], axis=dim)]
    return model_of(nodes, [info("x", F32, [f"d{a}" for a in range(rank)])],
                    [info("values", F32, [None] * rank),
                     info("indices", TensorProto.INT64, [None] * rank)], 13, inits)


def cummax_hand_mask(shape, dim: int) -> onnx.ModelProto:
    """(n x n) table of x[j] for j <= i, reduced: max, then the last j holding it (NaN:
    the last NaN), the masks precomputed."""
    rank, n = len(shape), shape[dim]
    upto = np.tril(np.ones((n, n), bool))  # [i, j] = j <= i
    upto = upto.reshape([*([1] * dim), n, n, *([1] * (rank - 1 - dim))])
    j = np.arange(n).reshape([n if a == dim else 1 for a in range(rank)])
    inits = [const("upto", upto), const("lowest", np.float32(-np.inf)), const("j", j),
             const("n", np.int64(n)), const("minus1", np.int64(-1)),
             ints("axis_i", [dim]), ints("axis_j", [dim + 1])]
    nodes = [
        helper.make_node("IsNaN", ["x"], ["nan"]),
        helper.make_node("Where", ["nan", "lowest", "x"], ["key"]),
        helper.make_node("Unsqueeze", ["key", "axis_i"], ["key_rows"]),
        helper.make_node("Where", ["upto", "key_rows", "lowest"], ["table"]),
        helper.make_node("ReduceMax", ["table"], ["running"], axes=[dim + 1], keepdims=1),
        helper.make_node("Equal", ["table", "running"], ["hit"]),
        helper.make_node("Unsqueeze", ["nan", "axis_i"], ["nan_rows"]),
        helper.make_node("Or", ["hit", "nan_rows"], ["hit_or_nan"]),
        helper.make_node("And", ["hit_or_nan", "upto"], ["hit_upto"]),
        helper.make_node("Add", ["j", "n"], ["j_plus_n"]),
        helper.make_node("Where", ["nan", "j_plus_n", "j"], ["score_j"]),
        helper.make_node("Unsqueeze", ["score_j", "axis_i"], ["score_rows"]),
        helper.make_node("Where", ["hit_upto", "score_rows", "minus1"], ["scores"]),
        helper.make_node("ReduceMax", ["scores"], ["scored"], axes=[dim + 1], keepdims=0),
        helper.make_node("Mod", ["scored", "n"], ["indices"]),
        helper.make_node("GatherElements", ["x", "indices"], ["values"], axis=dim)]
    return model_of(nodes, [info("x", F32, list(shape))],
                    [info("values", F32, [None] * rank),
                     info("indices", TensorProto.INT64, [None] * rank)], 13, inits)


def bench_cummax(threads: int, rounds: int, quick: bool) -> list[dict]:
    import torch

    results = []
    for label, shape, dim in CUMMAX_CASES[:3] if quick else CUMMAX_CASES:
        rng = np.random.default_rng(0)
        x = rng.integers(-1000, 1000, shape).astype(np.float32)
        x[rng.random(shape) < 0.001] = np.nan
        outputs = [("values", F32, len(shape)), ("indices", TensorProto.INT64, len(shape))]
        variants: dict[str, Any] = {
            "decomposer": OrtRunner(aten_model("cummax", [("x", x, symbolic(x, "d", [dim]))],
                                               [np.int64(dim)], outputs, 13), {"x": x},
                                    threads),
            "decomposer_dynamic": OrtRunner(aten_model(
                "cummax", [("x", x, symbolic(x, "d"))], [np.int64(dim)], outputs, 13),
                {"x": x}, threads),
            "hand": OrtRunner(cummax_hand_pair_scan(shape, dim), {"x": x}, threads),
            "hand_scan_dynamic": OrtRunner(cummax_hand_pair_scan_dynamic(shape, dim),
                                           {"x": x}, threads)}
        if shape[dim] <= 256:
            variants["hand_mask"] = OrtRunner(cummax_hand_mask(shape, dim), {"x": x}, threads)
        xt = torch.from_numpy(x)
        values, indices = torch.cummax(xt, dim)
        check_equal(variants, [values.numpy(), indices.numpy()], label)
        variants["torch_eager"] = lambda xt=xt, dim=dim: torch.cummax(xt, dim)
        result = measure(variants, rounds)
        # decomposer_dynamic against the run-time-length hand scan, like for like
        result["vs_hand_dynamic"] = {
            "decomposer_dynamic": result["median_ms"]["decomposer_dynamic"]
            / result["median_ms"]["hand_scan_dynamic"], "hand_scan_dynamic": 1.0}
        results.append({"op": "cummax", "case": label, "threads": threads, **result})
    return results


# -- searchsorted -------------------------------------------------------------------------------


SEARCH_CASES = [  # (label, sequence shape, values shape)
    ("n=16 1-D, 100k values", (16,), (100_000,)),
    ("n=128 1-D, 100k values", (128,), (100_000,)),
    ("n=1024 1-D, 100k values", (1024,), (100_000,)),
    ("n=65536 1-D, 100k values", (65536,), (100_000,)),
    ("n=16 batched 64 rows, 1k values each", (64, 16), (64, 1000)),
    ("n=128 batched 64 rows, 1k values each", (64, 128), (64, 1000)),
    ("n=1024 batched 64 rows, 1k values each", (64, 1024), (64, 1000)),
    ("n=65536 batched 64 rows, 1k values each", (64, 65536), (64, 1000)),
]
SEARCH_QUICK = [0, 2, 5]  # --quick: n=16 and 1024 1-D, n=128 batched
# The (m x n) count is timed up to this many compares (beyond, it is hopeless: O(m n)).
COUNT_MAX_COMPARES = 2e8
# The run-time-length hand bisection has a fixed depth: it covers n < 2**DEPTH.
HAND_DYNAMIC_DEPTH = 20


def search_hand_count(sequence_shape, values_shape, dims=None) -> onnx.ModelProto:
    """Count the sequence elements below each value: (n, m) compares and a sum over n (exact
    for sorted NaN-free sequences, which is what torch requires). The fastest spelling
    measured on ONNX Runtime 1.32: n leading (a sum over a short last axis is ~5x slower),
    summed in float32 (exact below 2**24; int32/int64 sums are 1.5-3x slower). Independent
    of n: with ``dims`` (symbolic dims) it is a run-time-length form."""
    rank = len(values_shape)
    if len(sequence_shape) == 1:  # (n, 1, ...) against (1, *values_shape)
        seq_axes, val_axes, sum_axis = list(range(1, rank + 1)), [0], 0
    else:  # (..., n, 1) against (..., 1, m)
        seq_axes, val_axes, sum_axis = [rank], [rank - 1], rank - 1
    inits = [ints("seq_axes", seq_axes), ints("val_axes", val_axes),
             ints("sum_axes", [sum_axis])]
    nodes = [helper.make_node("Unsqueeze", ["s", "seq_axes"], ["s_col"]),
             helper.make_node("Unsqueeze", ["v", "val_axes"], ["v_row"]),
             helper.make_node("GreaterOrEqual", ["s_col", "v_row"], ["stop"]),
             helper.make_node("Not", ["stop"], ["below"]),
             helper.make_node("Cast", ["below"], ["below_f"], to=F32),
             helper.make_node("ReduceSum", ["below_f", "sum_axes"], ["y_f"], keepdims=0),
             helper.make_node("Cast", ["y_f"], ["y"], to=TensorProto.INT64)]
    sequence_dims, values_dims = dims or (list(sequence_shape), list(values_shape))
    return model_of(nodes, [info("s", F32, sequence_dims), info("v", F32, values_dims)],
                    [info("y", TensorProto.INT64, [None] * rank)], 13, inits)


def _bisection_steps(nodes: list, inits: list, position: str, top_level: int, dtype: Any,
                     clamp: str | None = None) -> str:
    """Append branchless lower-bound steps of 2**top_level .. 1 over ``s_pad`` and ``v``:
    pos += step unless s_pad[pos + step] >= v (the probe first clamped to ``clamp`` if
    given), positions in ``dtype``; returns the last position's name."""
    onnx_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    for level in range(top_level, -1, -1):
        step = 2**level
        inits.append(const(f"step{step}", dtype(step)))
        probe = f"moved{step}"
        nodes.append(helper.make_node("Add", [position, f"step{step}"], [probe]))
        if clamp is not None:
            nodes.append(helper.make_node("Min", [probe, clamp], [f"at{step}"]))
            probe = f"at{step}"
        nodes += [helper.make_node("GatherElements", ["s_pad", probe], [f"s{step}"], axis=-1),
                  helper.make_node("GreaterOrEqual", [f"s{step}", "v"], [f"stop{step}"]),
                  helper.make_node("Cast", [f"stop{step}"], [f"stop_i{step}"], to=onnx_type)]
        if step > 1:
            nodes += [helper.make_node("Mul", [f"stop_i{step}", f"step{step}"],
                                       [f"back{step}"]),
                      helper.make_node("Sub", [f"moved{step}", f"back{step}"], [f"pos{step}"])]
        else:
            nodes.append(helper.make_node("Sub", [f"moved{step}", f"stop_i{step}"],
                                          [f"pos{step}"]))
        position = f"pos{step}"
    return position


def search_hand_bisect_dynamic(sequence_shape, values_shape, dims,
                               depth: int = HAND_DYNAMIC_DEPTH) -> onnx.ModelProto:
    """A run-time-length lower bound by hand, no Loop/If (TVM and onnx2torch lack them): a
    fixed-depth branchless bisection covering n < 2**depth. The sequence gets one element in
    front (a count reads its own index) and one +inf behind; every probe is clamped to it
    (padding each row to 2**depth would cost more than the clamps). Per step:
    pos += step unless s[min(pos + step, n + 1)] >= v; then min(pos, n). int32 positions
    (measured faster than int64 on ONNX Runtime). Exact for sorted NaN-free sequences."""
    s_rank, rank = len(sequence_shape), len(values_shape)
    i32 = TensorProto.INT32
    pads = [0] * (2 * s_rank)
    pads[s_rank - 1] = 1
    pads[-1] = 1
    inits = [ints("pads", pads), const("inf", np.float32(np.inf)), ints("last", [s_rank - 1]),
             const("one", np.int32(1))]
    nodes = [helper.make_node("Pad", ["s", "pads", "inf"], ["s_pad"]),
             helper.make_node("Shape", ["s"], ["s_shape"]),
             helper.make_node("Gather", ["s_shape", "last"], ["n64"], axis=0),
             helper.make_node("Cast", ["n64"], ["n"], to=i32),
             helper.make_node("Add", ["n", "one"], ["guard"]),
             # positions start at 0 for every value: zeros of the values' shape
             helper.make_node("Shape", ["v"], ["v_shape"]),
             helper.make_node("ConstantOfShape", ["v_shape"], ["pos_start"],
                              value=numpy_helper.from_array(np.zeros(1, np.int32)))]
    position = _bisection_steps(nodes, inits, "pos_start", depth - 1, np.int32, clamp="guard")
    nodes += [helper.make_node("Min", [position, "n"], ["y32"]),
              helper.make_node("Cast", ["y32"], ["y"], to=TensorProto.INT64)]
    sequence_dims, values_dims = dims
    return model_of(nodes, [info("s", F32, sequence_dims), info("v", F32, values_dims)],
                    [info("y", TensorProto.INT64, [None] * rank)], 13, inits)


def search_hand_bisect(sequence_shape, values_shape) -> onnx.ModelProto:
    """The textbook branchless lower bound on a sorted sequence padded with +inf to 2**K
    (and one element in front, so a count reads its own index): K steps of
    pos += step unless s[pos + step] >= v (so a NaN value runs to the end, as in torch),
    then min(pos, n). Written with GatherElements and Cast/Mul/Sub, not Gather and Where,
    which ONNX Runtime 1.32 runs about 10x slower per element. Exact for sorted NaN-free
    sequences."""
    n, rank = sequence_shape[-1], len(values_shape)
    depth = max(n, 1).bit_length()
    pads = [0] * (2 * len(sequence_shape))
    pads[len(sequence_shape) - 1] = 1
    pads[-1] = 2**depth - n
    inits = [ints("pads", pads), const("inf", np.float32(np.inf)), const("n", np.int64(n))]
    nodes = [helper.make_node("Pad", ["s", "pads", "inf"], ["s_pad"])]
    # The first probe (s[2**(depth-1) - 1]) is one column for every value.
    first = 2 ** (depth - 1)
    inits += [ints("first", [first]), const(f"step{first}", np.int64(first))]
    nodes += [helper.make_node("Gather", ["s_pad", "first"], ["s_first"], axis=-1),
              helper.make_node("GreaterOrEqual", ["s_first", "v"], ["stop_first"]),
              helper.make_node("Cast", ["stop_first"], ["stop_first_i"], to=TensorProto.INT64),
              helper.make_node("Mul", ["stop_first_i", f"step{first}"], ["back_first"]),
              helper.make_node("Sub", [f"step{first}", "back_first"], [f"pos{first}"])]
    position = _bisection_steps(nodes, inits, f"pos{first}", depth - 2, np.int64)
    nodes.append(helper.make_node("Min", [position, "n"], ["y"]))
    return model_of(nodes, [info("s", F32, list(sequence_shape)),
                            info("v", F32, list(values_shape))],
                    [info("y", TensorProto.INT64, [None] * rank)], 13, inits)


def bench_searchsorted(threads: int, rounds: int, quick: bool) -> list[dict]:
    """Baseline ``hand``: the static-length bisection (it bakes n in). The run-time-length
    hand forms are ``hand_count_dynamic`` (when m n <= COUNT_MAX_COMPARES) and
    ``hand_bisect_dynamic``; ``vs_hand_dynamic`` is each variant's per-round ratio to the
    faster of the two in that round."""
    import torch

    results = []
    for index, (label, sequence_shape, values_shape) in enumerate(SEARCH_CASES):
        if quick and index not in SEARCH_QUICK:
            continue
        rng = np.random.default_rng(0)
        sequence = np.sort(rng.normal(size=sequence_shape), -1).astype(np.float32)
        values = rng.normal(size=values_shape).astype(np.float32)
        feeds = {"s": sequence, "v": values}
        last = len(sequence_shape) - 1
        outputs = [("y", TensorProto.INT64, len(values_shape))]
        args = [np.bool_(False), np.bool_(False), None, None]

        def decomposed(static_length: bool, opset: int = 13, sequence=sequence, values=values,
                       last=last, outputs=outputs, args=args) -> onnx.ModelProto:
            return aten_model("searchsorted", [
                ("s", sequence, symbolic(sequence, "s", [last] if static_length else [])),
                ("v", values, symbolic(values, "v"))], args, outputs, opset)

        dims = (symbolic(sequence, "s"), symbolic(values, "v"))
        variants: dict[str, Any] = {
            "decomposer": OrtRunner(decomposed(True), feeds, threads),
            "decomposer_dynamic": OrtRunner(decomposed(False), feeds, threads),
            # From opset 16 portable output spells >= as Or(Greater, Equal) (onnx2torch).
            "decomposer_opset17": OrtRunner(decomposed(True, 17), feeds, threads),
            "decomposer_dynamic_opset17": OrtRunner(decomposed(False, 17), feeds, threads),
            "hand": OrtRunner(search_hand_bisect(sequence_shape, values_shape), feeds,
                              threads),
            "hand_bisect_dynamic": OrtRunner(search_hand_bisect_dynamic(
                sequence_shape, values_shape, dims), feeds, threads)}
        dynamic_hands = ["hand_bisect_dynamic"]
        if sequence_shape[-1] * values.size <= COUNT_MAX_COMPARES:
            variants["hand_count_dynamic"] = OrtRunner(search_hand_count(
                sequence_shape, values_shape, dims), feeds, threads)
            dynamic_hands.append("hand_count_dynamic")
        st, vt = torch.from_numpy(sequence), torch.from_numpy(values)
        check_equal(variants, [torch.searchsorted(st, vt).numpy()], label)
        variants["torch_eager"] = lambda st=st, vt=vt: torch.searchsorted(st, vt)
        repeats, times, _ = interleaved_rounds(variants, "hand", rounds, _time)
        result = {"op": "searchsorted", "case": label, "threads": threads,
                  "baseline": "hand", "rounds": rounds, "repeats": repeats,
                  "median_ms": {n: statistics.median(v) * 1e3 for n, v in times.items()}}
        for key, base in (("ratio_to_baseline", ["hand"]), ("vs_hand_dynamic", dynamic_hands)):
            result[key] = {n: statistics.median(t / min(times[b][r] for b in base)
                                                for r, t in enumerate(v))
                           for n, v in times.items()}
        results.append(result)
    return results


BENCHES = {"rot90": bench_rot90, "tril": bench_tril, "cummax": bench_cummax,
           "searchsorted": bench_searchsorted}


def print_table(results: list[dict], key: str = "ratio_to_baseline") -> None:
    results = [r for r in results if key in r]
    if not results:
        return
    if key != "ratio_to_baseline":
        print(f"ratios to the faster run-time-length hand form ({key}):")
    columns: list[str] = []
    for r in results:
        columns += [c for c in r[key] if c not in columns and c != "hand"]
    width = max(19, *(len(c) + 1 for c in columns))
    print(f"{'op':<12} {'case':<38} {'thr':>3} {'hand ms':>8}  " +
          " ".join(f"{c:>{width}}" for c in columns))
    for r in results:
        cells = [f"{r[key][c]:>{width - 1}.2f}x" if c in r[key]
                 else f"{'-':>{width}}" for c in columns]
        print(f"{r['op']:<12} {r['case']:<38} {r['threads']:>3} "
              f"{r['median_ms']['hand']:>8.3f}  " + " ".join(cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="+", choices=list(BENCHES), default=list(BENCHES))
    parser.add_argument("--threads", nargs="+", type=int, default=[1])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="3 rounds, the small cases")
    parser.add_argument("--json", default="bench-results/bench_aten.json")
    args = parser.parse_args(argv)
    import torch

    rounds = 3 if args.quick else args.rounds
    results: list[dict] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for op in args.ops:
            results += BENCHES[op](threads, rounds, args.quick)
    print_table(results)
    print_table(results, "vs_hand_dynamic")
    meta = {"python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "onnxruntime": ort.__version__,
            "onnx": onnx.__version__, "torch": torch.__version__}
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
