"""ONNX Runtime's ``com.microsoft.nchwc`` ops (what a session at ORT_ENABLE_ALL writes for
float CNNs: its NCHWc transformer's blocked layout) back to plain NCHW standard ops.

Matches, in com.microsoft.nchwc (the schemas ONNX Runtime 1.32 registers):

- ``ReorderInput(X; channels_last=0)``: an NCHW (or NHWC) tensor into the blocked layout,
  its channels padded with zeros to a multiple of the block size B;
- ``ReorderOutput(X; channels, channels_last=0)``: back, the first ``channels`` kept;
- ``Conv(X, W, B, Sum; activation, activation_params, auto_pad, dilations, group,
  kernel_shape, pads, strides)``: ONNX's Conv on the blocked tensor, then ``+ Sum``, then the
  fused activation (Relu, LeakyRelu, Sigmoid, Tanh, Clip, HardSigmoid); W is stored
  reordered (OIHWBiBo for a blocked input, OIHWBo for a plain NCHW input or a depthwise
  Conv), its channels padded to B;
- ``MaxPool``, ``AveragePool``, ``GlobalAveragePool``: ONNX's, on the blocked tensor.

Inside the region decomposer keeps the padded channel count but the plain NCHW layout: a
blocked tensor (N, Cp, H, W) becomes the plain (N, Cp, H, W) tensor of the same values, so
the standard ops ORT left between the nchwc ones (Add, Mul, Concat of blocked tensors)
compute the same values. Before -> after::

    ReorderInput(x)              ->  Pad(x, channels to Cp, zeros)  [Transpose first if NHWC]
    ReorderOutput(x; channels)   ->  Slice(x, channels [0, channels))  [Transpose if NHWC]
    nchwc.Conv(x, W, B, Sum)     ->  act(Conv(x, unblock(W), B) + Sum)
    nchwc pools                  ->  the ONNX pools, same attributes
    nchwc.Upsample(x; scales)    ->  Resize(x, scales)

B is this machine's NCHWc block size, which ONNX Runtime picks for the CPU it runs on (16
with AVX-512, 8 with AVX2) and writes into the saved model: it is read by running one
``ReorderInput`` on the installed ONNX Runtime, as a model saved at ORT_ENABLE_ALL is only
valid where it was saved (ONNX Runtime warns so). The unblocked weights equal the originals
(the reorder moves values); the Conv sums in the standard kernel's order, so the outputs
agree with ONNX Runtime's nchwc kernels to float rounding (checked against them).

- ``Upsample(X; scales, mode, coordinate_transformation_mode)``: ONNX's Resize with those
  integer scales (nearest: the kernel's floor(y / scale)).

Refused with the reason: dynamic channel counts, weights computed at run time, an unknown
activation, Upsample scales other than [1, 1, sh, sw].

Envelope: opsets 11+ (float32); 4-D tensors; the batch and spatial dims dynamic.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import numpy as np
import onnx.numpy_helper
from onnx import TensorProto

from decomposer.builder import Builder, Value
from decomposer.checks import require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from .contrib_nhwc import CONV_NAMES, standard_attributes

NCHWC = frozenset({"com.microsoft.nchwc"})


@functools.cache
def block_size() -> int | None:
    """This machine's NCHWc block size: the channels ONNX Runtime pads 4 channels to."""
    try:
        import onnxruntime as ort
        from onnx import helper

        graph = helper.make_graph(
            [helper.make_node("ReorderInput", ["x"], ["y"], domain="com.microsoft.nchwc")],
            "probe", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 1, 1])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
        model = helper.make_model(graph, opset_imports=[
            helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft.nchwc", 1)])
        options = ort.SessionOptions()
        options.log_severity_level = 4
        session = ort.InferenceSession(model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        (y,) = session.run(None, {"x": np.ones((1, 4, 1, 1), np.float32)})
        return int(y.shape[1])
    except Exception:  # no nchwc kernels here: the block size cannot be known
        return None


def _require_block() -> int:
    block = block_size()
    if block is None:
        raise Reject("this machine's ONNX Runtime has no NCHWc kernels, so the block size "
                     "the model was saved with cannot be known")
    return block


def unblock_weights(stored: np.ndarray, block: int, blocked_input: bool) -> np.ndarray:
    """OIHWBiBo (a blocked input) or OIHWBo (a plain input, or depthwise) stored weights of
    shape (Op, I, kH, kW) back to OIHW order (the same shape)."""
    out_channels, in_channels = stored.shape[:2]
    kernel = stored.shape[2:]
    if blocked_input:
        grouped = stored.reshape(out_channels // block, in_channels // block, *kernel, block,
                                 block)
        rank = len(kernel)
        # (ob, ib, k..., bi, bo) -> (ob, bo, ib, bi, k...)
        order = [0, 3 + rank, 1, 2 + rank, *range(2, 2 + rank)]
        return grouped.transpose(order).reshape(stored.shape)
    grouped = stored.reshape(out_channels // block, in_channels, *kernel, block)
    rank = len(kernel)
    order = [0, 2 + rank, 1, *range(2, 2 + rank)]  # (ob, i, k..., bo) -> (ob, bo, i, k...)
    return grouped.transpose(order).reshape(stored.shape)


class Facts(NamedTuple):
    rank: int
    channels: int | None = None  # ReorderInput's input channels / ReorderOutput's kept
    padded: int | None = None
    weights: np.ndarray | None = None  # a Conv's unblocked weights


class _Nchwc(Pattern[Facts]):
    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        return [(TensorProto.FLOAT, [None] * facts.rank)]

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        raise NotImplementedError("checked against ONNX Runtime's nchwc kernels")


class ReorderInput(_Nchwc):
    op_type = "ReorderInput"
    forms = (Form("ReorderInput", domains=NCHWC, inputs=(In("X"),), attributes={
        "channels_last": Attr("int", default=0, choices=(0, 1))}),)
    examples = (Example((("x", F, ("N", 4, 5, 5)),), domains=(("com.microsoft.nchwc", 17),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        require_type(ctx, node.tensor("X"), "X", (TensorProto.FLOAT,))
        shape = ctx.shape(node.tensor("X"))
        if shape is None or len(shape) != 4:
            raise Reject("X must be 4-D of known rank")
        channels = shape[3] if node.args["channels_last"] else shape[1]
        if not isinstance(channels, int):
            raise Reject("the channel count must be static")
        block = _require_block()
        return Facts(4, channels, -(-channels // block) * block)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        x: str | Value = node.tensor("X")
        if node.args["channels_last"]:
            x = b.Transpose(x, [0, 3, 1, 2], hint="channels_first")
        assert facts.padded is not None and facts.channels is not None
        pads = [0] * 8
        pads[5] = facts.padded - facts.channels  # after the channels
        padded = b.pad(x, pads, 0, np.dtype(np.float32), hint="padded") if pads[5] else x
        b.op("Identity", padded, hint="blocked", out=node.outputs[0])


class ReorderOutput(_Nchwc):
    op_type = "ReorderOutput"
    forms = (Form("ReorderOutput", domains=NCHWC, inputs=(In("X"),), attributes={
        "channels": Attr("int"), "channels_last": Attr("int", default=0, choices=(0, 1))}),)
    examples = (Example((("x", F, ("N", 16, 5, 5)),), attrs={"channels": 4},
                        domains=(("com.microsoft.nchwc", 17),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        require_type(ctx, node.tensor("X"), "X", (TensorProto.FLOAT,))
        if int(node.args["channels"]) < 1:
            raise Reject("channels must be positive")
        return Facts(4, int(node.args["channels"]))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        assert facts.channels is not None
        last = bool(node.args["channels_last"])
        kept = b.Slice(node.tensor("X"), [0], [facts.channels], [1], hint="channels",
                       out=None if last else node.outputs[0])
        if last:
            b.Transpose(kept, [0, 2, 3, 1], hint="channels_last", out=node.outputs[0])


_ACTIVATIONS = ("Relu", "LeakyRelu", "Sigmoid", "Tanh", "Clip", "HardSigmoid")


class Conv(_Nchwc):
    op_type = "Conv"
    forms = (Form("Conv", domains=NCHWC, inputs=(
        In("X"), In("W"), In("B", optional=True), In("Sum", optional=True)), attributes={
            "activation": Attr("string", default=""),
            "activation_params": Attr("floats", default=()),
            "auto_pad": Attr("string", default="NOTSET",
                             choices=("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")),
            "dilations": Attr("ints", default=()), "group": Attr("int", default=1),
            "kernel_shape": Attr("ints", default=()), "pads": Attr("ints", default=()),
            "strides": Attr("ints", default=())}),)
    examples = (Example((("x", F, ("N", 16, 5, 5)),),
                        args=("x", np.zeros((16, 16, 3, 3), np.float32)),
                        attrs={"pads": [1, 1, 1, 1], "activation": "Relu"},
                        domains=(("com.microsoft.nchwc", 17),)),)

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        require_type(ctx, node.tensor("X"), "X", (TensorProto.FLOAT,))
        stored = ctx.weight(node.tensor("W"))
        if stored is None or stored.ndim != 4:
            raise Reject("W must be a 4-D initializer (the reordered weights)")
        block = _require_block()
        activation = node.args["activation"]
        activation = activation.decode() if isinstance(activation, bytes) else activation
        if activation and activation not in _ACTIVATIONS:
            raise Reject(f"activation '{activation}' is not one of {', '.join(_ACTIVATIONS)}")
        group = int(node.args["group"])
        depthwise = group > 1 and stored.shape[1] == 1
        blocked_input = not depthwise and stored.shape[1] % block == 0
        if stored.shape[0] % block or (depthwise and group % block):
            raise Reject(f"W's output channels {stored.shape[0]} are no multiple of this "
                         f"machine's block size {block}: the model was saved elsewhere")
        return Facts(4, weights=unblock_weights(stored, block, blocked_input))

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        assert facts.weights is not None
        weights = b.weight(onnx.numpy_helper.from_array(facts.weights.astype(np.float32)),
                           hint="weights")
        inputs: list[str | Value] = [node.tensor("X"), weights]
        if node.tensor("B"):
            inputs.append(node.tensor("B"))
        activation = node.args["activation"]
        activation = activation.decode() if isinstance(activation, bytes) else activation
        params = [float(p) for p in node.args["activation_params"]]
        last = not activation and not node.tensor("Sum")
        y = b.op("Conv", *inputs, hint="conv", dtype=np.float32,
                 out=node.outputs[0] if last else None,
                 **standard_attributes(node.args, CONV_NAMES))
        if node.tensor("Sum"):
            y = b.Add(y, node.tensor("Sum"), hint="summed",
                      out=None if activation else node.outputs[0])
        if not activation:
            return
        out = node.outputs[0]
        if activation == "LeakyRelu":
            b.op("LeakyRelu", y, alpha=params[0] if params else 0.01, hint="act", out=out,
                 dtype=np.float32)
        elif activation == "Clip":
            low, high = (params + [float("-inf"), float("inf")])[:2]
            b.Clip(y, np.array(low, np.float32), np.array(high, np.float32), hint="act",
                   out=out)
        elif activation == "HardSigmoid":
            alpha, beta = (params + [0.2, 0.5])[:2]
            b.op("HardSigmoid", y, alpha=alpha, beta=beta, hint="act", out=out,
                 dtype=np.float32)
        else:
            b.op(activation, y, hint="act", out=out, dtype=np.float32)


class _Pool(_Nchwc):
    standard = ""

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        require_type(ctx, node.tensor("X"), "X", (TensorProto.FLOAT,))
        return Facts(4)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        b.op(self.standard, node.tensor("X"), hint="pooled", out=node.outputs[0],
             dtype=np.float32, **standard_attributes(node.args, tuple(self.attributes_kept)))

    attributes_kept: tuple[str, ...] = ()


_POOL_ATTRIBUTES = {
    "auto_pad": Attr("string", default="NOTSET",
                     choices=("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")),
    "ceil_mode": Attr("int", default=0, choices=(0, 1)),
    "dilations": Attr("ints", default=()), "kernel_shape": Attr("ints"),
    "pads": Attr("ints", default=()), "strides": Attr("ints", default=()),
    "storage_order": Attr("int", default=0, choices=(0,))}


class MaxPool(_Pool):
    op_type = "MaxPool"
    standard = "MaxPool"
    attributes_kept = ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads",
                       "strides")
    forms = (Form("MaxPool", domains=NCHWC, inputs=(In("X"),), attributes=_POOL_ATTRIBUTES),)
    examples = (Example((("x", F, ("N", 16, 6, 6)),), attrs={"kernel_shape": [2, 2]},
                        domains=(("com.microsoft.nchwc", 17),)),)


class AveragePool(_Pool):
    op_type = "AveragePool"
    standard = "AveragePool"
    attributes_kept = ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape", "pads",
                       "strides")
    forms = (Form("AveragePool", domains=NCHWC, inputs=(In("X"),), attributes={
        **{k: v for k, v in _POOL_ATTRIBUTES.items() if k not in ("storage_order",
                                                                  "dilations")},
        "count_include_pad": Attr("int", default=0, choices=(0, 1))}),)
    examples = (Example((("x", F, ("N", 16, 6, 6)),), attrs={"kernel_shape": [2, 2]},
                        domains=(("com.microsoft.nchwc", 17),)),)


class GlobalAveragePool(_Pool):
    op_type = "GlobalAveragePool"
    standard = "GlobalAveragePool"
    forms = (Form("GlobalAveragePool", domains=NCHWC, inputs=(In("X"),)),)
    examples = (Example((("x", F, ("N", 16, 6, 6)),), domains=(("com.microsoft.nchwc", 17),)),)


class Upsample(_Nchwc):
    """``Upsample(X; scales, mode, coordinate_transformation_mode)``: what the NCHWc
    transformer makes of a Resize with integer scales (a CNN's bilinear upsampling; ORT
    1.32 leaves a nearest Resize standard). Its schema's defaults: mode ``nearest``,
    ``asymmetric``. -> ``Resize`` with those scales: linear with the same coordinate mode;
    nearest as the kernel computes it (input pixel ``floor(y / scale)``): asymmetric with
    ``nearest_mode=floor``."""

    op_type = "Upsample"
    forms = (Form("Upsample", domains=NCHWC, inputs=(In("X"),), attributes={
        "scales": Attr("ints"),
        "mode": Attr("string", default="nearest", choices=("nearest", "linear")),
        "coordinate_transformation_mode": Attr(
            "string", default="asymmetric",
            choices=("asymmetric", "half_pixel", "pytorch_half_pixel", "align_corners"))}),)
    examples = (Example((("x", F, ("N", 16, 5, 6)),),
                        attrs={"scales": [1, 1, 2, 3], "mode": "linear",
                               "coordinate_transformation_mode": "half_pixel"},
                        domains=(("com.microsoft.nchwc", 17),)),
                Example((("x", F, ("N", 16, 5, 6)),), attrs={"scales": [1, 1, 2, 2]},
                        domains=(("com.microsoft.nchwc", 11),)))

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        require_type(ctx, node.tensor("X"), "X", (TensorProto.FLOAT,))
        scales = [int(v) for v in node.args["scales"]]
        if len(scales) != 4 or scales[:2] != [1, 1] or min(scales) < 1 or max(scales) > 1024:
            raise Reject(f"scales must be [1, 1, sh, sw] with integer factors from 1 to 1024, "
                         f"got {scales}")
        return Facts(4)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        mode = str(node.args["mode"])
        attributes: dict[str, Any] = {"mode": mode}
        if mode == "nearest":
            attributes.update(coordinate_transformation_mode="asymmetric",
                              nearest_mode="floor")
        else:
            attributes["coordinate_transformation_mode"] = str(
                node.args["coordinate_transformation_mode"])
        scales = np.asarray(node.args["scales"], np.float32)
        # Resize-11/12 take roi as an input (an empty tensor); from 13 it may be absent
        roi = "" if b.opset >= 13 else b.const(np.zeros(0, np.float32), hint="roi")
        b.op("Resize", node.tensor("X"), roi, b.const(scales, hint="scales"),
             hint="upsampled", out=node.outputs[0], dtype=np.float32, **attributes)


PATTERNS = [ReorderInput(), ReorderOutput(), Conv(), MaxPool(), AveragePool(),
            GlobalAveragePool(), Upsample()]
