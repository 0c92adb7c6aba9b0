"""ONNX Runtime's MultiHeadAttention, decomposed: against ONNX Runtime's own CPU kernel and
against torch's ``F.scaled_dot_product_attention`` (float64, the additive mask built from
the same rules), for separate Q/K/V with and without bias, key padding masks of each form,
attention bias, past/present and unidirectional, float16, key and value split into heads
(4-D), and the packed QKV / KV forms (torch only: ONNX Runtime has them on CUDA only), at
two sizes with dynamic dims."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer

from _helpers import make_model, run_onnxruntime

HEADS, HIDDEN, VALUE = 2, 8, 6


def _model(inputs_present, outputs=1, attrs=None, elem=TensorProto.FLOAT):
    names = ["query", "key", "value", "bias", "mask", "attention_bias", "past_key",
             "past_value"]
    dims = {"query": ["B", "S", HIDDEN], "key": ["B", "L", HIDDEN],
            "value": ["B", "L", VALUE], "bias": [2 * HIDDEN + VALUE],
            "attention_bias": ["B", HEADS, "S", "T"],
            "past_key": ["B", HEADS, "P", HIDDEN // HEADS],
            "past_value": ["B", HEADS, "P", VALUE // HEADS]}
    inputs, node_inputs = [], []
    inputs_present = {"query": 1, "key": 1, "value": 1, **inputs_present}
    for name in names:
        if name not in inputs_present:
            node_inputs.append("")
            continue
        node_inputs.append(name)
        if name == "mask":
            kind = inputs_present["mask"]
            total = "T" if "past_key" in inputs_present else "L"  # the keys' own symbol
            shape = {"lengths": ["B"], "raw2": ["B", total], "raw3": ["B", "S", total]}[kind]
            inputs.append(helper.make_tensor_value_info(name, TensorProto.INT32, shape))
        else:
            inputs.append(helper.make_tensor_value_info(name, elem, dims[name]))
    while node_inputs[-1] == "":
        node_inputs.pop()
    outs = [helper.make_tensor_value_info("output", elem, ["B", "S", VALUE])]
    if outputs == 3:
        outs += [helper.make_tensor_value_info("present_key", elem,
                                               ["B", HEADS, "T", HIDDEN // HEADS]),
                 helper.make_tensor_value_info("present_value", elem,
                                               ["B", HEADS, "T", VALUE // HEADS])]
    node = helper.make_node("MultiHeadAttention", node_inputs, [o.name for o in outs],
                            name="mha", domain="com.microsoft", num_heads=HEADS,
                            **(attrs or {}))
    return make_model([node], inputs, outs, 17, extra_opsets=["com.microsoft"])


def _feeds(rng, present, batch, seq, keys, past):
    total = keys + past
    feeds = {"query": rng.standard_normal((batch, seq, HIDDEN)),
             "key": rng.standard_normal((batch, keys, HIDDEN)),
             "value": rng.standard_normal((batch, keys, VALUE))}
    if "bias" in present:
        feeds["bias"] = rng.standard_normal(2 * HIDDEN + VALUE)
    if "attention_bias" in present:
        feeds["attention_bias"] = rng.standard_normal((batch, HEADS, seq, total))
    if "past_key" in present:
        feeds["past_key"] = rng.standard_normal((batch, HEADS, past, HIDDEN // HEADS))
        feeds["past_value"] = rng.standard_normal((batch, HEADS, past, VALUE // HEADS))
    feeds = {k: v.astype(np.float32) for k, v in feeds.items()}
    kind = present.get("mask")
    if kind == "lengths":
        feeds["mask"] = rng.integers(1, total + 1, batch).astype(np.int32)
    elif kind:
        shape = (batch, total) if kind == "raw2" else (batch, seq, total)
        mask = (rng.uniform(size=shape) > 0.3).astype(np.int32)
        mask[..., 0] = 1
        feeds["mask"] = mask
    return feeds


def _torch(feeds, present, unidirectional=False):
    t = {k: torch.from_numpy(v.astype(np.float64)) for k, v in feeds.items()
         if k != "mask"}
    q, k, v = t["query"], t["key"], t["value"]
    if "bias" in t:
        bq, bk, bv = torch.split(t["bias"], [HIDDEN, HIDDEN, VALUE])
        q, k, v = q + bq, k + bk, v + bv

    def heads(x):
        return x.reshape(x.shape[0], x.shape[1], HEADS, -1).transpose(1, 2)

    q, k, v = heads(q), heads(k), heads(v)
    if "past_key" in t:
        k, v = torch.cat([t["past_key"], k], 2), torch.cat([t["past_value"], v], 2)
    batch, _, seq, _ = q.shape
    total = k.shape[2]
    additive = torch.zeros(batch, 1, seq, total, dtype=torch.float64)
    kind = present.get("mask")
    if kind == "lengths":
        keep = torch.arange(total)[None, :] < torch.from_numpy(feeds["mask"])[:, None]
        additive = additive + torch.where(keep, 0.0, -10000.0)[:, None, None, :]
    elif kind == "raw2":
        additive = additive + ((1 - torch.from_numpy(feeds["mask"]).double()) * -10000.0
                               )[:, None, None, :]
    elif kind == "raw3":
        additive = additive + ((1 - torch.from_numpy(feeds["mask"]).double()) * -10000.0
                               )[:, None, :, :]
    if unidirectional:
        later = torch.arange(total)[None, :] > torch.arange(seq)[:, None] + (total - seq)
        additive = additive + torch.where(later, -10000.0, 0.0)
    if "attention_bias" in t:
        additive = additive + t["attention_bias"]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=additive)
    return [out.transpose(1, 2).reshape(batch, seq, -1).numpy(), k.numpy(), v.numpy()]


@pytest.mark.parametrize("present, outputs, attrs", [
    ({}, 1, {}),
    ({"bias": 1}, 1, {"scale": 0.3}),
    ({"mask": "lengths"}, 1, {}),
    ({"bias": 1, "mask": "raw2"}, 1, {}),
    ({"mask": "raw3", "attention_bias": 1}, 1, {}),
    ({"past_key": 1, "past_value": 1, "bias": 1}, 3, {}),
    ({"past_key": 1, "past_value": 1, "mask": "raw2"}, 3, {"unidirectional": 1}),
], ids=lambda value: str(value))
def test_matches_the_kernel_and_torch(present, outputs, attrs, monkeypatch):
    if "past_key" in present:  # the kernel takes a past only with equal head sizes
        monkeypatch.setitem(globals(), "VALUE", HIDDEN)
    rng = np.random.default_rng(len(present) + outputs + len(attrs))
    model = _model(present, outputs, attrs)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    past = 3 if "past_key" in present else 0
    for batch, seq, keys in [(2, 4, 5), (1, 3, 3)]:
        if attrs.get("unidirectional"):
            keys = seq
        feeds = _feeds(rng, present, batch, seq, keys, past)
        got = run_onnxruntime(out, feeds)
        kernel = run_onnxruntime(model, feeds)
        for g, k in zip(got, kernel, strict=True):
            np.testing.assert_allclose(g, k, atol=2e-5, rtol=1e-4)
        if "scale" not in attrs:
            want = _torch(feeds, present, bool(attrs.get("unidirectional")))
            for g, w in zip(got, want, strict=False):
                np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-4)


def test_float16_against_the_kernel_and_torch():
    rng = np.random.default_rng(12)
    present = {"bias": 1, "mask": "raw2"}
    model = _model(present, elem=TensorProto.FLOAT16)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    for batch, seq, keys in [(2, 4, 5), (1, 3, 3)]:
        feeds = {k: v.astype(np.float16) if v.dtype == np.float32 else v
                 for k, v in _feeds(rng, present, batch, seq, keys, 0).items()}
        (got,), (kernel,) = run_onnxruntime(out, feeds), run_onnxruntime(model, feeds)
        assert got.dtype == kernel.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float64), kernel.astype(np.float64),
                                   atol=5e-3, rtol=5e-3)
        np.testing.assert_allclose(got.astype(np.float64), _torch(feeds, present)[0],
                                   atol=5e-3, rtol=5e-3)


def _layout_model(layout, bias=False):
    """Q/K/V in another layout: "packed_qkv" (query (B, S, N, 3, H)), "packed_kv" (key
    (B, L, N, 2, H)) or "heads_kv" (key and value (B, N, L, H))."""
    head = HIDDEN // HEADS
    shapes = {"packed_qkv": {"query": ["B", "S", HEADS, 3, head]},
              "packed_kv": {"query": ["B", "S", HIDDEN], "key": ["B", "L", HEADS, 2, head]},
              "heads_kv": {"query": ["B", "S", HIDDEN], "key": ["B", HEADS, "L", head],
                           "value": ["B", HEADS, "L", head]}}[layout]
    if bias:
        shapes["bias"] = [3 * HIDDEN]
    names = ["query", "key", "value", "bias"]
    node_inputs = [n if n in shapes else "" for n in names]
    while node_inputs[-1] == "":
        node_inputs.pop()
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shapes[n]) for n in shapes]
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["B", "S", HIDDEN])
    node = helper.make_node("MultiHeadAttention", node_inputs, ["output"], name="mha",
                            domain="com.microsoft", num_heads=HEADS)
    return make_model([node], inputs, [out], 17, extra_opsets=["com.microsoft"])


def _layout_feeds(rng, layout, batch, seq, keys, bias=False):
    head = HIDDEN // HEADS
    shapes = {"packed_qkv": {"query": (batch, seq, HEADS, 3, head)},
              "packed_kv": {"query": (batch, seq, HIDDEN), "key": (batch, keys, HEADS, 2, head)},
              "heads_kv": {"query": (batch, seq, HIDDEN), "key": (batch, HEADS, keys, head),
                           "value": (batch, HEADS, keys, head)}}[layout]
    if bias:
        shapes["bias"] = (3 * HIDDEN,)
    return {n: rng.standard_normal(shape).astype(np.float32) for n, shape in shapes.items()}


def _layout_torch(feeds, layout):
    t = {k: torch.from_numpy(v.astype(np.float64)) for k, v in feeds.items()}
    if layout == "packed_qkv":
        q, k, v = (t["query"][:, :, :, i].transpose(1, 2) for i in range(3))
    else:
        query = t["query"] + (t["bias"][:HIDDEN] if "bias" in t else 0)
        q = query.reshape(query.shape[0], query.shape[1], HEADS, -1).transpose(1, 2)
        if layout == "packed_kv":
            k, v = (t["key"][:, :, :, i].transpose(1, 2) for i in range(2))
        else:  # already projected: ORT adds no bias to them (pinned below)
            k, v = t["key"], t["value"]
    out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(out.shape[0], out.shape[2], -1).numpy()


@pytest.mark.parametrize("layout, bias", [("heads_kv", False), ("heads_kv", True),
                                          ("packed_qkv", False), ("packed_kv", False)])
def test_other_layouts(layout, bias):
    rng = np.random.default_rng(len(layout) + bias)
    model = _layout_model(layout, bias)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    for batch, seq, keys in [(2, 4, 5), (1, 3, 3)]:
        feeds = _layout_feeds(rng, layout, batch, seq, keys, bias)
        (got,) = run_onnxruntime(out, feeds)
        np.testing.assert_allclose(got, _layout_torch(feeds, layout), atol=2e-5, rtol=1e-4)
        if layout == "heads_kv":
            (kernel,) = run_onnxruntime(model, feeds)
            np.testing.assert_allclose(got, kernel, atol=2e-5, rtol=1e-4)
        else:  # the packed forms exist on ONNX Runtime's CUDA kernel only: torch is the oracle
            with pytest.raises(Exception, match="not implemented for CPU"):
                run_onnxruntime(model, feeds)


def test_rejections():
    model = _model({})
    del model.graph.node[0].input[1:]
    with pytest.raises(decomposer.UnsupportedNodeError, match="key and value are needed"):
        decomposer.decompose(model)
    with pytest.raises(decomposer.UnsupportedNodeError, match="bias with packed inputs"):
        decomposer.decompose(_layout_model("packed_kv", bias=True))


def portability_cases():
    """Cross-attention with a key padding mask and bias, as ORT's optimizer writes it."""
    rng = np.random.default_rng(43)
    present = {"bias": 1, "mask": "raw2"}
    feeds, expected = [], []
    for batch, seq, keys in [(2, 4, 5), (1, 3, 6)]:
        f = _feeds(rng, present, batch, seq, keys, 0)
        feeds.append(f)
        expected.append([_torch(f, present)[0].astype(np.float32)])
    return [{"id": "contrib MultiHeadAttention (cross-attention, key padding mask, bias)",
             "model": _model(present), "feeds": feeds, "expected": expected, "atol": 2e-5}]
