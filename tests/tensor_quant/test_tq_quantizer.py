"""TensorQuantizer: modes, amax sources, calibration flow, FP8, learned amax, state_dict."""

import io

import pytest
import torch

from quanta.tensor_quant import (
    HistogramCalibrator,
    MaxCalibrator,
    QuantDescriptor,
    TensorQuantizer,
    fake_tensor_quant,
    tensor_quant,
)


def _fq(x, amax, num_bits=8, unsigned=False, narrow=False):
    """Independent fake quant with float32 math: clamp(round(x * s), lo, hi) / s, s = max_bound / amax."""
    hi = 2 ** (num_bits - 1 + int(unsigned)) - 1
    lo = 0 if unsigned else (-hi if narrow else -hi - 1)
    s = torch.tensor(float(hi)) / torch.as_tensor(amax, dtype=torch.float32)
    return torch.clamp(torch.round(x.float() * s), lo, hi) / s


def test_default_quantizer_is_8bit_full_range_fake_dynamic():
    q = TensorQuantizer()
    assert q.num_bits == 8 and q.fake_quant and q.narrow_range is False and q.amax is None and q.axis is None
    x = torch.tensor([-2.0, -1.0, 0.5, 1.0, 2.0])
    # dynamic amax = 2, [-128, 127], scale 63.5: -2 -> -127, 0.5 -> 31.75 -> 32
    assert torch.equal(q(x), _fq(x, 2.0))
    assert q.scale.item() == 63.5  # of the last dynamic call
    assert isinstance(q.calibrator, MaxCalibrator)


def test_static_amax_from_descriptor_and_narrow_range():
    q = TensorQuantizer(QuantDescriptor(amax=1.0, narrow_range=True))
    x = torch.tensor([-3.0, -1.0, 0.25, 3.0])
    assert torch.equal(q(x), _fq(x, 1.0, narrow=True))
    assert q.amax.item() == 1.0 and q.scale.item() == 127.0
    assert q.step_size.item() == pytest.approx(1 / 127)


def test_disable_and_enable():
    q = TensorQuantizer(QuantDescriptor(amax=1.0))
    x = torch.tensor([0.3, 5.0])
    q.disable()
    assert q(x) is x
    q.enable()
    assert not torch.equal(q(x), x)
    q.disable_quant()
    assert q(x) is x
    q.disable()
    assert "disabled" in repr(q)


def test_real_quant_returns_codes_and_honours_narrow_range():
    x = torch.tensor([-5.0, -1.0, 0.5, 5.0])
    q = TensorQuantizer(QuantDescriptor(amax=1.0, fake_quant=False))
    assert q(x).tolist() == [-128.0, -127.0, 64.0, 127.0]  # descriptor default narrow_range=False
    q = TensorQuantizer(QuantDescriptor(amax=1.0, fake_quant=False, narrow_range=True))
    assert q(x).tolist() == [-127.0, -127.0, 64.0, 127.0]
    assert q.scale.item() == 127.0


def test_fake_quant_uses_the_descriptor_range():
    x = torch.tensor([-5.0, 5.0])
    out = TensorQuantizer(QuantDescriptor(amax=1.0))(x)  # [-128, 127]: -5 clamps to -128
    assert out.tolist() == [(-128.0 / torch.tensor(127.0)).item(), 1.0]
    out = TensorQuantizer(QuantDescriptor(amax=1.0, narrow_range=True))(x)
    assert out.tolist() == [-1.0, 1.0]


def test_dynamic_amax_per_axis():
    q = TensorQuantizer(QuantDescriptor(axis=0))
    x = torch.tensor([[1.0, -4.0, 2.0], [0.5, 0.25, -0.125]])
    expected = torch.stack([_fq(x[0], 4.0), _fq(x[1], 0.5)])
    assert torch.equal(q(x), expected)
    q = TensorQuantizer(QuantDescriptor(axis=-1))  # per column
    cols = torch.stack([_fq(x[:, c], x[:, c].abs().max()) for c in range(3)], dim=1)
    assert torch.equal(q(x), cols)


def test_dynamic_amax_ignores_non_finite():
    q = TensorQuantizer()
    x = torch.tensor([float("nan"), 1.0, -2.0, float("inf")])
    y = q(x)
    assert torch.isnan(y[0]) and y[1:].tolist() == _fq(x[1:], 2.0).tolist()


def test_scale_amax_multiplies_amax():
    x = torch.tensor([0.5, 1.0, 2.0])
    q = TensorQuantizer(QuantDescriptor(amax=2.0, scale_amax=0.5))
    assert torch.equal(q(x), _fq(x, 1.0))
    q = TensorQuantizer(QuantDescriptor(scale_amax=0.5))  # dynamic amax 2 * 0.5
    assert torch.equal(q(x), _fq(x, 1.0))


def test_calibration_flow_max_per_axis():
    q = TensorQuantizer(QuantDescriptor(axis=0))
    q.disable_quant()
    q.enable_calib()
    batches = [torch.tensor([[1.0, -3.0], [0.5, 0.25]]), torch.tensor([[2.0, 0.0], [-0.75, 0.5]])]
    for b in batches:
        assert q(b) is b  # quant disabled: calibration only observes
    q.load_calib_amax()
    assert q.amax.tolist() == [[3.0], [0.75]]
    q.disable_calib()
    q.enable_quant()
    x = torch.tensor([[1.5, -3.0], [0.5, 0.7]])
    assert torch.equal(q(x), torch.stack([_fq(x[0], 3.0), _fq(x[1], 0.75)]))


def test_calibration_flow_histogram_percentile():
    q = TensorQuantizer(QuantDescriptor(calib_method="histogram"))
    assert isinstance(q.calibrator, HistogramCalibrator)
    q.disable_quant()
    q.enable_calib()
    gen = torch.Generator().manual_seed(0)
    data = torch.randn(20000, generator=gen)
    q(data)
    q.load_calib_amax("percentile", percentile=99.0)
    true = torch.quantile(data.abs(), 0.99).item()
    width = data.abs().max().item() / 2048
    assert abs(q.amax.item() - true) <= width + 1e-6
    with pytest.raises(ValueError, match="method"):
        q.load_calib_amax("bogus")


def test_load_calib_amax_without_data():
    q = TensorQuantizer()
    with pytest.raises(RuntimeError, match="has not seen any tensor"):
        q.load_calib_amax()
    with pytest.warns(RuntimeWarning, match="unchanged"):
        q.load_calib_amax(strict=False)
    assert q.amax is None


def test_load_calib_amax_replaces_existing_amax():
    q = TensorQuantizer(QuantDescriptor(amax=10.0))
    q.enable_calib()
    q.disable_quant()
    q(torch.tensor([1.0, -3.0]))
    q.load_calib_amax()
    assert q.amax.item() == 3.0


def test_enable_calib_without_calibrator():
    q = TensorQuantizer()
    q._calibrator = None
    with pytest.raises(ValueError, match="Calibrator"):
        q.enable_calib()


def test_state_dict_round_trip_creates_amax():
    src = TensorQuantizer(QuantDescriptor(axis=0))
    src.enable_calib()
    src.disable_quant()
    src(torch.tensor([[1.0, -3.0], [0.5, 0.25], [7.0, 1.0]]))
    src.load_calib_amax()
    src.enable_quant()
    buf = io.BytesIO()
    torch.save(src.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert set(state) == {"_amax"}
    assert src.state_dict()._metadata[""]["version"] == TensorQuantizer._version == 1
    dst = TensorQuantizer(QuantDescriptor(axis=0))
    assert dst.amax is None
    dst.load_state_dict(state)
    assert torch.equal(dst.amax, src.amax) and dst.amax.shape == (3, 1)
    x = torch.randn(3, 5)
    assert torch.equal(dst(x), src(x))


def test_state_dict_shape_mismatch_is_an_error():
    dst = TensorQuantizer(QuantDescriptor(amax=[1.0, 2.0]))
    with pytest.raises(RuntimeError, match="size mismatch"):
        dst.load_state_dict({"_amax": torch.ones(3)})


def test_amax_setter():
    q = TensorQuantizer()
    q.amax = 2.0
    assert q.amax.item() == 2.0 and q.amax.dtype == torch.float32
    q.amax = torch.tensor(4.0)
    assert q.amax.item() == 4.0
    with pytest.raises(ValueError, match="cannot change"):
        q.amax = [1.0, 2.0]
    with pytest.raises(ValueError, match=">= 0"):
        q.amax = -1.0
    with pytest.raises(ValueError, match="None"):
        q.amax = None


def test_fp8_mode():
    q = TensorQuantizer(QuantDescriptor(num_bits=(4, 3), amax=2.0))
    assert q.maxbound == 448.0
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(500, generator=gen) * 2
    s = torch.tensor(448.0) / torch.tensor(2.0)
    expected = (x * s).clamp(-448, 448).to(torch.float8_e4m3fn).float() / s
    assert torch.equal(q(x), expected)
    q = TensorQuantizer(QuantDescriptor(num_bits=(4, 3), amax=2.0, fake_quant=False))
    assert torch.equal(q(x), (x * s).clamp(-448, 448).to(torch.float8_e4m3fn).float())


def test_unsigned_quantizer_rejects_negative_input():
    q = TensorQuantizer(QuantDescriptor(amax=1.0, unsigned=True))
    assert torch.equal(q(torch.tensor([0.5, 1.0])), _fq(torch.tensor([0.5, 1.0]), 1.0, unsigned=True))
    with pytest.raises(TypeError, match="unsigned"):
        q(torch.tensor([-0.5, 1.0]))


def test_num_bits_and_flag_setters():
    q = TensorQuantizer(QuantDescriptor(amax=1.0))
    q.num_bits = 4
    q.narrow_range = True
    x = torch.tensor([0.3, -2.0])
    assert torch.equal(q(x), _fq(x, 1.0, num_bits=4, narrow=True))
    assert q.calibrator.num_bits == 4
    with pytest.raises(ValueError):
        q.num_bits = 40
    with pytest.raises(TypeError):
        q.unsigned = "yes"


def test_learned_amax_gets_gradient_through_clip():
    q = TensorQuantizer(QuantDescriptor(amax=1.0, learn_amax=True))
    assert q._if_clip and q.clip.clip_value_max.requires_grad
    x = torch.tensor([-2.0, -0.5, 0.5, 3.0], requires_grad=True)
    y = q(x)
    assert torch.equal(y.detach(), _fq(x.detach().clamp(-1, 1), 1.0))
    y.backward(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert x.grad.tolist() == [0.0, 2.0, 3.0, 0.0]
    assert q.clip.clip_value_max.grad.item() == 4.0 and q.clip.clip_value_min.grad.item() == 1.0
    q.disable_clip()
    assert not q.clip.clip_value_max.requires_grad


def test_learned_amax_needs_initialisation():
    q = TensorQuantizer(QuantDescriptor(learn_amax=True))
    assert not q._if_clip  # nothing to clip to yet
    with pytest.raises(RuntimeError, match="not initialised"):
        q(torch.ones(3))
    q.enable_calib()
    q.disable_quant()
    x = torch.tensor([0.5, -2.0])
    assert q(x) is x
    q.load_calib_amax()
    q.init_learn_amax()
    q.enable_quant()
    assert q._if_clip and q.clip.clip_value_max.item() == 2.0 and q.clip.clip_value_min.item() == -2.0
    assert torch.equal(q(torch.tensor([1.0])), _fq(torch.tensor([1.0]), 2.0))
    q.enable_clip()
    q2 = TensorQuantizer(QuantDescriptor(learn_amax=True), if_clip=True)
    q2.disable_quant()
    with pytest.raises(RuntimeError, match="not initialised"):
        q2(torch.ones(3))


def test_clip_needs_learn_amax():
    with pytest.raises(ValueError, match="learn_amax"):
        TensorQuantizer(QuantDescriptor(), if_clip=True)
    with pytest.raises(RuntimeError, match="learn_amax=False"):
        TensorQuantizer().init_learn_amax()


def test_gradient_ste_through_quantizer():
    q = TensorQuantizer(QuantDescriptor(amax=1.0))
    x = torch.tensor([-1.0, 0.5, 1.0, 1.5], requires_grad=True)
    q(x).sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0, 0.0]


def test_half_input():
    q = TensorQuantizer(QuantDescriptor(amax=1.0))
    x = torch.tensor([0.3, -0.7, 2.0], dtype=torch.float16)
    y = q(x)
    assert y.dtype == torch.float16 and torch.equal(y, _fq(x, 1.0).half())


def test_extra_repr():
    r = repr(TensorQuantizer(QuantDescriptor(num_bits=4, axis=0, narrow_range=True)))
    assert "4bit" in r and "narrow" in r and "axis=0" in r and "amax=dynamic" in r and "MaxCalibrator" in r


def test_quantizer_matches_functions():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 6, generator=gen)
    amax = torch.rand(4, 1, generator=gen) + 0.2
    q = TensorQuantizer(QuantDescriptor(amax=amax.numpy(), narrow_range=True))
    assert torch.equal(q(x), fake_tensor_quant(x, amax))
    q = TensorQuantizer(QuantDescriptor(amax=amax.numpy(), narrow_range=True, fake_quant=False))
    assert torch.equal(q(x), tensor_quant(x, amax)[0])
