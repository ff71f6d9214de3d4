"""quanta: quantization for PyTorch — simulate, store, run and export.

One numerics core under three familiar APIs. This release provides the
AIMET-style API (``import quanta.quantization as Q``); see README.md.
"""

from quanta.encodings.affine import AffineEncoding
from quanta.grids.affine import IntegerGrid
from quanta.tensors.quantized import DequantizedTensor, QuantizedTensor, QuantizedTensorBase

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "AffineEncoding",
    "IntegerGrid",
    "QuantizedTensorBase",
    "QuantizedTensor",
    "DequantizedTensor",
]
