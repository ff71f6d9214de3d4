"""QuantAnalyzer: each score is the evaluation of the model with the right quantizers on, the sensitive layer is
found, the files are written (self-contained pages, PNGs, AIMET's JSON), the user's model is untouched,
transformers models, charts without matplotlib, and bad input. (Against aimet-torch:
tests/golden/test_aimet_quant_analyzer.py.)"""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
from quantsim_models import tiny_bert
from torch import nn

from quanta.nn import QuantizationMixin
from quanta.nn.base import quantizers_off
from quanta.quant_analyzer import CallbackFunc, QuantAnalyzer
from quanta.quantsim import charts


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _setup(seed=0, outlier=None):
    """A Conv-BN-ReLU CNN with settled statistics, its data, and callbacks (eval: mean cosine to the float
    outputs). ``outlier``: the name of a conv whose first weight is made huge (per-tensor 4-bit weights then
    lose that layer's other weights)."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 5))
    data = [torch.randn(8, 3, 10, 10) for _ in range(3)]
    model.train()
    with torch.no_grad():
        for x in data:
            model(x)
        if outlier is not None:
            model.get_submodule(outlier).weight[0, 0, 0, 0] = 40.0
    model.eval()
    with torch.no_grad():
        reference = [model(x) for x in data]

    def forward(m):
        for x in data:
            m(x)

    def evaluate(m):
        return float(sum(torch.cosine_similarity(m(x), r, dim=1).mean() for x, r in zip(data, reference)) / len(data))
    return model, data, forward, evaluate


def _per_tensor_config(tmp_path):
    path = tmp_path / "per_tensor.json"
    path.write_text(json.dumps({
        "defaults": {"ops": {"is_output_quantized": "True"}, "params": {"is_quantized": "True", "is_symmetric": "True"},
                     "per_channel_quantization": "False"},
        "params": {"bias": {"is_quantized": "False"}}, "op_type": {},
        "supergroups": [{"op_list": ["Conv", "Relu"]}, {"op_list": ["Gemm", "Relu"]}],
        "model_input": {"is_input_quantized": "True"}, "model_output": {}}))
    return path


def test_scores_are_the_model_evaluated_with_the_right_quantizers_on(tmp_path):
    model, data, forward, evaluate = _setup()
    analyzer = QuantAnalyzer(model, data[0], forward, evaluate)
    sim = analyzer.create_quantsim_and_encodings("post_training_tf", default_param_bw=4)
    layers = [(n, m) for n, m in sim.model.named_modules() if isinstance(m, QuantizationMixin)]
    fp32, w_only, a_only = analyzer.check_model_sensitivity_to_quantization(sim)
    with quantizers_off([m for _, m in layers]):
        assert fp32 == pytest.approx(evaluate(sim.model), abs=1e-6)
    assert fp32 == pytest.approx(1.0, abs=1e-5)  # the folded float model computes what the original does
    with quantizers_off([m for _, m in layers], params=False):
        assert w_only == evaluate(sim.model)
    with quantizers_off([m for _, m in layers], activations=False):
        assert a_only == evaluate(sim.model)
    assert w_only < fp32 and a_only < fp32

    enabled = analyzer.perform_per_layer_analysis_by_enabling_quant_wrappers(sim, tmp_path, progress=False)
    disabled = analyzer.perform_per_layer_analysis_by_disabling_quant_wrappers(sim, tmp_path, progress=False)
    assert list(enabled) == list(disabled) == ["0", "2", "3", "4", "5", "6", "7", "9"]  # execution order
    modules = dict(layers)
    with quantizers_off([m for n, m in layers if n != "3"]):
        assert enabled["3"] == evaluate(sim.model)
    with quantizers_off([modules["3"]]):
        assert disabled["3"] == evaluate(sim.model)
    assert json.loads((tmp_path / "per_layer_quant_enabled.json").read_text()) == enabled
    assert json.loads((tmp_path / "per_layer_quant_disabled.json").read_text()) == disabled


def test_analyze_finds_the_sensitive_layer_and_writes_every_file(tmp_path):
    model, data, forward, evaluate = _setup(outlier="3")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    analyzer = QuantAnalyzer(model, data[0], CallbackFunc(lambda m, n: [m(x) for x in data[:n]], 3), evaluate)
    analyzer.enable_per_layer_mse_loss(data, 2)
    result = analyzer.analyze(default_param_bw=4, config_file=_per_tensor_config(tmp_path),
                              results_dir=tmp_path / "out", progress=False)
    assert result.most_sensitive(1) == ["3"]
    assert result.per_layer_quant_disabled["3"] == max(result.per_layer_quant_disabled.values())
    assert result.fp32_score > result.quantized_score
    # the user's model: BatchNorm not folded, weights unchanged
    assert isinstance(model[1], nn.BatchNorm2d)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())

    out = tmp_path / "out"
    for name in ("index.html", "per_layer_quant_enabled.html", "per_layer_quant_enabled.png",
                 "per_layer_quant_disabled.json", "per_layer_mse_loss.json", "per_layer_mse_loss.png",
                 "min_max_ranges/weights.json", "min_max_ranges/activations.json", "min_max_ranges/weights.html",
                 "min_max_ranges/activations.html", "activations_pdf/0_input_q0.html", "weights_pdf/3/weight.html"):
        assert (out / name).is_file(), name
        assert name in result.files
    assert (out / "per_layer_quant_enabled.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    index = (out / "index.html").read_text()
    assert index.count("data:image/png;base64,") >= 4  # sensitivity, two range charts, MSE
    assert not re.search(r'src="(?!data:)', index)  # self-contained: no external images or scripts
    weights = json.loads((out / "min_max_ranges/weights.json").read_text())
    lo, hi = weights["3_weight"]
    assert hi == pytest.approx(40.0) and lo == pytest.approx(-hi * 8 / 7)  # symmetric 4-bit grid [-8, 7]·scale
    mse = json.loads((out / "per_layer_mse_loss.json").read_text())
    assert list(mse)[:3] == ["0", "2", "3"] and all(v >= 0 for v in mse.values())
    assert mse == result.per_layer_mse_loss


def test_histograms_only_for_histogram_schemes(tmp_path):
    model, data, forward, evaluate = _setup()
    analyzer = QuantAnalyzer(model, data[0], forward, evaluate)
    result = analyzer.analyze("post_training_tf", results_dir=tmp_path / "tf", progress=False)
    assert not any(f.startswith(("activations_pdf", "weights_pdf")) for f in result.files)
    sim = analyzer.create_quantsim_and_encodings("tf_enhanced")
    before = {n: q.get_encodings().scale.clone() for n, q in sim.named_quantizers() if q.is_initialized()}
    pages = analyzer.export_per_layer_stats_histogram(sim, tmp_path / "h")
    assert ("0_input_q0", "activations_pdf/0_input_q0.html") in pages
    assert ("3.weight", "weights_pdf/3/weight.html") in pages
    text = (tmp_path / "h" / "activations_pdf" / "0_input_q0.html").read_text()
    assert "data:image/png;base64," in text and f"{3 * 8 * 3 * 10 * 10} values" in text  # every input value
    after = {n: q.get_encodings().scale for n, q in sim.named_quantizers() if q.is_initialized()}
    assert all(torch.equal(before[n], after[n]) for n in before)  # encodings unchanged


def test_modules_to_ignore_stay_in_float(tmp_path):
    model, data, forward, evaluate = _setup()
    analyzer = QuantAnalyzer(model, data[0], forward, evaluate, modules_to_ignore=[model[9], model[3]])
    result = analyzer.analyze(results_dir=tmp_path, progress=False)
    assert "9" not in result.per_layer_quant_enabled and "3" not in result.per_layer_quant_enabled
    assert "9_weight" not in result.weight_ranges and "0_weight" in result.weight_ranges


def test_transformers_model_with_dict_input(tmp_path):
    transformers = pytest.importorskip("transformers")
    model, batches = tiny_bert(transformers)
    with torch.no_grad():
        reference = [model(**b).last_hidden_state for b in batches]

    def evaluate(m):
        return float(sum(torch.cosine_similarity(m(**b).last_hidden_state, r, dim=-1).mean()
                         for b, r in zip(batches, reference)) / 2)
    analyzer = QuantAnalyzer(model, batches[0], lambda m: [m(**b) for b in batches], evaluate)
    analyzer.enable_per_layer_mse_loss(batches, 2)
    result = analyzer.analyze("post_training_tf", default_param_bw=4, results_dir=tmp_path, progress=False)
    assert "encoder.layer.0.attention.self.query" in result.per_layer_quant_enabled
    assert "encoder.layer.0.attention.self.query_weight" in result.weight_ranges
    assert "encoder.layer.0.intermediate.dense" in result.per_layer_mse_loss
    assert result.quantized_score < result.fp32_score


def test_pages_without_matplotlib(tmp_path, monkeypatch):
    model, data, forward, evaluate = _setup()
    monkeypatch.setattr(charts, "pyplot", lambda: None)
    monkeypatch.setattr(charts, "_WARNED", False)
    analyzer = QuantAnalyzer(model, data[0], forward, evaluate)
    sim = analyzer.create_quantsim_and_encodings()
    with pytest.warns(UserWarning, match="matplotlib is not installed"):
        scores = analyzer.perform_per_layer_analysis_by_enabling_quant_wrappers(sim, tmp_path, progress=False)
    page = (tmp_path / "per_layer_quant_enabled.html").read_text()
    assert "<td>0</td>" in page and "data:image" not in page
    assert not (tmp_path / "per_layer_quant_enabled.png").exists()
    assert json.loads((tmp_path / "per_layer_quant_enabled.json").read_text()) == scores


def test_bad_input(tmp_path):
    model, data, forward, evaluate = _setup()
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        QuantAnalyzer("model", data[0], forward, evaluate)
    with pytest.raises(TypeError, match="forward_pass_callback must be"):
        QuantAnalyzer(model, data[0], data, evaluate)
    with pytest.raises(TypeError, match="eval_callback must be"):
        QuantAnalyzer(model, data[0], forward, 0.9)
    with pytest.raises(ValueError, match="modules_to_ignore"):
        QuantAnalyzer(model, data[0], forward, evaluate, modules_to_ignore=[nn.Linear(2, 2)])
    analyzer = QuantAnalyzer(model, data[0], forward, evaluate)
    with pytest.raises(ValueError, match="num_batches"):
        analyzer.enable_per_layer_mse_loss(data, 5)
    with pytest.raises(TypeError, match="sized iterable"):
        analyzer.enable_per_layer_mse_loss(iter(data), 1)
    with pytest.raises(ValueError, match="default_param_bw"):
        analyzer.analyze(default_param_bw=0, results_dir=tmp_path)
    with pytest.raises(ValueError, match="QuantScheme|quant_scheme|scheme"):
        analyzer.analyze(quant_scheme="rounding", results_dir=tmp_path)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        analyzer.analyze(results_dir=tmp_path / "file")
    with pytest.raises(TypeError, match="results_dir must be a path"):
        analyzer.analyze(results_dir=3)
    sim = analyzer.create_quantsim_and_encodings()
    with pytest.raises(RuntimeError, match="enable_per_layer_mse_loss"):
        analyzer.export_per_layer_mse_loss(sim, tmp_path)
    bad = QuantAnalyzer(model, data[0], forward, lambda m: "good")
    with pytest.raises(TypeError, match="eval_callback must return a number"):
        bad.check_model_sensitivity_to_quantization(sim)


def test_callback_func():
    cb = CallbackFunc(lambda model, n: (model, n), 3)
    assert cb("m") == ("m", 3)
    with pytest.raises(TypeError, match="func must be callable"):
        CallbackFunc(3)
