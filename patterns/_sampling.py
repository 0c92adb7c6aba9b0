"""Shared sampling: bilinear taps at pixel coordinates, zeros outside, as one gather of 2x2
neighbourhoods per sample.

In: an image batch (N, C, H, W) laid out by :func:`quad_rows` as one row per (image, pixel,
channel group) holding the 2x2 neighbourhood whose top-left corner is that pixel (four
channel-group vectors: (y, x), (y, x+1), (y+1, x), (y+1, x+1)), over a zero border; and
float pixel coordinates ``y``, ``x`` of any shape S. Out: :func:`bilinear_sample`, the
bilinearly interpolated samples, shape S (permuted) + (C / groups,): the four taps
``floor(y) + {0, 1}`` x ``floor(x) + {0, 1}``, weighted by ``(1 - |y - ty|) * (1 - |x -
tx|)`` (times an optional per-sample scale), a tap outside the image contributing 0. That is
the rule of torchvision's ``deform_conv2d``, mmcv's ``deformable_im2col`` and ONNX
``DeformConv``: a sample with ``y <= -1``, ``y >= H``, ``x <= -1`` or ``x >= W`` is 0, and
inside that the corners outside the image count 0.

How: coordinates are clipped to [-1, H] x [-1, W] (every coordinate outside samples zeros,
and so does the clipped one) and NaN becomes -1 (0, never an out-of-range index); the
top-left tap is then in [-1, H] x [-1, W] and, shifted by the border (one zero pixel before,
two after), names a row of the quad table. One ``Gather`` fetches the sample's four taps as
one contiguous row, and a batched ``MatMul`` of the (1, 4) tap weights with the (4, C/g)
taps sums them: the sample-sized data is written once and read once.

``bilinear_zeros_reference`` is the numpy twin (float64 inside), written from the same
definition with explicit corner masks, not from the graph.

Also here, for every sampler of normalized grids: the coordinate padding GridSample's
decomposition builds (``reflect``, ``clamp``, ``finite``, ``split_pieces``) and their numpy
twins (``unnormalize``, ``reflect_coordinate``, ``clip_coordinate``, ``pad_coordinate``,
``linear_taps``, ``cubic_taps`` with torch's ``CUBIC_A``), with ``grid_sample_reference``,
torch's ``grid_sample`` in numpy.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from decomposer.builder import Builder, Value

# Zero pixels around the image: one before (a tap at -1), two after (a tap at H and its
# neighbour at H + 1, which a top-left corner of H needs).
BEFORE, AFTER = 1, 2


class Quads(NamedTuple):
    """The quad table of an image batch: rows (N * (H+2) * (W+2) * groups, 4 * C/groups)."""

    rows: Value
    # H and W: the clip bounds of y and x ((1,) floats, or per-sample constants that
    # broadcast); (W + 2) * groups: rows per image row (int64); (H + 2) * (W + 2) * groups:
    # rows per image (the caller's base index uses it; None where the caller knows it)
    height: Value | np.ndarray
    width: Value | np.ndarray
    row_stride: Value | np.ndarray
    image_stride: Value | None
    groups: int
    group_channels: int  # C / groups


def quad_rows(b: Builder, x: Value, channels: int, groups: int, dtype: np.dtype) -> Quads:
    """``x`` (N, C, H, W) as its quad table (see the module docstring). Row
    ``((n * (H+2) + y + 1) * (W+2) + x + 1) * groups + g`` holds, for channel group g, the
    pixels (y, x), (y, x+1), (y+1, x), (y+1, x+1) of image n, zeros outside the image;
    ``channels`` is the static C, which ``groups`` divides. Costs four input-sized copies."""
    sizes = b.Cast(b.Shape(x, 2, 4, hint="image_sizes"), dtype, hint="image_sizes_f")
    height = b.Gather(sizes, [0], axis=0, hint="height")
    width = b.Gather(sizes, [1], axis=0, hint="width")
    padded = b.Pad(x, [0, 0, BEFORE, BEFORE, 0, 0, AFTER, AFTER], np.asarray(0, dtype),
                   hint="bordered")  # (N, C, H+3, W+3)
    last = b.Transpose(padded, [0, 2, 3, 1], hint="channels_last")  # (N, H+3, W+3, C)
    rows, dims = quad_table(b, last, channels, groups, hint="quad")
    grid_sizes = b.Shape(dims, 1, 3, hint="quad_sizes")
    row_stride = b.Gather(grid_sizes, 1, axis=0, hint="quad_width") \
        * np.asarray(groups, np.int64)
    image_stride = b.Gather(grid_sizes, 0, axis=0, hint="quad_height") * row_stride
    return Quads(rows, height, width, row_stride, image_stride, groups, channels // groups)


def quad_table(b: Builder, bordered: Value, channels: int, groups: int, hint: str
               ) -> tuple[Value, Value]:
    """(rows, a corner view) of a channels-last image batch that already has its border,
    (N, H+3, W+3, C) -> rows (N * (H+2) * (W+2) * groups, 4 * C/groups), and one corner
    (N, H+2, W+2, C) whose Shape gives the table's grid sizes."""
    per_group = channels // groups
    last = bordered
    # rows dy .. dy+H+1, columns dx .. dx+W+1 of each corner: (N, H+2, W+2, C)
    corners = [b.Slice(last, [dy, dx], [dy - 1 if dy == 0 else 2**62,
                                        dx - 1 if dx == 0 else 2**62], [1, 2],
                       hint=f"{hint}_corner{dy}{dx}") for dy in (0, 1) for dx in (0, 1)]
    # Sizes read back from a corner, not computed (TVM's importer does no arithmetic on a
    # Shape, and infers no dim of a Concat of reshaped views when dims are dynamic).
    corner_dims = b.Shape(corners[0], 0, 3, hint=f"{hint}_dims")  # N, H+2, W+2
    grouped = b.Concat(corner_dims, np.asarray([groups, 1, per_group], np.int64), axis=0,
                       hint=f"{hint}_groups_shape")
    quads = b.Concat(*(b.Reshape(corner, grouped, hint=f"{hint}_corner_groups")
                       for corner in corners),
                     axis=4, hint=f"{hint}s")  # (N, H+2, W+2, groups, 4, C/groups)
    return b.Reshape(quads, [-1, 4 * per_group], hint=f"{hint}_rows"), corners[0]


def bilinear_sample(b: Builder, image: Quads, y: Value, x: Value, base: Value,
                    scale: Value | None, sample_dims: list[Value | np.ndarray],
                    hint: str = "sample", perm: list[int] | None = None,
                    summed: int = 1) -> Value:
    """Bilinear samples of ``image`` at pixel coordinates (``y``, ``x``), zeros outside.

    ``y``, ``x``: float, shape S; ``base``: int64, broadcasting to S: the row of pixel
    (-1, -1) of each sample's image and group, ``n * image_stride + g``; ``scale``: optional
    float per sample (a modulation mask); ``perm``: a transpose of S applied to the row
    index and the weights before the gather (lay the point math out with its longest axis
    last, and the samples as the caller needs them); ``sample_dims``: the permuted S as
    pieces of an int64 shape vector (Shape slices and int64 arrays, concatenated once per
    Reshape target: no dim is inferred, and TVM's importer takes no Concat of a Concat of
    shapes). ``summed``: how many samples at the end of the permuted S are summed (their
    static count: the trailing axes of the permuted S that ``sample_dims`` leaves out), in
    the same MatMul as the corners. Returns ``sample_dims`` + (C / groups,).

    ``image.height``, ``image.width`` and ``image.row_stride`` may be tensors that broadcast
    to S (per-sample image sizes: several images of different sizes in one table).
    """
    corner_index: list[Value] = []
    weights: list[tuple[Value, Value]] = []
    for axis, (coordinate, size) in enumerate(((y, image.height), (x, image.width))):
        name = "yx"[axis]
        inside = b.Where(b.IsNaN(coordinate), -1.0, coordinate, hint=f"{hint}_{name}_num")
        inside = b.Min(b.Max(inside, -1.0), size, hint=f"{hint}_{name}_clip")
        low = b.Floor(inside, hint=f"{hint}_{name}0")
        fraction = inside - low
        # +BEFORE: the border; exact in int64 for every clipped coordinate
        corner_index.append(b.Cast(low + float(BEFORE), np.int64, hint=f"{hint}_{name}0_i"))
        weights.append((1.0 - fraction, fraction))
    groups = np.asarray(image.groups, np.int64)
    index = base + corner_index[0] * image.row_stride + corner_index[1] * groups
    (wy0, wy1), (wx0, wx1) = weights
    if scale is not None:
        wy0, wy1 = wy0 * scale, wy1 * scale
    # (1, 4) weights per sample, in the quad's corner order
    tap_weights = [b.Unsqueeze(wy * wx, [-1], hint=f"{hint}_w") for wy in (wy0, wy1)
                   for wx in (wx0, wx1)]
    weight = b.Concat(*tap_weights, axis=-1, hint=f"{hint}_weights")  # S + (4,)
    if perm is not None:
        index = b.Transpose(index, perm, hint=f"{hint}_index")
        weight = b.Transpose(weight, [*perm, len(perm)], hint=f"{hint}_weights_t")
    taps = b.Gather(image.rows, index, axis=0, hint=f"{hint}_quads")  # S' + (4 * C/g,)

    def target(*trailing: int) -> Value:
        return b.Concat(*sample_dims, np.asarray(trailing, np.int64), axis=0,
                        hint=f"{hint}_shape")

    # The corner MatMul is rank 3, (samples, 1, 4*summed) @ (samples, 4*summed, C/g):
    # onnx2tf's tf_converter turns a batched MatMul above rank 5 into a Flex op LiteRT's
    # builtin interpreter cannot run.
    taps = b.Reshape(taps, [-1, 4 * summed, image.group_channels], hint=f"{hint}_taps")
    weight = b.Reshape(weight, [-1, 1, 4 * summed], hint=f"{hint}_row")
    total = b.MatMul(weight, taps, hint=f"{hint}_sum")  # (samples, 1, C/g)
    return b.Reshape(total, target(image.group_channels), hint=hint)


def bilinear_pixels(b: Builder, rows: Value, y: Value, x: Value, base: Value,
                    height: Value | np.ndarray, width: Value | np.ndarray, groups: int,
                    group_channels: int | Value,
                    scale: Value | None, sample_dims: list[Value | np.ndarray], hint: str,
                    perm: list[int], summed: int = 1) -> Value:
    """Bilinear samples gathered pixel by pixel from an image table with no border.

    The same samples as :func:`bilinear_sample` (zeros outside, every corner outside the
    image counting 0), for tables that are not worth a quad copy: when the samples are far
    fewer than the pixels (deformable attention over large feature maps), a gather of the
    four corners straight from ``rows`` costs less than rebuilding the image. ``rows``:
    (images * H * W * groups, C/groups), row ``base + (y * W + x) * groups``; ``height``,
    ``width``: float sizes (constants or tensors) broadcasting to S. A corner outside the
    image is clamped onto a real pixel with weight 0 (so a non-finite pixel there would
    still poison the sum; the quad table's zero border has no such corner). Other arguments
    as :func:`bilinear_sample`.
    """
    indices: list[list[Value]] = []
    weights: list[list[Value]] = []
    for axis, (coordinate, size) in enumerate(((y, height), (x, width))):
        name = "yx"[axis]
        inside = b.Where(b.IsNaN(coordinate), -2.0, coordinate, hint=f"{hint}_{name}_num")
        inside = b.Min(b.Max(inside, -2.0), size, hint=f"{hint}_{name}_clip")
        low = b.Floor(inside, hint=f"{hint}_{name}0")
        fraction = inside - low
        axis_index, axis_weight = [], []
        for tap, weight in ((low, 1.0 - fraction), (low + 1.0, fraction)):
            valid = b.And(b.GreaterOrEqual(tap, 0.0), b.Less(tap, size), hint=f"{hint}_in")
            axis_weight.append(b.Where(valid, weight, 0.0, hint=f"{hint}_{name}_w"))
            clamped = b.Min(b.Max(tap, 0.0), size - 1.0, hint=f"{hint}_{name}_tap")
            axis_index.append(b.Cast(clamped, np.int64, hint=f"{hint}_{name}_i"))
        indices.append(axis_index)
        weights.append(axis_weight)
    group_step = np.asarray(groups, np.int64)
    row_step: Value | np.ndarray = np.asarray(width, np.int64) * group_step \
        if isinstance(width, np.ndarray) else \
        b.Cast(width, np.int64, hint=f"{hint}_width_i") * group_step
    corner_index, corner_weight = [], []
    for iy, wy in zip(indices[0], weights[0], strict=True):
        for ix, wx in zip(indices[1], weights[1], strict=True):
            corner_index.append(b.Unsqueeze(base + iy * row_step + ix * group_step, [-1],
                                            hint=f"{hint}_corner_i"))
            weight = wy * wx if scale is None else (wy * wx) * scale
            corner_weight.append(b.Unsqueeze(weight, [-1], hint=f"{hint}_corner_w"))
    index = b.Transpose(b.Concat(*corner_index, axis=-1, hint=f"{hint}_index"),
                        [*perm, len(perm)], hint=f"{hint}_index_t")
    weight_all = b.Transpose(b.Concat(*corner_weight, axis=-1, hint=f"{hint}_weights"),
                             [*perm, len(perm)], hint=f"{hint}_weights_t")
    # C/g may be a (1,) size read at run time
    tail = np.asarray([group_channels], np.int64) if isinstance(group_channels, int) \
        else group_channels
    taps = b.Gather(rows, index, axis=0, hint=f"{hint}_pixels")  # S' + (4, C/g)
    taps = b.Reshape(taps, b.Concat(np.asarray([-1, 4 * summed], np.int64), tail, axis=0,
                                    hint=f"{hint}_taps_shape"), hint=f"{hint}_taps")
    weight_all = b.Reshape(weight_all, [-1, 1, 4 * summed], hint=f"{hint}_row")
    total = b.MatMul(weight_all, taps, hint=f"{hint}_sum")  # (samples, 1, C/g)
    return b.Reshape(total, b.Concat(*sample_dims, tail, axis=0, hint=f"{hint}_shape"),
                     hint=hint)


def positions(b: Builder, dims: Value, axis: int, dtype: np.dtype, hint: str) -> Value:
    """0, 1, 2, ... along ``axis`` of a tensor of shape ``dims`` (an int64 shape vector).

    A running sum of ones, not a ``Range``: TVM's importer cannot give a shape to what
    follows a Range of run-time length, but it carries ConstantOfShape's through."""
    ones = b.ConstantOfShape(dims, 1, dtype, hint=f"{hint}_ones")
    return b.CumSum(ones, axis, exclusive=True, hint=hint)


# -- GridSample's coordinate padding (zeros, border, reflection) and its numpy twin ---------

CUBIC_A = -0.75  # torch's cubic convolution constant (UpSampleBicubic2d)


def reflect(b: Builder, u: Value, n: Value, top: Value, align_corners: bool,
             dtype: np.dtype) -> Value:
    """torch's reflect_coordinates: fold u into [low, low + span] (before the clip).

    align_corners: low 0, span n-1 (n = 1 folds everything to a point the clip makes 0);
    otherwise: low -0.5, span n.
    """
    if align_corners:
        twice_span = b.Max(top * np.asarray(2, dtype), np.asarray(1, dtype))
        distance = b.Abs(u)
    else:
        twice_span = n * np.asarray(2, dtype)
        distance = b.Abs(u + np.asarray(0.5, dtype))
    extra = distance - b.Floor(distance / twice_span) * twice_span
    folded = b.Min(extra, twice_span - extra)
    return folded if align_corners else folded - np.asarray(0.5, dtype)


def clamp(b: Builder, x: Value, low: Any, high: Value, hint: str | None = None) -> Value:
    """x clipped to [low (a constant), high (a run-time value)].

    Spelled Min(Clip(x, low), high): onnx2torch converts Clip only with constant bounds.
    Engines' Min and Clip may differ on NaN, so every caller clamps a NaN-free x (after
    _finite), or only compares the result with x by Equal, which is False for a NaN x
    whatever the clamp gives.
    """
    return b.Min(b.Clip(x, low), high, hint=hint)


def split_pieces(b: Builder, x: Value, sizes: list[int], axis: int, hint: str) -> list[Value]:
    """Split(x, sizes, axis) spelled as one Slice per piece (as fast on ONNX Runtime): onnx2tf's
    tf_converter lowers a Split whose sizes are a Constant node to Flex SplitV, which LiteRT's
    builtin interpreter cannot run. ``sizes`` sum to the axis' static size.

    The first piece starts at -total, not 0 (the same element): OpenVINO 2026.4's CPU plugin
    drops a Slice that starts at 0 in front of a GatherElements, whose shape check then fails.
    """
    starts = np.cumsum([0, *sizes[:-1]]).tolist()
    starts[0] = -sum(sizes)
    ends = np.cumsum(sizes).tolist()
    return [b.Slice(x, [start], [end], [axis], hint=f"{hint}{number}")
            for number, (start, end) in enumerate(zip(starts, ends, strict=True))]


def finite(b: Builder, u: Value, replacement: Any) -> Value:
    """u with NaN replaced (so it can become an index); +-inf is left to the clip."""
    return b.Where(b.IsNaN(u), replacement, u)


# -- the numpy reference ---------------------------------------------------------------------


def grid_sample_reference(x: np.ndarray, grid: np.ndarray, mode: str = "bilinear",
                          padding: str = "zeros", align_corners: bool = False) -> np.ndarray:
    """numpy reference of torch.nn.functional.grid_sample (its CPU kernels), any float type.

    Coordinates are computed in float32 (float64 if X or the grid is float64), as torch
    computes them, so nearest ties round the same way; the sum is taken in float64.
    """
    x = np.asarray(x)
    grid = np.asarray(grid)
    k = x.ndim - 2
    if grid.ndim != k + 2 or grid.shape[-1] != k or k not in (2, 3):
        raise ValueError(f"grid {grid.shape} does not fit input {x.shape}")
    coord_type = np.float64 if np.float64 in (x.dtype, grid.dtype) else np.float32
    batch, channels = x.shape[:2]
    in_sizes = x.shape[2:]
    out_sizes = grid.shape[1:-1]
    points = int(np.prod(out_sizes))
    flat_grid = grid.reshape(batch, points, k).astype(coord_type)
    values = x.reshape(batch, channels, -1).astype(np.float64)
    result = np.zeros((batch, channels, points), np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        # Per spatial axis (D/H/W order): unnormalized coordinates, (batch, points).
        coords = []
        for position, n in enumerate(in_sizes):
            g = flat_grid[..., k - 1 - position]
            coords.append(unnormalize(g, n, align_corners, coord_type))
        if mode == "bicubic":
            taps_per_axis = [cubic_taps(c, n, padding, align_corners, coord_type)
                             for c, n in zip(coords, in_sizes, strict=True)]
        else:
            padded = [pad_coordinate(c, n, padding, align_corners, k, coord_type)
                      for c, n in zip(coords, in_sizes, strict=True)]
            if mode == "nearest":
                taps_per_axis = [[(np.round(c), np.ones_like(c))] for c in padded]
            else:
                taps_per_axis = [linear_taps(c) for c in padded]
        strides = [int(np.prod(in_sizes[position + 1:])) for position in range(k)]
        for combo in np.ndindex(*[len(t) for t in taps_per_axis]):
            inside = np.ones((batch, points), bool)
            flat = np.zeros((batch, points), np.int64)
            weight = np.ones((batch, points), np.float64)
            for position, tap_index in enumerate(combo):
                coordinate, tap_weight = taps_per_axis[position][tap_index]
                as_int = to_index(coordinate)
                inside &= (as_int >= 0) & (as_int < in_sizes[position])
                flat += np.where(inside, as_int, 0) * strides[position]
                weight = weight * tap_weight.astype(np.float64)
            flat = np.where(inside, flat, 0)
            sampled = np.take_along_axis(values, np.broadcast_to(flat[:, None, :], (
                batch, channels, points)), axis=2)
            if k == 2 and mode != "nearest":
                # torch's 2-D kernel gathers 0 outside and multiplies (NaN weights stay NaN).
                result += np.where(inside[:, None, :], sampled, 0.0) * weight[:, None, :]
            else:
                # torch's 3-D kernel and nearest skip out-of-range taps.
                result += np.where(inside[:, None, :], sampled * weight[:, None, :], 0.0)
    return result.reshape(batch, channels, *out_sizes).astype(x.dtype)


def to_index(coordinate: np.ndarray) -> np.ndarray:
    """Float coordinate -> int64 the way C++ truncates; NaN and huge values become an
    out-of-range sentinel (torch's conversion gives INT_MIN there)."""
    finite = np.isfinite(coordinate) & (np.abs(coordinate) < 2.0**62)
    return np.where(finite, np.trunc(np.where(finite, coordinate, 0)), -(2**62)).astype(
        np.int64)


def unnormalize(g: np.ndarray, n: int, align_corners: bool, dtype: type) -> np.ndarray:
    one, half = dtype(1), dtype(0.5)
    if align_corners:
        return ((g + one) * (dtype(n - 1) / dtype(2))).astype(dtype)
    return ((g + one) * (dtype(n) / dtype(2)) - half).astype(dtype)


def reflect_coordinate(c: np.ndarray, n: int, align_corners: bool, dtype: type
                        ) -> np.ndarray:
    """torch's reflect_coordinates with twice_low/twice_high as in grid_sampler_compute."""
    if align_corners:
        if n <= 1:
            return np.zeros_like(c)
        low, span = dtype(0), dtype(n - 1)
    else:
        low, span = dtype(-0.5), dtype(n)
    distance = np.abs(c - low)
    extra = np.fmod(distance, span)
    flips = np.floor(distance / span)
    even = np.mod(np.where(np.isfinite(flips), flips, 0), 2) == 0
    return np.where(even, extra + low, span - extra + low).astype(dtype)


def clip_coordinate(c: np.ndarray, n: int, nan_to: float, dtype: type) -> np.ndarray:
    clipped = np.minimum(np.maximum(c, dtype(0)), dtype(n - 1))
    return np.where(np.isnan(c), dtype(nan_to), clipped).astype(dtype)


def pad_coordinate(c: np.ndarray, n: int, padding: str, align_corners: bool, k: int,
                    dtype: type) -> np.ndarray:
    """Border/reflection padding of the coordinate; NaN goes where torch's kernel sends it
    (2-D: 0, 3-D: n - 1)."""
    nan_to = 0.0 if k == 2 else float(n - 1)
    if padding == "border":
        return clip_coordinate(c, n, nan_to, dtype)
    if padding == "reflection":
        return clip_coordinate(reflect_coordinate(c, n, align_corners, dtype), n, nan_to,
                                dtype)
    return c


def linear_taps(c: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    low = np.floor(c)
    frac = c - low
    return [(low, 1 - frac), (low + 1, frac)]


def cubic_taps(c: np.ndarray, n: int, padding: str, align_corners: bool, dtype: type
                ) -> list[tuple[np.ndarray, np.ndarray]]:
    """The 4 taps of torch's bicubic kernel along one axis, each padded on its own."""
    a = dtype(CUBIC_A)
    low = np.floor(c)
    t = c - low

    def outer(d: np.ndarray) -> np.ndarray:  # 1 < d < 2
        return ((a * d - dtype(5) * a) * d + dtype(8) * a) * d - dtype(4) * a

    def inner(d: np.ndarray) -> np.ndarray:  # d <= 1
        return ((a + dtype(2)) * d - (a + dtype(3))) * d * d + dtype(1)

    coefficients = [outer(t + dtype(1)), inner(t), inner(dtype(1) - t), outer(dtype(2) - t)]
    taps: list[tuple[np.ndarray, np.ndarray]] = []
    for offset, coefficient in zip((-1, 0, 1, 2), coefficients, strict=True):
        tap = low + dtype(offset)
        if padding == "border":
            tap = clip_coordinate(tap, n, 0.0, dtype)
        elif padding == "reflection":
            tap = clip_coordinate(reflect_coordinate(tap, n, align_corners, dtype), n, 0.0,
                                   dtype)
        taps.append((tap, coefficient.astype(dtype)))
    return taps


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
