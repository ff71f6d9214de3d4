"""An int8 KV cache for transformers' decoder models.

A decoder's key/value cache grows by one row per layer and token; at long context it is the memory a
generation needs beyond the weights. :class:`Int8KVCache` stores it as int8 codes with one float32 scale per
batch row, head and token, symmetric over the head dimension (torchao's per-token int8 rule,
:func:`quanta.kernels.int_linear.quantize_per_token_int8`)::

    s = max(amax|x| / 127, 1e-5)        q = clamp(round(x / s), -127, 127)        x' = q * s

Per head of ``d`` channels that is ``d + 4`` bytes a token instead of ``2 d`` in bfloat16 (0.53x at ``d = 64``,
0.52x at 128). A layer hands attention its states as :class:`Int8KVStates`: tensors of the model's dtype and the
cache's shape whose data are the codes and scales. quanta's decode attention (``attn_implementation="quanta_cpu"``,
:mod:`quanta.quantization.cpu_attention`) reads the codes directly (one byte a value: a decode step reads half
the bytes of a bfloat16 cache); any other attention, and quanta's for prompts, sees the dequantized values
``q * s`` rounded to the model's dtype (the first operation on an :class:`Int8KVStates` dequantizes it). Both
give the same bits.
Tokens are quantized once, when they enter the cache, and never again (their scales are their own), so a
prompt given at once and the same prompt given token by token leave identical caches.

Needs transformers 5 (its ``Cache`` of layers); quanta itself does not import this module.

>>> import torch
>>> from transformers import LlamaConfig, LlamaForCausalLM
>>> from quanta.quantization.kv_cache import Int8KVCache
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
...                      num_key_value_heads=2, vocab_size=100)
>>> model = LlamaForCausalLM(config).eval()
>>> cache = Int8KVCache(config)
>>> out = model.generate(torch.tensor([[1, 2, 3, 4]]), cache=cache, max_new_tokens=5, do_sample=False)
>>> out.shape, cache.get_seq_length()
(torch.Size([1, 9]), 8)
>>> cache.nbytes() / cache.nbytes(dtype=torch.bfloat16)  # vs. the same cache in bfloat16 (head_dim 16)
0.625
"""

from __future__ import annotations

from typing import Any

import torch

try:
    from transformers.cache_utils import Cache, DynamicLayer
except ImportError as e:  # pragma: no cover - exercised only without transformers
    raise ImportError("quanta.quantization.kv_cache needs transformers >= 5 (pip install transformers)") from e

from torch.utils._pytree import tree_map

from quanta.kernels.decode_attention import dequantize_int8_states
from quanta.kernels.int_linear import quantize_per_token_int8

__all__ = ["Int8KVCache", "Int8KVLayer", "Int8KVStates"]


class Int8KVStates(torch.Tensor):
    """A layer's cached keys or values as attention receives them: a ``[B, H, S, D]`` tensor of the model's
    dtype whose data are int8 ``codes [B, H, S, D]`` and float32 per-token ``scales [B, H, S]``.

    Its shape, dtype and device are the dequantized tensor's. :meth:`dequantize` returns
    ``dequantize_int8_states(codes, scales, dtype)``; any torch operation on it runs on that dequantized tensor
    (so every attention implementation works unchanged), while quanta's decode attention reads the codes.

    >>> codes, scales = torch.tensor([[[[100, -3]]]], dtype=torch.int8), torch.tensor([[[0.01]]])
    >>> states = Int8KVStates(codes, scales, torch.bfloat16)
    >>> states.shape, states.dtype
    (torch.Size([1, 1, 1, 2]), torch.bfloat16)
    >>> states * 2
    tensor([[[[ 2.0000, -0.0601]]]], dtype=torch.bfloat16)
    """

    codes: torch.Tensor
    scales: torch.Tensor

    @staticmethod
    def __new__(cls, codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> "Int8KVStates":
        return torch.Tensor._make_wrapper_subclass(cls, codes.shape, dtype=dtype, device=codes.device)

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> None:
        self.codes, self.scales = codes, scales

    def dequantize(self) -> torch.Tensor:
        """The values as a plain tensor of this tensor's dtype."""
        return dequantize_int8_states(self.codes, self.scales, self.dtype)

    def __repr__(self, **kwargs: Any) -> str:
        return f"Int8KVStates({self.dequantize()!r})"

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def plain(a):
            return a.dequantize() if isinstance(a, Int8KVStates) else a

        return func(*tree_map(plain, args), **tree_map(plain, kwargs or {}))


class _Int8States:
    """One of a layer's two caches (keys or values): int8 codes ``[B, H, capacity, D]`` and float32 scales
    ``[B, H, capacity]``, of which the first ``length`` tokens are filled. Capacity doubles as it fills, so
    appending a token costs no copy of the cache."""

    def __init__(self, like: torch.Tensor) -> None:
        b, h, _, d = like.shape
        self.codes = torch.empty(b, h, 0, d, dtype=torch.int8, device=like.device)
        self.scales = torch.empty(b, h, 0, dtype=torch.float32, device=like.device)
        self.length = 0

    def append(self, states: torch.Tensor) -> None:
        b, h, t, d = states.shape
        if (b, h, d) != (self.codes.shape[0], self.codes.shape[1], self.codes.shape[3]):
            raise ValueError(f"states of shape {tuple(states.shape)} do not extend a cache of "
                             f"[batch, heads, tokens, head_dim] = {tuple(self.codes.shape[:2])} x {self.length} x "
                             f"{self.codes.shape[3]}")
        q, s, _ = quantize_per_token_int8(states.reshape(-1, d).float())
        needed = self.length + t
        if needed > self.codes.shape[2]:
            capacity = max(needed, 2 * self.codes.shape[2], 16)
            codes = self.codes.new_empty(b, h, capacity, d)
            scales = self.scales.new_empty(b, h, capacity)
            codes[:, :, :self.length] = self.codes[:, :, :self.length]
            scales[:, :, :self.length] = self.scales[:, :, :self.length]
            self.codes, self.scales = codes, scales
        self.codes[:, :, self.length:needed] = q.view(b, h, t, d)
        self.scales[:, :, self.length:needed] = s.view(b, h, t)
        self.length = needed

    def states(self, dtype: torch.dtype) -> Int8KVStates:
        """The filled part, as attention receives it."""
        n = self.length
        return Int8KVStates(self.codes[:, :, :n], self.scales[:, :, :n], dtype)

    def apply(self, fn) -> None:
        """Apply ``fn`` (a batch-dimension operation) to the filled part of the cache."""
        n = self.length
        self.codes, self.scales = fn(self.codes[:, :, :n]), fn(self.scales[:, :, :n])

    def crop(self, length: int) -> None:
        self.length = length

    def to(self, device: torch.device | str) -> None:
        self.codes, self.scales = self.codes.to(device), self.scales.to(device)

    def nbytes(self, dtype: torch.dtype | None = None) -> int:
        b, h, _, d = self.codes.shape
        if dtype is None:
            return b * h * self.length * (d + 4)
        return b * h * self.length * d * dtype.itemsize


class Int8KVLayer(DynamicLayer):
    """One decoder layer's int8 key/value cache (see the module docstring). ``keys``/``values`` stay None: the
    states live as codes and scales, and :meth:`update` returns them as :class:`Int8KVStates`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._keys: _Int8States | None = None
        self._values: _Int8States | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        for name, states in (("key_states", key_states), ("value_states", value_states)):
            if not isinstance(states, torch.Tensor) or states.dim() != 4 or not states.is_floating_point():
                got = tuple(states.shape) if isinstance(states, torch.Tensor) else type(states).__name__
                raise ValueError(f"{name} must be a floating-point [batch, heads, tokens, head_dim] tensor, got {got}")
        self.device, self.dtype = key_states.device, key_states.dtype
        self._keys, self._values = _Int8States(key_states), _Int8States(value_states)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
               ) -> tuple[Int8KVStates, Int8KVStates]:
        """Quantize the new states into the cache; return every cached token's keys and values (as
        :class:`Int8KVStates`: dequantized by the first operation on them, read as codes by quanta's decode
        attention)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._keys.append(key_states)
        self._values.append(value_states)
        return self._keys.states(key_states.dtype), self._values.states(value_states.dtype)

    def get_seq_length(self) -> int:
        return self._keys.length if self.is_initialized else 0

    def reset(self) -> None:
        self._keys = self._values = None
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` tokens (transformers' convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError(f"tokens_to_remove must be a negative count of tokens to drop, got {tokens_to_remove}")
        if tokens_to_remove == 0 or not self.is_initialized:
            return
        length = max(self.get_seq_length() + tokens_to_remove, 0)
        self._keys.crop(length)
        self._values.crop(length)

    def _batch_op(self, fn) -> None:
        if self.get_seq_length() > 0:
            self._keys.apply(fn)
            self._values.apply(fn)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._batch_op(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._batch_op(lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._batch_op(lambda t: t[indices, ...])

    def offload(self) -> None:
        if self.is_initialized:
            self._keys.to("cpu")
            self._values.to("cpu")

    def prefetch(self) -> None:
        if self.is_initialized:
            self._keys.to(self.device)
            self._values.to(self.device)

    def nbytes(self, dtype: torch.dtype | None = None) -> int:
        """Bytes the cached tokens take (codes and scales), or would take as plain ``dtype`` tensors."""
        if not self.is_initialized:
            return 0
        return self._keys.nbytes(dtype) + self._values.nbytes(dtype)


class Int8KVCache(Cache):
    """transformers ``Cache`` whose layers keep keys and values as int8 (:class:`Int8KVLayer`).

    Pass it as ``cache`` to a decoder's forward or ``generate`` (``past_key_values`` in older transformers).
    ``config`` (the model's) is checked: every layer must be full attention (a sliding-window layer would need
    its own window logic); without it, layers are added as the model first calls them.
    """

    def __init__(self, config: Any = None) -> None:
        if config is None:
            super().__init__(layer_class_to_replicate=Int8KVLayer)
            return
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        layer_types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
        other = sorted(set(layer_types) - {"full_attention"})
        if other:
            raise ValueError(f"Int8KVCache supports full-attention layers only; config has layer types {other}")
        if getattr(text, "sliding_window", None) and getattr(text, "use_sliding_window", True):
            raise ValueError(f"Int8KVCache supports full-attention layers only; config has sliding_window="
                             f"{text.sliding_window} (set it to None for full attention)")
        super().__init__(layers=[Int8KVLayer() for _ in range(text.num_hidden_layers)])

    def nbytes(self, dtype: torch.dtype | None = None) -> int:
        """Bytes of every cached key and value (codes and scales), or as plain ``dtype`` tensors."""
        return sum(layer.nbytes(dtype) for layer in self.layers if isinstance(layer, Int8KVLayer))
