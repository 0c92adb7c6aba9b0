"""``--target ENGINE[,ENGINE]``: a profile's opset cap and the gaps it lowers, per node;
``--target portable`` lowering what most engines compute wrongly. Oracles: ONNX Runtime on
the original model, and the engines themselves where the gap was measured."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import decomposer
from decomposer import engine_support, engines, targets
from decomposer.cli import main
from decomposer.errors import InvalidModelError, UnsupportedNodeError
from decomposer.testing import run_onnxruntime


def _resizes(dims, opset: int = 18) -> onnx.ModelProto:
    """An antialiased linear downscale, then a nearest one (which no engine gets wrong)."""
    scales = numpy_helper.from_array(np.array([1, 1, 0.5, 0.5], np.float32), "scales")
    nodes = [helper.make_node("Resize", ["x", "", "scales"], ["y"], name="smooth",
                              mode="linear", antialias=1),
             helper.make_node("Resize", ["y", "", "scales"], ["z"], name="nearest")]
    out_dims = [d // 4 if isinstance(d, int) and i > 1 else d if i < 2 else None
                for i, d in enumerate(dims)]
    graph = helper.make_graph(nodes, "resizes",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, out_dims)],
                              [scales])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _feeds():
    return {"x": np.random.default_rng(0).standard_normal((1, 2, 16, 16)).astype(np.float32)}


def test_resolve_modes_engines_and_combinations():
    assert targets.resolve("portable") == targets.Target("portable", "portable")
    both = targets.resolve("rknn,openvino")
    assert (both.mode, both.engines, both.max_opset) == ("portable", ("rknn", "openvino"), 19)
    assert targets.resolve("qdq,openvino").mode == "qdq"
    assert targets.resolve("tensorrt8.6").max_opset == 17
    for bad, why in [("ort,openvino", "mixes"), ("portable,qdq", "mixes"),
                     ("coreml", "unknown target coreml"), ("", "unknown target")]:
        with pytest.raises(InvalidModelError, match=why):
            targets.resolve(bad)
    assert set(targets.engine_targets()) <= set(engine_support.known_engines())


def test_every_profile_names_a_known_engine_and_a_valid_cap():
    for name, profile in engine_support._data()["profiles"].items():
        assert name in engine_support.known_engines()
        if "max_opset" in profile:
            assert 11 <= profile["max_opset"] <= onnx.defs.onnx_opset_version()
            assert profile["evidence"]


def test_portable_lowers_the_antialiased_resize_only():
    model = _resizes([1, 2, 16, 16])
    out, report = decomposer.decompose_with_report(model)
    onnx.checker.check_model(out, full_check=True)
    assert report.lowered_nodes == ["Resize:y"] and not report.warnings
    assert [n.op_type for n in out.graph.node].count("Resize") == 1  # the nearest one
    (want,) = run_onnxruntime(model, _feeds())
    for engine in ("ort", "openvino", "tvm"):
        (got,) = engines.run_model(engine, out, _feeds(), static_shapes=True)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    again, second = decomposer.decompose_with_report(out)
    assert not second.changed and again.SerializeToString() == out.SerializeToString()


def test_portable_keeps_a_dynamic_antialiased_resize_with_a_warning(tmp_path, capsys):
    model = _resizes([1, 2, "H", "W"])
    out, report = decomposer.decompose_with_report(model)
    assert out.graph.node[0].op_type == "Resize" and not report.replaced
    assert len(report.warnings) == 1 and "not static" in report.warnings[0]
    source, target = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(model, source)
    assert main([str(source), str(target)]) == 0
    assert "warning: kept node 'smooth'" in capsys.readouterr().err


def test_an_engine_target_refuses_what_it_cannot_lower(tmp_path, capsys):
    # OpenVINO computes antialias as plain linear: a Resize its pattern cannot write is an
    # unsupported node there, with the reason, and nothing is written
    source, target = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_resizes([1, 2, "H", "W"]), source)
    assert main([str(source), str(target), "--target", "openvino"]) == 3
    assert "not static" in capsys.readouterr().err and not target.exists()
    with pytest.raises(UnsupportedNodeError):
        decomposer.decompose(_resizes([1, 2, "H", "W"]), target="openvino")


def test_target_with_an_opset_cap_takes_the_model_down():
    model = _resizes([1, 2, 16, 16], opset=20)
    out, report = decomposer.decompose_with_report(model, target="rknn")
    assert report.opset == 19 and report.source_opset == 20 and report.target == "rknn"
    onnx.checker.check_model(out, full_check=True)
    (want,) = run_onnxruntime(model, _feeds())
    (got,) = run_onnxruntime(out, _feeds())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the lower of an explicit --target-opset and the cap wins
    assert decomposer.decompose_with_report(model, target="rknn", target_opset=17)[1].opset == 17


def test_unknown_target_is_one_usage_line(capsys, tmp_path):
    source = tmp_path / "in.onnx"
    onnx.save(_resizes([1, 2, 16, 16]), source)
    assert main([str(source), str(tmp_path / "out.onnx"), "--target", "openvino,ort"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "mixes" in err[-1] and not (tmp_path / "out.onnx").exists()


def test_report_json_names_lowered_nodes_and_warnings(tmp_path):
    import json

    source, target, report = tmp_path / "in.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(_resizes([1, 2, 16, 16]), source)
    assert main([str(source), str(target), "--target", "tvm", "--report", str(report)]) == 0
    data = json.loads(report.read_text())
    assert data["target"] == "tvm" and data["lowered_nodes"] == ["Resize:y"]
    assert data["warnings"] == []


def test_rknn_takes_group_normalization_21_below_its_deprecated_18():
    # GroupNormalization-18 is deprecated (the checker refuses it at opsets 18-20), so
    # RKNN's cap of 19 writes ONNX's function body, not the old op
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.uniform(0.5, 1.5, 8).astype(np.float32), "scale"),
             numpy_helper.from_array(rng.uniform(-0.5, 0.5, 8).astype(np.float32), "bias")]
    graph = helper.make_graph(
        [helper.make_node("GroupNormalization", ["x", "scale", "bias"], ["y"], num_groups=4)],
        "group_norm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    out, report = decomposer.decompose_with_report(model, target="rknn")
    onnx.checker.check_model(out, full_check=True)
    assert report.opset == 19 and "GroupNormalization" not in {n.op_type for n in out.graph.node}
    x = {"x": rng.standard_normal((1, 8, 4, 4)).astype(np.float32)}
    np.testing.assert_allclose(run_onnxruntime(out, x)[0], run_onnxruntime(model, x)[0],
                               rtol=1e-5, atol=1e-5)


def test_check_names_the_opset_cap_and_the_target_that_fixes_it(tmp_path, capsys):
    source = tmp_path / "m.onnx"
    onnx.save(_resizes([1, 2, 16, 16], opset=21), source)
    assert main(["check", str(source), "--engines", "rknn,ncnn"]) == 0
    out = capsys.readouterr().out
    assert "rknn: opset 21 x0: --target rknn" in out
    # check judges the decomposed model: the portable target already lowered the
    # antialiased Resize ncnn computes wrongly
    assert "ncnn:" not in out
    gaps = engine_support.engine_gaps(_resizes([1, 2, 16, 16], opset=21), ["rknn"])["rknn"]
    assert gaps[0]["take_down"] == 19
