"""The Python snippets of README.md run, in order, as a reader would paste them.

Snippets that use names the README leaves to the reader (``model``, ``x``,
``calib_batches``, ``forward_pass``, ``dummy_input``, ``scale``/``offset``) get
them from :data:`READER_NAMES`: a small CNN and its data. Each snippet runs in
the namespace the snippets before it left, in a temporary working directory
(some write files).
"""

from __future__ import annotations

import pathlib
import re

import pytest
import torch
from torch import nn

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _snippets() -> list[tuple[int, str]]:
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 2, m.group(1))
            for m in re.finditer(r"```python\n(.*?)```", text, re.DOTALL)]


def _reader_names() -> dict:
    """What a reader of the whole-model snippets has at hand: a model, an input, batches, a callback."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10)).eval()
    batches = [torch.randn(4, 3, 8, 8) for _ in range(3)]

    def forward_pass(m: nn.Module, data: list) -> None:
        for b in data:
            m(b)

    return {"model": model, "x": batches[0], "dummy_input": batches[0], "calib_batches": batches,
            "eval_batches": batches[1:], "forward_pass": forward_pass, "forward_pass_args": batches}


def test_readme_has_the_snippets_this_test_knows():
    assert len(_snippets()) >= 10


def test_readme_python_snippets_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme"}
    calibrated_sim = None
    for line, code in _snippets():
        uses_model = "sim." in code or "QuantizationSimModel(" in code
        if uses_model:
            namespace.update(_reader_names())
            if "QuantizationSimModel(" not in code:  # continues with the calibrated sim of an earlier snippet
                assert calibrated_sim is not None, f"README.md:{line} uses sim before any snippet builds one"
                namespace["sim"] = calibrated_sim
        if "out=buf" in code:  # the snippet shows the keyword; scale and offset are the reader's
            namespace.update(scale=torch.tensor(0.01), offset=torch.tensor(-128.0))
        try:
            exec(compile(code, f"README.md:{line}", "exec"), namespace)  # noqa: S102  (our own README)
        except Exception as e:  # noqa: BLE001  (any failure of a snippet; named by its README line)
            pytest.fail(f"README.md snippet at line {line} failed: {type(e).__name__}: {e}")
        if "compute_encodings" in code and "sim" in namespace:
            calibrated_sim = namespace["sim"]
