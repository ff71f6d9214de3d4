"""AWQ (Lin et al. 2024, "AWQ: Activation-aware Weight Quantization for LLM Compression and Acceleration"):
scale up the weight columns that meet large activations before quantizing, so they lose less.

Per Linear layer (or group of Linears reading one op's output), with ``m_j`` the mean ``|x_j|`` of input
channel ``j`` over the calibration tokens, a grid of ``n = scale_search_space_size`` ratios::

    for r in 0, 1/n, ..., (n-1)/n:
        s = m^r / sqrt(max(m^r) min(m^r))
        loss(r) = sum over the layers of || (Q(W diag(s)) diag(s)^-1 - W) X ||^2

keeps the ``s`` of the smallest loss (``r = 0`` is round to nearest, so the
search never does worse on the calibration data); the loss is exact over every
calibration token through the Gram matrix ``X X^T``. ``1 / s`` is folded into
the op before where that is exact, and kept in the weight otherwise (see
:mod:`quanta.quantization.smoothing`). ``Q`` is the base config (by default
``Int4WeightOnlyConfig()``).

>>> import torch
>>> from torch import nn
>>> from quanta.quantization import quantize_, AWQConfig, Int4WeightOnlyConfig
>>> _ = torch.manual_seed(0)
>>> model = nn.Sequential(nn.LayerNorm(128), nn.Linear(128, 64))
>>> with torch.no_grad():  # channels of very different ranges, as in LLMs
...     _ = model[0].weight.copy_(torch.logspace(-1, 1.3, 128))
>>> base = Int4WeightOnlyConfig(group_size=32)
>>> report = quantize_(model, AWQConfig(base, step="prepare"))
>>> _ = model(torch.randn(256, 128))
>>> report = quantize_(model, AWQConfig(base, step="convert"))
>>> report.scale_folded_into
{'1': '0'}
>>> rtn, awq = report.output_mse["1"]
>>> bool(awq < rtn)
True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import nn

from quanta.quantization.observed import check_base_config, check_step
from quanta.quantization.quant_api import AOBaseConfig, CalibrationConfig, Int4WeightOnlyConfig
from quanta.quantization.smoothing import InputStatistics, convert_smoothing, prepare_smoothing, round_scale

__all__ = ["AWQConfig", "awq_scale_search"]


def awq_scale_search(weights: list[torch.Tensor], modules: list[nn.Module], abs_mean: torch.Tensor,
                     gram: torch.Tensor, base_config: AOBaseConfig, grid: int) -> tuple[torch.Tensor, float]:
    """The AWQ scale of layers reading the same input (see the module docstring) and its ratio ``r``.

    ``weights``: their float weights ``[N_i, K]``; ``gram``: ``X X^T``-proportional ``[K, K]``.
    """
    m = abs_mean.float().clamp(min=1e-4)
    best, best_loss, best_r = torch.ones_like(m), float("inf"), 0.0
    dtype = weights[0].dtype
    for i in range(grid):
        r = i / grid
        s = m.pow(r)
        s = round_scale(s / (s.max() * s.min()).sqrt(), dtype)
        loss = 0.0
        for w, mod in zip(weights, modules):
            q = base_config.quantize_weight((w.float() * s).to(dtype), mod).dequantize().float() / s
            d = q - w.float()
            loss += float(((d @ gram) * d).sum())
        if loss < best_loss:
            best, best_loss, best_r = s, loss, r
    return best, best_r


@dataclass
class AWQConfig(CalibrationConfig):
    """AWQ through ``quantize_`` in two steps (torchao's ``AWQConfig``).

    Args:
        base_config: the weight quantization (default ``Int4WeightOnlyConfig()``; any quanta base config).
        step: ``"prepare"`` (observers; weights unchanged), then calibration data, then ``"convert"``.
            (torchao's ``"prepare_for_loading"`` is not needed: quanta's checkpoints hold the quantized
            tensors, see :func:`~quanta.dtypes.load_quantized`.)
        scale_search_space_size: ratios tried in the grid search.
    """

    steps: ClassVar[tuple[str, str]] = ("prepare", "convert")

    base_config: AOBaseConfig = field(default_factory=Int4WeightOnlyConfig)
    step: str = "prepare"
    scale_search_space_size: int = 20

    def __post_init__(self) -> None:
        check_step(self.step, self.steps, "AWQConfig")
        check_base_config(self.base_config, "AWQConfig")
        n = self.scale_search_space_size
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"AWQConfig.scale_search_space_size must be a positive int, got {n!r}")

    def describe(self) -> str:
        return f"AWQConfig(step={self.step!r}, base_config={self.base_config.describe()})"

    def apply(self, model, selected, report):
        if self.step == "convert":
            def choose(mods, weights, consumers, stats: list[InputStatistics]) -> torch.Tensor:
                gram = sum(st.gram.hessian() for st in stats) / len(stats)
                abs_mean = torch.stack([st.abs_mean for st in stats]).mean(0)
                return awq_scale_search(weights, mods, abs_mean, gram, self.base_config,
                                        self.scale_search_space_size)[0]
            return convert_smoothing(model, selected, report, base_config=self.base_config, choose_scale=choose,
                                     what="AWQConfig")
        return prepare_smoothing(model, selected, report, what="AWQConfig", gram=True, sample_rows=0)
