"""Float quantization (AIMET style): ``Q.float.FloatQuantizeDequantize`` and formats."""

from quanta.grids.float import PRESETS, FloatFormat, SpecialValues
from quanta.quantization.float.quantizer import FloatQuantizeDequantize, QuantizeDequantize

__all__ = ["FloatQuantizeDequantize", "QuantizeDequantize", "FloatFormat", "SpecialValues", "PRESETS"]
