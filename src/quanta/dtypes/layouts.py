"""Storage layouts of :class:`~quanta.dtypes.AffineQuantizedTensor` (torchao's names).

A layout says how the codes are kept in memory, nothing about their values:
``PlainLayout`` (one integer per element), ``UintxLayout`` (1–7-bit codes
packed densely, 8 codes in ``bits`` bytes), ``Float8Layout`` (torch float8
elements), ``FloatxTensorCoreLayout`` (fpx codes of ``1 + ebits + mbits`` bits,
packed like ``UintxLayout``) and ``Int4CPULayout`` (the packed int4 format of
quanta's CPU kernel, :func:`quanta.kernels.int_linear.pack_int4_cpu`). Layouts are frozen value
objects, so they compare by value and are safe to share.

>>> UintxLayout(torch.uint4)
UintxLayout(dtype=torch.uint4, pack_dim=-1)
>>> UintxLayout(torch.int4).bits, FloatxTensorCoreLayout(3, 2).bits
(4, 6)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

__all__ = [
    "Layout",
    "PlainLayout",
    "UintxLayout",
    "Float8Layout",
    "FloatxTensorCoreLayout",
    "Int4CPULayout",
    "SUB_BYTE_DTYPES",
]

# torch's 1–7-bit dtypes (storage only: they have no arithmetic, quanta keeps their codes packed in uint8)
SUB_BYTE_DTYPES: dict[torch.dtype, tuple[int, bool]] = {
    **{getattr(torch, f"uint{b}"): (b, False) for b in range(1, 8)},
    **{getattr(torch, f"int{b}"): (b, True) for b in range(1, 8)},
}


@dataclass(frozen=True)
class Layout:
    """Base class of storage layouts."""

    def extra_repr(self) -> str:
        return ""


@dataclass(frozen=True)
class PlainLayout(Layout):
    """One code per element in a plain integer tensor (``int8``, ``uint8``, ``int16``, ``int32``...)."""


@dataclass(frozen=True)
class UintxLayout(Layout):
    """Codes of 1–7 bits packed along the last dimension, ``ceil(n * bits / 8)`` bytes a row.

    ``dtype`` is one of ``torch.uint1 … torch.uint7`` or ``torch.int1 … torch.int7``;
    signed codes are stored offset by ``2**(bits-1)``. An int4 weight therefore
    takes half a byte per element (plus its scales). ``pack_dim`` must be -1
    (the last dimension), as torchao's default.
    """

    dtype: torch.dtype
    pack_dim: int = -1

    def __post_init__(self) -> None:
        if self.dtype not in SUB_BYTE_DTYPES:
            raise ValueError(f"UintxLayout dtype must be one of torch.uint1..uint7 or torch.int1..int7, "
                             f"got {self.dtype}")
        if self.pack_dim != -1:
            raise ValueError(f"UintxLayout packs along the last dimension only: pack_dim must be -1, "
                             f"got {self.pack_dim}")

    @property
    def bits(self) -> int:
        return SUB_BYTE_DTYPES[self.dtype][0]

    @property
    def signed(self) -> bool:
        return SUB_BYTE_DTYPES[self.dtype][1]

    @property
    def code_range(self) -> tuple[int, int]:
        """``(lo, hi)`` of the values held; stored codes are ``value - lo``.

        >>> UintxLayout(torch.int4).code_range, UintxLayout(torch.uint3).code_range
        ((-8, 7), (0, 7))
        """
        lo = -(1 << (self.bits - 1)) if self.signed else 0
        return lo, lo + (1 << self.bits) - 1


@dataclass(frozen=True)
class Float8Layout(Layout):
    """Elements stored as torch float8 (``float8_e4m3fn``, ``float8_e5m2``...) with float32 scales.

    ``mm_config`` is accepted for torchao compatibility; quanta's CPU matmul does not use it.
    """

    mm_config: Optional[object] = None


@dataclass(frozen=True)
class FloatxTensorCoreLayout(Layout):
    """fpx codes (sign, ``ebits`` exponent, ``mbits`` mantissa bits; no inf/NaN codes) packed densely.

    Scales are one per row. torchao's layout of the same name packs for CUDA
    tensor cores; quanta packs the ``1 + ebits + mbits``-bit codes along the
    last dimension as :class:`UintxLayout` does (8 codes in ``bits`` bytes).
    """

    ebits: int
    mbits: int

    def __post_init__(self) -> None:
        for name, v, lo in (("ebits", self.ebits, 1), ("mbits", self.mbits, 0)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"FloatxTensorCoreLayout {name} must be an int, got {v!r}")
            if v < lo:
                raise ValueError(f"FloatxTensorCoreLayout {name} must be >= {lo}, got {v}")
        if 1 + self.ebits + self.mbits > 8:
            raise ValueError(f"FloatxTensorCoreLayout holds at most 8-bit codes: 1 + ebits + mbits = "
                             f"{1 + self.ebits + self.mbits}")

    @property
    def bits(self) -> int:
        return 1 + self.ebits + self.mbits


@dataclass(frozen=True)
class Int4CPULayout(Layout):
    """Packed uint4 codes for quanta's int4 CPU kernel (:func:`quanta.kernels.int_linear.int4_cpu_linear`; 2-D weights only).

    Holds ``(code - 8) * scale + zero`` weights (zero point in the float domain,
    torchao's tinygemm convention) with one scale/zero per ``group_size``
    elements of a row, stored together as bf16 ``[ceil(N / 16), ceil(K / group_size), 2, 16]``
    beside the codes in tiles of 16 rows (:func:`quanta.kernels.int_linear.pack_int4_cpu`).
    """
