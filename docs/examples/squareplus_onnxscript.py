"""SquarePlus defined once as an onnxscript function: ``--patterns squareplus_onnxscript.py``.

In: nothing; the module defines ``custom.ops::SquarePlus(x; b: float = 4.0)``, y = (x +
sqrt(x*x + b)) / 2, at opset 18. Out: decomposer inlines every SquarePlus call with this
body, taken to the model's own opset (the guide's model is at 17).
"""

from onnxscript import opset18 as op
from onnxscript import script
from onnxscript.values import Opset

custom_ops = Opset("custom.ops", 1)


@script(custom_ops, default_opset=op)
def SquarePlus(x, b: float = 4.0):
    return op.Div(op.Add(x, op.Sqrt(op.Add(op.Mul(x, x), op.CastLike(b, x)))),
                  op.CastLike(2.0, x))
