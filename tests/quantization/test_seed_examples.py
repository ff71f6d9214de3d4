"""Every example of seeds 000, 001 and 002, run on quanta, asserting the printed numbers.

The seeds print 4 decimals; the assertions use the exact values the documented
formulas give, and compare printed strings where the seed shows them.
"""

import torch

import quanta.quantization as Q


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.detach().as_subclass(torch.Tensor)


# ---------------------------------------------------------------- seed 000: quantization.tensor


def test_seed000_quantized_tensor_dequantize():
    x = torch.tensor([[2.57, -2.312], [0.153, 0.205]])
    quantizer = Q.affine.Quantize(shape=(), bitwidth=8, symmetric=True)
    quantizer.set_range(-128 * 0.1, 127 * 0.1)
    x_q = quantizer(x)
    assert type(x_q) is Q.QuantizedTensor
    assert torch.equal(_plain(x_q), torch.tensor([[26.0, -23.0], [2.0, 2.0]]))
    assert repr(x_q) == (
        "QuantizedTensor([[ 26., -23.],\n"
        "                 [  2.,   2.]], grad_fn=<AliasBackward0>)"
    )
    x_dq = x_q.dequantize()
    assert type(x_dq) is Q.DequantizedTensor
    assert repr(x_dq) == (
        "DequantizedTensor([[ 2.6000, -2.3000],\n"
        "                   [ 0.2000,  0.2000]], grad_fn=<AliasBackward0>)"
    )
    assert torch.equal(x_dq.encoding.scale, x_q.encoding.scale)


def test_seed000_quantized_repr_random_input():
    # The seed's input is torch.randn without a seed; check what it shows structurally:
    # per-row symmetric 8-bit, the row's absmax (negative here) maps to -128, int8 result.
    torch.manual_seed(0)
    quantizer = Q.affine.Quantize(shape=(2, 1), bitwidth=8, symmetric=True)
    x = torch.tensor([[0.1, -0.5, -1.1, 0.33], [0.4, -0.001, -1.8, -0.56]], requires_grad=True)
    with quantizer.compute_encodings():
        x_q = quantizer(x)
    assert repr(x_q).startswith("QuantizedTensor([[") and "grad_fn=<AliasBackward0>" in repr(x_q)
    codes = x_q.quantized_repr()
    assert codes.dtype == torch.int8
    delta = torch.tensor([[1.1 / 128], [1.8 / 128]])
    expected = torch.clamp(torch.round(x.detach() / delta), -128, 127).to(torch.int8)
    assert torch.equal(codes, expected)
    assert codes[:, 2].tolist() == [-128, -128]
    assert _plain(x_q)[1, 1].item() == 0.0 and str(_plain(x_q)[1, 1].item()) == "-0.0"  # prints "-0."
    assert codes[1, 1].item() == 0


def test_seed000_dequantized_tensor_quantize_and_repr():
    x = torch.tensor([[0.39, 51.0], [3.521, 9.41]])
    quant_dequant = Q.affine.QuantizeDequantize(shape=(), bitwidth=8, symmetric=False)
    quant_dequant.set_range(-10, 41)
    x_qdq = quant_dequant(x)
    assert repr(x_qdq) == (
        "DequantizedTensor([[ 0.4000, 41.0000],\n"
        "                   [ 3.6000,  9.4000]], grad_fn=<AliasBackward0>)"
    )
    x_q = x_qdq.quantize()
    assert repr(x_q) == (
        "QuantizedTensor([[ 52., 255.],\n"
        "                 [ 68.,  97.]], grad_fn=<AliasBackward0>)"
    )
    r = x_qdq.quantized_repr()
    assert r.dtype == torch.uint8 and r.tolist() == [[52, 255], [68, 97]]


# ---------------------------------------------------------------- seed 001: quantize_dequantize

SEED001_OUT = [0.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0667, 0.1333,
               0.1333, 0.2000, 0.2667, 0.2667, 0.3333, 0.4000, 0.4667, 0.4667, 0.5333,
               0.6000, 0.6667, 0.6667, 0.7333, 0.8000, 0.8667, 0.8667, 0.9333, 1.0000,
               1.0000, 1.0000, 1.0000, 1.0000, 1.0000]


def test_seed001_three_overloads():
    input = torch.arange(start=-0.3, end=1.3, step=0.05)
    assert len(input) == 32
    scale = torch.tensor(1 / 15)
    offset = torch.tensor(0.0)
    outs = [
        Q.affine.quantize_dequantize(input, scale, offset, bitwidth=4),
        Q.affine.quantize_dequantize(input, scale, offset, num_steps=15),
        Q.affine.quantize_dequantize(input, scale, offset, qmin=0, qmax=15),
        Q.affine.quantize_dequantize(input, scale, offset, 4),  # bitwidth by position
    ]
    expected_codes = torch.clamp(torch.round(input / scale), 0, 15)
    for out in outs:
        assert type(out) is torch.Tensor
        assert torch.equal(out, expected_codes * scale)
        assert [round(v, 4) for v in out.tolist()] == SEED001_OUT
        assert str(out).startswith("tensor([0.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0667, 0.1333,")
    # element 8 (x = 0.1): 0.1 / (1/15) = 1.5000001 rounds to 2 -> 0.1333 (division, as the seed prints)
    assert round(outs[0][8].item(), 4) == 0.1333


def test_seed001_same_result_with_gradients():
    input = torch.arange(start=-0.3, end=1.3, step=0.05).requires_grad_()
    scale = torch.tensor(1 / 15, requires_grad=True)
    out = Q.affine.quantize_dequantize(input, scale, torch.tensor(0.0), bitwidth=4)
    assert [round(v, 4) for v in out.tolist()] == SEED001_OUT


# ---------------------------------------------------------------- seed 002: quantizers


def test_seed002_per_tensor_compute_encodings():
    qtzr = Q.affine.QuantizeDequantize(shape=(), bitwidth=8, symmetric=False)
    assert str(qtzr) == "QuantizeDequantize(shape=(), qmin=0, qmax=255, symmetric=False)"
    assert not qtzr.is_initialized()
    assert qtzr.get_scale() is None and qtzr.get_offset() is None
    input = torch.arange(256) / 256
    with qtzr.compute_encodings():
        _ = qtzr(input)
    assert qtzr.is_initialized()
    assert repr(qtzr.get_scale()) == "tensor(0.0039, grad_fn=<DivBackward0>)"
    assert repr(qtzr.get_offset()) == "tensor(0., grad_fn=<SubBackward0>)"
    assert qtzr.get_scale().item() == 1 / 256
    input_qdq = qtzr(input)
    assert type(input_qdq) is Q.DequantizedTensor
    assert str(input_qdq).startswith("DequantizedTensor([0.0000, 0.0039, 0.0078, 0.0117, 0.0156, 0.0195, 0.0234,")
    assert str(input_qdq).endswith("0.9844, 0.9883, 0.9922, 0.9961], grad_fn=<AliasBackward0>)")
    assert repr(input_qdq.encoding.scale) == "tensor(0.0039, grad_fn=<DivBackward0>)"
    assert repr(input_qdq.encoding.offset) == "tensor(0., grad_fn=<SubBackward0>)"
    assert input_qdq.encoding.bitwidth == 8 and input_qdq.encoding.signed is False
    input_q = input_qdq.quantize()
    assert torch.equal(_plain(input_q), torch.arange(256.0))
    assert input_q.encoding.bitwidth == 8 and input_q.encoding.signed is False
    assert str(input_q).startswith("QuantizedTensor([  0.,   1.,   2.,")
    # the seed's sanity checks
    assert torch.equal(input_qdq, input_q.dequantize())
    assert torch.equal(input_qdq, input_qdq.dequantize())
    assert torch.equal(input_q, input_q.quantize())


SEED002_PER_CHANNEL_CODES = [
    [-128., -96., -64., -32., 0., 32., 64., 96.],
    [-128., -95., -62., -29., 4., 37., 70., 103.],
    [-128., -94., -60., -26., 9., 43., 77., 111.],
    [-128., -93., -57., -22., 13., 49., 84., 119.],
    [-127., -91., -54., -18., 18., 54., 91., 127.],
    [-118., -83., -48., -13., 22., 57., 92., 127.],
    [-110., -76., -42., -8., 25., 59., 93., 127.],
    [-102., -70., -37., -4., 29., 61., 94., 127.],
]


def test_seed002_per_channel():
    Cout, Cin = 8, 8
    weight = (torch.arange(-32, 32) / 64).view(Cin, Cout).transpose(0, 1)
    qtzr = Q.affine.QuantizeDequantize(shape=(Cout, 1), bitwidth=8, symmetric=True)
    assert str(qtzr) == "QuantizeDequantize(shape=(8, 1), qmin=-128, qmax=127, symmetric=True)"
    with qtzr.compute_encodings():
        _ = qtzr(weight)
    scale, offset = qtzr.get_scale(), qtzr.get_offset()
    assert tuple(scale.shape) == (8, 1) and tuple(offset.shape) == (8, 1)
    assert [round(v, 4) for v in scale.flatten().tolist()] == [0.0039, 0.0038, 0.0037, 0.0035, 0.0034, 0.0036,
                                                               0.0037, 0.0038]
    assert scale.grad_fn.name() == "DivBackward0"
    assert offset.grad_fn is None and torch.equal(offset, torch.zeros(8, 1))
    # delta = max(max / 127, -min / 128) per row
    rows = weight
    expected = torch.maximum(rows.amax(1, keepdim=True) / 127, -rows.amin(1, keepdim=True) / 128)
    torch.testing.assert_close(scale.detach(), expected, rtol=1e-6, atol=0)
    weight_q = qtzr(weight).quantize()
    assert torch.equal(_plain(weight_q), torch.tensor(SEED002_PER_CHANNEL_CODES))
    assert torch.equal(weight_q.encoding.scale, scale)
    assert torch.equal(weight_q.encoding.offset, offset)


SEED002_PER_BLOCK_CODES = [
    [-128., -64., 0., 64., -128., -64., 0., 64.],
    [-128., -60., 9., 77., -128., -60., 9., 77.],
    [-128., -55., 18., 91., -128., -55., 18., 91.],
    [-128., -49., 30., 108., -128., -49., 30., 108.],
    [-127., -42., 42., 127., -127., -42., 42., 127.],
    [-107., -29., 49., 127., -107., -29., 49., 127.],
    [-91., -18., 54., 127., -91., -18., 54., 127.],
    [-76., -8., 59., 127., -76., -8., 59., 127.],
]
SEED002_PER_BLOCK_SCALE = [
    [0.0039, 0.0078], [0.0037, 0.0073], [0.0034, 0.0068], [0.0032, 0.0063],
    [0.0030, 0.0059], [0.0032, 0.0064], [0.0034, 0.0069], [0.0037, 0.0074],
]


def test_seed002_per_block():
    Cout, Cin = 8, 8
    B = 4
    weight = torch.cat([
        (torch.arange(-16, 16) / 32).view(B, Cout).transpose(0, 1),
        (torch.arange(-16, 16) / 16).view(B, Cout).transpose(0, 1),
    ], dim=1)
    qtzr = Q.affine.QuantizeDequantize(shape=(Cout, Cin // B), block_size=(-1, B), bitwidth=8, symmetric=True)
    assert str(qtzr) == "QuantizeDequantize(shape=(8, 2), block_size=(-1, 4), qmin=-128, qmax=127, symmetric=True)"
    with qtzr.compute_encodings():
        _ = qtzr(weight)
    scale, offset = qtzr.get_scale(), qtzr.get_offset()
    assert tuple(scale.shape) == (8, 2) and torch.equal(offset, torch.zeros(8, 2))
    assert [[round(v, 4) for v in row] for row in scale.tolist()] == SEED002_PER_BLOCK_SCALE
    weight_q = qtzr(weight).quantize()
    assert torch.equal(_plain(weight_q), torch.tensor(SEED002_PER_BLOCK_CODES))
    assert torch.equal(weight_q.encoding.scale, scale)


def test_seed002_api_list_exists():
    # Quantizers and functional APIs listed in seed 002's API reference.
    for name in ("Quantize", "QuantizeDequantize", "quantize", "quantize_dequantize", "dequantize"):
        assert callable(getattr(Q.affine, name))
    for name in ("QuantizedTensorBase", "QuantizedTensor", "DequantizedTensor"):
        assert issubclass(getattr(Q, name), torch.Tensor)
