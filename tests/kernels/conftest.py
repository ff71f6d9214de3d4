"""Fixtures for kernel tests."""

import pytest

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
