"""SquarePlus: y = (x + sqrt(x*x + b)) / 2, as Mul/Add/Sqrt/Mul (a user pattern example).

Matches ``SquarePlus(x; b:float=4.0)`` in domain ``custom.ops`` (or the default domain,
where a symbolic with no domain prefix puts it). ``b`` must be >= 0.

Before -> after::

    SquarePlus(x)  ->  Mul(x, x) -> Add(b) -> Sqrt -> Add(x) -> Mul(0.5)

Envelope: opsets 11+, float16/32/64, any shape.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

import decomposer

_FLOATS = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)


@decomposer.register
class SquarePlus(decomposer.Pattern):
    op_type = "SquarePlus"
    domains = frozenset({"custom.ops", ""})
    attributes = {"b": decomposer.Attr("float", default=4.0, doc="smoothness, >= 0")}

    def check(self, node, ctx):
        if node.attrs["b"] < 0:
            raise decomposer.Reject(f"b must be >= 0, got {node.attrs['b']}")
        elem_type = ctx.elem_type(node.inputs[0])
        if elem_type not in _FLOATS:
            raise decomposer.Reject("x must be float16, float32 or float64")
        return elem_type

    def build(self, b, node, elem_type):
        x = b.input(node.inputs[0], elem_type)  # a Value: x's name, knowing its dtype
        root = b.Sqrt(x * x + node.attrs["b"])  # numbers become constants of x's dtype
        b.Mul(x + root, 0.5, out=node.outputs[0])

    def reference(self, x, b=4.0):
        return [((x + np.sqrt(x * x + np.asarray(b, x.dtype))) / 2).astype(x.dtype)]
