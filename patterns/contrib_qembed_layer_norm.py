"""ONNX Runtime's com.microsoft QEmbedLayerNormalization (what ``quantize_dynamic`` writes for
the fused EmbedLayerNormalization of ONNX Runtime's transformer optimizer) as the float
EmbedLayerNormalization of :mod:`contrib_normalizations` on its dequantized tables.

Matches ``QEmbedLayerNormalization(input_ids, segment_ids, word_embedding_quant,
position_embedding_quant, segment_embedding, gamma_quant, beta_quant, mask,
word_embedding_scale, position_embedding_scale, segment_embedding_scale, gamma_scale,
beta_scale, word_embedding_zero_point, position_embedding_zero_point,
segment_embedding_zero_point, gamma_zero_point, beta_zero_point; epsilon=1e-12)`` ->
``layernorm_out, mask_index_out`` in com.microsoft (the schema ONNX Runtime 1.32 registers):
ids and mask int32, the tables and gamma/beta uint8 or int8 with per-tensor float32 scales
and zero points. Every table is dequantized as the kernel does, ``(q - zero_point) *
scale`` in float32, then the node is ONNX Runtime's EmbedLayerNormalization (positions 0 ..
S-1; ``mask_index_out`` counts each row's mask ones, zeros without a mask).

Before -> after::

    QEmbedLayerNormalization(ids, seg, Wq, Pq, Sq, Gq, Bq, mask, scales..., zero points...)
      ->  the decomposition of EmbedLayerNormalization(ids, seg, W, P, S, G, B, mask) with
          W = (Wq - zW) * sW, ... as float32 initializers

The tables are dequantized once, at decompose time, so they must be initializers (they are,
in what the quantizer writes); the result agrees with ONNX Runtime's kernel to float
rounding (checked against it).

Envelope: as EmbedLayerNormalization's (opsets 11+, B and S dynamic).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import onnx.numpy_helper
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_shape, require_size, require_type
from decomposer.examples import I32, Example
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode

from .contrib_normalizations import EmbedLayerNormalization

MS = frozenset({"com.microsoft"})
U8, I8 = TensorProto.UINT8, TensorProto.INT8
_TABLES = ("word_embedding", "position_embedding", "segment_embedding", "gamma", "beta")


class QEmbedFacts(NamedTuple):
    elem_type: int
    tables: tuple[tuple[str, np.ndarray], ...]  # role -> dequantized float32 values


def _q(values: int) -> np.ndarray:
    return np.arange(values, dtype=np.uint8) % 7


class QEmbedLayerNormalization(EmbedLayerNormalization):
    op_type = "QEmbedLayerNormalization"
    forms = (Form("QEmbedLayerNormalization", domains=MS, inputs=(
        In("input_ids"), In("segment_ids", optional=True), In("word_embedding_quant"),
        In("position_embedding_quant"), In("segment_embedding_quant", optional=True),
        In("gamma_quant"), In("beta_quant"), In("mask", optional=True),
        In("word_embedding_scale"), In("position_embedding_scale"),
        In("segment_embedding_scale", optional=True), In("gamma_scale"), In("beta_scale"),
        In("word_embedding_zero_point"), In("position_embedding_zero_point"),
        In("segment_embedding_zero_point", optional=True), In("gamma_zero_point"),
        In("beta_zero_point")), attributes={"epsilon": Attr("float", default=1e-12)},
        outputs=(1, 2)),)
    examples = (
        Example((("ids", I32, ("B", "S")), ("m", I32, ("B", "S"))),
                ((TensorProto.FLOAT, 3), (I32, 1)),
                args=("ids", "", _q(80).reshape(10, 8), _q(64).reshape(8, 8), "", _q(8),
                      _q(8), "m", np.array(0.1, np.float32), np.array(0.1, np.float32), "",
                      np.array(0.1, np.float32), np.array(0.1, np.float32),
                      np.array(3, np.uint8), np.array(3, np.uint8), "",
                      np.array(0, np.uint8), np.array(0, np.uint8)),
                domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> QEmbedFacts:  # type: ignore[override]
        for name in ("input_ids", "segment_ids", "mask"):
            if node.tensor(name):
                require_type(ctx, node.tensor(name), name, (TensorProto.INT32,))
        require_shape(ctx, node.tensor("input_ids"), "input_ids", "(batch, sequence)", 2, 2)
        if bool(node.tensor("segment_ids")) != bool(node.tensor("segment_embedding_quant")):
            raise Reject("segment_ids and segment_embedding come together")
        tables = []
        for role in _TABLES:
            quantized = node.tensor(f"{role}_quant")
            if not quantized:
                continue
            q_type = require_type(ctx, quantized, f"{role}_quant", (U8, I8))
            require_type(ctx, node.tensor(f"{role}_scale"), f"{role}_scale",
                         (TensorProto.FLOAT,))
            require_type(ctx, node.tensor(f"{role}_zero_point"), f"{role}_zero_point",
                         (q_type,))
            values = ctx.weight(quantized)
            scale = ctx.constant(node.tensor(f"{role}_scale"))
            zero = ctx.constant(node.tensor(f"{role}_zero_point"))
            if values is None or scale is None or zero is None:
                raise Reject(f"{role}, its scale and zero point must be initializers (they "
                             "are dequantized at decompose time)")
            if scale.size != 1 or zero.size != 1:
                raise Reject(f"{role}'s scale and zero point must be per tensor")
            require_size(int(values.size), f"the dequantized {role}")
            dequantized = (values.astype(np.int32) - int(zero.reshape(-1)[0])).astype(
                np.float32) * np.float32(scale.reshape(-1)[0])
            tables.append((role, dequantized))
        known = dict(tables)
        if known["word_embedding"].ndim != 2 or known["position_embedding"].ndim != 2:
            raise Reject("the embedding tables must be 2-D")
        hidden = known["word_embedding"].shape[1]
        if any(table.ndim == 0 or table.shape[-1] != hidden or
               (role in ("gamma", "beta") and table.ndim != 1) or
               (role == "segment_embedding" and table.ndim != 2)
               for role, table in known.items()):
            raise Reject("the tables (2-D), gamma and beta (1-D) must share the hidden size")
        return QEmbedFacts(TensorProto.FLOAT, tuple(tables))

    def table(self, b: Builder, node: MatchedNode, facts: Any, name: str) -> Value:
        values = dict(facts.tables)[name]
        return b.weight(onnx.numpy_helper.from_array(values), hint=name)


    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Any) -> list[Any]:
        ids = ctx.shape(node.tensor("input_ids"))
        hidden = dict(facts.tables)["word_embedding"].shape[1]
        rows = [*ids, hidden] if ids is not None else None
        return [(TensorProto.FLOAT, rows),
                (TensorProto.INT32, [ids[0]] if ids is not None else None)][:len(node.outputs)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        floats: dict[str, np.ndarray | None] = {}
        for role in _TABLES:
            q = tensors.get(f"{role}_quant")
            if q is None:
                floats[role] = None
                continue
            scale, zero = tensors[f"{role}_scale"], tensors[f"{role}_zero_point"]
            assert scale is not None and zero is not None
            floats[role] = (q.astype(np.int32) - int(zero.reshape(-1)[0])).astype(
                np.float32) * np.float32(scale.reshape(-1)[0])
        outputs = super().compute(args, input_ids=tensors["input_ids"],
                                  segment_ids=tensors.get("segment_ids"),
                                  mask=tensors.get("mask"), position_ids=None, **floats)
        return outputs[:2]


PATTERNS = [QEmbedLayerNormalization()]
