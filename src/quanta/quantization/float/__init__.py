"""Float quantization (AIMET style): ``Q.float.FloatQuantizeDequantize`` and formats, and the block-scaled MX /
NVFP4 ``Q.float.BlockScaledQuantizeDequantize``."""

from quanta.grids.float import PRESETS, FloatFormat, SpecialValues
from quanta.quantization.float.block_scaled import BLOCK_SCALED_FORMATS, BlockScaledQuantizeDequantize
from quanta.quantization.float.quantizer import FloatQuantizeDequantize, QuantizeDequantize

__all__ = ["FloatQuantizeDequantize", "QuantizeDequantize", "FloatFormat", "SpecialValues", "PRESETS",
           "BlockScaledQuantizeDequantize", "BLOCK_SCALED_FORMATS"]
