"""SmoothQuant (Xiao et al. 2023, "SmoothQuant: Accurate and Efficient Post-Training Quantization for Large
Language Models"): move activation outliers into the weights before W8A8 quantization.

Per input channel ``j`` of a Linear layer (or of the group of Linears reading one op's output)::

    s_j = (max|X_j| + eps)^alpha / (max|W_:,j| + eps)^(1 - alpha)        eps = finfo(float32).eps

then ``x / s`` is folded into the op before (LayerNorm, RMSNorm, Linear) where
that is exact, and kept in the weight otherwise (see
:mod:`quanta.quantization.smoothing`); ``W diag(s)`` is quantized with the base
config (by default ``Int8DynamicActivationInt8WeightConfig()``: the smoothed
activations are quantized per token at run time). ``alpha`` is the migration
strength: 0 leaves the activations alone, 1 moves all their range into the weights.

>>> import torch
>>> from torch import nn
>>> from quanta.quantization import quantize_, SmoothQuantConfig
>>> _ = torch.manual_seed(0)
>>> model = nn.Sequential(nn.LayerNorm(64), nn.Linear(64, 32))
>>> with torch.no_grad():  # channels of very different ranges, as in LLMs
...     _ = model[0].weight.copy_(torch.logspace(-1, 1.3, 64))
>>> report = quantize_(model, SmoothQuantConfig(step="prepare"))
>>> _ = model(torch.randn(16, 64))
>>> report = quantize_(model, SmoothQuantConfig(step="convert"))
>>> report.scale_folded_into
{'1': '0'}
>>> rtn, smooth = report.output_mse["1"]
>>> bool(smooth < rtn)
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Optional

import torch
from torch import nn

from quanta.quantization.observed import check_base_config, check_step
from quanta.quantization.quant_api import (
    AOBaseConfig,
    CalibrationConfig,
    Int8DynamicActivationInt8WeightConfig,
)
from quanta.quantization.smoothing import InputStatistics, convert_smoothing, prepare_smoothing

__all__ = ["SmoothQuantConfig", "smoothquant_scale"]

_REPORT_ROWS = 512  # input rows kept per layer for the report's output error (activation quantization included)


def smoothquant_scale(x_absmax: torch.Tensor, w_absmax: torch.Tensor, alpha: Optional[float]) -> torch.Tensor:
    """``(x_absmax + eps)^alpha / (w_absmax + eps)^(1 - alpha)`` (ones when ``alpha`` is None).

    >>> smoothquant_scale(torch.tensor([16.0, 1.0]), torch.tensor([1.0, 1.0]), 0.5)
    tensor([4., 1.])
    """
    if alpha is None:
        return torch.ones_like(x_absmax)
    eps = torch.finfo(torch.float32).eps
    return (x_absmax.float() + eps).pow(alpha) / (w_absmax.float() + eps).pow(1 - alpha)


@dataclass
class SmoothQuantConfig(CalibrationConfig):
    """SmoothQuant through ``quantize_`` in two steps (torchao's ``SmoothQuantConfig``).

    Args:
        base_config: the quantization after smoothing (default: ``Int8DynamicActivationInt8WeightConfig()``).
        step: ``"prepare"`` (observers; weights unchanged), then calibration data, then ``"convert"``.
        alpha: migration strength in [0, 1]; None disables smoothing (plain base config).
        use_running_absmax: accepted for torchao compatibility; quanta always keeps a running per-channel
            absmax (memory O(features)), which is what torchao's option selects, with the same result.
    """

    steps: ClassVar[tuple[str, str]] = ("prepare", "convert")

    base_config: AOBaseConfig = field(default_factory=Int8DynamicActivationInt8WeightConfig)
    step: str = "prepare"
    alpha: Optional[float] = 0.5
    use_running_absmax: bool = False

    def __post_init__(self) -> None:
        check_step(self.step, self.steps, "SmoothQuantConfig")
        check_base_config(self.base_config, "SmoothQuantConfig")
        a = self.alpha
        if a is not None and (isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a)
                              or not 0 <= a <= 1):
            raise ValueError(f"SmoothQuantConfig.alpha must be a number in [0, 1] or None, got {a!r}")
        if not isinstance(self.use_running_absmax, bool):
            raise TypeError(f"SmoothQuantConfig.use_running_absmax must be a bool, got {self.use_running_absmax!r}")

    def describe(self) -> str:
        return f"SmoothQuantConfig(step={self.step!r}, alpha={self.alpha}, base_config={self.base_config.describe()})"

    def apply(self, model, selected, report):
        if self.step == "convert":
            return convert_smoothing(model, selected, report, base_config=self.base_config,
                                     choose_scale=self._scale, what="SmoothQuantConfig")
        return prepare_smoothing(model, selected, report, what="SmoothQuantConfig", gram=False,
                                 sample_rows=_REPORT_ROWS)

    def _scale(self, modules: list[nn.Module], weights: list[torch.Tensor], consumers: list[torch.Tensor],
               stats: list[InputStatistics]) -> torch.Tensor:
        x_absmax = torch.stack([st.absmax for st in stats]).amax(0)
        w_absmax = torch.stack([w.float().abs().amax(0) for w in consumers]).amax(0)
        return smoothquant_scale(x_absmax, w_absmax, self.alpha)
