"""Streaming histograms of many rows at once (one row per scale entry), exactly mergeable.

A :class:`Histograms` holds one histogram per row of a ``(H, N)`` batch (a row
is the set of input elements that share one scale entry: the whole tensor, a
channel or a block). Every row has ``num_bins`` bins of width ``w = 2**e``
*anchored at zero*: bin ``j`` of a row covers ``[(start + j)·w, (start + j + 1)·w)``.
The exponent is the smallest one for which the row's observed range
``[min, max]`` fits::

    e(min, max) = min{ e >= e_floor : floor(max / 2**e) - floor(min / 2**e) + 1 <= num_bins }

with ``e_floor = floor(log2(max(|min|, |max|))) - 30`` (so bin indices stay far
inside int64 even for a constant row). ``start = floor(min / 2**e)``.

Growth by re-binning: when a batch widens a row's range, its width doubles as
often as needed and old bins merge exactly (old bin ``i`` becomes ``i >> k``).
Because ``e(min, max)`` only grows when the range grows, the histogram after any
sequence of batches is *bit for bit* the histogram of all their values binned
at once: exact integer counts, independent of batch order and batch size and of
how the data is split across processes (which is what makes the distributed
reduction exact). The price of the power-of-two width: the observed range spans
between ``num_bins / 2`` and ``num_bins`` bins, where AIMET's spans exactly
``num_bins`` (AIMET's re-binning instead splits bins proportionally, so its
counts depend on the batch order).

Memory is ``H * num_bins`` int64 counts whatever the number of batches.
A *growth limit* (AIMET's ``histogram_growth_limit``) bounds how far a row's
range may grow: values are clamped into ``[lo, hi]`` per row before binning.

Values are binned in float32 (float64 inputs are rounded to float32 first, as
AIMET's ``torch.histc`` does). NaN and ``+-inf`` are left out; the caller warns.

>>> h, ignored = histogram(torch.tensor([[0.0, 0.25, 0.5, 0.75, 1.0]]), num_bins=8)
>>> h.counts.tolist(), h.width().tolist(), int(h.start)
([[1, 1, 1, 1, 1, 0, 0, 0]], [0.25], 0)
>>> merged = merge(h, histogram(torch.tensor([[-1.5, 3.0]]), num_bins=8)[0])
>>> merged.counts.tolist(), merged.width().tolist(), int(merged.start)
([[1, 0, 4, 1, 0, 1, 0, 0]], [1.0], -2)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "Histograms",
    "NO_WIDTH",
    "empty",
    "histogram",
    "merge",
    "align",
    "required_exponent",
    "percentile_range",
    "rows_of",
]

#: Exponent of a row that has seen no non-zero value (empty, or zeros only).
NO_WIDTH = -(2**20)
# Bins at most 2**_FLOOR_BITS times finer than the row's largest magnitude.
_FLOOR_BITS = 30
# Float32 can scale by 2**-e exactly for these exponents; others bin in float64.
_F32_EXPONENTS = (-100, 100)


@dataclass(frozen=True)
class Histograms:
    """``H`` histograms of ``B`` bins each (see the module docstring for the bin layout).

    Attributes:
        counts: ``(H, B)`` int64 counts.
        exponent: ``(H,)`` int64, bin width ``2**exponent``; :data:`NO_WIDTH` for rows without a non-zero value.
        start: ``(H,)`` int64 index of the first bin.
        min: ``(H,)`` float32 smallest value seen (``+inf`` for a row that saw none).
        max: ``(H,)`` float32 largest value seen (``-inf`` for a row that saw none).
    """

    counts: torch.Tensor
    exponent: torch.Tensor
    start: torch.Tensor
    min: torch.Tensor
    max: torch.Tensor

    @property
    def num_rows(self) -> int:
        """``H``."""
        return self.counts.shape[0]

    @property
    def num_bins(self) -> int:
        """``B``."""
        return self.counts.shape[1]

    def width(self) -> torch.Tensor:
        """``(H,)`` float64 bin widths (0 for rows without a width)."""
        w = torch.ldexp(torch.ones_like(self.exponent, dtype=torch.float64), self.exponent.clamp_min(-1100))
        return torch.where(self.exponent == NO_WIDTH, 0.0, w)

    def edges(self) -> torch.Tensor:
        """``(H, B + 1)`` float64 bin edges (exact: integers times a power of two)."""
        j = torch.arange(self.num_bins + 1, dtype=torch.float64)
        return (self.start.double()[:, None] + j[None, :]) * self.width()[:, None]

    def midpoints(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``(H, B)`` bin midpoints ``(start + j + 1/2)·w`` in ``dtype``."""
        j = torch.arange(self.num_bins, dtype=torch.float64) + 0.5
        return ((self.start.double()[:, None] + j[None, :]) * self.width()[:, None]).to(dtype)

    def total(self) -> torch.Tensor:
        """``(H,)`` int64 number of values per row."""
        return self.counts.sum(dim=1)

    def seen(self) -> torch.Tensor:
        """``(H,)`` bool: the row has seen at least one value."""
        return self.min <= self.max


def empty(num_rows: int, num_bins: int) -> Histograms:
    """Histograms that have seen nothing (the neutral element of :func:`merge`).

    >>> empty(2, 4).seen().tolist()
    [False, False]
    """
    return Histograms(
        torch.zeros(num_rows, num_bins, dtype=torch.int64),
        torch.full((num_rows,), NO_WIDTH, dtype=torch.int64),
        torch.zeros(num_rows, dtype=torch.int64),
        torch.full((num_rows,), torch.inf),
        torch.full((num_rows,), -torch.inf),
    )


def _need(lo: torch.Tensor, hi: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """Bins needed at width ``2**e`` to cover ``[lo, hi]`` (float64 in, exact)."""
    return torch.floor(torch.ldexp(hi, -e)) - torch.floor(torch.ldexp(lo, -e)) + 1


def required_exponent(min: torch.Tensor, max: torch.Tensor, num_bins: int) -> torch.Tensor:
    """``e(min, max)`` per row: the smallest power-of-two width that fits ``[min, max]`` in ``num_bins`` bins.

    :data:`NO_WIDTH` for rows whose range holds no non-zero value (empty rows have ``min > max``).

    >>> required_exponent(torch.tensor([-1.0, 0.0, 0.0]), torch.tensor([1.0, 0.0, 3.0]), 2048).tolist()
    [-9, -1048576, -9]
    """
    if num_bins < 2:
        raise ValueError(f"num_bins must be at least 2, got {num_bins}")
    lo, hi = min.double(), max.double()
    seen = lo <= hi
    amax = torch.where(seen, torch.maximum(lo.abs(), hi.abs()), 0.0)
    has_width = amax > 0
    lo = torch.where(has_width, lo, 0.0)
    hi = torch.where(has_width, hi, 0.0)
    # floor(log2(amax)) = frexp exponent - 1; the lower bound ceil(log2((hi - lo) / B)) is never above the answer
    floor_e = torch.frexp(torch.where(has_width, amax, 1.0)).exponent.long() - 1 - _FLOOR_BITS
    r = (hi - lo) / num_bins
    m, ex = torch.frexp(torch.where(r > 0, r, 1.0))
    lower = torch.where(r > 0, ex.long() - (m == 0.5).long(), floor_e)
    e = torch.maximum(floor_e, lower)
    for _ in range(80):
        short = has_width & (_need(lo, hi, e) > num_bins)
        if not bool(short.any()):
            break
        e = e + short.long()
    else:  # pragma: no cover - the width doubles at most a few times past the lower bound
        raise RuntimeError("required_exponent did not converge")
    return torch.where(has_width, e, NO_WIDTH)


def _start(min: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
    """``floor(min / 2**e)`` per row (0 for rows without a width)."""
    ok = (exponent != NO_WIDTH) & torch.isfinite(min)
    e = torch.where(ok, exponent, 0)
    s = torch.floor(torch.ldexp(torch.where(ok, min.double(), 0.0), -e))
    return torch.where(ok, s, 0.0).long()


def rows_of(x: torch.Tensor, layout) -> torch.Tensor:
    """``x`` as ``(H, N)`` rows, one per scale entry of ``layout`` (a :class:`~quanta.kernels.blocks.BlockLayout`).

    >>> from quanta.kernels.blocks import resolve_layout
    >>> x = torch.arange(8.0).reshape(2, 4)
    >>> rows_of(x, resolve_layout(x.shape, (2, 2), (1, 2))).tolist()
    [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0], [6.0, 7.0]]
    >>> rows_of(x, resolve_layout(x.shape, (1, 4), None)).tolist()
    [[0.0, 4.0], [1.0, 5.0], [2.0, 6.0], [3.0, 7.0]]
    """
    xb = layout.to_blocks(x)
    reduced = layout.reduce_dims()
    kept = [d for d in range(xb.dim()) if d not in reduced]
    h = 1
    for s in layout.scale_shape:
        h *= s
    return xb.permute(*kept, *reduced).reshape(h, -1)


def histogram(
    rows: torch.Tensor, num_bins: int, *, limits: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[Histograms, int]:
    """Histograms of a batch of ``(H, N)`` rows; returns them and the number of non-finite values left out.

    ``limits``: per-row ``(lo, hi)`` (float32, NaN where unset) into which
    finite values are clamped before binning (the growth limit).

    >>> h, bad = histogram(torch.tensor([[1.0, float("nan"), 2.0], [0.0, 0.0, 0.0]]), num_bins=4)
    >>> h.counts.tolist(), h.min.tolist(), bad
    ([[1, 0, 1, 0], [3, 0, 0, 0]], [1.0, 0.0], 1)
    """
    if rows.dim() != 2:
        raise ValueError(f"rows must be a 2-D (H, N) tensor, got shape {tuple(rows.shape)}")
    if num_bins < 2:
        raise ValueError(f"num_bins must be at least 2, got {num_bins}")
    x = rows.detach().to(device="cpu", dtype=torch.float32)
    h, n = x.shape
    if n == 0:
        return empty(h, num_bins), 0
    if limits is not None:
        lo_lim = torch.where(torch.isnan(limits[0]), -torch.inf, limits[0]).float()
        hi_lim = torch.where(torch.isnan(limits[1]), torch.inf, limits[1]).float()
        clamped = torch.maximum(torch.minimum(x, hi_lim[:, None]), lo_lim[:, None])
        x = torch.where(torch.isfinite(x), clamped, x)  # NaN and inf stay non-finite
    bmin, bmax = torch.aminmax(x, dim=1)  # NaN and inf show up here: the cheap test for "all finite"
    finite: torch.Tensor | None = None
    ignored = 0
    if not bool((torch.isfinite(bmin) & torch.isfinite(bmax)).all()):
        finite = torch.isfinite(x)
        ignored = int((~finite).sum())
        bmin = torch.where(finite, x, torch.inf).amin(dim=1)
        bmax = torch.where(finite, x, -torch.inf).amax(dim=1)
    e = required_exponent(bmin, bmax, num_bins)
    start = _start(bmin, e)
    counts = _bin(x, finite, e, start, num_bins)
    return Histograms(counts, e, start, bmin, bmax), ignored


def _bin(x: torch.Tensor, finite: torch.Tensor | None, e: torch.Tensor, start: torch.Tensor,
         num_bins: int) -> torch.Tensor:
    """Counts of ``x`` (its finite entries, if ``finite`` is given) in the bins given by ``e`` and ``start``."""
    h = x.shape[0]
    no_width = e == NO_WIDTH
    real = e[~no_width]
    f32 = real.numel() == 0 or bool((real.min() >= _F32_EXPONENTS[0]) & (real.max() <= _F32_EXPONENTS[1]))
    cdt = torch.float32 if f32 else torch.float64
    # x * 2**-e is exact (a power-of-two scaling) unless it underflows; a row without a width holds zeros only
    inv = torch.where(no_width, 0.0, torch.ldexp(torch.ones(h, dtype=torch.float64), -torch.where(no_width, 0, e)))
    pos = (x if cdt == x.dtype else x.to(cdt)) * inv.to(cdt)[:, None]
    pos.floor_()
    if f32 and bool((real > 0).any()):
        # scaling down, a tiny negative value can underflow to -0.0, whose floor is 0; its bin is -1
        pos = torch.where((pos == 0) & (x < 0), -1.0, pos)
    total = h * num_bins
    rowbase = torch.arange(h, dtype=torch.int64) * num_bins
    exact_in_float = total < 2**24 if f32 else total < 2**53
    # floor(x / w) and start are both integers the float holds exactly (floors of exactly scaled floats), and
    # their difference is a bin index below num_bins: exact. So is adding row * B while the total stays small.
    pos.sub_(start.to(cdt)[:, None])
    if exact_in_float:
        pos.add_(rowbase.to(cdt)[:, None])
    if finite is not None:
        pos = torch.where(finite, pos, -1.0 if not exact_in_float else float(total))
    idx = pos.to(torch.int32 if total < 2**31 - 1 else torch.int64)
    if not exact_in_float:
        idx = idx.long() + rowbase[:, None]
        if finite is not None:
            idx = torch.where(finite, idx, total)
    return torch.bincount(idx.reshape(-1), minlength=total + 1)[:total].reshape(h, num_bins)


def align(hist: Histograms, exponent: torch.Tensor, start: torch.Tensor) -> Histograms:
    """Re-bin ``hist`` onto width ``2**exponent`` starting at bin ``start`` (exactly: bin ``i`` goes to ``i >> k``).

    The new width must not be finer than the old one, and the new bins must
    cover the row's ``[min, max]`` (ValueError otherwise).

    >>> h = histogram(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), num_bins=4)[0]
    >>> align(h, h.exponent + 1, h.start).counts.tolist()
    [[2, 2, 0, 0]]
    """
    b = hist.num_bins
    no_width_old = hist.exponent == NO_WIDTH
    k = torch.where(no_width_old, 62, exponent - hist.exponent)
    if bool((k < 0).any()):
        raise ValueError("align() cannot refine a histogram: the new bin width is finer than the old one")
    seen = hist.seen()
    first, last = _start(hist.min, exponent), _start(hist.max, exponent)
    if bool((seen & ((first < start) | (last - start >= b))).any()):
        raise ValueError("align(): the new bins do not cover the histogram's [min, max]")
    counts = hist.counts
    moved = ((k != 0) | (start != hist.start)) & seen
    if bool(moved.any()):
        every = bool(moved.all())
        rows = None if every else moved.nonzero().squeeze(1)
        c = counts if every else counts.index_select(0, rows)
        s_old, s_new, kk = (hist.start, start, k) if every else (hist.start[rows], start[rows], k[rows])
        new = torch.arange(b, dtype=torch.int64)[None, :] + s_old[:, None]
        new.bitwise_right_shift_(kk.clamp_max(62)[:, None]).sub_(s_new[:, None]).clamp_(0, b - 1)
        c = torch.zeros_like(c).scatter_add_(1, new, c)
        if every:
            counts = c
        else:
            counts = counts.clone()
            counts[rows] = c
    return Histograms(counts, exponent.clone(), start.clone(), hist.min, hist.max)


def merge(a: Histograms, b: Histograms) -> Histograms:
    """Histograms of the values of ``a`` and ``b`` together (exact, commutative, associative).

    >>> x = torch.tensor([[0.1, -2.0, 5.0, 0.3]])
    >>> whole = histogram(x, 16)[0]
    >>> parts = merge(histogram(x[:, :2], 16)[0], histogram(x[:, 2:], 16)[0])
    >>> torch.equal(whole.counts, parts.counts) and torch.equal(whole.exponent, parts.exponent)
    True
    """
    if a.counts.shape != b.counts.shape:
        raise ValueError(f"cannot merge histograms of shapes {tuple(a.counts.shape)} and {tuple(b.counts.shape)}")
    lo = torch.minimum(a.min, b.min)
    hi = torch.maximum(a.max, b.max)
    e = torch.maximum(required_exponent(lo, hi, a.num_bins), torch.maximum(a.exponent, b.exponent))
    start = _start(lo, e)
    counts = align(a, e, start).counts + align(b, e, start).counts
    return Histograms(counts, e, start, lo, hi)


def _count_threshold(t: torch.Tensor) -> torch.Tensor:
    """A count threshold with float noise removed: within ``1e-9`` (relative) of an integer, that integer.

    ``4000 * (1 - 0.99)`` is ``40.00000000000004`` in float64; the cumulative counts are integers, and the
    intended threshold is 40.
    """
    r = torch.round(t)
    return torch.where((t - r).abs() <= 1e-9 * torch.clamp_min(r.abs(), 1.0), r, t)


def percentile_range(hist: Histograms, percentile: float) -> tuple[torch.Tensor, torch.Tensor]:
    """AIMET's percentile rule per row: ``(edge[i_lo], edge[i_hi])`` clamped to the row's ``[min, max]``.

    ``i_hi`` is the first bin whose cumulative count reaches ``total * p / 100``
    and ``i_lo`` the first that reaches ``total * (100 - p) / 100`` (thresholds
    within 1e-9 of an integer count are taken as that count); ``edge[i]`` is
    the *lower* edge of bin ``i``. ``p = 100`` gives ``(min, max)``. Rows that saw
    nothing give ``(0, 0)``. float32 results.

    >>> h = histogram(torch.arange(100.0)[None, :], 128)[0]
    >>> percentile_range(h, 90.0)
    (tensor([9.]), tensor([89.]))
    """
    seen = hist.seen()
    lo = torch.where(seen, hist.min, 0.0)
    hi = torch.where(seen, hist.max, 0.0)
    if percentile == 100:
        return lo, hi
    cum = hist.counts.cumsum(dim=1).double()
    total = cum[:, -1:]
    i_hi = torch.searchsorted(cum, _count_threshold(total * percentile / 100)).clamp_max(hist.num_bins - 1)
    i_lo = torch.searchsorted(cum, _count_threshold(total * (100 - percentile) / 100)).clamp_max(hist.num_bins - 1)
    edges = hist.edges()
    p_lo = edges.gather(1, i_lo).squeeze(1).float()
    p_hi = edges.gather(1, i_hi).squeeze(1).float()
    p_lo = torch.minimum(torch.maximum(p_lo, lo), hi)
    p_hi = torch.minimum(torch.maximum(p_hi, lo), hi)
    return torch.where(seen, p_lo, 0.0), torch.where(seen, p_hi, 0.0)
