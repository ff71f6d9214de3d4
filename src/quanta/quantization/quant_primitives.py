"""torchao's quantization primitives over quanta's kernels.

Change ``from torchao.quantization.quant_primitives import X`` to
``from quanta.quantization.quant_primitives import X``: names, signatures,
defaults and results follow torchao 0.15 (bit for bit, checked against golden
vectors recorded from it) except where torchao is faulty, listed below.

``block_size`` is torchao's full block shape: one entry per input dimension,
the number of elements along it that share one scale (``(1, 32)`` on a
``(n, k)`` weight = groups of 32 along each row; ``x.shape`` = per tensor;
``-1`` = the whole dimension). The formulas (kernels in
:mod:`quanta.kernels.zero_point`)::

    mn = min(amin(block), 0),  mx = max(amax(block), 0)
    SYMMETRIC                  s = max(-mn, mx) / ((qmax - qmin) / 2),  zp = int((qmax + qmin + 1) / 2)
    SYMMETRIC_NO_CLIPPING_ERR  s = max(mn / (qmin - zp), mx / (qmax - zp)),  same zp
    ASYMMETRIC                 s = (mx - mn) / (qmax - qmin),  zp = clamp(qmin - round(mn / s), qmin, qmax)
    s = max(s, eps)                                       eps defaults to finfo(input.dtype).eps
    quantize_affine            q = clamp(round(x * (1/s)) + zp, qmin, qmax)   (multiply by 1/s, as torchao)
    dequantize_affine          x' = (q - zp) * s

>>> import torch
>>> from quanta.quantization.quant_primitives import MappingType, choose_qparams_affine, quantize_affine
>>> from quanta.quantization.quant_primitives import dequantize_affine
>>> w = torch.tensor([[-1.0, 0.5, 0.25, 1.0], [2.0, -0.5, 0.0, 1.5]])
>>> scale, zero_point = choose_qparams_affine(w, MappingType.ASYMMETRIC, (1, 4), torch.uint8)
>>> q = quantize_affine(w, (1, 4), scale, zero_point, torch.uint8)
>>> zero_point
tensor([127,  51], dtype=torch.int32)
>>> q
tensor([[  0, 191, 159, 254],
        [255,   0,  51, 204]], dtype=torch.uint8)
>>> dequantize_affine(q, (1, 4), scale, zero_point, torch.uint8)
tensor([[-0.9961,  0.5020,  0.2510,  0.9961],
        [ 2.0000, -0.5000,  0.0000,  1.5000]])

Where quanta deliberately differs from torchao 0.15 (each one a test):

* An all-ones ``block_size`` gives one scale per element (torchao reduces over
  every dimension, then fails to quantize).
* SYMMETRIC_NO_CLIPPING_ERR divides by ``qmin - zp`` and ``qmax - zp``: identical
  to torchao's ``mn / qmin``, ``mx / qmax`` for signed two's-complement ranges
  (``zp = 0``); on unsigned ranges torchao divides by ``qmin = 0`` and clips every
  positive value above ``mx / 2``, quanta does not clip. A range with no code on
  one side of ``zp`` (e.g. ``[-1, 0]``) raises ``ValueError``.
* float8: an all-zero block gets scale 1 and quantizes to zeros (torchao: scale
  0, then NaN); a zero scale passed in gives zero codes.
* fpx: NaN input raises ``ValueError`` (torchao returns a finite code).
* ``choose_qparams_*`` raise ``ValueError`` on NaN/inf input (torchao returns NaN
  or inf scales); ``quantize_affine`` raises where a code would be NaN (NaN input;
  torchao writes an arbitrary integer).
* Scales passed to ``quantize_affine``, ``dequantize_affine``, ``fake_quantize_affine*``
  and the fpx functions must be positive and finite, zero points finite, both on the
  input's device (``ValueError`` naming the argument; torchao computes garbage or
  NaN). float8 accepts a zero scale (zero codes, below).
* Where ``mx - mn`` overflows the input dtype the scale is ``mx/N - mn/N``, finite
  (torchao: ``inf``, and every code becomes ``qmin``).
* A zero point that does not fit ``zero_point_dtype`` raises (torchao wraps it:
  150 in int8 becomes -106).
* ``preserve_zero=False`` (ASYMMETRIC, INT) leaves the zero point unclamped, so
  ``mn`` maps to ``qmin`` (torchao clamps it into ``[qmin, qmax]`` and then clips
  blocks that do not straddle zero).
* ``zero_point=None`` means no zero point (torchao: ``TypeError``); int1–int7
  targets store their codes in int8 as uint1–uint7 do in uint8 (torchao:
  ``NotImplementedError``); codes never wrap at the dtype's edge.
* ``_fake_quantize_affine_cachemask``'s mask marks codes that were clamped
  (torchao tests the clamped code, so its mask is always all true).
* Bad arguments raise ``TypeError``/``ValueError`` naming the argument (torchao:
  ``AssertionError``), including ``quant_min >= quant_max`` (torchao accepts it).

torchao 0.15 removed ``preserve_zero`` and ``zero_point_domain`` from
``choose_qparams_affine``; quanta accepts them as keyword arguments (see there).
"""

# The implementation lives in the encodings layer (quanta.encodings.torchao) so that quanta.dtypes can use it
# without importing this package; this module is torchao's import path for it.
from quanta.encodings.torchao import (  # noqa: F401  (torchao's private names, which torchao users import too)
    _DTYPE_TO_QVALUE_BOUNDS,
    _SUB_BYTE_INT_BOUNDS,
    _SUB_BYTE_UINT_BOUNDS,
    MappingType,
    TorchAODType,
    ZeroPointDomain,
    _choose_qparams_affine_dont_preserve_zero,
    _choose_qparams_affine_floatx,
    _choose_qparams_affine_tinygemm,
    _choose_scale_float8,
    _dequantize_affine_float8,
    _dequantize_affine_floatx,
    _dequantize_affine_no_zero_point,
    _dequantize_affine_tinygemm,
    _f32_to_floatx_unpacked,
    _fake_quantize_affine,
    _fake_quantize_affine_cachemask,
    _floatx_unpacked_to_f32,
    _get_and_check_qmin_qmax,
    _quantize_affine_float8,
    _quantize_affine_floatx,
    _quantize_affine_no_zero_point,
    _quantize_affine_tinygemm,
    choose_qparams_affine,
    choose_qparams_affine_float8,
    choose_qparams_affine_fpx,
    choose_qparams_affine_with_min_max,
    dequantize_affine,
    dequantize_affine_float8,
    dequantize_affine_fpx,
    fake_quantize_affine,
    fake_quantize_affine_cachemask,
    float_to_fpx,
    fpx_to_float,
    quantize_affine,
    quantize_affine_float8,
    quantize_affine_fpx,
)

__all__ = [
    "MappingType",
    "ZeroPointDomain",
    "TorchAODType",
    "choose_qparams_affine",
    "choose_qparams_affine_with_min_max",
    "quantize_affine",
    "dequantize_affine",
    "fake_quantize_affine",
    "fake_quantize_affine_cachemask",
    "choose_qparams_affine_float8",
    "quantize_affine_float8",
    "dequantize_affine_float8",
    "choose_qparams_affine_fpx",
    "quantize_affine_fpx",
    "dequantize_affine_fpx",
    "float_to_fpx",
    "fpx_to_float",
]
