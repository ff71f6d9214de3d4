"""Histogram analyzers (percentile, SQNR, MSE, entropy): exhaustive-search references, granularity, streaming,
robustness, quantizer plumbing."""

import math
import warnings

import numpy as np
import pytest
import torch

import quanta.quantization as Q
from quanta.grids.affine import IntegerGrid
from quanta.kernels import histogram_search as hs
from quanta.kernels.histograms import histogram
from quanta.kernels.qparams import calibrated_range
from quanta.kernels.reference import quantize_dequantize_reference
from quanta.quantization.encoding_analyzer import (
    EntropyEncodingAnalyzer,
    HistogramEncodingAnalyzer,
    MinMaxEncodingAnalyzer,
    MseEncodingAnalyzer,
    PercentileEncodingAnalyzer,
    SqnrEncodingAnalyzer,
    StatisticsNotFoundError,
)

HISTOGRAM_ANALYZERS = [
    (PercentileEncodingAnalyzer, {"percentile": 99.0}),
    (SqnrEncodingAnalyzer, {}),
    (MseEncodingAnalyzer, {"asymmetric_candidates": 6, "symmetric_candidates": 15}),
    (EntropyEncodingAnalyzer, {"asymmetric_candidates": 6, "symmetric_candidates": 15}),
]
ALL_ANALYZERS = [(MinMaxEncodingAnalyzer, {})] + [(c, dict(kw, num_bins=128)) for c, kw in HISTOGRAM_ANALYZERS]
IDS = [c.__name__ for c, _ in ALL_ANALYZERS]


def midpoint_data(seed: int, k0: int, k1: int, num_bins: int, e: int) -> torch.Tensor:
    """Values exactly at the midpoints of bins k0..k1 of width 2**e, whose histogram has exactly that width.

    With k1 - k0 + 1 <= num_bins < 2 * (k1 - k0) + 1 the width 2**e is the smallest that fits.
    """
    assert k1 - k0 + 1 <= num_bins < 2 * (k1 - k0) + 1
    g = torch.Generator().manual_seed(seed)
    idx = torch.arange(k0, k1 + 1, dtype=torch.float64)
    t = (idx - (k0 + k1) / 2) / (k1 - k0) * 6
    weights = 1 / (1 + t**2) ** 2  # a heavy-tailed bump
    counts = torch.poisson(weights * 400, generator=g).long()
    counts[0] = counts[-1] = 1
    return ((idx + 0.5) * 2.0**e).float().repeat_interleave(counts)


def brute_squared_error(x: torch.Tensor, scale: float, offset: float, grid: IntegerGrid, gamma: float = 1.0) -> float:
    y = quantize_dequantize_reference(x, torch.tensor(scale), torch.tensor(offset), grid).double()
    codes = np.rint(x.numpy() / np.float32(scale)) - np.float32(offset)
    clipped = torch.from_numpy((codes < grid.qmin) | (codes > grid.qmax))
    err = (y - x.double()) ** 2
    return float(torch.where(clipped, err * gamma, err).sum())


CASES = [(15, False), (15, True), (255, False), (255, True), (3, True), (4, False)]


def _check_choice(errors: list[float], chosen: int, *, last: bool) -> None:
    best = min(errors)
    assert errors[chosen] <= best * (1 + 1e-6) + 1e-12
    ties = [i for i, e in enumerate(errors) if e <= best * (1 + 1e-5) + 1e-12]
    if len(ties) == 1:
        assert chosen == ties[0]
    else:  # near-ties can fall either way in float32 sums; the rule picks among them
        assert chosen in ties


@pytest.mark.parametrize("num_steps, symmetric", CASES)
@pytest.mark.parametrize("gamma", [3.0, 1.0])
def test_sqnr_choice_is_the_exhaustive_minimum_over_its_candidates(num_steps, symmetric, gamma):
    x = midpoint_data(0, -30, 70, 128, -3)
    a = SqnrEncodingAnalyzer((), num_bins=128, gamma=gamma)
    a.update_stats(x)
    deltas, offsets = a.candidates(a.stats, num_steps, symmetric)
    grid = IntegerGrid(0, num_steps)
    errors = [brute_squared_error(x, d, o, grid, gamma) for d, o in zip(deltas[0].tolist(), offsets[0].tolist())]
    lo, hi = a.compute_encodings(num_steps, symmetric)
    chosen = [i for i in range(len(errors))
              if lo.item() == np.float32(offsets[0, i] * deltas[0, i])
              and hi.item() == np.float32(np.float32(offsets[0, i] * deltas[0, i]) + num_steps * deltas[0, i])]
    assert chosen, "the range is none of the candidates"
    _check_choice(errors, chosen[0], last=False)


@pytest.mark.parametrize("num_steps, symmetric", CASES)
def test_mse_choice_is_the_exhaustive_minimum_over_its_candidates(num_steps, symmetric):
    x = midpoint_data(1, -20, 90, 128, -2)
    a = MseEncodingAnalyzer((), num_bins=128, asymmetric_candidates=7, symmetric_candidates=30)
    a.update_stats(x)
    c_lo, c_hi = a.candidates(a.stats, num_steps, symmetric)
    grid = hs.range_grid(num_steps, symmetric)
    errors = []
    for lo_k, hi_k in zip(c_lo[0], c_hi[0]):
        # the quantizer's own encoding of that range
        q = Q.affine.QuantizeDequantize((), qmin=grid.qmin, qmax=grid.qmax, symmetric=symmetric)
        q.set_range(lo_k, hi_k)
        errors.append(brute_squared_error(x, q.get_scale().item(), q.get_offset().item(), grid))
    lo, hi = a.compute_encodings(num_steps, symmetric)
    chosen = [i for i in range(len(errors)) if c_lo[0, i] == lo and c_hi[0, i] == hi]
    assert chosen
    _check_choice(errors, chosen[-1], last=True)
    assert errors[chosen[-1]] <= errors[-1]  # never worse than MinMax (the last candidate)


def reference_kl(x: torch.Tensor, start: int, width: float, num_bins: int, scale: float, offset: float,
                 grid: IntegerGrid) -> float:
    """KL(P || Q) from raw values, bin by bin (module docstring of quanta.kernels.histogram_search).

    Bin ``j`` covers ``[(start + j) * width, ...)``; its code is its midpoint's code.
    """
    bins = (np.floor(x.numpy().astype(np.float64) / width) - start).astype(np.int64)
    count = np.bincount(bins, minlength=num_bins).astype(float)
    mids = ((start + np.arange(num_bins) + 0.5) * width).astype(np.float32)
    v = np.rint(mids / np.float32(scale)) - np.float32(offset)
    inside = (v >= grid.qmin) & (v <= grid.qmax)
    code = np.clip(v, grid.qmin, grid.qmax)
    if not inside.any():
        return math.inf
    first, last = np.flatnonzero(inside)[[0, -1]]
    p = np.where(inside, count, 0.0)
    p[first] += count[~inside & (v < grid.qmin)].sum()
    p[last] += count[~inside & (v > grid.qmax)].sum()
    q = np.zeros(num_bins)
    for c in np.unique(code):
        cell = np.flatnonzero(code == c)
        nz = cell[p[cell] > 0]
        if nz.size:
            q[nz] = np.where(inside[cell], count[cell], 0.0).sum() / nz.size
    if p.sum() == 0 or q.sum() == 0:
        return math.inf
    pn, qn = p / p.sum(), q / q.sum()
    m = pn > 0
    if (qn[m] == 0).any():
        return math.inf
    return float((pn[m] * np.log(pn[m] / qn[m])).sum())


@pytest.mark.parametrize("num_steps, symmetric", [(15, False), (15, True), (7, True)])
def test_entropy_choice_is_the_exhaustive_minimum_over_its_candidates(num_steps, symmetric):
    x = midpoint_data(2, -40, 100, 256, -4)
    a = EntropyEncodingAnalyzer((), num_bins=256, asymmetric_candidates=6, symmetric_candidates=25)
    a.update_stats(x)
    c_lo, c_hi = a.candidates(a.stats, num_steps, symmetric)
    grid = hs.range_grid(num_steps, symmetric)
    width = 2.0**-4
    assert (int(a.stats.start), float(a.stats.width())) == (-40, width)
    scores = []
    for lo_k, hi_k in zip(c_lo[0], c_hi[0]):
        q = Q.affine.QuantizeDequantize((), qmin=grid.qmin, qmax=grid.qmax, symmetric=symmetric)
        q.set_range(lo_k, hi_k)
        valid = float(hi_k - lo_k) >= num_steps * width
        scores.append(reference_kl(x, -40, width, 256, q.get_scale().item(), q.get_offset().item(), grid)
                      if valid else math.inf)
    if math.isinf(scores[-1]):
        scores[-1] = 0.0  # the MinMax range is always allowed
    lo, hi = a.compute_encodings(num_steps, symmetric)
    chosen = [i for i in range(len(scores)) if c_lo[0, i] == lo and c_hi[0, i] == hi]
    assert chosen
    finite = [s for s in scores if math.isfinite(s)]
    assert scores[chosen[-1]] == pytest.approx(min(finite), rel=1e-9, abs=1e-12)


def test_percentile_is_the_rule_applied_to_exact_data():
    x = torch.arange(-100, 101, dtype=torch.float32)
    a = PercentileEncodingAnalyzer((), num_bins=256, percentile=95.0)
    a.update_stats(x)
    # bins of width 1 (201 of the 256 fit), one value at each lower edge; 201 values: the cumulative count
    # reaches 10.05 at the 11th bin (edge -90) and 190.95 at the 191st (edge 90)
    lo, hi = a.compute_encodings(255, False)
    assert (lo.item(), hi.item()) == (-90.0, 90.0)
    a.set_percentile(100)
    assert tuple(v.item() for v in a.compute_encodings(255, False)) == (-100.0, 100.0)


@pytest.mark.parametrize("cls, kw", ALL_ANALYZERS, ids=IDS)
@pytest.mark.parametrize("num_steps, symmetric", [(15, False), (255, True)])
def test_per_channel_and_per_block_equal_a_loop_over_slices(cls, kw, num_steps, symmetric):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 6, 64, generator=g) * torch.tensor([0.1, 1, 10, 1e3, 1e-3, 1])[:, None] + 0.3
    x[:, 5] = x[:, 5].exp()
    per_channel = cls((6, 1), **kw)
    per_channel.update_stats(x)
    lo, hi = per_channel.compute_encodings(num_steps, symmetric)
    assert lo.shape == (6, 1)
    per_block = cls((6, 4), block_size=(1, 16), **kw)
    per_block.update_stats(x)
    blo, bhi = per_block.compute_encodings(num_steps, symmetric)
    for c in range(6):
        single = cls((), **kw)
        single.update_stats(x[:, c])
        slo, shi = single.compute_encodings(num_steps, symmetric)
        assert torch.equal(lo[c, 0], slo) and torch.equal(hi[c, 0], shi)
        for b in range(4):
            single = cls((), **kw)
            single.update_stats(x[:, c, 16 * b: 16 * (b + 1)])
            slo, shi = single.compute_encodings(num_steps, symmetric)
            assert torch.equal(blo[c, b], slo) and torch.equal(bhi[c, b], shi)


@pytest.mark.parametrize("cls, kw", ALL_ANALYZERS, ids=IDS)
def test_streaming_equals_one_batch_in_any_order(cls, kw):
    g = torch.Generator().manual_seed(4)
    batches = [torch.randn(8, 3, 40, generator=g) * s for s in (1.0, 0.01, 30.0, 2.0)]
    batches[2][0, 1, 0] = 5000.0  # late outlier: the histograms grow by several doublings
    whole = cls((3, 1), **kw)
    whole.update_stats(torch.cat(batches))
    expect = whole.compute_encodings(15, False)
    for order in (batches, batches[::-1], [batches[2], batches[0], batches[3], batches[1]]):
        a = cls((3, 1), **kw)
        for b in order:
            a.update_stats(b)
        got = a.compute_encodings(15, False)
        assert torch.equal(got[0], expect[0]) and torch.equal(got[1], expect[1])


@pytest.mark.parametrize("cls, kw", ALL_ANALYZERS, ids=IDS)
def test_robust_inputs_never_give_non_finite_ranges(cls, kw):
    a = cls((5, 1), **kw)
    x = torch.randn(5, 100, generator=torch.Generator().manual_seed(5))
    x[0] = 0.0  # zeros
    x[1] = -2.5  # a constant
    x[2, 7] = 1e6  # a single outlier
    x[3, :4] = torch.tensor([float("inf"), -float("inf"), float("nan"), float("nan")])
    x[4] = float("nan")  # nothing finite at all
    with pytest.warns(RuntimeWarning, match="non-finite"):
        a.update_stats(x)
    assert a.update_stats(torch.empty(0, 5, 1)) is None  # an empty batch changes nothing
    for num_steps, symmetric in ((255, False), (15, True)):
        lo, hi = a.compute_encodings(num_steps, symmetric)
        assert torch.isfinite(lo).all() and torch.isfinite(hi).all()
        assert (lo <= 0).all() and (hi >= 0).all() and (hi - lo > 0).all()
        z_lo, z_hi = calibrated_range(torch.zeros(()), torch.zeros(()), num_steps, symmetric)
        assert (lo[0].item(), hi[0].item()) == (z_lo.item(), z_hi.item())  # zeros: the smallest range
        assert (lo[4].item(), hi[4].item()) == (z_lo.item(), z_hi.item())  # nothing finite: as zeros
        assert lo[1].item() <= -2.5 * (0.99 if cls is not PercentileEncodingAnalyzer else 1)
        assert hi[3].item() < 100  # the infinities were ignored
    outlier_top = a.compute_encodings(255, False)[1][2].item()
    if cls is MinMaxEncodingAnalyzer:
        assert outlier_top == 1e6
    elif cls is PercentileEncodingAnalyzer:  # 1 value in 100 lies beyond the 99th percentile
        assert outlier_top < 10


@pytest.mark.parametrize("cls, kw", ALL_ANALYZERS, ids=IDS)
def test_values_at_the_float32_limits_give_finite_ranges(cls, kw):
    # an additive attention mask (finfo.min where masked) reaches an activation quantizer
    big = torch.finfo(torch.float32).max
    x = torch.randn(3, 200, generator=torch.Generator().manual_seed(6))
    x[0, :20] = -big
    x[1, :20], x[1, 20:40] = -big, big
    x[2, :20] = big
    a = cls((3, 1), **kw)
    a.update_stats(x)
    for num_steps, symmetric in ((255, False), (255, True), (15, False)):
        lo, hi = a.compute_encodings(num_steps, symmetric)
        assert torch.isfinite(lo).all() and torch.isfinite(hi).all(), (num_steps, symmetric, lo, hi)
        assert (lo <= 0).all() and (hi >= 0).all() and (hi - lo > 0).all()


@pytest.mark.parametrize("cls, kw", ALL_ANALYZERS, ids=IDS)
def test_no_statistics_and_reset(cls, kw):
    a = cls((), **kw)
    with pytest.raises(StatisticsNotFoundError, match="compute_encodings"):
        a.compute_encodings(255, False)
    a.update_stats(torch.tensor([1.0, 2.0]))
    a.reset_stats()
    with pytest.raises(StatisticsNotFoundError):
        a.compute_encodings(255, False)
    assert a.compute_dynamic_encodings(torch.empty(0), 255, False) is None


@pytest.mark.parametrize("cls, kw", ALL_ANALYZERS, ids=IDS)
def test_dynamic_encodings_leave_running_stats_alone(cls, kw):
    a = cls((), **kw)
    a.update_stats(torch.linspace(-1, 1, 50))
    before = a.compute_encodings(255, False)
    dyn = a.compute_dynamic_encodings(torch.linspace(-5, 7, 50), 255, False)
    other = cls((), **kw)
    other.update_stats(torch.linspace(-5, 7, 50))
    assert all(torch.equal(d, o) for d, o in zip(dyn, other.compute_encodings(255, False)))
    assert all(torch.equal(b, c) for b, c in zip(before, a.compute_encodings(255, False)))


def test_growth_limit_clamps_later_outliers():
    first = torch.linspace(-1, 1, 101)
    later = torch.cat([torch.linspace(-1, 1, 101), torch.tensor([1000.0])])
    limited = PercentileEncodingAnalyzer((), percentile=100, histogram_growth_limit=3.0)
    free = PercentileEncodingAnalyzer((), percentile=100)
    for a in (limited, free):
        a.update_stats(first)
        a.update_stats(later)
    assert limited.compute_encodings(255, False)[1].item() == 1 + 3 * 2 / 2  # [-1, 1] may grow to [-4, 4]
    assert free.compute_encodings(255, False)[1].item() == 1000.0
    limited.reset_stats()
    limited.update_stats(later)  # a new first batch sets a new limit
    assert limited.compute_encodings(255, False)[1].item() == 1000.0


def test_minmax_matches_the_design_formulas():
    g = torch.Generator().manual_seed(6)
    for num_steps in (1, 2, 3, 15, 16, 255, 256, 65535):
        for _ in range(20):
            x = torch.randn(30, generator=g) * 10 ** float(torch.empty(()).uniform_(-3, 3, generator=g))
            x = x + float(torch.randn((), generator=g)) * x.abs().max()
            a = MinMaxEncodingAnalyzer(())
            a.update_stats(x)
            n = num_steps
            s_min = min(np.finfo(np.float32).eps, 0.01 / n)
            lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
            lo32, hi32 = np.float32(lo), np.float32(hi)
            for symmetric in (False, True):
                got = a.compute_encodings(n, symmetric)
                mn, mx = lo32, hi32
                if (mx - mn) / np.float32(n) < s_min:
                    mx = np.float32(mx + (n // 2 if symmetric else n) * np.float32(s_min))
                    if symmetric:
                        mn = np.float32(mn - math.ceil(n / 2) * np.float32(s_min))
                if symmetric:
                    pos, neg = n // 2, math.ceil(n / 2)
                    fit = 2 if n == 3 else pos  # AIMET's 2-bit rule: the maximum fitted into 2 of 3 steps
                    delta = -mn / np.float32(neg) if pos == 0 else max(mx / np.float32(fit), -mn / np.float32(neg))
                    mn, mx = np.float32(-neg * delta), np.float32(pos * delta)
                assert (got[0].item(), got[1].item()) == (float(mn), float(mx)), (n, symmetric)


def test_argument_validation_names_the_argument():
    with pytest.raises(ValueError, match="num_bins"):
        SqnrEncodingAnalyzer((), num_bins=1)
    with pytest.raises(TypeError, match="num_bins"):
        PercentileEncodingAnalyzer((), num_bins=2048.0)
    with pytest.raises(ValueError, match="percentile"):
        PercentileEncodingAnalyzer((), percentile=40)
    with pytest.raises(TypeError, match="percentile"):
        PercentileEncodingAnalyzer((), percentile="99")
    with pytest.raises(ValueError, match="gamma"):
        SqnrEncodingAnalyzer((), gamma=0.0)
    with pytest.raises(ValueError, match="offset_candidates"):
        SqnrEncodingAnalyzer((), offset_candidates=2)
    with pytest.raises(ValueError, match="symmetric_delta_candidates"):
        SqnrEncodingAnalyzer((), symmetric_delta_candidates=1)
    with pytest.raises(ValueError, match="asymmetric_candidates"):
        MseEncodingAnalyzer((), asymmetric_candidates=0)
    with pytest.raises(ValueError, match="max_parallelism"):
        EntropyEncodingAnalyzer((), max_parallelism=0)
    with pytest.raises(ValueError, match="histogram_growth_limit"):
        PercentileEncodingAnalyzer((), histogram_growth_limit=0.5)
    with pytest.raises(TypeError, match="unexpected keyword"):
        SqnrEncodingAnalyzer((), bins=10)
    with pytest.raises(ValueError, match="block_size"):
        MseEncodingAnalyzer((4, 2), block_size=(1,))
    a = SqnrEncodingAnalyzer((3, 1))
    with pytest.raises(ValueError, match="does not broadcast"):
        a.update_stats(torch.ones(4, 4))
    with pytest.raises(TypeError, match="floating-point"):
        a.update_stats(torch.ones(3, 4, dtype=torch.int32))
    a.update_stats(torch.ones(3, 4))
    with pytest.raises(ValueError, match="num_steps"):
        a.compute_encodings(15.5, False)
    with pytest.raises(ValueError, match="num_steps"):
        a.compute_encodings(0, False)
    with pytest.raises(TypeError, match="is_symmetric"):
        a.compute_encodings(15, 1)
    assert torch.equal(a.compute_encodings(math.pow(2, 8), False)[1], a.compute_encodings(256, False)[1])


def test_memory_is_bounded_by_shape_and_bins():
    a = MseEncodingAnalyzer((4, 1), num_bins=64)
    g = torch.Generator().manual_seed(7)
    for i in range(30):
        a.update_stats(torch.randn(50, 4, 16, generator=g) * (1 + i))
    assert a.stats.counts.shape == (4, 64)
    assert int(a.stats.total().sum()) == 30 * 50 * 4 * 16


# -- quantizers -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls, kw", ALL_ANALYZERS, ids=IDS)
def test_quantizers_calibrate_with_any_analyzer(cls, kw):
    g = torch.Generator().manual_seed(8)
    batches = [torch.randn(16, 8, 32, generator=g) * 2 + 0.5 for _ in range(3)]
    for shape, block_size in (((), None), ((8, 1), None), ((8, 4), (1, 8))):
        for symmetric in (False, True):
            q = Q.affine.QuantizeDequantize(shape, 4, symmetric, encoding_analyzer=cls(shape, block_size=block_size,
                                                                                        **kw),
                                            block_size=block_size)
            with q.compute_encodings():
                for b in batches:
                    out = q(b)
                    assert out.shape == b.shape
            ref = cls(shape, block_size=block_size, **kw)
            for b in batches:
                ref.update_stats(b)
            lo, hi = ref.compute_encodings(q.grid.num_steps, symmetric)
            assert torch.equal(q.min.detach(), lo) and torch.equal(q.max.detach(), hi)
            assert torch.isfinite(q(batches[0])).all()
    quantizer = Q.affine.Quantize((8, 1), 8, True, encoding_analyzer=cls((8, 1), **kw))
    with quantizer.compute_encodings():
        codes = quantizer(batches[0])
    assert codes.min() >= -128 and codes.max() <= 127


def test_calibration_forward_uses_the_batch_own_encoding():
    x = torch.cat([torch.linspace(-1, 1, 4001), torch.tensor([8.0])])
    a = MseEncodingAnalyzer(())
    q = Q.affine.QuantizeDequantize((), 4, False, encoding_analyzer=a)
    with q.compute_encodings():
        out = q(x)
    other = Q.affine.QuantizeDequantize((), 4, False)
    other.set_range(*MseEncodingAnalyzer(()).compute_dynamic_encodings(x, 15, False))
    assert torch.equal(out.as_subclass(torch.Tensor).detach(), other(x).as_subclass(torch.Tensor).detach())


@pytest.mark.parametrize("cls, kw", ALL_ANALYZERS, ids=IDS)
def test_float_quantizer_calibrates_with_any_analyzer(cls, kw):
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(9)) * 3
    q = Q.float.FloatQuantizeDequantize(exponent_bits=4, mantissa_bits=3, shape=(4, 1),
                                        encoding_analyzer=cls((4, 1), **kw))
    with q.compute_encodings():
        q(x)
    ref = cls((4, 1), **kw)
    ref.update_stats(x)
    lo, hi = ref.compute_encodings(255, False)
    assert torch.equal(q.maxval, torch.maximum(lo.abs(), hi.abs()))


def test_quantizer_with_nan_data_is_left_with_a_finite_range():
    q = Q.affine.QuantizeDequantize((2, 1), 8, False, encoding_analyzer=SqnrEncodingAnalyzer((2, 1)))
    x = torch.tensor([[float("nan"), 1.0, -2.0], [float("nan"), float("inf"), float("nan")]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with q.compute_encodings():
            q(x)
    assert torch.isfinite(q.min).all() and torch.isfinite(q.max).all()
    assert torch.isfinite(q.get_scale()).all()


def test_histogram_analyzers_are_histogram_based():
    for cls, _ in HISTOGRAM_ANALYZERS:
        assert issubclass(cls, HistogramEncodingAnalyzer)
    a = SqnrEncodingAnalyzer((2, 1), num_bins=32, block_size=None)
    assert repr(a) == "SqnrEncodingAnalyzer(shape=(2, 1), num_bins=32, gamma=3)"
    hist, _ = histogram(torch.ones(2, 3), 32)
    assert hist.counts.shape == (2, 32)
