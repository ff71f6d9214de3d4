"""The affine kernels: bit-exact against the reference, exact gradients, special values."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from quanta.grids.affine import IntegerGrid
from quanta.kernels import affine as K
from quanta.kernels.reference import (
    dequantize_reference,
    quantize_dequantize_reference,
    quantize_reference,
)

# every test here runs on both implementations (fixture in conftest.py)
pytestmark = pytest.mark.usefixtures("kernel_path")


_INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
             torch.float64: torch.int64}


def assert_bits_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal dtype, shape and bit pattern (so -0.0 != 0.0, NaN == NaN of the same payload class)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    a, b = a.detach().contiguous(), b.detach().contiguous()
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    assert torch.equal(nan_a, nan_b), "NaN positions differ"
    va, vb = a.view(_INT_VIEW[a.dtype]), b.view(_INT_VIEW[b.dtype])
    diff = (va != vb) & ~nan_a
    assert not diff.any(), f"{int(diff.sum())} elements differ, first at {diff.nonzero()[0].tolist()}: " \
        f"{a[tuple(diff.nonzero()[0])].item()} vs {b[tuple(diff.nonzero()[0])].item()}"


LAYOUTS = {
    # name: (input shape, scale shape, block_size)
    "per_tensor": ((6, 16), (), None),
    "per_channel": ((6, 16), (6, 1), None),
    "per_column": ((6, 16), (1, 16), None),
    "per_block": ((6, 16), (6, 4), (-1, 4)),
    "per_block_2d": ((6, 16), (3, 2), (2, 8)),
    "leading_broadcast": ((2, 6, 16), (6, 1), None),
    "blocked_leading": ((2, 6, 16), (6, 4), (1, 4)),
}
GRIDS = {
    "u4": IntegerGrid(0, 15),
    "s4": IntegerGrid(-8, 7),
    "u8": IntegerGrid(0, 255),
    "s8": IntegerGrid(-128, 127),
    "s16": IntegerGrid(-32768, 32767),
    "s32": IntegerGrid(-(2**31), 2**31 - 1),
    "odd": IntegerGrid(-3, 11),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def _params(scale_shape, grid, gen, symmetric=False):
    scale = torch.rand(scale_shape, generator=gen) * 0.2 + 0.01
    if symmetric:
        offset = torch.zeros(scale_shape)
    else:
        lo, hi = -grid.qmax, -grid.qmin  # offsets that keep zero on the grid
        offset = torch.randint(lo, hi + 1, scale_shape, generator=gen).float()
    return scale, offset


def _adversarial(shape, scale, offset, grid, layout_block, dtype, gen):
    """Random values plus exact ties, grid edges +-0.5 step, huge, tiny, +-0, NaN, +-inf."""
    from quanta.kernels.blocks import resolve_layout

    layout = resolve_layout(shape, scale.shape, layout_block)
    s = layout.expand_scale(scale.reshape(layout.scale_shape)).double()
    o = layout.expand_scale(offset.reshape(layout.scale_shape)).double()
    n = math.prod(shape)
    k = torch.randint(grid.qmin - 3, grid.qmax + 3, shape, generator=gen).double()
    kinds = torch.randint(0, 8, shape, generator=gen)
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * s * (grid.num_steps / 4)
    x = torch.where(kinds == 1, (k + o + 0.5) * s, x)  # ties
    x = torch.where(kinds == 2, (grid.qmax + o + 0.5) * s, x)
    x = torch.where(kinds == 3, (grid.qmin + o - 0.5) * s, x)
    x = torch.where(kinds == 4, (k + o) * s, x)  # on the grid
    x = torch.where(kinds == 5, (k + o - 0.5) * s, x)
    x = x.to(dtype).flatten()
    specials = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 1e-30, -1e-30],
                            dtype=torch.float64).to(dtype)
    m = min(len(specials), n)
    x[:m] = specials[:m]
    return x.reshape(shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("grid_name", list(GRIDS))
@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_fast_path_matches_reference_bit_for_bit(layout_name, grid_name, dtype):
    shape, scale_shape, block = LAYOUTS[layout_name]
    grid = GRIDS[grid_name]
    gen = torch.Generator().manual_seed(hash((layout_name, grid_name, str(dtype))) % 2**31)
    for symmetric in (False, True):
        scale, offset = _params(scale_shape, grid, gen, symmetric)
        x = _adversarial(shape, scale, offset, grid, block, dtype, gen)
        assert_bits_equal(K.quantize_dequantize(x, scale, offset, grid, block),
                          quantize_dequantize_reference(x, scale, offset, grid, block))
        q = K.quantize(x, scale, offset, grid, block)
        assert_bits_equal(q, quantize_reference(x, scale, offset, grid, block))
        finite = torch.nan_to_num(q, nan=0.0)
        assert_bits_equal(K.dequantize(finite, scale, offset, block),
                          dequantize_reference(finite, scale, offset, block))


@pytest.mark.parametrize("layout_name", list(LAYOUTS))
def test_same_bits_with_and_without_grad(layout_name):
    shape, scale_shape, block = LAYOUTS[layout_name]
    grid = GRIDS["u8"]
    gen = torch.Generator().manual_seed(0)
    scale, offset = _params(scale_shape, grid, gen)
    x = _adversarial(shape, scale, offset, grid, block, torch.float32, gen)
    plain = K.quantize_dequantize(x, scale, offset, grid, block)
    with torch.no_grad():
        assert_bits_equal(K.quantize_dequantize(x, scale, offset, grid, block), plain)
    for flags in [(True, False, False), (False, True, False), (False, False, True), (True, True, True)]:
        args = [t.clone().requires_grad_(f) for t, f in zip((x, scale, offset), flags)]
        assert_bits_equal(K.quantize_dequantize(*args[:3], grid, block), plain)
        assert_bits_equal(K.quantize(*args[:3], grid, block), K.quantize(x, scale, offset, grid, block))


def test_division_not_reciprocal_at_ties():
    # Seed 001: 0.1 / (1/15) rounds to 2 (0.1333) with true division; x * 15 would round to 1.
    x = torch.tensor([0.1])
    s = torch.tensor(1 / 15)
    assert (x / s).item() == 1.5000001192092896 or (x / s).item() != (x * (1 / s)).item()
    out = K.quantize_dequantize(x, s, torch.tensor(0.0), IntegerGrid(0, 15))
    assert torch.equal(K.quantize(x, s, torch.tensor(0.0), IntegerGrid(0, 15)), torch.tensor([2.0]))
    assert out.item() == pytest.approx(0.1333, abs=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_keep_dtype_and_compute_in_float32(dtype):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, generator=gen).to(dtype)
    s, o, g = torch.tensor(0.013), torch.tensor(-3.0), IntegerGrid(0, 255)
    out = K.quantize_dequantize(x, s, o, g)
    assert out.dtype == dtype
    assert torch.equal(out, K.quantize_dequantize(x.float(), s, o, g).to(dtype))
    assert K.quantize(x, s, o, g).dtype == dtype


def test_codes_never_rounded_away_by_narrow_dtypes():
    x = torch.tensor([1000.4, -7.0, 3.0], dtype=torch.bfloat16)  # bf16 rounds 1000.4 to 1000
    q = K.quantize(x, torch.tensor(1.0), torch.tensor(0.0), IntegerGrid(-2048, 2047))
    assert q.dtype == torch.float32  # bf16 cannot hold codes up to 2048
    assert q.tolist() == [1000.0, -7.0, 3.0]


def test_special_values_policy():
    g = IntegerGrid(-8, 7)
    s, o = torch.tensor(0.5), torch.tensor(0.0)
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 0.0, -0.2])
    q = K.quantize(x, s, o, g)
    assert math.isnan(q[0]) and q[1] == 7 and q[2] == -8
    assert math.copysign(1, q[3]) == -1 and math.copysign(1, q[4]) == 1  # -0.0 keeps its sign
    assert math.copysign(1, q[5]) == -1  # round(-0.4) = -0.0, as AIMET prints "-0."
    qdq = K.quantize_dequantize(x, s, o, g)
    assert math.isnan(qdq[0]) and qdq[1] == 3.5 and qdq[2] == -4.0


def test_empty_tensors():
    g = IntegerGrid(0, 15)
    for shape, scale in [((0,), torch.tensor(0.1)), ((0, 4), torch.full((1, 4), 0.1)), ((3, 0), torch.full((3, 1), 0.1))]:
        x = torch.empty(shape)
        assert K.quantize_dequantize(x, scale, torch.zeros_like(scale), g).shape == shape
        assert K.quantize(x, scale, torch.zeros_like(scale), g).shape == shape


def test_int_codes_dequantize_in_scale_dtype():
    q = torch.tensor([[-128, 0, 127]], dtype=torch.int8)
    out = K.dequantize(q, torch.tensor(0.5), torch.tensor(0.0))
    assert out.dtype == torch.float32 and out.tolist() == [[-64.0, 0.0, 63.5]]


# ---------------------------------------------------------------------------- gradients


def test_qdq_gradients_hand_computed():
    # grid [-8, 7], s = 1/8 (exact in binary), o = 0: x/s = [-100, 2.6, 3.5, 7.0, 7.6, 100]
    x = torch.tensor([-12.5, 0.325, 0.4375, 0.875, 0.95, 12.5], dtype=torch.float64, requires_grad=True)
    s = torch.tensor(0.125, dtype=torch.float64, requires_grad=True)
    o = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    g = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], dtype=torch.float64)
    K.quantize_dequantize(x, s, o, IntegerGrid(-8, 7)).backward(g)
    # inside: round(x/s) - o in [-8, 7]: 3, 4 (3.5 -> 4 half to even), 7 (inclusive), 8 is outside
    assert x.grad.tolist() == [0.0, 2.0, 3.0, 4.0, 0.0, 0.0]
    xs = [0.325 / 0.125, 3.5, 7.0]
    expected_ds = 1 * -8 + 2 * (3 - xs[0]) + 3 * (4 - xs[1]) + 4 * (7 - xs[2]) + 5 * 7 + 6 * 7
    assert s.grad.item() == pytest.approx(expected_ds, abs=1e-9)
    assert o.grad.item() == (1 + 5 + 6) * 0.125


def test_qdq_mask_uses_rounded_value_inclusively():
    g = IntegerGrid(0, 15)
    s, o = torch.tensor(1.0), torch.tensor(0.0)
    x = torch.tensor([-0.5, -0.6, 15.4, 15.5, 15.6], requires_grad=True)
    K.quantize_dequantize(x, s, o, g).sum().backward()
    # round(-0.5) = -0 -> inside; round(-0.6) = -1 -> below; round(15.5) = 16 -> above
    assert x.grad.tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]


def test_q_gradients_hand_computed():
    x = torch.tensor([-10.0, 0.26, 0.7, 10.0], dtype=torch.float64, requires_grad=True)
    s = torch.tensor(0.1, dtype=torch.float64, requires_grad=True)
    o = torch.tensor(1.0, dtype=torch.float64, requires_grad=True)
    K.quantize(x, s, o, IntegerGrid(-8, 7)).sum().backward()
    # round(x/s) - o = [-101, 2, 6, 99]: inside for elements 1 and 2
    assert x.grad.tolist() == pytest.approx([0.0, 10.0, 10.0, 0.0])
    assert s.grad.item() == pytest.approx(-(0.26 + 0.7) / 0.01)
    assert o.grad.item() == -2.0


def test_per_channel_and_block_gradients_reduce_per_scale_entry():
    gen = torch.Generator().manual_seed(3)
    grid = IntegerGrid(-8, 7)
    for scale_shape, block in [((4, 1), None), ((4, 2), (-1, 3))]:
        x = torch.randn(4, 6, generator=gen, dtype=torch.float64)
        s = (torch.rand(scale_shape, generator=gen, dtype=torch.float64) * 0.3 + 0.05).requires_grad_()
        o = torch.randint(-3, 4, scale_shape, generator=gen).double().requires_grad_()
        up = torch.randn(4, 6, generator=gen, dtype=torch.float64)
        K.quantize_dequantize(x, s, o, grid, block).backward(up)
        # element-by-element oracle, each element with its own scale entry
        from quanta.kernels.blocks import resolve_layout

        layout = resolve_layout(x.shape, s.shape, block)
        se = layout.expand_scale(s.detach())
        oe = layout.expand_scale(o.detach())
        ds = torch.zeros_like(se)
        do = torch.zeros_like(se)
        for i in range(4):
            for j in range(6):
                r = torch.round(x[i, j] / se[i, j])
                v = r - oe[i, j]
                if v < grid.qmin:
                    ds[i, j], do[i, j] = grid.qmin + oe[i, j], se[i, j]
                elif v > grid.qmax:
                    ds[i, j], do[i, j] = grid.qmax + oe[i, j], se[i, j]
                else:
                    ds[i, j] = r - x[i, j] / se[i, j]
        bs = layout.block_size
        red = lambda t: t.reshape(4 // bs[0], bs[0], 6 // bs[1], bs[1]).sum((1, 3)).reshape(scale_shape)  # noqa
        torch.testing.assert_close(s.grad, red(up * ds))
        torch.testing.assert_close(o.grad, red(up * do))


def test_dequantize_gradcheck():
    gen = torch.Generator().manual_seed(4)
    q = torch.randint(-8, 8, (4, 6), generator=gen).double().requires_grad_()
    s = (torch.rand(4, 2, generator=gen, dtype=torch.float64) + 0.1).requires_grad_()
    o = torch.randn(4, 2, generator=gen, dtype=torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda q, s, o: K.dequantize(q, s, o, (-1, 3)), (q, s, o))


def test_clamped_region_gradcheck():
    # Where every element is clamped, QDQ = (qmin|qmax + o) * s is smooth in s and o.
    x = torch.tensor([-100.0, 100.0, -50.0, 70.0], dtype=torch.float64)
    s = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
    o = torch.tensor([1.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda s, o: K.quantize_dequantize(x, s, o, IntegerGrid(-8, 7)), (s, o))


def test_backward_saves_a_bool_mask_only_when_just_input_needs_grad():
    x = torch.randn(1000, requires_grad=True)
    s, o = torch.tensor(0.1), torch.tensor(0.0)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        K.quantize_dequantize(x, s, o, IntegerGrid(0, 255))
    assert [t.dtype for t in saved] == [torch.bool]


def test_nan_gets_no_gradient():
    x = torch.tensor([float("nan"), 0.3], requires_grad=True)
    s = torch.tensor(0.1, requires_grad=True)
    o = torch.tensor(0.0, requires_grad=True)
    K.quantize_dequantize(x, s, o, IntegerGrid(0, 15)).sum().backward()
    assert x.grad.tolist() == [0.0, 1.0]
    assert math.isfinite(s.grad.item()) and o.grad.item() == 0.0


# ---------------------------------------------------------------------------- properties

finite_floats = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=60, deadline=None)
@given(
    xs=st.lists(finite_floats, min_size=1, max_size=64),
    scale=st.floats(2.0**-20, 1024.0, width=32),
    bits=st.integers(1, 16),
    signed=st.booleans(),
    offset_frac=st.floats(0, 1),
)
def test_invariants(xs, scale, bits, signed, offset_frac):
    grid = IntegerGrid.from_bitwidth(bits, signed)
    x = torch.tensor(xs, dtype=torch.float32)
    s = torch.tensor(scale, dtype=torch.float32)
    o = torch.tensor(float(round(-grid.qmax + offset_frac * grid.num_steps)))
    qdq = K.quantize_dequantize(x, s, o, grid)
    q = K.quantize(x, s, o, grid)
    # QDQ == DQ(Q) bit-exactly
    assert_bits_equal(qdq + 0.0, K.dequantize(q, s, o) + 0.0)
    # idempotence and Q(DQ(Q)) == Q (+ 0.0: the sign of a zero code is not a value)
    assert_bits_equal(K.quantize_dequantize(qdq, s, o, grid) + 0.0, qdq + 0.0)
    assert_bits_equal(K.quantize(qdq, s, o, grid) + 0.0, q + 0.0)
    # error <= s/2 inside the representable range
    lo, hi = (grid.qmin + o) * s, (grid.qmax + o) * s
    inside = (x >= lo) & (x <= hi)
    err = (qdq.double() - x.double()).abs()[inside]
    assert (err <= s.double() / 2 * (1 + 1e-6) + 1e-30).all()
    # monotone in x
    order = torch.argsort(x)
    assert (qdq[order].diff() >= 0).all()
