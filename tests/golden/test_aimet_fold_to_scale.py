"""quanta's ``fold_all_batch_norms_to_scale`` against aimet-torch 2.42's on the same sim.

``aimet_fold_to_scale.json`` is written by ``generate_aimet_fold_to_scale.py`` (run it in a venv with aimet-torch);
the model, config and input are rebuilt by that script's own functions (one recording per CPU vector width, see
``_record.py``). The sim's outputs before and after the
fold must be AIMET's bit for bit; the folded weights, biases and weight ranges to float32 rounding (quanta folds
in float64, AIMET in float32).
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
from quanta.batch_norm_fold import fold_all_batch_norms_to_scale
from quanta.quantsim import QuantizationSimModel

HERE = pathlib.Path(__file__).parent
GOLDEN = json.loads(pathlib.Path(golden_path("aimet_fold_to_scale.json")).read_text())  # this CPU's recording
_spec = importlib.util.spec_from_file_location("generate_aimet_fold_to_scale", HERE / "generate_aimet_fold_to_scale.py")
generator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generator)


def _unpack(s: str, like: torch.Tensor) -> torch.Tensor:
    raw = zlib.decompress(base64.b64decode(s))
    return torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy()).reshape(like.shape)


@pytest.mark.parametrize("name", sorted(GOLDEN["cases"]))
def test_fold_to_scale_matches_aimet(name):
    case = GOLDEN["cases"][name]
    x = generator.inputs()
    sim = QuantizationSimModel(generator.build(), x, config_file=generator.CONFIG, default_param_bw=case["bits"])
    sim.compute_encodings([x], progress=False)
    with torch.no_grad():
        before = sim.model(x).as_subclass(torch.Tensor)
    assert torch.equal(before, _unpack(case["before"], before))
    assert len(fold_all_batch_norms_to_scale(sim)) == case["folded"]
    with torch.no_grad():
        after = sim.model(x).as_subclass(torch.Tensor)
    assert torch.equal(after, _unpack(case["after"], after))
    for i, n in enumerate(generator.LAYERS):
        m = sim.model.get_submodule(n)
        q = m.param_quantizers["weight"]
        for got, key in ((m.weight, "weights"), (m.bias, "biases"), (q.min, "min"), (q.max, "max")):
            torch.testing.assert_close(got.detach(), _unpack(case[key][i], got), rtol=2e-6, atol=1e-7,
                                       msg=lambda msg, key=key, n=n: f"{n} {key}: {msg}")
