"""Record torchao 0.18's CPU results for MX and NVFP4 (``torchao.prototype.mx_formats``) as golden vectors.

Not a test; needs torchao 0.18 beside torch 2.13 (e.g. the torchao venv of the developers' notes)::

    PYTHONPATH=src /tmp/ao/bin/python tests/golden/generate_torchao_mx.py

writes ``torchao_mx.json`` (the formats' codes, scales and dequantized values: the same on every CPU) and
``torchao_mx_linear.json`` (``torchao_mx_linear.<capability>.json`` on a CPU other than AVX2: the linear outputs go
through torch's bf16 matmul, whose summation order follows the CPU's vector width; run it once more with
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2`` for the AVX2 file). Tensors are stored as their raw
bytes (zlib + base64) with dtype and shape, so every bit, NaN payloads included, is kept.

Inputs (each float32 and bfloat16): ``normal`` (randn), ``wide`` (every block scaled by its own power of two in
2**-100..2**100), ``outliers`` (randn with a few entries x1000), ``zeros`` (some all-zero blocks), ``tiny`` (blocks
of magnitude below 2**-118, where torchao's encode-side clamps act), ``ties`` (values on the midpoints of the fp4 and
fp8 grids), ``specials`` (blocks holding inf or NaN).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))


def enc(t):
    import torch

    t = t.detach().contiguous()
    raw = t.view(torch.uint8) if t.element_size() == 1 else t.view({2: torch.int16, 4: torch.int32}[t.element_size()])
    return {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "data": base64.b64encode(zlib.compress(raw.numpy().tobytes(), 9)).decode()}


def inputs():
    import torch

    g = torch.Generator().manual_seed(20261129)
    out = {}
    out["normal"] = torch.randn(4, 64, generator=g)
    w = torch.randn(4, 64, generator=g)
    exps = torch.randint(-100, 101, (4, 4), generator=g).repeat_interleave(16, dim=1)
    out["wide"] = torch.ldexp(w, exps)
    o = torch.randn(4, 64, generator=g)
    o[torch.rand(4, 64, generator=g) < 0.02] *= 1000
    out["outliers"] = o
    z = torch.randn(4, 64, generator=g)
    z[:, 32:48] = 0
    z[1] = 0
    z[2, :16] = -0.0
    out["zeros"] = z
    out["tiny"] = torch.ldexp(torch.randn(4, 64, generator=g), torch.randint(-140, -118, (4, 64), generator=g))
    grid4 = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 5.5])
    t = grid4[torch.randint(0, 8, (4, 64), generator=g)] * torch.where(torch.rand(4, 64, generator=g) < .5, -1, 1)
    t[:, ::16] = 6.0  # one block max of 6 per 16: scale exactly 1 for fp4 (FLOOR)
    out["ties"] = t
    s = torch.randn(4, 64, generator=g)
    s[0, 5] = float("inf")
    s[1, 40] = float("-inf")
    s[2, 50] = float("nan")
    s[3, 0] = 3.0e38
    out["specials"] = s
    return out


def main(path=None):
    import torch
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.constants import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
    from torchao.prototype.mx_formats.inference_workflow import (
        MXDynamicActivationMXWeightConfig,
        NVFP4WeightOnlyConfig,
    )
    from torchao.prototype.mx_formats.mx_tensor import MXTensor
    from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
    from torchao.quantization import quantize_
    from torchao.quantization.quantize_.common.kernel_preference import KernelPreference
    import torchao

    elems = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2, "fp6_e2m3": DTYPE_FP6_E2M3,
             "fp6_e3m2": DTYPE_FP6_E3M2, "float4_e2m1fn_x2": torch.float4_e2m1fn_x2}
    out = {"torchao": torchao.__version__, "torch": torch.__version__,
           "cpu_capability": torch.backends.cpu.get_cpu_capability(), "inputs": {}, "mx": [], "nvfp4": [],
           "linear": []}
    for name, x in inputs().items():
        for dt in (torch.float32, torch.bfloat16):
            key = f"{name}/{str(dt).removeprefix('torch.')}"
            xd = x.to(dt)
            out["inputs"][key] = enc(xd)
            for ename, elem in elems.items():
                for mode in ScaleCalculationMode:
                    for bs in (32, 16):
                        try:
                            m = MXTensor.to_mx(xd, elem, bs, scaling_mode=mode)
                            rec = {"qdata": enc(m.qdata), "scale": enc(m.scale.view(torch.uint8))}
                            if bs == 32 and dt == torch.float32:
                                rec["dq"] = enc(m.dequantize(dt))
                        except Exception as e:  # noqa: BLE001 - recorded, compared by the test
                            rec = {"error": f"{type(e).__name__}: {e}"}
                        out["mx"].append({"input": key, "elem": ename, "mode": mode.value, "block_size": bs, **rec})
            for pts in (False, True):
                scale = per_tensor_amax_to_scale(torch.max(torch.abs(xd))) if pts else None
                try:
                    t = NVFP4Tensor.to_nvfp4(xd, per_tensor_scale=scale)
                    rec = {"qdata": enc(t.qdata), "scale": enc(t.scale.view(torch.uint8)),
                           "dq": enc(t.dequantize(dt))}
                    if scale is not None:
                        rec["per_tensor_scale"] = enc(scale)
                except Exception as e:  # noqa: BLE001
                    rec = {"error": f"{type(e).__name__}: {e}"}
                out["nvfp4"].append({"input": key, "per_tensor_scale_used": pts, **rec})

    g = torch.Generator().manual_seed(7)
    w = (torch.randn(48, 128, generator=g) * 0.05).to(torch.bfloat16)
    b = (torch.randn(48, generator=g) * 0.1).to(torch.bfloat16)
    x = torch.randn(2, 5, 128, generator=g).to(torch.bfloat16)
    out["linear_weight"], out["linear_bias"], out["linear_input"] = enc(w), enc(b), enc(x)
    configs = []
    for ename in ("float8_e4m3fn", "float4_e2m1fn_x2", "fp6_e3m2", "fp6_e2m3", "float8_e5m2"):
        for mode in (ScaleCalculationMode.RCEIL, ScaleCalculationMode.FLOOR):
            configs.append(({"config": "MXDynamicActivationMXWeightConfig", "activation_dtype": ename,
                             "weight_dtype": ename, "scaling_mode": mode.value},
                            MXDynamicActivationMXWeightConfig(activation_dtype=elems[ename],
                                                              weight_dtype=elems[ename], scaling_mode=mode,
                                                              kernel_preference=KernelPreference.EMULATED)))
    for dyn in (True, False):
        configs.append(({"config": "NVFP4WeightOnlyConfig", "use_dynamic_per_tensor_scale": dyn},
                        NVFP4WeightOnlyConfig(use_dynamic_per_tensor_scale=dyn)))
    for dt in (torch.bfloat16, torch.float32):
        for desc, cfg in configs:
            lin = torch.nn.Sequential(torch.nn.Linear(128, 48))
            with torch.no_grad():
                lin[0].weight.copy_(w.float())
                lin[0].bias.copy_(b.float())
            lin = lin.to(dt)
            try:
                quantize_(lin, cfg)
                rec = {"y": enc(lin(x.to(dt)))}
            except Exception as e:  # noqa: BLE001
                rec = {"error": f"{type(e).__name__}: {e}"}
            out["linear"].append({**desc, "dtype": str(dt).removeprefix("torch."), **rec})

    cap = torch.backends.cpu.get_cpu_capability()
    linear = {k: out.pop(k) for k in ("linear", "linear_weight", "linear_bias", "linear_input")}
    linear = {k: out[k] for k in ("torchao", "torch", "cpu_capability")} | linear
    name = "torchao_mx_linear.json" if cap == "AVX2" else f"torchao_mx_linear.{cap.lower()}.json"
    for fname, content in (("torchao_mx.json", out), (name, linear)):
        with open(os.path.join(path or HERE, fname), "w") as f:
            json.dump(content, f, indent=0)
        print("wrote", fname)


if __name__ == "__main__":
    main(*sys.argv[1:])
