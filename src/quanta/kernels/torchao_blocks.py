"""torchao's "full block shape" granularity, resolved onto quanta's :class:`BlockLayout`.

In the torchao dialect ``block_size`` has one entry per *input* dimension and
says how many elements along that dimension share one scale::

    input (2, 16), block_size (2, 16)  ->  per tensor       scale shape ()
    input (2, 16), block_size (1, 16)  ->  per row          scale shape (2,)
    input (1, 64), block_size (1, 32)  ->  groups of 32     scale shape (1, 2)
    input (2, 16), block_size (2, 1)   ->  per column       scale shape (16,)
    input (2, 16), block_size (1, 1)   ->  per element      scale shape (2, 16)

Per dimension ``d`` with size ``n`` and block ``b``: ``b == n > 1`` is reduced
(the dimension disappears from the scale), ``1 < b < n`` splits it into
``(n / b, b)`` and reduces the ``b`` part, ``b == 1`` keeps it. ``-1`` is a
wildcard for the whole dimension (a quanta extension). The blocks are laid onto
a :class:`~quanta.kernels.blocks.BlockLayout` with scale shape ``n_d / b_d`` for
every dimension, so the torchao kernels share quanta's one block-reshape code.

Unlike torchao 0.15, an all-ones ``block_size`` means one scale per element
(torchao reduces over *every* dimension there, because ``amin(dim=[])`` reduces
all of them, and then fails to quantize).

This module is the only place that turns a torchao ``block_size`` into shapes.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from quanta.kernels.blocks import BlockLayout, check_block_size

__all__ = ["full_block_layout", "layout_from_scale_shape", "scale_shape", "block_min_max", "block_absmax"]


def full_block_layout(input_shape: Sequence[int], block_size: Sequence[int]) -> BlockLayout:
    """The layout of a torchao full-block-shape ``block_size`` (one entry per input dim; ``-1`` = whole dim).

    >>> full_block_layout((1, 64), (1, 32)).scale_shape
    (1, 2)
    >>> full_block_layout((2, 16), (1, 1)).scale_shape
    (2, 16)
    >>> full_block_layout((2, 16), (1, 5))
    Traceback (most recent call last):
    ...
    ValueError: block_size (1, 5) does not divide input shape (2, 16): dim 1 has 16 elements, not a multiple of 5
    """
    shape = tuple(int(n) for n in input_shape)
    bs = check_block_size(block_size)
    if bs is None:
        raise TypeError(f"block_size must be a tuple of ints, one per input dimension, got {block_size!r}")
    if len(bs) != len(shape):
        raise ValueError(
            f"block_size {bs} must have one entry per input dimension; input shape {shape} has {len(shape)}"
        )
    resolved = []
    for d, (n, b) in enumerate(zip(shape, bs)):
        if b == -1:
            b = max(n, 1)
        if n % b:
            raise ValueError(
                f"block_size {bs} does not divide input shape {shape}: dim {d} has {n} elements, "
                f"not a multiple of {b}"
            )
        resolved.append(b)
    return BlockLayout(shape, tuple(n // b for n, b in zip(shape, resolved)), tuple(resolved))


def layout_from_scale_shape(input_shape: Sequence[int], scale_shape: Sequence[int]) -> BlockLayout:
    """The layout implied by a scale's shape (torchao's float8 convention).

    A one-element scale covers the whole tensor; otherwise the scale has the
    input's rank and each of its dims divides the input's (block = ratio).

    >>> layout_from_scale_shape((2, 16), (2, 1)).block_size
    (1, 16)
    >>> layout_from_scale_shape((2, 16), ()).block_size
    (2, 16)
    """
    shape = tuple(int(n) for n in input_shape)
    sshape = tuple(int(n) for n in scale_shape)
    if math.prod(sshape) == 1:
        return BlockLayout(shape, (1,) * len(shape), shape)
    if len(sshape) != len(shape):
        raise ValueError(
            f"scale shape {sshape} must have the input's rank ({len(shape)} dims, input shape {shape}) "
            "or a single element"
        )
    blocks = []
    for d, (n, s) in enumerate(zip(shape, sshape)):
        if s == 0 or n % s:
            raise ValueError(
                f"scale shape {sshape} does not tile input shape {shape}: dim {d} of the input ({n}) "
                f"is not a multiple of dim {d} of the scale ({s})"
            )
        blocks.append(n // s)
    return BlockLayout(shape, sshape, tuple(blocks))


def scale_shape(layout: BlockLayout, keepdim: bool = False) -> tuple[int, ...]:
    """torchao's shape for the scale of ``layout``: reduced dims dropped (or kept as 1 with ``keepdim``).

    ``keepdim`` keeps torchao's intermediate shape, in which a split dimension
    ``(n/b, b)`` stays split: ``(1, 64)`` in blocks ``(1, 32)`` gives ``(1, 2, 1)``.

    >>> lay = full_block_layout((1, 64), (1, 32))
    >>> scale_shape(lay), scale_shape(lay, keepdim=True)
    ((1, 2), (1, 2, 1))
    >>> scale_shape(full_block_layout((2, 16), (2, 16)))
    ()
    """
    out: list[int] = []
    for n, b in zip(layout.input_shape, layout.block_size):
        if b == 1:
            out.append(n)
        elif b == n:
            if keepdim:
                out.append(1)
        else:
            out.append(n // b)
            if keepdim:
                out.append(1)
    return tuple(out)


def _reduce(x: torch.Tensor, layout: BlockLayout, op) -> torch.Tensor:
    xb = layout.to_blocks(x)
    dims = tuple(d for d in layout.reduce_dims() if xb.shape[d] != 1)
    # an empty dim list must mean "nothing to reduce" (torch would reduce every dim)
    out = op(xb, dim=dims, keepdim=True) if dims else xb
    return out.reshape(layout.scale_shape)


def block_min_max(x: torch.Tensor, layout: BlockLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block minimum and maximum in ``x``'s dtype, shaped ``layout.scale_shape``.

    >>> block_min_max(torch.tensor([[1.0, -2.0], [3.0, 4.0]]), full_block_layout((2, 2), (1, 2)))
    (tensor([[-2.],
            [ 3.]]), tensor([[1.],
            [4.]]))
    """
    return _reduce(x, layout, torch.amin), _reduce(x, layout, torch.amax)


def block_absmax(x: torch.Tensor, layout: BlockLayout) -> torch.Tensor:
    """Per-block ``max |x|`` in ``x``'s dtype, shaped ``layout.scale_shape``.

    >>> block_absmax(torch.tensor([[1.0, -2.0], [3.0, 4.0]]), full_block_layout((2, 2), (2, 2)))
    tensor([[4.]])
    """
    return _reduce(x.abs(), layout, torch.amax)
