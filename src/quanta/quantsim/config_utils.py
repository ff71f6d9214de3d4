"""Weight quantizers of a simulated model set to blockwise or LPBQ after construction (AIMET's
``aimet_torch.quantsim.config_utils``).

Which modules: a list of module types, a list of the sim's modules, or a predicate on a module. Only
modules whose weight is quantized (a weight quantizer that is not None) are changed. A single ``int``
``block_size`` applies along the weight's input-channel dimension, with one scale per output channel; a
tuple gives the block size per weight dimension (``-1``: the whole dimension).

>>> import torch
>>> from torch import nn
>>> from quanta.quantsim import QuantizationSimModel
>>> from quanta.quantsim.config_utils import set_grouped_blockwise_quantization_for_weights
>>> model = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 4))
>>> sim = QuantizationSimModel(model, torch.randn(2, 64))
>>> set_grouped_blockwise_quantization_for_weights(sim, [nn.Linear], bitwidth=4, symmetric=True,
...                                                decompressed_bw=8, block_size=16)
>>> sim.model.get_submodule("0").param_quantizers["weight"]
GroupedBlockQuantizeDequantize(shape=(16, 4), block_size=(1, 16), qmin=-8, qmax=7, symmetric=True, decompressed_bw=8, block_grouping=(1, -1))
>>> sim.model.get_submodule("2").param_quantizers["weight"].shape  # 16 input channels: one block
(4, 1)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from quanta.nn import QuantizationMixin
from quanta.quantization.affine import GroupedBlockQuantizeDequantize, QuantizeDequantize
from quanta.quantsim.quantsim import QuantizationSimModel

__all__ = ["set_blockwise_quantization_for_weights", "set_grouped_blockwise_quantization_for_weights"]

Selection = Sequence[type[nn.Module]] | Sequence[nn.Module] | Callable[[nn.Module], bool]


def set_blockwise_quantization_for_weights(sim: QuantizationSimModel, arg: Selection, bitwidth: int,
                                           symmetric: bool, block_size: int | Sequence[int]) -> None:
    """Give the selected modules' weights a :class:`QuantizeDequantize` per block of ``block_size``
    (uninitialised: run ``compute_encodings`` after)."""
    _replace([(module, QuantizeDequantize(shape, bitwidth, symmetric, None, blocks))
              for module, shape, blocks in _selected(sim, arg, block_size)])


def set_grouped_blockwise_quantization_for_weights(sim: QuantizationSimModel, arg: Selection, bitwidth: int,
                                                   symmetric: bool, decompressed_bw: int,
                                                   block_size: int | Sequence[int],
                                                   block_grouping: int | Sequence[int] = -1) -> None:
    """Give the selected modules' weights a :class:`GroupedBlockQuantizeDequantize` (LPBQ) per block of
    ``block_size``, with ``block_grouping`` blocks sharing a float scale: an ``int`` groups along the
    input-channel dimension (``-1``, the default: every block of an output channel), a tuple gives it per
    dimension of the block scales."""
    _replace([(module, GroupedBlockQuantizeDequantize(
        shape, bitwidth, symmetric, decompressed_bw, None, blocks,
        _per_dimension(module, block_grouping, "block_grouping", fill=1)))
        for module, shape, blocks in _selected(sim, arg, block_size)])


def _selected(sim: QuantizationSimModel, arg: Selection, block_size: int | Sequence[int]
              ) -> list[tuple[QuantizationMixin, tuple[int, ...], tuple[int, ...]]]:
    """``(module, scale shape, block size)`` for every selected module with a weight quantizer; ValueError naming
    every module whose weight the block size does not divide, before any is changed."""
    condition = _condition(arg)
    chosen, misfits = [], []
    for name, module in sim.named_qmodules():
        quantized = "weight" in module.param_quantizers and module.param_quantizers["weight"] is not None
        if not quantized or not condition(module):
            continue
        blocks = _per_dimension(module, block_size, "block_size", fill=-1, per_channel=True)
        weight = tuple(module.weight.shape)
        if any(b != -1 and n % b for n, b in zip(weight, blocks)):
            misfits.append(f"{name} {weight}")
            continue
        chosen.append((module, tuple(1 if b == -1 else n // b for n, b in zip(weight, blocks)), blocks))
    if misfits:
        raise ValueError(f"block_size {block_size!r} does not divide the weight of {', '.join(misfits)}")
    return chosen


def _condition(arg: Selection) -> Callable[[nn.Module], bool]:
    if callable(arg) and not isinstance(arg, (list, tuple)):
        return arg
    if isinstance(arg, (list, tuple)) and arg and all(isinstance(a, type) and issubclass(a, nn.Module)
                                                      for a in arg):
        types = tuple(arg)
        return lambda m: isinstance(m, types)
    if isinstance(arg, (list, tuple)) and arg and all(isinstance(a, nn.Module) for a in arg):
        ids = {id(a) for a in arg}
        return lambda m: id(m) in ids
    raise TypeError("arg must be a list of module types, a list of the sim's modules or a callable "
                    f"module -> bool, got {arg!r}")


def _per_dimension(module: QuantizationMixin, value: Any, what: str, *, fill: int,
                   per_channel: bool = False) -> tuple[int, ...]:
    """``value`` per weight dimension: a tuple as given (one entry per dimension), an ``int`` along the input
    channels, ``fill`` elsewhere (``1`` on the output channels with ``per_channel``)."""
    ndim = module.weight.dim()
    if isinstance(value, (list, tuple)):
        if len(value) != ndim or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ValueError(f"{what} {tuple(value)} must have one int per dimension of the weight "
                             f"{tuple(module.weight.shape)}")
        return tuple(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int or a tuple of ints, got {value!r}")
    if ndim < 2:
        raise ValueError(f"{what} as one int needs a weight with input and output channels, got "
                         f"{type(module).__name__} with weight shape {tuple(module.weight.shape)}")
    out_dim = module._weight_axis()
    out = [fill] * ndim
    out[1 - out_dim] = value  # input channels: dim 1, or 0 where the output channels are dim 1
    if per_channel:
        out[out_dim] = 1
    return tuple(out)


def _replace(new: list[tuple[QuantizationMixin, nn.Module]]) -> None:
    """Install every new weight quantizer (all built first: a bad argument changes nothing), on the device of the
    one it replaces."""
    for module, quantizer in new:
        old = module.param_quantizers["weight"]
        device = old.min.device if isinstance(getattr(old, "min", None), nn.Parameter) else module.weight.device
        module.param_quantizers["weight"] = quantizer.to(device)
