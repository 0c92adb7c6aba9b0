"""Test the SquarePlus pattern with decomposer's pattern kit, against torch."""

from __future__ import annotations

import numpy as np
import torch
from squareplus_pattern import SquarePlus

from decomposer.testing import Case, check_pattern


def torch_squareplus(x, b=4.0):
    t = torch.from_numpy(x)
    return ((t + torch.sqrt(t * t + float(b))) / 2).numpy()


def test_squareplus():
    rng = np.random.default_rng(0)
    cases = [Case([rng.normal(size=(2, 8)).astype(np.float32)], {"b": b}, symbolic="all",
                  more_inputs=[[rng.normal(size=(5, 3)).astype(np.float32)]])
             for b in (0.0, 1.5, 4.0)]
    check_pattern(SquarePlus(), cases, opsets=[11, 13, 17, 20], domain="custom.ops",
                  oracle=torch_squareplus, atol=1e-6)


def test_squareplus_with_b_as_a_constant_input():
    x = np.random.default_rng(1).normal(size=(3, 4)).astype(np.float32)
    cases = [Case([x, np.array(b, np.float32)], constant_inputs=[1], symbolic="all")
             for b in (0.5, 9.0)]
    check_pattern(SquarePlus(), cases, opsets=[11, 20], form="SquarePlusB",
                  oracle=torch_squareplus, atol=1e-6)
