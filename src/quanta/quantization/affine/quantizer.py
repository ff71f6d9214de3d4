"""Affine quantizer modules: :class:`Quantize` and :class:`QuantizeDequantize`.

They keep a learnable range (``min``, ``max`` parameters of shape ``shape``) and
derive scale and offset from it on every call (:mod:`quanta.kernels.qparams`),
so gradients from a QAT loss move the range.

Under ``torch.compile`` and ``torch.export`` (``torch.compiler.is_compiling()``)
``forward`` takes a path with no data-dependent Python: scale and offset come
from the range by the same formulas as ever, the kernel is one custom op of
:mod:`quanta.kernels.ops`, and the result is a plain tensor with the values
the eager quantizer returns (a tensor subclass carrying an encoding object
cannot be traced). Whether the quantizer is initialised is read there from a
Python copy of the ``_initialized`` buffer, kept by ``set_range``,
``set_encodings``, calibration and ``load_state_dict`` (not by writing into the
buffer directly). Calibration (``compute_encodings()``) runs eagerly only.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from typing import Any

import torch
from torch import nn
from torch.nn.modules import module as _nn_module  # its dicts of global forward (pre-)hooks

from quanta._snapshot import Snapshot
from quanta.encodings.affine import AffineEncoding
from quanta.grids.affine import MAX_BITWIDTH, GridProperties, resolve_grid
from quanta.kernels import affine as kernels
from quanta.kernels.affine import QDQ as QUANTIZE_DEQUANTIZE
from quanta.kernels.affine import Q as QUANTIZE
from quanta.kernels.affine import AffinePlan, plan
from quanta.kernels.range_affine import RangeCall, range_affine
from quanta.kernels.blocks import check_block_size, resolve_layout
from quanta.kernels.qparams import (
    calibrated_range,
    offset_from_range,
    range_for_encoding,
    scale_from_range,
)
from quanta.quantization.base import QuantizerBase
from quanta.quantization.encoding_analyzer import (
    EncodingAnalyzer,
    MinMaxEncodingAnalyzer,
    StatisticsNotFoundError,
    _check_shape,
)
from quanta.tensors.quantized import DequantizedTensor, QuantizedTensor, QuantizedTensorBase

__all__ = ["AffineQuantizerBase", "Quantize", "QuantizeDequantize"]


class AffineQuantizerBase(GridProperties, QuantizerBase):
    """Common state of the affine quantizers.

    Args:
        shape: shape of ``min``/``max`` (and of scale and offset): ``()`` per
            tensor, ``(C, 1)`` per output channel of a weight, ``(C, K // B)``
            with ``block_size=(-1, B)`` per block.
        bitwidth: bits per code. With ``symmetric=True`` the grid is signed
            ``[-2**(b-1), 2**(b-1) - 1]``, otherwise unsigned ``[0, 2**b - 1]``.
        symmetric: symmetric encoding (constant offset ``-round((qmin+qmax)/2)``).
        encoding_analyzer: statistics used by :meth:`compute_encodings`
            (default :class:`MinMaxEncodingAnalyzer`; any analyzer of
            :mod:`quanta.quantization.encoding_analyzer`, of the same ``shape``).
        block_size: block size per dimension of ``shape`` (``-1`` = wildcard).
        qmin, qmax: explicit grid instead of ``bitwidth`` (keyword only).
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        bitwidth: int | None = None,
        symmetric: bool = False,
        encoding_analyzer: EncodingAnalyzer | None = None,
        block_size: tuple[int, ...] | None = None,
        *,
        qmin: int | None = None,
        qmax: int | None = None,
    ) -> None:
        super().__init__()
        self.shape = _check_shape(shape)
        if not isinstance(symmetric, bool):
            raise TypeError(f"symmetric must be a bool, got {symmetric!r}")
        if bitwidth is not None and isinstance(bitwidth, int) and not 1 <= bitwidth <= MAX_BITWIDTH:
            raise ValueError(
                f"bitwidth must be in [1, {MAX_BITWIDTH}], got {bitwidth} "
                "(to give an explicit grid, pass qmin=... and qmax=... by keyword)"
            )
        if bitwidth is None and qmin is None and qmax is None:
            raise TypeError(f"{type(self).__name__} needs bitwidth=..., or qmin=... and qmax=...")
        if bitwidth is not None and (qmin is not None or qmax is not None):
            raise TypeError(f"{type(self).__name__} takes bitwidth=... or qmin=.../qmax=..., not both "
                            f"(got bitwidth={bitwidth!r}, qmin={qmin!r}, qmax={qmax!r})")
        self.grid = (
            resolve_grid(bitwidth, signed=symmetric) if bitwidth is not None else resolve_grid(qmin=qmin, qmax=qmax)
        )
        self.symmetric = symmetric
        self.block_size = check_block_size(block_size)
        if self.block_size is not None and len(self.block_size) != len(self.shape):
            raise ValueError(
                f"block_size {self.block_size} must have one entry per dimension of shape {self.shape}"
            )
        if encoding_analyzer is None:
            encoding_analyzer = MinMaxEncodingAnalyzer(self.shape, self.block_size)
        elif not isinstance(encoding_analyzer, EncodingAnalyzer):
            raise TypeError(f"encoding_analyzer must be an EncodingAnalyzer, got {type(encoding_analyzer).__name__}")
        elif encoding_analyzer.shape != self.shape:
            raise ValueError(
                f"encoding_analyzer has shape {encoding_analyzer.shape}, but the quantizer has shape {self.shape}"
            )
        self.encoding_analyzer = encoding_analyzer
        self.min = nn.Parameter(torch.zeros(self.shape))
        self.max = nn.Parameter(torch.zeros(self.shape))
        self._dynamic_range: tuple[torch.Tensor, torch.Tensor] | None = None
        self._is_ready = False  # the `_initialized` buffer as a Python bool (read while tracing)
        self._assigned: set[str] = set()  # min/max replaced by assignment since construction
        self._qcache: _QParams | None = None  # scale/offset of the current range, no autograd graph
        self._plans: dict[tuple, AffinePlan] = {}  # per (input shape, dtype, device)

    # -- encoding parameters ----------------------------------------------------
    def _set_initialized(self, value: bool) -> None:
        super()._set_initialized(value)
        self._is_ready = bool(value)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        self._is_ready = bool(self._buffers["_initialized"])

    def _range(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self._dynamic_range is not None:
            return self._dynamic_range
        if not self.is_initialized():
            return None
        return self.min, self.max

    def _check_values(self, state: dict[str, torch.Tensor]) -> None:
        lo, hi = state["min"], state["max"]
        if not (bool(torch.isfinite(lo).all()) and bool(torch.isfinite(hi).all())):
            raise ValueError("min and max must be finite")
        if bool((lo > hi).any()):
            raise ValueError("min must not exceed max")

    def get_scale(self, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """Scale ``max(|max - min|, N * s_min) / N``, or None before initialisation."""
        rng = self._range()
        if rng is None:
            return None
        scale = scale_from_range(rng[0], rng[1], self.grid)
        return scale if dtype is None else scale.to(dtype)

    def get_offset(self, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """Offset (``-zero_point``), or None before initialisation."""
        rng = self._range()
        if rng is None:
            return None
        offset = offset_from_range(rng[0], scale_from_range(rng[0], rng[1], self.grid), self.grid, self.symmetric)
        return offset if dtype is None else offset.to(dtype)

    def get_min(self, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """Smallest representable value ``scale * (offset + qmin)`` (may differ slightly from ``self.min``)."""
        enc = self.get_encodings()
        if enc is None:
            return None
        return enc.min if dtype is None else enc.min.to(dtype)

    def get_max(self, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        """Largest representable value ``scale * (offset + qmax)``."""
        enc = self.get_encodings()
        if enc is None:
            return None
        return enc.max if dtype is None else enc.max.to(dtype)

    def get_encodings(self) -> AffineEncoding | None:
        """The current encoding as an :class:`AffineEncoding`, or None before initialisation."""
        scale = self.get_scale()
        if scale is None:
            return None
        rng = self._range()
        assert rng is not None
        offset = offset_from_range(rng[0], scale, self.grid, self.symmetric)
        return AffineEncoding(scale, offset, self.grid, block_size=self.block_size)

    @torch.no_grad()
    def set_range(self, min: torch.Tensor | float | None, max: torch.Tensor | float | None) -> None:
        """Set ``min``/``max`` (broadcast to ``shape``) and mark the quantizer initialised.

        ``None`` leaves that end as it is. Raises ValueError for non-finite
        values or ``min > max``.

        >>> q = QuantizeDequantize(shape=(), bitwidth=8, symmetric=False)
        >>> q.set_range(-10, 41)
        >>> q.get_scale().item(), q.get_offset().item()
        (0.20000000298023224, -50.0)
        """
        lo = self.min.detach() if min is None else torch.as_tensor(min, dtype=self.min.dtype, device=self.min.device)
        hi = self.max.detach() if max is None else torch.as_tensor(max, dtype=self.max.dtype, device=self.max.device)
        try:
            lo, hi = torch.broadcast_to(lo, self.shape), torch.broadcast_to(hi, self.shape)
        except RuntimeError:
            raise ValueError(
                f"set_range: min {tuple(lo.shape)} and max {tuple(hi.shape)} must broadcast to shape {self.shape}"
            ) from None
        if not (torch.isfinite(lo).all() and torch.isfinite(hi).all()):
            raise ValueError("set_range: min and max must be finite")
        if bool((lo > hi).any()):
            raise ValueError("set_range: min must not exceed max")
        self.min.copy_(lo)
        self.max.copy_(hi)
        self._set_initialized(True)

    def set_encodings(self, encoding: AffineEncoding) -> None:
        """Adopt an :class:`AffineEncoding` (same grid and shape) as this quantizer's range.

        ``get_encodings()`` then returns it bit for bit whenever a float32 range
        ``[min, max]`` can express it (almost always; otherwise a RuntimeWarning
        says how many scales are one ulp off).

        >>> a = QuantizeDequantize(shape=(), bitwidth=8)
        >>> a.set_range(-0.3, 1.7)
        >>> b = QuantizeDequantize(shape=(), bitwidth=8)
        >>> b.set_encodings(a.get_encodings())
        >>> b.get_encodings() == a.get_encodings()
        True
        """
        if not isinstance(encoding, AffineEncoding):
            raise TypeError(f"encoding must be an AffineEncoding, got {type(encoding).__name__}")
        if tuple(encoding.scale.shape) != self.shape:
            raise ValueError(f"encoding has shape {tuple(encoding.scale.shape)}, quantizer has shape {self.shape}")
        if encoding.grid != self.grid:
            raise ValueError(f"encoding grid {encoding.grid} differs from the quantizer's grid {self.grid}")
        scale = encoding.scale.detach().float()
        offset = torch.broadcast_to(encoding.offset.detach(), scale.shape).float()
        if self.symmetric and not torch.equal(offset, offset_from_range(scale, scale, self.grid, True)):
            raise ValueError("a symmetric quantizer needs the symmetric offset -round((qmin + qmax) / 2)")
        lo, hi, exact = range_for_encoding(scale, offset, self.grid, symmetric=self.symmetric)
        if not bool(exact.all()):
            warnings.warn(
                f"set_encodings: {int((~exact).sum())} of {exact.numel()} scales have no float32 range "
                "[min, max] that reproduces them exactly; they are kept to within one ulp",
                RuntimeWarning,
                stacklevel=2,
            )
        self.set_range(lo, hi)

    # -- calibration -------------------------------------------------------------
    def allow_overwrite(self, mode: bool | None = None, *, min: bool | None = None, max: bool | None = None) -> None:
        """Whether ``compute_encodings`` may overwrite the range: both ends (``mode``), or one end each.

        With one end fixed (``allow_overwrite(min=False)``), calibration sets only the other end (AIMET's
        ``encoding_constraints`` with one bound, e.g. a ReLU output's ``min = 0``).

        >>> q = QuantizeDequantize(shape=(), bitwidth=8)
        >>> q.set_range(0.0, 1.0)
        >>> q.allow_overwrite(min=False)
        >>> with q.compute_encodings():
        ...     _ = q(torch.tensor([-3.0, 2.0]))
        >>> q.min.item(), q.max.item()
        (0.0, 2.0)
        """
        if mode is not None:
            if min is not None or max is not None:
                raise TypeError("allow_overwrite takes mode, or min=/max=, not both")
            super().allow_overwrite(mode)
            self._fixed_ends = frozenset() if mode else frozenset(("min", "max"))
            return
        fixed = set(getattr(self, "_fixed_ends", ()))
        for end, allowed in (("min", min), ("max", max)):
            if allowed is None:
                continue
            if not isinstance(allowed, bool):
                raise TypeError(f"{end} must be a bool, got {allowed!r}")
            fixed.discard(end) if allowed else fixed.add(end)
        self._fixed_ends = frozenset(fixed)
        super().allow_overwrite(len(fixed) < 2)

    def is_overwrite_allowed(self, name: str | None = None) -> bool:
        """Whether calibration may overwrite ``name`` (``"min"`` or ``"max"``), or either end (``None``)."""
        fixed = getattr(self, "_fixed_ends", frozenset())
        if name is None:
            return len(fixed) < 2
        if name not in ("min", "max"):
            raise ValueError(f"name must be 'min', 'max' or None, got {name!r}")
        return name not in fixed

    def _reset_statistics(self) -> None:
        self.encoding_analyzer.reset_stats()

    def _finish_calibration(self) -> None:
        try:
            lo, hi = self.encoding_analyzer.compute_encodings(self.grid.num_steps, self.symmetric)
        except StatisticsNotFoundError:
            warnings.warn(
                f"{type(self).__name__}.compute_encodings(): no input was seen, the encoding is unchanged",
                RuntimeWarning,
                stacklevel=4,
            )
            return
        fixed = getattr(self, "_fixed_ends", frozenset())
        self.set_range(None if "min" in fixed else lo, None if "max" in fixed else hi)

    @contextlib.contextmanager
    def _batch_range(self, x: torch.Tensor):
        # the batch's own statistics, computed once: they are folded into the running ones and give this range
        batch = self.encoding_analyzer.update_stats(x)
        if batch is None:  # empty batch: any valid range does, there is nothing to quantize
            zeros = torch.zeros(self.shape)
            rng = calibrated_range(zeros, zeros, self.grid.num_steps, self.symmetric)
        else:
            rng = self.encoding_analyzer.compute_encodings_from_stats(batch, self.grid.num_steps, self.symmetric)
        self._dynamic_range = (rng[0].to(self.min.device), rng[1].to(self.max.device))
        try:
            yield
        finally:
            self._dynamic_range = None

    def _encoding_for(self, x: torch.Tensor) -> AffineEncoding:
        enc = self.get_encodings()
        if enc is None:
            self._raise_uninitialized()
        return enc

    def _raise_uninitialized(self) -> None:
        raise RuntimeError(
            f"Failed to run {type(self).__name__} since quantization parameters are not initialized. "
            "Please initialize the quantization parameters using `compute_encodings()` or `set_range()`."
        )

    def _prepare_input(self, x: torch.Tensor, *, check_layout: bool = True) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"input must be a tensor, got {type(x).__name__}")
        if isinstance(x, QuantizedTensor):
            x = x.dequantize()
        if isinstance(x, QuantizedTensorBase):
            x = x.as_subclass(torch.Tensor)
        if not x.is_floating_point():
            raise TypeError(f"input must be a floating-point tensor, got dtype {x.dtype}")
        if check_layout:
            resolve_layout(x.shape, self.shape, self.block_size)  # clear error before any work
        return x

    def _qparams(self) -> "_QParams":
        """Scale and offset of the current range, cached while ``min``/``max`` hold the same values."""
        c = self._qcache
        if c is not None and c.state.unchanged():
            return c
        mn, mx = self.min, self.max
        with torch.no_grad():
            scale = scale_from_range(mn, mx, self.grid)
            offset = offset_from_range(mn, scale, self.grid, self.symmetric)
        c = self._qcache = _QParams(self, scale, offset)
        return c

    def _check_device(self, x: torch.Tensor) -> None:
        if x.device != self.min.device:
            raise ValueError(f"input is on {x.device} but the quantizer's parameters are on {self.min.device}; "
                             "move them to one device (quantizer.to(device))")

    def _plan(self, x: torch.Tensor) -> AffinePlan:
        key = (x.shape, x.dtype, x.device)
        p = self._plans.get(key)
        if p is None:
            self._check_device(x)  # once per new (shape, dtype, device)
            if len(self._plans) >= 16:
                self._plans.clear()
            p = self._plans[key] = plan(x, self.shape, self.grid, self.block_size, self._out_dtype(x.dtype))
        return p

    def forward(self, input: torch.Tensor) -> QuantizedTensorBase:
        if torch.compiler.is_compiling():
            return self._traced_forward(input)
        x = input if type(input) is torch.Tensor and input.is_floating_point() else self._prepare_input(input)
        if self._calibrating:
            self._check_device(x)
            with self._batch_range(x):
                enc = self._encoding_for(x)
                return self._wrap_output(self._kernel(x, enc.scale, enc.offset), enc)
        c, call = self._prepared_call(x)
        params = self._parameters
        return self._wrap_output(range_affine(x, params["min"], params["max"], call), _LiveEncoding(self, c))

    def _traced_forward(self, input: torch.Tensor) -> torch.Tensor:
        """``forward`` under torch.compile / torch.export: only static Python decisions; a plain tensor.

        No layout check here (it would specialise symbolic shapes): the kernel checks at run time.
        """
        x = self._prepare_input(input, check_layout=False)
        if self._calibrating:
            if torch.compiler.is_exporting():
                raise RuntimeError(f"{type(self).__name__}: compute_encodings() cannot run under torch.export; "
                                   "calibrate the model eagerly, then export it")
            return _eager_forward(self, x)  # a graph break: calibration statistics are gathered eagerly
        if not self._is_ready:
            self._raise_uninitialized()
        mn, mx = self.min, self.max
        scale = scale_from_range(mn, mx, self.grid)
        return self._kernel(x, scale, offset_from_range(mn, scale, self.grid, self.symmetric))

    def _prepared_call(self, x: torch.Tensor) -> tuple[_QParams, RangeCall]:
        """``(qparams, kernel call)`` for ``x`` outside calibration: the hot path.

        Plain dict lookups instead of nn.Module.__getattr__, cached plans and qparams.
        """
        c = self._qcache
        if c is None or not c.state.unchanged():  # the snapshot covers `_initialized` too
            c = self._qparams()
        if not c.initialized:
            self._raise_uninitialized()
        p = self._plans.get((x.shape, x.dtype, x.device)) or self._plan(x)
        call = c.calls.get(p)
        if call is None:
            call = c.calls[p] = RangeCall(self._mode, p, self._out_dtype(x.dtype), self.grid, self.symmetric,
                                          c.scale, c.offset)
        return c, call

    def _direct_call(self, x: torch.Tensor) -> RangeCall | None:
        """The prepared kernel call if ``self(x)`` is nothing but that kernel call on a plain tensor; else None.

        That is: :class:`QuantizeDequantize` itself (same dtype out as in), not
        calibrating, no forward hook that would miss the call, a plain contiguous
        floating-point ``x``, and (with autograd on) no gradient wanted for the range.
        """
        if (type(self) is not QuantizeDequantize or self._calibrating or type(x) is not torch.Tensor
                or not x.is_floating_point() or not x.is_contiguous()
                or self._forward_hooks or self._forward_pre_hooks
                or _nn_module._global_forward_hooks or _nn_module._global_forward_pre_hooks):
            return None
        call = self._prepared_call(x)[1]
        if torch.is_grad_enabled():
            params = self._parameters
            if params["min"].requires_grad or params["max"].requires_grad:
                return None
        return call

    def _qdq_into_(self, x: torch.Tensor) -> bool:
        """Overwrite ``x`` with the values ``self(x)`` would return, if that is safe and cheap; else False.

        For a caller that owns ``x`` (a fresh op output nothing else refers to) and
        only needs the values: it saves an allocation and a pass over memory. Done
        outside autograd only, when :meth:`_direct_call` gives a call. ``x`` is
        untouched when it returns False; the caller then calls the quantizer as usual.
        """
        return x.is_contiguous() and self._qdq_owned(x) is x

    def _qdq_owned(self, x: torch.Tensor) -> torch.Tensor | None:
        """The values ``self(x)`` would return, as a plain tensor, without a new allocation where that is safe and
        cheap; None where the caller should call the quantizer as usual (``x`` untouched).

        For a caller that owns ``x`` (a fresh op output nothing else refers to) and only needs the values. A
        contiguous ``x`` is overwritten (:meth:`_qdq_into_`). A non-contiguous one on CPU (a channels-last
        convolution output, a permuted view) is copied and the copy overwritten where the native kernel
        runs: ``self(x)`` reads such a copy too and returns a contiguous tensor (the eager kernel keeps
        ``x``'s memory format: there, None).
        """
        if type(x) is not torch.Tensor or torch.is_grad_enabled():
            return None
        contiguous = x.is_contiguous()
        if not contiguous and x.device.type != "cpu":
            return None
        xc = x if contiguous else x.contiguous()
        call = self._direct_call(xc)
        if call is None or not (contiguous or call.plan.native_call() is not None):
            return None
        return call.forward_(xc)

    _mode: int

    def _out_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype

    def _kernel(self, x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _wrap_output(self, y: torch.Tensor, enc: AffineEncoding) -> QuantizedTensorBase:
        raise NotImplementedError

    def extra_repr(self) -> str:
        block = f", block_size={self.block_size}" if self.block_size is not None else ""
        return f"shape={self.shape}{block}, qmin={self.qmin}, qmax={self.qmax}, symmetric={self.symmetric}"

    def __setattr__(self, name: str, value: Any) -> None:
        # AIMET lets users initialise a quantizer by assigning new min and max Parameters.
        if name in ("min", "max") and "_assigned" in self.__dict__:
            if not isinstance(value, nn.Parameter):
                raise TypeError(f"{name} must be an nn.Parameter, got {type(value).__name__}")
            if tuple(value.shape) != self.shape:
                raise ValueError(f"{name} must have shape {self.shape}, got {tuple(value.shape)}")
            super().__setattr__(name, value)
            self._assigned.add(name)
            if self._assigned == {"min", "max"}:
                self._set_initialized(True)
            return
        super().__setattr__(name, value)

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_dynamic_range"] = None
        state["_qcache"] = None
        state["_plans"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if "_is_ready" not in self.__dict__:  # pickled before the flag existed
            self._is_ready = bool(self._buffers["_initialized"])


class Quantize(AffineQuantizerBase):
    r"""Quantize the input: ``out = clamp(round(input / scale) - offset, qmin, qmax)``.

    Returns a :class:`~quanta.quantization.QuantizedTensor` (codes stored as
    floats) that remembers its encoding. Scale and offset derive from the
    learnable ``min``/``max``; see :class:`AffineQuantizerBase` for arguments.

    >>> import quanta.quantization as Q
    >>> q = Q.affine.Quantize(shape=(), bitwidth=8, symmetric=True)
    >>> q.set_range(-128 * 0.1, 127 * 0.1)
    >>> q(torch.tensor([2.57, -2.312, 0.153]))
    QuantizedTensor([ 26., -23.,   2.], grad_fn=<AliasBackward0>)
    """

    _mode = QUANTIZE

    def _out_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return kernels.codes_dtype(dtype, self.grid)

    def _kernel(self, x, scale, offset):
        return kernels.quantize(x, scale, offset, self.grid, self.block_size)

    def _wrap_output(self, y, enc):
        return QuantizedTensor._wrap(y, enc)


class QuantizeDequantize(AffineQuantizerBase):
    r"""Fake-quantize the input: ``out = (clamp(round(input / scale) - offset, qmin, qmax) + offset) * scale``.

    Returns a :class:`~quanta.quantization.DequantizedTensor` in the input's
    dtype. See :class:`AffineQuantizerBase` for arguments.

    >>> import quanta.quantization as Q
    >>> qtzr = Q.affine.QuantizeDequantize(shape=(), bitwidth=8, symmetric=False)
    >>> qtzr
    QuantizeDequantize(shape=(), qmin=0, qmax=255, symmetric=False)
    >>> qtzr.get_scale() is None
    True
    >>> x = torch.arange(256) / 256
    >>> with qtzr.compute_encodings():
    ...     _ = qtzr(x)
    >>> qtzr.get_scale(), qtzr.get_offset()
    (tensor(0.0039, grad_fn=<DivBackward0>), tensor(0., grad_fn=<SubBackward0>))
    >>> torch.equal(qtzr(x), x)
    True
    """

    _mode = QUANTIZE_DEQUANTIZE

    def _kernel(self, x, scale, offset):
        return kernels.quantize_dequantize(x, scale, offset, self.grid, self.block_size)

    def _wrap_output(self, y, enc):
        return DequantizedTensor._wrap(y, enc)


@torch.compiler.disable
def _eager_forward(quantizer: AffineQuantizerBase, x: torch.Tensor) -> QuantizedTensorBase:
    """``quantizer.forward(x)`` run eagerly from inside a compiled region (calibration)."""
    return quantizer.forward(x)


class _QParams:
    """Scale and offset computed (without a graph) from the quantizer's ``min``/``max``, and a snapshot of its
    tensors (``min``, ``max``, ``_initialized``): the cache holds while ``state.unchanged()``. Bytes, not version
    counters: writes through ``.data`` do not bump versions."""

    __slots__ = ("state", "initialized", "scale", "offset", "calls")

    def __init__(self, quantizer: AffineQuantizerBase, scale: torch.Tensor, offset: torch.Tensor) -> None:
        self.state = Snapshot(quantizer)
        self.initialized = bool(quantizer._buffers["_initialized"])
        self.scale, self.offset = scale, offset
        self.calls: dict[AffinePlan, RangeCall] = {}  # prepared kernel calls per input plan


class _LiveEncoding(AffineEncoding):
    """The encoding of a quantizer's output, built on first access.

    Values are those used for the output. If the quantizer still has that range
    and autograd is on, scale and offset come with their graph to ``min``/``max``
    (as ``quantizer.get_scale()`` would, e.g. ``grad_fn=<DivBackward0>``).
    Pickling or copying gives a plain :class:`AffineEncoding`.
    """

    def __init__(self, quantizer: AffineQuantizerBase, qparams: _QParams) -> None:  # noqa: D107
        self._quantizer = weakref.ref(quantizer)
        self._qparams = qparams
        self.grid = quantizer.grid
        self.block_size = quantizer.block_size
        self._values: tuple[torch.Tensor, torch.Tensor] | None = None

    def _materialize(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._values is None:
            q = self._quantizer()
            c = self._qparams
            if q is not None and torch.is_grad_enabled() and q._qparams() is c:
                enc = q.get_encodings()
                assert enc is not None
                self._values = (enc.scale, enc.offset)
            else:
                self._values = (c.scale, c.offset)
        return self._values

    @property  # type: ignore[override]
    def scale(self) -> torch.Tensor:
        return self._materialize()[0]

    @property  # type: ignore[override]
    def offset(self) -> torch.Tensor:
        return self._materialize()[1]

    def __reduce__(self):
        scale, offset = self._materialize()
        return (AffineEncoding, (scale, offset, self.grid, False, self.block_size))
