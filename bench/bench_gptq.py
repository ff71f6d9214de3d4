"""GPTQ's cost on one layer: ``gptq_quantize`` against the textbook loop, in the same run.

GPTQ quantizes a weight column by column (each column's rounding error is spread over the columns not yet
quantized), so a layer of ``K`` inputs runs ``K`` small steps of a few torch ops each; on a 7B LLM that is over
a million steps. The baseline is the loop as the paper writes it (Frantar et al. 2023, Algorithm 1) over
quanta's checked primitives (``quanta.quantization.gptq.gptq_quantize_reference``: ``quantize_affine`` /
``dequantize_affine`` at every column, the rank-1 update as an ``[N, 1] @ [1, b]`` matmul). Both give the same
bits (checked here, and in ``tests/quantization/test_gptq.py``). The Cholesky factorisation of the inverse
Hessian, which both need once per layer, is timed alone for reference. Not a test: nothing here asserts on time.

    python bench/bench_gptq.py [--shapes 384x1536,1536x384,2048x2048] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from quanta.quantization import Int4WeightOnlyConfig, IntxWeightOnlyConfig, PerGroup
from quanta.quantization.gptq import (HessianObserver, _inverse_cholesky, gptq_quantize,
                                      gptq_quantize_reference)
from quanta.quantization.weight_grid import WeightGrid


def _best(fn, rounds: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(rounds):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default="384x1536,1536x384,2048x2048", help="NxK,NxK,... (out x in features)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    configs = [("int4 g128", Int4WeightOnlyConfig(group_size=128)),
               ("int3 g128", IntxWeightOnlyConfig(torch.int3, PerGroup(128)))]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; best of {args.rounds}")
    print("| N x K | config | gptq_quantize s | us / column | textbook loop s | textbook / quanta | Cholesky s |")
    print("|---|---|---|---|---|---|---|")
    for shape in args.shapes.split(","):
        n, k = map(int, shape.split("x"))
        torch.manual_seed(0)
        lin = nn.Linear(k, n)
        w = lin.weight.detach()
        obs = HessianObserver(k)
        obs.update(torch.randn(2 * k, k) @ torch.randn(k, k) / k ** 0.5 + torch.randn(k))
        h = obs.hessian()
        chol, _ = _best(lambda: _inverse_cholesky(h.clone(), 0.01), args.rounds)
        for name, config in configs:
            ours, result = _best(lambda: gptq_quantize(w, h, WeightGrid(config, lin, w)), args.rounds)
            base, expected = _best(lambda: gptq_quantize_reference(w, h, WeightGrid(config, lin, w)), args.rounds)
            if not torch.equal(result.tensor.dequantize(), expected):
                raise SystemExit(f"{shape} {name}: gptq_quantize and the textbook loop differ")
            print(f"| {n} x {k} | {name} | {ours:.3f} | {ours / k * 1e6:.0f} | {base:.3f} | {base / ours:.2f} | "
                  f"{chol:.3f} |")


if __name__ == "__main__":
    main()
