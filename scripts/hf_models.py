"""Tiny Hugging Face transformers with random weights, exported to ONNX, for the tests and
benchmarks of ONNX Runtime's quantization tools (needs torch and transformers).

In: a path, a ``BertConfig``'s keyword arguments and example token ids. Out:
:func:`export_bert` writes a BERT taking ``ids`` and ``mask`` (batch and sequence dynamic)
and returning the last hidden state, exported by torch's legacy exporter at opset 17, the
form ONNX Runtime's transformer optimizer and quantizers read; :func:`bert_qoperator`
that BERT through ``quantize_static(..., quant_format=QOperator)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
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


def bert_qoperator(folder: Path, sequence: int = 64, **config: Any):
    """``export_bert`` of ``config`` through quantize_static QOperator (calibrated on four
    random token batches of ``sequence`` tokens), loaded."""
    import onnx
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    source, target = folder / "bert.onnx", folder / "bert_qop.onnx"
    vocab = int(config["vocab_size"])
    export_bert(source, torch.randint(0, vocab, (1, sequence)), **config)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{"ids": np.random.default_rng(i).integers(0, vocab,
                                                                         (1, sequence)),
                                "mask": np.ones((1, sequence), np.int64)} for i in range(4)])

        def get_next(self):
            return next(self.feeds, None)

    # the exported BERT defeats the quantizer's type inference without DefaultTensorType
    quantize_static(str(source), str(target), Reader(), quant_format=QuantFormat.QOperator,
                    extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return onnx.load(str(target))
