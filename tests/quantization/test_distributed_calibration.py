"""Distributed calibration: 2 processes on gloo (CPU) end with the encodings of one process that saw all the data."""

import os
import sys
import time

import pytest
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import distributed_calibration_worker as worker  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="torch.distributed with gloo is not available"
)

WORLD = 2


def test_two_ranks_match_a_single_process_over_all_the_data(tmp_path):
    import torch.multiprocessing as mp

    t0 = time.perf_counter()
    init_file = tmp_path / "init"
    mp.start_processes(worker.run, args=(WORLD, str(init_file), str(tmp_path)), nprocs=WORLD, join=True,
                       start_method="spawn")
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    assert time.perf_counter() - t0 < 20
    single = worker.calibrate(worker.all_data(WORLD))
    assert set(per_rank[0]) == set(single) | {"idle_rank"}
    for name, expected in single.items():
        for r in range(WORLD):
            got = per_rank[r][name]
            assert all(torch.equal(g, e) for g, e in zip(got, expected)), f"{name} on rank {r}"
    # the idle-rank case: only rank 0 saw a batch
    from quanta.quantization.encoding_analyzer import SqnrEncodingAnalyzer

    ref = SqnrEncodingAnalyzer((6, 1), num_bins=256)
    ref.update_stats(worker.shards(0, WORLD)[0])
    expected = ref.compute_encodings(15, False)
    for r in range(WORLD):
        assert all(torch.equal(g, e) for g, e in zip(per_rank[r]["idle_rank"], expected))
