"""Affine quantization kernels, as they run (AIMET convention, ``offset = -zero_point``).

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

Two implementations, one result: a single-pass native kernel
(:mod:`quanta.kernels.native`) for CPU tensors whose layout it covers, and an
eager PyTorch path for everything else (other devices, layouts with blocks in two
separate dimensions, no C++ compiler). Both match the NumPy reference bit for
bit, ties included; gradient sums may differ in the last bits (summation order).

Called through :mod:`quanta.kernels.affine`, which picks these functions in eager mode and the custom ops of
:mod:`quanta.kernels.ops` (whose implementations are these functions too) under ``torch.compile`` and
``torch.export``.
"""

from __future__ import annotations

import math

import torch

from quanta.grids.affine import IntegerGrid
from quanta.kernels import native
from quanta.kernels.blocks import BlockLayout, resolve_layout

__all__ = ["QDQ", "Q", "AffinePlan", "apply", "backward_raw", "check_codes", "check_float", "codes_dtype",
           "dequantize", "forward_raw", "plan"]

QDQ, Q = native.QDQ, native.Q

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
    :func:`dequantize` adds ``q + o`` in float32 for float32/float16/bfloat16
    codes, exact up to ``2**24``; so float32 codes are kept only for grids of at
    most ``2**24`` steps (``|q + o| <= qmax - qmin`` whenever zero is on the grid),
    and ``DQ(Q(x)) == QDQ(x)`` stays bit-exact on grids like ``[-2**24, 2**24 - 1]``.

    >>> codes_dtype(torch.bfloat16, IntegerGrid(-128, 127))
    torch.bfloat16
    >>> codes_dtype(torch.bfloat16, IntegerGrid(0, 4095))
    torch.float32
    >>> codes_dtype(torch.float32, IntegerGrid(-2**24, 2**24 - 1))
    torch.float64
    """
    limit = _EXACT_INTEGER_LIMIT.get(input_dtype, 0)
    if max(abs(grid.qmin), abs(grid.qmax)) <= limit and (
        input_dtype == torch.float64 or grid.num_steps <= _EXACT_INTEGER_LIMIT[torch.float32]
    ):
        return input_dtype
    return grid.compute_dtype(input_dtype)


def check_float(name: str, t: torch.Tensor) -> None:
    """Refuse a ``t`` that is not floating point (``name`` says which argument it is)."""
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")


def _broadcast_offset(offset: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    if offset.shape == scale.shape:
        return offset
    try:
        return offset.expand(scale.shape)
    except RuntimeError:
        raise ValueError(
            f"offset shape {tuple(offset.shape)} does not broadcast to scale shape {tuple(scale.shape)}"
        ) from None


def _rounded_and_shifted(
    xb: torch.Tensor, s: torch.Tensor, o: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x/s, round(x/s), round(x/s) - o)`` in the blocked layout (for backward)."""
    xs = xb / s
    r = torch.round(xs)
    return xs, r, r - o


class AffinePlan:
    """Everything about one (input shape, dtype, scale shape, grid) that does not depend on values.

    Built once by :func:`plan` and reusable across calls (quantizer modules cache
    it per input shape), so the per-call work is the kernel alone.
    """

    __slots__ = ("layout", "cdt", "qmin", "qmax", "psb", "dtype", "_native_args")

    def __init__(self, layout: BlockLayout, grid: IntegerGrid, dtype: torch.dtype, device: torch.device,
                 out_dtype: torch.dtype) -> None:
        self.layout = layout
        self.cdt = grid.compute_dtype(dtype)
        self.qmin, self.qmax = grid.qmin, grid.qmax
        self.dtype = dtype
        native_ok = device.type == "cpu" and out_dtype == dtype and native.supports(dtype)
        psb = layout.psb() if native_ok and math.prod(layout.input_shape) > 0 else None
        self.psb = psb if psb is not None and native.library() is not None else None
        self._native_args = None if self.psb is None else native.Call(dtype, self.cdt, self.psb, self.qmin, self.qmax)

    def flat(self, t: torch.Tensor) -> torch.Tensor:
        """A scale/offset tensor as the native kernel wants it: contiguous, 1-D, compute dtype."""
        return t.detach().to(self.cdt).contiguous().reshape(-1)

    def native_call(self) -> "native.Call | None":
        """The prepared native call, or None where the eager path runs (incl. inside ``native.disabled()``)."""
        return self._native_args if self._native_args is not None and native.library() is not None else None


def plan(x: torch.Tensor, scale_shape, grid: IntegerGrid, block_size, out_dtype: torch.dtype | None = None
         ) -> AffinePlan:
    """Validate the layout of ``x`` against ``scale_shape`` and pick the implementation."""
    layout = resolve_layout(x.shape, scale_shape, block_size)
    return AffinePlan(layout, grid, x.dtype, x.device, x.dtype if out_dtype is None else out_dtype)


def forward_raw(mode: int, x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, p: AffinePlan,
                out_dtype: torch.dtype, *, want_mask: bool = False, out: torch.Tensor | None = None,
                flat: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """QDQ or Q without autograd: ``(result, inside-mask or None)``. ``offset`` has ``scale``'s shape.

    ``flat``, if given, is ``(p.flat(scale), p.flat(offset))`` precomputed by the caller.
    """
    call = p.native_call()
    if call is not None:
        fs, fo = flat if flat is not None else (p.flat(scale), p.flat(offset))
        return call.forward(mode, x, fs, fo, want_mask=want_mask, out=out)
    layout = p.layout
    s = layout.scale_to_blocks(scale.detach().to(p.cdt))
    o = layout.scale_to_blocks(offset.detach().to(p.cdt))
    y = torch.div(layout.to_blocks(x.detach().to(p.cdt)), s).round_().sub_(o)
    mask = layout.from_blocks((y >= p.qmin) & (y <= p.qmax)) if want_mask else None
    y.clamp_(p.qmin, p.qmax)
    if mode == QDQ:
        y.add_(o).mul_(s)
    y = layout.from_blocks(y)
    return (out.copy_(y) if out is not None else y.to(out_dtype)), mask


def backward_raw(mode: int, grad: torch.Tensor, x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                 p: AffinePlan, need: tuple[bool, bool, bool]
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """Gradients of QDQ or Q w.r.t. input, scale and offset (see the module docstring)."""
    call = p.native_call()
    if call is not None and grad.dtype == x.dtype:
        dx, ds, do = call.backward(mode, grad, x.detach(), p.flat(scale), p.flat(offset), want_dx=need[0])
        return (None if dx is None else dx.view(x.shape),
                ds.reshape(scale.shape).to(scale.dtype) if need[1] else None,
                do.reshape(offset.shape).to(offset.dtype) if need[2] else None)
    layout, cdt, qmin, qmax = p.layout, p.cdt, p.qmin, p.qmax
    gb = layout.to_blocks(grad.to(cdt))
    s = layout.scale_to_blocks(scale.detach().to(cdt))
    o = layout.scale_to_blocks(offset.detach().to(cdt))
    xs, r, v = _rounded_and_shifted(layout.to_blocks(x.detach().to(cdt)), s, o)
    below, above = v < qmin, v > qmax
    inside = (v >= qmin) & (v <= qmax)
    dx = ds = do = None
    if mode == QDQ:
        if need[0]:
            dx = layout.from_blocks(torch.where(inside, gb, 0.0)).to(x.dtype)
        if need[1]:
            zero = torch.zeros((), dtype=cdt, device=x.device)
            d = torch.where(inside, r - xs, zero)
            d = torch.where(below, qmin + o, d)
            d = torch.where(above, qmax + o, d)
            ds = layout.reduce_to_scale(gb * d).to(scale.dtype)
        if need[2]:
            do = layout.reduce_to_scale(gb * (below | above) * s).to(offset.dtype)
        return dx, ds, do
    # where(), not a product with the mask: a clamped x/s may be inf, and 0 * inf is NaN
    g_in = torch.where(inside, gb, 0.0)
    if need[0]:
        dx = layout.from_blocks(g_in / s).to(x.dtype)
    if need[1]:
        ds = layout.reduce_to_scale(torch.where(g_in != 0, -g_in * xs / s, 0.0)).to(scale.dtype)
    if need[2]:
        do = layout.reduce_to_scale(-g_in).to(offset.dtype)
    return dx, ds, do


class _AffineFunction(torch.autograd.Function):
    """Autograd for QDQ and Q with tensor scale and offset.

    Saves a bool mask when only the input needs a gradient (QDQ), otherwise a
    reference to the input, and recomputes in backward.
    """

    @staticmethod
    def forward(ctx, x, scale, offset, mode, p, out_dtype, out):  # type: ignore[override]
        needs_x, needs_s, needs_o = ctx.needs_input_grad[:3]
        use_mask = mode == QDQ and needs_x and not (needs_s or needs_o)
        y, mask = forward_raw(mode, x, scale, offset, p, out_dtype, want_mask=use_mask, out=out)
        if use_mask:
            ctx.save_for_backward(mask)
        elif needs_x or needs_s or needs_o:
            ctx.save_for_backward(x, scale, offset)
        ctx.meta = (mode, p, use_mask)
        return y

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        mode, p, use_mask = ctx.meta
        if use_mask:
            (inside,) = ctx.saved_tensors
            return native.straight_through(grad, inside), None, None, None, None, None, None
        x, scale, offset = ctx.saved_tensors
        dx, ds, do = backward_raw(mode, grad, x, scale, offset, p, tuple(ctx.needs_input_grad[:3]))
        return dx, ds, do, None, None, None, None


def _check_out(out: torch.Tensor | None, like: torch.Tensor, dtype: torch.dtype) -> None:
    if out is None:
        return
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a tensor, got {type(out).__name__}")
    if out.shape != like.shape or out.dtype != dtype or out.device != like.device:
        raise ValueError(
            f"out must have shape {tuple(like.shape)}, dtype {dtype} and device {like.device}; got "
            f"{tuple(out.shape)}, {out.dtype}, {out.device}"
        )
    if torch.is_grad_enabled() and out.requires_grad:
        raise RuntimeError("out= does not support autograd: out requires grad")


def apply(mode: int, x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, grid: IntegerGrid, block_size,
          out_dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """QDQ (``mode=QDQ``) or Q of ``x`` as ``out_dtype``, into ``out`` if given, with autograd where an input
    needs it: :func:`quanta.kernels.affine.quantize_dequantize` / :func:`~quanta.kernels.affine.quantize`."""
    check_float("input", x)
    offset = _broadcast_offset(offset, scale)
    p = plan(x, scale.shape, grid, block_size, out_dtype)
    _check_out(out, x, out_dtype)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or scale.requires_grad or offset.requires_grad)
    if out is not None and needs_grad:
        raise RuntimeError("out= does not support autograd; call it under torch.no_grad() or without out=")
    if not needs_grad:
        return forward_raw(mode, x, scale, offset, p, out_dtype, out=out)[0]
    return _AffineFunction.apply(x, scale, offset, mode, p, out_dtype, out)


def check_codes(q: torch.Tensor) -> None:
    """Refuse codes that are not real numbers (bool or complex)."""
    if q.dtype == torch.bool or q.is_complex():
        raise TypeError(f"input must hold integer codes as a real tensor, got dtype {q.dtype}")


def dequantize(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, block_size: tuple[int, ...] | None = None,
               *, output_dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """``(q + o) * s``: :func:`quanta.kernels.affine.dequantize`."""
    check_codes(q)
    layout = resolve_layout(q.shape, scale.shape, block_size)
    wide = q.dtype in (torch.float64, torch.int32, torch.int64, torch.uint32, torch.uint64)
    cdt = torch.float64 if wide or torch.float64 in (scale.dtype, offset.dtype) else torch.float32
    if output_dtype is None:
        output_dtype = q.dtype if q.is_floating_point() else scale.dtype
    _check_out(out, q, output_dtype)
    offset = torch.broadcast_to(offset, scale.shape)
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or scale.requires_grad or offset.requires_grad)
    if out is not None and needs_grad:
        raise RuntimeError("out= does not support autograd; call it under torch.no_grad() or without out=")
    native_ok = not needs_grad and q.device.type == "cpu" and output_dtype == q.dtype and native.supports(q.dtype)
    psb = layout.psb() if native_ok and q.numel() > 0 else None
    if psb is not None and native.library() is not None:
        flat = lambda t: t.detach().to(cdt).contiguous().reshape(-1)  # noqa: E731
        call = native.Call(q.dtype, cdt, psb, 0, 0)
        return call.forward(native.DQ, q, flat(scale), flat(offset), out=out)[0]
    s = layout.scale_to_blocks(scale.to(cdt))
    o = layout.scale_to_blocks(offset.to(cdt))
    y = layout.from_blocks((layout.to_blocks(q.to(cdt)) + o) * s)
    return out.copy_(y) if out is not None else y.to(output_dtype)
