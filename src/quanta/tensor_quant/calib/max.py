"""Max calibration: the running absolute maximum, per tensor or per axis.

``amax = max over batches of max |x|`` over the reduced dimensions. NaN and inf
are ignored (with a warning); a batch without any finite value is a ValueError.

>>> c = MaxCalibrator(8, axis=0, unsigned=False)
>>> c.collect(torch.tensor([[1.0, -3.0], [0.5, 2.0]]))
>>> c.collect(torch.tensor([[4.0, 0.0], [-1.0, 1.0]]))
>>> c.compute_amax()
tensor([[4.],
        [2.]])
"""

from __future__ import annotations

import torch

from quanta.tensor_quant.calib.calibrator import Calibrator

__all__ = ["MaxCalibrator"]


class MaxCalibrator(Calibrator):
    """Tracks ``max |x|`` over every collected batch.

    Args:
        num_bits, axis, unsigned: as in :class:`~quanta.tensor_quant.calib.calibrator.Calibrator`.
        track_amax: also keep each batch's amax (as NumPy arrays) in :attr:`amaxs`.

    Unlike NVIDIA's, a per-axis amax always keeps its reduced dimensions (NVIDIA
    squeezes a one-element per-axis amax to a scalar), non-finite values are
    ignored instead of turning amax into NaN/inf, and a changed amax shape is a
    ValueError naming both shapes.
    """

    def __init__(self, num_bits, axis, unsigned, track_amax: bool = False) -> None:
        super().__init__(num_bits, axis, unsigned)
        self._track_amax = bool(track_amax)
        self._amaxs: list = []
        self._calib_amax: torch.Tensor | None = None

    @property
    def amaxs(self) -> list:
        """Per-batch amax values (NumPy), if ``track_amax`` was set."""
        return self._amaxs

    def collect(self, x: torch.Tensor) -> None:
        """Fold ``max |x|`` of one batch into the running maximum."""
        rows = self._prepare(x)
        if rows is None:
            return
        a = rows.abs()
        a = torch.where(torch.isfinite(a), a, torch.zeros((), dtype=a.dtype, device=a.device))
        local = torch.amax(a, dim=1).float().reshape(self._amax_shape)
        if self._calib_amax is None:
            self._calib_amax = local
        else:
            self._calib_amax = torch.maximum(self._calib_amax, local.to(self._calib_amax.device))
        if self._track_amax:
            self._amaxs.append(local.cpu().numpy())

    def compute_amax(self) -> torch.Tensor | None:
        """The running ``max |x|`` (float32, amax shape), or None before any batch."""
        return None if self._calib_amax is None else self._calib_amax.clone()

    def reset(self) -> None:
        """Forget every batch seen so far."""
        self._calib_amax = None
        self._amaxs = []
        self._reset_shape()

    def __repr__(self) -> str:
        amax = None if self._calib_amax is None else tuple(self._calib_amax.shape)
        return (f"MaxCalibrator(num_bits={self._num_bits}, axis={self._axis}, unsigned={self._unsigned}, "
                f"track_amax={self._track_amax}, calib_amax_shape={amax})")
