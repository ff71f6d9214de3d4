"""pytorch_quantization's QuantLSTM / QuantLSTMCell: nn.LSTM's results with the quantizers off, the fused
quantization with them on, every nn.LSTM option, calibration, quant_modules and bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from quanta.tensor_quant import QuantDescriptor, fake_tensor_quant, quant_modules
from quanta.tensor_quant import nn as quant_nn


def _off(module):
    for q in module.modules():
        if isinstance(q, quant_nn.TensorQuantizer):
            q.disable()
    return module


@pytest.mark.parametrize("kwargs", [dict(), dict(num_layers=2), dict(bidirectional=True), dict(batch_first=True),
                                    dict(bias=False), dict(num_layers=2, bidirectional=True, batch_first=True)])
def test_quantizers_off_is_nn_lstm(kwargs):
    torch.manual_seed(0)
    ref = nn.LSTM(6, 5, **kwargs)
    q = _off(quant_nn.QuantLSTM(6, 5, **kwargs))
    q.load_state_dict(ref.state_dict())
    x = torch.randn(3, 7, 6) if kwargs.get("batch_first") else torch.randn(7, 3, 6)
    h0 = torch.randn(ref.num_layers * (2 if ref.bidirectional else 1), 3, 5)
    for hx in (None, (h0, torch.randn_like(h0))):
        (y, (h, c)), (yr, (hr, cr)) = q(x, hx), ref(x, hx)
        for a, b in ((y, yr), (h, hr), (c, cr)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_unbatched_and_packed_sequences():
    torch.manual_seed(0)
    ref = nn.LSTM(4, 3, num_layers=2, bidirectional=True)
    q = _off(quant_nn.QuantLSTM(4, 3, num_layers=2, bidirectional=True))
    q.load_state_dict(ref.state_dict())
    x = torch.randn(6, 4)
    torch.testing.assert_close(q(x)[0], ref(x)[0], rtol=1e-5, atol=1e-6)
    seqs = torch.randn(6, 3, 4)
    lengths = torch.tensor([4, 6, 2])
    packed = pack_padded_sequence(seqs, lengths, enforce_sorted=False)
    (y, (h, c)), (yr, (hr, cr)) = q(packed), ref(packed)
    torch.testing.assert_close(pad_packed_sequence(y)[0], pad_packed_sequence(yr)[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h, hr, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c, cr, rtol=1e-5, atol=1e-6)


def _fq(x, amax, axis=None):
    return fake_tensor_quant(x, amax, 8, False, False)


def test_fused_quantization_of_each_step():
    torch.manual_seed(0)
    lstm = quant_nn.QuantLSTM(4, 3)
    lstm._input_quantizers[0].amax = 2.0
    w = torch.cat([lstm.weight_ih_l0, lstm.weight_hh_l0], 1).detach()
    lstm._weight_quantizers[0].amax = w.abs().amax(1, keepdim=True)
    x = torch.randn(5, 2, 4)
    y, (h, c) = lstm(x)
    wq = _fq(w, w.abs().amax(1, keepdim=True))
    h_t = c_t = torch.zeros(2, 3)
    outs = []
    for t in range(5):
        xh = _fq(torch.cat([x[t], h_t], 1), torch.tensor(2.0))
        gates = xh[:, :4] @ wq[:, :4].T + lstm.bias_ih_l0 + xh[:, 4:] @ wq[:, 4:].T + lstm.bias_hh_l0
        i, f, g, o = gates.chunk(4, 1)
        c_t = torch.sigmoid(f) * c_t + torch.sigmoid(i) * torch.tanh(g)
        h_t = torch.sigmoid(o) * torch.tanh(c_t)
        outs.append(h_t)
    torch.testing.assert_close(y, torch.stack(outs), rtol=1e-6, atol=1e-6)
    cell = quant_nn.QuantLSTMCell(4, 3)
    cell.load_state_dict({k.replace("_l0", ""): v for k, v in lstm.state_dict().items()}, strict=False)
    cell.input_quantizer.amax = 2.0
    cell.weight_quantizer.amax = w.abs().amax(1, keepdim=True)
    h1, c1 = cell(x[0])
    torch.testing.assert_close(h1, outs[0], rtol=1e-6, atol=1e-6)


def test_calibration_sees_every_step_and_defaults():
    torch.manual_seed(0)
    lstm = quant_nn.QuantLSTM(4, 3, quant_desc_input=QuantDescriptor(num_bits=8, calib_method="histogram"))
    assert lstm._weight_quantizers[0].axis == 0 and lstm._input_quantizers[0].axis is None
    qs = [m for m in lstm.modules() if isinstance(m, quant_nn.TensorQuantizer)]
    for q in qs:
        q.disable_quant()
        q.enable_calib()
    x = torch.randn(5, 2, 4)
    x[3, 1, 2] = 9.0
    lstm(x)
    for q in qs:
        q.load_calib_amax("percentile", percentile=100.0) if q._calibrator.__class__.__name__.startswith("Hist") \
            else q.load_calib_amax()
        q.disable_calib()
        q.enable_quant()
    assert float(lstm._input_quantizers[0].amax) == pytest.approx(9.0, rel=0.01)
    assert lstm._weight_quantizers[0].amax.shape == (12, 1)


def test_quant_modules_and_float_state_dicts():
    torch.manual_seed(0)
    ref = nn.LSTM(4, 3)
    with quant_modules.initialize():
        built = nn.LSTM(4, 3)
        cell = nn.LSTMCell(4, 3)
    assert isinstance(built, quant_nn.QuantLSTM) and isinstance(cell, quant_nn.QuantLSTMCell)
    assert nn.LSTM.__name__ == "LSTM"
    built.load_state_dict(ref.state_dict())  # the same parameter names


@pytest.mark.parametrize("call, exc, words", [
    (lambda: quant_nn.QuantLSTM(4, 3, proj_size=2), ValueError, "proj_size"),
    (lambda: quant_nn.QuantLSTM(4, 3)(torch.randn(5, 2, 6)), ValueError, "input.size"),
    (lambda: quant_nn.QuantLSTMCell(4, 3)(torch.randn(2, 5)), ValueError, "input_size=4"),
    (lambda: quant_nn.QuantLSTM(4, 3, quant_desc_input="8bit"), TypeError, "quant_desc_input"),
    (lambda: quant_nn.QuantLSTMCell(4, 3, quant_desc_output=None), TypeError, "quant_desc_output"),
])
def test_bad_input(call, exc, words):
    with pytest.raises(exc, match=words):
        call()
