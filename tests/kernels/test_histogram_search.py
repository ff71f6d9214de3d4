"""Candidate scoring on histograms (quanta.kernels.histogram_search) against per-candidate loops."""

import math

import numpy as np
import pytest
import torch

from quanta.grids.affine import IntegerGrid
from quanta.kernels import histogram_search as hs
from quanta.kernels.histograms import histogram
from quanta.kernels.qparams import calibrated_range, minimum_scale
from quanta.kernels.reference import quantize_dequantize_reference, quantize_reference


def sample_hist(seed=0, h=4, n=3000, bins=96):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(h, n, generator=g) * torch.tensor([1.0, 3.0, 0.1, 7.0])[:h, None]
    x[1] = x[1].exp()  # skewed
    x[3, :5] = torch.tensor([60.0, -45.0, 80.0, 0.0, 0.0])  # outliers
    return histogram(x, bins)[0]


def random_candidates(hist, k, seed=1):
    g = torch.Generator().manual_seed(seed)
    amax = torch.maximum(hist.min.abs(), hist.max.abs())
    scale = (torch.rand(hist.num_rows, k, generator=g) * 0.5 + 0.01) * amax[:, None] / 7
    offset = -torch.randint(0, 16, (hist.num_rows, k), generator=g).float()
    return scale, offset


@pytest.mark.parametrize("gamma", [1.0, 3.0])
@pytest.mark.parametrize("grid", [IntegerGrid(0, 15), IntegerGrid(-8, 7), IntegerGrid(0, 255)])
def test_squared_error_matches_a_loop_over_candidates(gamma, grid):
    hist = sample_hist()
    scale, offset = random_candidates(hist, 9)
    got = hs.squared_error(hist, scale, offset, grid, gamma=gamma)
    mids = hist.midpoints()
    for r in range(hist.num_rows):
        for k in range(scale.shape[1]):
            s, o = scale[r, k], offset[r, k]
            y = quantize_dequantize_reference(mids[r], s, o, grid).double()
            codes = np.rint(mids[r].numpy() / s.numpy()) - o.numpy()
            clipped = torch.from_numpy((codes < grid.qmin) | (codes > grid.qmax))
            err = (y - mids[r].double()) ** 2 * hist.counts[r].double()
            err = torch.where(clipped, err * gamma, err)
            assert got[r, k].item() == pytest.approx(err.sum().item(), rel=1e-5)


def test_blocks_do_not_change_the_result():
    hist = sample_hist(bins=512)
    scale, offset = random_candidates(hist, 40)
    grid = IntegerGrid(0, 15)
    whole = hs.squared_error(hist, scale, offset, grid)
    one_row = hs.squared_error(hist, scale, offset, grid, max_rows=1)
    assert torch.allclose(whole, one_row, rtol=1e-6, atol=0)
    assert torch.allclose(hs.kl_divergence(hist, scale, offset, grid), hs.kl_divergence(hist, scale, offset, grid,
                                                                                        max_rows=1))


def reference_kl(counts, mids, s, o, grid):
    """KL(P || Q) from the definition, bin by bin (see histogram_search's module docstring)."""
    counts = [float(c) for c in counts]
    codes, inside = [], []
    for m in mids:
        v = round_half_even(m / s) - o
        inside.append(grid.qmin <= v <= grid.qmax)
        codes.append(min(max(v, grid.qmin), grid.qmax))
    ins = [j for j, i in enumerate(inside) if i]
    if not ins:
        return math.inf
    p = [c if i else 0.0 for c, i in zip(counts, inside)]
    for j, c in enumerate(counts):
        if not inside[j]:
            p[ins[0] if codes[j] == grid.qmin else ins[-1]] += c
    q = [0.0] * len(p)
    for code in set(codes):
        cell = [j for j in range(len(p)) if codes[j] == code]
        mass = sum(counts[j] for j in cell if inside[j])
        nonzero = [j for j in cell if p[j] > 0]
        for j in nonzero:
            q[j] = mass / len(nonzero)
    pt, qt = sum(p), sum(q)
    if pt == 0 or qt == 0:
        return math.inf
    kl = 0.0
    for pj, qj in zip(p, q):
        if pj > 0:
            if qj == 0:
                return math.inf
            kl += pj / pt * math.log((pj / pt) / (qj / qt))
    return kl


def round_half_even(v):
    return float(np.rint(np.float32(v)))


@pytest.mark.parametrize("grid", [IntegerGrid(0, 15), IntegerGrid(-4, 3), IntegerGrid(0, 63)],
                         ids=["cells", "signed_cells", "bin_by_bin"])
def test_kl_divergence_matches_the_definition(grid):
    hist = sample_hist(bins=48)  # 64 codes are scored bin by bin
    scale, offset = random_candidates(hist, 6)
    got = hs.kl_divergence(hist, scale, offset, grid)
    mids = hist.midpoints()
    for r in range(hist.num_rows):
        for k in range(scale.shape[1]):
            s, o = scale[r, k].item(), offset[r, k].item()
            # the kernels divide in float32, the reference must too
            ref = reference_kl(hist.counts[r].tolist(), mids[r].tolist(), np.float32(s), o, grid)
            codes = quantize_reference(mids[r], scale[r, k], offset[r, k], grid)
            assert codes.numel() == hist.num_bins
            if math.isinf(ref):
                assert math.isinf(got[r, k].item())
            else:
                assert got[r, k].item() == pytest.approx(ref, rel=1e-9, abs=1e-12)


def test_kl_cell_sums_agree_with_bin_by_bin_sums():
    hist = sample_hist(bins=256)
    scale, offset = random_candidates(hist, 12, seed=4)
    grid = IntegerGrid(0, 15)
    from quanta.kernels.affine import Q
    assert torch.allclose(hs.kl_divergence(hist, scale, offset, grid),
                          hs._per_bin(Q, hist, scale, offset, grid, None, hs._kl_per_bin(grid)), rtol=1e-7)


def test_kl_is_zero_when_quantization_loses_nothing():
    x = torch.tensor([[0.0, 1.0, 1.0, 2.0, 3.0, 3.0, 3.0]])
    hist = histogram(x, 4)[0]  # bins of width 1, midpoints 0.5 .. 3.5
    # scale 0.5, offset 0 on [0, 15]: codes 1, 3, 5, 7, one per bin, nothing clipped
    assert hs.kl_divergence(hist, torch.tensor([[0.5]]), torch.tensor([[0.0]]), IntegerGrid(0, 15)).item() == 0.0
    # scale 1: midpoints 1.5 and 2.5 share code 2 (ties to even), counts 2 and 1 are averaged
    assert hs.kl_divergence(hist, torch.tensor([[1.0]]), torch.tensor([[0.0]]), IntegerGrid(0, 15)).item() > 0


def test_sqnr_candidates_follow_the_formulas():
    lo, hi = torch.tensor([-1.0, 0.0, -3.0]), torch.tensor([2.0, 0.0, -1.0])
    n = 15
    d, o = hs.sqnr_candidates(lo, hi, n, True, symmetric_delta_candidates=5)
    s_min = minimum_scale(n)
    for r in range(3):
        lo_r, hi_r = min(lo[r].item(), 0.0), max(hi[r].item(), 0.0)
        hi_r = max(hi_r, lo_r + s_min * n)
        top = 2 * max(hi_r, -lo_r) / n
        expect = [max(top * k / 4, s_min) for k in range(1, 6)]
        assert d[r].tolist() == pytest.approx(expect, rel=1e-6)
    assert (o == -8).all()
    d, o = hs.sqnr_candidates(lo, hi, n, False, asymmetric_delta_candidates=4, offset_candidates=6)
    assert d.shape == (3, 4 * 6)  # 4 deltas x (5 offsets + the observed one)
    assert (d >= s_min).all()
    # every candidate's range stays inside the observed range (rounded to the coarsest grid)
    top_delta = (torch.maximum(hi.clamp_min(0), lo.clamp_max(0) + s_min * n) - lo.clamp_max(0)) / n
    assert (o * d >= lo.clamp_max(0)[:, None] - top_delta[:, None] * 0.5 - 1e-6).all()
    assert ((o + n) * d <= torch.maximum(hi.clamp_min(0), lo.clamp_max(0) + s_min * n)[:, None]
            + top_delta[:, None] * 0.5 + 1e-6).all()


def test_sqnr_candidates_validate_counts():
    with pytest.raises(ValueError, match="delta candidates"):
        hs.sqnr_candidates(torch.zeros(1), torch.ones(1), 15, True, symmetric_delta_candidates=1)
    with pytest.raises(ValueError, match="offset_candidates"):
        hs.sqnr_candidates(torch.zeros(1), torch.ones(1), 15, False, offset_candidates=2)


@pytest.mark.parametrize("symmetric", [False, True])
def test_shrink_candidates_end_with_the_minmax_range(symmetric):
    lo, hi = torch.tensor([-2.0, 0.5, float("inf")]), torch.tensor([3.0, 4.0, float("-inf")])  # last: never seen
    c_lo, c_hi = hs.shrink_candidates(lo, hi, 255, symmetric, symmetric_candidates=7, asymmetric_candidates=3)
    assert c_lo.shape == ((3, 7) if symmetric else (3, 9))
    m_lo, m_hi = calibrated_range(torch.tensor([-2.0, 0.0, 0.0]), torch.tensor([3.0, 4.0, 0.0]), 255, symmetric)
    assert torch.equal(c_lo[:, -1], m_lo) and torch.equal(c_hi[:, -1], m_hi)
    if not symmetric:  # lower end outer, upper end inner
        assert c_lo[0].tolist()[:3] == pytest.approx([-2 / 3] * 3) and c_hi[0].tolist()[:3] == pytest.approx([1, 2, 3])
