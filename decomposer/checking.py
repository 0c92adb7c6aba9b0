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
    opset_map,
)

MAX_OPSET_VERSION = 2**31 - 1  # onnx.defs takes a C int
OPAQUE_DOMAIN = "decomposer.opaque"


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
    # on some (std::clamp assertion in 1.23): refuse them before anything infers shapes.
    for graph in all_graphs(model.graph):
        for value in [*graph.input, *graph.output, *graph.value_info]:
            if value.type.HasField("tensor_type"):
                for dim in value.type.tensor_type.shape.dim:
                    if dim.HasField("dim_value") and dim.dim_value < 0:
                        raise InvalidModelError(
                            f"tensor '{value.name}' declares dimension {dim.dim_value}; "
                            f"dimensions must be >= 0 (use a dim_param name for a dynamic "
                            f"one)")
    # onnx.proto is proto2: a string field may hold bytes that are not UTF-8, which
    # protobuf then hands back as bytes. Such names cannot be matched or written safely.
    for node in model_nodes(model):
        fields = [node.op_type, node.domain, node.name, *node.input, *node.output]
        if not all(isinstance(text, str) for text in fields):
            raise InvalidModelError(f"node {node.name!r} ({node.domain!r}::{node.op_type!r}) "
                                    f"has a name, op_type, domain or tensor name that is not "
                                    f"valid UTF-8")
    imports = [*model.opset_import, *(i for f in model.functions for i in f.opset_import)]
    for imp in imports:
        if not 1 <= imp.version <= MAX_OPSET_VERSION:
            raise InvalidModelError(f"opset_import of domain '{imp.domain}' has version "
                                    f"{imp.version}; versions run from 1 (ONNX's newest is "
                                    f"{onnx.defs.onnx_opset_version()})")


def checkable(model: onnx.ModelProto, classifier: OpClassifier) -> onnx.ModelProto:
    """A copy of ``model`` that ``onnx.checker`` can judge on everything but custom nodes."""
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


def checker_failure(model: onnx.ModelProto, classifier: OpClassifier,
                    full: bool) -> str | None:
    """The checker's complaint about ``model`` outside its custom nodes, or None."""
    try:
        onnx.checker.check_model(checkable(model, classifier), full_check=full)
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


def check_output(out: onnx.ModelProto, classifier: OpClassifier) -> None:
    failure = checker_failure(out, classifier, full=True)
    if failure:
        raise CheckFailedError(f"the decomposed model fails onnx.checker (full_check) although "
                               f"the input passed: {failure}; this is a decomposer or pattern "
                               f"bug: please report it with the model")


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
