"""Verification: prove a decomposed model computes what the original computes, per node.

In: the original model (with its custom nodes), the decomposed model, and feeds (given,
or generated from the inputs' types with seeded random values).
Out: a :class:`VerifyReport` with one row per compared tensor and run: every graph output,
and every output of every replaced node of the main graph (exposed as an extra output in
both runs), with max abs/rel error, the tolerance and pass/fail. A failing row names the
node and the pattern that produced it.

How: stock ONNX Runtime cannot run the original (that is the problem decomposer solves),
so the original runs on ``onnx.reference.ReferenceEvaluator`` with each custom node mapped,
in a scratch copy, to an ``OpRun`` that calls the pattern's numpy ``reference``. The
decomposed model runs on stock ONNX Runtime (CPU).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper

from decomposer.engine import OpClassifier, all_nodes, opset_map, subgraphs
from decomposer.errors import InvalidModelError, VerificationError
from decomposer.pattern import Pattern
from decomposer.registry import Registry, default_registry

REFERENCE_DOMAIN = "decomposer.reference"
DEFAULT_SYMBOLIC_DIM = 3


@dataclass(frozen=True)
class TensorCheck:
    """One compared tensor in one run."""

    tensor: str
    kind: str  # "output" (graph output), "node" (replaced node output), "expected"
    node: str | None
    pattern: str | None
    run: int
    shape: tuple[int, ...]
    max_abs_error: float
    max_rel_error: float
    atol: float
    rtol: float
    passed: bool
    note: str = ""

    def describe(self) -> str:
        where = f"node '{self.node}' ({self.pattern}) output" if self.node else self.kind
        verdict = "ok" if self.passed else "FAIL"
        note = f" {self.note}" if self.note else ""
        return (f"{verdict:<4} run {self.run} {where} '{self.tensor}' {list(self.shape)}: "
                f"max abs {self.max_abs_error:.3g}, max rel {self.max_rel_error:.3g} "
                f"(atol {self.atol:g}, rtol {self.rtol:g}){note}")


@dataclass
class VerifyReport:
    checks: list[TensorCheck] = field(default_factory=list)
    runs: int = 0

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(check.passed for check in self.checks)

    @property
    def failures(self) -> list[TensorCheck]:
        return [check for check in self.checks if not check.passed]

    def table(self) -> str:
        return "\n".join(check.describe() for check in self.checks)

    def summary(self) -> str:
        failed = self.failures
        if not failed:
            return f"verified: {len(self.checks)} tensor(s) over {self.runs} run(s) match"
        nodes = sorted({f"'{c.node}' ({c.pattern})" for c in failed if c.node})
        blame = f"; wrong node(s): {', '.join(nodes)}" if nodes else ""
        return (f"VERIFICATION FAILED: {len(failed)} of {len(self.checks)} tensor(s) differ"
                f"{blame}")

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "runs": self.runs,
                "checks": [{**asdict(c), "shape": list(c.shape)} for c in self.checks]}


# -- the original model, runnable by the reference evaluator ------------------------------


def _reference_op(class_name: str, pattern: Pattern, attrs: dict[str, Any]) -> type:
    from onnx.reference.op_run import OpRun

    def _run(self: Any, *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(pattern.reference(*inputs, **attrs))

    return type(class_name, (OpRun,), {"op_domain": REFERENCE_DOMAIN, "_run": _run})


def _reference_fixes() -> list[type]:
    """Overrides for onnx.reference kernels that mis-handle older opsets.

    GridSample-16 spells its modes "bilinear"/"bicubic"; onnx's reference only knows the
    opset-20 names "linear"/"cubic" and raises on the old ones (onnx 1.23).
    """
    from onnx.reference.ops.op_grid_sample import GridSample as _GridSample

    renamed = {"bilinear": "linear", "bicubic": "cubic"}

    def _run(self: Any, X: np.ndarray, grid: np.ndarray, mode: str | None = None,
             padding_mode: str | None = None, align_corners: int | None = None) -> Any:
        mode = renamed.get(mode or "linear", mode)
        return _GridSample._run(self, X, grid, mode=mode, padding_mode=padding_mode,
                                align_corners=align_corners)

    return [type("GridSample", (_GridSample,), {"op_domain": "", "_run": _run})]


def _replaced_nodes(original: onnx.ModelProto, registry: Registry
                    ) -> tuple[onnx.ModelProto, list[type], dict[str, tuple[str, str]]]:
    """A scratch copy of ``original`` whose custom nodes call pattern references, the OpRun
    classes for them, and a map from main-graph output name to (node name, pattern name)."""
    scratch = onnx.ModelProto()
    scratch.CopyFrom(original)
    opsets = opset_map(list(scratch.opset_import))
    classifier = OpClassifier({(f.domain, f.name) for f in scratch.functions})
    ops: list[type] = []
    produced_by: dict[str, tuple[str, str]] = {}
    def visit(nodes: Sequence[onnx.NodeProto], node_opsets: dict[str, int],
              in_main_graph: bool) -> None:
        for node in nodes:
            for _, sub in subgraphs(node):
                visit(list(sub.node), node_opsets, False)
            if classifier.is_standard(node, node_opsets):
                continue
            found = registry.lookup(node)
            if found is None:
                raise InvalidModelError(
                    f"cannot verify: node '{node.name}' ({node.domain}::{node.op_type}) has "
                    f"no pattern, so there is no reference for it")
            pattern, form = found
            attrs = pattern.match_attributes(node, form)
            class_name = f"Ref{len(ops)}_{re.sub(r'[^0-9A-Za-z_]', '_', pattern.name)}"
            ops.append(_reference_op(class_name, pattern, attrs))
            if in_main_graph:
                for out in node.output:
                    if out:
                        produced_by[out] = (node.name, pattern.name)
            node.domain = REFERENCE_DOMAIN
            node.op_type = class_name
            del node.attribute[:]

    visit(list(scratch.graph.node), opsets, True)
    for function in scratch.functions:
        visit(list(function.node), {**opsets, **opset_map(list(function.opset_import))},
              False)
        function.opset_import.append(helper.make_opsetid(REFERENCE_DOMAIN, 1))
    scratch.opset_import.append(helper.make_opsetid(REFERENCE_DOMAIN, 1))
    return scratch, ops, produced_by


def _with_extra_outputs(model: onnx.ModelProto, names: Sequence[str]) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {o.name for o in copy.graph.output}
    for name in names:
        if name not in present:
            copy.graph.output.append(onnx.ValueInfoProto(name=name))
    return copy


# -- feeds ----------------------------------------------------------------------------------


def parse_input_shapes(specs: Sequence[str]) -> dict[str, list[int]]:
    """``NAME:1x3x224x224`` -> {NAME: [1, 3, 224, 224]}."""
    shapes: dict[str, list[int]] = {}
    for spec in specs:
        name, sep, dims = spec.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.lower().split("x")] if dims else []
        except ValueError:
            raise InvalidModelError(f"--input-shape {spec!r}: expected NAME:1x3x224x224") from None
    return shapes


def parse_input_values(specs: Sequence[str]) -> dict[str, list[float]]:
    """``NAME=1,64,32,32`` -> {NAME: [1, 64, 32, 32]}."""
    values: dict[str, list[float]] = {}
    for spec in specs:
        name, sep, text = spec.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            values[name] = [float(v) for v in text.split(",")] if text else []
        except ValueError:
            raise InvalidModelError(f"--input-value {spec!r}: expected NAME=1,64,32,32") from None
    return values


def generate_feeds(model: onnx.ModelProto, run: int, *, seed: int = 0,
                   shapes: Mapping[str, Sequence[int]] | None = None,
                   values: Mapping[str, Sequence[float]] | None = None,
                   given: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Feeds for every graph input: given arrays, then given values, then random data.

    Float inputs get seeded uniform values in [-1, 1]; symbolic dims get small sizes that
    change with ``run`` (so dynamic sizes are exercised) and agree across inputs sharing a
    dim name. Integer inputs need a value: random sizes or indices mean nothing.
    """
    shapes, values, given = shapes or {}, values or {}, given or {}
    rng = np.random.default_rng(seed + 1000 * run)
    initializers = {init.name for init in model.graph.initializer}
    symbols: dict[str, int] = {}
    feeds: dict[str, np.ndarray] = {}
    for value in model.graph.input:
        name = value.name
        if name in initializers and name not in given and name not in values:
            continue
        tensor_type = value.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type) \
            if tensor_type.elem_type else np.dtype(np.float32)
        if name in given:
            feeds[name] = np.asarray(given[name])
            continue
        if name in values:
            array = np.asarray(values[name]).astype(dtype)
            if tensor_type.HasField("shape") and len(tensor_type.shape.dim) == 0:
                array = array.reshape(())
            feeds[name] = array
            continue
        if name in shapes:
            dims = list(shapes[name])
        else:
            dims = []
            for index, dim in enumerate(tensor_type.shape.dim):
                if dim.HasField("dim_value"):
                    dims.append(dim.dim_value)
                else:
                    key = dim.dim_param or f"{name}:{index}"
                    symbols.setdefault(key, DEFAULT_SYMBOLIC_DIM + run + len(symbols) % 3)
                    dims.append(symbols[key])
        if np.issubdtype(dtype, np.floating):
            feeds[name] = rng.uniform(-1, 1, dims).astype(dtype)
        elif dtype == np.bool_:
            feeds[name] = rng.integers(0, 2, dims).astype(np.bool_)
        else:
            raise InvalidModelError(
                f"input '{name}' is {np.dtype(dtype).name}: give its value with --input-value "
                f"{name}=1,2,3 (random integers would be meaningless as sizes or indices)")
    return feeds


# -- comparison -----------------------------------------------------------------------------


def _compare(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float
             ) -> tuple[float, float, bool, str]:
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        return float("inf"), float("inf"), False, f"shape {actual.shape} != {expected.shape}"
    if actual.size == 0:
        return 0.0, 0.0, True, ""
    if not (np.issubdtype(actual.dtype, np.number) and np.issubdtype(expected.dtype, np.number)):
        same = bool(np.array_equal(actual, expected))
        return (0.0, 0.0, same, "") if same else (float("inf"), float("inf"), False, "differs")
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    nan_mismatch = bool(np.any(np.isnan(a) != np.isnan(e)))
    diff = np.abs(np.where(np.isnan(a) | np.isnan(e), 0.0, a - e))
    max_abs = float(diff.max())
    max_rel = float((diff / np.maximum(np.abs(e), np.finfo(np.float64).tiny)).max())
    passed = bool(np.allclose(a, e, atol=atol, rtol=rtol, equal_nan=True)) and not nan_mismatch
    return max_abs, max_rel, passed, "NaN positions differ" if nan_mismatch else ""


def verify(original: onnx.ModelProto, decomposed: onnx.ModelProto,
           feeds: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None = None,
           *, atol: float = 1e-5, rtol: float = 1e-4, runs: int = 1, seed: int = 0,
           input_shapes: Mapping[str, Sequence[int]] | None = None,
           input_values: Mapping[str, Sequence[float]] | None = None,
           expected: Mapping[str, np.ndarray] | None = None,
           registry: Registry | None = None) -> VerifyReport:
    """Compare ``decomposed`` (on ONNX Runtime) with ``original`` (on the reference evaluator
    with pattern references), per graph output and per replaced node output.

    ``feeds`` is one feed dict or a list of them; without it ``runs`` feed sets are
    generated. ``expected`` holds graph outputs saved from PyTorch for the (single) feed set,
    compared with the decomposed model too. Raises :class:`InvalidModelError` for unusable
    inputs; a mismatch is reported, not raised (see :func:`require_passed`).
    """
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    registry = registry if registry is not None else default_registry()
    scratch, ops, produced_by = _replaced_nodes(original, registry)
    decomposed_outputs = {o for n in all_nodes(decomposed.graph) for o in n.output}
    node_outputs = [name for name in produced_by if name in decomposed_outputs]
    graph_outputs = [o.name for o in original.graph.output]
    extra = [name for name in node_outputs if name not in graph_outputs]
    compared = graph_outputs + extra

    try:
        reference = ReferenceEvaluator(_with_extra_outputs(scratch, extra),
                                       new_ops=[*ops, *_reference_fixes()])
        options = ort.SessionOptions()
        options.log_severity_level = 3
        session = ort.InferenceSession(
            _with_extra_outputs(decomposed, extra).SerializeToString(), options,
            providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise InvalidModelError(f"cannot verify: a model does not load: "
                                f"{str(exc).splitlines()[0]}") from exc

    if feeds is None:
        feed_sets = [generate_feeds(original, run, seed=seed, shapes=input_shapes,
                                    values=input_values) for run in range(max(runs, 1))]
    elif isinstance(feeds, Mapping):
        feed_sets = [generate_feeds(original, 0, seed=seed, shapes=input_shapes,
                                    values=input_values, given=feeds)]
    else:
        feed_sets = [dict(f) for f in feeds]
    if expected is not None and len(feed_sets) != 1:
        raise InvalidModelError("expected outputs need exactly one feed set (--inputs FILE.npz)")

    report = VerifyReport(runs=len(feed_sets))
    ort_inputs = {i.name for i in session.get_inputs()}
    for run, feed in enumerate(feed_sets):
        try:
            want = dict(zip(compared, reference.run(compared, feed), strict=True))
        except Exception as exc:
            raise InvalidModelError(f"cannot verify: the original model fails on the reference "
                                    f"evaluator with these inputs: "
                                    f"{str(exc).splitlines()[0]}") from exc
        try:
            got = dict(zip(compared, session.run(
                compared, {k: v for k, v in feed.items() if k in ort_inputs}), strict=True))
        except Exception as exc:
            raise InvalidModelError(f"cannot verify: ONNX Runtime fails on the decomposed "
                                    f"model with these inputs: "
                                    f"{str(exc).splitlines()[0]}") from exc
        for name in compared:
            node, pattern = produced_by.get(name, (None, None))
            kind = "output" if name in graph_outputs else "node"
            max_abs, max_rel, passed, note = _compare(got[name], want[name], atol, rtol)
            report.checks.append(TensorCheck(name, kind, node, pattern, run,
                                             tuple(np.shape(got[name])), max_abs, max_rel,
                                             atol, rtol, passed, note))
        if expected is not None:
            for name, array in expected.items():
                if name not in got:
                    raise InvalidModelError(f"--expected has '{name}', which is not a graph "
                                            f"output of the model")
                max_abs, max_rel, passed, note = _compare(got[name], array, atol, rtol)
                report.checks.append(TensorCheck(name, "expected", None, None, run,
                                                 tuple(np.shape(got[name])), max_abs, max_rel,
                                                 atol, rtol, passed, note))
    return report


def require_passed(report: VerifyReport) -> None:
    """Raise :class:`VerificationError` (exit 1) if any compared tensor differs."""
    if not report.passed:
        details = "\n".join(c.describe() for c in report.failures)
        error = VerificationError(f"{report.summary()}\n{details}")
        error.report = report  # type: ignore[attr-defined]
        raise error


def load_npz(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise InvalidModelError(f"{path}: cannot read as .npz: {exc}") from exc


__all__ = ["TensorCheck", "VerifyReport", "generate_feeds", "load_npz", "parse_input_shapes",
           "parse_input_values", "require_passed", "verify"]
