"""decomposer: rewrite custom ONNX nodes into standard ONNX ops, so stock runtimes run them.

In: an exported ``.onnx`` model holding opaque nodes (custom-domain ops emitted by a
``symbolic()``, or torch's ``org.pytorch.aten`` fallbacks). Out: an equivalent model of
standard ONNX ops at the model's own opset, runnable on every engine.

Public API: :func:`decompose`, :func:`decompose_with_report`, :func:`decompose_file`,
:func:`decompose_many` and :func:`check` (many models: :mod:`decomposer.batch`),
:func:`load_model`, :func:`save_model`, :func:`verify`, :func:`require_passed`,
:func:`register`, :class:`Pattern`, :class:`Attr`,
:class:`Reject`, :class:`Report`, and the :class:`DecomposerError` family.
``decomposer.torch`` (exporting from PyTorch) imports torch and is not imported here.
"""

from __future__ import annotations

from decomposer.api import decompose, decompose_file, decompose_with_report, register
from decomposer.batch import BatchReport, ModelResult, check_many, decompose_many
from decomposer.errors import (
    CheckFailedError,
    DecomposerError,
    EngineRunError,
    EngineUnavailableError,
    ExportError,
    InvalidModelError,
    ModelIOError,
    PatternBugError,
    PatternError,
    UnsupportedNodeError,
    VerificationError,
)
from decomposer.modelio import load_model, save_model
from decomposer.pattern import Attr, Const, Form, In, MatchedNode, Pattern, Reject
from decomposer.registry import Registry, default_registry
from decomposer.report import Report
from decomposer.verification import VerifyReport, require_passed, verify

__version__ = "0.1.0"

check = check_many  # decomposer.check(paths, engines=[...]): a report, nothing written

__all__ = [
    "Attr",
    "BatchReport",
    "ModelResult",
    "check",
    "check_many",
    "decompose_many",
    "Const",
    "Form",
    "In",
    "CheckFailedError",
    "DecomposerError",
    "EngineRunError",
    "EngineUnavailableError",
    "ExportError",
    "InvalidModelError",
    "MatchedNode",
    "ModelIOError",
    "Pattern",
    "PatternBugError",
    "PatternError",
    "Registry",
    "Reject",
    "Report",
    "UnsupportedNodeError",
    "VerificationError",
    "VerifyReport",
    "__version__",
    "decompose",
    "decompose_file",
    "decompose_with_report",
    "default_registry",
    "load_model",
    "register",
    "require_passed",
    "save_model",
    "verify",
]
