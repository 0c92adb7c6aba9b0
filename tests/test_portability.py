"""Portability: every built-in pattern's decomposition runs on ORT, OpenVINO and TVM, and
gives torch's numbers.

In: the case catalogue of ``scripts/portability_cases.py`` (the built-in cases and those
each pattern's test module offers through its ``portability_cases()`` hook).
Out: for each case and engine configuration -- ONNX Runtime CPU, OpenVINO CPU (f32) with
dynamic shapes and reshaped to static ones, TVM Relax with static and with dynamic shapes
-- the case's custom nodes are decomposed (default target: portable) and the result is run
through ``decomposer.engines.run_model`` and compared with torch eager; again at the opset
ends. An engine is skipped only when it is not importable. Every decomposed case must also
pass ``decomposer.portability.violations`` (the checked portability rules).
"""

from __future__ import annotations

import sys
import zlib
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from portability_cases import (
    CONFIGS,
    NEWEST_OPSET,
    OPSET,
    affine_grid_case,
    all_cases,
    at_opset,
    config_label,
    decomposed,
    hooked_cases,
    representative_ids,
    rotation_case,
    run_case,
)

import decomposer
from decomposer import engines
from decomposer.portability import violations


def _sampled(case_id: str, engine: str, static: bool, *values: Any, id: str,
             opset_end: bool = False) -> Any:
    """A pytest param of (case_id, *values). The default run keeps each pattern's
    representative case on OpenVINO at its opset ends, and on TVM (static) for a third of
    those cases, fixed by the case id's CRC (TVM compiles for 1-5 s a cell); TVM's dynamic
    runs, TVM at the opset ends, the other representative cases' TVM runs and every other
    case's TVM and opset-end runs are marked exhaustive (``.ci/run`` runs them)."""
    representative = case_id in representative_ids()
    tvm_sample = zlib.crc32(case_id.encode()) % 3 == 0
    sampled_out = (not representative and (engine == "tvm" or opset_end)) or \
        (engine == "tvm" and (not static or opset_end or not tvm_sample))
    return pytest.param(case_id, *values, marks=[pytest.mark.exhaustive] if sampled_out
                        else [], id=id)


# -- static checks on the portable output ------------------------------------------------------

@pytest.mark.parametrize("case_id", [c.id for c in all_cases()])
def test_decomposed_output_avoids_non_portable_constructs(case_id):
    out = decomposed(case_id)
    assert not [n for n in out.graph.node if n.domain not in ("", "ai.onnx")]
    assert violations(out) == []


def test_the_static_check_can_fail():
    """The checker flags what the ort target emits on purpose (Conv with a run-time weight,
    a fold barrier, a double step -1 Slice)."""
    affine = decomposer.decompose(affine_grid_case(2, "constant").model, target="ort")
    rotation = decomposer.decompose(rotation_case("Rot90AndScale", {"k": 2}, 2, (-2, -1),
                                                  1.0).model, target="ort")
    found = " ".join(violations(affine) + violations(rotation))
    assert "computed at run time" in found
    assert "empty slice" in found
    assert "negative or unknown steps" in found
    chunk = helper.make_graph(
        [helper.make_node("Slice", ["x", "zero", "two", "one"], ["piece"]),
         helper.make_node("GatherElements", ["piece", "i"], ["y"], axis=1)], "chunk",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3]),
         helper.make_tensor_value_info("i", TensorProto.INT64, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [onnx.numpy_helper.from_array(np.array([v], np.int64), name)
         for name, v in [("zero", 0), ("two", 2), ("one", 0)]])
    assert "reads a Slice that starts at 0" in " ".join(
        violations(helper.make_model(chunk)))


# -- engines -------------------------------------------------------------------------------


@pytest.mark.parametrize("case_id, engine, static", [
    _sampled(c.id, engine, static, engine, static,
             id=f"{c.id}-{config_label(engine, static)}")
    for c in all_cases() for engine, static in CONFIGS])
def test_runs_on_engine_like_torch(case_id, engine, static):
    pytest.importorskip(engines.ENGINES[engine].module)
    case = next(c for c in all_cases() if c.id == case_id)
    reason = case.skip.get(config_label(engine, static)) or case.skip.get(engine)
    if reason:
        pytest.skip(reason)
    # TVM compiles once per input shape when static (about a second each): one feed set
    # there keeps this file fast; its dynamic configuration runs them all on one compile.
    run_case(case, decomposed(case_id), engine, static,
             feed_sets=1 if (engine, static) == ("tvm", True) else None)


# Opset spellings (builder.py) change between 11 and the newest opset: the cases whose
# models hold only custom nodes run again at both ends, on OpenVINO and static TVM.
# A case whose patterns accept fewer opsets (``opsets``) runs at the ends of its range.
OPSET_CONFIGS = [(end, engine, static) for end in (0, 1)
                 for engine, static in (("openvino", False), ("tvm", True))]


def _opset_end(case, end: int) -> int:
    low, high = case.opsets
    return max(11, low) if end == 0 else min(NEWEST_OPSET, high)


@pytest.mark.parametrize("case_id, opset, engine, static", [
    _sampled(c.id, engine, static, _opset_end(c, end), engine, static, opset_end=True,
             id=f"{c.id}-opset{_opset_end(c, end)}-{config_label(engine, static)}")
    for c in all_cases() if at_opset(c.model, OPSET) is not None
    for end, engine, static in OPSET_CONFIGS])
def test_runs_on_engine_at_the_opset_ends(case_id, opset, engine, static):
    pytest.importorskip(engines.ENGINES[engine].module)
    case = next(c for c in all_cases() if c.id == case_id)
    model = at_opset(case.model, opset)
    assert model is not None
    reason = case.skip.get(config_label(engine, static)) or case.skip.get(engine)
    if reason:
        pytest.skip(reason)
    out = decomposer.decompose(model, lower=case.lower)
    assert out.opset_import[0].version == opset
    run_case(case, out, engine, static, feed_sets=1)


def test_engine_failure_is_reported_with_the_engine_named():
    """The undecomposed model fails on ORT (no kernel): EngineRunError, first line only."""
    case = affine_grid_case(2, "input")
    with pytest.raises(decomposer.errors.EngineRunError) as info:
        engines.run_model("ort", case.model, case.feeds[0])
    assert info.value.engine == "ort"
    assert "AffineGrid" in str(info.value) and "\n" not in str(info.value)


# -- decomposer.engines itself ---------------------------------------------------------------

def test_unknown_engine_lists_the_accepted_names():
    assert not engines.available("tensorrt")
    with pytest.raises(decomposer.errors.EngineUnavailableError) as info:
        engines.require("tensorrt")
    assert "ort, openvino, tvm" in str(info.value)


def test_missing_engine_names_its_pip_package(monkeypatch):
    monkeypatch.setitem(engines.ENGINES, "ghost",
                        engines.EngineSpec("no_such_module_xyz", "ghost-engine", "Ghost"))
    assert not engines.available("ghost")
    with pytest.raises(decomposer.errors.EngineUnavailableError, match="pip install "
                                                                       "ghost-engine"):
        engines.run_model("ghost", onnx.ModelProto(), {})


def test_first_error_line_skips_source_locations():
    text = ("Exception from src/inference/src/cpp/core.cpp:117:\n"
            "Check 'newNode' failed at src/plugins/intel_cpu/src/node.cpp:1626:\n"
            "Unsupported operation of type: Convolution name: grid\n"
            "Details:\n"
            "Exception from src/plugins/intel_cpu/src/nodes/conv.cpp:195:\n"
            "Not Implemented:\n"
            "Doesn't support dynamic weights shape\n")
    assert engines.first_error_line(text) == (
        "Unsupported operation of type: Convolution name: grid -- "
        "Doesn't support dynamic weights shape")
    assert engines.first_error_line("Traceback (most recent call last):\n"
                                    '  File "x.py", line 3, in <module>\n'
                                    "ValueError: bad\n") == "ValueError: bad"


def test_importing_decomposer_imports_no_engine():
    import subprocess

    code = ("import sys, decomposer, decomposer.engines; "
            "print(sorted(m for m in ('openvino', 'tvm', 'torch') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("engine", list(engines.ENGINES))
def test_engine_version_is_reported(engine):
    pytest.importorskip(engines.ENGINES[engine].module)
    assert engines.engine_version(engine)[0].isdigit()


def test_hook_collects_cases_from_other_test_modules(tmp_path):
    (tmp_path / "test_fake_op.py").write_text(
        "import numpy as np, onnx\n"
        "def portability_cases():\n"
        "    return [{'id': 'fake', 'model': onnx.ModelProto(),\n"
        "             'feeds': {'x': np.zeros(2, np.float32)},\n"
        "             'expected': np.ones(2, np.float32), 'atol': 0.5,\n"
        "             'skip': {'tvm/dynamic': 'reason'}}]\n")
    (tmp_path / "test_other.py").write_text("def test_nothing():\n    pass\n")
    (case,) = hooked_cases(tmp_path)
    assert case.id == "fake" and case.atol == 0.5 and case.skip == {"tvm/dynamic": "reason"}
    assert len(case.feeds) == 1 and case.expected[0][0].tolist() == [1.0, 1.0]
