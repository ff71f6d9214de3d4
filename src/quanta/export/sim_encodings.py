"""A QuantizationSimModel's encodings as AIMET encodings files: tensor names, export, and apply.

Tensor names (shared with the ONNX exporter), for the quantized module named ``m``:

* ``"m.input.<i>"``: its input quantizer ``i``; ``"m.output.<i>"``: its output quantizer ``i``;
* ``"m.<param>"``: the quantizer of parameter ``<param>`` (as in ``state_dict``, e.g. ``"conv1.weight"``).

>>> import torch
>>> from torch import nn
>>> from quanta.quantsim import QuantizationSimModel
>>> from quanta.export.encodings import encodings_to_dict
>>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
>>> x = torch.randn(32, 8)
>>> sim = QuantizationSimModel(model, x)
>>> sim.compute_encodings(lambda m: m(x), progress=False)
>>> acts, params = sim_encodings(sim)
>>> sorted(acts), sorted(params)
(['1.output.0', '2.output.0'], ['0.weight', '2.weight'])
>>> fresh = QuantizationSimModel(model, x)
>>> apply_encodings(fresh, encodings_to_dict(acts, params, "2.0.0"))
>>> torch.equal(fresh.model(x), sim.model(x))
True
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from quanta._text import shortlist as _shortlist
from quanta.encodings.affine import AffineEncoding
from quanta.export.encodings import (
    Encoding,
    EncodingsFile,
    EncodingsVersion,
    FileEncoding,
    read_encodings,
    write_encodings,
)
from quanta.export.protocol import QuantizedModelLike, SimulationLike
from quanta.grids.float import FloatFormat
from quanta.nn import QuantizationMixin
from quanta.quantization.affine.quantizer import AffineQuantizerBase
from quanta.quantization.base import QuantizerBase
from quanta.quantization.float import FloatQuantizeDequantize

__all__ = ["tensor_names", "sim_encodings", "export_encodings", "apply_encodings"]

# AIMET's names of quanta's schemes, for quantizer_args.quant_scheme.
_AIMET_SCHEMES = {
    "min_max": "post_training_tf",
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


def tensor_names(sim: QuantizedModelLike) -> dict[str, str]:
    """Tensor name → quantizer name (as in ``sim.named_quantizers()``) for every enabled quantizer.

    >>> import torch
    >>> from quanta.quantsim import QuantizationSimModel
    >>> sim = QuantizationSimModel(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.randn(2, 4))
    >>> tensor_names(sim)
    {'0.output.0': '0.output_quantizers.0', '0.weight': '0.param_quantizers.weight'}
    """
    return {s.tensor: s.where for s in _slots(sim) if s.quantizer is not None}


def sim_encodings(sim: QuantizedModelLike) -> tuple[dict[str, Encoding], dict[str, Encoding]]:
    """``(activations, params)``: the encoding of every initialised quantizer, by tensor name."""
    acts: dict[str, Encoding] = {}
    params: dict[str, Encoding] = {}
    for s in _slots(sim):
        if s.quantizer is None or not s.quantizer.is_initialized():
            continue
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
                     tensors: Collection[str] | None = None) -> None:
    """Write the encodings of every initialised quantizer of ``sim`` to ``path`` (atomically).

    ``tensors`` limits the file to these tensor names (e.g. those an ONNX export kept).

    ``is_symmetric``/``is_sym`` come from the quantizers themselves;
    ``excluded_layers`` lists ``sim.unquantized_modules``; ``quantizer_args``
    the sim's defaults (0.6.1 and 1.0.0; version 2.0.0 has neither). What a
    version cannot hold is a ValueError naming the tensor (see
    :func:`quanta.export.encodings.encodings_to_dict`).
    """
    version = EncodingsVersion.parse(version)
    acts, params = sim_encodings(sim)
    if tensors is not None:
        keep = set(tensors)
        acts = {k: v for k, v in acts.items() if k in keep}
        params = {k: v for k, v in params.items() if k in keep}
    symmetric = {s.tensor: s.quantizer.symmetric for s in _slots(sim)
                 if isinstance(s.quantizer, AffineQuantizerBase)}
    kwargs: dict[str, Any] = {"symmetric": symmetric}
    if version is not EncodingsVersion.V2_0_0:
        kwargs["excluded_layers"] = list(sim.unquantized_modules)
        kwargs["quantizer_args"] = _quantizer_args(sim, params, version)
    write_encodings(path, acts, params, version, **kwargs)


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


def _resolve(slot: _Slot, fe: FileEncoding) -> _Pending:
    q = slot.quantizer
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



def apply_encodings(
    sim: QuantizedModelLike,
    source: str | os.PathLike | Mapping[str, Any] | EncodingsFile,
    *,
    strict: bool = True,
    partial: bool = True,
    requires_grad: bool | None = None,
    allow_overwrite: bool | None = None,
) -> None:
    """Set ``sim``'s quantizers from an AIMET encodings file (any version), by tensor name.

    Args:
        source: a path, the parsed JSON object, or an :class:`EncodingsFile`.
        strict: a name that is not an enabled quantizer of ``sim`` is an error
            (otherwise it is skipped).
        partial: if False, every enabled quantizer of ``sim`` must have an entry.
        requires_grad: if given, ``requires_grad`` of the loaded ranges (QAT from loaded encodings).
        allow_overwrite: if given, whether a later ``compute_encodings`` may overwrite them.

    Everything is validated before anything is set, so a bad file changes
    nothing: names, integer vs float, bitwidth, signedness and symmetry against
    each quantizer's grid, the number of scales (reshaped to the quantizer's
    shape), axis and block size, offsets (zero point on the grid). Errors are
    ValueErrors naming the entry and its key; loading never executes code.
    """
    for flag, value in (("strict", strict), ("partial", partial)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool, got {value!r}")
    doc = source if isinstance(source, EncodingsFile) else read_encodings(source)
    entries = doc.encodings
    slots = {s.tensor: s for s in _slots(sim)}
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
