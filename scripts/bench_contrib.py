"""Decomposed ONNX Runtime contrib ops against ONNX Runtime's own contrib kernels.

In: ``--rounds R`` (default 9), ``--threads T`` (default 1), ``--json FILE``.
Out: per op and size (BERT-base-like rows: hidden 768, 128 and 8 x 128 tokens), the median
time of the decomposed node and its median ratio to the contrib kernel (the baseline), on
ONNX Runtime CPU with its default optimizations (which re-fuse the decomposed
normalizations into its own kernels), over interleaved rounds; and the same decomposed
model with graph optimizations at ``basic`` (no fusion: what the elementwise ops cost).
Outputs are compared before timing. Ops with no CPU kernel (BiasAdd, BiasSplitGelu) are
left out. Attention: 12 heads, a 2-D mask padding the last quarter of the keys;
EmbedLayerNormalization: a 1000-word vocabulary, segments and the mask. Used for the
contrib-op table of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

import decomposer  # noqa: E402

from benchlib import OrtRunner, interleaved_rounds, time_calls  # noqa: E402

HIDDEN = 768


def _model(op: str, inputs: dict[str, np.ndarray], outputs: int, attrs: dict, domain: str,
           opset: int = 17, consumer: bool = False) -> onnx.ModelProto:
    infos = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype),
                                           list(a.shape)) for name, a in inputs.items()]
    names = [f"y{i}" for i in range(outputs)]
    # consumer: the first output feeds a Neg (the graph output), as in a model, where ONNX
    # Runtime's fusions may fire (they skip a subgraph whose result is a graph output)
    written = [f"op_{names[0]}", *names[1:]] if consumer else names
    node = helper.make_node(op, list(inputs), written, name="op", domain=domain, **attrs)
    rank = next(iter(inputs.values())).ndim + (op == "EmbedLayerNormalization")
    types = [TensorProto.INT32 if op == "EmbedLayerNormalization" and i == 1
             else TensorProto.FLOAT for i in range(outputs)]
    ranks = [1 if elem == TensorProto.INT32 else rank for elem in types]
    nodes = [node]
    if consumer:
        nodes.append(helper.make_node("Neg", [written[0]], [names[0]], name="next"))
    graph = helper.make_graph(nodes, "bench", infos,
                              [helper.make_tensor_value_info(n, elem, [None] * r)
                               for n, elem, r in zip(names, types, ranks, strict=True)])
    imports = [helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=imports, ir_version=8)


def cases(tokens: tuple[int, int], consumer: bool = False
          ) -> list[tuple[str, onnx.ModelProto, dict[str, np.ndarray]]]:
    rng = np.random.default_rng(0)

    def rows() -> np.ndarray:
        return rng.standard_normal((*tokens, HIDDEN)).astype(np.float32)

    def vector() -> np.ndarray:
        return rng.standard_normal(HIDDEN).astype(np.float32)

    found = []
    for op, inputs, outputs, attrs, domain in [
        ("Gelu", {"x": rows()}, 1, {}, "com.microsoft"),
        ("BiasGelu", {"x": rows(), "b": vector()}, 1, {}, "com.microsoft"),
        ("FastGelu", {"x": rows(), "b": vector()}, 1, {}, "com.microsoft"),
        ("QuickGelu", {"x": rows()}, 1, {"alpha": 1.702}, "com.microsoft"),
        ("SkipLayerNormalization", {"x": rows(), "s": rows(), "g": vector(), "be": vector(),
                                    "bi": vector()}, 1, {"epsilon": 1e-5}, "com.microsoft"),
        ("SkipLayerNormalization", {"x": rows(), "s": rows(), "g": vector(), "be": vector(),
                                    "bi": vector()}, 4, {"epsilon": 1e-5}, "com.microsoft"),
        ("SkipSimplifiedLayerNormalization", {"x": rows(), "s": rows(), "g": vector()}, 1,
         {"epsilon": 1e-5}, "com.microsoft"),
        ("SimplifiedLayerNormalization", {"x": rows(), "g": vector()}, 1, {"epsilon": 1e-5},
         ""),
    ]:
        label = f"{op}{' (4 outputs)' if outputs == 4 else ''}"
        found.append((label, _model(op, inputs, outputs, attrs, domain, consumer=consumer),
                      inputs))
    batch, sequence = tokens
    mask = np.ones((batch, sequence), np.int32)
    mask[:, sequence * 3 // 4:] = 0  # padded keys
    attention = {"x": rows(), "w": (rng.standard_normal((HIDDEN, 3 * HIDDEN)) * 0.05).astype(
        np.float32), "b": rng.standard_normal(3 * HIDDEN).astype(np.float32), "m": mask}
    found.append(("Attention (12 heads, 2-D mask)",
                  _model("Attention", attention, 1, {"num_heads": 12}, "com.microsoft"),
                  attention))
    embed = {"ids": rng.integers(0, 1000, tokens).astype(np.int32),
             "seg": rng.integers(0, 2, tokens).astype(np.int32),
             "we": rng.standard_normal((1000, HIDDEN)).astype(np.float32),
             "pe": rng.standard_normal((512, HIDDEN)).astype(np.float32),
             "se": rng.standard_normal((2, HIDDEN)).astype(np.float32),
             "g": vector(), "be": vector(), "m": mask}
    found.append(("EmbedLayerNormalization",
                  _model("EmbedLayerNormalization", embed, 2, {"epsilon": 1e-5},
                         "com.microsoft"), embed))
    return found


class Unfused(OrtRunner):
    """The decomposed model with ONNX Runtime's optimizations at ``basic``: no fusion."""

    def __init__(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                 threads: int) -> None:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(model.SerializeToString(), options,
                                            providers=["CPUExecutionProvider"])
        self.feeds = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.run_options = ort.RunOptions()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default="bench-results/bench_contrib.json")
    parser.add_argument("--consumer", action="store_true",
                        help="each node's first output feeds a Neg, as in a model (the "
                             "activations and norms; Attention and EmbedLayerNormalization "
                             "stay as they are)")
    parser.add_argument("--ops", default="", help="only these ops (comma-separated labels)")
    args = parser.parse_args(argv)
    rows = []
    print("| op | tokens | decomposed (fused by ORT) / kernel | decomposed, no fusion / "
          "kernel | kernel ms |\n|---|---|---|---|---|")
    for tokens in [(1, 128), (8, 128)]:
        for label, model, feeds in cases(tokens, args.consumer):
            if args.ops and label not in args.ops.split(","):
                continue
            out = decomposer.decompose(model)
            variants = {"kernel": OrtRunner(model, feeds, args.threads),
                        "decomposed": OrtRunner(out, feeds, args.threads),
                        "unfused": Unfused(out, feeds, args.threads)}
            want = variants["kernel"].results()
            for name in ("decomposed", "unfused"):
                for got, expected in zip(variants[name].results(), want, strict=True):
                    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
            _, times, ratios = interleaved_rounds(variants, "kernel", args.rounds, time_calls)
            row = {"op": label, "tokens": list(tokens),
                   "kernel_ms": statistics.median(times["kernel"]) * 1e3,
                   "ratio_fused": statistics.median(ratios["decomposed"]),
                   "ratio_unfused": statistics.median(ratios["unfused"])}
            rows.append(row)
            print(f"| {label} | {tokens[0]}x{tokens[1]} | {row['ratio_fused']:.2f}x | "
                  f"{row['ratio_unfused']:.2f}x | {row['kernel_ms']:.3f} |")
    target = Path(args.json)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"threads": args.threads, "rounds": args.rounds,
                                  "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
