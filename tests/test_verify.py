"""--verify: correct decompositions pass, broken ones fail and are named, inputs are checked.

Oracles: the patterns' numpy references are independent of their ONNX builds; the broken
decompositions below are wrong on purpose and must be caught; ``--expected`` files come from
torch eager. Covers the fast route (main graph, If/Loop/Scan bodies, local functions, the
fall-back for a form that cannot be exposed), ``--verify=full``, engines, external data, and
the feed errors of issue 10 (defect 6), the "ok" line wording (defect 10) and external data
(defect 5).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx.external_data_helper import convert_model_to_external_data

import decomposer
import decomposer.engines
import decomposer.verification
from decomposer.cli import main
from decomposer.errors import EngineRunError
from decomposer.patterns.affine_grid import AffineGrid
from decomposer.testing import Case, single_node_model
from decomposer.verification import TensorCheck, compare

from seed_models import export_seed_stn

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests" / "data" / "stn_custom.onnx"
NODE = "/affine/AffineGrid"
AT_512 = {"input_shapes": {"image": [1, 3, 512, 512]}, "input_values": {"size": [1, 64, 512, 512]}}


class OffByOneAlignCorners(AffineGrid):
    """A deliberately wrong AffineGrid: builds with align_corners flipped."""

    def build(self, b, node, facts):
        super().build(b, node, facts._replace(align_corners=not facts.align_corners))


class SwappedXY(AffineGrid):
    """A deliberately wrong AffineGrid: swaps the grid's x and y channels (2-D)."""

    def build(self, b, node, facts):
        proto = onnx.NodeProto()
        proto.CopyFrom(node.proto)
        proto.output[0] = node.outputs[0] + "_unswapped"
        super().build(b, dataclasses.replace(node, proto=proto), facts)
        b.op("Gather", proto.output[0], b.ints([1, 0], "yx"), axis=-1, out=node.outputs[0])


def broken_registry(pattern) -> decomposer.Registry:
    registry = decomposer.default_registry().copy()
    registry.register(pattern, source="test", override=True)
    return registry


def failing_nodes(report) -> set[str | None]:
    return {c.node for c in report.failures if c.kind == "node"}


# -- the fast route on the seed STN ------------------------------------------------------


def test_seed_stn_fast_route_checks_the_replaced_node_per_run():
    original = onnx.load(EXAMPLE)
    report = decomposer.verify(original, decomposer.decompose(original), runs=3,
                               input_values={"size": [1, 64, 6, 11]})
    assert report.passed, report.table()
    assert report.mode == "fast" and report.runs == 3 and report.replaced_nodes == 1
    assert {(c.kind, c.node, c.engine) for c in report.checks} == {("node", NODE, "ort")}
    assert sorted(c.run for c in report.checks) == [0, 1, 2]
    assert {c.shape for c in report.checks} == {(1, 6, 11, 2)}
    assert max(c.max_abs_error for c in report.checks) < 1e-5


@pytest.mark.parametrize("pattern", [OffByOneAlignCorners(), SwappedXY()],
                         ids=["off_by_one_align_corners", "swapped_xy"])
def test_broken_decomposition_is_caught_and_named_at_512(pattern):
    original = onnx.load(EXAMPLE)
    wrong = decomposer.decompose(original, registry=broken_registry(pattern))
    report = decomposer.verify(original, wrong, **AT_512)
    assert not report.passed
    assert failing_nodes(report) == {NODE}
    assert report.failures[0].shape == (1, 512, 512, 2)
    assert f"wrong node(s): '{NODE}' (AffineGrid)" in report.summary()
    with pytest.raises(decomposer.VerificationError):
        decomposer.require_passed(report)
    # and the correct decomposition passes at that size
    assert decomposer.verify(original, decomposer.decompose(original), **AT_512).passed


def test_full_route_still_runs_the_whole_original():
    original = onnx.load(EXAMPLE)
    options = {"input_values": {"size": [1, 64, 5, 7]}, "mode": "full"}
    report = decomposer.verify(original, decomposer.decompose(original), **options)
    assert report.passed, report.table()
    assert {(c.kind, c.node) for c in report.checks} == {("output", None), ("node", NODE)}
    wrong = decomposer.decompose(original, registry=broken_registry(OffByOneAlignCorners()))
    report = decomposer.verify(original, wrong, **options)
    assert not report.passed and failing_nodes(report) == {NODE}
    with pytest.raises(decomposer.InvalidModelError, match="verification mode 'quick'"):
        decomposer.verify(original, wrong, mode="quick")


def test_cli_verify_failure_exits_1_keeps_output_and_says_so(tmp_path, capsys):
    plugin = tmp_path / "broken.py"
    plugin.write_text(textwrap.dedent('''
        from decomposer.patterns.affine_grid import AffineGrid

        class AffineGrid(AffineGrid):
            """Broken on purpose: align_corners flipped."""
            def build(self, b, node, facts):
                super().build(b, node, facts._replace(align_corners=not facts.align_corners))

        PATTERNS = [AffineGrid()]
    '''))
    out = tmp_path / "out.onnx"
    report = tmp_path / "report.json"
    for mode in ("--verify", "--verify=full"):
        code = main([str(EXAMPLE), str(out), "--patterns", str(plugin), "--override", mode,
                     "--input-value", "size=1,64,4,6", "--report", str(report)])
        assert code == 1
        err = capsys.readouterr().err
        assert "VERIFICATION FAILED" in err and f"'{NODE}' (AffineGrid)" in err
        assert "does NOT match the original; do not ship it" in err
        assert out.exists()
        data = json.loads(report.read_text())["verification"]
        assert data["passed"] is False and data["mode"] == mode.partition("=")[2] or "fast"
        out.unlink()


def test_cli_verify_success_and_report(tmp_path, capsys):
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    assert main([str(EXAMPLE), str(out), "--verify", "--input-value", "size=1,64,3,8",
                 "--runs", "2", "--report", str(report)]) == 0
    assert "verified: 2 tensor(s) over 2 run(s) match on ort" in capsys.readouterr().out
    data = json.loads(report.read_text())["verification"]
    assert data["mode"] == "fast" and data["engines"] == ["ort"]
    assert {c["kind"] for c in data["checks"]} == {"node"}
    assert all(c["passed"] and c["atol"] == 1e-5 and c["engine"] == "ort"
               for c in data["checks"])


def test_bare_verify_before_the_paths_does_not_eat_the_input(tmp_path, capsys):
    out = tmp_path / "out.onnx"
    assert main(["--verify", str(EXAMPLE), str(out), "--input-value", "size=1,8,3,4"]) == 0
    assert main(["--verify=full", str(EXAMPLE), str(out), "--input-value",
                 "size=1,8,3,4"]) == 0
    assert "verified: 2 tensor(s)" in capsys.readouterr().out  # full: output + node


def test_inputs_and_expected_from_pytorch(tmp_path, capsys):
    src = tmp_path / "stn.onnx"
    model = export_seed_stn(src)
    rng = np.random.default_rng(0)
    feeds = {"image": rng.normal(size=(1, 3, 20, 24)).astype(np.float32),
             "theta": rng.uniform(-1, 1, (1, 2, 3)).astype(np.float32),
             "size": np.array([1, 64, 10, 12], np.int64)}
    with torch.no_grad():
        expected = model(*(torch.from_numpy(v) for v in feeds.values())).numpy()
    np.savez(tmp_path / "in.npz", **feeds)
    np.savez(tmp_path / "expected.npz", output=expected)
    np.savez(tmp_path / "wrong.npz", output=expected + 0.01)
    out = tmp_path / "out.onnx"
    args = [str(src), str(out), "--verify", "--inputs", str(tmp_path / "in.npz"), "-v"]
    assert main([*args, "--expected", str(tmp_path / "expected.npz")]) == 0
    table = capsys.readouterr().out
    assert "on ort expected 'output' [1, 64, 10, 12]" in table
    assert f"node '{NODE}' (AffineGrid) output" in table
    assert main([*args, "--expected", str(tmp_path / "wrong.npz")]) == 1
    assert "FAIL run 0 on ort expected 'output'" in capsys.readouterr().err


def test_input_shape_fixes_symbolic_dims():
    original = onnx.load(EXAMPLE)
    report = decomposer.verify(original, decomposer.decompose(original),
                               input_shapes={"image": [1, 3, 9, 10]},
                               input_values={"size": [1, 64, 2, 3]})
    assert report.passed


@pytest.mark.parametrize("mode", ["fast", "full"])
@pytest.mark.parametrize("op, attrs, inputs", [
    ("AffineGrid", {"align_corners": 1},
     [np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32),
      np.array([2, 1, 3, 4, 5], np.int64)]),
    ("Rot90AndScale", {"k": 3, "scale": 2.0, "clockwise": "yes"},
     [np.random.default_rng(1).normal(size=(2, 3, 4, 5)).astype(np.float32)]),
    ("CustomRotScale", {"rotations": 1, "dims": "width,height"},
     [np.random.default_rng(2).normal(size=(1, 2, 3, 7)).astype(np.float64)]),
])
def test_every_pattern_verifies(op, attrs, inputs, mode):
    case = Case(inputs, attrs, symbolic={0: [0]}, output_rank=5 if op == "AffineGrid" else None)
    model = single_node_model(op, "custom.ops", case, 17)
    feeds = {f"input{i}": a for i, a in enumerate(inputs)}
    report = decomposer.verify(model, decomposer.decompose(model), feeds=feeds, atol=1e-6,
                               rtol=0, mode=mode)
    assert report.passed, report.table()


def test_verify_flags_without_verify_warn(tmp_path, capsys):
    shutil.copy(EXAMPLE, tmp_path / "m.onnx")
    assert main([str(tmp_path / "m.onnx"), str(tmp_path / "o.onnx"),
                 "--input-value", "size=1,2,3,4", "--engine", "openvino"]) == 0
    assert "--input-value, --engine ignored without --verify" in capsys.readouterr().err


# -- nested nodes: If, Loop, Scan, local functions ----------------------------------------

F, I64 = TensorProto.FLOAT, TensorProto.INT64
THETA = helper.make_tensor_value_info("theta", F, ["N", 2, 3])
SIZE = helper.make_tensor_value_info("size", I64, [4])


def grid_node(theta, out, name, align=0):
    return helper.make_node("AffineGrid", [theta, "size"], [out], name=name,
                            domain="custom.ops", align_corners=align)


def model_of(nodes, inputs, outputs, functions=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16),
                                                   helper.make_opsetid("custom.ops", 1),
                                                   helper.make_opsetid("local", 1)],
                             ir_version=8, functions=list(functions))


def theta_feeds(**more):
    rng = np.random.default_rng(3)
    return {"theta": rng.normal(size=(2, 2, 3)).astype(np.float32),
            "size": np.array([2, 1, 4, 5], np.int64), **more}


def if_model():
    then = helper.make_graph([grid_node("theta", "g1", "in_then", align=1)], "then", [],
                             [helper.make_tensor_value_info("g1", F, [None] * 4)])
    other = helper.make_graph([grid_node("theta", "g2", "in_else")], "else", [],
                              [helper.make_tensor_value_info("g2", F, [None] * 4)])
    return model_of(
        [helper.make_node("If", ["cond"], ["grid"], name="choose", then_branch=then,
                          else_branch=other)],
        [THETA, SIZE, helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("grid", F, [None] * 4)])


def loop_model(alternate_branches=False):
    """grid[i] = AffineGrid(theta * i, size) for i < trips; with ``alternate_branches`` the
    node sits in an If whose branch changes every iteration."""
    nodes = [helper.make_node("Cast", ["i"], ["i_f"], to=F),
             helper.make_node("Mul", ["theta", "i_f"], ["theta_i"]),
             helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    if alternate_branches:
        then = helper.make_graph([grid_node("theta_i", "a", "in_loop_if")], "then", [],
                                 [helper.make_tensor_value_info("a", F, [None] * 4)])
        other = helper.make_graph([helper.make_node("Neg", ["theta_i"], ["b_theta"]),
                                   grid_node("b_theta", "b", "in_loop_else")], "else", [],
                                  [helper.make_tensor_value_info("b", F, [None] * 4)])
        nodes += [helper.make_node("Constant", [], ["two"], value_int=2),
                  helper.make_node("Mod", ["i", "two"], ["parity"]),
                  helper.make_node("Constant", [], ["zero"], value_int=0),
                  helper.make_node("Equal", ["parity", "zero"], ["even"]),
                  helper.make_node("If", ["even"], ["g"], then_branch=then, else_branch=other)]
    else:
        nodes.append(grid_node("theta_i", "g", "in_loop"))
    body = helper.make_graph(nodes, "body", [
        helper.make_tensor_value_info("i", I64, []),
        helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("g", F, [None] * 4)])
    return model_of([helper.make_node("Loop", ["trips", ""], ["grids"], name="repeat",
                                      body=body)],
                    [THETA, SIZE, helper.make_tensor_value_info("trips", I64, [])],
                    [helper.make_tensor_value_info("grids", F, [None] * 5)])


def scan_model():
    body = helper.make_graph(
        [helper.make_node("Rot90AndScale", ["x_t"], ["y_t"], name="in_scan",
                          domain="custom.ops", k=1, scale=2.0)],
        "body", [helper.make_tensor_value_info("x_t", F, [3, 4])],
        [helper.make_tensor_value_info("y_t", F, [4, 3])])
    return model_of([helper.make_node("Scan", ["x"], ["y"], name="each", body=body,
                                      num_scan_inputs=1)],
                    [helper.make_tensor_value_info("x", F, [5, 3, 4])],
                    [helper.make_tensor_value_info("y", F, [5, 4, 3])])


def function_model():
    function = helper.make_function(
        "local", "make_grid", ["t", "s"], ["g"],
        [helper.make_node("AffineGrid", ["t", "s"], ["g"], name="in_function",
                          domain="custom.ops")],
        opset_imports=[helper.make_opsetid("", 16), helper.make_opsetid("custom.ops", 1)])
    function.value_info.append(helper.make_tensor_value_info("t", F, [None, 2, 3]))
    nodes = [helper.make_node("make_grid", ["theta", "size"], ["g1"], name="first",
                              domain="local"),
             helper.make_node("Neg", ["theta"], ["neg_theta"]),
             helper.make_node("make_grid", ["neg_theta", "size"], ["g2"], name="second",
                              domain="local")]
    return model_of(nodes, [THETA, SIZE], [helper.make_tensor_value_info("g1", F, [None] * 4),
                                           helper.make_tensor_value_info("g2", F, [None] * 4)],
                    [function])


class WrongRot90(decomposer.Pattern):
    """A deliberately wrong Rot90AndScale: transposes instead of rotating."""

    op_type = "Rot90AndScale"
    attributes = {"k": decomposer.Attr("int", 1), "scale": decomposer.Attr("float", 1.0)}

    def build(self, b, node, facts):
        scaled = b.op("Mul", node.inputs[0], b.const(node.attrs["scale"], np.float32))
        b.op("Transpose", scaled, perm=[1, 0], out=node.outputs[0])


def test_nodes_in_both_if_branches_are_checked_per_node():
    model = if_model()
    wrong = decomposer.decompose(model, registry=broken_registry(OffByOneAlignCorners()))
    for cond, node in ((True, "in_then"), (False, "in_else")):
        feeds = theta_feeds(cond=np.array(cond))
        good = decomposer.verify(model, decomposer.decompose(model), feeds=feeds)
        assert good.passed, good.table()
        assert {(c.kind, c.node) for c in good.checks} == {("node", node)}
        assert "If 'choose'" in good.checks[0].context
        bad = decomposer.verify(model, wrong, feeds=feeds)
        assert failing_nodes(bad) == {node}


def test_if_branch_node_is_checked_per_node_on_openvino_too():
    model = if_model()
    feeds = theta_feeds(cond=np.array(False))
    good = decomposer.verify(model, decomposer.decompose(model), feeds=feeds,
                             engines=["openvino"])
    assert good.passed, good.table()
    assert {(c.kind, c.node, c.engine) for c in good.checks} == {("node", "in_else", "openvino")}
    wrong = decomposer.decompose(model, registry=broken_registry(OffByOneAlignCorners()))
    bad = decomposer.verify(model, wrong, feeds=feeds, engines=["openvino"])
    assert failing_nodes(bad) == {"in_else"}


def test_loop_body_node_is_checked_in_every_iteration():
    model = loop_model()
    feeds = theta_feeds(trips=np.array(3, np.int64))
    good = decomposer.verify(model, decomposer.decompose(model), feeds=feeds)
    assert good.passed, good.table()
    (check,) = good.checks
    assert check.node == "in_loop" and "worst of 3 iterations: Loop 'repeat' iteration" \
        in check.context
    wrong = decomposer.decompose(model, registry=broken_registry(OffByOneAlignCorners()))
    bad = decomposer.verify(model, wrong, feeds=feeds)
    assert failing_nodes(bad) == {"in_loop"}
    assert "Loop 'repeat' iteration" in bad.failures[0].context


def test_scan_body_node_is_checked_per_slice():
    model = scan_model()
    feeds = {"x": np.random.default_rng(4).normal(size=(5, 3, 4)).astype(np.float32)}
    good = decomposer.verify(model, decomposer.decompose(model), feeds=feeds)
    assert good.passed and "worst of 5 iterations: Scan 'each' iteration" in good.checks[0].context
    bad = decomposer.verify(model, decomposer.decompose(model,
                                                        registry=broken_registry(WrongRot90())),
                            feeds=feeds)
    assert failing_nodes(bad) == {"in_scan"}


def test_function_node_is_checked_per_call_site():
    # --target ort keeps the function: its body's node is checked at each call site
    model = function_model()
    kept = decomposer.decompose(model, target="ort")
    good = decomposer.verify(model, kept, feeds=theta_feeds())
    assert good.passed, good.table()
    contexts = sorted(c.context for c in good.checks)
    assert len(contexts) == 2 and "call 'first'" in contexts[0] \
        and "call 'second'" in contexts[1]
    wrong = decomposer.decompose(model, registry=broken_registry(OffByOneAlignCorners()),
                                 target="ort")
    bad = decomposer.verify(model, wrong, feeds=theta_feeds())
    assert failing_nodes(bad) == {"in_function"} and len(bad.failures) == 2


def test_inlined_calls_are_checked_against_the_definition():
    # the portable target inlines each call; the reference is the definition, run with the
    # reference of the custom node inside it
    model = function_model()
    good = decomposer.verify(model, decomposer.decompose(model), feeds=theta_feeds())
    assert good.passed, good.table()
    assert {c.node for c in good.checks if c.kind == "node"} == {"first", "second"}
    wrong = decomposer.decompose(model, registry=broken_registry(OffByOneAlignCorners()))
    bad = decomposer.verify(model, wrong, feeds=theta_feeds())
    assert failing_nodes(bad) == {"first", "second"}


def test_unexposable_nested_node_is_checked_through_graph_outputs():
    """An If inside a Loop whose branch changes per iteration: the exposed value's shape
    changes too, which a Loop cannot stack; the nodes are then checked through the Loop's
    output against the original on the reference evaluator."""
    model = loop_model(alternate_branches=True)
    feeds = theta_feeds(trips=np.array(3, np.int64))
    good = decomposer.verify(model, decomposer.decompose(model), feeds=feeds)
    assert good.passed, good.table()
    assert {(c.kind, c.tensor) for c in good.checks} == {("output", "grids")}
    assert "compared with the original on onnx.reference" in good.checks[0].note
    assert any("values inside nested graphs" in note for note in good.notes)
    wrong = decomposer.decompose(model, registry=broken_registry(OffByOneAlignCorners()))
    assert not decomposer.verify(model, wrong, feeds=feeds).passed


def test_node_that_never_runs_is_a_note_not_a_pass():
    model = loop_model()
    report = decomposer.verify(model, decomposer.decompose(model),
                               feeds=theta_feeds(trips=np.array(0, np.int64)))
    assert not report.passed and not report.checks
    assert "did not run in any run" in report.notes[0]
    assert "nothing could be compared" in report.summary()


# -- engines --------------------------------------------------------------------------------


# TVM's importer warns about the untyped extra outputs the fast route adds; harmless.
@pytest.mark.filterwarnings("ignore:Field 'type' of 'value_info':UserWarning")
def test_openvino_and_tvm_on_the_seed_stn(tmp_path, capsys):
    """The portable AffineGrid runs on both; each engine's captured grid is checked against
    the reference (an engine that failed would be a FAIL row naming it: next test)."""
    out = tmp_path / "out.onnx"
    code = main([str(EXAMPLE), str(out), "--verify", "--engine", "openvino", "--engine", "tvm",
                 "--input-value", "size=1,8,5,6", "--runs", "1", "-v"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    for engine in ("openvino", "tvm"):
        assert f"ok   run 0 on {engine} node '{NODE}' (AffineGrid) output" in captured.out
    assert "verified: 2 tensor(s) over 1 run(s) match on openvino, tvm" in captured.out


def test_engine_failure_names_engine_node_and_first_error_line(tmp_path, capsys, monkeypatch):
    def refuse(engine, model, feeds, static_shapes=False):
        raise EngineRunError(f"Unsupported operation: Convolution name: {NODE}/grid -- "
                             f"dynamic weights", engine=engine)

    monkeypatch.setattr(decomposer.engines, "run_model", refuse)
    out = tmp_path / "out.onnx"
    code = main([str(EXAMPLE), str(out), "--verify", "--engine", "openvino",
                 "--input-value", "size=1,8,5,6", "--runs", "1"])
    err = capsys.readouterr().err
    assert code == 1 and out.exists()
    assert (f"FAIL run 0 on openvino: cannot run the decomposed model (node '{NODE}' "
            f"(AffineGrid)): Unsupported operation: Convolution") in err
    assert f"engine(s) that cannot run it: openvino (at node '{NODE}' (AffineGrid))" in err


def test_engine_not_installed_or_unknown_is_exit_2_and_writes_nothing(tmp_path, capsys,
                                                                      monkeypatch):
    out = tmp_path / "out.onnx"
    args = [str(EXAMPLE), str(out), "--verify", "--input-value", "size=1,8,5,6"]
    assert main([*args, "--engine", "tensorrt"]) == 2
    assert "unknown engine 'tensorrt'" in capsys.readouterr().err
    monkeypatch.setitem(decomposer.engines._IMPORTED, "tvm", ImportError("No module named tvm"))
    assert main([*args, "--engine", "tvm"]) == 2
    assert "pip install apache-tvm" in capsys.readouterr().err
    assert not out.exists()


# -- external data (issue 10, defect 5) -------------------------------------------------------


def external_stn(folder: Path) -> Path:
    model = onnx.load(EXAMPLE)
    convert_model_to_external_data(model, all_tensors_to_one_file=True,
                                   location="weights.bin", size_threshold=0)
    path = folder / "stn_external.onnx"
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("mode", ["--verify", "--verify=full"])
def test_external_data_model_verifies(tmp_path, capsys, mode):
    src = external_stn(tmp_path)
    out = tmp_path / "out" / "clean.onnx"
    out.parent.mkdir()
    assert main([str(src), str(out), mode, "--input-value", "size=1,64,6,7"]) == 0, \
        capsys.readouterr().err
    assert "verified:" in capsys.readouterr().out


def test_external_data_library_needs_the_folder(tmp_path):
    src = external_stn(tmp_path)
    original = decomposer.load_model(src)  # weights stay on disk
    clean = decomposer.decompose(original)
    with pytest.raises(decomposer.InvalidModelError, match="pass base_dir="):
        decomposer.verify(original, clean, input_values={"size": [1, 64, 3, 4]})
    for mode in ("fast", "full"):
        report = decomposer.verify(original, clean, input_values={"size": [1, 64, 3, 4]},
                                   base_dir=tmp_path, mode=mode, engines=["ort"])
        assert report.passed, report.table()


# -- feeds that do not fit (issue 10, defect 6) ------------------------------------------------


@pytest.mark.parametrize("flags, message", [
    (["--input-value", "sise=1,64,4,4"],
     "--input-value: the model has no input 'sise'; its inputs are: image, theta, size"),
    (["--input-value", "size=1,64,4,4", "--input-shape", "imgae:1x3x8x8"],
     "--input-shape: the model has no input 'imgae'"),
    (["--input-value", "size=1,64,4,4", "--input-shape", "image:1x3x8"],
     "--input-shape image:1x3x8: input 'image' has rank 4 (1 x 3 x height x width), got 3"),
    (["--input-value", "size=1,64,4,4", "--input-shape", "image:1x4x8x8"],
     "input 'image' has fixed dim 1 = 3"),
    (["--input-value", "size=1,64,4"], "input 'size' has fixed dim 0 = 4"),
    (["--input-value", "size=1,64,4.5,4"], "input 'size' is int64; give whole numbers"),
])
def test_bad_input_flags_are_one_line_exit_2_nothing_written(tmp_path, capsys, flags, message):
    out = tmp_path / "out.onnx"
    assert main([str(EXAMPLE), str(out), "--verify", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def stn_feeds(**changes):
    rng = np.random.default_rng(0)
    feeds = {"image": rng.normal(size=(1, 3, 8, 8)).astype(np.float32),
             "theta": rng.uniform(-1, 1, (1, 2, 3)).astype(np.float32),
             "size": np.array([1, 64, 4, 4], np.int64)}
    return {**feeds, **changes}


@pytest.mark.parametrize("write, message", [
    (lambda p: np.savez(p, **stn_feeds(image=np.zeros((1, 3, 8, 8)))),
     "--inputs: 'image' is float64 but the model's input 'image' is float32"),
    (lambda p: np.savez(p, **stn_feeds(theta=np.zeros((1, 3, 3), np.float32))),
     "--inputs: input 'theta' has fixed dim 1 = 2"),
    (lambda p: np.savez(p, **stn_feeds(), extra=np.zeros(2)),
     "--inputs: the model has no input 'extra'"),
    (lambda p: p.write_text("image,theta\n1,2\n"), "not an .npz file"),
    (lambda p: np.save(open(p, "wb"), np.zeros(3)), "is a single-array .npy file"),
    (lambda p: p.write_bytes(b"PK\x03\x04 truncated"), "not an .npz file"),
])
def test_bad_inputs_file_is_one_line_exit_2_nothing_written(tmp_path, capsys, write, message):
    feeds, out = tmp_path / "feeds.npz", tmp_path / "out.onnx"
    write(feeds)
    assert main([str(EXAMPLE), str(out), "--verify", "--inputs", str(feeds)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert "pickle" not in err
    assert not out.exists()


def test_integer_input_without_value_is_an_error_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out.onnx"
    assert main([str(EXAMPLE), str(out), "--verify"]) == 2
    assert "give its value with --input-value size=" in capsys.readouterr().err
    assert not out.exists()


# -- what the lines say (issue 10, defect 10) ------------------------------------------------


def test_ok_line_states_the_allclose_criterion_not_a_relative_error():
    expected = np.array([2e-7, 0.5], np.float32)
    actual = np.array([4.2e-6, 0.5], np.float32)  # rel 20 at [0], but |a-e| <= atol
    assert np.allclose(actual, expected, atol=1e-5, rtol=1e-4)
    result = compare(actual, expected, atol=1e-5, rtol=1e-4)
    assert result.passed and result.max_rel > 19 and 0.35 < result.tolerance_used < 0.45
    line = TensorCheck("t", "node", "n", "P", 0, (2,), result.max_abs, result.max_rel, 1e-5,
                       1e-4, result.passed, tolerance_used=result.tolerance_used).describe()
    assert line.startswith("ok") and "within tolerance" in line and "rel" not in line, line
    assert "20" not in line and "40% of atol 1e-05 + rtol 0.0001 * |expected|" in line


def test_compare_agrees_with_allclose_on_edge_values():
    rng = np.random.default_rng(5)
    cases = [(np.array([np.nan, 1.0]), np.array([np.nan, 1.0])),
             (np.array([np.inf, -np.inf]), np.array([np.inf, -np.inf])),
             (np.array([np.inf]), np.array([1e30])),
             (np.array([np.nan]), np.array([0.0])),
             (np.array([1.0 + 1.1e-4]), np.array([1.0])),
             (rng.normal(size=(600, 500)), rng.normal(size=(600, 500)) * 1e-9)]
    for actual, expected in cases:
        want = bool(np.allclose(actual, expected, atol=1e-5, rtol=1e-4, equal_nan=True))
        assert compare(actual, expected, 1e-5, 1e-4).passed == want, (actual, expected)
    big = np.zeros((700, 800))
    shifted = big.copy()
    shifted[650, 777] = 1.0  # past the first chunk
    result = compare(shifted, big, 1e-5, 1e-4)
    assert not result.passed and result.worst_index == (650, 777)


# -- progress ------------------------------------------------------------------------------------


def test_progress_line_for_slow_runs_and_silenced_by_quiet(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(decomposer.verification, "PROGRESS_DELAY_S", 0.0)
    args = [str(EXAMPLE), str(tmp_path / "o.onnx"), "--verify", "--input-value",
            "size=1,8,5,6", "--runs", "2"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "decomposer: verifying: run 1/2 on ort" in err and "done in" in err
    assert main([*args, "-q"]) == 0
    assert capsys.readouterr().err == ""


def test_core_verification_names_no_op_and_uses_graph_helpers():
    source = (ROOT / "decomposer" / "verification.py").read_text()
    assert "GridSample" not in source
    assert "from decomposer.engine import" not in source
