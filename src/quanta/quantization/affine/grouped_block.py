"""Low-power blockwise quantization (LPBQ): AIMET's ``GroupedBlockQuantizeDequantize``.

A weight is quantized per block (``block_size``), but the block scales are not free floats: the blocks of a
group (``block_grouping``, usually every block of an output channel) share one float scale, and each block
scales it by a small integer. With ``b = bitwidth`` and ``d = decompressed_bw``:

    raw[i]            = scale of block i from its range (as :class:`QuantizeDequantize`)
    per_channel[g]    = max(raw[i] for i in group g) / 2**(d - b)
    int_scale[i]      = clamp(round(raw[i] / per_channel[g]), 1, 2**(d - b))
    scale[i]          = int_scale[i] * per_channel[g]

so a ``b``-bit code times its block's integer scale is a ``d``-bit integer on the channel's grid: hardware
decompresses a block with one integer multiply and keeps one float scale per channel. The rounding of
``raw / per_channel`` is the kernel layer's quantize-dequantize on the grid ``[1, 2**(d - b)]`` (gradients flow
as through any quantize-dequantize).

>>> import torch
>>> from quanta.quantization.affine import GroupedBlockQuantizeDequantize
>>> qtzr = GroupedBlockQuantizeDequantize(shape=(2, 4), bitwidth=4, symmetric=True, decompressed_bw=8,
...                                       block_size=(1, 4), block_grouping=(1, 4))
>>> w = torch.tensor([[1.0, 2.0, 4.0, 8.0]]).repeat_interleave(4, 1) * torch.tensor([[1.0], [0.1]])
>>> with qtzr.compute_encodings():
...     _ = qtzr(w)
>>> qtzr.get_per_block_int_scale()
tensor([[ 2.,  4.,  8., 16.],
        [ 2.,  4.,  8., 16.]])
>>> torch.equal(qtzr.get_scale(), qtzr.get_per_block_int_scale() * qtzr.get_per_channel_scale())
True
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quanta.encodings.affine import AffineEncoding
from quanta.grids.affine import IntegerGrid
from quanta.kernels import affine as kernels
from quanta.kernels.qparams import scale_from_range
from quanta.quantization.affine.quantizer import QuantizeDequantize, _eager_forward
from quanta.quantization.encoding_analyzer import EncodingAnalyzer
from quanta.tensors.quantized import QuantizedTensorBase

__all__ = ["GroupedBlockQuantizeDequantize"]


class GroupedBlockQuantizeDequantize(QuantizeDequantize):
    r"""Fake-quantize per block with LPBQ scales: integer multiples of one float scale per group of blocks.

    Args:
        shape: shape of the block scales, e.g. ``(C, K // B)`` for a ``(C, K)`` weight in blocks of ``B``.
        bitwidth: bits per code (the compressed bitwidth).
        symmetric: must be True (LPBQ grids are symmetric).
        decompressed_bw: bits of a code times its block's integer scale; at least ``bitwidth``. The integer
            scales lie in ``[1, 2**(decompressed_bw - bitwidth)]``.
        encoding_analyzer: statistics for :meth:`compute_encodings` (default min-max, per block).
        block_size: block size per dimension of ``shape`` (``-1`` = wildcard), as :class:`QuantizeDequantize`.
        block_grouping: how many block scales share a float scale, per dimension of ``shape`` (``-1`` = the
            whole dimension). Default all ones: every block its own group (plain blockwise quantization,
            with block scales rounded to ``2**(decompressed_bw - bitwidth)`` levels of their own maximum).

    The forward computes ``(clamp(round(x / scale) - offset, qmin, qmax) + offset) * scale`` with ``scale`` as
    in the module docstring; :meth:`get_scale` returns that scale, :meth:`get_per_channel_scale` and
    :meth:`get_per_block_int_scale` its two factors.
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        bitwidth: int,
        symmetric: bool,
        decompressed_bw: int,
        encoding_analyzer: EncodingAnalyzer | None = None,
        block_size: tuple[int, ...] | None = None,
        block_grouping: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__(shape, bitwidth, symmetric, encoding_analyzer, block_size)
        if symmetric is not True:
            raise ValueError("symmetric must be True: GroupedBlockQuantizeDequantize has symmetric grids only")
        if isinstance(decompressed_bw, bool) or not isinstance(decompressed_bw, int):
            raise TypeError(f"decompressed_bw must be an int, got {decompressed_bw!r}")
        if decompressed_bw < bitwidth:
            raise ValueError(f"decompressed_bw ({decompressed_bw}) must be at least bitwidth ({bitwidth})")
        self.decompressed_bw = decompressed_bw
        self.block_grouping = _check_grouping(block_grouping, self.shape)

    @property
    def _levels(self) -> int:
        """How many integer scales a block can take: ``2**(decompressed_bw - bitwidth)``."""
        return 2 ** (self.decompressed_bw - self.grid.bitwidth)

    @property
    def _int_scale_grid(self) -> IntegerGrid:
        # With one level, [1, 2] rounds and differentiates as AIMET's [1, 1]: raw <= its group's maximum, so
        # round(raw / per_channel) <= 1 (an IntegerGrid needs qmin < qmax)
        return IntegerGrid(1, max(self._levels, 2))

    def _raw_scale(self, dtype: torch.dtype | None) -> torch.Tensor | None:
        return super().get_scale(dtype)

    def _per_channel(self, raw: torch.Tensor) -> torch.Tensor:
        """The largest raw scale of each group over ``2**(decompressed_bw - bitwidth)`` (an exact division)."""
        groups = [size // g for size, g in zip(raw.shape, self._grouping_of(raw))]
        interleaved = [n for pair in zip(groups, self._grouping_of(raw)) for n in pair]
        largest = raw.reshape(interleaved).amax(dim=tuple(range(1, len(interleaved), 2)))
        return largest / 2 ** (self.decompressed_bw - self.grid.bitwidth)

    def _grouping_of(self, raw: torch.Tensor) -> tuple[int, ...]:
        return tuple(size if g == -1 else g for size, g in zip(raw.shape, self.block_grouping))

    def _scales(self, dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(scale, per_channel_scale)``, or None before initialisation."""
        raw = self._raw_scale(dtype)
        return None if raw is None else self._lpbq(raw)

    def _lpbq(self, raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale, per_channel_scale)`` from the raw block scales."""
        per_channel = self._per_channel(raw)
        scale = kernels.quantize_dequantize(raw, per_channel, torch.zeros_like(per_channel), self._int_scale_grid,
                                            self._grouping_of(raw))
        return scale, per_channel

    def get_scale(self, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """The LPBQ block scales ``int_scale * per_channel_scale``, or None before initialisation."""
        scales = self._scales(dtype)
        return None if scales is None else scales[0]

    def get_per_channel_scale(self, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """The float scale of each group of blocks (shape ``shape`` divided by ``block_grouping``), or None."""
        scales = self._scales(dtype)
        return None if scales is None else scales[1]

    def get_per_block_int_scale(self) -> torch.Tensor | None:
        """Each block's integer scale in ``[1, 2**(decompressed_bw - bitwidth)]`` (float tensor), or None."""
        scales = self._scales(torch.float32)
        if scales is None:
            return None
        scale, per_channel = scales
        with torch.no_grad():
            return kernels.quantize(scale, _broadcast(per_channel, scale.shape), torch.zeros(()),
                                    self._int_scale_grid).to(torch.float32)

    def get_encodings(self) -> AffineEncoding | None:
        """The current encoding with the LPBQ block scales, or None before initialisation."""
        scale = self.get_scale()
        if scale is None:
            return None
        return AffineEncoding(scale, torch.zeros_like(scale), self.grid, block_size=self.block_size)

    def forward(self, input: torch.Tensor) -> QuantizedTensorBase:
        compiling = torch.compiler.is_compiling()
        if self._calibrating:
            # the batch's range through get_encodings (LPBQ scales); eagerly when compiled, as the base does
            return _eager_forward(self, input) if compiling else super().forward(input)
        x = self._prepare_input(input, check_layout=not compiling)
        if compiling:  # no data-dependent checks in a graph: the Python flag, the range itself
            if not self._is_ready:
                self._raise_uninitialized()
            raw = scale_from_range(self.min, self.max, self.grid)
        else:
            raw = self._raw_scale(None)
            if raw is None:
                self._raise_uninitialized()
        scale = self._lpbq(raw)[0]
        offset = torch.zeros_like(scale)  # a signed symmetric grid
        y = self._kernel(x, scale, offset)
        return y if compiling else self._wrap_output(y, AffineEncoding(scale, offset, self.grid,
                                                                        block_size=self.block_size))

    def _traced_forward(self, input: torch.Tensor) -> torch.Tensor:
        return self.forward(input)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, decompressed_bw={self.decompressed_bw}, block_grouping={self.block_grouping}"


def _broadcast(per_channel: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``per_channel`` (one value per group) repeated over the blocks of each group: shape ``shape``."""
    out = per_channel
    for dim, (n, size) in enumerate(zip(per_channel.shape, shape)):
        out = out.repeat_interleave(size // n, dim)
    return out


def _check_grouping(block_grouping: Sequence[int] | None, shape: tuple[int, ...]) -> tuple[int, ...]:
    if block_grouping is None:
        return tuple(1 for _ in shape)
    if isinstance(block_grouping, (int, torch.Tensor)) or not isinstance(block_grouping, Sequence):
        raise TypeError(f"block_grouping must be a tuple of ints (-1 = a whole dimension) or None, "
                        f"got {block_grouping!r}")
    grouping = tuple(block_grouping)
    if len(grouping) != len(shape):
        raise ValueError(f"block_grouping {grouping} must have one entry per dimension of shape {shape}")
    for size, g in zip(shape, grouping):
        if isinstance(g, bool) or not isinstance(g, int) or not (g == -1 or g >= 1):
            raise ValueError(f"block_grouping entries must be positive ints or -1, got {grouping}")
        if g != -1 and size % g:
            raise ValueError(f"block_grouping {grouping} does not divide shape {shape}")
    return grouping
