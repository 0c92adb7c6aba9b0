"""The one exception family raised by decomposer.

In: nothing; this module only defines classes.
Out: ``DecomposerError`` and its subclasses. Every error the library raises on purpose
derives from ``DecomposerError``; each subclass carries the CLI exit code it maps to, so the
command line never has to guess.
"""

from __future__ import annotations

from typing import Any


class DecomposerError(Exception):
    """Root of every error decomposer raises. ``exit_code`` is what the CLI returns for it."""

    exit_code = 2


class InvalidModelError(DecomposerError):
    """The input is not a usable ONNX model (unreadable, malformed, unsafe, bad options)."""

    exit_code = 2


class ExportError(InvalidModelError):
    """``decomposer.torch.export``: torch could not export the model, or its export would be
    silently wrong (a dim declared dynamic came out static, or the opset differs from the
    one asked for)."""


class UnsupportedNodeError(DecomposerError):
    """Non-standard nodes remain that no pattern can rewrite.

    ``nodes`` holds one :class:`decomposer.report.NodeIssue` per offending node, and
    ``report`` the run's :class:`decomposer.report.Report` (what could be rewritten).
    """

    exit_code = 3

    def __init__(self, message: str, nodes: list[Any] | None = None, report: object = None) -> None:
        super().__init__(message)
        self.nodes = list(nodes or [])
        self.report = report


class CheckFailedError(DecomposerError):
    """The rewritten model failed ``onnx.checker`` or shape inference: a decomposer bug."""

    exit_code = 4


class VerificationError(DecomposerError):
    """The rewritten model computes different numbers from the original."""

    exit_code = 1


class ModelIOError(DecomposerError):
    """Reading or writing a model file failed (permissions, disk, missing folder)."""

    exit_code = 5


class PatternError(DecomposerError):
    """A pattern is wrong: a registration clash or bad schema (user input, exit 2), or a
    pattern that crashed or emitted an invalid subgraph (a bug, see :class:`PatternBugError`)."""

    exit_code = 2


class PatternBugError(PatternError):
    """A pattern crashed while checking or building a node, or did not write its outputs.

    That is a bug in the pattern (or in decomposer), never in the user's model: exit 4."""

    exit_code = 4


class EngineUnavailableError(DecomposerError):
    """An inference engine was asked for (``--engine NAME``) but is not installed; the
    message names the pip package that provides it."""

    exit_code = 2


class EngineRunError(VerificationError):
    """An inference engine could not load or run a model. ``engine`` names it; the message
    holds the engine's first error line."""

    def __init__(self, message: str, engine: str = "") -> None:
        super().__init__(message)
        self.engine = engine
