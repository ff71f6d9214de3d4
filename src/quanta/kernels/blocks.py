"""How a scale tensor maps onto the elements of an input: the block layout.

quanta uses AIMET's convention. The scale's dimensions line up with the
*trailing* dimensions of the input (leading input dimensions broadcast), and
``block_size[d]`` input elements along trailing dimension ``d`` share one scale
entry:

    out[j_0, ..., j_{D-1}] uses scale[i_0, ..., i_{D-1}],  i_d = floor(j_d / B_d)

``-1`` in ``block_size`` is a wildcard for ``input_dim // scale_dim``. Without a
``block_size`` every scale dimension must be 1 or equal to the input dimension
(ordinary broadcasting: per-tensor and per-channel).

This module is the only place that turns a block layout into tensor shapes, so
every kernel agrees on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

__all__ = ["BlockLayout", "resolve_layout", "check_block_size", "deterministic_sum", "expand_param"]


# torch reduces fewer elements than this on one thread (at::internal::GRAIN_SIZE)
_SERIAL_REDUCTION = 32768
# partial sums of a large single-value reduction: a count fixed by nothing but the shape
_PARTIALS = 64


def deterministic_sum(t: torch.Tensor) -> torch.Tensor:
    """``t.sum()`` (0-dim, ``t``'s dtype) with an order that depends only on ``t.numel()``.

    ``torch.sum`` to one value splits its input by the number of threads, so the
    result's last bits change with ``torch.set_num_threads``. Here large inputs are
    summed as 64 fixed slices (each by one thread), then the 64 partial sums.

    >>> deterministic_sum(torch.ones(100_000))
    tensor(100000.)
    """
    flat = t.reshape(-1)
    n = flat.numel()
    if n <= _SERIAL_REDUCTION:
        return flat.sum()
    m = n // _PARTIALS
    partial = flat[: m * _PARTIALS].view(_PARTIALS, m).sum(dim=1)
    if m * _PARTIALS < n:
        partial = torch.cat([partial, flat[m * _PARTIALS:].sum().reshape(1)])
    return partial.sum()


class _ExpandParam(torch.autograd.Function):
    """``t.expand(shape)`` whose backward reduces with a thread-count-independent order."""

    @staticmethod
    def forward(ctx, t, shape):  # type: ignore[override]
        ctx.in_shape = t.shape
        return t.expand(shape)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        if math.prod(ctx.in_shape) == 1:
            return deterministic_sum(grad).reshape(ctx.in_shape), None
        return grad.sum_to_size(ctx.in_shape), None


def expand_param(t: torch.Tensor, like_shape: Sequence[int]) -> torch.Tensor:
    """A scale/offset broadcast against an input of ``like_shape``, for kernels that use autograd.

    Without autograd ``t`` itself (ordinary broadcasting). With autograd, an
    expanded view whose gradient sum does not depend on the thread count (torch's
    broadcasting backward sums a per-tensor gradient in thread-dependent order).
    """
    if not (torch.is_grad_enabled() and t.requires_grad):
        return t
    return _ExpandParam.apply(t, torch.broadcast_shapes(t.shape, tuple(like_shape)))


def check_block_size(block_size: object) -> tuple[int, ...] | None:
    """Validate the *form* of a ``block_size`` argument (shapes are checked later).

    >>> check_block_size([-1, 4])
    (-1, 4)
    """
    if block_size is None:
        return None
    if isinstance(block_size, (int, torch.Tensor)) or not isinstance(block_size, Sequence):
        raise TypeError(f"block_size must be a tuple of ints (-1 for a wildcard) or None, got {block_size!r}")
    out = []
    for b in block_size:
        if isinstance(b, bool) or not isinstance(b, int):
            raise TypeError(f"block_size must be a tuple of ints (-1 for a wildcard), got {tuple(block_size)!r}")
        if b == 0 or b < -1:
            raise ValueError(f"block_size entries must be positive or -1 (wildcard), got {tuple(block_size)!r}")
        out.append(b)
    return tuple(out)


@dataclass(frozen=True)
class BlockLayout:
    """A resolved, validated block layout for one input shape.

    Attributes:
        input_shape: shape of the tensor being quantized.
        scale_shape: shape of the scale (and offset) tensor.
        block_size: concrete block size per trailing input dimension (no wildcards).
    """

    input_shape: tuple[int, ...]
    scale_shape: tuple[int, ...]
    block_size: tuple[int, ...]

    @property
    def is_broadcast(self) -> bool:
        """True if plain broadcasting applies (every dim is shared whole or not at all)."""
        return all(s == 1 or b == 1 for s, b in zip(self.scale_shape, self.block_size))

    @property
    def blocked_input_shape(self) -> tuple[int, ...]:
        """Input shape with each trailing dim split into ``(scale_dim, block)``."""
        lead = len(self.input_shape) - len(self.scale_shape)
        shape = list(self.input_shape[:lead])
        for s, b in zip(self.scale_shape, self.block_size):
            shape += [s, b]
        return tuple(shape)

    @property
    def blocked_scale_shape(self) -> tuple[int, ...]:
        """Scale shape with a singleton after each dim, broadcastable to the blocked input."""
        shape: list[int] = []
        for s in self.scale_shape:
            shape += [s, 1]
        return tuple(shape)

    def to_blocks(self, t: torch.Tensor) -> torch.Tensor:
        """Reshape an input-shaped tensor into the blocked shape (a view when possible)."""
        return t if self.is_broadcast else t.reshape(self.blocked_input_shape)

    def from_blocks(self, t: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`to_blocks`."""
        return t if self.is_broadcast else t.reshape(self.input_shape)

    def scale_to_blocks(self, t: torch.Tensor) -> torch.Tensor:
        """Reshape a scale-shaped tensor so it broadcasts against :meth:`to_blocks`."""
        return t.reshape(self.scale_shape if self.is_broadcast else self.blocked_scale_shape)

    def reduce_to_scale(self, t: torch.Tensor) -> torch.Tensor:
        """Sum a blocked, input-sized tensor down to the scale's shape (for gradients).

        The result does not depend on the thread count: torch splits a reduction to a
        *single* value across threads (so its rounding depends on how many there are),
        so such a sum goes through :func:`deterministic_sum`; reductions to several
        values are split by output entry, each summed by one thread in a fixed order.
        """
        if math.prod(self.scale_shape) == 1:
            return deterministic_sum(t).reshape(self.scale_shape)
        target = self.scale_shape if self.is_broadcast else self.blocked_scale_shape
        return t.sum_to_size(target).reshape(self.scale_shape)

    def reduce_dims(self) -> tuple[int, ...]:
        """Dims of :meth:`to_blocks`'s result that collapse onto one scale entry."""
        lead = len(self.input_shape) - len(self.scale_shape)
        if self.is_broadcast:
            return tuple(range(lead)) + tuple(lead + d for d, s in enumerate(self.scale_shape) if s == 1)
        return tuple(range(lead)) + tuple(lead + 2 * d + 1 for d in range(len(self.scale_shape)))

    def psb(self) -> tuple[int, int, int] | None:
        """The layout as ``(P, S, B)``: element ``(p, s, b)`` of the contiguous input uses scale entry ``s``.

        Covers per-tensor, per-channel on any one run of dimensions and per-block
        along one dimension, with leading broadcast dims. None for layouts with
        blocks in two separated dimensions (the kernels then take their general path).

        >>> resolve_layout((2, 6, 16), (6, 4), (1, 4)).psb()
        (2, 24, 4)
        >>> resolve_layout((6, 16), (1, 16), None).psb()
        (6, 16, 1)
        """
        lead = len(self.input_shape) - len(self.scale_shape)
        dims = [(d, False) for d in self.input_shape[:lead]]
        for s, b in zip(self.scale_shape, self.block_size):
            dims += [(s, True), (b, False)]
        merged: list[list] = []
        for size, is_scale in dims:
            if size == 1:
                continue
            if merged and merged[-1][1] == is_scale:
                merged[-1][0] *= size
            else:
                merged.append([size, is_scale])
        kinds = [k for _, k in merged]
        if kinds.count(True) > 1:
            return None
        if True not in kinds:  # one scale entry
            return (1, 1, math.prod(size for size, _ in merged))
        i = kinds.index(True)
        if i > 1 or len(merged) - i > 2:
            return None
        p = merged[0][0] if i == 1 else 1
        b = merged[i + 1][0] if i + 1 < len(merged) else 1
        return (p, merged[i][0], b)

    def expand_scale(self, t: torch.Tensor) -> torch.Tensor:
        """Repeat a scale-shaped tensor to the input's shape (used by reference code)."""
        out = t
        for d, b in enumerate(self.block_size):
            out = out.repeat_interleave(b, dim=d) if b > 1 else out
        return out.expand(self.input_shape)


def resolve_layout(
    input_shape: Sequence[int], scale_shape: Sequence[int], block_size: tuple[int, ...] | None
) -> BlockLayout:
    """Check that ``scale_shape`` and ``block_size`` fit ``input_shape`` and resolve wildcards.

    >>> resolve_layout((8, 8), (8, 2), (-1, 4)).block_size
    (1, 4)
    >>> resolve_layout((3, 8, 16), (8, 1), None).block_size
    (1, 16)
    >>> resolve_layout((8, 10), (8, 3), (-1, -1))
    Traceback (most recent call last):
    ...
    ValueError: block_size (-1, -1) does not fit input shape (8, 10) with scale shape (8, 3): dim 1 of the input (10) is not divisible by dim 1 of the scale (3)
    """
    input_shape = tuple(int(d) for d in input_shape)
    scale_shape = tuple(int(d) for d in scale_shape)
    if len(scale_shape) > len(input_shape):
        # Leading singleton scale dims carry no information; drop them.
        extra = len(scale_shape) - len(input_shape)
        if any(d != 1 for d in scale_shape[:extra]):
            raise ValueError(
                f"scale shape {scale_shape} has more dimensions than input shape {input_shape}"
            )
        scale_shape = scale_shape[extra:]
        if block_size is not None:
            block_size = block_size[extra:]
    lead = len(input_shape) - len(scale_shape)
    trailing = input_shape[lead:]
    if block_size is None:
        resolved = []
        for d, (x, s) in enumerate(zip(trailing, scale_shape)):
            if s == x:
                resolved.append(1)
            elif s == 1:
                resolved.append(x)
            else:
                raise ValueError(
                    f"scale shape {scale_shape} does not broadcast to input shape {input_shape}: "
                    f"dim {d} of the scale is {s}, expected 1 or {x}; pass block_size for per-block scales"
                )
        return BlockLayout(input_shape, scale_shape, tuple(resolved))
    if len(block_size) != len(scale_shape):
        raise ValueError(
            f"block_size {block_size} must have one entry per scale dimension; scale shape is {scale_shape}"
        )
    resolved = []
    for d, (x, s, b) in enumerate(zip(trailing, scale_shape, block_size)):
        if b == -1:
            if x % s:
                raise ValueError(
                    f"block_size {block_size} does not fit input shape {input_shape} with scale shape "
                    f"{scale_shape}: dim {d} of the input ({x}) is not divisible by dim {d} of the scale ({s})"
                )
            b = x // s
        elif s * b != x:
            raise ValueError(
                f"block_size {block_size} does not fit input shape {input_shape} with scale shape "
                f"{scale_shape}: dim {d} of the input has {x} elements, but scale dim {s} x block {b} = {s * b}"
            )
        resolved.append(b)
    return BlockLayout(input_shape, scale_shape, tuple(resolved))
