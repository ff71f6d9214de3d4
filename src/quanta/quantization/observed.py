"""What calibration configs' first step attaches to a model: observers of Linear inputs, fed by forward hooks.

>>> import torch
>>> lin = torch.nn.Linear(3, 2)
>>> obs = HessianObserver(3)
>>> attach_observer(lin, "_my_observer", obs, obs.update)
>>> _ = lin(torch.ones(4, 3))
>>> detach_observer(lin, "_my_observer") is obs, obs.count, len(lin._forward_pre_hooks)
(True, 4, 0)
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from quanta.quantization.linear_like import layer_input
from quanta.quantization.quant_api import AOBaseConfig, CalibrationConfig, ModuleFqnToConfig

__all__ = ["HessianObserver", "output_mse", "attach_observer", "detach_observer", "check_base_config",
           "check_step"]


class HessianObserver:
    """Accumulates ``H = 2 X X^T / T`` over every input row ``x`` (``[..., K]``) a Linear layer sees.

    Sums in float32 (float64 if the inputs are float64); ``hessian()`` divides
    by the count at the end, so the order of the batches does not matter beyond
    float rounding.

    >>> obs = HessianObserver(3)
    >>> obs.update(torch.tensor([[1.0, 0.0, 2.0]]))
    >>> obs.hessian()
    tensor([[2., 0., 4.],
            [0., 0., 0.],
            [4., 0., 8.]])
    """

    def __init__(self, in_features: int) -> None:
        self.in_features = in_features
        self.sum = torch.zeros(in_features, in_features)
        self.count = 0

    def update(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"input has {x.shape[-1]} features, the layer takes {self.in_features}")
        rows = x.detach().reshape(-1, self.in_features)
        rows = rows.double() if rows.dtype == torch.float64 else rows.float()
        if self.sum.dtype != rows.dtype:
            self.sum = self.sum.to(rows.dtype)
        self.sum.addmm_(rows.t(), rows)
        self.count += rows.shape[0]

    def hessian(self) -> torch.Tensor:
        if self.count == 0:
            raise ValueError("no input observed")
        return self.sum * (2.0 / self.count)


def output_mse(delta: torch.Tensor, hessian: torch.Tensor) -> float:
    """Mean squared output error ``mean((delta @ x)^2)`` over the observed inputs, from ``H = 2 X X^T / T``.

    ``delta`` is the weight change ``[N, K]``: ``sum((delta H) * delta) / (2 N)``, exact on the calibration
    inputs without keeping them.
    """
    d = delta.to(hessian.dtype)
    return float(((d @ hessian) * d).sum() / (2 * d.shape[0]))


def check_base_config(base_config: object, what: str) -> None:
    """TypeError unless ``base_config`` is a plain ``quantize_`` config (not a calibration config or a mapping)."""
    if not isinstance(base_config, AOBaseConfig) or isinstance(base_config, (CalibrationConfig, ModuleFqnToConfig)):
        raise TypeError(f"{what}.base_config must be a quantize_ config such as Int4WeightOnlyConfig(group_size=128) "
                        f"or Int8WeightOnlyConfig(), got {base_config!r}")


def check_step(step: object, allowed: tuple[str, ...], what: str) -> None:
    if step not in allowed:
        raise ValueError(f"{what}.step must be one of {allowed}, got {step!r}")


def attach_observer(module: nn.Module, attr: str, observer: object, update: Callable[[torch.Tensor], None]) -> None:
    """Give ``module`` an observer fed by a forward pre-hook (replacing one already there)."""
    detach_observer(module, attr)
    handle = module.register_forward_pre_hook(lambda _m, args, kwargs: update(layer_input(args, kwargs)),
                                              with_kwargs=True)
    setattr(module, attr, (observer, handle))


def detach_observer(module: nn.Module, attr: str) -> object:
    """Remove the observer ``attach_observer`` gave ``module`` (and its hook); return it, or None."""
    entry = module.__dict__.pop(attr, None)
    if entry is None:
        return None
    entry[1].remove()
    return entry[0]


