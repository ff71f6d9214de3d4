"""Calibration statistics across processes (``torch.distributed``).

When a default process group is initialised and has more than one rank,
:meth:`EncodingAnalyzer.compute_encodings()
<quanta.quantization.encoding_analyzer.EncodingAnalyzer.compute_encodings>`
reduces its statistics over all ranks before computing the range, so every rank
ends with the same encodings, equal to a single process that saw all the data:

* min/max: ``all_reduce(MIN)`` / ``all_reduce(MAX)``;
* histograms: the ranges are reduced first, every rank re-bins its histogram
  onto the common bins (exactly, see :mod:`quanta.kernels.histograms`), and the
  counts are summed with ``all_reduce(SUM)``.

``compute_encodings()`` is then a collective: every rank must call it, for the
same quantizers in the same order (as for any ``all_reduce``). A rank that saw
no data takes part with empty statistics. Inside :func:`local_statistics` no
reduction happens.

>>> is_active()   # no process group in a doctest
False
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

import torch
import torch.distributed as dist

from quanta.kernels.histograms import Histograms, _start, align, required_exponent

__all__ = ["is_active", "local_statistics", "any_rank", "all_reduce_min_max", "all_reduce_histograms"]

_local = threading.local()


def is_active() -> bool:
    """True when statistics are reduced: an initialised default process group with more than one rank."""
    if getattr(_local, "depth", 0):
        return False
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


@contextlib.contextmanager
def local_statistics() -> Iterator[None]:
    """Within the block, ``compute_encodings()`` uses this process's statistics only (no collective).

    >>> with local_statistics():
    ...     is_active()
    False
    """
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def any_rank(flag: bool) -> bool:
    """True on every rank if ``flag`` is True on at least one rank."""
    t = torch.tensor([int(bool(flag))], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def all_reduce_min_max(min: torch.Tensor, max: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Elementwise minimum of ``min`` and maximum of ``max`` over all ranks (new tensors)."""
    lo, hi = min.detach().clone().contiguous(), max.detach().clone().contiguous()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    return lo, hi


def all_reduce_histograms(hist: Histograms) -> Histograms:
    """The histograms of all ranks' values together, on every rank (bit for bit a single-process result).

    Every rank must pass histograms with the same number of rows and bins.
    """
    lo, hi = all_reduce_min_max(hist.min, hist.max)
    e = hist.exponent.clone()
    dist.all_reduce(e, op=dist.ReduceOp.MAX)
    e = torch.maximum(e, required_exponent(lo, hi, hist.num_bins))
    start = _start(lo, e)
    counts = align(hist, e, start).counts.clone(memory_format=torch.contiguous_format)  # all_reduce writes in place
    dist.all_reduce(counts, op=dist.ReduceOp.SUM)
    return Histograms(counts, e, start, lo, hi)
