"""What each inference engine lacks among standard ONNX ops: the project's measured
portability knowledge, machine-readable.

In: a model (usually decomposed) and engine names. Out: :func:`engine_gaps`, per engine, one
entry per op type of the model that engine cannot run (or runs with other numbers) at the
model's opset: the op, how many nodes, why (the evidence), and the ``--lower`` that fixes it
(None when no pattern can). The knowledge lives in one data file,
``decomposer/data/engine_support.json``, from which docs/portability.md's engine table is
generated; ``tests/test_engine_support.py`` re-measures its ONNX Runtime, OpenVINO and TVM
entries. Conditions an entry may carry: ``min_opset`` and ``max_opset`` (the model's opsets
the gap spans), ``when`` = ``size_not_constant`` (AffineGrid's size input is not a
constant), ``mode_max`` (the node's ``mode`` attribute is "max"), ``blocked`` (a
``block_size`` attribute is set: blocked quantization), ``blocked_zero_point`` (that, with a
zero point) or ``per_channel_mixed_channels`` (a QLinearConv with a per-channel weight scale
whose output channel count differs from its input's), ``per_column`` (a QLinearMatMul whose
b scale or zero point is an initializer of more than one value), ``not_symmetric_int8`` (an
unblocked QuantizeLinear / DequantizeLinear with a constant zero point that is not int8 or
not all zero, a QuantizeLinear without one (uint8), or a DequantizeLinear of a uint8
initializer without one), ``antialias`` (``antialias=1``), ``reduction`` (a ``reduction``
other than none), ``k_from_shape`` / ``size_from_shape`` (TopK's K, Range's limit computed
from Shape outputs and constants: shape arithmetic that folds away once the input sizes are
static), ``cond_is_input`` (an If on a graph input), ``cond_from_shape`` /
``pads_from_shape`` / ``shape_from_shape`` (an If's condition, Pad's pads, Reshape's shape
computed from shapes while an input of the model has a dynamic dim). Besides ``lower``, a
row may name the fix its engine's ``--target`` applies: ``take_down`` (the opset where
decomposer.opsets writes the op in a form the engine runs) and ``fold`` (static shape
arithmetic folded: ``--overwrite-input-shape``); ``static`` says the fix needs static input
sizes, which ``check --engines`` then asks for (``--overwrite-input-shape``); ``kind`` =
``wrong`` marks an engine that runs the op with other numbers. A call of a model-local
function of a custom domain (kept under ``--target ort``) is a gap for each engine the data
file's ``local_functions`` entry says refuses it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from functools import cache
from pathlib import Path
from typing import Any

import onnx

from decomposer.graphs import all_graphs, all_nodes, norm_domain, opset_map

__all__ = ["contrib_support", "engine_gaps", "gap_nodes", "gaps", "known_engines",
           "majority_table", "majority_wrong", "table"]

DATA = Path(__file__).resolve().parent / "data" / "engine_support.json"
# A row's ``when`` -> how docs/portability.md's table says it
CONDITIONS: dict[str | None, str] = {
    None: "always", "size_not_constant": "its size is not a constant",
    "mode_max": "`mode=\"max\"`", "blocked": "`block_size` set",
    "blocked_zero_point": "`block_size` set, with a zero point",
    "per_channel_mixed_channels": "per-channel weights, input and output channel counts "
                                  "differ",
    "per_column": "per-column `b` scales or zero points",
    "not_symmetric_int8": "uint8 (or 16-bit) values or a non-zero zero point",
    "antialias": "`antialias=1`", "reduction": "a `reduction` is set",
    "k_from_shape": "K computed from a shape", "size_from_shape": "its limit computed from a shape",
    "cond_is_input": "its condition a graph input",
    "cond_from_shape": "its condition computed from a dynamic input's shape",
    "pads_from_shape": "its pads computed from a dynamic input's shape",
    "shape_from_shape": "its shape computed from a dynamic input's shape"}
# conditions on a node input computed from the shape of an input with a dynamic dim (an
# engine that folds static shape arithmetic itself runs them once the dims are fixed)
_FROM_DYNAMIC_SHAPE = {"cond_from_shape": 0, "pads_from_shape": 1, "shape_from_shape": 1}


@cache
def _data() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DATA.read_text(encoding="utf-8"))
    return loaded


def known_engines() -> list[str]:
    return list(_data()["engines"])


def contrib_support(domain: str, op_type: str) -> dict[str, Any] | None:
    """The measured engines of a contrib op no pattern rewrites, or whose measured form a
    pattern refuses (the data file's ``contrib``: ``runs``, the engines that ran a model
    holding it; ``refused``, engine -> the error it gave), or None when it was not
    measured."""
    for entry in _data().get("contrib", []):
        if entry["op"] == op_type and entry["domain"] == domain:
            return dict(entry)
    return None


def engine_label(name: str) -> str:
    """The engine's name and version as the data file records them."""
    label: str = _data()["engines"].get(name, name)
    return label


def gaps() -> list[dict[str, Any]]:
    """Every recorded gap (the data file's ``gaps``)."""
    return [dict(entry) for entry in _data()["gaps"]]


def _constants(graph: onnx.GraphProto) -> dict[str, list[int] | None]:
    """The graph's constant names, with an initializer's dims (None for a Constant node's)."""
    found: dict[str, list[int] | None] = {init.name: list(init.dims)
                                          for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and norm_domain(node.domain) == "":
            found.update((out, None) for out in node.output)
    return found


def _per_channel_mixed(node: onnx.NodeProto, constants: dict[str, list[int] | None]) -> bool:
    """A QLinearConv whose weight scale is per output channel and whose output channel
    count differs from its input's (the weight's M against C = (C / group) * group)."""
    if len(node.input) < 5:
        return False
    scale, weights = constants.get(node.input[4]), constants.get(node.input[3])
    if not scale or not weights or len(weights) < 2 or _product(scale) <= 1:
        return False
    group = next((a.i for a in node.attribute if a.name == "group"), 1) or 1
    return weights[0] != weights[1] * group


def _product(dims: list[int]) -> int:
    total = 1
    for dim in dims:
        total *= dim
    return total


def _shape_derived(graph: onnx.GraphProto, constants: dict[str, list[int] | None]
                   ) -> set[str]:
    """The tensors computed from Shape outputs and constants only (shape arithmetic: a
    constant once the input sizes are static and folded). A node of constants only (a Cast
    of a Constant, as paddle2onnx writes them into a shape's Concat) counts as a constant."""
    derived: set[str] = set()
    fixed = set(constants)
    for node in graph.node:
        inputs = [name for name in node.input if name]
        if node.op_type == "Shape" or (inputs and any(n in derived for n in inputs) and
                                       all(n in derived or n in fixed for n in inputs)):
            derived.update(node.output)
        elif inputs and all(n in fixed for n in inputs) and \
                not node.op_type.startswith("Random"):
            fixed.update(node.output)
    return derived


def _constant_tensors(graph: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """The graph's initializers and Constant nodes' ``value`` tensors, by name."""
    found = {init.name: init for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and norm_domain(node.domain) == "" and node.output:
            for attribute in node.attribute:
                if attribute.name == "value":
                    found[node.output[0]] = attribute.t
    return found


_SIGNED_QUANTIZED = {onnx.TensorProto.INT8, onnx.TensorProto.INT4,
                     onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E5M2}


def _not_symmetric_int8(node: onnx.NodeProto, tensors: dict[str, onnx.TensorProto]) -> bool:
    """An unblocked Q/DQ whose quantized side is not int8 (or int4/fp8) with zero point 0,
    as far as the constants tell (a run-time zero point or input type is not judged)."""
    if any(a.name == "block_size" and a.i for a in node.attribute):
        return False  # the blocked rows say what holds there
    if len(node.input) > 2 and node.input[2]:
        zero = tensors.get(node.input[2])
        if zero is None:
            return False
        return zero.data_type not in _SIGNED_QUANTIZED or bool(
            onnx.numpy_helper.to_array(zero).astype("float64").any())
    if node.op_type == "QuantizeLinear":
        return not any(a.name == "output_dtype" and a.i in _SIGNED_QUANTIZED
                       for a in node.attribute)
    data = tensors.get(node.input[0]) if node.input else None
    return data is not None and data.data_type == onnx.TensorProto.UINT8


def _applies(entry: dict[str, Any], node: onnx.NodeProto, opset: int,
             constants: dict[str, list[int] | None], derived: set[str] | None = None,
             graph_inputs: set[str] | None = None, dynamic: bool = False,
             tensors: dict[str, onnx.TensorProto] | None = None) -> bool:
    """Whether ``entry``'s gap holds for ``node``: ``derived``, the graph's tensors of
    shape arithmetic; ``graph_inputs``, its run-time inputs; ``dynamic``, whether one of
    the model's inputs has a dynamic dim."""
    if node.op_type != entry["op"] or norm_domain(node.domain) != "":
        return False
    if opset < int(entry.get("min_opset", 0)) or opset > int(entry.get("max_opset", 10**6)):
        return False
    when = entry.get("when")
    if when == "cond_is_input":
        return bool(node.input) and node.input[0] in (graph_inputs or set())
    if when in _FROM_DYNAMIC_SHAPE:
        index = _FROM_DYNAMIC_SHAPE[when]
        return dynamic and len(node.input) > index and node.input[index] in (derived or set())
    if when == "size_not_constant":
        return len(node.input) > 1 and node.input[1] not in constants
    if when == "mode_max":
        return any(a.name == "mode" and a.s == b"max" for a in node.attribute)
    if when == "antialias":
        return any(a.name == "antialias" and a.i for a in node.attribute)
    if when in ("k_from_shape", "size_from_shape"):  # TopK's K, Range's limit
        return len(node.input) > 1 and node.input[1] in (derived or set())
    if when == "reduction":
        return any(a.name == "reduction" and a.s not in (b"", b"none") for a in node.attribute)
    if when == "per_channel_mixed_channels":
        return _per_channel_mixed(node, constants)
    if when == "not_symmetric_int8":  # TensorRT's Q/DQ: int8 with zero point 0
        return _not_symmetric_int8(node, tensors or {})
    if when == "per_column":  # QLinearMatMul's b_scale, b_zero_point
        return any(len(node.input) > i and bool(constants.get(node.input[i])) and
                   _product(constants[node.input[i]] or []) > 1 for i in (4, 5))
    blocked = any(a.name == "block_size" and a.i for a in node.attribute)
    if when == "blocked":
        return blocked
    if when == "blocked_zero_point":
        return blocked and len(node.input) > 2 and bool(node.input[2])
    return True


def majority_wrong() -> list[dict[str, Any]]:
    """The gaps ``--target portable`` lowers (the data file's ``majority_wrong``): ops most
    measured engines compute with other numbers, silently; rows as in :func:`gaps`, with
    the engines that were wrong and the ones measured."""
    return [dict(entry) for entry in _data().get("majority_wrong", [])]


def gap_nodes(model: onnx.ModelProto, engines: Sequence[str] | None, opset: int | None = None,
              rows: Sequence[dict[str, Any]] | None = None
              ) -> Iterator[tuple[int, dict[str, Any], onnx.NodeProto]]:
    """Each (row, gap entry, node) of ``model`` (any graph depth) that a gap of one of
    ``engines`` (None: any) holds for, at ``opset`` (default: the model's default-domain
    opset); ``rows`` replaces the data file's gaps."""
    if opset is None:
        opset = opset_map(list(model.opset_import)).get("", 1)
    entries = [(row, entry) for row, entry in enumerate(gaps() if rows is None else rows)
               if engines is None or entry["engine"] in engines]
    dynamic = bool(dynamic_inputs(model))
    initialized = {init.name for init in model.graph.initializer}
    graph_inputs = {value.name for value in model.graph.input if value.name not in initialized}
    for graph in all_graphs(model.graph):
        constants = _constants(graph)
        tensors = _constant_tensors(graph)
        derived = _shape_derived(graph, constants)
        for node in graph.node:
            for row, entry in entries:
                if _applies(entry, node, opset, constants, derived, graph_inputs, dynamic,
                            tensors):
                    yield row, entry, node


def dynamic_inputs(model: onnx.ModelProto) -> list[str]:
    """The main graph's run-time inputs with a dim that is not a static size."""
    initialized = {init.name for init in model.graph.initializer}
    return [value.name for value in model.graph.input if value.name not in initialized and
            value.type.HasField("tensor_type") and
            any(not dim.HasField("dim_value") for dim in value.type.tensor_type.shape.dim)]


# ops whose output depends on their first input's shape only, never its values
_SHAPE_ONLY = {"Shape", "Size"}


def _input_sources(graph: onnx.GraphProto) -> dict[str, tuple[set[str], set[str]]]:
    """Per tensor of the main graph, the run-time graph inputs it is computed from: those
    whose values reach it, and those of which only the shape does (through Shape or Size),
    which ``--overwrite-input-shape`` fixes without freezing any value."""
    initialized = {init.name for init in graph.initializer}
    sources: dict[str, tuple[set[str], set[str]]] = {
        value.name: ({value.name}, set()) for value in graph.input
        if value.name not in initialized}
    for node in graph.node:
        by_value: set[str] = set()
        by_shape: set[str] = set()
        for name in node.input:
            value_of, shape_of = sources.get(name, (set(), set()))
            if node.op_type in _SHAPE_ONLY and node.domain in ("", "ai.onnx"):
                by_shape |= value_of | shape_of
            else:
                by_value |= value_of
                by_shape |= shape_of
        for name in node.output:
            sources[name] = (by_value, by_shape - by_value)
    return sources


def engine_gaps(model: onnx.ModelProto | None, engines: Sequence[str]
                ) -> dict[str, list[dict[str, Any]]]:
    """Per engine, the gaps ``model`` hits: ``{"op", "nodes", "lower", "take_down", "fold",
    "freeze", "shape", "evidence"}`` (``freeze``: the run-time inputs whose values an If's
    condition is computed from, which ``--freeze-input`` can fix and fold away; ``shape``:
    those of which only the shape decides it, and, for a row whose fix needs static sizes
    (``static``), the inputs with a dynamic dim that reach the node: for
    ``--overwrite-input-shape``, with ``freeze`` then naming the inputs any If's condition
    depends on by value, since fixed sizes pick one branch); a model
    above the engine's opset cap (its profile's ``max_opset``) is one too, first, as
    ``"opset N"`` with the cap as ``take_down``."""
    found: dict[str, list[dict[str, Any]]] = {engine: [] for engine in engines}
    if model is None:
        return found
    entries = gaps()
    hits: dict[tuple[str, int], int] = {}  # (engine, row) -> nodes
    # the graph inputs an If's branch hangs on: by value, by shape
    freeze: dict[tuple[str, int], set[str]] = {}
    shape: dict[tuple[str, int], set[str]] = {}
    sources = _input_sources(model.graph)
    dynamic = dynamic_inputs(model)
    for row, entry, node in gap_nodes(model, engines):
        key = (entry["engine"], row)
        hits[key] = hits.get(key, 0) + 1
        if entry.get("static"):
            # the fix needs static sizes: the dynamic inputs that reach the node (for a
            # node inside a subgraph, or one reached through sizes only, every dynamic
            # input)
            reach: set[str] = set()
            for name in node.input:
                by_value, by_shape = sources.get(name, (set(), set()))
                reach |= by_value | by_shape
            named = [name for name in dynamic if name in reach] \
                if node.output and node.output[0] in sources else []
            shape.setdefault(key, set()).update(named or dynamic)
        elif node.op_type == "If" and node.input:
            by_value, by_shape = sources.get(node.input[0], (set(), set()))
            freeze.setdefault(key, set()).update(by_value)
            shape.setdefault(key, set()).update(by_shape)
    # Static sizes pick one branch of an If whose condition a run-time input decides by
    # value (silero-vad's sample rate: the other branch's shapes then fail ONNX's shape
    # inference, measured), so a fix that needs them needs that input frozen too.
    deciding = {name for node in all_nodes(model.graph) if node.op_type == "If" and node.input
                for name in sources.get(node.input[0], (set(), set()))[0]}
    for key, names in shape.items():
        if entries[key[1]].get("static") and names:
            freeze.setdefault(key, set()).update(deciding)
    for (engine, row), count in sorted(hits.items(), key=lambda kv: kv[0][1]):
        entry = entries[row]
        found[engine].append({"op": entry["op"], "nodes": count, "lower": entry.get("lower"),
                              "take_down": entry.get("take_down"), "fold": entry.get("fold"),
                              "freeze": sorted(freeze.get((engine, row), ())),
                              "shape": sorted(shape.get((engine, row), set())
                                              - freeze.get((engine, row), set())),
                              "evidence": entry["evidence"]})
    _function_call_gaps(model, found)
    opset = opset_map(list(model.opset_import)).get("", 1)
    for engine in engines:
        profile = _data().get("profiles", {}).get(engine, {})
        if profile.get("max_opset") and opset > int(profile["max_opset"]):
            found[engine].insert(0, {"op": f"opset {opset}", "nodes": 0, "lower": None,
                                     "take_down": int(profile["max_opset"]), "fold": None,
                                     "freeze": [], "shape": [],
                                     "evidence": profile["evidence"]})
    return found


def _function_call_gaps(model: onnx.ModelProto, found: dict[str, list[dict[str, Any]]]
                        ) -> None:
    """Add, for each engine that refuses them, the calls of custom model-local functions."""
    from decomposer.functions import is_custom_function
    from decomposer.graphs import walk_nodes

    local = {(norm_domain(f.domain), f.name) for f in model.functions
             if is_custom_function(f)}
    if not local:
        return
    counts: dict[tuple[str, str], int] = {}
    bodies = [list(model.graph.node)] + [list(f.node) for f in model.functions]
    for nodes in bodies:
        for node in walk_nodes(nodes):
            key = (norm_domain(node.domain), node.op_type)
            if key in local:
                counts[key] = counts.get(key, 0) + 1
    entry = _data()["local_functions"]
    for engine, why in entry["refused"].items():
        if engine in found:
            for (domain, name), count in sorted(counts.items()):
                found[engine].append({"op": f"{domain}::{name} (model-local function)",
                                      "nodes": count, "lower": None,
                                      "evidence": f"{entry['evidence']}: {why}; fix: "
                                                  f"{entry['fix']}"})


def table() -> str:
    """The markdown table docs/portability.md holds (generated)."""
    names = _data()["engines"]
    lines = ["| engine | op | when | fix | evidence |", "|---|---|---|---|---|"]
    for entry in gaps():
        condition = CONDITIONS[entry.get("when")]
        if entry.get("min_opset") and entry.get("max_opset"):
            condition = f"opsets {entry['min_opset']}-{entry['max_opset']}"
        elif entry.get("min_opset"):
            condition = f"opset >= {entry['min_opset']}"
        fixes = []
        if entry.get("lower"):
            fixes.append(f"`--lower {entry['lower']}`")
        if entry.get("take_down"):
            fixes.append(f"opset {entry['take_down']} (`--target {entry['engine']}`)")
        if entry.get("fold"):
            fixes.append("static shapes folded (`--overwrite-input-shape`)")
        fix = " + ".join(fixes) or "none (no pattern)"
        lines.append(f"| {names[entry['engine']]} | {entry['op']} | {condition} | {fix} | "
                     f"{entry['evidence']} |")
    return "\n".join(lines)


def majority_table() -> str:
    """The markdown table of ``majority_wrong`` (docs/portability.md, generated)."""
    lines = ["| op | when | lowered by | engines that compute it wrongly | evidence |",
             "|---|---|---|---|---|"]
    for entry in majority_wrong():
        lines.append(f"| {entry['op']} | {CONDITIONS[entry.get('when')]} | "
                     f"`--lower {entry['lower']}` | {entry['engine'].replace(',', ', ')} | "
                     f"{entry['evidence']} |")
    return "\n".join(lines)
