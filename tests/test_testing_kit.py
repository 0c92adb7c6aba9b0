"""The pattern test kit itself: NaN handling, the default domain, per-dtype tolerances and
signed zeros (each failed before the kit learned it). The oracle here is numpy's own
arithmetic, independent of the patterns under test."""

from __future__ import annotations

import numpy as np
import pytest

import decomposer
from decomposer.testing import Case, check_pattern, compare


class Halve(decomposer.Pattern):
    """y = x * 0.5 in the pattern's own domain only."""

    op_type = "Halve"
    domains = frozenset({"acme.ops"})

    def check(self, node, ctx):
        return ctx.elem_type(node.inputs[0])

    def build(self, b, node, elem_type):
        b.Mul(b.input(node.inputs[0], elem_type), 0.5, out=node.outputs[0])

    def reference(self, x):
        return [(x * np.asarray(0.5, x.dtype)).astype(x.dtype)]


class NegateBySubtraction(Halve):
    """y = 0 - x: equal to -x except for the sign of zero."""

    op_type = "Negate"

    def build(self, b, node, elem_type):
        b.Sub(0.0, b.input(node.inputs[0], elem_type), out=node.outputs[0])

    def reference(self, x):
        return [-x]


def test_nan_outputs_pass_and_default_domain_is_the_patterns():
    x = np.array([1.0, np.nan, -np.inf, 4.0], dtype=np.float32)
    # Halve answers only in acme.ops: a custom.test default domain would leave the node.
    (result,) = check_pattern(Halve(), [Case([x])], opsets=[17],
                              oracle=lambda x: x * np.float32(0.5))
    assert result.model.graph.node[-1].op_type == "Mul"


def test_nan_mismatch_message_names_nan():
    with pytest.raises(AssertionError, match="NaN positions differ"):
        compare(np.array([np.nan, 1.0]), np.array([0.0, 1.0]), "case")


def test_per_dtype_tolerances():
    x16 = np.array([0.1, 0.2, 0.3], dtype=np.float16)
    x64 = np.array([0.1, 0.2, 0.3], dtype=np.float64)
    tolerances = {np.float16: 1e-3, np.float64: 1e-12}
    check_pattern(Halve(), [Case([x16]), Case([x64])], opsets=[13], atol=tolerances, rtol=0,
                  oracle=lambda x: x * x.dtype.type(0.5))
    with pytest.raises(AssertionError, match="outside atol=1e-12"):
        compare(np.array([1.0 + 1e-9]), np.array([1.0]), "case", atol=tolerances, rtol=0)


def test_signed_zeros_are_checked_on_request():
    x = np.array([0.0, 1.0, -2.0], dtype=np.float32)
    check_pattern(NegateBySubtraction(), [Case([x])], opsets=[17], oracle=lambda x: -x)
    with pytest.raises(AssertionError, match="wrong sign"):
        check_pattern(NegateBySubtraction(), [Case([x])], opsets=[17], oracle=lambda x: -x,
                      signed_zeros=True)
