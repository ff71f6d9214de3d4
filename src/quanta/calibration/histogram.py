"""Histogram-based analyzers: the shared streaming histogram, and percentile calibration."""

from __future__ import annotations

import numbers
import warnings

import torch

from quanta import distributed
from quanta.calibration.base import EncodingAnalyzer, _check_input
from quanta.kernels import histograms as hk
from quanta.kernels.histograms import Histograms
from quanta.kernels.qparams import calibrated_range

__all__ = ["HistogramEncodingAnalyzer", "PercentileEncodingAnalyzer"]


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def _check_optional_int(name: str, value: object, minimum: int) -> int | None:
    return None if value is None else _check_int(name, value, minimum)


def _check_real(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    return float(value)


class HistogramEncodingAnalyzer(EncodingAnalyzer[Histograms]):
    """Base of the analyzers that keep one histogram per scale entry (per tensor, channel or block).

    The histograms (:class:`quanta.kernels.histograms.Histograms`, one row per
    entry of ``shape``) are built for all entries at once, with no loop over
    channels, on CPU. Streaming is exact: bins have a power-of-two width
    anchored at zero, and when a batch widens a histogram's range the width
    doubles and old bins merge pairwise, so the statistics after any sequence
    of batches equal those of all the data in one batch. Memory is
    ``prod(shape) * num_bins`` int64 counts, whatever the number of batches.

    Growth limit: with ``histogram_growth_limit=g`` (AIMET's option, at least 1),
    each histogram's range may grow to at most ``[min0 - g * r0 / 2, max0 + g * r0 / 2]``,
    where ``[min0, max0]`` is the range of the first batch that had a value for
    that entry and ``r0 = max0 - min0`` (``[c - 0.5, c + 0.5]`` for a constant
    ``c``, as AIMET). Later values beyond the limit are clamped into it, so a
    rare huge outlier cannot wipe out the histogram's resolution. None (the
    default) sets no limit. Note that the limit depends on which batch came
    first; under ``torch.distributed`` each rank sets it from its own first
    batch, so only without a limit do ranks reproduce a single-process run exactly.

    NaN and ``+-inf`` are left out of the histograms, with a warning (AIMET
    counts infinities in the end bins). An entry that never saw a finite value
    calibrates like one that saw only zeros.

    Args:
        shape: shape of the statistics (the quantizer's ``shape``).
        num_bins: bins per histogram (at least 2).
        block_size: the quantizer's block size, or None.
        histogram_growth_limit: see above; None or a number >= 1.
    """

    def __init__(self, shape: tuple[int, ...], num_bins: int = 2048, block_size: tuple[int, ...] | None = None, *,
                 histogram_growth_limit: float | None = None) -> None:
        super().__init__(shape, block_size)
        self.num_bins = _check_int("num_bins", num_bins, 2)
        if histogram_growth_limit is not None:
            histogram_growth_limit = _check_real("histogram_growth_limit", histogram_growth_limit)
            if not histogram_growth_limit >= 1.0:
                raise ValueError(f"histogram_growth_limit must be at least 1.0 (or None), got {histogram_growth_limit}")
        self.histogram_growth_limit = histogram_growth_limit
        self._limits: tuple[torch.Tensor, torch.Tensor] | None = None

    def reset_stats(self) -> None:
        """Forget every batch seen so far (and the growth limits they set)."""
        super().reset_stats()
        self._limits = None

    def update_stats(self, input: torch.Tensor) -> Histograms | None:
        """Add one batch to the histograms; returns the batch's own histograms (None for an empty batch)."""
        batch = self._batch_stats(input, limits=self._limits)
        if batch is None:
            return None
        self.stats = batch if self.stats is None else hk.merge(self.stats, batch)
        if self.histogram_growth_limit is not None:
            self._set_limits(batch)
        return batch

    def _set_limits(self, batch: Histograms) -> None:
        h = self.num_entries
        if self._limits is None:
            self._limits = (torch.full((h,), torch.nan), torch.full((h,), torch.nan))
        lo_lim, hi_lim = self._limits
        new = torch.isnan(lo_lim) & batch.seen()
        if not bool(new.any()):
            return
        lo0, hi0 = batch.min, batch.max
        flat = lo0 == hi0
        lo0, hi0 = torch.where(flat, lo0 - 0.5, lo0), torch.where(flat, hi0 + 0.5, hi0)
        half = (hi0 - lo0) * self.histogram_growth_limit / 2
        self._limits = (torch.where(new, lo0 - half, lo_lim), torch.where(new, hi0 + half, hi_lim))

    def _batch_stats(self, input: torch.Tensor, limits: tuple[torch.Tensor, torch.Tensor] | None = None
                     ) -> Histograms | None:
        input = _check_input(self, input)
        layout = self._layout(input)
        if input.numel() == 0:
            return None
        hist, ignored = hk.histogram(hk.rows_of(input, layout), self.num_bins, limits=limits)
        if ignored:
            warnings.warn(f"{type(self).__name__}: ignoring {ignored} non-finite input values (NaN/inf)",
                          RuntimeWarning, stacklevel=4)
        return hist

    def _merge(self, a: Histograms, b: Histograms) -> Histograms:
        return hk.merge(a, b)

    def _empty_stats(self) -> Histograms:
        return hk.empty(self.num_entries, self.num_bins)

    def _all_reduce(self, stats: Histograms) -> Histograms:
        return distributed.all_reduce_histograms(stats)

    def _observed(self, stats: Histograms) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(min, max, has_width)`` per row: the observed range (0 where nothing was seen) and whether it is non-zero."""
        seen = stats.seen()
        lo = torch.where(seen, stats.min, 0.0)
        hi = torch.where(seen, stats.max, 0.0)
        return lo, hi, stats.exponent != hk.NO_WIDTH

    def _shaped(self, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return lo.reshape(self.shape), hi.reshape(self.shape)

    def __repr__(self) -> str:
        block = f", block_size={self.block_size}" if self.block_size is not None else ""
        return f"{type(self).__name__}(shape={self.shape}, num_bins={self.num_bins}{block}{self._extra_repr()})"

    def _extra_repr(self) -> str:
        return ""


class PercentileEncodingAnalyzer(HistogramEncodingAnalyzer):
    r"""Percentile calibration: clip the ``(100 - p)`` percent largest and smallest values (AIMET's rule).

    Per histogram, ``max`` is the lower edge of the first bin whose cumulative
    count reaches ``p``% of the total, ``min`` the lower edge of the first bin
    whose cumulative count reaches ``(100 - p)``%, both kept inside the observed
    ``[min, max]``; ``p = 100`` gives exactly the observed ``[min, max]`` (the
    MinMax range). The range then goes through the MinMax rules (zero included,
    degenerate ranges widened, symmetric centring: :func:`~quanta.kernels.qparams.calibrated_range`).

    Args:
        shape: shape of the statistics (the quantizer's ``shape``).
        num_bins: bins per histogram. Default 2048.
        percentile: ``p`` in ``[50, 100]``. Default 100.
        block_size: the quantizer's block size, or None.
        histogram_growth_limit: see :class:`HistogramEncodingAnalyzer`.

    >>> a = PercentileEncodingAnalyzer(shape=(), num_bins=128, percentile=99)
    >>> _ = a.update_stats(torch.arange(-50.0, 51.0))
    >>> a.compute_encodings(num_steps=255, is_symmetric=False)
    (tensor(-49.), tensor(49.))
    """

    def __init__(self, shape: tuple[int, ...], num_bins: int = 2048, percentile: float = 100,
                 block_size: tuple[int, ...] | None = None, *, histogram_growth_limit: float | None = None) -> None:
        super().__init__(shape, num_bins, block_size, histogram_growth_limit=histogram_growth_limit)
        self.set_percentile(percentile)

    def set_percentile(self, percentile: float) -> None:
        """Set ``p`` (a number in ``[50, 100]``; ValueError otherwise)."""
        percentile = _check_real("percentile", percentile)
        if not 50 <= percentile <= 100:
            raise ValueError(f"percentile must be within [50, 100], got {percentile}")
        self.percentile = percentile

    def compute_encodings_from_stats(self, stats: Histograms, num_steps: int, is_symmetric: bool
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
        lo, hi = hk.percentile_range(stats, self.percentile)
        return self._shaped(*calibrated_range(lo, hi, num_steps, is_symmetric))

    def _extra_repr(self) -> str:
        return f", percentile={self.percentile:g}"
