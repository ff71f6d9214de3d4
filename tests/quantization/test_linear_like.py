"""transformers' Conv1D (GPT-2's layers: weight stored [in, out], forward addmm) through quantize_ and GPTQ."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("transformers")
from transformers.pytorch_utils import Conv1D  # noqa: E402

from quanta.quantization import (  # noqa: E402
    Float8WeightOnlyConfig,
    FPXWeightOnlyConfig,
    GPTQConfig,
    Int4WeightOnlyConfig,
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    PerGroup,
    quantize_,
)
from quanta.quantization.linear_like import in_features, is_linear_like, linear_weight  # noqa: E402

BASES = [Int8WeightOnlyConfig(), Int4WeightOnlyConfig(group_size=32), Int8DynamicActivationInt8WeightConfig(),
         Float8WeightOnlyConfig(), IntxWeightOnlyConfig(torch.int3, PerGroup(32)), FPXWeightOnlyConfig(3, 2)]


@pytest.mark.parametrize("base", BASES, ids=[b.describe() for b in BASES])
def test_quantize_takes_conv1d_as_the_linear_it_is(base):
    torch.manual_seed(0)
    conv = Conv1D(48, 64)  # 64 in, 48 out; weight [64, 48]
    lin = nn.Linear(64, 48)
    with torch.no_grad():
        lin.weight.copy_(conv.weight.t())
        lin.bias.copy_(conv.bias)
    assert is_linear_like(conv) and in_features(conv) == 64 and torch.equal(linear_weight(conv), lin.weight)
    report = quantize_(nn.Sequential(conv), base)
    quantize_(lin, base)
    assert report.quantized == ["0"]
    assert torch.equal(linear_weight(conv).dequantize(), lin.weight.dequantize())
    x = torch.randn(2, 5, 64)
    torch.testing.assert_close(conv(x), lin(x), rtol=1e-5, atol=1e-5)


def test_gptq_on_conv1d_equals_gptq_on_the_linear():
    torch.manual_seed(0)
    conv = Conv1D(32, 64)
    lin = nn.Linear(64, 32)
    with torch.no_grad():
        lin.weight.copy_(conv.weight.t())
        lin.bias.copy_(conv.bias)
    base = Int4WeightOnlyConfig(group_size=32)
    xs = [torch.randn(16, 64) @ torch.randn(64, 64) for _ in range(4)]
    for m in (conv, lin):
        quantize_(m, GPTQConfig(step="observe", base_config=base), filter_fn=lambda *_: True)
        for x in xs:
            m(x)
        quantize_(m, GPTQConfig(step="convert", base_config=base), filter_fn=lambda *_: True)
    assert torch.equal(linear_weight(conv).dequantize(), lin.weight.dequantize())
