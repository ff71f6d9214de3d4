"""pytorch_quantization's quantized LSTM: ``QuantLSTM`` and ``QuantLSTMCell`` (``quant_nn.QuantLSTM``...).

At every time step the cell computes its four gates in one fused product, and
the quantizers sit where an inference engine fuses it::

    [x', h'] = input_quantizer(cat([x_t, h_{t-1}], 1))          one amax for the step's fused activation
    [W_ih', W_hh'] = weight_quantizer(cat([W_ih, W_hh], 1))     per gate row by default (axis 0)
    gates = x' W_ih'^T + b_ih + h' W_hh'^T + b_hh,  then torch's LSTM equations

``QuantLSTM`` runs that cell over the sequence for every layer and direction,
each with its own quantizers (``_input_quantizers[l]``, ``_weight_quantizers[l]``,
``l = layer * num_directions + direction``), with ``batch_first``, ``bidirectional``,
``dropout`` between layers (training only), ``bias=False`` and ``PackedSequence``
inputs, as ``nn.LSTM``; its parameters are ``nn.LSTM``'s (same names, same
initialisation), so a float state dict loads. ``proj_size`` is refused, as in
pytorch_quantization. With every quantizer disabled the outputs are ``nn.LSTM``'s up to float rounding
(the gates are summed in another order).

>>> import torch
>>> lstm = QuantLSTM(8, 16, num_layers=2)
>>> out, (h, c) = lstm(torch.randn(5, 3, 8))
>>> out.shape, h.shape, len(lstm._input_quantizers)
(torch.Size([5, 3, 16]), torch.Size([2, 3, 16]), 2)
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from quanta.tensor_quant.descriptor import QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW, QUANT_DESC_8BIT_PER_TENSOR
from quanta.tensor_quant.module_base import QuantMixin, _descriptor, pop_quant_desc_in_kwargs
from quanta.tensor_quant.quantizer import TensorQuantizer

__all__ = ["QuantLSTM", "QuantLSTMCell", "quant_lstm_cell"]

_FloatLSTM, _FloatLSTMCell = nn.LSTM, nn.LSTMCell  # bound now: quant_modules.initialize() replaces them


def quant_lstm_cell(x: torch.Tensor, hidden: tuple[torch.Tensor, torch.Tensor], w_ih: torch.Tensor,
                    w_hh: torch.Tensor, b_ih: Optional[torch.Tensor], b_hh: Optional[torch.Tensor],
                    input_quantizer: Optional[TensorQuantizer] = None,
                    weight_quantizer: Optional[TensorQuantizer] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One LSTM step ``(h, c)`` on ``x`` ``[batch, input]`` with the fused quantizers of the module docstring."""
    h, c = hidden
    if input_quantizer is not None:
        x, h = input_quantizer(torch.cat([x, h], 1)).split([x.shape[1], h.shape[1]], 1)
    if weight_quantizer is not None:
        w_ih, w_hh = weight_quantizer(torch.cat([w_ih, w_hh], 1)).split([w_ih.shape[1], w_hh.shape[1]], 1)
    gates = F.linear(x, w_ih, b_ih) + F.linear(h, w_hh, b_hh)
    i, f, g, o = gates.chunk(4, 1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(c), c


def _reverse_within(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``x`` ``[T, B, ...]`` with each sequence's first ``lengths[b]`` steps reversed (padding stays put)."""
    t = torch.arange(x.shape[0], device=x.device).unsqueeze(1)
    idx = torch.where(t < lengths.unsqueeze(0), lengths.unsqueeze(0) - 1 - t, t)
    return x.gather(0, idx.reshape(*idx.shape, *(1,) * (x.dim() - 2)).expand_as(x))


class QuantLSTM(_FloatLSTM, QuantMixin):
    """``nn.LSTM`` with fake-quantized fused activations and weights per layer and direction (pytorch_quantization's
    ``QuantLSTM``): weights per gate row, activations per tensor by default."""

    default_quant_desc_input = QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        quant = {k: kwargs.pop(k) for k in ("quant_desc_input", "quant_desc_weight") if k in kwargs}
        super().__init__(*args, **kwargs)
        if self.proj_size:
            raise ValueError("proj_size is not supported by QuantLSTM (as in pytorch_quantization)")
        desc_input, desc_weight = pop_quant_desc_in_kwargs(type(self), **quant)
        n = self.num_layers * (2 if self.bidirectional else 1)
        self._input_quantizers = nn.ModuleList(
            TensorQuantizer(_descriptor(desc_input, "quant_desc_input")) for _ in range(n))
        self._weight_quantizers = nn.ModuleList(
            TensorQuantizer(_descriptor(desc_weight, "quant_desc_weight")) for _ in range(n))

    @property
    def input_quantizers(self) -> nn.ModuleList:
        return self._input_quantizers

    @property
    def weight_quantizers(self) -> nn.ModuleList:
        return self._weight_quantizers

    def _weights(self, layer: int, direction: int) -> tuple:
        sfx = f"_l{layer}{'_reverse' if direction else ''}"
        return tuple(getattr(self, f"{n}{sfx}", None) for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))

    def _run(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, weights: tuple, l: int,
             lengths: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = []
        for t in range(x.shape[0]):
            h_new, c_new = quant_lstm_cell(x[t], (h, c), *weights, self._input_quantizers[l],
                                           self._weight_quantizers[l])
            if lengths is not None:  # finished sequences keep their state; their outputs are zero
                alive = (t < lengths).unsqueeze(1)
                h_new, c_new = torch.where(alive, h_new, h), torch.where(alive, c_new, c)
                out.append(torch.where(alive, h_new, torch.zeros_like(h_new)))
            else:
                out.append(h_new)
            h, c = h_new, c_new
        return torch.stack(out), h, c

    def forward(self, input, hx=None):  # noqa: A002 - nn.LSTM's signature
        packed = isinstance(input, PackedSequence)
        if packed:
            x, lengths = pad_packed_sequence(input, batch_first=False)  # the batch in its original order
            lengths = lengths.to(x.device)
        else:
            if input.dim() not in (2, 3):
                raise ValueError(f"QuantLSTM expects a 2-D or 3-D input, got shape {tuple(input.shape)}")
            unbatched = input.dim() == 2
            x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if self.batch_first else input)
            lengths = None
        if x.shape[-1] != self.input_size:
            raise ValueError(f"input.size(-1) must be {self.input_size}, got {x.shape[-1]}")
        dirs = 2 if self.bidirectional else 1
        batch = x.shape[1]
        if hx is None:
            zeros = x.new_zeros(self.num_layers * dirs, batch, self.hidden_size)
            h0, c0 = zeros, zeros
        else:
            h0, c0 = hx
            if not packed and input.dim() == 2:
                h0, c0 = h0.unsqueeze(1), c0.unsqueeze(1)
        hs, cs = [], []
        for layer in range(self.num_layers):
            outs = []
            for d in range(dirs):
                l = layer * dirs + d
                seq = x if d == 0 else (x.flip(0) if lengths is None else _reverse_within(x, lengths))
                y, h, c = self._run(seq, h0[l], c0[l], self._weights(layer, d), l, lengths)
                if d == 1:
                    y = y.flip(0) if lengths is None else _reverse_within(y, lengths)
                outs.append(y)
                hs.append(h)
                cs.append(c)
            x = torch.cat(outs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                x = F.dropout(x, self.dropout, training=True)
        h_n, c_n = torch.stack(hs), torch.stack(cs)
        if packed:
            return pack_padded_sequence(x, lengths.cpu(), enforce_sorted=False), (h_n, c_n)
        if input.dim() == 2:
            return x.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
        return (x.transpose(0, 1) if self.batch_first else x), (h_n, c_n)


class QuantLSTMCell(_FloatLSTMCell, QuantMixin):
    """``nn.LSTMCell`` with the fused quantizers ``input_quantizer`` / ``weight_quantizer``."""

    default_quant_desc_input = QUANT_DESC_8BIT_PER_TENSOR
    default_quant_desc_weight = QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None,
                 dtype: Optional[torch.dtype] = None, **kwargs: Any) -> None:
        super().__init__(input_size, hidden_size, bias, device=device, dtype=dtype)
        self.init_quantizer(*pop_quant_desc_in_kwargs(type(self), **kwargs))

    def forward(self, input, hx=None):  # noqa: A002 - nn.LSTMCell's signature
        if input.dim() not in (1, 2):
            raise ValueError(f"QuantLSTMCell expects a 1-D or 2-D input, got shape {tuple(input.shape)}")
        unbatched = input.dim() == 1
        x = input.unsqueeze(0) if unbatched else input
        if x.shape[1] != self.input_size:
            raise ValueError(f"input has {x.shape[1]} features, expected input_size={self.input_size}")
        if hx is None:
            zeros = x.new_zeros(x.shape[0], self.hidden_size)
            hx = (zeros, zeros)
        elif unbatched:
            hx = (hx[0].unsqueeze(0), hx[1].unsqueeze(0))
        h, c = quant_lstm_cell(x, hx, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh,
                               self._input_quantizer, self._weight_quantizer)
        return (h.squeeze(0), c.squeeze(0)) if unbatched else (h, c)
