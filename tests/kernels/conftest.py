"""Run every kernel test on both implementations: the native kernel and the eager PyTorch path."""

import pytest

from quanta.kernels import native


@pytest.fixture(autouse=True, params=["native", "eager"])
def kernel_path(request):
    if request.param == "eager":
        with native.disabled():
            yield request.param
    else:
        if native.library() is None:
            pytest.skip(f"native kernels unavailable: {native.status()}")
        yield request.param
