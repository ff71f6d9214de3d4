"""Quantized counterparts of ``torch.nn`` modules (AIMET v2 style): ``import quanta.nn``.

>>> import torch
>>> import quanta.nn
>>> lin = torch.nn.Linear(16, 4)
>>> qlin = quanta.nn.from_module(lin)          # or quanta.nn.QuantizedLinear.from_module(lin)
>>> qlin.param_quantizers["weight"].shape, qlin.output_quantizers[0].shape
((4, 1), ())
>>> with qlin.compute_encodings():
...     _ = qlin(torch.randn(32, 16))
>>> y = qlin(torch.randn(2, 16))                # QDQ(F.linear(x, QDQ(weight), bias))
>>> type(y).__name__
'DequantizedTensor'
"""

from quanta.nn.attention import QuantizedMultiheadAttention
from quanta.nn.base import (
    QuantizationMixin,
    default_activation_quantizer,
    default_weight_quantizer,
)
from quanta.nn.functional import Add, ChannelsFirstLayerNorm, Concat, MatMul, Mean, Multiply, TransposedLinear
from quanta.nn.modules import (
    QuantizedAdaptiveAvgPool1d,
    QuantizedAdaptiveAvgPool2d,
    QuantizedAdaptiveAvgPool3d,
    QuantizedAdd,
    QuantizedAvgPool1d,
    QuantizedAvgPool2d,
    QuantizedAvgPool3d,
    QuantizedBatchNorm1d,
    QuantizedBatchNorm2d,
    QuantizedChannelsFirstLayerNorm,
    QuantizedConcat,
    QuantizedConv1d,
    QuantizedConv2d,
    QuantizedConv3d,
    QuantizedConvTranspose1d,
    QuantizedConvTranspose2d,
    QuantizedELU,
    QuantizedEmbedding,
    QuantizedGELU,
    QuantizedGroupNorm,
    QuantizedHardsigmoid,
    QuantizedHardswish,
    QuantizedHardtanh,
    QuantizedLayerNorm,
    QuantizedLeakyReLU,
    QuantizedLinear,
    QuantizedMatMul,
    QuantizedMean,
    QuantizedMish,
    QuantizedMultiply,
    QuantizedReLU,
    QuantizedReLU6,
    QuantizedRMSNorm,
    QuantizedSiLU,
    QuantizedSigmoid,
    QuantizedSoftmax,
    QuantizedTanh,
    QuantizedTransposedLinear,
)
from quanta.nn.registry import from_module, quantized_class_for, register, unregister

__all__ = [
    "Add",
    "ChannelsFirstLayerNorm",
    "Concat",
    "MatMul",
    "Mean",
    "Multiply",
    "QuantizationMixin",
    "QuantizedAdaptiveAvgPool1d",
    "QuantizedAdaptiveAvgPool2d",
    "QuantizedAdaptiveAvgPool3d",
    "QuantizedAdd",
    "QuantizedAvgPool1d",
    "QuantizedAvgPool2d",
    "QuantizedAvgPool3d",
    "QuantizedBatchNorm1d",
    "QuantizedBatchNorm2d",
    "QuantizedChannelsFirstLayerNorm",
    "QuantizedConcat",
    "QuantizedConv1d",
    "QuantizedConv2d",
    "QuantizedConv3d",
    "QuantizedConvTranspose1d",
    "QuantizedConvTranspose2d",
    "QuantizedELU",
    "QuantizedEmbedding",
    "QuantizedGELU",
    "QuantizedGroupNorm",
    "QuantizedHardsigmoid",
    "QuantizedHardswish",
    "QuantizedHardtanh",
    "QuantizedLayerNorm",
    "QuantizedLeakyReLU",
    "QuantizedLinear",
    "QuantizedMatMul",
    "QuantizedMean",
    "QuantizedMish",
    "QuantizedMultiheadAttention",
    "QuantizedMultiply",
    "QuantizedReLU",
    "QuantizedReLU6",
    "QuantizedRMSNorm",
    "QuantizedSiLU",
    "QuantizedSigmoid",
    "QuantizedSoftmax",
    "QuantizedTanh",
    "QuantizedTransposedLinear",
    "TransposedLinear",
    "default_activation_quantizer",
    "default_weight_quantizer",
    "from_module",
    "quantized_class_for",
    "register",
    "unregister",
]
