"""Streaming histograms (quanta.kernels.histograms) against plain per-value references."""

import math
import random

import numpy as np
import pytest
import torch

from quanta.kernels import histograms as hk
from quanta.kernels.blocks import resolve_layout


def reference_exponent(lo: float, hi: float, num_bins: int) -> int | None:
    """The definition, by search over all exponents (None: no non-zero value)."""
    amax = max(abs(lo), abs(hi))
    if amax == 0:
        return None
    floor_e = math.frexp(amax)[1] - 1 - 30
    for e in range(floor_e, 2000):
        if math.floor(hi / 2.0**e) - math.floor(lo / 2.0**e) + 1 <= num_bins:
            return e
    raise AssertionError("unreachable")


def reference_histogram(values: list[float], num_bins: int) -> tuple[list[int], int | None, int]:
    """Counts, exponent and start of one row, value by value in Python floats."""
    finite = [v for v in values if math.isfinite(v)]
    lo, hi = min(finite), max(finite)
    e = reference_exponent(lo, hi, num_bins)
    w = 1.0 if e is None else 2.0**e
    start = 0 if e is None else math.floor(lo / w)
    counts = [0] * num_bins
    for v in finite:
        counts[(0 if e is None else math.floor(v / w)) - start] += 1
    return counts, e, start


def random_rows(seed: int, h: int, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    scales = torch.tensor([10.0 ** random.Random(seed + i).uniform(-6, 6) for i in range(h)])
    shifts = torch.randn(h, generator=g) * scales * 3
    x = torch.randn(h, n, generator=g) * scales[:, None] + shifts[:, None]
    return x


@pytest.mark.parametrize("num_bins", [2, 3, 16, 2048])
def test_histogram_matches_per_value_reference(num_bins):
    rows = random_rows(0, 7, 300)
    rows[3] = 0.0  # zeros only
    rows[4] = 5.25  # a constant
    rows[5, :10] = torch.tensor([1e-40, -1e-40, -1e-45, 1e-45, 0.0, -0.0, 3e-39, -3e-39, 1e-38, -1e-38])
    h, ignored = hk.histogram(rows, num_bins)
    assert ignored == 0
    for r in range(rows.shape[0]):
        vals = rows[r].tolist()
        counts, e, start = reference_histogram(vals, num_bins)
        assert h.counts[r].tolist() == counts, r
        assert int(h.exponent[r]) == (hk.NO_WIDTH if e is None else e)
        assert int(h.start[r]) == start
        assert h.min[r].item() == min(vals) and h.max[r].item() == max(vals)


def test_tiny_negative_values_land_below_zero_even_when_the_scaling_underflows():
    # w = 2**3 (range 1000 / 16 bins): -1e-45 * 2**-3 underflows to -0.0, yet floor(-1e-45 / 8) = -1
    x = torch.tensor([[-1e-45, 1e-45, 1000.0, -5.0]])
    h, _ = hk.histogram(x, 16)
    counts, e, start = reference_histogram(x[0].tolist(), 16)
    assert int(h.exponent[0]) == e > 0
    assert h.counts[0].tolist() == counts


def test_subnormal_rows_bin_in_float64():
    x = torch.tensor([[1e-44, 3e-44, -2e-44, 0.0]])  # exponents far below float32's scaling range
    h, _ = hk.histogram(x, 8)
    counts, e, start = reference_histogram(x[0].tolist(), 8)
    assert int(h.exponent[0]) == e < -100
    assert h.counts[0].tolist() == counts


def test_required_exponent_is_the_smallest_that_fits():
    rnd = random.Random(1)
    lo, hi = [], []
    for _ in range(500):
        a = rnd.uniform(-1, 1) * 10 ** rnd.uniform(-8, 8)
        b = a + abs(rnd.uniform(0, 1)) * 10 ** rnd.uniform(-8, 8)
        a, b = float(np.float32(a)), float(np.float32(b))
        lo.append(a)
        hi.append(max(a, b))
    nb = 37
    got = hk.required_exponent(torch.tensor(lo), torch.tensor(hi), nb)
    for i in range(len(lo)):
        assert int(got[i]) == reference_exponent(lo[i], hi[i], nb)


def test_non_finite_values_are_counted_out():
    x = torch.tensor([[1.0, float("nan"), 2.0, float("inf")], [float("-inf"), float("nan"), 0.0, 0.0],
                      [float("nan")] * 4])
    h, ignored = hk.histogram(x, 4)
    assert ignored == 8
    assert h.total().tolist() == [2, 2, 0]
    assert h.seen().tolist() == [True, True, False]
    assert h.min[0].item() == 1.0 and h.max[0].item() == 2.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_merge_is_exact_whatever_the_split_and_order(seed):
    rows = random_rows(seed, 5, 400)
    rows[2, 350:] *= 1000  # a late outlier forces growth by several doublings
    whole, _ = hk.histogram(rows, 64)
    rnd = random.Random(seed)
    cuts = sorted(rnd.sample(range(1, 400), 6))
    parts = [hk.histogram(p, 64)[0] for p in torch.tensor_split(rows, cuts, dim=1)]
    for order in (parts, parts[::-1], rnd.sample(parts, len(parts))):
        acc = hk.empty(5, 64)
        for p in order:
            acc = hk.merge(acc, p)
        for field in ("counts", "exponent", "start", "min", "max"):
            assert torch.equal(getattr(acc, field), getattr(whole, field)), field


def test_merge_of_zero_rows_and_empty_rows():
    zeros, _ = hk.histogram(torch.zeros(1, 5), 8)
    assert int(zeros.exponent[0]) == hk.NO_WIDTH and zeros.counts[0, 0] == 5
    m = hk.merge(zeros, hk.histogram(torch.tensor([[-3.0, 4.0]]), 8)[0])
    whole, _ = hk.histogram(torch.tensor([[0.0] * 5 + [-3.0, 4.0]]), 8)
    assert torch.equal(m.counts, whole.counts)
    assert torch.equal(hk.merge(hk.empty(1, 8), zeros).counts, zeros.counts)


def test_align_refuses_finer_bins_and_short_coverage():
    h, _ = hk.histogram(torch.tensor([[0.0, 1.0, 2.0, 3.0]]), 4)
    with pytest.raises(ValueError, match="finer"):
        hk.align(h, h.exponent - 1, h.start)
    with pytest.raises(ValueError, match="cover"):
        hk.align(h, h.exponent, h.start + 1)


def test_limits_clamp_values_into_the_range():
    x = torch.tensor([[-100.0, 0.5, 1.0, 100.0], [1.0, 2.0, 3.0, 4.0]])
    h, _ = hk.histogram(x, 16, limits=(torch.tensor([-2.0, float("nan")]), torch.tensor([2.0, float("nan")])))
    assert h.min.tolist() == [-2.0, 1.0] and h.max.tolist() == [2.0, 4.0]
    ref, _ = hk.histogram(torch.tensor([[-2.0, 0.5, 1.0, 2.0], [1.0, 2.0, 3.0, 4.0]]), 16)
    assert torch.equal(h.counts, ref.counts)
    inf_row = torch.tensor([[float("inf"), 1.0]])
    h, ignored = hk.histogram(inf_row, 4, limits=(torch.tensor([-1.0]), torch.tensor([1.5])))
    assert ignored == 1 and h.total().tolist() == [1]  # clamping never turns inf into a value


def reference_percentile(counts, edges, lo, hi, p):
    """AIMET's rule written out: lower edges of the bins where the cumulative count reaches the thresholds."""
    if p == 100:
        return lo, hi
    total = sum(counts)
    cum = np.cumsum(counts)
    i_hi = min(int(np.searchsorted(cum, round(total * p / 100, 9))), len(counts) - 1)
    i_lo = min(int(np.searchsorted(cum, round(total * (100 - p) / 100, 9))), len(counts) - 1)
    clamp = lambda v: min(max(v, lo), hi)  # noqa: E731
    return clamp(edges[i_lo]), clamp(edges[i_hi])


@pytest.mark.parametrize("p", [100.0, 99.99, 99.0, 90.0, 75.5, 50.0])
def test_percentile_range_matches_the_rule(p):
    rows = random_rows(3, 6, 1000)
    h, _ = hk.histogram(rows, 128)
    lo, hi = hk.percentile_range(h, p)
    edges = h.edges()
    for r in range(6):
        el, eh = reference_percentile(h.counts[r].tolist(), edges[r].tolist(), h.min[r].item(), h.max[r].item(), p)
        assert lo[r].item() == pytest.approx(el, rel=1e-6, abs=0) and hi[r].item() == pytest.approx(eh, rel=1e-6)


def test_percentile_of_an_empty_row_is_zero():
    lo, hi = hk.percentile_range(hk.empty(2, 8), 99.0)
    assert lo.tolist() == [0.0, 0.0] and hi.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("shape, scale_shape, block_size", [
    ((4, 6), (), None),
    ((4, 6), (4, 1), None),
    ((4, 6), (1, 6), None),
    ((3, 4, 6), (4, 1), None),
    ((4, 6), (4, 3), (1, 2)),
    ((2, 4, 6), (2, 3), (2, 2)),
])
def test_rows_of_groups_exactly_the_elements_of_each_scale_entry(shape, scale_shape, block_size):
    x = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    layout = resolve_layout(shape, scale_shape, block_size)
    rows = hk.rows_of(x, layout)
    owner = layout.expand_scale(torch.arange(math.prod(layout.scale_shape)).reshape(layout.scale_shape))
    for r in range(rows.shape[0]):
        assert sorted(rows[r].tolist()) == sorted(x[owner == r].tolist())


def test_bad_arguments():
    with pytest.raises(ValueError, match="num_bins"):
        hk.histogram(torch.zeros(1, 3), 1)
    with pytest.raises(ValueError, match="2-D"):
        hk.histogram(torch.zeros(3), 4)
    with pytest.raises(ValueError, match="shapes"):
        hk.merge(hk.empty(1, 4), hk.empty(2, 4))
