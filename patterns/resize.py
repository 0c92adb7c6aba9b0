"""Resize as one MatMul per resized axis with a constant matrix (``--lower Resize``, and
what ``--target-opset`` hands over for antialias and half_pixel_symmetric below 18/19).

Matches ``Resize(X, [roi], [scales], [sizes]; antialias, axes, coordinate_transformation_mode,
cubic_coeff_a, exclude_outside, extrapolation_value, keep_aspect_ratio_policy, mode,
nearest_mode)`` in the default domain where it is lowered. Semantics are ONNX's: Resize is
separable and linear in X, so resizing one axis from n to m values is X times an (n, m)
matrix, and row j of that matrix is ONNX's reference Resize of the j-th unit vector along
the axis with the node's own attributes. Every mode (nearest, linear, cubic), filter
(antialias, cubic_coeff_a, exclude_outside) and coordinate rule is ONNX's by construction,
computed once when the model is rewritten.

Before -> after (an (N, C, H, W) input resized on H and W)::

    Resize(X, scales)  ->  M_H^T @ (X @ M_W)      (another axis: moved last, X @ M, back)

Why: engines that compute antialias as plain bilinear (OpenCV, ncnn, MNN, OpenVINO, TVM:
docs/portability.md) or lack half_pixel_symmetric run MatMuls right. The sums are MatMul's
(float rounding of the same weighted sums).

Refused with the reason: scales or sizes computed at run time, a resized dim that is not
static, keep_aspect_ratio_policy other than stretch (it ties the axes together),
tf_crop_and_resize (it reads the roi), an axis whose matrix would pass 2048 x 2048.

Envelope: opsets 11+; float16/32/64 (float16 in float32); any rank; dims not resized may be
dynamic.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from decomposer.builder import Builder
from decomposer.checks import require_shape, require_type
from decomposer.examples import Example, F, f64
from decomposer.forms import Attr, Form, In, Reject
from decomposer.opsets import LOWERING_DOMAIN
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._compute import ComputeType

_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)
MATRIX_LIMIT = 1 << 22  # elements of one axis's matrix (2048 x 2048)
_ATTRIBUTES = {
    "antialias": Attr("int", default=0, choices=(0, 1)),
    "axes": Attr("ints", default=()),
    "coordinate_transformation_mode": Attr("string", default="half_pixel"),
    "cubic_coeff_a": Attr("float", default=-0.75),
    "exclude_outside": Attr("int", default=0, choices=(0, 1)),
    "extrapolation_value": Attr("float", default=0.0),
    "keep_aspect_ratio_policy": Attr("string", default="stretch", choices=("stretch",)),
    "mode": Attr("string", default="nearest", choices=("nearest", "linear", "cubic")),
    "nearest_mode": Attr("string", default="round_prefer_floor"),
}


class Facts(NamedTuple):
    elem_type: int
    rank: int
    # (axis, matrix (n, m)) per resized axis, in order
    matrices: tuple[tuple[int, np.ndarray], ...]
    shape: tuple[Any, ...]


class Resize(Pattern[Facts]):
    op_type = "Resize"
    forms = (Form("Resize", domains=frozenset({"", LOWERING_DOMAIN}),
                  inputs=(In("X"), In("roi", optional=True), In("scales", optional=True),
                          In("sizes", optional=True)), attributes=_ATTRIBUTES),)
    examples = (
        Example((("x", F, ("N", 3, 8, 12)),), args=("x", "", f64([1.0, 1.0, 0.5, 0.75])),
                attrs={"mode": "linear", "antialias": 1},
                domains=((LOWERING_DOMAIN, 17),)),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        args = node.args
        if args["coordinate_transformation_mode"] == "tf_crop_and_resize":
            raise Reject("tf_crop_and_resize reads the roi at run time: not written as "
                         "matrices")
        elem_type = require_type(ctx, node.tensor("X"), "X", _TYPES)
        shape = require_shape(ctx, node.tensor("X"), "X", "to resize it axis by axis",
                              min_rank=1)
        rank = len(shape)
        axes = [a % rank for a in (args["axes"] or range(rank))]
        scales = ctx.constant(node.tensor("scales")) if node.tensor("scales") else None
        sizes = ctx.constant(node.tensor("sizes")) if node.tensor("sizes") else None
        if (node.tensor("scales") and scales is None) or \
                (node.tensor("sizes") and sizes is None):
            raise Reject("scales or sizes are computed at run time; the matrices need them "
                         "constant")
        use_sizes = sizes is not None and sizes.size > 0
        if not use_sizes and (scales is None or scales.size == 0):
            raise Reject("neither scales nor sizes is given")
        values = np.asarray(sizes if use_sizes else scales).reshape(-1)
        if len(values) != len(axes):
            raise Reject(f"{len(values)} scales or sizes for {len(axes)} axes")
        attrs = {name: args[name] for name in ("antialias", "coordinate_transformation_mode",
                                               "cubic_coeff_a", "exclude_outside",
                                               "extrapolation_value", "mode", "nearest_mode")}
        matrices = []
        for axis, value in zip(axes, values, strict=True):
            length = shape[axis]
            scale = None if use_sizes else float(value)
            if scale == 1.0:
                continue  # an axis kept (a batch or channel axis, dynamic or not)
            if not isinstance(length, int):
                raise Reject(f"dim {axis} of X is resized but not static")
            target = int(value) if use_sizes else int(np.floor(length * float(value)))
            if target == length and use_sizes:
                continue
            if length * target > MATRIX_LIMIT:
                raise Reject(f"axis {axis} ({length} -> {target}) is too large for a matrix")
            matrices.append((axis, resize_matrix(length, target, scale, attrs)))
        return Facts(elem_type, rank, tuple(matrices), tuple(shape))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        compute = ComputeType(b, node, facts.elem_type)
        x = compute.read("X")
        assert x is not None
        rank = facts.rank
        # The last axis first (X @ M), then the one before it from the left (M^T @ X):
        # no Transpose for the two innermost axes, and a downscale shrinks X before the
        # second product. Other axes are moved last and back.
        for axis, matrix in sorted(facts.matrices, key=lambda am: -am[0]):
            if axis == rank - 1:
                x = b.MatMul(x, b.const(matrix.astype(compute.dtype),
                                        hint=f"resize_axis{axis}"), hint=f"resized{axis}")
                continue
            if axis == rank - 2:
                x = b.MatMul(b.const(np.ascontiguousarray(matrix.T).astype(compute.dtype),
                                     hint=f"resize_axis{axis}"), x, hint=f"resized{axis}")
                continue
            order = [a for a in range(rank) if a != axis] + [axis]
            x = b.Transpose(x, order, hint=f"axis{axis}_last")
            x = b.MatMul(x, b.const(matrix.astype(compute.dtype), hint=f"resize_axis{axis}"),
                         hint=f"resized{axis}")
            x = b.Transpose(x, [order.index(a) for a in range(rank)], hint=f"axis{axis}_back")
        compute.write(x, node.outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        shape = list(facts.shape)
        for axis, matrix in facts.matrices:
            shape[axis] = matrix.shape[1]
        return [(facts.elem_type, shape)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        """ONNX's reference evaluator on the node itself (not the matrices)."""
        from onnx.reference import ReferenceEvaluator

        x = tensors["X"]
        assert x is not None
        inputs, initializers = ["x"], []
        for name in ("roi", "scales", "sizes"):
            value = tensors.get(name)
            if value is None:
                inputs.append("")
            else:
                inputs.append(name)
                initializers.append(numpy_helper.from_array(np.asarray(value), name))
        attrs = dict(args)
        if not attrs["axes"]:
            del attrs["axes"]
        node = helper.make_node("Resize", inputs, ["y"], **attrs)
        elem = helper.np_dtype_to_tensor_dtype(x.dtype)
        model = helper.make_model(helper.make_graph(
            [node], "resize", [helper.make_tensor_value_info("x", elem, list(x.shape))],
            [helper.make_tensor_value_info("y", elem, None)], initializers),
            opset_imports=[helper.make_opsetid("", 19)])
        return [np.asarray(list(ReferenceEvaluator(model).run(None, {"x": x}))[0])]


def resize_matrix(length: int, target: int, scale: float | None, attrs: dict[str, Any]
                  ) -> np.ndarray:
    """(length, target): ONNX's reference Resize of each unit vector along one axis
    (float64); raises Reject when the reference refuses the attributes."""
    from onnx.reference import ReferenceEvaluator

    identity = np.eye(length, dtype=np.float64)
    inputs = ["x", "", "scales", ""] if scale is not None else ["x", "", "", "sizes"]
    initializers = [numpy_helper.from_array(np.array([1.0, scale], np.float32), "scales")] \
        if scale is not None else \
        [numpy_helper.from_array(np.array([length, target], np.int64), "sizes")]
    node = helper.make_node("Resize", inputs, ["y"], **attrs)
    model = helper.make_model(helper.make_graph(
        [node], "resize_matrix", [helper.make_tensor_value_info("x", TensorProto.DOUBLE,
                                                                [length, length])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [length, target])],
        initializers), opset_imports=[helper.make_opsetid("", 19)])
    try:
        result = list(ReferenceEvaluator(model).run(None, {"x": identity}))[0]
    except Exception as exc:  # noqa: BLE001 - the reference cannot say it either
        raise Reject(f"ONNX's reference cannot compute these attributes "
                     f"({type(exc).__name__}: {exc})") from None
    return np.asarray(result, dtype=np.float64)


PATTERNS = [Resize()]
