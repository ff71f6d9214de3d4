"""quanta's QuantAnalyzer against aimet-torch 2.42's: the same JSON files (names, layers, order) and numbers.

``aimet_quant_analyzer.json`` is written by ``generate_aimet_quant_analyzer.py`` in a venv with aimet-torch; the
models, data and callbacks are rebuilt here as that script builds them (plain torch, same seeds). Scores and
ranges agree to float32 rounding (the BatchNorm fold and the summation order may differ in the last bits).
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import warnings

import pytest
import torch

from quanta.quant_analyzer import CallbackFunc, QuantAnalyzer

HERE = pathlib.Path(__file__).parent
GOLDEN = json.loads((HERE / "aimet_quant_analyzer.json").read_text())
_spec = importlib.util.spec_from_file_location("generate_aimet_quant_analyzer",
                                               HERE / "generate_aimet_quant_analyzer.py")
generator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generator)


def _close(actual, expected, rel, path="") -> None:
    if isinstance(expected, dict):
        assert list(actual) == list(expected), path  # same layers, same order
        for k in expected:
            _close(actual[k], expected[k], rel, f"{path}/{k}")
    elif isinstance(expected, list):
        assert len(actual) == len(expected), path
        for i, (a, e) in enumerate(zip(actual, expected)):
            _close(a, e, rel, f"{path}[{i}]")
    else:
        assert actual == pytest.approx(expected, rel=rel, abs=1e-7), path


@pytest.mark.parametrize("name", sorted(GOLDEN["cases"]))
def test_analyze_writes_aimets_files(name, tmp_path):
    kind, seed, wbits, abits, config = generator.CASES[name]
    model, data, forward, evaluate = generator.build(kind, seed)
    path = None
    if config is not None:
        path = tmp_path / "config.json"
        path.write_text(json.dumps(config))
    analyzer = QuantAnalyzer(model, data[0], CallbackFunc(forward, 4), CallbackFunc(evaluate, 4))
    analyzer.enable_per_layer_mse_loss(data, 2)
    results = tmp_path / "results"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = analyzer.analyze("post_training_tf", default_param_bw=wbits, default_output_bw=abits,
                                  config_file=path, results_dir=results, progress=False)
    expected = GOLDEN["cases"][name]
    # AIMET lists the folded BatchNorms (Identity modules, the previous layer's output); quanta's sim no longer
    # calls them: no row
    folded = {n for n, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)}
    expected["per_layer_mse_loss.json"] = {k: v for k, v in expected["per_layer_mse_loss.json"].items()
                                           if k not in folded}
    for f in generator.FILES:
        # ranges and MSEs follow the float32 numerics closely; scores are cosines near 1
        _close(json.loads((results / f).read_text()), expected[f], rel=1e-4 if "mse" in f else 1e-5, path=f)
    _close([result.fp32_score, result.weight_quantized_score, result.activation_quantized_score],
           expected["sensitivity"], rel=1e-6)
