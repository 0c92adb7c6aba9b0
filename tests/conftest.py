"""Test configuration: makes ``scripts/`` importable (the seed torch modules live there), and
keeps the ``exhaustive`` tests out of the default run.

The default run (the README's ``python -m pytest -q``) samples the grids: full products of
opsets x options and the engine runs of every portability case on every configuration are
marked ``exhaustive`` and deselected unless asked for, with ``-m exhaustive`` (only them, as
``.ci/run`` does after the default run) or ``--exhaustive`` (everything).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--exhaustive", action="store_true",
                     help="also run the tests marked exhaustive (the full grids)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--exhaustive") or "exhaustive" in (config.getoption("-m") or ""):
        return
    kept, dropped = [], []
    for item in items:
        (dropped if item.get_closest_marker("exhaustive") else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
