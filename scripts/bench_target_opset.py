"""Speed of the ``--target-opset`` lowerings against ONNX Runtime's native kernel of the op.

In: one model per op at the opset that defines it (the op, then a Neg, as the op feeds
the next layer in a model) (LayerNormalization,
GroupNormalization, RMSNormalization, Gelu both approximations, Mish, HardSwish,
RotaryEmbedding, Attention, BitwiseAnd of two tensors and with a constant 0x0F mask,
CenterCropPad), fed typical activation sizes.
Out: per op and target, the median time of the lowered model over the native one (ONNX
Runtime 1.32 CPU, 1 thread, spinning off, interleaved rounds in shuffled order, medians),
and the largest difference between the two outputs.

    python scripts/bench_target_opset.py [--rounds 15] [--targets 17,13]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from benchlib import OrtRunner, interleaved_rounds, time_calls

F = TensorProto.FLOAT
Case = tuple[onnx.ModelProto, dict[str, np.ndarray]]


def _single(op: str, opset: int, inputs: Sequence[tuple[str, int, list[int]]],
            outputs: Sequence[tuple[str, int]], initializers: Sequence[onnx.TensorProto] = (),
            out_rank: int | None = None, **attrs: object) -> onnx.ModelProto:
    # The op feeds one more node, as in a model (ONNX Runtime fuses a decomposed subgraph
    # back into its kernel only where its result is not a graph output).
    node = helper.make_node(op, [name for name, *_ in inputs] +
                            [t.name for t in initializers],
                            [f"{name}_op" for name, _ in outputs], **attrs)
    after = [helper.make_node("Neg" if t == F else "Identity", [f"{name}_op"], [name])
             for name, t in outputs]
    graph = helper.make_graph(
        [node, *after], op, [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        # the first input's shape, or dims left open for an op that changes it
        [helper.make_tensor_value_info(n, t, inputs[0][2] if out_rank is None
                                       else [None] * out_rank) for n, t in outputs],
        list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _weights(name: str, shape: list[int], seed: int) -> onnx.TensorProto:
    value = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
    return onnx.numpy_helper.from_array(value, name)


def cases() -> dict[str, Case]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 128, 256)).astype(np.float32)
    image = rng.normal(size=(2, 32, 56, 56)).astype(np.float32)
    heads = rng.normal(size=(2, 4, 128, 32)).astype(np.float32)
    found: dict[str, Case] = {
        "LayerNormalization": (_single("LayerNormalization", 17, [("x", F, list(x.shape))],
                                       [("y", F)], [_weights("g", [256], 1),
                                                    _weights("b", [256], 2)]), {"x": x}),
        "GroupNormalization": (_single("GroupNormalization", 21,
                                       [("x", F, list(image.shape))], [("y", F)],
                                       [_weights("g", [32], 1), _weights("b", [32], 2)],
                                       num_groups=8), {"x": image}),
        "RMSNormalization": (_single("RMSNormalization", 23, [("x", F, list(x.shape))],
                                     [("y", F)], [_weights("g", [256], 1)]), {"x": x}),
        "Gelu": (_single("Gelu", 20, [("x", F, list(x.shape))], [("y", F)]), {"x": x}),
        "Gelu tanh": (_single("Gelu", 20, [("x", F, list(x.shape))], [("y", F)],
                              approximate="tanh"), {"x": x}),
        "Mish": (_single("Mish", 18, [("x", F, list(x.shape))], [("y", F)]), {"x": x}),
        "HardSwish": (_single("HardSwish", 14, [("x", F, list(x.shape))], [("y", F)]),
                      {"x": x}),
        "Attention": (_single("Attention", 23, [("q", F, list(heads.shape)),
                                                ("k", F, list(heads.shape)),
                                                ("v", F, list(heads.shape))], [("y", F)],
                              is_causal=1), {"q": heads, "k": heads[:, :, ::-1].copy(),
                                             "v": heads * 0.5}),
    }
    ints = rng.integers(-2**31, 2**31 - 1, (256, 1024), dtype=np.int32)
    found["BitwiseAnd"] = (_single("BitwiseAnd", 18, [("a", TensorProto.INT32, [256, 1024]),
                                                      ("b", TensorProto.INT32, [256, 1024])],
                                   [("y", TensorProto.INT32)]), {"a": ints, "b": ints[::-1]})
    # the common form in models: a constant low-bit mask (int4 unpacking, x & 0x0F)
    found["BitwiseAnd 0x0F"] = (_single(
        "BitwiseAnd", 18, [("a", TensorProto.INT32, [256, 1024])], [("y", TensorProto.INT32)],
        [onnx.numpy_helper.from_array(np.array(15, np.int32), "mask")]), {"a": ints})
    cos = rng.normal(size=(128, 16)).astype(np.float32)
    positions = np.tile(np.arange(128, dtype=np.int64), (2, 1))
    rotary_in = rng.normal(size=(2, 4, 128, 32)).astype(np.float32)
    found["RotaryEmbedding"] = (_single(
        "RotaryEmbedding", 23, [("x", F, [2, 4, 128, 32]), ("cos", F, [128, 16]),
                                ("sin", F, [128, 16]), ("pos", TensorProto.INT64, [2, 128])],
        [("y", F)]), {"x": rotary_in, "cos": cos, "sin": cos[::-1].copy(), "pos": positions})
    signal = rng.standard_normal((4, 16000, 1)).astype(np.float32)
    found["STFT"] = (_single("STFT", 17, [("x", F, [4, 16000, 1])], [("y", F)],
                             [onnx.numpy_helper.from_array(np.array(160, np.int64), "step"),
                              onnx.numpy_helper.from_array(np.hanning(400).astype(np.float32),
                                                           "window")], out_rank=4),
                     {"x": signal})
    frames = rng.standard_normal((32, 512, 1)).astype(np.float32)
    found["DFT"] = (_single("DFT", 17, [("x", F, [32, 512, 1])], [("y", F)], out_rank=3,
                            onesided=1),
                    {"x": frames})
    columns = rng.standard_normal((2, 64 * 9, 54 * 54)).astype(np.float32)
    found["Col2Im"] = (_single("Col2Im", 18, [("x", F, [2, 64 * 9, 54 * 54])], [("y", F)],
                               [onnx.numpy_helper.from_array(np.array([56, 56], np.int64),
                                                             "image"),
                                onnx.numpy_helper.from_array(np.array([3, 3], np.int64),
                                                             "block")], out_rank=4),
                        {"x": columns})
    found["CumProd"] = (_single("CumProd", 26, [("x", F, list(x.shape))], [("y", F)],
                                [onnx.numpy_helper.from_array(np.array(1, np.int64), "axis")]),
                        {"x": (1 + 0.01 * x).astype(np.float32)})
    return found


def measure(names: Sequence[str], targets: Sequence[int], rounds: int) -> list[str]:
    import decomposer

    rows = ["| op | target | lowered / native (median) | rounds | max abs difference |",
            "|---|---|---|---|---|"]
    available = cases()
    for name in names:
        model, feeds = available[name]
        native = OrtRunner(model, feeds, threads=1)
        variants: dict[str, Callable[[], object]] = {"native": native}
        lowered = {}
        for target in targets:
            out = decomposer.decompose(model, target_opset=target)
            lowered[target] = OrtRunner(out, feeds, threads=1)
            variants[str(target)] = lowered[target]
        _, _, ratios = interleaved_rounds(variants, "native", rounds, time_calls)
        want = native.result()
        for target in targets:
            got = lowered[target].result()
            difference = float(np.abs(got.astype(np.float64) - want).max())
            rows.append(f"| {name} | {target} | {statistics.median(ratios[str(target)]):.2f}x "
                        f"| {rounds} | {difference:.1g} |")
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=",".join(cases()))
    parser.add_argument("--targets", default="17,13")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args(argv)
    targets = [int(t) for t in args.targets.split(",")]
    print("\n".join(measure(args.ops.split(","), targets, args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
