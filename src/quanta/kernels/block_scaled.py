"""Block-scaled kernels: MX and NVFP4 quantize, dequantize, fake-quantize, element codes.

The formats are :mod:`quanta.grids.block_scaled`. Blocks run along the last
dimension, which ``block_size`` must divide. Everything is computed in float32
(bfloat16 and float16 inputs are exact there), as torchao 0.18's CPU reference
``torchao.prototype.mx_formats`` does, with its results bit for bit.

**MX quantize** (``amax`` = the block's largest magnitude, ``bits`` = its float32 bit pattern)::

    FLOOR/CEIL/EVEN   e = ((bits >> 23) & 255) - 127 - emax       (+1 for CEIL if amax has mantissa bits;
                                                                 EVEN first rounds amax to the element's mantissa)
                      code = clamp(e, -127, 128) + 127            (255, and a NaN amax: NaN)
                      P = cast(clamp(x / 2**(code - 127), -max, max))
    RCEIL             code = clamp(ceil(log2(amax / max)), -127, 127) + 127   (NaN amax 255, inf 254)
                      P = cast(clamp(x * 2**(127 - code), -max, max))
    dequantize        x' = P * 2**(code - 127)                    (NaN for code 255)

``cast`` rounds to the element format, nearest, ties to even, saturating
(:func:`quanta.kernels.float_cast.fake_cast`; int8: ``round_half_even(64 v) / 64`` in
``[-127/64, 127/64]``). Scaling by a power of two is exact, so these are the OCP
spec's ``P = cast(x / X)``. torchao departs from it in blocks with scale code 0
(``amax`` below about ``2**-118``): it divides by ``2**-126`` instead of the stored
``2**-127`` (FLOOR/CEIL/EVEN) or multiplies by 1 instead of ``2**127`` (RCEIL, after
TransformerEngine), so its dequantized block is off by a factor of 2 or flushed to
zero; quanta keeps ``x' = P * X`` there too. ``ceil(log2(.))`` is exact here (torchao's CPU fallback uses
float32 ``log2``, which can round ``2**k * (1 + 2**-23)`` down to ``k`` and so pick the
exponent one lower than NVIDIA's hardware rule; quanta follows the hardware).

**NVFP4 quantize** (16 elements per block, optional float32 ``s_t`` per tensor)::

    s_b = e4m3(clamp(amax / 6 / s_t, 2**-6, 448))               (s_t = 1 when absent)
    P   = cast_e2m1(clamp(x * ((1 / s_t) / s_b), -6, 6))           (torchao: x * (1 / s_b) without s_t)
    x'  = P * (s_t * s_b)

A zero stays zero even where ``s_t`` is so small (a tensor of magnitude below about ``2**-115``) that ``1 / s_t``
overflows: torchao computes ``0 * inf = NaN`` there and stores it as the code of ``+-1.5``.

**Fake quantization** (``*_quantize_dequantize``) returns ``dequantize(quantize(x))`` in
``x``'s dtype with a straight-through gradient: ``dx = dy`` where the element did not
saturate (``|x / X|`` at most ``max`` plus half the top step of the element grid, what rounding reaches anyway),
0 where it did.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from quanta.grids.block_scaled import (
    BLOCK_SCALED_FORMATS,
    E8M0_EXPONENT_BIAS,
    E8M0_EXPONENT_NAN_VAL,
    NVFP4,
    BlockScaledFormat,
    BlockScaleKind,
    ScaleCalculationMode,
)
from quanta.grids.float import FLOAT8_E4M3FN, FP4_E2M1
from quanta.kernels import fpx_codes
from quanta.kernels.float_cast import fake_cast
from quanta.kernels.packing import pack_bits

__all__ = [
    "check_blocks",
    "mx_shared_exponent",
    "e8m0_to_float",
    "mx_quantize",
    "mx_dequantize",
    "mx_quantize_dequantize",
    "nvfp4_quantize",
    "nvfp4_dequantize",
    "nvfp4_block_scales_hp",
    "nvfp4_block_dequantized",
    "nvfp4_quantize_dequantize",
    "per_tensor_amax_to_scale",
    "element_storage_dtype",
    "encode_elements",
    "decode_elements",
]

_E4M3_TINY = 2.0 ** -6  # torch.finfo(torch.float8_e4m3fn).tiny: NVFP4's smallest block scale


def check_blocks(x: torch.Tensor, block_size: int, what: str = "x") -> None:
    """Raise ``ValueError`` unless ``x`` is a floating tensor whose last dimension ``block_size`` divides."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point() or x.dtype == torch.float64 or x.element_size() == 1:
        raise TypeError(f"{what} must be float32, bfloat16 or float16, got {x.dtype}")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if x.dim() == 0 or x.shape[-1] % block_size:
        raise ValueError(f"the last dimension of {what} (shape {tuple(x.shape)}) must be a multiple of "
                         f"block_size={block_size}")


def _blocks(x: torch.Tensor, block_size: int) -> torch.Tensor:
    return x.to(torch.float32).reshape(*x.shape[:-1], x.shape[-1] // block_size, block_size)


def _amax(xb: torch.Tensor) -> torch.Tensor:
    """The largest magnitude per block (NaN if the block holds a NaN), keepdim."""
    return torch.amax(xb.abs(), dim=-1, keepdim=True)


def mx_shared_exponent(amax: torch.Tensor, fmt: BlockScaledFormat,
                       mode: ScaleCalculationMode = ScaleCalculationMode.FLOOR) -> torch.Tensor:
    """The biased E8M0 code (``uint8``) of each block's shared scale, from its float32 ``amax``.

    >>> a = torch.tensor([448.0, 449.0, 0.0, float("nan")])
    >>> from quanta.grids.block_scaled import MXFP8_E4M3
    >>> mx_shared_exponent(a, MXFP8_E4M3).tolist()             # 2**(8-8), 2**0, 2**-127, NaN
    [127, 127, 0, 255]
    >>> mx_shared_exponent(a, MXFP8_E4M3, ScaleCalculationMode.RCEIL).tolist()
    [127, 128, 0, 255]
    """
    if not isinstance(mode, ScaleCalculationMode):
        raise TypeError(f"mode must be a ScaleCalculationMode, got {mode!r}")
    amax = amax.to(torch.float32)
    nan = torch.isnan(amax)
    if mode is ScaleCalculationMode.RCEIL:
        d = amax / fmt.element_max
        mant, e = torch.frexp(d)  # d = mant * 2**e, mant in [0.5, 1): ceil(log2 d) = e - (mant == 0.5)
        ceil_log2 = torch.where(d == 0, -E8M0_EXPONENT_BIAS, e - (mant == 0.5).to(e.dtype))
        code = (ceil_log2.clamp(-E8M0_EXPONENT_BIAS, E8M0_EXPONENT_BIAS) + E8M0_EXPONENT_BIAS).to(torch.uint8)
        code = torch.where(torch.isinf(d), 254, code)
        return torch.where(nan, E8M0_EXPONENT_NAN_VAL, code).to(torch.uint8)
    bits = amax.view(torch.int32)
    if mode is ScaleCalculationMode.EVEN:  # round amax to the element's mantissa (half up), then floor
        bits = (bits + (1 << (23 - fmt.mantissa_bits - 1))) & (((1 << 9) - 1) << 23)
    e = ((bits >> 23) & 0xFF) - 127
    if mode is ScaleCalculationMode.CEIL:
        e = e + ((bits & 0x7FFFFF) > 0).to(e.dtype)
    e = (e - fmt.emax).clamp(-E8M0_EXPONENT_BIAS, E8M0_EXPONENT_BIAS + 1) + E8M0_EXPONENT_BIAS
    return torch.where(nan, E8M0_EXPONENT_NAN_VAL, e).to(torch.uint8)


def e8m0_to_float(code: torch.Tensor) -> torch.Tensor:
    """``2**(code - 127)`` in float32 (NaN for 255); ``code`` is ``uint8`` or ``float8_e8m0fnu``.

    >>> e8m0_to_float(torch.tensor([0, 127, 130, 255], dtype=torch.uint8)).tolist()
    [5.877471754111438e-39, 1.0, 8.0, nan]
    """
    c = code.view(torch.uint8).to(torch.int32)
    s = torch.ldexp(torch.ones(c.shape, dtype=torch.float32, device=c.device), c - E8M0_EXPONENT_BIAS)
    return torch.where(c == E8M0_EXPONENT_NAN_VAL, float("nan"), s)


def _cast_elements(v: torch.Tensor, fmt: BlockScaledFormat) -> torch.Tensor:
    """Round float32 ``v`` (already scaled) to the element grid, saturating; NaN stays NaN."""
    if fmt.element is None:  # MXINT8: k / 64, |k| <= 127
        return torch.round(v * 64).clamp(-127, 127) / 64
    return fake_cast(v, fmt.element)


def _mx_quantize_blocks(xb: torch.Tensor, fmt: BlockScaledFormat, mode: ScaleCalculationMode
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    code = mx_shared_exponent(_amax(xb), fmt, mode)
    top = fmt.element_max
    if mode is ScaleCalculationMode.RCEIL:  # NVIDIA's kernels multiply by the reciprocal
        r = torch.exp2(E8M0_EXPONENT_BIAS - code.to(torch.float32))
        r = torch.where(code == E8M0_EXPONENT_NAN_VAL, float("nan"), r)
        scaled = (xb * r).clamp(-top, top)
    else:
        scaled = (xb / e8m0_to_float(code)).clamp(-top, top)
    return _cast_elements(scaled, fmt), code.squeeze(-1)


def _check_format(fmt: BlockScaledFormat, kind: BlockScaleKind) -> None:
    if not isinstance(fmt, BlockScaledFormat) or fmt.scale_kind is not kind:
        raise TypeError(f"fmt must be a BlockScaledFormat with {kind.name} scales, got {fmt!r}")


def mx_quantize(x: torch.Tensor, fmt: BlockScaledFormat, mode: ScaleCalculationMode = ScaleCalculationMode.FLOOR
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P, code)``: the elements as float32 values on the element grid (shape of ``x``) and the blocks'
    E8M0 codes (``uint8``, shape ``(*x.shape[:-1], K // block_size)``).

    >>> from quanta.grids.block_scaled import MXFP4
    >>> p, code = mx_quantize(torch.tensor([[0.1, -0.7, 3.0, 5.9]]), MXFP4.with_block_size(4))
    >>> p.tolist(), code.tolist()        # amax 5.9: X = 2**(2 - 2) = 1
    ([[0.0, -0.5, 3.0, 6.0]], [[127]])
    """
    _check_format(fmt, BlockScaleKind.E8M0)
    check_blocks(x, fmt.block_size)
    p, code = _mx_quantize_blocks(_blocks(x, fmt.block_size), fmt, mode)
    return p.reshape(x.shape), code


def mx_dequantize(p: torch.Tensor, code: torch.Tensor, fmt: BlockScaledFormat,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``P * 2**(code - 127)`` in ``dtype``.

    The element values and the powers of two are exact in float32 and bfloat16, and so is their product in
    float32, so multiplying in ``dtype`` (torchao's order) rounds once, like the exact product rounded to
    ``dtype``; for float16, whose range ends at 65504, the product is taken in float32 first.
    """
    cdt = torch.float32 if dtype == torch.float16 else dtype
    pb = p.to(cdt).reshape(*p.shape[:-1], p.shape[-1] // fmt.block_size, fmt.block_size)
    s = _e8m0_table(cdt, p.device)[code.view(torch.uint8).to(torch.int32)]
    return (pb * s.unsqueeze(-1)).reshape(p.shape).to(dtype)


def _e8m0_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``2**(c - 127)`` for every code ``c`` in ``dtype`` (cached, except while tracing)."""
    return _traced_or_cached(_build_e8m0_table, dtype, device)


def _build_e8m0_table(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return e8m0_to_float(torch.arange(256, dtype=torch.uint8)).to(dtype).to(device)


_TABLES: dict[tuple, torch.Tensor] = {}


def _traced_or_cached(build, *key):
    """``build(*key)``, cached; under torch.compile or another fake-tensor mode built afresh, since a cached
    tensor would cross tracing modes (a table of 256 entries costs nothing to rebuild)."""
    from torch._guards import detect_fake_mode

    if torch.compiler.is_compiling() or detect_fake_mode() is not None:
        return build(*key)
    k = (build, *key)
    if k not in _TABLES:
        _TABLES[k] = build(*key)
    return _TABLES[k]


def per_tensor_amax_to_scale(amax: torch.Tensor) -> torch.Tensor:
    """NVFP4's per-tensor scale from a tensor's largest magnitude: ``amax / (448 * 6)`` in float32.

    >>> per_tensor_amax_to_scale(torch.tensor(2688.0))
    tensor(1.)
    """
    return amax.to(torch.float32) / (FLOAT8_E4M3FN.max * FP4_E2M1.max)


def _check_per_tensor_scale(s: Optional[torch.Tensor]) -> None:
    if s is None:
        return
    if not isinstance(s, torch.Tensor) or s.numel() != 1 or not s.is_floating_point():
        raise ValueError(f"per_tensor_scale must be a one-element float tensor or None, got {s!r:.80}")


def _nvfp4_block_scale(amax: torch.Tensor, per_tensor_scale: Optional[torch.Tensor]) -> torch.Tensor:
    """The e4m3 block scales (as float32 values) of NVFP4, from the blocks' ``amax`` (keepdim)."""
    s = amax / FP4_E2M1.max
    if per_tensor_scale is not None:
        s = s / per_tensor_scale.to(torch.float32).reshape(())
    return fake_cast(s.clamp(_E4M3_TINY, FLOAT8_E4M3FN.max), FLOAT8_E4M3FN)


def _nvfp4_scaled(xb: torch.Tensor, sb: torch.Tensor, per_tensor_scale: Optional[torch.Tensor]) -> torch.Tensor:
    """``x * ((1 / s_t) / s_b)`` (``x * (1 / s_b)`` without ``s_t``); a zero stays zero when ``1 / s_t`` overflows."""
    if per_tensor_scale is None:
        return xb * (1.0 / sb)
    scaled = xb * ((1.0 / per_tensor_scale.to(torch.float32).reshape(())) / sb)
    return torch.where(xb == 0, xb, scaled)


def nvfp4_quantize(x: torch.Tensor, per_tensor_scale: Optional[torch.Tensor] = None, block_size: int = 16
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(P, s_b)``: fp4 e2m1 elements as float32 values (shape of ``x``) and the e4m3 block scales as
    float32 values (shape ``(*x.shape[:-1], K // block_size)``).

    >>> p, s = nvfp4_quantize(torch.tensor([[0.3, -1.2, 6.0, 2.9]]), block_size=4)
    >>> p.tolist(), s.tolist()           # s_b = e4m3(6 / 6) = 1
    ([[0.5, -1.0, 6.0, 3.0]], [[1.0]])
    """
    check_blocks(x, block_size)
    _check_per_tensor_scale(per_tensor_scale)
    p, sb, _ = _nvfp4_quantize_blocks(_blocks(x, block_size), per_tensor_scale)
    return p.reshape(x.shape), sb.squeeze(-1)


def _nvfp4_quantize_blocks(xb: torch.Tensor, per_tensor_scale: Optional[torch.Tensor]
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(P, s_b, x * r)`` of blocks ``xb`` (``s_b`` keepdim; ``x * r``: the elements before rounding)."""
    sb = _nvfp4_block_scale(_amax(xb), per_tensor_scale)
    scaled = _nvfp4_scaled(xb, sb, per_tensor_scale)
    return fake_cast(scaled.clamp(-FP4_E2M1.max, FP4_E2M1.max), FP4_E2M1), sb, scaled


def nvfp4_block_scales_hp(block_scale: torch.Tensor, per_tensor_scale: Optional[torch.Tensor]) -> torch.Tensor:
    """The float32 scale of each block: ``s_t * s_b`` (``s_b`` alone without a per-tensor scale)."""
    sb = block_scale.to(torch.float32)
    return sb if per_tensor_scale is None else per_tensor_scale.to(torch.float32) * sb


def nvfp4_dequantize(p: torch.Tensor, block_scale: torch.Tensor, per_tensor_scale: Optional[torch.Tensor] = None,
                     dtype: torch.dtype = torch.float32, block_size: int = 16) -> torch.Tensor:
    """``P * (s_t * s_b)`` computed in float32, then cast to ``dtype`` (torchao's order of operations)."""
    pb = _blocks(p, block_size)
    out = pb * nvfp4_block_scales_hp(block_scale, per_tensor_scale).unsqueeze(-1)
    return out.reshape(p.shape).to(dtype)


def _saturation_edge(fmt: BlockScaledFormat) -> float:
    """Where rounding stops reaching the largest element: ``max`` plus half its step (values up to here round
    to ``max`` as they would without the clamp, so they keep their gradient)."""
    return fmt.element_max + 2.0 ** (fmt.emax - fmt.mantissa_bits) / 2


class _BlockFakeQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, fn):
        out, saturated = fn(x)
        ctx.save_for_backward(saturated)
        return out

    @staticmethod
    def backward(ctx, dy):
        (saturated,) = ctx.saved_tensors
        return torch.where(saturated, 0.0, dy), None


def _mx_qdq_raw(v: torch.Tensor, fmt: BlockScaledFormat, mode: ScaleCalculationMode
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(QDQ(v), saturated)`` for MX."""
    xb = _blocks(v.detach(), fmt.block_size)
    p, code = _mx_quantize_blocks(xb, fmt, mode)
    s = e8m0_to_float(code).unsqueeze(-1)
    out = (p * s).reshape(v.shape).to(v.dtype)
    return out, ((xb / s).abs() > _saturation_edge(fmt)).reshape(v.shape)


def _nvfp4_qdq_raw(v: torch.Tensor, per_tensor_scale: Optional[torch.Tensor], block_size: int,
                   with_tensor_scale: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """``(QDQ(v), saturated)`` for NVFP4 (``with_tensor_scale=False``: ``P * s_b`` in float32, the per-tensor
    scale left for the caller, as NVIDIA's fp4 GEMM applies it)."""
    p, sb, scaled = _nvfp4_quantize_blocks(_blocks(v.detach(), block_size), per_tensor_scale)
    mask = (scaled.abs() > _saturation_edge(NVFP4)).reshape(v.shape)
    if not with_tensor_scale:
        return (p * sb).reshape(v.shape), mask
    return (p * nvfp4_block_scales_hp(sb, per_tensor_scale)).reshape(v.shape).to(v.dtype), mask


def mx_quantize_dequantize(x: torch.Tensor, fmt: BlockScaledFormat,
                           mode: ScaleCalculationMode = ScaleCalculationMode.FLOOR) -> torch.Tensor:
    """MX fake quantization: ``mx_dequantize(*mx_quantize(x))`` in ``x.dtype``, straight-through gradient.

    Under ``torch.compile`` it is the opaque custom op ``quanta::mx_quantize_dequantize`` (same bits).

    >>> from quanta.grids.block_scaled import MXFP4
    >>> mx_quantize_dequantize(torch.tensor([0.1, -0.7, 3.0, 5.9, 0, 0, 0, 0.01]), MXFP4.with_block_size(4))
    tensor([ 0.0000, -0.5000,  3.0000,  6.0000,  0.0000,  0.0000,  0.0000,  0.0117])
    """
    _check_format(fmt, BlockScaleKind.E8M0)
    check_blocks(x, fmt.block_size)
    if torch.compiler.is_compiling():
        return torch.ops.quanta.mx_quantize_dequantize(x, fmt.name, fmt.block_size, mode.value)
    return _BlockFakeQuant.apply(x, lambda v: _mx_qdq_raw(v, fmt, mode))


def nvfp4_quantize_dequantize(x: torch.Tensor, per_tensor_scale: Optional[torch.Tensor] = None,
                              block_size: int = NVFP4.block_size) -> torch.Tensor:
    """NVFP4 fake quantization: ``nvfp4_dequantize(*nvfp4_quantize(x))`` in ``x.dtype``, straight-through.

    Under ``torch.compile`` it is the opaque custom op ``quanta::nvfp4_quantize_dequantize`` (same bits).

    >>> nvfp4_quantize_dequantize(torch.tensor([0.3, -1.2, 6.0, 2.9]), block_size=4)
    tensor([ 0.5000, -1.0000,  6.0000,  3.0000])
    """
    check_blocks(x, block_size)
    _check_per_tensor_scale(per_tensor_scale)
    if torch.compiler.is_compiling():
        return torch.ops.quanta.nvfp4_quantize_dequantize(x, per_tensor_scale, block_size, True)
    return _BlockFakeQuant.apply(x, lambda v: _nvfp4_qdq_raw(v, per_tensor_scale, block_size))


def nvfp4_block_dequantized(x: torch.Tensor, per_tensor_scale: Optional[torch.Tensor] = None,
                            block_size: int = NVFP4.block_size) -> torch.Tensor:
    """``P * s_b`` of NVFP4-quantized ``x`` in float32, without the per-tensor scale (what an fp4 GEMM
    multiplies; the tensor scales multiply its result). No gradient."""
    check_blocks(x, block_size)
    _check_per_tensor_scale(per_tensor_scale)
    if torch.compiler.is_compiling():
        return torch.ops.quanta.nvfp4_quantize_dequantize(x.detach(), per_tensor_scale, block_size, False)
    return _nvfp4_qdq_raw(x, per_tensor_scale, block_size, with_tensor_scale=False)[0]


# --------------------------------------------------------------------------- custom ops (torch.compile)
def _mx_fmt(name: str, block_size: int) -> BlockScaledFormat:
    fmt = BLOCK_SCALED_FORMATS[name]
    return fmt.with_block_size(block_size) if fmt.block_size != block_size else fmt


@torch.library.custom_op("quanta::mx_quantize_dequantize", mutates_args=())
def _mx_op(x: torch.Tensor, fmt: str, block_size: int, mode: str) -> torch.Tensor:
    return _mx_qdq_raw(x, _mx_fmt(fmt, block_size), ScaleCalculationMode(mode))[0]


@_mx_op.register_fake
def _(x, fmt, block_size, mode):
    return torch.empty_like(x)


@torch.library.custom_op("quanta::mx_saturated", mutates_args=())
def _mx_mask_op(x: torch.Tensor, fmt: str, block_size: int, mode: str) -> torch.Tensor:
    return _mx_qdq_raw(x, _mx_fmt(fmt, block_size), ScaleCalculationMode(mode))[1]


@_mx_mask_op.register_fake
def _(x, fmt, block_size, mode):
    return torch.empty(x.shape, dtype=torch.bool, device=x.device)


def _mx_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.args = inputs[1:]


def _mx_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    sat = torch.ops.quanta.mx_saturated(x, *ctx.args)
    return torch.where(sat, torch.zeros_like(grad), grad), None, None, None


_mx_op.register_autograd(_mx_backward, setup_context=_mx_setup)


@torch.library.custom_op("quanta::nvfp4_quantize_dequantize", mutates_args=())
def _nvfp4_op(x: torch.Tensor, per_tensor_scale: Optional[torch.Tensor], block_size: int,
              with_tensor_scale: bool) -> torch.Tensor:
    return _nvfp4_qdq_raw(x, per_tensor_scale, block_size, with_tensor_scale)[0]


@_nvfp4_op.register_fake
def _(x, per_tensor_scale, block_size, with_tensor_scale):
    return torch.empty_like(x, dtype=x.dtype if with_tensor_scale else torch.float32)


@torch.library.custom_op("quanta::nvfp4_saturated", mutates_args=())
def _nvfp4_mask_op(x: torch.Tensor, per_tensor_scale: Optional[torch.Tensor], block_size: int) -> torch.Tensor:
    return _nvfp4_qdq_raw(x, per_tensor_scale, block_size)[1]


@_nvfp4_mask_op.register_fake
def _(x, per_tensor_scale, block_size):
    return torch.empty(x.shape, dtype=torch.bool, device=x.device)


def _nvfp4_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.args = (inputs[1], inputs[2])


def _nvfp4_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    sat = torch.ops.quanta.nvfp4_saturated(x, *ctx.args)
    return torch.where(sat, torch.zeros_like(grad), grad), None, None, None


_nvfp4_op.register_autograd(_nvfp4_backward, setup_context=_nvfp4_setup)


# --------------------------------------------------------------------------- element codes (storage)
def element_storage_dtype(fmt: BlockScaledFormat) -> torch.dtype:
    """The dtype of :func:`encode_elements`'s storage for ``fmt``."""
    if fmt.element is None:
        return torch.int8
    if fmt.element_bits == 8:
        return torch.float8_e4m3fn if fmt.element == FLOAT8_E4M3FN else torch.float8_e5m2
    return torch.uint8


def encode_elements(p: torch.Tensor, fmt: BlockScaledFormat) -> torch.Tensor:
    """Storage of element values ``p`` (on the grid), in torchao's layout.

    fp8: the ``torch.float8_*`` tensor; fp6: one ``S|E|M`` code per ``uint8``; fp4: two codes per ``uint8``
    (element ``2i`` in the low nibble); int8: ``int8`` ``k = 64 P``. A NaN element (its block's scale is NaN)
    is stored as code 0.
    """
    if fmt.element is None:
        return torch.round(p * 64).to(torch.int8)
    if fmt.element_bits == 8:
        return p.to(element_storage_dtype(fmt))
    codes = fpx_codes.encode(torch.nan_to_num(p, nan=0.0), fmt.element)
    return pack_bits(codes, 4) if fmt.element_bits == 4 else codes


def decode_elements(qdata: torch.Tensor, fmt: BlockScaledFormat, dtype: torch.dtype = torch.float32
                    ) -> torch.Tensor:
    """The element values of :func:`encode_elements`'s storage, in ``dtype`` (exact in float32, bfloat16 and
    float16). fp4 and fp6 codes are read through a table of every byte's values."""
    if fmt.element is None:
        return qdata.to(dtype) / 64
    if fmt.element_bits == 8:
        return qdata.to(dtype)
    table = _code_table(fmt, dtype, qdata.device)
    out = F.embedding(qdata.to(torch.int32), table)  # fp4: [..., K/2, 2]; fp6: [..., K, 1]
    return out.reshape(*qdata.shape[:-1], -1)


def _code_table(fmt: BlockScaledFormat, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Each byte's element values: fp4 ``[256, 2]`` (low nibble, high nibble), fp6 ``[256, 1]``."""
    return _traced_or_cached(_build_code_table, fmt, dtype, device)


def _build_code_table(fmt: BlockScaledFormat, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    b = torch.arange(256, dtype=torch.uint8)
    if fmt.element_bits == 4:
        return torch.stack([fpx_codes.decode(b & 15, fmt.element), fpx_codes.decode(b >> 4, fmt.element)],
                           -1).to(dtype).to(device)
    return fpx_codes.decode(b & ((1 << fmt.element_bits) - 1), fmt.element).to(dtype).to(device).unsqueeze(-1)
