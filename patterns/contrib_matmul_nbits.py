"""ONNX Runtime's com.microsoft MatMulNBits (block-quantized weights: the onnxruntime-genai
model builder's and ORT's quantizer's int4 linear layers) as integer unpacking, a
dequantization and a MatMul.

Matches ``MatMulNBits(A, B, scales[, zero_points][, g_idx][, bias]; K, N, bits,
block_size, accuracy_level, weight_prepacked)`` in com.microsoft (the schema ONNX Runtime
1.32 registers; docs/ContribOperators.md):
- B: uint8 (N, k_blocks, blob_size), ``k_blocks = ceil(K / block_size)``, ``blob_size =
  block_size * bits / 8``; along K the values are packed low bits first (for 4 bits: the
  first value in the low nibble of a byte, the second in the high nibble).
- scales: (N, k_blocks) (or flat), A's type. zero_points: absent (``2^(bits - 1)``), packed
  uint8 (N, ceil(k_blocks * bits / 8)) the same way as B, or unpacked (N, k_blocks) of A's
  type. bias: (N,). g_idx (deprecated) is refused: ONNX Runtime 1.32's kernel given one,
  even the trivial ``k // block_size``, does not compute the documented formula (measured
  against it), so no exact form is pinned.
- ``Y = A @ W^T (+ bias)``, ``W[n, k] = (q[n, k] - zero_point[n, b(k)]) * scale[n, b(k)]``.

``accuracy_level`` only lets ONNX Runtime's kernel compute in lower precision (4: A
quantized to int8): the decomposition computes the definition in float32 (so it can differ
from such a kernel by that kernel's rounding). ``weight_prepacked=1`` (a layout private to
a kernel) and the empty "omitted projection" B are refused.

Before -> after::

    q   = (Cast(B, int32) // 2^(bits * i)) % 2^bits per packed slot i, slots interleaved
          -> (N, K)                                            # bits 2, 4 or 8
    W^T = Transpose((q - zero_point[:, k // block_size]) * scale[:, k // block_size])
    Y   = MatMul(A, W^T) (+ bias)

When B, scales and zero_points are initializers an engine folds the dequantization once;
the weights stay packed in the file. Envelope: opsets 11+ (bfloat16 13+); bits 2, 4, 8
(values that do not fill bytes evenly, 3 and 5-7, are refused: their packing across bytes
is not pinned); K, N, block_size static; A's leading dims dynamic.

Target ``qdq`` (opset 21+, 4 or 8 bits, B, scales and any zero points constant, the zero
points packed or absent; else the form above) keeps the weights quantized, repacked once
at decompose time (external ones read from the model's data file)::

    W^T = DequantizeLinear(Wq^T, scales^T[, zero_points^T]; axis=0, block_size)  # (K, N)
    Y   = MatMul(A, W^T) (+ bias)

Wq^T is INT4 / INT8 holding ``q - 2^(bits-1)`` when the node has no zero points (the
symmetric form, the only one TensorRT's IDequantizeLayer takes), else UINT4 / UINT8 with
UINT4 / UINT8 zero points; scales become float32 (exact from float16 / bfloat16), so the
arithmetic is the form above's. That (K, N) layout, axis 0, is what ONNX Runtime's
DQMatMulToMatMulNBits fusion (optimization level extended or higher) turns back into its
MatMulNBits kernel and what OpenVINO compiles to its int4 FullyConnected; both then
quantize A to int8 by default (ONNX Runtime: session option
``session.qdq_matmulnbits_accuracy_level``, default 4; OpenVINO:
``DYNAMIC_QUANTIZATION_GROUP_SIZE``), as ``accuracy_level`` 4 lets the original kernel do;
with those at 0 the output equals the kernel at ``accuracy_level`` 0. TVM 0.27 imports no
INT4 initializer and no blocked DequantizeLinear, so ``portable`` keeps the float form.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

import numpy as np
import onnx
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._compute import ComputeType

_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)
log = logging.getLogger("decomposer")
U8 = TensorProto.UINT8


class Facts(NamedTuple):
    elem_type: int
    k_blocks: int
    packed_zero_points: bool
    # Target qdq: W^T's quantized values, scales and zero points, blocked along K.
    blocked: tuple[onnx.TensorProto, onnx.TensorProto, onnx.TensorProto | None] | None


class MatMulNBits(Pattern[Facts]):
    op_type = "MatMulNBits"
    forms = (Form("MatMulNBits", domains=frozenset({"com.microsoft"}), inputs=(
        In("A"), In("B"), In("scales"), In("zero_points", optional=True),
        In("g_idx", optional=True), In("bias", optional=True)), attributes={
        "K": Attr("int"), "N": Attr("int"), "bits": Attr("int", default=4),
        "block_size": Attr("int"), "accuracy_level": Attr("int", default=0),
        "weight_prepacked": Attr("int", default=0, choices=(0,))}),)
    examples = (
        Example((("a", F, ("B", "S", 32)), ("b", U8, (4, 2, 8)), ("s", F, (4, 2))),
                ((F, 3),), attrs={"K": 32, "N": 4, "bits": 4, "block_size": 16},
                domains=(("com.microsoft", 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        args = node.args
        bits, block, k, n = (int(args[name]) for name in ("bits", "block_size", "K", "N"))
        if bits not in (2, 4, 8):
            raise Reject(f"bits = {bits}: only 2, 4 and 8 (values that fill bytes evenly) are "
                         "pinned")
        if block < 16 or block & (block - 1):
            raise Reject(f"block_size = {block} must be a power of 2 >= 16 (the schema)")
        if k <= 0 or n <= 0:
            raise Reject("K and N must be > 0")
        k_blocks = -(-k // block)
        elem_type = require_type(ctx, node.tensor("A"), "A", _TYPES)
        a = require_shape(ctx, node.tensor("A"), "A", "its rank", min_rank=1)
        if isinstance(a[-1], int) and a[-1] != k:
            raise Reject(f"A's last dim is {a[-1]}, K = {k}")
        require_type(ctx, node.tensor("B"), "B", (U8,))
        b_shape = require_shape(ctx, node.tensor("B"), "B", "(N, k_blocks, blob_size)")
        want = (n, k_blocks, block * bits // 8)
        if list(b_shape) != list(want):
            raise Reject(f"B must be {want} (an empty or prepacked B is not decomposed), got "
                         f"{list(b_shape)}")
        require_type(ctx, node.tensor("scales"), "scales", (elem_type,))
        packed = False
        if node.tensor("zero_points"):
            zero_type = require_type(ctx, node.tensor("zero_points"), "zero_points",
                                     (U8, elem_type))
            packed = zero_type == U8
        if node.tensor("g_idx"):
            raise Reject("g_idx (deprecated in the schema) is not decomposed: ONNX Runtime "
                         "1.32's kernel given a g_idx, even k // block_size, does not compute "
                         "the documented formula (measured), so no exact form is pinned")
        if node.tensor("bias"):
            require_type(ctx, node.tensor("bias"), "bias", (elem_type,))
        if elem_type == TensorProto.BFLOAT16 and ctx.opset < 13:
            raise Reject("bfloat16 needs opset 13")
        blocked = None
        if ctx.target == "qdq":
            why = _why_not_blocked(ctx, node, bits, packed)
            blocked = None if why else _blocked_weights(ctx, node, bits, block, k, n)
            if blocked is None:  # said once per distinct node: identical ones replay it
                log.warning("node '%s' (MatMulNBits) keeps the float32 form under --target "
                            "qdq, and any node just like it: %s", node.proto.name,
                            why or "B, scales or zero_points is not a constant (or its "
                            "external data cannot be read)")
        return Facts(elem_type, k_blocks, packed, blocked)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        args = node.args
        bits, block, k, n = (int(args[name]) for name in ("bits", "block_size", "K", "N"))
        compute = ComputeType(b, node, facts.elem_type)  # float16 / bfloat16 in float32
        if facts.blocked is not None:
            weight_t = _dequantize_blocked(b, facts.blocked, block)
        else:
            weight_t = _dequantize_elementwise(b, node, compute, facts, bits, block, k, n)
        a, bias = compute.read("A"), compute.read("bias")
        assert a is not None
        out = node.outputs[0]
        y = b.MatMul(a, weight_t, hint="product", out=None if bias else compute.direct(out))
        if bias is not None:
            y = b.Add(y, bias, hint="biased", out=compute.direct(out))
        compute.finish(y, out)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        a = ctx.shape(node.tensor("A"))
        dims = None if a is None else [*a[:-1], int(node.args["N"])]
        return [(facts.elem_type, dims)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        a, packed, scales = tensors["A"], tensors["B"], tensors["scales"]
        assert a is not None and packed is not None and scales is not None
        weight = dequantize_reference(packed, scales, tensors.get("zero_points"),
                                      tensors.get("g_idx"), int(args["K"]), int(args["N"]),
                                      int(args["bits"]), int(args["block_size"]))
        y = a.astype(np.float64) @ weight.T.astype(np.float64)
        bias = tensors.get("bias")
        if bias is not None:
            y = y + bias.astype(np.float64)
        return [y.astype(a.dtype)]


def _dequantize_elementwise(b: Builder, node: MatchedNode, compute: ComputeType,
                            facts: Facts, bits: int, block: int, k: int, n: int) -> Value:
    """W^T (K, N) float32 computed from B, scales and zero points in the graph."""
    f32 = np.dtype(np.float32)
    packed = b.Reshape(node.tensor("B"), np.array([n, -1], np.int64), hint="packed_rows")
    q = _unpack(b, packed, bits, hint="q")  # (N, k_blocks * block_size)
    if facts.k_blocks * block != k:
        q = b.Slice(q, [0], [k], [1], hint="q_k")
    scales = compute.cast(b.Reshape(b.input(node.tensor("scales"), compute.original),
                                    np.array([n, facts.k_blocks], np.int64),
                                    hint="scales_2d"), "scales")
    zero: Value | np.ndarray
    if node.tensor("zero_points"):
        zero = b.input(node.tensor("zero_points"))
        if facts.packed_zero_points:
            zero = _unpack(b, b.Reshape(zero, np.array([n, -1], np.int64),
                                        hint="zero_rows"), bits, hint="zero")
            zero = b.Slice(zero, [0], [facts.k_blocks], [1], hint="zero_blocks")
        else:
            zero = b.Reshape(zero, np.array([n, facts.k_blocks], np.int64),
                             hint="zero_2d")
        zero = b.Cast(zero, f32, hint="zero_f32")
    else:
        zero = np.array(2 ** (bits - 1), np.float32)
    blocks = np.arange(k, dtype=np.int64) // block
    scale_k = b.Gather(scales, blocks, axis=1, hint="scale_per_k")  # (N, K)
    if isinstance(zero, Value):
        zero = b.Gather(zero, blocks, axis=1, hint="zero_per_k")
    weight = b.Mul(b.Sub(b.Cast(q, f32, hint="q_f32"), zero, hint="centered"), scale_k,
                   hint="weight")  # (N, K)
    return b.Transpose2D(weight, n, k, hint="weight_t")  # (K, N)


def _why_not_blocked(ctx: MatchContext, node: MatchedNode, bits: int, packed: bool) -> str:
    """Why target qdq cannot keep this node's weights quantized ("" if it can try)."""
    if ctx.opset < 21:
        return f"the model's opset is {ctx.opset}; a blocked DequantizeLinear needs 21"
    if bits not in (4, 8):
        return f"{bits}-bit values have no ONNX type"
    if node.tensor("zero_points") and not packed:
        return "its zero points are floats, which DequantizeLinear cannot take"
    return ""


def _blocked_weights(ctx: MatchContext, node: MatchedNode, bits: int, block: int, k: int,
                     n: int) -> tuple[TensorProto, TensorProto, TensorProto | None] | None:
    """W^T's quantized values (K, N), scales (k_blocks, N) float32 and zero points
    (k_blocks, N) as DequantizeLinear-21 takes them (axis 0, ``block_size`` along K); None
    unless B, scales and the zero points are constants (external ones read from the file);
    a Reject when their sizes do not fit K, N and the block size."""
    raw, scales = ctx.weight(node.tensor("B")), ctx.weight(node.tensor("scales"))
    zero_raw = ctx.weight(node.tensor("zero_points")) if node.tensor("zero_points") else None
    if raw is None or scales is None or (node.tensor("zero_points") and zero_raw is None):
        return None
    k_blocks = -(-k // block)
    zero_bytes = n * -(-k_blocks * bits // 8)
    if scales.size != n * k_blocks or (zero_raw is not None and zero_raw.size != zero_bytes):
        raise Reject(f"scales must hold N x k_blocks = {n * k_blocks} values and packed "
                     f"zero_points N x ceil(k_blocks bits / 8) = {zero_bytes} bytes; got "
                     f"{scales.size} and {'none' if zero_raw is None else zero_raw.size}")
    q = _unpack_numpy(raw, n, bits)[:, :k].T  # (K, N)
    scale_t = scales.astype(np.float32).reshape(n, k_blocks).T
    if zero_raw is None:  # the implicit zero point 2^(bits-1): signed values, none stored
        signed = q.astype(np.int16) - 2 ** (bits - 1)
        values = _tensor(signed, TensorProto.INT4 if bits == 4 else TensorProto.INT8, bits)
        zero = None
    else:
        values = _tensor(q, TensorProto.UINT4 if bits == 4 else TensorProto.UINT8, bits)
        zero_t = _unpack_numpy(zero_raw, n, bits)[:, :k_blocks].T
        zero = _tensor(zero_t, TensorProto.UINT4 if bits == 4 else TensorProto.UINT8, bits)
    return values, onnx.numpy_helper.from_array(np.ascontiguousarray(scale_t)), zero


def _dequantize_blocked(b: Builder, blocked: tuple[TensorProto, TensorProto,
                                                   TensorProto | None], block: int) -> Value:
    """W^T (K, N) float32 as one DequantizeLinear of the still-quantized weights."""
    values, scales, zero = blocked
    inputs = [b.weight(values, "weight_q"), b.weight(scales, "weight_scales")]
    if zero is not None:
        inputs.append(b.weight(zero, "weight_zero_points"))
    return b.op("DequantizeLinear", *inputs, axis=0, block_size=block, hint="weight_t",
                dtype=np.float32)


def _unpack_numpy(raw: np.ndarray, rows: int, bits: int) -> np.ndarray:
    """(rows, bytes) packed uint8, low bits first -> (rows, bytes * 8 / bits) uint8."""
    packed = raw.reshape(rows, -1)
    per = 8 // bits
    values = [(packed >> (bits * i)) & (2 ** bits - 1) for i in range(per)]
    return np.stack(values, -1).reshape(rows, -1).astype(np.uint8)


def _tensor(values: np.ndarray, elem_type: int, bits: int) -> TensorProto:
    """A TensorProto of ``values`` (4 bits: two per byte, the first in the low nibble, as
    ONNX stores INT4/UINT4; 8 bits: one per byte) with raw data."""
    flat = np.ascontiguousarray(values).reshape(-1).astype(np.int16) & (2 ** bits - 1)
    if bits == 4:
        if flat.size % 2:
            flat = np.append(flat, 0)
        flat = flat[0::2] | (flat[1::2] << 4)
    tensor = TensorProto(data_type=elem_type, dims=values.shape)
    tensor.raw_data = flat.astype(np.uint8).tobytes()
    return tensor


def _unpack(b: Builder, packed: Any, bits: int, hint: str) -> Value:
    """(rows, bytes) uint8 -> (rows, bytes * 8 / bits) int32 values, low bits first."""
    wide = b.Cast(packed, np.int32, hint=f"{hint}_bytes")
    if bits == 8:
        return wide
    per_byte = 8 // bits
    mask = np.array(2 ** bits, np.int32)
    slots = []
    for slot in range(per_byte):
        shifted = wide if slot == 0 else b.Div(wide, np.array(2 ** (bits * slot), np.int32),
                                               hint=f"{hint}_shift{slot}")
        value = shifted if slot == per_byte - 1 else b.Mod(shifted, mask,
                                                           hint=f"{hint}_slot{slot}")
        slots.append(b.Unsqueeze(value, [2], hint=f"{hint}_slot{slot}_axis"))
    interleaved = b.Concat(*slots, axis=2, hint=f"{hint}_interleaved")  # (rows, bytes, per)
    return b.Reshape(interleaved, b.Concat(b.Shape(packed, 0, 1, hint=f"{hint}_rows"),
                                           np.array([-1], np.int64), axis=0,
                                           hint=f"{hint}_shape"), hint=hint)


def dequantize_reference(packed: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                         g_idx: np.ndarray | None, k: int, n: int, bits: int, block: int
                         ) -> np.ndarray:
    """W (N, K) float32 from MatMulNBits' inputs, by the schema's definition."""
    k_blocks = -(-k // block)
    q = _unpack_numpy(packed, n, bits)[:, :k].astype(np.float32)
    scale = scales.astype(np.float32).reshape(n, k_blocks)
    if zero_points is None:
        zero = np.full((n, k_blocks), 2 ** (bits - 1), np.float32)
    elif zero_points.dtype == np.uint8:
        zero = _unpack_numpy(zero_points, n, bits)[:, :k_blocks].astype(np.float32)
    else:
        zero = zero_points.astype(np.float32).reshape(n, k_blocks)
    blocks = g_idx.astype(np.int64) if g_idx is not None else np.arange(k) // block
    return ((q - zero[:, blocks]) * scale[:, blocks]).astype(np.float32)


PATTERNS = [MatMulNBits()]
