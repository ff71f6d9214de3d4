"""AdaRound: the three ways of collecting layer data agree, the learned rounding lowers each layer's error and stays
on the grid, what it freezes and restores, transformers models, AIMET's file round trip, and bad input.
(Bit-exactness against aimet-torch: tests/golden/test_aimet_adaround.py.)"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from quantsim_models import tiny_bert
from torch import nn

import quanta.quantsim.adaround as qa
from quanta.quantsim import construction
from quanta.quantsim import layer_data
from quanta.adaround import Adaround, AdaroundParameters, apply_adaround
from quanta.quantization.affine import QuantizeDequantize
from quanta.quantsim import QuantizationSimModel


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class SharedLinear(nn.Module):
    """A Linear called at two places (its second call must see the float weight in the reference)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(12, 16)
        self.shared = nn.Linear(16, 16)
        self.out = nn.Linear(16, 4)
        self.act = nn.ReLU()  # a module: an uncaptured model's hooks see it (a functional relu only a graph shows)

    def forward(self, x):
        h = self.act(self.shared(self.inp(x)))
        return self.out(self.shared(h) + h)


def _cnn(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.Flatten(),
                          nn.Linear(8 * 8 * 8, 6)).eval()
    g = torch.Generator().manual_seed(seed + 1)
    return model, [torch.randn(8, 3, 10, 10, generator=g) for _ in range(3)]


def _sim(model, data, **kwargs):
    sim = QuantizationSimModel(model, data[0], default_param_bw=4, **kwargs)
    sim.compute_encodings(data)
    return sim


def _layer_weights(sim):
    return {n: m.weight.detach().clone() for n, m in sim.model.named_modules()
            if isinstance(m, qa.AdaroundSupportedModules)}


def _run(sim, data, iterations=20, seed=0):
    torch.manual_seed(seed)
    return apply_adaround(sim, AdaroundParameters(data, len(data), iterations), progress=False)


@pytest.mark.parametrize("build", [_cnn, lambda seed=0: (SharedLinear().eval(), [torch.randn(6, 12) for _ in range(3)])])
def test_graph_pass_stream_and_uncaptured_models_learn_the_same_rounding(build, monkeypatch):
    model, data = build()
    graph_sim = _sim(model, data)
    report = _run(graph_sim, data)
    assert report.collection == "graph"
    monkeypatch.setattr(layer_data, "CACHE_MEMORY_FRACTION", 0.0)  # nothing fits: every layer streams
    stream_sim = _sim(model, data)
    assert _run(stream_sim, data).collection in ("stream", "graph+stream")
    monkeypatch.setattr(layer_data, "CACHE_MEMORY_FRACTION", 0.75)
    leaves_sim = _sim(model, data, trace=False)
    leaves = _run(leaves_sim, data)
    assert leaves.collection == "stream"
    assert [r.activation for r in leaves.layers] == [r.activation for r in report.layers]
    ours = _layer_weights(graph_sim)
    for other in (stream_sim, leaves_sim):
        theirs = _layer_weights(other)
        assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_learned_rounding_lowers_each_layers_error_and_stays_on_the_grid():
    model, data = _cnn()
    sim = _sim(model, data)
    before = _layer_weights(sim)
    report = _run(sim, data, iterations=300)
    assert [r.name for r in report.layers] == ["0", "2", "4"]
    assert [r.activation for r in report.layers] == ["QuantizedReLU", None, None]
    assert all(r.mse_adaround < r.mse_nearest for r in report.layers)
    assert "layers in" in str(report)
    changed = 0
    for name, w0 in before.items():
        module = sim.model.get_submodule(name)
        q = module.param_quantizers["weight"]
        scale = q.get_scale().detach()
        w = q(module.weight).as_subclass(torch.Tensor).detach()
        assert torch.equal(w, module.weight.detach()), name  # the weight is on the grid
        assert bool(((w - w0).abs() < scale * (1 + 1e-6)).all()), name  # the floor or the ceiling of its step
        nearest = q(w0).as_subclass(torch.Tensor).detach()
        changed += int((w != nearest).sum())
    assert changed > 0


def test_weight_encodings_are_frozen_and_activation_quantizers_restored():
    model, data = _cnn()
    sim = _sim(model, data)
    quantizers = {name: q for name, q in sim.named_quantizers()}
    _run(sim, data)
    assert dict(sim.named_quantizers()) == quantizers  # the same objects, activations included
    q = sim.model.get_submodule("0").param_quantizers["weight"]
    lo, hi = q.min.detach().clone(), q.max.detach().clone()
    sim.compute_encodings(data)
    assert torch.equal(q.min, lo) and torch.equal(q.max, hi)
    assert not q.min.requires_grad and not q.is_overwrite_allowed()


def test_per_block_weights():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 8)).eval()
    data = [torch.randn(16, 32) for _ in range(3)]
    sim = QuantizationSimModel(model, data[0], default_param_bw=4)
    layer = sim.model.get_submodule("0")
    layer.param_quantizers["weight"] = QuantizeDequantize((16, 4), 4, True, block_size=(1, 8))
    sim.compute_encodings(data)
    w0 = layer.weight.detach().clone()
    report = _run(sim, data, iterations=300)
    assert report.layers[0].mse_adaround < report.layers[0].mse_nearest
    q = layer.param_quantizers["weight"]
    scale = q.get_scale().detach().repeat_interleave(8, dim=1)
    assert bool(((q(layer.weight).as_subclass(torch.Tensor) - w0).abs() < scale * (1 + 1e-6)).all())


def test_transformers_model_with_dict_batches():
    transformers = pytest.importorskip("transformers")
    model, batches = tiny_bert(transformers)
    sim = QuantizationSimModel(model, batches[0], default_param_bw=4)
    sim.compute_encodings(batches)
    report = _run(sim, batches, iterations=60)
    assert [r.name for r in report.layers] == [
        "encoder.layer.0.attention.self.query", "encoder.layer.0.attention.self.key",
        "encoder.layer.0.attention.self.value", "encoder.layer.0.attention.output.dense",
        "encoder.layer.0.intermediate.dense", "encoder.layer.0.output.dense", "pooler.dense"]
    assert report.layers[4].activation == "QuantizedGELU" and report.layers[6].activation == "QuantizedTanh"
    assert sum(r.mse_adaround for r in report.layers) < sum(r.mse_nearest for r in report.layers)


class TiedHead(nn.Module):
    """A token embedding and an output Linear sharing one weight (GPT-2's lm_head and wte)."""

    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(20, 12)
        self.mid = nn.Linear(12, 12)
        self.head = nn.Linear(12, 20, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, ids):
        return self.head(torch.relu(self.mid(self.wte(ids))))


def test_a_tied_weight_is_left_at_nearest_rounding_and_named(recwarn):
    torch.manual_seed(0)
    model = TiedHead().eval()
    data = [torch.randint(0, 20, (4, 6)) for _ in range(2)]
    sim = _sim(model, data)
    sim.exclude_layers_from_quantization([sim.model.get_submodule("wte")])  # the lookup stays float
    table = sim.model.get_submodule("wte").weight.detach().clone()
    warnings.simplefilter("always")
    report = _run(sim, data)
    assert [r.name for r in report.layers] == ["mid"]  # the head's weight is the embedding's: not written
    assert any("head left at nearest rounding: its weight is tied to wte" in str(w.message) for w in recwarn)
    assert torch.equal(sim.model.get_submodule("wte").weight, table)


def test_a_weight_norm_layer_is_its_own():  # wav2vec2's positional conv: the weight is computed, not a parameter
    torch.manual_seed(0)
    model = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 6, 3)), nn.ReLU(),
                          nn.Conv1d(6, 2, 1)).eval()
    data = [torch.randn(4, 4, 12) for _ in range(2)]
    report = _run(_sim(model, data), data)
    assert "2" in [r.name for r in report.layers]


def test_apply_adaround_with_cache_reads_aimets_file_and_gives_apply_adarounds_result(tmp_path):
    model, data = _cnn()
    params = AdaroundParameters(data, num_batches=3, default_num_iterations=20)
    config = tmp_path / "checkpoints.json"
    config.write_text(json.dumps({"grouped_modules": {"0": ["0", "1"], "1": ["2", "3", "4"]},
                                  "include_static_inputs": ["False", "False"], "cache_on_cpu": "True"}))
    torch.manual_seed(0)
    plain = Adaround.apply_adaround(model, data[0], params, path=tmp_path / "a", filename_prefix="ada")
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="checkpoints split is not needed"):
        cached = Adaround.apply_adaround_with_cache(model, data[0], params, path=tmp_path / "b", filename_prefix="ada",
                                                    checkpoints_config=str(config))
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), cached.state_dict().values()))
    assert (tmp_path / "a" / "ada.encodings").read_text() == (tmp_path / "b" / "ada.encodings").read_text()
    with pytest.raises(ValueError, match="needs checkpoints_config"):
        Adaround.apply_adaround_with_cache(model, data[0], params, tmp_path, "ada")
    config.write_text(json.dumps({"grouped_modules": {"0": ["0", "encoder.9"]}}))
    with pytest.raises(ValueError, match="model lacks: encoder.9"):
        Adaround.apply_adaround_with_cache(model, data[0], params, tmp_path, "ada", checkpoints_config=config)
    config.write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not AIMET's checkpoints file"):
        Adaround.apply_adaround_with_cache(model, data[0], params, tmp_path, "ada", checkpoints_config=config)


def test_aimet_api_returns_a_copy_and_writes_the_file_set_and_freeze_reads(tmp_path):
    model, data = _cnn()
    original = {k: v.clone() for k, v in model.state_dict().items()}
    params = AdaroundParameters(data, num_batches=3, default_num_iterations=30)
    torch.manual_seed(0)
    ada = Adaround.apply_adaround(model, data[0], params, path=tmp_path / "out", filename_prefix="ada",
                                  default_param_bw=4, param_bw_override_list=[(model[4], 8)],
                                  ignore_quant_ops_list=[model[2]])
    assert type(ada) is type(model) and ada is not model
    assert all(torch.equal(v, original[k]) for k, v in model.state_dict().items())
    doc = json.loads((tmp_path / "out" / "ada.encodings").read_text())
    assert sorted(doc) == ["param_encodings"]
    assert sorted(doc["param_encodings"]) == ["0.weight", "4.weight"]  # "2" ignored
    assert len(doc["param_encodings"]["0.weight"]) == 8  # per output channel (quanta's default config)
    assert {e["bitwidth"] for e in doc["param_encodings"]["4.weight"]} == {8}
    assert torch.equal(ada[2].weight, model[2].weight)

    sim = QuantizationSimModel(ada, data[0], default_param_bw=4)
    sim.model.get_submodule("4").param_quantizers["weight"] = construction.with_bitwidth(
        sim.model.get_submodule("4").param_quantizers["weight"], 8)
    sim.set_and_freeze_param_encodings(tmp_path / "out" / "ada.encodings")
    q = sim.model.get_submodule("0").param_quantizers["weight"]
    scales = torch.tensor([e["scale"] for e in doc["param_encodings"]["0.weight"]])
    assert torch.allclose(q.get_scale().flatten(), scales, rtol=1e-6)
    assert not q.is_overwrite_allowed()
    sim.compute_encodings(data)
    assert torch.allclose(q.get_scale().flatten(), scales, rtol=1e-6)
    # AIMET's returned weights are the soft-rounded ones: the quantizer puts each on the floor or the ceiling
    qdq = q(ada[0].weight).as_subclass(torch.Tensor).detach()
    assert bool(((qdq - model[0].weight).abs() < scales[:, None, None, None] * (1 + 1e-6)).all())


def test_labelled_batches_and_forward_fn():
    model, data = _cnn()
    labelled = [(x, torch.zeros(len(x))) for x in data]
    a, b = _sim(model, data), _sim(model, data)
    _run(a, labelled)
    torch.manual_seed(0)
    apply_adaround(b, AdaroundParameters(data, 3, 20, forward_fn=lambda m, x: m(x)), progress=False)
    assert all(torch.equal(u, v) for u, v in zip(_layer_weights(a).values(), _layer_weights(b).values()))


def test_default_iterations_follow_the_lowest_bitwidth(monkeypatch):
    seen = []

    def fake(layer, inputs, targets, params, num_iterations, soft_weights=False):
        seen.append(num_iterations)
        return qa.AdaroundLayerResult(layer.name, 1.0, 1.0, num_iterations, 0.0)

    monkeypatch.setattr(qa, "_optimize", fake)
    model, data = _cnn()
    apply_adaround(_sim(model, data), AdaroundParameters(data, 3), progress=False)
    sim8 = QuantizationSimModel(model, data[0], default_param_bw=8)
    sim8.compute_encodings(data)
    apply_adaround(sim8, AdaroundParameters(data, 3), progress=False)
    assert seen == [15000] * 3 + [10000] * 3


def test_beta_anneals_from_start_to_end():
    betas = [qa._beta(100, i, (20, 2), 0.2) for i in range(20, 100)]
    assert betas[0] == 20 and 2 < betas[-1] < 2.1
    assert all(x >= y for x, y in zip(betas, betas[1:]))


@pytest.mark.parametrize("kwargs, error", [
    ({"data_loader": torch.zeros(3)}, TypeError),
    ({"num_batches": 0}, ValueError),
    ({"num_batches": 5}, ValueError),  # the loader has 3
    ({"default_num_iterations": 0}, ValueError),
    ({"default_reg_param": -1.0}, ValueError),
    ({"default_beta_range": (20,)}, ValueError),
    ({"default_beta_range": (0, 2)}, ValueError),
    ({"default_warm_start": 1.0}, ValueError),
    ({"forward_fn": 3}, TypeError),
])
def test_bad_parameters(kwargs, error):
    args = {"data_loader": [torch.zeros(1)] * 3, "num_batches": 3, **kwargs}
    with pytest.raises(error):
        AdaroundParameters(**args)


def test_bad_calls_change_nothing():
    model, data = _cnn()
    params = AdaroundParameters(data, 3, 5)
    with pytest.raises(TypeError, match="sim must be a QuantizationSimModel"):
        apply_adaround(model, params)
    sim = QuantizationSimModel(model, data[0], default_param_bw=4)
    with pytest.raises(TypeError, match="params must be AdaroundParameters"):
        apply_adaround(sim, {"data_loader": data})
    before = _layer_weights(sim)
    with pytest.raises(RuntimeError, match="compute the parameter encodings"):
        apply_adaround(sim, params)
    assert all(torch.equal(w, before[k]) for k, w in _layer_weights(sim).items())
    sim.compute_encodings(data)
    with pytest.raises(ValueError, match="yielded no batches"):
        apply_adaround(sim, AdaroundParameters(iter([]), 1, 5))
    with pytest.raises(TypeError, match="forward_fn"):
        apply_adaround(sim, AdaroundParameters([(x, x, x) for x in data], 3, 5))
    with pytest.raises(ValueError, match="did not call the model"):
        apply_adaround(sim, AdaroundParameters(data, 3, 5, forward_fn=lambda m, b: None))
    assert all(torch.equal(w, before[k]) for k, w in _layer_weights(sim).items())
    with pytest.raises(ValueError, match="param_encodings"):
        sim.set_and_freeze_param_encodings({"activation_encodings": {}})


def test_bad_aimet_api_arguments(tmp_path):
    model, data = _cnn()
    params = AdaroundParameters(data, 3, 5)
    with pytest.raises(ValueError, match="filename_prefix"):
        Adaround.apply_adaround(model, data[0], params, tmp_path, "a/b")
    with pytest.raises(ValueError, match="param_bw_override_list must hold modules of model"):
        Adaround.apply_adaround(model, data[0], params, tmp_path, "a", param_bw_override_list=[(nn.Linear(2, 2), 8)])
    with pytest.raises(ValueError, match="bitwidth"):
        Adaround.apply_adaround(model, data[0], params, tmp_path, "a", param_bw_override_list=[(model[0], 0)])
    with pytest.raises(ValueError, match="ignore_quant_ops_list"):
        Adaround.apply_adaround(model, data[0], params, tmp_path, "a", ignore_quant_ops_list=[nn.ReLU()])
    with pytest.raises(TypeError, match="params"):
        Adaround.apply_adaround(model, data[0], None, tmp_path, "a")
    assert not any(tmp_path.iterdir())


def test_batches_of_different_sequence_lengths():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    data = [torch.randn(2, t, 8) for t in (5, 7, 3)]  # padded to each batch's longest sequence
    sim = _sim(model, data)
    report = _run(sim, data, iterations=100)
    assert [r.name for r in report.layers] == ["0", "2"]
    convs = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3)).eval()
    images = [torch.randn(2, 3, 10, 10), torch.randn(2, 3, 12, 12)]
    with pytest.raises(ValueError, match="differ in shape between batches"):
        _run(_sim(convs, images), images)
