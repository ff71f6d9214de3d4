r"""Functional affine quantization (AIMET ``quantization.affine`` signatures).

Each function takes the grid in one of three forms:

* ``f(tensor, scale, offset, bitwidth, signed=False, block_size=None)``
* ``f(tensor, scale, offset, *, num_steps, signed=False, block_size=None)``
* ``f(tensor, scale, offset, *, qmin, qmax, block_size=None)``

``bitwidth`` is the only grid argument accepted by position; ``num_steps`` and
``qmin``/``qmax`` are keyword-only, so a call is never read by guessing types.
Every function also takes ``out=`` (a tensor of the result's shape and dtype,
possibly the input itself) to write into a reused buffer; ``out=`` does not
support autograd. ``scale`` must be positive and finite and ``offset`` finite
(``ValueError`` otherwise; an offset that puts zero off the grid is fine), both
on the input's device.
Formulas (``offset = -zero_point``, ``round`` half to even, true division)::

    quantize(x)           = clamp(round(x / scale) - offset, qmin, qmax)
    dequantize(q)         = (q + offset) * scale
    quantize_dequantize() = dequantize(quantize(x))

>>> input = torch.arange(start=-0.3, end=1.3, step=0.05)
>>> scale, offset = torch.tensor(1/15), torch.tensor(0.0)
>>> quantize_dequantize(input, scale, offset, bitwidth=4)[6:10]
tensor([0.0000, 0.0667, 0.1333, 0.1333])
>>> quantize(input, scale, offset, num_steps=15)[7:10]
tensor([1., 2., 2.])
"""

from __future__ import annotations

from typing import Any

import torch

from quanta.grids.affine import IntegerGrid, resolve_grid
from quanta.kernels import affine as kernels
from quanta.kernels.blocks import check_block_size

__all__ = ["quantize", "quantize_dequantize", "dequantize"]


def _as_param(name: str, value: Any, like: torch.Tensor) -> torch.Tensor:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return torch.tensor(float(value), dtype=torch.float32, device=like.device)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a tensor or a number, got {type(value).__name__}")
    if value.device != like.device:
        raise ValueError(f"{name} is on {value.device} but the input is on {like.device}; move them to one device")
    if value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must be a real tensor, got dtype {value.dtype}")
    if not value.is_floating_point():
        value = value.to(torch.float32)
    return value.as_subclass(torch.Tensor) if type(value) is not torch.Tensor else value


def _check_scale(scale: torch.Tensor) -> None:
    s = scale.detach()
    bad = ~((s > 0) & torch.isfinite(s))  # NaN compares False, so it is caught too
    if bool(bad.any()):
        raise ValueError(f"scale must be positive and finite; {int(bad.sum())} of its entries are <= 0, inf or NaN")


def _check_offset(offset: torch.Tensor) -> None:
    # any finite offset is valid (zero need not be on the grid); NaN/inf would make every result NaN
    bad = ~torch.isfinite(offset.detach())
    if bool(bad.any()):
        raise ValueError(f"offset must be finite; {int(bad.sum())} of its entries are inf or NaN")


def _parse(args: tuple, kwargs: dict, fname: str) -> tuple[IntegerGrid, tuple[int, ...] | None]:
    names = ("bitwidth", "signed", "block_size")
    if len(args) > len(names):
        raise TypeError(f"{fname}() takes at most {3 + len(names)} positional arguments")
    params = dict(zip(names, args))
    for k, v in kwargs.items():
        if k in params:
            raise TypeError(f"{fname}() got multiple values for argument {k!r}")
        params[k] = v
    allowed = {"bitwidth", "signed", "block_size", "num_steps", "qmin", "qmax"}
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise TypeError(f"{fname}() got unexpected keyword arguments {unknown}; allowed: {sorted(allowed)}")
    block_size = check_block_size(params.pop("block_size", None))
    grid = resolve_grid(
        params.get("bitwidth"),
        params.get("signed"),
        num_steps=params.get("num_steps"),
        qmin=params.get("qmin"),
        qmax=params.get("qmax"),
    )
    return grid, block_size


def _check_input(tensor: Any) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_floating_point():
        raise TypeError(f"tensor must be floating point (float16/bfloat16/float32/float64), got {tensor.dtype}")
    return tensor.as_subclass(torch.Tensor) if type(tensor) is not torch.Tensor else tensor


def quantize(tensor: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    r"""Quantize: ``clamp(round(tensor / scale) - offset, qmin, qmax)``.

    The codes are returned as floats (the input's dtype, or float32 if that
    dtype cannot hold every code). See the module docstring for the overloads.

    >>> quantize(torch.tensor([-1.0, 0.26, 9.0]), torch.tensor(0.1), torch.tensor(0.0), 4, True)
    tensor([-8.,  3.,  7.])
    """
    x = _check_input(tensor)
    out = kwargs.pop("out", None)
    grid, block_size = _parse(args, kwargs, "quantize")
    scale, offset = _as_param("scale", scale, x), _as_param("offset", offset, x)
    _check_scale(scale)
    _check_offset(offset)
    return kernels.quantize(x, scale, offset, grid, block_size, out=out)


def quantize_dequantize(
    tensor: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, *args: Any, **kwargs: Any
) -> torch.Tensor:
    r"""Fake-quantize: ``(clamp(round(tensor / scale) - offset, qmin, qmax) + offset) * scale``.

    The result has the input's dtype. With ``block_size`` ``B``, element
    ``j`` uses ``scale[i]`` with ``i_d = floor(j_d / B_d)`` over the trailing
    dimensions. See the module docstring for the overloads.

    >>> w = torch.tensor([[0.1, 0.9], [1.0, 3.0]])
    >>> quantize_dequantize(w, torch.tensor([[0.1], [0.5]]), torch.zeros(2, 1), qmin=-8, qmax=7)
    tensor([[0.1000, 0.7000],
            [1.0000, 3.0000]])
    """
    x = _check_input(tensor)
    out = kwargs.pop("out", None)
    grid, block_size = _parse(args, kwargs, "quantize_dequantize")
    scale, offset = _as_param("scale", scale, x), _as_param("offset", offset, x)
    _check_scale(scale)
    _check_offset(offset)
    return kernels.quantize_dequantize(x, scale, offset, grid, block_size, out=out)


def dequantize(
    tensor: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    block_size: tuple[int, ...] | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""Dequantize codes: ``(tensor + offset) * scale``.

    ``tensor`` may hold codes as floats or integers; integer codes give a
    result in ``scale``'s dtype.

    >>> dequantize(torch.tensor([-8, 3, 7], dtype=torch.int8), torch.tensor(0.1), torch.tensor(0.0))
    tensor([-0.8000,  0.3000,  0.7000])
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    q = tensor.as_subclass(torch.Tensor) if type(tensor) is not torch.Tensor else tensor
    if q.dtype == torch.bool or q.is_complex():
        raise TypeError(f"tensor must hold integer codes as a real (integer or float) tensor, got dtype {q.dtype}")
    scale, offset = _as_param("scale", scale, q), _as_param("offset", offset, q)
    _check_scale(scale)
    _check_offset(offset)
    return kernels.dequantize(q, scale, offset, check_block_size(block_size), out=out)
