"""MXTensor and NVFP4Tensor: storage sizes, the tiled linear, tensor operations, saving and loading, bad input."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
import torch.nn.functional as F

from quanta.dtypes import (
    MXTensor,
    NVFP4Tensor,
    QuantizeTensorToMXKwargs,
    QuantizeTensorToNVFP4Kwargs,
    ScaleCalculationMode,
    load_quantized,
    per_tensor_amax_to_scale,
    save_quantized,
)
from quanta.grids.block_scaled import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2

ELEMS = [torch.float8_e4m3fn, torch.float8_e5m2, DTYPE_FP6_E2M3, DTYPE_FP6_E3M2, torch.float4_e2m1fn_x2, torch.int8]


@pytest.fixture
def w():
    return torch.randn(96, 256, generator=torch.Generator().manual_seed(0))


def test_storage_sizes(w):
    """MXFP4: 4 bits + an 8-bit scale per 32 = 4.25 bits per element; NVFP4: 4 + 8 / 16 = 4.5 (+ 4 bytes)."""
    assert MXTensor.to_mx(w, torch.float4_e2m1fn_x2).storage_nbytes * 8 == 4.25 * w.numel()
    assert MXTensor.to_mx(w, torch.float8_e4m3fn).storage_nbytes * 8 == 8.25 * w.numel()
    assert NVFP4Tensor.to_nvfp4(w).storage_nbytes * 8 == 4.5 * w.numel()
    t = NVFP4Tensor.to_nvfp4(w, per_tensor_scale=per_tensor_amax_to_scale(w.abs().max()))
    assert t.storage_nbytes == 4.5 * w.numel() / 8 + 4


@pytest.mark.parametrize("elem", ELEMS, ids=str)
def test_linear_tiles_equal_the_whole_weight(elem):
    """Weights bigger than one tile: the tiled product is addmm on the whole dequantized weight, bit for bit."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(1100, 4096, generator=g).to(torch.bfloat16)  # 1100 rows of 4096: tiles of 256 rows
    b = torch.randn(1100, generator=g).to(torch.bfloat16)
    act = QuantizeTensorToMXKwargs(elem, 32, ScaleCalculationMode.RCEIL)
    m = MXTensor.to_mx(w, elem, 32, ScaleCalculationMode.RCEIL, act_quant_kwargs=act)
    wo = MXTensor.to_mx(w, elem)  # no act_quant_kwargs: weight-only
    for shape in ((1, 4096), (3, 7, 4096)):  # one row: torch's GEMV, whose order depends on the tile width
        x = torch.randn(*shape, generator=g).to(torch.bfloat16)
        x2 = x.reshape(-1, 4096)
        xq = MXTensor.to_mx(x2, elem, 32, ScaleCalculationMode.RCEIL).dequantize()
        assert torch.equal(F.linear(x, m, b), torch.addmm(b, xq, m.dequantize().t()).reshape(*shape[:-1], 1100))
        assert torch.equal(F.linear(x, wo), F.linear(x, wo.dequantize()))


def test_nvfp4_linear_weight_only_and_dynamic(w):
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(2))
    t = NVFP4Tensor.to_nvfp4(w, per_tensor_scale=per_tensor_amax_to_scale(w.abs().max()))
    assert torch.equal(F.linear(x, t), x @ t.dequantize().t())
    d = NVFP4Tensor.to_nvfp4(w, per_tensor_scale=per_tensor_amax_to_scale(w.abs().max()),
                             act_quant_kwargs=QuantizeTensorToNVFP4Kwargs(use_dynamic_per_tensor_scale=True))
    y = F.linear(x, d)
    xq = NVFP4Tensor.to_nvfp4(x, per_tensor_scale=per_tensor_amax_to_scale(x.abs().max())).dequantize()
    torch.testing.assert_close(y, xq @ t.dequantize().t(), rtol=1e-5, atol=1e-5)  # the same product, reordered
    assert float((y - x @ w.t()).pow(2).mean() / (x @ w.t()).pow(2).mean()) < 0.03


def test_operations(w):
    m = MXTensor.to_mx(w, torch.float4_e2m1fn_x2)
    assert m.shape == w.shape and m.dtype == torch.float32
    b = m.to(torch.bfloat16)
    assert isinstance(b, MXTensor) and b.dtype == torch.bfloat16 and torch.equal(b.qdata, m.qdata)
    assert torch.equal(b.dequantize(), m.dequantize().to(torch.bfloat16))
    for c in (m.detach(), m.clone(), m.to("cpu")):
        assert isinstance(c, MXTensor) and torch.equal(c.dequantize(), m.dequantize())
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        s = m.sum()
    assert float(s) == pytest.approx(float(m.dequantize().sum()), rel=1e-5)
    with pytest.raises(TypeError, match="in place"):
        m.add_(1)
    t = NVFP4Tensor.to_nvfp4(w)
    assert torch.equal(t.to(torch.float16).dequantize(), t.dequantize(torch.float16))
    with pytest.raises(TypeError, match="float32, bfloat16 or float16"):
        t.to(torch.int32)


def test_save_load_and_state_dict(tmp_path):
    from quanta.quantization import (
        MXDynamicActivationMXWeightConfig,
        NVFP4DynamicActivationNVFP4WeightConfig,
        NVFP4WeightOnlyConfig,
        quantize_,
    )

    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 32), torch.nn.Linear(32, 32))

    m = build()
    quantize_(m, MXDynamicActivationMXWeightConfig(activation_dtype=DTYPE_FP6_E3M2, weight_dtype=DTYPE_FP6_E3M2),
              filter_fn=lambda _, n: n == "0")
    quantize_(m, NVFP4WeightOnlyConfig(), filter_fn=lambda _, n: n == "1")
    quantize_(m, NVFP4DynamicActivationNVFP4WeightConfig(), filter_fn=lambda _, n: n == "2")
    path = tmp_path / "m.safetensors"
    save_quantized(m.state_dict(), path)
    sd = load_quantized(path)
    fresh = build()
    fresh.load_state_dict(sd, assign=True)
    x = torch.randn(4, 64)
    assert torch.equal(fresh(x), m(x))
    torch.save(m.state_dict(), tmp_path / "sd.pt")
    again = build()
    again.load_state_dict(torch.load(tmp_path / "sd.pt", weights_only=True), assign=True)
    assert torch.equal(again(x), m(x))


def test_load_rejects_a_tampered_file(tmp_path):
    import json

    from safetensors.torch import load_file, save_file
    from safetensors import safe_open

    path = tmp_path / "m.safetensors"
    save_quantized({"w": MXTensor.to_mx(torch.randn(8, 64), torch.float4_e2m1fn_x2)}, path)
    with safe_open(os.fspath(path), "pt") as f:
        meta = f.metadata()
    tensors = load_file(path)
    desc = json.loads(meta["quanta"])
    desc["w"]["elem_dtype"] = "float16"
    save_file(tensors, path, metadata={**meta, "quanta": json.dumps(desc)})
    with pytest.raises(ValueError, match="tensor 'w': unknown elem_dtype"):
        load_quantized(path)
    desc["w"]["elem_dtype"] = "float4_e2m1fn_x2"
    tensors["w::scale"] = tensors["w::scale"][:, :1].contiguous()
    save_file(tensors, path, metadata={**meta, "quanta": json.dumps(desc)})
    with pytest.raises(ValueError, match="tensor 'w': scale must be"):
        load_quantized(path)


@pytest.mark.parametrize("call, exc, words", [
    (lambda: MXTensor.to_mx(torch.randn(4, 30), torch.float8_e4m3fn), ValueError, "block_size=32"),
    (lambda: MXTensor.to_mx(torch.randn(4, 32), torch.float16), ValueError, "elem_dtype"),
    (lambda: MXTensor.to_mx(torch.randn(4, 32), torch.float8_e4m3fn, scaling_mode="floor"), TypeError,
     "scaling_mode"),
    (lambda: MXTensor.to_mx(torch.randn(4, 32), torch.float8_e4m3fn, is_swizzled_scales=True), ValueError,
     "is_swizzled_scales"),
    (lambda: MXTensor(torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 1, dtype=torch.uint8),
                      torch.float8_e4m3fn, 32, torch.float32), ValueError, "qdata"),
    (lambda: MXTensor(torch.zeros(4, 16, dtype=torch.uint8), torch.zeros(4, 2, dtype=torch.uint8),
                      torch.float4_e2m1fn_x2, 32, torch.float32), ValueError, "scale must be"),
    (lambda: NVFP4Tensor.to_nvfp4(torch.randn(4, 32), block_size=32), ValueError, "blocks of 16"),
    (lambda: NVFP4Tensor.to_nvfp4(torch.randn(4, 40)), ValueError, "block_size=16"),
    (lambda: NVFP4Tensor(torch.zeros(4, 8, dtype=torch.uint8), torch.zeros(4, 1), 16, torch.float32), ValueError,
     "float8_e4m3fn"),
    (lambda: F.linear(torch.randn(2, 48), MXTensor.to_mx(torch.randn(4, 32), torch.float8_e4m3fn)), ValueError,
     "needs 32 features"),
    (lambda: QuantizeTensorToNVFP4Kwargs(block_size=32), ValueError, "blocks of 16"),
])
def test_bad_input(call, exc, words):
    with pytest.raises(exc, match=words):
        call()
