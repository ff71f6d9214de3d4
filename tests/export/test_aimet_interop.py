"""Moving a project between AIMET and quanta: both directions of the round trip, against aimet-torch itself.

Skipped unless ``QUANTA_AIMET_PYTHON`` names an interpreter with aimet-torch (2.42 tested), e.g.
``QUANTA_AIMET_PYTHON=/tmp/anchors/bin/python python -m pytest tests/export/test_aimet_interop.py``:
``aimet_interop_worker.py`` runs the AIMET side in it. On each model of ``aimet_interop_models``
(a CNN and a transformer block), one quantsim config file, the same data:

* AIMET and quanta calibrate identical sims (same quantizers, scales, offsets, outputs);
* AIMET → quanta → AIMET: quanta loads AIMET's ``sim.export`` files (``m_torch.encodings``, and the
  ONNX-keyed ``m.encodings`` with its ``m.onnx``), its own export of that loads back into AIMET: the
  same sim as AIMET's, bit for bit;
* quanta → AIMET → quanta: AIMET's ``load_encodings`` reads quanta's ``m_torch.encodings``, and quanta reads
  AIMET's export of that back: the same sim;
* quanta's ``m.encodings`` names the tensors as AIMET's does (but the graph's input and output, matched by
  position), and quanta reads the files of AIMET's ``sim.onnx.export`` (0.6.1, 1.0.0, 2.0.0, 2.1.0: int32
  bias encodings and encodings repeated after a Flatten included).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
AIMET_PYTHON = os.environ.get("QUANTA_AIMET_PYTHON", "")

pytestmark = pytest.mark.skipif(not AIMET_PYTHON or shutil.which(AIMET_PYTHON) is None,
                                reason="QUANTA_AIMET_PYTHON (an interpreter with aimet-torch) is not set")
pytest.importorskip("onnx")

from quanta.quantsim import QuantizationSimModel  # noqa: E402


def _models():
    spec = importlib.util.spec_from_file_location("aimet_interop_models", HERE / "aimet_interop_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


MODELS = _models()


def _aimet(workdir: Path, name: str, phase: str) -> None:
    run = subprocess.run([AIMET_PYTHON, str(HERE / "aimet_interop_worker.py"), str(workdir), name, phase],
                         capture_output=True, text=True, timeout=900)
    if run.returncode:
        raise AssertionError(f"the AIMET side failed ({phase}):\n{run.stdout[-3000:]}\n{run.stderr[-6000:]}")


def _sim(name: str, workdir: Path) -> QuantizationSimModel:
    model, calib, _ = MODELS.make(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        # the block: AIMET's sim quantizes modules only, quanta's too with trace=False
        return QuantizationSimModel(model, calib[0], config_file=str(workdir / "config.json"), trace=name == "cnn")


def _state(sim: QuantizationSimModel, x: torch.Tensor) -> dict:
    quantizers = {n: {"scale": q.get_scale().detach().flatten().tolist(),
                      "offset": q.get_offset().detach().flatten().tolist(), "qmin": q.qmin, "qmax": q.qmax}
                  for n, q in sim.named_quantizers() if q.is_initialized()}
    with torch.no_grad():
        y = sim.model(x).as_subclass(torch.Tensor)
    return {"quantizers": quantizers, "output": y.flatten().tolist()}


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


def _export(sim: QuantizationSimModel, directory: Path, x: torch.Tensor) -> None:
    directory.mkdir(exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sim.export(directory, "m", x)


@pytest.fixture(scope="module", params=sorted(MODELS.MODELS))
def run(request, tmp_path_factory):
    """Everything both sides do for one model; the states and files the tests compare."""
    name = request.param
    work = tmp_path_factory.mktemp(f"interop-{name}")
    (work / "config.json").write_text(json.dumps(MODELS.CONFIG))
    _, calib, x = MODELS.make(name)
    _aimet(work, name, "calibrate")
    states = {"aimet": _read(work / "aimet_calibrated.json")}

    q = _sim(name, work)
    q.compute_encodings(calib, progress=False)
    states["quanta"] = _state(q, x)
    _export(q, work / "quanta", calib[0])

    for key, path in (("quanta<-aimet_torch", work / "aimet" / "m_torch.encodings"),
                      ("quanta<-aimet", work / "aimet" / "m.encodings")):
        s = _sim(name, work)
        s.load_encodings(path, strict=True, partial=False)
        states[key] = _state(s, x)
        if key == "quanta<-aimet_torch":
            _export(s, work / "requanta", calib[0])

    _aimet(work, name, "load")
    states["aimet<-quanta"] = _read(work / "aimet_from_quanta.json")
    states["aimet<-quanta<-aimet"] = _read(work / "aimet_from_requanta.json")
    for key, path in (("quanta<-aimet<-quanta", work / "reaimet" / "m_torch.encodings"),
                      ("quanta<-aimet<-quanta (tensor names)", work / "reaimet" / "m.encodings")):
        s = _sim(name, work)
        s.load_encodings(path, strict=True, partial=False)
        states[key] = _state(s, x)
    return name, work, states


def _same(a: dict, b: dict) -> None:
    assert sorted(a["quantizers"]) == sorted(b["quantizers"])
    for n in a["quantizers"]:
        assert a["quantizers"][n] == b["quantizers"][n], n
    assert a["output"] == b["output"]


def test_same_data_and_config_give_identical_sims(run):
    _, _, states = run
    assert len(states["aimet"]["quantizers"]) >= 5
    _same(states["quanta"], states["aimet"])


def test_aimet_to_quanta_to_aimet(run):
    _, _, states = run
    _same(states["quanta<-aimet_torch"], states["aimet"])  # quanta reads AIMET's module-keyed file
    _same(states["quanta<-aimet"], states["aimet"])  # and its ONNX-keyed one (with the .onnx beside it)
    _same(states["aimet<-quanta<-aimet"], states["aimet"])  # AIMET reads quanta's export of it


def test_quanta_to_aimet_to_quanta(run):
    _, _, states = run
    _same(states["aimet<-quanta"], states["quanta"])  # AIMET's load_encodings reads quanta's export
    _same(states["quanta<-aimet<-quanta"], states["quanta"])  # quanta reads AIMET's export of it
    _same(states["quanta<-aimet<-quanta (tensor names)"], states["quanta"])


def test_encodings_files_name_tensors_as_aimet_does(run):
    """torch.onnx's names; AIMET renames the last op of a module that became several ("/qkv#1.end/Add_output_0"
    for quanta's "/qkv/Add_output_0")."""
    import onnx

    from quanta.export.onnx.names import aimet_to_torch_name

    _, work, _ = run
    names = {}
    for side in ("aimet", "quanta"):
        doc = _read(work / side / "m.encodings")
        assert doc["version"] == "1.0.0" and doc["producer"]["package"] == ("aimet-torch" if side == "aimet" else "quanta")
        graph = onnx.load(str(work / side / "m.onnx")).graph
        io = {v.name: f"{kind}{i}" for kind, vs in (("input", graph.input), ("output", graph.output))
              for i, v in enumerate(vs)}
        producers = {o: n for n in graph.node for o in n.output}
        # a graph output in AIMET's float graph is the quantized tensor itself; in quanta's, its DequantizeLinear's
        # output: name both by position
        for n in graph.node:
            if n.op_type == "DequantizeLinear" and n.output[0] in io:
                q = producers[n.input[0]]
                io[q.input[0]] = io[n.output[0]]
        names[side] = {e["name"]: io.get(e["name"], aimet_to_torch_name(e["name"]))
                       for key in ("activation_encodings", "param_encodings") for e in doc[key]}
        assert set(names[side]) <= ({t for n in graph.node for t in n.input} | {i.name for i in graph.initializer}
                                    | {o.name for o in graph.output})
    assert sorted(names["quanta"].values()) == sorted(names["aimet"].values())
    torch_doc = _read(work / "quanta" / "m_torch.encodings")
    assert set(torch_doc["activation_encodings"]) == set(_read(work / "aimet" / "m_torch.encodings")["activation_encodings"])


@pytest.mark.parametrize("version", ["0.6.1", "1.0.0", "2.0.0", "2.1.0"])
def test_quanta_reads_aimets_onnx_export(run, version):
    name, work, states = run
    s = _sim(name, work)
    s.load_encodings(work / "aimet" / f"onnx_{version}.encodings", strict=True, partial=False)
    _same(_state(s, MODELS.make(name)[2]), states["aimet"])
