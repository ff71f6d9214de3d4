"""amax kernels (TensorRT dialect): hand-computed vectors, bit-exact against the NumPy reference, gradients."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.kernels import amax_quant as K
from quanta.kernels.amax_reference import (
    e4m3_quant_reference,
    e4m3_round_reference,
    fake_e4m3_reference,
    fake_tensor_quant_reference,
    tensor_quant_reference,
)

_INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
             torch.float64: torch.int64}


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    """Same dtype, shape and bits (so -0.0 != 0.0); NaN matches NaN."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    a, b = a.detach().contiguous(), b.detach().contiguous()
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    assert torch.equal(nan_a, nan_b), "NaN positions differ"
    diff = (a.view(_INT_VIEW[a.dtype]) != b.view(_INT_VIEW[b.dtype])) & ~nan_a
    if diff.any():
        i = tuple(diff.nonzero()[0].tolist())
        raise AssertionError(f"{int(diff.sum())} elements differ, first at {i}: {a[i].item()} vs {b[i].item()}")


# -- bounds ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_bits", range(1, 33))
@pytest.mark.parametrize("unsigned", [False, True])
@pytest.mark.parametrize("narrow", [False, True])
def test_bounds_all_combinations(num_bits, unsigned, narrow):
    # independent derivation: the range of an n-bit two's complement / unsigned integer
    if unsigned:
        expected = (0, (1 << num_bits) - 1)
    else:
        lo, hi = -(1 << (num_bits - 1)), (1 << (num_bits - 1)) - 1
        expected = (lo + 1 if narrow else lo, hi)
    assert K.tensor_quant_bounds(num_bits, unsigned, narrow) == expected


def test_bounds_by_hand():
    assert K.tensor_quant_bounds(8) == (-127, 127)  # default narrow_range=True
    assert K.tensor_quant_bounds(8, False, False) == (-128, 127)
    assert K.tensor_quant_bounds(8, True, True) == (0, 255)
    assert K.tensor_quant_bounds(4, False, True) == (-7, 7)
    assert K.tensor_quant_bounds(1, True) == (0, 1)
    assert K.tensor_quant_bounds(32, True) == (0, 4294967295)
    assert K.tensor_quant_bounds(32, False, False) == (-2147483648, 2147483647)


@pytest.mark.parametrize("bad", [0, 33, -8])
def test_num_bits_out_of_range(bad):
    with pytest.raises(ValueError, match="num_bits"):
        K.tensor_quant_bounds(bad)
    with pytest.raises(ValueError, match="num_bits"):
        K.fake_tensor_quant(torch.ones(3), torch.tensor(1.0), bad)


@pytest.mark.parametrize("bad", [True, False, 8.0, "8", None])
def test_num_bits_wrong_type(bad):
    with pytest.raises(TypeError, match="num_bits"):
        K.tensor_quant(torch.ones(3), torch.tensor(1.0), bad)


def test_flags_must_be_bool():
    with pytest.raises(TypeError, match="unsigned"):
        K.tensor_quant_bounds(8, unsigned=1)
    with pytest.raises(TypeError, match="narrow_range"):
        K.fake_tensor_quant(torch.ones(2), 1.0, 8, False, "yes")


def test_signed_one_bit_is_an_error_unsigned_one_bit_works():
    with pytest.raises(ValueError, match="num_bits=1"):
        K.fake_tensor_quant(torch.ones(3), torch.tensor(1.0), 1)
    x = torch.tensor([0.0, 0.4, 0.5, 0.6, 2.0])
    # max_bound 1, scale 1/amax = 1: round(0.5) = 0 (half to even), round(0.6) = 1
    codes, scale = K.tensor_quant(x, torch.tensor(1.0), 1, True)
    assert codes.tolist() == [0.0, 0.0, 0.0, 1.0, 1.0] and scale.item() == 1.0


# -- hand-computed vectors ------------------------------------------------------------------------------------


def test_int8_narrow_by_hand():
    x = torch.tensor([-2.0, -1.0, 0.5, 1.0, 3.0])
    codes, scale = K.tensor_quant(x, torch.tensor(1.0))
    assert scale.item() == 127.0
    # 0.5 * 127 = 63.5 -> 64 (half to even); +-2, 3 clamp to +-127
    assert codes.tolist() == [-127.0, -127.0, 64.0, 127.0, 127.0]
    fake = K.fake_tensor_quant(x, torch.tensor(1.0))
    expected = torch.tensor([-127.0, -127.0, 64.0, 127.0, 127.0]) / torch.tensor(127.0)
    assert_bits_equal(fake, expected)


def test_int8_full_range_and_unsigned_by_hand():
    x = torch.tensor([-2.0, -1.0, 0.5, 1.0, 3.0])
    codes, _ = K.tensor_quant(x, torch.tensor(1.0), 8, False, False)
    assert codes.tolist() == [-128.0, -127.0, 64.0, 127.0, 127.0]
    u = torch.tensor([0.0, 0.5, 0.25, 1.0, 3.0])
    codes, scale = K.tensor_quant(u, torch.tensor(1.0), 8, True)
    # scale 255: 127.5 -> 128 (even), 63.75 -> 64
    assert scale.item() == 255.0 and codes.tolist() == [0.0, 128.0, 64.0, 255.0, 255.0]


def test_4bit_by_hand():
    # max_bound 7, amax 2 -> scale 3.5; 0.3*3.5 = 1.05 -> 1; 0.5*3.5 = 1.75 -> 2; 1.0*3.5 = 3.5 -> 4 (even)
    x = torch.tensor([-2.0, 0.3, 0.5, 1.0, 2.0])
    codes, scale = K.tensor_quant(x, torch.tensor(2.0), 4)
    assert scale.item() == 3.5 and codes.tolist() == [-7.0, 1.0, 2.0, 4.0, 7.0]
    fake = K.fake_tensor_quant(x, torch.tensor(2.0), 4)
    assert_bits_equal(fake, torch.tensor([-7.0, 1.0, 2.0, 4.0, 7.0]) / 3.5)


def test_scale_is_true_division_not_reciprocal():
    # torch's `127 / t` computes reciprocal(t) * 127, which differs from 127 / t for some amax.
    amax = torch.linspace(0.1, 10.0, 2001)
    expected = torch.tensor(127.0).expand_as(amax) / amax  # tensor / tensor: true division
    assert_bits_equal(K.amax_scale(amax, 127), expected)
    np.testing.assert_array_equal(K.amax_scale(amax, 127).numpy(), np.float32(127.0) / amax.numpy())


def test_per_axis_amax_by_hand():
    x = torch.tensor([[0.5, -1.0, 2.0], [0.5, -1.0, 2.0]])
    amax = torch.tensor([[1.0], [2.0]])
    codes, scale = K.tensor_quant(x, amax)
    assert scale.tolist() == [[127.0], [63.5]]
    # row 0: 63.5 -> 64, -127, 254 -> 127; row 1: 31.75 -> 32, -63.5 -> -64, 127
    assert codes.tolist() == [[64.0, -127.0, 127.0], [32.0, -64.0, 127.0]]
    # per column amax
    codes, _ = K.tensor_quant(x, torch.tensor([1.0, 2.0, 4.0]))
    assert codes.tolist() == [[64.0, -64.0, 64.0]] * 2  # 63.5->64, -63.5->-64, 2*31.75=63.5->64


def test_one_element_amax_of_any_shape_is_per_tensor():
    x = torch.tensor(0.5)
    out = K.fake_tensor_quant(x, torch.tensor([[1.0]]))
    assert out.shape == () and out.item() == pytest.approx(64 / 127)


def test_tiny_amax_gives_zero_and_scale_one():
    x = torch.tensor([[0.5, -0.5, 1e-9, float("inf")], [0.5, -0.5, 1e-9, float("nan")], [0.5, -0.5, 1e-9, 3.0]])
    amax = torch.tensor([[0.0], [2.0**-24], [2.0**-23]])
    codes, scale = K.tensor_quant(x, amax)
    assert scale[:2].tolist() == [[1.0], [1.0]]
    assert scale[2].item() == 127.0 / 2.0**-23
    assert codes[0].tolist() == [0.0, 0.0, 0.0, 0.0]  # +inf too (NVIDIA: inf * 0 = NaN)
    assert torch.signbit(codes[0, 1])  # -0.5 * 0 = -0.0, as NVIDIA's x * 0
    assert codes[1, :3].tolist() == [0.0, 0.0, 0.0] and math.isnan(codes[1, 3])  # NaN stays NaN
    # amax 2**-23 is above the threshold: scale 127 * 2**23, and 1e-9 * scale = 1.065... rounds to 1
    assert codes[2].tolist() == [127.0, -127.0, 1.0, 127.0]
    fake = K.fake_tensor_quant(x, amax)
    assert fake[0].tolist() == [0.0, 0.0, 0.0, 0.0] and fake[1, :3].tolist() == [0.0, 0.0, 0.0]


def test_special_values():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, 1e38, -1e38, -0.001])
    codes, _ = K.tensor_quant(x, torch.tensor(1.0))
    assert math.isnan(codes[0])
    assert codes[1:3].tolist() == [127.0, -127.0]
    assert torch.signbit(codes[3]) and not torch.signbit(codes[4])
    assert codes[5:7].tolist() == [127.0, -127.0]
    assert codes[7].item() == 0.0 and torch.signbit(codes[7])  # round(-0.127) = -0.0
    fake = K.fake_tensor_quant(x, torch.tensor(1.0))
    assert math.isnan(fake[0]) and fake[1:3].tolist() == [1.0, -1.0] and torch.signbit(fake[3])


def test_empty_input():
    assert K.fake_tensor_quant(torch.empty(0, 3), torch.tensor(1.0)).shape == (0, 3)
    codes, scale = K.tensor_quant(torch.empty(0), torch.tensor(2.0))
    assert codes.shape == (0,) and scale.item() == 63.5


# -- errors ---------------------------------------------------------------------------------------------------


def test_negative_amax():
    with pytest.raises(ValueError, match="Negative values in amax"):
        K.tensor_quant(torch.ones(3), torch.tensor([1.0, -0.5, 1.0]))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_amax(bad):
    with pytest.raises(ValueError, match="amax"):
        K.fake_tensor_quant(torch.ones(3), torch.tensor(bad))


def test_amax_not_broadcastable_names_both_shapes():
    with pytest.raises(ValueError, match=r"amax shape \(3, 1\).*input shape \(4, 5\)"):
        K.fake_tensor_quant(torch.ones(4, 5), torch.ones(3, 1))
    with pytest.raises(ValueError, match=r"amax shape \(2, 4, 1\).*input shape \(4, 5\)"):  # would grow the output
        K.fake_tensor_quant(torch.ones(4, 5), torch.ones(2, 4, 1))


def test_unsigned_with_negative_input():
    with pytest.raises(TypeError, match="Negative values encountered in unsigned quantization"):
        K.tensor_quant(torch.tensor([0.5, -0.1]), torch.tensor(1.0), 8, True)
    with pytest.raises(TypeError, match="unsigned"):
        K.fake_tensor_quant(torch.tensor([float("nan"), -1.0]), torch.tensor(1.0), 8, True)
    # -0.0 is not negative
    assert K.tensor_quant(torch.tensor([-0.0, 1.0]), torch.tensor(1.0), 8, True)[0].tolist() == [0.0, 255.0]


def test_input_must_be_float_tensor():
    with pytest.raises(TypeError, match="floating-point"):
        K.fake_tensor_quant(torch.ones(3, dtype=torch.int32), torch.tensor(1.0))
    with pytest.raises(TypeError, match="torch.Tensor"):
        K.fake_tensor_quant([1.0, 2.0], torch.tensor(1.0))


# -- fast path == reference, bit for bit ----------------------------------------------------------------------

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
CONFIGS = [(8, False, True), (8, False, False), (8, True, True), (4, False, True), (2, False, False),
           (1, True, False), (16, False, True), (21, True, False), (24, False, True), (32, False, False),
           (32, True, False)]


def _adversarial(shape, amax, num_bits, unsigned, narrow, dtype, gen):
    """Random values plus exact rounding ties, bounds +-0.5, +-0, NaN, +-inf, huge and tiny values."""
    lo, hi = K.tensor_quant_bounds(num_bits, unsigned, narrow)
    a = torch.broadcast_to(amax.double(), shape)
    s = (torch.tensor(float(hi), dtype=torch.float32) / amax.float()).double()  # float32 scale, as the kernel
    s = torch.broadcast_to(s, shape)
    k = torch.randint(max(lo - 3, -(2**40)), min(hi + 3, 2**40), shape, generator=gen).double()
    kinds = torch.randint(0, 7, shape, generator=gen)
    x = (torch.rand(shape, generator=gen, dtype=torch.float64) * 2.4 - 1.2) * a
    x = torch.where(kinds == 1, (k + 0.5) / s, x)
    x = torch.where(kinds == 2, (hi + 0.5) / s, x)
    x = torch.where(kinds == 3, (lo - 0.5) / s, x)
    x = torch.where(kinds == 4, k / s, x)
    x = torch.where(kinds == 5, a, x)
    if unsigned:
        x = x.abs()
    x = x.to(dtype).flatten()
    specials = [0.0, -0.0, float("nan"), float("inf"), 1e30, 1e-30, 65000.0]
    if not unsigned:
        specials += [-float("inf"), -1e30, -1e-30]
    x[: len(specials)] = torch.tensor(specials, dtype=torch.float64).to(dtype)
    return x.reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("layout", ["per_tensor", "per_row", "per_col"])
def test_fast_path_matches_reference_bit_for_bit(layout, config, dtype):
    num_bits, unsigned, narrow = config
    gen = torch.Generator().manual_seed(hash((layout, config, str(dtype))) % 2**31)
    shape = (6, 40)
    amax_shape = {"per_tensor": (), "per_row": (6, 1), "per_col": (40,)}[layout]
    for amax in (torch.rand(amax_shape, generator=gen) * 3 + 0.01,
                 # power-of-two scale 64 = 127 / (127/64): exact ties in every dtype
                 torch.full(amax_shape, 127 / 64),
                 torch.rand(amax_shape, generator=gen).clamp_(max=0.2) * 5e-7):  # some at/below 2**-24
        x = _adversarial(shape, amax, num_bits, unsigned, narrow, dtype, gen)
        hi = K.tensor_quant_bounds(num_bits, unsigned, narrow)[1]
        s = torch.where(amax > 2**-24, torch.tensor(float(hi)) / amax, torch.tensor(1.0))
        if dtype == torch.float16 and hi <= 2048 and bool((s > 65504).any()):  # codes and scale in float16
            with pytest.raises(ValueError, match="overflows torch.float16"):
                K.tensor_quant(x, amax, num_bits, unsigned, narrow)
        else:
            codes, scale = K.tensor_quant(x, amax, num_bits, unsigned, narrow)
            assert_bits_equal(codes, tensor_quant_reference(x, amax, num_bits, unsigned, narrow,
                                                            out_dtype=codes.dtype))
        assert_bits_equal(K.fake_tensor_quant(x, amax, num_bits, unsigned, narrow),
                          fake_tensor_quant_reference(x, amax, num_bits, unsigned, narrow))


def test_exact_ties_round_half_to_even():
    amax = torch.tensor(127 / 64)  # scale exactly 64
    k = torch.arange(-130, 130, dtype=torch.float32)
    codes, scale = K.tensor_quant((k + 0.5) / 64, amax, 8, False, False)
    assert scale.item() == 64.0
    expected = torch.clamp(k + torch.where(k % 2 == 0, 0.0, 1.0), -128, 127)  # k+0.5 -> the even neighbour
    assert torch.equal(codes, expected)


def test_same_bits_with_and_without_grad():
    gen = torch.Generator().manual_seed(3)
    amax = torch.rand(5, 1, generator=gen) + 0.1
    x = _adversarial((5, 30), amax, 8, False, True, torch.float32, gen)
    plain = K.fake_tensor_quant(x, amax)
    with torch.no_grad():
        assert_bits_equal(K.fake_tensor_quant(x, amax), plain)
    xg = x.clone().requires_grad_()
    assert_bits_equal(K.fake_tensor_quant(xg, amax.clone().requires_grad_()), plain)
    assert_bits_equal(K.FakeTensorQuantFunction.apply(xg, amax), plain)
    codes, _ = K.tensor_quant(x, amax)
    assert_bits_equal(K.TensorQuantFunction.apply(xg, amax)[0], codes)


# -- half precision -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_inputs_compute_in_float32(dtype):
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(2000, generator=gen) * 2).to(dtype)
    amax = torch.tensor(2.5)
    # independent: quantize the float32 copy with float32 math, round the result once
    x32 = x.float()
    s = torch.tensor(127.0) / amax
    expected = (torch.clamp(torch.round(x32 * s), -127, 127) / s).to(dtype)
    out = K.fake_tensor_quant(x, amax)
    assert out.dtype == dtype
    assert_bits_equal(out, expected)
    codes, scale = K.tensor_quant(x, amax)
    assert codes.dtype == dtype and scale.dtype == dtype
    assert torch.equal(codes.float(), torch.clamp(torch.round(x32 * s), -127, 127))


def test_fp16_tiny_amax_fake_works_real_scale_overflow_raises():
    x = torch.tensor([0.001, -0.0005, 0.0002], dtype=torch.float16)
    amax = torch.tensor(1e-3)  # scale 127000 > float16 max 65504
    out = K.fake_tensor_quant(x, amax)
    s = torch.tensor(127.0) / amax
    assert_bits_equal(out, (torch.clamp(torch.round(x.float() * s), -127, 127) / s).half())
    with pytest.raises(ValueError, match="overflows torch.float16"):
        K.tensor_quant(x, amax)


def test_wide_grid_codes_are_exact():
    x = torch.tensor([0.3, -0.7, 1.0], dtype=torch.float32)
    codes, scale = K.tensor_quant(x, torch.tensor(1.0), 32, False, False)
    assert codes.dtype == torch.float64 and scale.dtype == torch.float64
    assert codes.tolist() == [round(0.30000001192092896 * 2147483647), round(-0.699999988079071 * 2147483647),
                              2147483647.0]
    # float16 cannot hold every 16-bit code: codes come back in float32
    codes, _ = K.tensor_quant(torch.tensor([0.3], dtype=torch.float16), torch.tensor(1.0), 16)
    assert codes.dtype == torch.float32


# -- FP8 ------------------------------------------------------------------------------------------------------


def _all_e4m3_values():
    return torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()


def test_e4m3_hand_rounding_matches_torch_cast_everywhere():
    vals = _all_e4m3_values()
    finite = torch.sort(torch.unique(vals[torch.isfinite(vals)])).values
    mids = (finite[1:].double() + finite[:-1].double()) / 2  # exact ties between neighbours
    quarter = finite[:-1].double() + (finite[1:].double() - finite[:-1].double()) / 4
    probe = torch.cat([finite.double(), mids, quarter, -mids]).float()
    ours = torch.from_numpy(e4m3_round_reference(probe.numpy()))
    assert torch.equal(ours, probe.to(torch.float8_e4m3fn).float())
    # ties go to the neighbour with an even mantissa (1.0625 lies between 1.0 and 1.125 -> 1.0)
    assert e4m3_round_reference(np.array([1.0625, 1.1875, 0.5 * 2**-9 * 3], dtype=np.float32)).tolist() == \
        [1.0, 1.25, 2 * 2**-9]


def test_fp8_by_hand():
    x = torch.tensor([0.1, 0.3, 1.0, 3.0, -3.0, 0.0])
    out = K.fake_e4m3_quant(x, torch.tensor(1.0))
    # scale 448: 44.8 -> 44 (step 4), 134.4 -> 128 (step 16), 448, clamp 1344 -> 448
    assert_bits_equal(out, torch.tensor([44.0, 128.0, 448.0, 448.0, -448.0, 0.0]) / 448.0)
    vals, scale = K.e4m3_quant(x, torch.tensor(1.0))
    assert scale.item() == 448.0 and vals.tolist() == [44.0, 128.0, 448.0, 448.0, -448.0, 0.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fp8_matches_torch_cast_and_hand_reference(dtype):
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(3000, generator=gen) * 100).to(dtype)
    x[:6] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e30, 1e-30]).to(dtype)
    for amax in (torch.tensor(300.0), torch.tensor(0.0), torch.tensor(1e-3)):
        out = K.fake_e4m3_quant(x, amax)
        assert_bits_equal(out, fake_e4m3_reference(x, amax))
        s = amax_f = amax.float()
        s = torch.tensor(448.0) / amax_f if amax_f > 2**-24 else torch.tensor(1.0)
        cast = (x.float() * s).clamp(-448, 448).to(torch.float8_e4m3fn).float()
        if amax_f <= 2**-24:
            cast = cast * 0
        assert_bits_equal(out, (cast / s).to(dtype))
        if dtype == torch.float16 and bool(s > 65504):
            with pytest.raises(ValueError, match="overflows torch.float16"):
                K.e4m3_quant(x, amax)
        else:
            assert_bits_equal(K.e4m3_quant(x, amax)[0], e4m3_quant_reference(x, amax))


def test_fp8_without_amax_and_bad_format():
    x = torch.tensor([1.0, 500.0, -1000.0, 0.3])
    assert K.scaled_e4m3(x).tolist() == [1.0, 448.0, -448.0, 0.3125]  # scale 1, saturate at 448
    with pytest.raises(NotImplementedError, match="E=4, M=3"):
        K.scaled_e4m3(x, torch.tensor(1.0), 5, 2)


# -- gradients ------------------------------------------------------------------------------------------------


def test_gradient_inclusive_at_amax_and_zero_outside():
    x = torch.tensor([-1.5, -1.0, -0.3, 0.0, 0.7, 1.0, 1.0000001, 2.0, float("nan")], requires_grad=True)
    amax = torch.tensor(1.0, requires_grad=True)
    y = K.fake_tensor_quant(x, amax)
    y.backward(torch.arange(1.0, 10.0))
    assert x.grad.tolist() == [0.0, 2.0, 3.0, 4.0, 5.0, 6.0, 0.0, 0.0, 0.0]
    assert amax.grad is None


def test_gradient_of_real_quant_is_unscaled_and_none_for_amax():
    x = torch.tensor([-2.0, -0.5, 0.5, 1.0, 1.5], requires_grad=True)
    amax = torch.tensor(1.0, requires_grad=True)
    codes, scale = K.TensorQuantFunction.apply(x, amax, 8, False, True)
    assert not scale.requires_grad
    codes.sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert amax.grad is None


def test_gradient_per_axis_and_half():
    x = torch.tensor([[0.5, 1.0, 1.5], [0.5, 1.0, 1.5]], dtype=torch.float16, requires_grad=True)
    amax = torch.tensor([[0.75], [1.5]])
    K.fake_tensor_quant(x, amax).sum().backward()
    assert x.grad.dtype == torch.float16
    assert x.grad.tolist() == [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]]


def test_fp8_gradient_clips_at_amax():
    x = torch.tensor([-3.0, -2.0, 0.5, 2.0, 2.5], requires_grad=True)
    K.fake_e4m3_quant(x, torch.tensor(2.0)).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]


def test_backward_saves_one_bool_per_element():
    saved = []

    def pack(t):
        saved.append(t)
        return t

    x = torch.randn(64, 32, requires_grad=True)
    for fn in (lambda: K.fake_tensor_quant(x, torch.tensor(1.0)),
               lambda: K.tensor_quant(x, torch.rand(64, 1) + 0.5)[0],
               lambda: K.fake_e4m3_quant(x, torch.tensor(2.0))):
        saved.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            fn()
        assert len(saved) == 1, [t.dtype for t in saved]
        assert saved[0].dtype == torch.bool and saved[0].numel() == x.numel()


def test_no_mask_without_input_grad():
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        K.FakeTensorQuantFunction.apply(torch.randn(10), torch.tensor(1.0, requires_grad=True))
    assert all(t is None for t in saved)


def test_clip_gradients_by_hand():
    x = torch.tensor([-3.0, -1.0, 0.5, 2.0, 4.0, float("nan")], requires_grad=True)
    lo = torch.tensor(-1.0, requires_grad=True)
    hi = torch.tensor(2.0, requires_grad=True)
    y = K.clip(x, lo, hi)
    assert y.detach()[:5].tolist() == [-1.0, -1.0, 0.5, 2.0, 2.0] and math.isnan(y.detach()[5])
    y.backward(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    assert x.grad.tolist() == [0.0, 2.0, 3.0, 4.0, 0.0, 0.0]  # bounds inclusive, NaN gets nothing
    assert lo.grad.item() == 1.0 and hi.grad.item() == 5.0


# -- properties (hypothesis) ----------------------------------------------------------------------------------

_finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, width=32)


@settings(max_examples=150, deadline=None)
@given(st.lists(_finite, min_size=1, max_size=40), st.floats(min_value=2.0**-10, max_value=1024.0, width=32),
       st.sampled_from([(8, False, True), (8, False, False), (4, False, True), (3, True, False), (16, False, True)]))
def test_fake_quant_is_idempotent(values, amax, config):
    num_bits, unsigned, narrow = config
    x = torch.tensor(values)
    if unsigned:
        x = x.abs()
    a = torch.tensor(amax)
    once = K.fake_tensor_quant(x, a, num_bits, unsigned, narrow)
    assert_bits_equal(K.fake_tensor_quant(once, a, num_bits, unsigned, narrow), once)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(min_value=-1.0, max_value=1.0, width=32), min_size=1, max_size=40),
       st.floats(min_value=2.0**-10, max_value=1024.0, width=32), st.sampled_from([2, 4, 8, 12]))
def test_error_at_most_half_a_step_inside_range(fractions, amax, num_bits):
    a = torch.tensor(amax)
    x = (torch.tensor(fractions) * a).clamp(-a, a)  # inside [-amax, amax]
    scale = K.amax_scale(a, 2 ** (num_bits - 1) - 1)
    err = (K.fake_tensor_quant(x, a, num_bits).double() - x.double()).abs()
    bound = 0.5 / scale.double()
    # half a step, plus the float32 rounding of x*scale and of q/scale
    assert bool((err <= bound * (1 + 1e-6) + x.double().abs() * 2**-23).all()), (err.max(), bound)


@settings(max_examples=150, deadline=None)
@given(st.lists(_finite, min_size=2, max_size=40), st.floats(min_value=2.0**-10, max_value=1024.0, width=32),
       st.sampled_from([(8, False, True), (8, False, False), (4, False, True), (8, True, False)]))
def test_fake_quant_is_monotonic(values, amax, config):
    num_bits, unsigned, narrow = config
    x = torch.sort(torch.tensor(values)).values
    if unsigned:
        x = torch.sort(x.abs()).values
    y = K.fake_tensor_quant(x, torch.tensor(amax), num_bits, unsigned, narrow)
    assert bool((y[1:] >= y[:-1]).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("amax_shape", [(), (6, 1), (1, 40), (6, 40)])
@pytest.mark.parametrize("num_bits, unsigned, narrow", [(8, False, True), (4, False, False), (8, True, False)])
def test_native_and_eager_paths_give_the_same_bits(dtype, amax_shape, num_bits, unsigned, narrow):
    from quanta.kernels import native

    gen = torch.Generator().manual_seed(num_bits)
    x = (torch.randn(6, 40, generator=gen) * 3).to(dtype)
    if unsigned:
        x = x.abs()
    x[0, :4] = torch.tensor([float("nan"), float("inf"), 0.0, -0.0 if not unsigned else 0.0]).to(dtype)
    amax = torch.rand(amax_shape, generator=gen) * 2 + 0.1
    if amax.numel() > 1:
        amax.view(-1)[0] = 0.0  # a tiny amax: zeros there
    fast_fake = K.fake_tensor_quant(x, amax, num_bits, unsigned, narrow)
    fast_q, fast_s = K.tensor_quant(x, amax, num_bits, unsigned, narrow)
    with native.disabled():
        slow_fake = K.fake_tensor_quant(x, amax, num_bits, unsigned, narrow)
        slow_q, slow_s = K.tensor_quant(x, amax, num_bits, unsigned, narrow)
    for a, b in ((fast_fake, slow_fake), (fast_q, slow_q), (fast_s, slow_s)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(torch.isnan(a), torch.isnan(b))
        assert torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
        nan = torch.isnan(a)  # a NaN's sign bit is not a value
        assert torch.equal(torch.signbit(a)[~nan], torch.signbit(b)[~nan])
