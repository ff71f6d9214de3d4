"""quanta.quantsim.fold_all_batch_norms: BatchNorm folded into adjacent Conv/Linear layers.

Reference: the unfolded model in eval mode. Folding only re-associates float
arithmetic, so outputs must agree to float32 rounding (relative 1e-5 here),
and the folded model must hold no BatchNorm where a fold was possible.
"""

from __future__ import annotations

import copy

import pytest
import torch
from quantsim_models import SmallCNN, make_cnn_data, sqnr_db
from torch import nn

import quanta.quantsim.batch_norm_fold as bnf
from quanta.quantsim import QuantizationSimModel, fold_all_batch_norms


def _bn(cls, c: int, affine: bool = True) -> nn.Module:
    """A BatchNorm with running statistics and affine parameters far from the identity."""
    bn = cls(c, affine=affine)
    g = torch.Generator().manual_seed(c)
    with torch.no_grad():
        bn.running_mean.copy_(torch.randn(c, generator=g))
        bn.running_var.copy_(torch.rand(c, generator=g) * 3 + 0.1)
        if affine:
            bn.weight.copy_(torch.randn(c, generator=g))
            bn.bias.copy_(torch.randn(c, generator=g))
    return bn


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a - b).abs().max() <= 1e-5 * a.abs().max() + 1e-6).item())


def _check_fold(model: nn.Module, x: torch.Tensor, expected_pairs: int) -> list:
    model.eval()
    with torch.no_grad():
        ref = model(x)
    pairs = fold_all_batch_norms(model, dummy_input=x)
    assert len(pairs) == expected_pairs
    with torch.no_grad():
        out = model(x)
    assert _close(ref, out), (ref - out).abs().max()
    for _, bn in pairs:
        assert isinstance(bn, nn.modules.batchnorm._BatchNorm)
    return pairs


# ------------------------------------------------------------------------------- layer -> BN
BACKWARD = {
    "conv1d": (lambda: nn.Sequential(nn.Conv1d(3, 6, 3), _bn(nn.BatchNorm1d, 6)), (4, 3, 10)),
    "conv2d": (lambda: nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), _bn(nn.BatchNorm2d, 6)), (4, 3, 8, 8)),
    "conv2d_grouped_no_bias": (lambda: nn.Sequential(nn.Conv2d(4, 8, 3, groups=2, bias=False),
                                                     _bn(nn.BatchNorm2d, 8)), (2, 4, 7, 7)),
    "conv3d": (lambda: nn.Sequential(nn.Conv3d(2, 4, 3), _bn(nn.BatchNorm3d, 4)), (1, 2, 5, 5, 5)),
    "linear": (lambda: nn.Sequential(nn.Linear(8, 5), _bn(nn.BatchNorm1d, 5)), (6, 8)),
    "linear_bn_not_affine": (lambda: nn.Sequential(nn.Linear(8, 5), _bn(nn.BatchNorm1d, 5, affine=False)), (6, 8)),
    "convT1d": (lambda: nn.Sequential(nn.ConvTranspose1d(4, 6, 3, stride=2), _bn(nn.BatchNorm1d, 6)), (2, 4, 5)),
    "convT2d_grouped": (lambda: nn.Sequential(nn.ConvTranspose2d(4, 6, 3, groups=2), _bn(nn.BatchNorm2d, 6)),
                        (2, 4, 5, 5)),
}


@pytest.mark.parametrize("case", list(BACKWARD))
def test_layer_then_bn_is_folded(case):
    make, shape = BACKWARD[case]
    torch.manual_seed(0)
    model = make()
    layer = model[0]
    (pair,) = _check_fold(model, torch.randn(shape), 1)
    assert pair[0] is layer and isinstance(model[1], nn.Identity)
    assert layer.bias is not None and layer.bias.shape == (pair[1].num_features,)


# ------------------------------------------------------------------------------- BN -> layer
def test_bn_then_unpadded_conv_is_folded_forward():
    torch.manual_seed(0)
    model = nn.Sequential(_bn(nn.BatchNorm2d, 3), nn.Conv2d(3, 5, 3))
    (pair,) = _check_fold(model, torch.randn(2, 3, 8, 8), 1)
    assert pair[0] is model[1] and isinstance(model[0], nn.Identity)


def test_bn_then_linear_on_2d_input_is_folded_forward():
    torch.manual_seed(0)
    model = nn.Sequential(_bn(nn.BatchNorm1d, 6), nn.Linear(6, 3, bias=False))
    _check_fold(model, torch.randn(5, 6), 1)
    assert isinstance(model[0], nn.Identity) and model[1].bias is not None


@pytest.mark.parametrize("model, shape", [
    (lambda: nn.Sequential(_bn(nn.BatchNorm2d, 3), nn.Conv2d(3, 5, 3, padding=1)), (2, 3, 8, 8)),  # padded border
    (lambda: nn.Sequential(_bn(nn.BatchNorm2d, 4), nn.Conv2d(4, 4, 3, groups=2)), (2, 4, 8, 8)),  # grouped
    (lambda: nn.Sequential(_bn(nn.BatchNorm1d, 4), nn.Linear(4, 3)), (2, 4, 4)),  # BN on dim 1, Linear on the last
    (lambda: nn.Sequential(_bn(nn.BatchNorm2d, 4), nn.ConvTranspose2d(4, 3, 3)), (2, 4, 5, 5)),
], ids=["padded_conv", "grouped_conv", "linear_3d_input", "conv_transpose"])
def test_bn_then_layer_left_alone_where_folding_would_change_values(model, shape):
    torch.manual_seed(0)
    m = model()
    before = copy.deepcopy(m.state_dict())
    assert fold_all_batch_norms(m.eval(), dummy_input=torch.randn(shape)) == []
    assert isinstance(m[0], nn.modules.batchnorm._BatchNorm)
    assert all(torch.equal(v, m.state_dict()[k]) for k, v in before.items())


def test_conv_bn_conv_folds_backward_first():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), _bn(nn.BatchNorm2d, 4), nn.Conv2d(4, 2, 3))
    (pair,) = _check_fold(model, torch.randn(2, 3, 9, 9), 1)
    assert pair[0] is model[0]  # into the conv before it, as AIMET


def test_bn_conv_bn_folds_both():
    torch.manual_seed(0)
    model = nn.Sequential(_bn(nn.BatchNorm2d, 3), nn.Conv2d(3, 4, 3), _bn(nn.BatchNorm2d, 4))
    _check_fold(model, torch.randn(2, 3, 8, 8), 2)
    assert isinstance(model[0], nn.Identity) and isinstance(model[2], nn.Identity)


# ------------------------------------------------------------------------------- not folded
class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = _bn(nn.BatchNorm2d, 4)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y  # the conv output has a second consumer


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = _bn(nn.BatchNorm2d, 4)

    def forward(self, x):
        return self.bn(self.conv(self.conv(x)))  # one module, two call sites


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.weight
        self.bn = _bn(nn.BatchNorm1d, 4)

    def forward(self, x):
        return self.bn(self.a(x)) + self.b(x)


@pytest.mark.parametrize("make, shape", [
    (_Residual, (2, 4, 6, 6)), (_Twice, (2, 4, 6, 6)), (_Tied, (3, 4)),
    (lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, track_running_stats=False)), (2, 3, 6, 6)),
], ids=["fan_out", "called_twice", "tied_weights", "no_running_stats"])
def test_unsafe_patterns_are_not_folded(make, shape):
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(shape)
    with torch.no_grad():
        ref = model(x)
    assert fold_all_batch_norms(model, dummy_input=x) == []
    with torch.no_grad():
        assert torch.equal(model(x), ref)


# ------------------------------------------------------------------------------- with the sim
def test_small_cnn_folded_then_quantized():
    torch.manual_seed(0)
    model = SmallCNN().eval()
    x, _ = make_cnn_data(64, seed=0)
    for m in model.modules():  # statistics away from the identity, as after training
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.3, 0.3)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
    with torch.no_grad():
        ref = model(x)
    folded = copy.deepcopy(model)
    pairs = fold_all_batch_norms(folded, input_shapes=tuple(x.shape))
    n_bn = sum(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert n_bn > 0 and len(pairs) == n_bn
    assert not any(isinstance(m, nn.BatchNorm2d) for m in folded.modules())
    sim = QuantizationSimModel(folded, x[:4])
    sim.compute_encodings([x[:32]], progress=False)
    with torch.no_grad():
        assert sqnr_db(ref[32:], sim.model(x[32:])) > 30  # quantizing the folded weights, as the device runs them
    assert not any("BatchNorm" in type(m).__name__ for m in sim.model.modules())


def test_train_flags_kept_and_several_inputs():
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 3)
            self.bn = _bn(nn.BatchNorm1d, 3)
            self.b = nn.Linear(5, 3)

        def forward(self, x, y):
            return self.bn(self.a(x)) + self.b(y)

    model = Two().train()
    pairs = fold_all_batch_norms(model, input_shapes=[(2, 4), (2, 5)])
    assert len(pairs) == 1 and model.training and model.a.training


# ------------------------------------------------------------------------------- errors
def test_inputs_are_required_and_checked():
    model = nn.Sequential(nn.Linear(4, 3), _bn(nn.BatchNorm1d, 3))
    with pytest.raises(TypeError, match="input_shapes"):
        fold_all_batch_norms(model)
    for bad in ((2, 0), (2, 4.0), "2,4", ()):
        with pytest.raises(ValueError, match="input_shapes"):
            fold_all_batch_norms(model, input_shapes=bad)
    with pytest.raises(TypeError, match="nn.Module"):
        fold_all_batch_norms("model", input_shapes=(2, 4))


def test_untraceable_model_is_a_clear_error_and_left_unchanged():
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 3)
            self.bn = _bn(nn.BatchNorm1d, 3)

        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
                return self.bn(self.a(x))
            return self.a(x)

    model = Branchy().eval()
    with pytest.raises(TypeError, match="could not capture Branchy"):
        fold_all_batch_norms(model, input_shapes=(2, 4))
    assert isinstance(model.bn, nn.BatchNorm1d)


def test_a_fold_that_changes_outputs_is_undone(monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), _bn(nn.BatchNorm2d, 4)).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    real = bnf._fold_backward

    def broken(layer, bn):
        real(layer, bn)
        with torch.no_grad():
            layer.weight.mul_(1.01)

    monkeypatch.setattr(bnf, "_fold_backward", broken)
    with pytest.raises(RuntimeError, match="model is restored"):
        fold_all_batch_norms(model, input_shapes=(2, 3, 6, 6))
    assert isinstance(model[1], nn.BatchNorm2d) and model[0].bias is None
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
