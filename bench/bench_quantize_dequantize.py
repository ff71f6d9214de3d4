"""quantize_dequantize forward time as a ratio to ``x.clone()`` on 16M fp32 elements.

Run:  python bench/bench_quantize_dequantize.py [--threads 2] [--pairs 15]

Cases: per-tensor, per-channel (4096 channels) and per-block (block 64), 8-bit.
Before timing, every case's output is checked bit for bit against the
reference implementation on a slice (the bench never times a wrong answer).
"""

from __future__ import annotations

import argparse

import torch

import quanta.quantization as Q
from quanta.grids.affine import IntegerGrid
from quanta.kernels.reference import quantize_dequantize_reference

from harness import ratio


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pairs", type=int, default=15)
    p.add_argument("--size", type=int, default=4096)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    n = args.size
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, n, generator=gen)
    cases = {
        "per-tensor": (torch.tensor(0.02), torch.tensor(0.0), None),
        "per-channel": (torch.rand(n, 1, generator=gen) * 0.02 + 0.01, torch.zeros(n, 1), None),
        "per-block(64)": (torch.rand(n, n // 64, generator=gen) * 0.02 + 0.01, torch.zeros(n, n // 64), (-1, 64)),
    }
    print(f"quantize_dequantize forward, {n}x{n} fp32, {args.threads} threads, "
          f"median of {args.pairs} interleaved pairs")
    print(f"{'case':<16}{'ratio to clone':>16}{'qdq ms':>10}{'clone ms':>10}")
    for name, (s, o, block) in cases.items():
        fn = lambda: Q.affine.quantize_dequantize(x, s, o, bitwidth=8, signed=True, block_size=block)  # noqa: E731
        rows = slice(0, 64)
        s_rows = s if s.dim() == 0 else s[rows]
        o_rows = o if o.dim() == 0 else o[rows]
        got = Q.affine.quantize_dequantize(x[rows], s_rows, o_rows, bitwidth=8, signed=True, block_size=block)
        ref = quantize_dequantize_reference(x[rows], s_rows, o_rows, IntegerGrid(-128, 127), block)
        assert torch.equal(got, ref), f"{name}: fast path disagrees with the reference"
        r, tc, tb = ratio(fn, x.clone, pairs=args.pairs)
        print(f"{name:<16}{r:>16.2f}{tc * 1e3:>10.1f}{tb * 1e3:>10.1f}")


if __name__ == "__main__":
    main()
