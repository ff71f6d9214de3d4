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
    import pytest

    with pytest.raises(ValueError, match="shape"):
        q.min = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(TypeError, match="nn.Parameter"):
        q.max = torch.zeros(2)


def test_nested_compute_encodings_is_an_error():
    import pytest

    q = Q.affine.QuantizeDequantize(shape=(), bitwidth=8)
    with q.compute_encodings():
        q(torch.ones(3))
        with pytest.raises(RuntimeError, match="already active"):
            with q.compute_encodings():
                pass
    assert q.is_initialized()
