"""Affine quantization kernels (AIMET convention, ``offset = -zero_point``).

The only code in quanta that rounds and clamps integer-grid values::

    Q(x)   = clamp(round(x / s) - o, qmin, qmax)      round = half to even
    DQ(q)  = (q + o) * s
    QDQ(x) = DQ(Q(x))

Division, not multiplication by ``1/s``: the two differ at rounding ties, and
quanta takes the division on every path, with or without autograd.

Precision: the arithmetic runs in :meth:`IntegerGrid.compute_dtype` (float32 for
float32/float16/bfloat16 inputs on grids up to 2**21, float64 otherwise) and the
result is cast back. Scales and offsets are used in that dtype too.

Special values: NaN stays NaN through Q, DQ and QDQ (and gets no gradient);
``+inf``/``-inf`` quantize to ``qmax``/``qmin``. ``-0.0`` keeps its sign through
Q (``round(-0.3) - 0 == -0.0``), which is why AIMET prints ``-0.`` codes.

Gradients (straight-through estimator, mask on the *rounded* value,
``inside = qmin <= round(x/s) - o <= qmax``):

* QDQ: ``dx = inside``; ``ds = round(x/s) - x/s`` inside, ``qmin + o`` below,
  ``qmax + o`` above; ``do = 0`` inside, ``s`` where clamped.
* Q: ``dx = inside / s``; ``ds = -x / s**2 * inside``; ``do = -inside``.
* DQ: ``dq = s``; ``ds = q + o``; ``do = s`` (ordinary autograd).

Backward keeps at most one byte per element: a boolean mask when only the input
needs a gradient; otherwise it keeps a reference to the input (not a copy) and
recomputes.
"""

from __future__ import annotations

import torch

from quanta.grids.affine import IntegerGrid
from quanta.kernels.blocks import BlockLayout, resolve_layout

__all__ = ["quantize", "dequantize", "quantize_dequantize", "codes_dtype"]

# Largest integer up to which every integer is exactly representable, per float dtype.
_EXACT_INTEGER_LIMIT = {
    torch.float16: 2**11,
    torch.bfloat16: 2**8,
    torch.float32: 2**24,
    torch.float64: 2**53,
}


def codes_dtype(input_dtype: torch.dtype, grid: IntegerGrid) -> torch.dtype:
    """Float dtype that holds the codes of ``Q(x)`` for an input of ``input_dtype``.

    The input's own dtype when it represents every code of ``grid`` exactly,
    otherwise the grid's compute dtype, so no code is ever rounded away.

    >>> codes_dtype(torch.bfloat16, IntegerGrid(-128, 127))
    torch.bfloat16
    >>> codes_dtype(torch.bfloat16, IntegerGrid(0, 4095))
    torch.float32
    """
    limit = _EXACT_INTEGER_LIMIT.get(input_dtype, 0)
    if max(abs(grid.qmin), abs(grid.qmax)) <= limit:
        return input_dtype
    return grid.compute_dtype(input_dtype)


def _check_float(name: str, t: torch.Tensor) -> None:
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")


def _prepare(
    x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, grid: IntegerGrid, block_size
) -> tuple[BlockLayout, torch.dtype, torch.Tensor]:
    layout = resolve_layout(x.shape, scale.shape, block_size)
    if offset.shape != scale.shape:
        try:
            offset = offset.expand(scale.shape)
        except RuntimeError:
            raise ValueError(
                f"offset shape {tuple(offset.shape)} does not broadcast to scale shape {tuple(scale.shape)}"
            ) from None
    return layout, grid.compute_dtype(x.dtype), offset


def _rounded_and_shifted(
    xb: torch.Tensor, s: torch.Tensor, o: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x/s, round(x/s), round(x/s) - o)`` in the blocked layout (for backward)."""
    xs = xb / s
    r = torch.round(xs)
    return xs, r, r - o


class _QuantizeDequantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, offset, qmin, qmax, layout, cdt):  # type: ignore[override]
        xb = layout.to_blocks(x.to(cdt))
        s = layout.scale_to_blocks(scale.to(cdt))
        o = layout.scale_to_blocks(offset.to(cdt))
        y = torch.div(xb, s).round_().sub_(o)
        needs_x, needs_s, needs_o = ctx.needs_input_grad[:3]
        if needs_s or needs_o:
            ctx.save_for_backward(x, scale, offset)
        elif needs_x:
            ctx.save_for_backward((y >= qmin) & (y <= qmax))
        y.clamp_(qmin, qmax).add_(o).mul_(s)
        ctx.meta = (qmin, qmax, layout, cdt, needs_s or needs_o)
        return layout.from_blocks(y).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        qmin, qmax, layout, cdt, recompute = ctx.meta
        gb = layout.to_blocks(grad.to(cdt))
        dx = ds = do = None
        if not recompute:
            (inside,) = ctx.saved_tensors
            dx = layout.from_blocks(torch.where(inside, gb, 0.0)).to(grad.dtype)
            return dx, None, None, None, None, None, None
        x, scale, offset = ctx.saved_tensors
        xb = layout.to_blocks(x.to(cdt))
        s = layout.scale_to_blocks(scale.to(cdt))
        o = layout.scale_to_blocks(offset.to(cdt))
        xs, r, v = _rounded_and_shifted(xb, s, o)
        below, above = v < qmin, v > qmax
        inside = (v >= qmin) & (v <= qmax)
        if ctx.needs_input_grad[0]:
            dx = layout.from_blocks(torch.where(inside, gb, 0.0)).to(x.dtype)
        if ctx.needs_input_grad[1]:
            zero = torch.zeros((), dtype=cdt, device=x.device)
            d = torch.where(inside, r - xs, zero)
            d = torch.where(below, qmin + o, d)
            d = torch.where(above, qmax + o, d)
            ds = layout.reduce_to_scale(gb * d).to(scale.dtype)
        if ctx.needs_input_grad[2]:
            clamped = below | above
            do = layout.reduce_to_scale(gb * clamped * s).to(offset.dtype)
        return dx, ds, do, None, None, None, None


class _Quantize(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, offset, qmin, qmax, layout, cdt, out_dtype):  # type: ignore[override]
        xb = layout.to_blocks(x.to(cdt))
        s = layout.scale_to_blocks(scale.to(cdt))
        o = layout.scale_to_blocks(offset.to(cdt))
        y = torch.div(xb, s).round_().sub_(o)
        if any(ctx.needs_input_grad[:3]):
            ctx.save_for_backward(x, scale, offset)
        y.clamp_(qmin, qmax)
        ctx.meta = (qmin, qmax, layout, cdt)
        return layout.from_blocks(y).to(out_dtype)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        qmin, qmax, layout, cdt = ctx.meta
        x, scale, offset = ctx.saved_tensors
        gb = layout.to_blocks(grad.to(cdt))
        xb = layout.to_blocks(x.to(cdt))
        s = layout.scale_to_blocks(scale.to(cdt))
        o = layout.scale_to_blocks(offset.to(cdt))
        xs, _, v = _rounded_and_shifted(xb, s, o)
        # where(), not a product with the mask: a clamped x/s may be inf, and 0 * inf is NaN
        g_in = torch.where((v >= qmin) & (v <= qmax), gb, 0.0)
        dx = ds = do = None
        if ctx.needs_input_grad[0]:
            dx = layout.from_blocks(g_in / s).to(x.dtype)
        if ctx.needs_input_grad[1]:
            ds = layout.reduce_to_scale(torch.where(g_in != 0, -g_in * xs / s, 0.0)).to(scale.dtype)
        if ctx.needs_input_grad[2]:
            do = layout.reduce_to_scale(-g_in).to(offset.dtype)
        return dx, ds, do, None, None, None, None, None


def quantize_dequantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    grid: IntegerGrid,
    block_size: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """Fake-quantize: ``(clamp(round(x/s) - o, qmin, qmax) + o) * s``, in ``x.dtype``.

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
    _check_float("input", x)
    layout, cdt, offset = _prepare(x, scale, offset, grid, block_size)
    return _QuantizeDequantize.apply(x, scale, offset, grid.qmin, grid.qmax, layout, cdt)


def quantize(
    x: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    grid: IntegerGrid,
    block_size: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """Quantize: ``clamp(round(x/s) - o, qmin, qmax)`` as floats holding integer codes.

    The result's dtype is :func:`codes_dtype` of the input (``x.dtype`` unless
    that dtype cannot hold every code exactly).

    >>> quantize(torch.tensor([0.0, 0.05, 0.15, 2.0]), torch.tensor(0.1), torch.tensor(0.0), IntegerGrid(0, 15))
    tensor([ 0.,  0.,  2., 15.])
    """
    _check_float("input", x)
    layout, cdt, offset = _prepare(x, scale, offset, grid, block_size)
    return _Quantize.apply(x, scale, offset, grid.qmin, grid.qmax, layout, cdt, codes_dtype(x.dtype, grid))


def dequantize(
    q: torch.Tensor,
    scale: torch.Tensor,
    offset: torch.Tensor,
    block_size: tuple[int, ...] | None = None,
    *,
    output_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Dequantize codes: ``(q + o) * s``.

    ``q`` may hold the codes as floats or as integers. The arithmetic runs in
    float32, or float64 when ``q``, ``scale`` or ``offset`` is float64 or ``q`` is
    a 32/64-bit integer; the result has ``output_dtype`` (default: ``q.dtype``
    for float codes, ``scale.dtype`` for integer codes).

    >>> dequantize(torch.tensor([0, 2, 15], dtype=torch.uint8), torch.tensor(0.1), torch.tensor(0.0))
    tensor([0.0000, 0.2000, 1.5000])
    """
    if q.dtype == torch.bool or q.is_complex():
        raise TypeError(f"input must hold integer codes as a real tensor, got dtype {q.dtype}")
    layout = resolve_layout(q.shape, scale.shape, block_size)
    wide = q.dtype in (torch.float64, torch.int32, torch.int64, torch.uint32, torch.uint64)
    cdt = torch.float64 if wide or torch.float64 in (scale.dtype, offset.dtype) else torch.float32
    if output_dtype is None:
        output_dtype = q.dtype if q.is_floating_point() else scale.dtype
    s = layout.scale_to_blocks(scale.to(cdt))
    o = layout.scale_to_blocks(torch.broadcast_to(offset, scale.shape).to(cdt))
    out = (layout.to_blocks(q.to(cdt)) + o) * s
    return layout.from_blocks(out).to(output_dtype)
