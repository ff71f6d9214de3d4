"""quanta.modelopt beyond the recorded vectors: MX/NVFP4 configs on the CPU (ModelOpt needs CUDA there), the config
formats, wildcard switches, summary, fold_weight, gradients, state dicts, and bad input."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import quanta.modelopt as mtq
from quanta.kernels.block_scaled import mx_quantize_dequantize, nvfp4_quantize_dequantize, per_tensor_amax_to_scale
from quanta.grids.block_scaled import MXFP4, MXFP8_E4M3, MXINT8, ScaleCalculationMode


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32)).eval()


def _data():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(8, 64, generator=g) for _ in range(3)]


def _loop(data):
    def forward_loop(m):
        for x in data:
            m(x)
    return forward_loop


def _rel(y, ref):
    return float((y - ref).pow(2).mean() / ref.pow(2).mean())


@pytest.mark.parametrize("name, fmt", [("MXFP8_DEFAULT_CFG", MXFP8_E4M3), ("MXFP4_DEFAULT_CFG", MXFP4),
                                       ("MXINT8_DEFAULT_CFG", MXINT8)])
def test_mx_configs_run_on_cpu(name, fmt):
    model, data = _mlp(), _data()
    x = data[0]
    ref = model(x)
    mtq.quantize(model, getattr(mtq, name), _loop(data))
    with torch.no_grad():
        y = model(x)
        # what the layers compute: NVIDIA's RCEIL MX on inputs and weights, blocks of 32 along the last dim
        h = torch.nn.functional.gelu(torch.nn.functional.linear(
            mx_quantize_dequantize(x, fmt, ScaleCalculationMode.RCEIL),
            mx_quantize_dequantize(model[0].weight, fmt, ScaleCalculationMode.RCEIL), model[0].bias))
        want = torch.nn.functional.linear(mx_quantize_dequantize(h, fmt, ScaleCalculationMode.RCEIL),
                                          mx_quantize_dequantize(model[2].weight, fmt, ScaleCalculationMode.RCEIL),
                                          model[2].bias)
    assert torch.equal(y, want)
    assert model[0].input_quantizer.amax is None  # MX has no amax
    assert _rel(y, ref) < (0.1 if fmt is MXFP4 else 0.005)


def test_nvfp4_config_uses_the_calibrated_amax_as_tensor_scale():
    model, data = _mlp(), _data()
    mtq.quantize(model, mtq.NVFP4_DEFAULT_CFG, _loop(data))
    q = model[0].input_quantizer
    amax = torch.stack([x.abs().max() for x in data]).max()
    assert torch.equal(q.amax, amax)
    x = data[1]
    assert torch.equal(q(x), nvfp4_quantize_dequantize(x, per_tensor_amax_to_scale(amax)))
    w = model[0].weight_quantizer
    assert torch.equal(w.amax, model[0].weight.abs().max())
    mtq.quantize(model2 := _mlp(), mtq.W4A16_NVFP4_CFG, _loop(data))
    assert not model2[0].input_quantizer.is_enabled and model2[0].weight_quantizer.is_enabled


def test_print_quant_summary(capsys, tmp_path):
    model = _mlp()
    mtq.quantize(model, mtq.INT8_DEFAULT_CFG, _loop(_data()))
    mtq.print_quant_summary(model)
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "6 TensorQuantizers found in model"
    assert out[0].startswith("0.input_quantizer") and "8 bit fake per-tensor amax=" in out[0]
    assert "0.output_quantizer" in out[1] and out[1].endswith("TensorQuantizer(disabled)")
    assert "axis=0" in out[2] and "calibrator=MaxCalibrator quant" in out[2]
    mtq.print_quant_summary(model, str(tmp_path))
    assert (tmp_path / ".quant_summary.txt").read_text().splitlines() == out


def test_wildcards_and_filters():
    model = _mlp()
    mtq.quantize(model, mtq.INT8_DEFAULT_CFG, _loop(_data()))
    mtq.disable_quantizer(model, "*input_quantizer")
    assert not model[0].input_quantizer.is_enabled and model[0].weight_quantizer.is_enabled
    mtq.enable_quantizer(model, lambda name: name.startswith("2.") and name.endswith("input_quantizer"))
    assert model[2].input_quantizer.is_enabled and not model[0].input_quantizer.is_enabled
    mtq.set_quantizer_attribute(model, "*weight_quantizer", {"num_bits": 4})
    assert model[0].weight_quantizer.num_bits == 4 and model[0].weight_quantizer.axis == 0  # partial update


def test_legacy_dict_format_equals_the_list_format():
    data = _data()
    legacy = {"quant_cfg": {"default": {"enable": False}, "*weight_quantizer": {"num_bits": 4, "axis": 0},
                            "*input_quantizer": {"num_bits": 8}}, "algorithm": "max"}
    listed = {"quant_cfg": [{"quantizer_name": "*", "enable": False},
                            {"quantizer_name": "*weight_quantizer", "cfg": {"num_bits": 4, "axis": 0}},
                            {"quantizer_name": "*input_quantizer", "cfg": {"num_bits": 8}}], "algorithm": "max"}
    a, b = mtq.quantize(_mlp(), legacy, _loop(data)), mtq.quantize(_mlp(), listed, _loop(data))
    assert torch.equal(a(data[0]), b(data[0]))


def test_parent_class_entries_and_requantizing():
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 4)).eval()
    x = torch.randn(2, 3, 10, 10)
    mtq.quantize(model, mtq.INT8_DEFAULT_CFG, lambda m: m(x))
    assert not model[1].input_quantizer.is_enabled  # nn.BatchNorm2d: off in every named config
    assert model[3].input_quantizer.is_enabled      # the pooling layer's input is quantized, as in ModelOpt
    mtq.quantize(model, mtq.FP8_DEFAULT_CFG, lambda m: m(x))  # already quantized: reconfigured, recalibrated
    assert model[0].weight_quantizer.num_bits == (4, 3) and model[0].weight_quantizer.axis is None


def test_fold_weight_keeps_the_outputs():
    model, data = _mlp(), _data()
    mtq.quantize(model, mtq.INT4_BLOCKWISE_WEIGHT_ONLY_CFG, _loop(data))
    before = model(data[0])
    mtq.fold_weight(model)
    assert not model[0].weight_quantizer.is_enabled
    assert torch.equal(model(data[0]), before)


def test_sequential_quantizer_from_a_cfg_list():
    model = _mlp()
    cfg = {"quant_cfg": [{"quantizer_name": "*", "enable": False},
                         {"quantizer_name": "*weight_quantizer",
                          "cfg": [{"num_bits": 4, "block_sizes": {-1: 32}}, {"num_bits": (4, 3)}]}],
           "algorithm": "max"}
    mtq.quantize(model, cfg, None)
    wq = model[0].weight_quantizer
    assert isinstance(wq, mtq.SequentialQuantizer) and len(wq) == 2
    w = model[0].weight.detach()
    assert torch.equal(wq(w), wq[1](wq[0](w)))


def test_gradients_pass_through_by_default_and_clip_on_request():
    q = mtq.TensorQuantizer(mtq.QuantizerAttributeConfig(num_bits=8), amax=1.0)
    x = torch.tensor([0.5, 2.0], requires_grad=True)
    q(x).sum().backward()
    assert x.grad.tolist() == [1.0, 1.0]
    for bits in (8, (4, 3)):
        q = mtq.TensorQuantizer(mtq.QuantizerAttributeConfig(num_bits=bits, pass_through_bwd=False), amax=1.0)
        x = torch.tensor([0.5, 2.0], requires_grad=True)
        q(x).sum().backward()
        assert x.grad.tolist() == [1.0, 0.0]


def test_state_dict_round_trip():
    model, data = _mlp(), _data()
    mtq.quantize(model, mtq.INT8_DEFAULT_CFG, _loop(data))
    fresh = _mlp()
    mtq.quantize(fresh, mtq.INT8_DEFAULT_CFG, None)  # weights calibrated, inputs not
    fresh.load_state_dict(model.state_dict())
    assert torch.equal(fresh(data[0]), model(data[0]))


def test_forward_loop_without_arguments():
    model, data = _mlp(), _data()
    mtq.quantize(model, mtq.INT8_DEFAULT_CFG, lambda: [model(x) for x in data])
    assert model[0].input_quantizer.amax is not None


@pytest.mark.parametrize("config, exc, words", [
    ({"quant_cfg": [{"quantizer_name": "*", "cfg": {"num_bitz": 8}}]}, ValueError, "num_bitz"),
    ({"quant_cfg": [{"quantizer_name": "*"}]}, ValueError, "needs 'cfg', 'enable'"),
    ({"quant_cfg": [{"quantizer_name": "*", "cfg": {"num_bits": (3, 3)}}]}, ValueError, "float format"),
    ({"quant_cfg": [{"quantizer_name": "*", "cfg": {"num_bits": (2, 1)}}]}, ValueError, "dynamic block_sizes"),
    ({"quant_cfg": [{"quantizer_name": "*", "cfg": {"learn_amax": True}}]}, ValueError, "learn_amax"),
    ({"quant_cfg": [{"quantizer_name": "*", "enable": False, "parent_class": "nn.Foo"}]}, ValueError, "nn.Foo"),
    ({"quant_cfg": [], "algorithm": "mse"}, NotImplementedError, "mse"),
    ({"quant_cfg": [], "algorithm": "awq_full"}, ValueError, "needs forward_loop"),
    ({"quant_cfg": [], "algorithm": {"method": "awq_lite", "alpha": 0.5}}, ValueError, "awq_lite takes"),
    ({"quant_cfg": [], "algorithm": "awq_lite"}, ValueError, "needs forward_loop"),
    ({"quant_cfg": [], "algorithm": "smoothquant"}, ValueError, "needs forward_loop"),
    ({"quant_cfg": [], "algorithm": {"method": "smoothquant", "alpha": 2.0}}, ValueError, "alpha"),
    ({"quant_cfg": [], "algorithm": "percentile"}, ValueError, "percentile"),
    ({"quant_cfg": [], "algorithmm": "max"}, ValueError, "algorithmm"),
    ("INT8_DEFAULT_CFG", TypeError, "config must be a dict"),
])
def test_bad_configs_change_nothing(config, exc, words):
    model = _mlp()
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(exc, match=words):
        mtq.quantize(model, config, None)
    assert not mtq.is_quantized(model)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_recurrent_layers_stay_in_float_with_a_warning():
    model = nn.Sequential(nn.LSTM(8, 8))
    with pytest.warns(UserWarning, match="LSTM|recurrent"):
        mtq.quantize(model, mtq.INT8_DEFAULT_CFG, None)
