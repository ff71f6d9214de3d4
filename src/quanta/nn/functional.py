"""Float modules for functional ops, so traced models can hold one quantizer set per op.

>>> Add()(torch.tensor([1.0]), torch.tensor([2.0]))
tensor([3.])
>>> Concat(dim=1)(torch.zeros(1, 2), torch.ones(1, 1))
tensor([[0., 0., 1.]])
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Add", "ChannelsFirstLayerNorm", "Concat", "MatMul", "Mean", "Multiply", "TransposedLinear"]


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


class TransposedLinear(nn.Module):
    """``x @ weight + bias`` with ``weight`` stored ``(in_features, out_features)``: the layout of GPT-2's
    ``Conv1D`` (transformers), which graph capture turns into this module (sharing its parameters).

    >>> m = TransposedLinear(torch.ones(3, 2), torch.zeros(2))
    >>> m(torch.ones(1, 3)).tolist()
    [[3.0, 3.0]]
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if weight.dim() != 2:
            raise ValueError(f"weight must be 2-D (in_features, out_features), got shape {tuple(weight.shape)}")
        if bias is not None and tuple(bias.shape) != (weight.shape[1],):
            raise ValueError(f"bias must have shape ({weight.shape[1]},), got {tuple(bias.shape)}")
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight)
        self.bias = bias if bias is None or isinstance(bias, nn.Parameter) else nn.Parameter(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.reshape(-1, x.shape[-1])
        y = torch.mm(y, self.weight) if self.bias is None else torch.addmm(self.bias, y, self.weight)
        return y.reshape(*x.shape[:-1], self.weight.shape[1])

    def extra_repr(self) -> str:
        return f"in_features={self.weight.shape[0]}, out_features={self.weight.shape[1]}, bias={self.bias is not None}"


class Mean(nn.Module):
    """``torch.mean(x, dim, keepdim)`` (global average pooling written as a mean).

    >>> Mean(dim=(-2, -1))(torch.ones(1, 2, 3, 3))
    tensor([[1., 1.]])
    """

    def __init__(self, dim: int | tuple[int, ...] | None = None, keepdim: bool = False) -> None:
        super().__init__()
        self.dim = dim
        self.keepdim = keepdim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dim is None:
            return torch.mean(x)
        return torch.mean(x, self.dim, keepdim=self.keepdim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, keepdim={self.keepdim}"


class ChannelsFirstLayerNorm(nn.LayerNorm):
    """LayerNorm over dim 1 of an ``(N, C, ...)`` tensor (ConvNeXt's ``channels_first`` LayerNorm).

    >>> norm = ChannelsFirstLayerNorm(2)
    >>> norm(torch.tensor([[[1.0], [3.0]]])).squeeze()
    tensor([-1.0000,  1.0000], grad_fn=<SqueezeBackward0>)
    """

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return _channels_first(super().forward(_channels_last(input)))


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    """``(N, C, *S)`` -> ``(N, *S, C)`` (explicit permutes: the ONNX exporter mistranslates negative movedim)."""
    return x.permute(0, *range(2, x.dim()), 1)


def _channels_first(x: torch.Tensor) -> torch.Tensor:
    """``(N, *S, C)`` -> ``(N, C, *S)``."""
    return x.permute(0, x.dim() - 1, *range(1, x.dim() - 1))
