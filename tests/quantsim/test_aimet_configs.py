"""AIMET's own quantsim config files: each of the 19 that aimet-torch 2.42 ships (copied unchanged to
``aimet_configs/``) loads with the meaning AIMET gives each key, and the same model, data and file give the sim
aimet-torch builds: the same quantizers (placement, bitwidth, symmetry, grid, granularity, fixed ranges, shared
quantizers) with the same encodings, bit for bit, and the same outputs.

AIMET's side is recorded by ``tests/golden/generate_aimet_quantsim_configs.py`` (``aimet_quantsim_configs.json``):
its recommended flow, ``prepare_model`` then ``QuantizationSimModel(prepared, dummy, config_file=...)`` with its
defaults (MinMax, W8A8), ``compute_encodings`` on seeded batches, on the two models of ``aimet_config_models.py``.

Module names: AIMET's model preparer makes a module for each functional op and names it ``module_<op>`` with a
``_<k>`` suffix from the second on (``module_add``, ``module_add_1``, ``module_matmul_1``); quanta's capture
names the module it makes for the same op ``<op>``, counting the same ops in the same graph order (``add``,
``add_1``, ``matmul_1``). :func:`quanta_name` maps one to the other by dropping the ``module_`` prefix (checked:
the mapped names are exactly quanta's quantized modules that hold a quantizer); every other module keeps its own
name in both.

Two departures are kept, each asserted here as it is (docs/guides/quantsim-config.md gives the measurements):

* eNPU files (symmetric activations) fix Sigmoid and Softmax outputs to [0, 1]: on a symmetric grid AIMET's range
  becomes [-0.502, 0.498] and clips every output above one half; quanta gives the symmetric range that covers
  [0, 1]. The quantizers downstream of them then see other values, so their encodings are not compared.
* dsp_quantsim_config.json (asymmetric weights): after calibration AIMET re-derives a Linear's weight range from
  its scale and offset (part of its int32 bias-overflow protection), which moves an asymmetric weight's scale by
  one float32 ulp; the fake-quantized weights and the sim's outputs are identical.
"""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from aimet_config_models import make_inputs, make_model
from _record import golden_path, pack, unpack
from quanta.quantization.affine import QuantizeDequantize
from quanta.quantsim import QuantizationSimModel, QuantSimConfig
from quanta.quantsim.config import SUPERGROUP_PASSES

HERE = pathlib.Path(__file__).parent
CONFIGS = sorted((HERE / "aimet_configs").glob("*.json"))
GOLDEN = json.loads(pathlib.Path(golden_path("aimet_quantsim_configs.json")).read_text())  # this CPU's
MODELS = ("cnn", "transformer")
ENPU_CONSTRAINED = {"cnn": "sigmoid", "transformer": "softmax"}  # the [0, 1] outputs of the eNPU departure


def quanta_name(aimet_name: str) -> str:
    """The quanta module for AIMET's (prepared model's) module name."""
    return aimet_name.removeprefix("module_")


def _values(t: torch.Tensor) -> list[float]:
    return [float(v) for v in t.detach().to(torch.float32).flatten()]


def _describe(q: QuantizeDequantize, ids: dict[int, int]) -> dict:
    """A quanta quantizer in the golden file's terms."""
    fixed = {end: None if q.is_overwrite_allowed(end) else _values(getattr(q, end)) for end in ("min", "max")}
    return {"id": ids.setdefault(id(q), len(ids)), "bitwidth": q.bitwidth, "symmetric": q.symmetric,
            "signed": q.grid.qmin < 0, "qmin": q.grid.qmin, "qmax": q.grid.qmax, "shape": list(q.shape),
            "fixed_min": fixed["min"], "fixed_max": fixed["max"],
            **{k: pack(getattr(q, f"get_{k}")()) for k in ("scale", "offset", "min", "max")}}


def _slots(modules: dict, rename=lambda name: name) -> dict[tuple, dict]:
    """``{(module, "inputs" / "outputs" / "params", index or name): quantizer entry}`` for every quantizer."""
    out = {}
    for name, entry in modules.items():
        for kind in ("inputs", "outputs"):
            for i, q in enumerate(entry[kind]):
                if q is not None:
                    out[(rename(name), kind, i)] = q
        for p, q in entry["params"].items():
            if q is not None:
                out[(rename(name), "params", p)] = q
    return out


def _shared(slots: dict[tuple, dict]) -> list[list[tuple]]:
    groups: dict[int, list[tuple]] = {}
    for key, q in slots.items():
        groups.setdefault(q["id"], []).append(key)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def _quanta_sim(config: pathlib.Path, model_name: str) -> tuple[QuantizationSimModel, torch.Tensor]:
    model = make_model(model_name)
    sim = QuantizationSimModel(model, make_inputs(model_name, n=2, seed=99), config_file=config)
    batches = [make_inputs(model_name, n=4, seed=s) for s in GOLDEN["calibration_seeds"]]
    sim.compute_encodings(batches, progress=False)
    with torch.no_grad():
        out = sim.model(make_inputs(model_name, n=2, seed=GOLDEN["eval_seed"]))
    return sim, out


# -- every file loads ------------------------------------------------------------------------------------------
def test_the_nineteen_files_are_the_recorded_ones():
    assert len(CONFIGS) == 19
    assert [p.name for p in CONFIGS] == sorted(GOLDEN["configs"])


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_file_loads(path):
    raw = json.loads(path.read_text())
    cfg = QuantSimConfig.load(path)
    assert QuantSimConfig.load(cfg.to_dict()) == cfg
    assert cfg.hw_version == raw["defaults"].get("hw_version")
    assert cfg.supergroup_passes == tuple(raw.get("supergroup_pass_list", ()))
    assert cfg.supergroups == tuple(tuple(g["op_list"]) for g in raw["supergroups"])
    for op_type, entry in raw["op_type"].items():
        if "encoding_constraints" in entry:  # open ends ("Relu": {"min": 0.0}) are calibrated
            c = entry["encoding_constraints"]
            assert cfg.encoding_constraints("m", (op_type,)) == (c.get("min"), c.get("max"))


def test_supergroup_pass_list():
    cfg = QuantSimConfig.load({"supergroup_pass_list": ["MatmulAdd", "LayerNormalization", "MatmulAdd"]})
    assert cfg.supergroup_passes == ("MatmulAdd", "LayerNormalization")
    assert cfg.to_dict()["supergroup_pass_list"] == ["MatmulAdd", "LayerNormalization"]
    assert set(SUPERGROUP_PASSES) == {"LayerNormalization", "RMSNormalization", "MatmulAdd"}
    with pytest.raises(ValueError, match=r"config\['supergroup_pass_list'\]\[0\]: unknown supergroup pass "
                                         r"'MatMulAdd' \(did you mean 'MatmulAdd'\?\); known passes"):
        QuantSimConfig.load({"supergroup_pass_list": ["MatMulAdd"]})
    with pytest.raises(ValueError, match="expected a list of pass names"):
        QuantSimConfig.load({"supergroup_pass_list": "MatmulAdd"})


def test_matmul_add_pass_keeps_a_matmul_by_a_weight_and_its_bias_add_as_one_op():
    class Written(torch.nn.Module):  # a Linear written out, as an ONNX MatMul + Add
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(8, 4))
            self.bias = torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            return torch.matmul(x, self.weight) + self.bias

    base = {"defaults": {"ops": {"is_output_quantized": True}, "params": {"is_quantized": True}},
            "params": {"bias": {"is_quantized": False}}}
    x = torch.randn(2, 8)
    without = QuantizationSimModel(Written(), x, config_file=base)
    with_pass = QuantizationSimModel(Written(), x, config_file={**base, "supergroup_pass_list": ["MatmulAdd"]})
    assert without.model.matmul.output_quantizers[0] is not None
    assert with_pass.model.matmul.output_quantizers[0] is None  # fused with the bias add
    assert with_pass.model.add.output_quantizers[0] is not None
    assert with_pass.model.add.input_quantizers[1] is None  # the bias, a parameter named "bias": not quantized


def test_a_fixed_lower_end_leaves_the_upper_one_calibrated():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4), torch.nn.Tanh())
    cfg = {"defaults": {"ops": {"is_output_quantized": True}, "params": {"is_quantized": True}},
           "op_type": {"Relu": {"encoding_constraints": {"min": 0.0}},
                       "Tanh": {"encoding_constraints": {"min": -1.0, "max": 1.0}}}}
    sim = QuantizationSimModel(model, torch.randn(2, 4), config_file=cfg)
    m = dict(sim.named_qmodules())
    relu, tanh = m["1"].output_quantizers[0], m["3"].output_quantizers[0]
    assert m["0"].output_quantizers[0] is relu  # AIMET's propagation: the Linear's output takes the ReLU's
    assert not relu.is_overwrite_allowed("min") and relu.is_overwrite_allowed("max")
    assert tanh.symmetric and (tanh.qmin, tanh.qmax) == (0, 255)  # AIMET: symmetric about zero, grid kept
    sim.compute_encodings([torch.randn(64, 4) * 3], progress=False)
    assert float(relu.min) == 0.0 and float(relu.max) > 0
    assert (float(tanh.min), float(tanh.max)) == (-1.0, 1.0)


# -- the same sim as AIMET's --------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_name", MODELS)
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_the_same_sim_as_aimet(path, model_name):
    recorded = GOLDEN["configs"][path.name][model_name]
    sim, out = _quanta_sim(path, model_name)
    ids: dict[int, int] = {}
    mine = _slots({name: {"inputs": [None if q is None else _describe(q, ids) for q in m.input_quantizers],
                          "outputs": [None if q is None else _describe(q, ids) for q in m.output_quantizers],
                          "params": {p: None if q is None else _describe(q, ids) for p, q in m.param_quantizers.items()}}
                   for name, m in sim.named_qmodules()})
    theirs = _slots(recorded["modules"], quanta_name)
    assert sorted(mine, key=str) == sorted(theirs, key=str)  # the same quantizers, in the same slots
    assert _shared(mine) == _shared(theirs)  # the same ones shared (AIMET's encoding propagation)

    enpu = path.name.startswith("enpu")
    downstream_of_departure = enpu  # the constrained output feeds the rest of the model
    for key, q in theirs.items():
        ours = mine[key]
        fields = ["bitwidth", "symmetric", "signed", "qmin", "qmax", "shape", "fixed_min", "fixed_max"]
        if enpu and key == (ENPU_CONSTRAINED[model_name], "outputs", 0):
            assert (q["fixed_min"], q["fixed_max"]) == ([0.0], [1.0]) and q["symmetric"] and q["signed"]
            assert unpack(q["max"]).item() < 0.5  # AIMET's range clips every output above one half
            assert unpack(ours["min"]).item() < 0 and unpack(ours["max"]).item() == 1.0  # quanta's covers [0, 1]
            fields.remove("fixed_min")
        assert {f: ours[f] for f in fields} == {f: q[f] for f in fields}, key
        if downstream_of_departure and key[1] != "params":
            continue
        for f in ("scale", "offset", "min", "max"):
            a, b = unpack(q[f]), unpack(ours[f])
            if path.name == "dsp_quantsim_config.json" and key[1] == "params" and f != "offset":
                ulp = torch.finfo(torch.float32).eps * a.abs()
                assert ((a - b).abs() <= ulp).all(), (key, f)  # AIMET's re-derived weight range: one ulp
            else:
                assert torch.equal(a.view(torch.int32), b.view(torch.int32)), (key, f)

    if not enpu:
        ref = unpack(recorded["output"]).reshape(recorded["output_shape"])
        assert torch.equal(out.view(torch.int32), ref.view(torch.int32))  # the same outputs, bit for bit


def test_aimet_module_names_map_onto_quanta_modules():
    for model_name in MODELS:
        sim, _ = _quanta_sim(CONFIGS[0], model_name)
        with_quantizers = {name for name, m in sim.named_qmodules()
                           if any(q is not None for q in (*m.input_quantizers, *m.output_quantizers,
                                                           *m.param_quantizers.values()))}
        recorded = GOLDEN["configs"][CONFIGS[0].name][model_name]["modules"]
        mapped = {quanta_name(n) for n, e in recorded.items()
                  if any(q is not None for q in (*e["inputs"], *e["outputs"], *e["params"].values()))}
        assert mapped == with_quantizers
