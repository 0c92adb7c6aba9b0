"""Time the STN exported by ``decomposer.torch.export`` against torch's own dynamo export.

In: nothing required; ``--quick`` for a short run, ``--rounds N``, ``--threads 1 2``,
``--json FILE``. Needs torch and onnxscript (``pip install -e ".[bench]"``).
Out: a table on stdout (and JSON with ``--json``): per case and thread count, the median
ONNX Runtime time of each export and the median of per-round ratios torch / decomposer
(above 1: decomposer's model is faster).

The model is the plain spatial transformer (``scripts/seed_models.py``'s ``ClassicSTN``: a
3x3 Conv predicts theta, ``F.affine_grid(theta, x.size())``, ``F.grid_sample``), exported
at opset 18:
- ``decomposer``: ``decomposer.torch.export`` with batch, H and W dynamic (one model for
  every size);
- ``torch_dynamo``: ``torch.onnx.export(dynamo=True)`` at the case's size. It has to be
  static: torch bakes H and W into a base grid (``dynamic_shapes`` for them is dropped or
  refused), so it is re-exported per size;
- ``torch_eager``: the model in torch itself (``torch.no_grad``).
align_corners=0 keeps ONNX Runtime's fast GridSample kernel in both exports (decomposer
only rewrites the AffineGrid); align_corners=1 is off that fast path, so decomposer.torch
decomposes the GridSample too.

Every variant runs in one process, interleaved in a random order each round; ORT sessions
use pre-made OrtValue feeds, intra-op spinning off and the given thread count; torch uses
the same thread count.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import decomposer.torch as dtorch  # noqa: E402

from seed_models import ClassicSTN  # noqa: E402

CASES = [  # (label, input shape (N, 3, H, W), align_corners)
    ("N=8 64x64", (8, 3, 64, 64), False),
    ("N=8 256x256", (8, 3, 256, 256), False),
    ("N=1 512x512", (1, 3, 512, 512), False),
    ("N=8 64x64 align", (8, 3, 64, 64), True),
    ("N=1 512x512 align", (1, 3, 512, 512), True),
]
QUICK_CASES = [CASES[0], CASES[2], CASES[4]]
OPSET = 18
VARIANTS = ("decomposer", "torch_dynamo", "torch_eager")


class OrtRunner:
    def __init__(self, path: Path, feeds: dict[str, np.ndarray], threads: int) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(path), options,
                                            providers=["CPUExecutionProvider"])
        names = [i.name for i in self.session.get_inputs()]
        self.feeds = {name: ort.OrtValue.ortvalue_from_numpy(value)
                      for name, value in zip(names, feeds.values(), strict=True)}
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.run_options = ort.RunOptions()

    def __call__(self) -> None:
        self.session.run_with_ort_values(self.outputs, self.feeds, self.run_options)

    def result(self) -> np.ndarray:
        return self.session.run_with_ort_values(self.outputs, self.feeds,
                                                self.run_options)[0].numpy()


def _time(function: Callable[[], object], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        function()
    return (time.perf_counter() - start) / repeat


def export_both(model: torch.nn.Module, example: torch.Tensor, folder: Path
                ) -> tuple[Path, Path]:
    ours = folder / "decomposer.onnx"
    dtorch.export(model, (example,), ours, opset_version=OPSET,
                  dynamic_shapes={"x": {0: "n", 2: "h", 3: "w"}})
    theirs = folder / "torch_dynamo.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), str(theirs), dynamo=True, opset_version=OPSET,
                          verbose=False)
    return ours, theirs


def bench_case(label: str, shape: tuple[int, ...], align: bool, threads: list[int],
               rounds: int) -> list[dict]:
    torch.manual_seed(0)
    model = ClassicSTN(align_corners=align).eval()
    example = torch.randn(*shape)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        ours, theirs = export_both(model, example, Path(scratch))
        nodes = {name: len(onnx.load(path, load_external_data=False).graph.node)
                 for name, path in (("decomposer", ours), ("torch_dynamo", theirs))}
        for count in threads:
            torch.set_num_threads(count)
            feeds = {"x": example.numpy()}
            runners: dict[str, Callable[[], object]] = {
                "decomposer": OrtRunner(ours, feeds, count),
                "torch_dynamo": OrtRunner(theirs, feeds, count)}
            with torch.no_grad():
                expected = model(example).numpy()

                def eager() -> object:
                    with torch.no_grad():
                        return model(example)

                runners["torch_eager"] = eager
                for name in ("decomposer", "torch_dynamo"):
                    got = runners[name].result()  # type: ignore[attr-defined]
                    np.testing.assert_allclose(got, expected, atol=1e-3, rtol=1e-3,
                                               err_msg=f"{name} differs from eager")
            once = min(_time(runner, 1) for runner in runners.values())
            repeat = max(1, min(50, int(0.05 / max(once, 1e-6))))
            for runner in runners.values():  # warm up
                _time(runner, repeat)
            times: dict[str, list[float]] = {name: [] for name in runners}
            ratios: list[float] = []
            for _ in range(rounds):
                order = list(runners)
                random.shuffle(order)
                measured = {name: _time(runners[name], repeat) for name in order}
                for name, value in measured.items():
                    times[name].append(value)
                ratios.append(measured["torch_dynamo"] / measured["decomposer"])
            rows.append({
                "case": label, "shape": list(shape), "align_corners": align,
                "threads": count, "nodes": nodes,
                "median_ms": {name: 1e3 * statistics.median(v) for name, v in times.items()},
                "torch_over_decomposer": statistics.median(ratios),
                "eager_over_decomposer": statistics.median(
                    [e / d for e, d in zip(times["torch_eager"], times["decomposer"],
                                           strict=True)])})
    return rows


def print_table(rows: list[dict]) -> None:
    header = (f"{'case':<20} {'thr':>3} {'decomposer ms':>14} {'torch dynamo ms':>16} "
              f"{'torch eager ms':>15} {'dynamo/decomp':>14} {'eager/decomp':>13}")
    print(header)
    print("-" * len(header))
    for row in rows:
        ms = row["median_ms"]
        print(f"{row['case']:<20} {row['threads']:>3} {ms['decomposer']:>14.3f} "
              f"{ms['torch_dynamo']:>16.3f} {ms['torch_eager']:>15.3f} "
              f"{row['torch_over_decomposer']:>13.2f}x {row['eager_over_decomposer']:>12.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="three cases, 7 rounds")
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--threads", type=int, nargs="+", default=[1])
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    logging.getLogger("torch").setLevel(logging.ERROR)
    random.seed(0)
    rounds = 7 if args.quick else args.rounds
    rows: list[dict] = []
    for label, shape, align in (QUICK_CASES if args.quick else CASES):
        print(f"  {label} ...", file=sys.stderr, flush=True)
        rows.extend(bench_case(label, shape, align, args.threads, rounds))
    print(f"torch {torch.__version__}, onnxruntime {ort.__version__}, "
          f"{platform.processor() or platform.machine()}, opset {OPSET}, "
          f"{rounds} rounds, medians")
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps({"rounds": rounds, "opset": OPSET, "rows": rows},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
