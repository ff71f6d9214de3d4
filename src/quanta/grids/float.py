"""Floating-point formats: any exponent/mantissa split and its special-value convention.

A :class:`FloatFormat` is ``1`` sign bit, ``exponent_bits`` and ``mantissa_bits``,
plus how the format spends its special codes (:class:`SpecialValues`):

* ``IEEE``: the all-ones exponent holds inf and NaN (float16, bfloat16, float8_e5m2);
  ``max = (2 - 2**-m) * 2**(2**e - 2 - bias)``.
* ``FINITE_NAN``: no inf; only the all-ones code is NaN (OCP float8_e4m3fn);
  ``max = (2 - 2**(1-m)) * 2**(2**e - 1 - bias)``.
* ``FINITE``: no inf, no NaN: every code is a number (OCP MX fp6 e3m2/e2m3, fp4 e2m1);
  ``max = (2 - 2**-m) * 2**(2**e - 1 - bias)``.
* ``UNSIGNED_ZERO``: no inf, no negative zero; its code is NaN (float8_e4m3fnuz,
  float8_e5m2fnuz), and the bias is one larger.
* ``AIMET``: AIMET's grid for ``FloatQuantizeDequantize(e, m)`` (not ``finite``)
  when torch has no such dtype: IEEE's largest value, but every code is a number
  (no inf/NaN) and the bias is one larger, so the grid reaches one binade lower
  than IEEE's (e2m1: ``{0, 1/4, 1/2, 3/4, 1, 3/2, 2, 3}``);
  ``max = (2 - 2**-m) * 2**(2**e - 1 - bias)``, the same as IEEE's.

``bias = 2**(e-1) - 1`` (``2**(e-1)`` for UNSIGNED_ZERO and AIMET). Subnormals are
always present: the smallest step is ``2**(1 - bias - m)``.

>>> FLOAT8_E4M3FN.max, FLOAT8_E5M2.max, FLOAT8_E4M3FNUZ.max, FP4_E2M1.max, FP6_E3M2.max
(448.0, 57344.0, 240.0, 6.0, 28.0)
>>> FloatFormat.from_aimet(4, 3, finite=True, unsigned_zero=False) == FLOAT8_E4M3FN
True
>>> FloatFormat.from_aimet(2, 1).finite_values()[8:].tolist()
[0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0]
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

__all__ = [
    "SpecialValues",
    "FloatFormat",
    "FLOAT8_E4M3FN",
    "FLOAT8_E5M2",
    "FLOAT8_E4M3FNUZ",
    "FLOAT8_E5M2FNUZ",
    "FP6_E3M2",
    "FP6_E2M3",
    "FP4_E2M1",
    "BFLOAT16",
    "FLOAT16",
    "PRESETS",
    "FormatProperties",
]


class SpecialValues(enum.Enum):
    """How a float format uses its special codes."""

    IEEE = "ieee"
    FINITE_NAN = "fn"
    FINITE = "finite"
    UNSIGNED_ZERO = "fnuz"
    AIMET = "aimet"


@dataclass(frozen=True)
class FloatFormat:
    """A floating-point format with ``exponent_bits`` (1–8) and ``mantissa_bits`` (0–23).

    >>> f = FloatFormat(4, 3, SpecialValues.FINITE_NAN)
    >>> f.bias, f.min_normal, f.min_subnormal, f.max
    (7, 0.015625, 0.001953125, 448.0)
    """

    exponent_bits: int
    mantissa_bits: int
    special: SpecialValues = SpecialValues.IEEE

    def __post_init__(self) -> None:
        for name, value, lo, hi in (("exponent_bits", self.exponent_bits, 1, 8),
                                    ("mantissa_bits", self.mantissa_bits, 0, 23)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
            if not lo <= value <= hi:
                raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
        if not isinstance(self.special, SpecialValues):
            raise TypeError(f"special must be a SpecialValues member, got {self.special!r}")
        if self.special is SpecialValues.IEEE and self.exponent_bits < 2:
            raise ValueError("an IEEE format needs at least 2 exponent bits (one code is reserved for inf/NaN)")
        if self.special is SpecialValues.FINITE_NAN and self.mantissa_bits == 0 and self.exponent_bits == 1:
            raise ValueError("a FINITE_NAN format needs room for the NaN code")

    # -- construction --------------------------------------------------------------
    @classmethod
    def from_aimet(cls, exponent_bits: int, mantissa_bits: int, finite: bool = False,
                   unsigned_zero: bool = False) -> "FloatFormat":
        """The format AIMET gives ``(exponent_bits, mantissa_bits, finite, unsigned_zero)``.

        ``finite=True`` means no inf: for 8-bit and wider formats the all-ones code
        is NaN (OCP ``e4m3fn``); narrower ones have no NaN at all (OCP MX fp6/fp4).
        ``unsigned_zero=True`` (with ``finite=True``) is the ``fnuz`` convention.
        Not ``finite``: torch's IEEE dtype where there is one (float16, bfloat16,
        float8_e5m2: AIMET casts to it), else AIMET's own grid (:attr:`SpecialValues.AIMET`:
        aimet-torch's ``fake_cast_to_ieee_float``, whose bias comes out one larger
        than IEEE's).

        >>> FloatFormat.from_aimet(4, 3).min_subnormal, FloatFormat.from_aimet(5, 2) == FLOAT8_E5M2
        (0.0009765625, True)
        """
        for name, v in (("finite", finite), ("unsigned_zero", unsigned_zero)):
            if not isinstance(v, bool):
                raise TypeError(f"{name} must be a bool, got {v!r}")
        if unsigned_zero and not finite:
            raise ValueError("unsigned_zero=True requires finite=True (the fnuz formats have no inf)")
        if unsigned_zero:
            special = SpecialValues.UNSIGNED_ZERO
        elif finite:
            special = SpecialValues.FINITE_NAN if 1 + exponent_bits + mantissa_bits >= 8 else SpecialValues.FINITE
        else:
            ieee = cls(exponent_bits, mantissa_bits, SpecialValues.IEEE) if exponent_bits >= 2 else None
            special = SpecialValues.IEEE if ieee is not None and ieee.torch_dtype is not None else SpecialValues.AIMET
        return cls(exponent_bits, mantissa_bits, special)

    @classmethod
    def from_torch_dtype(cls, dtype: torch.dtype) -> "FloatFormat":
        """The format of a torch floating dtype (float16, bfloat16, the float8 types).

        >>> FloatFormat.from_torch_dtype(torch.float8_e5m2)
        FloatFormat(exponent_bits=5, mantissa_bits=2, special=<SpecialValues.IEEE: 'ieee'>)
        """
        for fmt, dt in _TORCH_DTYPES.items():
            if dt == dtype:
                return fmt
        raise ValueError(f"dtype must be one of {sorted(str(d) for d in _TORCH_DTYPES.values())}, got {dtype}")

    @property
    def torch_dtype(self) -> torch.dtype | None:
        """The torch dtype with exactly this format, if torch has one."""
        return _TORCH_DTYPES.get(self)

    # -- numbers ---------------------------------------------------------------------
    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        b = 2 ** (self.exponent_bits - 1) - 1
        return b + 1 if self.special in (SpecialValues.UNSIGNED_ZERO, SpecialValues.AIMET) else b

    @property
    def emin(self) -> int:
        """Exponent of the smallest normal number."""
        return 1 - self.bias

    @property
    def emax(self) -> int:
        """Exponent of the largest finite number."""
        top = 2**self.exponent_bits - 1
        return (top - 1 if self.special is SpecialValues.IEEE else top) - self.bias

    @property
    def max(self) -> float:
        """Largest finite value."""
        m = self.mantissa_bits
        if self.special is SpecialValues.FINITE_NAN:
            frac = 2 - 2.0 ** (1 - m) if m > 0 else 1.0
            if m == 0:  # all-ones exponent is NaN: the largest number sits one exponent lower
                return 2.0 ** (self.emax - 1)
            return frac * 2.0**self.emax
        return (2 - 2.0**-m) * 2.0**self.emax

    @property
    def min_normal(self) -> float:
        return 2.0**self.emin

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.mantissa_bits)

    @property
    def has_nan(self) -> bool:
        """Whether a code means NaN (every format's kernels keep a NaN input NaN regardless)."""
        return self.special not in (SpecialValues.FINITE, SpecialValues.AIMET)

    @property
    def has_negative_zero(self) -> bool:
        return self.special is not SpecialValues.UNSIGNED_ZERO

    @property
    def exponent_ties_up(self) -> bool:
        """With 0 mantissa bits, whether a tie ``1.5 * 2**k`` goes up to ``2**(k+1)``.

        IEEE's ties-to-even takes the even code (the even exponent); AIMET rounds the
        significand 1.5 half to even, i.e. up (as torch's float8_e8m0fnu cast does).
        True for :attr:`SpecialValues.AIMET` only; with mantissa bits the rules agree.
        """
        return self.special is SpecialValues.AIMET

    def name(self) -> str:
        """``float8_e4m3fn``-style name (torch's name where torch has the dtype).

        >>> FP6_E2M3.name(), BFLOAT16.name()
        ('float6_e2m3', 'bfloat16')
        """
        if self.torch_dtype is not None:
            return str(self.torch_dtype).removeprefix("torch.")
        suffix = {SpecialValues.IEEE: "", SpecialValues.FINITE_NAN: "fn", SpecialValues.FINITE: "",
                  SpecialValues.UNSIGNED_ZERO: "fnuz", SpecialValues.AIMET: "_aimet"}[self.special]
        return f"float{self.bits}_e{self.exponent_bits}m{self.mantissa_bits}{suffix}"

    def finite_values(self) -> torch.Tensor:
        """Every finite value of the format, ascending, as float64 (for formats up to 16 bits).

        Built from the definition (sign, exponent, mantissa), independently of the kernels.

        >>> FP4_E2M1.finite_values().tolist()
        [-6.0, -4.0, -3.0, -2.0, -1.5, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
        """
        if self.bits > 16:
            raise ValueError(f"{self.name()} has too many values to list")
        vals = []
        m = self.mantissa_bits
        for e_field in range(2**self.exponent_bits):
            for m_field in range(2**m):
                if e_field == 0:
                    v = m_field * 2.0 ** (self.emin - m)
                else:
                    v = (1 + m_field / 2**m) * 2.0 ** (e_field - self.bias)
                if v <= self.max:
                    vals.append(v)
        pos = torch.tensor(sorted(set(vals)), dtype=torch.float64)
        neg = -pos.flip(0)
        if not self.has_negative_zero:
            neg = neg[:-1]  # no -0.0
        return torch.cat([neg, pos])


FLOAT8_E4M3FN = FloatFormat(4, 3, SpecialValues.FINITE_NAN)
FLOAT8_E5M2 = FloatFormat(5, 2, SpecialValues.IEEE)
FLOAT8_E4M3FNUZ = FloatFormat(4, 3, SpecialValues.UNSIGNED_ZERO)
FLOAT8_E5M2FNUZ = FloatFormat(5, 2, SpecialValues.UNSIGNED_ZERO)
FP6_E3M2 = FloatFormat(3, 2, SpecialValues.FINITE)
FP6_E2M3 = FloatFormat(2, 3, SpecialValues.FINITE)
FP4_E2M1 = FloatFormat(2, 1, SpecialValues.FINITE)
BFLOAT16 = FloatFormat(8, 7, SpecialValues.IEEE)
FLOAT16 = FloatFormat(5, 10, SpecialValues.IEEE)

_TORCH_DTYPES: dict[FloatFormat, torch.dtype] = {
    FLOAT16: torch.float16,
    BFLOAT16: torch.bfloat16,
    FLOAT8_E4M3FN: torch.float8_e4m3fn,
    FLOAT8_E5M2: torch.float8_e5m2,
    FLOAT8_E4M3FNUZ: torch.float8_e4m3fnuz,
    FLOAT8_E5M2FNUZ: torch.float8_e5m2fnuz,
}

#: Named presets.
PRESETS: dict[str, FloatFormat] = {f.name(): f for f in (
    FLOAT8_E4M3FN, FLOAT8_E5M2, FLOAT8_E4M3FNUZ, FLOAT8_E5M2FNUZ, FP6_E3M2, FP6_E2M3, FP4_E2M1, BFLOAT16, FLOAT16)}


class FormatProperties:
    """Mixin for objects with a float ``format``: AIMET's attribute names for it."""

    format: FloatFormat

    @property
    def exponent_bits(self) -> int:
        return self.format.exponent_bits

    @property
    def mantissa_bits(self) -> int:
        return self.format.mantissa_bits

    @property
    def bitwidth(self) -> int:
        """Bits per value (sign + exponent + mantissa)."""
        return self.format.bits
