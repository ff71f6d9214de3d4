"""LinearActivationQuantizedTensor: int8 weight + per-token int8 activations, against quant_primitives."""

import pytest
import torch
import torch.nn.functional as F

from quanta.dtypes import (
    AffineQuantizedTensor,
    LinearActivationQuantizedTensor,
    UintxLayout,
)
from quanta.quantization import quant_primitives as P
from quanta.quantization.quant_primitives import MappingType, ZeroPointDomain

SYM, ASYM = MappingType.SYMMETRIC, MappingType.ASYMMETRIC
N, K = 24, 64
G = torch.Generator().manual_seed(77)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=G).to(dtype)


def int8_weight(n=N, k=K, dtype=torch.float32):
    return AffineQuantizedTensor.from_hp_to_intx(randn(n, k, dtype=dtype), SYM, (1, k), torch.int8,
                                                 eps=torch.finfo(torch.float32).eps, zero_point_dtype=torch.int64)


def reference(x, w, bias, act):
    """y = s_x s_w ((q_x - z_x) @ q_w.T) + b, activations quantized per token by quant_primitives, in float64."""
    k = x.shape[-1]
    x2 = x.reshape(-1, k).float()
    if act is SYM:
        s, _ = P.choose_qparams_affine(x2, SYM, (1, k), torch.int8, -127, 127, eps=1e-5)
        zp = None
        q = P.quantize_affine(x2, (1, k), s, None, torch.int8, -127, 127)
    else:
        s, zp = P.choose_qparams_affine(x2, ASYM, (1, k), torch.int8, -128, 127, eps=torch.finfo(torch.float32).eps)
        q = P.quantize_affine(x2, (1, k), s, zp, torch.int8, -128, 127)
    qw, sw, _ = w.tensor_impl.get_plain()
    qx = q.double() - (0 if zp is None else zp.double().reshape(-1, 1))
    y = (qx @ qw.double().t()) * s.double().reshape(-1, 1) * sw.double().reshape(1, -1)
    if bias is not None:
        y = y + bias.double()
    return y.reshape(*x.shape[:-1], w.shape[0])


@pytest.mark.parametrize("act", [SYM, ASYM], ids=str)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(5, K), (2, 3, K), (1, K)])
def test_linear_matches_per_token_reference(act, bias, shape):
    w = int8_weight()
    lw = LinearActivationQuantizedTensor(w, act)
    x = randn(*shape) * 3
    b = randn(N) if bias else None
    y = F.linear(x, lw, b)
    ref = reference(x, w, b, act)
    assert y.dtype == torch.float32 and y.shape == ref.shape
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))
    # and close to the float matmul with the dequantized weight (activation rounding only)
    fl = F.linear(x, w.dequantize(), b)
    assert (y - fl).norm() < 2e-2 * fl.norm()


@pytest.mark.parametrize("act", [SYM, ASYM], ids=str)
def test_asymmetric_activations_use_the_zero_point(act):
    w = int8_weight()
    lw = LinearActivationQuantizedTensor(w, act)
    x = randn(4, K).abs() + 2.0  # all positive: the asymmetric grid is twice as fine
    ref = F.linear(x, w.dequantize())
    err = (F.linear(x, lw) - ref).norm() / ref.norm()
    assert err < (4e-3 if act is ASYM else 8e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("act", [SYM, ASYM], ids=str)
def test_low_precision_inputs(dtype, act):
    w = int8_weight(dtype=dtype)
    lw = LinearActivationQuantizedTensor(w, act)
    assert lw.dtype == dtype
    x = randn(3, K, dtype=dtype)
    b = randn(N, dtype=dtype)
    y = F.linear(x, lw, b)
    assert y.dtype == dtype
    ref = F.linear(x.float(), w.dequantize(torch.float32), b.float())
    assert (y.float() - ref).norm() < 3e-2 * ref.norm()


def test_mm_and_addmm_paths():
    w = int8_weight()
    lw = LinearActivationQuantizedTensor(w, SYM)
    x = randn(4, K)
    b = randn(N)
    ref = reference(x, w, b, SYM).float()
    torch.testing.assert_close(torch.addmm(b, x, lw.t()), ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(torch.mm(x, lw.t()), reference(x, w, None, SYM).float(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(x @ lw.t(), reference(x, w, None, SYM).float(), rtol=1e-5, atol=1e-4)
    # alpha/beta and a weight on the left: weight-only path on the dequantized weight
    deq = w.dequantize()
    torch.testing.assert_close(torch.addmm(b, x, lw.t(), beta=0.5, alpha=2.0),
                               torch.addmm(b, x, deq.t(), beta=0.5, alpha=2.0), rtol=2e-2, atol=5e-2)
    xr = randn(K, 3)
    torch.testing.assert_close(torch.mm(lw, xr), deq @ xr, rtol=2e-2, atol=5e-2)


def test_gradient_reaches_input():
    w = int8_weight()
    lw = LinearActivationQuantizedTensor(w, SYM)
    x = randn(3, K).requires_grad_(True)
    g = randn(3, N)
    F.linear(x, lw).backward(g)
    torch.testing.assert_close(x.grad, g @ w.dequantize(), rtol=2e-2, atol=5e-2)


def test_views_act_on_the_weight(fresh_fallback_warnings):
    w = int8_weight()
    lw = LinearActivationQuantizedTensor(w, ASYM)
    deq = w.dequantize()
    assert torch.equal(lw.dequantize(), deq)
    t = lw.t()
    assert type(t) is LinearActivationQuantizedTensor and t.shape == (K, N)
    assert torch.equal(t.dequantize(), deq.t())
    assert type(t.t()) is LinearActivationQuantizedTensor and torch.equal(t.t().dequantize(), deq)
    rows = lw[2:10]
    assert type(rows) is AffineQuantizedTensor and torch.equal(rows.dequantize(), deq[2:10])
    assert torch.equal(F.embedding(torch.tensor([1, 5]), lw), deq[[1, 5]])
    with pytest.warns(UserWarning):
        assert torch.equal(torch.sin(lw), torch.sin(deq))
    with pytest.raises(TypeError):
        lw.add_(1)


def test_detach_clone_to():
    w = int8_weight()
    lw = LinearActivationQuantizedTensor(w, ASYM)
    x = randn(3, K)
    y = F.linear(x, lw)
    for other in (lw.detach(), lw.clone(), lw.to("cpu", copy=True)):
        assert type(other) is LinearActivationQuantizedTensor
        assert other.act_mapping_type is ASYM and not other.requires_grad
        assert torch.equal(F.linear(x, other), y)
    c = lw.clone()
    assert c.original_weight_tensor.tensor_impl.int_data.data_ptr() != w.tensor_impl.int_data.data_ptr()
    h = lw.to(torch.float16)
    assert type(h) is LinearActivationQuantizedTensor and h.dtype == torch.float16
    assert F.linear(x.half(), h).dtype == torch.float16
    assert lw.to("cpu") is lw


def test_col_sums_and_bytes():
    w = int8_weight()
    codes = w.tensor_impl.get_plain()[0]
    asym = LinearActivationQuantizedTensor(w, ASYM)
    assert torch.equal(asym.weight_col_sums, codes.to(torch.int32).sum(1))
    assert asym.storage_nbytes == w.storage_nbytes + N * 4
    sym = LinearActivationQuantizedTensor(w, SYM)  # the native kernel needs them for symmetric activations too
    assert torch.equal(sym.weight_col_sums, asym.weight_col_sums)
    assert sym.storage_nbytes == w.storage_nbytes + N * 4


def test_copy_between_matching_tensors_updates_everything():
    a = LinearActivationQuantizedTensor(int8_weight(), ASYM)
    b = LinearActivationQuantizedTensor(int8_weight(), ASYM)
    x = randn(4, K) + 1.0
    expected = F.linear(x, b)
    a.copy_(b)
    assert torch.equal(a.dequantize(), b.dequantize())
    assert torch.equal(F.linear(x, a), expected)


def test_weight_requirements():
    x = randn(N, K)
    with pytest.raises(TypeError):
        LinearActivationQuantizedTensor(x, SYM)
    with pytest.raises(ValueError):
        LinearActivationQuantizedTensor(int8_weight(), MappingType.SYMMETRIC_NO_CLIPPING_ERR)
    bad = [
        AffineQuantizedTensor.from_hp_to_intx(x, SYM, (1, 32), torch.int8),  # per group
        AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, K), torch.int8),  # zero point
        AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, K), torch.uint8),
        AffineQuantizedTensor.from_hp_to_intx(x, SYM, (1, K), torch.int4, _layout=UintxLayout(torch.int4)),
        AffineQuantizedTensor.from_hp_to_intx(x, SYM, (1, K), torch.int8).t(),
        AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, K), torch.int8, zero_point_dtype=torch.float32,
                                              preserve_zero=False, zero_point_domain=ZeroPointDomain.FLOAT),
        AffineQuantizedTensor.from_hp_to_floatx(x, (1, K), torch.float8_e4m3fn),
    ]
    for w in bad:
        with pytest.raises(ValueError):
            LinearActivationQuantizedTensor(w, SYM)


def test_flatten_round_trip():
    lw = LinearActivationQuantizedTensor(int8_weight(), ASYM).t()
    names, meta = lw.__tensor_flatten__()
    back = LinearActivationQuantizedTensor.__tensor_unflatten__({n: getattr(lw, n) for n in names}, meta, None, None)
    assert type(back) is LinearActivationQuantizedTensor and back.shape == lw.shape
    assert torch.equal(back.dequantize(), lw.dequantize())


def test_float64_input():
    w = int8_weight().to(torch.float64)
    lw = LinearActivationQuantizedTensor(w, SYM)
    x = randn(3, K, dtype=torch.float64)
    y = F.linear(x, lw)
    assert y.dtype == torch.float64
    ref = F.linear(x, w.dequantize())
    assert (y - ref).norm() < 2e-2 * ref.norm()


@pytest.mark.parametrize("act", [SYM, ASYM])
def test_linear_under_inference_mode_takes_the_integer_kernel(act):
    """Under inference_mode aten.linear reaches dispatch whole (3-D input): it must not fall back to a float copy."""
    import warnings

    lw = LinearActivationQuantizedTensor(int8_weight(), act)
    x, bias = randn(2, 5, K, dtype=torch.bfloat16), randn(N, dtype=torch.bfloat16)
    want = lw.linear(x, bias)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.inference_mode():
            got = F.linear(x, lw, bias)
            got_nobias = F.linear(x, lw)
    assert torch.equal(got, want) and torch.equal(got_nobias, lw.linear(x))
