"""``quanta quantize`` / ``quanta bench`` on a model with several inputs: a Hugging Face-style encoder taking
``(input_ids, attention_mask)`` and returning a dict, as a state dict and as a torch.export program, with data
as a tuple or as a dict keyed by the forward's parameter names in a ``.pt`` file; and the one-line input errors."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from quantsim_models import HFEncoder, make_token_data

from quanta.cli import main
from quanta.tools import bench_model as bm
from quanta.tools.measure import batch_shape, call_model, format_batch_shape, time_ratio

# the encoder of the QuantSim tests (tests/quantsim is on pytest's pythonpath, so --model-class finds it)
CLASS = "quantsim_models:HFEncoder"


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    root = tmp_path_factory.mktemp("multi")
    torch.manual_seed(0)
    model = HFEncoder().eval()
    ids, mask = make_token_data(40)
    torch.save(model.state_dict(), root / "enc.pt")
    torch.save((ids, mask), root / "tuple.pt")
    torch.save({"attention_mask": mask, "input_ids": ids}, root / "dict.pt")  # not in the forward's order
    torch.save(list(make_token_data(20, seed=1)), root / "eval.pt")
    torch.save((ids, mask[:30]), root / "sizes.pt")
    torch.save({"input_ids": ids, "token_type_ids": mask}, root / "badkeys.pt")
    torch.save({"attention_mask": mask}, root / "skips.pt")
    torch.save(ids, root / "ids_only.pt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(model, (ids[:8], mask[:8]))  # a static batch of 8
    torch.export.save(program, root / "enc.pt2")
    return {"dir": root, "model": model, "ids": ids, "mask": mask}


@pytest.fixture
def here(d, monkeypatch):
    monkeypatch.chdir(d["dir"])
    monkeypatch.syspath_prepend(str(d["dir"]))
    real = bm.time_ratio  # fewer timing repetitions: these tests are about inputs, not latency
    monkeypatch.setattr(bm, "time_ratio", lambda m, b, x: real(m, b, x, rounds=1, reps=1))
    return d


def _main(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main([*args, "--no-progress"])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _error_line(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"quanta {command}: error: "), err
    return lines[0]


def _onnx_outputs(path, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask"]
    names = [o.name for o in session.get_outputs()]
    got = session.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})
    return {n: torch.from_numpy(g) for n, g in zip(names, got)}


# ---------------------------------------------------------------------- quanta quantize
def test_quantize_state_dict_tuple_and_dict_data(here, capsys):
    d = here
    code, out, err = _main(capsys, "quantize", "enc.pt", "--model-class", CLASS, "--calib", "tuple.pt",
                           "--out", "q_tuple", "--batch-size", "16")
    assert code == 0, err
    assert "calibrated on 3 batches of shapes (16, 16), (16, 16)" in out, out
    code, _, err = _main(capsys, "quantize", "enc.pt", "--model-class", CLASS, "--calib", "dict.pt",
                            "--out", "q_dict", "--batch-size", "16")
    assert code == 0, err
    # the dict keyed by the forward's parameter names is the same data as the tuple: the same encodings
    tuple_enc = json.loads((d["dir"] / "q_tuple" / "quantsim.encodings.json").read_text())
    dict_enc = json.loads((d["dir"] / "q_dict" / "quantsim.encodings.json").read_text())
    assert tuple_enc == dict_enc
    ids, mask = d["ids"][:16], d["mask"][:16]
    got = _onnx_outputs(d["dir"] / "q_tuple" / "model.onnx", ids, mask)
    with torch.no_grad():
        want = d["model"](ids, mask)
    assert got["last_hidden_state"].shape == want["last_hidden_state"].shape
    assert torch.allclose(got["pooler_output"], want["pooler_output"], atol=0.25)  # W8A8 of the float model


def test_quantize_export_program_with_two_inputs(here, capsys):
    d = here
    code, out, err = _main(capsys, "quantize", "enc.pt2", "--calib", "dict.pt", "--out", "q_export")
    assert code == 0, err
    assert "calibrated on 5 batches of shapes (8, 16), (8, 16)" in out, out  # the program's static batch
    assert "torch.export program: rebuilt" in out
    ids, mask = d["ids"][:8], d["mask"][:8]
    got = _onnx_outputs(d["dir"] / "q_export" / "model.onnx", ids, mask)
    with torch.no_grad():
        want = d["model"](ids, mask)
    assert torch.allclose(got["pooler_output"], want["pooler_output"], atol=0.25)


# ---------------------------------------------------------------------- quanta bench
def test_bench_state_dict_and_export_program(here, capsys):
    code, out, err = _main(capsys, "bench", "enc.pt", "--model-class", CLASS, "--data", "tuple.pt",
                           "--eval", "eval.pt", "--batch-size", "10", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["batch_shape"] == [[10, 16], [10, 16]] and doc["eval_batches"] == 2
    rows = {r["scheme"]: r for r in doc["rows"]}
    assert rows["QuantSim W8A8"]["sqnr_db"] > 10 and rows["int8 weight-only"]["sqnr_db"] > 10, rows
    code, out, err = _main(capsys, "bench", "enc.pt2", "--data", "dict.pt")
    assert code == 0, err
    assert "latency vs float32 on one batch of shapes (8, 16), (8, 16)" in out, out
    assert "QuantSim W8A8" in out


def test_measure_helpers_take_tuples():
    model = torch.nn.Bilinear(3, 4, 2)
    batch = (torch.randn(5, 3), torch.randn(5, 4))
    assert call_model(model, batch).shape == (5, 2)
    assert batch_shape(batch) == ((5, 3), (5, 4))
    assert format_batch_shape(batch_shape(batch)) == "shapes (5, 3), (5, 4)"
    assert format_batch_shape(batch_shape(batch[0])) == "shape (5, 3)"
    assert time_ratio(model, model, batch, rounds=1, reps=1) > 0


# ---------------------------------------------------------------------- errors
ERRORS = [
    (["quantize", "enc.pt", "--model-class", CLASS, "--calib", "sizes.pt", "--out", "never"],
     ["--calib", "same number of samples", "input 1 (attention_mask) has 30", "input 0 (input_ids) has 40"]),
    (["bench", "enc.pt", "--model-class", CLASS, "--data", "badkeys.pt"],
     ["--data", "input_ids, token_type_ids", "(input_ids, attention_mask)"]),
    (["quantize", "enc.pt2", "--calib", "badkeys.pt", "--out", "never"],
     ["--calib", "input_ids, token_type_ids", "(input_ids, attention_mask)"]),
    (["bench", "enc.pt", "--model-class", CLASS, "--data", "skips.pt"], ["--data", "but not input_ids"]),
    (["bench", "enc.pt", "--model-class", CLASS, "--data", "tuple.pt", "--eval", "ids_only.pt"],
     ["--eval", "holds 1 input(s) but --data holds 2"]),
    (["quantize", "enc.pt2", "--calib", "ids_only.pt", "--out", "never"],
     ["--calib", "holds 1 input(s) but the torch.export program takes 2"]),
]


@pytest.mark.parametrize("args, expected", ERRORS, ids=[f"{i}-{a[0]}" for i, (a, _) in enumerate(ERRORS)])
def test_input_errors_exit_2_with_one_line(here, capsys, args, expected):
    code, _, err = _main(capsys, *args)
    assert code == 2, err
    line = _error_line(err, args[0])
    for part in expected:
        assert part in line, line
    assert not (here["dir"] / "never").exists()
