"""decomposer/data/engine_support.json's rows for the edge engines the test extra installs
(OpenCV DNN, ncnn via pnnx, MNN, tract), measured again on the engines themselves: the
probe of each row (scripts/engine_probes.py) fails there or gives other numbers than ONNX
Runtime, and the row's fix (its ``--lower``, ``take_down`` opset or folding) makes it
exact; a probe with no row runs exact. RKNN needs its own environment (its pins): its rows
are measured by scripts/engine_matrix.py. The default run samples the rows; the full set
is ``exhaustive``."""

from __future__ import annotations

import importlib.util

import pytest

import decomposer
from decomposer import engine_support

CI_ENGINES = ("opencv", "ncnn", "mnn", "tract")
_MODULES = {"opencv": "cv2", "ncnn": "pnnx", "mnn": "MNN", "tract": "tract"}
# a few rows per engine in the default run (the silent wrong results first)
SAMPLED = {("ncnn", "Resize", "antialias"), ("mnn", "Resize", "antialias"),
           ("mnn", "ScatterElements", "reduction"), ("mnn", "IsNaN", None),
           ("mnn", "Attention", None), ("tract", "AffineGrid", None),
           ("opencv", "STFT", None), ("ncnn", "DFT", None)}


def _installed(engine: str) -> bool:
    return importlib.util.find_spec(_MODULES[engine]) is not None


def _probes(op, when):
    """Every probe of a row: one condition can have several spellings (antialiased Resize
    by scales, and by sizes with exclude_outside as torch's exporter writes it)."""
    from engine_probes import PROBES

    return [p for p in PROBES if (p.op, p.when) == (op, when)]


def _cell(engine, model, feeds, want):
    from pathlib import Path

    from engine_matrix import cell

    return cell(engine, model, feeds, want, Path("/nonexistent"))


def _rows(sampled: bool):
    rows = [e for e in engine_support.gaps() if e["engine"] in CI_ENGINES]
    chosen = [e for e in rows if (e["engine"], e["op"], e.get("when")) in SAMPLED]
    return [pytest.param(e, id=f"{e['engine']}-{e['op']}") for e in
            (chosen if sampled else rows)]


def _fixed(entry, model, feeds, **more):
    """The model with the row's fix: its --lower, its take-down opset, or its shape
    arithmetic folded at the probe's sizes (the feeds': --overwrite-input-shape)."""
    static = {v.name: list(feeds[v.name].shape) for v in model.graph.input if v.name in feeds}
    return decomposer.decompose(
        model, lower=[entry["lower"]] if entry.get("lower") else (),
        target_opset=entry.get("take_down"),
        input_shapes=static if entry.get("fold") or entry.get("static") else None, **more)


def _check(entry):
    """The row's engine fails (or, for a "wrong" row, miscomputes) at least one spelling of
    the row's condition, and the row's fix and the engine's ``--target`` make every
    spelling exact."""
    if not _installed(entry["engine"]):
        pytest.skip(f"{entry['engine']} is not installed (the test extra installs it)")
    from decomposer.engines import run_model

    befores = []
    for probe in _probes(entry["op"], entry.get("when")):
        model, feeds = probe.build()
        want = run_model("ort", model, feeds)
        befores.append(_cell(entry["engine"], model, feeds, want))
        if entry.get("lower") or entry.get("take_down") or entry.get("fold"):
            after = _cell(entry["engine"], _fixed(entry, model, feeds), feeds, want)
            assert after["status"] == "ok", (probe.label, after)
            # the engine's --target, with the sizes check asks for where the fix needs them
            shapes = {name: list(feeds[name].shape) for gap in engine_support.engine_gaps(
                model, [entry["engine"]])[entry["engine"]] for name in gap.get("shape", ())}
            targeted = decomposer.decompose(model, target=entry["engine"],
                                            input_shapes=shapes or None)
            assert _cell(entry["engine"], targeted, feeds, want)["status"] == "ok", \
                probe.label
    failing = [b for b in befores if b["status"] != "ok"]
    assert failing, f"the engine runs every spelling now: {befores}"
    if entry.get("kind") == "wrong":
        assert any(b["status"] == "wrong" for b in failing), befores


@pytest.mark.parametrize("entry", _rows(sampled=True))
def test_sampled_row_is_measured_again(entry):
    _check(entry)


@pytest.mark.exhaustive
@pytest.mark.parametrize("entry", _rows(sampled=False))
def test_row_is_measured_again(entry):
    _check(entry)


@pytest.mark.exhaustive
@pytest.mark.parametrize("engine", CI_ENGINES)
def test_probes_without_a_row_run_exact(engine):
    from engine_probes import PROBES

    from decomposer.engines import run_model

    if not _installed(engine):
        pytest.skip(f"{engine} is not installed")
    for probe in PROBES:
        model, feeds = probe.build()
        if engine_support.engine_gaps(model, [engine])[engine]:
            continue  # a row holds for it (check --engines names it)
        result = _cell(engine, model, feeds, run_model("ort", model, feeds))
        assert result["status"] == "ok", (probe.label, result)


def test_edge_runner_refuses_pip_for_mnn(tmp_path):
    """MNN's tools install a telemetry SDK with the first pip on PATH (it would take
    protobuf below what onnx needs): the runner puts a refusing pip first."""
    import subprocess

    from edge_runner import _refusing_pip

    folder = _refusing_pip(str(tmp_path))
    run = subprocess.run([f"{folder}/pip", "install", "anything"], capture_output=True,
                         text=True)
    assert run.returncode == 1 and "refused" in run.stderr
