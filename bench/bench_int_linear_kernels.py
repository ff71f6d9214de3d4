"""Integer-weight linear kernels (quanta.kernels.int_linear) against float and raw-kernel baselines.

K = N = 4096, M in {1, 32}, 2 threads, float32 and bfloat16 activations. Every
round calls each case once (the order rotates between rounds); a case's figure
is the median over rounds of its time, and each ratio is the median over rounds
of (case time / baseline time in the same round), so machine noise hits both
sides of a ratio alike. Outputs are checked against the baselines before timing.
Not a test: nothing here asserts on time.

    python bench/bench_int_linear_kernels.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from quanta.kernels.int_linear import (
    int4_cpu_linear,
    int8_dynamic_activation_linear,
    int8_weight_only_linear,
    pack_int4_cpu,
    prepare_int8_dynamic,
    prepare_int8_weight_only,
)

K = N = 4096
GROUP_SIZE = 128
BASE_FP32 = "F.linear fp32 (baseline)"
BASE_BF16 = "F.linear bf16 (baseline)"
BASE_INT8 = "raw _weight_int8pack_mm, bf16 x (baseline)"


def _weights(g: torch.Generator):
    w = torch.randn(N, K, generator=g) * 0.02
    # int8 per-row symmetric (torchao Int8WeightOnlyConfig's grid)
    s8 = w.abs().amax(1) / 127.5
    q8 = torch.clamp(torch.round(w / s8[:, None]), -128, 127).to(torch.int8)
    # uint4 per-group, float zero point (tinygemm)
    wg = w.reshape(N, K // GROUP_SIZE, GROUP_SIZE)
    mn, mx = wg.amin(-1), wg.amax(-1)
    s4 = (mx - mn).clamp(min=1e-6) / 15
    z4 = mn + s4 * 8
    c4 = torch.clamp(torch.round((wg - mn[..., None]) / s4[..., None]), 0, 15).to(torch.uint8).reshape(N, K)
    return w, (q8, s8), (c4, s4, z4)


def _check(name: str, got: torch.Tensor, want: torch.Tensor, rtol: float) -> None:
    err = float((got.float() - want.float()).norm() / want.float().norm())
    if not err <= rtol:
        raise SystemExit(f"{name}: relative error {err:.3g} > {rtol}; not timing a wrong kernel")


def _time_rounds(cases: dict[str, object], rounds: int, warmup: int = 2) -> dict[str, list[float]]:
    names = list(cases)
    for _ in range(warmup):
        for fn in cases.values():
            fn()
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            t0 = time.perf_counter()
            cases[n]()
            times[n].append(time.perf_counter() - t0)
    return times


def _ratio(times: dict[str, list[float]], case: str, base: str) -> float:
    return statistics.median(c / b for c, b in zip(times[case], times[base]))


def _cases(x: torch.Tensor, m: int, w, int8, int4, dyn) -> dict[str, object]:
    """The timed calls for one activation ``x``, after checking every output against a float reference."""
    w_fp32, w_bf16, w8_deq = w
    qw8, qs8 = int8
    packed, sz = int4
    wt, ws, cs = dyn
    x32, xb = x.float(), x.to(torch.bfloat16)
    ref = x32 @ w8_deq.T
    _check("int8_weight_only_linear", int8_weight_only_linear(x, qw8, qs8), ref, 1e-2)
    _check("raw _weight_int8pack_mm", torch._weight_int8pack_mm(xb, qw8, qs8), ref, 1e-2)
    _check("int4_cpu_linear", int4_cpu_linear(x, packed, sz, GROUP_SIZE, N), x32 @ w_fp32.T, 0.15)
    _check("int8_dynamic (sym)", int8_dynamic_activation_linear(x, wt, ws, cs), ref, 2e-2)
    _check("int8_dynamic (asym)", int8_dynamic_activation_linear(x, wt, ws, cs, act_symmetric=False), ref, 2e-2)
    cases = {
        BASE_FP32: lambda: F.linear(x32, w_fp32),
        BASE_BF16: lambda: F.linear(xb, w_bf16),
        BASE_INT8: lambda: torch._weight_int8pack_mm(xb, qw8, qs8),
        "int8_weight_only_linear": lambda: int8_weight_only_linear(x, qw8, qs8),
        "int4_cpu_linear": lambda: int4_cpu_linear(x, packed, sz, GROUP_SIZE, N),
        "int8_dynamic_activation_linear (sym)": lambda: int8_dynamic_activation_linear(x, wt, ws, cs),
        "int8_dynamic_activation_linear (asym)":
            lambda: int8_dynamic_activation_linear(x, wt, ws, cs, act_symmetric=False),
    }
    if x.dtype == torch.float32 and m == 1:  # why float32 activations are cast: the float32 kernel is scalar code
        s8_fp32 = qs8.float()
        cases["raw _weight_int8pack_mm, fp32 x (not used)"] = lambda: torch._weight_int8pack_mm(x32, qw8, s8_fp32)
    return cases


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(2)
    g = torch.Generator().manual_seed(0)
    w, (q8, s8), (c4, s4, z4) = _weights(g)
    weights = (w.contiguous(), w.to(torch.bfloat16), q8.float() * s8[:, None])
    int8 = prepare_int8_weight_only(q8, s8)
    int4 = pack_int4_cpu(c4, s4, z4, GROUP_SIZE)
    dyn = prepare_int8_dynamic(q8, s8)

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU capability {torch.backends.cpu.get_cpu_capability()}, K = N = {K}, int4 group size {GROUP_SIZE}, "
          f"{args.rounds} rounds; ratios are medians of same-round ratios")
    header = (f"| {'M':>2} | {'x':<4} | {'case':<44} | {'ms':>7} | {'/ fp32 F.linear':>15} | "
              f"{'/ bf16 F.linear':>15} | {'/ raw int8pack':>14} |")
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    for m in (1, 32):
        for act in (torch.float32, torch.bfloat16):
            x = torch.randn(m, K, generator=g).to(act)
            cases = _cases(x, m, weights, int8, int4, dyn)
            times = _time_rounds(cases, args.rounds)
            act_name = "fp32" if act == torch.float32 else "bf16"
            for name in cases:
                ms = statistics.median(times[name]) * 1e3
                r32, rbf = _ratio(times, name, BASE_FP32), _ratio(times, name, BASE_BF16)
                r8 = f"{_ratio(times, name, BASE_INT8):>14.2f}" if "int8" in name else f"{'':>14}"
                print(f"| {m:>2} | {act_name:<4} | {name:<44} | {ms:>7.2f} | {r32:>15.2f} | {rbf:>15.2f} | {r8} |")


if __name__ == "__main__":
    main()
