"""Layer 4: tensors that carry their quantization."""

from quanta.tensors.quantized import DequantizedTensor, QuantizedTensor, QuantizedTensorBase

__all__ = ["QuantizedTensorBase", "QuantizedTensor", "DequantizedTensor"]
