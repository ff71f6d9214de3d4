"""``quantize_(model, config)``: replace weights by real quantized storage (torchao's API).

Each config turns a module's float ``weight`` into an
:class:`~quanta.dtypes.AffineQuantizedTensor` (or, for dynamic activation
quantization, a :class:`~quanta.dtypes.LinearActivationQuantizedTensor`), in
place. The module keeps running with ordinary ``F.linear``/``F.embedding``
calls; the tensor's own operations pick the fast CPU kernel:

=========================================  =======================================================
config                                     storage and kernel
=========================================  =======================================================
``Int8WeightOnlyConfig()``                 int8 per row; ``torch._weight_int8pack_mm`` (bf16)
``Int4WeightOnlyConfig(group_size=128)``   uint4, groups of 128, Int4CPULayout; ``_weight_int4pack_mm_for_cpu``
``Int8DynamicActivationInt8WeightConfig``  int8 per row + int8 per-token activations; ``torch._int_mm``
``Float8WeightOnlyConfig()``               float8_e4m3fn per row; dequantized tile by tile
``IntxWeightOnlyConfig(torch.int4, ...)``  1–8-bit codes, packed below 8 bits; dequantized tile by tile
``FPXWeightOnlyConfig(3, 2)``              packed fp6 (any ebits/mbits) per row; dequantized tile by tile
=========================================  =======================================================

Calibration configs (``GPTQConfig``, ``AWQConfig``, ``SmoothQuantConfig``:
:class:`CalibrationConfig`) run in two steps around calibration data, or block by
block with :func:`~quanta.quantization.sequential.quantize_sequential`.

A layer the config cannot take (wrong shape, a group size that does not divide
it, a kernel constraint) is never skipped silently: it stays in float and is
listed in the returned :class:`QuantizeReport` and in a warning
(``strict=True`` raises instead, before changing anything).

>>> import torch
>>> from quanta.quantization import quantize_, Int8WeightOnlyConfig
>>> model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
>>> report = quantize_(model, Int8WeightOnlyConfig())
>>> report.quantized
['0', '2']
>>> type(model[0].weight).__name__, model(torch.randn(2, 64)).shape
('AffineQuantizedTensor', torch.Size([2, 8]))
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Optional

import torch
from torch import nn

from quanta.dtypes import (
    AffineQuantizedTensor,
    Float8Layout,
    FloatxTensorCoreLayout,
    Int4CPULayout,
    Layout,
    PlainLayout,
    UintxLayout,
)
from quanta.dtypes.activation_scale import WeightTensorWithLinearActivationScaleMetadata
from quanta.dtypes.block_scaled import BlockScaledTensor
from quanta.dtypes.layouts import SUB_BYTE_DTYPES
from quanta.dtypes.linear_activation import LinearActivationQuantizedTensor, check_int8_dynamic_weight
from quanta.kernels.int_linear import check_int4_cpu_shape
from quanta.quantization.granularity import Granularity, PerAxis, PerRow, block_size_for
from quanta.quantization.linear_like import is_conv1d, is_linear_like, linear_weight, stored_weight
from quanta.quantization.quant_primitives import MappingType, ZeroPointDomain

__all__ = [
    "quantize_",
    "QuantizeReport",
    "AOBaseConfig",
    "Int8WeightOnlyConfig",
    "Int4WeightOnlyConfig",
    "Int8DynamicActivationInt8WeightConfig",
    "Float8WeightOnlyConfig",
    "IntxWeightOnlyConfig",
    "FPXWeightOnlyConfig",
    "ModuleFqnToConfig",
    "CalibrationConfig",
    "LayerNotQuantizable",
]


class LayerNotQuantizable(ValueError):
    """A config cannot quantize a layer; the message says why."""


class AOBaseConfig:
    """Base class of ``quantize_`` configs: ``quantize_weight`` maps a float weight to its quantized form."""

    def quantize_weight(self, weight: torch.Tensor, module: nn.Module) -> torch.Tensor:
        raise NotImplementedError

    def describe(self) -> str:
        return type(self).__name__


def _weight_2d(weight: torch.Tensor, what: str) -> None:
    if weight.dim() != 2:
        raise LayerNotQuantizable(f"{what} quantizes 2-D weights, this one has shape {tuple(weight.shape)}")


def _group_divides(k: int, group_size: int) -> None:
    if k % group_size:
        raise LayerNotQuantizable(f"group_size {group_size} does not divide the {k} input features")


@dataclass
class Int8WeightOnlyConfig(AOBaseConfig):
    """int8 symmetric weights, one scale per output row (or per ``group_size`` inputs).

    Per-row weights run through ``torch._weight_int8pack_mm`` with bf16
    activations; grouped weights are dequantized tile by tile.
    ``set_inductor_config``/``version`` are accepted for torchao compatibility.
    """

    group_size: Optional[int] = None
    granularity: Granularity = field(default_factory=PerRow)
    set_inductor_config: bool = True
    version: int = 1

    def quantize_weight(self, weight, module):
        k = weight.shape[-1]
        if self.group_size is not None:
            _group_divides(k, self.group_size)
            block = (1,) * (weight.dim() - 1) + (self.group_size,)
        else:
            block = _block(self.granularity, weight)
        return AffineQuantizedTensor.from_hp_to_intx(weight, MappingType.SYMMETRIC, block, torch.int8,
                                                     eps=torch.finfo(torch.float32).eps, zero_point_dtype=torch.int64)


def _block(granularity: Granularity, weight: torch.Tensor) -> tuple[int, ...]:
    try:
        return block_size_for(granularity, weight.shape)
    except ValueError as e:
        raise LayerNotQuantizable(str(e)) from None


@dataclass
class Int4WeightOnlyConfig(AOBaseConfig):
    """uint4 asymmetric weights in groups of ``group_size`` along the input features (tinygemm numerics).

    ``w = (q - 8) * s + zp`` with a float zero point per group (``ZeroPointDomain.FLOAT``),
    range not widened to include 0. The default ``Int4CPULayout`` runs through
    ``_weight_int4pack_mm_for_cpu`` (bf16 activations); ``UintxLayout(torch.uint4)``
    stores the same codes packed two per byte and dequantizes tile by tile.
    ``use_hqq=True`` optimises the zero points (half-quadratic quantization).
    """

    group_size: int = 128
    layout: Layout = field(default_factory=Int4CPULayout)
    use_hqq: bool = False
    zero_point_domain: Optional[ZeroPointDomain] = None
    set_inductor_config: bool = True
    preserve_zero: Optional[bool] = None

    def quantize_weight(self, weight, module):
        _weight_2d(weight, "Int4WeightOnlyConfig")
        _group_divides(weight.shape[1], self.group_size)
        domain = ZeroPointDomain.FLOAT if self.zero_point_domain is None else self.zero_point_domain
        if isinstance(self.layout, Int4CPULayout):
            if domain is not ZeroPointDomain.FLOAT:
                raise ValueError(f"Int4CPULayout needs zero_point_domain=ZeroPointDomain.FLOAT, got {domain}")
            try:
                check_int4_cpu_shape(*weight.shape, self.group_size)
            except ValueError as e:
                raise LayerNotQuantizable(str(e)) from None
        preserve_zero = domain is not ZeroPointDomain.FLOAT if self.preserve_zero is None else self.preserve_zero
        target = torch.uint4 if isinstance(self.layout, UintxLayout) else torch.int32
        return AffineQuantizedTensor.from_hp_to_intx(
            weight, MappingType.ASYMMETRIC, (1, self.group_size), target, 0, 15, eps=1e-6,
            zero_point_dtype=weight.dtype if domain is ZeroPointDomain.FLOAT else torch.int32,
            preserve_zero=preserve_zero, zero_point_domain=domain, _layout=self.layout, use_hqq=self.use_hqq)


@dataclass
class Int8DynamicActivationInt8WeightConfig(AOBaseConfig):
    """int8 per-row symmetric weights and int8 per-token activations quantized at each call (``torch._int_mm``).

    ``act_mapping_type`` SYMMETRIC (default: codes [-127, 127], eps 1e-5) or
    ASYMMETRIC (a zero point per token; the weight's column sums are
    precomputed once for it). Linear layers only.
    """

    layout: Layout = field(default_factory=PlainLayout)
    act_mapping_type: MappingType = MappingType.SYMMETRIC
    weight_only_decode: bool = False
    granularity: Granularity = field(default_factory=PerRow)
    set_inductor_config: bool = True

    def quantize_weight(self, weight, module):
        if not is_linear_like(module):
            raise LayerNotQuantizable(f"dynamic activation quantization applies to nn.Linear (and Conv1D), not "
                                      f"{type(module).__name__}")
        _weight_2d(weight, "Int8DynamicActivationInt8WeightConfig")
        if not isinstance(self.granularity, (PerRow, PerAxis)) or block_size_for(self.granularity, weight.shape) != (
                1, weight.shape[1]):
            raise ValueError(f"Int8DynamicActivationInt8WeightConfig supports per-row weights, got {self.granularity}")
        if self.act_mapping_type not in (MappingType.SYMMETRIC, MappingType.ASYMMETRIC):
            raise ValueError(f"act_mapping_type must be MappingType.SYMMETRIC or ASYMMETRIC, got "
                             f"{self.act_mapping_type!r}")
        w = AffineQuantizedTensor.from_hp_to_intx(weight, MappingType.SYMMETRIC, (1, weight.shape[1]), torch.int8,
                                                  eps=torch.finfo(torch.float32).eps, zero_point_dtype=torch.int64)
        check_int8_dynamic_weight(w)
        return LinearActivationQuantizedTensor(w, self.act_mapping_type)


@dataclass
class Float8WeightOnlyConfig(AOBaseConfig):
    """float8 weights (default ``float8_e4m3fn``), one scale ``amax / finfo.max`` per output row."""

    weight_dtype: torch.dtype = torch.float8_e4m3fn
    set_inductor_config: bool = True

    def quantize_weight(self, weight, module):
        _weight_2d(weight, "Float8WeightOnlyConfig")
        return AffineQuantizedTensor.from_hp_to_floatx(weight, (1, weight.shape[1]), self.weight_dtype,
                                                       Float8Layout())


_INTX_DTYPES = tuple(SUB_BYTE_DTYPES) + (torch.int8, torch.uint8)


@dataclass
class IntxWeightOnlyConfig(AOBaseConfig):
    """1–8-bit integer weights at any granularity (default int8 per output row, symmetric).

    ``layout=None`` stores codes below 8 bits packed (``UintxLayout(weight_dtype)``)
    and 8-bit codes plain. Unsigned ``weight_dtype`` (``torch.uint4``...) needs
    ``MappingType.ASYMMETRIC``.
    """

    weight_dtype: torch.dtype = torch.int8
    granularity: Granularity = field(default_factory=lambda: PerAxis(0))
    mapping_type: MappingType = MappingType.SYMMETRIC
    scale_dtype: Optional[torch.dtype] = None
    layout: Optional[Layout] = None

    def __post_init__(self) -> None:
        if self.weight_dtype not in _INTX_DTYPES:
            raise ValueError(f"weight_dtype must be one of torch.int1..int8 or torch.uint1..uint8, "
                             f"got {self.weight_dtype}")

    def quantize_weight(self, weight, module):
        block = _block(self.granularity, weight)
        layout = self.layout
        if layout is None:
            layout = UintxLayout(self.weight_dtype) if self.weight_dtype in SUB_BYTE_DTYPES else PlainLayout()
        return AffineQuantizedTensor.from_hp_to_intx(weight, self.mapping_type, block, self.weight_dtype,
                                                     scale_dtype=self.scale_dtype, _layout=layout)


@dataclass
class FPXWeightOnlyConfig(AOBaseConfig):
    """Floating-point weights with ``ebits`` exponent and ``mbits`` mantissa bits (fp6 = ``FPXWeightOnlyConfig(3, 2)``).

    Codes are packed densely (``1 + ebits + mbits`` bits each), one scale per
    output row; no inf/NaN codes, values saturate at the largest normal.
    """

    ebits: int
    mbits: int
    set_inductor_config: bool = True

    def __post_init__(self) -> None:
        FloatxTensorCoreLayout(self.ebits, self.mbits)  # validates

    def quantize_weight(self, weight, module):
        _weight_2d(weight, "FPXWeightOnlyConfig")
        return AffineQuantizedTensor.from_hp_to_fpx(weight, FloatxTensorCoreLayout(self.ebits, self.mbits))


@dataclass
class ModuleFqnToConfig(AOBaseConfig):
    """A config per module name; ``"_default"`` applies to the modules the filter selects, ``None`` skips."""

    module_fqn_to_config: dict[str, Optional[AOBaseConfig]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, cfg in self.module_fqn_to_config.items():
            if cfg is not None and not isinstance(cfg, AOBaseConfig):
                raise TypeError(f"module_fqn_to_config[{name!r}] must be a config or None, got {cfg!r}")


class CalibrationConfig(AOBaseConfig):
    """A config that needs calibration data (GPTQ, AWQ, SmoothQuant): ``quantize_`` runs it in two steps.

    The first step (``step="observe"``/``"prepare"``) attaches observers to the
    selected modules and changes no weight; the user then runs calibration data
    through the model; the second (``step="convert"``) quantizes from what the
    observers saw and removes them. Subclasses name their two steps in ``steps``
    and implement :meth:`apply`.
    """

    steps: ClassVar[tuple[str, str]] = ("observe", "convert")

    @property
    def needs_calibration(self) -> bool:
        """Whether ``quantize_`` runs this config's two steps (a config may also have a one-step form)."""
        return True

    def apply(self, model: nn.Module, selected: list[tuple[str, nn.Module]], report: "QuantizeReport"
              ) -> list[Callable[[], None]]:
        """Plan this config's step on ``selected`` ``(fqn, module)`` pairs of ``model``, filling ``report``.

        Returns the changes to make (attach an observer, install a weight...), run
        by ``quantize_`` only once every layer has been planned, so that
        ``strict=True`` can refuse before anything changes.
        """
        raise NotImplementedError

    def quantize_weight(self, weight: torch.Tensor, module: nn.Module) -> torch.Tensor:
        raise TypeError(f"{type(self).__name__} quantizes from calibration data: use quantize_(model, config) "
                        "in its two steps")


@dataclass
class QuantizeReport:
    """What ``quantize_`` did.

    ``quantized``: module names whose weight is now quantized; ``skipped``: names kept in float, with the
    reason; ``observed``: names given observers by a calibration config's first step; ``output_mse``: for
    calibration configs, ``(round_to_nearest, algorithm)`` output MSE of each layer on its calibration
    inputs; ``notes``: what an algorithm adjusted on a layer (damping raised, dead inputs, ...);
    ``scale_folded_into``: for SmoothQuant and AWQ, the op each layer's input scale was folded into, or None
    where it stays in the weight (:class:`~quanta.dtypes.WeightTensorWithLinearActivationScaleMetadata`).
    """

    quantized: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    observed: list[str] = field(default_factory=list)
    output_mse: dict[str, tuple[float, float]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)
    scale_folded_into: dict[str, Optional[str]] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"observed {len(self.observed)} layer(s)"] if self.observed else []
        lines += [f"quantized {len(self.quantized)} layer(s)"]
        for name, (rtn, algo) in self.output_mse.items():
            gain = f"{10 * math.log10(rtn / algo):+.1f} dB" if rtn > 0 and algo > 0 else "n/a"
            lines.append(f"  {name}: output MSE {algo:.4g} (round-to-nearest {rtn:.4g}, {gain})")
        lines += [f"  {name}: input scale " + (f"folded into {into}" if into else "kept in the weight")
                  for name, into in self.scale_folded_into.items()]
        lines += [f"  {name}: {note}" for name, ns in self.notes.items() for note in ns]
        lines += [f"kept in float: {name or '<root>'}: {why}" for name, why in self.skipped.items()]
        return "\n".join(lines)


def _is_linear(module: nn.Module, fqn: str) -> bool:
    return is_linear_like(module)


def quantize_(model: nn.Module, config: AOBaseConfig, filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
              device: Optional[torch.device | str] = None, *, strict: bool = False) -> QuantizeReport:
    """Quantize the weights of ``model``'s selected modules in place.

    Args:
        model: the model; modified in place.
        config: one of the configs above, :class:`ModuleFqnToConfig`, or a :class:`CalibrationConfig`
            (``GPTQConfig``, ``AWQConfig``, ``SmoothQuantConfig``) at one of its two steps.
        filter_fn: ``filter_fn(module, fqn) -> bool`` selects modules (default: ``nn.Linear``, and
            transformers' ``Conv1D``, whose transposed weight is quantized as ``[out, in]``).
            With ``ModuleFqnToConfig``, modules named in the mapping are selected too.
        device: move each selected module there before quantizing.
        strict: raise ``ValueError`` (changing nothing) if any selected layer cannot be quantized,
            instead of keeping it in float with a warning.

    Returns:
        a :class:`QuantizeReport`.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(config, AOBaseConfig):
        raise TypeError(f"config must be a quanta.quantization config (e.g. Int8WeightOnlyConfig()), got {config!r}")
    if isinstance(config, CalibrationConfig) and config.needs_calibration:
        return _quantize_calibrated(model, config, filter_fn, device, strict)
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"filter_fn must be callable (module, fqn) -> bool, got {filter_fn!r}")
    select = filter_fn or _is_linear
    by_name = config.module_fqn_to_config if isinstance(config, ModuleFqnToConfig) else None
    if by_name is not None:
        names = dict(model.named_modules())
        unknown = [n for n in by_name if n != "_default" and n not in names]
        if unknown:
            raise ValueError(f"ModuleFqnToConfig names modules the model does not have: {unknown}")

    report = QuantizeReport()
    plan: list[tuple[nn.Module, torch.Tensor]] = []
    for fqn, module in model.named_modules():
        if by_name is not None:
            if fqn in by_name:
                cfg = by_name[fqn]
            elif select(module, fqn):
                cfg = by_name.get("_default")
            else:
                continue
            if cfg is None:
                continue
        elif select(module, fqn):
            cfg = config
        else:
            continue
        weight = getattr(module, "weight", None)
        try:
            if not isinstance(weight, torch.Tensor):
                raise LayerNotQuantizable(f"{type(module).__name__} has no weight tensor")
            if isinstance(weight, (AffineQuantizedTensor, LinearActivationQuantizedTensor,
                                   WeightTensorWithLinearActivationScaleMetadata, BlockScaledTensor)):
                raise LayerNotQuantizable("its weight is already quantized")
            if weight.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
                raise LayerNotQuantizable(f"its weight has dtype {weight.dtype}, not a float dtype")
            if device is not None:
                module.to(device)
                weight = module.weight
            if is_conv1d(module):
                plan.append((module, stored_weight(module, cfg.quantize_weight(linear_weight(module), module))))
            else:
                plan.append((module, cfg.quantize_weight(weight.detach(), module)))
            report.quantized.append(fqn)
        except LayerNotQuantizable as e:
            report.skipped[fqn] = str(e)
    _warn_skipped(config, report, strict)
    _install(plan)
    return report


def _install(plan: list[tuple[nn.Module, torch.Tensor]]) -> None:
    for module, qweight in plan:
        module.weight = nn.Parameter(qweight, requires_grad=False)


def _warn_skipped(config: AOBaseConfig, report: QuantizeReport, strict: bool, stacklevel: int = 3) -> None:
    if not report.skipped:
        return
    if strict:
        raise ValueError(f"quantize_ with {config.describe()} cannot quantize every selected layer:\n{report}")
    warnings.warn(f"quantize_ with {config.describe()}: {len(report.skipped)} selected layer(s) kept in float: "
                  + "; ".join(f"{n or '<root>'} ({why})" for n, why in report.skipped.items()), stacklevel=stacklevel)


def _quantize_calibrated(model: nn.Module, config: CalibrationConfig, filter_fn, device, strict: bool
                         ) -> QuantizeReport:
    select = filter_fn or _is_linear
    selected = []
    for fqn, module in model.named_modules():
        if select(module, fqn):
            if device is not None:
                module.to(device)
            selected.append((fqn, module))
    report = QuantizeReport()
    changes = config.apply(model, selected, report)
    _warn_skipped(config, report, strict, stacklevel=4)
    for change in changes:
        change()
    return report
