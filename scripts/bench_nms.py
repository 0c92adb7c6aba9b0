"""Decomposed detection NMS plugins against ONNX Runtime's NonMaxSuppression alone.

In: ``--rounds R`` (default 9), ``--threads T`` (default 1), ``--json FILE``.
Out: per plugin and size, the median time of the decomposed node (the portable form, and
the ``--target ort`` form, whose caps select with an unsorted TopK) and its median ratio to a
lone ``NonMaxSuppression`` node on the same boxes and scores (the baseline: the one op any
decomposition must run; it returns the ragged (K, 3) indices, not the plugin's fixed-size
padded, sorted outputs), on ONNX Runtime CPU, over interleaved rounds. Sizes: YOLO at 640
(8400 anchors, 80 classes, score threshold 0.25, 100 outputs) and a small head (1000
anchors, 20 classes); boxes clustered so NMS suppresses. Used for the NMS rows of
docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))

import decomposer  # noqa: E402

from benchlib import OrtRunner, interleaved_rounds, time_calls  # noqa: E402

OPSET = 17
SIZES = {"yolo640": (8400, 80), "small": (1000, 20)}


def _inputs(anchors: int, classes: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    centre = rng.integers(0, 40, (1, anchors, 2)).astype(np.float32) * 16 + \
        rng.normal(0, 4, (1, anchors, 2)).astype(np.float32)
    size = rng.uniform(16, 96, (1, anchors, 2)).astype(np.float32)
    boxes = np.concatenate([centre - size / 2, centre + size / 2], -1)
    scores = (rng.uniform(0, 1, (1, anchors, classes)) ** 6).astype(np.float32)
    return {"boxes": boxes, "scores": scores}


def _plugin(op: str, anchors: int, classes: int) -> onnx.ModelProto:
    boxes = helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, anchors, 4])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, anchors, classes])
    if op == "EfficientNMS_TRT":
        attrs = {"score_threshold": 0.25, "iou_threshold": 0.45, "max_output_boxes": 100,
                 "background_class": -1, "score_activation": 0, "box_coding": 0}
        outs = [("num", TensorProto.INT32, [1, 1]), ("b", TensorProto.FLOAT, [1, 100, 4]),
                ("s", TensorProto.FLOAT, [1, 100]), ("c", TensorProto.INT32, [1, 100])]
    else:
        boxes = helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, anchors, 1, 4])
        attrs = {"shareLocation": 1, "backgroundLabelId": -1, "numClasses": classes,
                 "topK": 1000, "keepTopK": 100, "scoreThreshold": 0.25, "iouThreshold": 0.45,
                 "isNormalized": 0, "clipBoxes": 0}
        outs = [("num", TensorProto.INT32, [1, 1]), ("b", TensorProto.FLOAT, [1, 100, 4]),
                ("s", TensorProto.FLOAT, [1, 100]), ("c", TensorProto.FLOAT, [1, 100])]
    outputs = [helper.make_tensor_value_info(*o) for o in outs]
    node = helper.make_node(op, ["boxes", "scores"], [o.name for o in outputs], domain="trt",
                            **attrs)
    graph = helper.make_graph([node], "nms", [boxes, scores], outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                   helper.make_opsetid("trt", 1)])


def _lone_nms(anchors: int, classes: int, caffe: bool) -> onnx.ModelProto:
    """NonMaxSuppression on the same inputs: scores transposed to (B, C, N) in the graph."""
    init = [onnx.numpy_helper.from_array(np.array([100], np.int64), "max"),
            onnx.numpy_helper.from_array(np.array([0.45], np.float32), "iou"),
            onnx.numpy_helper.from_array(np.array([0.25], np.float32), "score")]
    nodes = [helper.make_node("Transpose", ["scores"], ["by_class"], perm=[0, 2, 1])]
    boxes = "boxes"
    if caffe:
        nodes.append(helper.make_node("Squeeze", ["boxes", "axis2"], ["boxes3"]))
        init.append(onnx.numpy_helper.from_array(np.array([2], np.int64), "axis2"))
        boxes = "boxes3"
    nodes.append(helper.make_node("NonMaxSuppression", [boxes, "by_class", "max", "iou",
                                                        "score"], ["selected"]))
    dims = [1, anchors, 1, 4] if caffe else [1, anchors, 4]
    graph = helper.make_graph(nodes, "nms", [
        helper.make_tensor_value_info("boxes", TensorProto.FLOAT, dims),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, anchors, classes])],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, [None, 3])], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = []
    for op in ("EfficientNMS_TRT", "BatchedNMS_TRT"):
        for label, (anchors, classes) in SIZES.items():
            feeds = _inputs(anchors, classes)
            caffe = op == "BatchedNMS_TRT"
            if caffe:
                feeds = {"boxes": feeds["boxes"][:, :, None, :], "scores": feeds["scores"]}
            variants = {
                "NonMaxSuppression": OrtRunner(_lone_nms(anchors, classes, caffe), feeds,
                                               args.threads),
                "decomposed": OrtRunner(decomposer.decompose(_plugin(op, anchors, classes)),
                                        feeds, args.threads),
                "ort_target": OrtRunner(decomposer.decompose(_plugin(op, anchors, classes),
                                                             target="ort"),
                                        feeds, args.threads)}
            _, times, ratios = interleaved_rounds(variants, "NonMaxSuppression", args.rounds,
                                                  time_calls)
            row = {"op": op, "size": label, "anchors": anchors, "classes": classes,
                   "nms_ms": statistics.median(times["NonMaxSuppression"]) * 1e3,
                   "decomposed_ms": statistics.median(times["decomposed"]) * 1e3,
                   "ratio": statistics.median(ratios["decomposed"]),
                   "ort_target_ms": statistics.median(times["ort_target"]) * 1e3,
                   "ort_target_ratio": statistics.median(ratios["ort_target"])}
            rows.append(row)
            print(f"{op:18s} {label:8s} NMS {row['nms_ms']:8.3f} ms  decomposed "
                  f"{row['decomposed_ms']:8.3f} ms  ratio {row['ratio']:.2f}x  --target ort "
                  f"{row['ort_target_ms']:8.3f} ms  {row['ort_target_ratio']:.2f}x", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
