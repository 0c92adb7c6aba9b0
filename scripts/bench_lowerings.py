"""Speed of the engine-target lowerings of round 4 against ONNX Runtime's native kernel.

In: one model per lowering, at typical sizes: LSTM (a voice-activity detector's: sequence
64, batch 1, input 64, hidden 64; and a bidirectional one, sequence 32, batch 4, input 32,
hidden 128), the same two LSTMs through ``onnxruntime.quantization.quantize_dynamic``
(com.microsoft DynamicQuantizeLSTM, decomposed under the default target), IsNaN on an
activation (1 x 64 x 56 x 56) and antialiased Resize (torch's
export: sizes, exclude_outside=1; 1 x 3 x 448 x 448 -> 224 x 224, and 1 x 64 x 128 x 128 ->
64 x 64), ConvInteger and MatMulInteger as quantize_dynamic writes them (a ResNet-like
3x3 convolution; BERT-base's two MLP products), QLinearMatMul as quantize_static's
QOperator format writes it. Each op feeds one more node, as in a
model.
Out: per case, the median time of the lowered model over the native one (ONNX Runtime 1.32
CPU, 1 thread, spinning off, interleaved rounds in shuffled order) and the largest
difference between their outputs.

    python scripts/bench_lowerings.py [--rounds 15] [--cases SUBSTRING]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import decomposer

from benchlib import OrtRunner, interleaved_rounds, time_calls

F = TensorProto.FLOAT


def _lstm(steps: int, batch: int, features: int, hidden: int, direction: str):
    rng = np.random.default_rng(0)
    count = 2 if direction == "bidirectional" else 1
    inits = [numpy_helper.from_array((rng.standard_normal(shape) * 0.1).astype(np.float32), n)
             for n, shape in (("W", (count, 4 * hidden, features)),
                              ("R", (count, 4 * hidden, hidden)), ("B", (count, 8 * hidden)))]
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["y_op", "h_op"],
                              hidden_size=hidden, direction=direction),
             helper.make_node("Neg", ["y_op"], ["y"]), helper.make_node("Neg", ["h_op"], ["h"])]
    graph = helper.make_graph(nodes, "lstm", [helper.make_tensor_value_info(
        "x", F, [steps, batch, features])], [helper.make_tensor_value_info("y", F, [None] * 4),
                                             helper.make_tensor_value_info("h", F, [None] * 3)],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    return model, {"x": rng.standard_normal((steps, batch, features)).astype(np.float32)}, \
        ["LSTM"]


def _quantized_lstm(steps: int, batch: int, features: int, hidden: int, direction: str):
    """The LSTM above as ONNX Runtime's quantize_dynamic writes it (DynamicQuantizeLSTM,
    per-tensor uint8/int8 weights): what a user brings from ORT's quantization tools."""
    import os
    import tempfile

    import onnx
    from onnxruntime.quantization import quantize_dynamic

    model, feeds, _ = _lstm(steps, batch, features, hidden, direction)
    with tempfile.TemporaryDirectory() as folder:
        source, target = os.path.join(folder, "f.onnx"), os.path.join(folder, "q.onnx")
        onnx.save(model, source)
        quantize_dynamic(source, target, op_types_to_quantize=["LSTM"])
        quantized = onnx.load(target)
    assert any(n.op_type == "DynamicQuantizeLSTM" for n in quantized.graph.node)
    return quantized, feeds, []


def _is_nan():
    nodes = [helper.make_node("IsNaN", ["x"], ["m"]), helper.make_node("Not", ["m"], ["y"])]
    graph = helper.make_graph(
        nodes, "is_nan", [helper.make_tensor_value_info("x", F, [1, 64, 56, 56])],
        [helper.make_tensor_value_info("y", TensorProto.BOOL, [None] * 4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.random.default_rng(1).standard_normal((1, 64, 56, 56)).astype(np.float32)
    x.reshape(-1)[::97] = np.nan
    return model, {"x": x}, ["IsNaN"]


def _resize(channels: int, size: int):
    sizes = numpy_helper.from_array(np.array([1, channels, size // 2, size // 2], np.int64),
                                    "sizes")
    nodes = [helper.make_node("Resize", ["x", "", "", "sizes"], ["r"], mode="linear",
                              antialias=1, exclude_outside=1),
             helper.make_node("Neg", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "resize", [helper.make_tensor_value_info(
        "x", F, [1, channels, size, size])], [helper.make_tensor_value_info("y", F, [None] * 4)],
        [sizes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = np.random.default_rng(2).standard_normal((1, channels, size, size)).astype(np.float32)
    return model, {"x": x}, ["Resize"]


def _integer(op: str, data_shape: tuple[int, ...], weights_shape: tuple[int, ...],
             **attrs: object):
    """ConvInteger / MatMulInteger as quantize_dynamic writes them: uint8 activations with
    a zero point near the middle, symmetric int8 weights (a normal spread, clipped at 127:
    what its MinMax scaling gives), the int32 result cast to float for the scale's Mul."""
    rng = np.random.default_rng(3)
    weights = (rng.standard_normal(weights_shape) * 40).clip(-127, 127).astype(np.int8)
    inits = [numpy_helper.from_array(weights, "w"),
             numpy_helper.from_array(np.array(131, np.uint8), "xz"),
             numpy_helper.from_array(np.array(0, np.int8), "wz")]
    nodes = [helper.make_node(op, ["x", "w", "xz", "wz"], ["i"], **attrs),
             helper.make_node("Cast", ["i"], ["y"], to=F)]
    rank = len(data_shape)
    graph = helper.make_graph(nodes, op.lower(), [helper.make_tensor_value_info(
        "x", TensorProto.UINT8, list(data_shape))],
        [helper.make_tensor_value_info("y", F, [None] * rank)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.integers(0, 256, data_shape).astype(np.uint8)}, [op]


def _qlinear_matmul(rows: int, depth: int, columns: int):
    """QLinearMatMul as quantize_static's QOperator format writes it (per-column int8
    weights), feeding a DequantizeLinear."""
    rng = np.random.default_rng(4)
    inits = [numpy_helper.from_array(v, k) for k, v in (
        ("a_scale", np.array(0.05, np.float32)), ("a_zero", np.array(131, np.uint8)),
        ("b", (rng.standard_normal((depth, columns)) * 40).clip(-127, 127).astype(np.int8)),
        ("b_scale", rng.uniform(0.001, 0.003, columns).astype(np.float32)),
        ("b_zero", np.zeros(columns, np.int8)), ("y_scale", np.array(0.8, np.float32)),
        ("y_zero", np.array(128, np.uint8)))]
    nodes = [helper.make_node("QLinearMatMul", ["x", "a_scale", "a_zero", "b", "b_scale",
                                                "b_zero", "y_scale", "y_zero"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "y_scale", "y_zero"], ["y"])]
    graph = helper.make_graph(nodes, "qlinear_matmul", [helper.make_tensor_value_info(
        "x", TensorProto.UINT8, [1, rows, depth])],
        [helper.make_tensor_value_info("y", F, [None] * 3)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.integers(0, 256, (1, rows, depth)).astype(np.uint8)}, \
        ["QLinearMatMul"]


CASES = {
    "LSTM 64 steps, 1 x 64 -> 64": lambda: _lstm(64, 1, 64, 64, "forward"),
    "LSTM bidirectional 32 steps, 4 x 32 -> 128": lambda: _lstm(32, 4, 32, 128,
                                                                "bidirectional"),
    "DynamicQuantizeLSTM 64 steps, 1 x 64 -> 64": lambda: _quantized_lstm(
        64, 1, 64, 64, "forward"),
    "DynamicQuantizeLSTM bidirectional 32 steps, 4 x 32 -> 128": lambda: _quantized_lstm(
        32, 4, 32, 128, "bidirectional"),
    "IsNaN 1x64x56x56": _is_nan,
    "Resize antialias 1x3x448^2 -> 224^2": lambda: _resize(3, 448),
    "Resize antialias 1x64x128^2 -> 64^2": lambda: _resize(64, 128),
    "ConvInteger 1x64x56^2, 64 3x3": lambda: _integer("ConvInteger", (1, 64, 56, 56),
                                                      (64, 64, 3, 3), pads=[1, 1, 1, 1]),
    "ConvInteger 1x16x112^2, 32 3x3": lambda: _integer("ConvInteger", (1, 16, 112, 112),
                                                       (32, 16, 3, 3), pads=[1, 1, 1, 1]),
    "MatMulInteger 128x768 @ 768x3072": lambda: _integer("MatMulInteger", (1, 128, 768),
                                                         (768, 3072)),
    "MatMulInteger 128x3072 @ 3072x768": lambda: _integer("MatMulInteger", (1, 128, 3072),
                                                          (3072, 768)),
    "QLinearMatMul 128x768 @ 768x3072": lambda: _qlinear_matmul(128, 768, 3072),
}


def measure(rounds: int, only: str = "") -> list[str]:
    rows = ["| case | lowered / native (median) | rounds | max abs difference |",
            "|---|---|---|---|"]
    for name, build in CASES.items():
        if only not in name:
            continue
        model, feeds, lower = build()
        out = decomposer.decompose(model, lower=lower)
        native, lowered = OrtRunner(model, feeds, threads=1), OrtRunner(out, feeds, threads=1)
        diff = max(float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())
                   for a, b in zip(native.results(), lowered.results(), strict=True))
        _, _, ratios = interleaved_rounds({"native": native, "lowered": lowered}, "native",
                                          rounds, time_calls)
        rows.append(f"| {name} | {statistics.median(ratios['lowered']):.2f}x | {rounds} | "
                    f"{diff:.1e} |")
        print(rows[-1], flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cases", default="", help="only the cases whose name holds this")
    args = parser.parse_args(argv)
    print("\n".join(measure(args.rounds, args.cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
