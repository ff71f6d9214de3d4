"""MX and NVFP4 kernels: the OCP/NVIDIA rules on special values, invariants (idempotence, error bounds,
monotonicity of the shared exponent), straight-through gradients, element codes, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.grids.block_scaled import (
    MX_FORMATS,
    MXFP4,
    MXFP6_E2M3,
    MXFP6_E3M2,
    MXFP8_E4M3,
    MXFP8_E5M2,
    MXINT8,
    NVFP4,
    ScaleCalculationMode,
    mx_format,
)
from quanta.kernels import block_scaled as K

MX = [MXFP8_E4M3, MXFP8_E5M2, MXFP6_E2M3, MXFP6_E3M2, MXFP4, MXINT8]
MODES = list(ScaleCalculationMode)


def _grid(fmt):
    """Every non-negative element value of ``fmt``."""
    if fmt.element is None:
        return torch.arange(0, 128, dtype=torch.float32) / 64
    v = fmt.element.finite_values().to(torch.float32)
    return v[v >= 0].unique()


# --------------------------------------------------------------------------- shared exponent
@pytest.mark.parametrize("fmt", MX, ids=lambda f: f.name)
def test_floor_is_the_spec_rule(fmt):
    """OCP v1.0 section 6.3: X = 2**(floor(log2(amax)) - emax)."""
    amax = torch.tensor([1.0, 1.5, 0.75, 3.0e-3, 1000.0, 2.0 ** 100])
    code = K.mx_shared_exponent(amax, fmt).to(torch.int64)
    want = torch.floor(torch.log2(amax.double())).to(torch.int64) - fmt.emax + 127
    assert torch.equal(code, want.clamp(0, 254))


@pytest.mark.parametrize("fmt", MX, ids=lambda f: f.name)
def test_rceil_never_saturates_and_is_the_smallest_such_power(fmt):
    g = torch.Generator().manual_seed(0)
    amax = torch.ldexp(torch.rand(2000, generator=g) + 0.5, torch.randint(-60, 60, (2000,), generator=g))
    amax = torch.cat([amax, fmt.element_max * torch.ldexp(torch.ones(5), torch.arange(-3, 2))])
    x = K.e8m0_to_float(K.mx_shared_exponent(amax, fmt, ScaleCalculationMode.RCEIL)).double()
    assert bool((amax.double() / x <= fmt.element_max).all())
    assert bool((amax.double() / (x / 2) > fmt.element_max).all())


def test_ceil_and_even_sit_between_floor_and_floor_plus_one():
    amax = torch.tensor([1.0, 1.9, 1.96, 3.5, 7.0, 0.26])
    floor = K.mx_shared_exponent(amax, MXFP4).to(torch.int64)
    for mode in (ScaleCalculationMode.CEIL, ScaleCalculationMode.EVEN):
        c = K.mx_shared_exponent(amax, MXFP4, mode).to(torch.int64)
        assert bool(((c - floor >= 0) & (c - floor <= 1)).all())
    # EVEN rounds amax to fp4's one mantissa bit first: 1.9 -> 2 goes up a binade, 1.4 -> 1.5 does not
    even = K.mx_shared_exponent(torch.tensor([1.9, 1.4]), MXFP4, ScaleCalculationMode.EVEN)
    assert (even.to(torch.int64) - K.mx_shared_exponent(torch.tensor([1.9, 1.4]), MXFP4)).tolist() == [1, 0]


@given(st.lists(st.floats(1e-30, 1e30), min_size=2, max_size=20))
@settings(max_examples=60, deadline=None)
def test_shared_exponent_is_monotone_in_amax(values):
    amax = torch.tensor(sorted(values), dtype=torch.float32)
    for mode in MODES:
        code = K.mx_shared_exponent(amax, MXFP8_E4M3, mode).to(torch.int64)
        assert bool((code[1:] >= code[:-1]).all())


# --------------------------------------------------------------------------- special values (docs/numerics.md)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("fmt", MX, ids=lambda f: f.name)
def test_special_blocks(fmt, mode):
    x = torch.zeros(4, 32)
    x[1, 3] = float("nan")
    x[2] = torch.linspace(-1, 1, 32)
    x[3, 0] = -0.0
    p, code = K.mx_quantize(x, fmt, mode)
    y = K.mx_dequantize(p, code, fmt)
    assert code[0, 0] == 0 and bool((y[0] == 0).all())  # all-zero block: scale 2**-127, zeros
    assert code[1, 0] == 255 and bool(y[1].isnan().all())  # a NaN anywhere: the whole block is NaN
    assert bool((y[2].abs() <= 1).all()) and float(y[2, -1]) == pytest.approx(1.0, rel=0.25)
    assert bool(torch.isfinite(y[3]).all())


def test_inf_saturates_under_floor_and_is_nan_free():
    x = torch.zeros(1, 32)
    x[0, 0] = float("inf")
    x[0, 1] = 1.0
    p, code = K.mx_quantize(x, MXFP8_E4M3)
    assert float(p[0, 0]) == 448.0 and code.item() == 127 + 120  # inf's exponent field: 2**(128 - 8)
    p, code = K.mx_quantize(x, MXFP8_E4M3, ScaleCalculationMode.RCEIL)
    assert code.item() == 254 and float(p[0, 0]) == 448.0


def test_nvfp4_special_blocks():
    x = torch.zeros(3, 16)
    x[1, 2] = float("nan")
    x[2] = torch.linspace(-6, 6, 16)
    p, sb = K.nvfp4_quantize(x)
    assert float(sb[0, 0]) == 2.0 ** -6 and bool((p[0] == 0).all())  # smallest normal e4m3 scale
    assert math.isnan(float(sb[1, 0])) and bool(K.nvfp4_dequantize(p, sb)[1].isnan().all())
    assert float(sb[2, 0]) == 1.0 and p[2].tolist()[0] == -6.0


# --------------------------------------------------------------------------- invariants
blocks = st.integers(1, 4).flatmap(lambda n: st.lists(st.floats(-1e4, 1e4, width=32), min_size=32 * n,
                                                      max_size=32 * n))


@given(blocks, st.sampled_from(MX), st.sampled_from(MODES))
@settings(max_examples=150, deadline=None)
def test_mx_qdq_is_idempotent_and_error_bounded(values, fmt, mode):
    x = torch.tensor(values, dtype=torch.float32).reshape(-1, 32)
    y = K.mx_quantize_dequantize(x, fmt, mode)
    assert torch.equal(K.mx_quantize_dequantize(y, fmt, mode), y)
    p, code = K.mx_quantize(x, fmt, mode)
    assert torch.equal(K.mx_dequantize(p, code, fmt), y)  # QDQ == DQ(Q)
    s = K.e8m0_to_float(code)  # [rows, 1]: one block per row
    assert s.shape == (x.shape[0], 1)
    grid = _grid(fmt)
    # inside the range, the error is at most half the local step of the element grid (times the scale)
    v = (x / s).abs()
    inside = v <= fmt.element_max
    idx = torch.searchsorted(grid, v.clamp(max=fmt.element_max).contiguous()).clamp(1, len(grid) - 1)
    step = grid[idx] - grid[idx - 1]
    assert bool(((y - x).abs() <= step * s / 2 * (1 + 1e-6))[inside].all())


@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=16, max_size=64).filter(lambda v: len(v) % 16 == 0),
       st.booleans())
@settings(max_examples=100, deadline=None)
def test_nvfp4_qdq_equals_dq_of_q_and_is_bounded(values, with_tensor_scale):
    x = torch.tensor(values, dtype=torch.float32).reshape(1, -1)
    if not with_tensor_scale:  # without a per-tensor scale the range ends at 448 * 6 (see the next test)
        x = x.clamp(-2688, 2688)
    pts = K.per_tensor_amax_to_scale(x.abs().max()) if with_tensor_scale and bool(x.abs().max() > 0) else None
    p, sb = K.nvfp4_quantize(x, pts)
    y = K.nvfp4_quantize_dequantize(x, pts)
    assert torch.equal(K.nvfp4_dequantize(p, sb, pts), y)
    s = K.nvfp4_block_scales_hp(sb, pts).repeat_interleave(16, -1)
    # block amax / s_b <= 6 * (1 + 2**-4) (the e4m3 rounding of the scale): the error is at most one fp4 step
    assert bool(((y - x).abs() <= 2 * s * (1 + 1e-6)).all())


def test_nvfp4_range_without_and_with_a_tensor_scale():
    x = torch.tensor([[5000.0] + [1.0] * 15])
    assert float(K.nvfp4_quantize_dequantize(x)[0, 0]) == 2688.0  # s_b saturates at 448: 448 * 6
    pts = K.per_tensor_amax_to_scale(x.abs().max())
    assert float(K.nvfp4_quantize_dequantize(x, pts)[0, 0]) == pytest.approx(5000.0, rel=1e-6)


@pytest.mark.parametrize("fmt", MX, ids=lambda f: f.name)
def test_grid_values_round_trip_exactly(fmt):
    grid = _grid(fmt)
    vals = torch.cat([grid, -grid])
    n = (len(vals) + 31) // 32 * 32
    x = torch.cat([vals, torch.zeros(n - len(vals))]).reshape(-1, 32)
    x[:, 0] = fmt.element_max  # scale 1 in every block (FLOOR: 2**(emax - emax))
    p, code = K.mx_quantize(x, fmt)
    assert bool((code == 127).all()) and torch.equal(p, x)
    assert torch.equal(K.decode_elements(K.encode_elements(p, fmt), fmt), p)


def test_elements_round_half_to_even():
    x = torch.tensor([[6.0, 2.5, 3.5, 0.75, 0.25, 5.0, -2.5, -0.25] * 4])
    p, _ = K.mx_quantize(x, MXFP4)
    assert p[0, :8].tolist() == [6.0, 2.0, 4.0, 1.0, 0.0, 4.0, -2.0, -0.0]


def test_mxint8_is_symmetric_k_over_64():
    x = torch.tensor([[1.99, -1.99, 1 / 128, 3 / 128] + [0.0] * 28])
    p, code = K.mx_quantize(x, MXINT8)
    assert code.item() == 127 and p[0, :4].tolist() == [127 / 64, -127 / 64, 0.0, 2 / 64]
    assert K.encode_elements(p, MXINT8).dtype == torch.int8


def test_fp4_codes_pack_low_nibble_first():
    p = torch.tensor([[0.5, 6.0] * 16])
    q = K.encode_elements(p, MXFP4)
    assert q.shape == (1, 16) and q[0, 0].item() == 0x71  # 6.0 = code 7 in the high nibble, 0.5 = 1 in the low


def test_block_dims_and_bf16_inputs():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 64, generator=g)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        y = K.mx_quantize_dequantize(x.to(dt), MXFP8_E4M3)
        assert y.dtype == dt and y.shape == x.shape
        z = K.nvfp4_quantize_dequantize(x.to(dt))
        assert z.dtype == dt and z.shape == x.shape


# --------------------------------------------------------------------------- gradients
def test_straight_through_gradient():
    x = torch.tensor([[0.1, -0.7, 3.0, 5.9] * 8], requires_grad=True)
    K.mx_quantize_dequantize(x, MXFP4).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    # FLOOR saturates the top of a block whose amax rounds past the element max: no gradient there
    x = torch.tensor([[7.9] + [1.0] * 31], requires_grad=True)
    K.mx_quantize_dequantize(x, MXFP4).sum().backward()
    assert x.grad[0, 0] == 0 and bool((x.grad[0, 1:] == 1).all())
    x = torch.randn(2, 32, requires_grad=True)
    K.nvfp4_quantize_dequantize(x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("call, exc, words", [
    (lambda: K.mx_quantize(torch.randn(3, 30), MXFP4), ValueError, "block_size=32"),
    (lambda: K.mx_quantize(torch.randn(4, 32).double(), MXFP4), TypeError, "float32, bfloat16 or float16"),
    (lambda: K.mx_quantize(torch.ones(32, dtype=torch.int32), MXFP4), TypeError, "float32"),
    (lambda: K.mx_quantize(torch.randn(32), NVFP4), TypeError, "E8M0"),
    (lambda: K.mx_quantize(torch.randn(32), MXFP4, "floor"), TypeError, "ScaleCalculationMode"),
    (lambda: K.nvfp4_quantize(torch.randn(8)), ValueError, "block_size=16"),
    (lambda: K.nvfp4_quantize(torch.randn(16), torch.ones(2)), ValueError, "per_tensor_scale"),
    (lambda: mx_format(torch.float16), ValueError, "elem_dtype"),
    (lambda: MXFP4.with_block_size(0), ValueError, "block_size"),
])
def test_bad_input(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_formats_table():
    assert {f.name: f.bits_per_element for f in MX_FORMATS.values()} == {
        "mxfp8_e4m3": 8.25, "mxfp8_e5m2": 8.25, "mxfp6_e2m3": 6.25, "mxfp6_e3m2": 6.25, "mxfp4": 4.25,
        "mxint8": 8.25}
    assert NVFP4.bits_per_element == 4.5
