"""``quanta inspect``: encodings (AIMET 0.6.1 / 1.0.0 / 2.0.0 and quanta's), ONNX and safetensors files, told apart
by content; anything else is one error line and exit status 2, and nothing in a file is ever executed."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

from quanta.cli import main
from quanta.quantsim import QuantizationSimModel, QuantSimConfig
from quanta.tools.inspect_file import NOT_RECOGNISED, inspect_file

WEIGHTS = ["0.weight", "2.weight"]
ACTIVATIONS = ["0.input.0", "1.output.0", "2.output.0"]  # the model input too (AIMET's default)
#: the same activations as torch.onnx names them in an exported graph: the graph input, then op outputs
ONNX_ACTIVATIONS = ["input", "/1/Relu_output_0", "/2/Gemm_output_0"]


def _sim(config=None, **kwargs) -> tuple[QuantizationSimModel, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4)).eval()
    x = torch.randn(8, 32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, x, config_file=config, **kwargs)
    sim.compute_encodings([x], progress=False)
    return sim, x


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("inspect")
    sim, x = _sim()  # W8A8, weights per channel
    for v in ("0.6.1", "1.0.0", "2.0.0"):
        sim.save_encodings(d / f"v{v}.encodings", version=v)
    sim.save_encodings(d / "quanta.json")
    blocks = QuantSimConfig.load().to_dict()  # int4 weights in blocks of 16 input channels
    blocks.setdefault("op_type", {}).setdefault("Gemm", {}).setdefault("params", {})["weight"] = {"block_size": 16}
    bsim, _ = _sim(blocks, default_param_bw=4)
    bsim.save_encodings(d / "blocks.json")
    bsim.save_encodings(d / "blocks_v2.encodings", version="2.0.0")
    out = {"dir": d}
    if _has("onnx"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            (d / "qdq").mkdir()
            sim.export(d / "qdq", "model", x)
            (d / "pre").mkdir()
            bsim.export(d / "pre", "model", x, encoding_version="2.0.0", prequantize_weights=True)
    if _has("safetensors"):
        from safetensors.torch import save_file

        from quanta.dtypes.serialization import save_quantized
        from quanta.quantization import Int8WeightOnlyConfig, quantize_

        lin = nn.Linear(64, 32)
        quantize_(lin, Int8WeightOnlyConfig())
        save_quantized(lin.state_dict(), d / "int8.safetensors")
        save_file({"a": torch.zeros(3, 4), "b": torch.ones(5, dtype=torch.int8)}, str(d / "plain.safetensors"))
    return out


def _has(name: str) -> bool:
    try:
        __import__(name)
        return True
    except ImportError:
        return False


def _inspect(capsys, *args: str) -> tuple[int, str, str]:
    try:
        code = main(["inspect", *args])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _json(capsys, path) -> dict:
    code, out, err = _inspect(capsys, str(path), "--json")
    assert code == 0, err
    return json.loads(out)


# ---------------------------------------------------------------------- encodings
@pytest.mark.parametrize("version", ["0.6.1", "1.0.0", "2.0.0"])
def test_aimet_encodings_every_version(files, capsys, version):
    code, text, _ = _inspect(capsys, str(files["dir"] / f"v{version}.encodings"))
    assert code == 0
    lines = text.splitlines()
    if version == "2.0.0":
        assert lines[0] == ("AIMET encodings file, version 2.0.0: 5 tensors (version 2.0.0 does not tell "
                            "activations from params)")
    else:
        assert lines[0] == f"AIMET encodings file, version {version}: 5 tensors (3 activations, 2 params)"
    rows = {line.split()[0]: line.split() for line in lines[2:-1]}
    assert sorted(rows) == sorted(WEIGHTS + ACTIVATIONS)
    assert rows["0.weight"][3:] == ["8", "yes", "per-channel(axis=0)" if version == "2.0.0" else "per-channel", "16"]
    assert rows["2.weight"][-1] == "4" and rows["1.output.0"][-2:] == ["per-tensor", "1"]
    assert lines[-1].startswith("summary: ") and "23 scales" in lines[-1]
    report = _json(capsys, files["dir"] / f"v{version}.encodings")
    assert report["type"] == "encodings" and report["format"] == "aimet" and report["version"] == version
    w = {t["name"]: t for t in report["tensors"]}["0.weight"]
    assert (w["bitwidth"], w["symmetric"], w["granularity"], w["num_scales"]) == (8, True, "per-channel", 16)
    assert report["summary"]["tensors"] == 5 and report["summary"]["granularity"] == {"per-tensor": 3,
                                                                                      "per-channel": 2}


def test_quanta_encodings(files, capsys):
    report = _json(capsys, files["dir"] / "quanta.json")
    assert report["format"] == "quanta"
    by_name = {t["name"]: t for t in report["tensors"]}
    assert sorted(by_name) == ["0.input_quantizers.0", "0.param_quantizers.weight", "1.output_quantizers.0",
                               "2.output_quantizers.0", "2.param_quantizers.weight"]
    w = by_name["0.param_quantizers.weight"]
    assert (w["kind"], w["dtype"], w["bitwidth"], w["symmetric"], w["granularity"], w["axis"], w["num_scales"]) == (
        "param", "int", 8, True, "per-channel", 0, 16)
    a = by_name["1.output_quantizers.0"]
    assert (a["kind"], a["dtype"], a["symmetric"], a["granularity"], a["num_scales"]) == (
        "activation", "uint", False, "per-tensor", 1)
    assert report["summary"]["activations"] == 3 and report["summary"]["params"] == 2


def test_per_block_encodings(files, capsys):
    report = _json(capsys, files["dir"] / "blocks.json")
    w = {t["name"]: t for t in report["tensors"]}["0.param_quantizers.weight"]
    assert (w["bitwidth"], w["granularity"], w["block_size"], w["axis"], w["num_scales"]) == (4, "per-block", 16, 1,
                                                                                              32)
    code, text, _ = _inspect(capsys, str(files["dir"] / "blocks_v2.encodings"))
    assert code == 0 and "per-block(16, axis=1)" in text
    w = {t["name"]: t for t in _json(capsys, files["dir"] / "blocks_v2.encodings")["tensors"]}["0.weight"]
    assert (w["bitwidth"], w["granularity"], w["block_size"], w["num_scales"]) == (4, "per-block", 16, 32)


def test_type_is_told_by_content_not_by_name(files, capsys):
    odd = files["dir"] / "looks_like.onnx"
    shutil.copy(files["dir"] / "v1.0.0.encodings", odd)
    assert inspect_file(odd)["type"] == "encodings"
    if _has("safetensors"):
        odd = files["dir"] / "weights.json"
        shutil.copy(files["dir"] / "plain.safetensors", odd)
        assert inspect_file(odd)["type"] == "safetensors"
    if _has("onnx"):
        odd = files["dir"] / "graph.bin"
        shutil.copy(files["dir"] / "qdq" / "model.onnx", odd)
        assert inspect_file(odd)["type"] == "onnx"


# ---------------------------------------------------------------------- ONNX
def test_onnx_qdq_graph(files, capsys):
    pytest.importorskip("onnx")
    report = _json(capsys, files["dir"] / "qdq" / "model.onnx")
    assert report["type"] == "onnx" and report["opset"] == 20  # torch.onnx's default, as AIMET exports
    assert report["inputs"] == [{"name": "input", "dtype": "float32", "shape": [8, 32]}]
    assert report["outputs"] == [{"name": "output", "dtype": "float32", "shape": [8, 4]}]
    assert (report["quantize_linear"], report["dequantize_linear"]) == (5, 5)
    q = {t["name"]: t for t in report["quantized_tensors"]}
    assert sorted(q) == sorted(WEIGHTS + ONNX_ACTIVATIONS)
    assert (q["0.weight"]["zero_point_dtype"], q["0.weight"]["granularity"], q["0.weight"]["axis"],
            q["0.weight"]["num_scales"]) == ("int8", "per-channel", 0, 16)
    relu = q["/1/Relu_output_0"]
    assert (relu["zero_point_dtype"], relu["granularity"]) == ("uint8", "per-tensor")
    floats = (32 * 16 + 16 + 16 * 4 + 4) * 4 + (16 + 4 + 3) * 4  # weights, biases, scales
    assert report["initializer_bytes_by_dtype"] == {"float32": floats, "int8": 20, "uint8": 3}
    assert report["file_bytes"] == os.path.getsize(files["dir"] / "qdq" / "model.onnx") == report["total_bytes"]
    code, text, _ = _inspect(capsys, str(files["dir"] / "qdq" / "model.onnx"))
    assert code == 0 and "ONNX model: opset 20" in text and "QuantizeLinear: 5, DequantizeLinear: 5" in text
    assert "inputs: input float32 [8, 32]" in text


def test_onnx_prequantized_int4_blocks(files, capsys):
    pytest.importorskip("onnx")
    report = _json(capsys, files["dir"] / "pre" / "model.onnx")
    assert report["opset"] == 21 and (report["quantize_linear"], report["dequantize_linear"]) == (3, 5)
    q = {t["name"]: t for t in report["quantized_tensors"]}
    w = q["0.weight"]
    assert (w["zero_point_dtype"], w["granularity"], w["axis"], w["block_size"], w["num_scales"],
            w["prequantized"]) == ("int4", "per-block", 1, 16, 32, True)
    assert report["initializer_bytes_by_dtype"]["int4"] == (16 * 32 + 4 * 16) // 2 + (32 + 4) // 2
    assert q["/1/Relu_output_0"]["prequantized"] is False
    code, text, _ = _inspect(capsys, str(files["dir"] / "pre" / "model.onnx"))
    assert "per-block(16, axis=1)" in text


def test_onnx_defaults_constants_and_external_data(tmp_path, capsys):
    """QuantizeLinear without a zero point (uint8) or axis (1), a scale from a Constant node, external weights
    (counted, never opened)."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    scale = helper.make_tensor("s", TensorProto.FLOAT, [3], [0.1, 0.2, 0.3])
    external = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[10, 10],
                           data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "does_not_exist.bin"), ("offset", "0"), ("length", "400")):
        entry = external.external_data.add()
        entry.key, entry.value = key, value
    nodes = [helper.make_node("Constant", [], ["s2"], value=helper.make_tensor("v", TensorProto.FLOAT, [], [0.5])),
             helper.make_node("QuantizeLinear", ["x", "s"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s"], ["d"]),
             helper.make_node("QuantizeLinear", ["d", "s2"], ["q2"]),
             helper.make_node("DequantizeLinear", ["q2", "s2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
                              [scale, external])
    path = tmp_path / "hand.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    report = _json(capsys, path)
    q = {t["name"]: t for t in report["quantized_tensors"]}
    assert (q["x"]["zero_point_dtype"], q["x"]["granularity"], q["x"]["axis"], q["x"]["num_scales"]) == (
        "uint8", "per-channel", 1, 3)
    assert (q["d"]["granularity"], q["d"]["num_scales"]) == ("per-tensor", 1)
    assert report["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", 3]}]
    assert report["external_data_bytes"] == 400 and report["initializer_bytes_by_dtype"] == {"float32": 412}
    assert report["total_bytes"] == report["file_bytes"] + 400


# ---------------------------------------------------------------------- safetensors
def test_safetensors_with_quanta_metadata(files, capsys):
    pytest.importorskip("safetensors")
    report = _json(capsys, files["dir"] / "int8.safetensors")
    assert {t["name"]: (t["dtype"], t["shape"], t["bytes"]) for t in report["tensors"]} == {
        "bias": ("float32", [32], 128),
        "weight::int_data": ("int8", [32, 64], 2048),
        "weight::scale": ("float32", [32, 1], 128),
        "weight::zero_point": ("int64", [32, 1], 256),
    }
    (entry,) = report["quantized"]
    assert (entry["name"], entry["layout"], entry["bits"], entry["block_size"], entry["granularity"]) == (
        "weight", "PlainLayout", 8, [1, 64], "per-channel")
    code, text, _ = _inspect(capsys, str(files["dir"] / "int8.safetensors"))
    assert code == 0 and "quanta quantized entries: 1" in text and "PlainLayout" in text


def test_plain_safetensors(files, capsys):
    pytest.importorskip("safetensors")
    report = _json(capsys, files["dir"] / "plain.safetensors")
    assert [(t["name"], t["dtype"], t["shape"], t["bytes"]) for t in report["tensors"]] == [
        ("a", "float32", [3, 4], 48), ("b", "int8", [5], 5)]
    assert "quantized" not in report and report["summary"]["bytes"] == 53


# ---------------------------------------------------------------------- errors
def _error_line(code: int, out: str, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and out == "" and len(lines) == 1 and "Traceback" not in err, (code, out, err)
    assert lines[0].startswith("quanta inspect: error: ")
    return lines[0]


class _Boom:
    """Unpickling this would create a file: the proof that inspect never unpickles."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("name, content", [
    ("garbage.onnx", b"this is not a model at all \x00\x01\x02" * 10),
    ("empty.encodings", b""),
    ("other.json", b'{"hello": "world"}'),
    ("list.json", b"[1, 2, 3]"),
    ("truncated.safetensors", b"\x40\x00\x00\x00\x00\x00\x00\x00{\"a\": {\"dtype\""),
    ("archive.pt", None),  # a torch.save zip archive
    ("pickle.onnx", "pickle"),
])
def test_unknown_files_are_refused_in_one_line(tmp_path, capsys, name, content):
    path = tmp_path / name
    marker = tmp_path / "unpickled"
    if content is None:
        torch.save({"w": torch.ones(2)}, path)
    elif content == "pickle":
        path.write_bytes(pickle.dumps(_Boom(str(marker))))
    else:
        path.write_bytes(content)
    line = _error_line(*_inspect(capsys, str(path)))
    assert NOT_RECOGNISED in line or "truncated safetensors" in line
    assert not marker.exists()


def test_corrupt_aimet_encodings_name_the_entry(tmp_path, capsys):
    doc = {"version": "1.0.0", "activation_encodings": [], "param_encodings": [
        {"name": "fc.weight", "dtype": "INT", "enc_type": "PER_TENSOR", "bw": 8, "is_sym": True, "scale": [-1.0],
         "offset": [-128]}]}
    path = tmp_path / "bad.encodings"
    path.write_text(json.dumps(doc))
    line = _error_line(*_inspect(capsys, str(path)))
    assert "corrupt AIMET encodings" in line and "fc.weight" in line and "positive" in line


def test_missing_file_and_directory(tmp_path, capsys):
    assert "file not found" in _error_line(*_inspect(capsys, str(tmp_path / "nope.onnx")))
    assert NOT_RECOGNISED in _error_line(*_inspect(capsys, str(tmp_path)))


def test_in_a_subprocess(files):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    path = files["dir"] / "v1.0.0.encodings"
    r = subprocess.run([sys.executable, "-m", "quanta.cli", "inspect", str(path), "--json"], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert sorted(t["name"] for t in json.loads(r.stdout)["tensors"]) == sorted(WEIGHTS + ACTIVATIONS)
    garbage = files["dir"] / "garbage.bin"
    garbage.write_bytes(b"\x08\x96\x01" * 50 + b"\xff" * 20)
    r = subprocess.run([sys.executable, "-m", "quanta.cli", "inspect", str(garbage)], capture_output=True, text=True,
                       env=env, timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"quanta inspect: error: {garbage}: {NOT_RECOGNISED}")


def test_weights_metadata_key_is_the_writers():
    # inspect_file repeats the key to stay free of torch at import; the two must not drift apart
    import quanta.tools.inspect_file as inspect_module
    from quanta.tools.weight_files import WEIGHTS_METADATA_KEY

    assert inspect_module._WEIGHTS_KEY == WEIGHTS_METADATA_KEY
