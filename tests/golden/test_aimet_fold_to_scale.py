"""quanta's ``fold_all_batch_norms_to_scale`` against aimet-torch 2.42's on the same sim.

``aimet_fold_to_scale.json`` is written by ``generate_aimet_fold_to_scale.py`` (run it in a venv with aimet-torch);
the model, config and input are rebuilt by that script's own functions (one recording per CPU vector width, see
``_record.py``). The sim's outputs before and after the
fold must be AIMET's bit for bit; the folded weights, biases and weight ranges to float32 rounding (quanta folds
in float64, AIMET in float32).
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

import generate_aimet_fold_to_scale as generator
from _record import golden_path, unpack
from quanta.batch_norm_fold import fold_all_batch_norms_to_scale
from quanta.quantsim import QuantizationSimModel

GOLDEN = json.loads(pathlib.Path(golden_path("aimet_fold_to_scale.json")).read_text())  # this CPU's recording


@pytest.mark.parametrize("name", sorted(GOLDEN["cases"]))
def test_fold_to_scale_matches_aimet(name):
    case = GOLDEN["cases"][name]
    x = generator.inputs()
    sim = QuantizationSimModel(generator.build(), x, config_file=generator.CONFIG, default_param_bw=case["bits"])
    sim.compute_encodings([x], progress=False)
    with torch.no_grad():
        before = sim.model(x).as_subclass(torch.Tensor)
    assert torch.equal(before, unpack(case["before"], before.shape))
    assert len(fold_all_batch_norms_to_scale(sim)) == case["folded"]
    with torch.no_grad():
        after = sim.model(x).as_subclass(torch.Tensor)
    assert torch.equal(after, unpack(case["after"], after.shape))
    for i, n in enumerate(generator.LAYERS):
        m = sim.model.get_submodule(n)
        q = m.param_quantizers["weight"]
        for got, key in ((m.weight, "weights"), (m.bias, "biases"), (q.min, "min"), (q.max, "max")):
            torch.testing.assert_close(got.detach(), unpack(case[key][i], got.shape), rtol=2e-6, atol=1e-7,
                                       msg=lambda msg, key=key, n=n: f"{n} {key}: {msg}")
