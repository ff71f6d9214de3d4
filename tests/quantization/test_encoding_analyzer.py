import warnings

import pytest
import torch

from quanta.quantization.encoding_analyzer import MinMaxEncodingAnalyzer, StatisticsNotFoundError


def test_running_min_max_per_tensor():
    a = MinMaxEncodingAnalyzer(shape=())
    a.update_stats(torch.tensor([1.0, 2.0]))
    a.update_stats(torch.tensor([-3.0, 0.5]))
    assert a.stats.min.item() == -3.0 and a.stats.max.item() == 2.0
    lo, hi = a.compute_encodings(num_steps=255, is_symmetric=False)
    assert (lo.item(), hi.item()) == (-3.0, 2.0)


def test_batch_order_does_not_matter():
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randn(16, 8, generator=gen) for _ in range(5)]
    results = []
    for order in (batches, batches[::-1]):
        a = MinMaxEncodingAnalyzer(shape=(16, 1))
        for b in order:
            a.update_stats(b)
        results.append(a.compute_encodings(255, False))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_per_channel_and_per_block_reduce_the_right_elements():
    x = torch.arange(32.0).reshape(4, 8) - 10
    a = MinMaxEncodingAnalyzer(shape=(4, 1))
    a.update_stats(x)
    assert a.stats.min.flatten().tolist() == [-10.0, -2.0, 6.0, 14.0]
    b = MinMaxEncodingAnalyzer(shape=(4, 2), block_size=(-1, 4))
    b.update_stats(x)
    assert b.stats.min.tolist() == [[-10.0, -6.0], [-2.0, 2.0], [6.0, 10.0], [14.0, 18.0]]
    assert b.stats.max.tolist() == [[-7.0, -3.0], [1.0, 5.0], [9.0, 13.0], [17.0, 21.0]]
    c = MinMaxEncodingAnalyzer(shape=(4, 1))
    c.update_stats(torch.stack([x, x + 100]))  # a leading batch dim broadcasts
    assert c.stats.max.flatten().tolist() == [97.0, 105.0, 113.0, 121.0]


def test_zero_is_always_inside():
    a = MinMaxEncodingAnalyzer(shape=())
    a.update_stats(torch.tensor([2.0, 3.0]))
    lo, hi = a.compute_encodings(255, False)
    assert lo.item() == 0.0 and hi.item() == 3.0


@pytest.mark.parametrize("qmin, qmax", [(-2, 1), (0, 3)])
def test_two_bit_symmetric_range_clips_the_positive_end(qmin, qmax):
    """AIMET's MinMax rule for 3 steps, symmetric: ``delta = max(max / 2, -min / 2)`` (issue 16's case);
    the quantizer then spends all four codes on symmetric data."""
    import quanta.quantization as Q

    a = MinMaxEncodingAnalyzer(shape=())
    a.update_stats(torch.tensor([2.0, 5.06]))
    lo, hi = a.compute_encodings(num_steps=3, is_symmetric=True)
    assert (lo.item(), hi.item()) == (torch.tensor(-5.06).item(), torch.tensor(2.53).item())
    lo, hi = a.compute_encodings(num_steps=2, is_symmetric=True)  # strict symmetric: no special rule
    assert (lo.item(), hi.item()) == (torch.tensor(-5.06).item(), torch.tensor(5.06).item())
    q = Q.affine.QuantizeDequantize((), qmin=qmin, qmax=qmax, symmetric=True)
    with q.compute_encodings():
        q(torch.tensor([-1.0, -0.4, 0.3, 1.0]))
    assert q.get_scale().item() == 0.5
    assert q(torch.tensor([-1.0, -0.4, 0.3, 1.0])).tolist() == [-1.0, -0.5, 0.5, 0.5]


def test_dynamic_encodings_leave_running_stats_alone():
    a = MinMaxEncodingAnalyzer(shape=())
    a.update_stats(torch.tensor([-1.0, 1.0]))
    lo, hi = a.compute_dynamic_encodings(torch.tensor([-5.0, 5.0]), 255, False)
    assert (lo.item(), hi.item()) == (-5.0, 5.0)
    assert a.stats.max.item() == 1.0


def test_non_finite_values_are_ignored_with_a_warning():
    a = MinMaxEncodingAnalyzer(shape=(2, 1))
    with pytest.warns(RuntimeWarning, match="non-finite"):
        a.update_stats(torch.tensor([[float("nan"), 1.0], [float("inf"), float("-inf")]]))
    lo, hi = a.compute_encodings(255, False)
    assert torch.isfinite(lo).all() and torch.isfinite(hi).all()
    assert hi[0].item() == 1.0 and hi[1].item() > 0  # the all-inf row falls back to a minimal range


def test_empty_batch_changes_nothing():
    a = MinMaxEncodingAnalyzer(shape=())
    assert a.update_stats(torch.empty(0)) is None
    with pytest.raises(StatisticsNotFoundError, match="compute_encodings"):
        a.compute_encodings(255, False)


def test_reset():
    a = MinMaxEncodingAnalyzer(shape=())
    a.update_stats(torch.tensor([1.0]))
    a.reset_stats()
    with pytest.raises(StatisticsNotFoundError):
        a.compute_encodings(255, False)


def test_bad_arguments():
    with pytest.raises(TypeError, match="shape"):
        MinMaxEncodingAnalyzer(shape="(2,)")
    with pytest.raises(ValueError, match="shape"):
        MinMaxEncodingAnalyzer(shape=(0,))
    a = MinMaxEncodingAnalyzer(shape=(3, 1))
    with pytest.raises(ValueError, match="does not broadcast"):
        a.update_stats(torch.ones(4, 4))
    with pytest.raises(TypeError, match="floating-point"):
        a.update_stats(torch.ones(3, 4, dtype=torch.int32))


def test_no_warning_for_clean_input():
    a = MinMaxEncodingAnalyzer(shape=())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a.update_stats(torch.randn(100))
