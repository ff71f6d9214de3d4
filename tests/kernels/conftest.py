"""Fixtures for kernel tests."""

import pytest
import torch

from quanta.kernels import native


@pytest.fixture(params=["native", "eager"])
def kernel_path(request):
    """Run a test on both implementations: the native kernel and the eager PyTorch path."""
    if request.param == "eager":
        with native.disabled():
            yield request.param
    else:
        if native.library() is None:
            pytest.skip(f"native kernels unavailable: {native.status()}")
        yield request.param


def _at_thread_counts(fn, counts):
    """``[fn() for each of torch's intra-op thread counts in counts]``, the caller's count restored after."""
    threads = torch.get_num_threads()
    try:
        out = []
        for c in counts:
            torch.set_num_threads(c)
            out.append(fn())
        return out
    finally:
        torch.set_num_threads(threads)


@pytest.fixture
def at_thread_counts():
    """``at_thread_counts(fn, counts)``: ``fn()`` at each thread count (3 on 2 cores: the kernels' threads steal
    work from each other), torch's setting restored after."""
    return _at_thread_counts
