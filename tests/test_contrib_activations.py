"""ONNX Runtime's contrib activations, decomposed: against torch (float64) and, where ONNX
Runtime has a CPU kernel for the original node (Gelu, BiasGelu, FastGelu, QuickGelu), against
that kernel too; BiasAdd and BiasSplitGelu have CUDA kernels only, so torch alone there."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.contrib_activations import BiasSplitGelu
from decomposer.testing import Case, check_pattern

from _helpers import make_model, run_onnxruntime

ELEM = {np.float32: TensorProto.FLOAT, np.float16: TensorProto.FLOAT16,
        np.float64: TensorProto.DOUBLE, np.int32: TensorProto.INT32}
CPU_KERNEL = {"Gelu", "BiasGelu", "FastGelu", "QuickGelu"}


def _t(a):
    return torch.from_numpy(np.asarray(a, np.float64))


ORACLES = {
    "Gelu": lambda x: F.gelu(_t(x)),
    "BiasGelu": lambda x, b: F.gelu(_t(x) + _t(b)),
    "FastGelu": lambda x, b=None: F.gelu(_t(x) + (0 if b is None else _t(b)),
                                         approximate="tanh"),
    "QuickGelu": lambda x, alpha=1.702: _t(x) * torch.sigmoid(alpha * _t(x)),
    "BiasAdd": lambda x, b, s: _t(x) + _t(b) + _t(s),
    "BiasSplitGelu": lambda x, b: (lambda h: h[..., :h.shape[-1] // 2]
                                   * F.gelu(h[..., h.shape[-1] // 2:]))(_t(x) + _t(b)),
}


def contrib_model(op, arrays, opset=17, attrs=None):
    names = ["x", "bias", "skip"][:len(arrays)]
    inputs = [helper.make_tensor_value_info(
        name, ELEM[a.dtype.type], [f"d{i}" if name != "bias" and i < a.ndim - 1 else size
                                   for i, size in enumerate(a.shape)])
        for name, a in zip(names, arrays, strict=True)]
    node = helper.make_node(op, names, ["y"], name="act", domain="com.microsoft",
                            **(attrs or {}))
    out = helper.make_tensor_value_info("y", ELEM[arrays[0].dtype.type],
                                        [None] * arrays[0].ndim)
    return make_model([node], inputs, [out], opset, extra_opsets=["com.microsoft"])


def _arrays(op, rng, shape, dtype, with_bias=True):
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    arrays = [x]
    if op in ("BiasGelu", "BiasAdd", "BiasSplitGelu") or (op == "FastGelu" and with_bias):
        arrays.append(rng.standard_normal(shape[-1]).astype(dtype))
    if op == "BiasAdd":
        arrays.append(rng.standard_normal(shape).astype(dtype))
    return arrays


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("op", list(ORACLES))
def test_activation_matches_torch_and_the_contrib_kernel(op, dtype):
    rng = np.random.default_rng(len(op))
    arrays = _arrays(op, rng, (2, 5, 8), dtype)
    attrs = {"alpha": 1.5} if op == "QuickGelu" else None
    model = contrib_model(op, arrays, attrs=attrs)
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {op: 1}
    assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
    onnx.checker.check_model(out, full_check=True)
    tolerance = 2e-3 if dtype == np.float16 else 2e-6
    for shape in [(2, 5, 8), (1, 3, 8)]:  # dynamic leading dims
        feed_arrays = _arrays(op, np.random.default_rng(shape[1]), shape, dtype)
        feeds = dict(zip(["x", "bias", "skip"], feed_arrays, strict=False))
        got = run_onnxruntime(out, feeds)[0]
        assert got.dtype == dtype
        extra = {"alpha": 1.5} if op == "QuickGelu" else {}
        want = ORACLES[op](*feed_arrays, **extra).numpy()
        np.testing.assert_allclose(got.astype(np.float64), want, atol=tolerance,
                                   rtol=tolerance, err_msg=f"{op} vs torch")
        if op in CPU_KERNEL and dtype != np.float64:
            kernel = run_onnxruntime(model, feeds)[0]
            np.testing.assert_allclose(got.astype(np.float64), kernel.astype(np.float64),
                                       atol=tolerance * 2, rtol=tolerance * 2,
                                       err_msg=f"{op} vs ONNX Runtime's contrib kernel")


def test_fast_gelu_without_bias_and_opset_ends():
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 6)) * 2).astype(np.float32)
    for opset in (11, 20):
        model = contrib_model("FastGelu", [x], opset=opset)
        got = run_onnxruntime(decomposer.decompose(model), {"x": x})[0]
        np.testing.assert_allclose(got, ORACLES["FastGelu"](x).numpy(), atol=1e-6, rtol=1e-6)
        np.testing.assert_allclose(got, run_onnxruntime(model, {"x": x})[0], atol=1e-5,
                                   rtol=1e-5)


def test_fast_gelu_at_a_graph_output_runs_on_every_engine():
    # the fusable formula into a tensor of its own, then Sub(y, 0) to the graph output
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 8)) * 3).astype(np.float32)
    out = decomposer.decompose(contrib_model("FastGelu", [x], opset=17))
    assert [n.op_type for n in out.graph.node if n.output[0] == "y"] == ["Sub"]
    want = ORACLES["FastGelu"](x).numpy()
    for engine in ("ort", "openvino", "tvm"):
        (got,) = decomposer.engines.run_model(engine, out, {"x": x})
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5, err_msg=engine)


def test_target_ort_keeps_contrib_ops():
    x = np.ones((2, 4), np.float32)
    out, report = decomposer.decompose_with_report(contrib_model("Gelu", [x]), target="ort")
    assert report.counts == {} and [n.op_type for n in out.graph.node] == ["Gelu"]


def test_rejections_name_the_node_and_the_reason():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 7)).astype(np.float32)
    bias = rng.standard_normal(7).astype(np.float32)
    with pytest.raises(decomposer.UnsupportedNodeError, match="node 'act'.*must be even"):
        decomposer.decompose(contrib_model("BiasSplitGelu", [x, bias]))
    with pytest.raises(decomposer.UnsupportedNodeError, match="bias has 5 values"):
        decomposer.decompose(contrib_model("BiasGelu", [x, bias[:5]]))
    with pytest.raises(decomposer.UnsupportedNodeError, match="input must be"):
        decomposer.decompose(contrib_model("Gelu", [x.astype(np.int32)]))
    assert BiasSplitGelu().op_type == "BiasSplitGelu"


def portability_cases():
    """Every activation in one model (com.microsoft nodes, dynamic leading dims)."""
    rng = np.random.default_rng(9)
    shape = (2, 3, 8)
    names = {"x": shape, "b": (8,), "s": shape}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT,
                                            ["N", "S", 8] if len(s) == 3 else [8])
              for n, s in names.items()]
    nodes = [helper.make_node("Gelu", ["x"], ["g"], domain="com.microsoft"),
             helper.make_node("BiasGelu", ["g", "b"], ["bg"], domain="com.microsoft"),
             helper.make_node("FastGelu", ["bg", "b"], ["fg"], domain="com.microsoft"),
             helper.make_node("QuickGelu", ["fg"], ["qg"], domain="com.microsoft", alpha=1.2),
             helper.make_node("BiasAdd", ["qg", "b", "s"], ["ba"], domain="com.microsoft"),
             helper.make_node("BiasSplitGelu", ["ba", "b"], ["y"], domain="com.microsoft")]
    model = make_model(nodes, inputs, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, ["N", "S", 4])], 17, extra_opsets=["com.microsoft"])
    feeds, expected = [], []
    for n, s in [(2, 3), (1, 5)]:
        x = rng.standard_normal((n, s, 8)).astype(np.float32)
        b = rng.standard_normal(8).astype(np.float32)
        skip = rng.standard_normal((n, s, 8)).astype(np.float32)
        g = ORACLES["Gelu"](x)
        bg = F.gelu(g + _t(b))
        fg = F.gelu(bg + _t(b), approximate="tanh")
        qg = fg * torch.sigmoid(1.2 * fg)
        ba = qg + _t(b) + _t(skip)
        y = ORACLES["BiasSplitGelu"](ba.numpy(), b)
        feeds.append({"x": x, "b": b, "s": skip})
        expected.append([y.numpy().astype(np.float32)])
    return [{"id": "contrib activations chain (com.microsoft)", "model": model,
             "feeds": feeds, "expected": expected, "atol": 1e-5}]


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_onnx_gelu_below_20_matches_torch(approximate):
    """ONNX's Gelu-20 in the default domain below opset 20 (--target-opset), against
    torch.nn.functional.gelu, at two sizes with dynamic dims."""
    from decomposer.patterns.contrib_activations import OnnxGelu

    rng = np.random.default_rng(11)
    cases = [Case([(rng.standard_normal((3, 5, 8)) * 3).astype(np.float32)],
                  {"approximate": approximate}, symbolic="all",
                  more_inputs=[[(rng.standard_normal((1, 2, 8)) * 3).astype(np.float32)]])]
    check_pattern(OnnxGelu(), cases, opsets=(11, 13, 17, 19), domain="",
                  oracle=lambda x, approximate="none": F.gelu(
                      _t(x), approximate=approximate).numpy().astype(np.float32),
                  atol=2e-6, rtol=2e-6)
