"""Scoring candidate encodings against histograms: the search behind the SQNR, MSE and entropy analyzers.

A candidate is a scale and an offset per histogram row (AIMET convention,
``Q(x) = clamp(round(x / s) - o, qmin, qmax)``). Every value in a bin is taken
to sit at the bin's midpoint ``m_j`` (the histogram's only knowledge of it),
and the midpoints are quantized by the affine kernels
(:func:`quanta.kernels.affine.forward_raw`), so candidates are scored with
exactly the rounding and clamping the quantizer will apply:

* :func:`squared_error`: ``sum_j c_j * g_j * (QDQ(m_j) - m_j)**2``, with
  ``g_j = gamma`` where ``m_j`` is clamped and 1 inside (AIMET's SQNR noise
  estimate; ``gamma = 1`` is the plain expected squared error of the midpoint
  approximation — the within-bin spread adds ``w**2 / 12`` per value to every
  candidate alike and so never changes the choice);
* :func:`kl_divergence`: ``KL(P || Q)`` (TensorRT's entropy calibration carried
  over to signed ranges): ``P`` is the histogram of the unclamped bins with the
  clamped bins' counts added to the first/last unclamped bin; ``Q`` spreads the
  *unclamped* count of each quantization cell (the bins that share a code)
  evenly over the cell's bins where ``P`` is non-zero. Both are normalised, so
  clipping is penalised by the mass ``Q`` lacks at the edges.

The candidate sets are :func:`sqnr_candidates` (AIMET's delta/offset grid) and
:func:`shrink_candidates` (the observed range with each end
shrunk on a grid of fractions).

Cost: one kernel pass over the bins per candidate. :func:`squared_error` then
sums bin by bin; :func:`kl_divergence` takes its sums per quantization cell from
running sums of the row, in closed form (statistics, no rounding: the cells come
from the kernel's codes). Work is split into blocks of at most ``2**22``
evaluated bins (fewer with ``max_rows``), so memory stays bounded for any
number of rows.
"""

from __future__ import annotations

import builtins

import torch

from quanta.grids.affine import IntegerGrid
from quanta.kernels.affine import QDQ, Q, forward_raw, plan
from quanta.kernels.histograms import Histograms
from quanta.kernels.qparams import calibrated_range, minimum_scale, offset_from_range, scale_from_range

__all__ = ["squared_error", "kl_divergence", "sqnr_candidates", "shrink_candidates", "range_grid",
           "encodings_of_ranges"]

_BLOCK = 2**22


def range_grid(num_steps: int, symmetric: bool) -> IntegerGrid:
    """The grid a range search assumes: ``[-ceil(N/2), floor(N/2)]`` if symmetric, else ``[0, N]``.

    Any grid with ``N`` steps represents the same values for a given range, so this choice is no loss.

    >>> range_grid(255, True)
    IntegerGrid(qmin=-128, qmax=127)
    """
    return IntegerGrid.from_num_steps(num_steps, signed=symmetric)


def _row_blocks(h: int, b: int, max_rows: int | None):
    """Row slices of at most ``_BLOCK`` bins (and ``max_rows`` rows) each."""
    rows = max(1, min(h, _BLOCK // max(1, b)))
    if max_rows is not None:
        rows = min(rows, max_rows)
    for r0 in range(0, h, rows):
        yield slice(r0, min(h, r0 + rows))


def _candidate_blocks(rows: int, k: int, b: int):
    """Candidate slices such that ``rows x candidates x b`` stays within ``_BLOCK``."""
    cands = max(1, min(k, _BLOCK // max(1, rows * b)))
    for k0 in range(0, k, cands):
        yield slice(k0, min(k, k0 + cands))


def _blocks(h: int, k: int, b: int, max_rows: int | None):
    """``(row slice, candidate slice)`` pairs covering ``h x k`` with at most ``_BLOCK`` bins each."""
    for rs in _row_blocks(h, b, max_rows):
        for ks in _candidate_blocks(rs.stop - rs.start, k, b):
            yield rs, ks


def _check(hist: Histograms, scale: torch.Tensor, offset: torch.Tensor) -> None:
    h = hist.num_rows
    if scale.dim() != 2 or scale.shape[0] != h or offset.shape != scale.shape:
        raise ValueError(
            f"scale and offset must be (H, K) with H = {h} histogram rows; got {tuple(scale.shape)} and "
            f"{tuple(offset.shape)}"
        )


def _per_bin(mode: int, hist: Histograms, scale: torch.Tensor, offset: torch.Tensor, grid: IntegerGrid,
             max_rows: int | None, score, *, skip_empty: bool = False) -> torch.Tensor:
    """Score every candidate bin by bin: ``score(midpoints, kernel output, inside mask, counts)`` per block.

    ``skip_empty``: the score ignores empty bins, so each block of rows keeps only its non-empty bins
    (padded with empty ones to the longest row), which is all that sparse histograms have to offer.
    """
    h, k = scale.shape
    mids = hist.midpoints(torch.float32)
    counts = hist.counts
    out = torch.empty(h, k, dtype=torch.float64)
    plans: dict = {}
    for rs in _row_blocks(h, hist.num_bins, max_rows):
        m, c = mids[rs], counts[rs]
        if skip_empty:
            nonzero = c != 0
            width = max(1, int(nonzero.sum(dim=1).max()))
            if width < c.shape[1]:
                keep = torch.argsort((~nonzero).to(torch.uint8), dim=1, stable=True)[:, :width]
                m, c = m.gather(1, keep), c.gather(1, keep)
        b = m.shape[1]
        for ks in _candidate_blocks(m.shape[0], k, b):
            kc = ks.stop - ks.start
            x = m[:, None, :].expand(m.shape[0], kc, b).contiguous()
            s = scale[rs, ks, None].float().contiguous()
            o = offset[rs, ks, None].float().contiguous()
            p = plans.get(x.shape)
            if p is None:
                p = plans[x.shape] = plan(x, s.shape, grid, None)
            y, inside = forward_raw(mode, x, s, o, p, torch.float32, want_mask=True)
            out[rs, ks] = score(x, y, inside, c)
    return out


def _prefix(t: torch.Tensor) -> torch.Tensor:
    """``(R, B + 1)`` float64 running sums along the bins, starting at 0."""
    out = torch.zeros(t.shape[0], t.shape[1] + 1, dtype=torch.float64)
    torch.cumsum(t, dim=1, out=out[:, 1:])
    return out


def _xlogx(t: torch.Tensor) -> torch.Tensor:
    return torch.where(t > 0, t * torch.log(torch.where(t > 0, t, 1.0)), 0.0)


class _Cells:
    """Where each code's bins are, for one candidate per row: bins are quantized by the kernels.

    The codes of the bin midpoints never decrease along the bins, so the bins
    sharing a code (a quantization cell) are consecutive, and so are the
    unclamped ones, ``[first, end)``: clamped bins only ever share the first or
    the last code. ``lo[:, i]``/``hi[:, i]`` bound the unclamped bins of code
    ``qmin + i``; ``code_first``/``code_last`` are the cells of the first and
    last unclamped bins.
    """

    def __init__(self, mids: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, grid: IntegerGrid,
                 p, queries: torch.Tensor) -> None:
        codes, inside = forward_raw(Q, mids, scale, offset, p, torch.float32, want_mask=True)
        bounds = torch.searchsorted(codes, queries)  # bounds[:, i]: the first bin of code >= qmin + i
        ins = inside.view(torch.uint8)
        n_inside = ins.sum(dim=1, dtype=torch.int32).long()
        # the clamped-below bins come first; with no unclamped bin, every bin of code qmin is clamped
        first = torch.where(n_inside > 0, ins.argmax(dim=1), bounds[:, 1])
        end = first + n_inside  # one past the last unclamped bin
        self.first, self.end, self.n_inside = first[:, None], end[:, None], n_inside[:, None]
        self.lo = bounds[:, :-1].clone()
        self.hi = bounds[:, 1:].clone()
        self.lo[:, 0] = first
        self.hi[:, -1] = torch.maximum(end, self.lo[:, -1])
        b = codes.shape[1]
        last = (end - 1).clamp(0, b - 1)
        self.code_first = (codes.gather(1, first.clamp_max(b - 1)[:, None]) - grid.qmin).long()
        self.code_last = (codes.gather(1, last[:, None]) - grid.qmin).long()


def _by_cells(hist: Histograms, scale: torch.Tensor, offset: torch.Tensor, grid: IntegerGrid,
              max_rows: int | None, score) -> torch.Tensor:
    """Score every candidate from per-row running sums over the bins and the cells of each candidate."""
    h, k = scale.shape
    b = hist.num_bins
    mids = hist.midpoints(torch.float32)
    out = torch.empty(h, k, dtype=torch.float64)
    plans: dict = {}
    for rs, ks in _blocks(h, k, b, max_rows):
        kc = ks.stop - ks.start
        rep = (lambda t: t.repeat_interleave(kc, dim=0)) if kc > 1 else (lambda t: t)  # noqa: E731
        m = rep(mids[rs]).contiguous()
        s = scale[rs, ks].float().reshape(-1, 1).contiguous()
        o = offset[rs, ks].float().reshape(-1, 1).contiguous()
        p = plans.get(m.shape)
        if p is None:
            queries = torch.arange(grid.qmin, grid.qmax + 2, dtype=torch.float32).expand(m.shape[0], -1).contiguous()
            p = plans[m.shape] = (plan(m, s.shape, grid, None), queries)
        cells = _Cells(m, s, o, grid, *p)
        out[rs, ks] = score(rep, rs, cells, s, o).reshape(-1, kc)
    return out


def _cells_apply(grid: IntegerGrid, b: int) -> bool:
    """Whether scoring by cells applies: one entry per code fits the bins, and float32 holds every code."""
    return grid.num_steps + 1 <= b and max(abs(grid.qmin), abs(grid.qmax) + 1) < 2**24


def squared_error(hist: Histograms, scale: torch.Tensor, offset: torch.Tensor, grid: IntegerGrid, *,
                  gamma: float = 1.0, max_rows: int | None = None) -> torch.Tensor:
    """``(H, K)`` float64: ``sum_j c_j * g_j * (QDQ(m_j) - m_j)**2`` per row and candidate (module docstring).

    Bin by bin: the kernels quantize the midpoints, the weighted squares are
    summed in float32 (as AIMET's estimate is) and returned as float64.

    >>> from quanta.kernels.histograms import histogram
    >>> h = histogram(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), num_bins=4)[0]   # midpoints 0.5 .. 3.5
    >>> squared_error(h, torch.tensor([[1.0, 0.5]]), torch.tensor([[0.0, 0.0]]), IntegerGrid(0, 3))
    tensor([[1., 5.]], dtype=torch.float64)
    """
    _check(hist, scale, offset)

    def per_bin(x, y, inside, counts):
        d = y.sub_(x).square_()  # y is the kernel's fresh output
        c = counts.float()[:, None, :]
        w = c if gamma == 1.0 else torch.where(inside, c, c * gamma)
        return torch.linalg.vecdot(d, w).double()

    return _per_bin(QDQ, hist, scale, offset, grid, max_rows, per_bin, skip_empty=True)


def kl_divergence(hist: Histograms, scale: torch.Tensor, offset: torch.Tensor, grid: IntegerGrid, *,
                  max_rows: int | None = None) -> torch.Tensor:
    """``(H, K)`` float64 ``KL(P || Q)`` per row and candidate (module docstring); inf where undefined.

    With ``T`` the total count and ``T_in`` the unclamped count,
    ``KL = (sum p log p - sum_cells mass * log(cell sum / cell's non-empty bins)) / T - log T + log T_in``,
    taken per cell from running sums of the row (bin by bin where the grid has more codes than there are bins).

    >>> from quanta.kernels.histograms import histogram
    >>> h = histogram(torch.tensor([[0.0, 1.0, 1.0, 3.0]]), num_bins=4)[0]   # counts 1, 2, 0, 1
    >>> kl_divergence(h, torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 0.0]]), IntegerGrid(0, 3))
    tensor([[0.0589, 0.0000]], dtype=torch.float64)
    """
    _check(hist, scale, offset)
    if not _cells_apply(grid, hist.num_bins):
        return _per_bin(Q, hist, scale, offset, grid, max_rows, _kl_per_bin(grid))
    counts = hist.counts.double()
    c0, nz, cl = _prefix(counts), _prefix((counts > 0).double()), _prefix(_xlogx(counts))

    def by_cells(rep, rs, cells, s, o):
        p0, pnz, pcl = rep(c0[rs]), rep(nz[rs]), rep(cl[rs])
        first, end = cells.first, cells.end
        last = (end - 1).clamp_min(0)

        def at(pre, i):
            return pre.gather(1, i.clamp(0, pre.shape[1] - 1))

        total = p0[:, -1:]
        below, above = at(p0, first), total - at(p0, end)
        kept = at(p0, end) - at(p0, first)
        same = first == last
        c_first = at(p0, first + 1) - at(p0, first)
        c_last = at(p0, last + 1) - at(p0, last)
        folded_first = below + torch.where(same, above, 0.0)  # P adds the clamped counts to these two bins
        folded_last = torch.where(same, 0.0, above)
        p_log_p = (at(pcl, end) - at(pcl, first) - _xlogx(c_first) - torch.where(same, 0.0, _xlogx(c_last))
                   + _xlogx(c_first + folded_first) + torch.where(same, 0.0, _xlogx(c_last + folded_last)))
        cell_sum = at(p0, cells.hi) - at(p0, cells.lo)  # unclamped count of each cell
        n = at(pnz, cells.hi) - at(pnz, cells.lo)  # its bins where P is non-zero ...
        n.scatter_add_(1, cells.code_first, ((c_first == 0) & (folded_first > 0)).double())  # ... with the folds
        n.scatter_add_(1, cells.code_last, ((c_last == 0) & (folded_last > 0)).double())
        mass = cell_sum.scatter_add(1, cells.code_first, folded_first).scatter_add_(1, cells.code_last, folded_last)
        used = mass > 0
        p_log_q = torch.where(used, mass * torch.log(torch.where(used, cell_sum, 1.0) / n.clamp_min(1.0)), 0.0)
        # P > 0 but Q = 0 can only happen in a cell that got folded counts and has no unclamped count
        impossible = ((cell_sum.gather(1, cells.code_first) == 0) & (folded_first > 0)) | \
                     ((cell_sum.gather(1, cells.code_last) == 0) & (folded_last > 0))
        kl = ((p_log_p - p_log_q.sum(dim=1, keepdim=True)) / total - torch.log(total)
              + torch.log(kept.clamp_min(1e-300)))
        ok = (cells.n_inside > 0) & (total > 0) & (kept > 0) & ~impossible
        return torch.where(ok, kl.clamp_min(0.0), torch.inf).squeeze(1)

    return _by_cells(hist, scale, offset, grid, max_rows, by_cells)


def _kl_per_bin(grid: IntegerGrid):
    qmin, qmax = float(grid.qmin), float(grid.qmax)

    def score(x, codes, inside, counts):
        c = counts.double()[:, None, :].expand(codes.shape)
        c_in = torch.where(inside, c, 0.0)
        below = torch.where(~inside & (codes == qmin), c, 0.0).sum(-1, keepdim=True)
        above = torch.where(~inside & (codes == qmax), c, 0.0).sum(-1, keepdim=True)
        ins = inside.to(torch.uint8)
        any_inside = ins.amax(-1, keepdim=True) > 0
        first = ins.argmax(-1, keepdim=True)
        last = codes.shape[-1] - 1 - ins.flip(-1).argmax(-1, keepdim=True)
        p = c_in.scatter_add(-1, first, torch.where(any_inside, below, 0.0))
        p = p.scatter_add(-1, last, torch.where(any_inside, above, 0.0))
        # codes are non-decreasing along the bins: each run of equal codes is one quantization cell
        run = torch.zeros(codes.shape, dtype=torch.int64)
        run[..., 1:] = (codes[..., 1:] != codes[..., :-1]).cumsum(-1)
        nz = p > 0
        cell_sum = torch.zeros_like(p).scatter_add_(-1, run, c_in)
        cell_n = torch.zeros_like(p).scatter_add_(-1, run, nz.double())
        q = torch.where(nz, cell_sum.gather(-1, run) / cell_n.gather(-1, run).clamp_min(1), 0.0)
        p_tot, q_tot = p.sum(-1, keepdim=True), q.sum(-1, keepdim=True)
        pn, qn = p / p_tot.clamp_min(1e-300), q / q_tot.clamp_min(1e-300)
        terms = torch.where(nz, pn * torch.log(torch.where(nz, pn, 1.0) / torch.where(nz, qn, 1.0)), 0.0)
        kl = terms.sum(-1)
        ok = any_inside.squeeze(-1) & (p_tot.squeeze(-1) > 0) & (q_tot.squeeze(-1) > 0) & ~(nz & (qn == 0)).any(-1)
        return torch.where(ok & ~torch.isnan(kl), kl, torch.inf)

    return score


def sqnr_candidates(
    min: torch.Tensor, max: torch.Tensor, num_steps: int, symmetric: bool, *,
    asymmetric_delta_candidates: int = 17, symmetric_delta_candidates: int = 101, offset_candidates: int = 21,
) -> tuple[torch.Tensor, torch.Tensor]:
    """AIMET's SQNR candidate grid: ``(delta, offset)``, each ``(H, K)`` float32, for grid ``[0, N]``.

    With ``lo = min(min, 0)``, ``hi = max(max, 0, lo + N * s_min)``:

    * symmetric: ``delta_k = max(2 * max(hi, -lo) / N * k / (D - 1), s_min)`` for
      ``k = 1..D`` (``D = symmetric_delta_candidates``), offset ``floor(-N / 2)``;
    * asymmetric: ``delta_k = (hi - lo) / N * k / (D - 1)`` (``D =
      asymmetric_delta_candidates``) times offsets ``round(-N + i * N / (O - 2))``
      (``O = min(N + 2, offset_candidates)``) plus the observed offset
      ``round(lo / delta_max)``; each pair's range ``[o * delta, (o + N) * delta]`` is
      then clipped to the observed ``[lo, hi]`` (rounded to the grid) and turned
      back into ``delta = max(width / N, s_min)``, ``o = round(min / delta)``.

    >>> d, o = sqnr_candidates(torch.tensor([-1.0]), torch.tensor([1.0]), 255, True, symmetric_delta_candidates=3)
    >>> d, o
    (tensor([[0.0039, 0.0078, 0.0118]]), tensor([[-128., -128., -128.]]))
    """
    if symmetric_delta_candidates < 2 or asymmetric_delta_candidates < 2:
        raise ValueError("the number of delta candidates must be at least 2, got "
                         f"{asymmetric_delta_candidates} (asymmetric) and {symmetric_delta_candidates} (symmetric)")
    if offset_candidates < 3:
        raise ValueError(f"offset_candidates must be at least 3, got {offset_candidates}")
    s_min = minimum_scale(num_steps)
    lo = torch.clamp_max(min.float(), 0)
    hi = torch.clamp_min(max.float(), 0)
    hi = torch.maximum(hi, lo + s_min * num_steps)
    if symmetric:
        d = symmetric_delta_candidates
        max_delta = 2 * torch.maximum(hi, -lo) / num_steps
        k = torch.arange(1, d + 1, dtype=torch.float32)
        deltas = torch.clamp_min(max_delta[:, None] * k[None, :] / (d - 1), s_min)
        return deltas, torch.full_like(deltas, float((-num_steps) // 2))
    d = asymmetric_delta_candidates
    max_delta = (hi - lo) / num_steps
    observed_offset = torch.round(lo / max_delta)
    observed_min = max_delta * observed_offset
    observed_max = observed_min + max_delta * num_steps
    k = torch.arange(1, d + 1, dtype=torch.float32)
    deltas = max_delta[:, None] * k[None, :] / (d - 1)
    n_off = builtins.min(num_steps + 2, offset_candidates)
    step = num_steps / (n_off - 2)
    offsets = torch.round(torch.arange(-num_steps, step, step, dtype=torch.float32))
    offsets = torch.cat([offsets[None, :].expand(lo.shape[0], -1), observed_offset[:, None]], dim=1)
    t_min = deltas[:, :, None] * offsets[:, None, :]
    t_max = t_min + deltas[:, :, None] * num_steps
    t_min = torch.maximum(observed_min[:, None, None], t_min)
    t_max = torch.minimum(observed_max[:, None, None], t_max)
    deltas = torch.clamp_min((t_max - t_min) / num_steps, s_min)
    offsets = torch.round(t_min / deltas)
    h = lo.shape[0]
    return deltas.reshape(h, -1), offsets.reshape(h, -1)


def shrink_candidates(min: torch.Tensor, max: torch.Tensor, num_steps: int, symmetric: bool, *,
                      symmetric_candidates: int = 100, asymmetric_candidates: int = 20
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped ranges through the MinMax rules (:func:`~quanta.kernels.qparams.calibrated_range`): ``(H, K)`` each.

    With ``lo = min(min, 0)``, ``hi = max(max, 0)`` (0 for rows that saw nothing):

    * symmetric: ``calibrated_range(t * lo, t * hi)`` for ``t = k / S``, ``k = 1..S``
      (``S = symmetric_candidates``): ``K = S``;
    * asymmetric: ``calibrated_range(u * lo, t * hi)`` for ``u = i / A``, ``t = j / A``,
      ``i, j = 1..A`` (``A = asymmetric_candidates``), ``i`` outer: ``K = A**2``,
      so each end of the range is clipped on its own.

    The last candidate is the MinMax range.

    >>> lo, hi = shrink_candidates(torch.tensor([-2.0]), torch.tensor([4.0]), 255, False, asymmetric_candidates=2)
    >>> lo, hi
    (tensor([[-1., -1., -2., -2.]]), tensor([[2., 4., 2., 4.]]))
    """
    if symmetric_candidates < 1 or asymmetric_candidates < 1:
        raise ValueError("the number of candidates must be at least 1, got "
                         f"{symmetric_candidates} (symmetric) and {asymmetric_candidates} (asymmetric)")
    seen = min <= max
    lo = torch.where(seen, torch.clamp_max(min.float(), 0), 0.0).double()
    hi = torch.where(seen, torch.clamp_min(max.float(), 0), 0.0).double()
    if symmetric:
        t = torch.arange(1, symmetric_candidates + 1, dtype=torch.float64) / symmetric_candidates
        c_lo, c_hi = lo[:, None] * t[None, :], hi[:, None] * t[None, :]
    else:
        a = asymmetric_candidates
        t = torch.arange(1, a + 1, dtype=torch.float64) / a
        c_lo = (lo[:, None, None] * t[None, :, None]).expand(-1, a, a).reshape(lo.shape[0], -1)
        c_hi = (hi[:, None, None] * t[None, None, :]).expand(-1, a, a).reshape(lo.shape[0], -1)
    return calibrated_range(c_lo.float(), c_hi.float(), num_steps, symmetric)


def encodings_of_ranges(lo: torch.Tensor, hi: torch.Tensor, grid: IntegerGrid,
                        symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, offset)`` a quantizer with range ``[lo, hi]`` on ``grid`` uses (:mod:`quanta.kernels.qparams`).

    >>> encodings_of_ranges(torch.tensor([-1.0]), torch.tensor([1.0]), IntegerGrid(0, 255), False)
    (tensor([0.0078]), tensor([-127.]))
    """
    scale = scale_from_range(lo, hi, grid)
    return scale, offset_from_range(lo, scale, grid, symmetric).detach()
