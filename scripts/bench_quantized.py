"""Speed of ONNX Runtime's quantized models after decomposition: the standard QDQ / integer
form decomposer writes against the original holding ONNX Runtime's contrib kernels.

In: models written here by ONNX Runtime's own tools from a CNN exported by torch (the one of
tests/test_ort_quantized_models.py, at a larger size: 32 -> 64 channels, 64x64 images):
``quantize_static`` QOperator, the same saved at ORT_ENABLE_ALL, 16-bit QDQ with the contrib
Q/DQ, ``quantize_dynamic`` saved at ORT_ENABLE_ALL; a BERT (hidden 128, 2 layers, 64
tokens) through ``quantize_static`` QOperator. Out: per model, the median time of the
decomposed model over the original on ONNX Runtime 1.32 CPU (1 thread, spinning off,
interleaved rounds in a shuffled order), the largest output difference, and the decomposed
model's time on OpenVINO (``--lower QLinearConv``, f32 precision hint) over ONNX Runtime's
time for the original.

    python scripts/bench_quantized.py [--rounds 11] [--batch 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from hf_models import bert_qoperator

from benchlib import OrtRunner, interleaved_rounds, time_calls


class CNN(torch.nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, width, 3, padding=1)
        self.c2 = torch.nn.Conv2d(width, width, 3, padding=1)
        self.c3 = torch.nn.Conv2d(2 * width, 2 * width, 1)
        self.fc = torch.nn.Linear(2 * width, 10)

    def forward(self, x):
        a = torch.nn.functional.leaky_relu(self.c1(x), 0.1)
        b = (torch.sigmoid(self.c2(a)) + a) * a
        c = torch.cat([b, a], 1)
        c = torch.nn.functional.max_pool2d(torch.relu(self.c3(c)), 2)
        c = torch.nn.functional.avg_pool2d(c, 2)
        g = torch.nn.functional.adaptive_avg_pool2d(c, 1).flatten(1)
        return torch.softmax(self.fc(g), -1)


def build(folder: Path, size: int) -> dict[str, onnx.ModelProto]:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{"x": np.random.default_rng(i).standard_normal(
                (1, 3, size, size)).astype(np.float32)} for i in range(8)])

        def get_next(self):
            return next(self.feeds, None)

    def optimized(source: Path, target: Path) -> None:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(target)
        options.log_severity_level = 3
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])

    torch.manual_seed(0)
    float_model = folder / "cnn.onnx"
    torch.onnx.export(CNN().eval(), (torch.randn(1, 3, size, size),), str(float_model),
                      opset_version=17, dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n"}, "y": {0: "n"}})
    paths = {name: folder / f"model{index}.onnx" for index, name in enumerate(
             ("QOperator", "QOperator at ORT_ENABLE_ALL", "QDQ 16-bit (contrib Q/DQ)",
              "dynamic", "quantize_dynamic at ORT_ENABLE_ALL"))}
    quantize_static(str(float_model), str(paths["QOperator"]), Reader(),
                    quant_format=QuantFormat.QOperator, per_channel=True)
    optimized(paths["QOperator"], paths["QOperator at ORT_ENABLE_ALL"])
    quantize_static(str(float_model), str(paths["QDQ 16-bit (contrib Q/DQ)"]), Reader(),
                    quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt16,
                    weight_type=QuantType.QInt8, extra_options={"UseQDQContribOps": True})
    quantize_dynamic(str(float_model), str(paths["dynamic"]))
    optimized(paths["dynamic"], paths["quantize_dynamic at ORT_ENABLE_ALL"])
    found = {name: onnx.load(str(path)) for name, path in paths.items() if name != "dynamic"}
    found["BERT QOperator"] = bert_qoperator(
        folder, vocab_size=1000, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=512, max_position_embeddings=128)
    return found


def openvino_seconds(model: onnx.ModelProto, feeds: dict[str, np.ndarray],
                     rounds: int) -> float | str | None:
    """Median seconds per inference on OpenVINO; its first error line if it cannot compile
    the model; None if it is not installed."""
    try:
        import openvino as ov
    except ImportError:
        return None
    core = ov.Core()
    try:
        compiled = core.compile_model(core.read_model(model.SerializeToString(), b""), "CPU",
                                      {"INFERENCE_PRECISION_HINT": "f32",
                                       "INFERENCE_NUM_THREADS": 1})
    except RuntimeError as error:
        lines = [line for line in str(error).splitlines() if "CALLBACK" in line or
                 "Conversion" in line]
        return (lines[0] if lines else str(error).splitlines()[0])[:120]
    request = compiled.create_infer_request()

    def call() -> None:
        request.infer(feeds)

    call()
    return statistics.median(time_calls(call, 20) for _ in range(rounds))


def main(argv: Sequence[str] | None = None) -> int:
    import decomposer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--models", default="", help="names to run (a substring each), "
                        "comma-separated; default all")
    args = parser.parse_args(argv)
    image_feeds = {"x": np.random.default_rng(1).standard_normal(
        (args.batch, 3, args.size, args.size)).astype(np.float32)}
    bert_feeds = {"ids": np.random.default_rng(2).integers(0, 1000, (args.batch, 64)),
                  "mask": np.ones((args.batch, 64), np.int64)}
    print("| model | decomposed / original, ORT (median) | max difference | OpenVINO "
          "(decomposed) / ORT original |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        wanted = [w for w in args.models.split(",") if w]
        for name, model in build(Path(folder), args.size).items():
            if wanted and not any(w in name for w in wanted):
                continue
            feeds = bert_feeds if name.startswith("BERT") else image_feeds
            try:
                out = decomposer.decompose(model)
            except decomposer.UnsupportedNodeError as error:
                left = sorted({f"{i.domain}::{i.op_type}" for i in error.nodes})
                print(f"| {name} | not decomposed: {', '.join(left)} | - | - |")
                continue
            original, decomposed = OrtRunner(model, feeds, 1), OrtRunner(out, feeds, 1)
            _, times, ratios = interleaved_rounds({"original": original,
                                                   "decomposed": decomposed}, "original",
                                                  args.rounds, time_calls)
            difference = float(np.abs(original.result().astype(np.float64) -
                                      decomposed.result()).max())
            on_openvino = openvino_seconds(decomposer.decompose(model, lower=["QLinearConv"]),
                                           feeds, args.rounds)
            openvino = "-" if on_openvino is None else f"fails: {on_openvino}" \
                if isinstance(on_openvino, str) else \
                f"{on_openvino / statistics.median(times['original']):.2f}x"
            print(f"| {name} | {statistics.median(ratios['decomposed']):.2f}x | "
                  f"{difference:.2g} | {openvino} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
