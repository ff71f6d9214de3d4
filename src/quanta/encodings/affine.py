"""The affine encoding: everything needed to map codes back to real values.

An :class:`AffineEncoding` is a small value object (scale, offset, integer grid,
block size). Quantized tensors carry one; quantizers produce one. It owns no
numerics: it hands its parameters to :mod:`quanta.kernels.affine`.
"""

from __future__ import annotations

from typing import Any

import torch

from quanta.encodings.granularity import granularity
from quanta.grids.affine import GridProperties, IntegerGrid
from quanta.kernels import affine as kernels
from quanta.kernels.blocks import check_block_size

__all__ = ["AffineEncoding"]


class AffineEncoding(GridProperties):
    """Scale and offset of an affine quantization on an integer grid.

    ``Q(x) = clamp(round(x/scale) - offset, qmin, qmax)``,
    ``DQ(q) = (q + offset) * scale``. ``offset`` is ``-zero_point``.

    Args:
        scale: positive scale tensor (its shape is the granularity).
        offset: offset tensor, broadcastable to ``scale``.
        grid: the integer grid, or a bitwidth (with ``signed``).
        signed: with an int ``grid`` (bitwidth): signed two's complement grid.
        block_size: block size per scale dimension, ``-1`` = wildcard, or None.

    >>> enc = AffineEncoding(torch.tensor(0.1), torch.tensor(0.0), 8, signed=True)
    >>> enc.qmin, enc.qmax, enc.bitwidth, enc.signed, enc.dtype
    (-128, 127, 8, True, torch.int8)
    >>> enc.quantize(torch.tensor([0.26, -20.0]))
    tensor([   3., -128.])
    """

    def __init__(
        self,
        scale: torch.Tensor,
        offset: torch.Tensor,
        grid: IntegerGrid | int,
        signed: bool = False,
        block_size: tuple[int, ...] | None = None,
    ) -> None:
        if not isinstance(scale, torch.Tensor) or not scale.is_floating_point():
            raise TypeError(f"scale must be a floating-point tensor, got {scale!r}")
        if not isinstance(offset, torch.Tensor):
            raise TypeError(f"offset must be a tensor, got {type(offset).__name__}")
        if not isinstance(grid, IntegerGrid):
            grid = IntegerGrid.from_bitwidth(grid, signed)
        self.scale = scale
        self.offset = offset
        self.grid = grid
        self.block_size = check_block_size(block_size)

    @property
    def dtype(self) -> torch.dtype:
        """Integer dtype of :meth:`QuantizedTensor.quantized_repr`: the smallest that holds the grid."""
        return self.grid.code_dtype

    @property
    def granularity(self) -> str:
        """``"per_tensor"``, ``"per_channel"`` or ``"per_block"`` (for reports and export)."""
        return granularity(self.scale, self.block_size)

    @property
    def min(self) -> torch.Tensor:
        """Smallest representable value, ``scale * (offset + qmin)``."""
        return self.scale * (self.offset + self.qmin)

    @property
    def max(self) -> torch.Tensor:
        """Largest representable value, ``scale * (offset + qmax)``."""
        return self.scale * (self.offset + self.qmax)

    # -- numerics, delegated to the kernel layer -------------------------------
    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """Codes of ``x`` as floats (see :func:`quanta.kernels.affine.quantize`)."""
        return kernels.quantize(x, self.scale, self.offset, self.grid, self.block_size)

    def dequantize(self, q: torch.Tensor) -> torch.Tensor:
        """Real values of codes ``q``, in ``q``'s (float) dtype."""
        return kernels.dequantize(q, self.scale, self.offset, self.block_size)

    def quantize_dequantize(self, x: torch.Tensor) -> torch.Tensor:
        """Fake-quantized ``x``."""
        return kernels.quantize_dequantize(x, self.scale, self.offset, self.grid, self.block_size)

    def quantized_repr(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes`` as integers of :attr:`dtype`; ValueError for NaN (no integer holds it)."""
        if torch.isnan(codes).any():
            raise ValueError("quantized_repr(): the tensor holds NaN, which has no integer code")
        return codes.to(self.dtype)

    def holds_in(self, dtype: torch.dtype) -> bool:
        """True if float ``dtype`` holds every code of the grid exactly (so a cast keeps the encoding)."""
        return dtype.is_floating_point and kernels.codes_dtype(dtype, self.grid) == dtype

    # -- conversions -----------------------------------------------------------
    def to(self, *args: Any, **kwargs: Any) -> "AffineEncoding":
        """Move scale and offset to another device (their float dtype is kept)."""
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if device is None:
            return self
        return AffineEncoding(self.scale.to(device), self.offset.to(device), self.grid, block_size=self.block_size)

    def detach(self) -> "AffineEncoding":
        return AffineEncoding(self.scale.detach(), self.offset.detach(), self.grid, block_size=self.block_size)

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (lists and ints), for JSON.

        >>> AffineEncoding(torch.tensor([0.5, 0.25]), torch.zeros(2), 4).to_dict()["scale"]
        [0.5, 0.25]
        """
        return {
            "scale": self.scale.detach().cpu().tolist(),
            "offset": self.offset.detach().cpu().tolist(),
            "shape": list(self.scale.shape),
            "qmin": self.qmin,
            "qmax": self.qmax,
            "block_size": list(self.block_size) if self.block_size is not None else None,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "AffineEncoding":
        """Inverse of :meth:`to_dict`; raises ValueError naming a missing or malformed key."""
        if not isinstance(d, dict):
            raise TypeError(f"encoding must be a dict, got {type(d).__name__}")
        for key in ("scale", "offset", "shape", "qmin", "qmax"):
            if key not in d:
                raise ValueError(f"encoding dict is missing key {key!r}")
        try:
            shape = tuple(int(s) for s in d["shape"])
            scale = torch.tensor(d["scale"], dtype=torch.float32).reshape(shape)
            offset = torch.tensor(d["offset"], dtype=torch.float32).reshape(shape)
        except (TypeError, ValueError, RuntimeError) as e:
            raise ValueError(f"encoding dict has malformed scale/offset/shape: {e}") from None
        block = d.get("block_size")
        return cls(scale, offset, IntegerGrid(d["qmin"], d["qmax"]), block_size=tuple(block) if block else None)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, AffineEncoding):
            return NotImplemented
        return (
            self.grid == other.grid
            and self.block_size == other.block_size
            and self.scale.shape == other.scale.shape
            and torch.equal(self.scale.detach(), other.scale.detach())
            and torch.equal(torch.broadcast_to(self.offset.detach(), self.scale.shape),
                            torch.broadcast_to(other.offset.detach(), other.scale.shape))
        )

    __hash__ = None  # type: ignore[assignment]  # mutable tensors inside

    def __repr__(self) -> str:
        block = f", block_size={self.block_size}" if self.block_size is not None else ""
        return (
            f"AffineEncoding(shape={tuple(self.scale.shape)}, qmin={self.qmin}, qmax={self.qmax}{block}, "
            f"scale={self.scale.detach()}, offset={self.offset.detach()})"
        )
