"""quanta's torchao dialect against a wide sweep recorded from torchao 0.18 (``generate_torchao_sweep.py``;
torchao is never a dependency).

Bit for bit: ``choose_qparams_affine`` / ``quantize_affine`` / ``dequantize_affine`` /
``_fake_quantize_affine`` at bitwidths 1-16, signed and unsigned targets, the three
mapping types, per tensor/row/group, with +-inf, +-0 and subnormals (NaN too for
fake quantization); the float8 primitives for the four float8 dtypes over their
whole range; the fpx codes of every ``(e, m)`` torchao takes, over the whole range
and for every code. Where quanta departs on purpose (docs/numerics.md), the test
checks quanta's documented rule instead and says why.
"""

import json
import math
import pathlib

import pytest
import torch

from anchor_sweep import (
    SPECIALS,
    bits_equal,
    calibration_batches,
    degenerate_input,
    digest,
    float8_input,
    fpx_input,
    unpack,
)
from quanta.quantization import quant_primitives as qp

GOLDEN = json.loads((pathlib.Path(__file__).parent / "torchao_sweep.json").read_text())
SHAPE = tuple(GOLDEN["shape"])
AFFINE = GOLDEN["affine"]


def ids(cases):
    return [c["id"] for c in cases]


def same_bits(actual, expected):
    actual = actual.detach()
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    ok = bits_equal(actual, expected.reshape(actual.shape))
    assert bool(ok.all()), f"{int((~ok).sum())} of {ok.numel()} differ: quanta " \
        f"{actual.flatten()[(~ok).flatten()][:4].tolist()}, torchao {expected.flatten()[(~ok).flatten()][:4].tolist()}"


def expand(t, like):
    """A qparam of torchao's per-block shape repeated over its block."""
    t = t.reshape([like.shape[0] if t.numel() % like.shape[0] == 0 and t.numel() > 1 else 1, -1])
    for d, (a, b) in enumerate(zip(like.shape, t.shape)):
        t = t.repeat_interleave(a // b, dim=d)
    return t


def formula(q, scale, zp):
    """torchao's dequantize: ``float32(q - zp) * scale``."""
    return (q.to(torch.int32) - expand(zp.to(torch.int32), q)).to(torch.float32) * expand(scale, q)


def one_sided(case):
    """SYMMETRIC_NO_CLIPPING_ERR on a grid without codes on both sides of its zero point (unsigned, or [-1, 0])."""
    zero = int((case["qmax"] + case["qmin"] + 1) / 2)
    return case["mapping"] == "SYMMETRIC_NO_CLIPPING_ERR" and not case["qmin"] < zero < case["qmax"]


def shifted_zero(case):
    """SYMMETRIC_NO_CLIPPING_ERR on an unsigned grid: the zero point is 2**(b-1), not 0."""
    return case["mapping"] == "SYMMETRIC_NO_CLIPPING_ERR" and not one_sided(case) and not case["signed"]


ONE_SIDED = [c for c in AFFINE if one_sided(c)]
SHIFTED_ZERO = [c for c in AFFINE if shifted_zero(c)]
TWO_SIDED = [c for c in AFFINE if not one_sided(c) and not shifted_zero(c)]


@pytest.mark.parametrize("case", SHIFTED_ZERO, ids=ids(SHIFTED_ZERO))
def test_symmetric_no_clipping_err_on_unsigned_grids(case):
    """Departure (docs/numerics.md, quanta.kernels.zero_point): torchao's ``max(min_neg / qmin, max_pos / qmax)``
    divides by ``qmin = 0`` and then uses ``max_pos / qmax`` around the zero point ``2**(b-1)``, which clips
    everything above about half the maximum. quanta keeps the name's promise, no clipping:
    ``s = max(min_neg / (qmin - zp), max_pos / (qmax - zp))``, the same zero point."""
    x = calibration_batches(case["seed"], SHAPE, 1)[0]
    assert digest(x) == case["input"]
    dt, block, qmin, qmax = getattr(torch, case["dtype"]), tuple(case["block_size"]), case["qmin"], case["qmax"]
    scale, zp = qp.choose_qparams_affine(x, qp.MappingType[case["mapping"]], block, dt, qmin, qmax)
    same_bits(zp.to(torch.int32), unpack(case["zero_point"]))
    z = int((qmax + qmin + 1) / 2)
    xb = x.reshape(-1, math.prod(block)) if block == SHAPE else x.reshape(-1, block[1])
    mn, mx = xb.amin(1).clamp_max(0), xb.amax(1).clamp_min(0)
    theirs = unpack(case["scale"])
    same_bits(theirs[mx > 0], (mx / float(qmax))[mx > 0])  # torchao's, reproduced
    eps = torch.finfo(torch.float32).eps
    same_bits(scale.reshape(-1), torch.maximum(mn / float(qmin - z), mx / float(qmax - z)).clamp_min(eps))
    fq = qp.fake_quantize_affine(x, block, scale, zp, dt, qmin, qmax)
    assert bool(((fq - x).abs() <= expand(scale, x) * 0.5001).all())  # nothing clipped
    assert bool((unpack(case["q"]).reshape(SHAPE) == qmax).any())  # torchao's codes saturate


@pytest.mark.parametrize("case", ONE_SIDED, ids=ids(ONE_SIDED))
def test_symmetric_no_clipping_err_needs_both_sides(case):
    """Departure (docs/numerics.md): ``max(min_neg / qmin, max_pos / qmax)`` divides by a zero bound where the
    zero point is an end of the grid; torchao then keeps one side's scale (or an inf/NaN one) and clips the
    other side entirely. quanta raises ValueError naming the range."""
    x = calibration_batches(case["seed"], SHAPE, 1)[0]
    with pytest.raises(ValueError, match="SYMMETRIC_NO_CLIPPING_ERR needs codes on both sides"):
        qp.choose_qparams_affine(x, qp.MappingType[case["mapping"]], tuple(case["block_size"]),
                                 getattr(torch, case["dtype"]), case["qmin"], case["qmax"])


@pytest.mark.parametrize("case", TWO_SIDED, ids=ids(TWO_SIDED))
def test_integer_affine_bit_for_bit(case):
    x = calibration_batches(case["seed"], SHAPE, 1)[0]
    assert digest(x) == case["input"]
    dt, block, qmin, qmax = getattr(torch, case["dtype"]), tuple(case["block_size"]), case["qmin"], case["qmax"]
    scale, zp = qp.choose_qparams_affine(x, qp.MappingType[case["mapping"]], block, dt, qmin, qmax)
    same_bits(scale, unpack(case["scale"]))
    same_bits(zp.to(torch.int32), unpack(case["zero_point"]))
    q = qp.quantize_affine(x, block, scale, zp, dt, qmin, qmax)
    assert q.dtype == (torch.uint8 if case["dtype"].startswith("uint") and case["bitwidth"] < 8 else dt)
    same_bits(q.to(torch.int32), unpack(case["q"]))
    dq = qp.dequantize_affine(q, block, scale, zp, dt, qmin, qmax)
    same_bits(dq, formula(q, scale, zp) if case["dq"] == "formula" else unpack(case["dq"]))
    fq = qp.fake_quantize_affine(x, block, scale, zp, dt, qmin, qmax)
    same_bits(fq, dq if case["fq"] == "dq" else unpack(case["fq"]))
    special = x.clone()
    special[0, :len(SPECIALS)] = torch.tensor(SPECIALS)
    fq = qp.fake_quantize_affine(special, block, scale, zp, dt, qmin, qmax)[0, :len(SPECIALS)]
    same_bits(fq, unpack(case["fq_special"]))
    special[0, 0] = 0.5  # quanta: NaN cannot become an integer code (ValueError); torchao writes an arbitrary one
    q = qp.quantize_affine(special, block, scale, zp, dt, qmin, qmax)[0, :len(SPECIALS)]
    same_bits(q.to(torch.int32), unpack(case["q_special"]))


def test_integer_affine_nan_is_an_error():
    """Departure (docs/numerics.md): torchao turns NaN into an arbitrary integer code; quanta raises."""
    x = torch.tensor([[0.5, math.nan]])
    with pytest.raises(ValueError, match="NaN"):
        qp.quantize_affine(x, (1, 2), torch.tensor([[0.1]]), torch.tensor([[0]]), torch.int8)


# ------------------------------------------------------------------------------------------- degenerate blocks
DEGENERATE = GOLDEN["degenerate"]
GROUP = GOLDEN["group"]


@pytest.mark.parametrize("case", DEGENERATE, ids=ids(DEGENERATE))
def test_degenerate_blocks_and_running_min_max(case):
    """Zero, tiny and constant blocks; qparams from a running min/max over three batches.

    Departure (docs/numerics.md): torchao 0.18's default minimum scale is ``finfo(dtype).smallest_normal``
    although its docstring (and torchao <= 0.15, and seed 003) say ``finfo(dtype).eps``; quanta keeps the
    documented ``eps``, and equals torchao given ``eps=finfo.eps`` explicitly, bit for bit.
    """
    x = degenerate_input(case["seed"], SHAPE, GROUP)
    assert digest(x) == case["input"]
    dt, block, qmin, qmax = getattr(torch, case["dtype"]), tuple(case["block_size"]), case["qmin"], case["qmax"]
    mapping = qp.MappingType[case["mapping"]]
    scale, zp = qp.choose_qparams_affine(x, mapping, block, dt, qmin, qmax)
    rec = case["eps"]
    same_bits(scale, unpack(rec["scale"]))
    same_bits(zp.to(torch.int32), unpack(rec["zero_point"]))
    same_bits(qp.quantize_affine(x, block, scale, zp, dt, qmin, qmax).to(torch.int32), unpack(rec["q"]))
    theirs = unpack(case["default_eps"]["scale"])
    differ = ~bits_equal(scale, theirs.reshape(scale.shape))
    assert bool((scale[differ] == torch.finfo(torch.float32).eps).all())
    assert bool((theirs.reshape(scale.shape)[differ] < torch.finfo(torch.float32).eps).all())  # zero/tiny blocks
    batches = calibration_batches(case["seed"], SHAPE, 3)
    assert [digest(b) for b in batches] == case["batches"]
    view = {"tensor": lambda t: t.reshape(1, -1), "row": lambda t: t, "group": lambda t: t.reshape(-1, GROUP)}
    mn = torch.stack([view[case["gran"]](b).amin(1) for b in batches]).amin(0)
    mx = torch.stack([view[case["gran"]](b).amax(1) for b in batches]).amax(0)
    scale, zp = qp.choose_qparams_affine_with_min_max(mn, mx, mapping, block, dt, qmin, qmax,
                                                      zero_point_dtype=torch.int32)
    same_bits(scale, unpack(case["min_max"]["scale"]))
    same_bits(zp.to(torch.int32), unpack(case["min_max"]["zero_point"]))


# ------------------------------------------------------------------------------------------- float8
FLOAT8 = GOLDEN["float8"]


@pytest.mark.parametrize("case", FLOAT8, ids=ids(FLOAT8))
def test_float8_bit_for_bit(case):
    fdt = getattr(torch, case["dtype"])
    x = float8_input(case["seed"], SHAPE, *((4, 3) if "e4m3" in case["dtype"] else (5, 2)))
    assert digest(x) == case["input"]
    scale = qp._choose_scale_float8(x, list(case["block_size"]), fdt)
    same_bits(scale, unpack(case["scale"]))
    q = qp._quantize_affine_float8(x, scale, fdt)
    same_bits(q, unpack(case["q"]))
    same_bits(qp._dequantize_affine_float8(q, scale), unpack(case["dq"]))
    s = x.clone() * 16
    s[0, :len(SPECIALS)] = torch.tensor(SPECIALS)
    same_bits(qp._quantize_affine_float8(s, scale, fdt), unpack(case["q_special"]))


# ------------------------------------------------------------------------------------------- fpx
FPX = GOLDEN["fpx"]


@pytest.mark.parametrize("case", FPX, ids=ids(FPX))
def test_fpx_codes_bit_for_bit(case):
    e, m = case["ebits"], case["mbits"]
    x = fpx_input(case["seed"], e, m)
    assert digest(x) == case["input"]
    same_bits(qp._f32_to_floatx_unpacked(x, e, m), unpack(case["codes"]))
    codes = torch.arange(2 ** (1 + e + m), dtype=torch.uint8)
    same_bits(qp._floatx_unpacked_to_f32(codes, e, m), unpack(case["decoded"]))
    w = x.reshape(8, 64)
    scale = qp._choose_qparams_affine_floatx(w, e, m)
    same_bits(scale, unpack(case["row_scale"]))
    rq = qp._quantize_affine_floatx(w, scale, e, m)
    same_bits(rq, unpack(case["row_codes"]))
    same_bits(qp._dequantize_affine_floatx(rq, scale, e, m), unpack(case["row_dq"]))


@pytest.mark.parametrize("case", FPX, ids=ids(FPX))
def test_fpx_infinities_saturate(case):
    """fpx has no inf code: +-inf become the +-max codes, as torchao's."""
    e, m = case["ebits"], case["mbits"]
    same_bits(qp._f32_to_floatx_unpacked(torch.tensor([math.inf, -math.inf]), e, m), unpack(case["inf_codes"]))
