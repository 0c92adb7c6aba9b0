"""Portability: every built-in pattern's decomposition runs on ORT, OpenVINO and TVM, and
gives torch's numbers.

In: the portability cases below (2-D/3-D AffineGrid with size fed, from Shape(x) and
constant; an AffineGrid in an If branch; the seed STN; Rot90AndScale and CustomRotScale),
plus any case another test module offers through the hook (see below).
Out: for each case and engine configuration -- ONNX Runtime CPU, OpenVINO CPU (f32) with
dynamic shapes and reshaped to static ones, TVM Relax with static and with dynamic shapes
-- the case's custom nodes are decomposed (default target: portable) and the result is run
through ``decomposer.engines.run_model`` and compared with torch eager. An engine is
skipped only when it is not importable. A static check also keeps the constructs that broke
engines (docs/portability.md) out of every decomposed case.

Hook for other patterns: a ``tests/test_<name>.py`` may define ``portability_cases()``
returning an iterable of :class:`PortabilityCase` or of mappings with the same fields
(``id``, ``model``, ``feeds``, ``expected`` and optionally ``atol``, ``skip``). ``model``
holds the custom node(s); ``feeds`` is a list of feed dicts and ``expected`` the matching
lists of output arrays from an independent oracle (torch eager, never the pattern).
``scripts/portability.py`` runs the same cases on more engines.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer
from decomposer import engines
from decomposer.graphs import all_graphs
from decomposer.portability import violations
from decomposer.testing import ir_version_for

TESTS = Path(__file__).resolve().parent
OPSET = 17
# (engine, static_shapes): what CI runs. ORT is always dynamic.
CONFIGS = [("ort", False), ("openvino", False), ("openvino", True), ("tvm", True),
           ("tvm", False)]


@dataclass
class PortabilityCase:
    """One model holding custom nodes, its feed sets, and torch's outputs for each.

    ``skip`` maps "engine" or "engine/static|dynamic" to the reason a configuration cannot
    run this case (an engine limit, stated, not a decomposition bug). ``lower`` is passed to
    ``decomposer.decompose`` (standard op types to decompose too).
    """

    id: str
    model: onnx.ModelProto
    feeds: list[dict[str, np.ndarray]]
    expected: list[list[np.ndarray]]
    atol: float = 1e-5
    skip: dict[str, str] = field(default_factory=dict)
    lower: tuple[str, ...] = ()

    @classmethod
    def coerce(cls, raw: Any) -> PortabilityCase:
        if isinstance(raw, PortabilityCase):
            return raw
        get = raw.get if isinstance(raw, Mapping) else (lambda key, default=None:
                                                       getattr(raw, key, default))
        feeds = get("feeds")
        expected = get("expected")
        if isinstance(feeds, Mapping):  # one feed set
            feeds, expected = [feeds], [expected]
        return cls(str(get("id")), get("model"), [dict(f) for f in feeds],
                   [list(e) if isinstance(e, (list, tuple)) else [e] for e in expected],
                   float(get("atol", 1e-5) or 1e-5), dict(get("skip", {}) or {}),
                   tuple(get("lower", ()) or ()))


def config_label(engine: str, static: bool) -> str:
    return f"{engine}/{'static' if static else 'dynamic'}"


# -- built-in cases ------------------------------------------------------------------------

def _model(nodes, inputs, outputs, initializers=(), domains=("custom.ops",)) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "portability", inputs, outputs,
                              initializer=list(initializers))
    imports = [helper.make_opsetid("", OPSET)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(graph, opset_imports=imports, ir_version=8,
                             producer_name="decomposer.portability")


def torch_affine_grid(theta: np.ndarray, size: Sequence[int], align: int) -> np.ndarray:
    grid = F.affine_grid(torch.from_numpy(theta.astype(np.float64)), [int(s) for s in size],
                         align_corners=bool(align))
    return grid.numpy().astype(theta.dtype)


def affine_grid_case(k: int, size_mode: str, align: int = 0,
                     sizes: Sequence[Sequence[int]] | None = None) -> PortabilityCase:
    """theta (N, k, k+1) and size fed as an input, read from Shape(x), or a constant."""
    sizes = sizes or ([(2, 3, 5, 7), (1, 1, 4, 9)] if k == 2 else
                      [(2, 1, 3, 4, 5), (1, 2, 2, 1, 3)])
    if size_mode == "constant":
        sizes = sizes[:1]
    inputs = [helper.make_tensor_value_info("theta", TensorProto.FLOAT, ["N", k, k + 1])]
    nodes, inits = [], []
    spatial = ["D", "H", "W"][3 - k:]
    if size_mode == "input":
        inputs.append(helper.make_tensor_value_info("size", TensorProto.INT64, [k + 2]))
    elif size_mode == "shape":
        inputs.append(helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                    ["N", "C", *spatial]))
        nodes.append(helper.make_node("Shape", ["x"], ["size"], name="shape_of_x"))
    else:
        inits.append(onnx.numpy_helper.from_array(np.array(sizes[0], np.int64), "size"))
    nodes.append(helper.make_node("AffineGrid", ["theta", "size"], ["grid"], name="affine",
                                  domain="custom.ops", align_corners=align))
    outputs = [helper.make_tensor_value_info("grid", TensorProto.FLOAT,
                                             ["N", *spatial, k] if size_mode != "constant"
                                             else [None] * (k + 2))]
    rng = np.random.default_rng(k * 10 + align)
    feeds, expected = [], []
    for size in sizes:
        theta = rng.uniform(-1.5, 1.5, (size[0], k, k + 1)).astype(np.float32)
        feed = {"theta": theta}
        if size_mode == "input":
            feed["size"] = np.array(size, np.int64)
        elif size_mode == "shape":
            feed["x"] = np.zeros(size, np.float32)
        feeds.append(feed)
        expected.append([torch_affine_grid(theta, size, align)])
    return PortabilityCase(f"AffineGrid {k}-D size {size_mode}" + (" align 1" if align else ""),
                           _model(nodes, inputs, outputs, inits), feeds, expected)


def affine_grid_in_if_case() -> PortabilityCase:
    """An If whose branches each hold a custom AffineGrid (align_corners 0 and 1) reading
    the outer scope's theta and size."""
    def branch(align: int) -> onnx.GraphProto:
        return helper.make_graph(
            [helper.make_node("AffineGrid", ["theta", "size"], [f"grid{align}"],
                              name=f"affine_align{align}", domain="custom.ops",
                              align_corners=align)],
            f"branch{align}", [],
            [helper.make_tensor_value_info(f"grid{align}", TensorProto.FLOAT,
                                           ["N", "H", "W", 2])])
    node = helper.make_node("If", ["cond"], ["grid"], name="choose",
                            then_branch=branch(1), else_branch=branch(0))
    inputs = [helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
              helper.make_tensor_value_info("theta", TensorProto.FLOAT, ["N", 2, 3]),
              helper.make_tensor_value_info("size", TensorProto.INT64, [4])]
    outputs = [helper.make_tensor_value_info("grid", TensorProto.FLOAT, ["N", "H", "W", 2])]
    rng = np.random.default_rng(7)
    feeds, expected = [], []
    for cond, size in [(True, (2, 1, 5, 6)), (False, (1, 1, 3, 8))]:
        theta = rng.uniform(-1, 1, (size[0], 2, 3)).astype(np.float32)
        feeds.append({"cond": np.array(cond), "theta": theta, "size": np.array(size, np.int64)})
        expected.append([torch_affine_grid(theta, size, int(cond))])
    return PortabilityCase("AffineGrid in an If branch", _model([node], inputs, outputs),
                           feeds, expected)


def seed_stn_case() -> PortabilityCase:
    """tests/data/stn_custom.onnx: Conv -> custom.ops::AffineGrid -> GridSample; oracle: the
    same torch ops with the model's own Conv weights."""
    model = onnx.load(TESTS / "data" / "stn_custom.onnx")
    weights = {t.name: torch.from_numpy(onnx.numpy_helper.to_array(t).copy())
               for t in model.graph.initializer}
    rng = np.random.default_rng(3)
    feeds, expected = [], []
    for (height, width), out_size in [((12, 10), (1, 64, 8, 6)), ((9, 9), (1, 64, 5, 11))]:
        image = rng.normal(size=(1, 3, height, width)).astype(np.float32)
        theta = rng.uniform(-1, 1, (1, 2, 3)).astype(np.float32)
        with torch.no_grad():
            features = F.conv2d(torch.from_numpy(image), weights["conv.weight"],
                                weights["conv.bias"])
            grid = F.affine_grid(torch.from_numpy(theta), list(out_size), align_corners=False)
            out = F.grid_sample(features, grid, mode="bilinear", padding_mode="zeros",
                                align_corners=False)
        feeds.append({"image": image, "theta": theta, "size": np.array(out_size, np.int64)})
        expected.append([out.numpy()])
    return PortabilityCase("seed STN (stn_custom.onnx)", model, feeds, expected, atol=1e-4)


def seed_stn_lowered_case() -> PortabilityCase:
    """The seed STN with its standard GridSample-16 decomposed too (``lower``), for engines
    without GridSample (onnx2torch)."""
    case = seed_stn_case()
    return PortabilityCase("seed STN, lower GridSample", case.model, case.feeds,
                           case.expected, atol=case.atol, lower=("GridSample",))


def torch_rot_scale(x: np.ndarray, k: int, dims: Sequence[int], scale: float) -> np.ndarray:
    return (torch.rot90(torch.from_numpy(x), k, list(dims)) * scale).numpy()


def rotation_case(op_type: str, attrs: dict[str, Any], k: int, dims: Sequence[int],
                  scale: float) -> PortabilityCase:
    node = helper.make_node(op_type, ["x"], ["y"], name="rot", domain="custom.ops", **attrs)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "C", "H", "W"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None] * 4)]
    rng = np.random.default_rng(k % 4)
    feeds, expected = [], []
    for shape in [(2, 3, 5, 7), (1, 2, 6, 4)]:
        x = rng.normal(size=shape).astype(np.float32)
        feeds.append({"x": x})
        expected.append([torch_rot_scale(x, k, dims, scale)])
    label = ", ".join(f"{key}={value}" for key, value in attrs.items())
    return PortabilityCase(f"{op_type}({label})", _model([node], inputs, outputs), feeds,
                           expected, atol=1e-6)


def builtin_cases() -> list[PortabilityCase]:
    cases = [affine_grid_case(k, mode) for k in (2, 3) for mode in ("input", "shape",
                                                                     "constant")]
    cases.append(affine_grid_case(2, "input", align=1))
    # The classic STN's F.affine_grid(theta, x.size(), align_corners=True): TVM's importer
    # once refused its Max of a size read from Shape(x).
    cases.append(affine_grid_case(2, "shape", align=1))
    cases.append(affine_grid_in_if_case())
    cases.append(seed_stn_case())
    cases.append(seed_stn_lowered_case())
    for k in (1, 2, 3):
        cases.append(rotation_case("Rot90AndScale", {"k": k, "scale": 1.5}, k, (-2, -1), 1.5))
    cases.append(rotation_case("CustomRotScale", {"rotations": 1, "scale_factor": 0.5,
                                                  "dims": "width,height"}, 1, (-1, -2), 0.5))
    return cases


# -- the hook --------------------------------------------------------------------------------

def hooked_cases(tests_dir: Path = TESTS) -> list[PortabilityCase]:
    """Cases offered by ``portability_cases()`` in other ``tests/test_*.py`` modules."""
    found: list[PortabilityCase] = []
    if str(tests_dir) not in sys.path:
        sys.path.insert(0, str(tests_dir))
    for path in sorted(tests_dir.glob("test_*.py")):
        if path.stem == Path(__file__).stem or \
                "def portability_cases(" not in path.read_text(encoding="utf-8"):
            continue
        module = importlib.import_module(path.stem)
        raw: Iterable[Any] = module.portability_cases()
        found.extend(PortabilityCase.coerce(item) for item in raw)
    return found


@functools.cache
def all_cases() -> tuple[PortabilityCase, ...]:
    return tuple(builtin_cases() + hooked_cases())


def _pattern_key(case: PortabilityCase) -> tuple:
    """What a case exercises: the patterns of its custom nodes, at any depth, and the
    standard ops it lowers."""
    registry = decomposer.default_registry()
    names = set()
    for graph in all_graphs(case.model.graph):
        for node in graph.node:
            if node.domain not in ("", "ai.onnx"):
                found = registry.lookup(node)
                names.add(found[0].name if found else f"{node.domain}::{node.op_type}")
    return (tuple(sorted(names)), tuple(sorted(case.lower or ())))


@functools.cache
def representative_ids() -> frozenset[str]:
    """The first case of each pattern (set): the one whose TVM runs and opset ends are in
    the default run (TVM compiles are most of this file's time); the others' are
    exhaustive."""
    first: dict[tuple, str] = {}
    for case in all_cases():
        first.setdefault(_pattern_key(case), case.id)
    return frozenset(first.values())


def _sampled(case_id: str, engine: str, static: bool, *values: Any, id: str,
             opset_end: bool = False) -> Any:
    """A pytest param of (case_id, *values). The default run keeps TVM (static) for each
    pattern's representative case, and its opset ends on OpenVINO; TVM's dynamic runs, TVM
    at the opset ends and every other case's TVM and opset-end runs are marked exhaustive
    (``.ci/run`` runs them)."""
    representative = case_id in representative_ids()
    sampled_out = (not representative and (engine == "tvm" or opset_end)) or \
        (engine == "tvm" and (not static or opset_end))
    return pytest.param(case_id, *values, marks=[pytest.mark.exhaustive] if sampled_out
                        else [], id=id)


@functools.cache
def decomposed(case_id: str) -> onnx.ModelProto:
    case = next(c for c in all_cases() if c.id == case_id)
    out = decomposer.decompose(case.model, lower=case.lower)
    onnx.checker.check_model(out, full_check=True)
    return out


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

def run_case(case: PortabilityCase, model: onnx.ModelProto, engine: str, static: bool,
             feed_sets: int | None = None) -> float:
    """Run the first ``feed_sets`` feed sets (all by default); assert shapes and values
    against torch; return the worst abs error."""
    worst = 0.0
    pairs = list(zip(case.feeds, case.expected, strict=True))[:feed_sets]
    for index, (feeds, expected) in enumerate(pairs):
        got = engines.run_model(engine, model, feeds, static_shapes=static)
        assert len(got) == len(expected), f"{case.id}: {len(got)} outputs, torch has " \
                                          f"{len(expected)}"
        for actual, wanted in zip(got, expected, strict=True):
            assert actual.shape == wanted.shape, \
                f"{case.id} feed set {index}: shape {actual.shape} != torch {wanted.shape}"
            error = float(np.max(np.abs(actual.astype(np.float64) - wanted.astype(np.float64)),
                                 initial=0.0))
            worst = max(worst, error)
            assert error <= case.atol, \
                f"{case.id} feed set {index}: max abs error {error:.3g} > {case.atol}"
    return worst


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


NEWEST_OPSET = onnx.defs.onnx_opset_version()
# Opset spellings (builder.py) change between 11 and the newest opset: the cases whose
# models hold only custom nodes run again at both ends, on OpenVINO and static TVM.
OPSET_CONFIGS = [(opset, engine, static) for opset in (11, NEWEST_OPSET)
                 for engine, static in (("openvino", False), ("tvm", True))]


def at_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto | None:
    """``model`` importing the default domain at ``opset``; None when it holds standard
    nodes, whose own spelling may not exist at that opset."""
    if any(node.domain in ("", "ai.onnx") for node in model.graph.node):
        return None
    moved = onnx.ModelProto()
    moved.CopyFrom(model)
    for entry in moved.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = opset
    moved.ir_version = max(moved.ir_version, ir_version_for(opset))
    return moved


@pytest.mark.parametrize("case_id, opset, engine, static", [
    _sampled(c.id, engine, static, opset, engine, static, opset_end=True,
             id=f"{c.id}-opset{opset}-{config_label(engine, static)}")
    for c in all_cases() if at_opset(c.model, OPSET) is not None
    for opset, engine, static in OPSET_CONFIGS])
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
