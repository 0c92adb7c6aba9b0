"""Benchmark decomposed GridSample against ONNX Runtime's native GridSample-16 kernel.

In: nothing required; ``--quick`` for a short run, ``--rounds N``, ``--threads 1 2``,
``--cases`` / ``--modes`` (substrings) to select, ``--grid affine|random``, ``--no-stn``,
``--cpu-time`` (this thread's CPU time instead of wall time: steadier on a shared machine,
1 thread only), ``--json FILE``. Needs torch for the spatial-transformer part and the sanity check.
Out: a table on stdout and the same numbers as JSON: per case, mode and thread count, the
median time of each variant and the median of per-round ratios to the native kernel.

Variants, timed in one process, interleaved in a random order each round:
- ``native``: ORT's GridSample-16 on the same input and grid (the baseline);
- ``decomposer``: ``custom.ops::GridSample`` decomposed at opset 11 (what a model exported
  below opset 16 gets), channels static, batch and every spatial size dynamic.
Every mode x padding x align_corners of the 2-D op is measured (``--modes`` selects). The
grid is an affine grid (rotation up to 0.5 rad, scale 0.8-1.25, shift up to 0.2: what a
spatial transformer feeds), or uniform noise in [-1.1, 1.1] with ``--grid random`` (cache-
hostile for both).

The STN part times the seed spatial transformer (Conv 3->64 -> AffineGrid -> grid_sample)
as exported at opset 11 (both nodes decomposed) and at opset 16 (AffineGrid decomposed,
native GridSample-16) against the same network with native AffineGrid-20 + GridSample-20.

ORT sessions use pre-made OrtValue feeds (``run_with_ort_values``), intra-op spinning off,
and 1 or 2 intra-op threads.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import decomposer  # noqa: E402

from benchlib import OrtRunner, interleaved_rounds, time_calls

CASES = [  # (label, input shape N, C, H, W); the grid has the input's spatial size
    ("1x3x224x224", (1, 3, 224, 224)),
    ("8x32x64x64", (8, 32, 64, 64)),
    ("1x64x128x128", (1, 64, 128, 128)),
]
MODES = [(mode, padding, align) for mode in ("bilinear", "nearest", "bicubic")
         for padding in ("zeros", "border", "reflection") for align in (0, 1)]
STN_CASES = [("STN 1x3x130x130 -> 128x128", (1, 3, 130, 130), (1, 64, 128, 128)),
             ("STN 8x3x66x66 -> 64x64", (8, 3, 66, 66), (8, 64, 64, 64))]
DECOMPOSED_OPSET = 11
NATIVE_OPSET = 16


def sampler_model(domain: str, opset: int, mode: str, padding: str, align: int,
                  channels: int) -> onnx.ModelProto:
    """One GridSample node: X (N, C, H, W) with C static, grid (N, Ho, Wo, 2)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", channels, "H", "W"])
    grid = helper.make_tensor_value_info("grid", TensorProto.FLOAT, ["N", "Ho", "Wo", 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", channels, "Ho", "Wo"])
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], name="sampler", domain=domain,
                            mode=mode, padding_mode=padding, align_corners=align)
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    return helper.make_model(helper.make_graph([node], "bench", [x, grid], [y]),
                             opset_imports=imports, ir_version=8)


def affine_grid(batch: int, height: int, width: int, seed: int = 0) -> np.ndarray:
    """torch.nn.functional.affine_grid semantics (align_corners=False) in numpy."""
    rng = np.random.default_rng(seed)
    angle = rng.uniform(-0.5, 0.5, batch)
    scale = rng.uniform(0.8, 1.25, batch)
    shift = rng.uniform(-0.2, 0.2, (batch, 2))
    xs = (np.arange(width) * 2 + 1) / width - 1
    ys = (np.arange(height) * 2 + 1) / height - 1
    gx, gy = np.meshgrid(xs, ys)
    cos, sin = (scale * np.cos(angle))[:, None, None], (scale * np.sin(angle))[:, None, None]
    out_x = cos * gx - sin * gy + shift[:, 0, None, None]
    out_y = sin * gx + cos * gy + shift[:, 1, None, None]
    return np.stack([out_x, out_y], axis=-1).astype(np.float32)


CLOCK = time.perf_counter  # --cpu-time: time.thread_time (1 thread only; shared machines)


def _time(fn: Callable[[], None], repeat: int) -> float:
    return time_calls(fn, repeat, CLOCK)


def _measure(variants: dict[str, Callable[[], None]], baseline: str, rounds: int
             ) -> tuple[dict[str, float], dict[str, float]]:
    """Interleaved rounds in a shuffled order: medians of times (ms) and per-round ratios."""
    repeats, times, ratios = interleaved_rounds(variants, baseline, rounds, _time)
    return ({name: statistics.median(v) * 1e3 for name, v in times.items()},
            {name: statistics.median(v) for name, v in ratios.items()})


def _check_against_torch(got: np.ndarray, x: np.ndarray, grid: np.ndarray, mode: str,
                         padding: str, align: int) -> float:
    """Max error of the decomposition against torch (nearest: share of differing pixels,
    which only exact ties could cause). Returns -1 if torch is missing."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return -1.0
    with torch.no_grad():
        expected = F.grid_sample(torch.from_numpy(x), torch.from_numpy(grid), mode=mode,
                                 padding_mode=padding, align_corners=bool(align)).numpy()
    if mode == "nearest":
        share = float(np.mean(got != expected))
        assert share < 1e-3, f"{mode} {padding} {align}: {share:.2%} of pixels differ"
        return share
    error = float(np.max(np.abs(got - expected)))
    assert error < 1e-3, f"{mode} {padding} {align}: max error {error} against torch"
    return error


def bench_sampler(label: str, shape: tuple[int, ...], mode: str, padding: str, align: int,
                  threads: int, rounds: int, grid_kind: str) -> dict:
    batch, channels, height, width = shape
    rng = np.random.default_rng(0)
    x = rng.normal(size=shape).astype(np.float32)
    grid = affine_grid(batch, height, width) if grid_kind == "affine" else \
        rng.uniform(-1.1, 1.1, (batch, height, width, 2)).astype(np.float32)
    feeds = {"x": x, "grid": grid}
    native = sampler_model("", NATIVE_OPSET, mode, padding, align, channels)
    decomposed = decomposer.decompose(sampler_model("custom.ops", DECOMPOSED_OPSET, mode,
                                                    padding, align, channels))
    variants: dict[str, Callable[[], None]] = {
        "native": OrtRunner(native, feeds, threads),
        "decomposer": OrtRunner(decomposed, feeds, threads)}
    error = _check_against_torch(variants["decomposer"].result(),  # type: ignore[attr-defined]
                                 x, grid, mode, padding, align)
    times, ratios = _measure(variants, "native", rounds)
    nodes = sum(1 for n in decomposed.graph.node if n.op_type != "Constant")
    return {"case": label, "shape": list(shape), "mode": mode, "padding": padding,
            "align_corners": align, "threads": threads, "rounds": rounds, "grid": grid_kind,
            "median_ms": times, "ratio_to_native": ratios, "decomposed_nodes": nodes,
            "error_vs_torch": error}


# -- the spatial transformer ---------------------------------------------------------------


def _stn_models() -> tuple[Any, dict[str, onnx.ModelProto]]:
    """The seed STN exported at opsets 11 and 16 (torch's legacy exporter), decomposed, and
    an all-native opset-20 variant (AffineGrid-20 + GridSample-20)."""
    import torch
    from torch.onnx import OperatorExportTypes

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from seed_models import SpatialTransformer

    torch.manual_seed(0)
    model = SpatialTransformer().eval()
    args = (torch.randn(1, 3, 34, 40), torch.randn(1, 2, 3), torch.tensor([1, 64, 16, 24]))
    exported = {}
    for opset in (11, 16):
        with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            path = Path(folder) / "stn.onnx"
            torch.onnx.export(model, args, str(path), dynamo=False, opset_version=opset,
                              operator_export_type=OperatorExportTypes.ONNX_FALLTHROUGH,
                              input_names=["image", "theta", "size"], output_names=["output"],
                              dynamic_axes={"image": {0: "n", 2: "h", 3: "w"},
                                            "theta": {0: "n"},
                                            "output": {0: "n", 2: "oh", 3: "ow"}})
            exported[opset] = onnx.load(path)
    native = onnx.ModelProto()
    native.CopyFrom(exported[16])
    for node in native.graph.node:
        if node.op_type == "AffineGrid":
            node.domain = ""
        if node.op_type == "GridSample":
            for attr in node.attribute:
                if attr.name == "mode":
                    attr.s = {b"bilinear": b"linear", b"bicubic": b"cubic"}.get(attr.s, attr.s)
    del native.opset_import[:]
    native.opset_import.append(helper.make_opsetid("", 20))
    native.ir_version = 9
    models = {"opset11 decomposed": decomposer.decompose(exported[11]),
              "opset16 AffineGrid decomposed": decomposer.decompose(exported[16]),
              "opset20 native": native}
    return model, models


def bench_stn(threads: int, rounds: int) -> list[dict]:
    try:
        import torch
    except ImportError:
        print("  (torch missing: STN part skipped)", file=sys.stderr)
        return []
    module, models = _stn_models()
    results = []
    for label, image_shape, size in STN_CASES:
        rng = np.random.default_rng(1)
        identity = np.array([[1, 0, 0], [0, 1, 0]], np.float32)
        feeds: dict[str, np.ndarray] = {
            "image": rng.normal(size=image_shape).astype(np.float32),
            "theta": identity + rng.uniform(-0.2, 0.2, (size[0], 2, 3)).astype(np.float32),
            "size": np.array(size, np.int64)}
        variants: dict[str, Callable[[], None]] = {
            name: OrtRunner(model, feeds, threads) for name, model in models.items()}
        with torch.no_grad():
            expected = module(*(torch.from_numpy(feeds[k]) for k in ("image", "theta",
                                                                     "size"))).numpy()
        for name, runner in variants.items():
            error = float(np.max(np.abs(runner.result() - expected)))  # type: ignore
            assert error < 1e-3, f"{label} {name}: max error {error} against torch"
        times, ratios = _measure(variants, "opset20 native", rounds)
        results.append({"case": label, "threads": threads, "rounds": rounds,
                        "median_ms": times, "ratio_to_native": ratios})
    return results


# -- tables ------------------------------------------------------------------------------------


def _print_sampler_table(results: list[dict], header: bool = True) -> None:
    if header:
        print(f"{'case':<14} {'mode':<9} {'padding':<11} {'align':>5} {'thr':>3} "
              f"{'native ms':>9} {'decomposer':>10} {'nodes':>5}")
    for r in results:
        print(f"{r['case']:<14} {r['mode']:<9} {r['padding']:<11} {r['align_corners']:>5} "
              f"{r['threads']:>3} {r['median_ms']['native']:>9.3f} "
              f"{r['ratio_to_native']['decomposer']:>9.2f}x {r['decomposed_nodes']:>5}")


def _print_stn_table(results: list[dict]) -> None:
    print(f"{'case':<28} {'thr':>3} {'native ms':>9} {'opset 11':>9} {'opset 16':>9}")
    for r in results:
        ratios = r["ratio_to_native"]
        print(f"{r['case']:<28} {r['threads']:>3} {r['median_ms']['opset20 native']:>9.3f} "
              f"{ratios['opset11 decomposed']:>8.2f}x "
              f"{ratios['opset16 AffineGrid decomposed']:>8.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 rounds")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--cases", nargs="+", help="substrings of case labels to run")
    parser.add_argument("--modes", nargs="+",
                        help="substrings of 'mode-padding-align' labels, e.g. bilinear-zeros-0")
    parser.add_argument("--grid", choices=["affine", "random"], default="affine")
    parser.add_argument("--no-stn", action="store_true", help="skip the STN part")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time this thread's CPU time, not wall time (robust on a shared "
                             "machine; meaningful at 1 thread only)")
    parser.add_argument("--json", default="bench-results/bench_grid_sample.json")
    args = parser.parse_args(argv)
    rounds = 5 if args.quick else args.rounds
    if args.cpu_time:
        if args.threads != [1]:
            parser.error("--cpu-time measures one thread: use --threads 1")
        global CLOCK
        CLOCK = time.thread_time
    results = []
    for (label, shape), (mode, padding, align), threads in itertools.product(
            CASES, MODES, args.threads):
        if args.cases and not any(s in label for s in args.cases):
            continue
        if args.modes and not any(s in f"{mode}-{padding}-{align}" for s in args.modes):
            continue
        results.append(bench_sampler(label, shape, mode, padding, align, threads, rounds,
                                     args.grid))
        _print_sampler_table(results[-1:], header=len(results) == 1)
    print()
    _print_sampler_table(results)
    stn = []
    if not args.no_stn:
        for threads in args.threads:
            stn.extend(bench_stn(threads, rounds))
        print()
        _print_stn_table(stn)
    meta = {"machine": platform.machine(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "onnxruntime": ort.__version__, "onnx": onnx.__version__}
    target = Path(args.json)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"meta": meta, "results": results, "stn": stn}, indent=2))
    print(f"\nwrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
