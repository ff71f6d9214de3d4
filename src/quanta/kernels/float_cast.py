"""Float fake-cast: round to the nearest value of a :class:`~quanta.grids.float.FloatFormat`; the entry points.

    cast(v)   = the nearest value of the format (ties to even, saturating at +-max)
    QDQ(x)    = cast(x / s) * s                       (s = maxval / format max)

The kernels are :mod:`quanta.kernels.float_cast_impl` (rounding, precision, special values and gradients
are described there). Under ``torch.compile`` and ``torch.export`` (``torch.compiler.is_compiling()``)
:func:`quantize_dequantize` calls the same kernel as the custom op of :mod:`quanta.kernels.ops`, which the
tracers can see.
"""

from __future__ import annotations

import torch

from quanta.grids.float import FloatFormat
from quanta.kernels import float_cast_impl as _impl
from quanta.kernels import ops as _ops
from quanta.kernels.float_cast_impl import backward_raw, dequantize, fake_cast, forward_raw, quantize

__all__ = ["fake_cast", "quantize_dequantize", "quantize", "dequantize", "forward_raw", "backward_raw"]


def quantize_dequantize(x: torch.Tensor, scale: torch.Tensor, fmt: FloatFormat,
                        block_size: tuple[int, ...] | None = None) -> torch.Tensor:
    """Float fake quantization ``cast(x / s) * s`` in ``x.dtype`` (scale layout as the affine kernels).

    >>> from quanta.grids.float import FP4_E2M1
    >>> quantize_dequantize(torch.tensor([0.1, 0.26, 1.0]), torch.tensor(1 / 6), FP4_E2M1)
    tensor([0.0833, 0.2500, 1.0000])
    """
    if torch.compiler.is_compiling():  # one custom op (quanta.kernels.ops): the same kernel, traceable
        return _ops.float_quantize_dequantize(x, scale, fmt, block_size)
    return _impl.quantize_dequantize(x, scale, fmt, block_size)
