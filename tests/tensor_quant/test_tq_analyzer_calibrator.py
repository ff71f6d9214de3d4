"""TensorQuantizer calibrated by quanta's encoding analyzers (calib_method="analyzer_*")."""

import pytest
import torch

from quanta.quantization.encoding_analyzer import (
    EntropyEncodingAnalyzer,
    MseEncodingAnalyzer,
    PercentileEncodingAnalyzer,
    SqnrEncodingAnalyzer,
)
from quanta.tensor_quant import AnalyzerCalibrator, CalibMethod, QuantDescriptor, TensorQuantizer, fake_tensor_quant

METHODS = {
    "analyzer_percentile": (PercentileEncodingAnalyzer, {"percentile": 99.99}),
    "analyzer_sqnr": (SqnrEncodingAnalyzer, {}),
    "analyzer_mse": (MseEncodingAnalyzer, {}),
    "analyzer_entropy": (EntropyEncodingAnalyzer, {}),
}


def data(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(6, 40, 8, generator=g) * torch.arange(1, 7.0)[:, None, None]
    x[2, 0, 0] = 60.0
    return x


def calibrate(q, batches, **kwargs):
    q.disable_quant()
    q.enable_calib()
    for b in batches:
        assert q(b) is b
    q.load_calib_amax(**kwargs)
    q.disable_calib()
    q.enable_quant()


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("narrow", [False, True])
def test_amax_is_the_top_of_the_analyzers_symmetric_range(method, narrow):
    cls, kw = METHODS[method]
    q = TensorQuantizer(QuantDescriptor(num_bits=8, axis=0, calib_method=method, narrow_range=narrow))
    assert isinstance(q.calibrator, AnalyzerCalibrator)
    batches = [data(0), data(1) * 0.5]
    calibrate(q, batches)
    ref = cls((6, 1, 1), **kw)
    for b in batches:
        ref.update_stats(b)
    lo, hi = ref.compute_encodings(254 if narrow else 255, True)
    assert torch.equal(q.amax, hi)
    assert torch.allclose(-lo, hi * (1 if narrow else 128 / 127))  # the grid's symmetric range
    assert q.amax.shape == (6, 1, 1)
    assert torch.isfinite(q(data(2))).all()


def test_unsigned_quantizer_calibrates_on_abs_with_an_asymmetric_range():
    q = TensorQuantizer(QuantDescriptor(num_bits=4, unsigned=True, calib_method="analyzer_mse"))
    x = data(0).abs()
    calibrate(q, [x])
    ref = MseEncodingAnalyzer(())
    ref.update_stats(x)
    assert torch.equal(q.amax, ref.compute_encodings(15, False)[1])


def test_percentile_can_be_given_at_load_time():
    q = TensorQuantizer(QuantDescriptor(calib_method=CalibMethod.ANALYZER_PERCENTILE))
    x = torch.linspace(-1, 1, 10001)
    calibrate(q, [x], percentile=90.0)
    ref = PercentileEncodingAnalyzer((), percentile=90.0)
    ref.update_stats(x)
    assert torch.equal(q.amax, ref.compute_encodings(255, True)[1])
    assert q.calibrator.analyzer.percentile == 99.99  # the override is not kept
    with pytest.raises(TypeError, match="percentile"):
        TensorQuantizer(QuantDescriptor(calib_method="analyzer_sqnr")).load_calib_amax(percentile=99.0)


def test_clipping_methods_beat_max_calibration_at_4_bits_on_heavy_tails():
    g = torch.Generator().manual_seed(3)
    z = torch.randn(32768, generator=g)
    x = z / (torch.randn(32768, 3, generator=g).square().sum(-1) / 3).sqrt()  # Student-t, 3 dof

    def sqnr(method):
        q = TensorQuantizer(QuantDescriptor(num_bits=4, calib_method=method))
        calibrate(q, [x])
        y = fake_tensor_quant(x, q.amax, 4, False, False)
        return float(10 * torch.log10(x.square().sum() / (x - y).square().sum()))

    base = sqnr("max")
    for method in ("analyzer_sqnr", "analyzer_mse"):
        assert sqnr(method) > base + 1.0, method


def test_errors():
    with pytest.raises(ValueError, match="integer num_bits"):
        TensorQuantizer(QuantDescriptor(num_bits=(4, 3), calib_method="analyzer_mse"))
    with pytest.raises(ValueError, match="method must be one of"):
        AnalyzerCalibrator(8, None, False, "max")
    with pytest.raises(ValueError, match="method must be one of"):
        AnalyzerCalibrator(8, None, False, "bogus")
    with pytest.raises(TypeError, match="unexpected keyword"):
        AnalyzerCalibrator(8, None, False, "analyzer_sqnr", bins=12)
    with pytest.raises(ValueError, match="num_bins"):
        AnalyzerCalibrator(8, None, False, "analyzer_sqnr", num_bins=1)
    with pytest.raises(ValueError, match="calib_method must be one of"):
        QuantDescriptor(calib_method="sqnr")
    q = TensorQuantizer(QuantDescriptor(calib_method="analyzer_sqnr"))
    with pytest.raises(RuntimeError, match="has not seen any tensor"):
        q.load_calib_amax()


def test_calibrator_can_be_replaced_with_custom_analyzer_options():
    q = TensorQuantizer(QuantDescriptor(num_bits=8, axis=0))
    q.calibrator = AnalyzerCalibrator(8, 0, False, "analyzer_sqnr", num_bins=256, gamma=1.0)
    calibrate(q, [data(0)])
    ref = SqnrEncodingAnalyzer((6, 1, 1), num_bins=256, gamma=1.0)
    ref.update_stats(data(0))
    assert torch.equal(q.amax, ref.compute_encodings(255, True)[1])
    with pytest.raises(ValueError, match="axis"):
        q.calibrator = AnalyzerCalibrator(8, None, False, "analyzer_sqnr")
    with pytest.raises(ValueError, match="narrow_range"):
        q.calibrator = AnalyzerCalibrator(8, 0, False, "analyzer_sqnr", narrow_range=True)
    with pytest.raises(TypeError, match="Calibrator"):
        q.calibrator = SqnrEncodingAnalyzer(())
    q.narrow_range = True  # keeps an analyzer calibrator in step
    assert q.calibrator.narrow_range is True


def test_descriptor_round_trip_keeps_the_method():
    d = QuantDescriptor(num_bits=4, axis=0, calib_method="analyzer_entropy")
    assert d.calib_method is CalibMethod.ANALYZER_ENTROPY
    assert d.dict()["calib_method"] == "analyzer_entropy"
    assert QuantDescriptor.from_dict(d.dict()) == d


def test_reset_forgets_everything():
    c = AnalyzerCalibrator(8, None, False, "analyzer_mse")
    c.collect(torch.randn(100))
    c.reset()
    assert c.compute_amax() is None and c.analyzer is None
    c.collect(torch.randn(3, 4))  # a new shape is fine after reset
    assert c.compute_amax().shape == ()
    per_row = AnalyzerCalibrator(8, 0, False, "analyzer_mse")
    per_row.collect(torch.ones(2, 3))
    with pytest.raises(ValueError, match="amax shape changed"):
        per_row.collect(torch.ones(3, 3))
