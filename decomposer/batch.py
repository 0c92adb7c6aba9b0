"""Many models in one run: the release-pipeline step.

In: model files and folders (a folder means every ``*.onnx`` under it, recursively), an
output folder, and the single-model options (target, lower, allow_unsupported, check,
plugin pattern sources). Out: :func:`decompose_many` writes each decomposed model under
the output folder at its relative place (a file given directly keeps its name; a folder's
models keep their path below it; external data goes beside each output), and returns a
:class:`BatchReport`: one entry per model (status, exit code, message, counts, seconds)
and the totals. :func:`check_many` writes nothing: it reports, per model, the custom
nodes that still need a plugin under the target and, for the engines asked about, the
standard ops of the decomposed model the engine lacks (``decomposer.engine_support``) and
the ``--lower`` that fixes each.

Guarantees:
- A model that fails never stops the others; each output is written atomically (the
  single-model guarantee), so an interrupted run leaves no partial file, only the models
  already finished.
- The output folder is checked before any model is read: missing parents are created, and
  an unwritable folder raises :class:`ModelIOError` (exit 5) with nothing written.
- Two inputs that would land on the same output path are refused up front.
- Work is spread over ``jobs`` processes (default: the CPU count); each holds one model at
  a time, so memory is that of the largest model per worker. Outputs do not depend on
  ``jobs``: every model is decomposed by the same deterministic code, and the report lists
  models in input order.
- The run's exit code is the worst model's: the highest of their exit codes (0 ok, 1
  verification failed, 2 bad input, 3 unsupported nodes remain, 4 internal error, 5 cannot
  write).
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from decomposer.errors import DecomposerError, ModelIOError, UnsupportedNodeError

__all__ = ["BatchReport", "ModelResult", "check_many", "collect_models", "decompose_many"]


@dataclass
class ModelResult:
    """One model's outcome."""

    input: str
    output: str | None
    status: str  # "ok", "unsupported", "invalid", "verification", "internal", "unwritable"
    exit_code: int
    message: str = ""
    replaced: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    unsupported: list[str] = field(default_factory=list)
    engines: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class BatchReport:
    """Every model's result, in input order, and the totals."""

    models: list[ModelResult]
    seconds: float = 0.0
    jobs: int = 1
    check: bool = False

    @property
    def exit_code(self) -> int:
        return max((m.exit_code for m in self.models), default=0)

    def totals(self) -> dict[str, Any]:
        by_status: dict[str, int] = {}
        for model in self.models:
            by_status[model.status] = by_status.get(model.status, 0) + 1
        return {"models": len(self.models), "by_status": by_status,
                "replaced": sum(m.replaced for m in self.models),
                "exit_code": self.exit_code, "seconds": round(self.seconds, 3),
                "jobs": self.jobs}

    def summary(self) -> str:
        """One line, e.g. ``12 models: 10 ok, 1 unsupported, 1 invalid; 37 nodes
        decomposed in 1.9 s (exit 3)``."""
        totals = self.totals()
        parts = ", ".join(f"{count} {status}" for status, count in
                          sorted(totals["by_status"].items(), key=lambda kv: _ORDER[kv[0]]))
        verb = "checked" if self.check else "decomposed"
        noun = "model" if len(self.models) == 1 else "models"
        return (f"{len(self.models)} {noun}: {parts or 'none'}; {totals['replaced']} nodes "
                f"{'decomposable' if self.check else verb} in {self.seconds:.1f} s "
                f"(exit {self.exit_code})")

    def to_dict(self) -> dict[str, Any]:
        return {"totals": self.totals(), "models": [asdict(m) for m in self.models]}


_ORDER = {"ok": 0, "needs-engine-work": 1, "unsupported": 2, "verification": 3, "invalid": 4,
          "internal": 5, "unwritable": 6}


def collect_models(paths: Iterable[str | os.PathLike[str]]) -> list[tuple[Path, Path]]:
    """(model file, its output path relative to the output folder) for every input: a file
    keeps its name, a folder contributes every ``*.onnx`` below it (sorted) at its path
    relative to the folder. Raises ModelIOError for a missing path."""
    found: list[tuple[Path, Path]] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found += [(model, model.relative_to(path))
                      for model in sorted(path.rglob("*.onnx")) if model.is_file()]
        elif path.is_file():
            found.append((path, Path(path.name)))
        else:
            raise ModelIOError(f"{path}: no such file or folder")
    return found


def _prepare_output_folder(folder: Path, relatives: Sequence[Path]) -> None:
    """Create the output folder tree and prove it writable, before any model is read."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for parent in sorted({(folder / rel).parent for rel in relatives}):
            parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelIOError(f"{folder}: cannot create the output folder: "
                           f"{exc.strerror or exc}") from exc
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ModelIOError(f"{folder}: output folder is not writable")


# -- the per-model work (runs in the worker processes) ------------------------------------

_WORKER: dict[str, Any] = {}


def _init_worker(pattern_sources: Sequence[str], override: bool) -> None:
    """Build the registry once per process (imports and plugin loading paid once)."""
    from decomposer.plugins import load_pattern_source
    from decomposer.registry import build_registry

    registry = build_registry(override=override)
    for source in pattern_sources:
        load_pattern_source(source, registry, override=override)
    _WORKER["registry"] = registry


def _init_pool_worker(pattern_sources: Sequence[str], override: bool) -> None:
    """A pool worker ignores Ctrl-C: the parent owns the interruption, lets each worker
    finish the model it is writing (writes are atomic) and cancels the rest, so no worker
    dies between creating a temp file and renaming it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _init_worker(pattern_sources, override)


def _status(exc: BaseException) -> str:
    from decomposer.errors import CheckFailedError, PatternBugError, VerificationError

    if isinstance(exc, UnsupportedNodeError):
        return "unsupported"
    if isinstance(exc, VerificationError):
        return "verification"
    if isinstance(exc, ModelIOError):
        return "unwritable" if exc.exit_code == 5 else "invalid"
    if isinstance(exc, (CheckFailedError, PatternBugError)):
        return "internal"
    return "invalid"


def _decompose_one(source: str, target_path: str | None, options: dict[str, Any]
                   ) -> ModelResult:
    from decomposer.api import decompose_file

    started = time.perf_counter()
    result = ModelResult(source, target_path, "ok", 0)
    try:
        report = decompose_file(source, target_path, registry=_WORKER.get("registry"),
                                dry_run=target_path is None, **options)
        result.replaced = len(report.replaced)
        result.counts = dict(report.counts)
        result.unsupported = [issue.describe() for issue in report.unsupported]
    except DecomposerError as exc:
        result.status, result.exit_code = _status(exc), exc.exit_code
        result.message = " ".join(str(exc).split())
        if isinstance(exc, UnsupportedNodeError):
            result.unsupported = [issue.describe() for issue in exc.nodes]
        result.output = None
    except Exception as exc:  # a bug in a pattern or here: one line, the others go on
        result.status, result.exit_code = "internal", 4
        result.message = f"internal error: {type(exc).__name__}: {exc}"
        result.output = None
    result.seconds = round(time.perf_counter() - started, 4)
    return result


def _check_one(source: str, options: dict[str, Any], engines: Sequence[str]) -> ModelResult:
    from decomposer import engine as engine_module
    from decomposer.engine_support import engine_gaps
    from decomposer.modelio import load_model

    started = time.perf_counter()
    result = ModelResult(source, None, "ok", 0)
    try:
        model = load_model(source)
        out, report = engine_module.run(model, registry=_WORKER.get("registry"),
                                        allow_unsupported=True, check=options["check"],
                                        target=options["target"], lower=options["lower"],
                                        base_dir=Path(source).resolve().parent,
                                        target_opset=options["target_opset"])
        result.replaced = len(report.replaced)
        result.counts = dict(report.counts)
        result.unsupported = [issue.describe() for issue in report.unsupported]
        if result.unsupported:
            result.status, result.exit_code = "unsupported", 3
            result.message = f"{len(result.unsupported)} node(s) still need a plugin"
        if engines:
            result.engines = engine_gaps(out, engines)
            if result.exit_code == 0 and any(result.engines.values()):
                result.status = "needs-engine-work"
    except DecomposerError as exc:
        result.status, result.exit_code = _status(exc), exc.exit_code
        result.message = " ".join(str(exc).split())
    except Exception as exc:
        result.status, result.exit_code = "internal", 4
        result.message = f"internal error: {type(exc).__name__}: {exc}"
    result.seconds = round(time.perf_counter() - started, 4)
    return result


# -- the pool ---------------------------------------------------------------------------

def _run_all(tasks: list[tuple[Callable[..., ModelResult], tuple[Any, ...]]], jobs: int,
             init_args: tuple[Any, ...], progress: Callable[[ModelResult], None] | None
             ) -> list[ModelResult]:
    results: list[ModelResult | None] = [None] * len(tasks)
    if jobs <= 1 or len(tasks) <= 1:
        _init_worker(*init_args)
        for index, (function, args) in enumerate(tasks):
            results[index] = function(*args)
            if progress:
                progress(results[index])  # type: ignore[arg-type]
        return [r for r in results if r is not None]
    import multiprocessing
    from concurrent.futures import as_completed
    from concurrent.futures.process import BrokenProcessPool

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)

    def pool(workers: int) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=workers, mp_context=context,
                                   initializer=_init_pool_worker, initargs=init_args)

    def record(index: int, result: ModelResult) -> None:
        results[index] = result
        if progress:
            progress(result)

    pending = list(range(len(tasks)))
    executor = pool(min(jobs, len(tasks)))
    try:
        futures: dict[Future[ModelResult], int] = {
            executor.submit(tasks[i][0], *tasks[i][1]): i for i in pending}
        broken = False
        for future in as_completed(futures):
            index = futures[future]
            try:
                record(index, future.result())
            except BrokenProcessPool:
                broken = True  # a worker died (killed, out of memory, a crash in C code)
            except Exception as exc:
                record(index, ModelResult(str(tasks[index][1][0]), None, "internal", 4,
                                          f"worker failed: {type(exc).__name__}: {exc}"))
        executor.shutdown(wait=True)
        if broken:
            # Which model killed the pool is unknown: run each unfinished one alone, so the
            # culprit fails by itself and the others still finish.
            for index in [i for i in pending if results[i] is None]:
                executor = pool(1)
                try:
                    record(index, executor.submit(tasks[index][0],
                                                  *tasks[index][1]).result())
                except BrokenProcessPool:
                    record(index, ModelResult(str(tasks[index][1][0]), None, "internal", 4,
                                              "the worker process died on this model"))
                finally:
                    executor.shutdown(wait=True)
    except BaseException:
        executor.shutdown(wait=True, cancel_futures=True)
        raise
    return [r for r in results if r is not None]


def _options(target: str, lower: Iterable[str], allow_unsupported: bool, check: bool,
             target_opset: int | None = None) -> dict[str, Any]:
    return {"target": target, "lower": list(lower), "allow_unsupported": allow_unsupported,
            "check": check, "target_opset": target_opset}


def decompose_many(inputs: Iterable[str | os.PathLike[str]],
                   output_dir: str | os.PathLike[str], *, jobs: int | None = None,
                   target: str = "portable", lower: Iterable[str] = (),
                   allow_unsupported: bool = False, check: bool = True,
                   pattern_sources: Sequence[str] = (), override: bool = False,
                   progress: Callable[[ModelResult], None] | None = None,
                   target_opset: int | None = None) -> BatchReport:
    """Decompose every model of ``inputs`` into ``output_dir`` (see the module docstring).
    Raises ModelIOError (nothing written) for a missing input or an unusable output folder;
    per-model failures are in the report."""
    started = time.perf_counter()
    models = collect_models(inputs)
    folder = Path(output_dir)
    destinations = [folder / rel for _, rel in models]
    clashes = sorted({str(d) for d in destinations if destinations.count(d) > 1})
    if clashes:
        raise ModelIOError(f"two inputs would be written to {clashes[0]}; give them "
                           "different names or separate runs")
    _prepare_output_folder(folder, [rel for _, rel in models])
    options = _options(target, lower, allow_unsupported, check, target_opset)
    tasks = [(_decompose_one, (str(src), str(dst), options))
             for (src, _), dst in zip(models, destinations, strict=True)]
    workers = jobs or os.cpu_count() or 1
    try:
        results = _run_all(tasks, workers, (tuple(pattern_sources), override), progress)
    except BaseException:
        _remove_temp_files(destinations)  # Ctrl-C in the single-process path, mid-write
        raise
    return BatchReport(results, time.perf_counter() - started, workers)


def _remove_temp_files(destinations: Sequence[Path]) -> None:
    """Remove the temp files ``save_model`` makes next to each destination (``.<name>.*``
    ending in ``.tmp``) that an interruption left behind."""
    for destination in destinations:
        for leftover in destination.parent.glob(f".{glob.escape(destination.name)}.*.tmp"):
            leftover.unlink(missing_ok=True)


def check_many(inputs: Iterable[str | os.PathLike[str]], *, engines: Sequence[str] = (),
               jobs: int | None = None, target: str = "portable", lower: Iterable[str] = (),
               check: bool = True, pattern_sources: Sequence[str] = (),
               override: bool = False,
               progress: Callable[[ModelResult], None] | None = None,
               target_opset: int | None = None) -> BatchReport:
    """Report, writing nothing, which models still need a plugin (status "unsupported",
    exit 3) and, for ``engines``, which standard ops each engine lacks in the decomposed
    model (status "needs-engine-work", exit 0: the ``--lower`` fix is in the entry)."""
    from decomposer.engine_support import known_engines

    unknown = sorted(set(engines) - set(known_engines()))
    if unknown:
        from decomposer.errors import InvalidModelError

        raise InvalidModelError(f"unknown engine(s) {unknown}; known: "
                                f"{', '.join(known_engines())}")
    started = time.perf_counter()
    models = collect_models(inputs)
    options = _options(target, lower, True, check, target_opset)
    tasks = [(_check_one, (str(src), options, tuple(engines))) for src, _ in models]
    workers = jobs or os.cpu_count() or 1
    results = _run_all(tasks, workers, (tuple(pattern_sources), override), progress)
    return BatchReport(results, time.perf_counter() - started, workers, check=True)
