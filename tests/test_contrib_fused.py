"""ONNX Runtime's FusedMatMul, FusedGemm and FusedConv, unfused: against torch (float64) and
against ONNX Runtime's own kernels for the original node, every flag and activation, dynamic
dims and the opset ends; rejections name the node."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.contrib_fused import (
    CONV_ACTIVATIONS,
    GEMM_ACTIVATIONS,
    FusedConv,
    FusedGemm,
    FusedMatMul,
)
from decomposer.testing import Case, check_pattern

from _helpers import make_model, run_onnxruntime

TORCH_ACTIVATIONS = {
    "Relu": lambda x, p: torch.relu(x), "Tanh": lambda x, p: torch.tanh(x),
    "Sigmoid": lambda x, p: torch.sigmoid(x), "Softplus": lambda x, p: F.softplus(x),
    "Softsign": lambda x, p: F.softsign(x), "LeakyRelu": lambda x, p: F.leaky_relu(x, p[0]),
    "Elu": lambda x, p: F.elu(x, p[0]),
    "ThresholdedRelu": lambda x, p: torch.where(x > p[0], x, torch.zeros_like(x)),
    "HardSigmoid": lambda x, p: torch.clamp(p[0] * x + p[1], 0, 1),
    "Clip": lambda x, p: torch.clamp(x, p[0], p[1]),
    "ScaledTanh": lambda x, p: p[0] * torch.tanh(p[1] * x),
    "ParametricSoftplus": lambda x, p: p[0] * F.softplus(p[1] * x),
}


def _t(a):
    return torch.from_numpy(np.asarray(a, np.float64))


def _node_model(op, arrays, attrs, opset=17, symbolic=True):
    inputs = [helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(a.dtype),
        [f"{name}_d{i}" if symbolic and i == 0 and a.ndim > 1 else s
         for i, s in enumerate(a.shape)]) for name, a in arrays if a is not None]
    node = helper.make_node(op, [n if a is not None else "" for n, a in arrays], ["y"],
                            name="fused", domain="com.microsoft", **attrs)
    first = next(a for _, a in arrays if a is not None)
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(first.dtype),
                                        [None] * first.ndim)
    model = make_model([node], inputs, [out], opset, extra_opsets=["com.microsoft"])
    return model, {n: a for n, a in arrays if a is not None}


def _check(model, feeds, want, tolerance):
    out, report = decomposer.decompose_with_report(model)
    assert len(report.replaced) == 1 and all(not n.domain for n in out.graph.node)
    onnx.checker.check_model(out, full_check=True)
    (got,) = run_onnxruntime(out, feeds)
    (kernel,) = run_onnxruntime(model, feeds)
    assert got.shape == kernel.shape and got.dtype == kernel.dtype
    np.testing.assert_allclose(got.astype(np.float64), want, atol=tolerance, rtol=tolerance,
                               err_msg="vs torch")
    np.testing.assert_allclose(got, kernel, atol=tolerance, rtol=tolerance,
                               err_msg="vs ONNX Runtime's kernel")


@pytest.mark.parametrize("trans_a, trans_b, batch_a, batch_b",
                         list(itertools.product([0, 1], repeat=4)))
def test_fused_matmul_every_flag(trans_a, trans_b, batch_a, batch_b):
    rng = np.random.default_rng(trans_a + 2 * trans_b + 4 * batch_a + 8 * batch_b)
    logical_a = rng.standard_normal((2, 3, 4, 5))
    logical_b = rng.standard_normal((2, 3, 5, 6))

    def stored(logical, trans, batch):
        # the array whose transposition by FusedMatMul's rule gives ``logical``
        rank = logical.ndim
        perm = list(range(1, rank - 1)) + [0, rank - 1] if batch else list(range(rank))
        if trans:
            perm[-1], perm[-2] = perm[-2], perm[-1]
        return np.ascontiguousarray(np.transpose(logical, np.argsort(perm))).astype(np.float32)

    a, b = stored(logical_a, trans_a, batch_a), stored(logical_b, trans_b, batch_b)
    attrs = {"transA": trans_a, "transB": trans_b, "transBatchA": batch_a,
             "transBatchB": batch_b, "alpha": 0.5}
    model, feeds = _node_model("FusedMatMul", [("A", a), ("B", b)], attrs, symbolic=False)
    want = (0.5 * torch.matmul(_t(logical_a), _t(logical_b))).numpy()
    _check(model, feeds, want, 1e-5)


def test_fused_matmul_broadcasts_and_keeps_dims_dynamic():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 4, 8)).astype(np.float32)
    b = rng.standard_normal((6, 8)).astype(np.float32)
    model, feeds = _node_model("FusedMatMul", [("A", a), ("B", b)], {"transB": 1})
    out = decomposer.decompose(model)
    for batch in (2, 5):
        feeds = {"A": rng.standard_normal((batch, 4, 8)).astype(np.float32), "B": b}
        (got,) = run_onnxruntime(out, feeds)
        np.testing.assert_allclose(got, feeds["A"] @ b.T, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("activation", list(GEMM_ACTIVATIONS))
def test_fused_gemm_every_activation(activation):
    rng = np.random.default_rng(len(activation))
    a = (rng.standard_normal((3, 4)) * 2).astype(np.float32)
    b = rng.standard_normal((5, 4)).astype(np.float32)
    c = rng.standard_normal(5).astype(np.float32)
    attrs = {"activation": activation, "transB": 1, "alpha": 0.7, "beta": 1.5}
    params = [0.3, 0.6][:GEMM_ACTIVATIONS[activation]]
    attrs.update(zip(("activation_alpha", "activation_beta"), params, strict=False))
    model, feeds = _node_model("FusedGemm", [("A", a), ("B", b), ("C", c)], attrs)
    gemm = 0.7 * _t(a) @ _t(b).T + 1.5 * _t(c)
    want = TORCH_ACTIVATIONS[activation](gemm, params).numpy()
    _check(model, feeds, want, 1e-5)


@pytest.mark.parametrize("activation", [None, *CONV_ACTIVATIONS])
@pytest.mark.parametrize("with_z", [False, True])
def test_fused_conv(activation, with_z):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4, 7, 6)).astype(np.float32)
    w = rng.standard_normal((6, 2, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(6).astype(np.float32)
    z = rng.standard_normal((2, 6, 4, 6)).astype(np.float32) if with_z else None
    params = {0: [], 1: [0.2], 2: [0.2, 0.7] if activation == "HardSigmoid" else [-0.5, 0.8]}[
        CONV_ACTIVATIONS.get(activation, 0)]
    attrs = {"group": 2, "pads": [1, 1, 1, 1], "strides": [2, 1], "kernel_shape": [3, 3]}
    if activation:
        attrs["activation"] = activation
    if params:
        attrs["activation_params"] = params
    arrays = [("X", x), ("W", w), ("B", bias), ("Z", z)]
    names = {"X": x, "W": w, "B": bias}
    inits = [onnx.numpy_helper.from_array(w, "W")]  # a Conv weight is an initializer
    model, feeds = _node_model("FusedConv", arrays, attrs)
    model.graph.initializer.extend(inits)
    del feeds["W"]
    kept = [i for i in model.graph.input if i.name != "W"]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    y = F.conv2d(_t(names["X"]), _t(w), _t(bias), stride=(2, 1), padding=1, groups=2)
    if with_z:
        y = y + _t(z)
    want = (TORCH_ACTIVATIONS[activation](y, params) if activation else y).numpy()
    _check(model, feeds, want, 2e-5)


def test_float16_against_the_kernels():
    """ONNX Runtime has float16 kernels for FusedMatMul and FusedConv (not FusedGemm)."""
    rng = np.random.default_rng(8)
    a = rng.standard_normal((2, 3, 8)).astype(np.float16)
    b = rng.standard_normal((5, 8)).astype(np.float16)
    model, feeds = _node_model("FusedMatMul", [("A", a), ("B", b)], {"transB": 1,
                                                                     "alpha": 0.5})
    _check(model, feeds, (0.5 * _t(a) @ _t(b).T).numpy(), 2e-2)
    x = rng.standard_normal((1, 2, 6, 5)).astype(np.float16)
    w = rng.standard_normal((4, 2, 3, 3)).astype(np.float16)
    model, feeds = _node_model("FusedConv", [("X", x), ("W", w)],
                               {"activation": "Relu", "kernel_shape": [3, 3]})
    model.graph.initializer.append(onnx.numpy_helper.from_array(w, "W"))
    del feeds["W"]
    kept = [i for i in model.graph.input if i.name != "W"]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    _check(model, feeds, torch.relu(F.conv2d(_t(x), _t(w))).numpy(), 3e-2)


@pytest.mark.parametrize("pattern, cases", [
    (FusedMatMul(), [Case([np.random.default_rng(1).standard_normal(s).astype(np.float32)
                           for s in [(2, 3, 4), (2, 5, 4)]],
                          attrs={"transB": 1, "alpha": 2.0}, symbolic={0: (0,), 1: (0,)})]),
    (FusedGemm(), [Case([np.random.default_rng(2).standard_normal(s).astype(np.float32)
                         for s in [(3, 4), (4, 5), (5,)]],
                        attrs={"activation": "Sigmoid"}, symbolic={0: (0,)})]),
    (FusedConv(), [Case([np.random.default_rng(3).standard_normal(s).astype(np.float32)
                         for s in [(1, 2, 5, 5), (3, 2, 3, 3), (3,)]],
                        attrs={"activation": "Relu", "pads": [1, 1, 1, 1]},
                        constant_inputs=(1,), symbolic={0: (0, 2, 3)})]),
], ids=lambda value: getattr(value, "op_type", ""))
def test_kit_at_the_opset_ends(pattern, cases):
    """The kit: the pattern's numpy reference on ONNX Runtime, full_check and the portability
    rules at opset 11 and the newest."""
    check_pattern(pattern, cases, opsets=(11, onnx.defs.onnx_opset_version()), atol=1e-5,
                  rtol=1e-5)


def test_rejections_name_the_node_and_the_reason():
    a = np.ones((2, 3), np.float32)
    model, _ = _node_model("FusedGemm", [("A", a), ("B", a.T)], {"activation": "Selu"})
    with pytest.raises(decomposer.UnsupportedNodeError, match="node 'fused'.*'Selu' is not"):
        decomposer.decompose(model)
    model, _ = _node_model("FusedGemm", [("A", a), ("B", a.T)], {"activation": "ScaledTanh"})
    with pytest.raises(decomposer.UnsupportedNodeError, match="needs activation_alpha"):
        decomposer.decompose(model)
    x = np.ones((1, 1, 3, 3), np.float32)
    model, _ = _node_model("FusedConv", [("X", x), ("W", x)],
                           {"activation": "LeakyRelu", "activation_params": [0.1, 0.2]})
    with pytest.raises(decomposer.UnsupportedNodeError, match="takes 1 activation_params"):
        decomposer.decompose(model)
    model, _ = _node_model("FusedMatMul", [("A", a), ("B", a.T)], {"transBatchA": 1})
    with pytest.raises(decomposer.UnsupportedNodeError, match="rank >= 3 is needed"):
        decomposer.decompose(model)


def test_target_ort_keeps_them():
    a = np.ones((2, 3), np.float32)
    model, _ = _node_model("FusedMatMul", [("A", a), ("B", a.T)], {})
    out, report = decomposer.decompose_with_report(model, target="ort")
    assert report.counts == {} and out.graph.node[0].op_type == "FusedMatMul"


# -- portability (the hook of scripts/portability_cases.py) ---------------------------------


def portability_cases():
    """FusedConv (Relu, weights as initializers) -> flattened rows -> FusedGemm (LeakyRelu)
    -> FusedMatMul (transB, alpha), dynamic batch."""
    rng = np.random.default_rng(12)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    gemm_b = rng.standard_normal((16, 8)).astype(np.float32)
    mm_b = rng.standard_normal((5, 8)).astype(np.float32)
    inits = [onnx.numpy_helper.from_array(v, n) for n, v in
             [("w", w), ("cb", bias), ("gb", gemm_b), ("mb", mm_b),
              ("rows", np.array([-1, 16], np.int64))]]
    nodes = [
        helper.make_node("FusedConv", ["x", "w", "cb"], ["c"], domain="com.microsoft",
                         activation="Relu", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Reshape", ["c", "rows"], ["r"]),
        helper.make_node("FusedGemm", ["r", "gb"], ["g"], domain="com.microsoft",
                         activation="LeakyRelu", activation_alpha=0.1),
        helper.make_node("FusedMatMul", ["g", "mb"], ["y"], domain="com.microsoft",
                         transB=1, alpha=0.5)]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                             ["N", 3, 4, 4])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 5])], 17,
                       extra_opsets=["com.microsoft"], initializers=inits)
    feeds, expected = [], []
    for n in (2, 3):
        x = rng.standard_normal((n, 3, 4, 4)).astype(np.float32)
        c = torch.relu(F.conv2d(_t(x), _t(w), _t(bias), stride=2, padding=1))
        g = F.leaky_relu(c.reshape(-1, 16) @ _t(gemm_b), 0.1)
        feeds.append({"x": x})
        expected.append([(0.5 * g @ _t(mm_b).T).numpy().astype(np.float32)])
    return [{"id": "contrib fused ops chain (FusedConv, FusedGemm, FusedMatMul)",
             "model": model, "feeds": feeds, "expected": expected, "atol": 2e-5}]
