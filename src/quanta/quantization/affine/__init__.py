"""Affine (integer-grid) quantization, AIMET v2 style: functional API and quantizer modules."""

from quanta.quantization.affine.functional import dequantize, quantize, quantize_dequantize
from quanta.quantization.affine.quantizer import AffineQuantizerBase, Quantize, QuantizeDequantize
from quanta.quantization.affine.grouped_block import GroupedBlockQuantizeDequantize
from quanta.encodings.affine import AffineEncoding

__all__ = [
    "quantize",
    "quantize_dequantize",
    "dequantize",
    "AffineQuantizerBase",
    "Quantize",
    "QuantizeDequantize",
    "GroupedBlockQuantizeDequantize",
    "AffineEncoding",
]
