"""Float modules for functional ops, so traced models can hold one quantizer set per op.

>>> Add()(torch.tensor([1.0]), torch.tensor([2.0]))
tensor([3.])
>>> Concat(dim=1)(torch.zeros(1, 2), torch.ones(1, 1))
tensor([[0., 0., 1.]])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Add", "Baddbmm", "ChannelsFirstLayerNorm", "Concat", "Divide", "Einsum", "Interpolate", "MatMul", "Mean",
           "Multiply",
           "OffsetRMSNorm", "Pointwise", "QuickGELU", "Subtract", "TransposedLinear"]


class Add(nn.Module):
    """``x + y``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor | float) -> torch.Tensor:
        return x + y


class Subtract(nn.Module):
    """``x - y``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor | float) -> torch.Tensor:
        return x - y


class Multiply(nn.Module):
    """``x * y``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor | float) -> torch.Tensor:
        return x * y


class Divide(nn.Module):
    """``x / y`` (true division).

    >>> Divide()(torch.tensor([3.0]), 2.0)
    tensor([1.5000])
    """

    def forward(self, x: torch.Tensor | float, y: torch.Tensor | float) -> torch.Tensor:
        return torch.div(x, y)


class Interpolate(nn.Module):
    """``F.interpolate(x, size, scale_factor, mode, align_corners)`` for the modes that compute new values
    (``linear``, ``bilinear``, ``bicubic``, ``trilinear``); nearest-neighbour resizing only copies values and
    needs no module.

    >>> Interpolate(size=(2, 2), mode="bilinear")(torch.arange(16.0).reshape(1, 1, 4, 4))
    tensor([[[[ 2.5000,  4.5000],
              [10.5000, 12.5000]]]])
    """

    MODES = ("linear", "bilinear", "bicubic", "trilinear")

    def __init__(self, size: int | tuple[int, ...] | None = None, scale_factor: float | tuple[float, ...] | None = None,
                 mode: str = "bilinear", align_corners: bool | None = None) -> None:
        super().__init__()
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {', '.join(self.MODES)}, got {mode!r}")
        if (size is None) == (scale_factor is None):
            raise ValueError("give exactly one of size and scale_factor")
        self.size = size
        self.scale_factor = scale_factor
        self.mode = mode
        self.align_corners = align_corners

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, size=self.size, scale_factor=self.scale_factor, mode=self.mode,
                             align_corners=self.align_corners)

    def extra_repr(self) -> str:
        what = f"size={self.size}" if self.size is not None else f"scale_factor={self.scale_factor}"
        return f"{what}, mode={self.mode!r}, align_corners={self.align_corners}"


class Pointwise(nn.Module):
    """An elementwise function written as a module of its own (transformers' ``ReLUSquaredActivation``,
    ``LaplaceActivation``, ...), as one op: graph capture wraps such a parameter-free module whose ops are all
    pointwise, so its output gets one quantizer as an activation's does.

    >>> class Squared(nn.Module):
    ...     def forward(self, x):
    ...         return torch.relu(x) ** 2
    >>> Pointwise(Squared())(torch.tensor([-1.0, 3.0]))
    tensor([0., 9.])
    """

    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class QuickGELU(nn.Module):
    """``x * sigmoid(1.702 * x)``: the GELU approximation of CLIP (transformers' ``QuickGELUActivation``).

    >>> QuickGELU()(torch.tensor([0.0, 1.0]))
    tensor([0.0000, 0.8458])
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


class MatMul(nn.Module):
    """``torch.matmul(x, y)``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, y)


class Einsum(nn.Module):
    """``torch.einsum(equation, *operands)``.

    >>> Einsum("bij,bjk->bik")(torch.ones(1, 2, 3), torch.ones(1, 3, 2))
    tensor([[[3., 3.],
             [3., 3.]]])
    """

    def __init__(self, equation: str) -> None:
        super().__init__()
        if not isinstance(equation, str):
            raise TypeError(f"equation must be a str, got {type(equation).__name__}")
        self.equation = equation

    def forward(self, *operands: torch.Tensor) -> torch.Tensor:
        return torch.einsum(self.equation, *operands)

    def extra_repr(self) -> str:
        return f"equation={self.equation!r}"


class Baddbmm(nn.Module):
    """``torch.baddbmm(input, batch1, batch2, beta=beta, alpha=alpha)``: ``beta * input + alpha * (batch1 @
    batch2)`` (BLOOM's ALiBi attention scores).

    >>> Baddbmm(beta=1.0, alpha=0.5)(torch.ones(1, 2, 2), torch.ones(1, 2, 3), torch.ones(1, 3, 2))
    tensor([[[2.5000, 2.5000],
             [2.5000, 2.5000]]])
    """

    def __init__(self, beta: float = 1.0, alpha: float = 1.0) -> None:
        super().__init__()
        self.beta, self.alpha = float(beta), float(alpha)

    def forward(self, input: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(input, batch1, batch2, beta=self.beta, alpha=self.alpha)

    def extra_repr(self) -> str:
        return f"beta={self.beta:g}, alpha={self.alpha:g}"


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


class OffsetRMSNorm(nn.RMSNorm):
    """RMSNorm scaled by ``offset + weight`` (Gemma's RMSNorm: ``offset = 1``, ``weight`` starts at zero),
    computed as transformers does: ``(x / rms(x)) * (offset + weight)`` in float32, then cast back.

    >>> norm = OffsetRMSNorm(2, eps=0.0)
    >>> norm(torch.tensor([[3.0, 4.0]]))
    tensor([[0.8485, 1.1314]], grad_fn=<MulBackward0>)
    """

    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float | None = None,
                 elementwise_affine: bool = True, offset: float = 1.0, device=None, dtype=None) -> None:
        self.offset = float(offset)
        super().__init__(normalized_shape, eps, elementwise_affine, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.zeros_(self.weight)  # the neutral scale is offset + 0

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return offset_rms_norm(input, self.normalized_shape, self.weight, self.eps, self.offset)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, offset={self.offset:g}"


def offset_rms_norm(x: torch.Tensor, normalized_shape: tuple[int, ...], weight: torch.Tensor | None,
                    eps: float | None, offset: float) -> torch.Tensor:
    """``(x / sqrt(mean(x**2) + eps)) * (offset + weight)`` in float32, cast back to ``x.dtype``."""
    h = x.float()
    dims = tuple(range(-len(normalized_shape), 0))
    y = h * torch.rsqrt(h.pow(2).mean(dims, keepdim=True) + (torch.finfo(x.dtype).eps if eps is None else eps))
    return (y if weight is None else y * (offset + weight.float())).to(x.dtype)


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    """``(N, C, *S)`` -> ``(N, *S, C)`` (explicit permutes: the ONNX exporter mistranslates negative movedim)."""
    return x.permute(0, *range(2, x.dim()), 1)


def _channels_first(x: torch.Tensor) -> torch.Tensor:
    """``(N, *S, C)`` -> ``(N, C, *S)``."""
    return x.permute(0, x.dim() - 1, *range(1, x.dim() - 1))
