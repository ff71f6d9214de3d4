"""ModelOpt's calibration algorithms beyond ``"max"``: ``"smoothquant"``.

**smoothquant** (``{"method": "smoothquant", "alpha": 1.0}``, ModelOpt's default
alpha), on every Linear whose input and weight quantizers are 8-bit integers:

1. the input quantizer calibrates per input channel (``axis=-1``) and everything
   else with ``"max"``;
2. ``s = clamp(max|W|_col ** (1 - alpha) / amax_x ** alpha, 1e-4, 1e4)`` per input channel
   (channels whose input amax is 0 take ``s = 1``);
3. the input quantizer multiplies its input by ``s`` (``pre_quant_scale``) and
   quantizes per tensor with amax ``max(amax_x * s)``; the weight becomes
   ``W / s`` (columns), and its amax is recalibrated.

The layer computes ``(x s) (W / s)^T`` = ``x W^T`` before quantization, so the
smoothing only moves range from the activations into the weights. All of it in
ModelOpt 0.47's order of float operations (bit for bit on the recorded models).
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional

import torch
from torch import nn

from quanta.modelopt.modules import QuantModule
from quanta.modelopt.tensor_quantizer import TensorQuantizer

__all__ = ["smoothquant_layers", "finish_smoothquant"]


def _is_linear(m: nn.Module) -> bool:
    return isinstance(m, QuantModule) and isinstance(getattr(m, "input_quantizer", None), TensorQuantizer) \
        and isinstance(getattr(m, "weight_quantizer", None), TensorQuantizer) and not isinstance(m, nn.Embedding) \
        and getattr(m, "weight", None) is not None and m.weight.dim() == 2


def smoothquant_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The Linear layers SmoothQuant may smooth; their input quantizers switched to per-channel amax."""
    out = []
    for name, m in model.named_modules():
        if _is_linear(m) and m.input_quantizer.is_enabled and m.input_quantizer.axis is None:
            m.input_quantizer.set_from_attribute_config({"axis": -1})
        if _is_linear(m):
            out.append((name, m))
    return out


@torch.no_grad()
def finish_smoothquant(layers: list[tuple[str, nn.Module]], alpha: float,
                       recalibrate_weight: Callable[[nn.Module], None]) -> int:
    """Smooth the calibrated ``layers`` (step 2 and 3 of the module docstring); returns how many it smoothed."""
    done = 0
    for name, m in layers:
        iq, wq = m.input_quantizer, m.weight_quantizer
        if iq.amax is None:
            warnings.warn(f"{name} is not calibrated, skip smoothing", stacklevel=3)
            continue
        if iq.num_bits != 8 or wq.num_bits != 8:
            warnings.warn(f"Only int8 smoothing is supported, skip {name}", stacklevel=3)
            continue
        if iq.axis != -1:
            warnings.warn(f"Only per-channel smoothing is supported, skip {name}", stacklevel=3)
            continue
        if iq.amax.numel() <= 1:
            raise ValueError(f"{name} has only one input channel to smooth")
        act_amax = iq.amax.float()
        weight_scale = m.weight.abs().amax(dim=0, keepdim=True)
        dtype = m.weight.dtype
        scale = (weight_scale.pow(1 - alpha) / act_amax.pow(alpha)).squeeze()
        for_smoothing = act_amax.cpu()
        iq.reset_amax()
        iq.set_from_attribute_config({"axis": None})
        eps = 1.0 / (1 << 31)
        if scale.min() <= eps:
            scale[(act_amax <= eps).reshape(scale.shape)] = 1
        scale = scale.clamp(min=1e-4, max=1e4).to(torch.float32)
        iq.pre_quant_scale = scale.to(dtype)
        m.weight.data.copy_((m.weight * (1.0 / scale).squeeze()[None, :]).to(dtype))
        wq.reset_amax()
        recalibrate_weight(m)
        iq.amax = (for_smoothing.to(device=m.weight.device, dtype=dtype) * scale.to(m.weight.device)).amax().to(dtype)
        done += 1
    return done


def alpha_of(kwargs: dict) -> float:
    """SmoothQuant's ``alpha`` from the algorithm's keyword arguments (ModelOpt's default 1.0)."""
    unknown = set(kwargs) - {"alpha"}
    if unknown:
        raise ValueError(f"smoothquant takes 'alpha' only, got {sorted(unknown)}")
    alpha: Optional[float] = kwargs.get("alpha", 1.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"smoothquant alpha must be in [0, 1], got {alpha!r}")
    return float(alpha)
