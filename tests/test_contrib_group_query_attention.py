"""ONNX Runtime's GroupQueryAttention, decomposed: against ONNX Runtime's own CPU kernel on the
original node and against a torch float64 oracle written from the schema's rules (not from
the pattern): first prompts (full and right-padded), decode steps with a growing cache and
with a fixed-size (shared) buffer, a chunked prompt, packed and separate Q/K/V, rotary
(interleaved, partial, position ids), local windows, softcap, attention bias, head sinks,
smooth softmax, bidirectional (causal 0), float16; two sizes each with dynamic batch,
sequence and cache lengths; rejections."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.contrib_group_query_attention import GroupQueryAttention
from decomposer.testing import Case, check_pattern

from _helpers import make_model, run_onnxruntime

HEADS, KV_HEADS, POSITIONS = 4, 2, 32
NAMES = ["query", "key", "value", "past_key", "past_value", "seqlens_k",
         "total_sequence_length", "cos_cache", "sin_cache", "position_ids", "attention_bias",
         "head_sink"]


def _model(feeds, attrs, outputs=3, dtype=np.float32, head=16):
    """A one-node model over the inputs ``feeds`` holds (the others left out)."""
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    dims = {"query": ["B", "S", feeds["query"].shape[2]],
            "key": ["B", "S", KV_HEADS * head], "value": ["B", "S", KV_HEADS * head],
            "past_key": ["B", KV_HEADS, "P", head], "past_value": ["B", KV_HEADS, "P", head],
            "seqlens_k": ["B"], "total_sequence_length": [],
            "position_ids": ["B", "S"], "attention_bias": ["B", HEADS, "S", "T"],
            "head_sink": [HEADS]}
    last = max(NAMES.index(name) for name in feeds)
    node_inputs = [name if name in feeds else "" for name in NAMES[:last + 1]]
    inputs = []
    for name in node_inputs:
        if name:
            array = feeds[name]
            inputs.append(helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(array.dtype),
                dims.get(name, list(array.shape))))
    outs = [helper.make_tensor_value_info("output", elem, ["B", "S", HEADS * head])]
    outs += [helper.make_tensor_value_info(name, elem, ["B", KV_HEADS, "C", head])
             for name in ("present_key", "present_value")][:outputs - 1]
    node = helper.make_node("GroupQueryAttention", node_inputs, [o.name for o in outs],
                            name="gqa", domain="com.microsoft", num_heads=HEADS,
                            kv_num_heads=KV_HEADS, **attrs)
    return make_model([node], inputs, outs, 17, extra_opsets=["com.microsoft"])


def _feeds(rng, step, batch, options, dtype=np.float32, head=16):
    """Inputs for one step: ``prompt`` (right-padded when options say so), ``decode`` (a
    growing cache), ``static`` (a fixed buffer longer than the total) or ``chunk`` (a later
    prompt chunk of 1 + ``batch`` tokens, batch 1)."""
    if step == "prompt":
        seq = 5 if batch > 1 else 4
        past, total = 0, seq
        lengths = np.full(batch, seq)
        if options.get("padded") and batch > 1:
            lengths[1] = seq - 2
    elif step == "decode":
        seq, past = 1, 4 + batch
        total = past + seq
        lengths = np.array([total - i for i in range(batch)])
    elif step == "static":
        seq, past, total = 1, 9, 6 + batch
        lengths = np.array([total - 2 * i for i in range(batch)])
    else:  # chunk: ONNX Runtime takes a later chunk for one row only; ``batch`` sizes it
        seq, past, batch = 1 + batch, 4, 1
        total = past + seq
        lengths = np.array([total] * batch)
    width = KV_HEADS * head
    feeds = {}
    if options.get("packed"):
        feeds["query"] = rng.standard_normal((batch, seq, HEADS * head + 2 * width))
    else:
        feeds["query"] = rng.standard_normal((batch, seq, HEADS * head))
        feeds["key"] = rng.standard_normal((batch, seq, width))
        feeds["value"] = rng.standard_normal((batch, seq, width))
    if not options.get("no_past"):
        feeds["past_key"] = rng.standard_normal((batch, KV_HEADS, past, head))
        feeds["past_value"] = rng.standard_normal((batch, KV_HEADS, past, head))
    feeds = {k: v.astype(dtype) for k, v in feeds.items()}
    feeds["seqlens_k"] = (lengths - 1).astype(np.int32)
    feeds["total_sequence_length"] = np.array(total, np.int32)
    if options.get("rotary"):
        half = options.get("rotary_half", head // 2)
        table = np.random.default_rng(7)
        feeds["cos_cache"] = table.standard_normal((POSITIONS, half)).astype(dtype)
        feeds["sin_cache"] = table.standard_normal((POSITIONS, half)).astype(dtype)
    if options.get("position_ids"):
        start = rng.integers(0, 6, (batch, 1))
        feeds["position_ids"] = (start + np.arange(seq)[None]).astype(np.int64)
    if options.get("bias"):
        feeds["attention_bias"] = rng.standard_normal((batch, HEADS, seq, total)).astype(dtype)
    if options.get("sink"):
        feeds["head_sink"] = rng.standard_normal(HEADS).astype(dtype)
    return feeds


def _torch(feeds, attrs):
    """The schema's rules in torch, float64, one batch row at a time."""
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in feeds.items()}
    query = t["query"].double()
    batch, seq, width = query.shape
    packed = "key" not in t
    head = width // (HEADS + 2 * KV_HEADS) if packed else width // HEADS
    if packed:
        q, k, v = torch.split(query, [HEADS * head, KV_HEADS * head, KV_HEADS * head], -1)
    else:
        q, k, v = query, t["key"].double(), t["value"].double()
    q = q.reshape(batch, seq, HEADS, head)
    k = k.reshape(batch, seq, KV_HEADS, head)
    v = v.reshape(batch, seq, KV_HEADS, head)
    total = int(t["total_sequence_length"])
    past = t["past_key"].shape[2] if "past_key" in t else 0
    capacity = max(total, past)
    first_prompt = seq == total
    outputs, keys_out, values_out = [], [], []
    for row in range(batch):
        length = int(t["seqlens_k"][row]) + 1
        before = 0 if first_prompt else length - seq
        qr, kr, vr = q[row], k[row], v[row]  # (S, heads, h)
        if attrs.get("do_rotary"):
            if "position_ids" in t:
                ids = t["position_ids"]
                where = ids[0, 0] + torch.arange(seq) if first_prompt else ids[row]
            else:
                where = before + torch.arange(seq)
            cos, sin = t["cos_cache"].double()[where], t["sin_cache"].double()[where]
            rotary = 2 * cos.shape[1]

            def turn(x, cos=cos, sin=sin, rotary=rotary):
                c, s = cos[:, None], sin[:, None]
                part, rest = x[..., :rotary], x[..., rotary:]
                if attrs.get("rotary_interleaved"):
                    a, b = part[..., 0::2], part[..., 1::2]
                    part = torch.stack([a * c - b * s, b * c + a * s], -1).flatten(-2)
                else:
                    a, b = part.chunk(2, -1)
                    part = torch.cat([a * c - b * s, b * c + a * s], -1)
                return torch.cat([part, rest], -1)

            qr, kr = turn(qr), turn(kr)
        cache_k = torch.zeros(KV_HEADS, capacity, head, dtype=torch.float64)
        cache_v = torch.zeros(KV_HEADS, capacity, head, dtype=torch.float64)
        if before:
            cache_k[:, :before] = t["past_key"][row, :, :before].double()
            cache_v[:, :before] = t["past_value"][row, :, :before].double()
        cache_k[:, before:before + seq] = kr.transpose(0, 1)
        cache_v[:, before:before + seq] = vr.transpose(0, 1)
        keys_out.append(cache_k)
        values_out.append(cache_v)
        scale = attrs.get("scale") or head ** -0.5
        heads_out = []
        for n in range(HEADS):
            kv = n // (HEADS // KV_HEADS)
            rows = []
            for s in range(seq):
                end = min(before + s + 1, length) if attrs.get("causal", 1) else length
                start = max(0, end - attrs["local_window_size"]) \
                    if attrs.get("local_window_size", -1) > 0 else 0
                x = (qr[s, n] @ cache_k[kv, start:end].T) * scale
                if attrs.get("softcap", 0) > 0:
                    x = attrs["softcap"] * torch.tanh(x / attrs["softcap"])
                if "attention_bias" in t:
                    bias = t["attention_bias"].double()
                    x = x + bias[row if bias.shape[0] > 1 else 0, n, s, start:end]
                if "head_sink" in t or attrs.get("smooth_softmax") == 1:
                    sink = t["head_sink"][n].double() if "head_sink" in t else \
                        torch.tensor(0.0, dtype=torch.float64)
                    p = torch.softmax(torch.cat([x, sink[None]]), 0)[:-1]
                else:
                    p = torch.softmax(x, 0)
                rows.append(p @ cache_v[kv, start:end])
            heads_out.append(torch.stack(rows))
        outputs.append(torch.stack(heads_out, 1).reshape(seq, HEADS * head))
    return [torch.stack(outputs).numpy(), torch.stack(keys_out).numpy(),
            torch.stack(values_out).numpy()]


SCENARIOS = [
    ("prompt, rotary (genai)", "prompt", {"rotary": 1}, {"do_rotary": 1}),
    ("prompt, packed, rotary (genai)", "prompt", {"rotary": 1, "packed": 1},
     {"do_rotary": 1, "scale": 0.2}),
    ("prompt right-padded", "prompt", {"padded": 1}, {}),
    ("prompt without past", "prompt", {"no_past": 1, "rotary": 1}, {"do_rotary": 1}),
    ("decode, rotary", "decode", {"rotary": 1}, {"do_rotary": 1}),
    ("decode, packed, interleaved rotary", "decode", {"rotary": 1, "packed": 1},
     {"do_rotary": 1, "rotary_interleaved": 1}),
    ("decode, fixed-size buffer", "static", {"rotary": 1}, {"do_rotary": 1}),
    ("decode, position ids", "decode", {"rotary": 1, "position_ids": 1}, {"do_rotary": 1}),
    ("prompt, position ids", "prompt", {"rotary": 1, "position_ids": 1}, {"do_rotary": 1}),
    ("chunked prompt", "chunk", {"rotary": 1}, {"do_rotary": 1}),
    ("decode, local window, softcap", "decode", {}, {"local_window_size": 3, "softcap": 2.0}),
    ("prompt, local window", "prompt", {}, {"local_window_size": 2}),
    ("decode, attention bias, head sink", "decode", {"bias": 1, "sink": 1}, {}),
    ("decode, smooth softmax", "static", {}, {"smooth_softmax": 1}),
    ("prompt, bidirectional", "prompt", {"padded": 1}, {"causal": 0}),
]


@pytest.mark.parametrize("step, options, attrs", [s[1:] for s in SCENARIOS],
                         ids=[s[0] for s in SCENARIOS])
def test_matches_the_kernel_and_torch(step, options, attrs):
    rng = np.random.default_rng(len(step) + 3 * len(options) + 7 * len(attrs))
    model = _model(_feeds(rng, step, 2, options), attrs)
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {"GroupQueryAttention": 1}
    onnx.checker.check_model(out, full_check=True)
    for batch in (2, 1):
        feeds = _feeds(rng, step, batch, options)
        got = run_onnxruntime(out, feeds)
        kernel = run_onnxruntime(model, feeds)
        want = _torch(feeds, attrs)
        for name, g, k, w in zip(("output", "present_key", "present_value"), got, kernel,
                                 want, strict=True):
            assert g.shape == k.shape == w.shape, name
            np.testing.assert_allclose(g, k, atol=2e-5, rtol=1e-4, err_msg=name)
            np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-4, err_msg=name)


def test_partial_rotary_and_float16():
    rng = np.random.default_rng(11)
    options = {"rotary": 1, "rotary_half": 8}
    for dtype, tolerance in ((np.float32, 2e-5), (np.float16, 4e-3)):
        model = _model(_feeds(rng, "decode", 2, options, dtype, 32), {"do_rotary": 1},
                       dtype=dtype, head=32)
        out = decomposer.decompose(model)
        onnx.checker.check_model(out, full_check=True)
        for step in ("prompt", "decode"):
            feeds = _feeds(rng, step, 2, options, dtype, 32)
            got, kernel = run_onnxruntime(out, feeds), run_onnxruntime(model, feeds)
            want = _torch(feeds, {"do_rotary": 1})
            for g, k, w in zip(got, kernel, want, strict=True):
                assert g.dtype == k.dtype == dtype
                np.testing.assert_allclose(g.astype(np.float64), k.astype(np.float64),
                                           atol=tolerance, rtol=tolerance)
                np.testing.assert_allclose(g.astype(np.float64), w, atol=tolerance,
                                           rtol=tolerance)


def test_kit_at_the_opset_ends():
    """Separate Q/K/V with a past, prompt and decode input sets through one model."""
    rng = np.random.default_rng(5)

    def ordered(feeds):
        return [feeds[name] for name in NAMES[:7]]

    prompt, decode = _feeds(rng, "prompt", 2, {}), _feeds(rng, "decode", 1, {})
    case = Case(ordered(prompt), attrs={"num_heads": HEADS, "kv_num_heads": KV_HEADS},
                symbolic={0: (0, 1), 1: (0, 1), 2: (0, 1), 3: (0, 2), 4: (0, 2), 5: (0,)},
                more_inputs=[ordered(decode)], output_rank=[3, 4, 4])

    def oracle(*inputs, **attrs):
        return [w.astype(np.float32) for w in _torch(dict(zip(NAMES, inputs, strict=False)),
                                                     attrs)]

    check_pattern(GroupQueryAttention(), [case], opsets=(11, onnx.defs.onnx_opset_version()),
                  oracle=oracle, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("change, message", [
    ({"attrs": {"qk_output": 1}}, "attribute 'qk_output'"),
    ({"attrs": {"local_window_size": 0}}, "leaves no key"),
    ({"attrs": {"local_window_size": 2, "causal": 0}}, "needs causal 1"),
    ({"attrs": {"k_quant_type": "PER_TENSOR"}}, "attribute 'k_quant_type'"),
    ({"attrs": {"num_heads": 3}}, "multiple of kv_num_heads"),
    ({"outputs": 4}, "expected 1 to 3 output"),
    ({"attrs": {"do_rotary": 1}}, "needs cos_cache and sin_cache"),
])
def test_rejections(change, message):
    feeds = _feeds(np.random.default_rng(0), "prompt", 2, {})
    model = _model(feeds, {})
    node = model.graph.node[0]
    for name, value in change.get("attrs", {}).items():
        for attribute in list(node.attribute):
            if attribute.name == name:
                node.attribute.remove(attribute)
        node.attribute.append(helper.make_attribute(name, value))
    if change.get("outputs") == 4:
        node.output.append("qk")
        model.graph.output.append(helper.make_tensor_value_info("qk", TensorProto.FLOAT,
                                                                ["B", HEADS, "S", "T"]))
    with pytest.raises(decomposer.UnsupportedNodeError, match=message):
        decomposer.decompose(model)


def portability_cases():
    """The genai builder's form: packed QKV, rotary caches as initializers, a KV cache fed
    back; a prompt and a decode step through the same model."""
    rng = np.random.default_rng(47)
    options = {"rotary": 1, "packed": 1}
    tables = _feeds(rng, "prompt", 2, options)
    model = _model(tables, {"do_rotary": 1, "scale": 0.25})
    model.graph.initializer.extend(onnx.numpy_helper.from_array(tables[n], n)
                                   for n in ("cos_cache", "sin_cache"))
    kept = [i for i in model.graph.input if i.name not in ("cos_cache", "sin_cache")]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    feeds, expected = [], []
    for step, batch in (("prompt", 2), ("decode", 1)):
        f = _feeds(rng, step, batch, options)
        expected.append([w.astype(np.float32) for w in _torch(f, {"do_rotary": 1,
                                                                  "scale": 0.25})])
        feeds.append({k: v for k, v in f.items() if k not in ("cos_cache", "sin_cache")})
    return [{"id": "contrib GroupQueryAttention (genai: packed, rotary, KV cache)",
             "model": model, "feeds": feeds, "expected": expected, "atol": 2e-5}]
