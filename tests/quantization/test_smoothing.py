"""SmoothQuant and AWQ: groups, exact folds (and refusing inexact ones), the scale kept in the weight otherwise."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from quanta.dtypes import AffineQuantizedTensor, WeightTensorWithLinearActivationScaleMetadata, load_quantized, \
    save_quantized
from quanta.dtypes.linear_activation import LinearActivationQuantizedTensor
from quanta.quantization import (
    AWQConfig,
    Float8WeightOnlyConfig,
    FPXWeightOnlyConfig,
    Int4WeightOnlyConfig,
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    PerGroup,
    SmoothQuantConfig,
    quantize_,
    quantize_sequential,
)
from quanta.quantization.awq import awq_scale_search
from quanta.quantization.smoothquant import smoothquant_scale


class RMSNorm(nn.Module):  # the usual hand-written form
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class PreNorm(nn.Module):
    """Llama's layout: norm -> three Linears (q, k, v), residual around; norm -> up -> down."""

    def __init__(self, d=64):
        super().__init__()
        self.norm, self.q, self.k, self.v, self.o = RMSNorm(d), nn.Linear(d, d), nn.Linear(d, d), \
            nn.Linear(d, d), nn.Linear(d, d)
        self.norm2, self.up, self.down = nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        h = self.norm(x)
        x = x + self.o(torch.tanh(self.q(h)) * self.k(h) + self.v(h))
        return x + self.down(self.up(self.norm2(x)))


class PostNorm(nn.Module):
    """BERT's layout: the LayerNorm's output feeds the next Linears *and* the residual: no exact fold."""

    def __init__(self, d=64):
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        h = self.norm(x)
        return h + self.fc(h)


def _outliers(model: nn.Module, seed: int = 0) -> nn.Module:
    """Norm weights with a few large channels, as trained LLMs have."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (RMSNorm, nn.LayerNorm)):
                m.weight.copy_(torch.exp(torch.randn(m.weight.shape, generator=g) * 1.2))
    return model


def _data(n=6, d=64, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(32, d, generator=g) for _ in range(n)]


def _two_step(model, make, data, **kw):
    quantize_(model, make("prepare"), **kw)
    with torch.no_grad():
        for x in data:
            model(x)
    return quantize_(model, make("convert"), **kw)


def _sqnr(model, ref, x):
    with torch.no_grad():
        a, b = model(x), ref(x)
    return float(10 * torch.log10(b.pow(2).mean() / (a - b).pow(2).mean()))


SQ = lambda step: SmoothQuantConfig(Int8DynamicActivationInt8WeightConfig(), step=step)  # noqa: E731
AWQ = lambda step: AWQConfig(Int4WeightOnlyConfig(group_size=32), step=step)  # noqa: E731


@pytest.mark.parametrize("make", [SQ, AWQ], ids=["smoothquant", "awq"])
def test_groups_fold_into_the_norm_they_read_and_the_rest_keeps_its_scale(make):
    torch.manual_seed(0)
    model = _outliers(PreNorm())
    ref = copy.deepcopy(model)
    report = _two_step(model, make, _data())
    assert report.scale_folded_into == {"q": "norm", "k": "norm", "v": "norm", "o": None, "up": "norm2",
                                        "down": "up"}
    for n in ("q", "k", "v", "up"):
        assert isinstance(getattr(model, n).weight, (AffineQuantizedTensor, LinearActivationQuantizedTensor))
    assert isinstance(model.o.weight, WeightTensorWithLinearActivationScaleMetadata)
    # folds are exact: the norm weights moved, and the model still computes what it did, up to quantization
    assert not torch.equal(model.norm.weight, ref.norm.weight)
    x = _data(1, seed=7)[0]
    rtn = copy.deepcopy(ref)
    quantize_(rtn, make("convert").base_config)
    assert _sqnr(model, ref, x) > _sqnr(rtn, ref, x)
    assert all(algo <= rtn_mse * 1.0001 for rtn_mse, algo in report.output_mse.values()) or make is SQ


def test_an_op_whose_output_also_feeds_a_residual_is_not_folded_into():
    torch.manual_seed(0)
    model = _outliers(PostNorm())
    ref = copy.deepcopy(model)
    report = _two_step(model, SQ, _data())
    assert report.scale_folded_into == {"fc": None}
    assert torch.equal(model.norm.weight, ref.norm.weight)
    assert _sqnr(model, ref, _data(1, seed=7)[0]) > 30


def test_a_tied_weight_is_not_folded_into():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 64))
    model[2].weight = model[0].weight  # tied: folding into layer 0's rows would scale layer 2's too
    report = _two_step(model, SQ, _data(), filter_fn=lambda m, n: n == "1")
    assert report.scale_folded_into == {"1": None}


def test_layers_left_in_float_in_a_group_get_the_scale_too():
    torch.manual_seed(0)
    model = _outliers(PreNorm())
    ref = copy.deepcopy(model)
    report = _two_step(model, SQ, _data(), filter_fn=lambda m, n: n in ("q", "v"))
    assert report.scale_folded_into == {"q": "norm", "v": "norm"}
    assert type(model.k.weight) is nn.Parameter and not torch.equal(model.k.weight, ref.k.weight)
    h = ref.norm(_data(1, seed=3)[0])
    torch.testing.assert_close(model.k(model.norm(_data(1, seed=3)[0])), ref.k(h), rtol=1e-4, atol=1e-5)


def test_sequential_folds_inside_each_block_and_names_them_from_the_model():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(_outliers(PreNorm(), seed=i) for i in range(2))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(0)
    net = Net()
    ref = copy.deepcopy(net)
    report = quantize_sequential(net, SQ("prepare"), _data(), progress=False)
    assert report.scale_folded_into["layers.1.q"] == "layers.1.norm"
    rtn = copy.deepcopy(ref)
    quantize_(rtn, Int8DynamicActivationInt8WeightConfig())
    x = _data(1, seed=9)[0]
    assert _sqnr(net, ref, x) > _sqnr(rtn, ref, x)


def test_alpha_none_is_the_base_config_exactly():
    torch.manual_seed(0)
    model = _outliers(PreNorm())
    rtn = copy.deepcopy(model)
    _two_step(model, lambda step: SmoothQuantConfig(Int8WeightOnlyConfig(), step=step, alpha=None), _data())
    quantize_(rtn, Int8WeightOnlyConfig())
    x = _data(1, seed=5)[0]
    torch.testing.assert_close(model(x), rtn(x), rtol=0, atol=0)


def test_the_smoothquant_formula():
    s = smoothquant_scale(torch.tensor([16.0, 1.0, 0.0]), torch.tensor([1.0, 4.0, 1.0]), 0.5)
    eps = torch.finfo(torch.float32).eps
    torch.testing.assert_close(s, torch.tensor([(16 + eps) ** 0.5 / (1 + eps) ** 0.5, (1 + eps) ** 0.5 / 2,
                                                eps ** 0.5 / (1 + eps) ** 0.5]))


def test_the_awq_search_never_loses_to_round_to_nearest_on_its_data():
    torch.manual_seed(0)
    lin = nn.Linear(64, 32)
    x = torch.randn(256, 64) * torch.logspace(-1, 1, 64)
    gram = 2 * x.t() @ x / 256
    base = Int4WeightOnlyConfig(group_size=32)
    s, r = awq_scale_search([lin.weight.detach()], [lin], x.abs().mean(0), gram, base, 20)
    loss = lambda w: float((((w - lin.weight.detach()) @ gram) * (w - lin.weight.detach())).sum())  # noqa: E731
    rtn = base.quantize_weight(lin.weight.detach(), lin).dequantize()
    awq = base.quantize_weight(lin.weight.detach() * s, lin).dequantize() / s
    assert 0 < r < 1 and loss(awq) < loss(rtn)
    s1, r1 = awq_scale_search([lin.weight.detach()], [lin], x.abs().mean(0), gram, base, 1)
    assert r1 == 0 and torch.equal(s1, torch.ones(64))


def test_the_scaled_weight_runs_serializes_and_loads(tmp_path):
    torch.manual_seed(0)
    model = _outliers(PostNorm())
    _two_step(model, AWQ, _data())
    w = model.fc.weight
    assert isinstance(w, WeightTensorWithLinearActivationScaleMetadata)
    x = torch.randn(3, 64)
    expected = nn.functional.linear(x, w.dequantize(), model.fc.bias)
    torch.testing.assert_close(model.fc(x), expected, rtol=1e-5, atol=1e-5)
    save_quantized(model.state_dict(), tmp_path / "m.safetensors")
    fresh = PostNorm()
    fresh.load_state_dict(load_quantized(tmp_path / "m.safetensors"), assign=True)
    assert torch.equal(fresh(x), model(x))
    assert torch.equal(copy.deepcopy(model)(x), model(x))
    with torch.inference_mode():
        assert torch.equal(model(x), fresh(x))


def test_the_scaled_weight_refuses_bad_parts():
    q = Int8WeightOnlyConfig().quantize_weight(torch.randn(4, 8), nn.Linear(8, 4))
    with pytest.raises(ValueError, match="shape"):
        WeightTensorWithLinearActivationScaleMetadata(q, torch.ones(4))
    with pytest.raises(ValueError, match="positive"):
        WeightTensorWithLinearActivationScaleMetadata(q, torch.zeros(8))
    with pytest.raises(TypeError, match="original_weight_tensor"):
        WeightTensorWithLinearActivationScaleMetadata(torch.randn(4, 8), torch.ones(8))


@pytest.mark.parametrize("make,kwargs,error,match", [
    (SmoothQuantConfig, {"step": "observe"}, ValueError, "step"),
    (SmoothQuantConfig, {"alpha": 1.5}, ValueError, "alpha"),
    (SmoothQuantConfig, {"use_running_absmax": "yes"}, TypeError, "use_running_absmax"),
    (SmoothQuantConfig, {"base_config": AWQConfig()}, TypeError, "base_config"),
    (AWQConfig, {"step": "prepare_for_loading"}, ValueError, "step"),
    (AWQConfig, {"scale_search_space_size": 0}, ValueError, "scale_search_space_size"),
])
def test_bad_configs_are_refused(make, kwargs, error, match):
    with pytest.raises(error, match=match):
        make(**kwargs)


@pytest.mark.parametrize("make", [SQ, AWQ], ids=["smoothquant", "awq"])
def test_convert_without_prepare_is_refused(make):
    with pytest.raises(ValueError, match="step='prepare'"):
        quantize_(PreNorm(), make("convert"))


def test_strict_refuses_before_changing_anything():
    torch.manual_seed(0)
    model = _outliers(PreNorm())
    quantize_(model, SQ("prepare"))
    model.norm(torch.randn(4, 64))  # only the norm runs: no Linear saw data
    model.q(torch.randn(4, 64))  # ...but q did
    state = copy.deepcopy(model.state_dict())
    with pytest.raises(ValueError, match="no calibration input"):
        quantize_(model, SQ("convert"), strict=True)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    with pytest.warns(UserWarning, match="no calibration input"):
        report = quantize_(model, SQ("convert"))
    assert report.quantized == ["q"]
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())


BASES = [Int8WeightOnlyConfig(), Int8WeightOnlyConfig(group_size=32), Int4WeightOnlyConfig(group_size=32),
         Int8DynamicActivationInt8WeightConfig(), Float8WeightOnlyConfig(),
         IntxWeightOnlyConfig(torch.int3, PerGroup(32)), FPXWeightOnlyConfig(3, 2)]


@pytest.mark.parametrize("base", BASES, ids=[f"{b.describe()}-{i}" for i, b in enumerate(BASES)])
@pytest.mark.parametrize("algorithm", [AWQConfig, SmoothQuantConfig], ids=["awq", "smoothquant"])
def test_every_base_config(algorithm, base):
    torch.manual_seed(0)
    model = _outliers(PreNorm())
    rtn = copy.deepcopy(model)
    report = _two_step(model, lambda step: algorithm(base, step=step), _data())
    quantize_(rtn, base)
    assert len(report.quantized) == 6 and not report.skipped
    for name in ("q", "o"):
        got, plain = getattr(model, name).weight, getattr(rtn, name).weight
        inner = got.original_weight_tensor if isinstance(got, WeightTensorWithLinearActivationScaleMetadata) else got
        assert type(inner) is type(plain)
        if isinstance(plain, AffineQuantizedTensor):
            assert inner._layout == plain._layout
    if algorithm is AWQConfig:  # the search includes round to nearest: never worse on its own data
        assert all(awq <= r * (1 + 1e-6) for r, awq in report.output_mse.values())


def test_gpt2_conv1d_layers():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=200, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    model = _outliers(transformers.GPT2LMHeadModel(cfg).eval())
    ref, rtn = copy.deepcopy(model), copy.deepcopy(model)
    data = [torch.randint(0, 200, (2, 32), generator=torch.Generator().manual_seed(i)) for i in range(6)]
    report = quantize_sequential(model, SQ("prepare"), data, progress=False)
    quantize_(rtn, Int8DynamicActivationInt8WeightConfig())
    h0 = "transformer.h.0."
    # c_attn reads ln_1 alone, c_fc ln_2 alone: folded; c_proj's inputs come from no single op, and a Conv1D
    # cannot keep the scale in its weight (its addmm does not divide the input): quantized without one
    assert report.scale_folded_into[h0 + "attn.c_attn"] == h0 + "ln_1"
    assert report.scale_folded_into[h0 + "mlp.c_fc"] == h0 + "ln_2"
    assert h0 + "attn.c_proj" not in report.scale_folded_into and report.notes[h0 + "attn.c_proj"]
    for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
        assert isinstance(model.get_submodule(h0 + name).weight, LinearActivationQuantizedTensor)
    x = torch.randint(0, 200, (2, 20))
    with torch.no_grad():
        out, expected, plain = model(x).logits, ref(x).logits, rtn(x).logits

    def sqnr(a):
        return float(10 * torch.log10(expected.pow(2).mean() / (a - expected).pow(2).mean()))
    assert sqnr(out) > sqnr(plain) + 1  # measured 34.6 vs 31.2 dB
