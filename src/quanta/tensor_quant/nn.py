"""pytorch_quantization's quantized modules (``from pytorch_quantization import nn as quant_nn`` →
``from quanta.tensor_quant import nn as quant_nn``).

Each module is its torch counterpart plus :class:`~quanta.tensor_quant.TensorQuantizer` s built from
descriptors: ``input_quantizer`` on the input, and for the layers with weights ``weight_quantizer`` on the
weight; the forward runs the torch op on the fake-quantized tensors. Descriptors come from the keyword
arguments ``quant_desc_input`` / ``quant_desc_weight`` or from the class defaults, which
``set_default_quant_desc_input`` / ``set_default_quant_desc_weight`` change for the instances built after::

    QuantLinear, QuantConv1d/2d/3d, QuantConvTranspose1d/2d/3d     input per tensor; weight per output channel
    QuantMaxPool1d/2d/3d, QuantAvgPool1d/2d/3d,                   input per tensor
    QuantAdaptiveAvgPool1d/2d/3d
    QuantLSTM, QuantLSTMCell                                      fused [x, h] per tensor; fused weights per row
                                                                  (:mod:`quanta.tensor_quant.rnn`)

(default descriptors as pytorch_quantization's: 8 bits, ``QUANT_DESC_8BIT_PER_TENSOR`` for inputs and the
``QUANT_DESC_8BIT_*_WEIGHT_PER_*`` ones for weights). Only fake quantization is supported, as there.

>>> import torch
>>> from quanta.tensor_quant import nn as quant_nn
>>> layer = quant_nn.QuantLinear(4, 2)
>>> layer.weight_quantizer
TensorQuantizer(8bit fake axis=0 amax=dynamic calibrator=MaxCalibrator quant)
>>> layer(torch.randn(3, 4)).shape
torch.Size([3, 2])
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from quanta.tensor_quant.descriptor import (
    QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW,
)
from quanta.tensor_quant.module_base import (
    QuantInputMixin,
    QuantMixin,
    pop_quant_desc_in_kwargs,
)
from quanta.tensor_quant.quantizer import TensorQuantizer

__all__ = [
    "TensorQuantizer", "QuantMixin", "QuantInputMixin", "pop_quant_desc_in_kwargs",
    "QuantLinear", "QuantConv1d", "QuantConv2d", "QuantConv3d",
    "QuantConvTranspose1d", "QuantConvTranspose2d", "QuantConvTranspose3d",
    "QuantMaxPool1d", "QuantMaxPool2d", "QuantMaxPool3d", "QuantAvgPool1d", "QuantAvgPool2d", "QuantAvgPool3d",
    "QuantAdaptiveAvgPool1d", "QuantAdaptiveAvgPool2d", "QuantAdaptiveAvgPool3d",
    "Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d",
    "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
    "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "QuantLSTM", "QuantLSTMCell", "LSTM", "LSTMCell",
]


# the float classes, bound now: quant_modules.initialize() replaces them in torch.nn by the classes below
_FLOAT = {name: getattr(nn, name) for name in ("Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d",
                                               "ConvTranspose2d", "ConvTranspose3d")}


def _split_quant_kwargs(kwargs: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {k: kwargs.pop(k) for k in names if k in kwargs}


class QuantLinear(nn.Linear, QuantMixin):
    """``nn.Linear`` on a fake-quantized input and weight (weight per output row by default)."""

    default_quant_desc_weight = QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device: Any = None,
                 dtype: torch.dtype | None = None, **kwargs: Any) -> None:
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.init_quantizer(*pop_quant_desc_in_kwargs(type(self), **kwargs))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(self._input_quantizer(input), self._weight_quantizer(self.weight), self.bias)


class _QuantConvNd(QuantMixin):
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(self._input_quantizer(input), self._weight_quantizer(self.weight), self.bias)


def _conv_init(self: nn.Module, base: type, args: tuple, kwargs: dict[str, Any]) -> None:
    quant = _split_quant_kwargs(kwargs, ("quant_desc_input", "quant_desc_weight"))
    base.__init__(self, *args, **kwargs)
    self.init_quantizer(*pop_quant_desc_in_kwargs(type(self), **quant))


class QuantConv1d(_QuantConvNd, nn.Conv1d):
    """``nn.Conv1d`` on a fake-quantized input and weight (weight per output channel by default)."""

    default_quant_desc_weight = QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _conv_init(self, _FLOAT["Conv1d"], args, kwargs)


class QuantConv2d(_QuantConvNd, nn.Conv2d):
    """``nn.Conv2d`` on a fake-quantized input and weight (weight per output channel by default)."""

    default_quant_desc_weight = QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _conv_init(self, _FLOAT["Conv2d"], args, kwargs)


class QuantConv3d(_QuantConvNd, nn.Conv3d):
    """``nn.Conv3d`` on a fake-quantized input and weight (weight per output channel by default)."""

    default_quant_desc_weight = QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _conv_init(self, _FLOAT["Conv3d"], args, kwargs)


class _QuantConvTransposeNd(QuantMixin):
    _functional: Any
    _dims: int

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        output_padding = self._output_padding(input, output_size, self.stride, self.padding, self.kernel_size,
                                              self._dims, self.dilation)
        return self._functional(self._input_quantizer(input), self._weight_quantizer(self.weight), self.bias,
                                self.stride, self.padding, output_padding, self.groups, self.dilation)


class QuantConvTranspose1d(_QuantConvTransposeNd, nn.ConvTranspose1d):
    """``nn.ConvTranspose1d`` on a fake-quantized input and weight."""

    default_quant_desc_weight = QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL
    _functional, _dims = staticmethod(F.conv_transpose1d), 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _conv_init(self, _FLOAT["ConvTranspose1d"], args, kwargs)


class QuantConvTranspose2d(_QuantConvTransposeNd, nn.ConvTranspose2d):
    """``nn.ConvTranspose2d`` on a fake-quantized input and weight."""

    default_quant_desc_weight = QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL
    _functional, _dims = staticmethod(F.conv_transpose2d), 2

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _conv_init(self, _FLOAT["ConvTranspose2d"], args, kwargs)


class QuantConvTranspose3d(_QuantConvTransposeNd, nn.ConvTranspose3d):
    """``nn.ConvTranspose3d`` on a fake-quantized input and weight."""

    default_quant_desc_weight = QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL
    _functional, _dims = staticmethod(F.conv_transpose3d), 3

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _conv_init(self, _FLOAT["ConvTranspose3d"], args, kwargs)


class _QuantPoolNd(QuantInputMixin):
    def forward(self, input: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return super().forward(self._input_quantizer(input))


def _pool_init(self: nn.Module, base: type, args: tuple, kwargs: dict[str, Any]) -> None:
    quant = _split_quant_kwargs(kwargs, ("quant_desc_input",))
    base.__init__(self, *args, **kwargs)
    self.init_quantizer(pop_quant_desc_in_kwargs(type(self), input_only=True, **quant))


def _pool(base: type) -> type:
    """``Quant<base>``: the pooling module on a fake-quantized input."""
    name = f"Quant{base.__name__}"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _pool_init(self, base, args, kwargs)

    cls = type(name, (_QuantPoolNd, base), {"__init__": __init__, "__module__": __name__, "__qualname__": name,
                                            "__doc__": f"``nn.{base.__name__}`` on a fake-quantized input."})
    return cls


QuantMaxPool1d, QuantMaxPool2d, QuantMaxPool3d = (_pool(b) for b in (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d))
QuantAvgPool1d, QuantAvgPool2d, QuantAvgPool3d = (_pool(b) for b in (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d))
QuantAdaptiveAvgPool1d, QuantAdaptiveAvgPool2d, QuantAdaptiveAvgPool3d = (
    _pool(b) for b in (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d))

# pytorch_quantization's short aliases (quant_nn.Conv2d is QuantConv2d)
Linear = QuantLinear
Conv1d, Conv2d, Conv3d = QuantConv1d, QuantConv2d, QuantConv3d
ConvTranspose1d, ConvTranspose2d, ConvTranspose3d = QuantConvTranspose1d, QuantConvTranspose2d, QuantConvTranspose3d
MaxPool1d, MaxPool2d, MaxPool3d = QuantMaxPool1d, QuantMaxPool2d, QuantMaxPool3d
AvgPool1d, AvgPool2d, AvgPool3d = QuantAvgPool1d, QuantAvgPool2d, QuantAvgPool3d
AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveAvgPool3d = (QuantAdaptiveAvgPool1d, QuantAdaptiveAvgPool2d,
                                                           QuantAdaptiveAvgPool3d)


from quanta.tensor_quant.rnn import QuantLSTM, QuantLSTMCell  # noqa: E402

LSTM, LSTMCell = QuantLSTM, QuantLSTMCell
