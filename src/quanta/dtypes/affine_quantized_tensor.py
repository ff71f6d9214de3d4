"""``AffineQuantizedTensor``: a tensor stored as integer (or small-float) codes with scales (torchao's API).

It looks like a float tensor of ``shape`` and ``dtype`` from outside; inside,
``tensor_impl`` keeps the codes in a layout (plain integers, packed sub-byte
codes, float8, packed fpx, CPU int4) with one scale (and zero point) per block
of ``block_size``. ``dequantize()`` gives the floats back; ``F.linear``,
``torch.mm``/``addmm``, ``F.embedding``, ``t``, ``view``/``reshape``, slicing,
``detach``, ``clone``, ``copy_`` and ``to`` work on the codes directly (see
:mod:`quanta.dtypes.ops`); anything else runs on the dequantized tensor after
a one-time warning.

Numerics are those of :mod:`quanta.quantization.quant_primitives` (torchao's
formulas: ``q = clamp(round(x * (1/s)) + zp, qmin, qmax)``, ``x' = (q - zp) * s``).

>>> from quanta.quantization.quant_primitives import MappingType
>>> w = torch.tensor([[0.5, -1.0, 0.25, 1.0], [2.0, 0.0, -2.0, 1.0]])
>>> aqt = AffineQuantizedTensor.from_hp_to_intx(w, MappingType.SYMMETRIC, (1, 4), torch.int8)
>>> aqt.shape, aqt.dtype, aqt.block_size, (aqt.quant_min, aqt.quant_max)
(torch.Size([2, 4]), torch.float32, (1, 4), (-128, 127))
>>> aqt.dequantize()
tensor([[ 0.5020, -0.9961,  0.2510,  0.9961],
        [ 1.9922,  0.0000, -1.9922,  1.0039]])
>>> aqt.tensor_impl.int_data
tensor([[  64, -127,   32,  127],
        [ 127,    0, -127,   64]], dtype=torch.int8)
"""

from __future__ import annotations

import warnings
from typing import Callable, Optional, Sequence, Tuple, Union

import torch
from torch.utils._pytree import tree_map

from quanta.dtypes.compile_cache import stable_hash_for_caching
from quanta.dtypes.layouts import Float8Layout, FloatxTensorCoreLayout, Int4CPULayout, Layout, PlainLayout, UintxLayout
from quanta.dtypes.tensor_impl import AQTTensorImpl, impl_class_for
from quanta.encodings import torchao as P
from quanta.encodings.torchao import MappingType, ZeroPointDomain

__all__ = [
    "AffineQuantizedTensor",
    "to_affine_quantized_intx",
    "to_affine_quantized_intx_static",
    "to_affine_quantized_floatx",
    "to_affine_quantized_floatx_static",
    "to_affine_quantized_fpx",
    "implements",
    "implements_torch_function",
    "dispatch",
]

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)


# --------------------------------------------------------------------------- operations table
Handler = Callable[..., object]
#: aten overload -> ``handler(func, args, kwargs)``, the ``__torch_dispatch__`` table; and torch function ->
#: ``handler(*args, **kwargs)``, taken in ``__torch_function__`` before dispatch (``F.linear``'s fast path).
#: :mod:`quanta.dtypes.ops` fills both (``quanta.dtypes`` imports it); a handler may return ``NotImplemented``,
#: and the operation then runs on the dequantized tensor.
_HANDLERS: dict[object, Handler] = {}
_TORCH_FUNCTIONS: dict[object, Handler] = {}
_WARNED: set[str] = set()


def implements_torch_function(*funcs: object) -> Callable[[Handler], Handler]:
    """Register ``fn(*args, **kwargs)`` for torch functions; it may return ``NotImplemented`` to go on to dispatch."""

    def register(fn: Handler) -> Handler:
        for f in funcs:
            _TORCH_FUNCTIONS[f] = fn
        return fn

    return register


def implements(*ops: object) -> Callable[[Handler], Handler]:
    """Register ``fn(func, args, kwargs)`` for aten overloads; it may return ``NotImplemented`` to fall back."""

    def register(fn: Handler) -> Handler:
        for op in ops:
            _HANDLERS[op] = fn
        return fn

    return register


def dispatch(func, args, kwargs):
    handler = _HANDLERS.get(func)
    if handler is not None:
        out = handler(func, args, kwargs)
        if out is not NotImplemented:
            return out
    return _fallback(func, args, kwargs, handled=handler is not None)


def _fallback(func, args, kwargs, handled: bool = False):
    if func._schema.is_mutable:
        raise TypeError(f"{func} would modify an AffineQuantizedTensor in place; its codes are read-only "
                        "(dequantize() it, or re-quantize the result)")
    name = str(func)
    if name not in _WARNED:
        _WARNED.add(name)
        why = ("cannot keep this AffineQuantizedTensor quantized (its layout or block structure does not survive "
               "the operation)" if handled else "has no implementation for AffineQuantizedTensor")
        warnings.warn(f"quanta: {name} {why}; it runs on the dequantized tensor (a float copy). This warning is "
                      "shown once per operation.", stacklevel=3)

    def plain(a):
        return a.dequantize() if isinstance(a, AffineQuantizedTensor) else a

    return func(*tree_map(plain, args), **tree_map(plain, kwargs))


def _float_input(x: object) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"input_float must be a torch.Tensor, got {type(x).__name__}")
    if isinstance(x, AffineQuantizedTensor):
        raise TypeError("input_float is already an AffineQuantizedTensor; dequantize() it first")
    if x.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"input_float must be float32/float16/bfloat16/float64, got {x.dtype}")
    return x.detach()


def _block_size(block_size: object, shape: torch.Size) -> tuple[int, ...]:
    if isinstance(block_size, (str, bytes)) or not isinstance(block_size, Sequence):
        raise TypeError(f"block_size must be a tuple of ints, one per dimension, got {block_size!r}")
    if len(block_size) != len(shape):
        raise ValueError(f"block_size {tuple(block_size)} must have one entry per dimension of shape {tuple(shape)}")
    out = []
    for d, (b, s) in enumerate(zip(block_size, shape)):
        if isinstance(b, bool) or not isinstance(b, int):
            raise TypeError(f"block_size[{d}] must be an int, got {b!r}")
        b = s if b == -1 else b
        if b < 1 or (s % b if s else False):
            raise ValueError(f"block_size[{d}] = {b} must be positive and divide shape[{d}] = {s}")
        out.append(b)
    return tuple(out)


def _storage_block(block_size: tuple[int, ...], transposed: bool) -> tuple[int, ...]:
    return tuple(reversed(block_size)) if transposed else block_size


class AffineQuantizedTensor(torch.Tensor):
    """A float tensor stored as affine-quantized codes (torchao's ``AffineQuantizedTensor``).

    Attributes:
        tensor_impl: the storage (:class:`~quanta.dtypes.tensor_impl.AQTTensorImpl`): codes in a
            layout, scale and zero point with one entry per block along every dimension.
        block_size: elements sharing one scale, one entry per dimension.
        shape: shape of the high-precision tensor.
        quant_min: smallest code (for integer codes; derived from the code dtype when None).
        quant_max: largest code (likewise).
        zero_point_domain: ``ZeroPointDomain.INT`` (``(q - zp) * s``), ``FLOAT`` (``(q - mid) * s + zp``,
            tinygemm) or ``NONE`` (``q * s``).
        dtype: dtype of the high-precision tensor (what ``dequantize()`` returns).

    Build it with the ``from_hp_to_*`` class methods. The tensor never requires
    grad itself; gradients flow to the *other* operands of ``F.linear``/``mm``.
    """

    tensor_impl: AQTTensorImpl

    @staticmethod
    def __new__(cls, tensor_impl: AQTTensorImpl, block_size: Tuple[int, ...], shape: torch.Size,
                quant_min: Optional[Union[int, float]] = None, quant_max: Optional[Union[int, float]] = None,
                zero_point_domain: ZeroPointDomain = ZeroPointDomain.INT, dtype: Optional[torch.dtype] = None,
                strides=None):
        if not isinstance(tensor_impl, AQTTensorImpl):
            raise TypeError(f"tensor_impl must be an AQTTensorImpl, got {type(tensor_impl).__name__}")
        if not isinstance(zero_point_domain, ZeroPointDomain):
            raise TypeError(f"zero_point_domain must be a ZeroPointDomain (NONE instead of None), "
                            f"got {zero_point_domain!r}")
        for name, v in (("quant_min", quant_min), ("quant_max", quant_max)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise TypeError(f"{name} must be a number or None, got {v!r}")
        if quant_min is not None and quant_max is not None and quant_min >= quant_max:
            raise ValueError(f"quant_min ({quant_min}) must be smaller than quant_max ({quant_max})")
        dtype = torch.float32 if dtype is None else dtype
        if dtype not in _FLOAT_DTYPES:
            raise TypeError(f"dtype (of the high-precision tensor) must be a float dtype, got {dtype}")
        kwargs = {"dtype": dtype, "device": tensor_impl.device, "requires_grad": False}
        if strides is not None:
            kwargs["strides"] = strides
        return torch.Tensor._make_wrapper_subclass(cls, shape, **kwargs)

    def __init__(self, tensor_impl: AQTTensorImpl, block_size: Tuple[int, ...], shape: torch.Size,
                 quant_min: Optional[Union[int, float]] = None, quant_max: Optional[Union[int, float]] = None,
                 zero_point_domain: ZeroPointDomain = ZeroPointDomain.INT, dtype: Optional[torch.dtype] = None,
                 strides=None) -> None:
        self.tensor_impl = tensor_impl
        self.block_size = tuple(block_size)
        self.quant_min = quant_min
        self.quant_max = quant_max
        self.zero_point_domain = zero_point_domain
        self._expose_inner_tensors()

    def _expose_inner_tensors(self) -> None:
        # The storage's tensors under the names __tensor_flatten__ gives them ("_impl_<field>"), as plain
        # attributes: torch.compile's guards read them, and probe absent attributes, on every quantized weight at
        # every call of a compiled model; a Python __getattr__ would run for each of those reads.
        for k, v in self.tensor_impl.tensors().items():
            self.__dict__[f"_impl_{k}"] = v

    # -- torch.compile / tensor subclass protocol -------------------------------------------
    def _stable_hash_for_caching(self) -> str:
        """The key of this tensor in torch.compile's caches (:mod:`quanta.dtypes.compile_cache`)."""
        return stable_hash_for_caching(self)

    def __tensor_flatten__(self):
        # Computed once per storage: torch.compile's guards call this on every quantized weight at every call of
        # a compiled model (the storage's fields are set when it is built and not changed after).
        impl = self.tensor_impl
        cached = self.__dict__.get("_flatten")
        if cached is not None and cached[0] is impl:
            return list(cached[1][0]), cached[1][1]
        names = [f"_impl_{k}" for k, v in impl.tensors().items() if v is not None]
        state = tuple(sorted((k, v) for k, v in vars(impl).items() if k not in type(impl).tensor_names))
        flat = names, (type(impl), state, self.block_size, self.shape, self.quant_min, self.quant_max,
                       self.zero_point_domain, self.dtype)
        self.__dict__["_flatten"] = (impl, flat)
        return list(names), flat[1]

    def __getstate__(self) -> dict:
        # pickling (torch.save) keeps the fields, not what is derived from them
        return {k: v for k, v in self.__dict__.items()
                if k not in ("_flatten", "_kernel_call") and not k.startswith("_impl_")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._expose_inner_tensors()

    @classmethod
    def __tensor_unflatten__(cls, inner, meta, outer_size, outer_stride):
        impl_cls, state, block_size, shape, qmin, qmax, domain, dtype = meta
        impl = object.__new__(impl_cls)
        impl.__dict__.update(dict(state))
        impl.__dict__.update({k: inner.get(f"_impl_{k}") for k in impl_cls.tensor_names})
        return cls(impl, block_size, shape if outer_size is None else outer_size, qmin, qmax, domain, dtype=dtype)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _TORCH_FUNCTIONS.get(func)
        if handler is not None:
            # straight to the kernels: F.linear would otherwise reach dispatch as t() + mm, building a
            # transposed wrapper per call
            out = handler(*args, **kwargs)
            if out is not NotImplemented:
                return out
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return dispatch(func, args, kwargs or {})

    # -- basics -----------------------------------------------------------------------------
    @property
    def _layout(self) -> Layout:
        return self.tensor_impl.get_layout()

    @property
    def storage_block_size(self) -> tuple[int, ...]:
        """``block_size`` in the orientation of the stored codes (reversed for a transposed 2-D tensor)."""
        return _storage_block(self.block_size, self.tensor_impl.transposed)

    @property
    def storage_nbytes(self) -> int:
        """Bytes really held: codes, scales and zero points (``nbytes`` reports the float size)."""
        return self.tensor_impl.nbytes

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(tensor_impl={self.tensor_impl}, block_size={self.block_size}, "
                f"shape={self.shape}, device={self.device}, dtype={self.dtype}, requires_grad={self.requires_grad})")

    def _with(self, tensor_impl: AQTTensorImpl | None = None, *, block_size=None, shape=None,
              dtype=None) -> "AffineQuantizedTensor":
        return AffineQuantizedTensor(self.tensor_impl if tensor_impl is None else tensor_impl,
                                     self.block_size if block_size is None else block_size,
                                     self.shape if shape is None else shape, self.quant_min, self.quant_max,
                                     self.zero_point_domain, dtype=self.dtype if dtype is None else dtype)

    def dequantize(self, output_dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        """The high-precision tensor (``dtype`` unless ``output_dtype`` is given).

        Integer codes: ``(q - zp) * s`` (``INT``), ``(q - mid) * s + zp``
        (``FLOAT``), ``q * s`` (``NONE``); float8: ``float32(q) * s``; fpx:
        ``value(code) * s`` — all through :mod:`quanta.quantization.quant_primitives`.
        """
        dtype = self.dtype if output_dtype is None else output_dtype
        if dtype not in _FLOAT_DTYPES:
            raise TypeError(f"output_dtype must be a float dtype, got {dtype}")
        if self.numel() == 0:
            return torch.empty(self.shape, dtype=dtype, device=self.device)
        data, scale, zp = self.tensor_impl.storage_plain()
        out = self._dequantize_codes(data, scale, zp, self.storage_block_size, dtype)
        return out.t() if self.tensor_impl.transposed else out

    def _dequantize_codes(self, data: torch.Tensor, scale: torch.Tensor, zp: Optional[torch.Tensor],
                          block_size: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """Dequantize codes in storage orientation (also used on row tiles by the matmul ops)."""
        layout = self._layout
        if isinstance(layout, Float8Layout):
            return P.dequantize_affine_float8(data, scale, output_dtype=dtype)
        if isinstance(layout, FloatxTensorCoreLayout):
            return P.dequantize_affine_fpx(data, scale.reshape(-1), layout.ebits, layout.mbits, output_dtype=dtype)
        return P.dequantize_affine(data, block_size, scale, zp, data.dtype, self.quant_min, self.quant_max,
                                   output_dtype=dtype, zero_point_domain=self.zero_point_domain)

    def to(self, *args, **kwargs) -> "AffineQuantizedTensor":
        """Move the storage to a device and/or set the high-precision ``dtype`` (codes stay as they are).

        Returns ``self`` when nothing changes (unless ``copy=True``), like ``Tensor.to``.
        A ``dtype`` changes what ``dequantize()`` and the matmuls return;
        integer dtypes are refused (use ``tensor_impl`` for the codes).
        """
        copy = bool(kwargs.pop("copy", False))
        device, dtype, _non_blocking, _fmt = torch._C._nn._parse_to(*args, **kwargs)
        if dtype is not None and dtype not in _FLOAT_DTYPES:
            raise TypeError(f"AffineQuantizedTensor.to(dtype): dtype must be a float dtype (the dequantized "
                            f"dtype), got {dtype}")
        device = None if device is None else torch.device(device)
        same_device = device is None or device == self.device or (device.type == self.device.type
                                                                    and device.index is None)
        if same_device and (dtype is None or dtype == self.dtype) and not copy:
            return self
        impl = self.tensor_impl
        if not same_device or copy:
            impl = impl._apply(lambda t: t.to(device, copy=copy) if device is not None else t.clone())
        return self._with(impl, dtype=dtype)

    # -- constructors (seed 003) ------------------------------------------------------------
    @classmethod
    def from_hp_to_intx(cls, input_float: torch.Tensor, mapping_type: MappingType, block_size: Tuple[int, ...],
                        target_dtype: torch.dtype, quant_min: Optional[int] = None, quant_max: Optional[int] = None,
                        eps: Optional[float] = None, scale_dtype: Optional[torch.dtype] = None,
                        zero_point_dtype: Optional[torch.dtype] = None, preserve_zero: bool = True,
                        zero_point_domain: ZeroPointDomain = ZeroPointDomain.INT,
                        _layout: Layout = PlainLayout(), use_hqq: bool = False) -> "AffineQuantizedTensor":
        """Quantize ``input_float`` to integer codes of ``target_dtype`` with scales chosen per block.

        qparams come from :func:`~quanta.quantization.quant_primitives.choose_qparams_affine`
        (``preserve_zero=False`` keeps each block's own ``[min, max]``), or from
        half-quadratic optimisation with ``use_hqq=True`` (ASYMMETRIC, ``FLOAT``
        zero point, ``quant_min=0``; see :func:`quanta.dtypes.hqq.choose_qparams_and_quantize_hqq`).

        >>> x = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
        >>> q = AffineQuantizedTensor.from_hp_to_intx(x, MappingType.ASYMMETRIC, (1, 4), torch.uint4,
        ...                                           _layout=UintxLayout(torch.uint4))
        >>> q.tensor_impl.packed, q.dequantize()
        (tensor([[ 80, 250]], dtype=torch.uint8), tensor([[0., 1., 2., 3.]]))
        """
        x = _float_input(input_float)
        block = _block_size(block_size, x.shape)
        layout = _layout if isinstance(_layout, Layout) else _layout_error(_layout)
        domain = zero_point_domain
        if use_hqq:
            from quanta.dtypes.hqq import choose_qparams_and_quantize_hqq

            if P._mapping(mapping_type) is not MappingType.ASYMMETRIC or domain is not ZeroPointDomain.FLOAT \
                    or quant_min not in (0, None):
                raise ValueError("use_hqq=True needs MappingType.ASYMMETRIC, ZeroPointDomain.FLOAT and quant_min=0")
            qmin, qmax = P._int_bounds(target_dtype, quant_min, quant_max, "target_dtype")
            data, scale, zp = choose_qparams_and_quantize_hqq(x, block, target_dtype, qmin, qmax,
                                                              compute_dtype=zero_point_dtype or x.dtype)
        else:
            scale, zp = P.choose_qparams_affine(x, mapping_type, block, target_dtype, quant_min, quant_max, eps,
                                                scale_dtype, zero_point_dtype, preserve_zero=preserve_zero,
                                                zero_point_domain=domain)
            data = P.quantize_affine(x, block, scale, zp, target_dtype, quant_min, quant_max,
                                     zero_point_domain=domain)
        return cls._from_codes(data, scale, zp, block, x.shape, target_dtype, quant_min, quant_max, domain,
                               layout, x.dtype)

    @classmethod
    def from_hp_to_intx_static(cls, input_float: torch.Tensor, scale: torch.Tensor, zero_point: Optional[torch.Tensor],
                               block_size: Tuple[int, ...], target_dtype: torch.dtype,
                               quant_min: Optional[int] = None, quant_max: Optional[int] = None,
                               zero_point_domain: ZeroPointDomain = ZeroPointDomain.INT,
                               _layout: Layout = PlainLayout()) -> "AffineQuantizedTensor":
        """Quantize ``input_float`` with given ``scale``/``zero_point`` (one per block).

        >>> x = torch.tensor([[0.1, -0.26, 3.0]])
        >>> q = AffineQuantizedTensor.from_hp_to_intx_static(x, torch.tensor([0.1]), torch.tensor([2]), (1, 3),
        ...                                                  torch.int8, -8, 7)
        >>> q.tensor_impl.int_data, q.dequantize()
        (tensor([[ 3, -1,  7]], dtype=torch.int8), tensor([[ 0.1000, -0.3000,  0.5000]]))
        """
        x = _float_input(input_float)
        block = _block_size(block_size, x.shape)
        layout = _layout if isinstance(_layout, Layout) else _layout_error(_layout)
        if zero_point_domain is ZeroPointDomain.NONE and zero_point is not None:
            raise ValueError("zero_point must be None when zero_point_domain is ZeroPointDomain.NONE")
        data = P.quantize_affine(x, block, scale, zero_point, target_dtype, quant_min, quant_max,
                                 zero_point_domain=zero_point_domain)
        return cls._from_codes(data, scale, zero_point, block, x.shape, target_dtype, quant_min, quant_max,
                               zero_point_domain, layout, x.dtype)

    @classmethod
    def _from_codes(cls, data, scale, zp, block, shape, target_dtype, quant_min, quant_max, domain, layout,
                    dtype) -> "AffineQuantizedTensor":
        qmin, qmax = P._int_bounds(target_dtype, quant_min, quant_max, "target_dtype")
        if isinstance(layout, (Float8Layout, FloatxTensorCoreLayout)):
            raise ValueError(f"_layout {layout} holds float codes; use from_hp_to_floatx / from_hp_to_fpx")
        if isinstance(layout, UintxLayout):
            lo, hi = layout.code_range
            if qmin < lo or qmax > hi:
                raise ValueError(f"codes in [{qmin}, {qmax}] do not fit _layout {layout}")
            data = data.to(torch.int8 if layout.signed else torch.uint8)
        if isinstance(layout, Int4CPULayout):
            if domain is not ZeroPointDomain.FLOAT or (qmin, qmax) != (0, 15):
                raise ValueError("Int4CPULayout holds uint4 codes [0, 15] with a ZeroPointDomain.FLOAT zero point "
                                 f"(tinygemm); got [{qmin}, {qmax}] and {domain}")
        impl = impl_class_for(layout).from_plain(data, scale, zp, layout, block)
        return cls(impl, block, shape, qmin, qmax, domain, dtype=dtype)

    @classmethod
    def from_hp_to_floatx(cls, input_float: torch.Tensor, block_size: Tuple[int, ...], target_dtype: torch.dtype,
                          _layout: Layout = Float8Layout(), scale_dtype: Optional[torch.dtype] = None
                          ) -> "AffineQuantizedTensor":
        """float8 codes with ``scale = amax(|block|) / finfo(target_dtype).max`` per block (1 for an all-zero block).

        >>> x = torch.tensor([[1.0, -896.0], [0.0, 0.0]])
        >>> q = AffineQuantizedTensor.from_hp_to_floatx(x, (1, 2), torch.float8_e4m3fn)
        >>> q.tensor_impl.scale.flatten(), q.dequantize()
        (tensor([2., 1.]), tensor([[   1., -896.],
                [   0.,    0.]]))
        """
        x = _float_input(input_float)
        block = _block_size(block_size, x.shape)
        layout = _float8_layout(_layout, target_dtype)
        if scale_dtype not in (None, torch.float32):
            raise ValueError(f"scale_dtype must be None or torch.float32 for float8, got {scale_dtype}")
        scale = P.choose_qparams_affine_float8(x, block, target_dtype)
        return cls._from_float8(x, scale, block, target_dtype, layout)

    @classmethod
    def from_hp_to_floatx_static(cls, input_float: torch.Tensor, scale: torch.Tensor, block_size: Tuple[int, ...],
                                 target_dtype: torch.dtype, _layout: Layout = Float8Layout()
                                 ) -> "AffineQuantizedTensor":
        """float8 codes of ``x / scale`` with a given scale (one per block).

        >>> q = AffineQuantizedTensor.from_hp_to_floatx_static(torch.tensor([[1.0, 17.0]]), torch.tensor([[1.0]]),
        ...                                                    (1, 2), torch.float8_e4m3fn)
        >>> q.dequantize()
        tensor([[ 1., 16.]])
        """
        x = _float_input(input_float)
        block = _block_size(block_size, x.shape)
        layout = _float8_layout(_layout, target_dtype)
        return cls._from_float8(x, scale, block, target_dtype, layout)

    @classmethod
    def _from_float8(cls, x, scale, block, target_dtype, layout) -> "AffineQuantizedTensor":
        if not isinstance(scale, torch.Tensor):
            raise TypeError(f"scale must be a torch.Tensor, got {type(scale).__name__}")
        from quanta.dtypes.tensor_impl import full_rank

        full = full_rank(scale, tuple(x.shape), block, "scale")
        data = P.quantize_affine_float8(x, full, target_dtype)
        impl = impl_class_for(layout).from_plain(data, full, None, layout, block)
        return cls(impl, block, x.shape, dtype=x.dtype)

    @classmethod
    def from_hp_to_fpx(cls, input_float: torch.Tensor, _layout: Layout) -> "AffineQuantizedTensor":
        """fpx codes (``FloatxTensorCoreLayout(ebits, mbits)``) of a 2-D tensor, one scale per row.

        ``scale = max(amax(|row|), 1e-12) / max_normal``; round to nearest even,
        saturating; NaN input raises.

        >>> x = torch.tensor([[1.0, -28.0, 0.3, 2.0]])
        >>> q = AffineQuantizedTensor.from_hp_to_fpx(x, FloatxTensorCoreLayout(3, 2))
        >>> q.tensor_impl.packed.numel(), q.dequantize()
        (3, tensor([[  1.0000, -28.0000,   0.3125,   2.0000]]))
        """
        x = _float_input(input_float)
        if not isinstance(_layout, FloatxTensorCoreLayout):
            raise TypeError(f"_layout must be FloatxTensorCoreLayout(ebits, mbits), got {_layout!r}")
        if x.dim() != 2:
            raise ValueError(f"from_hp_to_fpx quantizes 2-D tensors (one scale per row), got shape {tuple(x.shape)}")
        scale = P.choose_qparams_affine_fpx(x, _layout.ebits, _layout.mbits)
        codes = P.quantize_affine_fpx(x, scale, _layout.ebits, _layout.mbits)
        block = (1, x.shape[1])
        impl = impl_class_for(_layout).from_plain(codes, scale, None, _layout, block)
        return cls(impl, block, x.shape, dtype=x.dtype)


def _layout_error(layout: object) -> Layout:
    raise TypeError(f"_layout must be a quanta.dtypes Layout (e.g. PlainLayout()), got {layout!r}")


def _float8_layout(layout: object, target_dtype: object) -> Layout:
    if not isinstance(layout, Float8Layout):
        raise TypeError(f"_layout must be Float8Layout() for float8 codes, got {layout!r}")
    if target_dtype not in _FP8_DTYPES:
        raise ValueError(f"target_dtype must be one of {[str(d) for d in _FP8_DTYPES]}, got {target_dtype}")
    return layout


to_affine_quantized_intx = AffineQuantizedTensor.from_hp_to_intx
to_affine_quantized_intx_static = AffineQuantizedTensor.from_hp_to_intx_static
to_affine_quantized_floatx = AffineQuantizedTensor.from_hp_to_floatx
to_affine_quantized_floatx_static = AffineQuantizedTensor.from_hp_to_floatx_static
to_affine_quantized_fpx = AffineQuantizedTensor.from_hp_to_fpx
