"""The library entry points.

In: an ``onnx.ModelProto`` (``decompose``) or a model file path (``decompose_file``).
Out: a new model in which every custom node a pattern knows is replaced by standard ONNX
ops, and a :class:`decomposer.report.Report`. The input model is never mutated. Every
error raised derives from :class:`decomposer.DecomposerError`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import onnx

from decomposer import engine
from decomposer.errors import UnsupportedNodeError
from decomposer.modelio import load_model, save_model
from decomposer.pattern import Pattern
from decomposer.plugins import current_target
from decomposer.registry import Registry, default_registry
from decomposer.report import Report


def decompose(model: onnx.ModelProto, *, allow_unsupported: bool = False, check: bool = True,
              registry: Registry | None = None, target: str = "portable",
              lower: Iterable[str] = (), base_dir: str | os.PathLike[str] | None = None,
              target_opset: int | None = None, input_shapes: Mapping[str, Any] | None = None,
              freeze_inputs: Mapping[str, Any] | None = None) -> onnx.ModelProto:
    """Return a copy of ``model`` with every decomposable custom node rewritten.

    ``allow_unsupported`` keeps nodes no pattern can rewrite instead of raising
    :class:`UnsupportedNodeError`; ``check`` runs ``onnx.checker`` (full_check) on the result.
    ``target`` is ``"portable"`` (the output runs on every engine; ONNX Runtime's contrib
    ops count as unsupported), ``"ort"`` (ONNX Runtime only: its contrib ops are kept and
    patterns may choose forms tuned for it) or ``"qdq"`` (as portable, but block-quantized
    weights stay quantized behind a ``DequantizeLinear`` at opset 21+: for ONNX Runtime,
    OpenVINO and TensorRT, whose low-bit kernels run it; not TVM or the converters).
    ``lower`` names standard ONNX op types to decompose too, where the opset defines them,
    for engines without a kernel for them (``lower=[op_type, ...]``); each must be one a
    pattern rewrites (the error lists them). ``base_dir``, the folder of a model loaded
    with ``load_external_data=False``, is where a pattern that repacks weights (ONNX
    Runtime's 4-bit matmuls under ``"qdq"``) reads external ones; without it, such weights
    keep the portable form. ``target_opset`` (11 to the newest) takes a model at a newer
    default-domain opset down to it, standard ops included (:mod:`decomposer.opsets`); at
    or above the model's opset it changes nothing (decomposer never upgrades). ``target``
    may also name engines (``"rknn,openvino"``: :mod:`decomposer.targets`).
    ``input_shapes`` (input -> dims; a str dim stays symbolic) and ``freeze_inputs``
    (input -> values) fix inputs in the written model and fold the shape arithmetic and
    branches they decide (:mod:`decomposer.freezing`).
    """
    out, _ = engine.run(model, registry=registry, allow_unsupported=allow_unsupported,
                        check=check, target=target, lower=lower, base_dir=base_dir,
                        target_opset=target_opset, input_shapes=input_shapes,
                        freeze_inputs=freeze_inputs)
    return out


def decompose_with_report(model: onnx.ModelProto, *, allow_unsupported: bool = False,
                          check: bool = True, registry: Registry | None = None,
                          target: str = "portable", lower: Iterable[str] = (),
                          base_dir: str | os.PathLike[str] | None = None,
                          target_opset: int | None = None,
                          input_shapes: Mapping[str, Any] | None = None,
                          freeze_inputs: Mapping[str, Any] | None = None
                          ) -> tuple[onnx.ModelProto, Report]:
    """Like :func:`decompose`, also returning the report."""
    return engine.run(model, registry=registry, allow_unsupported=allow_unsupported,
                      check=check, target=target, lower=lower, base_dir=base_dir,
                      target_opset=target_opset, input_shapes=input_shapes,
                      freeze_inputs=freeze_inputs)


def decompose_file(src: str | os.PathLike[str], dst: str | os.PathLike[str] | None, *,
                   allow_unsupported: bool = False, check: bool = True,
                   registry: Registry | None = None, dry_run: bool = False,
                   verify: bool = False, verify_options: Mapping[str, Any] | None = None,
                   target: str = "portable", lower: Iterable[str] = (),
                   target_opset: int | None = None,
                   input_shapes: Mapping[str, Any] | None = None,
                   freeze_inputs: Mapping[str, Any] | None = None) -> Report:
    """Read ``src``, decompose it, and write ``dst`` atomically (not with ``dry_run``).

    External weights are streamed from ``src``'s folder into ``<dst name>.data``.
    ``dst`` may equal ``src``. Nothing is written when an error is raised, with one
    exception: with ``verify=True`` (:func:`decomposer.verify`, given
    ``verify_options``) a numeric mismatch still writes the output, for inspection, and
    then raises :class:`VerificationError` carrying ``.report``.
    """
    model = load_model(src)
    try:
        out, report = engine.run(model, registry=registry, allow_unsupported=allow_unsupported,
                                 check=check, target=target, lower=lower,
                                 base_dir=Path(src).resolve().parent,
                                 target_opset=target_opset, input_shapes=input_shapes,
                                 freeze_inputs=freeze_inputs)
    except UnsupportedNodeError as exc:
        if isinstance(exc.report, Report):
            exc.report.input_path, exc.report.output_path = str(src), None
        raise
    report.input_path = str(src)
    report.output_path = None if dst is None else str(dst)
    report.dry_run = dry_run or dst is None
    if verify:
        from decomposer.verification import verify as run_verification

        # Verify before writing, so unusable feeds fail with nothing written; a mismatch
        # is raised only after the output is on disk (it is kept for inspection).
        # External weights are read from src's folder (base_dir), never loaded here.
        if report.folded:  # verified against the model as fixed (the same inputs)
            from decomposer.freezing import fix_inputs
            from decomposer.targets import resolve

            model = fix_inputs(model, input_shapes, freeze_inputs,
                               always_fold=resolve(target).fold)
        report.verification = run_verification(
            model, out, registry=registry,
            **{"base_dir": Path(src).parent, "lower": [*report.lowered, *report.lowered_nodes],
               **dict(verify_options or {})})
    if not report.dry_run:
        save_model(out, dst, source_dir=Path(src).parent)  # type: ignore[arg-type]
    if report.verification is not None:
        from decomposer.verification import require_passed

        require_passed(report.verification, attach=report)
    return report


def register(pattern: Pattern[Any] | type[Pattern[Any]] | None = None, *, override: bool = False,
             registry: Registry | None = None, source: str | None = None) -> Any:
    """Register a pattern instance or class with the default registry.

    Usable as ``register(MyPattern())`` or as a class decorator ``@register`` /
    ``@register(override=True)``. A clash with an existing pattern on the same
    (domain, op_type) raises :class:`PatternError` unless ``override=True``.
    """

    def apply(target: Pattern[Any] | type[Pattern[Any]]) -> Any:
        instance = target() if isinstance(target, type) else target
        loading = current_target()  # inside --patterns / entry-point import: attribute to it
        if loading is not None and registry is None:
            label, target_registry, loading_override = loading
            target_registry.register(instance, source=source or label,
                                     override=override or loading_override)
        else:
            target_registry = registry if registry is not None else default_registry()
            target_registry.register(instance, source=source or "user", override=override)
        return target

    if pattern is None:
        return apply
    return apply(pattern)
