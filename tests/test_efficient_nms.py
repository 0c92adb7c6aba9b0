"""TensorRT's EfficientNMS_TRT, decomposed: against the plugin's own golden data (TensorRT OSS
``plugin/efficientNMSPlugin/EfficientNMSPlugin_PluginGoldenIO.json``), against a torch
implementation of the plugin's algorithm written here (sort, IoU matrix, greedy loop), and
on a small YOLO-style detector exported the way yolov7's ``--end2end`` export writes the
plugin (an ``autograd.Function`` whose ``symbolic`` emits ``TRT::EfficientNMS_TRT``)."""

from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import decomposer
from decomposer.patterns.efficient_nms import EfficientNMS, efficient_nms_reference

from _helpers import make_model, run_onnxruntime

ATTRS = {"score_threshold": 0.25, "iou_threshold": 0.45, "max_output_boxes": 10,
         "background_class": -1, "score_activation": 0, "class_agnostic": 0, "box_coding": 0}


def _model(attrs, boxes_dims, score_dims, anchors_dims=None, elem=TensorProto.FLOAT,
           opset=13):
    limit = attrs["max_output_boxes"]
    limit = limit[0] if isinstance(limit, list) else limit
    inputs = [helper.make_tensor_value_info("boxes", elem, boxes_dims),
              helper.make_tensor_value_info("scores", elem, score_dims)]
    if anchors_dims:
        inputs.append(helper.make_tensor_value_info("anchors", elem, anchors_dims))
    outputs = [helper.make_tensor_value_info("num_detections", TensorProto.INT32, ["B", 1]),
               helper.make_tensor_value_info("detection_boxes", elem, ["B", limit, 4]),
               helper.make_tensor_value_info("detection_scores", elem, ["B", limit]),
               helper.make_tensor_value_info("detection_classes", TensorProto.INT32,
                                             ["B", limit])]
    node = helper.make_node("EfficientNMS_TRT", [i.name for i in inputs],
                            [o.name for o in outputs], name="nms", domain="TRT",
                            plugin_version="1", **attrs)
    return make_model([node], inputs, outputs, opset, extra_opsets=["TRT"])


# -- TensorRT's golden data ---------------------------------------------------------------

GOLDEN_BOXES = np.array([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, -0.1, 1, 0.9], [0, 10, 1, 11],
                          [0, 10.1, 1, 11.1], [0, 100, 1, 101]]], np.float32)
GOLDEN_SCORES = np.array([[[.21, .22], [.32, .13], [.30, .16], [.74, .06], [.10, .93],
                           [.77, .64]]], np.float32)


@pytest.mark.parametrize("opset", [11, onnx.defs.onnx_opset_version()])
@pytest.mark.parametrize("agnostic, count, rows", [
    (0, 6, [4, 5, 3, 5, 1, 0]),  # "config1"
    (1, 3, [4, 5, 1]),  # "class_agnostic"
])
def test_tensorrt_golden_data(agnostic, count, rows, opset):
    attrs = {**ATTRS, "score_threshold": 0.0, "iou_threshold": 0.5, "max_output_boxes": 6,
             "class_agnostic": agnostic}
    out = decomposer.decompose(_model(attrs, ["B", "N", 4], ["B", "N", 2], opset=opset))
    onnx.checker.check_model(out, full_check=True)
    num, boxes, scores, classes = run_onnxruntime(out, {"boxes": GOLDEN_BOXES,
                                                        "scores": GOLDEN_SCORES})
    want = np.zeros((1, 6, 4), np.float32)
    want[0, :count] = GOLDEN_BOXES[0, rows]
    assert num.dtype == np.int32 and num.tolist() == [[count]]
    np.testing.assert_array_equal(boxes, want)
    assert classes.dtype == np.int32
    # The golden file holds boxes and counts; the scores and classes follow from the rows.
    assert (scores[0, :count] == np.sort(scores[0, :count])[::-1]).all()
    assert (scores[0, count:] == 0).all() and (classes[0, count:] == 0).all()


# -- an independent torch implementation of the plugin's algorithm ---------------------

def torch_efficient_nms(boxes, scores, anchors, attrs):
    """The plugin's algorithm (README + efficientNMSInference.cu) in torch, float32."""
    boxes = torch.as_tensor(boxes).float()
    scores = torch.as_tensor(scores).float().reshape(scores.shape[:3])
    batch, count, classes = scores.shape
    boxes = boxes.reshape(batch, count, boxes.shape[2] if boxes.ndim == 4 else 1, 4).expand(
        batch, count, classes, 4)
    original = boxes.reshape(batch, -1, 4)
    if anchors is not None:
        a = torch.as_tensor(anchors).float()[:, :, None, :].expand(batch, count, 1, 4)
        if attrs["box_coding"]:
            boxes = torch.cat([boxes[..., :2] * a[..., 2:] + a[..., :2],
                               a[..., 2:] * torch.exp(boxes[..., 2:])], -1)
        else:
            boxes = torch.cat([torch.minimum(boxes[..., :2], boxes[..., 2:]) + a[..., :2],
                               torch.maximum(boxes[..., :2], boxes[..., 2:]) + a[..., 2:]], -1)
    if attrs["box_coding"]:
        half = boxes[..., 2:] * 0.5
        boxes = torch.cat([boxes[..., :2] - half, boxes[..., :2] + half], -1)
    t = float(np.float32(attrs["score_threshold"]))
    if attrs["score_activation"]:
        t = float(np.log(np.float32(t) / (1 - np.float32(t)))) if t > 0 else -32768.0
    limit = attrs["max_output_boxes"]
    out = [torch.zeros(batch, 1, dtype=torch.int32), torch.zeros(batch, limit, 4),
           torch.zeros(batch, limit), torch.zeros(batch, limit, dtype=torch.int32)]
    for image in range(batch):
        flat = scores[image].reshape(-1)  # anchor-major
        ok = flat >= torch.tensor(t, dtype=torch.float32)
        cls = torch.arange(count * classes) % classes
        if 0 <= attrs["background_class"]:
            ok &= cls != attrs["background_class"]
        cand = torch.nonzero(ok).reshape(-1)
        order = torch.sort(flat[cand], descending=True, stable=True).indices
        cand = cand[order][:5000]
        cb = boxes[image].reshape(-1, 4)[cand]
        lo = torch.minimum(cb[:, :2], cb[:, 2:])
        hi = torch.maximum(cb[:, :2], cb[:, 2:])
        wh = (torch.minimum(hi[:, None], hi[None]) - torch.maximum(lo[:, None], lo[None]))
        inter = wh.clamp(min=0).prod(-1)
        area = (hi - lo).prod(-1)
        union = area[:, None] + area[None] - inter
        iou = torch.where((inter > 0) & (union > 0), inter / union, torch.zeros(()))
        same = (cls[cand][:, None] == cls[cand][None]) | bool(attrs["class_agnostic"])
        kept = []
        for i in range(len(cand)):
            if len(kept) == limit:
                break
            if not any(bool(same[k, i]) and float(iou[k, i]) >= attrs["iou_threshold"]
                       for k in kept):
                kept.append(i)
        out[0][image, 0] = len(kept)
        for row, i in enumerate(kept):
            cell = int(cand[i])
            decoded = anchors is not None or attrs["box_coding"]
            out[1][image, row] = (boxes[image].reshape(-1, 4) if decoded else
                                  original[image])[cell]
            raw = flat[cell]
            out[2][image, row] = torch.sigmoid(raw) if attrs["score_activation"] else raw
            out[3][image, row] = cell % classes
    return [o.numpy() for o in out]


def _check(model_attrs, boxes_dims, score_dims, feeds_list, anchors_dims=None, opset=13,
           dtype=np.float32):
    elem = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    model = _model(model_attrs, boxes_dims, score_dims, anchors_dims, elem=elem, opset=opset)
    out = decomposer.decompose(model)
    onnx.checker.check_model(out, full_check=True)
    args = EfficientNMS().forms[0].coerce_attributes(model_attrs)
    for feeds in feeds_list:
        got = run_onnxruntime(out, feeds)
        want = torch_efficient_nms(feeds["boxes"], feeds["scores"], feeds.get("anchors"),
                                   args)
        ref = efficient_nms_reference(feeds["boxes"], feeds["scores"], feeds.get("anchors"),
                                      args)
        for g, w, r, name in zip(got, want, ref, ("num", "boxes", "scores", "classes"),
                                  strict=True):
            assert g.dtype == r.dtype, name
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64),
                                       atol=1e-6 if dtype == np.float32 else 2e-3,
                                       err_msg=name)
            np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6, err_msg=name)
    return out


def _detections(rng, batch, count, classes, spread=20.0, per_class=False, coding=0):
    """Clustered boxes so that NMS has work: centres near a few points, sizes 2-8."""
    shape = (batch, count, classes, 2) if per_class else (batch, count, 2)
    centre = rng.integers(0, 4, shape).astype(np.float32) * spread / 4 + \
        rng.normal(0, 1.0, shape).astype(np.float32)
    size = rng.uniform(2, 8, shape).astype(np.float32)
    if coding:
        boxes = np.concatenate([centre, size], -1)
    else:
        boxes = np.concatenate([centre - size / 2, centre + size / 2], -1)
    scores = rng.uniform(0, 1, (batch, count, classes)).astype(np.float32)
    return boxes, scores


@pytest.mark.parametrize("layout", ["shared", "shared_4d", "per_class"])
@pytest.mark.parametrize("agnostic", [0, 1])
@pytest.mark.parametrize("coding", [0, 1])
def test_matches_torch(layout, agnostic, coding):
    rng = np.random.default_rng(["shared", "shared_4d", "per_class"].index(layout)
                                + 3 * agnostic + 7 * coding)
    classes = 3
    attrs = {**ATTRS, "class_agnostic": agnostic, "box_coding": coding}
    feeds_list = []
    for batch, count in [(2, 30), (1, 7)]:
        boxes, scores = _detections(rng, batch, count, classes, per_class=layout == "per_class",
                                    coding=coding)
        if layout == "shared_4d":
            boxes = boxes[:, :, None, :]
        feeds_list.append({"boxes": boxes, "scores": scores})
    boxes_dims = {"shared": ["B", "N", 4], "shared_4d": ["B", "N", 1, 4],
                  "per_class": ["B", "N", classes, 4]}[layout]
    _check(attrs, boxes_dims, ["B", "N", classes], feeds_list)


@pytest.mark.parametrize("coding", [0, 1])
@pytest.mark.parametrize("anchor_batch", [1, "B"])
def test_anchors_activation_background(coding, anchor_batch):
    rng = np.random.default_rng(coding + 2 * (anchor_batch == 1))
    attrs = {**ATTRS, "box_coding": [coding], "background_class": [0],
             "score_activation": 1, "score_threshold": 0.4}
    feeds_list = []
    for batch, count in [(2, 25), (3, 9)]:
        deltas = rng.normal(0, 0.3, (batch, count, 4)).astype(np.float32)
        centre = rng.integers(0, 3, (count, 2)).astype(np.float32) * 6
        anchors = np.concatenate([centre, centre + 5] if not coding else
                                 [centre, np.full((count, 2), 5, np.float32)], -1)[None]
        if anchor_batch == "B":
            anchors = np.repeat(anchors, batch, 0) + rng.normal(0, 0.1, (batch, count, 4)
                                                                ).astype(np.float32)
        scores = rng.normal(0, 1.5, (batch, count, 4)).astype(np.float32)  # logits
        feeds_list.append({"boxes": deltas, "scores": scores,
                           "anchors": anchors.astype(np.float32)})
    _check(attrs, ["B", "N", 4], ["B", "N", 4], feeds_list,
           anchors_dims=[anchor_batch, "N", 4])


def test_edges_ties_thresholds_and_counts():
    """Scores at the threshold (kept: >=), IoU exactly at the threshold (suppressed: >=),
    equal scores (the lower anchor first), no boxes, nothing above the threshold, and more
    survivors than output rows."""
    attrs = {**ATTRS, "score_threshold": 0.5, "iou_threshold": 0.5, "max_output_boxes": 4}
    boxes = np.array([[[0, 0, 2, 1], [0, 0, 1, 1], [5, 5, 6, 6], [5, 5, 6, 6], [9, 9, 10, 10],
                       [20, 20, 21, 21], [30, 30, 31, 31]]], np.float32)
    scores = np.array([[[0.9], [0.8], [0.5], [0.5], [0.49999997], [0.7], [0.6]]], np.float32)
    feeds = [{"boxes": boxes, "scores": scores},
             {"boxes": boxes[:, :0], "scores": scores[:, :0]},
             {"boxes": boxes, "scores": scores * 0.1},
             {"boxes": np.repeat(boxes, 2, 0), "scores": np.repeat(scores, 2, 0)}]
    out = _check(attrs, ["B", "N", 4], ["B", "N", 1], feeds)
    num, got_boxes, _, _ = run_onnxruntime(out, feeds[0])
    # IoU([0,0,2,1], [0,0,1,1]) = 0.5 exactly: suppressed; the tie at 0.5 keeps anchor 2.
    assert num.tolist() == [[4]]
    np.testing.assert_array_equal(got_boxes[0], boxes[0, [0, 5, 6, 2]])


def test_candidate_cap_of_5000():
    """The plugin runs NMS on the best 5000 candidates only: 5000 copies of one box outrank
    100 separate ones, so one detection comes out, not 101."""
    count = 5100
    boxes = np.zeros((1, count, 4), np.float32)
    boxes[0, :, 2:] = 1
    boxes[0, 5000:, :] += np.arange(100, dtype=np.float32)[:, None] * 3 + 3
    scores = np.concatenate([np.full(5000, 0.9), np.full(100, 0.8)]).astype(np.float32)
    feeds = {"boxes": boxes, "scores": scores.reshape(1, count, 1)}
    out = _check({**ATTRS, "max_output_boxes": 20}, ["B", "N", 4], ["B", "N", 1], [feeds])
    assert run_onnxruntime(out, feeds)[0].tolist() == [[1]]


def test_float16():
    rng = np.random.default_rng(5)
    boxes, scores = _detections(rng, 2, 20, 2)
    _check(ATTRS, ["B", "N", 4], ["B", "N", 2],
           [{"boxes": boxes.astype(np.float16), "scores": scores.astype(np.float16)}],
           dtype=np.float16)


@pytest.mark.parametrize("change, message", [
    ({"score_threshold": -0.1}, "score_threshold"),
    ({"iou_threshold": 0.0}, "iou_threshold"),
    ({"max_output_boxes": 0}, "max_output_boxes"),
    ({"box_coding": 2}, "box_coding"),
    ({"background_class": [1, 2]}, "background_class"),
])
def test_rejections(change, message):
    model = _model({**ATTRS, **change}, ["B", "N", 4], ["B", "N", 3])
    with pytest.raises(decomposer.UnsupportedNodeError, match=message):
        decomposer.decompose(model)


def test_dynamic_class_count_is_refused():
    model = _model(ATTRS, ["B", "N", 4], ["B", "N", "C"])
    with pytest.raises(decomposer.UnsupportedNodeError, match="class count"):
        decomposer.decompose(model)


# -- a YOLO-style detector exported as yolov7 --end2end writes it -------------------------

class _TensorRTNMS(torch.autograd.Function):
    """yolov7 models/experimental.py TRT_NMS: a stand-in forward, the plugin in symbolic."""

    @staticmethod
    def forward(ctx, boxes, scores, background_class, box_coding, iou_threshold,
                max_output_boxes, score_activation, score_threshold):
        batch = boxes.shape[0]
        return (torch.randint(0, max_output_boxes, (batch, 1), dtype=torch.int32),
                torch.randn(batch, max_output_boxes, 4),
                torch.randn(batch, max_output_boxes),
                torch.randint(0, scores.shape[2], (batch, max_output_boxes),
                              dtype=torch.int32))

    @staticmethod
    def symbolic(g, boxes, scores, background_class, box_coding, iou_threshold,
                 max_output_boxes, score_activation, score_threshold):
        return g.op("TRT::EfficientNMS_TRT", boxes, scores,
                    background_class_i=background_class, box_coding_i=box_coding,
                    iou_threshold_f=iou_threshold, max_output_boxes_i=max_output_boxes,
                    plugin_version_s="1", score_activation_i=score_activation,
                    score_threshold_f=score_threshold, outputs=4)


class _TinyYolo(torch.nn.Module):
    """A conv head with 3 classes on an 8x8 grid; (cx, cy, w, h) boxes in pixels."""

    def __init__(self, end2end: bool):
        super().__init__()
        torch.manual_seed(0)
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, 2, 1), torch.nn.ReLU(),
                                            torch.nn.Conv2d(8, 8 + 0, 3, 2, 1))
        self.end2end = end2end
        # A constant grid, as YOLO heads export it (TVM 0.27 crashes in NonMaxSuppression
        # when the box count comes from a run-time arange instead).
        self.register_buffer("grid", torch.arange(64, dtype=torch.float32))

    def forward(self, image):
        raw = self.features(image).flatten(2).transpose(1, 2)  # (B, 64, 8)
        grid = self.grid
        cx = (grid % 8 + torch.sigmoid(raw[..., 0])) * 4
        cy = (torch.div(grid, 8, rounding_mode="floor") + torch.sigmoid(raw[..., 1])) * 4
        wh = torch.sigmoid(raw[..., 2:4]) * 16
        boxes = torch.cat([cx[..., None], cy[..., None], wh], -1)
        scores = torch.sigmoid(raw[..., 5:8]) * torch.sigmoid(raw[..., 4:5])
        if not self.end2end:
            return boxes, scores
        return _TensorRTNMS.apply(boxes, scores, (-1,), (1,), 0.45, 20, 0, 0.3)


YOLO_ATTRS = {**ATTRS, "iou_threshold": 0.45, "max_output_boxes": 20, "box_coding": 1,
              "score_threshold": 0.3}


def _yolo_model() -> onnx.ModelProto:
    buffer = io.BytesIO()
    torch.onnx.export(_TinyYolo(end2end=True), torch.zeros(1, 3, 32, 32), buffer,
                      input_names=["images"], dynamo=False, opset_version=13,
                      output_names=["num_dets", "det_boxes", "det_scores", "det_classes"],
                      dynamic_axes={"images": {0: "batch"}, "num_dets": {0: "batch"},
                                    "det_boxes": {0: "batch"}, "det_scores": {0: "batch"},
                                    "det_classes": {0: "batch"}})
    return onnx.load_from_string(buffer.getvalue())


def _yolo_expected(images):
    with torch.no_grad():
        boxes, scores = _TinyYolo(end2end=False)(torch.from_numpy(images))
    return torch_efficient_nms(boxes.numpy(), scores.numpy(), None, YOLO_ATTRS)


def test_yolo_end2end_export():
    model = _yolo_model()
    nms = [n for n in model.graph.node if n.op_type == "EfficientNMS_TRT"]
    assert nms and nms[0].domain == "TRT"
    out = decomposer.decompose(model)
    assert all(n.domain in ("", "ai.onnx") for n in out.graph.node)
    onnx.checker.check_model(out, full_check=True)
    rng = np.random.default_rng(0)
    for batch in (1, 3):
        images = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32) * 3
        got = run_onnxruntime(out, {"images": images})
        want = _yolo_expected(images)
        assert int(want[0].sum()) > batch  # the case has detections and suppressions
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, atol=1e-5)


def portability_cases():
    """The YOLO-style end-to-end export: EfficientNMS_TRT after a conv head."""
    model = _yolo_model()
    rng = np.random.default_rng(1)
    feeds, expected = [], []
    for batch in (2, 1):
        images = rng.standard_normal((batch, 3, 32, 32)).astype(np.float32) * 3
        feeds.append({"images": images})
        expected.append(_yolo_expected(images))
    return [{"id": "EfficientNMS_TRT (YOLO end2end export)", "model": model, "feeds": feeds,
             "expected": expected, "atol": 1e-4}]


