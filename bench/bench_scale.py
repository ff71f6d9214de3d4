"""Scale benchmark: per-channel fake quantization of a 1-billion-element fp32 tensor (4 GiB).

Run:  python bench/bench_scale.py [--elements 1e9] [--channels 1000000] [--bits 8] [--cases ...]

Every case runs in a fresh subprocess, so peak resident memory (``VmHWM`` from
``/proc/self/status``; ``ru_maxrss`` where that is missing) of one case cannot
mix with another's. Each child imports torch and quanta, allocates the input
``x`` (``elements`` fp32 values, shape ``(channels, elements / channels)``,
filled with ``uniform_(-1, 1)``), then runs its case once under ``no_grad``:

* ``input``       -- nothing more (baseline: the input alone);
* ``clone``       -- ``x.clone()`` (baseline: exactly one extra copy);
* ``module``      -- ``QuantizeDequantize(shape=(channels, 1), bitwidth=8, symmetric=True)``
  with its range set from the per-channel min/max, then ``q(x)``;
* ``functional``  -- ``quantize_dequantize(x, scale, offset, bitwidth=8, signed=True)``
  with ``(channels, 1)`` scale/offset;
* ``functional_out`` -- the same into ``out=x`` (in place: no output allocation);
* ``calibrate``   -- ``with q.compute_encodings(): q(x)`` (MinMax statistics plus the
  batch's own fake quantization);
* ``torch``       -- ``torch.fake_quantize_per_channel_affine`` (PyTorch's own, for reference).

Reported per case: peak RSS (GiB), ``extra = (peak - peak(input)) / input bytes`` (the
number of input-sized copies the case adds; the target for the fake quantizers is at
most one, ``<= 1.0 +`` a little) and the op's time relative to ``x.clone()``'s (each
child warms up on a small tensor first, so the native kernel build or load is not
timed). ``--profile`` re-runs the module and functional cases on a smaller tensor under
``torch.profiler`` and lists the allocations, to see which intermediate is to blame
if a case goes beyond one extra copy.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

GIB = 2**30
#: glibc told to keep freed memory (as jemalloc/tcmalloc do): a second run does not pay for fresh pages
STEADY_ENV = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736"}
CASES = ["input", "clone", "module", "functional", "functional_out", "calibrate", "torch"]


# ---------------------------------------------------------------------------- child side
def _peak_rss() -> int:
    """Peak resident set size of this process, bytes."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _current_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0  # pragma: no cover


def _setup(case: str, x, channels: int, bits: int):
    """The callable a case times (after the input exists); built outside the timed region."""
    import torch

    import quanta.quantization as Q

    if case == "input":
        return lambda: None
    if case == "clone":
        return lambda: x.clone()
    lo, hi = x.aminmax(dim=1, keepdim=True)
    if case in ("module", "calibrate"):
        q = Q.affine.QuantizeDequantize(shape=(channels, 1), bitwidth=bits, symmetric=True)
        if case == "calibrate":
            def calibrate():
                with q.compute_encodings():
                    q(x)
            return calibrate
        q.set_range(lo, hi)
        return lambda: q(x)
    absmax = torch.maximum(lo.abs(), hi.abs()).clamp_min(1e-8)
    scale = absmax / (2 ** (bits - 1) - 1)
    offset = torch.zeros_like(scale)
    if case == "functional":
        return lambda: Q.affine.quantize_dequantize(x, scale, offset, bitwidth=bits, signed=True)
    if case == "functional_out":
        return lambda: Q.affine.quantize_dequantize(x, scale, offset, bitwidth=bits, signed=True, out=x)
    if case == "torch":
        s, zp = scale.reshape(-1), torch.zeros(channels, dtype=torch.int32)
        lo_q, hi_q = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        return lambda: torch.fake_quantize_per_channel_affine(x, s, zp, 0, lo_q, hi_q)
    raise ValueError(f"unknown case {case!r}")


def child(case: str, elements: int, channels: int, bits: int, threads: int | None) -> dict:
    import torch

    import quanta.quantization  # noqa: F401  (every case pays the same imports)

    if threads:
        torch.set_num_threads(threads)
    # warm up on a small tensor: native kernel build/load, plan caches
    small = torch.empty(64, 256).uniform_(-1, 1)
    _setup(case, small, 64, bits)()
    del small
    rss_imports = _current_rss()

    cols = elements // channels
    x = torch.empty(channels, cols).uniform_(-1, 1)
    rss_input = _current_rss()
    with torch.no_grad():
        fn = _setup(case, x, channels, bits)
        t0 = time.perf_counter()
        y = fn()
        seconds = time.perf_counter() - t0
        peak = _peak_rss()
        out_bytes = y.numel() * y.element_size() if isinstance(y, torch.Tensor) else 0
        del y  # the second run reuses that memory (steady allocator) or maps it afresh (default): same peak
        t0 = time.perf_counter()
        fn()
        seconds_warm = time.perf_counter() - t0
    return {"case": case, "peak": peak, "peak_after_second_run": _peak_rss(), "rss_imports": rss_imports,
            "rss_input": rss_input, "seconds": seconds, "seconds_warm": seconds_warm,
            "input_bytes": x.numel() * x.element_size(), "output_bytes": out_bytes,
            "threads": torch.get_num_threads()}


# ---------------------------------------------------------------------------- parent side
def _run_child(case: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", case, "--elements", str(args.elements),
           "--channels", str(args.channels), "--bits", str(args.bits)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = {**os.environ, **(STEADY_ENV if args.allocator == "steady" else {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {"case": case, "error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def profile(elements: int, channels: int, bits: int) -> None:
    """Allocations of the module and functional cases, from torch.profiler (a smaller tensor will do)."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    x = torch.empty(channels, elements // channels).uniform_(-1, 1)
    nbytes = x.numel() * x.element_size()
    for case in ("module", "functional", "calibrate"):
        fn = _setup(case, x, channels, bits)
        with torch.no_grad():
            fn()  # warm
            with torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True) as prof:
                fn()
        rows = [(e.key, e.self_cpu_memory_usage, e.count) for e in prof.key_averages()
                if e.self_cpu_memory_usage > nbytes // 16]
        print(f"\n{case}: ops allocating more than 1/16 of the input ({nbytes / GIB:.3f} GiB)")
        for key, mem, count in sorted(rows, key=lambda r: -r[1]):
            print(f"  {key:<40} {mem / nbytes:6.2f} x input   ({count} calls)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--elements", type=float, default=1e9, help="input elements (default 1e9 = 4 GiB fp32)")
    p.add_argument("--channels", type=int, default=1_000_000, help="channels (rows); default 1e6")
    p.add_argument("--bits", type=int, default=8)
    p.add_argument("--threads", type=int, default=0, help="torch threads in each child (0: torch's default)")
    p.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    p.add_argument("--allocator", choices=["default", "steady"], default="default",
                   help="glibc as configured, or told to keep freed memory (see STEADY_ENV)")
    p.add_argument("--profile", action="store_true", help="list allocations per op (on --elements)")
    p.add_argument("--json", action="store_true", help="print the raw results as JSON too")
    p.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.elements = int(args.elements)
    if args.elements % args.channels:
        p.error(f"--elements {args.elements} must be a multiple of --channels {args.channels}")

    if args.child:
        print(json.dumps(child(args.child, args.elements, args.channels, args.bits, args.threads or None)))
        return 0
    if args.profile:
        profile(args.elements, args.channels, args.bits)
        return 0

    cases = list(dict.fromkeys(["input", "clone", *args.cases]))  # the baselines always run
    results = {}
    for case in cases:
        results[case] = r = _run_child(case, args)
        if "error" in r:
            print(f"{case:<15} failed: {r['error']}", flush=True)
    base, clone = results.get("input", {}), results.get("clone", {})
    if "error" in base or "error" in clone:
        print("the baselines failed; no ratios")
        return 1
    nbytes = base["input_bytes"]
    print(f"\n{args.elements:,} fp32 elements ({nbytes / GIB:.2f} GiB), shape ({args.channels:,}, "
          f"{args.elements // args.channels:,}), per-channel axis 0, {args.bits}-bit, no_grad, "
          f"{base['threads']} threads; each case in a fresh process")
    print(f"imports alone: {base['rss_imports'] / GIB:.2f} GiB RSS\n")
    print(f"{'case':<15} {'peak RSS GiB':>12} {'extra copies':>13} {'1st run s':>10} {'/ clone':>8} "
          f"{'2nd run s':>10} {'/ clone':>8}")
    for case in cases:
        r = results[case]
        if "error" in r:
            continue
        extra = (r["peak"] - base["peak"]) / nbytes
        rel = r["seconds"] / clone["seconds"] if case != "input" else float("nan")
        warm = r["seconds_warm"] / clone["seconds_warm"] if case != "input" else float("nan")
        print(f"{case:<15} {r['peak'] / GIB:12.2f} {extra:13.3f} {r['seconds']:10.2f} {rel:8.2f} "
              f"{r['seconds_warm']:10.2f} {warm:8.2f}")
    print("\nextra copies = (peak - peak of 'input') / input size; target for the fake quantizers: <= 1.0 + small."
          f"\nallocator: {args.allocator} (the 1st run maps fresh pages for its output; with --allocator steady "
          "the 2nd reuses them)")
    if args.json:
        print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
