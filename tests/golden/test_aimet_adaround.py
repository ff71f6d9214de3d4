"""quanta's AdaRound against aimet-torch 2.42's: the same adarounded weights and encodings file, bit for bit.

``aimet_adaround.json`` is written by ``generate_aimet_adaround.py`` in a venv with aimet-torch; the models, data
and configs are rebuilt here by that script (plain torch, same seeds), and torch's generator is seeded the same
way before AdaRound, which draws its samples from it.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

import generate_aimet_adaround as generator
from _record import golden_path, unpack
from quanta.adaround import Adaround, AdaroundParameters

GOLDEN = json.loads(pathlib.Path(golden_path("aimet_adaround.json")).read_text())  # this CPU's recording


@pytest.mark.parametrize("name", sorted(GOLDEN["cases"]))
def test_adarounded_weights_and_encodings_equal_aimets(name, tmp_path):
    kind, seed, config, bw, num_batches, batch_size, iterations, overrides, ignored = generator.CASES[name]
    case = GOLDEN["cases"][name]
    model, batches = generator.build(kind, seed, num_batches, batch_size)
    modules = dict(model.named_modules())
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps(GOLDEN["configs"][config]))
    params = AdaroundParameters(batches, num_batches=num_batches, default_num_iterations=iterations)
    before = {k: w.clone() for k, w in generator.weights(model).items()}
    torch.manual_seed(seed)
    ada = Adaround.apply_adaround(model, batches[0], params, path=tmp_path, filename_prefix="ada",
                                  default_param_bw=bw,
                                  param_bw_override_list=[(modules[n], b) for n, b in overrides.items()],
                                  ignore_quant_ops_list=[modules[n] for n in ignored],
                                  default_quant_scheme="post_training_tf", default_config_file=config_path)
    for key, w in generator.weights(ada).items():
        assert torch.equal(w.reshape(-1), unpack(case["weights"][key])), key
    for key, w in generator.weights(model).items():  # the model given is left as it was
        assert torch.equal(w, before[key]), key
    written = json.loads((tmp_path / "ada.encodings").read_text())["param_encodings"]
    assert sorted(written) == sorted(case["param_encodings"])
    for key, entries in case["param_encodings"].items():
        assert len(written[key]) == len(entries), key
        for ours, theirs in zip(written[key], entries):
            assert {k: ours[k] for k in theirs} == theirs, key
