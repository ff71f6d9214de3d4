"""Quantized Linear layers on CPU: speed against float ``F.linear``, output SQNR and stored size.

For a Linear with K = N = 4096 (default) and M = 1 and 32 rows of input, fp32
and bf16 activations, 2 threads: each quantized layer (built by ``quantize_``)
is timed in interleaved pairs against fp32 ``F.linear``, bf16 ``F.linear`` and
(int8) the raw ``torch._weight_int8pack_mm`` call on the same codes, all
measured in this run; figures are medians of per-pair ratios (< 1 = faster
than the baseline), each side timed on its second consecutive run (weights in
cache, as in a decoding loop; the machine's L3 holds a 4096² bf16 weight). Then the output SQNR against the float layer on Gaussian
weights and inputs, and the bytes each layer stores.

Run: ``python bench/bench_quantized_linear.py [--k 4096 --n 4096 --pairs 25 --threads 2]``
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from harness import ratio  # noqa: E402

from quanta.dtypes import AffineQuantizedTensor, LinearActivationQuantizedTensor  # noqa: E402
from quanta.quantization import (  # noqa: E402
    Float8WeightOnlyConfig,
    FPXWeightOnlyConfig,
    Int4WeightOnlyConfig,
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    PerGroup,
    quantize_,
)


def sqnr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    ref, out = ref.double(), out.double()
    return 10 * math.log10(ref.pow(2).sum().item() / max((ref - out).pow(2).sum().item(), 1e-300))


def stored_bytes(weight: torch.Tensor) -> int:
    if isinstance(weight, (AffineQuantizedTensor, LinearActivationQuantizedTensor)):
        return weight.storage_nbytes
    return weight.numel() * weight.element_size()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--pairs", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--slow", action="store_true", help="also time the tile-by-tile layouts (float8, fpx, int4 packed)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    k, n = args.k, args.n
    base = torch.nn.Linear(k, n, bias=False)
    with torch.no_grad():
        base.weight.normal_(0, 1 / math.sqrt(k))
    w32 = base.weight.detach()
    w16 = w32.to(torch.bfloat16)

    configs = {
        "int8 weight-only": Int8WeightOnlyConfig(),
        "int4 weight-only g128": Int4WeightOnlyConfig(group_size=128),
        "int8 dyn act + int8 weight": Int8DynamicActivationInt8WeightConfig(),
    }
    slow = {
        "float8 e4m3 weight-only": Float8WeightOnlyConfig(),
        "fp6 (e3m2) weight-only": FPXWeightOnlyConfig(3, 2),
        "int4 packed (Uintx) g128": IntxWeightOnlyConfig(torch.int4, PerGroup(128)),
    }
    if args.slow:
        configs.update(slow)
    layers = {}
    for name, cfg in {**configs, **({} if args.slow else slow)}.items():
        layer = copy.deepcopy(base)
        quantize_(layer, cfg)
        layers[name] = layer

    int8w = layers["int8 weight-only"].weight.tensor_impl
    raw_scale = int8w.scale.reshape(-1).to(torch.bfloat16)

    print(f"Linear K={k} N={n}, {args.threads} threads, median of {args.pairs} interleaved pairs")
    print(f"{'layer':30s} {'M':>3s} {'act':>5s} {'ms':>8s} {'/fp32 lin':>10s} {'/bf16 lin':>10s} {'/raw int8mm':>12s}")
    for m in (1, 32):
        for act in (torch.float32, torch.bfloat16):
            x = torch.randn(m, k, dtype=act)
            x16 = x.to(torch.bfloat16)
            x32 = x.float()
            fp32 = lambda: F.linear(x32, w32)  # noqa: E731
            bf16 = lambda: F.linear(x16, w16)  # noqa: E731
            raw = lambda: torch._weight_int8pack_mm(x16, int8w.int_data, raw_scale)  # noqa: E731
            for name in configs:
                layer = layers[name]
                with torch.no_grad():
                    run = lambda: layer(x)  # noqa: E731
                    r32, t, _ = ratio(run, fp32, pairs=args.pairs, rerun=True)
                    r16, _, _ = ratio(run, bf16, pairs=args.pairs, rerun=True)
                    rraw = ratio(run, raw, pairs=args.pairs, rerun=True)[0] if name == "int8 weight-only" else float("nan")
                print(f"{name:30s} {m:3d} {str(act)[6:]:>5s} {t * 1e3:8.3f} {r32:10.2f} {r16:10.2f} {rraw:12.2f}")

    print("\nOutput SQNR vs the float layer (fp32 input, M=32) and stored bytes of the weight")
    x = torch.randn(32, k)
    with torch.no_grad():
        ref = base(x)
    fp32_bytes = w32.numel() * 4
    print(f"{'layer':30s} {'SQNR dB':>8s} {'bytes':>12s} {'/fp32':>7s}")
    print(f"{'float32':30s} {'inf':>8s} {fp32_bytes:12d} {1.0:7.3f}")
    for name, layer in layers.items():
        with torch.no_grad():
            out = layer(x)
        b = stored_bytes(layer.weight)
        print(f"{name:30s} {sqnr_db(ref, out):8.2f} {b:12d} {b / fp32_bytes:7.3f}")


if __name__ == "__main__":
    main()
