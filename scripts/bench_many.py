"""Many models in one run against one model's run: the release-pipeline step's cost.

In: ``--models N`` (default 200), ``--jobs J`` (default: the CPU count), ``--rounds R``
(default 3), ``--json FILE``. Out: the median wall time of ``python -m decomposer ONE OUT``
on the largest model (imports included: what a shell loop pays per model), of
``python -m decomposer FOLDER -o OUT_DIR -j J`` on N models (a mix of the seed STN and the
examples of the affine grid, rotation, GridSample and ATen patterns), the goal
``2 x one + 0.05 s x N``, and the peak memory (max RSS) of each: the single run's, and the
batch's largest process (the parent or a worker). Rounds alternate the two commands.
Used for the many-models rows of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from decomposer.examples import example_models  # noqa: E402
from decomposer.registry import build_registry  # noqa: E402

MIX = ("affine_grid", "rot90", "rot90_and_scale", "custom_rot_scale", "grid_sample",
       "tril_triu", "cummax_cummin", "searchsorted", "linalg_inv", "linalg_solve",
       "scaled_dot_product_attention")


def _models(count: int, folder: Path) -> list[Path]:
    pool: list[onnx.ModelProto] = [onnx.load(ROOT / "tests" / "data" / "stn_custom.onnx")]
    for entry in build_registry(entry_points=False):
        module = type(entry.pattern).__module__.rsplit(".", 1)[-1]
        if module in MIX:
            for example in entry.pattern.examples:
                pool += [model for _, model in example_models(entry.pattern, example)]
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        path = folder / f"model_{index:03d}.onnx"
        onnx.save(pool[index % len(pool)], path)
        paths.append(path)
    return paths


_MEASURE = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:], "
            "capture_output=True); sys.stderr.buffer.write(done.stderr); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
            "sys.exit(done.returncode)")


def _run(command: list[str]) -> tuple[float, int]:
    """(seconds, max RSS in KiB of the command's largest process: itself or a worker),
    measured by a fresh wrapper process whose only children are the command's."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", _MEASURE, *command], capture_output=True,
                          text=True, cwd=ROOT)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{command}: exit {done.returncode}: {done.stderr[-500:]}")
    return seconds, int(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-many-"))
    try:
        paths = _models(args.models, work / "in")
        largest = max(paths, key=lambda p: p.stat().st_size)
        single_times, batch_times = [], []
        single_rss = batch_rss = 0
        for _ in range(args.rounds):
            out_dir = work / "out"
            shutil.rmtree(out_dir, ignore_errors=True)
            seconds, rss = _run([sys.executable, "-m", "decomposer", str(largest),
                                 str(work / "one.onnx"), "-q"])
            single_times.append(seconds)
            single_rss = max(single_rss, rss)
            seconds, rss = _run([sys.executable, "-m", "decomposer", str(work / "in"), "-o",
                                 str(out_dir), "-j", str(args.jobs), "-q"])
            batch_times.append(seconds)
            batch_rss = max(batch_rss, rss)
        one, many = statistics.median(single_times), statistics.median(batch_times)
        goal = 2 * one + 0.05 * args.models
        row = {"models": args.models, "jobs": args.jobs, "one_model_s": round(one, 3),
               "many_s": round(many, 3), "goal_s": round(goal, 3), "met": many <= goal,
               "per_model_ms": round(1000 * (many - one) / args.models, 2),
               "one_model_max_rss_mib": round(single_rss / 1024, 1),
               "many_max_rss_mib": round(batch_rss / 1024, 1)}
        print(f"one model: {one:.2f} s; {args.models} models, -j {args.jobs}: {many:.2f} s "
              f"(goal {goal:.2f} s: {'met' if row['met'] else 'MISSED'}); max RSS "
              f"{row['one_model_max_rss_mib']} MiB one, {row['many_max_rss_mib']} MiB many")
        if args.json:
            args.json.write_text(json.dumps(row, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
