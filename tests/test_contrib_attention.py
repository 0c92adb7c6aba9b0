"""ONNX Runtime's com.microsoft Attention, decomposed: against ONNX Runtime's own kernel
for the node and against a torch float64 oracle (the formula the module docstring states),
every mask form it supports ((B,) lengths, (2B,) end and start positions, 2-D, 3-D; the 4-D
form is refused), unidirectional, past/present, attention_bias,
qkv_hidden_sizes, scale, float16; dynamic batch and sequence; rejections."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import decomposer

from _helpers import make_model, run_onnxruntime

HIDDEN, HEADS = 8, 2


def _t(a):
    return torch.from_numpy(np.asarray(a, np.float64))


def _arrays(rng, batch, seq, dtype, mask=None, past=0, bias=False, sizes=None):
    sizes = sizes or (HIDDEN,) * 3
    arrays = {"x": rng.standard_normal((batch, seq, HIDDEN)).astype(dtype),
              "w": (rng.standard_normal((HIDDEN, sum(sizes))) * 0.5).astype(dtype),
              "b": rng.standard_normal(sum(sizes)).astype(dtype),
              "m": None, "past": None, "ab": None}
    total = seq + past
    if mask == "lengths":
        arrays["m"] = rng.integers(1, total + 1, batch).astype(np.int32)
    elif mask == "ends and starts":  # (2B,): left and right padding
        starts = rng.integers(0, total // 2, batch)
        ends = rng.integers(total // 2 + 1, total + 1, batch)
        arrays["m"] = np.concatenate([ends, starts]).astype(np.int32)
    elif mask == "raw2":
        arrays["m"] = (rng.random((batch, total)) < 0.7).astype(np.int32)
        arrays["m"][:, 0] = 1
    elif mask == "raw3":
        arrays["m"] = (rng.random((batch, seq, total)) < 0.7).astype(np.int32)
        arrays["m"][..., 0] = 1
    if past:
        arrays["past"] = rng.standard_normal((2, batch, HEADS, past,
                                              sizes[0] // HEADS)).astype(dtype)
    if bias:
        arrays["ab"] = rng.standard_normal((1, HEADS, seq, total)).astype(dtype)
    return arrays


def _model(arrays, attrs, outputs=1):
    order = ["x", "w", "b", "m", "past", "ab"]
    while arrays[order[-1]] is None:
        order.pop()
    names = [n if arrays[n] is not None else "" for n in order]
    symbolic = {"x": ["B", "S", HIDDEN], "m": None, "past": [2, "B", HEADS, "P", None],
                "ab": [1, HEADS, "S", "T"]}
    inputs = []
    for n in names:
        if not n:
            continue
        dims = list(arrays[n].shape)
        if n == "m" and arrays[n].ndim == 1:
            dims = ["B" if arrays[n].shape[0] == arrays["x"].shape[0] else "B2"]
        elif n == "m":
            dims = ["B", *(["S"] if arrays[n].ndim == 3 else []), *(["T"] if arrays[n].ndim > 1
                                                                      else [])]
        elif n in symbolic:
            dims = [s if s is not None else arrays[n].shape[i]
                    for i, s in enumerate(symbolic[n])]
        inputs.append(helper.make_tensor_value_info(
            n, helper.np_dtype_to_tensor_dtype(arrays[n].dtype), dims))
    elem = helper.np_dtype_to_tensor_dtype(arrays["x"].dtype)
    outs = [helper.make_tensor_value_info("y", elem, [None] * 3),
            helper.make_tensor_value_info("present", elem, [None] * 5)][:outputs]
    node = helper.make_node("Attention", names, [o.name for o in outs], name="attention",
                            domain="com.microsoft", num_heads=HEADS, **attrs)
    return make_model([node], inputs, outs, 17, extra_opsets=["com.microsoft"])


def _torch_reference(arrays, attrs):
    """The formula of the module docstring in torch, float64."""
    x, w = _t(arrays["x"]), _t(arrays["w"])
    qkv = x @ w + _t(arrays["b"])
    sizes = attrs.get("qkv_hidden_sizes") or [qkv.shape[-1] // 3] * 3
    batch, seq = x.shape[:2]
    q, k, v = (p.reshape(batch, seq, HEADS, -1).transpose(1, 2)
               for p in torch.split(qkv, sizes, dim=-1))
    if arrays["past"] is not None:
        k = torch.cat([_t(arrays["past"][0]), k], 2)
        v = torch.cat([_t(arrays["past"][1]), v], 2)
    total = k.shape[2]
    scale = attrs.get("scale", 1 / math.sqrt(sizes[0] // HEADS))
    scores = q @ k.transpose(-1, -2) * scale
    filtered = attrs.get("mask_filter_value", -10000.0)
    mask = arrays["m"]
    if mask is not None and mask.ndim == 1:
        positions = torch.from_numpy(mask).long()
        starts = positions[batch:] if len(positions) == 2 * batch else torch.zeros(batch)
        keep = (torch.arange(total)[None] < positions[:batch, None]) & \
            (torch.arange(total)[None] >= starts[:, None])
        scores = scores + torch.where(keep, 0.0, filtered)[:, None, None, :]
    elif mask is not None:
        term = (1 - _t(mask)) * filtered
        scores = scores + (term[:, None, None, :] if mask.ndim == 2 else term[:, None])
    if attrs.get("unidirectional"):
        later = torch.arange(total)[None, :] > torch.arange(seq)[:, None] + total - seq
        scores = scores + torch.where(later, filtered, 0.0)
    if arrays["ab"] is not None:
        scores = scores + _t(arrays["ab"])
    y = torch.softmax(scores, -1) @ v
    out = [y.transpose(1, 2).reshape(batch, seq, sizes[2]).numpy()]
    return out + ([torch.stack([k, v]).numpy()] if k.shape == v.shape else [])


CASES = {
    "plain": ({}, {}),
    "lengths": ({"mask": "lengths"}, {}),
    "ends and starts (2B)": ({"mask": "ends and starts"}, {}),
    "ends and starts (2B) + past": ({"mask": "ends and starts", "past": 2}, {}),
    "raw2": ({"mask": "raw2"}, {}),
    "raw3": ({"mask": "raw3"}, {}),
    "unidirectional": ({}, {"unidirectional": 1}),
    "raw2 + unidirectional": ({"mask": "raw2"}, {"unidirectional": 1}),
    "past + unidirectional (decoder step)": ({"past": 3}, {"unidirectional": 1}),
    "attention_bias": ({"bias": True}, {}),
    "qkv_hidden_sizes": ({"sizes": (8, 8, 4)}, {"qkv_hidden_sizes": [8, 8, 4]}),
    "scale, mask_filter_value": ({"mask": "raw2"}, {"scale": 0.3, "mask_filter_value": -1e4}),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", list(CASES))
def test_attention_matches_the_kernel_and_torch(case, dtype):
    options, attrs = CASES[case]
    rng = np.random.default_rng(len(case))
    outputs = 2 if options.get("past") else 1
    model = _model(_arrays(rng, 2, 4, dtype, **options), attrs, outputs)
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {"Attention": 1}
    onnx.checker.check_model(out, full_check=True)
    tolerance = 5e-3 if dtype == np.float16 else 2e-5
    for batch, seq in [(2, 4), (3, 6)]:  # dynamic batch and sequence
        arrays = _arrays(rng, batch, seq, dtype, **options)
        feeds = {n: a for n, a in arrays.items() if a is not None}
        got, kernel = run_onnxruntime(out, feeds), run_onnxruntime(model, feeds)
        want = _torch_reference(arrays, attrs)
        for index, (g, k, w) in enumerate(zip(got, kernel, want, strict=False)):
            assert g.shape == k.shape and g.dtype == k.dtype
            np.testing.assert_allclose(g.astype(np.float64), k.astype(np.float64),
                                       atol=tolerance, rtol=tolerance,
                                       err_msg=f"{case} output {index} vs ORT's kernel")
            np.testing.assert_allclose(g.astype(np.float64), w, atol=tolerance,
                                       rtol=tolerance, err_msg=f"{case} output {index} vs torch")


def test_rejections_name_the_node_and_the_reason():
    rng = np.random.default_rng(0)
    arrays = _arrays(rng, 2, 4, np.float32)
    arrays["m"] = np.array([4, 4, 0], np.int32)  # neither (B,) nor (2B,)
    model = _model(arrays, {})
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    model.graph.input[3].type.tensor_type.shape.dim[0].dim_value = 3
    with pytest.raises(decomposer.UnsupportedNodeError,
                       match="node 'attention'.*batch dim or twice it"):
        decomposer.decompose(model)
    arrays = _arrays(rng, 2, 4, np.float32)
    arrays["m"] = np.ones((2, 1, 4, 4), np.int32)  # Megatron's 4-D form
    model = _model(arrays, {})
    model.graph.input[3].CopyFrom(helper.make_tensor_value_info(
        "m", onnx.TensorProto.INT32, ["B", 1, "S", "S"]))
    with pytest.raises(decomposer.UnsupportedNodeError, match="4-D form"):
        decomposer.decompose(model)
    arrays = _arrays(rng, 2, 4, np.float32)
    with pytest.raises(decomposer.UnsupportedNodeError, match="attribute 'do_rotary'"):
        decomposer.decompose(_model(arrays, {"do_rotary": 1}))


def test_target_ort_keeps_the_node():
    arrays = _arrays(np.random.default_rng(1), 2, 4, np.float32)
    out, report = decomposer.decompose_with_report(_model(arrays, {}), target="ort")
    assert report.counts == {} and out.graph.node[0].op_type == "Attention"


# -- portability (the hook of scripts/portability_cases.py) ---------------------------------


def portability_cases():
    """BERT's self-attention with its 2-D key-padding mask, weights as initializers, dynamic
    batch and sequence."""
    rng = np.random.default_rng(21)
    tables = _arrays(rng, 2, 4, np.float32, mask="raw2")
    model = _model(tables, {})
    for name in ("w", "b"):
        model.graph.initializer.append(onnx.numpy_helper.from_array(tables[name], name))
    kept = [i for i in model.graph.input if i.name not in ("w", "b")]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    # the mask's T is the sequence itself here: one symbol for both
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_param = "S"
    feeds, expected = [], []
    for batch, seq in [(2, 4), (3, 6)]:
        arrays = {**_arrays(rng, batch, seq, np.float32, mask="raw2"),
                  "w": tables["w"], "b": tables["b"]}
        feeds.append({"x": arrays["x"], "m": arrays["m"]})
        expected.append([_torch_reference(arrays, {})[0].astype(np.float32)])
    return [{"id": "contrib Attention (BERT, 2-D mask)", "model": model, "feeds": feeds,
             "expected": expected, "atol": 2e-5}]


def test_a_raw_mask_hiding_every_earlier_key_with_unidirectional():
    """Query 0 whose only earlier key the raw mask hides: ONNX Runtime's kernel still gives
    the later keys no weight (the causal term is not the filter value; measured)."""
    import onnxruntime as ort
    from onnx import numpy_helper

    rng = np.random.default_rng(1)
    hidden, heads = 16, 4
    graph = helper.make_graph(
        [helper.make_node("Attention", ["x", "w", "b", "mask"], ["y"], domain="com.microsoft",
                          num_heads=heads, unidirectional=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", hidden]),
         helper.make_tensor_value_info("mask", TensorProto.INT32, ["B", "S"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", hidden])],
        [numpy_helper.from_array(rng.standard_normal((hidden, 3 * hidden)).astype(np.float32),
                                 "w"),
         numpy_helper.from_array(rng.standard_normal(3 * hidden).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    out = decomposer.decompose(model)
    x = rng.standard_normal((2, 5, hidden)).astype(np.float32)
    for mask in ([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]], [[0, 0, 1, 0, 1], [1, 0, 0, 1, 1]]):
        feeds = {"x": x, "mask": np.array(mask, np.int32)}
        want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)[0]
        got = ort.InferenceSession(out.SerializeToString()).run(None, feeds)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
