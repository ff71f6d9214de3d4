"""GPTQ: the algorithm on one layer, the two quantize_ steps, and its guarantees."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn

from quanta.dtypes import AffineQuantizedTensor, UintxLayout
from quanta.dtypes.linear_activation import LinearActivationQuantizedTensor
from quanta.dtypes.serialization import load_quantized, save_quantized
from quanta.quantization import (
    Float8WeightOnlyConfig,
    FPXWeightOnlyConfig,
    GPTQConfig,
    Int4WeightOnlyConfig,
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    PerBlock,
    PerGroup,
    PerTensor,
    quantize_,
)
from quanta.quantization.gptq import HessianObserver, gptq_quantize, gptq_quantize_reference, output_mse
from quanta.quantization.quant_primitives import MappingType
from quanta.quantization.weight_grid import WeightGrid

# every base config; (config, weight dtype) where the grid reproduces round-to-nearest bit for bit
EXACT = [
    (Int8WeightOnlyConfig(), torch.float32),
    (Int8WeightOnlyConfig(group_size=32), torch.float32),
    (Int4WeightOnlyConfig(group_size=32), torch.bfloat16),  # Int4CPULayout stores bf16 qparams
    (Int4WeightOnlyConfig(group_size=64, layout=UintxLayout(torch.uint4)), torch.float32),
    (Int8DynamicActivationInt8WeightConfig(), torch.float32),
    (Float8WeightOnlyConfig(), torch.float32),
    (IntxWeightOnlyConfig(torch.int3, PerGroup(32)), torch.float32),
    (IntxWeightOnlyConfig(torch.int4, PerTensor()), torch.float32),
    (IntxWeightOnlyConfig(torch.uint4, PerBlock((4, 32)), mapping_type=MappingType.ASYMMETRIC), torch.float32),
    (FPXWeightOnlyConfig(3, 2), torch.bfloat16),
]
IDS = [f"{c.describe()}-{i}" for i, (c, _) in enumerate(EXACT)]


def _correlated(k: int, rank: int = 24, seed: int = 0):
    """A sampler of inputs that live mostly in a low-rank subspace (as real activations do), with an offset."""
    g = torch.Generator().manual_seed(seed)
    basis, offset = torch.randn(rank, k, generator=g), torch.randn(k, generator=g)
    mix = torch.randn(k, k, generator=g) / k ** 0.5

    def sample(t: int, seed: int) -> torch.Tensor:
        gs = torch.Generator().manual_seed(seed)
        return torch.randn(t, rank, generator=gs) @ basis + 0.2 * torch.randn(t, k, generator=gs) @ mix + offset
    return sample


@pytest.mark.parametrize("config,dtype", EXACT, ids=IDS)
def test_a_diagonal_hessian_gives_round_to_nearest_bit_for_bit(config, dtype):
    # uncorrelated inputs: no column's error can be compensated by another, and GPTQ must be RTN exactly
    torch.manual_seed(0)
    lin = nn.Linear(128, 64).to(dtype)
    w = lin.weight.detach()
    h = torch.diag(torch.rand(128) + 0.1)
    for act_order in (False, True):
        result = gptq_quantize(w, h, WeightGrid(config, lin, w), act_order=act_order)
        expected = config.quantize_weight(w, lin)
        assert type(result.tensor) is type(expected)
        assert torch.equal(result.tensor.dequantize(), expected.dequantize())
        assert result.mse == pytest.approx(result.rtn_mse, rel=1e-9, abs=0)


@pytest.mark.parametrize("config,dtype", EXACT, ids=IDS)
def test_gptq_lowers_the_held_out_output_error(config, dtype):
    torch.manual_seed(1)
    k = 128
    lin = nn.Linear(k, 64).to(dtype)
    w = lin.weight.detach()
    sample = _correlated(k)
    obs = HessianObserver(k)
    obs.update(sample(1024, 1))
    held_out = sample(512, 2)
    rtn = config.quantize_weight(w, lin).dequantize().float()
    for act_order in (False, True):
        result = gptq_quantize(w, obs.hessian(), WeightGrid(config, lin, w), act_order=act_order)
        q = result.tensor.dequantize().float()
        err_gptq = (held_out @ (q - w.float()).t()).pow(2).mean()
        err_rtn = (held_out @ (rtn - w.float()).t()).pow(2).mean()
        assert err_gptq < 0.5 * err_rtn, (act_order, float(err_gptq / err_rtn))
        assert result.mse < result.rtn_mse


@pytest.mark.parametrize("config,block_size", [(Int4WeightOnlyConfig(group_size=32), 48),
                                               (Int4WeightOnlyConfig(group_size=128), 128),
                                               (Int8WeightOnlyConfig(), 64),
                                               (IntxWeightOnlyConfig(torch.int3, PerGroup(32)), 128)],
                         ids=["int4-g32-block48", "int4-g128", "int8-per-row", "int3-g32"])
def test_the_same_bits_as_the_textbook_algorithm(config, block_size):
    # the column loop's shortcuts (qparams checked once per group, in-place updates, column i left out of its
    # own update) must not change a bit
    torch.manual_seed(3)
    k = 256
    lin = nn.Linear(k, 48)
    w = lin.weight.detach()
    obs = HessianObserver(k)
    obs.update(_correlated(k)(512, 4))
    result = gptq_quantize(w, obs.hessian(), WeightGrid(config, lin, w), block_size=block_size)
    expected = gptq_quantize_reference(w, obs.hessian(), WeightGrid(config, lin, w), block_size=block_size)
    assert result.damping == 0.01
    assert torch.equal(result.tensor.dequantize(), expected)


def test_the_hessian_observer_accumulates_2_x_xt_over_every_row():
    obs = HessianObserver(8)
    xs = [torch.randn(3, 5, 8), torch.randn(7, 8)]
    for x in xs:
        obs.update(x)
    rows = torch.cat([x.reshape(-1, 8) for x in xs])
    torch.testing.assert_close(obs.hessian(), 2 * rows.t() @ rows / 22)
    assert obs.count == 22
    with pytest.raises(ValueError, match="8"):
        obs.update(torch.randn(2, 9))
    with pytest.raises(ValueError, match="no input"):
        HessianObserver(4).hessian()


def test_output_mse_is_the_mean_squared_output_change_on_the_inputs():
    x = torch.randn(50, 16, dtype=torch.float64)
    delta = torch.randn(4, 16, dtype=torch.float64)
    obs = HessianObserver(16)
    obs.update(x)
    assert output_mse(delta, obs.hessian()) == pytest.approx(float((x @ delta.t()).pow(2).mean()), rel=1e-12)


def test_dead_inputs_zero_their_weights_and_are_noted():
    lin = nn.Linear(64, 16)
    x = torch.randn(256, 64)
    x[:, 5] = 0
    obs = HessianObserver(64)
    obs.update(x)
    result = gptq_quantize(lin.weight.detach(), obs.hessian(), WeightGrid(Int8WeightOnlyConfig(), lin, lin.weight))
    assert bool((result.tensor.dequantize()[:, 5] == 0).all())
    assert any("never non-zero" in n for n in result.notes)


def test_gptq_rejects_bad_arguments():
    lin = nn.Linear(32, 8)
    w = lin.weight.detach()
    grid = WeightGrid(Int8WeightOnlyConfig(), lin, w)
    with pytest.raises(ValueError, match="hessian must have shape"):
        gptq_quantize(w, torch.eye(16), grid)
    with pytest.raises(ValueError, match="percdamp"):
        gptq_quantize(w, torch.eye(32), grid, percdamp=0.0)
    with pytest.raises(ValueError, match="block_size"):
        gptq_quantize(w, torch.eye(32), grid, block_size=0)
    bad = torch.eye(32)
    bad[0, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        gptq_quantize(w, bad, grid)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 32), nn.Conv1d(4, 4, 3))


def test_quantize_observe_then_convert():
    model = _mlp()
    base = Int4WeightOnlyConfig(group_size=32)
    before = [model[0].weight.detach().clone(), model[2].weight.detach().clone()]
    report = quantize_(model, GPTQConfig(step="observe", base_config=base))
    assert report.observed == ["0", "2"] and report.quantized == []
    assert torch.equal(model[0].weight, before[0])  # observing changes no weight
    sample = _correlated(128)
    for i in range(4):
        model[:3](sample(64, i))
    report = quantize_(model, GPTQConfig(step="convert", base_config=base))
    assert report.quantized == ["0", "2"] and set(report.output_mse) == {"0", "2"}
    for i in (0, 2):
        assert isinstance(model[i].weight, AffineQuantizedTensor)
        assert not model[i]._forward_pre_hooks and "_quanta_gptq_observer" not in model[i].__dict__
        rtn_mse, gptq_mse = report.output_mse[str(i)]
        assert gptq_mse < rtn_mse
    assert "output MSE" in str(report)
    # an ordinary quantized tensor: it runs, and serializes
    assert model[:3](torch.randn(2, 128)).shape == (2, 32)


def test_the_result_serializes_like_any_quantized_weight(tmp_path):
    model = _mlp()[:3]
    quantize_(model, GPTQConfig(step="observe", base_config=Int8DynamicActivationInt8WeightConfig()))
    model(torch.randn(32, 128))
    quantize_(model, GPTQConfig(step="convert", base_config=Int8DynamicActivationInt8WeightConfig()))
    assert isinstance(model[0].weight, LinearActivationQuantizedTensor)
    save_quantized(model.state_dict(), tmp_path / "m.safetensors")
    loaded = load_quantized(tmp_path / "m.safetensors")
    fresh = _mlp()[:3]
    fresh.load_state_dict(loaded, assign=True)
    x = torch.randn(3, 128)
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)


def test_convert_without_observe_is_refused():
    with pytest.raises(ValueError, match="step='observe'"):
        quantize_(_mlp(), GPTQConfig(step="convert"))


def test_a_layer_that_saw_no_data_stays_in_float_with_a_warning_or_refuses_under_strict():
    model = _mlp()
    quantize_(model, GPTQConfig(step="observe", base_config=Int8WeightOnlyConfig()))
    model[0](torch.randn(8, 128))  # layer 2 never runs
    w2 = model[2].weight
    with pytest.raises(ValueError, match="no calibration input"):
        quantize_(model, GPTQConfig(step="convert", base_config=Int8WeightOnlyConfig()), strict=True)
    assert not isinstance(model[0].weight, AffineQuantizedTensor)  # strict changed nothing
    with pytest.warns(UserWarning, match="no calibration input"):
        report = quantize_(model, GPTQConfig(step="convert", base_config=Int8WeightOnlyConfig()))
    assert report.quantized == ["0"] and "2" in report.skipped and model[2].weight is w2


def test_non_linear_layers_are_listed_not_quantized():
    model = _mlp()
    with pytest.warns(UserWarning, match="nn.Linear"):
        report = quantize_(model, GPTQConfig(step="observe"), filter_fn=lambda m, n: n in ("0", "3"))
    assert report.observed == ["0"] and "3" in report.skipped


@pytest.mark.parametrize("kwargs,error,match", [
    ({"step": "calibrate"}, ValueError, "step"),
    ({"base_config": GPTQConfig()}, TypeError, "base_config"),
    ({"base_config": "int4"}, TypeError, "base_config"),
    ({"percdamp": 0}, ValueError, "percdamp"),
    ({"percdamp": float("nan")}, ValueError, "percdamp"),
    ({"gptq_quantize_block_size": 0}, ValueError, "block_size"),
    ({"act_order": 1}, TypeError, "act_order"),
])
def test_bad_configs_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        GPTQConfig(**kwargs)


def test_a_calibration_config_is_not_a_weight_quantizer():
    with pytest.raises(TypeError, match="two steps"):
        GPTQConfig().quantize_weight(torch.randn(4, 4), nn.Linear(4, 4))


def test_observing_twice_replaces_the_observer():
    model = _mlp()[:1]
    quantize_(model, GPTQConfig(step="observe", base_config=Int8WeightOnlyConfig()))
    model(torch.randn(5, 128))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quantize_(model, GPTQConfig(step="observe", base_config=Int8WeightOnlyConfig()))
    assert len(model[0]._forward_pre_hooks) == 1
    assert model[0].__dict__["_quanta_gptq_observer"][0].count == 0
    copy.deepcopy(model)  # an observed model can still be copied
