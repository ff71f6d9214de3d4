"""QuantizationSimModel overhead on the two reference models (issue 7).

Prints, for the small CNN and the transformer block of tests/quantsim:
* forward time of ``sim.model`` (W8A8, calibrated, eval, no_grad) / the float model
  (target ≤ 2×; AIMET 2.42 measured here by the issue's author: 4.7× CNN, 8.6× transformer);
* the same for a training step's forward+backward;
* memory of forward+backward vs the float model (target ≤ 1.5×): the bytes of every
  tensor autograd saves for backward (counted once per storage) plus the output --
  what grows with batch size in training and what fake quantization adds to.

Times are medians of interleaved (sim, float) pairs (``bench/harness.py``): the
ratio is meaningful on a shared machine, the milliseconds less so.
Run: ``python bench/bench_quantsim.py [--threads 2]``.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "quantsim"))
sys.path.insert(0, os.path.dirname(__file__))
from harness import ratio  # noqa: E402
from quantsim_models import SmallCNN, TransformerBlock  # noqa: E402

from quanta.quantsim import QuantizationSimModel  # noqa: E402


def _saved_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Peak bytes of tensors alive during forward+backward: autograd's saved tensors plus the output.

    Counts each storage once (views share storage), so it measures what autograd keeps
    for backward -- the memory that grows with batch size in training.
    """
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor):
        if isinstance(t, torch.nn.Parameter):
            return t
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = model(x)
    out = y.untyped_storage().nbytes()
    y.float().sum().backward()
    return sum(storages.values()) + out


def bench(name: str, model: torch.nn.Module, x: torch.Tensor) -> None:
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(copy.deepcopy(model), x)
    sim.compute_encodings([x], progress=False)
    qm = sim.model.eval()
    with torch.no_grad():
        r_fwd, tq, tf = ratio(lambda: qm(x), lambda: model(x), pairs=41)
    model.train()
    qm.train()
    r_bwd, tbq, tbf = ratio(lambda: qm(x).sum().backward(), lambda: model(x).sum().backward(), pairs=21)
    gc.collect()
    mf = _saved_bytes(model, x)
    mq = _saved_bytes(qm, x)
    print(f"{name:<18} forward {tf * 1e3:7.2f} ms float {tq * 1e3:7.2f} ms sim  ratio {r_fwd:5.2f}  (target <= 2)")
    print(f"{'':<18} fwd+bwd {tbf * 1e3:7.2f} ms float {tbq * 1e3:7.2f} ms sim  ratio {r_bwd:5.2f}")
    print(f"{'':<18} fwd+bwd saved memory {mf / 2**20:7.2f} MiB float {mq / 2**20:7.2f} MiB sim  "
          f"ratio {mq / mf:5.2f}  (target <= 1.5)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    bench("SmallCNN b32", SmallCNN(), torch.randn(32, 3, 16, 16))
    bench("Transformer b8", TransformerBlock(64, 4), torch.randn(8, 64, 64))


if __name__ == "__main__":
    main()
