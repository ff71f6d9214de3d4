"""``quanta quantize``: end to end in a subprocess on a tiny model; the files it writes are loaded back and compared
with an in-process QuantizationSimModel calibrated on the same batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from quanta.cli import main
from quanta.quantsim import QuantizationSimModel

MODULE = "quanta_test_tinynets"  # the model classes' module, importable from the fixture directory
SOURCE = '''
import torch
from torch import nn


class TinyNet(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


class Wider(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))


class NeedsArgs(nn.Module):
    def __init__(self, width):
        super().__init__()


class ExpNet(nn.Module):
    def forward(self, x):
        return torch.exp(x)


NOT_A_MODULE = 3
'''


def _sim(model: nn.Module, batches: list[torch.Tensor], **kwargs) -> QuantizationSimModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, batches[0], **kwargs)
    sim.compute_encodings(batches, progress=False)
    return sim


@pytest.fixture(scope="module")
def files(tmp_path_factory, write_module):
    d = tmp_path_factory.mktemp("quantize")
    mod = write_module(d, MODULE, SOURCE)  # importable: torch.save pickles a whole TinyNet (an error case)
    torch.manual_seed(0)
    model = mod.TinyNet().eval()
    x = torch.randn(80, 8)
    torch.save(model.state_dict(), d / "tiny.pt")
    torch.save(model, d / "whole.pt")
    torch.save(x, d / "calib.pt")
    torch.save({"x": x}, d / "calib_dict.pt")
    torch.save({"y": x}, d / "calib_nokey.pt")
    np.save(d / "calib.npy", x.numpy())
    np.save(d / "calib_object.npy", np.array([object()], dtype=object), allow_pickle=True)
    torch.save(torch.randn(80, 5), d / "calib_wrong.pt")
    torch.export.save(torch.export.export(model, (x[:16],)), d / "tiny.pt2")
    torch.export.save(torch.export.export(mod.ExpNet(), (x[:16],)), d / "exp.pt2")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated, TorchScript files are not gone
        torch.jit.save(torch.jit.script(model), d / "tiny_ts.pt")
    (d / "blk3.json").write_text(json.dumps({"params": {"weight": {"is_quantized": True, "block_size": 3}}}))
    (d / "blk4.json").write_text(json.dumps({"params": {"weight": {"is_quantized": True, "block_size": 4}}}))
    (d / "bad.json").write_text(json.dumps({"defaults": {"ops": {"is_output_quantized": "maybe"}}}))
    (d / "a_file").write_text("not a directory")
    return {"dir": d, "mod": mod, "model": model, "x": x}


def _run(*args: str, files) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(files["dir"]), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONWARNINGS="ignore", PYTHONPATH=path)
    return subprocess.run([sys.executable, "-m", "quanta.cli", *args], capture_output=True, text=True,
                          cwd=str(files["dir"]), env=env, timeout=300)


def _main(args: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(args)
    except SystemExit as e:  # argparse usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _one_line_error(err: str, command: str = "quantize") -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"quanta {command}: error: "), err
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------------- successful runs
@pytest.fixture(scope="module")
def state_dict_run(files):
    """A state dict + .npy calibration data, default options, batches of 20."""
    out = files["dir"] / "out_sd"
    r = _run("quantize", "tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib.npy", "--out", str(out),
             "--batch-size", "20", "--no-progress", "--threads", "1", files=files)
    assert r.returncode == 0, r.stderr
    return out, r


@pytest.fixture(scope="module")
def export_run(files):
    """A torch.export program (exported for batches of 16) + a .pt dict, encodings 2.0.0, no ONNX."""
    out = files["dir"] / "out_pt2"
    r = _run("quantize", "tiny.pt2", "--calib", "calib_dict.pt", "--out", str(out), "--encoding-version", "2.0.0",
             "--no-onnx", "--no-progress", "--threads", "1", files=files)
    assert r.returncode == 0, r.stderr
    return out, r


def _reference(files, batch: int) -> QuantizationSimModel:
    """The sim the CLI should have built: TinyNet with the same weights, calibrated on the same batches."""
    model = files["mod"].TinyNet()
    model.load_state_dict(files["model"].state_dict())
    return _sim(model.eval(), list(files["x"].split(batch)))


def test_state_dict_run_writes_every_file_and_a_summary(state_dict_run):
    out, r = state_dict_run
    for name in ("model.onnx", "model.encodings", "model_torch.encodings", "quantsim.encodings.json",
                 "model.safetensors"):
        assert (out / name).stat().st_size > 0, name
        assert f"  {name} " in r.stdout, f"{name} missing from the list of files written"
    assert "quantized 3 layers: 2 Linear, 1 ReLU" in r.stdout
    assert "calibrated on 4 batches of shape (20, 8)" in r.stdout
    sqnr = float(r.stdout.split("first batch): ")[1].split()[0])
    assert 25 < sqnr < 80
    assert "cast from float64" not in r.stderr  # np.save of a float32 tensor stays float32


def test_encodings_load_back_bit_identically(files, state_dict_run):
    out, _ = state_dict_run
    ref = _reference(files, 20)
    want = ref.get_encodings()
    assert sorted(want) == ["0.input_quantizers.0", "0.param_quantizers.weight", "1.output_quantizers.0",
                            "2.output_quantizers.0", "2.param_quantizers.weight"]  # the model input too, as AIMET
    for name in ("quantsim.encodings.json", "model.encodings"):  # quanta's format, AIMET 1.0.0
        fresh = QuantizationSimModel(files["model"], files["x"][:20])
        fresh.load_encodings(out / name)
        got = fresh.get_encodings()
        assert sorted(got) == sorted(want), name
        for k in want:
            assert got[k] == want[k], (name, k)  # scale, offset, grid and block size, exactly
        assert torch.equal(fresh.model(files["x"]), ref.model(files["x"]))


def test_onnx_runs_like_the_sim(files, state_dict_run):
    ort = pytest.importorskip("onnxruntime")
    out, _ = state_dict_run
    ref = _reference(files, 20)
    x = files["x"][:20]
    options = ort.SessionOptions()  # onnxruntime's QDQ fusions run integer kernels of their own (README)
    options.add_session_config_entry("session.disable_quant_qdq", "1")
    session = ort.InferenceSession(str(out / "model.onnx"), options, providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    want = ref.model(x).detach()
    scale = ref.model.get_submodule("2").output_quantizers[0].get_encodings().scale
    assert torch.allclose(torch.from_numpy(got), want, atol=float(scale) * 1.01, rtol=0)  # at most one step apart


def test_safetensors_holds_fake_quantized_weights_and_their_encodings(files, state_dict_run):
    st = pytest.importorskip("safetensors.torch")
    from safetensors import safe_open

    from quanta.encodings.affine import AffineEncoding

    out, _ = state_dict_run
    path = out / "model.safetensors"
    tensors = st.load_file(str(path))
    assert sorted(tensors) == sorted(files["model"].state_dict())  # the float model's keys, nothing else
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["quanta.encodings"])
    assert sorted(meta) == ["0.weight", "2.weight"]
    ref = _reference(files, 20)
    for name in meta:
        module = ref.model.get_submodule(name.split(".")[0])
        q = module.param_quantizers["weight"]
        assert torch.equal(tensors[name], q(module.weight).as_subclass(torch.Tensor).detach())
        enc = AffineEncoding.from_dict(meta[name])
        assert enc == q.get_encodings()
        assert meta[name]["granularity"] == "per_channel" and meta[name]["axis"] == 0
        assert meta[name]["bitwidth"] == 8 and meta[name]["symmetric"] is True
        codes = enc.quantize(tensors[name])  # on the grid: codes are integers that map back exactly
        assert torch.equal(codes, codes.round()) and torch.equal(enc.dequantize(codes), tensors[name])
        assert not torch.equal(tensors[name], files["model"].state_dict()[name])
    for name in ("0.bias", "2.bias"):  # not quantized: as in the float model
        assert torch.equal(tensors[name], files["model"].state_dict()[name])
    files["mod"].TinyNet().load_state_dict(tensors, strict=True)


def test_export_program_run_matches_the_state_dict_model(files, export_run):
    out, r = export_run
    assert not (out / "model.onnx").exists()
    assert "calibrated on 5 batches of shape (16, 8)" in r.stdout  # the program's static batch size
    assert "torch.export program: rebuilt 2 module calls" in r.stdout  # the Linears (ReLU: a functional op)
    doc = json.loads((out / "model.encodings").read_text())
    assert doc["version"] == "2.0.0"
    assert sorted(e["name"] for e in doc["encodings"]) == ["0.input.0", "0.weight", "1.output.0", "2.output.0",
                                                           "2.weight"]
    ref = _reference(files, 16)  # the same modules, names and encodings as from the Python class
    fresh = QuantizationSimModel(files["model"], files["x"][:16])
    fresh.load_encodings(out / "quantsim.encodings.json")
    want, got = ref.get_encodings(), fresh.get_encodings()
    assert sorted(got) == sorted(want) and all(got[k] == want[k] for k in want)
    fresh2 = QuantizationSimModel(files["model"], files["x"][:16])
    fresh2.load_encodings(out / "model.encodings")
    assert all(fresh2.get_encodings()[k] == want[k] for k in want)


def test_inspect_reads_every_output(files, state_dict_run, capsys):
    out, _ = state_dict_run
    code, text, _ = _main(["inspect", str(out / "model.encodings")], capsys)
    assert code == 0 and "AIMET encodings file, version 1.0.0: 5 tensors (3 activations, 2 params)" in text
    # the export's file: keyed by the ONNX graph's tensor names (the graph input, torch.onnx's op outputs)
    assert all(n in text for n in ("0.weight", "2.weight", "/1/Relu_output_0", "/2/Gemm_output_0"))
    code, text, _ = _main(["inspect", str(out / "quantsim.encodings.json")], capsys)
    assert code == 0 and "quanta encodings file" in text and "0.param_quantizers.weight" in text
    code, text, _ = _main(["inspect", str(out / "model.safetensors"), "--json"], capsys)
    report = json.loads(text)
    assert code == 0 and report["type"] == "safetensors"
    assert [t["name"] for t in report["tensors"]] == ["0.bias", "0.weight", "2.bias", "2.weight"]
    assert [(w["name"], w["granularity"], w["num_scales"]) for w in report["weight_encodings"]] == [
        ("0.weight", "per-channel", 16), ("2.weight", "per-channel", 4)]
    r = _run("inspect", str(out / "model.onnx"), files=files)  # one real process
    assert r.returncode == 0, r.stderr
    assert "QuantizeLinear: 5, DequantizeLinear: 5" in r.stdout and "quantized tensors: 5" in r.stdout
    assert "0.weight" in r.stdout and "per-channel(axis=0)" in r.stdout


# ---------------------------------------------------------------------- errors
def test_errors_in_a_subprocess_are_one_line(files):
    cases = [
        (("tiny_ts.pt", "--calib", "calib.pt"), "TorchScript modules cannot be re-quantized"),
        (("tiny.pt", "--model-class", "no_such_module_xyz:Net", "--calib", "calib.pt"), "cannot import"),
        (("tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib_wrong.pt"), "rejects calibration"),
    ]
    for args, expected in cases:
        r = _run("quantize", *args, "--out", "never", "--no-progress", files=files)
        assert r.returncode == 2, (args, r.stderr)
        assert expected in _one_line_error(r.stderr), r.stderr
        assert r.stdout == ""
    assert not (files["dir"] / "never").exists()


ERRORS = [
    (["missing.pt", "--calib", "calib.pt"], "MODEL not found"),
    (["calib.npy", "--calib", "calib.pt"], "not a torch.export program (.pt2) nor a state dict"),
    (["whole.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib.pt"], "holds pickled Python objects"),
    (["tiny.pt", "--calib", "calib.pt"], "is a state dict: pass --model-class"),
    (["tiny.pt", "--model-class", f"{MODULE}:Nope", "--calib", "calib.pt"], "has no attribute 'Nope'"),
    (["tiny.pt", "--model-class", f"{MODULE}:NOT_A_MODULE", "--calib", "calib.pt"], "not an nn.Module subclass"),
    (["tiny.pt", "--model-class", f"{MODULE}:NeedsArgs", "--calib", "calib.pt"], "cannot be built without arguments"),
    (["tiny.pt", "--model-class", f"{MODULE}:Wider", "--calib", "calib.pt"], "does not fit --model-class"),
    (["tiny.pt", "--model-class", "nocolon", "--calib", "calib.pt"], "must look like pkg.module:ClassName"),
    (["tiny_ts.pt", "--calib", "calib.pt"], "TorchScript"),
    (["tiny.pt2", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib.pt"], "drop --model-class"),
    (["tiny.pt2", "--calib", "calib.pt", "--batch-size", "10"], "pass --batch-size 16"),
    (["tiny.pt2", "--calib", "calib_wrong.pt"], "the data does not fit the model"),
    (["exp.pt2", "--calib", "calib.pt"], "found nothing to quantize"),
    (["tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "missing.npy"], "--calib file not found"),
    (["tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "whole.pt"], "holds pickled Python objects"),
    (["tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib_nokey.pt"], "without an 'x' or 'inputs'"),
    (["tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib_object.npy"], "allow_pickle=False"),
    (["tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "tiny_ts.pt"], "not a torch.save file of a tensor"),
    (["tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib_wrong.pt"], "shape (32, 5)"),
    (["tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib.pt", "--config", "nope.json"],
     "--config file not found"),
    (["tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib.pt", "--config", "bad.json"],
     "is_output_quantized"),
    (["tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib.pt", "--config", "blk3.json"],
     "does not fit the model: 0.weight: block_size 3"),
    (["tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib.pt", "--config", "blk4.json",
      "--encoding-version", "0.6.1"], "--encoding-version 0.6.1 cannot hold"),
    (["tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib.pt", "--scheme", "bogus"], "--scheme"),
    (["tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib.pt", "--param-bw", "0"], "bitwidth"),
    (["tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib.pt", "--encoding-version", "3"],
     "--encoding-version must be one of"),
    (["tiny.pt", "--model-class", f"{MODULE}:TinyNet"], "required: --calib"),
]


@pytest.mark.parametrize("args, expected", ERRORS, ids=[f"{i}-{e[:24]}" for i, (_, e) in enumerate(ERRORS)])
def test_every_error_exits_2_with_one_line(files, monkeypatch, capsys, args, expected):
    monkeypatch.chdir(files["dir"])
    monkeypatch.syspath_prepend(str(files["dir"]))
    out_args = [] if "required" in expected else ["--out", "out_err"]
    code, out, err = _main(["quantize", *args, *out_args, "--no-progress"], capsys)
    assert code == 2, err
    assert expected in _one_line_error(err), err
    assert out == ""
    assert not (files["dir"] / "out_err").exists()  # nothing is written before the inputs are known good


def test_out_must_be_a_directory(files, monkeypatch, capsys):
    monkeypatch.chdir(files["dir"])
    monkeypatch.syspath_prepend(str(files["dir"]))
    code, _, err = _main(["quantize", "tiny.pt", "--model-class", f"{MODULE}:TinyNet", "--calib", "calib.pt",
                          "--out", "a_file", "--no-progress"], capsys)
    assert code == 2 and "exists and is not a directory" in _one_line_error(err)


class _Boom:
    """Unpickling this creates a file: the proof that a payload was (not) unpickled."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_program_with_unsafe_pickles_is_refused_unopened(files, monkeypatch, capsys, tmp_path):
    """torch.export.load would unpickle the sample inputs with weights_only=False after a failed weights-only try."""
    import io
    import zipfile

    marker = tmp_path / "unpickled"
    evil = tmp_path / "evil.pt2"
    with zipfile.ZipFile(files["dir"] / "tiny.pt2") as src, zipfile.ZipFile(evil, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data/sample_inputs/model.pt"):
                buffer = io.BytesIO()
                torch.save(((_Boom(str(marker)),), {}), buffer)
                data = buffer.getvalue()
            dst.writestr(info, data)
    code, _, err = _main(["quantize", str(evil), "--calib", str(files["dir"] / "calib.pt"), "--out",
                          str(tmp_path / "out"), "--no-progress"], capsys)
    assert code == 2 and "holds pickled Python objects (data/sample_inputs/model.pt)" in _one_line_error(err)
    assert not marker.exists()


def test_legacy_torch_save_state_dict(files, monkeypatch, capsys, tmp_path):
    monkeypatch.syspath_prepend(str(files["dir"]))
    legacy = tmp_path / "legacy.pth"
    torch.save(files["model"].state_dict(), legacy, _use_new_zipfile_serialization=False)
    code, out, err = _main(["quantize", str(legacy), "--model-class", f"{MODULE}:TinyNet", "--calib",
                            str(files["dir"] / "calib.pt"), "--out", str(tmp_path / "out"), "--no-onnx",
                            "--no-progress"], capsys)
    assert code == 0, err
    assert "quantized 3 layers" in out and (tmp_path / "out" / "model.safetensors").exists()


def test_debug_shows_the_traceback(files, monkeypatch):
    monkeypatch.chdir(files["dir"])
    with pytest.raises(ValueError, match="TorchScript"):
        main(["--debug", "quantize", "tiny_ts.pt", "--calib", "calib.pt", "--out", "x", "--no-progress"])


# ---------------------------------------------------------------------- torch.export: modules rebuilt faithfully
class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.act = nn.GELU()

    def forward(self, x):
        return self.act(self.seq(x)) + torch.relu(x.mean(1, keepdim=True))


def test_lifted_program_quantizes_like_the_python_model(tmp_path):
    from quanta.tools.model_files import lift_program, load_model

    torch.manual_seed(0)
    model = nn.Sequential(_Block(), nn.Flatten(), nn.Linear(8 * 16, 4), nn.Softmax(-1)).eval()
    with torch.no_grad():
        model[0].seq[1].running_mean.normal_()
        model[0].seq[1].running_var.uniform_(0.5, 2.0)
    x = torch.randn(6, 3, 4, 4)
    torch.export.save(torch.export.export(model, (x,)), tmp_path / "m.pt2")
    loaded = load_model(tmp_path / "m.pt2")
    gm = lift_program(loaded.model, x)
    assert sorted(gm.state_dict()) == sorted(model.state_dict())  # parameters keep their names
    kinds = {name: type(m).__name__ for name, m in gm.named_modules()}
    assert [kinds[n] for n in ("0.seq.0", "0.seq.1", "2")] == ["Conv2d", "BatchNorm2d", "Linear"]
    a, b = _sim(gm, [x]), _sim(model, [x])
    assert a.capture_method == b.capture_method == "export"
    qkinds = {name: type(m).__name__ for name, m in a.model.named_modules()}
    assert [qkinds[n] for n in ("0.seq.0", "0.seq.1", "0.seq.2", "0.act", "0.mean", "2", "3")] == [
        "QuantizedConv2d", "QuantizedBatchNorm2d", "QuantizedReLU", "QuantizedGELU", "QuantizedMean",
        "QuantizedLinear", "QuantizedSoftmax"]
    assert torch.equal(a.model(x), b.model(x))  # same quantizers in the same places, same encodings
    assert [n for n, _ in a.named_quantizers()] == [n for n, _ in b.named_quantizers()]


def test_fold_bn_writes_the_folded_model(tmp_path, monkeypatch, capsys):
    onnx = pytest.importorskip("onnx")
    torch.manual_seed(0)
    model = nn.Sequential(_Block(), nn.Flatten(), nn.Linear(8 * 16, 4)).eval()
    with torch.no_grad():
        model[0].seq[1].running_mean.normal_()
        model[0].seq[1].running_var.uniform_(0.5, 2.0)
    x = torch.randn(32, 3, 4, 4)
    torch.export.save(torch.export.export(model, (x[:8],)), tmp_path / "m.pt2")
    torch.save(x, tmp_path / "calib.pt")
    monkeypatch.chdir(tmp_path)
    ops = {}
    for flag in ([], ["--fold-bn"]):
        out = f"out{len(flag)}"
        assert main(["quantize", "m.pt2", "--calib", "calib.pt", "--out", out, "--no-progress", *flag]) == 0
        captured = capsys.readouterr()
        ops[bool(flag)] = {n.op_type for n in onnx.load(tmp_path / out / "model.onnx").graph.node}
        if flag:
            assert "folded 1 BatchNorm layer(s)" in captured.err
    assert "BatchNormalization" in ops[False] and "BatchNormalization" not in ops[True]
    assert "Conv" in ops[True]
