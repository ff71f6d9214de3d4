"""Integer quantization grids: the set ``{qmin, qmin + 1, ..., qmax}``.

A grid is described in one of three equivalent ways, as in AIMET:

* ``bitwidth`` and ``signed``: ``[-2**(b-1), 2**(b-1) - 1]`` or ``[0, 2**b - 1]``;
* ``num_steps`` and ``signed``: ``[-ceil(n/2), floor(n/2)]`` or ``[0, n]``;
* explicit ``qmin`` and ``qmax``.

All bounds are computed with Python integers, so 32-bit (and wider) grids are
exact; nothing here goes through floating point.

>>> IntegerGrid.from_bitwidth(8, signed=True)
IntegerGrid(qmin=-128, qmax=127)
>>> IntegerGrid.from_num_steps(15)
IntegerGrid(qmin=0, qmax=15)
>>> IntegerGrid(0, 15).bitwidth
4
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["IntegerGrid", "MAX_BITWIDTH", "resolve_grid", "GridProperties"]

#: Widest grid accepted by the AIMET-style API. 32 bits covers int32/uint32 codes.
MAX_BITWIDTH = 32

# Integer dtypes tried, smallest first, for the compact representation of codes:
# unsigned grids get unsigned dtypes (as AIMET's uint8 for [0, 255] and [0, 15]).
_SIGNED_CODE_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64)
_UNSIGNED_CODE_DTYPES = (torch.uint8, torch.uint16, torch.uint32, torch.uint64)

# Largest |value| for which float32 arithmetic on codes is exact *and* a float32
# dequantized value quantizes back to the same code (relative error 2**-23 of a
# value below 2**21 stays under half a step). Wider grids compute in float64.
_FLOAT32_EXACT_CODE_LIMIT = 2**21


def _check_int(name: str, value: object) -> int:
    # bool is an int subclass, but True as a bitwidth is a bug, not a request for 1 bit.
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
            return int(value.item())
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    return value


@dataclass(frozen=True)
class IntegerGrid:
    """The integer grid ``[qmin, qmax]`` that quantized values live on.

    Args:
        qmin: smallest code.
        qmax: largest code; must be greater than ``qmin``.

    >>> g = IntegerGrid(-8, 7)
    >>> g.num_steps, g.signed, g.bitwidth
    (15, True, 4)
    """

    qmin: int
    qmax: int

    def __post_init__(self) -> None:
        qmin = _check_int("qmin", self.qmin)
        qmax = _check_int("qmax", self.qmax)
        if qmin >= qmax:
            raise ValueError(f"qmin must be less than qmax, got qmin={qmin}, qmax={qmax}")
        if qmin < -(2**63) or qmax > 2**64 - 1:
            raise ValueError(f"grid [{qmin}, {qmax}] does not fit in 64-bit integers")
        object.__setattr__(self, "qmin", qmin)
        object.__setattr__(self, "qmax", qmax)

    @classmethod
    def from_bitwidth(cls, bitwidth: int, signed: bool = False) -> "IntegerGrid":
        """Grid of a ``bitwidth``-bit integer, two's complement if ``signed``.

        >>> IntegerGrid.from_bitwidth(4)
        IntegerGrid(qmin=0, qmax=15)
        >>> IntegerGrid.from_bitwidth(32, signed=True)
        IntegerGrid(qmin=-2147483648, qmax=2147483647)
        """
        bitwidth = _check_int("bitwidth", bitwidth)
        if not 1 <= bitwidth <= MAX_BITWIDTH:
            raise ValueError(f"bitwidth must be in [1, {MAX_BITWIDTH}], got {bitwidth}")
        signed = _check_bool("signed", signed)
        if signed:
            return cls(-(2 ** (bitwidth - 1)), 2 ** (bitwidth - 1) - 1)
        return cls(0, 2**bitwidth - 1)

    @classmethod
    def from_num_steps(cls, num_steps: int, signed: bool = False) -> "IntegerGrid":
        """Grid with ``num_steps`` steps: ``[-ceil(n/2), floor(n/2)]`` or ``[0, n]``.

        >>> IntegerGrid.from_num_steps(255, signed=True)
        IntegerGrid(qmin=-128, qmax=127)
        """
        num_steps = _check_int("num_steps", num_steps)
        if not 1 <= num_steps <= 2**MAX_BITWIDTH - 1:
            raise ValueError(f"num_steps must be in [1, 2**{MAX_BITWIDTH} - 1], got {num_steps}")
        signed = _check_bool("signed", signed)
        if signed:
            return cls(-((num_steps + 1) // 2), num_steps // 2)
        return cls(0, num_steps)

    @property
    def num_steps(self) -> int:
        """``qmax - qmin``: the number of steps between the smallest and largest code."""
        return self.qmax - self.qmin

    @property
    def signed(self) -> bool:
        """True if the grid holds negative codes."""
        return self.qmin < 0

    @property
    def bitwidth(self) -> int:
        """Bits needed to store a code: ``ceil(log2(qmax - qmin + 1))``."""
        return max(1, math.ceil(math.log2(self.num_steps + 1)))

    @property
    def code_dtype(self) -> torch.dtype:
        """Smallest torch integer dtype that holds every code of the grid.

        Unsigned for grids without negative codes, signed otherwise.

        >>> IntegerGrid(0, 65535).code_dtype
        torch.uint16
        >>> IntegerGrid(-8, 7).code_dtype
        torch.int8
        """
        for dtype in _SIGNED_CODE_DTYPES if self.signed else _UNSIGNED_CODE_DTYPES:
            info = torch.iinfo(dtype)
            if info.min <= self.qmin and self.qmax <= info.max:
                return dtype
        raise ValueError(f"no integer dtype holds the grid [{self.qmin}, {self.qmax}]")

    def compute_dtype(self, input_dtype: torch.dtype) -> torch.dtype:
        """Float dtype in which the kernels quantize inputs of ``input_dtype``.

        float64 inputs, and grids too wide for float32 to hold every code exactly
        (beyond 2**21 in magnitude), use float64; everything else (float32,
        float16, bfloat16) uses float32 so half-precision inputs never lose a
        code to their short mantissa.
        """
        wide = max(abs(self.qmin), abs(self.qmax), self.num_steps) > _FLOAT32_EXACT_CODE_LIMIT
        if input_dtype == torch.float64 or wide:
            return torch.float64
        return torch.float32

    def __str__(self) -> str:
        return f"[{self.qmin}, {self.qmax}]"


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return value


def resolve_grid(
    bitwidth: int | None = None,
    signed: bool | None = None,
    *,
    num_steps: int | None = None,
    qmin: int | None = None,
    qmax: int | None = None,
) -> IntegerGrid:
    """Build an :class:`IntegerGrid` from exactly one of the three descriptions.

    ``signed`` defaults to False and is only meaningful with ``bitwidth`` or
    ``num_steps``.

    >>> resolve_grid(4)
    IntegerGrid(qmin=0, qmax=15)
    >>> resolve_grid(num_steps=15, signed=True)
    IntegerGrid(qmin=-8, qmax=7)
    >>> resolve_grid(qmin=-1, qmax=1)
    IntegerGrid(qmin=-1, qmax=1)
    """
    given = [name for name, v in (("bitwidth", bitwidth), ("num_steps", num_steps)) if v is not None]
    has_range = qmin is not None or qmax is not None
    if has_range:
        given.append("qmin/qmax")
    if len(given) != 1:
        raise TypeError(
            "give exactly one of bitwidth (with optional signed), num_steps (with optional signed), "
            f"or qmin and qmax; got {', '.join(given) if given else 'none of them'}"
        )
    if has_range:
        if qmin is None or qmax is None:
            raise TypeError(f"qmin and qmax must be given together, got qmin={qmin!r}, qmax={qmax!r}")
        if signed is not None:
            raise TypeError("signed cannot be combined with qmin/qmax; the range already says it")
        return IntegerGrid(qmin, qmax)
    signed = False if signed is None else signed
    if bitwidth is not None:
        return IntegerGrid.from_bitwidth(bitwidth, signed)
    assert num_steps is not None
    return IntegerGrid.from_num_steps(num_steps, signed)


class GridProperties:
    """Mixin for objects with a ``grid``: exposes its bounds under AIMET's attribute names."""

    grid: IntegerGrid

    @property
    def qmin(self) -> int:
        return self.grid.qmin

    @property
    def qmax(self) -> int:
        return self.grid.qmax

    @property
    def num_steps(self) -> int:
        return self.grid.num_steps

    @property
    def bitwidth(self) -> int:
        """Bits per code (``ceil(log2(qmax - qmin + 1))``)."""
        return self.grid.bitwidth

    @property
    def signed(self) -> bool:
        return self.grid.signed
