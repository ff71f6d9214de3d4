"""Calibration statistics shared by the quantizer dialects: encoding analyzers.

An analyzer folds batches into running statistics of a quantizer's ``shape``
(``update_stats``) and turns them into a range (``compute_encodings``); see
:mod:`quanta.quantization.encoding_analyzer` (AIMET's import path for these
classes) for the list and docs/guides/calibrate.md for a comparison. They sit below
both dialects' quantizers: AIMET's quantizers (:mod:`quanta.quantization`) and
the TensorRT dialect's :class:`~quanta.tensor_quant.calib.AnalyzerCalibrator`
use them without importing each other.

>>> a = MinMaxEncodingAnalyzer(shape=())
>>> _ = a.update_stats(torch.tensor([-1.0, 2.0]))
>>> a.compute_encodings(num_steps=255, is_symmetric=False)
(tensor(-1.), tensor(2.))
"""

from quanta.calibration.base import EncodingAnalyzer, StatisticsNotFoundError
from quanta.calibration.histogram import HistogramEncodingAnalyzer, PercentileEncodingAnalyzer
from quanta.calibration.minmax import MinMaxEncodingAnalyzer, MinMaxStats
from quanta.calibration.search import EntropyEncodingAnalyzer, MseEncodingAnalyzer, SqnrEncodingAnalyzer

__all__ = [
    "EncodingAnalyzer",
    "StatisticsNotFoundError",
    "MinMaxStats",
    "MinMaxEncodingAnalyzer",
    "HistogramEncodingAnalyzer",
    "PercentileEncodingAnalyzer",
    "SqnrEncodingAnalyzer",
    "MseEncodingAnalyzer",
    "EntropyEncodingAnalyzer",
]
