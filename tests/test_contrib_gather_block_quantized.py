"""ONNX Runtime's GatherBlockQuantized (uint8 form, and int4/uint4-typed tables),
decomposed: against ONNX Runtime's own CPU kernel and against torch (the table unpacked
with torch's bit operations and dequantized, then indexed), 2, 4 and 8 bits, zero points
absent and packed, negative and out-of-range indices, float16 scales, indices of rank 1
and 2, and implausible sizes refused."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import decomposer

from _helpers import make_model, run_onnxruntime

ROWS, WIDTH, BLOCK = 12, 32, 16


def _model(bits, zero, dtype=np.float32, index_dims=("B", "S")):
    rng = np.random.default_rng(bits + zero)
    blocks = WIDTH // BLOCK
    arrays = {"data": rng.integers(0, 256, (ROWS, WIDTH * bits // 8), dtype=np.uint8),
              "scales": rng.uniform(0.01, 0.1, (ROWS, blocks)).astype(dtype)}
    if zero:
        arrays["zero"] = rng.integers(0, 256, (ROWS, -(-blocks * bits // 8)), dtype=np.uint8)
    names = ["data", "indices", "scales"] + (["zero"] if zero else [])
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("GatherBlockQuantized", names, ["out"], name="embed",
                            domain="com.microsoft", bits=bits, block_size=BLOCK)
    model = make_model([node], [helper.make_tensor_value_info("indices", TensorProto.INT64,
                                                              list(index_dims))],
                       [helper.make_tensor_value_info("out", elem, [*index_dims, WIDTH])], 17,
                       extra_opsets=["com.microsoft"],
                       initializers=[onnx.numpy_helper.from_array(v, k)
                                     for k, v in arrays.items()])
    return model, arrays


def _torch_table(arrays, bits):
    mask = (1 << bits) - 1

    def unpack(raw):
        wide = torch.from_numpy(raw.astype(np.int64))
        return torch.stack([(wide >> (bits * i)) & mask for i in range(8 // bits)],
                           -1).reshape(raw.shape[0], -1)

    q = unpack(arrays["data"]).double()
    blocks = WIDTH // BLOCK
    zero = unpack(arrays["zero"])[:, :blocks].double() if "zero" in arrays else \
        torch.full((ROWS, blocks), float(1 << (bits - 1)), dtype=torch.float64)
    per = torch.arange(WIDTH) // BLOCK
    return (q - zero[:, per]) * torch.from_numpy(arrays["scales"].astype(np.float64))[:, per]


@pytest.mark.parametrize("bits, zero", [(4, False), (4, True), (8, True), (2, False)])
def test_matches_the_kernel_and_torch(bits, zero):
    model, arrays = _model(bits, zero)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    table = _torch_table(arrays, bits)
    for indices in [np.array([[0, 3, -1], [11, 5, 2]]), np.array([[7], [-12]]),
                    np.array([[1, 12, -13, 4]])]:
        (got,) = run_onnxruntime(out, {"indices": indices})
        (kernel,) = run_onnxruntime(model, {"indices": indices})
        valid = (indices >= -ROWS) & (indices < ROWS)
        want = torch.where(torch.from_numpy(valid)[..., None],
                           table[torch.from_numpy(indices % ROWS)], 0.0).numpy()
        np.testing.assert_allclose(got, want, atol=1e-6)
        np.testing.assert_allclose(got, kernel, atol=1e-6)


def test_float16_scales():
    model, arrays = _model(4, True, np.float16)
    out = decomposer.decompose(model)
    indices = np.array([[0, 5], [3, 11]])
    (got,) = run_onnxruntime(out, {"indices": indices})
    (kernel,) = run_onnxruntime(model, {"indices": indices})
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), kernel.astype(np.float32), atol=1e-3)


def _typed_4bit_model(elem, zero, rows=ROWS, width=WIDTH, odd_blocks=False):
    """int4/uint4 typed data (V, E) and, optionally, typed zero points (V, E / block)."""
    rng = np.random.default_rng(elem + zero)
    low, high = (-8, 7) if elem == TensorProto.INT4 else (0, 15)
    width = width + BLOCK if odd_blocks else width  # an odd count of blocks per row
    values = rng.integers(low, high + 1, (rows, width))
    zeros = rng.integers(low, high + 1, (rows, width // BLOCK))
    # the range ends in the first rows
    values[0, :2], zeros[0, 0] = (low, high), high
    scales = rng.uniform(0.01, 0.1, (rows, width // BLOCK)).astype(np.float32)
    initializers = [helper.make_tensor("data", elem, [rows, width], values.reshape(-1)),
                    onnx.numpy_helper.from_array(scales, "scales")]
    names = ["data", "indices", "scales"]
    if zero:
        initializers.append(helper.make_tensor("zero", elem, list(zeros.shape),
                                               zeros.reshape(-1)))
        names.append("zero")
    node = helper.make_node("GatherBlockQuantized", names, ["out"], name="embed",
                            domain="com.microsoft", block_size=BLOCK)
    model = make_model([node], [helper.make_tensor_value_info("indices", TensorProto.INT64,
                                                              ["B", "S"])],
                       [helper.make_tensor_value_info("out", TensorProto.FLOAT,
                                                      ["B", "S", width])], 21,
                       extra_opsets=["com.microsoft"], initializers=initializers)
    zero_values = zeros if zero else np.zeros_like(zeros)
    per = np.arange(width) // BLOCK
    table = (torch.from_numpy(values.astype(np.float64)) -
             torch.from_numpy(zero_values.astype(np.float64))[:, per]) * \
        torch.from_numpy(scales.astype(np.float64))[:, per]
    return model, table


@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize("elem", [TensorProto.INT4, TensorProto.UINT4], ids=["int4", "uint4"])
@pytest.mark.parametrize("odd_blocks", [False, True], ids=["even", "odd blocks"])
def test_int4_typed_data_matches_the_kernel_and_torch(elem, zero, odd_blocks):
    model, table = _typed_4bit_model(elem, zero, odd_blocks=odd_blocks)
    for target in (None, 17):
        out = decomposer.decompose(model) if target is None else \
            decomposer.decompose(model, target_opset=target)
        onnx.checker.check_model(out, full_check=True)
        assert {n.domain for n in out.graph.node} <= {""}
        assert not any(t.data_type in (TensorProto.INT4, TensorProto.UINT4)
                       for t in out.graph.initializer)
        for indices in [np.array([[0, 3, -1], [11, 5, 2]]), np.array([[1, 12, -13, 4]])]:
            (got,) = run_onnxruntime(out, {"indices": indices})
            (kernel,) = run_onnxruntime(model, {"indices": indices})
            valid = (indices >= -ROWS) & (indices < ROWS)
            want = torch.where(torch.from_numpy(valid)[..., None],
                               table[torch.from_numpy(indices % ROWS)], 0.0).numpy()
            np.testing.assert_allclose(got, want, atol=1e-6)
            np.testing.assert_allclose(got, kernel, atol=1e-6)


def test_int4_data_computed_at_run_time_is_refused():
    model, _ = _typed_4bit_model(TensorProto.INT4, False)
    data = model.graph.initializer[0]
    model.graph.initializer.remove(data)
    model.graph.input.append(helper.make_tensor_value_info("data", TensorProto.INT4,
                                                           [ROWS, WIDTH]))
    with pytest.raises(decomposer.UnsupportedNodeError, match="initializer"):
        decomposer.decompose(model)


def test_implausible_sizes_are_refused_before_allocating():
    """A fuzz mutant's table declared 2**40 bytes wide is refused, not allocated (it asked
    numpy for 16 TiB)."""
    model, _ = _model(4, False)
    data = model.graph.initializer[0]
    model.graph.initializer.remove(data)
    model.graph.input.append(helper.make_tensor_value_info("data", TensorProto.UINT8,
                                                           [ROWS, 2 ** 40]))
    with pytest.raises(decomposer.UnsupportedNodeError, match="limit"):
        decomposer.decompose(model)


def test_other_axes_are_refused():
    model, _ = _model(4, False)
    model.graph.node[0].attribute.append(helper.make_attribute("gather_axis", 1))
    with pytest.raises(decomposer.UnsupportedNodeError, match="gather_axis 0"):
        decomposer.decompose(model)


def portability_cases():
    """An int4 embedding table (packed zero points) looked up by token ids."""
    model, arrays = _model(4, True)
    table = _torch_table(arrays, 4)
    feeds, expected = [], []
    for indices in [np.array([[0, 3, 7], [11, 5, 2]]), np.array([[9, 1]])]:
        feeds.append({"indices": indices})
        expected.append([table[torch.from_numpy(indices)].numpy().astype(np.float32)])
    cases = [{"id": "contrib GatherBlockQuantized (int4 embedding)", "model": model,
              "feeds": feeds, "expected": expected, "atol": 1e-6}]
    model, table = _typed_4bit_model(TensorProto.INT4, True, odd_blocks=True)
    feeds = [{"indices": np.array([[0, 3, 7], [11, 5, 2]])}, {"indices": np.array([[9]])}]
    cases.append({"id": "contrib GatherBlockQuantized (int4-typed table)", "model": model,
                  "feeds": feeds, "atol": 1e-6,
                  "expected": [[table[torch.from_numpy(f["indices"])].numpy().astype(
                      np.float32)] for f in feeds]})
    return cases
