"""quanta's Sequential MSE against aimet-torch 2.42's: the same chosen weight ranges, bit for bit.

``aimet_seq_mse.json`` is written by ``generate_aimet_seq_mse.py`` in a venv with aimet-torch; the models, data,
sims and per-block quantizers are rebuilt here as that script builds them (plain torch, same seeds).
"""

from __future__ import annotations

import json
import pathlib
import warnings

import pytest
import torch

import generate_aimet_seq_mse as generator
from _record import unpack
from quanta.quantization.affine import QuantizeDequantize
from quanta.quantsim import QuantizationSimModel
from quanta.seq_mse import SeqMseParams, apply_seq_mse

HERE = pathlib.Path(__file__).parent
GOLDEN = json.loads((HERE / "aimet_seq_mse.json").read_text())


@pytest.mark.parametrize("name", sorted(GOLDEN["cases"]))
def test_chosen_ranges_equal_aimets(name, tmp_path):
    kind, seed, bits, blocks, candidates, symmetry, loss = generator.CASES[name]
    model, data = generator.build(kind, seed)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(GOLDEN["config"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, data[0], quant_scheme="post_training_tf", default_param_bw=bits,
                                   config_file=config)
        for layer, size in blocks.items():
            m = sim.model.get_submodule(layer)
            out_f, in_f = m.weight.shape
            m.param_quantizers["weight"] = QuantizeDequantize((out_f, in_f // size), bits, True, block_size=(1, size))
        params = SeqMseParams(num_batches=len(data), num_candidates=candidates, inp_symmetry=symmetry, loss_fn=loss)
        apply_seq_mse(model, sim, data, params, progress=False)
    for layer, expected in GOLDEN["cases"][name].items():
        q = sim.model.get_submodule(layer).param_quantizers["weight"]
        assert torch.equal(q.get_min().detach().reshape(-1), unpack(expected["min"])), layer
        assert torch.equal(q.get_max().detach().reshape(-1), unpack(expected["max"])), layer
