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
