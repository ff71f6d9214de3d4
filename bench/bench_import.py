"""How much ``import quanta`` adds to ``import torch`` (target: under 0.5 s).

Run:  python bench/bench_import.py [--pairs 9]

Each pair starts two fresh interpreters, one importing torch and one importing
torch plus quanta's public modules; the figure is the median difference.
Importing quanta never builds the native kernels (they build on first use).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time


def _time(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=9)
    args = p.parse_args()
    _time("import torch")  # warm the file cache
    diffs, bases = [], []
    for _ in range(args.pairs):
        base = _time("import torch")
        full = _time("import torch, quanta, quanta.quantization")
        diffs.append(full - base)
        bases.append(base)
    print(f"import torch: {statistics.median(bases):.3f} s; import quanta adds {statistics.median(diffs):.3f} s "
          f"(median of {args.pairs} pairs)")


if __name__ == "__main__":
    main()
