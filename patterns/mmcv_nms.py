"""mmcv's ``NonMaxSuppression`` custom op (mmcv 1.2.3-1.7 exports with its ONNX Runtime ops
loaded) as ONNX ``NonMaxSuppression``.

Matches ``NonMaxSuppression(boxes, scores; iou_threshold, offset)`` in any domain but the
default one (mmcv registers it as ``mmcv::NonMaxSuppression``; the standard op of the same
name is left alone), one output. Semantics, read from mmcv v1.7.2
``mmcv/ops/csrc/onnxruntime/cpu/nms.cpp`` (the same as its ``nms_cpu``) and
``mmcv/ops/nms.py`` ``NMSop.symbolic``: boxes (N, 4) ``[x1, y1, x2, y2]``, scores (N,),
float32; greedy NMS in score order, a box suppressed when its IoU with a kept one is
``> iou_threshold`` (strict), areas and overlaps with ``+ offset`` on widths and heights
(``offset`` 0 or 1); output the kept boxes' indices, int64 (N_kept,), best score first.
mmcv's exporter drops ``score_threshold`` and ``max_num`` from this node (its Python
``forward`` applies them; the exported graph does not), so every box takes part.

Before -> after::

    NonMaxSuppression(boxes[None] (+ offset on the max corner), scores[None, None],
                      2^31 - 1, iou_threshold)[:, 2]

No mmcv version writes an op named ``NMS`` (read: v1.0-v1.7.2 and 2.x): v1.1-v1.2.2, the
branch without mmcv's ONNX Runtime ops, and 2.x through mmdeploy write standard
``NonMaxSuppression``, which needs nothing here.

Ties: mmcv's ``std::sort`` is not stable, so it defines no order for equal scores; here the
lower index comes first (ONNX Runtime's and OpenVINO's rule). Boxes with a max corner below
the min corner are out of the envelope (mmcv does not sort corners, NonMaxSuppression
does). The output's length depends on the data, as the plugin's does.

Envelope: opsets 11+; N dynamic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder
from decomposer.checks import require_shape, require_type
from decomposer.examples import I64, Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._nms import greedy_nms, iou

EVERY_BOX = 2**31 - 1  # max_output_boxes_per_class: no cap (index values stay below 2^31)


class Facts(NamedTuple):
    offset: int


class MMCVNonMaxSuppression(Pattern[Facts]):
    op_type = "NonMaxSuppression"
    # Any domain but the default one, where the name is ONNX's own op.
    forms = (Form("NonMaxSuppression", domains=frozenset({"mmcv", "mmdeploy",
                                                          "custom.ops"}),
                  inputs=(In("boxes"), In("scores")),
                  attributes={"iou_threshold": Attr("float"),
                              "offset": Attr("int", default=0, choices=(0, 1))},
                  label="mmcv, mmdeploy, custom.ops (not the default domain)"),)
    examples = (Example((("boxes", F, ("N", 4)), ("scores", F, ("N",))), ((I64, 1),),
                        attrs={"iou_threshold": 0.5, "offset": 0},
                        domains=(("mmcv", 11),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        if not 0 <= node.args["iou_threshold"] <= 1:
            raise Reject("iou_threshold must be in [0, 1]")
        require_type(ctx, node.tensor("boxes"), "boxes", (TensorProto.FLOAT,))
        require_type(ctx, node.tensor("scores"), "scores", (TensorProto.FLOAT,))
        boxes = require_shape(ctx, node.tensor("boxes"), "boxes", "(N, 4)", min_rank=2,
                              max_rank=2)
        if isinstance(boxes[1], int) and boxes[1] != 4:
            raise Reject(f"boxes must be (N, 4), got {list(boxes)}")
        require_shape(ctx, node.tensor("scores"), "scores", "(N,)", min_rank=1, max_rank=1)
        return Facts(int(node.args["offset"]))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        boxes = b.Unsqueeze(node.tensor("boxes"), [0], hint="boxes_batch")
        if facts.offset:  # (x2 - x1 + 1)(y2 - y1 + 1): the max corner one pixel further
            low, high = b.Split(boxes, 2, 2, hint="corners")
            boxes = b.Concat(low, b.Add(high, np.array(1, np.float32), hint="high_inclusive"),
                             axis=2, hint="inclusive_boxes")
        scores = b.Unsqueeze(node.tensor("scores"), [0, 1], hint="scores_batch_class")
        selected = b.NonMaxSuppression(boxes, scores, EVERY_BOX,
                                       float(node.args["iou_threshold"]))
        b.Squeeze(b.Gather(selected, [2], axis=1, hint="kept_column"), [1],
                  out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(TensorProto.INT64, [None])]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        boxes, scores = tensors["boxes"], tensors["scores"]
        assert boxes is not None and scores is not None
        order = [int(i) for i in np.argsort(-scores.astype(np.float32), kind="stable")]
        plus_one = bool(args["offset"])
        kept = greedy_nms(order, lambda k, i: iou(boxes[k], boxes[i], plus_one=plus_one,
                                                  reorder=False) > args["iou_threshold"])
        return [np.array(kept, np.int64)]


PATTERNS = [MMCVNonMaxSuppression()]
