"""quanta's AIMET-compatible quantization API (``import quanta.quantization as Q``), plus torchao's
``quantize_`` with its configs and granularities (``from quanta.quantization import quantize_``).

>>> import torch
>>> import quanta.quantization as Q
>>> q = Q.affine.QuantizeDequantize(shape=(), bitwidth=8, symmetric=True)
>>> with q.compute_encodings():
...     _ = q(torch.tensor([-1.0, 0.5, 1.0]))
>>> q(torch.tensor([0.3]))
DequantizedTensor([0.2992], grad_fn=<AliasBackward0>)
"""

from quanta.quantization import affine, encoding_analyzer
from quanta.quantization import float  # noqa: A004  (AIMET's module name)
from quanta.quantization.base import QuantizerBase
from quanta.quantization.granularity import PerAxis, PerBlock, PerGroup, PerRow, PerTensor
from quanta.quantization.float import FloatQuantizeDequantize
from quanta.tensors.quantized import DequantizedTensor, QuantizedTensor, QuantizedTensorBase

__all__ = [
    "affine",
    "float",
    "encoding_analyzer",
    "QuantizerBase",
    "FloatQuantizeDequantize",
    "QuantizedTensorBase",
    "QuantizedTensor",
    "DequantizedTensor",
    "quantize_",
    "QuantizeReport",
    "AOBaseConfig",
    "Int8WeightOnlyConfig",
    "Int4WeightOnlyConfig",
    "Int8DynamicActivationInt8WeightConfig",
    "Float8WeightOnlyConfig",
    "IntxWeightOnlyConfig",
    "FPXWeightOnlyConfig",
    "ModuleFqnToConfig",
    "MXDynamicActivationMXWeightConfig",
    "NVFP4WeightOnlyConfig",
    "NVFP4DynamicActivationNVFP4WeightConfig",
    "GPTQConfig",
    "AWQConfig",
    "SmoothQuantConfig",
    "quantize_sequential",
    "quantize_pretrained",
    "load_pretrained",
    "PerTensor",
    "PerAxis",
    "PerRow",
    "PerGroup",
    "PerBlock",
]

# quantize_ and its configs build quanta.dtypes tensors, and quanta.dtypes uses this package's
# quant_primitives: load them on first use so that either package can be imported first.
_QUANT_API = {"quantize_", "QuantizeReport", "AOBaseConfig", "Int8WeightOnlyConfig", "Int4WeightOnlyConfig",
              "Int8DynamicActivationInt8WeightConfig", "Float8WeightOnlyConfig", "IntxWeightOnlyConfig",
              "FPXWeightOnlyConfig", "ModuleFqnToConfig", "CalibrationConfig"}
_CALIBRATED = {"GPTQConfig": "gptq", "AWQConfig": "awq", "SmoothQuantConfig": "smoothquant",
               "quantize_sequential": "sequential", "quantize_pretrained": "pretrained",
               "load_pretrained": "pretrained", "MXDynamicActivationMXWeightConfig": "mx_formats",
               "NVFP4WeightOnlyConfig": "mx_formats", "NVFP4DynamicActivationNVFP4WeightConfig": "mx_formats"}


def __getattr__(name: str):
    if name in _QUANT_API:
        from quanta.quantization import quant_api

        return getattr(quant_api, name)
    if name in _CALIBRATED:
        import importlib

        return getattr(importlib.import_module(f"quanta.quantization.{_CALIBRATED[name]}"), name)
    raise AttributeError(f"module 'quanta.quantization' has no attribute {name!r}")
