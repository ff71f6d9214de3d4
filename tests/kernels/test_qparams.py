import math

import pytest
import torch

from quanta.grids.affine import IntegerGrid
from quanta.kernels.qparams import (
    calibrated_range,
    minimum_scale,
    offset_from_range,
    range_for_encoding,
    range_from_scale_offset,
    scale_from_range,
    ste_round,
)


def test_scale_formula():
    g = IntegerGrid(0, 255)
    assert scale_from_range(torch.tensor(-10.0), torch.tensor(41.0), g).item() == pytest.approx(0.2)
    assert scale_from_range(torch.tensor(0.0), torch.tensor(0.0), g).item() == minimum_scale(255)
    # |max - min|: an inverted learned range still gives a positive scale
    assert scale_from_range(torch.tensor(1.0), torch.tensor(-1.0), g).item() == pytest.approx(2 / 255)
    assert minimum_scale(2**32 - 1) == 0.01 / (2**32 - 1)


def test_offset_keeps_zero_on_grid():
    g = IntegerGrid(0, 255)
    s = torch.tensor(0.1)
    assert offset_from_range(torch.tensor(-10.0), s, g, False).item() == -100
    assert offset_from_range(torch.tensor(5.0), s, g, False).item() == 0  # min > 0: zero point clamps to qmin
    assert offset_from_range(torch.tensor(-100.0), s, g, False).item() == -255  # clamps to qmax
    assert offset_from_range(torch.tensor(-1.0), s, IntegerGrid(-128, 127), True).item() == 0
    assert offset_from_range(torch.tensor(-1.0), s, IntegerGrid(0, 15), True).item() == -8  # -round(7.5)


def test_ste_round_is_exact_with_identity_gradient():
    x = torch.tensor([0.5, 1.5, 2.5, -0.4, 1e20], requires_grad=True)
    y = ste_round(x)
    assert y.tolist() == [0.0, 2.0, 2.0, -0.0, torch.tensor(1e20).item()] and math.copysign(1, y[3].item()) == -1
    y.backward(torch.arange(5.0))
    assert x.grad.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


@pytest.mark.parametrize("grid", [IntegerGrid(0, 255), IntegerGrid(-128, 127), IntegerGrid(0, 15),
                                  IntegerGrid(-32768, 32767), IntegerGrid(-3, 11)])
def test_range_for_encoding_reproduces_scale_and_offset_exactly(grid):
    gen = torch.Generator().manual_seed(grid.qmax)
    scale = torch.exp(torch.empty(2000).uniform_(-15, 6, generator=gen))  # above the minimum scale
    offset = torch.randint(-grid.qmax, -grid.qmin + 1, (2000,), generator=gen).float()
    lo, hi, exact = range_for_encoding(scale, offset, grid)
    s = scale_from_range(lo, hi, grid)
    assert torch.equal(s[exact], scale[exact])
    assert torch.equal(offset_from_range(lo, s, grid, False)[exact], offset[exact])
    assert exact.float().mean() > 0.9
    # where no float32 range expresses the scale, it is kept to within one ulp
    ulp = torch.nextafter(scale, torch.full_like(scale, torch.inf)) - scale
    assert ((s - scale).abs()[~exact] <= ulp[~exact]).all()
    plain = scale_from_range(*range_from_scale_offset(scale, offset, grid), grid)
    assert (plain == scale).sum() < (s == scale).sum()  # the search is needed: the plain round trip drifts


def test_calibrated_range_asymmetric_and_symmetric():
    lo, hi = calibrated_range(torch.tensor([0.5, -2.0]), torch.tensor([3.0, -1.0]), 255, symmetric=False)
    assert lo.tolist() == [0.0, -2.0] and hi.tolist() == [3.0, 0.0]
    lo, hi = calibrated_range(torch.tensor(-1.0), torch.tensor(3.0), 255, symmetric=True)
    delta = max(3.0 / 127, 1.0 / 128)
    assert lo.item() == pytest.approx(-128 * delta) and hi.item() == pytest.approx(127 * delta)


def test_calibrated_range_positive_fit():
    """``positive_fit`` steps for the observed maximum (AIMET's MinMax on a 3-step symmetric grid: 2)."""
    lo, hi = calibrated_range(torch.tensor(-1.0), torch.tensor(3.0), 3, symmetric=True, positive_fit=2)
    assert (lo.item(), hi.item()) == (-3.0, 1.5)
    lo, hi = calibrated_range(torch.tensor(-4.0), torch.tensor(3.0), 3, symmetric=True, positive_fit=2)
    assert (lo.item(), hi.item()) == (-4.0, 2.0)  # the negative end decides
    lo, hi = calibrated_range(torch.tensor(0.0), torch.tensor(0.0), 3, symmetric=True, positive_fit=2)
    assert hi.item() == pytest.approx(minimum_scale(3)) and lo.item() == pytest.approx(-2 * minimum_scale(3))
    with pytest.raises(ValueError, match="positive_fit"):
        calibrated_range(torch.tensor(0.0), torch.tensor(1.0), 3, symmetric=True, positive_fit=0)


def test_calibrated_range_degenerate_widening():
    n = 255
    lo, hi = calibrated_range(torch.tensor(0.0), torch.tensor(0.0), n, symmetric=False)
    assert lo.item() == 0.0 and hi.item() == pytest.approx(n * minimum_scale(n))
    lo, hi = calibrated_range(torch.tensor(0.0), torch.tensor(0.0), n, symmetric=True)
    assert lo.item() == pytest.approx(-128 * minimum_scale(n)) and hi.item() == pytest.approx(127 * minimum_scale(n))
    assert scale_from_range(lo, hi, IntegerGrid(-128, 127)).item() == pytest.approx(minimum_scale(n))


def test_calibrated_range_clamps_to_finite():
    lo, hi = calibrated_range(torch.tensor(-3e38), torch.tensor(3e38), 255, symmetric=True)
    assert math.isfinite(lo.item()) and math.isfinite(hi.item())


def test_calibrated_range_rejects_bad_num_steps():
    with pytest.raises(ValueError, match="num_steps"):
        calibrated_range(torch.tensor(0.0), torch.tensor(1.0), 0, symmetric=False)
