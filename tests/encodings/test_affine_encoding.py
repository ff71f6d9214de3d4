import json

import pytest
import torch

from quanta.encodings.affine import AffineEncoding
from quanta.grids.affine import IntegerGrid


def test_properties():
    enc = AffineEncoding(torch.tensor([[0.1], [0.2]]), torch.zeros(2, 1), IntegerGrid(-8, 7))
    assert (enc.qmin, enc.qmax, enc.num_steps, enc.bitwidth, enc.signed) == (-8, 7, 15, 4, True)
    assert enc.dtype == torch.int8
    assert enc.granularity == "per_channel"
    torch.testing.assert_close(enc.min, torch.tensor([[-0.8], [-1.6]]))
    torch.testing.assert_close(enc.max, torch.tensor([[0.7], [1.4]]))
    assert AffineEncoding(torch.tensor(0.1), torch.tensor(0.0), 8).granularity == "per_tensor"
    blocked = AffineEncoding(torch.ones(2, 2), torch.zeros(2, 2), 4, block_size=(-1, 4))
    assert blocked.granularity == "per_block"


def test_bitwidth_int_grid_and_signed():
    assert AffineEncoding(torch.tensor(1.0), torch.tensor(0.0), 8).grid == IntegerGrid(0, 255)
    assert AffineEncoding(torch.tensor(1.0), torch.tensor(0.0), 8, signed=True).grid == IntegerGrid(-128, 127)


def test_numerics_delegate_to_kernels():
    enc = AffineEncoding(torch.tensor(0.5), torch.tensor(-2.0), IntegerGrid(0, 15))
    x = torch.tensor([-1.0, 0.2, 3.0, 100.0])
    q = enc.quantize(x)
    assert q.tolist() == [0.0, 2.0, 8.0, 15.0]  # round(x/0.5) + 2, clamped
    assert torch.equal(enc.dequantize(q), (q - 2.0) * 0.5)
    assert torch.equal(enc.quantize_dequantize(x), enc.dequantize(q))


def test_dict_round_trip_is_exact_and_json_safe():
    gen = torch.Generator().manual_seed(0)
    enc = AffineEncoding(torch.rand(3, 2, generator=gen) + 0.01, torch.randint(-5, 0, (3, 2)).float(),
                         IntegerGrid(0, 255), block_size=(-1, 4))
    d = json.loads(json.dumps(enc.to_dict()))
    back = AffineEncoding.from_dict(d)
    assert back == enc
    assert back.block_size == (-1, 4)


@pytest.mark.parametrize(
    "d, exc, msg",
    [
        ([], TypeError, "must be a dict"),
        ({"scale": [1.0]}, ValueError, "missing key 'offset'"),
        ({"scale": [1.0, 2.0], "offset": [0.0], "shape": [2], "qmin": 0, "qmax": 3}, ValueError, "malformed"),
        ({"scale": "x", "offset": [0.0], "shape": [1], "qmin": 0, "qmax": 3}, ValueError, "malformed"),
        ({"scale": [1.0], "offset": [0.0], "shape": [1], "qmin": 3, "qmax": 0}, ValueError, "qmin must be less"),
    ],
)
def test_from_dict_rejects_malformed(d, exc, msg):
    with pytest.raises(exc, match=msg):
        AffineEncoding.from_dict(d)


def test_constructor_validation():
    with pytest.raises(TypeError, match="scale must be a floating-point tensor"):
        AffineEncoding(0.1, torch.tensor(0.0), 8)
    with pytest.raises(TypeError, match="offset must be a tensor"):
        AffineEncoding(torch.tensor(0.1), 0, 8)
    with pytest.raises(TypeError, match="block_size"):
        AffineEncoding(torch.tensor(0.1), torch.tensor(0.0), 8, block_size=3)


def test_equality():
    a = AffineEncoding(torch.tensor(0.1), torch.tensor(0.0), 8)
    assert a == AffineEncoding(torch.tensor(0.1), torch.tensor(0.0), 8)
    assert a != AffineEncoding(torch.tensor(0.1), torch.tensor(0.0), 8, signed=True)
    assert a != AffineEncoding(torch.tensor(0.2), torch.tensor(0.0), 8)
    assert "qmin=0, qmax=255" in repr(a)
