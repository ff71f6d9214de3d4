"""The seam between simulation and export: quanta.export takes any QuantizedModelLike, not only a
QuantizationSimModel (and never imports quanta.quantsim)."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator

import pytest
import torch
from torch import nn

from quanta.export.protocol import QuantizedModelLike, SimulationLike
from quanta.export.sim_encodings import apply_encodings, export_encodings, sim_encodings, tensor_names
from quanta.nn import QuantizationMixin
from quanta.quantization.base import QuantizerBase
from quanta.quantsim import QuantizationSimModel
from quanta.quantsim.report import layer_sqnr


class _Minimal:
    """Only what QuantizedModelLike names, over a sim's model: no QuantizationSimModel methods behind it."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def named_quantizers(self) -> Iterator[tuple[str, QuantizerBase]]:
        return ((n, m) for n, m in self.model.named_modules() if isinstance(m, QuantizerBase))

    def quantized_modules(self) -> Iterator[tuple[str, QuantizationMixin]]:
        return ((n, m) for n, m in self.model.named_children() if isinstance(m, QuantizationMixin))


torch.manual_seed(0)
_FLOAT = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
_X = torch.randn(16, 8)


def _new_sim() -> QuantizationSimModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return QuantizationSimModel(_FLOAT, _X)


@pytest.fixture(scope="module")
def sim():
    s = _new_sim()
    s.compute_encodings([_X], progress=False)
    return s, _X


def test_a_sim_is_both_protocols_and_a_module_is_neither(sim):
    s, _ = sim
    assert isinstance(s, QuantizedModelLike) and isinstance(s, SimulationLike)
    assert not isinstance(s.model, QuantizedModelLike)
    assert isinstance(_Minimal(s.model), QuantizedModelLike) and not isinstance(_Minimal(s.model), SimulationLike)


def test_encodings_of_any_quantized_model_like(sim):
    s, x = sim
    other = _Minimal(s.model)
    assert tensor_names(other) == tensor_names(s)
    acts, params = sim_encodings(other)
    ref_acts, ref_params = sim_encodings(s)
    assert sorted(acts) == sorted(ref_acts) and sorted(params) == sorted(ref_params)
    assert all(torch.equal(params[k].scale, ref_params[k].scale) for k in params)


def test_export_encodings_records_the_sim_defaults(sim, tmp_path):
    s, _ = sim
    export_encodings(s, tmp_path / "m.encodings", "1.0.0")
    doc = json.loads((tmp_path / "m.encodings").read_text())
    assert doc["quantizer_args"]["activation_bitwidth"] == s.default_output_bw
    assert doc["quantizer_args"]["quant_scheme"] == "min_max"  # aimet-torch 2.x's name
    assert doc["excluded_layers"] == list(s.unquantized_modules)


def test_apply_encodings_and_layer_sqnr_take_the_protocol(sim, tmp_path):
    s, x = sim
    export_encodings(s, tmp_path / "m.encodings", "1.0.0")
    fresh = _new_sim()
    assert not any(q.is_initialized() for _, q in fresh.named_quantizers())
    apply_encodings(_Minimal(fresh.model), tmp_path / "m.encodings")
    with torch.no_grad():
        assert torch.equal(fresh.model(x), s.model(x))
    report = layer_sqnr(_Minimal(s.model), [x])
    assert [r.name for r in report.layers] == [r.name for r in s.layer_sqnr([x]).layers]
    assert report.output_sqnr_db == s.layer_sqnr([x]).output_sqnr_db


def test_export_onnx_takes_the_protocol_and_refuses_a_module(sim, tmp_path):
    pytest.importorskip("onnx")
    from quanta.export.onnx import export_onnx

    s, x = sim
    assert export_onnx(_Minimal(s.model), tmp_path / "a.onnx", x) == export_onnx(s, tmp_path / "b.onnx", x)
    with pytest.raises(TypeError, match="QuantizationSimModel .*QuantizedModelLike.*got Sequential"):
        export_onnx(s.model, tmp_path / "c.onnx", x)
