"""Affine quantization parameterised by a learnable range ``[min, max]`` in one autograd node.

A quantizer module with ``min``/``max`` parameters could compute scale and offset
with a dozen small autograd ops on every call. Instead, the caller computes them
once without a graph (and caches them while the range is unchanged), and this
function runs the kernel as a single autograd node. Backward rebuilds the small
scale/offset graph from ``min``/``max`` (:mod:`quanta.kernels.qparams`, the same
formulas) and pushes the kernel's scale and offset gradients through it, so the
gradients equal those of the long way round.
"""

from __future__ import annotations

import torch

from quanta.grids.affine import IntegerGrid
from quanta.kernels import native
from quanta.kernels.affine import QDQ, AffinePlan, backward_raw, forward_raw
from quanta.kernels.qparams import offset_from_range, scale_from_range

__all__ = ["range_affine", "relu_quantize_dequantize", "RangeCall"]


class RangeCall:
    """One quantizer call's constants: plan, grid, and scale/offset precomputed from ``[min, max]``."""

    __slots__ = ("mode", "plan", "out_dtype", "grid", "symmetric", "scale", "offset", "flat", "bound")

    def __init__(self, mode: int, p: AffinePlan, out_dtype: torch.dtype, grid: IntegerGrid, symmetric: bool,
                 scale: torch.Tensor, offset: torch.Tensor) -> None:
        self.mode, self.plan, self.out_dtype = mode, p, out_dtype
        self.grid, self.symmetric = grid, symmetric
        self.scale, self.offset = scale, offset
        self.flat = (p.flat(scale), p.flat(offset))
        native_call = p.native_call()
        self.bound = None if native_call is None else native_call.bind(mode, *self.flat)

    def forward(self, x: torch.Tensor, *, want_mask: bool = False, out: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:func:`~quanta.kernels.affine.forward_raw` with this call's constants (no autograd)."""
        lib = native.library()  # None inside native.disabled()
        if self.bound is not None and lib is not None:
            return self.bound.forward(x, want_mask=want_mask, out=out, lib=lib)
        return forward_raw(self.mode, x, self.scale, self.offset, self.plan, self.out_dtype, want_mask=want_mask,
                           out=out, flat=self.flat)

    def forward_(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` overwritten with the values of :meth:`forward` (a contiguous ``x`` of the output dtype)."""
        lib = native.library()
        if self.bound is not None and lib is not None:
            return self.bound.forward_(x, lib)
        return self.forward(x, out=x)[0]


class _RangeAffine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mn, mx, call):  # type: ignore[override]
        needs_x = ctx.needs_input_grad[0]
        needs_range = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        use_mask = call.mode == QDQ and needs_x and not needs_range
        y, mask = call.forward(x, want_mask=use_mask)
        if use_mask:
            ctx.save_for_backward(mask)
        elif needs_x or needs_range:
            ctx.save_for_backward(x, mn, mx)
        ctx.call, ctx.use_mask = call, use_mask
        return y

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        call = ctx.call
        if ctx.use_mask:
            (inside,) = ctx.saved_tensors
            return native.straight_through(grad, inside), None, None, None
        x, mn, mx = ctx.saved_tensors
        needs_range = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        dx, ds, do = backward_raw(call.mode, grad, x, call.scale, call.offset, call.plan,
                                  (ctx.needs_input_grad[0], needs_range, needs_range and not call.symmetric))
        dmin = dmax = None
        if needs_range:
            with torch.enable_grad():
                a = mn.detach().requires_grad_()
                b = mx.detach().requires_grad_()
                s = scale_from_range(a, b, call.grid)
                outputs, grads = [s], [ds.to(s.dtype)]
                if do is not None:
                    outputs.append(offset_from_range(a, s, call.grid, call.symmetric))
                    grads.append(do.to(s.dtype))
                dmin, dmax = torch.autograd.grad(outputs, (a, b), grads, allow_unused=True)
            dmin = torch.zeros_like(mn) if dmin is None else dmin.to(mn.dtype)
            dmax = torch.zeros_like(mx) if dmax is None else dmax.to(mx.dtype)
        return dx, dmin, dmax, None


def range_affine(x: torch.Tensor, mn: torch.Tensor, mx: torch.Tensor, call: RangeCall) -> torch.Tensor:
    """QDQ or Q of ``x`` with the scale/offset of ``call`` (computed from ``[mn, mx]``); gradients reach both.

    Without autograd this is a plain kernel call.
    """
    if torch.is_grad_enabled() and (x.requires_grad or mn.requires_grad or mx.requires_grad):
        return _RangeAffine.apply(x, mn, mx, call)
    return call.forward(x)[0]


class _ReluQDQ(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, call):  # type: ignore[override]
        y = torch.relu(x)
        y, inside = call.forward(y, want_mask=True, out=y)
        # ReLU passes the gradient where its output is > 0 (torch's threshold_backward); x > 0 is the same set
        ctx.save_for_backward(inside.logical_and_(x > 0))
        return y

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (keep,) = ctx.saved_tensors
        return native.straight_through(grad, keep), None


def relu_quantize_dequantize(x: torch.Tensor, call: RangeCall) -> torch.Tensor:
    """``QDQ(relu(x))`` with the fixed range of ``call`` (QDQ mode), as one autograd node.

    Same values as the two steps, and the same gradient w.r.t. ``x``:
    ``grad · [x > 0] · [qmin ≤ round(relu(x)/s) − o ≤ qmax]``. Backward keeps one
    byte per element (the combined mask) instead of ReLU's float output plus the
    quantizer's mask: a quantized ReLU in training costs 1 byte per element.
    """
    if not (torch.is_grad_enabled() and x.requires_grad):
        y = torch.relu(x)
        return call.forward(y, out=y)[0]
    return _ReluQDQ.apply(x, call)
