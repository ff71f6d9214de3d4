"""Record aimet-torch's QuantSim, per shipped quantsim config file and model, for ``test_aimet_configs.py``.

Not a test; needs aimet-torch 2.42 (the scratch venv of ``../shared/scripts/anchor_venv.sh``)::

    /tmp/anchors/bin/python tests/golden/generate_aimet_quantsim_configs.py

Writes ``aimet_quantsim_configs.json`` beside itself. For each of the config files AIMET ships
(``aimet_torch/common/quantsim_config/*.json``, copied to ``tests/quantsim/aimet_configs/``) and each model of
``tests/quantsim/aimet_config_models.py`` (``cnn``, ``transformer``), AIMET's recommended flow:
``prepare_model`` (functional ops become modules), ``QuantizationSimModel(prepared, dummy,
config_file=...)`` with AIMET's defaults (MinMax, 8-bit activations and parameters), ``compute_encodings`` over
``CALIBRATION_SEEDS`` batches (``make_inputs(model, n=4, seed=s)``), then the sim's output on ``make_inputs(model,
n=2, seed=EVAL_SEED)``. Recorded, per quantized module (AIMET's names):

* ``type``: the quantized class name;
* ``inputs`` / ``outputs``: one entry per slot, ``null`` where the slot has no quantizer;
* ``params``: ``{name: entry or null}``;

where a quantizer entry is ``{"id", "bitwidth", "symmetric", "signed", "qmin", "qmax", "shape",
"fixed_min", "fixed_max", "scale", "offset", "min", "max"}``: ``id`` numbers the distinct quantizer objects (two
slots holding the same object, as AIMET's encoding propagation makes them, share an id); ``fixed_min`` /
``fixed_max`` are the ends calibration may not overwrite (config ``encoding_constraints``), else null;
``scale``/``offset``/``min``/``max`` (``get_scale()``, ..., ``get_max()``: the encoding, ``min``/``max`` its
representable range) and the output are float32 arrays, zlib-compressed and base64-encoded (``_pack``).
"""

from __future__ import annotations

import base64
import glob
import json
import os
import sys
import zlib

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "quantsim"))

from aimet_config_models import make_inputs, make_model  # noqa: E402

MODELS = ("cnn", "transformer")
CALIBRATION_SEEDS = (0, 1, 2)
EVAL_SEED = 100


def _pack(t: torch.Tensor) -> str:
    raw = t.detach().to(torch.float32).contiguous().numpy().tobytes()
    return base64.b64encode(zlib.compress(raw, 9)).decode()


def _values(t: torch.Tensor | None) -> list[float] | None:
    return None if t is None else [float(v) for v in t.detach().to(torch.float32).flatten()]


def _quantizer(q, ids: dict[int, int]) -> dict | None:
    if q is None:
        return None
    from aimet_torch.quantization.affine import AffineQuantizerBase

    if not isinstance(q, AffineQuantizerBase):
        raise TypeError(f"unexpected quantizer type {type(q).__name__}")
    qid = ids.setdefault(id(q), len(ids))
    initialized = q.is_initialized()
    fixed = {end: (_values(getattr(q, end)) if not q.is_overwrite_allowed(end) else None) for end in ("min", "max")}
    return {
        "id": qid,
        "bitwidth": q.bitwidth,
        "symmetric": bool(q.symmetric),
        "signed": bool(q.signed),
        "qmin": int(q.qmin),
        "qmax": int(q.qmax),
        "shape": list(q.shape),
        "fixed_min": fixed["min"],
        "fixed_max": fixed["max"],
        "scale": _pack(q.get_scale()) if initialized else None,
        "offset": _pack(q.get_offset()) if initialized else None,
        "min": _pack(q.get_min()) if initialized else None,
        "max": _pack(q.get_max()) if initialized else None,
    }


def record(config_path: str, model_name: str) -> dict:
    from aimet_torch.model_preparer import prepare_model
    from aimet_torch.quantsim import QuantizationSimModel

    model = make_model(model_name)
    prepared = prepare_model(model)
    sim = QuantizationSimModel(prepared, make_inputs(model_name, n=2, seed=99), config_file=config_path)
    with torch.no_grad():
        sim.compute_encodings(lambda m: [m(make_inputs(model_name, n=4, seed=s)) for s in CALIBRATION_SEEDS])
        out = sim.model(make_inputs(model_name, n=2, seed=EVAL_SEED))
    ids: dict[int, int] = {}
    modules = {}
    for name, qm in sim.named_qmodules():
        modules[name] = {
            "type": type(qm).__name__,
            "inputs": [_quantizer(q, ids) for q in qm.input_quantizers],
            "outputs": [_quantizer(q, ids) for q in qm.output_quantizers],
            "params": {p: _quantizer(q, ids) for p, q in qm.param_quantizers.items()},
        }
    return {"modules": modules, "output_shape": list(out.shape), "output": _pack(out)}


def main(out_path: str | None = None) -> None:
    import aimet_torch

    config_dir = os.path.join(os.path.dirname(aimet_torch.__file__), "common", "quantsim_config")
    configs = sorted(glob.glob(os.path.join(config_dir, "*.json")))
    result = {
        "aimet_torch": aimet_torch.__version__,
        "torch": torch.__version__,
        "calibration_seeds": list(CALIBRATION_SEEDS),
        "eval_seed": EVAL_SEED,
        "configs": {},
    }
    for path in configs:
        name = os.path.basename(path)
        result["configs"][name] = {m: record(path, m) for m in MODELS}
        print(name, file=sys.stderr)
    from _record import _for_this_cpu  # beside this script (run it as one)

    result["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    out_path = out_path or os.path.join(HERE, _for_this_cpu("aimet_quantsim_configs.json"))
    with open(out_path, "w") as f:
        json.dump(result, f, indent=None, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
