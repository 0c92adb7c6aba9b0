"""Fixes for ``onnx.reference`` kernels that mis-handle standard ops, for ``--verify=full``.

In: nothing. Out: :func:`reference_kernel_fixes`, a list of ``OpRun`` classes to pass to
``onnx.reference.ReferenceEvaluator(model, new_ops=...)`` so that it runs standard ops it
otherwise refuses or gets wrong. Only the full verification route runs whole models on the
reference evaluator; the fast route runs them on real engines and needs none of this. It
lives beside the patterns, not in the core, because it knows ops by name (installed as
``decomposer.patterns._reference_shims``; the leading underscore keeps it out of pattern
discovery).

- GridSample-16 spells its modes ``bilinear`` / ``bicubic``; onnx's reference (1.23) only
  knows the opset-20 names ``linear`` / ``cubic`` and raises on the old ones.
- Loop (1.23) never iterates when its ``cond`` input is omitted (it tests ``while cond``
  with ``cond = None``), and joins scan outputs with ``np.vstack``, which concatenates
  per-iteration tensors of rank >= 2 instead of stacking them on a new axis.
"""

from __future__ import annotations

from typing import Any

import numpy as np

_GRID_SAMPLE_MODE_NAMES = {"bilinear": "linear", "bicubic": "cubic"}


def _grid_sample_with_old_mode_names() -> type:
    from onnx.reference.ops.op_grid_sample import GridSample as ReferenceGridSample

    def _run(self: Any, X: np.ndarray, grid: np.ndarray, mode: str | None = None,
             padding_mode: str | None = None, align_corners: int | None = None) -> Any:
        mode = _GRID_SAMPLE_MODE_NAMES.get(mode or "linear", mode)
        return ReferenceGridSample._run(self, X, grid, mode=mode, padding_mode=padding_mode,
                                        align_corners=align_corners)

    return type("GridSample", (ReferenceGridSample,), {"op_domain": "", "_run": _run})


def _loop_with_optional_cond_and_stacked_scans() -> type:
    from onnx.reference.ops.op_loop import Loop as ReferenceLoop

    def _run(self: Any, M: np.ndarray | None, cond: np.ndarray | None, *args: Any,
             context: Any = None, body: Any = None, attributes: Any = None,
             bindings: Any = None) -> Any:
        body = self.body
        names_in, names_out = body.input_names, body.output_names
        inputs: dict[str, Any] = dict.fromkeys(names_in)
        for name, value in zip(names_in[2:], args, strict=False):
            inputs[name] = value
        if context is not None:
            inputs.update(context)
        running = True if cond is None else bool(cond)
        scans: list[list[np.ndarray]] = [[] for _ in range(self.K)]
        outputs: list[Any] = []
        iteration = 0
        while running and (M is None or iteration < int(M)):
            if names_in and names_in[0] is not None:
                inputs[names_in[0]] = np.array(iteration, dtype=np.int64 if M is None
                                               else M.dtype)
            if len(names_in) > 1 and names_in[1] is not None:
                inputs[names_in[1]] = np.array(running)
            outputs = list(self._run_body(inputs, attributes=attributes, bindings=bindings))
            for k in range(self.K):
                scans[k].append(outputs[len(outputs) - self.K + k])
            running = bool(outputs[self.output_index[names_out[0]]])
            for name_in, name_out in zip(names_in[2:], names_out[1:], strict=False):
                inputs[name_in] = outputs[self.output_index[name_out]]
            iteration += 1
        carried = [inputs[name] for name in names_in[2:]][:self.N] if iteration == 0 \
            else outputs[1:1 + self.N]
        stacked = [np.stack(scan) if scan else np.empty((0,), dtype=np.float32)
                   for scan in scans]
        results = [*carried, *stacked]
        while len(results) < len(self.onnx_node.output):
            results.append(np.empty(shape=()))
        return self._check_and_fix_outputs(tuple(results))

    return type("Loop", (ReferenceLoop,), {"op_domain": "", "_run": _run})


def reference_kernel_fixes() -> list[type]:
    """``OpRun`` classes overriding the reference evaluator's broken kernels."""
    return [_grid_sample_with_old_mode_names(), _loop_with_optional_cond_and_stacked_scans()]


__all__ = ["reference_kernel_fixes"]
