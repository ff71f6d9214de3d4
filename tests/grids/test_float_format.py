import pytest
import torch

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
    PRESETS,
    FloatFormat,
    SpecialValues,
)

TORCH = [FLOAT8_E4M3FN, FLOAT8_E5M2, FLOAT8_E4M3FNUZ, FLOAT8_E5M2FNUZ, FLOAT16, BFLOAT16]


@pytest.mark.parametrize("fmt", TORCH, ids=lambda f: f.name())
def test_constants_match_torch_finfo(fmt):
    info = torch.finfo(fmt.torch_dtype)
    assert fmt.max == info.max
    assert fmt.min_normal == info.smallest_normal
    assert FloatFormat.from_torch_dtype(fmt.torch_dtype) == fmt


@pytest.mark.parametrize("fmt", [f for f in TORCH if f.bits == 8], ids=lambda f: f.name())
def test_value_table_matches_every_torch_code(fmt):
    codes = torch.arange(256, dtype=torch.uint8).view(fmt.torch_dtype).to(torch.float64)
    finite = codes[torch.isfinite(codes)]
    expected = torch.unique(finite)  # sorted; -0.0 and 0.0 compare equal, so compare counts separately
    ours = fmt.finite_values()
    assert torch.equal(torch.unique(ours), expected)
    assert len(ours) == len(finite)  # same number of codes, signed zeros included


@pytest.mark.parametrize(
    "fmt, maximum, values",
    [(FP4_E2M1, 6.0, 16), (FP6_E3M2, 28.0, 64), (FP6_E2M3, 7.5, 64)],
    ids=["e2m1", "e3m2", "e2m3"],
)
def test_mx_formats(fmt, maximum, values):
    # OCP MX fp4/fp6: no inf, no NaN, every code is a number
    assert fmt.max == maximum and not fmt.has_nan
    assert len(fmt.finite_values()) == values


def test_from_aimet_conventions():
    assert FloatFormat.from_aimet(4, 3) == FloatFormat(4, 3, SpecialValues.AIMET)
    assert FloatFormat.from_aimet(4, 3).max == 240.0  # IEEE's largest e4m3 value, as AIMET
    assert FloatFormat.from_aimet(5, 2) == FLOAT8_E5M2  # torch has the dtype: AIMET casts
    assert FloatFormat.from_aimet(5, 10) == FLOAT16 and FloatFormat.from_aimet(8, 7) == BFLOAT16
    assert FloatFormat.from_aimet(4, 3, finite=True) == FLOAT8_E4M3FN
    assert FloatFormat.from_aimet(4, 3, finite=True, unsigned_zero=True) == FLOAT8_E4M3FNUZ
    assert FloatFormat.from_aimet(5, 2, finite=True, unsigned_zero=True) == FLOAT8_E5M2FNUZ
    assert FloatFormat.from_aimet(2, 1, finite=True) == FP4_E2M1
    with pytest.raises(ValueError, match="unsigned_zero=True requires finite=True"):
        FloatFormat.from_aimet(4, 3, finite=False, unsigned_zero=True)


@pytest.mark.parametrize("e, m, exc", [(0, 3, ValueError), (9, 3, ValueError), (4, 24, ValueError),
                                       (4, -1, ValueError), (4.0, 3, TypeError), (True, 3, TypeError)])
def test_bad_bits(e, m, exc):
    with pytest.raises(exc, match="exponent_bits|mantissa_bits"):
        FloatFormat(e, m)


def test_bad_dtype():
    with pytest.raises(ValueError, match="dtype must be one of"):
        FloatFormat.from_torch_dtype(torch.float32)


def test_presets_named():
    assert PRESETS["float8_e4m3fn"] is FLOAT8_E4M3FN
    assert PRESETS["float4_e2m1"] is FP4_E2M1
    assert set(PRESETS) >= {"float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float6_e3m2", "float6_e2m3",
                            "bfloat16", "float16"}


@pytest.mark.parametrize("e, m", [(e, m) for e in range(1, 9) for m in range(0, 8)])
def test_aimet_grid_is_ieee_one_binade_lower(e, m):
    """AIMET's ``(e, m)`` grid (aimet-torch's ``fake_cast_to_ieee_float``): IEEE's largest value, bias
    ``2**(e-1)``, every code a number; where IEEE has the format, it holds IEEE's values and one more binade."""
    fmt = FloatFormat.from_aimet(e, m)
    if fmt.torch_dtype is not None:
        assert fmt.special is SpecialValues.IEEE
        return
    assert fmt.special is SpecialValues.AIMET and not fmt.has_nan and fmt.has_negative_zero
    assert fmt.bias == 2 ** (e - 1) and fmt.max == (2 - 2.0**-m) * 2.0 ** (2 ** (e - 1) - 1)
    assert fmt.min_subnormal == 2.0 ** (1 - 2 ** (e - 1) - m)
    if e >= 2 and fmt.bits <= 16:
        ieee = FloatFormat(e, m, SpecialValues.IEEE)
        assert ieee.max == fmt.max
        assert set(ieee.finite_values().tolist()) < set(fmt.finite_values().tolist())
        assert fmt.min_normal == ieee.min_normal / 2


def test_aimet_e2m1_values_relative_to_max():
    """The grid of issue 16: ``{0, 1/12, 1/6, 1/4, 1/3, 1/2, 2/3, 1} * maxval``."""
    fmt = FloatFormat.from_aimet(2, 1)
    rel = [v / fmt.max for v in fmt.finite_values().tolist()[8:]]  # +0.0 and up
    assert rel == [0, 1 / 12, 1 / 6, 1 / 4, 1 / 3, 1 / 2, 2 / 3, 1]
    assert fmt.name() == "float4_e2m1_aimet"
