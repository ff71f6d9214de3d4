"""fpx codes: exhaustive decode/encode per format against a value table built here from the definition."""

import math

import pytest
import torch

from quanta.grids.float import FLOAT8_E4M3FN, FloatFormat, SpecialValues
from quanta.kernels import fpx_codes as F

# (ebits, mbits, largest value): torchao's fp4/fp6/fp8-without-specials formats
FORMATS = [(2, 1, 6.0), (3, 2, 28.0), (2, 3, 7.5), (4, 3, 480.0), (5, 2, 114688.0)]
EXTRA = [(1, 2), (3, 0), (1, 0), (6, 1), (2, 5)]  # any e/m with 1 + e + m <= 8


def table(e: int, m: int) -> list[float]:
    """Value of every code, straight from the S|E|M definition (no kernel code involved)."""
    bias = 2 ** (e - 1) - 1
    out = []
    for code in range(2 ** (1 + e + m)):
        sign = -1.0 if code >> (e + m) else 1.0
        ef = (code >> m) & (2**e - 1)
        mf = code & (2**m - 1)
        mag = math.ldexp(mf, 1 - bias - m) if ef == 0 else math.ldexp(2**m + mf, ef - bias - m)
        out.append(math.copysign(mag, sign))
    return out


def nearest_code(v: float, e: int, m: int) -> int:
    """Brute force: the code of the nearest value, ties to the even code, saturating at the largest.

    With no mantissa bits the two neighbours of a tie differ in the exponent code; the even one wins
    (quanta's ``fake_cast`` and torchao agree there).
    """
    vals = table(e, m)
    half = 2 ** (e + m)
    mags = vals[:half]  # non-negative codes, ascending
    a = min(abs(v), mags[-1])
    dist = [abs(x - a) for x in mags]
    best = min(dist)
    cands = [i for i, d in enumerate(dist) if d == best]
    if len(cands) == 1:
        i = cands[0]
    else:
        i = next(c for c in cands if c % 2 == 0)
    return i | (half if math.copysign(1.0, v) < 0 else 0)


@pytest.mark.parametrize("e,m,vmax", FORMATS, ids=[f"e{e}m{m}" for e, m, _ in FORMATS])
def test_decode_every_code_matches_the_definition(e, m, vmax):
    fmt = F.fpx_format(e, m)
    codes = torch.arange(2 ** (1 + e + m), dtype=torch.int32).to(torch.uint8)
    got = F.decode(codes, fmt)
    want = torch.tensor(table(e, m), dtype=torch.float64).to(torch.float32)
    assert got.dtype == torch.float32
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))  # -0.0 included
    assert fmt.max == vmax == float(got.max())
    pos = got[got >= 0].double().unique()
    assert torch.equal(pos, fmt.finite_values()[fmt.finite_values() >= 0].unique())


@pytest.mark.parametrize("e,m", [(e, m) for e, m, _ in FORMATS] + EXTRA)
def test_every_code_round_trips(e, m):
    fmt = F.fpx_format(e, m)
    codes = torch.arange(2 ** (1 + e + m), dtype=torch.int32).to(torch.uint8)
    assert torch.equal(F.encode(F.decode(codes, fmt), fmt), codes)
    assert torch.equal(F.value_table(fmt), F.decode(codes, fmt))


@pytest.mark.parametrize("e,m", [(e, m) for e, m, _ in FORMATS] + EXTRA)
def test_midpoints_round_to_the_even_code(e, m):
    fmt = F.fpx_format(e, m)
    pos = sorted(set(v for v in table(e, m) if v >= 0))
    mids = [(a + b) / 2 for a, b in zip(pos, pos[1:])]
    x = torch.tensor(mids + [-v for v in mids], dtype=torch.float64)
    got = F.encode(x, fmt).tolist()
    half = 2 ** (e + m)
    for v, c in zip(x.tolist(), got):
        assert (c % half) % 2 == 0, (v, c)  # the even code of the two neighbours
        assert c == nearest_code(v, e, m)
    # a hair off the midpoint goes to the nearer neighbour
    for lo, hi in zip(pos, pos[1:]):
        mid = (lo + hi) / 2
        below, above = F.encode(torch.tensor([mid - (hi - lo) / 8, mid + (hi - lo) / 8], dtype=torch.float64), fmt)
        assert F.decode(below.view(1), fmt).item() == lo and F.decode(above.view(1), fmt).item() == hi


@pytest.mark.parametrize("e,m,vmax", FORMATS, ids=[f"e{e}m{m}" for e, m, _ in FORMATS])
def test_encode_random_values_matches_brute_force(e, m, vmax):
    g = torch.Generator().manual_seed(e * 10 + m)
    x = torch.cat([torch.randn(300, generator=g) * vmax / 3, torch.rand(100, generator=g) * fmt_min_normal(e) * 2])
    got = F.encode(x, F.fpx_format(e, m)).tolist()
    assert got == [nearest_code(v, e, m) for v in x.tolist()]


def fmt_min_normal(e):
    return 2.0 ** (2 - 2 ** (e - 1))


@pytest.mark.parametrize("e,m,vmax", FORMATS, ids=[f"e{e}m{m}" for e, m, _ in FORMATS])
def test_saturation_and_signed_zero(e, m, vmax):
    fmt = F.fpx_format(e, m)
    top = 2 ** (e + m) - 1
    sign = 2 ** (e + m)
    x = torch.tensor([vmax, vmax * 1.0001, vmax * 4, 3e38, math.inf, -math.inf, -vmax * 2, 0.0, -0.0])
    assert F.encode(x, fmt).tolist() == [top, top, top, top, top, sign | top, sign | top, 0, sign]


@pytest.mark.parametrize("e,m,vmax", FORMATS, ids=[f"e{e}m{m}" for e, m, _ in FORMATS])
def test_subnormal_edge(e, m, vmax):
    fmt = F.fpx_format(e, m)
    sub = fmt.min_subnormal
    x = torch.tensor([sub / 2, sub / 2 * 1.0001, sub * 1.5, sub / 4, 1e-45], dtype=torch.float64)
    # half the smallest subnormal ties to 0 (even); just above goes up; 1.5 sub ties to 2 sub (even)
    assert F.encode(x, fmt).tolist() == [0, 1, 2, 0, 0]


def test_input_dtype_does_not_change_codes():
    fmt = F.fpx_format(3, 2)
    x = torch.linspace(-30, 30, 241)
    want = F.encode(x, fmt)
    for dt in (torch.float64, torch.bfloat16, torch.float16):
        v = x.to(dt)
        assert torch.equal(F.encode(v, fmt), F.encode(v.to(torch.float32), fmt))
    assert torch.equal(F.encode(x.double(), fmt), want)


def test_nan_raises():
    fmt = F.fpx_format(2, 1)
    with pytest.raises(ValueError, match="NaN"):
        F.encode(torch.tensor([1.0, float("nan"), 2.0]), fmt)
    with pytest.raises(ValueError, match="NaN"):
        F.encode(torch.tensor([-float("nan")]), fmt)


def test_bad_arguments():
    with pytest.raises(ValueError, match="at most 8"):
        F.fpx_format(4, 4)
    with pytest.raises(ValueError, match="ebits >= 1"):
        F.fpx_format(0, 3)
    with pytest.raises(TypeError, match="ebits must be an int"):
        F.fpx_format(2.0, 1)
    with pytest.raises(ValueError, match="SpecialValues.FINITE"):
        F.encode(torch.tensor([1.0]), FLOAT8_E4M3FN)
    with pytest.raises(ValueError, match="SpecialValues.FINITE"):
        F.decode(torch.tensor([1], dtype=torch.uint8), FloatFormat(5, 4, SpecialValues.FINITE))
    with pytest.raises(TypeError, match="floating-point"):
        F.encode(torch.tensor([1]), F.fpx_format(2, 1))
    with pytest.raises(TypeError, match="integer tensor"):
        F.decode(torch.tensor([1.0]), F.fpx_format(2, 1))
    with pytest.raises(ValueError, match=r"must lie in \[0, 15\]"):
        F.decode(torch.tensor([16], dtype=torch.uint8), F.fpx_format(2, 1))
    with pytest.raises(TypeError, match="FloatFormat"):
        F.encode(torch.tensor([1.0]), (2, 1))


def test_empty_tensors():
    fmt = F.fpx_format(2, 1)
    assert F.encode(torch.empty(0, 3), fmt).shape == (0, 3)
    assert F.decode(torch.empty(0, dtype=torch.uint8), fmt).shape == (0,)


def test_rows_scale_quantize_dequantize():
    fmt = F.fpx_format(3, 2)
    x = torch.tensor([[1.0, -28.0, 3.3], [0.0, 0.0, 0.0], [0.1, 0.2, -0.05]])
    s = F.row_scale(x, fmt)
    assert torch.equal(s, (x.abs().amax(1).clamp_min(1e-12) / 28.0))
    codes = F.quantize_rows(x, s, fmt)
    dq = F.dequantize_rows(codes, s, fmt)
    assert not bool(torch.isnan(dq).any()) and bool((dq[1] == 0).all())
    assert torch.equal(dq[0, :2], x[0, :2])  # 1/1 and -28/1 are on the grid
    assert torch.equal(codes, F.encode(x / s.view(-1, 1), fmt))
    assert F.dequantize_rows(codes, s.bfloat16(), fmt, torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="2-D"):
        F.row_scale(x.reshape(-1), fmt)
    with pytest.raises(ValueError, match="one entry per row"):
        F.quantize_rows(x, s[:2], fmt)
    with pytest.raises(ValueError, match="one entry per row"):
        F.dequantize_rows(codes, s[:2], fmt)


def test_no_mantissa_bits_ties_go_to_the_even_code():
    fmt = F.fpx_format(3, 0)  # values 0, 0.25, 0.5, 1, 2, 4, 8, 16 (codes 0..7)
    assert F.decode(F.encode(torch.tensor([0.75, 3.0, 12.0, 0.375, 0.125]), fmt), fmt).tolist() == [
        0.5, 2.0, 8.0, 0.5, 0.0]
