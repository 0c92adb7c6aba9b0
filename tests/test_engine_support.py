"""decomposer/data/engine_support.json, re-measured: every ONNX Runtime, OpenVINO and TVM row
is run on its engine (the op fails there, or gives other numbers than ONNX Runtime, and the
named ``--lower`` fixes it); every row is well formed; docs/portability.md's table is
generated from the file. The converter rows (onnx2torch, onnx2tf) are measured by
scripts/portability.py, whose results docs/portability.md records."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import decomposer
from decomposer import engine_support, engines
from decomposer.errors import EngineRunError

from _helpers import make_model, run_onnxruntime

IN_PROCESS = ("ort", "openvino", "tvm")


def _affine_grid_fed() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], align_corners=0)
    model = make_model([node], [helper.make_tensor_value_info("theta", TensorProto.FLOAT,
                                                              ["N", 2, 3]),
                                helper.make_tensor_value_info("size", TensorProto.INT64, [4])],
                       [helper.make_tensor_value_info("grid", TensorProto.FLOAT,
                                                      ["N", None, None, 2])], 20)
    theta = np.random.default_rng(0).standard_normal((2, 2, 3)).astype(np.float32)
    return model, {"theta": theta, "size": np.array([2, 1, 4, 5], np.int64)}


def _deform_conv() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    node = helper.make_node("DeformConv", ["x", "w", "offset"], ["y"], kernel_shape=[3, 3],
                            pads=[1, 1, 1, 1])
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                              [1, 2, 5, 5]),
                                helper.make_tensor_value_info("offset", TensorProto.FLOAT,
                                                              [1, 18, 5, 5])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 5, 5])],
                       19, initializers=[onnx.numpy_helper.from_array(
                           rng.standard_normal((4, 2, 3, 3)).astype(np.float32), "w")])
    return model, {"x": rng.standard_normal((1, 2, 5, 5)).astype(np.float32),
                   "offset": rng.standard_normal((1, 18, 5, 5)).astype(np.float32)}


def _roi_align(opset: int, mode: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(2)
    node = helper.make_node("RoiAlign", ["x", "rois", "index"], ["y"], output_height=2,
                            output_width=2, sampling_ratio=2, mode=mode)
    model = make_model([node], [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8]),
        helper.make_tensor_value_info("rois", TensorProto.FLOAT, [3, 4]),
        helper.make_tensor_value_info("index", TensorProto.INT64, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2, 2, 2])], opset)
    return model, {"x": rng.standard_normal((1, 2, 8, 8)).astype(np.float32),
                   "rois": np.array([[0, 0, 5, 5], [1, 2, 7, 6], [2, 1, 4, 7]], np.float32),
                   "index": np.zeros(3, np.int64)}


def _blocked_dequantize() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """What --target qdq writes for MatMulNBits: INT4 (K, N) blocks along K, then MatMul."""
    rng = np.random.default_rng(3)
    values = helper.make_tensor("w", TensorProto.INT4, (32, 4),
                                rng.integers(-8, 8, 128).tolist())
    scales = onnx.numpy_helper.from_array(rng.uniform(0.01, 0.1, (1, 4)).astype(np.float32),
                                          "s")
    nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["wd"], axis=0, block_size=32),
             helper.make_node("MatMul", ["a", "wd"], ["y"])]
    model = make_model(nodes, [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 32])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], 21,
                       initializers=[values, scales])
    return model, {"a": rng.standard_normal((2, 32)).astype(np.float32)}


def _per_channel_qlinear_conv() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """ONNX's QLinearConv with per-channel weights, 3 -> 6 channels (quantize_static's
    QOperator form of a first convolution)."""
    rng = np.random.default_rng(4)
    initializers = [
        onnx.numpy_helper.from_array(np.array(0.05, np.float32), "xs"),
        onnx.numpy_helper.from_array(np.array(9, np.uint8), "xz"),
        onnx.numpy_helper.from_array(rng.integers(-128, 128, (6, 3, 3, 3)).astype(np.int8),
                                     "w"),
        onnx.numpy_helper.from_array(rng.uniform(0.005, 0.02, 6).astype(np.float32), "ws"),
        onnx.numpy_helper.from_array(np.zeros(6, np.int8), "wz"),
        onnx.numpy_helper.from_array(np.array(0.08, np.float32), "ys"),
        onnx.numpy_helper.from_array(np.array(127, np.uint8), "yz")]
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"],
                            ["y"], pads=[1, 1, 1, 1])
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.UINT8,
                                                              [1, 3, 5, 5])],
                       [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 6, 5, 5])],
                       17, initializers=initializers)
    return model, {"x": rng.integers(0, 256, (1, 3, 5, 5)).astype(np.uint8)}


def _reduction(op: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], axes=[2], keepdims=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 1, 5])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.random.default_rng(0).uniform(0.5, 2.0, (2, 3, 4, 5)).astype(np.float32)
    return model, {"x": x}


def _lstm() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    weights = [onnx.numpy_helper.from_array(
        (rng.standard_normal(shape) * 0.5).astype(np.float32), name)
        for name, shape in (("W", (1, 12, 2)), ("R", (1, 12, 3)))]
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=3)
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                              [4, 1, 2])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 1, 1, 3])],
                       14, initializers=weights)
    return model, {"x": rng.standard_normal((4, 1, 2)).astype(np.float32)}


def _antialiased_resize() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    scales = onnx.numpy_helper.from_array(np.array([1, 1, 0.5, 0.5], np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear", antialias=1)
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                              [1, 2, 16, 16])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 8, 8])],
                       18, initializers=[scales])
    x = np.random.default_rng(6).standard_normal((1, 2, 16, 16)).astype(np.float32)
    return model, {"x": x}


# (engine, op, condition) -> the probe that shows the gap
PROBES = {
    ("openvino", "ReduceL1", None): lambda: _reduction("ReduceL1"),
    ("openvino", "ReduceLogSum", None): lambda: _reduction("ReduceLogSum"),
    ("openvino", "ReduceLogSumExp", None): lambda: _reduction("ReduceLogSumExp"),
    ("tvm", "AffineGrid", "size_not_constant"): _affine_grid_fed,
    ("tvm", "DeformConv", None): _deform_conv,
    ("openvino", "DeformConv", None): _deform_conv,
    ("openvino", "RoiAlign", "mode_max"): lambda: _roi_align(16, "max"),
    ("ort", "RoiAlign", None): lambda: _roi_align(22, "avg"),
    ("tvm", "DequantizeLinear", "blocked"): _blocked_dequantize,
    ("openvino", "QLinearConv", "per_channel_mixed_channels"): _per_channel_qlinear_conv,
    ("tvm", "LSTM", None): _lstm,
    ("openvino", "Resize", "antialias"): _antialiased_resize,
    ("tvm", "Resize", "antialias"): _antialiased_resize,
}


def _probe(entry):
    """The row's probe: this module's, else scripts/engine_probes.py's for its op and
    condition (what scripts/engine_matrix.py measured the row with)."""
    from engine_probes import PROBES as SCRIPT_PROBES

    key = (entry["engine"], entry["op"], entry.get("when"))
    if key in PROBES:
        return PROBES[key]
    return next((p.build for p in SCRIPT_PROBES
                 if (p.op, p.when) == (entry["op"], entry.get("when"))), None)


def _rows():
    return [entry for entry in engine_support.gaps() if entry["engine"] in IN_PROCESS]


def test_every_in_process_row_has_a_probe():
    assert all(_probe(e) is not None for e in _rows()), \
        [e for e in _rows() if _probe(e) is None]


def _fixed(entry, model, feeds):
    """The model with the row's fix: its --lower, the opset its target takes it to, or its
    shape arithmetic folded at the probe's sizes (the feeds'); where the fix needs static
    sizes, at those sizes too."""
    static = {value.name: list(feeds[value.name].shape) for value in model.graph.input
              if value.name in feeds}
    if entry.get("lower") or entry.get("take_down"):
        return decomposer.decompose(model, lower=[entry["lower"]] if entry.get("lower") else (),
                                    target_opset=entry.get("take_down"),
                                    input_shapes=static if entry.get("static") else None)
    return decomposer.decompose(model, input_shapes=static)


@pytest.mark.parametrize("entry", _rows(), ids=lambda e: f"{e['engine']}-{e['op']}")
def test_row_is_measured_again(entry):
    pytest.importorskip(engines.ENGINES[entry["engine"]].module)
    model, feeds = _probe(entry)()
    assert engine_support.engine_gaps(model, [entry["engine"]])[entry["engine"]], \
        "the model shows the gap, so check must name it"
    try:
        got = engines.run_model(entry["engine"], model, feeds, static_shapes=True)
    except EngineRunError:
        got = None
    if got is not None:  # runs, but with other numbers (or shapes) than ONNX Runtime
        want = run_onnxruntime(model, feeds)
        assert got[0].shape != want[0].shape or not np.allclose(got[0], want[0], atol=1e-4), \
            "the engine no longer differs"
    if entry.get("lower") or entry.get("take_down") or entry.get("fold"):
        want = run_onnxruntime(model, feeds)
        fixed = _fixed(entry, model, feeds)
        # the row's own gap is gone (a lowering may hold another row's construct, such as
        # a Reshape to a computed shape at dynamic sizes, which this run fixes statically)
        assert not [gap for gap in engine_support.engine_gaps(fixed, [entry["engine"]])[
            entry["engine"]] if gap["op"] == entry["op"]]
        result = engines.run_model(entry["engine"], fixed, feeds, static_shapes=True)
        for value, expected in zip(result, want, strict=True):
            np.testing.assert_allclose(value, expected, atol=1e-4)


def test_rows_are_well_formed():
    known = set(engine_support.known_engines())
    for entry in engine_support.gaps():
        assert entry["engine"] in known and entry["evidence"]
        assert entry.get("when") in engine_support.CONDITIONS
        assert entry.get("kind") in (None, "wrong")
        assert onnx.defs.has(entry["op"]), entry["op"]
        if entry.get("lower"):  # a pattern decomposes it
            names = {form_op for e in decomposer.registry.build_registry(entry_points=False)
                     for form in e.pattern.spellings() for form_op in form.op_types}
            assert entry["lower"] in names


def test_constant_size_affine_grid_is_no_tvm_gap():
    model, _ = _affine_grid_fed()
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.array([2, 1, 4, 5],
                                                                          np.int64), "size"))
    del model.graph.input[1]
    assert engine_support.engine_gaps(model, ["tvm"]) == {"tvm": []}


# -- contrib ops (or forms) no pattern rewrites: the engines measured to run them ----------


def _quantized_lstm(tmp_path) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    import torch
    from onnxruntime.quantization import quantize_dynamic

    torch.manual_seed(0)
    source, target = tmp_path / "lstm.onnx", tmp_path / "lstm_dynamic.onnx"
    # a dynamic sequence length: the form patterns/contrib_dynamic_quantize_lstm.py refuses
    torch.onnx.export(torch.nn.LSTM(8, 16), (torch.randn(5, 2, 8),), str(source),
                      opset_version=17, dynamo=False, input_names=["x"],
                      dynamic_axes={"x": {0: "steps"}})
    quantize_dynamic(str(source), str(target))
    return onnx.load(str(target)), {"x": np.random.default_rng(0).standard_normal(
        (5, 2, 8)).astype(np.float32)}


CONTRIB_PROBES = {("com.microsoft", "DynamicQuantizeLSTM"): _quantized_lstm}


@pytest.mark.parametrize("key", sorted(CONTRIB_PROBES), ids=lambda k: f"{k[0]}::{k[1]}")
def test_contrib_row_is_measured_again(tmp_path, key):
    """A model holding the op runs on the engines the row lists and fails on the others with
    the recorded error; and the refusal message names them."""
    entry = engine_support.contrib_support(*key)
    assert entry is not None
    model, feeds = CONTRIB_PROBES[key](tmp_path)
    assert key in {(n.domain, n.op_type) for n in model.graph.node}
    for engine in entry["runs"]:
        if engines.available(engine):
            engines.run_model(engine, model, feeds)
    for engine in entry["refused"]:
        if engines.available(engine):
            with pytest.raises(EngineRunError) as raised:
                engines.run_model(engine, model, feeds)
            # the engine's whole message (EngineRunError keeps its first line)
            message = f"{raised.value} {raised.value.__cause__}"
            assert key[1] in message, message
    with pytest.raises(decomposer.UnsupportedNodeError) as refused:
        decomposer.decompose(model)
    assert any(f"{engine_support.engine_label(name)} run it" in str(refused.value) or
               engine_support.engine_label(name) in str(refused.value)
               for name in entry["runs"])


def test_every_contrib_row_has_a_probe():
    rows = {(e["domain"], e["op"]) for e in engine_support._data()["contrib"]}
    assert rows == set(CONTRIB_PROBES)


def test_contrib_rows_are_well_formed():
    known = set(engine_support.known_engines())
    for entry in engine_support._data()["contrib"]:
        assert {"op", "domain", "runs", "refused", "evidence"} <= set(entry)
        assert set(entry["runs"]) <= known and set(entry["refused"]) <= known
        assert "ort" in entry["runs"]


def test_qlinear_conv_gap_needs_per_channel_weights_and_differing_channels():
    model, _ = _per_channel_qlinear_conv()
    assert engine_support.engine_gaps(model, ["openvino"])["openvino"]
    per_tensor = onnx.ModelProto()
    per_tensor.CopyFrom(model)
    scale = next(i for i in per_tensor.graph.initializer if i.name == "ws")
    scale.CopyFrom(onnx.numpy_helper.from_array(np.array(0.01, np.float32), "ws"))
    assert not engine_support.engine_gaps(per_tensor, ["openvino"])["openvino"]
    square = onnx.ModelProto()
    square.CopyFrom(model)
    weights = next(i for i in square.graph.initializer if i.name == "w")
    weights.CopyFrom(onnx.numpy_helper.from_array(np.zeros((3, 3, 3, 3), np.int8), "w"))
    assert not engine_support.engine_gaps(square, ["openvino"])["openvino"]


def test_qlinear_matmul_gap_on_openvino_needs_per_column_scales():
    """OpenVINO 2026.4 runs a per-tensor QLinearMatMul (measured, bit for bit ONNX
    Runtime's) and fails on per-column b scales: the row holds for the second only, while
    TVM's holds for both."""
    from engine_probes import qlinear_matmul

    per_column, _ = qlinear_matmul()
    per_tensor, _ = qlinear_matmul(per_column=False)
    assert engine_support.engine_gaps(per_column, ["openvino"])["openvino"]
    assert not engine_support.engine_gaps(per_tensor, ["openvino"])["openvino"]
    assert engine_support.engine_gaps(per_tensor, ["tvm"])["tvm"]


def test_static_sizes_with_an_if_on_an_input_ask_to_freeze_it():
    """Fixed sizes pick one branch of an If a run-time input decides by value (silero-vad's
    sample rate: with the sizes alone its other branch fails ONNX's shape inference,
    measured), so a gap whose fix needs static sizes names that input for --freeze-input
    too; without such an If it names the sizes only."""
    model, _ = _lstm()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "steps"
    (gap,) = engine_support.engine_gaps(model, ["tvm"])["tvm"]
    assert (gap["op"], gap["freeze"], gap["shape"]) == ("LSTM", [], ["x"])
    out = [helper.make_tensor_value_info("r", TensorProto.FLOAT, [1])]
    then = helper.make_graph([helper.make_node("Constant", [], ["r"], value=onnx.numpy_helper
                                               .from_array(np.ones(1, np.float32)))],
                             "then", [], out)
    other = helper.make_graph([helper.make_node("Constant", [], ["r"], value=onnx.numpy_helper
                                                .from_array(np.zeros(1, np.float32)))],
                              "else", [], out)
    model.graph.node.extend([helper.make_node("If", ["flag"], ["picked"], then_branch=then,
                                              else_branch=other)])
    model.graph.input.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    model.graph.output.append(helper.make_tensor_value_info("picked", TensorProto.FLOAT, [1]))
    gaps = engine_support.engine_gaps(model, ["tvm"])["tvm"]
    lstm = next(g for g in gaps if g["op"] == "LSTM")
    assert (lstm["freeze"], lstm["shape"]) == (["flag"], ["x"])


def test_a_cast_constant_in_a_shape_is_shape_arithmetic():
    """paddle2onnx writes a Reshape's shape as Concat(Cast(Slice(Shape(x))), Cast(Constant)):
    the Cast of a Constant is a constant too, so at a dynamic size TVM's Reshape row holds
    and check names the input (ocr_cls_v2, measured: exact with the sizes)."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Slice", ["s", "zero", "one"], ["batch"]),
             helper.make_node("Constant", [], ["k"], value=onnx.numpy_helper.from_array(
                 np.array([-1], np.int32))),
             helper.make_node("Cast", ["k"], ["k64"], to=TensorProto.INT64),
             helper.make_node("Concat", ["batch", "k64"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"])]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 12])],
        [onnx.numpy_helper.from_array(np.array([0], np.int64), "zero"),
         onnx.numpy_helper.from_array(np.array([1], np.int64), "one")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    gaps = engine_support.engine_gaps(model, ["tvm"])["tvm"]
    assert [(g["op"], g["shape"]) for g in gaps] == [("Reshape", ["x"])]


_Q_DQ_CASES = [
    (np.array(0, np.int8), "QuantizeLinear", False),
    (np.array(3, np.int8), "QuantizeLinear", True),
    (np.array(128, np.uint8), "QuantizeLinear", True),
    (np.array(0, np.uint8), "DequantizeLinear", True),
    (None, "QuantizeLinear", True),  # no zero point: uint8
    (np.array(0, np.int8), "DequantizeLinear", False),
]


@pytest.mark.parametrize("zero, op, gap, as_constant_node", [
    (*case, node) for case in _Q_DQ_CASES for node in (False, True)
    if case[0] is not None or not node])
def test_tensorrt_takes_q_dq_in_int8_with_zero_point_zero(zero, op, gap, as_constant_node):
    """TensorRT's matrix: QuantizeLinear's zero point must be 0, DequantizeLinear takes INT8
    (FP8, INT4) with zero point 0; what --target tensorrt writes from a uint8 QOperator
    model (QLinearConv as QDQ) is named, the int8-symmetric form is not."""
    nodes, initializers = [], [onnx.numpy_helper.from_array(np.array(0.1, np.float32), "s")]
    names = ["x", "s"]
    if zero is not None:
        if as_constant_node:
            nodes.append(helper.make_node("Constant", [], ["z"],
                                          value=onnx.numpy_helper.from_array(zero)))
        else:
            initializers.append(onnx.numpy_helper.from_array(zero, "z"))
        names.append("z")
    quantized = zero.dtype if zero is not None else np.uint8
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(quantized))
    x_type, y_type = (TensorProto.FLOAT, elem) if op == "QuantizeLinear" else \
        (elem, TensorProto.FLOAT)
    nodes.append(helper.make_node(op, names, ["y"]))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", x_type, [4])],
                              [helper.make_tensor_value_info("y", y_type, [4])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    found = [g["op"] for g in engine_support.engine_gaps(model, ["tensorrt"])["tensorrt"]]
    assert found == ([op] if gap else [])
