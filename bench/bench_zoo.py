"""The model zoo through QuantizationSimModel (default W8A8): one row per architecture.

Columns: how it was captured, the number of quantizers, what stays in float (ops and modules), the output
SQNR against the float model, and the simulated forward time relative to the float model's, both timed in
this run (median of repeated calls, no grad, one thread).

    python bench/bench_zoo.py [--json] [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "quantsim"))

from quanta.quantsim import QuantizationSimModel  # noqa: E402
from zoo_models import ZOO, build, sqnr_db  # noqa: E402


def _median_time(fn, repeat: int = 15) -> float:
    with torch.no_grad():
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def row(name: str) -> dict:
    model, inputs, key = build(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, inputs(2, 8))
    torch.manual_seed(1)
    sim.compute_encodings([inputs(3, 10) for _ in range(3)], progress=False)
    x = inputs(8, 32)
    sim.model.eval()
    with torch.no_grad():
        sqnr = sqnr_db(model(**x)[key], sim.model(**x)[key])
    t_float = _median_time(lambda: model(**x))
    t_sim = _median_time(lambda: sim.model(**x))
    return {"model": name, "captured": sim.capture_method, "quantizers": sum(1 for _ in sim.named_quantizers()),
            "in_float": len(sim.float_ops) + len(sim.unquantized_modules), "sqnr_db": round(sqnr, 1),
            "sim_vs_float": round(t_sim / t_float, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help=f"models (default: all of {', '.join(ZOO)})")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = [row(n) for n in args.names or ZOO]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print("| model | captured | quantizers | ops/modules in float | W8A8 SQNR (dB) | sim forward / float |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['captured']} | {r['quantizers']} | {r['in_float']} | {r['sqnr_db']} | "
              f"{r['sim_vs_float']}x |")


if __name__ == "__main__":
    main()
