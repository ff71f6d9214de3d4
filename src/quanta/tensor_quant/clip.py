"""The ``Clip`` module: clamp to ``[clip_value_min, clip_value_max]`` with learnable bounds.

Used by :class:`~quanta.tensor_quant.TensorQuantizer` to learn amax
(``learn_amax=True``): the bounds receive the gradient of the clipped elements
(``d clip_value_max = sum of the upstream gradient where x > clip_value_max``,
likewise below ``clip_value_min``), the input the gradient of the others. The
arithmetic is :func:`quanta.kernels.amax_quant.clip`.

>>> c = Clip(-1.0, 2.0, learn_max=True)
>>> y = c(torch.tensor([-3.0, 0.5, 3.0, 4.0]))
>>> y.sum().backward()
>>> y.detach(), c.clip_value_max.grad
(tensor([-1.0000,  0.5000,  2.0000,  2.0000]), tensor(2.))
"""

from __future__ import annotations

import torch
from torch import nn

from quanta.kernels.amax_quant import clip

__all__ = ["Clip"]


class Clip(nn.Module):
    """Clamp with bounds that may be learned (scalar parameters ``clip_value_min``, ``clip_value_max``).

    Args:
        clip_value_min: lower bound.
        clip_value_max: upper bound (must not be below the lower bound).
        learn_min, learn_max: whether each bound requires grad.
    """

    def __init__(self, clip_value_min: float, clip_value_max: float, learn_min: bool = False,
                 learn_max: bool = False) -> None:
        super().__init__()
        lo = torch.as_tensor(clip_value_min, dtype=torch.float32).detach().clone().reshape(())
        hi = torch.as_tensor(clip_value_max, dtype=torch.float32).detach().clone().reshape(())
        if bool(lo > hi):
            raise ValueError(f"clip_value_min ({lo.item()}) must not exceed clip_value_max ({hi.item()})")
        self.clip_value_min = nn.Parameter(lo, requires_grad=bool(learn_min))
        self.clip_value_max = nn.Parameter(hi, requires_grad=bool(learn_max))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return clip(inputs, self.clip_value_min, self.clip_value_max)

    def extra_repr(self) -> str:
        return f"clip_value_min={self.clip_value_min.item():g}, clip_value_max={self.clip_value_max.item():g}"
