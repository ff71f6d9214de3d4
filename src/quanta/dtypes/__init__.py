"""Real quantized storage, torchao's ``torchao.dtypes`` API: ``AffineQuantizedTensor`` and its layouts, and the
block-scaled ``MXTensor`` / ``NVFP4Tensor`` of ``torchao.prototype.mx_formats``.

>>> import torch
>>> from quanta.dtypes import AffineQuantizedTensor, UintxLayout
>>> from quanta.quantization.quant_primitives import MappingType
>>> w = torch.randn(64, 128)
>>> q = AffineQuantizedTensor.from_hp_to_intx(w, MappingType.SYMMETRIC, (1, 32), torch.int4,
...                                           _layout=UintxLayout(torch.int4))
>>> q.storage_nbytes  # 4096 bytes of codes (half a byte each) + 256 float32 scales + 256 int32 zero points
6144

Importing this module registers the classes with ``torch.serialization``, so
``torch.load(..., weights_only=True)`` can rebuild quantized state dicts.
"""

import torch

from quanta.dtypes import ops  # noqa: F401  (fills AffineQuantizedTensor's operations table)
from quanta.dtypes.affine_quantized_tensor import (
    AffineQuantizedTensor,
    to_affine_quantized_floatx,
    to_affine_quantized_floatx_static,
    to_affine_quantized_fpx,
    to_affine_quantized_intx,
    to_affine_quantized_intx_static,
)
from quanta.dtypes.layouts import (
    Float8Layout,
    FloatxTensorCoreLayout,
    Int4CPULayout,
    Layout,
    PlainLayout,
    UintxLayout,
)
from quanta.dtypes.activation_scale import WeightTensorWithLinearActivationScaleMetadata
from quanta.dtypes.block_scaled import BlockScaledTensor, KernelPreference
from quanta.dtypes.mx_tensor import MXTensor, QuantizeTensorToMXKwargs, ScaleCalculationMode
from quanta.dtypes.nvfp4_tensor import NVFP4Tensor, QuantizeTensorToNVFP4Kwargs, per_tensor_amax_to_scale
from quanta.dtypes.linear_activation import LinearActivationQuantizedTensor
from quanta.dtypes.serialization import load_quantized, save_quantized
from quanta.dtypes.tensor_impl import (
    AQTTensorImpl,
    Float8AQTTensorImpl,
    FloatxAQTTensorImpl,
    Int4CPUAQTTensorImpl,
    PlainAQTTensorImpl,
    UintxAQTTensorImpl,
)
from quanta.encodings.torchao import MappingType, ZeroPointDomain

__all__ = [
    "AffineQuantizedTensor",
    "LinearActivationQuantizedTensor",
    "WeightTensorWithLinearActivationScaleMetadata",
    "MXTensor",
    "NVFP4Tensor",
    "BlockScaledTensor",
    "ScaleCalculationMode",
    "KernelPreference",
    "QuantizeTensorToMXKwargs",
    "QuantizeTensorToNVFP4Kwargs",
    "per_tensor_amax_to_scale",
    "save_quantized",
    "load_quantized",
    "to_affine_quantized_intx",
    "to_affine_quantized_intx_static",
    "to_affine_quantized_floatx",
    "to_affine_quantized_floatx_static",
    "to_affine_quantized_fpx",
    "Layout",
    "PlainLayout",
    "UintxLayout",
    "Float8Layout",
    "FloatxTensorCoreLayout",
    "Int4CPULayout",
    "AQTTensorImpl",
    "PlainAQTTensorImpl",
    "UintxAQTTensorImpl",
    "Float8AQTTensorImpl",
    "FloatxAQTTensorImpl",
    "Int4CPUAQTTensorImpl",
]

# weights_only=True loading may rebuild only allow-listed classes: these are plain data holders
torch.serialization.add_safe_globals([
    AffineQuantizedTensor, LinearActivationQuantizedTensor, WeightTensorWithLinearActivationScaleMetadata, PlainLayout, UintxLayout, Float8Layout, FloatxTensorCoreLayout, Int4CPULayout,
    PlainAQTTensorImpl, UintxAQTTensorImpl, Float8AQTTensorImpl, FloatxAQTTensorImpl, Int4CPUAQTTensorImpl,
    ZeroPointDomain, MappingType, MXTensor, NVFP4Tensor, QuantizeTensorToMXKwargs, QuantizeTensorToNVFP4Kwargs,
    ScaleCalculationMode, KernelPreference,
])
