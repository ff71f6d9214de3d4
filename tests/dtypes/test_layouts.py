"""Layouts and their storage: value objects, exact packing of every code, impl lookup, Int4CPULayout shapes."""

import dataclasses
import math

import pytest
import torch

from quanta.dtypes import (
    AffineQuantizedTensor,
    AQTTensorImpl,
    Float8AQTTensorImpl,
    Float8Layout,
    FloatxAQTTensorImpl,
    FloatxTensorCoreLayout,
    Int4CPUAQTTensorImpl,
    Int4CPULayout,
    Layout,
    PlainAQTTensorImpl,
    PlainLayout,
    UintxAQTTensorImpl,
    UintxLayout,
)
from quanta.dtypes.tensor_impl import impl_class_for
from quanta.quantization import quant_primitives as P
from quanta.quantization.quant_primitives import MappingType, ZeroPointDomain

UINTS = [getattr(torch, f"uint{b}") for b in range(1, 8)]
INTS = [getattr(torch, f"int{b}") for b in range(1, 8)]
G = torch.Generator().manual_seed(99)


# ------------------------------------------------------------------ value objects
def test_layouts_are_frozen_values():
    assert UintxLayout(torch.uint4) == UintxLayout(torch.uint4)
    assert UintxLayout(torch.uint4) != UintxLayout(torch.int4)
    assert hash(UintxLayout(torch.uint4)) == hash(UintxLayout(torch.uint4))
    assert FloatxTensorCoreLayout(3, 2) == FloatxTensorCoreLayout(3, 2) != FloatxTensorCoreLayout(2, 3)
    assert PlainLayout() == PlainLayout() and Int4CPULayout() == Int4CPULayout()
    assert PlainLayout() != Int4CPULayout()
    for layout in (PlainLayout(), UintxLayout(torch.uint4), Float8Layout(), FloatxTensorCoreLayout(3, 2),
                   Int4CPULayout()):
        assert isinstance(layout, Layout)
        with pytest.raises(dataclasses.FrozenInstanceError):
            layout.foo = 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("dtype", UINTS + INTS, ids=str)
def test_uintx_bits_and_sign(dtype):
    name = str(dtype).removeprefix("torch.")
    layout = UintxLayout(dtype)
    assert layout.bits == int(name[-1])
    assert layout.signed == name.startswith("int")
    assert layout.pack_dim == -1


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32, torch.float32, torch.float8_e4m3fn], ids=str)
def test_uintx_rejects_other_dtypes(dtype):
    with pytest.raises(ValueError):
        UintxLayout(dtype)


def test_uintx_pack_dim_must_be_last():
    with pytest.raises(ValueError):
        UintxLayout(torch.uint4, pack_dim=0)


def test_floatx_layout_validation():
    assert FloatxTensorCoreLayout(3, 2).bits == 6
    assert FloatxTensorCoreLayout(4, 3).bits == 8
    assert FloatxTensorCoreLayout(1, 0).bits == 2
    for bad in ((0, 2), (3, -1), (5, 3), (7, 1)):
        with pytest.raises(ValueError):
            FloatxTensorCoreLayout(*bad)
    for bad in ((3.0, 2), (3, True), ("3", 2)):
        with pytest.raises(TypeError):
            FloatxTensorCoreLayout(*bad)


def test_float8_layout_accepts_mm_config():
    assert Float8Layout(mm_config=None) == Float8Layout()
    assert Float8Layout(mm_config="x").mm_config == "x"


# ------------------------------------------------------------------ impl lookup
def test_impl_class_for_each_layout():
    assert impl_class_for(PlainLayout()) is PlainAQTTensorImpl
    assert impl_class_for(UintxLayout(torch.int3)) is UintxAQTTensorImpl
    assert impl_class_for(Float8Layout()) is Float8AQTTensorImpl
    assert impl_class_for(FloatxTensorCoreLayout(3, 2)) is FloatxAQTTensorImpl
    assert impl_class_for(Int4CPULayout()) is Int4CPUAQTTensorImpl
    for cls in (PlainAQTTensorImpl, UintxAQTTensorImpl, Float8AQTTensorImpl, FloatxAQTTensorImpl,
                Int4CPUAQTTensorImpl):
        assert issubclass(cls, AQTTensorImpl)


def test_impl_class_for_subclass_and_unknown_layouts():
    @dataclasses.dataclass(frozen=True)
    class MyPlain(PlainLayout):
        pass

    @dataclasses.dataclass(frozen=True)
    class Unknown(Layout):
        pass

    assert impl_class_for(MyPlain()) is PlainAQTTensorImpl
    with pytest.raises(TypeError):
        impl_class_for(Unknown())
    with pytest.raises(TypeError):
        impl_class_for("PlainLayout")


# ------------------------------------------------------------------ every code survives packing
def _all_codes_tensor(lo, hi, rows=3, k=None):
    """Integer-valued floats covering [lo, hi], shuffled, in rows of k (k odd to exercise the row tail)."""
    codes = torch.arange(lo, hi + 1, dtype=torch.float32)
    k = k or (2 * codes.numel() + 1)
    reps = math.ceil(rows * k / codes.numel())
    flat = codes.repeat(reps)[: rows * k]  # every code while rows * k covers the range
    return flat[torch.randperm(rows * k, generator=G)].reshape(rows, k)


@pytest.mark.parametrize("dtype", UINTS + INTS, ids=str)
@pytest.mark.parametrize("k", [None, 1, 8, 9])
def test_uintx_packing_keeps_every_code(dtype, k):
    layout = UintxLayout(dtype)
    lo, hi = (-(2 ** (layout.bits - 1)), 2 ** (layout.bits - 1) - 1) if layout.signed else (0, 2**layout.bits - 1)
    x = _all_codes_tensor(lo, hi, k=k)
    n, k = x.shape
    # scale 1, zero point 0: the codes are the input values
    scale, zp = torch.ones(n, 1), torch.zeros(n, 1, dtype=torch.int32)
    aqt = AffineQuantizedTensor.from_hp_to_intx_static(x, scale, zp, (1, k), dtype, _layout=layout)
    codes, _, _ = aqt.tensor_impl.get_plain()
    assert codes.dtype == (torch.int8 if layout.signed else torch.uint8)
    assert torch.equal(codes.to(torch.float32), x)
    assert torch.equal(aqt.dequantize(), x)
    assert aqt.tensor_impl.packed.shape == (n, math.ceil(k * layout.bits / 8))
    if k == x.shape[1] and x.numel() >= hi - lo + 1:
        assert set(codes.flatten().tolist()) == set(range(lo, hi + 1))


@pytest.mark.parametrize("dtype", UINTS + INTS, ids=str)
def test_uintx_equals_plain(dtype):
    x = torch.randn(4, 3, 24, generator=G)
    mapping = MappingType.ASYMMETRIC
    plain = AffineQuantizedTensor.from_hp_to_intx(x, mapping, (1, 3, 8), dtype)
    packed = AffineQuantizedTensor.from_hp_to_intx(x, mapping, (1, 3, 8), dtype, _layout=UintxLayout(dtype))
    assert torch.equal(packed.dequantize(), plain.dequantize())
    assert torch.equal(packed.tensor_impl.get_plain()[0], plain.tensor_impl.get_plain()[0])
    assert packed.storage_nbytes < plain.storage_nbytes


def test_uintx_impl_rejects_codes_out_of_range():
    with pytest.raises(ValueError):
        UintxAQTTensorImpl.from_plain(torch.tensor([[0, 16]], dtype=torch.uint8), torch.ones(1, 1), None,
                                      UintxLayout(torch.uint4), (1, 2))
    with pytest.raises(ValueError):
        UintxAQTTensorImpl.from_plain(torch.tensor([[-9, 0]], dtype=torch.int8), torch.ones(1, 1), None,
                                      UintxLayout(torch.int4), (1, 2))
    with pytest.raises(ValueError):  # a scale per block
        UintxAQTTensorImpl.from_plain(torch.tensor([[0, 1]], dtype=torch.uint8), torch.ones(2), None,
                                      UintxLayout(torch.uint4), (1, 2))


@pytest.mark.parametrize("ebits, mbits", [(2, 1), (2, 2), (3, 2), (2, 3), (4, 3), (5, 2), (1, 0), (3, 0)])
def test_fpx_packing_keeps_every_code(ebits, mbits):
    bits = 1 + ebits + mbits
    values = P.fpx_to_float(torch.arange(2**bits, dtype=torch.uint8), ebits, mbits)
    x = values[torch.randperm(values.numel(), generator=G)].repeat(3, 1)  # every value, incl. +-max: scale 1
    aqt = AffineQuantizedTensor.from_hp_to_fpx(x, FloatxTensorCoreLayout(ebits, mbits))
    codes, scale = aqt.tensor_impl.get_plain()
    assert torch.equal(scale.reshape(-1), torch.ones(3))
    assert torch.equal(P.fpx_to_float(codes, ebits, mbits), x)
    assert torch.equal(aqt.dequantize(), x)
    assert aqt.tensor_impl.packed.shape == (3, math.ceil(x.shape[1] * bits / 8))


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2], ids=str)
def test_float8_layout_keeps_codes(fp8):
    x = torch.randn(4, 16, generator=G) * 3
    aqt = AffineQuantizedTensor.from_hp_to_floatx(x, (1, 16), fp8)
    assert aqt.tensor_impl.float8_data.dtype == fp8
    assert aqt.tensor_impl.get_layout() == Float8Layout()


# ------------------------------------------------------------------ Int4CPULayout
def _int4_cpu(n, k, group, x=None):
    x = torch.randn(n, k, generator=G) if x is None else x
    return AffineQuantizedTensor.from_hp_to_intx(x, MappingType.ASYMMETRIC, (1, group), torch.int32, 0, 15,
                                                 zero_point_dtype=torch.float32, preserve_zero=False,
                                                 zero_point_domain=ZeroPointDomain.FLOAT, _layout=Int4CPULayout())


@pytest.mark.parametrize("n", [16, 32, 48, 64, 80, 128])
@pytest.mark.parametrize("group", [32, 64, 128, 256])
def test_int4_cpu_codes_round_trip(n, group):
    k = 256
    codes = torch.randint(0, 16, (n, k), generator=G, dtype=torch.int32)
    codes[0, :16] = torch.arange(16)
    scale = torch.rand(n, k // group, generator=G) + 0.5
    zero = torch.randn(n, k // group, generator=G)
    impl = Int4CPUAQTTensorImpl.from_plain(codes, scale, zero, Int4CPULayout(), (1, group))
    got, s, z = impl.get_plain()
    assert torch.equal(got.to(torch.int32), codes)
    assert torch.equal(s, scale.to(torch.bfloat16)) and torch.equal(z, zero.to(torch.bfloat16))
    assert impl.packed_weight.dtype == torch.uint8 and impl.packed_weight.numel() == n * k // 2
    assert impl.scale_and_zero.shape == (n // 16, k // group, 2, 16)


def test_int4_cpu_impl_needs_zero_point_and_2d():
    with pytest.raises(ValueError):
        Int4CPUAQTTensorImpl.from_plain(torch.zeros(16, 32, dtype=torch.int32), torch.ones(16, 1), None,
                                        Int4CPULayout(), (1, 32))
    with pytest.raises(ValueError):
        Int4CPUAQTTensorImpl.from_plain(torch.zeros(2, 16, 32, dtype=torch.int32), torch.ones(2, 16, 1),
                                        torch.zeros(2, 16, 1), Int4CPULayout(), (1, 1, 32))


def test_get_plain_and_layout_accessors():
    x = torch.randn(16, 64, generator=G)
    aqt = _int4_cpu(16, 64, 32, x)
    assert aqt.tensor_impl.get_layout() == Int4CPULayout()
    codes, scale, zero = aqt.tensor_impl.get_plain()
    assert codes.shape == (16, 64) and scale.shape == zero.shape == (16, 2)
    assert int(codes.min()) >= 0 and int(codes.max()) <= 15
    # transposed: get_plain is in the tensor's orientation
    codes_t, scale_t, zero_t = aqt.t().tensor_impl.get_plain()
    assert torch.equal(codes_t, codes.t()) and torch.equal(scale_t, scale.t()) and torch.equal(zero_t, zero.t())
    fpx = AffineQuantizedTensor.from_hp_to_fpx(x, FloatxTensorCoreLayout(3, 2))
    assert len(fpx.tensor_impl.get_plain()) == 2  # torchao's (codes, scale) for fpx


def test_impl_repr_names_tensors():
    aqt = _int4_cpu(16, 64, 32)
    text = repr(aqt.tensor_impl)
    assert "Int4CPUAQTTensorImpl" in text and "packed_weight" in text and "scale_and_zero" in text
