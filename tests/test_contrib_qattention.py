"""ONNX Runtime's QAttention and QEmbedLayerNormalization, decomposed, against ONNX Runtime's
own kernels on the original node: no mask, 1-D key lengths, 2-D raw masks, unidirectional,
past/present, per-tensor and per-column weight scales, dynamic batch and sequence."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

import decomposer

HIDDEN, HEADS = 16, 4


def _run(model, feeds):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"]).run(None, feeds)


def _qattention(mask, per_column, unidirectional, past, seed):
    rng = np.random.default_rng(seed)
    weight_scale = rng.uniform(0.001, 0.01, 3 * HIDDEN).astype(np.float32) if per_column \
        else np.array(0.005, np.float32)
    initializers = [
        nh.from_array(rng.integers(-128, 128, (HIDDEN, 3 * HIDDEN)).astype(np.int8), "w"),
        nh.from_array(rng.standard_normal(3 * HIDDEN).astype(np.float32), "b"),
        nh.from_array(weight_scale, "ws"), nh.from_array(np.array(3, np.int8), "wz")]
    names = ["x", "w", "b", "xs", "ws", "mask" if mask else "", "xz", "wz"]
    inputs = [helper.make_tensor_value_info("x", TensorProto.UINT8, ["B", "S", HIDDEN]),
              helper.make_tensor_value_info("xs", TensorProto.FLOAT, []),
              helper.make_tensor_value_info("xz", TensorProto.UINT8, [])]
    if mask == "lengths":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, ["B"]))
    elif mask == "raw":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.INT32, ["B", "S"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", HIDDEN])]
    node_outputs = ["y"]
    if past:
        names.append("past")
        inputs.append(helper.make_tensor_value_info(
            "past", TensorProto.FLOAT, [2, "B", HEADS, "P", HIDDEN // HEADS]))
        node_outputs.append("present")
        outputs.append(helper.make_tensor_value_info(
            "present", TensorProto.FLOAT, [2, "B", HEADS, None, HIDDEN // HEADS]))
    graph = helper.make_graph(
        [helper.make_node("QAttention", names, node_outputs, domain="com.microsoft",
                          num_heads=HEADS, unidirectional=unidirectional)], "g", inputs,
        outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.microsoft", 1)])


CASES = [c for c in itertools.product([None, "lengths", "raw"], [False, True], [0, 1],
                                      [False, True]) if not (c[3] and c[0] == "raw")]


@pytest.mark.parametrize("mask, per_column, unidirectional, past", CASES,
                         ids=[f"{m}-{'col' if c else 'tensor'}-uni{u}{'-past' if p else ''}"
                              for m, c, u, p in CASES])
def test_qattention_equals_the_kernel(mask, per_column, unidirectional, past):
    model = _qattention(mask, per_column, unidirectional, past, len(CASES))
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    assert {n.domain for n in out.graph.node} <= {""}
    rng = np.random.default_rng(7)
    for batch, sequence in ((2, 5), (1, 3)):
        feeds = {"x": rng.integers(0, 256, (batch, sequence, HIDDEN)).astype(np.uint8),
                 "xs": np.array(0.02, np.float32), "xz": np.array(128, np.uint8)}
        if past:
            feeds["past"] = rng.standard_normal((2, batch, HEADS, 3, HIDDEN // HEADS)).astype(
                np.float32)
        if mask == "lengths":
            feeds["mask"] = rng.integers(1, sequence + (3 if past else 0) + 1,
                                         batch).astype(np.int32)
        elif mask == "raw":
            feeds["mask"] = (rng.random((batch, sequence)) > 0.3).astype(np.int32)
            feeds["mask"][0, 0] = 0  # query 0's only earlier key hidden
        for got, want in zip(_run(out, feeds), _run(model, feeds), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("signed", [False, True], ids=["uint8", "int8"])
@pytest.mark.parametrize("segments", [False, True])
def test_qembed_layer_norm_equals_the_kernel(signed, segments):
    rng = np.random.default_rng(signed + 2 * segments)
    dtype = np.int8 if signed else np.uint8
    info = np.iinfo(dtype)

    def quantized(name, shape, zero):
        return [nh.from_array(rng.integers(info.min, info.max + 1, shape).astype(dtype),
                              f"{name}_q"),
                nh.from_array(np.array(rng.uniform(0.001, 0.01), np.float32), f"{name}_s"),
                nh.from_array(np.array(zero, dtype), f"{name}_z")]

    tables = {"word": (30, HIDDEN), "position": (12, HIDDEN), "segment": (2, HIDDEN),
              "gamma": (HIDDEN,), "beta": (HIDDEN,)}
    initializers = []
    for name, shape in tables.items():
        initializers += quantized(name, shape, info.min + 5 if name != "beta" else 0)
    seg = "seg" if segments else ""
    names = ["ids", seg, "word_q", "position_q", "segment_q" if segments else "", "gamma_q",
             "beta_q", "mask", "word_s", "position_s", "segment_s" if segments else "",
             "gamma_s", "beta_s", "word_z", "position_z", "segment_z" if segments else "",
             "gamma_z", "beta_z"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32, ["B", "S"])
              for n in ("ids", "mask") + (("seg",) if segments else ())]
    graph = helper.make_graph(
        [helper.make_node("QEmbedLayerNormalization", names, ["y", "mask_index"],
                          domain="com.microsoft", epsilon=1e-12)], "g", inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", HIDDEN]),
         helper.make_tensor_value_info("mask_index", TensorProto.INT32, ["B"])],
        initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    assert {n.domain for n in out.graph.node} <= {""}
    for batch, sequence in ((2, 6), (1, 4)):
        feeds = {"ids": rng.integers(0, 30, (batch, sequence)).astype(np.int32),
                 "mask": (rng.random((batch, sequence)) > 0.3).astype(np.int32)}
        if segments:
            feeds["seg"] = rng.integers(0, 2, (batch, sequence)).astype(np.int32)
        got, want = _run(out, feeds), _run(model, feeds)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(got[1], want[1])
