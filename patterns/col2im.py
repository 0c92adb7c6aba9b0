"""Col2Im (ONNX opset 18) as a ConvTranspose with a one-hot weight (float32), or as strided
placement and Add of each kernel offset's patch (float64), for targets below 18.

Matches ``Col2Im(input, image_shape, block_shape; dilations, pads, strides)`` in any custom
domain, and in the default domain below opset 18 (``--target-opset``). Semantics are ONNX's
(its reference's ``col2im``): ``input`` is ``(N, C * prod(block_shape), L)``, the columns
of every sliding block (``L`` blocks, the count per spatial dim ``b_i = (image_i +
pad_begin_i + pad_end_i - dilation_i * (k_i - 1) - 1) // stride_i + 1``); each column is
added back into a ``(N, C, *image_shape)`` image at its block's position, overlaps summed.

Before -> after, float32 (float16 computed in float32, rounded once)::

    x = Reshape(input, (N*C, K, b_1, .., b_d))
    image = Reshape(ConvTranspose(x, W; strides, dilations, pads, output_padding),
                    (N, C, *image_shape))
    # W (K, 1, *block_shape): W[j, 0, offset j] = 1; output_padding = the image's last
    # partial stride, (image_i + pads_i - d_i * (k_i - 1) - 1) mod s_i

ConvTranspose is the adjoint of im2col: ONNX Runtime computes it as a GEMM (here a copy of
each entry: one product by 1 and zeros) and its col2im, which adds the columns back in
kernel-offset order, as its Col2Im kernel does. Finite values are exact (bit for bit
ONNX Runtime's Col2Im on 2-D and 3-D images); an inf or NaN entry also makes NaN the other
pixels its block covers (0 * inf in the GEMM), where Col2Im puts it at its own pixel only.

Float64 (ONNX Runtime has no float64 ConvTranspose), for each kernel offset j::

    x = Reshape(input, (N, C, K, b_1, .., b_d));  patch_j = Split(x, K pieces)[j]
    placed_j = Pad(stride-spaced patch_j, at j_i * dilation_i)   # the padded image's size
    image = Sum(placed_0, .., placed_{K-1}), then the pads cut off

There every value is an input value or a sum of them; the zeros placed around a patch are
added, never multiplied, so inf and NaN travel as in the reference. The sums run over
kernel offsets in order.

Envelope: opsets 11+; float16/32/64; 1-D to 3-D images; ``image_shape`` and ``block_shape``
constants; the input's second dim static; N dynamic.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto, numpy_helper

from decomposer.builder import Builder, Value
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example, F, i64
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._compute import ComputeType

_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)


class Facts(NamedTuple):
    elem_type: int
    image: tuple[int, ...]
    kernel: tuple[int, ...]
    blocks: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # begins, then ends
    strides: tuple[int, ...]
    channels: int


def block_counts(image: tuple[int, ...], kernel: tuple[int, ...], dilations: tuple[int, ...],
                 pads: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    d = len(image)
    return tuple((image[i] + pads[i] + pads[d + i] - dilations[i] * (kernel[i] - 1) - 1)
                 // strides[i] + 1 for i in range(d))


class Col2Im(Pattern[Facts]):
    op_type = "Col2Im"
    forms = (Form("Col2Im", inputs=(In("input"), In("image_shape"), In("block_shape")),
                  attributes={"dilations": Attr("ints", default=()),
                              "pads": Attr("ints", default=()),
                              "strides": Attr("ints", default=())}),)
    examples = (
        Example((("x", F, ("N", 4, 9)),), ((F, 4),), args=("x", i64([4, 4]), i64([2, 2])),
                domains=(("", 17), ("custom.ops", 13))),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        elem_type = require_type(ctx, node.tensor("input"), "input", _TYPES)
        shape = require_shape(ctx, node.tensor("input"), "input", "(N, C * K, L)", 3, 3)
        image_value = ctx.constant(node.tensor("image_shape"))
        kernel_value = ctx.constant(node.tensor("block_shape"))
        if image_value is None or kernel_value is None or not (
                np.issubdtype(image_value.dtype, np.integer) and
                np.issubdtype(kernel_value.dtype, np.integer)):
            raise Reject("image_shape and block_shape must be constants (integers)")
        image = tuple(int(v) for v in image_value.reshape(-1))
        kernel = tuple(int(v) for v in kernel_value.reshape(-1))
        d = len(image)
        if len(kernel) != d or not 1 <= d <= 3:
            raise Reject(f"image_shape and block_shape must have the same length, 1 to 3, got "
                         f"{len(image)} and {len(kernel)}")
        dilations = tuple(node.args["dilations"]) or (1,) * d
        pads = tuple(node.args["pads"]) or (0,) * (2 * d)
        strides = tuple(node.args["strides"]) or (1,) * d
        if len(dilations) != d or len(strides) != d or len(pads) != 2 * d:
            raise Reject("dilations and strides need one value per spatial dim, pads two")
        if min(kernel) < 1 or min(dilations) < 1 or min(strides) < 1 or min(pads) < 0:
            raise Reject(f"block_shape {list(kernel)}, dilations {list(dilations)} and strides "
                         f"{list(strides)} must be positive, pads {list(pads)} not negative")
        blocks = block_counts(image, kernel, dilations, pads, strides)
        if min(blocks) < 1:
            raise Reject(f"no block fits: {blocks} blocks per dim")
        columns = shape[1]
        total = int(np.prod(kernel))
        if not isinstance(columns, int) or columns % total:
            raise Reject(f"the input's second dim must be static and a multiple of "
                         f"prod(block_shape) = {total}")
        if isinstance(shape[2], int) and shape[2] != int(np.prod(blocks)):
            raise Reject(f"the input holds {shape[2]} blocks; the image takes "
                         f"{int(np.prod(blocks))}")
        return Facts(elem_type, image, kernel, blocks, dilations, pads, strides,
                     columns // total)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        compute = ComputeType(b, node, facts.elem_type)
        dtype = compute.dtype
        x = compute.read("input")
        assert x is not None
        if dtype == np.float32:
            compute.write(_transposed_convolution(b, x, facts), node.outputs[0])
            return
        d = len(facts.image)
        offsets_all = list(itertools.product(*(range(k) for k in facts.kernel)))
        # (N, C, K, b_1, .., b_d), the K kernel offsets split apart in one pass
        blocks = b.Reshape(x, np.array([0, facts.channels, len(offsets_all), *facts.blocks],
                                       np.int64), hint="blocks")
        pieces = b.Split(blocks, [1] * len(offsets_all), axis=2, hint="patches") \
            if len(offsets_all) > 1 else [blocks]
        padded = [facts.image[i] + facts.pads[i] + facts.pads[d + i] for i in range(d)]
        placed_all: list[Value] = []
        for offsets, piece in zip(offsets_all, pieces, strict=True):
            label = "_".join(str(j) for j in offsets)
            patch = b.Squeeze(piece, [2], hint=f"patch{label}")
            pads = [0] * (2 * (d + 2))
            for i in range(d):
                axis = 2 + i
                stride, count = facts.strides[i], facts.blocks[i]
                if stride > 1:
                    patch = _spread(b, patch, axis, d + 2, count, stride, dtype,
                                    f"spread{label}_{i}")
                length = (count - 1) * stride + 1
                begin = offsets[i] * facts.dilations[i]
                pads[axis], pads[d + 2 + axis] = begin, padded[i] - begin - length
            placed_all.append(b.pad(patch, pads, 0, dtype, hint=f"placed{label}"))
        # one Sum over the placed patches, in kernel-offset order
        total = placed_all[0] if len(placed_all) == 1 else \
            b.op("Sum", *placed_all, hint="summed")
        if any(facts.pads):
            total = b.Slice(total, list(facts.pads[:d]),
                            [facts.pads[i] + facts.image[i] for i in range(d)],
                            list(range(2, 2 + d)), hint="unpadded")
        compute.write(total, node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        shape = ctx.shape(node.tensor("input"))
        batch = shape[0] if shape else None
        return [(facts.elem_type, [batch, facts.channels, *facts.image])]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, image, kernel = tensors["input"], tensors["image_shape"], tensors["block_shape"]
        assert x is not None and image is not None and kernel is not None
        return [col2im_reference(x, tuple(int(v) for v in image), tuple(int(v) for v in kernel),
                                 tuple(args["dilations"]), tuple(args["pads"]),
                                 tuple(args["strides"]))]


def _transposed_convolution(b: Builder, x: Value, facts: Facts) -> Value:
    """Col2Im as ONNX Runtime computes it inside ConvTranspose: the columns of each channel
    as a (K, b_1, .., b_d) image, a ConvTranspose whose weight is one-hot per kernel offset
    (the GEMM copies each column entry, exact for finite values; its col2im then adds them
    back in kernel-offset order), output_padding for the image's last partial stride."""
    d = len(facts.image)
    taps = int(np.prod(facts.kernel))
    one_hot = np.zeros((taps, 1, *facts.kernel), np.float32)
    for tap, offsets in enumerate(itertools.product(*(range(k) for k in facts.kernel))):
        one_hot[(tap, 0, *offsets)] = 1
    covered = [(facts.blocks[i] - 1) * facts.strides[i]
               + facts.dilations[i] * (facts.kernel[i] - 1) + 1 for i in range(d)]
    padding = [facts.image[i] + facts.pads[i] + facts.pads[d + i] - covered[i]
               for i in range(d)]
    per_channel = b.Reshape(x, np.array([-1, taps, *facts.blocks], np.int64),
                            hint="channel_blocks")  # (N*C, K, b_1, .., b_d)
    placed = b.op("ConvTranspose", per_channel,
                  b.weight(numpy_helper.from_array(one_hot), hint="offsets"),
                  dilations=list(facts.dilations), pads=list(facts.pads),
                  strides=list(facts.strides), output_padding=padding,
                  kernel_shape=list(facts.kernel), hint="placed", dtype=np.dtype(np.float32))
    return b.Reshape(placed, np.array([-1, facts.channels, *facts.image], np.int64),
                     hint="image")


def _spread(b: Builder, x: Value, axis: int, rank: int, count: int, stride: int,
            dtype: np.dtype, hint: str) -> Value:
    """``x`` with stride - 1 zeros after each element along ``axis`` (the last group cut):
    (.., count, ..) -> (.., (count - 1) * stride + 1, ..)."""
    pads = [0] * (2 * (rank + 1))
    pads[rank + 1 + axis + 1] = stride - 1  # after the new unit axis
    grouped = b.pad(b.Unsqueeze(x, [axis + 1], hint=f"{hint}_unit"), pads, 0, dtype,
                    hint=f"{hint}_zeros")
    shape = b.Concat(b.Shape(grouped, 0, axis, hint=f"{hint}_head"),
                     np.array([count * stride], np.int64),
                     b.Shape(grouped, axis + 2, rank + 1, hint=f"{hint}_tail"),
                     axis=0, hint=f"{hint}_shape")
    merged = b.Reshape(grouped, shape, hint=f"{hint}_merged")
    return b.Slice(merged, [0], [(count - 1) * stride + 1], [axis], hint=hint)


def col2im_reference(x: np.ndarray, image: tuple[int, ...], kernel: tuple[int, ...],
                     dilations: tuple[int, ...], pads: tuple[int, ...],
                     strides: tuple[int, ...]) -> np.ndarray:
    """numpy Col2Im: every block's column added at its position (loops, for clarity)."""
    d = len(image)
    dilations = dilations or (1,) * d
    pads = pads or (0,) * (2 * d)
    strides = strides or (1,) * d
    blocks = block_counts(image, kernel, dilations, pads, strides)
    batch, columns, _ = x.shape
    channels = columns // int(np.prod(kernel))
    padded = [image[i] + pads[i] + pads[d + i] for i in range(d)]
    out = np.zeros((batch, channels, *padded), dtype=np.float64)
    cols = x.astype(np.float64).reshape(batch, channels, *kernel, *blocks)
    for offsets in itertools.product(*(range(k) for k in kernel)):
        for block in itertools.product(*(range(c) for c in blocks)):
            where = tuple(block[i] * strides[i] + offsets[i] * dilations[i] for i in range(d))
            target: Any = (slice(None), slice(None), *where)
            source: Any = (slice(None), slice(None), *offsets, *block)
            out[target] += cols[source]
    cut = tuple(slice(pads[i], pads[i] + image[i]) for i in range(d))
    return out[(slice(None), slice(None), *cut)].astype(x.dtype)


PATTERNS = [Col2Im()]
