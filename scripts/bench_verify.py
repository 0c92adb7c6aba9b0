"""Benchmark ``--verify`` at deployment size: the seed STN at image 1x3xSxS, size=1,64,S,S.

In: ``--size 512`` (S), ``--repeats 3``, ``--full-size 0`` (also time ``--verify=full`` at
that S; 0 skips it: it runs the whole model in numpy), ``--json FILE``.
Out: a table and JSON (default ``bench-results/bench_verify.json``) with, per step, the
median wall time and peak RSS of a fresh process, as users run it:

- ``decompose``: the CLI without ``--verify``;
- ``ort run``: an ONNX Runtime session of the decomposed model plus one run on the same
  inputs (a process that imports only numpy and onnxruntime);
- ``references``: the replaced nodes' numpy references on the tensors that reach them;
- ``verify --runs 1`` and ``verify`` (default ``--runs 2``): the CLI with ``--verify``.

Goals (issue 14): ``verify --runs 1`` at most 3x (decompose + ort run + references) and under
10 s; its peak RSS at most 2x the ``ort run`` process's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEED = ROOT / "tests" / "data" / "stn_custom.onnx"

# Runs a module or script, then prints the process's wall time and peak RSS (VmHWM: unlike
# ru_maxrss it does not carry the parent's memory over an exec).
WRAPPER = """
import runpy, sys, time
start = time.perf_counter()
sys.argv = sys.argv[1:]
try:
    if sys.argv[0].endswith(".py"):
        runpy.run_path(sys.argv[0], run_name="__main__")
    else:
        runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit as exit_:
    assert not exit_.code, exit_.code
peak_kib = next(int(line.split()[1]) for line in open("/proc/self/status")
                if line.startswith("VmHWM:"))
print("MEASURED", time.perf_counter() - start, peak_kib, file=sys.stderr)
"""

# One ONNX Runtime session and run, as a deployment would do it (inputs as --verify makes).
ORT_ONCE = """
import sys, time
import numpy as np
import onnxruntime as ort
path, size = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
feeds = {"image": rng.uniform(-1, 1, (1, 3, size, size)).astype(np.float32),
         "theta": rng.uniform(-1, 1, (1, 2, 3)).astype(np.float32),
         "size": np.array([1, 64, size, size], np.int64)}
start = time.perf_counter()
options = ort.SessionOptions()
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
session.run(None, feeds)
print("STEP", time.perf_counter() - start, file=sys.stderr)
"""

# The replaced nodes' references on the tensors that reach them (captured on ORT first).
REFERENCES = """
import sys, time
import numpy as np
import onnx, onnxruntime as ort
import decomposer
from decomposer.capture import executions, find_replaced, instrument
original = onnx.load(sys.argv[1])
size = int(sys.argv[2])
clean = decomposer.decompose(original)
replaced, _ = find_replaced(original, clean, decomposer.default_registry())
model, taps, _ = instrument(clean, replaced)
rng = np.random.default_rng(0)
feeds = {"image": rng.uniform(-1, 1, (1, 3, size, size)).astype(np.float32),
         "theta": rng.uniform(-1, 1, (1, 2, 3)).astype(np.float32),
         "size": np.array([1, 64, size, size], np.int64)}
session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
names = [o.name for o in session.get_outputs()]
fetched = {**feeds, **dict(zip(names, session.run(names, feeds)))}
start = time.perf_counter()
for tap in taps:
    for run in executions(tap, fetched):
        tap.replaced.pattern.evaluate(tap.replaced.form, run.inputs, tap.replaced.attrs)
print("STEP", time.perf_counter() - start, file=sys.stderr)
"""


def measure(args: list[str]) -> dict[str, float]:
    """Wall time and peak RSS of ``python WRAPPER args`` (and a STEP time it reports)."""
    result = subprocess.run([sys.executable, "-c", WRAPPER, *args], capture_output=True,
                            text=True, cwd=ROOT)
    if result.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{result.stderr}")
    found: dict[str, float] = {}
    for line in result.stderr.splitlines():
        if line.startswith("MEASURED"):
            _, wall, peak = line.split()
            found.update(wall_s=float(wall), peak_mib=int(peak) / 1024)
        elif line.startswith("STEP"):
            found["step_s"] = float(line.split()[1])
    return found


def median_of(repeats: int, args: list[str]) -> dict[str, float]:
    samples = [measure(args) for _ in range(repeats)]
    return {key: statistics.median(s[key] for s in samples) for key in samples[0]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=512, help="image and grid side (512)")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per step (3)")
    parser.add_argument("--full-size", type=int, default=0,
                        help="also time --verify=full at this side (0: skip)")
    parser.add_argument("--json", default=str(ROOT / "bench-results" / "bench_verify.json"))
    args = parser.parse_args(argv)
    size = args.size
    with tempfile.TemporaryDirectory() as folder:
        out = os.path.join(folder, "clean.onnx")
        cli = ["decomposer", str(SEED), out, "-q"]
        verify = [*cli, "--verify", "--input-shape", f"image:1x3x{size}x{size}",
                  "--input-value", f"size=1,64,{size},{size}"]
        steps = {"decompose": median_of(args.repeats, cli)}
        script = Path(folder) / "ort_once.py"
        script.write_text(ORT_ONCE)
        steps["ort run"] = median_of(args.repeats, [str(script), out, str(size)])
        script = Path(folder) / "references.py"
        script.write_text(REFERENCES)
        steps["references"] = median_of(args.repeats, [str(script), str(SEED), str(size)])
        steps["verify --runs 1"] = median_of(args.repeats, [*verify, "--runs", "1"])
        steps["verify"] = median_of(args.repeats, verify)
        if args.full_size:
            full = args.full_size
            steps[f"verify=full at {full}"] = median_of(1, [
                *cli, "--verify=full", "--input-shape", f"image:1x3x{full}x{full}",
                "--input-value", f"size=1,64,{full},{full}", "--runs", "1"])

    budget = (steps["decompose"]["wall_s"] + steps["ort run"]["step_s"]
              + steps["references"]["step_s"])
    fast = steps["verify --runs 1"]
    goals = {
        "baseline_s": budget,
        "time_ratio": fast["wall_s"] / budget,
        "memory_ratio": fast["peak_mib"] / steps["ort run"]["peak_mib"],
        "time_ok": fast["wall_s"] <= 3 * budget and fast["wall_s"] < 10,
        "memory_ok": fast["peak_mib"] <= 2 * steps["ort run"]["peak_mib"],
    }
    print(f"seed STN, image 1x3x{size}x{size}, size=1,64,{size},{size}; medians of "
          f"{args.repeats} fresh processes")
    print(f"{'step':<22} {'wall s':>8} {'step s':>8} {'peak MiB':>9}")
    for name, row in steps.items():
        step = f"{row['step_s']:.3f}" if "step_s" in row else "-"
        print(f"{name:<22} {row['wall_s']:>8.2f} {step:>8} {row['peak_mib']:>9.0f}")
    print(f"baseline (decompose wall + ort session and run + references): "
          f"{budget:.2f} s; verify --runs 1 = {goals['time_ratio']:.2f}x it "
          f"(goal <= 3x and < 10 s: {'met' if goals['time_ok'] else 'NOT met'}); peak RSS "
          f"{goals['memory_ratio']:.2f}x the ORT run's (goal <= 2x: "
          f"{'met' if goals['memory_ok'] else 'NOT met'})")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"size": size, "repeats": args.repeats,
                                           "steps": steps, "goals": goals}, indent=2) + "\n")
    return 0 if goals["time_ok"] and goals["memory_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
