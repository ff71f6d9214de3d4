"""The aimet-torch side of ``test_aimet_interop.py``, run in the interpreter ``QUANTA_AIMET_PYTHON`` names.

    python aimet_interop_worker.py WORKDIR MODEL PHASE

``WORKDIR`` holds ``config.json`` (the quantsim config both sides use); ``MODEL`` is a key of
``aimet_interop_models.MODELS``. Phases:

* ``calibrate``: an AIMET QuantizationSimModel, calibrated on the model's batches, exported with
  ``sim.export`` (``aimet/m.onnx``, ``m.encodings``, ``m_torch.encodings``, encoding version 1.0.0) and with
  ``sim.onnx.export`` (``aimet/onnx_<version>.onnx`` + ``.encodings`` for 0.6.1, 1.0.0, 2.0.0, 2.1.0; the
  TorchScript exporter); its state in ``aimet_calibrated.json``.
* ``load``: fresh AIMET sims load ``<src>/m_torch.encodings`` for each ``src`` directory quanta wrote
  (``quanta``: quanta calibrated it; ``requanta``: quanta loaded AIMET's file and exported it again), their
  states in ``aimet_from_<src>.json``; the one from ``quanta`` is exported again to ``reaimet/``.

A state is ``{"quantizers": {name: {"scale", "offset", "qmin", "qmax"}}, "output": [...]}`` (the evaluation
batch's output, flat): floats written by ``json`` are the float32 values exactly.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from aimet_interop_models import make  # noqa: E402

warnings.simplefilter("ignore")
logging.disable(logging.WARNING)


def _state(sim, x: torch.Tensor) -> dict:
    quantizers = {}
    for name, q in sim.named_quantizers():
        if q is None or not q.is_initialized():
            continue
        quantizers[name] = {"scale": q.get_scale().detach().flatten().tolist(),
                            "offset": q.get_offset().detach().flatten().tolist(), "qmin": q.qmin, "qmax": q.qmax}
    with torch.no_grad():
        y = sim.model(x).as_subclass(torch.Tensor)
    return {"quantizers": quantizers, "output": y.flatten().tolist()}


def _write(path: str, state: dict) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(state, f)


def main(workdir: str, name: str, phase: str) -> None:
    from aimet_torch.common import quantsim as aimet_quantsim
    from aimet_torch.quantsim import QuantizationSimModel

    model, calib, x = make(name)
    config = os.path.join(workdir, "config.json")

    def sim() -> QuantizationSimModel:
        return QuantizationSimModel(model, calib[0], config_file=config)

    if phase == "calibrate":
        a = sim()
        a.compute_encodings(lambda m: [m(b) for b in calib])
        out = os.path.join(workdir, "aimet")
        os.makedirs(out, exist_ok=True)
        aimet_quantsim.encoding_version = "1.0.0"
        a.export(out, "m", calib[0])
        for version in ("0.6.1", "1.0.0", "2.0.0", "2.1.0"):
            a.onnx.export((calib[0],), os.path.join(out, f"onnx_{version}.onnx"), encoding_version=version,
                          dynamo=False)
        _write(os.path.join(workdir, "aimet_calibrated.json"), _state(a, x))
    elif phase == "load":
        for src in ("quanta", "requanta"):
            c = sim()
            c.load_encodings(os.path.join(workdir, src, "m_torch.encodings"), strict=True, partial=False)
            _write(os.path.join(workdir, f"aimet_from_{src}.json"), _state(c, x))
            if src == "quanta":
                os.makedirs(os.path.join(workdir, "reaimet"), exist_ok=True)
                c.export(os.path.join(workdir, "reaimet"), "m", calib[0])
    else:
        raise SystemExit(f"unknown phase {phase!r}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
