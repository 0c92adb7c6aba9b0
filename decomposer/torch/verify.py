"""Checking an exported ONNX file against the model in eager mode.

In: the model, the written file, its example inputs, the dims declared dynamic and the
``verify`` options. Out: a :class:`decomposer.VerifyReport` with one check per output and
input set (the examples, a second set with every dynamic dim resized, the user's own).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from decomposer.errors import InvalidModelError, VerificationError
from decomposer.torch.inputs import (
    DynamicDim,
    Leaf,
    graph_inputs,
    input_leaves,
    onnx_dims,
    output_tensors,
    rebuild,
    second_inputs,
    tensor_leaves,
)
from decomposer.verification import TensorCheck, VerifyReport, compare

# The shared tolerance policy (decomposer.tolerances), per output dtype; verify={"atol":
# ..., "rtol": ...} replaces it for one export.
DEFAULT_ATOL: float | None = None
DEFAULT_RTOL: float | None = None


def _eager(model: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> list[np.ndarray]:
    with torch.no_grad():
        outputs = model(*args, **kwargs)
    return [t.detach().cpu().numpy() for t in output_tensors(outputs)]


def _feeds(model: onnx.ModelProto, tensors: Sequence[Any]) -> dict[str, np.ndarray]:
    inputs = graph_inputs(model)
    arrays = [t.detach().cpu().numpy() for t in tensors]
    if len(inputs) != len(arrays):
        raise VerificationError(
            f"cannot verify: the ONNX graph has {len(inputs)} inputs for {len(arrays)} tensor "
            f"inputs of the model (torch dropped unused ones?); pass verify=False")
    return {value.name: array for value, array in zip(inputs, arrays, strict=True)}


def verify_options(verify: bool | Mapping[str, Any]) -> dict[str, Any] | None:
    if verify is False:
        return None
    options = {"atol": DEFAULT_ATOL, "rtol": DEFAULT_RTOL, "inputs": (), "seed": 0}
    if isinstance(verify, Mapping):
        unknown = set(verify) - set(options)
        if unknown:
            raise InvalidModelError(f"verify: unknown option(s) {sorted(unknown)}; known: "
                                    f"{sorted(options)}")
        options.update(verify)
    return options


def run_checks(model: Any, path: Path, onnx_model: onnx.ModelProto, leaves: Sequence[Leaf],
                dynamic: Sequence[DynamicDim], args: tuple[Any, ...],
                kwargs: Mapping[str, Any], options: Mapping[str, Any]) -> VerifyReport:
    """Run ``path`` on ONNX Runtime and the model in eager mode on the example inputs, on a
    second set with every dynamic dim resized, and on ``options['inputs']``."""
    import onnxruntime as ort

    atol = None if options["atol"] is None else float(options["atol"])
    rtol = None if options["rtol"] is None else float(options["rtol"])
    # (args, kwargs, what this set is, whether decomposer resized dims declared dynamic)
    runs: list[tuple[tuple[Any, ...], dict[str, Any], str, bool]] = [
        (args, dict(kwargs), "", False)]
    if dynamic:
        values, changes = second_inputs(leaves, dynamic, int(options["seed"]))
        if changes:
            second_args, second_kwargs = rebuild(leaves, values, args, kwargs)
            runs.append((second_args, second_kwargs,
                         f" (dims changed: {', '.join(changes)})", True))
    for extra in options["inputs"]:
        extra_args, extra_kwargs = (extra if isinstance(extra, tuple) and len(extra) == 2
                                    and isinstance(extra[1], Mapping) else (extra, {}))
        runs.append((tuple(extra_args) if isinstance(extra_args, (list, tuple))
                     else (extra_args,), dict(extra_kwargs), " (from verify['inputs'])",
                     False))

    options_ort = ort.SessionOptions()
    options_ort.log_severity_level = 3
    session = ort.InferenceSession(str(path), options_ort, providers=["CPUExecutionProvider"])
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # a failure is raised with ONNX Runtime's message, not logged
    output_names = [o.name for o in onnx_model.graph.output]
    report = VerifyReport(runs=len(runs))
    for run, (run_args, run_kwargs, sizes, resized) in enumerate(runs):
        try:
            expected = _eager(model, run_args, run_kwargs)
        except Exception as exc:
            raise VerificationError(
                f"the model fails in eager mode on verification input set {run}{sizes}: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}. "
                f"Pass verify={{'inputs': [...]}} with inputs of other sizes, or "
                f"verify=False") from exc
        run_leaves = input_leaves(model, run_args, run_kwargs)
        feeds = _feeds(onnx_model, [leaf.value for leaf in tensor_leaves(run_leaves)])
        if len(expected) != len(output_names):
            raise VerificationError(f"the model returns {len(expected)} tensors, the ONNX "
                                    f"graph {len(output_names)} outputs")
        for output, array in zip(onnx_model.graph.output, expected, strict=True):
            for axis, dim in enumerate(onnx_dims(output)):
                if dim.HasField("dim_value") and axis < array.ndim \
                        and array.shape[axis] != dim.dim_value:
                    raise VerificationError(
                        f"output '{output.name}' dim {axis} is fixed to {dim.dim_value} in "
                        f"the ONNX graph, but is {array.shape[axis]} in eager mode on input "
                        f"set {run}{sizes}: the export froze a size declared dynamic")
        try:
            actual = session.run(None, feeds, quiet)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            frozen = " A dim declared dynamic is frozen inside the graph." if resized else ""
            raise VerificationError(f"ONNX Runtime cannot run {path} on input set "
                                    f"{run}{sizes}.{frozen} ONNX Runtime: {first}") from exc
        for name, got, want in zip(output_names, actual, expected, strict=True):
            result = compare(np.asarray(got), want, atol, rtol)
            report.checks.append(TensorCheck(
                tensor=name, kind="expected", node=None, pattern=None, run=run,
                shape=tuple(np.asarray(got).shape), max_abs_error=float(result.max_abs),
                max_rel_error=float(result.max_rel), atol=float(result.atol or 0.0),
                rtol=float(result.rtol or 0.0),
                passed=bool(result.passed),
                note=(result.note or "vs torch eager") + sizes))
    return report
