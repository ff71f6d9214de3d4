"""MX and NVFP4 linear layers on the CPU: time beside bf16 ``F.linear``, output SQNR, bits per weight, and torchao 0.18.

A Linear with K = N = 4096 (default) in bfloat16, inputs of M = 1 and 32 rows,
quantized by each of torchao's block-scaled configs through quanta's ``quantize_``;
each layer is timed in interleaved pairs against bf16 ``F.linear`` on the float
weight (median of per-pair ratios; > 1 = slower). quanta's CPU path dequantizes
the weight a tile of rows at a time (1 MiB) into bf16 and multiplies; the
activation quantization of the dynamic configs is part of the time. Where
torchao 0.18 imports (its CPU "EMULATED" path: dequantize the whole weight, then
``mm``), its layer is timed the same way and its output compared with quanta's
bit for bit first.

Run: ``python bench/bench_mx.py [--k 4096 --n 4096 --pairs 15 --threads 2]`` (torchao column: in a venv with
torchao 0.18, ``PYTHONPATH=src``).
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

from quanta.grids.block_scaled import DTYPE_FP6_E3M2  # noqa: E402
from quanta.quantization import (  # noqa: E402
    MXDynamicActivationMXWeightConfig,
    NVFP4DynamicActivationNVFP4WeightConfig,
    NVFP4WeightOnlyConfig,
    quantize_,
)


def _configs():
    mx = MXDynamicActivationMXWeightConfig
    return {
        "MXFP8 (e4m3, RCEIL)": (mx(), "mx", torch.float8_e4m3fn),
        "MXFP6 (e3m2)": (mx(activation_dtype=DTYPE_FP6_E3M2, weight_dtype=DTYPE_FP6_E3M2), "mx", DTYPE_FP6_E3M2),
        "MXFP4": (mx(activation_dtype=torch.float4_e2m1fn_x2, weight_dtype=torch.float4_e2m1fn_x2), "mx",
                  torch.float4_e2m1fn_x2),
        "NVFP4 weight-only": (NVFP4WeightOnlyConfig(), "nvfp4_wo", None),
        "NVFP4 dynamic": (NVFP4DynamicActivationNVFP4WeightConfig(), None, None),
    }


def _torchao_layer(lin: torch.nn.Module, kind: str | None, elem):
    """torchao's layer for the same config, or None where torchao does not import or run on the CPU."""
    try:
        from torchao.prototype.mx_formats.inference_workflow import (
            MXDynamicActivationMXWeightConfig as AoMX,
            NVFP4WeightOnlyConfig as AoNV,
        )
        from torchao.quantization import quantize_ as ao_quantize_
        from torchao.quantization.quantize_.common.kernel_preference import KernelPreference
    except Exception:  # noqa: BLE001 - the column says n/a
        return None
    if kind is None:
        return None
    ao = copy.deepcopy(lin)
    cfg = AoNV() if kind == "nvfp4_wo" else AoMX(activation_dtype=elem, weight_dtype=elem,
                                                  kernel_preference=KernelPreference.EMULATED)
    ao_quantize_(ao, cfg)
    return ao


def _sqnr(y: torch.Tensor, ref: torch.Tensor) -> float:
    return 10 * math.log10(float(ref.float().pow(2).sum() / (y.float() - ref.float()).pow(2).sum()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--pairs", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(args.k, args.n, bias=False)).to(torch.bfloat16)
    w = base[0].weight.detach()
    print(f"Linear {args.k} -> {args.n}, bfloat16, {args.threads} threads; time / bf16 F.linear time "
          "(median of interleaved pairs; > 1 = slower)")
    header = f"{'config':<22} {'bits/weight':>11} {'SQNR dB':>8} " + " ".join(
        f"{f'M={m}':>8} {f'torchao M={m}':>13}" for m in (1, 32))
    print(header)
    for name, (cfg, kind, elem) in _configs().items():
        lin = copy.deepcopy(base)
        quantize_(lin, cfg, strict=True)
        q = lin[0].weight
        bits = q.storage_nbytes * 8 / w.numel()
        ao = _torchao_layer(base, kind, elem)
        cells = []
        sq = None
        for m in (1, 32):
            x = torch.randn(m, args.k, dtype=torch.bfloat16)
            with torch.no_grad():
                y = lin(x)
                sq = _sqnr(y, F.linear(x.float(), w.float())) if m == 32 else sq
                r, _, _ = ratio(lambda: lin(x), lambda: F.linear(x, w), pairs=args.pairs, rerun=True)
                cells.append(f"{r:>8.2f}")
                if ao is None:
                    cells.append(f"{'n/a':>13}")
                    continue
                ya = ao(x)
                if not torch.equal(ya, y):
                    raise SystemExit(f"{name}: torchao's output differs from quanta's at M={m}")
                ra, _, _ = ratio(lambda: ao(x), lambda: F.linear(x, w), pairs=args.pairs, rerun=True)
                cells.append(f"{ra:>13.2f}")
        print(f"{name:<22} {bits:>11.3f} {sq:>8.1f} " + " ".join(cells))


if __name__ == "__main__":
    with torch.no_grad():
        main()
