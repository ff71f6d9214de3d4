"""quanta's ``reestimate_bn_stats`` against aimet-torch 2.42's: the same running statistics, bit for bit.

``aimet_bn_reestimation.json`` is written by ``generate_aimet_bn_reestimation.py`` in a venv with aimet-torch; the
models and batches are rebuilt here by that script's ``build`` (plain torch, same seeds).
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

import generate_aimet_bn_reestimation as generator
from _record import golden_path, unpack
from quanta.bn_reestimation import reestimate_bn_stats

GOLDEN = json.loads(pathlib.Path(golden_path("aimet_bn_reestimation.json")).read_text())  # this CPU's recording


@pytest.mark.parametrize("name", sorted(GOLDEN["cases"]))
def test_reestimated_statistics_equal_aimets(name):
    case = GOLDEN["cases"][name]
    model, batches = generator.build(case["seed"])
    reestimate_bn_stats(model, batches, num_batches=case["num_batches"], progress=False)
    for i, bn in enumerate(generator.batch_norms(model)):
        assert torch.equal(bn.running_mean, unpack(case["running_mean"][i])), f"BN {i} mean"
        assert torch.equal(bn.running_var, unpack(case["running_var"][i])), f"BN {i} var"
