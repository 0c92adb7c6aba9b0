"""ONNX Runtime's com.microsoft GroupNorm and SkipGroupNorm (Stable Diffusion's UNet, as ORT's
optimizer writes it) as standard ops.

Matches, with the inputs and attributes of the schemas ONNX Runtime 1.32 registers
(``get_all_operator_schema()``; docs/ContribOperators.md). ONNX Runtime has CUDA kernels
only, so the semantics are the documented ones, checked against torch's ``F.group_norm``:
- ``GroupNorm(X, gamma, beta; groups, activation, epsilon=1e-5, channels_last=1)`` -> ``Y``:
  X is (N, H, W, C) with ``channels_last=1`` (the default), else (N, C, H, W) (any number of
  spatial dims either way); ``Y = GroupNorm(X, groups) * gamma + beta`` over each group of
  C / groups channels and all positions, then SiLU (``x * sigmoid(x)``) when
  ``activation=1`` (0: none); gamma, beta (C,).
- ``SkipGroupNorm(X, gamma, beta, skip[, bias]; same attributes)`` -> ``Y[, S]``:
  ``S = X + skip (+ bias)`` then GroupNorm of S; skip is (N, H, W, C) or (N, 1, 1, C) or
  (N, C) (broadcast over the positions), bias (C,); channels-last only, as the schema says.

Before -> after (channels last)::

    GroupNorm(x)  ->  g = Reshape(x, (N, -1, groups, C / groups))
                      y = Reshape((g - mean) / sqrt(var + eps), Shape(x)) * gamma + beta
                      (mean and var: ReduceMean over the positions and the group's channels)

Envelope: opsets 11+ (bfloat16 13+); float16/32 (computed in float32); X's rank known and its
channel dim static (the groups are a reshape); every other dim dynamic. ``--target ort``
keeps the nodes.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder
from decomposer.checks import require_broadcastable, require_shape, require_type
from decomposer.examples import Example, F
from decomposer.forms import Attr, Form, In, Reject
from decomposer.pattern import MatchContext, MatchedNode, OutputType, Pattern

from ._compute import ComputeType

MS = frozenset({"com.microsoft"})
_TYPES = (TensorProto.FLOAT16, TensorProto.FLOAT)
_ATTRIBUTES = {"groups": Attr("int"), "activation": Attr("int", choices=(0, 1)),
               "epsilon": Attr("float", default=1e-5),
               "channels_last": Attr("int", default=1, choices=(0, 1))}


class Facts(NamedTuple):
    elem_type: int
    rank: int
    channels: int
    channels_last: bool
    skip_rank: int | None  # SkipGroupNorm's skip: 2 for (N, C)


class _GroupNorm(Pattern[Facts]):
    skipped = False

    def check(self, node: MatchedNode, ctx: MatchContext) -> Facts:
        elem_type = require_type(ctx, node.tensor("X"), "X", _TYPES)
        for name in ("gamma", "beta", "skip", "bias"):
            if node.tensor(name):
                require_type(ctx, node.tensor(name), name, (elem_type,))
        shape = require_shape(ctx, node.tensor("X"), "X", "to find its channels", min_rank=3)
        last = bool(node.args["channels_last"])
        if self.skipped and not last:
            raise Reject("SkipGroupNorm takes channels-last input only (channels_last=1)")
        channels = shape[-1] if last else shape[1]
        if not isinstance(channels, int):
            raise Reject("the channel dim must be static (the groups are a reshape)")
        groups = int(node.args["groups"])
        if groups <= 0 or channels % groups:
            raise Reject(f"{channels} channels do not split into {groups} groups")
        for name in ("gamma", "beta", "bias"):
            if node.tensor(name):
                require_broadcastable(ctx, node.tensor(name), name, (channels,), "(C,)")
        skip_rank = None
        if self.skipped:
            skip = require_shape(ctx, node.tensor("skip"), "skip", "how it broadcasts")
            skip_rank = len(skip)
            if skip_rank == 2:
                if isinstance(skip[1], int) and skip[1] != channels:
                    raise Reject(f"skip (N, C) has {skip[1]} channels, X {channels}")
            else:
                require_broadcastable(ctx, node.tensor("skip"), "skip", shape, "X")
        return Facts(elem_type, len(shape), channels, last, skip_rank)

    def build(self, b: Builder, node: MatchedNode, facts: Facts) -> None:
        compute = ComputeType(b, node, facts.elem_type)
        narrow, dtype, original, read = (compute.narrow, compute.dtype, compute.original,
                                         compute.read)

        x = read("X")
        assert x is not None
        outputs = list(node.outputs) + [""]
        if self.skipped:
            skip = read("skip")
            assert skip is not None
            if facts.skip_rank == 2:  # (N, C) over every position
                skip = b.Unsqueeze(skip, list(range(1, facts.rank - 1)), hint="skip_positions")
            bias = read("bias")
            x = b.Add(x, skip, hint="x_skip",
                      out=outputs[1] if outputs[1] and not narrow and bias is None else None)
            if bias is not None:
                x = b.Add(x, bias, hint="x_skip_bias",
                          out=outputs[1] if outputs[1] and not narrow else None)
            if outputs[1] and (narrow or x != outputs[1]):
                b.Cast(x, original, out=outputs[1])
        groups = int(node.args["groups"])
        per_group = facts.channels // groups
        batch = b.Shape(x, 0, 1, hint="batch")
        if facts.channels_last:
            target = b.Concat(batch, np.array([-1, groups, per_group], np.int64), axis=0,
                              hint="grouped_shape")
            axes = [1, 3]
        else:
            target = b.Concat(batch, np.array([groups, -1], np.int64), axis=0,
                              hint="grouped_shape")
            axes = [2]
        grouped = b.Reshape(x, target, hint="grouped")
        mean = b.ReduceMean(grouped, axes, keepdims=True, hint="mean")
        centered = b.Sub(grouped, mean, hint="centered")
        variance = b.ReduceMean(b.Pow(centered, np.asarray(2.0, dtype), hint="squared"), axes,
                                keepdims=True, hint="variance")
        normalized = b.Div(centered, b.Sqrt(b.Add(variance, np.asarray(
            float(node.args["epsilon"]), dtype), hint="var_eps"), hint="std"), hint="normalized")
        y = b.Reshape(normalized, b.Shape(x, hint="x_shape"), hint="ungrouped")
        gamma, beta = read("gamma"), read("beta")
        assert gamma is not None and beta is not None
        if not facts.channels_last:  # (C,) -> (C, 1, ..., 1) against (N, C, ...)
            spatial = list(range(1, facts.rank - 1))
            gamma = b.Unsqueeze(gamma, spatial, hint="gamma_c")
            beta = b.Unsqueeze(beta, spatial, hint="beta_c")
        silu = bool(node.args["activation"])
        last_out = outputs[0] if not narrow and not silu else None
        y = b.Add(b.Mul(y, gamma, hint="scaled"), beta, hint="shifted", out=last_out)
        if silu:
            y = b.Mul(y, b.Sigmoid(y, hint="sigmoid"), hint="silu",
                      out=outputs[0] if not narrow else None)
        if narrow:
            b.Cast(y, original, out=outputs[0])

    def output_types(self, node: MatchedNode, ctx: MatchContext, facts: Facts
                     ) -> list[OutputType]:
        shape = ctx.shape(node.tensor("X"))
        dims = None if shape is None else list(shape)
        return [(facts.elem_type, dims)] * len(node.outputs)

    def compute(self, args: dict[str, Any], **tensors: np.ndarray | None
                ) -> list[np.ndarray]:
        x = tensors["X"]
        assert x is not None
        wide = x.astype(np.float64)
        if self.skipped:
            skip = tensors["skip"].astype(np.float64)  # type: ignore[union-attr]
            if skip.ndim == 2:
                skip = skip.reshape(skip.shape[0], *([1] * (x.ndim - 2)), skip.shape[1])
            wide = wide + skip
            if tensors.get("bias") is not None:
                wide = wide + tensors["bias"].astype(np.float64)  # type: ignore[union-attr]
        total = wide
        last = bool(args["channels_last"])
        channels_first = np.moveaxis(wide, -1, 1) if last else wide
        groups = int(args["groups"])
        grouped = channels_first.reshape(channels_first.shape[0], groups, -1)
        mean = grouped.mean(-1, keepdims=True)
        var = ((grouped - mean) ** 2).mean(-1, keepdims=True)
        normalized = ((grouped - mean) / np.sqrt(var + float(args["epsilon"]))).reshape(
            channels_first.shape)
        extra = [1] * (x.ndim - 2)
        gamma, beta = tensors["gamma"], tensors["beta"]
        assert gamma is not None and beta is not None
        y = normalized * gamma.astype(np.float64).reshape(-1, *extra) \
            + beta.astype(np.float64).reshape(-1, *extra)
        if args["activation"]:
            y = y / (1 + np.exp(-y))
        if last:
            y = np.moveaxis(y, 1, -1)
        return [y.astype(x.dtype)] + ([total.astype(x.dtype)] if self.skipped else [])


class GroupNorm(_GroupNorm):
    op_type = "GroupNorm"
    forms = (Form("GroupNorm", domains=MS, inputs=(In("X"), In("gamma"), In("beta")),
                  attributes=_ATTRIBUTES),)
    examples = (
        Example((("x", F, ("N", "H", "W", 8)), ("g", F, (8,)), ("b", F, (8,))),
                ((F, 4),), attrs={"groups": 4, "activation": 1},
                domains=(("com.microsoft", 17),)),
    )


class SkipGroupNorm(_GroupNorm):
    op_type = "SkipGroupNorm"
    skipped = True
    forms = (Form("SkipGroupNorm", domains=MS,
                  inputs=(In("X"), In("gamma"), In("beta"), In("skip"),
                          In("bias", optional=True)),
                  attributes=_ATTRIBUTES, outputs=(1, 2)),)
    examples = (
        Example((("x", F, ("N", "H", "W", 8)), ("g", F, (8,)), ("b", F, (8,)),
                 ("s", F, ("N", 8))), ((F, 4), (F, 4)), attrs={"groups": 2, "activation": 0},
                domains=(("com.microsoft", 17),)),
    )


PATTERNS = [GroupNorm(), SkipGroupNorm()]
