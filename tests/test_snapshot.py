"""quanta._snapshot: a module's small tensors as they are now, and every way they can change since."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quanta._snapshot import Snapshot
from quanta.quantization.affine import QuantizeDequantize


def _quantizer() -> QuantizeDequantize:
    q = QuantizeDequantize(shape=(4, 1), bitwidth=8, symmetric=True)
    q.set_range(-torch.arange(1.0, 5.0).reshape(4, 1), torch.arange(1.0, 5.0).reshape(4, 1))
    return q


def test_unchanged_until_a_value_changes():
    q = _quantizer()
    snap = Snapshot(q)
    assert snap.unchanged() and snap.unchanged()
    with torch.no_grad():
        q.max.mul_(2)
    assert not snap.unchanged()


@pytest.mark.parametrize("change", [
    "data_write", "set_range", "replace_parameter", "set_data", "flag", "add_buffer", "add_child", "drop_parameter"])
def test_sees_every_kind_of_change(change):
    q = _quantizer()
    snap = Snapshot(q)
    if change == "data_write":  # bumps no version counter
        q.min.data[0] = -7.0
    elif change == "set_range":
        q.set_range(-1.0, 1.0)
    elif change == "replace_parameter":  # same values, another tensor
        q.max = nn.Parameter(q.max.detach().clone())
    elif change == "set_data":
        q.min.data = q.min.detach().clone()
    elif change == "flag":
        q._initialized.fill_(False)
    elif change == "add_buffer":
        q.register_buffer("extra", torch.zeros(1))
    elif change == "add_child":
        q.child = nn.Linear(1, 1)
    elif change == "drop_parameter":
        del q._parameters["max"]
    assert not snap.unchanged()


def test_negative_zero_counts_as_a_change():
    # bytes, not values: the cached result is recomputed, which is always safe
    m = nn.Module()
    m.register_buffer("b", torch.zeros(2))
    snap = Snapshot(m)
    m.b[1] = -0.0
    assert not snap.unchanged()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_dtypes_numpy_lacks_are_compared_by_value(dtype):
    m = nn.Module()
    m.register_buffer("b", torch.ones(3, dtype=dtype))
    snap = Snapshot(m)
    assert snap.unchanged()
    m.b.data[2] = 2.0
    assert not snap.unchanged()


def test_submodules_are_covered():
    outer = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.Linear(2, 1)))
    snap = Snapshot(outer)
    assert snap.unchanged()
    outer[1][0].bias.data.zero_()
    assert not snap.unchanged()
    snap = Snapshot(outer)
    outer[1][0] = nn.Linear(2, 1)  # a child replaced
    assert not snap.unchanged()


def test_empty_and_none_slots():
    m = nn.Linear(2, 2, bias=False)  # bias is a None slot
    snap = Snapshot(m)
    assert snap.unchanged()
    m.bias = nn.Parameter(torch.zeros(2))
    assert not snap.unchanged()
    assert Snapshot(nn.ReLU()).unchanged()
