"""The model zoo through QuantizationSimModel (default config, W8A8): one row per architecture (issue 15).

For each model of ``tests/quantsim/zoo_models.py``, built and calibrated as ``tests/quantsim/test_zoo.py`` does
(``zoo_models.simulate``: dummy input at batch 2 x length 8, calibration on 4 batches of 8 x 10):

* how it was captured (``export``, ``fx`` or ``leaves``), the number of quantizers, what stays in float
  (functional ops without a quantized counterpart and modules kept whole, with the first names);
* the W8A8 output SQNR against the float model on held-out inputs (batch 4 x length 12, as the test);
* the simulated forward time over the float model's (target <= 2x) on a batch of 8 x length 32, eval mode,
  no grad: the median of 15 interleaved (sim, float) pairs (``bench/harness.py``), one thread by default.

    python bench/bench_zoo.py [--json] [--threads N] [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "quantsim"))
sys.path.insert(0, os.path.dirname(__file__))
from harness import ratio  # noqa: E402
from zoo_models import EVALUATION, ZOO, simulate  # noqa: E402

from quanta._text import shortlist  # noqa: E402
from quanta.tools.measure import sqnr_db  # noqa: E402

TIMED = (8, 32)  # (batch, length) of the timed forward


def row(name: str) -> dict:
    z = simulate(name)
    sim = z.sim
    torch.manual_seed(2)  # the test's held-out inputs
    x = z.inputs(*EVALUATION)
    sim.model.eval()
    with torch.no_grad():
        sqnr = sqnr_db(z.model(**x)[z.key], sim.model(**x)[z.key])
    torch.manual_seed(4)
    x = z.inputs(*TIMED)

    def run_sim():
        with torch.no_grad():
            sim.model(**x)

    def run_float():
        with torch.no_grad():
            z.model(**x)

    slowdown, t_sim, t_float = ratio(run_sim, run_float, pairs=15, warmup=3)
    in_float = sim.float_ops + sim.unquantized_modules
    return {"model": name, "architecture": type(z.model).__name__, "captured": sim.capture_method,
            "quantizers": sum(1 for _ in sim.named_quantizers()), "in_float": in_float,
            "sqnr_db": round(sqnr, 1), "sim_vs_float": round(slowdown, 2), "float_ms": round(t_float * 1e3, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"models (default: all of {', '.join(ZOO)})")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in ZOO]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(ZOO)}")
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")  # transformers' notes; what stays in float is a column
    rows = []
    for name in args.names or ZOO:
        rows.append(row(name))
        if not args.json:
            print(f"{name}: done", file=sys.stderr, flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| model | architecture | captured | quantizers | in float | W8A8 SQNR (dB) | sim forward / float |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        in_float = f"{len(r['in_float'])}: {shortlist(r['in_float'], limit=3)}" if r["in_float"] else "0"
        print(f"| {r['model']} | {r['architecture']} | {r['captured']} | {r['quantizers']} | {in_float} | "
              f"{r['sqnr_db']} | {r['sim_vs_float']}x |")


if __name__ == "__main__":
    main()
