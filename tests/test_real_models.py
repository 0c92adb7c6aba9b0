"""Real ORT-optimized models: BERT, ViT and GPT-2 built from ``transformers`` configs with
random weights (no download), exported by torch, optimized by
``onnxruntime.transformers.optimizer`` (BERT: Attention, EmbedLayerNormalization,
SkipLayerNormalization and BiasGelu fused in; ViT: SkipLayerNormalization and BiasGelu;
GPT-2: SkipLayerNormalization and FastGelu, its attention left unfused by ONNX Runtime 1.32's
optimizer for this export), then decomposed. No ``com.microsoft`` node is left, and the
outputs equal ONNX Runtime's run of the optimized model and torch eager's, at two sizes.
BERT also runs on OpenVINO and TVM through the portability suite (the hook below)."""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import onnx
import pytest
import real_models

import decomposer

from _helpers import run_onnxruntime

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB, HIDDEN, HEADS = 100, 32, 4
SIZES = [(2, 7), (3, 11)]


@functools.cache
def bert():
    """(torch module, the ORT-optimized ONNX model)."""
    return real_models.bert(vocab=VOCAB, hidden=HIDDEN, heads=HEADS, layers=2,
                            intermediate=64, positions=64)


@functools.cache
def vit():
    torch.manual_seed(1)
    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=HIDDEN,
                                    num_hidden_layers=2, num_attention_heads=HEADS,
                                    intermediate_size=64, attn_implementation="eager")
    inner = transformers.ViTModel(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.vit = inner

        def forward(self, pixel_values):
            return self.vit(pixel_values=pixel_values).last_hidden_state

    module = Hidden().eval()
    model = real_models.ort_optimized(module, (torch.randn(2, 3, 32, 32),), ["pixel_values"],
                                      None, {"pixel_values": {0: "batch"}}, "vit",
                                      num_heads=HEADS, hidden_size=HIDDEN)
    return module, model


@functools.cache
def gpt2():
    torch.manual_seed(2)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=2, n_head=HEADS,
                                     n_positions=64, bos_token_id=0, eos_token_id=0,
                                     attn_implementation="eager")
    inner = transformers.GPT2Model(config).eval()

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gpt2 = inner

        def forward(self, input_ids, attention_mask):
            return self.gpt2(input_ids=input_ids, attention_mask=attention_mask,
                             use_cache=False).last_hidden_state

    module = Hidden().eval()
    feeds = _feeds(*SIZES[0], seed=0)
    example = (torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
    axes = {n: {0: "batch", 1: "sequence"} for n in ("input_ids", "attention_mask")}
    model = real_models.ort_optimized(module, example, ["input_ids", "attention_mask"], None,
                                      axes, "gpt2", num_heads=HEADS, hidden_size=HIDDEN)
    return module, model


@pytest.mark.parametrize("name, fused", [
    ("vit", {"SkipLayerNormalization": 4, "BiasGelu": 2}),
    ("gpt2", {"SkipLayerNormalization": 4, "FastGelu": 2}),
])
def test_vit_and_gpt2_optimized_by_onnxruntime(name, fused):
    module, optimized = {"vit": vit, "gpt2": gpt2}[name]()
    assert Counter(n.op_type for n in optimized.graph.node
                   if n.domain == "com.microsoft") == fused
    out = decomposer.decompose(optimized)
    assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
    rng = np.random.default_rng(3)
    for batch, seq in SIZES:
        if name == "vit":
            feeds = {"pixel_values": rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)}
            with torch.no_grad():
                eager = [module(torch.from_numpy(feeds["pixel_values"])).numpy()]
        else:
            feeds = {k: v for k, v in _feeds(batch, seq, seed=seq).items()
                     if k != "token_type_ids"}
            with torch.no_grad():
                eager = [module(*(torch.from_numpy(v) for v in feeds.values())).numpy()]
        got = run_onnxruntime(out, feeds)
        for g, o, e in zip(got, run_onnxruntime(optimized, feeds), eager, strict=True):
            np.testing.assert_allclose(g, o, atol=2e-6, rtol=1e-5)
            np.testing.assert_allclose(g, e, atol=2e-5, rtol=1e-4)


def _feeds(batch, seq, seed):
    return real_models.bert_feeds(batch, seq, seed, VOCAB)


def _eager(module, feeds):
    with torch.no_grad():
        outputs = module(*(torch.from_numpy(feeds[n]) for n in real_models.BERT_INPUTS))
    return [o.numpy() for o in outputs]


def test_bert_optimized_by_onnxruntime_decomposes_to_standard_ops():
    module, optimized = bert()
    fused = Counter(n.op_type for n in optimized.graph.node if n.domain == "com.microsoft")
    assert fused == {"Attention": 2, "EmbedLayerNormalization": 1, "SkipLayerNormalization": 4,
                     "BiasGelu": 2}, fused
    out, report = decomposer.decompose_with_report(optimized)
    assert report.counts == dict(fused)
    assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
    onnx.checker.check_model(out, full_check=True)
    for index, (batch, seq) in enumerate(SIZES):
        feeds = _feeds(batch, seq, seed=index + 1)
        got = run_onnxruntime(out, feeds)
        for g, o in zip(got, run_onnxruntime(optimized, feeds), strict=True):
            np.testing.assert_allclose(g, o, atol=2e-6, rtol=1e-5,
                                       err_msg="vs ONNX Runtime's run of the optimized model")
        for g, e in zip(got, _eager(module, feeds), strict=True):
            np.testing.assert_allclose(g, e, atol=2e-5, rtol=1e-4, err_msg="vs torch eager")


# -- portability (the hook of scripts/portability_cases.py) ---------------------------------


def portability_cases():
    """The ORT-optimized BERT (contrib nodes in), against torch eager at two sizes."""
    module, optimized = bert()
    feeds = [_feeds(batch, seq, seed=10 + i) for i, (batch, seq) in enumerate(SIZES)]
    return [{"id": "BERT optimized by onnxruntime.transformers (real model)",
             "model": optimized, "feeds": feeds,
             "expected": [_eager(module, f) for f in feeds], "atol": 2e-5}]
