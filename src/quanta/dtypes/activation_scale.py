"""``WeightTensorWithLinearActivationScaleMetadata``: a quantized weight whose linear layers scale their input first.

SmoothQuant and AWQ move range between a Linear layer's input channels and its
weight columns: ``x W^T = (x / s) (W diag(s))^T``. Where ``1 / s`` can be folded
into the op before the layer (a LayerNorm, an RMSNorm, a Linear), quanta folds it;
where it cannot, the layer's weight carries ``s`` and every ``F.linear`` divides its
input by it before the quantized weight sees it (torchao's class of the same name)::

    F.linear(x, w, b) = F.linear(x / scale, w.original_weight_tensor, b)
    w.dequantize()    = w.original_weight_tensor.dequantize() / scale      (the weight the layer applies)

``original_weight_tensor`` is any quanta quantized weight (an
:class:`~quanta.dtypes.AffineQuantizedTensor`, or a
:class:`~quanta.dtypes.LinearActivationQuantizedTensor`, which then quantizes
``x / scale`` per token). Other uses of the tensor act on ``dequantize()`` (a float copy, after a warning
once per operation; in-place changes raise ``TypeError``).

>>> import torch
>>> from quanta.dtypes import AffineQuantizedTensor
>>> from quanta.quantization.quant_primitives import MappingType
>>> w = torch.tensor([[1.0, 8.0], [-2.0, 4.0]])
>>> s = torch.tensor([1.0, 4.0])
>>> q = AffineQuantizedTensor.from_hp_to_intx(w * s, MappingType.SYMMETRIC, (1, 2), torch.int8)
>>> ws = WeightTensorWithLinearActivationScaleMetadata(q, s)
>>> x = torch.tensor([[1.0, 1.0]])
>>> torch.nn.functional.linear(x, ws), ws.dequantize()
(tensor([[9.0073, 1.9841]]), tensor([[ 1.0039,  7.9686],
        [-2.0078,  3.9843]]))
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from quanta.dtypes.affine_quantized_tensor import AffineQuantizedTensor
from quanta.dtypes.compile_cache import stable_hash_for_caching
from quanta.dtypes.dequantized_fallback import run_on_dequantized
from quanta.dtypes.linear_activation import LinearActivationQuantizedTensor

__all__ = ["WeightTensorWithLinearActivationScaleMetadata"]

aten = torch.ops.aten
_LINEAR = {F.linear, torch._C._nn.linear}


class WeightTensorWithLinearActivationScaleMetadata(torch.Tensor):
    """A 2-D quantized weight ``[N, K]`` plus ``scale`` ``[K]``: ``F.linear`` computes ``F.linear(x / scale, weight)``.

    Args:
        original_weight_tensor: the quantized weight of ``W diag(scale)``.
        scale: positive, finite, one per input channel (float32, float16 or bfloat16).
    """

    @staticmethod
    def __new__(cls, original_weight_tensor: torch.Tensor, scale: torch.Tensor):
        if not isinstance(original_weight_tensor, (AffineQuantizedTensor, LinearActivationQuantizedTensor)):
            raise TypeError("original_weight_tensor must be an AffineQuantizedTensor or a "
                            f"LinearActivationQuantizedTensor, got {type(original_weight_tensor).__name__}")
        if original_weight_tensor.dim() != 2:
            raise ValueError(f"original_weight_tensor must be 2-D, got shape {tuple(original_weight_tensor.shape)}")
        k = original_weight_tensor.shape[1]
        if not isinstance(scale, torch.Tensor) or scale.dim() != 1 or scale.shape[0] != k \
                or scale.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ValueError(f"scale must be a float32/float16/bfloat16 tensor of shape ({k},), got "
                             f"{scale if not isinstance(scale, torch.Tensor) else (tuple(scale.shape), scale.dtype)}")
        if not bool(torch.isfinite(scale).all()) or not bool((scale > 0).all()):
            raise ValueError("scale must be positive and finite")
        w = original_weight_tensor
        return torch.Tensor._make_wrapper_subclass(cls, w.shape, dtype=w.dtype, device=w.device, requires_grad=False)

    def __init__(self, original_weight_tensor: torch.Tensor, scale: torch.Tensor) -> None:
        self.original_weight_tensor = original_weight_tensor
        self.scale = scale

    @classmethod
    def _make(cls, weight: torch.Tensor, scale: torch.Tensor) -> "WeightTensorWithLinearActivationScaleMetadata":
        """Rebuild from checked parts without re-validating (traced values cannot be read)."""
        out = torch.Tensor._make_wrapper_subclass(cls, weight.shape, dtype=weight.dtype, device=weight.device,
                                                  requires_grad=False)
        out.original_weight_tensor, out.scale = weight, scale
        return out

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(original_weight_tensor={self.original_weight_tensor!r}, "
                f"scale={tuple(self.scale.shape)}:{self.scale.dtype})")

    def dequantize(self, output_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The weight the layer applies: ``original_weight_tensor.dequantize() / scale``."""
        w = self.original_weight_tensor.dequantize(output_dtype)
        return w / self.scale.to(w.dtype)

    @property
    def storage_nbytes(self) -> int:
        return self.original_weight_tensor.storage_nbytes + self.scale.numel() * self.scale.element_size()

    def _stable_hash_for_caching(self) -> str:
        """The key of this tensor in torch.compile's caches (:mod:`quanta.dtypes.compile_cache`)."""
        return stable_hash_for_caching(self)

    def __tensor_flatten__(self):
        return ["original_weight_tensor", "scale"], None

    @classmethod
    def __tensor_unflatten__(cls, inner, meta, outer_size, outer_stride):
        return cls._make(inner["original_weight_tensor"], inner["scale"])

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _LINEAR:
            x, w, bias = (*args, kwargs.get("bias"))[:3] if len(args) < 3 else args[:3]
            if isinstance(w, cls) and not isinstance(x, cls) and not isinstance(bias, cls):
                return F.linear(x / w.scale.to(x.dtype), w.original_weight_tensor, bias)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        w = args[0] if args else None
        if isinstance(w, cls) and func in (aten.detach.default, aten.clone.default, aten.alias.default,
                                           aten._to_copy.default):
            dtype_change = func is aten._to_copy.default and kwargs.get("dtype") not in (None, w.dtype)
            if not dtype_change:
                inner = func(w.original_weight_tensor, *args[1:], **kwargs)
                scale_kwargs = {k: v for k, v in kwargs.items() if k in ("device", "copy")}
                scale = func(w.scale, *args[1:], **scale_kwargs)
                return cls._make(inner, scale)

        return run_on_dequantized(func, args, kwargs, lambda a: isinstance(a, cls), cls.__name__)
