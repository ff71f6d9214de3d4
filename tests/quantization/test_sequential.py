"""quantize_sequential: block by block, each block calibrated on the quantized blocks' outputs."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from quanta.dtypes import AffineQuantizedTensor
from quanta.quantization import (
    GPTQConfig,
    Int4WeightOnlyConfig,
    Int8WeightOnlyConfig,
    ModuleFqnToConfig,
    quantize_,
    quantize_sequential,
)
from quanta.quantization.sequential import find_blocks


class Block(nn.Module):
    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x, scale=1.0):
        return x + scale * self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, d: int = 64, n: int = 3) -> None:
        super().__init__()
        self.embed = nn.Linear(32, d)
        self.layers = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 8)

    def forward(self, x, scale=1.0):
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, scale=scale)
        return self.head(h)


def _data(n: int = 4, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(32, 32, generator=g) for _ in range(n)]


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


CONFIG = GPTQConfig(base_config=Int4WeightOnlyConfig(group_size=32))


def test_each_block_is_calibrated_on_the_quantized_blocks_outputs():
    data = _data()
    net = _net()
    report = quantize_sequential(net, CONFIG, data, progress=False)
    assert report.blocks == ["layers.0", "layers.1", "layers.2"]
    assert report.quantized == [f"layers.{i}.{n}" for i in range(3) for n in ("up", "down")] + ["embed", "head"]

    # the same by hand: the inputs of block i+1 are the outputs of the quantized block i
    manual = _net()
    with torch.no_grad():
        hs = [manual.embed(x) for x in data]
        for layer in manual.layers:
            quantize_(layer, GPTQConfig(step="observe", base_config=CONFIG.base_config))
            for h in hs:
                layer(h)
            quantize_(layer, GPTQConfig(step="convert", base_config=CONFIG.base_config))
            hs = [layer(h) for h in hs]
    for i in range(3):
        for n in ("up", "down"):
            got = getattr(net.layers[i], n).weight.dequantize()
            assert torch.equal(got, getattr(manual.layers[i], n).weight.dequantize()), (i, n)

    # ... which is not what calibrating every layer on the float model gives
    one_shot = _net()
    quantize_(one_shot, GPTQConfig(step="observe", base_config=CONFIG.base_config))
    with torch.no_grad():
        for x in data:
            one_shot(x)
    quantize_(one_shot, GPTQConfig(step="convert", base_config=CONFIG.base_config))
    assert torch.equal(one_shot.layers[0].up.weight.dequantize(), net.layers[0].up.weight.dequantize())
    assert not torch.equal(one_shot.layers[2].up.weight.dequantize(), net.layers[2].up.weight.dequantize())


def test_keyword_arguments_reach_every_block_and_the_mode_is_restored():
    data = [((x,), {}) for x in _data()]
    net = _net().train()
    quantize_sequential(net, CONFIG, [{"x": x, "scale": 0.5} for (x,), _ in data], progress=False)
    assert net.training
    assert all(isinstance(net.layers[i].up.weight, AffineQuantizedTensor) for i in range(3))


def test_a_plain_config_is_round_to_nearest_block_by_block():
    net, ref = _net(), _net()
    quantize_sequential(net, Int8WeightOnlyConfig(), _data(), progress=False)
    quantize_(ref, Int8WeightOnlyConfig())
    x = torch.randn(5, 32)
    assert torch.equal(net(x), ref(x))


def test_filter_fn_sees_names_relative_to_the_model():
    net = _net()
    seen = []

    def only_up(m, n):
        seen.append(n)
        return isinstance(m, nn.Linear) and n.endswith(".up")
    report = quantize_sequential(net, CONFIG, _data(), filter_fn=only_up, progress=False)
    assert report.quantized == ["layers.0.up", "layers.1.up", "layers.2.up"]
    assert "layers.1.down" in seen and not isinstance(net.head.weight, AffineQuantizedTensor)


def test_blocks_by_name_or_module():
    net = _net()
    report = quantize_sequential(net, CONFIG, _data(), blocks=[net.layers[0], "layers.1"], progress=False)
    assert report.blocks == ["layers.0", "layers.1"]
    assert "layers.2.up" in report.quantized  # outside the blocks: calibrated with the rest of the model


def test_find_blocks():
    assert find_blocks(_net()) == ["layers.0", "layers.1", "layers.2"]
    with pytest.raises(ValueError, match="blocks="):
        find_blocks(nn.Sequential(nn.Linear(2, 2)))


class Unchained(Net):
    def forward(self, x, scale=1.0):
        h = self.embed(x)
        for layer in self.layers:
            h = h + layer(h)  # a residual outside the blocks
        return self.head(h)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"data": []}, ValueError, "empty"),
    ({"data": torch.randn(4, 32)}, TypeError, "iterable of batches"),
    ({"blocks": "layers.0"}, TypeError, "list of module names"),
    ({"blocks": ["layers.7"]}, ValueError, "layers.7"),
    ({"blocks": [nn.Linear(2, 2)]}, ValueError, "names or modules of the model"),
    ({"blocks": ["layers.1", "layers.0"]}, ValueError, "order"),
    ({"config": ModuleFqnToConfig({})}, TypeError, "ModuleFqnToConfig"),
    ({"config": "gptq"}, TypeError, "config"),
    ({"model": Unchained()}, ValueError, "residual add outside"),
])
def test_bad_arguments_are_refused_before_any_change(kwargs, error, match):
    args = {"model": _net(), "config": CONFIG, "data": _data()}
    args.update(kwargs)
    model = args.pop("model")
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(error, match=match):
        quantize_sequential(model, args.pop("config"), args.pop("data"), progress=False, **args)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


transformers = pytest.importorskip("transformers")


def test_a_transformers_decoder_with_grouped_query_attention_and_rotary_embeddings():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=500)
    base = transformers.LlamaForCausalLM(cfg).eval()
    data = [torch.randint(0, 500, (2, 64), generator=torch.Generator().manual_seed(i)) for i in range(8)]
    held_out = torch.randint(0, 500, (3, 17), generator=torch.Generator().manual_seed(99))  # another shape
    with torch.no_grad():
        ref = base(held_out).logits

    def sqnr(model):
        with torch.no_grad():
            out = model(held_out).logits
        return float(10 * torch.log10(ref.pow(2).mean() / (out - ref).pow(2).mean()))

    rtn = copy.deepcopy(base)
    quantize_(rtn, Int4WeightOnlyConfig(group_size=32))
    gptq = copy.deepcopy(base)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = quantize_sequential(gptq, CONFIG, data, progress=False)
    assert report.blocks == ["model.layers.0", "model.layers.1"]
    assert len(report.quantized) == 2 * 7 + 1 and report.quantized[-1] == "lm_head" and not report.skipped
    assert all(g < r for r, g in report.output_mse.values())
    assert sqnr(gptq) > sqnr(rtn) + 0.5
    assert gptq.config.use_cache  # restored
    out = gptq.generate(held_out[:1, :5], max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 9)
