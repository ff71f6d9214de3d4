"""Quantize / QuantizeDequantize modules (AIMET dialect).

Contract: DESIGN.md, "AIMET dialect". With ``N = qmax - qmin``:
``s = max(|max - min| / N, min(eps_fp32, 0.01/N))``;
asymmetric ``o = clamp(round(min / s) - qmin, -qmax, -qmin)``; symmetric ``o = -round((qmin + qmax) / 2)``;
MinMax calibration includes zero and, if symmetric, uses
``delta = max(max / floor(N/2), -min / ceil(N/2))``, ``min = -ceil(N/2) delta``, ``max = floor(N/2) delta``.
Every expected number below is worked out by hand from these formulas.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import pickle
import warnings

import pytest
import torch
from torch import nn

from quanta.quantization.affine import AffineEncoding, Quantize, QuantizeDequantize
from quanta.quantization.encoding_analyzer import MinMaxEncodingAnalyzer
from quanta.tensors.quantized import QuantizedTensor

QUANTIZERS = [Quantize, QuantizeDequantize]
EPS32 = torch.finfo(torch.float32).eps


def _t(*values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.detach().as_subclass(torch.Tensor)


def _close(actual, expected, rtol=1e-6, atol=1e-7):
    torch.testing.assert_close(_plain(actual).double(), torch.as_tensor(expected, dtype=torch.float64),
                               rtol=rtol, atol=atol)


def _calibrate(q, *batches):
    with q.compute_encodings():
        for b in batches:
            q(b)
    return q


# --------------------------------------------------------------------------------------------------
# construction
# --------------------------------------------------------------------------------------------------


def test_repr_per_tensor():
    q = QuantizeDequantize(shape=(), bitwidth=8, symmetric=False)
    assert repr(q) == "QuantizeDequantize(shape=(), qmin=0, qmax=255, symmetric=False)"


def test_repr_per_block():
    q = QuantizeDequantize(shape=(8, 2), bitwidth=8, symmetric=True, block_size=(-1, 4))
    assert repr(q) == "QuantizeDequantize(shape=(8, 2), block_size=(-1, 4), qmin=-128, qmax=127, symmetric=True)"


def test_repr_quantize_per_channel():
    q = Quantize(shape=(4, 1), bitwidth=4, symmetric=True)
    assert repr(q) == "Quantize(shape=(4, 1), qmin=-8, qmax=7, symmetric=True)"


@pytest.mark.parametrize(
    "bitwidth, symmetric, qmin, qmax",
    [(8, False, 0, 255), (8, True, -128, 127), (4, False, 0, 15), (4, True, -8, 7), (1, False, 0, 1),
     (16, True, -32768, 32767), (32, False, 0, 2**32 - 1)],
)
def test_bitwidth_and_symmetric_give_the_grid(bitwidth, symmetric, qmin, qmax):
    q = QuantizeDequantize(shape=(), bitwidth=bitwidth, symmetric=symmetric)
    assert (q.qmin, q.qmax, q.bitwidth) == (qmin, qmax, bitwidth)
    assert q.symmetric is symmetric


def test_qmin_qmax_keyword_construction():
    q = Quantize(shape=(), qmin=-3, qmax=5)
    assert (q.qmin, q.qmax) == (-3, 5)
    assert repr(q) == "Quantize(shape=(), qmin=-3, qmax=5, symmetric=False)"
    # range [-0.3, 0.5]: s = 0.8 / 8 = 0.1, o = clamp(round(-3), -5, 3) = -3 - (-3) = 0
    q.set_range(-0.3, 0.5)
    _close(q.get_scale(), 0.1)
    assert q.get_offset().item() == 0.0
    out = q(_t(-1.0, -0.26, 0.04, 0.26, 2.0))
    assert type(out) is QuantizedTensor
    assert _plain(out).tolist() == [-3.0, -3.0, 0.0, 3.0, 5.0]


@pytest.mark.parametrize("cls", QUANTIZERS)
@pytest.mark.parametrize("bitwidth, exc", [(0, ValueError), (33, ValueError), (-1, ValueError),
                                           (8.5, (TypeError, ValueError)), (8.0, (TypeError, ValueError)),
                                           (True, (TypeError, ValueError)), ("8", (TypeError, ValueError))])
def test_bad_bitwidth_raises(cls, bitwidth, exc):
    with pytest.raises(exc):
        cls(shape=(), bitwidth=bitwidth)


@pytest.mark.parametrize("cls", QUANTIZERS)
def test_no_bitwidth_and_no_qmin_qmax_raises_type_error(cls):
    with pytest.raises(TypeError):
        cls(shape=())
    with pytest.raises(TypeError):
        cls((), symmetric=True)


def test_block_size_length_mismatch_raises_value_error():
    with pytest.raises(ValueError):
        QuantizeDequantize(shape=(8, 2), bitwidth=8, block_size=(4,))
    with pytest.raises(ValueError):
        QuantizeDequantize(shape=(8, 2), bitwidth=8, block_size=(1, -1, 4))


@pytest.mark.parametrize("calibrating", [False, True])
def test_block_size_not_dividing_the_input_raises_naming_both_shapes(calibrating):
    q = QuantizeDequantize(shape=(8, 2), bitwidth=8, block_size=(-1, 4))
    x = torch.randn(8, 10)  # 10 != 2 * 4
    if calibrating:
        with pytest.raises(ValueError) as info:
            with q.compute_encodings():
                q(x)
    else:
        q.set_range(-1.0, 1.0)
        with pytest.raises(ValueError) as info:
            q(x)
    msg = str(info.value)
    assert "(8, 10)" in msg and "(8, 2)" in msg


def test_encoding_analyzer_of_wrong_shape_raises_value_error():
    with pytest.raises(ValueError):
        QuantizeDequantize(shape=(8, 1), bitwidth=8, encoding_analyzer=MinMaxEncodingAnalyzer((4, 1)))
    # the right shape is accepted and used
    analyzer = MinMaxEncodingAnalyzer((8, 1))
    q = QuantizeDequantize(shape=(8, 1), bitwidth=8, encoding_analyzer=analyzer)
    assert q.encoding_analyzer is analyzer


# --------------------------------------------------------------------------------------------------
# uninitialised quantizers
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", QUANTIZERS)
@pytest.mark.parametrize("shape", [(), (3, 1)])
def test_uninitialised_quantizer_reports_none_and_refuses_to_run(cls, shape):
    q = cls(shape=shape, bitwidth=8)
    assert not q.is_initialized()
    assert q.get_scale() is None
    assert q.get_offset() is None
    assert q.get_min() is None
    assert q.get_max() is None
    assert q.get_encodings() is None
    with pytest.raises(RuntimeError, match="compute_encodings"):
        q(torch.randn(3, 4))


# --------------------------------------------------------------------------------------------------
# compute_encodings (MinMax)
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", QUANTIZERS)
def test_minmax_asymmetric_by_hand(cls):
    q = _calibrate(cls(shape=(), bitwidth=8), _t(-1.0, 0.5, 3.0))
    assert q.is_initialized()
    assert q.min.item() == -1.0 and q.max.item() == 3.0
    s = 4.0 / 255
    _close(q.get_scale(), s)
    # round(-1 / (4/255)) = round(-63.75) = -64
    assert q.get_offset().item() == -64.0
    _close(q.get_min(), -64 * s)
    _close(q.get_max(), (255 - 64) * s)


@pytest.mark.parametrize(
    "data, lo, hi, offset",
    [
        ((2.0, 5.0), 0.0, 5.0, 0.0),  # all positive: min becomes 0
        ((-4.0, -1.0), -4.0, 0.0, -255.0),  # all negative: max becomes 0, round(-4 / (4/255)) = -255
    ],
)
def test_minmax_asymmetric_includes_zero(data, lo, hi, offset):
    q = _calibrate(QuantizeDequantize(shape=(), bitwidth=8), _t(*data))
    assert (q.min.item(), q.max.item()) == (lo, hi)
    _close(q.get_scale(), (hi - lo) / 255)
    assert q.get_offset().item() == offset
    # zero is exactly representable
    assert q(_t(0.0)).item() == 0.0


@pytest.mark.parametrize(
    "bitwidth, data, lo, hi",
    [
        # N = 255: floor = 127, ceil = 128. delta = max(3/127, 1/128) = 3/127.
        (8, (-1.0, 3.0), -128 * 3 / 127, 3.0),
        # delta = max(1/127, 2/128) = 1/64.
        (8, (-2.0, 1.0), -2.0, 127 / 64),
        # N = 15: floor = 7, ceil = 8. delta = max(3.5/7, 1/8) = 0.5.
        (4, (-1.0, 3.5), -4.0, 3.5),
        # all-positive data still gets a negative half: delta = max(2/7, 0/8) = 2/7.
        (4, (0.5, 2.0), -16 / 7, 2.0),
    ],
)
def test_minmax_symmetric_by_hand(bitwidth, data, lo, hi):
    q = _calibrate(QuantizeDequantize(shape=(), bitwidth=bitwidth, symmetric=True), _t(*data))
    n = 2**bitwidth - 1
    _close(q.min, lo)
    _close(q.max, hi)
    _close(q.get_scale(), (hi - lo) / n)
    # offset = -round((qmin + qmax) / 2) = -round(-0.5) = 0
    assert q.get_offset().item() == 0.0
    _close(q.get_min(), lo)
    _close(q.get_max(), hi)


def test_minmax_symmetric_on_explicit_even_grid():
    # qmin=-3, qmax=5: N = 8, floor = ceil = 4. data [-1, 2]: delta = max(2/4, 1/4) = 0.5 -> [-2, 2].
    # s = 4 / 8 = 0.5; o = -round((-3 + 5) / 2) = -1; get_min = 0.5 * (-1 - 3) = -2, get_max = 0.5 * (-1 + 5) = 2.
    q = _calibrate(Quantize(shape=(), qmin=-3, qmax=5, symmetric=True), _t(-1.0, 2.0))
    assert (q.min.item(), q.max.item()) == (-2.0, 2.0)
    assert q.get_scale().item() == 0.5
    assert q.get_offset().item() == -1.0
    assert (q.get_min().item(), q.get_max().item()) == (-2.0, 2.0)
    # Q(x) = clamp(round(x / 0.5) + 1, -3, 5)
    assert _plain(q(_t(-5.0, -0.5, 0.0, 0.7, 1.5, 9.0))).tolist() == [-3.0, 0.0, 1.0, 2.0, 4.0, 5.0]


def test_minmax_accumulates_over_batches():
    q = _calibrate(QuantizeDequantize(shape=(), bitwidth=8), _t(0.5, 1.0), _t(-2.0, 0.25), _t(3.0))
    assert (q.min.item(), q.max.item()) == (-2.0, 3.0)
    _close(q.get_scale(), 5.0 / 255)
    # a second calibration starts from scratch
    _calibrate(q, _t(-0.5, 1.0))
    assert (q.min.item(), q.max.item()) == (-0.5, 1.0)


def test_minmax_per_channel():
    q = QuantizeDequantize(shape=(3, 1), bitwidth=8)
    x = torch.tensor([[1.0, -2.0, 4.0, 0.5],
                      [3.0, 2.0, 1.0, 6.0],  # all positive: min -> 0
                      [-1.0, -7.0, -3.0, -0.5]])  # all negative: max -> 0
    x2 = torch.tensor([[0.0, 0.0, 5.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.0, -8.0, 0.0, 0.0]])
    _calibrate(q, x, x2)
    assert q.min.shape == (3, 1)
    assert _plain(q.min).flatten().tolist() == [-2.0, 0.0, -8.0]
    assert _plain(q.max).flatten().tolist() == [5.0, 6.0, 0.0]
    _close(q.get_scale(), torch.tensor([[7.0], [6.0], [8.0]]) / 255)
    # offsets: round(-2 / (7/255)) = round(-72.857...) = -73; 0; round(-8 / (8/255)) = -255
    assert _plain(q.get_offset()).flatten().tolist() == [-73.0, 0.0, -255.0]


def test_minmax_per_channel_reduces_leading_batch_dims():
    q = QuantizeDequantize(shape=(2, 1), bitwidth=8)
    x = torch.zeros(5, 2, 3)
    x[3, 0, 1] = -4.0
    x[1, 1, 2] = 9.0
    x[4, 0, 0] = 1.0
    _calibrate(q, x)
    assert _plain(q.min).flatten().tolist() == [-4.0, 0.0]
    assert _plain(q.max).flatten().tolist() == [1.0, 9.0]


def test_minmax_per_block():
    q = QuantizeDequantize(shape=(2, 2), bitwidth=8, symmetric=True, block_size=(-1, 2))
    x = torch.tensor([[1.0, -2.0, 4.0, 0.5],
                      [3.0, 2.0, -1.0, -6.0]])
    _calibrate(q, x)
    # raw block stats: min [[-2, 0.5], [2, -6]] -> with zero [[-2, 0], [0, -6]]; max [[1, 4], [3, 0]]
    # delta = max(max/127, -min/128): [[2/128, 4/127], [3/127, 6/128]]
    delta = torch.tensor([[2 / 128, 4 / 127], [3 / 127, 6 / 128]], dtype=torch.float64)
    _close(q.min, -128 * delta)
    _close(q.max, 127 * delta)
    _close(q.get_scale(), delta)
    # the per-block scale is really applied per block: the two halves of row 0 get different steps
    out = _plain(q(torch.full((2, 4), 0.01)))
    s = q.get_scale().detach()
    expected = torch.round(0.01 / s).repeat_interleave(2, dim=1) * s.repeat_interleave(2, dim=1)
    torch.testing.assert_close(out, expected.float(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("symmetric", [False, True])
def test_degenerate_all_zero_input_gives_positive_finite_scale(symmetric):
    q = _calibrate(QuantizeDequantize(shape=(), bitwidth=8, symmetric=symmetric), torch.zeros(10))
    s = q.get_scale().item()
    assert math.isfinite(s) and s > 0
    # the smallest scale: min(eps_fp32, 0.01/255) = eps_fp32, give or take one rounding
    assert s == pytest.approx(EPS32, rel=1e-5)
    assert math.isfinite(q.get_offset().item())
    out = _plain(q(torch.zeros(4)))
    assert torch.equal(out, torch.zeros(4))
    assert torch.isfinite(_plain(q(_t(-1.0, 1.0)))).all()


def test_degenerate_channel_next_to_normal_channel():
    q = _calibrate(QuantizeDequantize(shape=(2, 1), bitwidth=8), torch.tensor([[0.0, 0.0], [-1.0, 1.0]]))
    s = _plain(q.get_scale()).flatten()
    assert s[0] > 0 and torch.isfinite(s).all()
    _close(s[1], 2.0 / 255)


def test_inside_compute_encodings_each_batch_uses_its_own_range():
    q = QuantizeDequantize(shape=(), bitwidth=8)
    q.set_range(-1.0, 1.0)
    x1 = torch.linspace(0.0, 10.0, 301)
    x2 = torch.linspace(0.0, 2.0, 301)
    with q.compute_encodings():
        out1 = _plain(q(x1))
        out2 = _plain(q(x2))
    # With the stored range [-1, 1] the output would clamp at 1; with the batch's range [0, 10] it
    # reaches 10 and every element is within half a step (10/255/2) of the input.
    assert out1.max().item() == pytest.approx(10.0, rel=1e-6)
    assert (out1 - x1).abs().max().item() <= 10.0 / 255 / 2 * (1 + 1e-5)
    # The second batch uses [0, 2], not the accumulated [0, 10]: error within 2/255/2.
    assert (out2 - x2).abs().max().item() <= 2.0 / 255 / 2 * (1 + 1e-5)
    # after the block the accumulated range is the encoding
    assert (q.min.item(), q.max.item()) == (0.0, 10.0)


@pytest.mark.parametrize("cls", QUANTIZERS)
def test_exception_inside_compute_encodings_leaves_encoding_unchanged(cls):
    q = cls(shape=(), bitwidth=8)
    q.set_range(-1.0, 1.0)
    before = q.get_encodings()
    x = _t(-0.5, 0.3, 0.9)
    expected = _plain(q(x))
    with pytest.raises(ZeroDivisionError):
        with q.compute_encodings():
            q(_t(-50.0, 50.0))
            1 / 0
    assert q.is_initialized()
    assert q.get_encodings() == before
    assert (q.min.item(), q.max.item()) == (-1.0, 1.0)
    # out of calibration mode: the stored encoding is used again
    assert torch.equal(_plain(q(x)), expected)


def test_exception_inside_compute_encodings_leaves_uninitialised_quantizer_uninitialised():
    q = QuantizeDequantize(shape=(), bitwidth=8)
    with pytest.raises(KeyError):
        with q.compute_encodings():
            q(_t(1.0, 2.0))
            raise KeyError("boom")
    assert not q.is_initialized()
    assert q.get_scale() is None


@pytest.mark.parametrize("cls", QUANTIZERS)
def test_compute_encodings_without_data_warns_and_stays_uninitialised(cls):
    q = cls(shape=(), bitwidth=8)
    with pytest.warns(RuntimeWarning):
        with q.compute_encodings():
            pass
    assert not q.is_initialized()
    assert q.get_scale() is None and q.get_encodings() is None
    with pytest.raises(RuntimeError):
        q(_t(1.0))


def test_compute_encodings_without_data_keeps_an_existing_encoding():
    q = QuantizeDequantize(shape=(), bitwidth=8)
    q.set_range(-1.0, 3.0)
    before = q.get_encodings()
    with pytest.warns(RuntimeWarning):
        with q.compute_encodings():
            pass
    assert q.get_encodings() == before


def test_allow_overwrite_false_keeps_the_encoding():
    q = QuantizeDequantize(shape=(), bitwidth=8)
    q.set_range(-1.0, 1.0)
    before = q.get_encodings()
    q.allow_overwrite(False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with q.compute_encodings():
            out = _plain(q(_t(-20.0, 0.5, 20.0)))
    assert q.get_encodings() == before
    assert (q.min.item(), q.max.item()) == (-1.0, 1.0)
    # frozen: the forward pass inside the block also used the stored range (clamps at +-1)
    _close(out.abs().max(), 1.0, rtol=1e-2)
    # and re-enabling lets calibration overwrite it
    q.allow_overwrite(True)
    _calibrate(q, _t(-20.0, 20.0))
    assert (q.min.item(), q.max.item()) == (-20.0, 20.0)


# --------------------------------------------------------------------------------------------------
# set_range
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", QUANTIZERS)
def test_set_range_asymmetric_exact_scale_and_offset(cls):
    q = cls(shape=(), bitwidth=8)
    q.set_range(-10, 41)
    assert q.is_initialized()
    # s = 51 / 255 = 0.2, o = round(-10 / 0.2) = -50
    _close(q.get_scale(), 0.2)
    assert q.get_offset().item() == -50.0
    _close(q.get_min(), -10.0, rtol=1e-6)
    _close(q.get_max(), 41.0, rtol=1e-6)
    assert q.get_scale().dtype == torch.float32


def test_set_range_symmetric_exact_scale_and_offset():
    q = Quantize(shape=(), bitwidth=8, symmetric=True)
    q.set_range(-12.8, 12.7)
    _close(q.get_scale(), 0.1)
    assert q.get_offset().item() == 0.0
    # Q(x) = clamp(round(x / 0.1), -128, 127)
    assert _plain(q(_t(2.57, -2.312, 0.153, 100.0, -100.0))).tolist() == [26.0, -23.0, 2.0, 127.0, -128.0]


def test_set_range_per_channel_and_qdq_values_by_hand():
    q = QuantizeDequantize(shape=(2, 1), bitwidth=4)
    q.set_range(torch.tensor([[0.0], [-1.5]]), torch.tensor([[1.5], [0.0]]))
    # s = 1.5 / 15 = 0.1 for both rows; o = 0 and round(-1.5 / 0.1) = -15
    _close(q.get_scale(), torch.full((2, 1), 0.1))
    assert _plain(q.get_offset()).flatten().tolist() == [0.0, -15.0]
    out = _plain(q(torch.tensor([[0.26, -0.5, 2.0], [0.26, -0.5, -2.0]])))
    torch.testing.assert_close(out, torch.tensor([[0.3, 0.0, 1.5], [0.0, -0.5, -1.5]]), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("lo, hi", [(1.0, 0.0), (float("nan"), 1.0), (0.0, float("nan")),
                                    (float("-inf"), 1.0), (0.0, float("inf"))])
def test_set_range_rejects_bad_ranges(lo, hi):
    q = QuantizeDequantize(shape=(), bitwidth=8)
    with pytest.raises(ValueError):
        q.set_range(lo, hi)
    assert not q.is_initialized()


def test_set_range_rejects_min_above_max_in_one_channel():
    q = QuantizeDequantize(shape=(2, 1), bitwidth=8)
    q.set_range(-1.0, 1.0)
    with pytest.raises(ValueError):
        q.set_range(torch.tensor([[0.0], [2.0]]), torch.tensor([[1.0], [1.0]]))
    # unchanged after the failed call
    assert _plain(q.min).flatten().tolist() == [-1.0, -1.0]


# --------------------------------------------------------------------------------------------------
# learnable range
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", QUANTIZERS)
def test_min_and_max_are_parameters(cls):
    q = cls(shape=(3, 1), bitwidth=8)
    assert isinstance(q.min, nn.Parameter) and isinstance(q.max, nn.Parameter)
    assert q.min.shape == (3, 1) and q.max.shape == (3, 1)
    names = dict(q.named_parameters())
    assert names["min"] is q.min and names["max"] is q.max


def test_qdq_range_gradient_matches_hand_computation():
    # min = -0.5, max = 2.05 on [0, 255]: s = 2.55 / 255 = 0.01, o = round(-50) = -50.
    # out = (clamp(round(x/s) - o, 0, 255) + o) * s, with scale/offset functions of (min, max):
    #   ds/dmax = 1/N, ds/dmin = -1/N, do/dmin = 1/s, do/ds = -min/s^2 (straight-through round).
    # * x below the range: out = (qmin + o) s ~ min         -> d/dmin = 1, d/dmax = 0
    # * x above the range: out = (qmax + o) s ~ max         -> d/dmin = 0, d/dmax = 1
    # * x inside: out = round(x/s) s, d/ds = round(x/s) - x/s -> d/dmax = (r - x/s)/N = -d/dmin
    q = QuantizeDequantize(shape=(), bitwidth=8)
    q.set_range(-0.5, 2.05)
    x = _t(-3.0, 0.1234, 5.0)
    w = _t(1.0, 2.0, 3.0)
    (q(x) * w).sum().backward()
    s = (2.05 - (-0.5)) / 255
    xs = 0.1234 / s
    inside = (round(xs) - xs) / 255
    torch.testing.assert_close(q.min.grad.double(), torch.tensor(1.0 - 2 * inside, dtype=torch.float64),
                               rtol=0, atol=1e-4)
    torch.testing.assert_close(q.max.grad.double(), torch.tensor(2 * inside + 3.0, dtype=torch.float64),
                               rtol=0, atol=1e-4)


def test_quantize_range_gradient_matches_smooth_surrogate():
    # Inside the range Quantize is round(x/s) - o, and with a straight-through round its gradient
    # equals that of the smooth q~ = N (x - min) / (max - min):
    #   dq~/dmax = -N (x - min) / (max - min)^2,  dq~/dmin = -N / (max - min) + N (x - min) / (max - min)^2.
    q = Quantize(shape=(), bitwidth=8)
    lo, hi = -1.0, 3.0
    q.set_range(lo, hi)
    x = _t(-0.7, 0.0, 1.3, 2.9)
    q(x).sum().backward()
    n, w = 255.0, hi - lo
    xd = x.double()
    d_max = (-n * (xd - lo) / w**2).sum()
    d_min = (-n / w + n * (xd - lo) / w**2).sum()
    # finite differences on the surrogate agree with the closed form (sanity of the formula itself)
    h = 1e-6

    def surrogate(a, b):
        return (n * (xd - a) / (b - a)).sum()

    assert abs((surrogate(lo, hi + h) - surrogate(lo, hi - h)) / (2 * h) - d_max) < 1e-4
    assert abs((surrogate(lo + h, hi) - surrogate(lo - h, hi)) / (2 * h) - d_min) < 1e-4
    torch.testing.assert_close(q.max.grad.double(), d_max, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(q.min.grad.double(), d_min, rtol=1e-4, atol=1e-4)


def test_symmetric_range_gradient_reaches_min_and_max():
    q = QuantizeDequantize(shape=(), bitwidth=8, symmetric=True)
    q.set_range(-1.0, 1.0)
    q(_t(-3.0, 0.1234, 3.0)).sum().backward()
    assert q.min.grad is not None and q.max.grad is not None
    assert torch.isfinite(q.min.grad) and torch.isfinite(q.max.grad)
    # symmetric offset is constant: out = (clamp(...) + o) s only moves through s = (max - min)/N
    torch.testing.assert_close(q.min.grad, -q.max.grad)
    assert q.max.grad.item() != 0.0


def test_sgd_on_range_changes_the_output_and_lowers_the_loss():
    torch.manual_seed(0)
    q = QuantizeDequantize(shape=(), bitwidth=4)
    q.set_range(-2.0, 2.0)
    x = torch.linspace(-1.5, 1.5, 200)
    target = x.clamp(-0.5, 0.5)
    opt = torch.optim.SGD(q.parameters(), lr=0.05)
    with torch.no_grad():
        out0 = _plain(q(x)).clone()
    loss0 = torch.nn.functional.mse_loss(out0, target).item()
    min0, max0 = q.min.item(), q.max.item()
    for _ in range(5):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(q(x), target)
        loss.backward()
        opt.step()
    with torch.no_grad():
        out1 = _plain(q(x))
    loss1 = torch.nn.functional.mse_loss(out1, target).item()
    assert q.min.item() > min0 and q.max.item() < max0  # the range shrinks towards [-0.5, 0.5]
    assert not torch.equal(out0, out1)
    assert loss1 < loss0


# --------------------------------------------------------------------------------------------------
# state: state_dict, encodings, copy, pickle
# --------------------------------------------------------------------------------------------------

CONFIGS = {
    "per_tensor": (dict(shape=()), (4, 8)),
    "per_channel_sym": (dict(shape=(4, 1), symmetric=True), (4, 8)),
    "per_block": (dict(shape=(4, 2), block_size=(-1, 4)), (4, 8)),
}


def _calibrated(cls, config: str, seed: int = 0):
    kwargs, in_shape = CONFIGS[config]
    g = torch.Generator().manual_seed(seed)
    q = _calibrate(cls(bitwidth=8, **kwargs), torch.randn(in_shape, generator=g))
    return q, 1.3 * torch.randn(in_shape, generator=g)


@pytest.mark.parametrize("cls", QUANTIZERS)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_state_dict_round_trip(cls, config):
    q, x = _calibrated(cls, config)
    sd = q.state_dict()
    assert {"min", "max"} <= set(sd)
    fresh = cls(bitwidth=8, **CONFIGS[config][0])
    assert not fresh.is_initialized()
    fresh.load_state_dict(sd)
    assert fresh.is_initialized()
    assert fresh.get_encodings() == q.get_encodings()
    assert torch.equal(_plain(fresh(x)), _plain(q(x)))


def test_state_dict_round_trip_through_torch_save():
    q, x = _calibrated(QuantizeDequantize, "per_block")
    buf = io.BytesIO()
    torch.save(q.state_dict(), buf)
    buf.seek(0)
    fresh = QuantizeDequantize(shape=(4, 2), bitwidth=8, block_size=(-1, 4))
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert fresh.is_initialized()
    assert torch.equal(_plain(fresh(x)), _plain(q(x)))


@pytest.mark.parametrize("cls", QUANTIZERS)
def test_loading_state_of_uninitialised_quantizer_keeps_it_uninitialised(cls):
    src = cls(shape=(), bitwidth=8)
    dst = cls(shape=(), bitwidth=8)
    dst.load_state_dict(src.state_dict())
    assert not dst.is_initialized()
    assert dst.get_scale() is None
    with pytest.raises(RuntimeError):
        dst(_t(1.0))


@pytest.mark.parametrize("cls", QUANTIZERS)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_get_encodings_set_encodings_round_trip(cls, config):
    q, x = _calibrated(cls, config)
    enc = q.get_encodings()
    assert isinstance(enc, AffineEncoding)
    fresh = cls(bitwidth=8, **CONFIGS[config][0])
    fresh.set_encodings(enc)
    assert fresh.is_initialized()
    assert fresh.get_encodings() == enc
    assert torch.equal(_plain(fresh(x)), _plain(q(x)))


def test_set_encodings_round_trip_is_exact_for_asymmetric_range():
    # set_range(-0.3, 1.7): s = 2 / 255, o = round(-0.3 / s) = round(-38.25) = -38. Adopting that encoding
    # in a fresh quantizer must reproduce scale and offset exactly; a one-ulp drift of the scale moves
    # inputs at rounding ties, x = (k + 0.5) s, to the neighbouring code.
    q = QuantizeDequantize(shape=(), bitwidth=8)
    q.set_range(-0.3, 1.7)
    assert q.get_offset().item() == -38.0
    fresh = QuantizeDequantize(shape=(), bitwidth=8)
    fresh.set_encodings(q.get_encodings())
    assert torch.equal(_plain(fresh.get_offset()), _plain(q.get_offset()))
    assert torch.equal(_plain(fresh.get_scale()), _plain(q.get_scale()))
    s = _plain(q.get_scale())
    x = (torch.arange(-38, 217, dtype=torch.float32) + 0.5) * s
    assert torch.equal(_plain(fresh(x)), _plain(q(x)))


@pytest.mark.parametrize("cls", QUANTIZERS)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_deepcopy_and_pickle_of_calibrated_quantizer(cls, config):
    q, x = _calibrated(cls, config)
    expected = _plain(q(x))
    for other in (copy.deepcopy(q), pickle.loads(pickle.dumps(q))):
        assert other is not q
        assert other.is_initialized()
        assert other.get_encodings() == q.get_encodings()
        out = other(x)
        assert type(out) is type(q(x))
        assert torch.equal(_plain(out), expected)
        # independent state: changing the copy leaves the original alone
        other.set_range(-100.0, 100.0)
        assert torch.equal(_plain(q(x)), expected)


# --------------------------------------------------------------------------------------------------
# half-precision inputs
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cls", QUANTIZERS)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_half_precision_input_keeps_its_dtype_and_scale_stays_fp32(config, cls, dtype):
    q, x = _calibrated(cls, config)
    xh = x.to(dtype)
    out = q(xh)
    assert out.dtype == dtype
    assert q.get_scale().dtype == torch.float32
    assert out.encoding.scale.dtype == torch.float32
    assert q.min.dtype == torch.float32 and q.max.dtype == torch.float32
    # The math runs in float32 and the result is cast back: same as quantizing the upcast input.
    expected = _plain(q(xh.float())).to(dtype)
    assert torch.equal(_plain(out), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_calibration_on_half_precision_input(dtype):
    x = _t(-1.0, 0.5, 3.0).to(dtype)  # exactly representable
    q = _calibrate(QuantizeDequantize(shape=(), bitwidth=8), x)
    assert q.min.dtype == torch.float32
    assert (q.min.item(), q.max.item()) == (-1.0, 3.0)
    assert q.get_scale().dtype == torch.float32
    _close(q.get_scale(), 4.0 / 255)
    out = q(x)
    assert out.dtype == dtype


# ---------------------------------------------------------------- in-place QDQ for owned outputs (quanta.nn)
def _calibrated_qdq() -> QuantizeDequantize:
    q = QuantizeDequantize(shape=(), bitwidth=8, symmetric=False)
    q.set_range(-1.0, 1.5)
    return q


def test_qdq_into_overwrites_with_the_forward_values():
    q = _calibrated_qdq()
    x = 2 * torch.randn(3, 5, 7)
    expected = q(x).as_subclass(torch.Tensor).detach()
    ptr = x.data_ptr()
    with torch.no_grad():
        assert q._qdq_into_(x)
    assert x.data_ptr() == ptr and torch.equal(x, expected)


@pytest.mark.filterwarnings("ignore:.*no input was seen")
@pytest.mark.parametrize("why", ["grad", "strided", "hook", "global_hook", "calibrating", "int", "quantize"])
def test_qdq_into_declines_and_leaves_the_input_alone(why):
    q = Quantize(shape=(), bitwidth=8, symmetric=False) if why == "quantize" else _calibrated_qdq()
    if why == "quantize":
        q.set_range(-1.0, 1.5)
    x = 2 * torch.randn(4, 6)
    if why == "strided":
        x = x.t()
    if why == "int":
        x = torch.arange(24).reshape(4, 6)
    before = x.clone()
    stack = contextlib.ExitStack()
    with stack:
        if why != "grad":
            stack.enter_context(torch.no_grad())
        if why == "hook":
            stack.callback(q.register_forward_pre_hook(lambda m, a: None).remove)
        if why == "global_hook":
            stack.callback(torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: None).remove)
        if why == "calibrating":
            stack.enter_context(q.compute_encodings())
        assert not q._qdq_into_(x)
    assert torch.equal(x, before)
