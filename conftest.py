"""Shared pytest setup: doctests see ``torch`` without importing it."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _doctest_namespace(doctest_namespace):
    doctest_namespace["torch"] = torch
