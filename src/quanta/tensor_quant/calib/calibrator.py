"""Common base of the TensorRT-style calibrators: ``collect(x)``, ``compute_amax(...)``, ``reset()``.

Observing and computing are separate steps: ``collect`` folds a batch into
running statistics and returns nothing; ``compute_amax`` turns the statistics
into an amax of the quantizer's shape (``()`` per tensor; reduced dimensions
kept as 1 per axis, see :mod:`quanta.tensor_quant.axis`), or None before any
batch was seen.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod

import torch

from quanta.kernels.amax_quant import _check_flag, resolve_num_bits
from quanta.tensor_quant.axis import amax_shape, check_axis, normalize_axis

__all__ = ["Calibrator"]


class Calibrator(ABC):
    """Base class.

    Args:
        num_bits: bits of the target quantizer (an int in [1, 32], or ``(4, 3)`` for FP8).
        axis: kept dimension(s) for per-axis amax, or None for per tensor.
        unsigned: the quantizer is unsigned (negative inputs are then suspicious
            and draw a warning; calibration still uses ``|x|``).
    """

    def __init__(self, num_bits: int | tuple[int, int], axis: int | tuple[int, ...] | None, unsigned: bool) -> None:
        self._num_bits = resolve_num_bits(num_bits)
        self._axis = check_axis(axis)
        self._unsigned = _check_flag("unsigned", unsigned)
        self._amax_shape: tuple[int, ...] | None = None
        self._warned_negative = False

    @property
    def num_bits(self) -> int | tuple[int, int]:
        """Bits of the target quantizer."""
        return self._num_bits

    @num_bits.setter
    def num_bits(self, value: int | tuple[int, int]) -> None:
        self._num_bits = resolve_num_bits(value)

    @property
    def axis(self) -> int | tuple[int, ...] | None:
        """Kept dimension(s), or None per tensor."""
        return self._axis

    @property
    def unsigned(self) -> bool:
        """Whether the target quantizer is unsigned."""
        return self._unsigned

    @unsigned.setter
    def unsigned(self, value: bool) -> None:
        self._unsigned = _check_flag("unsigned", value)

    @abstractmethod
    def collect(self, x: torch.Tensor) -> None:
        """Fold one batch into the statistics."""

    @abstractmethod
    def compute_amax(self, *args, **kwargs) -> torch.Tensor | None:
        """amax from the statistics (None before any batch)."""

    @abstractmethod
    def reset(self) -> None:
        """Forget every batch seen so far."""

    # -- shared input handling -----------------------------------------------------------------------------
    def _prepare(self, x: object) -> torch.Tensor | None:
        """Validate a batch; returns it as ``(C, N)`` rows (one row per amax entry) or None if empty.

        Warns about non-finite values (they are ignored by the caller) and about
        negative values for unsigned quantizers; raises ValueError if no value is finite.
        """
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"collect() needs a floating-point tensor, got {type(x).__name__}"
                            + (f" of dtype {x.dtype}" if isinstance(x, torch.Tensor) else ""))
        x = x.detach().as_subclass(torch.Tensor)
        shape = amax_shape(x.shape, self._axis)
        if self._amax_shape is not None and shape != self._amax_shape:
            raise ValueError(
                f"{type(self).__name__}: amax shape changed from {self._amax_shape} to {shape} "
                f"(input shape {tuple(x.shape)}, axis={self._axis}); call reset() to calibrate a new tensor"
            )
        if x.numel() == 0:
            return None
        finite = torch.isfinite(x)
        if not bool(finite.all()):
            bad = int((~finite).sum())
            if bad == x.numel():
                raise ValueError(
                    f"{type(self).__name__}.collect(): every one of the {bad} input values is NaN or inf; "
                    "there is nothing to calibrate on"
                )
            warnings.warn(f"{type(self).__name__}: ignoring {bad} non-finite input values (NaN/inf)",
                          RuntimeWarning, stacklevel=3)
        if self._unsigned and not self._warned_negative and bool((x < 0).any()):
            self._warned_negative = True
            warnings.warn(
                f"{type(self).__name__}: negative values in calibration data of an unsigned quantizer; "
                "calibrating on |x|, but quantizing such a tensor with unsigned=True will raise TypeError",
                RuntimeWarning, stacklevel=3,
            )
        self._amax_shape = shape
        return _rows(x, self._axis)

    def _reset_shape(self) -> None:
        self._amax_shape = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_bits={self._num_bits}, axis={self._axis}, unsigned={self._unsigned})"


def _rows(x: torch.Tensor, axis: object) -> torch.Tensor:
    """``x`` as ``(C, N)``: kept dims flattened to rows (in amax order), reduced dims to columns."""
    kept = normalize_axis(axis, x.dim())
    if kept is None:
        return x.reshape(1, -1)
    rest = [d for d in range(x.dim()) if d not in kept]
    c = 1
    for d in kept:
        c *= x.shape[d]
    return x.permute(*kept, *rest).reshape(c, -1)
