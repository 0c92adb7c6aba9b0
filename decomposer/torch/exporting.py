"""``export``: torch.onnx.export, then decompose, check the dims and verify.

In: a ``torch.nn.Module``, its example inputs, an output path and torch's export keywords.
Out: the decomposed ONNX file and its :class:`decomposer.Report` (with the verification
against eager mode), or :class:`ExportError` with nothing written.
"""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import onnx
import torch

from decomposer.api import decompose_with_report
from decomposer.errors import (
    DecomposerError,
    ExportError,
    InvalidModelError,
    ModelIOError,
)
from decomposer.modelio import load_model, save_model
from decomposer.opsets import default_opset
from decomposer.registry import Registry
from decomposer.report import Report
from decomposer.torch import probe
from decomposer.torch.frozen import frozen_in_graph, frozen_in_program, refuse
from decomposer.torch.inputs import Leaf, declared_dynamic, input_leaves, tensor_leaves
from decomposer.torch.opaque import translation_table
from decomposer.torch.probe import OPAQUE_DOMAIN, TORCHLIB_OPSET
from decomposer.torch.routing import Router, legacy_routing, translations
from decomposer.torch.verify import run_checks, verify_options
from decomposer.verification import require_passed

logger = logging.getLogger(__name__)


_OWN_KEYWORDS = ("opset_version", "dynamic_shapes", "dynamo")


def export(model: Any, args: Any, f: str | Path, *, opset_version: int | None = None,
           dynamic_shapes: Any = None, dynamo: bool = True,
           verify: bool | Mapping[str, Any] = True, target: str = "portable",
           patterns: Sequence[str] | Registry | None = None,
           **export_kwargs: Any) -> Report:
    """Export ``model`` with ``torch.onnx.export``, decompose the opaque nodes, write ``f``.

    ``args`` (a tuple, or one tensor), ``opset_version``, ``dynamic_shapes`` and ``dynamo``
    mean what they mean to ``torch.onnx.export``; every other keyword (``input_names``,
    ``dynamic_axes``, ``kwargs``, ``external_data``, ``custom_translation_table`` ...) is
    passed on. ``dynamic_shapes`` works with ``dynamo=False`` too (as ``dynamic_axes``).
    ``target`` is passed to :func:`decomposer.decompose_with_report`. ``patterns`` adds the
    user's patterns: ``--patterns`` sources (``.py`` files, modules, ``.onnx`` function
    libraries) loaded over the built-ins, or a :class:`decomposer.Registry` used as it is.
    ``verify`` compares with the shared tolerance policy (:mod:`decomposer.tolerances`).

    Raises :class:`ExportError` (nothing written) when torch fails, when a dim declared
    dynamic comes out static, or when the opset differs from ``opset_version``;
    :class:`decomposer.UnsupportedNodeError` when an opaque node has no pattern. With
    ``verify`` (True, or options ``{"atol", "rtol", "inputs", "seed"}``) the written model
    runs on ONNX Runtime against ``model`` in eager mode on the example inputs and on a
    second set with every dynamic dim resized (plus ``inputs``: more ``args`` tuples); a
    mismatch raises :class:`decomposer.VerificationError` after ``f`` is written (kept for
    inspection, as ``decompose_file`` does) and the report is on ``error.report``.
    """
    if not isinstance(model, torch.nn.Module):
        raise ExportError(f"expected a torch.nn.Module, got {type(model).__name__}")
    clash = sorted(set(export_kwargs) & set(_OWN_KEYWORDS))
    if clash:
        raise InvalidModelError(f"export(): {clash} given twice")
    args = tuple(args) if isinstance(args, (tuple, list)) else (args,)
    kwargs = dict(export_kwargs.pop("kwargs", None) or {})
    options = verify_options(verify)
    destination = Path(f)
    folder = destination.parent if str(destination.parent) else Path(".")
    if not folder.is_dir():
        raise ModelIOError(f"{destination}: output folder '{folder}' does not exist; create "
                           f"it first")
    if opset_version is not None and opset_version < 11:
        raise InvalidModelError(f"opset_version={opset_version}: decomposer writes opset 11 "
                                f"and newer")
    leaves = input_leaves(model, args, kwargs)
    n_tensors = len(tensor_leaves(leaves))
    dynamic = declared_dynamic(leaves, dynamic_shapes, export_kwargs.get("dynamic_axes"),
                                export_kwargs.get("input_names"))
    export_kwargs.setdefault("verbose", False)
    probe.pattern_rewrites.cache_clear()  # patterns registered since the last export count

    with tempfile.TemporaryDirectory(prefix=".decomposer-export-", dir=folder) as scratch:
        exported = Path(scratch) / destination.name
        program = None
        if dynamo:
            program = _export_dynamo(model, args, kwargs, exported, opset_version,
                                     dynamic_shapes, target, export_kwargs)
        else:
            _export_legacy(model, args, kwargs, exported, opset_version, dynamic_shapes,
                           leaves, target, export_kwargs)
        onnx_model = load_model(exported)
        problems = frozen_in_program(program, dynamic, n_tensors) if program else []
        problems += frozen_in_graph(onnx_model, dynamic, n_tensors,
                                     _output_axes(export_kwargs))
        refuse(problems)
        produced = default_opset(onnx_model)
        if opset_version is not None and produced != opset_version:
            if not dynamo or produced is None or produced < opset_version:
                _require_opset(onnx_model, opset_version, "torch's export")
        # one path with --target-opset: torch's standard ops go down with the custom nodes
        out, report = decompose_with_report(onnx_model, target=target,
                                            target_opset=opset_version,
                                            registry=_registry(patterns))
        _require_opset(out, opset_version, "the decomposed model")
        save_model(out, destination, source_dir=scratch)
    report.output_path = str(destination)
    if options is None:
        return report
    report.verification = run_checks(model, destination, out, leaves, dynamic, args, kwargs,
                                      options)
    require_passed(report.verification, attach=report)
    return report


def _registry(patterns: Sequence[str] | Registry | None) -> Registry | None:
    if patterns is None or isinstance(patterns, Registry):
        return patterns
    from decomposer.plugins import load_pattern_source
    from decomposer.registry import build_registry

    registry = build_registry()
    for source in [patterns] if isinstance(patterns, str) else list(patterns):
        load_pattern_source(str(source), registry)
    return registry


def _output_axes(export_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    axes = export_kwargs.get("dynamic_axes") or {}
    outputs = set(export_kwargs.get("output_names") or ())
    return {name: value for name, value in axes.items() if name in outputs}


def _export_dynamo(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], path: Path,
                   opset_version: int | None, dynamic_shapes: Any, target: str,
                   export_kwargs: dict[str, Any]) -> Any:
    from torch.onnx import _constants

    final_opset = opset_version or _constants.ONNX_DEFAULT_OPSET
    torch_opset = max(final_opset, TORCHLIB_OPSET)  # lower ones are converted afterwards
    # One file unless the weights pass 2 GiB (torch then writes them apart anyway), as the
    # legacy exporter does; torch's dynamo default always writes a separate data file.
    export_kwargs.setdefault("external_data", False)
    table = {**translations(torch_opset), **translation_table(torch_opset),
             **dict(export_kwargs.pop("custom_translation_table", None) or {})}
    router = Router(final_opset, target)
    try:
        with router:
            program = torch.onnx.export(model, args, str(path), kwargs=kwargs or None,
                                        dynamo=True, opset_version=torch_opset,
                                        dynamic_shapes=dynamic_shapes,
                                        custom_translation_table=table, **export_kwargs)
    except DecomposerError:
        raise
    except Exception as exc:
        raise _torch_error(exc) from exc
    logger.info("routed through opaque nodes: %s", ", ".join(router.routed) or "nothing")
    return program


def _export_legacy(model: Any, args: tuple[Any, ...], kwargs: dict[str, Any], path: Path,
                   opset_version: int | None, dynamic_shapes: Any, leaves: Sequence[Leaf],
                   target: str, export_kwargs: dict[str, Any]) -> None:
    import warnings

    from torch.onnx import _constants

    opset = opset_version or _constants.ONNX_DEFAULT_OPSET
    if dynamic_shapes is not None:  # the legacy exporter speaks dynamic_axes
        names = list(export_kwargs.get("input_names") or [])
        tensors = tensor_leaves(leaves)
        if not names:
            names = [re.sub(r"\W+", "_", leaf.label).strip("_") for leaf in tensors]
            export_kwargs["input_names"] = names
        axes = dict(export_kwargs.get("dynamic_axes") or {})
        for dim in declared_dynamic(leaves, dynamic_shapes, None, names):
            axes.setdefault(names[dim.tensor], {})[dim.dim] = dim.group.lstrip("#")
        export_kwargs["dynamic_axes"] = axes
    export_kwargs["custom_opsets"] = {OPAQUE_DOMAIN: 1,
                                      **dict(export_kwargs.get("custom_opsets") or {})}
    export_kwargs.pop("custom_translation_table", None)
    call_args = (*args, kwargs) if kwargs else args
    try:
        with legacy_routing(opset, target), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, call_args, str(path), dynamo=False, opset_version=opset,
                              **export_kwargs)
    except DecomposerError:
        raise
    except Exception as exc:
        raise _torch_error(exc) from exc


def _require_opset(model: onnx.ModelProto, opset: int | None, what: str) -> None:
    produced = default_opset(model)
    if opset is not None and produced != opset:
        raise ExportError(f"{what} is at opset {produced}, not the opset_version={opset} "
                          f"asked for; refusing to change the opset silently")


def _torch_error(exc: Exception) -> ExportError:
    """torch's export errors are pages long; keep the summary."""
    text = str(exc)
    summary = text.split("## Exception summary", 1)[-1].split("(Refer to the full", 1)[0]
    lines = [line.strip() for line in summary.strip().splitlines() if line.strip()]
    detail = " ".join(lines[:6]) if lines else type(exc).__name__
    return ExportError(f"torch.onnx.export failed: {detail}")
