"""Moved to :mod:`quanta.calibration.histogram` (shared by both quantizer dialects); this path keeps working."""

from quanta.calibration.histogram import HistogramEncodingAnalyzer, PercentileEncodingAnalyzer

__all__ = ["HistogramEncodingAnalyzer", "PercentileEncodingAnalyzer"]
