"""safetensors files of quantized state dicts: flat tensors plus a JSON map, no pickle.

``save_quantized(state_dict, path)`` writes every plain tensor under its own
key and every :class:`~quanta.dtypes.AffineQuantizedTensor` /
:class:`~quanta.dtypes.LinearActivationQuantizedTensor` /
:class:`~quanta.dtypes.WeightTensorWithLinearActivationScaleMetadata` /
:class:`~quanta.dtypes.MXTensor` / :class:`~quanta.dtypes.NVFP4Tensor` as its storage tensors
under ``"<key>::<field>"``, with a description (layout, block size, shape, code
range, zero-point domain, dtype) in the file's ``"quanta"`` metadata entry,
JSON. ``load_quantized(path)`` rebuilds the state dict: the JSON is parsed
against a fixed set of classes and fields (nothing is imported or executed
from the file), and every storage tensor is checked against the description,
so a malformed file raises ``ValueError`` naming the key instead of producing a
tensor that reads out of bounds later. Writes go to a temporary file that
replaces ``path`` only when complete, so a failed save leaves the old file.

>>> import os, tempfile
>>> import torch
>>> from quanta.quantization import quantize_, Int8WeightOnlyConfig
>>> model = torch.nn.Linear(32, 16)
>>> _ = quantize_(model, Int8WeightOnlyConfig())
>>> path = os.path.join(tempfile.mkdtemp(), "model.safetensors")
>>> save_quantized(model.state_dict(), path)
>>> fresh = torch.nn.Linear(32, 16)
>>> _ = fresh.load_state_dict(load_quantized(path), assign=True)
>>> x = torch.randn(2, 32)
>>> torch.equal(fresh(x), model(x))
True
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping

import torch

from quanta._files import atomic_write
from quanta.dtypes.activation_scale import WeightTensorWithLinearActivationScaleMetadata
from quanta.dtypes.affine_quantized_tensor import AffineQuantizedTensor
from quanta.dtypes.layouts import (
    Float8Layout,
    FloatxTensorCoreLayout,
    Int4CPULayout,
    Layout,
    PlainLayout,
    UintxLayout,
)
from quanta.dtypes.linear_activation import LinearActivationQuantizedTensor
from quanta.dtypes.mx_tensor import MXTensor, QuantizeTensorToMXKwargs
from quanta.dtypes.nvfp4_tensor import NVFP4Tensor, QuantizeTensorToNVFP4Kwargs
from quanta.grids.block_scaled import MX_FORMATS, ScaleCalculationMode
from quanta.dtypes.tensor_impl import (
    AQTTensorImpl,
    Float8AQTTensorImpl,
    FloatxAQTTensorImpl,
    Int4CPUAQTTensorImpl,
    PlainAQTTensorImpl,
    UintxAQTTensorImpl,
)
from quanta.encodings.torchao import MappingType, ZeroPointDomain, _get_and_check_qmin_qmax

__all__ = ["save_quantized", "load_quantized", "FORMAT_VERSION"]

FORMAT_VERSION = 1
_SEP = "::"
_QUANTIZED = (AffineQuantizedTensor, LinearActivationQuantizedTensor, WeightTensorWithLinearActivationScaleMetadata,
              MXTensor, NVFP4Tensor)
_ELEM_NAMES = {(k if isinstance(k, str) else str(k).removeprefix("torch.")): k for k in MX_FORMATS}
_LAYOUTS: dict[str, type[Layout]] = {c.__name__: c for c in (PlainLayout, UintxLayout, Float8Layout,
                                                             FloatxTensorCoreLayout, Int4CPULayout)}
_IMPLS: dict[str, type[AQTTensorImpl]] = {c.__name__: c for c in (PlainAQTTensorImpl, UintxAQTTensorImpl,
                                                                   Float8AQTTensorImpl, FloatxAQTTensorImpl,
                                                                   Int4CPUAQTTensorImpl)}
# the non-tensor attributes each impl may carry, with their JSON types
_IMPL_STATE: dict[str, dict[str, type]] = {
    "PlainAQTTensorImpl": {},
    "UintxAQTTensorImpl": {"last_dim": int},
    "Float8AQTTensorImpl": {},
    "FloatxAQTTensorImpl": {"last_dim": int},
    "Int4CPUAQTTensorImpl": {"storage_shape": list, "group_size": int},
}
_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32,
    torch.int64, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz,
    *(getattr(torch, f"uint{b}") for b in range(1, 8)), *(getattr(torch, f"int{b}") for b in range(1, 8)))}


def _safetensors():
    try:
        import safetensors.torch as st
    except ImportError:  # pragma: no cover - exercised only without the extra
        raise ImportError("safetensors is needed for this: pip install 'quanta[safetensors]'") from None
    return st


# --------------------------------------------------------------------------- save
def _layout_json(layout: Layout) -> dict[str, Any]:
    out: dict[str, Any] = {"type": type(layout).__name__}
    for k, v in vars(layout).items():
        if k == "mm_config":
            continue
        out[k] = str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v
    return out


def _aqt_json(key: str, t: AffineQuantizedTensor, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    impl = t.tensor_impl
    stored, state = impl.portable()
    state = {k: list(v) if isinstance(v, tuple) else v for k, v in state.items()
             if k not in ("_layout", "transposed")}
    for name, v in stored.items():
        tensors[f"{key}{_SEP}{name}"] = v.contiguous()
    return {
        "type": "AffineQuantizedTensor",
        "impl": type(impl).__name__,
        "layout": _layout_json(impl.get_layout()),
        "transposed": impl.transposed,
        "state": state,
        "tensors": sorted(stored),
        "block_size": list(t.block_size),
        "shape": list(t.shape),
        "quant_min": t.quant_min,
        "quant_max": t.quant_max,
        "zero_point_domain": t.zero_point_domain.name,
        "dtype": str(t.dtype).removeprefix("torch."),
    }


def save_quantized(state_dict: Mapping[str, torch.Tensor], path: str | os.PathLike,
                   metadata: Mapping[str, str] | None = None) -> None:
    """Write ``state_dict`` (plain and quantized tensors) to a safetensors file at ``path``, atomically.

    ``metadata``: extra string entries for the file header (the key ``"quanta"`` is reserved).
    """
    st = _safetensors()
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict must be a mapping of names to tensors, got {type(state_dict).__name__}")
    extra = dict(metadata or {})
    if "quanta" in extra or not all(isinstance(k, str) and isinstance(v, str) for k, v in extra.items()):
        raise ValueError("metadata must map str to str and must not use the reserved key 'quanta'")
    tensors: dict[str, torch.Tensor] = {}
    described: dict[str, Any] = {}
    for key, t in state_dict.items():
        if not isinstance(key, str) or _SEP in key:
            raise ValueError(f"state_dict key {key!r} must be a str without {_SEP!r}")
        if isinstance(t, _QUANTIZED):
            described[key] = _describe(key, t, tensors)
        elif isinstance(t, torch.Tensor):
            tensors[key] = t.detach().contiguous()
        else:
            raise TypeError(f"state_dict[{key!r}] is a {type(t).__name__}, not a tensor")
    header = {"format": "quanta", "version": str(FORMAT_VERSION), "quanta": json.dumps(described), **extra}
    atomic_write(path, lambda tmp: st.save_file(tensors, tmp, metadata=header))


def _block_scaled_json(key: str, t: torch.Tensor, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """MXTensor / NVFP4Tensor: codes and scales (float8 scales as their bytes), attributes as JSON."""
    names = t._tensor_names()
    for name in names:
        v = getattr(t, name).detach().contiguous()
        tensors[f"{key}{_SEP}{name}"] = v.view(torch.uint8) if name == "scale" else v
    out: dict[str, Any] = {"type": type(t).__name__, "tensors": names, "block_size": t.block_size,
                           "shape": list(t.shape), "orig_dtype": str(t.orig_dtype).removeprefix("torch.")}
    k = t.act_quant_kwargs
    if isinstance(t, MXTensor):
        out["elem_dtype"] = t.elem_dtype if isinstance(t.elem_dtype, str) else str(t.elem_dtype).removeprefix("torch.")
        out["act_quant_kwargs"] = None if k is None else {
            "elem_dtype": k.elem_dtype if isinstance(k.elem_dtype, str) else str(k.elem_dtype).removeprefix("torch."),
            "block_size": k.block_size, "scaling_mode": k.scaling_mode.value}
    else:
        out["act_quant_kwargs"] = None if k is None else {
            "use_dynamic_per_tensor_scale": k.use_dynamic_per_tensor_scale}
    return out


def _describe(key: str, t: torch.Tensor, tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The JSON description of a quantized tensor; its storage tensors go into ``tensors`` under ``key::...``."""
    if isinstance(t, (MXTensor, NVFP4Tensor)):
        return _block_scaled_json(key, t, tensors)
    if isinstance(t, WeightTensorWithLinearActivationScaleMetadata):
        tensors[f"{key}{_SEP}activation_scale"] = t.scale.detach().contiguous()
        return {"type": "WeightTensorWithLinearActivationScaleMetadata",
                "weight": _describe(f"{key}{_SEP}weight", t.original_weight_tensor, tensors)}
    if isinstance(t, LinearActivationQuantizedTensor):
        desc = {"type": "LinearActivationQuantizedTensor", "act_mapping_type": t.act_mapping_type.name,
                "transposed": t.transposed, "weight": _aqt_json(f"{key}{_SEP}weight", t.original_weight_tensor,
                                                                tensors)}
        if t.weight_col_sums is not None:
            tensors[f"{key}{_SEP}weight_col_sums"] = t.weight_col_sums.contiguous()
        return desc
    return _aqt_json(key, t, tensors)


# --------------------------------------------------------------------------- load
def _field(d: Mapping[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in d:
        raise ValueError(f"{where}: missing field {name!r}")
    v = d[name]
    if isinstance(v, bool) and kind in (int, (int, type(None))):
        raise ValueError(f"{where}: field {name!r} must be {kind}, got {v!r}")
    if not isinstance(v, kind):
        raise ValueError(f"{where}: field {name!r} must be {kind}, got {v!r}")
    return v


def _int_list(v: Any, name: str, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in v):
        raise ValueError(f"{where}: field {name!r} must be a list of non-negative ints, got {v!r}")
    return tuple(v)


def _dtype(name: Any, where: str) -> torch.dtype:
    if not isinstance(name, str) or name not in _DTYPES:
        raise ValueError(f"{where}: unknown dtype {name!r}")
    return _DTYPES[name]


def _layout_from(d: Any, where: str) -> Layout:
    if not isinstance(d, dict):
        raise ValueError(f"{where}: layout must be an object, got {d!r}")
    kind = d.get("type")
    if not isinstance(kind, str) or kind not in _LAYOUTS:
        raise ValueError(f"{where}: unknown layout {kind!r} (known: {sorted(_LAYOUTS)})")
    args = {k: v for k, v in d.items() if k != "type"}
    try:
        if kind == "UintxLayout":
            return UintxLayout(_dtype(args.get("dtype"), where), _field(args, "pack_dim", int, where))
        if kind == "FloatxTensorCoreLayout":
            return FloatxTensorCoreLayout(_field(args, "ebits", int, where), _field(args, "mbits", int, where))
    except TypeError as e:
        raise ValueError(f"{where}: {e}") from None
    if args:
        raise ValueError(f"{where}: layout {kind} takes no fields, got {sorted(args)}")
    return _LAYOUTS[kind]()


def _stored(key: str, names: list[str], tensors: dict[str, torch.Tensor], used: set[str], where: str
            ) -> dict[str, torch.Tensor]:
    """The storage tensors ``key::name`` of a described tensor, marked as used (``ValueError`` if one is missing)."""
    inner: dict[str, torch.Tensor] = {}
    for n in names:
        full = f"{key}{_SEP}{n}"
        if full not in tensors:
            raise ValueError(f"{where}: tensor {full!r} is missing from the file")
        inner[n] = tensors[full]
        used.add(full)
    return inner


def _aqt_from(key: str, d: Any, tensors: dict[str, torch.Tensor], used: set[str]) -> AffineQuantizedTensor:
    where = f"tensor {key!r}"
    if not isinstance(d, dict) or d.get("type") != "AffineQuantizedTensor":
        raise ValueError(f"{where}: expected an AffineQuantizedTensor description, got {d!r:.200}")
    impl_name = _field(d, "impl", str, where)
    if impl_name not in _IMPLS:
        raise ValueError(f"{where}: unknown storage {impl_name!r}")
    impl_cls = _IMPLS[impl_name]
    layout = _layout_from(d.get("layout"), where)
    if not isinstance(layout, impl_cls.layout_type):
        raise ValueError(f"{where}: layout {layout} does not belong to {impl_name}")
    state = _field(d, "state", dict, where)
    allowed = _IMPL_STATE[impl_name]
    if set(state) != set(allowed):
        raise ValueError(f"{where}: storage state must have fields {sorted(allowed)}, got {sorted(state)}")
    for k, kind in allowed.items():
        _field(state, k, kind, where)
    names = _field(d, "tensors", list, where)
    if not all(isinstance(n, str) for n in names):
        raise ValueError(f"{where}: field 'tensors' must be a list of names, got {names!r:.200}")
    if not set(names) <= set(impl_cls.portable_names()):
        raise ValueError(f"{where}: unknown storage tensors {sorted(set(names) - set(impl_cls.portable_names()))}")
    inner = _stored(key, names, tensors, used, where)
    state = {k: tuple(v) if isinstance(v, list) else v for k, v in state.items()}
    state.update(_layout=layout, transposed=_field(d, "transposed", bool, where))
    try:
        impl = impl_cls.from_portable(inner, state)
    except (TypeError, ValueError, KeyError) as e:
        raise ValueError(f"{where}: {e}") from None
    shape = _int_list(d.get("shape"), "shape", where)
    block = _int_list(d.get("block_size"), "block_size", where)
    if len(block) != len(shape) or any(b < 1 or s % b for s, b in zip(shape, block)):
        raise ValueError(f"{where}: block_size {block} does not tile shape {shape}")
    if impl.transposed and len(shape) != 2:
        raise ValueError(f"{where}: only 2-D tensors can be stored transposed, got shape {shape}")
    storage_shape = shape[::-1] if impl.transposed else shape
    storage_block = block[::-1] if impl.transposed else block
    try:
        impl.validate(storage_shape, storage_block)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    _check_qparam_values(inner, isinstance(impl, Float8AQTTensorImpl), where)
    qmin = _field(d, "quant_min", (int, type(None)), where)
    qmax = _field(d, "quant_max", (int, type(None)), where)
    domain = _field(d, "zero_point_domain", str, where)
    if domain not in ZeroPointDomain.__members__:
        raise ValueError(f"{where}: unknown zero_point_domain {domain!r}")
    dtype = _dtype(d.get("dtype"), where)
    code_dtype = _code_dtype(impl)
    if code_dtype is not None:  # dequantize checks the code range against the codes' dtype: check it here
        try:
            _get_and_check_qmin_qmax(code_dtype, qmin, qmax)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: quant_min/quant_max: {e}") from None
    try:
        return AffineQuantizedTensor(impl, block, torch.Size(shape), qmin, qmax, ZeroPointDomain[domain], dtype=dtype)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def _check_qparam_values(inner: Mapping[str, torch.Tensor], zero_scale_ok: bool, where: str) -> None:
    """What ``dequantize()`` requires of the stored values, checked at load: scales positive (float8: or zero)
    and finite, floating-point zero points finite."""
    scale = inner.get("scale")
    if scale is not None and scale.is_floating_point():
        ok = ((scale >= 0) if zero_scale_ok else (scale > 0)) & (scale < float("inf"))  # NaN fails both
        if not bool(ok.all()):
            raise ValueError(f"{where}: scale must be {'>= 0' if zero_scale_ok else 'positive'} and finite; "
                             f"{int((~ok).sum())} of its {scale.numel()} entries are not")
    for name in ("zero_point", "zero"):
        zero = inner.get(name)
        if zero is not None and zero.is_floating_point() and not bool(torch.isfinite(zero).all()):
            raise ValueError(f"{where}: {name} must be finite (not NaN or inf)")


def _code_dtype(impl: AQTTensorImpl) -> torch.dtype | None:
    """The dtype of ``impl.storage_plain()``'s integer codes, without unpacking them (None for float formats)."""
    if isinstance(impl, PlainAQTTensorImpl):
        return impl.int_data.dtype
    if isinstance(impl, UintxAQTTensorImpl):
        return torch.int8 if impl.get_layout().signed else torch.uint8
    if isinstance(impl, Int4CPUAQTTensorImpl):
        return torch.int32
    return None


def _elem(name: Any, where: str) -> Any:
    if not isinstance(name, str) or name not in _ELEM_NAMES:
        raise ValueError(f"{where}: unknown elem_dtype {name!r} (known: {sorted(_ELEM_NAMES)})")
    return _ELEM_NAMES[name]


def _block_scaled_from(key: str, d: dict, tensors: dict[str, torch.Tensor], used: set[str]) -> torch.Tensor:
    where = f"tensor {key!r}"
    kind = d["type"]
    optional = ("per_tensor_scale", "act_per_tensor_scale") if kind == "NVFP4Tensor" else ()
    names = _field(d, "tensors", list, where)
    if not {"qdata", "scale"} <= set(names) or not set(names) <= {"qdata", "scale", *optional}:
        raise ValueError(f"{where}: field 'tensors' must name qdata and scale (NVFP4Tensor: and optional "
                         f"per_tensor_scale, act_per_tensor_scale), got {names!r:.200}")
    inner = _stored(key, names, tensors, used, where)
    if inner["scale"].dtype != torch.uint8:
        raise ValueError(f"{where}: the scale must be stored as uint8 bytes, got {inner['scale'].dtype}")
    block = _field(d, "block_size", int, where)
    orig = _dtype(d.get("orig_dtype"), where)
    act = d.get("act_quant_kwargs")
    if act is not None and not isinstance(act, dict):
        raise ValueError(f"{where}: act_quant_kwargs must be an object or null, got {act!r:.100}")
    try:
        if kind == "MXTensor":
            elem = _elem(d.get("elem_dtype"), where)
            kwargs = None
            if act is not None:
                mode = _field(act, "scaling_mode", str, where)
                if mode not in {m.value for m in ScaleCalculationMode}:
                    raise ValueError(f"unknown scaling_mode {mode!r}")
                kwargs = QuantizeTensorToMXKwargs(_elem(act.get("elem_dtype"), where),
                                                  _field(act, "block_size", int, where), ScaleCalculationMode(mode))
            t = MXTensor(inner["qdata"], inner["scale"], elem, block, orig, None, kwargs)
        else:
            kwargs = None if act is None else QuantizeTensorToNVFP4Kwargs(
                use_dynamic_per_tensor_scale=_field(act, "use_dynamic_per_tensor_scale", bool, where))
            scale = inner["scale"].view(torch.float8_e4m3fn)
            t = NVFP4Tensor(inner["qdata"], scale, block, orig, inner.get("per_tensor_scale"),
                            inner.get("act_per_tensor_scale"), act_quant_kwargs=kwargs)
    except (TypeError, ValueError) as e:
        msg = str(e)
        raise ValueError(msg if msg.startswith(where) else f"{where}: {msg}") from None
    if tuple(t.shape) != _int_list(d.get("shape"), "shape", where):
        raise ValueError(f"{where}: shape {d.get('shape')} does not match the stored codes {list(t.shape)}")
    return t


def _tensor_from(key: str, d: Any, tensors: dict[str, torch.Tensor], used: set[str]) -> torch.Tensor:
    """The quantized tensor ``key`` described by ``d`` (the inverse of :func:`_describe`)."""
    where = f"tensor {key!r}"
    kind = d.get("type") if isinstance(d, dict) else None
    if kind in ("MXTensor", "NVFP4Tensor"):
        return _block_scaled_from(key, d, tensors, used)
    if kind == "WeightTensorWithLinearActivationScaleMetadata":
        inner = d.get("weight")
        if not isinstance(inner, dict) or inner.get("type") == kind:
            raise ValueError(f"{where}: 'weight' must describe an AffineQuantizedTensor or a "
                             "LinearActivationQuantizedTensor")
        weight = _tensor_from(f"{key}{_SEP}weight", inner, tensors, used)
        scale = tensors.get(f"{key}{_SEP}activation_scale")
        if scale is None:
            raise ValueError(f"{where}: the activation_scale tensor is missing")
        used.add(f"{key}{_SEP}activation_scale")
        try:
            return WeightTensorWithLinearActivationScaleMetadata(weight, scale)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
    if kind == "LinearActivationQuantizedTensor":
        act = _field(d, "act_mapping_type", str, where)
        if act not in ("SYMMETRIC", "ASYMMETRIC"):
            raise ValueError(f"{where}: act_mapping_type must be SYMMETRIC or ASYMMETRIC, got {act!r}")
        weight = _aqt_from(f"{key}{_SEP}weight", d.get("weight"), tensors, used)
        sums = tensors.get(f"{key}{_SEP}weight_col_sums")
        if sums is not None:
            used.add(f"{key}{_SEP}weight_col_sums")
            if tuple(sums.shape) != (weight.shape[0],) or sums.dtype != torch.int32:
                raise ValueError(f"{where}: weight_col_sums must be int32 of shape ({weight.shape[0]},)")
        try:
            return LinearActivationQuantizedTensor(weight, MappingType[act], sums,
                                                   transposed=_field(d, "transposed", bool, where))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None
    return _aqt_from(key, d, tensors, used)


def load_quantized(path: str | os.PathLike, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The state dict saved by :func:`save_quantized` (load it with ``load_state_dict(sd, assign=True)``).

    Raises ``ValueError`` for a file that is not a valid quanta safetensors file,
    naming the offending key.
    """
    _safetensors()
    from safetensors import safe_open

    path = os.fspath(path)
    try:
        with safe_open(path, framework="pt", device=str(device)) as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (OSError, FileNotFoundError):
        raise
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise ValueError(f"{path}: not a readable safetensors file ({e})") from None
    if header.get("format") != "quanta":
        raise ValueError(f"{path}: not a quanta file (header 'format' is {header.get('format')!r})")
    if header.get("version") != str(FORMAT_VERSION):
        raise ValueError(f"{path}: quanta format version {header.get('version')!r}, this quanta reads "
                         f"{FORMAT_VERSION}")
    try:
        described = json.loads(header.get("quanta", ""))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: the 'quanta' metadata entry is not valid JSON ({e})") from None
    if not isinstance(described, dict):
        raise ValueError(f"{path}: the 'quanta' metadata entry must be a JSON object")
    out: dict[str, torch.Tensor] = {}
    used: set[str] = set()
    for key, d in described.items():
        out[key] = _tensor_from(key, d, tensors, used)
    for k, t in tensors.items():
        if k in used:
            continue
        if k in out:
            raise ValueError(f"{path}: tensor {k!r} is stored both plain and as a described quantized tensor")
        if _SEP in k:
            raise ValueError(f"{path}: tensor {k!r} belongs to no described quantized tensor")
        out[k] = t
    return out
