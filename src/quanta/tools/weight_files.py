"""The fake-quantized weight file ``quanta quantize`` writes (``model.safetensors``) and its encodings metadata.

The file holds the model's state dict with every quantized parameter replaced by its fake-quantized value
(float, on the quantization grid), and a ``"quanta.encodings"`` metadata entry (JSON) giving each such
parameter's encoding: scale, offset, grid, granularity. No pickle.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

__all__ = ["WEIGHTS_METADATA_KEY", "save_fake_quantized_weights", "weight_encodings"]

#: safetensors metadata key of the weights' encodings (JSON).
WEIGHTS_METADATA_KEY = "quanta.encodings"


def weight_encodings(sim: Any) -> dict[str, dict[str, Any]]:
    """``{parameter name in the state dict: its encoding}`` for every quantized parameter of ``sim``.

    Each entry is the encoding's :meth:`~quanta.encodings.affine.AffineEncoding.to_dict` (``scale``,
    ``offset``, ``shape``, ``qmin``, ``qmax``, ``block_size``; float encodings: the format's bits) plus
    ``type`` (``"affine"``/``"float"``), ``quantizer``, ``bitwidth``, ``symmetric``, ``granularity``
    (``per_tensor``/``per_channel``/``per_block``) and ``axis`` (the channel axis, or None).
    """
    from quanta.encodings.float import FloatEncoding

    out: dict[str, dict[str, Any]] = {}
    for name, module in sim.quantized_modules():
        prefix = f"{name}." if name else ""
        for pname, q in module.param_quantizers.items():
            if q is None or not q.is_initialized():
                continue
            enc = q.get_encodings()
            scale_shape = tuple(enc.scale.shape)
            channel_axes = [d for d, s in enumerate(scale_shape) if s > 1]
            entry: dict[str, Any] = {
                "quantizer": f"{prefix}param_quantizers.{pname}",
                "type": "float" if isinstance(enc, FloatEncoding) else "affine",
                "granularity": enc.granularity,
                "axis": None if enc.granularity == "per_tensor" else _channel_axis(enc.block_size, channel_axes),
            }
            if isinstance(enc, FloatEncoding):
                entry.update(bitwidth=enc.format.bits, format=enc.format.name(), symmetric=True)
            else:
                entry.update(bitwidth=enc.grid.bitwidth, symmetric=bool(getattr(q, "symmetric", False)))
            entry.update(enc.to_dict())
            out[f"{prefix}{pname}"] = entry
    return out


def _channel_axis(block_size: tuple[int, ...] | None, varying: list[int]) -> int | None:
    if block_size is not None:
        unblocked = [d for d in varying if block_size[d] in (1, -1)]
        return unblocked[0] if unblocked else None
    return varying[0] if varying else None


def save_fake_quantized_weights(sim: Any, path: str | os.PathLike) -> None:
    """Write ``sim.model``'s float state dict, quantized parameters fake-quantized, to a safetensors file.

    Quantizer state is left out, so the keys are those of the float model. The ``"quanta.encodings"``
    metadata entry holds :func:`weight_encodings` as JSON. The file is written atomically by
    :func:`quanta.dtypes.serialization.save_quantized` and loads with ``safetensors.torch.load_file``.
    """
    from quanta.dtypes.serialization import save_quantized

    quantizer_prefixes = tuple(f"{n}." for n, _ in sim.named_quantizers())
    fake: dict[str, torch.Tensor] = {}
    for name, module in sim.quantized_modules():
        prefix = f"{name}." if name else ""
        for pname, q in module.param_quantizers.items():
            if q is not None and q.is_initialized():
                with torch.no_grad():
                    fake[f"{prefix}{pname}"] = q(getattr(module, pname)).as_subclass(torch.Tensor).detach().clone()
    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, t in sim.model.state_dict(keep_vars=False).items():
        if key.startswith(quantizer_prefixes):
            continue
        t = fake.get(key, t)
        t = t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t
        if t.untyped_storage().data_ptr() in seen:  # safetensors refuses shared storage (tied weights)
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        state[key] = t.detach().contiguous()
    meta = {WEIGHTS_METADATA_KEY: json.dumps(weight_encodings(sim)), "producer": "quanta quantize"}
    save_quantized(state, path, metadata=meta)
