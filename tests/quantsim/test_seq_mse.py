"""Sequential MSE: graph pass and streaming agree, the chosen ranges lower the layers' output error, what is frozen,
skipped and restored, per-tensor weights, transformers models, resuming from cache_dir, and bad input.
(Bit-exactness against aimet-torch: tests/golden/test_aimet_seq_mse.py.)"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from quanta.quantsim import QuantizationSimModel, layer_data
from quanta.seq_mse import SeqMseParams, apply_seq_mse


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _mlp(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    return model, [torch.randn(8, 16) for _ in range(3)]


def _cnn(seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1)).eval()
    return model, [torch.randn(4, 3, 10, 10) for _ in range(3)]


def _ranges(sim):
    return {n: (m.param_quantizers["weight"].min.detach().clone(), m.param_quantizers["weight"].max.detach().clone())
            for n, m in sim.model.named_modules()
            if isinstance(m, (nn.Linear, nn.Conv2d)) and m.param_quantizers["weight"] is not None}


@pytest.mark.parametrize("build", [_mlp, _cnn])
@pytest.mark.parametrize("symmetry", ["symqt", "asym"])
def test_graph_pass_and_streaming_choose_the_same_ranges(build, symmetry, monkeypatch):
    model, data = build()
    a = QuantizationSimModel(model, data[0], default_param_bw=4)
    report = apply_seq_mse(a, data, num_candidates=10, inp_symmetry=symmetry, progress=False)
    assert report.collection == "graph"
    monkeypatch.setattr(layer_data, "CACHE_MEMORY_FRACTION", 0.0)
    b = QuantizationSimModel(model, data[0], default_param_bw=4)
    assert apply_seq_mse(b, data, num_candidates=10, inp_symmetry=symmetry, progress=False).collection != "graph"
    c = QuantizationSimModel(model, data[0], default_param_bw=4, trace=False)
    assert apply_seq_mse(c, data, num_candidates=10, inp_symmetry=symmetry, progress=False).collection == "stream"
    ra = _ranges(a)
    for other in (b, c):
        rb = _ranges(other)
        assert all(torch.equal(ra[k][0], rb[k][0]) and torch.equal(ra[k][1], rb[k][1]) for k in ra)


@pytest.mark.parametrize("symmetry", ["symqt", "asym"])
def test_transposed_linear_searches_as_the_linear_it_is(symmetry):
    from quanta.nn.functional import TransposedLinear  # GPT-2's Conv1D after capture: weight stored (in, out)

    class Transposed(nn.Module):
        def __init__(self, linears):
            super().__init__()
            self.a, self.b = (TransposedLinear(nn.Parameter(m.weight.detach().t().clone()),
                                               nn.Parameter(m.bias.detach().clone())) for m in linears)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    torch.manual_seed(0)
    linear = nn.Sequential(nn.Linear(16, 24), nn.ReLU(), nn.Linear(24, 8)).eval()
    transposed = Transposed([linear[0], linear[2]]).eval()
    data = [torch.randn(8, 16) for _ in range(3)]
    sims = [QuantizationSimModel(m, data[0], default_param_bw=4) for m in (linear, transposed)]
    reports = [apply_seq_mse(sim, data, num_candidates=10, inp_symmetry=symmetry, progress=False) for sim in sims]
    assert [r.name for r in reports[1].layers] == ["a", "b"]
    for ln, tn in (("0", "a"), ("2", "b")):
        ql = sims[0].model.get_submodule(ln).param_quantizers["weight"]
        qt = sims[1].model.get_submodule(tn).param_quantizers["weight"]
        assert not qt.min.requires_grad  # chosen and frozen
        torch.testing.assert_close(qt.min.detach().t(), ql.min.detach(), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(qt.max.detach().t(), ql.max.detach(), rtol=1e-6, atol=1e-7)
    assert [r.mean_fraction for r in reports[1].layers] == [r.mean_fraction for r in reports[0].layers]


def test_chosen_ranges_lower_the_output_error_and_are_frozen():
    model, data = _mlp()
    sim = QuantizationSimModel(model, data[0], default_param_bw=4)
    before = {name: q for name, q in sim.named_quantizers()}
    report = apply_seq_mse(sim, data, progress=False)
    assert [r.name for r in report.layers] == ["0", "2", "4"]
    assert all(r.loss_chosen <= r.loss_min_max for r in report.layers)
    assert any(r.loss_chosen < r.loss_min_max for r in report.layers)
    assert all(0 < r.mean_fraction <= 1 for r in report.layers) and "layers in" in str(report)
    assert dict(sim.named_quantizers()) == before  # activation quantizers back in place
    chosen = _ranges(sim)
    sim.compute_encodings(data)
    assert all(torch.equal(chosen[k][1], v[1]) for k, v in _ranges(sim).items())  # frozen
    q = sim.model.get_submodule("0").param_quantizers["weight"]
    assert not q.max.requires_grad and not q.is_overwrite_allowed()


def test_per_tensor_weights_and_8_bit_layers():
    model, data = _cnn()
    config = {"defaults": {"ops": {"is_output_quantized": "True"}, "params": {"is_quantized": "True",
              "is_symmetric": "True"}, "per_channel_quantization": "False"}, "params": {}, "op_type": {},
              "supergroups": [], "model_input": {"is_input_quantized": "True"}, "model_output": {}}
    sim = QuantizationSimModel(model, data[0], default_param_bw=4, config_file=config)
    sim.model.get_submodule("2").param_quantizers["weight"] = None  # not quantized: left alone
    report = apply_seq_mse(sim, data, progress=False)
    assert [r.name for r in report.layers] == ["0"]
    assert report.layers[0].loss_chosen <= report.layers[0].loss_min_max
    assert sim.model.get_submodule("0").param_quantizers["weight"].shape == ()
    sim8 = QuantizationSimModel(model, data[0], default_param_bw=8)
    with pytest.raises(ValueError, match="at most 4 bits"):
        apply_seq_mse(sim8, data, progress=False)


def test_transformers_model():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(config).eval()
    batches = [{"input_ids": torch.randint(0, 64, (2, 8))} for _ in range(2)]
    sim = QuantizationSimModel(model, batches[0], default_param_bw=4)
    report = apply_seq_mse(sim, batches, num_candidates=8, progress=False)
    names = [r.name for r in report.layers]
    assert names[:3] == ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                         "model.layers.0.self_attn.v_proj"]
    assert "lm_head" in names and "model.layers.0.mlp.down_proj" in names
    assert all(r.loss_chosen <= r.loss_min_max for r in report.layers)


def test_cache_dir_resumes(tmp_path, monkeypatch):
    model, data = _mlp()
    a = QuantizationSimModel(model, data[0], default_param_bw=4)
    apply_seq_mse(a, data, cache_dir=tmp_path, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.pt", "2.pt", "4.pt"]
    (tmp_path / "4.pt").unlink()  # as if interrupted before the last layer
    b = QuantizationSimModel(model, data[0], default_param_bw=4)
    report = apply_seq_mse(b, data, cache_dir=tmp_path, progress=False)
    assert [r.name for r in report.layers] == ["4"]
    ra, rb = _ranges(a), _ranges(b)
    assert all(torch.equal(ra[k][1], rb[k][1]) for k in ra)
    torch.save({"min": torch.zeros(3)}, tmp_path / "0.pt")
    with pytest.raises(ValueError, match="does not hold a range"):
        apply_seq_mse(QuantizationSimModel(model, data[0], default_param_bw=4), data, cache_dir=tmp_path,
                      progress=False)


def test_exclusion_forward_fn_and_deprecated_signature():
    model, data = _mlp()
    sim = QuantizationSimModel(model, data[0], default_param_bw=4)
    report = apply_seq_mse(sim, [(x, 0) for x in data], forward_fn=lambda m, b: m(b[0]),
                           modules_to_exclude=[sim.model.get_submodule("2")], progress=False)
    assert [r.name for r in report.layers] == ["0", "4"]
    sim = QuantizationSimModel(model, data[0], default_param_bw=4)
    with pytest.warns(DeprecationWarning):
        report = apply_seq_mse(model, sim, data, SeqMseParams(num_batches=2, num_candidates=5),
                               modules_to_exclude=[model[0]], progress=False)
    assert [r.name for r in report.layers] == ["2", "4"]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"num_candidates": 0}, ValueError, "num_candidates"),
    ({"inp_symmetry": "sym"}, ValueError, "inp_symmetry"),
    ({"loss_fn": "mae"}, ValueError, "loss_fn"),
    ({"num_batches": 0}, ValueError, "num_batches"),
    ({"forward_fn": 1}, TypeError, "forward_fn"),
    ({"cache_dir": 3}, TypeError, "cache_dir"),
    ({"modules_to_exclude": [nn.Linear(2, 2)]}, ValueError, "modules_to_exclude"),
])
def test_bad_arguments_change_nothing(kwargs, error, match):
    model, data = _mlp()
    sim = QuantizationSimModel(model, data[0], default_param_bw=4)
    with pytest.raises(error, match=match):
        apply_seq_mse(sim, data, progress=False, **kwargs)
    with pytest.raises(TypeError, match="sim must be"):
        apply_seq_mse(sim.model, data, data, SeqMseParams())  # the deprecated form: (model, sim, loader, params)
    with pytest.raises(TypeError, match="data_loader"):
        apply_seq_mse(sim, torch.zeros(3))
    with pytest.raises(ValueError, match="no batches"):
        apply_seq_mse(sim, [], progress=False)
    assert not any(q.is_initialized() for _, q in sim.named_quantizers())
