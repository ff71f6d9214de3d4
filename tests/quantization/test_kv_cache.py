"""quanta.quantization.kv_cache: transformers' decoders with keys and values cached as int8."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402

from quanta.kernels.affine import dequantize  # noqa: E402
from quanta.kernels.int_linear import quantize_per_token_int8  # noqa: E402
from quanta.quantization.kv_cache import Int8KVCache, Int8KVLayer  # noqa: E402


def _model(**overrides) -> tuple[LlamaConfig, LlamaForCausalLM]:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, **overrides)
    return config, LlamaForCausalLM(config).eval()


def _states(*shape: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * torch.rand(*shape[:-1], 1, generator=g) * 4).to(dtype)


def test_states_come_back_within_half_a_step_of_their_own_scale():
    layer = Int8KVLayer()
    k, v = _states(2, 3, 7, 16, seed=1), _states(2, 3, 7, 16, seed=2)
    keys, values = layer.update(k, v)
    for x, y in ((k, keys), (v, values)):
        step = x.abs().amax(-1, keepdim=True) / 127  # per batch row, head and token
        assert ((y - x).abs() <= step / 2 * (1 + 1e-6)).all()
        assert y.dtype == x.dtype and y.shape == x.shape


def test_the_cache_is_torchaos_per_token_int8_rule():
    layer = Int8KVLayer()
    k = _states(1, 2, 5, 8, seed=3)
    keys, _ = layer.update(k, k)
    q, s, _ = quantize_per_token_int8(k.reshape(-1, 8))
    want = dequantize(q, s.view(-1, 1), torch.zeros(()), output_dtype=torch.float32).view(k.shape)
    assert torch.equal(keys, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prompt_at_once_equals_token_by_token(dtype):
    k, v = _states(1, 2, 9, 8, seed=4, dtype=dtype), _states(1, 2, 9, 8, seed=5, dtype=dtype)
    whole, steps = Int8KVLayer(), Int8KVLayer()
    keys, values = whole.update(k, v)
    for t in range(9):
        step_keys, step_values = steps.update(k[:, :, t:t + 1], v[:, :, t:t + 1])
    assert torch.equal(step_keys, keys) and torch.equal(step_values, values)
    assert steps.get_seq_length() == whole.get_seq_length() == 9


def test_generation_follows_the_float_cache():
    config, model = _model()
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = model(ids, cache=DynamicCache(config=config)).logits
        cache = Int8KVCache(config)
        got = model(ids, cache=cache).logits
        assert cache.get_seq_length() == 12
        cos = torch.nn.functional.cosine_similarity(got.flatten(1), ref.flatten(1))
        assert (cos > 0.999).all()
        # the decode steps after it read the cached tokens
        nxt = got[:, -1].argmax(-1, keepdim=True)
        step = model(nxt, cache=cache).logits
        full = model(torch.cat([ids, nxt], 1), cache=DynamicCache(config=config)).logits[:, -1:]
        assert torch.nn.functional.cosine_similarity(step.flatten(1), full.flatten(1)).min() > 0.999
    out = model.generate(ids[:1, :4], cache=Int8KVCache(config), max_new_tokens=6, do_sample=False)
    assert out.shape == (1, 10)


def test_beam_search_reorders_the_cache():
    config, model = _model()
    out = model.generate(torch.tensor([[5, 6, 7]]), cache=Int8KVCache(config), max_new_tokens=4, num_beams=3,
                         do_sample=False)
    assert out.shape[1] == 7
    layer = Int8KVLayer()
    k = _states(3, 2, 4, 8, seed=6)
    layer.update(k, k)
    layer.reorder_cache(torch.tensor([2, 2, 0]))
    keys, _ = layer.update(k[:, :, :1], k[:, :, :1])
    fresh = Int8KVLayer()
    want, _ = fresh.update(k[[2, 2, 0]], k[[2, 2, 0]])
    assert torch.equal(keys[:, :, :4], want)


def test_memory_is_codes_and_one_scale_per_head_and_token():
    config, model = _model()
    cache = Int8KVCache(config)
    with torch.no_grad():
        model(torch.randint(3, 128, (1, 40)), cache=cache)
    head_dim = config.hidden_size // config.num_attention_heads
    per_token = config.num_hidden_layers * 2 * config.num_key_value_heads * (head_dim + 4)
    assert cache.nbytes() == 40 * per_token
    assert cache.nbytes(torch.bfloat16) == 40 * config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * 2


def test_crop_reset_and_batch_ops():
    layer = Int8KVLayer()
    k = _states(2, 1, 6, 4, seed=7)
    layer.update(k, k)
    layer.crop(-2)
    assert layer.get_seq_length() == 4
    keys, _ = layer.update(k[:, :, 4:5], k[:, :, 4:5])
    assert keys.shape[2] == 5
    with pytest.raises(ValueError, match="tokens_to_remove must be a negative count"):
        layer.crop(3)
    layer.batch_repeat_interleave(2)
    keys, _ = layer.update(torch.zeros(4, 1, 1, 4), torch.zeros(4, 1, 1, 4))
    assert keys.shape == (4, 1, 6, 4)
    layer.batch_select_indices(torch.tensor([0, 3]))
    assert layer.nbytes() == 2 * 2 * 6 * (4 + 4)
    layer.reset()
    assert layer.get_seq_length() == 0 and layer.nbytes() == 0


def test_bad_states_and_configs_are_named():
    layer = Int8KVLayer()
    with pytest.raises(ValueError, match=r"key_states must be a floating-point \[batch, heads, tokens, head_dim\]"):
        layer.update(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))
    layer.update(torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4))
    with pytest.raises(ValueError, match="do not extend a cache of"):
        layer.update(torch.zeros(1, 3, 1, 4), torch.zeros(1, 3, 1, 4))
    config, _ = _model(sliding_window=8)
    config.use_sliding_window = True
    with pytest.raises(ValueError, match="full-attention layers only"):
        Int8KVCache(config)
