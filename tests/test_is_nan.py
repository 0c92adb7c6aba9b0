"""IsNaN lowered to comparisons (``--lower IsNaN``, the MNN target). Oracles: numpy's isnan
through the kit (ONNX Runtime, OpenVINO, TVM) and ONNX Runtime's own IsNaN kernel; the
portability case runs it on every engine of the suite."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.is_nan import IsNaN
from decomposer.testing import Case, check_pattern, run_onnxruntime


def _values(dtype) -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((3, 7)).astype(dtype)
    x[0, ::2] = np.nan
    x[1, 1], x[1, 2], x[2, 3] = np.inf, -np.inf, -0.0
    return x


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_against_numpy_on_every_engine(dtype):
    cases = [Case([_values(dtype)], symbolic="all", output_dtype=np.bool_,
                  more_inputs=[[np.full((1, 2), np.nan, dtype)]])]
    engines = ("ort", "openvino", "tvm") if dtype == np.float32 else ("ort",)
    check_pattern(IsNaN(), cases, opsets=[11, 13, 20], domain="",
                  oracle=lambda x: np.isnan(x), atol=0, rtol=0, engines=engines)


def test_equals_onnx_runtime_kernel():
    graph = helper.make_graph([helper.make_node("IsNaN", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 7])],
                              [helper.make_tensor_value_info("y", TensorProto.BOOL, ["N", 7])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    out = decomposer.decompose(model, lower=["IsNaN"])
    onnx.checker.check_model(out, full_check=True)
    assert "IsNaN" not in {n.op_type for n in out.graph.node}
    x = _values(np.float32)
    np.testing.assert_array_equal(run_onnxruntime(out, {"x": x})[0],
                                  run_onnxruntime(model, {"x": x})[0])


def portability_cases():
    """NaN, infinities, signed zeros and ordinary values, lowered; numpy's isnan the oracle
    (MNN's Equal and OpenVINO's Less each miss NaN: the form needs both tests)."""
    x = _values(np.float32)
    graph = helper.make_graph([helper.make_node("IsNaN", ["x"], ["y"])], "is_nan",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 7])],
                              [helper.make_tensor_value_info("y", TensorProto.BOOL, ["N", 7])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return [{"id": "IsNaN, lowered", "model": model, "feeds": [{"x": x}],
             "expected": [[np.isnan(x)]], "atol": 0, "lower": ["IsNaN"]}]
