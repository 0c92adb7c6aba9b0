"""ONNX Runtime's com.microsoft RotaryEmbedding, decomposed: against ONNX Runtime's own CPU
kernel for the node and a torch float64 oracle (the formula of the module docstring), 3-D
and 4-D input, interleaved or not, position ids (B, S) or an offset, partial rotary,
float16/32, dynamic batch and sequence; rejections."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import decomposer
from decomposer.patterns.contrib_rotary import RotaryEmbedding
from decomposer.testing import Case, check_pattern

from _helpers import make_model, run_onnxruntime

HEADS, HEAD, POSITIONS = 2, 8, 32


def _arrays(rng, batch, seq, dtype, rank, offset, rotary):
    x = rng.standard_normal((batch, HEADS, seq, HEAD) if rank == 4
                            else (batch, seq, HEADS * HEAD)).astype(dtype)
    ids = np.array([3], np.int64) if offset else \
        rng.integers(0, POSITIONS - 1, (batch, seq)).astype(np.int64)
    cos = rng.standard_normal((POSITIONS, rotary // 2)).astype(dtype)
    sin = rng.standard_normal((POSITIONS, rotary // 2)).astype(dtype)
    return {"x": x, "p": ids, "c": cos, "s": sin}


def _model(arrays, attrs):
    x = arrays["x"]
    dims = {"x": ["B", HEADS, "S", HEAD] if x.ndim == 4 else ["B", "S", HEADS * HEAD],
            "p": [1] if arrays["p"].ndim == 1 else ["B", "S"],
            "c": list(arrays["c"].shape), "s": list(arrays["s"].shape)}
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype),
                                            dims[n]) for n, a in arrays.items()]
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(x.dtype),
                                        [None] * x.ndim)
    node = helper.make_node("RotaryEmbedding", list(arrays), ["y"], name="rope",
                            domain="com.microsoft", **attrs)
    return make_model([node], inputs, [out], 17, extra_opsets=["com.microsoft"])


def _torch(arrays, interleaved, rotary):
    x = torch.from_numpy(arrays["x"].astype(np.float64))
    view = x if x.ndim == 4 else x.reshape(x.shape[0], x.shape[1], HEADS, HEAD).transpose(1, 2)
    ids = torch.from_numpy(arrays["p"])
    if ids.ndim == 1:
        ids = (ids[0] + torch.arange(view.shape[2]))[None]
    cos = torch.from_numpy(arrays["c"].astype(np.float64))[ids][:, None]
    sin = torch.from_numpy(arrays["s"].astype(np.float64))[ids][:, None]
    part, rest = view[..., :rotary], view[..., rotary:]
    if interleaved:
        a, b = part[..., 0::2], part[..., 1::2]
        turned = torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)
    else:
        a, b = part.chunk(2, -1)
        turned = torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    y = torch.cat([turned, rest], -1)
    return (y if x.ndim == 4 else y.transpose(1, 2).reshape(x.shape)).numpy()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("rank, interleaved, offset, rotary", [
    (4, 0, False, HEAD), (4, 1, False, HEAD), (3, 0, False, HEAD), (3, 1, True, HEAD),
    (4, 0, True, 4), (3, 0, False, 4)])
def test_rotary_matches_the_kernel_and_torch(rank, interleaved, offset, rotary, dtype):
    rng = np.random.default_rng(rank + 2 * interleaved + 4 * offset + rotary)
    attrs = {"interleaved": interleaved}
    if rank == 3 or rotary != HEAD:
        attrs["num_heads"] = HEADS
    if rotary != HEAD:
        attrs["rotary_embedding_dim"] = rotary
    model = _model(_arrays(rng, 2, 5, dtype, rank, offset, rotary), attrs)
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {"RotaryEmbedding": 1}
    onnx.checker.check_model(out, full_check=True)
    tolerance = 4e-3 if dtype == np.float16 else 2e-6
    for batch, seq in [(2, 5), (3, 9)]:
        arrays = _arrays(rng, batch, seq, dtype, rank, offset, rotary)
        arrays["c"], arrays["s"] = (_arrays(np.random.default_rng(0), 1, 1, dtype, rank,
                                            offset, rotary)[k] for k in ("c", "s"))
        (got,), (kernel,) = run_onnxruntime(out, arrays), run_onnxruntime(model, arrays)
        assert got.dtype == kernel.dtype and got.shape == kernel.shape
        np.testing.assert_allclose(got.astype(np.float64), kernel.astype(np.float64),
                                   atol=tolerance, rtol=tolerance)
        np.testing.assert_allclose(got.astype(np.float64), _torch(arrays, interleaved, rotary),
                                   atol=tolerance, rtol=tolerance)


def test_kit_at_the_opset_ends():
    rng = np.random.default_rng(4)
    arrays = _arrays(rng, 2, 5, np.float32, 4, False, HEAD)
    case = Case(list(arrays.values()), attrs={"interleaved": 1}, symbolic={0: (0, 2)})
    check_pattern(RotaryEmbedding(), [case], opsets=(11, onnx.defs.onnx_opset_version()),
                  atol=1e-5, rtol=1e-5)


def test_rejections():
    rng = np.random.default_rng(5)
    arrays = _arrays(rng, 2, 5, np.float32, 4, False, HEAD)
    with pytest.raises(decomposer.UnsupportedNodeError, match="node 'rope'.*attribute 'scale'"):
        decomposer.decompose(_model(arrays, {"scale": 2.0}))
    with pytest.raises(decomposer.UnsupportedNodeError, match="rotating 4 dims takes 2"):
        decomposer.decompose(_model(arrays, {"rotary_embedding_dim": 4, "num_heads": HEADS}))


def portability_cases():
    """A Llama-style query: 3-D input, (B, S) positions, caches as initializers."""
    rng = np.random.default_rng(41)
    tables = _arrays(rng, 2, 5, np.float32, 3, False, HEAD)
    model = _model(tables, {"num_heads": HEADS})
    model.graph.initializer.extend(onnx.numpy_helper.from_array(tables[n], n) for n in "cs")
    kept = [i for i in model.graph.input if i.name not in ("c", "s")]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    feeds, expected = [], []
    for batch, seq in [(2, 5), (1, 7)]:
        arrays = {**_arrays(rng, batch, seq, np.float32, 3, False, HEAD),
                  "c": tables["c"], "s": tables["s"]}
        feeds.append({"x": arrays["x"], "p": arrays["p"]})
        expected.append([_torch(arrays, 0, HEAD).astype(np.float32)])
    return [{"id": "contrib RotaryEmbedding (3-D, Llama-style)", "model": model,
             "feeds": feeds, "expected": expected, "atol": 1e-5}]



@pytest.mark.parametrize("target", [17, 13, 11])
def test_onnx_rotary_embedding_below_23_against_the_backend_cases(target):
    """ONNX's RotaryEmbedding-23 taken down (--target-opset): every one of ONNX's own
    backend cases for it (its expected outputs are the oracle), on ONNX Runtime."""
    import backend_opsets

    names = [c.name for c in backend_opsets.cases() if c.name.startswith(
        "test_rotary_embedding") and not c.name.endswith("_expanded")]
    assert len(names) >= 8
    results = backend_opsets.measure([target], names=names)
    assert [r for r in results if r.status != "exact"] == []
