"""QuantizationSimModel under DistributedDataParallel: 2 processes, gloo, CPU (workers in ddp_worker.py).

Calibration on different data per rank gives every rank the encodings of a
single process that saw all of it (min_max: exactly), and QAT steps on
different batches keep every weight and every quantizer range bit-identical
across the ranks.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import ddp_worker as worker

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="torch.distributed with gloo is not available"
)

WORLD = 2
TIMEOUT = 120.0  # seconds; the workers are killed after that, so CI never hangs


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("ddp")
    init_file = out / "init"  # file:// rendezvous: no port to pick, no port to race for
    ctx = mp.start_processes(worker.run, args=(WORLD, str(init_file), str(out)), nprocs=WORLD, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + TIMEOUT
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                pytest.fail(f"DDP workers did not finish within {TIMEOUT:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
                p.join()
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


@pytest.fixture(scope="module")
def single_process() -> dict[str, tuple[torch.Tensor, ...]]:
    """One process calibrating on the batches of both ranks (no process group)."""
    assert not (dist.is_available() and dist.is_initialized())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the workers
    try:
        sim = worker.build_sim()
        sim.compute_encodings([b for r in range(WORLD) for b in worker.calibration_batches(r)], progress=False)
        return worker.encodings(sim)
    finally:
        torch.set_num_threads(threads)


def _equal(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_the_ranks_saw_different_data(ranks):
    local = [r["local_encodings"] for r in ranks]
    assert local[0].keys() == local[1].keys()
    assert any(not _equal(local[0][n], local[1][n]) for n in local[0])
    assert ranks[0]["losses"] != ranks[1]["losses"]


def test_calibration_matches_a_single_process_over_all_the_data(ranks, single_process):
    encs = [r["encodings"] for r in ranks]
    assert encs[0].keys() == encs[1].keys() == single_process.keys()
    activation = [n for n in single_process if ".output_quantizers." in n or ".input_quantizers." in n]
    assert activation
    for name, expected in single_process.items():
        for r in range(WORLD):
            assert _equal(encs[r][name], expected), f"{name} on rank {r}: {encs[r][name]} != {expected}"
    # the reduction mattered: some activation range of each rank alone is narrower than the global one
    for r in range(WORLD):
        assert any(not _equal(ranks[r]["local_encodings"][n], single_process[n]) for n in activation)


def test_qat_steps_keep_weights_and_ranges_identical_across_ranks(ranks):
    steps = [r["params"] for r in ranks]
    assert len(steps[0]) == len(steps[1]) == worker.STEPS + 1
    ranges = [n for n in steps[0][0] if n.endswith((".min", ".max"))]
    weights = [n for n in steps[0][0] if n.endswith(".weight") and "quantizers" not in n]
    assert ranges and weights
    for k in range(worker.STEPS + 1):
        assert steps[0][k].keys() == steps[1][k].keys()
        for name in steps[0][k]:
            assert torch.equal(steps[0][k][name], steps[1][k][name]), f"{name} differs after step {k}"
    first, last = steps[0][0], steps[0][-1]
    assert all(not torch.equal(first[n], last[n]) for n in weights)
    moved = [n for n in ranges if not torch.equal(first[n], last[n])]
    assert len(moved) == len(ranges), sorted(set(ranges) - set(moved))


def test_without_ddp_the_same_step_drifts_apart(ranks):
    a, b = (r["params_without_ddp"] for r in ranks)
    assert a.keys() == b.keys()
    assert ranks[0]["params"][0].keys() == a.keys()
    assert any(not torch.equal(a[n], b[n]) for n in a if n.endswith((".min", ".max")))
    assert any(not torch.equal(a[n], b[n]) for n in a if n.endswith(".weight"))
