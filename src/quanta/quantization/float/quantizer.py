"""FloatQuantizeDequantize: fake-cast to a float format with a calibrated scale (AIMET style)."""

from __future__ import annotations

import contextlib
import warnings

import torch

from quanta.encodings.float import FloatEncoding
from quanta.grids.float import FloatFormat, FormatProperties
from quanta.kernels import float_cast as kernels
from quanta.kernels.blocks import check_block_size, resolve_layout
from quanta.quantization.base import QuantizerBase
from quanta.quantization.encoding_analyzer import (
    EncodingAnalyzer,
    MinMaxEncodingAnalyzer,
    StatisticsNotFoundError,
    _check_shape,
)
from quanta.tensors.quantized import DequantizedTensor, QuantizedTensor, QuantizedTensorBase

__all__ = ["FloatQuantizeDequantize", "QuantizeDequantize"]


class FloatQuantizeDequantize(FormatProperties, QuantizerBase):
    r"""Simulate a float format: ``out = cast(x / scale) * scale``, ``scale = maxval / format_max``.

    ``cast`` rounds to the nearest value of the format (ties to even, subnormals
    included), saturates at ``+-max`` (``+-inf`` too) and keeps NaN. For a
    format torch has as a dtype, inside the range the result is exactly
    ``(x / scale).to(dtype).to(x.dtype) * scale``.

    Args:
        exponent_bits, mantissa_bits: the format (1–8 and 0–23 bits), or
        dtype: a torch float8/16 dtype (mutually exclusive with the bits).
        finite: no inf (``fn`` formats; 8-bit ones keep one NaN code, narrower
            ones — MX fp6/fp4 — have none). Default False: torch's IEEE format
            where torch has the dtype (float16, bfloat16, float8_e5m2), else
            AIMET's grid for it (IEEE's largest value, one binade more at the
            bottom: :attr:`~quanta.grids.float.SpecialValues.AIMET`), bit for bit
            with aimet-torch 2.42.
        unsigned_zero: the ``fnuz`` convention (needs ``finite``). Default False.
        shape: shape of ``maxval`` (per tensor ``()``, per channel, per block).
        block_size: as for the affine quantizers.
        encoding_analyzer: statistics for :meth:`compute_encodings` (absmax of a
            :class:`MinMaxEncodingAnalyzer` by default; 16-bit formats keep scale 1).

    A quantizer is ready at construction with ``maxval = format max`` (scale 1),
    i.e. a pure cast, as in AIMET. ``maxval`` is a buffer; to learn it, replace it
    with a parameter: ``q.maxval = torch.nn.Parameter(q.maxval.clone())``.

    Unlike AIMET, the input gradient is a real straight-through estimator for
    every format: 1 where ``|x / scale| <= max``, 0 where saturated.

    Under ``torch.compile`` / ``torch.export`` the kernel is the custom op
    ``quanta::float_quantize_dequantize`` and the result a plain tensor with the
    same values; calibration runs eagerly only.

    >>> import quanta.quantization as Q
    >>> q = Q.float.FloatQuantizeDequantize(dtype=torch.float8_e4m3fn)
    >>> q
    FloatQuantizeDequantize(dtype=torch.float8_e4m3fn)
    >>> q(torch.tensor([1.0, 500.0, 0.1234, float("inf")])).tolist()
    [1.0, 448.0, 0.125, 448.0]
    >>> fp4 = Q.float.FloatQuantizeDequantize(exponent_bits=2, mantissa_bits=1, finite=True)
    >>> with fp4.compute_encodings():
    ...     _ = fp4(torch.tensor([-3.0, 0.4, 1.2]))
    >>> fp4.maxval, fp4.get_scale()
    (tensor(3.), tensor(0.5000))
    """

    def __init__(
        self,
        exponent_bits: int | None = None,
        mantissa_bits: int | None = None,
        finite: bool | None = None,
        unsigned_zero: bool | None = None,
        dtype: torch.dtype | None = None,
        shape: tuple[int, ...] | None = None,
        block_size: tuple[int, ...] | None = None,
        encoding_analyzer: EncodingAnalyzer | None = None,
    ) -> None:
        super().__init__()
        if dtype is not None:
            if any(v is not None for v in (exponent_bits, mantissa_bits, finite, unsigned_zero)):
                raise TypeError("dtype is mutually exclusive with exponent_bits/mantissa_bits/finite/unsigned_zero")
            self.format = FloatFormat.from_torch_dtype(dtype)
        else:
            if exponent_bits is None or mantissa_bits is None:
                raise TypeError("give dtype=..., or exponent_bits=... and mantissa_bits=...")
            for name, flag in (("finite", finite), ("unsigned_zero", unsigned_zero)):
                if flag is not None and not isinstance(flag, bool):
                    raise TypeError(f"{name} must be a bool, got {type(flag).__name__} {flag!r}")
            self.format = FloatFormat.from_aimet(exponent_bits, mantissa_bits, bool(finite), bool(unsigned_zero))
        self._dtype_given = dtype is not None
        self.shape = _check_shape(() if shape is None else shape)
        self.block_size = check_block_size(block_size)
        if self.block_size is not None and len(self.block_size) != len(self.shape):
            raise ValueError(f"block_size {self.block_size} must have one entry per dimension of shape {self.shape}")
        if encoding_analyzer is None and self.format.bits < 16:
            encoding_analyzer = MinMaxEncodingAnalyzer(self.shape, self.block_size)
        if encoding_analyzer is not None and not isinstance(encoding_analyzer, EncodingAnalyzer):
            raise TypeError(f"encoding_analyzer must be an EncodingAnalyzer, got {type(encoding_analyzer).__name__}")
        if encoding_analyzer is not None and encoding_analyzer.shape != self.shape:
            raise ValueError(f"encoding_analyzer has shape {encoding_analyzer.shape}, the quantizer {self.shape}")
        self.encoding_analyzer = encoding_analyzer
        self.register_buffer("maxval", torch.full(self.shape, self.format.max, dtype=torch.float32))
        self._set_initialized(True)
        self._dynamic_maxval: torch.Tensor | None = None

    def get_scale(self) -> torch.Tensor:
        """``maxval / format_max``."""
        maxval = self._dynamic_maxval if self._dynamic_maxval is not None else self.maxval
        return maxval / self.format.max

    def get_encodings(self) -> FloatEncoding:
        return FloatEncoding(self.get_scale(), self.format, self.block_size)

    @torch.no_grad()
    def _check_values(self, state: dict[str, torch.Tensor]) -> None:
        m = state["maxval"]
        if not (bool(torch.isfinite(m).all()) and bool((m > 0).all())):
            raise ValueError("maxval must be positive and finite")

    def set_range(self, maxval: torch.Tensor | float) -> None:
        """Set ``maxval`` (positive, finite; broadcast to ``shape``)."""
        m = torch.as_tensor(maxval, dtype=self.maxval.dtype, device=self.maxval.device)
        try:
            m = torch.broadcast_to(m, self.shape)
        except RuntimeError:
            raise ValueError(f"set_range: maxval of shape {tuple(m.shape)} does not broadcast to shape {self.shape}"
                             ) from None
        if not (torch.isfinite(m).all() and (m > 0).all()):
            raise ValueError("maxval must be positive and finite")
        self.maxval.copy_(m)
        self._set_initialized(True)

    def _reset_statistics(self) -> None:
        if self.encoding_analyzer is not None:
            self.encoding_analyzer.reset_stats()

    def _absmax(self, rng: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        lo, hi = rng
        return torch.maximum(lo.abs(), hi.abs()).to(self.maxval.device)

    def _num_steps(self) -> int:
        return 2**self.format.bits - 1

    def _finish_calibration(self) -> None:
        if self.encoding_analyzer is None:
            return  # 16-bit formats keep scale 1
        try:
            rng = self.encoding_analyzer.compute_encodings(self._num_steps(), is_symmetric=False)
        except StatisticsNotFoundError:
            warnings.warn(f"{type(self).__name__}.compute_encodings(): no input was seen, the encoding is unchanged",
                          RuntimeWarning, stacklevel=4)
            return
        with torch.no_grad():
            self.maxval.copy_(self._absmax(rng))

    @contextlib.contextmanager
    def _batch_maxval(self, x: torch.Tensor):
        if self.encoding_analyzer is None:
            yield
            return
        batch = self.encoding_analyzer.update_stats(x)
        rng = None if batch is None else \
            self.encoding_analyzer.compute_encodings_from_stats(batch, self._num_steps(), is_symmetric=False)
        self._dynamic_maxval = None if rng is None else self._absmax(rng)
        try:
            yield
        finally:
            self._dynamic_maxval = None

    def forward(self, input: torch.Tensor) -> DequantizedTensor:
        if not isinstance(input, torch.Tensor):
            raise TypeError(f"input must be a tensor, got {type(input).__name__}")
        x = input.dequantize() if isinstance(input, QuantizedTensor) else input
        if isinstance(x, QuantizedTensorBase):
            x = x.as_subclass(torch.Tensor)
        if not x.is_floating_point():
            raise TypeError(f"input must be a floating-point tensor, got dtype {x.dtype}")
        if x.device != self.maxval.device:
            raise ValueError(f"input is on {x.device} but the quantizer's maxval is on {self.maxval.device}; "
                             "move them to one device (quantizer.to(device))")
        if torch.compiler.is_compiling():  # no layout check (it would specialise symbolic shapes); plain tensor
            if self._calibrating:
                if torch.compiler.is_exporting():
                    raise RuntimeError(f"{type(self).__name__}: compute_encodings() cannot run under torch.export; "
                                       "calibrate the model eagerly, then export it")
                return _eager_forward(self, x)
            return kernels.quantize_dequantize(x, self.get_scale(), self.format, self.block_size)
        resolve_layout(x.shape, self.shape, self.block_size)
        if self._calibrating:
            with self._batch_maxval(x):
                return self._fake_cast(x)
        return self._fake_cast(x)

    def _fake_cast(self, x: torch.Tensor) -> DequantizedTensor:
        enc = self.get_encodings()
        out = kernels.quantize_dequantize(x, enc.scale, self.format, self.block_size)
        return DequantizedTensor._wrap(out, enc)

    def extra_repr(self) -> str:
        if self._dtype_given:
            head = f"dtype={self.format.torch_dtype}"
        else:
            f = self.format
            finite = f.special.value in ("fn", "finite", "fnuz")
            head = (f"exponent_bits={f.exponent_bits}, mantissa_bits={f.mantissa_bits}, finite={finite}, "
                    f"unsigned_zero={f.special.value == 'fnuz'}")
        if self.shape != ():
            head += f", shape={self.shape}"
        if self.block_size is not None:
            head += f", block_size={self.block_size}"
        return head


@torch.compiler.disable
def _eager_forward(quantizer: FloatQuantizeDequantize, x: torch.Tensor) -> DequantizedTensor:
    """``quantizer.forward(x)`` run eagerly from inside a compiled region (calibration)."""
    return quantizer.forward(x)


#: AIMET's alias (``Q.float.QuantizeDequantize``).
QuantizeDequantize = FloatQuantizeDequantize
