"""Engine behaviour independent of any one op: subgraphs, functions, names, cleanup,
determinism, idempotence, unsupported nodes. Numbers are checked against torch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns import builtin_patterns, pattern_modules

from _helpers import make_model, run_onnxruntime

ROOT = Path(__file__).resolve().parent.parent


def grid_torch(theta, size, align=0):
    return F.affine_grid(torch.from_numpy(theta), list(map(int, size)),
                         align_corners=bool(align)).numpy()


def vi(name, elem, dims):
    """A typed value; ``dims`` None means rank-4 with unknown dims (a 2-D grid)."""
    return helper.make_tensor_value_info(name, elem, [None] * 4 if dims is None else dims)


THETA = vi("theta", TensorProto.FLOAT, ["N", 2, 3])
SIZE = vi("size", TensorProto.INT64, [4])


def affine_node(name, theta="theta", size="size", out="grid", align=0, domain="custom.ops"):
    return helper.make_node("AffineGrid", [theta, size], [out], name=name, domain=domain,
                            align_corners=align)


def test_if_branches_at_any_depth():
    then_graph = helper.make_graph([affine_node("then_affine", out="g_then")], "then", [],
                                   [vi("g_then", TensorProto.FLOAT, None)])
    # else: a nested If whose branches hold the custom node again (depth 2).
    inner_then = helper.make_graph([affine_node("inner_affine", out="g_inner", align=1)],
                                   "inner_then", [], [vi("g_inner", TensorProto.FLOAT, None)])
    inner_else = helper.make_graph(
        [helper.make_node("Identity", ["g_inner_alt"], ["g_inner2"], name="id"),
         affine_node("inner_affine_else", out="g_inner_alt", align=1)][::-1],
        "inner_else", [], [vi("g_inner2", TensorProto.FLOAT, None)])
    else_graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["g_else"], name="inner_if", then_branch=inner_then,
                          else_branch=inner_else)],
        "else", [], [vi("g_else", TensorProto.FLOAT, None)])
    main = helper.make_node("If", ["cond"], ["grid"], name="outer_if", then_branch=then_graph,
                            else_branch=else_graph)
    model = make_model([main], [THETA, SIZE, vi("cond", TensorProto.BOOL, [])],
                       [vi("grid", TensorProto.FLOAT, None)], 16, extra_opsets=["custom.ops"])
    out, report = decomposer.decompose_with_report(model)
    assert len(report.replaced) == 3
    assert {r.graph.split(" > ")[0] for r in report.replaced} == {"main graph"}
    onnx.checker.check_model(out, full_check=True)
    theta = np.random.default_rng(0).normal(size=(2, 2, 3)).astype(np.float32)
    size = np.array([2, 1, 5, 6], np.int64)
    for cond, align in [(True, 0), (False, 1)]:
        (got,) = run_onnxruntime(out, {"theta": theta, "size": size, "cond": np.array(cond)})
        np.testing.assert_allclose(got, grid_torch(theta, size, align), atol=1e-5)


def test_loop_body_with_carried_theta():
    # Each iteration: grid_i = AffineGrid(theta_i, size); theta_{i+1} = theta_i * 0.5
    body = helper.make_graph(
        [affine_node("loop_affine", theta="theta_in", out="grid_i", align=1),
         helper.make_node("Mul", ["theta_in", "half"], ["theta_out"], name="halve"),
         helper.make_node("Identity", ["cond_in"], ["cond_out"], name="keep_going")],
        "body",
        [vi("iter", TensorProto.INT64, []), vi("cond_in", TensorProto.BOOL, []),
         vi("theta_in", TensorProto.FLOAT, ["N", 2, 3])],
        [vi("cond_out", TensorProto.BOOL, []), vi("theta_out", TensorProto.FLOAT, ["N", 2, 3]),
         vi("grid_i", TensorProto.FLOAT, None)])
    loop = helper.make_node("Loop", ["trips", "", "theta"], ["theta_last", "grids"],
                            name="loop", body=body)
    half = onnx.numpy_helper.from_array(np.array(0.5, np.float32), "half")
    model = make_model([loop], [THETA, SIZE, vi("trips", TensorProto.INT64, [])],
                       [vi("theta_last", TensorProto.FLOAT, ["N", 2, 3]),
                        vi("grids", TensorProto.FLOAT, [None] * 5)],
                       13, extra_opsets=["custom.ops"], initializers=[half])
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    theta = np.random.default_rng(1).normal(size=(2, 2, 3)).astype(np.float32)
    size = np.array([2, 3, 4, 7], np.int64)
    _, grids = run_onnxruntime(out, {"theta": theta, "size": size, "trips": np.array(3)})
    expected = np.stack([grid_torch(theta * 0.5**i, size, 1) for i in range(3)])
    np.testing.assert_allclose(grids, expected, atol=1e-5)


def test_model_local_function_body():
    function = helper.make_function(
        "my.funcs", "MakeGrid", ["t", "s"], ["g"],
        [helper.make_node("AffineGrid", ["t", "s"], ["g"], name="fn_affine",
                          domain="custom.ops", align_corners=0)],
        [helper.make_opsetid("custom.ops", 1)])
    call = helper.make_node("MakeGrid", ["theta", "size"], ["grid"], name="call",
                            domain="my.funcs")
    model = make_model([call], [THETA, SIZE], [vi("grid", TensorProto.FLOAT, None)], 17,
                       extra_opsets=["my.funcs", "custom.ops"], functions=[function])
    theta = np.random.default_rng(2).normal(size=(1, 2, 3)).astype(np.float32)
    size = np.array([1, 1, 3, 5], np.int64)
    # The portable target inlines the call (decomposer.functions): the body's node then
    # sits in the main graph, where the types are known.
    inlined, report = decomposer.decompose_with_report(model)
    assert not inlined.functions and report.inlined_functions == ["my.funcs::MakeGrid"]
    (got,) = run_onnxruntime(inlined, {"theta": theta, "size": size})
    np.testing.assert_allclose(got, grid_torch(theta, size), atol=1e-5)
    # ONNX Runtime keeps the function (it inlines calls itself), so its body is rewritten
    # in place; function bodies carry types only through their own value_info.
    with pytest.raises(decomposer.UnsupportedNodeError, match="element type of theta 't'"):
        decomposer.decompose(model, target="ort")
    model.functions[0].value_info.append(vi("t", TensorProto.FLOAT, ["N", "R", "C"]))
    with pytest.raises(decomposer.UnsupportedNodeError, match="cannot tell 2-D from 3-D"):
        decomposer.decompose(model, target="ort")
    model.functions[0].value_info.append(vi("s", TensorProto.INT64, [4]))
    out, report = decomposer.decompose_with_report(model, target="ort")
    assert report.replaced[0].graph == "function 'my.funcs::MakeGrid'"
    assert [i.domain for i in out.functions[0].opset_import] == [""]
    onnx.checker.check_model(out, full_check=True)
    (got,) = run_onnxruntime(out, {"theta": theta, "size": size})
    np.testing.assert_allclose(got, grid_torch(theta, size), atol=1e-5)


def test_output_is_graph_output_and_feeds_two_consumers():
    nodes = [affine_node("affine"),
             helper.make_node("ReduceMax", ["grid"], ["peak"], name="peak", keepdims=0),
             helper.make_node("Neg", ["grid"], ["neg"], name="neg")]
    model = make_model(nodes, [THETA, SIZE],
                       [vi("grid", TensorProto.FLOAT, None), vi("peak", TensorProto.FLOAT, []),
                        vi("neg", TensorProto.FLOAT, None)], 16, extra_opsets=["custom.ops"])
    out = decomposer.decompose(model)
    assert [o.name for o in out.graph.output] == ["grid", "peak", "neg"]
    assert [n.name for n in out.graph.node][-2:] == ["peak", "neg"]
    theta = np.random.default_rng(3).normal(size=(2, 2, 3)).astype(np.float32)
    size = np.array([2, 1, 4, 4], np.int64)
    grid, peak, neg = run_onnxruntime(out, {"theta": theta, "size": size})
    expected = grid_torch(theta, size)
    np.testing.assert_allclose(grid, expected, atol=1e-5)
    np.testing.assert_allclose(peak, expected.max(), atol=1e-5)
    np.testing.assert_allclose(neg, -expected, atol=1e-5)


def test_new_names_derive_from_node_and_never_collide():
    # The model already uses names the pattern would pick first.
    squat = helper.make_node("Identity", ["theta"], ["affine/x"], name="affine/x")
    squat2 = helper.make_node("Identity", ["size"], ["affine/size_f"], name="affine/size_f")
    model = make_model([squat, squat2, affine_node("affine")], [THETA, SIZE],
                       [vi("grid", TensorProto.FLOAT, None),
                        vi("affine/x", TensorProto.FLOAT, ["N", 2, 3]),
                        vi("affine/size_f", TensorProto.INT64, [4])],
                       16, extra_opsets=["custom.ops"])
    out = decomposer.decompose(model)
    node_names = [n.name for n in out.graph.node]
    assert len(node_names) == len(set(node_names))
    new = [n for n in out.graph.node if n.name not in ("affine/x", "affine/size_f")]
    assert all(n.name.startswith("affine/") for n in new)
    produced = [o for n in out.graph.node for o in n.output]
    assert len(produced) == len(set(produced))
    onnx.checker.check_model(out, full_check=True)


def _seed_model():
    return onnx.load(ROOT / "tests" / "data" / "stn_custom.onnx")


def test_idempotent_deterministic_and_input_untouched():
    model = _seed_model()
    before = model.SerializeToString(deterministic=True)
    once = decomposer.decompose(model)
    assert model.SerializeToString(deterministic=True) == before
    again = decomposer.decompose(model)
    twice = decomposer.decompose(once)
    first = once.SerializeToString(deterministic=True)
    assert again.SerializeToString(deterministic=True) == first
    assert twice.SerializeToString(deterministic=True) == first


def test_same_bytes_whatever_the_hash_seed(tmp_path):
    outputs = []
    for seed in ("0", "12345"):
        target = tmp_path / f"out_{seed}.onnx"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([sys.executable, "-m", "decomposer",
                        str(ROOT / "tests/data/stn_custom.onnx"), str(target), "-q"],
                       check=True, env=env)
        outputs.append(target.read_bytes())
    assert outputs[0] == outputs[1]


def test_unrelated_nodes_fields_and_order_survive():
    model = _seed_model()
    model.doc_string = "model doc"
    model.graph.doc_string = "graph doc"
    helper.set_model_props(model, {"author": "me", "purpose": "test"})
    model.graph.node[0].doc_string = "conv doc"
    out = decomposer.decompose(model)
    assert out.doc_string == "model doc" and out.graph.doc_string == "graph doc"
    assert [(p.key, p.value) for p in out.metadata_props] == [("author", "me"),
                                                             ("purpose", "test")]
    assert out.graph.node[0] == model.graph.node[0]
    assert out.graph.node[-1] == model.graph.node[-1]
    assert list(out.graph.initializer) == list(model.graph.initializer)
    assert list(out.graph.input) == list(model.graph.input)
    assert list(out.graph.output) == list(model.graph.output)
    assert out.producer_name == model.producer_name and out.ir_version == model.ir_version


def test_unsupported_nodes_are_listed_then_kept_on_request():
    mystery = helper.make_node("Frobnicate", ["theta"], ["f"], name="mystery", domain="acme")
    model = make_model([affine_node("affine"), mystery], [THETA, SIZE],
                       [vi("grid", TensorProto.FLOAT, None),
                        vi("f", TensorProto.FLOAT, ["N", 2, 3])],
                       16, extra_opsets=["custom.ops", "acme"])
    with pytest.raises(decomposer.UnsupportedNodeError) as info:
        decomposer.decompose(model)
    assert "node 'mystery' (acme::Frobnicate)" in str(info.value)
    assert isinstance(info.value, decomposer.DecomposerError)
    out, report = decomposer.decompose_with_report(model, allow_unsupported=True)
    assert [n.name for n in report.unsupported] == ["mystery"]
    assert report.counts == {"AffineGrid": 1}
    # custom.ops is no longer used and is dropped; acme still is and stays.
    assert [i.domain for i in out.opset_import] == ["", "acme"]


def test_model_without_default_opset_is_rejected_with_a_fix():
    model = _seed_model()
    del model.opset_import[0]  # keep only custom.ops
    with pytest.raises(decomposer.UnsupportedNodeError, match="imports no default-domain"):
        decomposer.decompose(model)


def test_model_below_opset_11_is_rejected_with_a_fix():
    model = make_model([affine_node("affine")], [THETA, SIZE],
                       [vi("grid", TensorProto.FLOAT, None)], 10, extra_opsets=["custom.ops"])
    with pytest.raises(decomposer.UnsupportedNodeError, match="convert_version"):
        decomposer.decompose(model)


@pytest.mark.parametrize("mutate, message", [
    (lambda m: setattr(m, "ir_version", 0), "no ir_version"),
    (lambda m: m.ClearField("graph"), "no graph"),
])
def test_invalid_models_raise_invalid_model_error(mutate, message):
    model = _seed_model()
    mutate(model)
    with pytest.raises(decomposer.InvalidModelError, match=message):
        decomposer.decompose(model)


def test_every_pattern_module_is_registered():
    registered = {type(entry.pattern).__module__ for entry in decomposer.default_registry()}
    assert set(pattern_modules()) <= registered
    assert len(builtin_patterns()) >= len(pattern_modules())


def test_engine_knows_no_op_by_name():
    # Every core module, against every op the built-in patterns answer for (their op types
    # and torch ATen names), as whole words. The decomposer/torch/ package is the one
    # exception by design: it is the torch-side adapter that routes named torch functions to
    # opaque nodes.
    names = set()
    for entry in decomposer.registry.build_registry(entry_points=False):
        names.add(entry.pattern.op_type)
        for form in entry.pattern.spellings():
            names.update(form.op_types)
            if form.aten:
                names.add(form.aten)
    # A pattern may answer for a custom spelling of a standard op's name (mmcv's
    # NonMaxSuppression); the builder emits standard ops by name, which is not knowing a
    # custom op.
    names = {name for name in names if not onnx.defs.has(name)}
    modules = sorted((ROOT / "decomposer").glob("*.py"))
    assert len(modules) > 10
    for module in modules:
        text = module.read_text()
        for op in sorted(names):
            assert not re.search(rf"\b{re.escape(op)}\b", text), f"{module.name} mentions {op}"


def test_core_package_never_imports_torch():
    code = ("import sys, onnx, decomposer, decomposer.cli, decomposer.testing; "
            f"decomposer.decompose(onnx.load({str(ROOT / 'tests/data/stn_custom.onnx')!r})); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_custom_standard_custom_chain_resolves_in_later_pass():
    # grid -> Neg (standard) -> a rotation: the rotation's input rank is only known once
    # the AffineGrid is rewritten, so the engine infers again and retries.
    nodes = [affine_node("affine"),
             helper.make_node("Neg", ["grid"], ["neg"], name="neg"),
             helper.make_node("Rot90AndScale", ["neg"], ["rot"], name="rot", domain="custom.ops",
                              k=1)]
    model = make_model(nodes, [THETA, SIZE], [vi("rot", TensorProto.FLOAT, None)], 16,
                       extra_opsets=["custom.ops"])
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {"AffineGrid": 1, "Rot90AndScale": 1}
    theta = np.random.default_rng(4).normal(size=(1, 2, 3)).astype(np.float32)
    size = np.array([1, 1, 3, 5], np.int64)
    (got,) = run_onnxruntime(out, {"theta": theta, "size": size})
    expected = torch.rot90(-torch.from_numpy(grid_torch(theta, size)), 1, [-2, -1]).numpy()
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.parametrize("custom_outside", [False, True],
                         ids=["only-nested", "also-in-the-main-graph"])
def test_aten_constant_inside_subgraph_is_cleaned_up(custom_outside):
    """A Constant that fed only a replaced node inside an If branch goes, whether or not the
    main graph (whose node list is then rebuilt) also holds a replaced node."""
    align = helper.make_node("Constant", [], ["align"], name="align_const",
                             value=helper.make_tensor("v", TensorProto.BOOL, [], [True]))
    aten = helper.make_node("affine_grid_generator", ["theta", "size", "align"], ["g_then"],
                            name="aten_affine", domain="org.pytorch.aten")
    then_graph = helper.make_graph([align, aten], "then", [], [vi("g_then", TensorProto.FLOAT,
                                                                  None)])
    else_graph = helper.make_graph([helper.make_node("Neg", ["g0"], ["g_else"], name="n")],
                                   "else", [], [vi("g_else", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("If", ["cond"], ["grid"], name="if", then_branch=then_graph,
                              else_branch=else_graph)]
    outputs = [vi("grid", TensorProto.FLOAT, None)]
    if custom_outside:
        nodes.append(helper.make_node("Rot90AndScale", ["grid"], ["rot"], name="rot",
                                      domain="custom.ops", k=2))
        outputs.append(vi("rot", TensorProto.FLOAT, None))
    model = make_model(
        nodes, [THETA, SIZE, vi("cond", TensorProto.BOOL, []), vi("g0", TensorProto.FLOAT, None)],
        outputs, 16, extra_opsets=["org.pytorch.aten", "custom.ops"])
    out, report = decomposer.decompose_with_report(model)
    assert report.removed_constants == 1
    (branch,) = [a.g for a in out.graph.node[0].attribute if a.name == "then_branch"]
    then_nodes = [n.name for n in branch.node]
    assert "align_const" not in then_nodes and "aten_affine" not in then_nodes
    theta = np.random.default_rng(5).normal(size=(2, 2, 3)).astype(np.float32)
    size = np.array([2, 1, 4, 6], np.int64)
    got = run_onnxruntime(out, {"theta": theta, "size": size, "cond": np.array(True),
                                "g0": np.zeros((1, 1, 1, 1), np.float32)})
    np.testing.assert_allclose(got[0], grid_torch(theta, size, 1), atol=1e-5)
    if custom_outside:
        np.testing.assert_allclose(got[1], np.rot90(got[0], 2, axes=(-2, -1)))


def _count_passes(monkeypatch) -> list[str]:
    """The labels of the graphs the engine rewrites from now on, a label per pass."""
    import decomposer.engine as engine

    passes: list[str] = []
    rewrite_graph = engine._Rewriter.rewrite_graph

    def counting(self, scope, *args):
        passes.append(scope.label)
        return rewrite_graph(self, scope, *args)

    monkeypatch.setattr(engine._Rewriter, "rewrite_graph", counting)
    return passes


def test_a_constant_defined_after_an_earlier_replaced_node_is_still_a_constant(monkeypatch):
    """The engine rebuilds a graph's node list in place; a pattern asking for a constant
    still sees every Constant node of the graph, wherever it stands, in the first pass."""
    passes = _count_passes(monkeypatch)

    def align(name, value):
        return helper.make_node("Constant", [], [name], name=f"{name}_const",
                                value=helper.make_tensor("v", TensorProto.BOOL, [], [value]))

    nodes = [align("a0", True),
             helper.make_node("affine_grid_generator", ["theta", "size", "a0"], ["g0"],
                              name="first", domain="org.pytorch.aten"),
             align("a1", False),
             helper.make_node("affine_grid_generator", ["theta", "size", "a1"], ["g1"],
                              name="second", domain="org.pytorch.aten")]
    model = make_model(nodes, [THETA, SIZE], [vi("g0", TensorProto.FLOAT, None),
                                              vi("g1", TensorProto.FLOAT, None)],
                       16, extra_opsets=["org.pytorch.aten"])
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {"AffineGrid": 2} and report.removed_constants == 2
    assert passes == ["main graph"]
    theta = np.random.default_rng(6).normal(size=(2, 2, 3)).astype(np.float32)
    size = np.array([2, 1, 4, 6], np.int64)
    got = run_onnxruntime(out, {"theta": theta, "size": size})
    np.testing.assert_allclose(got[0], grid_torch(theta, size, 1), atol=1e-5)
    np.testing.assert_allclose(got[1], grid_torch(theta, size, 0), atol=1e-5)


def test_types_after_an_earlier_replaced_node_are_known_in_the_first_pass(monkeypatch):
    """Inference sees the whole graph, not the part of it rebuilt so far: a rotation whose
    input comes from a standard node placed after another rotation is rewritten in the
    first pass."""
    passes = _count_passes(monkeypatch)
    spec = ["B", 3, 4, 4]
    nodes = [helper.make_node("Rot90AndScale", ["x"], ["t0"], name="first",
                              domain="custom.ops", k=1),
             helper.make_node("Neg", ["y"], ["n"], name="neg"),
             helper.make_node("Rot90AndScale", ["n"], ["t1"], name="second",
                              domain="custom.ops", k=1)]
    model = make_model(nodes, [vi("x", TensorProto.FLOAT, spec), vi("y", TensorProto.FLOAT, spec)],
                       [vi("t0", TensorProto.FLOAT, spec), vi("t1", TensorProto.FLOAT, spec)],
                       16, extra_opsets=["custom.ops"])
    out, report = decomposer.decompose_with_report(model)
    assert report.counts == {"Rot90AndScale": 2} and passes == ["main graph"]
    x, y = np.random.default_rng(7).normal(size=(2, 2, *spec[1:])).astype(np.float32)
    got = run_onnxruntime(out, {"x": x, "y": y})
    np.testing.assert_allclose(got[1], np.rot90(-y, 1, axes=(-2, -1)))


def test_an_explicit_empty_registry_is_used_not_the_default():
    with pytest.raises(decomposer.UnsupportedNodeError, match="no pattern rewrites this op"):
        decomposer.decompose(_seed_model(), registry=decomposer.Registry())


def test_run_pauses_the_collector_and_restores_it_across_threads(monkeypatch):
    """run() turns the cyclic garbage collector off for its duration; however calls from
    several threads overlap, it is back on after the last one, and left off if it was off."""
    import gc
    import threading

    import decomposer.engine as engine

    inner = engine._run
    seen = []

    def recording(*args, **kwargs):
        seen.append(gc.isenabled())
        return inner(*args, **kwargs)

    monkeypatch.setattr(engine, "_run", recording)
    model = _seed_model()
    assert gc.isenabled()

    def work():
        for _ in range(5):
            decomposer.decompose(model)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [False] * 20 and gc.isenabled()
    gc.disable()
    try:
        decomposer.decompose(model)
        assert not gc.isenabled()
    finally:
        gc.enable()
