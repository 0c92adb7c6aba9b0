"""A decoder written by the onnxruntime-genai model builder (GroupQueryAttention with rotary,
SkipSimplifiedLayerNormalization, MatMulNBits in int4), before and after decomposition.

In: ``--model DIR`` (a folder holding the builder's model.onnx, e.g. from
``python scripts/make_genai_model.py DIR --precision int4 --hidden 768 --heads 12
--kv-heads 4 --layers 4 --intermediate 2048 --vocab 4096 --positions 1024``), ``--rounds R``
(default 7), ``--threads T`` (default 1), ``--target portable|qdq`` (default portable),
``--json FILE``.
Out: per step (batch 1: a prompt of 128 and of 512 tokens with an empty cache, and one
decode step after 512 cached tokens), the median time of the builder's (fused) model on
ONNX Runtime CPU with its default optimizations (the baseline) and of the decomposed model
there; and on OpenVINO CPU (f32 precision hint) of the fused model (when OpenVINO can load
its ``com.microsoft`` nodes; else the reason it cannot) and of the decomposed model; with
the median per-round ratios decomposed / fused on each engine, all variants timed in the
same interleaved rounds. ``accuracy_level`` of MatMulNBits is set to 0 in the fused
baseline of the output check only (4 lets ONNX Runtime quantize the activations to int8,
which the portable decomposition, computing in float32, does not); the timed fused model is
the builder's, unchanged. Outputs are compared before timing (atol 1e-4 on ONNX Runtime,
1e-3 on OpenVINO). Under ``--target qdq`` the weights stay int4 behind DequantizeLinear,
which both engines run with int8 activations by default, as the builder's model asks: the
exactness check runs the decomposition with ``session.qdq_matmulnbits_accuracy_level`` 0
(atol 1e-4); the timed sessions keep the defaults, and their outputs are compared with the
fused model's on the same engine (atol 0.05: int8 activations, rounded independently).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_contrib_models import (  # noqa: E402
    OpenVinoRunner,
    cell,
    contrib_counts,
    fused_back_by_ort,
    time_row,
)

import decomposer  # noqa: E402

from benchlib import OrtRunner  # noqa: E402

STEPS = (("prompt 128", 128, 0), ("prompt 512", 512, 0), ("decode after 512", 1, 512))


def decoder_feeds(model: onnx.ModelProto, sequence: int, past: int, seed: int
                  ) -> dict[str, np.ndarray]:
    """input_ids, an all-ones attention mask over past + new tokens, random past K/V."""
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name == "input_ids":
            vocab = next(i for i in model.graph.initializer
                         if "embed_tokens" in i.name).dims[0]
            feeds[value.name] = rng.integers(0, vocab, (1, sequence)).astype(np.int64)
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones((1, past + sequence), np.int64)
        elif value.name.startswith("past_key_values"):
            heads = dims[1].dim_value
            head = next(n for n in model.graph.node if n.op_type == "GroupQueryAttention")
            size = _head_size(model, head)
            feeds[value.name] = rng.standard_normal((1, heads, past, size)).astype(np.float32)
    return feeds


def _head_size(model: onnx.ModelProto, node: onnx.NodeProto) -> int:
    cos = next(i for i in model.graph.initializer if i.name == node.input[7])
    return 2 * cos.dims[1]


def with_exact_matmuls(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with MatMulNBits' accuracy_level 0 (float32 activations)."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        for attribute in node.attribute:
            if node.op_type == "MatMulNBits" and attribute.name == "accuracy_level":
                attribute.i = 0
    return copy


EXACT_QDQ = {"session.qdq_matmulnbits_accuracy_level": "0"}  # float32 activations


def _close(got: list[np.ndarray], want: list[np.ndarray], atol: float, label: str) -> float:
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, atol=atol, rtol=atol, err_msg=label)
    return max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--target", choices=("portable", "qdq"), default="portable")
    parser.add_argument("--json", default="bench-results/bench_genai.json")
    args = parser.parse_args(argv)

    fused = onnx.load(args.model / "model.onnx")  # the weights in memory
    decomposed, report = decomposer.decompose_with_report(fused, target=args.target)
    assert not contrib_counts(decomposed), contrib_counts(decomposed)
    exact = with_exact_matmuls(fused)
    meta = {"model": str(args.model), "target": args.target, "threads": args.threads,
            "rounds": args.rounds,
            "fused_contrib_nodes": contrib_counts(fused), "replaced": report.counts,
            "nodes": {"fused": len(fused.graph.node), "decomposed": len(decomposed.graph.node)},
            "ort_fuses_decomposed_into": fused_back_by_ort(decomposed),
            "machine": platform.machine(), "python": platform.python_version(),
            "onnxruntime": ort.__version__, "onnx": onnx.__version__}
    try:
        import openvino

        meta["openvino"] = openvino.__version__
    except ImportError:
        openvino = None
    print(f"fused: {meta['fused_contrib_nodes']}; ONNX Runtime fuses the decomposition "
          f"back into {meta['ort_fuses_decomposed_into'] or 'nothing'}", file=sys.stderr)

    rows = []
    for label, sequence, past in STEPS:
        inputs = decoder_feeds(fused, sequence, past, seed=sequence + past)
        row: dict = {"step": label, "ms": {}, "ratio": {}, "max_abs_diff": {}, "failed": {}}
        variants: dict[str, Callable[[], object]] = {
            "ort_fused": OrtRunner(fused, inputs, args.threads),
            "ort_decomposed": OrtRunner(decomposed, inputs, args.threads)}
        want = OrtRunner(exact, inputs, args.threads).results()
        qdq = args.target == "qdq"
        got = OrtRunner(decomposed, inputs, args.threads, config=EXACT_QDQ).results() if qdq \
            else variants["ort_decomposed"].results()  # type: ignore[attr-defined]
        row["max_abs_diff"]["ort_decomposed"] = _close(got, want, 1e-4, label)
        if qdq:  # the timed sessions: int8 activations on both sides
            row["max_abs_diff"]["ort_decomposed_vs_fused"] = _close(
                variants["ort_decomposed"].results(),  # type: ignore[attr-defined]
                variants["ort_fused"].results(), 0.05, label)  # type: ignore[attr-defined]
        if openvino is not None:
            for name, model in (("ov_fused", fused), ("ov_decomposed", decomposed)):
                try:
                    runner = OpenVinoRunner(model, inputs, args.threads)
                    results = runner.results()
                except RuntimeError as exc:  # e.g. an unsupported com.microsoft node
                    from decomposer.engines import first_error_line

                    row["failed"][name] = first_error_line(str(exc))[:200]
                    print(f"  {name} at {label}: {row['failed'][name]}", file=sys.stderr)
                    continue
                if name == "ov_decomposed" and args.target == "qdq" and "ov_fused" in variants:
                    row["max_abs_diff"][name] = _close(
                        results, variants["ov_fused"].results(),  # type: ignore[attr-defined]
                        0.05, name)
                elif name == "ov_decomposed":
                    row["max_abs_diff"][name] = _close(results, want, 1e-3, name)
                variants[name] = runner
        time_row(row, variants, args.rounds)
        rows.append(row)

    print(f"\n{args.model.name}, batch 1, {args.threads} thread(s), median of {args.rounds} "
          f"interleaved rounds\n")
    print("| step | ORT fused ms | ORT decomposed ms | decomposed / fused (ORT) | OpenVINO "
          "fused ms | OpenVINO decomposed ms | decomposed / fused (OpenVINO) |\n"
          "|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['step']} | {cell(row, 'ort_fused')} | {cell(row, 'ort_decomposed')} | "
              f"{cell(row, 'ort_decomposed/ort_fused', 'x')} | {cell(row, 'ov_fused')} | "
              f"{cell(row, 'ov_decomposed')} | {cell(row, 'ov_decomposed/ov_fused', 'x')} |")
    for row in rows:
        for name, reason in row["failed"].items():
            print(f"\n{name} ({row['step']}) failed: {reason}")
    target = Path(args.json)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"\nwrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
