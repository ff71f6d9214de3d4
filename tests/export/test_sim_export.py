"""QuantizationSimModel.export: ONNX with QDQ plus an AIMET encodings file, read back bit-exactly."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from quanta.quantsim import QuantizationSimModel
from quantsim_models import SmallCNN, TransformerBlock

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


def _sim(model, x, **kwargs):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sim = QuantizationSimModel(model.eval(), x, **kwargs)
    sim.compute_encodings([x], progress=False)
    return sim


def _run_onnx(path, x):
    # ORT's graph optimizations rewrite QDQ patterns (integer kernels, fused ops) whose rounding can flip a
    # code per layer (measured: up to 2 output steps on this transformer); unoptimized, ORT runs the graph
    # as written and matches the simulation within one step.
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    return torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0])


@pytest.mark.parametrize("version", ["0.6.1", "1.0.0", "2.0.0"])
@pytest.mark.parametrize("make, shape", [(SmallCNN, (4, 3, 16, 16)), (lambda: TransformerBlock(32, 4), (2, 8, 32))])
def test_export_writes_both_files_that_round_trip(tmp_path, version, make, shape):
    torch.manual_seed(0)
    model, x = make(), torch.randn(*shape)
    sim = _sim(model, x)
    names = sim.export(tmp_path, "m", x, encoding_version=version)
    assert (tmp_path / "m.onnx").is_file() and (tmp_path / "m.encodings").is_file()
    doc = json.loads((tmp_path / "m.encodings").read_text())
    assert doc["version"] == version
    assert set(names) == {name for name, _ in sim.named_quantizers()}
    fresh = QuantizationSimModel(model, x)
    fresh.load_encodings(tmp_path / "m.encodings")
    with torch.no_grad():
        expected = sim.model(x)
        assert torch.equal(fresh.model(x), expected)
    out_q = [m for _, m in sim.quantized_modules() if m.output_quantizers[0] is not None][-1].output_quantizers[0]
    step = float(out_q.get_scale())
    assert float((_run_onnx(tmp_path / "m.onnx", x) - expected).abs().max()) <= step * 1.0001


def test_export_float_graph_with_qdq_false(tmp_path):
    x = torch.randn(2, 3, 16, 16)
    sim = _sim(SmallCNN(), x)
    sim.export(tmp_path, "f", x, qdq=False)
    with torch.no_grad(), sim.quantizers_disabled():
        ref = sim.model(x)
    torch.testing.assert_close(_run_onnx(tmp_path / "f.onnx", x), ref, atol=1e-5, rtol=1e-5)


def test_export_arguments_are_checked(tmp_path):
    x = torch.randn(2, 3, 16, 16)
    sim = _sim(SmallCNN(), x)
    with pytest.raises(ValueError, match="filename_prefix"):
        sim.export(tmp_path, "a/b", x)
    with pytest.raises(ValueError, match="filename_prefix"):
        sim.export(tmp_path, "", x)
    with pytest.raises(FileNotFoundError, match="export directory"):
        sim.export(tmp_path / "missing", "m", x)
    with pytest.raises(ValueError):
        sim.export(tmp_path, "m", x, encoding_version="9.9")
