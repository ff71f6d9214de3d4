"""torchao's MX/NVFP4 ``quantize_`` configs on a real transformer block (transformers' Llama decoder layer) and a
CNN's classifier: every config runs on the CPU, keeps the block's output close, and refuses what it cannot do."""

from __future__ import annotations

import pytest
import torch

from quanta.dtypes import MXTensor, NVFP4Tensor, ScaleCalculationMode
from quanta.grids.block_scaled import DTYPE_FP6_E2M3, DTYPE_FP6_E3M2
from quanta.quantization import (
    Int8WeightOnlyConfig,
    MXDynamicActivationMXWeightConfig,
    NVFP4DynamicActivationNVFP4WeightConfig,
    NVFP4WeightOnlyConfig,
    quantize_,
)

CONFIGS = {
    "mxfp8": (MXDynamicActivationMXWeightConfig(), 1e-3),
    "mxfp8_e5m2_floor": (MXDynamicActivationMXWeightConfig(activation_dtype=torch.float8_e5m2,
                                                           weight_dtype=torch.float8_e5m2,
                                                           scaling_mode=ScaleCalculationMode.FLOOR), 4e-3),
    "mxfp6_e2m3": (MXDynamicActivationMXWeightConfig(activation_dtype=DTYPE_FP6_E2M3, weight_dtype=DTYPE_FP6_E2M3),
                   2e-3),
    "mxfp6_e3m2": (MXDynamicActivationMXWeightConfig(activation_dtype=DTYPE_FP6_E3M2, weight_dtype=DTYPE_FP6_E3M2),
                   4e-3),
    "mxfp4": (MXDynamicActivationMXWeightConfig(activation_dtype=torch.float4_e2m1fn_x2,
                                                weight_dtype=torch.float4_e2m1fn_x2), 6e-2),
    "mxint8": (MXDynamicActivationMXWeightConfig(activation_dtype=torch.int8, weight_dtype=torch.int8), 1e-3),
    "nvfp4_weight_only": (NVFP4WeightOnlyConfig(), 3e-2),
    "nvfp4_dynamic": (NVFP4DynamicActivationNVFP4WeightConfig(), 5e-2),
}


def _llama_layer():
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4,
                                   num_key_value_heads=2, num_hidden_layers=1, vocab_size=64)
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(cfg, 0).eval()
    rope = LlamaRotaryEmbedding(cfg)
    x = torch.randn(2, 10, 128)
    pos = rope(x, torch.arange(10)[None].expand(2, -1))
    return layer, x, pos


def _rel_mse(y, ref):
    return float((y.float() - ref.float()).pow(2).mean() / ref.float().pow(2).mean())


@pytest.mark.parametrize("name", list(CONFIGS))
def test_transformer_block(name):
    config, bound = CONFIGS[name]
    layer, x, pos = _llama_layer()
    with torch.no_grad():
        ref = layer(x, position_embeddings=pos)
        ref = ref[0] if isinstance(ref, tuple) else ref
        report = quantize_(layer, config, strict=True)
        y = layer(x, position_embeddings=pos)
        y = y[0] if isinstance(y, tuple) else y
    assert len(report.quantized) == 7
    kind = NVFP4Tensor if "nvfp4" in name else MXTensor
    assert all(isinstance(m.weight, kind) for m in layer.modules() if isinstance(m, torch.nn.Linear))
    assert _rel_mse(y, ref) < bound


def test_nvfp4_static_activation_scale_in_two_steps():
    layer, x, pos = _llama_layer()
    with torch.no_grad():
        ref = layer(x, position_embeddings=pos)[0]
        report = quantize_(layer, NVFP4DynamicActivationNVFP4WeightConfig(step="prepare"))
        assert len(report.observed) == 7 and not report.quantized
        assert torch.equal(layer(x, position_embeddings=pos)[0], ref)  # observing changes nothing
        report = quantize_(layer, NVFP4DynamicActivationNVFP4WeightConfig(step="convert"))
        y = layer(x, position_embeddings=pos)[0]
    w = layer.self_attn.q_proj.weight
    assert isinstance(w, NVFP4Tensor) and w.act_per_tensor_scale is not None
    assert not w.act_quant_kwargs.use_dynamic_per_tensor_scale
    assert not hasattr(layer.self_attn.q_proj, "_quanta_nvfp4_amax") and not layer.self_attn.q_proj._forward_pre_hooks
    assert _rel_mse(y, ref) < 5e-2


def test_convert_without_calibration_is_refused():
    model = torch.nn.Sequential(torch.nn.Linear(32, 16))
    with pytest.raises(ValueError, match="no observer"):
        quantize_(model, NVFP4DynamicActivationNVFP4WeightConfig(step="convert"), strict=True)
    quantize_(model, NVFP4DynamicActivationNVFP4WeightConfig(step="prepare"))
    with pytest.raises(ValueError, match="saw no"):
        quantize_(model, NVFP4DynamicActivationNVFP4WeightConfig(step="convert"), strict=True)


def test_shapes_it_cannot_take_are_kept_in_float():
    model = torch.nn.Sequential(torch.nn.Linear(64, 24), torch.nn.Linear(24, 10))
    with pytest.warns(UserWarning, match="kept in float"):
        report = quantize_(model, MXDynamicActivationMXWeightConfig())
    assert report.quantized == ["0"] and "multiples of 32" in report.skipped["1"]
    with pytest.raises(ValueError, match="multiples of 16"):
        quantize_(torch.nn.Sequential(torch.nn.Linear(48, 24)), NVFP4WeightOnlyConfig(), strict=True)
    with pytest.raises(ValueError, match="already quantized"):
        quantize_(model, Int8WeightOnlyConfig(), filter_fn=lambda _, n: n == "0", strict=True)


def test_cnn_classifier_and_bf16():
    """A vision model's Linear head in bfloat16 (torchao's MX dtype) next to convolutions left alone."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                                torch.nn.Flatten(), torch.nn.Linear(32, 64)).to(torch.bfloat16)
    x = torch.randn(4, 3, 16, 16, dtype=torch.bfloat16)
    ref = model(x)
    quantize_(model, MXDynamicActivationMXWeightConfig(), strict=True)
    y = model(x)
    assert y.dtype == torch.bfloat16 and _rel_mse(y, ref) < 1e-2


@pytest.mark.parametrize("kwargs, words", [
    (dict(activation_dtype=torch.float8_e5m2), "must equal weight_dtype"),
    (dict(activation_dtype=torch.float16, weight_dtype=torch.float16), "elem_dtype"),
    (dict(scaling_mode="rceil"), "ScaleCalculationMode"),
    (dict(block_size=0), "block_size"),
])
def test_bad_mx_config(kwargs, words):
    with pytest.raises((TypeError, ValueError), match=words):
        MXDynamicActivationMXWeightConfig(**kwargs)


def test_bad_nvfp4_step():
    with pytest.raises(ValueError, match="step must be"):
        NVFP4DynamicActivationNVFP4WeightConfig(step="observe")


def test_gpt2_conv1d_is_refused_not_copied():
    transformers = pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    model = torch.nn.Sequential(Conv1D(64, 32), torch.nn.Linear(64, 32))
    with pytest.warns(UserWarning, match="kept in float"):
        report = quantize_(model, MXDynamicActivationMXWeightConfig())
    assert report.quantized == ["1"] and "Conv1D" in report.skipped["0"]
    assert type(model[0].weight) is torch.nn.Parameter and model[0].weight.dtype == torch.float32
    assert transformers is not None


@pytest.mark.parametrize("config", [
    MXDynamicActivationMXWeightConfig(),
    MXDynamicActivationMXWeightConfig(activation_dtype=torch.float4_e2m1fn_x2, weight_dtype=torch.float4_e2m1fn_x2),
    NVFP4DynamicActivationNVFP4WeightConfig()], ids=["mxfp8", "mxfp4", "nvfp4"])
def test_torch_compile_gives_the_eager_bits(config):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
    quantize_(model, config, strict=True)
    x = torch.randn(4, 64)
    with torch.no_grad():
        assert torch.equal(torch.compile(model)(x), model(x))
