"""Fixtures shared by the command-line tests."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="session")
def write_module() -> Callable[[Path, str, str], ModuleType]:
    """``write_module(directory, name, source)``: ``source`` written to ``directory/name.py`` and imported as
    ``name`` (registered in ``sys.modules``, so that torch.save can pickle its classes and ``--model-class
    name:Class`` finds it once ``directory`` is on the path)."""

    def write(directory: Path, name: str, source: str) -> ModuleType:
        path = directory / f"{name}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module

    return write
