"""Recording an opaque node in the graph torch's dynamo exporter is building.

In: a domain, op type, onnxscript values and typed attributes, inside a translation
function. Out: the node's output value(s), recorded with a private schema.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from onnx import TensorProto

_ALL_TENSOR_TYPES = [f"tensor({name})" for name in (
    "float", "double", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8",
    "uint16", "uint32", "uint64", "bool", "string")]


def _attribute_type(value: Any) -> Any:
    from onnx.defs import OpSchema

    kinds = OpSchema.AttrType
    if isinstance(value, TensorProto):
        return kinds.TENSOR
    if isinstance(value, (bool, int)):
        return kinds.INT
    if isinstance(value, float):
        return kinds.FLOAT
    if isinstance(value, (str, bytes)):
        return kinds.STRING
    items = list(value)
    if items and all(isinstance(item, float) for item in items):
        return kinds.FLOATS
    if items and all(isinstance(item, (str, bytes)) for item in items):
        return kinds.STRINGS
    return kinds.INTS


def emit_opaque(domain: str, version: int, op_type: str, inputs: Sequence[Any],
                 attributes: Mapping[str, Any], outputs: int = 1) -> Any:
    """Record ``domain::op_type`` in the graph torch's exporter is building.

    onnxscript needs a schema to record a node; a private one is built here rather than
    registered with ``onnx.defs.register_schema``, which would make the node look standard
    to decomposer (and to every other tool) in this process."""
    import onnxscript
    from onnx.defs import OpSchema

    schema = OpSchema(
        op_type, domain, version,
        inputs=[OpSchema.FormalParameter(f"input{i}", f"T{i}") for i in range(len(inputs))],
        outputs=[OpSchema.FormalParameter(f"output{i}", f"U{i}") for i in range(outputs)],
        type_constraints=[(f"T{i}", _ALL_TENSOR_TYPES, "") for i in range(len(inputs))]
        + [(f"U{i}", _ALL_TENSOR_TYPES, "") for i in range(outputs)],
        attributes=[OpSchema.Attribute(name, _attribute_type(value), "", required=False)
                    for name, value in attributes.items()])
    opset = onnxscript.values.Opset(domain, version)
    return onnxscript.values.Op(opset, op_type, schema)(*inputs, **dict(attributes))
