"""Float fake-cast: exhaustive per format, equal to torch's casts, straight-through gradients."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.grids.float import (
    BFLOAT16,
    FLOAT8_E4M3FN,
    FLOAT8_E4M3FNUZ,
    FLOAT8_E5M2,
    FLOAT8_E5M2FNUZ,
    FLOAT16,
    FP4_E2M1,
    FP6_E2M3,
    FP6_E3M2,
    FloatFormat,
    SpecialValues,
)
from quanta.kernels import float_cast as K
from quanta.kernels import native


# every test here runs on both implementations (fixture in conftest.py)
pytestmark = pytest.mark.usefixtures("kernel_path")

SMALL = [FLOAT8_E4M3FN, FLOAT8_E5M2, FLOAT8_E4M3FNUZ, FLOAT8_E5M2FNUZ, FP6_E3M2, FP6_E2M3, FP4_E2M1,
         FloatFormat(3, 4, SpecialValues.IEEE), FloatFormat(1, 2, SpecialValues.FINITE),
         # no mantissa bits: ties between exponent codes
         FloatFormat(3, 0, SpecialValues.FINITE), FloatFormat(4, 0, SpecialValues.UNSIGNED_ZERO),
         FloatFormat(2, 0, SpecialValues.IEEE),
         # AIMET's grids (one binade lower than IEEE; with 0 mantissa bits ties go up)
         FloatFormat(2, 1, SpecialValues.AIMET), FloatFormat(4, 3, SpecialValues.AIMET),
         FloatFormat(1, 2, SpecialValues.AIMET), FloatFormat(3, 0, SpecialValues.AIMET),
         FloatFormat(1, 0, SpecialValues.AIMET)]
TORCH = [FLOAT8_E4M3FN, FLOAT8_E5M2, FLOAT8_E4M3FNUZ, FLOAT8_E5M2FNUZ, FLOAT16, BFLOAT16]


def brute_force(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Nearest value of the format's value table; ties to the even code (up between powers of two, for
    ``exponent_ties_up`` with 0 mantissa bits); saturating."""
    pos = fmt.finite_values()
    pos = pos[pos >= 0].unique()  # code i <-> pos[i]
    out = []
    for v in x.double().tolist():
        if math.isnan(v):
            out.append(v)
            continue
        a = min(abs(v), fmt.max)
        d = (pos - a).abs()
        best = d.min()
        idx = (d == best).nonzero().flatten().tolist()
        if len(idx) == 1:
            i = idx[0]
        elif fmt.exponent_ties_up and fmt.mantissa_bits == 0 and idx[0] != 0:
            i = idx[-1]  # between two powers of two: up (between 0 and the smallest, 0 is the even code)
        else:
            i = next(j for j in idx if j % 2 == 0)
        r = pos[i].item()
        if r == 0 and (v < 0 or (v == 0 and math.copysign(1, v) < 0)) and fmt.has_negative_zero:
            out.append(-0.0)
        else:
            out.append(math.copysign(r, v) if r != 0 else 0.0)
    return torch.tensor(out, dtype=torch.float64)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.double(), b.double()
    both_nan = torch.isnan(a) & torch.isnan(b)
    sign_ok = torch.signbit(a) == torch.signbit(b)
    return bool(((a == b) & sign_ok | both_nan).all())


@pytest.mark.parametrize("fmt", SMALL, ids=lambda f: f.name())
def test_exhaustive_against_value_table(fmt):
    v = fmt.finite_values()
    pos = v[v >= 0].unique()
    mids = (pos[1:] + pos[:-1]) / 2
    eps = torch.tensor([1e-6])
    probes = torch.cat([v, mids, mids * (1 + eps), mids * (1 - eps), -mids, torch.tensor(
        [fmt.max * 1.5, -fmt.max * 1.01, math.inf, -math.inf, math.nan, -0.0, fmt.min_subnormal / 2,
         fmt.min_subnormal * 0.51, -fmt.min_subnormal * 0.49])]).float()
    expected = brute_force(probes, fmt)
    assert same(K.fake_cast(probes, fmt), expected)
    assert same(K.quantize_dequantize(probes, torch.tensor(1.0), fmt), expected)  # the kernel path too
    assert same(K.fake_cast(v.float(), fmt), v)  # every value is a fixed point


@pytest.mark.parametrize("fmt", TORCH, ids=lambda f: f.name())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_equals_torch_cast_inside_the_range(fmt, dtype):
    gen = torch.Generator().manual_seed(fmt.bits)
    x = (torch.randn(50000, generator=gen) * torch.exp(torch.randn(50000, generator=gen) * 6)).to(dtype)
    x = x[x.double().abs() <= fmt.max]
    if fmt.bits == 8:  # every code and the midpoints between codes
        v = fmt.finite_values()
        x = torch.cat([x, v.to(dtype), ((v[1:] + v[:-1]) / 2).to(dtype)])
    got = K.fake_cast(x, fmt)
    ref = x.to(fmt.torch_dtype).to(dtype)
    assert same(got, ref)


@pytest.mark.parametrize("fmt", TORCH, ids=lambda f: f.name())
def test_qdq_equals_scaled_torch_cast(fmt):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 32, generator=gen) * 3
    scale = torch.rand(64, 1, generator=gen) * 0.05 + 0.001
    scale = scale.clamp_max(1.0)
    v = x / scale
    inside = v.abs() <= fmt.max
    got = K.quantize_dequantize(x, scale, fmt)
    ref = (v.to(fmt.torch_dtype).to(torch.float32)) * scale
    assert same(got[inside], ref[inside])
    assert (got[~inside].abs() == (fmt.max * scale.expand_as(x))[~inside]).all()  # saturated, not NaN


def test_special_values_policy():
    x = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 1e-30, -1e-30])
    for fmt in (FLOAT8_E4M3FN, FLOAT8_E5M2, FP4_E2M1):
        y = K.fake_cast(x, fmt)
        assert math.isnan(y[0]) and y[1] == fmt.max and y[2] == -fmt.max
        assert torch.signbit(y[3]) and torch.signbit(y[5])
    y = K.fake_cast(x, FLOAT8_E4M3FNUZ)  # no negative zero
    assert not torch.signbit(y[3]) and not torch.signbit(y[5])


def test_block_and_channel_scales():
    x = torch.arange(16.0).reshape(2, 8)
    s = torch.tensor([[1.0, 2.0], [4.0, 8.0]])
    out = K.quantize_dequantize(x, s, FP4_E2M1, (-1, 4))
    for r in range(2):
        for b in range(2):
            blk = x[r, b * 4:(b + 1) * 4]
            assert torch.equal(out[r, b * 4:(b + 1) * 4], K.fake_cast(blk / s[r, b], FP4_E2M1) * s[r, b])


def test_gradients_straight_through():
    x = torch.tensor([0.1, 2.9, 6.0, 7.0, -100.0, math.nan], requires_grad=True)
    s = torch.tensor(1.0, requires_grad=True)
    out = K.quantize_dequantize(x, s, FP4_E2M1)
    out.backward(torch.ones_like(out))
    assert x.grad.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]  # |x/s| <= 6 inclusive
    c = K.fake_cast(x.detach(), FP4_E2M1)
    expected = (c[0] - 0.1) + (c[1] - 2.9) + (c[2] - 6.0) + 6.0 - 6.0
    assert s.grad.item() == pytest.approx(expected.item(), abs=1e-6)


def test_only_a_bool_mask_is_saved_for_input_gradients():
    saved = []
    x = torch.randn(100, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        K.quantize_dequantize(x, torch.tensor(0.1), FLOAT8_E4M3FN)
    assert [t.dtype for t in saved] == [torch.bool]


@settings(max_examples=60, deadline=None)
@given(xs=st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=1, max_size=32),
       fmt=st.sampled_from(SMALL + [FLOAT16, BFLOAT16]))
def test_properties(xs, fmt):
    x = torch.tensor(xs)
    y = K.fake_cast(x, fmt)
    assert same(K.fake_cast(y, fmt), y)  # idempotent
    order = torch.argsort(x)
    assert (y[order].diff() >= 0).all()  # monotone
    assert (y.abs() <= fmt.max).all()


@pytest.mark.parametrize("fmt", SMALL + [FLOAT16, BFLOAT16], ids=lambda f: f.name())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_native_and_eager_qdq_agree(fmt, dtype):
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(33, 64, generator=gen) * torch.exp(torch.randn(33, 64, generator=gen) * 3)).to(dtype)
    x[0, :6] = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-30]).to(dtype)
    s = torch.rand(33, 4, generator=gen) * 0.5 + 0.01
    fast = K.quantize_dequantize(x, s, fmt, (-1, 16))
    with native.disabled():
        slow = K.quantize_dequantize(x, s, fmt, (-1, 16))
    assert same(fast, slow) and fast.dtype == dtype


@pytest.mark.parametrize("mbits", [0, 1, 3, 7])
@pytest.mark.parametrize("special", [SpecialValues.AIMET, SpecialValues.UNSIGNED_ZERO])
def test_bias_128_below_float32_normals(special, mbits):
    """Formats with 8 exponent bits and bias 128 (AIMET's, fnuz) have normals below float32's smallest
    (``[2**-127, 2**-126)``), where float32 is subnormal: every float32 pattern there rounds as in float64."""
    fmt = FloatFormat(8, mbits, special)
    x = torch.arange(0, 2**24, 997, dtype=torch.int32).view(torch.float32)  # float32 subnormals, up to 2**-126
    x = torch.cat([x, -x, torch.tensor([2.0**-127 * (1 + k / 2 ** (mbits + 1)) for k in range(2 ** (mbits + 1))])])
    expected = K.fake_cast(x.double(), fmt).float()  # float64: every input normal
    assert same(K.quantize_dequantize(x, torch.tensor(1.0), fmt), expected)
    assert same(K.fake_cast(x, fmt), expected)


def test_bad_input():
    with pytest.raises(TypeError, match="floating-point"):
        K.quantize_dequantize(torch.tensor([1, 2]), torch.tensor(1.0), FP4_E2M1)
    with pytest.raises(ValueError, match="does not broadcast"):
        K.quantize_dequantize(torch.ones(4, 4), torch.ones(3), FP4_E2M1)
