"""``--lower MatMulInteger`` (for TensorRT and MNN, which lack the op) against ONNX Runtime's
own MatMulInteger kernel: uint8/int8 operands, zero points at the ends of their ranges, per
column (B) and per row (A) zero points, constant and run-time B, batched operands with
broadcasting, K wide enough to need several exact chunks, dynamic leading dims at two
sizes, opsets 11, 13 and 17; and quantize_dynamic's transformer block under ``--target
tensorrt`` (MatMulInteger and DynamicQuantizeLinear both lowered: NVIDIA/TensorRT#3963),
equal to ONNX Runtime's run of the original."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import decomposer
from decomposer import engine_support

from _helpers import integer_product_model, random_integers


def _session(model):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def _model(a_dtype, a_dims, b, a_zero, b_zero, constant_b=True, opset=17):
    return integer_product_model("MatMulInteger", a_dtype, a_dims, b, a_zero, b_zero,
                                 constant_b, max(len(a_dims), b.ndim), opset)


_random = random_integers


CASES = [
    # (a dtype, b dtype, a dims, a feed shapes, b shape, a zero, b zero, constant b)
    (np.uint8, np.int8, ["n", "s", 64], [(2, 5, 64), (1, 3, 64)], (64, 7), 128, 0, True),
    (np.uint8, np.uint8, ["n", 3000], [(4, 3000), (1, 3000)], (3000, 6), 0, 255, True),
    (np.int8, np.int8, ["n", 700], [(3, 700), (2, 700)], (700, 5), -128, 127, False),
    (np.uint8, np.int8, ["n", 2, 4, 9], [(3, 2, 4, 9), (1, 2, 4, 9)], (2, 9, 5), 255, -128,
     True),  # batched B, broadcast
    (np.int8, np.uint8, [5, 12], [(5, 12)], (12, 4), None, None, True),
    (np.uint8, np.int8, ["n", 16], [(3, 16), (1, 16)], (16, 4), 7, "columns", True),
    (np.uint8, np.int8, ["n", 16], [(3, 16)], (16, 4), 7, "columns", False),
]


@pytest.mark.parametrize("opset", [11, 13, 17])
@pytest.mark.parametrize("a_dtype, b_dtype, a_dims, a_shapes, b_shape, a_zero, b_zero, constant",
                         CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_equals_the_kernel(opset, a_dtype, b_dtype, a_dims, a_shapes, b_shape, a_zero, b_zero,
                           constant):
    rng = np.random.default_rng(sum(b_shape) + opset)
    b = _random(rng, b_dtype, b_shape)
    if b_zero == "columns":
        b_points = _random(rng, b_dtype, (b_shape[-1],))
    else:
        b_points = None if b_zero is None else np.array(b_zero, b_dtype)
    model = _model(a_dtype, a_dims, b, None if a_zero is None else np.array(a_zero, a_dtype),
                   b_points, constant, opset)
    assert decomposer.decompose(model).graph.node[0].op_type == "MatMulInteger"
    out = decomposer.decompose(model, lower=["MatMulInteger"])
    onnx.checker.check_model(out, full_check=True)
    assert "MatMulInteger" not in {n.op_type for n in out.graph.node}
    kernel, lowered = _session(model), _session(out)
    for shape in a_shapes:
        feeds = {"x": _random(rng, a_dtype, shape)}
        if not constant:
            feeds["w"] = b
        want = kernel.run(None, feeds)[0]
        got = lowered.run(None, feeds)[0]
        assert got.dtype == np.int32
        np.testing.assert_array_equal(got, want)


def test_per_row_zero_points_of_a_2d_a():
    """The spec's per-row form: a zero point per row of a 2-D A, (M,). ONNX Runtime's
    kernel refuses it ("input1 zero point must be a scalar or 1D tensor of size 1") and
    ONNX 1.23's reference broadcasts it along K instead ("operands could not be broadcast
    together with shapes (4,10) (4,)"), both measured; the oracle is the spec's formula in
    int64 numpy."""
    rng = np.random.default_rng(7)
    b = _random(rng, np.int8, (10, 3))
    model = _model(np.uint8, [4, 10], b, np.array([0, 255, 17, 128], np.uint8),
                   np.array(1, np.int8))
    out = decomposer.decompose(model, lower=["MatMulInteger"])
    onnx.checker.check_model(out, full_check=True)
    a = _random(rng, np.uint8, (4, 10))
    rows = np.array([0, 255, 17, 128], np.int64)[:, None]
    want = (a.astype(np.int64) - rows) @ (b.astype(np.int64) - 1)
    np.testing.assert_array_equal(_session(out).run(None, {"x": a})[0], want)


def test_sums_beyond_float32s_exact_integers():
    """Terms of about -53,000 summed over a K of 1024 (-54 million): the chunks keep the
    sum bit for bit the kernel's (one MatMul gives other numbers: checked by hand with the
    bound lifted)."""
    rng = np.random.default_rng(13)
    b = rng.integers(0, 41, (1024, 5)).astype(np.uint8)
    model = _model(np.uint8, ["n", 1024], b, np.array(0, np.uint8), np.array(255, np.uint8))
    out = decomposer.decompose(model, lower=["MatMulInteger"])
    a = rng.integers(200, 256, (3, 1024)).astype(np.uint8)
    want = _session(model).run(None, {"x": a})[0]
    assert np.abs(want).max() > 2 ** 24
    np.testing.assert_array_equal(_session(out).run(None, {"x": a})[0], want)


def test_chunks_are_what_exactness_needs():
    """A K of 3000 against weights of magnitude 255 everywhere (0 with a zero point of 255)
    and uint8 data with zero point 0: each chunk holds 2**24 / (255 * 255) = 258 rows of B,
    so 12 MatMuls; quantize_dynamic-like weights of K 768 (|w| <= 127, data zero point
    near the middle) need one."""
    wide = _model(np.uint8, ["n", 3000], np.zeros((3000, 6), np.uint8), np.array(0, np.uint8),
                  np.array(255, np.uint8))
    rng = np.random.default_rng(1)
    narrow = _model(np.uint8, ["n", 768], (rng.standard_normal((768, 8)) * 40).clip(
        -127, 127).astype(np.int8), np.array(120, np.uint8), np.array(0, np.int8))
    count = [n.op_type for n in decomposer.decompose(wide, lower=["MatMulInteger"]).graph.node
             ].count("MatMul")
    assert count == 12
    assert [n.op_type for n in decomposer.decompose(narrow, lower=["MatMulInteger"]).graph.node
            ].count("MatMul") == 1


@pytest.fixture(scope="module")
def dynamic_block(tmp_path_factory):
    """quantize_dynamic's output for a small transformer MLP block (LayerNorm, two Linears,
    GELU): DynamicQuantizeLinear and MatMulInteger for every MatMul."""
    import torch
    from onnxruntime.quantization import quantize_dynamic

    folder = tmp_path_factory.mktemp("matmul_integer")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 256),
                              torch.nn.GELU(), torch.nn.Linear(256, 64)).eval()
    source, quantized = folder / "block.onnx", folder / "block_dynamic.onnx"
    torch.onnx.export(net, (torch.randn(1, 8, 64),), str(source), opset_version=17,
                      dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "n", 1: "s"}, "y": {0: "n", 1: "s"}})
    quantize_dynamic(str(source), str(quantized))
    model = onnx.load(str(quantized))
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= {n.op_type for n in model.graph.node}
    return model


def test_tensorrt_target_lowers_quantize_dynamic_whole(dynamic_block):
    """TensorRT documents neither MatMulInteger nor DynamicQuantizeLinear (users meet it as
    NVIDIA/TensorRT#3963): its target lowers both, and the result is ONNX Runtime's run of
    the original, bit for bit."""
    out = decomposer.decompose(dynamic_block, target="tensorrt")
    onnx.checker.check_model(out, full_check=True)
    assert not {"MatMulInteger", "DynamicQuantizeLinear"} & {n.op_type for n in out.graph.node}
    # and nothing else its documented matrix lacks (check --engines tensorrt is clean)
    assert engine_support.engine_gaps(out, ["tensorrt"]) == {"tensorrt": []}
    rng = np.random.default_rng(2)
    for shape in ((2, 8, 64), (1, 3, 64)):
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        np.testing.assert_array_equal(_session(out).run(None, feeds)[0],
                                      _session(dynamic_block).run(None, feeds)[0])


def portability_cases():
    """The lowering on every engine, ONNX Runtime's kernel the oracle (exact: int32)."""
    rng = np.random.default_rng(8)
    model = _model(np.uint8, ["n", 48], _random(rng, np.int8, (48, 6)),
                   np.array(131, np.uint8), np.array(-2, np.int8))
    feeds = [{"x": _random(rng, np.uint8, (b, 48))} for b in (3, 1)]
    expected = [_session(model).run(None, f) for f in feeds]
    return [{"id": "MatMulInteger lowered", "model": model, "feeds": feeds,
             "expected": expected, "atol": 0, "lower": ("MatMulInteger",)}]
