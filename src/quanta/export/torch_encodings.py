"""AIMET's module-keyed encodings file, ``<prefix>_torch.encodings``: what AIMET's ``load_encodings`` reads.

AIMET's ``sim.export`` writes it beside the tensor-keyed ``<prefix>.encodings`` (its
``save_encodings_to_json`` writes the same layout without ``version``), and
``QuantizationSimModel.load_encodings`` of AIMET reads only this layout::

    {"version": "1.0.0",                  # the export's version; the entries are 0.6.1 ones whatever it says
     "activation_encodings": {"conv1": {"input": {"0": {...}}}, "relu1": {"output": {"0": {...}}}},
     "param_encodings": {"conv1.weight": [{...}, {...}, ...]},      # one dict per channel
     "excluded_layers": [...], "quantizer_args": {...}, "producer": {...}}

Each ``{...}`` is a 0.6.1 entry (``bitwidth``, ``dtype``, ``is_symmetric``, ``min``, ``max``, ``scale``,
``offset``; float: ``bitwidth`` and ``dtype`` only). AIMET's reader sets a quantizer from ``min``/``max``,
``bitwidth`` and ``is_symmetric`` (signed when symmetric) and reshapes the flat list to the quantizer's
shape, so an entry carries no layout: per-channel and per-block scales are listed in the row-major order
of the quantizer's scale. An activation with one scale is a dict, several a list (AIMET's ``sim.export``
writes only the first element of an activation's list; quanta writes them all, as AIMET's
``save_encodings_to_json`` does).

quanta names the entries ``"<module>.input.<i>"``, ``"<module>.output.<i>"`` and ``"<module>.<param>"``,
the tensor names of :mod:`quanta.export.sim_encodings`, so a ``_torch.encodings`` file maps onto a
simulation's quantizers directly.

>>> import torch
>>> from quanta.encodings.affine import AffineEncoding
>>> enc = AffineEncoding(torch.tensor(0.05), torch.tensor(-12.0), 8)
>>> doc = torch_encodings_to_dict({"fc.output.0": enc}, {}, "1.0.0")
>>> doc["activation_encodings"]["fc"]["output"]["0"]["offset"], doc["version"]
(-12, '1.0.0')
>>> acts, params = parse_module_keyed(doc["activation_encodings"], doc["param_encodings"])
>>> acts["fc.output.0"].to_affine((), None, enc.grid) == enc
True
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from quanta.export.encodings import (
    Encoding,
    EncodingsVersion,
    _check_names,
    _entry_0_6_1,
    default_producer,
    parse_module_keyed,
)

__all__ = ["TORCH_SUFFIX", "parse_module_keyed", "split_activation_name", "torch_encodings_to_dict"]

#: the file name AIMET gives it: ``<prefix>_torch.encodings``
TORCH_SUFFIX = "_torch.encodings"

_ACTIVATION = re.compile(r"^(?:(?P<module>.+)\.)?(?P<kind>input|output)\.(?P<index>\d+)$")


def split_activation_name(name: str) -> tuple[str, str, int]:
    """``(module, "input" | "output", index)`` of an activation tensor name.

    >>> split_activation_name("layers.0.attn.output.1")
    ('layers.0.attn', 'output', 1)
    """
    m = _ACTIVATION.match(name)
    if m is None:
        raise ValueError(f"activation name {name!r} is not '<module>.input.<i>' or '<module>.output.<i>'")
    return m["module"] or "", m["kind"], int(m["index"])


def torch_encodings_to_dict(
    activations: Mapping[str, Encoding],
    params: Mapping[str, Encoding],
    version: EncodingsVersion | str = EncodingsVersion.V1_0_0,
    *,
    excluded_layers: Iterable[str] = (),
    quantizer_args: Mapping[str, Any] | None = None,
    symmetric: Mapping[str, bool] | None = None,
    producer: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON document of a ``_torch.encodings`` file (``version`` 0.6.1 or 1.0.0, as AIMET writes it).

    Args:
        activations: ``"<module>.input.<i>"`` / ``"<module>.output.<i>"`` → encoding.
        params: ``"<module>.<param>"`` → encoding.
        symmetric: the quantizers' symmetric flags by name (``is_symmetric``; see
            :func:`quanta.export.encodings.encodings_to_dict`).

    Raises ValueError (naming the tensor) for what 0.6.1 entries cannot hold: a float scale other than 1,
    a grid that is neither a full nor a strict symmetric one.
    """
    version = EncodingsVersion.parse(version)
    if version.is_2x:
        raise ValueError(f"a _torch.encodings file holds 0.6.1 entries under version 0.6.1 or 1.0.0 (as AIMET "
                         f"writes it), not {version.value}")
    _check_names(activations, params)
    flags = dict(symmetric or {})
    acts: dict[str, dict[str, dict[str, Any]]] = {}
    for name, enc in activations.items():
        module, kind, index = split_activation_name(name)
        entries = _entry_0_6_1(name, enc, flags.get(name), blocks=True)
        acts.setdefault(module, {}).setdefault(kind, {})[str(index)] = entries[0] if len(entries) == 1 else entries
    pars = {name: _entry_0_6_1(name, enc, flags.get(name), blocks=True) for name, enc in params.items()}
    excluded = list(excluded_layers)
    if not all(isinstance(x, str) for x in excluded):
        raise TypeError(f"excluded_layers must be strings, got {excluded!r}")
    return {"producer": dict(default_producer() if producer is None else producer), "version": version.value,
            "activation_encodings": acts, "param_encodings": pars, "excluded_layers": excluded,
            "quantizer_args": dict(quantizer_args or {})}
