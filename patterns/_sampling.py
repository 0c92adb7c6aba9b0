"""Shared sampling: bilinear taps at pixel coordinates, zeros outside, as gathers of rows.

In: an image batch laid out as rows (:func:`zero_bordered_rows`: (N, C, H, W) -> a zero
border of one pixel, channels last, cut into channel groups, one row per (n, y, x, group)),
and float pixel coordinates ``y``, ``x`` of any shape S that broadcasts against the row base
index. Out: :func:`bilinear_gather`, the bilinearly interpolated samples, shape S + (C/G,):
the four taps ``floor(y) + {0, 1}`` x ``floor(x) + {0, 1}``, each weighted by
``(1 - |y - ty|) * (1 - |x - tx|)`` (times an optional per-sample scale), a tap outside the
image contributing 0. That is the rule of torchvision's ``deform_conv2d``, mmcv's
``deformable_im2col`` and ONNX ``DeformConv``: a sample with ``y <= -1``, ``y >= H``,
``x <= -1`` or ``x >= W`` is 0, and inside that the corners outside the image count 0.

How: coordinates are clipped to [-1, H] x [-1, W] (every coordinate outside samples zeros,
and so does the clipped one), NaN becomes -1 (0, and never an out-of-range index); a tap
index is then in [-1, H] and lands, shifted by the border, on a real pixel or on the zero
border. So no per-tap validity mask is needed and every gather index is in range.

``bilinear_zeros_reference`` is the numpy twin (float64 inside), written from the same
definition with explicit corner masks, not from the graph.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from decomposer.builder import Builder, Value

BORDER = 1  # zero pixels added on each side of both spatial axes


class Rows(NamedTuple):
    """An image batch as gather rows: (N * Hp * Wp * groups, C / groups)."""

    rows: Value
    height: Value  # H, (1,) float: the clip bound of y
    width: Value  # W, (1,) float
    padded_width: Value  # Wp = W + 2, int64 scalar
    padded_plane: Value  # Hp * Wp * groups, int64 scalar: the row stride of one image
    groups: int


def zero_bordered_rows(b: Builder, x: Value, channels: int, groups: int, dtype: np.dtype
                       ) -> Rows:
    """``x`` (N, C, H, W) with a zero border, channels last, as rows of C/groups channels
    (``channels``: the static C, which ``groups`` divides).

    Row ``((n * Hp + y + 1) * Wp + x + 1) * groups + g`` holds channels
    ``g*C/groups .. (g+1)*C/groups - 1`` of pixel (y, x) of image n.
    """
    sizes = b.Cast(b.Shape(x, 2, 4, hint="image_sizes"), dtype, hint="image_sizes_f")
    height = b.Gather(sizes, [0], axis=0, hint="height")
    width = b.Gather(sizes, [1], axis=0, hint="width")
    padded = b.Pad(x, [0, 0, BORDER, BORDER, 0, 0, BORDER, BORDER], np.asarray(0, dtype),
                   hint="bordered")
    padded_sizes = b.Shape(padded, 2, 4, hint="bordered_sizes")  # read back, not added
    padded_height = b.Gather(padded_sizes, 0, axis=0, hint="bordered_height")
    padded_width = b.Gather(padded_sizes, 1, axis=0, hint="bordered_width")
    channels_last = b.Transpose(padded, [0, 2, 3, 1], hint="channels_last")
    rows = b.Reshape(channels_last, [-1, channels // groups], hint="rows")
    plane = padded_height * padded_width * np.asarray(groups, np.int64)
    return Rows(rows, height, width, padded_width, plane, groups)


def bilinear_gather(b: Builder, image: Rows, y: Value, x: Value, base: Value,
                    scale: Value | None = None, hint: str = "sample",
                    perm: list[int] | None = None) -> Value:
    """Bilinear samples of ``image`` at pixel coordinates (``y``, ``x``), zeros outside.

    ``y``, ``x``: float, shape S; ``base``: int64, broadcasting to S: the row of pixel
    (-1, -1) of each sample's image and group, ``n * Hp * Wp * groups + g`` (see
    :func:`zero_bordered_rows`); ``scale``: optional float per sample (a modulation mask);
    ``perm``: a transpose of S applied to each tap's index and weight before its gather
    (lay the point math out with its longest axis last, and the samples as the caller
    needs them). Returns S (permuted) + (C / groups,).
    """
    taps = []
    for axis, (coordinate, size) in enumerate(((y, image.height), (x, image.width))):
        name = "yx"[axis]
        inside = b.Where(b.IsNaN(coordinate), -1.0, coordinate, hint=f"{hint}_{name}_num")
        inside = b.Min(b.Max(inside, -1.0), size, hint=f"{hint}_{name}_clip")
        low = b.Floor(inside, hint=f"{hint}_{name}0")
        fraction = inside - low
        high = b.Min(low + 1.0, size, hint=f"{hint}_{name}1")
        # +1: the border; int64 exact for every clipped coordinate
        low_i = b.Cast(low + 1.0, np.int64, hint=f"{hint}_{name}0_i")
        high_i = b.Cast(high + 1.0, np.int64, hint=f"{hint}_{name}1_i")
        taps.append(((low_i, 1.0 - fraction), (high_i, fraction)))
    groups = np.asarray(image.groups, np.int64)
    total: Value | None = None
    for (row, wy) in taps[0]:
        row_base = base + row * image.padded_width * groups
        for (column, wx) in taps[1]:
            weight = wy * wx if scale is None else (wy * wx) * scale
            index = row_base + column * groups
            if perm is not None:
                index = b.Transpose(index, perm, hint=f"{hint}_index")
                weight = b.Transpose(weight, perm, hint=f"{hint}_weight")
            gathered = b.Gather(image.rows, index, axis=0, hint=f"{hint}_tap")
            term = gathered * b.Unsqueeze(weight, [-1], hint=f"{hint}_w")
            total = term if total is None else total + term
    assert total is not None
    return total


def positions(b: Builder, dims: Value, axis: int, dtype: np.dtype, hint: str) -> Value:
    """0, 1, 2, ... along ``axis`` of a tensor of shape ``dims`` (an int64 shape vector).

    A running sum of ones, not a ``Range``: TVM's importer cannot give a shape to what
    follows a Range of run-time length, but it carries ConstantOfShape's through."""
    ones = b.ConstantOfShape(dims, 1, dtype, hint=f"{hint}_ones")
    return b.CumSum(ones, axis, exclusive=True, hint=hint)


# -- numpy twin ---------------------------------------------------------------------------


def bilinear_zeros_reference(image: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Samples of ``image`` (C, H, W) at float pixel coordinates ``y``, ``x`` (shape S):
    (C,) + S in float64. A sample with y <= -1, y >= H, x <= -1 or x >= W is 0; inside,
    each corner outside the image counts 0."""
    channels, height, width = image.shape
    y = np.asarray(y, np.float64)
    x = np.asarray(x, np.float64)
    out = np.zeros((channels,) + y.shape, np.float64)
    live = (y > -1) & (y < height) & (x > -1) & (x < width)
    y0 = np.floor(np.where(live, y, 0)).astype(np.int64)
    x0 = np.floor(np.where(live, x, 0)).astype(np.int64)
    fy = np.where(live, y, 0) - y0
    fx = np.where(live, x, 0) - x0
    data = image.astype(np.float64)
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            ty, tx = y0 + dy, x0 + dx
            ok = live & (ty >= 0) & (ty < height) & (tx >= 0) & (tx < width)
            values = data[:, np.clip(ty, 0, height - 1), np.clip(tx, 0, width - 1)]
            out += np.where(ok, wy * wx, 0.0) * np.where(ok, values, 0.0)
    return out
