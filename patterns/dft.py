"""DFT and STFT (ONNX opset 17) as MatMuls with constant cosine and sine tables, for targets
below 17.

STFT(signal, frame_step[, window][, frame_length]; onesided=1) is the DFT below applied to
frames gathered from the signal (one constant index table) and multiplied by the window:
signal (batch, n, 1 | 2) -> (batch, frames, bins, 2), ``frames = (n - frame_length) //
frame_step + 1``; the signal's length, the step and the frame length (or the window's)
static.


Matches ``DFT(input[, dft_length]; axis:int=1, inverse:int=0, onesided:int=0)`` (DFT-17's
signature; ``--target-opset`` brings a DFT-20 node, whose axis is an input, to it first) in
any custom domain, and in the default domain below opset 17. Semantics are ONNX's: input
``[batch, ..., n, ..., 1 | 2]`` (real, or complex as (re, im)), the transform along
``axis`` (counted over the whole input; the last dim is the complex one), over
``N = dft_length`` points (the signal cut to N, or padded with zeros), ``X_k =
sum_j x_j exp(-2 pi i j k / N)``; ``inverse`` takes ``exp(+...)`` and divides by N;
``onesided`` keeps the first ``N // 2 + 1`` bins of a forward transform (of a complex
input too, as ONNX's reference). Output ``[..., K, ..., 2]``. The one-sided inverse (irfft:
a half spectrum in, the Hermitian-completed signal out) is refused.

Before -> after::

    x:   move the axis last but one, then re = x[..., 0], im = x[..., 1] (if complex)
    X_re = re @ C (-/+) im @ S      C[j, k] = cos(2 pi j k / N), S[j, k] = sin(...)
    X_im = im @ C (+/-) re @ S      j < min(n, N) (zero padding adds nothing)
    inverse: / N;  then (X_re, X_im) stacked last and the axis moved back

The tables are computed in float64 and stored in the input's type; the sums are MatMuls in
that type (an FFT sums in another order: results agree to float rounding of the same sums,
not bit for bit). Cost is O(n * K) per transform against the FFT's O(n log n): fine for the
frame sizes of audio front ends (STFT frames of 256-2048 points), slower for long signals.

Envelope: opsets 11+; float32/float64 (float16 in float32); the input's rank and its length
along the axis static; ``dft_length`` absent or a constant.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example, F, i64
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._compute import ComputeType

_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)


class Facts(NamedTuple):
    elem_type: int
    rank: int
    axis: int  # non-negative, over the whole input
    length: int  # of the signal along the axis
    points: int  # N
    complex_input: bool
    inverse: bool
    onesided: bool


def dft_tables(length: int, points: int, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of 2 pi j k / N for j < min(length, N), k < bins, in float64."""
    used = min(length, points)
    angle = 2.0 * np.pi * np.outer(np.arange(used), np.arange(bins)) / points
    return np.cos(angle), np.sin(angle)


def transform_last(b: Builder, x: Value, rank: int, length: int, points: int, bins: int,
                   complex_input: bool, inverse: bool, dtype: np.dtype) -> Value:
    """The DFT of ``x`` (..., length, 1 | 2) along its last but one axis over ``points``
    points, the first ``bins`` bins, as (..., bins, 2): the MatMuls of the module
    docstring. Shared by DFT and STFT."""
    cos, sin = dft_tables(length, points, bins)
    cos_t = b.const(cos.astype(dtype), hint="cos_table")
    sin_t = b.const(sin.astype(dtype), hint="sin_table")
    real = b.Gather(x, 0, axis=rank - 1, hint="real")
    sign = 1.0 if inverse else -1.0  # of exp(sign * i * angle)
    # (re + i im)(cos + i sign sin) = (re cos - sign im sin) + i (im cos + sign re sin)
    re = b.MatMul(real, cos_t, hint="re_cos")
    im = b.MatMul(real, sin_t, hint="re_sin")
    im = b.Mul(im, np.asarray(sign, dtype), hint="im_from_re") if sign < 0 else im
    if complex_input:
        imag = b.Gather(x, 1, axis=rank - 1, hint="imag")
        im_sin = b.MatMul(imag, sin_t, hint="im_sin")
        re = b.Add(re, im_sin, hint="re") if sign < 0 else b.Sub(re, im_sin, hint="re")
        im = b.Add(im, b.MatMul(imag, cos_t, hint="im_cos"), hint="im")
    if inverse:
        re = b.Div(re, np.asarray(points, dtype), hint="re_scaled")
        im = b.Div(im, np.asarray(points, dtype), hint="im_scaled")
    return b.Concat(b.Unsqueeze(re, [rank - 1], hint="re_last"),
                    b.Unsqueeze(im, [rank - 1], hint="im_last"), axis=rank - 1,
                    hint="stacked")


class DFT(Pattern[Facts]):
    op_type = "DFT"
    forms = (Form("DFT", inputs=(In("input"), In("dft_length", optional=True)), attributes={
        "axis": Attr("int", default=1),
        "inverse": Attr("int", default=0, choices=(0, 1)),
        "onesided": Attr("int", default=0, choices=(0, 1))}),)
    examples = (
        Example((("x", F, ("N", 8, 1)),), domains=(("", 13), ("custom.ops", 17))),
        Example((("x", F, ("N", 6, 2)),), attrs={"inverse": 1},
                args=("x", i64(8)), domains=(("", 11),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        x = node.tensor("input")
        elem_type = require_type(ctx, x, "input", _TYPES)
        shape = require_shape(ctx, x, "input", "the axis and the complex dim", min_rank=3)
        rank = len(shape)
        if shape[-1] not in (1, 2):
            raise Reject(f"the last dim of the input must be 1 (real) or 2 (complex), got "
                         f"{shape[-1]}")
        axis = int(node.args["axis"])
        if not -rank <= axis < rank - 1 or axis % rank == 0:
            raise Reject(f"axis {axis} must name a signal dim (not the batch or the "
                         f"complex dim) of the rank-{rank} input")
        axis %= rank
        length = shape[axis]
        if not isinstance(length, int):
            raise Reject(f"the signal length along axis {axis} must be static (the tables "
                         "are constants)")
        points = length
        if node.tensor("dft_length"):
            value = ctx.constant(node.tensor("dft_length"))
            if value is None or value.size != 1 or not np.issubdtype(value.dtype, np.integer):
                raise Reject("dft_length must be a constant integer scalar")
            points = int(value.reshape(()))
            if points < 1:
                raise Reject(f"dft_length must be positive, got {points}")
        complex_input = shape[-1] == 2
        onesided = bool(node.args["onesided"])
        if onesided and node.args["inverse"]:
            # ONNX's irfft: the input holds the one-sided half and the output the whole
            # Hermitian-completed signal; not written here yet
            raise Reject("inverse with onesided (the one-sided inverse, irfft) is not "
                         "supported; target opset 17 or newer keeps DFT")
        return Facts(elem_type, rank, axis, length, points, complex_input,
                     bool(node.args["inverse"]), onesided)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        compute = ComputeType(b, node, facts.elem_type)
        dtype = compute.dtype
        x = compute.read("input")
        assert x is not None
        rank, axis = facts.rank, facts.axis
        # the signal axis goes last but one, next to the complex dim
        order = [a for a in range(rank - 1) if a != axis] + [axis, rank - 1]
        moved = order != list(range(rank))
        if moved:
            x = b.Transpose(x, order, hint="signal_last")
        used = min(facts.length, facts.points)
        if used < facts.length:
            x = b.Slice(x, [0], [used], [rank - 2], hint="cut")
        bins = facts.points // 2 + 1 if facts.onesided else facts.points
        stacked = transform_last(b, x, rank, used, facts.points, bins, facts.complex_input,
                                 facts.inverse, dtype)
        if moved:
            back = [order.index(a) for a in range(rank)]
            stacked = b.Transpose(stacked, back, hint="signal_back",
                                  out=compute.direct(node.outputs[0]))
            compute.finish(stacked, node.outputs[0])
        else:
            compute.write(stacked, node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        shape = list(ctx.shape(node.tensor("input")) or [])
        if shape:
            shape[facts.axis] = facts.points // 2 + 1 if facts.onesided else facts.points
            shape[-1] = 2
        return [(facts.elem_type, shape or None)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, length = tensors["input"], tensors.get("dft_length")
        assert x is not None
        axis = int(args["axis"]) % x.ndim
        signal = x[..., 0] + (1j * x[..., 1] if x.shape[-1] == 2 else 0)
        points = signal.shape[axis] if length is None else int(np.asarray(length).reshape(()))
        if args["inverse"]:
            result = np.fft.ifft(signal, n=points, axis=axis)
        else:
            result = np.fft.fft(signal, n=points, axis=axis)
        if args["onesided"]:
            result = np.take(result, range(points // 2 + 1), axis=axis)
        return [np.stack([result.real, result.imag], -1).astype(x.dtype)]


class STFTFacts(NamedTuple):
    elem_type: int
    length: int  # of the signal
    step: int
    frame: int  # frame length
    frames: int
    complex_input: bool
    onesided: bool


class STFT(Pattern[STFTFacts]):
    """STFT (opset 17): frames gathered from the signal, windowed, and the DFT above."""

    op_type = "STFT"
    forms = (Form("STFT", inputs=(In("signal"), In("frame_step"), In("window", optional=True),
                                  In("frame_length", optional=True)), attributes={
        "onesided": Attr("int", default=1, choices=(0, 1))}),)
    examples = (
        Example((("x", F, ("N", 32, 1)), ("w", F, (8,))), ((F, 4),),
                args=("x", i64(4), "w"), domains=(("", 13),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> STFTFacts:
        signal = node.tensor("signal")
        elem_type = require_type(ctx, signal, "signal", _TYPES)
        shape = require_shape(ctx, signal, "signal", "(batch, length, 1 | 2)", 3, 3)
        length = shape[1]
        if not isinstance(length, int) or shape[2] not in (1, 2):
            raise Reject("the signal must be (batch, static length, 1 or 2)")
        step_value = ctx.constant(node.tensor("frame_step"))
        if step_value is None or step_value.size != 1 or \
                not np.issubdtype(step_value.dtype, np.integer) or \
                int(step_value.reshape(())) < 1:
            raise Reject("frame_step must be a positive constant integer")
        frame = None
        if node.tensor("frame_length"):
            value = ctx.constant(node.tensor("frame_length"))
            if value is None or value.size != 1 or not np.issubdtype(value.dtype, np.integer):
                raise Reject("frame_length must be a constant integer")
            frame = int(value.reshape(()))
        if node.tensor("window"):
            window = ctx.shape(node.tensor("window"))
            if window is None or len(window) != 1 or not isinstance(window[0], int):
                raise Reject("the window's length must be static")
            if frame is not None and frame != window[0]:
                raise Reject(f"the window has {window[0]} values, frame_length is {frame}")
            frame = window[0]
            require_type(ctx, node.tensor("window"), "window", (elem_type,))
        if frame is None or not 1 <= frame <= length:
            raise Reject("the frame length (frame_length or the window's) must be known and "
                         "at most the signal's length")
        step = int(step_value.reshape(()))
        complex_input = shape[2] == 2
        onesided = bool(node.args["onesided"])
        if onesided and complex_input:
            raise Reject("onesided takes a real signal")
        return STFTFacts(elem_type, length, step, frame, (length - frame) // step + 1,
                         complex_input, onesided)

    def build(self, b: Builder, node: MatchedNode, facts: STFTFacts) -> None:
        compute = ComputeType(b, node, facts.elem_type)
        dtype = compute.dtype
        x = compute.read("signal")
        assert x is not None
        starts = np.arange(facts.frames, dtype=np.int64)[:, None] * facts.step
        index = starts + np.arange(facts.frame, dtype=np.int64)[None, :]
        frames = b.Gather(x, b.const(index, hint="frame_index"), axis=1, hint="frames")
        window = compute.read("window")
        if window is not None:  # (frame,) along the frame's samples
            frames = b.Mul(frames, b.Unsqueeze(window, [1], hint="window_column"),
                           hint="windowed")
        bins = facts.frame // 2 + 1 if facts.onesided else facts.frame
        result = transform_last(b, frames, 4, facts.frame, facts.frame, bins,
                                facts.complex_input, False, dtype)
        compute.write(result, node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: STFTFacts
                     ) -> list[OutputType]:
        shape = ctx.shape(node.tensor("signal"))
        bins = facts.frame // 2 + 1 if facts.onesided else facts.frame
        return [(facts.elem_type, [shape[0] if shape else None, facts.frames, bins, 2])]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, step_value = tensors["signal"], tensors["frame_step"]
        window, frame_value = tensors.get("window"), tensors.get("frame_length")
        assert x is not None and step_value is not None
        step = int(np.asarray(step_value).reshape(()))
        frame = len(window) if window is not None else int(np.asarray(frame_value).reshape(()))
        signal = x[..., 0] + (1j * x[..., 1] if x.shape[-1] == 2 else 0)
        count = (signal.shape[1] - frame) // step + 1
        frames = np.stack([signal[:, i * step:i * step + frame] for i in range(count)], 1)
        if window is not None:
            frames = frames * window
        result = np.fft.fft(frames, axis=-1)
        if args["onesided"]:
            result = result[..., :frame // 2 + 1]
        return [np.stack([result.real, result.imag], -1).astype(x.dtype)]


PATTERNS = [DFT(), STFT()]
