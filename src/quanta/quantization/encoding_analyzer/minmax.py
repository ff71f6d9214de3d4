"""Moved to :mod:`quanta.calibration.minmax` (shared by both quantizer dialects); this path keeps working."""

from quanta.calibration.minmax import MinMaxEncodingAnalyzer, MinMaxStats

__all__ = ["MinMaxEncodingAnalyzer", "MinMaxStats"]
