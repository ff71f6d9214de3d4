"""AdaRound's rounding (Nagel et al., 2020, "Up or Down? Adaptive Rounding for Post-Training Quantization").

AdaRound replaces round-to-nearest of a weight by a learned choice between its
floor and its ceiling on the grid. Each weight ``w`` gets a continuous variable
``alpha`` and is fake-quantized as (AIMET convention, ``offset = -zero_point``)::

    h(alpha)   = clamp(sigmoid(alpha) * (ZETA - GAMMA) + GAMMA, 0, 1)     rectified sigmoid
    QDQ_ada(w) = (clamp(floor(w / s) + h(alpha) - o, qmin, qmax) + o) * s

``h`` is soft while ``alpha`` is learned (so the layer's output error has a
gradient) and hard at the end: ``h = 1`` where ``alpha >= 0`` (the ceiling), else
0 (the floor). ``alpha`` starts where ``h(alpha)`` equals the weight's fractional
part ``w/s - floor(w/s)``, so the soft weight starts at ``w`` itself (clamped).

The formulas are AIMET's, operation for operation (``ZETA = 1.1``,
``GAMMA = -0.1``), so the values and gradients match it bit for bit in float32.

>>> import torch
>>> w, s, o = torch.tensor([0.24, -0.26, 0.5]), torch.tensor(0.1), torch.tensor(0.0)
>>> floor = torch.floor(w / s)
>>> alpha = initial_alpha(w, s)
>>> adarounded_qdq(floor, rectified_sigmoid(alpha), s, o, -8, 7)  # soft: the weight itself
tensor([ 0.2400, -0.2600,  0.5000])
>>> adarounded_qdq(floor, hard_rounding(alpha), s, o, -8, 7)  # hard: to nearest, before any learning
tensor([ 0.2000, -0.3000,  0.5000])
"""

from __future__ import annotations

import torch

__all__ = ["GAMMA", "ZETA", "adarounded_qdq", "hard_rounding", "initial_alpha", "rectified_sigmoid"]

#: Stretch of the rectified sigmoid: ``sigmoid`` is scaled to ``(GAMMA, ZETA)`` then clamped to ``[0, 1]``,
#: so ``h`` reaches exactly 0 and 1 for finite ``alpha``.
ZETA = 1.1
GAMMA = -0.1


def rectified_sigmoid(alpha: torch.Tensor) -> torch.Tensor:
    """``h(alpha) = clamp(sigmoid(alpha) * (ZETA - GAMMA) + GAMMA, 0, 1)``: the soft rounding in ``[0, 1]``."""
    return torch.clamp(torch.sigmoid(alpha) * (ZETA - GAMMA) + GAMMA, 0, 1)


def hard_rounding(alpha: torch.Tensor) -> torch.Tensor:
    """``1`` where ``alpha >= 0`` (round up), else ``0`` (round down), in ``alpha``'s dtype."""
    return (alpha >= 0).to(alpha.dtype)


def initial_alpha(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The ``alpha`` whose :func:`rectified_sigmoid` is the fractional part ``r = w/s - floor(w/s)``:
    ``-log((ZETA - GAMMA) / (r - GAMMA) - 1)``, in float32 (learned in float32 whatever the weight's dtype).

    ``scale`` broadcasts against ``weight`` (expand block scales first)."""
    floor = torch.floor(weight / scale)
    fraction = (weight / scale) - floor
    return (-torch.log((ZETA - GAMMA) / (fraction - GAMMA) - 1)).float()


def adarounded_qdq(floor: torch.Tensor, h: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                   qmin: int, qmax: int) -> torch.Tensor:
    """``(clamp(floor + h - o, qmin, qmax) + o) * s``: the weight fake-quantized with rounding ``h``.

    ``floor`` is ``floor(w / s)`` (computed once per weight; it has no gradient), ``h`` the soft or hard
    rounding; ``scale`` and ``offset`` broadcast against ``floor``. Differentiable in ``h``."""
    codes = torch.clamp(floor + h - offset, qmin, qmax)
    return (codes + offset) * scale
