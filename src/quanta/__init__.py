"""quanta: quantization for PyTorch — simulate, store, run and export.

One numerics core under three familiar APIs: AIMET's quantizers and quantized
tensors (``import quanta.quantization as Q``), torchao's primitives, real
quantized storage and ``quantize_`` (``quanta.quantization.quant_primitives``,
``quanta.dtypes``, ``quanta.quantization.quantize_``) and TensorRT's
``pytorch_quantization.tensor_quant`` (``quanta.tensor_quant``); see the documentation site built from ``docs/``.
"""

from quanta.encodings.affine import AffineEncoding
from quanta.grids.affine import IntegerGrid
from quanta.tensors.quantized import DequantizedTensor, QuantizedTensor, QuantizedTensorBase

#: The installed quanta version (PEP 440).
__version__ = "0.1.0"

__all__ = [
    "__version__",
    "AffineEncoding",
    "IntegerGrid",
    "QuantizedTensorBase",
    "QuantizedTensor",
    "DequantizedTensor",
    "load_pretrained",
]


def __getattr__(name: str):
    # quanta.load_pretrained(dir): the checkpoints quanta.quantization.quantize_pretrained writes (needs transformers,
    # so it loads on first use)
    if name == "load_pretrained":
        from quanta.quantization.pretrained import load_pretrained

        return load_pretrained
    raise AttributeError(f"module 'quanta' has no attribute {name!r}")
