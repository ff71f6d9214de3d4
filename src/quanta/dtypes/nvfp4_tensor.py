"""``NVFP4Tensor``: NVIDIA's FP4 storage, torchao's ``torchao.prototype.mx_formats.NVFP4Tensor`` on the CPU.

fp4 e2m1 elements, two per ``uint8`` (element ``2i`` in the low nibble), one
fp8 e4m3 scale per 16 elements, and an optional float32 scale for the whole
tensor: ``value = per_tensor_scale * scale * P`` (formulas in
:mod:`quanta.kernels.block_scaled`; torchao 0.18's results bit for bit).
``per_tensor_amax_to_scale(amax) = amax / (448 * 6)`` lets the block scales use
the whole e4m3 range.

``F.linear(x, w)``:

* weight-only (``act_quant_kwargs`` None): ``addmm(bias, x, dequantize(w).T)`` in
  the weight's original dtype, the weight dequantized a tile of rows at a time
  (torchao's numerics, bit for bit);
* with ``act_quant_kwargs``: ``x`` is quantized to NVFP4 too (its per-tensor
  scale from its own amax, or ``act_per_tensor_scale`` calibrated by
  ``NVFP4DynamicActivationNVFP4WeightConfig``'s two steps) and the product is
  computed as NVIDIA's fp4 GEMM defines it: ``(P_x s_x) (P_w s_w)^T`` accumulated in
  float32, cast to the original dtype, times ``s_t(x) * s_t(w)``, plus the bias.
  torchao runs this only through ``torch._scaled_mm`` on Blackwell GPUs; quanta's
  emulation follows its operation order but was not compared with it bit for bit.

>>> import torch
>>> w = torch.randn(32, 64)
>>> t = NVFP4Tensor.to_nvfp4(w, per_tensor_scale=per_tensor_amax_to_scale(w.abs().max()))
>>> t.qdata.shape, t.scale.shape, t.storage_nbytes * 8 / w.numel()   # 4.5 bits per element (+ 4 bytes)
(torch.Size([32, 32]), torch.Size([32, 4]), 4.515625)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from quanta.dtypes.block_scaled import BlockScaledTensor, tiled_linear
from quanta.grids.block_scaled import NVFP4
from quanta.kernels import block_scaled as kernels
from quanta.kernels.block_scaled import per_tensor_amax_to_scale

__all__ = ["NVFP4Tensor", "QuantizeTensorToNVFP4Kwargs", "per_tensor_amax_to_scale"]


@dataclass
class QuantizeTensorToNVFP4Kwargs:
    """How an ``NVFP4Tensor`` weight quantizes the activations it multiplies (torchao's dataclass)."""

    block_size: int = 16
    is_swizzled_scales: bool = False
    use_triton_kernel: bool = False
    use_dynamic_per_tensor_scale: bool = False

    def __post_init__(self) -> None:
        _check_block_size(self.block_size)
        _no_swizzle(self.is_swizzled_scales)


def _check_block_size(block_size: object) -> None:
    if block_size != 16 or isinstance(block_size, bool):
        raise ValueError(f"NVFP4 uses blocks of 16 elements, got block_size={block_size!r}")


def _no_swizzle(is_swizzled_scales: object) -> None:
    if is_swizzled_scales:
        raise ValueError("is_swizzled_scales=True is the cuBLAS tile layout of the scales for GPU kernels; quanta "
                         "stores scales row-major (is_swizzled_scales=False)")


def _check_scalar(name: str, s: Optional[torch.Tensor]) -> None:
    if s is None:
        return
    if not isinstance(s, torch.Tensor) or s.dim() != 0 or s.dtype != torch.float32:
        raise ValueError(f"{name} must be a 0-d float32 tensor or None, got {s!r:.80}")


class NVFP4Tensor(BlockScaledTensor):
    """An NVFP4-quantized tensor (torchao's constructor and ``to_nvfp4``).

    Args:
        qdata: packed fp4 codes, ``uint8`` of shape ``(*shape[:-1], K // 2)``.
        scale: ``torch.float8_e4m3fn`` block scales, shape ``(*shape[:-1], K // 16)``.
        block_size: 16.
        orig_dtype: the dtype of the tensor it stands for (float32, bfloat16 or float16).
        per_tensor_scale: 0-d float32 scale of the whole tensor, or None.
        act_per_tensor_scale: 0-d float32 per-tensor scale of the activations (static), or None.
        is_swizzled_scales: must be False.
        use_triton_kernel: accepted for torchao compatibility (no effect on the CPU).
        act_quant_kwargs: :class:`QuantizeTensorToNVFP4Kwargs` for the activations of ``F.linear``, or None
            (weight-only).
    """

    tensor_data_names = ("qdata", "scale")
    optional_tensor_data_names = ("per_tensor_scale", "act_per_tensor_scale")
    tensor_attribute_names = ("block_size", "orig_dtype", "is_swizzled_scales", "use_triton_kernel",
                              "act_quant_kwargs")

    @staticmethod
    def __new__(cls, qdata: torch.Tensor, scale: torch.Tensor, block_size: int, orig_dtype: torch.dtype,
                per_tensor_scale: Optional[torch.Tensor] = None, act_per_tensor_scale: Optional[torch.Tensor] = None,
                is_swizzled_scales: bool = False, use_triton_kernel: bool = False,
                act_quant_kwargs: Optional[QuantizeTensorToNVFP4Kwargs] = None):
        _check_block_size(block_size)
        _no_swizzle(is_swizzled_scales)
        if orig_dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"orig_dtype must be float32, bfloat16 or float16, got {orig_dtype}")
        if not isinstance(qdata, torch.Tensor) or qdata.dtype != torch.uint8 or qdata.dim() == 0:
            raise ValueError(f"qdata must be a uint8 tensor of packed fp4 codes, got "
                             f"{getattr(qdata, 'dtype', type(qdata).__name__)}")
        shape = (*qdata.shape[:-1], qdata.shape[-1] * 2)
        if shape[-1] % block_size:
            raise ValueError(f"the last dimension ({shape[-1]}) must be a multiple of block_size={block_size}")
        want = (*shape[:-1], shape[-1] // block_size)
        if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float8_e4m3fn or tuple(scale.shape) != want:
            raise ValueError(f"scale must be a float8_e4m3fn tensor of shape {want}, got "
                             f"{(tuple(scale.shape), scale.dtype) if isinstance(scale, torch.Tensor) else scale!r}")
        _check_scalar("per_tensor_scale", per_tensor_scale)
        _check_scalar("act_per_tensor_scale", act_per_tensor_scale)
        if act_quant_kwargs is not None and not isinstance(act_quant_kwargs, QuantizeTensorToNVFP4Kwargs):
            raise TypeError(f"act_quant_kwargs must be a QuantizeTensorToNVFP4Kwargs or None, got "
                            f"{act_quant_kwargs!r}")
        self = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=orig_dtype, device=qdata.device,
                                                   requires_grad=False)
        self.qdata, self.scale, self.block_size, self.orig_dtype = qdata, scale, block_size, orig_dtype
        self.per_tensor_scale, self.act_per_tensor_scale = per_tensor_scale, act_per_tensor_scale
        self.is_swizzled_scales, self.use_triton_kernel = False, bool(use_triton_kernel)
        self.act_quant_kwargs = act_quant_kwargs
        return self

    def __init__(self, *args, **kwargs) -> None:  # everything is set in __new__
        pass

    @staticmethod
    def to_nvfp4(data_hp: torch.Tensor, block_size: int = 16, per_tensor_scale: Optional[torch.Tensor] = None,
                 act_per_tensor_scale: Optional[torch.Tensor] = None, is_swizzled_scales: bool = False,
                 use_triton_kernel: bool = False,
                 act_quant_kwargs: Optional[QuantizeTensorToNVFP4Kwargs] = None) -> "NVFP4Tensor":
        """Quantize ``data_hp`` (float32, bfloat16 or float16; last dimension a multiple of 16).

        >>> t = NVFP4Tensor.to_nvfp4(torch.tensor([[0.3, -1.2, 6.0, 2.9] * 4]))
        >>> t.dequantize()[0, :4].tolist(), t.scale.float().tolist()
        ([0.5, -1.0, 6.0, 3.0], [[1.0]])
        """
        _check_block_size(block_size)
        _no_swizzle(is_swizzled_scales)
        kernels.check_blocks(data_hp, block_size, "data_hp")
        if per_tensor_scale is not None:
            per_tensor_scale = per_tensor_scale.detach().to(torch.float32).reshape(())
        p, sb = kernels.nvfp4_quantize(data_hp.detach(), per_tensor_scale, block_size)
        return NVFP4Tensor(kernels.encode_elements(p, NVFP4), sb.to(torch.float8_e4m3fn), block_size,
                           data_hp.dtype, per_tensor_scale,
                           None if act_per_tensor_scale is None else act_per_tensor_scale.detach().to(
                               torch.float32).reshape(()),
                           False, use_triton_kernel, act_quant_kwargs)

    def __repr__(self) -> str:
        return (f"NVFP4Tensor(shape={tuple(self.shape)}, orig_dtype={self.orig_dtype}, "
                f"per_tensor_scale={None if self.per_tensor_scale is None else float(self.per_tensor_scale)}, "
                f"act_quant_kwargs={self.act_quant_kwargs})")

    def get_hp_scales(self) -> torch.Tensor:
        """The float32 scale of each block: ``per_tensor_scale * scale`` (``scale`` alone without one)."""
        return kernels.nvfp4_block_scales_hp(self.scale, self.per_tensor_scale)

    def _rows(self, r0: int, r1: int, with_tensor_scale: bool, dtype: torch.dtype) -> torch.Tensor:
        p = kernels.decode_elements(self.qdata[r0:r1], NVFP4)
        return kernels.nvfp4_dequantize(p, self.scale[r0:r1], self.per_tensor_scale if with_tensor_scale else None,
                                        dtype)

    def dequantize(self, output_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """``P * (per_tensor_scale * scale)`` computed in float32, in ``output_dtype`` (default ``orig_dtype``)."""
        p = kernels.decode_elements(self.qdata, NVFP4)
        return kernels.nvfp4_dequantize(p, self.scale, self.per_tensor_scale, output_dtype or self.orig_dtype)

    def _linear(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        if self.dim() != 2:
            raise ValueError(f"F.linear needs a 2-D NVFP4Tensor weight, got shape {tuple(self.shape)}")
        dtype, n = self.orig_dtype, self.shape[0]
        x2 = x.reshape(-1, x.shape[-1]).to(dtype)
        b = None if bias is None else bias.to(dtype)
        k = self.act_quant_kwargs
        if k is None:
            out = tiled_linear(x2, lambda r0, r1: self._rows(r0, r1, True, dtype), n, b)
            return out.reshape(*x.shape[:-1], n)
        kernels.check_blocks(x2, k.block_size, "the input")
        if k.use_dynamic_per_tensor_scale:
            x_scale = per_tensor_amax_to_scale(torch.max(torch.abs(x2.detach())))
        else:
            x_scale = self.act_per_tensor_scale
        xq = kernels.nvfp4_block_dequantized(x2, x_scale, k.block_size)
        out = tiled_linear(xq, lambda r0, r1: self._rows(r0, r1, False, torch.float32), n, None).to(dtype)
        scales = [s for s in (x_scale, self.per_tensor_scale) if s is not None]
        if scales:
            out = out * (scales[0] * scales[1] if len(scales) == 2 else scales[0]).to(dtype)
        if b is not None:
            out = out + b
        return out.reshape(*x.shape[:-1], n)

    def _with(self, **changes) -> "NVFP4Tensor":
        a = {n: getattr(self, n) for n in (*self.tensor_data_names, *self.optional_tensor_data_names,
                                           *self.tensor_attribute_names)}
        a.update(changes)
        return NVFP4Tensor(a["qdata"], a["scale"], a["block_size"], a["orig_dtype"], a["per_tensor_scale"],
                           a["act_per_tensor_scale"], a["is_swizzled_scales"], a["use_triton_kernel"],
                           a["act_quant_kwargs"])

    @classmethod
    def _rebuild(cls, inner: dict, meta: list) -> "NVFP4Tensor":
        block_size, orig_dtype, swizzled, triton, act = meta
        return NVFP4Tensor(inner["qdata"], inner["scale"], block_size, orig_dtype, inner.get("per_tensor_scale"),
                           inner.get("act_per_tensor_scale"), swizzled, triton, act)
