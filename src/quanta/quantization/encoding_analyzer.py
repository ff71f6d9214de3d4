"""Encoding analyzers: statistics that initialise a quantizer's range.

Observing and computing are separate steps, as in PyTorch's observers:
``update_stats(x)`` folds a batch into running statistics, and
``compute_encodings(num_steps, is_symmetric)`` turns them into a range
``(min, max)``. The statistics have the quantizer's ``shape``: one entry per
scale element (per tensor, per channel or per block).

>>> analyzer = MinMaxEncodingAnalyzer(shape=())
>>> _ = analyzer.update_stats(torch.tensor([-1.0, 2.0]))
>>> _ = analyzer.update_stats(torch.tensor([3.0]))
>>> analyzer.compute_encodings(num_steps=255, is_symmetric=False)
(tensor(-1.), tensor(3.))
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Generic, Sequence, TypeVar

import torch

from quanta.kernels.blocks import check_block_size, resolve_layout
from quanta.kernels.qparams import calibrated_range

__all__ = ["EncodingAnalyzer", "MinMaxEncodingAnalyzer", "StatisticsNotFoundError", "MinMaxStats"]


class StatisticsNotFoundError(RuntimeError):
    """``compute_encodings`` was asked for a range before any statistics were seen."""


StatsT = TypeVar("StatsT")


def _check_shape(shape: object) -> tuple[int, ...]:
    if isinstance(shape, int) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (Sequence, torch.Size)) or isinstance(shape, str):
        raise TypeError(f"shape must be a tuple of ints, got {shape!r}")
    out = []
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise ValueError(f"shape must be a tuple of positive ints, got {tuple(shape)!r}")
        out.append(d)
    return tuple(out)


class EncodingAnalyzer(ABC, Generic[StatsT]):
    """Base class: running statistics of the shape of a quantizer's scale.

    Args:
        shape: shape of the statistics (the quantizer's ``shape``).
        block_size: the quantizer's block size, or None.
    """

    def __init__(self, shape: tuple[int, ...], block_size: tuple[int, ...] | None = None) -> None:
        self.shape = _check_shape(shape)
        self.block_size = check_block_size(block_size)
        self.stats: StatsT | None = None

    def reset_stats(self) -> None:
        """Forget every batch seen so far."""
        self.stats = None

    def update_stats(self, input: torch.Tensor) -> StatsT | None:
        """Fold one batch into the running statistics; returns the batch's own statistics.

        Returns None for an empty batch, which changes nothing.
        """
        batch = self._batch_stats(input)
        if batch is not None:
            self.stats = batch if self.stats is None else self._merge(self.stats, batch)
        return batch

    def compute_encodings(self, num_steps: int, is_symmetric: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Range ``(min, max)`` from the running statistics."""
        if self.stats is None:
            raise StatisticsNotFoundError(
                f"{type(self).__name__} has no statistics: run the quantizer on data inside "
                "`with quantizer.compute_encodings():` first"
            )
        return self.compute_encodings_from_stats(self.stats, num_steps, is_symmetric)

    def compute_dynamic_encodings(
        self, input: torch.Tensor, num_steps: int, is_symmetric: bool
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Range of one batch alone, leaving the running statistics untouched."""
        batch = self._batch_stats(input)
        return None if batch is None else self.compute_encodings_from_stats(batch, num_steps, is_symmetric)

    @abstractmethod
    def compute_encodings_from_stats(
        self, stats: StatsT, num_steps: int, is_symmetric: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Range ``(min, max)`` from given statistics."""

    @abstractmethod
    def _batch_stats(self, input: torch.Tensor) -> StatsT | None: ...

    @abstractmethod
    def _merge(self, a: StatsT, b: StatsT) -> StatsT: ...

    def __repr__(self) -> str:
        block = f", block_size={self.block_size}" if self.block_size is not None else ""
        return f"{type(self).__name__}(shape={self.shape}{block})"


@dataclass
class MinMaxStats:
    """Running elementwise-reduced minimum and maximum."""

    min: torch.Tensor
    max: torch.Tensor


class MinMaxEncodingAnalyzer(EncodingAnalyzer[MinMaxStats]):
    """Running min and max over every batch.

    ``compute_encodings`` includes zero in the range, widens degenerate ranges
    to the minimum scale and, if symmetric, centres the range on the grid:
    ``delta = max(max / floor(N/2), -min / ceil(N/2))``,
    ``min = -ceil(N/2) * delta``, ``max = floor(N/2) * delta``.

    Non-finite inputs (NaN, +-inf) are left out of the statistics, with a warning.

    >>> a = MinMaxEncodingAnalyzer(shape=(2, 1))
    >>> _ = a.update_stats(torch.tensor([[1.0, 2.0], [-4.0, 0.5]]))
    >>> a.compute_encodings(num_steps=255, is_symmetric=False)
    (tensor([[ 0.],
            [-4.]]), tensor([[2.0000],
            [0.5000]]))
    """

    def _batch_stats(self, input: torch.Tensor) -> MinMaxStats | None:
        if not isinstance(input, torch.Tensor) or not input.is_floating_point():
            raise TypeError(f"input must be a floating-point tensor, got {type(input).__name__}")
        input = input.detach().as_subclass(torch.Tensor)
        layout = resolve_layout(input.shape, self.shape, self.block_size)
        if input.numel() == 0:
            return None
        xb = layout.to_blocks(input)
        finite = torch.isfinite(xb)
        lo_src, hi_src = xb, xb
        if not bool(finite.all()):
            warnings.warn(
                f"{type(self).__name__}: ignoring {int((~finite).sum())} non-finite input values (NaN/inf)",
                RuntimeWarning,
                stacklevel=3,
            )
            lo_src = torch.where(finite, xb, torch.inf)
            hi_src = torch.where(finite, xb, -torch.inf)
        dims = layout.reduce_dims()
        lo = torch.amin(lo_src, dim=dims) if dims else lo_src.clone()
        hi = torch.amax(hi_src, dim=dims) if dims else hi_src.clone()
        return MinMaxStats(lo.reshape(layout.scale_shape).float(), hi.reshape(layout.scale_shape).float())

    def _merge(self, a: MinMaxStats, b: MinMaxStats) -> MinMaxStats:
        return MinMaxStats(torch.minimum(a.min, b.min), torch.maximum(a.max, b.max))

    def compute_encodings_from_stats(
        self, stats: MinMaxStats, num_steps: int, is_symmetric: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # A slice that saw only non-finite values keeps +inf/-inf here: treat it as empty (zero range).
        lo = torch.where(torch.isfinite(stats.min), stats.min, 0.0)
        hi = torch.where(torch.isfinite(stats.max), stats.max, 0.0)
        return calibrated_range(lo, hi, num_steps, is_symmetric)
