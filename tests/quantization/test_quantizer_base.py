import pytest
import torch

import quanta.quantization as Q


def test_state_dict_without_initialized_flag_is_upgraded():
    q = Q.affine.QuantizeDequantize(shape=(2, 1), bitwidth=8, symmetric=True)
    q.set_range(torch.tensor([[-1.0], [-2.0]]), torch.tensor([[1.0], [2.0]]))
    sd = {k: v for k, v in q.state_dict().items() if k != "_initialized"}  # an older/foreign checkpoint
    fresh = Q.affine.QuantizeDequantize(shape=(2, 1), bitwidth=8, symmetric=True)
    fresh.load_state_dict(sd)
    assert fresh.is_initialized()
    x = torch.randn(2, 5)
    assert torch.equal(fresh(x), q(x))


def test_initialized_flag_is_a_persistent_buffer():
    q = Q.affine.Quantize(shape=(), bitwidth=4)
    assert "_initialized" in q.state_dict()
    assert q.state_dict()["_initialized"].item() is False
    q.set_range(-1.0, 1.0)
    assert q.state_dict()["_initialized"].item() is True


def test_assigning_min_and_max_parameters_initialises_like_aimet():
    # (AIMET's docstring uses block_size=(1, 5) on a (5, 10) input, which silently mixes rows there;
    # quanta rejects a block size that does not fit, so this uses a per-row quantizer.)
    q = Q.affine.Quantize(shape=(5, 1), bitwidth=8, symmetric=False)
    assert not q.is_initialized()
    q.min = torch.nn.Parameter(-torch.ones_like(q.min))
    assert not q.is_initialized()  # both ends are needed
    q.max = torch.nn.Parameter(torch.ones_like(q.max))
    assert q.is_initialized()
    out = q(torch.zeros(5, 10))
    s = torch.tensor(2.0) / 255  # float32, as the quantizer computes it
    zero_point = -torch.round(torch.tensor(-1.0) / s)  # -1 / s = -127.49999 in float32 -> 127
    assert zero_point.item() == 127.0
    assert torch.equal(out.as_subclass(torch.Tensor).detach(), torch.full((5, 10), 127.0))  # 0.0 -> zero point


def test_assigning_wrong_parameters_is_rejected():
    q = Q.affine.Quantize(shape=(2,), bitwidth=8)

    with pytest.raises(ValueError, match="shape"):
        q.min = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(TypeError, match="nn.Parameter"):
        q.max = torch.zeros(2)


def test_nested_compute_encodings_is_an_error():

    q = Q.affine.QuantizeDequantize(shape=(), bitwidth=8)
    with q.compute_encodings():
        q(torch.ones(3))
        with pytest.raises(RuntimeError, match="already active"):
            with q.compute_encodings():
                pass
    assert q.is_initialized()


def test_cached_qparams_follow_every_kind_of_range_write():
    q = Q.affine.QuantizeDequantize(shape=(), bitwidth=8)
    q.set_range(-1.0, 1.0)
    x = torch.linspace(-3, 3, 101)
    before = q(x).as_subclass(torch.Tensor).detach()
    q.max.data.copy_(torch.tensor(3.0))  # a write through .data does not bump the version counter
    after = q(x).as_subclass(torch.Tensor).detach()
    assert after.max().item() == pytest.approx(3.0, abs=0.02) and before.max().item() < 1.1
    with torch.no_grad():
        q.min.fill_(-3.0)
    assert q(x).as_subclass(torch.Tensor).min().item() == pytest.approx(-3.0, abs=0.02)
    q.min = torch.nn.Parameter(torch.tensor(-0.5))
    q.max = torch.nn.Parameter(torch.tensor(0.5))
    assert q(x).as_subclass(torch.Tensor).max().item() < 0.55


def test_output_encoding_is_the_one_used_even_after_the_range_changes():
    q = Q.affine.QuantizeDequantize(shape=(), bitwidth=8)
    q.set_range(-1.0, 1.0)
    y = q(torch.randn(10))
    q.set_range(-4.0, 4.0)
    assert y.encoding.scale.item() == pytest.approx(2 / 255)
    assert y.encoding.scale.grad_fn is None  # a snapshot: the quantizer has moved on
    z = q(torch.randn(10))
    assert z.encoding.scale.item() == pytest.approx(8 / 255)
    assert z.encoding.scale.grad_fn is not None  # still current: carries the graph to min/max


def test_module_gradients_equal_the_long_way_round():
    # the single autograd node must give the gradients of composing qparams ops with the kernel
    from quanta.kernels import affine as K
    from quanta.kernels.qparams import offset_from_range, scale_from_range

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 10, generator=gen) * 2
    up = torch.randn(6, 10, generator=gen)
    q = Q.affine.QuantizeDequantize(shape=(6, 1), bitwidth=4, symmetric=False)
    with q.compute_encodings():
        q(x * 0.7)
    xa = x.clone().requires_grad_()
    q(xa).backward(up)
    mn = q.min.detach().clone().requires_grad_()
    mx = q.max.detach().clone().requires_grad_()
    xb = x.clone().requires_grad_()
    s = scale_from_range(mn, mx, q.grid)
    o = offset_from_range(mn, s, q.grid, False)
    K.quantize_dequantize(xb, s, o, q.grid).backward(up)
    assert torch.equal(xa.grad, xb.grad)
    torch.testing.assert_close(q.min.grad, mn.grad, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(q.max.grad, mx.grad, rtol=1e-6, atol=1e-7)
