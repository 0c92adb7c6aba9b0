"""Integer dot products written in float32, exactly: what ConvInteger and MatMulInteger are
lowered to (TensorRT and TVM have neither op).

In: the integer operands of such a node (8-bit data, constant or run-time zero points,
constant or run-time weights). Out: the operands shifted by their zero points in float32,
and the contiguous chunks of the reduction axis over which a float32 product sum stays
exact.

Why exact: every term ``(x - x_zp) * (w - w_zp)`` is an integer, and float32 holds every
integer up to 2**24; if the sum of the terms' magnitudes over a chunk is at most 2**24,
every partial sum in any order is such an integer, so the float op computes the int32 sum
the integer kernel does, whatever order the engine sums in. Per output (an output channel,
a column of B) the bound is the data's largest magnitude (from its zero point, else its
type's full width) times the weights' magnitudes summed over the chunk (and the kernel
taps); chunks are filled greedily along the reduction axis, each is its own float op,
rounded and cast to int32, and the chunks are added in int32.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.forms import Reject
from decomposer.pattern import MatchContext, MatchedNode

EXACT_INTEGERS = 2 ** 24  # float32 represents every integer of at most this magnitude
EIGHT_BIT = (TensorProto.UINT8, TensorProto.INT8)
_RANGES: dict[int, tuple[int, int]] = {TensorProto.UINT8: (0, 255),
                                      TensorProto.INT8: (-128, 127)}


def magnitude(elem_type: int, zero_point: np.ndarray | None, known: bool) -> int:
    """The largest ``|q - zero_point|`` over the values ``q`` of ``elem_type``: the zero
    point's own (0 when absent), or the type's full width when it is a run-time tensor
    (``known`` False)."""
    low, high = _RANGES[elem_type]
    if not known:
        return high - low
    points = np.zeros(1, np.int64) if zero_point is None else zero_point.astype(np.int64)
    return int(max(np.max(high - points), np.max(points - low)))


def reduction_chunks(bounds: np.ndarray, data_magnitude: int, label: str
                     ) -> list[tuple[int, int]]:
    """Contiguous [start, end) chunks of the reduction indices (``bounds``' rows) such that
    for every output (its columns: an output channel, a column of B) the weight magnitudes
    of a chunk's rows, summed and times ``data_magnitude``, stay at most 2**24; Reject when
    one index alone exceeds it."""
    scaled = bounds.astype(np.int64).reshape(len(bounds), -1) * data_magnitude
    found: list[tuple[int, int]] = []
    start = 0
    running = np.zeros(scaled.shape[1], np.int64)
    for index, row in enumerate(scaled):
        if int(row.max(initial=0)) > EXACT_INTEGERS:
            raise Reject(f"{label}: one reduction index can sum to {int(row.max()):,}, "
                         f"above the 2**24 float32 holds exactly")
        if int((running + row).max(initial=0)) > EXACT_INTEGERS:
            found.append((start, index))
            start, running = index, np.zeros_like(running)
        running += row
    found.append((start, len(scaled)))
    return found


def constant_or_none(ctx: MatchContext, node: MatchedNode, name: str) -> np.ndarray | None:
    """The value of the node's input ``name`` if it is a constant, else None (also None
    for an absent input: check ``node.tensor(name)``)."""
    tensor = node.tensor(name)
    return ctx.constant(tensor) if tensor else None


def shifted(b: Builder, tensor: str, zero_point: str | None, zero_shape: list[int] | None,
            hint: str) -> Value:
    """``Cast(tensor, float32) - Cast(zero_point, float32)`` (the zero point reshaped to
    ``zero_shape`` when given), exact: both are 8-bit integers."""
    value = b.Cast(tensor, np.float32, hint=f"{hint}_float")
    if not zero_point:
        return value
    point = b.Cast(zero_point, np.float32, hint=f"{hint}_zero_float")
    if zero_shape is not None:
        point = b.Reshape(point, zero_shape, hint=f"{hint}_zero_shaped")
    return b.Sub(value, point, hint=f"{hint}_shifted")


def chunked_products(b: Builder, data: Value, constant: np.ndarray | None,
                     run_time: Value | None, chunks: list[tuple[int, int]], data_axis: int,
                     weights_axis: int, product: Callable[[Value, Value], Value],
                     out: str) -> None:
    """``product(data chunk, weights chunk)`` for each chunk of the reduction axis
    (``data_axis`` of the data, ``weights_axis`` of the weights: slices of the ``constant``
    weights written once each, or Slices of the ``run_time`` ones), summed into ``out`` by
    :func:`to_int32`."""
    whole = len(chunks) == 1
    partials = []
    for start, end in chunks:
        weights: Value
        if constant is not None:
            index = [slice(None)] * constant.ndim
            index[weights_axis] = slice(start, end)
            weights = b.weight(onnx.numpy_helper.from_array(np.ascontiguousarray(
                constant[tuple(index)])), hint="weights")
        else:
            assert run_time is not None
            weights = run_time if whole else b.Slice(run_time, [start], [end],
                                                     [weights_axis], hint="weights_chunk")
        part = data if whole else b.Slice(data, [start], [end], [data_axis],
                                          hint="data_chunk")
        partials.append(product(part, weights))
    to_int32(b, partials, out)


def to_int32(b: Builder, partials: list[Value], out: str) -> None:
    """Each chunk's float sum rounded (a no-op where it is exact; it absorbs an engine's
    transform-based convolution) and cast to int32, then added in int32 into ``out``."""
    ints = [b.Cast(b.Round(p, hint="rounded"), np.int32, hint="sum_int32",
                   out=out if len(partials) == 1 else None) for p in partials]
    total = ints[0]
    for position, part in enumerate(ints[1:], start=2):  # Adds: Sum takes no int32
        total = b.Add(total, part, hint="sum", out=out if position == len(ints) else None)
