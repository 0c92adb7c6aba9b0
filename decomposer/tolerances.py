"""The one tolerance policy: how close a decomposed result must be to its reference.

In: the dtype of the expected values, and optionally a tolerance the caller chose. Out:
the ``(atol, rtol)`` pair for ``|actual - expected| <= atol + rtol * |expected|`` (NaN
equal to NaN). Integer and boolean results are compared exactly.

Used, with the same numbers, by the pattern test kit (:mod:`decomposer.testing`), by
``--verify`` / :func:`decomposer.verify` (each replaced node against its reference, graph
outputs against the original's run) and by ``decomposer.torch.export`` /
``decomposer.torch.define`` (the written model against the torch model in eager mode).
A caller's own ``atol``/``rtol`` (a number, or a mapping from numpy dtype to number)
replaces the default for that call only.

The float32 figures are tight enough that a 3e-5 error on values near 1 fails: float32
keeps about 7 significant digits, and a decomposition that is exact up to rounding stays
well inside 1e-5 + 1e-5 * |expected| (docs/verification.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

DEFAULT_ATOL: dict[Any, float] = {np.float16: 2e-3, np.float32: 1e-5, np.float64: 1e-9}
DEFAULT_RTOL: dict[Any, float] = {np.float16: 2e-3, np.float32: 1e-5, np.float64: 1e-9}
Tolerance = float | Mapping[Any, float]


def tolerance(given: Tolerance | None, defaults: Mapping[Any, float], dtype: Any) -> float:
    """``given`` for ``dtype`` (a number, or a per-dtype mapping), else the default; 0 for
    a dtype that is not floating point or that neither names (compared exactly)."""
    kind = np.dtype(dtype)
    if not np.issubdtype(kind, np.inexact):
        return 0.0
    table = defaults if given is None else given
    if isinstance(table, Mapping):
        for key, value in table.items():
            if np.dtype(key) == kind:
                return float(value)
        return float(defaults.get(kind.type, 0.0))
    return float(table)


def pair(dtype: Any, atol: Tolerance | None = None, rtol: Tolerance | None = None
         ) -> tuple[float, float]:
    """``(atol, rtol)`` for results of ``dtype`` under the policy (or the caller's)."""
    return (tolerance(atol, DEFAULT_ATOL, dtype), tolerance(rtol, DEFAULT_RTOL, dtype))


def compared_dtype(actual: np.ndarray, expected: np.ndarray) -> np.dtype:
    """The dtype whose tolerance applies: the less precise floating dtype of the two (a
    float64 reference of a float32 result is judged at float32), else ``expected``'s."""
    floats = [a.dtype for a in (actual, expected) if np.issubdtype(a.dtype, np.inexact)]
    if not floats:
        return np.dtype(expected.dtype)
    return min(floats, key=lambda dtype: dtype.itemsize)
