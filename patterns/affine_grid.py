"""AffineGrid (torch F.affine_grid semantics) as one small GEMM (2-D) or one broadcast
Mul/Add (3-D), size read at run time.

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

Before -> after (a, b, e, t: theta's columns for x, y, z and the translation)::

    AffineGrid(theta, size)  ->  x, y, (z) = coords(W), coords(H), (coords(D))
      2-D:                       R = Transpose([[0, b], [a, t]] @ (x_w, 1)^T)
                                 # (N, 2, W, 2): R_y, R_c
                                 grid = Reshape((y_h, 1) @ Reshape(R, (N, 2, W*2)),
                                                (N, H, W, 2))
                                 # a graph-output grid: Sub(that Reshape, 0)
      3-D (and 2-D, target ort): R_c = x * Expand(a) + Expand(t);  R_y, R_z = Expand(b, e)
                                 # columns Unsqueezed to full rank, every Expand to Shape(x)
      3-D:                       grid = z * R_z + (y * R_y + R_c)             # (N, D, H, W, 3)
      2-D float32, target ort:   grid = Conv1x1([R_y; R_c], weight=(y_h, 1))

``coords(n) = Cast(Range(1-n, n, 2)) / den`` (an integer Range) with ``den = n``
(align_corners=0) or ``max(n-1, 1)`` (align_corners=1). Everything before the GEMM (2-D)
or the last Mul and Add (3-D) is small (sizes, not grids).

Speed: the 2-D GEMM writes the grid once. ONNX Runtime copies a Reshape that produces a
graph output on one thread (it is free when a GridSample reads the grid), so a
graph-output grid ends in an elementwise Sub(view, 0), which it writes in parallel. The
figures against ONNX Runtime's and OpenVINO's AffineGrid-20, and the one-pass forms tried
and rejected (a broadcast Add, a MatMul batched over (N, H), a Transpose of an
(N, 2, H, W) GEMM, Einsum, Resize, R built by a K = 4 GEMM), are in docs/performance.md
(AffineGrid).

Portable (the default target): only constructs that ONNX Runtime, OpenVINO, TVM,
onnx2torch and onnx2tf run (docs/portability.md). The Reshape targets are Concats of Shape
outputs and constants, which TVM's importer folds into shapes; 0 (copy a dim) is avoided,
since onnx2tf reads it against its channels-last layout. Under ``--target ort`` the 2-D
float32 grid is written by a 1x1 Conv whose weight is computed at run time: one
output-sized pass, faster there (docs/performance.md). When ``size`` is not fed
at run time that weight is kept from being constant-folded (an empty slice of R is
concatenated to it), since a constant weight makes ONNX Runtime's NCHWc layout pass wrap
the Conv in reorders, which are slower. Neither construct is portable.

Envelope: opsets 11+, theta float16/32/64 (float16 is computed in float32 and rounded
once at the end), size int64 or int32, batch and every spatial size dynamic (exact up to
2**24 per spatial axis). 2-D vs 3-D is read from theta's
static shape or the size tensor's length; if neither is known the node is rejected.
The emitted graph has a fixed size whatever the tensor values are.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import FLOAT_TYPES, require_type
from decomposer.examples import FALSE, I64, TRUE, Example, F
from decomposer.forms import Attr, Const, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

_INT_TYPES = (TensorProto.INT64, TensorProto.INT32)


class Facts(NamedTuple):
    spatial_rank: int  # 2 or 3
    align_corners: bool
    theta_type: int  # ONNX element type of theta and of the grid
    size_is_fed: bool  # size is a model input, so nothing derived from it can be folded
    size_type: int  # int64 or int32
    grid_is_output: bool  # the grid is a main-graph output (see _matmul_form_2d)


class AffineGrid(Pattern):
    """Arguments: ``align_corners`` (bool)."""

    op_type = "AffineGrid"
    forms = (
        Form("AffineGrid", inputs=(In("theta"), In("size")), attributes={
            "align_corners": Attr("int", default=0, choices=(0, 1),
                                  doc="1: -1 and 1 are the centers of the corner pixels")}),
        Form(aten="affine_grid_generator", inputs=(In("theta"), In("size"),
                                                   Const("align_corners", "bool"))),
    )
    examples = (
        Example(
            (("theta", F, ("N", 2, 3)), ("size", I64, (4,))),
            ((F, 4),),
            attrs={"align_corners": 1},
            domains=(("custom.ops", 16), ("", 13), ("ai.onnx.contrib", 20)),
            aten=("theta", "size", TRUE),
            aten_opset=16,
        ),
        Example(
            (("theta", F, ("N", 3, 4)), ("size", I64, (5,))),
            ((F, 5),),
            domains=(("custom.ops", 11), ("", 19)),
            aten=("theta", "size", FALSE),
        ),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        theta, size = node.tensor("theta"), node.tensor("size")
        align = bool(node.args["align_corners"])

        theta_type = require_type(ctx, theta, "theta", FLOAT_TYPES)
        size_type = ctx.elem_type(size) or TensorProto.INT64
        if size_type not in _INT_TYPES:
            raise Reject(f"size must be int64 or int32, got "
                         f"{TensorProto.DataType.Name(size_type).lower()}")
        return Facts(_spatial_rank(theta, size, ctx), align, theta_type,
                     ctx.is_model_input(size), size_type, ctx.is_model_output(node.outputs[0]))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        k = facts.spatial_rank
        # ONNX Runtime has few float16 kernels: compute in float32, round once.
        compute_type = TensorProto.FLOAT if facts.theta_type == TensorProto.FLOAT16 \
            else facts.theta_type
        theta = b.input(node.tensor("theta"), facts.theta_type)
        if compute_type != facts.theta_type:
            theta = b.Cast(theta, compute_type, hint="theta_f32")
        size = b.input(node.tensor("size"), facts.size_type)  # [N, C, (D,) H, W]

        def coords(axis: int, label: str) -> Value:
            """Normalized coordinates along size[axis], shape (n,): (1-n, 3-n, ..., n-1)/den.
            The Range is integer: TensorRT takes run-time Range bounds only for integers,
            and the steps are exact in float up to 2**24."""
            n = b.Gather(size, axis, hint=f"{label}_n")
            steps = b.Cast(b.Range(1 - n, n, 2, hint=f"{label}_steps"), compute_type,
                           hint=f"{label}_steps_f")
            if facts.align_corners:  # Max on floats: integer Max needs opset 12
                # n as a (1,) tensor: TVM's importer reads a 0-d size gathered from a Shape
                # as a PrimValue, which its Max cannot take
                n_1 = b.Gather(size, [axis], hint=f"{label}_n_1")
                den = b.Max(b.Cast(n_1, compute_type, hint=f"{label}_n_f") - 1, 1,
                            hint=f"{label}_den")
            else:
                den = b.Cast(n, compute_type, hint=f"{label}_n_f")
            return b.Div(steps, den, hint=label)

        def spread(v: Value, axis: int, label: str) -> Value:
            """v (n,) Unsqueezed to the grid's rank k+2, its values along ``axis``."""
            return b.Unsqueeze(v, [a for a in range(k + 2) if a != axis], hint=label)

        def expanded_form(theta_t: Value, out: str | None) -> Value:
            """3-D, and 2-D under --target ort: theta's columns Expanded over W."""
            # theta's columns as (N, 1, (1,) 1, k) rows: coefficients of x, y, (z), translation.
            theta_rows = b.Unsqueeze(theta_t, list(range(2, k + 1)), hint="theta_T_rows")
            x_coef, y_coef, *rest = b.Split(theta_rows, [1] * (k + 1), axis=1,
                                            hint="theta_col")
            offset = rest[-1]
            # R_c[n, 0, (0,) w, c] = x_w * theta[n, c, 0] + theta[n, c, k]: the part of the
            # grid that varies along W; the y (and z) coefficients are spread to the same
            # shape so the final broadcast reads whole (W, k) rows, not k-element pieces.
            # Each column is Expanded over W before it meets x: onnx2tf's tf_converter
            # (2.6.9, shape_unmatched_special_avoidance_workaround) takes x (1, 1, W, 1) with
            # W unknown as possibly channels-last and transposes a static (N, 1, 1, k)
            # partner to (N, 1, k, 1), which LiteRT cannot broadcast ("XNNPack delegate
            # failed to reshape").
            x_b = spread(coords(k + 1, "x"), k, "x_b")
            r_c_shape = b.Shape(x_b, hint="R_shape")
            r_c = x_b * b.Expand(x_coef, r_c_shape, hint="R_x") + \
                b.Expand(offset, r_c_shape, hint="R_t")
            r_y = b.Expand(y_coef, r_c_shape, hint="R_y")
            y = coords(k, "y")
            if k == 2:
                rows = b.Concat(r_y, r_c, axis=1, hint="R")  # (N, 2, W, 2)
                return self._conv_form_2d(b, rows, y, out, keep_dynamic=not facts.size_is_fed)
            r_z = b.Expand(rest[0], r_c_shape, hint="R_z")
            z_term = spread(coords(2, "z"), 1, "z_b") * r_z  # (N, D, 1, W, 3)
            yc_term = b.Add(spread(y, 2, "y_b") * r_y, r_c, hint="grid_yc")  # (N, 1, H, W, 3)
            return b.Add(z_term, yc_term, hint="grid", out=out)

        final = node.outputs[0] if compute_type == facts.theta_type else None
        if k == 2 and not (b.target == "ort" and compute_type == TensorProto.FLOAT):
            grid = self._matmul_form_2d(b, theta, coords(3, "x"), coords(2, "y"), final,
                                        to_caller=final is not None and facts.grid_is_output)
        else:
            theta_t = b.Transpose(theta, [0, 2, 1], hint="theta_T")  # (N, k+1, k): a, b, (e,) t
            grid = expanded_form(theta_t, final)
        if final is None:
            b.Cast(grid, facts.theta_type, hint="grid", out=node.outputs[0])

    @staticmethod
    def _matmul_form_2d(b: Builder, theta: Value, x: Value, y: Value, out: str | None,
                        to_caller: bool) -> Value:
        """Portable 2-D: grid = Reshape(L @ R, (N, H, W, 2)), the one output-sized GEMM
        (K = 2) of L = (y_h, 1), (H, 2), with R viewed as (N, 2, W*2), where
        R[n] = [b; x * a + t] (N, 2, W, 2) comes from the small product
        coef @ (x_w, 1)^T, coef[n, c] = [[0, b_c], [a_c, t_c]] gathered from theta's rows.

        That small product is one GEMM, not N*2: its right operand is a plain matrix
        (2, W), so ONNX Runtime folds coef's leading axes into the rows; a Transpose of the
        (N, 2, 2, W) result then orders it (N, 2, W, 2). That is cheaper than
        (W, 2) @ (N, 2, 2, 2), N*2 tiny GEMMs.

        Both Reshape targets are Concats of Shape outputs and constants, with no 0: TVM's
        importer folds such a Concat into a shape (a target computed from the ``size``
        values is refused), and onnx2tf mis-reads a 0 against the channels-last layout it
        gives 3-D and 4-D tensors; no -1 either, so an empty batch (N = 0, which ONNX's
        AffineGrid-20 allows and torch refuses) gives an empty grid. Every configuration of
        scripts/portability.py runs it.

        ``to_caller``: the grid is a graph output. A runtime then hands the caller a buffer
        of its own, and ONNX Runtime fills it from a Reshape with one single-threaded copy;
        ``b.Reshape(..., to_caller=True)`` ends in ``Sub(view, 0)`` instead, which it writes
        in parallel (docs/performance.md, AffineGrid)."""
        with_zero = b.Pad(theta, [0, 0, 0, 0, 0, 1], 0, hint="theta0")  # (N, 2, 4): a, b, t, 0
        coef = b.Gather(with_zero, b.const(np.array([[3, 1], [0, 2]], np.int64), hint="R_cols"),
                        axis=2, hint="R_coef")  # (N, 2 (c), 2 (row of R), 2 (x, 1))
        x_basis = b.Pad(b.Unsqueeze(x, [0], hint="x_row"), [0, 0, 1, 0], 1,
                        hint="x_basis")  # (2, W): rows x_w and 1
        rows = b.Transpose(b.MatMul(coef, x_basis, hint="R_cw"), [0, 2, 3, 1],
                           hint="R")  # (N, 2, W, 2): R_y, R_c
        batch = b.Shape(theta, 0, 1, hint="N")
        # [W*2], read from the basis flattened to 1-D (a -1 in R's own target would be
        # left open by an empty batch; onnx2torch 1.5 turns Flatten(axis=0) into 1-D)
        row_length = b.Shape(b.Reshape(x_basis, [-1], hint="x_basis_flat"), hint="W2")
        flat_rows = b.Reshape(rows, b.Concat(batch, b.ints([2]), row_length, axis=0,
                                             hint="R_flat_shape"),
                              hint="R_flat")  # (N, 2, W*2)
        left = b.Pad(b.Unsqueeze(y, [1], hint="y_col"), [0, 0, 0, 1], 1, hint="L")  # (H, 2)
        grid_shape = b.Concat(batch, b.Shape(y, hint="H"), b.Shape(x, hint="W"), b.ints([2]),
                              axis=0, hint="grid_shape")  # [N, H, W, 2]
        return b.Reshape(b.MatMul(left, flat_rows, hint="LR"), grid_shape, hint="grid",
                         out=out, to_caller=to_caller)

    @staticmethod
    def _conv_form_2d(b: Builder, rows: Value, y: Value, out: str | None,
                      keep_dynamic: bool) -> Value:
        """ONNX Runtime only (target ort): grid = Conv1x1(R, weight=(y_h, 1)), the same
        K = 2 GEMM as L @ R, written straight into (N, H, W, 2) with no Reshape copy. Not
        portable: OpenVINO, onnx2torch and onnx2tf need constant-shaped or constant weights."""
        weight = b.Pad(b.Unsqueeze(y, [1, 2, 3], hint="y4"), [0, 0, 0, 0, 0, 1, 0, 0], 1,
                       hint="L_weight")  # (H, 2, 1, 1): (y_h, 1)
        if keep_dynamic:
            # Unless `size` is fed at run time it may be folded to a constant, and with it
            # this weight; a constant weight makes ONNX Runtime's NCHWc layout pass wrap the
            # Conv in reorders, measured 3x slower (2-D, N=8, 512x512). Concatenating an
            # empty slice of R (which depends on theta) keeps the values but not constness.
            nothing = b.Slice(rows, [0, 0, 0], [0, 1, 1], [0, 2, 3],
                              hint="R_none")  # (0, 2, 1, 1)
            weight = b.Concat(weight, nothing, axis=0, hint="L_weight_dynamic")
        return b.op("Conv", rows, weight, hint="grid", out=out, dtype=rows.dtype)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        theta_shape = ctx.shape(node.tensor("theta"))
        batch = theta_shape[0] if theta_shape else None
        k = facts.spatial_rank
        return [(facts.theta_type, [batch, *([None] * k), k])]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        theta, size = tensors["theta"], tensors["size"]
        assert theta is not None and size is not None
        return [affine_grid_reference(theta, size, int(args["align_corners"]))]


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
