"""Real transformer models optimized by ONNX Runtime's transformer optimizer, built offline.

In: a ``transformers`` config's sizes (random weights, no download). Out: the torch module
and the ONNX model ``onnxruntime.transformers.optimizer`` makes of its export (torch's legacy
exporter, opset 17, dynamic batch and sequence), saved and reloaded as users do (the
optimizer sorts the graph on saving); and feeds with a right-padded attention mask, as a
tokenizer writes it (the optimizer turns the mask into key lengths). Used by
``tests/test_real_models.py`` and ``scripts/bench_contrib_models.py``.
"""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

BERT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
BERT_OUTPUTS = ("last_hidden_state", "pooler_output")


def ort_optimized(module: Any, example: tuple[Any, ...], input_names: Sequence[str],
                  output_names: Sequence[str] | None, dynamic_axes: Mapping[str, Any],
                  model_type: str, **options: Any) -> onnx.ModelProto:
    """``module`` exported and optimized by ``onnxruntime.transformers.optimizer``."""
    import torch
    from onnxruntime.transformers import optimizer

    with tempfile.TemporaryDirectory() as folder, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the legacy exporter's notice
        exported = Path(folder) / "model.onnx"
        torch.onnx.export(module, example, str(exported), input_names=list(input_names),
                          output_names=list(output_names) if output_names else None,
                          dynamic_axes=dict(dynamic_axes), opset_version=17, dynamo=False)
        optimized = optimizer.optimize_model(str(exported), model_type=model_type,
                                             opt_level=0, **options)
        saved = Path(folder) / "optimized.onnx"
        optimized.save_model_to_file(str(saved))
        return onnx.load(saved)


def bert_feeds(batch: int, sequence: int, seed: int, vocab: int) -> dict[str, np.ndarray]:
    """Random ids and segments; the mask right-padded to a random length per row."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, sequence + 1, batch)
    mask = (np.arange(sequence)[None] < lengths[:, None]).astype(np.int64)
    return {"input_ids": rng.integers(0, vocab, (batch, sequence)).astype(np.int64),
            "attention_mask": mask,
            "token_type_ids": rng.integers(0, 2, (batch, sequence)).astype(np.int64)}


def bert(*, vocab: int, hidden: int, heads: int, layers: int, intermediate: int,
         positions: int, seed: int = 0) -> tuple[Any, onnx.ModelProto]:
    """(torch module returning (last_hidden_state, pooler_output), its ORT-optimized ONNX
    model: Attention, EmbedLayerNormalization, SkipLayerNormalization and BiasGelu fused in)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = transformers.BertConfig(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=heads, intermediate_size=intermediate,
        max_position_embeddings=positions, attn_implementation="eager")
    inner = transformers.BertModel(config).eval()

    class Outputs(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = inner

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                            token_type_ids=token_type_ids)
            return out.last_hidden_state, out.pooler_output

    module = Outputs().eval()
    example = tuple(torch.from_numpy(a) for a in bert_feeds(2, 7, 0, vocab).values())
    model = ort_optimized(module, example, BERT_INPUTS, BERT_OUTPUTS,
                          {n: {0: "batch", 1: "sequence"} for n in BERT_INPUTS}, "bert",
                          num_heads=heads, hidden_size=hidden)
    return module, model
