"""The portability case catalogue: models holding custom nodes, their feeds, and torch's
outputs for each, for every built-in pattern.

In: nothing. Out: :func:`all_cases`: the built-in cases below (2-D/3-D AffineGrid with size
fed, from Shape(x) and constant, align 0 and 1; an AffineGrid in an If branch; the seed
STN, plain and with GridSample lowered; Rot90AndScale and CustomRotScale), plus those each
pattern's test module offers through its ``portability_cases()`` hook, which keeps a
pattern's cases beside its tests: a ``tests/test_<name>.py`` may define it, returning
:class:`PortabilityCase` objects or mappings with the same fields (``id``, ``model``,
``feeds``, ``expected`` and optionally ``atol``, ``skip``, ``lower``). ``model`` holds the
custom node(s); ``feeds`` is a list of feed dicts and ``expected`` the matching lists of
output arrays from an independent oracle (torch eager, never the pattern). Also
:func:`run_case` (one case on one engine configuration, checked against torch),
:func:`representative_ids` (the first case of each pattern) and :func:`at_opset`.

Used by ``tests/test_portability.py`` (ONNX Runtime, OpenVINO and TVM in CI) and by
``scripts/portability.py`` (every engine installed, the converters too). Needs torch.
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
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import decomposer
from decomposer import engines
from decomposer.graphs import all_graphs
from decomposer.testing import ir_version_for

TESTS = Path(__file__).resolve().parent.parent / "tests"


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
    # The default-domain opsets its patterns accept (the opset-ends test clamps to them).
    opsets: tuple[int, int] = (11, 10**6)

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
                   tuple(get("lower", ()) or ()), tuple(get("opsets", (11, 10**6))))


def config_label(engine: str, static: bool) -> str:
    return f"{engine}/{'static' if static else 'dynamic'}"


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


def hooked_cases(tests_dir: Path = TESTS) -> list[PortabilityCase]:
    """Cases offered by ``portability_cases()`` in other ``tests/test_*.py`` modules."""
    found: list[PortabilityCase] = []
    if str(tests_dir) not in sys.path:
        sys.path.insert(0, str(tests_dir))
    for path in sorted(tests_dir.glob("test_*.py")):
        # test_portability.py runs the catalogue (and quotes the hook in a test)
        if path.stem == "test_portability" or \
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


@functools.cache
def decomposed(case_id: str) -> onnx.ModelProto:
    case = next(c for c in all_cases() if c.id == case_id)
    out = decomposer.decompose(case.model, lower=case.lower)
    onnx.checker.check_model(out, full_check=True)
    return out


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


NEWEST_OPSET = onnx.defs.onnx_opset_version()


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
