"""Deformable convolution (DCN v1/v2: ONNX DeformConv, mmcv, torchvision) as GridSample or
gathers, then MatMul.

Matches (every spelling normalizes to the same call: x, weight, offset, mask?, bias?;
strides, pads, dilations, group, offset_group):
- ONNX ``DeformConv(X, W, offset[, B][, mask]; dilations, group, kernel_shape,
  offset_group, pads, strides)`` in the default domain below opset 19 (it is standard from
  19: there only with ``--lower DeformConv``), and in any other domain;
- ``SPELLINGS`` below: mmcv/mmdeploy ``MMCVModulatedDeformConv2d`` and ``MMCVDeformConv2d``,
  ``torchvision::deform_conv2d`` (FALLTHROUGH), TensorRT OSS ``ModulatedDeformConv2d``,
  ``DCNv2`` and ``DCNv2_TRT``, each with the source its inputs and attributes were read
  from. torch's dynamo exporter writes torchvision's op as ``DeformConv``-19 (onnxscript's
  torchlib ``torchvision_deform_conv2d``), which ``--lower DeformConv`` decomposes.

Not pinned, so not matched: a 3-input ``DCNv2_TRT`` carrying the weight and bias as plugin
fields (its source could not be identified; the 4-input check refuses it with the reason),
and dlunion/tensorRTIntegrate's ``Plugin(name_s="DCNv2", info_s=<JSON>)``, a generic op
name whose arguments live in a JSON string.

Semantics (ONNX DeformConv-19, torchvision ``deform_conv2d``, mmcv ``deform_conv`` agree):
X (N, C, H, W), W (Co, C/group, kH, kW), offset (N, offset_group*2*kH*kW, Ho, Wo), mask
(N, offset_group*kH*kW, Ho, Wo), B (Co,) -> Y (N, Co, Ho, Wo). For output pixel (ho, wo),
kernel tap k = i*kW + j and offset group g (channels g*C/offset_group onwards), the sample
point is ``(ho*sH - pad_top + i*dH + offset[n, g*2K + 2k], wo*sW - pad_left + j*dW +
offset[n, g*2K + 2k + 1])`` (dy first), sampled bilinearly with zeros outside
(:mod:`._sampling`), times ``mask[n, g*K + k]``; then a grouped convolution of those
samples with W, plus B. Ho and Wo are the offset's (the exporters make them the
convolution's output size).

Two forms, the same arithmetic (the bilinear rule of :mod:`._sampling`):

- **GridSample form** (opset 16+, X float16/32; the default): every tap's sample point
  normalized as GridSample reads it with ``align_corners=0`` (``g = (2u + 1) / size - 1``;
  a point at or past -1 or the size, and NaN, to -4: zeros, as the definition has them
  exactly rather than a rounded weight on the border pixel), the offset
  groups folded into the batch, one ``GridSample(bilinear, zeros, align_corners=0)`` (ONNX
  Runtime's fast path), the mask, one batched ``MatMul``::

      DeformConv(X, W, offset, B, mask)
        ->  grid = Concat(x, y normalized)               # (N*OG, K*Ho, Wo, 2)
            cols = GridSample(Reshape(X, (N*OG, C/OG, H, W)), grid) * mask
                                                         # (N*OG, C/OG, K*Ho, Wo)
            Y    = Reshape(MatMul(W (G, Co/G, C/G*K), cols (N, G, C/G*K, Ho*Wo)) + B)

  With a static H and W the image is first zero-padded (below, right) to powers of two,
  over which the normalized coordinate of every integer and half-integer pixel is exact
  (a tap on a pixel puts no weight on its neighbour); with dynamic sizes it may put about
  1e-7 there, and any other coordinate rounds once more than the pixel coordinate
  (float32: a few 1e-6 of a pixel at 128 pixels). The columns (C*K*Ho*Wo elements, as
  im2col's) are sampled a kernel row of taps at a time with dynamic sizes or where all of
  them would exceed ``COLUMN_BUDGET``, so peak memory stays near the native kernel's, and
  each row's MatMul is added to the output.
- **Gather form** (below opset 16, float64, ``--lower GridSample``, an engine target that
  lacks GridSample, and every TensorRT target: TensorRT 10.14/11.1 miscompile
  GridSample-based deformable sampling, NVIDIA/TensorRT#4813)::

      DeformConv(X, W, offset, B, mask)
        ->  quads = 2x2 neighbourhoods of Pad(X) channels-last, one row per (n, y, x, g)
                    (._sampling.quad_rows: four shifted Slices, a Concat, a Reshape)
            y, x  = grid (CumSum over Ho, Wo) * stride - pad + tap * dilation + offset
                    # (N, OG, K, Ho, Wo); clipped to [-1, H] x [-1, W], NaN -> -1
            taps  = Gather(quads, row of floor(y), floor(x))     # (N, Ho, Wo, OG, K, 4, C/OG)
            cols  = MatMul(corner weights * mask (.., 1, 4), taps)   # (N, Ho, Wo, OG*K*C/OG)
            Y     = Transpose(MatMul(cols, W permuted to (OG*K*C/OG, Co)) + B, NCHW)

  With group > 1 the columns are k-major, split per group (a Transpose of the columns)
  and multiplied by a (group, K*C/group, Co/group) weight in one batched MatMul. The
  gathered corners are 4*N*Ho*Wo*K*C elements (four times im2col's columns), plus a quad
  table of four times the input; no chunking.

Every Reshape target is a Concat of Shape slices and constants (TVM's importer infers no
dim there, and gives a dynamic GridSample's output no shape: its sizes are read again from
the images and the grid).

Envelope: opsets 11+; 2-D only (X rank 4); X float16/32/64 (float16 is computed in
float32 and rounded once); N, H, W, Ho, Wo dynamic; C, the kernel size, group and
offset_group static (C from X or W, the kernel from ``kernel_shape`` or W). No Conv with a
computed weight, no contrib ops. Speed and memory against ONNX Runtime's DeformConv-19:
docs/performance.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.checks import FLOAT_TYPES, require_type, type_name
from decomposer.examples import TRUE, Example, F, i64
from decomposer.forms import Attr, Const, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._sampling import bilinear_sample, bilinear_zeros_reference, positions, quad_rows


class Facts(NamedTuple):
    elem_type: int  # of X and Y
    compute_type: int  # FLOAT or DOUBLE
    channels: int  # C
    kernel: tuple[int, int]  # kH, kW
    strides: tuple[int, int]
    pads: tuple[int, int]  # top, left (bottom/right only size the output, the offset's)
    dilations: tuple[int, int]
    group: int
    offset_group: int
    # sample with ONNX GridSample (opset 16+, float) rather than the quad-table gathers
    grid_sample: bool = False
    chunk_taps: int = 0  # GridSample form: kernel taps sampled and multiplied at a time
    # GridSample form with a static H, W: ((H, W), the powers of two it is zero-padded to)
    sampled_sizes: tuple[tuple[int, int], tuple[int, int]] | None = None


# The GridSample form's columns (N*C*K*Ho*Wo float32) beyond which it samples the kernel a
# row of taps at a time (or one tap), so peak memory stays near the native kernel's.
COLUMN_BUDGET = 16 << 20


def _pair(name: str) -> Any:
    """A list of 2 ints; one int (a square value) is repeated."""
    def read(value: Any) -> list[int]:
        values = [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
        if len(values) == 1:
            values = values * 2
        if len(values) != 2:
            raise Reject(f"{name} must have 2 values (2-D), got {values}")
        return values
    return read


def _pads(value: Any) -> list[int]:
    """ONNX pads (top, left, bottom, right), or one (pad_h, pad_w) pair as mmcv writes."""
    values = [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    if len(values) == 1:
        values = values * 4
    elif len(values) == 2:
        values = values * 2
    if len(values) != 4:
        raise Reject(f"pads must have 4 values (2-D), got {values}")
    return values


def _mmcv_padding(value: Any) -> list[int]:
    """mmcv's padding (pad_h, pad_w), or mmdeploy's MMCVDeformConv2d rewrite, which writes
    ``[ph, ph, pw, pw]``, -> ONNX pads (top, left, bottom, right)."""
    values = [int(v) for v in (value if isinstance(value, (list, tuple)) else [value])]
    if len(values) == 1:
        values = values * 2
    if len(values) == 4 and values[0] == values[1] and values[2] == values[3]:
        values = [values[0], values[2]]
    if len(values) != 2:
        raise Reject(f"padding must be (pad_h, pad_w) or mmdeploy's [ph, ph, pw, pw], got "
                     f"{values}")
    return values * 2


def _symmetric_only(args: dict[str, Any]) -> dict[str, Any]:
    """TensorRT's ModulatedDeformConv2d reads element 0 of stride, padding and dilation as
    the width (its kernel launcher takes W first) while exporters write height first: a
    square value means the same either way, an unequal pair is ambiguous."""
    for name in ("strides", "dilations"):
        if args[name][0] != args[name][1]:
            raise Reject(f"unequal {name} {args[name]}: TensorRT's plugin reads element 0 as "
                         f"the width, exporters write the height first; re-export with "
                         f"mmcv's MMCVModulatedDeformConv2d or ONNX DeformConv")
    if args["pads"][0] != args["pads"][1]:
        raise Reject(f"unequal padding {args['pads'][:2]}: TensorRT's plugin reads element 0 "
                     f"as the width, exporters write the height first")
    return args


def _pair_attr(default: int, arg: str, name: str) -> Attr:
    return Attr("int_or_ints", default=[default, default], arg=arg, normalize=_pair(name))


_MMCV_ATTRIBUTES = {
    "stride": _pair_attr(1, "strides", "stride"),
    "padding": Attr("int_or_ints", default=[0, 0], arg="pads", normalize=_mmcv_padding),
    "dilation": _pair_attr(1, "dilations", "dilation"),
    "groups": Attr("int", default=1, arg="group"),
    "deform_groups": Attr("int", default=1, arg="offset_group"),
}
_TRT_ATTRIBUTES = {
    "stride": _pair_attr(1, "strides", "stride"),
    "padding": Attr("int_or_ints", default=[0, 0], arg="pads", normalize=_mmcv_padding),
    "dilation": _pair_attr(1, "dilations", "dilation"),
}
_MODULATED_INPUTS = (In("x"), In("offset"), In("mask"), In("weight"), In("bias", optional=True))


def _torchvision_args(args: dict[str, Any]) -> dict[str, Any]:
    return {"strides": [args.pop("stride_h"), args.pop("stride_w")],
            "pads": [args["pad_h"], args["pad_w"], args.pop("pad_h"), args.pop("pad_w")],
            "dilations": [args.pop("dilation_h"), args.pop("dilation_w")], **args}


SPELLINGS = (
    # onnx/defs/nn/old.cc DeformConv-19: X, W, offset, B?, mask?; pads begin..., end...
    Form("DeformConv", label="DeformConv (ONNX; default domain below 19, any other)",
         inputs=(In("x"), In("weight"), In("offset"), In("bias", optional=True),
                 In("mask", optional=True)),
         attributes={
             "strides": Attr("ints", default=[1, 1], normalize=_pair("strides")),
             "pads": Attr("ints", default=[0, 0, 0, 0], normalize=_pads),
             "dilations": Attr("ints", default=[1, 1], normalize=_pair("dilations")),
             "group": Attr("int", default=1),
             "offset_group": Attr("int", default=1),
             "kernel_shape": Attr("ints", default=None, normalize=_pair("kernel_shape")),
         }),
    # mmcv/ops/modulated_deform_conv.py ModulatedDeformConv2dFunction.symbolic (mmcv::) and
    # mmdeploy/mmcv/ops/modulated_deform_conv.py (mmdeploy::): input, offset, mask, weight,
    # bias only when the module has one; stride/padding/dilation (h, w).
    Form("MMCVModulatedDeformConv2d", label="MMCVModulatedDeformConv2d (mmcv, mmdeploy; "
         "any domain)", inputs=_MODULATED_INPUTS, attributes=_MMCV_ATTRIBUTES),
    # mmcv/ops/deform_conv.py DeformConv2dFunction.symbolic: input, offset, weight; bias_i is
    # always 0 (forward asserts it), im2col_step_i is a CUDA batching knob. mmdeploy's
    # rewrite drops both and writes padding as [ph, ph, pw, pw].
    Form("MMCVDeformConv2d", label="MMCVDeformConv2d (mmcv, mmdeploy; any domain)",
         inputs=(In("x"), In("offset"), In("weight")),
         attributes={**_MMCV_ATTRIBUTES,
                     "bias": Attr("int", default=0, choices=(0,), arg="bias_attribute",
                                  doc="mmcv writes 0: no bias")},
         extra_attributes=frozenset({"im2col_step"})),
    # torchvision/csrc/ops/deform_conv2d.cpp schema, as torch's FALLTHROUGH export writes it
    # (torchvision registers no ONNX symbolic for it).
    Form("deform_conv2d", domains=frozenset({"torchvision"}),
         label="torchvision::deform_conv2d (FALLTHROUGH)",
         inputs=(In("x"), In("weight"), In("offset"), In("mask"), In("bias"),
                 *(Const(name, "int") for name in (
                     "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w")),
                 Const("group", "int"), Const("offset_group", "int"),
                 Const("use_mask", "bool")),
         convert=_torchvision_args),
    # TensorRT OSS plugin/modulatedDeformConvPlugin (README, modulatedDeformConvPlugin.cpp):
    # x, offset, mask, weight, bias?; stride/padding/dilation 2 ints, group,
    # deformable_group.
    Form("ModulatedDeformConv2d", label="ModulatedDeformConv2d (TensorRT OSS; any domain)",
         inputs=_MODULATED_INPUTS,
         attributes={**_TRT_ATTRIBUTES, "group": Attr("int", default=1),
                     "deformable_group": Attr("int", default=1, arg="offset_group")},
         convert=_symmetric_only),
    # CaoWGG/TensorRT-CenterNet readme/ctdet2onnx.md and its onnx-tensorrt importer (also
    # Kettenhoax/TensorRT-DCNv2-Plugin): input, offset, mask, weight, bias; single ints.
    Form("DCNv2", label="DCNv2 (TensorRT-CenterNet; any domain)",
         inputs=(In("x"), In("offset"), In("mask"), In("weight"), In("bias")),
         attributes={**_TRT_ATTRIBUTES, "groups": Attr("int", default=1, arg="group"),
                     "deformable_group": Attr("int", default=1, arg="offset_group")},
         convert=_symmetric_only),
    # eweill-nv/dcnv2_trt (from dlunion/tensorRTIntegrate): input, offset_mask (the raw
    # offset conv output: offset = channels [0, 2*OG*K), mask = sigmoid(the rest)), weight,
    # bias. (A 3-input DCNv2_TRT with the weight as plugin fields also circulates; its
    # source could not be pinned, and it is refused by the input count.)
    Form("DCNv2_TRT", label="DCNv2_TRT (dcnv2_trt; any domain)",
         inputs=(In("x"), In("offset_mask"), In("weight"), In("bias")),
         attributes={**_TRT_ATTRIBUTES,
                     "deformable_groups": Attr("int", default=1, arg="offset_group")},
         convert=_symmetric_only),
)


class DeformConv(Pattern[Facts]):
    """Deformable convolution in every pinned spelling (see the module docstring)."""

    op_type = "DeformConv"
    forms = SPELLINGS
    examples = (
        Example(
            (
                ("x", F, ("N", 4, "H", "W")),
                ("w", F, (6, 2, 3, 3)),
                ("off", F, ("N", 36, "h", "w")),
                ("b", F, (6,)),
                ("m", F, ("N", 18, "h", "w")),
            ),
            attrs={"group": 2, "offset_group": 2, "pads": [1, 1, 1, 1], "strides": [2, 1]},
            domains=(("custom.ops", 17), ("", 13)),
        ),
        Example(
            (
                ("x", F, ("N", 4, "H", "W")),
                ("off", F, ("N", 36, "h", "w")),
                ("m", F, ("N", 18, "h", "w")),
                ("w", F, (6, 4, 3, 3)),
            ),
            attrs={
                "stride": [1, 2],
                "padding": [1, 1],
                "dilation": [1, 1],
                "groups": 1,
                "deform_groups": 2,
            },
            domains=(("mmcv", 11), ("mmdeploy", 17)),
            op_type="MMCVModulatedDeformConv2d",
        ),
        Example(
            (("x", F, ("N", 4, "H", "W")), ("off", F, ("N", 18, "h", "w")), ("w", F, (6, 4, 3, 3))),
            attrs={
                "stride": [1, 1],
                "padding": [1, 1, 1, 1],
                "dilation": [1, 1],
                "groups": 1,
                "deform_groups": 1,
            },
            domains=(("mmdeploy", 11),),
            op_type="MMCVDeformConv2d",
        ),
        Example(
            (
                ("x", F, ("N", 4, "H", "W")),
                ("w", F, (6, 4, 3, 3)),
                ("off", F, ("N", 18, "h", "w")),
                ("m", F, ("N", 9, "h", "w")),
                ("b", F, (6,)),
            ),
            domains=(("torchvision", 13),),
            op_type="deform_conv2d",
            args=(
                "x",
                "w",
                "off",
                "m",
                "b",
                i64(1),
                i64(1),
                i64(1),
                i64(1),
                i64(1),
                i64(1),
                i64(1),
                i64(1),
                TRUE,
            ),
        ),
        Example(
            (
                ("x", F, ("N", 4, "H", "W")),
                ("off", F, ("N", 18, "h", "w")),
                ("m", F, ("N", 9, "h", "w")),
                ("w", F, (6, 4, 3, 3)),
            ),
            attrs={
                "stride": [1, 1],
                "padding": [1, 1],
                "dilation": [2, 2],
                "group": 1,
                "deformable_group": 1,
            },
            domains=(("trt", 16),),
            op_type="ModulatedDeformConv2d",
        ),
        Example(
            (
                ("x", F, ("N", 4, "H", "W")),
                ("off", F, ("N", 18, "h", "w")),
                ("m", F, ("N", 9, "h", "w")),
                ("w", F, (6, 4, 3, 3)),
                ("b", F, (6,)),
            ),
            attrs={"stride": 1, "padding": 1, "dilation": 1, "groups": 1, "deformable_group": 1},
            domains=(("", 11),),
            op_type="DCNv2",
        ),
        Example(
            (
                ("x", F, ("N", 4, "H", "W")),
                ("om", F, ("N", 27, "h", "w")),
                ("w", F, (6, 4, 3, 3)),
                ("b", F, (6,)),
            ),
            attrs={"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "deformable_groups": 1},
            domains=(("", 11),),
            op_type="DCNv2_TRT",
        ),
    )

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        args = _with_defaults(node.args)
        x, weight, offset = node.tensor("x"), node.tensor("weight"), _offset(node)
        mask, bias = _mask(node), node.tensor("bias")
        elem_type = require_type(ctx, x, "input", FLOAT_TYPES)
        for label, name in (("weight", weight), ("offset", offset), ("mask", mask),
                            ("bias", bias)):
            if name and ctx.elem_type(name) not in (None, elem_type):
                raise Reject(f"{label} '{name}' is {type_name(ctx.elem_type(name))}; it "
                             f"must have the input's type, {type_name(elem_type)}")
        x_shape, w_shape = ctx.shape(x), ctx.shape(weight)
        o_shape = ctx.shape(offset)
        for label, name, shape in (("input", x, x_shape), ("weight", weight, w_shape),
                                   ("offset", offset, o_shape),
                                   ("mask", mask, ctx.shape(mask) if mask else None)):
            if shape is not None and len(shape) != 4:
                raise Reject(f"{label} '{name}' must have rank 4 (2-D deformable "
                             f"convolution), got rank {len(shape)}")
        group, offset_group = int(args["group"]), int(args["offset_group"])
        if group < 1 or offset_group < 1:
            raise Reject(f"group ({group}) and offset_group ({offset_group}) must be >= 1")
        kernel = _static_kernel(args.get("kernel_shape"), w_shape)
        channels = _static_channels(x_shape, w_shape, group)
        for label, count in (("group", group), ("offset_group", offset_group)):
            if channels % count:
                raise Reject(f"{label} {count} does not divide the {channels} input channels")
        if w_shape is not None and isinstance(w_shape[0], int) and w_shape[0] % group:
            raise Reject(f"group {group} does not divide the {w_shape[0]} output channels")
        taps = kernel[0] * kernel[1]
        if node.tensor("offset_mask"):
            _check_channels("offset_mask", offset, o_shape, 3 * offset_group * taps,
                            f"3 * offset_group ({offset_group}) * kH*kW ({taps})")
        else:
            _check_channels("offset", offset, o_shape, 2 * offset_group * taps,
                            f"2 * offset_group ({offset_group}) * kH*kW ({taps})")
        if mask:
            _check_channels("mask", mask, ctx.shape(mask), offset_group * taps,
                            f"offset_group ({offset_group}) * kH*kW ({taps})")
        if bias:
            b_shape = ctx.shape(bias)
            out_channels = w_shape[0] if w_shape is not None else None
            if b_shape is None or len(b_shape) != 1 or (
                    isinstance(b_shape[0], int) and isinstance(out_channels, int)
                    and b_shape[0] != out_channels):
                raise Reject(f"bias '{bias}' must be 1-D with the weight's {out_channels} "
                             f"output channels, got shape "
                             f"{'unknown' if b_shape is None else list(b_shape)}")
        strides, dilations = args["strides"], args["dilations"]
        if min(strides) < 1 or min(dilations) < 1:
            raise Reject(f"strides {strides} and dilations {dilations} must be >= 1")
        compute = TensorProto.DOUBLE if elem_type == TensorProto.DOUBLE else TensorProto.FLOAT
        grid_sample = _samples_with_grid_sample(ctx, compute)
        return Facts(elem_type, compute, channels, kernel, tuple(strides),
                     tuple(args["pads"][:2]), tuple(dilations), group, offset_group,
                     grid_sample, _chunk_taps(x_shape, o_shape, channels, kernel)
                     if grid_sample else 0, _powers_of_two(x_shape) if grid_sample else None)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        if facts.grid_sample:
            build_deform_conv_grid_sample(b, node, facts)
        else:
            build_deform_conv(b, node, facts)

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        x_shape, w_shape = ctx.shape(node.tensor("x")), ctx.shape(node.tensor("weight"))
        o_shape = ctx.shape(_offset(node))
        return [(facts.elem_type, [x_shape[0] if x_shape else None,
                                   w_shape[0] if w_shape else None,
                                   *(o_shape[2:] if o_shape else (None, None))])]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        args = _with_defaults(args)
        x, weight = tensors["x"], tensors["weight"]
        offset, mask = tensors.get("offset"), tensors.get("mask")
        offset_mask = tensors.get("offset_mask")
        if offset_mask is not None:  # DCNv2_TRT: offset, then the mask's logits
            split = offset_mask.shape[1] * 2 // 3
            offset = offset_mask[:, :split]
            mask = (1 / (1 + np.exp(-offset_mask[:, split:].astype(np.float64)))).astype(
                offset_mask.dtype)
        if not args.get("use_mask", True):
            mask = None
        assert x is not None and weight is not None and offset is not None
        return [deform_conv_reference(x, weight, offset, tensors.get("bias"),
                                      mask, args["strides"], args["pads"],
                                      args["dilations"], int(args["group"]),
                                      int(args["offset_group"]))]


def _with_defaults(args: dict[str, Any]) -> dict[str, Any]:
    """Arguments a spelling does not write: one group, one offset group, the kernel from W,
    a mask when one is given."""
    return {"group": 1, "offset_group": 1, "kernel_shape": None, "use_mask": True, **args}


def _samples_with_grid_sample(ctx: MatchContext, compute_type: int) -> bool:
    """The GridSample form: opset 16+, computed in float32 (ONNX Runtime has no float64
    GridSample before 20), GridSample neither lowered nor lacked by a target engine, and no
    TensorRT target (NVIDIA/TensorRT#4813: GridSample-based deformable sampling
    miscompiles in TensorRT 10.14/11.1)."""
    return (ctx.opset >= 16 and compute_type == TensorProto.FLOAT
            and "GridSample" not in ctx.avoid
            and not any(engine.startswith("tensorrt") for engine in ctx.engines))


def _entry(b: Builder, values: Value | np.ndarray, index: int, hint: str) -> Value | np.ndarray:
    """Entry ``index`` of a (2,) vector, as a (1,) constant or a Gather."""
    if isinstance(values, np.ndarray):
        return values[index:index + 1]
    return b.Gather(values, [index], axis=0, hint=hint)


def _powers_of_two(x_shape: Any) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """With a static H and W, the powers of two at or above them: over an image of such a
    size, GridSample's normalized coordinates are exact for every integer and half-integer
    pixel, so a tap on a pixel puts no rounded weight on its neighbour (ONNX's backend case
    ``test_basic_deform_conv_with_padding`` expects exact zeros there). Dynamic sizes stay
    as they are (a computed Pad is a TVM gap): there a tap on a pixel may put a weight of
    about 1e-7 on its neighbour."""
    height, width = x_shape[2:] if x_shape else (None, None)
    if not (isinstance(height, int) and isinstance(width, int) and height > 0 and width > 0):
        return None
    return (height, width), (1 << (height - 1).bit_length(), 1 << (width - 1).bit_length())


def _chunk_taps(x_shape: Any, o_shape: Any, channels: int, kernel: tuple[int, int]) -> int:
    """Taps per GridSample: every tap where the columns fit COLUMN_BUDGET, else a kernel row,
    else one. With a dynamic N, Ho or Wo, a kernel row: memory stays bounded at every size,
    for some speed where the columns are small (docs/performance.md)."""
    taps = kernel[0] * kernel[1]
    sizes = [x_shape[0] if x_shape else None, *(o_shape[2:] if o_shape else (None, None))]
    if not all(isinstance(size, int) for size in sizes):
        return kernel[1]
    pixels = int(np.prod(sizes))
    for chunk in (taps, kernel[1]):
        if pixels * channels * chunk * 4 <= COLUMN_BUDGET:
            return chunk
    return 1


def _offset(node: MatchedNode) -> str:
    """The offset input (DCNv2_TRT: the offset-and-mask input)."""
    return node.tensor("offset") or node.tensor("offset_mask")


def _mask(node: MatchedNode) -> str:
    """The mask input, "" when there is none (torchvision: ``use_mask`` false)."""
    return node.tensor("mask") if node.args.get("use_mask", True) else ""


def _static_kernel(kernel_shape: list[int] | None, w_shape: Any) -> tuple[int, int]:
    from_weight = tuple(w_shape[2:]) if w_shape is not None else (None, None)
    if kernel_shape is not None:
        for given, known in zip(kernel_shape, from_weight, strict=True):
            if isinstance(known, int) and known != given:
                raise Reject(f"kernel_shape {kernel_shape} does not match the weight's "
                             f"{list(from_weight)}")
        return int(kernel_shape[0]), int(kernel_shape[1])
    if all(isinstance(d, int) for d in from_weight):
        return int(from_weight[0]), int(from_weight[1])
    raise Reject("the kernel size must be static: give the weight a static shape (an "
                 "initializer) or kernel_shape")


def _static_channels(x_shape: Any, w_shape: Any, group: int) -> int:
    x_channels = x_shape[1] if x_shape is not None else None
    per_group = w_shape[1] if w_shape is not None else None
    if isinstance(x_channels, int) and isinstance(per_group, int) \
            and x_channels != per_group * group:
        raise Reject(f"the input has {x_channels} channels but the weight takes {per_group} "
                     f"per group x {group} groups")
    if isinstance(x_channels, int):
        return x_channels
    if isinstance(per_group, int):
        return per_group * group
    raise Reject("the input channel count must be static (from the input's or the weight's "
                 "shape)")


def _check_channels(label: str, name: str, shape: Any, expected: int, why: str) -> None:
    if shape is not None and isinstance(shape[1], int) and shape[1] != expected:
        raise Reject(f"{label} '{name}' has {shape[1]} channels; expected {expected} = {why}")


# -- the decomposition --------------------------------------------------------------------


def _reader(b: Builder, facts: Facts) -> Callable[[str, str], Value]:
    """Reads an input of the node's type in the computation type (float16 -> float32)."""
    dtype = numpy_dtype(facts.compute_type)

    def computed(name: str, hint: str) -> Value:
        value = b.input(name, numpy_dtype(facts.elem_type))
        return b.Cast(value, dtype, hint=f"{hint}_compute") \
            if facts.elem_type != facts.compute_type else value
    return computed


def _sampling_inputs(b: Builder, node: MatchedNode, facts: Facts,
                     computed: Callable[[str, str], Value]
                     ) -> tuple[Value, Value, Value | None]:
    """(x, offset, mask or None), each in the computation type; DCNv2_TRT's offset-and-mask
    input split into the offset and the sigmoid of the mask logits."""
    x = computed(node.tensor("x"), "x")
    offset = computed(_offset(node), "offset")
    mask: Value | None = computed(_mask(node), "mask") if _mask(node) else None
    if node.tensor("offset_mask"):  # channels [0, 2*OG*K): offset; the rest: mask logits
        count = facts.offset_group * facts.kernel[0] * facts.kernel[1]
        mask = b.Sigmoid(b.Slice(offset, [2 * count], [3 * count], [1], hint="mask_logits"),
                         hint="mask_sigmoid")
        offset = b.Slice(offset, [0], [2 * count], [1], hint="offset_part")
    return x, offset, mask


def build_deform_conv(b: Builder, node: MatchedNode, facts: Facts) -> None:
    dtype = numpy_dtype(facts.compute_type)
    narrow = facts.elem_type != facts.compute_type
    kh, kw = facts.kernel
    taps = kh * kw
    og, group, channels = facts.offset_group, facts.group, facts.channels

    computed = _reader(b, facts)
    x, offset, mask = _sampling_inputs(b, node, facts, computed)
    image = quad_rows(b, x, channels, og, dtype)

    # Sample points: (N, OG, K, Ho, Wo); every shape is the offset's own dims or a constant
    # (TVM cannot broadcast Ho*Wo computed two ways against each other), and the point
    # math broadcasts over whole rows of Wo.
    out_sizes = b.Shape(offset, 2, 4, hint="out_sizes")  # Ho, Wo
    batch = b.Shape(x, 0, 1, hint="batch_size")
    (sh, sw), (pt, pl), (dh, dw) = facts.strides, facts.pads, facts.dilations
    rows_h, cols_w = (positions(b, out_sizes, axis, dtype, hint=f"out_{name}")
                      for axis, name in enumerate("yx"))  # (Ho, Wo) each
    tap_y = (np.arange(taps) // kw * dh).astype(dtype).reshape(taps, 1, 1)
    tap_x = (np.arange(taps) % kw * dw).astype(dtype).reshape(taps, 1, 1)
    point_y = b.Unsqueeze(rows_h * float(sh) - float(pt), [0], hint="base_y") + tap_y
    point_x = b.Unsqueeze(cols_w * float(sw) - float(pl), [0], hint="base_x") + tap_x
    # (K, Ho, Wo) each

    # offset (N, OG*K*2, Ho, Wo): dy at channel (g*K + k)*2, dx at +1: two strided Slices
    # (a 6-D Split is beyond LiteRT's 5-D SLICE kernel after onnx2tf's flatbuffer_direct)
    dy, dx = (b.Slice(offset, [start], [2**62], [1], [2], hint=f"offset_{name}")
              for start, name in ((0, "y"), (1, "x")))  # (N, OG*K, Ho, Wo) each
    per_point_shape = b.Concat(batch, np.asarray([og, taps]), out_sizes, axis=0,
                               hint="points_shape")

    def per_point(value: Value, hint: str) -> Value:  # -> (N, OG, K, Ho, Wo)
        return b.Reshape(value, per_point_shape, hint=hint)

    y = per_point(dy, "dy") + point_y
    x_coord = per_point(dx, "dx") + point_x
    scale = per_point(mask, "modulation") if mask is not None else None

    # Row of pixel (-1, -1) of each sample's image and offset group: (N, OG, 1, 1, 1).
    image_index = positions(b, batch, 0, np.dtype(np.int64), hint="batch_index")  # (N,)
    base = b.Unsqueeze(image_index, [1, 2, 3, 4], hint="image_row") * image.image_stride \
        + np.arange(og, dtype=np.int64).reshape(1, og, 1, 1, 1)
    # Group 1: taps gathered in (N, Ho, Wo, OG, K) order, columns (N, Ho, Wo, OG*K*C/OG)
    # and the weight's rows permuted to match (weight-sized work, folded when W is
    # constant). Groups: (N, Ho, Wo, K, OG), columns k-major, split per group below.
    per_group = channels // group
    perm = [0, 3, 4, 1, 2] if group == 1 else [0, 3, 4, 2, 1]
    sample_dims: list[Value | np.ndarray] = [
        batch, out_sizes, np.asarray([og, taps] if group == 1 else [taps, og])]
    cols = bilinear_sample(b, image, y, x_coord, base, scale, sample_dims, hint="tap",
                           perm=perm)

    weight = computed(node.tensor("weight"), "weight")
    out_channels = b.Shape(weight, 0, 1, hint="out_channels")
    # Every Reshape target below is a Concat of Shape slices and constants, with no 0 or -1
    # to infer: TVM's importer (dynamic shapes) cannot infer a dim of the summed gathers.
    final = None if narrow else node.outputs[0]  # the last op writes the output
    if group == 1:
        cols = b.Reshape(cols, b.Concat(batch, out_sizes, np.asarray([taps * channels]),
                                        axis=0, hint="columns_shape"),
                         hint="columns")  # (N, Ho, Wo, OG*K*Cg)
        # W (Co, OG*Cg, kH, kW) -> (OG*K*Cg, Co); perm[0] stays 0 (onnx2tf rebuilds other
        # perms by matching dim sizes, and C == Co is common)
        w_view = b.Reshape(weight, [1, -1, og, channels // og, taps], hint="weight_view")
        w_matrix = b.Reshape(b.Transpose(w_view, [0, 2, 4, 3, 1], hint="weight_gkc"),
                             [taps * channels, -1], hint="weight_matrix")
        y_out = b.MatMul(cols, w_matrix, hint="conv")  # (N, Ho, Wo, Co)
        if node.tensor("bias"):
            y_out = y_out + computed(node.tensor("bias"), "bias")
        y_nchw = b.Transpose(y_out, [0, 3, 1, 2], hint="channels_first", out=final)
    else:
        cols = b.Reshape(cols, b.Concat(batch, out_sizes, np.asarray([taps, group, per_group]),
                                        axis=0, hint="columns_shape"),
                         hint="columns")  # (N, Ho, Wo, K, G, C/G)
        cols = b.Transpose(cols, [0, 4, 1, 2, 3, 5], hint="columns_by_group")
        cols = b.Reshape(cols, b.Concat(batch, np.asarray([group]), out_sizes,
                                        np.asarray([taps * per_group]), axis=0,
                                        hint="group_columns_shape"),
                         hint="group_columns")  # (N, G, Ho, Wo, K*C/G)
        w_groups = b.Reshape(weight, [group, -1, per_group, taps], hint="weight_groups")
        w_matrix = b.Reshape(b.Transpose(w_groups, [0, 3, 2, 1], hint="weight_gkc"),
                             [group, 1, taps * per_group, -1], hint="weight_matrix")
        y_out = b.MatMul(cols, w_matrix, hint="conv")  # (N, G, Ho, Wo, Co/G)
        if node.tensor("bias"):
            bias = computed(node.tensor("bias"), "bias")
            y_out = y_out + b.Reshape(bias, [group, 1, 1, -1], hint="bias_groups")
        y_out = b.Transpose(y_out, [0, 1, 4, 2, 3], hint="channels_first")  # (N,G,Co/G,Ho,Wo)
        y_nchw = b.Reshape(y_out, b.Concat(batch, out_channels, out_sizes, axis=0,
                                           hint="out_shape"), hint="y_groups", out=final)
    if narrow:
        b.Cast(y_nchw, facts.elem_type, out=node.outputs[0])


def build_deform_conv_grid_sample(b: Builder, node: MatchedNode, facts: Facts) -> None:
    """The GridSample form (module docstring): the offset groups folded into the batch, one
    GridSample of every tap's points, the mask, one batched MatMul."""
    dtype = numpy_dtype(facts.compute_type)
    narrow = facts.elem_type != facts.compute_type
    kh, kw = facts.kernel
    taps = kh * kw
    og, group, channels = facts.offset_group, facts.group, facts.channels

    computed = _reader(b, facts)
    x, offset, mask = _sampling_inputs(b, node, facts, computed)

    out_sizes = b.Shape(offset, 2, 4, hint="out_sizes")  # Ho, Wo
    batch = b.Shape(x, 0, 1, hint="batch_size")
    image_sizes = b.Cast(b.Shape(x, 2, 4, hint="image_sizes"), dtype, hint="image_sizes_f")
    sampled: Value | np.ndarray = image_sizes  # the sizes GridSample normalizes by
    if facts.sampled_sizes is not None:  # static H, W: zeros below and right, to powers of 2
        (height, width), (high, wide) = facts.sampled_sizes
        sampled = np.asarray([high, wide], dtype)
        if (high, wide) != (height, width):
            x = b.Pad(x, [0, 0, 0, 0, 0, 0, high - height, wide - width], np.asarray(0, dtype),
                      hint="image_pow2")
    # GridSample (align_corners=0) reads pixel u at g = (2u + 1) / size - 1: g = u * a + c
    step: Value | np.ndarray
    shift: Value | np.ndarray
    if isinstance(sampled, np.ndarray):  # powers of two: 2/P, 1/P - 1 are exact
        step, shift = (np.asarray(2, dtype) / sampled).astype(dtype), \
            (np.asarray(1, dtype) / sampled - np.asarray(1, dtype)).astype(dtype)
    else:
        step = b.Div(np.asarray(2, dtype), sampled, hint="steps")  # (2,): 2/H, 2/W
        shift = b.Div(np.asarray(1, dtype), sampled, hint="shifts") - np.asarray(1, dtype)
    (sh, sw), (pt, pl), (dh, dw) = facts.strides, facts.pads, facts.dilations
    rows_h, cols_w = (positions(b, out_sizes, axis, dtype, hint=f"out_{name}")
                      for axis, name in enumerate("yx"))  # (Ho, Wo) each
    tap_y = (np.arange(taps) // kw * dh).astype(dtype).reshape(taps, 1, 1)
    tap_x = (np.arange(taps) % kw * dw).astype(dtype).reshape(taps, 1, 1)
    per_point_shape = b.Concat(batch, np.asarray([og, taps]), out_sizes, axis=0,
                               hint="points_shape")
    normalized = []
    for axis, (name, rows, stride, pad, tap) in enumerate(
            (("y", rows_h, sh, pt, tap_y), ("x", cols_w, sw, pl, tap_x))):
        # (K, Ho, Wo): the tap's pixel coordinate without offset
        base = b.Unsqueeze(rows * float(stride) - float(pad), [0], hint=f"base_{name}") + tap
        # offset (N, OG*K*2, Ho, Wo): dy at channel (g*K + k)*2, dx at +1
        delta = b.Slice(offset, [axis], [2**62], [1], [2], hint=f"offset_{name}")
        point = b.Reshape(delta, per_point_shape, hint=f"d{name}") + base  # (N, OG, K, Ho, Wo)
        # A point at or beyond -1 or the size samples zeros: it goes to -4, far outside,
        # where a normalized -1 - 1/size would round back to just inside the border
        # pixel; NaN fails both tests and goes there too.
        size = b.Gather(image_sizes, [axis], axis=0, hint=f"size_{name}")
        inside = b.And(b.Greater(point, np.asarray(-1, dtype)), b.Less(point, size),
                       hint=f"inside_{name}")
        point = b.Where(inside, point, np.asarray(-4, dtype), hint=f"point_{name}")
        normalized.append(point * _entry(b, step, axis, f"step_{name}")
                          + _entry(b, shift, axis, f"shift_{name}"))
    wo = b.Shape(offset, 3, 4, hint="out_width")  # a Shape slice (TVM folds no Gather)
    images = x
    if og > 1:  # offset group g's channels as an image of its own: batch n*OG + g
        images = b.Reshape(x, b.Concat(np.asarray([-1, channels // og]),
                                       b.Shape(x, 2, 4, hint="image_hw"), axis=0,
                                       hint="groups_shape"), hint="offset_groups")
    image_count = b.Shape(images, 0, 1, hint="images")  # N*OG
    per_group = channels // group
    # Ho*Wo read back from a flat tensor of that size, not inferred by -1 (TVM gives a
    # dynamic GridSample's output no shape, and then infers no dim from it)
    out_pixels = b.Shape(b.Reshape(rows_h, [-1], hint="out_pixels"), hint="out_pixel_count")
    weight = computed(node.tensor("weight"), "weight")
    w_taps = b.Reshape(weight, [-1, per_group, taps], hint="weight_taps")  # (Co, C/G, K)
    modulation = b.Reshape(mask, per_point_shape, hint="modulation") \
        if mask is not None else None  # (N, OG, K, Ho, Wo)
    y_out: Value | None = None
    for first in range(0, taps, facts.chunk_taps):
        last = min(first + facts.chunk_taps, taps)
        chunk = last - first
        # (N, OG, K', Ho, Wo, 2) as GridSample's (x, y); sliced at rank 5 (LiteRT's limit)
        part = b.Concat(*(b.Unsqueeze(b.Slice(point, [first], [last], [2], hint="grid_taps")
                                      if chunk < taps else point, [5], hint="grid_axis")
                          for point in reversed(normalized)), axis=5, hint="grid")
        part = b.Reshape(part, b.Concat(batch, np.asarray([og, -1]), wo, np.asarray([2]),
                                        axis=0, hint="grid_rows_shape"),
                         hint="grid_rows")  # (N, OG, K'*Ho, Wo, 2)
        part = b.Reshape(part, b.Concat(image_count, b.Shape(part, 2, 5), axis=0,
                                        hint="grid_batch_shape"),
                         hint="grid_batch")  # (N*OG, K'*Ho, Wo, 2)
        cols = b.GridSample(images, part, mode="linear", padding_mode="zeros",
                            align_corners=False, hint="taps")  # (N*OG, C/OG, K'*Ho, Wo)
        # the same sizes again, read from the images and the grid: TVM gives a dynamic
        # GridSample's output no shape, and then neither broadcasts nor reshapes it
        rows_cols = b.Shape(part, 1, 3, hint="grid_sizes")
        cols = b.Reshape(cols, b.Concat(image_count, np.asarray([channels // og]), rows_cols,
                                        axis=0, hint="taps_shape"), hint="taps_shaped")
        if modulation is not None:
            scale = b.Slice(modulation, [first], [last], [2], hint="modulation_taps") \
                if chunk < taps else modulation
            cols = cols * b.Reshape(scale, b.Concat(image_count, np.asarray([1]), rows_cols,
                                                    axis=0, hint="modulation_shape"),
                                    hint="modulation_rows")
        # (N, G, C/G*K', Ho*Wo): channel c = g*C/G + c', tap k, as W (Co, C/G, kH, kW) has them
        cols = b.Reshape(cols, b.Concat(batch, np.asarray([group, per_group * chunk]),
                                        out_pixels, axis=0, hint="columns_shape"),
                         hint="columns")
        w_part = b.Slice(w_taps, [first], [last], [2], hint="weight_chunk") \
            if chunk < taps else w_taps
        w_matrix = b.Reshape(w_part, [group, -1, per_group * chunk], hint="weight_matrix")
        product = b.MatMul(w_matrix, cols, hint="conv")  # (N, G, Co/G, Ho*Wo)
        y_out = product if y_out is None else y_out + product
    assert y_out is not None
    if node.tensor("bias"):
        bias = computed(node.tensor("bias"), "bias")
        y_out = y_out + b.Reshape(bias, [group, -1, 1], hint="bias_groups")
    out_channels = b.Shape(weight, 0, 1, hint="out_channels")
    final = None if narrow else node.outputs[0]
    y_nchw = b.Reshape(y_out, b.Concat(batch, out_channels, out_sizes, axis=0,
                                       hint="out_shape"), hint="y", out=final)
    if narrow:
        b.Cast(y_nchw, facts.elem_type, out=node.outputs[0])


# -- numpy reference ----------------------------------------------------------------------


def deform_conv_reference(x: np.ndarray, weight: np.ndarray, offset: np.ndarray,
                          bias: np.ndarray | None, mask: np.ndarray | None,
                          strides: list[int], pads: list[int], dilations: list[int],
                          group: int, offset_group: int) -> np.ndarray:
    """Deformable convolution from the definition, in float64, rounded to x's dtype."""
    n_batch, channels = x.shape[:2]
    out_channels, per_group, kh, kw = weight.shape
    _, _, ho, wo = offset.shape
    taps = kh * kw
    per_offset_group = channels // offset_group
    tap_y = np.repeat(np.arange(kh) * dilations[0], kw)  # tap k = i*kW + j
    tap_x = np.tile(np.arange(kw) * dilations[1], kh)
    grid_y = tap_y[:, None, None] + (np.arange(ho) * strides[0] - pads[0])[None, :, None]
    grid_x = tap_x[:, None, None] + (np.arange(wo) * strides[1] - pads[1])[None, None, :]
    out = np.zeros((n_batch, out_channels, ho, wo), np.float64)
    for n in range(n_batch):
        cols = np.zeros((channels, taps, ho, wo), np.float64)
        for g in range(offset_group):
            o = offset[n, g * 2 * taps:(g + 1) * 2 * taps].astype(np.float64)
            y = grid_y + o[0::2]  # (K, Ho, Wo)
            xs = grid_x + o[1::2]
            lo = g * per_offset_group
            samples = bilinear_zeros_reference(x[n, lo:lo + per_offset_group], y, xs)
            if mask is not None:
                samples = samples * mask[n, g * taps:(g + 1) * taps].astype(np.float64)
            cols[lo:lo + per_offset_group] = samples
        for gi in range(group):
            w = weight[gi * (out_channels // group):(gi + 1) * (out_channels // group)]
            c = cols[gi * per_group:(gi + 1) * per_group].reshape(per_group * taps, -1)
            out[n, gi * (out_channels // group):(gi + 1) * (out_channels // group)] = \
                (w.reshape(w.shape[0], -1).astype(np.float64) @ c).reshape(-1, ho, wo)
    if bias is not None:
        out += bias.astype(np.float64)[None, :, None, None]
    return out.astype(x.dtype)


PATTERNS = [DeformConv()]
