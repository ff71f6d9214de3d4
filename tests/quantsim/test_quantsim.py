"""QuantizationSimModel: construction, quantizer layout, configs, calibration, encodings files, folding.

References are independent of the code under test wherever numbers are checked:
the float model itself (quantizers off), and forwards recomputed by hand with
``quanta.quantization.affine.quantize_dequantize`` from each quantizer's
scale/offset/grid, which must agree bit for bit.
"""

from __future__ import annotations

import copy
import gc
import importlib.machinery
import importlib.util
import json
import os
import sys
import types
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quanta.nn
import quanta.quantsim
import quanta.quantsim.calibrate as calibrate_mod
from quanta.quantization.affine import QuantizeDequantize, quantize_dequantize
from quanta.quantization.base import QuantizerBase
from quanta.quantization.float import FloatQuantizeDequantize
from quanta.quantsim import DataType, QuantizationSimModel, QuantScheme, QuantSimConfig
from quanta.quantsim.config import BUILTIN_DEFAULT
from quanta._progress import progress_bar
from quantsim_models import SmallCNN, TransformerBlock, make_cnn_data, make_seq_data, sqnr_db


# -- helpers --------------------------------------------------------------------------------------
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen(seed))


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def deep_mlp(depth: int = 4, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(16, 16), nn.Tanh()]
    return nn.Sequential(*layers)


class TwoIn(nn.Module):
    """Two positional inputs, joined by a functional concat."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(7, 4)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([a, b], dim=-1))


def sim_of(model: nn.Module, dummy, **kwargs) -> QuantizationSimModel:
    """A sim of a model that must build without any warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return QuantizationSimModel(model, dummy, **kwargs)


def calibrated(model: nn.Module, data, **kwargs) -> QuantizationSimModel:
    dummy = data[0] if isinstance(data, list) else data
    sim = sim_of(model, dummy, **kwargs)
    sim.compute_encodings(data if isinstance(data, list) else [data], progress=False)
    return sim


def with_defaults(**sections) -> dict:
    """The built-in default config with ``sections`` merged in (one level deep per section)."""
    cfg = copy.deepcopy(dict(BUILTIN_DEFAULT))
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            cfg[key] = {**cfg[key], **value}
        else:
            cfg[key] = value
    return cfg


def qd(t: torch.Tensor, q: QuantizeDequantize) -> torch.Tensor:
    """Reference fake quantization with the functional API and the quantizer's own encoding."""
    return quantize_dequantize(t.detach(), q.get_scale().detach(), q.get_offset().detach(),
                               qmin=q.qmin, qmax=q.qmax, block_size=q.block_size)


def sub(sim: QuantizationSimModel, name: str) -> nn.Module:
    return sim.model.get_submodule(name)


def quantizer_values(sim: QuantizationSimModel) -> dict[str, dict[str, torch.Tensor]]:
    return {name: {k: v.detach().clone() for k, v in q.state_dict().items()} for name, q in sim.named_quantizers()}


def assert_same_values(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].keys() == b[name].keys(), name
        for k in a[name]:
            assert torch.equal(a[name][k], b[name][k]), f"{name}.{k}"


def assert_same_encodings(a: QuantizationSimModel, b: QuantizationSimModel) -> None:
    ea, eb = a.get_encodings(), b.get_encodings()
    assert ea.keys() == eb.keys() and ea
    for name in ea:
        assert ea[name] == eb[name], name


def snapshot(model: nn.Module) -> tuple:
    return (
        [(name, type(m)) for name, m in model.named_modules()],
        {k: v.detach().clone() for k, v in model.state_dict().items()},
        {name: m.training for name, m in model.named_modules()},
    )


def assert_unchanged(model: nn.Module, before: tuple) -> None:
    after = snapshot(model)
    assert after[0] == before[0]
    assert after[1].keys() == before[1].keys()
    for k in after[1]:
        assert torch.equal(after[1][k], before[1][k]), k
    assert after[2] == before[2]


def no_grad_forward(module: nn.Module, *args):
    with torch.no_grad():
        return module(*args)


# -- construction -----------------------------------------------------------------------------------
def test_dummy_input_tensor():
    x = randn(4, 8)
    sim = calibrated(mlp(), x)
    y = no_grad_forward(sim.model, x)
    assert y.shape == (4, 4) and torch.isfinite(y).all()


def test_dummy_input_tuple_for_two_inputs():
    a, b = randn(16, 3, seed=1), randn(16, 4, seed=2)
    model = TwoIn()
    sim = sim_of(model, (a, b))
    assert [n for n, _ in sim._prepared.inserted] == ["cat"]
    sim.compute_encodings([(a, b), (a * 2, b)], progress=False)
    y = no_grad_forward(sim.model, a, b)
    assert y.shape == (16, 4)
    assert 25 < sqnr_db(no_grad_forward(model, a, b), y) < float("inf")


BAD_ARGS = [
    ("model_str", dict(model="model"), TypeError, "model"),
    ("model_fn", dict(model=lambda x: x), TypeError, "model"),
    ("dummy_list", dict(dummy_input=[randn(2, 8)]), TypeError, "dummy_input"),
    ("dummy_empty_tuple", dict(dummy_input=()), TypeError, "dummy_input"),
    ("dummy_tuple_with_int", dict(dummy_input=(randn(2, 8), 3)), TypeError, "dummy_input"),
    ("dummy_none", dict(dummy_input=None), TypeError, "dummy_input"),
    ("quant_scheme_unknown", dict(quant_scheme="tf_fancy"), ValueError, "quant_scheme"),
    ("quant_scheme_int", dict(quant_scheme=3), ValueError, "quant_scheme"),
    ("param_quant_scheme", dict(param_quant_scheme="nope"), ValueError, "quant_scheme"),
    ("output_bw_zero", dict(default_output_bw=0), ValueError, "default_output_bw"),
    ("output_bw_33", dict(default_output_bw=33), ValueError, "default_output_bw"),
    ("output_bw_float", dict(default_output_bw=8.0), ValueError, "default_output_bw"),
    ("output_bw_bool", dict(default_output_bw=True), ValueError, "default_output_bw"),
    ("param_bw_neg", dict(default_param_bw=-4), ValueError, "default_param_bw"),
    ("param_bw_str", dict(default_param_bw="8"), ValueError, "default_param_bw"),
    ("data_type_str", dict(default_data_type="int8"), ValueError, "default_data_type"),
    ("data_type_torch", dict(default_data_type=torch.float16), ValueError, "default_data_type"),
    ("rounding_mode", dict(rounding_mode="stochastic"), ValueError, "rounding_mode"),
    ("in_place_str", dict(in_place="yes"), TypeError, "in_place"),
    ("config_bad_key", dict(config_file={"op_typ": {}}), ValueError, "op_typ"),
]


@pytest.mark.parametrize("kwargs, exc, text", [b[1:] for b in BAD_ARGS], ids=[b[0] for b in BAD_ARGS])
def test_bad_arguments_raise_naming_the_argument(kwargs, exc, text):
    args = dict(model=mlp(), dummy_input=randn(2, 8))
    args.update(kwargs)
    with pytest.raises(exc, match=text):
        QuantizationSimModel(**args)


def test_missing_config_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        QuantizationSimModel(mlp(), randn(2, 8), config_file=tmp_path / "absent.json")


@pytest.mark.parametrize("value, expected", [
    (int, DataType.INT), ("int", DataType.INT), (DataType.INT, DataType.INT),
    (types.SimpleNamespace(name="int"), DataType.INT),  # AIMET's QuantizationDataType.int
    (float, DataType.FLOAT), ("float", DataType.FLOAT),
], ids=["int", "'int'", "DataType.INT", "aimet_int", "float", "'float'"])
def test_default_data_type_forms(value, expected):
    sim = sim_of(nn.Sequential(nn.Tanh()), randn(2, 4), default_data_type=value)  # parameter-free model
    assert sim.default_data_type is expected
    q = sub(sim, "0").output_quantizers[0]
    assert isinstance(q, FloatQuantizeDequantize if expected is DataType.FLOAT else QuantizeDequantize)


def test_rounding_mode_nearest_is_accepted():
    sim = sim_of(mlp(), randn(2, 8), rounding_mode="nearest")
    assert sum(1 for _ in sim.named_quantizers()) == 5  # the model input, two weights, ReLU and model outputs


def test_not_in_place_leaves_the_original_untouched_through_qat():
    torch.manual_seed(0)
    model = SmallCNN()
    x, y = make_cnn_data(8)
    before = snapshot(model)
    sim = sim_of(model, x)
    sim.compute_encodings([x], progress=False)
    sim.model.train()
    opt = torch.optim.SGD(sim.model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        F.cross_entropy(sim.model(x), y).backward()
        opt.step()
    assert not torch.equal(sub(sim, "fc").weight, model.fc.weight)  # the sim did train
    assert not torch.equal(sub(sim, "bn1").running_mean, model.bn1.running_mean)
    sim.fold_param_quantizers()
    assert_unchanged(model, before)
    assert all(p.grad is None for p in model.parameters())


def test_in_place_shares_parameters():
    torch.manual_seed(0)
    model = mlp()
    x = randn(32, 8)
    sim = sim_of(model, x, in_place=True)
    assert sub(sim, "0").weight is model[0].weight and sub(sim, "2").bias is model[2].bias
    sim.compute_encodings([x], progress=False)
    w = model[0].weight.detach().clone()
    opt = torch.optim.SGD(sim.model.parameters(), lr=0.5)
    sim.model(x).pow(2).mean().backward()
    opt.step()
    assert not torch.equal(model[0].weight, w)  # the QAT step moved the original's weight
    assert torch.equal(model[0].weight, sub(sim, "0").weight)


def test_in_place_untraced_replaces_leaf_modules_of_the_model():
    model = mlp()
    sim = sim_of(model, randn(2, 8), in_place=True, trace=False)
    assert sim.model is model
    assert isinstance(model[0], quanta.nn.QuantizedLinear) and isinstance(model[1], quanta.nn.QuantizedReLU)


def test_model_with_quantizers_is_rejected():
    untraced = sim_of(mlp(), randn(2, 8), trace=False)
    with pytest.raises(ValueError, match="already holds quantizers"):
        QuantizationSimModel(untraced.model, randn(2, 8))
    holder = nn.Sequential(quanta.nn.QuantizedLinear(8, 4))
    with pytest.raises(ValueError, match="already holds quantizers"):
        QuantizationSimModel(holder, randn(2, 8))


def test_traced_sim_model_is_rejected():
    traced = sim_of(mlp(), randn(2, 8))
    with pytest.raises(ValueError, match="already holds quantizers"):
        QuantizationSimModel(traced.model, randn(2, 8))


# -- the default layout ----------------------------------------------------------------------------
def _layout(sim: QuantizationSimModel) -> dict[str, tuple]:
    return {name: (tuple(q.shape), q.qmin, q.qmax, q.symmetric) for name, q in sim.named_quantizers()}


W8 = (-128, 127, True)
A8 = ((), 0, 255, False)
A16 = ((), 0, 65535, False)


def test_default_layout_small_cnn():
    sim = sim_of(SmallCNN(), randn(2, 3, 16, 16))
    assert _layout(sim) == {
        "conv1.input_quantizers.0": A8,  # the model input
        # Conv -> BN -> ReLU supergroups: only the ReLU output; F.relu became module "relu"
        "conv1.param_quantizers.weight": ((16, 1, 1, 1), *W8),
        "relu1.output_quantizers.0": A8,
        "conv2.param_quantizers.weight": ((32, 1, 1, 1), *W8),  # grouped conv: still per output channel
        "relu.output_quantizers.0": A8,
        "conv3.param_quantizers.weight": ((32, 1, 1, 1), *W8),
        "relu_1.output_quantizers.0": A8,  # Conv -> F.relu supergroup
        "gap.output_quantizers.0": A8,     # averaging leaves the grid
        "fc.output_quantizers.0": A8,      # model output
        "fc.param_quantizers.weight": ((10, 1), *W8),
    }
    for name, m in sim.quantized_modules():
        assert all(q is None for q in m.input_quantizers) or name == "conv1", name
        if "bias" in m.param_quantizers:
            assert m.param_quantizers["bias"] is None, name
    for bn in ("bn1", "bn2"):
        m = sub(sim, bn)
        assert isinstance(m, quanta.nn.QuantizedBatchNorm2d)
        assert m.param_quantizers["weight"] is None and m.output_quantizers[0] is None
    assert sub(sim, "conv1").output_quantizers[0] is None
    assert type(sub(sim, "pool")) is nn.MaxPool2d  # passthrough: no quantizer, not reported
    assert sim.unquantized_modules == [] and sim.float_ops == []


def test_default_layout_transformer_block():
    sim = sim_of(TransformerBlock(), randn(2, 4, 32))
    assert sim.float_ops == [] and sim.unquantized_modules == []
    layout = _layout(sim)
    for name in ("qkv", "proj", "fc1", "fc2"):
        out = sub(sim, name).out_features
        assert layout[f"{name}.param_quantizers.weight"] == ((out, 1), *W8)
    for name in ("ln1", "ln2"):
        assert layout[f"{name}.param_quantizers.weight"] == A8  # norm weight per tensor, asymmetric below 16 bits
        assert sub(sim, name).param_quantizers["bias"] is None
    for name in ("qkv", "matmul", "softmax", "matmul_1", "fc1", "act"):
        assert layout[f"{name}.output_quantizers.0"] == A8, name  # no supergroup here
    assert sub(sim, "div").output_quantizers[0] is None  # a quantized tensor divided by a constant: rescaled
    for name in ("ln1", "ln2"):
        assert layout[f"{name}.output_quantizers.0"] == A16, name  # norms at 16 bits
    for name in ("add", "add_1"):  # the residual stream stays in float
        assert isinstance(sub(sim, name), quanta.nn.QuantizedAdd) and sub(sim, name).output_quantizers[0] is None
    for name in ("proj", "fc2"):  # a residual branch's last Linear: fused with its add (Gemm -> Add supergroup)
        assert sub(sim, name).output_quantizers[0] is None, name
    assert isinstance(sub(sim, "matmul"), quanta.nn.QuantizedMatMul)
    assert isinstance(sub(sim, "softmax"), quanta.nn.QuantizedSoftmax)
    assert layout["ln1.input_quantizers.0"] == A16  # the model input, where each op reads it (at the op's bitwidth)
    assert all(q is None for q in sub(sim, "add").input_quantizers)  # ... but the float add reads it in float


def test_integer_only_quantizes_the_residual_adds_too():
    sim = sim_of(TransformerBlock(), randn(2, 4, 32), config_file=quanta.quantsim.INTEGER_ONLY)
    layout = _layout(sim)
    for name in ("qkv", "matmul", "softmax", "matmul_1", "proj", "add", "fc1", "act", "fc2", "add_1"):
        assert layout[f"{name}.output_quantizers.0"] == A8, name
    for name in ("ln1", "ln2"):
        assert layout[f"{name}.output_quantizers.0"] == A16, name
    default = QuantSimConfig.load().to_dict()
    del default["op_type"]["Add"]
    default["supergroups"] = [g for g in default["supergroups"] if g["op_list"] != ["Gemm", "Add"]]
    assert QuantSimConfig.load(quanta.quantsim.INTEGER_ONLY) == QuantSimConfig.load(default)  # nothing else differs


def test_integer_only_shares_no_nested_dict_with_the_default():
    def dicts(d, path=()):
        if isinstance(d, dict):
            yield path, d
            for k, v in d.items():
                yield from dicts(v, (*path, k))

    mine = {id(d): p for p, d in dicts(quanta.quantsim.INTEGER_ONLY)}
    shared = [p for p, d in dicts(BUILTIN_DEFAULT) if id(d) in mine]
    assert shared == []  # a user editing one must not edit the other


def test_add_then_relu_is_one_output_quantizer_either_way():
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.fc(x) + x)

    for config in (None, quanta.quantsim.INTEGER_ONLY):
        sim = sim_of(Residual(), randn(2, 8), config_file=config)
        assert sub(sim, "add").output_quantizers[0] is None  # the supergroup's quantizer is ReLU's
        assert sub(sim, "relu").output_quantizers[0] is not None


def test_supergroup_linear_relu():
    sim = sim_of(mlp(), randn(2, 8))
    assert sub(sim, "0").output_quantizers[0] is None
    assert sub(sim, "1").output_quantizers[0] is not None
    assert sub(sim, "2").output_quantizers[0] is not None


class AddRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 1)
        self.c2 = nn.Conv2d(2, 4, 1)

    def forward(self, x):
        return torch.relu(self.c1(x) + self.c2(x))


def test_supergroup_add_relu():
    sim = sim_of(AddRelu(), randn(2, 2, 4, 4))
    assert sub(sim, "add").output_quantizers[0] is None
    assert sub(sim, "relu").output_quantizers[0] is not None
    assert sub(sim, "c1").output_quantizers[0] is not None  # Conv -> Add is no supergroup
    assert sub(sim, "c2").output_quantizers[0] is not None


class ConvTwoUsers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 1)
        self.relu = nn.ReLU()

    def forward(self, x):
        y = self.conv(x)
        return self.relu(y) * y


def test_supergroup_needs_a_single_user():
    sim = sim_of(ConvTwoUsers(), randn(2, 2, 4, 4))
    assert sub(sim, "conv").output_quantizers[0] is not None  # the multiply also reads it in full precision
    assert sub(sim, "relu").output_quantizers[0] is not None


def test_supergroup_conv_batchnorm():
    sim = sim_of(nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4)), randn(2, 2, 5, 5))
    assert sub(sim, "0").output_quantizers[0] is None
    assert sub(sim, "1").output_quantizers[0] is not None


def test_supergroups_off_with_a_config_without_them():
    sim = sim_of(mlp(), randn(2, 8), config_file=with_defaults(supergroups=[]))
    assert sub(sim, "0").output_quantizers[0] is not None


def test_model_output_can_be_turned_off():
    sim = sim_of(mlp(), randn(2, 8), config_file=with_defaults(model_output={"is_output_quantized": False}))
    assert sub(sim, "2").output_quantizers[0] is None
    assert sub(sim, "1").output_quantizers[0] is not None


# -- modules without a quantized counterpart -------------------------------------------------------
class WithLogSoftmax(nn.Module):  # log-softmax has no quantized counterpart
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.ss = nn.LogSoftmax(-1)
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        return self.head(self.ss(self.fc(x)))


def test_unknown_leaf_module_is_listed_and_runs_in_float():
    torch.manual_seed(0)
    x = randn(16, 8)
    with pytest.warns(UserWarning, match=r"without a quantized counterpart: ss\b.*quanta\.nn\.register"):
        sim = QuantizationSimModel(WithLogSoftmax(), x)
    assert sim.unquantized_modules == ["ss"]
    assert type(sub(sim, "ss")) is nn.LogSoftmax
    sim.compute_encodings([x], progress=False)
    seen = {}
    handle = sub(sim, "ss").register_forward_hook(lambda m, a, out: seen.update(inp=a[0], out=out))
    try:
        no_grad_forward(sim.model, x)
    finally:
        handle.remove()
    assert torch.equal(seen["out"], F.log_softmax(seen["inp"], -1))  # float op on the (quantized) fc output
    assert torch.equal(seen["inp"], qd(seen["inp"], sub(sim, "fc").output_quantizers[0]))


class Scale(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, n))

    def forward(self, x):
        return x * self.weight


class QuantizedScale(quanta.nn.QuantizationMixin, Scale):
    def forward(self, x):
        return self._qoutput(self._qinput(0, x) * self._qparam("weight"))


class WithScale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.scale = Scale(8)

    def forward(self, x):
        return self.scale(self.fc(x))


def test_user_module_untraced_is_listed():
    with pytest.warns(UserWarning, match="scale"):
        sim = QuantizationSimModel(WithScale(), randn(4, 8), trace=False)
    assert sim.unquantized_modules == ["scale"]
    assert type(sim.model.scale) is Scale


def test_user_module_with_parameters_is_reported_when_traced():
    with pytest.warns(UserWarning, match="scale"):
        sim = QuantizationSimModel(WithScale(), randn(4, 8), trace=False)
    assert "scale" in sim.unquantized_modules


def test_parameter_read_in_forward_is_quantized_as_a_parameter():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # x * self.weight: the multiply's weight input is a parameter quantizer
        sim = QuantizationSimModel(WithScale(), randn(4, 8))
    assert sim.capture_method == "export" and sim.unquantized_modules == []
    mul = sim.model.get_submodule("scale.mul")
    assert mul.input_quantizers[0] is None
    q = mul.input_quantizers[1]
    assert q is not None and q.symmetric and q.shape == () and q.bitwidth == 8


def test_registered_user_module_is_quantized():
    quanta.nn.register(Scale, QuantizedScale)
    try:
        torch.manual_seed(0)
        x = randn(32, 8)
        sim = sim_of(WithScale(), x)  # no warning: everything has a quantized counterpart
        m = sub(sim, "scale")
        assert type(m) is QuantizedScale and sim.unquantized_modules == []
        assert m.param_quantizers["weight"].shape == (8,)  # 1-D parameter, per channel
        sim.compute_encodings([x], progress=False)
        h = no_grad_forward(sub(sim, "fc"), x)
        expected = qd(h * qd(m.weight, m.param_quantizers["weight"]), m.output_quantizers[0])
        assert torch.equal(no_grad_forward(sim.model, x), expected)
    finally:
        quanta.nn.unregister(Scale)


# -- configs are applied ------------------------------------------------------------------------------
def test_per_type_bitwidth_override():
    cfg = with_defaults(op_type={**BUILTIN_DEFAULT["op_type"], "Conv": {"params": {"weight": {"bitwidth": 4}}}})
    sim = sim_of(SmallCNN(), randn(2, 3, 16, 16), config_file=cfg)
    for name in ("conv1", "conv2", "conv3"):
        q = sub(sim, name).param_quantizers["weight"]
        assert (q.qmin, q.qmax, q.shape[0]) == (-8, 7, sub(sim, name).out_channels)
    q = sub(sim, "fc").param_quantizers["weight"]
    assert (q.qmin, q.qmax) == (-128, 127)
    assert sub(sim, "relu1").output_quantizers[0].qmax == 255


def test_per_name_glob_disables_output_quantizer():
    cfg = with_defaults(module_name={"fc*": {"is_output_quantized": False}})
    sim = sim_of(TransformerBlock(), randn(2, 4, 32), config_file=cfg)
    assert sub(sim, "fc1").output_quantizers[0] is None and sub(sim, "fc2").output_quantizers[0] is None
    assert sub(sim, "fc1").param_quantizers["weight"] is not None
    for name in ("qkv", "matmul", "act"):
        assert sub(sim, name).output_quantizers[0] is not None, name


def test_per_channel_off_gives_per_tensor_weights():
    cfg = with_defaults(defaults={**BUILTIN_DEFAULT["defaults"], "per_channel_quantization": False})
    sim = sim_of(SmallCNN(), randn(2, 3, 16, 16), config_file=cfg)
    for name in ("conv1", "conv2", "conv3", "fc"):
        assert sub(sim, name).param_quantizers["weight"].shape == ()


def test_block_size_for_linear():
    cfg = with_defaults(op_type={"Gemm": {"params": {"weight": {"block_size": 4}}}})
    x = randn(64, 8)
    sim = calibrated(mlp(), x, config_file=cfg)
    q0, q2 = sub(sim, "0").param_quantizers["weight"], sub(sim, "2").param_quantizers["weight"]
    assert (q0.shape, q0.block_size) == ((16, 2), (1, 4))
    assert (q2.shape, q2.block_size) == ((4, 4), (1, 4))
    # per-block weights: each block of 4 inputs has its own scale
    w = sub(sim, "0").weight
    wq = qd(w, q0)
    for r in range(16):
        for blk in range(2):
            part = w[r, 4 * blk:4 * blk + 4].detach()
            scale = q0.get_scale()[r, blk].detach()
            ref = quantize_dequantize(part, scale, torch.tensor(0.0), qmin=-128, qmax=127)
            assert torch.equal(wq[r, 4 * blk:4 * blk + 4], ref)
    xq = qd(x, sub(sim, "0").input_quantizers[0])  # the model input
    assert torch.equal(no_grad_forward(sub(sim, "0"), x), F.linear(xq, wq, sub(sim, "0").bias.detach()))


def test_block_size_that_does_not_divide_names_the_layer():
    cfg = with_defaults(module_name={"2": {"params": {"weight": {"block_size": 5}}}})
    with pytest.raises(ValueError, match=r"2\.weight.*block_size 5.*16"):
        QuantizationSimModel(mlp(), randn(2, 8), config_file=cfg)


def test_strict_symmetric():
    cfg = with_defaults(defaults={**BUILTIN_DEFAULT["defaults"], "strict_symmetric": True})
    sim = calibrated(mlp(), randn(32, 8), config_file=cfg)
    q = sub(sim, "0").param_quantizers["weight"]
    assert (q.qmin, q.qmax, q.symmetric) == (-127, 127, True)
    assert torch.equal(q.get_offset(), torch.zeros_like(q.get_offset()))
    wq = qd(sub(sim, "0").weight, q)
    assert bool(((wq / q.get_scale().detach()).round() >= -127).all())
    assert sub(sim, "1").output_quantizers[0].qmin == 0  # asymmetric activations are not affected


@pytest.mark.parametrize("bw, dtype", [(16, torch.float16), (8, torch.float8_e4m3fn)], ids=["fp16", "fp8"])
def test_float_dtype_on_parameter_free_model(bw, dtype):
    model = nn.Sequential(nn.Tanh(), nn.Sigmoid())
    cfg = with_defaults(op_type={"Sigmoid": {"dtype": "float", "bitwidth": bw}})
    x = randn(64, 8) * 3
    sim = calibrated(model, x, config_file=cfg)
    q = sub(sim, "1").output_quantizers[0]
    assert isinstance(q, FloatQuantizeDequantize) and q.format.torch_dtype is dtype
    assert isinstance(sub(sim, "0").output_quantizers[0], QuantizeDequantize)
    y = no_grad_forward(sim.model, x)
    h = qd(torch.tanh(qd(x, sub(sim, "0").input_quantizers[0])), sub(sim, "0").output_quantizers[0])
    scale = q.get_scale()
    assert torch.equal(y, (torch.sigmoid(h) / scale).to(dtype).float() * scale)


def test_float_dtype_on_model_with_parameters():
    cfg = with_defaults(op_type={"Gemm": {"dtype": "float", "bitwidth": 16,
                                          "params": {"weight": {"dtype": "float", "bitwidth": 8}}}})
    x = randn(32, 8)
    model = mlp()
    sim = calibrated(model, x, config_file=cfg)
    w0 = sub(sim, "0").param_quantizers["weight"]
    assert isinstance(w0, FloatQuantizeDequantize) and w0.format.torch_dtype is torch.float8_e4m3fn
    assert w0.shape == (16, 1)
    out = sub(sim, "2").output_quantizers[0]
    assert isinstance(out, FloatQuantizeDequantize) and out.format.torch_dtype is torch.float16
    assert isinstance(sub(sim, "1").output_quantizers[0], QuantizeDequantize)  # ReLU: still int
    # the weight scale is per output channel: max |w| of the row maps to the fp8 maximum (448)
    assert torch.allclose(w0.get_scale().squeeze(1), model[0].weight.detach().abs().amax(1) / 448)
    s0 = w0.get_scale()
    wq = (model[0].weight.detach() / s0).to(torch.float8_e4m3fn).float() * s0
    with torch.no_grad():
        xq = sub(sim, "0").input_quantizers[0](x).as_subclass(torch.Tensor)  # the model input, float16
    assert torch.equal(no_grad_forward(sub(sim, "0"), x), F.linear(xq, wq, model[0].bias.detach()))


def test_float_bitwidth_other_than_8_or_16_is_rejected():
    with pytest.raises(ValueError, match="8.*16"):
        QuantizationSimModel(nn.Sequential(nn.Tanh()), randn(2, 4), default_data_type=float, default_output_bw=4)


def test_model_input_quantized_turns_on_the_first_input_quantizer():
    cfg = with_defaults(model_input={"is_input_quantized": True})
    x = randn(32, 8)
    sim = calibrated(mlp(), x, config_file=cfg)
    q = sub(sim, "0").input_quantizers[0]
    assert isinstance(q, QuantizeDequantize) and q.is_initialized()
    assert sub(sim, "2").input_quantizers[0] is None
    seen = {}
    handle = sub(sim, "0").register_forward_hook(lambda m, a, out: seen.update(out=out))
    try:
        no_grad_forward(sim.model, x)
    finally:
        handle.remove()
    ref = F.linear(qd(x, q), qd(sub(sim, "0").weight, sub(sim, "0").param_quantizers["weight"]), sub(sim, "0").bias)
    assert torch.equal(seen["out"], ref.detach())


def test_model_input_quantized_with_concat_of_inputs():
    cfg = with_defaults(model_input={"is_input_quantized": True})
    a, b = randn(16, 3, seed=1), randn(16, 4, seed=2)
    sim = sim_of(TwoIn(), (a, b), config_file=cfg)
    sim.compute_encodings([(a, b)], progress=False)
    assert torch.isfinite(no_grad_forward(sim.model, a, b)).all()


def test_default_bitwidths_where_the_config_gives_none():
    cfg = with_defaults(module_name={"2": {"params": {"weight": {"bitwidth": 2}}}})
    sim = sim_of(mlp(), randn(2, 8), config_file=cfg, default_param_bw=4, default_output_bw=6)
    assert (sub(sim, "0").param_quantizers["weight"].qmin, sub(sim, "0").param_quantizers["weight"].qmax) == (-8, 7)
    assert (sub(sim, "2").param_quantizers["weight"].qmin, sub(sim, "2").param_quantizers["weight"].qmax) == (-2, 1)
    for name in ("1", "2"):
        q = sub(sim, name).output_quantizers[0]
        assert (q.qmin, q.qmax) == (0, 63)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_config_files(tmp_path, suffix):
    cfg = with_defaults(op_type={"Gemm": {"params": {"weight": {"bitwidth": 4, "per_channel_quantization": False}}}},
                        module_name={"1": {"is_output_quantized": False}})
    path = tmp_path / f"cfg{suffix}"
    if suffix == ".json":
        path.write_text(json.dumps(cfg))
    else:
        yaml = pytest.importorskip("yaml")
        path.write_text(yaml.safe_dump(cfg))
    from_file = sim_of(mlp(), randn(2, 8), config_file=str(path))
    from_dict = sim_of(mlp(), randn(2, 8), config_file=cfg)
    assert _layout(from_file) == _layout(from_dict)
    q = sub(from_file, "0").param_quantizers["weight"]
    assert (q.shape, q.qmin, q.qmax) == ((), -8, 7)
    assert sub(from_file, "1").output_quantizers[0] is None


# -- quant schemes -------------------------------------------------------------------------------------
SCHEMES = ["min_max", "percentile", "sqnr", "range_learning_min_max", "range_learning_sqnr", "post_training_tf",
           "tf_enhanced", QuantScheme.RANGE_LEARNING_SQNR]


@pytest.mark.parametrize("scheme", SCHEMES, ids=str)
def test_quant_schemes_calibrate(scheme):
    model = mlp()
    x = randn(256, 8)
    sim = calibrated(model, x, quant_scheme=scheme)
    parsed = QuantScheme.parse(scheme)
    assert sim.quant_scheme is parsed
    for name, q in sim.named_quantizers():
        assert q.is_initialized(), name
        learns = parsed.learns_ranges  # params follow: min_max init, learned under range learning (AIMET)
        assert q.min.requires_grad is learns and q.max.requires_grad is learns, name
    y = no_grad_forward(sim.model, x)
    assert torch.isfinite(y).all()
    assert sqnr_db(no_grad_forward(model, x), y) > 25


def test_range_learning_ranges_get_gradients():
    sim = calibrated(mlp(), randn(64, 8), quant_scheme="training_range_learning_with_tf_init",
                     param_quant_scheme="range_learning_min_max")
    sim.model.train()
    sim.model(randn(64, 8, seed=3)).pow(2).sum().backward()
    for name, q in sim.named_quantizers():
        assert q.max.grad is not None and torch.isfinite(q.max.grad).all(), name
    assert sub(sim, "2").output_quantizers[0].max.grad.abs().sum() > 0


def test_set_percentile_value_changes_the_encoding():
    x = torch.cat([randn(2000, 8), torch.full((1, 8), 40.0)])  # one outlier row
    model = nn.Sequential(nn.Identity(), nn.ReLU())
    sim = calibrated(model, x, quant_scheme="percentile")
    q = sub(sim, "1").output_quantizers[0]
    high = float(q.max)
    assert high > 5  # 99.99th percentile still reaches into the outlier
    sim.set_percentile_value(90)
    sim.compute_encodings([x], progress=False)
    low = float(q.max)
    assert 0.5 < low < 2.5 and low < high  # ~90th percentile of a half-normal: 1.64
    sim.set_percentile_value(100)
    sim.compute_encodings([x], progress=False)
    assert float(q.max) == pytest.approx(40.0, rel=0.02)


@pytest.mark.parametrize("value", [49.9, 100.5, -1, True, "99", None], ids=str)
def test_set_percentile_value_validates(value):
    sim = sim_of(mlp(), randn(2, 8), quant_scheme="percentile")
    with pytest.raises(ValueError, match="percentile"):
        sim.set_percentile_value(value)


# -- compute_encodings --------------------------------------------------------------------------------
BATCHES = [randn(32, 8, seed=s) * (1 + s) for s in range(3)]


def test_three_callback_forms_give_identical_encodings():
    sims = [sim_of(mlp(), BATCHES[0]) for _ in range(3)]
    sims[0].compute_encodings(lambda m: [m(b) for b in BATCHES], progress=False)
    sims[1].compute_encodings(lambda m, data: [m(b) for b in data], BATCHES, progress=False)
    sims[2].compute_encodings(BATCHES, progress=False)
    assert_same_encodings(sims[0], sims[1])
    assert_same_encodings(sims[0], sims[2])
    # and the statistics span every batch: the output range covers the largest batch (calibration runs the
    # activations in float, the weights quantized)
    q, l0 = sub(sims[0], "1").output_quantizers[0], sub(sims[0], "0")
    h = F.linear(BATCHES[2], qd(l0.weight, l0.param_quantizers["weight"]), l0.bias.detach())
    assert float(q.max) == pytest.approx(float(F.relu(h).max()), rel=1e-6)


def test_tuple_batches_for_two_inputs():
    data = [(randn(8, 3, seed=s), randn(8, 4, seed=10 + s)) for s in range(3)]
    model = TwoIn()
    a = sim_of(model, data[0])
    b = sim_of(model, data[0])
    a.compute_encodings(data, progress=False)
    b.compute_encodings(lambda m: [m(x, y) for x, y in data], progress=False)
    assert_same_encodings(a, b)


def test_modes_restored_and_no_autograd_graph():
    torch.manual_seed(0)
    sim = sim_of(SmallCNN(), randn(2, 3, 16, 16))
    sim.model.train()
    sub(sim, "bn1").eval()  # mixed modes come back as they were
    modes = {n: m.training for n, m in sim.model.named_modules()}
    seen = []

    def callback(model):
        y = model(randn(4, 3, 16, 16))
        seen.append((model.training, sub(sim, "bn2").training, torch.is_grad_enabled(), y.requires_grad))

    sim.compute_encodings(callback, progress=False)
    assert seen == [(False, False, False, False)]
    assert {n: m.training for n, m in sim.model.named_modules()} == modes


def test_failing_callback_restores_mode_and_keeps_encodings():
    x = randn(32, 8)
    sim = calibrated(mlp(), x)
    sim.model.train()
    before = quantizer_values(sim)

    def boom(model):
        model(x * 10)
        raise KeyError("stop")

    with pytest.raises(KeyError, match="stop"):
        sim.compute_encodings(boom, progress=False)
    assert sim.model.training
    assert_same_values(quantizer_values(sim), before)


@pytest.mark.parametrize("callback, args", [
    ([randn(2, 8)], 5),
    (iter([randn(2, 8)]), None),
], ids=["list_with_args", "iterator_with_args"])
def test_callback_args_need_a_callable(callback, args):
    sim = sim_of(mlp(), randn(2, 8))
    with pytest.raises(TypeError, match="forward_pass_callback_args"):
        sim.compute_encodings(callback, args, progress=False)


@pytest.mark.parametrize("callback", [randn(2, 8), nn.Linear(8, 8), 5, "batches"], ids=["tensor", "module", "int",
                                                                                      "str"])
def test_callback_of_the_wrong_kind(callback):
    sim = sim_of(mlp(), randn(2, 8))
    with pytest.raises(TypeError, match="forward_pass_callback"):
        sim.compute_encodings(callback, progress=False)


def test_callback_args_none_is_passed():
    sim = sim_of(mlp(), randn(2, 8))
    got = []
    sim.compute_encodings(lambda m, a: got.append(a) or m(randn(4, 8)), None, progress=False)
    assert got == [None]


class Branchy(nn.Module):
    """Data-independent branch chosen by a flag: with trace=False one branch sees no input."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.use_b = False

    def forward(self, x):
        return self.b(x) if self.use_b else self.a(x)


def _runtime_warnings(sim, data) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim.compute_encodings(data, progress=False)
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


def test_unseen_quantizers_are_named_in_a_warning():
    sim = sim_of(Branchy(), randn(2, 4), trace=False)
    messages = _runtime_warnings(sim, [randn(8, 4)])
    named = [m for m in messages if "b.output_quantizers.0" in m and "b.param_quantizers.weight" in m]
    assert len(named) == 1
    assert "a.output_quantizers.0" not in named[0]
    assert not sub(sim, "b").output_quantizers[0].is_initialized()
    assert sub(sim, "a").output_quantizers[0].is_initialized()


def test_unseen_quantizers_give_exactly_one_warning():
    sim = sim_of(Branchy(), randn(2, 4), trace=False)
    messages = _runtime_warnings(sim, [randn(8, 4)])
    assert len(messages) == 1, messages
    assert "2 quantizers saw no input" in messages[0]


def test_unseen_quantizers_named_on_recalibration():
    sim = sim_of(Branchy(), randn(2, 4), trace=False)
    for use_b in (False, True):  # every quantizer initialised
        sim.model.use_b = use_b
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            sim.compute_encodings([randn(8, 4)], progress=False)
    assert all(q.is_initialized() for _, q in sim.named_quantizers())
    sim.model.use_b = False
    messages = _runtime_warnings(sim, [randn(8, 4)])
    assert any("b.output_quantizers.0" in m for m in messages), messages


# -- progress --------------------------------------------------------------------------------------
class FakeTqdm:
    instances: list["FakeTqdm"] = []

    def __init__(self, total=None, desc=None, unit=None, leave=None) -> None:
        self.total, self.desc, self.n, self.closed = total, desc, 0, False
        FakeTqdm.instances.append(self)

    def update(self, k: int) -> None:
        self.n += k

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_tqdm(monkeypatch):
    pkg = types.ModuleType("tqdm")
    pkg.__spec__ = importlib.machinery.ModuleSpec("tqdm", None)
    pkg.__path__ = []
    auto = types.ModuleType("tqdm.auto")
    auto.tqdm = FakeTqdm
    pkg.auto = auto
    monkeypatch.setitem(sys.modules, "tqdm", pkg)
    monkeypatch.setitem(sys.modules, "tqdm.auto", auto)
    FakeTqdm.instances = []
    return FakeTqdm


@pytest.fixture
def no_progress_libraries(monkeypatch):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        return None if name.split(".")[0] in ("tqdm", "rich") else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_progress_with_tqdm_advances_once_per_forward(fake_tqdm):
    sim = sim_of(mlp(), BATCHES[0])
    sim.compute_encodings(BATCHES, progress=True)
    (bar,) = fake_tqdm.instances
    assert (bar.total, bar.n, bar.closed) == (3, 3, True)
    sim.compute_encodings(lambda m: [m(b) for b in BATCHES * 2], progress=True, total=6)
    assert (fake_tqdm.instances[1].total, fake_tqdm.instances[1].n) == (6, 6)


def test_progress_with_the_real_tqdm():
    pytest.importorskip("tqdm")
    a, b = sim_of(mlp(), BATCHES[0]), sim_of(mlp(), BATCHES[0])
    a.compute_encodings(BATCHES, progress=True)
    b.compute_encodings(BATCHES, progress=False)
    assert_same_encodings(a, b)


def test_progress_without_tqdm_or_rich(no_progress_libraries):
    a, b = sim_of(mlp(), BATCHES[0]), sim_of(mlp(), BATCHES[0])
    a.compute_encodings(BATCHES, progress=True)
    b.compute_encodings(BATCHES, progress=False)
    assert_same_encodings(a, b)


def test_progress_false_does_not_create_a_bar(fake_tqdm):
    sim_of(mlp(), BATCHES[0]).compute_encodings(BATCHES, progress=False)
    assert fake_tqdm.instances == []


def test_progress_bar_counts_model_forward_calls():
    model = mlp()
    with progress_bar(model, None, enabled=False) as bar:
        for _ in range(3):
            model(randn(2, 8))
        model[0](randn(2, 8))  # a submodule call is not a model forward
    assert bar.count == 3
    model(randn(2, 8))
    assert bar.count == 3  # the hook is removed on exit
    assert not model._forward_pre_hooks


# -- fake-quantized forward against a hand-computed reference ----------------------------------------------
def test_w8a8_forward_matches_functional_reference():
    model = mlp()
    x = randn(64, 8)
    sim = calibrated(model, x)
    xt = randn(32, 8, seed=5) * 2  # beyond the calibrated range: clamping is exercised too
    l0, r1, l2 = sub(sim, "0"), sub(sim, "1"), sub(sim, "2")
    with torch.no_grad():
        h = F.relu(F.linear(qd(xt, l0.input_quantizers[0]), qd(model[0].weight, l0.param_quantizers["weight"]),
                            model[0].bias))
        h = qd(h, r1.output_quantizers[0])
        y = qd(F.linear(h, qd(model[2].weight, l2.param_quantizers["weight"]), model[2].bias), l2.output_quantizers[0])
        out = sim.model(xt)
    assert torch.equal(out, y)
    out_grad = sim.model(xt)  # autograd on: no weight cache, same numbers
    assert torch.equal(out_grad.detach(), y)
    assert not torch.equal(out, no_grad_forward(model, xt))


# -- quantizer names and state -------------------------------------------------------------------------
def test_named_quantizers():
    sim = sim_of(mlp(), randn(2, 8))
    assert [n for n, _ in sim.named_quantizers()] == [
        "0.input_quantizers.0", "0.param_quantizers.weight", "1.output_quantizers.0", "2.output_quantizers.0",
        "2.param_quantizers.weight"]
    for name, q in sim.named_quantizers():
        assert sim.model.get_submodule(name) is q


def test_quantizer_state_dict_holds_only_quantizer_entries():
    sim = calibrated(mlp(), randn(32, 8))
    sd = sim.quantizer_state_dict()
    expected = {f"{n}.{k}" for n, q in sim.named_quantizers() for k in q.state_dict()}
    assert set(sd) == expected
    assert {"0.param_quantizers.weight.min", "1.output_quantizers.0.max",
            "2.param_quantizers.weight._initialized"} <= set(sd)
    assert not any(k in sd for k in ("0.weight", "0.bias", "2.weight"))


def test_quantizer_state_dict_round_trip():
    x = randn(32, 8)
    sim = calibrated(mlp(), x)
    fresh = sim_of(mlp(), x)
    with pytest.raises(RuntimeError, match="compute_encodings"):
        no_grad_forward(fresh.model, x)  # uncalibrated quantizers refuse to run
    fresh.load_quantizer_state_dict(sim.quantizer_state_dict())
    assert torch.equal(no_grad_forward(fresh.model, x), no_grad_forward(sim.model, x))
    assert_same_encodings(fresh, sim)


def test_quantizer_state_dict_strict_mismatch():
    sim = calibrated(mlp(), randn(32, 8))
    sd = sim.quantizer_state_dict()
    missing = dict(sd)
    del missing["1.output_quantizers.0.max"]
    before = quantizer_values(sim)
    with pytest.raises(ValueError, match=r"missing 1\.output_quantizers\.0\.max"):
        sim.load_quantizer_state_dict(missing)
    extra = {**sd, "3.output_quantizers.0.min": torch.tensor(0.0)}
    with pytest.raises(ValueError, match=r"unexpected 3\.output_quantizers\.0\.min"):
        sim.load_quantizer_state_dict(extra)
    assert_same_values(quantizer_values(sim), before)
    with pytest.raises(TypeError):
        sim.load_quantizer_state_dict([("a", torch.tensor(0.0))])


def test_quantizer_state_dict_non_strict_loads_the_rest():
    x = randn(32, 8)
    src = calibrated(mlp(), x * 3)
    dst = calibrated(mlp(), x)
    sd = {**src.quantizer_state_dict(), "ghost.min": torch.tensor(1.0)}
    dst.load_quantizer_state_dict(sd, strict=False)
    assert_same_encodings(dst, src)


# -- save_encodings / load_encodings --------------------------------------------------------------------
def _round_trip(tmp_path, make, data, **kwargs):
    sim = calibrated(make(), data, **kwargs)
    path = tmp_path / "enc.json"
    sim.save_encodings(path)
    fresh = sim_of(make(), data, **kwargs)
    fresh.load_encodings(path)
    assert_same_encodings(fresh, sim)
    x = data * 1.5 + 0.1
    assert torch.equal(no_grad_forward(fresh.model, x), no_grad_forward(sim.model, x))
    return sim, json.loads(path.read_text())


def test_save_load_round_trip(tmp_path):
    sim, doc = _round_trip(tmp_path, mlp, randn(64, 8))
    assert doc["format"] == "quanta.quantsim.encodings" and doc["version"] == 1
    assert list(doc["quantizers"]) == [n for n, _ in sim.named_quantizers()]
    entry = doc["quantizers"]["0.param_quantizers.weight"]
    assert (entry["type"], entry["shape"], entry["qmin"], entry["qmax"]) == ("affine", [16, 1], -128, 127)


def test_save_load_round_trip_per_block(tmp_path):
    cfg = with_defaults(op_type={"Gemm": {"params": {"weight": {"block_size": 4}}}})
    _, doc = _round_trip(tmp_path, mlp, randn(64, 8), config_file=cfg)
    entry = doc["quantizers"]["0.param_quantizers.weight"]
    assert entry["shape"] == [16, 2] and entry["block_size"] == [1, 4]


@pytest.mark.parametrize("bw", [8, 16])
def test_save_load_round_trip_float(tmp_path, bw):
    _, doc = _round_trip(tmp_path, mlp, randn(64, 8) * 3, default_data_type=float, default_param_bw=bw,
                         default_output_bw=bw)
    entry = doc["quantizers"]["0.param_quantizers.weight"]
    assert entry["type"] == "float" and entry["shape"] == [16, 1]
    assert (entry["exponent_bits"], entry["mantissa_bits"]) == ((4, 3) if bw == 8 else (5, 10))


def test_save_load_round_trip_transformer(tmp_path):
    x, _ = make_seq_data(4, seq=6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the div float op
        sim = QuantizationSimModel(TransformerBlock(), x)
        sim.compute_encodings([x], progress=False)
        sim.save_encodings(tmp_path / "t.json")
        fresh = QuantizationSimModel(TransformerBlock(), x)
    fresh.model.load_state_dict({k: v for k, v in sim.model.state_dict().items() if "quantizers" not in k},
                                strict=False)
    fresh.load_encodings(str(tmp_path / "t.json"), partial=False)
    assert torch.equal(no_grad_forward(fresh.model, x), no_grad_forward(sim.model, x))


def _doc(sim: QuantizationSimModel) -> dict:
    entries = {n: {"type": "affine", **e.to_dict()} for n, e in sim.get_encodings().items()}
    return {"format": "quanta.quantsim.encodings", "version": 1, "quantizers": entries}


def _move_last(doc: dict, name: str) -> dict:
    entries = doc["quantizers"]
    entries[name] = entries.pop(name)
    return doc


LAST = "2.param_quantizers.weight"


def _set(name, key, value):
    def corrupt(doc):
        doc["quantizers"][name][key] = value
        return _move_last(doc, name)
    return corrupt


def _drop_key(name, key):
    def corrupt(doc):
        del doc["quantizers"][name][key]
        return _move_last(doc, name)
    return corrupt


def _replace_entry(name, value):
    def corrupt(doc):
        doc["quantizers"][name] = value
        return _move_last(doc, name)
    return corrupt


def _unknown(doc):
    doc["quantizers"]["3.output_quantizers.0"] = dict(doc["quantizers"]["1.output_quantizers.0"])
    return doc


def _shape_mismatch(doc):
    e = doc["quantizers"][LAST]
    e["scale"], e["offset"], e["shape"] = e["scale"][:2], e["offset"][:2], [2, 1]
    return _move_last(doc, LAST)


CORRUPTIONS = [
    # without quanta's format key the file is read as an AIMET file, whose reader rejects version 1
    ("format", lambda d: {**d, "format": "aimet"}, ("format", "version"), {}),
    ("no_format", lambda d: {k: v for k, v in d.items() if k != "format"}, ("format", "version"), {}),
    ("version", lambda d: {**d, "version": 2}, "version", {}),
    ("quantizers_list", lambda d: {**d, "quantizers": []}, "quantizers", {}),
    ("entry_not_mapping", _replace_entry(LAST, ["not", "a", "mapping"]), LAST, {}),
    ("bad_type", _set(LAST, "type", "lut"), LAST, {}),
    ("scale_not_numbers", _set(LAST, "scale", "big"), LAST, {}),
    ("missing_scale", _drop_key(LAST, "scale"), LAST, {}),
    ("missing_qmax", _drop_key(LAST, "qmax"), LAST, {}),
    ("missing_type", _drop_key(LAST, "type"), LAST, {}),
    ("negative_scale", _set("2.output_quantizers.0", "scale", -0.1), "2.output_quantizers.0", {}),
    ("zero_scale", _set("2.output_quantizers.0", "scale", 0.0), "2.output_quantizers.0", {}),
    ("nan_scale", _set("2.output_quantizers.0", "scale", float("nan")), "2.output_quantizers.0", {}),
    ("inf_scale", _set("2.output_quantizers.0", "scale", float("inf")), "2.output_quantizers.0", {}),
    ("shape_mismatch", _shape_mismatch, LAST, {}),
    ("grid_mismatch", _set(LAST, "qmin", -8), LAST, {}),
    ("unknown_name_strict", _unknown, "3.output_quantizers.0", {}),
    ("partial_false_missing", lambda d: {**d, "quantizers": {k: v for k, v in d["quantizers"].items() if k != LAST}},
     LAST, {"partial": False}),
]


@pytest.mark.parametrize("corrupt, text, kwargs", [c[1:] for c in CORRUPTIONS], ids=[c[0] for c in CORRUPTIONS])
def test_malformed_encodings_raise_and_change_nothing(tmp_path, corrupt, text, kwargs):
    x = randn(64, 8)
    source = calibrated(mlp(), x * 3)
    target = calibrated(mlp(), x)
    before = quantizer_values(target)
    doc = corrupt(copy.deepcopy(_doc(source)))
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))  # NaN/inf are written as JSON's NaN/Infinity tokens
    with pytest.raises(ValueError) as info:
        target.load_encodings(path, **kwargs)
    assert any(t in str(info.value) for t in ((text,) if isinstance(text, str) else text)), str(info.value)
    assert_same_values(quantizer_values(target), before)


OFFSET_BUGS = [
    ("nan_offset", _set("1.output_quantizers.0", "offset", float("nan")), "1.output_quantizers.0"),
    ("asymmetric_offset_for_symmetric", _set(LAST, "offset", [[5.0]] * 4), LAST),
]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("corrupt, text", [c[1:] for c in OFFSET_BUGS], ids=[c[0] for c in OFFSET_BUGS])
def test_bad_offsets_raise_naming_the_entry_and_change_nothing(tmp_path, corrupt, text):
    x = randn(64, 8)
    source = calibrated(mlp(), x * 3)
    target = calibrated(mlp(), x)
    before = quantizer_values(target)
    doc = corrupt(copy.deepcopy(_doc(source)))
    with pytest.raises(ValueError) as info:
        target.load_encodings(doc)
    assert_same_values(quantizer_values(target), before)
    assert text in str(info.value)


def test_bad_json_file(tmp_path):
    target = calibrated(mlp(), randn(64, 8))
    before = quantizer_values(target)
    path = tmp_path / "bad.json"
    path.write_text('{"format": "quanta.quantsim.encodings", "version": 1, "quantizers": {')
    with pytest.raises(ValueError, match="bad.json"):
        target.load_encodings(path)
    assert_same_values(quantizer_values(target), before)


def test_missing_encodings_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="absent.json"):
        sim_of(mlp(), randn(2, 8)).load_encodings(tmp_path / "absent.json")


def test_encodings_of_the_wrong_kind():
    with pytest.raises(TypeError):
        sim_of(mlp(), randn(2, 8)).load_encodings(42)


def test_float_encoding_for_an_affine_quantizer(tmp_path):
    target = calibrated(mlp(), randn(64, 8))
    doc = _doc(target)
    doc["quantizers"]["1.output_quantizers.0"] = {"type": "float", "scale": 0.01, "shape": [], "exponent_bits": 4,
                                                  "mantissa_bits": 3, "special": "fn", "block_size": None}
    with pytest.raises(ValueError, match=r"1\.output_quantizers\.0"):
        target.load_encodings(doc)


def _float_sims(bw_target: int = 8):
    make = lambda: nn.Sequential(nn.Tanh(), nn.Sigmoid())  # noqa: E731
    x = randn(64, 8) * 3
    source = calibrated(make(), x, default_data_type=float)
    target = calibrated(make(), x * 2, default_data_type=float, default_output_bw=bw_target)
    doc = {"format": "quanta.quantsim.encodings", "version": 1,
           "quantizers": {n: {"type": "float", **e.to_dict()} for n, e in source.get_encodings().items()}}
    return target, doc


def test_float_shape_mismatch_is_a_value_error():
    target, doc = _float_sims()
    entry = doc["quantizers"]["1.output_quantizers.0"]
    entry["scale"], entry["shape"] = [0.01, 0.02], [2]
    with pytest.raises(ValueError, match=r"1\.output_quantizers\.0"):
        target.load_encodings(doc)


def test_float_format_mismatch_is_rejected():
    target, doc = _float_sims(bw_target=16)
    before = quantizer_values(target)
    with pytest.raises(ValueError, match=r"0\.input_quantizers\.0"):  # the first float quantizer named
        target.load_encodings(doc)
    assert_same_values(quantizer_values(target), before)


def test_unknown_names_with_strict_false_are_ignored():
    x = randn(64, 8)
    source, target = calibrated(mlp(), x * 3), calibrated(mlp(), x)
    doc = _unknown(_doc(source))
    target.load_encodings(doc, strict=False)
    assert_same_encodings(target, source)


def test_partial_load_keeps_the_other_encodings():
    x = randn(64, 8)
    source, target = calibrated(mlp(), x * 3), calibrated(mlp(), x)
    kept = target.get_encodings()["2.output_quantizers.0"]
    doc = _doc(source)
    del doc["quantizers"]["2.output_quantizers.0"]
    target.load_encodings(doc)
    enc = target.get_encodings()
    assert enc["2.output_quantizers.0"] == kept
    assert enc["1.output_quantizers.0"] == source.get_encodings()["1.output_quantizers.0"]


@pytest.mark.parametrize("flag", [True, False])
def test_load_sets_requires_grad(flag):
    x = randn(64, 8)
    source = calibrated(mlp(), x)
    target = sim_of(mlp(), x, quant_scheme="range_learning_min_max" if not flag else "min_max")
    target.load_encodings(_doc(source), requires_grad=flag)
    for name, q in target.named_quantizers():
        assert q.min.requires_grad is flag and q.max.requires_grad is flag, name


def test_load_sets_allow_overwrite():
    x = randn(64, 8)
    source = calibrated(mlp(), x)
    target = sim_of(mlp(), x)
    target.load_encodings(_doc(source), allow_overwrite=False)
    target.compute_encodings([x * 5], progress=False)  # frozen: ignored
    assert_same_encodings(target, source)
    target.load_encodings(_doc(source), allow_overwrite=True)
    target.compute_encodings([x * 5], progress=False)
    assert target.get_encodings()["1.output_quantizers.0"] != source.get_encodings()["1.output_quantizers.0"]


def test_failed_save_leaves_existing_file(tmp_path, monkeypatch):
    sim = calibrated(mlp(), randn(64, 8))
    path = tmp_path / "enc.json"
    path.write_text("previous")

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(json, "dumps", boom)
    with pytest.raises(OSError, match="disk full"):
        sim.save_encodings(path)
    monkeypatch.undo()
    assert path.read_text() == "previous"

    monkeypatch.setattr(os, "replace", boom)  # the write succeeded, the final rename fails
    with pytest.raises(OSError, match="disk full"):
        sim.save_encodings(path)
    monkeypatch.undo()
    assert path.read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["enc.json"]  # no temporary file left behind


def test_save_closes_its_file(tmp_path):
    sim = calibrated(mlp(), randn(64, 8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim.save_encodings(tmp_path / "enc.json")
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert json.loads((tmp_path / "enc.json").read_text())["version"] == 1


# -- fold_param_quantizers ------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["mlp", "cnn"])
def test_fold_param_quantizers(which):
    if which == "mlp":
        model, x = mlp(), randn(64, 8)
    else:
        torch.manual_seed(0)
        model, x = SmallCNN(), make_cnn_data(8)[0]
    sim = calibrated(model, x)
    weight_quantizers = {name: copy.deepcopy(m.param_quantizers["weight"]) for name, m in sim.quantized_modules()
                         if "weight" in m.param_quantizers and m.param_quantizers["weight"] is not None}
    assert weight_quantizers
    before = no_grad_forward(sim.model, x)
    sim.fold_param_quantizers()
    for name, m in sim.quantized_modules():
        assert all(q is None for q in m.param_quantizers.values()), name
    assert torch.equal(no_grad_forward(sim.model, x), before)
    for name, q in weight_quantizers.items():
        w = sub(sim, name).weight.detach()
        codes = w / q.get_scale().detach()
        assert torch.allclose(codes, codes.round(), atol=1e-3), name
        assert codes.round().min() >= q.qmin and codes.round().max() <= q.qmax
        assert torch.equal(qd(w, q), w), name  # on the grid: fake quantization changes nothing
    assert not torch.equal(sub(sim, next(iter(weight_quantizers))).weight, model.get_submodule(
        next(iter(weight_quantizers))).weight)  # the original keeps its float weights


def test_fold_uninitialised_raises():
    sim = sim_of(mlp(), randn(2, 8))
    with pytest.raises(RuntimeError, match=r"0\.param_quantizers\.weight.*compute_encodings"):
        sim.fold_param_quantizers()


# -- quantizers_disabled --------------------------------------------------------------------------------
def test_quantizers_disabled_is_the_float_model():
    torch.manual_seed(0)
    model = TransformerBlock()
    x, _ = make_seq_data(4, seq=6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sim = QuantizationSimModel(model, x)
    sim.compute_encodings([x], progress=False)
    quantized = no_grad_forward(sim.model, x)
    float_out = no_grad_forward(model, x)
    assert not torch.equal(quantized, float_out)
    with sim.quantizers_disabled():
        assert torch.equal(no_grad_forward(sim.model, x), float_out)
        assert list(sim.named_quantizers()) == []
    assert torch.equal(no_grad_forward(sim.model, x), quantized)


def test_quantizers_disabled_restores_after_an_exception():
    x = randn(32, 8)
    sim = calibrated(mlp(), x)
    names = [n for n, _ in sim.named_quantizers()]
    quantized = no_grad_forward(sim.model, x)
    with pytest.raises(ZeroDivisionError):
        with sim.quantizers_disabled():
            assert list(sim.named_quantizers()) == []
            1 / 0
    assert [n for n, _ in sim.named_quantizers()] == names
    assert torch.equal(no_grad_forward(sim.model, x), quantized)


# -- compute_encodings_sequential --------------------------------------------------------------------
# Sequential calibration runs each op on quantized inputs, compute_encodings (as AIMET) on float ones: they agree
# where an op's inputs are the same either way, so these tests leave the model inputs unquantized.
UNQUANTIZED_INPUTS = with_defaults(model_input={"is_input_quantized": False})


def test_sequential_equals_parallel_with_one_quantized_layer():
    model = nn.Sequential(nn.Linear(8, 8))
    batches = [randn(16, 8, seed=s) * (s + 1) for s in range(3)]
    par = sim_of(model, batches[0], config_file=UNQUANTIZED_INPUTS)
    seq = sim_of(model, batches[0], config_file=UNQUANTIZED_INPUTS)
    par.compute_encodings(batches, progress=False)
    seq.compute_encodings_sequential(batches, progress=False)
    assert_same_encodings(seq, par)


def test_sequential_on_a_chain():
    model = deep_mlp(4)
    batches = [randn(32, 16, seed=s) for s in range(4)]
    par = sim_of(model, batches[0], config_file=UNQUANTIZED_INPUTS)
    seq = sim_of(model, batches[0], config_file=UNQUANTIZED_INPUTS)
    par.compute_encodings(batches, progress=False)
    seq.compute_encodings_sequential(batches, progress=False)
    assert all(q.is_initialized() for _, q in seq.named_quantizers())
    # the first layer sees the same data either way
    assert seq.get_encodings()["0.output_quantizers.0"] == par.get_encodings()["0.output_quantizers.0"]
    x = randn(64, 16, seed=99)
    ref = no_grad_forward(model, x)
    s_par, s_seq = sqnr_db(ref, no_grad_forward(par.model, x)), sqnr_db(ref, no_grad_forward(seq.model, x))
    assert s_seq > 30 and abs(s_seq - s_par) < 1.0


def test_sequential_two_inputs_and_mode():
    data = [(randn(8, 3, seed=s), randn(8, 4, seed=10 + s)) for s in range(2)]
    model = TwoIn()
    seq = sim_of(model, data[0], config_file=UNQUANTIZED_INPUTS)
    seq.model.train()
    seq.compute_encodings_sequential(data, progress=False)
    assert seq.model.training and all(m.training for m in seq.model.modules())
    par = sim_of(model, data[0], config_file=UNQUANTIZED_INPUTS)
    par.compute_encodings(data, progress=False)
    # a concat's output quantizer quantizes what it joins too (here the model inputs, one encoding for all)
    cat = sub(seq, "cat")
    assert cat.output_quantizers[0] is cat.input_quantizers[0] is cat.input_quantizers[1]
    assert cat.output_quantizers[0].is_initialized() and sub(par, "cat").output_quantizers[0].is_initialized()
    assert all(q.is_initialized() for _, q in seq.named_quantizers())


def test_sequential_holds_few_live_values(monkeypatch):
    model = deep_mlp(6)
    sim = sim_of(model, randn(2, 16))
    n_nodes = len(list(sim._prepared.graph.nodes))
    sizes = []
    real = calibrate_mod.run_node

    def spy(root, node, env):
        sizes.append(len(env))
        return real(root, node, env)

    monkeypatch.setattr(calibrate_mod, "run_node", spy)
    sim.compute_encodings_sequential([randn(8, 16, seed=s) for s in range(3)], progress=False)
    assert n_nodes >= 14 and len(sizes) > n_nodes
    assert max(sizes) <= 2  # a chain: one activation alive at a time, not the whole forward


def test_sequential_shared_module_sees_every_call_site():
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.act = nn.Tanh()  # (a ReLU would share its output quantizer with its input, the model input)

        def forward(self, x, y):
            return self.act(x), self.act(y)

    data = [(randn(16, 8, seed=1) * 5, randn(16, 8, seed=2))]
    par, seq = (sim_of(Shared(), data[0], config_file=UNQUANTIZED_INPUTS) for _ in range(2))
    par.compute_encodings(data, progress=False)
    seq.compute_encodings_sequential(data, progress=False)
    assert_same_encodings(seq, par)


def test_sequential_needs_a_traced_model():
    sim = sim_of(mlp(), randn(2, 8), trace=False)
    with pytest.raises(RuntimeError, match="traced"):
        sim.compute_encodings_sequential([randn(2, 8)], progress=False)


def test_sequential_empty_batches():
    sim = sim_of(mlp(), randn(2, 8))
    with pytest.raises(ValueError, match="empty"):
        sim.compute_encodings_sequential([], progress=False)
    with pytest.raises(ValueError, match="empty"):
        sim.compute_encodings_sequential(iter([]), progress=False)


def test_sequential_too_few_inputs():
    sim = sim_of(TwoIn(), (randn(2, 3), randn(2, 4)))
    with pytest.raises(TypeError, match="'b'"):
        sim.compute_encodings_sequential([randn(2, 3)], progress=False)


# -- MultiheadAttention -----------------------------------------------------------------------------
class WithMHA(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=True)
        self.fc = nn.Linear(16, 4)

    def forward(self, x):
        out, weights = self.attn(x, x, x)
        return self.fc(out), weights


def _mha_sim():
    torch.manual_seed(0)
    model = WithMHA().eval()
    x = randn(4, 5, 16)
    sim = sim_of(model, x)
    sim.compute_encodings([x], progress=False)
    return model, sim, x


def test_multihead_attention_is_quantized():
    model, sim, x = _mha_sim()
    attn = sub(sim, "attn")
    assert isinstance(attn, quanta.nn.QuantizedMultiheadAttention)
    assert attn.in_proj_weight is not model.attn.in_proj_weight  # in_place=False: a copy
    q = attn.param_quantizers["in_proj_weight"]
    assert q.shape == (48, 1) and q.is_initialized()
    assert attn.output_quantizers[0].is_initialized()
    assert attn.out_proj.param_quantizers["weight"].is_initialized()
    out = no_grad_forward(sim.model, x)[0]
    ref = no_grad_forward(model, x)[0]
    assert not torch.equal(out, ref) and sqnr_db(ref, out) > 25
    with sim.quantizers_disabled():
        assert torch.equal(no_grad_forward(sim.model, x)[0], ref)


def test_multihead_attention_out_proj_output_stays_off():
    _, sim, _ = _mha_sim()
    assert sub(sim, "attn.out_proj").output_quantizers[0] is None


def test_multihead_attention_biases_off_by_default():
    _, sim, _ = _mha_sim()
    assert sub(sim, "attn").param_quantizers["in_proj_bias"] is None


def test_multihead_attention_outputs_are_plain():
    _, sim, x = _mha_sim()
    out, weights = no_grad_forward(sim.model, x)
    assert type(out) is torch.Tensor and type(weights) is torch.Tensor


# -- plain outputs -----------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["mlp", "cnn", "transformer"])
def test_outputs_are_plain_tensors(which):
    torch.manual_seed(0)
    model, x = {"mlp": lambda: (mlp(), randn(8, 8)),
                "cnn": lambda: (SmallCNN(), randn(2, 3, 16, 16)),
                "transformer": lambda: (TransformerBlock(), randn(2, 4, 32))}[which]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sim = QuantizationSimModel(model, x)
    sim.compute_encodings([x], progress=False)
    types_seen = set()
    hooks = [m.register_forward_hook(lambda m, a, out: types_seen.add(type(out))) for _, m in sim.quantized_modules()]
    try:
        y = sim.model(x)
    finally:
        for h in hooks:
            h.remove()
    assert type(y) is torch.Tensor
    assert types_seen == {torch.Tensor}
    y.sum().backward()  # still differentiable


# -- eval-mode weight cache (quanta.nn.base._qparam) -----------------------------------------------
def _linear_sim():
    x = randn(32, 8)
    sim = calibrated(nn.Sequential(nn.Linear(8, 4)), x)
    sim.model.eval()  # the cache serves eval-mode forwards under no_grad
    lin = sub(sim, "0")
    calls = []
    lin.param_quantizers["weight"].register_forward_pre_hook(lambda m, a: calls.append(1))
    return sim, lin, x, calls


def _fresh(lin, x) -> torch.Tensor:
    w = qd(lin.weight, lin.param_quantizers["weight"])
    return qd(F.linear(qd(x, lin.input_quantizers[0]), w, lin.bias.detach()), lin.output_quantizers[0])


def _check_recomputed(sim, lin, x, calls, first) -> None:
    n = len(calls)
    with torch.no_grad():
        second = sim.model(x)
    assert len(calls) == n + 1  # the weight was fake-quantized again
    assert not torch.equal(second, first)
    assert torch.equal(second, _fresh(lin, x))


def test_weight_cache_is_used_in_eval_under_no_grad():
    sim, lin, x, calls = _linear_sim()
    with torch.no_grad():
        first = sim.model(x)
        assert torch.equal(first, _fresh(lin, x))
        n = len(calls)
        assert torch.equal(sim.model(x), first)
    assert len(calls) == n  # served from the cache: no weight quantization
    sim.model(x)  # autograd on: computed afresh
    assert len(calls) == n + 1
    sim.model.train()
    with torch.no_grad():
        sim.model(x)
        sim.model(x)
    assert len(calls) == n + 3  # training mode never uses the cache


def test_weight_cache_follows_in_place_weight_updates():
    sim, lin, x, calls = _linear_sim()
    with torch.no_grad():
        first = sim.model(x)
        lin.weight.add_(0.05)
    _check_recomputed(sim, lin, x, calls, first)


def test_weight_cache_follows_set_range():
    sim, lin, x, calls = _linear_sim()
    with torch.no_grad():
        first = sim.model(x)
        lin.param_quantizers["weight"].set_range(-0.05, 0.05)
    _check_recomputed(sim, lin, x, calls, first)


def test_weight_cache_follows_optimizer_steps():
    sim, lin, x, calls = _linear_sim()
    opt = torch.optim.SGD(sim.model.parameters(), lr=0.1)
    with torch.no_grad():
        first = sim.model(x)
    sim.model(x).pow(2).sum().backward()
    opt.step()
    _check_recomputed(sim, lin, x, calls, first)


def test_weight_cache_follows_a_replaced_parameter():
    sim, lin, x, calls = _linear_sim()
    with torch.no_grad():
        first = sim.model(x)
    lin.weight = nn.Parameter(lin.weight.detach() * 0.5)
    _check_recomputed(sim, lin, x, calls, first)


def test_weight_cache_follows_quantizer_range_writes_through_data():
    # AIMET-style initialisation writes the range through .data, which bumps no version counter
    sim, lin, x, calls = _linear_sim()
    q = lin.param_quantizers["weight"]
    with torch.no_grad():
        first = sim.model(x)
    q.min.data.fill_(-0.05)
    q.max.data.fill_(0.05)
    _check_recomputed(sim, lin, x, calls, first)


def test_weight_cache_after_data_write_and_eval():
    # documented: an in-place write through param.data is not seen until eval() is called again
    sim, lin, x, calls = _linear_sim()
    with torch.no_grad():
        first = sim.model(x)
    lin.weight.data.mul_(0.5)
    sim.model.eval()
    _check_recomputed(sim, lin, x, calls, first)


def test_weight_cache_follows_dtype_conversion():
    sim, lin, x, calls = _linear_sim()
    with torch.no_grad():
        sim.model(x)
    sim.model.double()  # parameters change dtype in place (same Parameter objects)
    with torch.no_grad():
        y = sim.model(x.double())
    assert y.dtype == torch.float64
    assert torch.equal(y, sim.model(x.double()).detach())  # the cached path agrees with a fresh forward


def test_double_model_matches_functional_reference():
    sim, lin, x, calls = _linear_sim()
    with torch.no_grad():
        sim.model(x)
    sim.model.double()
    with torch.no_grad():
        y = sim.model(x.double())
    assert torch.equal(y, _fresh(lin, x.double()))


def test_repr():
    sim = sim_of(mlp(), randn(2, 8))
    assert repr(sim) == ("QuantizationSimModel(quant_scheme=min_max, quantizers=5, capture=export, "
                         "unquantized_modules=0, float_ops=0)")


# ---------------------------------------------------------------------- a Hugging Face-style encoder
def test_hf_style_encoder_is_traced_and_its_attention_quantized():
    from quantsim_models import HFEncoder, make_token_data

    torch.manual_seed(0)
    model = HFEncoder().eval()
    ids, mask = make_token_data(64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 1.0 - mask comes from an integer input: not an activation, not listed
        sim = QuantizationSimModel(model, (ids[:2], mask[:2]))
    assert sim.float_ops == [] and sim.capture_method == "export"
    names = {n for n, _ in sim.named_quantizers()}
    for i in range(2):
        for op in ("matmul", "mul", "softmax", "matmul_1"):  # the expanded scaled_dot_product_attention
            assert f"layers.{i}.{op}.output_quantizers.0" in names
    sim.compute_encodings([(ids[i:i + 16], mask[i:i + 16]) for i in range(0, 32, 16)], progress=False)
    with torch.no_grad():
        ref, out = model(ids[32:], mask[32:]), sim.model(ids[32:], mask[32:])
        assert set(out) == {"last_hidden_state", "pooler_output"}
        for key in out:
            assert sqnr_db(ref[key], out[key]) > 30, key
        other = make_token_data(3, seq=9, seed=1)  # another sequence length: the trace kept shapes symbolic
        with sim.quantizers_disabled():
            torch.testing.assert_close(sim.model(*other), model(*other), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- AIMET's helper methods
def _calibrated_cnn():
    torch.manual_seed(0)
    model = SmallCNN().eval()
    x, _ = make_cnn_data(16, seed=0)
    sim = sim_of(model, x[:4])
    sim.compute_encodings([x], progress=False)
    return model, sim, x


def test_qmodules_quantizers_and_their_parameters():
    _, sim, _ = _calibrated_cnn()
    assert [n for n, _ in sim.named_qmodules()] == [n for n, m in sim.model.named_modules()
                                                     if isinstance(m, quanta.nn.QuantizationMixin)]
    assert list(sim.qmodules()) == [m for _, m in sim.named_qmodules()]
    assert list(sim.quantizers()) == [q for _, q in sim.named_quantizers()]
    named = dict(sim.named_quantizer_parameters())
    assert "relu1.output_quantizers.0.max" in named and "conv1.param_quantizers.weight.min" in named
    assert all(named[f"{q}.{p}"] is getattr(dict(sim.named_quantizers())[q], p)
               for q, p in (k.rsplit(".", 1) for k in named))
    assert [id(p) for p in sim.quantizer_parameters()] == [id(p) for p in named.values()]
    model_params = {id(p) for n, p in sim.model.named_parameters() if "quantizers" not in n}
    assert not model_params & {id(p) for p in named.values()}  # ranges only, no weights


def test_exclude_layers_from_quantization_runs_them_in_float():
    _, sim, x = _calibrated_cnn()
    conv2 = sim.model.get_submodule("conv2")
    sim.exclude_layers_from_quantization([conv2])
    assert all(q is None for q in (*conv2.input_quantizers, *conv2.output_quantizers,
                                    *conv2.param_quantizers.values()))
    assert not any(n.startswith("conv2.") for n, _ in sim.named_quantizers())
    assert any(n.startswith("conv1.") for n, _ in sim.named_quantizers())
    seen = []
    handle = conv2.register_forward_hook(lambda m, args, out: seen.append((args[0], out)))
    with torch.no_grad():
        sim.model(x)
    handle.remove()
    (inp, out), = seen
    assert torch.equal(out, nn.Conv2d.forward(conv2, inp))  # the float convolution of the float weight
    with pytest.raises(ValueError, match="not a module of sim.model"):
        sim.exclude_layers_from_quantization([nn.Linear(2, 2)])
    with pytest.raises(TypeError, match="nn.Module"):
        sim.exclude_layers_from_quantization(["conv1"])


def test_exclude_param_from_quantization():
    _, sim, _ = _calibrated_cnn()
    sim.exclude_param_from_quantization("weight")
    assert not any(".param_quantizers.weight" in n for n, _ in sim.named_quantizers())
    assert any(".output_quantizers." in n for n, _ in sim.named_quantizers())
    with pytest.raises(TypeError, match="str"):
        sim.exclude_param_from_quantization(0)


def test_get_original_model():
    model, sim, x = _calibrated_cnn()
    original = QuantizationSimModel.get_original_model(sim.model)
    assert not any(isinstance(m, (quanta.nn.QuantizationMixin, QuantizerBase)) for m in original.modules())
    with torch.no_grad():
        torch.testing.assert_close(original(x), model(x), rtol=0, atol=0)
        baked = QuantizationSimModel.get_original_model(sim.model, qdq_weights=True)
        weight_q = sim.model.conv1.param_quantizers["weight"]
        assert torch.equal(baked.conv1.weight, weight_q(sim.model.conv1.weight).as_subclass(torch.Tensor))
        assert not torch.equal(baked.conv1.weight, model.conv1.weight)
    assert any(isinstance(m, quanta.nn.QuantizationMixin) for m in sim.model.modules())  # sim untouched


def test_load_and_freeze_encodings(tmp_path):
    _, sim, x = _calibrated_cnn()
    path = tmp_path / "enc.json"
    sim.save_encodings(path)
    _, fresh, _ = _calibrated_cnn()
    with torch.no_grad():
        for q in fresh.quantizers():  # different ranges than the saved ones
            for p in q.parameters():
                p.mul_(1.5)
    fresh.load_and_freeze_encodings(path)
    fresh.compute_encodings([x * 3], progress=False)  # frozen: calibration keeps the loaded ranges
    with torch.no_grad():
        assert torch.equal(fresh.model(x), sim.model(x))
    assert not any(p.requires_grad for p in fresh.quantizer_parameters())
