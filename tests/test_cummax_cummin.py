"""cummax / cummin patterns against torch.cummax / torch.cummin (values bit for bit, indices
exactly: ties, NaN, infinities, signed zeros), every form.

The pattern kit types every output like the first input, and these ops have an int64 second
output, so the models here are built directly (same checks: full_check, stock ORT, the
pattern's reference and torch)."""

from __future__ import annotations

import io
import warnings
from collections import Counter

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch.onnx import OperatorExportTypes

import decomposer
from decomposer.patterns.cummax_cummin import CumMax, CumMin
from decomposer.testing import compare, ir_version_for, run_onnxruntime

NEWEST = onnx.defs.onnx_opset_version()
ATEN = "org.pytorch.aten"
DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.int16, np.int8,
          np.uint8, np.bool_]
SHAPES = [((3, 20), 1), ((20, 3), 0), ((2, 5, 3), -2), ((7,), 0), ((2, 1), 1), ((0, 4), 1),
          ((4, 0), 0), ((), 0), ((), -1)]


def data(shape, dtype, seed=0) -> np.ndarray:
    """Few distinct values (many ties); floats add NaN, +-inf and -0.0."""
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.unsignedinteger):
        return rng.integers(0, 4, shape).astype(dtype)
    x = rng.integers(-3, 4, shape).astype(dtype)
    if np.issubdtype(dtype, np.floating):
        for value, share in ((np.nan, 0.08), (np.inf, 0.05), (-np.inf, 0.05), (-0.0, 0.1)):
            x[rng.random(shape) < share] = value
    return x


def torch_cum(x: np.ndarray, dim: int, largest: bool) -> list[np.ndarray]:
    values, indices = (torch.cummax if largest else torch.cummin)(torch.from_numpy(x), dim)
    return [values.numpy(), indices.numpy()]


def cum_model(op: str, form: str, x: np.ndarray, dim, opset: int, symbolic: bool = True,
              outputs: int = 2) -> onnx.ModelProto:
    """``CumMax(x; dim)`` in custom.ops (form "native"), or torch's fallback
    ``cummax(x, dim)`` (form "fallthrough") / ``ATen(operator="cummax")`` with ``dim`` a
    Constant, or a graph input when ``dim`` is "fed"."""
    dtype = helper.np_dtype_to_tensor_dtype(x.dtype)
    inputs = [helper.make_tensor_value_info(
        "x", dtype, [f"d{i}" if symbolic else s for i, s in enumerate(x.shape)])]
    nodes = []
    names = ["values", "indices"][:outputs]
    if form == "native":
        nodes.append(helper.make_node("CumMax" if op == "cummax" else "CumMin", ["x"], names,
                                      name="cum", domain="custom.ops", dim=dim))
    else:
        if dim == "fed":
            inputs.append(helper.make_tensor_value_info("dim", TensorProto.INT64, []))
        else:
            nodes.append(helper.make_node("Constant", [], ["dim"], value=onnx.numpy_helper
                                          .from_array(np.array(dim, np.int64))))
        if form == "aten":
            nodes.append(helper.make_node("ATen", ["x", "dim"], names, name="cum", domain=ATEN,
                                          operator=op, overload_name=""))
        else:
            nodes.append(helper.make_node(op, ["x", "dim"], names, name="cum", domain=ATEN))
    types = [dtype, TensorProto.INT64]
    graph = helper.make_graph(nodes, "cum", inputs, [
        helper.make_tensor_value_info(name, types[i], [None] * x.ndim)
        for i, name in enumerate(names)])
    return helper.make_model(graph, ir_version=ir_version_for(opset), opset_imports=[
        helper.make_opsetid("", opset), helper.make_opsetid(ATEN, 1),
        helper.make_opsetid("custom.ops", 1)])


def decompose_and_check(model: onnx.ModelProto, input_sets, dim: int, largest: bool
                        ) -> onnx.ModelProto:
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
    pattern = CumMax() if largest else CumMin()
    for x in input_sets:
        got = run_onnxruntime(out, {"x": x})
        for label, want in (("torch", torch_cum(x, dim, largest)),
                            ("reference", pattern.reference(x, dim=dim))):
            for index, (actual, expected) in enumerate(zip(got, want, strict=True)):
                compare(actual, np.asarray(expected),
                        f"{label} output {index}, {x.dtype} {x.shape} dim={dim}", atol=0,
                        rtol=0, signed_zeros=True)
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_dtypes_shapes_ties_nan_static_and_dynamic(dtype, op):
    for shape, dim in SHAPES:
        x = data(shape, dtype)
        for symbolic, opset in ((False, 11), (False, NEWEST), (True, 13)):
            sets = [x]
            if symbolic and x.ndim:  # the same model at other sizes
                sets += [data(tuple(s + 3 for s in shape), dtype, seed=1)]
            decompose_and_check(cum_model(op, "native", x, dim, opset, symbolic), sets,
                                dim, op == "cummax")


@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_extreme_values_and_long_rows(op):
    info = np.iinfo(np.int64)
    x = np.array([[info.max, info.min, info.max, 0, info.min, info.max - 1]], np.int64)
    decompose_and_check(cum_model(op, "native", x, 1, 11, False), [x], 1, op == "cummax")
    for dtype in (np.float64, np.float32, np.float16):
        big = np.finfo(dtype).max
        y = np.array([[np.inf, big, np.nan, np.inf, -big, -np.inf, np.nan, -0.0, 0.0, big]],
                     dtype)
        decompose_and_check(cum_model(op, "native", y, -1, 13, False), [y, y[:, ::-1].copy()],
                            -1, op == "cummax")
    rng = np.random.default_rng(3)
    long = rng.integers(-50, 50, (2, 1000)).astype(np.float32)
    for symbolic in (False, True):
        decompose_and_check(cum_model(op, "native", long, 1, 17, symbolic), [long], 1,
                            op == "cummax")


def test_scan_steps():
    """ceil(log2 n) doubling steps for a static length, 31 for a dynamic one; each step is
    one shift and one Max per scanned quantity: the running extreme, and the index (for
    floats one scan finds the last NaN or else the last record)."""
    x = data((3, 20), np.float32)
    out = decompose_and_check(cum_model("cummax", "native", x, 1, 13, symbolic=False), [x], 1,
                              True)
    counts = Counter(n.op_type for n in out.graph.node)
    assert counts["Pad"] == 2 * 5 and counts["Max"] == 2 * 5, counts
    ints = data((3, 20), np.int32)
    out = decompose_and_check(cum_model("cummin", "native", ints, 1, 13), [ints], 1, False)
    counts = Counter(n.op_type for n in out.graph.node)
    assert counts["Min"] == 31 and counts["Max"] == 31, counts
    # Dynamic: shifts may pass the end, so no Pad; t[:s] ahead of t, cut back to n.
    assert counts["Pad"] == 0 and counts["Concat"] == 2 * 31, counts
    assert counts["Reshape"] == 2 * 31, counts


@pytest.mark.parametrize("form", ["fallthrough", "aten"])
@pytest.mark.parametrize("op", ["cummax", "cummin"])
@pytest.mark.parametrize("opset", [11, 13, 17])
def test_aten_forms(form, op, opset):
    for dim in (0, 1, -1):
        x = data((4, 6), np.float32, seed=dim + 5)
        decompose_and_check(cum_model(op, form, x, dim, opset), [x, data((7, 2), np.float32)],
                            dim, op == "cummax")


class CumModel(torch.nn.Module):
    def __init__(self, largest: bool, dim: int) -> None:
        super().__init__()
        self.largest, self.dim = largest, dim

    def forward(self, x):
        values, indices = (torch.cummax if self.largest else torch.cummin)(x * 2.0, self.dim)
        return values + 1.0, indices


@pytest.mark.parametrize("export_type", [OperatorExportTypes.ONNX_FALLTHROUGH,
                                         OperatorExportTypes.ONNX_ATEN_FALLBACK],
                         ids=["fallthrough", "aten_fallback"])
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("largest", [True, False], ids=["cummax", "cummin"])
def test_torch_export_decomposes_and_matches_eager(export_type, opset, largest):
    for dim in (1, -1):
        model = CumModel(largest, dim).eval()
        buffer = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (torch.randn(2, 5, 6),), buffer, dynamo=False,
                              opset_version=opset, operator_export_type=export_type,
                              input_names=["x"], output_names=["values", "indices"],
                              dynamic_axes={"x": {0: "n", 1: "s", 2: "w"}})
        original = onnx.load_from_string(buffer.getvalue())
        assert [n for n in original.graph.node if n.domain == ATEN], "no fallback node"
        out = decomposer.decompose(original)
        onnx.checker.check_model(out, full_check=True)
        assert {i.domain for i in out.opset_import} <= {"", "ai.onnx"}
        for shape in [(2, 5, 6), (1, 9, 3), (3, 1, 4)]:
            x = data(shape, np.float32, seed=sum(shape))
            got = run_onnxruntime(out, {"x": x})
            with torch.no_grad():
                expected = [t.numpy() for t in model(torch.from_numpy(x))]
            for index in range(2):
                compare(got[index], expected[index], f"dim={dim} shape {shape}", atol=0,
                        rtol=0, signed_zeros=True)


@pytest.mark.parametrize("build, reason", [
    (lambda: cum_model("cummax", "fallthrough", data((3, 4), np.float32), "fed", 13),
     "dim (input 2) must be a constant scalar"),
    (lambda: cum_model("cummin", "aten", data((3, 4), np.float32), 2, 13),
     "dim 2 is out of range for rank 2"),
    (lambda: cum_model("cummax", "fallthrough", data((3, 4), np.float32), 0, 13, outputs=1),
     "expected 2 output(s), got 1"),
    (lambda: cum_model("cummax", "native", np.zeros((2, 2), np.complex64), 0, 13),
     "complex64 is not supported"),
    (lambda: cum_model("cummin", "native", data((3, 4), np.float32), -3, 13),
     "dim -3 is out of range"),
])
def test_bad_forms_are_rejected_with_the_node_named(build, reason):
    with pytest.raises(decomposer.UnsupportedNodeError) as info:
        decomposer.decompose(build())
    message = str(info.value)
    assert "node 'cum'" in message and reason in message, message


def test_native_form_needs_dim():
    model = cum_model("cummax", "native", data((3, 4), np.float32), 0, 13)
    del model.graph.node[-1].attribute[:]
    with pytest.raises(decomposer.UnsupportedNodeError, match="required attribute 'dim'"):
        decomposer.decompose(model)


# -- portability (the hook of scripts/portability_cases.py) ---------------------------------


def portability_cases():
    """CumMax / CumMin (custom.ops) on float32 with ties, every dim dynamic, the last
    feeds with a scan of length 1; oracle: torch.cummax / torch.cummin (values and
    indices)."""
    cases = []
    for op, dim in [("cummax", 1), ("cummin", 0)]:
        xs = [np.random.default_rng(seed).integers(-3, 4, s).astype(np.float32)
              for seed, s in enumerate([(3, 6), (4, 2), (2, 1) if dim else (1, 2)])]
        model = cum_model(op, "native", xs[0], dim, 17)
        cases.append({"id": f"{op} float32 dim={dim}", "model": model,
                      "feeds": [{"x": x} for x in xs],
                      "expected": [torch_cum(x, dim, op == "cummax") for x in xs],
                      "atol": 0.0})
    return cases


@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_mmcv_spelling_matches_torch(op):
    """mmcv::cummax / cummin (corner pooling's export with torch >= 1.5), ties included."""
    rng = np.random.default_rng(5)
    node = helper.make_node(op, ["x"], ["values", "indices"], name="scan", domain="mmcv",
                            dim=2)
    dims = ["N", 2, "H", 5]
    graph = helper.make_graph([node], "scan", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, dims)], [
        helper.make_tensor_value_info("values", TensorProto.FLOAT, dims),
        helper.make_tensor_value_info("indices", TensorProto.INT64, dims)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13),
                                                    helper.make_opsetid("mmcv", 1)],
                              ir_version=ir_version_for(13))
    out = decomposer.decompose(model)
    for shape in [(2, 2, 6, 5), (1, 2, 3, 5)]:
        x = rng.integers(0, 4, shape).astype(np.float32)  # many ties
        values, indices = run_onnxruntime(out, {"x": x})
        want = getattr(torch, op)(torch.from_numpy(x), 2)
        np.testing.assert_array_equal(values, want.values.numpy())
        np.testing.assert_array_equal(indices, want.indices.numpy())
