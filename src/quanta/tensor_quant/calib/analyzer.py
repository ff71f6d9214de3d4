"""amax from quanta's encoding analyzers (a quanta extension of the TensorRT dialect).

:class:`AnalyzerCalibrator` feeds every collected batch to one of
:mod:`quanta.calibration`'s histogram analyzers (percentile,
SQNR, MSE, entropy) with the amax shape as the analyzer's shape, so it works per
tensor and per axis alike, and turns the analyzer's range into an amax:

* signed quantizer (``[-max_bound - 1, max_bound]``, or ``[-max_bound, max_bound]``
  when narrow): symmetric range on ``N = 2 * max_bound + 1`` (``2 * max_bound``)
  steps, whose top ``floor(N / 2) * delta = max_bound * delta`` is amax;
* unsigned quantizer (``[0, max_bound]``): asymmetric range of ``|x|`` on
  ``N = max_bound`` steps; amax is its top.

Unlike NVIDIA's :class:`HistogramCalibrator`, which bins ``|x|``, the analyzers
see the signed values, so an asymmetric distribution is judged as it will be
quantized. Under ``torch.distributed`` ``compute_amax()`` reduces the statistics
over all ranks (a collective).

>>> c = AnalyzerCalibrator(4, None, False, CalibMethod.ANALYZER_MSE)
>>> c.collect(torch.cat([torch.linspace(-1, 1, 4001), torch.tensor([8.0])]))
>>> c.compute_amax()
tensor(1.1200)
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from quanta.calibration import (
    EntropyEncodingAnalyzer,
    HistogramEncodingAnalyzer,
    MseEncodingAnalyzer,
    PercentileEncodingAnalyzer,
    SqnrEncodingAnalyzer,
)
from quanta.kernels.amax_quant import is_fp8
from quanta.tensor_quant.calib.calibrator import Calibrator
from quanta.tensor_quant.descriptor import CalibMethod

__all__ = ["AnalyzerCalibrator", "ANALYZER_METHODS"]

#: The calibration methods served by :class:`AnalyzerCalibrator`, and their analyzers.
ANALYZER_METHODS: dict[CalibMethod, type[HistogramEncodingAnalyzer]] = {
    CalibMethod.ANALYZER_PERCENTILE: PercentileEncodingAnalyzer,
    CalibMethod.ANALYZER_SQNR: SqnrEncodingAnalyzer,
    CalibMethod.ANALYZER_MSE: MseEncodingAnalyzer,
    CalibMethod.ANALYZER_ENTROPY: EntropyEncodingAnalyzer,
}

#: Percentile used by ``ANALYZER_PERCENTILE`` unless given (NVIDIA's default for its percentile method).
DEFAULT_PERCENTILE = 99.99


class AnalyzerCalibrator(Calibrator):
    """Computes amax with an encoding analyzer (see the module docstring).

    Args:
        num_bits, axis, unsigned: as in :class:`~quanta.tensor_quant.calib.calibrator.Calibrator`
            (an integer ``num_bits``: the analyzers search integer grids).
        method: one of the ``CalibMethod.ANALYZER_*`` members (or its string value).
        narrow_range: the quantizer's grid is ``[-max_bound, max_bound]``.
        **analyzer_kwargs: keyword arguments of the analyzer (``num_bins``, ``gamma``, ...);
            for ``ANALYZER_PERCENTILE`` the ``percentile`` defaults to 99.99.

    Raises:
        ValueError: a method that is not an analyzer method, or FP8 ``num_bits``.
        TypeError: an argument the analyzer does not take.
    """

    def __init__(self, num_bits, axis, unsigned, method: CalibMethod | str, *, narrow_range: bool = False,
                 **analyzer_kwargs: Any) -> None:
        super().__init__(num_bits, axis, unsigned)
        try:
            resolved = CalibMethod(method)
        except ValueError:
            resolved = None  # reported below, with the choices
        if resolved not in ANALYZER_METHODS:
            choices = ", ".join(repr(m.value) for m in ANALYZER_METHODS)
            raise ValueError(f"AnalyzerCalibrator: method must be one of {choices}, got {method!r}")
        method = resolved
        if is_fp8(self._num_bits):
            raise ValueError("AnalyzerCalibrator needs an integer num_bits (the analyzers search integer grids); "
                             "use calib_method='max' or 'histogram' for FP8 (4, 3)")
        self._method = method
        self._narrow_range = bool(narrow_range)
        if method is CalibMethod.ANALYZER_PERCENTILE:
            analyzer_kwargs.setdefault("percentile", DEFAULT_PERCENTILE)
        ANALYZER_METHODS[method]((), **analyzer_kwargs)  # validates the arguments now, not at the first batch
        self._analyzer_kwargs = analyzer_kwargs
        self._analyzer: HistogramEncodingAnalyzer | None = None

    @property
    def method(self) -> CalibMethod:
        """The analyzer method."""
        return self._method

    @property
    def narrow_range(self) -> bool:
        """Whether the quantizer's grid is ``[-max_bound, max_bound]``."""
        return self._narrow_range

    @narrow_range.setter
    def narrow_range(self, value: bool) -> None:
        self._narrow_range = bool(value)

    @property
    def analyzer(self) -> HistogramEncodingAnalyzer | None:
        """The analyzer (created at the first batch, with the amax shape), or None."""
        return self._analyzer

    def collect(self, x: torch.Tensor) -> None:
        """Add one batch to the analyzer's statistics."""
        rows = self._prepare(x)  # validates and warns (non-finite values, negative values when unsigned)
        if rows is None:
            return
        x = x.detach().as_subclass(torch.Tensor)
        if self._unsigned:
            x = x.abs()
        if self._analyzer is None:
            self._analyzer = ANALYZER_METHODS[self._method](self._amax_shape, **self._analyzer_kwargs)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*non-finite input values", category=RuntimeWarning)
            self._analyzer.update_stats(x)

    def num_steps(self) -> tuple[int, bool]:
        """``(num_steps, is_symmetric)`` the analyzer is asked for (see the module docstring)."""
        if is_fp8(self._num_bits):
            raise ValueError("AnalyzerCalibrator needs an integer num_bits, got FP8 (4, 3)")
        max_bound = 2 ** (self._num_bits - 1 + int(self._unsigned)) - 1
        if self._unsigned:
            return max_bound, False
        return 2 * max_bound + (0 if self._narrow_range else 1), True

    def compute_amax(self, *, percentile: float | None = None) -> torch.Tensor | None:
        """amax (float32, amax shape) from the analyzer's range, or None before any batch.

        ``percentile`` overrides the analyzer's for ``ANALYZER_PERCENTILE`` (TypeError for other methods).
        """
        if percentile is not None and self._method is not CalibMethod.ANALYZER_PERCENTILE:
            raise TypeError(f"percentile applies to calib_method 'analyzer_percentile' only, not {self._method.value!r}")
        if self._analyzer is None:
            return None
        num_steps, symmetric = self.num_steps()
        analyzer = self._analyzer
        if percentile is not None:
            assert isinstance(analyzer, PercentileEncodingAnalyzer)
            kept = analyzer.percentile
            analyzer.set_percentile(percentile)
        try:
            _, hi = analyzer.compute_encodings(num_steps, symmetric)
        finally:
            if percentile is not None:
                analyzer.set_percentile(kept)
        return hi.detach().float().reshape(self._amax_shape)

    def reset(self) -> None:
        """Forget every batch seen so far."""
        self._analyzer = None
        self._reset_shape()

    def __repr__(self) -> str:
        return (f"AnalyzerCalibrator(num_bits={self._num_bits}, axis={self._axis}, unsigned={self._unsigned}, "
                f"method='{self._method.value}', narrow_range={self._narrow_range}, analyzer={self._analyzer!r})")
