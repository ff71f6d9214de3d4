"""Fixtures for the ``quanta.dtypes`` tests."""

import pytest


@pytest.fixture
def fresh_fallback_warnings(monkeypatch):
    """Forget which fallback operations already warned, so a test sees the one-time warning."""
    from quanta.dtypes import ops

    monkeypatch.setattr(ops, "_WARNED", set())
    return ops._WARNED
