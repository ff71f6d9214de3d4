"""Mixed precision beside aimet-torch's ``choose_mixed_precision``: BitOps chosen for an accuracy budget, wall time.

The model and data are ``bench_adaround.py``'s (transformers' ResNet, BatchNorm statistics settled on the
data, then folded). Candidates W8A16, W8A8 and W4A8 (integers; AIMET's config with per-channel weights, min-max
ranges); the score is the mean cosine of the logits to the float model's on held-out images (phase 1 on one
batch of them, phase 2 on all); budget ``--drop`` below fp32. Printed for each library: the scores of the
uniform candidates, the chosen configuration's score and BitOps relative to uniform W8A16, the number of
evaluations and the wall time. ``--phase2-reverse``: both walk phase 2 bottom-up. aimet-torch is optional (see
``bench_adaround.py``)::

    PYTHONPATH=src /tmp/anchors/bin/python bench/bench_mixed_precision.py [--phase2-reverse]
"""

from __future__ import annotations

import argparse
import copy
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


def _run(library: str, model, data, held_out, drop: float, tmp: str, reverse: bool = False) -> dict:
    with torch.no_grad():
        reference = [model(x) for x in held_out]
    counts = {"phase1": 0, "phase2": 0}

    def cosine(m, batches):
        return float(sum(torch.cosine_similarity(m(x), reference[i], dim=1).mean() for i, x in batches) / len(batches))

    def phase1(m, _=None):
        counts["phase1"] += 1
        return cosine(m, [(0, held_out[0])])

    def phase2(m, _=None):
        counts["phase2"] += 1
        return cosine(m, list(enumerate(held_out)))

    def forward(m, _=None):
        for x in data:
            m(x)
    config = os.path.join(tmp, "config.json")
    with open(config, "w") as f:
        json.dump(_CONFIG, f)
    results = os.path.join(tmp, library)
    model = copy.deepcopy(model)
    if library == "quanta":
        from quanta.batch_norm_fold import fold_all_batch_norms
        from quanta.mixed_precision import CallbackFunc, QuantizationDataType, choose_mixed_precision
        from quanta.quantsim import QuantizationSimModel
        scheme = "post_training_tf"
        extra = {"progress": False}
    else:
        from aimet_torch.batch_norm_fold import fold_all_batch_norms
        from aimet_torch.common.defs import CallbackFunc, QuantizationDataType, QuantScheme
        from aimet_torch.mixed_precision import choose_mixed_precision
        from aimet_torch.quantsim import QuantizationSimModel
        scheme = QuantScheme.post_training_tf
        extra = {}
    fold_all_batch_norms(model, tuple(data[0].shape), dummy_input=data[0])
    t = QuantizationDataType.int
    candidates = [((16, t), (8, t)), ((8, t), (8, t)), ((8, t), (4, t))]
    sim = QuantizationSimModel(model, data[0], quant_scheme=scheme, config_file=config)
    t0 = time.perf_counter()
    # AIMET needs initialised encodings first (quanta calibrates each candidate itself)
    sim.compute_encodings(forward, None, **extra)
    pareto = choose_mixed_precision(sim, data[0], candidates, CallbackFunc(phase1), CallbackFunc(phase2), drop,
                                     results, True, CallbackFunc(forward), phase2_reverse=reverse, **extra)
    seconds = time.perf_counter() - t0
    final = phase2(sim.model)
    counts["phase2"] -= 1
    info = {}
    path = os.path.join(results, "amp_info_list.json")
    if os.path.exists(path):  # not written after an early exit
        with open(path) as f:
            info = dict(tuple(x) for x in json.load(f))
    bit_ops = None
    if library == "quanta":
        bit_ops = info.get("final relative BitOps")
    elif pareto:
        # AIMET's pareto list holds the evaluated prefixes; it leaves the sim at the cheapest meeting the budget
        fp32 = info.get("fp32 accuray")
        ok = [p for p in pareto if p[1] >= fp32 - drop]
        bit_ops = min(p[0] for p in ok) if ok else 1.0
        if reverse:  # AIMET's reverse points are relative to the cheapest candidate, where its walk starts
            bit_ops *= min(a * w for (a, _), (w, _) in candidates) / max(a * w for (a, _), (w, _) in candidates)
    return {"seconds": seconds, "final": final, "bit_ops": bit_ops, "counts": counts, "info": info}


def info_ok(r: dict) -> bool:
    return "candidate scores" in r["info"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--drop", type=float, default=0.001, help="allowed drop of the mean cosine below fp32")
    parser.add_argument("--phase2-reverse", action="store_true", help="both libraries walk phase 2 bottom-up")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    model, data, held_out = bench_adaround.build(args.batches, args.batch_size, args.size)
    print(f"ResNet (transformers, 4 stages), {args.batches} calibration batches x {args.batch_size} images "
          f"{args.size}x{args.size}, candidates W8A16/W8A8/W4A8, budget: cosine >= fp32 - {args.drop}, "
          f"phase 2 {'bottom-up (phase2_reverse)' if args.phase2_reverse else 'top-down'}, "
          f"threads: {torch.get_num_threads()}")
    libraries = ["quanta"] + (["aimet"] if importlib.util.find_spec("aimet_torch") is not None else [])
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for library in libraries:
            rows[library] = r = _run(library, model, data, held_out, args.drop, tmp, args.phase2_reverse)
            if library == "quanta" and info_ok(r):
                print("uniform candidates (cosine): " + ", ".join(f"{c} {v:.5f}" for c, v in
                                                                  r["info"]["candidate scores"])
                      + f"; fp32 {r['info']['fp32 accuracy']:.5f}")
            ops = "n/a (early exit)" if r["bit_ops"] is None else f"{r['bit_ops']:.3f}x"
            print(f"{library:6s} chosen: cosine {r['final']:.5f}, BitOps {ops} uniform W8A16; evaluations "
                  f"phase 1 {r['counts']['phase1']}, phase 2 {r['counts']['phase2']}; {r['seconds']:.1f} s")
    if "aimet" not in rows:
        print("aimet-torch n/a (not importable here)")
        return
    q, a = rows["quanta"], rows["aimet"]
    print(f"quanta / aimet wall time: {q['seconds'] / a['seconds']:.2f}x")


if __name__ == "__main__":
    main()
