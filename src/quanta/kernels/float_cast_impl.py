"""Float fake-cast kernels, as they run: round to the nearest value of a :class:`FloatFormat`.

The only code in quanta that rounds to float formats::

    cast(v)   = clamp(round_half_even(v / 2**k) * 2**k, -max, max)
                with k = max(floor(log2 |v|), emin) - mantissa_bits
                (ties go to the even code; with 0 mantissa bits that is the even exponent,
                except for AIMET's grids, whose ties go up: FloatFormat.exponent_ties_up)
    QDQ(x)    = cast(x / s) * s                       (s = maxval / format max)

Multiplying and dividing by ``2**k`` is exact, so the only rounding is the one
to the format's grid, ties to even, subnormals included. Policy, the same on
every path: NaN stays NaN; ``+-inf`` and anything beyond the largest value
saturates to ``+-max`` (torch's float8 casts give NaN there instead; inside
the range quanta's result equals ``v.to(dtype).to(v.dtype)`` bit for bit);
formats without a negative zero (``fnuz``) return ``+0.0`` for zero results.

The rounding runs in float64 (exact for every format up to 8 exponent and 23
mantissa bits) on ``x / s`` computed in float32 (float64 for float64 inputs), and
the result is cast back to the input dtype. CPU tensors take the native one-pass
kernel (:mod:`quanta.kernels.native`); the eager path gives the same bits.

Gradients (straight-through): ``dx = 1`` where ``|x/s| <= max``, else 0;
``ds = cast(x/s) - x/s`` inside and ``+-max`` where saturated (as LSQ), so a
learnable ``maxval`` gets a gradient through ``s = maxval / max``.

Called through :mod:`quanta.kernels.float_cast`, which picks these functions in eager mode and the custom op
of :mod:`quanta.kernels.ops` (whose implementation is these functions too) under ``torch.compile`` and
``torch.export``.
"""

from __future__ import annotations

import torch

from quanta.grids.float import FloatFormat
from quanta.kernels import native
from quanta.kernels.blocks import BlockLayout, resolve_layout

__all__ = ["fake_cast", "quantize_dequantize", "quantize", "dequantize", "forward_raw", "backward_raw"]


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _scaled(x: torch.Tensor, scale: torch.Tensor, layout: BlockLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x / s, s)`` in the compute dtype and the blocked layout (no autograd)."""
    cdt = _compute_dtype(x.dtype)
    s = layout.scale_to_blocks(scale.detach().to(cdt))
    return layout.to_blocks(x.detach().to(cdt)) / s, s


def fake_cast(v: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Round ``v`` to the nearest value of ``fmt`` (ties to even, saturating), in ``v``'s dtype.

    >>> from quanta.grids.float import FLOAT8_E4M3FN, FP4_E2M1
    >>> fake_cast(torch.tensor([0.3, 1.0625, 500.0, -float("inf")]), FLOAT8_E4M3FN).tolist()
    [0.3125, 1.0, 448.0, -448.0]
    >>> fake_cast(torch.tensor([2.5, 3.5, 5.0, 0.25]), FP4_E2M1).tolist()
    [2.0, 4.0, 4.0, 0.0]
    """
    d = v.to(torch.float64)
    _, e = torch.frexp(d)  # d = mant * 2**e, mant in [0.5, 1): floor(log2 |d|) = e - 1
    e = torch.clamp_min(e - 1, fmt.emin)
    k = e - fmt.mantissa_bits
    step = torch.ldexp(torch.ones_like(d), k)
    t = d / step
    r = torch.round(t)
    if fmt.mantissa_bits == 0 and not fmt.exponent_ties_up:
        # Without mantissa bits a tie (1.5 * 2**e) lies between two exponent codes; ties to even
        # means the even code, which torch.round's "even integer" (always 2, AIMET's rule) does not give.
        down = (t.abs() == 1.5) & ((e + fmt.bias) % 2 == 0)
        r = torch.where(down, torch.sign(t), r)
    out = r * step
    out = torch.clamp(out, -fmt.max, fmt.max)  # inf saturates; NaN passes through clamp
    if not fmt.has_negative_zero:
        out = torch.where(out == 0, 0.0, out)
    return out.to(v.dtype)


def forward_raw(x: torch.Tensor, scale: torch.Tensor, fmt: FloatFormat, layout: BlockLayout, want_mask: bool
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``cast(x / s) * s`` and optionally the inside-mask: native kernel where it applies, else eager."""
    cdt = _compute_dtype(x.dtype)
    psb = layout.psb() if x.device.type == "cpu" and native.supports(x.dtype) and x.numel() else None
    if psb is not None and native.library() is not None:
        flat = scale.detach().to(cdt).contiguous().reshape(-1)
        y, mask = native.float_forward(x.detach(), psb, flat, fmt.emin, fmt.emax, fmt.mantissa_bits, fmt.max,
                                       not fmt.has_negative_zero, want_mask=want_mask,
                                       exponent_ties_up=fmt.exponent_ties_up)
        return y.view(x.shape), None if mask is None else mask.view(x.shape)
    v, s = _scaled(x, scale, layout)
    out = layout.from_blocks(fake_cast(v, fmt) * s).to(x.dtype)
    return out, layout.from_blocks(v.abs() <= fmt.max) if want_mask else None


class _FloatQDQ(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale, fmt, layout):  # type: ignore[override]
        needs_x, needs_s = ctx.needs_input_grad[:2]
        out, mask = forward_raw(x, scale, fmt, layout, want_mask=needs_x and not needs_s)
        if needs_s:
            ctx.save_for_backward(x, scale)
        elif needs_x:
            ctx.save_for_backward(mask)
        ctx.meta = (fmt, layout, needs_s)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        fmt, layout, recompute = ctx.meta
        if not recompute:
            (inside,) = ctx.saved_tensors
            return native.straight_through(grad, inside), None, None, None
        x, scale = ctx.saved_tensors
        dx, ds = backward_raw(grad, x, scale, fmt, layout, (ctx.needs_input_grad[0], True))
        return dx, ds, None, None


def backward_raw(grad: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, fmt: FloatFormat, layout: BlockLayout,
                 need: tuple[bool, bool]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients w.r.t. input and scale (see the module docstring), recomputed from ``x``; None where not needed."""
    cdt = _compute_dtype(x.dtype)
    v, _ = _scaled(x, scale, layout)
    inside = v.abs() <= fmt.max
    gb = layout.to_blocks(grad.to(cdt))
    dx = layout.from_blocks(torch.where(inside, gb, 0.0)).to(x.dtype) if need[0] else None
    ds = None
    if need[1]:
        d = torch.where(inside, fake_cast(v, fmt) - v, torch.sign(v) * fmt.max)
        ds = layout.reduce_to_scale(torch.where(torch.isnan(v), 0.0, gb * d)).to(scale.dtype)
    return dx, ds


def _plan(x: torch.Tensor, scale: torch.Tensor, block_size) -> BlockLayout:
    if not x.is_floating_point():
        raise TypeError(f"input must be a floating-point tensor, got dtype {x.dtype}")
    return resolve_layout(x.shape, scale.shape, block_size)


def quantize_dequantize(x: torch.Tensor, scale: torch.Tensor, fmt: FloatFormat,
                        block_size: tuple[int, ...] | None = None) -> torch.Tensor:
    """``cast(x / s) * s``, with autograd where an input needs it: what
    :func:`quanta.kernels.float_cast.quantize_dequantize` runs in eager mode."""
    layout = _plan(x, scale, block_size)
    if torch.is_grad_enabled() and (x.requires_grad or scale.requires_grad):
        return _FloatQDQ.apply(x, scale, fmt, layout)
    return forward_raw(x, scale, fmt, layout, want_mask=False)[0]


def quantize(x: torch.Tensor, scale: torch.Tensor, fmt: FloatFormat,
             block_size: tuple[int, ...] | None = None) -> torch.Tensor:
    """The format's values ``cast(x / s)`` (no gradient), in the compute dtype."""
    layout = _plan(x, scale, block_size)
    return layout.from_blocks(fake_cast(_scaled(x, scale, layout)[0], fmt))


def dequantize(q: torch.Tensor, scale: torch.Tensor, block_size: tuple[int, ...] | None = None,
               output_dtype: torch.dtype | None = None) -> torch.Tensor:
    """``q * s``: values of a float format back to real values."""
    layout = resolve_layout(q.shape, scale.shape, block_size)
    out_dtype = output_dtype or (q.dtype if q.dtype in (torch.float16, torch.bfloat16, torch.float32,
                                                         torch.float64) else torch.float32)
    cdt = _compute_dtype(out_dtype)
    return layout.from_blocks(layout.to_blocks(q.to(cdt)) * layout.scale_to_blocks(scale.to(cdt))).to(out_dtype)

