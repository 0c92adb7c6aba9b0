"""Benchmark the tool's own cost: node-count scaling, and a large external-data model.

In: ``--nodes 300 3000 30000`` (custom-node counts), ``--weights-mib 400``, ``--json FILE``.
Out: a table and JSON with the import time of the CLI (fresh process), and per case the
CLI's wall time and peak RSS (each run in a fresh process, as users run it) and
``decompose()``'s time in process, next to the baseline it is compared with:
- scaling: the CLI on a chain of N custom nodes (AffineGrid and rotation ops mixed), and
  the ratio of each size's time to the smallest one's;
- external data: the CLI on a model with ``--weights-mib`` of external weights and two
  custom nodes, against a plain ``onnx.load`` + ``onnx.save`` of the same model (weights
  loaded and written back), alternating the two, medians of 3 runs each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LOAD_SAVE = """
import sys, onnx
model = onnx.load(sys.argv[1])
onnx.save(model, sys.argv[2], save_as_external_data=True, all_tensors_to_one_file=True,
          location="baseline.data", size_threshold=1024)
"""


WRAPPER = """
import runpy, sys
sys.argv = sys.argv[1:]
try:
    if sys.argv[0].endswith(".py"):
        runpy.run_path(sys.argv[0], run_name="__main__")
    else:
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit as exit_:
    assert not exit_.code, exit_.code
# VmHWM, not ru_maxrss: ru_maxrss survives exec, so it would include the parent's memory.
peak_kib = next(int(line.split()[1]) for line in open("/proc/self/status")
                if line.startswith("VmHWM:"))
print("RSS", peak_kib, file=sys.stderr)
"""


def chain_model(count: int) -> onnx.ModelProto:
    """x -> [Rot90AndScale | CustomRotScale | (AffineGrid on a side branch)] x count."""
    nodes, outputs = [], []
    current = "x"
    for index in range(count):
        kind = index % 3
        if kind == 2:
            nodes.append(helper.make_node("AffineGrid", ["theta", "size"], [f"grid{index}"],
                                          name=f"affine{index}", domain="custom.ops"))
            outputs.append(helper.make_tensor_value_info(f"grid{index}", TensorProto.FLOAT,
                                                         ["N", "H", "W", 2]))
            continue
        op = "Rot90AndScale" if kind == 0 else "CustomRotScale"
        nodes.append(helper.make_node(op, [current], [f"t{index}"], name=f"rot{index}",
                                      domain="custom.ops"))
        current = f"t{index}"
    outputs.insert(0, helper.make_tensor_value_info(current, TensorProto.FLOAT,
                                                    ["B", "C", "S", "S"]))
    graph = helper.make_graph(
        nodes, "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "C", "S", "S"]),
         helper.make_tensor_value_info("theta", TensorProto.FLOAT, ["N", 2, 3]),
         helper.make_tensor_value_info("size", TensorProto.INT64, [4])],
        outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("custom.ops", 1)],
                             ir_version=8)


def big_model(folder: Path, weights_mib: int) -> Path:
    """The seed STN shape with ``weights_mib`` MiB of external weights in 16 tensors."""
    rng = np.random.default_rng(0)
    per_tensor = weights_mib * (1 << 20) // 16 // 4
    initializers = [numpy_helper.from_array(rng.random(per_tensor, dtype=np.float32),
                                            f"w{i}") for i in range(16)]
    nodes = [helper.make_node("AffineGrid", ["theta", "size"], ["grid"], name="affine",
                              domain="custom.ops"),
             helper.make_node("Rot90AndScale", ["grid"], ["rot"], name="rot",
                              domain="custom.ops", k=2)]
    nodes += [helper.make_node("ReduceSum", [f"w{i}"], [f"s{i}"], keepdims=0, name=f"sum{i}")
              for i in range(16)]
    graph = helper.make_graph(
        nodes, "big",
        [helper.make_tensor_value_info("theta", TensorProto.FLOAT, ["N", 2, 3]),
         helper.make_tensor_value_info("size", TensorProto.INT64, [4])],
        [helper.make_tensor_value_info("rot", TensorProto.FLOAT, ["N", "H", "W", 2])] +
        [helper.make_tensor_value_info(f"s{i}", TensorProto.FLOAT, []) for i in range(16)],
        initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("custom.ops", 1)],
                              ir_version=8)
    path = folder / "big.onnx"
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location="big.data", size_threshold=1024)
    return path


def rss_of(command: list[str]) -> tuple[float, float]:
    """Wall seconds and the child's own peak RSS (MiB). ``command`` is a module name (run
    as ``python -m``) or a script path, then its arguments; a small wrapper runs it and
    reports the peak resident set (VmHWM) of that process alone."""
    wrapper = WRAPPER
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", wrapper, *command], check=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    line = [x for x in result.stderr.splitlines() if x.startswith("RSS")][-1]
    return elapsed, int(line.split()[1]) / 1024


def import_time(repeat: int) -> float:
    """Median seconds to import the CLI in a fresh process (what every run pays first)."""
    code = ("import time; start = time.perf_counter(); import decomposer.cli; "
            "print(time.perf_counter() - start)")
    return statistics.median(
        float(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                             text=True).stdout) for _ in range(repeat))


def in_process(model: onnx.ModelProto, repeat: int) -> float:
    """Median seconds of ``decomposer.decompose(model)`` (checks on), after one warm-up."""
    import decomposer

    decomposer.decompose(model)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        decomposer.decompose(model)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def target_opset_cost(model: onnx.ModelProto, target: int, repeat: int
                      ) -> tuple[float, float]:
    """Median seconds of ``decompose(model)`` and ``decompose(model, target_opset=target)``
    in process, the two alternating, after one warm-up each."""
    import decomposer

    decomposer.decompose(model)
    decomposer.decompose(model, target_opset=target)
    plain, down = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        decomposer.decompose(model)
        plain.append(time.perf_counter() - start)
        start = time.perf_counter()
        decomposer.decompose(model, target_opset=target)
        down.append(time.perf_counter() - start)
    return statistics.median(plain), statistics.median(down)


def _clear(folder: Path, model_name: str) -> None:
    for path in folder.glob(model_name + "*"):
        path.unlink()
    (folder / "baseline.data").unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[300, 3000, 30000])
    parser.add_argument("--weights-mib", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default="bench-results/bench_tool.json")
    parser.add_argument("--target-opset", type=int, default=13, metavar="N",
                        help="also time decompose() with --target-opset N on the "
                             "3,000-node chain (opset 17), against the plain run (0: skip)")
    args = parser.parse_args(argv)
    results: dict = {"scaling": [], "external": None, "import_s": import_time(args.repeat)}
    print(f"import decomposer.cli in a fresh process: {results['import_s']:.2f} s")
    with tempfile.TemporaryDirectory() as folder_name:
        folder = Path(folder_name)
        for count in args.nodes:
            src = folder / f"chain{count}.onnx"
            onnx.save(chain_model(count), src)
            times, peaks = [], []
            for _ in range(args.repeat):
                seconds, peak = rss_of(["decomposer", str(src), str(folder / "out.onnx"), "-q"])
                times.append(seconds)
                peaks.append(peak)
            row = {"nodes": count, "wall_s": statistics.median(times),
                   "peak_rss_mib": max(peaks),
                   "decompose_s": in_process(chain_model(count), args.repeat)}
            results["scaling"].append(row)
            print(f"{count:>6} custom nodes: CLI {row['wall_s']:.2f} s wall, "
                  f"peak RSS {row['peak_rss_mib']:.0f} MiB; decompose() in process "
                  f"{row['decompose_s']:.2f} s")
        base = results["scaling"][0]
        for row in results["scaling"]:
            row["time_ratio_to_smallest"] = row["wall_s"] / base["wall_s"]
            row["nodes_ratio_to_smallest"] = row["nodes"] / base["nodes"]

        if args.weights_mib:
            src = big_model(folder, args.weights_mib)
            script = folder / "load_save.py"
            script.write_text(LOAD_SAVE)
            tool, plain = [], []
            for _ in range(args.repeat):
                # Both write fresh files (a previous run's output is removed untimed): onnx's
                # save would otherwise append to its old data file, and decomposer would
                # pay for freeing its old one.
                _clear(folder, "out.onnx")
                os.sync()
                tool.append(rss_of(["decomposer", str(src), str(folder / "out.onnx"), "-q"]))
                _clear(folder, "baseline.onnx")
                os.sync()
                plain.append(rss_of([str(script), str(src), str(folder / "baseline.onnx")]))
            external = {
                "weights_mib": args.weights_mib,
                "decomposer_wall_s": statistics.median(t for t, _ in tool),
                "decomposer_peak_rss_mib": max(r for _, r in tool),
                "load_save_wall_s": statistics.median(t for t, _ in plain),
                "load_save_peak_rss_mib": max(r for _, r in plain),
            }
            external["wall_ratio"] = external["decomposer_wall_s"] / external["load_save_wall_s"]
            results["external"] = external
            print(f"{args.weights_mib} MiB external weights, 2 custom nodes: decomposer "
                  f"{external['decomposer_wall_s']:.2f} s / "
                  f"{external['decomposer_peak_rss_mib']:.0f} MiB peak vs onnx.load+save "
                  f"{external['load_save_wall_s']:.2f} s / "
                  f"{external['load_save_peak_rss_mib']:.0f} MiB peak: "
                  f"{external['wall_ratio']:.2f}x wall")
    if args.target_opset:
        plain, down = target_opset_cost(chain_model(3000), args.target_opset,
                                        max(args.repeat, 5))
        results["target_opset"] = {"target": args.target_opset, "plain_s": plain,
                                   "target_opset_s": down, "ratio": down / plain}
        print(f"3000 custom nodes, decompose() in process: plain {plain:.2f} s, "
              f"--target-opset {args.target_opset} {down:.2f} s: {down / plain:.2f}x")
    target = Path(args.json)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results, indent=2))
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
