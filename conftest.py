"""Shared pytest setup: doctests see ``torch`` without importing it, and the
files that code run by the tests writes with ``tempfile`` (doctests' and the
documentation pages' examples, ``tempfile.mkdtemp()``) go under pytest's own
temporary directory, which pytest prunes, not into the system's ``/tmp``."""

import tempfile

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _tempfile_under_pytest(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("tempfile")))
        yield


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace):
    doctest_namespace["torch"] = torch
