"""AffineGrid (torch F.affine_grid semantics) in one output-sized pass, size read at run time.

Matches:
- ``AffineGrid(theta, size; align_corners:int=0)`` in any domain (``custom.ops``,
  ``ai.onnx.contrib``, ...), and in the default domain below opset 20, where it is not a
  standard op (at opset 20+ it is standard and never offered to patterns);
- torch's fallbacks ``org.pytorch.aten::affine_grid_generator(theta, size, align_corners)``
  and ``ATen(operator="affine_grid_generator")``, whose align_corners is a constant input.

Semantics are exactly ``torch.nn.functional.affine_grid``:
- theta (N, 2, 3), size [N, C, H, W]    -> grid (N, H, W, 2)
- theta (N, 3, 4), size [N, C, D, H, W] -> grid (N, D, H, W, 3)
A spatial size of 1 gives coordinate 0, as in torch (ONNX's own AffineGrid-20 and ONNX
Runtime's kernel give -1 there when align_corners=1).

Before -> after::

    AffineGrid(theta, size)  ->  x, y, (z) = coords(W), coords(H), (coords(D))
                                 G = [[0,1,0] per w], [[x_w, 0, 1] per w]      # (2, W, 3)
                                 R = G @ theta^T                               # (N, 2, W, 2)
      2-D float32:               grid = Conv1x1(R, weight=[y_h, 1])            # (N, H, W, 2)
      2-D float64:               grid = Reshape([y_h, 1] @ Reshape(R), [N, H, W, 2])
      3-D:                       grid = z_d * R_z + (y_h * R_y + R_c)          # broadcast

``coords(n) = Range(1-n, n, 2) / den`` with ``den = n`` (align_corners=0) or
``max(n-1, 1)`` (align_corners=1). Everything before the last op is small (sizes, not
grids); the last op alone writes the output, in its final layout, which is what makes
this form as fast as ONNX Runtime's native kernel (see the README's benchmark table).

Envelope: opsets 11+, theta float16/32/64 (float16 is computed in float32 and rounded
once at the end), batch and every spatial size dynamic. 2-D vs 3-D is read from theta's
static shape or the size tensor's length; if neither is known the node is rejected.
The emitted graph has a fixed size whatever the tensor values are.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, numpy_dtype
from decomposer.pattern import Attr, MatchContext, MatchedNode, OutputType, Pattern, Reject

_FLOAT_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)
_INT_TYPES = (TensorProto.INT64, TensorProto.INT32)


class Facts(NamedTuple):
    spatial_rank: int  # 2 or 3
    align_corners: bool
    theta_type: int  # ONNX element type of theta and of the grid
    size_is_fed: bool  # size is a model input, so nothing derived from it can be folded


class AffineGrid(Pattern):
    op_type = "AffineGrid"
    aten_operator = "affine_grid_generator"
    attributes = {"align_corners": Attr("int", default=0, choices=(0, 1),
                                        doc="1: -1 and 1 are the centers of the corner pixels")}

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        expected_inputs = 3 if node.form == "aten" else 2
        if len(node.inputs) != expected_inputs or not all(node.inputs):
            raise Reject(f"expected {expected_inputs} inputs, got {len(node.inputs)}")
        theta, size = node.inputs[0], node.inputs[1]
        if node.form == "aten":
            flag = ctx.constant(node.inputs[2])
            if flag is None or flag.size != 1:
                raise Reject("align_corners (input 3) must be a constant scalar")
            align = bool(flag.reshape(()).item())
        else:
            align = bool(node.attrs["align_corners"])

        theta_type = ctx.elem_type(theta)
        if theta_type is None:
            raise Reject(f"the element type of theta '{theta}' is unknown; give theta a "
                         "typed graph input or value_info")
        if theta_type not in _FLOAT_TYPES:
            raise Reject(f"theta must be float16, float32 or float64, got "
                         f"{TensorProto.DataType.Name(theta_type).lower()}")
        size_type = ctx.elem_type(size) or TensorProto.INT64
        if size_type not in _INT_TYPES:
            raise Reject(f"size must be int64 or int32, got "
                         f"{TensorProto.DataType.Name(size_type).lower()}")
        return Facts(_spatial_rank(theta, size, ctx), align, theta_type,
                     ctx.is_model_input(size))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        k = facts.spatial_rank
        theta, size = node.inputs[0], node.inputs[1]
        # Range has no float16 kernel in ONNX Runtime: compute in float32, round once.
        compute_type = TensorProto.FLOAT if facts.theta_type == TensorProto.FLOAT16 \
            else facts.theta_type
        dtype = numpy_dtype(compute_type)
        if compute_type != facts.theta_type:
            theta = b.cast(theta, compute_type, hint="theta_f32")
        size_f = b.cast(size, compute_type, hint="size_f")  # [N, C, (D,) H, W]
        one = b.const(1, dtype, hint="one")
        two = b.const(2, dtype, hint="two")

        def coords(axis: int, label: str) -> str:
            """Normalized coordinates along size[axis], shape (n,)."""
            n = b.op("Gather", size_f, b.ints(axis, f"{label}_axis"), axis=0, hint=f"{label}_n")
            steps = b.op("Range", b.op("Sub", one, n, hint=f"{label}_start"), n, two,
                         hint=f"{label}_steps")  # 1-n, 3-n, ..., n-1
            den = n
            if facts.align_corners:
                den = b.op("Max", b.op("Sub", n, one, hint=f"{label}_n_minus_1"), one,
                           hint=f"{label}_den")
            return b.op("Div", steps, den, hint=label)

        x = coords(k + 1, "x")  # along W
        # R[n, r, w, c] = sum_j G[r, w, j] * theta[n, c, j]; rows r are the coefficient of
        # z (3-D), of y, then the constant row x_w * theta[n, c, 0] + theta[n, c, k].
        # In 3-D, G and R carry one more unit axis, so R comes out as (N, 3, 1, W, 3),
        # ready to broadcast against (D, H) without another Unsqueeze.
        scale_rows, offset_rows = _selector_rows(k, dtype)
        x_axes, theta_axes = ([0, 2], [1]) if k == 2 else ([0, 1, 3], [1, 2])
        g = b.op("Add",
                 b.op("Mul", b.unsqueeze(x, x_axes, hint="x_row"),
                      b.const(scale_rows, hint="G_scale"), hint="G_x"),
                 b.const(offset_rows, hint="G_offset"), hint="G")  # (k, (1,) W, k+1)
        theta_t = b.unsqueeze(b.op("Transpose", theta, perm=[0, 2, 1], hint="theta_T"),
                              theta_axes, hint="theta_T_b")  # (N, 1, (1,) k+1, k)
        rows = b.op("MatMul", g, theta_t, hint="R_rows")  # (N, k, (1,) W, k)

        final = node.outputs[0] if compute_type == facts.theta_type else None
        if k == 3:
            grid = self._add_form_3d(b, rows, coords(3, "y"), coords(2, "z"), final)
        elif compute_type == TensorProto.FLOAT:
            grid = self._conv_form_2d(b, rows, coords(2, "y"), dtype, final,
                                      keep_dynamic=not facts.size_is_fed)
        else:  # ONNX Runtime has no float64 Conv kernel
            grid = self._matmul_form_2d(b, rows, coords(2, "y"), dtype, final)
        if final is None:
            b.cast(grid, facts.theta_type, hint="grid", out=node.outputs[0])

    @staticmethod
    def _conv_form_2d(b: Builder, rows: str, y: str, dtype: np.dtype, out: str | None,
                      keep_dynamic: bool) -> str:
        """grid = Conv1x1(R, weight=(y_h, 1)): the same small-K GEMM as L @ R, but a 1x1 Conv
        with L as its (H, 2, 1, 1) weight writes (N, H, W, 2) directly: one output-sized
        pass and no Reshape (which ONNX Runtime copies when the grid is a graph output)."""
        weight = b.pad(b.unsqueeze(y, [1, 2, 3], hint="y4"), [0, 0, 0, 0, 0, 1, 0, 0], 1,
                       dtype, hint="L_weight")  # (H, 2, 1, 1): (y_h, 1)
        if keep_dynamic:
            # Unless `size` is fed at run time it may be folded to a constant, and with it
            # this weight; a constant weight makes ONNX Runtime's NCHWc layout pass wrap the
            # Conv in reorders, measured 3x slower (2-D, N=8, 512x512). Concatenating an
            # empty slice of R (which depends on theta) keeps the values but not constness.
            nothing = b.slice(rows, [0, 0, 0], [0, 1, 1], [0, 2, 3],
                              hint="R_none")  # (0, 2, 1, 1)
            weight = b.op("Concat", weight, nothing, axis=0, hint="L_weight_dynamic")
        return b.op("Conv", rows, weight, hint="grid", out=out)  # rows: (N, 2, W, 2)

    @staticmethod
    def _matmul_form_2d(b: Builder, rows: str, y: str, dtype: np.dtype, out: str | None
                        ) -> str:
        """grid = Reshape(L @ R), for float64 (no Conv kernel): one output-sized MatMul,
        plus a copy when the grid is a graph output."""
        left = b.pad(b.unsqueeze(y, [1], hint="y_col"), [0, 0, 0, 1], 1, dtype,
                     hint="L")  # (H, 2): (y_h, 1)
        right = b.op("Reshape", rows, b.ints([0, 0, -1], "R_shape"), hint="R")  # (N, 2, W*2)
        flat = b.op("MatMul", left, right, hint="grid_flat")  # (N, H, W*2)
        return b.op("Reshape", flat, b.ints([0, 0, -1, 2], "grid_shape"), hint="grid", out=out)

    @staticmethod
    def _add_form_3d(b: Builder, rows: str, y: str, z: str, out: str | None) -> str:
        """grid = (z_d * R_z) + (y_h * R_y + R_c): the two terms are small, (N, D, 1, W, 3)
        and (N, 1, H, W, 3); their broadcast Add is the only output-sized pass."""
        r_z, r_y, r_c = b.split(rows, [1, 1, 1], axis=1, hint="R_split")  # (N, 1, 1, W, 3)
        z5 = b.unsqueeze(z, [0, 2, 3, 4], hint="z5")  # (1, D, 1, 1, 1)
        y5 = b.unsqueeze(y, [0, 1, 3, 4], hint="y5")  # (1, 1, H, 1, 1)
        z_term = b.op("Mul", z5, r_z, hint="grid_z")  # (N, D, 1, W, 3)
        yc_term = b.op("Add", b.op("Mul", y5, r_y, hint="grid_y"), r_c,
                       hint="grid_yc")  # (N, 1, H, W, 3)
        return b.op("Add", z_term, yc_term, hint="grid", out=out)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        theta_shape = ctx.shape(node.inputs[0])
        batch = theta_shape[0] if theta_shape else None
        k = facts.spatial_rank
        return [(facts.theta_type, [batch, *([None] * k), k])]

    def reference(self, *inputs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
        theta, size = inputs[0], inputs[1]
        # The ATen forms pass align_corners as a third (constant) input.
        align = np.asarray(inputs[2]).reshape(()).item() if len(inputs) > 2 \
            else attrs.get("align_corners", 0)
        return [affine_grid_reference(theta, size, int(align))]


def _selector_rows(k: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """G = x * scale + offset, shapes (k, 1, k+1) in 2-D and (k, 1, 1, k+1) in 3-D: which
    theta column each row of R takes."""
    shape = (k, *([1] * (k - 1)), k + 1)
    scale = np.zeros(shape, dtype=dtype)
    offset = np.zeros(shape, dtype=dtype)
    for row in range(k - 1):  # rows for z (3-D) and y: theta columns k-1 ... 1
        offset[row, ..., k - 1 - row] = 1
    scale[k - 1, ..., 0] = 1  # x coefficient
    offset[k - 1, ..., k] = 1  # translation
    return scale, offset


def _spatial_rank(theta: str, size: str, ctx: MatchContext) -> int:
    """2 or 3, from theta's static shape and/or the size tensor's length; must agree."""
    votes: dict[str, int] = {}
    theta_shape = ctx.shape(theta)
    if theta_shape is not None:
        if len(theta_shape) != 3:
            raise Reject(f"theta must have rank 3 (N, 2, 3) or (N, 3, 4), got shape "
                         f"{list(theta_shape)}")
        rows, cols = theta_shape[1], theta_shape[2]
        if isinstance(rows, int):
            if rows not in (2, 3) or (isinstance(cols, int) and cols != rows + 1):
                raise Reject(f"theta must be (N, 2, 3) or (N, 3, 4), got {list(theta_shape)}")
            votes["theta"] = rows
        elif isinstance(cols, int):
            if cols not in (3, 4):
                raise Reject(f"theta must be (N, 2, 3) or (N, 3, 4), got {list(theta_shape)}")
            votes["theta"] = cols - 1
    size_value = ctx.constant(size)
    size_shape = tuple(size_value.shape) if size_value is not None else ctx.shape(size)
    if size_shape is not None:
        if len(size_shape) != 1:
            raise Reject(f"size must be a 1-D tensor, got shape {list(size_shape)}")
        if isinstance(size_shape[0], int):
            if size_shape[0] not in (4, 5):
                raise Reject(f"size must have 4 (N, C, H, W) or 5 (N, C, D, H, W) elements, "
                             f"got {size_shape[0]}")
            votes["size"] = size_shape[0] - 2
    if not votes:
        raise Reject("cannot tell 2-D from 3-D: theta's shape and size's length are both "
                     "unknown; export with a static theta shape (N, 2, 3)/(N, 3, 4) or add "
                     "value_info for theta or size")
    if len(set(votes.values())) > 1:
        raise Reject(f"theta says {votes['theta']}-D but size says {votes['size']}-D")
    return next(iter(votes.values()))


def _linspace(n: int, align_corners: bool, dtype: np.dtype) -> np.ndarray:
    """torch's coordinates along one axis: n points in [-1, 1]; n == 1 gives [0]."""
    if n <= 1:
        return np.zeros(n, dtype=dtype)
    steps = np.arange(1 - n, n, 2, dtype=np.float64)
    return (steps / (n - 1 if align_corners else n)).astype(dtype)


def affine_grid_reference(theta: np.ndarray, size: np.ndarray | list[int],
                          align_corners: int = 0) -> np.ndarray:
    """numpy reference of torch.nn.functional.affine_grid, computed in float64."""
    size = [int(s) for s in np.asarray(size).reshape(-1)]
    theta64 = np.asarray(theta, dtype=np.float64)
    spatial = size[2:]
    axes = [_linspace(n, bool(align_corners), np.dtype(np.float64)) for n in spatial]
    # base[..., :] = (x, y, (z,) 1) with x varying along the last spatial axis
    mesh = np.meshgrid(*axes, indexing="ij")  # each (D?, H, W) in spatial order
    coords = [m for m in reversed(mesh)]  # x, y, (z)
    base = np.stack([*coords, np.ones_like(coords[0])], axis=-1)  # (..., k+1)
    grid = np.einsum("...j,ncj->n...c", base, theta64)
    return grid.astype(theta.dtype)


PATTERNS = [AffineGrid()]
