"""The QuantSim config key ``block_format``: MX/NVFP4 weight quantizers from a config file, its precedence, its
errors, and the exports that refuse it by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from quanta.quantization.float import BlockScaledQuantizeDequantize
from quanta.quantsim import QuantizationSimModel
from quanta.quantsim.config import QuantSimConfig

BASE = {"defaults": {"ops": {"is_output_quantized": "True"},
                     "params": {"is_quantized": "True", "is_symmetric": "True"}},
        "params": {"bias": {"is_quantized": "False"}}}


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten(), nn.Linear(8 * 6 * 6, 64), nn.ReLU(), nn.Linear(64, 10))


def test_block_format_on_linear_weights(tmp_path):
    cfg = {**BASE, "op_type": {"Gemm": {"params": {"weight": {"block_format": "nvfp4"}}}}}
    model, x = _model(), torch.randn(4, 3, 8, 8)
    sim = QuantizationSimModel(model, x, config_file=cfg)
    kinds = {n: type(q).__name__ for n, q in sim.named_quantizers() if ".param_quantizers." in n}
    assert kinds == {"0.param_quantizers.weight": "QuantizeDequantize",
                     "2.param_quantizers.weight": "BlockScaledQuantizeDequantize",
                     "4.param_quantizers.weight": "BlockScaledQuantizeDequantize"}
    sim.compute_encodings(lambda m: m(x))
    q = sim.model.get_submodule("2").param_quantizers["weight"]
    assert torch.equal(q.global_amax, model[2].weight.detach().abs().max())
    with pytest.raises(NotImplementedError, match="2.param_quantizers.weight is a BlockScaledQuantizeDequantize"):
        sim.save_encodings(tmp_path / "e.json")


def test_precedence_and_specs():
    cfg = QuantSimConfig.load({**BASE, "op_type": {"Gemm": {"params": {"weight": {"block_format": "mxfp4"}}}},
                               "module_name": {"head": {"params": {"weight": {"block_size": 32, "bitwidth": 4}}}}})
    assert cfg.param_spec("fc", ("Linear", "Gemm"), "weight").block_format == "mxfp4"
    head = cfg.param_spec("head", ("Linear", "Gemm"), "weight")
    assert head.block_format is None and head.block_size == 32  # the more specific level decides
    assert cfg.param_spec("conv", ("Conv2d", "Conv"), "weight").block_format is None


@pytest.mark.parametrize("entry, words", [
    ({"block_format": "mxfp5"}, "expected one of"),
    ({"block_format": "mxfp4", "block_size": 32}, "bring their own blocks"),
    ({"block_format": 4}, "expected one of"),
])
def test_bad_entries(entry, words):
    with pytest.raises(ValueError, match=words):
        QuantSimConfig.load({**BASE, "params": {"weight": entry}})


def test_weights_the_blocks_do_not_tile_are_refused():
    cfg = {**BASE, "op_type": {"Conv": {"params": {"weight": {"block_format": "mxfp8_e4m3"}}}}}
    with pytest.raises(ValueError, match=r"0.weight: block_format 'mxfp8_e4m3' quantizes 2-D \[out, in\] weights"):
        QuantizationSimModel(_model(), torch.randn(1, 3, 8, 8), config_file=cfg)
    assert BlockScaledQuantizeDequantize("mxfp4").format.block_size == 32
