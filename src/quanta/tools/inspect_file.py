"""``quanta inspect``: what an encodings, ONNX or safetensors file holds.

The type is told by content, not by the file name:

* JSON with ``"format": "quanta.quantsim.encodings"``: quanta's own encodings
  (``QuantizationSimModel.save_encodings(path)``); JSON with ``"version"`` 0.6.1, 1.0.0 or 2.0.0:
  an AIMET encodings file (read and validated by :func:`quanta.export.encodings.read_encodings`).
  Per tensor: name, dtype and bitwidth, symmetric, granularity (per-tensor, per-channel with its
  axis, per-block with its size), number of scales; then counts.
* 8 bytes of header length, then a JSON header: safetensors. Per tensor: name, dtype, shape, bytes;
  the quantized entries that quanta's ``"quanta"`` metadata describes
  (:func:`quanta.dtypes.serialization.save_quantized`: layout, bits, block size) and the weight
  encodings ``quanta quantize`` writes under ``"quanta.encodings"``.
* a protobuf ``ModelProto``: ONNX (needs the ``onnx`` package). Opset, inputs and outputs with shapes,
  QuantizeLinear/DequantizeLinear counts, every quantized tensor with its zero-point dtype
  (int8, uint8, int4, float8e4m3fn, ...) and granularity (axis, block_size), initializer bytes by dtype.

Nothing in a file is executed: JSON is read with :mod:`json`, a safetensors header is parsed by hand
(no tensor is loaded), ONNX with ``onnx.load(load_external_data=False)`` (external files are neither
opened nor followed). Anything else raises ValueError "not an encodings, ONNX or safetensors file".

>>> import json, os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "w.encodings")
>>> doc = {"version": "1.0.0", "activation_encodings": [], "param_encodings": [
...     {"name": "fc.weight", "dtype": "INT", "enc_type": "PER_CHANNEL", "bw": 4, "is_sym": True,
...      "scale": [0.5, 0.25], "offset": [-8, -8]}]}
>>> with open(path, "w") as f:
...     json.dump(doc, f)
>>> report = inspect_file(path)
>>> report["type"], report["tensors"][0]["granularity"], report["tensors"][0]["num_scales"]
('encodings', 'per-channel', 2)
>>> print(format_report(report).splitlines()[0])
AIMET encodings file, version 1.0.0: 1 tensors (0 activations, 1 params)
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections import Counter
from typing import Any

__all__ = ["inspect_file", "format_report", "NOT_RECOGNISED"]

NOT_RECOGNISED = "not an encodings, ONNX or safetensors file"
_QUANTA_FORMAT = "quanta.quantsim.encodings"
_WEIGHTS_KEY = "quanta.encodings"  # weight_files.WEIGHTS_METADATA_KEY, repeated: that module imports torch
_MAX_SAFETENSORS_HEADER = 100_000_000  # safetensors' own limit


def inspect_file(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON-ready summary of the file at ``path`` (its ``"type"`` is ``encodings``, ``onnx`` or ``safetensors``).

    Raises FileNotFoundError for a missing file and ValueError for a file of another kind or a corrupt one.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"file not found: {path}")
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory; {NOT_RECOGNISED}")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(64)
    if not head:
        raise ValueError(f"{path} is empty; {NOT_RECOGNISED}")
    header = _safetensors_header(path, size, head)  # first: its 8-byte length may happen to start with "{"
    if header is not None:
        return _inspect_safetensors(path, size, header)
    if head.lstrip()[:1] in (b"{", b"["):
        return _inspect_json(path, size)
    if head[:4] == b"PK\x03\x04":
        raise ValueError(f"{path}: {NOT_RECOGNISED} (a zip archive: a PyTorch checkpoint or torch.export program?)")
    if head[:6] == b"\x93NUMPY":
        raise ValueError(f"{path}: {NOT_RECOGNISED} (a numpy .npy array)")
    return _inspect_onnx(path, size)


# ============================================================================ encodings
def _inspect_json(path: str, size: int) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: {NOT_RECOGNISED} (invalid JSON: {e})") from None
    if isinstance(doc, dict) and doc.get("format") == _QUANTA_FORMAT:
        tensors = _quanta_entries(path, doc)
        report = {"file": path, "type": "encodings", "format": "quanta", "version": str(doc.get("version")),
                  "file_bytes": size, "tensors": tensors}
    elif isinstance(doc, dict) and "version" in doc and ("encodings" in doc or "param_encodings" in doc
                                                         or "activation_encodings" in doc):
        from quanta.export.encodings import read_encodings

        try:
            parsed = read_encodings(doc)
        except ValueError as e:
            raise ValueError(f"{path}: a corrupt AIMET encodings file: {e}") from None
        tensors = [_aimet_entry(fe, kind) for kind, group in (("activation", parsed.activations),
                                                              ("param", parsed.params)) for fe in group.values()]
        if parsed.version.value == "2.0.0":  # one list: activations and parameters are not told apart
            for t in tensors:
                t["kind"] = "tensor"
        report = {"file": path, "type": "encodings", "format": "aimet", "version": parsed.version.value,
                  "file_bytes": size, "tensors": tensors, "excluded_layers": list(parsed.excluded_layers)}
    else:
        raise ValueError(f"{path}: {NOT_RECOGNISED} (JSON, but neither AIMET encodings with a 'version' key nor "
                         f"quanta's format {_QUANTA_FORMAT!r})")
    report["summary"] = _encodings_summary(report["tensors"])
    return report


def _granularity(kind: str, axis: int | None, block_size: int | None, block_axis: int | None = None) -> dict[str, Any]:
    return {"granularity": kind, "axis": axis if kind != "per-block" else block_axis, "block_size": block_size}


def _aimet_entry(fe: Any, kind: str) -> dict[str, Any]:
    from quanta.export.encodings import EncodingDtype, Granularity

    if fe.float_format is not None:
        dtype = fe.float_format.name()
    elif fe.dtype is EncodingDtype.FLOAT:
        dtype = "float"
    elif fe.signed is not None:
        dtype = "int" if fe.signed else "uint"
    else:
        dtype = "int"  # 0.6.1 / 1.0.0 do not store signedness
    symmetric = fe.symmetric
    if symmetric is None and fe.offset is not None and fe.signed is not None:  # 2.0.0: zero points all 0, signed
        symmetric = bool(fe.signed and not bool(fe.offset.any()))
    n = fe.scale.numel() if fe.scale is not None else 0
    g = fe.granularity
    if g is Granularity.PER_BLOCK:
        gran = _granularity("per-block", None, fe.block_size, fe.axis)
    elif g is Granularity.PER_CHANNEL:
        gran = _granularity("per-channel", fe.axis, None)
    else:
        gran = _granularity("per-tensor", None, None)
    return {"name": fe.name, "kind": kind, "dtype": dtype, "bitwidth": fe.bitwidth, "symmetric": symmetric,
            **gran, "num_scales": n}


def _quanta_entries(path: str, doc: dict[str, Any]) -> list[dict[str, Any]]:
    import torch

    from quanta.encodings.affine import AffineEncoding
    from quanta.encodings.float import FloatEncoding

    entries = doc.get("quantizers")
    if not isinstance(entries, dict):
        raise ValueError(f"{path}: a corrupt quanta encodings file: 'quantizers' must be an object")
    out = []
    for name, entry in entries.items():
        if not isinstance(entry, dict) or entry.get("type") not in ("affine", "float"):
            raise ValueError(f"{path}: a corrupt quanta encodings file: quantizers[{name!r}] needs 'type' "
                             "'affine' or 'float'")
        body = {k: v for k, v in entry.items() if k != "type"}
        try:
            enc: Any = AffineEncoding.from_dict(body) if entry["type"] == "affine" else FloatEncoding.from_dict(body)
        except (TypeError, ValueError, KeyError) as e:
            raise ValueError(f"{path}: a corrupt quanta encodings file: quantizers[{name!r}]: {e}") from None
        scale_shape = tuple(enc.scale.shape)
        block = enc.block_size
        blocked = [d for d, b in enumerate(block or ()) if b not in (1, -1)]
        varying = [d for d, s in enumerate(scale_shape) if s > 1]
        if enc.scale.numel() == 1:
            gran = _granularity("per-tensor", None, None)
        elif blocked:
            gran = _granularity("per-block", None, int(block[blocked[0]]), blocked[0])  # type: ignore[index]
        else:
            gran = _granularity("per-channel", varying[0] if len(varying) == 1 else None, None)
        kind = "param" if ".param_quantizers." in f".{name}" else "activation"
        if isinstance(enc, FloatEncoding):
            dtype, bits, symmetric = enc.format.name(), enc.format.bits, True
        else:
            dtype = "int" if enc.qmin < 0 else "uint"
            bits = enc.grid.bitwidth
            want = -round((enc.qmin + enc.qmax) / 2)
            symmetric = bool((torch.broadcast_to(enc.offset, enc.scale.shape) == want).all())
        out.append({"name": name, "kind": kind, "dtype": dtype, "bitwidth": bits, "symmetric": symmetric, **gran,
                    "num_scales": int(enc.scale.numel())})
    return out


def _encodings_summary(tensors: list[dict[str, Any]]) -> dict[str, Any]:
    kinds = Counter(t["kind"] for t in tensors)
    return {
        "tensors": len(tensors),
        "activations": kinds.get("activation", 0),
        "params": kinds.get("param", 0),
        "granularity": dict(Counter(t["granularity"] for t in tensors)),
        "dtypes": dict(Counter(f"{t['dtype']}{t['bitwidth']}" if t["dtype"] in ("int", "uint") else t["dtype"]
                               for t in tensors)),
        "scales": sum(t["num_scales"] for t in tensors),
    }


# ============================================================================ safetensors
_ST_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
              "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16",
              "U8": "uint8", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
              "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
              "F4": "float4_e2m1fn_x2", "F6_E2M3": "float6_e2m3", "F6_E3M2": "float6_e3m2", "C64": "complex64"}


def _safetensors_header(path: str, size: int, head: bytes) -> dict[str, Any] | None:
    """The parsed header if the file is a well-formed safetensors file, else None."""
    if size < 10 or len(head) < 10:
        return None
    (n,) = struct.unpack("<Q", head[:8])
    if not 2 <= n <= _MAX_SAFETENSORS_HEADER or head[8:9] != b"{":
        return None
    if n > size - 8:
        raise ValueError(f"{path}: a truncated safetensors file (header of {n} bytes, file of {size})")
    with open(path, "rb") as f:
        f.seek(8)
        raw = f.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(header, dict):
        return None
    data_bytes = size - 8 - n
    for key, entry in header.items():
        if key == "__metadata__":
            if not isinstance(entry, dict):
                return None
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str) \
                or not isinstance(entry.get("shape"), list) or not isinstance(entry.get("data_offsets"), list):
            return None
        offsets = entry["data_offsets"]
        if len(offsets) != 2 or not all(isinstance(o, int) for o in offsets) or \
                not 0 <= offsets[0] <= offsets[1] <= data_bytes:
            raise ValueError(f"{path}: a corrupt safetensors file: tensor {key!r} has data_offsets {offsets} "
                             f"outside the {data_bytes} data bytes")
    return header


def _inspect_safetensors(path: str, size: int, header: dict[str, Any]) -> dict[str, Any]:
    meta = header.get("__metadata__") or {}
    tensors = []
    by_dtype: Counter = Counter()
    for name in sorted(k for k in header if k != "__metadata__"):
        entry = header[name]
        nbytes = entry["data_offsets"][1] - entry["data_offsets"][0]
        dtype = _ST_DTYPES.get(entry["dtype"], entry["dtype"].lower())
        tensors.append({"name": name, "dtype": dtype, "shape": list(entry["shape"]), "bytes": nbytes})
        by_dtype[dtype] += nbytes
    report: dict[str, Any] = {"file": path, "type": "safetensors", "file_bytes": size, "tensors": tensors,
                              "bytes_by_dtype": dict(by_dtype), "metadata_keys": sorted(meta)}
    if meta.get("format") == "quanta" and "quanta" in meta:
        report["quanta_version"] = meta.get("version")
        report["quantized"] = _quanta_described(path, meta["quanta"])
    if _WEIGHTS_KEY in meta:
        report["weight_encodings"] = _weight_encodings(path, meta[_WEIGHTS_KEY])
    report["summary"] = {"tensors": len(tensors), "bytes": sum(by_dtype.values()),
                         "quantized": len(report.get("quantized", [])),
                         "weight_encodings": len(report.get("weight_encodings", []))}
    return report


def _bits(d: dict[str, Any]) -> int | None:
    qmin, qmax = d.get("quant_min"), d.get("quant_max")
    if isinstance(qmin, int) and isinstance(qmax, int) and qmax > qmin:
        return math.ceil(math.log2(qmax - qmin + 1))
    layout = d.get("layout") or {}
    if isinstance(layout.get("ebits"), int) and isinstance(layout.get("mbits"), int):
        return 1 + layout["ebits"] + layout["mbits"]
    if layout.get("type") == "Float8Layout":
        return 8
    return None


def _metadata_object(path: str, text: Any, key: str) -> dict[str, Any]:
    """A safetensors metadata entry that must hold a JSON object."""
    try:
        doc = json.loads(text)
    except (TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: the {key!r} metadata entry is not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: the {key!r} metadata entry must be a JSON object")
    return doc


def _quanta_described(path: str, text: Any) -> list[dict[str, Any]]:
    described = _metadata_object(path, text, "quanta")
    out = []
    for name, d in described.items():
        if not isinstance(d, dict):
            raise ValueError(f"{path}: the 'quanta' metadata entry of {name!r} must be an object")
        kind = d.get("type")
        act = None
        if kind in ("MXTensor", "NVFP4Tensor"):
            out.append(_block_scaled_entry(name, d))
            continue
        if kind == "WeightTensorWithLinearActivationScaleMetadata":  # the activation scale: a smoothing factor
            d = d.get("weight") if isinstance(d.get("weight"), dict) else {}
            kind = f"{d.get('type', 'AffineQuantizedTensor')} (input scaled)"
        if d.get("type") == "LinearActivationQuantizedTensor":
            act = d.get("act_mapping_type")
            d = d.get("weight") if isinstance(d.get("weight"), dict) else {}
        layout = d.get("layout") if isinstance(d.get("layout"), dict) else {}
        shape, block = d.get("shape"), d.get("block_size")
        out.append({"name": name, "type": kind, "layout": layout.get("type"),
                    "layout_args": {k: v for k, v in layout.items() if k != "type"},
                    "bits": _bits(d), "block_size": block, "shape": shape,
                    "granularity": _aqt_granularity(shape, block), "dtype": d.get("dtype"),
                    "zero_point_domain": d.get("zero_point_domain"), "activation": act})
    return out


_ELEM_BITS = {"float8_e4m3fn": 8, "float8_e5m2": 8, "fp6_e2m3": 6, "fp6_e3m2": 6, "float4_e2m1fn_x2": 4, "int8": 8}


def _block_scaled_entry(name: str, d: dict[str, Any]) -> dict[str, Any]:
    """An MXTensor / NVFP4Tensor: element format, block size and scale format."""
    mx = d["type"] == "MXTensor"
    elem = d.get("elem_dtype") if mx else "float4_e2m1fn_x2"
    act = d.get("act_quant_kwargs")
    block = d.get("block_size")
    return {"name": name, "type": d["type"], "layout": f"{elem}, {'e8m0' if mx else 'e4m3'} scales",
            "layout_args": {}, "bits": _ELEM_BITS.get(elem) if isinstance(elem, str) else None,
            "block_size": block, "shape": d.get("shape"), "granularity": f"per-block({block})",
            "dtype": d.get("orig_dtype"), "zero_point_domain": None,
            "activation": None if act is None else ("MX " + str(act.get("elem_dtype")) if mx else "NVFP4")}


def _aqt_granularity(shape: Any, block: Any) -> str | None:
    if not (isinstance(shape, list) and isinstance(block, list) and len(shape) == len(block)):
        return None
    if block == shape:
        return "per-tensor"
    if all(b in (1, s) for b, s in zip(block, shape)):
        return "per-channel"
    return f"per-block({max(b for b in block)})"


def _weight_encodings(path: str, text: Any) -> list[dict[str, Any]]:
    doc = _metadata_object(path, text, _WEIGHTS_KEY)
    out = []
    for name, e in doc.items():
        if not isinstance(e, dict):
            raise ValueError(f"{path}: {_WEIGHTS_KEY}[{name!r}] must be an object")
        scale = e.get("scale")
        n = math.prod(e["shape"]) if isinstance(e.get("shape"), list) else (1 if not isinstance(scale, list) else None)
        block = e.get("block_size")
        blocked = [b for b in block or () if b not in (1, -1)]
        out.append({"name": name, "type": e.get("type"), "bitwidth": e.get("bitwidth"),
                    "symmetric": e.get("symmetric"), "granularity": str(e.get("granularity", "")).replace("_", "-"),
                    "axis": e.get("axis"), "block_size": blocked[0] if blocked else None, "num_scales": n})
    return out


# ============================================================================ ONNX
def _inspect_onnx(path: str, size: int) -> dict[str, Any]:
    try:
        import onnx
    except ImportError:
        raise ImportError(f"{path} may be an ONNX file, and reading one needs the onnx package: "
                          "pip install 'quanta[onnx]'") from None
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as e:  # noqa: BLE001  (protobuf's DecodeError and others: bytes that are no ModelProto)
        raise ValueError(f"{path}: {NOT_RECOGNISED} ({type(e).__name__})") from None
    graph = model.graph
    if model.ir_version <= 0 or not model.opset_import or not (graph.node or graph.input or graph.output):
        raise ValueError(f"{path}: {NOT_RECOGNISED}")
    opsets = {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import}
    init = {t.name: t for t in graph.initializer}
    constants = dict(init)
    for node in graph.node:  # Constant nodes also feed scales and zero points
        if node.op_type == "Constant":
            for a in node.attribute:
                if a.name == "value" and node.output:
                    constants[node.output[0]] = a.t
    value_types = {v.name: v for v in [*graph.value_info, *graph.input, *graph.output]}
    ops = Counter(n.op_type for n in graph.node)
    quantized_outputs = set()
    quantized: list[dict[str, Any]] = []
    for node in graph.node:
        if node.op_type == "QuantizeLinear":
            quantized_outputs.update(node.output)
            quantized.append(_qdq_entry(onnx, node, constants, value_types, prequantized=False))
    for node in graph.node:
        if node.op_type == "DequantizeLinear" and node.input and node.input[0] not in quantized_outputs:
            quantized.append(_qdq_entry(onnx, node, constants, value_types, prequantized=True))
    by_dtype: Counter = Counter()
    external = 0
    for t in graph.initializer:
        nbytes, is_external = _tensor_bytes(onnx, t)
        by_dtype[_dtype_name(onnx, t.data_type)] += nbytes
        external += nbytes if is_external else 0
    report = {
        "file": path, "type": "onnx", "ir_version": int(model.ir_version), "producer": model.producer_name,
        "opset": opsets.get("ai.onnx"), "opsets": opsets,
        "inputs": [_value_info(onnx, v) for v in graph.input if v.name not in init],
        "outputs": [_value_info(onnx, v) for v in graph.output],
        "nodes": len(graph.node),
        "op_counts": dict(sorted(ops.items())),
        "quantize_linear": ops.get("QuantizeLinear", 0), "dequantize_linear": ops.get("DequantizeLinear", 0),
        "quantized_tensors": quantized,
        "initializers": len(graph.initializer),
        "initializer_bytes_by_dtype": dict(by_dtype),
        "initializer_bytes": sum(by_dtype.values()),
        "external_data_bytes": external,
        "file_bytes": size,
        "total_bytes": size + external,
    }
    report["summary"] = {"quantized_tensors": len(quantized),
                         "granularity": dict(Counter(q["granularity"] for q in quantized)),
                         "zero_point_dtypes": dict(Counter(q["zero_point_dtype"] for q in quantized))}
    return report


def _dtype_name(onnx: Any, data_type: int) -> str:
    try:
        name = onnx.TensorProto.DataType.Name(data_type).lower()
    except ValueError:
        return f"type{data_type}"
    return {"float": "float32", "double": "float64"}.get(name, name)


def _value_info(onnx: Any, v: Any) -> dict[str, Any]:
    t = v.type.tensor_type
    shape: list[Any] | None = None
    if t.HasField("shape"):
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
    return {"name": v.name, "dtype": _dtype_name(onnx, t.elem_type) if t.elem_type else None, "shape": shape}


def _tensor_bytes(onnx: Any, t: Any) -> tuple[int, bool]:
    numel = math.prod(t.dims) if t.dims else 1
    if t.data_location == onnx.TensorProto.EXTERNAL:
        entries = {e.key: e.value for e in t.external_data}
        if entries.get("length", "").isdigit():
            return int(entries["length"]), True
        return _packed_bytes(onnx, t.data_type, numel), True
    if t.raw_data:
        return len(t.raw_data), False
    return _packed_bytes(onnx, t.data_type, numel), False


def _packed_bytes(onnx: Any, data_type: int, numel: int) -> int:
    name = _dtype_name(onnx, data_type)
    if name in ("int4", "uint4", "float4e2m1"):
        return (numel + 1) // 2
    if name in ("int2", "uint2"):
        return (numel + 3) // 4
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(data_type).itemsize
    except (KeyError, TypeError, ValueError):
        itemsize = 1
    return numel * itemsize


def _qdq_entry(onnx: Any, node: Any, constants: dict[str, Any], value_types: dict[str, Any], *,
               prequantized: bool) -> dict[str, Any]:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    name = node.input[0] if node.input else ""
    scale = constants.get(node.input[1]) if len(node.input) > 1 else None
    zp_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if zp_name is not None and zp_name in constants:
        zp_dtype = _dtype_name(onnx, constants[zp_name].data_type)
    elif zp_name is not None and zp_name in value_types:
        zp_dtype = _dtype_name(onnx, value_types[zp_name].type.tensor_type.elem_type)
    elif prequantized and name in constants:
        zp_dtype = _dtype_name(onnx, constants[name].data_type)
    elif attrs.get("output_dtype"):
        zp_dtype = _dtype_name(onnx, int(attrs["output_dtype"]))
    else:
        zp_dtype = "uint8"  # QuantizeLinear's default without a zero point
    num_scales = (math.prod(scale.dims) if scale.dims else 1) if scale is not None else None
    block = int(attrs.get("block_size", 0) or 0)
    axis = int(attrs.get("axis", 1))  # ONNX's default axis is 1
    if block > 0:
        granularity, axis_out, block_out = "per-block", axis, block
    elif num_scales is not None and num_scales > 1:
        granularity, axis_out, block_out = "per-channel", axis, None
    else:
        granularity, axis_out, block_out = "per-tensor", None, None
    return {"name": name, "zero_point_dtype": zp_dtype, "granularity": granularity, "axis": axis_out,
            "block_size": block_out, "num_scales": num_scales, "prequantized": prequantized}


# ============================================================================ text
def _granularity_text(t: dict[str, Any]) -> str:
    g = t.get("granularity") or "-"
    if g == "per-block":
        axis = f", axis={t['axis']}" if t.get("axis") is not None else ""
        return f"per-block({t.get('block_size')}{axis})"
    if g == "per-channel" and t.get("axis") is not None:
        return f"per-channel(axis={t['axis']})"
    return g


def _table(rows: list[list[str]], header: list[str]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows)]
    lines = ["  " + "  ".join(str(c).ljust(w) for c, w in zip(header, widths)).rstrip()]
    lines += ["  " + "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return lines


def _yes(value: Any) -> str:
    return "-" if value is None else ("yes" if value else "no")


def _counts(d: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items()) or "none"


def format_report(report: dict[str, Any]) -> str:
    """Text form of an :func:`inspect_file` report."""
    kind = report["type"]
    if kind == "encodings":
        s = report["summary"]
        title = "quanta encodings file" if report["format"] == "quanta" else "AIMET encodings file"
        split = (f" ({s['activations']} activations, {s['params']} params)" if s["activations"] + s["params"]
                 else " (version 2.0.0 does not tell activations from params)" if s["tensors"] else "")
        lines = [f"{title}, version {report['version']}: {s['tensors']} tensors{split}"]
        rows = [[t["name"], t["kind"], t["dtype"], str(t["bitwidth"]), _yes(t["symmetric"]), _granularity_text(t),
                 str(t["num_scales"])] for t in report["tensors"]]
        lines += _table(rows, ["name", "kind", "dtype", "bits", "symmetric", "granularity", "scales"])
        lines.append(f"summary: {_counts(s['granularity'])}; dtypes: {_counts(s['dtypes'])}; {s['scales']} scales")
        return "\n".join(lines)
    if kind == "safetensors":
        s = report["summary"]
        lines = [f"safetensors file: {s['tensors']} tensors, {s['bytes']:,} bytes of data "
                 f"({report['file_bytes']:,} bytes on disk)"]
        rows = [[t["name"], t["dtype"], "x".join(map(str, t["shape"])) or "scalar", f"{t['bytes']:,}"]
                for t in report["tensors"]]
        lines += _table(rows, ["name", "dtype", "shape", "bytes"])
        lines.append(f"bytes by dtype: {_counts({k: f'{v:,}' for k, v in report['bytes_by_dtype'].items()})}")
        if "quantized" in report:
            lines.append(f"quanta quantized entries: {len(report['quantized'])}")
            if report["quantized"]:
                rows = [[q["name"], str(q["type"]), str(q["layout"]), str(q["bits"]), str(q["block_size"]),
                         str(q["granularity"])] for q in report["quantized"]]
                lines += _table(rows, ["name", "type", "layout", "bits", "block size", "granularity"])
        if "weight_encodings" in report:
            lines.append(f"weight encodings (quanta quantize): {len(report['weight_encodings'])}")
            rows = [[w["name"], str(w["type"]), str(w["bitwidth"]), _yes(w["symmetric"]), _granularity_text(w),
                     str(w["num_scales"])] for w in report["weight_encodings"]]
            lines += _table(rows, ["name", "type", "bits", "symmetric", "granularity", "scales"])
        return "\n".join(lines)
    lines = [f"ONNX model: opset {report['opset']}, IR version {report['ir_version']}, {report['nodes']} nodes"
             + (f", producer {report['producer']}" if report["producer"] else "")]

    def io(v: dict[str, Any]) -> str:
        shape = "?" if v["shape"] is None else "[" + ", ".join(map(str, v["shape"])) + "]"
        return f"{v['name']} {v['dtype']} {shape}"
    lines.append("inputs: " + ("; ".join(io(v) for v in report["inputs"]) or "none"))
    lines.append("outputs: " + ("; ".join(io(v) for v in report["outputs"]) or "none"))
    lines.append(f"QuantizeLinear: {report['quantize_linear']}, DequantizeLinear: {report['dequantize_linear']}")
    q = report["quantized_tensors"]
    lines.append(f"quantized tensors: {len(q)}")
    if q:
        rows = [[t["name"], t["zero_point_dtype"], _granularity_text(t), str(t["num_scales"]),
                 "yes" if t["prequantized"] else "no"] for t in q]
        lines += _table(rows, ["name", "zero point", "granularity", "scales", "prequantized"])
    lines.append(f"initializers: {report['initializers']}, {report['initializer_bytes']:,} bytes "
                 f"({_counts({k: f'{v:,}' for k, v in report['initializer_bytes_by_dtype'].items()})})")
    ext = f" + {report['external_data_bytes']:,} bytes of external data" if report["external_data_bytes"] else ""
    lines.append(f"total size: {report['file_bytes']:,} bytes{ext}")
    return "\n".join(lines)
