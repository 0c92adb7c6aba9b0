"""Validity checks of the input and the output: structural sanity and ``onnx.checker``.

In: a ``ModelProto`` and an :class:`decomposer.graphs.OpClassifier` (which nodes are custom).
Out: nothing, or an :class:`InvalidModelError` (the input is not ours to fix: exit 2) or a
:class:`CheckFailedError` (the rewritten model is invalid although the input was: a bug,
exit 4), each naming the problem in one line.

``onnx.checker`` cannot judge custom nodes, so they move to a domain it does not know (which
it skips), and external initializers become typed graph inputs (the checker would resolve
their files against the working directory; weights are copied byte for byte, not rewritten).
"""

from __future__ import annotations

import re

import onnx

from decomposer.errors import CheckFailedError, InvalidModelError
from decomposer.graphs import (
    OpClassifier,
    all_graphs,
    all_nodes,
    externals_as_inputs,
    function_nodes,
    function_opsets,
    model_nodes,
    norm_domain,
    opset_map,
    subgraphs,
)

MAX_OPSET_VERSION = 2**31 - 1  # onnx.defs takes a C int
OPAQUE_DOMAIN = "decomposer.opaque"


def minus_one_dims(model: onnx.ModelProto) -> list[str]:
    """The tensors (any graph) that declare a dim of -1: not ONNX, but how some exporters
    (paddle2onnx, the OCR models packages ship) write a dynamic dim."""
    names = []
    for graph in all_graphs(model.graph):
        for value in [*graph.input, *graph.output, *graph.value_info]:
            if value.type.HasField("tensor_type") and any(
                    dim.HasField("dim_value") and dim.dim_value == -1
                    for dim in value.type.tensor_type.shape.dim):
                names.append(value.name)
    return names


def clear_minus_one_dims(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` with each dim of -1 written as ONNX's dynamic dim (no value, no
    name): what the exporter meant, and what shape inference can take."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for graph in all_graphs(out.graph):
        for value in [*graph.input, *graph.output, *graph.value_info]:
            if value.type.HasField("tensor_type"):
                for dim in value.type.tensor_type.shape.dim:
                    if dim.HasField("dim_value") and dim.dim_value == -1:
                        dim.ClearField("dim_value")
    return out


def validate_structure(model: onnx.ModelProto) -> None:
    """Refuse what no later step can handle safely: not a model, negative dims, names that
    are not UTF-8, absurd opset versions."""
    if not isinstance(model, onnx.ModelProto):
        raise InvalidModelError(f"expected an onnx.ModelProto, got {type(model).__name__}")
    if model.ir_version <= 0:
        raise InvalidModelError("the model has no ir_version (0): it is empty or not an ONNX "
                                "model")
    if not model.HasField("graph"):
        raise InvalidModelError("the model has no graph")
    # A negative static dim is not ONNX, and onnx's own shape inference aborts the process
    # on some (std::clamp assertion in 1.23): refuse them before anything infers shapes
    # (-1, an exporter's dynamic dim, is cleared before: clear_minus_one_dims). So
    # are element types ONNX does not define, and static shapes whose element count does
    # not fit in int64 (no shape arithmetic survives them).
    for graph in all_graphs(model.graph):
        main_inputs = {v.name for v in graph.input} if graph is model.graph else set()
        for value in [*graph.input, *graph.output, *graph.value_info]:
            if value.type.HasField("tensor_type"):
                _check_tensor_type(value.name, value.type.tensor_type,
                                   required=value.name in main_inputs)
        for init in graph.initializer:
            if init.data_type not in _ELEMENT_TYPES:
                raise InvalidModelError(f"initializer '{init.name}' has element type "
                                        f"{init.data_type}, which ONNX does not define")
        _check_passed_through(graph)
    # onnx.proto is proto2: a string field may hold bytes that are not UTF-8, which
    # protobuf then hands back as bytes. Such names cannot be matched or written safely.
    for node in model_nodes(model):
        fields = [node.op_type, node.domain, node.name, *node.input, *node.output,
                  *(attr.name for attr in node.attribute)]
        if not all(isinstance(text, str) for text in fields):
            raise InvalidModelError(f"node {node.name!r} ({node.domain!r}::{node.op_type!r}) "
                                    f"has a name, op_type, domain, tensor or attribute name "
                                    f"that is not valid UTF-8")
    import_lists = [model.opset_import, *(f.opset_import for f in model.functions)]
    for imports in import_lists:
        seen: dict[str, int] = {}
        for imp in imports:
            if not 1 <= imp.version <= MAX_OPSET_VERSION:
                raise InvalidModelError(f"opset_import of domain '{imp.domain}' has version "
                                        f"{imp.version}; versions run from 1 (ONNX's newest "
                                        f"is {onnx.defs.onnx_opset_version()})")
            # "" and "ai.onnx" are one domain: two versions of it leave no single opset to
            # build replacements for (and tools disagree on which one wins).
            domain = norm_domain(imp.domain)
            if domain in seen and seen[domain] != imp.version:
                raise InvalidModelError(
                    f"opset_import names domain '{imp.domain or 'ai.onnx'}' twice, at "
                    f"versions {seen[domain]} and {imp.version}; keep one")
            seen[domain] = imp.version


_ELEMENT_TYPES = frozenset(onnx.TensorProto.DataType.values())
_INT64_MAX = 2**63 - 1


def _check_tensor_type(name: str, tensor_type: onnx.TypeProto.Tensor, required: bool) -> None:
    elem_type = tensor_type.elem_type
    if elem_type not in _ELEMENT_TYPES or (required and elem_type == 0):
        raise InvalidModelError(f"tensor '{name}' declares element type {elem_type}, which "
                                f"ONNX does not define" if elem_type else
                                f"graph input '{name}' declares no element type")
    count = 1
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            if dim.dim_value < 0:
                raise InvalidModelError(
                    f"tensor '{name}' declares dimension {dim.dim_value}; dimensions must be "
                    f">= 0 (use a dim_param name for a dynamic one)")
            count *= dim.dim_value
    if count > _INT64_MAX:
        raise InvalidModelError(f"tensor '{name}' declares a static shape of more than 2**63 "
                                f"elements")


def replacement_failure(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
                        opset_imports: list[onnx.OperatorSetIdProto]) -> str | None:
    """What ONNX's strict shape inference says against a replacement on its own, fed by
    the replaced node's inputs (their types as the model declares or infers them): a
    custom node whose static shapes its standard ops cannot take (a bias of another width,
    a skip that does not broadcast). None when it passes."""
    graph = onnx.GraphProto(name="replacement", node=nodes, input=inputs)
    produced = {name for node in nodes for name in node.output}
    graph.output.extend(onnx.ValueInfoProto(name=name) for name in sorted(produced)[:1])
    model = onnx.helper.make_model(graph, opset_imports=opset_imports)
    try:
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as exc:
        return first_line(exc)
    return None


def _check_passed_through(graph: onnx.GraphProto) -> None:
    """A graph output that is a graph input must not declare another element type, rank or
    static dim than the input does: shape inference would carry the contradiction into
    every node that reads the tensor (the checker only notices once one does)."""
    inputs = {value.name: value.type.tensor_type for value in graph.input
              if value.type.HasField("tensor_type")}
    for output in graph.output:
        declared, source = output.type.tensor_type, inputs.get(output.name)
        if source is None or not output.type.HasField("tensor_type"):
            continue
        clash = declared.elem_type and source.elem_type and \
            declared.elem_type != source.elem_type
        if declared.HasField("shape") and source.HasField("shape"):
            clash = clash or len(declared.shape.dim) != len(source.shape.dim) or any(
                a.HasField("dim_value") and b.HasField("dim_value") and a.dim_value != b.dim_value
                for a, b in zip(declared.shape.dim, source.shape.dim, strict=False))
        if clash:
            raise InvalidModelError(f"graph output '{output.name}' is the graph input of that "
                                    f"name but declares another type or shape; fix the "
                                    f"export")


def checkable(model: onnx.ModelProto, classifier: OpClassifier,
              copy_always: bool = True, needs_masking: bool | None = None) -> onnx.ModelProto:
    """A copy of ``model`` that ``onnx.checker`` can judge on everything but custom nodes;
    with ``copy_always=False``, ``model`` itself when it needs no change (no custom node,
    no external data), which spares copying a large result. ``needs_masking`` is that
    answer when the caller already knows it (the engine saw every node it kept or wrote)."""
    if needs_masking is None and not copy_always:
        needs_masking = _needs_masking(model, classifier)
    if not copy_always and not needs_masking:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    opsets = opset_map(list(copy.opset_import))
    opaque = False
    for node in all_nodes(copy.graph):
        if not classifier.is_standard(node, opsets):
            node.domain, opaque = OPAQUE_DOMAIN, True
    for function in copy.functions:
        f_opsets = function_opsets(opsets, function)
        for node in function_nodes(function):
            if not classifier.is_standard(node, f_opsets):
                node.domain = OPAQUE_DOMAIN
                if not any(i.domain == OPAQUE_DOMAIN for i in function.opset_import):
                    function.opset_import.append(onnx.helper.make_opsetid(OPAQUE_DOMAIN, 1))
                opaque = True
    if opaque:
        copy.opset_import.append(onnx.helper.make_opsetid(OPAQUE_DOMAIN, 1))
    if any(i.data_location == onnx.TensorProto.EXTERNAL for i in copy.graph.initializer):
        source = onnx.GraphProto()
        source.initializer.extend(copy.graph.initializer)
        del copy.graph.initializer[:]
        externals_as_inputs(source, copy.graph,
                            keep=lambda init: init.data_location != onnx.TensorProto.EXTERNAL)
    return copy


def _needs_masking(model: onnx.ModelProto, classifier: OpClassifier) -> bool:
    opsets = opset_map(list(model.opset_import))
    for graph in all_graphs(model.graph):  # one walk: each graph's own nodes
        if any(not classifier.is_standard(node, opsets) for node in graph.node) or any(
                init.data_location == onnx.TensorProto.EXTERNAL for init in graph.initializer):
            return True
    return any(not classifier.is_standard(node, function_opsets(opsets, function))
               for function in model.functions for node in function_nodes(function))


def checker_failure(model: onnx.ModelProto, classifier: OpClassifier,
                    full: bool, needs_masking: bool | None = None) -> str | None:
    """The checker's complaint about ``model`` outside its custom nodes, or None."""
    try:
        onnx.checker.check_model(checkable(model, classifier, copy_always=False,
                                           needs_masking=needs_masking),
                                 full_check=full)
    except Exception as exc:
        return first_line(exc)
    return None


def check_input(model: onnx.ModelProto, classifier: OpClassifier, full: bool) -> None:
    """Refuse an input that is invalid apart from its custom nodes: that is not ours to fix,
    and it would otherwise look like a decomposer bug once rewritten."""
    failure = checker_failure(model, classifier, full)
    if failure:
        raise InvalidModelError(f"the input model is invalid (onnx.checker, ignoring its "
                                f"custom nodes): {failure}; fix the export, or skip the "
                                f"check (check=False; CLI: --no-check) to rewrite it anyway")


# The node a type or shape clash is reported at, in onnx.checker's message.
CLASH = re.compile(r"node name: ([^)]+)\): \[(?:Type|Shape)InferenceError\] "
                   r"Inferred (?:elem type|shape) (?:differs|and existing)")


def stale_value_info(model: onnx.ModelProto, classifier: OpClassifier) -> list[str]:
    """The main graph's ``value_info`` entries that contradict what their (standard)
    producers compute, when forgetting exactly those makes the full check pass; else [].

    Such an annotation is a stale note about an intermediate tensor, not part of the
    model's interface (the onnxruntime-genai model builder 0.18 declares a 1-D Constant's
    output as a scalar, for one): the engine drops it and says so, rather than refuse an
    otherwise valid model."""
    relaxed = checkable(model, classifier)
    declared = {value.name for value in relaxed.graph.value_info}
    writers = {o: node.name for node in relaxed.graph.node for o in node.output if o}
    forgotten: list[str] = []
    for _ in range(len(declared) + 1):  # each pass forgets at least one entry
        try:
            onnx.checker.check_model(relaxed, full_check=True)
            return sorted(forgotten)
        except Exception as exc:
            clash = set(CLASH.findall(first_line(exc)))
        names = {name for name, writer in writers.items()
                 if writer in clash and name in declared and name not in forgotten}
        if not names:
            return []
        kept = [value for value in relaxed.graph.value_info if value.name not in names]
        del relaxed.graph.value_info[:]
        relaxed.graph.value_info.extend(kept)
        forgotten.extend(names)
    return []


def check_output(out: onnx.ModelProto, classifier: OpClassifier,
                 rewritten_outputs: set[str] | None = None,
                 needs_masking: bool | None = None) -> None:
    """Run the full check on the result. If it fails only because of the types the input
    model itself declared for rewritten nodes' outputs (a graph output or value_info that
    contradicts what the op computes), the input is at fault: exit 2, naming the tensors.
    ``needs_masking``: whether ``out`` holds custom nodes or external data, if known."""
    failure = checker_failure(out, classifier, full=True, needs_masking=needs_masking)
    if failure and rewritten_outputs:
        # Forget the declared element types (then also the shapes) of the rewritten
        # outputs; if inference then fills in types that pass, the declarations were wrong.
        # A rewritten node inside an If/Loop/Scan body types that node's outputs too.
        names = rewritten_outputs | _outputs_of_nodes_enclosing(out, rewritten_outputs)
        for forget_shapes in (False, True):
            relaxed = checkable(out, classifier)
            stripped = _strip_declared_types(relaxed, names, forget_shapes)
            if stripped and _passes_with_inferred_types(relaxed):
                raise InvalidModelError(
                    f"the model declares a type for {', '.join(repr(n) for n in stripped)} "
                    f"that contradicts what the custom node computes ({failure}); fix the "
                    f"declared type or shape in the export")
    if failure and rewritten_outputs:
        # The checker names the node whose inferred type clashes with the declared
        # ("existing") one; if that node writes a rewritten output, the declaration is the
        # input's (e.g. If branches that then disagree, so no relaxation can pass).
        clash = CLASH.findall(failure)
        writers = {o: n.name for n in model_nodes(out) for o in n.output}
        blamed = sorted({o for o in rewritten_outputs if writers.get(o) in set(clash)})
        if blamed:
            raise InvalidModelError(
                f"the model declares a type for {', '.join(repr(n) for n in blamed)} that "
                f"contradicts what the custom node computes ({failure}); fix the declared "
                f"type or shape in the export")
    if failure:
        raise CheckFailedError(f"the decomposed model fails onnx.checker (full_check) although "
                               f"the input passed: {failure}; this is a decomposer or pattern "
                               f"bug: please report it with the model")


def _strip_declared_types(model: onnx.ModelProto, names: set[str], shapes: bool
                          ) -> list[str]:
    """Forget the element types (and with ``shapes`` the shapes) the model declares for
    ``names``; return which names were declared."""
    stripped: list[str] = []
    for graph in all_graphs(model.graph):
        for value in [*graph.output, *graph.value_info]:
            if value.name in names and value.type.HasField("tensor_type"):
                value.type.tensor_type.elem_type = 0
                if shapes:
                    value.type.tensor_type.ClearField("shape")
                stripped.append(value.name)
    return sorted(set(stripped))


def _outputs_of_nodes_enclosing(model: onnx.ModelProto, names: set[str]) -> set[str]:
    """Outputs of the control-flow nodes (at any depth) whose bodies produce one of
    ``names``."""
    found: set[str] = set()

    def produces(graph: onnx.GraphProto) -> bool:
        return any(o in names for n in all_nodes(graph) for o in n.output)

    for graph in all_graphs(model.graph):
        for node in graph.node:
            if any(produces(sub) for _, sub in subgraphs(node)):
                found.update(o for o in node.output if o)
    return found


def _passes_with_inferred_types(model: onnx.ModelProto) -> bool:
    """Whether ``model`` (some declared types removed) passes the full check once shape
    inference has filled the removed types back in from what the graph computes."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
        onnx.checker.check_model(inferred, full_check=True)
    except Exception:
        return False
    return True


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
