"""QuantAnalyzer wall time: quanta's ``analyze`` beside aimet-torch's on the same model, data and callbacks.

The model and data are ``bench_adaround.py``'s (transformers' ResNet, BatchNorm statistics settled on the
data). Both analyzers fold the BatchNorms, calibrate W8A8 with min-max ranges (AIMET's config, per-channel
weights), evaluate every layer alone quantized and alone in float (eval: mean cosine of the logits to the float
model's on held-out images), export the ranges and the per-layer MSE over ``--mse-batches`` batches. Printed:
each one's wall time for the whole ``analyze`` and for the MSE export alone (AIMET runs both models once per
layer per batch; quanta once per batch), and how far apart their per-layer scores and MSEs are.
aimet-torch is optional (see ``bench_adaround.py``)::

    PYTHONPATH=src /tmp/anchors/bin/python bench/bench_quant_analyzer.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import pathlib
import tempfile
import time
import warnings

import torch

_spec = importlib.util.spec_from_file_location("bench_adaround", pathlib.Path(__file__).with_name("bench_adaround.py"))
bench_adaround = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_adaround)

_CONFIG = bench_adaround.PER_CHANNEL_CONFIG


def _run(library: str, model, data, held_out, mse_batches: int, tmp: str) -> dict:
    """Analyze with ``library`` ("quanta" or "aimet"); returns its JSON outputs and timings."""
    with torch.no_grad():
        reference = [model(x) for x in held_out]

    def forward(m, _):
        for x in data:
            m(x)

    def evaluate(m, _):
        return float(sum(torch.cosine_similarity(m(x), r, dim=1).mean() for x, r in zip(held_out, reference))
                     / len(held_out))
    config = os.path.join(tmp, "config.json")
    with open(config, "w") as f:
        json.dump(_CONFIG, f)
    results = os.path.join(tmp, library)
    if library == "quanta":
        from quanta.quant_analyzer import CallbackFunc, QuantAnalyzer
        scheme, extra = "post_training_tf", {"progress": False}
    else:
        from aimet_torch.common.defs import CallbackFunc, QuantScheme
        from aimet_torch.quant_analyzer import QuantAnalyzer
        scheme, extra = QuantScheme.post_training_tf, {}
    analyzer = QuantAnalyzer(model, data[0], CallbackFunc(forward), CallbackFunc(evaluate))
    analyzer.enable_per_layer_mse_loss(data, mse_batches)
    t0 = time.perf_counter()
    analyzer.analyze(scheme, default_param_bw=8, default_output_bw=8, config_file=config, results_dir=results,
                     **extra)
    total = time.perf_counter() - t0
    if library == "quanta":
        sim = analyzer.create_quantsim_and_encodings(scheme, 8, 8, config)
    else:
        sim = analyzer._create_quantsim_and_encodings(scheme, 8, 8, config)
    t0 = time.perf_counter()
    analyzer.export_per_layer_mse_loss(sim, os.path.join(tmp, library + "_mse"))
    mse_time = time.perf_counter() - t0
    out = {"total": total, "mse": mse_time}
    for name in ("per_layer_quant_enabled", "per_layer_quant_disabled", "per_layer_mse_loss"):
        with open(os.path.join(results, name + ".json")) as f:
            out[name] = json.load(f)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--mse-batches", type=int, default=4)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.INFO)
    model, data, held_out = bench_adaround.build(args.batches, args.batch_size, args.size)
    print(f"ResNet (transformers, 4 stages), {args.batches} batches x {args.batch_size} images {args.size}x{args.size}, "
          f"W8A8 per-channel min-max, per-layer MSE over {args.mse_batches} batches, threads: {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as tmp:
        q = _run("quanta", model, data, held_out, args.mse_batches, tmp)
        print(f"quanta       analyze {q['total']:7.1f} s   per-layer MSE {q['mse']:6.2f} s   "
              f"({len(q['per_layer_quant_enabled'])} layers)")
        if importlib.util.find_spec("aimet_torch") is None:
            print("aimet-torch  n/a (not importable here)")
            return
        a = _run("aimet", model, data, held_out, args.mse_batches, tmp)
        print(f"aimet-torch  analyze {a['total']:7.1f} s   per-layer MSE {a['mse']:6.2f} s   "
              f"({len(a['per_layer_quant_enabled'])} layers)")
        print(f"quanta / aimet: analyze {q['total'] / a['total']:.2f}x, per-layer MSE {q['mse'] / a['mse']:.2f}x")
        only_q = [k for k in q["per_layer_quant_enabled"] if k not in a["per_layer_quant_enabled"]]
        only_a = [k for k in a["per_layer_quant_enabled"] if k not in q["per_layer_quant_enabled"]]
        print(f"layers only quanta quantizes: {only_q or 'none'}; only aimet: {only_a or 'none'}")
        for name in ("per_layer_quant_enabled", "per_layer_quant_disabled"):
            diff = max(abs(q[name][k] - a[name][k]) for k in a[name] if k in q[name])
            print(f"{name}: largest score difference on common layers {diff:.2e}")
        common = [k for k in a["per_layer_mse_loss"] if k in q["per_layer_mse_loss"]]
        rel = max(abs(q["per_layer_mse_loss"][k] - a["per_layer_mse_loss"][k])
                  / max(a["per_layer_mse_loss"][k], 1e-30) for k in common)
        order = list(q["per_layer_quant_enabled"])
        first_extra = order.index(only_q[0]) if only_q else len(order)
        upstream = [k for k in common if k in order and order.index(k) < first_extra]
        rel_up = max((abs(q["per_layer_mse_loss"][k] - a["per_layer_mse_loss"][k])
                      / max(a["per_layer_mse_loss"][k], 1e-30) for k in upstream), default=float("nan"))
        print(f"per_layer_mse_loss: {len(common)} common layers (aimet also lists "
              f"{len(a['per_layer_mse_loss']) - len(common)} modules quanta's sim does not call: folded BatchNorms, "
              f"...), largest relative difference {rel:.2e}; {rel_up:.2e} on the {len(upstream)} layers before the "
              "first layer only quanta quantizes")


if __name__ == "__main__":
    main()
