"""``MXTensor``: OCP Microscaling (MX) storage, torchao's ``torchao.prototype.mx_formats.MXTensor`` on the CPU.

Every ``block_size`` (default 32) consecutive elements of the last dimension
share one E8M0 scale ``2**(e - 127)`` (``scale``: ``torch.float8_e8m0fnu``, code
255 is NaN); the elements (``qdata``) are fp8 e4m3 / e5m2 (``torch.float8_*``),
fp6 e2m3 / e3m2 (one 6-bit code per ``uint8``), fp4 e2m1 (two codes per
``uint8``, element ``2i`` in the low nibble) or, beyond torchao, int8 (MXINT8,
``k / 64``). ``MXTensor.to_mx`` quantizes with one of the
:class:`ScaleCalculationMode` rules (formulas in :mod:`quanta.kernels.block_scaled`);
the results equal torchao 0.18's bit for bit.

``F.linear(x, w)`` with an ``MXTensor`` weight quantizes ``x`` to MX as
``act_quant_kwargs`` says (torchao: activations and weights always both MX),
then computes ``addmm(bias, dequantize(x), dequantize(w).T)`` in the weight's
original dtype, dequantizing the weight a tile of rows at a time (torchao's
``KernelPreference.EMULATED`` numerics, bit for bit); without ``act_quant_kwargs``
the input stays in float (weight-only, which torchao refuses).

>>> import torch
>>> w = torch.randn(64, 128)
>>> m = MXTensor.to_mx(w, torch.float4_e2m1fn_x2)
>>> m.qdata.shape, m.scale.shape, m.storage_nbytes * 8 / w.numel()    # 4.25 bits per element
(torch.Size([64, 64]), torch.Size([64, 4]), 4.25)
>>> bool((m.dequantize() - w).abs().max() <= w.abs().max() / 2)
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from quanta.dtypes.block_scaled import BlockScaledTensor, KernelPreference, tiled_linear
from quanta.grids.block_scaled import MX_FORMATS, BlockScaledFormat, ScaleCalculationMode, mx_format
from quanta.kernels import block_scaled as kernels

__all__ = ["MXTensor", "QuantizeTensorToMXKwargs", "ScaleCalculationMode"]


@dataclass
class QuantizeTensorToMXKwargs:
    """How an ``MXTensor`` weight quantizes the activations it multiplies (torchao's dataclass)."""

    elem_dtype: Union[torch.dtype, str] = torch.float8_e4m3fn
    block_size: int = 32
    scaling_mode: ScaleCalculationMode = ScaleCalculationMode.FLOOR
    kernel_preference: KernelPreference = KernelPreference.EMULATED
    is_swizzled_scales: bool = False

    def __post_init__(self) -> None:
        mx_format(self.elem_dtype, self.block_size)
        _check_mode(self.scaling_mode)
        _no_swizzle(self.is_swizzled_scales)


def _check_mode(mode: object) -> None:
    if not isinstance(mode, ScaleCalculationMode):
        raise TypeError(f"scaling_mode must be a ScaleCalculationMode (FLOOR, RCEIL, CEIL, EVEN), got {mode!r}")


def _no_swizzle(is_swizzled_scales: object) -> None:
    if is_swizzled_scales:
        raise ValueError("is_swizzled_scales=True is the cuBLAS tile layout of the scales for GPU kernels; quanta "
                         "stores scales row-major (is_swizzled_scales=False)")


class MXTensor(BlockScaledTensor):
    """An MX-quantized tensor (torchao's constructor and ``to_mx``).

    Args:
        qdata: the elements' storage (see the module docstring).
        scale: E8M0 scales, ``torch.float8_e8m0fnu`` (or ``uint8`` codes), shape ``(*shape[:-1], K // block_size)``.
        elem_dtype: ``torch.float8_e4m3fn``, ``torch.float8_e5m2``, ``"fp6_e2m3"``, ``"fp6_e3m2"``,
            ``torch.float4_e2m1fn_x2`` or ``torch.int8``.
        block_size: elements per scale.
        orig_dtype: the dtype of the tensor it stands for (float32, bfloat16 or float16).
        kernel_preference: accepted for torchao compatibility (:class:`KernelPreference`).
        act_quant_kwargs: :class:`QuantizeTensorToMXKwargs` for the activations of ``F.linear``, or None.
        is_swizzled_scales: must be False.
    """

    tensor_data_names = ("qdata", "scale")
    tensor_attribute_names = ("elem_dtype", "block_size", "orig_dtype", "kernel_preference", "act_quant_kwargs",
                              "is_swizzled_scales")

    @staticmethod
    def __new__(cls, qdata: torch.Tensor, scale: torch.Tensor, elem_dtype: Union[torch.dtype, str],
                block_size: int, orig_dtype: torch.dtype, kernel_preference: Optional[KernelPreference] = None,
                act_quant_kwargs: Optional[QuantizeTensorToMXKwargs] = None, is_swizzled_scales: bool = False):
        fmt = mx_format(elem_dtype, block_size)
        _no_swizzle(is_swizzled_scales)
        if orig_dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"orig_dtype must be float32, bfloat16 or float16, got {orig_dtype}")
        want = kernels.element_storage_dtype(fmt)
        if not isinstance(qdata, torch.Tensor) or qdata.dtype != want or qdata.dim() == 0:
            raise ValueError(f"qdata for elem_dtype {elem_dtype} must be a {want} tensor, got "
                             f"{getattr(qdata, 'dtype', type(qdata).__name__)}")
        shape = (*qdata.shape[:-1], qdata.shape[-1] * 2) if fmt.element_bits == 4 else tuple(qdata.shape)
        if shape[-1] % block_size:
            raise ValueError(f"the last dimension ({shape[-1]}) must be a multiple of block_size={block_size}")
        want_scale = (*shape[:-1], shape[-1] // block_size)
        if not isinstance(scale, torch.Tensor) or scale.dtype not in (torch.float8_e8m0fnu, torch.uint8) \
                or tuple(scale.shape) != want_scale:
            raise ValueError(f"scale must be a float8_e8m0fnu tensor of shape {want_scale}, got "
                             f"{(tuple(scale.shape), scale.dtype) if isinstance(scale, torch.Tensor) else scale!r}")
        if act_quant_kwargs is not None and not isinstance(act_quant_kwargs, QuantizeTensorToMXKwargs):
            raise TypeError(f"act_quant_kwargs must be a QuantizeTensorToMXKwargs or None, got {act_quant_kwargs!r}")
        self = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=orig_dtype, device=qdata.device,
                                                   requires_grad=False)
        self.qdata = qdata
        self.scale = scale if scale.dtype == torch.float8_e8m0fnu else scale.view(torch.float8_e8m0fnu)
        self.elem_dtype = elem_dtype
        self.block_size = block_size
        self.orig_dtype = orig_dtype
        self.kernel_preference = kernel_preference
        self.act_quant_kwargs = act_quant_kwargs
        self.is_swizzled_scales = False
        return self

    def __init__(self, *args, **kwargs) -> None:  # everything is set in __new__
        pass

    @staticmethod
    def to_mx(data_hp: torch.Tensor, elem_dtype: Union[torch.dtype, str], block_size: int = 32,
              scaling_mode: ScaleCalculationMode = ScaleCalculationMode.FLOOR,
              kernel_preference: KernelPreference = KernelPreference.EMULATED,
              act_quant_kwargs: Optional[QuantizeTensorToMXKwargs] = None, is_swizzled_scales: bool = False,
              mxfp8_dim0_cast_kernel_choice: object = None) -> "MXTensor":
        """Quantize ``data_hp`` (float32, bfloat16 or float16; last dimension a multiple of ``block_size``).

        >>> m = MXTensor.to_mx(torch.tensor([[0.1, -0.7, 3.0, 5.9]]), torch.float4_e2m1fn_x2, 4)
        >>> m.dequantize().tolist(), m.scale.view(torch.uint8).tolist()
        ([[0.0, -0.5, 3.0, 6.0]], [[127]])
        """
        fmt = mx_format(elem_dtype, block_size)
        _check_mode(scaling_mode)
        _no_swizzle(is_swizzled_scales)
        kernels.check_blocks(data_hp, block_size, "data_hp")
        p, code = kernels.mx_quantize(data_hp.detach(), fmt, scaling_mode)
        return MXTensor(kernels.encode_elements(p, fmt), code.view(torch.float8_e8m0fnu), elem_dtype, block_size,
                        data_hp.dtype, kernel_preference, act_quant_kwargs)

    @staticmethod
    def from_qdata_and_scales(qdata: torch.Tensor, scales: torch.Tensor, orig_dtype: torch.dtype, *,
                              block_size: int = 32, kernel_preference: Optional[KernelPreference] = None,
                              act_quant_kwargs: Optional[QuantizeTensorToMXKwargs] = None,
                              is_swizzled_scales: bool = False) -> "MXTensor":
        """An MXFP8 tensor from typed ``qdata`` (``torch.float8_e4m3fn`` / ``float8_e5m2``) and its scales."""
        if qdata.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2):
            raise ValueError("from_qdata_and_scales takes float8 qdata; build packed uint8 payloads with "
                             f"MXTensor(...), got {qdata.dtype}")
        return MXTensor(qdata, scales, qdata.dtype, block_size, orig_dtype, kernel_preference, act_quant_kwargs,
                        is_swizzled_scales)

    @property
    def format(self) -> BlockScaledFormat:
        """The :class:`~quanta.grids.block_scaled.BlockScaledFormat`."""
        return mx_format(self.elem_dtype, self.block_size)

    def __repr__(self) -> str:
        return (f"MXTensor(elem_dtype={self.elem_dtype}, block_size={self.block_size}, shape={tuple(self.shape)}, "
                f"orig_dtype={self.orig_dtype}, act_quant_kwargs={self.act_quant_kwargs})")

    def _dequantize_rows(self, rows: slice, dtype: torch.dtype) -> torch.Tensor:
        q, s = (self.qdata[rows], self.scale[rows]) if self.dim() > 1 else (self.qdata, self.scale)
        cdt = torch.float32 if dtype == torch.float16 else dtype  # element values are exact in cdt
        return kernels.mx_dequantize(kernels.decode_elements(q, self.format, cdt), s, self.format, dtype)

    def dequantize(self, output_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """``P * 2**(e - 127)`` in ``output_dtype`` (default: ``orig_dtype``)."""
        return self._dequantize_rows(slice(None), output_dtype or self.orig_dtype)

    def _linear(self, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
        if self.dim() != 2:
            raise ValueError(f"F.linear needs a 2-D MXTensor weight, got shape {tuple(self.shape)}")
        if torch.compiler.is_compiling():  # one opaque op: inductor has no CPU code for float8_e8m0fnu scales
            k = self.act_quant_kwargs
            return torch.ops.quanta.mx_linear(
                x, self.qdata, self.scale.view(torch.uint8), self.format.name, self.block_size, self.orig_dtype,
                None if k is None else mx_format(k.elem_dtype, k.block_size).name,
                0 if k is None else k.block_size, "" if k is None else k.scaling_mode.value, bias)
        return _mx_linear_eager(self, x, bias)

    def _with(self, **changes) -> "MXTensor":
        a = {n: getattr(self, n) for n in (*self.tensor_data_names, *self.tensor_attribute_names)}
        a.update(changes)
        return MXTensor(a["qdata"], a["scale"], a["elem_dtype"], a["block_size"], a["orig_dtype"],
                        a["kernel_preference"], a["act_quant_kwargs"], a["is_swizzled_scales"])

    @classmethod
    def _rebuild(cls, inner: dict, meta: list) -> "MXTensor":
        return MXTensor(inner["qdata"], inner["scale"], *meta)


def _mx_linear_eager(w: MXTensor, x: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``addmm(bias, MX(x), dequantize(w).T)`` in the weight's dtype, the weight a tile of rows at a time."""
    dtype = w.orig_dtype
    x2 = x.reshape(-1, x.shape[-1])
    k = w.act_quant_kwargs
    if k is not None:
        fmt = mx_format(k.elem_dtype, k.block_size)
        kernels.check_blocks(x2, k.block_size, "the input")
        x2 = kernels.mx_quantize_dequantize(x2.to(dtype), fmt, k.scaling_mode)  # straight-through gradient
    else:
        x2 = x2.to(dtype)
    out = tiled_linear(x2, lambda r0, r1: w._dequantize_rows(slice(r0, r1), dtype), w.shape[0],
                       None if bias is None else bias.to(dtype))
    return out.reshape(*x.shape[:-1], w.shape[0])


_ELEM_OF = {f.name: elem for elem, f in MX_FORMATS.items()}


@torch.library.custom_op("quanta::mx_linear", mutates_args=())
def _mx_linear_op(x: torch.Tensor, qdata: torch.Tensor, scale_codes: torch.Tensor, fmt: str, block_size: int,
                  orig_dtype: torch.dtype, act_fmt: Optional[str], act_block_size: int, act_mode: str,
                  bias: Optional[torch.Tensor]) -> torch.Tensor:
    act = None if act_fmt is None else QuantizeTensorToMXKwargs(_ELEM_OF[act_fmt], act_block_size,
                                                                ScaleCalculationMode(act_mode))
    w = MXTensor(qdata, scale_codes, _ELEM_OF[fmt], block_size, orig_dtype, None, act)
    return _mx_linear_eager(w, x, bias)


@_mx_linear_op.register_fake
def _(x, qdata, scale_codes, fmt, block_size, orig_dtype, act_fmt, act_block_size, act_mode, bias):
    return x.new_empty((*x.shape[:-1], qdata.shape[0]), dtype=orig_dtype)
