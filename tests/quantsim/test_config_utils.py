"""quanta.quantsim.config_utils: blockwise and LPBQ weight quantizers set on a built sim (AIMET's API)."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch import nn

from quanta.quantization.affine import GroupedBlockQuantizeDequantize, QuantizeDequantize
from quanta.quantsim import QuantizationSimModel
from quanta.quantsim.config_utils import (
    set_blockwise_quantization_for_weights,
    set_grouped_blockwise_quantization_for_weights,
)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3)
        self.up = nn.ConvTranspose2d(16, 8, 2)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(self.up(torch.relu(self.conv(x))).mean((2, 3)))


def _sim() -> tuple[QuantizationSimModel, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return QuantizationSimModel(Net().eval(), x), x


def _weight_quantizer(sim, name):
    return sim.model.get_submodule(name).param_quantizers["weight"]


def test_int_block_size_runs_along_input_channels_per_output_channel():
    sim, x = _sim()
    set_grouped_blockwise_quantization_for_weights(sim, [nn.Conv2d, nn.ConvTranspose2d, nn.Linear], bitwidth=4,
                                                   symmetric=True, decompressed_bw=8, block_size=4)
    conv, up, fc = (_weight_quantizer(sim, n) for n in ("conv", "up", "fc"))
    assert all(type(q) is GroupedBlockQuantizeDequantize for q in (conv, up, fc))
    assert (conv.shape, conv.block_size, conv.block_grouping) == ((16, 2, 1, 1), (1, 4, -1, -1), (1, -1, 1, 1))
    # ConvTranspose2d weight (in, out, kh, kw): input channels are dim 0, output channels dim 1
    assert (up.shape, up.block_size, up.block_grouping) == ((4, 8, 1, 1), (4, 1, -1, -1), (-1, 1, 1, 1))
    assert (fc.shape, fc.block_size) == ((4, 2), (1, 4))
    sim.compute_encodings([x], progress=False)
    with torch.no_grad():
        w = sim.model.get_submodule("fc").weight
        assert torch.equal(sim.model.get_submodule("fc")._qparam("weight").as_subclass(torch.Tensor),
                           fc(w).as_subclass(torch.Tensor))
        assert torch.isfinite(sim.model(x)).all()


def test_blockwise_selection_by_module_and_predicate():
    sim, _ = _sim()
    fc = sim.model.get_submodule("fc")
    set_blockwise_quantization_for_weights(sim, [fc], bitwidth=4, symmetric=True, block_size=(1, 2))
    assert type(_weight_quantizer(sim, "fc")) is QuantizeDequantize and _weight_quantizer(sim, "fc").shape == (4, 4)
    assert _weight_quantizer(sim, "conv").shape == (16, 1, 1, 1)  # not selected: per channel as before
    set_blockwise_quantization_for_weights(sim, lambda m: isinstance(m, nn.Conv2d), bitwidth=8, symmetric=True,
                                           block_size=2)
    assert _weight_quantizer(sim, "conv").shape == (16, 4, 1, 1)


def test_lpbq_sim_saves_loads_and_exports_to_onnx(tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    sim, x = _sim()
    set_grouped_blockwise_quantization_for_weights(sim, [nn.Conv2d, nn.Linear], bitwidth=4, symmetric=True,
                                                   decompressed_bw=8, block_size=4)
    sim.compute_encodings([x], progress=False)
    with torch.no_grad():
        expected = sim.model(x)
    sim.save_encodings(tmp_path / "sim.json")
    again, _ = _sim()
    set_grouped_blockwise_quantization_for_weights(again, [nn.Conv2d, nn.Linear], bitwidth=4, symmetric=True,
                                                   decompressed_bw=8, block_size=4)
    again.load_encodings(tmp_path / "sim.json")
    with torch.no_grad():
        assert torch.equal(again.model(x), expected)
    sim.export(tmp_path, "lpbq", x)
    session = onnxruntime.InferenceSession(os.fspath(tmp_path / "lpbq.onnx"))
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    step = float(_output_scale(sim))
    torch.testing.assert_close(torch.from_numpy(out), expected, rtol=0, atol=step * 1.001)


def _output_scale(sim):
    return sim.model.get_submodule("fc").output_quantizers[0].get_scale()


def test_bad_arguments_are_named():
    sim, _ = _sim()
    with pytest.raises(ValueError, match=r"block_size 3 does not divide the weight of conv \(16, 8, 3, 3\)"):
        set_blockwise_quantization_for_weights(sim, [nn.Conv2d], bitwidth=4, symmetric=True, block_size=3)
    assert type(_weight_quantizer(sim, "conv")) is QuantizeDequantize and _weight_quantizer(sim, "conv").shape[1] == 1
    with pytest.raises(TypeError, match="arg must be a list of module types"):
        set_blockwise_quantization_for_weights(sim, "fc", bitwidth=4, symmetric=True, block_size=4)
    with pytest.raises(ValueError, match="one int per dimension"):
        set_blockwise_quantization_for_weights(sim, [nn.Linear], bitwidth=4, symmetric=True, block_size=(1, 2, 2))
    with pytest.raises(ValueError, match="symmetric must be True"):
        set_grouped_blockwise_quantization_for_weights(sim, [nn.Linear], bitwidth=4, symmetric=False,
                                                       decompressed_bw=8, block_size=4)


# -- LPBQ from a config file (quanta's param keys decompressed_bw / block_grouping) ----------------------------
def _lpbq_config(conv: dict, fc: dict) -> dict:
    from quanta.quantsim.config import BUILTIN_DEFAULT

    op_type = {**BUILTIN_DEFAULT["op_type"], "Conv": {"params": {"weight": conv}}, "Gemm": {"params": {"weight": fc}}}
    return {**BUILTIN_DEFAULT, "op_type": op_type}


def test_lpbq_from_a_config_file_is_the_sim_config_utils_makes():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 6)
    cfg = _lpbq_config({"bitwidth": 4, "block_size": 4, "decompressed_bw": 8},
                       {"bitwidth": 4, "block_size": 2, "decompressed_bw": 6, "block_grouping": 2})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from_file = QuantizationSimModel(Net().eval(), x, config_file=cfg)
    by_api, _ = _sim()
    set_grouped_blockwise_quantization_for_weights(by_api, [nn.Conv2d], bitwidth=4, symmetric=True,
                                                   decompressed_bw=8, block_size=4)
    set_grouped_blockwise_quantization_for_weights(by_api, [nn.Linear], bitwidth=4, symmetric=True,
                                                   decompressed_bw=6, block_size=2, block_grouping=2)
    for name in ("conv", "fc"):
        q, ref = _weight_quantizer(from_file, name), _weight_quantizer(by_api, name)
        assert type(q) is GroupedBlockQuantizeDequantize
        assert (q.shape, q.block_size, q.block_grouping, q.decompressed_bw, q.bitwidth) == \
               (ref.shape, ref.block_size, ref.block_grouping, ref.decompressed_bw, ref.bitwidth)
    assert _weight_quantizer(from_file, "fc").block_grouping == (1, 2)
    assert type(_weight_quantizer(from_file, "up")) is QuantizeDequantize  # ConvTranspose: not named
    for sim in (from_file, by_api):
        sim.compute_encodings([x], progress=False)
    with torch.no_grad():
        assert torch.equal(from_file.model(x), by_api.model(x))
    q = _weight_quantizer(from_file, "fc")
    per_group = q.get_per_channel_scale()
    assert per_group.shape == (4, 2)  # every pair of blocks under one float scale
    assert torch.equal(per_group.repeat_interleave(2, 1) * q.get_per_block_int_scale(), q.get_scale())


def test_lpbq_config_keys_round_trip_and_resolve():
    from quanta.quantsim import QuantSimConfig

    cfg = QuantSimConfig.load(_lpbq_config({"bitwidth": 4, "block_size": 4, "decompressed_bw": 8},
                                           {"block_size": 2, "decompressed_bw": 8, "block_grouping": 2}))
    assert QuantSimConfig.load(cfg.to_dict()) == cfg
    conv = cfg.param_spec("conv", ("Conv2d", "Conv"), "weight")
    assert (conv.block_size, conv.decompressed_bw, conv.block_grouping, conv.bitwidth) == (4, 8, -1, 4)
    fc = cfg.param_spec("fc", ("Linear", "Gemm"), "weight")
    assert (fc.block_size, fc.decompressed_bw, fc.block_grouping, fc.bitwidth) == (2, 8, 2, None)
    # a module entry saying only per_channel_quantization makes it per channel again: LPBQ off
    plain = QuantSimConfig.load({**cfg.to_dict(), "module_name": {
        "fc": {"params": {"weight": {"per_channel_quantization": True}}}}})
    spec = plain.param_spec("fc", ("Linear", "Gemm"), "weight")
    assert (spec.per_channel, spec.block_size, spec.decompressed_bw, spec.block_grouping) == (True, None, None, None)


@pytest.mark.parametrize("weight, message", [
    ({"bitwidth": 8, "block_size": 4, "decompressed_bw": 4},
     r"\['weight'\]\['decompressed_bw'\]: must be at least bitwidth \(8\), got 4"),
    ({"block_size": 4, "decompressed_bw": 8, "block_grouping": 0},
     r"\['block_grouping'\]: expected -1 \(every block of an output channel\) or a positive integer"),
    ({"decompressed_bw": 8, "per_channel_quantization": False},
     r"\['decompressed_bw'\]: LPBQ blocks are per output channel"),
    ({"decompressed_bw": 8}, r"decompressed_bw 8 \(LPBQ\) with no block_size"),
    ({"block_grouping": 2}, r"block_grouping 2 without decompressed_bw"),
    ({"bitwidth": 4, "block_size": 4, "decompressed_bw": 8, "is_symmetric": False},
     r"LPBQ \(decompressed_bw 8\) needs a symmetric per-block weight"),
])
def test_bad_lpbq_config_entries_are_named(weight, message):
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=message), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        QuantizationSimModel(Net().eval(), torch.randn(2, 8, 6, 6), config_file=_lpbq_config(weight, {}))


def test_docs_lpbq_example_loads():
    import json
    import pathlib
    import re

    from quanta.quantsim import QuantSimConfig

    docs = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "guides" / "quantsim-config.md").read_text()
    (block,) = [b for b in re.findall(r"```json\n(.*?)\n```", docs, re.S) if "decompressed_bw" in b]
    spec = QuantSimConfig.load(json.loads(block)).param_spec("fc", ("Linear", "Gemm"), "weight")
    assert (spec.bitwidth, spec.block_size, spec.decompressed_bw, spec.block_grouping) == (4, 64, 8, -1)
