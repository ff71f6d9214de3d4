"""quanta.quantization.affine functional API: overloads, dtypes, granularities, bad input."""

import pytest
import torch

import quanta.quantization as Q

x = torch.tensor([[-1.0, -0.26, 0.0, 0.24], [0.5, 1.0, 2.0, 40.0]])
s = torch.tensor(0.1)
o = torch.tensor(0.0)


@pytest.mark.parametrize("fn", [Q.affine.quantize, Q.affine.quantize_dequantize])
def test_overloads_are_equivalent(fn):
    a = fn(x, s, o, 8, True)
    b = fn(x, s, o, bitwidth=8, signed=True)
    c = fn(x, s, o, num_steps=255, signed=True)
    d = fn(x, s, o, qmin=-128, qmax=127)
    for t in (b, c, d):
        assert torch.equal(a, t)


def test_formulas():
    codes = torch.clamp(torch.round(x / s) - o, -8, 7)
    assert torch.equal(Q.affine.quantize(x, s, o, qmin=-8, qmax=7), codes)
    assert torch.equal(Q.affine.quantize_dequantize(x, s, o, qmin=-8, qmax=7), (codes + o) * s)
    assert torch.equal(Q.affine.dequantize(codes, s, o), (codes + o) * s)


def test_offset_is_minus_zero_point():
    # offset -5: code = round(x/s) + 5
    assert Q.affine.quantize(torch.tensor([0.0, 0.3]), s, torch.tensor(-5.0), bitwidth=4).tolist() == [5.0, 8.0]


def test_per_channel_and_per_block():
    w = torch.arange(-16.0, 16.0).reshape(4, 8) / 16
    sc = torch.tensor([[0.1], [0.2], [0.3], [0.4]])
    out = Q.affine.quantize_dequantize(w, sc, torch.zeros(4, 1), bitwidth=8, signed=True)
    for c in range(4):
        row = torch.clamp(torch.round(w[c] / sc[c]), -128, 127) * sc[c]
        assert torch.equal(out[c], row)
    sb = torch.tensor([[0.1, 0.2]] * 4)
    outb = Q.affine.quantize_dequantize(w, sb, torch.zeros(4, 2), bitwidth=8, signed=True, block_size=(-1, 4))
    assert torch.equal(outb[:, :4], Q.affine.quantize_dequantize(w[:, :4], torch.tensor(0.1), o, 8, True))
    assert torch.equal(outb[:, 4:], Q.affine.quantize_dequantize(w[:, 4:], torch.tensor(0.2), o, 8, True))


def test_numbers_are_accepted_as_scale_and_offset():
    assert torch.equal(Q.affine.quantize(x, 0.1, 0, bitwidth=8), Q.affine.quantize(x, s, o, bitwidth=8))


def test_integer_offset_tensor_is_accepted():
    assert torch.equal(Q.affine.quantize(x, s, torch.tensor(-3), bitwidth=8),
                       Q.affine.quantize(x, s, torch.tensor(-3.0), bitwidth=8))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes_are_kept(dtype):
    assert Q.affine.quantize_dequantize(x.to(dtype), s, o, bitwidth=8).dtype == dtype
    assert Q.affine.quantize(x.to(dtype), s, o, bitwidth=8).dtype == dtype


def test_dequantize_integer_codes():
    q = torch.tensor([0, 128, 255], dtype=torch.uint8)
    assert Q.affine.dequantize(q, torch.tensor(0.5), torch.tensor(-128.0)).tolist() == [-64.0, 0.0, 63.5]


def test_quantized_tensor_inputs_are_treated_as_plain():
    q = Q.affine.QuantizeDequantize(shape=(), bitwidth=8)
    q.set_range(-1, 1)
    dq = q(x)
    out = Q.affine.quantize_dequantize(dq, s, o, bitwidth=8)
    assert type(out) is torch.Tensor


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("fn", [Q.affine.quantize, Q.affine.quantize_dequantize])
def test_bad_grid_arguments(fn):
    with pytest.raises(TypeError, match="exactly one"):
        fn(x, s, o)
    with pytest.raises(TypeError, match="exactly one"):
        fn(x, s, o, 8, num_steps=255)
    with pytest.raises(ValueError, match="bitwidth must be in"):
        fn(x, s, o, 0)
    with pytest.raises(ValueError, match="bitwidth must be in"):
        fn(x, s, o, 33)
    with pytest.raises(TypeError, match="bitwidth must be an int"):
        fn(x, s, o, 8.0)
    with pytest.raises(TypeError, match="signed must be a bool"):
        fn(x, s, o, 8, 1)
    with pytest.raises(ValueError, match="qmin must be less than qmax"):
        fn(x, s, o, qmin=5, qmax=5)
    with pytest.raises(TypeError, match="unexpected keyword"):
        fn(x, s, o, bitwidth=8, symmetric=True)
    with pytest.raises(TypeError, match="multiple values"):
        fn(x, s, o, 8, bitwidth=8)
    with pytest.raises(TypeError, match="positional"):
        fn(x, s, o, 8, True, None, 1)


@pytest.mark.parametrize("fn", [Q.affine.quantize, Q.affine.quantize_dequantize])
def test_bad_tensors(fn):
    with pytest.raises(TypeError, match="tensor must be floating point"):
        fn(torch.tensor([1, 2]), s, o, bitwidth=8)
    with pytest.raises(TypeError, match="tensor must be a torch.Tensor"):
        fn([1.0, 2.0], s, o, bitwidth=8)
    with pytest.raises(TypeError, match="scale must be a tensor or a number"):
        fn(x, "0.1", o, bitwidth=8)
    with pytest.raises(TypeError, match="offset must be a tensor or a number"):
        fn(x, s, None, bitwidth=8)
    for bad in (0.0, -0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="scale must be positive"):
            fn(x, torch.tensor(bad), o, bitwidth=8)
    with pytest.raises(ValueError, match="scale shape"):
        fn(x, torch.ones(3), o, bitwidth=8)
    with pytest.raises(ValueError, match="offset shape"):
        fn(x, torch.ones(2, 1), torch.zeros(3), bitwidth=8)
    with pytest.raises(ValueError, match=r"block_size \(-1, 3\) does not fit input shape \(2, 4\)"):
        fn(x, torch.ones(2, 2), torch.zeros(2, 2), bitwidth=8, block_size=(-1, 3))
    with pytest.raises(TypeError, match="block_size"):
        fn(x, s, o, bitwidth=8, block_size=4)


def test_dequantize_bad_input():
    with pytest.raises(TypeError, match="integer codes"):
        Q.affine.dequantize(torch.tensor([True]), s, o)
    with pytest.raises(ValueError, match="scale must be positive"):
        Q.affine.dequantize(torch.tensor([1.0]), torch.tensor(-1.0), o)


def test_out_buffers_and_in_place():
    buf = torch.empty_like(x)
    y = Q.affine.quantize_dequantize(x, s, o, bitwidth=8, out=buf)
    assert y is buf or y.data_ptr() == buf.data_ptr()
    assert torch.equal(buf, Q.affine.quantize_dequantize(x, s, o, bitwidth=8))
    codes = torch.empty_like(x)
    Q.affine.quantize(x, s, o, qmin=0, qmax=255, out=codes)
    assert torch.equal(codes, Q.affine.quantize(x, s, o, bitwidth=8))
    back = torch.empty_like(x)
    Q.affine.dequantize(codes, s, o, out=back)
    assert torch.equal(back, buf)
    inplace = x.clone()
    Q.affine.quantize_dequantize(inplace, s, o, bitwidth=8, out=inplace)
    assert torch.equal(inplace, buf)
