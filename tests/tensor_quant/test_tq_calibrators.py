"""MaxCalibrator and HistogramCalibrator against brute-force references on small inputs."""

import math

import numpy as np
import pytest
import torch

from quanta.tensor_quant import HistogramCalibrator, MaxCalibrator
from quanta.tensor_quant.calib import histogram as H

# -- MaxCalibrator --------------------------------------------------------------------------------------------


def test_max_per_tensor_running():
    c = MaxCalibrator(8, None, False)
    assert c.compute_amax() is None
    c.collect(torch.tensor([1.0, -3.0, 2.0]))
    c.collect(torch.tensor([[0.5], [-2.5]]))  # another shape is fine per tensor
    amax = c.compute_amax()
    assert amax.shape == () and amax.item() == 3.0 and amax.dtype == torch.float32
    c.collect(torch.tensor([-7.0]))
    assert c.compute_amax().item() == 7.0
    c.reset()
    assert c.compute_amax() is None


@pytest.mark.parametrize("axis", [0, 1, -1, (0, 2), (1,)])
def test_max_per_axis_matches_numpy(axis):
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randn(3, 4, 5, generator=gen) * (i + 1) for i in range(3)]
    c = MaxCalibrator(8, axis, False)
    for b in batches:
        c.collect(b)
    kept = {a % 3 for a in ((axis,) if isinstance(axis, int) else axis)}
    reduce = tuple(d for d in range(3) if d not in kept)
    expected = np.max([np.abs(b.numpy()).max(axis=reduce, keepdims=True) for b in batches], axis=0)
    np.testing.assert_array_equal(c.compute_amax().numpy(), expected)


def test_max_shape_change_and_track_amax():
    c = MaxCalibrator(8, 0, False, track_amax=True)
    c.collect(torch.ones(3, 2))
    c.collect(torch.ones(3, 7) * 2)  # reduced dims may change
    assert [a.tolist() for a in c.amaxs] == [[[1.0]] * 3, [[2.0]] * 3]
    with pytest.raises(ValueError, match=r"amax shape changed from \(3, 1\) to \(4, 1\)"):
        c.collect(torch.ones(4, 2))


def test_max_ignores_non_finite_and_rejects_all_nan():
    c = MaxCalibrator(8, None, False)
    with pytest.warns(RuntimeWarning, match="ignoring 2 non-finite"):
        c.collect(torch.tensor([1.0, float("nan"), -2.0, float("inf")]))
    assert c.compute_amax().item() == 2.0
    with pytest.raises(ValueError, match="NaN or inf"):
        c.collect(torch.full((4,), float("nan")))


def test_unsigned_calibrator_warns_on_negative_values():
    c = MaxCalibrator(8, None, True)
    with pytest.warns(RuntimeWarning, match="negative values"):
        c.collect(torch.tensor([-1.0, 0.5]))
    assert c.compute_amax().item() == 1.0


def test_calibrator_argument_validation():
    with pytest.raises(ValueError):
        MaxCalibrator(0, None, False)
    with pytest.raises(TypeError):
        MaxCalibrator(8, "0", False)
    with pytest.raises(TypeError):
        HistogramCalibrator(8, None, False, num_bins=2.5)
    with pytest.raises(ValueError, match="grow_method"):
        HistogramCalibrator(8, None, False, grow_method="double")
    with pytest.raises(TypeError, match="floating-point"):
        MaxCalibrator(8, None, False).collect(torch.ones(3, dtype=torch.int64))


# -- histogram collection --------------------------------------------------------------------------------------


def _bin_brute_force(values, width, nbins):
    """Counts of |v| in bins [k*w, (k+1)*w), the top edge going to the last bin; plain Python."""
    counts = [0] * nbins
    for v in values:
        k = math.floor(abs(v) / width)
        counts[min(k, nbins - 1)] += 1
    return counts


def test_first_batch_histogram_by_hand():
    c = HistogramCalibrator(8, None, False, num_bins=8)
    x = torch.tensor([0.0, 0.25, 0.5, -0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0])
    c.collect(x)
    counts, edges = c.histogram()
    # width 2/8 = 0.25; the maximum lands in the last bin
    assert counts.tolist() == [[1, 1, 2, 1, 1, 1, 1, 2]]
    assert edges.tolist() == [[0.25 * k for k in range(9)]]


def test_histogram_matches_numpy_histogram():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5000, generator=gen)
    c = HistogramCalibrator(8, None, False, num_bins=100)
    c.collect(x)
    counts, edges = c.histogram()
    ref, _ = np.histogram(x.abs().double().numpy(), bins=edges[0].numpy())
    diff = np.abs(counts[0].numpy() - ref)
    assert diff.sum() <= 2 and counts.sum().item() == 5000  # a value on an edge may land one bin over


@pytest.mark.parametrize("grow", ["append", "stretch"])
def test_growth_keeps_exact_counts(grow):
    gen = torch.Generator().manual_seed(2)
    # dyadic values (multiples of 1/64): every bin boundary comparison is exact
    b1 = torch.randint(-64, 65, (500,), generator=gen).float() / 64  # max |x| = 1 -> width 1/16
    b2 = torch.randint(-160, 161, (500,), generator=gen).float() / 64  # max |x| = 2.5
    b1[0], b2[0] = 1.0, 2.5
    c = HistogramCalibrator(8, None, False, num_bins=16, grow_method=grow)
    c.collect(b1)
    c.collect(b2)
    counts, edges = c.histogram()
    if grow == "append":
        width, nbins = 1 / 16, 40  # ceil(2.5 / (1/16)) bins of the original width
    else:
        width, nbins = 1 / 4, 16  # width doubled twice: 16 * 0.25 = 4 >= 2.5
    assert counts.shape == (1, nbins) and edges[0, 1].item() == width
    # each batch is binned with the range of its time (its maximum in the then-last bin)
    first = _bin_brute_force(b1.tolist(), 1 / 16, 16)
    if grow == "append":
        first = first + [0] * (nbins - 16)
    else:
        first = [sum(first[4 * k: 4 * k + 4]) for k in range(16 // 4)] + [0] * (16 - 16 // 4)
    second = _bin_brute_force(b2.tolist(), width, nbins)
    assert counts[0].tolist() == [a + b for a, b in zip(first, second)]


def test_append_limit():
    c = HistogramCalibrator(8, None, False, num_bins=16)
    c.collect(torch.tensor([1e-6]))
    with pytest.raises(ValueError, match="stretch"):
        c.collect(torch.tensor([1e3]))


def test_histogram_ignores_nan_and_rejects_all_nan():
    c = HistogramCalibrator(8, None, False, num_bins=4)
    with pytest.warns(RuntimeWarning, match="non-finite"):
        c.collect(torch.tensor([1.0, float("nan"), 4.0, float("-inf")]))
    assert c.histogram()[0].tolist() == [[0, 1, 0, 1]]
    with pytest.raises(ValueError, match="every one of the 3 input values is NaN or inf"):
        c.collect(torch.full((3,), float("nan")))
    with pytest.raises(ValueError, match="NaN or inf"):
        HistogramCalibrator(8, 0, False).collect(torch.full((2, 2), float("nan")))


def test_skip_zeros_and_all_zero_channels():
    c = HistogramCalibrator(8, 0, False, num_bins=4, skip_zeros=True)
    c.collect(torch.tensor([[0.0, 0.0, 4.0], [0.0, 0.0, 0.0]]))
    counts, _ = c.histogram()
    assert counts.tolist() == [[0, 0, 0, 1], [0, 0, 0, 0]]
    for method in ("percentile", "entropy", "mse"):
        amax = c.compute_amax(method, start_bin=1)
        assert amax.shape == (2, 1) and amax[1].item() == 0.0
    c = HistogramCalibrator(8, None, False, num_bins=4)
    c.collect(torch.zeros(5))  # only zeros so far: amax 0
    assert c.compute_amax("percentile").item() == 0.0
    c.collect(torch.tensor([2.0]))  # the range is set by the first non-zero batch, zeros stay in bin 0
    assert c.histogram()[0].tolist() == [[5, 0, 0, 1]]


# -- compute_amax ----------------------------------------------------------------------------------------------


def test_compute_amax_argument_checks():
    c = HistogramCalibrator(8, None, False, num_bins=16)
    assert c.compute_amax("entropy") is None  # nothing seen yet
    c.collect(torch.rand(100))
    with pytest.raises(ValueError, match="method must be one of"):
        c.compute_amax("max")
    with pytest.raises(ValueError, match="percentile"):
        c.compute_amax("percentile", percentile=101)
    with pytest.raises(ValueError, match="start_bin"):
        c.compute_amax("entropy", start_bin=0)
    with pytest.raises(ValueError, match="stride"):
        c.compute_amax("mse", stride=0)
    with pytest.raises(TypeError):
        c.compute_amax("mse", 1)  # options are keyword-only
    with pytest.raises(ValueError, match="FP8"):
        fp8 = HistogramCalibrator((4, 3), None, False, num_bins=16)
        fp8.collect(torch.rand(10))
        fp8.compute_amax("entropy")


@pytest.mark.parametrize("percentile", [50.0, 90.0, 99.0, 99.9, 100.0])
def test_percentile_matches_numpy_up_to_a_bin(percentile):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(20000, generator=gen)
    c = HistogramCalibrator(8, None, False, num_bins=512)
    c.collect(x[:10000])
    c.collect(x[10000:] * 1.3)
    data = torch.cat([x[:10000], x[10000:] * 1.3]).abs().double().numpy()
    width = c.histogram()[1][0, 1].item()
    amax = c.compute_amax("percentile", percentile=percentile).item()
    true = np.percentile(data, percentile)
    assert true - 1e-9 <= amax <= true + width + 1e-6  # the upper edge of the bin holding the percentile
    # at least `percentile`% of |x| lies within amax
    assert (data <= amax + 1e-12).mean() >= percentile / 100 - 1e-12


def _entropy_brute_force(hist, edges, num_bits, unsigned, start_bin, stride):
    """TensorRT's KL calibration written out literally (np.digitize on a linspace, dict of groups)."""
    bins = [float(v) for v in hist]
    bins[0] = bins[1]
    nq = 2 ** (num_bits - 1 + int(unsigned))
    results = []
    for i in range(start_bin, len(bins) + 1, stride):
        group_of = np.digitize(np.arange(i), np.linspace(0, i, nq + 1)) - 1
        members = {}
        for j in range(i):
            if bins[j] != 0:
                members.setdefault(int(group_of[j]), []).append(j)
        q = [0.0] * i
        for js in members.values():
            for j in js:
                q[j] = sum(bins[k] for k in js) / len(js)
        p = bins[:i]
        p[-1] += sum(bins[i:])
        sp, sq = sum(p), sum(q)
        kl = 0.0
        for pj, qj in zip(p, q):
            if pj > 0:
                kl = math.inf if qj == 0 else kl + pj / sp * math.log((pj / sp) / (qj / sq))
        results.append((kl, i))
    best = min(kl for kl, _ in results)
    i_best = [i for kl, i in results if kl == best][-1]
    return edges[i_best], results


@pytest.mark.parametrize("num_bits, unsigned, stride", [(4, False, 1), (3, True, 1), (4, False, 3), (8, False, 1)])
def test_entropy_matches_brute_force(num_bits, unsigned, stride):
    gen = torch.Generator().manual_seed(4 + num_bits + stride)
    x = torch.cat([torch.randn(3000, generator=gen), torch.randn(30, generator=gen) * 6])  # a tail of outliers
    c = HistogramCalibrator(num_bits, None, unsigned, num_bins=96)
    c.collect(x.abs() if unsigned else x)
    counts, edges = c.histogram()
    expected, results = _entropy_brute_force(counts[0].tolist(), edges[0].tolist(), num_bits, unsigned, 10, stride)
    amax = c.compute_amax("entropy", start_bin=10, stride=stride).item()
    assert amax == pytest.approx(expected, rel=1e-6)
    if 2 ** (num_bits - 1 + int(unsigned)) < 96:  # with fewer levels than bins the sparse tail is clipped
        assert amax < x.abs().max().item()


def test_entropy_by_hand_on_a_tiny_histogram():
    # counts over 4 bins of width 1: [.., 4, 0, 1] -> bin 0 := bin 1 = 4; 1-bit unsigned: 2 groups
    c = HistogramCalibrator(1, None, True, num_bins=4)
    c.collect(torch.tensor([0.5, 1.2, 1.4, 1.6, 1.8, 4.0]))
    assert c.histogram()[0].tolist() == [[1, 4, 0, 1]]
    # candidates i = 2, 3, 4 (start_bin 2); groups = 2, so each of the first i bins is its own group for i = 2:
    #   i=2: P = [4, 4+1], Q = [4, 4] -> KL = 4/9 log((4/9)/(1/2)) + 5/9 log((5/9)/(1/2)) > 0
    #   i=3: P = [4, 4, 0+1] (outlier into bin 2), Q: groups {0}, {1, 2}; bin 2 empty -> q = 0 where p > 0 -> inf
    #   i=4: P = [4, 4, 0, 1], Q: groups {0, 1}, {2, 3}: q = [4, 4, 0, 1] -> KL = 0
    assert c.compute_amax("entropy", start_bin=2).item() == 4.0
    c2 = HistogramCalibrator(1, None, True, num_bins=4)
    c2.collect(torch.tensor([0.5, 1.2, 1.4, 1.6, 1.8, 4.0]))
    assert c2.compute_amax("entropy", start_bin=2, stride=5).item() == 2.0  # only i = 2 is tried


def test_entropy_ties_take_the_last_candidate():
    # width 1, counts [1, 3, 0, 2, 0, 1] (bin 0 becomes 3); 1-bit unsigned: 2 groups.
    # Candidates 3 and 5 (stride 2) both fold outliers into an empty bin (q = 0 where p > 0): KL = inf for both,
    # and TensorRT's rule (last minimum) picks i = 5.
    c = HistogramCalibrator(1, None, True, num_bins=6)
    c.collect(torch.tensor([0.5, 1.2, 1.4, 1.6, 3.2, 3.4, 6.0]))
    assert c.histogram()[0].tolist() == [[1, 3, 0, 2, 0, 1]]
    assert c.compute_amax("entropy", start_bin=3, stride=2).item() == 5.0


def _mse_brute_force(hist, width, num_bits, unsigned, start_bin, stride):
    centers = (np.arange(len(hist)) + 0.5) * width
    c32 = centers.astype(np.float32)
    hi = 2 ** (num_bits - 1 + int(unsigned)) - 1
    lo = 0 if unsigned else -hi
    errs = []
    for i in range(start_bin, len(hist), stride):
        s = np.float32(hi) / c32[i]
        q = np.clip(np.rint(c32 * s), lo, hi).astype(np.float32) / s
        errs.append((float(np.sum(np.asarray(hist, dtype=np.float64) * (q.astype(np.float64) - c32) ** 2)), i))
    best = min(e for e, _ in errs)
    i_best = [i for e, i in errs if e == best][0]
    return float(c32[i_best]), errs


@pytest.mark.parametrize("num_bits, unsigned, stride", [(4, False, 1), (3, True, 2), (8, False, 1)])
def test_mse_matches_exhaustive_search(num_bits, unsigned, stride):
    gen = torch.Generator().manual_seed(5 + num_bits)
    x = torch.cat([torch.randn(4000, generator=gen), torch.randn(40, generator=gen) * 5])
    c = HistogramCalibrator(num_bits, None, unsigned, num_bins=128)
    c.collect(x.abs() if unsigned else x)
    counts, edges = c.histogram()
    width = edges[0, 1].item()
    expected, errs = _mse_brute_force(counts[0].tolist(), width, num_bits, unsigned, 16, stride)
    amax = c.compute_amax("mse", start_bin=16, stride=stride).item()
    err_of = dict((i, e) for e, i in errs)
    chosen = round(amax / width - 0.5)
    assert amax == pytest.approx(expected, rel=1e-6) or err_of[chosen] <= min(err_of.values()) * (1 + 1e-12)


def test_mse_fp8_runs_on_cpu():
    gen = torch.Generator().manual_seed(6)
    c = HistogramCalibrator((4, 3), None, False, num_bins=64)
    c.collect(torch.randn(2000, generator=gen))
    amax = c.compute_amax("mse", start_bin=8)
    width = c.histogram()[1][0, 1].item()
    assert 8 * width <= amax.item() <= 64 * width


@pytest.mark.parametrize("grow", ["append", "stretch"])
@pytest.mark.parametrize("method, kwargs", [("percentile", {"percentile": 99.0}), ("entropy", {"start_bin": 16}),
                                            ("mse", {"start_bin": 16, "stride": 2})])
def test_per_axis_equals_per_tensor_on_each_channel(method, kwargs, grow):
    gen = torch.Generator().manual_seed(7)
    scales = torch.tensor([0.5, 1.0, 3.0, 0.0, 2.0]).reshape(1, 5, 1)
    batches = [torch.randn(4, 5, 30, generator=gen) * scales * (1 + b) for b in range(3)]
    c = HistogramCalibrator(8, 1, False, num_bins=64, grow_method=grow)
    for b in batches:
        c.collect(b)
    amax = c.compute_amax(method, **kwargs)
    assert amax.shape == (1, 5, 1)
    for ch in range(5):
        single = HistogramCalibrator(8, None, False, num_bins=64, grow_method=grow)
        for b in batches:
            single.collect(b[:, ch])
        assert amax[0, ch, 0].item() == single.compute_amax(method, **kwargs).item(), ch
    assert amax[0, 3, 0].item() == 0.0  # the all-zero channel


def test_default_histogram_size_methods_are_reasonable():
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(50000, generator=gen)
    c = HistogramCalibrator(8, None, False)
    c.collect(x)
    top = x.abs().max().item()
    for method in ("entropy", "mse", "percentile"):
        amax = c.compute_amax(method).item()
        assert 2.0 < amax <= top + 1e-6, method
    assert c.compute_amax("percentile", percentile=100.0).item() >= top


def test_vectorised_over_channels():
    import time

    gen = torch.Generator().manual_seed(9)
    c = HistogramCalibrator(8, 0, False, num_bins=256)
    c.collect(torch.randn(32, 400, generator=gen))
    start = time.perf_counter()
    amax = c.compute_amax("entropy", start_bin=32)
    assert amax.shape == (32, 1) and bool((amax > 0).all())
    assert time.perf_counter() - start < 10.0


def test_histogram_module_constants():
    assert H.HistogramMethod("mse") is H.HistogramMethod.MSE
    assert H.GrowMethod("append") is H.GrowMethod.APPEND
