"""MinMax calibration: the running minimum and maximum."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from quanta import distributed
from quanta.calibration.base import EncodingAnalyzer, _check_input
from quanta.kernels.qparams import calibrated_range

__all__ = ["MinMaxEncodingAnalyzer", "MinMaxStats"]


@dataclass
class MinMaxStats:
    """Running elementwise-reduced minimum and maximum (``+inf``/``-inf`` where nothing finite was seen)."""

    min: torch.Tensor
    max: torch.Tensor


class MinMaxEncodingAnalyzer(EncodingAnalyzer[MinMaxStats]):
    """Running min and max over every batch.

    ``compute_encodings`` includes zero in the range, widens degenerate ranges
    to the minimum scale and, if symmetric, centres the range on the grid:
    ``delta = max(max / floor(N/2), -min / ceil(N/2))``,
    ``min = -ceil(N/2) * delta``, ``max = floor(N/2) * delta``
    (:func:`quanta.kernels.qparams.calibrated_range`). As AIMET's, for a 3-step
    symmetric grid (2-bit) ``delta = max(max / 2, -min / 2)``: the positive end
    is clipped so that symmetric data use all four codes instead of leaving the
    most negative one empty (data ``[2.0, 5.06]`` give ``[-5.06, 2.53]``, not
    ``[-10.12, 5.06]``).

    Non-finite inputs (NaN, +-inf) are left out of the statistics, with a warning.

    >>> a = MinMaxEncodingAnalyzer(shape=(2, 1))
    >>> _ = a.update_stats(torch.tensor([[1.0, 2.0], [-4.0, 0.5]]))
    >>> a.compute_encodings(num_steps=255, is_symmetric=False)
    (tensor([[ 0.],
            [-4.]]), tensor([[2.0000],
            [0.5000]]))
    """

    def _batch_stats(self, input: torch.Tensor) -> MinMaxStats | None:
        input = _check_input(self, input)
        layout = self._layout(input)
        if input.numel() == 0:
            return None
        xb = layout.to_blocks(input)
        dims = layout.reduce_dims()
        if dims:
            lo, hi = torch.amin(xb, dim=dims), torch.amax(xb, dim=dims)
        else:
            lo, hi = xb.clone(), xb.clone()
        if not bool((torch.isfinite(lo) & torch.isfinite(hi)).all()):  # NaN and inf show up in min/max
            finite = torch.isfinite(xb)
            warnings.warn(
                f"{type(self).__name__}: ignoring {int((~finite).sum())} non-finite input values (NaN/inf)",
                RuntimeWarning,
                stacklevel=3,
            )
            lo_src = torch.where(finite, xb, torch.inf)
            hi_src = torch.where(finite, xb, -torch.inf)
            lo = torch.amin(lo_src, dim=dims) if dims else lo_src
            hi = torch.amax(hi_src, dim=dims) if dims else hi_src
        return MinMaxStats(lo.reshape(self.shape).float(), hi.reshape(self.shape).float())

    def _merge(self, a: MinMaxStats, b: MinMaxStats) -> MinMaxStats:
        return MinMaxStats(torch.minimum(a.min, b.min), torch.maximum(a.max, b.max))

    def _empty_stats(self) -> MinMaxStats:
        return MinMaxStats(torch.full(self.shape, torch.inf), torch.full(self.shape, -torch.inf))

    def _all_reduce(self, stats: MinMaxStats) -> MinMaxStats:
        return MinMaxStats(*distributed.all_reduce_min_max(stats.min, stats.max))

    def compute_encodings_from_stats(
        self, stats: MinMaxStats, num_steps: int, is_symmetric: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # A slice that saw only non-finite values keeps +inf/-inf here: treat it as empty (zero range).
        lo = torch.where(torch.isfinite(stats.min), stats.min, 0.0)
        hi = torch.where(torch.isfinite(stats.max), stats.max, 0.0)
        return calibrated_range(lo, hi, num_steps, is_symmetric, positive_fit=2 if num_steps == 3 else None)
