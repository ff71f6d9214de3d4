"""Quantization descriptors: how a :class:`~quanta.tensor_quant.TensorQuantizer` quantizes a tensor.

``ScaledQuantDescriptor`` (alias ``QuantDescriptor``) is a frozen value object
with NVIDIA's fields and defaults. Note that its ``narrow_range`` defaults to
**False** (as NVIDIA's descriptor does), while the functions ``tensor_quant`` /
``fake_tensor_quant`` default to ``narrow_range=True``: a quantizer built from a
default descriptor uses ``[-128, 127]`` for 8 bits, the bare functions
``[-127, 127]``.

>>> d = QuantDescriptor(num_bits=8, axis=0, calib_method="histogram")
>>> d.dict()
{'num_bits': 8, 'name': None, 'axis': 0, 'calib_method': 'histogram'}
>>> QuantDescriptor.from_dict(d.dict()) == d
True
"""

from __future__ import annotations

import enum
import math
import numbers
from dataclasses import KW_ONLY, dataclass, fields
from typing import Any

import numpy as np
import torch

from quanta.kernels.amax_quant import _check_flag, is_fp8, resolve_num_bits
from quanta.tensor_quant.axis import check_axis

__all__ = [
    "CalibMethod",
    "ScaledQuantDescriptor",
    "QuantDescriptor",
    "QUANT_DESC_8BIT_PER_TENSOR",
    "QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR",
    "QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW",
    "QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL",
]


class CalibMethod(str, enum.Enum):
    """Calibrator a :class:`~quanta.tensor_quant.TensorQuantizer` creates.

    ``MAX`` and ``HISTOGRAM`` are NVIDIA's (running ``max |x|``; histograms of
    ``|x|`` whose amax ``load_calib_amax("entropy" | "mse" | "percentile")``
    computes). The ``ANALYZER_*`` methods are a quanta extension: an
    :class:`~quanta.tensor_quant.calib.AnalyzerCalibrator` running one of
    :mod:`quanta.quantization.encoding_analyzer`'s analyzers on signed
    histograms, per tensor or per axis (``amax`` = the top of the analyzer's
    symmetric range, or of its ``[0, max]`` range when unsigned).
    """

    MAX = "max"
    HISTOGRAM = "histogram"
    ANALYZER_PERCENTILE = "analyzer_percentile"
    ANALYZER_SQNR = "analyzer_sqnr"
    ANALYZER_MSE = "analyzer_mse"
    ANALYZER_ENTROPY = "analyzer_entropy"


def _amax_array(amax: object) -> np.ndarray | None:
    if amax is None:
        return None
    if isinstance(amax, (bool, np.bool_)) or isinstance(amax, str):
        raise TypeError(f"amax must be a float, a list or array of floats, or None; got {type(amax).__name__}")
    if isinstance(amax, torch.Tensor):
        amax = amax.detach().cpu().double().numpy()
    try:
        arr = np.array(amax, dtype=np.float32)
    except (TypeError, ValueError):
        raise TypeError(f"amax must be a float, a list or array of floats, or None; got {amax!r}") from None
    if np.isnan(arr).any() or (arr < 0).any() or np.isinf(arr).any():
        raise ValueError(f"amax must be finite and >= 0, got {arr.tolist()}")
    arr.setflags(write=False)
    return arr


@dataclass(frozen=True, eq=False)
class ScaledQuantDescriptor:
    """How to quantize a tensor (NVIDIA's ``ScaledQuantDescriptor``; keyword-only after ``name``).

    Args:
        num_bits: an int in [1, 32], or ``(4, 3)`` for FP8 e4m3. Default 8.
        name: optional name.
        fake_quant: fake quantization (True, default) or real integer codes.
        axis: kept dimension(s) with their own amax; None (default) per tensor.
        amax: fixed amax (float, list or array; stored as a read-only float32
            array), or None for dynamic/calibrated amax.
        learn_amax: learn amax (per tensor only: ``axis`` must be None).
        scale_amax: multiply amax by this before quantizing (experiments).
        calib_method: ``"max"`` (default), ``"histogram"``, or one of quanta's
            ``"analyzer_percentile"``, ``"analyzer_sqnr"``, ``"analyzer_mse"``,
            ``"analyzer_entropy"`` (see :class:`CalibMethod`).
        unsigned: unsigned range ``[0, 2**num_bits - 1]``.
        narrow_range: ``[-(2**(b-1) - 1), 2**(b-1) - 1]``; default **False**, as NVIDIA's descriptor.

    Raises:
        TypeError: unknown keyword, wrong types, or ``learn_amax`` with an ``axis`` (as NVIDIA).
        ValueError: out-of-range ``num_bits``, negative amax, unknown ``calib_method``,
            FP8 with ``unsigned``/``narrow_range``.
    """

    num_bits: int | tuple[int, int] = 8
    name: str | None = None
    _: KW_ONLY
    fake_quant: bool = True
    axis: int | tuple[int, ...] | None = None
    amax: Any = None
    learn_amax: bool = False
    scale_amax: float | None = None
    calib_method: CalibMethod = CalibMethod.MAX
    unsigned: bool = False
    narrow_range: bool = False

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731
        set_("num_bits", resolve_num_bits(self.num_bits))
        if self.name is not None and not isinstance(self.name, str):
            raise TypeError(f"name must be a string or None, got {type(self.name).__name__}")
        for flag in ("fake_quant", "learn_amax", "unsigned", "narrow_range"):
            set_(flag, _check_flag(flag, getattr(self, flag)))
        set_("axis", check_axis(self.axis))
        if self.learn_amax and self.axis is not None:
            raise TypeError(f"axis must be None when learn_amax is True (amax is learned per tensor), got {self.axis}")
        set_("amax", _amax_array(self.amax))
        if self.scale_amax is not None:
            if isinstance(self.scale_amax, bool) or not isinstance(self.scale_amax, numbers.Real):
                raise TypeError(f"scale_amax must be a number or None, got {type(self.scale_amax).__name__}")
            if not (math.isfinite(self.scale_amax) and self.scale_amax > 0):
                raise ValueError(f"scale_amax must be a positive finite number, got {self.scale_amax}")
        try:
            set_("calib_method", CalibMethod(self.calib_method))
        except ValueError:
            choices = ", ".join(repr(m.value) for m in CalibMethod)
            raise ValueError(f"calib_method must be one of {choices}, got {self.calib_method!r}") from None
        if is_fp8(self.num_bits) and (self.unsigned or self.narrow_range):
            raise ValueError("FP8 (num_bits=(4, 3)) is signed and has no narrow range: "
                             "leave unsigned and narrow_range False")

    # -- value semantics --------------------------------------------------------------------------------
    def _key(self) -> tuple:
        amax = None if self.amax is None else (self.amax.shape, self.amax.tobytes())
        return tuple(amax if f.name == "amax" else getattr(self, f.name) for f in fields(self) if f.name != "_")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ScaledQuantDescriptor):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __str__(self) -> str:
        bits = "fp8 e4m3" if is_fp8(self.num_bits) else f"{'unsigned ' if self.unsigned else ''}{self.num_bits}bit"
        s = f"{self.name + ': ' if self.name else ''}QuantDescriptor({bits}"
        s += " narrow" if self.narrow_range else ""
        s += " fake" if self.fake_quant else " real"
        s += f" axis={self.axis}" if self.axis is not None else " per-tensor"
        if self.amax is not None:
            s += f" amax={np.array2string(self.amax.flatten(), edgeitems=1, formatter={'all': '{:.2e}'.format})}"
        s += " learn_amax" if self.learn_amax else ""
        s += f" scale_amax={self.scale_amax}" if self.scale_amax is not None else ""
        s += f" calib={self.calib_method.value})"
        return s

    # -- serialisation ----------------------------------------------------------------------------------
    def dict(self) -> dict[str, Any]:
        """The fields that differ from their defaults (``num_bits`` and ``name`` always), as plain Python values.

        ``Cls.from_dict(d.dict()) == d`` for every descriptor. (NVIDIA's ``dict()``
        drops ``narrow_range`` and ``calib_method``; quanta keeps them.)
        """
        out: dict[str, Any] = {"num_bits": self.num_bits, "name": self.name}
        defaults = {f.name: f.default for f in fields(self) if f.name not in ("num_bits", "name", "_")}
        for key, default in defaults.items():
            value = getattr(self, key)
            if key == "amax":
                if value is not None:
                    out[key] = value.tolist()
            elif value != default:
                out[key] = value.value if isinstance(value, enum.Enum) else value
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ScaledQuantDescriptor":
        """Inverse of :meth:`dict` (lists for ``num_bits``/``axis`` become tuples; unknown keys are a TypeError)."""
        if not isinstance(d, dict):
            raise TypeError(f"from_dict needs a dict, got {type(d).__name__}")
        d = dict(d)
        for key in ("num_bits", "axis"):
            if isinstance(d.get(key), list):
                d[key] = tuple(d[key])
        return cls(**d)

    def to_yaml(self) -> str:
        """YAML of :meth:`dict` (needs PyYAML; ImportError naming it otherwise).

        Tuples are written as lists, so the YAML is plain ``safe_load`` material.
        """
        yaml = _yaml()
        d = self.dict()
        for key in ("num_bits", "axis"):
            if isinstance(d.get(key), tuple):
                d[key] = list(d[key])
        return yaml.safe_dump(d, width=120)

    @classmethod
    def from_yaml(cls, yaml_str: str) -> "ScaledQuantDescriptor":
        """Inverse of :meth:`to_yaml` (needs PyYAML)."""
        yaml = _yaml()
        d = yaml.safe_load(yaml_str)
        return cls.from_dict(d)


def _yaml():
    try:
        import yaml  # type: ignore[import-untyped]
    except ImportError:
        raise ImportError(
            "ScaledQuantDescriptor.to_yaml/from_yaml need PyYAML, which quanta does not depend on: "
            "pip install pyyaml (or use dict()/from_dict())"
        ) from None
    return yaml


QuantDescriptor = ScaledQuantDescriptor

#: 8-bit signed, one amax for the whole tensor (activations).
QUANT_DESC_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8)
#: 8-bit unsigned, one amax for the whole tensor (non-negative activations).
QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR = QuantDescriptor(num_bits=8, unsigned=True)
#: 8-bit signed, one amax per output channel (axis 0) of a Conv1d weight.
QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
#: 8-bit signed, one amax per output channel (axis 0) of a Conv2d weight.
QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
#: 8-bit signed, one amax per output channel (axis 0) of a Conv3d weight.
QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
#: 8-bit signed, one amax per row (output feature, axis 0) of a Linear weight.
QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW = QuantDescriptor(num_bits=8, axis=0)
#: 8-bit signed, one amax per slice of axis 0 of a ConvTranspose1d weight (pytorch_quantization's choice, kept).
QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
#: 8-bit signed, one amax per slice of axis 0 of a ConvTranspose2d weight (pytorch_quantization's choice, kept).
QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
#: 8-bit signed, one amax per slice of axis 0 of a ConvTranspose3d weight (pytorch_quantization's choice, kept).
QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL = QuantDescriptor(num_bits=8, axis=0)
