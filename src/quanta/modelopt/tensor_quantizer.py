"""ModelOpt's ``TensorQuantizer`` (``modelopt.torch.quantization.nn.TensorQuantizer``) and ``SequentialQuantizer``.

A quantizer is configured by :class:`~quanta.modelopt.config.QuantizerAttributeConfig`
attributes and runs, in order: ``pre_quant_scale`` (a per-channel factor, applied even when the quantizer is
disabled, as ModelOpt's); bypass if disabled; blocks
(static ``block_sizes`` reshape the input to one row per block, so the amax is
per block); calibration (``enable_calib``: the calibrator sees the input);
fake quantization (``enable_quant``)::

    integer        fake_tensor_quant(x, amax, num_bits, unsigned, narrow_range)     (TensorRT's, bit for bit)
    (4, 3)         fake_e4m3_quant_modelopt(x, amax)                (ModelOpt's own float32 arithmetic)
    MX blocks      mx_quantize_dequantize(x, fmt, RCEIL)       (dynamic, scale_bits (8, 0): NVIDIA's 2**ceil rule)
    NVFP4 blocks   nvfp4_quantize_dequantize(x, amax / (6 * 448))   (amax: calibrated, or of this input)

``amax`` is the calibrated ``_amax`` buffer, else the input's own (per ``axis``).
All rounding is quanta's kernels'; ModelOpt 0.47 gives the same bits on the CPU
where it runs (``tests/golden/test_modelopt_models.py``). The gradient is the
identity (``pass_through_bwd=True``, ModelOpt's default) or the kernels'
straight-through estimate with clipping (``pass_through_bwd=False``).

>>> q = TensorQuantizer(QuantizerAttributeConfig(num_bits=8, axis=0))
>>> q.disable_quant(); q.enable_calib()
>>> _ = q(torch.tensor([[1.0, -2.0], [0.5, 0.25]]))
>>> q.load_calib_amax(); q.disable_calib(); q.enable_quant()
>>> q
TensorQuantizer(8 bit fake axis=0 amax=[5.00e-01, 2.00e+00](2) calibrator=MaxCalibrator quant)
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

from quanta.grids.block_scaled import MXFP4, MXFP6_E2M3, MXFP6_E3M2, MXFP8_E4M3, MXFP8_E5M2, MXINT8, ScaleCalculationMode
from quanta.kernels.amax_quant import fake_e4m3_quant_modelopt, fake_tensor_quant
from quanta.kernels.block_scaled import (
    mx_quantize_dequantize,
    nvfp4_quantize_dequantize,
    per_tensor_amax_to_scale,
)
from quanta.modelopt.config import QuantizerAttributeConfig, check_attributes
from quanta.tensor_quant.axis import reduce_amax
from quanta.tensor_quant.calib import HistogramCalibrator, MaxCalibrator
from quanta.tensor_quant.quantizer import StageSwitches, amax_summary

__all__ = ["TensorQuantizer", "SequentialQuantizer"]

_MX = {(4, 3): MXFP8_E4M3, (5, 2): MXFP8_E5M2, (2, 3): MXFP6_E2M3, (3, 2): MXFP6_E3M2, (2, 1): MXFP4, 8: MXINT8}
_DEFAULTS = {k: v for k, v in vars(QuantizerAttributeConfig()).items()}


class _PassThrough(torch.autograd.Function):
    """ModelOpt's ``pass_through_bwd=True`` (its default): the gradient of the fake quantization is the identity."""

    @staticmethod
    def forward(ctx, x, fn):
        with torch.no_grad():
            return fn(x.detach())

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ClippedPassThrough(torch.autograd.Function):
    """``pass_through_bwd=False`` for FP8: the gradient passes where ``|x| <= amax``, 0 elsewhere."""

    @staticmethod
    def forward(ctx, x, amax, fn):
        ctx.save_for_backward(x.detach().abs() <= amax.to(x.dtype))
        with torch.no_grad():
            return fn(x.detach())

    @staticmethod
    def backward(ctx, grad):
        (inside,) = ctx.saved_tensors
        return torch.where(inside, grad, torch.zeros_like(grad)), None, None


class TensorQuantizer(StageSwitches, nn.Module):
    """One quantizer (ModelOpt's attributes, switches and ``load_calib_amax``).

    Args:
        quant_attribute_cfg: the attributes (default 8-bit per tensor).
        if_quant: start with quantization on.
        if_calib: start with calibration on.
        amax: an initial amax.
    """

    def __init__(self, quant_attribute_cfg: Optional[Union[QuantizerAttributeConfig, Mapping]] = None,
                 if_quant: bool = True, if_calib: bool = False, amax: Optional[Union[float, torch.Tensor]] = None
                 ) -> None:
        super().__init__()
        self._attrs: dict[str, Any] = dict(_DEFAULTS)
        self._if_quant, self._if_calib = bool(if_quant), bool(if_calib)
        self._calibrator = None
        self.set_from_attribute_config(quant_attribute_cfg if quant_attribute_cfg is not None
                                       else QuantizerAttributeConfig())
        if amax is not None:
            self.amax = amax

    # -- attributes ---------------------------------------------------------------------------------------
    def set_from_attribute_config(self, attribute_cfg: Union[QuantizerAttributeConfig, Mapping]) -> None:
        """Set attributes: a :class:`QuantizerAttributeConfig` replaces all of them, a dict only those it names."""
        if isinstance(attribute_cfg, QuantizerAttributeConfig):
            attrs = vars(attribute_cfg)
        elif isinstance(attribute_cfg, Mapping):
            attrs = dict(attribute_cfg)
            check_attributes(attrs)
        else:
            raise TypeError(f"attribute_cfg must be a QuantizerAttributeConfig or a dict, got {attribute_cfg!r}")
        new = dict(self._attrs)
        new.update(attrs)
        if isinstance(new["num_bits"], list):
            new["num_bits"] = tuple(new["num_bits"])
        check_attributes(new)
        changed = {k for k in ("num_bits", "axis", "unsigned", "calibrator", "block_sizes") if new[k] != self._attrs[k]}
        self._attrs = new
        # a full configuration (or a new grid) starts a fresh calibrator, as ModelOpt's calibrator setter does
        if changed or self._calibrator is None or isinstance(attribute_cfg, QuantizerAttributeConfig):
            self._make_calibrator()

    def _make_calibrator(self) -> None:
        axis = (0,) if self.is_static_block_quant else self._attrs["axis"]
        nb = self._attrs["num_bits"]
        bits = 8 if isinstance(nb, tuple) else nb
        cls = HistogramCalibrator if self._attrs["calibrator"] == "histogram" else MaxCalibrator
        self._calibrator = cls(bits, axis, self._attrs["unsigned"])

    @property
    def num_bits(self):
        return self._attrs["num_bits"]

    @property
    def axis(self):
        return self._attrs["axis"]

    @property
    def block_sizes(self) -> Optional[dict]:
        return self._attrs["block_sizes"]

    @property
    def unsigned(self) -> bool:
        return self._attrs["unsigned"]

    @property
    def narrow_range(self) -> bool:
        return self._attrs["narrow_range"]

    @property
    def fake_quant(self) -> bool:
        return True

    @property
    def is_enabled(self) -> bool:
        return self._attrs["enable"]

    @property
    def is_static_block_quant(self) -> bool:
        bs = self._attrs["block_sizes"]
        return bs is not None and bs.get("type", "static") == "static" and any(
            isinstance(k, int) and v is not None for k, v in bs.items())

    @property
    def _dynamic_block(self) -> Optional[dict]:
        bs = self._attrs["block_sizes"]
        return bs if bs is not None and bs.get("type") == "dynamic" else None

    @property
    def _dynamic(self) -> bool:
        return self._attrs["type"] == "dynamic"

    @property
    def maxbound(self) -> float:
        nb = self._attrs["num_bits"]
        if isinstance(nb, tuple):
            return 448.0 if nb == (4, 3) else float("nan")
        return float((1 << (nb - 1 + int(self.unsigned))) - 1)

    @property
    def amax(self) -> Optional[torch.Tensor]:
        return self._buffers.get("_amax")

    @amax.setter
    def amax(self, value: Union[float, torch.Tensor]) -> None:
        t = torch.as_tensor(value, dtype=torch.float32).detach().clone()
        if not bool(torch.isfinite(t).all()) or bool((t < 0).any()):
            raise ValueError(f"amax must be finite and >= 0, got {t}")
        if "_amax" in self._buffers:
            self._amax = t.to(self._amax.device)
        else:
            self.register_buffer("_amax", t)

    def reset_amax(self) -> None:
        """Forget the amax and what the calibrator collected."""
        self._buffers.pop("_amax", None)
        if self._calibrator is not None:
            self._calibrator.reset()

    @property
    def pre_quant_scale(self) -> Optional[torch.Tensor]:
        """A per-channel factor the input is multiplied by before quantization (SmoothQuant, AWQ), or None."""
        return self._buffers.get("_pre_quant_scale")

    @pre_quant_scale.setter
    def pre_quant_scale(self, value: Optional[torch.Tensor]) -> None:
        if value is None:
            self._buffers.pop("_pre_quant_scale", None)
            return
        t = torch.as_tensor(value).detach().clone()
        if not bool(torch.isfinite(t).all()) or not bool((t > 0).all()):
            raise ValueError("pre_quant_scale must be positive and finite")
        self._buffers["_pre_quant_scale"] = t

    # -- switches -----------------------------------------------------------------------------------------
    def disable(self) -> None:
        self._attrs["enable"] = False

    def enable(self) -> None:
        self._attrs["enable"] = True

    def load_calib_amax(self, *args, strict: bool = True, **kwargs) -> None:
        """Set amax from the calibrator (``*args``/``**kwargs`` go to ``compute_amax``, e.g. ``"percentile"``)."""
        if self._dynamic:
            raise ValueError("a dynamic quantizer takes its amax from every input; it has nothing to load")
        amax = self._calibrator.compute_amax(*args, **kwargs)
        if amax is None:
            if strict:
                raise RuntimeError("the calibrator has seen no tensor; run data with enable_calib() first "
                                   "(strict=False keeps the current amax)")
            return
        self.amax = amax

    # -- forward ------------------------------------------------------------------------------------------
    def _blocks(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        """``x`` as rows of one static block each (last dimension zero-padded to a multiple of the block)."""
        bs = self._attrs["block_sizes"]
        axes = [k for k, v in bs.items() if isinstance(k, int) and v is not None]
        if len(axes) != 1 or axes[0] not in (-1, x.dim() - 1):
            raise ValueError(f"static block_sizes are supported along the last dimension only, got {bs}")
        b = bs[axes[0]]
        pad = (-x.shape[-1]) % b
        xp = F.pad(x, (0, pad)) if pad else x
        return xp.reshape(-1, b), (x.shape, pad)

    def _amax_for(self, x: torch.Tensor) -> torch.Tensor:
        amax = self._buffers.get("_amax")
        if amax is None:
            amax = reduce_amax(x, self._attrs["axis"] if not self.is_static_block_quant else (0,))
        return amax.to(x.device)

    def _fake(self, x: torch.Tensor) -> torch.Tensor:
        nb = self._attrs["num_bits"]
        dyn = self._dynamic_block
        if dyn is not None:
            block = dyn.get(-1) or dyn.get(x.dim() - 1)
            if block is None:
                raise ValueError(f"dynamic block_sizes need the last dimension's block size, got {dyn}")
            if tuple(dyn["scale_bits"]) == (8, 0):
                fmt = _MX.get(nb)
                if fmt is None:
                    raise ValueError(f"MX blocks take num_bits (4, 3), (5, 2), (2, 3), (3, 2), (2, 1) or 8, got {nb}")
                return mx_quantize_dequantize(x, fmt.with_block_size(block), ScaleCalculationMode.RCEIL)
            if nb != (2, 1):
                raise ValueError(f"e4m3 block scales (NVFP4) take num_bits (2, 1), got {nb}")
            amax = self._amax_for(x)
            if amax.numel() != 1:
                raise ValueError("NVFP4 blocks need one amax for the whole tensor (axis=None)")
            return nvfp4_quantize_dequantize(x, per_tensor_amax_to_scale(amax.reshape(())), block)
        amax = self._amax_for(x)
        if isinstance(nb, tuple):
            if x.requires_grad:  # pass_through_bwd=False: straight-through inside [-amax, amax]
                return _ClippedPassThrough.apply(x, amax, lambda v: fake_e4m3_quant_modelopt(v, amax))
            return fake_e4m3_quant_modelopt(x, amax)
        return fake_tensor_quant(x, amax, nb, self.unsigned, self.narrow_range)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if not isinstance(inputs, torch.Tensor):
            raise TypeError(f"a TensorQuantizer quantizes tensors, got {type(inputs).__name__}")
        if inputs.numel() == 0:
            return inputs
        x = inputs
        if self.pre_quant_scale is not None:  # applied even when disabled, as ModelOpt does
            x = x * self.pre_quant_scale
        if not self._attrs["enable"]:
            return x
        shape = None
        if self.is_static_block_quant:
            x, shape = self._blocks(x)
        out = x
        if self._if_calib and not self._dynamic:
            self._calibrator.collect(x)
        if self._if_quant:
            out = _PassThrough.apply(x.contiguous(), self._fake) if self._attrs["pass_through_bwd"] \
                else self._fake(x.contiguous())
        if shape is not None:
            full, pad = shape
            out = out.reshape(*full[:-1], full[-1] + pad)
            if pad:
                out = out[..., :full[-1]]
        return out

    # -- printing -----------------------------------------------------------------------------------------
    def _short_amax(self, fmt: str = ".2e") -> str:
        if self._dynamic_block is not None and self._dynamic_block.get("scale_bits") == (8, 0):
            return "None"
        return amax_summary(self.amax, fmt)

    def extra_repr(self) -> str:
        if not self._attrs["enable"]:
            return "disabled"
        s = f"{'unsigned ' if self.unsigned else ''}{self.num_bits} bit"
        s += " narrow" if self.narrow_range else ""
        s += " fake"
        if self.block_sizes is not None:
            s += f" block_sizes={self.block_sizes},"
        else:
            s += f" axis={self.axis}" if self.axis is not None else " per-tensor"
        s += f" amax={self._short_amax()}"
        if self.pre_quant_scale is not None:
            p = self.pre_quant_scale
            s += f" pre_quant_scale=[{p.min().item():.2e}, {p.max().item():.2e}]({p.numel()})"
        s += f" calibrator={type(self._calibrator).__name__}" if self._calibrator is not None else ""
        s += " quant" if self._if_quant else ""
        s += " calib" if self._if_calib else ""
        return s

    # -- state --------------------------------------------------------------------------------------------
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        for name in ("_amax", "_pre_quant_scale"):
            key = prefix + name
            if key in state_dict and name not in self._buffers:
                self.register_buffer(name, torch.empty_like(state_dict[key]))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


class SequentialQuantizer(nn.Sequential):
    """Quantizers applied one after the other (ModelOpt's, for ``cfg`` lists such as W4A8's int4 then fp8)."""

    def __init__(self, *quantizers: TensorQuantizer) -> None:
        if not all(isinstance(q, TensorQuantizer) for q in quantizers):
            raise TypeError("SequentialQuantizer takes TensorQuantizer modules")
        super().__init__(*quantizers)

    @property
    def is_enabled(self) -> bool:
        return any(q.is_enabled for q in self)

    def set_from_attribute_config(self, attributes: Iterable[Union[QuantizerAttributeConfig, Mapping]]) -> None:
        attributes = list(attributes)
        if len(attributes) != len(self):
            raise ValueError(f"{len(attributes)} attribute sets for {len(self)} quantizers")
        for q, a in zip(self, attributes):
            q.set_from_attribute_config(a)

    def disable(self) -> None:
        for q in self:
            q.disable()

    def enable(self) -> None:
        for q in self:
            q.enable()

