"""Plain reference implementations of the amax kernels (:mod:`quanta.kernels.amax_quant`), for tests only.

Written independently of the fast path: NumPy arithmetic on arrays expanded to
the input's shape, bounds from the formula read literally, the float8 e4m3fn
rounding done by hand (round half to even on the e4m3 grid, no torch cast), and
the clamp written as two comparisons. The fast kernels must match these bit for
bit.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "bounds_reference",
    "tensor_quant_reference",
    "fake_tensor_quant_reference",
    "e4m3_round_reference",
    "fake_e4m3_reference",
    "e4m3_quant_reference",
]

_EPS = 2.0**-24


def bounds_reference(num_bits: int, unsigned: bool, narrow_range: bool) -> tuple[int, int]:
    """``(min_bound, max_bound)`` straight from the definition."""
    max_bound = 2 ** (num_bits - 1 + (1 if unsigned else 0)) - 1
    if unsigned:
        return 0, max_bound
    return (-max_bound, max_bound) if narrow_range else (-max_bound - 1, max_bound)


def _np_dtype(x: torch.Tensor, max_bound: int, min_bound: int):
    wide = max(abs(min_bound), max_bound, max_bound - min_bound) > 2**21
    return np.float64 if (x.dtype == torch.float64 or wide) else np.float32


def _to_np(t: torch.Tensor, dt) -> np.ndarray:
    return t.detach().to(torch.float64).cpu().numpy().astype(dt)


def _codes(x: torch.Tensor, amax, num_bits: int, unsigned: bool, narrow_range: bool):
    lo, hi = bounds_reference(num_bits, unsigned, narrow_range)
    dt = _np_dtype(x, hi, lo)
    xn = _to_np(x, dt)
    at = torch.as_tensor(amax)
    an = np.broadcast_to(_to_np(at.reshape(()) if at.numel() == 1 else at, dt), xn.shape)
    tiny = an <= dt(_EPS)
    with np.errstate(all="ignore"):
        scale = np.where(tiny, dt(1), dt(hi) / an).astype(dt)
        v = np.rint(xn * scale)  # rint: round half to even
        v = np.where(v < dt(lo), dt(lo), np.where(v > dt(hi), dt(hi), v)).astype(dt)
        v = np.where(tiny, v * dt(0), v).astype(dt)
    return v, scale, lo, hi


def tensor_quant_reference(x: torch.Tensor, amax, num_bits: int = 8, unsigned: bool = False,
                           narrow_range: bool = True, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Reference codes ``clamp(rint(x * (max_bound / amax)), min_bound, max_bound)`` in ``out_dtype``."""
    v, _, _, _ = _codes(x, amax, num_bits, unsigned, narrow_range)
    return torch.from_numpy(np.ascontiguousarray(v)).to(out_dtype or x.dtype)


def fake_tensor_quant_reference(x: torch.Tensor, amax, num_bits: int = 8, unsigned: bool = False,
                                narrow_range: bool = True) -> torch.Tensor:
    """Reference ``codes / scale`` cast to ``x.dtype``."""
    v, scale, _, _ = _codes(x, amax, num_bits, unsigned, narrow_range)
    with np.errstate(all="ignore"):
        out = (v / scale).astype(v.dtype)
    return torch.from_numpy(np.ascontiguousarray(out)).to(x.dtype)


def e4m3_round_reference(v: np.ndarray) -> np.ndarray:
    """Round float32 values in ``[-448, 448]`` (or NaN) to the e4m3fn grid, ties to even.

    Normal binade ``[2**e, 2**(e+1))`` (``e >= -6``) has step ``2**(e-3)``;
    below ``2**-6`` the subnormal step is ``2**-9``.
    """
    v = np.asarray(v, dtype=np.float64)
    a = np.abs(v)
    with np.errstate(all="ignore"):
        e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
        # log2 may be off by one at binade edges; fix with exact power-of-two comparisons
        e = np.where(np.exp2(e) > a, e - 1, e)
        e = np.where(np.exp2(e + 1) <= a, e + 1, e)
        step = np.exp2(np.maximum(e, -6.0) - 3.0)
        r = np.rint(v / step) * step  # v/step is exact (power-of-two step), rint ties to even
    return np.where(np.isnan(v), np.nan, r).astype(np.float32)


def _e4m3(x: torch.Tensor, amax):
    xn = _to_np(x, np.float32)
    if amax is None:
        an = np.ones_like(xn)
    else:
        at = torch.as_tensor(amax)
        an = np.broadcast_to(_to_np(at.reshape(()) if at.numel() == 1 else at, np.float32), xn.shape)
    tiny = an <= np.float32(_EPS)
    with np.errstate(all="ignore"):
        scale = np.where(tiny, np.float32(1), np.float32(448.0) / an).astype(np.float32)
        v = (xn * scale).astype(np.float32)
        v = np.where(v < -448.0, np.float32(-448.0), np.where(v > 448.0, np.float32(448.0), v))
        e = e4m3_round_reference(v)
        e = np.where(tiny, e * np.float32(0), e).astype(np.float32)
    return e, scale


def fake_e4m3_reference(x: torch.Tensor, amax) -> torch.Tensor:
    """Reference FP8 fake quant ``e4m3(clamp(x * 448/amax, +-448)) / (448/amax)`` in float32, cast to ``x.dtype``."""
    e, scale = _e4m3(x, amax)
    with np.errstate(all="ignore"):
        out = (e / scale).astype(np.float32)
    return torch.from_numpy(np.ascontiguousarray(out)).to(x.dtype)


def e4m3_quant_reference(x: torch.Tensor, amax) -> torch.Tensor:
    """Reference FP8 values ``e4m3(clamp(x * 448/amax, +-448))`` in ``x.dtype``."""
    e, _ = _e4m3(x, amax)
    return torch.from_numpy(np.ascontiguousarray(e)).to(x.dtype)
