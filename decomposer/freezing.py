"""Fix input dims, freeze inputs to constants, and fold what they decide (onnxslim).

In: a model and ``shapes`` (graph input name -> dims: ints, or a str to keep a dim
symbolic: ``--overwrite-input-shape NAME:1x3x224x224``), ``values`` (graph input name ->
array: ``--freeze-input NAME=VALUE``) and ``fold``. Out: :func:`fix_inputs` gives the
model with those dims written into its inputs, the frozen inputs turned into initializers,
and, with ``fold`` (always when something was fixed), the shape arithmetic and the
branches they decide folded away: ``Shape -> Gather -> Range`` over now-static sizes
become constants, an ``If`` on a frozen condition is replaced by its branch, a TopK's
computed K becomes a constant. Engines that need static sizes (ncnn, RKNN) or have no
control flow then read it.

The folding is onnxslim's constant folding and nothing else (its fusions, dead-node and
common-subexpression passes are off), measured to be exact, deterministic and to keep
node names. What it would lose is put back here: the model's, graph's and nodes' doc
strings, the order of the nodes it kept (a stable topological sort on their original
positions), value_info written once per name, and graph inputs that also have an
initializer (an overridable default it would fold away).

Errors are :class:`decomposer.errors.InvalidModelError`, one line: an unknown input name,
a rank or shape that disagrees with the input's, a value of the wrong size.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from decomposer.errors import InvalidModelError

__all__ = ["fix_inputs", "fold", "parse_shape", "parse_value"]

Dims = Sequence[int | str]


def parse_shape(text: str) -> tuple[str, list[int | str]]:
    """``NAME:1x3x224x224`` (or ``NAME:1,3,224,224``; a non-number keeps a dim symbolic)."""
    name, sep, dims = text.rpartition(":")
    if not sep or not name or not dims:
        raise InvalidModelError(f"--overwrite-input-shape {text!r}: expected "
                                "NAME:DIMS such as images:1x3x640x640")
    parts = dims.replace(",", "x").split("x")
    return name, [int(p) if p.strip().isdigit() else p.strip() for p in parts]


def parse_value(text: str) -> tuple[str, list[float]]:
    """``NAME=VALUE`` or ``NAME=1,2,3``: the values of a frozen input, flat."""
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise InvalidModelError(f"--freeze-input {text!r}: expected NAME=VALUE such as "
                                "sr=16000")
    try:
        return name, [float(v) for v in value.split(",")]
    except ValueError:
        raise InvalidModelError(f"--freeze-input {text!r}: VALUE must be numbers separated "
                                "by commas") from None


def fix_inputs(model: onnx.ModelProto, shapes: Mapping[str, Dims] | None = None,
               values: Mapping[str, object] | None = None, *, always_fold: bool = False
               ) -> onnx.ModelProto:
    """A copy of ``model`` with ``shapes`` written into its inputs, ``values`` frozen, and
    the result folded (also with nothing to fix when ``always_fold``)."""
    shapes, values = dict(shapes or {}), dict(values or {})
    if not shapes and not values and not always_fold:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inputs = {value.name: value for value in out.graph.input}
    initialized = {init.name for init in out.graph.initializer}
    for name in [*shapes, *values]:
        if name not in inputs or name in initialized:
            raise InvalidModelError(f"no graph input {name!r} to fix; the model's inputs: "
                                    f"{', '.join(n for n in inputs if n not in initialized)}")
    for name, dims in shapes.items():
        _write_dims(inputs[name], list(dims))
    for name, given in values.items():
        value = inputs[name]
        elem = value.type.tensor_type.elem_type
        array = np.asarray(given, dtype=helper.tensor_dtype_to_np_dtype(elem))
        array = _shaped(name, array, value.type.tensor_type)
        out.graph.input.remove(value)
        out.graph.initializer.append(numpy_helper.from_array(array, name))
    return fold(out)


def _shaped(name: str, array: np.ndarray, tensor: onnx.TypeProto.Tensor) -> np.ndarray:
    """The flat values of a frozen input in the input's declared shape."""
    if not tensor.HasField("shape"):
        return array.reshape(()) if array.size == 1 else array.reshape(-1)
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim]
    if len(dims) == 1 and dims[0] is None:
        return array.reshape(-1)
    known = [int(d) for d in dims if d is not None]
    if len(known) != len(dims):
        raise InvalidModelError(f"--freeze-input {name}: the input's shape has unknown dims; "
                                "give them with --overwrite-input-shape too")
    if array.size != int(np.prod(known)):
        raise InvalidModelError(f"--freeze-input {name}: {array.size} value(s) for an input "
                                f"of shape {known}")
    return array.reshape(known)


def _write_dims(value: onnx.ValueInfoProto, dims: list[int | str]) -> None:
    tensor = value.type.tensor_type
    if tensor.HasField("shape") and len(tensor.shape.dim) != len(dims):
        raise InvalidModelError(f"--overwrite-input-shape {value.name}: {len(dims)} dims "
                                f"for an input of rank {len(tensor.shape.dim)}")
    old = list(tensor.shape.dim)
    for index, dim in enumerate(dims):
        known = old[index].dim_value if index < len(old) and \
            old[index].HasField("dim_value") else None
        if isinstance(dim, int) and known is not None and known != dim:
            raise InvalidModelError(f"--overwrite-input-shape {value.name}: dim {index} is "
                                    f"{known} in the model, not {dim}")
    del tensor.shape.dim[:]
    for dim in dims:
        entry = tensor.shape.dim.add()
        if isinstance(dim, int):
            entry.dim_value = dim
        else:
            entry.dim_param = dim


def fold(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with onnxslim's constant folding, and what it loses put back."""
    try:
        from onnxslim import slim
        from onnxslim.core.pattern.registry import DEFAULT_FUSION_PATTERNS
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise InvalidModelError("fixing inputs needs onnxslim: pip install onnxslim") from exc
    graph = model.graph
    # inputs with an initializer (overridable defaults) are not folded: set them aside
    overridable = {value.name for value in graph.input} & \
        {init.name for init in graph.initializer}
    held = [init for init in graph.initializer if init.name in overridable]
    work = onnx.ModelProto()
    work.CopyFrom(model)
    kept_inits = [init for init in work.graph.initializer if init.name not in overridable]
    del work.graph.initializer[:]
    work.graph.initializer.extend(kept_inits)
    try:
        slimmed = slim(work, skip_optimizations=["graph_fusion", "dead_node_elimination",
                                                 "subexpression_elimination", "weight_tying"],
                       skip_fusion_patterns=list(DEFAULT_FUSION_PATTERNS))
    except Exception as exc:  # noqa: BLE001 - one line for whatever the folder met
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidModelError(f"folding the fixed inputs failed (onnxslim): {first}") \
            from None
    if not isinstance(slimmed, onnx.ModelProto):  # pragma: no cover - slim's contract
        raise InvalidModelError("folding the fixed inputs failed (onnxslim returned nothing)")
    slimmed.graph.initializer.extend(held)
    _restore(model, slimmed)
    return slimmed


def _restore(original: onnx.ModelProto, out: onnx.ModelProto) -> None:
    out.doc_string = original.doc_string
    out.graph.doc_string = original.graph.doc_string
    out.graph.name = original.graph.name
    docs = {node.name: node.doc_string for node in original.graph.node if node.name}
    for node in out.graph.node:
        if node.name in docs:
            node.doc_string = docs[node.name]
    seen: set[str] = set()
    unique = []
    for value in out.graph.value_info:
        if value.name not in seen:
            seen.add(value.name)
            unique.append(value)
    del out.graph.value_info[:]
    out.graph.value_info.extend(unique)
    _reorder(original.graph, out.graph)


def _reorder(original: onnx.GraphProto, graph: onnx.GraphProto) -> None:
    """The graph's nodes in their original order: a stable topological sort whose
    priority is each node's original position (a node the folder wrote takes that of the
    kept node before it)."""
    where = {(node.op_type, node.output[0] if node.output else node.name): index
             for index, node in enumerate(original.node)}
    nodes = list(graph.node)
    priority: list[tuple[float, int]] = []
    last = -1.0
    for order, node in enumerate(nodes):
        key = (node.op_type, node.output[0] if node.output else node.name)
        position = where.get(key)
        last = float(position) if position is not None else last
        priority.append((last, order))
    producer = {name: index for index, node in enumerate(nodes) for name in node.output}
    needs: list[set[int]] = []
    for node in nodes:
        needs.append({producer[name] for name in _reads(node) if name in producer})
    users: dict[int, list[int]] = {}
    for index, deps in enumerate(needs):
        for dep in deps:
            users.setdefault(dep, []).append(index)
    waiting = [len(deps) for deps in needs]
    ready = [(priority[i], i) for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    ordered = []
    while ready:
        _, index = heapq.heappop(ready)
        ordered.append(nodes[index])
        for user in users.get(index, []):
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, (priority[user], user))
    if len(ordered) != len(nodes):  # pragma: no cover - the folder wrote a cycle
        return
    copies = [onnx.NodeProto() for _ in ordered]
    for copy, node in zip(copies, ordered, strict=True):
        copy.CopyFrom(node)
    del graph.node[:]
    graph.node.extend(copies)


def _reads(node: onnx.NodeProto) -> list[str]:
    """The names a node reads, its subgraphs' outer reads included."""
    names = [name for name in node.input if name]
    for attribute in node.attribute:
        graphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else \
            list(attribute.graphs)
        for sub in graphs:
            for inner in sub.node:
                names.extend(_reads(inner))
    return names
