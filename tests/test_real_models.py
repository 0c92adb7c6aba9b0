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
import tempfile
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

import decomposer

from _helpers import run_onnxruntime

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB, HIDDEN, HEADS = 100, 32, 4
INPUTS = ("input_ids", "attention_mask", "token_type_ids")
SIZES = [(2, 7), (3, 11)]


@functools.cache
def bert():
    """(torch module, the ORT-optimized ONNX model)."""
    from onnxruntime.transformers import optimizer

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=HEADS,
        intermediate_size=64, max_position_embeddings=64, attn_implementation="eager")
    inner = transformers.BertModel(config).eval()

    class Outputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = inner

        def forward(self, input_ids, attention_mask, token_type_ids):
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids)
            return out.last_hidden_state, out.pooler_output

    module = Outputs().eval()
    example = tuple(torch.from_numpy(a) for a in _feeds(*SIZES[0], seed=0).values())
    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter's notice
        exported = Path(folder) / "bert.onnx"
        torch.onnx.export(module, example, str(exported), input_names=list(INPUTS),
                          output_names=["last_hidden_state", "pooler_output"],
                          dynamic_axes={n: {0: "batch", 1: "sequence"} for n in INPUTS},
                          opset_version=17, dynamo=False)
        optimized = optimizer.optimize_model(str(exported), model_type="bert",
                                             num_heads=HEADS, hidden_size=HIDDEN, opt_level=0)
        # as users do: saved (the optimizer sorts the graph on saving), then loaded
        saved = Path(folder) / "bert_optimized.onnx"
        optimized.save_model_to_file(str(saved))
        return module, onnx.load(saved)


def _optimized(module, example, names, dynamic_axes, model_type, **options):
    from onnxruntime.transformers import optimizer

    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter's notice
        exported = Path(folder) / "model.onnx"
        torch.onnx.export(module, example, str(exported), input_names=list(names),
                          dynamic_axes=dynamic_axes, opset_version=17, dynamo=False)
        optimized = optimizer.optimize_model(str(exported), model_type=model_type,
                                             opt_level=0, **options)
        saved = Path(folder) / "optimized.onnx"
        optimized.save_model_to_file(str(saved))
        return onnx.load(saved)


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
    model = _optimized(module, (torch.randn(2, 3, 32, 32),), ["pixel_values"],
                       {"pixel_values": {0: "batch"}}, "vit", num_heads=HEADS,
                       hidden_size=HIDDEN)
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
    model = _optimized(module, example, ["input_ids", "attention_mask"], axes, "gpt2",
                       num_heads=HEADS, hidden_size=HIDDEN)
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
    rng = np.random.default_rng(seed)
    # right padding, as tokenizers write it (ORT's optimizer turns the mask into lengths)
    lengths = rng.integers(1, seq + 1, batch)
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int64)
    return {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64),
            "attention_mask": mask,
            "token_type_ids": rng.integers(0, 2, (batch, seq)).astype(np.int64)}


def _eager(module, feeds):
    with torch.no_grad():
        outputs = module(*(torch.from_numpy(feeds[n]) for n in INPUTS))
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
