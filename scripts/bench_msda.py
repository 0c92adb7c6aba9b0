"""Decomposed multi-scale deformable attention against the same formula exported by torch.

In: ``--rounds R`` (default 9), ``--threads T`` (default 1), ``--json FILE``.
Out: per query count (Deformable-DETR-like sizes: N=1, M=8 heads, D=32, L=4 levels of
100x150, 50x75, 25x38, 13x19, P=4 points; Lq 300 and 900), the median time of each variant
over interleaved rounds and the median ratio to the baseline:
- ``gridsample``: mmcv's pure-torch ``multi_scale_deform_attn_pytorch`` exported by torch's
  legacy exporter at opset 16 (one GridSample per level: what a model without the custom op
  exports), the baseline;
- ``decomposed``: mmdeploy's ``MMCVMultiScaleDeformableAttention`` node decomposed (no
  GridSample).
Both run on ONNX Runtime CPU with the same feeds; their outputs are compared before timing.
Used for the MSDA table of docs/performance.md.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

import decomposer  # noqa: E402
from decomposer.testing import ir_version_for  # noqa: E402

from benchlib import OrtRunner, interleaved_rounds, time_calls  # noqa: E402

LEVELS = [(100, 150), (50, 75), (25, 38), (13, 19)]
HEADS, CHANNELS, POINTS = 8, 32, 4


class PureTorch(torch.nn.Module):
    """mmcv's multi_scale_deform_attn_pytorch with the level sizes fixed, as models that do
    not use the CUDA op run it."""

    def forward(self, value, locations, weights):
        n, _, heads, channels = value.shape
        _, queries, _, levels, points, _ = locations.shape
        value_list = value.split([h * w for h, w in LEVELS], dim=1)
        grids = 2 * locations - 1
        sampled = []
        for level, (h, w) in enumerate(LEVELS):
            v = value_list[level].flatten(2).transpose(1, 2).reshape(n * heads, channels, h, w)
            g = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
            sampled.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros",
                                         align_corners=False))
        weights = weights.transpose(1, 2).reshape(n * heads, 1, queries, levels * points)
        out = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1)
        return out.view(n, heads * channels, queries).transpose(1, 2).contiguous()


def feeds(queries: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(queries)
    total = sum(h * w for h, w in LEVELS)
    return {"value": rng.standard_normal((1, total, HEADS, CHANNELS)).astype(np.float32),
            "locations": rng.random((1, queries, HEADS, len(LEVELS), POINTS, 2)
                                    ).astype(np.float32),
            "weights": rng.random((1, queries, HEADS, len(LEVELS), POINTS)).astype(np.float32)}


def gridsample_model(example: dict[str, np.ndarray]) -> onnx.ModelProto:
    buffer = io.BytesIO()
    names = ["value", "locations", "weights"]
    torch.onnx.export(PureTorch(), tuple(torch.from_numpy(example[k]) for k in names), buffer,
                      dynamo=False, opset_version=16, input_names=names, output_names=["y"],
                      dynamic_axes={"value": {0: "N"}, "locations": {0: "N", 1: "Lq"},
                                    "weights": {0: "N", 1: "Lq"}})
    return onnx.load_from_string(buffer.getvalue())


def custom_model() -> onnx.ModelProto:
    levels = len(LEVELS)
    starts = np.cumsum([0] + [h * w for h, w in LEVELS[:-1]]).astype(np.int64)
    inputs = [helper.make_tensor_value_info("value", TensorProto.FLOAT,
                                            ["N", "S", HEADS, CHANNELS]),
              helper.make_tensor_value_info("locations", TensorProto.FLOAT,
                                            ["N", "Lq", HEADS, levels, POINTS, 2]),
              helper.make_tensor_value_info("weights", TensorProto.FLOAT,
                                            ["N", "Lq", HEADS, levels, POINTS])]
    node = helper.make_node("MMCVMultiScaleDeformableAttention",
                            ["value", "shapes", "starts", "locations", "weights"], ["y"],
                            domain="mmdeploy", im2col_step=64)
    graph = helper.make_graph([node], "msda", inputs, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, [None] * 3)], initializer=[
            numpy_helper.from_array(np.array(LEVELS, np.int64), "shapes"),
            numpy_helper.from_array(starts, "starts")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16),
                                                   helper.make_opsetid("mmdeploy", 1)],
                             ir_version=ir_version_for(16))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    decomposed = decomposer.decompose(custom_model())
    rows = []
    print(f"MSDA, N=1, M={HEADS}, D={CHANNELS}, L={len(LEVELS)}, P={POINTS}, ORT "
          f"{args.threads} thread(s), {args.rounds} interleaved rounds")
    print(f"{'Lq':>5} {'GridSample ms':>14} {'decomposed ms':>14} {'ratio':>6}")
    for queries in (300, 900):
        example = feeds(queries)
        runners = {"gridsample": OrtRunner(gridsample_model(example), example, args.threads),
                   "decomposed": OrtRunner(decomposed, example, args.threads)}
        np.testing.assert_allclose(runners["decomposed"].result(),
                                   runners["gridsample"].result(), atol=1e-4, rtol=1e-4)
        _, times, ratios = interleaved_rounds(runners, "gridsample", args.rounds, time_calls)
        row = {"queries": queries, "threads": args.threads,
               "gridsample_ms": 1e3 * float(np.median(times["gridsample"])),
               "decomposed_ms": 1e3 * float(np.median(times["decomposed"])),
               "ratio": float(np.median(ratios["decomposed"]))}
        rows.append(row)
        print(f"{queries:>5} {row['gridsample_ms']:>14.2f} {row['decomposed_ms']:>14.2f} "
              f"{row['ratio']:>6.2f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
