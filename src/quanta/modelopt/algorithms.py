"""ModelOpt's calibration algorithms beyond ``"max"``: ``"smoothquant"`` and ``"awq_lite"``.

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
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from quanta.modelopt.modules import QuantModule
from quanta.modelopt.tensor_quantizer import TensorQuantizer

__all__ = ["smoothquant_layers", "finish_smoothquant", "smooth", "awq_lite", "alpha_of"]


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
        scale = (weight_scale.pow(1 - alpha) / act_amax.pow(alpha)).squeeze()
        for_smoothing = act_amax.cpu()
        iq.reset_amax()
        iq.set_from_attribute_config({"axis": None})
        iq.amax = act_amax.amax()
        eps = 1.0 / (1 << 31)
        if scale.min() <= eps:
            scale[(act_amax <= eps).reshape(scale.shape)] = 1
        scale = scale.clamp(min=1e-4, max=1e4)
        smooth(m, scale, for_smoothing, recalibrate_weight)
        done += 1
    return done


@torch.no_grad()
def smooth(m: nn.Module, pre_quant_scale: torch.Tensor, amax_for_smoothing: Optional[torch.Tensor],
           recalibrate_weight: Callable[[nn.Module], None]) -> None:
    """The input quantizer multiplies by ``pre_quant_scale``, the weight's columns are divided by it, the
    weight's amax is recalibrated and the input's set to ``max(amax_for_smoothing * pre_quant_scale)``
    (ModelOpt's ``apply_pre_quant_scale_and_smooth``)."""
    iq, wq = m.input_quantizer, m.weight_quantizer
    pqs = pre_quant_scale.to(torch.float32)
    if not bool((pqs > 0).all()):
        raise ValueError("pre_quant_scale must be positive")
    dtype = m.weight.dtype
    iq.pre_quant_scale = pqs.to(dtype)
    m.weight.data.copy_((m.weight * (1.0 / pqs).to(m.weight.device).squeeze()[None, :]).to(dtype))
    wq.reset_amax()
    recalibrate_weight(m)
    if iq.amax is not None and amax_for_smoothing is not None:
        iq.amax = (amax_for_smoothing.to(device=m.weight.device, dtype=dtype) * pqs.to(m.weight.device)).amax().to(
            dtype)


def alpha_of(kwargs: dict) -> float:
    """SmoothQuant's ``alpha`` from the algorithm's keyword arguments (ModelOpt's default 1.0)."""
    unknown = set(kwargs) - {"alpha"}
    if unknown:
        raise ValueError(f"smoothquant takes 'alpha' only, got {sorted(unknown)}")
    alpha: Optional[float] = kwargs.get("alpha", 1.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0.0 <= alpha <= 1.0:
        raise ValueError(f"smoothquant alpha must be in [0, 1], got {alpha!r}")
    return float(alpha)


# --------------------------------------------------------------------------- AWQ (lite)
class _AWQLite:
    """One Linear's state in ``awq_lite``: its activation and weight statistics and each alpha's loss."""

    def __init__(self, m: nn.Module, alpha_step: float) -> None:
        wq = m.weight_quantizer
        bs = wq.block_sizes
        self.block_size = None if bs is None else bs.get(-1, bs.get(1))
        self.weight_scale = _weight_scale(m.weight.detach(), self.block_size)
        self.loss = {k.item(): torch.zeros((), dtype=torch.float32)
                     for k in torch.arange(0, 1.0 + alpha_step, alpha_step)}
        self.act_scale: Any = 0.0
        self.cache_steps = 0
        self.search_steps = 0
        self.is_input_quantized = m.input_quantizer.is_enabled
        self.enabled = True
        self.cache_mode = True


def _weight_scale(w: torch.Tensor, block: Optional[int]) -> torch.Tensor:
    """Mean over the output rows of ``|w|`` relative to its block's (or row's) largest magnitude."""
    shape, cut = w.shape, None
    if block:
        if shape[-1] % block:
            cut = slice(shape[-1])
            w = F.pad(w, (0, block - shape[-1] % block), "constant", 0)
            shape = w.shape
        w = w.contiguous().view(-1, block)
    a = w.abs()
    scale = (a / (a.amax(dim=1, keepdim=True) + torch.finfo(w.dtype).tiny)).view(shape)
    if cut is not None:
        scale = scale[..., cut]
    return scale.mean(0).to(torch.float32)


def _act_scale(x: torch.Tensor) -> torch.Tensor:
    return x.abs().contiguous().view(-1, x.shape[-1]).mean(0).to(torch.float32)


def _awq_scale(x_max: torch.Tensor, w_max: torch.Tensor, alpha: float) -> torch.Tensor:
    """``s = x_max**alpha / w_max**(1 - alpha)``, clamped to [1e-4, 1e4], normalised so ``max(s) min(s) = 1``."""
    s = (x_max.pow(alpha) / (w_max.to(x_max.device).pow(1 - alpha) + torch.finfo(torch.float32).tiny)).clamp(
        min=1e-4, max=1e4).view(-1)
    return (s / (s.max() * s.min()).sqrt()).view(-1)


def _awq_forward(max_calibrate: Callable[[nn.Module, Callable], None]):
    def forward(m: nn.Module, input: torch.Tensor, *args, **kwargs):
        h: _AWQLite = m.__dict__["_awq_lite"]
        iq, wq = m.input_quantizer, m.weight_quantizer
        wq.disable()
        iq.pre_quant_scale = None
        wq.pre_quant_scale = None
        out_actual = m.quant_forward(input, *args, **kwargs)
        wq.enable()
        if input.numel() == 0 or not h.enabled:
            return out_actual
        if h.cache_mode:
            h.act_scale = h.act_scale + _act_scale(iq(input))
            h.cache_steps += 1
            if h.is_input_quantized:
                iq.enable()
                try:
                    max_calibrate(iq, lambda q: q(input))
                finally:
                    iq.disable()
            return out_actual
        for alpha in h.loss:
            s = _awq_scale(h.act_scale, h.weight_scale, alpha)
            iq.pre_quant_scale = (1 / s).to(m.weight.dtype)
            wq.pre_quant_scale = s.to(m.weight.dtype)
            out = m.quant_forward(input, *args, **kwargs)
            h.loss[alpha] += (out - out_actual).float().pow(2).mean()
        h.search_steps += 1
        return out_actual
    return forward


def awq_lite(model: nn.Module, forward_loop: Callable, alpha_step: float,
             stats_on: Callable[[nn.Module], list], stats_off: Callable[[list], None],
             max_calibrate: Callable[[nn.Module, Callable], None]) -> int:
    """ModelOpt's ``awq_lite`` on every Linear whose weight quantizer is enabled; returns how many it scaled.

    Two passes of ``forward_loop`` through the float model (each Linear returns its float output): the first
    averages ``mean|x|`` per input channel (and calibrates per-channel input amax where inputs are quantized),
    the second scores, for ``alpha`` in ``0, alpha_step, ..., 1``, the output MSE of the layer with
    ``x / s`` and ``quantize(W diag(s))``, ``s = _awq_scale(mean|x|, mean|W|/blockmax, alpha)``. The best ``s``
    is then folded in: the input quantizer multiplies by ``1 / s``, the weight's columns by ``s``.
    """
    if not isinstance(alpha_step, (int, float)) or isinstance(alpha_step, bool) or not 0 < alpha_step <= 1:
        raise ValueError(f"alpha_step must be in (0, 1], got {alpha_step!r}")
    layers = [(n, m) for n, m in model.named_modules() if _is_linear(m) and m.weight_quantizer.is_enabled]
    forward = _awq_forward(max_calibrate)
    for _, m in layers:
        h = _AWQLite(m, alpha_step)
        m.__dict__["_awq_lite"] = h
        m.__dict__["_forward_override"] = forward
        if m.input_quantizer.is_enabled:
            m.input_quantizer.disable()
            if m.input_quantizer.axis not in (None, -1):
                h.enabled = False
            else:
                m.input_quantizer.set_from_attribute_config({"axis": -1})
    try:
        active = stats_on(model)
        with torch.no_grad():
            forward_loop(model)
        stats_off(active)
        for _, m in layers:
            h = m.__dict__["_awq_lite"]
            if h.cache_steps == 0:
                h.enabled = False
                continue
            h.act_scale = h.act_scale / h.cache_steps
            if bool(torch.isnan(h.act_scale).any()) or bool(torch.isnan(h.weight_scale).any()):
                h.enabled = False
            h.cache_mode = False
        with torch.no_grad():
            forward_loop(model)
    finally:
        for _, m in layers:
            m.__dict__.pop("_forward_override", None)
    done = 0
    with torch.no_grad():
        for name, m in layers:
            h = m.__dict__.pop("_awq_lite")
            iq = m.input_quantizer
            m.weight_quantizer.pre_quant_scale = None
            iq.pre_quant_scale = None
            if h.cache_steps > 0 and h.search_steps == 0:
                h.enabled = False
                warnings.warn(f"awq_lite: the second forward_loop(model) did not reach {name}; it keeps max "
                              "calibration", stacklevel=3)
            for_smoothing = None
            if h.is_input_quantized:
                if iq.amax is not None:
                    for_smoothing = iq.amax.cpu()
                    act_amax = iq.amax
                    iq.reset_amax()
                    iq.set_from_attribute_config({"axis": None})
                    iq.amax = act_amax.amax()
                iq.enable()
            if not h.enabled:
                max_calibrate(m, lambda mm: mm.weight_quantizer(mm.weight))
                iq.pre_quant_scale = torch.ones(m.weight.shape[1], dtype=m.weight.dtype, device=m.weight.device)
                continue
            losses = {k: float(v) for k, v in h.loss.items()}
            best = min(losses, key=losses.get)
            smooth(m, 1.0 / _awq_scale(h.act_scale, h.weight_scale, best), for_smoothing,
                   lambda mm: max_calibrate(mm, lambda x: x.weight_quantizer(x.weight)))
            done += 1
    return done


# --------------------------------------------------------------------------- AWQ (clip)
class _AWQClip:
    """One Linear's state in ``awq_clip``: its per-block weight amax and each clip ratio's loss."""

    def __init__(self, m: nn.Module, min_clip_ratio: float, shrink_step: float, stats_on, stats_off) -> None:
        wq = m.weight_quantizer
        bs = wq.block_sizes
        self.block_size = bs.get(-1, bs.get(1))
        wq.reset_amax()
        active = stats_on(wq)
        wq(m.weight)
        stats_off(active)
        self.w_amax = wq.amax.clone()
        co, ci = m.weight.shape
        ratios = [round(float(k), 2) for k in torch.arange(min_clip_ratio, 1.0, shrink_step)] + [1.0]
        self.per_tensor = wq.axis is None and (bs is None or bs.get("type") == "dynamic")
        shape = () if self.per_tensor else (co, -(-ci // self.block_size))
        self.loss = {k: torch.zeros(shape, dtype=torch.float32) for k in ratios}
        self.tokens = 0
        self.is_input_quantized = m.input_quantizer.is_enabled
        wq.disable()


def _clip_search(m: nn.Module, h: _AWQClip, inputs: torch.Tensor, co_bsz: int, max_tokens: int) -> None:
    """Add each clip ratio's output error (per output row and block) on ``inputs``."""
    wq = m.weight_quantizer
    weight = m.weight
    wq.enable()
    if h.per_tensor:
        out_actual = inputs @ weight.T
        original = wq.amax.clone()
        h.tokens += inputs.shape[0]
        for shrink in h.loss:
            wq.amax = original * shrink
            h.loss[shrink] += (inputs @ wq(weight).T - out_actual).float().pow(2).mean()
        return
    inputs = inputs.view(-1, inputs.shape[-1])
    inputs = inputs[0::max(1, inputs.shape[0] // max_tokens)]
    h.tokens += inputs.shape[0]
    b = h.block_size
    co, ci = weight.shape
    if ci % b:
        weight = F.pad(weight, (0, b - ci % b), "constant", 0)
        inputs = F.pad(inputs, (0, b - ci % b), "constant", 0)
    weight = weight.reshape(co, 1, -1, b)
    inputs = inputs.reshape(1, inputs.shape[0], -1, b)
    for start in range(0, co, co_bsz):
        rows = slice(start, min(start + co_bsz, co))
        w = weight[rows]
        org_out = (inputs * w).sum(dim=-1)
        for shrink in h.loss:
            wq.amax = h.w_amax * shrink
            cur_w = wq(m.weight)[rows]
            if cur_w.shape[-1] % b:
                cur_w = F.pad(cur_w, (0, b - cur_w.shape[-1] % b), "constant", 0)
            cur_out = (inputs * cur_w.reshape(w.shape)).sum(dim=-1)
            h.loss[shrink][rows] += (cur_out - org_out).float().pow(2).mean(dim=1)


def awq_clip(model: nn.Module, forward_loop: Callable, stats_on, stats_off,
             max_calibrate: Callable[[nn.Module, Callable], None], max_co_batch_size: int = 1024,
             max_tokens_per_batch: int = 64, min_clip_ratio: float = 0.5, shrink_step: float = 0.05) -> int:
    """ModelOpt's ``awq_clip``: for every block-quantized Linear weight, the clip ratio of each block's amax
    (``min_clip_ratio, +shrink_step, ..., 1``) with the least output error on (up to ``max_tokens_per_batch``
    rows of) each batch's inputs; returns how many layers it clipped."""
    for name, v in (("min_clip_ratio", min_clip_ratio), ("shrink_step", shrink_step)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise ValueError(f"awq_clip {name} must be in (0, 1], got {v!r}")
    for name, v in (("max_co_batch_size", max_co_batch_size), ("max_tokens_per_batch", max_tokens_per_batch)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"awq_clip {name} must be a positive int, got {v!r}")
    layers = [(n, m) for n, m in model.named_modules()
              if _is_linear(m) and m.weight_quantizer.is_enabled and m.weight_quantizer.block_sizes is not None]

    def forward(m: nn.Module, input: torch.Tensor, *args, **kwargs):
        h: _AWQClip = m.__dict__["_awq_clip"]
        iq = m.input_quantizer
        if h.is_input_quantized:
            iq.enable()
            max_calibrate(iq, lambda q: q(input))
            iq.disable()
        _clip_search(m, h, iq(input), max_co_batch_size, max_tokens_per_batch)
        m.weight_quantizer.disable()
        return m.quant_forward(input, *args, **kwargs)

    for _, m in layers:
        m.__dict__["_awq_clip"] = _AWQClip(m, min_clip_ratio, shrink_step, stats_on, stats_off)
        m.__dict__["_forward_override"] = forward
    try:
        active = stats_on(model)
        with torch.no_grad():
            forward_loop(model)
        stats_off(active)
    finally:
        for _, m in layers:
            m.__dict__.pop("_forward_override", None)
    done = 0
    for _, m in layers:
        h = m.__dict__.pop("_awq_clip")
        if h.tokens > 0:
            best_loss = torch.full_like(h.w_amax, float("inf"))
            best = torch.zeros_like(h.w_amax)
            for shrink, loss in h.loss.items():
                loss = loss.view_as(h.w_amax)
                better = loss < best_loss
                best_loss = torch.where(better, loss, best_loss)
                best = torch.where(better, h.w_amax * shrink, best)
            m.weight_quantizer.amax = best
            m.weight_quantizer.enable()
            if h.is_input_quantized:
                m.input_quantizer.enable()
            done += 1
    return done
