"""A simulated model's encodings in files: quanta's own lossless JSON format, and AIMET's formats through
:mod:`quanta.export.sim_encodings` (every file AIMET 2.x writes is read: ``<prefix>.encodings`` of any
version, keyed by ONNX tensor names, and the module-keyed ``<prefix>_torch.encodings``).

quanta's format (``version=None``) holds every initialised quantizer by its name in ``sim.named_quantizers()``::

    {"format": "quanta.quantsim.encodings", "version": 1,
     "quantizers": {"0.output_quantizers.0": {"type": "affine", ...AffineEncoding.to_dict()},
                    "1.output_quantizers.0": {"type": "float", ...FloatEncoding.to_dict()}}}

Loading checks the whole file against the sim's quantizers (grid, shape, block size, float format, finite
positive scales, integer offsets, symmetric offsets for symmetric quantizers) before anything changes.

>>> import torch
>>> from torch import nn
>>> from quanta.quantsim import QuantizationSimModel
>>> model = nn.Sequential(nn.Linear(8, 4))
>>> x = torch.randn(16, 8)
>>> sim = QuantizationSimModel(model, x)
>>> sim.compute_encodings([x], progress=False)
>>> doc = encodings_document(sim.named_quantizers())
>>> doc["format"], sorted(n for n in doc["quantizers"] if "input" not in n)
('quanta.quantsim.encodings', ['0.output_quantizers.0', '0.param_quantizers.weight'])
>>> fresh = QuantizationSimModel(model, x)
>>> load_encodings(fresh, doc, strict=True, partial=False, requires_grad=None, allow_overwrite=None)
>>> torch.equal(fresh.model(x), sim.model(x))
True
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from quanta._files import atomic_write, read_json
from quanta._text import shortlist as _shortlist
from quanta.encodings.affine import AffineEncoding
from quanta.encodings.float import FloatEncoding
from quanta.export.protocol import SimulationLike
from quanta.kernels.qparams import offset_from_range
from quanta.quantization.affine import QuantizeDequantize
from quanta.quantization.base import QuantizerBase
from quanta.quantization.float import BlockScaledQuantizeDequantize

__all__ = ["ENCODINGS_FORMAT", "ENCODINGS_VERSION", "encodings_document", "load_encodings", "load_param_encodings", "save_encodings"]

ENCODINGS_FORMAT = "quanta.quantsim.encodings"
ENCODINGS_VERSION = 1


def encodings_document(quantizers: Iterable[tuple[str, QuantizerBase]]) -> dict[str, Any]:
    """quanta's encodings document for ``quantizers`` (``(name, quantizer)`` pairs; uninitialised ones left out)."""
    entries = {}
    for name, q in quantizers:
        if not q.is_initialized():
            continue
        if isinstance(q, BlockScaledQuantizeDequantize):
            raise NotImplementedError(
                f"{name} is a BlockScaledQuantizeDequantize ({q.format.name}): encodings files hold fixed scales, "
                "its block scales come from the data; save its state (NVFP4's global_amax) with "
                "sim.quantizer_state_dict() instead")
        enc = q.get_encodings()
        entries[name] = {"type": "float" if isinstance(enc, FloatEncoding) else "affine", **enc.to_dict()}
    return {"format": ENCODINGS_FORMAT, "version": ENCODINGS_VERSION, "quantizers": entries}


def save_encodings(sim: SimulationLike, path: str | os.PathLike, version: str | None = None) -> None:
    """Write ``sim``'s encodings to ``path`` (atomically): quanta's format, or AIMET's ``version``: 0.6.1 and
    1.0.0 as AIMET's module-keyed ``_torch.encodings`` (what AIMET's ``load_encodings`` reads), 2.0.0 and
    2.1.0 as their ``encodings`` list keyed by quanta's tensor names (AIMET reads no 2.x file into a sim)."""
    if version is not None:
        from quanta.export.encodings import EncodingsVersion
        from quanta.export.sim_encodings import export_encodings, export_torch_encodings

        parsed = EncodingsVersion.parse(version)
        if parsed.is_2x:
            export_encodings(sim, path, parsed)
        else:
            export_torch_encodings(sim, path, parsed)
        return
    text = json.dumps(encodings_document(sim.named_quantizers()), indent=1)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)


def load_encodings(sim: SimulationLike, encodings: str | os.PathLike | Mapping[str, Any], *, strict: bool,
                   partial: bool, requires_grad: bool | None, allow_overwrite: bool | None) -> None:
    """Set ``sim``'s quantizer encodings from a file or its parsed dict, in quanta's format or AIMET's (the
    options as :meth:`quanta.quantsim.QuantizationSimModel.load_encodings` says)."""
    where, path = "", None
    if isinstance(encodings, (str, os.PathLike)):  # parse once (json only), then tell the formats apart
        path = os.fspath(encodings)
        where = f"{path}: "
        encodings = read_json(encodings, "encodings")
        if not isinstance(encodings, Mapping):
            raise ValueError(f"{where}encodings: expected a JSON object, got {type(encodings).__name__}")
    if not _is_quanta_format(encodings):
        from quanta.export.encodings import read_encodings
        from quanta.export.sim_encodings import apply_encodings

        try:
            doc = read_encodings(encodings)
            names, derived, copies = _onnx_names(sim, doc, path)
            apply_encodings(sim, doc, strict=strict, partial=partial, requires_grad=requires_grad,
                            allow_overwrite=allow_overwrite, names=names, derived=derived, copies=copies)
        except ValueError as e:
            hint = ""
            if "no such tensor in the model" in str(e) and path is not None and path.endswith(".encodings") \
                    and not path.endswith(_TORCH_SUFFIX):
                hint = (f" (ONNX tensor names are matched by exporting this sim with its dummy input, graph inputs "
                        f"and outputs by position in the .onnx file beside the encodings; AIMET's module-keyed "
                        f"{path[:-len('.encodings')]}{_TORCH_SUFFIX} names every quantizer)")
            raise ValueError(f"{where}{e}{hint}") from None
        return
    doc = _read_encodings(encodings)
    entries = doc["quantizers"]
    own = dict(sim.named_quantizers())
    unknown = [k for k in entries if k not in own]
    if strict and unknown:
        raise ValueError(f"encodings for quantizers the model does not have (or that are disabled): "
                         f"{_shortlist(unknown)}")
    if not partial:
        absent = [k for k in own if k not in entries]
        if absent:
            raise ValueError(f"partial=False but the encodings miss quantizers {_shortlist(absent)}")
    parsed: list[tuple[QuantizerBase, AffineEncoding | FloatEncoding]] = []
    for name, entry in entries.items():
        if name not in own:
            continue
        enc = _parse_entry(name, entry)
        _check_entry(name, enc, own[name])
        parsed.append((own[name], enc))
    for q, enc in parsed:
        if isinstance(enc, AffineEncoding):
            q.set_encodings(enc)  # type: ignore[union-attr]
        else:
            q.set_range(enc.maxval)  # type: ignore[union-attr]
        if requires_grad is not None:
            for p in q.parameters():
                p.requires_grad_(requires_grad)
        if allow_overwrite is not None:
            q.allow_overwrite(allow_overwrite)


def load_param_encodings(sim: SimulationLike, encodings: str | os.PathLike | Mapping[str, Any]) -> None:
    """Load and freeze the parameter entries of an encodings file (AIMET's ``set_and_freeze_param_encodings``):
    any format :func:`load_encodings` reads, and AIMET AdaRound's ``{"param_encodings": {...}}``."""
    doc: Any = read_json(encodings, "encodings") if isinstance(encodings, (str, os.PathLike)) else encodings
    if not isinstance(doc, Mapping):
        raise ValueError(f"encodings: expected a JSON object, got {type(doc).__name__}")
    doc = dict(doc)
    if "format" in doc:  # quanta's own: keep the parameter quantizers' entries
        entries = doc.get("quantizers")
        if isinstance(entries, Mapping):
            doc["quantizers"] = {k: v for k, v in entries.items() if ".param_quantizers." in str(k)}
    elif "param_encodings" in doc:
        doc["activation_encodings"] = [] if "version" in doc and not str(doc["version"]).startswith("0.") else {}
    else:
        raise ValueError("encodings: no 'param_encodings' in the document")
    load_encodings(sim, doc, strict=True, partial=True, requires_grad=False, allow_overwrite=False)


def _is_quanta_format(doc: Any) -> bool:
    """Whether a parsed encodings document is quanta's own format; AIMET's carry a ``version`` (or, written by
    its ``save_encodings_to_json``, ``activation_encodings`` and ``param_encodings``) and no ``format``.
    Anything that is not a mapping goes to quanta's reader, which names what is wrong with it."""
    if not isinstance(doc, Mapping) or "format" in doc:
        return True
    return "version" not in doc and not ("activation_encodings" in doc and "param_encodings" in doc)


_TORCH_SUFFIX = "_torch.encodings"


def _onnx_names(sim: SimulationLike, doc: Any, path: str | None) -> tuple[dict[str, str], set[str], set[str]]:
    """For a tensor-keyed AIMET file whose names are not quanta's tensor names: ``({file name: quanta tensor
    name}, {derived names}, {weight copies})`` (:func:`quanta.export.onnx.names.resolve`) from an ONNX export
    of ``sim`` with its dummy input (the names ``torch.onnx`` gives, as in AIMET's export); graph inputs and
    outputs by position in the ``.onnx`` beside ``path``."""
    from quanta.export.encodings import KeyedBy
    from quanta.export.sim_encodings import tensor_names

    if doc.keyed_by is KeyedBy.MODULE:
        return {}, set(), set()
    slots = tensor_names(sim, disabled=True)
    unresolved = [n for n in doc.encodings if n not in slots]
    args, kwargs = getattr(sim, "_dummy_args", None), getattr(sim, "_dummy_kwargs", None)
    if not unresolved or args is None:
        return {}, set(), set()
    try:
        import onnx  # noqa: F401
    except ImportError:  # pragma: no cover - optional dependency
        raise ValueError(f"entries {_shortlist(unresolved)} are not quanta tensor names; reading ONNX tensor names "
                         "exports the sim to ONNX, which needs the onnx package (pip install 'quanta[onnx]'), or "
                         f"load the module-keyed {_TORCH_SUFFIX} file AIMET writes beside it") from None
    from quanta.export.onnx.names import file_io_names, resolve, tensor_map
    from quanta.export.onnx.plan import MAX_OPSET, MIN_OPSET

    file_io = None
    if path is not None and path.endswith(".encodings"):
        file_io = file_io_names(path[: -len(".encodings")] + ".onnx")
    opset = file_io[2] if file_io is not None and MIN_OPSET <= file_io[2] <= MAX_OPSET else None
    dummy = kwargs if kwargs and not args else args
    tmap = tensor_map(sim, dummy, opset=opset)
    found = resolve(unresolved, tmap, file_io)
    slot_of = {q: t for t, q in tensor_names(sim).items()}
    return {n: slot_of[q] for n, q in found.quantizers.items() if q in slot_of}, found.derived, found.copies


def _read_encodings(source: str | os.PathLike | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(source, (str, os.PathLike)):
        doc = read_json(source, "encodings")
    elif isinstance(source, Mapping):
        doc = source
    else:
        raise TypeError(f"encodings must be a path or a mapping, got {type(source).__name__}")
    if not isinstance(doc, Mapping) or doc.get("format") != ENCODINGS_FORMAT:
        raise ValueError(f"encodings: expected a mapping with format={ENCODINGS_FORMAT!r} (written by save_encodings)")
    if doc.get("version") != ENCODINGS_VERSION:
        raise ValueError(f"encodings: unsupported version {doc.get('version')!r} (this quanta reads {ENCODINGS_VERSION})")
    if not isinstance(doc.get("quantizers"), Mapping):
        raise ValueError("encodings['quantizers'] must be a mapping of quantizer names to encodings")
    bad = [k for k in doc["quantizers"] if not isinstance(k, str)]
    if bad:
        raise TypeError(f"encodings['quantizers']: quantizer names must be strings, got {bad[0]!r}")
    return dict(doc)


def _check_entry(name: str, enc: AffineEncoding | FloatEncoding, q: QuantizerBase) -> None:
    """Everything ``set_encodings``/``set_range`` would reject, checked before anything is changed."""
    where = f"encodings[{name!r}]"
    if isinstance(enc, AffineEncoding) != isinstance(q, QuantizeDequantize):
        raise ValueError(f"{where}: a {'affine' if isinstance(enc, AffineEncoding) else 'float'} encoding for a "
                         f"{type(q).__name__}")
    if tuple(enc.scale.shape) != tuple(q.shape):  # type: ignore[attr-defined]
        raise ValueError(f"{where}: shape {tuple(enc.scale.shape)} differs from the quantizer's {q.shape}")  # type: ignore[attr-defined]
    if enc.block_size != q.block_size:  # type: ignore[attr-defined]
        raise ValueError(f"{where}: block_size {enc.block_size} differs from the quantizer's {q.block_size}")  # type: ignore[attr-defined]
    if isinstance(enc, FloatEncoding):
        if enc.format != q.format:  # type: ignore[attr-defined]
            raise ValueError(f"{where}: float format {enc.format} differs from the quantizer's {q.format}")  # type: ignore[attr-defined]
        return
    if enc.grid != q.grid:  # type: ignore[attr-defined]
        raise ValueError(f"{where}: grid {enc.grid} differs from the quantizer's {q.grid}")  # type: ignore[attr-defined]
    offset = torch.broadcast_to(enc.offset, enc.scale.shape)
    if not bool(torch.isfinite(offset).all()) or not torch.equal(offset, offset.round()):
        raise ValueError(f"{where}: offsets must be finite integers")
    if q.symmetric:  # type: ignore[attr-defined]
        want = offset_from_range(enc.scale, enc.scale, q.grid, True)  # type: ignore[attr-defined]
        if not torch.equal(offset.float(), torch.broadcast_to(want, offset.shape).float()):
            raise ValueError(f"{where}: a symmetric quantizer needs the symmetric offset {want.flatten()[0].item()}")


def _parse_entry(name: str, entry: Any) -> AffineEncoding | FloatEncoding:
    if not isinstance(entry, Mapping):
        raise ValueError(f"encodings[{name!r}] must be a mapping, got {type(entry).__name__}")
    kind = entry.get("type")
    body = {k: v for k, v in entry.items() if k != "type"}
    try:
        if kind == "affine":
            enc: AffineEncoding | FloatEncoding = AffineEncoding.from_dict(body)
        elif kind == "float":
            enc = FloatEncoding.from_dict(body)
        else:
            raise ValueError(f"'type' must be 'affine' or 'float', got {kind!r}")
        scale = enc.scale
        if not bool(torch.isfinite(scale).all()) or not bool((scale > 0).all()):
            raise ValueError("scales must be finite and positive")
    except (TypeError, ValueError, KeyError, OverflowError) as e:  # OverflowError: int(inf) in a shape
        raise ValueError(f"encodings[{name!r}]: {e}") from None
    return enc
