"""Rot90AndScale against torch.rot90(x, k', dims=(-2, -1)) * scale, through the pattern kit."""

from __future__ import annotations

import time
from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.rot90_and_scale import Rot90AndScale
from decomposer.testing import check_pattern

from _helpers import make_model, run_onnxruntime
from _rotation_cases import (
    KS,
    OPSETS,
    case,
    expected_ops,
    inputs,
    negative_step_slices,
    torch_rot_scale,
)


def oracle(x, k=1, scale=1.0, clockwise="no"):
    turns = -k if clockwise.strip().lower() in ("yes", "true") else k
    return torch_rot_scale(x, turns, (-2, -1), scale)


def new_ops(model) -> Counter:
    return Counter(n.op_type for n in model.graph.node if n.op_type != "Constant")


@pytest.mark.parametrize("domain", ["", "custom.ops"])
@pytest.mark.parametrize("clockwise", ["yes", "no", None])
def test_k_values_directions_and_opsets(domain, clockwise):
    cases = [case({"k": k, "scale": 1.25, "clockwise": clockwise}, label=f"k={k}") for k in KS]
    results = check_pattern(Rot90AndScale(), cases, opsets=OPSETS, domain=domain,
                            oracle=oracle, atol=1e-6, rtol=0)
    for result in results:
        turns = result.case.attrs["k"] * (-1 if clockwise == "yes" else 1) % 4
        assert new_ops(result.model) == expected_ops(turns, scaled=True)
        assert not negative_step_slices(result.model)  # portable: onnx2tf mis-reads them


@pytest.mark.parametrize("k", [1, 2, 3])
def test_target_ort_keeps_the_double_flip_slice_for_half_turns(k):
    results = check_pattern(Rot90AndScale(), [case({"k": k, "scale": 1.25})], opsets=[11, 18],
                            oracle=oracle, atol=1e-6, rtol=0, target="ort")
    for result in results:
        assert new_ops(result.model) == expected_ops(k, scaled=True, target="ort")


def test_all_attributes_absent_means_k1_scale1_counter_clockwise():
    (result,) = check_pattern(Rot90AndScale(), [case({})], opsets=[20], domain="",
                              oracle=oracle, atol=0, rtol=0)
    assert new_ops(result.model) == expected_ops(1, scaled=False)


def test_k_zero_scale_one_is_an_identity():
    (result,) = check_pattern(Rot90AndScale(), [case({"k": 4, "scale": 1.0})], opsets=[13],
                              oracle=oracle, atol=0, rtol=0)
    assert new_ops(result.model) == Counter({"Identity": 1})


@pytest.mark.parametrize("spelling", ["YES", " True ", "false", "No"])
def test_clockwise_spellings(spelling):
    check_pattern(Rot90AndScale(), [case({"k": 1, "clockwise": spelling})], opsets=[17],
                  oracle=oracle, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32, np.int64])
def test_dtypes_preserved(dtype):
    check_pattern(Rot90AndScale(), [case({"k": 3, "scale": 2.0}, dtype=dtype)],
                  opsets=[11, 18], oracle=oracle, atol=0, rtol=0)


@pytest.mark.parametrize("shape", [(5, 7), (2, 5, 7), (1, 2, 3, 4, 6)])
def test_ranks(shape):
    check_pattern(Rot90AndScale(), [case({"k": 1, "scale": 0.5}, shapes=[shape])],
                  opsets=[13], oracle=oracle, atol=1e-6, rtol=0)


def _single(attrs, x_type=TensorProto.FLOAT, dims=("N", "C", "H", "W"), opset=18):
    """One Rot90AndScale node; ``dims`` None feeds it from a Reshape to a run-time shape,
    so its input's rank is unknown."""
    node = helper.make_node("Rot90AndScale", ["x"], ["y"], name="rot", domain="custom.ops",
                            **attrs)
    if dims is None:
        inputs = [helper.make_tensor_value_info("flat", x_type, ["A"]),
                  helper.make_tensor_value_info("shape", TensorProto.INT64, ["R"])]
        nodes = [helper.make_node("Reshape", ["flat", "shape"], ["x"]), node]
    else:
        inputs, nodes = [helper.make_tensor_value_info("x", x_type, list(dims))], [node]
    return make_model(nodes, inputs, [helper.make_tensor_value_info("y", x_type, [None] * 4)],
                      opset, extra_opsets=["custom.ops"])


@pytest.mark.parametrize("attrs, x_type, dims, reason", [
    ({"clockwise": "maybe"}, TensorProto.FLOAT, ("N", "C", "H", "W"),
     "attribute 'clockwise' = 'maybe' is not one of"),
    ({"k": 1.5}, TensorProto.FLOAT, ("N", "C", "H", "W"), "attribute 'k' must be int"),
    ({"scale": 1.5}, TensorProto.INT32, ("N", "C", "H", "W"), "scale 1.5 is not an integer"),
    ({}, TensorProto.FLOAT, None, "rank of input 'x' is unknown"),
    ({}, TensorProto.FLOAT, ("N",), "has rank 1"),
    ({"angle": 90}, TensorProto.FLOAT, ("N", "C", "H", "W"), "unknown attribute(s) ['angle']"),
])
def test_bad_attributes_and_inputs_name_the_node(attrs, x_type, dims, reason):
    with pytest.raises(decomposer.UnsupportedNodeError) as info:
        decomposer.decompose(_single(attrs, x_type, dims))
    message = str(info.value)
    assert "node 'rot' (custom.ops::Rot90AndScale)" in message
    assert reason in message


def test_rotation_inside_loop_body_rotates_carried_tensor():
    body = helper.make_graph(
        [helper.make_node("Rot90AndScale", ["x_in"], ["x_out"], name="rot_in_loop",
                          domain="custom.ops", k=1, scale=2.0, clockwise="yes"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going")],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, ["N", "C", "S", "S"])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, ["N", "C", "S", "S"])])
    loop = helper.make_node("Loop", ["trips", "", "x"], ["x_final"], name="loop", body=body)
    model = make_model(
        [loop], [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "C", "S", "S"]),
                 helper.make_tensor_value_info("trips", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("x_final", TensorProto.FLOAT, ["N", "C", "S", "S"])],
        16, extra_opsets=["custom.ops"])
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    (x,) = inputs(shapes=[(2, 3, 4, 4)])[0]
    (got,) = run_onnxruntime(out, {"x": x, "trips": np.array(3)})
    expected = torch.from_numpy(x)
    for _ in range(3):
        expected = torch.rot90(expected, -1, [-2, -1]) * 2.0
    np.testing.assert_allclose(got, expected.numpy(), atol=1e-6, rtol=0)


def test_300_chained_nodes_in_one_run():
    nodes, ks = [], []
    for index in range(300):
        k = index % 4
        ks.append(k)
        nodes.append(helper.make_node("Rot90AndScale", [f"t{index}"], [f"t{index + 1}"],
                                      name=f"rot{index}", domain="custom.ops", k=k,
                                      scale=1.0 if index % 7 else -1.0))
    x_info = helper.make_tensor_value_info("t0", TensorProto.FLOAT, ["N", "C", "S", "S"])
    y_info = helper.make_tensor_value_info("t300", TensorProto.FLOAT, ["N", "C", "S", "S"])
    model = make_model(nodes, [x_info], [y_info], 17, extra_opsets=["custom.ops"])
    start = time.perf_counter()
    out, report = decomposer.decompose_with_report(model)
    elapsed = time.perf_counter() - start
    print(f"300 chained rotations decomposed in {elapsed:.3f} s")
    assert report.counts == {"Rot90AndScale": 300}
    assert not [n for n in out.graph.node if n.domain]
    (x,) = inputs(shapes=[(1, 2, 5, 5)])[0]
    (got,) = run_onnxruntime(out, {"t0": x})
    expected = torch.from_numpy(x)
    for index, k in enumerate(ks):
        expected = torch.rot90(expected, k, [-2, -1]) * (1.0 if index % 7 else -1.0)
    np.testing.assert_array_equal(got, expected.numpy())
