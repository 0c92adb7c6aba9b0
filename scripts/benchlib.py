"""What every benchmark script shares: the ORT session setup and the measuring loop.

In: named variants (callables that run one inference, such as an :class:`OrtRunner`), the
baseline's name, a number of rounds, and a timer ``timer(fn, repeats) -> seconds per call``
(:func:`time_calls`).
Out: per variant, the repeats used and the per-round times and ratios to the baseline, taken
in interleaved rounds in a shuffled (seeded) order, so that drift and noise on a small
shared machine hit every variant alike. Scripts take medians of these.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

Timer = Callable[[Callable[[], object], int], float]


def interleaved_rounds(variants: Mapping[str, Callable[[], object]], baseline: str, rounds: int,
                       timer: Timer) -> tuple[dict[str, int], dict[str, list[float]],
                                              dict[str, list[float]]]:
    """(repeats, times, ratios) per variant; see the module docstring."""
    # Calibrate repeats per variant so one timing is ~20 ms of its own work (a variant
    # 100x slower than the baseline must not take 100x the benchmark's time).
    repeats = {}
    for name, fn in variants.items():
        timer(fn, 1)  # warm-up
        once = timer(fn, 2)
        repeats[name] = max(1, min(200, int(0.02 / max(once, 1e-6))))
    times: dict[str, list[float]] = {name: [] for name in variants}
    ratios: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    shuffler = random.Random(0)
    for _ in range(rounds):
        shuffler.shuffle(order)
        this_round = {name: timer(variants[name], repeats[name]) for name in order}
        for name, seconds in this_round.items():
            times[name].append(seconds)
            ratios[name].append(seconds / this_round[baseline])
    return repeats, times, ratios


def time_calls(fn: Callable[[], object], repeat: int,
               clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call of ``fn`` over ``repeat`` calls, by ``clock``."""
    start = clock()
    for _ in range(repeat):
        fn()
    return (clock() - start) / repeat


class OrtRunner:
    """One ONNX Runtime CPU session set up for timing: ``threads`` intra-op threads, spinning
    off (it distorts 2-thread figures several-fold here), feeds pre-made as OrtValues (those
    the model takes), ``outputs`` (default: all) fetched per call, and any further session
    ``config`` entries."""

    def __init__(self, model: onnx.ModelProto, feeds: Mapping[str, np.ndarray], threads: int,
                 outputs: Sequence[str] | None = None,
                 config: Mapping[str, str] | None = None) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        for key, value in (config or {}).items():
            options.add_session_config_entry(key, value)
        options.log_severity_level = 4  # failures are raised and reported, not logged
        self.session = ort.InferenceSession(model.SerializeToString(), options,
                                            providers=["CPUExecutionProvider"])
        names = {i.name for i in self.session.get_inputs()}
        self.feeds = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()
                      if k in names}
        self.outputs = list(outputs) if outputs is not None else \
            [o.name for o in self.session.get_outputs()]
        self.run_options = ort.RunOptions()

    def __call__(self) -> None:
        self.session.run_with_ort_values(self.outputs, self.feeds, self.run_options)

    def results(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.session.run_with_ort_values(
            self.outputs, self.feeds, self.run_options)]

    def result(self) -> np.ndarray:
        return self.results()[0]
