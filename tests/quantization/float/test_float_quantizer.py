import copy
import io
import math
import pickle

import pytest
import torch

import quanta.quantization as Q
from quanta.encodings.float import FloatEncoding
from quanta.grids.float import FLOAT8_E4M3FN, FP4_E2M1
from quanta.kernels.float_cast import fake_cast


def test_dtype_quantizer_is_a_pure_cast_at_construction():
    for dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float16, torch.bfloat16):
        q = Q.float.FloatQuantizeDequantize(dtype=dtype)
        assert q.is_initialized()
        assert q.get_scale().item() == 1.0
        x = torch.randn(1000) * 10
        x = x[x.abs() <= torch.finfo(dtype).max]
        out = q(x)
        assert type(out) is Q.DequantizedTensor and isinstance(out.encoding, FloatEncoding)
        assert torch.equal(out.as_subclass(torch.Tensor), x.to(dtype).to(torch.float32))


def test_alias_and_repr():
    assert Q.float.QuantizeDequantize is Q.float.FloatQuantizeDequantize
    assert repr(Q.float.FloatQuantizeDequantize(dtype=torch.float8_e4m3fn)) == \
        "FloatQuantizeDequantize(dtype=torch.float8_e4m3fn)"
    assert repr(Q.float.FloatQuantizeDequantize(exponent_bits=2, mantissa_bits=1, finite=True)) == \
        "FloatQuantizeDequantize(exponent_bits=2, mantissa_bits=1, finite=True, unsigned_zero=False)"


def test_aimet_default_e4m3_is_ieee_like_with_max_240():
    q = Q.float.FloatQuantizeDequantize(exponent_bits=4, mantissa_bits=3)
    assert q.maxval.item() == 240.0  # as AIMET prints for FloatQuantizeDequantize(4, 3)
    assert q(torch.tensor([1000.0])).item() == 240.0


def test_compute_encodings_sets_absmax_per_channel():
    q = Q.float.FloatQuantizeDequantize(exponent_bits=4, mantissa_bits=3, finite=True, shape=(3, 1))
    x = torch.tensor([[1.0, -2.0], [0.5, 0.25], [-8.0, 3.0]])
    with q.compute_encodings():
        q(x)
    assert q.maxval.flatten().tolist() == [2.0, 0.5, 8.0]
    scale = q.maxval / 448.0
    assert torch.equal(q(x).as_subclass(torch.Tensor), fake_cast(x / scale, FLOAT8_E4M3FN) * scale)


def test_calibration_accumulates_and_uses_batch_range_inside():
    q = Q.float.FloatQuantizeDequantize(exponent_bits=2, mantissa_bits=1, finite=True)
    with q.compute_encodings():
        a = q(torch.tensor([0.0, 1.5]))
        q(torch.tensor([-3.0]))
    assert q.maxval.item() == 3.0
    assert a.as_subclass(torch.Tensor).tolist() == [0.0, 1.5]  # first batch used its own maxval 1.5


def test_sixteen_bit_formats_keep_scale_one():
    q = Q.float.FloatQuantizeDequantize(dtype=torch.float16)
    with q.compute_encodings():
        q(torch.tensor([0.001, 0.002]))
    assert q.get_scale().item() == 1.0


def test_all_zero_calibration_gives_a_positive_scale():
    q = Q.float.FloatQuantizeDequantize(dtype=torch.float8_e4m3fn)
    with q.compute_encodings():
        q(torch.zeros(10))
    assert q.maxval.item() > 0 and math.isfinite(q.maxval.item())
    assert not torch.isnan(q(torch.zeros(10))).any()


def test_learnable_maxval_gets_a_gradient_and_moves():
    torch.manual_seed(0)
    q = Q.float.FloatQuantizeDequantize(exponent_bits=2, mantissa_bits=1, finite=True)
    x = torch.randn(4096)
    with q.compute_encodings():
        q(x)
    q.maxval = torch.nn.Parameter(q.maxval.clone())
    opt = torch.optim.Adam([q.maxval], lr=0.05)
    first = None
    for _ in range(30):
        opt.zero_grad()
        loss = ((q(x) - x) ** 2).mean()
        loss.backward()
        first = loss.item() if first is None else first
        opt.step()
    assert q.maxval.grad is not None
    assert loss.item() < first  # fp4 with a learned range beats absmax on Gaussian data


def test_input_gradient_is_straight_through_for_every_format():
    for kwargs in ({"dtype": torch.float8_e5m2}, {"exponent_bits": 3, "mantissa_bits": 2, "finite": True}):
        q = Q.float.FloatQuantizeDequantize(**kwargs)
        q.set_range(1.0)
        x = torch.tensor([0.3, -0.9, 1.0, 1.5, -7.0], requires_grad=True)
        q(x).sum().backward()
        assert x.grad.tolist() == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_dequantized_tensor_carries_float_encoding():
    q = Q.float.FloatQuantizeDequantize(dtype=torch.float8_e4m3fn)
    q.set_range(2.0)
    y = q(torch.tensor([0.3, -1.9, 5.0]))
    v = y.quantize()
    assert type(v) is Q.QuantizedTensor
    assert torch.equal(v.dequantize(), y)
    r = y.quantized_repr()
    assert r.dtype == torch.float8_e4m3fn
    assert torch.equal(r.float() * y.encoding.scale, y.as_subclass(torch.Tensor))
    fp4 = Q.float.FloatQuantizeDequantize(exponent_bits=2, mantissa_bits=1, finite=True)
    with pytest.raises(ValueError, match="no dtype"):
        fp4(torch.tensor([1.0])).quantized_repr()


def test_state_dict_copy_pickle():
    q = Q.float.FloatQuantizeDequantize(dtype=torch.float8_e4m3fn, shape=(2, 1))
    q.set_range(torch.tensor([[1.0], [3.0]]))
    x = torch.randn(2, 5)
    fresh = Q.float.FloatQuantizeDequantize(dtype=torch.float8_e4m3fn, shape=(2, 1))
    fresh.load_state_dict(q.state_dict())
    assert torch.equal(fresh(x), q(x))
    assert torch.equal(copy.deepcopy(q)(x), q(x))
    assert torch.equal(pickle.loads(pickle.dumps(q))(x), q(x))
    buf = io.BytesIO()
    torch.save(q(x), buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=False)
    assert back.encoding == q(x).encoding


def test_encoding_dict_round_trip():
    enc = FloatEncoding(torch.tensor([0.5, 2.0]), FP4_E2M1, (-1,))
    assert FloatEncoding.from_dict(enc.to_dict()) == enc
    with pytest.raises(ValueError, match="missing key"):
        FloatEncoding.from_dict({"scale": [1.0]})


def test_bad_arguments():
    with pytest.raises(TypeError, match="mutually exclusive"):
        Q.float.FloatQuantizeDequantize(exponent_bits=4, mantissa_bits=3, dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="give dtype"):
        Q.float.FloatQuantizeDequantize(exponent_bits=4)
    with pytest.raises(ValueError, match="exponent_bits"):
        Q.float.FloatQuantizeDequantize(exponent_bits=0, mantissa_bits=3)
    with pytest.raises(ValueError, match="mantissa_bits"):
        Q.float.FloatQuantizeDequantize(exponent_bits=4, mantissa_bits=24)
    with pytest.raises(ValueError, match="dtype must be one of"):
        Q.float.FloatQuantizeDequantize(dtype=torch.float32)
    q = Q.float.FloatQuantizeDequantize(dtype=torch.float8_e4m3fn, shape=(3, 1))
    with pytest.raises(ValueError, match="does not broadcast"):
        q(torch.ones(4, 4))
    with pytest.raises(ValueError, match="positive and finite"):
        q.set_range(-1.0)
    with pytest.raises(TypeError, match="floating-point"):
        q(torch.ones(3, 4, dtype=torch.int32))
