"""Tiny Hugging Face transformers with random weights, exported to ONNX, for the tests and
benchmarks of ONNX Runtime's quantization tools (needs torch and transformers).

In: a path, a ``BertConfig``'s keyword arguments and example token ids. Out:
:func:`export_bert` writes a BERT taking ``ids`` and ``mask`` (batch and sequence dynamic)
and returning the last hidden state, exported by torch's legacy exporter at opset 17, the
form ONNX Runtime's transformer optimizer and quantizers read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def export_bert(path: Path, ids: torch.Tensor, **config: Any) -> None:
    """A ``BertModel(BertConfig(**config))`` (seeded weights) written to ``path``."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    bert = BertModel(BertConfig(**config)).eval()

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    torch.onnx.export(Wrapper().eval(), (ids, torch.ones_like(ids)), str(path),
                      opset_version=17, dynamo=False, input_names=["ids", "mask"],
                      dynamic_axes={"ids": {0: "b", 1: "s"}, "mask": {0: "b", 1: "s"}})
