"""``--target-opset N``: standard ops taken down to an older opset (decomposer/opsets.py).

The oracle is ONNX's own backend node tests (scripts/backend_opsets.py): every in-scope
case above a target is taken down and run on ONNX Runtime against the case's expected
outputs. The default run samples them; ``-m exhaustive`` runs them whole. The rest checks
the flag's contract: CLI, errors, nothing half-written, no change at or above the model's
opset, a second run that changes nothing, nested graphs, functions and the IR version.
"""

from __future__ import annotations

import collections
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import decomposer
from decomposer.opsets import adapter_table, ir_version_for

import backend_opsets

# Outcomes known not to be exact, with the reason (docs/opset-adapters.md lists them all).
# test_mvn's model fails onnx.checker's full check at its own opset (a function body's
# Constant), so decomposer refuses the input.
KNOWN_NOT_EXACT = {("test_mvn", 11)}


def _backend(sample: int | None) -> list[backend_opsets.Outcome]:
    names = None
    if sample is not None:
        cases = [c for c in backend_opsets.cases() if backend_opsets.in_scope(c)]
        names = [c.name for c in cases[::sample]]
    return backend_opsets.measure([17, 13, 11], names=names)


def _assert_backend(results: list[backend_opsets.Outcome], floor: float) -> None:
    bad = [r for r in results if r.status in ("wrong", "error", "ort-error")
           and (r.case, r.target) not in KNOWN_NOT_EXACT]
    assert not bad, [f"{r.case} {r.source}->{r.target} {r.status}: {r.detail}" for r in bad]
    for result in results:
        if result.status == "refused":  # one clear reason per node, with the fix
            assert "cannot" in result.detail and result.case, result
    counted = collections.Counter(r.status for r in results)
    share = counted["exact"] / len(results)
    assert share >= floor, (share, counted)


def test_backend_cases_sampled():
    _assert_backend(_backend(sample=7), floor=0.85)


@pytest.mark.exhaustive
def test_backend_cases_whole():
    results = _backend(sample=None)
    assert len(results) > 3500
    _assert_backend(results, floor=0.89)


# -- one model through every path -------------------------------------------------------


def _model(opset: int = 18) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, 4])
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["mean"], name="mean", keepdims=1),
        helper.make_node("Softmax", ["mean"], ["soft"], name="soft", axis=1),
        helper.make_node("Sub", ["x", "soft"], ["centered"], name="sub"),
        helper.make_node("Shape", ["x"], ["tail"], name="tail", start=1),
        helper.make_node("Reshape", ["centered", "flat"], ["flat_x"], name="flatten"),
        helper.make_node("Reshape", ["flat_x", "whole"], ["back"], name="unflatten"),
        helper.make_node("LayerNormalization", ["back", "gamma"], ["y"], name="ln", axis=-1),
    ]
    initializers = [
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
        helper.make_tensor("flat", TensorProto.INT64, [2], [-1, 12]),
        helper.make_tensor("whole", TensorProto.INT64, [3], [-1, 3, 4]),
        helper.make_tensor("gamma", TensorProto.FLOAT, [4], [1.0, 2.0, 0.5, -1.0]),
    ]
    graph = helper.make_graph(nodes, "g", [x], [y, helper.make_tensor_value_info(
        "tail", TensorProto.INT64, [2])], initializers, doc_string="kept")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="tests")
    helper.set_model_props(model, {"owner": "tests"})
    return model


def _run(model: onnx.ModelProto, x: np.ndarray) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


@pytest.mark.parametrize("target", [17, 13, 11])
def test_model_goes_down_with_the_same_numbers(target):
    model = _model()
    out, report = decomposer.decompose_with_report(model, target_opset=target)
    onnx.checker.check_model(out, full_check=True)
    assert [o.version for o in out.opset_import if o.domain == ""] == [target]
    assert out.ir_version == ir_version_for(target)
    assert report.source_opset == 18 and report.opset == target
    assert f"(opset 18 -> {target})" in report.summary()
    from decomposer.graphs import has_schema

    assert all(has_schema(n.op_type, target, "") for n in out.graph.node)
    # what is not rewritten survives: names of kept nodes, metadata, doc strings
    kept = {n.name for n in out.graph.node}
    assert {"mean", "sub", "tail", "flatten", "unflatten"} <= kept
    assert out.metadata_props == model.metadata_props and out.graph.doc_string == "kept"
    assert "axes" not in {t.name for t in out.graph.initializer}  # now an attribute
    x = np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32)
    for got, want in zip(_run(out, x), _run(model, x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # a second run at the same target changes nothing
    again, second = decomposer.decompose_with_report(out, target_opset=target)
    assert again.SerializeToString() == out.SerializeToString() and not second.changed


def test_target_at_or_above_the_model_changes_nothing():
    model = decomposer.decompose(_model(), target_opset=17)  # a valid opset-17 model
    plain = decomposer.decompose(model)
    for target in (17, 18, 21):
        assert decomposer.decompose(model, target_opset=target) == plain


@pytest.mark.parametrize("bad", [10, 0, 99, True])
def test_target_out_of_range_is_a_usage_error(bad):
    with pytest.raises(decomposer.InvalidModelError, match="target opset"):
        decomposer.decompose(_model(), target_opset=bad)


def _unsayable() -> onnx.ModelProto:
    """A Pad with mode 'wrap' (opset 19), which no older Pad says."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 10, 10])
    pads = helper.make_tensor("pads", TensorProto.INT64, [8], [0, 0, 1, 1, 0, 0, 1, 1])
    node = helper.make_node("Pad", ["x", "pads"], ["y"], name="wrapped", mode="wrap")
    graph = helper.make_graph([node], "g", [x], [y], [pads])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def test_what_the_target_cannot_say_is_refused_with_the_lowest_opset():
    with pytest.raises(decomposer.UnsupportedNodeError) as caught:
        decomposer.decompose(_unsayable(), target_opset=17, allow_unsupported=True)
    message = str(caught.value)
    assert "node 'wrapped'" in message and "'wrap'" in message
    assert "the lowest target that keeps it is 19" in message
    assert caught.value.exit_code == 3


def test_cli_flag_exit_codes_and_nothing_half_written(tmp_path):
    source, out = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_model(), source)
    done = subprocess.run([sys.executable, "-m", "decomposer", str(source), str(out),
                           "--target-opset", "13"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "(opset 18 -> 13)" in done.stdout
    assert [o.version for o in onnx.load(out).opset_import if o.domain == ""] == [13]

    onnx.save(_unsayable(), source)
    refused = tmp_path / "refused.onnx"
    done = subprocess.run([sys.executable, "-m", "decomposer", str(source), str(refused),
                           "--target-opset", "17"], capture_output=True, text=True)
    assert done.returncode == 3 and not refused.exists()
    assert "Traceback" not in done.stderr and "lowest target that keeps it is 19" in done.stderr

    done = subprocess.run([sys.executable, "-m", "decomposer", str(source), str(refused),
                           "--target-opset", "9"], capture_output=True, text=True)
    assert done.returncode == 2 and not refused.exists()
    assert done.stderr.count("\n") == 1 and "target opset 9" in done.stderr


def test_check_names_what_cannot_go_down(tmp_path):
    source = tmp_path / "in.onnx"
    onnx.save(_unsayable(), source)
    done = subprocess.run([sys.executable, "-m", "decomposer", "check", str(source),
                           "--target-opset", "17"], capture_output=True, text=True)
    assert done.returncode == 3
    assert "'wrap'" in done.stdout + done.stderr


def test_nested_graphs_and_functions_go_down():
    then_branch = helper.make_graph(
        [helper.make_node("ReduceMax", ["m", "axis0"], ["t"], name="max", keepdims=1)],
        "then", [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor("axis0", TensorProto.INT64, [1], [0])])
    else_branch = helper.make_graph(
        [helper.make_node("ReduceSum", ["m", "axis0b"], ["e"], name="sum", keepdims=1)],
        "else", [], [helper.make_tensor_value_info("e", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor("axis0b", TensorProto.INT64, [1], [0])])
    function = helper.make_function(
        "mylab", "Squash", ["a"], ["b"],
        [helper.make_node("Constant", [], ["ax"], value=helper.make_tensor(
            "ax", TensorProto.INT64, [1], [0])),
         helper.make_node("ReduceMean", ["a", "ax"], ["b"], keepdims=0)],
        opset_imports=[helper.make_opsetid("", 18)])
    graph = helper.make_graph(
        [helper.make_node("If", ["c"], ["r"], name="branch", then_branch=then_branch,
                          else_branch=else_branch),
         helper.make_node("Squash", ["r"], ["y"], domain="mylab", name="call")],
        "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
              helper.make_tensor_value_info("m", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, functions=[function], opset_imports=[
        helper.make_opsetid("", 18), helper.make_opsetid("mylab", 1)])
    # --target ort keeps the model-local function, so its body goes down in place; the
    # portable target inlines the call (checked last)
    out = decomposer.decompose(model, target_opset=15, target="ort")
    onnx.checker.check_model(out, full_check=True)
    branch = next(n for n in out.graph.node if n.op_type == "If")
    for attribute in branch.attribute:
        reduce = attribute.g.node[0]
        # ReduceMax's axes are an attribute below 18; ReduceSum's an input from 13 on
        assert len(reduce.input) == (1 if reduce.op_type == "ReduceMax" else 2)
    body = out.functions[0].node
    assert [n.op_type for n in body] == ["ReduceMean"]  # its axes Constant dropped
    assert "axes" in [a.name for a in body[0].attribute] and len(body[0].input) == 1
    assert [o.version for o in out.functions[0].opset_import if o.domain == ""] == [15]
    x = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    for condition in (True, False):
        feeds = {"c": np.array(condition), "x": x, "m": np.stack([x, 2 * x])}
        want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
        got = ort.InferenceSession(out.SerializeToString()).run(None, feeds)
        np.testing.assert_array_equal(got[0], want[0])
    inlined = decomposer.decompose(model, target_opset=15)
    onnx.checker.check_model(inlined, full_check=True)
    assert not inlined.functions
    mean = next(n for n in inlined.graph.node if n.op_type == "ReduceMean")
    assert mean.name.startswith("call/") and len(mean.input) == 1
    for condition in (True, False):
        feeds = {"c": np.array(condition), "x": x, "m": np.stack([x, 2 * x])}
        want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
        got = ort.InferenceSession(inlined.SerializeToString()).run(None, feeds)
        np.testing.assert_array_equal(got[0], want[0])


def test_the_adapter_table_covers_every_version_from_12():
    from onnx import defs

    rows = adapter_table()
    pairs = {(op, version) for op, version, _, _ in rows}
    for schema in defs.get_all_schemas_with_history():
        if schema.domain == "" and schema.since_version > 11:
            assert (schema.name, schema.since_version) in pairs
    assert all(what for *_, what in rows)


# -- real models (scripts/target_opset_models.py) ----------------------------------------


def _model_rows(names, engines):
    import target_opset_models

    rows = target_opset_models.measure(names, engines)
    assert rows
    return rows


def test_mmdeploy_head_and_stn_go_down_on_onnxruntime():
    for row in _model_rows(["head", "stn"], ["ort"]):
        assert row[4].startswith("ok"), row


@pytest.mark.exhaustive
def test_real_models_on_every_engine():
    # what docs/portability.md records: every cell ok but the ones listed there
    known = {("detr", "11", "tvm"), ("llama", "23 (own)", "tvm"), ("detr", "16 (own)", "ort"),
             ("detr", "16 (own)", "tvm")}
    engines = ["ort", "openvino", "tvm"]
    for row in _model_rows(["stn", "vit", "bert", "llama", "detr", "head"], engines):
        for engine, cell in zip(engines, row[4:], strict=True):
            if (row[0], row[2], engine) not in known:
                assert cell.startswith("ok"), row


def test_an_op_the_target_lacks_with_constant_inputs_becomes_its_value():
    # a mel filter bank of constant sizes (what audio front ends write) is folded with
    # ONNX's reference implementation; ONNX Runtime's own MelWeightMatrix is the oracle
    def scalar(name, value, elem=TensorProto.INT64):
        return helper.make_tensor(name, elem, [], [value])

    graph = helper.make_graph(
        [helper.make_node("MelWeightMatrix", ["bins", "n", "rate", "lo", "hi"], ["w"],
                          name="mel"),
         helper.make_node("MatMul", ["x", "w"], ["y"], name="project")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 257])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 40])],
        [scalar("bins", 40), scalar("n", 512), scalar("rate", 16000),
         scalar("lo", 20.0, TensorProto.FLOAT), scalar("hi", 8000.0, TensorProto.FLOAT)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    out = decomposer.decompose(model, target_opset=13)
    onnx.checker.check_model(out, full_check=True)
    assert [n.op_type for n in out.graph.node] == ["Constant", "MatMul"]
    assert not out.graph.initializer  # the sizes fed only the folded node
    x = np.random.default_rng(2).random((3, 257)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    got = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode, attrs, source", [
    ("linear", {"antialias": 1}, 18), ("cubic", {"antialias": 1, "cubic_coeff_a": -0.5}, 18),
    ("linear", {"coordinate_transformation_mode": "half_pixel_symmetric"}, 19),
    ("linear", {"antialias": 1, "axes": [2, 3]}, 18),
])
def test_resize_the_target_cannot_say_becomes_matrices(mode, attrs, source):
    """Resize with antialias (or half_pixel_symmetric) and constant scales, taken below
    18/19: one MatMul per resized axis; against ONNX's reference evaluator and ONNX
    Runtime's own kernel. (torch's antialiased bilinear is another filter: off by 0.08
    here, for ONNX Runtime's kernel as for the matrices.)"""
    from onnx.reference import ReferenceEvaluator

    scales = [0.5, 0.375] if attrs.get("axes") else [1.0, 1.0, 0.5, 0.375]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 16, 24])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, 8, 9])
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="shrink", mode=mode,
                            **attrs)
    graph = helper.make_graph([node], "g", [x], [y], [helper.make_tensor(
        "scales", TensorProto.FLOAT, [len(scales)], scales)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", source)])
    data = np.random.default_rng(4).standard_normal((2, 3, 16, 24)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": data})[0]
    native = ort.InferenceSession(model.SerializeToString()).run(None, {"x": data})[0]
    for target in (17, 13, 11):
        out, report = decomposer.decompose_with_report(model, target_opset=target)
        onnx.checker.check_model(out, full_check=True)
        assert "Resize" not in {n.op_type for n in out.graph.node}
        assert [n.op_type for n in out.graph.node].count("MatMul") == 2
        got = ort.InferenceSession(out.SerializeToString()).run(None, {"x": data})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, native, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction, torch_name", [("add", "sum"), ("mul", "prod"),
                                                   ("max", "amax"), ("min", "amin")])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_scatter_elements_reduction_below_16_18_against_torch(reduction, torch_name, dtype):
    """ScatterElements-18 with a reduction, duplicate and negative indices, updates smaller
    than the data, taken to 15 and 11; against torch.scatter_reduce (include_self)."""
    import torch

    rng = np.random.default_rng(6)
    data = (rng.standard_normal((4, 6)) * 3).astype(dtype)
    indices = rng.integers(-6, 6, (3, 5)).astype(np.int64)
    indices[0, :2] = [1, 1]  # duplicates
    updates = (rng.standard_normal((3, 5)) * 3).astype(dtype)
    elem = TensorProto.FLOAT if dtype == np.float32 else TensorProto.INT64
    graph = helper.make_graph(
        [helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], name="scatter", axis=1,
                          reduction=reduction)], "g",
        [helper.make_tensor_value_info("d", elem, ["a", 6]),
         helper.make_tensor_value_info("i", TensorProto.INT64, ["b", 5]),
         helper.make_tensor_value_info("u", elem, ["b", 5])],
        [helper.make_tensor_value_info("y", elem, ["a", 6])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    wrapped = np.where(indices < 0, indices + 6, indices)
    want = torch.from_numpy(data.copy())
    want[:3] = torch.scatter_reduce(want[:3], 1, torch.from_numpy(wrapped),
                                    torch.from_numpy(updates), reduce=torch_name)
    for target in (15, 11):
        out = decomposer.decompose(model, target_opset=target)
        onnx.checker.check_model(out, full_check=True)
        got = ort.InferenceSession(out.SerializeToString()).run(
            None, {"d": data, "i": indices, "u": updates})[0]
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_nd_reduction_below_16_18_against_numpy(reduction):
    """ScatterND-18 with a reduction and repeated indices (slices and single elements),
    taken to 15 and 11; against a sequential numpy loop (ONNX's definition)."""
    rng = np.random.default_rng(8)
    data = rng.standard_normal((4, 3, 2)).astype(np.float32)
    indices = np.array([[1], [3], [1], [-4]], np.int64)  # -4 is 0; 1 twice
    updates = rng.standard_normal((4, 3, 2)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("ScatterND", ["d", "i", "u"], ["y"], name="scatter",
                          reduction=reduction)], "g",
        [helper.make_tensor_value_info("d", TensorProto.FLOAT, [4, 3, 2]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [4, 1]),
         helper.make_tensor_value_info("u", TensorProto.FLOAT, [4, 3, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    combine = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}
    want = data.copy()
    for position, update in zip(indices[:, 0] % 4, updates, strict=True):
        want[position] = combine[reduction](want[position], update)
    for target in (15, 11):
        out = decomposer.decompose(model, target_opset=target)
        onnx.checker.check_model(out, full_check=True)
        got = ort.InferenceSession(out.SerializeToString()).run(
            None, {"d": data, "i": indices, "u": updates})[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def _volumetric_grid_sample(mode: str) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, 4, 5, 6])
    grid = helper.make_tensor_value_info("grid", TensorProto.FLOAT, ["n", 3, 4, 2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 2, 3, 4, 2])
    node = helper.make_node("GridSample", ["x", "grid"], ["y"], name="sample3d", mode=mode,
                            align_corners=1)
    return helper.make_model(helper.make_graph([node], "g", [x, grid], [y]),
                             opset_imports=[helper.make_opsetid("", 20)])


def test_a_form_the_target_op_lacks_goes_to_the_op_s_pattern():
    """GridSample-16..19 is 4-D only: a 5-D GridSample-20 taken to 17 is handed to the
    GridSample pattern (ONNX's reference and ONNX Runtime's GridSample-20 the oracles);
    one it refuses stays exit 3, even with allow_unsupported (nothing reads the hand-over
    domain)."""
    from onnx.reference import ReferenceEvaluator

    model = _volumetric_grid_sample("linear")
    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((1, 2, 4, 5, 6)).astype(np.float32),
             "grid": rng.uniform(-1.1, 1.1, (1, 3, 4, 2, 3)).astype(np.float32)}
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    out, report = decomposer.decompose_with_report(model, target_opset=17)
    onnx.checker.check_model(out, full_check=True)
    assert report.counts == {"GridSample": 1}
    assert {o.domain for o in out.opset_import} == {""}
    got = ort.InferenceSession(out.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(decomposer.UnsupportedNodeError, match="sample3d"):
        decomposer.decompose(_volumetric_grid_sample("cubic"), target_opset=17,
                             allow_unsupported=True)
