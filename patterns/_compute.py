"""Reading a node's floating-point inputs in the type a pattern computes in (shared by the
contrib patterns; not a pattern itself).

In: a builder, a matched node and the element type of its floating-point inputs. Out:
:class:`ComputeType`: ``narrow`` (float16 or bfloat16, computed in float32 and rounded
once at the end, as ONNX Runtime's kernels accumulate), ``original`` and ``dtype`` (numpy
types of the node's tensors and of the computation), and :meth:`ComputeType.read`, an input
by name cast to the computation type (None when the node leaves it out), and
:meth:`ComputeType.direct` / :meth:`ComputeType.finish`, which write a result computed in
that type to one of the node's outputs (rounded by a Cast when narrow).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from decomposer.builder import Builder, Value, numpy_dtype
from decomposer.pattern import MatchedNode

__all__ = ["NARROW", "ComputeType"]

NARROW = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


class ComputeType:
    def __init__(self, b: Builder, node: MatchedNode, elem_type: int) -> None:
        self.b, self.node = b, node
        self.narrow = elem_type in NARROW
        self.original = numpy_dtype(elem_type)
        self.dtype = np.dtype(np.float32) if self.narrow else self.original

    def cast(self, value: Value, hint: str) -> Value:
        """``value`` (of the node's type) in the computation type."""
        return self.b.Cast(value, self.dtype, hint=f"{hint}_f32") if self.narrow else value

    def read(self, name: str | None) -> Value | None:
        """Input ``name`` in the computation type; None if absent (or ``name`` is None)."""
        tensor = self.node.tensor(name) if name else ""
        if not tensor:
            return None
        return self.cast(self.b.input(tensor, self.original), name or tensor)

    def direct(self, out: str) -> str | None:
        """``out`` when a value computed in the computation type may write it itself (not
        narrow), else None (:meth:`finish` then rounds into it)."""
        return None if self.narrow or not out else out

    def write(self, value: Value, out: str) -> None:
        """Write ``value`` (computed in the computation type) to output ``out``: rounded by
        a Cast when narrow, else an Identity (for a value an op could not write itself)."""
        if self.narrow:
            self.b.Cast(value, self.original, hint="result", out=out)
        else:
            self.b.op("Identity", value, hint="result", out=out)

    def finish(self, value: Value, out: str) -> None:
        """Round ``value`` to the node's type into output ``out``, unless :meth:`direct`
        let it write there."""
        if self.narrow and out:
            self.b.Cast(value, self.original, out=out)
