"""The :class:`EncodingAnalyzer` protocol: running statistics that become a quantizer's range."""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from typing import Generic, Sequence, TypeVar

import torch

from quanta import distributed
from quanta.kernels.blocks import BlockLayout, check_block_size, resolve_layout

__all__ = ["EncodingAnalyzer", "StatisticsNotFoundError"]


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


def _check_num_steps(num_steps: object) -> int:
    """``num_steps`` as an int (AIMET's examples pass ``math.pow(2, 8)``, an integral float)."""
    if isinstance(num_steps, bool) or not isinstance(num_steps, numbers.Real):
        raise TypeError(f"num_steps must be an int, got {type(num_steps).__name__} {num_steps!r}")
    if not float(num_steps).is_integer():
        raise ValueError(f"num_steps must be a whole number, got {num_steps!r}")
    if num_steps < 1:
        raise ValueError(f"num_steps must be positive, got {num_steps!r}")
    return int(num_steps)


def _check_symmetric(is_symmetric: object) -> bool:
    if not isinstance(is_symmetric, bool):
        raise TypeError(f"is_symmetric must be a bool, got {is_symmetric!r}")
    return is_symmetric


def _check_input(analyzer: object, input: object) -> torch.Tensor:
    if not isinstance(input, torch.Tensor) or not input.is_floating_point():
        what = f"tensor of dtype {input.dtype}" if isinstance(input, torch.Tensor) else type(input).__name__
        raise TypeError(f"{type(analyzer).__name__}: input must be a floating-point tensor, got {what}")
    return input.detach().as_subclass(torch.Tensor)


class EncodingAnalyzer(ABC, Generic[StatsT]):
    """Base class: running statistics of the shape of a quantizer's scale.

    Observing and computing are separate steps: :meth:`update_stats` folds a
    batch into the statistics, :meth:`compute_encodings` turns them into a
    range ``(min, max)`` of shape ``shape``. Under ``torch.distributed``,
    :meth:`compute_encodings` first reduces the statistics over all ranks
    (:mod:`quanta.distributed`).

    Args:
        shape: shape of the statistics (the quantizer's ``shape``).
        block_size: the quantizer's block size, or None.
    """

    def __init__(self, shape: tuple[int, ...], block_size: tuple[int, ...] | None = None) -> None:
        self.shape = _check_shape(shape)
        self.block_size = check_block_size(block_size)
        if self.block_size is not None and len(self.block_size) != len(self.shape):
            raise ValueError(f"block_size {self.block_size} must have one entry per dimension of shape {self.shape}")
        self.stats: StatsT | None = None

    @property
    def num_entries(self) -> int:
        """Number of scale entries (``prod(shape)``): one set of statistics each."""
        return math.prod(self.shape)

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
        """Range ``(min, max)`` from the running statistics (reduced over all ranks under ``torch.distributed``).

        Raises:
            StatisticsNotFoundError: no statistics (on any rank).
        """
        num_steps = _check_num_steps(num_steps)
        is_symmetric = _check_symmetric(is_symmetric)
        stats = self.stats
        if distributed.is_active():
            if not distributed.any_rank(stats is not None):
                stats = None
            else:
                stats = self._all_reduce(stats if stats is not None else self._empty_stats())
        if stats is None:
            raise StatisticsNotFoundError(
                f"{type(self).__name__} has no statistics: run the quantizer on data inside "
                "`with quantizer.compute_encodings():` first"
            )
        return self.compute_encodings_from_stats(stats, num_steps, is_symmetric)

    def compute_dynamic_encodings(
        self, input: torch.Tensor, num_steps: int, is_symmetric: bool
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Range of one batch alone, leaving the running statistics untouched (None for an empty batch)."""
        num_steps = _check_num_steps(num_steps)
        is_symmetric = _check_symmetric(is_symmetric)
        batch = self._batch_stats(input)
        return None if batch is None else self.compute_encodings_from_stats(batch, num_steps, is_symmetric)

    @abstractmethod
    def compute_encodings_from_stats(
        self, stats: StatsT, num_steps: int, is_symmetric: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Range ``(min, max)`` from given statistics (this process's; no reduction)."""

    @abstractmethod
    def _batch_stats(self, input: torch.Tensor) -> StatsT | None: ...

    @abstractmethod
    def _merge(self, a: StatsT, b: StatsT) -> StatsT: ...

    @abstractmethod
    def _empty_stats(self) -> StatsT:
        """Statistics of no data (what a rank without data contributes to a reduction)."""

    @abstractmethod
    def _all_reduce(self, stats: StatsT) -> StatsT:
        """The statistics of every rank together (a collective)."""

    def _layout(self, input: torch.Tensor) -> BlockLayout:
        return resolve_layout(input.shape, self.shape, self.block_size)

    def __repr__(self) -> str:
        block = f", block_size={self.block_size}" if self.block_size is not None else ""
        return f"{type(self).__name__}(shape={self.shape}{block})"
