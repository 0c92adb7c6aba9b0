"""Real ORT-optimized models: a BERT built from a ``transformers`` config with random weights
(no download), exported by torch, optimized by ``onnxruntime.transformers.optimizer``
(model_type bert: Attention, EmbedLayerNormalization, SkipLayerNormalization and BiasGelu
fused in), then decomposed. No ``com.microsoft`` node is left, and the outputs equal ONNX
Runtime's run of the optimized model and torch eager's, at two batch and sequence sizes.
The same model runs on OpenVINO and TVM through the portability suite (the hook below)."""

from __future__ import annotations

import functools
import tempfile
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
    with tempfile.TemporaryDirectory() as folder:
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
