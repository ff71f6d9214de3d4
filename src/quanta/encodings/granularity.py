"""How many elements share one scale, named for reports and export formats."""

from __future__ import annotations

import torch

__all__ = ["granularity"]


def granularity(scale: torch.Tensor, block_size: tuple[int, ...] | None) -> str:
    """``"per_tensor"`` (one scale), ``"per_block"`` (a block size other than 1 or -1), else ``"per_channel"``.

    >>> granularity(torch.ones(()), None), granularity(torch.ones(4, 1), None), granularity(torch.ones(4, 2), (-1, 8))
    ('per_tensor', 'per_channel', 'per_block')
    """
    if scale.numel() == 1:
        return "per_tensor"
    if block_size is not None and any(b not in (1, -1) for b in block_size):
        return "per_block"
    return "per_channel"
