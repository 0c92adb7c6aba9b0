"""The measuring loop every benchmark script shares.

In: named variants (callables that run one inference), the baseline's name, a number of
rounds, and a timer ``timer(fn, repeats) -> seconds per call``.
Out: per variant, the repeats used and the per-round times and ratios to the baseline, taken
in interleaved rounds in a shuffled (seeded) order, so that drift and noise on a small
shared machine hit every variant alike. Scripts take medians of these.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

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
