"""Quantization kernels in torchao's convention: zero point added to the rounded value.

The only code that rounds and clamps for the torchao dialect
(:mod:`quanta.quantization.quant_primitives`)::

    INT domain     Q(x)  = clamp(round(x * (1/s)) + zp, qmin, qmax)    multiply by the reciprocal
                   DQ(q) = (q - zp) * s
    NONE domain    Q(x)  = clamp(round(x * (1/s)), qmin, qmax),   DQ(q) = q * s
    FLOAT domain   Q(x)  = clamp(round((x - (zp - s*mid)) / s), qmin, qmax)     true division
    (tinygemm)     DQ(q) = (q - mid) * s + zp,                    mid = (qmax + qmin + 1) / 2
    float8         Q(x)  = cast(clamp(x / s, -max, max)),         DQ(q) = q * s

``round`` is half to even. The quanta AIMET dialect divides (:mod:`quanta.kernels.affine`);
torchao multiplies by ``1/s``, and at rounding ties the two differ, so this
module keeps torchao's arithmetic exactly: every step is the same torch
operation on the same dtypes as torchao 0.15 (``1/s`` in the scale's dtype, the
product in the promoted dtype of input and scale, the zero point added in that
dtype; in bfloat16/float16 each step computes in float32 and rounds once). Only
the integer cast is guarded: a NaN code raises instead of becoming an arbitrary
integer, and a code beyond what the float dtype holds exactly (``2**31 - 1`` in
float32) is clamped in float64 instead of wrapping.

Quantization parameters (per block, from the block minimum ``mn`` and maximum ``mx``)::

    SYMMETRIC                  s = max(-mn, mx) / ((qmax - qmin) / 2),     zp = int((qmax + qmin + 1) / 2)
    SYMMETRIC_NO_CLIPPING_ERR  s = max(mn / (qmin - zp), mx / (qmax - zp)), same zp
    ASYMMETRIC                 s = (mx - mn) / (qmax - qmin),   zp = clamp(qmin - round(mn / s), qmin, qmax)
    FLOAT zero point           s = (mx - mn) / (qmax - qmin),   zp = mn + s * mid
    then s = max(s, eps)

with ``mn = min(amin, 0)``, ``mx = max(amax, 0)`` when zero is preserved. For
``zp = 0`` (every signed two's-complement range) SYMMETRIC_NO_CLIPPING_ERR is
torchao's ``max(mn / qmin, mx / qmax)`` bit for bit; on other ranges (unsigned
ones) torchao divides by ``qmin = 0`` and clips the positive side, quanta does
not. Where ``mx - mn`` overflows the input dtype (ranges near ``finfo.max``)
torchao's scale is ``inf``; quanta computes ``mx / N - mn / N`` there instead.

Block layout: torchao's full block shape (:mod:`quanta.kernels.torchao_blocks`).
Gradients: straight-through rounding, as torchao's ``_Round``; clamp passes the
gradient where ``qmin <= code <= qmax``.
"""

from __future__ import annotations

import torch

from quanta.grids.float import FloatFormat
from quanta.kernels.blocks import BlockLayout, expand_param
from quanta.kernels.float_cast import fake_cast
from quanta.kernels.qparams import ste_round
from quanta.kernels.torchao_blocks import block_absmax

__all__ = [
    "symmetric_zero_point",
    "include_zero",
    "symmetric_qparams",
    "symmetric_no_clipping_qparams",
    "asymmetric_qparams",
    "float_zero_point_qparams",
    "quantize",
    "dequantize",
    "fake_quantize",
    "quantize_float_zero_point",
    "dequantize_float_zero_point",
    "fake_quantize_float_zero_point",
    "to_codes",
    "float8_scale",
    "power_of_two_scale",
    "quantize_float8",
    "dequantize_float8",
]

# Largest integer up to which every integer is exact, per float dtype.
_EXACT_INTEGER_LIMIT = {torch.float16: 2**11, torch.bfloat16: 2**8, torch.float32: 2**24, torch.float64: 2**53}


def _mid(qmin: int, qmax: int) -> float:
    return (qmax + qmin + 1) / 2


def symmetric_zero_point(qmin: int, qmax: int) -> int:
    """torchao's zero point of the symmetric mappings: ``int((qmax + qmin + 1) / 2)``.

    >>> symmetric_zero_point(-128, 127), symmetric_zero_point(0, 255), symmetric_zero_point(-127, 127)
    (0, 128, 0)
    """
    return int((qmax + qmin + 1) / 2)


# --------------------------------------------------------------------------- qparams
def include_zero(mn: torch.Tensor, mx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(min(mn, 0), max(mx, 0))``: widen each block's range so that zero lies in it.

    >>> include_zero(torch.tensor([0.5, -1.0]), torch.tensor([2.0, -0.5]))
    (tensor([ 0., -1.]), tensor([2., 0.]))
    """
    return torch.min(mn, torch.zeros_like(mn)), torch.max(mx, torch.zeros_like(mx))


def _finite_range_scale(mn: torch.Tensor, mx: torch.Tensor, n: float) -> torch.Tensor:
    """``(mx - mn) / n``, or ``mx / n - mn / n`` where ``mx - mn`` overflows the dtype."""
    scale = (mx - mn) / n
    over = torch.isinf(scale)
    if torch.compiler.is_compiling() or bool(over.any()):  # traced: no branch on values, the same results
        scale = torch.where(over, mx / n - mn / n, scale)
    return scale


def symmetric_qparams(mn: torch.Tensor, mx: torch.Tensor, qmin: int, qmax: int, eps: float
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """SYMMETRIC: ``s = max(max(-mn, mx) / ((qmax - qmin)/2), eps)``, ``zp = int((qmax + qmin + 1)/2)``.

    ``mn``/``mx`` already include zero (:func:`include_zero`); the results have
    their dtype (the zero point as a float, as torchao).

    >>> symmetric_qparams(torch.tensor([-1.0]), torch.tensor([0.5]), -128, 127, 1e-6)
    (tensor([0.0078]), tensor([0.]))
    """
    amax = torch.max(-mn, mx)
    scale = amax / (float(qmax - qmin) / 2)
    zp = torch.full_like(scale, symmetric_zero_point(qmin, qmax))
    return torch.clamp(scale, min=eps), zp


def symmetric_no_clipping_qparams(mn: torch.Tensor, mx: torch.Tensor, qmin: int, qmax: int, eps: float
                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """SYMMETRIC_NO_CLIPPING_ERR: ``s = max(mn / (qmin - zp), mx / (qmax - zp), eps)``, symmetric ``zp``.

    Neither end of the range clips: ``mn / s >= qmin - zp`` and ``mx / s <= qmax - zp``.
    Needs ``qmin < zp < qmax`` (the caller checks).

    >>> symmetric_no_clipping_qparams(torch.tensor([-1.0]), torch.tensor([0.5]), -8, 7, 1e-6)
    (tensor([0.1250]), tensor([0.]))
    >>> symmetric_no_clipping_qparams(torch.tensor([0.0]), torch.tensor([2.54]), 0, 255, 1e-6)
    (tensor([0.0200]), tensor([128.]))
    """
    zp = symmetric_zero_point(qmin, qmax)
    smin = mn / float(qmin - zp)
    smax = mx / float(qmax - zp)
    scale = torch.where(smin > smax, smin, smax)
    return torch.clamp(scale, min=eps), torch.full_like(scale, zp)


def asymmetric_qparams(mn: torch.Tensor, mx: torch.Tensor, qmin: int, qmax: int, eps: float, *,
                       clamp_zero_point: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """ASYMMETRIC: ``s = max((mx - mn) / (qmax - qmin), eps)``, ``zp = clamp(qmin - round(mn / s), qmin, qmax)``.

    The zero point is a float holding an integer, in ``mn``'s dtype (the
    subtraction runs in that dtype, as torchao's). ``clamp_zero_point=False``
    leaves it unclamped, for ranges that do not include zero (then ``mn``
    maps to ``qmin`` whatever the sign of ``mn``).

    >>> asymmetric_qparams(torch.tensor([-1.0]), torch.tensor([1.55]), 0, 255, 1e-6)
    (tensor([0.0100]), tensor([100.]))
    """
    scale = torch.clamp(_finite_range_scale(mn, mx, float(qmax - qmin)), min=eps)
    zp = qmin - torch.round(mn / scale)
    if clamp_zero_point:
        zp = torch.clamp(zp, qmin, qmax)
    return scale, zp


def float_zero_point_qparams(mn: torch.Tensor, mx: torch.Tensor, qmin: int, qmax: int, eps: float
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """FLOAT zero point (tinygemm): ``s = max((mx - mn) / (qmax - qmin), eps)``, ``zp = mn + s * mid``.

    >>> float_zero_point_qparams(torch.tensor([-1.0]), torch.tensor([2.0]), 0, 15, 1e-6)
    (tensor([0.2000]), tensor([0.6000]))
    """
    scale = torch.clamp(_finite_range_scale(mn, mx, float(qmax - qmin)), min=eps)
    mid = _mid(qmin, qmax)
    zp = mn + scale * mid
    over = torch.isinf(zp)
    if bool(over.any()):  # scale * mid overflowed with the range: halve both terms, then double
        zp = torch.where(over, (mn / 2 + scale * (mid / 2)) * 2, zp)
    return scale, zp


# --------------------------------------------------------------------------- integer grids
def _needs_grad(*ts: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


def _round(t: torch.Tensor, grad: bool) -> torch.Tensor:
    """Half-to-even rounding; straight-through under autograd, else in place on a fresh temporary."""
    return ste_round(t) if grad else t.round_()


def _add(a: torch.Tensor, b: torch.Tensor, grad: bool) -> torch.Tensor:
    return a + b if grad or torch.result_type(a, b) != a.dtype else a.add_(b)


def _clamp(t: torch.Tensor, qmin: int, qmax: int, grad: bool) -> torch.Tensor:
    return torch.clamp(t, qmin, qmax) if grad else t.clamp_(qmin, qmax)


def _quantize_int(x, layout, scale, zero_point, qmin, qmax, want_mask):
    grad = _needs_grad(x, scale, zero_point)
    xb = layout.to_blocks(x)
    s = expand_param(layout.scale_to_blocks(scale), xb.shape)  # thread-independent gradient sums
    q = _round(xb * (1.0 / s), grad)
    if zero_point is not None:
        q = _add(q, expand_param(layout.scale_to_blocks(zero_point), xb.shape), grad)
    mask = layout.from_blocks((q >= qmin) & (q <= qmax)) if want_mask else None
    return layout.from_blocks(_clamp(q, qmin, qmax, grad)), mask


def quantize(x: torch.Tensor, layout: BlockLayout, scale: torch.Tensor, zero_point: torch.Tensor | None,
             qmin: int, qmax: int) -> torch.Tensor:
    """``clamp(round(x * (1/s)) + zp, qmin, qmax)`` as floats holding the codes (``zp`` may be None).

    The dtype is torch's promotion of ``x``, ``scale`` and ``zero_point``, as
    in torchao; :func:`to_codes` makes integers of it.

    >>> from quanta.kernels.torchao_blocks import full_block_layout
    >>> lay = full_block_layout((4,), (4,))
    >>> quantize(torch.tensor([0.0, 0.25, 0.75, 9.0]), lay, torch.tensor(0.5), torch.tensor(1), 0, 15)
    tensor([ 1.,  1.,  3., 15.])
    """
    return _quantize_int(x, layout, scale, zero_point, qmin, qmax, False)[0]


def dequantize(q: torch.Tensor, layout: BlockLayout, scale: torch.Tensor, zero_point: torch.Tensor | None,
               output_dtype: torch.dtype) -> torch.Tensor:
    """``(q - zp) * s`` in ``output_dtype``: ``q`` and ``zp`` are cast to it first, the product is promoted.

    >>> from quanta.kernels.torchao_blocks import full_block_layout
    >>> lay = full_block_layout((3,), (3,))
    >>> dequantize(torch.tensor([1, 3, 15], dtype=torch.uint8), lay, torch.tensor(0.5), torch.tensor(1), torch.float32)
    tensor([0., 1., 7.])
    """
    grad = _needs_grad(q, scale, zero_point)
    d = layout.to_blocks(q).to(output_dtype, copy=True)
    if zero_point is not None:
        z = expand_param(layout.scale_to_blocks(zero_point).to(output_dtype), d.shape)
        d = d - z if grad else d.sub_(z)
    s = expand_param(layout.scale_to_blocks(scale), d.shape)
    d = d * s if grad or torch.result_type(d, s) != d.dtype else d.mul_(s)
    return layout.from_blocks(d).to(output_dtype)


def fake_quantize(x: torch.Tensor, layout: BlockLayout, scale: torch.Tensor, zero_point: torch.Tensor | None,
                  qmin: int, qmax: int, *, want_mask: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``DQ(Q(x))`` in ``x.dtype`` without the integer cast, and optionally the inside-mask.

    The mask is ``qmin <= round(x * (1/s)) + zp <= qmax`` on the *unclamped*
    code (torchao's ``_fake_quantize_affine_cachemask`` tests the clamped code,
    so its mask is always all true).

    >>> from quanta.kernels.torchao_blocks import full_block_layout
    >>> lay = full_block_layout((3,), (3,))
    >>> fake_quantize(torch.tensor([0.3, -2.0, 9.0]), lay, torch.tensor(0.5), torch.tensor(0), -4, 3, want_mask=True)
    (tensor([ 0.5000, -2.0000,  1.5000]), tensor([ True,  True, False]))
    """
    q, mask = _quantize_int(x, layout, scale, zero_point, qmin, qmax, want_mask)
    return dequantize(q, layout, scale, zero_point, x.dtype), mask


def _quantize_float_zp(x, layout, scale, zero_point, qmin, qmax, want_mask):
    grad = _needs_grad(x, scale, zero_point)
    xb = layout.to_blocks(x)
    s = expand_param(layout.scale_to_blocks(scale), xb.shape)
    min_val = expand_param(layout.scale_to_blocks(zero_point), xb.shape) - s * _mid(qmin, qmax)
    q = _round((xb - min_val) / s, grad)
    mask = layout.from_blocks((q >= qmin) & (q <= qmax)) if want_mask else None
    return layout.from_blocks(_clamp(q, qmin, qmax, grad)), mask


def quantize_float_zero_point(x: torch.Tensor, layout: BlockLayout, scale: torch.Tensor, zero_point: torch.Tensor,
                              qmin: int, qmax: int) -> torch.Tensor:
    """FLOAT domain: ``clamp(round((x - (zp - s*mid)) / s), qmin, qmax)``, true division, as floats.

    >>> from quanta.kernels.torchao_blocks import full_block_layout
    >>> lay = full_block_layout((3,), (3,))
    >>> quantize_float_zero_point(torch.tensor([-1.0, 0.0, 2.0]), lay, torch.tensor(0.2), torch.tensor(0.6), 0, 15)
    tensor([ 0.,  5., 15.])
    """
    return _quantize_float_zp(x, layout, scale, zero_point, qmin, qmax, False)[0]


def dequantize_float_zero_point(q: torch.Tensor, layout: BlockLayout, scale: torch.Tensor,
                                zero_point: torch.Tensor | None, qmin: int, qmax: int,
                                output_dtype: torch.dtype) -> torch.Tensor:
    """FLOAT domain: ``(q - mid) * s + zp`` in ``output_dtype`` (each step rounded to it, as torchao).

    ``q - mid`` of integer codes is computed in the default float dtype (float32).

    >>> from quanta.kernels.torchao_blocks import full_block_layout
    >>> lay = full_block_layout((3,), (3,))
    >>> dequantize_float_zero_point(torch.tensor([0, 5, 15]), lay, torch.tensor(0.25), torch.tensor(0.5), 0, 15,
    ...                             torch.float32)
    tensor([-1.5000, -0.2500,  2.2500])
    """
    d = (layout.to_blocks(q) - _mid(qmin, qmax)).to(output_dtype)
    d = (d * expand_param(layout.scale_to_blocks(scale), d.shape)).to(output_dtype)
    if zero_point is not None:
        d = (d + expand_param(layout.scale_to_blocks(zero_point), d.shape)).to(output_dtype)
    return layout.from_blocks(d)


def fake_quantize_float_zero_point(x: torch.Tensor, layout: BlockLayout, scale: torch.Tensor,
                                   zero_point: torch.Tensor, qmin: int, qmax: int, *, want_mask: bool = False
                                   ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """FLOAT domain ``DQ(Q(x))`` in ``x.dtype``, and optionally the inside-mask (on the unclamped code)."""
    q, mask = _quantize_float_zp(x, layout, scale, zero_point, qmin, qmax, want_mask)
    return dequantize_float_zero_point(q, layout, scale, zero_point, qmin, qmax, x.dtype), mask


def to_codes(q: torch.Tensor, dtype: torch.dtype, qmin: int, qmax: int, *, check_nan: bool = True) -> torch.Tensor:
    """Cast clamped float codes to the integer ``dtype``; NaN raises ``ValueError`` (unless ``check_nan`` is
    False: for callers whose scale carries a NaN input's NaN to their result, in traced code that cannot branch
    on values).

    A NaN code comes from a NaN input or from ``0 * inf`` (zero input, zero
    scale); an integer cannot hold it and torchao writes an arbitrary code.
    Where the float dtype cannot hold ``qmin``/``qmax`` exactly (``2**31 - 1`` in
    float32 rounds up to ``2**31``) the clamp is redone in float64, so the
    cast cannot wrap around.

    >>> to_codes(torch.tensor([3.0, 2147483648.0]), torch.int32, -2**31, 2**31 - 1).tolist()
    [3, 2147483647]
    """
    nan = torch.isnan(q) if q.is_floating_point() and check_nan else None
    if nan is not None and bool(nan.any()):
        n_nan = int(nan.sum())
        raise ValueError(
            f"{n_nan} code(s) would be NaN (a NaN input, or a zero input with a zero scale); "
            "integer codes cannot hold NaN"
        )
    if q.is_floating_point() and max(abs(qmin), abs(qmax)) > _EXACT_INTEGER_LIMIT.get(q.dtype, 0):
        q = q.to(torch.float64).clamp_(qmin, qmax)
    return q.to(dtype)


# --------------------------------------------------------------------------- float8
def float8_scale(x: torch.Tensor, layout: BlockLayout, fmt_max: float, *, lower: float | None = None,
                 upper: float | None = None) -> torch.Tensor:
    """``amax(|x|) / max`` per block, computed in ``x``'s dtype, as float32; an all-zero block gets 1.

    ``lower``/``upper`` clamp the block amax first (torchao's ``hp_value_lb/ub``).
    torchao returns scale 0 for an all-zero block and then NaN from ``0 / 0``.

    >>> from quanta.kernels.torchao_blocks import full_block_layout
    >>> float8_scale(torch.tensor([[448.0, -1.0], [0.0, 0.0]]), full_block_layout((2, 2), (1, 2)), 448.0)
    tensor([[1.],
            [1.]])
    """
    amax = block_absmax(x, layout)
    if lower is not None or upper is not None:
        amax = torch.clamp(amax, min=lower, max=upper)
    scale = (amax / fmt_max).to(torch.float32)
    return torch.where(scale == 0, 1.0, scale)


def power_of_two_scale(scale: torch.Tensor, *, round_up: bool = True) -> torch.Tensor:
    """``2**ceil(log2 s)`` (never clips: the scale only grows), or ``2**round(log2 s)`` as torchao's e8m0 scales.

    >>> power_of_two_scale(torch.tensor([0.3, 1.0, 5.0]))
    tensor([0.5000, 1.0000, 8.0000])
    >>> power_of_two_scale(torch.tensor([0.3, 1.0, 5.0]), round_up=False)
    tensor([0.2500, 1.0000, 4.0000])
    """
    e = torch.log2(scale)
    return torch.exp2(torch.ceil(e) if round_up else torch.round(e))


def quantize_float8(x: torch.Tensor, layout: BlockLayout, scale: torch.Tensor, fmt: FloatFormat,
                    dtype: torch.dtype) -> torch.Tensor:
    """``cast(clamp(float32(x) / s, -max, max))`` to the float8 ``dtype``; a zero scale gives zeros.

    The rounding is :func:`~quanta.kernels.float_cast.fake_cast` (nearest, ties
    to even), equal to torch's cast inside the range; NaN stays NaN.

    >>> from quanta.grids.float import FLOAT8_E4M3FN
    >>> from quanta.kernels.torchao_blocks import full_block_layout
    >>> lay = full_block_layout((3,), (3,))
    >>> quantize_float8(torch.tensor([1.0, 17.0, 1e6]), lay, torch.tensor(1.0), FLOAT8_E4M3FN, torch.float8_e4m3fn)
    tensor([  1.,  16., 448.], dtype=torch.float8_e4m3fn)
    """
    s = layout.scale_to_blocks(scale)
    v = torch.clamp(layout.to_blocks(x.to(torch.float32)) / s, -fmt.max, fmt.max)
    zero = s == 0
    if bool(zero.any()):
        v = torch.where(zero, 0.0, v)
    c = fake_cast(v, fmt)
    c = torch.where(torch.isnan(v), v, c)  # keep the NaN's sign bit, as torch's cast does
    return layout.from_blocks(c).to(dtype)


def dequantize_float8(q: torch.Tensor, layout: BlockLayout, scale: torch.Tensor, output_dtype: torch.dtype
                      ) -> torch.Tensor:
    """``float32(q) * s``, then cast to ``output_dtype``.

    >>> from quanta.kernels.torchao_blocks import full_block_layout
    >>> q = torch.tensor([1.0, 16.0], dtype=torch.float8_e4m3fn)
    >>> dequantize_float8(q, full_block_layout((2,), (2,)), torch.tensor(0.5), torch.float32)
    tensor([0.5000, 8.0000])
    """
    d = layout.to_blocks(q.to(torch.float32)) * layout.scale_to_blocks(scale)
    return layout.from_blocks(d).to(output_dtype)
