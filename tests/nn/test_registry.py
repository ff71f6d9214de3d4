"""quanta.nn registry: lookup, user registration, and the errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import quanta.nn as qnn


class Scale(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 2.0, n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class QuantizedScale(qnn.QuantizationMixin, Scale):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._qoutput(self._qinput(0, x) * self._qparam("weight"))


@pytest.fixture
def scale_registered():
    qnn.register(Scale, QuantizedScale)
    yield
    qnn.unregister(Scale)


BUILTINS = {
    nn.Linear(2, 2): qnn.QuantizedLinear,
    nn.Conv1d(1, 1, 1): qnn.QuantizedConv1d,
    nn.Conv2d(1, 1, 1): qnn.QuantizedConv2d,
    nn.Conv3d(1, 1, 1): qnn.QuantizedConv3d,
    nn.ConvTranspose1d(1, 1, 1): qnn.QuantizedConvTranspose1d,
    nn.ConvTranspose2d(1, 1, 1): qnn.QuantizedConvTranspose2d,
    nn.Embedding(3, 2): qnn.QuantizedEmbedding,
    nn.LayerNorm(2): qnn.QuantizedLayerNorm,
    nn.GroupNorm(1, 2): qnn.QuantizedGroupNorm,
    nn.BatchNorm1d(2): qnn.QuantizedBatchNorm1d,
    nn.BatchNorm2d(2): qnn.QuantizedBatchNorm2d,
    nn.ReLU(): qnn.QuantizedReLU,
    nn.GELU(): qnn.QuantizedGELU,
    nn.SiLU(): qnn.QuantizedSiLU,
    nn.Softmax(dim=0): qnn.QuantizedSoftmax,
    qnn.Add(): qnn.QuantizedAdd,
    qnn.Multiply(): qnn.QuantizedMultiply,
    qnn.MatMul(): qnn.QuantizedMatMul,
    qnn.Concat(): qnn.QuantizedConcat,
}


@pytest.mark.parametrize("module", list(BUILTINS), ids=lambda m: type(m).__name__)
def test_builtin_lookup(module):
    qcls = BUILTINS[module]
    assert qnn.quantized_class_for(module) is qcls
    assert qnn.quantized_class_for(type(module)) is qcls
    qm = qnn.from_module(module)
    assert type(qm) is qcls and isinstance(qm, type(module))


def test_lookup_is_by_exact_type():
    class MyLinear(nn.Linear):
        pass

    assert qnn.quantized_class_for(MyLinear(2, 2)) is None
    assert qnn.quantized_class_for(nn.Softsign()) is None
    assert qnn.quantized_class_for(qnn.QuantizedLinear(2, 2)) is None


def test_user_registration(scale_registered):
    m = Scale(4)
    assert qnn.quantized_class_for(m) is QuantizedScale
    qm = qnn.from_module(m)
    assert qm.weight is m.weight
    assert qm.param_quantizers["weight"].shape == (4,)
    x = torch.randn(16, 4)
    with qm.compute_encodings():
        qm(x)
    assert (qm(x) - m(x)).abs().max() < 0.05


def test_unregister_restores_none_and_builtins():
    qnn.register(Scale, QuantizedScale)
    qnn.unregister(Scale)
    assert qnn.quantized_class_for(Scale) is None
    with pytest.raises(KeyError):
        qnn.unregister(Scale)

    class OtherQuantizedLinear(qnn.QuantizedLinear):
        pass

    qnn.register(nn.Linear, OtherQuantizedLinear, replace=True)
    try:
        assert type(qnn.from_module(nn.Linear(2, 2))) is OtherQuantizedLinear
    finally:
        qnn.unregister(nn.Linear)
    assert qnn.quantized_class_for(nn.Linear) is qnn.QuantizedLinear


def test_register_conflict_needs_replace(scale_registered):
    class Other(QuantizedScale):
        pass

    with pytest.raises(ValueError, match="replace=True"):
        qnn.register(Scale, Other)
    qnn.register(Scale, QuantizedScale)  # same mapping again is fine
    with pytest.raises(ValueError, match="already mapped"):
        qnn.register(nn.Linear, type("Q", (qnn.QuantizedLinear,), {}))


def test_register_rejects_bad_classes():
    with pytest.raises(TypeError, match="float_cls"):
        qnn.register(int, QuantizedScale)
    with pytest.raises(TypeError, match="QuantizationMixin"):
        qnn.register(Scale, Scale)
    with pytest.raises(TypeError, match="QuantizationMixin"):
        qnn.register(nn.Linear, QuantizedScale)  # not a Linear


def test_from_module_unsupported_type_names_it():
    with pytest.raises(TypeError, match=r"torch\.nn\.modules\.activation\.Softsign"):
        qnn.from_module(nn.Softsign())
    with pytest.raises(TypeError, match="must be an nn.Module"):
        qnn.from_module(torch.zeros(2))


def test_class_from_module_rejects_other_types():
    with pytest.raises(TypeError, match=r"needs a torch\.nn\.modules\.linear\.Linear, got .*Conv2d"):
        qnn.QuantizedLinear.from_module(nn.Conv2d(1, 1, 1))
    with pytest.raises(TypeError, match="Conv2d.*ConvTranspose2d"):
        qnn.QuantizedConv2d.from_module(nn.ConvTranspose2d(1, 1, 1))
    with pytest.raises(TypeError, match="QuantizedLinear"):
        qnn.QuantizedLinear.from_module(qnn.QuantizedLinear(2, 2))  # already quantized
