"""tril / triu / Trilu patterns against torch.tril and torch.triu (the oracle), every form."""

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
from decomposer.patterns.tril_triu import Tril, Trilu, Triu
from decomposer.testing import Case, check_pattern, compare, ir_version_for, run_onnxruntime

NEWEST = onnx.defs.onnx_opset_version()
OPSETS = [11, 13, 14, 17, NEWEST]
ATEN = "org.pytorch.aten"


def torch_triangle(x: np.ndarray, diagonal: int, upper: bool) -> np.ndarray:
    t = torch.from_numpy(np.ascontiguousarray(x))
    return (torch.triu if upper else torch.tril)(t, int(diagonal)).numpy()


def special_values(shape, dtype=np.float32, seed=0) -> np.ndarray:
    """Normal values with NaN, +-inf and -0.0 sprinkled in: all must survive or be zeroed."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape).astype(dtype)
    if x.size and np.issubdtype(dtype, np.floating):
        flat = x.reshape(-1)
        picks = rng.permutation(flat.size)
        for index, value in zip(picks[:4], [np.nan, np.inf, -np.inf, -0.0], strict=False):
            flat[index] = value
    return x


def values_of(dtype, shape, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, shape, endpoint=True, dtype=dtype)
    return special_values(shape, dtype, seed)


@pytest.mark.parametrize("pattern, upper", [(Tril(), False), (Triu(), True)],
                         ids=["tril", "triu"])
def test_native_form_diagonals_shapes_and_opsets(pattern, upper):
    cases = [Case([special_values((2, 3, 4, 5))], {"diagonal": d}, symbolic="all",
                  more_inputs=[[special_values((1, 2, 6, 3), seed=1)],
                               [special_values((2, 1, 0, 4), seed=2)]],
                  id=f"diagonal={d}")
             for d in (0, 1, -1, 3, -4, 100, -100, None)]
    for target in ("portable", "ort"):
        results = check_pattern(pattern, cases, opsets=OPSETS, target=target,
                                oracle=lambda x, diagonal=0: torch_triangle(x, diagonal, upper),
                                atol=0, rtol=0, signed_zeros=True)
        for result in results:
            kinds = {n.op_type for n in result.model.graph.node}
            if result.opset >= 14 and target == "ort":
                assert kinds == {"Trilu", "Constant"}, kinds
            else:  # portable: onnx2torch has no Trilu converter
                assert "Trilu" not in kinds and "Where" in kinds


@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64,
                                   np.float16, np.float64, np.uint16, np.uint64])
@pytest.mark.parametrize("upper", [False, True])
def test_dtypes(dtype, upper):
    pattern = Triu() if upper else Tril()

    def oracle(x, diagonal=0):
        if dtype in (np.uint16, np.uint64):  # torch has no tril for these: numpy's own
            return (np.triu if upper else np.tril)(x, diagonal)
        return torch_triangle(x, diagonal, upper)

    cases = [Case([values_of(dtype, (3, 4, 5))], {"diagonal": d}, symbolic="all",
                  more_inputs=[[values_of(dtype, (2, 6, 2), seed=1)]]) for d in (0, -2, 2)]
    check_pattern(pattern, cases, opsets=[11, 17], oracle=oracle, atol=0, rtol=0,
                  signed_zeros=True)


def test_trilu_in_the_default_domain_below_14_with_a_runtime_k():
    x = special_values((2, 5, 4))
    cases = [Case([x, np.array(k, np.int64)], {"upper": upper}, symbolic="all",
                  more_inputs=[[special_values((3, 2, 6), seed=3), np.array(-k, np.int64)]])
             for k in (0, 2, -1) for upper in (0, 1, None)]

    def oracle(x, k, upper=1):
        return torch_triangle(x, int(np.asarray(k).reshape(())), bool(upper))

    check_pattern(Trilu(), cases, opsets=[11, 13], domain="", oracle=oracle, atol=0, rtol=0,
                  signed_zeros=True)
    # k given as a 1-element 1-D tensor (reshaped to the 0-d k Trilu-14 wants).
    check_pattern(Trilu(), [Case([x, np.array([2], np.int64)], {"upper": 0}, symbolic="all")],
                  opsets=[13, 17], domain="custom.ops", oracle=oracle, atol=0, rtol=0)
    # Without k, and in a custom domain at an opset where Trilu is standard.
    check_pattern(Trilu(), [Case([x], {"upper": 0})], opsets=[11, 17], domain="custom.ops",
                  oracle=lambda x, upper=1: torch_triangle(x, 0, bool(upper)), atol=0, rtol=0)


def aten_model(op: str, form: str, x: np.ndarray, diagonal, opset: int) -> onnx.ModelProto:
    """torch's fallback node: org.pytorch.aten::op(x, diagonal) or ATen(operator=op); an int
    ``diagonal`` is a Constant input, ``"fed"`` makes it a graph input."""
    nodes, inputs = [], [helper.make_tensor_value_info(
        "x", helper.np_dtype_to_tensor_dtype(x.dtype), [f"d{i}" for i in range(x.ndim)])]
    if diagonal == "fed":
        inputs.append(helper.make_tensor_value_info("diagonal", TensorProto.INT64, []))
    else:
        nodes.append(helper.make_node("Constant", [], ["diagonal"],
                                      value=onnx.numpy_helper.from_array(
                                          np.array(diagonal, np.int64))))
    if form == "aten":
        nodes.append(helper.make_node("ATen", ["x", "diagonal"], ["y"], name="tri",
                                      domain=ATEN, operator=op, overload_name=""))
    else:
        nodes.append(helper.make_node(op, ["x", "diagonal"], ["y"], name="tri", domain=ATEN))
    graph = helper.make_graph(nodes, "aten", inputs, [helper.make_tensor_value_info(
        "y", helper.np_dtype_to_tensor_dtype(x.dtype), [None] * x.ndim)])
    return helper.make_model(graph, ir_version=ir_version_for(opset), opset_imports=[
        helper.make_opsetid("", opset), helper.make_opsetid(ATEN, 1)])


@pytest.mark.parametrize("form", ["fallthrough", "aten"])
@pytest.mark.parametrize("op", ["tril", "triu"])
@pytest.mark.parametrize("opset", [11, 13, 17])
def test_aten_forms_constant_and_runtime_diagonal(form, op, opset):
    pattern = Triu() if op == "triu" else Tril()
    for diagonal in (0, 2, -3, "fed"):
        out = decomposer.decompose(aten_model(op, form, special_values((2, 4, 6)), diagonal,
                                              opset))
        onnx.checker.check_model(out, full_check=True)
        assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
        for shape, fed in [((2, 4, 6), -1), ((3, 5, 2), 1), ((1, 0, 3), 0)]:
            x = special_values(shape, seed=len(shape))
            feeds = {"x": x}
            value = diagonal
            if diagonal == "fed":
                feeds["diagonal"] = np.array(fed, np.int64)
                value = fed
            (got,) = run_onnxruntime(out, feeds)
            compare(got, torch_triangle(x, value, op == "triu"), f"{op} d={value}",
                    atol=0, rtol=0, signed_zeros=True)
            reference = pattern.evaluate(pattern.spelling(op), [x, np.array(value)], {})[0]
            compare(got, reference, "reference", atol=0, rtol=0, signed_zeros=True)


class TriangleModel(torch.nn.Module):
    def __init__(self, upper: bool, runtime_diagonal: bool) -> None:
        super().__init__()
        self.upper, self.runtime_diagonal = upper, runtime_diagonal

    def forward(self, x):
        op = torch.triu if self.upper else torch.tril
        diagonal = x.shape[-1] - 3 if self.runtime_diagonal else -1
        return op(torch.relu(x) - 0.5, diagonal) * 2.0


@pytest.mark.parametrize("export_type", [OperatorExportTypes.ONNX_FALLTHROUGH,
                                         OperatorExportTypes.ONNX_ATEN_FALLBACK],
                         ids=["fallthrough", "aten_fallback"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("upper", [False, True], ids=["tril", "triu"])
def test_torch_export_decomposes_and_matches_eager(export_type, opset, upper):
    for runtime_diagonal in (False, True):
        model = TriangleModel(upper, runtime_diagonal).eval()
        buffer = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (torch.randn(2, 3, 5, 6),), buffer, dynamo=False,
                              opset_version=opset, operator_export_type=export_type,
                              input_names=["x"], output_names=["y"],
                              dynamic_axes={"x": {0: "n", 2: "h", 3: "w"}})
        original = onnx.load_from_string(buffer.getvalue())
        assert [n for n in original.graph.node if n.domain == ATEN], "no fallback node"
        out = decomposer.decompose(original)
        onnx.checker.check_model(out, full_check=True)
        assert {i.domain for i in out.opset_import} <= {"", "ai.onnx"}
        for shape in [(2, 3, 5, 6), (1, 3, 7, 4), (3, 3, 2, 9)]:
            x = np.random.default_rng(sum(shape)).normal(size=shape).astype(np.float32)
            (got,) = run_onnxruntime(out, {"x": x})
            with torch.no_grad():
                expected = model(torch.from_numpy(x)).numpy()
            compare(got, expected, f"export shape {shape}", atol=0, rtol=0)


def _single_node(node: onnx.NodeProto, inputs, opset: int = 13, extra=()) -> onnx.ModelProto:
    graph = helper.make_graph([*extra, node], "bad", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["r"])])
    return helper.make_model(graph, ir_version=ir_version_for(opset), opset_imports=[
        helper.make_opsetid("", opset), helper.make_opsetid(ATEN, 1),
        helper.make_opsetid("custom.ops", 1)])


X4 = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a", "b", "c", "d"])


@pytest.mark.parametrize("node, inputs, extra, reason", [
    (helper.make_node("Tril", ["x"], ["y"], name="tri", domain="custom.ops"),
     [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["a"])], (), "rank 1"),
    (helper.make_node("tril", ["x", "k"], ["y"], name="tri", domain=ATEN), [X4],
     [helper.make_node("Constant", [], ["k"], value_float=1.5)], "diagonal must be one integer"),
    (helper.make_node("triu", ["x", "k"], ["y"], name="tri", domain=ATEN),
     [X4, helper.make_tensor_value_info("k", TensorProto.FLOAT, [])], (),
     "must be int32 or int64, got float"),
    (helper.make_node("ATen", ["x", "k"], ["y"], name="tri", domain=ATEN, operator="tril"),
     [X4, helper.make_tensor_value_info("k", TensorProto.INT64, [2])], (),
     "must be a scalar"),
    (helper.make_node("Triu", ["x"], ["y"], name="tri", domain="custom.ops", diagonal=1.0),
     [X4], (), "attribute 'diagonal' must be int"),
    (helper.make_node("Tril", ["x"], ["y"], name="tri", domain="custom.ops"),
     [helper.make_tensor_value_info("x", TensorProto.COMPLEX64, ["a", "b"])], (),
     "complex64 is not supported"),
    (helper.make_node("tril", ["x"], ["y"], name="tri", domain=ATEN), [X4], (),
     "expected 2 inputs"),
    (helper.make_node("Trilu", ["x"], ["y"], name="tri", domain="custom.ops", upper=2), [X4],
     (), "attribute 'upper' = 2 is not one of"),
])
def test_bad_forms_are_rejected_with_the_node_named(node, inputs, extra, reason):
    with pytest.raises(decomposer.UnsupportedNodeError) as info:
        decomposer.decompose(_single_node(node, inputs, extra=extra))
    message = str(info.value)
    assert "node 'tri'" in message and reason in message, message


# -- portability (the hook of scripts/portability_cases.py) ---------------------------------


def portability_cases():
    """Tril(diagonal=1) and Triu(diagonal=-1) (custom.ops), every dim dynamic; oracle:
    torch.tril / torch.triu."""
    from decomposer.testing import single_node_model

    cases = []
    for op, diagonal, upper in [("Tril", 1, False), ("Triu", -1, True)]:
        xs = [np.random.default_rng(seed).normal(size=s).astype(np.float32)
              for seed, s in enumerate([(2, 4, 5), (3, 6, 3)])]
        model = single_node_model(op, "custom.ops",
                                  Case([xs[0]], {"diagonal": diagonal}, symbolic="all"), 17)
        cases.append({"id": f"{op} diagonal={diagonal}", "model": model,
                      "feeds": [{"input0": x} for x in xs],
                      "expected": [[torch_triangle(x, diagonal, upper)] for x in xs],
                      "atol": 0.0})
    return cases
