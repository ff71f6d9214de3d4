"""The scripts in examples/ run as documented."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300)


def test_quickstart_runs():
    r = _run(str(EXAMPLES / "quickstart.py"))
    assert r.returncode == 0, r.stderr


def test_quantsim_export_writes_onnx_and_encodings(tmp_path):
    pytest.importorskip("onnx")
    r = _run(str(EXAMPLES / "quantsim_export.py"), str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "attention.onnx").stat().st_size > 0
    assert (tmp_path / "attention.encodings").stat().st_size > 0
    assert "model output" in r.stdout and "QAT loss" in r.stdout
