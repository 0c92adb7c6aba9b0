"""ONNX Runtime's MatMulNBits, decomposed: against ONNX Runtime's own CPU kernel and against
torch (the weights unpacked with torch's bit operations, dequantized and multiplied in
float64), 2, 4 and 8 bits, zero points absent, packed and unpacked, K not a multiple of the
block, bias, float16, dynamic leading dims."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import decomposer

from _helpers import make_model, run_onnxruntime


def _torch_weight(packed, scales, zero_points, k, n, bits, block):
    """W (N, K) with torch: unpack low bits first, (q - zero) * scale per block."""
    rows = torch.from_numpy(packed.reshape(n, -1).astype(np.int64))
    per = 8 // bits
    mask = (1 << bits) - 1
    q = torch.stack([(rows >> (bits * i)) & mask for i in range(per)], -1).reshape(n, -1)
    k_blocks = -(-k // block)
    if zero_points is None:
        zero = torch.full((n, k_blocks), float(1 << (bits - 1)), dtype=torch.float64)
    elif zero_points.dtype == np.uint8:
        z = torch.from_numpy(zero_points.reshape(n, -1).astype(np.int64))
        zero = torch.stack([(z >> (bits * i)) & mask for i in range(per)], -1).reshape(
            n, -1)[:, :k_blocks].double()
    else:
        zero = torch.from_numpy(zero_points.astype(np.float64)).reshape(n, k_blocks)
    scale = torch.from_numpy(scales.astype(np.float64)).reshape(n, k_blocks)
    index = torch.arange(k) // block
    return (q[:, :k].double() - zero[:, index]) * scale[:, index]


def _case(rng, bits, block, k, n, zero_kind, bias, dtype=np.float32):
    k_blocks = -(-k // block)
    arrays = {"B": rng.integers(0, 256, (n, k_blocks, block * bits // 8), dtype=np.uint8),
              "scales": rng.uniform(0.01, 0.1, (n, k_blocks)).astype(dtype)}
    if zero_kind == "packed":
        arrays["zp"] = rng.integers(0, 256, (n, -(-k_blocks * bits // 8)), dtype=np.uint8)
    elif zero_kind == "unpacked":
        arrays["zp"] = rng.uniform(0, 2 ** bits - 1, (n, k_blocks)).astype(dtype)
    if bias:
        arrays["bias"] = rng.standard_normal(n).astype(dtype)
    names = ["A", "B", "scales", "zp" if "zp" in arrays else "", "",
             "bias" if bias else ""]
    while names[-1] == "":
        names.pop()
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("MatMulNBits", names, ["Y"], name="linear", domain="com.microsoft",
                            K=k, N=n, bits=bits, block_size=block)
    model = make_model([node], [helper.make_tensor_value_info("A", elem, ["batch", "seq", k])],
                       [helper.make_tensor_value_info("Y", elem, ["batch", "seq", n])], 17,
                       extra_opsets=["com.microsoft"],
                       initializers=[onnx.numpy_helper.from_array(v, name)
                                     for name, v in arrays.items()])
    return model, arrays


@pytest.mark.parametrize("bits, block, k, n, zero_kind, bias", [
    (4, 32, 64, 8, None, False), (4, 32, 70, 8, "packed", True), (4, 16, 64, 5, "unpacked", False),
    (8, 32, 64, 8, "packed", False), (8, 16, 48, 4, None, True), (2, 16, 64, 4, "packed", False)])
def test_matches_the_kernel_and_torch(bits, block, k, n, zero_kind, bias):
    rng = np.random.default_rng(bits + block + k + n)
    model, arrays = _case(rng, bits, block, k, n, zero_kind, bias)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    assert all(node.domain in ("", "ai.onnx") for node in out.graph.node)
    weight = _torch_weight(arrays["B"], arrays["scales"], arrays.get("zp"), k, n, bits, block)
    for shape in [(2, 3, k), (1, 5, k)]:
        a = rng.standard_normal(shape).astype(np.float32)
        (got,) = run_onnxruntime(out, {"A": a})
        (kernel,) = run_onnxruntime(model, {"A": a})
        want = (torch.from_numpy(a.astype(np.float64)) @ weight.T).numpy()
        if bias:
            want = want + arrays["bias"]
        np.testing.assert_allclose(got, kernel, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-5)


def test_float16():
    rng = np.random.default_rng(3)
    model, arrays = _case(rng, 4, 32, 64, 6, "packed", True, np.float16)
    out = decomposer.decompose(model)
    a = rng.standard_normal((2, 2, 64)).astype(np.float16)
    (got,) = run_onnxruntime(out, {"A": a})
    (kernel,) = run_onnxruntime(model, {"A": a})
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), kernel.astype(np.float32), atol=2e-2,
                               rtol=2e-2)


@pytest.mark.parametrize("change, message", [
    ({"bits": 3}, "bits = 3"), ({"block_size": 24}, "power of 2"),
    ({"weight_prepacked": 1}, "weight_prepacked"), ({"g_idx": True}, "g_idx"),
])
def test_rejections(change, message):
    rng = np.random.default_rng(0)
    model, _ = _case(rng, 4, 32, 64, 4, None, False)
    node = model.graph.node[0]
    for name, value in change.items():
        if name == "g_idx":
            model.graph.initializer.append(onnx.numpy_helper.from_array(
                (np.arange(64) // 32).astype(np.int32), "g"))
            node.input[:] = ["A", "B", "scales", "", "g"]
        else:
            for attr in node.attribute:
                if attr.name == name:
                    attr.i = value
            if name not in [a.name for a in node.attribute]:
                node.attribute.append(helper.make_attribute(name, value))
    with pytest.raises(decomposer.UnsupportedNodeError, match=message):
        decomposer.decompose(model)


def portability_cases():
    """An int4 linear layer as ORT's quantizer writes it (packed zero points, bias)."""
    rng = np.random.default_rng(41)
    model, arrays = _case(rng, 4, 32, 64, 8, "packed", True)
    weight = _torch_weight(arrays["B"], arrays["scales"], arrays["zp"], 64, 8, 4, 32)
    feeds, expected = [], []
    for shape in [(2, 3, 64), (1, 4, 64)]:
        a = rng.standard_normal(shape).astype(np.float32)
        feeds.append({"A": a})
        expected.append([((torch.from_numpy(a.astype(np.float64)) @ weight.T).numpy()
                          + arrays["bias"]).astype(np.float32)])
    return [{"id": "contrib MatMulNBits (int4, packed zero points, bias)", "model": model,
             "feeds": feeds, "expected": expected, "atol": 5e-5}]
