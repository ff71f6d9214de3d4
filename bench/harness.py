"""Timing harness for quanta's benchmarks: ratios against a baseline measured in the same run.

The machine is shared and noisy, so absolute times mean little. Each case is
timed in interleaved pairs (candidate, baseline, candidate, baseline, ...) and
the reported figure is the median of the per-pair ratios.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable


def _once(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def ratio(candidate: Callable[[], object], baseline: Callable[[], object], *, pairs: int = 15,
          warmup: int = 2, rerun: bool = False) -> tuple[float, float, float]:
    """Median ratio candidate/baseline over interleaved pairs, plus both median times (seconds).

    ``rerun=True`` runs each side once untimed right before its timed run, so
    both are timed with their own data in cache: without it, a baseline that
    reads the candidate's data (e.g. the same weight) finds it warm and looks
    faster than it is.
    """
    for _ in range(warmup):
        candidate()
        baseline()
    ratios, tc, tb = [], [], []
    for _ in range(pairs):
        if rerun:
            candidate()
        c = _once(candidate)
        if rerun:
            baseline()
        b = _once(baseline)
        ratios.append(c / b)
        tc.append(c)
        tb.append(b)
    return statistics.median(ratios), statistics.median(tc), statistics.median(tb)
