"""ModelOpt's quantization config format: quantizer attributes, ``quant_cfg`` entries, and the named configs.

A config is ``{"quant_cfg": [entry, ...], "algorithm": ...}``. Each entry is
``{"quantizer_name": wildcard, "cfg": {...} | [{...}, ...], "enable": bool, "parent_class": "nn.X"}``
(``cfg`` and/or ``enable``); entries apply in order, a later one wins, and a
``cfg`` replaces every attribute of the quantizers it matches (unnamed ones
return to their defaults). The legacy dict form
``{"*weight_quantizer": {...}, "default": {"enable": False}, "nn.BatchNorm2d": {"*": {...}}}`` is
read too. ``"algorithm"``: ``"max"``, ``None`` (no calibration) or
``{"method": "max"}``.

>>> QuantizerAttributeConfig(num_bits=(4, 3)).num_bits
(4, 3)
>>> [e["quantizer_name"] for e in normalize_quant_cfg_list({"default": {"enable": False},
...                                                         "*weight_quantizer": {"num_bits": 4}})]
['*', '*weight_quantizer']
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

__all__ = [
    "QuantizerAttributeConfig",
    "normalize_quant_cfg_list",
    "check_config",
    "INT8_DEFAULT_CFG",
    "INT8_WEIGHT_ONLY_CFG",
    "INT8_SMOOTHQUANT_CFG",
    "FP8_DEFAULT_CFG",
    "INT4_BLOCKWISE_WEIGHT_ONLY_CFG",
    "INT4_AWQ_CFG",
    "W4A8_AWQ_BETA_CFG",
    "MXFP8_DEFAULT_CFG",
    "MXFP4_DEFAULT_CFG",
    "MXINT8_DEFAULT_CFG",
    "NVFP4_DEFAULT_CFG",
    "W4A16_NVFP4_CFG",
    "choices",
]

NumBits = Union[int, tuple[int, int]]


@dataclasses.dataclass
class QuantizerAttributeConfig:
    """The attributes of one :class:`~quanta.modelopt.TensorQuantizer` (ModelOpt's fields and defaults).

    ``num_bits``: an int (integer grid) or ``(E, M)`` (float: ``(4, 3)`` is FP8 e4m3; with dynamic
    ``block_sizes`` also ``(5, 2)``, ``(3, 2)``, ``(2, 3)``, ``(2, 1)``). ``axis``: the axes that keep their own
    amax (None: one amax). ``block_sizes``: ``{-1: 128}`` (a static amax per block of the last dimension,
    ``"type": "static"``) or ``{-1: 32, "type": "dynamic", "scale_bits": (8, 0)}`` (MX: a power-of-two scale
    per block, computed at every call) / ``"scale_bits": (4, 3)`` (NVFP4: an e4m3 scale per block and the
    calibrated amax as the tensor's scale). ``type``: ``"static"`` (calibrated amax) or ``"dynamic"`` (amax of
    every input). ``calibrator``: ``"max"`` or ``"histogram"``.

    ModelOpt's ``learn_amax``, ``bias``, ``rotate``, ``backend``, ``use_constant_amax``/``constant_amax`` and
    ``fake_quant=False`` (real quantization) are accepted at their defaults only (``ValueError`` otherwise).
    """

    enable: bool = True
    num_bits: NumBits = 8
    effective_bits: Optional[float] = None
    axis: Optional[Union[int, tuple[int, ...]]] = None
    fake_quant: bool = True
    unsigned: bool = False
    narrow_range: bool = False
    learn_amax: bool = False
    type: str = "static"
    block_sizes: Optional[dict] = None
    bias: Optional[dict] = None
    trt_high_precision_dtype: str = "Float"
    calibrator: str = "max"
    rotate: bool = False
    pass_through_bwd: bool = True
    backend: Optional[str] = None
    backend_extra_args: Optional[dict] = None
    use_constant_amax: bool = False
    constant_amax: Optional[float] = None

    def __post_init__(self) -> None:
        check_attributes(dataclasses.asdict(self))


_FIELDS = {f.name for f in dataclasses.fields(QuantizerAttributeConfig)}
_UNSUPPORTED_DEFAULTS = {"learn_amax": False, "bias": None, "rotate": False, "backend": None,
                         "backend_extra_args": None, "use_constant_amax": False, "constant_amax": None,
                         "fake_quant": True}
_FLOAT_BITS = {(4, 3), (5, 2), (3, 2), (2, 3), (2, 1)}


def check_attributes(attrs: Mapping[str, Any]) -> None:
    """``ValueError``/``TypeError`` naming the attribute if ``attrs`` (a partial or full set) is not valid."""
    unknown = set(attrs) - _FIELDS
    if unknown:
        raise ValueError(f"unknown quantizer attribute(s) {sorted(unknown)}; known: {sorted(_FIELDS)}")
    for name, default in _UNSUPPORTED_DEFAULTS.items():
        if name in attrs and attrs[name] != default and not (name == "rotate" and attrs[name] in ({}, None)):
            raise ValueError(f"quantizer attribute {name}={attrs[name]!r} is not supported by quanta.modelopt "
                             f"(only {default!r}); fake quantization with calibrated or dynamic amax is")
    if "enable" in attrs and not isinstance(attrs["enable"], bool):
        raise TypeError(f"enable must be a bool, got {attrs['enable']!r}")
    nb = attrs.get("num_bits", 8)
    if isinstance(nb, list):
        nb = tuple(nb)
    if isinstance(nb, tuple):
        if nb not in _FLOAT_BITS:
            raise ValueError(f"num_bits={nb} is not a supported float format; use one of {sorted(_FLOAT_BITS)}")
    elif isinstance(nb, bool) or not isinstance(nb, int) or not 1 <= nb <= 32:
        raise ValueError(f"num_bits must be an int in [1, 32] or an (E, M) tuple, got {nb!r}")
    if attrs.get("type", "static") not in ("static", "dynamic"):
        raise ValueError(f"type must be 'static' or 'dynamic', got {attrs['type']!r}")
    if attrs.get("calibrator", "max") not in ("max", "histogram"):
        raise ValueError(f"calibrator must be 'max' or 'histogram', got {attrs['calibrator']!r}")
    bs = attrs.get("block_sizes")
    if bs is not None:
        if not isinstance(bs, Mapping):
            raise TypeError(f"block_sizes must be a dict such as {{-1: 128}}, got {bs!r}")
        for k, v in bs.items():
            if k in ("type", "scale_bits", "scale_block_sizes"):
                continue
            if not isinstance(k, int) or not (v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0)):
                raise ValueError(f"block_sizes maps axes (ints) to positive block sizes or None, got {k!r}: {v!r}")
        if bs.get("type", "static") not in ("static", "dynamic"):
            raise ValueError(f"block_sizes['type'] must be 'static' or 'dynamic', got {bs['type']!r}")
        if bs.get("type") == "dynamic":
            sb = tuple(bs.get("scale_bits", ()))
            if sb not in ((8, 0), (4, 3)):
                raise ValueError(f"dynamic block_sizes need scale_bits (8, 0) (MX) or (4, 3) (NVFP4), got {sb or None}")
    if isinstance(nb, tuple) and nb != (4, 3) and not (bs and bs.get("type") == "dynamic"):
        raise ValueError(f"num_bits={nb} needs dynamic block_sizes (MX or NVFP4); per tensor/channel only (4, 3)")


def _entry(key: Any, value: Any) -> list[dict]:
    """One legacy ``{key: value}`` pair as entries."""
    if key == "default":
        key = "*"
    if isinstance(key, str) and key.startswith("nn."):
        if not isinstance(value, Mapping):
            raise ValueError(f"quant_cfg[{key!r}] must map quantizer names to attributes, got {value!r}")
        out = []
        for name, sub in value.items():
            sub = dict(sub)
            enable = sub.pop("enable", None)
            e = {"parent_class": key, "quantizer_name": name, "cfg": sub or None}
            if enable is not None:
                e["enable"] = enable
            out.append(e)
        return out
    if isinstance(value, Mapping):
        e = {"quantizer_name": key, "cfg": {k: v for k, v in value.items() if k != "enable"} or None}
        if "enable" in value:
            e["enable"] = value["enable"]
        return [e]
    return [{"quantizer_name": key, "cfg": value}]


def normalize_quant_cfg_list(quant_cfg: Any) -> list[dict]:
    """``quant_cfg`` (a list of entries, or the legacy dict) as a list of checked entries with explicit
    ``quantizer_name``, ``cfg`` (None, a dict, or a list of dicts), ``enable`` and ``parent_class``."""
    if isinstance(quant_cfg, Mapping):
        raw: list = [{k: v} for k, v in quant_cfg.items()]
    elif isinstance(quant_cfg, Sequence) and not isinstance(quant_cfg, (str, bytes)):
        raw = list(quant_cfg)
    else:
        raise TypeError(f"quant_cfg must be a list of entries (or the legacy dict), got {type(quant_cfg).__name__}")
    entries: list[dict] = []
    for i, r in enumerate(raw):
        if not isinstance(r, Mapping):
            raise TypeError(f"quant_cfg[{i}] must be a dict, got {r!r}")
        if "quantizer_name" in r:
            unknown = set(r) - {"quantizer_name", "cfg", "enable", "parent_class"}
            if unknown:
                raise ValueError(f"quant_cfg[{i}] has unknown keys {sorted(unknown)}")
            entries.append(dict(r))
        elif len(r) == 1:
            entries.extend(_entry(*next(iter(r.items()))))
        else:
            raise ValueError(f"quant_cfg[{i}] must have a 'quantizer_name' (or be a legacy one-key dict), got {r!r}")
    out = []
    for i, e in enumerate(entries):
        name = e["quantizer_name"]
        if not isinstance(name, str) and not callable(name):
            raise TypeError(f"quant_cfg[{i}]['quantizer_name'] must be a wildcard string, got {name!r}")
        cfg = e.get("cfg")
        if cfg is None and "enable" not in e:
            raise ValueError(f"quant_cfg[{i}] ({name!r}) needs 'cfg', 'enable' or both")
        if isinstance(cfg, Mapping):
            cfg = dict(cfg)
            check_attributes(cfg)
        elif isinstance(cfg, Sequence) and not isinstance(cfg, (str, bytes)):
            cfg = [dict(c) for c in cfg]
            for c in cfg:
                check_attributes(c)
        elif cfg is not None:
            raise TypeError(f"quant_cfg[{i}]['cfg'] must be a dict or a list of dicts, got {cfg!r}")
        enable = e.get("enable", True)
        if not isinstance(enable, bool):
            raise TypeError(f"quant_cfg[{i}]['enable'] must be a bool, got {enable!r}")
        parent = e.get("parent_class")
        if parent is not None and (not isinstance(parent, str) or not parent.startswith("nn.")):
            raise ValueError(f"quant_cfg[{i}]['parent_class'] must name a torch.nn class as 'nn.X', got {parent!r}")
        out.append({"quantizer_name": name, "cfg": cfg, "enable": enable, "parent_class": parent})
    return out


def check_config(config: Any) -> tuple[list[dict], Any]:
    """``(entries, algorithm)`` of a ModelOpt config dict, checked."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict with 'quant_cfg' and 'algorithm' (e.g. mtq.INT8_DEFAULT_CFG), "
                        f"got {type(config).__name__}")
    unknown = set(config) - {"quant_cfg", "algorithm"}
    if unknown:
        raise ValueError(f"config has unknown keys {sorted(unknown)} (expected 'quant_cfg' and 'algorithm')")
    return normalize_quant_cfg_list(config.get("quant_cfg", [])), config.get("algorithm", "max")


# --------------------------------------------------------------------------- named configs (ModelOpt 0.47's)
_OFF_BY_NAME = ("*block_sparse_moe.gate*", "*linear_attn.conv1d*", "*self_attention.conv1d*",
                "*linear_attn.in_proj_a*", "*linear_attn.in_proj_b*", "*lm_head*", "*mixer.conv1d*", "*mlp.gate.*",
                "*mlp.shared_expert_gate.*", "*output_layer*", "*proj_out.*", "*router*", "mtp.*", "output.*",
                "*embed_vision*", "*vision_tower*", "*visual*", "*vision_model*", "*multi_modal_projector*")
_OFF_BY_CLASS = ("nn.BatchNorm1d", "nn.BatchNorm2d", "nn.BatchNorm3d", "nn.LeakyReLU", "nn.Embedding")


def _config(weight: Optional[Any], inputs: Optional[Any], algorithm: Any) -> dict:
    """Everything off, then the weight and input quantizers, then ModelOpt's standard exclusions."""
    cfg: list[dict] = [{"quantizer_name": "*", "enable": False}]
    for name, c in (("*weight_quantizer", weight), ("*input_quantizer", inputs)):
        cfg.append({"quantizer_name": name, "cfg": copy.deepcopy(c)} if c is not None else
                   {"quantizer_name": name, "enable": False})
    cfg += [{"quantizer_name": n, "enable": False} for n in _OFF_BY_NAME]
    cfg += [{"quantizer_name": "*", "parent_class": c, "enable": False} for c in _OFF_BY_CLASS]
    return {"quant_cfg": cfg, "algorithm": algorithm}


_INT8_W = {"num_bits": 8, "axis": 0}
_INT8_A = {"num_bits": 8, "axis": None}
_FP8 = {"num_bits": (4, 3), "axis": None}
_INT4_BLOCK = {"num_bits": 4, "block_sizes": {-1: 128, "type": "static"}}


def _mx(num_bits: NumBits) -> dict:
    return {"num_bits": num_bits, "block_sizes": {-1: 32, "type": "dynamic", "scale_bits": (8, 0)}}


_NVFP4 = {"num_bits": (2, 1), "effective_bits": 4.5, "block_sizes": {-1: 16, "type": "dynamic",
                                                                     "scale_bits": (4, 3)}}

#: W8A8: int8 weights per output channel, int8 activations per tensor, max calibration.
INT8_DEFAULT_CFG = _config(_INT8_W, _INT8_A, "max")
#: int8 weights per output channel, activations in float, max calibration.
INT8_WEIGHT_ONLY_CFG = _config(_INT8_W, None, "max")
#: W8A8 with SmoothQuant: per-channel smoothing factors moved from activations into weights before max calibration.
INT8_SMOOTHQUANT_CFG = _config(_INT8_W, _INT8_A, "smoothquant")
#: FP8 e4m3 weights and activations, one scale per tensor, max calibration.
FP8_DEFAULT_CFG = _config(_FP8, _FP8, "max")
#: int4 weights in blocks of 128 along the input dimension, activations in float, max calibration.
INT4_BLOCKWISE_WEIGHT_ONLY_CFG = _config(_INT4_BLOCK, None, "max")
#: int4 weights in blocks of 128 with AWQ-lite scale search (alpha step 0.1), activations in float.
INT4_AWQ_CFG = _config(_INT4_BLOCK, None, {"method": "awq_lite", "alpha_step": 0.1})
#: int4 blocks of 128 then FP8 on weights, FP8 activations, AWQ-lite.
W4A8_AWQ_BETA_CFG = _config([_INT4_BLOCK, _FP8], _FP8, "awq_lite")
#: MXFP8: e4m3 elements in blocks of 32 with an e8m0 (power of two) scale, weights and activations.
MXFP8_DEFAULT_CFG = _config(_mx((4, 3)), _mx((4, 3)), None)
#: MXFP4: e2m1 elements in blocks of 32 with an e8m0 scale, weights and activations.
MXFP4_DEFAULT_CFG = _config(_mx((2, 1)), _mx((2, 1)), None)
#: MXINT8: int8 elements in blocks of 32 with an e8m0 scale, weights and activations.
MXINT8_DEFAULT_CFG = _config(_mx(8), _mx(8), None)
#: NVFP4: e2m1 elements in blocks of 16 with an e4m3 scale, weights and activations.
NVFP4_DEFAULT_CFG = _config(_NVFP4, _NVFP4, "max")
#: NVFP4 weights, activations in float.
W4A16_NVFP4_CFG = _config(_NVFP4, None, "max")

#: every named config, by name
choices: dict[str, dict] = {name: globals()[name] for name in __all__ if name.endswith("_CFG")}
