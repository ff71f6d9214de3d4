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


def unpack_int4_codes(packed: torch.Tensor, k: int) -> torch.Tensor:
    """uint8 codes ``[N, K]`` from the int4 packing of :func:`quanta.kernels.int_linear.pack_int4_cpu`.

    A row holds ``ceil(K / 64)`` blocks of 32 bytes; byte ``j`` of block ``b`` has the
    code of ``k = 64 b + j`` in its low nibble and of ``k = 64 b + 32 + j`` in its high nibble.

    >>> unpack_int4_codes(torch.tensor([[0x21] + [0] * 31]), 33)[0, [0, 1, 32]]
    tensor([1, 0, 2], dtype=torch.uint8)
    """
    n, row_bytes = packed.shape
    blocks = packed.reshape(n, row_bytes // 32, 1, 32)
    codes = torch.cat([blocks & 0xF, blocks >> 4], dim=2).reshape(n, row_bytes * 2)
    return codes[:, :k].to(torch.uint8)


def int4_dequantize_reference(packed: torch.Tensor, scale_and_zero: torch.Tensor, group_size: int, k: int,
                              rows: slice = slice(None)) -> torch.Tensor:
    """float32 ``W[rows]`` = ``fma(code - 8, scale, zero)`` (one rounding, as the kernels compute it)."""
    codes = unpack_int4_codes(packed[rows], k).to(torch.float64) - 8
    g = torch.arange(k) // group_size
    s = scale_and_zero[:, rows, 0].t().to(torch.float64)[:, g]
    z = scale_and_zero[:, rows, 1].t().to(torch.float64)[:, g]
    # float64 holds code * scale exactly (4-bit times 8-bit significands): one rounding to float32, as fma
    return (codes * s + z).to(torch.float32)


def int4_weight_only_reference(x: torch.Tensor, packed: torch.Tensor, scale_and_zero: torch.Tensor, group_size: int,
                               k: int, bias: torch.Tensor | None, *, compute_dtype: torch.dtype = torch.float32
                               ) -> torch.Tensor:
    """``x @ W.T + bias`` for the packed int4 weight, dequantized a tile of rows at a time; ``x`` is ``[M, K]``."""
    n = packed.shape[0]
    xc = x.to(compute_dtype)
    y = x.new_empty((x.shape[0], n), dtype=compute_dtype)
    step = max(1, _TILE_ROWS_ELEMENTS // max(k, 1))
    for r0 in range(0, n, step):
        w = int4_dequantize_reference(packed, scale_and_zero, group_size, k, slice(r0, r0 + step))
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
