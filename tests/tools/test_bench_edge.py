"""``quanta bench`` on the inputs a user actually has: tuple/dict outputs, integer inputs, tiny data, bad files,
NaN/inf data, dropout, parameter-free models; the ``--json`` output must be strict JSON (no NaN/Infinity)."""

from __future__ import annotations

import json

import pytest
import torch

from quanta.cli import main
from quanta.tools import bench_model as bm

MODULE = "quanta_test_bench_edge_nets"
SOURCE = '''
import torch
from torch import nn


class MLP(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))


class TupleOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 32)
        self.b = nn.Linear(32, 16)

    def forward(self, x):
        h = self.a(x)
        return h, self.b(h)


class DictOut(TupleOut):
    def forward(self, x):
        h = self.a(x)
        return {"h": h, "y": self.b(h), "count": torch.ones(1, dtype=torch.long)}


class Emb(nn.Module):
    def __init__(self):
        super().__init__()
        self.e = nn.Embedding(50, 32)
        self.fc = nn.Linear(32, 16)

    def forward(self, idx):
        return self.fc(self.e(idx)).mean(1)


class Drop(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.d = nn.Dropout(0.5)
        self.b = nn.Linear(64, 16)

    def forward(self, x):
        return self.b(self.d(self.a(x)))


class NoParams(nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2
'''


def _strict(constant):
    raise ValueError(f"non-standard JSON constant {constant}")


@pytest.fixture(scope="module")
def d(tmp_path_factory, write_module):
    import sys

    root = tmp_path_factory.mktemp("bench_edge")
    mod = write_module(root, MODULE, SOURCE)
    torch.manual_seed(0)
    for name in ("MLP", "TupleOut", "DictOut", "Emb", "Drop"):
        torch.save(getattr(mod, name)().state_dict(), root / f"{name}.pt")
    torch.save({}, root / "NoParams.pt")
    x = torch.randn(40, 32)
    torch.save(x, root / "x.pt")
    torch.save(x[:1].clone(), root / "one.pt")
    torch.save(torch.randn(12, 7), root / "wrong.pt")
    torch.save(torch.randint(0, 50, (20, 6)), root / "idx.pt")
    nan = x.clone()
    nan[3, 5] = float("nan")
    torch.save(nan, root / "nan.pt")
    torch.save(torch.full((16, 32), float("inf")), root / "inf.pt")
    torch.save(torch.zeros(16, 32), root / "zeros.pt")
    (root / "empty.pt").write_bytes(b"")
    (root / "adir").mkdir()
    torch.export.save(torch.export.export(mod.NoParams(), (x[:8],)), root / "noparams.pt2")
    torch.export.save(torch.export.export(mod.Drop().train(), (x[:8],)), root / "drop_train.pt2")
    yield root
    sys.modules.pop(MODULE, None)


@pytest.fixture
def here(d, monkeypatch):
    monkeypatch.chdir(d)
    monkeypatch.syspath_prepend(str(d))
    # fewer timing repetitions: these tests are about edge cases, not latency
    real = bm.time_ratio
    monkeypatch.setattr(bm, "time_ratio", lambda m, b, x: real(m, b, x, rounds=1, reps=1))
    return d


def _bench(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(["bench", *args, "--no-progress"])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys, *args: str) -> dict:
    code, out, err = _bench(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out, parse_constant=_strict)


def _one_line_error(code: int, out: str, err: str, *needles: str) -> None:
    assert code == 2, (code, err)
    assert "Traceback" not in err and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], lines[0]


def _by_scheme(doc: dict) -> dict:
    return {r["scheme"]: r for r in doc["rows"]}


# ------------------------------------------------------------------ model and data shapes
@pytest.mark.parametrize("cls", ["TupleOut", "DictOut"])
def test_tuple_and_dict_outputs(here, capsys, cls):
    doc = _json(capsys, f"{cls}.pt", "--model-class", f"{MODULE}:{cls}", "--data", "x.pt", "--batch-size", "20")
    rows = _by_scheme(doc)
    assert rows["float32"]["weight_bytes"] == 4 * (32 * 32 + 32 + 32 * 16 + 16)
    assert 25 < rows["QuantSim W8A8"]["sqnr_db"] < 80
    assert 25 < rows["int8 weight-only"]["sqnr_db"] < 80


def test_integer_inputs_embedding(here, capsys):
    doc = _json(capsys, "Emb.pt", "--model-class", f"{MODULE}:Emb", "--data", "idx.pt", "--batch-size", "5")
    rows = _by_scheme(doc)
    assert doc["batch_shape"] == [5, 6] and doc["calibration_batches"] == 4
    assert 25 < rows["QuantSim W8A8"]["sqnr_db"] < 80
    assert rows["QuantSim W8A8"]["bytes_ratio"] < 0.5  # the embedding table counted at 8 bits


def test_single_sample(here, capsys):
    doc = _json(capsys, "MLP.pt", "--model-class", f"{MODULE}:MLP", "--data", "one.pt")
    assert doc["calibration_batches"] == 1 and doc["eval_batches"] == 1 and doc["batch_shape"] == [1, 32]
    assert _by_scheme(doc)["QuantSim W8A8"]["sqnr_db"] > 20


def test_num_batches_larger_than_available_and_batch_size_one(here, capsys):
    doc = _json(capsys, "MLP.pt", "--model-class", f"{MODULE}:MLP", "--data", "x.pt", "--batch-size", "1",
                "--num-batches", "1000")
    assert doc["calibration_batches"] == 40 and doc["eval_batches"] == 40 and doc["batch_shape"] == [1, 32]
    doc = _json(capsys, "MLP.pt", "--model-class", f"{MODULE}:MLP", "--data", "x.pt", "--batch-size", "16",
                "--num-batches", "2")
    assert doc["calibration_batches"] == 2 and doc["eval_batches"] == 3  # SQNR still over all of --data


def test_dropout_model_is_evaluated_in_eval_mode(here, capsys):
    args = ("Drop.pt", "--model-class", f"{MODULE}:Drop", "--data", "x.pt")
    a, b = _json(capsys, *args), _json(capsys, *args)
    for scheme in ("QuantSim W8A8", "int8 weight-only", "int8 dyn-act + int8 weight"):
        assert _by_scheme(a)[scheme]["sqnr_db"] == _by_scheme(b)[scheme]["sqnr_db"], scheme
        assert _by_scheme(a)[scheme]["sqnr_db"] > 25, scheme  # dropout active would give ~0 dB


# ------------------------------------------------------------------ input errors: one line, exit 2
def test_eval_with_other_feature_count(here, capsys):
    code, out, err = _bench(capsys, "MLP.pt", "--model-class", f"{MODULE}:MLP", "--data", "x.pt", "--eval", "wrong.pt")
    _one_line_error(code, out, err, "--eval", "(12, 7)")


@pytest.mark.parametrize("args,needle", [
    (("empty.pt", "--model-class", f"{MODULE}:MLP", "--data", "x.pt"), "MODEL"),
    (("adir", "--data", "x.pt"), "directory"),
    (("MLP.pt", "--model-class", f"{MODULE}:MLP", "--data", "empty.pt"), "--data"),
    (("MLP.pt", "--model-class", f"{MODULE}:MLP", "--data", "x.pt", "--eval", "empty.pt"), "--eval"),
    (("MLP.pt", "--model-class", f"{MODULE}:MLP", "--data", "adir"), "--data"),
    (("MLP.pt", "--model-class", f"{MODULE}:MLP", "--data", "missing.pt"), "--data"),
    (("Emb.pt", "--model-class", f"{MODULE}:Emb", "--data", "x.pt"), "--data"),
])
def test_bad_inputs_are_one_line_errors(here, capsys, args, needle):
    _one_line_error(*_bench(capsys, *args), needle)


# ------------------------------------------------------------------ non-finite data and strict JSON
@pytest.mark.parametrize("data", ["nan.pt", "inf.pt", "zeros.pt"])
def test_non_finite_or_degenerate_data_gives_strict_json(here, capsys, data):
    code, out, err = _bench(capsys, "MLP.pt", "--model-class", f"{MODULE}:MLP", "--data", data, "--json")
    assert "Traceback" not in err
    assert code in (0, 2), err
    if code == 0:
        doc = json.loads(out, parse_constant=_strict)
        for r in doc["rows"]:
            for k in ("sqnr_db", "bytes_ratio", "time_ratio"):
                assert r[k] is None or isinstance(r[k], (int, float)) or (k == "sqnr_db" and r[k] in NON_FINITE), \
                    (k, r)
        if data == "nan.pt":
            assert [r["sqnr_db"] for r in doc["rows"][1:]] == ["nan"] * (len(doc["rows"]) - 1)
            assert any("not all finite" in n for n in doc["notes"])
    code, out, err = _bench(capsys, "MLP.pt", "--model-class", f"{MODULE}:MLP", "--data", data)
    assert "Traceback" not in err and code in (0, 2)


NON_FINITE = ("inf", "-inf", "nan")


def test_to_dict_never_emits_non_finite_numbers():
    rows = [bm.BenchRow("float32", "float", None, 10, 1.0, 1.0),
            bm.BenchRow("a", "simulated", float("nan"), 5, 0.5, 2.0),
            bm.BenchRow("b", "simulated", float("inf"), 5, 0.5, 2.0),
            bm.BenchRow("c", "simulated", float("-inf"), 5, 0.5, 2.0)]
    text = json.dumps(bm.BenchResult(rows).to_dict())
    doc = json.loads(text, parse_constant=_strict)
    assert [r["sqnr_db"] for r in doc["rows"]] == [None, "nan", "inf", "-inf"]  # each case told apart
    text = bm.format_bench(bm.BenchResult(rows))
    assert "inf" in text and "nan" in text


# ------------------------------------------------------------------ bugs found
def test_parameter_free_model(here, capsys):
    code, out, err = _bench(capsys, "noparams.pt2", "--data", "x.pt", "--batch-size", "8")
    assert code == 0, err
    float_row = next(line for line in out.splitlines() if line.startswith("float32"))
    assert float_row.split()[3:5] == ["0", "-"]  # no bytes to compare with


def test_empty_state_dict_is_a_state_dict(here, capsys):
    code, out, err = _bench(capsys, "NoParams.pt", "--model-class", f"{MODULE}:NoParams", "--data", "x.pt")
    assert code == 0, err
    assert out.startswith("scheme")


def test_nondeterministic_export_program(here, capsys):
    code, out, err = _bench(capsys, "drop_train.pt2", "--data", "x.pt", "--batch-size", "8")
    _one_line_error(code, out, err, "model.eval()")
