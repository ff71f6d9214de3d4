"""quanta against a wide sweep recorded from aimet-torch 2.42 (``generate_aimet_sweep.py``; AIMET is never a dependency).

Bit for bit: the affine kernels (bitwidths 1-16, signed/unsigned grids,
symmetric/asymmetric offsets, per tensor/channel/block, special values), MinMax
calibration of ``QuantizeDequantize`` over several batches (the 2-bit symmetric
rule included), the percentile and SQNR decision rules at every bitwidth, and
``FloatQuantizeDequantize(e, m)`` for every ``e <= 8``, ``m <= 7`` over the whole
dynamic range. Where quanta departs on purpose (docs/numerics.md), the test
checks quanta's documented rule instead and says why.
"""

import json
import math
import pathlib

import pytest
import torch

import quanta.quantization as Q
from anchor_sweep import affine_input, bits_equal, calibration_batches, digest, float_input, unpack
from quanta.encodings.float import FloatEncoding
from quanta.kernels.histograms import Histograms
from quanta.quantization.encoding_analyzer import PercentileEncodingAnalyzer, SqnrEncodingAnalyzer

GOLDEN = json.loads((pathlib.Path(__file__).parent / "aimet_sweep.json").read_text())
SHAPE = tuple(GOLDEN["shape"])
BLOCK = GOLDEN["block"]


def ids(cases):
    return [c["id"] for c in cases]


def scale_shape(gran):
    return {"tensor": (), "channel": (SHAPE[0], 1), "block": (SHAPE[0], SHAPE[1] // BLOCK)}[gran]


def block_size(gran):
    return (1, BLOCK) if gran == "block" else None


def expand(t, gran):
    return t.repeat_interleave(BLOCK, dim=1) if gran == "block" else t


def plain(t):
    return t.detach().as_subclass(torch.Tensor)


def same_bits(actual, expected):
    actual = plain(actual)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    ok = bits_equal(actual, expected.reshape(actual.shape))
    assert bool(ok.all()), f"{int((~ok).sum())} of {ok.numel()} differ: first at {(~ok).nonzero()[0].tolist()}: " \
        f"quanta {actual.flatten()[(~ok).flatten()][:4].tolist()}, AIMET {expected.flatten()[(~ok).flatten()][:4].tolist()}"


def check_codes_and_values(rec, q, y, scale, offset, gran):
    """``rec`` holds AIMET's codes and its QDQ values (or ``"dq(q)"``: they are ``(q + o) * s`` in float32)."""
    codes = unpack(rec["q"]).reshape(SHAPE)
    same_bits(q, codes)
    values = (codes + expand(offset, gran)) * expand(scale, gran) if rec["qdq"] == "dq(q)" else unpack(rec["qdq"])
    same_bits(y, values)


# ------------------------------------------------------------------------------------------- functional
@pytest.mark.parametrize("case", GOLDEN["functional"], ids=ids(GOLDEN["functional"]))
def test_functional_affine_bit_for_bit(case):
    gran = case["gran"]
    scale = unpack(case["scale"], scale_shape(gran))
    offset = unpack(case["offset"], scale_shape(gran))
    x = affine_input(case["seed"], SHAPE, expand(scale, gran), expand(offset, gran), case["qmin"], case["qmax"])
    assert digest(x) == case["input"], "the seeded input differs from the one AIMET saw"
    kw = {"qmin": case["qmin"], "qmax": case["qmax"]}
    if block_size(gran):
        kw["block_size"] = block_size(gran)
    q = Q.affine.quantize(x, scale, offset, **kw)
    y = Q.affine.quantize_dequantize(x, scale, offset, **kw)
    check_codes_and_values(case, q, y, scale, offset, gran)


# ------------------------------------------------------------------------------------------- MinMax calibration
def calibrated(case, batches):
    gran = case["gran"]
    q = Q.affine.QuantizeDequantize(scale_shape(gran), qmin=case["qmin"], qmax=case["qmax"],
                                    symmetric=case["symmetric"], block_size=block_size(gran))
    with q.compute_encodings():
        for b in batches:
            last = q(b)
            last_enc = (plain(last.encoding.scale).clone(), plain(last.encoding.offset).clone())
    return q, last, last_enc


def aimet_unusable(*ts):
    """AIMET's range has NaN or float32-limit ends (its symmetric rule divides by floor(N/2) = 0 steps)."""
    return all(bool((torch.isnan(t) | (t.abs() >= 3e38)).any()) for t in ts)


ONE_STEP_SYMMETRIC = [c for c in GOLDEN["modules"] if c["bitwidth"] == 1 and c["symmetric"]]
MODULES = [c for c in GOLDEN["modules"] if c not in ONE_STEP_SYMMETRIC]


@pytest.mark.parametrize("case", ONE_STEP_SYMMETRIC, ids=ids(ONE_STEP_SYMMETRIC))
def test_one_step_symmetric_calibration(case):
    """Departure (docs/numerics.md): a symmetric 1-bit grid has no positive step (``floor(1/2) = 0``).
    AIMET divides by it (``max / 0``): its range is ``-3.4e38`` and NaN. quanta sizes the range by the
    negative side alone: ``min = min(x.min, 0)``, ``max = 0`` (positive values have no code to go to)."""
    gran = case["gran"]
    batches = calibration_batches(case["seed"], SHAPE, 4)
    q, _, _ = calibrated(case, batches[:3])
    mn, mx, _, _ = unpack(case["encoding"]).reshape(4, *scale_shape(gran))
    assert aimet_unusable(mn, mx)
    assert bool(torch.isfinite(q.min).all() and (q.max == 0).all() and (q.get_scale() > 0).all())
    lo = torch.stack([b.reshape(SHAPE[0], -1, BLOCK if gran == "block" else SHAPE[1]) for b in batches[:3]])
    lo = lo.amin(dim=(0, 3)) if gran != "tensor" else lo.amin()
    same_bits(q.min, torch.minimum(lo.reshape(q.min.shape), torch.tensor(0.0)))


@pytest.mark.parametrize("case", MODULES, ids=ids(MODULES))
def test_minmax_calibration_bit_for_bit(case):
    gran = case["gran"]
    batches = calibration_batches(case["seed"], SHAPE, 4)
    assert [digest(b) for b in batches] == case["inputs"]
    q, last, (ls, lo) = calibrated(case, batches[:3])
    mn, mx, s, o = unpack(case["encoding"]).reshape(4, *scale_shape(gran))
    same_bits(q.min, mn)
    same_bits(q.max, mx)
    same_bits(q.get_scale(), s)
    same_bits(q.get_offset(), o)
    a_ls, a_lo = unpack(case["last_batch"]["encoding"]).reshape(2, *scale_shape(gran))
    same_bits(ls, a_ls)
    same_bits(lo, a_lo)
    kw = {"qmin": case["qmin"], "qmax": case["qmax"]}
    if block_size(gran):
        kw["block_size"] = block_size(gran)
    if "q" in case["last_batch"]:
        check_codes_and_values(case["last_batch"], Q.affine.quantize(batches[2], ls, lo, **kw), last, ls, lo, gran)
    if "output" not in case:
        return
    fresh = batches[3].clone()
    fresh[0, :4] = torch.tensor([math.nan, math.inf, -math.inf, -0.0])
    check_codes_and_values(case["output"], Q.affine.quantize(fresh, s, o, **kw), q(fresh), s, o, gran)


@pytest.mark.parametrize("case", GOLDEN["special_calibration"], ids=ids(GOLDEN["special_calibration"]))
def test_calibration_with_nan_or_inf(case):
    """Departure (docs/guides/calibrate.md): quanta leaves NaN/inf out of the statistics, with a warning.

    AIMET lets them in (an inf end becomes the float32 limit, a NaN range poisons the
    encoding). Every scale entry that never saw one is AIMET's bit for bit; the others
    are calibrated on their finite values.
    """
    gran = case["gran"]
    batches = calibration_batches(case["seed"], SHAPE, 3)
    assert [digest(b) for b in batches] == case["inputs"]
    batches[1][1, 5] = float(case["special"])
    with pytest.warns(RuntimeWarning, match="non-finite"):
        q, _, _ = calibrated(case, batches)
    finite = [b.clone() for b in batches]
    finite[1][1, 5] = finite[1][1, 4]  # the same statistics without the special value
    ref, _, _ = calibrated(case, finite)
    same_bits(q.min, plain(ref.min))
    same_bits(q.max, plain(ref.max))
    a_min, a_max = unpack(case["min"]).reshape(q.min.shape), unpack(case["max"]).reshape(q.max.shape)
    touched = torch.zeros(SHAPE, dtype=torch.bool)
    touched[1, 5] = True
    if gran == "tensor":
        clean = torch.tensor(False)
    else:
        clean = ~touched.reshape(SHAPE[0], -1, BLOCK if gran == "block" else SHAPE[1]).any(-1)
        clean = clean.reshape(q.min.shape)
    assert bool(bits_equal(plain(q.min), a_min)[clean].all()) and bool(bits_equal(plain(q.max), a_max)[clean].all())


# ------------------------------------------------------------------------------------------- percentile, SQNR
def _histograms(edges_as_range):
    rows = GOLDEN["analyzer_histograms"]
    lo = [float.fromhex(r["edge_min" if edges_as_range else "min"]) for r in rows]
    hi = [float.fromhex(r["edge_max" if edges_as_range else "max"]) for r in rows]
    return Histograms(torch.tensor([r["counts"] for r in rows]), torch.tensor([r["exponent"] for r in rows]),
                      torch.tensor([r["start"] for r in rows]), torch.tensor(lo), torch.tensor(hi))


ANALYZERS = GOLDEN["analyzers"]


@pytest.mark.parametrize("case", ANALYZERS, ids=[
    f"{c['analyzer']}{c['kwargs'].get('percentile', '')}_n{c['num_steps']}_{'sym' if c['symmetric'] else 'asym'}"
    for c in ANALYZERS])
def test_histogram_analyzer_rules_at_every_bitwidth(case):
    """Bit for bit at every ``num_steps`` (no 2-bit rule here: AIMET's ``adjust_min_max`` has none),
    except the 1-step symmetric percentile range, where AIMET divides by zero positive steps (-inf, NaN)."""
    n = len(GOLDEN["analyzer_histograms"])
    cls = PercentileEncodingAnalyzer if case["analyzer"] == "percentile" else SqnrEncodingAnalyzer
    a = cls((n,), num_bins=GOLDEN["analyzer_num_bins"], **case["kwargs"])
    lo, hi = a.compute_encodings_from_stats(_histograms(case["analyzer"] == "percentile"), case["num_steps"],
                                            case["symmetric"])
    a_lo, a_hi = unpack(case["min"]), unpack(case["max"])
    if case["analyzer"] == "percentile" and case["num_steps"] == 1 and case["symmetric"]:
        assert aimet_unusable(a_lo, a_hi) and bool(torch.isfinite(lo).all() and (hi == 0).all())
        return
    same_bits(lo, a_lo)
    same_bits(hi, a_hi)


# ------------------------------------------------------------------------------------------- float formats
FLOAT = [c for c in GOLDEN["float"] if "error" not in c]


def float_quantizer(case, **kw):
    return Q.float.FloatQuantizeDequantize(exponent_bits=case["exponent_bits"], mantissa_bits=case["mantissa_bits"],
                                           finite=case.get("finite", False),
                                           unsigned_zero=case.get("unsigned_zero", False), **kw)


def aimet_scale(maxval: torch.Tensor, fmax: float) -> torch.Tensor:
    """AIMET's ``get_scale()``: ``2 ** (log2(maxval) - log2(max))`` in float32."""
    return 2 ** (torch.log2(maxval.float().abs()) - math.log2(fmax))


def check_scale(q, maxval, recorded):
    """Departure (docs/numerics.md): quanta's scale is ``maxval / max``, correctly rounded; AIMET's
    goes through float32 ``log2`` and ``exp2``, which loses about one ulp of ``log2(maxval)``: a relative
    error up to ``2**-23 * (|log2 maxval| + |log2 max| + 2)`` (tens of ulps for large maxval), even where
    the ratio is exact (``maxval = 3 * max`` gives 3 +- 9 ulps)."""
    fmax = q.format.max
    same_bits(aimet_scale(maxval, fmax), recorded)  # AIMET's formula, reproduced
    ours = plain(q.get_scale())
    same_bits(ours, (maxval.float() / fmax).float())
    rel = ((ours.double() - recorded.double()) / ours.double()).abs()
    bound = 2.0**-23 * (torch.log2(maxval.double()).abs() + abs(math.log2(fmax)) + 2)
    assert bool((rel <= bound).all())


def float_qdq(q, x, scale):
    """quanta's float kernel with a given scale (AIMET's), to compare grids apart from scales."""
    return FloatEncoding(scale.reshape(q.maxval.shape), q.format, q.block_size).quantize_dequantize(x)


@pytest.mark.parametrize("case", FLOAT, ids=ids(FLOAT))
def test_float_format_over_its_whole_range(case):
    x = float_input(case["seed"], case["n"], case["lowest"], case["highest"], case["mantissa_bits"])
    assert digest(x) == case["input"]
    q = float_quantizer(case)
    assert q.maxval.item() == float.fromhex(case["max"])
    same_bits(q(x), unpack(case["output"]))


@pytest.mark.parametrize("case", FLOAT, ids=ids(FLOAT))
def test_float_format_with_a_set_maxval(case):
    x = float_input(case["seed"], case["n"], case["lowest"], case["highest"], case["mantissa_bits"])[:128]
    maxval = float.fromhex(case["maxval"])
    x2 = (x.double() * (maxval / float.fromhex(case["max"]))).float()
    assert digest(x2) == case["input_scaled"]
    q = float_quantizer(case)
    q.set_range(maxval)
    scale = unpack(case["scale"]).reshape(())
    check_scale(q, q.maxval, scale)
    same_bits(float_qdq(q, x2, scale), unpack(case["output_scaled"]))


def test_float_formats_aimet_cannot_build():
    """AIMET 2.42 computes the largest value of an ``(e, 0)`` format as a Python int: ``maxval`` becomes an
    integer buffer (a set maxval is truncated) and ``e >= 7`` overflows. quanta's maxval is float32 always."""
    failed = [c for c in GOLDEN["float"] if "error" in c]
    assert {(c["exponent_bits"], c["mantissa_bits"]) for c in failed} == {(7, 0), (8, 0)}
    for c in failed:
        q = float_quantizer(c)
        assert q.maxval.dtype == torch.float32 and q.maxval.item() == 2.0 ** (2 ** (c["exponent_bits"] - 1) - 1)
    assert all(c["maxval_dtype"] == "int64" for c in FLOAT if c["mantissa_bits"] == 0)


@pytest.mark.parametrize("case", GOLDEN["float_half"], ids=ids(GOLDEN["float_half"]))
def test_float_format_half_precision_inputs(case):
    dt = getattr(torch, case["dtype"])
    x = float_input(case["seed"], case["n"], case["lowest"], case["highest"], case["mantissa_bits"]).to(dt)
    assert digest(x) == case["input"]
    q = float_quantizer(case)
    same_bits(q(x), unpack(case["output"]))


@pytest.mark.parametrize("case", GOLDEN["float_granular"], ids=ids(GOLDEN["float_granular"]))
def test_float_format_per_channel_and_per_block(case):
    gran = case["gran"]
    x = float_input(case["seed"], SHAPE[0] * SHAPE[1], case["lowest"], case["highest"],
                    case["mantissa_bits"]).reshape(SHAPE)
    assert digest(x) == case["input"]
    q = float_quantizer(case, shape=scale_shape(gran), block_size=block_size(gran))
    q.set_range(unpack(case["maxval"], scale_shape(gran)))
    scale = unpack(case["scale"], scale_shape(gran))
    check_scale(q, q.maxval, scale)
    same_bits(float_qdq(q, x, scale), unpack(case["output"]))


@pytest.mark.parametrize("case", GOLDEN["float_calibration"], ids=ids(GOLDEN["float_calibration"]))
def test_float_calibration(case):
    """``maxval`` bit for bit; outputs bit for bit given AIMET's scale (see :func:`check_scale`)."""
    gran = case["gran"]
    batches = calibration_batches(case["seed"], SHAPE, 4)
    assert [digest(b) for b in batches] == case["inputs"]
    q = float_quantizer(case, shape=scale_shape(gran), block_size=block_size(gran))
    with q.compute_encodings():
        for b in batches[:3]:
            last = q(b)
            last_scale = plain(last.encoding.scale).clone()
    same_bits(q.maxval, unpack(case["maxval"], scale_shape(gran)))
    scale = unpack(case["scale"], scale_shape(gran))
    check_scale(q, q.maxval, scale)
    lo, hi = q.encoding_analyzer.compute_dynamic_encodings(batches[2], 2**q.format.bits - 1, False)
    batch_maxval = torch.maximum(lo.abs(), hi.abs())  # the last batch's own absmax
    same_bits(last_scale, batch_maxval / q.format.max)
    same_bits(float_qdq(q, batches[2], aimet_scale(batch_maxval, q.format.max)), unpack(case["last_batch_output"]))
    same_bits(float_qdq(q, batches[3], scale), unpack(case["output"]))
