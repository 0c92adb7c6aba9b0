"""The adapters: one per (op, version) whose change needs more than dropping a default, and
the generated table of docs/opset-adapters.md.

In: a :class:`~decomposer.opsets.core.Site` (the node, what is known around it, where to
write). Out: the node at the previous version's signature, or the nodes that replace it;
:class:`~decomposer.opsets.core.CannotSay` where the meaning has no older spelling.
Written from the schemas' history (what onnx/docs/Changelog.md is generated from).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from decomposer.opsets.core import (
    _HISTORY,
    _NO_BOOL_CARRIER,
    _NO_CARRIER,
    NEWEST_OPSET,
    Adapter,
    CannotSay,
    Site,
    _common_carrier,
    _schema,
    _type_name,
    _type_since,
    _type_str,
)


def _axes_to_attribute(key: str, since: int) -> Adapter:
    """``since`` made ``key`` (axes, split) an input; before it, it is an attribute, so
    the input must be a constant."""

    def adapter(site: Site) -> None:
        name = site.input(1)
        if name:
            value = site.constant(name)
            if value is None and key == "split":
                _split_by_slices(site, name)
                return
            if value is None:
                raise CannotSay(f"{site.node.op_type} reads its {key} from '{name}', which is "
                                f"not a constant, and before opset {since} {key} is an "
                                f"attribute", since)
            site.set_attr(key, [int(v) for v in np.asarray(value).reshape(-1)])
        if len(site.node.input) > 1:
            del site.node.input[1]

    adapter.__doc__ = f"the {key} input becomes the attribute again (a constant input only)"
    return adapter


def _reduce_with_axes_input(since: int) -> Adapter:
    inner = _axes_to_attribute("axes", since)

    def adapter(site: Site) -> None:
        noop = site.attr("noop_with_empty_axes", 0)
        axes_name = site.input(1)
        axes = site.constant(axes_name) if axes_name else np.zeros(0)
        if noop and axes is not None and axes.size == 0:
            # noop_with_empty_axes=1 with no axes: the input comes through unchanged.
            site.replacement = [helper.make_node("Identity", [site.node.input[0]],
                                                 [site.node.output[0]], name=site.node.name)]
            return
        if axes is None and since == 18 and site.target >= 13 and \
                site.node.op_type in _THROUGH_REDUCE_SUM:
            _through_reduce_sum(site)
            return
        if axes is None and site.rank(site.node.input[0]) is not None and \
                site.elem_type(site.node.input[0]) is not None:
            _reduce_per_axis(site)
            return
        if noop and axes is None:
            raise CannotSay(f"{site.node.op_type} has noop_with_empty_axes=1 and run-time "
                            f"axes that may be empty", since)
        site.drop_attr("noop_with_empty_axes")
        inner(site)

    adapter.__doc__ = ("the axes input becomes the attribute again (a constant input only); "
                       "noop_with_empty_axes=1 with no axes becomes Identity")
    return adapter


# Reduce-18 ops with run-time axes that ReduceSum-13 (which takes axes as an input) says:
# (what is summed, what is done to the sum).
_THROUGH_REDUCE_SUM = {"ReduceMean": ("x", "mean"), "ReduceSumSquare": ("square", ""),
                       "ReduceL1": ("abs", ""), "ReduceL2": ("square", "sqrt"),
                       "ReduceLogSum": ("x", "log")}


def _through_reduce_sum(site: Site) -> None:
    """ReduceMean/SumSquare/L1/L2/LogSum-18 with run-time axes, at a target of 13-17: a
    ReduceSum-13, which takes the same axes input (and noop_with_empty_axes), of x, x*x or
    |x|; then / count (the input's size over the result's: 1 when nothing is reduced),
    Sqrt or Log."""
    node = site.node
    summed, after = _THROUGH_REDUCE_SUM[node.op_type]
    x = node.input[0]
    new: list[onnx.NodeProto] = []
    if summed == "square":
        x = site.add(new, "Mul", [x, x], "square")
    elif summed == "abs":
        x = site.add(new, "Abs", [x], "abs")
    keep = {a.name: helper.get_attribute_value(a) for a in node.attribute
            if a.name in ("keepdims", "noop_with_empty_axes")}
    output = node.output[0]
    total = output if not after else site.fresh(f"{site.label}/sum")
    new.append(helper.make_node("ReduceSum", [x, node.input[1]], [total],
                                name=site.fresh(f"{site.label}/reduce_sum"), **keep))
    if after == "sqrt":
        new.append(helper.make_node("Sqrt", [total], [output], name=site.fresh(
            f"{site.label}/sqrt")))
    elif after == "log":
        new.append(helper.make_node("Log", [total], [output], name=site.fresh(
            f"{site.label}/log")))
    elif after == "mean":
        elem = site.elem_type(node.input[0]) or TensorProto.FLOAT
        sizes = [site.add(new, "Cast", [site.add(new, "Size", [name], f"size{i}")],
                          f"size{i}_f", to=TensorProto.DOUBLE)
                 for i, name in enumerate((node.input[0], total))]
        count = site.add(new, "Cast", [site.add(new, "Div", sizes, "count_f64")], "count",
                         to=elem)
        new.append(helper.make_node("Div", [total, count], [output],
                                    name=site.fresh(f"{site.label}/mean")))
    site.replacement = new


def _reduce_per_axis(site: Site) -> None:
    """A Reduce op over run-time axes where the target's op takes them only as an
    attribute (the input's rank known): for each axis k, an If on "k is among the axes (or
    the axes are empty and noop_with_empty_axes=0)" reduces along k with keepdims=1 or
    passes the tensor on; keepdims=0 then drops the reduced axes with a Reshape to the
    Compress-ed shape. Reducing one axis after another is the same reduction
    (ReduceSumSquare/L1/L2/LogSum: the square or |x| first, sums per axis, then the root or
    log)."""
    node = site.node
    rank = site.rank(node.input[0])
    elem = site.elem_type(node.input[0])
    assert rank is not None and elem is not None
    summed, after = _THROUGH_REDUCE_SUM.get(node.op_type, ("x", ""))
    per_axis = node.op_type if summed == "x" and after in ("", "mean") else "ReduceSum"
    if node.op_type == "ReduceLogSum":
        per_axis = "ReduceSum"
    keepdims = int(site.attr("keepdims", 1))
    noop = int(site.attr("noop_with_empty_axes", 0))
    new: list[onnx.NodeProto] = []
    y = node.input[0]
    schema = _schema(per_axis, site.target)
    allowed = {t for c in schema.type_constraints for t in c.allowed_type_strs} if schema \
        else set()
    original = elem
    if _type_str(elem) not in allowed:  # bool ReduceMax-20, ...: carried, as _carry_types
        carrier = _common_carrier([elem], allowed)
        if carrier is None or elem == TensorProto.BOOL and per_axis in _NO_BOOL_CARRIER:
            since = _type_since(node.op_type, elem, NEWEST_OPSET)
            raise CannotSay(f"{node.op_type} on {_type_name(elem)} is defined from opset "
                            f"{since}", since)
        y = site.add(new, "Cast", [y], "carried", to=carrier)
        elem = carrier
    if summed == "square":
        y = site.add(new, "Mul", [y, y], "square")
    elif summed == "abs":
        y = site.add(new, "Abs", [y], "abs")
    axes64 = site.add(new, "Cast", [node.input[1]], "axes64", to=TensorProto.INT64)
    rank_c = site.const("rank", np.array(rank, dtype=np.int64))
    wrapped = site.add(new, "Mod", [site.add(new, "Add", [axes64, rank_c], "axes_up"),
                                    rank_c], "axes_wrapped")
    empty = site.add(new, "Equal", [site.add(new, "Size", [axes64], "axes_count"),
                                    site.const("none", np.array(0, dtype=np.int64))],
                     "axes_empty")
    hits = []
    for k in range(rank):
        matches = site.add(new, "Cast", [site.add(new, "Equal", [wrapped, site.const(
            f"axis{k}", np.array(k, dtype=np.int64))], f"is_axis{k}")], f"is_axis{k}_i64",
            to=TensorProto.INT64)
        hit = site.add(new, "Greater", [site.add(new, "ReduceSum", [matches],
                                                 f"axis{k}_count", keepdims=0),
                                        site.const("zero_count", np.array(0, dtype=np.int64))],
                       f"reduce_axis{k}")
        if not noop:
            hit = site.add(new, "Or", [hit, empty], f"reduce_axis{k}_or_all")
        hits.append(hit)
        reduced = site.fresh(f"{site.label}/along{k}")
        kept = site.fresh(f"{site.label}/kept{k}")
        then_graph = helper.make_graph(
            [helper.make_node(per_axis, [y], [reduced], axes=[k], keepdims=1,
                              name=site.fresh(f"{site.label}/reduce{k}"))],
            f"reduce_axis_{k}", [], [helper.make_tensor_value_info(reduced, elem, None)])
        else_graph = helper.make_graph(
            [helper.make_node("Identity", [y], [kept], name=site.fresh(f"{site.label}/keep{k}"))],
            f"keep_axis_{k}", [], [helper.make_tensor_value_info(kept, elem, None)])
        y = site.add(new, "If", [hit], f"after_axis{k}", then_branch=then_graph,
                     else_branch=else_graph)
    if after == "sqrt":
        y = site.add(new, "Sqrt", [y], "sqrt")
    elif after == "log":
        y = site.add(new, "Log", [y], "log")
    if not keepdims:
        flags = [site.add(new, "Reshape", [hit, site.const("one", np.array([1], np.int64))],
                          f"flag{k}") for k, hit in enumerate(hits)]
        kept_axes = site.add(new, "Not", [site.add(new, "Concat", flags, "reduced_axes",
                                                   axis=0)], "kept_axes")
        shape = site.add(new, "Compress", [site.add(new, "Shape", [y], "reduced_shape"),
                                           kept_axes], "out_shape", axis=0)
        y = site.add(new, "Reshape", [y, shape], "dropped")
    if elem != original:
        new.append(helper.make_node("Cast", [y], [node.output[0]], to=original,
                                    name=node.name or site.fresh(f"{site.label}/out")))
    else:
        new.append(helper.make_node("Identity", [y], [node.output[0]],
                                    name=node.name or site.fresh(f"{site.label}/out")))
    site.replacement = new


def _full_from_axes(site: Site, new: list[onnx.NodeProto], axes: str, values: str,
                    base: str, rank: int, twice: bool) -> str:
    """``base`` (length rank, or 2*rank with ``twice``) with ``values`` written at the
    run-time ``axes`` (negative ones counted from the end; with ``twice`` the values are
    begins then ends, written at axis and axis + rank)."""
    axes64 = site.add(new, "Cast", [axes], "axes64", to=TensorProto.INT64)
    rank_c = site.const("rank", np.array(rank, dtype=np.int64))
    wrapped = site.add(new, "Mod", [site.add(new, "Add", [axes64, rank_c], "axes_plus_rank"),
                                    rank_c], "axes_wrapped")
    indices = wrapped
    if twice:
        indices = site.add(new, "Concat", [wrapped, site.add(new, "Add", [wrapped, rank_c],
                                                             "end_axes")], "pad_axes", axis=0)
    return site.add(new, "ScatterElements", [base, indices, values], "full", axis=0)


def _split_by_slices(site: Site, sizes: str) -> None:
    """A Split by run-time sizes where the target's Split takes them only as an attribute:
    one Slice per output, from the running sums of the sizes."""
    node = site.node
    axis = int(site.attr("axis", 0))
    new: list[onnx.NodeProto] = []
    sizes64 = site.add(new, "Cast", [sizes], "sizes64", to=TensorProto.INT64)
    zero = site.const("axis0", np.array(0, dtype=np.int64))
    ends = site.add(new, "CumSum", [sizes64, zero], "ends")
    starts = site.add(new, "Sub", [ends, sizes64], "starts")
    axes = site.const("slice_axes", np.array([axis], dtype=np.int64))
    for index, output in enumerate(node.output):
        if not output:
            continue
        at = site.const(f"part{index}", np.array([index], dtype=np.int64))
        begin = site.add(new, "Gather", [starts, at], f"start{index}", axis=0)
        end = site.add(new, "Gather", [ends, at], f"end{index}", axis=0)
        new.append(helper.make_node("Slice", [node.input[0], begin, end, axes], [output],
                                    name=site.fresh(f"{site.label}/slice{index}")))
    site.replacement = [*site.before, *new]
    site.before = []


def _split_num_outputs(site: Site) -> None:
    """Split-18's num_outputs: older Splits cut evenly or take the sizes, computed at run
    time for a length unknown here (as Slices below 13)."""
    count = site.attr("num_outputs")
    site.drop_attr("num_outputs")
    if count is None or site.input(1):
        return
    axis = int(site.attr("axis", 0))
    shape = site.shape(site.node.input[0])
    length = None
    if shape is not None:
        length = shape[axis if axis >= 0 else axis + len(shape)]
    if isinstance(length, int) and length % count == 0:
        return  # the older even split
    if not isinstance(length, int):
        # sizes at run time: chunk = ceil(d / n); part i = clamp(d - i * chunk, 0, chunk)
        new: list[onnx.NodeProto] = []
        dim = site.add(new, "Gather", [site.add(new, "Shape", [site.node.input[0]], "shape"),
                                       site.const("axis", np.array([axis], dtype=np.int64))],
                       "length", axis=0)  # a negative axis counts from the end, as Gather
        count_c = site.const("count", np.array(count, dtype=np.int64))
        chunk = site.add(new, "Div", [site.add(new, "Add", [dim, site.const(
            "count_less_one", np.array(count - 1, dtype=np.int64))], "length_up"), count_c],
            "chunk")
        starts = site.add(new, "Mul", [site.const("parts", np.arange(count, dtype=np.int64)),
                                       chunk], "starts")
        left = site.add(new, "Sub", [dim, starts], "left")
        zero = site.const("zero", np.array(0, dtype=np.int64))
        # int64 Max/Min need opset 12: Where(Less) says them at 11
        left = site.add(new, "Where", [site.add(new, "Less", [left, zero], "empty"), zero,
                                       left], "left_clamped")
        sizes = site.add(new, "Where", [site.add(new, "Less", [chunk, left], "full"), chunk,
                                        left], "sizes")
        site.before.extend(new)
        if site.target < 13:
            _split_by_slices(site, sizes)
            return
        site.node.input.append(sizes)
        return
    chunk = -(-length // count)
    parts = [max(0, min(chunk, length - i * chunk)) for i in range(count)]
    site.node.input.append(site.const("split", np.array(parts, dtype=np.int64)))


def _pad_axes(site: Site) -> None:
    """Pad-18's axes input: older Pads take pads for every axis (constant ones written out,
    run-time ones scattered into a full-rank pads tensor; the rank must be known)."""
    axes_name = site.input(3)
    if not axes_name:
        return
    axes = site.constant(axes_name)
    pads = site.constant(site.input(1))
    rank = site.rank(site.node.input[0])
    if rank is None:
        raise CannotSay("Pad-18 pads the axes given by its axes input, and before opset 18 "
                        "the pads must cover every axis: the rank must be known", 18)
    if axes is None or pads is None:
        new: list[onnx.NodeProto] = []
        zeros = site.const("no_pads", np.zeros(2 * rank, dtype=np.int64))
        pads64 = site.add(new, "Cast", [site.node.input[1]], "pads64", to=TensorProto.INT64)
        site.before.extend(new)
        full_pads = _full_from_axes(site, site.before, axes_name, pads64, zeros, rank, True)
        site.node.input[1] = full_pads
        del site.node.input[3:]
        return
    full = np.zeros(2 * rank, dtype=np.int64)
    count = len(axes)
    for position, axis in enumerate(np.asarray(axes).reshape(-1)):
        axis = int(axis) % rank
        full[axis] = pads.reshape(-1)[position]
        full[axis + rank] = pads.reshape(-1)[position + count]
    site.node.input[1] = site.const("pads", full)
    del site.node.input[3:]


def _pad_wrap(site: Site) -> None:
    """Pad-19's mode 'wrap' is refused (no older Pad says it)."""
    if site.attr("mode", b"constant") == b"wrap":
        raise CannotSay("Pad's mode 'wrap' is defined from opset 19", 19)


def _shape_bounds(site: Site) -> None:
    """Shape-15's start/end: the full shape, then a Slice."""
    start, end = site.attr("start"), site.attr("end")
    site.drop_attr("start", "end")
    if start in (None, 0) and end is None:
        return
    original = site.node.output[0]
    full = site.fresh(f"{site.label}/full")
    site.node.output[0] = full
    starts = site.const("starts", np.array([start or 0], dtype=np.int64))
    ends = site.const("ends", np.array([end if end is not None else 1 << 62], dtype=np.int64))
    axes = site.const("axes", np.array([0], dtype=np.int64))
    site.after.append(helper.make_node("Slice", [full, starts, ends, axes], [original],
                                       name=site.fresh(f"{site.label}/slice")))


def _reshape_allowzero(site: Site) -> None:
    """Reshape-14's allowzero=1 means the older Reshape when the target shape holds no 0."""
    if not site.attr("allowzero", 0):
        return
    shape = site.constant(site.input(1))
    if shape is None or (np.asarray(shape) == 0).any():
        raise CannotSay("Reshape with allowzero=1 takes a 0 in the target shape literally "
                        "(or the shape is computed at run time)", 14)
    site.drop_attr("allowzero")


def _softmax_axis(site: Site) -> None:
    """Before 13, Softmax/LogSoftmax/Hardmax flatten to 2-D around ``axis``; from 13 they
    work along ``axis``. The last axis means the same in both; another axis is moved last
    with a Transpose on each side."""
    rank = site.rank(site.node.input[0])
    axis = int(site.attr("axis", -1))
    if rank is None:
        if axis == -1:
            site.set_attr("axis", -1)
            return
        raise CannotSay(f"{site.node.op_type}-13 works along axis {axis} of an input of "
                        f"unknown rank; before opset 13 only the last axis means the same", 13)
    axis %= rank
    site.set_attr("axis", rank - 1)
    if axis == rank - 1:
        return
    order = [a for a in range(rank) if a != axis] + [axis]
    back_order = [order.index(a) for a in range(rank)]
    site.node.input[0] = site.add(site.before, "Transpose", [site.node.input[0]],
                                  "to_last", perm=order)
    original = site.node.output[0]
    inner = site.fresh(f"{site.label}/along_last")
    site.node.output[0] = inner
    site.after.append(helper.make_node("Transpose", [inner], [original], perm=back_order,
                                       name=site.fresh(f"{site.label}/back")))


def _resize_13(site: Site) -> None:
    """Before 13, Resize requires roi and scales; empty float tensors mean "not given"."""
    for position in (1, 2):
        if position < len(site.node.input) and not site.node.input[position]:
            site.node.input[position] = site.const(f"empty{position}",
                                                   np.zeros(0, dtype=np.float32))
    while len(site.node.input) < 3:
        site.node.input.append(site.const(f"empty{len(site.node.input)}",
                                          np.zeros(0, dtype=np.float32)))


def _resize_18(site: Site) -> None:
    """Resize-18's antialias=1: handed to the Resize pattern; keep_aspect_ratio_policy
    other than stretch is refused; axes are written out into full-rank scales/sizes
    (scattered at run time)."""
    if site.attr("antialias", 0):
        site.lower_by_pattern("Resize with antialias=1 is defined from opset 18", 18)
        return
    policy = site.attr("keep_aspect_ratio_policy", b"stretch")
    if policy != b"stretch":
        raise CannotSay(f"Resize's keep_aspect_ratio_policy '{policy.decode()}' is defined "
                        f"from opset 18", 18)
    axes = site.attr("axes")
    site.drop_attr("antialias", "keep_aspect_ratio_policy", "axes")
    if axes is None:
        return
    rank = site.rank(site.node.input[0])
    if rank is None:
        raise CannotSay("Resize-18 resizes only the axes given, and before 18 scales or "
                        "sizes cover every axis: the rank must be known", 18)
    axes = [a % rank for a in axes]
    for position in (1, 2, 3):  # roi, scales, sizes
        name = site.input(position)
        if not name:
            continue
        value = site.constant(name)
        if value is None and position in (2, 3):
            axes_c = site.const("axes", np.array(axes, dtype=np.int64))
            if position == 2:
                base = site.const("unit_scales", np.ones(rank, dtype=np.float32))
            else:
                base = site.add(site.before, "Shape", [site.node.input[0]], "input_shape")
            site.node.input[position] = _full_from_axes(site, site.before, axes_c, name,
                                                        base, rank, False)
            continue
        if value is None:
            raise CannotSay("Resize-18 with axes takes its roi at run time; before 18 it "
                            "must cover every axis", 18)
        value = np.asarray(value).reshape(-1)
        if position == 1:
            full = np.array([0.0] * rank + [1.0] * rank, dtype=value.dtype)
            for i, axis in enumerate(axes):
                full[axis], full[axis + rank] = value[i], value[i + len(axes)]
        elif position == 2:
            full = np.ones(rank, dtype=value.dtype)
            full[axes] = value
        else:
            shape = site.shape(site.node.input[0])
            if shape is None or not all(isinstance(d, int) for d in shape):
                raise CannotSay("Resize-18 with axes and sizes keeps the other axes' "
                                "lengths, which must then be static below 18", 18)
            full = np.array(shape, dtype=np.int64)
            full[axes] = value
        site.node.input[position] = site.const(f"full{position}", full)


def _resize_19(site: Site) -> None:
    """Resize-19's half_pixel_symmetric coordinates: handed to the Resize pattern (a MatMul
    per resized axis, patterns/resize.py)."""
    if site.attr("coordinate_transformation_mode") == b"half_pixel_symmetric":
        site.lower_by_pattern("Resize's coordinate_transformation_mode "
                              "'half_pixel_symmetric' is defined from opset 19", 19)


def _scatter_reduction(since: int, new: tuple[str, ...]) -> Adapter:
    def adapter(site: Site) -> None:
        reduction = site.attr("reduction", b"none").decode()
        if reduction in new:
            if site.node.op_type == "ScatterElements":
                _scatter_elements_one_hot(site, reduction, since)
                return
            _scatter_nd_one_hot(site, reduction, since)
            return
        if since == 16:
            site.drop_attr("reduction")

    adapter.__doc__ = (f"reduction {'/'.join(new)}: through a one-hot mask and a Reduce "
                       f"(ScatterND: static shapes); 'none' is dropped")
    return adapter


_SCATTER_ND_LIMIT = 1 << 24  # elements of the (updates, positions, slice) mask


def _scatter_nd_one_hot(site: Site, reduction: str, since: int) -> None:
    """ScatterND with a reduction the target lacks, for static shapes: the first k dims of
    the data flattened into F positions, a (P updates, F) mask of where each update lands
    (its row-major index), the updates spread over it with the reduction's identity and
    reduced over P, and combined with the data where some update lands (as
    :func:`_scatter_elements_one_hot`)."""
    node = site.node
    data_shape = site.shape(node.input[0])
    index_shape = site.shape(node.input[1])
    elem = site.elem_type(node.input[0])
    reason = f"ScatterND's reduction '{reduction}' is defined from opset {since}"
    if data_shape is None or index_shape is None or elem is None or \
            not all(isinstance(d, int) for d in [*data_shape, *index_shape]):
        raise CannotSay(f"{reason} (lowered for static shapes only)", since)
    dims = [int(d) for d in data_shape]  # type: ignore[arg-type]
    k = int(index_shape[-1])  # type: ignore[arg-type]
    count = int(np.prod([int(d) for d in index_shape[:-1]]))  # type: ignore[arg-type]
    positions = int(np.prod(dims[:k]))
    rest = int(np.prod(dims[k:]))
    dtype = _NUMPY_OF.get(elem)
    if dtype is None or count * positions * rest > _SCATTER_ND_LIMIT or not 1 <= k <= len(dims):
        raise CannotSay(f"{reason} (here too large, or of a type it cannot say)", since)
    identity, reduce_op = _reduction_of(reduction, dtype)
    strides = [int(np.prod(dims[j + 1:k])) for j in range(k)]
    new: list[onnx.NodeProto] = []
    index64 = site.add(new, "Cast", [node.input[1]], "indices64", to=TensorProto.INT64)
    bounds = site.const("bounds", np.array(dims[:k], np.int64))
    wrapped = site.add(new, "Mod", [site.add(new, "Add", [index64, bounds], "indices_up"),
                                    bounds], "indices_wrapped")
    flat = site.add(new, "Mul", [wrapped, site.const("strides", np.array(strides, np.int64))],
                    "weighted")
    linear = _reduced(site, new, "ReduceSum", flat, len(index_shape) - 1, "linear")
    column = site.add(new, "Reshape", [linear, site.const("column", np.array(
        [count, 1, 1], np.int64))], "linear_column")
    aimed = site.add(new, "Equal", [column, site.const("positions", np.arange(
        positions, dtype=np.int64).reshape(1, positions, 1))], "aimed")
    spread = site.add(new, "Where", [aimed, site.add(new, "Reshape", [
        node.input[2], site.const("updates_shape", np.array([count, 1, rest], np.int64))],
        "updates_flat"), site.const("identity", np.array(identity, dtype))], "spread")
    contribution = site.add(new, "Reshape", [
        _reduced(site, new, reduce_op, spread, 0, "contribution_flat"),
        site.const("data_dims", np.array(dims, np.int64))], "contribution")
    landed = site.add(new, "Cast", [site.add(new, "Reshape", [
        _reduced(site, new, "ReduceMax", site.add(new, "Cast", [aimed], "aimed_int",
                                                  to=TensorProto.INT32), 0, "landed_flat"),
        site.const("landed_shape", np.array(dims[:k] + [1] * (len(dims) - k), np.int64))],
        "landed_dims")], "landed", to=TensorProto.BOOL)
    data = node.input[0]
    _scattered(site, new, reduction, data, contribution, landed)


def _reduction_of(reduction: str, dtype: Any) -> tuple[Any, str]:
    """The reduction's identity in ``dtype`` and the Reduce op that applies it."""
    if np.issubdtype(dtype, np.floating):
        low, high = -np.inf, np.inf
    else:
        low, high = np.iinfo(dtype).min, np.iinfo(dtype).max
    identity = {"add": 0, "mul": 1, "max": low, "min": high}[reduction]
    return identity, {"add": "ReduceSum", "mul": "ReduceProd", "max": "ReduceMax",
                      "min": "ReduceMin"}[reduction]


def _scattered(site: Site, new: list[onnx.NodeProto], reduction: str, data: str,
               contribution: str, landed: str) -> None:
    """The scatter's output: ``data`` combined with the reduced ``contribution`` where an
    update ``landed`` (max/min by comparison, so any numeric type), the data elsewhere."""
    node = site.node
    if reduction == "add":
        combined = site.add(new, "Add", [data, contribution], "combined")
    elif reduction == "mul":
        combined = site.add(new, "Mul", [data, contribution], "combined")
    else:
        better = site.add(new, "Greater" if reduction == "max" else "Less",
                          [contribution, data], "better")
        combined = site.add(new, "Where", [better, contribution, data], "combined")
    new.append(helper.make_node("Where", [landed, combined, data], [node.output[0]],
                                name=node.name or site.fresh(f"{site.label}/scattered")))
    site.replacement = new


def _unsqueezed(site: Site, new: list[onnx.NodeProto], x: str, axis: int, hint: str) -> str:
    if site.target >= 13:
        return site.add(new, "Unsqueeze", [x, site.const(f"{hint}_axes", np.array(
            [axis], np.int64))], hint)
    return site.add(new, "Unsqueeze", [x], hint, axes=[axis])


def _reduced(site: Site, new: list[onnx.NodeProto], op_type: str, x: str, axis: int,
             hint: str) -> str:
    """``op_type`` over ``axis``, keepdims=0, in the target's spelling."""
    if op_type == "ReduceSum" and site.target >= 13:
        return site.add(new, op_type, [x, site.const(f"{hint}_axes", np.array(
            [axis], np.int64))], hint, keepdims=0)
    return site.add(new, op_type, [x], hint, axes=[axis], keepdims=0)


def _scatter_elements_one_hot(site: Site, reduction: str, since: int) -> None:
    """ScatterElements with a reduction the target lacks: for each position along the axis
    a mask of the updates aimed at it (Equal of the indices and a Range), the updates
    reduced over the indices' axis (ReduceSum/Prod/Max/Min of a Where with the reduction's
    identity), padded to the data's shape, and combined with the data only where some
    update lands (a Where; max/min by comparison, so any numeric type). Several updates
    to one element are combined among themselves first: for add and mul that is another
    order than the sequential one (float rounding of the same sum or product)."""
    node = site.node
    rank = site.rank(node.input[0])
    elem = site.elem_type(node.input[2])
    if rank is None or elem is None:
        raise CannotSay(f"ScatterElements' reduction '{reduction}' is defined from opset "
                        f"{since} (here the rank or type is unknown)", since)
    axis = int(site.attr("axis", 0)) % rank
    data, indices, updates = node.input[0], node.input[1], node.input[2]
    dtype = _NUMPY_OF.get(elem)
    if dtype is None:
        raise CannotSay(f"ScatterElements' reduction '{reduction}' on {_type_name(elem)} is "
                        f"defined from opset {since}", since)
    identity, reduce_op = _reduction_of(reduction, dtype)
    new: list[onnx.NodeProto] = []
    length = site.add(new, "Gather", [site.add(new, "Shape", [data], "data_shape"),
                                      site.const("axis_at", np.array([axis], np.int64))],
                      "length", axis=0)
    index64 = site.add(new, "Cast", [indices], "indices64", to=TensorProto.INT64)
    wrapped = site.add(new, "Mod", [site.add(new, "Add", [index64, length], "indices_up"),
                                    length], "indices_wrapped")
    shape = [1] * (rank + 1)
    shape[axis + 1] = -1
    positions = site.add(new, "Reshape", [
        site.add(new, "Range", [site.const("zero", np.array(0, np.int64)),
                                site.add(new, "Squeeze", [length], "length_scalar",
                                         axes=[0]) if site.target < 13 else
                                site.add(new, "Squeeze", [length, site.const(
                                    "squeeze_axes", np.array([0], np.int64))],
                                    "length_scalar"),
                                site.const("one", np.array(1, np.int64))], "positions"),
        site.const("positions_shape", np.array(shape, np.int64))], "positions_along")
    aimed = site.add(new, "Equal", [_unsqueezed(site, new, wrapped, axis + 1, "indices_e"),
                                    positions], "aimed")
    spread = site.add(new, "Where", [aimed, _unsqueezed(site, new, updates, axis + 1,
                                                        "updates_e"),
                                     site.const("identity", np.array(identity, dtype))],
                      "spread")
    contribution = _reduced(site, new, reduce_op, spread, axis, "contribution")
    landed = _reduced(site, new, "ReduceMax", site.add(new, "Cast", [aimed], "aimed_int",
                                                       to=TensorProto.INT32), axis, "landed")
    # pad both to the data's shape at the end of every axis (the updates may be smaller)
    zeros = site.const("no_pads", np.zeros(rank, np.int64))
    ends = site.add(new, "Sub", [site.add(new, "Shape", [data], "data_dims"),
                                 site.add(new, "Shape", [contribution], "contribution_dims")],
                    "missing")
    pads = site.add(new, "Concat", [zeros, ends], "pads", axis=0)
    contribution = site.add(new, "Pad", [contribution, pads, site.const(
        "pad_identity", np.array(identity, dtype))], "contribution_full")
    landed = site.add(new, "Cast", [site.add(new, "Pad", [landed, pads], "landed_full")],
                      "landed_bool", to=TensorProto.BOOL)
    _scattered(site, new, reduction, data, contribution, landed)


def _constant_12(site: Site) -> None:
    """Constant-12's value_* forms: the older Constant holds a tensor."""
    for attribute in site.node.attribute:
        name = attribute.name
        if name == "value":
            return
        value = helper.get_attribute_value(attribute)
        array: np.ndarray
        if name == "value_float":
            array = np.array(value, dtype=np.float32)
        elif name == "value_floats":
            array = np.array(value, dtype=np.float32).reshape(-1)
        elif name == "value_int":
            array = np.array(value, dtype=np.int64)
        elif name == "value_ints":
            array = np.array(value, dtype=np.int64).reshape(-1)
        elif name in ("value_string", "value_strings"):
            array = np.array(value if name == "value_strings" else value, dtype=object)
            if name == "value_strings":
                array = array.reshape(-1)
        else:  # sparse_value exists at 11
            return
        site.drop_attr(name)
        site.node.attribute.append(helper.make_attribute(
            "value", numpy_helper.from_array(array, site.node.output[0])))
        return


def _dropout_12(site: Site) -> None:
    """Dropout-12 takes ratio and training_mode as inputs. At inference (no training_mode,
    or a constant false) it is the identity and its mask all true: written as Identity and
    a ConstantOfShape, since engines differ on Dropout-10's inference mask (ONNX Runtime
    1.32 writes all false)."""
    training = site.input(2)
    if training:
        value = site.constant(training)
        if value is None or bool(np.asarray(value).reshape(-1)[0]):
            raise CannotSay("Dropout in training mode (or a run-time training_mode) is "
                            "defined from opset 12", 12)
    node = site.node
    new = [helper.make_node("Identity", [node.input[0]], [node.output[0]],
                            name=node.name or site.fresh(f"{site.label}/identity"))]
    if len(node.output) > 1 and node.output[1]:
        shape = site.add(new, "Shape", [node.input[0]], "shape")
        new.append(helper.make_node("ConstantOfShape", [shape], [node.output[1]],
                                    name=site.fresh(f"{site.label}/mask"),
                                    value=helper.make_tensor("true", TensorProto.BOOL, [1],
                                                             [True])))
    site.replacement = new


def _pool_ceil(site: Site) -> None:
    """With ceil_mode=1 the output-size rule of the pools changed (a last window that
    starts in the padding is dropped); where it gives another size at the target, the
    node is refused."""
    if not site.attr("ceil_mode", 0):
        return
    shape = site.shape(site.node.input[0])
    elem = site.elem_type(site.node.input[0])
    if shape is None or elem is None or not all(isinstance(d, int) for d in shape):
        raise CannotSay(f"{site.node.op_type} with ceil_mode=1 on an input of unknown shape: "
                        f"the output-size rule before opset 19 may differ", 19)
    sizes = [_inferred_shape(site.node, elem, shape, version)
             for version in (site.target, NEWEST_OPSET)]
    if sizes[0] != sizes[1]:
        raise CannotSay(f"{site.node.op_type} with ceil_mode=1 gives output {sizes[1]} from "
                        f"opset 19 and {sizes[0]} at {site.target} (a last window starting "
                        f"in the padding)", 19)


def _inferred_shape(node: onnx.NodeProto, elem: int, shape: Any, version: int) -> Any:
    single = onnx.NodeProto()
    single.CopyFrom(node)
    del single.output[1:]
    graph = helper.make_graph([single], "pool", [helper.make_tensor_value_info(
        node.input[0], elem, list(shape))], [onnx.ValueInfoProto(name=single.output[0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", version)])
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception:  # noqa: BLE001
        return None
    dims = inferred.graph.output[0].type.tensor_type.shape.dim
    return [d.dim_value for d in dims]


def _batch_normalization_14(site: Site) -> None:
    """training_mode=1 is refused; at inference the extra outputs are dropped."""
    if site.attr("training_mode", 0):
        raise CannotSay("BatchNormalization in training mode is defined from opset 14", 14)
    site.drop_attr("training_mode")
    del site.node.output[1:]


def _batch_normalization_15(site: Site) -> None:
    """BatchNormalization-15 lets scale/bias (T1) and mean/var (T2) differ in type from X;
    before it they are all X's type, so they are cast to it."""
    x_type = site.elem_type(site.node.input[0])
    if x_type is None:
        return
    for position in range(1, len(site.node.input)):
        name = site.node.input[position]
        if name and site.elem_type(name) not in (None, x_type):
            site.node.input[position] = site.add(site.before, "Cast", [name],
                                                 f"as_x{position}", to=x_type)


_QUANT_RANGES: dict[int, tuple[float, float]] = {
    TensorProto.UINT8: (0.0, 255.0), TensorProto.INT8: (-128.0, 127.0),
    TensorProto.UINT16: (0.0, 65535.0), TensorProto.INT16: (-32768.0, 32767.0)}


def _quantize_13(site: Site) -> None:
    """QuantizeLinear/DequantizeLinear-13's axis: before it, only a per-tensor scale; a
    per-axis one is written in arithmetic (:func:`_quantize_arithmetic`)."""
    scale = site.shape(site.input(1))
    if scale is not None and (len(scale) == 0 or scale == (1,)):
        site.drop_attr("axis")
        return
    _quantize_arithmetic(site, 13)


def _quantize_arithmetic(site: Site, since: int) -> None:
    """QuantizeLinear/DequantizeLinear in arithmetic, for a per-axis or blocked scale or a
    16-bit type the target's op lacks: dequantize (x - zero_point) * scale, quantize
    Clip(Round(x / scale) + zero_point) to the type's range (Round-11 rounds half to even,
    as QuantizeLinear does), in float32; the scale and zero point reshaped to lie along the
    axis, a blocked one repeated block_size times along it and cut to the input's length."""
    node = site.node
    rank = site.rank(node.input[0])
    scale_shape = site.shape(site.input(1))
    block = int(site.attr("block_size", 0))
    if rank is None or scale_shape is None:
        raise CannotSay(f"{node.op_type} with a per-axis, blocked or 16-bit form needs "
                        f"known ranks below opset {since}", since)
    axis = int(site.attr("axis", 1)) % rank if rank else 0
    zero = site.input(2)
    new: list[onnx.NodeProto] = []

    def along(name: str, hint: str) -> str:
        """A per-axis or blocked parameter broadcast against the input."""
        if len(scale_shape) == 0 or scale_shape == (1,) and not block:
            return name
        if not block:
            shape = site.const("along_axis", np.array(
                [-1 if a == axis else 1 for a in range(rank)], dtype=np.int64))
            return site.add(new, "Reshape", [name, shape], hint)
        # blocked: (..., B, ...) -> (..., B, block, ...) -> (..., B * block, ...) -> cut
        param_shape = site.add(new, "Shape", [name], f"{hint}_shape0")
        with_block = site.add(new, "Concat", [
            site.add(new, "Slice", [param_shape, site.const("zero0", np.array([0], np.int64)),
                                    site.const("through_axis", np.array([axis + 1],
                                                                        np.int64))],
                     f"{hint}_head"),
            site.const("one_dim", np.array([1], np.int64)),
            site.add(new, "Slice", [param_shape, site.const("after0", np.array([axis + 1],
                                                                              np.int64)),
                                    site.const("end0", np.array([rank], np.int64))],
                     f"{hint}_tail")], f"{hint}_with_block", axis=0)
        unsqueezed = site.add(new, "Reshape", [name, with_block], f"{hint}_unsq")
        repeats = site.const("repeats", np.array([1] * (axis + 1) + [block] +
                                                 [1] * (rank - axis - 1), dtype=np.int64))
        tiled = site.add(new, "Tile", [unsqueezed, repeats], f"{hint}_tiled")
        merged_shape = site.add(new, "Concat", [
            site.add(new, "Slice", [site.add(new, "Shape", [name], f"{hint}_shape"),
                                    site.const("zero", np.array([0], np.int64)),
                                    site.const("axis_end", np.array([axis], np.int64))],
                     f"{hint}_before"),
            site.const("merged", np.array([-1], np.int64)),
            site.add(new, "Slice", [site.add(new, "Shape", [name], f"{hint}_shape2"),
                                    site.const("after_axis", np.array([axis + 1], np.int64)),
                                    site.const("end", np.array([rank], np.int64))],
                     f"{hint}_after")], f"{hint}_merged_shape", axis=0)
        merged = site.add(new, "Reshape", [tiled, merged_shape], f"{hint}_merged")
        length = site.add(new, "Slice", [site.add(new, "Shape", [node.input[0]], "x_shape"),
                                         site.const("axis_at", np.array([axis], np.int64)),
                                         site.const("axis_next", np.array([axis + 1],
                                                                          np.int64))],
                          "length")
        return site.add(new, "Slice", [merged, site.const("start", np.array([0], np.int64)),
                                       length, site.const("cut_axis", np.array([axis],
                                                                               np.int64))],
                        f"{hint}_cut")

    scale = along(node.input[1], "scale")
    float_scale = site.elem_type(node.input[1]) == TensorProto.FLOAT
    if not float_scale:
        raise CannotSay(f"{node.op_type} with a non-float32 scale is defined from opset 19",
                        19)
    if node.op_type == "DequantizeLinear":
        x = site.add(new, "Cast", [node.input[0]], "x_float", to=TensorProto.FLOAT)
        if zero:
            x = site.add(new, "Sub", [x, site.add(new, "Cast", [along(zero, "zp")],
                                                  "zp_float", to=TensorProto.FLOAT)],
                         "centered")
        new.append(helper.make_node("Mul", [x, scale], [node.output[0]],
                                    name=node.name or site.fresh(f"{site.label}/dequantized")))
    else:
        out_type = site.elem_type(zero) if zero else \
            (site.attr("output_dtype", 0) or TensorProto.UINT8)
        if out_type not in _QUANT_RANGES:
            raise CannotSay(f"QuantizeLinear to {_type_name(out_type or 0)} is defined from "
                            f"opset {since}", since)
        low, high = _QUANT_RANGES[out_type]
        if site.elem_type(node.input[0]) != TensorProto.FLOAT:
            raise CannotSay("QuantizeLinear of a non-float32 input in this form is defined "
                            "from opset 19", 19)
        q = site.add(new, "Round", [site.add(new, "Div", [node.input[0], scale], "scaled")],
                     "rounded")
        if zero:
            q = site.add(new, "Add", [q, site.add(new, "Cast", [along(zero, "zp")],
                                                  "zp_float", to=TensorProto.FLOAT)],
                         "shifted")
        q = site.add(new, "Clip", [q, site.const("low", np.array(low, np.float32)),
                                   site.const("high", np.array(high, np.float32))], "clipped")
        new.append(helper.make_node("Cast", [q], [node.output[0]], to=out_type,
                                    name=node.name or site.fresh(f"{site.label}/quantized")))
    site.replacement = new


def _quantize_19(site: Site) -> None:
    """saturate is dropped (it applies to float8 outputs only, which are refused)."""
    site.drop_attr("saturate")  # only float8 outputs saturate, and they are refused


def _quantize_21(site: Site) -> None:
    """block_size, output_dtype and the 16-bit types go to the arithmetic form (below);
    otherwise both attributes are dropped."""
    types = {site.elem_type(site.input(2)), site.elem_type(site.node.input[0]),
             site.attr("output_dtype", 0)}
    if site.attr("block_size", 0) or types & {TensorProto.INT16, TensorProto.UINT16}:
        _quantize_arithmetic(site, 21)
        return
    if site.attr("output_dtype", 0) not in (0, TensorProto.UINT8) and not site.input(2):
        _quantize_arithmetic(site, 21)
        return
    site.drop_attr("block_size", "output_dtype")


def _cast_19(site: Site) -> None:
    """saturate is dropped (it applies to float8 types only, which are refused)."""
    site.drop_attr("saturate")  # meaningful only for float8 types, which are refused


def _dft_20(site: Site) -> None:
    """DFT-20 takes axis as an input (default -2); DFT-17 as an attribute (default 1)."""
    name = site.input(2)
    axis = -2
    if name:
        value = site.constant(name)
        if value is None:
            raise CannotSay("DFT reads its axis at run time; before opset 20 it is an "
                            "attribute", 20)
        axis = int(np.asarray(value).reshape(-1)[0])
    rank = site.rank(site.node.input[0])
    if axis < 0:
        if rank is None:
            raise CannotSay("DFT-20's negative axis needs the input's rank, unknown here", 20)
        axis += rank
    site.set_attr("axis", axis)
    del site.node.input[2:]


def _grid_sample_20(site: Site) -> None:
    """GridSample-20 names its modes linear/cubic and takes N-D input; GridSample-16 says
    bilinear/bicubic, 4-D only. Below 16 the GridSample pattern takes either spelling
    and 5-D input, so the node is left as it is."""
    if site.target < 16:
        return
    rank = site.rank(site.node.input[0])
    if rank is not None and rank != 4:
        site.lower_by_pattern(f"GridSample on a {rank}-D input is defined from opset 20", 20)
        return
    mode = site.attr("mode", b"linear")
    renamed = {b"linear": "bilinear", b"cubic": "bicubic", b"nearest": "nearest"}
    site.set_attr("mode", renamed.get(mode, mode.decode()))


def _needs_default(attribute: str, default: Any, since: int) -> Adapter:
    def adapter(site: Site) -> None:
        value = site.attr(attribute, default)
        if isinstance(value, list):
            same = all(v == default for v in value)
        else:
            same = value == default
        if not same:
            raise CannotSay(f"{site.node.op_type} with {attribute}={value!r} is defined "
                            f"from opset {since}", since)
        site.drop_attr(attribute)

    adapter.__doc__ = f"{attribute} must hold {default!r} (refused otherwise) and is dropped"
    return adapter


def _recurrent_layout(site: Site) -> None:
    """RNN/GRU/LSTM-14's layout=1 (batch first): before 14 the sequence comes first, so X,
    the initial states and the outputs are transposed around the node."""
    if not site.attr("layout", 0):
        site.drop_attr("layout")
        return
    site.drop_attr("layout")
    node = site.node
    if node.input[0]:
        node.input[0] = site.add(site.before, "Transpose", [node.input[0]], "x_seq_first",
                                 perm=[1, 0, 2])
    for position in (5, 6):  # initial_h, initial_c: [batch, dirs, hidden] -> [dirs, ...]
        if position < len(node.input) and node.input[position]:
            node.input[position] = site.add(site.before, "Transpose", [node.input[position]],
                                            f"state{position}", perm=[1, 0, 2])
    for index, perm in ((0, [2, 0, 1, 3]), (1, [1, 0, 2]), (2, [1, 0, 2])):
        if index < len(node.output) and node.output[index]:
            original = node.output[index]
            inner = site.fresh(f"{site.label}/seq_first{index}")
            node.output[index] = inner
            site.after.append(helper.make_node("Transpose", [inner], [original], perm=perm,
                                               name=site.fresh(f"{site.label}/batch_first"
                                                               f"{index}")))


def _integer_extremum(site: Site) -> None:
    """Max/Min-12 take integers; before 12 only floats, which cannot hold every 64-bit
    integer: a chain of Where(Greater/Less) over the (broadcast) inputs says them exactly
    (uint64: other + (current - other) * picked, wrapping; ONNX Runtime has no uint64 Where
    kernel)."""
    elem = site.elem_type(site.node.input[0])
    if elem not in (TensorProto.INT64, TensorProto.UINT64):
        return  # narrower integers are carried in float or double exactly
    node = site.node
    compare = "Greater" if node.op_type == "Max" else "Less"
    new: list[onnx.NodeProto] = []
    inputs = [name for name in node.input if name]
    current = inputs[0]
    for index, other in enumerate(inputs[1:], start=1):
        last = index == len(inputs) - 1
        picked = site.add(new, compare, [current, other], f"keep{index}")
        output = node.output[0] if last else site.fresh(f"{site.label}/running{index}")
        if elem == TensorProto.UINT64:
            # other + (current - other) * picked, in wrapping uint64 arithmetic: exact
            # (ONNX Runtime has no uint64 Where kernel)
            step = site.add(new, "Mul", [site.add(new, "Sub", [current, other],
                                                  f"gap{index}"),
                                         site.add(new, "Cast", [picked], f"pick{index}",
                                                  to=TensorProto.UINT64)], f"step{index}")
            new.append(helper.make_node("Add", [other, step], [output],
                                        name=site.fresh(f"{site.label}/pick{index}")))
        else:
            new.append(helper.make_node("Where", [picked, current, other], [output],
                                        name=site.fresh(f"{site.label}/where{index}")))
        current = output
    if len(inputs) == 1:
        new.append(helper.make_node("Identity", [current], [node.output[0]],
                                    name=node.name or site.fresh(f"{site.label}/identity")))
    site.replacement = new


def _select_last_index(site: Site) -> None:
    """ArgMax/ArgMin-12's select_last_index=1: the first index along the reversed axis,
    counted from the end."""
    if not site.attr("select_last_index", 0):
        site.drop_attr("select_last_index")
        return
    node = site.node
    axis = int(site.attr("axis", 0))
    keepdims = int(site.attr("keepdims", 1))
    new: list[onnx.NodeProto] = []
    reversed_x = site.add(new, "Slice", [
        node.input[0], site.const("from_end", np.array([-1], dtype=np.int64)),
        site.const("past_start", np.array([-(1 << 62)], dtype=np.int64)),
        site.const("axis", np.array([axis], dtype=np.int64)),
        site.const("back", np.array([-1], dtype=np.int64))], "reversed")
    first = site.add(new, node.op_type, [reversed_x], "first", axis=axis, keepdims=keepdims)
    length = site.add(new, "Gather", [site.add(new, "Shape", [node.input[0]], "shape"),
                                      site.const("at", np.array(axis, dtype=np.int64))],
                      "length", axis=0)
    last = site.add(new, "Sub", [length, site.const("one", np.array(1, dtype=np.int64))],
                    "last")
    new.append(helper.make_node("Sub", [last, first], [node.output[0]],
                                name=site.fresh(f"{site.label}/from_start")))
    site.replacement = new


_NUMPY_OF: dict[int, Any] = {
    TensorProto.FLOAT: np.float32, TensorProto.DOUBLE: np.float64,
    TensorProto.FLOAT16: np.float16, TensorProto.INT32: np.int32, TensorProto.INT64: np.int64,
    TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT16: np.int16,
    TensorProto.UINT16: np.uint16, TensorProto.UINT32: np.uint32, TensorProto.UINT64: np.uint64}
_SIGNED_BITS: dict[int, int] = {TensorProto.INT8: 8, TensorProto.INT16: 16, TensorProto.INT32: 32,
                TensorProto.INT64: 64}


def _bit_shift_28(site: Site) -> None:
    """BitShift-28 takes signed integers (a right shift sign-extends; a shift by a negative
    amount or by the width or more gives the sign extension alone: -1 or 0); BitShift-11
    only unsigned ones. Computed in 64 bits: the bit pattern shifted as uint64 (a negative
    x right-shifted as -(((-x - 1) >> y)) - 1), then the low bits cast back to the type."""
    elem = site.elem_type(site.node.input[0])
    if elem not in _SIGNED_BITS:
        return
    node = site.node
    right = site.attr("direction", b"") == b"RIGHT"
    new: list[onnx.NodeProto] = []
    i64, u64 = TensorProto.INT64, TensorProto.UINT64
    x = site.add(new, "Cast", [node.input[0]], "x64", to=i64) if elem != i64 else \
        node.input[0]
    y = site.add(new, "Cast", [node.input[1]], "y64", to=i64) if elem != i64 else \
        node.input[1]
    zero = site.const("zero", np.array(0, dtype=np.int64))
    one = site.const("one", np.array(1, dtype=np.int64))
    bits = site.const("bits", np.array(_SIGNED_BITS[elem], dtype=np.int64))
    valid = site.add(new, "And", [site.add(new, "Not", [site.add(new, "Less", [y, zero],
                                                                 "y_negative")], "y_sign_ok"),
                                  site.add(new, "Less", [y, bits], "y_in_width")], "valid")
    amount = site.add(new, "Cast", [site.add(new, "Where", [valid, y, zero], "y_valid")],
                      "amount", to=u64)
    if right:
        negative = site.add(new, "Less", [x, zero], "x_negative")
        flipped = site.add(new, "Sub", [site.add(new, "Neg", [x], "minus_x"), one],
                           "not_x")  # -x - 1 = ~x: never overflows
        magnitude = site.add(new, "Where", [negative, flipped, x], "magnitude")
        shifted = site.add(new, "Cast", [site.add(new, "BitShift", [
            site.add(new, "Cast", [magnitude], "magnitude_u64", to=u64), amount],
            "shifted_u64", direction="RIGHT")], "shifted", to=i64)
        back = site.add(new, "Sub", [site.add(new, "Neg", [shifted], "minus_shifted"), one],
                        "not_shifted")
        result = site.add(new, "Where", [negative, back, shifted], "arithmetic")
        fill = site.add(new, "Where", [negative, site.const("all_ones", np.array(
            -1, dtype=np.int64)), zero], "sign_fill")
    else:
        result = site.add(new, "Cast", [site.add(new, "BitShift", [
            site.add(new, "Cast", [x], "x_u64", to=u64), amount], "shifted_u64",
            direction="LEFT")], "shifted", to=i64)
        fill = zero
    outcome = node.output[0] if elem == i64 else site.fresh(f"{site.label}/result64")
    new.append(helper.make_node("Where", [valid, result, fill], [outcome],
                                name=site.fresh(f"{site.label}/where_valid")))
    if elem != i64:
        new.append(helper.make_node("Cast", [outcome], [node.output[0]], to=elem,
                                    name=node.name or site.fresh(f"{site.label}/low_bits")))
    site.replacement = new


def _roi_align_16(site: Site) -> None:
    """RoiAlign-16's coordinate_transformation_mode defaults to half_pixel; RoiAlign-10
    always computes output_half_pixel."""
    if site.attr("coordinate_transformation_mode", b"half_pixel") != b"output_half_pixel":
        raise CannotSay("RoiAlign's half_pixel coordinates (the default from opset 16) are "
                        "defined from opset 16", 16)
    site.drop_attr("coordinate_transformation_mode")


def _mod_28(site: Site) -> None:
    """Mod-28 takes floats with fmod=0 (the sign of the divisor, as Python's %); before it
    only fmod=1 does: r = fmod(a, b), then b is added where r is nonzero and its sign
    differs from b's, and a zero takes b's sign (what numpy's remainder computes)."""
    elem = site.elem_type(site.node.input[0])
    if site.attr("fmod", 0) or elem not in (TensorProto.FLOAT, TensorProto.DOUBLE,
                                            TensorProto.FLOAT16):
        return
    node = site.node
    a, b = node.input[0], node.input[1]
    new: list[onnx.NodeProto] = []
    r = site.add(new, "Mod", [a, b], "fmod", fmod=1)
    zero = site.add(new, "Sub", [r, r], "zero")  # 0 of r's type and shape (NaN stays NaN)
    r_negative = site.add(new, "Less", [r, zero], "r_negative")
    b_negative = site.add(new, "Less", [b, zero], "b_negative")
    nonzero = site.add(new, "Not", [site.add(new, "Equal", [r, zero], "r_is_zero")],
                       "r_nonzero")
    differ = site.add(new, "And", [nonzero, site.add(new, "Xor", [r_negative, b_negative],
                                                       "signs_differ")], "shift")
    shifted = site.add(new, "Where", [differ, site.add(new, "Add", [r, b], "r_plus_b"), r],
                       "shifted")
    signed_zero = site.add(new, "Mul", [site.add(new, "Abs", [r], "abs_r"),
                                        site.add(new, "Sign", [b], "sign_b")], "signed_zero")
    new.append(helper.make_node("Where", [nonzero, shifted, signed_zero], [node.output[0]],
                                name=site.fresh(f"{site.label}/remainder")))
    site.replacement = new


def _space_to_depth_28(site: Site) -> None:
    """mode DCR is dropped (the older behaviour); CRD is refused."""
    if site.attr("mode", b"DCR") != b"DCR":
        raise CannotSay("SpaceToDepth's mode 'CRD' is defined from opset 28", 28)
    site.drop_attr("mode")


def _range_27(site: Site) -> None:
    """stash_type is dropped (it applies to float16/bfloat16 only, which are refused)."""
    site.drop_attr("stash_type")  # only float16/bfloat16 use it, and they are refused


ADAPTERS: dict[tuple[str, int], Adapter] = {
    **{(op, 13): _axes_to_attribute(key, 13)
       for op, key in (("Squeeze", "axes"), ("Unsqueeze", "axes"), ("Split", "split"))},
    ("ReduceSum", 13): _reduce_with_axes_input(13),
    **{(op, 18): _reduce_with_axes_input(18)
       for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
                  "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")},
    ("Split", 18): _split_num_outputs,
    ("Pad", 18): _pad_axes,
    ("Pad", 19): _pad_wrap,
    ("Shape", 15): _shape_bounds,
    ("Reshape", 14): _reshape_allowzero,
    **{(op, 13): _softmax_axis for op in ("Softmax", "LogSoftmax", "Hardmax")},
    ("Resize", 13): _resize_13,
    ("Resize", 18): _resize_18,
    ("Resize", 19): _resize_19,
    ("ScatterElements", 16): _scatter_reduction(16, ("add", "mul")),
    ("ScatterND", 16): _scatter_reduction(16, ("add", "mul")),
    ("ScatterElements", 18): _scatter_reduction(18, ("max", "min")),
    ("ScatterND", 18): _scatter_reduction(18, ("max", "min")),
    ("Constant", 12): _constant_12,
    ("Dropout", 12): _dropout_12,
    ("BatchNormalization", 14): _batch_normalization_14,
    ("BatchNormalization", 15): _batch_normalization_15,
    ("QuantizeLinear", 13): _quantize_13,
    ("DequantizeLinear", 13): _quantize_13,
    ("QuantizeLinear", 19): _quantize_19,
    ("QuantizeLinear", 21): _quantize_21,
    ("DequantizeLinear", 21): _quantize_21,
    ("Cast", 19): _cast_19,
    ("CastLike", 19): _cast_19,
    ("DFT", 20): _dft_20,
    ("GridSample", 20): _grid_sample_20,
    ("GatherND", 12): _needs_default("batch_dims", 0, 12),
    ("MaxPool", 22): _pool_ceil,
    ("AveragePool", 22): _pool_ceil,
    ("ArgMax", 12): _select_last_index,
    ("ArgMin", 12): _select_last_index,
    ("Max", 12): _integer_extremum,
    ("Min", 12): _integer_extremum,
    ("AveragePool", 19): _needs_default("dilations", 1, 19),
    ("RoiAlign", 16): _roi_align_16,
    **{(op, 14): _recurrent_layout for op in ("RNN", "GRU", "LSTM")},
    ("Mod", 28): _mod_28,
    ("BitShift", 28): _bit_shift_28,
    ("SpaceToDepth", 28): _space_to_depth_28,
    ("Range", 27): _range_27,
}


def adapter_table(has_pattern: Callable[[str], bool] = lambda op_type: False
                  ) -> list[tuple[str, int, int, str]]:
    """(op, version, previous version, what going below ``version`` does) for every
    default-domain op version from 12 to the newest: the rows of docs/opset-adapters.md.
    ``has_pattern`` says which new ops a registered pattern lowers."""
    rows = []
    for op_type in sorted(_HISTORY):
        versions = _HISTORY[op_type]
        for previous, version in zip([None, *versions], versions, strict=False):
            if version <= 11:
                continue
            if previous is None:
                schema = _schema(op_type, version)
                if has_pattern(op_type):
                    how = "new op: lowered by its pattern"
                elif schema is not None and (schema.has_function or
                                             schema.has_context_dependent_function):
                    how = "new op: replaced by ONNX's own function body, taken down in turn"
                else:
                    how = "new op: refused (no pattern and no function body lowers it)"
                rows.append((op_type, version, 0, how))
                continue
            rows.append((op_type, version, previous, _describe_step(op_type, version,
                                                                   previous)))
    return rows


def _describe_step(op_type: str, version: int, previous: int) -> str:
    newer, older = _schema(op_type, version), _schema(op_type, previous)
    parts = []
    adapter = ADAPTERS.get((op_type, version))
    if adapter is not None and adapter.__doc__:
        parts.append(" ".join(adapter.__doc__.split()).rstrip(".").replace("``", "`"))
    if newer is not None and older is not None:
        added = sorted(set(newer.attributes) - set(older.attributes))
        if added and adapter is None:
            parts.append("new attribute(s) " + ", ".join(added) + " must hold the default "
                         "(dropped)")
        if newer.max_input > older.max_input and adapter is None:
            parts.append("new input(s) must be absent")
        old_types = {c.type_param_str: set(c.allowed_type_strs)
                     for c in older.type_constraints}
        new_types = sorted({t.removeprefix("tensor(").rstrip(")")
                            for c in newer.type_constraints
                            for t in set(c.allowed_type_strs)
                            - old_types.get(c.type_param_str, set())})
        if new_types:
            how = ("refused" if op_type in _NO_CARRIER else
                   "carried in a wider type with a Cast each side where one holds every "
                   "value, else refused")
            parts.append(f"new types {', '.join(new_types)}: {how}")
    return "; ".join(parts) or "no change in signature: the node is kept"

