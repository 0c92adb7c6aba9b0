"""Rot90 pattern (torch.rot90 over any pair of axes) against torch.rot90, every form."""

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
from decomposer.patterns.rot90 import Rot90
from decomposer.testing import Case, check_pattern, compare, ir_version_for, run_onnxruntime

NEWEST = onnx.defs.onnx_opset_version()
ATEN = "org.pytorch.aten"
DIMS = [(0, 1), (1, 0), (1, -1), (-1, 1), (2, 3), (3, 2), (0, 3), (-4, -2)]


def torch_rot90(x: np.ndarray, k: int = 1, dims=(0, 1)) -> np.ndarray:
    return torch.rot90(torch.from_numpy(np.ascontiguousarray(x)), int(k), list(dims)).numpy()


def values(shape, dtype=np.float32, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(-100, 100, shape).astype(dtype)
    x = rng.normal(size=shape).astype(dtype)
    if x.size > 3:
        x.reshape(-1)[:3] = [np.nan, -0.0, np.inf]
    return x


@pytest.mark.parametrize("dims", DIMS, ids=[f"dims={a},{b}" for a, b in DIMS])
def test_every_k_and_pair_of_dims(dims):
    cases = [Case([values((2, 3, 4, 5))], {"k": k, "dims": list(dims)}, symbolic="all",
                  more_inputs=[[values((3, 1, 2, 6), seed=1)], [values((2, 0, 3, 1), seed=2)]],
                  id=f"k={k}") for k in (0, 1, 2, 3, -1, 5, -6)]
    results = check_pattern(Rot90(), cases, opsets=[11, 13, NEWEST], oracle=torch_rot90,
                            atol=0, rtol=0, signed_zeros=True)
    last_two = {dims[0] % 4, dims[1] % 4} == {2, 3}
    for result in results:
        kinds = [n.op_type for n in result.model.graph.node if n.op_type != "Constant"]
        if result.case.attrs["k"] % 4 == 0:
            assert kinds == ["Identity"]
        elif not last_two:  # the general form: reversed Gathers and a Transpose, no Slice
            assert "Slice" not in kinds
            assert kinds.count("Gather") >= 2  # the flip (plus the length read from Shape)


def test_target_ort_flips_both_axes_with_one_slice():
    cases = [Case([values((2, 3, 4, 5))], {"k": 2, "dims": list(dims)}, symbolic="all")
             for dims in ((1, 3), (0, 2))]
    for result in check_pattern(Rot90(), cases, opsets=[13], oracle=torch_rot90, atol=0,
                                rtol=0, signed_zeros=True, target="ort"):
        assert [n for n in result.op_types if n != "Constant"] == ["Slice"]


def test_default_attributes_are_torchs():
    (result,) = check_pattern(Rot90(), [Case([values((3, 4, 2))])], opsets=[17],
                              oracle=torch_rot90, atol=0, rtol=0)
    assert "Transpose" in result.op_types


@pytest.mark.parametrize("shape, dims", [((5, 7), (0, 1)), ((5, 7), (1, 0)), ((2, 5, 7), (0, 2)),
                                         ((1, 2, 3, 4, 6), (1, 3)), ((1, 2, 3, 4, 6), (4, 0))])
@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.int64, np.float16, np.float64])
def test_ranks_and_dtypes(shape, dims, dtype):
    cases = [Case([values(shape, dtype)], {"k": k, "dims": list(dims)}, symbolic="all")
             for k in (1, 2, 3)]
    check_pattern(Rot90(), cases, opsets=[11, 17], oracle=torch_rot90, atol=0, rtol=0,
                  signed_zeros=True)


def aten_model(form: str, x: np.ndarray, k, dims, opset: int) -> onnx.ModelProto:
    """torch's fallback node rot90(x, k, dims) with constant k and dims; a value of "fed"
    makes that argument a graph input instead (a bad form)."""
    nodes, inputs = [], [helper.make_tensor_value_info(
        "x", helper.np_dtype_to_tensor_dtype(x.dtype), [f"d{i}" for i in range(x.ndim)])]
    for name, value, shape in (("k", k, []), ("dims", dims, [2])):
        if isinstance(value, str) and value == "fed":
            inputs.append(helper.make_tensor_value_info(name, TensorProto.INT64, shape))
        else:
            nodes.append(helper.make_node("Constant", [], [name], value=onnx.numpy_helper
                                          .from_array(np.array(value, np.int64))))
    if form == "aten":
        nodes.append(helper.make_node("ATen", ["x", "k", "dims"], ["y"], name="rot",
                                      domain=ATEN, operator="rot90", overload_name=""))
    else:
        nodes.append(helper.make_node("rot90", ["x", "k", "dims"], ["y"], name="rot",
                                      domain=ATEN))
    graph = helper.make_graph(nodes, "aten", inputs, [helper.make_tensor_value_info(
        "y", helper.np_dtype_to_tensor_dtype(x.dtype), [None] * x.ndim)])
    return helper.make_model(graph, ir_version=ir_version_for(opset), opset_imports=[
        helper.make_opsetid("", opset), helper.make_opsetid(ATEN, 1)])


@pytest.mark.parametrize("form", ["fallthrough", "aten"])
@pytest.mark.parametrize("opset", [11, 13, 17])
def test_aten_forms(form, opset):
    for k, dims in [(1, (0, 1)), (3, (1, -1)), (2, (2, 0)), (-1, (-1, -2)), (4, (0, 2))]:
        out = decomposer.decompose(aten_model(form, values((2, 3, 4)), k, dims, opset))
        onnx.checker.check_model(out, full_check=True)
        assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
        for shape in [(2, 3, 4), (5, 1, 2), (0, 2, 3)]:
            x = values(shape, seed=sum(shape))
            (got,) = run_onnxruntime(out, {"x": x})
            compare(got, torch_rot90(x, k, dims), f"k={k} dims={dims}", atol=0, rtol=0,
                    signed_zeros=True)
            reference = Rot90().evaluate(Rot90().spelling("rot90"),
                                         [x, np.array(k), np.array(dims)], {})[0]
            compare(got, reference, "reference", atol=0, rtol=0, signed_zeros=True)


class RotateModel(torch.nn.Module):
    def __init__(self, k: int, dims) -> None:
        super().__init__()
        self.k, self.dims = k, list(dims)

    def forward(self, x):
        return torch.rot90(x * 2.0, self.k, self.dims) + 1.0


@pytest.mark.parametrize("export_type", [OperatorExportTypes.ONNX_FALLTHROUGH,
                                         OperatorExportTypes.ONNX_ATEN_FALLBACK],
                         ids=["fallthrough", "aten_fallback"])
@pytest.mark.parametrize("opset", [11, 13])
def test_torch_export_decomposes_and_matches_eager(export_type, opset):
    for k, dims in [(1, (1, -1)), (3, (0, 2)), (2, (-1, -2))]:
        model = RotateModel(k, dims).eval()
        buffer = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (torch.randn(2, 3, 5, 6),), buffer, dynamo=False,
                              opset_version=opset, operator_export_type=export_type,
                              input_names=["x"], output_names=["y"],
                              dynamic_axes={"x": {0: "n", 1: "c", 2: "h", 3: "w"}})
        original = onnx.load_from_string(buffer.getvalue())
        assert [n for n in original.graph.node if n.domain == ATEN], "no fallback node"
        out = decomposer.decompose(original)
        onnx.checker.check_model(out, full_check=True)
        assert {i.domain for i in out.opset_import} <= {"", "ai.onnx"}
        for shape in [(2, 3, 5, 6), (1, 4, 7, 2), (3, 2, 1, 5)]:
            x = np.random.default_rng(sum(shape)).normal(size=shape).astype(np.float32)
            (got,) = run_onnxruntime(out, {"x": x})
            with torch.no_grad():
                expected = model(torch.from_numpy(x)).numpy()
            compare(got, expected, f"k={k} dims={dims} shape {shape}", atol=0, rtol=0)


@pytest.mark.parametrize("k, dims, x_dims, reason", [
    ("fed", (0, 1), ["a", "b", "c"], "k (input 2) must be a constant scalar"),
    (1, "fed", ["a", "b", "c"], "dims (input 3) must be a constant"),
    (1.5, (0, 1), ["a", "b", "c"], "k (input 2) must be an integer or bool, got float"),
    (1, (0, 1, 2), ["a", "b", "c"], "dims must name exactly 2 axes"),
    (1, (1, -2), ["a", "b", "c"], "name the same axis twice"),
    (1, (0, 3), ["a", "b", "c"], "out of range for rank 3"),
    (1, (0, 1), ["a"], "has rank 1"),
    (1, (0, 1), None, "rank of input 'x' is unknown"),
])
def test_bad_forms_are_rejected_with_the_node_named(k, dims, x_dims, reason):
    if x_dims is None:  # x from a Reshape to a run-time shape: its rank is unknown
        nodes = [helper.make_node("Reshape", ["flat", "shape"], ["x"])]
        inputs = [helper.make_tensor_value_info("flat", TensorProto.FLOAT, ["A"]),
                  helper.make_tensor_value_info("shape", TensorProto.INT64, ["R"])]
    else:
        nodes, inputs = [], [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)]
    for name, value in (("k", k), ("dims", dims)):
        if isinstance(value, str):
            inputs.append(helper.make_tensor_value_info(name, TensorProto.INT64,
                                                        [] if name == "k" else [2]))
        else:
            array = np.array(value, np.float32 if isinstance(value, float) else np.int64)
            nodes.append(helper.make_node("Constant", [], [name],
                                          value=onnx.numpy_helper.from_array(array)))
    nodes.append(helper.make_node("rot90", ["x", "k", "dims"], ["y"], name="rot", domain=ATEN))
    graph = helper.make_graph(nodes, "bad", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["r"])])
    model = helper.make_model(graph, ir_version=ir_version_for(13), opset_imports=[
        helper.make_opsetid("", 13), helper.make_opsetid(ATEN, 1)])
    with pytest.raises(decomposer.UnsupportedNodeError) as info:
        decomposer.decompose(model)
    message = str(info.value)
    assert "node 'rot'" in message and reason in message, message


def test_native_bad_dims_attribute():
    node = helper.make_node("Rot90", ["x"], ["y"], name="rot", domain="custom.ops", k=1,
                            dims=[2, 2])
    graph = helper.make_graph([node], "bad", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["a", "b", "c"])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, ["a", "b", "c"])])
    model = helper.make_model(graph, ir_version=ir_version_for(13), opset_imports=[
        helper.make_opsetid("", 13), helper.make_opsetid("custom.ops", 1)])
    with pytest.raises(decomposer.UnsupportedNodeError, match="name the same axis twice"):
        decomposer.decompose(model)


# -- portability (the hook of scripts/portability_cases.py) ---------------------------------


def portability_cases():
    """Rot90 nodes (custom.ops), every dim dynamic; oracle: torch.rot90."""
    from decomposer.testing import single_node_model

    cases = []
    for k, dims, shapes in [(1, (0, 1), [(2, 3, 4), (3, 5, 2)]),
                            (2, (-2, -1), [(2, 3, 4, 5), (1, 2, 3, 6)])]:
        xs = [np.random.default_rng(seed).normal(size=s).astype(np.float32)
              for seed, s in enumerate(shapes)]
        model = single_node_model("Rot90", "custom.ops",
                                  Case([xs[0]], {"k": k, "dims": list(dims)}, symbolic="all"),
                                  17)
        cases.append({"id": f"Rot90 k={k} dims={dims}", "model": model,
                      "feeds": [{"input0": x} for x in xs],
                      "expected": [[torch_rot90(x, k, dims)] for x in xs], "atol": 0.0})
    return cases
