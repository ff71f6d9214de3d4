"""Plain reference implementations of the affine kernels, for tests only.

Written independently of :mod:`quanta.kernels.affine`: NumPy arithmetic, and the
scale expanded to every element by repetition (the ``i_d = floor(j_d / B_d)``
formula read literally) instead of the blocked reshape the fast path uses. The
fast kernels must match these bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch

from quanta.grids.affine import IntegerGrid
from quanta.kernels.affine import codes_dtype
from quanta.kernels.blocks import resolve_layout

__all__ = ["quantize_reference", "dequantize_reference", "quantize_dequantize_reference"]

_NP = {torch.float32: np.float32, torch.float64: np.float64}


def _expanded(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, block_size, cdt: torch.dtype):
    layout = resolve_layout(x.shape, scale.shape, block_size)
    s = layout.expand_scale(scale.detach().reshape(layout.scale_shape))
    o = layout.expand_scale(torch.broadcast_to(offset.detach(), scale.shape).reshape(layout.scale_shape))
    np_dtype = _NP[cdt]
    to_np = lambda t: t.detach().to(torch.float64).cpu().numpy().astype(np_dtype)  # noqa: E731
    return to_np(x), to_np(s), to_np(o)


def _codes(xn: np.ndarray, sn: np.ndarray, on: np.ndarray, grid: IntegerGrid) -> np.ndarray:
    with np.errstate(all="ignore"):
        v = np.rint(xn / sn) - on  # rint rounds half to even
        # clamp read literally: v itself whenever qmin <= v <= qmax (so -0.0 stays -0.0), NaN passes
        lo, hi = xn.dtype.type(grid.qmin), xn.dtype.type(grid.qmax)
        return np.where(v < lo, lo, np.where(v > hi, hi, v))


def quantize_reference(x, scale, offset, grid: IntegerGrid, block_size=None) -> torch.Tensor:
    """Reference ``clamp(round(x/s) - o, qmin, qmax)``."""
    cdt = grid.compute_dtype(x.dtype)
    xn, sn, on = _expanded(x, scale, offset, block_size, cdt)
    return torch.from_numpy(_codes(xn, sn, on, grid)).to(codes_dtype(x.dtype, grid))


def quantize_dequantize_reference(x, scale, offset, grid: IntegerGrid, block_size=None) -> torch.Tensor:
    """Reference ``(clamp(round(x/s) - o, qmin, qmax) + o) * s``."""
    cdt = grid.compute_dtype(x.dtype)
    xn, sn, on = _expanded(x, scale, offset, block_size, cdt)
    with np.errstate(all="ignore"):
        out = (_codes(xn, sn, on, grid) + on) * sn
    return torch.from_numpy(out).to(x.dtype)


def dequantize_reference(q, scale, offset, block_size=None, *, output_dtype=None) -> torch.Tensor:
    """Reference ``(q + o) * s``."""
    wide = q.dtype in (torch.float64, torch.int32, torch.int64, torch.uint32, torch.uint64)
    cdt = torch.float64 if wide or torch.float64 in (scale.dtype, offset.dtype) else torch.float32
    qn, sn, on = _expanded(q, scale, offset, block_size, cdt)
    if output_dtype is None:
        output_dtype = q.dtype if q.is_floating_point() else scale.dtype
    with np.errstate(all="ignore"):
        return torch.from_numpy((qn + on) * sn).to(output_dtype)
