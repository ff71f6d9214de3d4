"""Encoding analyzers: statistics that initialise a quantizer's range (AIMET's API).

Observing and computing are separate steps, as in PyTorch's observers:
``update_stats(x)`` folds a batch into running statistics, and
``compute_encodings(num_steps, is_symmetric)`` turns them into a range
``(min, max)``. The statistics have the quantizer's ``shape``: one entry per
scale element (per tensor, per channel or per block, with ``block_size``).

* :class:`MinMaxEncodingAnalyzer` — running min and max;
* :class:`PercentileEncodingAnalyzer` — clip the outer ``(100 - p)`` percent;
* :class:`SqnrEncodingAnalyzer` — AIMET's SQNR search over deltas and offsets;
* :class:`MseEncodingAnalyzer` — least expected squared error over clipped ranges;
* :class:`EntropyEncodingAnalyzer` — least KL divergence over clipped ranges.

The last four keep a histogram per scale entry (:class:`HistogramEncodingAnalyzer`),
streaming with bounded memory and exactly mergeable across batches and
processes. Under ``torch.distributed``, ``compute_encodings()`` reduces the
statistics over all ranks (:mod:`quanta.distributed`). A quantizer takes one
with ``encoding_analyzer=``; docs/guides/calibrate.md compares them.

>>> analyzer = MinMaxEncodingAnalyzer(shape=())
>>> _ = analyzer.update_stats(torch.tensor([-1.0, 2.0]))
>>> _ = analyzer.update_stats(torch.tensor([3.0]))
>>> analyzer.compute_encodings(num_steps=255, is_symmetric=False)
(tensor(-1.), tensor(3.))
"""

# The analyzers live in quanta.calibration, below both quantizer dialects (the TensorRT dialect's
# AnalyzerCalibrator uses them too); this is AIMET's import path for them.
from quanta.calibration.base import (  # _check_shape: shared with the quantizer modules
    EncodingAnalyzer,
    StatisticsNotFoundError,
    _check_shape,  # noqa: F401
)
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
