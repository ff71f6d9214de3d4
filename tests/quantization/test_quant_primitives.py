"""The torchao dialect: quanta.quantization.quant_primitives (signatures, properties, faults fixed, bad input)."""

import inspect
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.encodings.torchao import FixedAffineGrid
from quanta.quantization import quant_primitives as qp
from quanta.quantization.quant_primitives import (
    MappingType,
    TorchAODType,
    ZeroPointDomain,
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

W = torch.Generator().manual_seed(7)
X = torch.randn(4, 32, generator=W) * 2


# ------------------------------------------------------------------ torchao's names and signatures
def _params(fn):
    return [(p.name, p.default if p.default is not inspect.Parameter.empty else "-", p.kind == p.KEYWORD_ONLY)
            for p in inspect.signature(fn).parameters.values()]


def test_signatures_follow_torchao():
    assert _params(choose_qparams_affine)[:10] == [
        ("input", "-", False), ("mapping_type", "-", False), ("block_size", "-", False),
        ("target_dtype", "-", False), ("quant_min", None, False), ("quant_max", None, False), ("eps", None, False),
        ("scale_dtype", None, False), ("zero_point_dtype", torch.int32, False), ("keepdim", False, False)]
    assert _params(choose_qparams_affine)[10:] == [("preserve_zero", True, True),
                                                   ("zero_point_domain", ZeroPointDomain.INT, True)]
    assert [p[:2] for p in _params(quantize_affine)][:7] == [
        ("input", "-"), ("block_size", "-"), ("scale", "-"), ("zero_point", "-"), ("output_dtype", "-"),
        ("quant_min", None), ("quant_max", None)]
    assert ("output_dtype", torch.float32, True) in _params(dequantize_affine)
    assert [p[0] for p in _params(dequantize_affine)][:7] == [
        "input", "block_size", "scale", "zero_point", "input_dtype", "quant_min", "quant_max"]
    assert [p[:2] for p in _params(choose_qparams_affine_with_min_max)][9:] == [
        ("zero_point_dtype", None), ("preserve_zero", True), ("zero_point_domain", ZeroPointDomain.INT)]
    assert [p[:2] for p in _params(qp._choose_scale_float8)] == [
        ("tensor", "-"), ("block_size", "-"), ("float8_dtype", torch.float8_e4m3fn),
        ("scale_dtype", torch.float32), ("hp_value_lb", None), ("hp_value_ub", None)]
    assert [p[:2] for p in _params(qp._dequantize_affine_floatx)] == [
        ("tensor", "-"), ("scale", "-"), ("ebits", "-"), ("mbits", "-"), ("output_dtype", torch.float32)]


def test_enums_have_torchaos_members():
    assert [m.name for m in MappingType] == ["SYMMETRIC", "SYMMETRIC_NO_CLIPPING_ERR", "ASYMMETRIC"]
    assert [m.name for m in ZeroPointDomain] == ["INT", "FLOAT", "NONE"]
    assert [m.name for m in TorchAODType] == [f"INT{b}" for b in range(1, 8)]


def test_torchaos_private_names_exist():
    for name in ("_choose_qparams_affine_tinygemm", "_choose_qparams_affine_dont_preserve_zero",
                 "_quantize_affine_tinygemm", "_dequantize_affine_tinygemm", "_quantize_affine_no_zero_point",
                 "_dequantize_affine_no_zero_point", "_fake_quantize_affine", "_fake_quantize_affine_cachemask",
                 "_choose_scale_float8", "_quantize_affine_float8", "_dequantize_affine_float8",
                 "_choose_qparams_affine_floatx", "_quantize_affine_floatx", "_dequantize_affine_floatx",
                 "_f32_to_floatx_unpacked", "_floatx_unpacked_to_f32", "_get_and_check_qmin_qmax"):
        assert callable(getattr(qp, name)), name


# ------------------------------------------------------------------ properties
MAPPINGS = list(MappingType)
TARGETS = [(torch.int8, None, None), (torch.uint8, None, None), (torch.int8, -8, 7), (torch.uint4, None, None),
           (torch.int16, None, None), (torch.int4, None, None)]


@st.composite
def problems(draw):
    rows = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 4, 8]))
    groups = draw(st.integers(1, 3))
    cols = group * groups
    vals = draw(st.lists(st.floats(-1e3, 1e3, allow_nan=False, width=32), min_size=rows * cols,
                         max_size=rows * cols))
    x = torch.tensor(vals, dtype=torch.float32).reshape(rows, cols)
    block = draw(st.sampled_from([(1, group), (rows, cols), (rows, group), (1, cols)]))
    return x, block, draw(st.sampled_from(MAPPINGS)), draw(st.sampled_from(TARGETS))


def _qparams(x, block, mapping, target):
    dtype, qmin, qmax = target
    return choose_qparams_affine(x, mapping, block, dtype, qmin, qmax)


@settings(max_examples=150, deadline=None)
@given(problems())
def test_quantize_dequantize_quantize_is_quantize(p):
    x, block, mapping, target = p
    dtype, qmin, qmax = target
    s, z = _qparams(x, block, mapping, target)
    q = quantize_affine(x, block, s, z, dtype, qmin, qmax)
    dq = dequantize_affine(q, block, s, z, dtype, qmin, qmax)
    assert torch.equal(quantize_affine(dq, block, s, z, dtype, qmin, qmax), q)


@settings(max_examples=60, deadline=None)
@given(problems(), st.sampled_from(list(ZeroPointDomain)), st.sampled_from([torch.float32, torch.bfloat16]))
def test_fixed_grid_gives_the_bits_of_quantize_and_dequantize_affine(p, domain, out_dtype):
    # qparams checked once (GPTQ's columns), then the same kernels as the checked functions
    x, block, mapping, target = p
    dtype, qmin, qmax = target
    s, z = _qparams(x, block, mapping, target)
    if domain is ZeroPointDomain.FLOAT:
        z = z.float() * s  # a float zero point, as HQQ / tinygemm keep it
    grid = FixedAffineGrid(x.shape, block, s, z, dtype, qmin, qmax, zero_point_domain=domain)
    for values in (x, x * 0.7 - 1.0):  # other values with the same qparams
        q = quantize_affine(values, block, s, z, dtype, qmin, qmax, zero_point_domain=domain)
        assert torch.equal(grid.quantize(values), q)
        expected = dequantize_affine(q, block, s, z, dtype, qmin, qmax, output_dtype=out_dtype,
                                     zero_point_domain=domain)
        got = grid.dequantize(q, out_dtype)
        assert got.dtype == expected.dtype and torch.equal(got, expected)


def test_fixed_grid_checks_its_qparams_once_and_each_input():
    s = torch.tensor([[0.1], [0.2]])
    with pytest.raises(ValueError, match="scale must be positive"):
        FixedAffineGrid((2, 4), (1, 4), torch.tensor([[0.1], [0.0]]), None, torch.int8)
    with pytest.raises(ValueError, match="makes 2 blocks"):
        FixedAffineGrid((2, 4), (1, 4), torch.tensor([0.1, 0.2, 0.3]), None, torch.int8)
    with pytest.raises(ValueError, match="FLOAT needs a zero_point"):
        FixedAffineGrid((2, 4), (1, 4), s, None, torch.uint4, zero_point_domain=ZeroPointDomain.FLOAT)
    with pytest.raises(ValueError, match="unsupported quantized dtype"):
        FixedAffineGrid((2, 4), (1, 4), s, None, torch.float32)
    grid = FixedAffineGrid((2, 4), (1, 4), s, None, torch.int4)
    with pytest.raises(ValueError, match=r"input must have shape \(2, 4\), got \(2, 3\)"):
        grid.quantize(torch.zeros(2, 3))
    with pytest.raises(TypeError, match="input"):
        grid.quantize(torch.zeros(2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"codes must be torch.int8 of shape \(2, 4\)"):
        grid.dequantize(torch.zeros(2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="output_dtype must be one of"):
        grid.dequantize(grid.quantize(torch.zeros(2, 4)), torch.int32)


@settings(max_examples=150, deadline=None)
@given(problems())
def test_error_is_at_most_half_a_step_inside_the_range(p):
    x, block, mapping, target = p
    dtype, qmin, qmax = target
    s, z = _qparams(x, block, mapping, target)
    _, inside = fake_quantize_affine_cachemask(x, block, s, z, dtype, qmin, qmax)
    q = quantize_affine(x, block, s, z, dtype, qmin, qmax)
    dq = dequantize_affine(q, block, s.double(), z, dtype, qmin, qmax, output_dtype=torch.float64)
    step = s.double().reshape([n // b for n, b in zip(x.shape, block)])
    for d, b in enumerate(block):
        step = step.repeat_interleave(b, dim=d)
    err = (dq - x.double()).abs()
    slack = x.double().abs() * 2**-21  # the float32 scale times a large code
    assert bool((err[inside] <= (step / 2 + slack)[inside]).all())
    if mapping is MappingType.SYMMETRIC_NO_CLIPPING_ERR:
        assert bool(inside.all())
    else:  # a rounded-up edge (x * (1/s) = 127.5 -> 128) may clip, by at most half a step more
        assert bool((err <= step + slack).all())


@settings(max_examples=60, deadline=None)
@given(problems())
def test_fake_quantize_is_dequantize_of_quantize(p):
    x, block, mapping, target = p
    dtype, qmin, qmax = target
    s, z = _qparams(x, block, mapping, target)
    q = quantize_affine(x, block, s, z, dtype, qmin, qmax)
    assert torch.equal(fake_quantize_affine(x, block, s, z, dtype, qmin, qmax),
                       dequantize_affine(q, block, s, z, dtype, qmin, qmax))


@settings(max_examples=60, deadline=None)
@given(problems())
def test_with_min_max_equals_choose_qparams(p):
    x, block, mapping, target = p
    dtype, qmin, qmax = target
    s, z = _qparams(x, block, mapping, target)
    xb = x.reshape(x.shape[0] // block[0], block[0], x.shape[1] // block[1], block[1])
    mn, mx = xb.amin(dim=(1, 3)), xb.amax(dim=(1, 3))
    s2, z2 = choose_qparams_affine_with_min_max(mn, mx, mapping, block, dtype, qmin, qmax,
                                                zero_point_dtype=torch.int32)
    assert torch.equal(s2.reshape(-1), s.reshape(-1)) and torch.equal(z2.reshape(-1), z.reshape(-1))


# ------------------------------------------------------------------ the torchao faults quanta fixes
def test_all_ones_block_gives_per_element_scales():
    s, z = choose_qparams_affine(X, MappingType.ASYMMETRIC, (1, 1), torch.uint8)
    assert s.shape == X.shape == z.shape
    q = quantize_affine(X, (1, 1), s, z, torch.uint8)
    torch.testing.assert_close(dequantize_affine(q, (1, 1), s, z, torch.uint8), X, rtol=0, atol=float(s.max()))


@pytest.mark.parametrize("dtype,qmin,qmax", [(torch.uint8, None, None), (torch.uint4, None, None),
                                              (torch.int8, 0, 127), (torch.int8, -4, 10)])
def test_symmetric_no_clipping_does_not_clip_unsigned_ranges(dtype, qmin, qmax):
    x = torch.tensor([[-1.0, 0.5, 3.0, 2.0], [-2.0, -0.5, 0.1, 0.0]])
    s, z = choose_qparams_affine(x, MappingType.SYMMETRIC_NO_CLIPPING_ERR, (1, 4), dtype, qmin, qmax)
    _, inside = fake_quantize_affine_cachemask(x, (1, 4), s, z, dtype, qmin, qmax)
    assert bool(inside.all())  # torchao divides by qmin = 0 here and clamps every value above max / 2
    q = quantize_affine(x, (1, 4), s, z, dtype, qmin, qmax)
    err = (dequantize_affine(q, (1, 4), s, z, dtype, qmin, qmax) - x).abs()
    assert bool((err <= s.reshape(2, 1) / 2 * 1.0001).all())


def test_symmetric_no_clipping_needs_codes_on_both_sides():
    with pytest.raises(ValueError, match="both sides of the zero point"):
        choose_qparams_affine(X, MappingType.SYMMETRIC_NO_CLIPPING_ERR, (1, 32), torch.int8, -1, 0)


def test_float8_all_zero_block_gives_zeros_not_nan():
    x = torch.cat([torch.zeros(1, 16), torch.randn(1, 16, generator=W)])
    for fdt in (torch.float8_e4m3fn, torch.float8_e5m2):
        s = choose_qparams_affine_float8(x, (1, 16), fdt)
        assert s[0].item() == 1.0
        q = quantize_affine_float8(x, s, fdt)
        dq = dequantize_affine_float8(q, s)
        assert not bool(torch.isnan(dq).any()) and bool((dq[0] == 0).all())


def test_nan_into_fpx_raises():
    with pytest.raises(ValueError, match="NaN"):
        float_to_fpx(torch.tensor([0.5, float("nan")]), 3, 2)
    with pytest.raises(ValueError, match="NaN"):
        quantize_affine_fpx(torch.tensor([[0.5, float("nan")]]), torch.tensor([1.0]), 3, 2)
    with pytest.raises(ValueError, match="NaN or inf"):
        choose_qparams_affine_fpx(torch.tensor([[0.5, float("nan")]]), 3, 2)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_input_to_choose_raises(bad):
    x = X.clone()
    x[1, 3] = bad
    with pytest.raises(ValueError, match="1 of 4 block"):
        choose_qparams_affine(x, MappingType.SYMMETRIC, (1, 32), torch.int8)
    with pytest.raises(ValueError, match="NaN or inf"):
        choose_qparams_affine_float8(x, (1, 32))


def test_nan_code_raises_and_inf_clamps():
    s, z = torch.tensor([0.1]), torch.tensor([0])
    with pytest.raises(ValueError, match="NaN"):
        quantize_affine(torch.tensor([[1.0, float("nan")]]), (1, 2), s, z, torch.int8)
    q = quantize_affine(torch.tensor([[float("inf"), -float("inf")]]), (1, 2), s, z, torch.int8)
    assert q.tolist() == [[127, -128]]


def test_zero_point_that_does_not_fit_raises():
    with pytest.raises(ValueError, match="do not fit zero_point_dtype torch.int8"):
        choose_qparams_affine(-X.abs() - 0.1, MappingType.ASYMMETRIC, (1, 32), torch.uint8,
                              zero_point_dtype=torch.int8)  # zero point 255


def test_dont_preserve_zero_maps_the_block_minimum_to_qmin():
    x = torch.linspace(10.0, 11.0, 16).reshape(1, 16)  # the block does not contain zero
    s, z = choose_qparams_affine(x, MappingType.ASYMMETRIC, (1, 16), torch.uint8, preserve_zero=False)
    q = quantize_affine(x, (1, 16), s, z, torch.uint8)
    assert q.min().item() == 0 and q.max().item() == 255
    torch.testing.assert_close(dequantize_affine(q, (1, 16), s, z, torch.uint8), x, rtol=0,
                               atol=float(s) / 2 * 1.001)
    assert torch.equal(qp._choose_qparams_affine_dont_preserve_zero(x, MappingType.ASYMMETRIC, (1, 16),
                                                                    torch.uint8)[1], z)


def test_zero_point_none_means_zero():
    s = torch.tensor([0.1, 0.2, 0.3, 0.4])
    zero = torch.zeros(4, dtype=torch.int32)
    q = quantize_affine(X, (1, 32), s, None, torch.int8)
    assert torch.equal(q, quantize_affine(X, (1, 32), s, zero, torch.int8))
    assert torch.equal(dequantize_affine(q, (1, 32), s, None, torch.int8),
                       dequantize_affine(q, (1, 32), s, zero, torch.int8))


def test_sub_byte_dtypes_store_in_bytes():
    for dtype, store, lo, hi in ((torch.int4, torch.int8, -8, 7), (TorchAODType.INT3, torch.int8, -4, 3),
                                 (torch.uint4, torch.uint8, 0, 15), (torch.uint1, torch.uint8, 0, 1)):
        s, z = choose_qparams_affine(X, MappingType.ASYMMETRIC, (1, 32), dtype)
        q = quantize_affine(X, (1, 32), s, z, dtype)
        assert q.dtype == store and int(q.min()) == lo and int(q.max()) == hi
        assert dequantize_affine(q, (1, 32), s, z, dtype).dtype == torch.float32


def test_cachemask_marks_clamped_codes():
    fq, mask = fake_quantize_affine_cachemask(torch.tensor([[0.1, 30.0, -30.0]]), (1, 3), torch.tensor([0.1]),
                                              torch.tensor([0]), torch.int8, -8, 7)
    assert mask.tolist() == [[True, False, False]] and fq.tolist()[0][1:] == pytest.approx([0.7, -0.8])


# ------------------------------------------------------------------ other behaviour
def test_keepdim_and_zero_point_domains():
    x = torch.randn(2, 64, generator=W)
    s, z = choose_qparams_affine(x, MappingType.ASYMMETRIC, (1, 32), torch.uint8, keepdim=True)
    assert s.shape == z.shape == (2, 2, 1)
    s, z = choose_qparams_affine(x, MappingType.SYMMETRIC, (1, 32), torch.int8, zero_point_domain=ZeroPointDomain.NONE)
    assert z is None and s.shape == (2, 2)
    s, z = choose_qparams_affine(x, MappingType.SYMMETRIC, (1, 32), torch.int8, zero_point_dtype=None)
    assert z.dtype == torch.float32  # torchao's choice for symmetric mappings
    s, z = choose_qparams_affine(x, MappingType.ASYMMETRIC, (1, 32), torch.int32, 0, 15,
                                 zero_point_domain=ZeroPointDomain.FLOAT)
    assert z.dtype == torch.float32  # a FLOAT zero point stays a float although the default dtype is int32
    q = quantize_affine(x, (1, 32), s, z, torch.int32, 0, 15, zero_point_domain=ZeroPointDomain.FLOAT)
    dq = dequantize_affine(q, (1, 32), s, z, torch.int32, 0, 15, zero_point_domain=ZeroPointDomain.FLOAT)
    assert bool(((dq - x).abs() <= s.repeat_interleave(32, 1) / 2 * 1.001).all())
    fq = fake_quantize_affine(x, (1, 32), s, z, torch.int32, 0, 15, ZeroPointDomain.FLOAT)
    assert torch.equal(fq, dq)


def test_half_precision_inputs_keep_their_dtype():
    for dt in (torch.bfloat16, torch.float16):
        x = X.to(dt)
        s, z = choose_qparams_affine(x, MappingType.SYMMETRIC, (1, 32), torch.int8)
        assert s.dtype == dt
        q = quantize_affine(x, (1, 32), s, z, torch.int8)
        assert dequantize_affine(q, (1, 32), s, z, torch.int8, output_dtype=dt).dtype == dt
        assert fake_quantize_affine(x, (1, 32), s, z, torch.int8).dtype == dt
    s, _ = choose_qparams_affine(X, MappingType.SYMMETRIC, (1, 32), torch.int8, scale_dtype=torch.bfloat16)
    assert s.dtype == torch.bfloat16
    s, z = choose_qparams_affine(X.double(), MappingType.ASYMMETRIC, (1, 32), torch.uint8)  # float64 works too
    assert s.dtype == torch.float64
    q = quantize_affine(X.double(), (1, 32), s, z, torch.uint8)
    dq = dequantize_affine(q, (1, 32), s, z, torch.uint8, output_dtype=torch.float64)
    assert q.dtype == torch.uint8 and bool(((dq - X.double()).abs() <= s.reshape(4, 1) * 0.5000001).all())


def test_fake_quantize_trains():
    x = X.clone().requires_grad_()
    s, z = choose_qparams_affine(X, MappingType.ASYMMETRIC, (1, 32), torch.uint8, 0, 15)
    s = s.clone().requires_grad_()
    fake_quantize_affine(x * 2, (1, 32), s, z, torch.uint8, 0, 15).sum().backward()
    assert bool((x.grad == 0).any()) and bool((x.grad == 2).any())  # clamped half gets none
    assert s.grad is not None and bool(torch.isfinite(s.grad).all())
    assert not quantize_affine(x, (1, 32), s, z, torch.uint8, 0, 15).requires_grad


def test_float8_round_trip_and_options():
    x = torch.randn(4, 64, generator=W)
    for fdt in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz):
        s = choose_qparams_affine_float8(x, (1, 32), fdt)
        assert s.shape == (4, 2) and s.dtype == torch.float32
        q = quantize_affine_float8(x, s, fdt)
        assert q.dtype == fdt
        rel = torch.finfo(fdt).eps
        torch.testing.assert_close(dequantize_affine_float8(q, s), x, rtol=rel, atol=float(s.max()) * rel * 4)
    s = choose_qparams_affine_float8(x, ())
    assert s.shape == () and s.item() == pytest.approx(x.abs().max().item() / 448)
    p2 = choose_qparams_affine_float8(x, (1, 64), power_of_two=True)
    assert bool((torch.log2(p2) == torch.log2(p2).round()).all())
    assert bool((x.abs().amax(1, keepdim=True) / p2 <= 448).all())  # rounded up: nothing clips
    e8 = qp._choose_scale_float8(x, (1, 64), scale_dtype=torch.float8_e8m0fnu)
    assert bool((torch.log2(e8) == torch.log2(e8).round()).all())
    lb = choose_qparams_affine_float8(torch.zeros(2, 2), (2, 2), hp_value_lb=448.0)
    assert lb.item() == 1.0
    assert dequantize_affine_float8(quantize_affine_float8(x, s), s, torch.bfloat16).dtype == torch.bfloat16


def test_fpx_round_trip():
    x = torch.randn(3, 16, generator=W)
    for e, m in ((2, 1), (3, 2), (2, 3)):
        s = choose_qparams_affine_fpx(x, e, m)
        codes = quantize_affine_fpx(x, s, e, m)
        assert codes.dtype == torch.uint8 and int(codes.max()) < 2 ** (1 + e + m)
        dq = dequantize_affine_fpx(codes, s, e, m)
        assert torch.equal(quantize_affine_fpx(dq, s, e, m), codes)
        assert torch.equal(float_to_fpx(fpx_to_float(codes, e, m), e, m), codes)
    assert choose_qparams_affine_fpx(x.bfloat16(), 3, 2).dtype == torch.bfloat16


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("call,err,match", [
    (lambda: choose_qparams_affine(X, MappingType.SYMMETRIC, (32,), torch.int8), ValueError,
     "one entry per input dimension"),
    (lambda: choose_qparams_affine(X, MappingType.SYMMETRIC, (1, 5), torch.int8), ValueError, "does not divide"),
    (lambda: quantize_affine(X, (1, 7), torch.ones(4), None, torch.int8), ValueError, "does not divide"),
    (lambda: choose_qparams_affine(X, MappingType.SYMMETRIC, (1, 32), torch.int8, 5, 5), ValueError,
     "quant_min must be less than quant_max"),
    (lambda: quantize_affine(X, (1, 32), torch.ones(4), None, torch.int8, 7, -8), ValueError,
     "quant_min must be less than quant_max"),
    (lambda: choose_qparams_affine(X, MappingType.SYMMETRIC, (1, 32), torch.int8, -200, 127), ValueError,
     "below the smallest value of torch.int8"),
    (lambda: choose_qparams_affine(X, MappingType.SYMMETRIC, (1, 32), torch.int8, 0.5, 127), TypeError,
     "quant_min must be an int"),
    (lambda: choose_qparams_affine(X.tolist(), MappingType.SYMMETRIC, (1, 32), torch.int8), TypeError,
     "input must be a torch.Tensor, got list"),
    (lambda: quantize_affine(X.numpy(), (1, 32), torch.ones(4), None, torch.int8), TypeError,
     "input must be a torch.Tensor"),
    (lambda: choose_qparams_affine(X.to(torch.int32), MappingType.SYMMETRIC, (1, 32), torch.int8), TypeError,
     "float32, float16, bfloat16 or float64 tensor, got dtype torch.int32"),
    (lambda: choose_qparams_affine(X, "symmetric", (1, 32), torch.int8), TypeError, "MappingType member"),
    (lambda: choose_qparams_affine(X, MappingType.SYMMETRIC, (1, 32), torch.int8, zero_point_dtype="int32"),
     TypeError, "zero_point_dtype must be a torch.dtype"),
    (lambda: quantize_affine(X, (1, 32), torch.ones(4, dtype=torch.int32), None, torch.int8), TypeError,
     "scale must be a floating-point tensor"),
    (lambda: choose_qparams_affine(X, MappingType.SYMMETRIC, (1, 32), torch.float32), ValueError,
     "unsupported quantized dtype"),
    (lambda: choose_qparams_affine(X, MappingType.SYMMETRIC, (1, 32), torch.int8, eps=-1.0), ValueError, "eps"),
    (lambda: choose_qparams_affine(X, MappingType.SYMMETRIC, (1, 32), torch.int8, zero_point_domain=None),
     ValueError, "ZeroPointDomain.NONE instead of None"),
    (lambda: choose_qparams_affine(X, MappingType.SYMMETRIC, (1, 32), torch.int8, preserve_zero=False),
     ValueError, "only supported for MappingType.ASYMMETRIC"),
    (lambda: choose_qparams_affine(torch.empty(0, 4), MappingType.SYMMETRIC, (1, 4), torch.int8), ValueError,
     "empty"),
    (lambda: quantize_affine(X, (1, 32), torch.ones(3), None, torch.int8), ValueError, "makes 4 blocks"),
    (lambda: quantize_affine(X, (1, 32), torch.ones(4), torch.zeros(2), torch.int8), ValueError, "zero_point"),
    (lambda: quantize_affine(X, (1, 32), torch.ones(4), None, torch.float8_e4m3fn), ValueError, "_float8"),
    (lambda: quantize_affine(X, (1, 32), torch.ones(4), None, torch.int8, zero_point_domain=ZeroPointDomain.FLOAT),
     ValueError, "needs a zero_point"),
    (lambda: dequantize_affine(torch.zeros(4, 32, dtype=torch.int8), (1, 32), torch.ones(4), None, torch.uint8),
     ValueError, "input has dtype torch.int8"),
    (lambda: dequantize_affine(torch.zeros(4, 32, dtype=torch.int8), (1, 32), torch.ones(4), None, torch.int8,
                               output_dtype=torch.int32), ValueError, "output_dtype"),
    (lambda: fake_quantize_affine(X, (1, 32), torch.ones(4), torch.zeros(4), torch.int8,
                                  zero_point_domain=ZeroPointDomain.NONE), ValueError, "zero_point must be None"),
    (lambda: choose_qparams_affine_with_min_max(torch.zeros(2), torch.ones(3), MappingType.SYMMETRIC, (1,),
                                                torch.int8), ValueError, "same dtype and shape"),
    (lambda: choose_qparams_affine_with_min_max(torch.ones(2), torch.zeros(2), MappingType.ASYMMETRIC, (1,),
                                                torch.int8), ValueError, "must not exceed"),
    (lambda: choose_qparams_affine_float8(X, (1, 32), torch.int8), ValueError, "float8_dtype must be one of"),
    (lambda: qp._choose_scale_float8(X, (1, 32), scale_dtype=torch.bfloat16), ValueError, "scale_dtype"),
    (lambda: quantize_affine_float8(X, torch.ones(3)), ValueError, "rank"),
    (lambda: float_to_fpx(X, 4, 4), ValueError, "at most 8"),
    (lambda: choose_qparams_affine_fpx(X.reshape(-1), 3, 2), ValueError, "2-D"),
    (lambda: quantize_affine_fpx(X, torch.ones(3), 3, 2), ValueError, "one entry per row"),
])
def test_bad_input_raises_a_clear_error(call, err, match):
    with pytest.raises(err, match=match):
        call()


def test_negative_one_is_the_whole_dimension():
    s1, z1 = choose_qparams_affine(X, MappingType.ASYMMETRIC, (1, -1), torch.uint8)
    s2, z2 = choose_qparams_affine(X, MappingType.ASYMMETRIC, (1, 32), torch.uint8)
    assert torch.equal(s1, s2) and torch.equal(z1, z2)


def test_three_dimensional_blocks():
    x = torch.randn(2, 3, 8, generator=W)
    s, z = choose_qparams_affine(x, MappingType.SYMMETRIC, (1, 3, 4), torch.int8)
    assert s.shape == (2, 2)
    q = quantize_affine(x, (1, 3, 4), s, z, torch.int8)
    want = x.reshape(2, 3, 2, 4).abs().amax(dim=(1, 3)) / 127.5
    torch.testing.assert_close(s, want)
    assert math.isclose(float((dequantize_affine(q, (1, 3, 4), s, z, torch.int8) - x).abs().max()),
                        0, abs_tol=float(s.max()))
