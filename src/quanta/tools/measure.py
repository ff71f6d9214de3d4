"""Measurements shared by ``quanta demo``, ``quanta quantize`` and ``quanta bench``.

Output SQNR in dB (:func:`sqnr_db`), a model's outputs as one flat tensor (:func:`flat_outputs`), weight
storage in bytes (:func:`weight_bytes`, for simulated and for real quantized storage) and forward time
relative to a baseline model (:func:`time_ratio`). A batch is one tensor, or a tuple of tensors for a model
with several inputs (:func:`call_model` runs ``model(*batch)``; :func:`batch_shape` / :func:`format_batch_shape`
give each input's shape).

>>> x = torch.tensor([3.0, 4.0])
>>> sqnr_db(x, x)
inf
>>> round(sqnr_db(x, x + torch.tensor([0.5, 0.0])), 2)  # 25 / 0.25 = 100
20.0
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn

__all__ = ["batch_shape", "call_model", "flat_outputs", "format_batch_shape", "forward_time", "set_eval", "sqnr_db",
           "time_ratio", "weight_bytes"]

#: One batch of model inputs: a tensor, or a tuple of tensors (the positional inputs of ``model.forward``).
Batch = torch.Tensor | tuple[torch.Tensor, ...]


def call_model(model: Any, batch: Batch) -> Any:
    """``model(*batch)`` for a tuple of inputs, else ``model(batch)``."""
    return model(*batch) if isinstance(batch, tuple) else model(batch)


def batch_shape(batch: Batch) -> tuple[Any, ...]:
    """A tensor's shape as a tuple of ints; for a tuple of inputs, the tuple of their shapes.

    >>> batch_shape((torch.zeros(2, 3), torch.zeros(2)))
    ((2, 3), (2,))
    """
    if isinstance(batch, tuple):
        return tuple(tuple(t.shape) for t in batch)
    return tuple(batch.shape)


def format_batch_shape(shape: tuple[Any, ...]) -> str:
    """``"shape (4, 16)"`` for one input, ``"shapes (4, 16), (4, 16)"`` for several (:func:`batch_shape`'s output).

    >>> format_batch_shape(((4, 16), (4, 16)))
    'shapes (4, 16), (4, 16)'
    """
    if shape and all(isinstance(s, tuple) for s in shape):
        return "shapes " + ", ".join(str(tuple(s)) for s in shape)
    return f"shape {tuple(shape)}"


def sqnr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    """``10 log10(sum(ref²) / sum((out - ref)²))`` in float64; ``inf`` when ``out`` equals ``ref``."""
    ref, out = ref.double(), out.double()
    noise = (out - ref).pow(2).sum()
    if float(noise) == 0:
        return math.inf
    return float(10 * torch.log10(ref.pow(2).sum() / noise))


def flat_outputs(out: Any) -> torch.Tensor:
    """Every floating-point tensor in a model's output (any nesting of tuples/lists/dicts), flattened and
    concatenated (tensor subclasses as plain tensors); ValueError if there is none.

    >>> flat_outputs((torch.ones(2, 2), {"n": torch.tensor([1]), "y": torch.zeros(1)})).tolist()
    [1.0, 1.0, 1.0, 1.0, 0.0]
    """
    leaves = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not leaves:
        raise ValueError("the model returns no floating-point tensor to compare")
    return torch.cat([t.detach().as_subclass(torch.Tensor).reshape(-1) for t in leaves])


def weight_bytes(model: nn.Module) -> int:
    """Bytes to store the model's parameters.

    A parameter of a QuantizationSimModel's quantized module (``QuantizationMixin``) with a quantizer counts
    ``bits/8`` per element plus 4 bytes per scale (and per non-zero offset); a parameter holding real quantized
    storage (``quantize_``'s ``AffineQuantizedTensor`` / ``LinearActivationQuantizedTensor``) counts its
    ``storage_nbytes``; any other parameter counts ``numel * element_size`` (quantizer ranges are not counted).

    >>> weight_bytes(nn.Linear(4, 2))  # 10 float32 values
    40
    """
    from quanta.nn import QuantizationMixin
    from quanta.quantization import QuantizerBase

    total = 0
    seen = {id(p) for m in model.modules() if isinstance(m, QuantizerBase) for p in m.parameters()}  # ranges
    for module in model.modules():
        if isinstance(module, QuantizationMixin):
            for name, p in module.named_parameters(recurse=False):
                seen.add(id(p))
                q = module.param_quantizers[name] if name in module.param_quantizers else None  # noqa: SIM401
                if q is None:
                    total += _stored_bytes(p)
                    continue
                enc = q.get_encodings()
                bits = enc.bitwidth
                n_scales = enc.scale.numel()
                offsets = int((enc.offset != 0).sum()) if hasattr(enc, "offset") else 0
                total += (p.numel() * bits + 7) // 8 + 4 * (n_scales + offsets)
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += _stored_bytes(p)
    return total


def _stored_bytes(p: torch.Tensor) -> int:
    nbytes = getattr(p, "storage_nbytes", None)
    return int(nbytes) if nbytes is not None else p.numel() * p.element_size()


def set_eval(model: nn.Module) -> nn.Module:
    """``model.eval()``, except for a ``torch.export`` program's module, which refuses ``eval()`` and stays in
    the mode it was exported in."""
    try:
        model.eval()
    except (NotImplementedError, RuntimeError):
        pass
    return model


@torch.no_grad()
def forward_time(model: nn.Module, x: Batch, reps: int = 20) -> float:
    """The best of ``reps`` timed forward calls of ``model`` (eval mode, no grad) on ``x`` (a tensor, or a tuple
    of inputs: ``model(*x)``), in seconds, after one untimed warm-up call."""
    set_eval(model)
    call_model(model, x)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        call_model(model, x)
        best = min(best, time.perf_counter() - t0)
    return best


def time_ratio(model: nn.Module, baseline: nn.Module, x: Batch, rounds: int = 3, reps: int = 7) -> float:
    """Forward time of ``model`` over that of ``baseline`` on ``x`` (a tensor, or a tuple of inputs): the two are timed in alternating rounds
    (so both see the same machine load), keeping the best time of each."""
    t_model = t_base = float("inf")
    for _ in range(rounds):
        t_model = min(t_model, forward_time(model, x, reps=reps))
        t_base = min(t_base, forward_time(baseline, x, reps=reps))
    return t_model / t_base
