"""attn_implementation="quanta_cpu": transformers' own Llama, decode steps on quanta's kernel, the rest on SDPA."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from quanta.quantization import cpu_attention  # noqa: E402
from quanta.quantization.cpu_attention import register  # noqa: E402


@pytest.fixture
def counted(monkeypatch):
    calls = []
    real = cpu_attention.decode_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(cpu_attention, "decode_attention", counting)
    return calls


def _llama(seed=0, **kw):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=8, num_key_value_heads=2, vocab_size=120, **kw)
    return transformers.LlamaForCausalLM(config).eval()


def test_register_is_idempotent_and_names_the_implementation():
    assert register() == register() == "quanta_cpu"
    model = _llama()
    model.set_attn_implementation("quanta_cpu")
    assert model.config._attn_implementation == "quanta_cpu"


def test_greedy_generation_equals_sdpa_and_decode_steps_use_the_kernel(counted):
    register()
    model = _llama(attn_implementation="sdpa")
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        want = model.generate(prompt, max_new_tokens=8, do_sample=False)
        logits_sdpa = model(want).logits
        model.set_attn_implementation("quanta_cpu")
        got = model.generate(prompt, max_new_tokens=8, do_sample=False)
        logits = model(want).logits  # a prompt: SDPA's path, the same numbers
    assert torch.equal(got, want)
    assert torch.equal(logits, logits_sdpa)
    assert len(counted) == 7 * 2  # 7 decode steps (the first new token comes from the prompt) x 2 layers
    assert all(shape == (1, 8, 1, 8) for shape in counted)


def test_decode_logits_close_to_sdpa_in_bfloat16(counted):
    register()
    model = _llama(seed=1, attn_implementation="sdpa").to(torch.bfloat16)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    cache = transformers.DynamicCache()
    outs = {}
    with torch.no_grad():
        for name in ("sdpa", "quanta_cpu"):
            model.set_attn_implementation(name)
            cache = transformers.DynamicCache()
            model(ids[:, :-1], cache=cache, use_cache=True)
            outs[name] = model(ids[:, -1:], cache=cache, use_cache=True).logits.float()
    assert len(counted) == 2  # the one decode step, 2 layers
    assert torch.allclose(outs["quanta_cpu"], outs["sdpa"], atol=0.05, rtol=0.02)


def test_padded_batches_and_static_caches_decode_on_the_kernel(counted):
    register()
    model = _llama(seed=2, attn_implementation="quanta_cpu")
    prompt = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    runs = {}
    with torch.no_grad():
        for name in ("quanta_cpu", "sdpa"):
            model.set_attn_implementation(name)
            runs[name] = [model.generate(prompt, attention_mask=mask, max_new_tokens=4, do_sample=False,
                                         pad_token_id=0),
                          model.generate(prompt[1:], max_new_tokens=4, do_sample=False, pad_token_id=0,
                                         cache_implementation="static")]
    assert all(torch.equal(a, b) for a, b in zip(runs["quanta_cpu"], runs["sdpa"]))
    # 3 decode steps x 2 layers for each run: the padding mask and the static cache's empty slots, per key
    assert len(counted) == 2 * 3 * 2


def test_other_masks_and_gradients_fall_back_to_sdpa(counted):
    register()
    model = _llama(seed=3, attn_implementation="quanta_cpu")
    q, k = torch.randn(1, 8, 1, 8), torch.randn(1, 2, 6, 8)
    float_mask = torch.zeros(1, 1, 1, 6)
    with torch.no_grad():
        layer = model.model.layers[0].self_attn
        out, _ = cpu_attention.quanta_cpu_attention(layer, q, k, k, float_mask, scaling=0.5)
    assert out.shape == (1, 1, 8, 8) and counted == []  # an additive float mask: SDPA's
    cache = transformers.DynamicCache()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        model(ids[:, :4], cache=cache, use_cache=True)
    out = model(ids[:, 4:], cache=cache, use_cache=True)  # gradients on: SDPA
    assert out.logits.requires_grad and counted == []


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_kv_cache_decodes_on_its_codes_with_the_bits_of_its_dequantized_cache(monkeypatch, dtype):
    from quanta.quantization.kv_cache import Int8KVCache, Int8KVLayer

    register()
    model = _llama(seed=2, attn_implementation="quanta_cpu").to(dtype)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3]])
    calls = []
    real_int8 = cpu_attention.decode_attention_int8
    monkeypatch.setattr(cpu_attention, "decode_attention_int8",
                        lambda *a, **k: calls.append(a[1].shape) or real_int8(*a, **k))

    def decode(cache):
        with torch.no_grad():
            model(ids[:, :-1], cache=cache, use_cache=True)
            return model(ids[:, -1:], cache=cache, use_cache=True).logits

    fused = decode(Int8KVCache(model.config))
    assert calls == [(1, 2, 10, 8)] * 2  # the decode step of both layers read the codes: 10 cached tokens
    real_update = Int8KVLayer.update
    monkeypatch.setattr(Int8KVLayer, "update", lambda self, k, v, *a, **kw: tuple(
        s.dequantize() for s in real_update(self, k, v, *a, **kw)))
    assert torch.equal(fused, decode(Int8KVCache(model.config)))  # attention over the dequantized tensors
    assert len(calls) == 2


def test_int8_kv_cache_generation_equals_sdpa_over_the_same_cache():
    from quanta.quantization.kv_cache import Int8KVCache

    register()
    model = _llama(seed=3, attn_implementation="sdpa")
    prompt = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        want = model.generate(prompt, cache=Int8KVCache(model.config), max_new_tokens=8, do_sample=False)
        model.set_attn_implementation("quanta_cpu")
        got = model.generate(prompt, cache=Int8KVCache(model.config), max_new_tokens=8, do_sample=False)
    assert torch.equal(got, want)
