"""Attention of one new token against a key/value cache, on CPU: quanta's kernel for LLM decode.

For batch row ``b``, query head ``h`` and its key/value head ``g = h // (Hq / Hkv)`` (grouped-query
attention: the ``Hq / Hkv`` query heads of a group read the group's keys and values once)::

    out[b, 0, h] = softmax_t(scale * q[b, h, 0] . k[b, g, t]) @ v[b, g]

in float32 (the softmax with its maximum subtracted), rounded once to the inputs' dtype. An optional
boolean ``mask [B or 1, S]`` keeps the keys where it is True (padding, or the unfilled slots of a static
cache); a row with no key left gives NaN. The kernel reads a row's keys only up to its last kept one,
so a large preallocated cache costs what its filled part costs. Other masks belong to
``torch.nn.functional.scaled_dot_product_attention``. The native kernel (``csrc/decode_attention.cpp``,
built with quanta's integer-linear kernels) takes tens of microseconds where torch's SDPA takes
0.2-0.5 ms for this shape on CPU; without the extension :func:`decode_attention_reference` runs.

>>> import torch
>>> q, k, v = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
>>> out = decode_attention(q, k, v)
>>> out.shape  # [batch, 1, query heads, head dim], transformers' layout after attention
torch.Size([1, 1, 4, 8])
>>> want = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True).transpose(1, 2)
>>> torch.allclose(out, want, atol=1e-5)
True

:func:`decode_attention_int8` takes a cache kept as int8 codes with one float32 scale per token (the
layout of :class:`quanta.quantization.kv_cache.Int8KVCache`) and reads the codes directly: the keys and
values it attends to are :func:`dequantize_int8_states` of them, and the result has the bits of
:func:`decode_attention` over those dequantized tensors, without materializing them at every step.

>>> codes = torch.randint(-127, 128, (2, 1, 2, 5, 8), dtype=torch.int8)
>>> scales = torch.rand(2, 1, 2, 5) / 100
>>> out = decode_attention_int8(q, codes[0], scales[0], codes[1], scales[1])
>>> k8, v8 = (dequantize_int8_states(codes[i], scales[i], q.dtype) for i in (0, 1))
>>> torch.equal(out, decode_attention(q, k8, v8))
True
"""

from __future__ import annotations

import math

import torch

from quanta.kernels import int_linear_native as _native

__all__ = ["decode_attention", "decode_attention_int8", "decode_attention_reference", "dequantize_int8_states"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"decode_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"decode_attention: {name} must be [batch, heads, tokens, head_dim], got shape "
                             f"{tuple(t.shape)}")
    _check_shapes(query, key, value)
    if query.dtype not in _DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        raise TypeError(f"decode_attention: query, key and value must share one dtype of {_DTYPES}, got "
                        f"{query.dtype}, {key.dtype}, {value.dtype}")
    if query.device.type != "cpu" or key.device.type != "cpu" or value.device.type != "cpu":
        raise ValueError("decode_attention: query, key and value must be CPU tensors")


def _check_shapes(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
    if query.shape[2] != 1:
        raise ValueError(f"decode_attention: query must hold one token (dim 2 of size 1), got {query.shape[2]}")
    if key.shape != value.shape or key.shape[0] != query.shape[0] or key.shape[3] != query.shape[3] \
            or key.shape[2] < 1:
        raise ValueError(f"decode_attention: key and value must be [batch, kv_heads, tokens >= 1, head_dim] like "
                         f"query {tuple(query.shape)}, got {tuple(key.shape)} and {tuple(value.shape)}")
    if query.shape[1] % key.shape[1]:
        raise ValueError(f"decode_attention: query heads ({query.shape[1]}) must be a multiple of key/value heads "
                         f"({key.shape[1]})")


def _check_mask(mask: torch.Tensor | None, query: torch.Tensor, key: torch.Tensor) -> None:
    if mask is None:
        return
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"decode_attention: mask must be a bool tensor, got "
                        f"{mask.dtype if isinstance(mask, torch.Tensor) else type(mask).__name__}")
    if mask.dim() != 2 or mask.shape[1] != key.shape[2] or mask.shape[0] not in (1, query.shape[0]):
        raise ValueError(f"decode_attention: mask must be [batch or 1, {key.shape[2]}] (one flag per cached key), "
                         f"got shape {tuple(mask.shape)}")


def decode_attention_reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               scale: float | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`decode_attention` in plain PyTorch (float32 matmuls over the grouped heads)."""
    _check(query, key, value)
    _check_mask(mask, query, key)
    b, hq, _, d = query.shape
    hkv = key.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    q = query.float().reshape(b, hkv, hq // hkv, d)
    scores = (q @ key.float().transpose(-1, -2)) * scale                # [b, hkv, G, s]
    v = value.float()
    if mask is not None:  # masked keys and values are never read (a static cache's empty slots may hold anything)
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        v = v.masked_fill(~mask[:, None, :, None], 0.0)
    out = torch.softmax(scores, dim=-1) @ v                              # [b, hkv, G, d]
    return out.reshape(b, 1, hq, d).to(query.dtype)


def decode_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float | None = None,
                     mask: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax(scale * q k^T) v`` for one query token: ``query [B, Hq, 1, D]``, ``key``/``value [B, Hkv, S, D]``
    (``Hq`` a multiple of ``Hkv``; any strides but a contiguous head dimension), ``scale`` default ``1/sqrt(D)``,
    ``mask`` an optional bool ``[B or 1, S]`` (True: attend to that key).

    Returns ``[B, 1, Hq, D]`` in the inputs' dtype. Inference only (no gradient).
    """
    _check(query, key, value)
    _check_mask(mask, query, key)
    scale = 1.0 / math.sqrt(query.shape[3]) if scale is None else float(scale)
    lib = _native.ops()
    if lib is None:
        return decode_attention_reference(query, key, value, scale, mask)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
    if mask is not None and mask.stride(-1) != 1:
        mask = mask.contiguous()
    return lib.decode_attention(q, k, v, scale, mask)


def dequantize_int8_states(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Keys or values kept as int8 ``codes [B, H, S, D]`` with float32 ``scales [B, H, S]`` (one per token),
    dequantized: ``(float(code) * scale)`` rounded once to ``dtype``. On the int8 grid there is nothing to round
    or clamp before the product (equal to :func:`quanta.kernels.affine.dequantize` with zero point 0)."""
    return (codes.to(torch.float32) * scales[..., None]).to(dtype)


def _check_int8_states(query: torch.Tensor, key_codes: torch.Tensor, key_scales: torch.Tensor,
                       value_codes: torch.Tensor, value_scales: torch.Tensor) -> None:
    for name, t, dtype, dim in (("key_codes", key_codes, torch.int8, 4), ("value_codes", value_codes, torch.int8, 4),
                                ("key_scales", key_scales, torch.float32, 3),
                                ("value_scales", value_scales, torch.float32, 3)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"decode_attention_int8: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != dtype:
            raise TypeError(f"decode_attention_int8: {name} must be {dtype}, got {t.dtype}")
        if t.dim() != dim or t.device.type != "cpu":
            raise ValueError(f"decode_attention_int8: {name} must be a {dim}-d CPU tensor, got shape "
                             f"{tuple(t.shape)} on {t.device}")
    if key_scales.shape != key_codes.shape[:3] or value_scales.shape != value_codes.shape[:3]:
        raise ValueError(f"decode_attention_int8: scales must be [batch, kv_heads, tokens] like their codes "
                         f"{tuple(key_codes.shape[:3])}, got {tuple(key_scales.shape)} and "
                         f"{tuple(value_scales.shape)}")
    if not isinstance(query, torch.Tensor) or query.dtype not in _DTYPES:
        raise TypeError(f"decode_attention_int8: query must be a torch.Tensor of {_DTYPES}, got "
                        f"{getattr(query, 'dtype', type(query).__name__)}")
    if query.dim() != 4 or query.device.type != "cpu":
        raise ValueError(f"decode_attention_int8: query must be a CPU [batch, heads, 1, head_dim] tensor, got shape "
                         f"{tuple(query.shape)} on {query.device}")
    _check_shapes(query, key_codes, value_codes)


def decode_attention_int8(query: torch.Tensor, key_codes: torch.Tensor, key_scales: torch.Tensor,
                          value_codes: torch.Tensor, value_scales: torch.Tensor, scale: float | None = None,
                          mask: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`decode_attention` over an int8 cache: ``key_codes``/``value_codes`` int8 ``[B, Hkv, S, D]``
    (any strides but a contiguous head dimension), ``key_scales``/``value_scales`` float32 ``[B, Hkv, S]``.

    The keys and values are ``dequantize_int8_states(codes, scales, query.dtype)``, read from the codes as the
    kernel goes (1 byte a value instead of 2 in bfloat16); same result as :func:`decode_attention` on those
    tensors, bit for bit. Returns ``[B, 1, Hq, D]`` in the query's dtype. Inference only (no gradient).
    """
    _check_int8_states(query, key_codes, key_scales, value_codes, value_scales)
    lib = _native.ops()
    if lib is None:
        key, value = (dequantize_int8_states(c, s, query.dtype)
                      for c, s in ((key_codes, key_scales), (value_codes, value_scales)))
        return decode_attention(query, key, value, scale, mask)
    _check_mask(mask, query, key_codes)
    scale = 1.0 / math.sqrt(query.shape[3]) if scale is None else float(scale)
    q, kc, vc = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key_codes, value_codes))
    if mask is not None and mask.stride(-1) != 1:
        mask = mask.contiguous()
    return lib.decode_attention_int8(q, kc, key_scales, vc, value_scales, scale, mask)
