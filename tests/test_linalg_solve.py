"""Linear solve patterns (Solve, linalg_solve, linalg_solve_ex) against torch.linalg.solve.

Oracle: ``torch.linalg.solve`` / ``torch.linalg.solve_ex`` (float64, rounded to the input's
dtype), and torch's real legacy exports at opsets 11 and 13.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch.onnx import OperatorExportTypes

import decomposer
from decomposer.patterns.linalg_solve import Solve
from decomposer.testing import Case, check_pattern

from _helpers import custom_nodes, make_model, run_onnxruntime

NEWEST = onnx.defs.onnx_opset_version()
ATEN = "org.pytorch.aten"
ELEM = {np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE}


def matrices(rng: np.random.Generator, batch: tuple[int, ...], n: int,
             dtype=np.float32) -> np.ndarray:
    """Well-conditioned matrices with A[0, 0] = 0 and their weight below the diagonal, so
    that elimination must exchange rows."""
    a = rng.uniform(-0.3, 0.3, (*batch, n, n)) + np.roll(np.eye(n), -1, axis=0) * (n + 1)
    if n > 1:
        a[..., 0, 0] = 0
    return a.astype(dtype)


def torch_solve(a: np.ndarray, b: np.ndarray, left=1) -> np.ndarray:
    x = torch.linalg.solve(torch.from_numpy(a.astype(np.float64)),
                           torch.from_numpy(b.astype(np.float64)), left=bool(left))
    return x.numpy().astype(a.dtype)


def product_op(model: onnx.ModelProto) -> str:
    """The op writing X: MatMul (or Squeeze of one) for the batched-MatMul product,
    Reshape for the batch-last Gather + Mul + MatMul product."""
    return next(n.op_type for n in model.graph.node if "output0" in n.output)


# -- the native Solve(A, B; left) form, through the kit ---------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_solve_shapes_sizes_and_opsets(dtype):
    rng = np.random.default_rng(0)
    cases = []
    for n in (1, 2, 3, 4, 5, 8):
        a = matrices(rng, (3,), n, dtype)
        cases += [
            # matrix B of A's batch, k static and small: the batch-last product
            Case([a, rng.normal(size=(3, n, 2)).astype(dtype)], id=f"matrix n={n}"),
            # k dynamic: the MatMul product
            Case([a, rng.normal(size=(3, n, 4)).astype(dtype)], symbolic={0: [0], 1: [0, 2]},
                 more_inputs=[[matrices(rng, (0,), n, dtype), np.zeros((0, n, 4), dtype)]],
                 id=f"dynamic k n={n}"),
            # batched vectors, B.shape == A.shape[:-1]
            Case([a, rng.normal(size=(3, n)).astype(dtype)], output_rank=2,
                 id=f"vectors n={n}"),
            # one vector for every matrix of the batch
            Case([a, rng.normal(size=(n,)).astype(dtype)], output_rank=2, id=f"vector n={n}"),
            # left=0: X A = B
            Case([a, rng.normal(size=(3, 2, n)).astype(dtype)], {"left": 0},
                 id=f"right n={n}"),
        ]
    tolerance = {"atol": 1e-4, "rtol": 1e-4} if dtype == np.float32 else {"atol": 1e-11,
                                                                          "rtol": 1e-10}
    results = check_pattern(Solve(), cases, opsets=[11, 13, 17, NEWEST], domain="custom.ops",
                            oracle=torch_solve, **tolerance)
    for result in results:
        label = result.case.id
        if label.startswith("dynamic k"):
            assert product_op(result.model) == "MatMul", label
        if label.startswith(("matrix", "vectors", "right")):
            assert product_op(result.model) == "Reshape", label


def test_batch_dims_broadcast_like_torch():
    rng = np.random.default_rng(1)
    cases = [
        Case([matrices(rng, (2, 1), 3), rng.normal(size=(4, 3, 2)).astype(np.float32)],
             output_rank=4, id="(2,1,3,3) with (4,3,2)"),
        Case([matrices(rng, (), 5), rng.normal(size=(4, 5, 3)).astype(np.float32)],
             output_rank=3, id="(5,5) with (4,5,3)"),
        Case([matrices(rng, (2,), 4), rng.normal(size=(4, 3)).astype(np.float32)],
             output_rank=3, id="(2,4,4) with (4,3): a matrix, broadcast"),
        Case([matrices(rng, (2, 3), 2), rng.normal(size=(5, 2, 3, 2, 1)).astype(np.float32)],
             output_rank=5, id="(2,3,2,2) with (5,2,3,2,1)"),
    ]
    check_pattern(Solve(), cases, opsets=[13], domain="custom.ops", oracle=torch_solve,
                  atol=1e-4, rtol=1e-4)


def test_extreme_magnitudes():
    rng = np.random.default_rng(2)
    for n, scale in [(3, 1e30), (3, 1e-30), (6, 1e25), (6, 1e-25)]:
        a = matrices(rng, (2,), n, np.float64)
        b = rng.normal(size=(2, n, 1))
        out = decomposer.decompose(solve_model("fallthrough", n, left=True))
        (got,) = run_onnxruntime(out, {"A": (a * scale).astype(np.float32),
                                       "Bm": b.astype(np.float32)})
        want = torch_solve(a, b) / scale
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got * scale, want * scale, rtol=1e-4, atol=1e-5)


# -- torch's fallback forms --------------------------------------------------------------------


def solve_model(form: str, n: int, *, left: bool | None = True, operator="linalg_solve",
                b_dims=("B", "n", 1), opset: int = 13, a_dims=None) -> onnx.ModelProto:
    """One torch fallback node solve(A, Bm, left[, check_errors]) with constant flags."""
    a_dims = a_dims or ["B", n, n]
    nodes = []
    inputs = ["A", "Bm"]
    if left is not None:
        nodes.append(helper.make_node("Constant", [], ["left"], name="left_const",
                                      value=helper.make_tensor("v", TensorProto.BOOL, [],
                                                               [left])))
        inputs.append("left")
    outs = ["X"]
    vector = len(b_dims) in (1, len(a_dims) - 1)
    x_rank = len(a_dims) - 1 if vector else max(len(b_dims), len(a_dims))
    outputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [None] * x_rank)]
    if operator == "linalg_solve_ex":
        nodes.append(helper.make_node("Constant", [], ["check"], name="check_const",
                                      value=helper.make_tensor("v", TensorProto.BOOL, [],
                                                               [False])))
        inputs.append("check")
        outs.append("info")
        outputs.append(helper.make_tensor_value_info("info", TensorProto.INT32,
                                                     [None] * (len(a_dims) - 2)))
    if form == "fallthrough":
        nodes.append(helper.make_node(operator, inputs, outs, name="solve", domain=ATEN))
    else:
        nodes.append(helper.make_node("ATen", inputs, outs, name="solve", domain=ATEN,
                                      operator=operator, overload_name=""))
    graph_inputs = [helper.make_tensor_value_info("A", TensorProto.FLOAT, list(a_dims)),
                    helper.make_tensor_value_info("Bm", TensorProto.FLOAT, list(b_dims))]
    return make_model(nodes, graph_inputs, outputs, opset, extra_opsets=[ATEN])


@pytest.mark.parametrize("form", ["fallthrough", "aten"])
@pytest.mark.parametrize("left", [True, False])
@pytest.mark.parametrize("n", [3, 6])
def test_aten_linalg_solve(form, left, n):
    rng = np.random.default_rng(3)
    b_dims = ("B", n, "K") if left else ("B", "K", n)
    out = decomposer.decompose(solve_model(form, n, left=left, b_dims=b_dims))
    onnx.checker.check_model(out, full_check=True)
    assert not custom_nodes(out)
    for batch, k in [(2, 1), (5, 3)]:
        a = matrices(rng, (batch,), n)
        b = rng.normal(size=(batch, n, k) if left else (batch, k, n)).astype(np.float32)
        (got,) = run_onnxruntime(out, {"A": a, "Bm": b})
        np.testing.assert_allclose(got, torch_solve(a, b, left), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("form", ["fallthrough", "aten"])
@pytest.mark.parametrize("opset", [11, 13, NEWEST])
def test_aten_linalg_solve_ex_info(form, opset):
    n = 3
    out = decomposer.decompose(solve_model(form, n, operator="linalg_solve_ex", opset=opset,
                                           b_dims=("B", n)))
    onnx.checker.check_model(out, full_check=True)
    singular = np.array([[1.0, 1, 3], [2, 2, 6], [1, 1, 1]], np.float32)
    a = np.stack([matrices(np.random.default_rng(4), (), n), singular, np.zeros((3, 3))])
    a = a.astype(np.float32)
    b = np.random.default_rng(5).normal(size=(3, n)).astype(np.float32)
    x, info = run_onnxruntime(out, {"A": a, "Bm": b})
    want, want_info = torch.linalg.solve_ex(torch.from_numpy(a), torch.from_numpy(b))
    np.testing.assert_array_equal(info, want_info.numpy())  # [0, 2, 1]
    np.testing.assert_allclose(x[0], want[0].numpy(), atol=1e-5, rtol=1e-4)
    assert not np.all(np.isfinite(x[1])) and not np.all(np.isfinite(x[2]))


def test_aten_without_left_input_defaults_to_left():
    out = decomposer.decompose(solve_model("aten", 2, left=None))
    rng = np.random.default_rng(6)
    a, b = matrices(rng, (2,), 2), rng.normal(size=(2, 2, 1)).astype(np.float32)
    (got,) = run_onnxruntime(out, {"A": a, "Bm": b})
    np.testing.assert_allclose(got, torch_solve(a, b), atol=1e-5, rtol=1e-4)


# -- what is rejected ------------------------------------------------------------------------


def _native(a_dims, b_dims, b_elem=TensorProto.FLOAT, **attrs) -> onnx.ModelProto:
    node = helper.make_node("Solve", ["A", "Bm"], ["X"], name="solve", domain="custom.ops",
                            **attrs)
    inputs = [helper.make_tensor_value_info("A", TensorProto.FLOAT, a_dims),
              helper.make_tensor_value_info("Bm", b_elem, b_dims)]
    return make_model([node], inputs, [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                                     [None] * len(b_dims))],
                      13, extra_opsets=["custom.ops"])


@pytest.mark.parametrize("model, reason", [
    (lambda: _native(["B", 3, 3], ["B", 3, 2], TensorProto.DOUBLE), "B must have A's dtype"),
    (lambda: _native(["B", 3, 3], ["B", 3], left=0), "left=False needs a matrix B"),
    (lambda: _native(["B", "C", 3, 3], ["X", "Y", 3]), "cannot tell whether B"),
    (lambda: _native(["B", 3, 3], ["B", 4, 2]), "B's size 4 does not match A's 3x3"),
    (lambda: _native(["B", 3, 3], ["B", 3, 2], left=2), "attribute 'left' = 2"),
    (lambda: _native(["B", "n", "n"], ["B", 3, 2]), "matrix size of A is not static"),
], ids=["dtype", "right vector", "ambiguous", "size", "left value", "dynamic n"])
def test_native_rejections(model, reason):
    with pytest.raises(decomposer.UnsupportedNodeError) as info:
        decomposer.decompose(model())
    assert "node 'solve' (custom.ops::Solve)" in str(info.value)
    assert reason in str(info.value)


def test_runtime_left_is_rejected():
    model = solve_model("fallthrough", 3, left=None)
    model.graph.node[0].input.append("flag")
    model.graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    with pytest.raises(decomposer.UnsupportedNodeError) as info:
        decomposer.decompose(model)
    assert "node 'solve' (org.pytorch.aten::linalg_solve)" in str(info.value)
    assert "left (input 3) must be a constant scalar" in str(info.value)


def test_verify_passes():
    model = solve_model("aten", 5, operator="linalg_solve_ex", b_dims=("B", 5, 2))
    rng = np.random.default_rng(7)
    feeds = {"A": matrices(rng, (3,), 5), "Bm": rng.normal(size=(3, 5, 2)).astype(np.float32)}
    report = decomposer.verify(model, decomposer.decompose(model), feeds)
    assert report.passed, report.table()


# -- real torch exports ------------------------------------------------------------------------


class SolveModel(torch.nn.Module):
    def __init__(self, left: bool = True):
        super().__init__()
        self.left = left

    def forward(self, a, b):
        return torch.linalg.solve(a, b, left=self.left) * 2.0


class SolveExModel(torch.nn.Module):
    def forward(self, a, b):
        x, info = torch.linalg.solve_ex(a, b)
        return x, info


@pytest.mark.parametrize("export_type", [OperatorExportTypes.ONNX_FALLTHROUGH,
                                         OperatorExportTypes.ONNX_ATEN_FALLBACK],
                         ids=["fallthrough", "aten_fallback"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("variant", ["left", "right", "vector_ex"])
def test_torch_export_decomposes_and_matches_eager(export_type, opset, variant):
    rng = np.random.default_rng(8)
    n = 4
    module = {"left": SolveModel(True), "right": SolveModel(False),
              "vector_ex": SolveExModel()}[variant].eval()

    def example(batch: int) -> tuple[np.ndarray, np.ndarray]:
        a = matrices(rng, (batch,), n)
        shape = {"left": (batch, n, 3), "right": (batch, 3, n), "vector_ex": (batch, n)}
        return a, rng.normal(size=shape[variant]).astype(np.float32)

    outputs = ["X", "info"] if variant == "vector_ex" else ["X"]
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(map(torch.from_numpy, example(2))), buffer,
                          dynamo=False, opset_version=opset, operator_export_type=export_type,
                          input_names=["A", "Bm"], output_names=outputs,
                          dynamic_axes={name: {0: "batch"} for name in ["A", "Bm", *outputs]})
    original = onnx.load_from_string(buffer.getvalue())
    assert [node.domain for node in original.graph.node if node.domain] == [ATEN]
    out = decomposer.decompose(original)
    onnx.checker.check_model(out, full_check=True)
    assert {i.domain for i in out.opset_import} == {""}
    for batch in (2, 7):
        a, b = example(batch)
        got = run_onnxruntime(out, {"A": a, "Bm": b})
        with torch.no_grad():
            want = module(torch.from_numpy(a), torch.from_numpy(b))
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.numpy().dtype and g.shape == w.shape
            np.testing.assert_allclose(g, w.numpy(), atol=1e-4, rtol=1e-4)


# -- portability (the hook of scripts/portability_cases.py) ---------------------------------


def portability_cases():
    """Solve (custom.ops) with n = 3: batched matrix B (batch and k dynamic) and X A = B;
    static shapes where the batch equals n or k (onnx2tf's tf_converter matched such dims
    by size and got the batch-last product wrong); a batch of rank 2, X A = B without a
    batch and batched vectors (flatbuffer_direct failed those); oracle: torch.linalg.solve."""
    from decomposer.testing import single_node_model

    rng = np.random.default_rng(6)
    left_sets = [[matrices(rng, (2,), 3), rng.normal(size=(2, 3, 2)).astype(np.float32)],
                 [matrices(rng, (3,), 3), rng.normal(size=(3, 3, 4)).astype(np.float32)]]
    right_sets = [[matrices(rng, (2,), 3), rng.normal(size=(2, 2, 3)).astype(np.float32)]]
    cases = []
    for label, sets, attrs, symbolic in [
            ("Solve n=3 left", left_sets, {}, {0: [0], 1: [0, 2]}),
            ("Solve n=3 left=0", right_sets, {"left": 0}, {})]:
        model = single_node_model("Solve", "custom.ops", Case(sets[0], attrs,
                                                               symbolic=symbolic), 17)
        if symbolic:  # A and B share their batch dim (TVM's dynamic build needs to know)
            for graph_input in model.graph.input:
                graph_input.type.tensor_type.shape.dim[0].dim_param = "N"
        cases.append({"id": label, "model": model,
                      "feeds": [{"input0": a, "input1": b} for a, b in sets],
                      "expected": [[torch_solve(a, b, **attrs)] for a, b in sets],
                      "atol": 1e-5})
    for label, a, b, attrs in [
            ("Solve n=3 k=3 batch 3 (static)", matrices(rng, (3,), 3),
             rng.normal(size=(3, 3, 3)), {}),
            ("Solve n=3 left=0 k=3 batch 3 (static)", matrices(rng, (3,), 3),
             rng.normal(size=(3, 3, 3)), {"left": 0}),
            ("Solve n=2 batch (2, 2) (static)", matrices(rng, (2, 2), 2),
             rng.normal(size=(2, 2, 2, 2)), {}),
            ("Solve n=4 left=0 no batch (static)", matrices(rng, (), 4),
             rng.normal(size=(2, 4)), {"left": 0}),
            ("Solve n=3 vectors batch 3 (static)", matrices(rng, (3,), 3),
             rng.normal(size=(3, 3)), {})]:
        b = b.astype(np.float32)
        model = single_node_model("Solve", "custom.ops", Case([a, b], attrs,
                                                               output_rank=b.ndim), 17)
        cases.append({"id": label, "model": model, "feeds": [{"input0": a, "input1": b}],
                      "expected": [[torch_solve(a, b, **attrs)]], "atol": 1e-5})
    return cases


@pytest.mark.parametrize("operator", ["linalg_solve", "linalg_solve_ex"])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_empty_batch_dims_anywhere(operator, n):
    """Batches of rank 2 with a 0 dim after the first ((2, 0) failed, (0, 0) came out with
    the wrong shape while the result went back through Reshape's copy-the-input's-dim 0)."""
    out = decomposer.decompose(solve_model("fallthrough", n, operator=operator,
                                           a_dims=["B", "C", n, n], b_dims=("B", "C", n, 2)))
    rng = np.random.default_rng(3)
    for batch in [(2, 0), (0, 2), (0, 0), (2, 3)]:
        a = (rng.normal(size=(*batch, n, n)) + 3 * np.eye(n)).astype(np.float32)
        rhs = rng.normal(size=(*batch, n, 2)).astype(np.float32)
        got = run_onnxruntime(out, {"A": a, "Bm": rhs})
        want, want_info = torch.linalg.solve_ex(torch.from_numpy(a), torch.from_numpy(rhs))
        assert got[0].shape == want.shape
        np.testing.assert_allclose(got[0], want.numpy(), atol=1e-4, rtol=1e-4)
        if operator == "linalg_solve_ex":
            np.testing.assert_array_equal(got[1], want_info.numpy())
