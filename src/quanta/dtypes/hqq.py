"""Half-quadratic quantization (HQQ): zero points optimised against a sparsity-promoting error.

HQQ (Badri & Shaji, 2023) keeps the min/max scale of each group and moves the
zero point ``z`` (codes ``q = clamp(round(w/s + z))``, weights ``(q - z) * s``)
to minimise an ``l_p`` (``p < 1``) norm of the error, which tolerates a few large
errors in exchange for many small ones. Alternating steps, ``beta`` growing by
``kappa`` each time:

- ``e = shrink_p(w - (q - z) * s, beta)`` with
  ``shrink_p(x) = sign(x) * max(|x| - |x|^(p-1) / beta, 0)`` (the outliers kept),
- ``z = mean_group(q - (w - e) / s)``,

stopping when the mean absolute error stops falling. Codes and dequantized
values are computed by :mod:`quanta.quantization.quant_primitives`; the result is
returned in the tinygemm (``ZeroPointDomain.FLOAT``) form, ``zp = (mid - z) * s``,
so that ``(q - mid) * s + zp == (q - z) * s``.

>>> _ = torch.manual_seed(0)
>>> w = torch.randn(16, 64)
>>> q, s, zp = choose_qparams_and_quantize_hqq(w, (1, 32), torch.uint4, 0, 15)
>>> q.dtype, q.shape, s.shape, bool((q <= 15).all())
(torch.uint8, torch.Size([16, 64]), torch.Size([16, 2]), True)
"""

from __future__ import annotations

import torch

from quanta.encodings import torchao as P
from quanta.encodings.torchao import MappingType, ZeroPointDomain

__all__ = ["choose_qparams_and_quantize_hqq"]


def _shrink_lp(x: torch.Tensor, beta: float, p: float) -> torch.Tensor:
    return torch.sign(x) * torch.relu(x.abs() - (1.0 / beta) * x.abs().pow(p - 1))


@torch.no_grad()
def choose_qparams_and_quantize_hqq(
    w: torch.Tensor,
    block_size: tuple[int, ...],
    target_dtype: torch.dtype,
    quant_min: int,
    quant_max: int,
    *,
    compute_dtype: torch.dtype | None = None,
    iters: int = 20,
    p: float = 0.7,
    beta: float = 10.0,
    kappa: float = 1.01,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes, scale and FLOAT-domain zero point of ``w`` per block, zero points optimised by HQQ.

    Args:
        w: float weight; ``block_size`` its full block shape (groups along one dimension).
        target_dtype, quant_min, quant_max: code type and range.
        compute_dtype: dtype of the returned scale/zero point (default ``w.dtype``).
        iters, p, beta, kappa: HQQ's iteration count, norm, initial penalty and its growth.

    Returns ``(codes, scale, zero_point)``; scale/zero point have one entry per block.
    """
    if not 0 < p < 1:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 0:
        raise ValueError(f"iters must be a non-negative int, got {iters!r}")
    dtype = compute_dtype or w.dtype
    x = w.to(torch.float32)
    scale, zp = P.choose_qparams_affine(x, MappingType.ASYMMETRIC, block_size, target_dtype, quant_min, quant_max,
                                        eps=1e-8, preserve_zero=False, zero_point_domain=ZeroPointDomain.FLOAT)
    nb = [n // b for n, b in zip(x.shape, block_size)]
    scale, zp = scale.reshape(nb), zp.reshape(nb)
    mid = (quant_min + quant_max + 1) // 2
    z = mid - zp / scale  # HQQ's zero point, in code units

    def codes_and_error(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        zp_f = (mid - z) * scale
        q = P.quantize_affine(x, block_size, scale, zp_f, target_dtype, quant_min, quant_max,
                              zero_point_domain=ZeroPointDomain.FLOAT)
        w_r = P.dequantize_affine(q, block_size, scale, zp_f, target_dtype, quant_min, quant_max,
                                  zero_point_domain=ZeroPointDomain.FLOAT)
        return q, w_r

    # blocks on their own axes: elements (nb0, b0, nb1, b1, ...), per-block values (nb0, 1, nb1, 1, ...)
    elem_shape = [d for n, b in zip(x.shape, block_size) for d in (n // b, b)]
    reduce_dims = tuple(range(1, 2 * x.dim(), 2))

    def per_element(t: torch.Tensor) -> torch.Tensor:
        return t.reshape([d for n in t.shape for d in (n, 1)])

    best_z, best_err = z, None
    for _ in range(iters):
        q, w_r = codes_and_error(z)
        err = float((x - w_r).abs().mean())
        if best_err is not None and err >= best_err:
            break
        best_z, best_err = z, err
        e = _shrink_lp(x - w_r, beta, p)
        target = q.to(torch.float32).reshape(elem_shape) - (x - e).reshape(elem_shape) / per_element(scale)
        z = target.mean(dim=reduce_dims)
        beta *= kappa
    zp_f = ((mid - best_z) * scale).to(dtype)
    scale = scale.to(dtype)
    q = P.quantize_affine(x, block_size, scale, zp_f, target_dtype, quant_min, quant_max,
                          zero_point_domain=ZeroPointDomain.FLOAT)
    return q, scale, zp_f
