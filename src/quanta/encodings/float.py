"""The float encoding: a scale and a float format (fake-cast quantization)."""

from __future__ import annotations

from typing import Any

import torch

from quanta.encodings.granularity import granularity
from quanta.grids.float import FloatFormat, FormatProperties, SpecialValues
from quanta.kernels import float_cast as kernels
from quanta.kernels.blocks import check_block_size

__all__ = ["FloatEncoding"]

_STANDARD = (torch.float32, torch.float64)


class FloatEncoding(FormatProperties):
    """``QDQ(x) = cast(x / scale) * scale`` onto a :class:`FloatFormat`.

    ``scale = maxval / format.max``: the value that maps to the format's largest
    number. With ``scale == 1`` the encoding is a plain cast.

    >>> from quanta.grids.float import FLOAT8_E4M3FN
    >>> enc = FloatEncoding(torch.tensor(1.0), FLOAT8_E4M3FN)
    >>> enc.quantize_dequantize(torch.tensor([0.3, 500.0])).tolist()
    [0.3125, 448.0]
    >>> enc.maxval
    tensor(448.)
    """

    def __init__(self, scale: torch.Tensor, format: FloatFormat, block_size: tuple[int, ...] | None = None) -> None:
        if not isinstance(scale, torch.Tensor) or not scale.is_floating_point():
            raise TypeError(f"scale must be a floating-point tensor, got {scale!r}")
        if not isinstance(format, FloatFormat):
            raise TypeError(f"format must be a FloatFormat, got {type(format).__name__}")
        self.scale = scale
        self.format = format
        self.block_size = check_block_size(block_size)

    @property
    def maxval(self) -> torch.Tensor:
        return self.scale * self.format.max

    @property
    def dtype(self) -> torch.dtype | None:
        """The torch dtype of :meth:`quantized_repr`, if torch has this format."""
        return self.format.torch_dtype

    @property
    def granularity(self) -> str:
        """``"per_tensor"``, ``"per_channel"`` or ``"per_block"``."""
        return granularity(self.scale, self.block_size)

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """Values of the format, ``cast(x / scale)`` (float32, or float64 for float64 input)."""
        return kernels.quantize(x, self.scale, self.format, self.block_size)

    def dequantize(self, q: torch.Tensor) -> torch.Tensor:
        return kernels.dequantize(q, self.scale, self.block_size)

    def quantize_dequantize(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.quantize_dequantize(x, self.scale, self.format, self.block_size)

    def quantized_repr(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` in the torch dtype of the format; ValueError if torch has none."""
        if self.dtype is None:
            raise ValueError(f"torch has no dtype for {self.format.name()}; use .quantize() for its values")
        return values.to(self.dtype)

    def holds_in(self, dtype: torch.dtype) -> bool:
        """True if ``dtype`` represents every value of the format (so a cast keeps the encoding)."""
        if dtype in _STANDARD:
            return True
        try:
            other = FloatFormat.from_torch_dtype(dtype)
        except ValueError:
            return False
        return (other.exponent_bits >= self.format.exponent_bits
                and other.mantissa_bits >= self.format.mantissa_bits)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale.detach().cpu().tolist(),
            "shape": list(self.scale.shape),
            "exponent_bits": self.format.exponent_bits,
            "mantissa_bits": self.format.mantissa_bits,
            "special": self.format.special.value,
            "block_size": list(self.block_size) if self.block_size is not None else None,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FloatEncoding":
        if not isinstance(d, dict):
            raise TypeError(f"encoding must be a dict, got {type(d).__name__}")
        for key in ("scale", "shape", "exponent_bits", "mantissa_bits", "special"):
            if key not in d:
                raise ValueError(f"float encoding dict is missing key {key!r}")
        try:
            scale = torch.tensor(d["scale"], dtype=torch.float32).reshape(tuple(int(s) for s in d["shape"]))
            special = SpecialValues(d["special"])
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"float encoding dict is malformed: {e}") from None
        block = d.get("block_size")
        return cls(scale, FloatFormat(d["exponent_bits"], d["mantissa_bits"], special),
                   tuple(block) if block else None)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FloatEncoding):
            return NotImplemented
        return (self.format == other.format and self.block_size == other.block_size
                and self.scale.shape == other.scale.shape
                and torch.equal(self.scale.detach(), other.scale.detach()))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        block = f", block_size={self.block_size}" if self.block_size is not None else ""
        return f"FloatEncoding({self.format.name()}, shape={tuple(self.scale.shape)}{block}, scale={self.scale.detach()})"
