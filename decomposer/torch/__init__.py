"""Export a PyTorch model with today's exporter and get a dynamic, plugin-free ONNX model.

In: a ``torch.nn.Module``, its example inputs and an output path (:func:`export`); or a
user's ``torch.autograd.Function`` whose ``symbolic()`` emits an opaque node
(:func:`opaque_function`). Out: an ONNX file of standard ops at the opset asked for, with
every size declared dynamic still dynamic, checked on ONNX Runtime against the model in
eager mode, and the run's :class:`decomposer.Report`.

What plain ``torch.onnx.export`` (torch 2.13, dynamo by default) gets wrong, and what
:func:`export` does instead:

- ``F.affine_grid`` is traced through its Python decomposition, which freezes H and W to
  the example's sizes (``Dim.AUTO``: silently; named dims: an error) and writes a base grid
  much slower than a native kernel. ``export`` routes it, during the export only,
  through a ``torch.library`` custom op that the ONNX translation writes as
  ``custom.ops::AffineGrid(theta, Concat(sizes))``, every size symbolic, then decomposes it.
- ``F.grid_sample`` and ``torch.rot90`` go the same way (``custom.ops::GridSample``,
  ``custom.ops::Rot90``) where that is better than torch's own export: below the opset
  that has GridSample, where ONNX Runtime's kernel is slow or differs from torch (see
  :func:`grid_sample_stays_native`), and for rot90 because torch writes a ``Slice`` with
  step -1, which onnx2tf silently turns into Identity. An op is routed only when a
  registered pattern rewrites that exact node (asked with a one-node probe model), so an op
  no pattern knows is exported as torch would export it.
- ``torch.linalg.inv`` / ``torch.inverse`` / ``Tensor.inverse``, ``torch.linalg.inv_ex``
  (``check_errors=False``), ``torch.linalg.solve``, ``torch.searchsorted`` (tensor values)
  and ``torch.cummax`` / ``torch.cummin`` have no ONNX function in torch's exporter at all
  ("No ONNX function found for aten.linalg_inv_ex"). ``export`` routes them the same way,
  to ``custom.ops::Inverse`` / ``Solve`` / ``SearchSorted`` / ``CumMax`` / ``CumMin`` and
  ``org.pytorch.aten::linalg_inv_ex``.
- ``opset_version`` below 18 silently stays 18 (the exporter's conversion fails and is only
  logged). ``export`` exports at 18 and converts itself, or raises :class:`ExportError`.
- A dim declared dynamic that torch froze (in the exported program, the ONNX inputs or
  outputs) raises :class:`ExportError` naming the input and dim, before anything is
  written; one frozen only inside the graph fails verification, which runs a second input
  set in which every dim declared dynamic has another size.

With ``dynamo=False`` the same nodes come from symbolic functions registered for the
duration of the export (``aten::affine_grid_generator``, ``aten::grid_sampler``,
``aten::rot90``).

:func:`opaque_function` is the seeds' recipe on modern torch: it turns an
``autograd.Function`` with a ``symbolic()`` into one that exports the same opaque node
(domain, op type, typed attributes) under the dynamo exporter too, by running that
``symbolic()`` inside the custom op's ONNX translation; the legacy exporter and eager mode
keep calling the original Function.

torch is imported by this package only; ``import decomposer`` never imports it. Modules:
``exporting`` (:func:`export`), ``inputs`` (flattened inputs, dims declared dynamic),
``probe`` (would a pattern rewrite this node?), ``routing`` and ``routes/`` (one module per
routed op: custom op, fake kernel, translation and legacy symbolic together), ``opaque``
(:func:`opaque_function`), ``frozen`` (frozen-dim checks), ``verify`` (against eager). The
opset down-conversion is the core's :mod:`decomposer.opsets`.
Not thread-safe: the routing is a torch function mode of the exporting thread, and the
legacy symbolics are process-wide while an export runs.
"""

from __future__ import annotations

from decomposer.errors import ExportError
from decomposer.torch.exporting import export
from decomposer.torch.opaque import data_dependent_size, opaque_function, translation_table
from decomposer.torch.probe import OPAQUE_DOMAIN, grid_sample_stays_native

__all__ = ["OPAQUE_DOMAIN", "ExportError", "data_dependent_size", "export",
           "grid_sample_stays_native", "opaque_function", "translation_table"]
