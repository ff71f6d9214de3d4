"""Calibration throughput of every encoding analyzer at every granularity, and which analyzer to pick.

Not a test: it asserts nothing about time. Two parts:

1. Throughput on a 4096x4096 float32 tensor, in elements per second:
   ``update`` is one ``update_stats`` call (statistics only); ``calibrate`` is
   ``update_stats`` followed by ``compute_encodings`` (8 bits, asymmetric and
   symmetric, counted as one calibration each), i.e. what one weight costs.
   Granularities: per tensor ``()``, per channel ``(4096, 1)``, per block
   ``(4096, 32)`` with ``block_size=(1, 128)``. Histogram analyzers use 2048 bins
   per tensor and per channel, and 256 bins per block (131072 histograms of
   2048 bins would be 2 GiB of counts; pass ``--block-bins``).
2. QDQ SQNR (dB) on heavy-tailed data (Student-t, 3 degrees of freedom,
   64x16384) at 8 and 4 bits, per tensor and per channel, asymmetric and
   symmetric, for each analyzer.

    python bench/bench_calibration.py            # a few minutes on 2 cores
    python bench/bench_calibration.py --quick    # per tensor only, and the SQNR table
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import quanta.quantization as Q
from quanta.quantization.encoding_analyzer import (
    EntropyEncodingAnalyzer,
    MinMaxEncodingAnalyzer,
    MseEncodingAnalyzer,
    PercentileEncodingAnalyzer,
    SqnrEncodingAnalyzer,
)

ANALYZERS = [
    ("minmax", MinMaxEncodingAnalyzer, {}),
    ("percentile(99.99)", PercentileEncodingAnalyzer, {"percentile": 99.99}),
    ("sqnr", SqnrEncodingAnalyzer, {}),
    ("mse", MseEncodingAnalyzer, {}),
    ("entropy", EntropyEncodingAnalyzer, {}),
]


def make(cls, kw, shape, block_size, num_bins):
    if cls is MinMaxEncodingAnalyzer:
        return cls(shape, block_size=block_size)
    return cls(shape, num_bins=num_bins, block_size=block_size, **kw)


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def throughput(args) -> None:
    x = torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0))
    n = x.numel()
    grans = [("per-tensor", (), None, 2048)]
    if not args.quick:
        grans += [("per-channel", (4096, 1), None, 2048), ("per-block", (4096, 32), (1, 128), args.block_bins)]
    print(f"threads: {torch.get_num_threads()}, input 4096x4096 float32 ({n / 1e6:.1f}M elements)")
    print(f"{'analyzer':18s} {'granularity':12s} {'bins':>5s} {'update Melem/s':>15s} {'calibrate Melem/s':>18s}"
          f" {'compute s':>10s}")
    for gname, shape, block_size, bins in grans:
        for name, cls, kw in ANALYZERS:
            a = make(cls, kw, shape, block_size, bins)
            a.update_stats(x)  # warm-up (native kernels, allocator)
            a.compute_encodings(255, False)

            def update():
                a.reset_stats()
                a.update_stats(x)

            t_update = timed(update, args.repeats)
            t_asym = timed(lambda: a.compute_encodings(255, False), max(1, args.repeats // 2))
            t_sym = timed(lambda: a.compute_encodings(255, True), max(1, args.repeats // 2))
            t_cal = t_update + (t_asym + t_sym) / 2
            print(f"{name:18s} {gname:12s} {'-' if cls is MinMaxEncodingAnalyzer else bins:>5} "
                  f"{n / t_update / 1e6:15.1f} {n / t_cal / 1e6:18.2f} {(t_asym + t_sym) / 2:10.3f}", flush=True)


def student_t3(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(shape, generator=g)
    return z / (torch.randn(*shape, 3, generator=g).square().sum(-1) / 3).sqrt()


def qdq_sqnr_db(x, shape, bits, symmetric, analyzer):
    q = Q.affine.QuantizeDequantize(shape, bits, symmetric, encoding_analyzer=analyzer)
    with q.compute_encodings():
        q(x)
    with torch.no_grad():
        y = q(x).as_subclass(torch.Tensor)
    return float(10 * torch.log10(x.square().sum() / (x - y).square().sum()))


def quality(args) -> None:
    x = student_t3((64, 16384))
    table = ANALYZERS[:1] + [("percentile(99.9)", PercentileEncodingAnalyzer, {"percentile": 99.9})] + ANALYZERS[1:]
    print("\nQDQ SQNR (dB), Student-t 3 dof, 64x16384; per channel = 64 channels of 16384 values")
    cols = [(g, b, s) for g in ("tensor", "channel") for b in (8, 4) for s in (False, True)]
    print(f"{'analyzer':18s} " + " ".join(f"{g[:4]}/{b}b/{'sym' if s else 'asym':4s}" for g, b, s in cols))
    for name, cls, kw in table:
        vals = []
        for g, b, s in cols:
            shape = () if g == "tensor" else (64, 1)
            vals.append(qdq_sqnr_db(x, shape, b, s, make(cls, kw, shape, None, 2048)))
        print(f"{name:18s} " + " ".join(f"{v:15.2f}" for v in vals), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="per-tensor throughput only")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--block-bins", type=int, default=256)
    p.add_argument("--no-quality", action="store_true", help="skip the SQNR table")
    args = p.parse_args()
    throughput(args)
    if not args.no_quality:
        quality(args)


if __name__ == "__main__":
    main()
