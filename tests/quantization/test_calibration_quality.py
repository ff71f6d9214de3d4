"""Which analyzer to pick: QDQ SQNR on heavy-tailed data (Student-t, 3 degrees of freedom).

At 4 bits the range that minimises the error clips the tails hard, so the
percentile, SQNR and MSE analyzers must beat MinMax there, per tensor and per
channel. (docs/guides/calibrate.md has the full table; bench/bench_calibration.py prints it.)
"""

import pytest
import torch

import quanta.quantization as Q
from quanta.quantization.encoding_analyzer import (
    MinMaxEncodingAnalyzer,
    MseEncodingAnalyzer,
    PercentileEncodingAnalyzer,
    SqnrEncodingAnalyzer,
)


def student_t3(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(shape, generator=g)
    chi2 = torch.randn(*shape, 3, generator=g).square().sum(-1)
    return z / (chi2 / 3).sqrt()


def qdq_sqnr_db(x, shape, bits, symmetric, analyzer):
    q = Q.affine.QuantizeDequantize(shape, bits, symmetric, encoding_analyzer=analyzer)
    with q.compute_encodings():
        q(x)
    with torch.no_grad():
        y = q(x).as_subclass(torch.Tensor)
    return float(10 * torch.log10(x.square().sum() / (x - y).square().sum()))


@pytest.mark.parametrize("shape", [(), (64, 1)], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_clipping_analyzers_beat_minmax_at_4_bits(shape, symmetric):
    x = student_t3((64, 1024))
    minmax = qdq_sqnr_db(x, shape, 4, symmetric, MinMaxEncodingAnalyzer(shape))
    for analyzer in (PercentileEncodingAnalyzer(shape, percentile=99.9), SqnrEncodingAnalyzer(shape),
                     MseEncodingAnalyzer(shape)):
        got = qdq_sqnr_db(x, shape, 4, symmetric, analyzer)
        assert got > minmax + 0.5, (type(analyzer).__name__, got, minmax)


def test_mse_is_close_to_the_best_symmetric_clip_found_by_brute_force():
    x = student_t3((1, 16384), seed=1)
    got = qdq_sqnr_db(x, (), 4, True, MseEncodingAnalyzer(()))
    best = -1.0
    amax = float(x.abs().max())
    for k in range(1, 401):
        q = Q.affine.QuantizeDequantize((), 4, True)
        q.set_range(-amax * k / 400 * 8 / 7, amax * k / 400)
        with torch.no_grad():
            y = q(x).as_subclass(torch.Tensor)
        best = max(best, float(10 * torch.log10(x.square().sum() / (x - y).square().sum())))
    assert got > best - 0.1
