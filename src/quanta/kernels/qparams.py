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
    "calibrated_range",
]

_EPS_FP32 = torch.finfo(torch.float32).eps


def ste_round(x: torch.Tensor) -> torch.Tensor:
    """``round(x)`` (half to even) in the forward pass, identity in the backward pass."""
    return x + (torch.round(x) - x).detach()


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


def calibrated_range(
    min: torch.Tensor, max: torch.Tensor, num_steps: int, symmetric: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn observed statistics into a quantizer range (MinMax calibration).

    * include zero: ``min <- min(min, 0)``, ``max <- max(max, 0)``;
    * widen degenerate ranges so ``max - min >= N * s_min``;
    * symmetric: ``delta = max(max / floor(N/2), -min / ceil(N/2))``,
      ``min = -ceil(N/2) * delta``, ``max = floor(N/2) * delta``.

    >>> calibrated_range(torch.tensor(-0.5), torch.tensor(0.375), 255, symmetric=True)
    (tensor(-0.5000), tensor(0.4961))
    """
    if num_steps < 1:
        raise ValueError(f"num_steps must be positive, got {num_steps}")
    min = torch.clamp_max(min.float() if min.dtype != torch.float64 else min, 0)
    max = torch.clamp_min(max.to(min.dtype), 0)
    finfo = torch.finfo(min.dtype)
    min, max = min.clamp_min(finfo.min), max.clamp_max(finfo.max)
    width = num_steps * minimum_scale(num_steps)
    # Degenerate (all-zero) statistics: grow the range on the side with room, keeping 0 inside.
    max = torch.where(max - min < width, min + width, max)
    if symmetric:
        pos, neg = num_steps // 2, math.ceil(num_steps / 2)
        if pos == 0:  # a 1-step signed grid [-1, 0] only has negative codes
            delta = -min / neg
        else:
            delta = torch.maximum(max / pos, -min / neg)
        min, max = -neg * delta, pos * delta
    return min, max
