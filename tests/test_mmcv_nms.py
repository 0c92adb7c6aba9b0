"""mmcv's NonMaxSuppression custom op, decomposed: against a torch implementation of mmcv's
``nms_cpu`` written here (sort by score, greedy loop, ``+ offset`` areas and overlaps,
strict IoU), offsets 0 and 1, dynamic box count."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.mmcv_nms import MMCVNonMaxSuppression

from _helpers import make_model, run_onnxruntime


def torch_mmcv_nms(boxes, scores, iou_threshold, offset):
    b = torch.from_numpy(boxes)
    order = torch.sort(torch.from_numpy(scores), descending=True, stable=True).indices
    area = (b[:, 2] - b[:, 0] + offset) * (b[:, 3] - b[:, 1] + offset)
    suppressed = torch.zeros(len(b), dtype=torch.bool)
    kept = []
    for i in order.tolist():
        if suppressed[i]:
            continue
        kept.append(i)
        w = (torch.minimum(b[i, 2], b[:, 2]) - torch.maximum(b[i, 0], b[:, 0]) + offset)
        h = (torch.minimum(b[i, 3], b[:, 3]) - torch.maximum(b[i, 1], b[:, 1]) + offset)
        inter = w.clamp(min=0) * h.clamp(min=0)
        suppressed |= inter / (area[i] + area - inter) > iou_threshold
    return np.array(kept, np.int64)


def _model(attrs, opset=11, domain="mmcv"):
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["keep"], name="nms",
                            domain=domain, **attrs)
    return make_model([node], [helper.make_tensor_value_info("boxes", TensorProto.FLOAT,
                                                             ["N", 4]),
                               helper.make_tensor_value_info("scores", TensorProto.FLOAT,
                                                             ["N"])],
                      [helper.make_tensor_value_info("keep", TensorProto.INT64, ["K"])],
                      opset, extra_opsets=[domain])


@pytest.mark.parametrize("opset", [11, onnx.defs.onnx_opset_version()])
@pytest.mark.parametrize("offset", [0, 1])
def test_matches_mmcv_nms(offset, opset):
    rng = np.random.default_rng(offset)
    out = decomposer.decompose(_model({"iou_threshold": 0.4, "offset": offset}, opset))
    onnx.checker.check_model(out, full_check=True)
    assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
    for count in (40, 7, 0):
        centre = rng.integers(0, 4, (count, 2)) * 12 + rng.normal(0, 2, (count, 2))
        size = rng.uniform(3, 15, (count, 2))
        boxes = np.concatenate([centre, centre + size], 1).astype(np.float32)
        scores = rng.uniform(0, 1, count).astype(np.float32)
        (got,) = run_onnxruntime(out, {"boxes": boxes, "scores": scores})
        want = torch_mmcv_nms(boxes, scores, 0.4, offset)
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, MMCVNonMaxSuppression().compute(
            {"iou_threshold": 0.4, "offset": offset}, boxes=boxes, scores=scores)[0])
        if count == 40:
            assert 3 < len(got) < 40


def test_the_standard_op_is_left_alone():
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores"], ["keep"], name="std")
    model = make_model([node], [
        helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, "N", 4]),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, "N"])],
        [helper.make_tensor_value_info("keep", TensorProto.INT64, ["K", 3])], 11)
    out = decomposer.decompose(model)
    assert [(n.op_type, n.domain, n.name) for n in out.graph.node] == \
        [("NonMaxSuppression", "", "std")]
