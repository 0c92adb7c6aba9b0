"""Regressions of engine, CLI and target behaviour found in review (each failed before its
fix): constants of a rejected replacement, function name spaces, pattern crashes, output
paths checked before writing, messages that fit the library or the CLI, --target."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import decomposer
from decomposer.cli import main
from decomposer.registry import Registry

from _helpers import make_model, run_onnxruntime


class AddsConstantThenRejects(decomposer.Pattern):
    """Emits a constant, then rejects the node while building (first node only)."""

    op_type = "Plus7"

    def check(self, node, ctx):
        return ctx.elem_type(node.inputs[0])

    def build(self, b, node, elem_type):
        # The first-generation spelling (b.op), so this test runs against older engines too.
        seven = b.const(7.0, np.float32, hint="seven")
        if node.name == "first":
            raise decomposer.Reject("the first node is refused on purpose")
        b.op("Add", node.inputs[0], seven, out=node.outputs[0])


def _plus7_model():
    nodes = [helper.make_node("Plus7", ["x"], ["y1"], name="first", domain="t"),
             helper.make_node("Plus7", ["x"], ["y2"], name="second", domain="t")]
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in ("x", "y1", "y2")]
    return make_model(nodes, info[:1], info[1:], 17, extra_opsets=["t"])


@pytest.mark.parametrize("check", [True, False])
def test_rejected_build_does_not_leave_shared_constants(check):
    registry = Registry()
    registry.register(AddsConstantThenRejects())
    out, report = decomposer.decompose_with_report(_plus7_model(), registry=registry,
                                                   allow_unsupported=True, check=check)
    assert [i.name for i in report.unsupported] == ["first"]
    produced = {o for n in out.graph.node for o in n.output} | {"x"}
    standard = [n for n in out.graph.node if n.domain == ""]
    assert all(i in produced for n in standard for i in n.input), \
        "a replacement reads a constant that nothing produces"
    # The second node was rewritten with its own constant: y2 = x + 7.
    kept = [n for n in out.graph.node if n.domain == "t"]
    assert [n.name for n in kept] == ["first"]


def test_function_types_do_not_leak_from_the_main_graph():
    # Main graph: `t` is an int64 tensor. Function body: its own `t` is float (value_info);
    # a pattern asking for the function's `t` must see float, not the main graph's int64.
    seen = {}

    class Probe(decomposer.Pattern):
        op_type = "Probe"

        def check(self, node, ctx):
            seen[node.name] = ctx.elem_type(node.inputs[0])
            return None

        def build(self, b, node, facts):
            b.op("Identity", node.inputs[0], out=node.outputs[0])

    body = [helper.make_node("Identity", ["a"], ["t"], name="copy"),
            helper.make_node("Probe", ["t"], ["b"], name="probe_in_function", domain="t")]
    function = helper.make_function("local", "F", ["a"], ["b"], body,
                                    [helper.make_opsetid("", 17), helper.make_opsetid("t", 1)])
    function.value_info.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, [2]))
    nodes = [helper.make_node("Shape", ["x"], ["t"], name="main_t"),
             helper.make_node("F", ["x"], ["y"], name="call", domain="local")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
                        helper.make_tensor_value_info("t", TensorProto.INT64, [1])], 17,
                       extra_opsets=["t", "local"], functions=[function])
    registry = Registry()
    registry.register(Probe())
    # (--target ort keeps the function, so the body is rewritten in place; the portable
    # target inlines the call first, and the probe then sits in the main graph)
    decomposer.decompose(model, registry=registry, target="ort")
    assert seen == {"probe_in_function": TensorProto.FLOAT}


class Crashes(decomposer.Pattern):
    op_type = "Plus7"

    def build(self, b, node, facts):
        raise ZeroDivisionError("bug in the pattern")


def test_a_crashing_pattern_is_exit_4(tmp_path, capsys):
    src = tmp_path / "m.onnx"
    onnx.save(_plus7_model(), src)
    plugin = tmp_path / "crash.py"
    plugin.write_text("import decomposer\n\n@decomposer.register\n"
                      "class Crashes(decomposer.Pattern):\n"
                      "    op_type = 'Plus7'\n\n    def build(self, b, node, facts):\n"
                      "        raise ZeroDivisionError('bug in the pattern')\n")
    assert main([str(src), str(tmp_path / "o.onnx"), "--patterns", str(plugin)]) == 4
    err = capsys.readouterr().err
    assert "ZeroDivisionError: bug in the pattern" in err and "Traceback" not in err
    assert not (tmp_path / "o.onnx").exists()
    with pytest.raises(decomposer.PatternError) as info:
        registry = Registry()
        registry.register(Crashes())
        decomposer.decompose(_plus7_model(), registry=registry)
    assert info.value.exit_code == 4


def test_unwritable_report_path_writes_nothing(tmp_path, capsys):
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    src.write_bytes((__import__("pathlib").Path(__file__).parent / "data" /
                     "stn_custom.onnx").read_bytes())
    code = main([str(src), str(dst), "--report", str(tmp_path / "missing" / "r.json")])
    assert code == 5
    err = capsys.readouterr().err
    assert "--report" in err and len(err.strip().splitlines()) == 1
    assert not dst.exists(), "the model was written although the report could not be"


def test_allow_unsupported_warning_does_not_tell_to_pass_allow_unsupported(tmp_path, capsys):
    node = helper.make_node("Mystery", ["x"], ["y"], name="mystery", domain="acme")
    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in "xy"]
    src = tmp_path / "m.onnx"
    onnx.save(make_model([node], info[:1], info[1:], 17, extra_opsets=["acme"]), src)
    assert main([str(src), str(tmp_path / "o.onnx"), "--allow-unsupported"]) == 0
    err = capsys.readouterr().err
    assert "mystery" in err and "--allow-unsupported" not in err
    assert main([str(src), str(tmp_path / "o2.onnx")]) == 3
    assert "--allow-unsupported" in capsys.readouterr().err
    # The library's message names no command-line flag.
    with pytest.raises(decomposer.UnsupportedNodeError) as info_:
        decomposer.decompose(onnx.load(src))
    assert "--" not in str(info_.value)


def _contrib_model():
    """A contrib op no pattern rewrites (ONNX Runtime has a CPU kernel for it):
    ExpandDims(x, axis)."""
    node = helper.make_node("ExpandDims", ["x", "axis"], ["y"], name="expand",
                            domain="com.microsoft")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 3])
    axis = onnx.numpy_helper.from_array(np.array(0, np.int32), "axis")
    return make_model([node], [x], [y], 17, extra_opsets=["com.microsoft"],
                      initializers=[axis])


def test_target_portable_reports_ort_contrib_ops_and_ort_keeps_them(tmp_path, capsys):
    src = tmp_path / "contrib.onnx"
    onnx.save(_contrib_model(), src)
    report_path = tmp_path / "r.json"
    assert main([str(src), str(tmp_path / "o.onnx"), "--report", str(report_path)]) == 3
    err = capsys.readouterr().err
    assert "an ONNX Runtime contrib op no pattern rewrites" in err and "--target ort" in err
    assert "no other engine was measured with it" in err
    assert json.loads(report_path.read_text())["target"] == "portable"
    dst = tmp_path / "o_ort.onnx"
    assert main([str(src), str(dst), "--target", "ort", "--report", str(report_path)]) == 0
    assert json.loads(report_path.read_text())["target"] == "ort"
    kept = onnx.load(dst)
    assert [n.op_type for n in kept.graph.node] == ["ExpandDims"]
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    (y,) = run_onnxruntime(kept, {"x": x})
    assert y.shape == (1, 2, 3)


def test_unknown_target_is_exit_2_listing_the_accepted_values(tmp_path, capsys):
    assert main(["in.onnx", "out.onnx", "--target", "coreml"]) == 2
    err = capsys.readouterr().err
    assert "portable" in err and "ort" in err and "rknn" in err
    with pytest.raises(decomposer.DecomposerError, match="portable, ort"):
        decomposer.decompose(_contrib_model(), target="gpu")


def _affine_model(theta_type=TensorProto.FLOAT, out_type=TensorProto.FLOAT,
                  size_type=TensorProto.INT64, theta_dims=("N", 2, 3), extra_imports=()):
    node = helper.make_node("AffineGrid", ["theta", "size"], ["grid"], name="ag",
                            domain="custom.ops")
    model = make_model([node], [helper.make_tensor_value_info("theta", theta_type, theta_dims),
                                helper.make_tensor_value_info("size", size_type, [4])],
                       [helper.make_tensor_value_info("grid", out_type, [None] * 4)], 16,
                       extra_opsets=["custom.ops"])
    model.opset_import.extend(extra_imports)
    return model


@pytest.mark.parametrize("model,message", [
    # A declared output type the op cannot produce is the input's fault (exit 2), not ours.
    (_affine_model(theta_type=TensorProto.DOUBLE), "declares a type for 'grid'"),
    (_affine_model(theta_type=0), "graph input 'theta' declares no element type"),
    (_affine_model(size_type=1000), "element type 1000, which ONNX does not define"),
    (_affine_model(theta_dims=(2**40, 2**40, 3)), "more than 2\\*\\*63 elements"),
    (_affine_model(extra_imports=[helper.make_opsetid("ai.onnx", 18)]),
     "names domain 'ai.onnx' twice"),
], ids=["declared-type", "undefined-type", "unknown-type", "overflow", "two-default-opsets"])
def test_inputs_no_step_can_handle_are_refused_as_bad_input(model, message):
    with pytest.raises(decomposer.InvalidModelError, match=message):
        decomposer.decompose(model)


def test_attribute_name_that_is_not_utf8_is_refused(tmp_path):
    model = _affine_model()
    model.graph.node[0].attribute.append(helper.make_attribute("alignXcorners", 1))
    data = model.SerializeToString().replace(b"alignXcorners", b"align\xe9corners")
    src = tmp_path / "m.onnx"
    src.write_bytes(data)
    assert main([str(src), str(tmp_path / "o.onnx")]) == 2
    assert not (tmp_path / "o.onnx").exists()


def test_declared_type_contradicted_inside_an_if_branch_is_bad_input():
    # then: AffineGrid of a double theta, whose branch output the model declares float;
    # else: a float constant. Whatever the checker infers, the branches cannot agree: the
    # declaration is the input's mistake (exit 2), not a decomposer bug (exit 4).
    grid = helper.make_tensor_value_info("g", TensorProto.FLOAT, [None] * 4)
    then_branch = helper.make_graph(
        [helper.make_node("AffineGrid", ["theta", "size"], ["g"], name="ag",
                          domain="custom.ops")], "then", [], [grid])
    fallback = helper.make_tensor("zeros", TensorProto.FLOAT, [1, 1, 1, 2], [0.0, 0.0])
    else_branch = helper.make_graph(
        [helper.make_node("Constant", [], ["z"], name="zeros", value=fallback)], "else", [],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None] * 4)])
    node = helper.make_node("If", ["c"], ["out"], name="if", then_branch=then_branch,
                            else_branch=else_branch)
    model = make_model([node], [
        helper.make_tensor_value_info("theta", TensorProto.DOUBLE, ["N", 2, 3]),
        helper.make_tensor_value_info("size", TensorProto.INT64, [4]),
        helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [None] * 4)], 16,
        extra_opsets=["custom.ops"])
    with pytest.raises(decomposer.InvalidModelError, match="declares a type for 'g'"):
        decomposer.decompose(model)


def _stale_value_info_model(declare_output_wrong=False):
    """A contrib op, then ``y + Cast(c)`` where Constant ``c`` is 1-D but value_info says
    scalar (what the onnxruntime-genai builder 0.18 writes for its ``INT64/[1]`` constant)."""
    nodes = [helper.make_node("FastGelu", ["x"], ["y"], name="gelu", domain="com.microsoft"),
             helper.make_node("Constant", [], ["c"], name="const",
                              value=helper.make_tensor("c", TensorProto.INT64, [1], [1])),
             helper.make_node("Cast", ["c"], ["cf"], name="cast", to=TensorProto.FLOAT),
             helper.make_node("Add", ["y", "cf"], ["z"], name="add")]
    model = make_model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                       [helper.make_tensor_value_info("z", TensorProto.FLOAT,
                                                      [5] if declare_output_wrong else [2, 3])],
                       17, extra_opsets=["com.microsoft"])
    model.graph.value_info.extend([helper.make_tensor_value_info("c", TensorProto.INT64, []),
                                   helper.make_tensor_value_info("cf", TensorProto.FLOAT, [1])])
    return model


def test_stale_value_info_is_dropped_and_reported(tmp_path, capsys):
    model = _stale_value_info_model()
    standard = onnx.ModelProto()
    standard.CopyFrom(model)
    standard.graph.node[0].op_type, standard.graph.node[0].domain = "Relu", ""
    with pytest.raises(onnx.shape_inference.InferenceError, match="existing shape differ"):
        onnx.checker.check_model(standard, full_check=True)  # the input really is invalid
    out, report = decomposer.decompose_with_report(model)
    assert report.dropped_value_info == ["c"]
    assert [v.name for v in out.graph.value_info if v.name in ("c", "cf")] == ["cf"]
    onnx.checker.check_model(out, full_check=True)
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    (got,), (want,) = run_onnxruntime(out, {"x": x}), run_onnxruntime(model, {"x": x})
    np.testing.assert_allclose(got, want, atol=1e-6)
    onnx.save(model, tmp_path / "in.onnx")
    assert main([str(tmp_path / "in.onnx"), str(tmp_path / "out.onnx")]) == 0
    assert "dropped value_info contradicting its producer: c" in capsys.readouterr().out
    # A wrong declaration of a graph output is the model's interface: still refused.
    with pytest.raises(decomposer.InvalidModelError):
        decomposer.decompose(_stale_value_info_model(declare_output_wrong=True))
