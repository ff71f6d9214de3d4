"""Histogram calibration of ``|x|``: entropy (KL divergence), MSE and percentile, per tensor or per axis.

Each amax entry (one per tensor, or one per index of the kept axes) has its own
histogram of ``|x|`` over ``[0, width * nbins)`` with uniform bins. The first
batch with a non-zero value sets ``width = max|x| / num_bins``; values on the
upper edge fall in the last bin. When a later batch exceeds the range the
histogram grows (``grow_method``):

* ``"append"`` (NVIDIA's behaviour): bins of the same width are appended until
  the range covers the new maximum (the bin count grows);
* ``"stretch"``: the bin width doubles, adjacent bins merging pairwise, until
  the range covers the new maximum (the bin count stays ``num_bins``).

Either way the counts stay exact integers. ``compute_amax(method, ...)``:

* ``"percentile"``: the upper edge of the first bin where the cumulative count
  reaches ``percentile``% of the total, so at least that fraction of ``|x|``
  lies within amax. (NVIDIA returns that bin's *lower* edge, which for
  ``percentile=100`` is below the maximum; quanta's is one bin width higher.)
* ``"entropy"`` (TensorRT's KL calibration): for every candidate bin count
  ``i`` in ``start_bin, start_bin + stride, ... <= nbins``, the reference
  distribution ``P`` is the first ``i`` bins with the outliers (bins ``>= i``)
  added to bin ``i - 1``; ``Q`` merges the first ``i`` bins into
  ``2**(num_bits - 1 + unsigned)`` groups (bin ``j`` goes to group
  ``floor(j * groups / i)``) and spreads each group's count evenly over its
  non-empty bins. Bin 0 is replaced by bin 1 first (it mostly counts zeros).
  ``amax = width * i`` for the ``i`` of least ``KL(P || Q)``, the last one on
  ties.
* ``"mse"``: for every candidate bin centre ``c_i`` (``i`` in ``start_bin,
  start_bin + stride, ... < nbins``), the error
  ``sum_j count_j * (fake_tensor_quant(c_j, amax=c_i) - c_j)**2`` over the bin
  centres (narrow range, as NVIDIA); ``amax`` is the candidate of least error,
  the first one on ties. FP8 quantizers use the e4m3 fake quant. Runs on CPU
  (NVIDIA's needs CUDA).

Everything works per axis, vectorised over the channels. A channel with fewer
bins than ``start_bin`` gets the top of its range; one that saw only zeros gets 0.
NaN and inf are ignored with a warning; a batch without any finite value is a
ValueError.
"""

from __future__ import annotations

import enum
import numbers

import numpy as np
import torch

from quanta.kernels.amax_quant import fake_e4m3_quant, fake_tensor_quant, is_fp8
from quanta.tensor_quant.calib.calibrator import Calibrator

__all__ = ["HistogramCalibrator", "HistogramMethod", "GrowMethod"]

#: Most bins one histogram may grow to with ``grow_method="append"``.
MAX_APPEND_BINS = 2**20
# Upper bound on elements of the (channels, candidates, bins) block evaluated at once by the MSE search.
_MSE_BLOCK = 2**22


class HistogramMethod(str, enum.Enum):
    """How :meth:`HistogramCalibrator.compute_amax` turns a histogram into amax."""

    ENTROPY = "entropy"
    MSE = "mse"
    PERCENTILE = "percentile"


class GrowMethod(str, enum.Enum):
    """How a histogram grows when a batch exceeds its range."""

    APPEND = "append"
    STRETCH = "stretch"


def _enum(cls, value, name):
    try:
        return cls(value)
    except ValueError:
        choices = ", ".join(repr(m.value) for m in cls)
        raise ValueError(f"{name} must be one of {choices}, got {value!r}") from None


def _positive_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


class HistogramCalibrator(Calibrator):
    """Collects histograms of ``|x|`` and computes amax by entropy, MSE or percentile.

    Args:
        num_bits, axis, unsigned: as in :class:`~quanta.tensor_quant.calib.calibrator.Calibrator`
            (NVIDIA's supports ``axis=None`` only; quanta supports any axis).
        num_bins: bins of a new histogram. Default 2048.
        grow_method: ``"append"`` (default; also for None, as NVIDIA) or ``"stretch"``.
        skip_zeros: leave exact zeros out of the histogram.
        torch_hist: accepted for compatibility with NVIDIA's signature and ignored
            (quanta always bins with torch, on CPU).

    >>> c = HistogramCalibrator(8, None, False, num_bins=4)
    >>> c.collect(torch.tensor([0.5, 1.0, 1.5, 2.0, 4.0]))
    >>> counts, edges = c.histogram()
    >>> counts.tolist(), edges.tolist()
    ([[1, 2, 1, 1]], [[0.0, 1.0, 2.0, 3.0, 4.0]])
    >>> c.compute_amax("percentile", percentile=80)
    tensor(3.)
    """

    def __init__(self, num_bits, axis, unsigned, num_bins: int = 2048, grow_method: str | GrowMethod | None = "append",
                 skip_zeros: bool = False, torch_hist: bool = True) -> None:
        super().__init__(num_bits, axis, unsigned)
        self._num_bins = _positive_int("num_bins", num_bins, 1)
        self._grow = GrowMethod.APPEND if grow_method is None else _enum(GrowMethod, grow_method, "grow_method")
        self._skip_zeros = bool(skip_zeros)
        del torch_hist  # accepted for NVIDIA compatibility; quanta always bins with torch
        self.reset()

    def reset(self) -> None:
        """Forget every batch seen so far."""
        self._hist: torch.Tensor | None = None  # (C, B) int64 counts
        self._width: torch.Tensor | None = None  # (C,) float64 bin width, 0 while only zeros were seen
        self._nbins: torch.Tensor | None = None  # (C,) int64 bins in use per channel
        self._reset_shape()

    # -- collection ----------------------------------------------------------------------------------------
    def collect(self, x: torch.Tensor) -> None:
        """Add one batch's ``|x|`` to the histograms, growing their ranges if needed."""
        rows = self._prepare(x)
        if rows is None:
            return
        rows = rows.cpu()
        valid = torch.isfinite(rows)
        if self._skip_zeros:
            valid &= rows != 0
        v = torch.where(valid, rows.abs().double(), torch.zeros((), dtype=torch.float64))
        c = v.shape[0]
        if self._hist is None:
            self._hist = torch.zeros(c, self._num_bins, dtype=torch.int64)
            self._width = torch.zeros(c, dtype=torch.float64)
            self._nbins = torch.full((c,), self._num_bins, dtype=torch.int64)
        m = v.amax(dim=1) if v.shape[1] else torch.zeros(c, dtype=torch.float64)
        self._grow_to(m)
        width, nb = self._width, self._nbins
        safe = torch.where(width > 0, width, torch.ones((), dtype=torch.float64))
        idx = torch.floor(v / safe[:, None]).long()
        idx = torch.minimum(idx.clamp_(min=0), (nb - 1)[:, None])
        b = self._hist.shape[1]
        flat = idx + (torch.arange(c) * b)[:, None]
        flat = torch.where(valid, flat, torch.full((), c * b, dtype=torch.int64))
        counts = torch.bincount(flat.reshape(-1), minlength=c * b + 1)[: c * b]
        self._hist += counts.reshape(c, b)

    def _grow_to(self, m: torch.Tensor) -> None:
        """Set or grow each channel's range so that it covers ``m``."""
        width, nb = self._width, self._nbins
        new = (width == 0) & (m > 0)
        width[new] = m[new] / self._num_bins
        need = (width > 0) & (m > width * nb)
        if not bool(need.any()):
            return
        safe = torch.where(need, width, torch.ones((), dtype=torch.float64))
        if self._grow is GrowMethod.APPEND:
            grown = torch.where(need, torch.ceil(m / safe), nb.double())
            grown += (need & (safe * grown < m)).double()
            top = float(grown.max())
            if top > MAX_APPEND_BINS:
                raise ValueError(
                    f"HistogramCalibrator: covering |x| = {float(m.max()):g} with the bin width set by the first "
                    f"batch needs {top:.3g} bins (limit {MAX_APPEND_BINS}); use grow_method='stretch', or "
                    "calibrate with a representative first batch"
                )
            self._nbins = grown.long()
            if int(top) > self._hist.shape[1]:
                pad = torch.zeros(self._hist.shape[0], int(top) - self._hist.shape[1], dtype=torch.int64)
                self._hist = torch.cat([self._hist, pad], dim=1)
            return
        # STRETCH: double the width (merge bins pairwise) k times, the least k that covers m.
        # The factor 2**k is kept in float64, exact for any k a float range can need.
        factor = torch.ones_like(width)
        while True:
            short = need & (safe * factor * nb < m)
            if not bool(short.any()):
                break
            factor = torch.where(short, factor * 2, factor)
        b = self._hist.shape[1]
        target = torch.floor(torch.arange(b, dtype=torch.float64)[None, :] / factor[:, None]).long()
        self._hist = torch.zeros_like(self._hist).scatter_add_(1, target, self._hist)
        self._width = width * factor

    # -- inspection ----------------------------------------------------------------------------------------
    def histogram(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(counts, bin_edges)`` or None before any batch.

        ``counts`` is ``(C, B)`` int64, one row per amax entry (``C = 1`` per
        tensor), ``B`` the largest bin count (shorter rows are zero-padded);
        ``bin_edges[c, j] = width_c * j`` is ``(C, B + 1)`` float64.
        """
        if self._hist is None:
            return None
        b = self._hist.shape[1]
        return self._hist.clone(), self._width[:, None] * torch.arange(b + 1, dtype=torch.float64)[None, :]

    # -- amax ----------------------------------------------------------------------------------------------
    def compute_amax(self, method: str | HistogramMethod, *, stride: int = 1, start_bin: int = 128,
                     percentile: float = 99.99) -> torch.Tensor | None:
        """amax by ``method`` (``"entropy"``, ``"mse"`` or ``"percentile"``), float32 of the amax shape.

        None before any batch was seen. See the module docstring for the definitions.
        """
        method = _enum(HistogramMethod, method, "method")
        stride = _positive_int("stride", stride, 1)
        start_bin = _positive_int("start_bin", start_bin, 1)
        if isinstance(percentile, bool) or not isinstance(percentile, numbers.Real) or \
                not 0 <= float(percentile) <= 100:
            raise ValueError(f"percentile must be a number in [0, 100], got {percentile!r}")
        if method is HistogramMethod.ENTROPY and is_fp8(self._num_bits):
            raise ValueError("entropy calibration needs an integer num_bits; use 'mse' or 'percentile' for FP8 (4, 3)")
        if self._hist is None:
            return None
        h = self._hist.double().numpy()
        width = self._width.numpy()
        nb = self._nbins.numpy()
        if method is HistogramMethod.PERCENTILE:
            amax = _percentile_amax(h, width, nb, float(percentile))
        elif method is HistogramMethod.ENTROPY:
            amax = _entropy_amax(h, width, nb, self._num_bits, self._unsigned, start_bin, stride)
        else:
            amax = _mse_amax(h, width, nb, self._num_bits, self._unsigned, start_bin, stride)
        amax = np.where(width > 0, amax, 0.0)
        return torch.from_numpy(amax).float().reshape(self._amax_shape)

    def __repr__(self) -> str:
        rng = "None" if self._hist is None else (
            f"[0, {float((self._width * self._nbins).max()):.3f}]x{tuple(self._hist.shape)}")
        return (f"HistogramCalibrator(num_bits={self._num_bits}, axis={self._axis}, unsigned={self._unsigned}, "
                f"num_bins={self._num_bins}, grow_method='{self._grow.value}', skip_zeros={self._skip_zeros}, "
                f"hist={rng})")


# -- amax from histograms (NumPy, one row per channel) --------------------------------------------------------


def _percentile_amax(h: np.ndarray, width: np.ndarray, nb: np.ndarray, percentile: float) -> np.ndarray:
    cum = np.cumsum(h, axis=1)
    total = cum[:, -1]
    target = percentile / 100.0 * total
    idx = (cum < target[:, None]).sum(axis=1)
    idx = np.minimum(idx, nb - 1)
    return np.where(total > 0, width * (idx + 1), 0.0)


def _kl_rows(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """``KL(p || q)`` per row after normalising each row; inf where ``q`` is 0 but ``p`` is not."""
    ps, qs = p.sum(axis=1, keepdims=True), q.sum(axis=1, keepdims=True)
    with np.errstate(all="ignore"):
        pn, qn = p / ps, q / qs
        terms = np.where(pn > 0, pn * np.log(pn / qn), 0.0)
        kl = terms.sum(axis=1)
    return np.where(np.isnan(kl) | (qs[:, 0] <= 0), np.inf, kl)


def _entropy_amax(h: np.ndarray, width: np.ndarray, nb: np.ndarray, num_bits: int, unsigned: bool,
                  start_bin: int, stride: int) -> np.ndarray:
    c, b = h.shape
    groups = 1 << (num_bits - 1 + int(unsigned))
    h0 = h.copy()
    if b > 1:
        h0[:, 0] = h0[:, 1]
    nz = h0 != 0
    cs = np.concatenate([np.zeros((c, 1)), np.cumsum(h0, axis=1)], axis=1)  # exact: integer counts
    ncs = np.concatenate([np.zeros((c, 1)), np.cumsum(nz, axis=1, dtype=np.float64)], axis=1)
    candidates = np.arange(start_bin, b + 1, stride)
    kl = np.full((c, len(candidates)), np.inf)
    for k, i in enumerate(candidates):
        i = int(i)
        p = h0[:, :i].copy()
        p[:, i - 1] += cs[:, b] - cs[:, i]
        if groups >= i:  # every bin is its own group
            q = h0[:, :i]
        else:
            starts = (np.arange(groups + 1, dtype=np.int64) * i + groups - 1) // groups
            sums = cs[:, starts[1:]] - cs[:, starts[:-1]]
            counts = ncs[:, starts[1:]] - ncs[:, starts[:-1]]
            with np.errstate(all="ignore"):
                avg = np.where(counts > 0, sums / counts, 0.0)
            g = (np.arange(i, dtype=np.int64) * groups) // i
            q = np.where(nz[:, :i], avg[:, g], 0.0)
        kl[:, k] = _kl_rows(p, q)
    valid = candidates[None, :] <= nb[:, None]
    return _pick(kl, valid, candidates, width, nb, last=True)


def _pick(err: np.ndarray, valid: np.ndarray, candidates: np.ndarray, width: np.ndarray, nb: np.ndarray,
          *, last: bool, centers: bool = False) -> np.ndarray:
    """``width * candidate`` (or the candidate bin's centre) of least ``err`` among valid candidates per row."""
    out = width * nb  # no candidate: the top of the range
    masked = np.where(valid, err, np.inf)
    for r in range(err.shape[0]):
        if not valid[r].any():
            continue
        best = masked[r].min()
        hits = np.flatnonzero(valid[r] & (masked[r] == best))
        j = hits[-1] if last else hits[0]
        out[r] = width[r] * (candidates[j] + 0.5) if centers else width[r] * candidates[j]
    return out


def _mse_amax(h: np.ndarray, width: np.ndarray, nb: np.ndarray, num_bits, unsigned: bool,
              start_bin: int, stride: int) -> np.ndarray:
    c, b = h.shape
    centers = torch.from_numpy(width[:, None] * (np.arange(b, dtype=np.float64)[None, :] + 0.5)).float()
    candidates = np.arange(start_bin, b, stride)
    err = np.full((c, len(candidates)), np.inf)
    chunk = max(1, _MSE_BLOCK // max(1, c * b))
    c64 = centers.double().numpy()
    for s in range(0, len(candidates), chunk):
        cand = candidates[s: s + chunk]
        amax = centers[:, torch.from_numpy(cand)][:, :, None]  # (C, K, 1)
        xs = centers[:, None, :].expand(c, len(cand), b)
        if is_fp8(num_bits):
            fq = fake_e4m3_quant(xs, amax)
        else:
            fq = fake_tensor_quant(xs, amax, num_bits, unsigned, True)
        d = fq.double().numpy() - c64[:, None, :]
        err[:, s: s + len(cand)] = (d * d * h[:, None, :]).sum(axis=2)
    valid = candidates[None, :] < nb[:, None]
    # amax is the candidate centre in float32, as used by the search
    picked = _pick(err, valid, candidates, width, nb, last=False, centers=True)
    return np.where(valid.any(axis=1), picked.astype(np.float32).astype(np.float64), width * nb)
