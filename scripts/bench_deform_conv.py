"""Decomposed DeformConv against ONNX Runtime's native DeformConv-19, side by side.

In: ``--rounds R`` (default 11), ``--threads T`` (default 1), ``--json FILE``.
Out: per case (N=1, C 64 -> 64, 3x3, pads 1, mask and bias; 64x64 and 128x128 with offset
groups 1 and 4, and a tiny 8x8), the median time of each variant over interleaved rounds,
the median ratio to native, and each session's peak resident memory growth (run in a fresh
subprocess per variant, so one's allocations do not hide the other's). The outputs are
checked against each other before timing. Used for the DeformConv table of
docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

import decomposer  # noqa: E402
from decomposer.testing import ir_version_for  # noqa: E402

from benchlib import OrtRunner, interleaved_rounds, time_calls  # noqa: E402

CASES = [(64, 1), (64, 4), (128, 1), (128, 4), (8, 1)]
CHANNELS = 64


def case_model(size: int, offset_group: int, opset: int) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(size * 10 + offset_group)
    taps = 9
    arrays = {
        "x": rng.standard_normal((1, CHANNELS, size, size)).astype(np.float32),
        "weight": (rng.standard_normal((CHANNELS, CHANNELS, 3, 3)) * 0.1).astype(np.float32),
        "offset": (rng.standard_normal((1, 2 * offset_group * taps, size, size)) * 2
                   ).astype(np.float32),
        "bias": rng.standard_normal(CHANNELS).astype(np.float32),
        "mask": rng.random((1, offset_group * taps, size, size)).astype(np.float32),
    }
    dynamic = {"x": ["N", CHANNELS, "H", "W"], "offset": ["N", 2 * offset_group * taps,
                                                          "h", "w"],
               "mask": ["N", offset_group * taps, "h", "w"]}
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                            dynamic.get(name, list(array.shape)))
              for name, array in arrays.items()]
    node = helper.make_node("DeformConv", list(arrays), ["y"], pads=[1, 1, 1, 1],
                            offset_group=offset_group, kernel_shape=[3, 3])
    graph = helper.make_graph([node], "dcn", inputs, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [None] * 4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=ir_version_for(opset))
    return model, arrays


def variants(size: int, offset_group: int) -> dict[str, onnx.ModelProto]:
    native, _ = case_model(size, offset_group, 19)
    below, _ = case_model(size, offset_group, 18)
    return {"native": native, "decomposed": decomposer.decompose(below)}


def peak_memory(size: int, offset_group: int, variant: str, threads: int) -> float:
    """MiB of peak RSS growth of one session's first runs, in a fresh process."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            "import resource, bench_deform_conv as b; "
            f"m = b.variants({size}, {offset_group})[{variant!r}]; "
            f"_, f = b.case_model({size}, {offset_group}, 19); "
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
            f"r = b.OrtRunner(m, f, {threads}); r(); r(); "
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = []
    print(f"DeformConv, N=1, C {CHANNELS} -> {CHANNELS}, 3x3, ORT {args.threads} thread(s), "
          f"{args.rounds} interleaved rounds")
    print(f"{'size':>8} {'OG':>3} {'native ms':>10} {'ours ms':>9} {'ratio':>6} "
          f"{'native MiB':>11} {'ours MiB':>9}")
    for size, offset_group in CASES:
        models = variants(size, offset_group)
        _, feeds = case_model(size, offset_group, 19)
        runners = {name: OrtRunner(model, feeds, args.threads)
                   for name, model in models.items()}
        np.testing.assert_allclose(runners["decomposed"].result(), runners["native"].result(),
                                   atol=1e-3, rtol=1e-3)
        _, times, ratios = interleaved_rounds(runners, "native", args.rounds, time_calls)
        memory = {name: peak_memory(size, offset_group, name, args.threads) for name in models}
        row = {"size": size, "offset_group": offset_group, "threads": args.threads,
               "native_ms": 1e3 * float(np.median(times["native"])),
               "decomposed_ms": 1e3 * float(np.median(times["decomposed"])),
               "ratio": float(np.median(ratios["decomposed"])),
               "native_peak_mib": memory["native"], "decomposed_peak_mib": memory["decomposed"]}
        rows.append(row)
        print(f"{size:>4}x{size:<3} {offset_group:>3} {row['native_ms']:>10.2f} "
              f"{row['decomposed_ms']:>9.2f} {row['ratio']:>6.2f} "
              f"{row['native_peak_mib']:>11.1f} {row['decomposed_peak_mib']:>9.1f}",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
