"""The portability rules: what a portable decomposition must not contain, and why.

In: a model, usually the output of ``decompose(..., target="portable")``. Out:
:func:`violations`, one line per node that breaks a rule (node, rule, how), subgraphs
included; :data:`RULES`, every rule with the engine and failure it avoids; and
:func:`rules_table`, the markdown table ``docs/portability.md`` holds (generated, tested).

Each rule was learnt from an engine that broke (measured here unless marked otherwise).
Rules with a ``check`` are enforced on every case the pattern test kit
(:func:`decomposer.testing.check_pattern`) and ``tests/test_portability.py`` decompose;
the others are reviewed by hand and the engine runs catch them. ``speed`` rules keep
portable forms fast on ONNX Runtime; breaking them is slow, not wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from decomposer.graphs import norm_domain, opset_map, subgraphs

__all__ = ["RULES", "Rule", "rules_table", "violations"]


@dataclass
class _Facts:
    """What the checks may look up about one graph: constant values, initializer names
    (this graph and the enclosing ones), producers, inferred element types and ranks, and
    the default-domain opset."""

    constants: dict[str, np.ndarray]
    initializers: set[str]
    producers: dict[str, onnx.NodeProto]
    elem_types: dict[str, int]
    ranks: dict[str, int]
    opset: int


Check = Callable[[onnx.NodeProto, _Facts], "str | None"]


@dataclass(frozen=True)
class Rule:
    """One rule: what to do, which engine broke and how, and the static check if any."""

    do: str
    why: str
    check: Check | None = field(default=None, compare=False)
    speed: bool = False  # a speed rule: breaking it is slow on ONNX Runtime, not wrong


# -- checks --------------------------------------------------------------------------------


def _standard_domain(node: onnx.NodeProto, facts: _Facts) -> str | None:
    return f"non-standard domain '{node.domain}'" if norm_domain(node.domain) else None


def _static_conv_weight(node: onnx.NodeProto, facts: _Facts) -> str | None:
    if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1 \
            and node.input[1] not in facts.initializers:
        # QDQ's quantized weight (DequantizeLinear of a constant) is the form the int8
        # engines read as a weight
        producer = facts.producers.get(node.input[1])
        if producer is not None and producer.op_type == "DequantizeLinear" and \
                norm_domain(producer.domain) == "" and (
                    producer.input[0] in facts.initializers or
                    producer.input[0] in facts.constants):
            return None
        return f"weight '{node.input[1]}' is computed at run time"
    return None


def _no_negative_step(node: onnx.NodeProto, facts: _Facts) -> str | None:
    if node.op_type == "Slice" and len(node.input) > 4 and node.input[4]:
        steps = facts.constants.get(node.input[4])
        if steps is None or (steps < 0).any():
            return "negative or unknown steps"
    return None


def _no_fold_barrier(node: onnx.NodeProto, facts: _Facts) -> str | None:
    if node.op_type == "Concat":
        for name in node.input:
            value = facts.constants.get(name)
            if value is not None and value.size == 0:
                return "concatenates an empty constant"
    if node.op_type == "Slice" and len(node.input) >= 3:
        starts, ends = facts.constants.get(node.input[1]), facts.constants.get(node.input[2])
        if starts is not None and ends is not None and starts.shape == ends.shape \
                and (starts == ends).any():
            return "an empty slice (a constant-folding barrier)"
    return None


# ops a Reshape target may pass through on its way from Shape and constants
_SHAPE_PLUMBING = {"Shape", "Concat", "Gather", "Slice", "Squeeze", "Unsqueeze", "Cast",
                   "Identity", "Constant"}
_SIZE_ARITHMETIC = {"Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Max", "Min",
                    "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin", "Where"}


def _reshape_target_from_shape(node: onnx.NodeProto, facts: _Facts) -> str | None:
    if node.op_type != "Reshape" or len(node.input) < 2 or node.input[1] in facts.constants:
        return None
    pending, seen = [node.input[1]], set()
    while pending:
        name = pending.pop()
        if name in seen or name in facts.constants or name in facts.initializers:
            continue
        seen.add(name)
        producer = facts.producers.get(name)
        if producer is None or norm_domain(producer.domain):
            continue  # a graph input (a size the caller gives) is not arithmetic
        if producer.op_type in _SIZE_ARITHMETIC:
            if all(i in facts.constants for i in producer.input if i):
                continue  # folds to a constant
            return (f"target '{node.input[1]}' is computed by {producer.op_type} "
                    f"'{producer.name}' (arithmetic on sizes)")
        if producer.op_type in _SHAPE_PLUMBING and producer.op_type != "Shape":
            pending.extend(i for i in producer.input if i)
    return None


def _sorted_top_k(node: onnx.NodeProto, facts: _Facts) -> str | None:
    if node.op_type == "TopK" and any(a.name == "sorted" and a.i == 0 for a in node.attribute):
        return "sorted=0"
    return None


def _ascending_range(node: onnx.NodeProto, facts: _Facts) -> str | None:
    if node.op_type == "Range" and len(node.input) == 3:
        delta = facts.constants.get(node.input[2])
        if delta is not None and (delta < 0).any():
            return "a descending Range (build (n - 1) - Range(0, n, 1) instead)"
    return None


def _integer_run_time_range(node: onnx.NodeProto, facts: _Facts) -> str | None:
    if node.op_type != "Range" or all(name in facts.constants for name in node.input):
        return None
    elem_type = facts.elem_types.get(node.output[0])
    if elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE,
                     onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
        return "a floating-point Range with run-time bounds"
    return None


def _flatten_axis(node: onnx.NodeProto, facts: _Facts) -> str | None:
    if node.op_type == "Flatten" and any(a.name == "axis" and a.i == 0 for a in node.attribute):
        return "axis 0 (onnx2torch makes it 1-D)"
    return None


def _scaled_half_pixel_roi_align(node: onnx.NodeProto, facts: _Facts) -> str | None:
    if node.op_type != "RoiAlign":
        return None
    attrs = {a.name: a for a in node.attribute}
    mode = attrs.get("coordinate_transformation_mode")
    half_pixel = (mode.s == b"half_pixel") if mode is not None else facts.opset >= 16
    scale = attrs.get("spatial_scale")
    if half_pixel and scale is not None and scale.f != 1.0:
        return f"half_pixel with spatial_scale {scale.f} (scale the rois instead)"
    return None


def _slice_before_gather_elements(node: onnx.NodeProto, facts: _Facts) -> str | None:
    if node.op_type != "GatherElements":
        return None
    producer = facts.producers.get(node.input[0])
    if producer is not None and producer.op_type == "Slice" and len(producer.input) > 1:
        starts = facts.constants.get(producer.input[1])
        if starts is not None and (starts == 0).any():
            return "reads a Slice that starts at 0"
    return None


def _one_sided_comparison(node: onnx.NodeProto, facts: _Facts) -> str | None:
    if node.op_type in ("GreaterOrEqual", "LessOrEqual") and facts.opset >= 16:
        return f"{node.op_type} at opset {facts.opset} (use the builder's spelling)"
    return None


def _integer_min_max(node: onnx.NodeProto, facts: _Facts) -> str | None:
    if node.op_type in ("Min", "Max") and facts.opset < 12:
        elem_type = facts.elem_types.get(node.output[0])
        if elem_type is not None and elem_type not in (
                onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16):
            return f"integer {node.op_type} at opset {facts.opset}"
    return None


def _expand_adds_no_axes(node: onnx.NodeProto, facts: _Facts) -> str | None:
    if node.op_type != "Expand":
        return None
    before, after = facts.ranks.get(node.input[0]), facts.ranks.get(node.output[0])
    if before is not None and after is not None and after > before:
        return f"adds axes (rank {before} -> {after}); Unsqueeze first"
    return None


def _rank_five_for_onnx2tf(node: onnx.NodeProto, facts: _Facts) -> str | None:
    if node.op_type not in ("Split", "Slice", "MatMul"):
        return None
    rank = max((facts.ranks.get(name, 0) for name in node.input[:2] if name), default=0)
    return f"a rank-{rank} input" if rank > 5 else None


# -- the rules -----------------------------------------------------------------------------

RULES: tuple[Rule, ...] = (
    Rule("Standard domain only: no `com.microsoft` contrib ops (`b.target == \"ort\"` may use "
         "them, where a benchmark shows a >10% win)",
         "only ONNX Runtime has them", _standard_domain),
    Rule("No `Slice` with a negative step; reverse an axis with `b.Reverse` (a `Gather` of a "
         "reversed index)",
         "onnx2tf 1.29 and 2.6.9 (`tf_converter`) turn some step -1 Slices into Identity: "
         "wrong numbers, no warning", _no_negative_step),
    Rule("Build a reversed index as `(n - 1) - Range(0, n, 1)`, not `Range(n - 1, -1, -1)`",
         "ONNX Runtime 1.32: its GatherToSliceFusion rewrites a Gather of the descending "
         "Range into a Slice whose end is wrong; the output is empty", _ascending_range),
    Rule("No `Conv`/`ConvTranspose` whose weight is computed at run time (QDQ's "
         "`DequantizeLinear` of a constant weight is the exception)",
         "OpenVINO: \"Doesn't support dynamic weights shape\"; onnx2torch reads weights from "
         "initializers only; onnx2tf emits a custom op or mis-lays the kernel; TensorRT's "
         "parser needs an initializer weight (8.x matrix)", _static_conv_weight),
    Rule("No constant-folding barriers (an empty constant concatenated to a tensor, an empty "
         "`Slice`)",
         "TVM with dynamic shapes: the Conv importer loses the kernel shape; onnx2tf stops "
         "folding what it needs folded", _no_fold_barrier),
    Rule("`Range` with run-time bounds is integer; `Cast` the result",
         "TensorRT accepts a floating-point Range only with constant bounds (operator "
         "matrix)", _integer_run_time_range),
    Rule("`TopK` sorts (`sorted=1`, the default); unsorted only for `b.target == \"ort\"`",
         "TVM's importer refuses it (\"TopK sorted must be 1 for Relax frontend\")",
         _sorted_top_k),
    Rule("No `Flatten` with axis 0; flatten with `Reshape(x, [-1])`",
         "onnx2torch 1.5.15 converts `Flatten(axis=0)` to a 1-D tensor, not (1, n)",
         _flatten_axis),
    Rule("A `half_pixel` `RoiAlign` has `spatial_scale` 1: scale the rois before it",
         "TVM 0.27 (Relax) subtracts half_pixel's 0.5 before applying spatial_scale: "
         "errors of 0.3-0.7 (measured); with the rois pre-scaled the results are the same "
         "on every engine", _scaled_half_pixel_roi_align),
    Rule("A `Slice` feeding `GatherElements` starts at `-size`, not 0",
         "OpenVINO 2026.4 CPU drops such a Slice; the compile then fails \"Shapes ... are "
         "not consistent\"", _slice_before_gather_elements),
    Rule("Opset-correct spellings through the builder's methods (Unsqueeze/Squeeze/Split/"
         "Reduce*/Shape); `GreaterOrEqual`/`LessOrEqual` from opset 16 as one strict "
         "comparison (`b.GreaterOrEqual`)",
         "signatures changed between opsets; onnx2torch converts only the opset-12 "
         "GreaterOrEqual/LessOrEqual", _one_sided_comparison),
    Rule("Integer `Min`/`Max` only from opset 12 (`b.Min`/`b.Max` spell them below)",
         "no integer kernels below opset 12", _integer_min_max),
    Rule("Add axes before an `Expand` (`Unsqueeze` to full rank), not in it",
         "onnx2tf `flatbuffer_direct` turns an axis-adding Expand into a Reshape to a guessed "
         "size, which LiteRT rejects", _expand_adds_no_axes),
    Rule("At most rank 5 into `Split`, `Slice` and batched `MatMul`",
         "onnx2tf: `flatbuffer_direct` lowers a 6-D Split to a LiteRT SLICE (1-D to 5-D); "
         "`tf_converter` turns a MatMul above rank 5 into a Flex op LiteRT cannot run",
         _rank_five_for_onnx2tf),
    Rule("Index and shape arithmetic in int64 or int32, values below 2^31",
         "TensorRT before 10 casts INT64 to INT32 (clamping)"),
    Rule("Broadcast between operands of the same, full rank (`Unsqueeze` both); no small "
         "constant selector broadcast against a run-time-length `Range`",
         "onnx2tf's layout guessing transposes the constant; LiteRT then fails \"shapes not "
         "broadcastable\""),
    Rule("An axis-wise op on a rank-3+ tensor whose dims could be read either way gets a "
         "shape that cannot be (a size-1 dim, or rank 2 then one Reshape)",
         "onnx2tf 2.6.9 (`tf_converter`) takes such an axis for channels-last and moves it: "
         "wrong numbers (a grid sampler, 16 channels of 4x4)"),
    Rule("No `Transpose` that moves dims of equal size past each other unless perm[0] is 0 "
         "(`b.Transpose2D` for a matrix swap)",
         "onnx2tf `tf_converter` matches output dims to input dims by size: a square 2-D "
         "swap comes out as an identity, without a warning"),
    Rule("No `0` in a `Reshape` target whose input onnx2tf may hold channels-last; spell "
         "the shape from `Shape` and `Concat`",
         "onnx2tf `flatbuffer_direct` reads the 0 against its channels-last layout: "
         "a 2-D affine grid came out (N·W, H, 1, 2)"),
    Rule("Reshape targets come from `Shape` (and `Concat` with int64 constants), not from "
         "arithmetic on sizes; after a gather whose shape may be lost, no 0 or -1",
         "TVM refuses a computed target (\"Reshape requires the input new shape to be "
         "Shape\") and cannot infer a -1 after a Range of computed length",
         _reshape_target_from_shape),
    Rule("Mind empty dims: a flattened batch goes back with `b.ReshapeBatchFirst`, or through "
         "a layout whose only possibly-empty dim sits where the input has it",
         "Reshape's 0 copies the input's dim, so (0, ...) comes back as (2, 0, ...) or "
         "(0, 0, ...): wrong shapes on every engine"),
    Rule("Sizes that meet `Min`/`Max` (or `Unsqueeze`) are 1-element tensors: "
         "`b.Gather(shape, [axis])`",
         "TVM keeps a 0-d size read from Shape as a PrimValue, which its Min/Max/Unsqueeze "
         "cannot take"),
    Rule("Don't broadcast two inputs' symbolic dims against each other; index one by "
         "`GatherElements` with indices shaped like the other",
         "TVM cannot lower a broadcast between differently named symbolic dims"),
    Rule("Index tensors keep input-derived shapes",
         "onnx2tf lowers a GatherElements whose indices have a data-dependent size to a "
         "custom op LiteRT does not have"),
    Rule("Reverse rows (axis -2), not the last axis; Transpose the last axis into rows",
         "every Gather along the last axis copies one element at a time: 3-4x slower on ONNX "
         "Runtime", speed=True),
    Rule("Prefer `GatherElements` and arithmetic to `Gather` and an unpredictable `Where` on "
         "large data-dependent tensors",
         "ONNX Runtime 1.32 runs those at 12-14 ns per element, GatherElements/Cast/Add/Mul "
         "at 0.5-2 ns", speed=True),
    Rule("A large main-graph output is written by `b.Reshape(..., to_caller=True)`, not by a "
         "trailing view",
         "ONNX Runtime fills the caller's buffer from a trailing Reshape with one "
         "single-threaded copy", speed=True),
    Rule("Both operands of a final output-sized broadcast hold whole innermost rows",
         "ONNX Runtime broadcasts `(N, H, 1, 2) + (N, 1, W, 2)` 5-14x slower than "
         "`(1, H, 1, 1) * (N, 1, W, 2)`", speed=True),
)


# -- scanning ------------------------------------------------------------------------------


def violations(model: onnx.ModelProto) -> list[str]:
    """Every node that breaks a checked rule, anywhere in ``model``, one line each."""
    inferred = _inferred(model)
    elem_types: dict[str, int] = {}
    ranks: dict[str, int] = {}
    for graph in _graphs(inferred.graph):
        for value in [*graph.input, *graph.value_info, *graph.output]:
            tensor = value.type.tensor_type
            if tensor.elem_type:
                elem_types[value.name] = tensor.elem_type
            if tensor.HasField("shape"):
                ranks[value.name] = len(tensor.shape.dim)
        for init in graph.initializer:
            elem_types[init.name] = init.data_type
            ranks[init.name] = len(init.dims)
    opset = opset_map(list(model.opset_import)).get("", 0)
    problems: list[str] = []
    checks = [rule.check for rule in RULES if rule.check is not None]
    for graph, initializers in _scopes(model.graph, set()):
        facts = _Facts(_constants(graph), initializers,
                       {out: node for node in graph.node for out in node.output},
                       elem_types, ranks, opset)
        for node in graph.node:
            for check in checks:
                found = check(node, facts)
                if found:
                    problems.append(f"{node.op_type} '{node.name}': {found}")
    return problems


def rules_table() -> str:
    """The rules as the markdown table docs/portability.md holds."""
    lines = ["| rule | engine and failure it avoids | checked |", "|---|---|---|"]
    for rule in RULES:
        checked = "speed" if rule.speed else ("yes" if rule.check else "review")
        cells = [rule.do, rule.why, checked]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def _inferred(model: onnx.ModelProto) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception:  # the checks that need types then see none
        return model


def _graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    yield graph
    for node in graph.node:
        for _, sub in subgraphs(node):
            yield from _graphs(sub)


def _scopes(graph: onnx.GraphProto, outer: set[str]
            ) -> Iterator[tuple[onnx.GraphProto, set[str]]]:
    """Each graph with the initializer names visible in it (its own and its ancestors')."""
    visible = outer | {init.name for init in graph.initializer}
    yield graph, visible
    for node in graph.node:
        for _, sub in subgraphs(node):
            yield from _scopes(sub, visible)


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    found = {init.name: numpy_helper.to_array(init) for init in graph.initializer
             if init.data_location != onnx.TensorProto.EXTERNAL}
    for node in graph.node:
        if node.op_type == "Constant" and not norm_domain(node.domain) and node.attribute \
                and node.attribute[0].type == onnx.AttributeProto.TENSOR:
            found[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return found
