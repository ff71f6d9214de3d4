"""Linear layers on integer weights, on CPU: quanta's own kernels (a torch C++ extension).

Three recipes, each a one-time ``prepare``/``pack`` step at quantize time and a
per-call linear that does no weight-sized work besides reading the weight::

    int8 weight-only      y = (x @ W_q.T) * s + b                    W_q int8 [N, K], s bfloat16 [N]
    int4 weight-only      y = x @ W.T + b,  W[n, k] = fma(c[n, k] - 8, s[g, n], z[g, n]),  g = k // group_size
    int8 dynamic          y = ((A * s_x[m]) * s_w[n]) + b[n],   A = sum_k q_x[m, k] q_w[n, k] - z_x[m] * colsum[n]

The kernels live in ``csrc/int_linear.cpp``, built at first use and cached
(:mod:`quanta.kernels.int_linear_native`), and run on torch's own thread pool.
Decode-sized inputs (fewer than 8 rows) take a vectorised GEMV that converts the
weights in registers as they stream past (int4: one weight row per vector lane,
16 rows of a tile at once, the tile's codes one sequential stream); larger
inputs take a GEMM that dequantizes a panel of weights into a cache (transposed)
and keeps a 6 x 64 output tile in registers (the bfloat16 int4 GEMM, which also keeps each
group's partial sums there: 3 x 64, or 6 x 32 from 64 rows on, the same sums in the same
order). AVX-512, AVX2 and a portable C++ path are chosen at
run time and give the same bits (tested; :func:`quanta.kernels.int_linear_native.force_isa`).
On CPUs with AVX512-BF16 (``vdpbf16ps``: AMD Zen 4 and later, Intel Cooper Lake,
Sapphire Rapids and later), bfloat16 activations take faster paths with their own
fixed order, described under *bfloat16 paths* below; every other input runs the
common paths.

Precision (float paths). Activations are widened to float32 exactly (float32,
float16 and bfloat16 inputs alike; nothing is rounded to bfloat16 first), the
weights are the exact dequantized float32 values (int8 codes; for int4 one
``fma`` rounding of ``(code - 8) * scale + zero``), products accumulate in
float32 with fused multiply-adds in a fixed order, the int8 scale and the bias
are applied in float32, and the output is rounded to ``x``'s dtype once. The
error against the exact result is that of a float32 dot product:
``|y - y_exact| <= (K + 2) * 2**-24 * sum_k |x_k w_k|`` plus the final rounding
(``2**-8`` relative for bfloat16, ``2**-11`` for float16); float16 overflows only
where the true result does. The order: int8 GEMV rows (M < 8) sum each output in
16 lanes (lane ``l`` takes ``k = 16c + l``) added by a fixed tree; int4 GEMV rows
in two chains ``a_j`` over the ``k = j mod 2`` in increasing order, then
``a_0 + a_1``; the GEMM sums each output as one chain over ``k``.
So the two row counts may differ in the last bits; each is reproducible on every
CPU. The int8 dynamic path's integer part is exact, and its scaling is the reference's, so it matches
:func:`quanta.kernels.int_linear_reference.int8_dynamic_reference` bit for bit;
from 32 rows on, its integer part is torch's blocked int8 GEMM (``torch._int_mm``,
oneDNN, on the stored ``[N, K]`` codes), which gives the same exact sums
(0.70x bf16 ``F.linear`` time at 512 rows, K = N = 4096, where the row kernel
took 1.49x).

Under ``torch.compile`` / ``torch.export`` the native kernels are opaque ops
(``torch.ops.quanta_cpu.*``, shape-only fake implementations) that a quantized
tensor's ``linear`` calls directly; the dynamic path's per-token quantization is
traced as plain torch ops (inductor fuses it).

bfloat16 paths (AVX512-BF16 CPUs, bfloat16 ``x``). ``vdpbf16ps`` multiplies
bfloat16 pairs and adds both products to a float32 accumulator, odd element
first, each addition rounded once (an ``fma`` of an exact product: checked on the
hardware), flushing subnormal inputs and results to zero. Every product below is
exact in float32 (a bfloat16 times an int8 code, or times ``c - 8``), so the
error bound stays a float32 one:

* int8 weight-only, 8 rows or more: one chain per output over the ``k`` pairs,
  ``k = 2p + 1`` then ``2p``, then ``* s + b`` (decode rows keep the common path:
  it is as fast there);
* int4 weight-only, every row count: the weight in its factored form
  ``w = s_g (c - 8) + z_g``, ``y = sum_g s_g P_g + sum_g z_g X_g`` with
  ``P_g = sum_{k in g} x_k (c_k - 8)`` and ``X_g = sum_{k in g} x_k``, so no weight
  is dequantized in float: ``|y - y_exact| <= (K + 8) * 2**-24 * sum_k |x_k| (|s (c_k - 8)| + |z|)``
  plus the output rounding (``|s (c - 8)| + |z|`` may exceed ``|w|`` where they cancel).

These orders differ from the common paths' in the last bits (a bfloat16 output
rarely shows it), and int4 decode rows from int4 prefill rows: decode sums
``P_g`` in four chains (the pairs ``(8l + 2j, 8l + 2j + 1)`` of each 8-k line ``l``
into chain ``j``, added as ``(P_0 + P_1) + (P_2 + P_3)``), prefill in one chain per
output; each is reproducible across thread counts and the rows of a call.
``force_isa("avx512")`` runs the common paths on such a CPU.

The activation quantization of the dynamic path is torchao's (0.15), computed
by the torchao-convention kernels in :mod:`quanta.kernels.zero_point`:

* symmetric (``Int8DynamicActivationInt8WeightConfig``'s default,
  ``_int8_symm_per_token_reduced_range_quant``): per row ``s = max(amax|x| / 127, 1e-5)``
  computed in ``x``'s dtype (float32 for float16 input), ``q = clamp(round(x * (1/s)), -127, 127)``;
* asymmetric (``_int8_asymm_per_token_quant``): per row ``s = max((max⁺ - min⁻) / 255, eps_fp32)``,
  ``z = clamp(-128 - round(min⁻ / s), -128, 127)``, ``q = clamp(round(x * (1/s)) + z, -128, 127)``
  with ``min⁻ = min(min x, 0)``, ``max⁺ = max(max x, 0)``; scale float32, zero point int8.

Unlike torchao, the output scaling runs in float32 whatever the activation
dtype (torchao multiplies in bfloat16 for bfloat16 input), and the asymmetric
zero point is honoured on the integer path (torchao falls back to a float
matmul there).

Shapes: any ``N`` and ``K`` (``K`` need not be a multiple of 16 or of the int4
group), any number of rows. int32 accumulation of the dynamic path needs
``K <= 65536``. The int4 packing (:func:`pack_int4_cpu`) is quanta's own and the
same on every machine.

Without a C++ compiler or ``ninja`` (or with ``QUANTA_INT_LINEAR_NATIVE=0``) the
same functions run a fallback after a one-time warning: int8 weight-only through
``torch._weight_int8pack_mm`` when ``K`` is a multiple of 16 (its precision:
activations rounded to bfloat16, output rounded to bfloat16 before the bias),
everything else through :mod:`quanta.kernels.int_linear_reference`, with the same
results up to float32 rounding. These are inference kernels: no gradient reaches ``x``.
"""

from __future__ import annotations

import mmap
import weakref

import torch

from quanta.kernels import int_linear_native as _native
from quanta.kernels import int_linear_reference as _ref
from quanta.kernels import zero_point as _zp
from quanta.kernels.torchao_blocks import block_min_max, full_block_layout

__all__ = [
    "check_int4_cpu_shape",
    "int4_cpu_linear",
    "int4_cpu_linear_prepared",
    "int4_cpu_packed_shape",
    "int4_cpu_scale_and_zero_shape",
    "int8_dynamic_activation_linear",
    "int8_weight_col_sums",
    "int8_weight_only_linear",
    "int8_weight_only_linear_prepared",
    "pack_int4_cpu",
    "prepare_int8_dynamic",
    "prepare_int8_weight_only",
    "quantize_per_token_int8",
    "unpack_int4_cpu",
]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_INT8_PACK_K_MULTIPLE = 16  # torch._weight_int8pack_mm's constraint (the fallback only)
_BF16_ALIGN = 32  # bytes: torch's int8 kernel loads 16 bfloat16 activations with aligned 256-bit loads
_WEIGHT_ALIGN = 64
_HUGE_PAGE = 2 << 20  # bytes: x86-64's transparent huge page
_HUGE_PAGE_PAD_RATIO = 16  # a weight's last partial huge page is whole when that pads it by at most 1/16
_INT4_GROUP_SIZES = (32, 64, 128, 256)
_INT4_BLOCK = 64  # the int4 packing pads k to whole blocks of 64
_INT4_TILE_ROWS = 16  # weight rows per tile of the int4 packing (one per 32-bit vector lane)
_INT_MM_MAX_K = 65536  # |sum_k (q_x - z_x) q_w| <= 255 * 128 * K stays below 2**31
_FP16_MAX = 65504.0
_BF16_ROUNDED_FP16_MAX = 65536.0  # bfloat16's rounding of every value in [65408, 65792]
_SYM_QMIN, _SYM_QMAX, _SYM_EPS = -127, 127, 1e-5
_ASYM_QMIN, _ASYM_QMAX, _ASYM_EPS = -128, 127, torch.finfo(torch.float32).eps


# --------------------------------------------------------------------------- checks and shared steps
def _tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _int_tensor(name: str, t: object, dtypes: tuple[torch.dtype, ...], ndim: int) -> torch.Tensor:
    t = _tensor(name, t)
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(t.shape)}")
    return t


def _float_vector(name: str, t: object, n: int) -> torch.Tensor:
    """A floating tensor of ``n`` elements as shape ``(n,)``; ``(n, 1)`` is accepted (torchao's keepdim scales)."""
    t = _tensor(name, t)
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if t.numel() != n or (t.dim() > 1 and t.shape[0] != n):
        raise ValueError(f"{name} must have shape ({n},), one entry per output row; got {tuple(t.shape)}")
    return t.reshape(n)


def _check_finite(name: str, t: torch.Tensor, what: str) -> None:
    bad = ~torch.isfinite(t)
    if bool(bad.any()):
        raise ValueError(f"{name} has {int(bad.sum())} non-finite value(s) {what}")


def _check_x(x: object, k: int) -> torch.Tensor:
    x = _tensor("x", x)
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    if x.dim() == 0 or x.shape[-1] != k:
        raise ValueError(f"x must have shape [..., {k}] (in_features = {k}), got {tuple(x.shape)}")
    return x


def _check_bias(bias: object, n: int) -> torch.Tensor | None:
    if bias is None:
        return None
    bias = _tensor("bias", bias)
    if not bias.is_floating_point():
        raise TypeError(f"bias must be a floating-point tensor, got {bias.dtype}")
    if tuple(bias.shape) != (n,):
        raise ValueError(f"bias must have shape ({n},) (out_features), got {tuple(bias.shape)}")
    return bias


def _aligned(t: torch.Tensor, align: int) -> torch.Tensor:
    """``t`` contiguous, copied when its data does not start on an ``align``-byte boundary."""
    t = t.contiguous()
    return t if t.data_ptr() % align == 0 else t.clone()


def _huge_page_backed(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` (contiguous) in its own anonymous mapping, 2 MiB aligned, advised as transparent huge
    pages (Linux); ``_aligned(t, 64)`` where that is not available or ``t`` is smaller.

    Decode streams each packed weight from memory once a token; with 4 KiB pages the hardware prefetchers
    stop at every page boundary. Measured on issue 17's model (the 113 int4 GEMVs of a token, 2 Zen 4 cores,
    alternating runs): groups of 128 13.9-14.9 -> 13.4-14.4 ms, groups of 32 15.8-16.1 -> 15.1-16.3 ms. A
    partial last huge page is a huge page too when its padding adds at most ``1 / _HUGE_PAGE_PAD_RATIO`` of
    the tensor's bytes (that padding is then memory in use): left in small pages, the tails of that model's
    MLP weights (1.8 of 5.8 MiB) cost 4-5 % of a token's GEMV time (g128 13.47 -> 12.91 ms, g32 15.64 ->
    15.09, medians of 15 alternating runs); other tails stay in small pages. The tensor's storage is
    exactly its bytes either way (``torch.save`` writes nothing more).
    """
    t = t.contiguous()
    nbytes = t.numel() * t.element_size()
    if nbytes < _HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return _aligned(t, _WEIGHT_ALIGN)
    if t.data_ptr() % _HUGE_PAGE == 0:  # already placed (a weight rebuilt from its own codes)
        return t
    whole = -(-nbytes // _HUGE_PAGE) * _HUGE_PAGE
    huge = whole if (whole - nbytes) * _HUGE_PAGE_PAD_RATIO <= nbytes else nbytes // _HUGE_PAGE * _HUGE_PAGE
    try:
        buf = mmap.mmap(-1, whole + _HUGE_PAGE, flags=mmap.MAP_PRIVATE)  # private: shared memory gets no THP
        base = torch.frombuffer(buf, dtype=torch.uint8, count=1).data_ptr()
        offset = -base % _HUGE_PAGE
        buf.madvise(mmap.MADV_HUGEPAGE, offset, huge)
    except (OSError, ValueError):  # no such mapping or advice here: the plain copy
        return _aligned(t, _WEIGHT_ALIGN)
    out = torch.frombuffer(buf, dtype=t.dtype, count=t.numel(), offset=offset).view(t.shape)
    return out.copy_(t)


def _to_bf16_2d(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x`` as a contiguous, 32-byte-aligned bfloat16 matrix ``[M, K]`` (a copy unless it already is one)."""
    x2 = x.reshape(-1, k)
    if x2.dtype == torch.bfloat16:
        return _aligned(x2, _BF16_ALIGN)
    return x2.to(dtype=torch.bfloat16, memory_format=torch.contiguous_format)


def _from_bf16(y: torch.Tensor, dtype: torch.dtype, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's bfloat16 output in ``dtype``, plus ``bias``; bfloat16 ``±65536`` becomes float16's ``±65504``."""
    if dtype == torch.bfloat16:
        return y if bias is None else y.add_(bias)
    y = y.to(torch.float32)
    if dtype == torch.float16:
        y = torch.where(y.abs() == _BF16_ROUNDED_FP16_MAX, y.clamp(-_FP16_MAX, _FP16_MAX), y)
    if bias is not None:
        y.add_(bias)
    return y.to(dtype)


def _bias32(bias: torch.Tensor | None) -> torch.Tensor | None:
    """The bias as the kernels take it: contiguous float32."""
    return None if bias is None else bias.to(dtype=torch.float32, memory_format=torch.contiguous_format)


def _rows(x: torch.Tensor, k: int) -> torch.Tensor:
    """``x`` as a contiguous ``[M, K]`` matrix (a copy only if it is not one)."""
    return x.reshape(-1, k).contiguous()


# --------------------------------------------------------------------------- int8 weight-only
def prepare_int8_weight_only(weight_int8: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Once per weight: ``(weight_int8, scale)`` in the form :func:`int8_weight_only_linear` takes.

    The weight becomes contiguous and 64-byte aligned (a copy only if it is
    not), the per-row scale ``s`` (symmetric, zero point 0; the weight is
    ``W = weight_int8 * s[:, None]``) becomes a contiguous bfloat16 ``[N]``
    tensor (the stored precision, as torchao's CPU layout).

    Raises ``ValueError`` if ``K`` is 0 or a scale is not finite in bfloat16.

    >>> w = torch.tensor([[1, -2] * 8, [3, 0] * 8], dtype=torch.int8)
    >>> qw, s = prepare_int8_weight_only(w, torch.tensor([0.5, 0.25]))
    >>> qw.shape, s
    (torch.Size([2, 16]), tensor([0.5000, 0.2500], dtype=torch.bfloat16))
    """
    w = _int_tensor("weight_int8", weight_int8, (torch.int8,), 2)
    n, k = w.shape
    if k == 0:
        raise ValueError("weight_int8 has in_features K = 0; a linear layer needs K >= 1")
    s = _float_vector("scale", scale, n).to(torch.bfloat16).contiguous()
    _check_finite("scale", s, "in bfloat16 (the kernel's scale dtype)")
    return _aligned(w, _WEIGHT_ALIGN), s


def int8_weight_only_linear(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor,
                            bias: torch.Tensor | None = None) -> torch.Tensor:
    """``y = (x @ weight_int8.T) * scale + bias`` in ``x``'s dtype.

    Args:
        x: ``[..., K]`` float32, float16 or bfloat16, any strides, any number of rows (0 included).
        weight_int8: int8 ``[N, K]``, contiguous, as :func:`prepare_int8_weight_only`
            returns it (checked, never copied here).
        scale: ``[N]`` floats; the bfloat16 scale from :func:`prepare_int8_weight_only`
            is used as is, any other float dtype is rounded to bfloat16 on each call
            (``N`` elements).
        bias: optional ``[N]``.

    Precision: see the module docstring (float32 accumulation of the exact
    products, one rounding to ``x``'s dtype).

    >>> qw, s = prepare_int8_weight_only(torch.tensor([[1, -2] * 8, [3, 0] * 8], dtype=torch.int8),
    ...                                  torch.tensor([0.5, 0.25]))
    >>> int8_weight_only_linear(torch.ones(1, 16), qw, s, torch.tensor([1.0, 0.0]))
    tensor([[-3.,  6.]])
    """
    w = _int_tensor("weight_int8", weight_int8, (torch.int8,), 2)
    n, k = w.shape
    if k == 0:
        raise ValueError("weight_int8 has in_features K = 0; a linear layer needs K >= 1")
    if not w.is_contiguous():
        raise ValueError("weight_int8 must be contiguous; pass it through prepare_int8_weight_only")
    s = _tensor("scale", scale)
    if not s.is_floating_point():
        raise TypeError(f"scale must be a floating-point tensor, got {s.dtype}")
    if tuple(s.shape) != (n,):
        raise ValueError(f"scale must have shape ({n},), one entry per output row; got {tuple(s.shape)}")
    s = s.to(dtype=torch.bfloat16, memory_format=torch.contiguous_format)
    x = _check_x(x, k)
    bias = _check_bias(bias, n)
    lib = _native.ops()
    if lib is not None:
        y = lib.int8_weight_only_linear(_rows(x, k), w, s, _bias32(bias))
    elif k % _INT8_PACK_K_MULTIPLE == 0:  # fallback: torch's kernel (bfloat16 activations and output)
        y = _from_bf16(torch._weight_int8pack_mm(_to_bf16_2d(x, k), _aligned(w, 16), s), x.dtype, bias)
    else:
        y = _ref.int8_weight_only_reference(_rows(x, k), w, s, bias)
    return y.reshape(*x.shape[:-1], n)


def int8_weight_only_linear_prepared(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor,
                                     bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`int8_weight_only_linear` without its Python argument checks: the decode hot path.

    For callers that hold a weight and bfloat16 scale made by
    :func:`prepare_int8_weight_only` (a quantized tensor's ``linear``) and a float
    CPU ``x`` with ``K`` features. The native kernel still checks shapes and
    dtypes (a ``RuntimeError`` if they are wrong). Same results as the checked call.
    """
    lib = _native.ops()
    if lib is None:
        return int8_weight_only_linear(x, weight_int8, scale, bias)
    n, k = weight_int8.shape
    y = lib.int8_weight_only_linear(x.reshape(-1, k).contiguous(), weight_int8, scale, _bias32(bias))
    return y.reshape(*x.shape[:-1], n)


# --------------------------------------------------------------------------- int4 weight-only
def check_int4_cpu_shape(n: int, k: int, group_size: int) -> None:
    """Raise ``ValueError`` unless a weight ``[n, k]`` in groups of ``group_size`` fits the int4 CPU kernel.

    The kernel takes any ``n, k >= 1`` and ``group_size`` in {32, 64, 128, 256}
    (the last group of a row may be partial).

    >>> check_int4_cpu_shape(4096, 4096, 128)
    >>> check_int4_cpu_shape(24, 64, 48)
    Traceback (most recent call last):
    ...
    ValueError: group_size must be one of (32, 64, 128, 256), got 48
    """
    for name, v in (("n", n), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {v!r}")
    _check_int4_shape(n, k, group_size, "weight")


def int4_cpu_packed_shape(n: int, k: int) -> tuple[int, int]:
    """Shape of :func:`pack_int4_cpu`'s ``packed_weight`` for a ``[n, k]`` weight: ``(ceil(n / 16), 8 * Kp)`` bytes.

    One row per tile of 16 weight rows, ``Kp = 64 * ceil(k / 64)`` (k padded to whole 64-k blocks).

    >>> int4_cpu_packed_shape(4096, 4096), int4_cpu_packed_shape(7, 65)
    ((256, 32768), (1, 1024))
    """
    return (-(-n // _INT4_TILE_ROWS), -(-k // _INT4_BLOCK) * _INT4_BLOCK * _INT4_TILE_ROWS // 2)


def int4_cpu_scale_and_zero_shape(n: int, k: int, group_size: int) -> tuple[int, int, int, int]:
    """Shape of :func:`pack_int4_cpu`'s ``scale_and_zero``: ``(ceil(n / 16), ceil(k / group_size), 2, 16)``.

    >>> int4_cpu_scale_and_zero_shape(4096, 4096, 128)
    (256, 32, 2, 16)
    """
    return (-(-n // _INT4_TILE_ROWS), -(-k // group_size), 2, _INT4_TILE_ROWS)


def _check_int4_shape(n: int, k: int, group_size: object, name: str) -> int:
    if isinstance(group_size, bool) or not isinstance(group_size, int):
        raise TypeError(f"group_size must be an int, got {group_size!r}")
    if group_size not in _INT4_GROUP_SIZES:
        raise ValueError(f"group_size must be one of {_INT4_GROUP_SIZES}, got {group_size}")
    if n <= 0:
        raise ValueError(f"{name} has out_features N = {n}; the int4 kernel needs N >= 1")
    if k <= 0:
        raise ValueError(f"{name} has in_features K = {k}; the int4 kernel needs K >= 1")
    return group_size


def pack_int4_cpu(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack uint4 codes and per-group ``scale``/``zero`` for :func:`int4_cpu_linear` (torchao's ``Int4CPULayout``).

    The weight is ``W[n, k] = (codes[n, k] - 8) * scale[n, g] + zero[n, g]``,
    ``g = k // group_size``: tinygemm's convention, the zero point in the float
    domain (torchao's ``ZeroPointDomain.FLOAT``).

    Args:
        codes: ``[N, K]`` uint8 or int32 holding 0..15.
        scale, zero: ``[N, ceil(K / group_size)]`` floats.
        group_size: 32, 64, 128 or 256.

    Returns:
        ``packed_weight``: uint8 ``[ceil(N / 16), 8 * Kp]``, ``Kp = 64 * ceil(K / 64)``:
        one row per tile of 16 weight rows, as ``Kp / 8`` lines of 64 bytes. Line ``l``
        holds ``k = 8 l .. 8 l + 7`` of the tile's 16 rows, row ``r`` in the 32-bit
        word at byte ``4 r``: bits ``4 j .. 4 j + 3`` the code of ``k = 8 l + 2 j`` and
        bits ``16 + 4 j ..`` that of ``8 l + 2 j + 1`` (j = 0..3), so that one vector
        load gives a code of each of 16 rows per lane (padding codes 8; see
        :func:`quanta.kernels.int_linear_reference.unpack_int4_codes`). The same on every
        machine. ``scale_and_zero``: bfloat16 ``[ceil(N / 16), ceil(K / group_size), 2, 16]``,
        ``[t, g, 0, r] = scale[16 t + r, g]`` and ``[t, g, 1, r] = zero[16 t + r, g]``, rounded
        to bfloat16 (padding rows 0).

    >>> codes = torch.arange(16, dtype=torch.uint8).repeat(16, 2)
    >>> packed, sz = pack_int4_cpu(codes, torch.full((16, 1), 0.5), torch.zeros(16, 1), 32)
    >>> packed.shape, packed.dtype, sz.shape
    (torch.Size([1, 512]), torch.uint8, torch.Size([1, 1, 2, 16]))
    """
    c = _int_tensor("codes", codes, (torch.uint8, torch.int32), 2)
    n, k = c.shape
    group_size = _check_int4_shape(n, k, group_size, "codes")
    groups = -(-k // group_size)
    if c.numel() and (int(c.min()) < 0 or int(c.max()) > 15):
        raise ValueError(f"codes must hold uint4 values 0..15, got [{int(c.min())}, {int(c.max())}]")
    parts = []
    for name, t in (("scale", scale), ("zero", zero)):
        t = _tensor(name, t)
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
        if tuple(t.shape) != (n, groups):
            raise ValueError(
                f"{name} must have shape ({n}, {groups}) = (N, ceil(K / group_size)) for codes {tuple(c.shape)} and "
                f"group_size {group_size}, got {tuple(t.shape)}"
            )
        t = t.to(torch.bfloat16)
        _check_finite(name, t, "in bfloat16 (the kernel's dtype)")
        parts.append(t)
    tiles, tile_bytes = int4_cpu_packed_shape(n, k)
    scale_and_zero = torch.zeros((tiles * _INT4_TILE_ROWS, groups, 2), dtype=torch.bfloat16)
    scale_and_zero[:n] = torch.stack(parts, dim=-1)
    scale_and_zero = scale_and_zero.view(tiles, _INT4_TILE_ROWS, groups, 2).permute(0, 2, 3, 1).contiguous()
    kp = tile_bytes // 8
    padded = torch.full((tiles * _INT4_TILE_ROWS, kp), 8, dtype=torch.uint8)
    padded[:n, :k] = c
    q = padded.view(tiles, _INT4_TILE_ROWS, kp // 8, 8).transpose(1, 2)  # [tile, line, row, k - 8 l]
    # the row's 32-bit word, byte by byte: (k0, k2), (k4, k6), (k1, k3), (k5, k7) as (low, high) nibbles
    words = torch.stack([q[..., 0] | (q[..., 2] << 4), q[..., 4] | (q[..., 6] << 4),
                         q[..., 1] | (q[..., 3] << 4), q[..., 5] | (q[..., 7] << 4)], dim=-1)
    return _huge_page_backed(words.reshape(tiles, tile_bytes)), _huge_page_backed(scale_and_zero)


def _check_int4_packed(packed_weight: object, scale_and_zero: object, group_size: object, n: int, k: int
                       ) -> tuple[torch.Tensor, torch.Tensor, int]:
    p = _int_tensor("packed_weight", packed_weight, (torch.uint8,), 2)
    group_size = _check_int4_shape(n, k, group_size, "packed_weight")
    want_p = int4_cpu_packed_shape(n, k)
    if tuple(p.shape) != want_p:
        raise ValueError(f"packed_weight must have shape {want_p} for N = {n}, K = {k}, got {tuple(p.shape)}")
    if not p.is_contiguous():
        raise ValueError("packed_weight must be contiguous (as pack_int4_cpu returns it)")
    sz = _tensor("scale_and_zero", scale_and_zero)
    want = int4_cpu_scale_and_zero_shape(n, k, group_size)
    if sz.dtype != torch.bfloat16 or tuple(sz.shape) != want or not sz.is_contiguous():
        raise ValueError(
            f"scale_and_zero must be the contiguous bfloat16 {want} tensor from pack_int4_cpu, got "
            f"{sz.dtype} {tuple(sz.shape)}"
        )
    # the last tile's rows from n on must be padding (scale and zero 0): a weight of more rows than n would
    # otherwise pass the shape checks and lose its last rows
    if n % _INT4_TILE_ROWS and bool(sz[-1, :, :, n % _INT4_TILE_ROWS:].any()):
        raise ValueError(f"the packed weight has more than N = {n} rows (its last tile holds rows past {n}); "
                         "out_features (N) must be the packed weight's own")
    return p, sz, group_size


def int4_cpu_linear(x: torch.Tensor, packed_weight: torch.Tensor, scale_and_zero: torch.Tensor, group_size: int,
                    out_features: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``y = x @ W.T + bias``, ``W[n, k] = fma(code - 8, scale[n, k // group_size], zero[n, k // group_size])``.

    ``packed_weight`` and ``scale_and_zero`` come from :func:`pack_int4_cpu`
    (``out_features`` = ``N``; ``K`` is ``x``'s last dimension). ``x`` is ``[..., K]``
    float32/float16/bfloat16. Precision: see the module docstring.

    >>> codes = torch.full((16, 32), 10, dtype=torch.uint8)
    >>> packed, sz = pack_int4_cpu(codes, torch.full((16, 1), 0.5), torch.full((16, 1), 0.25), 32)
    >>> int4_cpu_linear(torch.ones(2, 32), packed, sz, 32, 16)[0, :3]
    tensor([40., 40., 40.])
    """
    if isinstance(out_features, bool) or not isinstance(out_features, int):
        raise TypeError(f"out_features must be an int, got {out_features!r}")
    p = _int_tensor("packed_weight", packed_weight, (torch.uint8,), 2)
    if out_features <= 0 or -(-out_features // _INT4_TILE_ROWS) != p.shape[0]:
        raise ValueError(f"out_features ({out_features}) must be in ({_INT4_TILE_ROWS * (p.shape[0] - 1)}, "
                         f"{_INT4_TILE_ROWS * p.shape[0]}] for packed_weight's {p.shape[0]} tiles of 16 rows")
    x = _tensor("x", x)
    if x.dim() == 0:
        raise ValueError("x must have shape [..., K], got a 0-d tensor")
    k = x.shape[-1]
    if int4_cpu_packed_shape(out_features, k)[1] != p.shape[1]:
        raise ValueError(f"x must have shape [..., K] with 512 * ceil(K / 64) = {p.shape[1]} (packed_weight's "
                         f"bytes a tile), got {tuple(x.shape)}")
    p, sz, group_size = _check_int4_packed(p, scale_and_zero, group_size, out_features, k)
    x = _check_x(x, k)
    bias = _check_bias(bias, out_features)
    lib = _native.ops()
    if lib is not None:
        y = lib.int4_weight_only_linear(_rows(x, k), p, sz, group_size, k, out_features, _bias32(bias))
    else:
        y = _ref.int4_weight_only_reference(_rows(x, k), p, sz, group_size, out_features, k, bias)
    return y.reshape(*x.shape[:-1], out_features)


def int4_cpu_linear_prepared(x: torch.Tensor, packed_weight: torch.Tensor, scale_and_zero: torch.Tensor,
                             group_size: int, out_features: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """:func:`int4_cpu_linear` without its Python argument checks, for weights packed by :func:`pack_int4_cpu`.

    The native kernel still checks shapes and dtypes (a ``RuntimeError`` if they are wrong).
    """
    lib = _native.ops()
    if lib is None:
        return int4_cpu_linear(x, packed_weight, scale_and_zero, group_size, out_features, bias)
    k = x.shape[-1]
    y = lib.int4_weight_only_linear(x.reshape(-1, k).contiguous(), packed_weight, scale_and_zero, group_size, k,
                                    out_features, _bias32(bias))
    return y.reshape(*x.shape[:-1], out_features)


def unpack_int4_cpu(packed_weight: torch.Tensor, scale_and_zero: torch.Tensor, group_size: int, N: int, K: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Bit-exact inverse of :func:`pack_int4_cpu`: ``(codes uint8 [N, K], scale, zero)``.

    ``scale`` and ``zero`` are bfloat16 ``[N, ceil(K / group_size)]`` (the stored precision).

    >>> codes = torch.randint(0, 16, (48, 100), dtype=torch.uint8)
    >>> packed, sz = pack_int4_cpu(codes, torch.ones(48, 4), torch.zeros(48, 4), 32)
    >>> torch.equal(unpack_int4_cpu(packed, sz, 32, 48, 100)[0], codes)
    True
    """
    for name, v in (("N", N), ("K", K)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, got {v!r}")
    p, sz, _ = _check_int4_packed(packed_weight, scale_and_zero, group_size, N, K)
    scale, zero = _ref.unpack_int4_scale_zero(sz, N)
    return _ref.unpack_int4_codes(p, N, K), scale.contiguous(), zero.contiguous()


# --------------------------------------------------------------------------- int8 dynamic activations
def quantize_per_token_int8(x: torch.Tensor, *, symmetric: bool = True
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """torchao's per-token int8 activation quantization of a ``[M, K]`` matrix: ``(q, scale, zero_point)``.

    Symmetric (``_int8_symm_per_token_reduced_range_quant``): ``s = max(amax|x_m| / 127, 1e-5)``
    in ``x``'s dtype (float32 when ``x`` is float16), ``q = clamp(round(x * (1/s)), -127, 127)``,
    ``zero_point`` None. Asymmetric (``_int8_asymm_per_token_quant``):
    ``s = max((max⁺ - min⁻) / 255, eps_fp32)`` as float32, ``z = clamp(-128 - round(min⁻ / s), -128, 127)``
    as int8, ``q = clamp(round(x * (1/s)) + z, -128, 127)``. ``scale`` and ``zero_point``
    have shape ``[M]``. A non-finite row raises ``ValueError`` (its codes would be NaN). Symmetric float32 and
    bfloat16 input (an int8 KV cache's tokens; a decode step's activations: bfloat16 below 32 rows) runs in the
    native kernels when they are built, a pass per row with the same formulas and roundings, so the same bits
    (tested); the rest runs as torch ops.

    >>> q, s, z = quantize_per_token_int8(torch.tensor([[0.5, -1.27], [2.54, 0.0]]))
    >>> q, s, z
    (tensor([[  50, -127],
            [ 127,    0]], dtype=torch.int8), tensor([0.0100, 0.0200]), None)
    """
    x = _tensor("x", x)
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"x must be a [M, K] matrix with K > 0, got shape {tuple(x.shape)}")
    if not isinstance(symmetric, bool):
        raise TypeError(f"symmetric must be a bool, got {symmetric!r}")
    # bfloat16 from 32 rows on: the torch ops were as fast (measured: 1 row 19 vs 95 us, 16 rows 186 vs 295 us,
    # 64 rows 453 vs 449 us at K = 2048); float32 rows were faster natively at every size measured (to 512 x 2048)
    native_rows = x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and x.shape[0] < 32)
    if symmetric and native_rows and x.device.type == "cpu" and not x.requires_grad \
            and not torch.compiler.is_compiling():
        lib = _native.ops()
        if lib is not None:
            q, scale, nonfinite_rows = lib.quantize_per_token_int8(x.contiguous())
            if not nonfinite_rows:
                return q, scale, None
            # a non-finite row: the path below raises its error
    m = x.shape[0]
    layout = full_block_layout(tuple(x.shape), (1, x.shape[1]))
    mn, mx = _zp.include_zero(*block_min_max(x, layout))
    if symmetric:
        qmin, qmax = _SYM_QMIN, _SYM_QMAX
        scale, _ = _zp.symmetric_qparams(mn, mx, qmin, qmax, _SYM_EPS)
        if x.dtype == torch.float16:
            scale = scale.to(torch.float32)
        zero_point = None
    else:
        qmin, qmax = _ASYM_QMIN, _ASYM_QMAX
        scale, zp = _zp.asymmetric_qparams(mn, mx, qmin, qmax, _ASYM_EPS)
        scale, zero_point = scale.to(torch.float32), zp.to(torch.int8)
    # traced (torch.compile): no NaN check; a NaN row's scale is NaN, so its outputs are NaN (eager raises)
    q = _zp.to_codes(_zp.quantize(x, layout, scale, zero_point, qmin, qmax), torch.int8, qmin, qmax,
                     check_nan=not torch.compiler.is_compiling())
    return q, scale.reshape(m), None if zero_point is None else zero_point.reshape(m)


def int8_weight_col_sums(weight_int8: torch.Tensor) -> torch.Tensor:
    """``sum_k weight_int8[n, k]`` as int32 ``[N]``: the column sums of ``weight_int8.T`` (exact).

    >>> int8_weight_col_sums(torch.tensor([[1, 2, 3], [-4, 5, 6]], dtype=torch.int8))
    tensor([6, 7], dtype=torch.int32)
    """
    w = _int_tensor("weight_int8", weight_int8, (torch.int8,), 2)
    return w.sum(dim=1, dtype=torch.int32)


def prepare_int8_dynamic(weight_int8: torch.Tensor, weight_scale: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Once per weight: ``(weight_t, weight_scale, weight_col_sums)`` for :func:`int8_dynamic_activation_linear`.

    ``weight_t`` is ``weight_int8.T``, a ``[K, N]`` view of the contiguous
    ``[N, K]`` codes (column-major, the operand layout ``torch._int_mm`` runs
    about twice as fast with on CPU as a contiguous ``[K, N]`` copy);
    ``weight_scale`` becomes float32 ``[N]``; ``weight_col_sums[n] = sum_k weight_int8[n, k]``
    (int32), for asymmetric activations.

    >>> wt, s, cs = prepare_int8_dynamic(torch.tensor([[1, 2, 3], [-4, 5, 6]], dtype=torch.int8),
    ...                                  torch.tensor([0.5, 0.25]))
    >>> wt.shape, s, cs
    (torch.Size([3, 2]), tensor([0.5000, 0.2500]), tensor([6, 7], dtype=torch.int32))
    """
    w = _int_tensor("weight_int8", weight_int8, (torch.int8,), 2)
    n, k = w.shape
    if k == 0 or k > _INT_MM_MAX_K:
        raise ValueError(f"weight_int8 has K = {k} in_features; int32 accumulation needs 0 < K <= {_INT_MM_MAX_K}")
    s = _float_vector("weight_scale", weight_scale, n).to(torch.float32).contiguous()
    _check_finite("weight_scale", s, "in float32")
    w = w.contiguous()
    return w.t(), s, int8_weight_col_sums(w)


def int8_dynamic_activation_linear(x: torch.Tensor, weight_t: torch.Tensor, weight_scale: torch.Tensor,
                                   weight_col_sums: torch.Tensor | None, bias: torch.Tensor | None = None, *,
                                   act_symmetric: bool = True) -> torch.Tensor:
    """``y[m, n] = s_x[m] * s_w[n] * (q_x[m] @ q_w[n] - z_x[m] * col_sums[n]) + bias[n]`` in ``x``'s dtype.

    Each row of ``x`` (``[..., K]``, float32/float16/bfloat16) is quantized to
    int8 per token as torchao does (:func:`quantize_per_token_int8`;
    ``act_symmetric=False`` gives the asymmetric variant with a zero point
    ``z_x``). The integer part is exact: the native kernel accumulates in int32
    (VNNI ``vpdpbusd`` on AVX-512) and the zero-point correction uses the column
    sums (computed once per weight and cached when none are passed). The
    scaling runs in float32 (the int32 accumulator rounded to float32, times
    ``s_x``, times ``s_w``, plus the bias) and is rounded to ``x``'s dtype once,
    so float16 overflows only where the true result does.

    Args:
        weight_t: int8 ``[K, N]``, the transposed view ``weight_int8.t()`` of the
            ``[N, K]`` codes that :func:`prepare_int8_dynamic` returns. A row-major
            ``[K, N]`` tensor is refused (it is ``_int_mm``'s slow layout, and
            usually a ``[N, K]`` weight passed untransposed).
        weight_scale: ``[N]`` floats, used in float32 (cast on each call unless float32).
        weight_col_sums: int32 ``[N]`` (:func:`int8_weight_col_sums`); may be None
            for symmetric activations (then computed once per weight and cached).

    >>> wt, s, cs = prepare_int8_dynamic(torch.tensor([[1, 2], [-4, 5]], dtype=torch.int8), torch.tensor([0.5, 0.25]))
    >>> int8_dynamic_activation_linear(torch.tensor([[1.27, 0.0]]), wt, s, cs)
    tensor([[ 0.6350, -1.2700]])
    """
    wt = _int_tensor("weight_t", weight_t, (torch.int8,), 2)
    k, n = wt.shape
    if k == 0 or k > _INT_MM_MAX_K:
        raise ValueError(f"weight_t has K = {k} rows (in_features); int32 accumulation needs 0 < K <= {_INT_MM_MAX_K}")
    if not wt.t().is_contiguous():
        raise ValueError(
            f"weight_t {tuple(wt.shape)} with strides {wt.stride()} is not the transposed view of a contiguous "
            "[N, K] weight; pass weight_int8.t() (as prepare_int8_dynamic returns it), not the [N, K] weight itself"
        )
    s_w = _tensor("weight_scale", weight_scale)
    if not s_w.is_floating_point():
        raise TypeError(f"weight_scale must be a floating-point tensor, got {s_w.dtype}")
    if tuple(s_w.shape) != (n,):
        raise ValueError(f"weight_scale must have shape ({n},), one entry per output; got {tuple(s_w.shape)}")
    s_w = s_w.to(torch.float32)
    if not isinstance(act_symmetric, bool):
        raise TypeError(f"act_symmetric must be a bool, got {act_symmetric!r}")
    if weight_col_sums is not None:
        cs = _int_tensor("weight_col_sums", weight_col_sums, (torch.int32,), 1)
        if cs.shape[0] != n:
            raise ValueError(f"weight_col_sums must have shape ({n},), got {tuple(cs.shape)}")
    elif not act_symmetric:
        raise ValueError("weight_col_sums is required for asymmetric activations (act_symmetric=False); "
                         "take it from prepare_int8_dynamic")
    x = _check_x(x, k)
    bias = _check_bias(bias, n)
    w = wt.t()  # the contiguous [N, K] codes
    if _native.ops() is not None:
        cs = weight_col_sums if weight_col_sums is not None else _col_sums(w)
        return int8_dynamic_activation_linear_prepared(x, w, s_w.contiguous(), cs.contiguous(), bias,
                                                       act_symmetric=act_symmetric)
    out_shape = (*x.shape[:-1], n)
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 0:
        return x.new_empty(out_shape)
    q, s_x, z_x = quantize_per_token_int8(x2, symmetric=act_symmetric)
    return _ref.int8_dynamic_reference(q, z_x, s_x, w, s_w, weight_col_sums, bias, x.dtype).reshape(out_shape)


def int8_dynamic_activation_linear_prepared(x: torch.Tensor, weight_int8: torch.Tensor, weight_scale: torch.Tensor,
                                            weight_col_sums: torch.Tensor, bias: torch.Tensor | None = None, *,
                                            act_symmetric: bool = True) -> torch.Tensor:
    """:func:`int8_dynamic_activation_linear` without its Python argument checks: the decode hot path, and the
    form ``torch.compile`` traces (the per-token quantization as plain torch ops, then one native op).

    For callers that hold the contiguous int8 ``[N, K]`` codes, a float32 ``[N]`` scale and the int32 column sums
    (a quantized tensor's ``linear``) and a float CPU ``x`` with ``K`` features. Same results as the checked call.
    """
    lib = _native.ops()
    if lib is None:
        return int8_dynamic_activation_linear(x, weight_int8.t(), weight_scale, weight_col_sums, bias,
                                              act_symmetric=act_symmetric)
    n, k = weight_int8.shape
    x2 = x.reshape(-1, k)
    if x2.shape[0] == 0:
        return x.new_empty((*x.shape[:-1], n))
    q, s_x, z_x = quantize_per_token_int8(x2, symmetric=act_symmetric)
    y = lib.int8_dynamic_linear(q, z_x, s_x.to(torch.float32).contiguous(), weight_int8, weight_scale,
                                weight_col_sums, _bias32(bias), x.dtype)
    return y.reshape(*x.shape[:-1], n)


# column sums computed for symmetric callers that pass none (the native kernel needs them), per weight tensor:
# id of the weight's storage owner -> (weakref, version, data_ptr, sums); dropped with the weight
_COL_SUMS: dict[int, tuple] = {}


def _col_sums(w: torch.Tensor) -> torch.Tensor:
    owner = w._base if w._base is not None else w
    key = (owner._version, w.data_ptr(), tuple(w.shape))
    hit = _COL_SUMS.get(id(owner))
    if hit is None or hit[0]() is not owner or hit[1] != key:
        if hit is None:
            weakref.finalize(owner, _COL_SUMS.pop, id(owner), None)
        hit = (weakref.ref(owner), key, int8_weight_col_sums(w))
        _COL_SUMS[id(owner)] = hit
    return hit[2]
