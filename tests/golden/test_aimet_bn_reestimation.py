"""quanta's ``reestimate_bn_stats`` against aimet-torch 2.42's: the same running statistics, bit for bit.

``aimet_bn_reestimation.json`` is written by ``generate_aimet_bn_reestimation.py`` in a venv with aimet-torch; the
models and batches are rebuilt here by that script's ``build`` (plain torch, same seeds).
"""

from __future__ import annotations

import base64
import importlib.util
import json
import pathlib
import zlib

import numpy as np
import pytest
import torch

from _record import golden_path
from quanta.bn_reestimation import reestimate_bn_stats

HERE = pathlib.Path(__file__).parent
GOLDEN = json.loads(pathlib.Path(golden_path("aimet_bn_reestimation.json")).read_text())  # this CPU's recording
_spec = importlib.util.spec_from_file_location("generate_aimet_bn_reestimation",
                                               HERE / "generate_aimet_bn_reestimation.py")
generator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generator)


def _unpack(s: str) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(zlib.decompress(base64.b64decode(s)), dtype=np.float32).copy())


@pytest.mark.parametrize("name", sorted(GOLDEN["cases"]))
def test_reestimated_statistics_equal_aimets(name):
    case = GOLDEN["cases"][name]
    model, batches = generator.build(case["seed"])
    reestimate_bn_stats(model, batches, num_batches=case["num_batches"], progress=False)
    for i, bn in enumerate(generator.batch_norms(model)):
        assert torch.equal(bn.running_mean, _unpack(case["running_mean"][i])), f"BN {i} mean"
        assert torch.equal(bn.running_var, _unpack(case["running_var"][i])), f"BN {i} var"
