"""Dims declared dynamic that torch's export froze, found before anything is written.

In: the exported program and/or the ONNX model, and the declared :class:`DynamicDim` s.
Out: one line per frozen dim; :func:`refuse` turns them into an :class:`ExportError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx
import torch

from decomposer.errors import ExportError
from decomposer.torch.inputs import DynamicDim, graph_inputs, onnx_dims

FREEZE_HINT = ("torch traced an op whose Python code guards on this size (TORCH_LOGS=+dynamic "
                "names the line); decomposer.torch routes F.affine_grid, F.grid_sample and "
                "torch.rot90, and decomposer.torch.opaque_function keeps your own op opaque")


def frozen_in_program(program: Any, dynamic: Sequence[DynamicDim], n_tensors: int
                       ) -> list[str]:
    """Dims declared dynamic that the exported program fixed: a plain int, or a symbol whose
    range collapsed to one value (torch.onnx keeps such a placeholder symbolic)."""
    try:
        from torch.export.graph_signature import InputKind

        exported = program.exported_program
        placeholders = {node.name: node for node in exported.graph.nodes
                        if node.op == "placeholder"}
        values = [placeholders[spec.arg.name].meta.get("val")
                  for spec in exported.graph_signature.input_specs
                  if spec.kind == InputKind.USER_INPUT]
        ranges = exported.range_constraints
    except (AttributeError, KeyError, ImportError):
        return []
    tensors = [value for value in values if isinstance(value, torch.Tensor)]
    if len(tensors) != n_tensors:
        return []
    problems = []
    for dim in dynamic:
        size = tensors[dim.tensor].shape[dim.dim]
        fixed: int | None = None
        if isinstance(size, int):
            fixed = size
        else:
            expr = size.node.expr
            if expr.is_number:
                fixed = int(expr)
            elif expr in ranges and ranges[expr].lower == ranges[expr].upper:
                fixed = int(ranges[expr].lower)
        if fixed is not None:
            problems.append(f"{dim.describe()} is declared dynamic but torch.export fixed it "
                            f"to {fixed}: {FREEZE_HINT}")
    return problems


def frozen_in_graph(model: onnx.ModelProto, dynamic: Sequence[DynamicDim], n_tensors: int,
                     output_axes: Mapping[str, Any]) -> list[str]:
    problems = []
    inputs = graph_inputs(model)
    if len(inputs) == n_tensors:
        for dim in dynamic:
            dims = onnx_dims(inputs[dim.tensor])
            if dim.dim < len(dims) and dims[dim.dim].HasField("dim_value"):
                size = dims[dim.dim].dim_value
                problems.append(f"{dim.describe()} is declared dynamic but the ONNX input "
                                f"'{inputs[dim.tensor].name}' fixes it to {size}: "
                                f"{FREEZE_HINT}")
    for output in model.graph.output:
        axes = output_axes.get(output.name)
        declared = list(axes) if isinstance(axes, (Mapping, list, tuple)) else []
        dims = onnx_dims(output)
        for axis in declared:
            axis = int(axis)
            if axis < len(dims) and dims[axis].HasField("dim_value"):
                problems.append(f"output '{output.name}' dim {axis} is declared dynamic but "
                                f"the ONNX graph fixes it to {dims[axis].dim_value}")
    return problems


def refuse(problems: Sequence[str]) -> None:
    if problems:
        raise ExportError("the export froze dims declared dynamic; refusing a model that "
                          "only runs at the example's sizes:\n  " + "\n  ".join(problems))
