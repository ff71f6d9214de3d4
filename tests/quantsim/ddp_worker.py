"""Worker of test_ddp.py: one rank of a 2-process gloo group running QuantizationSimModel under DDP (not a test module).

Every rank builds the same SmallCNN, calibrates its sim on its own data (the
statistics are all-reduced by quanta), then trains ``sim.model`` wrapped in
``DistributedDataParallel`` for a few steps on its own batches. It writes what
the test compares to ``<out_dir>/rank<r>.pt``.
"""

from __future__ import annotations

import copy
import datetime
import os
import warnings

import torch
import torch.distributed as dist
import torch.nn.functional as F

SCHEME = "range_learning_min_max"
STEPS = 3
WIDTH = 8


def calibration_batches(rank: int) -> list[torch.Tensor]:
    """Different data per rank, different ranges and a different number of batches."""
    from quantsim_models import make_cnn_data

    x, _ = make_cnn_data(48 * (3 - rank), seed=10 + rank)
    x = x * (1.0 + 0.5 * rank) - 0.2 * rank
    return [x[i:i + 48] for i in range(0, len(x), 48)]


def training_batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    from quantsim_models import make_cnn_data

    return make_cnn_data(32, seed=100 + 10 * step + rank)


def build_sim():
    """The same model and sim on every rank (and in the test's single-process reference)."""
    from quanta.quantsim import QuantizationSimModel
    from quantsim_models import SmallCNN

    torch.manual_seed(0)
    model = SmallCNN(width=WIDTH)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return QuantizationSimModel(model, torch.zeros(2, 3, 16, 16), quant_scheme=SCHEME,
                                    param_quant_scheme=SCHEME, default_param_bw=4)


def encodings(sim) -> dict[str, tuple[torch.Tensor, ...]]:
    """``(min, max, scale, offset)`` of every quantizer."""
    out = {}
    for name, q in sim.named_quantizers():
        enc = q.get_encodings()
        out[name] = tuple(t.detach().clone() for t in (q.min, q.max, enc.scale, enc.offset))
    return out


def parameters(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def _train_step(model, opt, rank: int, step: int) -> float:
    x, y = training_batch(rank, step)
    loss = F.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


def run(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # quantsim_models in the spawned process
    from torch.nn.parallel import DistributedDataParallel as DDP

    from quanta.distributed import local_statistics

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    try:
        result: dict = {}
        batches = calibration_batches(rank)

        # this rank's data only: what a rank would get without the all-reduce
        local = build_sim()
        with local_statistics():
            local.compute_encodings(batches, progress=False)
        result["local_encodings"] = encodings(local)

        sim = build_sim()
        ddp = DDP(sim.model)
        sim.compute_encodings(batches, progress=False)  # a collective: statistics are reduced over the ranks
        result["encodings"] = encodings(sim)
        calibrated = copy.deepcopy(sim.model.state_dict())
        result["params"] = [parameters(sim.model)]
        result["losses"] = []
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        ddp.train()
        for step in range(STEPS):
            result["losses"].append(_train_step(ddp, opt, rank, step))
            result["params"].append(parameters(sim.model))

        # control: the same first step from the same calibrated state, without DDP, lets the ranks drift apart
        control = build_sim()
        control.model.load_state_dict(calibrated)
        opt = torch.optim.SGD(control.model.parameters(), lr=0.05, momentum=0.9)
        control.model.train()
        _train_step(control.model, opt, rank, 0)
        result["params_without_ddp"] = parameters(control.model)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()  # no rank tears its gloo pairs down while the other is still using them
    finally:
        dist.destroy_process_group()
