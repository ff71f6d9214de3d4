"""AIMET's module path ``quantization.tensor``: the quantized tensor classes."""

from quanta.tensors.quantized import DequantizedTensor, QuantizedTensor, QuantizedTensorBase

__all__ = ["QuantizedTensorBase", "QuantizedTensor", "DequantizedTensor"]
