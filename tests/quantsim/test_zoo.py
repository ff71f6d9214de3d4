"""The model zoo (zoo_models.ZOO) through QuantizationSimModel, default W8A8, as a user passes the models."""

from __future__ import annotations

import warnings

import pytest
import torch

pytest.importorskip("transformers")

from quanta.quantsim import QuantizationSimModel  # noqa: E402
from zoo_models import ZOO, build, sqnr_db  # noqa: E402

# what still fails, and why (strict: a fix makes these tests fail until the entry is removed)
KNOWN = {
    "clip_vision": "QuickGELU (x * sigmoid(1.702 x)) has no quantized counterpart: kept whole in float",
    "wav2vec2": "the weight-normed positional conv (nn.utils.parametrizations) is kept in float",
    "mobilenet_v2": "W8A8 output SQNR ~3 dB on random weights (weights alone ~10 dB): not investigated yet",
    "gemma": "Gemma's RMSNorm scales by (1 + weight): no quantized counterpart, kept in float",
    "falcon": "two FalconLinear calls per model stay as aten ops (their weights in float)",
    "deberta_v2": "the division of the scores by a tensor scale stays a float op",
    "regnet": "W8A8 output SQNR ~25 dB on random weights: not investigated yet",
    "mobilevit": "W8A8 output SQNR ~7 dB on random weights and divisions kept in float: not investigated yet",
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(n in KNOWN, reason=KNOWN.get(n, ""),
                                                                          strict=True)) for n in ZOO])
def test_zoo_model_is_captured_whole_and_keeps_30_db(name):
    model, inputs, key = build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' own notes; what the sim keeps in float is asserted below
        sim = QuantizationSimModel(model, inputs(2, 8))
    assert sim.capture_method == "export", sim.capture_errors
    assert sim.float_ops == [] and sim.unquantized_modules == [], (sim.float_ops, sim.unquantized_modules)
    torch.manual_seed(1)
    sim.compute_encodings([inputs(3, 10) for _ in range(3)], progress=False)  # other batch and length
    x = inputs(4, 12)  # and yet another
    with torch.no_grad():
        ref, out = model(**x), sim.model(**x)
    assert type(out) is type(ref)
    assert sqnr_db(ref[key], out[key]) >= 30.0
