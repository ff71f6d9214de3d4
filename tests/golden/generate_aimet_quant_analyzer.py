"""Record aimet-torch's QuantAnalyzer outputs for ``test_aimet_quant_analyzer.py``.

Not a test; needs aimet-torch 2.42 (the scratch venv of ``../shared/scripts/anchor_venv.sh``)::

    /tmp/anchors/bin/python tests/golden/generate_aimet_quant_analyzer.py

Writes ``aimet_quant_analyzer.json`` beside itself: for each case, the JSON files AIMET's ``analyze`` writes
(per-layer scores with each layer alone quantized / alone in float, weight and activation encoding ranges,
per-layer MSE) and the fp32 / weight-only / activation-only scores. The models (BatchNorms with settled
statistics, folded by the analyzer), data and callbacks are rebuilt by :func:`build` (plain torch, same seeds).
"""

from __future__ import annotations

import json
import os
import tempfile

import torch
from torch import nn

PER_CHANNEL = {"defaults": {"ops": {"is_output_quantized": "True"},
                            "params": {"is_quantized": "True", "is_symmetric": "True"},
                            "strict_symmetric": "False", "per_channel_quantization": "True"},
               "params": {"bias": {"is_quantized": "False"}}, "op_type": {},
               "supergroups": [{"op_list": ["Conv", "Relu"]}, {"op_list": ["Gemm", "Relu"]}],
               "model_input": {"is_input_quantized": "True"}, "model_output": {}}

#: name -> (model kind, seed, weight bits, activation bits, config or None for the default)
CASES = {
    "cnn_bn_w4a8_default": ("cnn", 0, 4, 8, None),
    "cnn_bn_w8a8_per_channel": ("cnn", 1, 8, 8, PER_CHANNEL),
    "mlp_w4a8_per_channel": ("mlp", 2, 4, 8, PER_CHANNEL),
}
FILES = ["per_layer_quant_enabled.json", "per_layer_quant_disabled.json", "min_max_ranges/weights.json",
         "min_max_ranges/activations.json", "per_layer_mse_loss.json"]


def build(kind: str, seed: int):
    """The model (eval mode), its calibration/evaluation data, and the forward and eval callbacks
    (eval: mean cosine of the outputs to the float model's)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed + 100)
    if kind == "cnn":
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                              nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.BatchNorm2d(8), nn.ReLU(),
                              nn.Conv2d(8, 16, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                              nn.Linear(16, 10))
        data = [torch.randn(8, 3, 12, 12, generator=g) for _ in range(4)]
        model.train()
        with torch.no_grad():  # settle the BatchNorm statistics
            for x in data:
                model(x)
    else:
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 8))
        data = [torch.randn(16, 16, generator=g) for _ in range(4)]
    model.eval()
    with torch.no_grad():
        reference = [model(x) for x in data]

    def forward(m, n):
        for x in data[:n]:
            m(x)

    def evaluate(m, n):
        return float(sum(torch.cosine_similarity(m(x), r, dim=1).mean() for x, r in zip(data[:n], reference)) / n)
    return model, data, forward, evaluate


def main() -> None:
    from _record import write  # beside this script (run it as one)
    from aimet_torch.common.defs import CallbackFunc, QuantScheme
    from aimet_torch.quant_analyzer import QuantAnalyzer

    out = {"cases": {}}
    for name, (kind, seed, wbits, abits, config) in CASES.items():
        model, data, forward, evaluate = build(kind, seed)
        with tempfile.TemporaryDirectory() as tmp:
            path = None
            if config is not None:
                path = os.path.join(tmp, "config.json")
                with open(path, "w") as f:
                    json.dump(config, f)
            analyzer = QuantAnalyzer(model, data[0], CallbackFunc(forward, 4), CallbackFunc(evaluate, 4))
            analyzer.enable_per_layer_mse_loss(data, 2)
            results = os.path.join(tmp, "results")
            analyzer.analyze(QuantScheme.post_training_tf, default_param_bw=wbits, default_output_bw=abits,
                             config_file=path, results_dir=results)
            case = {}
            for f in FILES:
                with open(os.path.join(results, f)) as fh:
                    case[f] = json.load(fh)
            sim = analyzer._create_quantsim_and_encodings(QuantScheme.post_training_tf, wbits, abits, path)
            case["sensitivity"] = list(analyzer.check_model_sensitivity_to_quantization(sim))
        out["cases"][name] = case
    write("aimet_quant_analyzer.json", out)


if __name__ == "__main__":
    main()
