"""Integer-weight linear kernels (quanta.kernels.int_linear) against bf16 F.linear, layer by layer.

Weights of the shapes of a Llama-3-8B layer: N x K = 4096 x 4096 (attention) and
14336 x 4096 / 4096 x 14336 (MLP up / down), rows M = 1, 4, 16, 32, 128, 512 of
bfloat16 activations, 2 threads. Every case is timed in interleaved pairs with
the baseline (bf16 ``F.linear`` on the same activations), as ``harness.ratio``
does: each side runs once untimed right before its timed run, so both read
their weight warm from cache (the shapes fit the L3), and the figure is the
median of the per-pair ratios. ``--clock cpu`` times the calling thread's CPU
time instead of the wall clock (use it with ``--threads 1`` on a machine shared
with other jobs: time spent descheduled then does not count). ``OMP_WAIT_POLICY``
is ``passive`` unless the environment sets it (see bench_llm.py: spin-waiting
threads make every parallel region wait on a loaded machine). Torch's own kernels (``_weight_int8pack_mm``,
``_weight_int4pack_mm_for_cpu``, which quanta used before its own) are measured
the same way for comparison. Outputs are checked against a float reference
before timing. Not a test: nothing here asserts on time.

    python bench/bench_int_linear_kernels.py [--pairs 7] [--threads 2] [--clock wall|cpu]
                                             [--shapes 4096x4096,14336x4096] [--rows 1,4,16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # before torch's OpenMP runtime starts (torch is imported below)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from quanta.kernels import int_linear_native  # noqa: E402
from quanta.kernels.int_linear import (  # noqa: E402
    int4_cpu_linear,
    int8_dynamic_activation_linear,
    int8_weight_only_linear,
    pack_int4_cpu,
    prepare_int8_dynamic,
    prepare_int8_weight_only,
)

SHAPES = ((4096, 4096), (14336, 4096), (4096, 14336))  # (N, K): out x in features
ROWS = (1, 4, 16, 32, 128, 512)


def _paired(candidate, baseline, pairs: int, clock) -> tuple[float, float, float]:
    """Median ratio candidate/baseline over interleaved pairs (each side warm), and both median times."""
    def once(fn):
        fn()  # warm: the timed run finds its own weight in cache
        t0 = clock()
        fn()
        return clock() - t0

    ratios, tc, tb = [], [], []
    for _ in range(pairs):
        c, b = once(candidate), once(baseline)
        ratios.append(c / max(b, 1e-9))
        tc.append(c)
        tb.append(b)
    return statistics.median(ratios), statistics.median(tc), statistics.median(tb)


def _int4(w: torch.Tensor, group_size: int):
    n, k = w.shape
    wg = w.reshape(n, k // group_size, group_size)
    mn, mx = wg.amin(-1), wg.amax(-1)
    s = (mx - mn).clamp(min=1e-6) / 15
    z = mn + s * 8
    codes = torch.clamp(torch.round((wg - mn[..., None]) / s[..., None]), 0, 15).to(torch.uint8).reshape(n, k)
    return codes, s, z


def _check(name: str, got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    err = float((got.float() - want.float()).norm() / want.float().norm())
    if not err <= rtol:
        raise SystemExit(f"{name}: relative error {err:.3g} > {rtol}; not timing a wrong kernel")


def _cases(n: int, k: int, g: torch.Generator):
    """Prepared weights and a function of x giving {case name: call} for one shape."""
    w = torch.randn(n, k, generator=g) * 0.02
    wb = w.to(torch.bfloat16)
    s8 = w.abs().amax(1) / 127.5
    q8 = torch.clamp(torch.round(w / s8[:, None]), -128, 127).to(torch.int8)
    qw, qs = prepare_int8_weight_only(q8, s8)
    wt, ws, cs = prepare_int8_dynamic(q8, s8)
    int4 = {}
    for gs in (128, 32):
        codes, s4, z4 = _int4(w, gs)
        int4[gs] = pack_int4_cpu(codes, s4, z4, gs)
    # torch's own kernels, for comparison (its int4 packing: capability-dependent)
    c128, s128, z128 = _int4(w, 128)
    t4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(c128.to(torch.int32), 1)
    t4_sz = torch.stack([s128, z128], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
    w8_deq = q8.float() * qs.float()[:, None]

    def make(x: torch.Tensor):
        ref8 = x.float() @ w8_deq.T
        ref = x.float() @ w.T
        _check("int8 weight-only", int8_weight_only_linear(x, qw, qs), ref8, 1e-2)
        for gs, (p, sz) in int4.items():
            _check(f"int4 g{gs}", int4_cpu_linear(x, p, sz, gs, n), ref, 0.15)
        _check("int8 dynamic", int8_dynamic_activation_linear(x, wt, ws, cs), ref8, 3e-2)
        return {
            "int8 weight-only": lambda: int8_weight_only_linear(x, qw, qs),
            "int4 weight-only g128": lambda: int4_cpu_linear(x, *int4[128], 128, n),
            "int4 weight-only g32": lambda: int4_cpu_linear(x, *int4[32], 32, n),
            "int8 dynamic act + int8 weight": lambda: int8_dynamic_activation_linear(x, wt, ws, cs),
            "torch _weight_int8pack_mm": lambda: torch._weight_int8pack_mm(x, q8, qs),
            "torch _weight_int4pack_mm_for_cpu g128": lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(
                x, t4, 128, t4_sz),
        }

    return wb, make


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES), help="NxK,NxK,...")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    rows = [int(v) for v in args.rows.split(",")]
    g = torch.Generator().manual_seed(0)
    int_linear_native.ops()
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.clock} clock, quanta kernels: "
          f"{int_linear_native.status()} ({int_linear_native.isa()}), OMP_WAIT_POLICY="
          f"{os.environ['OMP_WAIT_POLICY']}, load average "
          f"{' '.join(f'{v:.1f}' for v in os.getloadavg())}; bfloat16 activations; figures are medians of "
          f"{args.pairs} interleaved (case, bf16 F.linear) pairs, each side warm")
    header = f"| {'N x K':>11} | {'M':>3} | {'case':<40} | {'ms':>8} | {'bf16 F.linear ms':>16} | {'/ bf16':>6} |"
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    for n, k in shapes:
        wb, make = _cases(n, k, g)
        for m in rows:
            x = torch.randn(m, k, generator=g).to(torch.bfloat16)
            base = lambda: F.linear(x, wb)  # noqa: E731
            for name, fn in make(x).items():
                r, tc, tb = _paired(fn, base, args.pairs, clock)
                print(f"| {f'{n} x {k}':>11} | {m:>3} | {name:<40} | {tc * 1e3:>8.3f} | {tb * 1e3:>16.3f} | "
                      f"{r:>6.2f} |", flush=True)


if __name__ == "__main__":
    main()
