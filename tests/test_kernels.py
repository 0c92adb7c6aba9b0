"""decomposer.patterns._kernels' static table matches the installed ONNX Runtime's CPU kernel
registry (float16 counted where float32 is registered: ONNX Runtime inserts a cast)."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

from decomposer.patterns._kernels import ORT_CPU_TYPES, ort_runs

state = pytest.importorskip("onnxruntime.capi.onnxruntime_pybind11_state")


def _registered(op_type: str) -> set[int]:
    names = {helper.tensor_dtype_to_string(t).removeprefix("TensorProto."): t
             for t in helper.get_all_tensor_dtypes()}
    found: set[int] = set()
    for kernel in state.get_all_opkernel_def():
        if kernel.op_name == op_type and kernel.domain in ("", "ai.onnx") \
                and kernel.provider == "CPUExecutionProvider" \
                and kernel.version_range[1] >= 2**31 - 1:  # the newest opset's kernels
            for types in dict(kernel.type_constraints).values():
                for text in types:
                    name = text.removeprefix("tensor(").removesuffix(")").upper()
                    found.add(names[{"BOOL": "BOOL"}.get(name, name)])
    if TensorProto.FLOAT in found:
        found.add(TensorProto.FLOAT16)
    return found


@pytest.mark.parametrize("op_type", sorted(ORT_CPU_TYPES))
def test_table_matches_onnxruntime(op_type):
    assert ORT_CPU_TYPES[op_type] == _registered(op_type)


def test_ops_outside_the_table_are_assumed_to_run():
    assert ort_runs("Add", TensorProto.BOOL) and not ort_runs("Where", TensorProto.BOOL)
