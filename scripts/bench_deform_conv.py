"""Decomposed DeformConv against ONNX Runtime's native DeformConv-19, side by side.

In: ``--rounds R`` (default 11), ``--threads T`` (default 1), ``--json FILE``, ``--static``
(static N, H, W instead of dynamic dims).
Out: per case (N=1, C 64 -> 64, 3x3, pads 1, mask and bias; 64x64 and 128x128 with offset
groups 1 and 4, a tiny 8x8, N=2 C 16 -> 16 at 16x16, and 100x100: with static sizes its
image is padded to 128x128 first), the median time of each variant
over interleaved rounds, the median ratio to native, and each session's peak resident memory
growth (run in a fresh subprocess per variant, so one's allocations do not hide the
other's). The variants: ONNX Runtime's DeformConv-19; the decomposition at opset 18 (its
GridSample form); the same with GridSample avoided (``--lower GridSample``: the gather form
that opsets below 16 and TensorRT get); and at offset group 1 a straightforward gather-based
decomposition (``Naive`` below: per kernel tap, one GatherND per bilinear corner on the
zero-padded NHWC input, the K taps concatenated, one MatMul), the baseline both must beat.
The outputs are checked against each other before timing.
Used for the DeformConv table of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

import decomposer  # noqa: E402
from decomposer.builder import Builder, Value  # noqa: E402
from decomposer.pattern import MatchedNode  # noqa: E402
from decomposer.patterns.deform_conv import DeformConv, Facts  # noqa: E402
from decomposer.registry import build_registry  # noqa: E402
from decomposer.testing import ir_version_for  # noqa: E402

from benchlib import OrtRunner, interleaved_rounds, time_calls  # noqa: E402

# (size, offset groups, batch, channels)
CASES = [(64, 1, 1, 64), (64, 4, 1, 64), (128, 1, 1, 64), (128, 4, 1, 64), (8, 1, 1, 64),
         (16, 1, 2, 16), (100, 1, 1, 64)]


def case_model(size: int, offset_group: int, opset: int, batch: int = 1, channels: int = 64,
               static: bool = False) -> tuple[onnx.ModelProto, dict]:
    rng = np.random.default_rng(size * 10 + offset_group)
    taps = 9
    arrays = {
        "x": rng.standard_normal((batch, channels, size, size)).astype(np.float32),
        "weight": (rng.standard_normal((channels, channels, 3, 3)) * 0.1).astype(np.float32),
        "offset": (rng.standard_normal((batch, 2 * offset_group * taps, size, size)) * 2
                   ).astype(np.float32),
        "bias": rng.standard_normal(channels).astype(np.float32),
        "mask": rng.random((batch, offset_group * taps, size, size)).astype(np.float32),
    }
    dynamic = {"x": ["N", channels, "H", "W"], "offset": ["N", 2 * offset_group * taps,
                                                          "h", "w"],
               "mask": ["N", offset_group * taps, "h", "w"]}
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                            list(array.shape) if static else
                                            dynamic.get(name, list(array.shape)))
              for name, array in arrays.items()]
    node = helper.make_node("DeformConv", list(arrays), ["y"], pads=[1, 1, 1, 1],
                            offset_group=offset_group, kernel_shape=[3, 3])
    graph = helper.make_graph([node], "dcn", inputs, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [None] * 4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              ir_version=ir_version_for(opset))
    return model, arrays


class Naive(DeformConv):
    """The straightforward decomposition (group 1, float32, static sizes from the model):
    per tap and bilinear corner, a GatherND of [n, y, x] rows of the padded NHWC input."""

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        x = b.input(node.tensor("x"), np.float32)
        offset = b.input(node.tensor("offset"), np.float32)
        mask = b.input(node.tensor("mask"), np.float32)
        weight = b.input(node.tensor("weight"), np.float32)
        taps, og = facts.kernel[0] * facts.kernel[1], facts.offset_group
        assert og == 1 and facts.group == 1, "the naive form covers offset group 1 only"
        shape = b.Shape(offset, hint="offset_shape")
        n = b.Gather(shape, 0, axis=0)
        ho, wo = b.Gather(shape, 2, axis=0), b.Gather(shape, 3, axis=0)
        padded = b.Transpose(b.Pad(x, [0, 0, 1, 1, 0, 0, 1, 1], np.float32(0)), [0, 2, 3, 1])
        sizes = b.Cast(b.Shape(x, 2, 4), np.float32)
        height, width = b.Gather(sizes, [0], axis=0), b.Gather(sizes, [1], axis=0)
        batch = b.Unsqueeze(b.Cast(b.Range(0, n, 1), np.float32), [1, 2])  # (N, 1, 1)
        rows = b.Unsqueeze(b.Cast(b.Range(0, ho, 1), np.float32), [1])  # (Ho, 1)
        cols = b.Unsqueeze(b.Cast(b.Range(0, wo, 1), np.float32), [0])  # (1, Wo)
        columns: list[Value] = []
        for k in range(taps):
            i, j = divmod(k, facts.kernel[1])
            dy = b.Squeeze(b.Slice(offset, [2 * k], [2 * k + 1], [1]), [1])  # (N, Ho, Wo)
            dx = b.Squeeze(b.Slice(offset, [2 * k + 1], [2 * k + 2], [1]), [1])
            m = b.Unsqueeze(b.Squeeze(b.Slice(mask, [k], [k + 1], [1]), [1]), [3])
            y = b.Min(b.Max(rows * float(facts.strides[0]) - float(facts.pads[0])
                            + float(i * facts.dilations[0]) + dy, -1.0), height)
            xc = b.Min(b.Max(cols * float(facts.strides[1]) - float(facts.pads[1])
                             + float(j * facts.dilations[1]) + dx, -1.0), width)
            y0, x0 = b.Floor(y), b.Floor(xc)
            fy, fx = y - y0, xc - x0
            total: Value | None = None
            for cy, wy in ((0.0, 1.0 - fy), (1.0, fy)):
                for cx, wx in ((0.0, 1.0 - fx), (1.0, fx)):
                    ty = b.Min(y0 + (cy + 1.0), height + 1.0)
                    tx = b.Min(x0 + (cx + 1.0), width + 1.0)
                    index = b.Cast(b.Concat(*(b.Unsqueeze(v + 0.0 * y, [3])
                                              for v in (batch, ty, tx)), axis=3), np.int64)
                    term = b.GatherND(padded, index) * b.Unsqueeze(wy * wx, [3])
                    total = term if total is None else total + term
            assert total is not None
            columns.append(total * m)  # (N, Ho, Wo, C)
        cols_all = b.Concat(*columns, axis=3)  # (N, Ho, Wo, K*C), k-major
        w_view = b.Reshape(weight, [1, -1, facts.channels, taps])
        w_matrix = b.Reshape(b.Transpose(w_view, [0, 3, 2, 1]), [taps * facts.channels, -1])
        y_out = b.MatMul(cols_all, w_matrix) + b.input(node.tensor("bias"), np.float32)
        b.Transpose(y_out, [0, 3, 1, 2], out=node.outputs[0])


def variants(size: int, offset_group: int, batch: int, channels: int, static: bool = False
             ) -> dict[str, onnx.ModelProto]:
    native, _ = case_model(size, offset_group, 19, batch, channels, static)
    below, _ = case_model(size, offset_group, 18, batch, channels, static)
    found = {"native": native, "decomposed": decomposer.decompose(below),
             "gathers": decomposer.decompose(below, lower=["GridSample"])}
    if offset_group == 1:
        naive = build_registry(entry_points=False)
        naive.register(Naive(), source="bench", override=True)
        found["naive"] = decomposer.decompose(below, registry=naive)
    return found


_PEAK = """
import sys
import numpy as np
import onnxruntime as ort

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])

feeds = dict(np.load(sys.argv[2]))
options = ort.SessionOptions()
options.intra_op_num_threads = int(sys.argv[3])
with open("/proc/self/clear_refs", "w") as reset:  # the peak so far (imports) is forgotten
    reset.write("5")
before = status("VmRSS:")
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
session.run(None, feeds)
session.run(None, feeds)
print((status("VmHWM:") - before) / 1024)
"""


def peak_memory(model: onnx.ModelProto, feeds: dict, threads: int) -> float:
    """MiB of peak RSS growth from creating one session to its second run, in a fresh
    process that only loads the model file and the feeds (nothing else to hide it)."""
    with tempfile.TemporaryDirectory() as folder:
        model_path, feeds_path = Path(folder) / "m.onnx", Path(folder) / "feeds.npz"
        onnx.save(model, model_path)
        np.savez(feeds_path, **feeds)
        done = subprocess.run([sys.executable, "-c", _PEAK, str(model_path), str(feeds_path),
                               str(threads)], capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--static", action="store_true",
                        help="static N, H, W (the pattern then sizes its GridSample chunks by "
                             "the columns; default: dynamic dims, a kernel row at a time)")
    args = parser.parse_args(argv)
    rows = []
    print(f"DeformConv, C -> C, 3x3, ORT {args.threads} thread(s), {args.rounds} interleaved "
          f"rounds; 'gathers': the GridSample-free form")
    print(f"{'N':>2} {'C':>3} {'size':>8} {'OG':>3} {'native ms':>10} {'ours ms':>9} "
          f"{'ratio':>6} {'gathers':>8} {'naive ms':>9} {'ours/naive':>10} {'native MiB':>11} "
          f"{'ours MiB':>9} {'gathers MiB':>11}")
    for size, offset_group, batch, channels in CASES:
        models = variants(size, offset_group, batch, channels, args.static)
        _, feeds = case_model(size, offset_group, 19, batch, channels)
        runners = {name: OrtRunner(model, feeds, args.threads)
                   for name, model in models.items()}
        for name in runners:
            np.testing.assert_allclose(runners[name].result(), runners["native"].result(),
                                       atol=1e-3, rtol=1e-3, err_msg=name)
        _, times, ratios = interleaved_rounds(runners, "native", args.rounds, time_calls)
        memory = {name: peak_memory(models[name], feeds, args.threads)
                  for name in ("native", "decomposed", "gathers")}
        naive = float(np.median(times["naive"])) * 1e3 if "naive" in times else None
        over_naive = float(np.median(np.array(times["decomposed"]) / np.array(times["naive"]))) \
            if "naive" in times else None
        row = {"size": size, "offset_group": offset_group, "batch": batch,
               "channels": channels, "threads": args.threads,
               "native_ms": 1e3 * float(np.median(times["native"])),
               "decomposed_ms": 1e3 * float(np.median(times["decomposed"])),
               "ratio": float(np.median(ratios["decomposed"])),
               "gathers_ms": 1e3 * float(np.median(times["gathers"])),
               "gathers_ratio": float(np.median(ratios["gathers"])),
               "naive_ms": naive, "decomposed_over_naive": over_naive,
               "native_peak_mib": memory["native"], "decomposed_peak_mib": memory["decomposed"],
               "gathers_peak_mib": memory["gathers"]}
        rows.append(row)
        naive_cells = (f"{naive:>9.2f} {over_naive:>10.2f}" if naive is not None and
                       over_naive is not None else f"{'-':>9} {'-':>10}")
        print(f"{batch:>2} {channels:>3} {size:>4}x{size:<3} {offset_group:>3} "
              f"{row['native_ms']:>10.2f} {row['decomposed_ms']:>9.2f} {row['ratio']:>6.2f} "
              f"{row['gathers_ratio']:>8.2f} {naive_cells} {row['native_peak_mib']:>11.1f} "
              f"{row['decomposed_peak_mib']:>9.1f} {row['gathers_peak_mib']:>11.1f}",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
