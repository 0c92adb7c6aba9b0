"""Verification: prove a decomposed model computes what the original computes, per node.

In: the original model (with its custom nodes), the decomposed model, feeds (given, or
generated from the inputs' types with seeded random values), the engines to run on.
Out: a :class:`VerifyReport` with one row per compared tensor, engine and run, and notes on
anything that could not be checked per node. A failing row names the node and the pattern
that produced it; an engine that cannot load or run the result is a failing row naming the
engine, the replaced node its error mentions (else the model), and its first error line.

Two routes:

- ``mode="fast"`` (the default, ``--verify``): every node the decomposition did not replace
  is the same node in both models, so only replaced nodes need checking, on the real tensors
  that flow into them. The decomposed model runs once per feed set on each engine with every
  replaced node's inputs and outputs exposed as extra graph outputs (:mod:`decomposer.capture`,
  which also reaches into If/Loop/Scan bodies and local functions); each node's pattern
  ``reference`` (numpy) is applied to the captured inputs and compared with the captured
  outputs. Graph outputs are compared with ``expected`` when given. Nodes that cannot be
  exposed on an engine are checked through the graph outputs they feed: against ONNX
  Runtime's outputs when ONNX Runtime verified every node per node, else against the full
  route's reference run.
- ``mode="full"`` (``--verify=full``): the original runs on ``onnx.reference`` with each
  custom node mapped to its pattern's reference, and every graph output and every replaced
  main-graph node output is compared with each engine's. Pure numpy: small sizes only.

Models with external data work in both routes given ``base_dir`` (the folder the model was
read from); ONNX Runtime reads the weights itself, other engines and the reference evaluator
get a copy with the weights loaded.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

from decomposer import engines as engine_registry
from decomposer import tolerances
from decomposer.capture import NodeTap, ReplacedNode, executions, find_replaced, instrument
from decomposer.errors import EngineRunError, InvalidModelError, VerificationError
from decomposer.feeds import (
    DEFAULT_SYMBOLIC_DIM,
    generate_feeds,
    load_npz,
    parse_input_shapes,
    parse_input_values,
)
from decomposer.graphs import OpClassifier, all_nodes, opset_map, subgraphs
from decomposer.pattern import Form, Pattern, Reject
from decomposer.registry import Registry, default_registry

REFERENCE_DOMAIN = "decomposer.reference"
MODES = ("fast", "full")
PROGRESS_DELAY_S = 1.0
_COMPARE_CHUNK = 1 << 18  # elements compared at a time, so big outputs need no big copies

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TensorCheck:
    """One compared tensor (or one engine failure) in one run on one engine.

    ``tolerance_used`` is the worst ``|actual - expected| / (atol + rtol * |expected|)``:
    at most 1 passes (numpy's ``allclose``), so 0.3 means the worst element used 30% of its
    tolerance. ``max_rel_error`` is kept for reports; it alone says nothing about passing.
    """

    tensor: str
    kind: str  # "output" | "node" (replaced node output) | "expected" | "engine" (failure)
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
    engine: str = "ort"
    context: str = ""  # where a nested node ran: "Loop 'l' body iteration 3", a call site
    tolerance_used: float = 0.0
    worst_index: tuple[int, ...] = ()

    def describe(self) -> str:
        verdict = "ok" if self.passed else "FAIL"
        blame = f"node '{self.node}' ({self.pattern})" if self.node else ""
        if self.kind == "engine":
            what = f" ({blame})" if blame else " (the model)"
            return (f"{verdict:<4} run {self.run} on {self.engine}: cannot run the decomposed "
                    f"model{what}: {self.note}")
        where = f"{blame} output" if self.node else self.kind
        context = f" [{self.context}]" if self.context else ""
        note = f"; {self.note}" if self.note else ""
        return (f"{verdict:<4} run {self.run} on {self.engine} {where} '{self.tensor}'{context} "
                f"{list(self.shape)}: {self._criterion()}{note}")

    def _criterion(self) -> str:
        """The allclose criterion in words: how much of ``atol + rtol * |expected|`` the worst
        element used (a max relative error alone would read like a failure near zero)."""
        tolerance = f"atol {self.atol:g} + rtol {self.rtol:g} * |expected|"
        if self.passed:
            return (f"within tolerance: max abs {self.max_abs_error:.3g}, worst element uses "
                    f"{100 * self.tolerance_used:.3g}% of {tolerance}")
        at = f" at {list(self.worst_index)}" if self.worst_index else ""
        if not np.isfinite(self.max_abs_error):
            return f"differs{at}"
        if not np.isfinite(self.tolerance_used):
            return f"max abs {self.max_abs_error:.3g}{at}: above a zero tolerance ({tolerance})"
        return (f"max abs {self.max_abs_error:.3g}{at}: {self.tolerance_used:.3g}x its "
                f"tolerance {tolerance}")


@dataclass
class VerifyReport:
    checks: list[TensorCheck] = field(default_factory=list)
    runs: int = 0
    mode: str = "fast"
    engines: list[str] = field(default_factory=lambda: ["ort"])
    notes: list[str] = field(default_factory=list)  # what could not be checked per node, why
    replaced_nodes: int = -1  # nodes the decomposition replaced (fast route); -1: not counted

    @property
    def passed(self) -> bool:
        """No check failed, and something was compared (or there was nothing to compare)."""
        return not self.failures and (bool(self.checks) or self.replaced_nodes == 0)

    @property
    def failures(self) -> list[TensorCheck]:
        return [check for check in self.checks if not check.passed]

    def table(self) -> str:
        return "\n".join([*(check.describe() for check in self.checks),
                          *(f"note: {note}" for note in self.notes)])

    def summary(self) -> str:
        failed = self.failures
        on = f" on {', '.join(self.engines)}"
        if not self.checks and self.passed:
            return f"verified: nothing to compare (no node was replaced){on}"
        if not self.checks:
            return (f"VERIFICATION FAILED: nothing could be compared{on}"
                    f"{': ' + self.notes[0] if self.notes else ''}")
        if not failed:
            notes = f"; {len(self.notes)} note(s)" if self.notes else ""
            return (f"verified: {len(self.checks)} tensor(s) over {self.runs} run(s) match"
                    f"{on}{notes}")
        nodes = sorted({f"'{c.node}' ({c.pattern})" for c in failed
                        if c.node and c.kind != "engine"})
        blame = f"; wrong node(s): {', '.join(nodes)}" if nodes else ""
        broken = sorted({f"{c.engine} ("
                         f"{f'at node {c.node!r} ({c.pattern})' if c.node else 'the model'})"
                         for c in failed if c.kind == "engine"})
        engines = f"; engine(s) that cannot run it: {', '.join(broken)}" if broken else ""
        return (f"VERIFICATION FAILED: {len(failed)} of {len(self.checks)} check(s) failed"
                f"{blame}{engines}")

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "runs": self.runs, "mode": self.mode,
                "replaced_nodes": self.replaced_nodes,
                "engines": list(self.engines), "notes": list(self.notes),
                "checks": [{**{k: _json_number(v) for k, v in asdict(c).items()},
                            "shape": list(c.shape), "worst_index": list(c.worst_index)}
                           for c in self.checks]}


def _json_number(value: Any) -> Any:
    """Infinities (an engine failure, a shape mismatch) become null: JSON has no inf."""
    return None if isinstance(value, float) and not np.isfinite(value) else value


# -- comparison -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    max_abs: float
    max_rel: float
    tolerance_used: float
    passed: bool
    note: str = ""
    worst_index: tuple[int, ...] = ()
    atol: float | None = None  # what the comparison used (None: it compared nothing)
    rtol: float | None = None


def compare(actual: np.ndarray, expected: np.ndarray, atol: float | None = None,
            rtol: float | None = None) -> Comparison:
    """numpy's ``allclose(actual, expected, atol, rtol, equal_nan=True)`` with the numbers
    behind it, in chunks (no full-size float64 copies of big tensors). ``atol``/``rtol``
    default to the tolerance policy (:mod:`decomposer.tolerances`) for the less precise of
    the two arrays' dtypes."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    atol, rtol = tolerances.pair(tolerances.compared_dtype(actual, expected), atol, rtol)
    found = _compare(actual, expected, atol, rtol)
    return dataclasses.replace(found, atol=atol, rtol=rtol)


def _compare(actual: np.ndarray, expected: np.ndarray, atol: float, rtol: float) -> Comparison:
    if actual.shape != expected.shape:
        return Comparison(np.inf, np.inf, np.inf, False,
                           f"shape {list(actual.shape)} != expected {list(expected.shape)}")
    if actual.size == 0:
        return Comparison(0.0, 0.0, 0.0, True)
    if not (np.issubdtype(actual.dtype, np.number) and np.issubdtype(expected.dtype, np.number)):
        same = bool(np.array_equal(actual, expected))
        return Comparison(0.0, 0.0, 0.0, True) if same else \
            Comparison(np.inf, np.inf, np.inf, False, "values differ")
    flat_actual, flat_expected = actual.reshape(-1), expected.reshape(-1)
    max_abs = max_rel = used = 0.0
    worst_at = 0
    nan_at: int | None = None
    for start in range(0, flat_actual.size, _COMPARE_CHUNK):
        a = flat_actual[start:start + _COMPARE_CHUNK].astype(np.float64)
        e = flat_expected[start:start + _COMPARE_CHUNK].astype(np.float64)
        a_nan, e_nan = np.isnan(a), np.isnan(e)
        mismatch = np.flatnonzero(a_nan != e_nan)
        if nan_at is None and mismatch.size:
            nan_at = start + int(mismatch[0])
        same = (a == e) | (a_nan & e_nan)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            diff = np.abs(a - e)
            diff[same | a_nan | e_nan] = 0.0
            # An infinity on either side that is not the same infinity never passes.
            diff[(np.isinf(a) | np.isinf(e)) & ~same & ~a_nan & ~e_nan] = np.inf
            ratio = np.where(diff > 0, diff / (atol + rtol * np.abs(e)), 0.0)
            rel = np.where(diff > 0, diff / np.maximum(np.abs(e), np.finfo(np.float64).tiny),
                           0.0)
        chunk_worst = int(np.argmax(ratio))
        if ratio[chunk_worst] > used:
            used, worst_at = float(ratio[chunk_worst]), start + chunk_worst
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float(rel.max()))
    if nan_at is not None:
        index = tuple(int(i) for i in np.unravel_index(nan_at, actual.shape))
        return Comparison(max_abs, max_rel, used, False, f"NaN positions differ (first at "
                                                          f"{list(index)})", index)
    index = tuple(int(i) for i in np.unravel_index(worst_at, actual.shape))
    return Comparison(max_abs, max_rel, used, used <= 1.0, "", index if used > 0 else ())


# -- progress ---------------------------------------------------------------------------------


class _Progress:
    """Says what is running when a step takes longer than ``delay`` seconds (and when it
    ends), so a long verification is never silent; quick steps print nothing."""

    def __init__(self, sink: Progress | None, delay: float | None = None) -> None:
        self.sink = sink
        self.delay = PROGRESS_DELAY_S if delay is None else delay

    @contextmanager
    def step(self, what: str) -> Iterator[None]:
        sink = self.sink
        if sink is None:
            yield
            return
        start = time.perf_counter()
        announced = threading.Event()

        def announce() -> None:
            announced.set()
            sink(f"verifying: {what} ...")

        timer = threading.Timer(self.delay, announce)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            timer.join()
            if announced.is_set():
                sink(f"verifying: {what}: done in {time.perf_counter() - start:.1f} s")


# -- running the decomposed model on engines --------------------------------------------------


def _has_external_data(model: onnx.ModelProto) -> bool:
    from decomposer.modelio import external_tensors

    return next(external_tensors(model), None) is not None


def _with_weights(model: onnx.ModelProto, base_dir: Path | None) -> onnx.ModelProto:
    """``model`` itself, or a copy with its external weights read from ``base_dir``."""
    if not _has_external_data(model):
        return model
    if base_dir is None:
        raise InvalidModelError("cannot verify: the model keeps weights in external data "
                                "files; pass base_dir= (the folder it was read from)")
    from onnx.external_data_helper import load_external_data_for_model

    loaded = onnx.ModelProto()
    loaded.CopyFrom(model)
    load_external_data_for_model(loaded, str(base_dir))
    return loaded


class _EngineSession:
    """One model on one engine. ONNX Runtime keeps one session for every run and reads
    external weights from ``base_dir`` itself; other engines get the weights loaded once."""

    def __init__(self, engine: str, model: onnx.ModelProto, base_dir: Path | None) -> None:
        self.engine = engine
        self.model = model
        self.base_dir = base_dir
        self.output_names = [value.name for value in model.graph.output]
        self._session: Any = None
        self._loaded: onnx.ModelProto | None = None

    def run(self, feeds: Mapping[str, np.ndarray], wanted: Sequence[str]
            ) -> dict[str, np.ndarray]:
        if self.engine != "ort":
            if self._loaded is None:
                self._loaded = _with_weights(self.model, self.base_dir)
            arrays = engine_registry.run_model(self.engine, self._loaded, feeds)
            return dict(zip(self.output_names, arrays, strict=False))
        available = set(self.output_names)
        names = [name for name in wanted if name in available]
        try:
            if self._session is None:
                self._session = self._ort_session()
            fed = {i.name for i in self._session.get_inputs()}
            arrays = self._session.run(names, {k: v for k, v in feeds.items() if k in fed})
        except Exception as exc:
            line = engine_registry.first_error_line(str(exc)) or type(exc).__name__
            raise EngineRunError(line, engine="ort") from exc
        return dict(zip(names, arrays, strict=True))

    def _ort_session(self) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.log_severity_level = 4  # errors come back as exceptions, reported once
        # Several runs hand back large outputs: with the arena and memory patterns on, the
        # second run's buffers pile onto the first's (seed STN at 512^2: 366 MiB peak for
        # two runs against 233 MiB with both off); off, each run costs ~0.1-0.3 s more in
        # fresh page faults there, well inside the time budget (scripts/bench_verify.py).
        options.enable_cpu_mem_arena = False
        options.enable_mem_pattern = False
        for key, value in engine_registry.ORT_CONFIG.items():
            options.add_session_config_entry(key, value)
        if self.base_dir is not None and _has_external_data(self.model):
            options.add_session_config_entry(
                "session.model_external_initializers_file_folder_path", str(self.base_dir))
        return ort.InferenceSession(self.model.SerializeToString(), options,
                                    providers=["CPUExecutionProvider"])


@dataclass
class _Variant:
    """The decomposed model with some values exposed: ``taps`` says which nodes' values."""

    label: str
    model: onnx.ModelProto
    taps: list[NodeTap]


class _EngineRunner:
    """Runs one engine, falling back to a variant exposing fewer values when an engine
    cannot run a richer one (nested outputs first, then every extra output)."""

    def __init__(self, engine: str, variants: list[_Variant], base_dir: Path | None,
                 notes: list[str]) -> None:
        self.engine = engine
        self.variants = variants
        self.sessions = [_EngineSession(engine, v.model, base_dir) for v in variants]
        self.current = 0
        self.notes = notes

    def run(self, feeds: Mapping[str, np.ndarray], graph_outputs: Sequence[str]
            ) -> tuple[_Variant, dict[str, np.ndarray]]:
        """Outputs of the richest variant the engine runs; raises the plainest variant's
        EngineRunError when it runs none."""
        skipped: list[tuple[_Variant, EngineRunError]] = []
        while True:
            variant = self.variants[self.current]
            wanted = [*graph_outputs, *sorted({n for t in variant.taps
                                               for n in t.graph_outputs()})]
            try:
                fetched = self.sessions[self.current].run(feeds, wanted)
            except EngineRunError as error:
                if self.current == len(self.variants) - 1:
                    raise
                skipped.append((variant, error))
                self.current += 1
                continue
            for richer, why in skipped:
                self.notes.append(f"{self.engine} cannot run the model with {richer.label} "
                                  f"exposed ({why}); used {variant.label}")
            return variant, fetched


def _blame(message: str, replaced: Sequence[ReplacedNode]) -> ReplacedNode | None:
    """The replaced node an engine's error names (replacement nodes are named after it)."""
    for item in sorted(replaced, key=lambda r: -len(r.name)):
        if item.name and item.name in message:
            return item
    return None


def _engine_failure(error: EngineRunError, engine: str, run: int,
                    replaced: Sequence[ReplacedNode], atol: float, rtol: float) -> TensorCheck:
    culprit = _blame(str(error), replaced)
    return TensorCheck("", "engine", culprit.name if culprit else None,
                       culprit.pattern.name if culprit else None, run, (), np.inf, np.inf,
                       atol, rtol, False, str(error), engine=engine, tolerance_used=np.inf)


# -- the original on the reference evaluator (the full route) ---------------------------------


def _reference_op(class_name: str, pattern: Pattern[Any], form: Form,
                  attrs: dict[str, Any]) -> type:
    from onnx.reference.op_run import OpRun

    def _run(self: Any, *inputs: np.ndarray) -> tuple[np.ndarray, ...]:
        return tuple(pattern.evaluate(form, inputs, attrs))

    return type(class_name, (OpRun,), {"op_domain": REFERENCE_DOMAIN, "_run": _run})


class _ReferenceRun:
    """The original model on ``onnx.reference.ReferenceEvaluator``, with every custom node
    (at any depth) calling its pattern's numpy reference, and the main graph's replaced
    node outputs exposed."""

    def __init__(self, original: onnx.ModelProto, registry: Registry,
                 base_dir: Path | None, lowered: frozenset[str] = frozenset()) -> None:
        from onnx.reference import ReferenceEvaluator

        # Imported by name, as the registry imports decomposer.patterns (a package-dir
        # remap mypy cannot follow); the shims live there because they name ops.
        shims = importlib.import_module("decomposer.patterns._reference_shims")
        reference_kernel_fixes: Callable[[], list[type]] = shims.reference_kernel_fixes
        scratch = onnx.ModelProto()
        scratch.CopyFrom(_with_weights(original, base_dir))
        ops, self.produced_by = _map_custom_nodes(scratch, registry, lowered)
        extra = [name for name in self.produced_by
                 if name not in {o.name for o in scratch.graph.output}]
        scratch.graph.output.extend(onnx.ValueInfoProto(name=name) for name in extra)
        try:
            self.evaluator = ReferenceEvaluator(scratch,
                                                new_ops=[*ops, *reference_kernel_fixes()])
        except Exception as exc:
            raise InvalidModelError(f"cannot verify: the original model does not load on the "
                                    f"reference evaluator: {_first_line(exc)}") from exc

    def run(self, feed: Mapping[str, np.ndarray], names: Sequence[str]
            ) -> dict[str, np.ndarray]:
        try:
            return dict(zip(names, self.evaluator.run(list(names), dict(feed)), strict=True))
        except Exception as exc:
            raise InvalidModelError(f"cannot verify: the original model fails on the reference "
                                    f"evaluator with these inputs: {_first_line(exc)}") from exc


def reference_run(model: onnx.ModelProto, registry: Registry) -> _ReferenceRun:
    """``model`` on ``onnx.reference`` with each custom node calling its pattern's
    reference (``.run(feeds, names)`` gives the named tensors)."""
    return _ReferenceRun(model, registry, None)


def _map_custom_nodes(scratch: onnx.ModelProto, registry: Registry,
                      lowered: frozenset[str] = frozenset()
                      ) -> tuple[list[type], dict[str, tuple[str, str]]]:
    """Point every custom node of ``scratch`` (and every standard node of a ``lowered``
    type) at an ``OpRun`` calling its pattern's reference; return those classes and
    main-graph output name -> (node, pattern)."""
    opsets = opset_map(list(scratch.opset_import))
    classifier = OpClassifier({(f.domain, f.name) for f in scratch.functions},
                              lowered=lowered)
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
            try:
                attrs = pattern.match_attributes(node, form)
            except Reject as why:
                raise InvalidModelError(f"cannot verify: node '{node.name}' "
                                        f"({node.domain}::{node.op_type}): {why}") from why
            class_name = f"Ref{len(ops)}_{re.sub(r'[^0-9A-Za-z_]', '_', pattern.name)}"
            ops.append(_reference_op(class_name, pattern, form, attrs))
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
    return ops, produced_by


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- the entry point ----------------------------------------------------------------------------


def verify(original: onnx.ModelProto, decomposed: onnx.ModelProto,
           feeds: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None = None,
           *, mode: str = "fast", engines: Sequence[str] = ("ort",),
           atol: float | None = None, rtol: float | None = None, runs: int = 1, seed: int = 0,
           input_shapes: Mapping[str, Sequence[int]] | None = None,
           input_values: Mapping[str, Sequence[float]] | None = None,
           expected: Mapping[str, np.ndarray] | None = None,
           registry: Registry | None = None, base_dir: str | Path | None = None,
           progress: Progress | None = None, lower: Iterable[str] = ()) -> VerifyReport:
    """Check ``decomposed`` against ``original`` (see the module docstring for the routes).

    ``feeds`` is one feed dict or a list of them; without it ``runs`` feed sets are
    generated. ``expected`` holds graph outputs saved from PyTorch for the (single) feed
    set, compared with every engine's outputs. ``engines`` names engines of
    :mod:`decomposer.engines`. ``base_dir`` is the folder external data is read from.
    ``progress`` receives a line when a run takes longer than about a second. ``lower`` is
    what the decomposition was given (standard op types it decomposed on request).
    Raises :class:`InvalidModelError` for unusable inputs and
    :class:`decomposer.errors.EngineUnavailableError` for an engine that is not installed
    (both before running anything); a mismatch or an engine failure is reported, not raised
    (see :func:`require_passed`).
    """
    if mode not in MODES:
        raise InvalidModelError(f"verification mode {mode!r}: expected one of {list(MODES)}")
    names = list(dict.fromkeys(engines)) or ["ort"]
    for engine in names:
        engine_registry.require(engine)
    registry = registry if registry is not None else default_registry()
    folder = Path(base_dir) if base_dir is not None else None
    for model in (original, decomposed):
        if folder is None and _has_external_data(model):
            raise InvalidModelError("cannot verify: the model keeps weights in external data "
                                    "files; pass base_dir= (the folder it was read from)")
    feed_sets = _feed_sets(original, feeds, runs=runs, seed=seed, shapes=input_shapes,
                           values=input_values)
    graph_outputs = [value.name for value in decomposed.graph.output]
    if expected is not None:
        if len(feed_sets) != 1:
            raise InvalidModelError("expected outputs need exactly one feed set "
                                    "(--inputs FILE.npz)")
        unknown = [name for name in expected if name not in graph_outputs]
        if unknown:
            raise InvalidModelError(f"--expected has '{unknown[0]}', which is not a graph "
                                    f"output of the model (outputs: {', '.join(graph_outputs)})")
    report = VerifyReport(runs=len(feed_sets), mode=mode, engines=names)
    job = _Job(original, decomposed, registry, folder, report, _Progress(progress), atol, rtol,
               expected, frozenset([lower] if isinstance(lower, str) else lower))
    if mode == "full":
        job.full(feed_sets, names)
    else:
        job.fast(feed_sets, names)
    return report


def _feed_sets(model: onnx.ModelProto,
               feeds: Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]] | None,
               *, runs: int, seed: int, shapes: Mapping[str, Sequence[int]] | None,
               values: Mapping[str, Sequence[float]] | None) -> list[dict[str, np.ndarray]]:
    if feeds is None:
        return [generate_feeds(model, run, seed=seed, shapes=shapes, values=values)
                for run in range(max(runs, 1))]
    given = [feeds] if isinstance(feeds, Mapping) else list(feeds)
    return [generate_feeds(model, run, seed=seed, shapes=shapes, values=values, given=one)
            for run, one in enumerate(given)]


class _Job:
    """One verification: the models, where rows and notes go, and the two routes."""

    def __init__(self, original: onnx.ModelProto, decomposed: onnx.ModelProto,
                 registry: Registry, base_dir: Path | None, report: VerifyReport,
                 progress: _Progress, atol: float | None, rtol: float | None,
                 expected: Mapping[str, np.ndarray] | None,
                 lowered: frozenset[str] = frozenset()) -> None:
        self.original = original
        self.lowered = lowered
        self.decomposed = decomposed
        self.registry = registry
        self.base_dir = base_dir
        self.report = report
        self.progress = progress
        self.atol, self.rtol = atol, rtol
        self.expected = expected
        self.graph_outputs = [value.name for value in decomposed.graph.output]
        self._reference: _ReferenceRun | None = None
        self.exposed: set[int] = set()  # ids of replaced nodes exposed in a successful run

    def reference(self) -> _ReferenceRun:
        if self._reference is None:
            self._reference = _ReferenceRun(self.original, self.registry, self.base_dir,
                                            self.lowered)
        return self._reference

    def _tolerances(self, result: Comparison) -> tuple[float, float]:
        """The tolerances a row records: the comparison's, else the caller's or float32's."""
        if result.atol is not None and result.rtol is not None:
            return result.atol, result.rtol
        return tolerances.pair(np.float32, self.atol, self.rtol)

    def row(self, tensor: str, kind: str, run: int, engine: str, result: Comparison,
            shape: tuple[int, ...], node: ReplacedNode | tuple[str, str] | None = None,
            context: str = "") -> None:
        if isinstance(node, ReplacedNode):
            node = (node.name, node.pattern.name)
        self.report.checks.append(TensorCheck(
            tensor, kind, node[0] if node else None, node[1] if node else None, run, shape,
            result.max_abs, result.max_rel, *self._tolerances(result), result.passed,
            result.note,
            engine=engine, context=context, tolerance_used=result.tolerance_used,
            worst_index=result.worst_index))

    def compare_graph_outputs(self, got: Mapping[str, np.ndarray],
                              want: Mapping[str, np.ndarray], kind: str, run: int,
                              engine: str, note: str = "") -> None:
        for name, array in want.items():
            if name not in got:
                self.row(name, kind, run, engine, Comparison(
                    np.inf, np.inf, np.inf, False, "the engine returned no such output"), ())
                continue
            result = compare(got[name], array, self.atol, self.rtol)
            if note:
                result = Comparison(result.max_abs, result.max_rel, result.tolerance_used,
                                     result.passed, "; ".join(filter(None, [result.note, note])),
                                     result.worst_index)
            self.row(name, kind, run, engine, result, tuple(np.shape(got[name])))

    # -- fast: per node, on the engines' own tensors ------------------------------------------

    def fast(self, feed_sets: list[dict[str, np.ndarray]], engines: list[str]) -> None:
        replaced, notes = find_replaced(self.original, self.decomposed, self.registry,
                                        self.base_dir, self.lowered)
        self.report.notes.extend(notes)
        self.report.replaced_nodes = len(replaced)
        variants = self._variants(replaced)
        runners = {engine: _EngineRunner(engine, variants, self.base_dir, self.report.notes)
                   for engine in dict.fromkeys(["ort", *engines])}
        ran: set[int] = set()  # ids of replaced nodes that executed at least once
        for run, feed in enumerate(feed_sets):
            baseline: dict[str, np.ndarray] | None = None  # ORT's, once it verified every node
            # ONNX Runtime first: it is the baseline for engines that expose less.
            for engine in sorted(engines, key=lambda name: name != "ort"):
                with self.progress.step(f"run {run + 1}/{len(feed_sets)} on {engine}"):
                    fetched, complete = self._fast_run(runners[engine], replaced, feed, run,
                                                       ran)
                if fetched is None:
                    continue
                if engine == "ort" and complete and len(engines) > 1:
                    baseline = {name: fetched[name] for name in self.graph_outputs}
                if self.expected is not None:
                    self.compare_graph_outputs(fetched, self.expected, "expected", run, engine)
                elif not complete:
                    baseline = self._graph_outputs_fallback(fetched, feed, run, engine,
                                                            baseline, runners["ort"],
                                                            replaced, ran)
                # Drop this run's tensors before the next run allocates its own: ONNX
                # Runtime hands back its output buffers, so holding them grows its arena.
                del fetched
        for item in replaced:
            if id(item) in self.exposed and id(item) not in ran:
                self.report.notes.append(f"node {item.describe()} did not run in any run "
                                         f"(If branch not taken, or no iteration); not "
                                         f"verified")

    def _variants(self, replaced: list[ReplacedNode]) -> list[_Variant]:
        """Richest first: every node exposed, then main-graph nodes only, then nothing."""
        variants: list[_Variant] = []
        nested = [item for item in replaced if not item.in_main_graph]
        if nested:
            model, taps, skipped = instrument(self.decomposed, replaced)
            for index, why in skipped.items():
                self.report.notes.append(f"node {replaced[index].describe()} cannot be "
                                         f"exposed: {why}; checked through the graph outputs "
                                         f"it feeds")
            variants.append(_Variant("values inside nested graphs", model, taps))
        main = [item for item in replaced if item.in_main_graph]
        model, taps, _ = instrument(self.decomposed, main)
        variants.append(_Variant("replaced nodes' values", model, taps))
        variants.append(_Variant("no extra outputs", self.decomposed, []))
        return variants

    def _fast_run(self, runner: _EngineRunner, replaced: list[ReplacedNode],
                  feed: dict[str, np.ndarray], run: int, ran: set[int]
                  ) -> tuple[dict[str, np.ndarray] | None, bool]:
        """Run one engine once and check every exposed node. Returns the fetched values
        (None if the engine failed) and whether every replaced node was checked."""
        try:
            variant, fetched = runner.run(feed, self.graph_outputs)
        except EngineRunError as error:
            self.report.checks.append(_engine_failure(
                error, runner.engine, run, replaced,
                *tolerances.pair(np.float32, self.atol, self.rtol)))
            return None, False
        fetched = {**feed, **fetched}
        for tap in variant.taps:
            self.exposed.add(id(tap.replaced))
            if self._check_node(tap, fetched, run, runner.engine):
                ran.add(id(tap.replaced))
        return fetched, len(variant.taps) == len(replaced)

    def _check_node(self, tap: NodeTap, fetched: Mapping[str, np.ndarray], run: int,
                    engine: str) -> bool:
        """Compare one node's captured outputs with its pattern's reference, per execution:
        one row per output and call path (the worst iteration). False if it never ran."""
        item = tap.replaced
        positions = {name: i for i, name in enumerate(item.node.output) if name}
        worst: dict[tuple[str, str], tuple[Comparison, tuple[int, ...], str]] = {}
        counts: dict[str, int] = {}
        for execution in executions(tap, fetched):
            counts[execution.path] = counts.get(execution.path, 0) + 1
            try:
                # Absent optional inputs are passed as None, as onnx.reference does.
                want = list(item.pattern.evaluate(item.form, execution.inputs, item.attrs))
            except Exception as exc:
                self.row("", "node", run, engine,
                         Comparison(np.inf, np.inf, np.inf, False,
                                     f"the pattern's reference failed on the captured inputs: "
                                     f"{type(exc).__name__}: {_first_line(exc)}"),
                         (), item, _context(item, execution.path, execution.iteration))
                continue
            for name, got in execution.outputs.items():
                index = positions[name]
                result = compare(got, want[index], self.atol, self.rtol) if index < len(want) \
                    else Comparison(np.inf, np.inf, np.inf, False,
                                     "the pattern's reference returned too few outputs")
                key = (execution.path, name)
                if key not in worst or _worse(result, worst[key][0]):
                    worst[key] = (result, tuple(np.shape(got)), execution.iteration)
        for (path, name), (result, shape, iteration) in worst.items():
            if counts[path] > 1:
                iteration = f"worst of {counts[path]} iterations: {iteration}"
            self.row(name, "node", run, engine, result, shape, item,
                     _context(item, path, iteration))
        return bool(counts)

    def _graph_outputs_fallback(self, fetched: Mapping[str, np.ndarray],
                                feed: dict[str, np.ndarray], run: int, engine: str,
                                baseline: dict[str, np.ndarray] | None,
                                ort_runner: _EngineRunner, replaced: list[ReplacedNode],
                                ran: set[int]) -> dict[str, np.ndarray] | None:
        """Graph outputs of an engine that could not expose every replaced node: against
        ONNX Runtime's when it verified every node per node (run here if it was not asked
        for), else against the original on the reference evaluator. Returns ORT's outputs
        when they can serve as the baseline."""
        if engine != "ort" and baseline is None and "ort" not in self.report.engines:
            with self.progress.step(f"run {run + 1} on ort, as the baseline for {engine}"):
                ort_fetched, complete = self._fast_run(ort_runner, replaced, feed, run, ran)
            if ort_fetched is not None and complete:
                baseline = {name: ort_fetched[name] for name in self.graph_outputs}
        if engine != "ort" and baseline is not None:
            self.compare_graph_outputs(fetched, baseline, "output", run, engine,
                                       "compared with ort, which verified every node")
            return baseline
        with self.progress.step(f"run {run + 1}: the original on onnx.reference"):
            want = self.reference().run(feed, self.graph_outputs)
        self.compare_graph_outputs(fetched, want, "output", run, engine,
                                   "compared with the original on onnx.reference")
        return baseline

    # -- full: the whole original on the reference evaluator ----------------------------------

    def full(self, feed_sets: list[dict[str, np.ndarray]], engines: list[str]) -> None:
        with self.progress.step("loading the original on onnx.reference"):
            reference = self.reference()
        produced = {o for n in all_nodes(self.decomposed.graph) for o in n.output}
        node_outputs = [name for name in reference.produced_by if name in produced]
        extra = [name for name in node_outputs if name not in self.graph_outputs]
        exposed = onnx.ModelProto()
        exposed.CopyFrom(self.decomposed)
        exposed.graph.output.extend(onnx.ValueInfoProto(name=name) for name in extra)
        variants = [_Variant("replaced nodes' outputs", exposed, []),
                    _Variant("no extra outputs", self.decomposed, [])]
        replaced, _ = find_replaced(self.original, self.decomposed, self.registry,
                                    self.base_dir, self.lowered)
        runners = [_EngineRunner(engine, variants, self.base_dir, self.report.notes)
                   for engine in engines]
        compared = [*self.graph_outputs, *extra]
        for run, feed in enumerate(feed_sets):
            with self.progress.step(f"run {run + 1}/{len(feed_sets)}: the original on "
                                    f"onnx.reference"):
                want = reference.run(feed, compared)
            for runner in runners:
                with self.progress.step(f"run {run + 1}/{len(feed_sets)} on {runner.engine}"):
                    try:
                        _, got = runner.run(feed, compared)
                    except EngineRunError as error:
                        self.report.checks.append(_engine_failure(
                            error, runner.engine, run, replaced,
                            *tolerances.pair(np.float32, self.atol, self.rtol)))
                        continue
                for name in compared:
                    if name not in got:
                        continue
                    kind = "output" if name in self.graph_outputs else "node"
                    self.row(name, kind, run, runner.engine,
                             compare(got[name], want[name], self.atol, self.rtol),
                             tuple(np.shape(got[name])), reference.produced_by.get(name))
                if self.expected is not None:
                    self.compare_graph_outputs(got, self.expected, "expected", run,
                                               runner.engine)


def _worse(a: Comparison, b: Comparison) -> bool:
    return (not a.passed and b.passed) or a.tolerance_used > b.tolerance_used


def _context(item: ReplacedNode, path: str, iteration: str) -> str:
    where = "" if item.in_main_graph else f"in {item.where}"
    return ", ".join(part for part in (where, path, iteration) if part)


def require_passed(report: VerifyReport, attach: object = None) -> None:
    """Raise :class:`VerificationError` (exit 1) if any check failed (or none ran). The
    error's ``report`` is ``attach`` when given (a run's whole :class:`decomposer.Report`,
    which holds this one), else ``report``."""
    if not report.passed:
        details = "\n".join(c.describe() for c in report.failures)
        error = VerificationError(f"{report.summary()}\n{details}".rstrip())
        error.report = attach if attach is not None else report  # type: ignore[attr-defined]
        raise error


__all__ = ["DEFAULT_SYMBOLIC_DIM", "MODES", "Comparison", "TensorCheck", "VerifyReport",
           "compare", "generate_feeds", "load_npz", "parse_input_shapes", "parse_input_values",
           "require_passed", "verify"]
