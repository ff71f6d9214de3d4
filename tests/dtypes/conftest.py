"""Fixtures for the ``quanta.dtypes`` tests."""

import pytest


@pytest.fixture
def fresh_fallback_warnings(monkeypatch):
    """Forget which fallback operations already warned, so a test sees the one-time warning."""
    from quanta.dtypes import affine_quantized_tensor

    monkeypatch.setattr(affine_quantized_tensor, "_WARNED", set())
    return affine_quantized_tensor._WARNED
