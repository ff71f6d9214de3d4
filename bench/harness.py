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
          warmup: int = 2) -> tuple[float, float, float]:
    """Median ratio candidate/baseline over interleaved pairs, plus both median times (seconds)."""
    for _ in range(warmup):
        candidate()
        baseline()
    ratios, tc, tb = [], [], []
    for _ in range(pairs):
        c = _once(candidate)
        b = _once(baseline)
        ratios.append(c / b)
        tc.append(c)
        tb.append(b)
    return statistics.median(ratios), statistics.median(tc), statistics.median(tb)
