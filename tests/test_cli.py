"""The command line, in-process through ``main(argv) -> int``, plus one subprocess smoke test."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from decomposer import __version__
from decomposer.cli import main
from decomposer.registry import build_registry

from _helpers import make_model

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests" / "data" / "stn_custom.onnx"


@pytest.fixture
def example(tmp_path):
    target = tmp_path / "stn.onnx"
    shutil.copy(EXAMPLE, target)
    return target


def unsupported_model(tmp_path) -> Path:
    node = helper.make_node("Frobnicate", ["x"], ["y"], name="mystery", domain="acme")
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], 16,
                       extra_opsets=["acme"])
    path = tmp_path / "mystery.onnx"
    onnx.save(model, path)
    return path


def test_success_prints_one_summary_line(example, tmp_path, capsys):
    out = tmp_path / "out.onnx"
    assert main([str(example), str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == f"decomposed 1 node (AffineGrid x1) -> {out} (opset 16)"
    assert captured.err == ""
    onnx.checker.check_model(onnx.load(out), full_check=True)


def test_report_json(example, tmp_path):
    report = tmp_path / "report.json"
    assert main([str(example), str(tmp_path / "out.onnx"), "--report", str(report), "-q"]) == 0
    data = json.loads(report.read_text())
    assert data["counts"] == {"AffineGrid": 1}
    assert data["opset"] == 16
    assert data["unsupported"] == []
    assert data["replaced"][0]["domain"] == "custom.ops"
    assert data["dropped_opset_imports"] == ["custom.ops"]


def test_dry_run_writes_nothing(example, tmp_path, capsys):
    out = tmp_path / "out.onnx"
    assert main([str(example), "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("would decompose 1 node (AffineGrid x1)")
    assert main([str(example), str(out), "--dry-run"]) == 0
    assert not out.exists()


def test_in_place(example, capsys):
    assert main([str(example), str(example), "-q"]) == 0
    assert capsys.readouterr().out == ""
    model = onnx.load(example)
    assert all(n.domain == "" for n in model.graph.node)


def test_unsupported_exits_3_names_the_node_and_writes_nothing(tmp_path, capsys):
    src = unsupported_model(tmp_path)
    out = tmp_path / "out.onnx"
    report = tmp_path / "r.json"
    assert main([str(src), str(out), "--report", str(report)]) == 3
    err = capsys.readouterr().err
    assert "node 'mystery' (acme::Frobnicate)" in err
    assert "Traceback" not in err
    assert not out.exists()
    assert json.loads(report.read_text())["unsupported"][0]["name"] == "mystery"


def test_allow_unsupported_keeps_node_and_warns(tmp_path, capsys):
    src = unsupported_model(tmp_path)
    out = tmp_path / "out.onnx"
    assert main([str(src), str(out), "--allow-unsupported"]) == 0
    captured = capsys.readouterr()
    assert "warning: kept node 'mystery'" in captured.err
    assert [n.op_type for n in onnx.load(out).graph.node] == ["Frobnicate"]


@pytest.mark.parametrize("make_input, message", [
    (lambda d: d / "missing.onnx", "no such file"),
    (lambda d: d, "is a directory"),
    (lambda d: _write(d / "empty.onnx", b""), "file is empty"),
    (lambda d: _write(d / "junk.onnx", bytes(range(256)) * 4), "not an ONNX model"),
    (lambda d: _write(d / "text.onnx", b'{"graph": "not really"}'), "not an ONNX model"),
    (lambda d: _write(d / "cut.onnx", EXAMPLE.read_bytes()[:300]), "not an ONNX model"),
])
def test_bad_input_one_line_exit_2_no_output(tmp_path, capsys, make_input, message):
    out = tmp_path / "out.onnx"
    assert main([str(make_input(tmp_path)), str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_missing_output_folder_is_a_clear_error(example, tmp_path, capsys):
    assert main([str(example), str(tmp_path / "nope" / "out.onnx")]) == 5
    assert "does not exist" in capsys.readouterr().err


def test_usage_errors_exit_2(example, capsys):
    assert main([]) == 2
    assert main(["--no-such-flag"]) == 2
    before = example.read_bytes()
    assert main([str(example), "out.onnx", "--report", str(example)]) == 2
    assert "give the report its own name" in capsys.readouterr().err
    assert example.read_bytes() == before


def test_list_patterns_and_version(capsys):
    assert main(["--list-patterns"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    patterns = list(build_registry())
    assert len(lines) == len(patterns)
    for line, entry in zip(lines, patterns, strict=True):
        assert line.startswith(entry.pattern.name + " ") and "[built-in]" in line
        assert entry.pattern.summary and line.endswith(entry.pattern.summary)
    # Each line describes the op itself, not where the project first met it.
    assert "seed article" not in out.lower()
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"decomposer {__version__}"


def test_debug_shows_traceback(tmp_path, capsys):
    assert main([str(tmp_path / "missing.onnx"), str(tmp_path / "o.onnx"), "--debug"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_subprocess_smoke(example, tmp_path):
    out = tmp_path / "out.onnx"
    for command in ([sys.executable, "-m", "decomposer"],
                    [str(Path(sys.executable).parent / "decomposer")]):
        result = subprocess.run([*command, str(example), str(out)], capture_output=True,
                                text=True)
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("decomposed 1 node (AffineGrid x1)")


def _minus_one_model(dim: int) -> onnx.ModelProto:
    """A Relu whose input declares ``dim`` as its batch dim (paddle2onnx writes -1 for a
    dynamic dim; the OCR models rapidocr ships hold it)."""
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def test_a_minus_one_dim_is_a_dynamic_dim_with_a_warning(tmp_path, capsys):
    source, target = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_minus_one_model(-1), source)
    assert main([str(source), str(target), "--target", "opencv"]) == 0
    assert "declared a dim of -1" in capsys.readouterr().err
    dim = onnx.load(target).graph.input[0].type.tensor_type.shape.dim[0]
    assert not dim.HasField("dim_value") and not dim.dim_param
    # any other negative dim is still refused, in one line
    onnx.save(_minus_one_model(-2), source)
    assert main([str(source), str(tmp_path / "other.onnx")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "declares dimension -2" in err[0]
