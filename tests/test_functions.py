"""Custom ops defined as ONNX functions: model-local functions, `.onnx` libraries and
onnxscript modules, inlined with no Python pattern (decomposer.functions).

Oracles: numpy formulas written here from each op's definition in words, and ONNX
Runtime running the original model (it inlines model-local functions itself). The
decomposed models run on ONNX Runtime, OpenVINO and TVM.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import decomposer
from decomposer import engine_support, engines
from decomposer.errors import EngineRunError

FLOAT, INTS, INT, STRING = (onnx.AttributeProto.FLOAT, onnx.AttributeProto.INTS,
                            onnx.AttributeProto.INT, onnx.AttributeProto.STRING)


def _ref(name: str, ref: str, kind: int) -> onnx.AttributeProto:
    attribute = onnx.AttributeProto(name=name, ref_attr_name=ref, type=kind)
    return attribute


def _node(op: str, inputs: list[str], outputs: list[str], refs: tuple = (), **attrs):
    node = helper.make_node(op, inputs, outputs, **attrs)
    node.attribute.extend(_ref(*ref) for ref in refs)
    return node


def scaled_mish() -> onnx.FunctionProto:
    """Y = alpha * X * tanh(softplus(X)); float attribute alpha, default 1.0 (read through
    an attribute-referencing Constant, the form TVM cannot import)."""
    function = helper.make_function("mylab", "ScaledMish", ["X"], ["Y"], [
        _node("Constant", [], ["a"], refs=[("value_float", "alpha", FLOAT)]),
        helper.make_node("Softplus", ["X"], ["sp"]),
        helper.make_node("Tanh", ["sp"], ["t"]),
        helper.make_node("Mul", ["X", "t"], ["m"]),
        helper.make_node("CastLike", ["a", "X"], ["ac"]),
        helper.make_node("Mul", ["m", "ac"], ["Y"])], [helper.make_opsetid("", 18)])
    function.attribute_proto.append(helper.make_attribute("alpha", 1.0))
    return function


def crop_shuffle() -> onnx.FunctionProto:
    """Crop ``border`` pixels (ints, per spatial axis) from each side, then DepthToSpace with
    ``block`` (int, default 2) and ``mode`` (string, default "DCR")."""
    function = helper.make_function("mylab", "CropShuffle", ["X"], ["Y"], [
        _node("Constant", [], ["b"], refs=[("value_ints", "border", INTS)]),
        helper.make_node("Constant", [], ["axes"], value_ints=[2, 3]),
        helper.make_node("Neg", ["b"], ["end"]),
        helper.make_node("Slice", ["X", "b", "end", "axes"], ["cropped"]),
        _node("DepthToSpace", ["cropped"], ["Y"],
              refs=[("blocksize", "block", INT), ("mode", "mode", STRING)])],
        [helper.make_opsetid("", 18)])
    function.attribute_proto.extend([helper.make_attribute("border", [1, 1]),
                                     helper.make_attribute("block", 2),
                                     helper.make_attribute("mode", "DCR")])
    return function


def row_col_norm() -> list[onnx.FunctionProto]:
    """Rows scaled by their largest magnitude, then columns by their L1 norm; the column
    step is a function of its own (a nested call)."""
    outer = helper.make_function("mylab", "RowColNorm", ["X"], ["Y"], [
        helper.make_node("Abs", ["X"], ["A"]),
        helper.make_node("Constant", [], ["axes"], value_ints=[-1]),
        helper.make_node("ReduceMax", ["A", "axes"], ["mx"], keepdims=1),
        helper.make_node("Constant", [], ["eps"], value_float=1e-6),
        helper.make_node("CastLike", ["eps", "X"], ["e"]),
        helper.make_node("Add", ["mx", "e"], ["d"]),
        helper.make_node("Div", ["X", "d"], ["R"]),
        helper.make_node("ColNorm", ["R"], ["Y"], domain="mylab")],
        [helper.make_opsetid("", 18), helper.make_opsetid("mylab", 1)])
    inner = helper.make_function("mylab", "ColNorm", ["X"], ["Y"], [
        helper.make_node("Constant", [], ["axes"], value_ints=[-2]),
        helper.make_node("ReduceL1", ["X", "axes"], ["s"], keepdims=1),
        helper.make_node("Div", ["X", "s"], ["Y"])], [helper.make_opsetid("", 18)])
    return [outer, inner]


def library() -> list[onnx.FunctionProto]:
    return [scaled_mish(), crop_shuffle(), *row_col_norm()]


def _mish(v: np.ndarray, alpha: float) -> np.ndarray:
    return alpha * v * np.tanh(np.log1p(np.exp(v)))


def _depth_to_space(v: np.ndarray, block: int, mode: str) -> np.ndarray:
    n, c, h, w = v.shape
    if mode == "DCR":
        v = v.reshape(n, block, block, c // block ** 2, h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        v = v.reshape(n, c // block ** 2, block, block, h, w).transpose(0, 1, 4, 2, 5, 3)
    return v.reshape(n, c // block ** 2, h * block, w * block)


def expected(x: np.ndarray, flag: bool | None = None) -> np.ndarray:
    v = _mish(_mish(x, 0.5), 1.0)
    v = _depth_to_space(v[:, :, 2:-2, 1:-1], 2, "CRD")
    v = v / (np.abs(v).max(-1, keepdims=True) + 1e-6)
    v = v / np.abs(v).sum(-2, keepdims=True)
    return _mish(v, 2.0) if flag else v


def calls(in_if: bool) -> tuple[list[onnx.NodeProto], list[onnx.ValueInfoProto], str]:
    nodes = [helper.make_node("ScaledMish", ["x"], ["m1"], domain="mylab", name="mish_a",
                              alpha=0.5),
             helper.make_node("ScaledMish", ["m1"], ["m2"], domain="mylab", name="mish_b"),
             helper.make_node("CropShuffle", ["m2"], ["c"], domain="mylab", name="crop",
                              border=[2, 1], mode="CRD"),
             helper.make_node("RowColNorm", ["c"], ["y"], domain="mylab", name="norm")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8, 10, 8])]
    out_shape = ["N", 2, 12, 12]
    if not in_if:
        return nodes, inputs, "y"
    then = helper.make_graph(
        [helper.make_node("ScaledMish", ["y"], ["t"], domain="mylab", name="mish_in_if",
                          alpha=2.0)], "then", [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, out_shape)])
    other = helper.make_graph([helper.make_node("Identity", ["y"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, out_shape)])
    nodes.append(helper.make_node("If", ["flag"], ["z"], name="branch", then_branch=then,
                                  else_branch=other))
    inputs.append(helper.make_tensor_value_info("flag", TensorProto.BOOL, []))
    return nodes, inputs, "z"


def local_model(opset: int = 18, in_if: bool = True) -> onnx.ModelProto:
    nodes, inputs, out = calls(in_if)
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(
        out, TensorProto.FLOAT, ["N", 2, 12, 12])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid("mylab", 1)],
                              functions=library())
    model.ir_version = 8
    return model


def caller_model(opset: int, in_if: bool = False) -> onnx.ModelProto:
    """The same calls with no definitions in the model (a library supplies them)."""
    model = local_model(opset, in_if)
    del model.functions[:]
    return model


X = np.random.default_rng(0).standard_normal((2, 8, 10, 8)).astype(np.float32)


def _feeds(flag: bool | None = True) -> dict[str, np.ndarray]:
    return {"x": X} if flag is None else {"x": X, "flag": np.array(flag)}


# -- model-local functions ------------------------------------------------------------------


def test_model_local_functions_are_inlined_and_run_on_every_engine():
    model = local_model()
    onnx.checker.check_model(model, full_check=True)
    out, report = decomposer.decompose_with_report(model)
    onnx.checker.check_model(out, full_check=True)
    assert report.inlined_functions == ["mylab::ColNorm", "mylab::CropShuffle",
                                        "mylab::RowColNorm", "mylab::ScaledMish"]
    assert not out.functions
    assert [entry.domain for entry in out.opset_import] == [""]
    nodes = list(decomposer.graphs.all_nodes(out.graph))
    assert all(node.domain == "" for node in nodes)
    # every Constant in the tensor form (TVM reads no other), names unique, named for calls
    assert all(a.name == "value" for n in nodes if n.op_type == "Constant" for a in n.attribute)
    outputs = [o for n in nodes for o in n.output]
    assert len(outputs) == len(set(outputs))
    assert any(n.name.startswith("mish_in_if/") for n in nodes)
    for flag in (True, False):
        want = expected(X, flag)
        original = engines.run_model("ort", model, _feeds(flag))[0]
        np.testing.assert_allclose(original, want, rtol=1e-5, atol=1e-6)
        for engine in ("ort", "openvino", "tvm"):
            got = engines.run_model(engine, out, _feeds(flag))[0]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=engine)
    again, second = decomposer.decompose_with_report(out)
    assert not second.replaced and again.SerializeToString() == out.SerializeToString()


def test_the_original_fails_where_the_data_file_says():
    """The local_functions row of engine_support.json, measured again: a kept call fails
    on the engines it lists as refusing, and check --engines names it for them."""
    model = local_model(in_if=False)
    row = engine_support._data()["local_functions"]
    assert row["runs"] == ["ort"]
    for engine in row["refused"]:
        with pytest.raises(EngineRunError):
            engines.run_model(engine, model, _feeds(None))
    kept = decomposer.decompose(model, target="ort")
    assert kept.SerializeToString() == model.SerializeToString()
    gaps = engine_support.engine_gaps(kept, ["ort", "openvino", "tvm"])
    assert gaps["ort"] == []
    for engine in ("openvino", "tvm"):
        named = {gap["op"] for gap in gaps[engine]}
        assert "mylab::ScaledMish (model-local function)" in named


def test_check_names_kept_calls_per_engine(tmp_path):
    path = tmp_path / "local.onnx"
    onnx.save(local_model(in_if=False), path)
    run = subprocess.run([sys.executable, "-m", "decomposer", "check", str(path), "--engines",
                          "ort,openvino,tvm", "--target", "ort"], capture_output=True, text=True)
    assert "openvino: mylab::ScaledMish (model-local function) x2" in run.stdout, run.stdout
    assert "tvm: mylab::CropShuffle (model-local function) x1" in run.stdout
    assert "\n  ort:" not in run.stdout
    portable = subprocess.run([sys.executable, "-m", "decomposer", "check", str(path),
                               "--engines", "ort,openvino,tvm"], capture_output=True, text=True)
    assert portable.returncode == 0 and ": ok" in portable.stdout, portable.stdout


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_target_opset_takes_the_definitions_down_too(opset):
    # the definitions use opset 18's forms (ReduceMax/ReduceL1 read axes from an input)
    out, report = decomposer.decompose_with_report(local_model(), target_opset=opset)
    onnx.checker.check_model(out, full_check=True)
    assert report.opset == opset and not out.functions
    nodes = list(decomposer.graphs.all_nodes(out.graph))
    assert all(a.name == "value" for n in nodes if n.op_type == "Constant" for a in n.attribute)
    for flag in (True, False):
        got = engines.run_model("ort", out, _feeds(flag))[0]
        np.testing.assert_allclose(got, expected(X, flag), rtol=1e-5, atol=1e-5)


def test_a_registered_pattern_for_the_exact_op_wins_over_the_definition():
    class Doubling(decomposer.Pattern):
        op_type = "ScaledMish"
        domains = frozenset({"mylab"})
        attributes = {"alpha": decomposer.Attr("float", 1.0)}

        def build(self, b, node, facts):
            b.Add(node.inputs[0], node.inputs[0], out=node.outputs[0])

    registry = decomposer.registry.build_registry(entry_points=False)
    registry.register(Doubling())
    out, report = decomposer.decompose_with_report(local_model(in_if=False),
                                                   registry=registry)
    assert report.counts["ScaledMish"] == 2
    assert "function mylab::RowColNorm" in report.counts


def test_undeclared_attribute_is_refused_with_the_reason():
    model = local_model(in_if=False)
    model.graph.node[0].attribute.append(helper.make_attribute("beta", 1.0))
    with pytest.raises(decomposer.UnsupportedNodeError, match="beta are not declared"):
        decomposer.decompose(model, check=False)


def test_attribute_of_the_wrong_type_is_refused():
    model = local_model(in_if=False)
    del model.graph.node[0].attribute[:]
    model.graph.node[0].attribute.append(helper.make_attribute("alpha", 2))
    with pytest.raises(decomposer.UnsupportedNodeError, match="given as INT"):
        decomposer.decompose(model, check=False)


def test_recursive_definitions_are_refused():
    model = local_model(in_if=False)
    inner = next(f for f in model.functions if f.name == "ColNorm")
    inner.node.append(helper.make_node("RowColNorm", ["Y"], ["again"], domain="mylab"))
    with pytest.raises(decomposer.InvalidModelError, match="calls itself"):
        decomposer.decompose(model, check=False)


def test_absent_optional_input_and_passed_through_output():
    function = helper.make_function("mylab", "ClipOrKeep", ["X", "LO", "HI"], ["Y", "Same"], [
        helper.make_node("Clip", ["X", "LO", "HI"], ["Y"])], [helper.make_opsetid("", 18)])
    function.output[:] = ["Y", "X"]  # the second output is the input itself
    graph = helper.make_graph(
        [helper.make_node("ClipOrKeep", ["x", "", "hi"], ["y", "same"], domain="mylab",
                          name="k")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
              helper.make_tensor_value_info("hi", TensorProto.FLOAT, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
         helper.make_tensor_value_info("same", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                    helper.make_opsetid("mylab", 1)],
                              functions=[function])
    out = decomposer.decompose(model)
    clip = next(node for node in out.graph.node if node.op_type == "Clip")
    assert list(clip.input) == ["x", "", "hi"]
    x = np.array([1.0, -20.0, 3.0], np.float32)
    y, same = engines.run_model("ort", out, {"x": x, "hi": np.array(2.0, np.float32)})
    np.testing.assert_array_equal(y, np.minimum(x, 2.0))  # no lower bound
    np.testing.assert_array_equal(same, x)


def test_verify_checks_each_inlined_call_against_the_definition(tmp_path):
    source, target = tmp_path / "local.onnx", tmp_path / "out.onnx"
    onnx.save(local_model(), source)
    report = decomposer.decompose_file(source, target, verify=True,
                                       verify_options={"engines": ["ort", "openvino"]})
    assert report.verification.passed
    checked = {check.tensor for check in report.verification.checks if check.kind == "node"}
    assert {"m1", "m2", "c", "y"} <= checked
    # the reference is the definition run by onnx.reference, not the inlined nodes: an
    # alpha changed in the output is caught at that call
    original, out = onnx.load(source), onnx.load(target)
    constant = next(node for node in out.graph.node if node.name.startswith("mish_a/")
                    and node.op_type == "Constant")
    constant.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(np.array(0.5001,
                                                                            np.float32)))
    planted = decomposer.verify(original, out, engines=["ort"])
    assert not planted.passed
    assert {check.node for check in planted.failures} == {"mish_a"}


# -- function libraries: .onnx files and onnxscript modules ---------------------------------


ONNXSCRIPT_MODULE = '''
from onnxscript import opset18 as op
from onnxscript import script
from onnxscript.values import Opset

mylab = Opset("mylab", 1)


@script(mylab, default_opset=op)
def ScaledMish(X, alpha: float = 1.0):
    return op.Mul(op.Mul(X, op.Tanh(op.Softplus(X))), op.CastLike(alpha, X))


@script(mylab, default_opset=op)
def CropShuffle(X, border: list[int] = (1, 1), block: int = 2, mode: str = "DCR"):
    axes = op.Constant(value_ints=[2, 3])
    b = op.Constant(value_ints=border)
    cropped = op.Slice(X, b, op.Neg(b), axes)
    return op.DepthToSpace(cropped, blocksize=block, mode=mode)


@script(mylab, default_opset=op)
def ColNorm(X):
    return op.Div(X, op.ReduceL1(X, op.Constant(value_ints=[-2]), keepdims=1))


@script(mylab, default_opset=op)
def RowColNorm(X):
    mx = op.ReduceMax(op.Abs(X), op.Constant(value_ints=[-1]), keepdims=1)
    return ColNorm(op.Div(X, op.Add(mx, op.CastLike(1e-6, X))))
'''


def _library_file(tmp_path) -> str:
    path = tmp_path / "mylab_ops.onnx"
    holder = helper.make_model(helper.make_graph([], "library", [], []),
                               opset_imports=[helper.make_opsetid("", 18),
                                              helper.make_opsetid("mylab", 1)],
                               functions=library())
    onnx.save(holder, path)
    return str(path)


def _module_file(tmp_path) -> str:
    path = tmp_path / "mylab_ops.py"
    path.write_text(textwrap.dedent(ONNXSCRIPT_MODULE))
    return str(path)


@pytest.mark.parametrize("kind", ["onnx", "onnxscript"])
@pytest.mark.parametrize("opset", [13, 18])
def test_cli_patterns_from_a_function_library(tmp_path, kind, opset):
    source, target = tmp_path / "model.onnx", tmp_path / "out.onnx"
    onnx.save(caller_model(opset, in_if=True), source)
    library_path = _library_file(tmp_path) if kind == "onnx" else _module_file(tmp_path)
    report_path = tmp_path / "report.json"
    # At 13 the body's ReduceL1 (axes an attribute) is one OpenVINO computes over every
    # axis (engine_support.json); --lower ReduceL1 is the fix `check --engines` names.
    lower = ["--lower", "ReduceL1"] if opset < 18 else []
    run = subprocess.run([sys.executable, "-m", "decomposer", str(source), str(target),
                          "--patterns", library_path, "--verify", "--report",
                          str(report_path), *lower], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "verified" in run.stdout
    counts = json.loads(report_path.read_text())["counts"]
    assert counts["function mylab::ScaledMish"] == 3
    out = onnx.load(target)
    onnx.checker.check_model(out, full_check=True)
    assert [entry.domain for entry in out.opset_import] == [""]
    for flag in (True, False):
        for engine in ("ort", "openvino", "tvm") if flag else ("ort",):
            got = engines.run_model(engine, out, _feeds(flag))[0]
            np.testing.assert_allclose(got, expected(X, flag), rtol=1e-5, atol=1e-5,
                                       err_msg=engine)


def test_library_through_the_api_and_a_functions_list(tmp_path):
    module = tmp_path / "listed.py"
    onnx.save(helper.make_model(helper.make_graph([], "l", [], []), functions=library()),
              tmp_path / "lib.onnx")
    module.write_text(textwrap.dedent(f"""
        import onnx
        FUNCTIONS = list(onnx.load({str(tmp_path / 'lib.onnx')!r}).functions)
    """))
    registry = decomposer.registry.build_registry(entry_points=False)
    decomposer.plugins.load_pattern_source(str(module), registry)
    sources = {entry.source for entry in registry if entry.pattern.name.startswith("function")}
    assert sources == {f"file {module}"}
    out = decomposer.decompose(caller_model(18), registry=registry)
    got = engines.run_model("tvm", out, _feeds(None))[0]
    np.testing.assert_allclose(got, expected(X), rtol=1e-5, atol=1e-5)


def test_two_definitions_of_one_op_clash(tmp_path):
    registry = decomposer.registry.build_registry(entry_points=False)
    decomposer.plugins.load_pattern_source(_library_file(tmp_path), registry)
    other = tmp_path / "other"
    other.mkdir()
    changed = library()
    changed[0].node[-1].op_type = "Add"
    onnx.save(helper.make_model(helper.make_graph([], "l", [], []), functions=changed),
              other / "lib.onnx")
    with pytest.raises(decomposer.PatternError, match="clashes"):
        decomposer.plugins.load_pattern_source(str(other / "lib.onnx"), registry)


def test_a_library_without_custom_functions_is_one_clear_line(tmp_path):
    path = tmp_path / "empty.onnx"
    onnx.save(helper.make_model(helper.make_graph([], "l", [], [])), path)
    source = tmp_path / "m.onnx"
    onnx.save(caller_model(18), source)
    run = subprocess.run([sys.executable, "-m", "decomposer", str(source),
                          str(tmp_path / "o.onnx"), "--patterns", str(path)],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "defines no function" in run.stderr
    assert not (tmp_path / "o.onnx").exists()


def _one_call_model(op: str, opset: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], domain="mylab", name="call")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset),
                                                    helper.make_opsetid("mylab", 1)])
    model.ir_version = 8
    return model


def _registry_of(*functions: onnx.FunctionProto):
    registry = decomposer.registry.build_registry(entry_points=False)
    for pattern in decomposer.functions.function_patterns(functions, "test"):
        registry.register(pattern)
    return registry


def test_a_body_at_an_older_opset_goes_up_with_the_version_converter():
    # ReduceMax takes its axes as an attribute at 13 and as an input from 18
    peak = helper.make_function("mylab", "RowPeak", ["X"], ["Y"], [
        helper.make_node("ReduceMax", ["X"], ["Y"], axes=[-1], keepdims=1)],
        [helper.make_opsetid("", 13)])
    out = decomposer.decompose(_one_call_model("RowPeak", 18), registry=_registry_of(peak))
    onnx.checker.check_model(out, full_check=True)
    reduce = next(node for node in out.graph.node if node.op_type == "ReduceMax")
    assert len(reduce.input) == 2 and not reduce.attribute[1:]  # axes now an input
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    got = engines.run_model("ort", out, {"x": x})[0]
    np.testing.assert_array_equal(got, x.max(-1, keepdims=True))


def test_a_body_the_model_opset_cannot_say_is_refused_with_the_reason():
    # StringSplit is ONNX's from opset 20 only, and no pattern lowers it
    words = helper.make_function("mylab", "Words", ["X"], ["Y"], [
        helper.make_node("StringSplit", ["X"], ["Y", "counts"])],
        [helper.make_opsetid("", 20)])
    graph = helper.make_graph(
        [helper.make_node("Words", ["x"], ["y"], domain="mylab", name="call")], "g",
        [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [2, None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("mylab", 1)])
    model.ir_version = 8
    with pytest.raises(decomposer.UnsupportedNodeError,
                       match="written at opset 20 and cannot go down to the model's 17"):
        decomposer.decompose(model, registry=_registry_of(words))
