"""The ``quanta`` command line, end to end in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from quanta.cli import build_parser, main

pytest.importorskip("sklearn")


def _run(*args: str, cwd: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "quanta.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=300)


def test_demo_end_to_end(tmp_path):
    plot = tmp_path / "sqnr.png"
    r = _run("demo", "--epochs", "2", "--qat-epochs", "1", "--plot", str(plot), "--no-progress", "--threads", "1",
             cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[0].split()[:2] == ["scheme", "accuracy"]
    schemes = [line[:20].strip() for line in lines[1:]]
    assert schemes == ["float32", "W8A8 per-tensor", "W8A8 per-channel", "W4A8 per-block 16", "FP8 e4m3 W+A",
                       "W4A8 QAT"]
    accuracies = [float(line.split("%")[0].split()[-1]) for line in lines[1:]]
    assert accuracies[0] > 80 and all(a > 50 for a in accuracies)
    sizes = [int(line.split("%")[1].split()[0].replace(",", "")) for line in lines[1:]]
    assert sizes[1] < sizes[0] / 3.5 and sizes[3] < sizes[2] and sizes[5] < sizes[2]  # int8 ~1/4, 4-bit smaller
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments_exit_nonzero_with_one_line(tmp_path):
    r = _run("demo", "--epochs", "0", cwd=str(tmp_path))
    assert r.returncode == 2 and "positive integer" in r.stderr and "Traceback" not in r.stderr
    r = _run("frobnicate", cwd=str(tmp_path))
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_errors_are_one_line_unless_debug(monkeypatch, capsys):
    from quanta.tools import demo

    def boom(*args, **kwargs):
        raise ValueError("the data is wrong")

    monkeypatch.setattr(demo, "run_demo", boom)
    assert main(["demo", "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "quanta demo: error: the data is wrong"
    with pytest.raises(ValueError, match="the data is wrong"):
        main(["--debug", "demo", "--no-plot"])


def test_parser_requires_a_command():
    with pytest.raises(SystemExit):
        build_parser().parse_args([])


def test_parser_knows_inspect_and_quantize():
    args = build_parser().parse_args(["inspect", "model.onnx", "--json"])
    assert (args.command, args.file, args.json) == ("inspect", "model.onnx", True)
    args = build_parser().parse_args(["quantize", "m.pt2", "--calib", "x.npy", "--out", "out", "--scheme", "tf",
                                      "--encoding-version", "2.0.0", "--param-bw", "4"])
    assert (args.model, args.calib, args.out, args.param_bw) == ("m.pt2", "x.npy", "out", 4)
    assert args.scheme.value == "min_max" and args.encoding_version.value == "2.0.0"  # parsed once, into enums
    assert args.output_bw is None and args.batch_size is None  # unset: QuantizeConfig's defaults apply


def test_quantize_help_shows_the_config_defaults(capsys):
    from quanta.tools.quantize_model import QuantizeConfig

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["quantize", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default {QuantizeConfig.param_bw})" in text
    assert f"(default {QuantizeConfig.encoding_version.value})" in text


def test_usage_errors_are_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["quantize", "m.pt", "--calib", "x.pt", "--out", "o", "--batch-size", "0"])
    assert exc.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("quanta quantize: error: argument --batch-size: expected a positive integer")
