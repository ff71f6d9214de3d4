"""Block-scaled formats: MX (OCP Microscaling v1.0) and NVFP4, as data: element format, block size, scale format.

A block-scaled tensor stores, for every ``block_size`` consecutive elements of its
last dimension, one shared scale ``X`` and the elements ``P_i`` in a narrow format;
the value of element ``i`` is ``X * P_i``.

* **MX** (OCP Microscaling Formats v1.0): ``X`` is an E8M0 power of two (one byte,
  ``X = 2**(code - 127)``, code 255 is NaN, no zero, no inf), 32 elements per block;
  elements fp8 e4m3 / e5m2, fp6 e2m3 / e3m2, fp4 e2m1, or int8 (two's complement
  with an implicit ``2**-6``: ``P = k / 64``, kept symmetric at ``|k| <= 127`` as the
  OCP reference library does).
* **NVFP4** (NVIDIA): fp4 e2m1 elements, an fp8 e4m3 scale per 16 elements, and an
  optional float32 scale per tensor: ``value = s_tensor * s_block * P``.

The shared exponent of an MX block follows one of torchao's
:class:`ScaleCalculationMode` rules (``amax`` is the block's largest magnitude,
``emax`` the exponent of the element format's largest power of two)::

    FLOOR  X = 2**(floor(log2(amax)) - emax)            (the OCP spec; may saturate the top of the block)
    CEIL   X = 2**(ceil(log2(amax)) - emax)
    EVEN   X = 2**(floor(log2(round(amax to the element's mantissa))) - emax)
    RCEIL  X = 2**ceil(log2(amax / max))                (NVIDIA's cuBLAS/TransformerEngine rule: never saturates)

The kernels that apply these rules are :mod:`quanta.kernels.block_scaled`.

>>> MXFP4.bits_per_element, NVFP4.bits_per_element, MXFP8_E4M3.bits_per_element
(4.25, 4.5, 8.25)
>>> MXFP8_E4M3.emax, MXFP6_E3M2.emax, MXFP4.emax, MXINT8.emax, MXINT8.element_max
(8, 4, 2, 0, 1.984375)
>>> mx_format("fp6_e2m3").name
'mxfp6_e2m3'
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Optional, Union

import torch

from quanta.grids.float import FLOAT8_E4M3FN, FLOAT8_E5M2, FP4_E2M1, FP6_E2M3, FP6_E3M2, FloatFormat

__all__ = [
    "ScaleCalculationMode",
    "BlockScaleKind",
    "BlockScaledFormat",
    "MXFP8_E4M3",
    "MXFP8_E5M2",
    "MXFP6_E2M3",
    "MXFP6_E3M2",
    "MXFP4",
    "MXINT8",
    "NVFP4",
    "MX_FORMATS",
    "BLOCK_SCALED_FORMATS",
    "DTYPE_FP6_E2M3",
    "DTYPE_FP6_E3M2",
    "E8M0_EXPONENT_BIAS",
    "E8M0_EXPONENT_NAN_VAL",
    "mx_format",
]

#: torchao's names of the fp6 element dtypes (torch has no fp6 dtype).
DTYPE_FP6_E2M3 = "fp6_e2m3"
DTYPE_FP6_E3M2 = "fp6_e3m2"
E8M0_EXPONENT_BIAS = 127
E8M0_EXPONENT_NAN_VAL = 255


class ScaleCalculationMode(enum.Enum):
    """How an MX block's shared exponent is chosen from its largest magnitude (torchao's enum, same values)."""

    FLOOR = "floor"
    RCEIL = "rceil"
    CEIL = "ceil"
    EVEN = "even"


class BlockScaleKind(enum.Enum):
    """The format of a block's scale: an E8M0 power of two (MX) or an fp8 e4m3 number (NVFP4)."""

    E8M0 = "e8m0"
    E4M3 = "e4m3"


@dataclass(frozen=True)
class BlockScaledFormat:
    """One block-scaled format: ``value = scale(block) * element``.

    Args:
        name: the format's name (``"mxfp4"``, ``"nvfp4"``...).
        element: the element's float format, or None for MXINT8's ``k / 64`` integers.
        element_bits: bits per stored element.
        block_size: elements per scale.
        scale_kind: :class:`BlockScaleKind`.
    """

    name: str
    element: Optional[FloatFormat]
    element_bits: int
    block_size: int
    scale_kind: BlockScaleKind

    @property
    def element_max(self) -> float:
        """The largest element magnitude (``127 / 64`` for int8)."""
        return 127 / 64 if self.element is None else self.element.max

    @property
    def emax(self) -> int:
        """``floor(log2(element_max))``: the exponent of the element's largest power of two."""
        return math.floor(math.log2(self.element_max))

    @property
    def mantissa_bits(self) -> int:
        """Mantissa bits of the element (int8: the 6 bits below the leading one of ``k / 64``)."""
        return 6 if self.element is None else self.element.mantissa_bits

    @property
    def bits_per_element(self) -> float:
        """Storage per element, the block's scale included (fp8 scales are 8 bits, as E8M0)."""
        return self.element_bits + 8 / self.block_size

    def with_block_size(self, block_size: int) -> "BlockScaledFormat":
        """The same format with another block size (torchao allows any block size dividing the last dimension)."""
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        return BlockScaledFormat(self.name, self.element, self.element_bits, block_size, self.scale_kind)


MXFP8_E4M3 = BlockScaledFormat("mxfp8_e4m3", FLOAT8_E4M3FN, 8, 32, BlockScaleKind.E8M0)
MXFP8_E5M2 = BlockScaledFormat("mxfp8_e5m2", FLOAT8_E5M2, 8, 32, BlockScaleKind.E8M0)
MXFP6_E2M3 = BlockScaledFormat("mxfp6_e2m3", FP6_E2M3, 6, 32, BlockScaleKind.E8M0)
MXFP6_E3M2 = BlockScaledFormat("mxfp6_e3m2", FP6_E3M2, 6, 32, BlockScaleKind.E8M0)
MXFP4 = BlockScaledFormat("mxfp4", FP4_E2M1, 4, 32, BlockScaleKind.E8M0)
MXINT8 = BlockScaledFormat("mxint8", None, 8, 32, BlockScaleKind.E8M0)
NVFP4 = BlockScaledFormat("nvfp4", FP4_E2M1, 4, 16, BlockScaleKind.E4M3)

#: torchao's ``elem_dtype`` values (plus ``torch.int8`` for MXINT8, which torchao lacks) -> MX format.
MX_FORMATS: dict[Union[torch.dtype, str], BlockScaledFormat] = {
    torch.float8_e4m3fn: MXFP8_E4M3,
    torch.float8_e5m2: MXFP8_E5M2,
    DTYPE_FP6_E2M3: MXFP6_E2M3,
    DTYPE_FP6_E3M2: MXFP6_E3M2,
    torch.float4_e2m1fn_x2: MXFP4,
    torch.int8: MXINT8,
}


#: every block-scaled format by name (``"mxfp4"``, ``"nvfp4"``...)
BLOCK_SCALED_FORMATS: dict[str, BlockScaledFormat] = {
    f.name: f for f in (MXFP8_E4M3, MXFP8_E5M2, MXFP6_E2M3, MXFP6_E3M2, MXFP4, MXINT8, NVFP4)}


def mx_format(elem_dtype: Union[torch.dtype, str], block_size: int = 32) -> BlockScaledFormat:
    """The MX format of torchao's ``elem_dtype`` with ``block_size`` elements per scale.

    >>> mx_format(torch.float4_e2m1fn_x2, 16).block_size
    16
    >>> mx_format(torch.float16)
    Traceback (most recent call last):
    ...
    ValueError: elem_dtype must be one of torch.float8_e4m3fn, torch.float8_e5m2, 'fp6_e2m3', 'fp6_e3m2', \
torch.float4_e2m1fn_x2, torch.int8; got torch.float16
    """
    try:
        fmt = MX_FORMATS[elem_dtype]
    except (KeyError, TypeError):
        known = ", ".join(repr(k) if isinstance(k, str) else str(k) for k in MX_FORMATS)
        raise ValueError(f"elem_dtype must be one of {known}; got {elem_dtype!r}") from None
    return fmt if block_size == fmt.block_size else fmt.with_block_size(block_size)
