"""Granularities of ``quantize_`` configs (torchao's ``torchao.quantization.granularity``).

Each says which elements of a weight share one scale; :func:`block_size_for`
turns it into the full block shape the primitives take.

>>> block_size_for(PerRow(), (8, 64)), block_size_for(PerGroup(32), (8, 64)), block_size_for(PerTensor(), (8, 64))
((1, 64), (1, 32), (8, 64))
>>> block_size_for(PerAxis(0), (8, 64))
(1, 64)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["Granularity", "PerTensor", "PerAxis", "PerRow", "PerGroup", "PerBlock", "block_size_for"]


@dataclass(frozen=True)
class Granularity:
    """Base class."""


@dataclass(frozen=True)
class PerTensor(Granularity):
    """One scale for the whole tensor."""


@dataclass(frozen=True)
class PerAxis(Granularity):
    """One scale per index of ``axis`` (``PerAxis(0)`` on a Linear weight = one per output feature)."""

    axis: int = 0


@dataclass(frozen=True)
class PerRow(Granularity):
    """One scale per row: all elements along ``dim`` (default the last) share it."""

    dim: int = -1


@dataclass(frozen=True)
class PerGroup(Granularity):
    """Groups of ``group_size`` consecutive elements along the last dimension."""

    group_size: int

    def __post_init__(self) -> None:
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 1:
            raise ValueError(f"group_size must be a positive int, got {self.group_size!r}")


@dataclass(frozen=True)
class PerBlock(Granularity):
    """Explicit block shape, one entry per dimension."""

    block_size: tuple[int, ...]


def block_size_for(granularity: Granularity, shape: Sequence[int]) -> tuple[int, ...]:
    """Full block shape of ``granularity`` on a tensor of ``shape``; ValueError if it does not tile it."""
    shape = tuple(shape)
    nd = len(shape)
    if isinstance(granularity, PerTensor):
        block = shape
    elif isinstance(granularity, PerAxis):
        axis = granularity.axis % nd if nd else 0
        block = tuple(1 if d == axis else s for d, s in enumerate(shape))
    elif isinstance(granularity, PerRow):
        dim = granularity.dim % nd if nd else 0
        block = tuple(s if d == dim else 1 for d, s in enumerate(shape))
    elif isinstance(granularity, PerGroup):
        block = (1,) * (nd - 1) + (granularity.group_size,)
    elif isinstance(granularity, PerBlock):
        block = tuple(granularity.block_size)
        if len(block) != nd:
            raise ValueError(f"PerBlock{block} needs one entry per dimension of shape {shape}")
    else:
        raise TypeError(f"granularity must be PerTensor(), PerAxis(axis), PerRow(), PerGroup(n) or PerBlock(...), "
                        f"got {granularity!r}")
    for d, (s, b) in enumerate(zip(shape, block)):
        if b < 1 or s % b:
            raise ValueError(f"{granularity} gives block {b} on dimension {d} of size {s}, which it does not divide")
    return block
