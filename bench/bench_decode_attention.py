"""Decode attention on CPU: quanta's kernel against torch's scaled_dot_product_attention, same inputs, same run.

One query token of a Llama-shaped layer (32 query heads, 4 key/value heads, head dimension 64, bfloat16; the
LLM benchmark's model) against key/value caches of several lengths. Prints the time of a call of each, its
ratio, and the cache's read bandwidth (bytes of keys and values over the call's time). ``quanta`` is the public
function (argument checks included); ``quanta op`` the registered op a compiled graph calls. Outputs are
checked against float32 attention (within bfloat16's half step) before anything is timed.

A second table does the same on a preallocated cache (transformers' ``StaticCache``: ``--cache-len`` slots,
the first S filled, the rest masked), as a compiled decode loop calls it.

    python bench/bench_decode_attention.py [--threads 2] [--contexts 128 512 1024 4096] [--cache-len 4096]

Not a test: nothing asserts on time.
"""

from __future__ import annotations

import argparse
import statistics
import time


def _time(fn, reps: int) -> float:
    fn()
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        runs.append((time.perf_counter() - t) / reps)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", type=int, nargs="+", default=[128, 512, 1024, 4096])
    ap.add_argument("--cache-len", type=int, default=4096, help="slots of the preallocated cache (second table)")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F

    from quanta.kernels import int_linear_native
    from quanta.kernels.decode_attention import decode_attention

    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 32, 1, 64, generator=g).to(torch.bfloat16)
    int_linear_native.ops()
    op = torch.ops.quanta_cpu.decode_attention
    print(f"torch {torch.__version__}, {args.threads} threads, quanta kernels {int_linear_native.status()} "
          f"({int_linear_native.isa()}); q [1, 32, 1, 64] bf16, k/v [1, 4, S, 64] bf16")
    print("| cached tokens S | SDPA us | quanta us | quanta op us | SDPA / quanta | quanta op GB/s |")
    print("|---|---|---|---|---|---|")
    for s in args.contexts:
        k = torch.randn(1, 4, s, 64, generator=g).to(torch.bfloat16)
        v = torch.randn(1, 4, s, 64, generator=g).to(torch.bfloat16)
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True).transpose(1, 2)
        err = float((decode_attention(q, k, v).float() - want).abs().max())
        if err > 2.0**-7 * float(v.abs().max()):  # checked before anything is timed: bfloat16's half step
            raise SystemExit(f"decode_attention differs from float attention by {err} at S = {s}")
        reps = max(20, 20000 // s)
        sdpa = _time(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), reps)
        ours = _time(lambda: decode_attention(q, k, v), reps)
        raw = _time(lambda: op(q, k, v, 0.125, None), reps)
        gbs = (k.numel() + v.numel()) * 2 / raw / 1e9
        print(f"| {s} | {sdpa * 1e6:.0f} | {ours * 1e6:.0f} | {raw * 1e6:.0f} | {sdpa / ours:.1f} | {gbs:.1f} |")

    n = args.cache_len
    print(f"\npreallocated cache of {n} slots, the first S filled (boolean key mask, as transformers' StaticCache)")
    print("| filled S | SDPA us | quanta op us | SDPA / quanta op |")
    print("|---|---|---|---|")
    k = torch.randn(1, 4, n, 64, generator=g).to(torch.bfloat16)
    v = torch.randn(1, 4, n, 64, generator=g).to(torch.bfloat16)
    for s in (c for c in args.contexts if c <= n):
        live = torch.arange(n) < s
        op_mask, sdpa_mask = live[None], live[None, None, None]  # [B, S] for quanta, broadcastable for SDPA
        want = F.scaled_dot_product_attention(q.float(), k[:, :, :s].float(), v[:, :, :s].float(),
                                              enable_gqa=True).transpose(1, 2)
        err = float((op(q, k, v, 0.125, op_mask).float() - want).abs().max())
        if err > 2.0**-7 * float(v.abs().max()):
            raise SystemExit(f"decode_attention on a preallocated cache differs by {err} at S = {s}")
        reps = max(20, 20000 // n)
        sdpa = _time(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask, enable_gqa=True), reps)
        raw = _time(lambda: op(q, k, v, 0.125, op_mask), reps)
        print(f"| {s} | {sdpa * 1e6:.0f} | {raw * 1e6:.0f} | {sdpa / raw:.1f} |")


if __name__ == "__main__":
    main()
