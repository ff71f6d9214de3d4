"""``TensorQuantizer``: the TensorRT-style quantizer module (``pytorch_quantization.nn.TensorQuantizer``).

One module, four stages, each with a switch:

* ``disable()`` / ``enable()``: bypass the module entirely (returns its input);
* calibration (``enable_calib()`` / ``disable_calib()``): feed every input to the
  calibrator (``"max"`` → :class:`MaxCalibrator`, ``"histogram"`` →
  :class:`HistogramCalibrator`, ``"analyzer_*"`` → :class:`AnalyzerCalibrator`
  with quanta's encoding analyzers), then ``load_calib_amax(...)`` writes the
  result into the ``_amax`` buffer;
* clipping (``enable_clip()`` / ``disable_clip()``, needs ``learn_amax=True``):
  clamp to ``[clip_value_min, clip_value_max]`` of the :class:`Clip` submodule,
  whose bounds learn amax;
* quantization (``enable_quant()`` / ``disable_quant()``): fake quantization
  (``fake_tensor_quant``, or FP8 e4m3 for ``num_bits=(4, 3)``) or real
  quantization (integer codes as floats, ``fake_quant=False``).

amax comes from, in order: the learned clip bounds (``learn_amax``), the
``_amax`` buffer (descriptor ``amax``, ``load_calib_amax`` or the ``amax``
setter; per tensor or per axis), or else the input itself (dynamic amax, per
``axis``, ignoring NaN/inf), times ``scale_amax`` if given.

>>> from quanta.tensor_quant import QuantDescriptor
>>> q = TensorQuantizer(QuantDescriptor(num_bits=8, axis=0))
>>> q.disable_quant(); q.enable_calib()
>>> _ = q(torch.tensor([[1.0, -2.0], [0.5, 0.25]]))
>>> q.load_calib_amax()
>>> q.disable_calib(); q.enable_quant()
>>> q.amax
tensor([[2.0000],
        [0.5000]])
>>> q(torch.tensor([[1.0, -2.0], [0.5, 0.25]]))  # [-128, 127]: 1.0 * 63.5 = 63.5 rounds to 64
tensor([[ 1.0079, -2.0000],
        [ 0.5000,  0.2520]])

Deliberate differences from NVIDIA's module: real quantization honours
``narrow_range`` (NVIDIA's always uses the narrow range there); a quantizer with
``learn_amax=True`` and no initial amax raises a clear error when used instead
of learning from 1.0; ``load_calib_amax(strict=False)`` with an empty calibrator
leaves amax unchanged (NVIDIA sets NaN); loading a state dict with ``_amax`` into
a quantizer without one creates the buffer on the state dict's device (NVIDIA:
always CUDA); changing the amax shape through the setter is a ValueError
(NVIDIA: TypeError).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

from quanta.kernels.amax_quant import (
    E4M3_MAX,
    _check_flag,
    amax_scale,
    e4m3_quant,
    fake_e4m3_quant,
    fake_e4m3_quant_onnx,
    fake_tensor_quant,
    fake_tensor_quant_onnx,
    is_fp8,
    resolve_num_bits,
    tensor_quant,
)
from quanta.tensor_quant.axis import reduce_amax
from quanta.tensor_quant.calib import AnalyzerCalibrator, Calibrator, HistogramCalibrator, MaxCalibrator
from quanta.tensor_quant.clip import Clip
from quanta.tensor_quant.descriptor import CalibMethod, QuantDescriptor, ScaledQuantDescriptor

__all__ = ["TensorQuantizer", "StageSwitches", "amax_summary"]


def _amax_tensor(value: object) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        t = value.detach().to(torch.float32)
    else:
        if value is None or isinstance(value, (bool, str)):
            raise TypeError(f"amax must be a number, a list/array of numbers or a tensor, got {value!r}")
        t = torch.as_tensor(np.asarray(value, dtype=np.float32))
    if not bool(((t >= 0) & torch.isfinite(t)).all()):
        raise ValueError(f"amax must be finite and >= 0, got {t.tolist()}")
    return t.clone()


def amax_summary(amax: torch.Tensor | None, fmt: str) -> str:
    """``"dynamic"``, one value, or ``"[min, max](count)"``, numbers in ``fmt``: how quantizers print their amax."""
    if amax is None:
        return "dynamic"
    if amax.numel() == 1:
        return f"{amax.item():{fmt}}"
    return f"[{amax.min().item():{fmt}}, {amax.max().item():{fmt}}]({amax.numel()})"


class StageSwitches:
    """The quantization and calibration switches of TensorRT's and ModelOpt's quantizers (``_if_quant``,
    ``_if_calib``, a ``_calibrator``)."""

    _if_quant: bool
    _if_calib: bool

    def disable_quant(self) -> None:
        """Skip the quantization stage."""
        self._if_quant = False

    def enable_quant(self) -> None:
        """Run the quantization stage."""
        self._if_quant = True

    def disable_calib(self) -> None:
        """Stop feeding the calibrator."""
        self._if_calib = False

    def enable_calib(self) -> None:
        """Feed every input to the calibrator."""
        if self._calibrator is None:
            raise ValueError("Calibrator was not created, cannot enable calibration.")
        self._if_calib = True


class TensorQuantizer(StageSwitches, nn.Module):
    """Quantize a tensor as a :class:`ScaledQuantDescriptor` says (see the module docstring).

    Args:
        quant_desc: the descriptor. Default ``QuantDescriptor()`` (8 bits, per
            tensor, fake quant, ``narrow_range=False``).
        disabled: start bypassed.
        if_quant: run the quantization stage. Default True.
        if_clip: run the clip stage (needs ``learn_amax``; enabled automatically when the
            descriptor also gives an initial ``amax``).
        if_calib: run the calibration stage.
    """

    _version = 1
    #: pytorch_quantization's switch for ONNX export: fake quantization through torch's fake_quantize ops,
    #: which torch.onnx.export writes as QuantizeLinear/DequantizeLinear (see quanta.tensor_quant.onnx_export)
    use_fb_fake_quant: bool = False

    def __init__(self, quant_desc: ScaledQuantDescriptor = QuantDescriptor(), disabled: bool = False,
                 if_quant: bool = True, if_clip: bool = False, if_calib: bool = False) -> None:
        super().__init__()
        if not isinstance(quant_desc, ScaledQuantDescriptor):
            raise TypeError(f"quant_desc must be a QuantDescriptor, got {type(quant_desc).__name__}")
        self._num_bits = quant_desc.num_bits
        self._fake_quant = quant_desc.fake_quant
        self._axis = quant_desc.axis
        self._scale_amax = quant_desc.scale_amax
        self._learn_amax = quant_desc.learn_amax
        self._unsigned = quant_desc.unsigned
        self._narrow_range = quant_desc.narrow_range
        self._scale: torch.Tensor | None = None  # scale of the last dynamic-amax call
        self._disabled = _check_flag("disabled", disabled)
        self._if_quant = _check_flag("if_quant", if_quant)
        self._if_clip = False
        self._if_calib = _check_flag("if_calib", if_calib)
        if quant_desc.amax is not None:
            self.register_buffer("_amax", torch.tensor(quant_desc.amax))
        if self._learn_amax:
            init = float(quant_desc.amax.max()) if quant_desc.amax is not None else float("nan")
            self.clip = Clip(-init, init, learn_min=True, learn_max=True)
            if quant_desc.amax is not None:  # otherwise init_learn_amax() enables it
                self.enable_clip()
        if _check_flag("if_clip", if_clip):
            self.enable_clip()
        method = quant_desc.calib_method
        self._calibrator: Calibrator | None
        if method is CalibMethod.MAX:
            self._calibrator = MaxCalibrator(num_bits=self._num_bits, axis=self._axis, unsigned=self._unsigned)
        elif method is CalibMethod.HISTOGRAM:
            self._calibrator = HistogramCalibrator(num_bits=self._num_bits, axis=self._axis, unsigned=self._unsigned)
        else:
            self._calibrator = AnalyzerCalibrator(self._num_bits, self._axis, self._unsigned, method,
                                                  narrow_range=self._narrow_range)

    # -- properties ---------------------------------------------------------------------------------------
    @property
    def num_bits(self) -> int | tuple[int, int]:
        """Bits per code, or ``(4, 3)`` for FP8."""
        return self._num_bits

    @num_bits.setter
    def num_bits(self, value: int | tuple[int, int]) -> None:
        value = resolve_num_bits(value)
        if is_fp8(value) and (self._unsigned or self._narrow_range):
            raise ValueError("FP8 (4, 3) is signed and has no narrow range; set unsigned/narrow_range False first")
        self._num_bits = value
        if self._calibrator is not None:
            self._calibrator.num_bits = value

    @property
    def unsigned(self) -> bool:
        """Unsigned range ``[0, 2**num_bits - 1]``."""
        return self._unsigned

    @unsigned.setter
    def unsigned(self, value: bool) -> None:
        self._unsigned = _check_flag("unsigned", value)
        if self._calibrator is not None:
            self._calibrator.unsigned = self._unsigned

    @property
    def narrow_range(self) -> bool:
        """Symmetric signed range ``[-max_bound, max_bound]``."""
        return self._narrow_range

    @narrow_range.setter
    def narrow_range(self, value: bool) -> None:
        self._narrow_range = _check_flag("narrow_range", value)
        if isinstance(self._calibrator, AnalyzerCalibrator):
            self._calibrator.narrow_range = self._narrow_range

    @property
    def axis(self) -> int | tuple[int, ...] | None:
        """Kept dimension(s) of a per-axis amax, or None."""
        return self._axis

    @property
    def fake_quant(self) -> bool:
        """Fake (True) or real (False) quantization."""
        return self._fake_quant

    @property
    def learn_amax(self) -> bool:
        """Whether amax is learned through the clip stage."""
        return self._learn_amax

    @property
    def calibrator(self) -> Calibrator | None:
        """The calibrator fed in calibration mode.

        May be replaced by any :class:`Calibrator` (e.g. an
        :class:`AnalyzerCalibrator` with its own analyzer options); it must
        calibrate for this quantizer's ``num_bits``, ``axis`` and ``unsigned``.
        """
        return self._calibrator

    @calibrator.setter
    def calibrator(self, value: Calibrator) -> None:
        if not isinstance(value, Calibrator):
            raise TypeError(f"calibrator must be a Calibrator, got {type(value).__name__}")
        if (value.num_bits, value.axis, value.unsigned) != (self._num_bits, self._axis, self._unsigned):
            raise ValueError(
                f"calibrator is for num_bits={value.num_bits}, axis={value.axis}, unsigned={value.unsigned}; this "
                f"quantizer has num_bits={self._num_bits}, axis={self._axis}, unsigned={self._unsigned}"
            )
        if isinstance(value, AnalyzerCalibrator) and value.narrow_range != self._narrow_range:
            raise ValueError(f"calibrator has narrow_range={value.narrow_range}, the quantizer {self._narrow_range}")
        self._calibrator = value

    @property
    def maxbound(self) -> float:
        """``2**(num_bits - 1 + unsigned) - 1`` (448 for FP8)."""
        if is_fp8(self._num_bits):
            return E4M3_MAX
        return float(2 ** (self._num_bits - 1 + int(self._unsigned)) - 1)

    @property
    def amax(self) -> torch.Tensor | None:
        """The fixed/calibrated amax buffer, or None (dynamic amax)."""
        return self._buffers.get("_amax")

    @amax.setter
    def amax(self, value: object) -> None:
        if value is None:
            raise ValueError("setting amax to None is not supported; delete the quantizer's amax with "
                             "`del quantizer._amax` to return to dynamic amax")
        t = _amax_tensor(value)
        current = self._buffers.get("_amax")
        if current is None:
            self.register_buffer("_amax", t)
        elif current.shape != t.shape:
            raise ValueError(f"amax shape {tuple(current.shape)} cannot change to {tuple(t.shape)} through the "
                             "setter; use load_calib_amax() or a new quantizer")
        else:
            current.copy_(t)

    @property
    def step_size(self) -> torch.Tensor | None:
        """``amax / maxbound``, or None for dynamic amax."""
        amax = self.amax
        return None if amax is None else amax / self.maxbound

    @property
    def scale(self) -> torch.Tensor | None:
        """``maxbound / amax`` (1 where amax <= 2**-24) of the current amax; for dynamic amax, of the last call."""
        amax = self._learned_amax() if self._learn_amax else self.amax
        if amax is None or bool(torch.isnan(amax).any()):
            return self._scale
        return amax_scale(amax, self.maxbound, torch.float32)

    # -- switches -----------------------------------------------------------------------------------------
    def disable(self) -> None:
        """Bypass the module: forward returns its input."""
        self._disabled = True

    def enable(self) -> None:
        """Undo :meth:`disable`."""
        self._disabled = False

    def disable_clip(self) -> None:
        """Stop the clip stage and freeze the learned bounds."""
        self._if_clip = False
        if hasattr(self, "clip"):
            self.clip.clip_value_min.requires_grad_(False)
            self.clip.clip_value_max.requires_grad_(False)

    def enable_clip(self) -> None:
        """Run the clip stage and learn its bounds (needs ``learn_amax=True``)."""
        if not self._learn_amax:
            raise ValueError("learn_amax is False. Cannot enable clip: build the quantizer from a "
                             "QuantDescriptor(learn_amax=True, amax=...)")
        self.clip.clip_value_min.requires_grad_(True)
        self.clip.clip_value_max.requires_grad_(True)
        self._if_clip = True

    # -- calibration --------------------------------------------------------------------------------------
    def load_calib_amax(self, *args, strict: bool = True, **kwargs) -> None:
        """Compute amax with the calibrator (``*args``/``**kwargs`` go to its ``compute_amax``) and store it.

        Creates or replaces the ``_amax`` buffer. If the calibrator has seen no
        data: RuntimeError, or with ``strict=False`` a warning and amax unchanged.
        """
        if self._calibrator is None:
            raise RuntimeError("Calibrator not created.")
        amax = self._calibrator.compute_amax(*args, **kwargs)
        if amax is None:
            msg = (f"{type(self._calibrator).__name__} returned None: it has not seen any tensor. Run forward "
                   "passes after enable_calib() (usually with disable_quant()) first")
            if strict:
                raise RuntimeError(msg + "; pass strict=False to leave amax unchanged")
            warnings.warn(msg + "; amax is unchanged", RuntimeWarning, stacklevel=2)
            return
        current = self._buffers.get("_amax")
        device = current.device if current is not None else amax.device
        amax = _amax_tensor(amax).to(device)
        if current is not None and current.shape == amax.shape:
            current.copy_(amax)
        else:
            self.register_buffer("_amax", amax)

    def init_learn_amax(self) -> None:
        """Initialise the learned clip bounds ``-+amax`` from the ``_amax`` buffer (its max if per axis).

        Also enables the clip stage (a quantizer built with ``learn_amax=True``
        but without an ``amax`` starts with it disabled, so it can calibrate first).
        """
        if not self._learn_amax:
            raise RuntimeError("Called init_learn_amax with learn_amax=False.")
        amax = self.amax
        if amax is None:
            raise RuntimeError("init_learn_amax needs an amax: calibrate and call load_calib_amax() first, "
                               "or set quantizer.amax")
        init = amax.max().detach()
        with torch.no_grad():
            self.clip.clip_value_min.copy_(-init)
            self.clip.clip_value_max.copy_(init)
        self.enable_clip()

    # -- forward ------------------------------------------------------------------------------------------
    def _learned_amax(self) -> torch.Tensor:
        return torch.maximum(-self.clip.clip_value_min, self.clip.clip_value_max).detach()

    def _check_learned(self) -> None:
        if bool(torch.isnan(self.clip.clip_value_min) | torch.isnan(self.clip.clip_value_max)):
            raise RuntimeError(
                "learn_amax=True but the learned amax is not initialised: give QuantDescriptor(amax=...), or "
                "calibrate, call load_calib_amax() and then init_learn_amax()"
            )

    def _get_amax(self, inputs: torch.Tensor) -> torch.Tensor:
        amax = self._buffers.get("_amax")
        dynamic = amax is None
        if dynamic:
            amax = reduce_amax(inputs, self._axis)
        if self._scale_amax is not None:
            amax = amax.detach() * self._scale_amax
        return amax.detach()

    def _single_axis(self, inputs: torch.Tensor) -> int | None:
        """The one kept axis (torch's per-channel fake quantization, and ONNX, take one), or None per tensor."""
        axis = self._axis
        if axis is None:
            return None
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        if len(axes) != 1:
            raise ValueError(f"use_fb_fake_quant (ONNX export) needs per-tensor or one-axis amax, got axis {axis}")
        return axes[0] % inputs.dim()

    def _quant_forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self._learn_amax:
            self._check_learned()
            inputs = self.clip(inputs)
            amax = self._learned_amax()
        else:
            amax = self._get_amax(inputs)
        fp8 = is_fp8(self._num_bits)
        if self._fake_quant and type(self).use_fb_fake_quant:
            if fp8:
                return fake_e4m3_quant_onnx(inputs, amax, self._single_axis(inputs))
            return fake_tensor_quant_onnx(inputs, amax, self._single_axis(inputs), self._num_bits, self._unsigned,
                                          self._narrow_range)
        if self._fake_quant:
            outputs = fake_e4m3_quant(inputs, amax) if fp8 else \
                fake_tensor_quant(inputs, amax, self._num_bits, self._unsigned, self._narrow_range)
            scale = None
        elif fp8:
            outputs, scale = e4m3_quant(inputs, amax)
        else:
            outputs, scale = tensor_quant(inputs, amax, self._num_bits, self._unsigned, self._narrow_range)
        if self.amax is None and not self._learn_amax:
            self._scale = (scale if scale is not None else amax_scale(amax, self.maxbound)).detach().float()
        return outputs

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Calibrate, clip and/or quantize ``inputs`` as the switches say."""
        if self._disabled:
            return inputs
        if not isinstance(inputs, torch.Tensor):
            raise TypeError(f"inputs must be a tensor (TensorQuantizer expects a tensor), got {type(inputs).__name__}")
        outputs = inputs
        if self._if_calib:
            if self._calibrator is None:
                raise RuntimeError("Calibrator was not created.")
            self._calibrator.collect(inputs)
        if self._if_quant:
            outputs = self._quant_forward(inputs)  # clips first when learning amax
        elif self._if_clip:
            self._check_learned()
            outputs = self.clip(inputs)
        return outputs

    # -- state ----------------------------------------------------------------------------------------------
    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        key = prefix + "_amax"
        if key in state_dict and "_amax" not in self._buffers:
            src = state_dict[key]
            self.register_buffer("_amax", torch.empty(src.shape, dtype=torch.float32, device=src.device))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _short_amax(self) -> str:
        return amax_summary(self.amax, ".4f")

    def extra_repr(self) -> str:
        if self._disabled:
            return "disabled"
        bits = "fp8 e4m3" if is_fp8(self._num_bits) else f"{'unsigned ' if self._unsigned else ''}{self._num_bits}bit"
        s = bits
        s += " narrow" if self._narrow_range else ""
        s += " fake" if self._fake_quant else " real"
        s += f" axis={self._axis}" if self._axis is not None else " per-tensor"
        s += f" amax={self._short_amax()}"
        s += f" *{self._scale_amax}" if self._scale_amax is not None else ""
        s += " learned" if self._learn_amax else ""
        s += f" calibrator={type(self._calibrator).__name__}" if self._calibrator is not None else ""
        s += " quant" if self._if_quant else ""
        s += " clip" if self._if_clip else ""
        s += " calib" if self._if_calib else ""
        return s
