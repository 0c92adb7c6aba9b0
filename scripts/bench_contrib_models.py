"""A whole BERT optimized by ONNX Runtime's transformer optimizer, before and after decomposition.

In: ``--rounds R`` (default 7), ``--threads T`` (default 1), ``--layers L`` (default 4),
``--json FILE``.
Out: per sequence length (batch 1; 128 and 512 tokens, the attention mask right-padded as a
tokenizer writes it), the median time of the ORT-optimized (fused) model on ONNX Runtime CPU
(the baseline) and of the decomposed model on ONNX Runtime CPU with its default
optimizations; and on OpenVINO CPU (f32 precision hint, T threads) of the fused model (when
OpenVINO can load its ``com.microsoft`` nodes; else the reason it cannot) and of the
decomposed model; with the median per-round ratios decomposed / fused on each engine. All
four variants are timed in the same interleaved rounds.

The model is BERT-base-like (hidden 768, 12 heads, intermediate 3072, vocabulary 30522,
512 positions) with L layers and random weights, built from a ``transformers`` config (no
download), exported by torch's legacy exporter at opset 17 with dynamic batch and sequence,
optimized by ``onnxruntime.transformers.optimizer`` (``model_type="bert"``, ``opt_level=0``:
Attention, EmbedLayerNormalization, SkipLayerNormalization and BiasGelu fused in), saved and
reloaded, as in ``tests/test_real_models.py``. Outputs are compared before timing: the
decomposed model on ONNX Runtime against the fused one (atol 1e-4), and each OpenVINO
variant against the fused one on ONNX Runtime (atol 1e-3).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_models import BERT_OUTPUTS, bert, bert_feeds  # noqa: E402

import decomposer  # noqa: E402

from benchlib import OrtRunner, interleaved_rounds, time_calls  # noqa: E402

HIDDEN, HEADS, INTERMEDIATE, VOCAB, POSITIONS = 768, 12, 3072, 30522, 512
OUTPUTS = BERT_OUTPUTS
SEQUENCES = (128, 512)


def optimized_bert(layers: int) -> onnx.ModelProto:
    """The ORT-optimized ONNX BERT (random weights), saved and reloaded as users do."""
    return bert(vocab=VOCAB, hidden=HIDDEN, heads=HEADS, layers=layers,
                intermediate=INTERMEDIATE, positions=POSITIONS)[1]


def feeds(batch: int, sequence: int, seed: int) -> dict[str, np.ndarray]:
    return bert_feeds(batch, sequence, seed, VOCAB)


class OpenVinoRunner:
    """OpenVINO CPU, f32 precision hint, latency mode, ``threads`` threads, one reused
    request with its input tensors set once."""

    def __init__(self, model: onnx.ModelProto, inputs: Mapping[str, np.ndarray],
                 threads: int) -> None:
        import openvino as ov

        core = ov.Core()
        compiled = core.compile_model(core.read_model(model.SerializeToString()), "CPU", {
            "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": threads})
        self.request = compiled.create_infer_request()
        self.outputs = compiled.outputs
        names = {port.get_any_name() for port in compiled.inputs}
        for name, value in inputs.items():
            if name in names:
                self.request.set_tensor(name, ov.Tensor(np.ascontiguousarray(value)))

    def __call__(self) -> None:
        self.request.infer()

    def results(self) -> list[np.ndarray]:
        self.request.infer()
        return [np.array(self.request.get_tensor(port).data) for port in self.outputs]


def contrib_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(Counter(n.op_type for n in model.graph.node if n.domain == "com.microsoft"))


def fused_back_by_ort(model: onnx.ModelProto) -> dict[str, int]:
    """The contrib nodes in ONNX Runtime's optimized graph of ``model``: what its default
    optimizations fuse the decomposed ops back into."""
    with tempfile.TemporaryDirectory() as folder:
        options = ort.SessionOptions()
        options.optimized_model_filepath = str(Path(folder) / "ort.onnx")
        options.log_severity_level = 4
        ort.InferenceSession(model.SerializeToString(), options,
                             providers=["CPUExecutionProvider"])
        return contrib_counts(onnx.load(options.optimized_model_filepath))


def compare(got: list[np.ndarray], want: list[np.ndarray], atol: float, label: str) -> float:
    for g, w, name in zip(got, want, OUTPUTS, strict=True):
        np.testing.assert_allclose(g, w, atol=atol, rtol=1e-4, err_msg=f"{label}: {name}")
    return max(float(np.max(np.abs(g - w))) for g, w in zip(got, want, strict=True))


def time_row(row: dict, variants: Mapping[str, Callable[[], object]], rounds: int) -> None:
    """Time the variants (ort_fused, ort_decomposed, and ov_fused / ov_decomposed where
    OpenVINO runs them) in interleaved rounds; medians and ratios into ``row``."""
    _, times, ratios = interleaved_rounds(variants, "ort_fused", rounds, time_calls)
    row["ms"] = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    row["ratio"]["ort_decomposed/ort_fused"] = statistics.median(ratios["ort_decomposed"])
    if {"ov_fused", "ov_decomposed"} <= variants.keys():
        row["ratio"]["ov_decomposed/ov_fused"] = statistics.median(
            d / f for d, f in zip(times["ov_decomposed"], times["ov_fused"], strict=True))
    row["times_ms"] = {name: [s * 1e3 for s in t] for name, t in times.items()}


def cell(row: dict, key: str, suffix: str = "") -> str:
    """A table cell: a median in ms or a ratio, "fails" or "-"."""
    if key in row["failed"]:
        return "fails"
    value = row["ms"].get(key, row["ratio"].get(key))
    return "-" if value is None else f"{value:.2f}{suffix}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--json", default="bench-results/bench_contrib_models.json")
    args = parser.parse_args(argv)

    fused = optimized_bert(args.layers)
    decomposed = decomposer.decompose(fused)
    assert not contrib_counts(decomposed), contrib_counts(decomposed)
    meta = {"layers": args.layers, "hidden": HIDDEN, "heads": HEADS,
            "intermediate": INTERMEDIATE, "threads": args.threads, "rounds": args.rounds,
            "fused_contrib_nodes": contrib_counts(fused),
            "nodes": {"fused": len(fused.graph.node), "decomposed": len(decomposed.graph.node)},
            "ort_fuses_decomposed_into": fused_back_by_ort(decomposed),
            "machine": platform.machine(), "python": platform.python_version(),
            "onnxruntime": ort.__version__, "onnx": onnx.__version__}
    try:
        import openvino

        meta["openvino"] = openvino.__version__
    except ImportError:
        openvino = None
    print(f"fused: {meta['fused_contrib_nodes']}; decomposed: {meta['nodes']['decomposed']} "
          f"standard nodes; ONNX Runtime fuses them back into "
          f"{meta['ort_fuses_decomposed_into'] or 'nothing'}", file=sys.stderr)

    rows = []
    for sequence in SEQUENCES:
        inputs = feeds(1, sequence, seed=sequence)
        row: dict = {"batch": 1, "sequence": sequence,
                     "tokens": int(inputs["attention_mask"].sum()), "ms": {}, "ratio": {},
                     "max_abs_diff": {}, "failed": {}}
        variants: dict[str, Callable[[], object]] = {
            "ort_fused": OrtRunner(fused, inputs, args.threads),
            "ort_decomposed": OrtRunner(decomposed, inputs, args.threads)}
        want = variants["ort_fused"].results()
        row["max_abs_diff"]["ort_decomposed"] = compare(
            variants["ort_decomposed"].results(), want, 1e-4, "decomposed on ONNX Runtime")
        if openvino is not None:
            for name, model in (("ov_fused", fused), ("ov_decomposed", decomposed)):
                try:
                    runner = OpenVinoRunner(model, inputs, args.threads)
                except RuntimeError as exc:  # e.g. an unsupported com.microsoft node
                    from decomposer.engines import first_error_line

                    row["failed"][name] = first_error_line(str(exc))[:200]
                    print(f"  {name} at {sequence}: {row['failed'][name]}", file=sys.stderr)
                    continue
                row["max_abs_diff"][name] = compare(runner.results(), want, 1e-3,
                                                    f"{name} vs fused on ONNX Runtime")
                variants[name] = runner
        time_row(row, variants, args.rounds)
        rows.append(row)

    print(f"\nBERT-base-like, {args.layers} layers, batch 1, {args.threads} thread(s), "
          f"median of {args.rounds} interleaved rounds\n")
    print("| sequence (real tokens) | ORT fused ms | ORT decomposed ms | decomposed / fused "
          "(ORT) | OpenVINO fused ms | OpenVINO decomposed ms | decomposed / fused "
          "(OpenVINO) |\n|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['sequence']} ({row['tokens']}) | {cell(row, 'ort_fused')} | "
              f"{cell(row, 'ort_decomposed')} | {cell(row, 'ort_decomposed/ort_fused', 'x')} | "
              f"{cell(row, 'ov_fused')} | {cell(row, 'ov_decomposed')} | "
              f"{cell(row, 'ov_decomposed/ov_fused', 'x')} |")
    failures = {f"{name} (sequence {row['sequence']})": reason for row in rows
                for name, reason in row["failed"].items()}
    for where, reason in failures.items():
        print(f"\n{where} failed: {reason}")
    target = Path(args.json)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print(f"\nwrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
