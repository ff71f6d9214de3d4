"""Moved to :mod:`quanta.calibration.search` (shared by both quantizer dialects); this path keeps working."""

from quanta.calibration.search import EntropyEncodingAnalyzer, MseEncodingAnalyzer, SqnrEncodingAnalyzer

__all__ = ["EntropyEncodingAnalyzer", "MseEncodingAnalyzer", "SqnrEncodingAnalyzer"]
