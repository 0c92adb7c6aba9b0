"""What ONNX calls torch's types, and whether a registered pattern rewrites a node.

In: torch dtypes, or an op type with input types, shapes and attributes. Out: ONNX element
types, and :func:`pattern_rewrites`, which decomposes a one-node probe model to learn
whether routing a torch call to that opaque node pays off; the export routes an op only
when it does, so an op no pattern knows is exported as torch would export it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch
from onnx import TensorProto, helper

from decomposer.api import decompose_with_report
from decomposer.errors import DecomposerError

OPAQUE_DOMAIN = "custom.ops"  # where routed ops go; the patterns accept any domain
ATEN_DOMAIN = "org.pytorch.aten"  # for ops whose patterns take only torch's fallback forms
TORCHLIB_OPSET = 18  # the opset torch's ONNX functions are written in; lower ones are converted
TORCH_TO_ONNX = {torch.float32: TensorProto.FLOAT, torch.float16: TensorProto.FLOAT16,
                 torch.float64: TensorProto.DOUBLE, torch.bfloat16: TensorProto.BFLOAT16,
                 torch.int64: TensorProto.INT64, torch.int32: TensorProto.INT32,
                 torch.int16: TensorProto.INT16, torch.int8: TensorProto.INT8,
                 torch.uint8: TensorProto.UINT8, torch.bool: TensorProto.BOOL}
JIT_TO_ONNX = {"Float": TensorProto.FLOAT, "Half": TensorProto.FLOAT16,
               "Double": TensorProto.DOUBLE, "BFloat16": TensorProto.BFLOAT16}


def onnx_type(dtype: Any) -> int | None:
    return TORCH_TO_ONNX.get(dtype)


def jit_elem_type(value: Any) -> int:
    try:
        return JIT_TO_ONNX.get(value.type().scalarType(), TensorProto.FLOAT)
    except (AttributeError, RuntimeError):
        return TensorProto.FLOAT


@functools.lru_cache(maxsize=256)
def pattern_rewrites(op_type: str, inputs: tuple[tuple[int, tuple[int | str, ...]], ...],
                      attrs: tuple[tuple[str, Any], ...], opset: int, target: str,
                      outputs: int = 1, domain: str = OPAQUE_DOMAIN) -> bool:
    """Whether the registered patterns rewrite ``domain::op_type`` with these input
    types, shapes and attributes at ``opset``: a one-node model is decomposed to find out."""
    names = [f"in{i}" for i in range(len(inputs))]
    graph_inputs = [helper.make_tensor_value_info(name, elem_type, list(shape))
                    for name, (elem_type, shape) in zip(names, inputs, strict=True)]
    output_names = [f"out{i}" for i in range(outputs)]
    node = helper.make_node(op_type, names, output_names, domain=domain)
    node.attribute.extend(helper.make_attribute(key, list(value) if isinstance(value, tuple)
                                                else value) for key, value in attrs)
    imports = [helper.make_opsetid("", opset), helper.make_opsetid(domain, 1)]
    graph = helper.make_graph([node], "probe", graph_inputs,
                              [helper.make_empty_tensor_value_info(name)
                               for name in output_names])
    probe = helper.make_model(graph, opset_imports=imports,
                              ir_version=helper.find_min_ir_version_for(imports[:1], True))
    try:
        _, report = decompose_with_report(probe, allow_unsupported=True, check=False,
                                          target=target)
    except DecomposerError:
        return False
    return bool(report.replaced)


def grid_sample_stays_native(rank: int, mode: str, padding_mode: str, align_corners: bool,
                             opset: int) -> bool:
    """Whether torch's own export (a standard GridSample) is the better choice.

    It is when the opset has GridSample for this rank (16 for 4-D, 20 for 5-D) and ONNX
    Runtime has its fast path: bilinear, zeros, align_corners=False on 4-D input, where the
    decomposition is slower. Every other combination runs ONNX Runtime's generic
    per-channel loop, which the decomposition beats (docs/performance.md, GridSample), and
    nearest with
    reflection padding and align_corners=False rounds ties differently from torch.
    """
    has_op = opset >= (16 if rank == 4 else 20)
    fast_path = rank == 4 and mode == "bilinear" and padding_mode == "zeros" \
        and not align_corners
    return has_op and fast_path


def symbolic_shape(rank: int, fixed: Mapping[int, int] | None = None) -> tuple[int | str, ...]:
    fixed = fixed or {}
    return tuple(fixed.get(axis, f"d{axis}") for axis in range(rank))
