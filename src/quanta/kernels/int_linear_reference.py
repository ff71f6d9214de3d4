"""Reference implementations of the integer-weight linear kernels (plain PyTorch, for tests and as the fallback).

Each function computes what its kernel in :mod:`quanta.kernels.int_linear`
defines, with a plain dequantize-and-matmul in float32 (float64 where asked):

* int8 weight-only: ``y = (x @ q.T) * s + bias`` (``s`` the bfloat16 row scale);
* int4 weight-only: ``y = x @ W.T + bias`` with ``W[n, k] = fma(c[n, k] - 8, s[g, n], z[g, n])``,
  ``g = k // group_size``, from the packed codes;
* int8 dynamic: ``y = ((A * s_x) * s_w) + bias`` with the exact int32 ``A = q_x @ q_w.T - z_x * colsum``.

The kernels sum in their own fixed order, so float results agree with these
within float32 accumulation error (see :mod:`quanta.kernels.int_linear`); the
integer part of the dynamic path is exact on both sides, so that path agrees
bit for bit. Inputs are assumed checked by the caller.

>>> q = torch.tensor([[1, -2] * 8], dtype=torch.int8)
>>> int8_weight_only_reference(torch.ones(1, 16), q, torch.tensor([0.5], dtype=torch.bfloat16), None)
tensor([[-4.]])
"""

from __future__ import annotations

import torch

__all__ = [
    "int8_weight_only_reference",
    "int4_dequantize_reference",
    "int4_weight_only_reference",
    "int8_dynamic_reference",
    "unpack_int4_codes",
    "unpack_int4_scale_zero",
]

_TILE_ROWS_ELEMENTS = 1 << 20  # weight elements dequantized at once


def _finish(y: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(dtype)


def int8_weight_only_reference(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor,
                               bias: torch.Tensor | None, *, compute_dtype: torch.dtype = torch.float32
                               ) -> torch.Tensor:
    """``(x @ weight_int8.T) * scale + bias`` in ``compute_dtype``, rounded to ``x``'s dtype once; ``x`` is ``[M, K]``."""
    n, k = weight_int8.shape
    xc = x.to(compute_dtype)
    y = x.new_empty((x.shape[0], n), dtype=compute_dtype)
    step = max(1, _TILE_ROWS_ELEMENTS // max(k, 1))
    for r0 in range(0, n, step):
        torch.mm(xc, weight_int8[r0:r0 + step].to(compute_dtype).t(), out=y[:, r0:r0 + step])
    y.mul_(scale.to(compute_dtype))
    return _finish(y, bias, x.dtype)


def unpack_int4_codes(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """uint8 codes ``[N, K]`` from the int4 packing of :func:`quanta.kernels.int_linear.pack_int4_cpu`.

    ``packed`` is ``[ceil(N / 16), 8 * Kp]`` (``Kp = 64 * ceil(K / 64)``): a tile of 16 rows
    as ``Kp / 8`` lines of 64 bytes, line ``l`` holding ``k = 8 l .. 8 l + 7`` of the
    tile's rows, row ``r`` in bytes ``4 r .. 4 r + 3``: byte 0 has the codes of
    ``k = 8 l`` (low nibble) and ``8 l + 2`` (high), byte 1 of ``8 l + 4`` and
    ``8 l + 6``, byte 2 of ``8 l + 1`` and ``8 l + 3``, byte 3 of ``8 l + 5`` and
    ``8 l + 7``.

    >>> line = [0x21, 0x43, 0x65, 0x87] + [0] * 60
    >>> unpack_int4_codes(torch.tensor([line], dtype=torch.uint8), 1, 8)
    tensor([[1, 5, 2, 6, 3, 7, 4, 8]], dtype=torch.uint8)
    """
    tiles, tile_bytes = packed.shape
    b = packed.reshape(tiles, tile_bytes // 64, 16, 4)
    lo, hi = b & 0xF, b >> 4
    # k = 8 l + i for i = 0..7: (byte, nibble) = (0, lo), (2, lo), (0, hi), (2, hi), (1, lo), (3, lo), (1, hi), (3, hi)
    codes = torch.stack([lo[..., 0], lo[..., 2], hi[..., 0], hi[..., 2], lo[..., 1], lo[..., 3], hi[..., 1],
                         hi[..., 3]], dim=-1)
    codes = codes.permute(0, 2, 1, 3).reshape(tiles * 16, tile_bytes // 8)
    return codes[:n, :k].to(torch.uint8)


def unpack_int4_scale_zero(scale_and_zero: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(scale, zero)`` ``[N, groups]`` from :func:`quanta.kernels.int_linear.pack_int4_cpu`'s
    ``scale_and_zero`` (``[ceil(N / 16), groups, 2, 16]``), in its dtype.

    >>> sz = torch.arange(64.0).reshape(1, 2, 2, 16)  # 1 tile, 2 groups: 16 scales, 16 zeros each
    >>> [t[:2].tolist() for t in unpack_int4_scale_zero(sz, 2)]
    [[[0.0, 32.0], [1.0, 33.0]], [[16.0, 48.0], [17.0, 49.0]]]
    """
    tiles, groups = scale_and_zero.shape[:2]
    per_row = scale_and_zero.permute(0, 3, 1, 2).reshape(tiles * 16, groups, 2)[:n]
    return per_row[..., 0], per_row[..., 1]


def int4_dequantize_reference(packed: torch.Tensor, scale_and_zero: torch.Tensor, group_size: int, n: int, k: int,
                              rows: slice = slice(None)) -> torch.Tensor:
    """float32 ``W[rows]`` = ``fma(code - 8, scale, zero)`` (one rounding, as the kernels compute it)."""
    start, stop, _ = rows.indices(n)
    t0, t1 = start // 16, -(-stop // 16)  # the tiles holding the rows: only those are unpacked
    r0, r1 = start - 16 * t0, stop - 16 * t0
    codes = unpack_int4_codes(packed[t0:t1], (t1 - t0) * 16, k)[r0:r1].to(torch.float64) - 8
    scale, zero = unpack_int4_scale_zero(scale_and_zero[t0:t1], (t1 - t0) * 16)
    g = torch.arange(k) // group_size
    s = scale[r0:r1].to(torch.float64)[:, g]
    z = zero[r0:r1].to(torch.float64)[:, g]
    # float64 holds code * scale exactly (4-bit times 8-bit significands): one rounding to float32, as fma
    return (codes * s + z).to(torch.float32)


def int4_weight_only_reference(x: torch.Tensor, packed: torch.Tensor, scale_and_zero: torch.Tensor, group_size: int,
                               n: int, k: int, bias: torch.Tensor | None, *,
                               compute_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``x @ W.T + bias`` for the packed int4 weight ``[n, k]``, dequantized a block of rows at a time; ``x`` is
    ``[M, K]``."""
    xc = x.to(compute_dtype)
    y = x.new_empty((x.shape[0], n), dtype=compute_dtype)
    step = 16 * max(1, _TILE_ROWS_ELEMENTS // max(16 * k, 1))
    for r0 in range(0, n, step):
        w = int4_dequantize_reference(packed, scale_and_zero, group_size, n, k, slice(r0, r0 + step))
        torch.mm(xc, w.to(compute_dtype).t(), out=y[:, r0:r0 + step])
    return _finish(y, bias, x.dtype)


def int8_dynamic_reference(q_x: torch.Tensor, z_x: torch.Tensor | None, s_x: torch.Tensor, weight_int8: torch.Tensor,
                           weight_scale: torch.Tensor, weight_col_sums: torch.Tensor | None,
                           bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """``((A * s_x) * s_w + bias).to(dtype)``, ``A = q_x @ q_w.T - z_x * colsum`` exact in int32."""
    acc = torch._int_mm(q_x, weight_int8.t())
    if z_x is not None:
        acc = acc - z_x.to(torch.int32).unsqueeze(1) * weight_col_sums
    y = acc.to(torch.float32)
    y.mul_(s_x.to(torch.float32).unsqueeze(1)).mul_(weight_scale.to(torch.float32))
    if bias is not None:
        y.add_(bias)
    return y.to(dtype)
