"""Matrix inverse patterns (Inverse, linalg_inv, inverse, linalg_inv_ex) against torch.linalg.

Oracle: ``torch.linalg.inv`` / ``torch.linalg.inv_ex`` in float64 (rounded to the input's
dtype), and torch's real legacy exports at opsets 11 and 13.
"""

from __future__ import annotations

import io
import warnings
from fractions import Fraction

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch.onnx import OperatorExportTypes

import decomposer
from decomposer.patterns.linalg_inv import MAX_N, Inverse
from decomposer.testing import Case, check_pattern

from _helpers import custom_nodes, make_model, run_onnxruntime

NEWEST = onnx.defs.onnx_opset_version()
OPSETS = [11, 13, 17, NEWEST]
ATEN = "org.pytorch.aten"
ELEM = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def needs_pivoting(rng: np.random.Generator, batch: tuple[int, ...], n: int,
                   dtype=np.float32) -> np.ndarray:
    """Well-conditioned matrices (cond < ~3) whose dominant entries sit below the diagonal,
    with A[0, 0] = 0: elimination without row exchanges divides by zero at once."""
    noise = rng.uniform(-0.3, 0.3, (*batch, n, n))
    dominant = np.roll(np.eye(n), -1, axis=0) * (n + 1) * rng.choice([-1.0, 1.0], n)
    a = noise + dominant
    if n > 1:
        a[..., 0, 0] = 0
    return a.astype(dtype)


def torch_inverse(a: np.ndarray) -> np.ndarray:
    return torch.linalg.inv(torch.from_numpy(a.astype(np.float64))).numpy().astype(a.dtype)


def torch_inverse_ex(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    inverse, info = torch.linalg.inv_ex(torch.from_numpy(a))
    return inverse.numpy(), info.numpy()


def tolerances(dtype) -> dict[str, float]:
    return {"atol": 1e-5, "rtol": 1e-4} if dtype == np.float32 else {"atol": 1e-12,
                                                                      "rtol": 1e-10}


def aten_model(operator: str, n: int | str, *, form: str = "fallthrough",
               batch=("B",), dtype=np.float32, opset: int = 13,
               check_errors: bool | None = False) -> onnx.ModelProto:
    """One torch fallback node over A (*batch, n, n): ``org.pytorch.aten::<operator>`` or
    ``ATen(operator=...)``; linalg_inv_ex gets its constant check_errors and two outputs."""
    elem = ELEM[dtype]
    inputs = ["A"]
    nodes = []
    outputs = [helper.make_tensor_value_info("X", elem, [None] * (len(batch) + 2))]
    outs = ["X"]
    if operator == "linalg_inv_ex":
        if check_errors is not None:
            nodes.append(helper.make_node("Constant", [], ["check"], name="check_const",
                                          value=helper.make_tensor("v", TensorProto.BOOL, [],
                                                                   [check_errors])))
            inputs.append("check")
        outs.append("info")
        outputs.append(helper.make_tensor_value_info("info", TensorProto.INT32,
                                                     [None] * len(batch)))
    if form == "fallthrough":
        nodes.append(helper.make_node(operator, inputs, outs, name="inv", domain=ATEN))
    else:
        nodes.append(helper.make_node("ATen", inputs, outs, name="inv", domain=ATEN,
                                      operator=operator, overload_name=""))
    a_info = helper.make_tensor_value_info("A", elem, [*batch, n, n])
    return make_model(nodes, [a_info], outputs, opset, extra_opsets=[ATEN])


# -- the native Inverse(A) form, through the kit ----------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_inverse_every_size_batch_and_opset(dtype):
    rng = np.random.default_rng(0)
    cases = [Case([needs_pivoting(rng, (3,), n, dtype)], symbolic={0: [0]},
                  more_inputs=[[needs_pivoting(rng, (5,), n, dtype)],
                               [needs_pivoting(rng, (0,), n, dtype)]], id=f"n={n}")
             for n in [1, 2, 3, 4, 5, 8, MAX_N]]
    check_pattern(Inverse(), cases, opsets=OPSETS, domain="custom.ops", oracle=torch_inverse,
                  **tolerances(dtype))


def test_inverse_batch_ranks_identity_and_permutations():
    rng = np.random.default_rng(1)
    cases = []
    for n in (2, 3, 4, 6):
        eye = np.broadcast_to(np.eye(n, dtype=np.float32), (2, n, n)).copy()
        flips = eye[..., ::-1, :].copy()  # anti-diagonal: every diagonal entry is 0
        cases += [Case([eye], id=f"identity n={n}"), Case([flips], id=f"flip n={n}"),
                  Case([needs_pivoting(rng, (), n)], id=f"unbatched n={n}"),
                  Case([needs_pivoting(rng, (2, 3, 2), n)], symbolic={0: [0, 1, 2]},
                       id=f"rank5 n={n}")]
    results = check_pattern(Inverse(), cases, opsets=[13], domain="custom.ops",
                            oracle=torch_inverse, atol=1e-5, rtol=1e-4)
    for result in results:
        assert not custom_nodes(result.model)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7])
@pytest.mark.parametrize("scale", [1e-30, 1e-12, 1e12, 1e30])
def test_extreme_magnitudes(n, scale):
    """Entries of 1e30 make det(A) = 1e120 for n = 4: the closed form must not overflow."""
    a = needs_pivoting(np.random.default_rng(2), (4,), n, np.float64)
    a32 = (a * scale).astype(np.float32)
    out = decomposer.decompose(aten_model("linalg_inv", n))
    (got,) = run_onnxruntime(out, {"A": a32})
    want = np.linalg.inv(a32.astype(np.float64))
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got * scale, want * scale, rtol=1e-4, atol=1e-5)


def test_float64_extreme_magnitudes():
    a = needs_pivoting(np.random.default_rng(3), (2,), 4, np.float64)
    for scale in (1e-200, 1e200):
        out = decomposer.decompose(aten_model("linalg_inv", 4, dtype=np.float64))
        (got,) = run_onnxruntime(out, {"A": a * scale})
        np.testing.assert_allclose(got * scale, np.linalg.inv(a), rtol=1e-10)


def test_near_singular_but_invertible_needs_pivoting():
    """A tiny leading entry: elimination without pivoting loses everything to rounding."""
    base = np.array([[1e-9, 1, 2, 0, 1], [1, 1, 0, 2, 0], [0, 2, 1, 1, 1], [3, 0, 1, 1, 2],
                     [1, 1, 1, 0, 1]], np.float64)
    for n in (2, 3, 4, 5):
        a = base[:n, :n].copy()
        a[0, 0] = 1e-9
        if np.linalg.cond(a) > 1e3:
            continue
        for dtype in (np.float32, np.float64):
            out = decomposer.decompose(aten_model("linalg_inv", n, dtype=dtype))
            (got,) = run_onnxruntime(out, {"A": a[None].astype(dtype)})
            np.testing.assert_allclose(got[0], torch_inverse(a), **tolerances(dtype))


@pytest.mark.parametrize("target", ["portable", "ort"])
@pytest.mark.parametrize("n", [5, 8, MAX_N])
def test_both_elimination_forms(target, n):
    """n >= 5 eliminates on 2-D (entries, batch) tensors (portable: onnx2tf's tf_converter
    mislays the 3-D form) or on 3-D (n, w, batch) ones (--target ort, faster there); both
    against torch, batch ranks 0-2 and empty batches included, with info on singular input."""
    rng = np.random.default_rng(n)
    for operator in ("linalg_inv", "linalg_inv_ex"):
        out = decomposer.decompose(aten_model(operator, n, batch=("B", "C")), target=target)
        ops = {node.op_type for node in out.graph.node}
        assert ("Split" in ops) == (target == "ort")  # the 3-D form splits columns off
        for batch in [(2, 3), (1, 1), (2, 0)]:
            a = needs_pivoting(rng, batch, n)
            if a.size:
                a[0, 0, :, n - 2] = 0  # singular, exactly: info n - 1
            got = run_onnxruntime(out, {"A": a})
            want, want_info = torch_inverse_ex(a)
            regular = want_info == 0
            assert got[0].shape == a.shape
            np.testing.assert_allclose(got[0][regular], torch_inverse(a[regular]),
                                       atol=1e-5, rtol=1e-4)
            if operator == "linalg_inv_ex":
                np.testing.assert_array_equal(got[1], want_info)
                if a.size:
                    assert want_info[0, 0] == n - 1  # the premise


# -- torch's fallback forms --------------------------------------------------------------------


@pytest.mark.parametrize("form", ["fallthrough", "aten"])
@pytest.mark.parametrize("operator", ["linalg_inv", "inverse"])
def test_aten_forms(form, operator):
    rng = np.random.default_rng(4)
    for n in (3, 6):
        out = decomposer.decompose(aten_model(operator, n, form=form))
        onnx.checker.check_model(out, full_check=True)
        assert not custom_nodes(out)
        for batch in (1, 4):
            a = needs_pivoting(rng, (batch,), n)
            (got,) = run_onnxruntime(out, {"A": a})
            np.testing.assert_allclose(got, torch_inverse(a), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("form", ["fallthrough", "aten"])
@pytest.mark.parametrize("check_errors", [False, True, None])
@pytest.mark.parametrize("opset", [11, 13, NEWEST])
def test_inv_ex_regular_matrices_give_info_zero(form, check_errors, opset):
    rng = np.random.default_rng(5)
    out = decomposer.decompose(aten_model("linalg_inv_ex", 4, form=form, opset=opset,
                                          check_errors=check_errors, batch=("B", "C")))
    onnx.checker.check_model(out, full_check=True)
    for batch in [(2, 3), (1, 1), (0, 2)]:
        a = needs_pivoting(rng, batch, 4)
        inverse, info = run_onnxruntime(out, {"A": a})
        want, want_info = torch_inverse_ex(a)
        assert info.dtype == np.int32 and info.shape == batch
        np.testing.assert_array_equal(info, want_info)
        np.testing.assert_allclose(inverse, want, atol=1e-5, rtol=1e-4)


SINGULAR = [  # torch's info for each: the first zero pivot of LU with partial pivoting
    [[1.0, 2], [2, 4]],
    [[0.0, 0], [0, 0]],
    [[1.0, 2, 3], [2, 4, 6], [1, 0, 1]],
    [[1.0, 1, 3], [2, 2, 6], [1, 1, 1]],
    [[1.0, 1, 3], [2, 2, 7], [1, 1, 1]],
    [[0.0, 1, 2], [0, 3, 4], [0, 5, 6]],
    [[1.0, 2, 3, 4, 5], [2, 4, 6, 8, 10], [0, 1, 0, 1, 0], [1, 0, 0, 0, 1], [0, 0, 1, 1, 1]],
    [[0.0] * 5] * 5,
]


@pytest.mark.parametrize("matrix", SINGULAR, ids=lambda m: f"{len(m)}x{len(m)}")
def test_singular_matrices_give_nonfinite_values_and_torchs_info(matrix):
    a = np.array(matrix, np.float32)
    n = len(matrix)
    regular = needs_pivoting(np.random.default_rng(6), (), n)
    batch = np.stack([a, regular])  # a singular and a regular matrix in one batch
    want_inverse, want_info = torch_inverse_ex(batch)
    assert want_info[0] > 0 and want_info[1] == 0  # the premise
    (plain,) = run_onnxruntime(decomposer.decompose(aten_model("linalg_inv", n)), {"A": batch})
    inverse, info = run_onnxruntime(decomposer.decompose(aten_model("linalg_inv_ex", n)),
                                    {"A": batch})
    for got in (plain, inverse):
        assert not np.all(np.isfinite(got[0]))  # torch raises; the graph gives inf/NaN
        np.testing.assert_allclose(got[1], want_inverse[1], atol=1e-5, rtol=1e-4)
    np.testing.assert_array_equal(info, want_info)


def first_dependent_column(matrix: np.ndarray) -> int:
    """Exact rational arithmetic (independent of floats and of LAPACK): the smallest k
    whose first k columns are linearly dependent, 0 if none. In exact arithmetic that is
    where LU with partial pivoting meets its first zero pivot: LAPACK's info."""
    rows = [[Fraction(int(x)) for x in row] for row in matrix]
    n, used = len(rows), set()
    for k in range(n):  # eliminate column k with any unused row holding a nonzero
        pivot = next((r for r in range(n) if r not in used and rows[r][k] != 0), None)
        if pivot is None:
            return k + 1
        used.add(pivot)
        for r in range(n):
            if r not in used:
                factor = rows[r][k] / rows[pivot][k]
                rows[r] = [x - factor * y for x, y in zip(rows[r], rows[pivot], strict=True)]
    return 0


def dependent_integer_matrices(rng: np.random.Generator, count: int, n: int) -> np.ndarray:
    """Small-integer matrices, half of them with a column made dependent on earlier ones
    (zero, a multiple of one, or the sum of all): every info from 0 to n occurs."""
    a = rng.integers(-2, 3, size=(count, n, n)).astype(np.float64)
    for index in range(0, count, 2):
        k = rng.integers(0, n)
        if k == 0:
            a[index, :, 0] = 0
        elif rng.random() < 0.5:
            a[index, :, k] = a[index, :, :k].sum(-1)
        else:
            a[index, :, k] = a[index, :, rng.integers(0, k)] * rng.integers(-2, 3)
    return a


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_closed_form_info_is_the_first_dependent_column(n, dtype):
    """n <= 4: info comes from the closed form's minors (column 0, the 2x2 and 3x3 minors
    of the leading columns, det), exact for integer entries this small. Against exact
    rational elimination; and torch, wherever its LU reports a zero pivot, agrees or
    reports a later column (its rounding can leave a dependent column a tiny nonzero
    pivot: info 0 for an exactly singular 4x4 matrix, and a ~1e7 inverse)."""
    a = dependent_integer_matrices(np.random.default_rng(n), 600, n).astype(dtype)
    want = np.array([first_dependent_column(m) for m in a], np.int32)
    assert len(set(want.tolist())) == n + 1  # the premise: every info value occurs
    out = decomposer.decompose(aten_model("linalg_inv_ex", n, dtype=dtype))
    inverse, info = run_onnxruntime(out, {"A": a})
    np.testing.assert_array_equal(info, want)
    _, torch_info = torch_inverse_ex(a)
    reported = torch_info > 0
    # torch's LU rounding can leave a dependent column a tiny nonzero pivot, so it may
    # report a later column than the exact first one (seen on some CPUs' LAPACK), never an
    # earlier one; it agrees on nearly all.
    assert (info[reported] <= torch_info[reported]).all()
    assert (info[reported] == torch_info[reported]).mean() >= 0.98
    regular = want == 0
    np.testing.assert_allclose(inverse[regular], torch_inverse(a[regular]),
                               **tolerances(dtype))
    assert not np.isfinite(inverse[~regular]).all(axis=(1, 2)).any()  # inf/NaN, as documented


@pytest.mark.parametrize("operator", ["linalg_inv", "linalg_inv_ex"])
@pytest.mark.parametrize("n", [1, 2, 4, 5])
def test_empty_batch_dims_anywhere(operator, n):
    """A batch with a 0 dim after the first: Reshape's 0 copies the input's dim, so the
    flattened result must reach the last Reshape with 0s in the right places ((0, 0)
    came out (0, n*n, n, n), (2, 0) failed, before)."""
    out = decomposer.decompose(aten_model(operator, n, batch=("B", "C")))
    for batch in [(2, 0), (0, 2), (0, 0), (2, 3)]:
        a = needs_pivoting(np.random.default_rng(1), batch, n)
        got = run_onnxruntime(out, {"A": a})
        assert got[0].shape == a.shape
        np.testing.assert_allclose(got[0], torch_inverse(a), atol=1e-5, rtol=1e-4)
        if operator == "linalg_inv_ex":
            np.testing.assert_array_equal(got[1], torch_inverse_ex(a)[1])
            assert got[1].shape == batch


def test_zero_size_matrices():
    """torch accepts 0 x 0 matrices: the inverse is empty and info is 0."""
    for operator in ("linalg_inv", "linalg_inv_ex"):
        out = decomposer.decompose(aten_model(operator, 0))
        got = run_onnxruntime(out, {"A": np.zeros((3, 0, 0), np.float32)})
        assert got[0].shape == (3, 0, 0)
        if operator == "linalg_inv_ex":
            np.testing.assert_array_equal(got[1], np.zeros(3, np.int32))


# -- what is rejected ------------------------------------------------------------------------


@pytest.mark.parametrize("dims, elem, reason", [
    (["B", 3, 4], TensorProto.FLOAT, "must be square, got 3x4"),
    (["B", "n", "n"], TensorProto.FLOAT, "matrix size of A is not static"),
    (["B", MAX_N + 1, MAX_N + 1], TensorProto.FLOAT, f"above the supported {MAX_N}"),
    (["B", 3, 3], TensorProto.INT32, "must be float32 or float64"),
    (["B", 3, 3], TensorProto.FLOAT16, "must be float32 or float64"),
    ([3], TensorProto.FLOAT, "rank >= 2"),
    (None, TensorProto.FLOAT, "matrix size of A is not static"),
])
def test_rejections_name_the_node_and_reason(dims, elem, reason):
    if dims is None:  # fed by a Reshape to a run-time shape: rank 3, every dim unknown
        inputs = [helper.make_tensor_value_info("flat", elem, ["N"]),
                  helper.make_tensor_value_info("shape", TensorProto.INT64, [3])]
        nodes = [helper.make_node("Reshape", ["flat", "shape"], ["A"], name="reshape")]
    else:
        inputs, nodes = [helper.make_tensor_value_info("A", elem, dims)], []
    nodes.append(helper.make_node("Inverse", ["A"], ["X"], name="inv", domain="custom.ops"))
    model = make_model(nodes, inputs, [helper.make_tensor_value_info("X", elem, None)], 13,
                       extra_opsets=["custom.ops"])
    with pytest.raises(decomposer.UnsupportedNodeError) as info:
        decomposer.decompose(model, check=False)
    message = str(info.value)
    assert "node 'inv' (custom.ops::Inverse)" in message
    assert reason in message


def test_wrong_arity_is_rejected():
    model = aten_model("linalg_inv", 3)
    model.graph.node[0].input.append("A")  # linalg_inv(A, A)
    with pytest.raises(decomposer.UnsupportedNodeError, match="expected 1 input"):
        decomposer.decompose(model)


def test_verify_passes():
    model = aten_model("linalg_inv_ex", 5)
    out = decomposer.decompose(model)
    a = needs_pivoting(np.random.default_rng(7), (3,), 5)
    report = decomposer.verify(model, out, {"A": a})
    assert report.passed, report.table()


# -- real torch exports ------------------------------------------------------------------------


class Inv(torch.nn.Module):
    def forward(self, a):
        return torch.linalg.inv(a) @ a.sum(-1, keepdim=True)


class InverseModel(torch.nn.Module):
    def forward(self, a):
        return torch.inverse(a * 2.0)


class InvEx(torch.nn.Module):
    def forward(self, a):
        inverse, info = torch.linalg.inv_ex(a)
        return inverse + 1.0, info


@pytest.mark.parametrize("export_type", [OperatorExportTypes.ONNX_FALLTHROUGH,
                                         OperatorExportTypes.ONNX_ATEN_FALLBACK],
                         ids=["fallthrough", "aten_fallback"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("module, n", [(Inv, 3), (InverseModel, 6), (InvEx, 4)],
                         ids=["linalg_inv", "inverse", "linalg_inv_ex"])
def test_torch_export_decomposes_and_matches_eager(export_type, opset, module, n):
    model = module().eval()
    example = torch.from_numpy(needs_pivoting(np.random.default_rng(8), (2,), n))
    outputs = ["X", "info"] if module is InvEx else ["X"]
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (example,), buffer, dynamo=False, opset_version=opset,
                          operator_export_type=export_type, input_names=["A"],
                          output_names=outputs,
                          dynamic_axes={"A": {0: "B"}, **{o: {0: "B"} for o in outputs}})
    original = onnx.load_from_string(buffer.getvalue())
    assert [n_.domain for n_ in original.graph.node if n_.domain] == [ATEN]
    out = decomposer.decompose(original)
    onnx.checker.check_model(out, full_check=True)
    assert {i.domain for i in out.opset_import} == {""}
    for batch in (2, 5):
        a = needs_pivoting(np.random.default_rng(batch), (batch,), n)
        got = run_onnxruntime(out, {"A": a})
        with torch.no_grad():
            want = model(torch.from_numpy(a))
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.numpy().dtype
            np.testing.assert_allclose(g, w.numpy(), atol=1e-4, rtol=1e-4)


# -- portability (the hook of scripts/portability_cases.py) ---------------------------------


def portability_cases():
    """Inverse (custom.ops) of batched 3x3 matrices that need pivoting, batch dynamic; and
    the ATen linalg_inv form; n = 2 and 4 (closed forms on rows and on blocks of rows) in
    the custom.ops form; the custom.ops cases also at a batch of n * n; oracle:
    torch.linalg.inv."""
    rng = np.random.default_rng(5)
    sets = [needs_pivoting(rng, (2,), 3), needs_pivoting(rng, (4,), 3)]
    native = single_node_model_inverse(sets[0])
    cases = [{"id": f"Inverse n=3 batched ({form})", "model": model,
              "feeds": [{name: a} for a in sets],
              "expected": [[torch_inverse(a)] for a in sets], "atol": 1e-5}
             for form, model, name in [("custom.ops", native, "input0"),
                                       ("aten", aten_model("linalg_inv", 3), "A")]]
    sets.append(needs_pivoting(rng, (9,), 3))  # a batch of n * n (see below)
    cases[0]["feeds"].append({"input0": sets[-1]})
    cases[0]["expected"].append([torch_inverse(sets[-1])])
    for n in (2, 4):
        # The last set's batch is n * n: onnx2tf's tf_converter took the (B, n*n) swap
        # for an identity then (it matches a Transpose's dims by size).
        sets = [needs_pivoting(rng, (2,), n), needs_pivoting(rng, (3,), n),
                needs_pivoting(rng, (n * n,), n)]
        cases.append({"id": f"Inverse n={n} batched (custom.ops)",
                      "model": single_node_model_inverse(sets[0]),
                      "feeds": [{"input0": a} for a in sets],
                      "expected": [[torch_inverse(a)] for a in sets], "atol": 1e-5})
    # The elimination (n = 5), at a batch of n too.
    sets = [needs_pivoting(rng, (2,), 5), needs_pivoting(rng, (5,), 5)]
    cases.append({"id": "Inverse n=5 batched, elimination (custom.ops)",
                  "model": single_node_model_inverse(sets[0]),
                  "feeds": [{"input0": a} for a in sets],
                  "expected": [[torch_inverse(a)] for a in sets], "atol": 1e-5})
    sets = [needs_pivoting(rng, (2,), 3), needs_pivoting(rng, (3,), 3)]
    cases.append({"id": "linalg_inv_ex n=3 batched (aten)",
                  "model": aten_model("linalg_inv_ex", 3),
                  "feeds": [{"A": a} for a in sets],
                  "expected": [list(torch_inverse_ex(a)) for a in sets], "atol": 1e-5})
    # info from the closed form's minors: a batch whose singular matrices give info 1-4
    # (only the regular ones' inverses are compared: torch's LU and the adjugate give
    # different non-finite values for the others).
    singular = np.array([np.zeros((4, 4)),  # info 1
                         [[1, 2, 0, 1], [2, 4, 1, 0], [0, 0, 1, 1], [1, 2, 1, 0]],  # 2
                         [[1, 0, 1, 2], [0, 1, 1, 0], [1, 1, 2, 1], [2, 0, 2, 1]],  # 3
                         [[1, 0, 0, 1], [0, 1, 0, 1], [0, 0, 1, 1], [1, 1, 1, 3]]],  # 4
                        np.float32)
    mixed = np.concatenate([singular, needs_pivoting(rng, (2,), 4)])
    inverse, info = torch_inverse_ex(mixed)
    assert info.tolist() == [1, 2, 3, 4, 0, 0]  # the premise
    # Two dynamic batch dims: the result goes back through Builder.ReshapeBatchFirst's view
    # (an empty dim after the first would otherwise be copied wrong), which TVM must import.
    sets = [needs_pivoting(rng, (2, 3), 3), needs_pivoting(rng, (3, 2), 5)]
    for n, a in zip((3, 5), sets, strict=True):
        cases.append({"id": f"linalg_inv_ex n={n}, two dynamic batch dims (aten)",
                      "model": aten_model("linalg_inv_ex", n, batch=("B", "C")),
                      "feeds": [{"A": a}], "expected": [list(torch_inverse_ex(a))],
                      "atol": 1e-5})
    model = aten_model("linalg_inv_ex", 4)
    model.graph.node.append(helper.make_node("Slice", ["X", "four", "end", "zero"],
                                             ["X_regular"], name="regular_rows"))
    model.graph.initializer.extend(onnx.numpy_helper.from_array(np.array([v], np.int64),
                                                                name)
                                   for name, v in [("four", 4), ("end", 2**62), ("zero", 0)])
    model.graph.output[0].name = "X_regular"
    cases.append({"id": "linalg_inv_ex n=4, singular and regular (aten)", "model": model,
                  "feeds": [{"A": mixed}], "expected": [[inverse[4:], info]], "atol": 1e-5})
    return cases


def single_node_model_inverse(a: np.ndarray) -> onnx.ModelProto:
    from decomposer.testing import single_node_model

    return single_node_model("Inverse", "custom.ops", Case([a], symbolic={0: [0]}), 17)
