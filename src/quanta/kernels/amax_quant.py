"""amax-based tensor quantization kernels (TensorRT ``pytorch_quantization`` convention).

The only code of the TensorRT dialect (:mod:`quanta.tensor_quant`) that rounds
and clamps. The range is given by ``amax`` (values are quantized inside
``[-amax, amax]``) and the scale is a *multiplier*::

    max_bound = 2**(num_bits - 1 + unsigned) - 1
    min_bound = 0 if unsigned else (-max_bound if narrow_range else -max_bound - 1)
    scale     = max_bound / amax                        (1 where amax <= 2**-24)
    q         = clamp(round(x * scale), min_bound, max_bound)   round = half to even
    fake(x)   = q / scale                               (division)

FP8 (e4m3fn, ``num_bits=(4, 3)``): ``scale = 448 / amax``,
``fake(x) = e4m3(clamp(x * scale, -448, 448)) / scale`` where ``e4m3`` is
torch's round-to-nearest-even cast to ``torch.float8_e4m3fn`` and back.

Precision: the arithmetic runs in float32 (``scale`` too) for float32, float16
and bfloat16 inputs on grids up to 2**21 (``num_bits <= 21``), in float64 for
float64 inputs and wider grids; FP8 always runs in float32. ``amax`` is used in
that dtype. Fake-quant results are cast back to the input dtype once.

Special values: NaN inputs stay NaN (and get no gradient); ``+-inf`` quantize
to the bounds; ``-0.0`` keeps its sign. Where ``amax <= 2**-24`` the outputs are
(signed) zeros and the returned scale is 1; a NaN input there still gives NaN.

Gradients (straight-through estimator with clipping): ``dx = g`` where
``|x| <= amax`` (inclusive), 0 elsewhere; ``amax`` gets no gradient. Backward
keeps one bool per element, never a float copy of the input.

Deliberate differences from NVIDIA's implementation (each documented and tested):

* half-precision inputs: quanta computes in float32 and rounds once; NVIDIA
  divides in float16 by a float16 scale for fake quant and computes bfloat16
  inputs in bfloat16.
* ``+-inf`` with ``amax <= 2**-24`` gives 0 here (NVIDIA: ``inf * 0 = NaN``).
* signed ``num_bits=1`` (``max_bound = 0``) raises ValueError; NVIDIA divides by
  a zero scale and returns NaN everywhere.
* NaN/inf ``amax`` raise ValueError instead of producing NaN outputs.
* the FP8 path does not zero inputs with ``|x| < 2**-24`` (NVIDIA's CUDA path does).
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from quanta.grids.affine import IntegerGrid
from quanta.kernels import native
from quanta.kernels.affine import codes_dtype
from quanta.kernels.blocks import resolve_layout

__all__ = [
    "fake_e4m3_quant_modelopt",
    "fake_e4m3_quant_onnx",
    "EPSILON",
    "E4M3_MAX",
    "check_num_bits",
    "check_fp8_format",
    "resolve_num_bits",
    "is_fp8",
    "tensor_quant_bounds",
    "amax_compute_dtype",
    "amax_scale",
    "tensor_quant",
    "fake_tensor_quant",
    "fake_tensor_quant_onnx",
    "e4m3_quant",
    "fake_e4m3_quant",
    "scaled_e4m3",
    "clip",
    "TensorQuantFunction",
    "FakeTensorQuantFunction",
    "ScaledE4M3Function",
    "ClipFunction",
]

#: ``amax`` at or below this (the smallest float16 subnormal) quantizes everything to zero.
EPSILON = 2.0**-24
#: Largest finite value of float8 e4m3fn.
E4M3_MAX = 448.0
MAX_NUM_BITS = 32


def check_num_bits(num_bits: object) -> int:
    """Validate an integer ``num_bits``: an int in ``[1, 32]`` (bool is a TypeError).

    >>> check_num_bits(8)
    8
    >>> check_num_bits(33)
    Traceback (most recent call last):
    ...
    ValueError: num_bits must be in [1, 32], got 33
    """
    if isinstance(num_bits, (bool, np.bool_)) or not isinstance(num_bits, numbers.Integral):
        raise TypeError(f"num_bits must be an int in [1, {MAX_NUM_BITS}], got {type(num_bits).__name__} {num_bits!r}")
    num_bits = int(num_bits)
    if not 1 <= num_bits <= MAX_NUM_BITS:
        raise ValueError(f"num_bits must be in [1, {MAX_NUM_BITS}], got {num_bits}")
    return num_bits


def check_fp8_format(exponent_bits: object, mantissa_bits: object) -> None:
    """Only e4m3 (``E=4, M=3``) is supported, as in NVIDIA's ``scaled_e4m3``.

    >>> check_fp8_format(5, 2)
    Traceback (most recent call last):
    ...
    NotImplementedError: only E=4, M=3 (float8 e4m3fn) is supported, got E=5, M=2
    """
    if (exponent_bits, mantissa_bits) != (4, 3) or isinstance(exponent_bits, bool) or isinstance(mantissa_bits, bool):
        raise NotImplementedError(
            f"only E=4, M=3 (float8 e4m3fn) is supported, got E={exponent_bits!r}, M={mantissa_bits!r}"
        )


def resolve_num_bits(num_bits: object) -> int | tuple[int, int]:
    """``num_bits`` of the TensorRT dialect: an int in ``[1, 32]`` or the FP8 format ``(4, 3)`` (a list is accepted).

    >>> resolve_num_bits([4, 3])
    (4, 3)
    >>> resolve_num_bits((5, 2))
    Traceback (most recent call last):
    ...
    ValueError: num_bits must be an int in [1, 32] or the tuple (4, 3) for FP8 e4m3, got (5, 2)
    """
    if isinstance(num_bits, (tuple, list)):
        fmt = tuple(num_bits)
        if len(fmt) == 2 and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in fmt) \
                and tuple(int(v) for v in fmt) == (4, 3):
            return (4, 3)
        raise ValueError(f"num_bits must be an int in [1, {MAX_NUM_BITS}] or the tuple (4, 3) for FP8 e4m3, got {fmt}")
    return check_num_bits(num_bits)


def is_fp8(num_bits: object) -> bool:
    """True for the FP8 format ``(4, 3)``.

    >>> is_fp8((4, 3)), is_fp8(8)
    (True, False)
    """
    return isinstance(num_bits, tuple) and num_bits == (4, 3)


def _check_flag(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def tensor_quant_bounds(num_bits: int, unsigned: bool = False, narrow_range: bool = True) -> tuple[int, int]:
    """Integer range ``(min_bound, max_bound)``, computed exactly in Python integers.

    ``max_bound = 2**(num_bits - 1 + unsigned) - 1``; ``min_bound`` is 0 if
    ``unsigned``, ``-max_bound`` if ``narrow_range``, else ``-max_bound - 1``.
    ``narrow_range`` has no effect on unsigned ranges.

    >>> tensor_quant_bounds(8)
    (-127, 127)
    >>> tensor_quant_bounds(8, narrow_range=False)
    (-128, 127)
    >>> tensor_quant_bounds(8, unsigned=True)
    (0, 255)
    """
    num_bits = check_num_bits(num_bits)
    unsigned = _check_flag("unsigned", unsigned)
    narrow_range = _check_flag("narrow_range", narrow_range)
    max_bound = 2 ** (num_bits - 1 + int(unsigned)) - 1
    if unsigned:
        return 0, max_bound
    return (-max_bound if narrow_range else -max_bound - 1), max_bound


def amax_compute_dtype(input_dtype: torch.dtype, min_bound: int, max_bound: int) -> torch.dtype:
    """float32, or float64 for float64 inputs and grids beyond 2**21 (same rule as the affine kernels).

    >>> amax_compute_dtype(torch.float16, -127, 127)
    torch.float32
    >>> amax_compute_dtype(torch.float32, -(2**31 - 1), 2**31 - 1)
    torch.float64
    """
    return IntegerGrid(min_bound, max_bound).compute_dtype(input_dtype)


def amax_scale(amax: torch.Tensor, max_bound: float, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``scale = max_bound / amax`` (true division in ``dtype``), and 1 where ``amax <= 2**-24``.

    ``dtype`` defaults to ``amax``'s float dtype (float32 for integer amax).

    >>> amax_scale(torch.tensor([1.0, 2.0, 0.0]), 127)
    tensor([127.0000,  63.5000,   1.0000])
    """
    if dtype is None:
        dtype = amax.dtype if amax.is_floating_point() else torch.float32
    a = amax.detach().to(dtype)
    scale = torch.div(torch.tensor(float(max_bound), dtype=dtype, device=a.device), a)
    tiny = a <= EPSILON
    return torch.where(tiny, torch.ones((), dtype=dtype, device=a.device), scale)


# -- validation -----------------------------------------------------------------------------------------------


def _check_input(inputs: object) -> torch.Tensor:
    if not isinstance(inputs, torch.Tensor):
        raise TypeError(f"inputs must be a torch.Tensor, got {type(inputs).__name__}")
    if not inputs.is_floating_point():
        raise TypeError(f"inputs must be a floating-point tensor, got dtype {inputs.dtype}")
    return inputs


def _check_amax(amax: object, x: torch.Tensor, cdt: torch.dtype) -> torch.Tensor:
    """``amax`` as a detached tensor in ``cdt`` on ``x``'s device, validated.

    A one-element amax of any shape is per-tensor. Otherwise ``amax`` must
    broadcast to ``x``'s shape without growing it.
    """
    if isinstance(amax, torch.Tensor):
        a = amax.detach()
    elif isinstance(amax, (numbers.Real, np.ndarray, list, tuple)) and not isinstance(amax, bool):
        a = torch.as_tensor(np.asarray(amax, dtype=np.float64))
    else:
        raise TypeError(f"amax must be a tensor or a number, got {type(amax).__name__}")
    if a.is_complex() or a.dtype == torch.bool:
        raise TypeError(f"amax must be a real tensor, got dtype {a.dtype}")
    if a.device != x.device and "meta" in (a.device.type, x.device.type):
        # amax on another real device is moved to the input's (as NVIDIA's), but a meta tensor has no values
        raise ValueError(f"amax is on {a.device} but inputs are on {x.device}; move them to one device")
    if a.numel() == 1:
        a = a.reshape(())
    else:
        try:
            shape = torch.broadcast_shapes(a.shape, x.shape)
        except RuntimeError:
            shape = None
        if shape != x.shape:
            raise ValueError(
                f"amax shape {tuple(a.shape)} does not broadcast to input shape {tuple(x.shape)}: "
                "use a one-element amax (per tensor) or keep 1 in every reduced dimension (per axis)"
            )
    a = a.to(device=x.device, dtype=cdt)
    if a.numel() and not bool(((a >= 0) & (a < math.inf)).all()):
        if bool(torch.isnan(a).any()):
            raise ValueError("amax must not be NaN")
        if bool((a < 0).any()):
            raise ValueError(f"Negative values in amax: amax must be >= 0, got min {a.min().item()}")
        raise ValueError("amax must be finite, got inf")
    return a


def _check_unsigned_input(x: torch.Tensor) -> None:
    if bool((x < 0).any()):
        raise TypeError(
            "Negative values encountered in unsigned quantization: unsigned=True needs inputs >= 0 "
            f"(got min {x.min().item()}); use unsigned=False"
        )


def _zero_where_tiny(y: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """Multiply by 0 where ``amax <= 2**-24``: signed zeros, NaN stays NaN (in place)."""
    tiny = a <= EPSILON
    if bool(tiny.any()):
        y.mul_(torch.where(tiny, 0.0, 1.0).to(y.dtype))
    return y


def _scale_for_output(scale: torch.Tensor, dtype: torch.dtype, amax: torch.Tensor) -> torch.Tensor:
    out = scale.to(dtype)
    if not bool(torch.isfinite(out).all()):
        bad = amax[~torch.isfinite(torch.broadcast_to(out, amax.shape))] if amax.dim() else amax
        raise ValueError(
            f"scale = max_bound / amax overflows {dtype} (amax = {bad.min().item():g}); "
            f"use a larger amax, float32 inputs, or fake_tensor_quant (which computes in float32)"
        )
    return out


# -- integer kernels ------------------------------------------------------------------------------------------


class _IntPlan:
    """Validated parameters of one integer call (no tensor values)."""

    __slots__ = ("min_bound", "max_bound", "grid", "cdt", "unsigned")

    def __init__(self, x: torch.Tensor, num_bits: object, unsigned: object, narrow_range: object) -> None:
        self.min_bound, self.max_bound = tensor_quant_bounds(num_bits, unsigned, narrow_range)
        if self.max_bound == 0:
            raise ValueError(
                "signed num_bits=1 gives max_bound = 2**0 - 1 = 0, so scale = max_bound / amax is 0 and "
                "nothing can be represented; use num_bits >= 2 or unsigned=True"
            )
        self.unsigned = bool(unsigned)
        self.grid = IntegerGrid(self.min_bound, self.max_bound)
        self.cdt = amax_compute_dtype(x.dtype, self.min_bound, self.max_bound)


def _int_codes(x: torch.Tensor, amax: object, p: _IntPlan, want_mask: bool
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(codes in cdt, scale in cdt, amax in cdt, mask or None)``."""
    a = _check_amax(amax, x, p.cdt)
    if p.unsigned:
        _check_unsigned_input(x)
    scale = amax_scale(a, p.max_bound, p.cdt)
    x = x.detach()
    y = x.to(p.cdt, copy=True).mul_(scale).round_().clamp_(p.min_bound, p.max_bound)
    _zero_where_tiny(y, a)
    mask = (x.abs() <= a) if want_mask else None
    return y, scale, a, mask


def _native_int(mode: int, x: torch.Tensor, amax: object, p: _IntPlan, out_dtype: torch.dtype, want_mask: bool):
    """The one-pass native kernel for the integer modes, or None where it does not apply.

    Same validation, same arithmetic and order as :func:`_int_codes` (``x * scale``, round,
    clamp, times 0 where amax is tiny, then ``/ scale`` for fake quant), so the same bits.
    """
    if x.device.type != "cpu" or out_dtype != x.dtype or not native.supports(x.dtype) or x.numel() == 0:
        return None
    a = _check_amax(amax, x, p.cdt)
    try:
        layout = resolve_layout(x.shape, a.shape, None)
    except ValueError:
        return None
    psb = layout.psb()
    if psb is None or native.library() is None:
        return None
    if p.unsigned:
        _check_unsigned_input(x)
    scale = amax_scale(a, p.max_bound, p.cdt)
    flat = lambda t: t.contiguous().reshape(-1)  # noqa: E731
    # the kernel keeps codes only where amax > 2**-24 (EPSILON) and writes the |x| <= amax mask
    y, mask = native.Call(x.dtype, p.cdt, psb, p.min_bound, p.max_bound).forward(
        mode, x.detach(), flat(scale), flat(a), want_mask=want_mask)
    return y, scale, a, mask


def _tensor_quant_raw(x, amax, num_bits, unsigned, narrow_range, want_mask=False):
    x = _check_input(x)
    p = _IntPlan(x, num_bits, unsigned, narrow_range)
    # float64 whenever the arithmetic ran in float64 (grids beyond 2**21): a float32 copy of the scale
    # would be rounded, and codes / scale would no longer equal fake_tensor_quant
    out_dtype = torch.float64 if p.cdt == torch.float64 else codes_dtype(x.dtype, p.grid)
    fast = _native_int(native.AMAX_Q, x, amax, p, out_dtype, want_mask)
    if fast is not None:
        y, scale, a, mask = fast
        return y, _scale_for_output(scale, out_dtype, a), mask
    y, scale, a, mask = _int_codes(x, amax, p, want_mask)
    return y.to(out_dtype), _scale_for_output(scale, out_dtype, a), mask


def _fake_tensor_quant_raw(x, amax, num_bits, unsigned, narrow_range, want_mask=False):
    x = _check_input(x)
    p = _IntPlan(x, num_bits, unsigned, narrow_range)
    fast = _native_int(native.AMAX_FQ, x, amax, p, x.dtype, want_mask)
    if fast is not None:
        return fast[0], fast[3]
    y, scale, _, mask = _int_codes(x, amax, p, want_mask)
    return y.div_(scale).to(x.dtype), mask


# -- FP8 e4m3 kernels -----------------------------------------------------------------------------------------


def _e4m3_values(x: torch.Tensor, amax: object, want_mask: bool):
    """``(e4m3 values in float32, scale, amax or None, mask or None)``."""
    x = _check_input(x).detach()
    cdt = torch.float32
    if amax is None:
        a = None
        scale = torch.ones((), dtype=cdt, device=x.device)
    else:
        a = _check_amax(amax, x, cdt)
        scale = amax_scale(a, E4M3_MAX, cdt)
    v = x.to(cdt, copy=True).mul_(scale).clamp_(-E4M3_MAX, E4M3_MAX)
    e = v.to(torch.float8_e4m3fn).to(cdt)
    if a is not None:
        _zero_where_tiny(e, a)
    mask = None
    if want_mask:
        mask = x.abs() <= (a if a is not None else E4M3_MAX)
    return e, scale, a, mask


def _fake_e4m3_raw(x, amax, want_mask=False):
    e, scale, _, mask = _e4m3_values(x, amax, want_mask)
    return e.div_(scale).to(x.dtype), mask


def _e4m3_quant_raw(x, amax, want_mask=False):
    e, scale, a, mask = _e4m3_values(x, amax, want_mask)
    return e.to(x.dtype), _scale_for_output(scale, x.dtype, a if a is not None else scale), mask


# -- autograd -------------------------------------------------------------------------------------------------


def _ste_backward(ctx, grad: torch.Tensor) -> torch.Tensor | None:
    if not ctx.needs_input_grad[0]:
        return None
    (mask,) = ctx.saved_tensors
    return native.straight_through(grad, mask).to(ctx.input_dtype)


class TensorQuantFunction(torch.autograd.Function):
    """Integer codes ``clamp(round(x * scale), min_bound, max_bound)`` and ``scale``, with STE backward.

    ``TensorQuantFunction.apply(inputs, amax, num_bits=8, unsigned=False, narrow_range=True)``
    returns ``(outputs, scale)``: the codes stored as floats and the multiplier
    ``max_bound / amax``; ``outputs / scale`` dequantizes. Both have the input's
    dtype when it holds every code exactly (float32 otherwise), and float64 for
    grids beyond 2**21 (``num_bits >= 22``; the arithmetic runs in float64 there,
    and a float32 scale would be rounded). Backward: gradient passes where ``|x| <= amax``.
    """

    @staticmethod
    def forward(ctx, inputs, amax, num_bits=8, unsigned=False, narrow_range=True):  # type: ignore[override]
        want_mask = ctx.needs_input_grad[0]
        outputs, scale, mask = _tensor_quant_raw(inputs, amax, num_bits, unsigned, narrow_range, want_mask)
        ctx.input_dtype = inputs.dtype
        ctx.save_for_backward(mask)
        ctx.mark_non_differentiable(scale)
        return outputs, scale

    @staticmethod
    def backward(ctx, grad_outputs, grad_scale):  # type: ignore[override]
        return _ste_backward(ctx, grad_outputs), None, None, None, None


class FakeTensorQuantFunction(torch.autograd.Function):
    """Fake quantization ``q / scale`` in the input's dtype, with STE backward (``|x| <= amax``).

    ``FakeTensorQuantFunction.apply(inputs, amax, num_bits=8, unsigned=False, narrow_range=True)``.
    """

    @staticmethod
    def forward(ctx, inputs, amax, num_bits=8, unsigned=False, narrow_range=True):  # type: ignore[override]
        want_mask = ctx.needs_input_grad[0]
        outputs, mask = _fake_tensor_quant_raw(inputs, amax, num_bits, unsigned, narrow_range, want_mask)
        ctx.input_dtype = inputs.dtype
        ctx.save_for_backward(mask)
        return outputs

    @staticmethod
    def backward(ctx, grad_outputs):  # type: ignore[override]
        return _ste_backward(ctx, grad_outputs), None, None, None, None


class ScaledE4M3Function(torch.autograd.Function):
    """FP8 e4m3 fake quantization ``e4m3(clamp(x * 448/amax, +-448)) / (448/amax)``, STE backward.

    ``ScaledE4M3Function.apply(inputs, amax=None, E=4, M=3)``; ``amax=None``
    means scale 1 (the gradient then passes where ``|x| <= 448``).
    """

    @staticmethod
    def forward(ctx, inputs, amax=None, E=4, M=3):  # type: ignore[override]  # noqa: N803
        check_fp8_format(E, M)
        outputs, mask = _fake_e4m3_raw(inputs, amax, ctx.needs_input_grad[0])
        ctx.input_dtype = inputs.dtype
        ctx.save_for_backward(mask)
        return outputs

    @staticmethod
    def backward(ctx, grad_outputs):  # type: ignore[override]
        return _ste_backward(ctx, grad_outputs), None, None, None


class _E4M3QuantFunction(torch.autograd.Function):
    """Real FP8 quantization: ``(e4m3 values in the input dtype, scale)``, STE backward."""

    @staticmethod
    def forward(ctx, inputs, amax):  # type: ignore[override]
        outputs, scale, mask = _e4m3_quant_raw(inputs, amax, ctx.needs_input_grad[0])
        ctx.input_dtype = inputs.dtype
        ctx.save_for_backward(mask)
        ctx.mark_non_differentiable(scale)
        return outputs, scale

    @staticmethod
    def backward(ctx, grad_outputs, grad_scale):  # type: ignore[override]
        return _ste_backward(ctx, grad_outputs), None


def _needs_grad(x: object) -> bool:
    return torch.is_grad_enabled() and isinstance(x, torch.Tensor) and x.requires_grad


# -- public functions -----------------------------------------------------------------------------------------


def tensor_quant(
    inputs: torch.Tensor,
    amax: torch.Tensor | float,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize: ``(clamp(round(x * scale), min_bound, max_bound), scale)``, ``scale = max_bound / amax``.

    ``amax`` is per tensor (one element) or per axis (broadcastable to
    ``inputs``). See the module docstring for bounds, precision and special values.

    Raises:
        ValueError: negative, NaN or infinite amax; amax that does not broadcast;
            signed ``num_bits=1``; a scale that overflows the output dtype (float16).
        TypeError: ``unsigned=True`` with a negative input; ``num_bits`` not an int.

    >>> codes, scale = tensor_quant(torch.tensor([-2.0, -1.0, 0.5, 1.0, 3.0]), torch.tensor(1.0))
    >>> codes, scale
    (tensor([-127., -127.,   64.,  127.,  127.]), tensor(127.))
    """
    if _needs_grad(inputs):
        return TensorQuantFunction.apply(inputs, amax, num_bits, unsigned, narrow_range)
    outputs, scale, _ = _tensor_quant_raw(inputs, amax, num_bits, unsigned, narrow_range)
    return outputs, scale


def fake_tensor_quant(
    inputs: torch.Tensor,
    amax: torch.Tensor | float,
    num_bits: int = 8,
    unsigned: bool = False,
    narrow_range: bool = True,
) -> torch.Tensor:
    """Fake-quantize: ``clamp(round(x * scale), min_bound, max_bound) / scale`` in ``inputs.dtype``.

    >>> fake_tensor_quant(torch.tensor([-2.0, 0.3, 0.5, 2.0]), torch.tensor(2.0), num_bits=4)
    tensor([-2.0000,  0.2857,  0.5714,  2.0000])
    """
    if _needs_grad(inputs):
        return FakeTensorQuantFunction.apply(inputs, amax, num_bits, unsigned, narrow_range)
    return _fake_tensor_quant_raw(inputs, amax, num_bits, unsigned, narrow_range)[0]


def e4m3_quant(inputs: torch.Tensor, amax: torch.Tensor | float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Real FP8: ``(e4m3(clamp(x * scale, -448, 448)), scale)`` with ``scale = 448 / amax``.

    The e4m3 values are returned in the input dtype (every one of them fits
    exactly in float16/bfloat16/float32); ``values / scale`` dequantizes.

    >>> e4m3_quant(torch.tensor([0.1, 1.0, 3.0]), torch.tensor(1.0))
    (tensor([ 44., 448., 448.]), tensor(448.))
    """
    if _needs_grad(inputs):
        return _E4M3QuantFunction.apply(inputs, amax)
    outputs, scale, _ = _e4m3_quant_raw(inputs, amax)
    return outputs, scale


def fake_e4m3_quant(inputs: torch.Tensor, amax: torch.Tensor | float | None) -> torch.Tensor:
    """FP8 fake quant: ``e4m3(clamp(x * scale, -448, 448)) / scale``, ``scale = 448 / amax``.

    >>> fake_e4m3_quant(torch.tensor([0.1, 0.3, 1.0, 3.0]), torch.tensor(1.0))
    tensor([0.0982, 0.2857, 1.0000, 1.0000])
    """
    if _needs_grad(inputs):
        return ScaledE4M3Function.apply(inputs, amax, 4, 3)
    return _fake_e4m3_raw(inputs, amax)[0]


def fake_e4m3_quant_modelopt(inputs: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """ModelOpt's FP8 fake quant (``fp8_eager``, its CPU path), for the ModelOpt dialect (:mod:`quanta.modelopt`).

    ``scale = 448.0 / amax`` as torch evaluates it (``reciprocal(amax) * 448``), ``out = e4m3(clamp(x * scale,
    +-448)) * (1 / scale)``: two more roundings than :func:`fake_e4m3_quant` (``/ scale``), which is why the
    TensorRT dialect keeps its own; an ``amax <= 2**-24`` counts as 1 (:func:`fake_e4m3_quant`: zeros). Computed
    in float32 from ``x`` detached, returned in ``x``'s dtype; the caller supplies the gradient.

    >>> fake_e4m3_quant_modelopt(torch.tensor([0.1, 0.3, 1.0, 3.0]), torch.tensor(1.0))
    tensor([0.0982, 0.2857, 1.0000, 1.0000])
    """
    a = torch.as_tensor(amax).detach().to(torch.float32)
    a = torch.where(a <= 1.0 / (1 << 24), torch.ones_like(a), a)
    scale = 448.0 / a
    v = (inputs.detach().to(torch.float32) * scale).clamp(min=-E4M3_MAX, max=E4M3_MAX)
    return (v.to(torch.float8_e4m3fn).to(torch.float32) * (1 / scale)).to(inputs.dtype)


def scaled_e4m3(inputs: torch.Tensor, amax: torch.Tensor | float | None = None, E: int = 4, M: int = 3  # noqa: N803
                ) -> torch.Tensor:
    """NVIDIA's name for :func:`fake_e4m3_quant`; ``E``/``M`` must be 4/3 (NotImplementedError otherwise).

    >>> scaled_e4m3(torch.tensor([0.3, 1.0]), torch.tensor(1.0), 4, 3)
    tensor([0.2857, 1.0000])
    """
    check_fp8_format(E, M)
    return fake_e4m3_quant(inputs, amax)


# -- clipping (learned amax) ----------------------------------------------------------------------------------

_INSIDE, _BELOW, _ABOVE = 1, 2, 3


class ClipFunction(torch.autograd.Function):
    """``y = min(max(x, lo), hi)``; ``dx = g`` inside ``[lo, hi]``, ``dlo = sum(g where x < lo)``,
    ``dhi = sum(g where x > hi)`` (summed to the bounds' shapes). NaN stays NaN with no gradient.

    Saves one int8 per element.
    """

    @staticmethod
    def forward(ctx, x, lo, hi):  # type: ignore[override]
        lo_x, hi_x = lo.detach().to(x.dtype), hi.detach().to(x.dtype)
        y = torch.clamp(x.detach(), lo_x, hi_x)
        if any(ctx.needs_input_grad[:3]):
            state = ((x >= lo_x) & (x <= hi_x)).to(torch.int8)
            state += (x < lo_x).to(torch.int8) * _BELOW
            state += (x > hi_x).to(torch.int8) * _ABOVE
            ctx.save_for_backward(state)
        ctx.shapes = (x.dtype, lo.shape, lo.dtype, hi.shape, hi.dtype)
        return y

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        (state,) = ctx.saved_tensors
        x_dtype, lo_shape, lo_dtype, hi_shape, hi_dtype = ctx.shapes
        zero = torch.zeros((), dtype=g.dtype, device=g.device)
        dx = torch.where(state == _INSIDE, g, zero).to(x_dtype) if ctx.needs_input_grad[0] else None
        dlo = torch.where(state == _BELOW, g, zero).sum_to_size(lo_shape).to(lo_dtype) if ctx.needs_input_grad[1] \
            else None
        dhi = torch.where(state == _ABOVE, g, zero).sum_to_size(hi_shape).to(hi_dtype) if ctx.needs_input_grad[2] \
            else None
        return dx, dlo, dhi


def clip(x: torch.Tensor, clip_value_min: torch.Tensor, clip_value_max: torch.Tensor) -> torch.Tensor:
    """Clamp ``x`` to ``[clip_value_min, clip_value_max]`` with gradients to both bounds.

    >>> clip(torch.tensor([-3.0, 0.5, 3.0]), torch.tensor(-1.0), torch.tensor(2.0))
    tensor([-1.0000,  0.5000,  2.0000])
    """
    _check_input(x)
    lo = torch.as_tensor(clip_value_min, dtype=x.dtype, device=x.device)
    hi = torch.as_tensor(clip_value_max, dtype=x.dtype, device=x.device)
    return ClipFunction.apply(x, lo, hi)


def fake_tensor_quant_onnx(inputs: torch.Tensor, amax: torch.Tensor, axis: int | None, num_bits: int = 8,
                           unsigned: bool = False, narrow_range: bool = False) -> torch.Tensor:
    """Fake quantization through ``torch.fake_quantize_per_tensor_affine`` / ``_per_channel_affine`` (scale
    ``amax / max_bound``, zero point 0), which ``torch.onnx.export`` writes as QuantizeLinear/DequantizeLinear:
    the ONNX path of pytorch_quantization's ``use_fb_fake_quant``. ``amax`` is one value, or one per index of
    ``axis``. Divides by the scale where :func:`fake_tensor_quant` multiplies by its inverse, so the two can
    differ by one step on the rare value that rounds differently.

    >>> fake_tensor_quant_onnx(torch.tensor([0.3, -2.0]), torch.tensor(1.0), None)
    tensor([ 0.2992, -1.0079])
    """
    min_bound, max_bound = tensor_quant_bounds(num_bits, unsigned, narrow_range)
    float32 = inputs.dtype == torch.float32  # no Cast nodes in the exported graph for float32 models
    x = inputs if float32 else inputs.float()
    if axis is None:
        if amax.numel() != 1:
            raise ValueError(f"a per-tensor amax must hold one value, got shape {tuple(amax.shape)}")
        out = torch.fake_quantize_per_tensor_affine(x, float(amax) / max_bound, 0, min_bound, max_bound)
    else:
        scale = (amax.reshape(-1).float() / max_bound)
        if scale.numel() != x.shape[axis]:
            raise ValueError(f"amax has {scale.numel()} values for axis {axis} of size {x.shape[axis]}")
        zero = torch.zeros(scale.shape, dtype=torch.int32, device=x.device)
        out = torch.fake_quantize_per_channel_affine(x, scale, zero, axis, min_bound, max_bound)
    return out if float32 else out.to(inputs.dtype)


class _E4M3QDQ(torch.autograd.Function):
    """``DequantizeLinear(QuantizeLinear(x, s, float8 0), s, float8 0)`` computed and exported as such."""

    @staticmethod
    def forward(ctx, x, scale, axis):  # type: ignore[override]
        xf = x.detach().float()
        s = scale if axis is None else scale.reshape([-1 if d == axis else 1 for d in range(x.dim())])
        ctx.save_for_backward((xf / s).abs() <= E4M3_MAX)
        return ((xf / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float() * s).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        (inside,) = ctx.saved_tensors
        return torch.where(inside, grad, torch.zeros_like(grad)), None, None

    @staticmethod
    def symbolic(g, x, scale, axis):
        zero = g.op("Constant", value_t=torch.zeros(tuple(scale.type().sizes()), dtype=torch.float8_e4m3fn))
        kw = {} if axis is None else {"axis_i": axis}
        q = g.op("QuantizeLinear", x, scale, zero, **kw)
        return g.op("DequantizeLinear", q, scale, zero, **kw)


def fake_e4m3_quant_onnx(inputs: torch.Tensor, amax: torch.Tensor, axis: int | None) -> torch.Tensor:
    """FP8 fake quantization as ONNX computes it (opset 19 QuantizeLinear/DequantizeLinear with a
    ``float8e4m3fn`` zero point): ``e4m3(clamp(x / s, +-448)) * s``, ``s = amax / 448`` per tensor or per index
    of ``axis``; ``torch.onnx.export`` writes it as that Q/DQ pair (the FP8 path of ``use_fb_fake_quant``).

    >>> fake_e4m3_quant_onnx(torch.tensor([0.1, 0.3, 1.0, 3.0]), torch.tensor(1.0), None)
    tensor([0.0982, 0.2857, 1.0000, 1.0000])
    """
    a = amax.detach().float()
    if bool((a <= 0).any()) or not bool(torch.isfinite(a).all()):
        raise ValueError("FP8 ONNX export needs a positive, finite amax")
    if axis is None:
        if a.numel() != 1:
            raise ValueError(f"a per-tensor amax must hold one value, got shape {tuple(a.shape)}")
        scale = (a / E4M3_MAX).reshape(())
    else:
        scale = a.reshape(-1) / E4M3_MAX
        if scale.numel() != inputs.shape[axis]:
            raise ValueError(f"amax has {scale.numel()} values for axis {axis} of size {inputs.shape[axis]}")
    return _E4M3QDQ.apply(inputs, scale, axis)
