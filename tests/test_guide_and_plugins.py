"""The pattern guide's example runs, the guide quotes it exactly, and user patterns load
through --patterns (file and module), @register, and a real entry point."""

from __future__ import annotations

import importlib
import importlib.util
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
        "docs/examples/test_squareplus_pattern.py", "docs/examples/squareplus_onnxscript.py",
        "docs/examples/define_squareplus.py"}
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
    assert re.search(rf"^SquarePlus +\[file {re.escape(pattern_file)}\]", listing, re.M)
    assert "SquarePlus: y = (x + sqrt(x*x + b)) / 2" in listing


def test_guide_function_routes(tmp_path):
    """Section 0: the guide's model decomposes with no pattern class, by each route (the
    model's own definition, a library written by define(), an onnxscript module); torch's
    formula is the oracle."""
    exported = tmp_path / "squareplus.onnx"
    subprocess.run([sys.executable, str(EXAMPLES / "export_squareplus.py"), str(exported)],
                   check=True, capture_output=True)
    library = tmp_path / "ops.onnx"
    subprocess.run([sys.executable, str(EXAMPLES / "define_squareplus.py"), str(library)],
                   check=True, capture_output=True)
    local = onnx.load(exported)
    local.functions.extend(onnx.load(library).functions)
    local_path = tmp_path / "local.onnx"
    onnx.save(local, local_path)
    x = np.random.default_rng(0).normal(size=(3, 8)).astype(np.float32)
    t = torch.tanh(torch.from_numpy(x))
    want = ((t + torch.sqrt(t * t + 1.5)) / 2).numpy()
    routes = {"model-local": (local_path, []),
              "library": (exported, ["--patterns", str(library)]),
              "onnxscript": (exported, ["--patterns",
                                        str(EXAMPLES / "squareplus_onnxscript.py")])}
    for route, (source, flags) in routes.items():
        out = tmp_path / f"{route}.onnx"
        run = subprocess.run([sys.executable, "-m", "decomposer", str(source), str(out),
                              *flags, "--verify"], capture_output=True, text=True)
        assert run.returncode == 0, (route, run.stderr)
        assert "function custom.ops::SquarePlus x1" in run.stdout, route
        model = onnx.load(out)
        assert not model.functions and all(n.domain == "" for n in model.graph.node)
        (got,) = run_onnxruntime(model, {"x": x})
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=route)


def test_guide_kit_test_runs():
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             str(EXAMPLES / "test_squareplus_pattern.py")],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout


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
    assert re.search(rf"^AffineGrid +\[file {re.escape(str(plugin))}\]", listing, re.M)
    assert not re.search(r"^AffineGrid +\[built-in\]", listing, re.M)


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
    assert re.search(r"^Mine +\[module team_patterns\]", capsys.readouterr().out, re.M)


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


def _installed(tmp_path: Path, package_name: str, source: str) -> dict[str, str]:
    """A minimal installed distribution holding ``package_name`` (its ``__init__`` is
    ``source``) with an ``acme`` entry point in decomposer.patterns; the environment in
    which a subprocess finds it."""
    site = tmp_path / "site"
    package = site / package_name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(source)
    dist = site / f"{package_name}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package_name}\n"
                                   "Version: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[decomposer.patterns]\nacme = {package_name}\n")
    return {"PYTHONPATH": str(site), "PATH": ""}


def _decompose_one_node(tmp_path: Path, node: onnx.NodeProto, dims: list, env: dict[str, str]
                        ) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``node`` (x -> y, float, ``dims``) as a model at opset 17, through the CLI in ``env``;
    the run (asserted successful) and the output path."""
    info = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, dims) for n in "xy"]
    model = helper.make_model(helper.make_graph([node], "g", info[:1], info[1:]),
                              opset_imports=[helper.make_opsetid("", 17),
                                             helper.make_opsetid(node.domain, 1)],
                              ir_version=8)
    src, dst = tmp_path / "model.onnx", tmp_path / "out.onnx"
    onnx.save(model, src)
    run = subprocess.run([sys.executable, "-m", "decomposer", str(src), str(dst)],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    return run, dst


def test_entry_point_from_an_installed_distribution(tmp_path):
    # A real (if minimal) installed distribution on sys.path: importlib.metadata finds its
    # entry_points.txt exactly as it would for a pip-installed package.
    env = _installed(tmp_path, "acme_patterns", CLASHING.replace('"AffineGrid"', '"AcmeOp"'))
    listing = subprocess.run([sys.executable, "-m", "decomposer", "--list-patterns"],
                             capture_output=True, text=True, env=env)
    assert listing.returncode == 0, listing.stderr
    assert re.search(r"^AcmeOp +\[entry point acme \(acme_patterns\)\]", listing.stdout, re.M)
    # ... and it decomposes its op, here AcmeOp -> Identity.
    node = helper.make_node("AcmeOp", ["x"], ["y"], name="acme", domain="acme")
    run, dst = _decompose_one_node(tmp_path, node, [2, 3], env)
    assert "decomposed 1 node (AcmeOp x1)" in run.stdout
    assert [n.op_type for n in onnx.load(dst).graph.node] == ["Identity"]


def test_builtin_registry_without_entry_points_is_the_pattern_modules():
    # Every module file in patterns/ (not starting with "_") is imported, and every pattern
    # its PATTERNS list declares is in the built-in registry, and nothing else is.
    files = sorted(p.stem for p in (ROOT / "patterns").glob("*.py")
                   if not p.name.startswith("_"))
    assert files, "no pattern modules found on disk"
    expected = []
    for stem in files:
        module = importlib.import_module(f"decomposer.patterns.{stem}")
        assert getattr(module, "PATTERNS", None), f"patterns/{stem}.py has no PATTERNS list"
        expected += [id(p) for p in module.PATTERNS]
    registered = [id(entry.pattern) for entry in build_registry(entry_points=False)]
    assert sorted(registered) == sorted(expected)


def test_override_with_register_decorator_and_same_file_twice(tmp_path, capsys):
    # @decomposer.register replacing a built-in grows no registry: still a valid source.
    plugin = tmp_path / "decorated.py"
    plugin.write_text(textwrap.dedent('''
        import decomposer

        @decomposer.register
        class MyAffineGrid(decomposer.Pattern):
            """My own AffineGrid."""
            op_type = "AffineGrid"
    '''))
    assert main(["--patterns", str(plugin), "--override", "--list-patterns"]) == 0
    assert re.search(rf"^AffineGrid +\[file {re.escape(str(plugin))}\]",
                     capsys.readouterr().out, re.M)
    # The same file given twice is loaded once, not a clash with itself.
    mine = tmp_path / "mine.py"
    mine.write_text(CLASHING.replace('"AffineGrid"', '"MineTwice"'))
    assert main(["--patterns", str(mine), "--patterns", str(mine), "--list-patterns"]) == 0
    assert capsys.readouterr().out.count("MineTwice") == 1


def test_same_pattern_class_imported_under_two_names_is_not_a_clash(tmp_path, monkeypatch):
    # A pattern under development that is also installed (an entry point) gets imported
    # twice under different module names; its second registration replaces the first.
    (tmp_path / "devpattern.py").write_text(CLASHING.replace('"AffineGrid"', '"DevOp"')
                                            .replace("PATTERNS = [MyAffineGrid()]", ""))
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry()
    first = importlib.import_module("devpattern")
    spec = importlib.util.spec_from_file_location("devpattern_again",
                                                  tmp_path / "devpattern.py")
    second = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "devpattern_again", second)
    spec.loader.exec_module(second)
    decomposer.register(first.MyAffineGrid, registry=registry, source="entry point dev")
    decomposer.register(second.MyAffineGrid, registry=registry)
    assert len(registry) == 1
    # A different class for the same op is still a clash, and the message names the
    # library keyword before the command-line flag.
    class Other(decomposer.Pattern):
        op_type = "DevOp"

    with pytest.raises(decomposer.PatternError, match=r"override=True \(command line"):
        decomposer.register(Other, registry=registry)


def test_guide_api_reference_matches_the_code():
    sys.path.insert(0, str(ROOT / "scripts"))
    from api_reference import reference

    text = (ROOT / "docs" / "writing-a-pattern.md").read_text()
    assert reference() in text, ("docs/writing-a-pattern.md's API reference is stale: "
                                 "regenerate it with python scripts/api_reference.py")


@pytest.mark.parametrize("file_name, name", [("README.md", "supported-ops"),
                                             ("docs/portability.md", "portability-rules")])
def test_generated_sections_match_the_code(file_name, name):
    sys.path.insert(0, str(ROOT / "scripts"))
    from generated_docs import section

    text = (ROOT / file_name).read_text()
    assert section(name) in text, (f"{file_name}'s {name} section is stale: regenerate it "
                                   f"with python scripts/generated_docs.py --write")


def test_entry_point_with_onnxscript_functions(tmp_path):
    """An installed package whose module defines ops as onnxscript functions (the guide's
    SquarePlus) answers through the decomposer.patterns entry point, no pattern class."""
    env = _installed(tmp_path, "acme_functions",
                     (EXAMPLES / "squareplus_onnxscript.py").read_text())
    node = helper.make_node("SquarePlus", ["x"], ["y"], name="sp", domain="custom.ops", b=1.5)
    run, dst = _decompose_one_node(tmp_path, node, ["N", 3], env)
    assert "decomposed 1 node (function custom.ops::SquarePlus x1)" in run.stdout
    x = np.random.default_rng(2).normal(size=(4, 3)).astype(np.float32)
    (got,) = run_onnxruntime(onnx.load(dst), {"x": x})
    np.testing.assert_allclose(got, (x + np.sqrt(x * x + 1.5)) / 2, rtol=1e-6, atol=1e-6)
