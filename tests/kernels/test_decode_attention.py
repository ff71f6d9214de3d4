"""quanta's decode attention kernel against float64 attention: shapes, dtypes, strides, threads, bad input."""

import pytest
import torch
import torch.nn.functional as F

from quanta.kernels import int_linear_native as native
from quanta.kernels.decode_attention import (decode_attention, decode_attention_int8, decode_attention_reference,
                                             dequantize_int8_states)

_TOL = {torch.float32: 1e-5, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def _exact(q, k, v, scale=None):
    g = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1)
    return F.scaled_dot_product_attention(q.double(), k, v, scale=scale).transpose(1, 2)


def _case(b, hq, hkv, s, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=g).to(dtype) for h, t in ((hq, 1), (hkv, s), (hkv, s))]


@pytest.mark.parametrize("b,hq,hkv,s,d", [(1, 32, 4, 130, 64), (2, 8, 8, 1, 16), (3, 6, 2, 300, 80),
                                          (1, 4, 1, 17, 128), (2, 2, 2, 5, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_exact_attention(b, hq, hkv, s, d, dtype):
    q, k, v = _case(b, hq, hkv, s, d, dtype, seed=b * 1000 + s + d)
    want = _exact(q, k, v)
    tol = _TOL[dtype] * float(v.abs().max()) + 1e-6
    for got in (decode_attention(q, k, v), decode_attention_reference(q, k, v)):
        assert got.shape == (b, 1, hq, d) and got.dtype == dtype
        assert float((got.double() - want).abs().max()) <= tol


def test_scale_and_strided_cache():
    q, k, v = _case(2, 8, 2, 40, 64, torch.bfloat16, seed=1)
    big_k, big_v = torch.zeros(2, 2, 64, 64, dtype=torch.bfloat16), torch.zeros(2, 2, 64, 64, dtype=torch.bfloat16)
    big_k[:, :, :40], big_v[:, :, :40] = k, v
    got = decode_attention(q, big_k[:, :, :40], big_v[:, :, :40], scale=0.3)  # a view of a larger cache
    assert float((got.double() - _exact(q, k, v, scale=0.3)).abs().max()) <= 2.0**-7 * float(v.abs().max())
    assert torch.equal(got, decode_attention(q, k, v, scale=0.3))


def test_large_scores_do_not_overflow():
    q, k, v = _case(1, 4, 2, 50, 32, torch.float32, seed=2)
    got = decode_attention(q * 100, k * 100, v)
    assert torch.isfinite(got).all()
    assert float((got.double() - _exact(q * 100, k * 100, v)).abs().max()) <= 1e-4


@pytest.mark.parametrize("batch_mask", [True, False])
def test_key_mask(batch_mask):
    q, k, v = _case(2, 8, 2, 30, 32, torch.bfloat16, seed=6)
    g = torch.Generator().manual_seed(7)
    mask = torch.rand(2 if batch_mask else 1, 30, generator=g) > 0.4
    mask[:, 3] = True
    full = mask.expand(2, 30)
    garbage_k, garbage_v = k.clone(), v.clone()  # masked slots may hold anything (a static cache's empty tail)
    garbage_k[~full[:, None, :, None].expand_as(k)] = float("nan")
    garbage_v[~full[:, None, :, None].expand_as(v)] = float("inf")
    g_ = q.shape[1] // k.shape[1]
    want = F.scaled_dot_product_attention(q.double(), k.double().repeat_interleave(g_, 1),
                                          v.double().repeat_interleave(g_, 1),
                                          attn_mask=full[:, None, None, :]).transpose(1, 2)
    for got in (decode_attention(q, garbage_k, garbage_v, mask=mask),
                decode_attention_reference(q, garbage_k, garbage_v, mask=mask)):
        assert float((got.double() - want).abs().max()) <= 2.0**-7 * float(v.abs().max())


@pytest.mark.parametrize("mask,err,match", [
    (torch.ones(2, 9), TypeError, "bool tensor"),
    ([True] * 9, TypeError, "bool tensor"),
    (torch.ones(1, 8, dtype=torch.bool), ValueError, r"\[batch or 1, 9\]"),
    (torch.ones(3, 9, dtype=torch.bool), ValueError, r"\[batch or 1, 9\]"),
    (torch.ones(1, 1, 1, 9, dtype=torch.bool), ValueError, r"\[batch or 1, 9\]"),
])
def test_bad_mask(mask, err, match):
    q, k, v = _case(2, 4, 2, 9, 16, torch.float32, seed=8)
    with pytest.raises(err, match=match):
        decode_attention(q, k, v, mask=mask)


@pytest.mark.skipif(native.ops() is None, reason=f"native kernels {native.status()}")
def test_threads_do_not_change_the_bits(at_thread_counts):
    q, k, v = _case(3, 16, 4, 200, 64, torch.bfloat16, seed=3)
    outs = at_thread_counts(lambda: decode_attention(q, k, v), (1, 2, 3))
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_fallback_without_the_extension():
    q, k, v = _case(1, 4, 2, 9, 16, torch.float32, seed=4)
    with native.disabled():
        got = decode_attention(q, k, v)
    assert float((got.double() - _exact(q, k, v)).abs().max()) <= 1e-5


@pytest.mark.parametrize("bad,err,match", [
    (lambda q, k, v: (q[:, :, :0], k, v), ValueError, "one token"),
    (lambda q, k, v: (torch.cat([q, q], 2), k, v), ValueError, "one token"),
    (lambda q, k, v: (q[:, :3], k, v), ValueError, "multiple of key/value heads"),
    (lambda q, k, v: (q, k[:, :, :0], v[:, :, :0]), ValueError, "tokens >= 1"),
    (lambda q, k, v: (q, k, v[..., :8]), ValueError, "key and value"),
    (lambda q, k, v: (q, k.half(), v), TypeError, "one dtype"),
    (lambda q, k, v: (q.int(), k.int(), v.int()), TypeError, "one dtype"),
    (lambda q, k, v: (q[0], k, v), ValueError, "query must be"),
    (lambda q, k, v: (q, k.numpy(), v), TypeError, "key must be a torch.Tensor"),
])
def test_bad_input(bad, err, match):
    q, k, v = _case(1, 4, 2, 9, 16, torch.float32, seed=5)
    with pytest.raises(err, match=match):
        decode_attention(*bad(q, k, v))


def test_buffers_kept_between_calls_hold_nothing_stale():
    # The kernel keeps its scratch buffers between calls: a long call with NaN everywhere must leave nothing that a
    # later, shorter call with odd sizes (padding along keys and head dimension) could pick up.
    q, k, v = _case(1, 8, 2, 700, 48, torch.float32, seed=8)
    decode_attention(q, k * float("nan"), v * float("nan"))
    for s, d in ((37, 48), (5, 7), (130, 64)):
        q, k, v = _case(1, 8, 2, s, d, torch.float32, seed=s + d)
        got = decode_attention(q, k, v)
        assert torch.isfinite(got).all()
        assert float((got.double() - _exact(q, k, v)).abs().max()) <= 1e-5 * float(v.abs().max())


def test_a_row_with_every_key_masked_gives_nan():
    q, k, v = _case(2, 4, 2, 20, 16, torch.float32, seed=9)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1] = False
    got = decode_attention(q, k, v, mask=mask)
    assert torch.isfinite(got[0]).all() and torch.isnan(got[1]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_preallocated_cache_gives_the_bits_of_its_filled_part(dtype):
    # A static cache: 100 slots, row 0 filled to 37 and row 1 to 70 (with a masked hole), the rest garbage. The
    # kernel stops at each row's last live key: row 0 must give exactly the bits of its filled part passed alone
    # without a mask (nothing skipped there), row 1 the attention over its live keys.
    q, k, v = _case(2, 8, 2, 100, 64, dtype, seed=10)
    mask = torch.zeros(2, 100, dtype=torch.bool)
    mask[0, :37] = True
    mask[1, :70] = True
    mask[1, 20:25] = False
    clean_k, clean_v = k.clone(), v.clone()
    k[~mask[:, None, :, None].expand_as(k)] = float("nan")
    v[~mask[:, None, :, None].expand_as(v)] = float("inf")
    got = decode_attention(q, k, v, mask=mask)
    assert torch.equal(got[:1], decode_attention(q[:1], k[:1, :, :37], v[:1, :, :37]))
    live = mask[1].nonzero().flatten()
    want = _exact(q[1:], clean_k[1:, :, live], clean_v[1:, :, live])
    assert float((got[1:].double() - want).abs().max()) <= _TOL[dtype] * float(clean_v.abs().max()) + 1e-6


def _int8_case(b, hkv, s, d, seed, capacity=None):
    """int8 codes and per-token scales as an Int8KVCache holds them: views of [B, H, capacity, D] buffers."""
    g = torch.Generator().manual_seed(seed)
    cap = capacity or s
    codes = torch.randint(-127, 128, (2, b, hkv, cap, d), dtype=torch.int8, generator=g)
    scales = torch.rand(2, b, hkv, cap, generator=g) / 50 + 1e-3
    return codes[0, :, :, :s], scales[0, :, :, :s], codes[1, :, :, :s], scales[1, :, :, :s]


@pytest.mark.parametrize("b,hq,hkv,s,d", [(1, 32, 4, 130, 64), (2, 8, 8, 1, 16), (3, 6, 2, 37, 80), (2, 2, 2, 5, 7)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int8_cache_gives_the_bits_of_its_dequantized_states(b, hq, hkv, s, d, dtype):
    q = _case(b, hq, hkv, 1, d, dtype, seed=s)[0]
    kc, ks, vc, vs = _int8_case(b, hkv, s, d, seed=s + d, capacity=s + 9)
    k, v = dequantize_int8_states(kc, ks, dtype), dequantize_int8_states(vc, vs, dtype)
    got = decode_attention_int8(q, kc, ks, vc, vs)
    assert got.dtype == dtype and got.shape == (b, 1, hq, d)
    assert torch.equal(got, decode_attention(q, k, v))
    assert torch.equal(decode_attention_int8(q, kc, ks, vc, vs, scale=0.3), decode_attention(q, k, v, scale=0.3))
    with native.disabled():
        assert torch.equal(decode_attention_int8(q, kc, ks, vc, vs), decode_attention_reference(q, k, v))


def test_int8_cache_with_a_mask_never_reads_masked_slots():
    q = _case(2, 8, 2, 1, 32, torch.bfloat16, seed=11)[0]
    kc, ks, vc, vs = _int8_case(2, 2, 40, 32, seed=12)
    mask = torch.ones(2, 40, dtype=torch.bool)
    mask[0, 30:] = False
    mask[1, 5:9] = False
    k, v = dequantize_int8_states(kc, ks, q.dtype), dequantize_int8_states(vc, vs, q.dtype)
    want = decode_attention(q, k, v, mask=mask)
    ks, vs = ks.clone(), vs.clone()
    ks[~mask[:, None, :].expand_as(ks)] = float("nan")  # an unfilled slot's scale may hold anything
    vs[~mask[:, None, :].expand_as(vs)] = float("inf")
    assert torch.equal(decode_attention_int8(q, kc, ks, vc, vs, mask=mask), want)


@pytest.mark.skipif(native.ops() is None, reason=f"native kernels {native.status()}")
def test_int8_cache_threads_do_not_change_the_bits(at_thread_counts):
    q = _case(3, 16, 4, 1, 64, torch.bfloat16, seed=13)[0]
    kc, ks, vc, vs = _int8_case(3, 4, 200, 64, seed=14)
    outs = at_thread_counts(lambda: decode_attention_int8(q, kc, ks, vc, vs), (1, 2, 3))
    assert all(torch.equal(outs[0], o) for o in outs[1:])


@pytest.mark.parametrize("bad,err,match", [
    (lambda q, kc, ks, vc, vs: (q, kc.short(), ks, vc, vs), TypeError, "key_codes must be torch.int8"),
    (lambda q, kc, ks, vc, vs: (q, kc, ks.half(), vc, vs), TypeError, "key_scales must be torch.float32"),
    (lambda q, kc, ks, vc, vs: (q, kc, ks[:, :, :4], vc, vs), ValueError,
     r"scales must be \[batch, kv_heads, tokens\]"),
    (lambda q, kc, ks, vc, vs: (q, kc, ks, vc, vs[..., None]), ValueError, "value_scales must be a 3-d"),
    (lambda q, kc, ks, vc, vs: (q, kc, ks, vc[:, :, :4], vs[:, :, :4]), ValueError, "key and value"),
    (lambda q, kc, ks, vc, vs: (q.int(), kc, ks, vc, vs), TypeError, "query must be"),
    (lambda q, kc, ks, vc, vs: (q[:, :3], kc, ks, vc, vs), ValueError, "multiple of key/value heads"),
    (lambda q, kc, ks, vc, vs: (q, kc.numpy(), ks, vc, vs), TypeError, "key_codes must be a torch.Tensor"),
])
def test_int8_cache_bad_input(bad, err, match):
    q = _case(1, 4, 2, 1, 16, torch.float32, seed=15)[0]
    with pytest.raises(err, match=match):
        decode_attention_int8(*bad(q, *_int8_case(1, 2, 9, 16, seed=16)))
