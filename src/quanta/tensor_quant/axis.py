"""Quantization axes: which dimensions keep their own amax.

TensorRT's convention: ``axis`` names the dimensions that are *kept* (each index
along them has its own amax); every other dimension is reduced. ``axis=None``
is per tensor. The amax of a per-axis quantizer keeps the reduced dimensions
with size 1, so it broadcasts against the input: a ``(C, K, H, W)`` weight with
``axis=0`` has an amax of shape ``(C, 1, 1, 1)``.

>>> reduce_amax(torch.tensor([[1.0, -3.0], [0.5, 2.0]]), axis=0)
tensor([[3.],
        [2.]])
"""

from __future__ import annotations

import numbers

import torch

__all__ = ["check_axis", "normalize_axis", "reduce_dims", "amax_shape", "reduce_amax"]

def check_axis(axis: object) -> int | tuple[int, ...] | None:
    """Validate the *form* of ``axis`` (None, an int, or a tuple/list of distinct ints); lists become tuples.

    >>> check_axis([0, 2])
    (0, 2)
    >>> check_axis("0")
    Traceback (most recent call last):
    ...
    TypeError: axis must be None, an int or a tuple of ints, got str '0'
    """
    if axis is None:
        return None
    if isinstance(axis, numbers.Integral) and not isinstance(axis, bool):
        return int(axis)
    if isinstance(axis, (tuple, list)) and axis and all(
        isinstance(a, numbers.Integral) and not isinstance(a, bool) for a in axis
    ):
        out = tuple(int(a) for a in axis)
        if len(set(out)) != len(out):
            raise ValueError(f"axis entries must be distinct, got {out}")
        return out
    raise TypeError(f"axis must be None, an int or a tuple of ints, got {type(axis).__name__} {axis!r}")


def normalize_axis(axis: object, ndim: int) -> tuple[int, ...] | None:
    """The kept dimensions as non-negative indices for a tensor of ``ndim`` dimensions (None: per tensor).

    >>> normalize_axis(-1, 3)
    (2,)
    >>> normalize_axis((0, 5), 2)
    Traceback (most recent call last):
    ...
    ValueError: axis (0, 5) is out of range for a tensor with 2 dimensions (valid: -2 to 1)
    """
    axis = check_axis(axis)
    if axis is None:
        return None
    axes = (axis,) if isinstance(axis, int) else axis
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ValueError(
                f"axis {axis} is out of range for a tensor with {ndim} dimensions (valid: {-ndim} to {ndim - 1})"
            )
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"axis {axis} names the same dimension twice for a tensor with {ndim} dimensions")
    return tuple(sorted(out))


def reduce_dims(axis: object, ndim: int) -> tuple[int, ...]:
    """Dimensions that collapse onto one amax entry.

    >>> reduce_dims(1, 4)
    (0, 2, 3)
    """
    kept = normalize_axis(axis, ndim)
    if kept is None:
        return tuple(range(ndim))
    return tuple(d for d in range(ndim) if d not in kept)


def amax_shape(shape: torch.Size | tuple[int, ...], axis: object) -> tuple[int, ...]:
    """Shape of the amax of an input of ``shape``: ``()`` per tensor, reduced dims kept as 1 per axis.

    >>> amax_shape((8, 3, 5, 5), 0)
    (8, 1, 1, 1)
    >>> amax_shape((8, 3), None)
    ()
    """
    kept = normalize_axis(axis, len(shape))
    if kept is None:
        return ()
    return tuple(s if d in kept else 1 for d, s in enumerate(shape))


def reduce_amax(x: torch.Tensor, axis: object = None) -> torch.Tensor:
    """``max |x|`` over the reduced dimensions (shape :func:`amax_shape`), ignoring NaN and inf.

    A slice without any finite value gets 0. Detached; the result has ``x``'s dtype.

    >>> reduce_amax(torch.tensor([1.0, float("nan"), -4.0, float("inf")]))
    tensor(4.)
    """
    x = x.detach()
    shape = amax_shape(x.shape, axis)
    dims = reduce_dims(axis, x.dim())
    a = x.abs()
    if x.numel() == 0:
        return torch.zeros(shape, dtype=x.dtype, device=x.device)
    out = torch.amax(a, dim=dims, keepdim=True) if dims else a
    if not bool(torch.isfinite(out).all()):
        a = torch.where(torch.isfinite(a), a, torch.zeros((), dtype=a.dtype, device=a.device))
        out = torch.amax(a, dim=dims, keepdim=True) if dims else a
    return out.reshape(shape)
