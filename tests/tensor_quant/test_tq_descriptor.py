"""ScaledQuantDescriptor / QuantDescriptor: defaults, validation, dict and YAML round trips."""

import dataclasses
import importlib.util
import sys

import numpy as np
import pytest
import torch

from quanta.tensor_quant import (
    QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_PER_TENSOR,
    QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR,
    CalibMethod,
    QuantDescriptor,
    ScaledQuantDescriptor,
)

VARIANTS = [
    QuantDescriptor(),
    QuantDescriptor(num_bits=4, name="w"),
    QuantDescriptor(num_bits=8, axis=0, fake_quant=False),
    QuantDescriptor(num_bits=8, axis=(0, 2), calib_method="histogram"),
    QuantDescriptor(num_bits=6, amax=[1.0, 2.5, 0.125], unsigned=True),
    QuantDescriptor(num_bits=8, amax=3.5, learn_amax=True, scale_amax=0.5),
    QuantDescriptor(num_bits=8, narrow_range=True, axis=-1),
    QuantDescriptor(num_bits=(4, 3), amax=448.0),
    QuantDescriptor(num_bits=32, unsigned=True, calib_method=CalibMethod.HISTOGRAM),
]


def test_alias_and_defaults():
    assert QuantDescriptor is ScaledQuantDescriptor
    d = QuantDescriptor()
    assert (d.num_bits, d.name, d.fake_quant, d.axis, d.amax, d.learn_amax, d.scale_amax, d.calib_method,
            d.unsigned) == (8, None, True, None, None, False, None, "max", False)
    # NVIDIA's descriptor default is narrow_range=False (unlike tensor_quant's True)
    assert d.narrow_range is False


def test_frozen_and_keyword_only():
    d = QuantDescriptor(8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.num_bits = 4
    with pytest.raises(TypeError):
        QuantDescriptor(8, "name", True)  # fake_quant is keyword-only
    with pytest.raises(TypeError, match="unexpected keyword"):
        QuantDescriptor(8, bogus=1)


def test_amax_is_a_read_only_float32_array():
    d = QuantDescriptor(amax=[1.0, 2.0])
    assert isinstance(d.amax, np.ndarray) and d.amax.dtype == np.float32 and d.amax.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError):
        d.amax[0] = 5.0
    assert QuantDescriptor(amax=0.1).amax.tolist() == pytest.approx(0.1, rel=1e-7)
    assert QuantDescriptor(amax=torch.tensor([3.0])).amax.tolist() == [3.0]


@pytest.mark.parametrize("desc", VARIANTS, ids=str)
def test_dict_round_trip(desc):
    d = desc.dict()
    assert isinstance(d, dict) and d["num_bits"] == desc.num_bits and d["name"] == desc.name
    again = QuantDescriptor.from_dict(d)
    assert again == desc and hash(again) == hash(desc)
    for key in ("fake_quant", "axis", "amax", "learn_amax", "scale_amax", "calib_method", "unsigned", "narrow_range"):
        a, b = getattr(again, key), getattr(desc, key)
        assert (a is None and b is None) or np.array_equal(np.asarray(a), np.asarray(b)), key


def test_dict_lists_only_non_defaults_and_keeps_narrow_range_and_calib_method():
    assert QuantDescriptor().dict() == {"num_bits": 8, "name": None}
    d = QuantDescriptor(num_bits=4, narrow_range=True, calib_method="histogram", amax=2.0, axis=(1,)).dict()
    assert d == {"num_bits": 4, "name": None, "narrow_range": True, "calib_method": "histogram", "amax": 2.0,
                 "axis": (1,)}


def test_from_dict_accepts_lists_from_json():
    d = QuantDescriptor.from_dict({"num_bits": [4, 3], "name": None, "axis": [0, 1]})
    assert d.num_bits == (4, 3) and d.axis == (0, 1)


def test_equality_is_by_value():
    assert QuantDescriptor(amax=[1.0, 2.0]) == QuantDescriptor(amax=np.array([1.0, 2.0]))
    assert QuantDescriptor(amax=[1.0, 2.0]) != QuantDescriptor(amax=[1.0, 2.5])
    assert QuantDescriptor(amax=[1.0]) != QuantDescriptor(amax=1.0)  # shapes differ
    assert QuantDescriptor(axis=0) != QuantDescriptor(axis=1)
    assert QuantDescriptor() != "QuantDescriptor()"


@pytest.mark.skipif(importlib.util.find_spec("yaml") is None, reason="PyYAML is not installed")
@pytest.mark.parametrize("desc", VARIANTS, ids=str)
def test_yaml_round_trip(desc):
    import yaml

    text = desc.to_yaml()
    assert isinstance(yaml.safe_load(text), dict)  # plain YAML, no Python tags
    assert QuantDescriptor.from_yaml(text) == desc


def test_yaml_without_pyyaml_raises_import_error_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "yaml", None)  # makes `import yaml` fail even if installed
    with pytest.raises(ImportError, match="PyYAML"):
        QuantDescriptor().to_yaml()
    with pytest.raises(ImportError, match="pip install pyyaml"):
        QuantDescriptor.from_yaml("num_bits: 8\n")


@pytest.mark.parametrize("kwargs, error", [
    ({"num_bits": 0}, ValueError),
    ({"num_bits": 33}, ValueError),
    ({"num_bits": True}, TypeError),
    ({"num_bits": 8.0}, TypeError),
    ({"num_bits": (5, 2)}, ValueError),
    ({"name": 3}, TypeError),
    ({"fake_quant": 1}, TypeError),
    ({"axis": "0"}, TypeError),
    ({"axis": (0, 0)}, ValueError),
    ({"learn_amax": True, "axis": 0}, TypeError),  # NVIDIA: TypeError
    ({"amax": -1.0}, ValueError),
    ({"amax": float("nan")}, ValueError),
    ({"amax": "1.0"}, TypeError),
    ({"scale_amax": 0.0}, ValueError),
    ({"scale_amax": "2"}, TypeError),
    ({"calib_method": "entropy"}, ValueError),
    ({"unsigned": "no"}, TypeError),
    ({"num_bits": (4, 3), "unsigned": True}, ValueError),
    ({"num_bits": (4, 3), "narrow_range": True}, ValueError),
])
def test_invalid_arguments(kwargs, error):
    with pytest.raises(error):
        QuantDescriptor(**kwargs)


def test_predefined_descriptors():
    assert QUANT_DESC_8BIT_PER_TENSOR == QuantDescriptor(num_bits=8)
    assert QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR.unsigned is True
    assert QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL.axis == 0


def test_str_mentions_the_settings():
    s = str(QuantDescriptor(num_bits=4, axis=0, name="weight", fake_quant=False, narrow_range=True))
    assert s.startswith("weight: ") and "4bit" in s and "axis=0" in s and "real" in s and "narrow" in s
    assert "fp8" in str(QuantDescriptor(num_bits=(4, 3)))
