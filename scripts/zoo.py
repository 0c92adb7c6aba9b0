"""A zoo of small, typical ONNX exports for an engine-portability matrix.

In: nothing (needs torch, transformers, onnx, onnxruntime, numpy). Every builder seeds its
own RNGs, so each run gives the same weights and feeds.
Out: ``ZOO``, a dict name -> builder; each builder returns ``(onnx.ModelProto, feeds)``, where
feeds maps input names to numpy arrays (static shapes, batch 1, float32 unless the input is
an index, a mask or a scalar flag). ``main()`` writes ``NAME.onnx``, ``NAME.npz`` (the
feeds) and ``NAME.expected.npz`` (ONNX Runtime CPU outputs as out0, out1, ...) into
bench-results/zoo/ and prints a table: name, opset, op types, ORT ok, file size, ORT run
time. scripts/engine_matrix.py runs the zoo on every engine, before and after --target.

Torch models go through the TorchScript exporter (``dynamo=False``) unless the builder says
why it uses ``dynamo=True``; the rest are written with ``onnx.helper``.
"""

from __future__ import annotations

import collections
import contextlib
import io
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import nn

OUT_DIR = Path(__file__).resolve().parent.parent / "bench-results" / "zoo"
SEED = 0
Feeds = dict[str, np.ndarray]


# ----------------------------------------------------------------------------- helpers

def _rng() -> np.random.Generator:
    return np.random.default_rng(SEED)


def _export(module: nn.Module, args: tuple, opset: int, names: list[str],
            dynamo: bool = False, **kw) -> onnx.ModelProto:
    """Export eval-mode ``module`` to a ModelProto; ``names`` are the input names."""
    module.eval()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if dynamo:
            prog = torch.onnx.export(module, args, dynamo=True, opset_version=opset,
                                     input_names=names, verbose=False, **kw)
            return prog.model_proto
        buf = io.BytesIO()
        torch.onnx.export(module, args, buf, dynamo=False, opset_version=opset,
                          input_names=names, **kw)
        return onnx.load_from_string(buf.getvalue())


def _feeds(names: list[str], args: tuple) -> Feeds:
    return {n: a.numpy() for n, a in zip(names, args, strict=False)}


def _model(nodes, inputs, outputs, opset: int, inits=()) -> onnx.ModelProto:
    """A helper-built model; inputs/outputs are (name, elem_type, shape) triples."""
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [vi(*i) for i in inputs],
                              [vi(*o) for o in outputs], initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    # IR version: the lowest that knows the opset, so older runtimes can still load it.
    m.ir_version = helper.find_min_ir_version_for(list(m.opset_import))
    return m


def _init(name: str, arr) -> TensorProto:
    return numpy_helper.from_array(np.asarray(arr), name)


F32 = TensorProto.FLOAT
I64 = TensorProto.INT64


# ----------------------------------------------------------------------------- 1. ResNet

class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                      nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


def resnet18ish():
    torch.manual_seed(SEED)
    net = nn.Sequential(
        nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
        _BasicBlock(16, 16), _BasicBlock(16, 32, 2), _BasicBlock(32, 64, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    for m in net.modules():  # non-trivial BN statistics, so folding them matters
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    args = (torch.randn(1, 3, 64, 64),)
    return _export(net, args, 17, ["x"]), _feeds(["x"], args)


# ----------------------------------------------------------------------------- 2-3. ViT

class _Block(nn.Module):
    """Pre-norm encoder layer with hand-written attention (nn.TransformerEncoderLayer's
    fused fast path is not what exporters usually see from ViT code)."""

    def __init__(self, d: int, heads: int, tokens: int):
        super().__init__()
        self.h, self.n, self.d = heads, tokens, d
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x):
        h, n, d = self.h, self.n, self.d
        q, k, v = self.qkv(self.ln1(x)).reshape(1, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-2, -1) * (d // h) ** -0.5, dim=-1)
        x = x + self.proj((a @ v).transpose(1, 2).reshape(1, n, d))
        return x + self.mlp(self.ln2(x))


class _TinyViT(nn.Module):
    def __init__(self, img=32, patch=8, d=64, heads=4, layers=2, classes=10):
        super().__init__()
        n = (img // patch) ** 2 + 1
        self.patch = nn.Conv2d(3, d, patch, patch)
        self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.pos = nn.Parameter(torch.randn(1, n, d) * 0.02)
        self.blocks = nn.Sequential(*[_Block(d, heads, n) for _ in range(layers)])
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls, x], dim=1) + self.pos
        return self.head(self.ln(self.blocks(x))[:, 0])


def _vit(opset: int, dynamo: bool = False):
    torch.manual_seed(SEED)
    net = _TinyViT()
    args = (torch.randn(1, 3, 32, 32),)
    return _export(net, args, opset, ["x"], dynamo=dynamo), _feeds(["x"], args)


def vit_op14():
    return _vit(14)  # LayerNormalization is opset 17: torch writes ReduceMean/Sub/Pow/Sqrt/Div


def vit_op17():
    return _vit(17)


def vit_dynamo():
    # 18 is the dynamo exporter's usual default; passed explicitly so the file doesn't
    # change with the torch version.
    return _vit(18, dynamo=True)


# ----------------------------------------------------------------------------- 4. Llama

def _llama(opset: int):
    """LlamaModel, 1 tiny layer. dynamo for both opsets: the TorchScript exporter fails on
    transformers' mask code (aten::diff is not supported)."""
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=2,
                      num_key_value_heads=2, num_hidden_layers=1, vocab_size=128,
                      max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"  # sdpa -> Attention-23 at opset 23
    torch.manual_seed(SEED)
    llama = LlamaModel(cfg).eval()

    class Wrap(nn.Module):  # plain tensor in, tensor out; no KV cache
        def __init__(self):
            super().__init__()
            self.m = llama

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, use_cache=False).last_hidden_state

    args = (torch.randint(0, 128, (1, 8)),)
    return _export(Wrap(), args, opset, ["input_ids"], dynamo=True), _feeds(["input_ids"], args)


def llama_op18():
    return _llama(18)


def llama_op23():
    return _llama(23)


# ----------------------------------------------------------------------------- 5. STN

def _affine_grid(theta: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """F.affine_grid(theta, [1, C, h, w], align_corners=False), written out: the TorchScript
    exporter has no symbolic for aten::affine_grid_generator below opset 20."""
    xs = (torch.arange(w, dtype=torch.float32) * 2 + 1) / w - 1  # pixel centres in [-1, 1]
    ys = (torch.arange(h, dtype=torch.float32) * 2 + 1) / h - 1
    gy, gx = torch.meshgrid(ys, xs, indexing="ij")
    base = torch.stack((gx, gy, torch.ones_like(gx)), -1).view(1, h * w, 3)
    return (base @ theta.transpose(1, 2)).view(1, h, w, 2)


class _STN(nn.Module):
    def __init__(self):
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(1, 8, 7), nn.MaxPool2d(2), nn.ReLU(),
                                 nn.Conv2d(8, 10, 5), nn.MaxPool2d(2), nn.ReLU())
        self.fc = nn.Sequential(nn.Linear(10 * 3 * 3, 32), nn.ReLU(), nn.Linear(32, 6))
        # Start near the identity transform, as STN training does, so the warp is sane.
        with torch.no_grad():
            self.fc[2].weight.mul_(0.1)
            self.fc[2].bias.copy_(torch.tensor([1.0, 0, 0, 0, 1, 0]))

    def forward(self, x):
        theta = self.fc(self.loc(x).flatten(1)).view(-1, 2, 3)
        if torch.onnx.is_in_onnx_export():
            grid = _affine_grid(theta, 28, 28)
        else:
            grid = F.affine_grid(theta, [1, 1, 28, 28], align_corners=False)
        return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros",
                             align_corners=False)


def stn_seed():
    torch.manual_seed(SEED)
    args = (torch.randn(1, 1, 28, 28),)
    return _export(_STN(), args, 16, ["x"]), _feeds(["x"], args)


# ----------------------------------------------------------------------------- 6-8. helper ops

def affine_grid20():
    rng = _rng()
    nodes = [helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=0),
             helper.make_node("GridSample", ["image", "grid"], ["y"], mode="linear",
                              padding_mode="zeros", align_corners=0)]
    theta = (np.array([[[0.9, -0.2, 0.1], [0.2, 0.9, -0.05]]])
             + 0.05 * rng.standard_normal((1, 2, 3))).astype(np.float32)
    feeds = {"theta": theta,
             "image": rng.standard_normal((1, 3, 16, 16)).astype(np.float32)}
    m = _model(nodes, [("theta", F32, [1, 2, 3]), ("image", F32, [1, 3, 16, 16])],
               [("y", F32, [1, 3, 16, 16])], 20,
               [_init("size", np.array([1, 3, 16, 16], np.int64))])
    return m, feeds


def gelu20():
    rng = _rng()
    w = (rng.standard_normal((32, 64)) / np.sqrt(32)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("Gelu", ["h"], ["y"], approximate="none")]
    m = _model(nodes, [("x", F32, [1, 16, 32])], [("y", F32, [1, 16, 64])], 20,
               [_init("w", w)])
    return m, {"x": rng.standard_normal((1, 16, 32)).astype(np.float32)}


def groupnorm21():
    rng = _rng()
    nodes = [helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"],
                              num_groups=4, epsilon=1e-5)]
    inits = [_init("scale", rng.uniform(0.5, 1.5, 8).astype(np.float32)),
             _init("bias", rng.uniform(-0.5, 0.5, 8).astype(np.float32))]
    m = _model(nodes, [("x", F32, [1, 8, 16, 16])], [("y", F32, [1, 8, 16, 16])], 21, inits)
    return m, {"x": (rng.standard_normal((1, 8, 16, 16)) * 2 + 1).astype(np.float32)}


# ------------------------------------------------------------------------ 9-10. dynamo-only ops

def mish18():
    # dynamo: the TorchScript exporter writes Mish as x * Tanh(Softplus(x)); dynamo writes Mish.
    torch.manual_seed(SEED)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Mish(),
                        nn.Conv2d(8, 8, 3, stride=2, padding=1), nn.Mish())
    args = (torch.randn(1, 3, 32, 32),)
    return _export(net, args, 18, ["x"], dynamo=True), _feeds(["x"], args)


def resize_aa18():
    # dynamo: TorchScript cannot export aten::_upsample_bilinear2d_aa; dynamo writes
    # Resize(mode=linear, antialias=1).
    class Down(nn.Module):
        def forward(self, x):
            return F.interpolate(x, size=(32, 32), mode="bilinear", antialias=True,
                                 align_corners=False)

    torch.manual_seed(SEED)
    args = (torch.randn(1, 3, 64, 64),)
    return _export(Down(), args, 18, ["x"], dynamo=True), _feeds(["x"], args)


# ----------------------------------------------------------------------------- 11-13. helper ops

def stft17():
    n = np.arange(128)
    hann = (0.5 - 0.5 * np.cos(2 * np.pi * n / 128)).astype(np.float32)  # periodic Hann
    inits = [_init("frame_step", np.array(64, np.int64)), _init("window", hann),
             _init("frame_length", np.array(128, np.int64))]
    nodes = [helper.make_node("STFT", ["signal", "frame_step", "window", "frame_length"],
                              ["spec"], onesided=1)]
    # (256 - 128) / 64 + 1 = 3 frames, 128 / 2 + 1 = 65 bins, (re, im)
    m = _model(nodes, [("signal", F32, [1, 256, 1])], [("spec", F32, [1, 3, 65, 2])], 17,
               inits)
    return m, {"signal": _rng().standard_normal((1, 256, 1)).astype(np.float32)}


def einsum12():
    rng = _rng()
    nodes = [helper.make_node("Einsum", ["a", "b"], ["ab"], equation="bij,bjk->bik"),
             helper.make_node("Einsum", ["q", "k"], ["qk"], equation="bhqd,bhkd->bhqk")]
    shapes = {"a": [1, 4, 5], "b": [1, 5, 6], "q": [1, 2, 8, 16], "k": [1, 2, 8, 16]}
    m = _model(nodes, [(n, F32, s) for n, s in shapes.items()],
               [("ab", F32, [1, 4, 6]), ("qk", F32, [1, 2, 8, 8])], 12)
    return m, {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}


def scatter_reduce():
    rng = _rng()
    # Duplicate row indices in a column, so 'add' differs from plain overwrite.
    idx = np.array([[0, 1, 2, 3, 0], [0, 3, 2, 1, 3], [2, 1, 0, 3, 0]], np.int64)
    nodes = [helper.make_node("ScatterElements", ["data", "indices", "updates"], ["y"],
                              axis=0, reduction="add")]
    m = _model(nodes, [("data", F32, [4, 5]), ("updates", F32, [3, 5])],
               [("y", F32, [4, 5])], 16, [_init("indices", idx)])
    return m, {"data": rng.standard_normal((4, 5)).astype(np.float32),
               "updates": rng.standard_normal((3, 5)).astype(np.float32)}


# ----------------------------------------------------------------------------- 14. YOLO heads

class _NMS(torch.autograd.Function):
    """ONNX NonMaxSuppression (center_point_box=1: boxes are cx, cy, w, h). No torchvision
    here, so torch's forward is a placeholder: the expected outputs come from ORT anyway."""

    @staticmethod
    def forward(ctx, boxes, scores, max_out, iou, score_thr):
        return torch.zeros(0, 3, dtype=torch.int64)

    @staticmethod
    def symbolic(g, boxes, scores, max_out, iou, score_thr):
        return g.op("NonMaxSuppression", boxes, scores, max_out, iou, score_thr,
                    center_point_box_i=1)


class _YoloHead(nn.Module):
    """A yolov5-style Detect layer on one 16x16 level: the grid is built from the feature
    map's run-time shape (Shape -> Range), as yolov5's export writes it."""

    na, nc, stride = 3, 4, 4

    def __init__(self, nms: bool):
        super().__init__()
        self.nms, self.no = nms, 5 + self.nc
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.SiLU(),
                                  nn.Conv2d(16, 32, 3, 2, 1), nn.SiLU())
        self.det = nn.Conv2d(32, self.na * self.no, 1)
        self.register_buffer("anchors", torch.tensor([[10., 13], [16, 30], [33, 23]])
                             .view(1, self.na, 1, 1, 2))

    def forward(self, x):
        p = self.det(self.stem(x))
        bs, _, ny, nx = p.shape  # traced as Shape -> Gather
        p = p.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous().sigmoid()
        yv, xv = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
        grid = torch.stack((xv, yv), 2).view(1, 1, ny, nx, 2).float()
        xy = (p[..., :2] * 2 - 0.5 + grid) * self.stride
        wh = (p[..., 2:4] * 2) ** 2 * self.anchors
        boxes = torch.cat((xy, wh), -1).view(bs, -1, 4)          # 1 x N x 4 (cx, cy, w, h)
        scores = (p[..., 4:5] * p[..., 5:]).view(bs, -1, self.nc)  # obj * cls, 1 x N x nc
        if not self.nms:
            best, cls = scores.max(-1)
            # K = min(100, N) from the run-time shape; a tensor K is traced, not baked in.
            k = torch.minimum(torch.tensor(100), torch._shape_as_tensor(best)[1])
            top, idx = best.topk(k, dim=1)
            return boxes[0, idx[0]], top[0], cls[0, idx[0]]
        sel = _NMS.apply(boxes, scores.transpose(1, 2), torch.tensor([50]),
                         torch.tensor([0.5]), torch.tensor([0.25]))  # (batch, class, box)
        return boxes[0, sel[:, 2]], scores[0, sel[:, 2], sel[:, 1]], sel[:, 1]


def _yolo(nms: bool, opset: int):
    torch.manual_seed(SEED)
    args = (torch.rand(1, 3, 64, 64),)
    # With a fully static input the exporter folds Shape -> Range into a constant grid, so
    # export with dynamic H, W (yolov5's --dynamic) to keep the run-time grid, then declare
    # the input static again.
    outs = ["boxes", "scores", "classes"]
    axes = {"images": {2: "h", 3: "w"}} | {o: {0: "n"} for o in outs}
    m = _export(_YoloHead(nms), args, opset, ["images"], output_names=outs, dynamic_axes=axes)
    for d, v in zip(m.graph.input[0].type.tensor_type.shape.dim, args[0].shape, strict=False):
        d.Clear()
        d.dim_value = v
    del m.graph.value_info[:]  # symbolic h, w; shape inference redoes them from 64x64
    return m, _feeds(["images"], args)


def yolo_head_a():
    return _yolo(False, 17)


def yolo_head_b():
    return _yolo(True, 11)


# ----------------------------------------------------------------------------- 15-17. extras

class _MaskedAttn(nn.Module):
    def __init__(self, d=32, h=2):
        super().__init__()
        self.h, self.d = h, d
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x, mask):
        q, k, v = self.qkv(x).reshape(1, 8, 3, self.h, self.d // self.h).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # bool: True = attend
        return self.out(y.transpose(1, 2).reshape(1, 8, self.d))


def sdpa_bool_mask():
    torch.manual_seed(SEED)
    mask = torch.ones(1, 1, 8, 8, dtype=torch.bool)
    mask[..., 6:] = False  # key padding: the last 2 tokens are padding
    args = (torch.randn(1, 8, 32), mask)
    return _export(_MaskedAttn(), args, 17, ["x", "mask"]), _feeds(["x", "mask"], args)


def lstm_static():
    torch.manual_seed(SEED)
    args = (torch.randn(10, 1, 8),)  # seq 10, batch 1, features 8
    return _export(nn.LSTM(8, 16, 1), args, 14, ["x"]), _feeds(["x"], args)


def if_scalar():
    """Silero-VAD-like: a scalar int64 input ``sr`` picks the branch (16 kHz vs 8 kHz)."""
    rng = _rng()
    w16 = (rng.standard_normal((64, 32)) / 8).astype(np.float32)
    w8 = (rng.standard_normal((64, 32)) / 8).astype(np.float32)
    def out(n):
        return helper.make_tensor_value_info(n, F32, [1, 32])
    then_g = helper.make_graph([helper.make_node("MatMul", ["x", "w16"], ["t0"]),
                                helper.make_node("Relu", ["t0"], ["t1"])],
                               "sr16k", [], [out("t1")])
    else_g = helper.make_graph([helper.make_node("MatMul", ["x", "w8"], ["e0"]),
                                helper.make_node("Sigmoid", ["e0"], ["e1"])],
                               "sr8k", [], [out("e1")])
    nodes = [helper.make_node("Equal", ["sr", "k16000"], ["is16k"]),
             helper.make_node("If", ["is16k"], ["y"], then_branch=then_g, else_branch=else_g)]
    m = _model(nodes, [("x", F32, [1, 64]), ("sr", I64, [])], [("y", F32, [1, 32])], 16,
               [_init("w16", w16), _init("w8", w8), _init("k16000", np.array(16000, np.int64))])
    return m, {"x": rng.standard_normal((1, 64)).astype(np.float32),
               "sr": np.array(16000, np.int64)}


# ----------------------------------------------------------------------------- registry, main

ZOO: dict[str, Callable[[], tuple[onnx.ModelProto, Feeds]]] = {
    f.__name__: f for f in [
        resnet18ish, vit_op14, vit_op17, vit_dynamo, llama_op18, llama_op23, stn_seed,
        affine_grid20, gelu20, groupnorm21, mish18, resize_aa18, stft17, einsum12,
        scatter_reduce, yolo_head_a, yolo_head_b, sdpa_bool_mask, lstm_static, if_scalar]}


def opset_of(m: onnx.ModelProto) -> int:
    return next(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))


def op_types(m: onnx.ModelProto) -> str:
    """'Op xN' for every node type in the main graph and its subgraphs."""
    c: collections.Counter = collections.Counter()

    def walk(g):
        for n in g.node:
            c[(n.domain + "::" if n.domain not in ("", "ai.onnx") else "") + n.op_type] += 1
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    walk(a.g)
    walk(m.graph)
    return " ".join(f"{k}x{v}" if v > 1 else k for k, v in sorted(c.items()))


def run_ort(m: onnx.ModelProto, feeds: Feeds) -> tuple[list[np.ndarray], float]:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    sess.run(None, feeds)  # warm-up
    t = time.perf_counter()
    outs = sess.run(None, feeds)
    return outs, time.perf_counter() - t


def build(name: str) -> dict:
    """Build, check, save and run one model; returns its table row."""
    row = {"name": name, "opset": "-", "ops": "", "ort": "no", "kb": 0.0, "ms": 0.0, "err": ""}
    try:
        m, feeds = ZOO[name]()
        row.update(opset=opset_of(m), ops=op_types(m))
        onnx.checker.check_model(m, full_check=True)
        path = OUT_DIR / f"{name}.onnx"
        onnx.save(m, path)
        row["kb"] = path.stat().st_size / 1024
        np.savez(OUT_DIR / f"{name}.npz", **feeds)
        outs, dt = run_ort(m, feeds)
        np.savez(OUT_DIR / f"{name}.expected.npz", **{f"out{i}": o for i, o in enumerate(outs)})
        row.update(ort="ok", ms=dt * 1000)
    except Exception as e:  # noqa: BLE001 -- report and go on: one broken builder shouldn't stop the zoo
        row["err"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return row


def main(names: list[str] | None = None) -> list[dict]:
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    rows = [build(n) for n in (names or ZOO)]
    lines = ["| name | opset | op types | ORT ok | size KB | ORT ms |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['opset']} | {r['ops']} | {r['ort']} | {r['kb']:.1f} "
              f"| {r['ms']:.2f} |" for r in rows]
    lines += [f"\n{r['name']} FAILED: {r['err']}" for r in rows if r["err"]]
    lines.append(f"\ntotal build time: {time.perf_counter() - t0:.1f} s")
    print("\n".join(lines))
    if names is None:
        (OUT_DIR / "TABLE.md").write_text("\n".join(lines) + "\n")
    return rows


if __name__ == "__main__":
    main(sys.argv[1:] or None)
