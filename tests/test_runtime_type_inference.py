"""Types through producers ONNX's inference does not know: a contrib pattern whose input
comes from a contrib node no pattern rewrites is decomposed with the type ONNX Runtime's
symbolic shape inference gives it (the engine asks only after a refusal for a missing
type); a user's own op's guessed type is not taken."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

import decomposer
import decomposer.context
from decomposer.testing import run_onnxruntime


def _chain(first: onnx.NodeProto, domains: list[str], rank: int = 2) -> onnx.ModelProto:
    graph = helper.make_graph(
        [first, helper.make_node("QuickGelu", ["y"], ["z"], domain="com.microsoft",
                                 alpha=1.702, name="gelu")], "chain",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", 4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [None] * rank)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)] + [
        helper.make_opsetid(domain, 1) for domain in domains])


def test_a_contrib_producer_no_pattern_knows_gets_runtime_types():
    """UnfoldTensor: no pattern, and the runtime tool has a handler for it."""
    model = _chain(helper.make_node("UnfoldTensor", ["a"], ["y"], domain="com.microsoft",
                                    name="unfold", dim=1, size=2, step=1), ["com.microsoft"],
                   rank=3)
    out, report = decomposer.decompose_with_report(model, allow_unsupported=True)
    assert report.counts == {"QuickGelu": 1}
    assert [issue.op_type for issue in report.unsupported] == ["UnfoldTensor"]
    rng = np.random.default_rng(0)
    feeds = {"a": rng.standard_normal((3, 4)).astype(np.float32),
             "b": rng.standard_normal((2, 4)).astype(np.float32)}
    (got,) = run_onnxruntime(out, feeds)
    (want,) = run_onnxruntime(model, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_guess_for_a_contrib_op_the_tool_has_no_handler_for_is_not_taken():
    """CDist: ONNX Runtime registers it, its shape tool has no handler and would copy the
    first input's type and rank (for QEmbedLayerNormalization that is int32 for a float
    output: measured), so its output stays unknown."""
    model = _chain(helper.make_node("CDist", ["a", "b"], ["y"], domain="com.microsoft",
                                    name="dist"), ["com.microsoft"])
    _, report = decomposer.decompose_with_report(model, allow_unsupported=True)
    assert report.counts == {}
    gelu = next(issue for issue in report.unsupported if issue.op_type == "QuickGelu")
    assert "element type of input 'y' is unknown" in gelu.reason


def test_a_guess_for_an_op_no_runtime_knows_is_not_taken():
    model = _chain(helper.make_node("Foo", ["a", "b"], ["y"], domain="mylab", name="foo"),
                   ["com.microsoft", "mylab"])
    _, report = decomposer.decompose_with_report(model, allow_unsupported=True)
    assert report.counts == {}
    gelu = next(issue for issue in report.unsupported if issue.op_type == "QuickGelu")
    assert "element type of input 'y' is unknown" in gelu.reason


def test_the_runtime_tool_is_not_asked_when_types_are_known(monkeypatch):
    def refuse(light):
        raise AssertionError("ONNX Runtime's inference was asked for")

    monkeypatch.setattr(decomposer.context, "_runtime_inferred", refuse)
    graph = helper.make_graph(
        [helper.make_node("QuickGelu", ["x"], ["y"], domain="com.microsoft")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    _, report = decomposer.decompose_with_report(model)
    assert report.counts == {"QuickGelu": 1}

