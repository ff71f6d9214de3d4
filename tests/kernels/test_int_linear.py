"""Integer-weight linear kernels on CPU: int8 weight-only, int4 group-wise, int8 dynamic activations.

References are float64 computations from the exact activations and the
dequantized weight. The tolerance is the module's documented bound: float32
accumulation with fused multiply-adds, ``(K + 3) * 2**-24 * sum_k |x_k w_k|``
(one more term for the int4 weight's own rounding), plus one rounding of the
output to its dtype (``u * (|y| + |bias|)``, ``u = 2**-8`` for bfloat16, ``2**-11``
for float16, ``2**-24`` for float32). The instruction-set paths and shape classes
are in ``test_int_linear_native.py``.
"""

import sys

import pytest
import torch

from quanta.kernels.int_linear import (
    check_int4_cpu_shape,
    int4_cpu_linear,
    int4_cpu_packed_shape,
    int4_cpu_scale_and_zero_shape,
    int8_dynamic_activation_linear,
    int8_weight_col_sums,
    int8_weight_only_linear,
    pack_int4_cpu,
    prepare_int8_dynamic,
    prepare_int8_weight_only,
    quantize_per_token_int8,
    unpack_int4_cpu,
)

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
LEADING = [(0,), (1,), (3,), (32,), (2, 3)]  # M = 0, 1, 3, 32 rows, and 3-D x
_UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _x(lead, k, dtype, seed):
    return torch.randn(*lead, k, generator=_gen(seed)).to(dtype)


def _bias(n, dtype, with_bias, seed=7):
    return (torch.randn(n, generator=_gen(seed)) * 4).to(dtype) if with_bias else None


def _assert_close_to_reference(y, x, w_deq, bias, dtype):
    """``y`` vs float64 ``x @ w_deq.T + bias`` within float32 accumulation and one rounding to ``dtype``."""
    assert y.dtype == dtype
    k = w_deq.shape[1]
    xd = x.double().reshape(-1, k)
    ref = xd @ w_deq.T
    mag = xd.abs() @ w_deq.abs().T
    b = 0.0 if bias is None else bias.double().abs()
    tol = (k + 3) * 2.0**-24 * mag + _UNIT_ROUNDOFF[dtype] * (ref.abs() + b) + 1e-30
    if bias is not None:
        ref = ref + bias.double()
    got = y.double().reshape(ref.shape)
    assert torch.isfinite(got).all()
    err = (got - ref).abs()
    assert bool((err <= tol).all()), f"max error {float(err.max()):.3g}, worst excess {float((err - tol).max()):.3g}"


# --------------------------------------------------------------------------- int8 weight-only
def _int8_weight(n, k, seed=1):
    g = _gen(seed)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    scale = torch.rand(n, generator=g) * 0.02 + 0.001
    return w, scale


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", LEADING)
@pytest.mark.parametrize("with_bias", [False, True])
def test_int8_weight_only_matches_float64_reference(dtype, lead, with_bias):
    n, k = 48, 64
    w, scale = _int8_weight(n, k)
    qw, s = prepare_int8_weight_only(w, scale)
    x = _x(lead, k, dtype, seed=2)
    bias = _bias(n, dtype, with_bias)
    y = int8_weight_only_linear(x, qw, s, bias)
    assert y.shape == (*lead, n)
    w_deq = w.double() * scale.to(torch.bfloat16).double()[:, None]
    _assert_close_to_reference(y, x, w_deq, bias, dtype)


def test_int8_weight_only_non_contiguous_and_misaligned_x():
    n, k = 32, 64
    w, scale = _int8_weight(n, k)
    qw, s = prepare_int8_weight_only(w, scale)
    x_t = torch.randn(2, k, 5, generator=_gen(3)).transpose(1, 2)  # [2, 5, K], strided
    want = int8_weight_only_linear(x_t.contiguous(), qw, s)
    assert torch.equal(int8_weight_only_linear(x_t, qw, s), want)
    one = int8_weight_only_linear(x_t[1, 2:3].contiguous(), qw, s)[0]  # 1-D x, as F.linear (same row count)
    assert torch.equal(int8_weight_only_linear(x_t[1, 2], qw, s), one)
    # bfloat16 rows starting 16 bytes past an aligned address
    flat = torch.randn(3 * k + 8, generator=_gen(4)).to(torch.bfloat16)
    x_off = flat[8:].view(3, k)
    assert x_off.data_ptr() % 32 != 0
    assert torch.equal(int8_weight_only_linear(x_off, qw, s), int8_weight_only_linear(x_off.clone(), qw, s))


def test_prepare_int8_weight_only_keeps_aligned_weight_and_rounds_scale():
    w, scale = _int8_weight(16, 32)
    qw, s = prepare_int8_weight_only(w, scale.reshape(16, 1))
    assert qw.data_ptr() == w.data_ptr()  # already contiguous and aligned: no copy
    assert s.dtype == torch.bfloat16 and s.shape == (16,) and torch.equal(s, scale.to(torch.bfloat16))
    shifted = torch.randint(-128, 128, (16 * 32 + 1,), dtype=torch.int8)[1:].view(16, 32)
    qw2, _ = prepare_int8_weight_only(shifted, scale)
    assert qw2.data_ptr() % 64 == 0 and torch.equal(qw2, shifted)


def test_int8_weight_only_fp16_large_activations_do_not_overflow():
    # |x| = 1e4, K = 4096: partial sums reach ~2e7, far beyond float16, while the outputs fit
    n, k = 16, 4096
    g = _gen(5)
    x = torch.full((2, k), 1e4)
    x[:, k // 2:] = -1e4
    x += torch.randn(2, k, generator=g) * 100
    x = x.to(torch.float16)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    scale = torch.full((n,), 2e-5)
    qw, s = prepare_int8_weight_only(w, scale)
    y = int8_weight_only_linear(x, qw, s)
    w_deq = w.double() * s.double()[:, None]
    ref = x.double() @ w_deq.T
    assert ref.abs().max() < 65504 and ref.abs().max() > 1000
    _assert_close_to_reference(y, x, w_deq, None, torch.float16)


def test_int8_weight_only_fp16_result_just_below_fp16_max_is_exact():
    # float16 outputs are rounded once from float32: 65440 and 65504 stay themselves (no bfloat16 step)
    k = 16
    x = torch.zeros(1, k, dtype=torch.float16)
    qw, s = prepare_int8_weight_only(torch.ones(16, k, dtype=torch.int8), torch.ones(16))
    for v in (65440.0, 65504.0, -65440.0):
        x[0, 0] = v
        assert torch.all(int8_weight_only_linear(x, qw, s) == v)
    # a true overflow stays inf, as in F.linear
    x[0, 0], x[0, 1] = 60000.0, 60000.0
    assert torch.isinf(int8_weight_only_linear(x, qw, s)).all()


def test_int8_weight_only_bad_inputs_name_the_argument():
    w, scale = _int8_weight(16, 32)
    qw, s = prepare_int8_weight_only(w, scale)
    x = torch.randn(2, 32)
    with pytest.raises(TypeError, match="weight_int8"):
        prepare_int8_weight_only(w.float(), scale)
    with pytest.raises(ValueError, match="K = 0"):
        prepare_int8_weight_only(torch.zeros(16, 0, dtype=torch.int8), scale)
    with pytest.raises(ValueError, match="scale"):
        prepare_int8_weight_only(w, torch.ones(15))
    with pytest.raises(ValueError, match="scale.*non-finite"):
        prepare_int8_weight_only(w, torch.full((16,), float("nan")))
    # an unprepared float32 scale is rounded to bfloat16 per call: the same result
    assert torch.equal(int8_weight_only_linear(x, qw, scale), int8_weight_only_linear(x, qw, s))
    with pytest.raises(ValueError, match=r"scale must have shape \(16,\)"):
        int8_weight_only_linear(x, qw, s[:8])
    with pytest.raises(TypeError, match="scale"):
        int8_weight_only_linear(x, qw, s.to(torch.int32))
    with pytest.raises(ValueError, match="weight_int8 must be contiguous.*prepare_int8_weight_only"):
        int8_weight_only_linear(x, qw.t().contiguous().t(), s)
    with pytest.raises(TypeError, match="x must be"):
        int8_weight_only_linear(x.to(torch.float64), qw, s)
    with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., 32\]"):
        int8_weight_only_linear(torch.randn(2, 31), qw, s)
    with pytest.raises(ValueError, match="bias"):
        int8_weight_only_linear(x, qw, s, torch.ones(15))
    with pytest.raises(TypeError, match="bias"):
        int8_weight_only_linear(x, qw, s, torch.ones(16, dtype=torch.int32))


# --------------------------------------------------------------------------- int4 weight-only
def _int4_weight(n, k, group_size, seed=11):
    g = _gen(seed)
    groups = -(-k // group_size)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    scale = torch.rand(n, groups, generator=g) * 0.1 + 0.01
    zero = torch.randn(n, groups, generator=g) * 0.1
    return codes, scale, zero


def _int4_dequantized(codes, scale, zero, group_size):
    k = codes.shape[1]
    s = scale.to(torch.bfloat16).double().repeat_interleave(group_size, dim=1)[:, :k]
    z = zero.to(torch.bfloat16).double().repeat_interleave(group_size, dim=1)[:, :k]
    return (codes.double() - 8) * s + z


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", LEADING)
@pytest.mark.parametrize("with_bias", [False, True])
def test_int4_cpu_matches_float64_reference(dtype, lead, with_bias):
    n, k, gs = 48, 128, 32
    codes, scale, zero = _int4_weight(n, k, gs)
    packed, sz = pack_int4_cpu(codes, scale, zero, gs)
    x = _x(lead, k, dtype, seed=12)
    bias = _bias(n, dtype, with_bias)
    y = int4_cpu_linear(x, packed, sz, gs, n, bias)
    assert y.shape == (*lead, n)
    _assert_close_to_reference(y, x, _int4_dequantized(codes, scale, zero, gs), bias, dtype)


@pytest.mark.parametrize("n,k,gs", [(16, 64, 32), (64, 256, 64), (80, 128, 128), (112, 256, 256), (144, 64, 32),
                                    (1, 1, 32), (7, 100, 64), (33, 129, 128), (24, 300, 256)])
def test_int4_cpu_group_sizes_and_tails(n, k, gs):
    codes, scale, zero = _int4_weight(n, k, gs, seed=n + k)
    packed, sz = pack_int4_cpu(codes.to(torch.int32), scale, zero, gs)
    for m in (1, 3, 9):
        x = _x((m,), k, torch.bfloat16, seed=13)
        y = int4_cpu_linear(x, packed, sz, gs, n)
        _assert_close_to_reference(y, x, _int4_dequantized(codes, scale, zero, gs), None, torch.bfloat16)


@pytest.mark.parametrize("n,k,gs", [(16, 32, 32), (48, 64, 32), (64, 128, 64), (80, 256, 128), (176, 256, 256),
                                    (5, 33, 32), (3, 1, 256), (9, 200, 64)])
def test_int4_pack_unpack_round_trip(n, k, gs):
    codes, scale, zero = _int4_weight(n, k, gs, seed=n)
    packed, sz = pack_int4_cpu(codes, scale, zero, gs)
    assert packed.shape == int4_cpu_packed_shape(n, k) == (-(-n // 16), 512 * -(-k // 64))
    assert packed.dtype == torch.uint8
    assert sz.shape == int4_cpu_scale_and_zero_shape(n, k, gs) == (-(-n // 16), -(-k // gs), 2, 16)
    assert sz.dtype == torch.bfloat16
    c2, s2, z2 = unpack_int4_cpu(packed, sz, gs, n, k)
    assert c2.dtype == torch.uint8 and torch.equal(c2, codes)
    assert torch.equal(s2, scale.to(torch.bfloat16)) and torch.equal(z2, zero.to(torch.bfloat16))
    assert torch.equal(pack_int4_cpu(c2, s2, z2, gs)[0], packed)


def test_int4_packing_is_documented_and_machine_independent():
    codes = torch.zeros(17, 70, dtype=torch.uint8)
    codes[0, :8] = torch.tensor([1, 2, 3, 4, 5, 6, 7, 9])  # row 0, line 0
    codes[2, 8], codes[2, 15], codes[16, 69] = 10, 11, 12  # row 2, line 1; row 16 (tile 1), line 8
    scale, zero = torch.arange(51.0).reshape(17, 3) + 1, -torch.arange(51.0).reshape(17, 3)
    packed, sz = pack_int4_cpu(codes, scale, zero, 32)
    assert packed.shape == (2, 1024) and sz.shape == (2, 3, 2, 16)
    t0, t1 = packed[0].tolist(), packed[1].tolist()
    # row r's word at byte 4 r of each 64-byte line, bytes (k0 | k2 << 4), (k4 | k6 << 4), (k1 | k3 << 4),
    # (k5 | k7 << 4)
    assert t0[0:4] == [0x31, 0x75, 0x42, 0x96] and t0[4:8] == [0, 0, 0, 0]
    assert t0[64 + 8:64 + 12] == [0x0A, 0, 0, 0xB0]  # k = 8 at byte 0's low nibble, k = 15 at byte 3's high
    assert t1[8 * 64:8 * 64 + 4] == [0x00, 0x80, 0x00, 0x8C]  # k = 64..69, then padding codes 8 (k = 70, 71)
    assert t1[8 * 64 + 4:8 * 64 + 8] == [0x88] * 4  # row 17: a padding row, all codes 8
    # (scale, zero) of tile t, group g: 16 scales then 16 zeros; padding rows 0
    assert sz[0, 1, 0, :3].tolist() == [2.0, 5.0, 8.0] and sz[0, 1, 1, :3].tolist() == [-1.0, -4.0, -7.0]
    assert sz[1, 2, 0, :2].tolist() == [51.0, 0.0] and sz[1, 2, 1, :2].tolist() == [-50.0, 0.0]


def test_large_packed_weights_are_huge_page_backed_exact_copies(tmp_path):
    import mmap

    from quanta.kernels import int_linear as K

    n, k = 4096, 1024  # 2 MiB of packed codes: one huge page
    codes, scale, zero = _int4_weight(n, k, 128, seed=5)
    packed, sz = pack_int4_cpu(codes, scale, zero, 128)
    assert packed.untyped_storage().nbytes() == packed.numel()  # no slack that torch.save would write
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert packed.data_ptr() % (2 << 20) == 0
    assert torch.equal(unpack_int4_cpu(packed, sz, 128, n, k)[0], codes)
    x = _x((2,), k, torch.bfloat16, seed=6)
    _assert_close_to_reference(int4_cpu_linear(x, packed, sz, 128, n), x, _int4_dequantized(codes, scale, zero, 128),
                               None, torch.bfloat16)
    torch.save(packed, tmp_path / "p.pt")
    assert torch.equal(torch.load(tmp_path / "p.pt"), packed)
    t = torch.arange(3 << 20, dtype=torch.int32).view(3, -1)[:, ::2]  # not contiguous
    c = K._huge_page_backed(t)
    assert torch.equal(c, t) and c.is_contiguous() and c.data_ptr() != t.data_ptr()
    small = torch.ones(4, 5)
    assert torch.equal(K._huge_page_backed(small), small)


def _vm_flags(addr):
    """VmFlags of the mapping of this process that holds ``addr`` (from /proc/self/smaps)."""
    lo = hi = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(v, 16) for v in head.split("-"))
            elif head == "VmFlags:" and lo <= addr < hi:
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and MADV_HUGEPAGE: Linux")
def test_huge_page_advice_covers_a_weight_tail_only_when_the_padding_is_small():
    from quanta.kernels import int_linear as K

    mib = 1 << 20
    tail_padded = torch.ones(6 * mib - 64 * 1024, dtype=torch.uint8)  # 64 KiB of padding: 1/96 of it
    tail_small = torch.ones(2 * mib + 64 * 1024, dtype=torch.uint8)  # padding ~1 page: 94 % of it
    a, b = K._huge_page_backed(tail_padded), K._huge_page_backed(tail_small)
    assert torch.equal(a, tail_padded) and torch.equal(b, tail_small)
    assert a.untyped_storage().nbytes() == a.numel() and b.untyped_storage().nbytes() == b.numel()
    assert "hg" in _vm_flags(a.data_ptr()) and "hg" in _vm_flags(a.data_ptr() + a.numel() - 1)
    assert "hg" in _vm_flags(b.data_ptr()) and "hg" not in _vm_flags(b.data_ptr() + b.numel() - 1)


def test_int4_fp16_result_just_below_fp16_max_is_exact():
    codes = torch.full((16, 32), 9, dtype=torch.uint8)  # weight (9 - 8) * 1 + 0 = 1
    packed, sz = pack_int4_cpu(codes, torch.ones(16, 1), torch.zeros(16, 1), 32)
    x = torch.zeros(1, 32, dtype=torch.float16)
    x[0, 0] = 65440.0
    y = int4_cpu_linear(x, packed, sz, 32, 16)
    assert torch.all(y == 65440.0)


def test_int4_bad_inputs_name_the_argument():
    codes, scale, zero = _int4_weight(16, 64, 32)
    packed, sz = pack_int4_cpu(codes, scale, zero, 32)
    with pytest.raises(ValueError, match="group_size must be one of"):
        pack_int4_cpu(codes, scale, zero, 16)
    with pytest.raises(TypeError, match="group_size"):
        pack_int4_cpu(codes, scale, zero, 32.0)
    with pytest.raises(ValueError, match="N = 0"):
        pack_int4_cpu(torch.zeros(0, 64, dtype=torch.uint8), torch.ones(0, 2), torch.zeros(0, 2), 32)
    with pytest.raises(ValueError, match=r"scale must have shape \(16, 2\) = \(N, ceil\(K / group_size\)\)"):
        pack_int4_cpu(torch.zeros(16, 96, dtype=torch.uint8), torch.ones(16, 1), torch.zeros(16, 1), 64)
    with pytest.raises(ValueError, match="0..15"):
        pack_int4_cpu(codes + 1, scale, zero, 32)
    with pytest.raises(TypeError, match="codes"):
        pack_int4_cpu(codes.float(), scale, zero, 32)
    with pytest.raises(ValueError, match=r"scale must have shape \(16, 2\)"):
        pack_int4_cpu(codes, scale.t(), zero, 32)
    with pytest.raises(ValueError, match="zero.*non-finite"):
        pack_int4_cpu(codes, scale, zero + float("inf"), 32)
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="out_features"):
        int4_cpu_linear(x, packed, sz, 32, 32)
    with pytest.raises(ValueError, match="more than N = 15 rows"):
        int4_cpu_linear(x, packed, sz, 32, 15)  # a 16-row weight, asked for 15 outputs
    with pytest.raises(ValueError, match="more than N = 3 rows"):
        unpack_int4_cpu(packed, sz, 32, 3, 64)
    with pytest.raises(TypeError, match="out_features"):
        int4_cpu_linear(x, packed, sz, 32, 16.0)
    with pytest.raises(ValueError, match="scale_and_zero"):
        int4_cpu_linear(x, packed, sz.float(), 32, 16)
    with pytest.raises(ValueError, match="K = 0"):
        check_int4_cpu_shape(16, 0, 32)
    with pytest.raises(ValueError, match="group_size must be one of"):
        check_int4_cpu_shape(16, 64, 8)
    with pytest.raises(TypeError, match="k must be an int"):
        check_int4_cpu_shape(16, 64.0, 32)
    check_int4_cpu_shape(24, 100, 32)  # any N and K
    assert int4_cpu_packed_shape(16, 64) == tuple(packed.shape)
    with pytest.raises(ValueError, match="scale_and_zero"):
        int4_cpu_linear(x, packed, sz, 64, 16)  # group size disagrees with scale_and_zero's shape
    with pytest.raises(ValueError, match="x must have shape"):
        int4_cpu_linear(torch.randn(2, 80), packed, sz, 32, 16)
    with pytest.raises(TypeError, match="x must be"):
        int4_cpu_linear(x.double(), packed, sz, 32, 16)
    with pytest.raises(ValueError, match="packed_weight"):
        unpack_int4_cpu(packed, sz, 32, 16, 128)


# --------------------------------------------------------------------------- int8 dynamic activations
def _torchao_per_token(x2d, symmetric):
    """torchao 0.15's per-token activation quantizers, written out with the same torch ops on the same dtypes.

    Symmetric: ``_int8_symm_per_token_reduced_range_quant`` (range [-127, 127], eps 1e-5, scale in
    x's dtype, float32 for float16 x); asymmetric: ``_int8_asymm_per_token_quant`` (range
    [-128, 127], eps = float32 eps, scale float32, zero point int8). ``choose_qparams_affine``
    runs in x's dtype, ``quantize_affine`` computes ``clamp(round(x * (1.0 / s)) + zp, qmin, qmax)``.
    """
    mn, mx = torch.amin(x2d, dim=1), torch.amax(x2d, dim=1)
    mn_neg, mx_pos = torch.min(mn, torch.zeros_like(mn)), torch.max(mx, torch.zeros_like(mx))
    if symmetric:
        qmin, qmax = -127, 127
        scale = torch.clamp(torch.max(-mn_neg, mx_pos) / (float(qmax - qmin) / 2), min=1e-5)
        scale = scale.to(torch.float32 if x2d.dtype == torch.float16 else x2d.dtype)
        zp = torch.zeros_like(scale, dtype=torch.int32)
    else:
        qmin, qmax = -128, 127
        scale = torch.clamp((mx_pos - mn_neg) / float(qmax - qmin), min=torch.finfo(torch.float32).eps)
        zp = torch.clamp(qmin - torch.round(mn_neg / scale), qmin, qmax)
        scale, zp = scale.to(torch.float32), zp.to(torch.int8)
    q = torch.clamp(torch.round(x2d * (1.0 / scale[:, None])) + zp[:, None], qmin, qmax).to(torch.int8)
    return q, scale, None if symmetric else zp


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [True, False])
def test_per_token_quantization_is_torchaos(dtype, symmetric):
    x = (torch.randn(9, 40, generator=_gen(21)) * 3 + 0.7).to(dtype)
    x[3] = 0.0  # an all-zero row: scale clamps to eps
    q, s, z = quantize_per_token_int8(x, symmetric=symmetric)
    q_ref, s_ref, z_ref = _torchao_per_token(x, symmetric)
    assert torch.equal(q, q_ref) and s.dtype == s_ref.dtype and torch.equal(s, s_ref)
    if symmetric:
        assert z is None and q.abs().max() <= 127
    else:
        assert z.dtype == torch.int8 and torch.equal(z, z_ref) and bool((z != 0).any())


def _int8_dynamic_weight(n, k, seed=31):
    g = _gen(seed)
    return torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8), torch.rand(n, generator=g) * 0.01 + 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lead", LEADING)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("symmetric", [True, False])
def test_int8_dynamic_equals_integer_reference(dtype, lead, with_bias, symmetric):
    n, k = 48, 72
    w, w_scale = _int8_dynamic_weight(n, k)
    wt, s_w, cs = prepare_int8_dynamic(w, w_scale)
    x = (torch.randn(*lead, k, generator=_gen(32)) + 0.5).to(dtype)
    bias = _bias(n, dtype, with_bias)
    y = int8_dynamic_activation_linear(x, wt, s_w, cs, bias, act_symmetric=symmetric)
    assert y.shape == (*lead, n) and y.dtype == dtype
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 0:
        return
    q, s_x, z_x = _torchao_per_token(x2, symmetric)
    q_minus_z = q.long() - (0 if z_x is None else z_x.long()[:, None])
    acc = q_minus_z @ w.long().T  # exact, in int64
    assert acc.abs().max() < 2**31
    # the same float32 steps on the exact integers: any error in the integer part shows up here
    want = acc.to(torch.int32).to(torch.float32) * s_x.float()[:, None] * w_scale.float()
    if bias is not None:
        want = want + bias
    assert torch.equal(y.reshape(want.shape), want.to(dtype))
    # and the result approximates the float linear within the activation rounding (s_x / 2 per element)
    ref = x2.double() @ (w.double() * w_scale.double()[:, None]).T + (0 if bias is None else bias.double())
    bound = 0.5 * s_x.double()[:, None] * (w.double().abs() * w_scale.double()[:, None]).sum(1)
    bound = bound + 2.0**-7 * ref.abs() + 1e-6
    assert bool(((y.double().reshape(ref.shape) - ref).abs() <= bound).all())


def test_int8_dynamic_fp16_large_activations_do_not_overflow():
    n, k = 16, 4096
    g = _gen(33)
    x = torch.full((3, k), 1e4)
    x[:, ::2] = -1e4
    x += torch.randn(3, k, generator=g) * 300
    x = x.to(torch.float16)
    w = torch.randint(-127, 128, (n, k), generator=g, dtype=torch.int8)
    wt, s_w, cs = prepare_int8_dynamic(w, torch.full((n,), 1e-4))
    for symmetric in (True, False):
        y = int8_dynamic_activation_linear(x, wt, s_w, cs, act_symmetric=symmetric)
        q, s_x, z_x = quantize_per_token_int8(x, symmetric=symmetric)
        acc = (q.long() - (0 if z_x is None else z_x.long()[:, None])) @ w.long().T
        want = acc.double() * s_x.double()[:, None] * s_w.double()
        assert want.abs().max() < 65504
        assert torch.isfinite(y).all()
        assert torch.allclose(y.double(), want, rtol=2.0**-10, atol=0)


def test_int8_dynamic_weight_layout_and_col_sums():
    w, w_scale = _int8_dynamic_weight(24, 40)
    wt, s_w, cs = prepare_int8_dynamic(w, w_scale.to(torch.bfloat16))
    assert wt.shape == (40, 24) and torch.equal(wt, w.t())
    assert s_w.dtype == torch.float32 and torch.equal(s_w, w_scale.to(torch.bfloat16).float())
    assert cs.dtype == torch.int32 and torch.equal(cs, w.long().sum(1).int())
    assert torch.equal(int8_weight_col_sums(w), cs)
    # the column-major view is what _int_mm gets; a bfloat16 or float64 scale is used in float32
    x = torch.randn(3, 40, generator=_gen(34))
    y = int8_dynamic_activation_linear(x, wt, s_w, cs)
    assert torch.equal(int8_dynamic_activation_linear(x, wt, s_w.double(), cs), y)


def test_int8_dynamic_bad_inputs_name_the_argument():
    w, w_scale = _int8_dynamic_weight(16, 32)
    wt, s_w, cs = prepare_int8_dynamic(w, w_scale)
    x = torch.randn(2, 32)
    with pytest.raises(TypeError, match="weight_int8"):
        prepare_int8_dynamic(w.float(), w_scale)
    with pytest.raises(ValueError, match="weight_scale"):
        prepare_int8_dynamic(w, torch.ones(3))
    with pytest.raises(TypeError, match="weight_t"):
        int8_dynamic_activation_linear(x, wt.float(), s_w, cs)
    with pytest.raises(ValueError, match="weight_scale"):
        int8_dynamic_activation_linear(x, wt, s_w[:4], cs)
    with pytest.raises(TypeError, match="weight_scale"):
        int8_dynamic_activation_linear(x, wt, s_w.int(), cs)
    # a square [N, K] weight passed untransposed would silently compute x @ W: refused
    sq, sq_scale = _int8_dynamic_weight(32, 32)
    sq_t, sq_s, sq_cs = prepare_int8_dynamic(sq, sq_scale)
    with pytest.raises(ValueError, match=r"pass weight_int8.t\(\)"):
        int8_dynamic_activation_linear(x, sq, sq_s, sq_cs)
    with pytest.raises(ValueError, match="weight_t"):
        int8_dynamic_activation_linear(x, sq_t.contiguous(), sq_s, sq_cs)
    with pytest.raises(ValueError, match="weight_col_sums is required"):
        int8_dynamic_activation_linear(x, wt, s_w, None, act_symmetric=False)
    with pytest.raises(TypeError, match="weight_col_sums"):
        int8_dynamic_activation_linear(x, wt, s_w, cs.long())
    with pytest.raises(TypeError, match="act_symmetric"):
        int8_dynamic_activation_linear(x, wt, s_w, cs, act_symmetric="yes")
    with pytest.raises(TypeError):
        int8_dynamic_activation_linear(x, wt, s_w, cs, None, True)  # options are keyword-only
    with pytest.raises(ValueError, match="NaN"):
        int8_dynamic_activation_linear(torch.full((1, 32), float("nan")), wt, s_w, cs)
    with pytest.raises(ValueError, match="x must have shape"):
        int8_dynamic_activation_linear(torch.randn(2, 16), wt, s_w, cs)
