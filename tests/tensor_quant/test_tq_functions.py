"""The functional surface of quanta.tensor_quant, used the way pytorch_quantization code uses it."""

import inspect

import pytest
import torch

import quanta.tensor_quant as tq
from quanta.kernels import amax_quant


def test_names_and_signatures_follow_the_anchor():
    for name in ("tensor_quant", "fake_tensor_quant", "TensorQuantFunction", "FakeTensorQuantFunction",
                 "ScaledE4M3Function", "scaled_e4m3", "QuantDescriptor", "ScaledQuantDescriptor",
                 "TensorQuantizer", "MaxCalibrator", "HistogramCalibrator", "QUANT_DESC_8BIT_PER_TENSOR"):
        assert name in tq.__all__ and hasattr(tq, name)
    params = inspect.signature(tq.TensorQuantFunction.forward).parameters
    assert list(params) == ["ctx", "inputs", "amax", "num_bits", "unsigned", "narrow_range"]
    assert (params["num_bits"].default, params["unsigned"].default, params["narrow_range"].default) == (8, False, True)
    sig = inspect.signature(tq.fake_tensor_quant).parameters
    assert (sig["num_bits"].default, sig["unsigned"].default, sig["narrow_range"].default) == (8, False, True)


def test_apply_with_defaults_uses_narrow_8bit():
    # seed 004: "for num_bits=8, it uses [-127, 127] instead of [-128, 127]"
    x = torch.tensor([-5.0, -1.0, 1.0, 5.0])
    codes, scale = tq.TensorQuantFunction.apply(x, torch.tensor(1.0))
    assert codes.tolist() == [-127.0, -127.0, 127.0, 127.0] and scale.item() == 127.0
    out = tq.FakeTensorQuantFunction.apply(x, torch.tensor(1.0))
    assert out.tolist() == [-1.0, -1.0, 1.0, 1.0]


def test_apply_positional_arguments_like_nvidia():
    x = torch.tensor([-5.0, 0.5, 5.0])
    codes, scale = tq.TensorQuantFunction.apply(x, torch.tensor(1.0), 8, False, False)
    assert codes.tolist() == [-128.0, 64.0, 127.0]
    codes, scale = tq.TensorQuantFunction.apply(x.abs(), torch.tensor(1.0), 4, True, True)
    assert scale.item() == 15.0 and codes.tolist() == [15.0, 8.0, 15.0]  # 7.5 -> 8 (even)


def test_dequantize_with_returned_scale_equals_fake_quant():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 50, generator=gen)
    amax = x.abs().amax(dim=1, keepdim=True) * 0.8
    codes, scale = tq.tensor_quant(x, amax)
    assert torch.equal(codes / scale, tq.fake_tensor_quant(x, amax))


def test_outputs_of_tensor_quant_hold_integers_within_bounds():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(1000, generator=gen) * 3
    for num_bits, unsigned, narrow in [(8, False, True), (8, False, False), (5, True, False), (2, False, False)]:
        xi = x.abs() if unsigned else x
        codes, _ = tq.tensor_quant(xi, torch.tensor(2.0), num_bits, unsigned, narrow)
        lo, hi = tq.tensor_quant_bounds(num_bits, unsigned, narrow)
        assert torch.equal(codes, codes.round())
        assert codes.min().item() == lo and codes.max().item() == hi


def test_functions_are_the_kernels():
    # one implementation: the dialect re-exports the kernel layer's functions
    assert tq.fake_tensor_quant is amax_quant.fake_tensor_quant
    assert tq.TensorQuantFunction is amax_quant.TensorQuantFunction


def test_scaled_e4m3_signature_and_errors():
    x = torch.tensor([0.1, 0.3, 1.0, 3.0])
    assert torch.equal(tq.scaled_e4m3(x, torch.tensor(1.0), 4, 3), tq.fake_e4m3_quant(x, torch.tensor(1.0)))
    assert torch.equal(tq.ScaledE4M3Function.apply(x, torch.tensor(1.0), 4, 3), tq.scaled_e4m3(x, torch.tensor(1.0)))
    with pytest.raises(NotImplementedError):
        tq.ScaledE4M3Function.apply(x, torch.tensor(1.0), 5, 2)


def test_gradient_through_apply():
    x = torch.tensor([-2.0, -1.0, 0.0, 1.0, 2.0], requires_grad=True)
    tq.FakeTensorQuantFunction.apply(x, torch.tensor(1.0), 8, False, True).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]


def test_amax_may_be_a_python_float():
    assert torch.equal(tq.fake_tensor_quant(torch.tensor([0.5]), 1.0), tq.fake_tensor_quant(torch.tensor([0.5]),
                                                                                            torch.tensor(1.0)))


def test_reduce_amax_per_axis():
    x = torch.arange(24.0).reshape(2, 3, 4) - 12
    assert tq.reduce_amax(x).item() == 12.0
    a = tq.reduce_amax(x, axis=1)
    assert a.shape == (1, 3, 1)
    assert a.flatten().tolist() == [max(abs(v) for v in x[:, c, :].flatten().tolist()) for c in range(3)]
    assert torch.equal(tq.reduce_amax(x, axis=(0, -1)), x.abs().amax(dim=1, keepdim=True))
    with pytest.raises(ValueError, match="out of range"):
        tq.reduce_amax(x, axis=3)
