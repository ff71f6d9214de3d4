"""Bit packing: bit-exact against a bit stream built here with Python ints, round trips, shapes and errors."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.kernels import packing
from quanta.kernels.packing import pack_bits, packed_nbytes, unpack_bits

ALL_BITS = list(range(1, 9))


def reference_pack_row(codes: list[int], bits: int) -> list[int]:
    """One row, straight from the definition: a list of stream bits, LSB of code 0 first, zero-padded."""
    stream = []
    for code in codes:
        assert 0 <= code < 2**bits
        stream.extend((code >> t) & 1 for t in range(bits))
    stream.extend([0] * (-len(stream) % 8))
    return [sum(stream[8 * j + t] << t for t in range(8)) for j in range(len(stream) // 8)]


def reference_pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    rows = codes.reshape(math.prod(codes.shape[:-1]), codes.shape[-1]).tolist()
    width = -(-codes.shape[-1] * bits // 8)
    out = torch.tensor([reference_pack_row(r, bits) for r in rows], dtype=torch.uint8).reshape(len(rows), width)
    return out.reshape(*codes.shape[:-1], width)


def random_codes(shape: tuple[int, ...], bits: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2**bits, shape, generator=g, dtype=torch.int64).to(torch.uint8)


def test_reference_itself_on_a_hand_worked_stream():
    # 3-bit codes 5, 3, 7, LSB first: stream 101 110 111 -> byte 0 gets stream bits 0..7 = 1,0,1,1,1,0,1,1
    # (bit 0 first), i.e. 0b11011101 = 5 | 3 << 3 | (7 << 6) & 0xFF; byte 1 gets the last stream bit
    assert reference_pack_row([5, 3, 7], 3) == [0b11011101, 0b1]
    assert reference_pack_row([], 6) == []


@settings(max_examples=200, deadline=None)
@given(
    bits=st.integers(1, 8),
    rows=st.integers(0, 3),
    n=st.integers(0, 41),
    seed=st.integers(0, 2**31 - 1),
)
def test_pack_matches_the_python_bit_stream(bits, rows, n, seed):
    codes = random_codes((rows, n), bits, seed)
    got = pack_bits(codes, bits)
    want = reference_pack(codes, bits)
    assert got.dtype == torch.uint8
    assert got.shape == (rows, packed_nbytes(n, bits))
    assert torch.equal(got, want)
    assert torch.equal(unpack_bits(want, bits, n), codes)


@pytest.mark.parametrize("bits", ALL_BITS)
def test_all_max_codes_and_all_zero_codes(bits):
    # every code at the max sets exactly the first n*bits stream bits; padding stays zero
    n = 13
    ones = torch.full((n,), 2**bits - 1, dtype=torch.uint8)
    stream = (1 << (n * bits)) - 1
    want = list(stream.to_bytes(packed_nbytes(n, bits), "little"))
    assert pack_bits(ones, bits).tolist() == want
    assert pack_bits(torch.zeros(n, dtype=torch.uint8), bits).tolist() == [0] * packed_nbytes(n, bits)


def test_known_4bit_vector_in_onnx_order():
    # ONNX uint4: element 0 in the low nibble, element 1 in the high nibble; odd length pads a zero nibble
    codes = torch.tensor([1, 2, 3, 4, 5], dtype=torch.uint8)
    assert pack_bits(codes, 4).tolist() == [0x21, 0x43, 0x05]
    # ONNX int4 holds two's-complement nibbles: [-1, 2, -8, 7] -> nibbles [0xF, 0x2, 0x8, 0x7]
    signed = torch.tensor([-1, 2, -8, 7], dtype=torch.int8)
    nibbles = (signed & 0xF).to(torch.uint8)
    assert pack_bits(nibbles, 4).tolist() == [0x2F, 0x78]


def test_known_1bit_and_6bit_vectors():
    assert pack_bits(torch.tensor([1, 0, 0, 0, 0, 0, 0, 1, 1], dtype=torch.uint8), 1).tolist() == [0x81, 0x01]
    # four 6-bit codes fill 3 bytes: 63 | 1 << 6, 2 << 12, 3 << 18
    assert pack_bits(torch.tensor([63, 1, 2, 3], dtype=torch.uint8), 6).tolist() == [127, 32, 12]


@pytest.mark.parametrize("bits", ALL_BITS)
@pytest.mark.parametrize(
    "shape",
    [(1,), (7,), (8,), (9,), (64,), (0,), (5, 0), (0, 5), (3, 17), (2, 3, 11), (4, 2, 16), (2, 5, 33)],
)
def test_round_trip_and_byte_count(bits, shape):
    codes = random_codes(shape, bits, seed=len(shape) * 100 + shape[-1])
    packed = pack_bits(codes, bits)
    n = shape[-1]
    assert packed.shape == (*shape[:-1], -(-n * bits // 8))
    assert packed.is_contiguous()
    out = unpack_bits(packed, bits, n)
    assert out.dtype == torch.uint8 and out.shape == codes.shape
    assert torch.equal(out, codes)
    assert torch.equal(packed, reference_pack(codes, bits))


@pytest.mark.parametrize("bits", ALL_BITS)
def test_non_contiguous_input(bits):
    base = random_codes((12, 40), bits, seed=bits)
    views = [base.t(), base[:, ::3], base[::2, 1:30], base.unsqueeze(0).expand(2, 12, 40)]
    for v in views:
        assert not v.is_contiguous()
        packed = pack_bits(v, bits)
        assert torch.equal(packed, pack_bits(v.contiguous(), bits))
        assert torch.equal(unpack_bits(packed, bits, v.shape[-1]), v)
        # a non-contiguous packed tensor unpacks the same
        strided = torch.cat([packed, packed], dim=-1)[..., : packed.shape[-1]]
        assert not strided.is_contiguous()
        assert torch.equal(unpack_bits(strided, bits, v.shape[-1]), v)


@pytest.mark.parametrize("bits", ALL_BITS)
def test_inputs_are_not_modified_and_outputs_do_not_alias(bits):
    codes = random_codes((4, 16), bits)  # n a multiple of 8: no padding copy inside
    before = codes.clone()
    packed = pack_bits(codes, bits)
    assert torch.equal(codes, before)
    assert packed.data_ptr() != codes.data_ptr()
    packed_before = packed.clone()
    out = unpack_bits(packed, bits, 16)
    assert torch.equal(packed, packed_before)
    assert out.data_ptr() != packed.data_ptr()


@pytest.mark.parametrize("bits", ALL_BITS)
def test_rows_are_packed_independently(bits):
    codes = random_codes((5, 3, 13), bits, seed=7)
    packed = pack_bits(codes, bits)
    for i in range(5):
        for j in range(3):
            assert torch.equal(packed[i, j], pack_bits(codes[i, j], bits))


@pytest.mark.parametrize("bits", [1, 2, 4])
@pytest.mark.parametrize("n", [1000, 1024, 8, 3])
def test_per_byte_fast_path_matches_the_group_path(bits, n):
    # the 1/2/4-bit fast path and the general 8-codes-per-word path are two implementations of one layout
    codes = random_codes((33, n), bits, seed=n + bits)
    fast = pack_bits(codes, bits)
    assert torch.equal(fast, packing._pack_groups(codes, bits))
    assert torch.equal(packing._unpack_groups(fast, bits, n), codes)
    assert torch.equal(packing._unpack_per_byte(fast, bits, n), codes)


def test_unpack_ignores_padding_bits():
    # 3 codes of 3 bits use 9 stream bits; the other 7 bits of byte 1 are padding
    packed = torch.tensor([0b11011101, 0b11111111], dtype=torch.uint8)
    assert unpack_bits(packed, 3, 3).tolist() == [5, 3, 7]


def test_large_tensor_round_trip():
    codes = random_codes((512, 4096), 6, seed=1)
    assert torch.equal(unpack_bits(pack_bits(codes, 6), 6, 4096), codes)


def test_packed_nbytes():
    assert [packed_nbytes(n, 3) for n in range(9)] == [0, 1, 1, 2, 2, 2, 3, 3, 3]
    assert packed_nbytes(4096, 4) == 2048
    assert packed_nbytes(4096, 8) == 4096
    assert packed_nbytes(1, 1) == 1


# --- errors: right type, argument named


U8 = torch.zeros(4, dtype=torch.uint8)


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda: pack_bits([1, 2], 4), TypeError, "codes must be a torch.Tensor"),
        (lambda: pack_bits(torch.zeros(4, dtype=torch.int32), 4), TypeError, "codes must have dtype torch.uint8"),
        (lambda: pack_bits(torch.zeros(4, dtype=torch.int8), 4), TypeError, "codes must have dtype torch.uint8"),
        (lambda: pack_bits(U8, 4.0), TypeError, "bits must be an int"),
        (lambda: pack_bits(U8, True), TypeError, "bits must be an int"),
        (lambda: pack_bits(U8, "4"), TypeError, "bits must be an int"),
        (lambda: pack_bits(U8, 0), ValueError, r"bits must be in 1\.\.8"),
        (lambda: pack_bits(U8, 9), ValueError, r"bits must be in 1\.\.8"),
        (lambda: pack_bits(U8, -1), ValueError, r"bits must be in 1\.\.8"),
        (lambda: pack_bits(torch.tensor(3, dtype=torch.uint8), 4), ValueError, "codes must have at least 1 dim"),
        (
            lambda: pack_bits(torch.tensor([[1, 16], [200, 3]], dtype=torch.uint8), 4),
            ValueError,
            r"codes must be < 2\*\*bits = 16 for bits=4 \(allowed max 15\), found max 200",
        ),
        (
            lambda: pack_bits(torch.tensor([0, 1, 2], dtype=torch.uint8), 1),
            ValueError,
            r"codes .*allowed max 1\), found max 2",
        ),
        (lambda: unpack_bits(U8.tolist(), 4, 8), TypeError, "packed must be a torch.Tensor"),
        (lambda: unpack_bits(U8.float(), 4, 8), TypeError, "packed must have dtype torch.uint8"),
        (lambda: unpack_bits(torch.tensor(3, dtype=torch.uint8), 4, 2), ValueError, "packed must have at least 1"),
        (lambda: unpack_bits(U8, 4, 8.0), TypeError, "n must be an int"),
        (lambda: unpack_bits(U8, 4, False), TypeError, "n must be an int"),
        (lambda: unpack_bits(U8, 4, -1), ValueError, "n must be >= 0"),
        (lambda: unpack_bits(U8, 4.0, 8), TypeError, "bits must be an int"),
        (lambda: unpack_bits(U8, 0, 8), ValueError, r"bits must be in 1\.\.8"),
        (lambda: unpack_bits(U8, 4, 9), ValueError, r"packed has 4 bytes .* n=9 codes of bits=4 take .* = 5"),
        (lambda: unpack_bits(U8, 4, 6), ValueError, r"packed has 4 bytes .* n=6 codes of bits=4 take .* = 3"),
        (lambda: unpack_bits(U8, 6, 4), ValueError, r"packed has 4 bytes .* = 3"),
        (lambda: packed_nbytes(3.0, 4), TypeError, "n must be an int"),
        (lambda: packed_nbytes(3, None), TypeError, "bits must be an int"),
        (lambda: packed_nbytes(-2, 4), ValueError, "n must be >= 0"),
        (lambda: packed_nbytes(3, 10), ValueError, r"bits must be in 1\.\.8"),
    ],
)
def test_bad_inputs_raise_and_name_the_argument(call, exc, match):
    with pytest.raises(exc, match=match):
        call()
