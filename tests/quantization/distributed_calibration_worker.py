"""Worker of test_distributed_calibration.py: one rank of a 2-process gloo group (not a test module).

Every rank calibrates every analyzer on its own shard of the data and writes
its encodings to ``<out_dir>/rank<r>.pt``; the test compares them with a
single-process run over all the data.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def shards(rank: int, world: int) -> list[torch.Tensor]:
    """The batches of one rank: different sizes and ranges per rank, one empty batch, some NaN."""
    gen = torch.Generator().manual_seed(100 + rank)
    out = []
    for i in range(3 + rank):
        scale = 0.5 + rank + i
        out.append(torch.randn(16 + 8 * i, 6, 32, generator=gen) * scale + (rank - 0.5))
    out[-1][0, rank, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    out.append(torch.empty(0, 6, 32))
    return out


def all_data(world: int) -> list[torch.Tensor]:
    return [b for r in range(world) for b in shards(r, world)]


def configurations():
    """``(name, factory)`` pairs: every analyzer at three granularities."""
    from quanta.quantization import encoding_analyzer as ea

    def grans(cls, **kw):
        return [
            (f"{cls.__name__}/tensor", lambda: cls((), **kw)),
            (f"{cls.__name__}/channel", lambda: cls((6, 1), **kw)),
            (f"{cls.__name__}/block", lambda: cls((6, 4), block_size=(1, 8), **kw)),
        ]

    out = grans(ea.MinMaxEncodingAnalyzer)
    out += grans(ea.PercentileEncodingAnalyzer, num_bins=256, percentile=99.0)
    out += grans(ea.SqnrEncodingAnalyzer, num_bins=256)
    out += grans(ea.MseEncodingAnalyzer, num_bins=256, asymmetric_candidates=8, symmetric_candidates=20)
    out += grans(ea.EntropyEncodingAnalyzer, num_bins=256, asymmetric_candidates=8, symmetric_candidates=20)
    return out


def calibrate(batches: list[torch.Tensor]) -> dict[str, tuple[torch.Tensor, ...]]:
    import warnings

    results = {}
    for name, make in configurations():
        a = make()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            for b in batches:
                a.update_stats(b)
        results[name] = a.compute_encodings(15, False) + a.compute_encodings(255, True)
    return results


def run(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        results = calibrate(shards(rank, world))
        # a rank that saw no data takes part with empty statistics
        from quanta.quantization.encoding_analyzer import SqnrEncodingAnalyzer

        idle = SqnrEncodingAnalyzer((6, 1), num_bins=256)
        if rank == 0:
            idle.update_stats(shards(0, world)[0])
        results["idle_rank"] = idle.compute_encodings(15, False)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        # both ranks reach this point before either tears its gloo pairs down: a rank that
        # destroys its group while the peer is still closing its side can abort in gloo's
        # C++ threads ("terminate called without an active exception", seen once in CI)
        dist.barrier()
    finally:
        dist.destroy_process_group()
