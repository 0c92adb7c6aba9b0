"""``--overwrite-input-shape`` and ``--freeze-input``: inputs fixed in the written model and
the shape arithmetic and branches they decide folded (onnxslim's constant folding), with
nothing else lost. Oracle: ONNX Runtime on the original model with the same inputs."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import decomposer
from decomposer.cli import main
from decomposer.errors import InvalidModelError
from decomposer.freezing import parse_shape, parse_value
from decomposer.testing import run_onnxruntime


def _grid_head() -> onnx.ModelProto:
    """A YOLO-style grid from the run-time size: Shape -> Gather -> Range, then a Reshape
    to a computed shape; the model carries metadata, doc strings and a default input."""
    f32 = TensorProto.FLOAT
    inits = [numpy_helper.from_array(np.array(3, np.int64), "axis_w"),
             numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
             numpy_helper.from_array(np.array(2.0, np.float32), "gain")]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "axis_w"], ["width"], name="width"),
        helper.make_node("Range", ["zero", "width", "one"], ["columns"], name="columns",
                         doc_string="the grid's x"),
        helper.make_node("Cast", ["columns"], ["columns_f"], to=f32, name="columns_f"),
        helper.make_node("Add", ["x", "columns_f"], ["shifted"], name="shift"),
        helper.make_node("Mul", ["shifted", "gain"], ["scaled"], name="scale"),
        helper.make_node("Reshape", ["scaled", "minus_one"], ["y"], name="flatten"),
    ]
    graph = helper.make_graph(
        nodes, "grid_head", [helper.make_tensor_value_info("x", f32, ["N", 3, "H", "W"]),
                             helper.make_tensor_value_info("gain", f32, [])],
        [helper.make_tensor_value_info("y", f32, [None])], inits, doc_string="a head")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              doc_string="the zoo's grid head")
    helper.set_model_props(model, {"author": "decomposer tests"})
    return model


def _switch() -> onnx.ModelProto:
    """An If on a scalar sample-rate input (as a voice-activity detector ships)."""
    f32 = TensorProto.FLOAT
    out = [helper.make_tensor_value_info("branch_out", f32, [1, 4])]
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["branch_out"], name="relu")],
                             "sr16k", [], out)
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["branch_out"], name="neg")],
                              "sr8k", [], out)
    nodes = [helper.make_node("Equal", ["sr", "k16000"], ["is16k"], name="is16k"),
             helper.make_node("If", ["is16k"], ["y"], name="pick", then_branch=then,
                              else_branch=other)]
    graph = helper.make_graph(
        nodes, "switch", [helper.make_tensor_value_info("x", f32, [1, 4]),
                          helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", f32, [1, 4])],
        [numpy_helper.from_array(np.array(16000, np.int64), "k16000")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])


def test_fixed_shape_folds_the_grid_and_keeps_the_rest():
    model = _grid_head()
    out, report = decomposer.decompose_with_report(model, input_shapes={"x": [1, 3, 4, 5]})
    onnx.checker.check_model(out, full_check=True)
    ops = [n.op_type for n in out.graph.node]
    assert "Shape" not in ops and "Range" not in ops, ops
    assert report.fixed_inputs == ["x"] and report.folded and report.changed
    dims = [d.dim_value for d in out.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 4, 5]
    # what the folder does not touch survives: order, names, doc strings, metadata, the
    # input with a default (an initializer of the same name)
    assert [n.name for n in out.graph.node] == ["shift", "scale", "flatten"]
    assert out.doc_string == model.doc_string and out.graph.doc_string == "a head"
    assert {p.key: p.value for p in out.metadata_props} == {"author": "decomposer tests"}
    assert [i.name for i in out.graph.input] == ["x", "gain"]
    x = np.random.default_rng(0).standard_normal((1, 3, 4, 5)).astype(np.float32)
    for gain in (None, np.array(3.0, np.float32)):
        feeds = {"x": x} if gain is None else {"x": x, "gain": gain}
        np.testing.assert_array_equal(run_onnxruntime(out, feeds)[0],
                                      run_onnxruntime(model, feeds)[0])
    again, second = decomposer.decompose_with_report(out, input_shapes={"x": [1, 3, 4, 5]})
    assert again.SerializeToString() == out.SerializeToString()


def test_frozen_condition_folds_the_if():
    model = _switch()
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)
    for rate, op in ((16000, "Relu"), (8000, "Neg")):
        out = decomposer.decompose(model, freeze_inputs={"sr": rate})
        assert [n.op_type for n in out.graph.node] == [op]
        assert [i.name for i in out.graph.input] == ["x"]
        want = run_onnxruntime(model, {"x": x, "sr": np.array(rate, np.int64)})[0]
        np.testing.assert_array_equal(run_onnxruntime(out, {"x": x})[0], want)


@pytest.mark.parametrize("argv, message", [
    (["--overwrite-input-shape", "x:1x3x4"], "3 dims for an input of rank 4"),
    (["--overwrite-input-shape", "nope:1"], "no graph input 'nope'"),
    (["--overwrite-input-shape", "x"], "expected NAME:DIMS"),
    (["--freeze-input", "gain=1"], "no graph input 'gain'"),  # it has an initializer
    (["--freeze-input", "x=1,2"], "unknown dims"),
    (["--freeze-input", "x=a"], "VALUE must be numbers"),
])
def test_bad_fixes_are_one_line_and_write_nothing(tmp_path, capsys, argv, message):
    source, target = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_grid_head(), source)
    assert main([str(source), str(target), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and not target.exists()


def test_cli_spellings(tmp_path):
    source, target = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_switch(), source)
    assert main([str(source), str(target), "--freeze-input", "sr=8000"]) == 0
    assert [n.op_type for n in onnx.load(target).graph.node] == ["Neg"]
    assert parse_shape("images:1x3x640x640") == ("images", [1, 3, 640, 640])
    assert parse_shape("ids:1,seq") == ("ids", [1, "seq"])
    assert parse_value("sr=16000") == ("sr", [16000.0])
    with pytest.raises(InvalidModelError):
        parse_value("sr")


def test_with_many_models_the_flags_are_refused(tmp_path, capsys):
    source = tmp_path / "in.onnx"
    onnx.save(_switch(), source)
    assert main([str(source), "-o", str(tmp_path / "out"), "--freeze-input", "sr=1"]) == 2
    assert "works on one model" in capsys.readouterr().err


def test_check_names_the_input_to_freeze_for_an_engine_without_if(tmp_path, capsys):
    source = tmp_path / "switch.onnx"
    onnx.save(_switch(), source)
    assert main(["check", str(source), "--engines", "rknn,ncnn"]) == 0
    out = capsys.readouterr().out
    assert "rknn: If x1: --freeze-input sr=VALUE" in out
    assert "ncnn: If x1: --freeze-input sr=VALUE" in out


def _batch_switch() -> onnx.ModelProto:
    """An If on the input's batch size (silero-vad's shipped half model picks a Squeeze
    this way): only the input's shape decides it, not its values."""
    f32 = TensorProto.FLOAT
    out = [helper.make_tensor_value_info("branch_out", f32, ["N", 4])]
    then = helper.make_graph([helper.make_node("Relu", ["x"], ["branch_out"], name="relu")],
                             "one", [], out)
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["branch_out"], name="neg")],
                              "many", [], out)
    nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
             helper.make_node("Gather", ["shape", "zero"], ["batch"], name="batch"),
             helper.make_node("Equal", ["batch", "one"], ["single"], name="single"),
             helper.make_node("If", ["single"], ["y"], name="pick", then_branch=then,
                              else_branch=other)]
    graph = helper.make_graph(
        nodes, "batch_switch", [helper.make_tensor_value_info("x", f32, ["N", 4])],
        [helper.make_tensor_value_info("y", f32, ["N", 4])],
        [numpy_helper.from_array(np.array(0, np.int64), "zero"),
         numpy_helper.from_array(np.array(1, np.int64), "one")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)])


def test_check_names_the_shape_to_fix_when_only_a_shape_decides_the_if(tmp_path, capsys):
    source = tmp_path / "batch_switch.onnx"
    onnx.save(_batch_switch(), source)
    assert main(["check", str(source), "--engines", "rknn"]) == 0
    out = capsys.readouterr().out
    assert "rknn: If x1: --overwrite-input-shape x:DIMS" in out
    assert "--freeze-input" not in out
    # and the flag it names folds the branch away, the model staying what it was
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)
    fixed = decomposer.decompose(_batch_switch(), input_shapes={"x": [1, 4]})
    assert [n.op_type for n in fixed.graph.node] == ["Relu"]
    np.testing.assert_array_equal(run_onnxruntime(fixed, {"x": x})[0],
                                  run_onnxruntime(_batch_switch(), {"x": x})[0])
