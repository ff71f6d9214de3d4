"""torchao-convention kernels: block layout, qparams, reciprocal-multiply quantize, float8."""

import pytest
import torch

from quanta.grids.float import FLOAT8_E4M3FN, FLOAT8_E4M3FNUZ, FLOAT8_E5M2, FloatFormat
from quanta.kernels import zero_point as K
from quanta.kernels.torchao_blocks import (
    block_absmax,
    block_min_max,
    full_block_layout,
    layout_from_scale_shape,
    scale_shape,
)


# ------------------------------------------------------------------ block layout
@pytest.mark.parametrize("shape,block,full,torchao", [
    ((2, 16), (2, 16), (1, 1), ()),
    ((2, 16), (1, 16), (2, 1), (2,)),
    ((1, 64), (1, 32), (1, 2), (1, 2)),
    ((2, 16), (2, 1), (1, 16), (16,)),
    ((2, 16), (1, 1), (2, 16), (2, 16)),
    ((3, 4, 8), (1, 4, 2), (3, 1, 4), (3, 4)),
    ((3, 4, 8), (-1, 2, -1), (1, 2, 1), (2,)),
    ((1, 8), (1, 8), (1, 1), (1,)),
])
def test_full_block_layout_shapes(shape, block, full, torchao):
    lay = full_block_layout(shape, block)
    assert lay.scale_shape == full
    assert scale_shape(lay) == torchao


def test_keepdim_shape_keeps_torchaos_split_dims():
    assert scale_shape(full_block_layout((1, 64), (1, 32)), keepdim=True) == (1, 2, 1)
    assert scale_shape(full_block_layout((2, 16), (1, 16)), keepdim=True) == (2, 1)
    assert scale_shape(full_block_layout((2, 16), (2, 16)), keepdim=True) == (1, 1)


@pytest.mark.parametrize("block,err,match", [
    ((16,), ValueError, "one entry per input dimension"),
    ((1, 5), ValueError, "does not divide"),
    ((1, 32), ValueError, "does not divide"),
    ((1, 0), ValueError, "positive or -1"),
    ((1, 2.0), TypeError, "tuple of ints"),
    (None, TypeError, "one per input dimension"),
    (16, TypeError, "tuple of ints"),
])
def test_bad_block_sizes(block, err, match):
    with pytest.raises(err, match=match):
        full_block_layout((2, 16), block)


def test_block_min_max_and_absmax_by_hand():
    x = torch.arange(24.0).reshape(2, 12) - 10
    lay = full_block_layout(x.shape, (1, 4))
    mn, mx = block_min_max(x, lay)
    want = x.reshape(2, 3, 4)
    assert torch.equal(mn, want.amin(-1)) and torch.equal(mx, want.amax(-1))
    assert torch.equal(block_absmax(x, lay), want.abs().amax(-1))
    per_elem = full_block_layout(x.shape, (1, 1))  # nothing to reduce: NOT every dim (torch's dim=[])
    assert torch.equal(block_min_max(x, per_elem)[0], x)
    col = full_block_layout(x.shape, (2, 1))
    assert torch.equal(block_min_max(x, col)[1], x.amax(0, keepdim=True))


def test_layout_from_scale_shape():
    assert layout_from_scale_shape((2, 16), (2, 1)).block_size == (1, 16)
    assert layout_from_scale_shape((2, 16), (1, 1)).block_size == (2, 16)
    assert layout_from_scale_shape((1, 64), (1, 2)).block_size == (1, 32)
    with pytest.raises(ValueError, match="rank"):
        layout_from_scale_shape((2, 16), (2,))
    with pytest.raises(ValueError, match="does not tile"):
        layout_from_scale_shape((2, 16), (2, 3))


# ------------------------------------------------------------------ qparams
def _rand(n=64, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * 3).to(dtype), (torch.randn(n, generator=g) * 3).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("qmin,qmax", [(-128, 127), (-8, 7), (-127, 127), (-32768, 32767)])
def test_no_clipping_equals_torchaos_formula_when_zero_point_is_zero(dtype, qmin, qmax):
    a, b = _rand(dtype=dtype)
    mn, mx = K.include_zero(torch.minimum(a, b), torch.maximum(a, b))
    s, zp = K.symmetric_no_clipping_qparams(mn, mx, qmin, qmax, 1e-9)
    smin, smax = mn / float(qmin), mx / float(qmax)  # torchao 0.15, verbatim
    want = torch.clamp(torch.where(smin > smax, smin, smax), min=1e-9)
    assert torch.equal(s.view(torch.int16 if dtype != torch.float32 else torch.int32),
                       want.view(torch.int16 if dtype != torch.float32 else torch.int32))
    assert bool((zp == 0).all())


@pytest.mark.parametrize("qmin,qmax", [(0, 255), (0, 15), (0, 127), (-4, 10)])
def test_no_clipping_does_not_clip_on_other_ranges(qmin, qmax):
    a, b = _rand()
    mn, mx = K.include_zero(torch.minimum(a, b), torch.maximum(a, b))
    s, zp = K.symmetric_no_clipping_qparams(mn, mx, qmin, qmax, 1e-9)
    assert bool((mn / s + zp >= qmin - 1e-3).all()) and bool((mx / s + zp <= qmax + 1e-3).all())
    # and at least one end is used fully
    assert bool(((mn / s + zp - qmin).abs() < 1e-3).logical_or((mx / s + zp - qmax).abs() < 1e-3).all())


def test_symmetric_and_asymmetric_by_hand():
    mn, mx = torch.tensor([-1.0, -0.5, 0.0]), torch.tensor([0.5, 2.0, 0.0])
    s, zp = K.symmetric_qparams(mn, mx, -128, 127, 1e-6)
    assert torch.equal(s, torch.tensor([1.0 / 127.5, 2.0 / 127.5, 1e-6])) and bool((zp == 0).all())
    s, zp = K.asymmetric_qparams(mn, mx, 0, 255, 1e-6)
    assert torch.equal(s, torch.tensor([1.5 / 255, 2.5 / 255, 1e-6]))
    assert torch.equal(zp, torch.tensor([0.0, 0.0, 0.0]) - torch.round(mn / s))


def test_asymmetric_zero_point_clamp_is_optional():
    mn, mx = torch.tensor([10.0]), torch.tensor([11.0])
    _, zp = K.asymmetric_qparams(mn, mx, 0, 255, 1e-6)
    assert zp.item() == 0.0  # clamped: the whole block would clip to 255
    s, zp = K.asymmetric_qparams(mn, mx, 0, 255, 1e-6, clamp_zero_point=False)
    assert zp.item() == -2550.0 and torch.round(mn / s).item() + zp.item() == 0


def test_range_overflow_gives_a_finite_scale():
    big = torch.finfo(torch.float32).max
    s, zp = K.asymmetric_qparams(torch.tensor([-big, -1.0]), torch.tensor([big, 1.0]), 0, 255, 1e-6)
    assert bool(torch.isfinite(s).all())
    assert s[1].item() == torch.tensor(2.0 / 255).item()  # rows without overflow keep torchao's arithmetic
    s, zp = K.float_zero_point_qparams(torch.tensor([-big]), torch.tensor([big]), 0, 15, 1e-6)
    assert bool(torch.isfinite(s).all() & torch.isfinite(zp).all())


def test_float_zero_point_by_hand():
    s, zp = K.float_zero_point_qparams(torch.tensor([1.0]), torch.tensor([4.0]), 0, 15, 1e-6)
    assert s.item() == pytest.approx(0.2) and zp.item() == pytest.approx(1.0 + 0.2 * 8)


# ------------------------------------------------------------------ integer quantize
def test_quantize_multiplies_by_the_reciprocal():
    """At a tie of x/s the reciprocal product decides, as in torchao (AIMET's division may differ)."""
    s = torch.tensor([0.1])
    lay = full_block_layout((1,), (1,))
    found = 0
    for k in range(-300, 300):
        x = torch.tensor([(k + 0.5) * 0.1], dtype=torch.float32)
        by_recip = torch.round(x * (1.0 / s))
        by_div = torch.round(x / s)
        got = K.quantize(x, lay, s, None, -1000, 1000)
        assert torch.equal(got, by_recip)
        found += int(not torch.equal(by_recip, by_div))
    assert found > 0  # the two conventions really differ on some of these


def test_ties_round_half_to_even():
    s = torch.tensor(0.25)  # exact reciprocal: x * 4 lands exactly on k + 0.5
    x = torch.tensor([0.125, 0.375, 0.625, -0.125, -0.375])
    q = K.quantize(x, full_block_layout((5,), (5,)), s, torch.tensor(0), -8, 7)
    assert q.tolist() == [0.0, 2.0, 2.0, -0.0, -2.0]


def test_quantize_clamps_and_adds_zero_point():
    lay = full_block_layout((2, 3), (1, 3))
    x = torch.tensor([[0.0, 1.0, 100.0], [-100.0, 0.5, 0.0]])
    q = K.quantize(x, lay, torch.tensor([0.5, 1.0]), torch.tensor([1, -2]), -8, 7)
    assert q.tolist() == [[1.0, 3.0, 7.0], [-8.0, -2.0, -2.0]]


def test_dequantize_and_fake_quantize():
    lay = full_block_layout((2, 3), (1, 3))
    s, zp = torch.tensor([0.5, 1.0]), torch.tensor([1, -2])
    q = torch.tensor([[1, 3, 7], [-8, -2, -2]], dtype=torch.int8)
    assert K.dequantize(q, lay, s, zp, torch.float32).tolist() == [[0.0, 1.0, 3.0], [-6.0, 0.0, 0.0]]
    x = torch.tensor([[0.0, 1.0, 100.0], [-100.0, 0.5, 0.0]])
    fq, mask = K.fake_quantize(x, lay, s, zp, -8, 7, want_mask=True)
    assert fq.tolist() == [[0.0, 1.0, 3.0], [-6.0, 0.0, 0.0]]
    assert mask.tolist() == [[True, True, False], [False, True, True]]
    assert K.dequantize(q, lay, s, None, torch.bfloat16).dtype == torch.bfloat16


def test_float_zero_point_round_trip():
    lay = full_block_layout((1, 4), (1, 4))
    s, zp = K.float_zero_point_qparams(torch.tensor([-1.0]), torch.tensor([2.0]), 0, 15, 1e-6)
    x = torch.tensor([[-1.0, 0.0, 1.0, 2.0]])
    q = K.quantize_float_zero_point(x, lay, s, zp, 0, 15)
    assert q.tolist() == [[0.0, 5.0, 10.0, 15.0]]
    dq = K.dequantize_float_zero_point(q.to(torch.int32), lay, s, zp, 0, 15, torch.float32)
    torch.testing.assert_close(dq, x)
    fq, mask = K.fake_quantize_float_zero_point(x * 2, lay, s, zp, 0, 15, want_mask=True)
    assert mask.tolist() == [[False, True, True, False]]


def test_fake_quantize_gradients_are_straight_through():
    lay = full_block_layout((4,), (4,))
    x = torch.tensor([0.3, -0.2, 5.0, -5.0], requires_grad=True)
    s = torch.tensor(0.1, requires_grad=True)
    fq, _ = K.fake_quantize(x, lay, s, torch.tensor(0), -8, 7)
    fq.sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([1.0, 1.0, 0.0, 0.0]))
    assert s.grad is not None and torch.isfinite(s.grad)


def test_to_codes_guards():
    with pytest.raises(ValueError, match="NaN"):
        K.to_codes(torch.tensor([1.0, float("nan")]), torch.int8, -128, 127)
    assert K.to_codes(torch.tensor([2.0**31]), torch.int32, -(2**31), 2**31 - 1).item() == 2**31 - 1
    assert K.to_codes(torch.tensor([32768.0], dtype=torch.bfloat16), torch.int16, -32768, 32767).item() == 32767
    assert K.to_codes(torch.tensor([255.0]), torch.uint8, 0, 255).item() == 255


# ------------------------------------------------------------------ float8
@pytest.mark.parametrize("fmt,dtype", [(FLOAT8_E4M3FN, torch.float8_e4m3fn), (FLOAT8_E5M2, torch.float8_e5m2),
                                       (FLOAT8_E4M3FNUZ, torch.float8_e4m3fnuz)])
def test_quantize_float8_equals_torchs_cast_on_every_midpoint(fmt, dtype):
    vals = fmt.finite_values()
    vals = vals[vals >= 0].unique()
    mids = (vals[1:] + vals[:-1]) / 2
    x = torch.cat([vals, mids, -mids, mids * (1 + 2**-20), mids * (1 - 2**-20)]).to(torch.float32)
    lay = full_block_layout(x.shape, x.shape)
    got = K.quantize_float8(x, lay, torch.tensor(1.0), fmt, dtype)
    want = x.clamp(-fmt.max, fmt.max).to(dtype)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_quantize_float8_nan_keeps_its_sign_and_inf_saturates():
    x = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf")])
    lay = full_block_layout((4,), (4,))
    got = K.quantize_float8(x, lay, torch.tensor(1.0), FLOAT8_E4M3FN, torch.float8_e4m3fn)
    assert got.view(torch.uint8).tolist() == x.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    assert got.float()[2:].tolist() == [448.0, -448.0]


def test_float8_zero_block_and_zero_scale():
    x = torch.tensor([[0.0, -0.0, 0.0, 0.0], [1.0, -2.0, 0.0, 4.0]])
    lay = full_block_layout(x.shape, (1, 4))
    s = K.float8_scale(x, lay, 448.0)
    assert s.tolist() == [[1.0], [(torch.tensor(4.0) / 448.0).item()]]
    q = K.quantize_float8(x, lay, s, FLOAT8_E4M3FN, torch.float8_e4m3fn)
    assert q.float()[0].tolist() == [0.0, -0.0, 0.0, 0.0]
    q0 = K.quantize_float8(x, lay, torch.tensor([[0.0], [1.0]]), FLOAT8_E4M3FN, torch.float8_e4m3fn)
    assert q0.float()[0].tolist() == [0.0, 0.0, 0.0, 0.0]  # a zero scale: zeros, not +-max and NaN
    dq = K.dequantize_float8(q, lay, s, torch.float32)
    assert not bool(torch.isnan(dq).any()) and dq[1].tolist() == [1.0, -2.0, 0.0, 4.0]


def test_float8_scale_bounds_and_power_of_two():
    x = torch.tensor([[3.0, 0.1]])
    lay = full_block_layout(x.shape, x.shape)
    assert K.float8_scale(x, lay, 448.0, upper=1.0).item() == pytest.approx(1.0 / 448.0)
    assert K.float8_scale(x, lay, 448.0, lower=448.0).item() == 1.0
    s = K.power_of_two_scale(K.float8_scale(x, lay, 448.0))
    assert s.item() == 2.0**-7 and 3.0 / s.item() <= 448.0


def test_kernels_accept_any_float_format():
    fmt = FloatFormat(3, 4)  # not a torch dtype: the cast still rounds to it, the dtype holds it exactly
    x = torch.tensor([1.03, 7.9])
    q = K.quantize_float8(x, full_block_layout((2,), (2,)), torch.tensor(1.0), fmt, torch.float32)
    assert q.tolist() == [1.0, 8.0]  # 7.9 = 1.975 * 4: 1.975 rounds to 2 with 4 bits
