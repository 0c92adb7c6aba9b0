"""--verify: correct decompositions pass, broken ones fail and are named, inputs work."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import decomposer
from decomposer.cli import main
from decomposer.pattern import MatchedNode
from decomposer.patterns.affine_grid import AffineGrid
from decomposer.testing import Case, single_node_model

from seed_models import export_seed_stn

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests" / "data" / "stn_custom.onnx"


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
        super().build(b, MatchedNode(proto, node.form, node.attrs), facts)
        b.op("Gather", proto.output[0], b.ints([1, 0], "yx"), axis=-1, out=node.outputs[0])


def broken_registry(pattern) -> decomposer.Registry:
    registry = decomposer.default_registry().copy()
    registry.register(pattern, source="test", override=True)
    return registry


def test_seed_stn_verifies_with_generated_inputs():
    original = onnx.load(EXAMPLE)
    report = decomposer.verify(original, decomposer.decompose(original), runs=3,
                    input_values={"size": [1, 64, 6, 11]})
    assert report.passed, report.table()
    kinds = {(c.kind, c.node) for c in report.checks}
    assert kinds == {("output", None), ("node", "/affine/AffineGrid")}
    assert report.runs == 3
    # The output's size is the given `size` in every run (the image size varies).
    assert {c.shape for c in report.checks if c.kind == "output"} == {(1, 64, 6, 11)}
    assert max(c.max_abs_error for c in report.checks) < 1e-5


@pytest.mark.parametrize("pattern", [OffByOneAlignCorners(), SwappedXY()],
                         ids=["off_by_one_align_corners", "swapped_xy"])
def test_broken_decomposition_fails_and_names_node_and_pattern(pattern):
    original = onnx.load(EXAMPLE)
    wrong = decomposer.decompose(original, registry=broken_registry(pattern))
    report = decomposer.verify(original, wrong, input_values={"size": [1, 64, 5, 7]})
    assert not report.passed
    failing_nodes = {c.node for c in report.failures if c.kind == "node"}
    assert failing_nodes == {"/affine/AffineGrid"}
    assert "wrong node(s): '/affine/AffineGrid' (AffineGrid)" in report.summary()
    with pytest.raises(decomposer.VerificationError):
        decomposer.require_passed(report)


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
    code = main([str(EXAMPLE), str(out), "--patterns", str(plugin), "--override", "--verify",
                 "--input-value", "size=1,64,4,6", "--report", str(report)])
    assert code == 1
    err = capsys.readouterr().err
    assert "VERIFICATION FAILED" in err and "'/affine/AffineGrid' (AffineGrid)" in err
    assert "does NOT match the original; do not ship it" in err
    assert out.exists()
    data = json.loads(report.read_text())
    assert data["verification"]["passed"] is False


def test_cli_verify_success_and_report(tmp_path, capsys):
    out, report = tmp_path / "out.onnx", tmp_path / "r.json"
    assert main([str(EXAMPLE), str(out), "--verify", "--input-value", "size=1,64,3,8",
                 "--runs", "2", "--report", str(report)]) == 0
    assert "verified: 4 tensor(s) over 2 run(s) match" in capsys.readouterr().out
    checks = json.loads(report.read_text())["verification"]["checks"]
    assert {c["kind"] for c in checks} == {"output", "node"}
    assert all(c["passed"] and c["atol"] == 1e-5 for c in checks)


def test_integer_input_without_value_is_an_error_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out.onnx"
    assert main([str(EXAMPLE), str(out), "--verify"]) == 2
    assert "give its value with --input-value size=" in capsys.readouterr().err
    assert not out.exists()


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
    assert "expected 'output' [1, 64, 10, 12]" in table
    assert main([*args, "--expected", str(tmp_path / "wrong.npz")]) == 1
    assert "FAIL run 0 expected 'output'" in capsys.readouterr().err


def test_input_shape_fixes_symbolic_dims(tmp_path):
    original = onnx.load(EXAMPLE)
    report = decomposer.verify(original, decomposer.decompose(original),
                    input_shapes={"image": [1, 3, 9, 10]}, input_values={"size": [1, 64, 2, 3]})
    assert report.passed


@pytest.mark.parametrize("op, attrs, inputs", [
    ("AffineGrid", {"align_corners": 1},
     [np.random.default_rng(0).normal(size=(2, 3, 4)).astype(np.float32),
      np.array([2, 1, 3, 4, 5], np.int64)]),
    ("Rot90AndScale", {"k": 3, "scale": 2.0, "clockwise": "yes"},
     [np.random.default_rng(1).normal(size=(2, 3, 4, 5)).astype(np.float32)]),
    ("CustomRotScale", {"rotations": 1, "dims": "width,height"},
     [np.random.default_rng(2).normal(size=(1, 2, 3, 7)).astype(np.float64)]),
])
def test_every_pattern_verifies(op, attrs, inputs):
    case = Case(inputs, attrs, symbolic={0: [0]}, output_rank=5 if op == "AffineGrid" else None)
    model = single_node_model(op, "custom.ops", case, 17)
    feeds = {f"input{i}": a for i, a in enumerate(inputs)}
    report = decomposer.verify(model, decomposer.decompose(model), feeds=feeds, atol=1e-6, rtol=0)
    assert report.passed, report.table()


def test_verify_flags_without_verify_warn(tmp_path, capsys):
    shutil.copy(EXAMPLE, tmp_path / "m.onnx")
    assert main([str(tmp_path / "m.onnx"), str(tmp_path / "o.onnx"),
                 "--input-value", "size=1,2,3,4"]) == 0
    assert "--input-value ignored without --verify" in capsys.readouterr().err


def test_custom_node_inside_if_is_verified_end_to_end():
    theta = helper.make_tensor_value_info("theta", TensorProto.FLOAT, ["N", 2, 3])
    size = helper.make_tensor_value_info("size", TensorProto.INT64, [4])
    then = helper.make_graph(
        [helper.make_node("AffineGrid", ["theta", "size"], ["g1"], name="in_if",
                          domain="custom.ops", align_corners=1)],
        "then", [], [helper.make_tensor_value_info("g1", TensorProto.FLOAT, [None] * 4)])
    other = helper.make_graph(
        [helper.make_node("AffineGrid", ["theta", "size"], ["g2"], name="in_else",
                          domain="custom.ops")],
        "else", [], [helper.make_tensor_value_info("g2", TensorProto.FLOAT, [None] * 4)])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["grid"], then_branch=then, else_branch=other)],
        "g", [theta, size, helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("grid", TensorProto.FLOAT, [None] * 4)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16),
                                                    helper.make_opsetid("custom.ops", 1)],
                              ir_version=8)
    wrong = decomposer.decompose(model, registry=broken_registry(OffByOneAlignCorners()))
    for cond in (True, False):
        feeds = {"theta": np.random.default_rng(3).normal(size=(2, 2, 3)).astype(np.float32),
                 "size": np.array([2, 1, 4, 5], np.int64), "cond": np.array(cond)}
        assert decomposer.verify(model, decomposer.decompose(model), feeds=feeds).passed
        assert not decomposer.verify(model, wrong, feeds=feeds).passed
