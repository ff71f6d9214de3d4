"""Float modules for functional ops, so traced models can hold one quantizer set per op.

>>> Add()(torch.tensor([1.0]), torch.tensor([2.0]))
tensor([3.])
>>> Concat(dim=1)(torch.zeros(1, 2), torch.ones(1, 1))
tensor([[0., 0., 1.]])
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Add", "Concat", "MatMul", "Multiply"]


class Add(nn.Module):
    """``x + y``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor | float) -> torch.Tensor:
        return x + y


class Multiply(nn.Module):
    """``x * y``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor | float) -> torch.Tensor:
        return x * y


class MatMul(nn.Module):
    """``torch.matmul(x, y)``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, y)


class Concat(nn.Module):
    """``torch.cat(tensors, dim)``."""

    def __init__(self, dim: int = 0) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return torch.cat(tensors, dim=self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"
