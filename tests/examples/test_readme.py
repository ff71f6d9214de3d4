"""The Python snippets of README.md run, in order, as a reader would paste them, and give what their
comments say. (The documentation site's pages are checked by tests/docs.)"""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def _snippets() -> list[tuple[int, str]]:
    text = README.read_text(encoding="utf-8")
    return [(text.count("\n", 0, m.start()) + 2, m.group(1))
            for m in re.finditer(r"```python\n(.*?)```", text, re.DOTALL)]


def test_readme_has_one_snippet_per_dialect():
    code = "\n".join(c for _, c in _snippets())
    for name in ("quanta.quantization", "QuantizationSimModel", "quantize_", "quanta.tensor_quant"):
        assert name in code


def test_readme_python_snippets_run_and_print_what_they_say(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "readme"}
    for line, code in _snippets():
        try:
            exec(compile(code, f"README.md:{line}", "exec"), namespace)  # noqa: S102  (our own README)
        except Exception as e:  # noqa: BLE001  (any failure of a snippet; named by its README line)
            pytest.fail(f"README.md snippet at line {line} failed: {type(e).__name__}: {e}")
    # the values the comments state
    assert namespace["x_q"].tolist() == [[26.0, -23.0], [2.0, 2.0]]
    assert torch.allclose(namespace["x_dq"], torch.tensor([[2.6, -2.3], [0.2, 0.2]]))
    assert namespace["codes"].tolist() == [-127.0, 64.0, 127.0] and namespace["scale"].item() == 127.0
    assert type(namespace["mlp"][0].weight).__name__ == "AffineQuantizedTensor"
    assert "model output" in capsys.readouterr().out  # the SQNR report was printed
