"""ONNX Runtime's normalizations, decomposed: against torch (float64: ``F.layer_norm``, and
RMSNorm written out) and against ONNX Runtime's own kernel for the original node, every
output, with optional inputs and outputs present or absent, broadcast skips, float16/32
(and float64 where the schema takes it), dynamic dims and the opset ends."""

from __future__ import annotations

import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.contrib_normalizations import (
    LayerNormalization,
    SimplifiedLayerNormalization,
    SkipLayerNormalization,
    SkipSimplifiedLayerNormalization,
)
from decomposer.testing import Case, check_pattern

from _helpers import make_model, run_onnxruntime

TOLERANCE = {np.float32: 2e-5, np.float16: 4e-3, np.float64: 1e-10, np.int32: 0}
STAT_NAMES = {"mean": 1, "inv_std": 2, "sum": 3}


def _t(a):
    return torch.from_numpy(np.asarray(a, np.float64))


def torch_reference(op, x, skip=None, scale=None, beta=None, bias=None, eps=1e-5, axis=-1):
    """(output, mean, inv_std, sum) in float64 by torch; mean and inv_std keep the
    normalized axes as 1."""
    s = _t(x) + (0 if skip is None else _t(skip)) + (0 if bias is None else _t(bias))
    axes = tuple(range(axis % x.ndim, x.ndim))
    rms = "Simplified" in op
    if rms:
        inv_std = torch.rsqrt((s * s).mean(dim=axes, keepdim=True) + eps)
        y = s * inv_std * _t(scale)
        mean = torch.zeros_like(inv_std)
    else:
        y = F.layer_norm(s, s.shape[axis % x.ndim:], None if scale.ndim < len(axes) else
                         _t(scale), eps=eps)
        if scale.ndim < len(axes):
            y = y * _t(scale)
        if beta is not None:
            y = y + _t(beta)
        mean = s.mean(dim=axes, keepdim=True)
        inv_std = torch.rsqrt(s.var(dim=axes, unbiased=False, keepdim=True) + eps)
    return [y.numpy(), mean.numpy(), inv_std.numpy(), s.numpy()]


def _model(op, arrays, outputs, attrs, opset, domain):
    """``arrays``: input arrays in schema order, None for an absent optional one; every
    dim but the last symbolic, so the second input set may change them."""
    names = [f"in{i}" if a is not None else "" for i, a in enumerate(arrays)]
    inputs = [helper.make_tensor_value_info(
        name, helper.np_dtype_to_tensor_dtype(a.dtype),
        [f"{name}_d{i}" if i < a.ndim - 1 else a.shape[-1] for i in range(a.ndim)]
        if a.ndim > 1 else list(a.shape))
        for name, a in zip(names, arrays, strict=True) if name]
    x = arrays[0]
    elem = helper.np_dtype_to_tensor_dtype(x.dtype)
    outs = [helper.make_tensor_value_info(
        name, elem if kind in ("output", "sum") else TensorProto.FLOAT, [None] * x.ndim)
        for kind, name in outputs if name]
    node = helper.make_node(op, names, [name for _, name in outputs], name="norm",
                            domain=domain, **attrs)
    extra = ["com.microsoft"] if domain else []
    return make_model([node], inputs, outs, opset, extra_opsets=extra), \
        {n: a for n, a in zip(names, arrays, strict=True) if n}


SKIP_OUTPUTS = [("output", "y"), ("mean", "mean"), ("inv_std", "inv_std"), ("sum", "sum")]


def _skip_arrays(rng, shape, dtype, skip_shape=None, beta=True, bias=True, simplified=False):
    hidden = shape[-1]
    x = rng.standard_normal(shape).astype(dtype)
    skip = rng.standard_normal(skip_shape or shape).astype(dtype)
    gamma = rng.standard_normal(hidden).astype(dtype)
    vectors = [rng.standard_normal(hidden).astype(dtype) if flag else None
               for flag in ((bias,) if simplified else (beta, bias))]
    return [x, skip, gamma, *vectors]


def _compare(got, want, dtype, what):
    """Within the tolerance of the output's own type (the statistics are float32 for every
    input type), or of the input's if that is coarser."""
    tolerance = max(TOLERANCE[np.asarray(got).dtype.type], TOLERANCE[dtype])
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64),
                               atol=tolerance, rtol=tolerance, err_msg=what)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("skip_shape", ["full", "SH", "1SH"])
@pytest.mark.parametrize("op", ["SkipLayerNormalization", "SkipSimplifiedLayerNormalization"])
def test_skip_normalizations_match_torch_and_the_kernel(op, skip_shape, dtype):
    simplified = "Simplified" in op
    rng = np.random.default_rng(len(op) + len(skip_shape))

    def arrays_for(shape):
        skip = {"full": shape, "SH": shape[1:], "1SH": (1, *shape[1:])}[skip_shape]
        return _skip_arrays(rng, shape, dtype, skip, simplified=simplified)

    arrays = arrays_for((2, 5, 16))
    model, _ = _model(op, arrays, SKIP_OUTPUTS, {"epsilon": 1e-5}, 17, "com.microsoft")
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {op: 1}
    onnx.checker.check_model(out, full_check=True)
    for shape in [(2, 5, 16), (3, 2, 16)]:  # dynamic batch and sequence
        arrays = arrays_for(shape)
        feeds = {f"in{i}": a for i, a in enumerate(arrays) if a is not None}
        got = run_onnxruntime(out, feeds)
        x, skip, gamma, *rest = arrays
        beta, bias = (None, rest[0]) if simplified else rest
        want = torch_reference(op, x, skip, gamma, beta, bias)
        kernel = run_onnxruntime(model, feeds)
        for index, (g, w, k) in enumerate(zip(got, want, kernel, strict=True)):
            assert g.dtype == k.dtype and g.shape == k.shape, (index, g.dtype, k.dtype)
            _compare(g, w, dtype, f"{op} output {index} vs torch")
            _compare(g, k, dtype, f"{op} output {index} vs ONNX Runtime's kernel")


@pytest.mark.parametrize("present", [(False, False), (True, False), (False, True)])
def test_optional_inputs_and_outputs(present):
    """beta and bias absent or alone (an absent one written as ""), and only some outputs
    asked for: the node writes exactly those."""
    beta_on, bias_on = present
    rng = np.random.default_rng(7)
    arrays = _skip_arrays(rng, (2, 3, 8), np.float32, beta=beta_on, bias=bias_on)
    outputs = [("output", "y"), ("mean", ""), ("inv_std", ""), ("sum", "sum")]
    model, feeds = _model("SkipLayerNormalization", arrays, outputs, {}, 17, "com.microsoft")
    out = decomposer.decompose(model)
    assert [o.name for o in out.graph.output] == ["y", "sum"]
    got, kernel = run_onnxruntime(out, feeds), run_onnxruntime(model, feeds)
    for g, k in zip(got, kernel, strict=True):
        _compare(g, k, np.float32, "vs ONNX Runtime's kernel (epsilon default 1e-12)")


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("axis", [-1, 1])
@pytest.mark.parametrize("op", ["SimplifiedLayerNormalization", "LayerNormalization"])
def test_default_domain_normalizations(op, axis, dtype):
    rng = np.random.default_rng(axis + 5)
    shape = (2, 3, 8)
    x = rng.standard_normal(shape).astype(dtype)
    scale = rng.standard_normal(shape[axis % 3:]).astype(dtype)
    arrays = [x, scale]
    outputs = [("output", "y"), ("inv_std", "inv_std")]
    if op == "LayerNormalization":
        arrays.append(rng.standard_normal(shape[axis % 3:]).astype(dtype))
        outputs = [("output", "y"), ("mean", "mean"), ("inv_std", "inv_std")]
    opset = 17 if op == "SimplifiedLayerNormalization" else 16
    model, feeds = _model(op, arrays, outputs, {"axis": axis, "epsilon": 1e-4}, opset, "")
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {op: 1} and all(not n.domain for n in out.graph.node)
    got, kernel = run_onnxruntime(out, feeds), run_onnxruntime(model, feeds)
    want = torch_reference(op, x, scale=scale, beta=arrays[2] if len(arrays) > 2 else None,
                           eps=1e-4, axis=axis)
    picked = [want[0], *(want[STAT_NAMES[kind]] for kind, _ in outputs[1:])]
    for index, (g, w, k) in enumerate(zip(got, picked, kernel, strict=True)):
        assert g.dtype == k.dtype and g.shape == k.shape
        _compare(g, w, dtype, f"{op} output {index} vs torch")
        _compare(g, k, dtype, f"{op} output {index} vs ONNX Runtime's kernel")


def test_layer_normalization_from_17_is_standard_and_left_alone():
    x = np.ones((2, 8), np.float32)
    model, _ = _model("LayerNormalization", [x, x[0]], [("output", "y")], {}, 17, "")
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {} and [n.op_type for n in out.graph.node] == ["LayerNormalization"]


@pytest.mark.parametrize("pattern, cases", [
    (SkipLayerNormalization(), [Case([np.random.default_rng(1).standard_normal(s).astype(
        np.float32) for s in [(2, 3, 8), (2, 3, 8), (8,), (8,), (8,)]],
        attrs={"epsilon": 1e-5}, symbolic={0: (0, 1), 1: (0, 1)},
        output_dtype=[np.float32] * 4)]),
    (SkipSimplifiedLayerNormalization(), [Case([np.random.default_rng(2).standard_normal(
        s).astype(np.float32) for s in [(4, 8), (4, 8), (8,), (8,)]],
        attrs={"epsilon": 1e-5}, symbolic={0: (0,), 1: (0,)},
        output_dtype=[np.float32] * 4)]),
    (SimplifiedLayerNormalization(), [Case([np.random.default_rng(3).standard_normal(
        s).astype(np.float32) for s in [(2, 5, 6), (6,)]], symbolic={0: (0, 1)},
        output_dtype=[np.float32] * 2)]),
    (LayerNormalization(), [Case([np.random.default_rng(4).standard_normal(
        s).astype(np.float32) for s in [(2, 5, 6), (5, 6), (5, 6)]], attrs={"axis": -2},
        symbolic={0: (0,)}, output_dtype=[np.float32] * 3)]),
], ids=lambda value: getattr(value, "op_type", ""))
def test_kit_at_the_opset_ends(pattern, cases):
    """The test kit: every output against the pattern's numpy reference on ONNX Runtime,
    full_check, and the portability rules, at opset 11 and the newest (LayerNormalization:
    below 17 only, where it is not standard)."""
    newest = 16 if pattern.op_type == "LayerNormalization" else \
        onnx.defs.onnx_opset_version()
    check_pattern(pattern, cases, opsets=(11, newest), atol=2e-5, rtol=2e-5)


def test_target_ort_keeps_the_nodes():
    rng = np.random.default_rng(0)
    arrays = _skip_arrays(rng, (2, 3, 8), np.float32)
    model, _ = _model("SkipLayerNormalization", arrays, [("output", "y")], {}, 17,
                      "com.microsoft")
    out, report = decomposer.decompose_with_report(model, target="ort")
    assert report.counts == {} and out.graph.node[0].op_type == "SkipLayerNormalization"
    x = np.ones((2, 8), np.float32)
    model, _ = _model("SimplifiedLayerNormalization", [x, x[0]], [("output", "y")], {}, 17,
                      "")
    out, report = decomposer.decompose_with_report(model, target="ort")
    assert report.counts == {}, "ONNX Runtime runs its default-domain registrations itself"


def test_rejections_name_the_node_and_the_reason():
    x = np.ones((2, 3, 8), np.float32)
    model, _ = _model("SkipLayerNormalization", [x, x, x[0, 0], x[0]], [("output", "y")], {},
                      17, "com.microsoft")
    with pytest.raises(decomposer.UnsupportedNodeError,
                       match="node 'norm'.*beta 'in3' has rank 2, more than the normalized"):
        decomposer.decompose(model)
    model, _ = _model("SkipLayerNormalization", [x.astype(np.int32)] * 2 + [x[0, 0]],
                      [("output", "y")], {}, 17, "com.microsoft")
    with pytest.raises(decomposer.UnsupportedNodeError, match="input must be"):
        decomposer.decompose(model)
    model, _ = _model("SimplifiedLayerNormalization", [x, x[0, 0]], [("output", "y")],
                      {"axis": 3}, 17, "")
    with pytest.raises(decomposer.UnsupportedNodeError, match="axis 3 is out of range"):
        decomposer.decompose(model)


def test_layer_normalization_17_where_no_statistics_are_asked_for():
    rng = np.random.default_rng(6)
    arrays = _skip_arrays(rng, (2, 3, 8), np.float32)
    for opset, outputs, native in ((17, [("output", "y")], True),
                                   (17, [("output", "y"), ("mean", "mean")], False),
                                   (16, [("output", "y")], False)):
        model, feeds = _model("SkipLayerNormalization", arrays, outputs, {}, opset,
                              "com.microsoft")
        out = decomposer.decompose(model)
        ops = [n.op_type for n in out.graph.node]
        assert ("LayerNormalization" in ops) is native and ("ReduceMean" in ops) is not native
        for got, want in zip(run_onnxruntime(out, feeds), run_onnxruntime(model, feeds),
                             strict=True):
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_fused_back_by_onnx_runtime():
    """Below opset 17, written in the order of ONNX Runtime's LayerNormFusion: with its
    optimizations on, the decomposed model runs ONNX Runtime's own normalization kernels
    again."""
    rng = np.random.default_rng(5)
    arrays = _skip_arrays(rng, (2, 3, 8), np.float32, beta=True, bias=False)
    model, _ = _model("SkipLayerNormalization", arrays, [("output", "y")], {}, 16,
                      "com.microsoft")
    out = decomposer.decompose(model)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    with tempfile.TemporaryDirectory() as folder:
        options.optimized_model_filepath = f"{folder}/fused.onnx"
        ort.InferenceSession(out.SerializeToString(), options,
                             providers=["CPUExecutionProvider"])
        ops = [n.op_type for n in onnx.load(f"{folder}/fused.onnx").graph.node]
    assert "LayerNormalization" in ops or "SkipLayerNormalization" in ops, ops


# -- portability (the hook of scripts/portability_cases.py) ---------------------------------


def portability_cases():
    """A residual block as ONNX Runtime's optimizer leaves it: SkipLayerNormalization with
    every output, then SkipSimplifiedLayerNormalization on its sum, then
    SimplifiedLayerNormalization (default domain); dynamic batch and sequence."""
    rng = np.random.default_rng(11)
    hidden = 8
    vectors = {name: rng.standard_normal(hidden).astype(np.float32)
               for name in ("gamma", "beta", "bias", "gamma2", "scale")}
    initializers = [onnx.numpy_helper.from_array(v, n) for n, v in vectors.items()]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", "S", hidden])
              for n in ("x", "skip")]
    nodes = [
        helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta", "bias"],
                         ["ln", "", "", "sum"], domain="com.microsoft", epsilon=1e-5),
        helper.make_node("SkipSimplifiedLayerNormalization", ["ln", "sum", "gamma2"],
                         ["rms"], domain="com.microsoft", epsilon=1e-5),
        helper.make_node("SimplifiedLayerNormalization", ["rms", "scale"], ["y"],
                         epsilon=1e-5)]
    model = make_model(nodes, inputs, [helper.make_tensor_value_info(
        "y", TensorProto.FLOAT, ["N", "S", hidden])], 17, extra_opsets=["com.microsoft"],
        initializers=initializers)
    feeds, expected = [], []
    for n, s in [(2, 3), (1, 5)]:
        x = rng.standard_normal((n, s, hidden)).astype(np.float32)
        skip = rng.standard_normal((n, s, hidden)).astype(np.float32)
        ln, _, _, total = torch_reference("SkipLayerNormalization", x, skip, vectors["gamma"],
                                          vectors["beta"], vectors["bias"])
        rms = torch_reference("SkipSimplifiedLayerNormalization", ln, total,
                              vectors["gamma2"])[0]
        y = torch_reference("SimplifiedLayerNormalization", rms, scale=vectors["scale"])[0]
        feeds.append({"x": x, "skip": skip})
        expected.append([y.astype(np.float32)])
    cases = [{"id": "contrib normalizations chain (com.microsoft and default domain)",
              "model": model, "feeds": feeds, "expected": expected, "atol": 2e-5}]
    # BERT's embeddings: EmbedLayerNormalization with segments and a mask, dynamic B and S
    tables = _embed_case(rng, 2, 5, np.float32)
    embed = _embed_model(tables, outputs=2, shared_dims=True)
    constant = ("we", "pe", "se", "g", "be")
    embed.graph.initializer.extend(onnx.numpy_helper.from_array(tables[n], n) for n in constant)
    kept = [i for i in embed.graph.input if i.name not in constant]
    del embed.graph.input[:]
    embed.graph.input.extend(kept)
    feeds, expected = [], []
    for batch, seq in [(2, 5), (3, 7)]:
        arrays = {**_embed_case(rng, batch, seq, np.float32),
                  **{n: tables[n] for n in constant}}
        feeds.append({n: arrays[n] for n in ("ids", "seg", "m")})
        y, mask_index, _ = _embed_torch(arrays)
        expected.append([y.astype(np.float32), mask_index])
    cases.append({"id": "contrib EmbedLayerNormalization (BERT embeddings)", "model": embed,
                  "feeds": feeds, "expected": expected, "atol": 2e-5})
    return cases


# -- EmbedLayerNormalization ------------------------------------------------------------------


def _embed_case(rng, batch, seq, dtype, segments=True, mask=True, position_ids=None):
    hidden, vocab, positions, types = 8, 30, 16, 2
    arrays = {
        "ids": rng.integers(0, vocab, (batch, seq)).astype(np.int32),
        "seg": rng.integers(0, types, (batch, seq)).astype(np.int32) if segments else None,
        "we": rng.standard_normal((vocab, hidden)).astype(dtype),
        "pe": rng.standard_normal((positions, hidden)).astype(dtype),
        "se": rng.standard_normal((types, hidden)).astype(dtype) if segments else None,
        "g": rng.standard_normal(hidden).astype(dtype),
        "be": rng.standard_normal(hidden).astype(dtype),
        "m": (rng.random((batch, seq)) < 0.7).astype(np.int32) if mask else None,
        "pos": None,
    }
    if position_ids == "BS":
        arrays["pos"] = rng.integers(0, positions, (batch, seq)).astype(np.int32)
    elif position_ids == "1S":
        arrays["pos"] = rng.permutation(positions)[:seq][None].astype(np.int32)
    return arrays


def _embed_model(arrays, outputs=3, shared_dims=False):
    """``shared_dims``: ids, segments, mask and positions share the names "B", "S" (as an
    exporter writes them when told they are one batch and sequence); otherwise each input
    has its own (TVM cannot broadcast differently named dims: the portability case shares
    them)."""
    order = ["ids", "seg", "we", "pe", "se", "g", "be", "m", "pos"]
    while arrays[order[-1]] is None:
        order.pop()
    names = [n if arrays[n] is not None else "" for n in order]
    symbolic = {"ids", "seg", "m", "pos"}
    inputs = [helper.make_tensor_value_info(
        n, helper.np_dtype_to_tensor_dtype(arrays[n].dtype),
        [(("B", "S")[i] if shared_dims else f"{n}_d{i}")
         if n in symbolic and arrays[n].shape[i] != 1 else s
         for i, s in enumerate(arrays[n].shape)]) for n in names if n]
    elem = helper.np_dtype_to_tensor_dtype(arrays["we"].dtype)
    outs = [helper.make_tensor_value_info("y", elem, [None] * 3),
            helper.make_tensor_value_info("mask_index", TensorProto.INT32, [None]),
            helper.make_tensor_value_info("sum", elem, [None] * 3)][:outputs]
    node = helper.make_node("EmbedLayerNormalization", names, [o.name for o in outs],
                            name="embed", domain="com.microsoft", epsilon=1e-5)
    return make_model([node], inputs, outs, 17, extra_opsets=["com.microsoft"])


def _embed_torch(arrays):
    s = _t(arrays["we"])[torch.from_numpy(arrays["ids"]).long()]
    pos = arrays["pos"]
    s = s + (_t(arrays["pe"])[torch.from_numpy(pos).long()] if pos is not None
             else _t(arrays["pe"])[: arrays["ids"].shape[1]])
    if arrays["seg"] is not None:
        s = s + _t(arrays["se"])[torch.from_numpy(arrays["seg"]).long()]
    y = F.layer_norm(s, (s.shape[-1],), _t(arrays["g"]), _t(arrays["be"]), eps=1e-5)
    mask = arrays["m"]
    mask_index = (mask == 1).sum(axis=1) if mask is not None else np.zeros(len(arrays["ids"]))
    return [y.numpy(), mask_index.astype(np.int32), s.numpy()]


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("variant", ["full", "no segments", "no mask", "position ids BS",
                                     "position ids 1S"])
def test_embed_layer_normalization_matches_torch_and_the_kernel(variant, dtype):
    rng = np.random.default_rng(len(variant))
    options = {"segments": variant != "no segments", "mask": variant != "no mask",
               "position_ids": {"position ids BS": "BS", "position ids 1S": "1S"}.get(variant)}
    model = _embed_model(_embed_case(rng, 2, 5, dtype, **options),
                         outputs=3 if options["mask"] else 2)
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {"EmbedLayerNormalization": 1}
    onnx.checker.check_model(out, full_check=True)
    for batch, seq in [(2, 5), (3, 7)]:  # dynamic batch and sequence
        arrays = _embed_case(rng, batch, seq, dtype, **options)
        feeds = {n: a for n, a in arrays.items() if a is not None}
        got, kernel = run_onnxruntime(out, feeds), run_onnxruntime(model, feeds)
        want = _embed_torch(arrays)
        for index, (g, w, k) in enumerate(zip(got, want, kernel, strict=False)):
            assert g.dtype == k.dtype and g.shape == k.shape, (index, g.dtype, k.dtype)
            _compare(g, w, dtype, f"output {index} vs torch")
            _compare(g, k, dtype, f"output {index} vs ONNX Runtime's kernel")


def test_embed_layer_normalization_mask_index_counts_ones_as_the_kernel_does():
    rng = np.random.default_rng(2)
    arrays = _embed_case(rng, 3, 5, np.float32)
    arrays["m"] = np.array([[1, 0, 1, 1, 0], [2, 2, 0, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    model = _embed_model(arrays)
    feeds = {n: a for n, a in arrays.items() if a is not None}
    got = run_onnxruntime(decomposer.decompose(model), feeds)[1]
    assert got.tolist() == run_onnxruntime(model, feeds)[1].tolist() == [3, 0, 5]


def test_embed_layer_normalization_rejections():
    rng = np.random.default_rng(3)
    arrays = _embed_case(rng, 2, 5, np.float32)
    arrays["se"] = None
    with pytest.raises(decomposer.UnsupportedNodeError,
                       match="node 'embed'.*segment_ids and segment_embedding come together"):
        decomposer.decompose(_embed_model(arrays))


@pytest.mark.parametrize("axis", [-1, -2])
def test_onnx_rms_normalization_below_23_matches_torch(axis):
    """ONNX's RMSNormalization-23 in the default domain below opset 23 (--target-opset),
    against torch.nn.functional.rms_norm, at two sizes with dynamic leading dims."""
    from decomposer.patterns.contrib_normalizations import RMSNormalization

    rng = np.random.default_rng(12)
    scale = rng.standard_normal((5, 6)[axis:] if axis == -1 else (5, 6)).astype(np.float32)
    normalized = (6,) if axis == -1 else (5, 6)

    def oracle(x, scale, axis=-1, epsilon=1e-5):
        return torch.nn.functional.rms_norm(torch.from_numpy(x), normalized,
                                            torch.from_numpy(scale), eps=epsilon).numpy()

    cases = [Case([rng.standard_normal((2, 5, 6)).astype(np.float32), scale],
                  {"axis": axis, "epsilon": 1e-4}, symbolic={0: (0,)},
                  more_inputs=[[rng.standard_normal((7, 5, 6)).astype(np.float32), scale]])]
    check_pattern(RMSNormalization(), cases, opsets=(11, 13, 17, 22), domain="",
                  oracle=oracle, atol=2e-5, rtol=2e-5)
