"""Shared pytest setup: doctests see ``torch`` without importing it, and the
files their examples write (``tempfile.mkdtemp()``) go under pytest's own
temporary directory, which pytest prunes, not into the system's ``/tmp``."""

import tempfile

import pytest
import torch


@pytest.fixture(autouse=True)
def _doctest_namespace(request, doctest_namespace):
    doctest_namespace["torch"] = torch
    if isinstance(request.node, pytest.DoctestItem):
        mp = pytest.MonkeyPatch()
        mp.setattr(tempfile, "tempdir", str(request.getfixturevalue("tmp_path")))
        yield
        mp.undo()
    else:
        yield
