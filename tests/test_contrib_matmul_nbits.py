"""ONNX Runtime's MatMulNBits, decomposed: against ONNX Runtime's own CPU kernel and against
torch (the weights unpacked with torch's bit operations, dequantized and multiplied in
float64), 2, 4 and 8 bits, zero points absent, packed and unpacked, K not a multiple of the
block, bias, float16, dynamic leading dims. Under target ``qdq``: the weights stay 4/8-bit
in a blocked DequantizeLinear (opset 21+), equal to the kernel with float32 activations,
fused back into MatMulNBits by ONNX Runtime, read from and written to external data, run by
OpenVINO; and the elementwise form where that cannot be written."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import decomposer
from decomposer.engine_support import engine_gaps

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


def _case(rng, bits, block, k, n, zero_kind, bias, dtype=np.float32, opset=17):
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
                       [helper.make_tensor_value_info("Y", elem, ["batch", "seq", n])], opset,
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
    _check(out, model, arrays, rng, (bits, block, k, n), run_onnxruntime)


def _check(out, model, arrays, rng, sizes, run):
    """``out`` passes the checker, is standard, and equals the kernel and torch."""
    bits, block, k, n = sizes
    onnx.checker.check_model(out, full_check=True)
    assert all(node.domain in ("", "ai.onnx") for node in out.graph.node)
    weight = _torch_weight(arrays["B"], arrays["scales"], arrays.get("zp"), k, n, bits, block)
    for shape in [(2, 3, k), (1, 5, k)]:
        a = rng.standard_normal(shape).astype(np.float32)
        (got,) = run(out, {"A": a})
        (kernel,) = run(model, {"A": a})
        want = (torch.from_numpy(a.astype(np.float64)) @ weight.T).numpy()
        if "bias" in arrays:
            want = want + arrays["bias"]
        np.testing.assert_allclose(got, kernel, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(got, want, atol=5e-5, rtol=1e-5)


@pytest.mark.parametrize("target, opset", [("portable", 17), ("qdq", 21)])
def test_float16(target, opset):
    rng = np.random.default_rng(3)
    model, arrays = _case(rng, 4, 32, 64, 6, "packed", True, np.float16, opset=opset)
    out = decomposer.decompose(model, target=target)
    assert ("DequantizeLinear" in [node.op_type for node in out.graph.node]) == (
        target == "qdq")
    a = rng.standard_normal((2, 2, 64)).astype(np.float16)
    (got,) = _ort(out, {"A": a})
    (kernel,) = _ort(model, {"A": a})
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


EXACT = {"session.qdq_matmulnbits_accuracy_level": "0"}  # no int8 activations when fused


def _ort(model, feeds, config=EXACT, optimized=None):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    if optimized is not None:
        options.optimized_model_filepath = str(optimized)
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"]).run(
        None, feeds)


@pytest.mark.parametrize("bits, block, k, n, zero_kind, bias, opset, stored", [
    (4, 32, 64, 8, None, False, 21, TensorProto.INT4),
    (4, 32, 70, 8, "packed", True, 22, TensorProto.UINT4),
    (4, 16, 48, 6, "packed", False, 23, TensorProto.UINT4),
    (8, 32, 64, 8, None, True, 21, TensorProto.INT8),
    (8, 16, 48, 4, "packed", False, 24, TensorProto.UINT8)])
def test_qdq_keeps_the_weights_quantized(tmp_path, bits, block, k, n, zero_kind, bias, opset,
                                         stored):
    rng = np.random.default_rng(bits * 7 + k + opset)
    model, arrays = _case(rng, bits, block, k, n, zero_kind, bias, opset=opset)
    out = decomposer.decompose(model, target="qdq")
    (dequantize,) = [node for node in out.graph.node if node.op_type == "DequantizeLinear"]
    values = next(init for init in out.graph.initializer if init.name == dequantize.input[0])
    assert values.data_type == stored
    assert list(values.dims) == [k, n]  # (K, N): what a MatMul's B takes
    assert len(dequantize.input) == (3 if zero_kind else 2)
    # `decomposer check --engines` names the engines that cannot run it
    gaps = engine_gaps(out, ["ort", "openvino", "tvm", "tensorrt"])
    assert [gap["op"] for gap in gaps["tvm"]] == ["DequantizeLinear"]
    assert [gap["op"] for gap in gaps["tensorrt"]] == (["DequantizeLinear"] if zero_kind else [])
    assert not gaps["ort"] and not gaps["openvino"]
    _check(out, model, arrays, rng, (bits, block, k, n), _ort)
    _ort(out, {"A": np.zeros((1, 1, k), np.float32)}, optimized=tmp_path / "ort.onnx")
    # The point of the target: ONNX Runtime runs it on its MatMulNBits kernel again.
    fused = [node.op_type for node in onnx.load(tmp_path / "ort.onnx").graph.node]
    assert "MatMulNBits" in fused and "DequantizeLinear" not in fused, fused


@pytest.mark.parametrize("name, size", [("scales", 7), ("zp", 3)])
def test_qdq_refuses_constants_of_the_wrong_size(name, size):
    """Constant scales or zero points that do not fit N, K and the block are refused with
    the sizes (under the portable target the same model fails only at run time)."""
    rng = np.random.default_rng(8)
    model, arrays = _case(rng, 4, 32, 64, 4, "packed", False, opset=21)
    (index,) = [i for i, init in enumerate(model.graph.initializer) if init.name == name]
    model.graph.initializer[index].CopyFrom(onnx.numpy_helper.from_array(
        arrays[name].reshape(-1)[:size].copy(), name))
    with pytest.raises(decomposer.UnsupportedNodeError, match="must hold N x k_blocks"):
        decomposer.decompose(model, target="qdq", check=False)


@pytest.mark.parametrize("why", ["opset 20", "2 bits", "float zero points", "B fed at run time"])
def test_qdq_falls_back_to_the_portable_form(why, caplog):
    rng = np.random.default_rng(5)
    bits, zero_kind = (2, "packed") if why == "2 bits" else (4, "unpacked") \
        if why == "float zero points" else (4, "packed")
    model, _ = _case(rng, bits, 32, 64, 4, zero_kind, False, opset=20 if why == "opset 20"
                     else 21)
    if why == "B fed at run time":
        (index,) = [i for i, init in enumerate(model.graph.initializer) if init.name == "B"]
        model.graph.input.append(helper.make_tensor_value_info(
            "B", TensorProto.UINT8, list(model.graph.initializer[index].dims)))
        del model.graph.initializer[index]
    with caplog.at_level("WARNING", logger="decomposer"):
        qdq = decomposer.decompose(model, target="qdq")
    reason = {"opset 20": "opset is 20", "2 bits": "2-bit", "float zero points": "floats",
              "B fed at run time": "not a constant"}[why]
    assert reason in caplog.text and "keeps the float32 form" in caplog.text
    assert qdq.SerializeToString() == decomposer.decompose(model).SerializeToString()
    assert "DequantizeLinear" not in [node.op_type for node in qdq.graph.node]


def test_qdq_external_weights_and_openvino(tmp_path):
    """A model whose weights live in an external data file (as the genai builder writes
    them): read from it, repacked, and written to the output's data file."""
    rng = np.random.default_rng(9)
    model, arrays = _case(rng, 4, 32, 256, 64, "packed", True, opset=21)
    onnx.save(onnx.ModelProto.FromString(model.SerializeToString()), tmp_path / "in.onnx",
              save_as_external_data=True,
              location="in.data", size_threshold=0)
    report = decomposer.decompose_file(tmp_path / "in.onnx", tmp_path / "out.onnx",
                                       target="qdq")
    assert report.counts == {"MatMulNBits": 1}
    out = onnx.load(tmp_path / "out.onnx", load_external_data=False)
    assert "DequantizeLinear" in [node.op_type for node in out.graph.node]
    assert len(out.SerializeToString()) < 4096  # the repacked weights went to the data file
    onnx.checker.check_model(str(tmp_path / "out.onnx"), full_check=True)
    a = rng.standard_normal((3, 2, 256)).astype(np.float32)
    (kernel,) = _ort(model, {"A": a})
    (got,) = _ort(str(tmp_path / "out.onnx"), {"A": a})
    np.testing.assert_allclose(got, kernel, atol=1e-5, rtol=1e-5)
    import openvino as ov

    core = ov.Core()
    compiled = core.compile_model(core.read_model(str(tmp_path / "out.onnx")), "CPU", {
        "INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"})
    np.testing.assert_allclose(compiled({"A": a})[0], kernel, atol=1e-4, rtol=1e-4)
    # In memory, without the weights loaded: read from base_dir, else the portable form
    light = onnx.load(tmp_path / "in.onnx", load_external_data=False)
    kinds = [n.op_type for n in decomposer.decompose(light, target="qdq",
                                                     base_dir=tmp_path).graph.node]
    assert "DequantizeLinear" in kinds
    assert "DequantizeLinear" not in [n.op_type for n in decomposer.decompose(
        light, target="qdq").graph.node]
    # `decomposer check` reads the same external weights, so it sees what would be written
    (entry,) = decomposer.check([tmp_path / "in.onnx"], target="qdq", engines=["tvm"]).models
    assert [gap["op"] for gap in entry.engines["tvm"]] == ["DequantizeLinear"]
    # Run again on the output: nothing left to do, and nothing changes.
    again = decomposer.decompose_file(tmp_path / "out.onnx", tmp_path / "again.onnx",
                                      target="qdq")
    assert not again.replaced


def test_qdq_verifies(tmp_path):
    """--verify passes on the qdq form of a node whose accuracy_level lets the kernel use int8
    activations: the verifier runs both models with ONNX Runtime's and OpenVINO's float32
    arithmetic (without it, ONNX Runtime fuses the blocks at int8 and the check fails)."""
    rng = np.random.default_rng(13)
    model, _ = _case(rng, 4, 32, 256, 64, None, False, opset=21)
    model.graph.node[0].attribute.append(helper.make_attribute("accuracy_level", 4))
    onnx.save(model, tmp_path / "in.onnx")
    report = decomposer.decompose_file(tmp_path / "in.onnx", tmp_path / "out.onnx",
                                       target="qdq", verify=True,
                                       verify_options={"engines": ["ort", "openvino"]})
    assert report.verification.passed and report.verification.checks


def test_qdq_shared_weights_and_a_function_body():
    """Two nodes reading one weight share one repacked initializer (the second replays the
    first's build); a node in a model-local function, which cannot hold initializers, gets
    its repacked weights as Constant nodes, unless it is inlined (a call under --target
    qdq is), when they are initializers of the main graph again."""
    rng = np.random.default_rng(12)
    model, _ = _case(rng, 4, 32, 64, 8, "packed", False, opset=21)
    first = model.graph.node[0]
    second = helper.make_node("MatMulNBits", ["A", *first.input[1:]], ["Y2"], name="again",
                              domain="com.microsoft")
    second.attribute.extend(first.attribute)
    # a third reads other weights of the same shapes: the same template key, another digest
    other = onnx.numpy_helper.from_array(rng.integers(0, 256, (8, 2, 16), dtype=np.uint8), "B3")
    third = helper.make_node("MatMulNBits", ["A", "B3", *first.input[2:]], ["Y3"],
                             name="other", domain="com.microsoft")
    third.attribute.extend(first.attribute)
    model.graph.initializer.append(other)
    model.graph.node.extend([second, third])
    for name in ("Y2", "Y3"):
        model.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                                                ["batch", "seq", 8]))
    out = decomposer.decompose(model, target="qdq")
    onnx.checker.check_model(out, full_check=True)
    # values once for B (shared by two nodes) and once for B3; the zero points, one tensor
    # for all three, once (equal weights a pattern builds are stored once)
    assert [i.data_type for i in out.graph.initializer].count(TensorProto.UINT4) == 3
    a = rng.standard_normal((2, 3, 64)).astype(np.float32)
    got, kernel = _ort(out, {"A": a}), _ort(model, {"A": a})
    for g, k in zip(got, kernel, strict=True):
        np.testing.assert_allclose(g, k, atol=1e-5, rtol=1e-5)

    body = [helper.make_node("Constant", [], [init.name], value=init)
            for init in model.graph.initializer] + [model.graph.node[0]]
    function = helper.make_function("local", "Linear", ["A"], ["Y"], body, [
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    function.value_info.append(model.graph.input[0])  # a body's types come from its own
    caller = make_model([helper.make_node("Linear", ["A"], ["Y"], domain="local")],
                        list(model.graph.input), [model.graph.output[0]], 21,
                        extra_opsets=["com.microsoft", "local"], functions=[function])
    out = decomposer.decompose(caller, target="qdq")
    onnx.checker.check_model(out, full_check=True)
    # the call is inlined (decomposer.functions), then its MatMulNBits rewritten in the
    # main graph: the repacked weights are initializers again
    assert not out.functions
    kinds = [node.op_type for node in out.graph.node]
    assert "DequantizeLinear" in kinds and "MatMulNBits" not in kinds
    assert [i.data_type for i in out.graph.initializer].count(TensorProto.UINT4) == 2
    np.testing.assert_allclose(_ort(out, {"A": a})[0], kernel[0], atol=1e-5, rtol=1e-5)


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
