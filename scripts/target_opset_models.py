"""Real models through ``--target-opset``: each taken as far down as it can go, on every engine.

In: models exported here with torch and transformers (random weights, no download): the
README's spatial transformer (opset 16, custom AffineGrid), a ViT and a BERT from torch's
dynamo exporter (opset 18), a Llama-style block exported at opset 23 (RMSNorm, SDPA, rotary),
a Deformable DETR (opset 16, GridSample) and an mmdeploy-style two-stage RoI head at opset
11 (``mmcv::MMCVRoiAlign`` with aligned=1, mmdet's default). Out: one row per model and
target (17, 13, 11 where below the model's opset, and the model's own opset): decomposer's
result at the target, run on ONNX Runtime, OpenVINO and TVM, against the reference (the
original model on ONNX Runtime; for a model with custom nodes, torch eager), within 1e-5
absolute plus 1e-4 relative; or the line that refused it.

    python scripts/target_opset_models.py               # the markdown table
    python scripts/target_opset_models.py --models stn,head --engines ort
"""

from __future__ import annotations

import argparse
import io
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
ATOL, RTOL = 1e-5, 1e-4
ENGINES = ("ort", "openvino", "tvm")


def _export(module: Any, args: tuple[Any, ...], opset: int, dynamo: bool = True,
            **options: Any) -> onnx.ModelProto:
    import torch

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            program = torch.onnx.export(module, args, dynamo=True, opset_version=opset,
                                        verbose=False, **options)
            return program.model_proto
        torch.onnx.export(module, args, buffer, dynamo=False, opset_version=opset, **options)
    return onnx.load_from_string(buffer.getvalue())


def _feeds_reference(model: onnx.ModelProto, inputs: dict[str, np.ndarray]
                     ) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def stn() -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray] | None]:
    """The README's seed model (custom AffineGrid): its reference is the model decomposed
    at its own opset, which tests/test_readme.py holds equal to torch."""
    model = onnx.load(ROOT / "tests/data/stn_custom.onnx")
    rng = np.random.default_rng(0)
    theta = np.array([[[0.9, -0.2, 0.1], [0.15, 1.1, -0.05]]], np.float32)
    inputs = {"image": rng.normal(size=(1, 3, 20, 24)).astype(np.float32), "theta": theta,
              "size": np.array([1, 3, 16, 12], np.int64)}
    return model, inputs, None


def vit() -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray] | None]:
    import torch
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(0)
    config = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, image_size=32, patch_size=8,
                       attn_implementation="eager")
    module = ViTModel(config).eval()
    pixels = torch.randn(2, 3, 32, 32)
    model = _export(module, (pixels,), 18)
    return model, {model.graph.input[0].name: pixels.numpy()}, None


def bert() -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray] | None]:
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=64, attn_implementation="eager")
    module = BertModel(config).eval()
    ids = torch.randint(0, 100, (2, 9))
    model = _export(module, (ids,), 18)
    return model, {model.graph.input[0].name: ids.numpy()}, None


class _LlamaBlock:
    """RMSNorm, rotary q/k, causal SDPA with two KV heads for four query heads, SwiGLU."""

    @staticmethod
    def build() -> Any:
        import torch
        import torch.nn.functional as F
        from torch import nn

        class Block(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.norm = nn.RMSNorm(32, eps=1e-6)
                self.q = nn.Linear(32, 32, bias=False)
                self.kv = nn.Linear(32, 32, bias=False)
                self.o = nn.Linear(32, 32, bias=False)
                self.up = nn.Linear(32, 64, bias=False)
                self.gate = nn.Linear(32, 64, bias=False)
                self.down = nn.Linear(64, 32, bias=False)
                self.norm2 = nn.RMSNorm(32, eps=1e-6)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                batch, length, _ = x.shape
                h = self.norm(x)
                q = self.q(h).view(batch, length, 4, 8).transpose(1, 2)
                k, v = self.kv(h).view(batch, length, 2, 2, 8).permute(3, 0, 2, 1, 4)
                position = torch.arange(length, dtype=torch.float32)
                angle = position[:, None] / (10000 ** (torch.arange(4) / 4))[None, :]
                cos, sin = angle.cos(), angle.sin()

                def rotate(t: torch.Tensor) -> torch.Tensor:
                    first, second = t[..., :4], t[..., 4:]
                    return torch.cat([first * cos - second * sin,
                                      second * cos + first * sin], -1)

                q, k = rotate(q), rotate(k)
                k = k.repeat_interleave(2, dim=1)
                v = v.repeat_interleave(2, dim=1)
                attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + self.o(attended.transpose(1, 2).reshape(batch, length, 32))
                h = self.norm2(x)
                return x + self.down(F.silu(self.gate(h)) * self.up(h))

        return Block().eval()


def llama() -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray] | None]:
    import torch

    torch.manual_seed(0)
    module = _LlamaBlock.build()
    x = torch.randn(2, 7, 32)
    model = _export(module, (x,), 23)
    return model, {model.graph.input[0].name: x.numpy()}, None


def detr() -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray] | None]:
    import torch

    sys.path.insert(0, str(ROOT / "tests"))
    from test_deformable_detr import IMAGE, TwoOutputs, build_model

    module = TwoOutputs(build_model()).eval()
    image = torch.randn(*IMAGE, generator=torch.Generator().manual_seed(1))
    # transformers' own attention: GridSample-16 (no custom node)
    model = _export(module, (image,), 16, dynamo=False, input_names=["pixel_values"],
                    output_names=["logits", "boxes"])
    with torch.no_grad():  # the reference is eager: ONNX Runtime 1.32 runs no GridSample-16
        eager = [t.numpy() for t in module(image)]
    return model, {"pixel_values": image.numpy()}, eager


def head() -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray] | None]:
    """mmdeploy's default two-stage export at opset 11: a neck Conv, MMCVRoiAlign
    (aligned=1, sampling_ratio=0, 7x7, stride 4) and a box head (Flatten, Gemm, Relu,
    Gemm, Softmax); rois a run-time input, [batch, x1, y1, x2, y2] in image pixels."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_roi_align import torch_roi_align

    rng = np.random.default_rng(0)
    conv_w = rng.normal(size=(8, 3, 3, 3)).astype(np.float32) * 0.2
    fc1 = rng.normal(size=(8 * 7 * 7, 16)).astype(np.float32) * 0.05
    fc2 = rng.normal(size=(16, 5)).astype(np.float32) * 0.2
    nodes = [
        helper.make_node("Conv", ["image", "conv_w"], ["features"], pads=[1, 1, 1, 1],
                         strides=[4, 4], name="neck"),
        helper.make_node("MMCVRoiAlign", ["features", "rois"], ["pooled"], domain="mmcv",
                         name="roi_extractor", output_height=7, output_width=7,
                         spatial_scale=0.25, sampling_ratio=0, mode="avg", aligned=1),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc1"], ["hidden"], name="fc1"),
        helper.make_node("Relu", ["hidden"], ["act"], name="relu"),
        helper.make_node("Gemm", ["act", "fc2"], ["logits"], name="fc2"),
        helper.make_node("Softmax", ["logits"], ["scores"], axis=1, name="cls"),
    ]
    graph = helper.make_graph(
        nodes, "two_stage_head",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, "H", "W"]),
         helper.make_tensor_value_info("rois", TensorProto.FLOAT, ["R", 5])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["R", 5])],
        [onnx.numpy_helper.from_array(a, n) for a, n in
         ((conv_w, "conv_w"), (fc1, "fc1"), (fc2, "fc2"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11),
                                                    helper.make_opsetid("mmcv", 1)])
    model.ir_version = 6
    image = rng.normal(size=(1, 3, 64, 64)).astype(np.float32)
    # proposals of 4-60 image pixels: at least one pixel on the stride-4 feature map
    corner = rng.uniform(0, 40, (12, 2))
    boxes = np.concatenate([corner, corner + rng.uniform(4, 24, (12, 2))], 1)
    rois = np.concatenate([np.zeros((12, 1)), boxes], 1).astype(np.float32)
    # the reference: torch's RoI align (tests/test_roi_align.py) and numpy for the rest
    import torch

    features = torch.nn.functional.conv2d(torch.from_numpy(image), torch.from_numpy(conv_w),
                                          stride=4, padding=1).numpy()
    pooled = torch_roi_align(features, boxes.astype(np.float32), np.zeros(12, np.int64), 7,
                             7, 0.25, 0, 1, False)
    hidden = np.maximum(pooled.reshape(12, -1).astype(np.float64) @ fc1, 0) @ fc2
    scores = np.exp(hidden - hidden.max(1, keepdims=True))
    scores /= scores.sum(1, keepdims=True)
    return model, {"image": image, "rois": rois}, [scores.astype(np.float32)]


MODELS: dict[str, Callable[[], tuple[onnx.ModelProto, dict[str, np.ndarray],
                                     list[np.ndarray] | None]]] = {
    "stn": stn, "vit": vit, "bert": bert, "llama": llama, "detr": detr, "head": head}


def _error(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> str:
    worst = 0.0
    for a, b in zip(got, want, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if a.shape != b.shape:
            return f"shape {a.shape} != {b.shape}"
        excess = np.abs(a - b) - (ATOL + RTOL * np.abs(b))
        if (excess > 0).any():
            return f"**off by {np.abs(a - b).max():.2g}**"
        worst = max(worst, float(np.abs(a - b).max()) if a.size else 0.0)
    return f"ok ({worst:.1g})"


def measure(names: Sequence[str], engines: Sequence[str]) -> list[list[str]]:
    import decomposer
    from decomposer import engines as engine_runner
    from decomposer.opsets import default_opset

    rows = []
    for name in names:
        model, feeds, reference = MODELS[name]()
        source = default_opset(model) or 0
        if reference is None:
            try:
                reference = _feeds_reference(model, feeds)
            except Exception:  # custom nodes: the model decomposed at its own opset
                reference = _feeds_reference(decomposer.decompose(model), feeds)
        for target in [t for t in (17, 13, 11) if t < source] + [source]:
            label = f"{target}" if target < source else f"{target} (own)"
            try:
                out, report = decomposer.decompose_with_report(model, target_opset=target)
            except decomposer.DecomposerError as exc:
                line = " ".join(str(exc).split())[:150]
                rows.append([name, str(source), label, "-", f"refused: {line}"]
                            + [""] * (len(engines) - 1))
                continue
            cells = []
            for engine in engines:
                try:
                    got = engine_runner.run_model(engine, out, feeds,
                                                  static_shapes=engine == "tvm")
                    cells.append(_error(got, reference))
                except Exception as exc:  # noqa: BLE001 - the cell records it
                    cells.append("fails: " + " ".join(str(exc).split())[:90])
            rows.append([name, str(source), label, str(len(out.graph.node)), *cells])
            print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--engines", default=",".join(ENGINES))
    args = parser.parse_args(argv)
    engines = args.engines.split(",")
    rows = measure(args.models.split(","), engines)
    print("| model | opset | target | nodes | " + " | ".join(engines) + " |")
    print("|---|---|---|---|" + "---|" * len(engines))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
