"""torchao's affine encodings: how scale and zero point are chosen, applied and inverted.

The implementation of :mod:`quanta.quantization.quant_primitives` (torchao's
``torchao.quantization.quant_primitives``; import it from there: its docstring
gives the formulas and where quanta deliberately differs from torchao). It
lives in the encodings layer, below :mod:`quanta.dtypes` (tensors), so that
real quantized storage does not import the quantizer layer: every function
checks its arguments and hands the numerics to :mod:`quanta.kernels.zero_point`,
:mod:`quanta.kernels.fpx_codes` and :mod:`quanta.kernels.torchao_blocks`.

>>> import torch
>>> w = torch.tensor([[-1.0, 0.5, 0.25, 1.0], [2.0, -0.5, 0.0, 1.5]])
>>> scale, zero_point = choose_qparams_affine(w, MappingType.ASYMMETRIC, (1, 4), torch.uint8)
>>> quantize_affine(w, (1, 4), scale, zero_point, torch.uint8)
tensor([[  0, 191, 159, 254],
        [255,   0,  51, 204]], dtype=torch.uint8)
"""

from __future__ import annotations

import math
from enum import Enum, auto
from typing import Optional, Sequence, Tuple

import torch

from quanta.grids.float import FloatFormat
from quanta.kernels import fpx_codes as FPX
from quanta.kernels import zero_point as K
from quanta.kernels.blocks import BlockLayout
from quanta.kernels.torchao_blocks import (
    block_min_max,
    full_block_layout,
    layout_from_scale_shape,
    scale_shape,
)

__all__ = [
    "MappingType",
    "ZeroPointDomain",
    "TorchAODType",
    "choose_qparams_affine",
    "choose_qparams_affine_with_min_max",
    "quantize_affine",
    "dequantize_affine",
    "fake_quantize_affine",
    "fake_quantize_affine_cachemask",
    "choose_qparams_affine_float8",
    "quantize_affine_float8",
    "dequantize_affine_float8",
    "choose_qparams_affine_fpx",
    "quantize_affine_fpx",
    "dequantize_affine_fpx",
    "float_to_fpx",
    "fpx_to_float",
]


class MappingType(Enum):
    """How the float range maps onto the integer range.

    * ``SYMMETRIC``: ``[-a, a]`` with ``a = max(|min|, |max|)`` onto the grid, zero point mid-grid.
    * ``SYMMETRIC_NO_CLIPPING_ERR``: one scale chosen so that neither ``min`` nor ``max`` clips.
    * ``ASYMMETRIC``: ``[min, max]`` onto ``[qmin, qmax]``, with an integer zero point.
    """

    SYMMETRIC = auto()
    SYMMETRIC_NO_CLIPPING_ERR = auto()
    ASYMMETRIC = auto()


class ZeroPointDomain(Enum):
    """Where the zero point lives.

    * ``INT``: an integer added to the rounded value: ``q = round(x/s) + zp``.
    * ``FLOAT``: a float subtracted before rounding (tinygemm): ``q = round((x - zp)/s + mid)``.
    * ``NONE``: no zero point: ``q = round(x/s)``.
    """

    INT = auto()
    FLOAT = auto()
    NONE = auto()


class TorchAODType(Enum):
    """torchao's placeholders for sub-byte signed dtypes (``torch.int1`` ... ``torch.int7`` work too)."""

    INT1 = auto()
    INT2 = auto()
    INT3 = auto()
    INT4 = auto()
    INT5 = auto()
    INT6 = auto()
    INT7 = auto()


# The enums' public name is torchao's path, as before they moved here: pickles of quantized tensors (which hold
# them) keep naming quanta.quantization.quant_primitives, so files saved earlier or later load either way, and
# quanta.dtypes' torch.load(weights_only=True) allow-list matches that name.
for _enum in (MappingType, ZeroPointDomain, TorchAODType):
    _enum.__module__ = "quanta.quantization.quant_primitives"
del _enum


_SUB_BYTE_UINT_BOUNDS = {getattr(torch, f"uint{b}"): (0, 2**b - 1) for b in range(1, 8)}
_SUB_BYTE_INT_BOUNDS = {getattr(torch, f"int{b}"): (-(2 ** (b - 1)), 2 ** (b - 1) - 1) for b in range(1, 8)}
_SUB_BYTE_INT_BOUNDS.update({getattr(TorchAODType, f"INT{b}"): (-(2 ** (b - 1)), 2 ** (b - 1) - 1)
                             for b in range(1, 8)})
#: Integer range of each target dtype (torchao's table).
_DTYPE_TO_QVALUE_BOUNDS = {
    torch.uint8: (0, 255),
    torch.int8: (-128, 127),
    torch.int16: (-(2**15), 2**15 - 1),
    torch.int32: (-(2**31), 2**31 - 1),
    **_SUB_BYTE_UINT_BOUNDS,
    **_SUB_BYTE_INT_BOUNDS,
}
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
_FLOAT_INPUTS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


# --------------------------------------------------------------------------- argument checks
def _tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _float_tensor(name: str, t: object) -> torch.Tensor:
    _tensor(name, t)
    if t.dtype not in _FLOAT_INPUTS:
        raise TypeError(f"{name} must be a float32, float16, bfloat16 or float64 tensor, got dtype {t.dtype}")
    return t


def _float_dtype(name: str, dtype: object) -> torch.dtype:
    if dtype not in _FLOAT_INPUTS:
        raise ValueError(f"{name} must be one of torch.float32, float16, bfloat16, float64; got {dtype}")
    return dtype


def _mapping(mapping_type: object) -> MappingType:
    if not isinstance(mapping_type, MappingType):
        raise TypeError(f"mapping_type must be a MappingType member, e.g. MappingType.SYMMETRIC, got {mapping_type!r}")
    return mapping_type


def _domain(zero_point_domain: object) -> ZeroPointDomain:
    if zero_point_domain is None:
        raise ValueError("zero_point_domain must be a ZeroPointDomain; use ZeroPointDomain.NONE instead of None")
    if not isinstance(zero_point_domain, ZeroPointDomain):
        raise TypeError(f"zero_point_domain must be a ZeroPointDomain member, got {zero_point_domain!r}")
    return zero_point_domain


def _eps(eps: object, dtype: torch.dtype) -> float:
    if eps is None:
        return torch.finfo(dtype).eps
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < math.inf:
        raise ValueError(f"eps must be a positive finite number or None, got {eps!r}")
    return float(eps)


def _bound(name: str, v: object) -> int:
    if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_floating_point():
        v = int(v.item())
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int or None, got {type(v).__name__} {v!r}")
    return v


def _get_and_check_qmin_qmax(dtype, quant_min=None, quant_max=None):
    """``(quant_min, quant_max)``, defaulting to the range of ``dtype`` and checked against it.

    Integer dtypes (int8/uint8/int16/int32, ``torch.int1..int7``, ``torch.uint1..uint7``,
    :class:`TorchAODType`) give ints; float8 dtypes give their float range, as torchao.

    >>> _get_and_check_qmin_qmax(torch.uint4, None, None)
    (0, 15)
    >>> _get_and_check_qmin_qmax(torch.int8, 5, -5)
    Traceback (most recent call last):
    ...
    ValueError: quant_min must be less than quant_max, got quant_min=5, quant_max=-5
    """
    if dtype in _FP8_DTYPES:
        fi = torch.finfo(dtype)
        lo, hi = fi.min, fi.max
        qmin = lo if quant_min is None else float(quant_min)
        qmax = hi if quant_max is None else float(quant_max)
    else:
        if dtype not in _DTYPE_TO_QVALUE_BOUNDS:
            raise ValueError(
                f"unsupported quantized dtype {dtype}; use torch.int8, uint8, int16, int32, "
                "torch.int1..int7, torch.uint1..uint7 or a float8 dtype"
            )
        lo, hi = _DTYPE_TO_QVALUE_BOUNDS[dtype]
        qmin = lo if quant_min is None else _bound("quant_min", quant_min)
        qmax = hi if quant_max is None else _bound("quant_max", quant_max)
    if qmin < lo:
        raise ValueError(f"quant_min {qmin} is below the smallest value of {dtype} ({lo})")
    if qmax > hi:
        raise ValueError(f"quant_max {qmax} is above the largest value of {dtype} ({hi})")
    if qmin >= qmax:
        raise ValueError(f"quant_min must be less than quant_max, got quant_min={qmin}, quant_max={qmax}")
    return qmin, qmax


def _int_bounds(dtype, quant_min, quant_max, arg: str) -> tuple[int, int]:
    if dtype in _FP8_DTYPES:
        raise ValueError(f"{arg} {dtype} is a float8 dtype; use the *_float8 functions for float8")
    if dtype not in _DTYPE_TO_QVALUE_BOUNDS:
        raise ValueError(
            f"unsupported quantized dtype {dtype} for {arg}; use torch.int8, uint8, int16, int32, "
            "torch.int1..int7, torch.uint1..uint7 or a float8 dtype"
        )
    return _get_and_check_qmin_qmax(dtype, quant_min, quant_max)


def _storage_dtype(dtype) -> torch.dtype:
    """The torch dtype that holds codes of ``dtype`` (uint1..7 in uint8, int1..7 in int8)."""
    if dtype in _SUB_BYTE_UINT_BOUNDS:
        return torch.uint8
    if dtype in _SUB_BYTE_INT_BOUNDS:
        return torch.int8
    return dtype


def _layout(x: torch.Tensor, block_size) -> BlockLayout:
    return full_block_layout(x.shape, block_size)


def _same_device(name: str, t: torch.Tensor, x: torch.Tensor) -> None:
    """``t`` must be on ``x``'s device; a 0-dim CPU tensor is a scalar torch broadcasts to any real device."""
    if t.device != x.device and not (t.dim() == 0 and t.device.type == "cpu" and x.device.type != "meta"):
        raise ValueError(f"{name} is on {t.device} but the input is on {x.device}; move them to one device")


def _check_scale(scale: torch.Tensor, *, allow_zero: bool = False) -> None:
    """Scales must be positive (or zero, where documented) and finite: NaN, inf and negative are a ValueError."""
    s = scale.detach()
    ok = ((s >= 0) if allow_zero else (s > 0)) & (s < math.inf)  # NaN fails both comparisons
    if not bool(ok.all()):
        what = ">= 0" if allow_zero else "positive"
        raise ValueError(f"scale must be {what} and finite (not NaN or inf); {int((~ok).sum())} of its "
                         f"{s.numel()} entries are not")


def _check_zero_point(zero_point: torch.Tensor) -> None:
    if not zero_point.is_floating_point():  # integer zero points are always finite
        return
    bad = ~torch.isfinite(zero_point.detach())
    if bool(bad.any()):
        raise ValueError(f"zero_point must be finite (not NaN or inf); {int(bad.sum())} of its entries are not")


def _qparam(name: str, t: object, layout: BlockLayout, optional: bool = False) -> torch.Tensor | None:
    if t is None and optional:
        return None
    _tensor(name, t)
    if optional and t.numel() == 0:  # torchao: an empty zero point means none
        return None
    if not optional and not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    n = math.prod(layout.scale_shape)
    if t.numel() != n:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)} ({t.numel()} elements), but block_size {layout.block_size} on "
            f"input shape {layout.input_shape} makes {n} blocks"
        )
    return t


def _check_finite(mn: torch.Tensor, mx: torch.Tensor, what: str) -> None:
    bad = ~(torch.isfinite(mn) & torch.isfinite(mx))
    if bool(bad.any()):
        raise ValueError(
            f"{what} has NaN or inf in {int(bad.sum())} of {bad.numel()} block(s); a scale cannot be chosen "
            "from non-finite values (torchao returns NaN/inf scales there)"
        )


def _cast_zero_point(zp: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    if dtype is None:
        return zp
    if not dtype.is_floating_point and zp.numel():
        info = torch.iinfo(dtype)
        lo, hi = float(zp.min()), float(zp.max())
        if lo < info.min or hi > info.max:
            raise ValueError(
                f"zero points in [{lo:g}, {hi:g}] do not fit zero_point_dtype {dtype} ([{info.min}, {info.max}]); "
                "use a wider zero_point_dtype, e.g. torch.int32"
            )
    return zp.to(dtype)


def _qparams_from_min_max(mn, mx, mapping_type, qmin, qmax, eps, preserve_zero, domain, zero_point_dtype,
                          float_dtype):
    if zero_point_dtype is not None and not isinstance(zero_point_dtype, torch.dtype):
        raise TypeError(f"zero_point_dtype must be a torch.dtype or None, got {zero_point_dtype!r}")
    if not isinstance(preserve_zero, bool):
        raise TypeError(f"preserve_zero must be a bool, got {preserve_zero!r}")
    if mapping_type is not MappingType.ASYMMETRIC:
        if not preserve_zero:
            raise ValueError(f"preserve_zero=False is only supported for MappingType.ASYMMETRIC, got {mapping_type}")
        if domain is ZeroPointDomain.FLOAT:
            raise ValueError(f"ZeroPointDomain.FLOAT is only supported for MappingType.ASYMMETRIC, got {mapping_type}")
        mn, mx = K.include_zero(mn, mx)
        if mapping_type is MappingType.SYMMETRIC:
            scale, zp = K.symmetric_qparams(mn, mx, qmin, qmax, eps)
        else:
            z = K.symmetric_zero_point(qmin, qmax)
            if not qmin < z < qmax:
                raise ValueError(
                    f"SYMMETRIC_NO_CLIPPING_ERR needs codes on both sides of the zero point {z}; the range "
                    f"[{qmin}, {qmax}] has none on one side"
                )
            scale, zp = K.symmetric_no_clipping_qparams(mn, mx, qmin, qmax, eps)
    elif domain is ZeroPointDomain.FLOAT:
        if preserve_zero:
            mn, mx = K.include_zero(mn, mx)
        scale, zp = K.float_zero_point_qparams(mn, mx, qmin, qmax, eps)
        if zero_point_dtype is None or not zero_point_dtype.is_floating_point:
            zero_point_dtype = float_dtype
    else:
        if preserve_zero:
            mn, mx = K.include_zero(mn, mx)
        scale, zp = K.asymmetric_qparams(mn, mx, qmin, qmax, eps, clamp_zero_point=preserve_zero)
        if zero_point_dtype is None:
            zero_point_dtype = torch.int32
    if domain is ZeroPointDomain.NONE:
        return scale, None
    return scale, _cast_zero_point(zp, zero_point_dtype)


# --------------------------------------------------------------------------- integer affine
@torch.no_grad()
def choose_qparams_affine(
    input: torch.Tensor,
    mapping_type: MappingType,
    block_size: Tuple[int, ...],
    target_dtype: torch.dtype,
    quant_min: Optional[int] = None,
    quant_max: Optional[int] = None,
    eps: Optional[float] = None,
    scale_dtype: Optional[torch.dtype] = None,
    zero_point_dtype: Optional[torch.dtype] = torch.int32,
    keepdim: bool = False,
    *,
    preserve_zero: bool = True,
    zero_point_domain: ZeroPointDomain = ZeroPointDomain.INT,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Scale and zero point per block of ``input`` (formulas in the module docstring).

    Args:
        input: float32/float16/bfloat16/float64 tensor; the min/max and scale
            arithmetic runs in its dtype, as torchao's.
        mapping_type: a :class:`MappingType`.
        block_size: full block shape, one entry per input dim (``-1`` = whole dim).
        target_dtype: quantized dtype giving the default range (``torch.int8``, ``torch.uint4``, ...).
        quant_min, quant_max: range override inside ``target_dtype``'s.
        eps: smallest scale (default ``finfo(input.dtype).eps``).
        scale_dtype: dtype of the returned scale (default ``input.dtype``).
        zero_point_dtype: dtype of the returned zero point (default int32). ``None``
            keeps torchao's choice: int32 for ASYMMETRIC, the float dtype for the
            symmetric mappings. Under ``ZeroPointDomain.FLOAT`` an integer
            ``zero_point_dtype`` (the default included) means the input's dtype.
        keepdim: keep reduced dimensions as size 1 (torchao's intermediate shape).
        preserve_zero: widen each block's range to include 0 (default). ``False``
            (ASYMMETRIC only): the block's own ``[min, max]`` maps onto
            ``[qmin, qmax]``, zero need not be exact (torchao's
            ``_choose_qparams_affine_dont_preserve_zero``; with FLOAT,
            ``_choose_qparams_affine_tinygemm``).
        zero_point_domain: ``INT`` (default); ``FLOAT`` (ASYMMETRIC only):
            ``zp = mn + s * (qmax + qmin + 1)/2``, a float; ``NONE``: the zero point
            is ``None``.

    Returns:
        ``(scale, zero_point)`` shaped like the blocks (reduced dims dropped).

    >>> x = torch.tensor([[-1.0, 0.5], [0.2, 0.4]])
    >>> choose_qparams_affine(x, MappingType.SYMMETRIC, (1, 2), torch.int8)
    (tensor([0.0078, 0.0031]), tensor([0, 0], dtype=torch.int32))
    >>> choose_qparams_affine(x, MappingType.ASYMMETRIC, (2, 2), torch.uint8, zero_point_domain=ZeroPointDomain.NONE)
    (tensor(0.0059), None)
    """
    x = _float_tensor("input", input)
    mapping_type = _mapping(mapping_type)
    domain = _domain(zero_point_domain)
    qmin, qmax = _int_bounds(target_dtype, quant_min, quant_max, "target_dtype")
    layout = _layout(x, block_size)
    eps = _eps(eps, x.dtype)
    if scale_dtype is not None:
        _float_dtype("scale_dtype", scale_dtype)
    if not isinstance(keepdim, bool):
        raise TypeError(f"keepdim must be a bool, got {keepdim!r}")
    if x.numel() == 0:
        raise ValueError(f"input is empty (shape {tuple(x.shape)}); there is no range to choose a scale from")
    mn, mx = block_min_max(x, layout)
    _check_finite(mn, mx, "input")
    scale, zp = _qparams_from_min_max(mn, mx, mapping_type, qmin, qmax, eps, preserve_zero, domain,
                                      zero_point_dtype, x.dtype)
    shape = scale_shape(layout, keepdim)
    scale = scale.reshape(shape).to(x.dtype if scale_dtype is None else scale_dtype)
    return scale, None if zp is None else zp.reshape(shape)


@torch.no_grad()
def choose_qparams_affine_with_min_max(
    min_val: torch.Tensor,
    max_val: torch.Tensor,
    mapping_type: MappingType,
    block_size: Tuple[int, ...],
    target_dtype: torch.dtype,
    quant_min: Optional[int] = None,
    quant_max: Optional[int] = None,
    eps: Optional[float] = None,
    scale_dtype: Optional[torch.dtype] = None,
    zero_point_dtype: Optional[torch.dtype] = None,
    preserve_zero: bool = True,
    zero_point_domain: ZeroPointDomain = ZeroPointDomain.INT,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """:func:`choose_qparams_affine` from given per-block ``min_val``/``max_val`` (e.g. an observer's).

    ``block_size`` is accepted for torchao's signature and not used: the
    qparams have ``min_val``'s shape. The defaults of ``eps`` and
    ``scale_dtype`` come from ``min_val.dtype``.

    >>> choose_qparams_affine_with_min_max(torch.tensor([-1.0]), torch.tensor([1.55]), MappingType.ASYMMETRIC,
    ...                                    (4,), torch.uint8)
    (tensor([0.0100]), tensor([100], dtype=torch.int32))
    """
    mn = _float_tensor("min_val", min_val)
    mx = _float_tensor("max_val", max_val)
    if mn.dtype != mx.dtype or mn.shape != mx.shape:
        raise ValueError(
            f"min_val and max_val must have the same dtype and shape, got {mn.dtype} {tuple(mn.shape)} and "
            f"{mx.dtype} {tuple(mx.shape)}"
        )
    mapping_type = _mapping(mapping_type)
    domain = _domain(zero_point_domain)
    qmin, qmax = _int_bounds(target_dtype, quant_min, quant_max, "target_dtype")
    eps = _eps(eps, mn.dtype)
    if scale_dtype is not None:
        _float_dtype("scale_dtype", scale_dtype)
    _check_finite(mn, mx, "min_val/max_val")
    if bool((mn > mx).any()):
        raise ValueError("min_val must not exceed max_val")
    scale, zp = _qparams_from_min_max(mn, mx, mapping_type, qmin, qmax, eps, preserve_zero, domain,
                                      zero_point_dtype, mn.dtype)
    return scale.to(mn.dtype if scale_dtype is None else scale_dtype), zp


def _prepare(x, block_size, scale, zero_point):
    layout = _layout(x, block_size)
    s = _qparam("scale", scale, layout)
    zp = _qparam("zero_point", zero_point, layout, optional=True)
    _same_device("scale", s, x)
    _check_scale(s)
    if zp is not None:
        _same_device("zero_point", zp, x)
        _check_zero_point(zp)
    return layout, s, zp


@torch.no_grad()
def quantize_affine(
    input: torch.Tensor,
    block_size: Tuple[int, ...],
    scale: torch.Tensor,
    zero_point: Optional[torch.Tensor],
    output_dtype: torch.dtype,
    quant_min: Optional[int] = None,
    quant_max: Optional[int] = None,
    *,
    zero_point_domain: ZeroPointDomain = ZeroPointDomain.INT,
) -> torch.Tensor:
    """Integer codes ``clamp(round(x * (1/s)) + zp, qmin, qmax)`` in ``output_dtype``.

    ``1/s`` is computed in the scale's dtype and the product in the promoted
    dtype of input and scale, as torchao. ``zero_point=None`` (or empty) means
    zero. ``zero_point_domain`` (keyword, from older torchao): ``FLOAT`` quantizes
    as ``clamp(round((x - (zp - s*mid)) / s), qmin, qmax)``; ``NONE`` ignores
    ``zero_point``. uint1–uint7 codes are stored in uint8, int1–int7 in int8.
    A NaN code raises ``ValueError``.

    >>> quantize_affine(torch.tensor([[0.1, -0.26, 3.0]]), (1, 3), torch.tensor([0.1]), torch.tensor([2]),
    ...                 torch.int8, -8, 7)
    tensor([[ 3, -1,  7]], dtype=torch.int8)
    """
    x = _float_tensor("input", input)
    qmin, qmax = _int_bounds(output_dtype, quant_min, quant_max, "output_dtype")
    domain = _domain(zero_point_domain)
    layout, s, zp = _prepare(x, block_size, scale, zero_point)
    _check_float_domain(domain, zp)
    return _quantize_prepared(x, layout, s, zp, domain, qmin, qmax, output_dtype)


def _check_float_domain(domain: ZeroPointDomain, zp: torch.Tensor | None) -> None:
    if domain is ZeroPointDomain.FLOAT and zp is None:
        raise ValueError("ZeroPointDomain.FLOAT needs a zero_point tensor, got None")


def _quantize_prepared(x, layout, s, zp, domain, qmin, qmax, output_dtype) -> torch.Tensor:
    if domain is ZeroPointDomain.FLOAT:
        q = K.quantize_float_zero_point(x, layout, s, zp, qmin, qmax)
    else:
        q = K.quantize(x, layout, s, None if domain is ZeroPointDomain.NONE else zp, qmin, qmax)
    return K.to_codes(q, _storage_dtype(output_dtype), qmin, qmax)


def _dequantize_prepared(q, layout, s, zp, domain, qmin, qmax, output_dtype) -> torch.Tensor:
    if domain is ZeroPointDomain.FLOAT:
        return K.dequantize_float_zero_point(q, layout, s, zp, qmin, qmax, output_dtype)
    return K.dequantize(q, layout, s, None if domain is ZeroPointDomain.NONE else zp, output_dtype)


def dequantize_affine(
    input: torch.Tensor,
    block_size: Tuple[int, ...],
    scale: torch.Tensor,
    zero_point: Optional[torch.Tensor],
    input_dtype: torch.dtype,
    quant_min: Optional[int] = None,
    quant_max: Optional[int] = None,
    *,
    output_dtype: torch.dtype = torch.float32,
    zero_point_domain: ZeroPointDomain = ZeroPointDomain.INT,
) -> torch.Tensor:
    """Floats ``(q - zp) * s`` in ``output_dtype`` (default float32) from integer codes of ``input_dtype``.

    ``q`` and ``zp`` are cast to ``output_dtype``, then multiplied by the scale
    in the promoted dtype and cast back, as torchao. ``FLOAT`` domain:
    ``(q - mid) * s + zp``; ``NONE``: ``q * s``.

    >>> dequantize_affine(torch.tensor([[3, -1, 7]], dtype=torch.int8), (1, 3), torch.tensor([0.1]),
    ...                   torch.tensor([2]), torch.int8, -8, 7)
    tensor([[ 0.1000, -0.3000,  0.5000]])
    """
    q = _tensor("input", input)
    qmin, qmax = _int_bounds(input_dtype, quant_min, quant_max, "input_dtype")
    storage = _storage_dtype(input_dtype)
    if q.dtype != storage:
        raise ValueError(f"input has dtype {q.dtype}, but input_dtype {input_dtype} is stored as {storage}")
    _float_dtype("output_dtype", output_dtype)
    domain = _domain(zero_point_domain)
    layout, s, zp = _prepare(q, block_size, scale, zero_point)
    return _dequantize_prepared(q, layout, s, zp, domain, qmin, qmax, output_dtype)


class FixedAffineGrid:
    """:func:`quantize_affine` and :func:`dequantize_affine` with fixed qparams, checked once, for many inputs of
    one shape (GPTQ quantizes a weight column by column with each group's qparams; checking the scale and zero
    point at every column cost two thirds of the time).

    The arguments are those of :func:`quantize_affine` (``shape`` is the inputs' shape, ``scale`` and
    ``zero_point`` are checked here); :meth:`quantize` and :meth:`dequantize` return the bits of those
    functions.

    >>> grid = FixedAffineGrid((3, 1), (1, 1), torch.tensor([0.1, 0.2, 0.5]), None, torch.int8)
    >>> codes = grid.quantize(torch.tensor([[0.26], [0.26], [0.26]]))
    >>> codes.flatten().tolist(), grid.dequantize(codes).flatten().tolist()
    ([3, 1, 1], [0.30000001192092896, 0.20000000298023224, 0.5])
    """

    def __init__(self, shape: Sequence[int], block_size: Tuple[int, ...], scale: torch.Tensor,
                 zero_point: Optional[torch.Tensor], quant_dtype: torch.dtype, quant_min: Optional[int] = None,
                 quant_max: Optional[int] = None, *, zero_point_domain: ZeroPointDomain = ZeroPointDomain.INT) -> None:
        _tensor("scale", scale)
        self.shape = torch.Size(shape)
        self.quant_min, self.quant_max = _int_bounds(quant_dtype, quant_min, quant_max, "quant_dtype")
        self.quant_dtype, self.storage_dtype = quant_dtype, _storage_dtype(quant_dtype)
        self.domain = _domain(zero_point_domain)
        probe = torch.empty(self.shape, device=scale.device)  # the inputs' shape and device, for the checks
        self.layout, self.scale, self.zero_point = _prepare(probe, block_size, scale, zero_point)
        _check_float_domain(self.domain, self.zero_point)

    def quantize(self, input: torch.Tensor) -> torch.Tensor:
        """:func:`quantize_affine` of ``input`` (a float tensor of the grid's shape) with the grid's qparams."""
        x = _float_tensor("input", input)
        if x.shape != self.shape:
            raise ValueError(f"input must have shape {tuple(self.shape)}, got {tuple(x.shape)}")
        return _quantize_prepared(x, self.layout, self.scale, self.zero_point, self.domain, self.quant_min,
                                  self.quant_max, self.quant_dtype)

    def dequantize(self, codes: torch.Tensor, output_dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """:func:`dequantize_affine` of ``codes`` (the grid's shape, its storage dtype) into ``output_dtype``."""
        q = _tensor("codes", codes)
        if q.shape != self.shape or q.dtype != self.storage_dtype:
            raise ValueError(f"codes must be {self.storage_dtype} of shape {tuple(self.shape)}, got {q.dtype} of "
                             f"shape {tuple(q.shape)}")
        _float_dtype("output_dtype", output_dtype)
        return _dequantize_prepared(q, self.layout, self.scale, self.zero_point, self.domain, self.quant_min,
                                    self.quant_max, output_dtype)


def _fake(input, block_size, scale, zero_point, quant_dtype, quant_min, quant_max, zero_point_domain, want_mask):
    x = _float_tensor("input", input)
    qmin, qmax = _int_bounds(quant_dtype, quant_min, quant_max, "quant_dtype")
    domain = _domain(zero_point_domain)
    layout, s, zp = _prepare(x, block_size, scale, zero_point)
    if domain is ZeroPointDomain.NONE and zp is not None:
        raise ValueError("zero_point must be None when zero_point_domain is ZeroPointDomain.NONE")
    if domain is ZeroPointDomain.FLOAT:
        if zp is None:
            raise ValueError("ZeroPointDomain.FLOAT needs a zero_point tensor, got None")
        return K.fake_quantize_float_zero_point(x, layout, s, zp, qmin, qmax, want_mask=want_mask)
    return K.fake_quantize(x, layout, s, zp, qmin, qmax, want_mask=want_mask)


def fake_quantize_affine(
    input: torch.Tensor,
    block_size: Tuple[int, ...],
    scale: torch.Tensor,
    zero_point: Optional[torch.Tensor],
    quant_dtype: torch.dtype,
    quant_min: Optional[int] = None,
    quant_max: Optional[int] = None,
    zero_point_domain: ZeroPointDomain = ZeroPointDomain.INT,
) -> torch.Tensor:
    """``dequantize(quantize(x))`` in ``input.dtype`` without the integer cast (for QAT).

    Differentiable: straight-through rounding; the input gradient is zero where
    the code was clamped; scale and zero point get gradients too.

    >>> fake_quantize_affine(torch.tensor([[0.1, -0.26, 3.0]]), (1, 3), torch.tensor([0.1]), torch.tensor([2]),
    ...                      torch.int8, -8, 7)
    tensor([[ 0.1000, -0.3000,  0.5000]])
    """
    return _fake(input, block_size, scale, zero_point, quant_dtype, quant_min, quant_max, zero_point_domain,
                 False)[0]


def fake_quantize_affine_cachemask(
    input: torch.Tensor,
    block_size: Tuple[int, ...],
    scale: torch.Tensor,
    zero_point: Optional[torch.Tensor],
    quant_dtype: torch.dtype,
    quant_min: Optional[int] = None,
    quant_max: Optional[int] = None,
    zero_point_domain: ZeroPointDomain = ZeroPointDomain.INT,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`fake_quantize_affine` and a mask that is False where the code was clamped.

    >>> fake_quantize_affine_cachemask(torch.tensor([[0.1, 3.0]]), (1, 2), torch.tensor([0.1]), None, torch.int8,
    ...                                -8, 7)
    (tensor([[0.1000, 0.7000]]), tensor([[ True, False]]))
    """
    return _fake(input, block_size, scale, zero_point, quant_dtype, quant_min, quant_max, zero_point_domain, True)


# torchao's private names for the same operations -------------------------------------------
def _choose_qparams_affine_tinygemm(input, mapping_type, block_size, target_dtype, quant_min=None, quant_max=None,
                                    eps=None, scale_dtype=None, zero_point_dtype=None):
    """torchao's tinygemm qparams: ASYMMETRIC, FLOAT zero point, range not widened to include 0."""
    if _mapping(mapping_type) is not MappingType.ASYMMETRIC:
        raise ValueError(f"the FLOAT zero-point domain supports only MappingType.ASYMMETRIC, got {mapping_type}")
    return choose_qparams_affine(input, mapping_type, block_size, target_dtype, quant_min, quant_max, eps,
                                 scale_dtype, zero_point_dtype, preserve_zero=False,
                                 zero_point_domain=ZeroPointDomain.FLOAT)


def _choose_qparams_affine_dont_preserve_zero(input, mapping_type, block_size, target_dtype, quant_min=None,
                                              quant_max=None, eps=None, scale_dtype=None, zero_point_dtype=None):
    """torchao's ASYMMETRIC qparams with an integer zero point and the range not widened to include 0."""
    if _mapping(mapping_type) is not MappingType.ASYMMETRIC:
        raise ValueError(f"preserve_zero=False supports only MappingType.ASYMMETRIC, got {mapping_type}")
    return choose_qparams_affine(input, mapping_type, block_size, target_dtype, quant_min, quant_max, eps,
                                 scale_dtype, zero_point_dtype, preserve_zero=False)


def _quantize_affine_tinygemm(input, block_size, scale, zero_point, output_dtype, quant_min=None, quant_max=None):
    """:func:`quantize_affine` in the FLOAT zero-point domain."""
    return quantize_affine(input, block_size, scale, zero_point, output_dtype, quant_min, quant_max,
                           zero_point_domain=ZeroPointDomain.FLOAT)


def _dequantize_affine_tinygemm(input, block_size, scale, zero_point, input_dtype, quant_min=None, quant_max=None,
                                *, output_dtype=torch.float32):
    """:func:`dequantize_affine` in the FLOAT zero-point domain."""
    return dequantize_affine(input, block_size, scale, zero_point, input_dtype, quant_min, quant_max,
                             output_dtype=output_dtype, zero_point_domain=ZeroPointDomain.FLOAT)


def _quantize_affine_no_zero_point(input, block_size, scale, zero_point, output_dtype, quant_min=None,
                                   quant_max=None):
    """:func:`quantize_affine` without a zero point (``zero_point`` is ignored)."""
    return quantize_affine(input, block_size, scale, None, output_dtype, quant_min, quant_max,
                           zero_point_domain=ZeroPointDomain.NONE)


def _dequantize_affine_no_zero_point(input, block_size, scale, zero_point, input_dtype, quant_min=None,
                                     quant_max=None, *, output_dtype=torch.float32):
    """:func:`dequantize_affine` without a zero point (``zero_point`` is ignored)."""
    return dequantize_affine(input, block_size, scale, None, input_dtype, quant_min, quant_max,
                             output_dtype=output_dtype, zero_point_domain=ZeroPointDomain.NONE)


_fake_quantize_affine = fake_quantize_affine
_fake_quantize_affine_cachemask = fake_quantize_affine_cachemask


# --------------------------------------------------------------------------- float8
def _float8_format(float8_dtype) -> FloatFormat:
    if float8_dtype not in _FP8_DTYPES:
        raise ValueError(f"float8_dtype must be one of {[str(d) for d in _FP8_DTYPES]}, got {float8_dtype}")
    return FloatFormat.from_torch_dtype(float8_dtype)


def _float8_scale(tensor, block_size, float8_dtype, lower, upper, pow2):
    x = _float_tensor("tensor", tensor)
    fmt = _float8_format(float8_dtype)
    if isinstance(block_size, Sequence) and not isinstance(block_size, str) and len(block_size) == 0:
        block_size, out_shape = tuple(x.shape), ()  # tensorwise, as torchao's empty block_size
    else:
        out_shape = None
    layout = _layout(x, block_size)
    if x.numel() == 0:
        raise ValueError(f"tensor is empty (shape {tuple(x.shape)}); there is no range to choose a scale from")
    scale = K.float8_scale(x, layout, fmt.max, lower=lower, upper=upper)
    bad = ~torch.isfinite(scale)
    if bool(bad.any()):
        raise ValueError(
            f"tensor has NaN or inf in {int(bad.sum())} of {bad.numel()} block(s); a scale cannot be chosen "
            "from non-finite values (torchao returns NaN/inf scales there)"
        )
    if pow2 is not None:
        scale = K.power_of_two_scale(scale, round_up=pow2)
    return scale if out_shape is None else scale.reshape(out_shape)


@torch.no_grad()
def choose_qparams_affine_float8(
    tensor: torch.Tensor,
    block_size: Sequence[int],
    float8_dtype: torch.dtype = torch.float8_e4m3fn,
    *,
    power_of_two: bool = False,
    hp_value_lb: Optional[float] = None,
    hp_value_ub: Optional[float] = None,
) -> torch.Tensor:
    """float32 scale ``amax(|block|) / finfo(float8_dtype).max`` per block; an all-zero block gets 1.

    The amax and the division run in ``tensor``'s dtype, as torchao's
    ``_choose_scale_float8``. ``block_size`` is the full block shape, or ``()``
    for one scale (0-dim) for the whole tensor; the scale keeps the input's rank
    otherwise. ``power_of_two=True`` rounds each scale *up* to a power of two
    (never clips). ``hp_value_lb``/``hp_value_ub`` clamp the amax.

    >>> x = torch.tensor([[1.0, -896.0], [0.0, 0.0]])
    >>> choose_qparams_affine_float8(x, (1, 2))
    tensor([[2.],
            [1.]])
    >>> choose_qparams_affine_float8(torch.tensor([[3.0, 0.0]]), (), power_of_two=True)
    tensor(0.0078)
    """
    if not isinstance(power_of_two, bool):
        raise TypeError(f"power_of_two must be a bool, got {power_of_two!r}")
    return _float8_scale(tensor, block_size, float8_dtype, hp_value_lb, hp_value_ub, True if power_of_two else None)


def _check_float8_scale(scale, x: torch.Tensor) -> BlockLayout:
    _tensor("scale", scale)
    layout = layout_from_scale_shape(x.shape, scale.shape)
    _same_device("scale", scale, x)
    _check_scale(scale, allow_zero=True)  # a zero scale gives zero codes (documented)
    return layout


@torch.no_grad()
def quantize_affine_float8(tensor: torch.Tensor, scale: torch.Tensor,
                           float8_dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """``cast(clamp(float32(x) / s, -max, max))`` to ``float8_dtype``, round to nearest even.

    The scale's shape gives the blocks (one element = per tensor, else the
    input's rank with dims that divide it). NaN stays NaN; a zero scale gives
    zero codes (torchao: ``+-max`` and NaN).

    >>> quantize_affine_float8(torch.tensor([[1.0, 17.0, 1e6]]), torch.tensor([[1.0]]))
    tensor([[  1.,  16., 448.]], dtype=torch.float8_e4m3fn)
    """
    x = _float_tensor("tensor", tensor)
    fmt = _float8_format(float8_dtype)
    layout = _check_float8_scale(scale, x)
    return K.quantize_float8(x, layout, scale, fmt, float8_dtype)


def dequantize_affine_float8(tensor: torch.Tensor, scale: torch.Tensor,
                             output_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``float32(q) * s`` cast to ``output_dtype`` (default float32).

    >>> dequantize_affine_float8(torch.tensor([[1.0, 16.0]], dtype=torch.float8_e4m3fn), torch.tensor([[0.5]]))
    tensor([[0.5000, 8.0000]])
    """
    q = _tensor("tensor", tensor)
    if not q.is_floating_point():
        raise TypeError(f"tensor must hold float8 values, got dtype {q.dtype}")
    _float_dtype("output_dtype", output_dtype)
    return K.dequantize_float8(q, _check_float8_scale(scale, q), scale, output_dtype)


@torch.no_grad()
def _choose_scale_float8(tensor, block_size, float8_dtype=torch.float8_e4m3fn, scale_dtype=torch.float32,
                         hp_value_lb=None, hp_value_ub=None):
    """torchao's float8 scale; ``scale_dtype=torch.float8_e8m0fnu`` rounds it to the *nearest* power of two.

    Prefer :func:`choose_qparams_affine_float8` (``power_of_two=True`` rounds up and never clips).
    """
    if scale_dtype not in (torch.float32, torch.float8_e8m0fnu):
        raise ValueError(f"scale_dtype must be torch.float32 or torch.float8_e8m0fnu, got {scale_dtype}")
    pow2 = None if scale_dtype == torch.float32 else False
    return _float8_scale(tensor, block_size, float8_dtype, hp_value_lb, hp_value_ub, pow2)


_quantize_affine_float8 = quantize_affine_float8
_dequantize_affine_float8 = dequantize_affine_float8


# --------------------------------------------------------------------------- fpx (floatx)
def float_to_fpx(x: torch.Tensor, ebits: int, mbits: int) -> torch.Tensor:
    """Codes ``S|E|M`` (uint8) of ``x`` rounded to the ``1 + ebits + mbits``-bit float without inf/NaN.

    Round to nearest even, subnormals included; ``|x| >= max`` and inf saturate
    to the largest magnitude. NaN raises ``ValueError`` (torchao's
    ``_f32_to_floatx_unpacked`` returns a finite code).

    >>> float_to_fpx(torch.tensor([0.3, 1.25, -7.0, 100.0]), 3, 2).tolist()
    [5, 13, 55, 31]
    """
    return FPX.encode(x, FPX.fpx_format(ebits, mbits))


def fpx_to_float(codes: torch.Tensor, ebits: int, mbits: int) -> torch.Tensor:
    """float32 values of fpx codes (exact).

    >>> fpx_to_float(torch.tensor([5, 13, 55, 31], dtype=torch.uint8), 3, 2).tolist()
    [0.3125, 1.25, -7.0, 28.0]
    """
    return FPX.decode(codes, FPX.fpx_format(ebits, mbits))


@torch.no_grad()
def choose_qparams_affine_fpx(tensor: torch.Tensor, ebits: int, mbits: int) -> torch.Tensor:
    """One scale per row of a 2-D tensor: ``max(amax(|row|), 1e-12) / max_normal``, in the tensor's dtype.

    >>> choose_qparams_affine_fpx(torch.tensor([[1.0, -28.0], [0.5, 0.0]]), 3, 2)
    tensor([1.0000, 0.0179])
    """
    x = _float_tensor("tensor", tensor)
    fmt = FPX.fpx_format(ebits, mbits)
    scale = FPX.row_scale(x, fmt)
    bad = ~torch.isfinite(scale)
    if bool(bad.any()):
        raise ValueError(
            f"tensor has NaN or inf in {int(bad.sum())} of {bad.numel()} row(s); a scale cannot be chosen "
            "from non-finite values"
        )
    return scale


@torch.no_grad()
def quantize_affine_fpx(tensor: torch.Tensor, scale: torch.Tensor, ebits: int, mbits: int) -> torch.Tensor:
    """fpx codes (uint8) of ``float32(x) / s`` with one scale per row.

    >>> quantize_affine_fpx(torch.tensor([[1.0, -28.0]]), torch.tensor([1.0]), 3, 2).tolist()
    [[12, 63]]
    """
    x = _float_tensor("tensor", tensor)
    _tensor("scale", scale)
    _same_device("scale", scale, x)
    _check_scale(scale)
    return FPX.quantize_rows(x, scale, FPX.fpx_format(ebits, mbits))


def dequantize_affine_fpx(tensor: torch.Tensor, scale: torch.Tensor, ebits: int, mbits: int,
                          output_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``value(code) * float32(s)`` per row, cast to ``output_dtype``.

    >>> dequantize_affine_fpx(torch.tensor([[12, 63]], dtype=torch.uint8), torch.tensor([0.5]), 3, 2)
    tensor([[  0.5000, -14.0000]])
    """
    _float_dtype("output_dtype", output_dtype)
    _tensor("scale", scale)
    _same_device("scale", scale, _tensor("tensor", tensor))
    _check_scale(scale)
    return FPX.dequantize_rows(tensor, scale, FPX.fpx_format(ebits, mbits), output_dtype)


_f32_to_floatx_unpacked = float_to_fpx
_floatx_unpacked_to_f32 = fpx_to_float
_choose_qparams_affine_floatx = choose_qparams_affine_fpx
_quantize_affine_floatx = quantize_affine_fpx
_dequantize_affine_floatx = dequantize_affine_fpx
