"""Building the quantized model: quantized modules in place of float ones (and back), and quantizer objects,
built from :mod:`quanta.quantsim.placement`'s specs, in their slots (and folded into the parameters).

A spec leaves the bitwidth and data type to the sim's defaults (:class:`QuantizerDefaults`); the quantizer is

* an integer :class:`~quanta.quantization.affine.QuantizeDequantize` (``strict_symmetric``: the grid
  ``[-(2^(b-1)-1), 2^(b-1)-1]``), or a :class:`~quanta.quantization.float.FloatQuantizeDequantize`
  (8 bits: float8 e4m3fn, 16 bits: float16);
* per tensor, or for a parameter per output channel (``per_channel``) or per block of ``block_size``
  input channels of each output channel;
* calibrated by the scheme's encoding analyzer; a range-learning scheme makes its range trainable.

>>> import torch
>>> from quanta.quantsim.config import QuantizerSpec
>>> from quanta.quantsim.placement import Kind, Placed
>>> from quanta.quantsim.scheme import QuantScheme
>>> defaults = QuantizerDefaults(8, 4, DataType.INT, QuantScheme.MIN_MAX, QuantScheme.MIN_MAX)
>>> spec = QuantizerSpec(enabled=True, bitwidth=None, symmetric=True, dtype=None, block_size=16)
>>> q = build_quantizer(Placed(spec, Kind.PARAMETER), defaults, *param_layout(spec, torch.zeros(8, 64), 0, "w"))
>>> q.shape, q.block_size, (q.grid.qmin, q.grid.qmax)
((8, 4), (1, 16), (-8, 7))
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from quanta.nn import QuantizationMixin
from quanta.nn.base import _parametrized_names, remove_parametrization
from quanta.nn.registry import quantized_class_for
from quanta.kernels.qparams import calibrated_range
from quanta.quantization.affine import GroupedBlockQuantizeDequantize, QuantizeDequantize
from quanta.quantization.base import QuantizerBase
from quanta.quantization.encoding_analyzer import MinMaxEncodingAnalyzer
from quanta.quantization.float import BlockScaledQuantizeDequantize, FloatQuantizeDequantize
from quanta.quantsim.capture import CaptureMethod
from quanta.quantsim.config import DataType, QuantizerSpec
from quanta.quantsim.placement import Kind, ModulePlacement, Placed, Shared
from quanta.quantsim.preparer import _PASSTHROUGH_MODULES
from quanta.quantsim.scheme import QuantScheme

__all__ = [
    "QuantizerDefaults",
    "build_quantizer",
    "fold_params",
    "install",
    "param_layout",
    "quantize_modules",
    "quantized_modules",
    "restore_float_modules",
]


# ---------------------------------------------------------------------- modules
def quantize_modules(model: nn.Module, method: CaptureMethod, prefix: str = "") -> list[str]:
    """Replace, in place, every submodule of ``model`` that has a quantized counterpart by it (sharing its
    parameters); return the names of the leaf modules that have none (kept in float). ``method`` is how
    ``model`` was captured: the containers torch.export makes are walked into."""
    kept: list[str] = []
    for name, child in list(model.named_children()):
        full = f"{prefix}{name}"
        if isinstance(child, QuantizationMixin):
            continue
        if quantized_class_for(child) is not None:
            setattr(model, name, quantized_class_for(child).from_module(child))  # type: ignore[union-attr]
        elif isinstance(child, _PASSTHROUGH_MODULES):
            continue
        elif type(child) is nn.Module and method is CaptureMethod.EXPORT:
            kept += quantize_modules(child, method, full + ".")  # a container torch.export made (parameters
            # read by graph ops are listed through direct_params)
        elif next(child.children(), None) is None:
            kept.append(full)
        else:
            kept += quantize_modules(child, method, full + ".")
    return kept


def restore_float_modules(model: nn.Module) -> nn.Module:
    """:func:`quantize_modules` undone, in place: every quantized module turned back into its float module
    (quantizers dropped); returns ``model``, or its float module if ``model`` itself is a quantized one."""
    if isinstance(model, QuantizationMixin):
        return model.to_float_module()

    def restore(module: nn.Module) -> None:
        for name, child in list(module.named_children()):
            if isinstance(child, QuantizationMixin):
                setattr(module, name, child.to_float_module())
            else:
                restore(child)

    restore(model)
    return model


def quantized_modules(model: nn.Module) -> Iterator[tuple[str, QuantizationMixin]]:
    """``(name, module)`` for every quantized module of ``model`` not inside another one."""
    def walk(module: nn.Module, prefix: str) -> Iterator[tuple[str, QuantizationMixin]]:
        for name, child in module.named_children():
            if isinstance(child, QuantizationMixin):
                yield prefix + name, child
            else:
                yield from walk(child, f"{prefix}{name}.")
    yield from walk(model, "")


# ---------------------------------------------------------------------- quantizers
@dataclass(frozen=True)
class QuantizerDefaults:
    """What the sim fills in where a spec leaves it open (QuantizationSimModel's arguments)."""

    output_bw: int  #: bitwidth of activation quantizers
    param_bw: int  #: bitwidth of parameter quantizers
    data_type: DataType
    quant_scheme: QuantScheme  #: calibrates activations
    param_quant_scheme: QuantScheme  #: calibrates parameters
    percentile: float = 99.99  #: for the percentile scheme


def build_quantizer(placed: Placed, defaults: QuantizerDefaults, shape: tuple[int, ...] = (),
                    block_size: tuple[int, ...] | None = None) -> QuantizerBase:
    """The quantizer ``placed`` asks for, of ``shape`` and ``block_size`` (see :func:`param_layout`)."""
    spec = placed.spec
    if placed.kind is Kind.ACTIVATION:
        bw, scheme = spec.bitwidth or defaults.output_bw, defaults.quant_scheme
    else:
        bw, scheme = spec.bitwidth or defaults.param_bw, defaults.param_quant_scheme
    if spec.unsigned_symmetric and spec.symmetric:
        _warn_once("unsigned_symmetric is not applied by quanta: symmetric quantizers keep a signed grid")
    data_type = spec.dtype if spec.dtype is not None else defaults.data_type
    if data_type is DataType.FLOAT:
        if bw not in (8, 16):
            raise ValueError(f"float quantizers need bitwidth 8 (float8 e4m3fn) or 16 (float16), got {bw}")
        fmt = torch.float16 if bw == 16 else torch.float8_e4m3fn
        analyzer = None if bw == 16 else scheme.encoding_analyzer(shape, block_size, percentile=defaults.percentile)
        q: QuantizerBase = FloatQuantizeDequantize(dtype=fmt, shape=shape, block_size=block_size,
                                                   encoding_analyzer=analyzer)
        if scheme.learns_ranges and bw < 16:
            q.maxval = nn.Parameter(q.maxval.clone())  # type: ignore[assignment]
        return q
    analyzer = scheme.encoding_analyzer(shape, block_size, percentile=defaults.percentile)
    if spec.decompressed_bw is not None:  # LPBQ: integer block scales under one float scale per group
        if not spec.symmetric or bw > spec.decompressed_bw or block_size is None:
            raise ValueError(f"LPBQ (decompressed_bw {spec.decompressed_bw}) needs a symmetric per-block weight "
                             f"of at most {spec.decompressed_bw} bits, got symmetric={spec.symmetric}, "
                             f"bitwidth {bw}, block_size {block_size}")
        grouping = tuple(spec.block_grouping if b not in (-1, 1) else 1 for b in block_size)
        q = GroupedBlockQuantizeDequantize(shape, bw, True, spec.decompressed_bw, analyzer, block_size, grouping)
    elif spec.symmetric and spec.strict_symmetric:
        half = 2 ** (bw - 1) - 1
        q = QuantizeDequantize(shape, symmetric=True, encoding_analyzer=analyzer, block_size=block_size,
                               qmin=-half, qmax=half)
    else:
        q = QuantizeDequantize(shape, bw, spec.symmetric, encoding_analyzer=analyzer, block_size=block_size)
    q.min.requires_grad_(scheme.learns_ranges)
    q.max.requires_grad_(scheme.learns_ranges)
    return q


def block_scaled_quantizer(fmt: str, param: torch.Tensor, where: str) -> BlockScaledQuantizeDequantize:
    """The MX/NVFP4 quantizer (config key ``block_format``) of a Linear-like weight ``[out, in]``: blocks along the
    input features, which the block size must divide (``ValueError`` naming ``where`` otherwise)."""
    q = BlockScaledQuantizeDequantize(fmt)
    if param.dim() != 2 or param.shape[1] % q.format.block_size:
        raise ValueError(f"{where}: block_format {fmt!r} quantizes 2-D [out, in] weights whose {q.format.block_size}-"
                         f"element blocks tile the input features, got shape {tuple(param.shape)}")
    return q


def param_layout(spec: QuantizerSpec, param: torch.Tensor, axis: int, where: str
                 ) -> tuple[tuple[int, ...], tuple[int, ...] | None]:
    """``(shape, block_size)`` of the quantizer for ``param``, whose output channels are along ``axis``:
    ``()`` per tensor; one scale per output channel (``per_channel``); or, with ``block_size``, one per
    block of that many input channels of each output channel. ValueError (``where`` names it) if the
    block size does not divide the input channels."""
    if not (spec.per_channel or spec.block_size) or param.dim() < 1:
        return (), None
    axis = axis if param.dim() > 1 else 0
    dims = [1] * param.dim()
    dims[axis] = param.shape[axis]
    block: tuple[int, ...] | None = None
    if spec.block_size and param.dim() >= 2:
        in_axis = 1 - axis if axis in (0, 1) else 1
        if param.shape[in_axis] % spec.block_size:
            raise ValueError(
                f"{where}: block_size {spec.block_size} does not divide input-channel dimension "
                f"{param.shape[in_axis]} of shape {tuple(param.shape)}"
            )
        dims[in_axis] = param.shape[in_axis] // spec.block_size
        block = tuple(spec.block_size if d == in_axis else -1 if d != axis else 1 for d in range(param.dim()))
    return tuple(dims), block


def install(model: nn.Module, modules: Iterable[tuple[str, QuantizationMixin]],
            placements: Mapping[str, ModulePlacement], defaults: QuantizerDefaults) -> None:
    """Put a quantizer built for each placed slot of ``modules`` (``(name, module)`` pairs of ``model``) in it,
    None in the others; fix the ranges the placement fixes; move the quantizers to ``model``'s device."""
    modules = list(modules)
    for name, module in modules:
        placement = placements[name]
        module.plain_outputs = True  # values only between modules: no subclass dispatch on every downstream op
        if len(placement.inputs) != len(module.input_quantizers):  # one input slot per concatenated tensor
            module.input_quantizers = nn.ModuleList([None] * len(placement.inputs))
        for pname, placed in placement.params.items():
            if placed is None:
                module.param_quantizers[pname] = None
                continue
            if placed.spec.block_format is not None:
                module.param_quantizers[pname] = block_scaled_quantizer(placed.spec.block_format,
                                                                        getattr(module, pname), f"{name}.{pname}")
                continue
            layout = param_layout(placed.spec, getattr(module, pname), module._weight_axis(), f"{name}.{pname}")
            module.param_quantizers[pname] = build_quantizer(placed, defaults, *layout)
        for i, placed in enumerate(placement.inputs):
            module.input_quantizers[i] = build_quantizer(placed, defaults) if isinstance(placed, Placed) else None
        for i, placed in enumerate(placement.outputs):
            module.output_quantizers[i] = build_quantizer(placed, defaults) if isinstance(placed, Placed) else None
        if placement.fixed_range is not None:
            for i, q in enumerate(module.output_quantizers):
                if q is not None:
                    module.output_quantizers[i] = fix_range(q, placement.fixed_range)
    owners = dict(modules)
    for name, module in modules:  # slots that hold another module's quantizer (AIMET's encoding propagation)
        placement = placements[name]
        for slots, placed_slots in ((module.input_quantizers, placement.inputs),
                                    (module.output_quantizers, placement.outputs)):
            for i, placed in enumerate(placed_slots):
                if isinstance(placed, Shared):
                    slots[i] = owners[placed.module].output_quantizers[placed.index]
    device = next((p.device for p in model.parameters()), None)
    if device is not None:
        for q in model.modules():
            if isinstance(q, QuantizerBase):
                q.to(device)


def with_bitwidth(q: QuantizeDequantize, bitwidth: int) -> QuantizeDequantize:
    """A new, uncalibrated quantizer like ``q`` (shape, symmetry, block size, a copy of its encoding analyzer)
    with ``bitwidth`` bits; a strict symmetric grid ``[-(2^(b-1)-1), 2^(b-1)-1]`` stays strict."""
    analyzer = copy.deepcopy(q.encoding_analyzer)
    analyzer.reset_stats()
    if q.symmetric and q.qmin == -q.qmax:
        half = 2 ** (bitwidth - 1) - 1
        return QuantizeDequantize(q.shape, symmetric=True, encoding_analyzer=analyzer, block_size=q.block_size,
                                  qmin=-half, qmax=half)
    return QuantizeDequantize(q.shape, bitwidth, q.symmetric, encoding_analyzer=analyzer, block_size=q.block_size)


def fix_range(q: QuantizerBase, fixed: tuple[float | None, float | None]) -> QuantizerBase:
    """``q`` with the ends of its range that ``fixed`` gives (the config's ``encoding_constraints``, ``None``:
    calibrated as usual) set and never recalibrated; returns ``q`` or the quantizer that replaces it.

    As in AIMET: a range symmetric about zero (``min == -max``) makes the quantizer symmetric, on the grid it
    has; the fixed ends are not trained. Unlike AIMET, a symmetric quantizer given a range not centred on
    zero (``[0, 1]`` for a Sigmoid, with an eNPU config's symmetric activations) gets the symmetric range that
    covers it (``[-128/127, 1]`` at 8 bits) instead of the range's width centred on zero (AIMET's
    ``[-0.502, 0.498]``, which clips every output above one half), and a symmetric quantizer ignores a lone
    fixed end (its grid holds zero; AIMET's again clips half the range). A float quantizer takes both ends
    only (``maxval`` = the larger magnitude).
    """
    lo, hi = fixed
    if not isinstance(q, QuantizeDequantize):
        if lo is not None and hi is not None:
            q.set_range(max(abs(lo), abs(hi)))  # type: ignore[attr-defined]
            q.allow_overwrite(False)
        return q
    if lo is not None and hi is not None and math.isclose(lo, -hi, rel_tol=1e-5, abs_tol=1e-8) and not q.symmetric:
        grid = q.grid
        learns = q.min.requires_grad
        q = QuantizeDequantize(q.shape, symmetric=True, encoding_analyzer=q.encoding_analyzer,
                               block_size=q.block_size, qmin=grid.qmin, qmax=grid.qmax)
        q.min.requires_grad_(learns)
        q.max.requires_grad_(learns)
    if q.symmetric:
        if lo is None or hi is None:
            return q
        if not math.isclose(lo, -hi, rel_tol=1e-5, abs_tol=1e-8):
            lo, hi = (float(v) for v in calibrated_range(torch.tensor(lo), torch.tensor(hi), q.grid.num_steps, True))
    with torch.no_grad():
        if lo is not None and hi is not None:
            q.set_range(lo, hi)
        else:  # one end now, the other from MinMax calibration (AIMET's scheme for a constrained quantizer)
            (q.min if lo is not None else q.max).fill_(lo if lo is not None else hi)
            q.encoding_analyzer = MinMaxEncodingAnalyzer(q.shape, q.block_size)
    q.allow_overwrite(min=lo is None, max=hi is None)
    q.min.requires_grad_(q.min.requires_grad and lo is None)
    q.max.requires_grad_(q.max.requires_grad and hi is None)
    return q


def fold_params(modules: Iterable[tuple[str, QuantizationMixin]], hint: str) -> None:
    """Replace each quantized parameter of ``modules`` (``(name, module)`` pairs) by its fake-quantized value
    and remove its quantizer; RuntimeError (``hint`` says what to do) for an uninitialised quantizer.

    A tensor computed by a parametrization (weight norm's ``weight``) becomes a plain parameter holding the
    fake-quantized values: the parametrization is removed, since its originals (``g``, ``v``) cannot reproduce
    grid values exactly (``g * v / ||v||`` rounds)."""
    for name, module in modules:
        for pname, q in list(module.param_quantizers.items()):
            if q is None:
                continue
            if not q.is_initialized():
                raise RuntimeError(f"{name}.param_quantizers.{pname} is not initialised; {hint}")
            with torch.no_grad():
                value = q(getattr(module, pname)).as_subclass(torch.Tensor)
                if pname in _parametrized_names(module):
                    remove_parametrization(module, pname)
                getattr(module, pname).copy_(value)
            module.param_quantizers[pname] = None


_WARNED: set[str] = set()


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        warnings.warn(msg, UserWarning, stacklevel=5)  # QuantizationSimModel(...) in the user's code
