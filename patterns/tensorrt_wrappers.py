"""TensorRT OSS plugins that are thin wrappers over standard ops (the ``plugin/`` directory
at TensorRT v10.16; each plugin's creator fields and kernel cited in its class).

Matches, in any domain:
- ``LReLU_TRT(x; negSlope)`` -> ``LeakyRelu(alpha=negSlope)`` (``leakyReluPlugin``,
  ``common/kernels/lReLU.cu``: ``x > 0 ? x : x * slope``).
- ``Clip_TRT(x; clipMin, clipMax)`` -> ``Clip`` (``clipPlugin``).
- ``Normalize_TRT(x; weights, acrossSpatial, channelShared, nbWeights, eps)`` (SSD's
  L2Norm, ``normalizePlugin``): ``x / sqrt(sum(x^2) + eps) * w``, the sum over C, H, W per
  sample with ``acrossSpatial=1``, else over C per pixel (the kernel's rule; its README
  says "across the batch"), ``w`` one weight or one per channel. ``LpNormalization`` has no
  eps, so it is written out.
- ``Reorg_TRT(x; stride)`` (``reorgPlugin``, darknet's reorg): the kernel reads the buffer
  as (N, C / s^2, H * s, W * s) and moves s x s blocks into channels, SpaceToDepth's order
  (written as a Reshape to (N, C / s^2, H, s, W, s), a Transpose and a Reshape) to
  (N, C * s^2, H / s, W / s); plain ``SpaceToDepth`` of x is a different order (the
  README's example pins it).
- ``ResizeNearest_TRT(x; scale)`` (``resizeNearestPlugin``, ``resize_nearest_kernel_2d``:
  source ``int(o / scale)``) -> ``Resize`` nearest, ``asymmetric``, ``floor``; an integer
  scale (the output size ``int(H * scale)`` equals ONNX's ``floor`` then).
- ``FlattenConcat_TRT(x_1, ..., x_k; axis=1, ignoreBatch=0)`` (``flattenConcat``) ->
  each flattened per sample, concatenated, shaped (N, total, 1, 1).
- ``SpecialSlice_TRT(detections)`` (``specialSlicePlugin``) -> the first 4 of the last axis.
- ``BatchTilePlugin_TRT(a, b)`` (``batchTilePlugin``) -> ``b`` (1, C, H, W) repeated
  ``a``'s batch times.
- ``GroupNormalizationPlugin(x, scale, bias; eps, num_groups)``
  (``groupNormalizationPlugin``; the field is ``eps``, its README says ``epsilon``) ->
  Reshape (N, G, -1), ``InstanceNormalization`` with unit scale, Reshape back, per-channel
  scale and bias.

Not covered (not thin wrappers, or not pinned): the detection-output, proposal and anchor
plugins (``DetectionLayer_TRT``, ``ProposalLayer_TRT``, ``GenerateDetection_TRT``,
``NMS_TRT``, ``GridAnchor_TRT``, ``PriorBox_TRT``), ``CropAndResize`` (coordinate
conventions not pinned), ``Region_TRT`` (its softmax tree is a pointer), ``CoordConvAC``
(the kernel's constant channels differ from its README when H != W), ``ScatterElements``
with ``mean``, the fused transformer/BEV kernels; ``EfficientNMS``, ``BatchedNMS``,
``ROIAlign``, ``PyramidROIAlign``, ``MultilevelCropAndResize``, ``ModulatedDeformConv2d``,
``MultiscaleDeformableAttn`` and ``InstanceNormalization`` have their own modules.

Envelope: opsets 11+ (``GroupNormalizationPlugin``, ``Normalize_TRT``: float types);
dynamic dims except where a reshape needs a static channel count (Reorg, GroupNorm).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import INT64_MAX, Builder, Value, numpy_dtype
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

_FLOATS = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)
_PLUGIN = frozenset({"plugin_version", "plugin_namespace"})


class Facts(NamedTuple):
    elem_type: int
    shape: tuple[int | str | None, ...]


def _facts(ctx: MatchContext, name: str, label: str, rank: int | None = None,
           types: Sequence[int] = _FLOATS) -> Facts:
    elem_type = require_type(ctx, name, label, types)
    shape = require_shape(ctx, name, label, "its layout", min_rank=rank or 0,
                          max_rank=rank)
    return Facts(elem_type, tuple(shape))


class _Wrapper(Pattern[Facts]):
    rank: int | None = None

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        return _facts(ctx, node.inputs[0], "x", self.rank)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(facts.elem_type, None)]


class LeakyReluPlugin(_Wrapper):
    op_type = "LReLU_TRT"
    forms = (Form("LReLU_TRT", inputs=(In("x"),), attributes={"negSlope": Attr("float")},
                  extra_attributes=_PLUGIN),)
    examples = (Example((("x", F, ("N", 3)),), attrs={"negSlope": 0.1}, domains=(("", 13),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        if node.args["negSlope"] < 0:
            raise Reject("negSlope must be >= 0 (the plugin's check)")
        return super().check(node, ctx)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        b.op("LeakyRelu", node.tensor("x"), alpha=float(node.args["negSlope"]),
             out=node.outputs[0])

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        return [np.where(x > 0, x, x * x.dtype.type(args["negSlope"]))]


class ClipPlugin(_Wrapper):
    op_type = "Clip_TRT"
    forms = (Form("Clip_TRT", inputs=(In("x"),), attributes={
        "clipMin": Attr("float"), "clipMax": Attr("float")}, extra_attributes=_PLUGIN),)
    examples = (Example((("x", F, ("N", 3)),), attrs={"clipMin": -1.0, "clipMax": 2.0},
                        domains=(("", 13),)),)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        dtype = numpy_dtype(facts.elem_type)
        b.Clip(b.input(node.tensor("x"), dtype), np.array(node.args["clipMin"], dtype),
               np.array(node.args["clipMax"], dtype), out=node.outputs[0])

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        return [np.minimum(np.maximum(x, x.dtype.type(args["clipMin"])),
                           x.dtype.type(args["clipMax"]))]


class NormalizePlugin(_Wrapper):
    op_type = "Normalize_TRT"
    rank = 4
    forms = (Form("Normalize_TRT", inputs=(In("x"),), attributes={
        "weights": Attr("floats"), "acrossSpatial": Attr("int", choices=(0, 1)),
        "channelShared": Attr("int", choices=(0, 1)), "nbWeights": Attr("int", default=1),
        "eps": Attr("float")}, extra_attributes=_PLUGIN),)
    examples = (Example((("x", F, ("N", 3, "H", "W")),),
                        attrs={"weights": [20.0], "acrossSpatial": 0, "channelShared": 1,
                               "nbWeights": 1, "eps": 1e-10}, domains=(("", 13),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        facts = super().check(node, ctx)
        weights = len(node.args["weights"])
        channels = facts.shape[1]
        if node.args["channelShared"] and weights != 1:
            raise Reject(f"channelShared takes one weight, got {weights}")
        if not node.args["channelShared"] and isinstance(channels, int) and weights != channels:
            raise Reject(f"{weights} weights for {channels} channels")
        return facts

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        dtype = numpy_dtype(facts.elem_type)
        x = b.input(node.tensor("x"), dtype)
        axes = [1, 2, 3] if node.args["acrossSpatial"] else [1]
        total = b.ReduceSum(b.Mul(x, x, hint="squares"), axes, keepdims=True, hint="sum_sq")
        norm = b.Sqrt(b.Add(total, np.array(node.args["eps"], dtype), hint="sum_eps"),
                      hint="norm")
        weights = np.array(node.args["weights"], dtype).reshape(1, -1, 1, 1)
        b.Mul(b.Div(x, norm, hint="unit"), weights, out=node.outputs[0])

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        axes = (1, 2, 3) if args["acrossSpatial"] else (1,)
        wide = x.astype(np.float64)
        norm = np.sqrt((wide * wide).sum(axes, keepdims=True) + args["eps"])
        weights = np.array(args["weights"]).reshape(1, -1, 1, 1)
        return [(wide / norm * weights).astype(x.dtype)]


class ReorgPlugin(_Wrapper):
    op_type = "Reorg_TRT"
    rank = 4
    forms = (Form("Reorg_TRT", inputs=(In("x"),), attributes={"stride": Attr("int")},
                  extra_attributes=_PLUGIN),)
    examples = (Example((("x", F, ("N", 4, 6, 6)),), ((F, 4),), attrs={"stride": 2},
                        domains=(("", 13),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        facts = _facts(ctx, node.inputs[0], "x", 4,
                       (*_FLOATS, TensorProto.INT32, TensorProto.INT64))
        stride, channels = int(node.args["stride"]), facts.shape[1]
        if stride <= 0:
            raise Reject("stride must be > 0")
        if not isinstance(channels, int) or channels % (stride * stride):
            raise Reject(f"the channel count must be static and a multiple of stride^2 = "
                         f"{stride * stride}, got {channels}")
        return facts

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        # The kernel's view (N, C / s^2, H * s, W * s) of the buffer, split into s x s blocks,
        # is (N, C / s^2, H, s, W, s); SpaceToDepth's order moves the block offsets first.
        # No SpaceToDepth (onnx2torch has none) and no arithmetic on sizes (TVM): H / s and
        # W / s come from the shape of a strided corner of x.
        s = int(node.args["stride"])
        channels = facts.shape[1]
        assert isinstance(channels, int)
        x = node.tensor("x")
        batch = b.Shape(x, 0, 1, hint="batch")
        height, width = b.Shape(x, 2, 3, hint="height"), b.Shape(x, 3, 4, hint="width")
        blocks = b.Reshape(x, b.Concat(batch, np.array([channels // (s * s)], np.int64),
                                       height, np.array([s], np.int64), width,
                                       np.array([s], np.int64), axis=0, hint="blocks_shape"),
                           hint="blocks")
        moved = b.Transpose(blocks, [0, 3, 5, 1, 2, 4], hint="block_offsets_first")
        corner = b.Slice(x, [0, 0, 0, 0], [1, 1, INT64_MAX, INT64_MAX], [0, 1, 2, 3],
                         [1, 1, s, s], hint="strided_corner")
        target = b.Concat(batch, np.array([channels * s * s], np.int64),
                          b.Shape(corner, 2, 4, hint="out_hw"), axis=0, hint="out_shape")
        b.Reshape(moved, target, out=node.outputs[0])

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        s = int(args["stride"])
        n, c, h, w = x.shape
        # the kernel's view (N, C / s^2, H * s, W * s), then SpaceToDepth's block order
        blocks = x.reshape(n, c // (s * s), h, s, w, s).transpose(0, 3, 5, 1, 2, 4)
        return [blocks.reshape(n, c * s * s, h // s, w // s)]


class ResizeNearestPlugin(_Wrapper):
    op_type = "ResizeNearest_TRT"
    rank = 4
    forms = (Form("ResizeNearest_TRT", inputs=(In("x"),), attributes={"scale": Attr("float")},
                  extra_attributes=_PLUGIN),)
    examples = (Example((("x", F, ("N", 3, "H", "W")),), attrs={"scale": 2.0},
                        domains=(("", 13),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        scale = node.args["scale"]
        if not np.isfinite(scale) or scale < 1 or scale != int(scale):
            raise Reject(f"scale {scale}: only integer scales >= 1 are pinned (the kernel's "
                         "int() of a fractional size and source)")
        return super().check(node, ctx)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        scale = float(node.args["scale"])
        b.op("Resize", node.tensor("x"), b.const(np.zeros(0, np.float32), hint="no_roi"),
             b.const(np.array([1, 1, scale, scale], np.float32), hint="scales"),
             mode="nearest", coordinate_transformation_mode="asymmetric",
             nearest_mode="floor", out=node.outputs[0])

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["x"]
        assert x is not None
        s = int(args["scale"])
        return [x.repeat(s, axis=2).repeat(s, axis=3)]


class FlattenConcatPlugin(Pattern[Facts]):
    op_type = "FlattenConcat_TRT"
    forms = (Form("FlattenConcat_TRT", attributes={
        "axis": Attr("int", default=1, choices=(1,)),
        "ignoreBatch": Attr("int", default=0, choices=(0,))}, extra_attributes=_PLUGIN),)
    examples = (Example((("a", F, ("N", 2, 3, 3)), ("b", F, ("N", 4, 2, 2))), ((F, 4),),
                        domains=(("", 13),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        if not node.inputs:
            raise Reject("no inputs")
        facts = _facts(ctx, node.inputs[0], "input 1", 4)
        for position, name in enumerate(node.inputs[1:], start=2):
            _facts(ctx, name, f"input {position}", 4, (facts.elem_type,))
        return facts

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        batch = b.Shape(node.inputs[0], 0, 1, hint="batch")
        rows = b.Concat(batch, np.array([-1], np.int64), axis=0, hint="rows_shape")
        flat = [b.Reshape(name, rows, hint=f"flat{i}") for i, name in enumerate(node.inputs)]
        joined = b.Concat(*flat, axis=1, hint="joined") if len(flat) > 1 else flat[0]
        b.Reshape(joined, b.Concat(batch, np.array([-1, 1, 1], np.int64), axis=0,
                                   hint="out_shape"), out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(facts.elem_type, [facts.shape[0], None, 1, 1])]

    def evaluate(self, form: Form, inputs: Sequence[np.ndarray | None],
                 attrs: Mapping[str, Any]) -> list[np.ndarray]:
        arrays = [a for a in inputs if a is not None]
        joined = np.concatenate([a.reshape(a.shape[0], -1) for a in arrays], 1)
        return [joined.reshape(*joined.shape, 1, 1)]


class SpecialSlicePlugin(_Wrapper):
    op_type = "SpecialSlice_TRT"
    rank = 3
    forms = (Form("SpecialSlice_TRT", inputs=(In("detections"),), extra_attributes=_PLUGIN),)
    examples = (Example((("d", F, ("N", "K", 6)),), domains=(("", 13),)),)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        b.Slice(node.tensor("detections"), [0], [4], [2], out=node.outputs[0])

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        d = tensors["detections"]
        assert d is not None
        return [d[..., :4]]


class BatchTilePlugin(Pattern[Facts]):
    op_type = "BatchTilePlugin_TRT"
    forms = (Form("BatchTilePlugin_TRT", inputs=(In("a"), In("b")), extra_attributes=_PLUGIN),)
    examples = (Example((("a", F, ("N", 3)), ("b", F, (1, 2, 2, 2))), ((F, 4),),
                        domains=(("", 13),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        facts = _facts(ctx, node.tensor("b"), "b", 4)
        if facts.shape[0] not in (1, None) and not isinstance(facts.shape[0], str):
            raise Reject("b must be (1, C, H, W)")
        require_shape(ctx, node.tensor("a"), "a", "its batch", min_rank=1)
        return facts

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        target = b.Concat(b.Shape(node.tensor("a"), 0, 1, hint="batch"),
                          b.Shape(node.tensor("b"), 1, 4, hint="chw"), axis=0,
                          hint="tiled_shape")
        b.Expand(node.tensor("b"), target, out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(facts.elem_type, None)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        a, b_ = tensors["a"], tensors["b"]
        assert a is not None and b_ is not None
        return [np.repeat(b_, a.shape[0], axis=0)]


class GroupNormPlugin(Pattern[Facts]):
    op_type = "GroupNormalizationPlugin"
    forms = (Form("GroupNormalizationPlugin", inputs=(In("x"), In("scale"), In("bias")),
                  attributes={"eps": Attr("float", default=1e-5), "num_groups": Attr("int")},
                  extra_attributes=_PLUGIN),)
    examples = (Example((("x", F, ("N", 4, "H", "W")), ("s", F, (4,)), ("b", F, (4,))),
                        attrs={"num_groups": 2}, domains=(("", 13),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        facts = _facts(ctx, node.tensor("x"), "x", 4)
        for name in ("scale", "bias"):
            require_type(ctx, node.tensor(name), name, (facts.elem_type,))
        channels, groups = facts.shape[1], int(node.args["num_groups"])
        if not isinstance(channels, int) or groups <= 0 or channels % groups:
            raise Reject(f"the channel count must be static and split into {groups} groups, "
                         f"got {channels}")
        return facts

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        dtype = numpy_dtype(facts.elem_type)
        groups = int(node.args["num_groups"])
        x = node.tensor("x")
        grouped = b.Reshape(x, b.Concat(b.Shape(x, 0, 1, hint="batch"),
                                        np.array([groups, -1], np.int64), axis=0,
                                        hint="grouped_shape"), hint="grouped")
        normalized = b.op("InstanceNormalization", grouped,
                          b.const(np.ones(groups, dtype), hint="unit_scale"),
                          b.const(np.zeros(groups, dtype), hint="zero_bias"),
                          epsilon=float(node.args["eps"]), hint="group_norm")
        y = b.Reshape(normalized, b.Shape(x, hint="x_shape"), hint="ungrouped")
        scale: Value = b.Unsqueeze(node.tensor("scale"), [1, 2], hint="scale_c11")
        bias: Value = b.Unsqueeze(node.tensor("bias"), [1, 2], hint="bias_c11")
        b.Add(b.Mul(y, scale, hint="scaled"), bias, out=node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(facts.elem_type, list(facts.shape))]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x, scale, bias = tensors["x"], tensors["scale"], tensors["bias"]
        assert x is not None and scale is not None and bias is not None
        n, c = x.shape[:2]
        g = x.astype(np.float64).reshape(n, int(args["num_groups"]), -1)
        mean = g.mean(-1, keepdims=True)
        var = ((g - mean) ** 2).mean(-1, keepdims=True)
        y = ((g - mean) / np.sqrt(var + args["eps"])).reshape(x.shape)
        return [(y * scale.reshape(1, c, 1, 1) + bias.reshape(1, c, 1, 1)).astype(x.dtype)]


PATTERNS = [LeakyReluPlugin(), ClipPlugin(), NormalizePlugin(), ReorgPlugin(),
            ResizeNearestPlugin(), FlattenConcatPlugin(), SpecialSlicePlugin(),
            BatchTilePlugin(), GroupNormPlugin()]
