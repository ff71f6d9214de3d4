"""Graph capture with torch.export (quanta.quantsim.capture) and what the sim makes of it."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn

import quanta.nn
from quanta.quantsim import CaptureMethod, QuantizationSimModel, prepare_model

transformers = pytest.importorskip("transformers")


def _sqnr(ref: torch.Tensor, out: torch.Tensor) -> float:
    return 10 * math.log10(ref.pow(2).mean().item() / max((ref - out).pow(2).mean().item(), 1e-30))


def _tokens(batch: int, seq: int, seed: int = 0, vocab: int = 100) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[0, seq - 2:] = 0  # some padding: the mask path is exercised
    return {"input_ids": torch.randint(0, vocab, (batch, seq), generator=g), "attention_mask": mask}


def _bert():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64)
    return transformers.BertModel(cfg).eval()


def _llama():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(cfg).eval()


def _quiet_sim(model, dummy, **kwargs) -> QuantizationSimModel:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # captured whole: nothing to warn about
        return QuantizationSimModel(model, dummy, **kwargs)


def test_bert_is_captured_whole_with_keyword_inputs():
    model = _bert()
    sim = _quiet_sim(model, _tokens(2, 8))
    assert sim.capture_method == "export" and sim.capture_errors == {}
    assert sim.float_ops == [] and sim.unquantized_modules == []
    names = {n for n, _ in sim.named_quantizers()}
    layer = "encoder.layer.0.attention.self"
    for op in ("query", "key", "value", "matmul", "softmax", "matmul_1"):  # the expanded SDPA
        assert f"{layer}.{op}.output_quantizers.0" in names, op
    # its scaling of the scores by a constant: the scores rescaled, not requantized (AIMET's rule)
    assert isinstance(sim.model.get_submodule(f"{layer}.mul"), quanta.nn.QuantizedMultiply)
    assert f"{layer}.mul.output_quantizers.0" not in names
    assert "encoder.layer.0.intermediate.intermediate_act_fn.output_quantizers.0" in names  # GELUActivation
    assert isinstance(sim.model.get_submodule("encoder.layer.0.intermediate.intermediate_act_fn"),
                      quanta.nn.QuantizedGELU)
    # calibrate and evaluate at batch sizes and sequence lengths the dummy input did not have
    sim.compute_encodings([_tokens(3, 11, seed=s) for s in range(4)], progress=False)
    x = _tokens(5, 13, seed=9)
    with torch.no_grad():
        ref, out = model(**x), sim.model(**x)
    assert type(out) is type(ref) and set(out) == set(ref)
    assert _sqnr(ref.last_hidden_state, out.last_hidden_state) > 30
    with sim.quantizers_disabled(), torch.no_grad():
        torch.testing.assert_close(sim.model(**x).last_hidden_state, ref.last_hidden_state)


def test_bert_positional_call_and_original_untouched():
    model = _bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    sim = _quiet_sim(model, _tokens(2, 8))
    x = _tokens(2, 6, seed=3)
    with sim.quantizers_disabled(), torch.no_grad():
        torch.testing.assert_close(sim.model(x["input_ids"], x["attention_mask"]).last_hidden_state,
                                   model(**x).last_hidden_state)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert not any(isinstance(m, quanta.nn.QuantizationMixin) for m in model.modules())


def test_llama_rmsnorm_rotary_and_gated_mlp():
    model = _llama()
    sim = _quiet_sim(model, _tokens(2, 8))
    assert sim.capture_method == "export" and sim.float_ops == [] and sim.unquantized_modules == []
    for path in ("model.layers.0.input_layernorm", "model.layers.1.post_attention_layernorm", "model.norm"):
        norm = sim.model.get_submodule(path)
        assert isinstance(norm, quanta.nn.QuantizedRMSNorm), path
        assert norm.weight is model.get_submodule(path).weight or torch.equal(norm.weight,
                                                                                model.get_submodule(path).weight)
    assert isinstance(sim.model.get_submodule("model.layers.0.mlp.act_fn"), quanta.nn.QuantizedSiLU)
    names = [n for n, _ in sim.named_quantizers()]
    assert not any("rotary_emb" in n for n in names)  # cos/sin tables come from positions: not activations
    assert "model.layers.0.mlp.mul.output_quantizers.0" in names  # the SiLU gate
    assert "model.layers.0.self_attn.mul.output_quantizers.0" in names  # q * cos (rotary embedding)
    sim.compute_encodings([_tokens(3, 10, seed=s) for s in range(4)], progress=False)
    x = _tokens(4, 12, seed=7)
    with torch.no_grad():
        ref, out = model(**x), sim.model(**x)
    assert type(out) is type(ref)
    assert _sqnr(ref.logits, out.logits) > 30


def test_in_place_shares_parameters():
    model = _bert()
    sim = _quiet_sim(model, _tokens(2, 8), in_place=True)
    q = sim.model.get_submodule("encoder.layer.0.attention.self.query")
    assert q.weight is model.encoder.layer[0].attention.self.query.weight


def test_dropout_follows_train_and_eval():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 64), nn.Dropout(0.5), nn.Linear(64, 4))
    sim = _quiet_sim(model, torch.randn(4, 8))
    assert sim.capture_method == "export"
    assert isinstance(sim.model.get_submodule("1"), nn.Dropout)  # the model's own module, called again
    x = torch.randn(16, 8)
    with sim.quantizers_disabled():
        sim.model.eval()
        assert torch.equal(sim.model(x), sim.model(x))
        sim.model.train()
        assert not torch.equal(sim.model(x), sim.model(x))


def test_qat_gradients_reach_weights_and_ranges():
    model = _bert().train()
    sim = _quiet_sim(model, _tokens(2, 8), quant_scheme="range_learning_min_max")
    sim.compute_encodings([_tokens(2, 8, seed=s) for s in range(2)], progress=False)
    sim.model.train()
    out = sim.model(**_tokens(3, 9, seed=5)).last_hidden_state
    out.pow(2).mean().backward()
    q = sim.model.get_submodule("encoder.layer.0.attention.self.query")
    assert q.weight.grad is not None and q.weight.grad.abs().sum() > 0
    softmax_q = sim.model.get_submodule("encoder.layer.0.attention.self.softmax").output_quantizers[0]
    assert any(p.grad is not None for p in softmax_q.parameters())


class _WithLeaf(nn.Module):
    def __init__(self, leaf):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = leaf

    def forward(self, x):
        return self.act(self.fc(x))


def test_unknown_leaf_module_is_kept_whole_and_listed():
    with pytest.warns(UserWarning, match="act"):  # log-softmax: no quantized counterpart, not pointwise
        sim = QuantizationSimModel(_WithLeaf(nn.LogSoftmax(dim=-1)), torch.randn(4, 8))
    assert sim.capture_method == "export"
    assert sim.unquantized_modules == ["act"] and sim.float_ops == []
    assert isinstance(sim.model.get_submodule("act"), nn.LogSoftmax)


def test_unknown_pointwise_leaf_module_is_quantized_as_one_op():
    model = _WithLeaf(nn.Softsign())  # x / (1 + |x|): three pointwise ops, one output quantizer
    sim = _quiet_sim(model, torch.randn(4, 8))
    assert sim.unquantized_modules == [] and sim.float_ops == []
    act = sim.model.get_submodule("act")
    assert type(act) is quanta.nn.QuantizedPointwise and isinstance(act.fn, nn.Softsign)
    assert [n for n, _ in sim.named_quantizers() if n.startswith("act.")] == ["act.output_quantizers.0"]


class _Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        return y * 2 if y.sum() > 0 else y  # data-dependent control flow: no capture can follow it


def test_fallback_is_announced_once_with_reasons():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim = QuantizationSimModel(_Branchy(), torch.randn(3, 4))
    fallback = [w for w in caught if "only the leaf modules" in str(w.message)]
    assert len(fallback) == 1
    assert "export failed" in str(fallback[0].message) and "fx failed" in str(fallback[0].message)
    assert sim.capture_method == "leaves" and set(sim.capture_errors) == {"export", "fx"}
    assert isinstance(sim.model.fc, quanta.nn.QuantizedLinear)


def test_prepare_model_methods_argument():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    assert prepare_model(model, torch.randn(2, 4), methods=("fx",)).method is CaptureMethod.FX
    with pytest.raises(ValueError, match="methods"):
        prepare_model(model, torch.randn(2, 4), methods=("leaves",))
    with pytest.raises(ValueError, match="methods"):
        prepare_model(model, torch.randn(2, 4), methods=("jit",))


def test_dummy_input_dict_must_name_arguments():
    with pytest.raises(TypeError, match="dummy_input"):
        QuantizationSimModel(_bert(), {0: torch.zeros(1, 4, dtype=torch.long)})
    with pytest.raises(TypeError, match="no tensor"):
        QuantizationSimModel(_bert(), {"input_ids": None})


def test_sequential_calibration_on_an_exported_model():
    model = _bert()
    sim = _quiet_sim(model, _tokens(2, 8))
    sim.compute_encodings_sequential([_tokens(2, 8, seed=s) for s in range(2)], progress=False)
    x = _tokens(3, 8, seed=4)
    with torch.no_grad():
        assert _sqnr(model(**x).last_hidden_state, sim.model(**x).last_hidden_state) > 25


def test_onnx_export_of_a_keyword_input_transformer(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    model = _bert()
    sim = _quiet_sim(model, _tokens(2, 8))
    sim.compute_encodings([_tokens(2, 8, seed=s) for s in range(3)], progress=False)
    x = _tokens(2, 8, seed=11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.onnx's own notes on advanced indexing
        sim.export(str(tmp_path), "bert", x)
    session = ort.InferenceSession(str(tmp_path / "bert.onnx"))
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    got = session.run(["last_hidden_state"], {k: v.numpy() for k, v in x.items()})[0]
    with torch.no_grad():
        want = sim.model(**x).last_hidden_state
    # the last LayerNorm's output (16 bits) is the model output: one of its steps, plus float rounding
    step = sim.model.get_submodule("encoder.layer.1.output.LayerNorm").output_quantizers[0].get_scale().item()
    assert (torch.from_numpy(got) - want).abs().max().item() <= step * 1.01


def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_gpt2_conv1d_and_written_out_gelu_are_quantized():
    model = _gpt2()
    sim = _quiet_sim(model, _tokens(2, 8))
    assert sim.capture_method == "export" and sim.float_ops == [] and sim.unquantized_modules == []
    c_attn = sim.model.get_submodule("transformer.h.0.attn.c_attn")
    assert isinstance(c_attn, quanta.nn.QuantizedTransposedLinear) and c_attn.weight is not None
    assert c_attn.param_quantizers["weight"].shape == (1, c_attn.weight.shape[1])  # per output feature
    assert isinstance(sim.model.get_submodule("transformer.h.0.mlp.act"), quanta.nn.QuantizedGELU)
    lm_head = sim.model.get_submodule("lm_head")  # tied to the token embedding
    assert isinstance(lm_head, quanta.nn.QuantizedLinear)
    assert lm_head.weight is sim.model.get_submodule("transformer.wte").weight


@pytest.mark.parametrize("make", [_gpt2, _llama], ids=["gpt2", "llama"])
def test_onnx_export_of_a_decoder_with_fixed_keyword_inputs(tmp_path, make):
    ort = pytest.importorskip("onnxruntime")
    model = make()
    x = {**_tokens(2, 8, seed=1), "use_cache": False}  # a non-tensor keyword input: fixed in the graph
    sim = _quiet_sim(model, x)
    sim.compute_encodings([{**_tokens(2, 8, seed=s), "use_cache": False} for s in range(3)], progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.export(str(tmp_path), "lm", x)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the QDQ graph as written
    session = ort.InferenceSession(str(tmp_path / "lm.onnx"), options)
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    got = torch.from_numpy(session.run(["logits"], {k: v.numpy() for k, v in x.items() if k != "use_cache"})[0])
    with torch.no_grad():
        want = sim.model(**x).logits
    step = sim.model.get_submodule("lm_head").output_quantizers[0].get_scale().item()
    assert (got - want).abs().max().item() <= step * 1.001


class _OwnLinear(nn.Linear):
    """A subclass with a forward of its own (as Falcon's FalconLinear): exact-type lookup finds no counterpart."""

    def forward(self, x):
        return x @ self.weight.T + self.bias


class _WithOwnLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = _OwnLinear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


def test_subclass_with_its_own_forward_is_lifted_as_its_base_class():
    torch.manual_seed(0)
    model = _WithOwnLinear()
    sim = _quiet_sim(model, torch.randn(4, 8))
    fc = sim.model.get_submodule("fc")
    assert type(fc) is quanta.nn.QuantizedLinear and fc.weight is not model.fc.weight  # a copy: not in place
    assert torch.equal(fc.weight, model.fc.weight)
    with sim.quantizers_disabled(), torch.no_grad():
        x = torch.randn(3, 8)
        torch.testing.assert_close(sim.model(x), model(x))


def test_layer_sqnr_takes_keyword_batches():
    model = _bert()
    sim = _quiet_sim(model, _tokens(2, 8))
    sim.compute_encodings([_tokens(2, 8, seed=s) for s in range(2)], progress=False)
    report = sim.layer_sqnr([_tokens(2, 8, seed=5)])
    assert report.output_sqnr_db > 25
    assert any(row.name == "encoder.layer.0.attention.self.softmax" for row in report.layers)


class _Arithmetic(nn.Module):
    """Division by a tensor scale (DeBERTa), subtraction, bilinear and nearest resizing (MobileViT)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        scale = torch.sqrt(torch.tensor(y.shape[1], dtype=torch.float))
        z = y / scale - torch.sigmoid(y)
        up = nn.functional.interpolate(z, scale_factor=2.0, mode="bilinear", align_corners=False)
        return up + nn.functional.interpolate(y, size=(8, 8), mode="nearest")


def test_division_subtraction_and_interpolation_are_quantized():
    torch.manual_seed(0)
    model = _Arithmetic().eval()
    sim = _quiet_sim(model, torch.randn(2, 3, 4, 4))
    assert sim.capture_method == "export" and sim.float_ops == [] and sim.unquantized_modules == []
    kinds = {type(m).__name__ for _, m in sim.named_qmodules()}
    assert {"QuantizedDivide", "QuantizedSubtract", "QuantizedInterpolate"} <= kinds
    interp = next(m for _, m in sim.named_qmodules() if isinstance(m, quanta.nn.QuantizedInterpolate))
    assert (interp.mode, interp.scale_factor, interp.align_corners) == ("bilinear", (2.0, 2.0), False)
    x = torch.randn(3, 3, 4, 4)
    with sim.quantizers_disabled(), torch.no_grad():
        torch.testing.assert_close(sim.model(x), model(x), rtol=0, atol=0)
    sim.compute_encodings([torch.randn(3, 3, 4, 4) for _ in range(2)], progress=False)
    with torch.no_grad():
        assert _sqnr(model(x), sim.model(x)) > 30


class _QuickGELUActivation(nn.Module):  # transformers' QuickGELUActivation (CLIP)
    def forward(self, x):
        return x * torch.sigmoid(1.702 * x)


class _GemmaRMSNorm(nn.Module):  # transformers' GemmaRMSNorm: scaled by (1 + weight)
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        h = x.float()
        out = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return (out * (1.0 + self.weight.float())).type_as(x)


class _SamePad(nn.Module):  # wav2vec2's Wav2Vec2SamePadLayer: only slices
    def forward(self, x):
        return x[:, :, :-1]


class _Written(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = _GemmaRMSNorm(8)
        self.fc = nn.Linear(8, 8)
        self.act = _QuickGELUActivation()
        self.conv = nn.utils.parametrizations.weight_norm(nn.Conv1d(8, 8, 4, padding=2), name="weight", dim=2)
        self.pad = _SamePad()

    def forward(self, x):
        h = self.act(self.fc(self.norm(x)))
        return self.pad(self.conv(h.transpose(1, 2))).transpose(1, 2)


def test_gemma_norm_quick_gelu_weight_norm_and_slicing_modules_are_captured():
    torch.manual_seed(0)
    model = _Written().eval()
    with torch.no_grad():
        model.norm.weight.normal_(0, 0.3)
    sim = _quiet_sim(model, torch.randn(2, 6, 8))
    assert sim.float_ops == [] and sim.unquantized_modules == []
    norm, act, conv = (sim.model.get_submodule(n) for n in ("norm", "act", "conv"))
    assert type(norm) is quanta.nn.QuantizedOffsetRMSNorm and norm.weight is not model.norm.weight  # a copy
    assert norm.output_quantizers[0].bitwidth == 16  # an RMSNormalization, as the default config says
    assert type(act) is quanta.nn.QuantizedQuickGELU
    assert isinstance(conv, quanta.nn.QuantizedConv1d) and "weight" in conv.param_quantizers
    assert set(dict(conv.named_parameters())) >= {"parametrizations.weight.original0",
                                                  "parametrizations.weight.original1"}
    x = torch.randn(3, 5, 8)
    with sim.quantizers_disabled(), torch.no_grad():
        torch.testing.assert_close(sim.model(x), model(x), rtol=0, atol=0)
    sim.compute_encodings([x, *(torch.randn(3, 5, 8) for _ in range(2))], progress=False)  # x too: the model
    with torch.no_grad():                                                                  # input is quantized
        assert _sqnr(model(x), sim.model(x)) > 25  # 8 quantizers on 8 channels
    float_conv = conv.to_float_module()  # weight norm kept: the same parametrization, the same values
    assert nn.utils.parametrize.is_parametrized(float_conv, "weight")
    torch.testing.assert_close(float_conv.weight, model.conv.weight)
    # folded weights: the parametrization gives way to the fake-quantized values, bit for bit
    expected = conv.param_quantizers["weight"](conv.weight).as_subclass(torch.Tensor).detach()
    baked = QuantizationSimModel.get_original_model(sim.model, qdq_weights=True).get_submodule("conv")
    assert type(baked) is nn.Conv1d and not nn.utils.parametrize.is_parametrized(baked)
    assert torch.equal(baked.weight, expected)
    with torch.no_grad():
        before = sim.model(x)
        sim.fold_param_quantizers()
        assert torch.equal(sim.model.get_submodule("conv").weight, expected)
        assert torch.equal(sim.model(x), before)  # the same forward, now without weight quantizers


class _InPlaceAfterLinear(nn.Module):
    """Falcon's parallel attention: `mlp_output += attention_output` changes a Linear's output in place."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        out = self.a(x)
        out += self.b(x)
        return out


def test_module_output_changed_in_place_later_is_still_lifted():
    sim = _quiet_sim(_InPlaceAfterLinear(), torch.randn(2, 8))
    assert sim.unquantized_modules == [] and sim.float_ops == []
    assert isinstance(sim.model.get_submodule("a"), quanta.nn.QuantizedLinear)


def _transformers_activations() -> list[str]:
    activations = pytest.importorskip("transformers.activations")
    # xIELU has trainable parameters of its own (alpha_p, alpha_n): kept whole in float and listed
    return [name for name in activations.ACT2CLS if name != "xielu"]


@pytest.mark.parametrize("name", _transformers_activations())
def test_every_transformers_activation_is_quantized(name):
    from transformers.activations import ACT2FN

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(8, 8), ACT2FN[name], nn.Linear(8, 4)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    torch.manual_seed(0)
    model = Mlp()
    sim = _quiet_sim(model, torch.randn(4, 8))
    assert sim.capture_method == "export" and sim.float_ops == [] and sim.unquantized_modules == []
    act = dict(sim.model.named_modules()).get("act")
    if name != "linear":  # the identity leaves no op
        assert isinstance(act, quanta.nn.QuantizationMixin) and act.output_quantizers[0] is not None
    x = torch.randn(64, 8) * 30  # far outside the dummy input's range: a look-alike (clipped GELU) would differ
    with sim.quantizers_disabled(), torch.no_grad():
        torch.testing.assert_close(sim.model(x), model(x), rtol=1e-5, atol=1e-5)


def test_conv_batchnorm_relu6_share_one_output_quantizer():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU6(), nn.Conv2d(4, 4, 1), nn.ReLU6()).eval()
    sim = _quiet_sim(model, torch.randn(2, 3, 8, 8))
    outputs = [n for n, q in sim.named_quantizers() if ".output_quantizers." in n]
    assert outputs == ["2.output_quantizers.0", "4.output_quantizers.0"]  # Conv+BN+Clip, Conv+Clip


class _EinsumBaddbmm(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        q, k = self.q(x), self.k(x)
        scores = torch.einsum("bid,bjd->bij", q, k)
        scores = torch.baddbmm(scores, q, k.transpose(1, 2), beta=0.5, alpha=0.25)  # BLOOM's ALiBi form
        return scores.softmax(-1) @ q


@pytest.mark.parametrize("method", ["export", "fx"])
def test_einsum_and_baddbmm_are_quantized(method):
    torch.manual_seed(0)
    model = _EinsumBaddbmm()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare_model(model, (torch.randn(2, 5, 8),), methods=(method,))
    assert prepared.float_ops == []
    kinds = {n: type(m) for n, m in prepared.inserted}
    assert kinds["einsum"] is quanta.nn.Einsum and kinds["baddbmm"] is quanta.nn.Baddbmm
    assert prepared.model.get_submodule("baddbmm").alpha == 0.25 and prepared.model.get_submodule("baddbmm").beta == 0.5


def test_einsum_and_baddbmm_export_to_onnx_within_one_step(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    torch.manual_seed(0)
    model = _EinsumBaddbmm()
    x = torch.randn(2, 5, 8)
    sim = _quiet_sim(model, x)
    assert sim.float_ops == []
    sim.compute_encodings([torch.randn(2, 5, 8) for _ in range(2)], progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.export(str(tmp_path), "m", x)
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    with torch.no_grad():
        want = sim.model(x)
    step = sim.model.get_submodule("matmul").output_quantizers[0].get_scale().item()
    assert (got - want).abs().max().item() <= step * 1.001
