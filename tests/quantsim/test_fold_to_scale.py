"""fold_all_batch_norms_to_scale: a simulated BatchNorm folded into its layer's weight and weight range keeps
every weight's integer code and the sim's outputs; what cannot fold is named; bad input."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from generate_aimet_fold_to_scale import batch_norm  # the golden's BatchNorms: some weights negative
from quanta.batch_norm_fold import fold_all_batch_norms_to_scale
from quanta.quantsim import QuantizationSimModel
from quanta.quantsim.fold_to_scale import fold_all_batch_norms_to_scale as direct

PER_TENSOR = {"defaults": {"ops": {"is_output_quantized": "True"},
                           "params": {"is_quantized": "True", "is_symmetric": "True"},
                           "per_channel_quantization": "False"},
              "params": {"bias": {"is_quantized": "False"}}, "op_type": {},
              "supergroups": [{"op_list": ["Conv", "Relu"]}], "model_input": {"is_input_quantized": "True"},
              "model_output": {}}


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), batch_norm(8), nn.ReLU(), nn.Conv2d(8, 6, 3, padding=1), batch_norm(6),
                         nn.ConvTranspose2d(6, 5, 2, stride=2), batch_norm(5), nn.Flatten(), nn.Linear(5 * 8 * 8, 7),
                         batch_norm(7, nn.BatchNorm1d)).eval()


def _qdq(module) -> torch.Tensor:
    return module.param_quantizers["weight"](module.weight).as_subclass(torch.Tensor).detach()


def _r(bn) -> torch.Tensor:
    return (bn.weight / torch.sqrt(bn.running_var + bn.eps)).detach()


@pytest.mark.parametrize("param_bw", [8, 4])
def test_folding_keeps_the_codes_and_the_outputs(param_bw):
    model = _cnn()
    x = torch.randn(16, 3, 6, 6)
    sim = QuantizationSimModel(model, x, default_param_bw=param_bw)
    sim.compute_encodings([x, torch.randn(4, 3, 6, 6)], progress=False)
    layers = {"0": "1", "3": "4", "5": "6", "8": "9"}
    quantized = {n: _qdq(sim.model.get_submodule(n)) for n in layers}
    r = {n: _r(sim.model.get_submodule(bn)) for n, bn in layers.items()}
    with torch.no_grad():
        before = sim.model(x).as_subclass(torch.Tensor)
    pairs = fold_all_batch_norms_to_scale(sim)
    assert [type(layer).__name__ for layer, _ in pairs] == ["QuantizedConv2d", "QuantizedConv2d",
                                                           "QuantizedConvTranspose2d", "QuantizedLinear"]
    assert all(p.bn_follows_layer for p in pairs)
    for name in ("1", "4", "6", "9"):
        assert isinstance(sim.model.get_submodule(name), nn.Identity)
    for n in layers:  # every quantized weight is r times what it was: same code (negated where r < 0)
        axis = 1 if n == "5" else 0
        shape = [1] * quantized[n].dim()
        shape[axis] = -1
        module = sim.model.get_submodule(n)
        expected = quantized[n] * r[n].reshape(shape)
        off = (_qdq(module) - expected).abs() > 1e-5 * expected.abs().amax()
        # but for the grid's end: code -2^(b-1) negated (r < 0) is 2^(b-1), one past the top, so it takes the top
        steps = module.param_quantizers["weight"].get_scale().expand_as(expected)
        torch.testing.assert_close((_qdq(module) - expected).abs()[off], steps[off], rtol=1e-4, atol=0)
        assert bool((r[n].reshape(shape).expand_as(expected)[off] < 0).all()) and off.float().mean() < 0.02
    with torch.no_grad():
        after = sim.model(x).as_subclass(torch.Tensor)
    step = float(sim.model.get_submodule("8").output_quantizers[0].get_scale())  # the BatchNorm's, moved
    assert float((after - before).abs().max()) <= 1.01 * step  # float rounding can move an output by one step
    assert float(((after - before).abs() > 1e-3 * step).float().mean()) < 0.1  # and few do
    # the model keeps working: calibration again, and training (the range learns on the folded weights)
    sim.compute_encodings([x], progress=False)
    sim.model.train()
    sim.model(x).as_subclass(torch.Tensor).sum().backward()
    assert sim.model.get_submodule("0").weight.grad is not None


def test_uncalibrated_sim_folds_the_weights_and_leaves_the_range_to_calibration():
    model = _cnn()
    x = torch.randn(4, 3, 6, 6)
    sim = QuantizationSimModel(model, x)
    assert len(direct(sim)) == 4
    assert not sim.model.get_submodule("0").param_quantizers["weight"].is_initialized()
    sim.compute_encodings([x], progress=False)
    with torch.no_grad():  # the folded float model, quantized: close to the original float model
        ref, out = model(x), sim.model(x).as_subclass(torch.Tensor)
    assert float((out - ref).norm() / ref.norm()) < 0.05


def test_per_tensor_weights_are_left_unfolded_with_the_reason():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), batch_norm(8), nn.ReLU()).eval()
    x = torch.randn(2, 3, 6, 6)
    sim = QuantizationSimModel(model, x, config_file=PER_TENSOR)
    sim.compute_encodings([x], progress=False)
    with pytest.warns(UserWarning, match=r"1 not folded into 0: the weight range is not per output channel"):
        assert fold_all_batch_norms_to_scale(sim) == []
    assert isinstance(sim.model.get_submodule("1"), nn.BatchNorm2d)


def test_a_quantized_layer_output_or_bias_is_named():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), batch_norm(8), nn.ReLU()).eval()
    x = torch.randn(2, 3, 6, 6)
    sim = QuantizationSimModel(model, x)
    sim.compute_encodings([x], progress=False)
    conv = sim.model.get_submodule("0")
    conv.output_quantizers[0] = sim.model.get_submodule("2").output_quantizers[0]
    with pytest.warns(UserWarning, match="the layer's output is quantized"):
        assert fold_all_batch_norms_to_scale(sim) == []
    conv.output_quantizers[0] = None
    conv.param_quantizers["bias"] = conv.param_quantizers["weight"]
    with pytest.warns(UserWarning, match="the layer's bias is quantized"):
        assert fold_all_batch_norms_to_scale(sim) == []


def test_bad_input():
    with pytest.raises(TypeError, match="sim must be a QuantizationSimModel"):
        fold_all_batch_norms_to_scale(nn.Conv2d(1, 1, 1))

    torch.manual_seed(0)
    sim = QuantizationSimModel(nn.Sequential(nn.Conv2d(3, 4, 1), batch_norm(4)).eval(), torch.ones(1, 3, 4, 4),
                               trace=False)  # leaf modules only: no graph to find the pairs in
    with pytest.raises(TypeError, match="captured as a graph"):
        fold_all_batch_norms_to_scale(sim)
