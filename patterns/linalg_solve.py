"""Linear solve, batched (torch.linalg.solve / torch.linalg.solve_ex) as standard ops.

Matches:
- ``Solve(A, B; left:int=1)`` in any domain;
- torch's fallbacks ``org.pytorch.aten::linalg_solve(A, B, left)`` and
  ``ATen(operator="linalg_solve")`` (``left`` a constant bool input; the legacy exporter
  passes it for both ``left=True`` and ``left=False``), and ``linalg_solve_ex(A, B, left,
  check_errors)`` with its two outputs ``(result, info)``.

Semantics are torch's:
- ``left=1``: X with ``A @ X = B``. ``A`` is ``(*, n, n)``; ``B`` is a batch of vectors,
  ``(n,)`` or ``(*, n)`` (torch's rule: B has rank 1, or rank A.ndim - 1 and
  ``B.shape == A.shape[:-1]``), giving X of B's batched-vector shape, or a batch of
  matrices ``(*', n, k)`` whose batch dims broadcast with A's, giving ``(*'', n, k)``.
- ``left=0``: X with ``X @ A = B``, ``B`` is ``(*', k, n)``; vectors are rejected (torch
  rejects them too: it reads a vector as an (n, 1) column).
- ``info`` (int32, A's batch shape, linalg_solve_ex only) is LAPACK's: 0, or the 1-based
  index of the first exactly-zero pivot of A's LU factorization; ``check_errors`` is
  accepted and ignored (a graph cannot raise).

Before -> after::

    Solve(A, B)  ->  Ainv = inverse(A)        # linalg_inv's decomposition: closed form for
                                              # n <= 4 (info from its minors), Gauss-Jordan
                                              # with partial pivoting above
      B of A's batch dims, static n and k with n*n*k <= 256, on 2-D (entries, batch)
      tensors (batch dims flattened and moved last):
                     X = (1, n) ones @ (Gather(Ainv, terms) * Gather(B, terms))
                     # the n*n*k terms, j-major; B Ainv alike (left=0)
      otherwise:     X = Ainv @ B                                  # matrix B, left=1
                     X = Squeeze(Ainv @ Unsqueeze(B, -1), -1)       # vector B
                     X = B @ Ainv                                  # left=0

Singular A: inf/NaN in X (torch raises), and info names the zero pivot.

Envelope: opsets 11+; float32/float64, A and B of one dtype; A's matrix size static,
0 <= n <= 32; batch dims and B's column count k dynamic. Ranks of A and B must be known,
and so must enough of their dims to tell a vector B from a matrix B. Solving through the
inverse costs a little accuracy against LU's forward substitution (about cond(A) * eps,
the same order as LU's own error bound).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_shape, type_name
from decomposer.examples import FALSE, I32, TRUE, Example, F
from decomposer.forms import Attr, Const, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from .linalg_inv import (
    MatrixFacts,
    build_inverse,
    inverse_reference,
    lu_info_reference,
    matrix_facts,
)

# Below this many multiply-adds per matrix (n * n * k), X = A^-1 B is computed with the
# batch on the last axis by elementwise Mul and Add: ONNX Runtime's batched MatMul costs about
# 0.5 us per matrix whatever its size (n = 3, k = 1, B = 100000: 46 ms against 3 ms).
ELEMENTWISE_PRODUCT_MAX = 256


class SolveFacts(NamedTuple):
    matrix: MatrixFacts
    left: bool
    vector: bool  # B is a (batch of) vector(s)
    batch_last: bool  # A and B have the same batch dims and the product is small
    columns: int | None = None  # B's static k (left=1) or its rows (left=0); 1 for vectors


def _is_vector_rhs(a_shape: tuple, b_shape: tuple) -> bool:
    """torch's rule for B being vectors: rank 1, or rank A.ndim - 1 with B.shape ==
    A.shape[:-1]; raises Reject when unknown dims leave it undecided."""
    if len(b_shape) == 1:
        return True
    if len(b_shape) != len(a_shape) - 1:
        return False
    undecided = False
    for a_dim, b_dim in zip(a_shape[:-1], b_shape, strict=True):
        if isinstance(a_dim, int) and isinstance(b_dim, int):
            if a_dim != b_dim:
                return False
        elif a_dim is None or b_dim is None or a_dim != b_dim:
            undecided = True  # same symbolic name means equal; anything else is unknown
    if undecided:
        raise Reject(f"cannot tell whether B {list(b_shape)} is a batch of vectors or of "
                     f"matrices for A {list(a_shape)} (torch decides on B.shape == "
                     f"A.shape[:-1]); give A and B static or matching symbolic dims")
    return True


class _SolvePattern(Pattern[SolveFacts]):
    """Shared check/build/reference; ``with_info`` adds the info output."""

    with_info = False

    def check(self, node: MatchedNode, ctx: MatchContext) -> SolveFacts:
        left = bool(node.args["left"])
        a, b = node.tensor("A"), node.tensor("B")
        matrix = matrix_facts(a, ctx)
        b_type = ctx.elem_type(b)
        if b_type != matrix.elem_type:
            raise Reject(f"B must have A's dtype ({type_name(matrix.elem_type)}), got "
                         f"{type_name(b_type)}")
        b_shape = require_shape(ctx, b, "B", "it decides between vector and matrix "
                                "right-hand sides", min_rank=1)
        vector = _is_vector_rhs(matrix.shape, tuple(b_shape))
        if vector and not left:
            raise Reject("left=False needs a matrix B (*, k, n); torch rejects vectors there")
        n = matrix.n
        rows = b_shape[-1] if vector or not left else b_shape[-2]
        if isinstance(rows, int) and rows != n:
            raise Reject(f"B's size {rows} does not match A's {n}x{n}")
        columns = 1 if vector else b_shape[-1] if left else b_shape[-2]
        batch_rank = len(b_shape) - (1 if vector else 2)
        same_batch = batch_rank == matrix.rank - 2 and all(
            isinstance(x, (int, str)) and x == y
            for x, y in zip(matrix.shape[:-2], b_shape[:batch_rank], strict=True))
        # B's matrix dims must be static too: an engine that tracks symbolic dims (TVM)
        # cannot broadcast a symbolic n against the inverse's static one.
        batch_last = (same_batch and n > 0 and isinstance(rows, int)
                      and isinstance(columns, int)
                      and n * n * columns <= ELEMENTWISE_PRODUCT_MAX)
        return SolveFacts(matrix, left, vector, batch_last,
                          columns if isinstance(columns, int) else None)

    def build(self, b: Builder, node: MatchedNode, facts: SolveFacts) -> None:
        outputs = node.outputs
        info_out = outputs[1] if self.with_info and len(outputs) > 1 and outputs[1] else None
        inverse = build_inverse(b, node.tensor("A"), facts.matrix, info_out=info_out,
                                batch_last=facts.batch_last)
        rhs = b.input(node.tensor("B"), facts.matrix.dtype)
        out = outputs[0] or None
        if facts.batch_last:
            _product_batch_last(b, inverse, rhs, facts, out)
        elif facts.vector:
            column = b.MatMul(inverse, b.Unsqueeze(rhs, [-1], hint="B_column"), hint="X_column")
            b.Squeeze(column, [-1], hint="X", out=out)
        elif facts.left:
            b.MatMul(inverse, rhs, hint="X", out=out)
        else:
            b.MatMul(rhs, inverse, hint="X", out=out)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: SolveFacts
                     ) -> list[OutputType]:
        types: list[OutputType] = [(facts.matrix.elem_type, None)]
        if self.with_info:
            types.append((TensorProto.INT32, facts.matrix.shape[:-2]))
        return types

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        a, rhs = np.asarray(tensors["A"]), np.asarray(tensors["B"])
        left = bool(args["left"])
        result = [solve_reference(a, rhs, left)]
        if self.with_info:
            result.append(lu_info_reference(a))
        return result


def _product_batch_last(b: Builder, inverse: Value, rhs: Value, facts: SolveFacts,
                        out: str | None) -> Value:
    """X = A^-1 B (or B A^-1) with A^-1 as (n*n, Bt) and B of A's batch dims (Bt of them
    flattened): B's entries become rows of Bt values too (``b.Transpose2D``), every term of the
    product is a row of a Gather from each factor (no broadcast, no Concat), the terms of
    each entry are summed by a (1, n) MatMul, and X's rows are swapped back into B's
    shape.

    Every tensor is 2-D (or a (1, 1, R, C) view for the swaps): the earlier batch-last
    (n, n, k, Bt) Mul + ReduceSum with (*, n, k) <-> (n, k, *) Transposes came out wrong
    from onnx2tf's tf_converter whenever two of those sizes were equal (it matches a
    Transpose's dims by size, and takes a tensor whose dims after the first are equal
    for channels-first; a form that multiplied a single row into a block of rows of the
    other factor and concatenated the blocks had its Concat axis moved at k = B = n).
    ONNX Runtime sums over an outer axis (ReduceSum) slower than this MatMul."""
    n, k = facts.matrix.n, facts.columns
    assert k is not None
    size = n * k  # X's entries (and B's)
    dtype = facts.matrix.dtype
    rhs_t = b.Transpose2D(rhs, None, size, hint="B_t")  # (n * k, Bt)
    x_t = _blocks_product(b, inverse, rhs_t, n, k, facts.left, dtype)
    return b.Transpose2D(x_t, size, None, hint="X", shape=b.Shape(rhs, hint="B_shape"),
                   batch_dims=facts.matrix.shape[:-2], out=out)


def _blocks_product(b: Builder, inverse: Value, rhs_t: Value, n: int, k: int, left: bool,
                    dtype: np.dtype) -> Value:
    """All n * n * k terms at once: one row of a Gather from each factor, summed over j
    by a (1, n) MatMul."""
    size = n * k
    if left:  # X[i, c] = sum_j inv[i, j] * rhs[j, c], rhs (n, k), a vector (n, 1)
        first = [[i * n + j for i in range(n) for c in range(k)] for j in range(n)]
        second = [[j * k + c for i in range(n) for c in range(k)] for j in range(n)]
    else:  # X[r, i] = sum_j rhs[r, j] * inv[j, i], rhs (k, n)
        first = [[j * n + i for r in range(k) for i in range(n)] for j in range(n)]
        second = [[r * n + j for r in range(k) for i in range(n)] for j in range(n)]
    products = b.Mul(b.Gather(inverse, np.asarray(first, np.int64).reshape(-1), axis=0,
                              hint="inverse_terms"),
                     b.Gather(rhs_t, np.asarray(second, np.int64).reshape(-1), axis=0,
                              hint="B_terms"), hint="terms")  # (n * size, Bt), j-major
    summed = b.MatMul(np.ones((1, n), dtype), b.Reshape(products, [n, -1], hint="terms_2d"),
                      hint="X_t_flat")  # (1, size * Bt)
    return b.Reshape(summed, [size, -1], hint="X_t")


def solve_reference(a: np.ndarray, rhs: np.ndarray, left: bool = True) -> np.ndarray:
    """torch.linalg.solve in numpy (LAPACK gesv in float64, rounded to A's dtype); a
    singular A gives NaN where torch raises."""
    n = a.shape[-1]
    vector = rhs.ndim == 1 or (rhs.ndim == a.ndim - 1 and rhs.shape == a.shape[:-1])
    system, column = (a, rhs) if left else (np.swapaxes(a, -1, -2), np.swapaxes(rhs, -1, -2))
    if vector:
        column = column[..., None]
    batch = np.broadcast_shapes(system.shape[:-2], column.shape[:-2])
    system = np.broadcast_to(system.astype(np.float64), (*batch, n, n))
    column = np.broadcast_to(column.astype(np.float64), (*batch, *column.shape[-2:]))
    try:
        x = np.linalg.solve(system, column)
    except np.linalg.LinAlgError:  # some matrix is singular: NaN for that one
        x = inverse_reference(system) @ column
    if vector:
        x = x[..., 0]
    elif not left:
        x = np.swapaxes(x, -1, -2)
    return x.astype(a.dtype)


_LEFT = Const("left", "bool", default=True, why="it picks the side A multiplies")


class Solve(_SolvePattern):
    """``Solve(A, B; left)`` in any domain; torch's ``linalg_solve(A, B, left)``."""

    op_type = "Solve"
    forms = (Form("Solve", inputs=(In("A"), In("B")), attributes={
                 "left": Attr("int", default=1, choices=(0, 1),
                              doc="1: solve A X = B; 0: solve X A = B")}),
             Form(aten="linalg_solve", inputs=(In("A"), In("B"), _LEFT)))
    examples = (
        Example(
            (("A", F, ("B", 3, 3)), ("Bm", F, ("B", 3, "K"))),
            ((F, 3),),
            attrs={"left": 1},
            aten=("A", "Bm", TRUE),
        ),
        Example(
            (("A", F, ("B", 2, 2)), ("Bm", F, ("B", "K", 2))),
            ((F, 3),),
            attrs={"left": 0},
            domains=(("custom.ops", 11),),
            aten=("A", "Bm", FALSE),
        ),
    )


class LinalgSolveEx(_SolvePattern):
    """``torch.linalg.solve_ex(A, B, left, check_errors) -> (result, info)``; ATen only
    (either output may be unused; check_errors is ignored)."""

    op_type = "linalg_solve_ex"
    forms = (Form(aten="linalg_solve_ex", outputs=(1, 2), inputs=(
        In("A"), In("B"), _LEFT, In("check_errors", optional=True))),)
    with_info = True
    examples = (
        Example(
            (("A", F, ("B", 4, 4)), ("Bm", F, ("B", 4))),
            ((F, 2), (I32, 1)),
            aten=("A", "Bm", TRUE, FALSE),
        ),
    )


PATTERNS = [Solve(), LinalgSolveEx()]
