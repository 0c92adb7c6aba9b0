"""SquarePlus: y = (x + sqrt(x*x + b)) / 2, as Mul/Add/Sqrt/Mul (a user pattern example).

Matches ``SquarePlus(x; b:float=4.0)`` in domain ``custom.ops`` (or the default domain,
where a symbolic with no domain prefix puts it), and ``SquarePlusB(x, b)`` in any domain,
an exporter that passes ``b`` as a constant input. ``b`` must be >= 0.

Before -> after::

    SquarePlus(x)  ->  Mul(x, x) -> Add(b) -> Sqrt -> Add(x) -> Mul(0.5)

Envelope: opsets 11+, float16/32/64, any shape.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

import decomposer
from decomposer import Attr, Const, Form, In

_FLOATS = (TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)


@decomposer.register
class SquarePlus(decomposer.Pattern):
    op_type = "SquarePlus"
    # Two spellings, one normalized call: the tensor x and the argument b.
    forms = (
        Form("SquarePlus", domains=frozenset({"custom.ops", ""}), inputs=(In("x"),),
             attributes={"b": Attr("float", default=4.0, doc="smoothness, >= 0")}),
        Form("SquarePlusB", inputs=(In("x"), Const("b", "float", default=4.0))),
    )

    def check(self, node, ctx):
        if node.args["b"] < 0:
            raise decomposer.Reject(f"b must be >= 0, got {node.args['b']}")
        elem_type = ctx.elem_type(node.tensor("x"))
        if elem_type not in _FLOATS:
            raise decomposer.Reject("x must be float16, float32 or float64")
        return elem_type

    def build(self, b, node, elem_type):
        x = b.input(node.tensor("x"), elem_type)  # a Value: x's name, knowing its dtype
        root = b.Sqrt(x * x + node.args["b"])  # numbers become constants of x's dtype
        b.Mul(x + root, 0.5, out=node.outputs[0])

    def compute(self, args, x):
        return [((x + np.sqrt(x * x + np.asarray(args["b"], x.dtype))) / 2).astype(x.dtype)]
