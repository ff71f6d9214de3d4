"""How a block structure follows a tensor through reshapes, slices and selects.

A quantized tensor of shape ``S`` with block size ``B`` (one scale per block,
``S[d] % B[d] == 0``) has scales of shape ``S[d] // B[d]``. When the codes are
reshaped, sliced or indexed, the scales must follow; these functions say how,
or return ``None`` when the result has no rectangular block structure (the
caller then falls back to a dequantized tensor rather than guess).

>>> reshape_block_size((4, 6), (1, 3), (2, 2, 6))
(1, 1, 3)
>>> reshape_block_size((4, 6), (1, 3), (24,))
(3,)
>>> reshape_block_size((4, 6), (2, 3), (24,)) is None
True
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

__all__ = ["reshape_block_size", "slice_block", "num_blocks"]


def num_blocks(shape: Sequence[int], block_size: Sequence[int]) -> tuple[int, ...]:
    """Scales per dimension: ``shape[d] // block_size[d]``.

    >>> num_blocks((4, 6), (1, 3))
    (4, 2)
    """
    return tuple(s // b if b else 0 for s, b in zip(shape, block_size))


def _merge(dims: list[tuple[int, int]]) -> Optional[tuple[int, int]]:
    """One (size, block) for consecutive dims, if their blocks tile the flat index uniformly."""
    size, block = 1, 1
    for d, b in dims:
        if b == d:  # whole inner dim in each block: blocks grow by d
            size, block = size * d, block * d
        elif block == 1 or size == 1:  # outer part had unit blocks: the inner block is the block
            size, block = size * d, b
        else:
            return None
    return size, block


def _split(size: int, block: int, dims: Sequence[int]) -> Optional[list[int]]:
    """Blocks of ``dims`` (product ``size``) that tile like ``block`` on the flat index."""
    out: list[int] = []
    remaining = block
    for d in reversed(dims):
        if remaining >= d:
            if remaining % d:
                return None
            out.append(d)
            remaining //= d
        else:
            if d % remaining:
                return None
            out.append(remaining)
            remaining = 1
    return list(reversed(out)) if remaining == 1 else None


def reshape_block_size(shape: Sequence[int], block_size: Sequence[int],
                       new_shape: Sequence[int]) -> Optional[tuple[int, ...]]:
    """Block size of ``reshape(new_shape)``, or None when no rectangular block size exists.

    Groups of dims with equal products are matched as in ``view``; within a
    group the old dims are merged into one (size, block) and split into the new
    dims. Scales keep their row-major order, so ``scale.reshape(num_blocks(new
    shape, new block))`` is the new scale.
    """
    shape, block_size, new_shape = tuple(shape), tuple(block_size), tuple(new_shape)
    if math.prod(shape) != math.prod(new_shape):
        raise ValueError(f"cannot reshape {shape} to {new_shape}")
    if math.prod(shape) == 0:
        return tuple(new_shape)
    out: list[int] = []
    i = j = 0
    while i < len(shape) or j < len(new_shape):
        gi, gj = [i], [j]
        pi = shape[i] if i < len(shape) else 1
        pj = new_shape[j] if j < len(new_shape) else 1
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                pi *= shape[i]
                gi.append(i)
                i += 1
            else:
                pj *= new_shape[j]
                gj.append(j)
                j += 1
        old = [(shape[k], block_size[k]) for k in gi if k < len(shape)]
        new = [new_shape[k] for k in gj if k < len(new_shape)]
        merged = _merge(old) if old else (1, 1)
        if merged is None:
            return None
        blocks = _split(merged[0], merged[1], new)
        if blocks is None:
            return None
        out.extend(blocks)
    return tuple(out)


def slice_block(size: int, block: int, start: int, end: int, step: int) -> Optional[tuple[int, int, int]]:
    """For ``x[start:end:step]`` along a dim of ``size`` with ``block``: ``(new block, scale start, scale end)``.

    None when the slice cuts blocks unevenly. A block spanning the whole dim
    stays whole (one scale).

    >>> slice_block(8, 2, 2, 6, 1)
    (2, 1, 3)
    >>> slice_block(8, 8, 1, 5, 1)
    (4, 0, 1)
    >>> slice_block(8, 2, 1, 5, 1) is None
    True
    """
    n = len(range(start, end, step))
    if n == 0:
        return None
    if block == size:
        return n, 0, 1
    if block == 1:
        return 1, start, end  # scale slice uses the same step (caller applies it)
    if step != 1 or start % block or n % block:
        return None
    return block, start // block, (start + n) // block
