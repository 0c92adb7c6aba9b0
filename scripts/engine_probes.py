"""One small model per (standard op, condition) an engine may lack or compute wrongly: the
probes scripts/engine_matrix.py runs on every engine to write the gap rows of
decomposer/data/engine_support.json.

In: nothing. Out: ``PROBES``, a list of :class:`Probe`: the op, the gap condition it shows
(``when``, as engine_support.json spells it, or None; several probes may show one gap in
different spellings), and a builder returning
``(onnx.ModelProto, feeds)`` with static shapes, batch 1, float32 unless an input is an
index or a flag. Every probe passes onnx.checker (full) and runs on ONNX Runtime, whose
outputs are the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
Feeds = dict[str, np.ndarray]


@dataclass(frozen=True)
class Probe:
    op: str
    when: str | None
    build: Callable[[], tuple[onnx.ModelProto, Feeds]]

    @property
    def label(self) -> str:
        return self.op + (f" ({self.when})" if self.when else "")


def _model(graph: onnx.GraphProto, opset: int) -> onnx.ModelProto:
    """The lowest IR version that knows the opset, as exporters write (pnnx's ONNX Runtime
    refuses an IR version newer than it knows)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import))
    return model


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _single(op: str, inputs: list[tuple[str, int, list[int]]], outputs: list[tuple[str, int,
            list[Any]]], opset: int, attrs: dict[str, Any] | None = None,
            constants: dict[str, np.ndarray] | None = None, seed: int = 0,
            node_inputs: list[str] | None = None) -> tuple[onnx.ModelProto, Feeds]:
    """One ``op`` node reading graph inputs (random feeds) and constant initializers."""
    constants = constants or {}
    names = node_inputs if node_inputs is not None else \
        [name for name, _, _ in inputs] + list(constants)
    node = helper.make_node(op, names, [name for name, _, _ in outputs], name=op.lower(),
                            **(attrs or {}))
    graph = helper.make_graph(
        [node], f"probe_{op}", [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()])
    model = _model(graph, opset)
    rng = _rng(seed)
    feeds = {}
    for name, elem, dims in inputs:
        if elem == F32:
            feeds[name] = rng.standard_normal(dims).astype(np.float32)
        else:
            feeds[name] = rng.integers(0, 3, dims).astype(helper.tensor_dtype_to_np_dtype(elem))
    return model, feeds


def affine_grid():
    theta = np.array([[[0.9, -0.2, 0.1], [0.2, 0.9, -0.05]]], np.float32)
    return _single("AffineGrid", [("theta", F32, [1, 2, 3])], [("grid", F32, [1, 6, 8, 2])],
                   20, {"align_corners": 0}, {"size": np.array([1, 3, 6, 8], np.int64)})[0], \
        {"theta": theta}


def grid_sample():
    model, feeds = _single("GridSample", [("x", F32, [1, 3, 6, 6]), ("grid", F32, [1, 5, 5, 2])],
                           [("y", F32, [1, 3, 5, 5])], 20,
                           {"mode": "linear", "padding_mode": "zeros", "align_corners": 0})
    feeds["grid"] = np.clip(feeds["grid"] * 0.5, -1.1, 1.1).astype(np.float32)
    return model, feeds


def resize_antialias():
    return _single("Resize", [("x", F32, [1, 2, 16, 16])], [("y", F32, [1, 2, 8, 8])], 18,
                   {"mode": "linear", "antialias": 1},
                   {"scales": np.array([1, 1, 0.5, 0.5], np.float32)},
                   node_inputs=["x", "", "scales"])


def resize_antialias_sizes():
    """The same as torch's dynamo exporter writes F.interpolate(..., antialias=True):
    ``sizes`` and ``exclude_outside=1`` (OpenCV gets the first probe right, not this one)."""
    return _single("Resize", [("x", F32, [1, 2, 16, 16])], [("y", F32, [1, 2, 8, 8])], 18,
                   {"mode": "linear", "antialias": 1, "exclude_outside": 1},
                   {"sizes": np.array([1, 2, 8, 8], np.int64)}, node_inputs=["x", "", "", "sizes"])


def stft():
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(16) / 16)).astype(np.float32)
    return _single("STFT", [("signal", F32, [1, 64, 1])], [("spec", F32, [1, 7, 9, 2])], 17,
                   {"onesided": 1}, {"step": np.array(8, np.int64), "window": window},
                   node_inputs=["signal", "step", "window"])


def einsum():
    return _single("Einsum", [("a", F32, [1, 4, 5]), ("b", F32, [1, 5, 6])],
                   [("y", F32, [1, 4, 6])], 12, {"equation": "bij,bjk->bik"})


def scatter_elements_reduction():
    idx = np.array([[0, 1, 2, 3, 0], [0, 3, 2, 1, 3]], np.int64)
    return _single("ScatterElements", [("data", F32, [4, 5]), ("updates", F32, [2, 5])],
                   [("y", F32, [4, 5])], 16, {"axis": 0, "reduction": "add"},
                   {"indices": idx}, node_inputs=["data", "indices", "updates"])


def is_nan():
    model, feeds = _single("IsNaN", [("x", F32, [2, 8])], [("y", TensorProto.BOOL, [2, 8])], 13)
    feeds["x"][0, ::3] = np.nan
    return model, feeds


def group_normalization():
    rng = _rng(1)
    return _single("GroupNormalization", [("x", F32, [1, 8, 4, 4])], [("y", F32, [1, 8, 4, 4])],
                   21, {"num_groups": 4},
                   {"scale": rng.uniform(0.5, 1.5, 8).astype(np.float32),
                    "bias": rng.uniform(-0.5, 0.5, 8).astype(np.float32)})


def mish():
    return _single("Mish", [("x", F32, [1, 4, 8])], [("y", F32, [1, 4, 8])], 18)


def gelu():
    return _single("Gelu", [("x", F32, [1, 4, 8])], [("y", F32, [1, 4, 8])], 20)


def layer_normalization():
    rng = _rng(2)
    return _single("LayerNormalization", [("x", F32, [1, 4, 8])], [("y", F32, [1, 4, 8])], 17,
                   {"axis": -1}, {"scale": rng.uniform(0.5, 1.5, 8).astype(np.float32),
                                  "bias": rng.uniform(-0.5, 0.5, 8).astype(np.float32)})


def rms_normalization():
    scale = _rng(3).uniform(0.5, 1.5, 8).astype(np.float32)
    return _single("RMSNormalization", [("x", F32, [1, 4, 8])], [("y", F32, [1, 4, 8])], 23,
                   {"axis": -1}, {"scale": scale})


def attention():
    return _single("Attention", [("q", F32, [1, 2, 4, 8]), ("k", F32, [1, 2, 4, 8]),
                                 ("v", F32, [1, 2, 4, 8])], [("y", F32, [1, 2, 4, 8])], 23)


def lstm():
    rng = _rng(4)
    return _single("LSTM", [("x", F32, [4, 1, 3])], [("y", F32, [4, 1, 1, 5])], 14,
                   {"hidden_size": 5},
                   {"W": (rng.standard_normal((1, 20, 3)) * 0.5).astype(np.float32),
                    "R": (rng.standard_normal((1, 20, 5)) * 0.5).astype(np.float32)})


def col2im():
    return _single("Col2Im", [("x", F32, [1, 8, 9])], [("y", F32, [1, 2, 4, 4])], 18, None,
                   {"image_shape": np.array([4, 4], np.int64),
                    "block_shape": np.array([2, 2], np.int64)})


def trilu():
    return _single("Trilu", [("x", F32, [1, 5, 5])], [("y", F32, [1, 5, 5])], 14, {"upper": 1})


def dft():
    return _single("DFT", [("x", F32, [1, 16, 1])], [("y", F32, [1, 16, 2])], 20)


def bitwise_and():
    model, feeds = _single("BitwiseAnd", [("a", TensorProto.INT32, [2, 8]),
                                          ("b", TensorProto.INT32, [2, 8])],
                           [("y", TensorProto.INT32, [2, 8])], 18)
    rng = _rng(5)
    return model, {k: rng.integers(-1000, 1000, (2, 8)).astype(np.int32) for k in feeds}


def reduce_l1():
    return _single("ReduceL1", [("x", F32, [2, 3, 4])], [("y", F32, [2, 1, 4])], 13,
                   {"axes": [1], "keepdims": 1})


def conv_integer():
    """What quantize_dynamic writes for a Conv: uint8 data, int8 weights, zero points."""
    rng = _rng(11)
    model = _single("ConvInteger", [("x", TensorProto.UINT8, [1, 4, 6, 6])],
                    [("y", TensorProto.INT32, [1, 3, 6, 6])], 13, {"pads": [1, 1, 1, 1]},
                    {"w": rng.integers(-128, 128, (3, 4, 3, 3)).astype(np.int8),
                     "x_zero_point": np.array(131, np.uint8),
                     "w_zero_point": np.array(0, np.int8)})[0]
    return model, {"x": rng.integers(0, 256, (1, 4, 6, 6)).astype(np.uint8)}


def matmul_integer():
    """What quantize_dynamic writes for a MatMul: uint8 activations, int8 weights."""
    rng = _rng(12)
    model = _single("MatMulInteger", [("a", TensorProto.UINT8, [2, 8])],
                    [("y", TensorProto.INT32, [2, 5])], 13, None,
                    {"b": rng.integers(-128, 128, (8, 5)).astype(np.int8),
                     "a_zero_point": np.array(119, np.uint8),
                     "b_zero_point": np.array(0, np.int8)})[0]
    return model, {"a": rng.integers(0, 256, (2, 8)).astype(np.uint8)}


def qlinear_matmul(per_column: bool = True):
    """What quantize_static's QOperator format writes for a MatMul: uint8 activations,
    int8 weights with per-column scales (``per_column``, its ``per_channel=True``) or one."""
    rng = _rng(13)
    model = _single("QLinearMatMul", [("a", TensorProto.UINT8, [2, 8])],
                    [("y", TensorProto.UINT8, [2, 5])], 13, None,
                    {"a_scale": np.array(0.05, np.float32),
                     "a_zero_point": np.array(119, np.uint8),
                     "b": rng.integers(-128, 128, (8, 5)).astype(np.int8),
                     "b_scale": rng.uniform(0.005, 0.02, 5 if per_column else ())
                     .astype(np.float32),
                     "b_zero_point": np.zeros(5 if per_column else (), np.int8),
                     "y_scale": np.array(0.3, np.float32),
                     "y_zero_point": np.array(128, np.uint8)},
                    node_inputs=["a", "a_scale", "a_zero_point", "b", "b_scale",
                                 "b_zero_point", "y_scale", "y_zero_point"])[0]
    return model, {"a": rng.integers(0, 256, (2, 8)).astype(np.uint8)}


def if_on_input():
    out = [helper.make_tensor_value_info("r", F32, [1, 4])]
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["r"])], "then", [], out)
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["r"])], "else", [], out)
    nodes = [helper.make_node("If", ["flag"], ["y"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "probe_If",
                              [helper.make_tensor_value_info("x", F32, [1, 4]),
                               helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", F32, [1, 4])])
    model = _model(graph, 16)
    return model, {"x": _rng(6).standard_normal((1, 4)).astype(np.float32),
                   "flag": np.array(True)}


def if_on_value():
    """An If on a value computed from a run-time input (a sample rate, as silero-vad
    ships): Equal(sr, 16000)."""
    out = [helper.make_tensor_value_info("r", F32, [1, 4])]
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["r"])], "then", [], out)
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["r"])], "else", [], out)
    nodes = [helper.make_node("Equal", ["sr", "rate"], ["is_rate"]),
             helper.make_node("If", ["is_rate"], ["y"], then_branch=then, else_branch=other)]
    graph = helper.make_graph(nodes, "probe_If_value",
                              [helper.make_tensor_value_info("x", F32, [1, 4]),
                               helper.make_tensor_value_info("sr", I64, [])],
                              [helper.make_tensor_value_info("y", F32, [1, 4])],
                              [numpy_helper.from_array(np.array(16000, np.int64), "rate")])
    model = _model(graph, 16)
    return model, {"x": _rng(6).standard_normal((1, 4)).astype(np.float32),
                   "sr": np.array(16000, np.int64)}


def if_on_shape():
    """An If on the input's batch size whose branches differ in rank (Squeeze or not), as
    silero-vad's decoder picks its Squeeze."""
    out = [helper.make_tensor_value_info("r", F32, None)]
    then = helper.make_graph([helper.make_node("Squeeze", ["x", "axis0"], ["r"])], "one", [],
                             out)
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["r"])], "many", [], out)
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["batch"]),
             helper.make_node("Equal", ["batch", "one"], ["single"]),
             helper.make_node("If", ["single"], ["picked"], then_branch=then,
                              else_branch=other),
             helper.make_node("Relu", ["picked"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([0], np.int64), "axis0")]
    graph = helper.make_graph(nodes, "probe_If_shape",
                              [helper.make_tensor_value_info("x", F32, ["N", 4])],
                              [helper.make_tensor_value_info("y", F32, None)], inits)
    model = _model(graph, 16)
    return model, {"x": _rng(6).standard_normal((1, 4)).astype(np.float32)}


def pad_from_shape():
    """A Pad whose pads are computed from the input's size (silero-vad pads its STFT
    input so): [0, 0, 0, W // 4]."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "axis1"], ["width"]),
             helper.make_node("Div", ["width", "four"], ["quarter"]),
             helper.make_node("Concat", ["zeros3", "quarter"], ["pads"], axis=0),
             helper.make_node("Pad", ["x", "pads"], ["y"], mode="reflect")]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "axis1"),
             numpy_helper.from_array(np.array([4], np.int64), "four"),
             numpy_helper.from_array(np.zeros(3, np.int64), "zeros3")]
    graph = helper.make_graph(nodes, "probe_Pad",
                              [helper.make_tensor_value_info("x", F32, [1, "T"])],
                              [helper.make_tensor_value_info("y", F32, [1, None])], inits)
    model = _model(graph, 13)
    return model, {"x": _rng(9).standard_normal((1, 16)).astype(np.float32)}


def reshape_from_shape():
    """A Reshape to a shape computed from the input's size (Paddle's OCR heads):
    [N, C * H, W]."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "batch_axis"], ["n"]),
             helper.make_node("Gather", ["shape", "width_axis"], ["w"]),
             helper.make_node("Concat", ["n", "minus_one", "w"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = [numpy_helper.from_array(np.array([0], np.int64), "batch_axis"),
             numpy_helper.from_array(np.array([3], np.int64), "width_axis"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one")]
    graph = helper.make_graph(nodes, "probe_Reshape",
                              [helper.make_tensor_value_info("x", F32, ["N", 3, 2, "W"])],
                              [helper.make_tensor_value_info("y", F32, [None, 6, None])],
                              inits)
    model = _model(graph, 13)
    return model, {"x": _rng(10).standard_normal((1, 3, 2, 5)).astype(np.float32)}


def top_k_from_shape():
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "one"], ["n"]),
             helper.make_node("Min", ["n", "cap"], ["k0"]),
             helper.make_node("Reshape", ["k0", "one_d"], ["k"]),
             helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1)]
    inits = [numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array(5, np.int64), "cap"),
             numpy_helper.from_array(np.array([1], np.int64), "one_d")]
    graph = helper.make_graph(nodes, "probe_TopK",
                              [helper.make_tensor_value_info("x", F32, [1, 12])],
                              [helper.make_tensor_value_info("values", F32, [1, None]),
                               helper.make_tensor_value_info("indices", I64, [1, None])], inits)
    model = _model(graph, 13)
    return model, {"x": _rng(7).standard_normal((1, 12)).astype(np.float32)}


def range_from_shape():
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "two"], ["n"]),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=F32),
             helper.make_node("Add", ["x", "rf"], ["y"])]
    inits = [numpy_helper.from_array(np.array(v, np.int64), k)
             for k, v in (("two", 2), ("zero", 0), ("one", 1))]
    graph = helper.make_graph(nodes, "probe_Range",
                              [helper.make_tensor_value_info("x", F32, [1, 3, 6])],
                              [helper.make_tensor_value_info("y", F32, [1, 3, 6])], inits)
    model = _model(graph, 13)
    return model, {"x": _rng(8).standard_normal((1, 3, 6)).astype(np.float32)}


def non_max_suppression():
    boxes = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, -0.1, 1, 0.9], [0, 10, 1, 11],
                       [0, 10.1, 1, 11.1], [0, 100, 1, 101]]], np.float32)
    scores = np.array([[[0.9, 0.75, 0.6, 0.95, 0.5, 0.3]]], np.float32)
    model, _ = _single("NonMaxSuppression", [("boxes", F32, [1, 6, 4]),
                                             ("scores", F32, [1, 1, 6])],
                       [("selected", I64, [None, 3])], 11, None,
                       {"max_out": np.array([3], np.int64), "iou": np.array([0.5], np.float32),
                        "score": np.array([0.0], np.float32)})
    return model, {"boxes": boxes, "scores": scores}


PROBES = [
    Probe("AffineGrid", None, affine_grid),
    Probe("GridSample", None, grid_sample),
    Probe("Resize", "antialias", resize_antialias),
    Probe("Resize", "antialias", resize_antialias_sizes),
    Probe("STFT", None, stft),
    Probe("DFT", None, dft),
    Probe("Einsum", None, einsum),
    Probe("ScatterElements", "reduction", scatter_elements_reduction),
    Probe("IsNaN", None, is_nan),
    Probe("GroupNormalization", None, group_normalization),
    Probe("Mish", None, mish),
    Probe("Gelu", None, gelu),
    Probe("LayerNormalization", None, layer_normalization),
    Probe("RMSNormalization", None, rms_normalization),
    Probe("Attention", None, attention),
    Probe("LSTM", None, lstm),
    Probe("Col2Im", None, col2im),
    Probe("Trilu", None, trilu),
    Probe("BitwiseAnd", None, bitwise_and),
    Probe("ReduceL1", None, reduce_l1),
    Probe("ConvInteger", None, conv_integer),
    Probe("MatMulInteger", None, matmul_integer),
    Probe("QLinearMatMul", None, lambda: qlinear_matmul(per_column=False)),
    Probe("QLinearMatMul", "per_column", qlinear_matmul),
    Probe("If", None, if_on_value),
    Probe("If", "cond_is_input", if_on_input),
    Probe("If", "cond_from_shape", if_on_shape),
    Probe("TopK", "k_from_shape", top_k_from_shape),
    Probe("Range", "size_from_shape", range_from_shape),
    Probe("NonMaxSuppression", None, non_max_suppression),
    Probe("Pad", "pads_from_shape", pad_from_shape),
    Probe("Reshape", "shape_from_shape", reshape_from_shape),
]
