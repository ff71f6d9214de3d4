"""Storage behind an :class:`~quanta.dtypes.AffineQuantizedTensor`: codes in a layout, scales, zero points.

Each layout has one impl class. An impl keeps its tensors in *storage
orientation*: a 2-D tensor that was transposed keeps its codes as they were and
sets ``transposed``, so ``t()`` never repacks. Scales and zero points are kept
with the rank of the codes (one entry per block along every dimension), which
makes slicing them along with the codes a plain slice.

``plain()`` gives ``(codes, scale, zero_point)`` in the tensor's orientation,
with codes as plain integers (int8/uint8/int32) or float8 values;
``storage_rows(rows)`` gives the plain codes of some storage rows only, so that
matmuls can dequantize a weight tile by tile instead of whole.
"""

from __future__ import annotations

import copy
import math
from typing import Callable, ClassVar, Optional

import torch

from quanta.dtypes.block_ops import num_blocks
from quanta.dtypes.layouts import (
    Float8Layout,
    FloatxTensorCoreLayout,
    Int4CPULayout,
    Layout,
    PlainLayout,
    UintxLayout,
)
from quanta.kernels.int_linear import (
    _huge_page_backed,
    check_int4_cpu_shape,
    int4_cpu_packed_shape,
    int4_cpu_scale_and_zero_shape,
    pack_int4_cpu,
    unpack_int4_cpu,
)
from quanta.kernels.packing import pack_bits, packed_nbytes, unpack_bits

__all__ = [
    "AQTTensorImpl",
    "PlainAQTTensorImpl",
    "UintxAQTTensorImpl",
    "Float8AQTTensorImpl",
    "FloatxAQTTensorImpl",
    "Int4CPUAQTTensorImpl",
    "impl_class_for",
]

def full_rank(t: Optional[torch.Tensor], shape: tuple[int, ...], block_size: tuple[int, ...],
              name: str) -> Optional[torch.Tensor]:
    """``t`` reshaped to one entry per block along every dimension (keepdim form)."""
    if t is None:
        return None
    nb = num_blocks(shape, block_size)
    if t.numel() != math.prod(nb):
        raise ValueError(f"{name} has {t.numel()} elements (shape {tuple(t.shape)}), but block_size "
                         f"{block_size} on shape {shape} needs {math.prod(nb)} (one per block: {nb})")
    return t.reshape(nb)


def _all_zero(t: Optional[torch.Tensor]) -> bool:
    return t is None or not bool(t.any())


def _aligned_codes(t: torch.Tensor) -> torch.Tensor:
    """Contiguous codes start on a 64-byte boundary (the int8 CPU kernel needs aligned rows); views stay views.

    A 2-D int8 weight that owns its whole storage (as quantizing makes it) moves to huge-page backed memory
    when it spans a huge page (see ``quanta.kernels.int_linear._huge_page_backed``: decode streams it once a
    token)."""
    owns_storage = t._base is None and t.untyped_storage().nbytes() == t.numel() * t.element_size()
    if t.dtype == torch.int8 and t.dim() == 2 and t.is_contiguous() and owns_storage and t.device.type == "cpu":
        return _huge_page_backed(t)
    if t.is_contiguous() and t.numel() and t.data_ptr() % 64:
        return t.clone()
    return t


_QPARAM_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.uint8, torch.int16,
                  torch.int32, torch.int64)


class AQTTensorImpl:
    """Base class: the tensors of one layout plus ``transposed`` (2-D only)."""

    tensor_names: ClassVar[tuple[str, ...]] = ()
    layout_type: ClassVar[type[Layout]] = Layout

    def __init__(self, layout: Layout, transposed: bool = False) -> None:
        self._layout = layout
        self.transposed = transposed

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_plain(cls, data: torch.Tensor, scale: torch.Tensor, zero_point: Optional[torch.Tensor],
                   layout: Layout, block_size: tuple[int, ...]) -> "AQTTensorImpl":
        """Impl for codes ``data`` (storage orientation) with scales/zero points per ``block_size``."""
        raise NotImplementedError

    def _with_tensors(self, tensors: dict[str, Optional[torch.Tensor]]) -> "AQTTensorImpl":
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.__dict__.update(tensors)
        return new

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "AQTTensorImpl":
        """Same impl with ``fn`` applied to every tensor (``detach``, ``clone``, ``to(device)``)."""
        return self._with_tensors({k: None if v is None else fn(v) for k, v in self.tensors().items()})

    def t(self) -> "AQTTensorImpl":
        new = self._with_tensors({})
        new.transposed = not self.transposed
        return new

    # -- serialization ----------------------------------------------------------------------
    def portable(self) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
        """``(tensors, state)`` to save: machine-independent storage plus the non-tensor attributes."""
        state = {k: v for k, v in vars(self).items() if k not in self.tensor_names}
        return {k: v for k, v in self.tensors().items() if v is not None}, state

    @classmethod
    def from_portable(cls, tensors: dict[str, torch.Tensor], state: dict[str, object]) -> "AQTTensorImpl":
        """Inverse of :meth:`portable` (no validation beyond the layout's own packing checks)."""
        impl = object.__new__(cls)
        impl.__dict__.update(state)
        impl.__dict__.update({k: tensors.get(k) for k in cls.tensor_names})
        return impl

    @classmethod
    def portable_names(cls) -> tuple[str, ...]:
        """Names of the tensors :meth:`portable` returns."""
        return cls.tensor_names

    def __getstate__(self) -> dict[str, object]:
        tensors, state = self.portable()
        return {**state, "__tensors__": tensors}

    def __deepcopy__(self, memo: dict) -> "AQTTensorImpl":
        # In the process, copy the fields as they are (not through the portable form pickling uses), so that a
        # tensor also referenced elsewhere in the same copy (the quantized tensor exposes its storage's tensors
        # to torch.compile) stays one tensor.
        new = object.__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return new

    def __setstate__(self, state: dict[str, object]) -> None:
        state = dict(state)
        tensors = state.pop("__tensors__")
        self.__dict__.update(type(self).from_portable(tensors, state).__dict__)

    # -- access ------------------------------------------------------------------------------
    def tensors(self) -> dict[str, Optional[torch.Tensor]]:
        return {k: getattr(self, k) for k in self.tensor_names}

    @property
    def device(self) -> torch.device:
        return next(v for v in self.tensors().values() if v is not None).device

    @property
    def nbytes(self) -> int:
        """Bytes held by the impl's tensors (codes, scales, zero points)."""
        return sum(v.numel() * v.element_size() for v in self.tensors().values() if v is not None)

    def storage_plain(self) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """``(codes, scale, zero_point)`` in storage orientation, scale/zero point full rank."""
        raise NotImplementedError

    def storage_qparams(self) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """``(scale, zero_point)`` in storage orientation, full rank, without unpacking codes."""
        return self.scale, getattr(self, "zero_point", None)

    def storage_rows(self, rows: slice | torch.Tensor) -> torch.Tensor:
        """Plain codes of storage rows ``rows`` (dim 0), without unpacking the others."""
        return self.storage_plain()[0][rows]

    def plain(self) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
        """``(codes, scale, zero_point)`` in the tensor's orientation."""
        data, scale, zp = self.storage_plain()
        if not self.transposed:
            return data, scale, zp
        return data.t(), scale.t(), None if zp is None else zp.t()

    def get_plain(self) -> tuple[torch.Tensor, ...]:
        """torchao's accessor: ``(int_data, scale, zero_point)``."""
        return self.plain()

    def get_layout(self) -> Layout:
        return self._layout

    def validate(self, shape: tuple[int, ...], block_size: tuple[int, ...]) -> None:
        """ValueError unless the stored tensors fit codes of storage ``shape`` blocked by ``block_size``.

        For loaders: a file that passes this cannot make later operations read out of bounds.
        """
        nb = num_blocks(shape, block_size)
        for name in ("scale", "zero_point"):
            t = self.tensors().get(name)
            if t is not None and tuple(t.shape) != nb:
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {nb} for shape {shape} and block_size "
                                 f"{block_size}")
            if t is not None and (t.dtype not in _QPARAM_DTYPES or (name == "scale" and not t.is_floating_point())):
                raise ValueError(f"{name} has dtype {t.dtype}; scales are float32/float16/bfloat16/float64 and "
                                 "zero points those or an integer dtype")
        if self.tensors().get("scale", 0) is None:
            raise ValueError("scale is missing")
        for name, expected, dtypes in self._expected(shape):
            t = self.tensors()[name]
            if t is None or tuple(t.shape) != expected or (dtypes and t.dtype not in dtypes):
                got = None if t is None else (tuple(t.shape), t.dtype)
                raise ValueError(f"{name} must have shape {expected}"
                                 + (f" and dtype in {[str(d) for d in dtypes]}" if dtypes else "") + f", got {got}")

    def _expected(self, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...], tuple[torch.dtype, ...]]]:
        """(tensor name, shape, allowed dtypes) of the code tensors for storage ``shape``."""
        return []

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={tuple(v.shape)}:{v.dtype}" for k, v in self.tensors().items() if v is not None)
        return f"{type(self).__name__}({parts}, transposed={self.transposed}, _layout={self._layout})"


class PlainAQTTensorImpl(AQTTensorImpl):
    """Codes one per element (int8, uint8, int16, int32)."""

    tensor_names = ("int_data", "scale", "zero_point")
    layout_type = PlainLayout

    def __init__(self, int_data: torch.Tensor, scale: torch.Tensor, zero_point: Optional[torch.Tensor],
                 layout: Layout = PlainLayout(), transposed: bool = False) -> None:
        super().__init__(layout, transposed)
        self.int_data, self.scale, self.zero_point = int_data, scale, zero_point
        # read by traced code (torch.compile), which cannot look at values; eager code checks the tensor itself
        self.zero_point_is_zero = _all_zero(zero_point)

    @classmethod
    def from_plain(cls, data, scale, zero_point, layout, block_size):
        shape = tuple(data.shape)
        return cls(_aligned_codes(data), full_rank(scale, shape, block_size, "scale"),
                   full_rank(zero_point, shape, block_size, "zero_point"), layout)

    @classmethod
    def from_portable(cls, tensors, state):
        impl = super().from_portable(tensors, {k: v for k, v in state.items() if k != "zero_point_is_zero"})
        if isinstance(impl.int_data, torch.Tensor):
            impl.int_data = _aligned_codes(impl.int_data)
        zp = impl.zero_point
        impl.zero_point_is_zero = (zp is None or isinstance(zp, torch.Tensor)) and _all_zero(zp)
        return impl

    def portable(self):
        tensors, state = super().portable()
        state.pop("zero_point_is_zero", None)  # derived from the tensors: recomputed on load
        return tensors, state

    def storage_plain(self):
        return self.int_data, self.scale, self.zero_point

    def _expected(self, shape):
        return [("int_data", shape, (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64))]


class UintxAQTTensorImpl(AQTTensorImpl):
    """1–7-bit codes packed along the last dimension (:class:`~quanta.dtypes.UintxLayout`)."""

    tensor_names = ("packed", "scale", "zero_point")
    layout_type = UintxLayout

    def __init__(self, packed: torch.Tensor, scale: torch.Tensor, zero_point: Optional[torch.Tensor],
                 layout: UintxLayout, last_dim: int, transposed: bool = False) -> None:
        super().__init__(layout, transposed)
        self.packed, self.scale, self.zero_point, self.last_dim = packed, scale, zero_point, last_dim

    @classmethod
    def from_plain(cls, data, scale, zero_point, layout, block_size):
        shape = tuple(data.shape)
        if data.dim() == 0:
            raise ValueError("UintxLayout needs at least one dimension to pack along")
        lo, hi = layout.code_range
        if data.numel() and (int(data.min()) < lo or int(data.max()) > hi):
            raise ValueError(f"codes must lie in [{lo}, {hi}] for {layout.dtype}, got "
                             f"[{int(data.min())}, {int(data.max())}]")
        codes = (data.to(torch.int16) - lo).to(torch.uint8)
        return cls(pack_bits(codes, layout.bits), full_rank(scale, shape, block_size, "scale"),
                   full_rank(zero_point, shape, block_size, "zero_point"), layout, shape[-1])

    def _unpack(self, packed: torch.Tensor) -> torch.Tensor:
        codes = unpack_bits(packed, self._layout.bits, self.last_dim)
        if not self._layout.signed:
            return codes
        return (codes.to(torch.int16) + self._layout.code_range[0]).to(torch.int8)

    def storage_plain(self):
        return self._unpack(self.packed), self.scale, self.zero_point

    def storage_rows(self, rows):
        return self._unpack(self.packed[rows])

    def _expected(self, shape):
        if not shape or shape[-1] != self.last_dim:
            raise ValueError(f"last_dim {self.last_dim} does not match shape {shape}")
        return [("packed", (*shape[:-1], packed_nbytes(shape[-1], self._layout.bits)), (torch.uint8,))]


class Float8AQTTensorImpl(AQTTensorImpl):
    """float8 elements with float32 scales (:class:`~quanta.dtypes.Float8Layout`)."""

    tensor_names = ("float8_data", "scale")
    layout_type = Float8Layout

    def __init__(self, float8_data: torch.Tensor, scale: torch.Tensor, layout: Float8Layout = Float8Layout(),
                 transposed: bool = False) -> None:
        super().__init__(layout, transposed)
        self.float8_data, self.scale = float8_data, scale

    @classmethod
    def from_plain(cls, data, scale, zero_point, layout, block_size):
        return cls(data, full_rank(scale, tuple(data.shape), block_size, "scale"), layout)

    def storage_plain(self):
        return self.float8_data, self.scale, None

    def _expected(self, shape):
        return [("float8_data", shape, (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                                        torch.float8_e5m2fnuz))]


class FloatxAQTTensorImpl(AQTTensorImpl):
    """fpx codes packed along the last dimension, one scale per row (:class:`~quanta.dtypes.FloatxTensorCoreLayout`)."""

    tensor_names = ("packed", "scale")
    layout_type = FloatxTensorCoreLayout

    def __init__(self, packed: torch.Tensor, scale: torch.Tensor, layout: FloatxTensorCoreLayout, last_dim: int,
                 transposed: bool = False) -> None:
        super().__init__(layout, transposed)
        self.packed, self.scale, self.last_dim = packed, scale, last_dim

    @classmethod
    def from_plain(cls, data, scale, zero_point, layout, block_size):
        shape = tuple(data.shape)
        if len(shape) != 2 or tuple(block_size) != (1, shape[1]):
            raise ValueError(f"fpx codes are 2-D with one scale per row (block_size (1, K)), got shape {shape} "
                             f"and block_size {tuple(block_size)}")
        return cls(pack_bits(data, layout.bits), full_rank(scale, shape, block_size, "scale"), layout, shape[-1])

    def storage_plain(self):
        return unpack_bits(self.packed, self._layout.bits, self.last_dim), self.scale, None

    def storage_rows(self, rows):
        return unpack_bits(self.packed[rows], self._layout.bits, self.last_dim)

    def _expected(self, shape):
        if len(shape) != 2 or shape[-1] != self.last_dim:
            raise ValueError(f"fpx storage is 2-D with last_dim {self.last_dim}, got shape {shape}")
        return [("packed", (shape[0], packed_nbytes(shape[1], self._layout.bits)), (torch.uint8,))]

    def get_plain(self):
        """torchao's accessor for fpx: ``(codes, scale)``."""
        data, scale, _ = self.plain()
        return data, scale


class Int4CPUAQTTensorImpl(AQTTensorImpl):
    """uint4 codes packed for quanta's int4 CPU kernel (:class:`~quanta.dtypes.Int4CPULayout`).

    ``scale_and_zero`` is bf16 ``[ceil(N / 16), ceil(K / group_size), 2, 16]`` (see
    :func:`~quanta.kernels.int_linear.pack_int4_cpu`); ``plain()`` returns
    codes as int32 in [0, 15] and scale/zero point ``[N, K // group_size]``.
    """

    tensor_names = ("packed_weight", "scale_and_zero")
    layout_type = Int4CPULayout

    def __init__(self, packed_weight: torch.Tensor, scale_and_zero: torch.Tensor, layout: Int4CPULayout,
                 shape: tuple[int, int], group_size: int, transposed: bool = False) -> None:
        super().__init__(layout, transposed)
        self.packed_weight, self.scale_and_zero = packed_weight, scale_and_zero
        self.storage_shape, self.group_size = tuple(shape), group_size

    @classmethod
    def from_plain(cls, data, scale, zero_point, layout, block_size):
        if data.dim() != 2 or block_size[0] != 1:
            raise ValueError(f"Int4CPULayout holds 2-D weights with block_size (1, group_size), got shape "
                             f"{tuple(data.shape)} and block_size {block_size}")
        if zero_point is None:
            raise ValueError("Int4CPULayout needs a float-domain zero_point (ZeroPointDomain.FLOAT)")
        shape = tuple(data.shape)
        packed, sz = pack_int4_cpu(data, full_rank(scale, shape, block_size, "scale"),
                                   full_rank(zero_point, shape, block_size, "zero_point"), block_size[1])
        return cls(packed, sz, layout, shape, block_size[1])

    def storage_plain(self):
        n, k = self.storage_shape
        codes, scale, zero = unpack_int4_cpu(self.packed_weight, self.scale_and_zero, self.group_size, n, k)
        return codes.to(torch.int32), scale, zero

    def storage_qparams(self):
        return self.storage_plain()[1:]

    # Files keep the codes (4-bit, pack_bits order), scale and zero, and loading packs them for the
    # kernel: the file format stays independent of the kernel's packing.
    @classmethod
    def portable_names(cls):
        return ("codes", "scale", "zero")

    def portable(self):
        codes, scale, zero = self.storage_plain()
        state = {k: v for k, v in vars(self).items() if k not in self.tensor_names}
        return {"codes": pack_bits(codes.to(torch.uint8), 4), "scale": scale, "zero": zero}, state

    @classmethod
    def from_portable(cls, tensors, state):
        n, k = state["storage_shape"]
        for name in cls.portable_names():
            if not isinstance(tensors.get(name), torch.Tensor):
                raise ValueError(f"Int4CPULayout storage needs a {name!r} tensor")
        codes = unpack_bits(tensors["codes"], 4, k)
        packed, sz = pack_int4_cpu(codes, tensors["scale"], tensors["zero"], state["group_size"])
        impl = object.__new__(cls)
        impl.__dict__.update(state)
        impl.packed_weight, impl.scale_and_zero = packed, sz
        return impl

    def validate(self, shape, block_size):
        if tuple(shape) != self.storage_shape or block_size != (1, self.group_size):
            raise ValueError(f"Int4CPULayout storage is {self.storage_shape} in groups of {self.group_size}, got "
                             f"shape {shape} and block_size {block_size}")
        n, k = self.storage_shape
        check_int4_cpu_shape(n, k, self.group_size)
        expected = [("packed_weight", int4_cpu_packed_shape(n, k), (torch.uint8,)),
                    ("scale_and_zero", int4_cpu_scale_and_zero_shape(n, k, self.group_size), (torch.bfloat16,))]
        for name, shp, dtypes in expected:
            t = getattr(self, name)
            if t is None or tuple(t.shape) != shp or t.dtype not in dtypes:
                raise ValueError(f"{name} must have shape {shp}, got {None if t is None else (tuple(t.shape), t.dtype)}")


_IMPLS: dict[type[Layout], type[AQTTensorImpl]] = {
    PlainLayout: PlainAQTTensorImpl,
    UintxLayout: UintxAQTTensorImpl,
    Float8Layout: Float8AQTTensorImpl,
    FloatxTensorCoreLayout: FloatxAQTTensorImpl,
    Int4CPULayout: Int4CPUAQTTensorImpl,
}


def impl_class_for(layout: Layout) -> type[AQTTensorImpl]:
    """The impl class that stores ``layout``."""
    if not isinstance(layout, Layout):
        raise TypeError(f"_layout must be a quanta.dtypes Layout (PlainLayout(), UintxLayout(torch.uint4), ...), "
                        f"got {layout!r}")
    for cls in type(layout).__mro__:
        if cls in _IMPLS:
            return _IMPLS[cls]
    raise TypeError(f"no storage for layout {layout!r}")
