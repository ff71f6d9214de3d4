"""Sub-byte float codes: values of a :class:`FloatFormat` to and from their bit patterns.

A code is ``S|E|M`` (sign, ``e`` exponent bits, ``m`` mantissa bits) in the low
``1 + e + m`` bits of a ``uint8``, as torchao's ``_f32_to_floatx_unpacked``
stores fp4/fp6 values::

    value(S, E, M) = (-1)**S * M / 2**m * 2**(1 - bias)          E == 0 (subnormal)
                   = (-1)**S * (1 + M / 2**m) * 2**(E - bias)    E >  0
    bias = 2**(e-1) - 1

These are the IEEE-like formats without inf or NaN codes
(:attr:`SpecialValues.FINITE`): the all-ones code is the largest number,
``max = (2 - 2**-m) * 2**(2**e - 1 - bias)`` (e2m1 6, e3m2 28, e2m3 7.5, e4m3 480,
e5m2 114688).

``encode`` rounds with :func:`quanta.kernels.float_cast.fake_cast` (nearest,
ties to even, subnormals included; ``|x| >= max`` and ``+-inf`` saturate to the
all-ones magnitude, sign kept), then reads the fields off the rounded value::

    k    = floor(log2 |v|), or emin = 1 - bias for |v| below the smallest normal (zero included)
    code = S << (e + m) | (k - emin) << m  +  |v| * 2**(m - k)

NaN has no code: ``encode`` raises ``ValueError`` (torchao silently returns a
finite code). With ``m = 0`` a tie (``0.75`` between ``0.5`` and ``1``) lies
between two exponent codes and goes to the even code (``0.5``), as everywhere in
quanta and as in torchao. Every format gives torchao's codes. ``decode`` is a table lookup, exact in float32.

torchao's fpx weights use one scale per row (:func:`row_scale`,
:func:`quantize_rows`, :func:`dequantize_rows`)::

    s = max(amax(|row|), 1e-12) / max       (float32, then the input's dtype)
    codes = encode(float32(x) / s),   x' = decode(codes) * float32(s)
"""

from __future__ import annotations

import functools

import torch

from quanta.grids.float import FloatFormat, SpecialValues
from quanta.kernels.float_cast import fake_cast

__all__ = ["fpx_format", "encode", "decode", "value_table", "row_scale", "quantize_rows", "dequantize_rows"]


def fpx_format(ebits: int, mbits: int) -> FloatFormat:
    """The ``1 + ebits + mbits``-bit format without inf/NaN codes (torchao's floatx).

    >>> fpx_format(3, 2).max, fpx_format(4, 3).max, fpx_format(5, 2).max
    (28.0, 480.0, 114688.0)
    >>> fpx_format(4, 4)
    Traceback (most recent call last):
    ...
    ValueError: 1 + ebits + mbits must be at most 8 (a code fits in a uint8), got ebits=4, mbits=4
    """
    for name, v in (("ebits", ebits), ("mbits", mbits)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {type(v).__name__} {v!r}")
    if ebits < 1 or mbits < 0:
        raise ValueError(f"need ebits >= 1 and mbits >= 0, got ebits={ebits}, mbits={mbits}")
    if 1 + ebits + mbits > 8:
        raise ValueError(
            f"1 + ebits + mbits must be at most 8 (a code fits in a uint8), got ebits={ebits}, mbits={mbits}"
        )
    return FloatFormat(ebits, mbits, SpecialValues.FINITE)


def _check_format(fmt: FloatFormat) -> None:
    if not isinstance(fmt, FloatFormat):
        raise TypeError(f"fmt must be a FloatFormat, got {type(fmt).__name__}")
    if fmt.special is not SpecialValues.FINITE or fmt.bits > 8:
        raise ValueError(
            f"codes are defined for formats of at most 8 bits without inf/NaN codes (SpecialValues.FINITE), "
            f"got {fmt}; for torch's float8 dtypes use tensor.view(torch.uint8)"
        )


@functools.lru_cache(maxsize=None)
def _table(fmt: FloatFormat) -> torch.Tensor:
    e, m, bias = fmt.exponent_bits, fmt.mantissa_bits, fmt.bias
    vals = []
    for code in range(2 ** fmt.bits):
        s, ef, mf = code >> (e + m), (code >> m) & ((1 << e) - 1), code & ((1 << m) - 1)
        mag = mf / 2**m * 2.0 ** (1 - bias) if ef == 0 else (1 + mf / 2**m) * 2.0 ** (ef - bias)
        vals.append(-mag if s else mag)
    return torch.tensor(vals, dtype=torch.float32)


def value_table(fmt: FloatFormat) -> torch.Tensor:
    """The value of every code ``0 .. 2**bits - 1`` of ``fmt``, as float32 (exact).

    >>> value_table(fpx_format(2, 1)).tolist()
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    """
    _check_format(fmt)
    return _table(fmt).clone()


def encode(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Round ``x`` to ``fmt`` (nearest, ties to even, saturating) and return the codes as ``uint8``.

    >>> encode(torch.tensor([0.25, 0.75, 2.5, -5.0, 100.0, -0.0]), fpx_format(2, 1)).tolist()
    [0, 2, 4, 14, 7, 8]
    >>> encode(torch.tensor([float("nan")]), fpx_format(2, 1))
    Traceback (most recent call last):
    ...
    ValueError: x contains 1 NaN value(s); float4_e2m1 has no NaN code (torchao would return a finite code silently)
    """
    _check_format(fmt)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    n_nan = int(torch.isnan(x).sum())
    if n_nan:
        raise ValueError(
            f"x contains {n_nan} NaN value(s); {fmt.name()} has no NaN code "
            "(torchao would return a finite code silently)"
        )
    v = fake_cast(x.to(torch.float64), fmt)
    a = v.abs()
    _, e = torch.frexp(a)  # a = f * 2**e, f in [0.5, 1): floor(log2 a) = e - 1
    k = torch.where(a < fmt.min_normal, fmt.emin, e - 1)  # zero and subnormals: emin
    m = fmt.mantissa_bits
    mag = ((k - fmt.emin) << m) + torch.ldexp(a, m - k).to(torch.int64)
    sign = torch.signbit(v).to(torch.int64) << (fmt.exponent_bits + m)
    return (sign | mag).to(torch.uint8)


def decode(codes: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """The float32 value of each code (an integer tensor, ``0 <= code < 2**bits``).

    >>> decode(torch.tensor([0, 2, 4, 15, 7, 8], dtype=torch.uint8), fpx_format(2, 1)).tolist()
    [0.0, 1.0, 2.0, -6.0, 6.0, -0.0]
    """
    _check_format(fmt)
    if not isinstance(codes, torch.Tensor):
        raise TypeError(f"codes must be a torch.Tensor, got {type(codes).__name__}")
    if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
        raise TypeError(f"codes must be an integer tensor (uint8), got dtype {codes.dtype}")
    idx = codes.to(torch.int64)
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= 2**fmt.bits):
        raise ValueError(
            f"codes of {fmt.name()} must lie in [0, {2**fmt.bits - 1}], got values in "
            f"[{int(idx.min())}, {int(idx.max())}]"
        )
    return _table(fmt).to(codes.device)[idx]


def _check_rows(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (one scale per row), got shape {tuple(t.shape)}")


def row_scale(x: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """One scale per row: ``max(amax(|row|), 1e-12) / fmt.max`` in float32, returned in ``x.dtype``.

    >>> row_scale(torch.tensor([[3.0, -6.0], [0.0, 0.0]]), fpx_format(2, 1))
    tensor([1.0000e+00, 1.6667e-13])
    """
    _check_format(fmt)
    _check_rows("x", x)
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}")
    return (x.float().abs().amax(1).clamp(min=1e-12) / fmt.max).to(x.dtype)


def quantize_rows(x: torch.Tensor, scale: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """``encode(float32(x) / s)`` with one scale per row of the 2-D ``x``.

    >>> quantize_rows(torch.tensor([[3.0, -6.0]]), torch.tensor([1.0]), fpx_format(2, 1)).tolist()
    [[5, 15]]
    """
    _check_rows("x", x)
    if scale.numel() != x.shape[0]:
        raise ValueError(f"scale must have one entry per row of x ({x.shape[0]}), got shape {tuple(scale.shape)}")
    return encode(x.float() / scale.view(-1, 1), fmt)


def dequantize_rows(codes: torch.Tensor, scale: torch.Tensor, fmt: FloatFormat,
                    output_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``decode(codes) * float32(s)`` per row, cast to ``output_dtype``.

    >>> dequantize_rows(torch.tensor([[5, 15]], dtype=torch.uint8), torch.tensor([0.5]), fpx_format(2, 1))
    tensor([[ 1.5000, -3.0000]])
    """
    _check_rows("codes", codes)
    if scale.numel() != codes.shape[0]:
        raise ValueError(
            f"scale must have one entry per row of codes ({codes.shape[0]}), got shape {tuple(scale.shape)}"
        )
    return (decode(codes, fmt) * scale.float().view(-1, 1)).to(output_dtype)
