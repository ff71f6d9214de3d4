import pytest
import torch

from quanta.grids.affine import IntegerGrid, resolve_grid


@pytest.mark.parametrize("bitwidth", range(1, 33))
def test_bitwidth_grids_are_exact_integers(bitwidth):
    s = IntegerGrid.from_bitwidth(bitwidth, signed=True)
    u = IntegerGrid.from_bitwidth(bitwidth, signed=False)
    assert (s.qmin, s.qmax) == (-(2 ** (bitwidth - 1)), 2 ** (bitwidth - 1) - 1)
    assert (u.qmin, u.qmax) == (0, 2**bitwidth - 1)
    assert s.bitwidth == u.bitwidth == bitwidth
    assert s.signed and not u.signed
    assert all(isinstance(v, int) for v in (s.qmin, s.qmax, u.qmin, u.qmax))


@pytest.mark.parametrize("n", [1, 2, 3, 15, 16, 255, 256, 2**32 - 1])
def test_num_steps_grids(n):
    s = IntegerGrid.from_num_steps(n, signed=True)
    assert (s.qmin, s.qmax) == (-((n + 1) // 2), n // 2)  # [-ceil(n/2), floor(n/2)]
    assert s.num_steps == n
    assert IntegerGrid.from_num_steps(n) == IntegerGrid(0, n)


def test_seed_001_overloads_agree():
    # quantize_dequantize(..., bitwidth=4) == (..., num_steps=15) == (..., qmin=0, qmax=15)
    assert resolve_grid(4) == resolve_grid(num_steps=15) == resolve_grid(qmin=0, qmax=15)
    assert resolve_grid(8, True) == resolve_grid(num_steps=255, signed=True) == IntegerGrid(-128, 127)


@pytest.mark.parametrize(
    "grid, dtype",
    [
        ((-128, 127), torch.int8),
        ((0, 255), torch.uint8),
        ((0, 15), torch.uint8),
        ((-8, 7), torch.int8),
        ((-32768, 32767), torch.int16),
        ((0, 65535), torch.uint16),
        ((0, 65536), torch.uint32),
        ((-(2**31), 2**31 - 1), torch.int32),
        ((0, 2**32 - 1), torch.uint32),
    ],
)
def test_code_dtype_is_smallest_holding_dtype(grid, dtype):
    assert IntegerGrid(*grid).code_dtype == dtype


def test_compute_dtype():
    assert IntegerGrid(0, 255).compute_dtype(torch.float16) == torch.float32
    assert IntegerGrid(0, 255).compute_dtype(torch.bfloat16) == torch.float32
    assert IntegerGrid(0, 255).compute_dtype(torch.float64) == torch.float64
    assert IntegerGrid(0, 2**21).compute_dtype(torch.float32) == torch.float32
    assert IntegerGrid(0, 2**22).compute_dtype(torch.float32) == torch.float64
    assert IntegerGrid.from_bitwidth(32, True).compute_dtype(torch.float32) == torch.float64


@pytest.mark.parametrize("bad", [0, 33, -1])
def test_bitwidth_out_of_range(bad):
    with pytest.raises(ValueError, match="bitwidth"):
        IntegerGrid.from_bitwidth(bad)


@pytest.mark.parametrize("bad", [8.0, 8.5, True, "8", None])
def test_bitwidth_not_int(bad):
    with pytest.raises(TypeError, match="bitwidth"):
        IntegerGrid.from_bitwidth(bad)


def test_signed_must_be_bool():
    with pytest.raises(TypeError, match="signed"):
        IntegerGrid.from_bitwidth(8, signed=1)


@pytest.mark.parametrize("qmin, qmax", [(0, 0), (5, 4)])
def test_empty_grid(qmin, qmax):
    with pytest.raises(ValueError, match="qmin must be less than qmax"):
        IntegerGrid(qmin, qmax)


def test_num_steps_out_of_range():
    with pytest.raises(ValueError, match="num_steps"):
        IntegerGrid.from_num_steps(0)
    with pytest.raises(ValueError, match="num_steps"):
        IntegerGrid.from_num_steps(2**32)


def test_resolve_grid_needs_exactly_one_form():
    with pytest.raises(TypeError, match="exactly one"):
        resolve_grid()
    with pytest.raises(TypeError, match="exactly one"):
        resolve_grid(8, num_steps=255)
    with pytest.raises(TypeError, match="exactly one"):
        resolve_grid(8, qmin=0, qmax=255)
    with pytest.raises(TypeError, match="together"):
        resolve_grid(qmin=0)
    with pytest.raises(TypeError, match="signed"):
        resolve_grid(signed=True, qmin=0, qmax=3)


def test_num_steps_without_signed_defaults_to_unsigned():
    assert resolve_grid(num_steps=15) == IntegerGrid(0, 15)


def test_grid_is_hashable_and_frozen():
    g = IntegerGrid(0, 15)
    assert {g: 1}[IntegerGrid(0, 15)] == 1
    with pytest.raises(Exception):
        g.qmin = 1  # type: ignore[misc]
