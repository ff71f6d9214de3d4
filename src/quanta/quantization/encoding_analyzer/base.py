"""Moved to :mod:`quanta.calibration.base` (shared by both quantizer dialects); this path keeps working."""

from quanta.calibration.base import (  # _check_shape: shared with the quantizer modules
    EncodingAnalyzer,
    StatisticsNotFoundError,
    _check_shape,  # noqa: F401
)

__all__ = ["EncodingAnalyzer", "StatisticsNotFoundError"]
