"""A QuantizationSimModel's encodings as AIMET encodings files: tensor names, export, and apply.

quanta's tensor names, for the quantized module named ``m`` (the keys of AIMET's module-keyed
``_torch.encodings``, :mod:`quanta.export.torch_encodings`, spelled as one string):

* ``"m.input.<i>"``: its input quantizer ``i``; ``"m.output.<i>"``: its output quantizer ``i``;
* ``"m.<param>"``: the quantizer of parameter ``<param>`` (as in ``state_dict``, e.g. ``"conv1.weight"``).

An ONNX export names activations as ``torch.onnx`` does (``"/relu1/Relu_output_0"``); :func:`export_encodings`
takes that renaming, and :func:`apply_encodings` a map back (:mod:`quanta.export.onnx.names`).

>>> import torch
>>> from torch import nn
>>> from quanta.quantsim import QuantizationSimModel
>>> from quanta.export.encodings import encodings_to_dict
>>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
>>> x = torch.randn(32, 8)
>>> sim = QuantizationSimModel(model, x)
>>> sim.compute_encodings(lambda m: m(x), progress=False)
>>> acts, params = sim_encodings(sim)
>>> sorted(a for a in acts if ".output." in a), sorted(params)
(['1.output.0', '2.output.0'], ['0.weight', '2.weight'])
>>> fresh = QuantizationSimModel(model, x)
>>> apply_encodings(fresh, encodings_to_dict(acts, params, "2.0.0"))
>>> torch.equal(fresh.model(x), sim.model(x))
True
"""

from __future__ import annotations

import copy
import dataclasses
import os
import warnings
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from quanta._text import shortlist as _shortlist
from quanta.encodings.affine import AffineEncoding
from quanta.export.encodings import (
    Encoding,
    EncodingDtype,
    EncodingsFile,
    EncodingsVersion,
    FileEncoding,
    LowPowerBlocks,
    read_encodings,
    write_encodings,
    write_json,
)
from quanta.export.protocol import QuantizedModelLike, SimulationLike
from quanta.grids.float import FloatFormat
from quanta.nn import QuantizationMixin
from quanta.quantization.affine.grouped_block import GroupedBlockQuantizeDequantize
from quanta.quantization.affine.quantizer import AffineQuantizerBase
from quanta.quantization.base import QuantizerBase
from quanta.quantization.float import BlockScaledQuantizeDequantize, FloatQuantizeDequantize

__all__ = ["tensor_names", "sim_encodings", "export_encodings", "export_torch_encodings", "apply_encodings"]

# AIMET's names of quanta's schemes, for quantizer_args.quant_scheme.
_AIMET_SCHEMES = {
    "min_max": "min_max",  # aimet-torch 2.x's name (1.x: post_training_tf)
    "sqnr": "post_training_tf_enhanced",
    "percentile": "post_training_percentile",
    "range_learning_min_max": "training_range_learning_with_tf_init",
    "range_learning_sqnr": "training_range_learning_with_tf_enhanced_init",
}


@dataclass(frozen=True)
class _Slot:
    tensor: str  # tensor name in encodings files
    quantizer: QuantizerBase | None  # None: slot disabled
    is_param: bool
    where: str  # the quantizer's own name in sim.named_quantizers()


def _slots(sim: QuantizedModelLike) -> Iterator[_Slot]:
    for name, module in sim.quantized_modules():
        if not isinstance(module, QuantizationMixin):  # pragma: no cover - quantized_modules() guarantees it
            continue
        prefix = f"{name}." if name else ""
        for i, q in enumerate(module.input_quantizers):
            yield _Slot(f"{prefix}input.{i}", q, False, f"{prefix}input_quantizers.{i}")
        for i, q in enumerate(module.output_quantizers):
            yield _Slot(f"{prefix}output.{i}", q, False, f"{prefix}output_quantizers.{i}")
        for pname, q in module.param_quantizers.items():
            yield _Slot(f"{prefix}{pname}", q, True, f"{prefix}param_quantizers.{pname}")


def tensor_names(sim: QuantizedModelLike, *, disabled: bool = False) -> dict[str, str]:
    """Tensor name → quantizer name (as in ``sim.named_quantizers()``) for every enabled quantizer (and, with
    ``disabled=True``, every disabled slot too, named as it would be: ``"m.input_quantizers.0"``).

    >>> import torch
    >>> from quanta.quantsim import QuantizationSimModel
    >>> sim = QuantizationSimModel(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.randn(2, 4))
    >>> names = tensor_names(sim)
    >>> names["0.output.0"], names["0.weight"]
    ('0.output_quantizers.0', '0.param_quantizers.weight')
    """
    return {s.tensor: s.where for s in _slots(sim) if disabled or s.quantizer is not None}


def sim_encodings(sim: QuantizedModelLike) -> tuple[dict[str, Encoding], dict[str, Encoding]]:
    """``(activations, params)``: the encoding of every initialised quantizer, by tensor name."""
    acts: dict[str, Encoding] = {}
    params: dict[str, Encoding] = {}
    for s in _slots(sim):
        if s.quantizer is None or not s.quantizer.is_initialized():
            continue
        if isinstance(s.quantizer, BlockScaledQuantizeDequantize):
            raise NotImplementedError(
                f"{s.where} is a BlockScaledQuantizeDequantize ({s.quantizer.format.name}): AIMET encodings files "
                "have no entry for MX/NVFP4 block scales, which are computed from the data; write the QDQ graph "
                "alone with quanta.export.onnx.export_onnx(sim, path, dummy_input) (MX/NVFP4 weights export "
                "there), or store the weights with quanta.quantization.quantize_ and save_quantized")
        enc = s.quantizer.get_encodings()
        (params if s.is_param else acts)[s.tensor] = enc.detach() if isinstance(enc, AffineEncoding) else enc
    return acts, params


def _quantizer_args(sim: SimulationLike, params: Mapping[str, Encoding], version: EncodingsVersion) -> dict[str, Any]:
    affine = [q for s in _slots(sim) if s.is_param and isinstance(q := s.quantizer, AffineQuantizerBase)]
    symmetric = bool(affine) and all(q.symmetric for q in affine)
    per_channel = any(enc.scale.numel() > 1 for enc in params.values())
    dtype = getattr(sim.default_data_type, "value", str(sim.default_data_type))
    scheme = sim.quant_scheme.value
    args: dict[str, Any] = {"activation_bitwidth": sim.default_output_bw, "dtype": dtype,
                            "is_symmetric": symmetric, "param_bitwidth": sim.default_param_bw,
                            "per_channel_quantization": per_channel,
                            "quant_scheme": _AIMET_SCHEMES.get(scheme, scheme)}
    if version is EncodingsVersion.V0_6_1:  # the 0.6.1 spec writes these flags as strings
        args["is_symmetric"] = str(symmetric)
        args["per_channel_quantization"] = str(per_channel)
    return args


def export_encodings(sim: SimulationLike, path: str | os.PathLike,
                     version: EncodingsVersion | str = EncodingsVersion.V1_0_0, *,
                     tensors: Collection[str] | Mapping[str, Sequence[str]] | None = None) -> None:
    """Write the encodings of every initialised quantizer of ``sim`` to ``path`` (atomically), keyed by tensor.

    ``tensors`` limits the file to these quanta tensor names; a mapping also renames them:
    ``{"relu1.output.0": ["/relu1/Relu_output_0"]}`` (an ONNX export's names; a quantizer called twice
    quantizes two tensors, each gets the entry).

    ``is_symmetric``/``is_sym`` come from the quantizers themselves;
    ``excluded_layers`` lists ``sim.unquantized_modules``; ``quantizer_args``
    the sim's defaults (0.6.1 and 1.0.0; versions 2.x have neither). What a
    version cannot hold is a ValueError naming the tensor (see
    :func:`quanta.export.encodings.encodings_to_dict`).
    """
    version = EncodingsVersion.parse(version)
    acts, params = sim_encodings(sim)
    symmetric = {s.tensor: s.quantizer.symmetric for s in _slots(sim)
                 if isinstance(s.quantizer, AffineQuantizerBase)}
    if tensors is not None:
        rename = dict(tensors) if isinstance(tensors, Mapping) else {t: [t] for t in tensors}
        acts = {n: enc for t, enc in acts.items() for n in rename.get(t, ())}
        params = {n: enc for t, enc in params.items() for n in rename.get(t, ())}
        symmetric = {n: flag for t, flag in symmetric.items() for n in rename.get(t, ())}
    lpbq = _lpbq_scales(sim)
    if tensors is not None:
        lpbq = {n: v for t, v in lpbq.items() for n in rename.get(t, ())}
    kwargs: dict[str, Any] = {"symmetric": symmetric, "lpbq": lpbq}
    if not version.is_2x:
        kwargs["excluded_layers"] = list(sim.unquantized_modules)
        kwargs["quantizer_args"] = _quantizer_args(sim, params, version)
    write_encodings(path, acts, params, version, **kwargs)


def _lpbq_scales(sim: QuantizedModelLike) -> dict[str, LowPowerBlocks]:
    """The two-level scales of every initialised LPBQ quantizer that groups blocks (AIMET writes an LPBQ
    quantizer whose groups are single blocks as a plain per-block one), by tensor name."""
    out = {}
    for s in _slots(sim):
        q = s.quantizer
        if isinstance(q, GroupedBlockQuantizeDequantize) and q.is_initialized() \
                and any(g != 1 for g in q.block_grouping):
            ints, channel = q.get_per_block_int_scale(), q.get_per_channel_scale(torch.float32)
            out[s.tensor] = LowPowerBlocks(ints.detach().to(torch.int64), channel.detach(), q.decompressed_bw)
    return out


def export_torch_encodings(sim: SimulationLike, path: str | os.PathLike,
                           version: EncodingsVersion | str = EncodingsVersion.V1_0_0) -> None:
    """Write AIMET's module-keyed ``_torch.encodings`` (:mod:`quanta.export.torch_encodings`) for ``sim``
    (atomically): what AIMET's ``QuantizationSimModel.load_encodings`` reads. ``version`` is 0.6.1 or 1.0.0
    (the entries are 0.6.1 ones either way, as AIMET writes them)."""
    from quanta.export.torch_encodings import torch_encodings_to_dict

    version = EncodingsVersion.parse(version)
    acts, params = sim_encodings(sim)
    symmetric = {s.tensor: s.quantizer.symmetric for s in _slots(sim)
                 if isinstance(s.quantizer, AffineQuantizerBase)}
    doc = torch_encodings_to_dict(acts, params, version, excluded_layers=list(sim.unquantized_modules),
                                  quantizer_args=_quantizer_args(sim, params, version), symmetric=symmetric)
    write_json(path, doc)


# ---------------------------------------------------------------------------- apply
def _maxval_for_scale(scale: torch.Tensor, fmt: FloatFormat, ulps: int = 4) -> torch.Tensor:
    """A float32 ``maxval`` with ``maxval / fmt.max == scale`` bit for bit, where one exists (nearest first)."""
    scale = scale.float()
    base = (scale.double() * fmt.max).float()
    best, found = base.clone(), (base / fmt.max) == scale
    up, down = base, base
    for _ in range(ulps):
        up = torch.nextafter(up, torch.full_like(up, torch.inf))
        down = torch.nextafter(down, torch.full_like(down, -torch.inf))
        for cand in (down, up):
            ok = ((cand / fmt.max) == scale) & ~found
            best, found = torch.where(ok, cand, best), found | ok
    return best


@dataclass(frozen=True)
class _Pending:
    """A validated entry, ready to set: an affine encoding, or a float quantizer's ``maxval``."""

    quantizer: QuantizerBase
    affine: AffineEncoding | None = None
    maxval: torch.Tensor | None = None

    def apply(self) -> None:
        if self.affine is not None:
            self.quantizer.set_encodings(self.affine)  # type: ignore[operator]
        else:
            self.quantizer.set_range(self.maxval)  # type: ignore[operator]


def _resolve_lpbq(slot: _Slot, q: GroupedBlockQuantizeDequantize, fe: FileEncoding) -> _Pending:
    """An LPBQ quantizer takes the block scales as its range; they must be LPBQ scales of its own grouping
    (each group's largest integer scale ``2**(decompressed_bw - bitwidth)``, as AIMET computes them), so that
    the quantizer derives the same integer and channel scales back."""
    if fe.lpbq is not None and fe.lpbq.decompressed_bitwidth not in (None, q.decompressed_bw):
        raise fe.error("lpbq", f"decompressed bitwidth {fe.lpbq.decompressed_bitwidth}, {slot.where} has "
                               f"{q.decompressed_bw}")
    enc = fe.to_affine(q.shape, q.block_size, q.grid, symmetric=q.symmetric)
    probe = copy.deepcopy(q)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        probe.set_encodings(enc)
    if not torch.equal(probe.get_scale(torch.float32), enc.scale.float()):
        raise fe.error("scale", f"the block scales are not LPBQ scales of {slot.where} (decompressed_bw "
                                f"{q.decompressed_bw}, block_grouping {q.block_grouping}): it would not reproduce them")
    return _Pending(q, affine=enc)


def _resolve(slot: _Slot, fe: FileEncoding) -> _Pending:
    q = slot.quantizer
    if isinstance(q, GroupedBlockQuantizeDequantize):
        return _resolve_lpbq(slot, q, fe)
    if fe.lpbq is not None:
        raise fe.error("lpbq", f"an LPBQ entry ({fe.bitwidth}-bit codes, per-block integer scales under per-channel "
                               f"float scales) for {slot.where}, a {type(q).__name__}: make it an LPBQ quantizer "
                               "first (quanta.quantsim.config_utils.set_grouped_blockwise_quantization_for_weights)")
    if isinstance(q, AffineQuantizerBase):
        return _Pending(q, affine=fe.to_affine(q.shape, q.block_size, q.grid, symmetric=q.symmetric))
    if isinstance(q, FloatQuantizeDequantize):
        enc = fe.to_float(q.shape, q.block_size, q.format)
        maxval = _maxval_for_scale(enc.scale, q.format)
        if not bool(torch.isfinite(maxval).all()):
            raise fe.error("scale", f"scale(s) too large for {q.format.name()}: maxval overflows float32")
        return _Pending(q, maxval=maxval)
    raise ValueError(f"encoding {fe.name!r}: quantizer {slot.where} is a {type(q).__name__}, which quanta "
                     "cannot load AIMET encodings into")



def _untransposed(fe: FileEncoding) -> FileEncoding:
    """The entry of a weight's transposed copy (AIMET's ``"<module>.weight_0"``, stored for a MatMul) for the
    weight itself: a flat per-channel list is the same; a nested per-block scale is transposed back."""
    if fe.scale is None or fe.shape is None or len(fe.shape) != 2:
        return dataclasses.replace(fe, axis=None)
    rows, cols = fe.shape
    scale = fe.scale.reshape(rows, cols).t().reshape(-1)
    offset = None if fe.offset is None else fe.offset.reshape(rows, cols).t().reshape(-1)
    axis = None if fe.axis is None else 1 - fe.axis % 2
    return dataclasses.replace(fe, scale=scale, offset=offset, shape=(cols, rows), axis=axis)


def _same(a: FileEncoding, b: FileEncoding) -> bool:
    def eq(x: torch.Tensor | None, y: torch.Tensor | None) -> bool:
        return (x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))

    return a.dtype is b.dtype and a.bitwidth == b.bitwidth and eq(a.scale, b.scale) and eq(a.offset, b.offset)


def apply_encodings(
    sim: QuantizedModelLike,
    source: str | os.PathLike | Mapping[str, Any] | EncodingsFile,
    *,
    strict: bool = True,
    partial: bool = True,
    requires_grad: bool | None = None,
    allow_overwrite: bool | None = None,
    names: Mapping[str, str] | None = None,
    derived: Collection[str] = (),
    copies: Collection[str] = (),
) -> None:
    """Set ``sim``'s quantizers from an AIMET encodings file (any version, either layout), by tensor name.

    Args:
        source: a path, the parsed JSON object, or an :class:`EncodingsFile`.
        strict: a name that is not an enabled quantizer of ``sim`` is an error
            (otherwise it is skipped).
        partial: if False, every enabled quantizer of ``sim`` must have an entry.
        requires_grad: if given, ``requires_grad`` of the loaded ranges (QAT from loaded encodings).
        allow_overwrite: if given, whether a later ``compute_encodings`` may overwrite them.
        names: the file's names that are not quanta tensor names → quanta tensor names (ONNX names,
            :func:`quanta.export.onnx.names.resolve`).
        derived: the file's names of tensors the sim does not quantize that only carry a quantized
            tensor's values (AIMET repeats the encoding after a Flatten): skipped.
        copies: the file's names of a weight's converted copy (transposed for a MatMul): a per-channel
            entry's axis is the copy's, so only the number of scales is checked; a per-block one is
            transposed back.

    Also skipped: 32-bit entries for parameters the sim does not quantize (AIMET 2.x derives an int32 bias
    encoding from the input and weight scales when exporting). Everything is validated before anything is
    set, so a bad file changes nothing: names, integer vs float, bitwidth, signedness and symmetry against
    each quantizer's grid, the number of scales (reshaped to the quantizer's shape), axis and block size,
    offsets (zero point on the grid). Errors are ValueErrors naming the entry and its key; loading never
    executes code. An LPBQ entry is an error naming it (quanta has no LPBQ quantizer yet).
    """
    for flag, value in (("strict", strict), ("partial", partial)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool, got {value!r}")
    doc = source if isinstance(source, EncodingsFile) else read_encodings(source)
    rename = dict(names or {})
    slots = {s.tensor: s for s in _slots(sim)}
    skipped = set(derived)
    for n, fe in doc.encodings.items():
        s = slots.get(rename.get(n, n))
        if (s is not None and s.is_param and s.quantizer is None and fe.dtype is EncodingDtype.INT
                and fe.bitwidth == 32):
            skipped.add(n)  # AIMET's derived int32 bias encoding
    entries: dict[str, FileEncoding] = {}
    copied = set(copies)
    for n, fe in doc.encodings.items():
        if n in skipped:
            continue
        if n in copied:
            fe = _untransposed(fe)
        target = rename.get(n, n)
        if target in entries:  # a quantizer called twice quantizes two tensors: one encoding for both
            if not _same(entries[target], fe):
                raise ValueError(f"encodings {entries[target].name!r} and {n!r} differ but both are for quantizer "
                                 f"{slots[target].where if target in slots else target}")
            continue
        entries[target] = fe
    unknown = [n for n in entries if n not in slots]
    disabled = [n for n in entries if n in slots and slots[n].quantizer is None]
    if strict and (unknown or disabled):
        parts = []
        if unknown:
            hint = ("; names are '<module>.input.<i>', '<module>.output.<i>' and '<module>.<param>'"
                    if any("_quantizers." in n for n in unknown) else "")
            parts.append(f"no such tensor in the model: {_shortlist(unknown)}{hint}")
        if disabled:
            parts.append(f"quantizer disabled in the model: {_shortlist(disabled)}")
        raise ValueError("apply_encodings (strict=True): " + "; ".join(parts) + " (pass strict=False to skip them)")
    if not partial:
        absent = [t for t, s in slots.items() if s.quantizer is not None and t not in entries]
        if absent:
            raise ValueError(f"apply_encodings (partial=False): no entry for {_shortlist(absent)}")
    plan = [_resolve(slots[n], fe) for n, fe in entries.items() if n in slots and slots[n].quantizer is not None]
    for pending in plan:
        pending.apply()
        q = pending.quantizer
        if requires_grad is not None:
            for p in q.parameters():
                p.requires_grad_(requires_grad)
        if allow_overwrite is not None:
            q.allow_overwrite(allow_overwrite)
