"""Quantized :class:`torch.nn.MultiheadAttention`.

The forward is ``F.multi_head_attention_forward`` (never torch's native fast
path, which would read the float weights) on fake-quantized tensors::

    out, weights = F.multi_head_attention_forward(QDQ_in(query), QDQ_in(key), QDQ_in(value),
                                                  ..., QDQ_w(in_proj_weight), ...,
                                                  QDQ_w(out_proj.weight), out_proj.bias)
    return QDQ_out0(out), QDQ_out1(weights)

>>> import torch, quanta.nn
>>> mha = torch.nn.MultiheadAttention(16, 4, batch_first=True)
>>> qmha = quanta.nn.QuantizedMultiheadAttention.from_module(mha)
>>> qmha.in_proj_weight is mha.in_proj_weight, type(qmha.out_proj).__name__
(True, 'QuantizedLinear')
>>> qmha.param_quantizers["in_proj_weight"]
QuantizeDequantize(shape=(48, 1), qmin=-128, qmax=127, symmetric=True)
>>> x = torch.randn(2, 5, 16)
>>> with qmha.compute_encodings():
...     _ = qmha(x, x, x)
>>> out, weights = qmha(x, x, x)
>>> type(out).__name__, out.shape, weights.shape
('DequantizedTensor', torch.Size([2, 5, 16]), torch.Size([2, 5, 5]))
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from quanta.nn.base import (
    QuantizationMixin,
    default_activation_quantizer,
    default_weight_quantizer,
    plain,
)
from quanta.nn.modules import QuantizedLinear

__all__ = ["QuantizedMultiheadAttention"]

_PROJ_WEIGHTS = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight")


class QuantizedMultiheadAttention(QuantizationMixin, nn.MultiheadAttention):
    """Quantized :class:`torch.nn.MultiheadAttention` (same arguments, same forward semantics).

    Quantizers (``None`` = off):

    * ``input_quantizers``: ``[query, key, value]``, all off by default. When
      ``query is key`` (or ``key is value``) and both slots hold the same
      quantizer (or both are None), the tensor is quantized once and the
      identity is kept, so self-attention still takes the packed projection.
    * ``param_quantizers``: ``in_proj_weight`` (or ``q_proj_weight``,
      ``k_proj_weight``, ``v_proj_weight`` when ``kdim``/``vdim`` differ)
      signed symmetric 8-bit, one scale per output row; ``in_proj_bias``,
      ``bias_k``, ``bias_v`` off.
    * ``out_proj`` is a :class:`~quanta.nn.QuantizedLinear` sharing the float
      ``out_proj``'s parameters: its ``weight`` per output channel, its bias
      and its own output quantizer off (``output_quantizers[0]`` below
      quantizes the same tensor). Its input is internal to
      ``F.multi_head_attention_forward``, so ``out_proj.input_quantizers[0]``
      must stay None.
    * ``output_quantizers``: ``[attn_output, attn_weights]``: per-tensor
      asymmetric 8-bit on the output, None on the returned weights. The
      weights quantizer only changes the returned weights, not the ones used
      to compute ``attn_output``.

    :meth:`compute_encodings` calibrates ``out_proj``'s quantizers too.
    """

    num_inputs = 3
    num_outputs = 2

    # -- defaults --------------------------------------------------------------------
    def _init_quantizers(self) -> None:
        self.input_quantizers = nn.ModuleList([None] * self.num_inputs)
        self.output_quantizers = nn.ModuleList([default_activation_quantizer(), None])
        self.param_quantizers = nn.ModuleDict({
            name: default_weight_quantizer(p, 0) if name in _PROJ_WEIGHTS else None
            for name, p in self.named_parameters(recurse=False)
        })
        self._init_out_proj()

    def _init_out_proj(self) -> None:
        out_proj = self.out_proj
        if isinstance(out_proj, QuantizationMixin):
            out_proj._init_quantizers()
        else:
            out_proj = QuantizedLinear.from_module(out_proj)  # shares weight and bias
            self.out_proj = out_proj
        out_proj.output_quantizers[0] = None  # self.output_quantizers[0] quantizes the same tensor

    # -- calibration -------------------------------------------------------------------
    def _quantizers(self) -> Iterator[nn.Module]:
        # Deduplicated: one quantizer may sit in several slots, and compute_encodings() may enter it only once.
        seen: set[int] = set()
        inner = self.out_proj._quantizers() if isinstance(self.out_proj, QuantizationMixin) else ()
        for q in (*super()._quantizers(), *inner):
            if id(q) not in seen:
                seen.add(id(q))
                yield q

    # -- forward -----------------------------------------------------------------------
    def _qinputs(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[Any, Any, Any]:
        """QDQ'd query/key/value as plain tensors, keeping ``is`` relations that torch checks."""
        qs = self.input_quantizers
        q = self._qinput(0, query)
        k = q if key is query and qs[1] is qs[0] else self._qinput(1, key)
        if value is key and qs[2] is qs[1]:
            v = k
        elif value is query and qs[2] is qs[0]:
            v = q
        else:
            v = self._qinput(2, value)
        pq = plain(q)
        pk = pq if k is q else plain(k)
        pv = pk if v is k else pq if v is q else plain(v)
        return pq, pk, pv

    def _out_proj_params(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``out_proj``'s weight and bias after its param quantizers, as plain tensors."""
        out_proj = self.out_proj
        if not isinstance(out_proj, QuantizationMixin):  # the user swapped in a float Linear
            return out_proj.weight, out_proj.bias
        if out_proj.input_quantizers[0] is not None:
            raise ValueError(
                f"{type(self).__name__}.out_proj.input_quantizers[0] is set, but the out_proj input is computed "
                "inside F.multi_head_attention_forward and cannot be quantized; set it to None"
            )
        return plain(out_proj._qparam("weight")), plain(out_proj._qparam("bias"))

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Same arguments and result as :meth:`torch.nn.MultiheadAttention.forward`, on QDQ'd tensors."""
        query, key, value = self._qinputs(query, key, value)
        is_batched = query.dim() == 3
        if self.batch_first and is_batched:  # to (L, N, E), keeping the `is` relations (as torch does)
            t = {id(x): x.transpose(1, 0) for x in (value, key, query)}
            query, key, value = t[id(query)], t[id(key)], t[id(value)]
        out_w, out_b = self._out_proj_params()
        attn_output, attn_weights = F.multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads,
            plain(self._qparam("in_proj_weight")), plain(self._qparam("in_proj_bias")),
            plain(self._qparam("bias_k")), plain(self._qparam("bias_v")),
            self.add_zero_attn, self.dropout, out_w, out_b,
            training=self.training,
            key_padding_mask=key_padding_mask,
            need_weights=need_weights,
            attn_mask=attn_mask,
            use_separate_proj_weight=not self._qkv_same_embed_dim,
            q_proj_weight=plain(self._qparam("q_proj_weight")),
            k_proj_weight=plain(self._qparam("k_proj_weight")),
            v_proj_weight=plain(self._qparam("v_proj_weight")),
            average_attn_weights=average_attn_weights,
            is_causal=is_causal,
        )
        if self.batch_first and is_batched:
            attn_output = attn_output.transpose(1, 0)
        if isinstance(self.out_proj, QuantizationMixin):  # off by default; honoured if the user sets it
            attn_output = self.out_proj._qoutput(attn_output)
        return self._qoutput(attn_output, 0), self._qoutput(attn_weights, 1)
