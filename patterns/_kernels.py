"""Which element types ONNX Runtime's CPU kernels take, for the ops patterns work around
(shared by the pattern modules; not a pattern itself).

In: an op type and an element type. Out: :func:`ort_runs`, whether ONNX Runtime (1.32, the
reference engine) runs that op on that type: a CPU kernel registered for it, or float16
through the cast to float32 that ONNX Runtime inserts where a float16 kernel is missing.
Patterns ask it instead of keeping their own lists, and detour the types it lacks (bool
Where as And/Not, a float64 Erf in float32, ...). The table is static, so the output
does not depend on the ONNX Runtime installed; ``tests/test_kernels.py`` checks it against
the installed one's kernel registry.
"""

from __future__ import annotations

from onnx import TensorProto

__all__ = ["ORT_CPU_TYPES", "ort_runs"]

ORT_CPU_TYPES: dict[str, frozenset[int]] = {
    "Where": frozenset({TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE,
                        TensorProto.INT8, TensorProto.INT32, TensorProto.INT64,
                        TensorProto.UINT8, TensorProto.UINT32, TensorProto.STRING}),
    "Trilu": frozenset({TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE,
                        TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL}),
    "Erf": frozenset({TensorProto.FLOAT16, TensorProto.FLOAT}),
}


def ort_runs(op_type: str, elem_type: int) -> bool:
    """Whether ONNX Runtime's CPU provider runs ``op_type`` on ``elem_type`` (an op not in
    the table: assumed to, as its ONNX schema says)."""
    types = ORT_CPU_TYPES.get(op_type)
    return types is None or elem_type in types
