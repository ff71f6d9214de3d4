"""quanta's MX and NVFP4 against torchao 0.18's CPU results (``generate_torchao_mx.py``): codes, scales,
dequantized values and the configs' linear outputs, bit for bit, on normal, wide-range, outlier, all-zero, tiny,
tie and special-value blocks."""

from __future__ import annotations

import base64
import json
import os
import zlib

import pytest
import torch

from quanta.dtypes import MXTensor, NVFP4Tensor, ScaleCalculationMode, per_tensor_amax_to_scale
from quanta.grids.block_scaled import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
from quanta.kernels import block_scaled as K
from tests.golden._record import golden_path

HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(HERE, "torchao_mx.json")) as _f:
    GOLDEN = json.load(_f)
with open(golden_path("torchao_mx_linear.json")) as _f:
    LINEAR = json.load(_f)

ELEMS = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2, "fp6_e2m3": DTYPE_FP6_E2M3,
         "fp6_e3m2": DTYPE_FP6_E3M2, "float4_e2m1fn_x2": torch.float4_e2m1fn_x2}


def dec(d: dict) -> torch.Tensor:
    dtype = getattr(torch, d["dtype"])
    raw = bytearray(zlib.decompress(base64.b64decode(d["data"])))
    size = torch.empty((), dtype=dtype).element_size()
    carrier = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[size]
    return torch.frombuffer(raw, dtype=carrier).view(dtype).reshape(d["shape"]) if raw else \
        torch.empty(d["shape"], dtype=dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal, NaN equal to NaN (any payload)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    fa, fb = a.to(torch.float32), b.to(torch.float32)
    return bool(((fa == fb) | (fa.isnan() & fb.isnan())).all()) and torch.equal(fa.signbit() | fa.isnan(),
                                                                                  fb.signbit() | fb.isnan())


@pytest.mark.parametrize("rec", GOLDEN["mx"], ids=lambda r: f"{r['input']}-{r['elem']}-{r['mode']}-{r['block_size']}")
def test_mx_matches_torchao(rec):
    x = dec(GOLDEN["inputs"][rec["input"]])
    m = MXTensor.to_mx(x, ELEMS[rec["elem"]], rec["block_size"], scaling_mode=ScaleCalculationMode(rec["mode"]))
    scale = dec(rec["scale"])
    assert torch.equal(m.scale.view(torch.uint8), scale)
    q = dec(rec["qdata"])
    # NaN blocks (code 255) may hold any codes; blocks of code 0 are quanta's documented departure
    # (kernels.block_scaled: torchao encodes them with another scale than the one it stores)
    spec = (scale == 0) & (x.reshape(*scale.shape, -1).abs().amax(-1) > 0)
    valid = ((scale != 255) & ~spec).repeat_interleave(rec["block_size"], dim=-1)
    codes = valid[..., ::2] if rec["elem"] == "float4_e2m1fn_x2" else valid
    assert same_bits(m.qdata[codes], q[codes])
    dq = m.dequantize(x.dtype)
    if "dq" in rec:
        assert same_bits(dq[valid], dec(rec["dq"])[valid])
    if bool(spec.any()):  # there: x' = cast(x / 2**-127) * 2**-127, the OCP rule
        fmt = m.format
        inside = spec.repeat_interleave(rec["block_size"], dim=-1)
        want = K.mx_dequantize(K._cast_elements((x.float() * 2.0 ** 127).clamp(-fmt.element_max, fmt.element_max),
                                                fmt), torch.zeros_like(scale), fmt, x.dtype)
        assert same_bits(dq[inside], want[inside])


@pytest.mark.parametrize("rec", GOLDEN["nvfp4"], ids=lambda r: f"{r['input']}-{r['per_tensor_scale_used']}")
def test_nvfp4_matches_torchao(rec):
    x = dec(GOLDEN["inputs"][rec["input"]])
    pts = per_tensor_amax_to_scale(torch.max(torch.abs(x))) if rec["per_tensor_scale_used"] else None
    if pts is not None:
        assert same_bits(pts, dec(rec["per_tensor_scale"]))
    t = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts)
    scale = dec(rec["scale"])
    assert same_bits(t.scale.view(torch.uint8), scale)
    valid = ~t.scale.to(torch.float32).isnan().repeat_interleave(16, dim=-1)
    # the one departure (kernels.block_scaled): where 1 / per_tensor_scale overflows, torchao turns a zero
    # element into 0 * inf = NaN and stores +-1.5; quanta keeps it zero
    overflow = pts is not None and bool(torch.isinf(1.0 / pts))
    if overflow:
        valid &= x != 0
    codes = t.qdata.view(torch.uint8)
    want = dec(rec["qdata"])
    both = valid.reshape(*valid.shape[:-1], -1, 2).all(-1)
    assert torch.equal(codes[both], want[both])
    dq, want_dq = t.dequantize(x.dtype), dec(rec["dq"])
    assert same_bits(dq[valid], want_dq[valid])
    if overflow and bool((x == 0).any()):
        assert bool((dq[x == 0] == 0).all()) and bool((want_dq[x == 0].abs() > 0).any())


def _linear_config(rec):
    from quanta.quantization import MXDynamicActivationMXWeightConfig, NVFP4WeightOnlyConfig

    if rec["config"] == "NVFP4WeightOnlyConfig":
        return NVFP4WeightOnlyConfig(use_dynamic_per_tensor_scale=rec["use_dynamic_per_tensor_scale"])
    return MXDynamicActivationMXWeightConfig(activation_dtype=ELEMS[rec["activation_dtype"]],
                                             weight_dtype=ELEMS[rec["weight_dtype"]],
                                             scaling_mode=ScaleCalculationMode(rec["scaling_mode"]))


@pytest.mark.parametrize("rec", [r for r in LINEAR["linear"] if "error" not in r],
                         ids=lambda r: "-".join(str(v) for k, v in r.items() if k not in ("y",)))
def test_linear_configs_match_torchao(rec):
    from quanta.quantization import quantize_

    dt = getattr(torch, rec["dtype"])
    lin = torch.nn.Sequential(torch.nn.Linear(128, 48))
    with torch.no_grad():
        lin[0].weight.copy_(dec(LINEAR["linear_weight"]).float())
        lin[0].bias.copy_(dec(LINEAR["linear_bias"]).float())
    lin = lin.to(dt)
    quantize_(lin, _linear_config(rec), strict=True)
    y = lin(dec(LINEAR["linear_input"]).to(dt))
    assert same_bits(y, dec(rec["y"]))
