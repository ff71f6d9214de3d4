"""``quantize_`` configs for the block-scaled formats, torchao's ``torchao.prototype.mx_formats`` configs on the CPU.

* :class:`MXDynamicActivationMXWeightConfig`: MX weights (:class:`~quanta.dtypes.MXTensor`), activations quantized
  to the same MX format at every call.
* :class:`NVFP4WeightOnlyConfig`: NVFP4 weights (:class:`~quanta.dtypes.NVFP4Tensor`), float activations.
* :class:`NVFP4DynamicActivationNVFP4WeightConfig`: NVFP4 weights and activations; the activations' per-tensor
  scale computed at every call (``step=None``), or calibrated in two steps (``step="prepare"``, run data,
  ``step="convert"``), as torchao's observer flow.

Where torchao runs these on the CPU (MX with ``KernelPreference.EMULATED``, NVFP4 weight-only) quanta's outputs
are torchao's bit for bit (``tests/golden/test_torchao_mx.py``). torchao requires bfloat16 weights for MX and a
Blackwell GPU for NVFP4 activations; quanta takes float32, bfloat16 and float16 weights and runs everything on the
CPU.

>>> import torch
>>> from quanta.quantization import quantize_
>>> model = torch.nn.Sequential(torch.nn.Linear(64, 32))
>>> report = quantize_(model, NVFP4WeightOnlyConfig())
>>> type(model[0].weight).__name__, model(torch.randn(2, 64)).shape
('NVFP4Tensor', torch.Size([2, 32]))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

import torch
from torch import nn

from quanta.dtypes.block_scaled import KernelPreference
from quanta.dtypes.mx_tensor import MXTensor, QuantizeTensorToMXKwargs
from quanta.dtypes.nvfp4_tensor import NVFP4Tensor, QuantizeTensorToNVFP4Kwargs, per_tensor_amax_to_scale
from quanta.grids.block_scaled import ScaleCalculationMode, mx_format
from quanta.quantization.linear_like import is_conv1d
from quanta.quantization.observed import attach_observer, detach_observer
from quanta.quantization.quant_api import AOBaseConfig, CalibrationConfig, LayerNotQuantizable, QuantizeReport

__all__ = ["MXDynamicActivationMXWeightConfig", "NVFP4WeightOnlyConfig", "NVFP4DynamicActivationNVFP4WeightConfig"]

_FLOAT = (torch.float32, torch.bfloat16, torch.float16)


def _check_weight(weight: torch.Tensor, multiple: int, what: str, both_dims: bool, module: nn.Module) -> None:
    if is_conv1d(module):
        raise LayerNotQuantizable(f"{what} stores weights row-major [out, in] with blocks along the input "
                                  "features; transformers' Conv1D keeps its weight as [in, out] (use nn.Linear)")
    if weight.dim() != 2:
        raise LayerNotQuantizable(f"{what} quantizes 2-D weights, this one has shape {tuple(weight.shape)}")
    if weight.dtype not in _FLOAT:
        raise LayerNotQuantizable(f"{what} quantizes float32/bfloat16/float16 weights, not {weight.dtype}")
    dims = weight.shape if both_dims else weight.shape[1:]
    if any(d % multiple for d in dims):
        raise LayerNotQuantizable(f"{what} needs {'both dimensions' if both_dims else 'the input features'} "
                                  f"to be multiples of {multiple}, the weight has shape {tuple(weight.shape)}")


@dataclass
class MXDynamicActivationMXWeightConfig(AOBaseConfig):
    """MX weights and activations (torchao's fields and defaults).

    ``activation_dtype`` must equal ``weight_dtype`` (as in torchao): ``torch.float8_e4m3fn`` (MXFP8, default),
    ``torch.float8_e5m2``, ``"fp6_e2m3"``, ``"fp6_e3m2"``, ``torch.float4_e2m1fn_x2`` (MXFP4) or
    ``torch.int8`` (MXINT8, quanta only). ``kernel_preference`` is accepted; every choice runs quanta's CPU path.

    >>> cfg = MXDynamicActivationMXWeightConfig(activation_dtype=torch.float4_e2m1fn_x2,
    ...                                         weight_dtype=torch.float4_e2m1fn_x2)
    >>> cfg.scaling_mode
    <ScaleCalculationMode.RCEIL: 'rceil'>
    """

    block_size: int = 32
    activation_dtype: Union[torch.dtype, str] = torch.float8_e4m3fn
    weight_dtype: Union[torch.dtype, str] = torch.float8_e4m3fn
    kernel_preference: KernelPreference = KernelPreference.AUTO
    scaling_mode: ScaleCalculationMode = ScaleCalculationMode.RCEIL

    def __post_init__(self) -> None:
        if self.activation_dtype != self.weight_dtype:
            raise ValueError(f"activation_dtype ({self.activation_dtype}) must equal weight_dtype "
                             f"({self.weight_dtype}), as in torchao")
        mx_format(self.weight_dtype, self.block_size)
        if not isinstance(self.scaling_mode, ScaleCalculationMode):
            raise TypeError(f"scaling_mode must be a ScaleCalculationMode, got {self.scaling_mode!r}")

    def quantize_weight(self, weight, module):
        _check_weight(weight, self.block_size, "MXDynamicActivationMXWeightConfig", False, module)
        act = QuantizeTensorToMXKwargs(self.activation_dtype, self.block_size, self.scaling_mode,
                                       self.kernel_preference)
        return MXTensor.to_mx(weight, self.weight_dtype, self.block_size, self.scaling_mode,
                              self.kernel_preference, act)


@dataclass
class NVFP4WeightOnlyConfig(AOBaseConfig):
    """NVFP4 weights, float activations; ``use_dynamic_per_tensor_scale`` adds the weight's per-tensor scale."""

    use_dynamic_per_tensor_scale: bool = True

    def quantize_weight(self, weight, module):
        _check_weight(weight, 16, "NVFP4WeightOnlyConfig", True, module)
        scale = per_tensor_amax_to_scale(torch.max(torch.abs(weight))) if self.use_dynamic_per_tensor_scale else None
        return NVFP4Tensor.to_nvfp4(weight, per_tensor_scale=scale)


class _AmaxObserver:
    """The largest input magnitude a Linear layer has seen (torchao's ``NVFP4ObservedLinear.amax``)."""

    def __init__(self) -> None:
        self.amax = torch.tensor(0.0)

    def update(self, x: torch.Tensor) -> None:
        with torch.no_grad():
            self.amax = torch.maximum(self.amax.to(x.device), torch.max(torch.abs(x.detach())).float())


_OBSERVER = "_quanta_nvfp4_amax"


@dataclass
class NVFP4DynamicActivationNVFP4WeightConfig(CalibrationConfig):
    """NVFP4 weights and activations (torchao's fields).

    ``step=None``: the weight's per-tensor scale from its amax and the activations' from theirs at every call
    (``use_dynamic_per_tensor_scale``; False drops both per-tensor scales). ``step="prepare"`` then
    ``step="convert"``: the first attaches an amax observer to each selected Linear, the second sets the
    activations' per-tensor scale from what it saw (``act_per_tensor_scale``, static) and quantizes the weight
    with its own per-tensor scale; the blocks' scales stay dynamic. ``use_triton_kernel`` is accepted (no effect).

    >>> model = torch.nn.Sequential(torch.nn.Linear(32, 16))
    >>> from quanta.quantization import quantize_
    >>> _ = quantize_(model, NVFP4DynamicActivationNVFP4WeightConfig(step="prepare"))
    >>> _ = model(torch.randn(4, 32))
    >>> _ = quantize_(model, NVFP4DynamicActivationNVFP4WeightConfig(step="convert"))
    >>> model[0].weight.act_per_tensor_scale is not None
    True
    """

    use_triton_kernel: bool = True
    use_dynamic_per_tensor_scale: bool = True
    step: Optional[str] = None

    steps = ("prepare", "convert")

    def __post_init__(self) -> None:
        step = getattr(self.step, "value", self.step)  # torchao's QuantizationStep enum or its string
        if step not in (None, "prepare", "convert"):
            raise ValueError(f"step must be None, 'prepare' or 'convert', got {self.step!r}")
        self.step = step
        if step is not None:
            self.use_dynamic_per_tensor_scale = False

    @property
    def needs_calibration(self) -> bool:
        return self.step is not None

    def quantize_weight(self, weight, module):
        if self.step is not None:
            return super().quantize_weight(weight, module)
        _check_weight(weight, 16, "NVFP4DynamicActivationNVFP4WeightConfig", True, module)
        dynamic = self.use_dynamic_per_tensor_scale
        scale = per_tensor_amax_to_scale(torch.max(torch.abs(weight))) if dynamic else None
        act = QuantizeTensorToNVFP4Kwargs(use_triton_kernel=self.use_triton_kernel,
                                          use_dynamic_per_tensor_scale=dynamic)
        return NVFP4Tensor.to_nvfp4(weight, per_tensor_scale=scale, act_quant_kwargs=act)

    def apply(self, model: nn.Module, selected: list[tuple[str, nn.Module]], report: QuantizeReport):
        changes = []
        for fqn, module in selected:
            weight = getattr(module, "weight", None)
            try:
                if not isinstance(weight, torch.Tensor) or not isinstance(module, nn.Linear):
                    raise LayerNotQuantizable(f"{type(module).__name__} is not an nn.Linear")
                if self.step == "prepare":
                    _check_weight(weight, 16, "NVFP4DynamicActivationNVFP4WeightConfig", True, module)
                    obs = _AmaxObserver()
                    changes.append(lambda m=module, o=obs: attach_observer(m, _OBSERVER, o, o.update))
                    report.observed.append(fqn)
                    continue
                obs = module.__dict__.get(_OBSERVER)
                if obs is None:
                    raise LayerNotQuantizable("it has no observer: run step='prepare' and calibration data first")
                if not bool(obs[0].amax > 0):
                    raise LayerNotQuantizable("its observer saw no (nonzero) input: run calibration data through "
                                              "the model between the two steps")
                _check_weight(weight, 16, "NVFP4DynamicActivationNVFP4WeightConfig", True, module)
                act = QuantizeTensorToNVFP4Kwargs(use_triton_kernel=self.use_triton_kernel,
                                                  use_dynamic_per_tensor_scale=False)
                w = weight.detach()
                q = NVFP4Tensor.to_nvfp4(w, per_tensor_scale=per_tensor_amax_to_scale(torch.max(torch.abs(w))),
                                         act_per_tensor_scale=per_tensor_amax_to_scale(obs[0].amax),
                                         act_quant_kwargs=act)
                changes.append(lambda m=module, q=q: _install(m, q))
                report.quantized.append(fqn)
            except LayerNotQuantizable as e:
                report.skipped[fqn] = str(e)
        return changes


def _install(module: nn.Module, q: torch.Tensor) -> None:
    detach_observer(module, _OBSERVER)
    module.weight = nn.Parameter(q, requires_grad=False)
