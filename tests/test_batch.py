"""Many models in one run (``decomposer IN... -o OUT_DIR``, ``decomposer check``,
``decomposer.decompose_many`` / ``decomposer.check``): mixed folders, a worker that dies,
an unwritable output folder, ``-j 1`` against ``-j 2``, Ctrl-C, the engine gaps the check
names, and the pre-commit hook's entry run as pre-commit runs it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import decomposer
from decomposer.cli import main

from _helpers import make_model, run_onnxruntime

ROOT = Path(__file__).resolve().parent.parent
STN = ROOT / "tests" / "data" / "stn_custom.onnx"


def _unsupported(path: Path) -> None:
    node = helper.make_node("Mystery", ["x"], ["y"], name="mystery", domain="acme")
    onnx.save(make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], 17,
                         extra_opsets=["acme"]), path)


def _external(path: Path) -> None:
    """The seed STN with its initializers moved to an external data file."""
    model = onnx.load(STN)
    onnx.save(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
              location=path.name + ".weights", size_threshold=0)


def _mixed(folder: Path) -> Path:
    (folder / "sub").mkdir(parents=True)
    shutil.copy(STN, folder / "good.onnx")
    shutil.copy(STN, folder / "sub" / "good2.onnx")
    _unsupported(folder / "sub" / "unsupported.onnx")
    (folder / "corrupt.onnx").write_bytes(b"not a model")
    (folder / "ext").mkdir()
    _external(folder / "ext" / "weights.onnx")
    (folder / "notes.txt").write_text("not a model: not collected")
    return folder


def _stn_feeds() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"image": rng.standard_normal((1, 3, 8, 10)).astype(np.float32),
            "theta": rng.standard_normal((1, 2, 3)).astype(np.float32),
            "size": np.array([1, 3, 8, 10], np.int64)}


def test_mixed_folder(tmp_path, capsys):
    source = _mixed(tmp_path / "models")
    out = tmp_path / "out"
    code = main([str(source), "-o", str(out), "-j", "2", "--report",
                 str(tmp_path / "report.json")])
    assert code == 3  # the worst: an unsupported node (corrupt is 2)
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert [w for w in written if w.endswith(".onnx")] == [
        "ext/weights.onnx", "good.onnx", "sub/good2.onnx"]
    assert any(w.startswith("ext/weights.onnx.") and w.endswith(".data") for w in written)
    assert not any(Path(w).name.startswith(".") for w in written)  # no temp files
    lines = capsys.readouterr()
    assert "5 models: 3 ok, 1 unsupported, 1 invalid" in lines.out
    assert "corrupt.onnx: invalid" in lines.err and "unsupported.onnx: unsupported" in lines.err
    data = json.loads((tmp_path / "report.json").read_text())  # every model, the totals
    assert data["totals"]["models"] == 5 and data["totals"]["exit_code"] == 3
    assert [(Path(m["input"]).name, m["status"]) for m in data["models"]] == [
        ("corrupt.onnx", "invalid"), ("weights.onnx", "ok"), ("good.onnx", "ok"),
        ("good2.onnx", "ok"), ("unsupported.onnx", "unsupported")]
    # the external-data output runs and equals the plain one
    feeds = _stn_feeds()
    plain = run_onnxruntime(onnx.load(out / "good.onnx"), feeds)
    external = run_onnxruntime(onnx.load(out / "ext" / "weights.onnx"), feeds)
    for a, b in zip(plain, external, strict=True):
        np.testing.assert_array_equal(a, b)


def test_jobs_do_not_change_the_bytes(tmp_path):
    source = tmp_path / "models"
    source.mkdir()
    for i in range(4):
        shutil.copy(STN, source / f"m{i}.onnx")
    results = {}
    for jobs in (1, 2):
        out = tmp_path / f"out{jobs}"
        assert main([str(source), "-o", str(out), "-j", str(jobs), "-q"]) == 0
        results[jobs] = {p.name: p.read_bytes() for p in sorted(out.glob("*.onnx"))}
    assert results[1] == results[2] and len(results[1]) == 4


def test_unwritable_output_folder_writes_nothing(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the output folder should go")
    code = main([str(STN), "-o", str(blocker / "out")])
    assert code == 5
    assert "cannot create the output folder" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [blocker]


def test_two_inputs_landing_on_one_output_are_refused(tmp_path):
    (tmp_path / "a").mkdir()
    shutil.copy(STN, tmp_path / "a" / "stn_custom.onnx")
    with pytest.raises(decomposer.ModelIOError, match="would be written to"):
        decomposer.decompose_many([STN, tmp_path / "a" / "stn_custom.onnx"], tmp_path / "out")


CRASHER = '''
import os
import decomposer
from decomposer.forms import Form, In


class Crash(decomposer.Pattern):
    op_type = "Crash"
    forms = (Form("Crash", domains=frozenset({"test.crash"}), inputs=(In("x"),)),)

    def check(self, node, ctx):
        os._exit(9)  # the worker process dies


decomposer.register(Crash())
'''


def test_a_worker_that_dies_fails_only_its_model(tmp_path):
    source = tmp_path / "models"
    source.mkdir()
    for i in range(3):
        shutil.copy(STN, source / f"good{i}.onnx")
    node = helper.make_node("Crash", ["x"], ["y"], domain="test.crash")
    onnx.save(make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                         [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])], 17,
                         extra_opsets=["test.crash"]), source / "crash.onnx")
    plugin = tmp_path / "crasher.py"
    plugin.write_text(CRASHER)
    report = decomposer.decompose_many([source], tmp_path / "out", jobs=2,
                                       pattern_sources=[str(plugin)])
    status = {Path(m.input).name: m.status for m in report.models}
    assert status == {"crash.onnx": "internal", "good0.onnx": "ok", "good1.onnx": "ok",
                      "good2.onnx": "ok"}
    assert report.exit_code == 4
    assert sorted(p.name for p in (tmp_path / "out").glob("*.onnx")) == [
        "good0.onnx", "good1.onnx", "good2.onnx"]


GATE = """
import os
import time

from decomposer.patterns.affine_grid import AffineGrid


class GatedAffineGrid(AffineGrid):
    # The built-in AffineGrid, except that only the first node of the whole run passes at
    # once: every later one waits for the test to open the gate (after its Ctrl-C).

    def check(self, node, ctx):
        try:
            os.close(os.open(os.environ["GATE_TOKEN"], os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            while not os.path.exists(os.environ["GATE_OPEN"]):
                time.sleep(0.02)
        return super().check(node, ctx)


PATTERNS = [GatedAffineGrid()]
"""


def test_ctrl_c_leaves_no_partial_files(tmp_path):
    # Deterministic: a gate pattern lets exactly one model through, so one file is written
    # and both workers hold others when the signal arrives, whatever the machine's speed (a
    # plain batch of 60 could finish before the signal was sent). Workers ignore Ctrl-C and
    # finish the model in hand, so the gate opens once the signal is sent.
    source = tmp_path / "models"
    source.mkdir()
    for i in range(12):
        shutil.copy(STN, source / f"m{i:02d}.onnx")
    gate = tmp_path / "gate.py"
    gate.write_text(GATE)
    out = tmp_path / "out"
    process = subprocess.Popen([sys.executable, "-m", "decomposer", str(source), "-o", str(out),
                                "-j", "2", "--patterns", str(gate), "--override"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                               start_new_session=True,
                               env={**os.environ, "GATE_TOKEN": str(tmp_path / "token"),
                                    "GATE_OPEN": str(tmp_path / "open")})
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (out.exists() and any(out.glob("*.onnx"))) \
                and process.poll() is None:
            time.sleep(0.02)
        assert process.poll() is None, process.communicate()  # still gated, not finished
        os.killpg(process.pid, signal.SIGINT)  # what Ctrl-C sends: the whole process group
        (tmp_path / "open").touch()
        process.communicate(timeout=60)
    finally:  # a failed assertion leaves no gated workers behind
        (tmp_path / "open").touch()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode != 0
    written = sorted(p.name for p in out.iterdir())
    # the first model and those already handed to the pool (the workers' two and the few
    # it queues ahead), not the rest; no temp files
    assert 1 <= len(written) < 12 and all(name.endswith(".onnx") for name in written)
    for name in written:
        onnx.checker.check_model(onnx.load(out / name))  # every file there is complete


def _stderr_of_batch_run(tmp_path: Path, tty: bool, *flags: str) -> str:
    """Run ``decomposer DIR -o OUT`` with stderr on a pseudo-terminal (tty) or a pipe."""
    import fcntl
    import pty
    import struct
    import termios

    source = tmp_path / "models"
    source.mkdir(exist_ok=True)
    for i in range(3):
        shutil.copy(STN, source / f"m{i}.onnx")
    out = tmp_path / ("out-tty" if tty else "out-pipe") / "-".join(flags or ("plain",))
    command = [sys.executable, "-m", "decomposer", str(source), "-o", str(out), "-j", "1",
               *flags]
    if not tty:
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stderr
    primary, secondary = pty.openpty()
    # A new pseudo-terminal is 0 columns wide, and tqdm draws nothing in 0 columns.
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=secondary,
                                   cwd=ROOT)
        os.close(secondary)
        chunks = []
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # the terminal closed: the process is gone
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert process.wait(timeout=120) == 0
    finally:
        os.close(primary)
    return b"".join(chunks).decode(errors="replace")


def test_progress_bar_on_a_terminal_only(tmp_path):
    on_terminal = _stderr_of_batch_run(tmp_path, True)
    assert "decomposing" in on_terminal and "/3 [" in on_terminal  # tqdm's bar, 3 models
    assert _stderr_of_batch_run(tmp_path, True, "-q") == ""  # -q: silent on a terminal too
    assert "decomposing" not in _stderr_of_batch_run(tmp_path, False)  # piped: no bar


def _native_stn() -> onnx.ModelProto:
    """The seed STN at opset 20 with ONNX's own AffineGrid (size fed at run time) instead
    of the article's custom node: Conv -> AffineGrid-20 -> GridSample."""
    model = onnx.load(STN)
    for node in model.graph.node:
        if node.op_type == "AffineGrid":
            node.domain = ""
    imports = [op for op in model.opset_import if op.domain in ("", "ai.onnx")]
    del model.opset_import[:]
    model.opset_import.extend(imports)
    model.opset_import[0].version = 20
    model.ir_version = max(model.ir_version, 9)
    onnx.checker.check_model(model, full_check=True)
    return model


def _deform_conv_19() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(rng.standard_normal((4, 2, 3, 3)).astype(
        np.float32), "w")
    node = helper.make_node("DeformConv", ["x", "w", "offset"], ["y"], kernel_shape=[3, 3],
                            pads=[1, 1, 1, 1])
    return make_model([node], [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 5, 5]),
        helper.make_tensor_value_info("offset", TensorProto.FLOAT, ["N", 18, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 5, 5])], 19,
        initializers=[weight])


def test_check_names_each_engines_gap_and_its_fix(tmp_path, capsys):
    onnx.save(_native_stn(), tmp_path / "stn20.onnx")
    onnx.save(_deform_conv_19(), tmp_path / "dcn19.onnx")
    report = decomposer.check([tmp_path], engines=["tvm", "onnx2torch", "openvino", "ort"])
    by_name = {Path(m.input).name: m for m in report.models}
    stn, dcn = by_name["stn20.onnx"], by_name["dcn19.onnx"]
    assert stn.status == "needs-engine-work" and report.exit_code == 0
    assert {(g["op"], g["lower"]) for g in stn.engines["tvm"]} == {("AffineGrid", "AffineGrid")}
    assert ("GridSample", "GridSample") in {(g["op"], g["lower"])
                                            for g in stn.engines["onnx2torch"]}
    assert stn.engines["openvino"] == [] and stn.engines["ort"] == []
    assert {(g["op"], g["lower"]) for g in dcn.engines["openvino"]} == {
        ("DeformConv", "DeformConv")}
    # the CLI says the same, writes nothing, and --strict-engines turns it into exit 3
    assert main(["check", str(tmp_path), "--engines", "tvm,onnx2torch,openvino"]) == 0
    out = capsys.readouterr().out
    # an engine with a profile is fixed by its --target (which applies the --lower)
    assert "tvm: AffineGrid x1: --target tvm (or --lower AffineGrid)" in out
    assert "onnx2torch: GridSample x1: --target onnx2torch (or --lower GridSample)" in out
    assert "openvino: DeformConv x1: --target openvino (or --lower DeformConv)" in out
    assert main(["check", str(tmp_path), "--engines", "tvm", "--strict-engines"]) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dcn19.onnx", "stn20.onnx"]
    # after the fix no AffineGrid is left for TVM; what remains at the model's dynamic batch
    # (the lowering's Reshape to a computed shape) asks for static sizes, which fold it
    left = decomposer.check([tmp_path / "stn20.onnx"], engines=["tvm"],
                            lower=["AffineGrid"]).models[0].engines["tvm"]
    assert all(g["op"] != "AffineGrid" and g["shape"] for g in left), left


def test_check_exit_codes(tmp_path, capsys):
    _unsupported(tmp_path / "plugin.onnx")
    assert main(["check", str(tmp_path / "plugin.onnx")]) == 3
    assert "needs a plugin: node 'mystery' (acme::Mystery)" in capsys.readouterr().out
    assert main(["check", str(STN)]) == 0
    assert main(["check", str(tmp_path / "missing.onnx")]) == 5
    assert main(["check", str(STN), "--engines", "tensorflow"]) == 2


def test_pre_commit_hook_entry(tmp_path):
    """.pre-commit-hooks.yaml's decomposer-check, run as pre-commit runs a python hook: its
    entry with the staged .onnx files appended (pre-commit itself needs network access to
    build the hook's environment, so the entry is run directly)."""
    text = (ROOT / ".pre-commit-hooks.yaml").read_text()
    assert "id: decomposer-check" in text
    entry = next(line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.strip().startswith("entry:"))
    assert entry == "decomposer check"
    script = shutil.which("decomposer", path=str(Path(sys.executable).parent))
    assert script is not None, "the decomposer console script is not installed"
    _unsupported(tmp_path / "plugin.onnx")
    ok = subprocess.run([script, "check", str(STN)], capture_output=True, text=True)
    bad = subprocess.run([script, "check", str(STN), str(tmp_path / "plugin.onnx")],
                         capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert bad.returncode == 3 and "needs a plugin" in bad.stdout
