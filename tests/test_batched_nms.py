"""TensorRT's BatchedNMS_TRT / BatchedNMSDynamic_TRT and mmdeploy's TRTBatchedNMS, decomposed:
against a torch implementation of the plugins' algorithm written here (per-class sort,
top-k, greedy NMS with an IoU matrix, a merge sorted by score then class), at several sizes
with dynamic batch and box count, and on an SSD-style head exported the way mmdeploy's
``TRTBatchedNMSop.symbolic`` writes the node."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.batched_nms import BatchedNMS, MMDeployBatchedNMS, batched_nms_reference

from _helpers import make_model, run_onnxruntime

TRT = {"shareLocation": 1, "backgroundLabelId": -1, "numClasses": 3, "topK": 12,
       "keepTopK": 8, "scoreThreshold": 0.3, "iouThreshold": 0.45, "isNormalized": 1,
       "clipBoxes": 0}
MMD = {"num_classes": 3, "background_label_id": -1, "iou_threshold": 0.45,
       "score_threshold": 0.3, "topk": 12, "keep_topk": 8, "is_normalized": 0,
       "clip_boxes": 0, "return_index": 1}


def _model(op, attrs, boxes_dims, classes, elem=TensorProto.FLOAT, outputs=None, opset=13):
    keep = attrs.get("keepTopK", attrs.get("keep_topk"))
    keep = keep if keep > 0 else boxes_dims[1]
    inputs = [helper.make_tensor_value_info("boxes", elem, boxes_dims),
              helper.make_tensor_value_info("scores", elem, ["B", "N", classes])]
    if op == "TRTBatchedNMS":
        outs = [("dets", elem, ["B", keep, 5]), ("labels", TensorProto.INT32, ["B", keep]),
                ("index", TensorProto.INT32, ["B", keep])][:outputs or 3]
        domain = "mmdeploy"
    else:
        outs = [("num_detections", TensorProto.INT32, ["B", 1]),
                ("nmsed_boxes", elem, ["B", keep, 4]), ("nmsed_scores", elem, ["B", keep]),
                ("nmsed_classes", elem, ["B", keep])]
        domain = ""
    outputs = [helper.make_tensor_value_info(*o) for o in outs]
    node = helper.make_node(op, ["boxes", "scores"], [o.name for o in outputs], name="nms",
                            domain=domain, **attrs)
    return make_model([node], inputs, outputs, opset,
                      extra_opsets=[domain] if domain else [])


def torch_batched_nms(boxes, scores, topk, keep, threshold, iou_threshold, background,
                      plus_one, clip):
    """The plugins' algorithm in torch: per class stable sort, top-k, greedy NMS (strict IoU),
    then a merge sorted by (score desc, class, rank)."""
    boxes = torch.as_tensor(boxes).float()
    scores = torch.as_tensor(scores).float()
    batch, count, classes = scores.shape
    boxes = boxes.reshape(batch, count, -1, 4).expand(batch, count, classes, 4)
    one = 1.0 if plus_one else 0.0
    result = []
    for image in range(batch):
        found = []
        for c in range(classes):
            if c == background:
                continue
            col = scores[image, :, c]
            order = torch.sort(col, descending=True, stable=True).indices
            order = order[col[order] > threshold][:topk]
            b = boxes[image, order, c]
            lo = torch.minimum(b[:, :2], b[:, 2:])
            hi = torch.maximum(b[:, :2], b[:, 2:]) + one
            wh = torch.minimum(hi[:, None], hi[None]) - torch.maximum(lo[:, None], lo[None])
            inter = wh.clamp(min=0).prod(-1)
            area = (hi - lo).prod(-1)
            iou = inter / (area[:, None] + area[None] - inter)
            kept = []
            for i in range(len(order)):
                if all(not float(iou[k, i]) > iou_threshold for k in kept):
                    kept.append(i)
            found += [(float(col[order[k]]), c, r, int(order[k])) for r, k in enumerate(kept)]
        found.sort(key=lambda f: (-f[0], f[1], f[2]))
        rows = []
        for score, c, _, n in found[:keep]:
            box = boxes[image, n, c]
            rows.append((box.clamp(0, 1) if clip else box, score, c, n))
        result.append(rows)
    return result


def _trt_expected(feeds, attrs):
    rows = torch_batched_nms(feeds["boxes"], feeds["scores"], attrs["topK"], attrs["keepTopK"],
                             attrs["scoreThreshold"], attrs["iouThreshold"],
                             attrs["backgroundLabelId"],
                             not attrs["isNormalized"], attrs.get("clipBoxes", 1))
    batch, keep = len(rows), attrs["keepTopK"]
    num = np.array([[len(r)] for r in rows], np.int32)
    boxes = np.zeros((batch, keep, 4), np.float32)
    scores = np.zeros((batch, keep), np.float32)
    classes = np.full((batch, keep), -1, np.float32)
    for i, image in enumerate(rows):
        for j, (box, score, c, _) in enumerate(image):
            boxes[i, j], scores[i, j], classes[i, j] = box.numpy(), score, c
    return [num, boxes, scores, classes]


def _clustered(rng, batch, count, classes, per_class=False, pixels=False):
    shape = (batch, count, classes if per_class else 1, 2)
    scale = 60.0 if pixels else 1.0
    centre = (rng.integers(0, 3, shape) / 3 + 0.15 + rng.normal(0, 0.03, shape)) * scale
    size = rng.uniform(0.1, 0.3, shape) * scale
    boxes = np.concatenate([centre - size / 2, centre + size / 2], -1).astype(np.float32)
    return boxes, rng.uniform(0, 1, (batch, count, classes)).astype(np.float32)


def _args(pattern, attrs):
    return pattern.forms[0].coerce_attributes(attrs)


@pytest.mark.parametrize("op", ["BatchedNMS_TRT", "BatchedNMSDynamic_TRT"])
@pytest.mark.parametrize("per_class", [False, True])
@pytest.mark.parametrize("variant", ["plain", "background_clip", "pixels_caffe"])
def test_tensorrt_matches_torch(op, per_class, variant):
    rng = np.random.default_rng(len(op) + 2 * per_class + len(variant))
    attrs = {**TRT, "shareLocation": int(not per_class)}
    if variant == "background_clip":
        attrs.update(backgroundLabelId=0, clipBoxes=1)
    if variant == "pixels_caffe":
        attrs.update(isNormalized=0, caffeSemantics=1)
    classes = 3
    model = _model(op, attrs, ["B", "N", classes if per_class else 1, 4], classes)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    for batch, count in [(2, 30), (1, 5)]:
        boxes, scores = _clustered(rng, batch, count, classes, per_class,
                                   pixels=variant == "pixels_caffe")
        if variant == "background_clip":
            boxes = boxes * 1.4 - 0.2  # some corners outside [0, 1]
        feeds = {"boxes": boxes, "scores": scores}
        got = run_onnxruntime(out, feeds)
        want = _trt_expected(feeds, attrs)
        ref = batched_nms_reference(boxes, scores, _args(BatchedNMS(), attrs), False)
        for g, w, r in zip(got, want, ref, strict=True):
            assert g.dtype == r.dtype
            np.testing.assert_array_equal(g, w)
            np.testing.assert_array_equal(g, r)
        if count == 30:  # detections, and suppressions among them
            assert batch < got[0].sum() < (scores > 0.3).sum()


@pytest.mark.parametrize("outputs", [2, 3])
@pytest.mark.parametrize("topk, keep", [(12, 8), (-1, 8), (-1, -1), (40, 6)])
def test_mmdeploy_matches_torch(outputs, topk, keep):
    rng = np.random.default_rng(outputs + topk + keep)
    attrs = {**MMD, "topk": topk, "keep_topk": keep, "return_index": int(outputs == 3)}
    count = 20
    dims = ["B", count if keep < 0 else "N", 1, 4]
    model = _model("TRTBatchedNMS", attrs, dims, 3, outputs=outputs)
    if keep < 0:
        model.graph.input[1].type.tensor_type.shape.dim[1].dim_value = count
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    sizes = [(2, count), (1, count)] if keep < 0 else [(2, count), (3, 11)]
    for batch, n in sizes:
        boxes, scores = _clustered(rng, batch, n, 3, pixels=True)
        got = run_onnxruntime(out, {"boxes": boxes, "scores": scores})
        rows = torch_batched_nms(boxes, scores, n if topk <= 0 else topk,
                                 n if keep < 0 else keep, 0.3, 0.45, -1, False, False)
        k = n if keep < 0 else keep
        dets = np.zeros((batch, k, 5), np.float32)
        labels = np.full((batch, k), -1, np.int32)
        index = np.full((batch, k), -1, np.int32)
        for i, image in enumerate(rows):
            for j, (box, score, c, m) in enumerate(image):
                dets[i, j, :4], dets[i, j, 4], labels[i, j], index[i, j] = box, score, c, m
        for g, w in zip(got, [dets, labels, index][:outputs], strict=True):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)


def test_ties_go_to_the_lower_class_then_the_lower_box():
    boxes = np.array([[[[0, 0, 1, 1]], [[2, 2, 3, 3]], [[4, 4, 5, 5]]]], np.float32)
    scores = np.full((1, 3, 2), 0.5, np.float32)
    attrs = {**TRT, "numClasses": 2, "keepTopK": 4, "topK": 4}
    out = decomposer.decompose(_model("BatchedNMS_TRT", attrs, ["B", "N", 1, 4], 2))
    num, got_boxes, _, classes = run_onnxruntime(out, {"boxes": boxes, "scores": scores})
    assert num.tolist() == [[4]]
    assert classes.tolist() == [[0, 0, 0, 1]]
    np.testing.assert_array_equal(got_boxes[0, :3], boxes[0, :, 0])


def test_zero_boxes_and_nothing_above_the_threshold():
    out = decomposer.decompose(_model("BatchedNMS_TRT", TRT, ["B", "N", 1, 4], 3))
    for boxes, scores in [(np.zeros((2, 0, 1, 4), np.float32), np.zeros((2, 0, 3), np.float32)),
                          (np.ones((1, 4, 1, 4), np.float32), np.full((1, 4, 3), 0.3,
                                                                      np.float32))]:
        num, got_boxes, got_scores, classes = run_onnxruntime(out, {"boxes": boxes,
                                                                    "scores": scores})
        assert (num == 0).all() and (got_boxes == 0).all() and (got_scores == 0).all()
        assert (classes == -1).all()


def test_float16():
    rng = np.random.default_rng(3)
    boxes, scores = _clustered(rng, 2, 16, 3)
    out = decomposer.decompose(_model("BatchedNMS_TRT", TRT, ["B", "N", 1, 4], 3,
                                      elem=TensorProto.FLOAT16))
    feeds = {"boxes": boxes.astype(np.float16), "scores": scores.astype(np.float16)}
    got = run_onnxruntime(out, feeds)
    ref = batched_nms_reference(feeds["boxes"], feeds["scores"], _args(BatchedNMS(), TRT),
                                False)
    for g, r in zip(got, ref, strict=True):
        assert g.dtype == r.dtype
        np.testing.assert_array_equal(g, r)


@pytest.mark.parametrize("change, message", [
    ({"keepTopK": 20}, "writes no detections"),
    ({"topK": 5000, "keepTopK": 5}, "limit of 4096"),
    ({"isNormalized": 0, "caffeSemantics": 0}, "caffeSemantics=0"),
    ({"numClasses": 4}, "class-count attribute"),
    ({"shareLocation": 0}, "shareLocation=0"),
])
def test_rejections(change, message):
    model = _model("BatchedNMS_TRT", {**TRT, **change}, ["B", "N", 1, 4], 3)
    with pytest.raises(decomposer.UnsupportedNodeError, match=message):
        decomposer.decompose(model)


def test_missing_is_normalized_is_refused():
    attrs = {k: v for k, v in TRT.items() if k != "isNormalized"}
    with pytest.raises(decomposer.UnsupportedNodeError, match="isNormalized"):
        decomposer.decompose(_model("BatchedNMS_TRT", attrs, ["B", "N", 1, 4], 3))


# -- an SSD-style head exported as mmdeploy's multiclass_nms_static writes it ------------

class _MMDeployNMS(torch.autograd.Function):
    """mmdeploy/mmcv/ops/nms.py TRTBatchedNMSop: a stand-in forward, the node in symbolic."""

    @staticmethod
    def forward(ctx, boxes, scores, num_classes, pre_topk, after_topk, iou_threshold,
                score_threshold, background_label_id):
        batch = boxes.shape[0]
        return (torch.rand(batch, after_topk, 5),
                torch.randint(0, num_classes, (batch, after_topk), dtype=torch.int32))

    @staticmethod
    def symbolic(g, boxes, scores, num_classes, pre_topk, after_topk, iou_threshold,
                 score_threshold, background_label_id):
        return g.op("mmdeploy::TRTBatchedNMS", boxes, scores, num_classes_i=num_classes,
                    background_label_id_i=background_label_id, iou_threshold_f=iou_threshold,
                    score_threshold_f=score_threshold, topk_i=pre_topk,
                    keep_topk_i=after_topk, is_normalized_i=False, clip_boxes_i=False,
                    return_index_i=False, outputs=2)


class _TinySSD(torch.nn.Module):
    def __init__(self, with_nms: bool):
        super().__init__()
        torch.manual_seed(1)
        self.head = torch.nn.Conv2d(3, 4 + 3, 3, 4, 1)
        self.with_nms = with_nms
        ys, xs = torch.meshgrid(torch.arange(8.0), torch.arange(8.0), indexing="ij")
        self.register_buffer("centres", torch.stack([xs, ys], -1).reshape(64, 2) * 4 + 2)

    def forward(self, image):
        raw = self.head(image).flatten(2).transpose(1, 2)  # (B, 64, 7)
        centre = self.centres + torch.tanh(raw[..., :2]) * 4
        size = torch.sigmoid(raw[..., 2:4]) * 16 + 2
        boxes = torch.cat([centre - size / 2, centre + size / 2], -1).unsqueeze(2)
        scores = torch.sigmoid(raw[..., 4:])
        if not self.with_nms:
            return boxes, scores
        return _MMDeployNMS.apply(boxes, scores, 3, 30, 12, 0.4, 0.35, -1)


def _ssd_model():
    buffer = io.BytesIO()
    torch.onnx.export(_TinySSD(True), torch.zeros(1, 3, 32, 32), buffer, dynamo=False,
                      input_names=["image"], output_names=["dets", "labels"], opset_version=13,
                      dynamic_axes={"image": {0: "batch"}, "dets": {0: "batch"},
                                    "labels": {0: "batch"}})
    return onnx.load_from_string(buffer.getvalue())


def _ssd_expected(image):
    with torch.no_grad():
        boxes, scores = _TinySSD(False)(torch.from_numpy(image))
    rows = torch_batched_nms(boxes.numpy(), scores.numpy(), 30, 12, 0.35, 0.4, -1, False,
                             False)
    dets = np.zeros((len(rows), 12, 5), np.float32)
    labels = np.full((len(rows), 12), -1, np.int32)
    for i, found in enumerate(rows):
        for j, (box, score, c, _) in enumerate(found):
            dets[i, j, :4], dets[i, j, 4], labels[i, j] = box.numpy(), score, c
    return [dets, labels]


def test_ssd_head_export():
    out = decomposer.decompose(_ssd_model())
    assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
    rng = np.random.default_rng(2)
    for batch in (1, 2):
        image = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32) * 2
        got = run_onnxruntime(out, {"image": image})
        want = _ssd_expected(image)
        assert (want[1] >= 0).sum() > batch
        np.testing.assert_allclose(got[0], want[0], atol=1e-5)
        np.testing.assert_array_equal(got[1], want[1])


def portability_cases():
    """The SSD-style head with mmdeploy's TRTBatchedNMS."""
    rng = np.random.default_rng(4)
    feeds, expected = [], []
    for batch in (2, 1):
        image = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32) * 2
        feeds.append({"image": image})
        expected.append(_ssd_expected(image))
    return [{"id": "TRTBatchedNMS (mmdeploy SSD-style head)", "model": _ssd_model(),
             "feeds": feeds, "expected": expected, "atol": 1e-4}]


def test_patterns_answer_for_their_spellings():
    assert {f.op_types for f in BatchedNMS().forms} == {("BatchedNMS_TRT",
                                                         "BatchedNMSDynamic_TRT")}
    assert MMDeployBatchedNMS().forms[0].op_types == ("TRTBatchedNMS",)
