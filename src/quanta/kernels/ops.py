"""The fake-quant kernels as ``torch.library`` custom ops (namespace ``quanta``), for ``torch.compile`` and
``torch.export``.

The kernels of :mod:`quanta.kernels.affine_impl` and :mod:`quanta.kernels.float_cast_impl` run a native library
through :mod:`ctypes`, which neither Dynamo nor ``torch.export`` can trace. Registered as custom ops, each
is one opaque node in a compiled or exported graph: its implementation is the kernel layer's own forward
(native where it applies, eager PyTorch otherwise), so the bits are the same as in eager mode; a fake
implementation gives the output's shape and dtype to the tracer; the backward is the kernel layer's
straight-through rule, itself a custom op so that AOTAutograd can trace it.

==================================================  ==================================================
op                                                  eager counterpart
==================================================  ==================================================
``quanta::quantize_dequantize(x, s, o, qmin, qmax,  :func:`quanta.kernels.affine.quantize_dequantize`
block_size)``
``quanta::quantize(x, s, o, qmin, qmax,             :func:`quanta.kernels.affine.quantize` (codes in
block_size)``                                       :func:`~quanta.kernels.affine.codes_dtype`)
``quanta::dequantize(q, s, o, block_size,           :func:`quanta.kernels.affine.dequantize`
output_dtype)``
``quanta::float_quantize_dequantize(x, s,           :func:`quanta.kernels.float_cast.quantize_dequantize`
exponent_bits, mantissa_bits, special,
block_size)``
==================================================  ==================================================

plus their backward ops ``quanta::affine_backward`` and ``quanta::float_quantize_dequantize_backward``.
Granularity is the kernels' ``block_size`` (``None``: per tensor or per channel by broadcasting; ``-1`` a
wildcard); ``offset`` has ``scale``'s shape. The public kernel functions call these ops themselves while
``torch.compiler.is_compiling()`` (which ``torch.export`` sets too), so calling the ops directly is rarely
needed:

>>> x = torch.tensor([0.0, 0.05, 0.15, 2.0])
>>> torch.ops.quanta.quantize_dequantize(x, torch.tensor(0.1), torch.tensor(0.0), 0, 15, None)
tensor([0.0000, 0.0000, 0.2000, 1.5000])
>>> from quanta.kernels import affine
>>> s, o = torch.tensor(0.1), torch.tensor(0.0)
>>> g = IntegerGrid(0, 15)
>>> torch.equal(quantize_dequantize(x, s, o, g), affine.quantize_dequantize(x, s, o, g))
True

Gradients are those of the eager kernels (see :mod:`quanta.kernels.affine_impl`), computed by the same
backward code. One difference: in eager mode a QDQ whose scale and offset need no gradient keeps a one-byte
mask for backward; the custom op keeps a reference to its input and recomputes the mask (same values).
"""

from __future__ import annotations

import functools
from typing import Optional, Sequence

import torch

from quanta.grids.affine import IntegerGrid
from quanta.grids.float import FloatFormat, SpecialValues
from quanta.kernels import affine_impl as _affine
from quanta.kernels import float_cast_impl as _float
from quanta.kernels.blocks import BlockLayout, resolve_layout

__all__ = ["quantize_dequantize", "quantize", "dequantize", "float_quantize_dequantize"]

_QDQ, _Q = _affine.QDQ, _affine.Q


@functools.lru_cache(maxsize=256)
def _plan(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, scale_shape: tuple[int, ...],
          qmin: int, qmax: int, block_size: tuple[int, ...] | None, out_dtype: torch.dtype) -> _affine.AffinePlan:
    layout = resolve_layout(shape, scale_shape, block_size)
    return _affine.AffinePlan(layout, IntegerGrid(qmin, qmax), dtype, device, out_dtype)


def _affine_plan(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, qmin: int, qmax: int,
                 block_size: Sequence[int] | None, out_dtype: torch.dtype) -> _affine.AffinePlan:
    if offset.shape != scale.shape:
        raise ValueError(f"offset shape {tuple(offset.shape)} must equal scale shape {tuple(scale.shape)}")
    block = None if block_size is None else tuple(block_size)
    return _plan(tuple(x.shape), x.dtype, x.device, tuple(scale.shape), qmin, qmax, block, out_dtype)


def _codes_dtype(dtype: torch.dtype, qmin: int, qmax: int) -> torch.dtype:
    return _affine.codes_dtype(dtype, IntegerGrid(qmin, qmax))


# -- affine QDQ and Q ----------------------------------------------------------------------------------------
@torch.library.custom_op("quanta::quantize_dequantize", mutates_args=())
def _qdq_op(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, qmin: int, qmax: int,
            block_size: Optional[list[int]]) -> torch.Tensor:
    p = _affine_plan(x, scale, offset, qmin, qmax, block_size, x.dtype)
    return _affine.forward_raw(_QDQ, x, scale, offset, p, x.dtype)[0].contiguous()


@_qdq_op.register_fake
def _(x, scale, offset, qmin, qmax, block_size):
    return x.new_empty(x.shape)


@torch.library.custom_op("quanta::quantize", mutates_args=())
def _q_op(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, qmin: int, qmax: int,
          block_size: Optional[list[int]]) -> torch.Tensor:
    out_dtype = _codes_dtype(x.dtype, qmin, qmax)
    p = _affine_plan(x, scale, offset, qmin, qmax, block_size, out_dtype)
    return _affine.forward_raw(_Q, x, scale, offset, p, out_dtype)[0].contiguous()


@_q_op.register_fake
def _(x, scale, offset, qmin, qmax, block_size):
    return x.new_empty(x.shape, dtype=_codes_dtype(x.dtype, qmin, qmax))


@torch.library.custom_op("quanta::affine_backward", mutates_args=())
def _affine_backward_op(grad: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, mode: int,
                        qmin: int, qmax: int, block_size: Optional[list[int]], need_input: bool, need_scale: bool,
                        need_offset: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients w.r.t. input, scale and offset of QDQ (``mode=0``) or Q (``mode=1``); an empty tensor for
    each gradient not asked for."""
    out_dtype = x.dtype if mode == _QDQ else _codes_dtype(x.dtype, qmin, qmax)
    p = _affine_plan(x, scale, offset, qmin, qmax, block_size, out_dtype)
    dx, ds, do = _affine.backward_raw(mode, grad, x, scale, offset, p, (need_input, need_scale, need_offset))
    return (x.new_empty(0) if dx is None else dx.contiguous(),
            scale.new_empty(0) if ds is None else ds.contiguous(),
            offset.new_empty(0) if do is None else do.contiguous())


@_affine_backward_op.register_fake
def _(grad, x, scale, offset, mode, qmin, qmax, block_size, need_input, need_scale, need_offset):
    return (x.new_empty(x.shape if need_input else (0,)), scale.new_empty(scale.shape if need_scale else (0,)),
            offset.new_empty(offset.shape if need_offset else (0,)))


def _setup_affine(ctx, inputs, output):
    x, scale, offset, qmin, qmax, block_size = inputs
    ctx.save_for_backward(x, scale, offset)
    ctx.args = (qmin, qmax, block_size)


def _affine_backward(mode: int):
    def backward(ctx, grad):
        x, scale, offset = ctx.saved_tensors
        need = tuple(ctx.needs_input_grad[:3])
        if not any(need):
            return None, None, None, None, None, None
        qmin, qmax, block_size = ctx.args
        dx, ds, do = torch.ops.quanta.affine_backward(grad, x, scale, offset, mode, qmin, qmax, block_size, *need)
        return (dx if need[0] else None, ds if need[1] else None, do if need[2] else None, None, None, None)
    return backward


_qdq_op.register_autograd(_affine_backward(_QDQ), setup_context=_setup_affine)
_q_op.register_autograd(_affine_backward(_Q), setup_context=_setup_affine)


# -- affine DQ -----------------------------------------------------------------------------------------------
def _dq_compute_dtype(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.dtype:
    # as quanta.kernels.affine_impl.dequantize
    wide = q.dtype in (torch.float64, torch.int32, torch.int64, torch.uint32, torch.uint64)
    return torch.float64 if wide or torch.float64 in (scale.dtype, offset.dtype) else torch.float32


def _dq_output_dtype(q: torch.Tensor, scale: torch.Tensor, output_dtype: torch.dtype | None) -> torch.dtype:
    if output_dtype is not None:
        return output_dtype
    return q.dtype if q.is_floating_point() else scale.dtype


@torch.library.custom_op("quanta::dequantize", mutates_args=())
def _dq_op(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, block_size: Optional[list[int]],
           output_dtype: Optional[torch.dtype]) -> torch.Tensor:
    block = None if block_size is None else tuple(block_size)
    with torch.no_grad():
        return _affine.dequantize(q, scale, offset, block, output_dtype=output_dtype).contiguous()


@_dq_op.register_fake
def _(q, scale, offset, block_size, output_dtype):
    return q.new_empty(q.shape, dtype=_dq_output_dtype(q, scale, output_dtype))


def _setup_dq(ctx, inputs, output):
    q, scale, offset, block_size, _ = inputs
    ctx.save_for_backward(q, scale, offset)
    ctx.block_size = block_size


def _dq_backward(ctx, grad):
    # the gradients autograd gives the eager formula layout.from_blocks((q_b + o_b) * s_b).to(output_dtype)
    q, scale, offset = ctx.saved_tensors
    need_q, need_s, need_o = ctx.needs_input_grad[:3]
    block = None if ctx.block_size is None else tuple(ctx.block_size)
    layout = resolve_layout(q.shape, scale.shape, block)
    cdt = _dq_compute_dtype(q, scale, offset)
    g = layout.to_blocks(grad.to(cdt))
    s = layout.scale_to_blocks(scale.to(cdt))
    o = layout.scale_to_blocks(torch.broadcast_to(offset, scale.shape).to(cdt))
    dq = ds = do = None
    if need_q or need_o:
        gs = g * s
        dq = layout.from_blocks(gs).to(q.dtype) if need_q else None
        do = gs.sum_to_size(o.shape).reshape(scale.shape).sum_to_size(offset.shape).to(offset.dtype) \
            if need_o else None
    if need_s:
        ds = (g * (layout.to_blocks(q.to(cdt)) + o)).sum_to_size(s.shape).reshape(scale.shape).to(scale.dtype)
    return dq, ds, do, None, None


_dq_op.register_autograd(_dq_backward, setup_context=_setup_dq)


# -- float fake-cast -----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _float_plan(shape: tuple[int, ...], scale_shape: tuple[int, ...], block_size: tuple[int, ...] | None,
                exponent_bits: int, mantissa_bits: int, special: str) -> tuple[BlockLayout, FloatFormat]:
    return (resolve_layout(shape, scale_shape, block_size),
            FloatFormat(exponent_bits, mantissa_bits, SpecialValues(special)))


def _float_args(x, scale, exponent_bits, mantissa_bits, special, block_size):
    block = None if block_size is None else tuple(block_size)
    return _float_plan(tuple(x.shape), tuple(scale.shape), block, exponent_bits, mantissa_bits, special)


@torch.library.custom_op("quanta::float_quantize_dequantize", mutates_args=())
def _float_qdq_op(x: torch.Tensor, scale: torch.Tensor, exponent_bits: int, mantissa_bits: int, special: str,
                  block_size: Optional[list[int]]) -> torch.Tensor:
    layout, fmt = _float_args(x, scale, exponent_bits, mantissa_bits, special, block_size)
    return _float.forward_raw(x, scale, fmt, layout, want_mask=False)[0].contiguous()


@_float_qdq_op.register_fake
def _(x, scale, exponent_bits, mantissa_bits, special, block_size):
    return x.new_empty(x.shape)


@torch.library.custom_op("quanta::float_quantize_dequantize_backward", mutates_args=())
def _float_backward_op(grad: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, exponent_bits: int,
                       mantissa_bits: int, special: str, block_size: Optional[list[int]], need_input: bool,
                       need_scale: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients of the float fake-cast w.r.t. input and scale (an empty tensor for one not asked for)."""
    layout, fmt = _float_args(x, scale, exponent_bits, mantissa_bits, special, block_size)
    dx, ds = _float.backward_raw(grad, x, scale, fmt, layout, (need_input, need_scale))
    return (x.new_empty(0) if dx is None else dx.contiguous(), scale.new_empty(0) if ds is None else ds.contiguous())


@_float_backward_op.register_fake
def _(grad, x, scale, exponent_bits, mantissa_bits, special, block_size, need_input, need_scale):
    return x.new_empty(x.shape if need_input else (0,)), scale.new_empty(scale.shape if need_scale else (0,))


def _setup_float(ctx, inputs, output):
    x, scale, *args = inputs
    ctx.save_for_backward(x, scale)
    ctx.args = args


def _float_backward(ctx, grad):
    x, scale = ctx.saved_tensors
    need = tuple(ctx.needs_input_grad[:2])
    if not any(need):
        return None, None, None, None, None, None
    dx, ds = torch.ops.quanta.float_quantize_dequantize_backward(grad, x, scale, *ctx.args, *need)
    return dx if need[0] else None, ds if need[1] else None, None, None, None, None


_float_qdq_op.register_autograd(_float_backward, setup_context=_setup_float)


# -- Python entry points (what kernels.affine and kernels.float_cast call while compiling) ----------------------
def _block_arg(block_size: Sequence[int] | None) -> list[int] | None:
    return None if block_size is None else list(block_size)


def quantize_dequantize(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, grid: IntegerGrid,
                        block_size: Sequence[int] | None = None) -> torch.Tensor:
    """``torch.ops.quanta.quantize_dequantize`` with the kernels' arguments (offset broadcast to scale's shape).

    >>> quantize_dequantize(torch.tensor([0.04, 0.06]), torch.tensor(0.1), torch.tensor(0.0), IntegerGrid(0, 15))
    tensor([0.0000, 0.1000])
    """
    return torch.ops.quanta.quantize_dequantize(x, scale, offset.expand(scale.shape), grid.qmin, grid.qmax,
                                                _block_arg(block_size))


def quantize(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, grid: IntegerGrid,
             block_size: Sequence[int] | None = None) -> torch.Tensor:
    """``torch.ops.quanta.quantize`` with the kernels' arguments.

    >>> quantize(torch.tensor([0.04, 0.06]), torch.tensor(0.1), torch.tensor(0.0), IntegerGrid(0, 15))
    tensor([0., 1.])
    """
    return torch.ops.quanta.quantize(x, scale, offset.expand(scale.shape), grid.qmin, grid.qmax,
                                     _block_arg(block_size))


def dequantize(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, block_size: Sequence[int] | None = None,
               output_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.ops.quanta.dequantize`` with the kernels' arguments.

    >>> dequantize(torch.tensor([0.0, 2.0]), torch.tensor(0.1), torch.tensor(0.0))
    tensor([0.0000, 0.2000])
    """
    return torch.ops.quanta.dequantize(q, scale, offset, _block_arg(block_size), output_dtype)


def float_quantize_dequantize(x: torch.Tensor, scale: torch.Tensor, fmt: FloatFormat,
                              block_size: Sequence[int] | None = None) -> torch.Tensor:
    """``torch.ops.quanta.float_quantize_dequantize`` for a :class:`~quanta.grids.float.FloatFormat`.

    >>> from quanta.grids.float import FP4_E2M1
    >>> float_quantize_dequantize(torch.tensor([0.26, 1.0]), torch.tensor(1 / 6), FP4_E2M1)
    tensor([0.2500, 1.0000])
    """
    return torch.ops.quanta.float_quantize_dequantize(x, scale, fmt.exponent_bits, fmt.mantissa_bits,
                                                      fmt.special.value, _block_arg(block_size))
