"""Einsum (ONNX opset 12) as ReduceSum, Transpose, Reshape and MatMul, for opset 11.

Matches ``Einsum(Inputs...; equation)`` in any custom domain, and in the default domain
below opset 12 (``--target-opset 11``). Semantics are ONNX's (numpy's ``einsum``): the
explicit form ``"ij,jk->ik"``, the implicit one (the output: the letters seen once, in
alphabetical order, after the ellipsis), and ``...`` for leading dims that broadcast.

Before -> after (two operands; more are contracted left to right)::

    a letter only one operand has, and neither the output nor a later operand: ReduceSum
    A -> Transpose (batch, kept, contracted) -> Reshape (batch, L, K)
    B -> Transpose (batch, contracted, kept) -> Reshape (batch, K, R)
    MatMul -> Reshape (batch, A's kept dims, B's kept dims) -> Transpose to the output

Batch letters (in both operands and the output) and the ellipsis stay leading dims, which
MatMul broadcasts. The sums are MatMul's and ReduceSum's, in their order (not numpy's:
agreement to float rounding). A letter repeated within one operand (a diagonal, ``"ii->i"``)
is its diagonal (the elements off it set to 0 by a Where, then summed away).

The Reshapes are skipped where each group is one dim already, and their targets are
constants (static products, 0 for a dim that keeps its place, one -1). Where no constant
target exists (two groups of several dynamic dims), the pair is multiplied at full rank
instead, ``(batch, L.., 1.., K..) * (batch, 1.., R.., K..)``, and the contracted letters
summed: TVM 0.27 cannot import a Reshape target computed from sizes (measured), and the
full-rank product costs memory L·R·K, so it is the last resort, as is a diagonal mask from a
run-time Range (TVM runs neither; ONNX Runtime and OpenVINO run both).

Envelope: opset 11+; float16/32/64, int32/int64, uint32/uint64 (the types MatMul takes);
every operand's rank known; dims dynamic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32,
          TensorProto.INT64, TensorProto.UINT32, TensorProto.UINT64)
_ELLIPSIS_LETTERS = "0123456789"  # stand for the ellipsis dims, outermost first


class Facts(NamedTuple):
    elem_type: int
    terms: tuple[str, ...]  # per operand, with the ellipsis spelled as digits
    output: str
    # the static size of each letter where every operand agrees on it; None if any is not
    # static or they differ (a broadcast)
    sizes: tuple[tuple[str, int | None], ...] = ()


def letter_sizes(terms: Sequence[str], shapes: Sequence[tuple[object, ...]]
                 ) -> tuple[tuple[str, int | None], ...]:
    found: dict[str, int | None] = {}
    for term, shape in zip(terms, shapes, strict=True):
        for letter, dim in zip(term, shape, strict=True):
            size = dim if isinstance(dim, int) and dim >= 0 else None
            if letter in found and found[letter] != size:
                size = None
            found[letter] = size
    return tuple(sorted(found.items()))


def parse(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """The operands' terms and the output term, the ellipsis expanded into digit letters
    (right-aligned across operands); raises Reject."""
    text = equation.replace(" ", "")
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise Reject(f"the equation names {len(terms)} operands; the node has {len(ranks)}")
    widths = []
    for term, rank in zip(terms, ranks, strict=True):
        letters = len(term.replace("...", ""))
        if "..." in term:
            widths.append(rank - letters)
        elif letters != rank:
            raise Reject(f"term '{term}' has {letters} letters for a rank-{rank} operand")
        else:
            widths.append(0)
    widest = max(widths)
    if widest > len(_ELLIPSIS_LETTERS) or min(widths) < 0:
        raise Reject("the ellipsis does not fit the operands' ranks")
    expanded = [term.replace("...", _ELLIPSIS_LETTERS[widest - width:widest])
                for term, width in zip(terms, widths, strict=True)]
    for term in expanded:
        if not all(c.isalpha() or c in _ELLIPSIS_LETTERS for c in term):
            raise Reject(f"term '{term}' holds characters other than letters and '...'")
    if arrow:
        output = rhs.replace("...", _ELLIPSIS_LETTERS[:widest])
    else:
        counts: dict[str, int] = {}
        for term in expanded:
            for letter in term:
                counts[letter] = counts.get(letter, 0) + 1
        output = _ELLIPSIS_LETTERS[:widest] + "".join(
            sorted(c for c, n in counts.items() if n == 1 and c.isalpha()))
    seen = set("".join(expanded))
    if any(c not in seen for c in output) or len(set(output)) != len(output):
        raise Reject(f"output '{rhs}' names a letter no operand has, or one twice")
    return expanded, output


class Einsum(Pattern[Facts]):
    op_type = "Einsum"
    # any number of operands: the older spelling, which reads the inputs itself
    domains = None
    attributes = {"equation": Attr("string")}
    examples = (
        Example((("a", F, ("N", 3, 4)), ("b", F, ("N", 4, 5))),
                attrs={"equation": "bij,bjk->bik"}, domains=(("", 11), ("custom.ops", 13))),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        names = [name for name in node.inputs]
        if not names or any(not name for name in names):
            raise Reject("every operand must be given")
        elem_type = require_type(ctx, names[0], "operand 0", _TYPES)
        shapes = []
        for index, name in enumerate(names):
            require_type(ctx, name, f"operand {index}", (elem_type,))
            shapes.append(tuple(require_shape(ctx, name, f"operand {index}",
                                              "for the equation")))
        equation = node.args["equation"]
        text = equation.decode() if isinstance(equation, bytes) else str(equation)
        terms, output = parse(text, [len(shape) for shape in shapes])
        return Facts(elem_type, tuple(terms), output, letter_sizes(terms, shapes))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        dtype = numpy_dtype(facts.elem_type)
        values, terms = [], []
        for index, (name, term) in enumerate(zip(node.inputs, facts.terms, strict=True)):
            value, term = _diagonals(b, b.input(name, dtype), term, dtype, f"in{index}",
                                     dict(facts.sizes))
            values.append(value)
            terms.append(term)
        current, term = values[0], terms[0]
        for index in range(1, len(values)):
            later = "".join(terms[index + 1:]) + facts.output
            current, term = _contract(b, current, term, values[index], terms[index], later,
                                      index, dict(facts.sizes))
        current, term = _sum_out(b, current, term, facts.output, "final")
        perm = [term.index(c) for c in facts.output]
        if perm != list(range(len(perm))):
            b.Transpose(current, perm, hint="to_output", out=node.outputs[0])
        else:
            b.op("Identity", current, hint="result", out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(facts.elem_type, None)]

    def reference(self, *inputs: np.ndarray, **attrs: Any) -> list[np.ndarray]:
        equation = attrs["equation"]
        text = equation.decode() if isinstance(equation, bytes) else str(equation)
        return [np.asarray(np.einsum(text, *inputs)).astype(inputs[0].dtype)]


def _diagonals(b: Builder, x: Value, term: str, dtype: np.dtype, hint: str,
               sizes: dict[str, int | None]) -> tuple[Value, str]:
    """``x`` with each letter repeated in ``term`` reduced to its diagonal: the elements off
    it replaced by 0 (Where, not a product: inf and NaN stay put), then summed away. The
    mask is a constant when the letter's size is static (TVM cannot run a Where over a
    mask from a run-time Range, measured)."""
    while True:
        repeated = next((c for c in term if term.count(c) > 1), None)
        if repeated is None:
            return x, term
        first = term.index(repeated)
        second = term.index(repeated, first + 1)
        static = sizes.get(repeated)
        if static is not None:
            mask_shape = [1] * len(term)
            mask_shape[first] = mask_shape[second] = static
            eye = np.eye(static, dtype=bool).reshape(mask_shape)
            kept = b.Where(b.const(eye, hint=f"{hint}_on_diagonal"), x, np.zeros((), dtype),
                           hint=f"{hint}_diagonal_only")
            x = b.ReduceSum(kept, [second], keepdims=False, hint=f"{hint}_diagonal")
            term = term[:second] + term[second + 1:]
            continue
        size = b.Gather(b.Shape(x, hint=f"{hint}_shape"), first, hint=f"{hint}_n")
        rows = b.Range(0, size, 1, hint=f"{hint}_rows")
        shape = [1] * len(term)
        shape[first] = -1
        row_index = b.Reshape(rows, np.array(shape, np.int64), hint=f"{hint}_row_index")
        shape = [1] * len(term)
        shape[second] = -1
        col_index = b.Reshape(rows, np.array(shape, np.int64), hint=f"{hint}_col_index")
        on_diagonal = b.Equal(row_index, col_index, hint=f"{hint}_on_diagonal")
        kept = b.Where(on_diagonal, x, np.zeros((), dtype), hint=f"{hint}_diagonal_only")
        x = b.ReduceSum(kept, [second], keepdims=False, hint=f"{hint}_diagonal")
        term = term[:second] + term[second + 1:]


def _sum_out(b: Builder, x: Value, term: str, keep: str, hint: str) -> tuple[Value, str]:
    """``x`` summed over the letters of ``term`` not in ``keep``."""
    gone = [i for i, c in enumerate(term) if c not in keep]
    if not gone:
        return x, term
    summed = b.ReduceSum(x, gone, keepdims=False, hint=f"{hint}_sum")
    return summed, "".join(c for c in term if c in keep)


def _contract(b: Builder, a: Value, a_term: str, c: Value, c_term: str, keep: str,
              index: int, sizes: dict[str, int | None]) -> tuple[Value, str]:
    """a * c summed over their shared letters that ``keep`` (the output and the operands
    still to come) does not name; the result's term: batch, a's kept, c's kept letters."""
    a, a_term = _sum_out(b, a, a_term, keep + c_term, f"a{index}")
    c, c_term = _sum_out(b, c, c_term, keep + a_term, f"b{index}")
    shared = [x for x in a_term if x in c_term]
    batch = [x for x in shared if x in keep]
    contracted = [x for x in shared if x not in keep]
    left = [x for x in a_term if x not in c_term]
    right = [x for x in c_term if x not in a_term]
    a_order = batch + left + contracted
    c_order = batch + contracted + right
    a_t = _permute(b, a, a_term, a_order, f"a{index}")
    c_t = _permute(b, c, c_term, c_order, f"b{index}")
    nb = len(batch)
    term = "".join(batch + left + right)
    if not (_flat_is_constant(nb, left, contracted, sizes)
            and _flat_is_constant(nb, contracted, right, sizes)
            and _unflat_is_constant(nb, left, right, sizes)):
        # Flattening would need a Reshape target computed from sizes (ReduceProd), which
        # TVM cannot import: multiply at full rank and sum the contracted letters instead
        # (batch, L, 1.., K) * (batch, 1.., R, K)
        a_full = b.Unsqueeze(a_t, list(range(nb + len(left), nb + len(left) + len(right))),
                             hint=f"a{index}_full") if right else a_t
        c_perm = _permute(b, c_t, "".join(c_order), batch + right + contracted, f"b{index}r")
        c_full = b.Unsqueeze(c_perm, list(range(nb, nb + len(left))),
                             hint=f"b{index}_full") if left else c_perm
        product = b.Mul(a_full, c_full, hint=f"contract{index}")
        if contracted:
            rank = nb + len(left) + len(right) + len(contracted)
            product = b.ReduceSum(product, list(range(rank - len(contracted), rank)),
                                  keepdims=False, hint=f"contract{index}_sum")
        return product, term
    # (batch, L, K) @ (batch, K, R); the batch dims stay (MatMul broadcasts them)
    a_flat = _flatten(b, a_t, nb, left, contracted, sizes, f"a{index}")
    c_flat = _flatten(b, c_t, nb, contracted, right, sizes, f"b{index}")
    product = b.MatMul(a_flat, c_flat, hint=f"contract{index}")
    if len(left) == 1 and len(right) == 1:
        return product, term
    # the left letter of one keeps its place (0 copies it); the others are static or -1
    target = _constant_target(nb, [(sizes.get(x), len(left) == 1 and x in left)
                                   for x in left + right])
    assert target is not None  # (checked above: _unflat_is_constant)
    return b.Reshape(product, target, hint=f"unflat{index}"), term


def _constant_target(nb: int, dims: list[tuple[int | None, bool]]) -> np.ndarray | None:
    """A constant Reshape target for ``nb`` batch dims (0: copied) and ``dims``, each a
    (static size or None, whether 0 may copy it) pair; None if more than one would be -1.
    TVM cannot Reshape to a target computed from sizes (measured): where no constant
    target exists, :func:`_contract` multiplies at full rank instead of flattening."""
    target = [0] * nb
    for size, copies in dims:
        if size == 0:
            return None  # 0 would copy, not say 0
        target.append(size if size is not None else 0 if copies else -1)
    return np.array(target, np.int64) if target.count(-1) <= 1 else None


def _group_dims(first: list[str], second: list[str], sizes: dict[str, int | None]
                ) -> list[tuple[int | None, bool]]:
    dims = []
    for place, group in enumerate((first, second)):
        known = [sizes.get(c) for c in group]
        static = int(np.prod([k for k in known if k is not None], dtype=np.int64)) \
            if all(k is not None for k in known) else None
        # a dynamic group of one letter that sits where it stays: copied by 0
        copies = len(group) == 1 and (place == 0 or len(first) == 1)
        dims.append((static, copies))
    return dims


def _flat_is_constant(nb: int, first: list[str], second: list[str],
                      sizes: dict[str, int | None]) -> bool:
    """Whether :func:`_flatten` writes a constant target (or no Reshape)."""
    return (len(first) == 1 and len(second) == 1) or \
        _constant_target(nb, _group_dims(first, second, sizes)) is not None


def _unflat_is_constant(nb: int, left: list[str], right: list[str],
                        sizes: dict[str, int | None]) -> bool:
    return (len(left) == 1 and len(right) == 1) or _constant_target(
        nb, [(sizes.get(x), len(left) == 1 and x in left) for x in left + right]) is not None


def _flatten(b: Builder, x: Value, nb: int, first: list[str], second: list[str],
             sizes: dict[str, int | None], hint: str) -> Value:
    """``x`` (batch dims, the letters of ``first``, then of ``second``) as (batch,
    prod(first), prod(second))."""
    if len(first) == 1 and len(second) == 1:
        return x
    target = _constant_target(nb, _group_dims(first, second, sizes))
    assert target is not None  # (_contract multiplies at full rank otherwise)
    return b.Reshape(x, target, hint=f"{hint}_flat")


def _permute(b: Builder, x: Value, term: str, order: list[str], hint: str) -> Value:
    perm = [term.index(c) for c in order]
    return x if perm == list(range(len(perm))) else b.Transpose(x, perm, hint=f"{hint}_t")


PATTERNS = [Einsum()]
