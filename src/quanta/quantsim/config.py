"""QuantizationSimModel configuration: which quantizers are on, and how each is set up.

The format is AIMET's quantsim config file, read as AIMET writes it (booleans
may be JSON booleans or the strings ``"True"``/``"False"``), plus quanta's
keys ``bitwidth``, ``dtype``, ``block_size`` and ``module_name``. The full
reference, with a complete example, is ``docs/guides/quantsim-config.md``.

Precedence, lowest first (a later level overrides an earlier one, key by key):

1. the base: outputs quantized, inputs not, activations asymmetric; params
   quantized, symmetric, per tensor; bitwidth/dtype left to QuantizationSimModel;
2. ``defaults`` (``ops``, ``params``, ``per_channel_quantization``, ``strict_symmetric``, ...);
3. ``params.<name>`` (parameters only);
4. ``op_type.<T>`` for each of the module's op types (:func:`op_types_of`), then
   ``op_type.<T>.params.<name>``; an earlier name in ``op_types`` wins over a later one;
5. ``module_name.<glob>`` (fnmatch on the dotted module name, file order, later
   wins), then their ``params.<name>``;
6. ``model_input.is_input_quantized`` / ``model_output.is_output_quantized`` for
   tensors that are model inputs / outputs.

``QuantSimConfig.load()`` (no source) is the built-in default; a file or a
mapping starts from the base alone (level 1), as in AIMET.

>>> import torch
>>> cfg = QuantSimConfig.load({
...     "defaults": {"ops": {"is_output_quantized": "True"},
...                  "params": {"is_quantized": "True", "is_symmetric": "True"}},
...     "params": {"bias": {"is_quantized": "False"}},
...     "op_type": {"Conv": {"per_channel_quantization": "True", "params": {"weight": {"bitwidth": 4}}}},
...     "module_name": {"head": {"is_output_quantized": "False"}},
... })
>>> conv = op_types_of(torch.nn.Conv2d)
>>> conv
('Conv2d', 'Conv')
>>> w = cfg.param_spec("features.0", conv, "weight")
>>> w.enabled, w.bitwidth, w.symmetric, w.per_channel
(True, 4, True, True)
>>> cfg.param_spec("features.0", conv, "bias").enabled
False
>>> cfg.output_spec("features.0", conv, 0).enabled, cfg.output_spec("head", ("Linear", "Gemm"), 0).enabled
(True, False)
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import enum
import errno
import fnmatch
import functools
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from quanta.quantization.float import BLOCK_SCALED_FORMATS

__all__ = ["BUILTIN_DEFAULT", "GRID_PRESERVING_OPS", "INTEGER_ONLY", "SUPERGROUP_PASSES", "DataType", "QuantSimConfig",
           "QuantizerSpec", "op_types_of"]

MIN_BITWIDTH, MAX_BITWIDTH = 1, 32
FLOAT_BITWIDTHS = (8, 16)  # float formats quanta simulates: fp8 (e4m3) and fp16


# -- public value types -------------------------------------------------------------------
class DataType(enum.Enum):
    """Numeric type of a quantizer: an integer grid or a low-precision float format.

    ``DataType.int`` / ``DataType.float`` are aliases, so that AIMET's ``QuantizationDataType.int`` reads the same
    (``quanta.quantsim.QuantizationDataType`` is this class).

    >>> DataType("float"), DataType.int
    (<DataType.FLOAT: 'float'>, <DataType.INT: 'int'>)
    """

    INT = "int"
    FLOAT = "float"
    int = "int"  # noqa: A003,PIE796  (aliases: AIMET's spelling)
    float = "float"  # noqa: A003,PIE796

    @classmethod
    def parse(cls, value: Any, name: str = "data type") -> "DataType":
        """A DataType from itself, ``int``/``float`` (the types or their names), or AIMET's
        ``QuantizationDataType`` (by name); ValueError naming ``name`` otherwise."""
        import builtins

        if value is builtins.int or value == "int":
            return cls.INT
        if value is builtins.float or value == "float":
            return cls.FLOAT
        if isinstance(value, cls):
            return value
        member = getattr(value, "name", None)  # AIMET's QuantizationDataType.int / .float
        if member in ("int", "float"):
            return cls(member)
        raise ValueError(f"{name} must be int, float, 'int', 'float' or a quanta.quantsim.DataType, got {value!r}")


@dataclass(frozen=True)
class QuantizerSpec:
    """How one quantizer slot is set up (the resolved answer of :class:`QuantSimConfig`).

    ``bitwidth``/``dtype`` None mean QuantizationSimModel's ``default_param_bw`` /
    ``default_output_bw`` / ``default_data_type``. ``per_channel`` and
    ``block_size`` concern parameters only: one scale per output channel, or
    per block of ``block_size`` elements along the input-channel dim of each
    output channel (so ``block_size`` implies ``per_channel``, and is set so).
    ``strict_symmetric`` selects the symmetric int grid ``[-(2^(b-1)-1), 2^(b-1)-1]``
    instead of ``[-2^(b-1), 2^(b-1)-1]``; ``unsigned_symmetric`` is AIMET's flag,
    recorded for QuantizationSimModel to apply. ``decompressed_bw`` (with
    ``block_size``) makes the blocks LPBQ's (AIMET's low-power blockwise
    quantization, :class:`~quanta.quantization.affine.GroupedBlockQuantizeDequantize`):
    integer block scales in ``[1, 2**(decompressed_bw - bitwidth)]`` under one float
    scale per group of ``block_grouping`` blocks (``-1``, the default: all the blocks
    of an output channel).

    >>> QuantizerSpec(enabled=True, bitwidth=4, symmetric=True, dtype=None, block_size=32).per_channel
    True
    >>> QuantizerSpec(enabled=True, bitwidth=4, symmetric=True, dtype=None, block_size=32, decompressed_bw=8
    ...               ).block_grouping
    -1
    >>> QuantizerSpec(enabled=True, bitwidth=4, symmetric=True, dtype=DataType.FLOAT)
    Traceback (most recent call last):
    ...
    ValueError: QuantizerSpec: dtype FLOAT needs bitwidth 8 or 16 (or None), got 4
    """

    enabled: bool
    bitwidth: int | None
    symmetric: bool
    dtype: DataType | None
    per_channel: bool = False
    block_size: int | None = None
    strict_symmetric: bool = False
    unsigned_symmetric: bool = False
    decompressed_bw: int | None = None
    block_grouping: int | None = None
    block_format: str | None = None

    def __post_init__(self) -> None:
        for name in ("enabled", "symmetric", "per_channel", "strict_symmetric", "unsigned_symmetric"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"QuantizerSpec.{name} must be a bool, got {getattr(self, name)!r}")
        if self.bitwidth is not None and not (_is_int(self.bitwidth) and MIN_BITWIDTH <= self.bitwidth <= MAX_BITWIDTH):
            raise ValueError(f"QuantizerSpec.bitwidth must be None or an integer in [1, 32], got {self.bitwidth!r}")
        if self.dtype is not None and not isinstance(self.dtype, DataType):
            raise TypeError(f"QuantizerSpec.dtype must be None or a DataType, got {self.dtype!r}")
        if self.dtype is DataType.FLOAT and self.bitwidth not in (None, *FLOAT_BITWIDTHS):
            raise ValueError(f"QuantizerSpec: dtype FLOAT needs bitwidth 8 or 16 (or None), got {self.bitwidth}")
        if self.block_size is not None:
            if not (_is_int(self.block_size) and self.block_size > 0):
                raise ValueError(
                    f"QuantizerSpec.block_size must be None or a positive integer, got {self.block_size!r}"
                )
            object.__setattr__(self, "per_channel", True)  # blocks split each output channel's row
        if self.decompressed_bw is not None:
            if not (_is_int(self.decompressed_bw) and MIN_BITWIDTH <= self.decompressed_bw <= MAX_BITWIDTH):
                raise ValueError("QuantizerSpec.decompressed_bw must be None or an integer in [1, 32], got "
                                 f"{self.decompressed_bw!r}")
            if self.block_size is None:
                raise ValueError("QuantizerSpec.decompressed_bw needs block_size (LPBQ scales blocks of a channel)")
            if self.bitwidth is not None and self.decompressed_bw < self.bitwidth:
                raise ValueError(f"QuantizerSpec.decompressed_bw ({self.decompressed_bw}) must be at least "
                                 f"bitwidth ({self.bitwidth})")
            if self.dtype is DataType.FLOAT:
                raise ValueError("QuantizerSpec.decompressed_bw (LPBQ) is for integer grids, got dtype FLOAT")
            if self.block_grouping is None:
                object.__setattr__(self, "block_grouping", -1)
        if self.block_format is not None:
            if self.block_format not in BLOCK_SCALED_FORMATS:
                raise ValueError(f"QuantizerSpec.block_format must be one of {sorted(BLOCK_SCALED_FORMATS)}, "
                                 f"got {self.block_format!r}")
            if self.decompressed_bw is not None or self.block_size is not None:
                raise ValueError("QuantizerSpec.block_format (MX/NVFP4 blocks of their own) excludes block_size "
                                 "and decompressed_bw")
        if self.block_grouping is not None:
            if self.decompressed_bw is None:
                raise ValueError("QuantizerSpec.block_grouping needs decompressed_bw (it groups LPBQ blocks)")
            if not (_is_int(self.block_grouping) and (self.block_grouping == -1 or self.block_grouping > 0)):
                raise ValueError("QuantizerSpec.block_grouping must be -1 (all blocks of a channel) or a positive "
                                 f"integer, got {self.block_grouping!r}")


# -- parsing: one small function per kind of value ---------------------------------------------
_KeyPath = tuple[str | int, ...]


def _where(path: _KeyPath) -> str:
    """``config['op_type']['Conv']['bitwidth']``: where a value sits in the config."""
    return "config" + "".join(f"[{p!r}]" for p in path)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # True is an int in Python, not here


def _is_list(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _bool(value: Any, path: _KeyPath) -> bool:
    if isinstance(value, bool):
        return value
    if value in ("True", "False"):  # AIMET writes booleans as strings
        return value == "True"
    raise ValueError(f"{_where(path)}: expected true/false or the string 'True'/'False', got {_short(value)}")


def _bitwidth(value: Any, path: _KeyPath) -> int:
    if _is_int(value) and MIN_BITWIDTH <= value <= MAX_BITWIDTH:
        return value
    raise ValueError(f"{_where(path)}: expected an integer in [{MIN_BITWIDTH}, {MAX_BITWIDTH}], got {_short(value)}")


def _block_size(value: Any, path: _KeyPath) -> int:
    if _is_int(value) and value > 0:
        return value
    raise ValueError(f"{_where(path)}: expected a positive integer (elements per block), got {_short(value)}")


def _block_grouping(value: Any, path: _KeyPath) -> int:
    if _is_int(value) and (value == -1 or value > 0):
        return value
    raise ValueError(f"{_where(path)}: expected -1 (every block of an output channel) or a positive integer "
                     f"(blocks per float scale), got {_short(value)}")


def _block_format(value: Any, path: _KeyPath) -> str:
    if isinstance(value, str) and value in BLOCK_SCALED_FORMATS:
        return value
    raise ValueError(f"{_where(path)}: expected one of {sorted(BLOCK_SCALED_FORMATS)} (MX/NVFP4 weights), "
                     f"got {_short(value)}")


def _dtype(value: Any, path: _KeyPath) -> DataType:
    if value in ("int", "float"):
        return DataType(value)
    raise ValueError(f"{_where(path)}: expected 'int' or 'float', got {_short(value)}")


def _text(value: Any, path: _KeyPath) -> str:
    if isinstance(value, str) and value:
        return value
    raise ValueError(f"{_where(path)}: expected a non-empty string, got {_short(value)}")


def _mapping(value: Any, path: _KeyPath) -> Mapping:
    if isinstance(value, Mapping):
        return value
    raise ValueError(f"{_where(path)}: expected a mapping (JSON object), got {type(value).__name__} {_short(value)}")


def _check_keys(raw: Mapping, allowed: Sequence[str], path: _KeyPath) -> None:
    """Reject keys outside ``allowed``, so a typo such as ``is_output_quantised`` is an error, not a no-op."""
    for key in raw:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{_where(path)}: unknown key {key!r}{hint}; allowed keys: {', '.join(sorted(allowed))}")


def _named(value: Any, path: _KeyPath, what: str) -> Mapping:
    """A mapping whose keys are names chosen by the user (op types, parameter names, module patterns)."""
    raw = _mapping(value, path)
    for key in raw:
        if not (isinstance(key, str) and key):
            raise ValueError(f"{_where(path)}: {what} must be a non-empty string, got {key!r}")
    return raw


def _encoding_constraints(value: Any, path: _KeyPath) -> tuple[float | None, float | None]:
    # AIMET's meaning: the given ends of the output range are fixed (never recalibrated); an end left out or
    # null is calibrated as usual (HTP files: "Relu": {"min": 0.0}).
    raw = _mapping(value, path)
    _check_keys(raw, ("max", "min"), path)
    bounds: list[float | None] = []
    for key in ("min", "max"):
        v = raw.get(key)
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)):
            raise ValueError(f"{_where(path + (key,))}: expected a finite number or null (calibrated), got {_short(v)}")
        bounds.append(None if v is None else float(v))
    lo, hi = bounds
    if lo is None and hi is None:
        raise ValueError(f"{_where(path)}: expected 'min' and/or 'max' as a number, got {_short(dict(raw))}")
    if lo is not None and hi is not None and lo >= hi:
        raise ValueError(f"{_where(path)}: 'min' must be below 'max', got min={lo}, max={hi}")
    return lo, hi


#: ONNX op types whose output values lie on their input's grid (AIMET's list): a config that does not name
#: one in ``op_type`` leaves its output unquantized, as AIMET does (``nn.Embedding`` is ``Gather``, the rows of
#: its quantized weight; ``MaxPool``; ``Dropout``, ``Flatten``, ``Identity`` ...).
GRID_PRESERVING_OPS = frozenset((
    "Col2Im", "Compress", "DepthToSpace", "Dropout", "Expand", "Flatten", "Gather", "GatherElements", "GatherND",
    "Identity", "MaxPool", "MaxRoiPool", "NonZero", "Pad", "ReduceMax", "ReduceMin", "Reshape", "Slice",
    "SpaceToDepth", "Split", "SplitToSequence", "Squeeze", "Tile", "TopK", "Transpose", "Unsqueeze",
))

#: AIMET's supergroup passes (``supergroup_pass_list``; aimet-onnx runs them on an ONNX graph, aimet-torch 2.42
#: reads the key and ignores it): each makes the ops of one decomposed layer run as one op, quantizing only its
#: output. What quanta does for each: ``LayerNormalization`` and ``RMSNormalization``, a norm written out in ops
#: is lifted into one module whenever capture recognises it (so with or without the pass); ``MatmulAdd``, a
#: ``matmul`` by a weight parameter whose only user adds a bias parameter is one op (a Linear): the matmul's
#: output and the bias stay unquantized (see :mod:`quanta.quantsim.placement`).
SUPERGROUP_PASSES = ("LayerNormalization", "RMSNormalization", "MatmulAdd")


def _supergroup_passes(value: Any, path: _KeyPath) -> tuple[str, ...]:
    if not _is_list(value):
        raise ValueError(f"{_where(path)}: expected a list of pass names such as ['MatmulAdd'], got {_short(value)}")
    for i, name in enumerate(value):
        if name not in SUPERGROUP_PASSES:
            close = difflib.get_close_matches(str(name), SUPERGROUP_PASSES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(f"{_where(path + (i,))}: unknown supergroup pass {_short(name)}{hint}; "
                             f"known passes: {', '.join(SUPERGROUP_PASSES)}")
    return tuple(dict.fromkeys(value))


def _supported_kernels(value: Any, path: _KeyPath) -> tuple[Any, ...]:
    # AIMET's list of {"activation": {...}, "param": {...}} kernels: kept for to_dict, not used by quanta.
    if not (_is_list(value) and value):
        raise ValueError(f"{_where(path)}: expected a non-empty list of kernel entries, got {_short(value)}")
    for i, entry in enumerate(value):
        _mapping(entry, path + (i,))
    return tuple(copy.deepcopy(dict(entry)) for entry in value)


# -- normalised rules ---------------------------------------------------------------------------
@dataclass(frozen=True)
class _ParamRule:
    """One param entry; None means "not set here" (a lower level decides). Field names are the file's keys."""

    is_quantized: bool | None = None
    is_symmetric: bool | None = None
    bitwidth: int | None = None
    dtype: DataType | None = None
    per_channel_quantization: bool | None = None
    block_size: int | None = None
    decompressed_bw: int | None = None
    block_grouping: int | None = None
    block_format: str | None = None


@dataclass(frozen=True)
class _OpRule:
    """One op-level entry (``defaults.ops``, ``op_type.<T>``, ``module_name.<glob>``)."""

    is_input_quantized: bool | None = None
    is_output_quantized: bool | None = None
    is_symmetric: bool | None = None
    bitwidth: int | None = None
    dtype: DataType | None = None
    per_channel_quantization: bool | None = None
    strict_symmetric: bool | None = None
    unsigned_symmetric: bool | None = None
    params: Mapping[str, _ParamRule] = field(default_factory=dict)
    encoding_constraints: tuple[float | None, float | None] | None = None
    supported_kernels: tuple[Any, ...] | None = None


_GRID_PRESERVING_RULE = _OpRule(is_output_quantized=False)

_PARAM_KEYS: dict[str, Callable[[Any, _KeyPath], Any]] = {
    "is_quantized": _bool,
    "is_symmetric": _bool,
    "bitwidth": _bitwidth,
    "dtype": _dtype,
    "per_channel_quantization": _bool,
    "block_size": _block_size,
    "decompressed_bw": _bitwidth,
    "block_grouping": _block_grouping,
    "block_format": _block_format,
}
_OP_KEYS: dict[str, Callable[[Any, _KeyPath], Any]] = {
    "is_input_quantized": _bool,
    "is_output_quantized": _bool,
    "is_symmetric": _bool,
    "bitwidth": _bitwidth,
    "dtype": _dtype,
    "per_channel_quantization": _bool,
    "strict_symmetric": _bool,
    "unsigned_symmetric": _bool,
}
# Keys an op_type / module_name entry takes beyond _OP_KEYS (defaults.ops takes none of them).
_OP_TYPE_EXTRAS = ("params", "encoding_constraints", "supported_kernels")
_MODULE_NAME_EXTRAS = ("params", "encoding_constraints")
_DEFAULTS_KEYS = ("ops", "params", "per_channel_quantization", "strict_symmetric", "unsigned_symmetric",
                  "hw_version", "supported_kernels")
_TOP_KEYS = ("defaults", "params", "op_type", "module_name", "supergroups", "supergroup_pass_list", "model_input",
             "model_output")


def _check_float_bitwidth(values: Mapping[str, Any], path: _KeyPath) -> None:
    if values.get("dtype") is DataType.FLOAT and values.get("bitwidth", 8) not in FLOAT_BITWIDTHS:
        raise ValueError(
            f"{_where(path + ('bitwidth',))}: dtype 'float' supports bitwidth 8 or 16, got {values['bitwidth']}"
        )


def _parse_param_rule(value: Any, path: _KeyPath) -> _ParamRule:
    raw = _mapping(value, path)
    _check_keys(raw, tuple(_PARAM_KEYS), path)
    values = {key: _PARAM_KEYS[key](v, path + (key,)) for key, v in raw.items()}
    _check_float_bitwidth(values, path)
    if "block_format" in values and any(k in values for k in ("block_size", "decompressed_bw", "block_grouping",
                                                                "per_channel_quantization")):
        raise ValueError(f"{_where(path + ('block_format',))}: MX/NVFP4 weights bring their own blocks; drop "
                         "block_size / decompressed_bw / block_grouping / per_channel_quantization from this entry")
    if "block_size" in values and values.get("per_channel_quantization") is False:
        raise ValueError(
            f"{_where(path + ('block_size',))}: block quantization is per output channel, but this entry also "
            "sets per_channel_quantization to False; drop one of the two"
        )
    if "decompressed_bw" in values and "bitwidth" in values and values["decompressed_bw"] < values["bitwidth"]:
        raise ValueError(f"{_where(path + ('decompressed_bw',))}: must be at least bitwidth ({values['bitwidth']}), "
                         f"got {values['decompressed_bw']}")
    for key in ("decompressed_bw", "block_grouping"):
        if key in values and values.get("per_channel_quantization") is False:
            raise ValueError(f"{_where(path + (key,))}: LPBQ blocks are per output channel, but this entry also "
                             "sets per_channel_quantization to False; drop one of the two")
    return _ParamRule(**values)


def _parse_op_rule(value: Any, path: _KeyPath, extras: Sequence[str] = ()) -> _OpRule:
    raw = _mapping(value, path)
    _check_keys(raw, (*_OP_KEYS, *extras), path)
    values: dict[str, Any] = {key: _OP_KEYS[key](v, path + (key,)) for key, v in raw.items() if key in _OP_KEYS}
    _check_float_bitwidth(values, path)
    if "params" in raw:
        params = _named(raw["params"], path + ("params",), "a parameter name")
        values["params"] = {name: _parse_param_rule(v, path + ("params", name)) for name, v in params.items()}
    if "encoding_constraints" in raw:
        key_path = path + ("encoding_constraints",)
        values["encoding_constraints"] = _encoding_constraints(raw["encoding_constraints"], key_path)
    if "supported_kernels" in raw:
        values["supported_kernels"] = _supported_kernels(raw["supported_kernels"], path + ("supported_kernels",))
    return _OpRule(**values)


def _parse_supergroups(value: Any, path: _KeyPath) -> tuple[tuple[str, ...], ...]:
    if not _is_list(value):
        raise ValueError(f"{_where(path)}: expected a list of {{'op_list': [...]}} entries, got {_short(value)}")
    groups = []
    for i, entry in enumerate(value):
        raw = _mapping(entry, path + (i,))
        _check_keys(raw, ("op_list",), path + (i,))
        if "op_list" not in raw:
            raise ValueError(f"{_where(path + (i,))}: missing key 'op_list' (e.g. {{'op_list': ['Conv', 'Relu']}})")
        ops = raw["op_list"]
        if not (_is_list(ops) and len(ops) >= 2):
            raise ValueError(
                f"{_where(path + (i, 'op_list'))}: expected a list of at least 2 op types, got {_short(ops)}"
            )
        groups.append(tuple(_text(op, path + (i, "op_list", j)) for j, op in enumerate(ops)))
    return tuple(groups)


def _parse_flag(value: Any, path: _KeyPath, key: str) -> bool | None:
    raw = _mapping(value, path)
    _check_keys(raw, (key,), path)
    return _bool(raw[key], path + (key,)) if key in raw else None


@dataclass(frozen=True)
class _Config:
    """A validated config: what :meth:`QuantSimConfig.to_dict` writes back."""

    ops: _OpRule = _OpRule()  # defaults.ops, with defaults.per_channel/strict/unsigned folded in
    params_default: _ParamRule = _ParamRule()  # defaults.params
    hw_version: str | None = None
    supported_kernels: tuple[Any, ...] | None = None
    params: Mapping[str, _ParamRule] = field(default_factory=dict)
    op_type: Mapping[str, _OpRule] = field(default_factory=dict)
    module_name: tuple[tuple[str, _OpRule], ...] = ()  # ordered: later patterns win
    supergroups: tuple[tuple[str, ...], ...] = ()
    supergroup_passes: tuple[str, ...] = ()
    model_input: bool | None = None
    model_output: bool | None = None


def _parse_defaults(value: Any, path: _KeyPath) -> dict[str, Any]:
    raw = _mapping(value, path)
    _check_keys(raw, _DEFAULTS_KEYS, path)
    ops = _parse_op_rule(raw.get("ops", {}), path + ("ops",))
    params = _parse_param_rule(raw.get("params", {}), path + ("params",))
    # per_channel_quantization may sit in defaults, defaults.ops or defaults.params (one meaning: params'
    # granularity); strict/unsigned in defaults or defaults.ops. Two places would be two answers: refuse.
    folded = {}
    for key in ("per_channel_quantization", "strict_symmetric", "unsigned_symmetric"):
        places = [path + (key,)] if key in raw else []
        places += [path + (sub, key) for sub, rule in (("ops", ops), ("params", params))
                   if getattr(rule, key, None) is not None]
        if len(places) > 1:
            raise ValueError(f"{_where(places[1])}: also set at {_where(places[0])}; set {key} in one place only")
        if key in raw:
            folded[key] = _bool(raw[key], path + (key,))
        elif getattr(params, key, None) is not None:
            folded[key] = getattr(params, key)
    ops = dataclasses.replace(ops, **folded)
    params = dataclasses.replace(params, per_channel_quantization=None)
    out: dict[str, Any] = {"ops": ops, "params_default": params}
    if "hw_version" in raw:  # AIMET names its target hardware with it; placement applies its per-version rules
        out["hw_version"] = _text(raw["hw_version"], path + ("hw_version",))
    if "supported_kernels" in raw:
        out["supported_kernels"] = _supported_kernels(raw["supported_kernels"], path + ("supported_kernels",))
    return out


def _parse(value: Any) -> _Config:
    """Validate a whole config (the JSON/YAML document) into a :class:`_Config`."""
    raw = _mapping(value, ())
    _check_keys(raw, _TOP_KEYS, ())
    out: dict[str, Any] = _parse_defaults(raw["defaults"], ("defaults",)) if "defaults" in raw else {}
    if "params" in raw:
        params = _named(raw["params"], ("params",), "a parameter name")
        out["params"] = {name: _parse_param_rule(v, ("params", name)) for name, v in params.items()}
    if "op_type" in raw:
        op_type = _named(raw["op_type"], ("op_type",), "an op type")
        out["op_type"] = {t: _parse_op_rule(v, ("op_type", t), _OP_TYPE_EXTRAS) for t, v in op_type.items()}
    if "module_name" in raw:
        patterns = _named(
            raw["module_name"], ("module_name",),
            "a module name pattern (a dotted module name or an fnmatch glob such as 'encoder.*.attn')",
        )
        out["module_name"] = tuple(
            (p, _parse_op_rule(v, ("module_name", p), _MODULE_NAME_EXTRAS)) for p, v in patterns.items()
        )
    if "supergroups" in raw:
        out["supergroups"] = _parse_supergroups(raw["supergroups"], ("supergroups",))
    if "supergroup_pass_list" in raw:
        out["supergroup_passes"] = _supergroup_passes(raw["supergroup_pass_list"], ("supergroup_pass_list",))
    if "model_input" in raw:
        out["model_input"] = _parse_flag(raw["model_input"], ("model_input",), "is_input_quantized")
    if "model_output" in raw:
        out["model_output"] = _parse_flag(raw["model_output"], ("model_output",), "is_output_quantized")
    return _Config(**out)


# -- serialising ------------------------------------------------------------------------------
def _rule_to_dict(rule: _OpRule | _ParamRule) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(rule):
        value = getattr(rule, f.name)
        if value is None or (f.name == "params" and not value):
            continue
        if isinstance(value, DataType):
            value = value.value
        elif f.name == "params":
            value = {name: _rule_to_dict(r) for name, r in value.items()}
        elif f.name == "encoding_constraints":
            value = {k: v for k, v in zip(("min", "max"), value) if v is not None}
        elif f.name == "supported_kernels":
            value = copy.deepcopy(list(value))
        out[f.name] = value
    return out


def _to_dict(cfg: _Config) -> dict[str, Any]:
    moved = ("per_channel_quantization", "strict_symmetric", "unsigned_symmetric")  # AIMET keeps these in defaults
    defaults: dict[str, Any] = {
        "ops": _rule_to_dict(dataclasses.replace(cfg.ops, **dict.fromkeys(moved))),
        "params": _rule_to_dict(cfg.params_default),
    }
    defaults.update({key: getattr(cfg.ops, key) for key in moved if getattr(cfg.ops, key) is not None})
    if cfg.hw_version is not None:
        defaults["hw_version"] = cfg.hw_version
    if cfg.supported_kernels is not None:
        defaults["supported_kernels"] = copy.deepcopy(list(cfg.supported_kernels))
    return {
        "defaults": defaults,
        "params": {name: _rule_to_dict(r) for name, r in cfg.params.items()},
        "op_type": {t: _rule_to_dict(r) for t, r in cfg.op_type.items()},
        "module_name": {p: _rule_to_dict(r) for p, r in cfg.module_name},
        "supergroups": [{"op_list": list(g)} for g in cfg.supergroups],
        "supergroup_pass_list": list(cfg.supergroup_passes),
        "model_input": {} if cfg.model_input is None else {"is_input_quantized": cfg.model_input},
        "model_output": {} if cfg.model_output is None else {"is_output_quantized": cfg.model_output},
    }


# -- resolving: fold the matching rules over the base, lowest precedence first ----------------------
def _granularity(state: dict[str, Any], per_channel: bool | None, block_size: int | None = None,
                 decompressed_bw: int | None = None, block_grouping: int | None = None) -> None:
    # One granularity per quantizer: the most specific level that says anything about it decides (a level
    # that gives block_size alone keeps the LPBQ keys of a lower one; per_channel_quantization alone clears both).
    if block_size is not None:
        state.update(per_channel=True, block_size=block_size)
    elif per_channel is not None and decompressed_bw is None and block_grouping is None:
        state.update(per_channel=per_channel, block_size=None, decompressed_bw=None, block_grouping=None)
    if decompressed_bw is not None:
        state["decompressed_bw"] = decompressed_bw
    if block_grouping is not None:
        state["block_grouping"] = block_grouping


def _set(state: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        state[key] = value


def _apply_op_to_param(state: dict[str, Any], rule: _OpRule) -> None:
    _granularity(state, rule.per_channel_quantization)
    _set(state, "strict_symmetric", rule.strict_symmetric)
    _set(state, "unsigned_symmetric", rule.unsigned_symmetric)


def _apply_param(state: dict[str, Any], rule: _ParamRule | None) -> None:
    if rule is None:
        return
    _set(state, "enabled", rule.is_quantized)
    _set(state, "symmetric", rule.is_symmetric)
    _set(state, "bitwidth", rule.bitwidth)
    _set(state, "dtype", rule.dtype)
    _granularity(state, rule.per_channel_quantization, rule.block_size, rule.decompressed_bw, rule.block_grouping)
    # block_format is granularity too: the most specific level that says anything about it decides
    if rule.block_format is not None:
        state.update(block_format=rule.block_format, per_channel=False, block_size=None, decompressed_bw=None,
                     block_grouping=None)
    elif any(v is not None for v in (rule.per_channel_quantization, rule.block_size, rule.decompressed_bw)):
        state["block_format"] = None


def _apply_op_to_activation(state: dict[str, Any], rule: _OpRule, enabled_key: str) -> None:
    _set(state, "enabled", getattr(rule, enabled_key))
    _set(state, "symmetric", rule.is_symmetric)
    _set(state, "bitwidth", rule.bitwidth)
    _set(state, "dtype", rule.dtype)
    _set(state, "strict_symmetric", rule.strict_symmetric)
    _set(state, "unsigned_symmetric", rule.unsigned_symmetric)


def _spec(state: dict[str, Any], what: str) -> QuantizerSpec:
    if state["dtype"] is DataType.FLOAT and state["bitwidth"] not in (None, *FLOAT_BITWIDTHS):
        raise ValueError(
            f"the config gives {what} dtype 'float' with bitwidth {state['bitwidth']} (from different entries); "
            "float quantizers take bitwidth 8 or 16: set 'bitwidth' next to 'dtype' in the entry that applies"
        )
    if state.get("block_grouping") is not None and state.get("decompressed_bw") is None:
        raise ValueError(f"the config gives {what} block_grouping {state['block_grouping']} without "
                         "decompressed_bw: block_grouping groups LPBQ blocks; set 'decompressed_bw' next to it")
    if state.get("block_format") is not None and (state.get("block_size") is not None
                                                  or state.get("decompressed_bw") is not None):
        raise ValueError(f"the config gives {what} block_format {state['block_format']!r} and block_size/"
                         "decompressed_bw (from different entries): MX/NVFP4 weights bring their own blocks")
    if state.get("decompressed_bw") is not None:
        problem = ("no block_size" if state["block_size"] is None else
                   "dtype 'float'" if state["dtype"] is DataType.FLOAT else
                   f"bitwidth {state['bitwidth']} above it" if (state["bitwidth"] or 0) > state["decompressed_bw"]
                   else None)
        if problem:
            raise ValueError(f"the config gives {what} decompressed_bw {state['decompressed_bw']} (LPBQ) with "
                             f"{problem} (from different entries): set 'block_size' and 'bitwidth' next to "
                             "'decompressed_bw' in the entry that applies")
    return QuantizerSpec(**state)


def _check_module(module_name: Any, op_types: Any) -> tuple[str, ...]:
    if not isinstance(module_name, str):
        raise TypeError(f"module_name must be a str (a name from model.named_modules()), got {_short(module_name)}")
    if isinstance(op_types, (str, bytes)) or not isinstance(op_types, Sequence):
        raise TypeError(
            f"op_types must be a sequence of op type names such as op_types_of(module) == ('Conv2d', 'Conv'), "
            f"got {_short(op_types)}"
        )
    for t in op_types:
        if not isinstance(t, str):
            raise TypeError(f"op_types must hold strings, got {_short(t)} in {_short(op_types)}")
    return tuple(dict.fromkeys(op_types))  # drop repeats, keep order


def _check_index(index: Any, flag_name: str, flag: Any) -> None:
    if not _is_int(index):
        raise TypeError(
            f"index must be an int (the tensor's position among the module's inputs/outputs), got {_short(index)}"
        )
    if index < 0:
        raise ValueError(f"index must be >= 0, got {index}")
    if not isinstance(flag, bool):
        raise TypeError(f"{flag_name} must be a bool, got {_short(flag)}")


# -- the public config ---------------------------------------------------------------------------
class QuantSimConfig:
    """A validated quantsim config; ask it how each quantizer of a module is set up.

    Build one with :meth:`load`. Instances are immutable and compare equal when
    their normalised content (:meth:`to_dict`) is equal.

    >>> cfg = QuantSimConfig.load()
    >>> cfg.param_spec("bn", ("BatchNorm2d", "BatchNormalization"), "bias").enabled
    False
    >>> ln = cfg.param_spec("ln", ("LayerNorm", "LayerNormalization"), "weight")
    >>> ln.enabled, ln.per_channel
    (True, False)
    >>> QuantSimConfig.load(cfg.to_dict()) == cfg
    True
    """

    __slots__ = ("_cfg",)

    def __init__(self, _cfg: _Config) -> None:
        if not isinstance(_cfg, _Config):
            raise TypeError(
                "build a QuantSimConfig with QuantSimConfig.load(source), where source is None (the built-in "
                "default), a .json/.yaml/.yml path, a mapping or a QuantSimConfig"
            )
        self._cfg = _cfg

    def supported_kernels(self, op_type: str | None = None) -> tuple[dict[str, Any], ...] | None:
        """AIMET's ``supported_kernels`` entries (``{"activation": {"bitwidth", "dtype"}, "param": {...}}``) for
        ``op_type`` (its ``op_type`` section, else ``defaults``); None when the config names none. quanta's
        simulation does not use them; mixed precision restricts its candidates to them."""
        rule = self._cfg.op_type.get(op_type) if op_type is not None else None
        if rule is not None and rule.supported_kernels is not None:
            return rule.supported_kernels
        return self._cfg.supported_kernels

    @classmethod
    def load(cls, source: str | os.PathLike | Mapping | QuantSimConfig | None = None) -> QuantSimConfig:
        """The config from ``source``; a file or mapping is validated in full first.

        ``None`` gives the built-in default; a QuantSimConfig is returned as is; a
        mapping is validated and copied; a path ending in ``.json`` is read with
        :func:`json.loads`, ``.yaml``/``.yml`` with ``yaml.safe_load`` (needs
        ``pip install quanta[yaml]``). Nothing in a file is ever executed.

        Raises ValueError naming the key path for bad content (the file name
        first for files), FileNotFoundError for a missing file, ImportError for
        YAML without PyYAML, TypeError for another kind of ``source``.

        >>> QuantSimConfig.load({"op_type": {"Conv": {"bitwidth": "eight"}}})
        Traceback (most recent call last):
        ...
        ValueError: config['op_type']['Conv']['bitwidth']: expected an integer in [1, 32], got 'eight'
        """
        if source is None:
            return _builtin_default()
        if isinstance(source, QuantSimConfig):
            return source
        if isinstance(source, Mapping):
            return cls(_parse(source))
        if isinstance(source, (str, os.PathLike)):
            path, document = _read_file(source)
            try:
                return cls(_parse(document))
            except ValueError as err:
                raise ValueError(f"{path}: {err}") from None
        raise TypeError(
            "source must be None (the built-in default), a path to a .json/.yaml/.yml file, a mapping or a "
            f"QuantSimConfig, got {type(source).__name__}"
        )

    # -- questions ----------------------------------------------------------------------------
    def param_spec(self, module_name: str, op_types: Sequence[str], param_name: str) -> QuantizerSpec:
        """How parameter ``param_name`` of module ``module_name`` (of ``op_types``) is quantized.

        >>> cfg = QuantSimConfig.load({"params": {"weight": {"bitwidth": 4}},
        ...                            "module_name": {"head": {"params": {"weight": {"block_size": 32}}}}})
        >>> s = cfg.param_spec("head", ("Linear", "Gemm"), "weight")
        >>> s.bitwidth, s.per_channel, s.block_size
        (4, True, 32)
        """
        op_types = _check_module(module_name, op_types)
        if not (isinstance(param_name, str) and param_name):
            raise TypeError(f"param_name must be a non-empty str such as 'weight', got {_short(param_name)}")
        cfg = self._cfg
        state: dict[str, Any] = dict(enabled=False, bitwidth=None, symmetric=False, dtype=None, per_channel=False,
                                     block_size=None, strict_symmetric=False, unsigned_symmetric=False,
                                     decompressed_bw=None, block_grouping=None, block_format=None)
        _apply_op_to_param(state, cfg.ops)
        _apply_param(state, cfg.params_default)
        _apply_param(state, cfg.params.get(param_name))
        for rules in self._matching(module_name, op_types):
            for rule in rules:
                _apply_op_to_param(state, rule)
            for rule in rules:
                _apply_param(state, rule.params.get(param_name))
        return _spec(state, f"param {param_name!r} of module {module_name!r}")

    def input_spec(self, module_name: str, op_types: Sequence[str], index: int, *,
                   is_model_input: bool = False) -> QuantizerSpec:
        """How input ``index`` of module ``module_name`` is quantized (every index shares the op's setting).

        ``is_model_input=True`` says this input is a model input, so ``model_input`` applies.

        >>> cfg = QuantSimConfig.load({"model_input": {"is_input_quantized": True}})
        >>> cfg.input_spec("conv1", ("Conv2d", "Conv"), 0).enabled
        False
        >>> cfg.input_spec("conv1", ("Conv2d", "Conv"), 0, is_model_input=True).enabled
        True
        """
        return self._activation_spec(module_name, op_types, index, "is_input_quantized", "is_model_input",
                                     is_model_input, self._cfg.model_input)

    def output_spec(self, module_name: str, op_types: Sequence[str], index: int, *,
                    is_model_output: bool = False) -> QuantizerSpec:
        """How output ``index`` of module ``module_name`` is quantized (every index shares the op's setting).

        ``is_model_output=True`` says this output is a model output, so ``model_output`` applies.

        >>> s = QuantSimConfig.load().output_spec("fc", ("Linear", "Gemm"), 0)
        >>> s.enabled, s.symmetric, s.bitwidth
        (True, False, None)
        """
        return self._activation_spec(module_name, op_types, index, "is_output_quantized", "is_model_output",
                                     is_model_output, self._cfg.model_output)

    def encoding_constraints(self, module_name: str, op_types: Sequence[str]) -> tuple[float, float] | None:
        """AIMET's ``encoding_constraints``: a fixed ``(min, max)`` range for the module's output, or None.

        >>> cfg = QuantSimConfig.load({"op_type": {"Softmax": {"encoding_constraints": {"min": 0, "max": 1}}}})
        >>> cfg.encoding_constraints("attn.softmax", ("Softmax",)), cfg.encoding_constraints("fc", ("Gemm",))
        ((0.0, 1.0), None)
        """
        op_types = _check_module(module_name, op_types)
        found = None
        for rules in self._matching(module_name, op_types):
            for rule in rules:
                found = rule.encoding_constraints if rule.encoding_constraints is not None else found
        return found

    @property
    def hw_version(self) -> str | None:
        """AIMET's target hardware version (``defaults.hw_version``, e.g. ``"V73"``), or None.

        QuantizationSimModel applies AIMET's per-version rules with it (:mod:`quanta.quantsim.placement`).

        >>> QuantSimConfig.load({"defaults": {"hw_version": "V73"}}).hw_version
        'V73'
        """
        return self._cfg.hw_version

    @property
    def supergroup_passes(self) -> tuple[str, ...]:
        """AIMET's ``supergroup_pass_list``: the names of the supergroup passes to run (see ``SUPERGROUP_PASSES``).

        >>> QuantSimConfig.load({"supergroup_pass_list": ["MatmulAdd"]}).supergroup_passes
        ('MatmulAdd',)
        """
        return self._cfg.supergroup_passes

    @property
    def supergroups(self) -> tuple[tuple[str, ...], ...]:
        """Op-type sequences that run fused on the target, so only the last op's output is quantized.

        >>> QuantSimConfig.load().supergroups[0]
        ('Conv', 'Relu')
        """
        return self._cfg.supergroups

    def to_dict(self) -> dict[str, Any]:
        """The normalised config: JSON booleans, every top-level key, only the keys each entry sets.

        ``QuantSimConfig.load(cfg.to_dict()) == cfg``; ``json.dumps`` accepts it.

        >>> QuantSimConfig.load({"defaults": {"ops": {"is_symmetric": "True"}}}).to_dict()["defaults"]
        {'ops': {'is_symmetric': True}, 'params': {}}
        """
        return _to_dict(self._cfg)

    # -- helpers ---------------------------------------------------------------------------------
    def _matching(self, module_name: str, op_types: tuple[str, ...], *, implicit: bool = False
                  ) -> tuple[list[_OpRule], list[_OpRule]]:
        """(op_type rules, module_name rules) that apply to the module, each lowest precedence first.

        ``implicit``: a grid-preserving op type the file does not name counts as ``is_output_quantized:
        false`` (AIMET: such an op's output lies on its input's grid already)."""
        by_type = [self._cfg.op_type[t] if t in self._cfg.op_type else _GRID_PRESERVING_RULE
                   for t in reversed(op_types)
                   if t in self._cfg.op_type or (implicit and t in GRID_PRESERVING_OPS)]
        by_name = [rule for pattern, rule in self._cfg.module_name if fnmatch.fnmatchcase(module_name, pattern)]
        return by_type, by_name

    def _activation_spec(self, module_name: str, op_types: Sequence[str], index: int, enabled_key: str,
                         flag_name: str, flag: bool, model_override: bool | None) -> QuantizerSpec:
        op_types = _check_module(module_name, op_types)
        _check_index(index, flag_name, flag)
        state: dict[str, Any] = dict(enabled=False, bitwidth=None, symmetric=False,
                                     dtype=None, strict_symmetric=False, unsigned_symmetric=False)
        _apply_op_to_activation(state, self._cfg.ops, enabled_key)
        for rules in self._matching(module_name, op_types, implicit=enabled_key == "is_output_quantized"):
            for rule in rules:
                _apply_op_to_activation(state, rule, enabled_key)
        if flag and model_override is not None:
            state["enabled"] = model_override
        kind = "input" if enabled_key == "is_input_quantized" else "output"
        return _spec(state, f"{kind} {index} of module {module_name!r}")

    # -- dunder ------------------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, QuantSimConfig):
            return NotImplemented
        return self._cfg == other._cfg

    __hash__ = None  # type: ignore[assignment]  # equal by content, which holds dicts

    def __repr__(self) -> str:
        cfg = self._cfg
        return (f"QuantSimConfig(op_type={list(cfg.op_type)}, module_name={[p for p, _ in cfg.module_name]}, "
                f"supergroups={len(cfg.supergroups)})")


# -- the built-in default ----------------------------------------------------------------------------
#: What ``QuantSimConfig.load()`` returns, in the file format: AIMET's ``default_config.json``, with the
#: departures measured in docs/guides/quantsim-config.md (per-channel weights; 16-bit norm outputs; the residual
#: stream, the adds and the Linears feeding them, in float).
BUILTIN_DEFAULT: Mapping[str, Any] = {
    "defaults": {
        "ops": {"is_output_quantized": True, "is_input_quantized": False, "is_symmetric": False},
        "params": {"is_quantized": True, "is_symmetric": True},
        # departure: AIMET's default_config.json is per tensor (its default_config_per_channel.json is not)
        "per_channel_quantization": True,
        "strict_symmetric": False,
        "unsigned_symmetric": False,
    },
    # every bias off, including MultiheadAttention's (in_proj_bias, bias_k/bias_v: added, not multiplied)
    "params": {name: {"is_quantized": False} for name in ("bias", "in_proj_bias", "bias_k", "bias_v")},
    "op_type": {
        # Norm and BatchNorm weights per tensor, as in AIMET's default (a BatchNorm after a convolution folds
        # into it: its parameters stay float, see quanta.quantsim.placement).
        "BatchNormalization": {"per_channel_quantization": False},
        # A transformer's LayerNorm/RMSNorm outputs carry its outlier channels (post-LN BERT: the residual
        # stream itself); 8 bits there cost real models most of their accuracy (all-MiniLM-L6-v2 sentence
        # embeddings: mean cosine 0.987 -> 0.995 with them at 16 bits; docs/real-weights.md).
        "LayerNormalization": {"per_channel_quantization": False, "bitwidth": 16},
        "GroupNormalization": {"per_channel_quantization": False},
        "RMSNormalization": {"per_channel_quantization": False, "bitwidth": 16},
        # The residual stream: an add's output has the widest range in the network and costs no MACs, so
        # it stays in float (as TensorRT/ModelOpt place Q/DQ); one 8-bit per-tensor quantizer there caps a
        # transformer block's output near 38 dB. Its consumers (LayerNorm → Linear, ReLU) are still
        # quantized. INTEGER_ONLY turns it back on.
        "Add": {"is_output_quantized": False},
    },
    "supergroup_pass_list": ["MatmulAdd"],
    "supergroups": [
        {"op_list": ["Conv", "Relu"]},
        {"op_list": ["ConvTranspose", "Relu"]},
        {"op_list": ["Conv", "Clip"]},  # ReLU6 (MobileNet, EfficientNet-lite)
        {"op_list": ["Add", "Relu"]},
        {"op_list": ["Gemm", "Relu"]},
        # a residual branch's last Linear (attention output, FFN down projection) runs fused with the add
        # it feeds: its output is not quantized on its own (with the add's output in float, it stays float)
        {"op_list": ["Gemm", "Add"]},
    ],
    "model_input": {"is_input_quantized": True},  # floating-point inputs; token ids are never quantized
    "model_output": {},
}


#: BUILTIN_DEFAULT with every activation quantized, elementwise adds and the residual branches feeding them
#: included: what an integer-only backend runs (AIMET's default_config.json places the same quantizers, per
#: tensor; the norms keep their 16 bits).
INTEGER_ONLY: Mapping[str, Any] = copy.deepcopy(  # its own nested dicts: editing one leaves the other alone
    {**BUILTIN_DEFAULT, "op_type": {k: v for k, v in BUILTIN_DEFAULT["op_type"].items() if k != "Add"},
     "supergroups": [g for g in BUILTIN_DEFAULT["supergroups"] if g["op_list"] != ["Gemm", "Add"]]})


@functools.cache
def _builtin_default() -> QuantSimConfig:
    return QuantSimConfig(_parse(BUILTIN_DEFAULT))


# -- files -------------------------------------------------------------------------------------------
def _import_yaml() -> Any:
    try:
        import yaml
    except ImportError:
        raise ImportError(
            "reading a YAML quantsim config needs PyYAML: pip install quanta[yaml] (or use a .json file or a dict)"
        ) from None
    return yaml


def _read_file(source: str | os.PathLike) -> tuple[str, Any]:
    """``(path, document)``: the file parsed with json or ``yaml.safe_load`` (never code)."""
    path = os.fspath(source)
    if not isinstance(path, str):
        raise TypeError(f"source must be a str or os.PathLike of str, got a path of {type(path).__name__}")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".json", ".yaml", ".yml"):
        raise ValueError(f"source {path!r}: unsupported file suffix {suffix!r}; use .json, .yaml or .yml")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(errno.ENOENT, "quantsim config file not found", path) from None
    if suffix == ".json":
        try:
            return path, json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    yaml = _import_yaml()
    try:
        return path, yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{path}: invalid YAML{at}: {getattr(err, 'problem', None) or err}") from None


# -- op types ----------------------------------------------------------------------------------------
# torch class -> the ONNX op name AIMET's configs use; a class whose ONNX name is its own name is not listed.
_ONNX_NAMES: dict[type[nn.Module], str] = {
    nn.Conv1d: "Conv", nn.Conv2d: "Conv", nn.Conv3d: "Conv",
    nn.ConvTranspose1d: "ConvTranspose", nn.ConvTranspose2d: "ConvTranspose", nn.ConvTranspose3d: "ConvTranspose",
    nn.Linear: "Gemm",
    nn.ReLU: "Relu", nn.GELU: "Gelu",
    nn.LayerNorm: "LayerNormalization", nn.GroupNorm: "GroupNormalization", nn.RMSNorm: "RMSNormalization",
    nn.BatchNorm1d: "BatchNormalization", nn.BatchNorm2d: "BatchNormalization", nn.BatchNorm3d: "BatchNormalization",
    nn.InstanceNorm1d: "InstanceNormalization", nn.InstanceNorm2d: "InstanceNormalization",
    nn.InstanceNorm3d: "InstanceNormalization",
    nn.Embedding: "Gather",
    nn.MaxPool1d: "MaxPool", nn.MaxPool2d: "MaxPool", nn.MaxPool3d: "MaxPool",
    nn.AvgPool1d: "AveragePool", nn.AvgPool2d: "AveragePool", nn.AvgPool3d: "AveragePool",
    nn.ReLU6: "Clip", nn.PReLU: "PRelu", nn.LeakyReLU: "LeakyRelu", nn.ELU: "Elu",
    nn.Hardswish: "HardSwish", nn.Hardsigmoid: "HardSigmoid",
    nn.Dropout1d: "Dropout", nn.Dropout2d: "Dropout", nn.Dropout3d: "Dropout",
}


def op_types_of(module: nn.Module | type[nn.Module]) -> tuple[str, ...]:
    """Names a config can address a module type by: its class name, then its ONNX op name if known.

    Lookup is by exact class (a user subclass of ``nn.Conv2d`` is its own type);
    a quanta quantized class answers for its float class.

    >>> import torch, quanta.nn
    >>> op_types_of(torch.nn.Linear), op_types_of(torch.nn.ReLU()), op_types_of(torch.nn.Softmax)
    (('Linear', 'Gemm'), ('ReLU', 'Relu'), ('Softmax',))
    >>> op_types_of(quanta.nn.QuantizedConv2d), op_types_of(quanta.nn.Multiply)
    (('Conv2d', 'Conv'), ('Multiply', 'Mul'))
    """
    cls = module if isinstance(module, type) else type(module)
    if not issubclass(cls, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module or a subclass of it, got {_short(module)}")
    from quanta.nn import base, functional  # lazily: quanta.nn may come to import quanta.quantsim

    if issubclass(cls, base.QuantizationMixin):
        cls = base._float_base(cls)
    onnx = _ONNX_NAMES.get(cls) or {functional.Multiply: "Mul", functional.Subtract: "Sub", functional.Divide: "Div",
                                    functional.TransposedLinear: "Gemm", functional.Interpolate: "Resize",
                                    functional.ChannelsFirstLayerNorm: "LayerNormalization",
                                    functional.OffsetRMSNorm: "RMSNormalization",
                                    functional.Mean: "ReduceMean"}.get(cls)
    return (cls.__name__,) if onnx in (None, cls.__name__) else (cls.__name__, onnx)
