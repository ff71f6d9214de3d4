"""A decode attention for transformers models on CPU: ``attn_implementation="quanta_cpu"``.

transformers' default CPU attention (``scaled_dot_product_attention``) takes 0.2-0.5 ms per layer for the one
query token of a decode step (measured on a 2-core Zen 4 with a Llama of 32/4 heads and ~150 cached tokens),
about as long as the layer's int4 weights take to stream. :func:`register` adds ``"quanta_cpu"`` to
transformers' attention implementations: a decode step (one new token; no mask, or SDPA's boolean mask, which
for one token is a flag per cached key: padding, a static cache's empty slots, a sliding window) runs
:func:`quanta.kernels.decode_attention.decode_attention` (float32 inside, tens of microseconds); everything else
(prompts, other masks, dropout, attention sinks, ``output_attentions``, calls with gradients enabled) goes to
transformers' own SDPA path unchanged, and so do its masks (the SDPA mask builder is registered under the same
name). With :class:`quanta.quantization.kv_cache.Int8KVCache`, decode steps run
:func:`quanta.kernels.decode_attention.decode_attention_int8` on the cache's int8 codes (same bits as attention
over the dequantized cache, half the bytes read).

Needs transformers 5 (its attention and mask interfaces); quanta itself does not import this module.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from quanta.quantization.cpu_attention import register
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> name = register()
>>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
...                      num_key_value_heads=2, vocab_size=100, attn_implementation=name)
>>> model = LlamaForCausalLM(config).eval()
>>> model.config._attn_implementation
'quanta_cpu'
>>> out = model.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=5, do_sample=False)
>>> model.set_attn_implementation("sdpa")
>>> torch.equal(out, model.generate(torch.tensor([[1, 2, 3, 4]]), max_new_tokens=5, do_sample=False))
True
"""

from __future__ import annotations

import torch

try:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ImportError as e:  # pragma: no cover - exercised only without transformers
    raise ImportError("quanta.quantization.cpu_attention needs transformers >= 5 (pip install transformers)") from e

from quanta.kernels.decode_attention import decode_attention, decode_attention_int8
from quanta.quantization.kv_cache import Int8KVStates

__all__ = ["ATTENTION_NAME", "quanta_cpu_attention", "register"]

ATTENTION_NAME = "quanta_cpu"

# keyword arguments of transformers' attention calls that this path does not implement (any of them set: SDPA)
_UNSUPPORTED = ("softcap", "s_aux", "sinks", "position_bias")


def _key_mask(attention_mask: torch.Tensor | None, query: torch.Tensor,
              key: torch.Tensor) -> tuple[bool, torch.Tensor | None]:
    """(True, a flag per key ``[B or 1, S]`` or None) for no mask or SDPA's boolean mask of a one-token query;
    (False, None) for any other mask (float, per head, ...), which stays SDPA's."""
    if attention_mask is None:
        return True, None
    if (isinstance(attention_mask, torch.Tensor) and attention_mask.dtype == torch.bool and attention_mask.dim() == 4
            and attention_mask.shape[1:3] == (1, 1) and attention_mask.shape[3] == key.shape[2]
            and attention_mask.shape[0] in (1, query.shape[0])):
        return True, attention_mask[:, 0, 0, :]
    return False, None


def _is_plain_decode(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, dropout: float,
                     kwargs: dict) -> bool:
    return (query.shape[2] == 1 and query.device.type == "cpu"
            and not (dropout and module.training) and not kwargs.get("output_attentions", False)
            and all(kwargs.get(k) is None for k in _UNSUPPORTED)
            and query.dtype == key.dtype and query.shape[1] % key.shape[1] == 0
            and not torch.is_grad_enabled())


def quanta_cpu_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: ``query [B, Hq, T, D]``, ``key``/``value [B, Hkv, S, D]``;
    returns ``([B, T, Hq, D], None)``. Decode steps (see the module docstring) run quanta's kernel, every other
    call ``transformers.integrations.sdpa_attention.sdpa_attention_forward`` with the same arguments."""
    int8 = isinstance(key, Int8KVStates) and isinstance(value, Int8KVStates)
    if _is_plain_decode(module, query, key, dropout, kwargs):
        ours, mask = _key_mask(attention_mask, query, key)
        if ours and int8:  # an Int8KVCache: the kernel reads the codes
            return decode_attention_int8(query, key.codes, key.scales, value.codes, value.scales, scaling, mask), None
        if ours:
            return decode_attention(query, key, value, scaling, mask), None
    if isinstance(key, Int8KVStates):  # dequantized once here, not by each operation SDPA applies
        key = key.dequantize()
    if isinstance(value, Int8KVStates):
        value = value.dequantize()
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


def register() -> str:
    """Register ``"quanta_cpu"`` with transformers (attention function and mask builder); returns the name.

    Idempotent. Use the name as ``attn_implementation`` in a config or ``from_pretrained``, or with
    ``model.set_attn_implementation``.
    """
    AttentionInterface.register(ATTENTION_NAME, quanta_cpu_attention)
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    return ATTENTION_NAME
