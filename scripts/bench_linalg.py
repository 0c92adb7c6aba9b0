"""Benchmark the linalg and attention decompositions against hand-written graphs and torch.

In: nothing required; ``--quick`` for a short run, ``--only inverse solve attention`` to pick
sections, ``--threads 1 2``, ``--rounds N``, ``--json FILE`` (default
``bench-results/bench_linalg.json``). Needs torch (the test extra).
Out: one table per section on stdout and the same numbers as JSON: per case and thread
count, the median time of each variant and the median of per-round ratios to the ``hand``
variant (lower is faster).

Variants, all timed in one process, interleaved in a random order each round:
- ``decomposer``: the custom node decomposed by decomposer (batch dims symbolic);
- ``hand``: the leanest graph of standard ops with the same result that I could write by
  hand: for n <= 4 the same batch-last adjugate form (rows for n <= 3, blocks of rows for
  n = 4) without the overflow scaling, for larger n a batch-last Gauss-Jordan elimination
  without the pivot-row select; for attention MatMul -> [mask] -> Softmax -> MatMul
  without the fully-masked-row fix;
- ``contrib``: ONNX Runtime's own ``com.microsoft::Inverse`` kernel (not a standard op,
  shown for scale); ``attention23``: the standard ``Attention`` op of opset 23;
  ``torch_export17``: torch's legacy export of F.scaled_dot_product_attention at opset 17;
- ``torch_eager``: torch.linalg.inv / torch.linalg.solve / F.scaled_dot_product_attention.

ORT sessions use pre-made OrtValue feeds, intra-op spinning off and 1 or 2 intra-op threads;
torch uses the same thread count.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import decomposer  # noqa: E402
from decomposer.patterns.linalg_inv import CLOSED_FORM_MAX_N  # noqa: E402

from benchlib import OrtRunner, interleaved_rounds
from benchlib import time_calls as _time

OPSET = 13  # below 14, where torch cannot export SDPA; the linalg ops have no export at all

INVERSE_CASES = [(2, 1), (2, 100_000), (3, 1), (3, 100_000), (4, 1), (4, 100_000),
                 (8, 1), (8, 10_000), (16, 1), (16, 1_000)]  # (n, batch)
SOLVE_CASES = [(3, 100_000, 1), (4, 10_000, 8), (8, 10_000, 1), (16, 1_000, 16)]
ATTENTION_CASES = [  # (label, (batch, heads, L, S, E), mode)
    ("plain 1x8x128x128x64", (1, 8, 128, 128, 64), "plain"),
    ("causal 1x8x512x512x64", (1, 8, 512, 512, 64), "causal"),
    ("bool mask 2x8x256x256x64", (2, 8, 256, 256, 64), "bool"),
    ("float mask 2x8x256x256x64", (2, 8, 256, 256, 64), "float"),
    ("decode 1x32x1x2048x128", (1, 32, 1, 2048, 128), "plain"),
]


def _model(nodes, inputs, outputs, opset: int = OPSET, domains=("custom.ops",)
           ) -> onnx.ModelProto:
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    graph = helper.make_graph(nodes, "bench", inputs, outputs)
    return helper.make_model(graph, opset_imports=imports, ir_version=10 if opset >= 21 else 8)


def _float(name: str, dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(dims))


class Graph:
    """A tiny graph writer for the hand-written variants: ``g.op(...)`` returns a name."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []

    def op(self, op_type: str, *inputs: str, **attrs) -> str:
        out = f"t{len(self.nodes)}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attrs))
        return out

    def const(self, value, dtype=None) -> str:
        return self.op("Constant", value=onnx.numpy_helper.from_array(
            np.asarray(value, dtype=dtype)))


# -- inverse and solve ------------------------------------------------------------------------


def inverse_custom(n: int, form: str = "Inverse") -> onnx.ModelProto:
    a = _float("A", ["B", n, n])
    if form == "Inverse":
        node = helper.make_node("Inverse", ["A"], ["X"], domain="custom.ops")
        return _model([node], [a], [_float("X", [None] * 3)])
    node = helper.make_node("linalg_inv_ex", ["A", "check"], ["X", "info"],
                            domain="org.pytorch.aten")
    check = helper.make_node("Constant", [], ["check"],
                             value=helper.make_tensor("v", TensorProto.BOOL, [], [False]))
    return _model([check, node], [a], [_float("X", [None] * 3),
                                       helper.make_tensor_value_info("info", TensorProto.INT32,
                                                                     [None])],
                  domains=("org.pytorch.aten",))


def _hand_closed_form(g: Graph, a: str, n: int, batch_last: bool = False,
                      with_info: bool = False) -> str:
    """adj / det without the overflow scaling, batch-last like decomposer's: n = 2, 3 on
    single rows of B values, n = 4 on gathered blocks of rows. ``with_info`` (n = 2, 3)
    also emits linalg_inv_ex's info as output "info", the leanest way: zero flags z_k for
    column 0, the cofactors of the last column (n = 3) and det, and info = y_n (n -
    sum_{k<n} y_k) (y = int32 flags; right when the flags nest, as they do for finite A)."""
    from decomposer.patterns.linalg_inv import cofactor_stages

    entries = g.op("Transpose", g.op("Reshape", a, g.const([-1, n * n], np.int64)),
                   perm=[1, 0])  # (n*n, B)
    if n <= 3:
        f = [g.op("Gather", entries, g.const([i], np.int64), axis=0) for i in range(n * n)]
        if n == 2:
            det = g.op("Sub", g.op("Mul", f[0], f[3]), g.op("Mul", f[1], f[2]))
            factor = g.op("Reciprocal", det)
            negated = g.op("Neg", factor)
            inverse = g.op("Concat", g.op("Mul", f[3], factor), g.op("Mul", f[1], negated),
                           g.op("Mul", f[2], negated), g.op("Mul", f[0], factor), axis=0)
        else:
            (stage,) = cofactor_stages(3)
            adj = [g.op("Sub", g.op("Mul", f[stage.first[0, e]], f[stage.second[0, e]]),
                        g.op("Mul", f[stage.first[1, e]], f[stage.second[1, e]]))
                   for e in range(9)]
            det = g.op("Add", g.op("Add", g.op("Mul", f[0], adj[0]), g.op("Mul", f[1], adj[3])),
                       g.op("Mul", f[2], adj[6]))
            inverse = g.op("Div", g.op("Concat", *adj, axis=0), det)
        if with_info:
            def all_zero(rows: list[str]) -> str:
                flag = g.op("Equal", rows[0], g.const(0.0, np.float32))
                for row in rows[1:]:
                    flag = g.op("And", flag, g.op("Equal", row, g.const(0.0, np.float32)))
                return g.op("Cast", flag, to=TensorProto.INT32)

            groups = [[f[0], f[2]], [det]] if n == 2 else [[f[0], f[3], f[6]], adj[6:9], [det]]
            flags = [all_zero(rows) for rows in groups]
            earlier = flags[0] if n == 2 else g.op("Add", flags[0], flags[1])
            info = g.op("Mul", flags[-1], g.op("Sub", g.const(n, np.int32), earlier))
            g.op("Reshape", info, g.const([-1], np.int64))
            g.nodes[-1].output[0] = "info"
    else:
        adj = entries
        for stage in cofactor_stages(n):
            terms, outputs = stage.first.shape
            products = g.op("Mul", g.op("Gather", entries,
                                        g.const(stage.first.reshape(-1), np.int64), axis=0),
                            g.op("Gather", adj, g.const(stage.second.reshape(-1), np.int64),
                                 axis=0))  # (T * outputs, B)
            summed = g.op("MatMul", g.const(stage.term_signs.reshape(1, -1), np.float32),
                          g.op("Reshape", products, g.const([terms, -1], np.int64)))
            adj = g.op("Reshape", summed, g.const([outputs, -1], np.int64))
            if stage.entry_signs is not None:
                adj = g.op("Mul", adj, g.const(stage.entry_signs.reshape(-1, 1), np.float32))
        row = g.op("Gather", entries, g.const(list(range(n)), np.int64), axis=0)
        col = g.op("Gather", adj, g.const([j * n for j in range(n)], np.int64), axis=0)
        det = g.op("MatMul", g.const(np.ones((1, n), np.float32)), g.op("Mul", row, col))
        inverse = g.op("Div", adj, det)
    if batch_last:
        return g.op("Reshape", inverse, g.const([n, n, -1], np.int64))
    return g.op("Reshape", g.op("Transpose", inverse, perm=[1, 0]), g.op("Shape", a))


def _hand_gauss_jordan(g: Graph, a: str, n: int, batch_last: bool = False) -> str:
    """Gauss-Jordan with partial pivoting, batch-last; the pivot row computed as
    rest - (column - e_p) * scaled (no select), the order restored by GatherElements."""
    rows = g.const(np.arange(n).reshape(n, 1, 1), np.int64)
    matrix = g.op("Transpose", g.op("Reshape", a, g.const([-1, n, n], np.int64)),
                  perm=[1, 2, 0])
    work = g.op("Concat", matrix, g.op("Expand", g.const(np.eye(n, dtype=np.float32)
                                                         .reshape(n, n, 1)),
                                       g.op("Shape", matrix)), axis=1)
    unused, chosen_rows = None, []
    for k in range(n):
        width = 2 * n - k
        column = g.op("Slice", work, g.const([0], np.int64), g.const([1], np.int64),
                      g.const([1], np.int64))
        rest = g.op("Slice", work, g.const([1], np.int64), g.const([width], np.int64),
                    g.const([1], np.int64))
        score = g.op("Abs", column)
        if unused is not None:
            score = g.op("Where", unused, score, g.const(-1.0, np.float32))
        chosen = g.op("ArgMax", score, axis=0, keepdims=1)
        chosen_rows.append(chosen)
        hot = g.op("Equal", rows, chosen)
        unused = g.op("Not", hot) if unused is None else g.op("Xor", unused, hot)
        row = g.op("GatherElements", work, g.op("Expand", chosen,
                                                g.const([1, width, 1], np.int64)), axis=0)
        pivot = g.op("Slice", row, g.const([0], np.int64), g.const([1], np.int64),
                     g.const([1], np.int64))
        row_rest = g.op("Slice", row, g.const([1], np.int64), g.const([width], np.int64),
                        g.const([1], np.int64))
        scaled = g.op("Div", row_rest, pivot)
        factor = g.op("Sub", column, g.op("Cast", hot, to=TensorProto.FLOAT))
        work = g.op("Sub", rest, g.op("Mul", factor, scaled))
    order = g.op("Expand", g.op("Concat", *chosen_rows, axis=0), g.const([1, n, 1], np.int64))
    ordered = g.op("GatherElements", work, order, axis=0)
    if batch_last:
        return ordered
    return g.op("Reshape", g.op("Transpose", ordered, perm=[2, 0, 1]), g.op("Shape", a))


def inverse_ex_hand(n: int) -> onnx.ModelProto:
    """The hand-written inverse with linalg_inv_ex's info (n = 2, 3)."""
    g = Graph()
    _hand_closed_form(g, "A", n, with_info=True)
    g.nodes[-1].output[0] = "X"
    return _model(g.nodes, [_float("A", ["B", n, n])],
                  [_float("X", [None] * 3),
                   helper.make_tensor_value_info("info", TensorProto.INT32, [None])],
                  domains=())


def inverse_hand(n: int, columns: int | None = None) -> onnx.ModelProto:
    """The hand-written inverse; with ``columns``, times R (B, n, columns) as well: batch-last
    Mul + ReduceSum when the product is small (as decomposer), else a batched MatMul."""
    g = Graph()
    build = _hand_closed_form if n <= 4 else _hand_gauss_jordan
    inputs = [_float("A", ["B", n, n])]
    if columns is None:
        build(g, "A", n)
    elif n * n * columns <= 256:
        inverse = build(g, "A", n, batch_last=True)  # (n, n, B)
        inputs.append(_float("R", ["B", n, columns]))
        rhs = g.op("Transpose", "R", perm=[1, 2, 0])
        product = g.op("Mul", g.op("Unsqueeze", inverse, g.const([2], np.int64)),
                       g.op("Unsqueeze", rhs, g.const([0], np.int64)))
        x = g.op("ReduceSum", product, g.const([1], np.int64), keepdims=0)
        g.op("Transpose", x, perm=[2, 0, 1])
    else:
        inverse = build(g, "A", n)
        inputs.append(_float("R", ["B", n, columns]))
        g.op("MatMul", inverse, "R")
    g.nodes[-1].output[0] = "X"
    return _model(g.nodes, inputs, [_float("X", [None] * 3)], domains=())


def inverse_contrib(n: int, with_matmul: bool = False) -> onnx.ModelProto:
    nodes = [helper.make_node("Inverse", ["A"], ["Ainv" if with_matmul else "X"],
                              domain="com.microsoft")]
    inputs = [_float("A", ["B", n, n])]
    if with_matmul:
        inputs.append(_float("R", ["B", n, "K"]))
        nodes.append(helper.make_node("MatMul", ["Ainv", "R"], ["X"]))
    return _model(nodes, inputs, [_float("X", [None] * 3)], domains=("com.microsoft",))


def solve_custom(n: int, columns: int) -> onnx.ModelProto:
    node = helper.make_node("Solve", ["A", "R"], ["X"], domain="custom.ops", left=1)
    return _model([node], [_float("A", ["B", n, n]), _float("R", ["B", n, columns])],
                  [_float("X", [None] * 3)])


def well_conditioned(rng: np.random.Generator, batch: int, n: int) -> np.ndarray:
    """Random matrices with a zero-free but small diagonal: pivoting is needed."""
    a = rng.uniform(-1, 1, (batch, n, n)).astype(np.float32)
    return a + np.roll(np.eye(n, dtype=np.float32), 1, axis=1) * n


# -- attention --------------------------------------------------------------------------------


def _attention_inputs(shape, mode: str) -> tuple[list, dict[str, np.ndarray]]:
    batch, heads, length, source, dim = shape
    rng = np.random.default_rng(0)
    feeds = {"q": rng.normal(size=(batch, heads, length, dim)).astype(np.float32),
             "k": rng.normal(size=(batch, heads, source, dim)).astype(np.float32),
             "v": rng.normal(size=(batch, heads, source, dim)).astype(np.float32)}
    infos = [_float("q", ["N", "H", "L", dim]), _float("k", ["N", "H", "S", dim]),
             _float("v", ["N", "H", "S", dim])]
    if mode == "bool":
        feeds["m"] = rng.random((length, source)) > 0.3
        infos.append(helper.make_tensor_value_info("m", TensorProto.BOOL, ["L", "S"]))
    elif mode == "float":
        feeds["m"] = rng.normal(size=(batch, 1, length, source)).astype(np.float32)
        infos.append(_float("m", ["N", 1, "L", "S"]))
    return infos, feeds


def attention_custom(shape, mode: str) -> onnx.ModelProto:
    infos, _ = _attention_inputs(shape, mode)
    names = [i.name for i in infos]
    node = helper.make_node("ScaledDotProductAttention", names, ["y"], domain="custom.ops",
                            is_causal=int(mode == "causal"))
    return _model([node], infos, [_float("y", [None] * 4)])


def attention_hand(shape, mode: str) -> onnx.ModelProto:
    infos, _ = _attention_inputs(shape, mode)
    g = Graph()
    dim = shape[-1]
    scores = g.op("MatMul", g.op("Mul", "q", g.const(1 / np.sqrt(dim), np.float32)),
                  g.op("Transpose", "k", perm=[0, 1, 3, 2]))
    if mode == "causal":
        length, source = shape[2], shape[3]
        keep = g.const(np.tril(np.ones((length, source), bool)))
        scores = g.op("Where", keep, scores, g.const(-np.inf, np.float32))
    elif mode == "bool":
        scores = g.op("Where", "m", scores, g.const(-np.inf, np.float32))
    elif mode == "float":
        scores = g.op("Add", scores, "m")
    g.op("MatMul", g.op("Softmax", scores, axis=-1), "v")
    g.nodes[-1].output[0] = "y"
    return _model(g.nodes, infos, [_float("y", [None] * 4)], domains=())


def attention_op23(shape, mode: str) -> onnx.ModelProto | None:
    if onnx.defs.onnx_opset_version() < 23:
        return None
    infos, _ = _attention_inputs(shape, mode)
    names = [i.name for i in infos]
    node = helper.make_node("Attention", names, ["y"], is_causal=int(mode == "causal"))
    return _model([node], infos, [_float("y", [None] * 4)], opset=23, domains=())


def attention_torch_export(shape, mode: str) -> onnx.ModelProto | None:
    import torch
    import torch.nn.functional as F

    class Attention(torch.nn.Module):
        def forward(self, q, k, v, *mask):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[0] if mask else None,
                                                  is_causal=mode == "causal")

    _, feeds = _attention_inputs(shape, mode)
    args = tuple(torch.from_numpy(v) for v in feeds.values())
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(Attention(), args, buffer, dynamo=False, opset_version=17,
                              input_names=list(feeds), output_names=["y"])
        except Exception as exc:  # keep benchmarking the rest
            print(f"  (torch export failed: {type(exc).__name__})", file=sys.stderr)
            return None
    return onnx.load_from_string(buffer.getvalue())


# -- timing -----------------------------------------------------------------------------------


def _measure(label: str, threads: int, rounds: int, variants: dict[str, Callable[[], object]],
             baseline: str, extra: dict,
             pairs: dict[str, tuple[str, str]] | None = None) -> dict:
    """Interleaved rounds in a shuffled order; medians of times and of per-round ratios.
    ``pairs`` names further per-round ratios, key: (variant, its own baseline)."""
    repeats, times, ratios = interleaved_rounds(variants, baseline, rounds, _time)
    for key, (name, base) in (pairs or {}).items():
        if name in times and base in times:
            extra = {**extra, key: statistics.median(
                t / u for t, u in zip(times[name], times[base], strict=True))}
    return {"case": label, "threads": threads, "rounds": rounds, "baseline": baseline,
            "repeats": repeats,
            "median_ms": {name: statistics.median(v) * 1e3 for name, v in times.items()},
            "ratio_to_baseline": {name: statistics.median(v) for name, v in ratios.items()},
            **extra}


def _check(got: np.ndarray, want: np.ndarray, what: str, atol: float) -> None:
    if not np.allclose(got, want, atol=atol, rtol=atol):
        raise SystemExit(f"{what}: results differ (max abs error "
                         f"{np.max(np.abs(got - want)):.3g}); not benchmarking a wrong graph")


def bench_inverse(n: int, batch: int, threads: int, rounds: int) -> dict:
    import torch

    a = well_conditioned(np.random.default_rng(0), batch, n)
    feeds = {"A": a}
    ex_model = decomposer.decompose(inverse_custom(n, "ex"))
    variants: dict[str, Callable[[], object]] = {
        "decomposer": OrtRunner(decomposer.decompose(inverse_custom(n)), feeds, threads),
        # linalg_inv_ex fetches both outputs, inverse and info; its ratio to "hand" is to a
        # graph without info, and "hand_ex" (n = 2, 3) is the hand inverse with info.
        "decomposer_ex": OrtRunner(ex_model, feeds, threads),
        "hand": OrtRunner(inverse_hand(n), feeds, threads),
        "contrib": OrtRunner(inverse_contrib(n), feeds, threads)}
    if n in (2, 3):
        variants["hand_ex"] = OrtRunner(inverse_ex_hand(n), feeds, threads)
    if n > CLOSED_FORM_MAX_N:  # the elimination: --target ort keeps its 3-D form
        variants["decomposer_ort"] = OrtRunner(
            decomposer.decompose(inverse_custom(n), target="ort"), feeds, threads)
    torch.set_num_threads(threads)
    a_t = torch.from_numpy(a)
    variants["torch_eager"] = lambda: torch.linalg.inv(a_t)
    want = torch.linalg.inv(a_t.double()).numpy()
    for name in ("decomposer", "decomposer_ex", "decomposer_ort", "hand", "hand_ex"):
        if name in variants:
            _check(variants[name].result(), want, f"inverse n={n} {name}", 1e-3)  # type: ignore
    return _measure(f"inverse n={n} batch={batch}", threads, rounds, variants, "hand",
                    {"n": n, "batch": batch},  # like for like: both compute info
                    pairs={"ex_vs_hand_ex": ("decomposer_ex", "hand_ex")})


def bench_solve(n: int, batch: int, columns: int, threads: int, rounds: int) -> dict:
    import torch

    rng = np.random.default_rng(0)
    feeds = {"A": well_conditioned(rng, batch, n),
             "R": rng.normal(size=(batch, n, columns)).astype(np.float32)}
    variants: dict[str, Callable[[], object]] = {
        "decomposer": OrtRunner(decomposer.decompose(solve_custom(n, columns)), feeds, threads),
        "decomposer_ort": OrtRunner(decomposer.decompose(solve_custom(n, columns),
                                                         target="ort"), feeds, threads),
        "hand": OrtRunner(inverse_hand(n, columns), feeds, threads),
        "contrib": OrtRunner(inverse_contrib(n, with_matmul=True), feeds, threads)}
    torch.set_num_threads(threads)
    a_t, r_t = torch.from_numpy(feeds["A"]), torch.from_numpy(feeds["R"])
    variants["torch_eager"] = lambda: torch.linalg.solve(a_t, r_t)
    want = torch.linalg.solve(a_t.double(), r_t.double()).numpy()
    for name in ("decomposer", "decomposer_ort", "hand"):
        _check(variants[name].result(), want, f"solve n={n} {name}", 1e-3)  # type: ignore
    return _measure(f"solve n={n} batch={batch} k={columns}", threads, rounds, variants,
                    "hand", {"n": n, "batch": batch, "k": columns})


def bench_attention(label: str, shape, mode: str, threads: int, rounds: int) -> dict:
    import torch
    import torch.nn.functional as F

    _, feeds = _attention_inputs(shape, mode)
    variants: dict[str, Callable[[], object]] = {
        "decomposer": OrtRunner(decomposer.decompose(attention_custom(shape, mode)), feeds,
                                threads),
        "hand": OrtRunner(attention_hand(shape, mode), feeds, threads)}
    for name, make in (("attention23", attention_op23), ("torch_export17",
                                                         attention_torch_export)):
        model = make(shape, mode)
        if model is not None:
            try:
                variants[name] = OrtRunner(model, feeds, threads)
            except Exception as exc:  # ORT may lack a kernel; keep the rest
                print(f"  ({name} does not run: {str(exc).splitlines()[0][:100]})",
                      file=sys.stderr)
    torch.set_num_threads(threads)
    tensors = {k: torch.from_numpy(v) for k, v in feeds.items()}

    def eager() -> object:
        return F.scaled_dot_product_attention(tensors["q"], tensors["k"], tensors["v"],
                                              attn_mask=tensors.get("m"),
                                              is_causal=mode == "causal")

    variants["torch_eager"] = eager
    want = eager().numpy()  # type: ignore[attr-defined]
    for name in variants:
        if name != "torch_eager":
            _check(variants[name].result(), want, f"{label} {name}", 1e-4)  # type: ignore
    return _measure(label, threads, rounds, variants, "hand", {"shape": list(shape),
                                                               "mode": mode})


def _print_table(title: str, results: list[dict]) -> None:
    names: list[str] = []
    for result in results:
        names += [n for n in result["ratio_to_baseline"] if n not in names]
    print(f"\n{title}: median per-round ratio to 'hand' (lower is faster)")
    print(f"| case | threads | hand ms | {' | '.join(names)} |")
    print("|---|---|---|" + "---|" * len(names))
    for r in results:
        cells = [f"{r['ratio_to_baseline'][n]:.2f}x" if n in r["ratio_to_baseline"] else "-"
                 for n in names]
        if "ex_vs_hand_ex" in r:
            cells[names.index("decomposer_ex")] += f" ({r['ex_vs_hand_ex']:.2f}x hand_ex)"
        print(f"| {r['case']} | {r['threads']} | {r['median_ms']['hand']:.3f} | "
              f"{' | '.join(cells)} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, fewer cases")
    parser.add_argument("--only", nargs="+", choices=["inverse", "solve", "attention"],
                        default=["inverse", "solve", "attention"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--json", default="bench-results/bench_linalg.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    rounds = args.rounds or (5 if args.quick else 15)
    sections: dict[str, list[dict]] = {}
    for threads in args.threads:
        if "inverse" in args.only:
            for n, batch in INVERSE_CASES[::3] if args.quick else INVERSE_CASES:
                sections.setdefault("inverse", []).append(
                    bench_inverse(n, batch, threads, rounds))
        if "solve" in args.only:
            for n, batch, columns in SOLVE_CASES[::2] if args.quick else SOLVE_CASES:
                sections.setdefault("solve", []).append(
                    bench_solve(n, batch, columns, threads, rounds))
        if "attention" in args.only:
            for label, shape, mode in ATTENTION_CASES[::2] if args.quick else ATTENTION_CASES:
                sections.setdefault("attention", []).append(
                    bench_attention(label, shape, mode, threads, rounds))
    for title, results in sections.items():
        _print_table(title, results)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"machine": {"python": platform.python_version(),
                                            "onnxruntime": ort.__version__,
                                            "cpus": os.cpu_count()},
                                "sections": sections}, indent=1))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
