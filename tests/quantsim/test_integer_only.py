"""The built-in QuantSim default keeps elementwise Add outputs in float; ``quanta.quantsim.INTEGER_ONLY``
quantizes them. Immutability of the two configs, save/load/export round trips under both, QuantizedAdd used
directly, the Add->ReLU supergroup, and ``quanta quantize --config`` with INTEGER_ONLY as a JSON file."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
import warnings

import pytest
import torch
from torch import nn

import quanta.nn as qnn
import quanta.quantsim as qs
from quanta.cli import main
from quanta.quantsim import INTEGER_ONLY, QuantizationSimModel, QuantSimConfig
from quanta.quantsim.config import BUILTIN_DEFAULT
from tests.quantsim.quantsim_models import TransformerBlock


def _sim(model, x, config=None, calib=True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, x, config_file=config)
    if calib:
        g = torch.Generator().manual_seed(0)
        sim.compute_encodings([x + 0.1 * torch.randn(x.shape, generator=g) for _ in range(2)], progress=False)
    return sim


def _sub(sim, name):
    return sim.model.get_submodule(name)


def _adds(sim):
    return [(n, m) for n, m in sim.quantized_modules() if isinstance(m, qnn.QuantizedAdd)]


# ------------------------------------------------------------------ immutability
def test_mutating_loaded_integer_only_dict_changes_nothing():
    snap_i, snap_d = copy.deepcopy(INTEGER_ONLY), copy.deepcopy(BUILTIN_DEFAULT)
    d = QuantSimConfig.load(INTEGER_ONLY).to_dict()
    d["defaults"]["ops"]["is_symmetric"] = True
    d["op_type"]["Add"] = {"is_output_quantized": False}
    d["supergroups"].clear()
    d2 = QuantSimConfig.load().to_dict()
    d2["op_type"].clear()
    d2["defaults"]["params"]["is_quantized"] = False
    assert INTEGER_ONLY == snap_i and BUILTIN_DEFAULT == snap_d
    assert QuantSimConfig.load().to_dict()["op_type"]["Add"] == {"is_output_quantized": False}
    assert "Add" not in QuantSimConfig.load(INTEGER_ONLY).to_dict()["op_type"]


def test_integer_only_nested_dicts_do_not_alias_the_default():
    def dicts(d):
        if isinstance(d, dict):
            yield d
            for v in d.values():
                yield from dicts(v)
        elif isinstance(d, list):
            for v in d:
                yield from dicts(v)

    ids = {id(x) for x in dicts(BUILTIN_DEFAULT)}
    ids |= {id(x) for x in BUILTIN_DEFAULT.values() if isinstance(x, list)}
    shared = [x for x in dicts(INTEGER_ONLY) if id(x) in ids]
    shared += [v for v in INTEGER_ONLY.values() if isinstance(v, list) and id(v) in ids]
    assert shared == []


def test_user_edit_of_integer_only_does_not_change_the_default_sim():
    saved = copy.deepcopy(INTEGER_ONLY)
    try:
        INTEGER_ONLY["defaults"]["ops"]["is_symmetric"] = True
        INTEGER_ONLY["supergroups"].append({"op_list": ["Gemm", "Gelu"]})
        assert BUILTIN_DEFAULT["defaults"]["ops"]["is_symmetric"] is False
        assert {"op_list": ["Gemm", "Gelu"]} not in BUILTIN_DEFAULT["supergroups"]
    finally:
        INTEGER_ONLY.clear()
        INTEGER_ONLY.update(saved)


def test_integer_only_differs_from_default_only_by_add():
    a = QuantSimConfig.load(INTEGER_ONLY).to_dict()
    b = QuantSimConfig.load().to_dict()
    assert b["op_type"].pop("Add") == {"is_output_quantized": False}
    gemm_add = {"op_list": ["Gemm", "Add"]}
    assert gemm_add in b["supergroups"] and gemm_add not in a["supergroups"]  # the residual branch quantized too
    b["supergroups"].remove(gemm_add)
    assert a == b
    assert qs.INTEGER_ONLY is INTEGER_ONLY


# ------------------------------------------------------------------ placement
def test_quantized_add_direct_still_quantizes_its_output():
    add = qnn.QuantizedAdd()
    assert add.output_quantizers[0] is not None
    add.output_quantizers[0].set_range(0.0, 2.55)
    out = add(torch.tensor([0.5, 0.1234]), torch.tensor([0.123, 0.0]))
    assert torch.equal(out.as_subclass(torch.Tensor).detach(), torch.tensor([0.62, 0.12]))
    f = qnn.from_module(qnn.Add())
    assert f.output_quantizers[0] is not None


class AddRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        s = self.a(x) + self.b(x)
        return torch.relu(s), s * 2  # second: the add has another consumer (no supergroup possible?)


class PlainAddRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.a(x) + x)


@pytest.mark.parametrize("config", [None, INTEGER_ONLY], ids=["default", "integer_only"])
def test_supergroup_add_relu(config):
    torch.manual_seed(0)
    sim = _sim(PlainAddRelu().eval(), torch.randn(4, 8), config)
    assert _sub(sim, "add").output_quantizers[0] is None
    assert _sub(sim, "relu").output_quantizers[0] is not None
    with torch.no_grad():
        out = sim.model(torch.randn(4, 8)).as_subclass(torch.Tensor)
    assert torch.unique(out).numel() <= 256


def test_add_with_two_consumers_quantized_only_under_integer_only():
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    d = _sim(AddRelu().eval(), x)
    i = _sim(AddRelu().eval(), x, INTEGER_ONLY)
    assert all(m.output_quantizers[0] is None for _, m in _adds(d))
    assert all(m.output_quantizers[0] is not None for _, m in _adds(i))
    with torch.no_grad():
        od, oi = d.model(x), i.model(x)
    assert not torch.equal(od[1].as_subclass(torch.Tensor), oi[1].as_subclass(torch.Tensor))


# ------------------------------------------------------------------ round trips on TransformerBlock
@pytest.mark.parametrize("config", [None, INTEGER_ONLY], ids=["default", "integer_only"])
def test_transformer_save_load_encodings_round_trip(config, tmp_path):
    torch.manual_seed(0)
    model = TransformerBlock().eval()
    x = torch.randn(2, 6, 32)
    sim = _sim(model, x, config)
    adds = _adds(sim)
    assert len(adds) == 2
    assert all((m.output_quantizers[0] is not None) == (config is INTEGER_ONLY) for _, m in adds)
    with torch.no_grad():
        ref = sim.model(x).as_subclass(torch.Tensor)
    for version in (None, "1.0.0", "2.0.0"):
        path = tmp_path / f"enc_{version}.json"
        sim.save_encodings(path, version=version)
        other = _sim(model, x, config, calib=False)
        other.load_encodings(path, partial=False)
        with torch.no_grad():
            assert torch.equal(other.model(x).as_subclass(torch.Tensor), ref), version
        assert _names_an_add_output(json.loads(path.read_text())) == (config is INTEGER_ONLY), version


def _names_an_add_output(enc: dict) -> bool:
    """Whether an encodings file (quanta's own, AIMET's module-keyed 1.0.0 or 2.0.0 layout) has an entry for
    an add's output."""
    if "quantizers" in enc:  # quanta's: "<module>.output_quantizers.<i>"
        return any(k.startswith(("add.output", "add_1.output")) for k in enc["quantizers"])
    if isinstance(enc.get("activation_encodings"), dict):  # AIMET's module -> "output" -> index
        return any("output" in enc["activation_encodings"].get(m, {}) for m in ("add", "add_1"))
    return any(e["name"].startswith(("add.output", "add_1.output")) for e in enc["encodings"])


def test_encodings_of_integer_only_rejected_by_default_sim_strict(tmp_path):
    """An INTEGER_ONLY encodings file names the adds' output quantizers, which a default sim does not have:
    strict loading must refuse it (naming the entry) rather than silently ignore it."""
    torch.manual_seed(0)
    model = TransformerBlock().eval()
    x = torch.randn(2, 6, 32)
    sim = _sim(model, x, INTEGER_ONLY)
    path = tmp_path / "io.json"
    sim.save_encodings(path)
    other = _sim(model, x, None, calib=False)
    with pytest.raises(ValueError, match="add"):
        other.load_encodings(path, strict=True)


@pytest.mark.parametrize("config", [None, INTEGER_ONLY], ids=["default", "integer_only"])
def test_transformer_export(config, tmp_path):
    pytest.importorskip("onnx")
    torch.manual_seed(0)
    model = TransformerBlock().eval()
    x = torch.randn(2, 6, 32)
    sim = _sim(model, x, config)
    names = sim.export(tmp_path, "blk", x)
    enc = json.loads((tmp_path / "blk.encodings").read_text())
    assert (tmp_path / "blk.onnx").stat().st_size > 0
    add_q = [k for k in names if k.startswith(("add.", "add_1.")) and "output" in k]
    assert (len(add_q) == 2) == (config is INTEGER_ONLY), names
    assert enc  # AIMET encodings written
    try:
        import onnxruntime as ort
    except ImportError:
        return
    options = ort.SessionOptions()  # the QDQ graph as written: onnxruntime's extended optimisations run
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # integer kernels of their own
    s = ort.InferenceSession(str(tmp_path / "blk.onnx"), options, providers=["CPUExecutionProvider"])
    out = s.run(None, {s.get_inputs()[0].name: x.numpy()})[0]
    with torch.no_grad():
        ref = sim.model(x).as_subclass(torch.Tensor).numpy()
    step = float(sim.model.add_1.output_quantizers[0].get_scale()) if config is INTEGER_ONLY else 0.0
    assert abs(out - ref).max() <= step + 1e-5  # within one step of the output quantizer (float where none)


# ------------------------------------------------------------------ CLI
SOURCE = '''
import torch
from torch import nn


class ResNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 4)

    def forward(self, x):
        return self.b(self.a(x) + x)
'''
MODULE = "quanta_test_intonly_nets"


def test_cli_quantize_with_integer_only_json(tmp_path, monkeypatch, capsys):
    (tmp_path / f"{MODULE}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location(MODULE, tmp_path / f"{MODULE}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    torch.save(mod.ResNetish().state_dict(), tmp_path / "m.pt")
    torch.save(torch.randn(40, 8), tmp_path / "calib.pt")
    (tmp_path / "io.json").write_text(json.dumps(INTEGER_ONLY))
    results = {}
    for tag, extra in (("io", ["--config", "io.json"]), ("default", [])):
        code = main(["quantize", "m.pt", "--model-class", f"{MODULE}:ResNetish", "--calib", "calib.pt",
                     "--out", f"out_{tag}", "--no-onnx", "--no-progress", *extra])
        capsys.readouterr()
        assert code == 0
        results[tag] = json.loads((tmp_path / f"out_{tag}" / "quantsim.encodings.json").read_text())["quantizers"]
    assert any(k.startswith("add.output") for k in results["io"]), list(results["io"])
    assert not any(k.startswith("add.output") for k in results["default"]), list(results["default"])
    # INTEGER_ONLY quantizes the add (its output, and the model input it reads) and the Linear feeding it (fused
    # with the add by the default's Gemm -> Add)
    assert set(results["io"]) - set(results["default"]) == {k for k in results["io"]
                                                             if k.startswith(("add.", "a.output"))}
    sys.modules.pop(MODULE, None)
