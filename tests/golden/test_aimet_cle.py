"""quanta's ``equalize_model`` against aimet-torch 2.42's on the same depthwise-separable networks.

``aimet_cle.json`` is written by ``generate_aimet_cle.py`` (run it in a venv with aimet-torch); the models are
rebuilt here by that script's own ``build`` (plain torch, same seeds). Every equalized convolution weight and bias
must match AIMET's to float32 rounding: the scale factors, the depthwise triples, the high-bias absorption through
ReLU and the BN fold are the same computation; with ReLU6 (not scale-equivariant) only the BN fold happens.
AIMET also absorbs biases into zero-padded layers, and so does quanta's default; ``absorb_through_padding=False``
leaves those biases where they are (see ``quanta.quantsim.cross_layer_equalization``).
"""

from __future__ import annotations

import json
import pathlib
import warnings

import pytest
import torch

import generate_aimet_cle as generator
from _record import golden_path, unpack
from quanta.cross_layer_equalization import equalize_model

GOLDEN = json.loads(pathlib.Path(golden_path("aimet_cle.json")).read_text())  # this CPU's recording


@pytest.mark.parametrize("name", sorted(GOLDEN["cases"]))
def test_equalize_model_matches_aimet(name):
    case = GOLDEN["cases"][name]
    model = generator.build(case["seed"], case["activation"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        equalize_model(model, input_shapes=tuple(case["input_shape"]))  # the default absorbs as AIMET does
    assert any("ReLU6" in str(w.message) for w in caught) == (case["activation"] == "ReLU6")
    convs = generator.convs(model)
    assert len(convs) == len(case["weights"])
    for i, conv in enumerate(convs):
        torch.testing.assert_close(conv.weight.detach(), unpack(case["weights"][i], conv.weight.shape), rtol=2e-6,
                                   atol=1e-7, msg=lambda m, i=i: f"conv {i} weight: {m}")
        # biases: the absorbed W2 . c is a sum over channels and kernel taps, which quanta and AIMET order
        # differently: equal on an AVX2 machine, 8 ulps apart on one bias on an AVX-512 one
        torch.testing.assert_close(conv.bias.detach(), unpack(case["biases"][i], conv.bias.shape), rtol=2e-5,
                                   atol=1e-6, msg=lambda m, i=i: f"conv {i} bias: {m}")


def test_exact_absorption_departs_from_aimet_only_on_padded_layers():
    case = GOLDEN["cases"]["mobilenet_style_0"]
    model = generator.build(case["seed"], case["activation"])
    equalize_model(model, input_shapes=tuple(case["input_shape"]), absorb_through_padding=False)
    for i, conv in enumerate(generator.convs(model)):
        # every weight is AIMET's (scaling is the same); biases differ only around the padded depthwise layers
        torch.testing.assert_close(conv.weight.detach(), unpack(case["weights"][i], conv.weight.shape), rtol=2e-6,
                                   atol=1e-7)
    biases_equal = [torch.allclose(c.bias.detach(), unpack(case["biases"][i], c.bias.shape), rtol=2e-6, atol=1e-6)
                    for i, c in enumerate(generator.convs(model))]
    assert not all(biases_equal)
    # the last layer's input is the 1x1 projection's output: unpadded, absorbed as AIMET does
    assert biases_equal[-1]
