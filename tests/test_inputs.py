"""quanta._inputs: one batch or dummy input as ``(args, kwargs)``, as QuantizationSimModel and export_onnx take it."""

from __future__ import annotations

import pytest
import torch

from quanta._inputs import call_model, split_batch, split_dummy_input

X = torch.zeros(2, 3)


def forward(input_ids, attention_mask=None, use_cache=True):
    return input_ids


def test_split_batch_takes_every_form_unchecked():
    assert split_batch(X) == ((X,), {})
    assert split_batch((X, 1)) == ((X, 1), {})
    assert split_batch({"a": 1}) == ((), {"a": 1})
    assert split_batch([X]) == (([X],), {})  # a list is one input
    assert call_model(lambda *a, **k: (a, k), {"a": 1}) == ((), {"a": 1})


def test_positional_dummy_inputs():
    assert split_dummy_input(X) == ((X,), {})
    assert split_dummy_input((X, X)) == ((X, X), {})


@pytest.mark.parametrize("bad", [[X], (), (X, 3), None, X.numpy()])
def test_positional_dummy_input_must_be_tensors(bad):
    with pytest.raises(TypeError, match="dummy_input must be a tensor, a tuple of tensors"):
        split_dummy_input(bad)


def test_dict_dummy_input_without_a_signature_keeps_its_order():
    args, kwargs = split_dummy_input({"use_cache": False, "input_ids": X})
    assert args == () and list(kwargs) == ["use_cache", "input_ids"]


def test_dict_dummy_input_bound_to_the_forward_comes_in_its_order():
    args, kwargs = split_dummy_input({"use_cache": False, "input_ids": X}, forward)
    assert args == () and list(kwargs) == ["input_ids", "use_cache"] and kwargs["input_ids"] is X


@pytest.mark.parametrize("bad, match", [
    ({}, "must map the forward's argument names"),
    ({0: X}, "must map the forward's argument names"),
    ({"input_ids": None}, "the dict holds no tensor"),
])
def test_dict_dummy_input_checks(bad, match):
    for fn in (None, forward):
        with pytest.raises(TypeError, match=match):
            split_dummy_input(bad, fn)


def test_dict_dummy_input_names_the_forward_does_not_take():
    split_dummy_input({"input_ids": X, "ids": X})  # no signature: not checked
    with pytest.raises(TypeError, match="dummy_input: got an unexpected keyword argument 'ids'"):
        split_dummy_input({"input_ids": X, "ids": X}, forward)
    with pytest.raises(TypeError, match="dummy_input: missing a required argument: 'input_ids'"):
        split_dummy_input({"attention_mask": X}, forward)
