"""Benchmark decomposed AffineGrid against ONNX Runtime's native kernel and alternatives.

In: nothing required; ``--quick`` for a short run, ``--json FILE`` for the output path,
``--threads 1 2``, ``--rounds N``. Needs the test extra (torch) and onnxscript for the
torch dynamo-export variant (``pip install -e ".[bench]"``); missing ones are skipped.
Out: a table on stdout and the same numbers as JSON: per case and thread count, the median
time of each variant and the median of per-round ratios to ORT's native AffineGrid-20.

Variants, all timed in one process, interleaved in a random order each round:
- ``decomposer``: the decomposed custom node (default target, portable), ``size`` fed at
  run time (nothing folded);
- ``decomposer_ort``: the same decomposed with ``--target ort`` (ONNX Runtime-tuned forms);
- ``decomposer_const``: the portable form with a constant ``size`` (ORT folds the size-only
  part);
- ``native``: ORT's AffineGrid-20 kernel (the baseline);
- ``onnx_function``: ONNX's own AffineGrid-20 function body, inlined (``onnx.inliner``);
- ``torch_dynamo``: torch's dynamo export of ``F.affine_grid`` (static sizes);
- ``torch_eager``: ``F.affine_grid`` in torch itself;
- ``floor``: ORT writing a tensor of the output size (ConstantOfShape), the write floor.
With ``--gridsample`` the grid also feeds a GridSample, as in a real STN. With
``--openvino`` (when openvino is installed) the portable decomposed model and ONNX's
AffineGrid-20 node also run on OpenVINO CPU (f32 precision hint, same thread count), timed
interleaved with each other: the ``openvino`` column is their ratio. ``--sampler`` runs the
GridSample section (``scripts/bench_grid_sample.py``: the GridSample pattern in every mode
against ORT's native GridSample-16, and the seed STN decomposed at opset 11 against native
nodes at 16); ``--aten`` and ``--linalg`` run the ATen-op and linear algebra sections
(``scripts/bench_aten.py``, ``scripts/bench_linalg.py``). ``--rotation`` times
Rot90AndScale decomposed (portable and ``ort`` targets) against a hand-written
Slice + Transpose + Mul. ``--budget`` splits the 2-D STN cases (JSON key ``budget``):
GridSample alone with the grid fed, and what native AffineGrid-20, the same behind 28
trivial ``Neg`` nodes, and the decomposed grid each add to it, in µs, plus the median
per-round ratio of the decomposed STN to the native one. It shows where the decomposed
form's ~30 nodes, each dispatched by ONNX Runtime's executor, meet one native kernel.

ORT sessions use pre-made OrtValue feeds (``run_with_ort_values``), intra-op spinning off,
and 1 or 2 intra-op threads; torch uses the same thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import decomposer  # noqa: E402

from benchlib import OrtRunner, interleaved_rounds
from benchlib import time_calls as _time

CASES = [  # (label, size)
    ("2d N=8 64x64", (8, 1, 64, 64)),
    ("2d N=8 256x256", (8, 1, 256, 256)),
    ("2d N=1 512x512", (1, 1, 512, 512)),
    ("2d N=8 512x512", (8, 1, 512, 512)),
    ("3d N=2 32^3", (2, 1, 32, 32, 32)),
    ("3d N=2 64^3", (2, 1, 64, 64, 64)),
]
OPSET = 20  # native AffineGrid exists from 20; the custom node is decomposed at the same opset


def _io(k: int, with_image: bool) -> tuple[list, list]:
    inputs = [helper.make_tensor_value_info("theta", TensorProto.FLOAT, ["N", k, k + 1]),
              helper.make_tensor_value_info("size", TensorProto.INT64, [k + 2])]
    if with_image:
        spatial = ["D", "H", "W"][3 - k:]
        inputs.append(helper.make_tensor_value_info("image", TensorProto.FLOAT,
                                                    ["N", "C", *spatial]))
    out_rank = k + 2
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * out_rank)]
    return inputs, outputs


def _affine_model(domain: str, k: int, *, gridsample: bool, const_size=None) -> onnx.ModelProto:
    inputs, outputs = _io(k, gridsample)
    grid_name = "grid" if gridsample else "y"
    nodes = [helper.make_node("AffineGrid", ["theta", "size"], [grid_name], domain=domain,
                              align_corners=0, name="affine")]
    inits = []
    if const_size is not None:
        inputs = [i for i in inputs if i.name != "size"]
        inits.append(onnx.numpy_helper.from_array(np.array(const_size, np.int64), "size"))
    if gridsample:
        nodes.append(helper.make_node("GridSample", ["image", "grid"], ["y"], name="sample",
                                      mode="linear", padding_mode="zeros", align_corners=0))
    imports = [helper.make_opsetid("", OPSET)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    graph = helper.make_graph(nodes, "bench", inputs, outputs, initializer=inits)
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def decomposed_model(k: int, gridsample: bool, const_size=None, target: str = "portable"
                     ) -> onnx.ModelProto:
    return decomposer.decompose(_affine_model("custom.ops", k, gridsample=gridsample,
                                              const_size=const_size), target=target)


def native_model(k: int, gridsample: bool) -> onnx.ModelProto:
    return _affine_model("", k, gridsample=gridsample)


def function_body_model(k: int, gridsample: bool) -> onnx.ModelProto:
    """ONNX's AffineGrid-20 function body as a local function, then inlined."""
    body = onnx.defs.get_schema("AffineGrid", OPSET, "").function_body
    function = onnx.FunctionProto()
    function.CopyFrom(body)
    function.domain, function.name = "bench.fn", "AffineGrid"
    if not any(a == "align_corners" for a in function.attribute):
        function.attribute.append("align_corners")
    model = _affine_model("bench.fn", k, gridsample=gridsample)
    model.functions.append(function)
    return onnx.inliner.inline_local_functions(model)


def floor_model(k: int) -> onnx.ModelProto:
    """ORT writing a float tensor of the grid's size: the memory-write floor."""
    graph = helper.make_graph(
        [helper.make_node("ConstantOfShape", ["shape"], ["y"], name="fill",
                          value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.5]))],
        "floor", [helper.make_tensor_value_info("shape", TensorProto.INT64, [k + 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * (k + 2))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             ir_version=10)


def torch_dynamo_model(size, gridsample: bool) -> onnx.ModelProto | None:
    try:
        import onnxscript  # noqa: F401
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None

    class Grid(torch.nn.Module):
        def forward(self, theta, *rest):
            grid = F.affine_grid(theta, list(size), align_corners=False)
            if gridsample:
                return F.grid_sample(rest[0], grid, align_corners=False)
            return grid

    k = len(size) - 2
    theta = torch.zeros(size[0], k, k + 1)
    args = (theta,) + ((torch.zeros(size),) if gridsample else ())
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = Path(folder) / "dynamo.onnx"
        try:
            torch.onnx.export(Grid(), args, str(path), dynamo=True, verbose=False)
        except Exception as exc:  # keep benchmarking the rest
            print(f"  (torch dynamo export failed: {type(exc).__name__})", file=sys.stderr)
            return None
        return onnx.load(path)


class OpenVinoRunner:
    """OpenVINO CPU, f32 precision hint, latency mode, one reused request with set tensors."""

    def __init__(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int):
        import openvino as ov

        core = ov.Core()
        compiled = core.compile_model(core.read_model(model.SerializeToString()), "CPU", {
            "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": threads})
        self.request = compiled.create_infer_request()
        names = {port.get_any_name() for port in compiled.inputs}
        for name, value in feeds.items():
            if name in names:
                self.request.set_tensor(name, ov.Tensor(np.ascontiguousarray(value)))

    def __call__(self) -> None:
        self.request.infer()

    def result(self) -> np.ndarray:
        self.request.infer()
        return np.array(self.request.get_output_tensor(0).data)


def bench_openvino(label: str, size, threads: int, rounds: int, gridsample: bool
                   ) -> dict | None:
    """The portable decomposition on OpenVINO against ONNX's AffineGrid-20 on OpenVINO."""
    try:
        import openvino  # noqa: F401
    except ImportError:
        return None
    k = len(size) - 2
    rng = np.random.default_rng(0)
    feeds = {"theta": rng.uniform(-1, 1, (size[0], k, k + 1)).astype(np.float32),
             "size": np.array(size, np.int64)}
    if gridsample:
        feeds["image"] = rng.normal(size=size).astype(np.float32)
    try:
        variants: dict[str, Callable[[], None]] = {
            "ov_native": OpenVinoRunner(native_model(k, gridsample), feeds, threads),
            "ov_decomposer": OpenVinoRunner(decomposed_model(k, gridsample), feeds, threads)}
    except RuntimeError as exc:  # e.g. OpenVINO has no 5-D GridSample
        from decomposer.engines import first_error_line

        return {"failed": first_error_line(str(exc))[:160], "engine": "openvino"}
    np.testing.assert_allclose(variants["ov_decomposer"].result(),  # type: ignore[attr-defined]
                               variants["ov_native"].result(),  # type: ignore[attr-defined]
                               atol=1e-2 if gridsample else 1e-4, rtol=1e-4)
    return _measure(label, list(size), threads, rounds, variants, "ov_native",
                    {"gridsample": gridsample, "engine": "openvino"})


def bench_case(label: str, size, threads: int, rounds: int, gridsample: bool,
               skip_slow: bool) -> dict:
    k = len(size) - 2
    rng = np.random.default_rng(0)
    theta = rng.uniform(-1, 1, (size[0], k, k + 1)).astype(np.float32)
    feeds = {"theta": theta, "size": np.array(size, np.int64)}
    if gridsample:
        feeds["image"] = rng.normal(size=size).astype(np.float32)
    variants: dict[str, Callable[[], None]] = {}
    variants["native"] = OrtRunner(native_model(k, gridsample), feeds, threads)
    variants["decomposer"] = OrtRunner(decomposed_model(k, gridsample), feeds, threads)
    variants["decomposer_ort"] = OrtRunner(decomposed_model(k, gridsample, target="ort"),
                                           feeds, threads)
    variants["decomposer_const"] = OrtRunner(decomposed_model(k, gridsample, size), feeds,
                                             threads)
    failures: dict[str, str] = {}
    try:
        runner = OrtRunner(function_body_model(k, gridsample), feeds, threads)
        runner()
        variants["onnx_function"] = runner
    except Exception as exc:
        failures["onnx_function"] = str(exc).splitlines()[0][:120]
    if not gridsample:
        grid_shape = (size[0], *size[2:], k)
        variants["floor"] = OrtRunner(floor_model(k), {"shape": np.array(grid_shape, np.int64)},
                                      threads)
    dynamo = None if skip_slow else torch_dynamo_model(size, gridsample)
    if dynamo is not None:
        dynamo_feeds = dict(zip([i.name for i in dynamo.graph.input],
                                [theta] + ([feeds["image"]] if gridsample else []),
                                strict=False))
        variants["torch_dynamo"] = OrtRunner(dynamo, dynamo_feeds, threads)
    try:
        import torch
        import torch.nn.functional as F

        torch.set_num_threads(threads)
        theta_t = torch.from_numpy(theta)
        image_t = torch.from_numpy(feeds["image"]) if gridsample else None

        def eager() -> None:
            with torch.no_grad():
                grid = F.affine_grid(theta_t, list(size), align_corners=False)
                if image_t is not None:
                    F.grid_sample(image_t, grid, align_corners=False)

        variants["torch_eager"] = eager
    except ImportError:
        pass

    # Sanity: the decomposition computes what the native kernel computes (no size-1 dims
    # here, where the native kernel differs from torch). Through GridSample, 1e-7 grid
    # differences can move a sample across a pixel edge: compare more loosely there.
    for name in ("decomposer", "decomposer_ort"):
        np.testing.assert_allclose(variants[name].result(),  # type: ignore[attr-defined]
                                   variants["native"].result(),  # type: ignore[attr-defined]
                                   atol=1e-2 if gridsample else 1e-4, rtol=1e-4)

    result = _measure(label, list(size), threads, rounds, variants, "native",
                      {"gridsample": gridsample, "failed": failures})
    result["ratio_to_native"] = result["ratio_to_baseline"]
    return result


def _measure(label: str, size: list[int], threads: int, rounds: int,
             variants: dict[str, Callable[[], None]], baseline: str, extra: dict) -> dict:
    """Interleaved rounds in a shuffled order; medians of times and of per-round ratios."""
    repeats, times, ratios = interleaved_rounds(variants, baseline, rounds, _time)
    return {
        "case": label, "size": size, "threads": threads, "repeats": repeats, "rounds": rounds,
        "baseline": baseline,
        "median_ms": {name: statistics.median(v) * 1e3 for name, v in times.items()},
        "ratio_to_baseline": {name: statistics.median(v) for name, v in ratios.items()},
        **extra,
    }


BUDGET_CHAIN = 28  # about the 2-D form's node count; even, so the Negs give theta back exactly


def _gridsample_only_model() -> onnx.ModelProto:
    """GridSample alone, the grid fed: what every STN variant below adds to."""
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [None] * 4)
              for name in ("image", "grid")]
    graph = helper.make_graph(
        [helper.make_node("GridSample", ["image", "grid"], ["y"], name="sample", mode="linear",
                          padding_mode="zeros", align_corners=0)], "gridsample", inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                             ir_version=10)


def _with_node_chain(model: onnx.ModelProto, length: int) -> onnx.ModelProto:
    """``model`` with ``length`` Neg nodes between theta and its readers: the cost of that many
    trivial nodes in ONNX Runtime's executor, measured where the grid is made."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    previous = "theta"
    chain = []
    for i in range(length):
        chain.append(helper.make_node("Neg", [previous], [f"theta_neg{i}"], name=f"neg{i}"))
        previous = f"theta_neg{i}"
    for node in out.graph.node:
        node.input[:] = [previous if name == "theta" else name for name in node.input]
    readers = list(out.graph.node)
    del out.graph.node[:]
    out.graph.node.extend(chain + readers)
    return out


def bench_budget(label: str, size, threads: int, rounds: int) -> dict:
    """What the grid adds to an STN's GridSample: native AffineGrid-20, the same behind
    BUDGET_CHAIN trivial nodes, and the decomposed grid, each against GridSample fed the grid."""
    k = len(size) - 2
    rng = np.random.default_rng(0)
    feeds = {"theta": rng.uniform(-1, 1, (size[0], k, k + 1)).astype(np.float32),
             "size": np.array(size, np.int64),
             "image": rng.normal(size=size).astype(np.float32)}
    native = native_model(k, True)
    feeds["grid"] = OrtRunner(native_model(k, False), feeds, threads).result()
    decomposed = decomposed_model(k, True)
    variants: dict[str, OrtRunner] = {
        "gridsample_only": OrtRunner(_gridsample_only_model(), feeds, threads),
        "native": OrtRunner(native, feeds, threads),
        "native_behind_nodes": OrtRunner(_with_node_chain(native, BUDGET_CHAIN), feeds, threads),
        "decomposer": OrtRunner(decomposed, feeds, threads)}
    # Sanity: every variant samples the same image with the same grid (the Negs cancel out;
    # the decomposed grid moves samples by ~1e-7, see bench_case).
    outputs = {name: runner.result() for name, runner in variants.items()}
    np.testing.assert_array_equal(outputs["native_behind_nodes"], outputs["native"])
    np.testing.assert_array_equal(outputs["gridsample_only"], outputs["native"])
    np.testing.assert_allclose(outputs["decomposer"], outputs["native"], atol=1e-2, rtol=1e-4)
    repeats, times, _ = interleaved_rounds(variants, "gridsample_only", rounds, _time)
    median_ms = {name: statistics.median(v) * 1e3 for name, v in times.items()}
    pair = [d / n for d, n in zip(times["decomposer"], times["native"], strict=True)]
    return {"case": label, "size": list(size), "threads": threads, "rounds": rounds,
            "repeats": repeats, "median_ms": median_ms,
            "added_us": {name: (ms - median_ms["gridsample_only"]) * 1e3
                         for name, ms in median_ms.items()},
            "pair_ratio": statistics.median(pair), "chain": BUDGET_CHAIN,
            "decomposed_nodes": sum(n.op_type not in ("Constant", "GridSample")
                                    for n in decomposed.graph.node)}


def _print_budget_table(results: list[dict]) -> None:
    print(f"{'case':<18} {'thr':>3} {'GridSample ms':>13}  {'+ native us':>11}  "
          f"{'+ native behind nodes us':>24}  {'+ decomposed us':>15}  {'pair ratio':>10}")
    for r in results:
        added = r["added_us"]
        print(f"{r['case']:<18} {r['threads']:>3} {r['median_ms']['gridsample_only']:>13.3f}  "
              f"{added['native']:>11.1f}  {added['native_behind_nodes']:>24.1f}  "
              f"{added['decomposer']:>15.1f}  "
              f"{r['pair_ratio']:>9.3f}x")
    if results:
        print(f"(nodes: {results[0]['chain']} Neg in front of the native kernel; the decomposed "
              f"grid has {results[0]['decomposed_nodes']}. pair ratio: median per-round ratio of "
              "the decomposed STN to the native one)")


ROTATION_CASES = [("rot k=1 1x3x224x224", (1, 3, 224, 224), 1),
                  ("rot k=2 8x3x224x224", (8, 3, 224, 224), 2),
                  ("rot k=3 8x64x128x96", (8, 64, 128, 96), 3)]


def _rotation_models(shape, k: int, target: str = "portable"
                     ) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(decomposed Rot90AndScale(k, scale 1.5), hand-written Slice+Transpose+Mul)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "C", "H", "W"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)
    custom = helper.make_graph(
        [helper.make_node("Rot90AndScale", ["x"], ["y"], domain="custom.ops", k=k, scale=1.5)],
        "rot", [x], [y])
    decomposed = decomposer.decompose(helper.make_model(
        custom, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom.ops", 1)],
        ir_version=8), target=target)
    ints = lambda name, v: onnx.numpy_helper.from_array(np.array(v, np.int64), name)  # noqa: E731
    if k == 2:
        nodes = [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["r"])]
        inits = [ints("s", [-1, -1]), ints("e", [-2**63, -2**63]), ints("a", [2, 3]),
                 ints("st", [-1, -1])]
    else:
        nodes = [helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["f"]),
                 helper.make_node("Transpose", ["f"], ["r"], perm=[0, 1, 3, 2])]
        inits = [ints("s", [-1]), ints("e", [-2**63]), ints("a", [3 if k == 1 else 2]),
                 ints("st", [-1])]
    nodes.append(helper.make_node("Mul", ["r", "scale"], ["y"]))
    inits.append(onnx.numpy_helper.from_array(np.array(1.5, np.float32), "scale"))
    bare = helper.make_model(helper.make_graph(nodes, "bare", [x], [y], initializer=inits),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return decomposed, bare


def bench_rotation(label: str, shape, k: int, threads: int, rounds: int) -> dict:
    x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
    decomposed, bare = _rotation_models(shape, k)
    decomposed_ort, _ = _rotation_models(shape, k, target="ort")
    variants: dict[str, Callable[[], None]] = {
        "bare": OrtRunner(bare, {"x": x}, threads),
        "decomposer": OrtRunner(decomposed, {"x": x}, threads),
        "decomposer_ort": OrtRunner(decomposed_ort, {"x": x}, threads)}
    for name in ("decomposer", "decomposer_ort"):
        np.testing.assert_array_equal(variants[name].result(),  # type: ignore[attr-defined]
                                      variants["bare"].result())  # type: ignore[attr-defined]
    try:
        import torch

        torch.set_num_threads(threads)
        xt = torch.from_numpy(x)
        variants["torch_eager"] = lambda: (torch.rot90(xt, k, [2, 3]) * 1.5).contiguous()
    except ImportError:
        pass
    return _measure(label, list(shape), threads, rounds, variants, "bare",
                    {"k": k, "kind": "rotation"})


def _print_rotation_table(results: list[dict]) -> None:
    print(f"{'case':<22} {'thr':>3} {'bare ms':>8} {'decomposer':>11} {'target ort':>11} "
          f"{'torch_eager':>12}")
    for r in results:
        ratios = r["ratio_to_baseline"]
        eager = f"{ratios['torch_eager']:>11.2f}x" if "torch_eager" in ratios else f"{'-':>12}"
        print(f"{r['case']:<22} {r['threads']:>3} {r['median_ms']['bare']:>8.3f} "
              f"{ratios['decomposer']:>10.2f}x {ratios['decomposer_ort']:>10.2f}x {eager}")


def _print_table(results: list[dict]) -> None:
    columns = ["decomposer", "decomposer_ort", "openvino", "decomposer_const", "onnx_function",
               "torch_dynamo", "torch_eager", "floor"]
    print(f"{'case':<18} {'thr':>3} {'GS':>2} {'native ms':>9}  " +
          " ".join(f"{c:>16}" for c in columns))
    for r in results:
        cells = []
        for c in columns:
            if c in r["ratio_to_native"]:
                cells.append(f"{r['ratio_to_native'][c]:>15.2f}x")
            elif c in r["failed"]:
                cells.append(f"{'fails':>16}")
            else:
                cells.append(f"{'-':>16}")
        print(f"{r['case']:<18} {r['threads']:>3} {'y' if r['gridsample'] else 'n':>2} "
              f"{r['median_ms']['native']:>9.3f}  " + " ".join(cells))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds, no torch dynamo")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--cases", nargs="+", help="substrings of case labels to run")
    parser.add_argument("--gridsample", action="store_true",
                        help="also measure the grid feeding GridSample")
    parser.add_argument("--rotation", action="store_true",
                        help="also measure Rot90AndScale against a bare Slice+Transpose")
    parser.add_argument("--openvino", action="store_true",
                        help="also time the portable form and AffineGrid-20 on OpenVINO")
    parser.add_argument("--sampler", action="store_true",
                        help="also run the GridSample section: the GridSample pattern in "
                             "every mode against ORT's GridSample-16, and the seed STN at "
                             "opset 11 against 16 (scripts/bench_grid_sample.py, 1 thread, "
                             "CPU time, its own JSON)")
    parser.add_argument("--aten", action="store_true",
                        help="also run the ATen-op section (scripts/bench_aten.py: rot90, "
                             "tril/triu, cummax, searchsorted against hand-written graphs "
                             "and torch; its own JSON)")
    parser.add_argument("--linalg", action="store_true",
                        help="also run the linear algebra section (scripts/bench_linalg.py: "
                             "inverse, linalg_inv_ex, solve, attention; its own JSON)")
    parser.add_argument("--deform", action="store_true",
                        help="also run the DeformConv section (scripts/bench_deform_conv.py: "
                             "against ORT's DeformConv-19 and a naive gather form, 1 thread, "
                             "peak memory; its own JSON)")
    parser.add_argument("--msda", action="store_true",
                        help="also run the multi-scale deformable attention section "
                             "(scripts/bench_msda.py: against the GridSample-per-level export; "
                             "its own JSON)")
    parser.add_argument("--budget", action="store_true",
                        help="also split the 2-D STN cases: GridSample fed the grid, plus "
                             "native AffineGrid-20, plus the same behind 28 trivial nodes, plus "
                             "the decomposed grid (where the per-node cost meets one kernel)")
    parser.add_argument("--json", default="bench-results/bench.json")
    args = parser.parse_args(argv)
    rounds = 5 if args.quick else args.rounds
    results = []
    for label, size in CASES:
        if args.cases and not any(s in label for s in args.cases):
            continue
        for threads in args.threads:
            for gridsample in ([False, True] if args.gridsample else [False]):
                if gridsample and len(size) == 5 and size[2] >= 64:
                    continue  # 3-D GridSample at 64^3 takes minutes per round
                result = bench_case(label, size, threads, rounds, gridsample,
                                    skip_slow=args.quick)
                ov = bench_openvino(label, size, threads, rounds, gridsample) \
                    if args.openvino else None
                if ov is not None:
                    result["openvino"] = ov
                    if "failed" in ov:
                        result["failed"]["openvino"] = ov["failed"]
                    else:
                        result["ratio_to_native"]["openvino"] = \
                            ov["ratio_to_baseline"]["ov_decomposer"]
                results.append(result)
                _print_table(results[-1:])
    print()
    _print_table(results)
    if args.sampler:
        import bench_grid_sample

        print()
        bench_grid_sample.main(["--rounds", str(rounds), "--cpu-time", "--json",
                                str(Path(args.json).with_name("bench_grid_sample.json"))])
    threads = [str(t) for t in args.threads]
    for wanted, module_name in ((args.aten, "bench_aten"), (args.linalg, "bench_linalg")):
        if wanted:
            module = __import__(module_name)
            print()
            module.main(["--rounds", str(rounds), "--threads", *threads, "--json",
                         str(Path(args.json).with_name(f"{module_name}.json"))])
    for wanted, module_name in ((args.deform, "bench_deform_conv"), (args.msda, "bench_msda")):
        if wanted:
            module = __import__(module_name)
            print()
            module.main(["--rounds", str(min(rounds, 9)), "--json",
                         str(Path(args.json).with_name(f"{module_name}.json"))])
    rotation = []
    if args.rotation:
        for label, shape, k in ROTATION_CASES:
            for threads in args.threads:
                rotation.append(bench_rotation(label, shape, k, threads, rounds))
        print()
        _print_rotation_table(rotation)
    budget = []
    if args.budget:
        for label, size in CASES:
            if len(size) != 4 or (args.cases and not any(c in label for c in args.cases)):
                continue
            for threads in args.threads:
                budget.append(bench_budget(label, size, threads, rounds))
        print()
        _print_budget_table(budget)
    meta = {"machine": platform.machine(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "onnxruntime": ort.__version__, "onnx": onnx.__version__}
    try:
        import openvino

        meta["openvino"] = openvino.__version__
    except ImportError:
        pass
    target = Path(args.json)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"meta": meta, "results": results, "rotation": rotation,
                                             "budget": budget},
                                 indent=2))
    print(f"\nwrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
