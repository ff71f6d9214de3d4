"""``BlockScaledQuantizeDequantize``: MX and NVFP4 fake quantization as an AIMET-style quantizer (a quanta
extension; aimet-torch 2.42 has only private MXFP4/NVFP4 export placeholders).

Blocks run along the last dimension. MX formats need no calibration: each
block's power-of-two scale comes from the block itself at every call (OCP's
FLOOR rule by default, ``scaling_mode`` as torchao's). NVFP4 takes a per-tensor
scale ``amax / (448 * 6)`` from a calibrated ``global_amax`` (``compute_encodings``
sets it to the largest magnitude seen), or from each input while uncalibrated,
so its e4m3 block scales keep their whole range. The arithmetic is
:mod:`quanta.kernels.block_scaled` (torchao 0.18's CPU results bit for bit); the
gradient is straight-through (0 where an element saturated).

Use it anywhere a quantizer goes, e.g. as a QuantizationSimModel weight quantizer::

    sim.model.fc.param_quantizers["weight"] = BlockScaledQuantizeDequantize("mxfp4")

As a weight quantizer its block scales are constants, and ``quanta.export.onnx.export_onnx`` writes the weight
as its stored elements and a per-block DequantizeLinear (MXFP8: float8, MXINT8: int8, opset 21; MXFP4 / NVFP4:
FLOAT4E2M1, opset 23; fp6 has no ONNX type). On activations (scales from each input) and in AIMET's encodings
files it has no form: those refuse it with a message naming the quantizer.

>>> import torch
>>> q = BlockScaledQuantizeDequantize("mxfp4", block_size=4)
>>> q(torch.tensor([[0.1, -0.7, 3.0, 5.9]]))
tensor([[ 0.0000, -0.5000,  3.0000,  6.0000]])
>>> nv = BlockScaledQuantizeDequantize("nvfp4")
>>> with nv.compute_encodings():
...     _ = nv(torch.randn(4, 32))
>>> nv.global_amax is not None
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch

from quanta.grids.block_scaled import BLOCK_SCALED_FORMATS, BlockScaledFormat, BlockScaleKind, ScaleCalculationMode
from quanta.kernels.block_scaled import mx_quantize_dequantize, nvfp4_quantize_dequantize, per_tensor_amax_to_scale
from quanta.quantization.base import QuantizerBase

__all__ = ["BlockScaledQuantizeDequantize", "BlockScaledEncoding", "BLOCK_SCALED_FORMATS"]

@dataclass(frozen=True)
class BlockScaledEncoding:
    """What a :class:`BlockScaledQuantizeDequantize` is set to (its block scales come from the data)."""

    format: str
    block_size: int
    scaling_mode: Optional[str]
    global_amax: Optional[torch.Tensor]


class BlockScaledQuantizeDequantize(QuantizerBase):
    """MX / NVFP4 fake quantization along the last dimension.

    Args:
        format: ``"mxfp8_e4m3"``, ``"mxfp8_e5m2"``, ``"mxfp6_e2m3"``, ``"mxfp6_e3m2"``, ``"mxfp4"``,
            ``"mxint8"`` or ``"nvfp4"`` (or a :class:`~quanta.grids.block_scaled.BlockScaledFormat`).
        block_size: elements per scale (default: the format's, 32 for MX, 16 for NVFP4).
        scaling_mode: MX's shared-exponent rule (:class:`~quanta.grids.block_scaled.ScaleCalculationMode`,
            default ``FLOOR``, the OCP spec's); not for NVFP4.
    """

    def __init__(self, format: Union[str, BlockScaledFormat] = "mxfp4", block_size: Optional[int] = None,  # noqa: A002
                 scaling_mode: Optional[ScaleCalculationMode] = None) -> None:
        super().__init__()
        if isinstance(format, str):
            if format not in BLOCK_SCALED_FORMATS:
                raise ValueError(f"format must be one of {sorted(BLOCK_SCALED_FORMATS)}, got {format!r}")
            fmt = BLOCK_SCALED_FORMATS[format]
        elif isinstance(format, BlockScaledFormat):
            fmt = format
        else:
            raise TypeError(f"format must be a format name or a BlockScaledFormat, got {format!r}")
        if block_size is not None:
            fmt = fmt.with_block_size(block_size)
        if fmt.scale_kind is BlockScaleKind.E4M3:
            if scaling_mode is not None:
                raise ValueError("scaling_mode is for MX formats; NVFP4's block scales are e4m3 values")
            if fmt.block_size != 16:
                raise ValueError(f"NVFP4 uses blocks of 16 elements, got block_size={fmt.block_size}")
        elif scaling_mode is None:
            scaling_mode = ScaleCalculationMode.FLOOR
        elif not isinstance(scaling_mode, ScaleCalculationMode):
            raise TypeError(f"scaling_mode must be a ScaleCalculationMode, got {scaling_mode!r}")
        self.format = fmt
        self.scaling_mode = scaling_mode
        self.register_buffer("global_amax", None)
        self._seen: Optional[torch.Tensor] = None
        self._set_initialized(True)

    @property
    def is_nvfp4(self) -> bool:
        return self.format.scale_kind is BlockScaleKind.E4M3

    def extra_repr(self) -> str:
        s = f"format={self.format.name!r}, block_size={self.format.block_size}"
        return s + (f", scaling_mode={self.scaling_mode.name}" if self.scaling_mode is not None else "")

    def get_encodings(self) -> BlockScaledEncoding:
        return BlockScaledEncoding(self.format.name, self.format.block_size,
                                   None if self.scaling_mode is None else self.scaling_mode.value,
                                   None if self.global_amax is None else self.global_amax.detach().clone())

    def _reset_statistics(self) -> None:
        self._seen = None

    def _finish_calibration(self) -> None:
        if self.is_nvfp4 and self._seen is not None:
            self.global_amax = self._seen.clone()
        self._seen = None

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        key = prefix + "global_amax"
        if key in state_dict and self.global_amax is None:
            self.global_amax = torch.empty_like(state_dict[key])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not isinstance(input, torch.Tensor) or not input.is_floating_point():
            raise TypeError(f"input must be a floating-point tensor, got {getattr(input, 'dtype', type(input))}")
        x = input.as_subclass(torch.Tensor) if type(input) is not torch.Tensor else input
        if not self.is_nvfp4:
            return mx_quantize_dequantize(x, self.format, self.scaling_mode)
        if self._calibrating:
            amax = x.detach().abs().max().float()
            self._seen = amax if self._seen is None else torch.maximum(self._seen, amax)
        tensor_amax = self.tensor_amax(x)
        if not bool(tensor_amax > 0):
            return x * 0  # an all-zero tensor (no scale to take)
        return nvfp4_quantize_dequantize(x, per_tensor_amax_to_scale(tensor_amax), self.format.block_size)

    def tensor_amax(self, x: torch.Tensor) -> torch.Tensor:
        """NVFP4's per-tensor amax for ``x``: the calibrated ``global_amax`` (outside calibration), else ``x``'s."""
        if self.global_amax is not None and not self._calibrating:
            return self.global_amax
        return x.detach().abs().max().float()
