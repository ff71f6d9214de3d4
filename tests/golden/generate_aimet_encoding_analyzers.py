"""Generate golden vectors for quanta's encoding analyzers from AIMET's (aimet-torch 2.42).

This script is NOT a test (its name does not start with ``test_``) and does
nothing on import. It needs the anchor library, e.g. the scratch venv described
in ``generate_aimet_affine.py``::

    /path/to/aimet-venv/bin/python tests/golden/generate_aimet_encoding_analyzers.py

It writes ``aimet_encoding_analyzers.json`` next to itself (or to the path given
as the first argument). Floats are hex strings (``float.fromhex``), as in
``aimet_affine.json``.

Two kinds of cases:

* ``from_stats``: AIMET's ``compute_encodings_from_stats`` of
  ``PercentileEncodingAnalyzer`` and ``SqnrEncodingAnalyzer`` on explicit
  histograms. The histograms have quanta's bin layout (width ``2**exponent``,
  bin ``j`` covering ``[(start + j) * w, (start + j + 1) * w)``), so quanta can
  build the very same statistics and the *decision rules* are compared bit for
  bit, independently of how either library bins data. For the percentile
  cases ``min``/``max`` are the outer bin edges, as in every AIMET histogram.
* ``end_to_end``: AIMET's encodings for raw batches (``update_stats`` per batch,
  then ``compute_encodings``). The binning differs (AIMET: ``num_bins`` bins
  over ``[min, max]`` and proportional re-binning; quanta: power-of-two bins
  anchored at zero, exact re-binning), so these are compared within tolerances.
"""

from __future__ import annotations

import json
import math
import os
import sys


def _hex(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    mant, exp = float(v).hex().split("p")
    if "." in mant:
        mant = mant.rstrip("0").rstrip(".")
    return f"{mant}p{exp}"


def _hexes(t) -> list[str]:
    return [_hex(v) for v in t.detach().double().flatten().tolist()]


def main(out_path: str | None = None) -> None:  # noqa: C901 - a flat list of cases
    import aimet_torch
    import torch
    from aimet_torch.quantization.encoding_analyzer import (
        PercentileEncodingAnalyzer,
        SqnrEncodingAnalyzer,
        _Histogram,
    )

    def layout_for(lo: float, hi: float, num_bins: int) -> tuple[int, int]:
        """A power-of-two width and start that fit [lo, hi] in num_bins bins (the smallest such width)."""
        e = math.ceil(math.log2(max(hi - lo, 1e-30) / num_bins)) - 1
        while math.floor(hi / 2.0**e) - math.floor(lo / 2.0**e) + 1 > num_bins:
            e += 1
        return e, math.floor(lo / 2.0**e)

    def histogram_of(x: torch.Tensor, num_bins: int, edges_as_range: bool) -> dict:
        x = x.double()
        lo, hi = float(x.min()), float(x.max())
        e, start = layout_for(lo, hi, num_bins)
        idx = torch.floor(x / 2.0**e).long() - start
        counts = torch.bincount(idx, minlength=num_bins)[:num_bins]
        if edges_as_range:
            lo, hi = start * 2.0**e, (start + num_bins) * 2.0**e
        return {"exponent": e, "start": start, "counts": counts.tolist(), "min": _hex(lo), "max": _hex(hi)}

    def aimet_stats(h: dict) -> _Histogram:
        w = 2.0 ** h["exponent"]
        n = len(h["counts"])
        edges = (torch.arange(n + 1, dtype=torch.float64) + h["start"]) * w
        return _Histogram(
            histogram=torch.tensor(h["counts"], dtype=torch.float32),
            bin_edges=edges.float(),
            min=torch.tensor(float.fromhex(h["min"]), dtype=torch.float32),
            max=torch.tensor(float.fromhex(h["max"]), dtype=torch.float32),
        )

    gen = torch.Generator().manual_seed(1234)

    def sample(kind: str, n: int) -> torch.Tensor:
        if kind == "normal":
            return torch.randn(n, generator=gen)
        if kind == "student_t3":
            z = torch.randn(n, generator=gen)
            chi2 = torch.randn(n, 3, generator=gen).square().sum(1)
            return z / (chi2 / 3).sqrt()
        if kind == "uniform_shifted":
            return torch.rand(n, generator=gen) * 3.0 + 0.5
        if kind == "relu":
            return torch.randn(n, generator=gen).clamp_min(0.0) * 2.0
        if kind == "skewed":
            return torch.randn(n, generator=gen).exp() - 0.7
        raise ValueError(kind)

    from_stats: list[dict] = []
    histograms: dict[str, list[dict]] = {}
    kinds = ["normal", "student_t3", "uniform_shifted", "relu", "skewed"]
    for num_bins in (64, 512, 2048):
        for analyzer in ("percentile", "sqnr"):
            rows = []
            for kind in kinds:
                rows.append(histogram_of(sample(kind, 4000), num_bins, edges_as_range=analyzer == "percentile"))
            key = f"{analyzer}_b{num_bins}"
            histograms[key] = rows
            stats = [aimet_stats(h) for h in rows]
            for num_steps in (15, 255):
                for symmetric in (False, True):
                    settings = ([{"percentile": p} for p in (100.0, 99.9, 99.0, 90.0)] if analyzer == "percentile"
                                else [{"gamma": g} for g in (3.0, 1.0)])
                    for kw in settings:
                        if analyzer == "percentile":
                            a = PercentileEncodingAnalyzer((len(rows),), num_bins=num_bins, percentile=kw["percentile"])
                        else:
                            a = SqnrEncodingAnalyzer((len(rows),), num_bins=num_bins, gamma=kw["gamma"])
                        lo, hi = a.compute_encodings_from_stats(stats, num_steps, symmetric)
                        from_stats.append({
                            "id": f"{analyzer}_b{num_bins}_n{num_steps}_{'sym' if symmetric else 'asym'}_"
                                  + "_".join(f"{k}{v:g}" for k, v in kw.items()),
                            "analyzer": analyzer, "num_bins": num_bins, "num_steps": num_steps,
                            "symmetric": symmetric, "kwargs": kw, "kinds": kinds, "histograms": key,
                            "min": _hexes(lo), "max": _hexes(hi),
                        })

    end_to_end: list[dict] = []
    inputs: dict[str, list[list[str]]] = {}
    for kind in kinds:
        batches = [sample(kind, 1000) * s for s in (1.0, 1.3, 0.8)]
        inputs[kind] = [_hexes(b) for b in batches]
        for analyzer, kw in (("percentile", {"percentile": 100.0}), ("percentile", {"percentile": 99.0}),
                             ("sqnr", {})):
            for num_steps, symmetric in ((255, False), (15, False), (15, True)):
                if analyzer == "percentile":
                    a = PercentileEncodingAnalyzer((), num_bins=2048, **kw)
                else:
                    a = SqnrEncodingAnalyzer((), num_bins=2048, **kw)
                for b in batches:
                    a.update_stats(b)
                lo, hi = a.compute_encodings(num_steps, symmetric)
                end_to_end.append({
                    "id": f"{analyzer}_{kind}_n{num_steps}_{'sym' if symmetric else 'asym'}"
                          + "".join(f"_{k}{v:g}" for k, v in kw.items()),
                    "analyzer": analyzer, "kind": kind, "kwargs": kw, "num_steps": num_steps,
                    "symmetric": symmetric, "batches": kind,
                    "min": _hex(float(lo)), "max": _hex(float(hi)),
                })

    out = {
        "generator": "tests/golden/generate_aimet_encoding_analyzers.py",
        "aimet_torch": getattr(aimet_torch, "__version__", "unknown"),
        "torch": torch.__version__,
        "histograms": histograms,
        "inputs": inputs,
        "from_stats": from_stats,
        "end_to_end": end_to_end,
    }
    path = out_path or os.path.join(os.path.dirname(os.path.abspath(__file__)), "aimet_encoding_analyzers.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {len(from_stats)} from_stats and {len(end_to_end)} end_to_end cases to {path}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
