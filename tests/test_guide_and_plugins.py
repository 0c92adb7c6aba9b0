"""The pattern guide's example runs, the guide quotes it exactly, and user patterns load
through --patterns (file and module), @register, and a real entry point."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import decomposer
from decomposer.cli import main
from decomposer.registry import Registry, build_registry

from _helpers import run_onnxruntime

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "docs" / "examples"
GUIDE = ROOT / "docs" / "writing-a-pattern.md"


def test_guide_quotes_the_example_files_exactly():
    text = GUIDE.read_text()
    quoted = re.findall(r"<!-- file: (\S+) -->\n```python\n(.*?)```", text, re.S)
    assert {path for path, _ in quoted} == {
        "docs/examples/export_squareplus.py", "docs/examples/squareplus_pattern.py",
        "docs/examples/test_squareplus_pattern.py"}
    for path, body in quoted:
        assert body == (ROOT / path).read_text(), f"{path} differs from the guide"


def test_guide_walkthrough(tmp_path, capsys):
    exported = tmp_path / "squareplus.onnx"
    subprocess.run([sys.executable, str(EXAMPLES / "export_squareplus.py"), str(exported)],
                   check=True, capture_output=True)
    out = tmp_path / "out.onnx"
    assert main([str(exported), str(out)]) == 3  # no pattern yet
    pattern_file = str(EXAMPLES / "squareplus_pattern.py")
    assert main([str(exported), str(out), "--patterns", pattern_file]) == 0
    assert "decomposed 1 node (SquarePlus x1)" in capsys.readouterr().out
    model = onnx.load(out)
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
    (got,) = run_onnxruntime(model, {"x": x})
    t = torch.tanh(torch.from_numpy(x))
    np.testing.assert_allclose(got, ((t + torch.sqrt(t * t + 1.5)) / 2).numpy(), atol=1e-6)
    assert main(["--patterns", pattern_file, "--list-patterns"]) == 0
    listing = capsys.readouterr().out
    assert f"SquarePlus       [file {pattern_file}]" in listing
    assert "SquarePlus: y = (x + sqrt(x*x + b)) / 2" in listing


def test_guide_kit_test_runs():
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(EXAMPLES / "test_squareplus_pattern.py")],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout


CLASHING = textwrap.dedent('''
    import decomposer

    class MyAffineGrid(decomposer.Pattern):
        """My own AffineGrid."""
        op_type = "AffineGrid"

        def build(self, b, node, facts):
            b.identity(node.inputs[0], node.outputs[0])

    PATTERNS = [MyAffineGrid()]
''')


def test_clash_with_builtin_is_an_error_unless_overridden(tmp_path, capsys):
    plugin = tmp_path / "clash.py"
    plugin.write_text(CLASHING)
    assert main(["--patterns", str(plugin), "--list-patterns"]) == 2
    err = capsys.readouterr().err
    assert "clashes with built-in: AffineGrid" in err and "--override" in err
    assert main(["--patterns", str(plugin), "--override", "--list-patterns"]) == 0
    listing = capsys.readouterr().out
    assert f"AffineGrid       [file {plugin}]" in listing
    assert "[built-in] (any domain; ATen" not in listing


def test_register_decorator_and_registry_refuse_duplicates():
    registry = Registry()

    class Thing(decomposer.Pattern):
        op_type = "Thing"

    decomposer.register(Thing, registry=registry)
    with pytest.raises(decomposer.PatternError, match="clashes"):
        decomposer.register(Thing(), registry=registry)
    decomposer.register(Thing(), registry=registry, override=True)
    assert len(registry) == 1


def test_patterns_from_module_name(tmp_path, capsys, monkeypatch):
    (tmp_path / "team_patterns.py").write_text(CLASHING.replace('"AffineGrid"', '"Mine"'))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["--patterns", "team_patterns", "--list-patterns"]) == 0
    assert "Mine             [module team_patterns]" in capsys.readouterr().out


def test_bad_pattern_sources_are_one_line_errors(tmp_path, capsys):
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    for source, message in [(str(empty), "declares no pattern"),
                            (str(broken), "importing it failed: RuntimeError: boom"),
                            ("no_such_module_xyz", "not importable"),
                            (str(tmp_path / "missing.py"), "no such file")]:
        assert main(["--patterns", source, "--list-patterns"]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_entry_point_from_an_installed_distribution(tmp_path):
    # A real (if minimal) installed distribution on sys.path: importlib.metadata finds its
    # entry_points.txt exactly as it would for a pip-installed package.
    site = tmp_path / "site"
    package = site / "acme_patterns"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(CLASHING.replace('"AffineGrid"', '"AcmeOp"'))
    dist = site / "acme_patterns-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-patterns\n"
                                   "Version: 1.0\n")
    (dist / "entry_points.txt").write_text("[decomposer.patterns]\nacme = acme_patterns\n")
    env = {"PYTHONPATH": str(site), "PATH": ""}
    listing = subprocess.run([sys.executable, "-m", "decomposer", "--list-patterns"],
                             capture_output=True, text=True, env=env)
    assert listing.returncode == 0, listing.stderr
    assert "AcmeOp           [entry point acme (acme_patterns)]" in listing.stdout
    # ... and it decomposes its op, here AcmeOp -> Identity.
    node = helper.make_node("AcmeOp", ["x"], ["y"], name="acme", domain="acme")
    info = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2, 3]) for n in "xy"]
    model = helper.make_model(helper.make_graph([node], "g", info[:1], info[1:]),
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid("acme", 1)], ir_version=8)
    src, dst = tmp_path / "acme.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    run = subprocess.run([sys.executable, "-m", "decomposer", str(src), str(dst)],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert "decomposed 1 node (AcmeOp x1)" in run.stdout
    assert [n.op_type for n in onnx.load(dst).graph.node] == ["Identity"]


def test_builtin_registry_without_entry_points_is_the_pattern_modules():
    names = sorted(entry.pattern.name for entry in build_registry(entry_points=False))
    assert names == ["AffineGrid", "CustomRotScale", "Rot90AndScale"]
