"""ONNX Runtime's normalizations (SkipLayerNormalization, SkipSimplifiedLayerNormalization,
SimplifiedLayerNormalization, LayerNormalization below opset 17, EmbedLayerNormalization)
and ONNX's RMSNormalization below opset 23, as standard ops.

Matches, with the inputs, attributes and outputs of the schemas ONNX Runtime 1.32 registers
(``onnxruntime.capi.onnxruntime_pybind11_state.get_all_operator_schema()``; described in
its docs/ContribOperators.md) and the numbers of its CPU kernels:
- ``com.microsoft::SkipLayerNormalization(input, skip, gamma[, beta][, bias];
  epsilon=1e-12)`` -> ``output[, mean][, inv_std_var][, input_skip_bias_sum]``:
  ``s = input + skip (+ bias)``, ``output = (s - mean) / sqrt(var + epsilon) * gamma
  (+ beta)`` over the last axis; ``mean`` and ``inv_std_var`` are float32 of shape
  (..., 1); ``input_skip_bias_sum`` is ``s``. skip is (..., S, H) like input, or (S, H),
  or (1, S, H); gamma, beta, bias are (H,). What ONNX Runtime's transformer optimizer
  writes for BERT, ViT and GPT-2's residual LayerNorms.
- ``com.microsoft::SkipSimplifiedLayerNormalization(input, skip, gamma[, bias];
  epsilon=1e-12)``, same outputs: RMSNorm, ``output = s / sqrt(mean(s^2) + epsilon) *
  gamma``; ``mean`` is zeros (ONNX Runtime's kernel does not compute it), ``inv_std_var``
  ``1 / sqrt(mean(s^2) + epsilon)``. What the onnxruntime-genai builder writes for Llama-like
  models.
- ``SimplifiedLayerNormalization(X, scale; axis=-1, epsilon=1e-5, stash_type=1)`` ->
  ``Y[, inv_std_var]`` in the **default** domain (ONNX Runtime registers it there though it is
  no standard op; it is matched by op type wherever the default domain does not define it):
  RMSNorm over the axes from ``axis`` on; ``inv_std_var`` float32 of X's shape with those
  axes kept as 1.
- ``RMSNormalization(X, scale; axis=-1, epsilon=1e-5, stash_type=1)`` -> ``Y`` in the
  default domain below opset 23 (``--target-opset``): ONNX's RMSNorm, the same math as
  SimplifiedLayerNormalization.
- ``LayerNormalization(X, Scale[, B]; axis=-1, epsilon=1e-5, stash_type=1)`` ->
  ``Y[, Mean][, InvStdDev]`` in the default domain **below opset 17**, where ONNX Runtime's own
  registration (what its optimizer writes for a model exported at opset 16 or lower) is no
  standard op yet; from 17 it is ONNX's LayerNormalization and never offered to patterns.

- ``com.microsoft::EmbedLayerNormalization(input_ids[, segment_ids], word_embedding,
  position_embedding[, segment_embedding], gamma, beta[, mask][, position_ids];
  epsilon=1e-12, mask_index_type=1)`` -> ``output[, mask_index][, embedding_sum]``: BERT's
  embeddings. ``s = word_embedding[input_ids] + position_embedding[position_ids]
  (+ segment_embedding[segment_ids])``, positions 0..S-1 when position_ids is absent
  (position_ids (B, S) or (1, S)); output the LayerNorm of s; ``mask_index`` int32 (B,):
  how many elements of each mask row are 1, as ONNX Runtime's kernel counts them (zeros
  without a mask); ``embedding_sum`` is s. ids are int32; an id out of its table's range
  fails at run time as a Gather does.

Before -> after (SkipLayerNormalization with bias and beta)::

    SkipLayerNormalization(x, skip, gamma, beta, bias)
      ->  s = x + skip + bias;  y = LayerNormalization(s, gamma, beta)   (opset 17+)
      ->  s = x + skip + bias;  m = ReduceMean(s, [-1]);  d = s - m       (otherwise)
          y = d / Sqrt(ReduceMean(Pow(d, 2), [-1]) + epsilon) * gamma + beta

From opset 17, a layer norm (not RMS) whose statistics outputs are not asked for is ONNX's
own LayerNormalization (axis, epsilon, stash_type 1): measured on ONNX Runtime, OpenVINO,
TVM (static and dynamic), onnx2torch and both onnx2tf back ends with the real BERT and the
normalization cases. Otherwise (below 17, RMS, or mean / inv_std_var wanted: not every
converter writes LayerNormalization's extra outputs) the elementwise form, written in the
order of ONNX Runtime's LayerNormFusion and SimplifiedLayerNormFusion (ReduceMean, Sub,
Pow, ReduceMean, Add, Sqrt, Div, Mul, Add), which fuse it back into one kernel on ONNX
Runtime; every other engine runs the elementwise ops. float16 and bfloat16
are computed in float32 and rounded once (ONNX Runtime's kernels accumulate in float32),
float64 in float64.

Envelope: opsets 11+ (bfloat16: 13+); float16, bfloat16, float32 (and float64 for the two
default-domain ops, as their schemas say); the input's rank known (the axes are listed), every dim
dynamic; skip (S, H) or (1, S, H) broadcast over a 3-D input; gamma, beta, bias 1-D of the
last dim (SimplifiedLayerNormalization's and LayerNormalization's scale: the normalized
shape, or broadcastable to it). ``--target ort`` keeps the nodes, as for every contrib op.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_broadcastable, require_shape, require_type
from decomposer.examples import I32, Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._compute import ComputeType
from ._sampling import positions as sequence_positions

MS = frozenset({"com.microsoft"})
DEFAULT = frozenset({""})
_TYPES = (TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)
_SKIP_TYPES = _TYPES[:3]  # the Skip* schemas take no float64


class Facts(NamedTuple):
    elem_type: int  # of the input, the normalized output and the sum
    rank: int
    axes: tuple[int, ...]  # normalized over, non-negative
    shape: tuple[int | str | None, ...]


def _direct(outputs: dict[str, str], key: str, as_type: Any, dtype: Any) -> str | None:
    """The output name a value computed in ``dtype`` may write itself (no Cast needed)."""
    return outputs.get(key) or None if np.dtype(as_type) == np.dtype(dtype) else None


def _finish(b: Builder, outputs: dict[str, str], value: Value, key: str, as_type: Any
            ) -> None:
    """Write ``value`` to output ``key`` (a Cast) unless it already wrote it."""
    out = outputs.get(key)
    if out and value != out:
        b.Cast(value, as_type, out=out)


def normalize(b: Builder, s: Value, axes: list[int], epsilon: float, rms: bool,
              scale: Value, shift: Value | None, dtype: Any, original: Any,
              outputs: dict[str, str]) -> None:
    """Layer-normalize (or RMS-normalize) ``s`` over ``axes`` and write the ``outputs``
    asked for ("output" in ``original``'s type; "mean", "inv_std" as float32), computing
    in ``dtype``, in the order ONNX Runtime's LayerNorm fusions recognize."""

    def direct(key: str, as_type: Any) -> str | None:
        return _direct(outputs, key, as_type, dtype)

    def finish(value: Value, key: str, as_type: Any) -> None:
        _finish(b, outputs, value, key, as_type)

    if not rms and b.opset >= 17 and not outputs.get("mean") and not outputs.get("inv_std"):
        # ONNX's own LayerNormalization (opset 17+) where no statistics output is asked for.
        layer_norm = [s, scale] + ([shift] if shift is not None else [])
        y = b.op("LayerNormalization", *layer_norm, hint="layer_norm", dtype=dtype,
                 out=direct("output", original), axis=axes[0], epsilon=float(epsilon),
                 stash_type=1)
        finish(y, "output", original)
        return
    mean = None
    centered = s
    if not rms:
        mean = b.ReduceMean(s, axes, keepdims=True, hint="mean",
                            out=direct("mean", np.float32))
        centered = b.Sub(s, mean, hint="centered")
    variance = b.ReduceMean(b.Pow(centered, np.asarray(2.0, dtype), hint="squared"),
                            axes, keepdims=True, hint="variance")
    std = b.Sqrt(b.Add(variance, np.asarray(epsilon, dtype), hint="var_eps"), hint="std")
    y = b.Mul(b.Div(centered, std, hint="normalized"), scale, hint="scaled",
              out=None if shift is not None else direct("output", original))
    if shift is not None:
        y = b.Add(y, shift, hint="shifted", out=direct("output", original))
    finish(y, "output", original)
    if mean is not None:
        finish(mean, "mean", np.float32)
    elif outputs.get("mean"):  # ONNX Runtime's RMS kernels leave it zero
        b.ConstantOfShape(b.Shape(std, hint="stat_shape"), 0.0, np.float32,
                          out=outputs["mean"])
    if outputs.get("inv_std"):
        inv_std = b.Reciprocal(std, hint="inv_std", out=direct("inv_std", np.float32))
        finish(inv_std, "inv_std", np.float32)


class _Normalization(Pattern[Facts]):
    """Shared check/build. Subclasses set the flags and the names of their tensors."""

    rms = False  # RMSNorm (no mean subtracted)
    skipped = False  # input + skip (+ bias) first
    scale_name = "gamma"
    shift_name: str | None = "beta"
    # Outputs after the first, in order: "mean", "inv_std", "sum".
    extra_outputs: tuple[str, ...] = ()

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        x = node.tensor("input")
        elem_type = require_type(ctx, x, "input", _SKIP_TYPES if self.skipped else _TYPES)
        if elem_type == TensorProto.BFLOAT16 and ctx.opset < 13:
            raise Reject(f"bfloat16 needs opset 13 or newer (Cast has no bfloat16 at opset "
                         f"{ctx.opset})")
        shape = require_shape(ctx, x, "input", "to list the normalized axes", min_rank=1)
        rank = len(shape)
        axis = int(node.args.get("axis", -1))
        if not -rank <= axis < rank:
            raise Reject(f"axis {axis} is out of range for rank {rank}")
        axes = tuple(range(axis % rank, rank))
        normalized = tuple(shape[axis % rank:])
        for name in ("skip", self.scale_name, self.shift_name, "bias"):
            if name and node.tensor(name):
                require_type(ctx, node.tensor(name), name, (elem_type,))
                target, what = (shape, "the input") if name == "skip" else \
                    (normalized, "the normalized shape")
                require_broadcastable(ctx, node.tensor(name), name, target, what)
        if self.skipped:
            self._check_skip(node, ctx, shape)
        return Facts(elem_type, rank, axes, tuple(shape))

    def _check_skip(self, node: MatchedNode, ctx: MatchContext,
                    shape: tuple[int | str | None, ...]) -> None:
        skip = ctx.shape(node.tensor("skip"))
        if skip is not None and len(skip) not in (2, 3, len(shape)):
            raise Reject(f"skip has rank {len(skip)}; it must be like the input, (S, H) or "
                         f"(1, S, H)")
        for name in (self.scale_name, self.shift_name, "bias"):
            if name and node.tensor(name):
                vector = ctx.shape(node.tensor(name))
                if vector is not None and len(vector) != 1:
                    raise Reject(f"{name} must be 1-D (the hidden size), got rank "
                                 f"{len(vector)}")

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        compute = ComputeType(b, node, facts.elem_type)
        dtype, original, read = compute.dtype, compute.original, compute.read
        outputs = dict(zip(("output", *self.extra_outputs), node.outputs, strict=False))

        s = read("input")
        assert s is not None
        if self.skipped:
            bias, skip = read("bias"), read("skip")
            assert skip is not None
            s = b.Add(s, skip, hint="input_skip",
                      out=None if bias is not None else _direct(outputs, "sum", original, dtype))
            if bias is not None:
                s = b.Add(s, bias, hint="input_skip_bias",
                          out=_direct(outputs, "sum", original, dtype))
            _finish(b, outputs, s, "sum", original)
        shift, scale = read(self.shift_name), read(self.scale_name)
        assert scale is not None
        # negative axes: right whatever rank inference gave the input (counted from the end)
        rank = len(facts.shape)
        normalize(b, s, [axis - rank for axis in facts.axes], self._epsilon(node), self.rms,
                  scale, shift, dtype,
                  original, outputs)

    def _epsilon(self, node: MatchedNode) -> float:
        return float(node.args["epsilon"])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        stat_shape = [1 if axis in facts.axes else dim for axis, dim in enumerate(facts.shape)]
        kinds = {"mean": (TensorProto.FLOAT, stat_shape),
                 "inv_std": (TensorProto.FLOAT, stat_shape),
                 "sum": (facts.elem_type, list(facts.shape))}
        return [(facts.elem_type, list(facts.shape)),
                *(kinds[name] for name in self.extra_outputs)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["input"]
        assert x is not None
        wide = np.float64
        s = x.astype(wide)
        if self.skipped:
            skip = tensors["skip"]
            assert skip is not None
            s = s + skip.astype(wide)
            if tensors.get("bias") is not None:
                s = s + tensors["bias"].astype(wide)  # type: ignore[union-attr]
        sum_out = s.astype(x.dtype)
        axes = tuple(range(int(args.get("axis", -1)) % x.ndim, x.ndim))
        mean = np.zeros_like(s.mean(axis=axes, keepdims=True)) if self.rms \
            else s.mean(axis=axes, keepdims=True)
        centered = s - mean
        inv_std = 1.0 / np.sqrt((centered ** 2).mean(axis=axes, keepdims=True)
                                + float(args["epsilon"]))
        y = centered * inv_std * tensors[self.scale_name].astype(wide)  # type: ignore[union-attr]
        if self.shift_name and tensors.get(self.shift_name) is not None:
            y = y + tensors[self.shift_name].astype(wide)  # type: ignore[union-attr]
        extra = {"mean": mean.astype(np.float32), "inv_std": inv_std.astype(np.float32),
                 "sum": sum_out}
        return [y.astype(x.dtype), *(extra[name] for name in self.extra_outputs)]


class SkipLayerNormalization(_Normalization):
    op_type = "SkipLayerNormalization"
    skipped = True
    extra_outputs = ("mean", "inv_std", "sum")
    forms = (Form("SkipLayerNormalization", domains=MS,
                  inputs=(In("input"), In("skip"), In("gamma"), In("beta", optional=True),
                          In("bias", optional=True)),
                  attributes={"epsilon": Attr("float", default=1e-12)}, outputs=(1, 4)),)
    examples = (
        Example((("x", F, ("N", "S", 8)), ("s", F, ("N", "S", 8)), ("g", F, (8,)),
                 ("be", F, (8,)), ("bi", F, (8,))), ((F, 3), (F, 3), (F, 3), (F, 3)),
                attrs={"epsilon": 1e-5}, domains=(("com.microsoft", 17),)),
    )


class SkipSimplifiedLayerNormalization(_Normalization):
    op_type = "SkipSimplifiedLayerNormalization"
    rms = True
    skipped = True
    shift_name = None
    extra_outputs = ("mean", "inv_std", "sum")
    forms = (Form("SkipSimplifiedLayerNormalization", domains=MS,
                  inputs=(In("input"), In("skip"), In("gamma"), In("bias", optional=True)),
                  attributes={"epsilon": Attr("float", default=1e-12)}, outputs=(1, 4)),)
    examples = (
        Example((("x", F, ("N", "S", 8)), ("s", F, ("S", 8)), ("g", F, (8,))),
                ((F, 3), (F, 3), (F, 3), (F, 3)), domains=(("com.microsoft", 13),)),
    )


class SimplifiedLayerNormalization(_Normalization):
    op_type = "SimplifiedLayerNormalization"
    rms = True
    scale_name = "scale"
    shift_name = None
    extra_outputs = ("inv_std",)
    forms = (Form("SimplifiedLayerNormalization", domains=DEFAULT,
                  inputs=(In("input"), In("scale")),
                  attributes={"axis": Attr("int", default=-1),
                              "epsilon": Attr("float", default=1e-5),
                              "stash_type": Attr("int", default=1, choices=(1,))},
                  outputs=(1, 2)),)
    examples = (
        Example((("x", F, ("N", "S", 8)), ("g", F, (8,))), ((F, 3), (F, 3)),
                domains=(("", 17),)),
    )


class LayerNormalization(_Normalization):
    op_type = "LayerNormalization"
    scale_name = "scale"
    shift_name = "bias"
    extra_outputs = ("mean", "inv_std")
    forms = (Form("LayerNormalization", domains=DEFAULT,
                  inputs=(In("input"), In("scale"), In("bias", optional=True)),
                  attributes={"axis": Attr("int", default=-1),
                              "epsilon": Attr("float", default=1e-5),
                              "stash_type": Attr("int", default=1, choices=(1,))},
                  outputs=(1, 3)),)
    examples = (
        Example((("x", F, ("N", 4, 8)), ("g", F, (4, 8)), ("b", F, (4, 8))),
                ((F, 3), (F, 3), (F, 3)), attrs={"axis": 1}, domains=(("", 13),)),
    )


class RMSNormalization(_Normalization):
    """ONNX's RMSNormalization (opset 23) below 23, in SimplifiedLayerNormFusion's order."""

    op_type = "RMSNormalization"
    rms = True
    scale_name = "scale"
    shift_name = None
    forms = (Form("RMSNormalization", domains=DEFAULT,
                  inputs=(In("input"), In("scale")),
                  attributes={"axis": Attr("int", default=-1),
                              "epsilon": Attr("float", default=1e-5),
                              "stash_type": Attr("int", default=1, choices=(1,))}),)
    examples = (
        Example((("x", F, ("N", "S", 8)), ("g", F, (8,))), domains=(("", 17),)),
    )


class EmbedFacts(NamedTuple):
    elem_type: int  # of the embeddings and the outputs


class EmbedLayerNormalization(Pattern[EmbedFacts]):
    """BERT's embeddings: word + position (+ segment) rows, then a LayerNorm."""

    op_type = "EmbedLayerNormalization"
    forms = (Form("EmbedLayerNormalization", domains=MS,
                  inputs=(In("input_ids"), In("segment_ids", optional=True),
                          In("word_embedding"), In("position_embedding"),
                          In("segment_embedding", optional=True), In("gamma"), In("beta"),
                          In("mask", optional=True), In("position_ids", optional=True)),
                  attributes={"epsilon": Attr("float", default=1e-12),
                              "mask_index_type": Attr("int", default=1, choices=(0, 1))},
                  outputs=(1, 3)),)
    examples = (
        Example((("ids", I32, ("B", "S")), ("seg", I32, ("B", "S")), ("we", F, (20, 8)),
                 ("pe", F, (16, 8)), ("se", F, (2, 8)), ("g", F, (8,)), ("be", F, (8,)),
                 ("m", I32, ("B", "S"))), ((F, 3), (I32, 1), (F, 3)),
                attrs={"epsilon": 1e-5}, domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> EmbedFacts:
        elem_type = require_type(ctx, node.tensor("word_embedding"), "word_embedding",
                                 _SKIP_TYPES)
        for name in ("position_embedding", "segment_embedding", "gamma", "beta"):
            if node.tensor(name):
                require_type(ctx, node.tensor(name), name, (elem_type,))
        for name in ("input_ids", "segment_ids", "mask", "position_ids"):
            if node.tensor(name):
                require_type(ctx, node.tensor(name), name, (TensorProto.INT32,))
        require_shape(ctx, node.tensor("input_ids"), "input_ids", "(batch, sequence)", 2, 2)
        if bool(node.tensor("segment_ids")) != bool(node.tensor("segment_embedding")):
            raise Reject("segment_ids and segment_embedding come together")
        hidden: list[Any] = []
        for name in ("word_embedding", "position_embedding", "segment_embedding"):
            if node.tensor(name):
                table = require_shape(ctx, node.tensor(name), name, "(rows, hidden)", 2, 2)
                hidden.append(table[1])
        for name in ("gamma", "beta"):
            require_broadcastable(ctx, node.tensor(name), name, (hidden[0],), "the hidden size")
        static = {h for h in hidden if isinstance(h, int)}
        if len(static) > 1:
            raise Reject(f"the embedding tables have different hidden sizes {sorted(static)}")
        return EmbedFacts(elem_type)

    def build(self, b: Builder, node: MatchedNode, facts: EmbedFacts) -> None:
        compute = ComputeType(b, node, facts.elem_type)
        dtype, original = compute.dtype, compute.original
        outputs = dict(zip(("output", "mask_index", "sum"), node.outputs, strict=False))
        ids = b.input(node.tensor("input_ids"), np.int32)

        def rows(table: str, indices: Value, hint: str) -> Value:
            return compute.cast(b.Gather(self.table(b, node, facts, table), indices,
                                         axis=0, hint=hint), hint)

        def vector(name: str) -> Value:
            return compute.cast(self.table(b, node, facts, name), name)

        s = rows("word_embedding", ids, "words")
        if node.tensor("position_ids"):
            positions = rows("position_embedding", b.input(node.tensor("position_ids"),
                                                           np.int32), "positions")
        else:  # positions 0 .. S-1: one row of them, (1, S), whose S is ids' own (TVM
            # then keeps one S); gathered once, not once per batch row, and broadcast
            row_shape = b.Concat(np.array([1], np.int64), b.Shape(ids, 1, 2, hint="ids_S"),
                                 axis=0, hint="position_shape")
            index = sequence_positions(b, row_shape, 1, np.dtype(np.int32),
                                       hint="position_index")
            positions = rows("position_embedding", index, "positions")
        # One Sum, not Adds: ONNX Runtime's SkipLayerNormFusion turns an Add feeding the
        # LayerNormalization into its SkipLayerNormalization, 2.7x slower here than the Add
        # and LayerNormalization it replaces (docs/performance.md); a Sum it leaves alone.
        # Sum adds left to right, as the Adds did.
        terms = [s, positions]
        if node.tensor("segment_ids"):
            terms.append(rows("segment_embedding", b.input(node.tensor("segment_ids"),
                                                           np.int32), "segments"))
        s = b.op("Sum", *terms, hint="embedding_sum", dtype=s.dtype,
                 out=_direct(outputs, "sum", original, dtype))
        _finish(b, outputs, s, "sum", original)
        normalize(b, s, [-1], float(node.args["epsilon"]), False, vector("gamma"),
                  vector("beta"), dtype, original, {"output": outputs["output"]})
        if outputs.get("mask_index"):
            if node.tensor("mask"):  # ONNX Runtime counts the mask's ones
                ones = b.Equal(b.input(node.tensor("mask"), np.int32), np.int32(1),
                               hint="mask_is_one")
                b.ReduceSum(b.Cast(ones, np.int32, hint="mask_ones"), [1], keepdims=False,
                            out=outputs["mask_index"])
            else:
                b.ConstantOfShape(b.Shape(ids, 0, 1, hint="batch"), 0, np.int32,
                                  out=outputs["mask_index"])

    def table(self, b: Builder, node: MatchedNode, facts: EmbedFacts, name: str) -> Value:
        """An embedding table, gamma or beta, in the node's type (QEmbedLayerNormalization
        gives dequantized constants instead)."""
        return b.input(node.tensor(name), numpy_dtype(facts.elem_type))

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: EmbedFacts
                     ) -> list[OutputType]:
        ids = ctx.shape(node.tensor("input_ids"))
        table = ctx.shape(node.tensor("word_embedding"))
        rows = [*ids, table[1]] if ids is not None and table is not None else None
        types: list[OutputType] = [(facts.elem_type, rows),
                                   (TensorProto.INT32, [ids[0]] if ids is not None else None),
                                   (facts.elem_type, rows)]
        return types[:len(node.outputs)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        ids, words = tensors["input_ids"], tensors["word_embedding"]
        table = tensors["position_embedding"]
        assert ids is not None and words is not None and table is not None
        wide = np.float64
        s = words.astype(wide)[ids]
        positions = tensors.get("position_ids")
        s = s + (table.astype(wide)[positions] if positions is not None
                 else table.astype(wide)[: ids.shape[1]][None])
        if tensors.get("segment_ids") is not None:
            s = s + tensors["segment_embedding"].astype(wide)[  # type: ignore[union-attr]
                tensors["segment_ids"]]
        mean = s.mean(-1, keepdims=True)
        centered = s - mean
        y = centered / np.sqrt((centered ** 2).mean(-1, keepdims=True) + float(args["epsilon"]))
        y = y * tensors["gamma"].astype(wide) + tensors["beta"].astype(wide)  # type: ignore[union-attr]
        mask = tensors.get("mask")
        mask_index = (mask == 1).sum(axis=1).astype(np.int32) if mask is not None \
            else np.zeros(ids.shape[0], np.int32)
        return [y.astype(words.dtype), mask_index, s.astype(words.dtype)]


PATTERNS = [SkipLayerNormalization(), SkipSimplifiedLayerNormalization(),
            SimplifiedLayerNormalization(), LayerNormalization(), RMSNormalization(),
            EmbedLayerNormalization()]
