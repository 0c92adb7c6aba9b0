"""Resize as MatMuls (``--lower Resize``, and the hand-over of ``--target-opset``) against
ONNX's reference evaluator and ONNX Runtime's own Resize kernel, over modes, coordinate
rules, filters, scales and sizes, dynamic batch."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import decomposer

CASES = [
    ({"mode": "nearest"}, [1.0, 1.0, 2.0, 1.5], None),
    ({"mode": "nearest", "nearest_mode": "floor",
      "coordinate_transformation_mode": "asymmetric"}, [1.0, 1.0, 0.5, 0.75], None),
    ({"mode": "linear"}, [1.0, 1.0, 1.75, 0.5], None),
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners", "axes": [2, 3]},
     None, [5, 17]),
    ({"mode": "linear", "antialias": 1}, [1.0, 1.0, 0.5, 0.375], None),
    ({"mode": "cubic", "antialias": 1, "cubic_coeff_a": -0.5}, [1.0, 1.0, 0.6, 0.4], None),
    ({"mode": "cubic", "exclude_outside": 1}, [1.0, 1.0, 1.5, 2.0], None),
    ({"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"},
     [1.0, 1.0, 0.75, 1.25], None),
    ({"mode": "linear", "antialias": 1, "axes": [3, 2]}, [0.5, 0.5], None),
]


def _model(attrs, scales, sizes, opset=19):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 12])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b", "c", "d"])
    inputs, initializers = ["x", ""], []
    if scales is not None:
        inputs.append("scales")
        initializers.append(helper.make_tensor("scales", TensorProto.FLOAT, [len(scales)],
                                               scales))
    else:
        inputs += ["", "sizes"]
        initializers.append(helper.make_tensor("sizes", TensorProto.INT64, [len(sizes)],
                                               sizes))
    node = helper.make_node("Resize", inputs, ["y"], name="resize", **attrs)
    graph = helper.make_graph([node], "g", [x], [y], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("attrs, scales, sizes", CASES, ids=[str(c[0]) for c in CASES])
def test_lower_resize_matches_the_reference_and_the_kernel(attrs, scales, sizes):
    model = _model(attrs, scales, sizes)
    out, report = decomposer.decompose_with_report(model, lower=["Resize"])
    onnx.checker.check_model(out, full_check=True)
    assert report.counts == {"Resize": 1}
    assert "Resize" not in {n.op_type for n in out.graph.node}
    session = ort.InferenceSession(out.SerializeToString())
    kernel = ort.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(len(str(attrs)))
    for batch in (2, 1):  # the batch stays dynamic
        x = rng.standard_normal((batch, 3, 8, 12)).astype(np.float32)
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
        got = session.run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got, kernel.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_refusals_name_the_reason():
    model = _model({"mode": "linear", "coordinate_transformation_mode": "tf_crop_and_resize"},
                   [1.0, 1.0, 2.0, 2.0], None)
    with pytest.raises(decomposer.UnsupportedNodeError, match="tf_crop_and_resize"):
        decomposer.decompose(model, lower=["Resize"])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, [4])
    graph = helper.make_graph([helper.make_node("Resize", ["x", "", "s"], ["y"],
                                                name="resize", mode="linear")],
                              "g", [x, s], [helper.make_tensor_value_info(
                                  "y", TensorProto.FLOAT, ["a", "b", "c", "d"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    with pytest.raises(decomposer.UnsupportedNodeError, match="computed at run time"):
        decomposer.decompose(model, lower=["Resize"])


def portability_cases():
    """--lower Resize: antialiased bilinear at opset 18 as MatMuls; ONNX's reference is the
    oracle (torch's antialias is another filter)."""
    model = _model({"mode": "linear", "antialias": 1}, [1.0, 1.0, 0.5, 0.375], None, 18)
    rng = np.random.default_rng(16)
    arrays = [rng.standard_normal((rows, 3, 8, 12)).astype(np.float32) for rows in (2, 1)]
    reference = ReferenceEvaluator(model)
    return [{"id": "Resize antialias, lowered", "model": model, "lower": ["Resize"],
             "feeds": [{"x": a} for a in arrays],
             "expected": [[reference.run(None, {"x": a})[0]] for a in arrays], "atol": 1e-5}]
