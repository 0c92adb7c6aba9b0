"""CumProd below opset 26 against torch.cumprod (exclusive and reverse written with flips
and a shift around it), through the pattern kit and through ``--target-opset``."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.cum_prod import SEQUENTIAL_LIMIT, CumProd
from decomposer.testing import Case, check_pattern, run_onnxruntime


def torch_cumprod(x, axis, exclusive=0, reverse=0):
    t = torch.from_numpy(np.ascontiguousarray(x))
    if reverse:
        t = torch.flip(t, [axis])
    y = torch.cumprod(t, dim=axis)
    if exclusive:
        ones = torch.ones_like(y.narrow(axis, 0, 1))
        y = torch.cat([ones, y.narrow(axis, 0, y.shape[axis] - 1)], dim=axis)
    if reverse:
        y = torch.flip(y, [axis])
    return y.numpy().astype(x.dtype)  # torch promotes int32 products to int64


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_against_torch(dtype, exclusive, reverse):
    rng = np.random.default_rng(3)

    def values(shape):
        if np.issubdtype(dtype, np.integer):
            return rng.integers(-3, 4, shape).astype(dtype)
        return rng.uniform(0.5, 1.5, shape).astype(dtype) * rng.choice([-1, 1], shape)

    cases = [Case([values((2, 7, 3)), np.array(axis, np.int64)], {"exclusive": exclusive,
                                                                  "reverse": reverse},
                  constant_inputs=[1], symbolic={0: [a for a in range(3) if a != axis % 3]},
                  more_inputs=[[values((5, 7, 1)), np.array(axis, np.int64)]],
                  id=f"axis={axis}")
             for axis in (1, -2)]
    cases.append(Case([values((9,)), np.array(0, np.int64)], {"exclusive": exclusive,
                                                             "reverse": reverse},
                      constant_inputs=[1], id="length 9"))
    # past SEQUENTIAL_LIMIT: the doubling scan; and a length of one
    cases.append(Case([values((2, 300)), np.array(1, np.int64)], {"exclusive": exclusive,
                                                                 "reverse": reverse},
                      constant_inputs=[1], id="length 300"))
    cases.append(Case([values((3, 1)), np.array(1, np.int64)], {"exclusive": exclusive,
                                                               "reverse": reverse},
                      constant_inputs=[1], id="length 1"))
    tolerance = 0 if np.issubdtype(dtype, np.integer) else 1e-6
    check_pattern(CumProd(), cases, opsets=[11, 13, 17, 25], domain="",
                  oracle=lambda x, axis, exclusive=0, reverse=0: torch_cumprod(
                      x, int(axis), exclusive, reverse), atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("reverse", [0, 1])
def test_unrolled_scan_equals_numpy_bit_for_bit(reverse):
    """Up to SEQUENTIAL_LIMIT steps the products are taken left to right, numpy's order
    (torch's kernel differs from both in the last bit)."""
    assert SEQUENTIAL_LIMIT >= 200
    rng = np.random.default_rng(11)
    data = rng.uniform(0.9, 1.1, (4, 200, 3)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 200, 3])
    graph = helper.make_graph(
        [helper.make_node("CumProd", ["x", "axis"], ["y"], reverse=reverse)], "g", [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 200, 3])],
        [helper.make_tensor("axis", TensorProto.INT64, [], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    (got,) = run_onnxruntime(decomposer.decompose(model, target_opset=17), {"x": data})
    flipped = np.flip(data, 1) if reverse else data
    sequential = np.cumprod(flipped, axis=1)
    np.testing.assert_array_equal(got, np.flip(sequential, 1) if reverse else sequential)
    np.testing.assert_allclose(got, torch_cumprod(data, 1, reverse=reverse), rtol=1e-6)


def test_run_time_axis_is_refused_with_the_reason():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    axis = helper.make_tensor_value_info("axis", TensorProto.INT64, [])
    graph = helper.make_graph([helper.make_node("CumProd", ["x", "axis"], ["y"], name="cp")],
                              "g", [x, axis], [helper.make_tensor_value_info(
                                  "y", TensorProto.FLOAT, [3, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    with pytest.raises(decomposer.UnsupportedNodeError, match="axis must be a constant"):
        decomposer.decompose(model, target_opset=17)


def test_target_opset_from_26():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])
    graph = helper.make_graph(
        [helper.make_node("CumProd", ["x", "axis"], ["y"], name="cp", reverse=1)], "g", [x],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6])],
        [helper.make_tensor("axis", TensorProto.INT64, [], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26)])
    out = decomposer.decompose(model, target_opset=13)
    onnx.checker.check_model(out, full_check=True)
    data = np.random.default_rng(0).uniform(0.5, 2, (4, 6)).astype(np.float32)
    (got,) = run_onnxruntime(out, {"x": data})
    np.testing.assert_allclose(got, torch_cumprod(data, 1, reverse=1), rtol=1e-6)


def portability_cases():
    """CumProd (opset 26) at 17, exclusive and reversed, torch as the oracle."""
    rng = np.random.default_rng(12)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 6])
    graph = helper.make_graph(
        [helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=1, reverse=1)], "cp",
        [x], [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 6])],
        [helper.make_tensor("axis", TensorProto.INT64, [], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inputs = [rng.uniform(0.5, 1.5, (rows, 6)).astype(np.float32) for rows in (3, 1)]
    return [{"id": "CumProd below 26", "model": model, "feeds": [{"x": a} for a in inputs],
             "expected": [[torch_cumprod(a, 1, 1, 1)] for a in inputs], "atol": 1e-5}]
