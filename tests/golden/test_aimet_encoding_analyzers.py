"""quanta's percentile and SQNR analyzers against AIMET's (aimet-torch 2.42), from recorded golden vectors.

``aimet_encoding_analyzers.json`` is written by ``generate_aimet_encoding_analyzers.py``
(AIMET in a scratch venv; never a dependency).

* Same histograms in, same encodings out: AIMET's ``compute_encodings_from_stats``
  on histograms with quanta's bin layout must equal quanta's bit for bit (the
  decision rules are the same); only two SQNR candidates within float32
  rounding of each other (a near-tie) may fall either way.
* Raw data in: the libraries bin differently (AIMET: ``num_bins`` bins spanning
  ``[min, max]`` exactly, proportional re-binning; quanta: power-of-two bins
  anchored at zero, exact re-binning — see docs/guides/calibrate.md), so the
  encodings agree exactly where they depend on min/max only, and otherwise to
  within a few of AIMET's bin widths, with the same QDQ quality.
"""

import json
import pathlib

import pytest
import torch

import quanta.quantization as Q
from quanta.grids.affine import IntegerGrid
from quanta.kernels.histogram_search import squared_error
from quanta.kernels.histograms import Histograms
from quanta.quantization.encoding_analyzer import PercentileEncodingAnalyzer, SqnrEncodingAnalyzer

GOLDEN = json.loads((pathlib.Path(__file__).parent / "aimet_encoding_analyzers.json").read_text())


def F(v: str) -> float:
    return float.fromhex(v)


def histograms(rows: list[dict]) -> Histograms:
    return Histograms(
        torch.tensor([r["counts"] for r in rows]),
        torch.tensor([r["exponent"] for r in rows]),
        torch.tensor([r["start"] for r in rows]),
        torch.tensor([F(r["min"]) for r in rows]),
        torch.tensor([F(r["max"]) for r in rows]),
    )


def analyzer(case, shape):
    if case["analyzer"] == "percentile":
        return PercentileEncodingAnalyzer(shape, num_bins=case.get("num_bins", 2048), **case["kwargs"])
    return SqnrEncodingAnalyzer(shape, num_bins=case.get("num_bins", 2048), **case["kwargs"])


NEAR_TIE = 1e-6  # relative: AIMET sums the noise in float32, quanta in float64


@pytest.mark.parametrize("case", GOLDEN["from_stats"], ids=[c["id"] for c in GOLDEN["from_stats"]])
def test_same_histograms_give_aimets_encodings_bit_for_bit(case):
    """Bit for bit, except where two SQNR candidates are within float32 rounding of each other."""
    rows = GOLDEN["histograms"][case["histograms"]]
    hist = histograms(rows)
    a = analyzer(case, (len(rows),))
    lo, hi = a.compute_encodings_from_stats(hist, case["num_steps"], case["symmetric"])
    a_lo, a_hi = torch.tensor([F(v) for v in case["min"]]), torch.tensor([F(v) for v in case["max"]])
    differ = (lo != a_lo) | (hi != a_hi)
    if case["analyzer"] == "percentile" or not bool(differ.any()):
        assert torch.equal(lo, a_lo) and torch.equal(hi, a_hi)
        return
    assert int(differ.sum()) <= 1
    deltas, offsets = a.candidates(hist, case["num_steps"], case["symmetric"])
    noise = squared_error(hist, deltas, offsets, IntegerGrid(0, case["num_steps"]), gamma=a.gamma)
    for r in differ.nonzero().flatten().tolist():
        ranges = offsets[r] * deltas[r], offsets[r] * deltas[r] + case["num_steps"] * deltas[r]
        aimets = ((ranges[0] == a_lo[r]) & (ranges[1] == a_hi[r])).nonzero().flatten()
        assert aimets.numel() > 0, "AIMET's range is one of the candidates"
        assert float(noise[r, aimets].min()) <= float(noise[r].min()) * (1 + NEAR_TIE)


def test_all_but_near_ties_match_aimet():
    """Every percentile case and all SQNR rows but near-ties are bit for bit AIMET's."""
    rows_total = rows_same = 0
    for case in GOLDEN["from_stats"]:
        rows = GOLDEN["histograms"][case["histograms"]]
        lo, hi = analyzer(case, (len(rows),)).compute_encodings_from_stats(histograms(rows), case["num_steps"],
                                                                          case["symmetric"])
        same = (lo == torch.tensor([F(v) for v in case["min"]])) & (hi == torch.tensor([F(v) for v in case["max"]]))
        rows_total += same.numel()
        rows_same += int(same.sum())
    assert rows_same >= rows_total - 2


def qdq_sqnr(x, lo, hi, num_steps, symmetric):
    grid = IntegerGrid.from_num_steps(num_steps, signed=symmetric)
    q = Q.affine.QuantizeDequantize((), qmin=grid.qmin, qmax=grid.qmax, symmetric=symmetric)
    q.set_range(lo, hi)
    with torch.no_grad():
        y = q(x).as_subclass(torch.Tensor)
    return float(10 * torch.log10(x.square().sum() / (x - y).square().sum()))


@pytest.mark.parametrize("case", GOLDEN["end_to_end"], ids=[c["id"] for c in GOLDEN["end_to_end"]])
def test_raw_batches_give_aimets_encodings_within_its_bin_width(case):
    batches = [torch.tensor([F(v) for v in b]) for b in GOLDEN["inputs"][case["batches"]]]
    a = analyzer(case, ())
    for b in batches:
        a.update_stats(b)
    lo, hi = a.compute_encodings(case["num_steps"], case["symmetric"])
    a_lo, a_hi = F(case["min"]), F(case["max"])
    x = torch.cat(batches)
    if case["analyzer"] == "percentile" and case["kwargs"]["percentile"] == 100:
        # quanta: exactly the MinMax range. AIMET: its outer bin edges, min + 2048 * ((max - min) / 2048)
        # in float32, which can miss max by an ulp
        mm = Q.encoding_analyzer.MinMaxEncodingAnalyzer(())
        mm.update_stats(x)
        expect = mm.compute_encodings(case["num_steps"], case["symmetric"])
        assert torch.equal(lo, expect[0]) and torch.equal(hi, expect[1])
        assert lo.item() == pytest.approx(a_lo, rel=1e-6) and hi.item() == pytest.approx(a_hi, rel=1e-6)
        return
    if (lo.item(), hi.item()) == (a_lo, a_hi):
        return
    aimet_bin = float(x.max() - x.min()) / 2048
    if case["analyzer"] == "percentile":  # each end is a bin edge of either library's histogram
        assert abs(lo.item() - a_lo) <= 3 * aimet_bin and abs(hi.item() - a_hi) <= 3 * aimet_bin
    # the same quality of quantization as AIMET's choice
    assert qdq_sqnr(x, lo, hi, case["num_steps"], case["symmetric"]) >= \
        qdq_sqnr(x, torch.tensor(a_lo), torch.tensor(a_hi), case["num_steps"], case["symmetric"]) - 0.05


def test_most_sqnr_encodings_are_identical_to_aimets():
    """The SQNR candidates depend on min/max only; the choice is robust to the binning difference."""
    same = 0
    cases = [c for c in GOLDEN["end_to_end"] if c["analyzer"] == "sqnr"]
    for case in cases:
        a = analyzer(case, ())
        for b in GOLDEN["inputs"][case["batches"]]:
            a.update_stats(torch.tensor([F(v) for v in b]))
        lo, hi = a.compute_encodings(case["num_steps"], case["symmetric"])
        same += (lo.item(), hi.item()) == (F(case["min"]), F(case["max"]))
    assert same >= len(cases) - 2
