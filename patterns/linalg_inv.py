"""Matrix inverse, batched (torch.linalg.inv / torch.inverse / torch.linalg.inv_ex) as standard ops.

Matches:
- ``Inverse(A)`` in any domain (``custom.ops``, ``com.microsoft``'s contrib op, ...);
- torch's fallbacks ``org.pytorch.aten::linalg_inv(A)`` / ``ATen(operator="linalg_inv")``
  (what the legacy exporter emits for both ``torch.linalg.inv`` and ``torch.inverse``),
  ``inverse(A)`` (TorchScript spelling), and ``linalg_inv_ex(A, check_errors)`` with its two
  outputs ``(inverse, info)``.

Semantics: ``A`` is ``(*, n, n)``, float32 or float64, any number of batch dims (dynamic,
empty included); the output is ``A^-1`` with the same shape and dtype. ``info`` (int32,
shape ``*``) is LAPACK's: 0 when every pivot of the LU factorization with partial pivoting
is nonzero, else the 1-based index of the first exactly-zero pivot; in exact arithmetic
that is the smallest k whose first k columns are linearly dependent. ``check_errors`` is
accepted and ignored: a graph cannot raise.

Before -> after::

    n <= 4, linalg_inv / inverse / Inverse (closed form, adjugate / determinant):
      F = Transpose(Reshape(A, (B, n*n)))       # (n*n, B): every Gather copies batch rows
      m = mean |F|; c = 1 if Clip(m, lo, hi) == m else 1 / m; F = c F   # no overflow
      n = 2, 3, on single rows f_i = Gather(F, [i]), each (1, B):
        adj = [f3, -f1, -f2, f0]; det = f0 f3 - f1 f2                           (n = 2)
        adj_e = f_i f_j - f_k f_l (the cyclic cofactors); det = f0 adj0 + f1 adj3 + f2 adj6
      n = 4, on blocks of rows:
        adj = signs @ (Gather(F, i) * Gather(F, j))       # 2x2 minors
        adj = signs @ (Gather(F, i') * Gather(adj, j'))   # the 3x3 cofactors
        det = ones @ (F[0, :] * adj[:, 0])                # along the first row
      inv = Reshape(Transpose(Concat(adj) * c / det), shape(A))
      linalg_inv_ex's info, from values the closed form has or gathers: flag_k = "every
      k x k minor of columns 0..k-1 is zero" (column 0, the 2x2 minors of columns 0-1,
      the cofactors C[i, n-1], det); info = the first k whose flag is set, else 0
    5 <= n <= 32 (Gauss-Jordan, partial pivoting, unrolled):
      M = [A | I]; for each column k: pivot row p = argmax |M[:, k]| over rows not yet used;
      r = M[p, :] / M[p, k]; M = M - where(row is p, 0, M[:, k]) * r   (drop column k)
      inv = (rows p_0, p_1, ... of M) / (their pivots); info from the pivots
      portable: M is 2-D, (n * w, B), and the outer product is two Gathers (every engine
      and converter); --target ort: M is (n, w, *), the product a broadcast (faster there)

Singular input: torch.linalg.inv raises, a graph cannot. Here the result holds inf/NaN
(adjugate / 0 in the closed form, division by the zero pivot in the elimination), and
linalg_inv_ex's info says which pivot was zero, as torch's does; no crash, no hang.
Both are computed in floating point, so for a matrix that is singular only up to rounding
neither the graph nor LAPACK is exact: at n <= 4 the minors are exact for small-integer
entries, where info is the exact first dependent column (LAPACK's own rounding leaves
about 3% of exactly singular integer 4x4 matrices a tiny nonzero pivot: info 0 and a
~1e7 inverse from torch, info 4 and inf here); above, the elimination rounds as LU does.

Envelope: opsets 11+; float32/float64 (float16/bfloat16 are rejected, as torch rejects
them); n must be static, 0 <= n <= 32 (the elimination is unrolled, about 15 nodes per
column: ~500 nodes at n = 32); the batch dims may be dynamic (the rank must be known). The
closed forms are not pivoted; a matrix whose mean |entry| is outside [2^-20, 2^20]
(float32; float64: 2^+-200) is scaled to a mean of 1 first, so no product overflows, and
they are as accurate as LU for well-conditioned matrices, but a float32 matrix with several
entries below ~1e-9 of its largest loses accuracy to underflow (the elimination does not).
Outputs are reshaped to A's own shape (never through a -1), so shape-tracking engines
(TVM) can follow the dims.
"""

from __future__ import annotations

import itertools
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_shape, require_type
from decomposer.examples import FALSE, I32, D, Example, F
from decomposer.forms import Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

CLOSED_FORM_MAX_N = 4
MAX_N = 32  # the elimination is unrolled: about 15 nodes per column
_FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.DOUBLE)
# mean |A| bounds within which no product of up to 4 entries of A over- or underflows
# (float32: at most (16 * 2^20)^4 = 7e28, typically (2^-20)^4 = 1e-24 or more).
_SAFE_ABS_MEAN = {np.float32: (2.0**-20, 2.0**20), np.float64: (2.0**-200, 2.0**200)}


class MatrixFacts(NamedTuple):
    n: int  # the static matrix size
    shape: tuple[int | str | None, ...]  # A's static shape (rank known)
    elem_type: int  # FLOAT or DOUBLE

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> np.dtype:
        return numpy_dtype(self.elem_type)


def matrix_facts(a: str, ctx: MatchContext, label: str = "A") -> MatrixFacts:
    """Validate a square float matrix input of static size; raises Reject with a reason."""
    elem_type = require_type(ctx, a, label, _FLOAT_TYPES)  # torch's linalg takes these
    shape = require_shape(ctx, a, label, "the matrix size must be static", min_rank=2)
    rows, cols = shape[-2], shape[-1]
    if isinstance(rows, int) and isinstance(cols, int) and rows != cols:
        raise Reject(f"{label} must be square, got {rows}x{cols}")
    n = rows if isinstance(rows, int) else cols
    if not isinstance(n, int):
        raise Reject(f"the matrix size of {label} is not static (shape {list(shape)}); the "
                     f"decomposition is unrolled over it")
    if n > MAX_N:
        raise Reject(f"matrix size {n} is above the supported {MAX_N} (the elimination is "
                     f"unrolled, about 15 nodes per column)")
    return MatrixFacts(n, tuple(shape), elem_type)


# -- closed forms ---------------------------------------------------------------------------


class ProductStage(NamedTuple):
    """One stage of a closed-form adjugate: ``out[o] = entry_signs[o] * sum_t term_signs[t]
    * x[first[t, o]] * y[second[t, o]]``, where x holds A's entries and y holds A's entries
    (first stage) or the previous stage's outputs. Every output has the same term signs,
    so the signed sum over t is one (1, T) @ (T, outputs * B) product."""

    first: np.ndarray  # (T, outputs) int64
    second: np.ndarray  # (T, outputs) int64
    term_signs: np.ndarray  # (T,)
    entry_signs: np.ndarray | None  # (outputs,), None when all +1


def _stage(terms_per_output: list[list[tuple[int, int, int]]]) -> ProductStage:
    """A stage from (sign, index into x, index into y) terms, T per output, ordered so
    that the signs of every output are ``entry_sign * term_signs``."""
    entry_signs = np.asarray([terms[0][0] for terms in terms_per_output])
    term_signs = np.asarray([sign for sign, _, _ in terms_per_output[0]]) * entry_signs[0]
    for terms, entry_sign in zip(terms_per_output, entry_signs, strict=True):
        assert [sign * entry_sign for sign, _, _ in terms] == list(term_signs)
    first = np.asarray([[a for _, a, _ in terms] for terms in terms_per_output], np.int64)
    second = np.asarray([[c for _, _, c in terms] for terms in terms_per_output], np.int64)
    return ProductStage(first.T, second.T, term_signs,
                        None if np.all(entry_signs == 1) else entry_signs)


def _minor2(n: int, rows: tuple[int, int], cols: tuple[int, int]
            ) -> list[tuple[int, int, int]]:
    """det of A[rows][:, cols] as (sign, flat index, flat index) terms."""
    (r0, r1), (c0, c1) = rows, cols
    return [(1, r0 * n + c0, r1 * n + c1), (-1, r0 * n + c1, r1 * n + c0)]


def cofactor_stages(n: int) -> list[ProductStage]:
    """The adjugate of an n x n matrix (n = 3, 4), flat: adj[j, i] at j * n + i.

    n = 3: one stage, the cyclic cofactor formula C[i, j] = A[i+1, j+1] A[i+2, j+2] -
    A[i+1, j+2] A[i+2, j+1] (indices mod 3), whose signs need no correction.
    n = 4: the twelve 2x2 minors of rows (0, 1) and of rows (2, 3), then every 3x3 cofactor
    expanded along its row that is alone in its pair: three terms, A entry * minor."""
    if n == 3:
        entries = []
        for entry in range(9):  # adj[j, i] holds cofactor C[i, j]
            j, i = divmod(entry, 3)
            i1, i2, j1, j2 = (i + 1) % 3, (i + 2) % 3, (j + 1) % 3, (j + 2) % 3
            entries.append([(1, i1 * 3 + j1, i2 * 3 + j2), (-1, i1 * 3 + j2, i2 * 3 + j1)])
        return [_stage(entries)]
    if n != 4:
        raise ValueError(f"no cofactor stages for n = {n}")
    pairs: list[tuple[int, int]] = [(a, c) for a, c in itertools.combinations(range(4), 2)]
    row_pairs = [(0, 1), (2, 3)]
    minor_id = {(rp, cp): index for index, (rp, cp) in
                enumerate(itertools.product(row_pairs, pairs))}
    minors = [_minor2(4, rp, cp) for rp, cp in itertools.product(row_pairs, pairs)]
    entries = []
    for entry in range(16):
        j, i = divmod(entry, 4)
        alone, partner = (1 - i, (2, 3)) if i < 2 else (5 - i, (0, 1))
        cols = [c for c in range(4) if c != j]
        terms = []
        for position, c in enumerate(cols):
            sign = (-1) ** (i + j + position)  # the alone row sits at an even position
            first, second = (x for x in cols if x != c)
            terms.append((sign, alone * 4 + c, minor_id[(partner, (first, second))]))
        entries.append(terms)
    return [_stage(minors), _stage(entries)]


def _batch_last(b: Builder, a: Value, facts: MatrixFacts, flat: bool) -> Value:
    """(*, n, n) -> (n*n, *) if ``flat`` else (n, n, *).

    With the batch on the last axes every Gather/Split below copies contiguous runs of
    batch values and every reduction runs over an outer axis; batch-first, ONNX Runtime
    copies single elements and multiplies the tiny matrices one call each, an order of
    magnitude slower at large batches. The batch dims are moved, never flattened with -1, so
    engines that track symbolic dims (TVM) keep seeing them as A's own."""
    n, m = facts.n, facts.rank - 2
    if flat:
        rows = b.Reshape(a, [0] * m + [n * n], hint="A_rows")
        return b.Transpose(rows, [m, *range(m)], hint="A_t")
    return b.Transpose(a, [m, m + 1, *range(m)], hint="A_t")


def _batch_first(b: Builder, x: Value, facts: MatrixFacts, out: str | None) -> Value:
    """(n, n, *) -> (*, n, n)."""
    m = facts.rank - 2
    return b.Transpose(x, [*range(2, m + 2), 0, 1], hint="inverse", out=out)


def _build_closed_form(b: Builder, a: Value, facts: MatrixFacts, out: str | None,
                       info_out: str | None, batch_last: bool) -> Value:
    """inv = adj(A) / det(A) for n <= 4, on A's entries laid out (n*n, B).

    With the batch on the last axis every row of entries is a contiguous run of B values.
    n = 2, 3 take the rows one by one (a Gather each; ONNX Runtime fuses them into one
    Split) and form every cofactor, det and the result with elementwise ops on single rows,
    which stay in cache: faster than the block form below at n = 3. At n = 4 single rows
    take ~160 nodes, slow at small batches, so n = 4 gathers blocks of rows and sums each
    stage's terms with one (1, T) @ (T, ...) MatMul: ONNX Runtime reduces over an outer axis
    much slower than that, and batch-first it would copy single elements. Every tensor is
    2-D: onnx2tf's tf_converter mislays a 3-D (T, outputs, B) product (a broadcast error)
    and a 3-D output Transpose (wrong layout).

    det is a product of n entries, which over- or underflows long before the inverse does
    (float32 entries of 1e10 give det = 1e40 for n = 4), so a matrix whose mean |entry| is
    outside ``_SAFE_ABS_MEAN`` is scaled to a mean of 1 first. (Computing float32 in float64
    instead, or scaling by an exact power of two with Log/Floor/Pow, is slower. A
    continuous c = Clip(mean, low, high) / mean is cheaper
    than the Where but leaves such a matrix at a mean of ``low`` or ``high``, where
    adj * (c / det) under- or overflows: inf or 100% errors at float32 entries of 1e+-30
    for n = 3, 4.)"""
    n, dtype = facts.n, facts.dtype
    if n == 1:
        if info_out:
            _info_from_flags(b, [b.Equal(a, 0.0, hint="zero_matrix")], a, facts, info_out)
        inverse = b.Reciprocal(a, hint="inverse", out=None if batch_last else out)
        return b.Reshape(inverse, [1, -1], hint="inverse_t") if batch_last else inverse
    entries = b.Transpose2D(a, None, n * n, hint="A_t")  # (n*n, B)
    mean = b.MatMul(np.full((1, n * n), 1 / (n * n), dtype), b.Abs(entries, hint="A_abs"),
                    hint="A_abs_mean")  # (1, B): mean |A|
    # c is exactly 1 while mean |A| is within the bounds, so the common case is not rounded
    # at all (an exactly singular matrix keeps det = 0); outside them c A has mean |entry|
    # 1, where no product of n entries (nor c / det below) over- or underflows.
    # (Clip(mean) == mean and Where(ordinary, 1, 1 / mean): 0.17 ms on ONNX Runtime at a
    # batch of 100000, against 0.27 for Or(Less, Greater) and Where(extreme, 1 / mean, 1).
    # A NaN, 0 or inf mean is not ordinary; c = 1 / mean then makes the result NaN.)
    low, high = (np.asarray(bound, dtype) for bound in _SAFE_ABS_MEAN[facts.dtype.type])
    ordinary = b.Equal(b.Clip(mean, low, high, hint="A_mean_clipped"), mean,
                       hint="A_ordinary")
    shrink = b.Where(ordinary, 1.0, b.Reciprocal(mean, hint="A_mean_inv"),
                     hint="A_shrink")  # (1, B): c
    scaled = b.Mul(entries, shrink, hint="A_scaled")  # F = c A
    # With F = c A: inv(A) = adj(F) * c / det(F), as (n*n, B)
    if n <= 3:
        inverse, flags = _closed_form_rows(b, scaled, shrink, n, bool(info_out))
    else:
        inverse, flags = _closed_form_blocks(b, scaled, shrink, n, dtype, bool(info_out))
    if info_out:
        # F keeps A's zeros (c is finite and nonzero), except for A = 0, whose mean makes c
        # inf and F NaN: column 0 is zero there too.
        flags[0] = b.Or(flags[0], b.Equal(mean, 0.0, hint="A_zero"), hint="dependent1_any")
        _info_from_flags(b, flags, a, facts, info_out)
    if batch_last:  # (n*n, B)
        return inverse
    # A 2-D swap and a Reshape: a 3-D Transpose from (n, n, *) straight into the output
    # would save ONNX Runtime the Reshape's copy (5-10%), but onnx2tf's tf_converter
    # mislays it.
    return b.Transpose2D(inverse, n * n, None, hint="inverse", shape=b.Shape(a),
                   batch_dims=facts.shape[:-2], out=out)


def _closed_form_rows(b: Builder, scaled: Value, shrink: Value, n: int, with_info: bool
                      ) -> tuple[Value, list[Value]]:
    """n = 2, 3 on single rows: F = c A as (n*n, B) -> inv(A) as (n*n, B), and with
    ``with_info`` the dependence flags of ``_info_from_flags`` (else [])."""
    # Gathers, not one Split: onnx2tf's tf_converter lowers a Split to SplitV, which LiteRT
    # runs only with the Flex delegate. (And ONNX Runtime's transpose optimizer, given a
    # Split, moves the output Transpose up through these ops and turns the Split batch-first
    # with a Transpose per row: 2.5x slower at n = 2.)
    f = [b.Gather(scaled, [i], axis=0, hint=f"F{i}") for i in range(n * n)]  # (1, B) each
    if n == 2:  # adj = [[d, -b], [-c, a]], det = ad - bc
        det = b.Sub(b.Mul(f[0], f[3], hint="ad"), b.Mul(f[1], f[2], hint="bc"), hint="det")
        factor = b.Div(shrink, det, hint="det_inv")  # c / det(F)
        negated = b.Neg(factor, hint="det_inv_neg")
        inverse = b.Concat(b.Mul(f[3], factor, hint="inverse_00"),
                           b.Mul(f[1], negated, hint="inverse_01"),
                           b.Mul(f[2], negated, hint="inverse_10"),
                           b.Mul(f[0], factor, hint="inverse_11"), axis=0, hint="inverse_t")
        # column 0 is zero; det is zero
        return inverse, _all_zero_flags(b, [[f[0], f[2]], [det]]) if with_info else []
    # n = 3: the cyclic cofactors, C[i, j] = F[i+1, j+1] F[i+2, j+2] - F[i+1, j+2] F[i+2, j+1]
    (stage,) = cofactor_stages(3)  # first/second: (2 terms, 9 entries); term signs (+1, -1)
    adj = [b.Sub(b.Mul(f[stage.first[0, e]], f[stage.second[0, e]], hint=f"adj{e}_plus"),
                 b.Mul(f[stage.first[1, e]], f[stage.second[1, e]], hint=f"adj{e}_minus"),
                 hint=f"adj{e}") for e in range(9)]
    # det = sum_j F[0, j] * adj[j, 0], along the first row
    det = b.Add(b.Add(b.Mul(f[0], adj[0], hint="det0"), b.Mul(f[1], adj[3], hint="det1"),
                      hint="det01"), b.Mul(f[2], adj[6], hint="det2"), hint="det")
    inverse = b.Mul(b.Concat(*adj, axis=0, hint="adj"), b.Div(shrink, det, hint="det_inv"),
                    hint="inverse_t")
    # column 0; the 2x2 minors of columns (0, 1) are the cofactors C[i, 2] (adj[2, i]); det
    return inverse, (_all_zero_flags(b, [[f[0], f[3], f[6]], adj[6:9], [det]]) if with_info
                     else [])


def _closed_form_blocks(b: Builder, scaled: Value, shrink: Value, n: int,
                        dtype: np.dtype, with_info: bool) -> tuple[Value, list[Value]]:
    """n = 4 on blocks of rows: F = c A as (n*n, B) -> inv(A) as (n*n, B), and with
    ``with_info`` the dependence flags of ``_info_from_flags`` (else [])."""
    batch = b.Shape(scaled, 1, 2, hint="batch")  # [B]
    adj = scaled
    for index, stage in enumerate(cofactor_stages(n)):
        terms, outputs = stage.first.shape
        products = b.Mul(b.Gather(scaled, stage.first.reshape(-1), axis=0, hint=f"x{index}"),
                         b.Gather(adj, stage.second.reshape(-1), axis=0, hint=f"y{index}"),
                         hint=f"products{index}")  # (T * outputs, B)
        flat = b.Reshape(products, [terms, -1], hint=f"products{index}_2d")
        summed = b.MatMul(stage.term_signs.reshape(1, terms).astype(dtype), flat,
                          hint=f"terms{index}_sum")  # (1, outputs * B)
        adj = b.Reshape(summed, b.Concat(np.asarray([outputs], np.int64), batch, axis=0,
                                         hint=f"stage{index}_shape"),
                        hint=f"stage{index}")  # (outputs, B)
        if stage.entry_signs is not None:
            adj = b.Mul(adj, stage.entry_signs.reshape(-1, 1).astype(dtype),
                        hint=f"stage{index}_signed")
    # det = sum_j F[0, j] * adj[j, 0], along the first row
    first_row = b.Gather(scaled, list(range(n)), axis=0, hint="F_row0")  # (n, B)
    first_col = b.Gather(adj, [j * n for j in range(n)], axis=0, hint="adj_col0")
    det = b.MatMul(np.ones((1, n), dtype), first_row * first_col, hint="det")  # (1, B)
    inverse = b.Mul(adj, b.Div(shrink, det, hint="det_inv"), hint="inverse_t")
    if not with_info:
        return inverse, []
    # Column 0, the six 2x2 minors of columns (0, 1), the four 3x3 minors of columns
    # (0, 1, 2) (the cofactors C[i, 3], adj[3, i]) and det, each (k, B): a block is all
    # zero when the sum of its |entries| is (a sum of finite non-negative numbers is 0 only
    # if each is; a NaN or inf keeps it nonzero). The sums are MatMuls with ones, since ONNX
    # Runtime reduces over an outer axis 5-10x slower.
    row_pairs = list(itertools.combinations(range(n), 2))
    minors01 = b.Sub(
        b.Gather(scaled, [r * n for r, _ in row_pairs], axis=0, hint="col0_top") *
        b.Gather(scaled, [s * n + 1 for _, s in row_pairs], axis=0, hint="col1_bottom"),
        b.Gather(scaled, [r * n + 1 for r, _ in row_pairs], axis=0, hint="col1_top") *
        b.Gather(scaled, [s * n for _, s in row_pairs], axis=0, hint="col0_bottom"),
        hint="minors01")  # (6, B)
    blocks = [b.Gather(scaled, [i * n for i in range(n)], axis=0, hint="col0"), minors01,
              b.Gather(adj, [3 * n + i for i in range(n)], axis=0, hint="minors012")]
    flags = [b.Equal(b.MatMul(np.ones((1, block_rows), dtype), b.Abs(block, hint=f"flag{k}_abs"),
                              hint=f"flag{k}_sum"), 0.0, hint=f"dependent{k + 1}")
             for k, (block, block_rows) in enumerate(zip(blocks, (n, len(row_pairs), n),
                                                         strict=True))]
    return inverse, [*flags, b.Equal(det, 0.0, hint=f"dependent{n}")]


def _all_zero_flags(b: Builder, groups: list[list[Value]]) -> list[Value]:
    """For each group of (1, B) rows, a (1, B) bool: every row is zero there."""
    flags = []
    for k, rows in enumerate(groups):
        flag = b.Equal(rows[0], 0.0, hint=f"dependent{k + 1}")
        for index, row in enumerate(rows[1:], 1):
            flag = b.And(flag, b.Equal(row, 0.0, hint=f"dependent{k + 1}_{index}"),
                         hint=f"dependent{k + 1}")
        flags.append(flag)
    return flags


def _info_from_flags(b: Builder, flags: list[Value], a: Value, facts: MatrixFacts,
                     out: str) -> Value:
    """LAPACK's info from dependence flags, (1, B) bools: ``flags[k-1]`` says the first k
    columns of A are linearly dependent (every k x k minor of them is zero). In exact
    arithmetic the LU with partial pivoting meets its first zero pivot at the first such
    k, so info = the first k whose flag is set, else 0.

    Computed as v = n * y_n, then v = v + y_k (k - v) for k = n-1 .. 1 (y_k the flag as
    int32): integer arithmetic, not Where with a constant branch, which LiteRT's SELECT
    (onnx2tf) refuses; and the first flag wins even where NaN breaks the flags' nesting."""
    n = facts.n
    flag_ints = [b.Cast(flag, TensorProto.INT32, hint=f"dependent{k + 1}_i")
                 for k, flag in enumerate(flags)]
    info = flag_ints[-1] if n == 1 else b.Mul(flag_ints[-1], np.int32(n), hint=f"info{n}")
    for k in range(n - 1, 0, -1):
        step = b.Mul(flag_ints[k - 1], b.Sub(np.int32(k), info, hint=f"info{k}_gap"),
                     hint=f"info{k}_step")
        info = b.Add(info, step, hint=f"info{k}")
    return _info_to_batch(b, info, a, facts, out)


def _info_to_batch(b: Builder, info: Value, a: Value, facts: MatrixFacts, out: str) -> Value:
    """A (1, B) info, B being A's batch dims flattened, reshaped to A's batch shape."""
    flat = b.Reshape(info, [-1], hint="info_flat")  # (B,): a Reshape of (1, B) would copy 1
    return b.ReshapeBatchFirst(flat, b.Shape(a, 0, facts.rank - 2), facts.shape[:-2],
                               hint="info", out=out)


# -- Gauss-Jordan elimination ---------------------------------------------------------------


def _choose_pivot(b: Builder, column: Value, unused: Value | None, row_ids: np.ndarray,
                  k: int, n: int, dtype: np.dtype) -> tuple[Value, Value, Value | None]:
    """Column k's pivot row: the first largest |value| among the rows not used yet (LAPACK's
    choice). Returns (chosen row, one-hot of it over the rows, the rows still unused after
    this step: None before the first step and after the last)."""
    if k == n - 1 and unused is not None:  # one row is left
        chosen = b.ArgMax(b.Cast(unused, dtype, hint="last_row_f"), axis=0,
                          hint=f"pivot_row{k}")
    else:
        score = b.Abs(column, hint=f"abs{k}")
        if unused is not None:
            score = b.Where(unused, score, -1.0, hint=f"score{k}")
        chosen = b.ArgMax(score, axis=0, hint=f"pivot_row{k}")
    hot = b.Equal(row_ids, chosen, hint=f"hot{k}")
    if k < n - 1:
        unused = b.Not(hot, hint=f"unused{k}") if unused is None else \
            b.Xor(unused, hot, hint=f"unused{k}")
    return chosen, hot, unused


def _build_gauss_jordan(b: Builder, a: Value, facts: MatrixFacts, out: str | None,
                        info_out: str | None, batch_last: bool) -> Value:
    """Unrolled Gauss-Jordan on [A | I] with partial pivoting, rows never swapped: each
    column's pivot row is the first largest |value| among the rows not used yet (LAPACK's
    choice), and one GatherElements puts the rows in order at the end.

    On (n, 2n - k, *) tensors, broadcasting (n, 1, *) against (1, w, *): ONNX Runtime runs
    it faster than ``_build_gauss_jordan_2d``, but onnx2tf's tf_converter mislays its 3-D
    tensors, so it is the ``--target ort`` form only."""
    n, dtype = facts.n, facts.dtype
    tail = (1,) * (facts.rank - 2)  # the batch axes of a constant
    matrix = _batch_last(b, a, facts, flat=False)  # (n, n, *)
    row_ids = np.arange(n, dtype=np.int64).reshape(n, 1, *tail)
    eye = np.eye(n, dtype=dtype).reshape(n, n, *tail)
    work = b.Concat(matrix, b.Expand(eye, b.Shape(matrix), hint="I"), axis=1,
                    hint="A_I")  # (n, 2n, *)
    unused: Value | None = None  # rows not pivoted yet, (n, 1, *) bool; None: all
    pivot_rows: list[Value] = []
    pivots: list[Value] = []
    for k in range(n):
        width = 2 * n - k
        column, rest = b.Split(work, [1, width - 1], axis=1, hint=f"col{k}")  # (n, 1, *)
        chosen, hot, unused = _choose_pivot(b, column, unused, row_ids, k, n, dtype)
        pivot_rows.append(chosen)  # (1, 1, *); hot: (n, 1, *)
        # The index is broadcast by adding zeros, not by Expand: TVM cannot import an
        # Expand of a tensor whose dims are symbolic.
        row = b.GatherElements(work, chosen + np.zeros((1, width, *tail), np.int64), axis=0,
                               hint=f"row{k}")  # (1, width, *)
        pivot, row_rest = b.Split(row, [1, width - 1], axis=1, hint=f"pivot{k}")
        pivots.append(pivot)
        scaled = b.Div(row_rest, pivot, hint=f"row{k}_scaled")
        # Every other row loses its column-k part; the pivot row is kept as it is (its
        # multiplier is 0) and divided by its pivot once at the end: normalizing it here
        # as rest - (pivot - 1) * scaled would cancel badly when the pivot is large.
        multiplier = b.Where(hot, np.zeros((), dtype), column, hint=f"multiplier{k}")
        work = b.Sub(rest, multiplier * scaled, hint=f"eliminated{k}")  # (n, width-1, *)
    # Row p_k of work now holds pivot_k * (row k of the inverse).
    order = b.Concat(*pivot_rows, axis=0, hint="pivot_order") if n > 1 else pivot_rows[0]
    ordered = b.GatherElements(work, order + np.zeros((1, n, *tail), np.int64), axis=0,
                               hint="pivot_rows")  # (n, n, *)
    all_pivots = b.Concat(*pivots, axis=0, hint="pivots") if n > 1 else pivots[0]
    inverse = b.Div(ordered, all_pivots, hint="inverse_t")  # (n, n, *)
    if info_out:
        # (n, 1, *) pivots: reduced over the first two axes, A's batch dims stay
        _info_from_pivots(b, all_pivots, n, facts.rank, [0, 1], False,
                          out=info_out)
    if batch_last:  # (n*n, B), as the closed form gives it
        return b.Reshape(inverse, [n * n, -1], hint="inverse_t_2d")
    return _batch_first(b, inverse, facts, out)


def _build_gauss_jordan_2d(b: Builder, a: Value, facts: MatrixFacts, out: str | None,
                           info_out: str | None, batch_last: bool) -> Value:
    """The same elimination as ``_build_gauss_jordan``, on 2-D (entries, B) tensors only.

    [A | I] is (n * w, B), row i * w + c holding entry (i, c) of every matrix (w = 2n - k
    columns left at step k: the pivot column is dropped each step). A step gathers column 0
    of every row, (n, B), picks the pivot row p (ArgMax over the unused rows), reads row p
    with one GatherElements (index p * w + c), and writes every row's remaining columns
    as ``rest - multiplier[i] * scaled[c]``, the two factors gathered out to (n * (w-1), B)
    rows: an outer product by Gathers, not by broadcasting (n, 1, B) against (1, w-1, B),
    since onnx2tf's tf_converter mislays such 3-D tensors (it takes a tensor whose dims
    after the first are equal for channels-first, and rebuilds Transposes by dim sizes)."""
    n, dtype = facts.n, facts.dtype
    entries = b.Transpose2D(a, None, n * n, hint="A_t")  # (n*n, B)
    identity = b.Expand(np.eye(n, dtype=dtype).reshape(n * n, 1), b.Shape(entries),
                        hint="I")  # (n*n, B)
    # Rows of [A | I]: row i is A's row i, then I's row i.
    interleave = [i * n + c if c < n else n * n + i * n + c - n
                  for i in range(n) for c in range(2 * n)]
    work = b.Gather(b.Concat(entries, identity, axis=0, hint="A_and_I"), interleave, axis=0,
                    hint="A_I")  # (n * 2n, B)
    row_ids = np.arange(n, dtype=np.int64).reshape(n, 1)
    unused: Value | None = None  # rows not pivoted yet, (n, B) bool; None: all
    pivot_rows: list[Value] = []
    pivots: list[Value] = []
    for k in range(n):
        width = 2 * n - k
        column = b.Gather(work, [i * width for i in range(n)], axis=0,
                          hint=f"col{k}")  # (n, B)
        chosen, hot, unused = _choose_pivot(b, column, unused, row_ids, k, n, dtype)
        pivot_rows.append(chosen)  # (1, B); hot: (n, B)
        pivot = b.GatherElements(column, chosen, 0, hint=f"pivot{k}")  # (1, B)
        pivots.append(pivot)
        if width == 1:
            break  # nothing right of the pivot (n = 1)
        # Row p's other columns: index p * width + c, (width - 1, B)
        row_at = b.Add(b.Mul(chosen, np.int64(width), hint=f"row{k}_start"),
                       np.arange(1, width, dtype=np.int64).reshape(-1, 1), hint=f"row{k}_at")
        scaled = b.Div(b.GatherElements(work, row_at, 0, hint=f"row{k}"), pivot,
                       hint=f"row{k}_scaled")  # (width - 1, B)
        # The pivot row keeps its values (multiplier 0); see _build_gauss_jordan.
        multiplier = b.Where(hot, np.zeros((), dtype), column, hint=f"multiplier{k}")
        rest = [i * width + c for i in range(n) for c in range(1, width)]
        update = b.Mul(
            b.Gather(multiplier, [i for i in range(n) for _ in range(1, width)], axis=0,
                     hint=f"multiplier{k}_rows"),
            b.Gather(scaled, [c - 1 for _ in range(n) for c in range(1, width)], axis=0,
                     hint=f"row{k}_rows"), hint=f"update{k}")  # (n * (width - 1), B)
        work = b.Sub(b.Gather(work, rest, axis=0, hint=f"rest{k}"), update,
                     hint=f"eliminated{k}")
    # Row p_k of work (n columns) now holds pivot_k * (row k of the inverse).
    order = b.Concat(*pivot_rows, axis=0, hint="pivot_order") if n > 1 else pivot_rows[0]
    all_pivots = b.Concat(*pivots, axis=0, hint="pivots") if n > 1 else pivots[0]  # (n, B)
    if n == 1:
        inverse = b.Reciprocal(all_pivots, hint="inverse_t")
    else:
        spread = [k for k in range(n) for _ in range(n)]  # row k * n + j reads k
        at = b.Add(b.Mul(b.Gather(order, spread, axis=0, hint="pivot_order_rows"),
                         np.int64(n), hint="inverse_rows_start"),
                   np.tile(np.arange(n, dtype=np.int64), n).reshape(-1, 1),
                   hint="inverse_rows_at")  # (n*n, B)
        inverse = b.Div(b.GatherElements(work, at, 0, hint="pivot_rows"),
                        b.Gather(all_pivots, spread, axis=0, hint="pivot_per_entry"),
                        hint="inverse_t")  # (n*n, B)
    if info_out:
        _info_to_batch(b, _info_from_pivots(b, all_pivots, n, 2, [0], True), a, facts,
                       info_out)
    if batch_last:
        return inverse
    return b.Transpose2D(inverse, n * n, None, hint="inverse", shape=b.Shape(a),
                   batch_dims=facts.shape[:-2], out=out)


def _info_from_pivots(b: Builder, all_pivots: Value, n: int, rank: int, axes: list[int],
                      keepdims: bool, out: str | None = None) -> Value:
    """LAPACK's info from the pivots, (n, ...) of ``rank`` dims: the 1-based index of the
    first zero pivot, 0 if none, reduced over ``axes`` (the pivot axis first) as int32.
    Arithmetic, no Where: LiteRT's SELECT (onnx2tf's flatbuffer_direct) refused the Where
    form with two batch dims."""
    ranks = np.arange(n, 0, -1, dtype=np.int32).reshape(
        [n] + [1] * (rank - 1))  # earlier columns score higher
    zero = b.Cast(b.Equal(all_pivots, 0.0, hint="zero_pivot"), np.int32, hint="zero_pivot_i")
    score = b.ReduceMax(b.Mul(zero, ranks, hint="zero_score"), axes, keepdims=keepdims,
                        hint="first_zero")  # n + 1 - (first zero), or 0
    found = b.Cast(b.Greater(score, np.int32(0), hint="any_zero_b"), np.int32,
                   hint="any_zero")
    return b.Sub(b.Mul(found, np.int32(n + 1), hint="info_base"), score, hint="info_2d",
                 out=out)


def _build_empty(b: Builder, a: Value, facts: MatrixFacts, out: str | None,
                 info_out: str | None) -> Value:
    """n == 0: the inverse of a 0 x 0 matrix is itself; info is 0 for every batch entry."""
    if info_out:
        b.ConstantOfShape(b.Shape(a, 0, facts.rank - 2), 0, np.int32, hint="info",
                          out=info_out)
    return b.Identity(a, hint="inverse", out=out)


def build_inverse(b: Builder, a: str, facts: MatrixFacts, out: str | None = None,
                  info_out: str | None = None, batch_last: bool = False) -> Value:
    """Emit ``A^-1`` (into ``out``) and, if ``info_out`` is given, LAPACK's info into it.

    n <= 4 uses the closed form (info from its minors: ``_info_from_flags``), larger n the
    elimination (info from its pivots). ``batch_last`` returns the inverse
    as (n*n, B), B being A's batch dims flattened, row i*n + j holding entry (i, j) (``out``
    is then not written; n must be >= 1)."""
    value = b.input(a, facts.dtype)
    if facts.n == 0:
        if batch_last:
            raise ValueError("batch_last needs n >= 1")
        return _build_empty(b, value, facts, out, info_out)
    if facts.n <= CLOSED_FORM_MAX_N:
        return _build_closed_form(b, value, facts, out, info_out, batch_last)
    if b.target == "ort":  # 0.55-0.85x the time of the 2-D form on ONNX Runtime
        return _build_gauss_jordan(b, value, facts, out, info_out, batch_last)
    return _build_gauss_jordan_2d(b, value, facts, out, info_out, batch_last)


# -- numpy references (independent of the build: numpy's LAPACK inverse, and a plain LU) ----


def inverse_reference(a: np.ndarray) -> np.ndarray:
    """``A^-1`` through numpy's LAPACK (in float64, rounded to A's dtype); a singular
    matrix in the batch gives NaN for that matrix (torch raises; this never does)."""
    a = np.asarray(a)
    n = a.shape[-1]
    matrices = a.astype(np.float64).reshape(-1, n, n)
    if matrices.size == 0:
        return a.copy()
    try:
        result = np.linalg.inv(matrices)
    except np.linalg.LinAlgError:
        result = np.empty_like(matrices)
        for index, matrix in enumerate(matrices):
            try:
                result[index] = np.linalg.inv(matrix)
            except np.linalg.LinAlgError:
                result[index] = np.nan
    return result.reshape(a.shape).astype(a.dtype)


def lu_info_reference(a: np.ndarray) -> np.ndarray:
    """LAPACK getrf's info, int32 of shape A.shape[:-2]: LU with partial pivoting (row
    swaps, first largest |value|), in A's dtype; a zero pivot is recorded and skipped."""
    a = np.asarray(a)
    n = a.shape[-1]
    u = a.reshape(-1, n, n).copy()
    info = np.zeros(len(u), dtype=np.int32)
    batch = np.arange(len(u))
    with np.errstate(all="ignore"):
        for k in range(n):
            p = k + np.argmax(np.abs(u[:, k:, k]), axis=1)
            u[batch, k], u[batch, p] = u[batch, p].copy(), u[batch, k].copy()
            pivot = u[:, k, k]
            zero = pivot == 0
            info[(info == 0) & zero] = k + 1
            factors = u[:, k + 1:, k] / np.where(zero, 1, pivot)[:, None]
            factors[zero] = 0
            u[:, k + 1:, k:] -= factors[:, :, None] * u[:, None, k, k:]
    return info.reshape(a.shape[:-2])


# -- the patterns ---------------------------------------------------------------------------


class _InversePattern(Pattern[MatrixFacts]):
    """Shared check/build/compute: ``A^-1`` of tensor ``A``; ``with_info`` adds info."""

    with_info = False

    def check(self, node: MatchedNode, ctx: MatchContext) -> MatrixFacts:
        return matrix_facts(node.tensor("A"), ctx)

    def build(self, b: Builder, node: MatchedNode, facts: MatrixFacts) -> None:
        outputs = node.outputs
        info_out = outputs[1] if self.with_info and len(outputs) > 1 and outputs[1] else None
        build_inverse(b, node.tensor("A"), facts, out=outputs[0] or None, info_out=info_out)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: MatrixFacts
                     ) -> list[OutputType]:
        types: list[OutputType] = [(facts.elem_type, facts.shape)]
        if self.with_info:
            types.append((TensorProto.INT32, facts.shape[:-2]))
        return types

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        a = np.asarray(tensors["A"])
        if self.with_info:
            return [inverse_reference(a), lu_info_reference(a)]
        return [inverse_reference(a)]


class Inverse(_InversePattern):
    """``Inverse(A)`` in any domain; torch's ``linalg_inv(A)`` (torch.linalg.inv)."""

    op_type = "Inverse"
    forms = (Form("Inverse", inputs=(In("A"),)), Form(aten="linalg_inv", inputs=(In("A"),)))
    examples = (
        Example(
            (("A", F, ("B", 3, 3)),),
            domains=(("custom.ops", 13), ("com.microsoft", 17)),
            aten=("A",),
        ),
        Example((("A", D, (6, 6)),), aten=("A",), aten_opset=11),
    )


class AtenInverse(_InversePattern):
    """``torch.inverse`` as TorchScript spells it; ATen forms only."""

    op_type = "inverse"
    forms = (Form(aten="inverse", inputs=(In("A"),)),)
    examples = (Example((("A", D, ("B", 2, 2)),), aten=("A",)),)


class LinalgInvEx(_InversePattern):
    """``torch.linalg.inv_ex(A, check_errors) -> (inverse, info)``; ATen forms only (either
    output may be unused; check_errors is ignored: nothing is raised in a graph)."""

    op_type = "linalg_inv_ex"
    forms = (Form(aten="linalg_inv_ex", inputs=(In("A"), In("check_errors", optional=True)),
                  outputs=(1, 2)),)
    with_info = True
    examples = (Example((("A", F, ("B", 5, 5)),), ((F, 3), (I32, 1)), aten=("A", FALSE)),)


PATTERNS = [Inverse(), AtenInverse(), LinalgInvEx()]
