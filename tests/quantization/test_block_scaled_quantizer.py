"""The AIMET-style MX/NVFP4 quantizer: the kernels' numbers, NVFP4's calibrated tensor scale, gradients, state dicts,
use inside QuantizationSimModel, and the clear refusals of the exports that have no form for it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quanta.grids.block_scaled import MXFP4, MXFP8_E4M3, NVFP4, ScaleCalculationMode
from quanta.kernels.block_scaled import mx_quantize_dequantize, nvfp4_quantize_dequantize, per_tensor_amax_to_scale
from quanta.quantization.float import BLOCK_SCALED_FORMATS, BlockScaledQuantizeDequantize


@pytest.mark.parametrize("name", sorted(n for n in BLOCK_SCALED_FORMATS if n != "nvfp4"))
def test_mx_is_the_kernel(name):
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    q = BlockScaledQuantizeDequantize(name)
    assert torch.equal(q(x), mx_quantize_dequantize(x, BLOCK_SCALED_FORMATS[name], ScaleCalculationMode.FLOOR))
    r = BlockScaledQuantizeDequantize(name, block_size=16, scaling_mode=ScaleCalculationMode.RCEIL)
    fmt = BLOCK_SCALED_FORMATS[name].with_block_size(16)
    assert torch.equal(r(x), mx_quantize_dequantize(x, fmt, ScaleCalculationMode.RCEIL))


def test_nvfp4_dynamic_then_calibrated_tensor_scale():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 32, generator=g)
    q = BlockScaledQuantizeDequantize("nvfp4")
    assert torch.equal(q(x), nvfp4_quantize_dequantize(x, per_tensor_amax_to_scale(x.abs().max())))
    batches = [torch.randn(4, 32, generator=g) * (i + 1) for i in range(3)]
    with q.compute_encodings():
        for b in batches:
            q(b)
    amax = torch.stack([b.abs().max() for b in batches]).max()
    assert torch.equal(q.global_amax, amax)
    assert torch.equal(q(x), nvfp4_quantize_dequantize(x, per_tensor_amax_to_scale(amax)))
    assert q.get_encodings().global_amax == amax and q.get_encodings().format == "nvfp4"
    fresh = BlockScaledQuantizeDequantize("nvfp4")
    fresh.load_state_dict(q.state_dict())
    assert torch.equal(fresh(x), q(x))
    assert bool((q(torch.zeros(2, 16)) == 0).all())


def test_gradient_is_straight_through():
    x = torch.randn(2, 32, requires_grad=True)
    BlockScaledQuantizeDequantize("mxfp8_e4m3", scaling_mode=ScaleCalculationMode.RCEIL)(x).sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))  # RCEIL never saturates
    x = torch.tensor([[500.0] + [1.0] * 31], requires_grad=True)  # FLOOR: X = 1, 500 saturates at 448
    BlockScaledQuantizeDequantize("mxfp8_e4m3")(x).sum().backward()
    assert x.grad[0, 0] == 0 and bool((x.grad[0, 1:] == 1).all())


def test_in_a_sim_and_the_exports_refuse_it(tmp_path):
    from quanta.export.sim_encodings import sim_encodings
    from quanta.quantsim import QuantizationSimModel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 16))
    x = torch.randn(8, 64)
    sim = QuantizationSimModel(model, x)
    sim.model.get_submodule("0").param_quantizers["weight"] = BlockScaledQuantizeDequantize("mxfp4")
    sim.compute_encodings(lambda m: m(x))
    with torch.no_grad():
        y, ref = sim.model(x), model(x)
    assert float((y - ref).pow(2).mean() / ref.pow(2).mean()) < 0.05
    with pytest.raises(NotImplementedError, match="0.param_quantizers.weight is a BlockScaled.*export_onnx"):
        sim.export(str(tmp_path), "m", x)
    with pytest.raises(NotImplementedError, match="AIMET encodings files have no entry for MX/NVFP4"):
        sim_encodings(sim)
    sim.model.get_submodule("2").input_quantizers[0] = BlockScaledQuantizeDequantize("mxfp8_e4m3")
    from quanta.export.onnx import export_onnx
    with pytest.raises(NotImplementedError, match="2.input_quantizers.0: mxfp8_e4m3 block scales are computed"):
        export_onnx(sim, tmp_path / "m.onnx", x)


@pytest.mark.parametrize("fmt", ["mxfp8_e4m3", "mxfp8_e5m2", "mxint8", "mxfp4", "nvfp4"])
def test_block_scaled_weights_export_to_onnx_exactly(tmp_path, fmt):
    """The weights' block scales are constants: per-block DequantizeLinear of the stored elements (float8 / int8:
    opset 21, run by onnxruntime; FLOAT4E2M1: opset 23, which onnxruntime 1.32 lacks, run by ONNX's reference
    evaluator), giving the sim's outputs exactly."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from onnx.reference import ReferenceEvaluator

    from quanta.export.onnx import export_onnx
    from quanta.quantsim import QuantizationSimModel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 32)).eval()
    x = torch.randn(4, 64)
    cfg = {"defaults": {"ops": {"is_output_quantized": "True"},
                        "params": {"is_quantized": "True", "is_symmetric": "True"}},
           "params": {"bias": {"is_quantized": "False"}},
           "op_type": {"Gemm": {"params": {"weight": {"block_format": fmt}}}}}
    sim = QuantizationSimModel(model, x, config_file=cfg)
    sim.compute_encodings(lambda m: m(x))
    path = tmp_path / "m.onnx"
    export_onnx(sim, path, x)
    graph = onnx.load(path)
    opset = next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx"))
    name = graph.graph.input[0].name
    with torch.no_grad():
        want = sim.model(x).numpy()
    if fmt in ("mxfp4", "nvfp4"):
        assert opset >= 23
        got = ReferenceEvaluator(graph).run(None, {name: x.numpy()})[0]
    else:
        assert opset >= 21
        got = ort.InferenceSession(str(path)).run(None, {name: x.numpy()})[0]
    assert (got == want).all()


def test_fp6_weights_have_no_onnx_type(tmp_path):
    from quanta.export.onnx import export_onnx
    from quanta.quantsim import QuantizationSimModel

    model = nn.Sequential(nn.Linear(64, 32)).eval()
    x = torch.randn(2, 64)
    sim = QuantizationSimModel(model, x, config_file={"params": {"weight": {"is_quantized": "True",
                                                                            "block_format": "mxfp6_e3m2"}}})
    sim.compute_encodings(lambda m: m(x))
    with pytest.raises(NotImplementedError, match="no type for mxfp6_e3m2"):
        export_onnx(sim, tmp_path / "m.onnx", x)


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(format="mxfp5"), ValueError, "format must be one of"),
    (dict(format=3), TypeError, "format"),
    (dict(format="nvfp4", scaling_mode=ScaleCalculationMode.FLOOR), ValueError, "scaling_mode is for MX"),
    (dict(format="nvfp4", block_size=32), ValueError, "blocks of 16"),
    (dict(format="mxfp4", scaling_mode="floor"), TypeError, "ScaleCalculationMode"),
    (dict(format="mxfp4", block_size=0), ValueError, "block_size"),
])
def test_bad_arguments(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        BlockScaledQuantizeDequantize(**kwargs)


def test_bad_inputs():
    with pytest.raises(ValueError, match="block_size=32"):
        BlockScaledQuantizeDequantize("mxfp4")(torch.randn(3, 30))
    with pytest.raises(TypeError, match="floating-point"):
        BlockScaledQuantizeDequantize("mxfp4")(torch.ones(32, dtype=torch.int32))
    assert MXFP4.block_size == 32 and NVFP4.block_size == 16 and MXFP8_E4M3.element_bits == 8
