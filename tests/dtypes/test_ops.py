"""Operations on AffineQuantizedTensor, each against the same operation on the dequantized tensor."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from quanta.dtypes import (
    AffineQuantizedTensor,
    FloatxTensorCoreLayout,
    Int4CPULayout,
    UintxLayout,
)
from quanta.quantization.quant_primitives import MappingType, ZeroPointDomain

SYM, ASYM = MappingType.SYMMETRIC, MappingType.ASYMMETRIC
FLOAT, NONE = ZeroPointDomain.FLOAT, ZeroPointDomain.NONE
N, K = 32, 128
G = torch.Generator().manual_seed(2024)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=G).to(dtype)


def _int4cpu(w, group=32):
    return AffineQuantizedTensor.from_hp_to_intx(w, ASYM, (1, group), torch.int32, 0, 15, zero_point_dtype=w.dtype,
                                                 preserve_zero=False, zero_point_domain=FLOAT,
                                                 _layout=Int4CPULayout())


# name -> (constructor, fused kernel?)  Fused kernels round activations to bfloat16.
CASES = {
    "int8_per_row": (lambda w: AffineQuantizedTensor.from_hp_to_intx(w, SYM, (1, w.shape[1]), torch.int8), True),
    "int8_per_row_none": (lambda w: AffineQuantizedTensor.from_hp_to_intx(w, SYM, (1, w.shape[1]), torch.int8,
                                                                         zero_point_domain=NONE), True),
    "int8_per_row_asym": (lambda w: AffineQuantizedTensor.from_hp_to_intx(w + 0.5, ASYM, (1, w.shape[1]), torch.int8),
                          True),
    "int8_group_asym": (lambda w: AffineQuantizedTensor.from_hp_to_intx(w, ASYM, (1, 32), torch.int8), False),
    "uint8_per_tensor": (lambda w: AffineQuantizedTensor.from_hp_to_intx(w, ASYM, tuple(w.shape), torch.uint8),
                         False),
    "int8_2d_blocks": (lambda w: AffineQuantizedTensor.from_hp_to_intx(w, SYM, (4, 32), torch.int8), False),
    "int4_uintx": (lambda w: AffineQuantizedTensor.from_hp_to_intx(w, SYM, (1, 32), torch.int4,
                                                                  _layout=UintxLayout(torch.int4)), False),
    "uint3_uintx": (lambda w: AffineQuantizedTensor.from_hp_to_intx(w, ASYM, (1, 16), torch.uint3,
                                                                   _layout=UintxLayout(torch.uint3)), False),
    "uint4_uintx_float_zp": (lambda w: AffineQuantizedTensor.from_hp_to_intx(
        w, ASYM, (1, 32), torch.uint4, zero_point_dtype=w.dtype, preserve_zero=False, zero_point_domain=FLOAT,
        _layout=UintxLayout(torch.uint4)), False),
    "float8_e4m3_row": (lambda w: AffineQuantizedTensor.from_hp_to_floatx(w, (1, w.shape[1]), torch.float8_e4m3fn),
                        False),
    "float8_e5m2_blocks": (lambda w: AffineQuantizedTensor.from_hp_to_floatx(w, (4, 32), torch.float8_e5m2), False),
    "fp6_e3m2": (lambda w: AffineQuantizedTensor.from_hp_to_fpx(w, FloatxTensorCoreLayout(3, 2)), False),
    "fp4_e2m1": (lambda w: AffineQuantizedTensor.from_hp_to_fpx(w, FloatxTensorCoreLayout(2, 1)), False),
    "int4_cpu": (_int4cpu, True),
}
NAMES = list(CASES)


def make(name, n=N, k=K, dtype=torch.float32):
    return CASES[name][0](randn(n, k, dtype=dtype))


def assert_close(y, ref, fused):
    assert y.dtype == ref.dtype and y.shape == ref.shape
    y, ref = y.double(), ref.double()
    if fused:  # bfloat16 activations and output: ~2**-8 relative per element
        assert (y - ref).norm() <= 1e-2 * ref.norm()
        torch.testing.assert_close(y, ref, rtol=3e-2, atol=3e-2 * float(ref.abs().max()))
    else:
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5 * float(ref.abs().max()))


def assert_close_dtype(y, ref, fused, dtype):
    if dtype == torch.float32:
        return assert_close(y, ref, fused)
    assert y.dtype == ref.dtype == dtype and y.shape == ref.shape
    yd, rd = y.double(), ref.double()
    tol = 3e-2 if fused or dtype == torch.bfloat16 else 5e-3
    assert (yd - rd).norm() <= tol * rd.norm()


# ------------------------------------------------------------------ F.linear and matmuls
@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_2d(name, bias):
    w = make(name)
    x = randn(5, K)
    b = randn(N) if bias else None
    ref = F.linear(x, w.dequantize(), b)
    assert_close(F.linear(x, w, b), ref, CASES[name][1])


@pytest.mark.parametrize("name", NAMES)
def test_linear_3d_input(name):
    w = make(name)
    x = randn(2, 3, K)
    b = randn(N)
    ref = F.linear(x, w.dequantize(), b)
    y = F.linear(x, w, b)
    assert y.shape == (2, 3, N)
    assert_close(y, ref, CASES[name][1])
    assert_close(x @ w.t(), x @ w.dequantize().t(), CASES[name][1])
    assert_close(torch.matmul(x, w.t()), torch.matmul(x, w.dequantize().t()), CASES[name][1])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_linear_low_precision_input(name, dtype):
    w = make(name)
    x = randn(4, K, dtype=dtype)
    b = randn(N, dtype=dtype)
    ref = F.linear(x, w.dequantize(dtype), b)
    assert_close_dtype(F.linear(x, w, b), ref, CASES[name][1], dtype)


@pytest.mark.parametrize("name", ["int8_group_asym", "int4_uintx", "float8_e4m3_row", "fp6_e3m2", "int4_cpu",
                                  "int8_per_row"])
def test_linear_bf16_weight(name):
    w = make(name, dtype=torch.bfloat16)
    assert w.dtype == torch.bfloat16
    x = randn(4, K, dtype=torch.bfloat16)
    assert_close_dtype(F.linear(x, w), F.linear(x, w.dequantize()), CASES[name][1], torch.bfloat16)


@pytest.mark.parametrize("name", NAMES)
def test_mm_both_sides_and_addmm(name):
    w = make(name)
    fused = CASES[name][1]
    deq = w.dequantize()
    x = randn(6, K)
    assert_close(torch.mm(x, w.t()), torch.mm(x, deq.t()), fused)
    xr = randn(K, 7)
    assert_close(torch.mm(w, xr), torch.mm(deq, xr), fused)  # weight on the left
    bias = randn(N)
    assert_close(torch.addmm(bias, x, w.t()), torch.addmm(bias, x, deq.t()), fused)
    assert_close(torch.addmm(bias, x, w.t(), beta=0.5, alpha=2.0), torch.addmm(bias, x, deq.t(), beta=0.5, alpha=2.0),
                 fused)
    assert_close(torch.addmm(bias, x, w.t(), beta=0.0), x @ deq.t(), fused)
    bias2 = randn(N, 7)
    assert_close(torch.addmm(bias2, w, xr, beta=2.0, alpha=-1.0), torch.addmm(bias2, deq, xr, beta=2.0, alpha=-1.0),
                 fused)


def test_linear_empty_batch_and_single_row():
    for name in ("int8_per_row", "int4_cpu", "int4_uintx", "fp6_e3m2"):
        w = make(name)
        assert F.linear(torch.empty(0, K), w).shape == (0, N)
        x1 = randn(1, K)
        assert_close(F.linear(x1, w), F.linear(x1, w.dequantize()), CASES[name][1])


@pytest.mark.parametrize("name", NAMES)
def test_linear_float64(name):
    w = make(name).to(torch.float64)
    x = randn(3, K, dtype=torch.float64)
    b = randn(N, dtype=torch.float64)
    y = F.linear(x, w, b)
    ref = F.linear(x, w.dequantize(), b)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10 * float(ref.abs().max()))


@pytest.mark.parametrize("name", NAMES)
def test_linear_on_slices_and_views(name, fresh_fallback_warnings):
    """Weights cut out of a larger one (offset storage, rebuilt layouts) still multiply right."""
    w = make(name, n=48, k=K)
    deq = w.dequantize()
    x = randn(3, K)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # some cuts fall back to plain tensors
        for rows in (slice(1, 9), slice(16, 48), slice(None, None, 3)):
            part = w[rows]
            assert_close(F.linear(x, part), F.linear(x, deq[rows]), CASES[name][1])
        cols = w[:, 32:96]
        assert_close(F.linear(x[:, :64], cols), F.linear(x[:, :64], deq[:, 32:96]), CASES[name][1])
        tt = w.t().t()
        assert_close(F.linear(x, tt), F.linear(x, deq), CASES[name][1])


@pytest.mark.parametrize("k", [24, 40, 8, 3])
def test_int8_per_row_any_k_takes_the_kernel(k):
    w = make("int8_per_row", n=16, k=k)
    x = randn(3, k)
    assert_close(F.linear(x, w), F.linear(x, w.dequantize()), True)  # the kernel's bfloat16 scale


def test_linear_input_errors():
    w = make("int4_uintx")
    with pytest.raises(ValueError):
        F.linear(randn(2, K + 1), w)
    with pytest.raises((TypeError, RuntimeError)):
        F.linear(torch.ones(2, K, dtype=torch.int32), w)


def test_tiled_linear_matches_on_many_tiles(monkeypatch):
    from quanta.dtypes import ops

    monkeypatch.setattr(ops, "_TILE_ELEMENTS", 3 * K)  # tiles of 3 rows (rounded to the row block)
    for name in ("int8_2d_blocks", "uint3_uintx", "fp6_e3m2"):
        w = make(name, n=40)
        x = randn(3, K)
        assert_close(F.linear(x, w), F.linear(x, w.dequantize()), False)
        assert_close(torch.mm(x[:, :40], w), x[:, :40] @ w.dequantize(), False)  # transposed storage path


# ------------------------------------------------------------------ gradients reach x
@pytest.mark.parametrize("name", NAMES)
def test_gradient_flows_to_input(name):
    w = make(name)
    x = randn(3, K).requires_grad_(True)
    b = randn(N)
    g = randn(3, N)
    F.linear(x, w, b).backward(g)
    x_ref = x.detach().clone().requires_grad_(True)
    F.linear(x_ref, w.dequantize(), b).backward(g)
    assert_close(x.grad, x_ref.grad, CASES[name][1])
    assert not w.requires_grad and w.grad is None


# ------------------------------------------------------------------ t / transpose / permute
@pytest.mark.parametrize("name", NAMES)
def test_transpose_family(name):
    w = make(name)
    deq = w.dequantize()
    for t in (w.t(), w.transpose(0, 1), w.transpose(-1, -2), w.permute(1, 0), w.mT):
        assert type(t) is AffineQuantizedTensor and t.shape == (K, N)
        assert t.block_size == tuple(reversed(w.block_size))
        assert torch.equal(t.dequantize(), deq.t())
    tt = w.t().t()
    assert type(tt) is AffineQuantizedTensor and torch.equal(tt.dequantize(), deq)
    assert tt.tensor_impl.transposed is False
    assert torch.equal(w.transpose(0, 0).dequantize(), deq)
    assert torch.equal(w.permute(0, 1).dequantize(), deq)


# ------------------------------------------------------------------ view / reshape
VIEWABLE = [n for n in NAMES if not n.startswith("fp")]


@pytest.mark.parametrize("name", VIEWABLE)
def test_views_that_keep_quantization(name, fresh_fallback_warnings):
    w = make(name)
    deq = w.dequantize()
    shapes = [(N, K // 32, 32), (N // 4, 4, K), (1, N, K), (N, K, 1)]
    if w.block_size[0] == 1 and w.block_size[1] == K:
        shapes.append((N * K,))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback here
        for shape in shapes:
            for v in (w.view(shape), w.reshape(shape), w.view(*shape)):
                assert type(v) is AffineQuantizedTensor, shape
                assert v.shape == shape
                assert torch.equal(v.dequantize(), deq.reshape(shape))
        back = w.view(N // 4, 4, K).view(N, K)
        assert type(back) is AffineQuantizedTensor and torch.equal(back.dequantize(), deq)


@pytest.mark.parametrize("name", ["fp6_e3m2", "fp4_e2m1"])
def test_fpx_row_preserving_view(name):
    w = make(name)
    v = w.view(N, K)
    assert torch.equal(v.dequantize(), w.dequantize())


@pytest.mark.parametrize("shape", [(N * K,), (N, K // 32, 32), (2 * N, K // 2), (N // 2, 2 * K)])
def test_fpx_views_that_change_rows(shape, fresh_fallback_warnings):
    w = make("fp6_e3m2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        v = w.view(shape)
    out = v.dequantize() if isinstance(v, AffineQuantizedTensor) else v
    assert torch.equal(out, w.dequantize().view(shape))


def test_fpx_select_row(fresh_fallback_warnings):
    # fpx codes are 2-D with one scale per row: a row of them is dequantized (with the fallback warning)
    w = make("fp6_e3m2")
    with pytest.warns(UserWarning, match="aten.select.int"):
        r = w[3]
    assert not isinstance(r, AffineQuantizedTensor)
    assert torch.equal(r, w.dequantize()[3])


@pytest.mark.parametrize("name, n, k, shape", [("int8_2d_blocks", 32, 128, (4096,)),
                                               ("float8_e5m2_blocks", 32, 128, (64, 64)),
                                               ("int8_group_asym", 24, 96, (48, 48)),  # groups of 32 vs rows of 48
                                               ("uint3_uintx", 24, 96, (96, 24)),  # groups of 16 vs rows of 24
                                               ("int8_per_row", 24, 96, (64, 36))])
def test_views_that_cannot_keep_quantization_fall_back(name, n, k, shape, fresh_fallback_warnings):
    w = make(name, n, k)
    deq = w.dequantize()
    with pytest.warns(UserWarning, match="dequantized"):
        v = w.reshape(shape)
    assert not isinstance(v, AffineQuantizedTensor)
    assert torch.equal(v, deq.reshape(shape))
    v = w.view(shape)  # same for view, without a second warning
    assert not isinstance(v, AffineQuantizedTensor) and torch.equal(v, deq.view(shape))


# ------------------------------------------------------------------ slicing, narrow, select, index
@pytest.mark.parametrize("name", NAMES)
def test_slices_that_keep_quantization(name, fresh_fallback_warnings):
    w = make(name)
    deq = w.dequantize()
    br, bc = w.block_size
    cases = [(slice(0, 16), slice(None)), (slice(16, 32), slice(None)), (slice(None), slice(0, 64)),
             (slice(None), slice(64, 128)), (slice(0, 16), slice(32, 96))]
    if br == 1:
        cases += [(slice(2, 9), slice(None)), (slice(None, None, 2), slice(None)), (slice(1, 30, 3), slice(None))]
    if bc == K:
        cases += [(slice(None), slice(3, 20))]
    if bc == 1:
        cases += [(slice(None), slice(None, None, 3))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for rows, cols in cases:
            s = w[rows, cols]
            assert type(s) is AffineQuantizedTensor, (rows, cols)
            assert torch.equal(s.dequantize(), deq[rows, cols]), (rows, cols)
        for dim, start, length in ((0, 16, 16), (1, 32, 64)):
            s = w.narrow(dim, start, length)
            assert type(s) is AffineQuantizedTensor
            assert torch.equal(s.dequantize(), deq.narrow(dim, start, length))


@pytest.mark.parametrize("name", ["int8_group_asym", "int4_uintx", "float8_e5m2_blocks", "int8_2d_blocks",
                                  "uint4_uintx_float_zp"])
def test_slices_that_cut_blocks_fall_back(name, fresh_fallback_warnings):
    w = make(name)
    deq = w.dequantize()
    with pytest.warns(UserWarning, match="dequantized"):
        s = w[:, 3:17]
    assert not isinstance(s, AffineQuantizedTensor)
    assert torch.equal(s, deq[:, 3:17])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for rows, cols in ((slice(None), slice(None, None, 2)), (slice(None), slice(5, 6)), (slice(1, 3), slice(1, 3))):
            s = w[rows, cols]
            out = s.dequantize() if isinstance(s, AffineQuantizedTensor) else s
            assert torch.equal(out, deq[rows, cols])


@pytest.mark.parametrize("name", [n for n in NAMES if not n.startswith("fp")])
def test_select(name):
    w = make(name)
    deq = w.dequantize()
    for idx in (0, 5, -1):
        for got, exp in ((w[idx], deq[idx]), (w[:, idx], deq[:, idx]), (w.select(1, idx), deq.select(1, idx))):
            out = got.dequantize() if isinstance(got, AffineQuantizedTensor) else got
            assert out.shape == exp.shape and torch.equal(out, exp)
    assert type(w[3]) is AffineQuantizedTensor
    with pytest.raises(IndexError):
        w[N]
    with pytest.raises(IndexError):
        w.select(1, -K - 1)


@pytest.mark.parametrize("name", NAMES)
def test_integer_index_tensors(name):
    w = make(name)
    deq = w.dequantize()
    for idx in (torch.tensor([0, 5, 3, 5]), torch.tensor([-1, 2]), torch.tensor([4], dtype=torch.int32),
                torch.tensor([31, 0, 31])):
        got = w[idx]
        out = got.dequantize() if isinstance(got, AffineQuantizedTensor) else got
        assert torch.equal(out, deq[idx.long()]), idx
    assert type(w[torch.tensor([1, 2])]) is AffineQuantizedTensor
    with pytest.raises(IndexError):
        w[torch.tensor([N])]


@pytest.mark.parametrize("name", NAMES)
def test_two_dim_index_tensor(name):
    w = make(name)
    deq = w.dequantize()
    idx = torch.tensor([[1, 2], [31, 0]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fpx results are dequantized (3-D fpx codes are not a layout)
        got = w[idx]
    out = got.dequantize() if isinstance(got, AffineQuantizedTensor) else got
    assert out.shape == (2, 2, K) and torch.equal(out, deq[idx])


@pytest.mark.parametrize("name", NAMES)
def test_empty_index_tensor(name):
    w = make(name)
    got = w[torch.tensor([], dtype=torch.int64)]
    out = got.dequantize() if isinstance(got, AffineQuantizedTensor) else got
    assert out.shape == (0, K) and out.dtype == torch.float32


def test_boolean_mask_index_falls_back(fresh_fallback_warnings):
    w = make("int4_uintx")
    mask = torch.zeros(N, dtype=torch.bool)
    mask[[1, 4]] = True
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = w[mask]
    out = got.dequantize() if isinstance(got, AffineQuantizedTensor) else got
    assert torch.equal(out, w.dequantize()[mask])


# ------------------------------------------------------------------ embedding
@pytest.mark.parametrize("name", NAMES)
def test_embedding(name):
    w = make(name)  # N rows of K features
    idx = torch.tensor([[0, 3, 31], [3, 3, 7]])
    assert torch.equal(F.embedding(idx, w), F.embedding(idx, w.dequantize()))
    assert torch.equal(F.embedding(torch.tensor([5]), w), w.dequantize()[5:6])
    emb = torch.nn.Embedding(N, K)
    emb.weight = torch.nn.Parameter(w, requires_grad=False)
    assert torch.equal(emb(idx), F.embedding(idx, w.dequantize()))
    with pytest.raises(IndexError):
        F.embedding(torch.tensor([N]), w)
    with pytest.raises(IndexError):
        F.embedding(torch.tensor([-1]), w)


def test_embedding_in_bf16():
    w = make("uint3_uintx", dtype=torch.bfloat16)
    idx = torch.tensor([1, 2, 2])
    out = F.embedding(idx, w)
    assert out.dtype == torch.bfloat16 and torch.equal(out, w.dequantize()[idx])


# ------------------------------------------------------------------ in place, unsupported ops
@pytest.mark.parametrize("name", ["int8_per_row", "int4_uintx", "float8_e4m3_row", "fp6_e3m2", "int4_cpu"])
def test_in_place_ops_raise(name):
    w = make(name)
    before = w.dequantize()
    for op in (lambda: w.add_(1), lambda: w.mul_(2.0), lambda: w.zero_(), lambda: w.fill_(0.5),
               lambda: w.clamp_(-1, 1), lambda: w.copy_(torch.zeros(N, K))):
        with pytest.raises(TypeError):
            op()
    with torch.no_grad(), pytest.raises(TypeError):
        w.sub_(1)
    assert torch.equal(w.dequantize(), before)


@pytest.mark.parametrize("name", ["int8_group_asym", "fp6_e3m2", "int4_cpu"])
def test_unsupported_op_warns_once_and_is_right(name, fresh_fallback_warnings):
    w = make(name)
    deq = w.dequantize()
    with pytest.warns(UserWarning, match="aten.sin"):
        out = torch.sin(w)
    assert type(out) is torch.Tensor and torch.equal(out, torch.sin(deq))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per operation
        assert torch.equal(torch.sin(w), torch.sin(deq))
    with pytest.warns(UserWarning, match="aten.add"):
        assert torch.equal(w + 1, deq + 1)
    with pytest.warns(UserWarning):
        assert torch.equal(w * w, deq * deq)
    with pytest.warns(UserWarning):
        assert torch.equal(w.sum(), deq.sum())


def test_matmul_of_two_quantized_tensors_falls_back(fresh_fallback_warnings):
    a, b = make("int8_group_asym"), make("int4_uintx")
    with pytest.warns(UserWarning):
        out = torch.mm(a, b.t())
    assert torch.equal(out, torch.mm(a.dequantize(), b.dequantize().t()))


def test_int8_kernel_sees_scales_and_zero_points_changed_in_place():
    # the fused int8 path prepares bf16 scales once per weight; an in-place change must be picked up
    w = AffineQuantizedTensor.from_hp_to_intx(randn(32, 64), MappingType.ASYMMETRIC, (1, 64), torch.int8)
    x = randn(3, 64)
    before = F.linear(x, w)
    w.tensor_impl.scale.mul_(2)
    assert torch.allclose(F.linear(x, w), F.linear(x, w.dequantize()), rtol=2e-2, atol=2e-2)
    assert not torch.allclose(F.linear(x, w), before)
    w.tensor_impl.zero_point.add_(1)
    assert torch.allclose(F.linear(x, w), F.linear(x, w.dequantize()), rtol=2e-2, atol=2e-2)


# ------------------------------------------------------------------ F.linear's remembered kernel call
_KERNEL_CASES = ["int8_per_row", "int8_per_row_none", "int4_cpu"]  # the fused kernels serve these


def _native_or_skip():
    from quanta.kernels import int_linear_native

    int_linear_native.ops()
    if int_linear_native.status() != "native":
        pytest.skip("the native kernels are not built here")


@pytest.mark.parametrize("name", _KERNEL_CASES)
def test_remembered_kernel_call_gives_the_first_calls_bits(name):
    _native_or_skip()
    w = make(name, k=96)
    x, bias = randn(2, 5, 96), randn(N)
    first = F.linear(x, w, bias)  # chooses the kernel and remembers it
    assert w.__dict__["_kernel_call"][0] is w.tensor_impl
    assert torch.equal(F.linear(x, w, bias), first)
    assert torch.equal(F.linear(x.bfloat16(), w), linear_via_matmul(x.bfloat16(), w))


def linear_via_matmul(x, w):
    from quanta.dtypes.ops import linear

    return linear(x, w)


def test_remembered_kernel_call_follows_a_new_storage_and_copies():
    _native_or_skip()
    import copy
    import pickle

    w = make("int4_cpu")
    x = randn(1, K)
    y = F.linear(x, w)
    other = make("int4_cpu")
    want = F.linear(x, other)
    w.tensor_impl = other.tensor_impl  # a new storage: looked at again, not served by the old record
    assert torch.equal(F.linear(x, w), want) and not torch.equal(want, y)
    twin = copy.deepcopy(other)  # the record is copied with it; the copy computes with its own storage
    assert "_kernel_call" in twin.__dict__
    twin.tensor_impl.packed_weight.zero_()  # every code 0
    got = F.linear(x, twin)
    assert torch.equal(F.linear(x, other), want) and not torch.equal(got, want)
    assert_close(got, x @ twin.dequantize().t(), fused=True)
    assert "_kernel_call" not in pickle.loads(pickle.dumps(other)).__dict__


@pytest.mark.parametrize("name", _KERNEL_CASES)
def test_remembered_kernel_call_serves_nn_linear_biases(name, monkeypatch):
    # nn.Linear's bias is a Parameter that requires grad: without autograd (inference) the remembered call serves
    # it; with autograd on, the dispatch path records the graph
    _native_or_skip()
    from quanta.dtypes import ops

    w = make(name)
    bias = torch.nn.Parameter(randn(N))
    x = randn(2, K)
    with torch.inference_mode():
        want = F.linear(x, w, bias)  # chooses the kernel and remembers it
        monkeypatch.setattr(ops, "linear", lambda *a, **k: pytest.fail("the checked path ran"))
        assert torch.equal(F.linear(x, w, bias), want)
    with torch.no_grad():
        assert torch.equal(F.linear(x, w, bias), want)
    monkeypatch.undo()
    y = F.linear(x, w, bias)
    y.sum().backward()
    assert bias.grad is not None and torch.equal(y.detach(), want)


def test_no_kernel_call_is_remembered_for_the_tiled_path():
    w = make("int8_per_row_asym")  # a nonzero zero point: the int8 kernel does not take it
    F.linear(randn(1, K), w)
    assert "_kernel_call" not in w.__dict__


@pytest.mark.parametrize("name", _KERNEL_CASES)
def test_remembered_kernel_call_leaves_other_inputs_to_the_checked_path(name):
    _native_or_skip()
    w = make(name)
    F.linear(randn(1, K), w)
    with pytest.raises(ValueError, match="features"):
        F.linear(randn(1, K + 1), w)
    x = randn(2, K).requires_grad_()
    y = F.linear(x, w)  # autograd through the dispatch path
    y.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert F.linear(randn(2, K).double(), w).dtype == torch.float64  # not a kernel dtype: the tiled path
