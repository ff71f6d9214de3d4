"""Calibrators of the TensorRT dialect (``pytorch_quantization.calib`` → ``quanta.tensor_quant.calib``).

:class:`MaxCalibrator` tracks the running absolute maximum;
:class:`HistogramCalibrator` collects histograms of ``|x|`` and computes amax by
entropy (KL divergence), MSE or percentile. Both work per tensor and per axis,
on CPU. :class:`AnalyzerCalibrator` (a quanta extension) runs one of
:mod:`quanta.calibration`'s analyzers (AIMET's encoding analyzers) instead.
"""

from quanta.tensor_quant.calib.analyzer import AnalyzerCalibrator
from quanta.tensor_quant.calib.calibrator import Calibrator
from quanta.tensor_quant.calib.histogram import GrowMethod, HistogramCalibrator, HistogramMethod
from quanta.tensor_quant.calib.max import MaxCalibrator

__all__ = ["Calibrator", "MaxCalibrator", "HistogramCalibrator", "HistogramMethod", "GrowMethod",
           "AnalyzerCalibrator"]
