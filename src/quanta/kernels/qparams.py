"""Quantization parameters from ranges, and ranges from statistics.

The AIMET-style quantizers keep a learnable range ``[min, max]`` and derive
scale and offset from it on every call. All of that arithmetic, including the
straight-through rounding of the offset, lives here.

With ``N = qmax - qmin`` and ``s_min = min(eps_fp32, 0.01 / N)``:

* ``scale  = max(|max - min|, N * s_min) / N``
* ``offset = clamp(round(min / scale), qmin - qmax, 0) - qmin`` (asymmetric; the
  zero point ``-offset`` stays on the grid so 0.0 is always representable)
* ``offset = -round((qmin + qmax) / 2)`` (symmetric; a constant)
* ``get_min = scale * (offset + qmin)``, ``get_max = scale * (offset + qmax)``

``round`` is half to even, with a straight-through gradient, so an optimizer
can learn ``min`` and ``max`` (gradients reach them through scale and offset).
"""

from __future__ import annotations

import math

import torch

from quanta.grids.affine import IntegerGrid

__all__ = [
    "ste_round",
    "minimum_scale",
    "scale_from_range",
    "offset_from_range",
    "range_from_scale_offset",
    "range_for_encoding",
    "calibrated_range",
]

_EPS_FP32 = torch.finfo(torch.float32).eps


class _SteRound(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return torch.round(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad


def ste_round(x: torch.Tensor) -> torch.Tensor:
    """``round(x)`` (half to even, exactly, sign of zero kept) forward; identity backward.

    >>> x = torch.tensor([2.5, -0.2], requires_grad=True)
    >>> y = ste_round(x); y.sum().backward()
    >>> y.detach(), x.grad
    (tensor([2., -0.]), tensor([1., 1.]))
    """
    return _SteRound.apply(x)


def minimum_scale(num_steps: int) -> float:
    """Smallest scale a quantizer uses: ``min(eps_fp32, 0.01 / num_steps)``.

    >>> minimum_scale(255) == torch.finfo(torch.float32).eps
    True
    """
    return min(_EPS_FP32, 0.01 / num_steps)


def scale_from_range(min: torch.Tensor, max: torch.Tensor, grid: IntegerGrid) -> torch.Tensor:
    """``max(|max - min|, N * s_min) / N`` in float32 (or the inputs' wider dtype).

    >>> scale_from_range(torch.tensor(-12.8), torch.tensor(12.7), IntegerGrid(-128, 127))
    tensor(0.1000)
    """
    n = grid.num_steps
    dtype = torch.promote_types(min.dtype, torch.float32)
    width = (max.to(dtype) - min.to(dtype)).abs()
    return torch.clamp_min(width, n * minimum_scale(n)) / n


def offset_from_range(
    min: torch.Tensor, scale: torch.Tensor, grid: IntegerGrid, symmetric: bool
) -> torch.Tensor:
    """Offset (``-zero_point``) for a range starting at ``min``.

    >>> offset_from_range(torch.tensor(-10.0), torch.tensor(0.2), IntegerGrid(0, 255), symmetric=False)
    tensor(-50.)
    >>> offset_from_range(torch.tensor(-1.0), torch.tensor(0.2), IntegerGrid(0, 255), symmetric=True)
    tensor(-128.)
    """
    if symmetric:
        return torch.full_like(scale, -round((grid.qmin + grid.qmax) / 2), requires_grad=False)
    r = ste_round(min.to(scale.dtype) / scale)
    return torch.clamp(r, grid.qmin - grid.qmax, 0) - grid.qmin


def range_from_scale_offset(
    scale: torch.Tensor, offset: torch.Tensor, grid: IntegerGrid
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale * (offset + qmin), scale * (offset + qmax))``: the representable range."""
    return scale * (offset + grid.qmin), scale * (offset + grid.qmax)


def _ulp_steps(t: torch.Tensor, k: int) -> list[torch.Tensor]:
    """``[t - k ulp, ..., t, ..., t + k ulp]`` (each step one ``nextafter``)."""
    up, down = [t], [t]
    for _ in range(k):
        up.append(torch.nextafter(up[-1], torch.full_like(t, torch.inf)))
        down.append(torch.nextafter(down[-1], torch.full_like(t, -torch.inf)))
    return down[:0:-1] + up


def range_for_encoding(
    scale: torch.Tensor, offset: torch.Tensor, grid: IntegerGrid, *, symmetric: bool = False, ulps: int = 4
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A range ``(min, max)`` from which scale and offset come back bit for bit, where one exists.

    ``range_from_scale_offset`` alone can be an ulp off after the round trip
    ``s -> (min, max) -> (max - min) / N``, because ``max - min`` rounds. This
    tries ``min`` and ``max`` within ``ulps`` ulps of the plain answer, nearest
    first, and keeps the first pair that reproduces both scale and offset.
    Some float32 scales have no such pair at all (no float32 ``max - min``
    divides to them); there the plain answer is kept, one ulp off at most.

    Returns ``(min, max, exact)``, ``exact`` marking the entries reproduced bit for bit.

    >>> s, o, g = torch.tensor(0.007843137718737125), torch.tensor(-38.0), IntegerGrid(0, 255)
    >>> lo, hi, exact = range_for_encoding(s, o, g)
    >>> bool(scale_from_range(lo, hi, g) == s), bool(exact)
    (True, True)
    """
    lo0, hi0 = range_from_scale_offset(scale, offset, grid)
    best_lo, best_hi = lo0.clone(), hi0.clone()
    found = torch.zeros_like(scale, dtype=torch.bool)
    los, his = _ulp_steps(lo0, ulps), _ulp_steps(hi0, ulps)
    order = sorted(((i, j) for i in range(len(los)) for j in range(len(his))),
                   key=lambda ij: abs(ij[0] - ulps) + abs(ij[1] - ulps))
    for i, j in order:
        lo, hi = los[i], his[j]
        s = scale_from_range(lo, hi, grid).to(scale.dtype)
        ok = (s == scale) & (offset_from_range(lo, s, grid, symmetric) == offset) & ~found
        best_lo, best_hi = torch.where(ok, lo, best_lo), torch.where(ok, hi, best_hi)
        found |= ok
        if bool(found.all()):
            break
    return best_lo, best_hi, found


def calibrated_range(
    min: torch.Tensor, max: torch.Tensor, num_steps: int, symmetric: bool, *, positive_fit: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn observed statistics into a quantizer range (MinMax calibration, as AIMET).

    With ``N = num_steps`` and ``s_min = minimum_scale(N)``:

    * include zero: ``min <- min(min, 0)``, ``max <- max(max, 0)``;
    * widen degenerate ranges, where ``(max - min) / N < s_min``: asymmetric
      ``max += N * s_min``; symmetric ``max += floor(N/2) * s_min``,
      ``min -= ceil(N/2) * s_min``;
    * symmetric: ``delta = max(max / P, -min / ceil(N/2))``,
      ``min = -ceil(N/2) * delta``, ``max = floor(N/2) * delta``, where ``P`` is
      ``positive_fit`` if given, else ``floor(N/2)``: the number of steps the observed
      maximum is fitted into. AIMET's MinMax fits it into 2 steps of a 3-step grid
      (2-bit), clipping the positive end so that symmetric data use every code
      (:class:`~quanta.calibration.minmax.MinMaxEncodingAnalyzer`);
    * clamp to the finite range of the dtype.

    >>> calibrated_range(torch.tensor(-0.5), torch.tensor(0.375), 255, symmetric=True)
    (tensor(-0.5000), tensor(0.4961))
    >>> calibrated_range(torch.tensor(0.0), torch.tensor(0.0), 255, symmetric=False)[1] == 255 * minimum_scale(255)
    tensor(True)
    >>> calibrated_range(torch.tensor(2.0), torch.tensor(5.0), 3, symmetric=True, positive_fit=2)
    (tensor(-5.), tensor(2.5000))
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be positive, got {num_steps}")
    if positive_fit is not None and (isinstance(positive_fit, bool) or not isinstance(positive_fit, int)
                                     or positive_fit < 1):
        raise ValueError(f"positive_fit must be a positive int, got {positive_fit!r}")
    dtype = torch.promote_types(min.dtype, torch.float32)
    min = torch.clamp_max(min.to(dtype), 0)
    max = torch.clamp_min(max.to(dtype), 0)
    s_min = minimum_scale(num_steps)
    pos, neg = num_steps // 2, math.ceil(num_steps / 2)
    degenerate = (max - min) / num_steps < s_min
    if symmetric:
        max = torch.where(degenerate, max + pos * s_min, max)
        min = torch.where(degenerate, min - neg * s_min, min)
        # a 1-step signed grid [-1, 0] has no positive codes: only the negative side counts
        fit = pos if positive_fit is None else positive_fit
        delta = -min / neg if pos == 0 else torch.maximum(max / fit, -min / neg)
        min, max = -neg * delta, pos * delta
    else:
        max = torch.where(degenerate, max + num_steps * s_min, max)
    finfo = torch.finfo(dtype)
    return min.clamp(finfo.min, finfo.max), max.clamp(finfo.min, finfo.max)
