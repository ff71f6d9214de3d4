"""Layers that compute ``x W^T + b``: ``nn.Linear``, and transformers' ``Conv1D`` (GPT-2's layers), which stores
the transpose (``weight`` is ``[in_features, out_features]`` and its forward is ``addmm(bias, x, weight)``).

Configs and calibration algorithms work on the ``[out_features, in_features]`` weight (:func:`linear_weight`) and
give the layer back what it stores (:func:`stored_weight`: a quantized tensor transposed for ``Conv1D``, which its
``addmm`` runs through quanta's kernels).

>>> import torch
>>> lin = torch.nn.Linear(4, 3)
>>> is_linear_like(lin), tuple(linear_weight(lin).shape), in_features(lin)
(True, (3, 4), 4)
"""

from __future__ import annotations

import torch
from torch import nn

from quanta._inputs import call_model

__all__ = ["is_linear_like", "is_conv1d", "linear_weight", "stored_weight", "in_features", "layer_input",
           "linear_inputs"]


def is_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D`` (matched by name and shape, without importing transformers)."""
    w = getattr(module, "weight", None)
    return (type(module).__name__ == "Conv1D" and hasattr(module, "nf") and isinstance(w, torch.Tensor)
            and w.dim() == 2 and w.shape[1] == module.nf)


def is_linear_like(module: nn.Module) -> bool:
    return isinstance(module, nn.Linear) or is_conv1d(module)


def linear_weight(module: nn.Module, weight: torch.Tensor | None = None) -> torch.Tensor:
    """The layer's weight (or ``weight``, a value of it) as ``[out_features, in_features]``, detached."""
    w = (module.weight if weight is None else weight).detach()
    return w.t().contiguous() if is_conv1d(module) else w


def stored_weight(module: nn.Module, weight: torch.Tensor) -> torch.Tensor:
    """What the layer stores for an ``[out_features, in_features]`` weight (float or quantized)."""
    return weight.t() if is_conv1d(module) else weight


def in_features(module: nn.Module) -> int:
    return module.weight.shape[0] if is_conv1d(module) else module.weight.shape[1]


def layer_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The input of a Linear (``input``) or Conv1D (``x``) call, from a forward pre-hook's ``args``/``kwargs``."""
    return args[0] if args else next(iter(kwargs.values()))


@torch.no_grad()
def linear_inputs(model: nn.Module, batches: list) -> dict[str, torch.Tensor]:
    """Every Linear (and Conv1D) layer's input rows ``[rows, in_features]`` over ``batches`` (each passed as
    :func:`quanta._inputs.call_model` does: ``model(**batch)`` for a dict, ``model(*batch)`` for a tuple, else
    ``model(batch)``): what per-layer output errors are measured on.

    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    >>> {name: tuple(x.shape) for name, x in linear_inputs(net, [torch.randn(5, 4), torch.randn(2, 4)]).items()}
    {'0': (7, 4), '2': (7, 3)}
    """
    seen: dict[str, list[torch.Tensor]] = {}

    def keep(name: str):
        def hook(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            x = layer_input(args, kwargs)
            seen.setdefault(name, []).append(x.detach().reshape(-1, x.shape[-1]))
        return hook
    handles = [m.register_forward_pre_hook(keep(n), with_kwargs=True)
               for n, m in model.named_modules() if is_linear_like(m)]
    try:
        for b in batches:
            call_model(model, b)
    finally:
        for h in handles:
            h.remove()
    return {n: torch.cat(v) for n, v in seen.items()}
