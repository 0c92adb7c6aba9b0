"""The README's shell and Python blocks run, as a new user would run them.

Every ```bash and ```python block in README.md runs, in a scratch folder where ``tests/``,
``docs/`` and ``scripts/`` point at the repository's, unless the line before the block is
``<!-- not run: <why> -->`` (installs, the test suite itself, benchmarks that take minutes).
A bash line ending in ``# exit N`` must exit with N; every other line must exit 0.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCK = re.compile(r"(<!-- not run: [^>]+-->\n)?```(bash|python)\n(.*?)```", re.S)


def _blocks() -> list[tuple[str, str, str]]:
    found = []
    for index, match in enumerate(BLOCK.finditer(README)):
        skipped, language, body = match.groups()
        if not skipped:
            found.append((f"{language}-{index}", language, body))
    return found


def test_readme_has_runnable_blocks_of_both_kinds():
    languages = {language for _, language, _ in _blocks()}
    assert languages == {"bash", "python"}


@pytest.fixture
def scratch(tmp_path):
    for name in ("tests", "docs", "scripts"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    # `decomposer` (the console script) must be the one of this interpreter.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.mark.parametrize("label,language,body", _blocks(), ids=[b[0] for b in _blocks()])
def test_readme_block_runs(label, language, body, scratch):
    if language == "python":
        run = subprocess.run([sys.executable, "-c", body], cwd=scratch, capture_output=True,
                             text=True, env=_environment(), timeout=600)
        assert run.returncode == 0, f"{label} failed:\n{body}\n{run.stdout}\n{run.stderr}"
        return
    for line in body.splitlines():
        command = line.split("#", 1)[0].strip() if " # " in line or line.startswith("#") \
            else line.strip()
        if not command:
            continue
        expected = re.search(r"# exit (\d+)\s*$", line)
        run = subprocess.run(command, shell=True, cwd=scratch, capture_output=True, text=True,
                             env=_environment(), timeout=600)
        want = int(expected.group(1)) if expected else 0
        assert run.returncode == want, (f"{label}: `{command}` exited {run.returncode}, "
                                        f"expected {want}:\n{run.stdout}\n{run.stderr}")
