"""Search analyzers: SQNR (AIMET's), MSE and entropy (KL) over candidate encodings scored on histograms.

Each scores a finite set of candidate encodings per histogram with
:mod:`quanta.kernels.histogram_search` (bin midpoints quantized by the affine
kernels, weighted by the bin counts) and keeps the best one. All histograms are
searched together, in bounded blocks.
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from quanta.calibration.histogram import (
    HistogramEncodingAnalyzer,
    _check_int,
    _check_optional_int,
    _check_real,
)
from quanta.grids.affine import IntegerGrid
from quanta.kernels import histogram_search as hs
from quanta.kernels.histograms import Histograms
from quanta.kernels.qparams import calibrated_range

__all__ = ["SqnrEncodingAnalyzer", "MseEncodingAnalyzer", "EntropyEncodingAnalyzer"]


def _last_argmin(err: torch.Tensor) -> torch.Tensor:
    """Index of the last minimum per row (the widest candidate among equals), ``(H, 1)``."""
    k = err.shape[1]
    return (k - 1 - torch.argmin(err.flip(1), dim=1))[:, None]


class SqnrEncodingAnalyzer(HistogramEncodingAnalyzer):
    r"""SQNR calibration (AIMET's): the delta/offset pair of least expected noise on the histogram.

    Candidates (:func:`~quanta.kernels.histogram_search.sqnr_candidates`):
    symmetric, ``symmetric_delta_candidates`` deltas up to ``2 * max|x| / N``
    with the symmetric offset; asymmetric, ``asymmetric_delta_candidates``
    deltas times ``offset_candidates`` offsets (plus the observed offset), each
    clipped to the observed range. The noise of a candidate is
    ``sum_j c_j * g_j * (QDQ(m_j) - m_j)**2`` over the bins (midpoint ``m_j``,
    count ``c_j``), with ``g_j = gamma`` for clipped bins and 1 otherwise
    (:func:`~quanta.kernels.histogram_search.squared_error`; higher ``gamma``
    clips less). The first candidate of least noise wins, and the range is
    ``min = o * delta``, ``max = min + N * delta``. A histogram without a non-zero
    value gets the MinMax range of zero; one whose candidates cannot be ranked in
    float32 (values near the float32 limits, such as an additive attention mask's
    ``finfo.min``) gets its MinMax range.

    Args:
        shape: shape of the statistics (the quantizer's ``shape``).
        num_bins: bins per histogram. Default 2048.
        asymmetric_delta_candidates: deltas searched for asymmetric encodings (>= 2). Default 17.
        symmetric_delta_candidates: deltas searched for symmetric encodings (>= 2). Default 101.
        offset_candidates: offsets searched for asymmetric encodings (>= 3). Default 21.
        max_parallelism: at most this many histograms are scored at once (None: as many as
            fit a block of ``2**22`` evaluated bins). Only memory and speed depend on it.
        gamma: weight of clipping noise. Default 3.0.
        histogram_growth_limit: see :class:`HistogramEncodingAnalyzer`.
        block_size: the quantizer's block size, or None.

    >>> a = SqnrEncodingAnalyzer(shape=())
    >>> _ = a.update_stats(torch.cat([torch.linspace(-1, 1, 4001), torch.tensor([8.0])]))
    >>> a.compute_encodings(num_steps=15, is_symmetric=False)   # 4 bits: the outlier is clipped
    (tensor(-0.8250), tensor(5.3625))
    """

    def __init__(self, shape: tuple[int, ...], num_bins: int = 2048, *, asymmetric_delta_candidates: int = 17,
                 symmetric_delta_candidates: int = 101, offset_candidates: int = 21,
                 max_parallelism: int | None = None, gamma: float = 3.0,
                 histogram_growth_limit: float | None = None, block_size: tuple[int, ...] | None = None) -> None:
        super().__init__(shape, num_bins, block_size, histogram_growth_limit=histogram_growth_limit)
        self.asymmetric_delta_candidates = _check_int("asymmetric_delta_candidates", asymmetric_delta_candidates, 2)
        self.symmetric_delta_candidates = _check_int("symmetric_delta_candidates", symmetric_delta_candidates, 2)
        self.offset_candidates = _check_int("offset_candidates", offset_candidates, 3)
        self.max_parallelism = _check_optional_int("max_parallelism", max_parallelism, 1)
        self.gamma = _check_real("gamma", gamma)
        if not self.gamma > 0:
            raise ValueError(f"gamma must be positive, got {gamma}")

    def candidates(self, stats: Histograms, num_steps: int, is_symmetric: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(delta, offset)`` candidates, each ``(H, K)``, for grid ``[0, num_steps]``."""
        lo, hi, _ = self._observed(stats)
        return hs.sqnr_candidates(lo, hi, num_steps, is_symmetric,
                                  asymmetric_delta_candidates=self.asymmetric_delta_candidates,
                                  symmetric_delta_candidates=self.symmetric_delta_candidates,
                                  offset_candidates=self.offset_candidates)

    def compute_encodings_from_stats(self, stats: Histograms, num_steps: int, is_symmetric: bool
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
        deltas, offsets = self.candidates(stats, num_steps, is_symmetric)
        noise = hs.squared_error(stats, deltas, offsets, IntegerGrid(0, num_steps), gamma=self.gamma,
                                 max_rows=self.max_parallelism)
        # NaN (an empty bin times an overflowed square) ranks last; argmin would take it first
        noise = torch.nan_to_num(noise, nan=float("inf"))
        best = torch.argmin(noise, dim=1)[:, None]  # the first of equals, as AIMET
        delta, offset = deltas.gather(1, best).squeeze(1), offsets.gather(1, best).squeeze(1)
        lo = offset * delta
        hi = lo + num_steps * delta
        o_lo, o_hi, has_width = self._observed(stats)
        # values near the float32 limits (an additive attention mask's finfo.min) overflow the float32 noise or
        # the candidates themselves: no candidate can be ranked, and the observed (MinMax) range is taken
        ranked = torch.isfinite(noise.gather(1, best).squeeze(1)) & torch.isfinite(lo) & torch.isfinite(hi)
        m_lo, m_hi = calibrated_range(o_lo, o_hi, num_steps, is_symmetric)
        lo, hi = torch.where(ranked, lo, m_lo), torch.where(ranked, hi, m_hi)
        zero = torch.zeros_like(lo)
        z_lo, z_hi = calibrated_range(zero, zero, num_steps, is_symmetric)
        return self._shaped(torch.where(has_width, lo, z_lo), torch.where(has_width, hi, z_hi))

    def _extra_repr(self) -> str:
        return f", gamma={self.gamma:g}"


class _RangeSearchAnalyzer(HistogramEncodingAnalyzer):
    """Shared by MSE and entropy: clipped ranges, scored, the last best one kept."""

    def __init__(self, shape: tuple[int, ...], num_bins: int = 2048, *, symmetric_candidates: int = 100,
                 asymmetric_candidates: int = 20, max_parallelism: int | None = None,
                 histogram_growth_limit: float | None = None, block_size: tuple[int, ...] | None = None) -> None:
        super().__init__(shape, num_bins, block_size, histogram_growth_limit=histogram_growth_limit)
        self.symmetric_candidates = _check_int("symmetric_candidates", symmetric_candidates, 1)
        self.asymmetric_candidates = _check_int("asymmetric_candidates", asymmetric_candidates, 1)
        self.max_parallelism = _check_optional_int("max_parallelism", max_parallelism, 1)

    def candidates(self, stats: Histograms, num_steps: int, is_symmetric: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """The candidate ranges ``(min, max)``, each ``(H, K)`` (the last is the MinMax range)."""
        lo, hi, _ = self._observed(stats)
        return hs.shrink_candidates(lo, hi, num_steps, is_symmetric, symmetric_candidates=self.symmetric_candidates,
                                    asymmetric_candidates=self.asymmetric_candidates)

    @abstractmethod
    def _score(self, stats: Histograms, scale: torch.Tensor, offset: torch.Tensor,
               grid: IntegerGrid) -> torch.Tensor:
        """``(H, K)`` scores of the candidates (lower is better)."""

    def _valid(self, stats: Histograms, lo: torch.Tensor, hi: torch.Tensor, num_steps: int) -> torch.Tensor:
        """Which candidates may be chosen (all, unless a subclass says otherwise)."""
        return torch.ones(lo.shape, dtype=torch.bool)

    def compute_encodings_from_stats(self, stats: Histograms, num_steps: int, is_symmetric: bool
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
        c_lo, c_hi = self.candidates(stats, num_steps, is_symmetric)
        grid = hs.range_grid(num_steps, is_symmetric)
        scale, offset = hs.encodings_of_ranges(c_lo, c_hi, grid, is_symmetric)
        valid = self._valid(stats, c_lo, c_hi, num_steps)
        valid[:, -1] = True  # the MinMax range is always allowed
        err = torch.full(valid.shape, torch.inf, dtype=torch.float64)
        cols = valid.any(dim=0).nonzero().squeeze(1)  # candidates no histogram may choose are not scored
        err[:, cols] = self._score(stats, scale[:, cols], offset[:, cols], grid)
        err = torch.where(valid, err, torch.inf)
        err[:, -1] = torch.where(torch.isfinite(err[:, -1]), err[:, -1], 0.0)
        best = _last_argmin(err)
        return self._shaped(c_lo.gather(1, best).squeeze(1), c_hi.gather(1, best).squeeze(1))

    def _extra_repr(self) -> str:
        return f", symmetric_candidates={self.symmetric_candidates}, asymmetric_candidates={self.asymmetric_candidates}"


class MseEncodingAnalyzer(_RangeSearchAnalyzer):
    r"""MSE calibration: of a grid of clipped ranges, the one of least expected squared error.

    Candidates (:func:`~quanta.kernels.histogram_search.shrink_candidates`): the
    observed range (zero included) shrunk by ``k / S`` for ``k = 1..S``
    (symmetric), or with its lower end shrunk by ``i / A`` and its upper end by
    ``j / A`` independently (asymmetric, ``A**2`` pairs), each passed through
    the MinMax rules; the last candidate is the MinMax range. A candidate's
    error is ``sum_j c_j * (QDQ(m_j) - m_j)**2`` over the bins (midpoint ``m_j``,
    count ``c_j``), quantized with exactly the scale and offset a quantizer
    derives from that range (:func:`~quanta.kernels.histogram_search.squared_error`).
    The last of the least-error candidates wins (for symmetric ranges, the widest).

    Args:
        shape: shape of the statistics (the quantizer's ``shape``).
        num_bins: bins per histogram. Default 2048.
        symmetric_candidates: ``S``, ranges searched for symmetric encodings (>= 1). Default 100.
        asymmetric_candidates: ``A``, fractions per end for asymmetric encodings (>= 1). Default 20.
        max_parallelism: at most this many histograms scored at once (None: automatic).
        histogram_growth_limit: see :class:`HistogramEncodingAnalyzer`.
        block_size: the quantizer's block size, or None.

    >>> a = MseEncodingAnalyzer(shape=())
    >>> _ = a.update_stats(torch.cat([torch.linspace(-1, 1, 4001), torch.tensor([8.0])]))
    >>> a.compute_encodings(num_steps=15, is_symmetric=False)   # 4 bits: the outlier is clipped
    (tensor(-1.), tensor(2.4000))
    """

    def _score(self, stats: Histograms, scale: torch.Tensor, offset: torch.Tensor,
               grid: IntegerGrid) -> torch.Tensor:
        return hs.squared_error(stats, scale, offset, grid, max_rows=self.max_parallelism)


class EntropyEncodingAnalyzer(_RangeSearchAnalyzer):
    r"""Entropy calibration: of a grid of clipped ranges, the one of least KL divergence.

    The candidates are those of :class:`MseEncodingAnalyzer`. A candidate's
    score is ``KL(P || Q)`` (:func:`~quanta.kernels.histogram_search.kl_divergence`):
    ``P`` is the histogram with the clipped bins' counts moved into the first or
    last unclipped bin, ``Q`` spreads the unclipped count of each quantization
    cell evenly over its bins — TensorRT's entropy calibration, carried over
    from ``|x|`` to signed, asymmetric ranges. As TensorRT's ``start_bin``, a
    candidate must span at least ``num_steps`` bins (otherwise every cell holds
    at most one bin and KL sees only the clipping); the MinMax range is always
    allowed. The last of the least-divergence candidates wins.

    KL measures how well the *shape* of the distribution survives, not the
    error: on heavy-tailed data it often clips more than MSE would (see
    docs/guides/calibrate.md).

    Args:
        shape: shape of the statistics (the quantizer's ``shape``).
        num_bins: bins per histogram. Default 2048.
        symmetric_candidates: ranges searched for symmetric encodings (>= 1). Default 100.
        asymmetric_candidates: fractions per end for asymmetric encodings (>= 1). Default 20.
        max_parallelism: at most this many histograms scored at once (None: automatic).
        histogram_growth_limit: see :class:`HistogramEncodingAnalyzer`.
        block_size: the quantizer's block size, or None.

    >>> a = EntropyEncodingAnalyzer(shape=())
    >>> _ = a.update_stats(torch.cat([torch.linspace(-1, 1, 4001), torch.tensor([8.0])]))
    >>> a.compute_encodings(num_steps=15, is_symmetric=False)
    (tensor(-0.9000), tensor(8.))
    """

    def _score(self, stats: Histograms, scale: torch.Tensor, offset: torch.Tensor,
               grid: IntegerGrid) -> torch.Tensor:
        return hs.kl_divergence(stats, scale, offset, grid, max_rows=self.max_parallelism)

    def _valid(self, stats: Histograms, lo: torch.Tensor, hi: torch.Tensor, num_steps: int) -> torch.Tensor:
        # each quantization cell must hold at least one bin, or Q equals P and KL only sees the clipping
        return (hi - lo).double() >= num_steps * stats.width()[:, None]
