"""AffineQuantizedTensor: constructors (seed 003), fields, dequantize vs quant_primitives, bytes, to/clone/copy_."""

import math
import subprocess
import sys

import pytest
import torch

from quanta.dtypes import (
    AffineQuantizedTensor,
    Float8Layout,
    FloatxTensorCoreLayout,
    Int4CPULayout,
    PlainLayout,
    UintxLayout,
    to_affine_quantized_floatx,
    to_affine_quantized_floatx_static,
    to_affine_quantized_fpx,
    to_affine_quantized_intx,
    to_affine_quantized_intx_static,
)
from quanta.dtypes.hqq import choose_qparams_and_quantize_hqq
from quanta.quantization import quant_primitives as P
from quanta.quantization.quant_primitives import MappingType, ZeroPointDomain

G = torch.Generator().manual_seed(1234)
SYM, NOCLIP, ASYM = MappingType.SYMMETRIC, MappingType.SYMMETRIC_NO_CLIPPING_ERR, MappingType.ASYMMETRIC
INT, FLOAT, NONE = ZeroPointDomain.INT, ZeroPointDomain.FLOAT, ZeroPointDomain.NONE
SUB_BYTE = [getattr(torch, f"uint{b}") for b in range(1, 8)] + [getattr(torch, f"int{b}") for b in range(1, 8)]


def randn(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=G) * scale).to(dtype)


def dtype_range(dtype):
    name = str(dtype).removeprefix("torch.")
    if dtype in SUB_BYTE:
        bits = int(name[-1])
        return (0, 2**bits - 1) if name.startswith("uint") else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    info = torch.iinfo(dtype)
    return info.min, info.max


def reference_intx(x, mapping, block, target, qmin=None, qmax=None, eps=None, scale_dtype=None, zp_dtype=None,
                   preserve_zero=True, domain=INT):
    """codes, scale, zero point and dequantized values straight from quant_primitives."""
    s, zp = P.choose_qparams_affine(x, mapping, block, target, qmin, qmax, eps, scale_dtype, zp_dtype,
                                    preserve_zero=preserve_zero, zero_point_domain=domain)
    q = P.quantize_affine(x, block, s, zp, target, qmin, qmax, zero_point_domain=domain)
    deq = P.dequantize_affine(q, block, s, zp, target, qmin, qmax, output_dtype=x.dtype, zero_point_domain=domain)
    return q, s, zp, deq


def check_codes(aqt, q, s, zp):
    codes, scale, zero = aqt.tensor_impl.get_plain()
    assert codes.shape == q.shape
    assert torch.equal(codes.to(torch.int64), q.to(torch.int64))
    assert torch.equal(scale.reshape(-1), s.reshape(-1))
    if zp is None:
        assert zero is None
    else:
        assert torch.equal(zero.reshape(-1), zp.reshape(-1))


# ------------------------------------------------------------------ import
def test_import_quanta_dtypes_first():
    """quanta.dtypes and quanta.quantization import each other's modules: either may be imported first."""
    for first in ("quanta.dtypes", "quanta.quantization.quant_api"):
        out = subprocess.run([sys.executable, "-c", f"import {first}"], check=False, capture_output=True, text=True,
                             timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]


def test_torchao_aliases():
    assert to_affine_quantized_intx == AffineQuantizedTensor.from_hp_to_intx
    assert to_affine_quantized_intx_static == AffineQuantizedTensor.from_hp_to_intx_static
    assert to_affine_quantized_floatx == AffineQuantizedTensor.from_hp_to_floatx
    assert to_affine_quantized_floatx_static == AffineQuantizedTensor.from_hp_to_floatx_static
    assert to_affine_quantized_fpx == AffineQuantizedTensor.from_hp_to_fpx


# ------------------------------------------------------------------ from_hp_to_intx: every mapping, domain, dtype
def _intx_cases():
    cases = []
    for mapping in (SYM, NOCLIP, ASYM):
        domains = (INT, NONE, FLOAT) if mapping is ASYM else (INT, NONE)
        for domain in domains:
            for pz in ((True, False) if mapping is ASYM else (True,)):
                for target in (torch.int8, torch.uint8, torch.int4, torch.uint4, torch.int2, torch.uint3):
                    cases.append((mapping, domain, pz, target, None, None))
                cases.append((mapping, domain, pz, torch.int32, -8, 7))
                cases.append((mapping, domain, pz, torch.int32, 0, 15))
                cases.append((mapping, domain, pz, torch.uint8, 0, 15))
                cases.append((mapping, domain, pz, torch.int8, -100, 27))
    return cases


def _layouts_for(target, qmin, qmax):
    """PlainLayout, and the narrowest signed and unsigned UintxLayout that hold codes in [qmin, qmax]."""
    lo, hi = (qmin, qmax) if qmin is not None else dtype_range(target)
    out = [PlainLayout()]
    for prefix in ("uint", "int"):
        for bits in range(1, 8):
            d = getattr(torch, f"{prefix}{bits}")
            dlo, dhi = dtype_range(d)
            if dlo <= lo and hi <= dhi:
                out.append(UintxLayout(d))
                break
    return out


@pytest.mark.parametrize("mapping, domain, preserve_zero, target, qmin, qmax", _intx_cases(),
                         ids=lambda v: str(v).replace("torch.", "").replace("MappingType.", "")
                         .replace("ZeroPointDomain.", ""))
@pytest.mark.parametrize("shape, block", [((8, 64), (1, 16)), ((8, 64), (8, 64)), ((2, 4, 32), (1, 2, 32)),
                                          ((8, 12), (4, 1))])
def test_from_hp_to_intx_matches_primitives(mapping, domain, preserve_zero, target, qmin, qmax, shape, block):
    x = randn(*shape, scale=3.0) + 0.5
    q, s, zp, deq = reference_intx(x, mapping, block, target, qmin, qmax, preserve_zero=preserve_zero, domain=domain)
    lo, hi = P._get_and_check_qmin_qmax(target, qmin, qmax)
    for layout in _layouts_for(target, qmin, qmax):
        aqt = AffineQuantizedTensor.from_hp_to_intx(x, mapping, block, target, qmin, qmax, preserve_zero=preserve_zero,
                                                    zero_point_domain=domain, _layout=layout)
        assert type(aqt) is AffineQuantizedTensor
        assert aqt.tensor_impl.get_layout() == layout
        assert (aqt.shape, aqt.dtype, aqt.block_size) == (x.shape, x.dtype, block)
        assert (aqt.quant_min, aqt.quant_max, aqt.zero_point_domain) == (lo, hi, domain)
        assert aqt.requires_grad is False
        check_codes(aqt, q, s, zp)
        assert torch.equal(aqt.dequantize(), deq), layout


@pytest.mark.parametrize("target", SUB_BYTE, ids=str)
@pytest.mark.parametrize("mapping", [SYM, ASYM], ids=str)
def test_every_sub_byte_dtype_plain_and_packed(target, mapping):
    x = randn(6, 40, scale=2.0)
    block = (1, 8)
    q, s, zp, deq = reference_intx(x, mapping, block, target)
    for layout in (PlainLayout(), UintxLayout(target)):
        aqt = AffineQuantizedTensor.from_hp_to_intx(x, mapping, block, target, _layout=layout)
        check_codes(aqt, q, s, zp)
        assert torch.equal(aqt.dequantize(), deq)
        assert (aqt.quant_min, aqt.quant_max) == dtype_range(target)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_input_dtypes(dtype):
    x = randn(8, 32, dtype=dtype)
    deq = reference_intx(x, ASYM, (1, 16), torch.uint4)[3]
    for layout in (PlainLayout(), UintxLayout(torch.uint4)):
        aqt = AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 16), torch.uint4, _layout=layout)
        assert aqt.dtype == dtype
        assert aqt.dequantize().dtype == dtype
        assert torch.equal(aqt.dequantize(), deq)


def test_eps_scale_dtype_zero_point_dtype_are_passed_on():
    x = randn(4, 32) * 1e-6
    for kwargs in ({"eps": 1e-3}, {"scale_dtype": torch.float16}, {"scale_dtype": torch.bfloat16},
                   {"zero_point_dtype": torch.int64}, {"zero_point_dtype": torch.float32}):
        q, s, zp, deq = reference_intx(x, ASYM, (1, 8), torch.uint8, eps=kwargs.get("eps"),
                                       scale_dtype=kwargs.get("scale_dtype"), zp_dtype=kwargs.get("zero_point_dtype"))
        aqt = AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 8), torch.uint8, **kwargs)
        check_codes(aqt, q, s, zp)
        _, scale, zero = aqt.tensor_impl.get_plain()
        assert scale.dtype == s.dtype and zero.dtype == zp.dtype
        assert torch.equal(aqt.dequantize(), deq)
    big = AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 8), torch.uint8, eps=1e-3)
    assert bool((big.tensor_impl.get_plain()[1] >= 1e-3).all())


def test_block_size_minus_one_means_whole_dim():
    x = randn(4, 24)
    aqt = AffineQuantizedTensor.from_hp_to_intx(x, SYM, (1, -1), torch.int8)
    assert aqt.block_size == (1, 24)
    assert torch.equal(aqt.dequantize(), reference_intx(x, SYM, (1, 24), torch.int8)[3])


def test_one_dim_and_per_element_blocks():
    x = randn(30)
    for block in ((30,), (5,), (1,)):
        for layout in (PlainLayout(), UintxLayout(torch.int5)):
            aqt = AffineQuantizedTensor.from_hp_to_intx(x, SYM, block, torch.int5, _layout=layout)
            assert torch.equal(aqt.dequantize(), reference_intx(x, SYM, block, torch.int5)[3])


def test_zero_input_dequantizes_to_zero():
    for layout in (PlainLayout(), UintxLayout(torch.uint4)):
        aqt = AffineQuantizedTensor.from_hp_to_intx(torch.zeros(4, 16), ASYM, (1, 16), torch.uint4, _layout=layout)
        assert torch.equal(aqt.dequantize(), torch.zeros(4, 16))


# ------------------------------------------------------------------ Int4CPULayout and HQQ
INT4_CPU_SHAPES = [(16, 32, 32), (32, 128, 64), (48, 256, 128), (16, 256, 256)]


@pytest.mark.parametrize("n, k, group", INT4_CPU_SHAPES)
@pytest.mark.parametrize("target", [torch.int32, torch.uint4], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_int4_cpu_layout_matches_primitives(n, k, group, target, dtype):
    x = randn(n, k, dtype=dtype)
    block = (1, group)
    q, s, zp, _ = reference_intx(x, ASYM, block, target, 0, 15, zp_dtype=dtype, preserve_zero=False, domain=FLOAT)
    aqt = AffineQuantizedTensor.from_hp_to_intx(x, ASYM, block, target, 0, 15, zero_point_dtype=dtype,
                                                preserve_zero=False, zero_point_domain=FLOAT, _layout=Int4CPULayout())
    assert (aqt.quant_min, aqt.quant_max, aqt.zero_point_domain) == (0, 15, FLOAT)
    codes, scale, zero = aqt.tensor_impl.get_plain()
    assert torch.equal(codes.to(torch.int64), q.to(torch.int64))
    # the kernel keeps scale and zero in bfloat16: dequantize must use exactly those
    s16, z16 = s.to(torch.bfloat16), zp.to(torch.bfloat16)
    assert torch.equal(scale.reshape(-1), s16.reshape(-1)) and torch.equal(zero.reshape(-1), z16.reshape(-1))
    expected = P.dequantize_affine(q, block, s16.reshape(n, -1), z16.reshape(n, -1), target, 0, 15,
                                   output_dtype=dtype, zero_point_domain=FLOAT)
    assert torch.equal(aqt.dequantize(), expected)


@pytest.mark.parametrize("n, k", [(8, 64), (7, 96), (1, 32)])
def test_int4_cpu_layout_takes_any_number_of_rows(n, k):
    x = randn(n, k)
    aqt = AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 32), torch.int32, 0, 15, zero_point_dtype=torch.float32,
                                                preserve_zero=False, zero_point_domain=FLOAT, _layout=Int4CPULayout())
    y = torch.nn.functional.linear(torch.randn(3, k), aqt)
    assert y.shape == (3, n)


@pytest.mark.parametrize("n, k, group", [(16, 48, 32), (16, 64, 16)])
def test_int4_cpu_layout_rejects_shapes_the_kernel_cannot_take(n, k, group):
    with pytest.raises(ValueError):
        AffineQuantizedTensor.from_hp_to_intx(randn(n, k), ASYM, (1, group), torch.int32, 0, 15,
                                              zero_point_dtype=torch.float32, preserve_zero=False,
                                              zero_point_domain=FLOAT, _layout=Int4CPULayout())


def test_int4_cpu_layout_needs_float_domain_and_uint4_range():
    x = randn(16, 64)
    with pytest.raises(ValueError):
        AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 32), torch.int32, 0, 15, _layout=Int4CPULayout())
    with pytest.raises(ValueError):
        AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 32), torch.int8, zero_point_domain=FLOAT,
                                              _layout=Int4CPULayout())
    with pytest.raises(ValueError):  # 2-D only, groups along rows
        AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (2, 32), torch.int32, 0, 15, zero_point_dtype=torch.float32,
                                              zero_point_domain=FLOAT, _layout=Int4CPULayout())


@pytest.mark.parametrize("target, layout", [(torch.uint4, UintxLayout(torch.uint4)), (torch.uint3, PlainLayout()),
                                            (torch.int32, Int4CPULayout()), (torch.uint2, UintxLayout(torch.uint2))],
                         ids=str)
def test_use_hqq(target, layout):
    x = randn(16, 64)
    qmax = 15 if target is torch.int32 else dtype_range(target)[1]
    aqt = AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 32), target, 0, qmax if target is torch.int32 else None,
                                                zero_point_domain=FLOAT, _layout=layout, use_hqq=True)
    q, s, zp = choose_qparams_and_quantize_hqq(x, (1, 32), target, 0, qmax)
    if isinstance(layout, Int4CPULayout):
        s, zp = s.to(torch.bfloat16), zp.to(torch.bfloat16)
    check_codes(aqt, q, s, zp)
    expected = P.dequantize_affine(q, (1, 32), s.reshape(16, 2), zp.reshape(16, 2), target, 0, qmax,
                                   zero_point_domain=FLOAT)
    assert torch.equal(aqt.dequantize(), expected)


@pytest.mark.parametrize("kwargs", [{"mapping_type": SYM, "zero_point_domain": FLOAT},
                                    {"mapping_type": ASYM, "zero_point_domain": INT},
                                    {"mapping_type": ASYM, "zero_point_domain": FLOAT, "quant_min": 1}], ids=str)
def test_use_hqq_needs_asymmetric_float_domain(kwargs):
    with pytest.raises(ValueError):
        AffineQuantizedTensor.from_hp_to_intx(randn(4, 32), block_size=(1, 32), target_dtype=torch.uint4,
                                              use_hqq=True, **kwargs)


# ------------------------------------------------------------------ static
@pytest.mark.parametrize("domain", [INT, FLOAT, NONE], ids=str)
@pytest.mark.parametrize("layout", [PlainLayout(), UintxLayout(torch.int4)], ids=str)
def test_from_hp_to_intx_static(domain, layout):
    x = randn(4, 32)
    scale = torch.rand(4, 2, generator=G) * 0.2 + 0.05
    zp = {INT: torch.randint(-2, 3, (4, 2), generator=G), FLOAT: randn(4, 2) * 0.1, NONE: None}[domain]
    aqt = AffineQuantizedTensor.from_hp_to_intx_static(x, scale, zp, (1, 16), torch.int4, zero_point_domain=domain,
                                                       _layout=layout)
    q = P.quantize_affine(x, (1, 16), scale, zp, torch.int4, zero_point_domain=domain)
    deq = P.dequantize_affine(q, (1, 16), scale, zp, torch.int4, zero_point_domain=domain)
    check_codes(aqt, q, scale, zp)
    assert torch.equal(aqt.dequantize(), deq)
    assert (aqt.quant_min, aqt.quant_max) == (-8, 7)


def test_from_hp_to_intx_static_with_range_and_errors():
    x = torch.tensor([[0.1, -0.26, 3.0, -3.0]])
    aqt = AffineQuantizedTensor.from_hp_to_intx_static(x, torch.tensor([0.1]), torch.tensor([2]), (1, 4), torch.int8,
                                                       -8, 7)
    # by hand: round(x / 0.1) + 2 clamped to [-8, 7] = [3, -1, 7, -8]; (q - 2) * 0.1
    assert aqt.tensor_impl.get_plain()[0].tolist() == [[3, -1, 7, -8]]
    assert torch.allclose(aqt.dequantize(), torch.tensor([[0.1, -0.3, 0.5, -1.0]]))
    with pytest.raises(ValueError):  # zero point given with NONE
        AffineQuantizedTensor.from_hp_to_intx_static(x, torch.tensor([0.1]), torch.tensor([2]), (1, 4), torch.int8,
                                                     zero_point_domain=NONE)
    with pytest.raises(ValueError):  # one scale per block
        AffineQuantizedTensor.from_hp_to_intx_static(x, torch.tensor([0.1, 0.2]), None, (1, 4), torch.int8)


# ------------------------------------------------------------------ float8
FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("fp8", FP8, ids=str)
@pytest.mark.parametrize("shape, block", [((8, 32), (1, 32)), ((8, 32), (8, 32)), ((8, 32), (2, 16)),
                                          ((2, 4, 16), (1, 1, 16)), ((32,), (8,))])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_from_hp_to_floatx(fp8, shape, block, dtype):
    x = randn(*shape, dtype=dtype, scale=100.0)
    s = P.choose_qparams_affine_float8(x, block, fp8)
    q = P.quantize_affine_float8(x, s, fp8)
    deq = P.dequantize_affine_float8(q, s, output_dtype=dtype)
    aqt = AffineQuantizedTensor.from_hp_to_floatx(x, block, fp8, Float8Layout())
    assert (aqt.shape, aqt.dtype, aqt.block_size) == (x.shape, dtype, block)
    assert aqt.tensor_impl.get_layout() == Float8Layout()
    codes, scale, zero = aqt.tensor_impl.get_plain()
    assert codes.dtype == fp8 and zero is None
    assert torch.equal(codes.view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(scale.reshape(-1), s.reshape(-1))
    assert torch.equal(aqt.dequantize(), deq)
    # static with the same scale gives the same tensor
    st = AffineQuantizedTensor.from_hp_to_floatx_static(x, s, block, fp8, Float8Layout())
    assert torch.equal(st.dequantize(), deq)


def test_float8_zero_block_is_zero_not_nan():
    x = torch.zeros(4, 16)
    x[0] = randn(16)
    aqt = AffineQuantizedTensor.from_hp_to_floatx(x, (1, 16), torch.float8_e4m3fn)
    out = aqt.dequantize()
    assert not out.isnan().any()
    assert torch.equal(out[1:], torch.zeros(3, 16))


def test_float8_errors():
    x = randn(4, 16)
    with pytest.raises(ValueError):
        AffineQuantizedTensor.from_hp_to_floatx(x, (1, 16), torch.int8)
    with pytest.raises(TypeError):
        AffineQuantizedTensor.from_hp_to_floatx(x, (1, 16), torch.float8_e4m3fn, PlainLayout())
    with pytest.raises(ValueError):
        AffineQuantizedTensor.from_hp_to_floatx(x, (1, 16), torch.float8_e4m3fn, scale_dtype=torch.float16)
    with pytest.raises(ValueError):
        AffineQuantizedTensor.from_hp_to_floatx(x, (1, 5), torch.float8_e4m3fn)
    with pytest.raises(ValueError):  # the float8 layout is not for integer codes
        AffineQuantizedTensor.from_hp_to_intx(x, SYM, (1, 16), torch.int8, _layout=Float8Layout())


# ------------------------------------------------------------------ fpx
FPX_FORMATS = [(2, 1), (2, 2), (3, 2), (2, 3), (4, 3), (5, 2), (1, 1), (3, 0)]


@pytest.mark.parametrize("ebits, mbits", FPX_FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_from_hp_to_fpx(ebits, mbits, dtype):
    x = randn(6, 20, dtype=dtype, scale=4.0)
    s = P.choose_qparams_affine_fpx(x, ebits, mbits)
    codes = P.quantize_affine_fpx(x, s, ebits, mbits)
    deq = P.dequantize_affine_fpx(codes, s, ebits, mbits, output_dtype=dtype)
    layout = FloatxTensorCoreLayout(ebits, mbits)
    aqt = AffineQuantizedTensor.from_hp_to_fpx(x, layout)
    assert (aqt.shape, aqt.dtype, aqt.block_size) == (x.shape, dtype, (1, 20))
    got_codes, got_scale = aqt.tensor_impl.get_plain()
    assert torch.equal(got_codes, codes)
    assert torch.equal(got_scale.reshape(-1), s.reshape(-1))
    assert torch.equal(aqt.dequantize(), deq)


def test_fpx_errors():
    with pytest.raises(ValueError):
        AffineQuantizedTensor.from_hp_to_fpx(randn(2, 3, 4), FloatxTensorCoreLayout(3, 2))
    with pytest.raises(TypeError):
        AffineQuantizedTensor.from_hp_to_fpx(randn(2, 4), UintxLayout(torch.uint6))
    with pytest.raises(ValueError):  # float codes need from_hp_to_fpx
        AffineQuantizedTensor.from_hp_to_intx(randn(2, 4), SYM, (1, 4), torch.int8,
                                              _layout=FloatxTensorCoreLayout(3, 2))
    with pytest.raises(ValueError):
        AffineQuantizedTensor.from_hp_to_fpx(torch.tensor([[1.0, float("nan")]]), FloatxTensorCoreLayout(3, 2))


# ------------------------------------------------------------------ constructor argument errors
def test_constructor_argument_errors():
    x = randn(4, 16)
    with pytest.raises(TypeError):
        AffineQuantizedTensor.from_hp_to_intx(x.tolist(), SYM, (1, 16), torch.int8)
    with pytest.raises(TypeError):
        AffineQuantizedTensor.from_hp_to_intx(torch.ones(4, 16, dtype=torch.int32), SYM, (1, 16), torch.int8)
    aqt = AffineQuantizedTensor.from_hp_to_intx(x, SYM, (1, 16), torch.int8)
    with pytest.raises(TypeError):
        AffineQuantizedTensor.from_hp_to_intx(aqt, SYM, (1, 16), torch.int8)
    with pytest.raises(ValueError):
        AffineQuantizedTensor.from_hp_to_intx(x, SYM, (16,), torch.int8)
    with pytest.raises(ValueError):
        AffineQuantizedTensor.from_hp_to_intx(x, SYM, (1, 5), torch.int8)
    with pytest.raises(TypeError):
        AffineQuantizedTensor.from_hp_to_intx(x, SYM, "1,16", torch.int8)
    with pytest.raises(TypeError):
        AffineQuantizedTensor.from_hp_to_intx(x, SYM, (1, 16), torch.int8, _layout="plain")
    with pytest.raises(TypeError):
        AffineQuantizedTensor.from_hp_to_intx(x, "symmetric", (1, 16), torch.int8)
    with pytest.raises(ValueError):  # codes of int8 do not fit 4 bits
        AffineQuantizedTensor.from_hp_to_intx(x, SYM, (1, 16), torch.int8, _layout=UintxLayout(torch.int4))
    with pytest.raises(ValueError):  # signed codes do not fit an unsigned layout
        AffineQuantizedTensor.from_hp_to_intx(x, SYM, (1, 16), torch.int4, _layout=UintxLayout(torch.uint4))
    with pytest.raises(TypeError):
        AffineQuantizedTensor(aqt.tensor_impl, (1, 16), x.shape, zero_point_domain=None)
    with pytest.raises(TypeError):
        AffineQuantizedTensor(aqt.tensor_impl, (1, 16), x.shape, dtype=torch.int8)
    with pytest.raises(TypeError):
        AffineQuantizedTensor("impl", (1, 16), x.shape)


def test_direct_construction_matches_seed_signature():
    x = randn(4, 16)
    aqt = AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 8), torch.uint8)
    again = AffineQuantizedTensor(aqt.tensor_impl, aqt.block_size, aqt.shape, aqt.quant_min, aqt.quant_max,
                                  aqt.zero_point_domain, dtype=aqt.dtype)
    assert torch.equal(again.dequantize(), aqt.dequantize())
    assert "AffineQuantizedTensor" in repr(aqt) and "block_size=(1, 8)" in repr(aqt)


# ------------------------------------------------------------------ bytes
def test_int4_packed_bytes():
    n, k, g = 24, 64, 16
    aqt = AffineQuantizedTensor.from_hp_to_intx(randn(n, k), SYM, (1, g), torch.int4, zero_point_domain=NONE,
                                                _layout=UintxLayout(torch.int4))
    assert aqt.tensor_impl.packed.dtype == torch.uint8
    assert aqt.tensor_impl.packed.numel() == n * k // 2
    assert aqt.storage_nbytes == n * k // 2 + n * (k // g) * 4  # codes + float32 scales, no zero point
    with_zp = AffineQuantizedTensor.from_hp_to_intx(randn(n, k), ASYM, (1, g), torch.uint4, zero_point_dtype=torch.int8,
                                                    _layout=UintxLayout(torch.uint4))
    assert with_zp.storage_nbytes == n * k // 2 + n * (k // g) * (4 + 1)
    assert aqt.nbytes == n * k * 4  # the float view's size, as torch reports it


@pytest.mark.parametrize("bits", range(1, 8))
@pytest.mark.parametrize("k", [20, 64, 7])
def test_sub_byte_packed_bytes(bits, k):
    n = 5
    dtype = getattr(torch, f"uint{bits}")
    aqt = AffineQuantizedTensor.from_hp_to_intx(randn(n, k), ASYM, (1, k), dtype, zero_point_domain=NONE,
                                                _layout=UintxLayout(dtype))
    assert tuple(aqt.tensor_impl.packed.shape) == (n, math.ceil(k * bits / 8))
    assert aqt.storage_nbytes == n * math.ceil(k * bits / 8) + n * 4


def test_uint3_row_bytes():
    aqt = AffineQuantizedTensor.from_hp_to_intx(randn(3, 20), ASYM, (1, 20), torch.uint3,
                                                _layout=UintxLayout(torch.uint3))
    assert aqt.tensor_impl.packed.shape == (3, 8)  # ceil(20 * 3 / 8) = 8 bytes a row


@pytest.mark.parametrize("ebits, mbits", [(3, 2), (2, 2), (2, 1), (4, 3)])
def test_fpx_packed_bytes(ebits, mbits):
    n, k = 6, 20
    aqt = AffineQuantizedTensor.from_hp_to_fpx(randn(n, k), FloatxTensorCoreLayout(ebits, mbits))
    bits = 1 + ebits + mbits
    assert tuple(aqt.tensor_impl.packed.shape) == (n, math.ceil(k * bits / 8))
    assert aqt.storage_nbytes == n * math.ceil(k * bits / 8) + n * 4


def test_int8_plain_and_float8_and_int4_cpu_bytes():
    n, k = 16, 64
    a = AffineQuantizedTensor.from_hp_to_intx(randn(n, k), SYM, (1, k), torch.int8, zero_point_domain=NONE)
    assert a.tensor_impl.int_data.dtype == torch.int8
    assert a.storage_nbytes == n * k + n * 4
    f = AffineQuantizedTensor.from_hp_to_floatx(randn(n, k), (1, k), torch.float8_e4m3fn)
    assert f.storage_nbytes == n * k + n * 4
    i4 = AffineQuantizedTensor.from_hp_to_intx(randn(n, k), ASYM, (1, 32), torch.int32, 0, 15,
                                               zero_point_dtype=torch.float32, preserve_zero=False,
                                               zero_point_domain=FLOAT, _layout=Int4CPULayout())
    assert i4.storage_nbytes == n * k // 2 + n * (k // 32) * 2 * 2  # bf16 scale and zero per group


# ------------------------------------------------------------------ .to / detach / clone / copy_
def _int8(x=None):
    return AffineQuantizedTensor.from_hp_to_intx(randn(8, 32) if x is None else x, ASYM, (1, 16), torch.int8)


def test_to_returns_self_when_nothing_changes():
    a = _int8()
    assert a.to("cpu") is a
    assert a.to(torch.device("cpu")) is a
    assert a.to(torch.float32) is a
    assert a.to("cpu", torch.float32) is a
    assert a.to(torch.zeros(1)) is a
    assert a.float() is a
    assert a.cpu() is a


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_to_dtype_changes_dequantize_dtype(dtype):
    a = _int8()
    q, s, zp = a.tensor_impl.get_plain()
    b = a.to(dtype)
    assert type(b) is AffineQuantizedTensor and b.dtype == dtype and a.dtype == torch.float32
    expected = P.dequantize_affine(q, (1, 16), s, zp, torch.int8, output_dtype=dtype)
    assert torch.equal(b.dequantize(), expected)
    assert torch.equal(a.to(device="cpu", dtype=dtype).dequantize(), expected)
    assert torch.equal(a.to(torch.zeros(1, dtype=dtype)).dequantize(), expected)
    assert torch.equal(a.dequantize(dtype), expected)
    assert torch.equal(b.to(torch.float32).dequantize(), a.dequantize())


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.uint8, torch.bool], ids=str)
def test_to_integer_dtype_raises(dtype):
    with pytest.raises(TypeError):
        _int8().to(dtype)
    with pytest.raises(TypeError):
        _int8().dequantize(dtype)


def test_to_copy_gives_independent_storage():
    a = _int8()
    b = a.to("cpu", copy=True)
    assert b is not a and type(b) is AffineQuantizedTensor
    assert b.tensor_impl.int_data.data_ptr() != a.tensor_impl.int_data.data_ptr()
    assert torch.equal(b.dequantize(), a.dequantize())


def test_detach_and_requires_grad():
    a = _int8()
    assert a.requires_grad is False
    d = a.detach()
    assert type(d) is AffineQuantizedTensor and d.requires_grad is False
    assert torch.equal(d.dequantize(), a.dequantize())
    p = torch.nn.Parameter(a, requires_grad=False)
    assert isinstance(p, AffineQuantizedTensor) and not p.requires_grad


@pytest.mark.parametrize("make", [
    lambda x: AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 16), torch.int8),
    lambda x: AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 16), torch.uint4, _layout=UintxLayout(torch.uint4)),
    lambda x: AffineQuantizedTensor.from_hp_to_floatx(x, (1, 32), torch.float8_e4m3fn),
    lambda x: AffineQuantizedTensor.from_hp_to_fpx(x, FloatxTensorCoreLayout(3, 2)),
    lambda x: AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 32), torch.int32, 0, 15, zero_point_dtype=x.dtype,
                                                    preserve_zero=False, zero_point_domain=FLOAT,
                                                    _layout=Int4CPULayout()),
], ids=["plain", "uintx", "float8", "fpx", "int4cpu"])
def test_clone_is_independent_and_copy_between_matching(make):
    x1, x2 = randn(16, 32), randn(16, 32, scale=5.0)
    a, b = make(x1), make(x2)
    c = a.clone()
    assert type(c) is AffineQuantizedTensor
    assert torch.equal(c.dequantize(), a.dequantize())
    for name, t in a.tensor_impl.tensors().items():
        if t is not None:
            assert c.tensor_impl.tensors()[name].data_ptr() != t.data_ptr(), name
    before = a.dequantize()
    c.copy_(b)  # into the clone: a must not change
    assert torch.equal(c.dequantize(), b.dequantize())
    assert torch.equal(a.dequantize(), before)
    assert not torch.equal(before, b.dequantize())


def test_copy_mismatch_raises():
    x = randn(8, 32)
    a = AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 16), torch.int8)
    for other in (AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 32), torch.int8),
                  AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 16), torch.uint8),
                  AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 16), torch.int8, zero_point_domain=NONE),
                  AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 16), torch.int4, _layout=UintxLayout(torch.int4)),
                  AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 16), torch.int8).t()):
        with pytest.raises((ValueError, RuntimeError)):
            a.copy_(other)
    with pytest.raises(TypeError):
        a.copy_(x)
    assert torch.equal(a.dequantize(), AffineQuantizedTensor.from_hp_to_intx(x, ASYM, (1, 16), torch.int8)
                       .dequantize())


def test_copy_into_plain_tensor_dequantizes():
    a = _int8()
    out = torch.empty(8, 32)
    out.copy_(a)
    assert torch.equal(out, a.dequantize())


def test_tensor_flatten_round_trip():
    for a in (_int8(), _int8().t(),
              AffineQuantizedTensor.from_hp_to_intx(randn(4, 24), SYM, (1, 8), torch.int3,
                                                    _layout=UintxLayout(torch.int3))):
        names, meta = a.__tensor_flatten__()
        inner = {n: getattr(a, n) for n in names}
        b = AffineQuantizedTensor.__tensor_unflatten__(inner, meta, a.shape, a.stride())
        assert type(b) is AffineQuantizedTensor and b.shape == a.shape
        assert torch.equal(b.dequantize(), a.dequantize())


# ------------------------------------------------------------------ what torch.compile reads
@pytest.mark.parametrize("layout", ["int4_cpu", "plain_int8"])
def test_inner_tensors_are_the_storage_s_own_after_copies_and_pickles(layout):
    """__tensor_flatten__'s inner tensors are plain attributes (torch.compile's guards read them at every call),
    the very tensors of the storage: after deepcopy (no second copy of the weights) and after torch.save/load
    (where they are not saved twice)."""
    import copy
    import io

    from quanta.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    lin = torch.nn.Linear(64, 32)
    quantize_(lin, Int4WeightOnlyConfig(group_size=32) if layout == "int4_cpu" else Int8WeightOnlyConfig())
    buf = io.BytesIO()
    torch.save(lin.weight, buf)
    buf.seek(0)
    for w in (lin.weight, copy.deepcopy(lin).weight, torch.load(buf, weights_only=True)):
        names, _ = w.__tensor_flatten__()
        assert names and all(n in w.__dict__ for n in names)
        assert all(w.__dict__[n] is getattr(w.tensor_impl, n[len("_impl_"):]) for n in names)
        assert torch.equal(w.dequantize(), lin.weight.dequantize())
    assert not any(k.startswith("_impl_") for k in lin.weight.__getstate__())
