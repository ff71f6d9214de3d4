"""Affine quantization (AIMET convention, ``offset = -zero_point``): the entry points.

    Q(x)   = clamp(round(x / s) - o, qmin, qmax)      round = half to even
    DQ(q)  = (q + o) * s
    QDQ(x) = DQ(Q(x))

:func:`quantize`, :func:`dequantize` and :func:`quantize_dequantize` run the kernels of
:mod:`quanta.kernels.affine_impl` (precision, special values and gradients are described there). Under
``torch.compile`` and ``torch.export`` (``torch.compiler.is_compiling()``) they call the same kernels as the
custom ops of :mod:`quanta.kernels.ops`, which the tracers can see.
"""

from __future__ import annotations

import torch

from quanta.grids.affine import IntegerGrid
from quanta.kernels import affine_impl as _impl
from quanta.kernels import ops as _ops
from quanta.kernels.affine_impl import QDQ, AffinePlan, Q, backward_raw, codes_dtype, forward_raw, plan

__all__ = ["quantize", "dequantize", "quantize_dequantize", "codes_dtype", "QDQ", "Q", "forward_raw",
           "backward_raw", "AffinePlan", "plan"]


def _refuse_out(out: torch.Tensor | None) -> None:
    # the custom ops mutate nothing (mutates_args=()), so they have no out=
    if out is not None:
        raise RuntimeError("out= is not supported under torch.compile / torch.export")


def _apply(mode, x, scale, offset, grid, block_size, out_dtype, out):
    if not torch.compiler.is_compiling():
        return _impl.apply(mode, x, scale, offset, grid, block_size, out_dtype, out)
    _impl.check_float("input", x)
    _refuse_out(out)
    return (_ops.quantize_dequantize if mode == QDQ else _ops.quantize)(x, scale, offset, grid, block_size)


def quantize_dequantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    grid: IntegerGrid,
    block_size: tuple[int, ...] | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fake-quantize: ``(clamp(round(x/s) - o, qmin, qmax) + o) * s``, in ``x.dtype``.

    ``out`` (same shape and dtype as ``x``; may be ``x`` itself) receives the
    result instead of a new tensor; it cannot be combined with autograd.

    Args:
        x: floating-point input.
        scale: positive scale, shaped per :mod:`quanta.kernels.blocks`.
        offset: offset (``-zero_point``), broadcastable to ``scale``.
        grid: integer grid ``[qmin, qmax]``.
        block_size: block size per scale dimension (``-1`` = wildcard), or None.

    >>> x = torch.tensor([0.0, 0.05, 0.1, 2.0])
    >>> quantize_dequantize(x, torch.tensor(0.1), torch.tensor(0.0), IntegerGrid(0, 15))
    tensor([0.0000, 0.0000, 0.1000, 1.5000])
    """
    return _apply(QDQ, x, scale, offset, grid, block_size, x.dtype, out)


def quantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    grid: IntegerGrid,
    block_size: tuple[int, ...] | None = None,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Quantize: ``clamp(round(x/s) - o, qmin, qmax)`` as floats holding integer codes.

    The result's dtype is :func:`codes_dtype` of the input (``x.dtype`` unless
    that dtype cannot hold every code exactly). ``out`` as in :func:`quantize_dequantize`.

    >>> quantize(torch.tensor([0.0, 0.05, 0.15, 2.0]), torch.tensor(0.1), torch.tensor(0.0), IntegerGrid(0, 15))
    tensor([ 0.,  0.,  2., 15.])
    """
    return _apply(Q, x, scale, offset, grid, block_size, codes_dtype(x.dtype, grid), out)


def dequantize(
    q: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    block_size: tuple[int, ...] | None = None,
    *,
    output_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dequantize codes: ``(q + o) * s``.

    ``q`` may hold the codes as floats or as integers. The arithmetic runs in
    float32, or float64 when ``q``, ``scale`` or ``offset`` is float64 or ``q`` is
    a 32/64-bit integer; the result has ``output_dtype`` (default: ``q.dtype``
    for float codes, ``scale.dtype`` for integer codes). ``out`` receives the
    result (no autograd).

    >>> dequantize(torch.tensor([0, 2, 15], dtype=torch.uint8), torch.tensor(0.1), torch.tensor(0.0))
    tensor([0.0000, 0.2000, 1.5000])
    """
    if not torch.compiler.is_compiling():
        return _impl.dequantize(q, scale, offset, block_size, output_dtype=output_dtype, out=out)
    _impl.check_codes(q)
    _refuse_out(out)
    return _ops.dequantize(q, scale, offset, block_size, output_dtype)
