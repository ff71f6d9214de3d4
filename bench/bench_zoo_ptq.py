"""AdaRound and Sequential MSE across the model zoo: W4 weights per channel, 8-bit activations, beside AIMET.

Every model of ``tests/quantsim/zoo_models.py`` (transformers' own classes, small random configs, BatchNorm
statistics settled on data) goes into a ``QuantizationSimModel`` with quanta's default config at 4-bit weights
(per output channel, min-max) and 8-bit activations, embedding tables left in float (at 4 bits they alone set the
error of the encoders, and neither technique touches them). Rows per model, each the output SQNR (dB) against the float
model on held-out inputs at another batch size and length than calibration's:

* nearest: the weights rounded to nearest, activations calibrated;
* SeqMSE: ``apply_seq_mse`` picks each layer's weight ranges, then the activations are calibrated on the new weights;
* AdaRound: ``apply_adaround`` learns each weight's rounding, then the activations are calibrated again.

With aimet-torch importable (``PYTHONPATH=src /tmp/anchors/bin/python bench/bench_zoo_ptq.py``), the CNNs AIMET
accepts (it refuses every transformers model: "only supports models that return a tensor or tuple, list, or dict
of tensors", so they are wrapped to return their output tensor) run again in both libraries under AIMET's default
config with per-channel weights (AIMET's placement: model input and every op output quantized), AIMET's
``apply_seq_mse`` and ``Adaround.apply_adaround`` (its encodings frozen into a new sim) beside quanta's, on the same
data; times are the technique's own (seconds).

Run: ``python bench/bench_zoo_ptq.py [--models resnet,bert] [--iterations 500] [--batches 4]`` (about 10 minutes
for the zoo on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import logging
import math
import os
import pathlib
import sys
import tempfile
import time
import warnings

import torch
from torch import nn

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests" / "quantsim"))
import zoo_models  # noqa: E402

_spec = importlib.util.spec_from_file_location("bench_adaround", pathlib.Path(__file__).with_name("bench_adaround.py"))
bench_adaround = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_adaround)

#: the zoo's CNNs, run beside aimet-torch (the transformers models it refuses)
CNNS = ("resnet", "regnet", "mobilenet_v2", "efficientnet", "convnext")


class Tensorized(nn.Module):
    """A zoo CNN taking its pixels positionally and returning its output tensor (what AIMET accepts)."""

    def __init__(self, model: nn.Module, key: str) -> None:
        super().__init__()
        self.model, self.key = model, key

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model(pixel_values=pixel_values)[self.key]


def _data(inputs, seed: int, batches: int, batch: int, length: int) -> list:
    torch.manual_seed(seed)
    return [inputs(batch, length) for _ in range(batches)]


def _sqnr(model: nn.Module, reference: nn.Module, held_out: list, key: str | None) -> float:
    signal = noise = 0.0
    with torch.no_grad():
        for x in held_out:
            ref = reference(**x) if isinstance(x, dict) else reference(x)
            out = model(**x) if isinstance(x, dict) else model(x)
            ref, out = (ref[key], out[key]) if key is not None else (ref, out)
            ref, out = ref.as_subclass(torch.Tensor).double(), out.as_subclass(torch.Tensor).double()
            signal += float(ref.pow(2).sum())
            noise += float((out - ref).pow(2).sum())
    return 10 * torch.log10(torch.tensor(signal / max(noise, 1e-300), dtype=torch.float64)).item()


def run_quanta(model, data, held_out, key, iterations, candidates, config=None, tmp: str | None = None
               ) -> dict[str, tuple[float, float]]:
    """{row: (output SQNR dB, seconds of the technique)} with quanta at W4A8. With ``config`` (a config dict) and
    ``tmp``, AdaRound runs AIMET's way, as ``run_aimet`` does: ``Adaround.apply_adaround`` on the float model, its
    encodings file frozen into a new sim (the same random draws as AIMET's, so the same rounding)."""
    from quanta.adaround import Adaround, AdaroundParameters, apply_adaround
    from quanta.quantsim import QuantizationSimModel
    from quanta.seq_mse import apply_seq_mse

    tables = [n for n, m in model.named_modules() if isinstance(m, nn.Embedding)]

    def sim(float_model=model):
        options = {} if config is None else {"config_file": config, "quant_scheme": "post_training_tf"}
        s = QuantizationSimModel(copy.deepcopy(float_model), data[0], default_param_bw=4, default_output_bw=8,
                                 **options)
        # lookup tables, not layers the techniques search: kept in float, as W4 recipes keep them (found by the
        # float model's names, and by type where the capture renamed a shared one)
        embeddings = {id(m): m for m in s.model.modules() if isinstance(m, nn.Embedding)}
        for name in tables:
            with contextlib.suppress(AttributeError):
                embeddings.setdefault(id(s.model.get_submodule(name)), s.model.get_submodule(name))
        if embeddings:
            s.exclude_layers_from_quantization(list(embeddings.values()))
        return s

    rows = {}
    s = sim()
    s.compute_encodings(data, progress=False)
    rows["nearest"] = (_sqnr(s.model, model, held_out, key), 0.0)
    s = sim()
    t0 = time.perf_counter()
    apply_seq_mse(s, data, num_candidates=candidates, progress=False)
    seconds = time.perf_counter() - t0
    s.compute_encodings(data, progress=False)  # activations on the searched weights (their ranges stay frozen)
    rows["SeqMSE"] = (_sqnr(s.model, model, held_out, key), seconds)
    params = AdaroundParameters(data, num_batches=len(data), default_num_iterations=iterations)
    if config is not None and tmp is not None:
        torch.manual_seed(0)
        t0 = time.perf_counter()
        ada = Adaround.apply_adaround(copy.deepcopy(model), data[0], params, path=tmp, filename_prefix="ada_quanta",
                                      default_param_bw=4, default_quant_scheme="post_training_tf",
                                      default_config_file=config)
        seconds = time.perf_counter() - t0
        s = sim(ada)
        s.set_and_freeze_param_encodings(os.path.join(tmp, "ada_quanta.encodings"))
    else:
        s = sim()
        s.compute_encodings(data, progress=False)
        torch.manual_seed(0)
        t0 = time.perf_counter()
        apply_adaround(s, params, progress=False)
        seconds = time.perf_counter() - t0
    s.compute_encodings(data, progress=False)  # activations on the rounded weights
    rows["AdaRound"] = (_sqnr(s.model, model, held_out, key), seconds)
    return rows


def run_aimet(model, data, held_out, iterations, candidates, config_path: str, tmp: str
              ) -> tuple[dict[str, tuple[float, float]], dict[str, str]]:
    """The same rows with aimet-torch (``model`` takes and returns a tensor), and why any of them failed."""
    from aimet_torch.adaround import Adaround, AdaroundParameters
    from aimet_torch.common.defs import QuantScheme
    from aimet_torch.quantsim import QuantizationSimModel
    from aimet_torch.seq_mse import apply_seq_mse

    def sim(m):
        return QuantizationSimModel(copy.deepcopy(m), data[0], quant_scheme=QuantScheme.post_training_tf,
                                    default_param_bw=4, default_output_bw=8, config_file=config_path)

    def calibrate(s):
        s.compute_encodings(lambda m, _: [m(x) for x in data], None)

    rows: dict[str, tuple[float, float]] = {}
    errors: dict[str, str] = {}

    def row(label: str, technique) -> None:  # AIMET fails on some models in one technique only
        try:
            rows[label] = technique()
        except Exception as e:  # noqa: BLE001  (a bench row, not a library path)
            rows[label] = (math.nan, math.nan)
            errors[label] = f"{type(e).__name__}: {str(e)[:100]}"

    def nearest():
        s = sim(model)
        calibrate(s)
        return _sqnr(s.model, model, held_out, None), 0.0

    def seq_mse():
        s = sim(model)
        t0 = time.perf_counter()
        apply_seq_mse(s, data, num_candidates=candidates)
        seconds = time.perf_counter() - t0
        calibrate(s)
        return _sqnr(s.model, model, held_out, None), seconds

    def adaround():
        params = AdaroundParameters(data, num_batches=len(data), default_num_iterations=iterations)
        torch.manual_seed(0)
        t0 = time.perf_counter()
        ada = Adaround.apply_adaround(copy.deepcopy(model), data[0], params, path=tmp, filename_prefix="ada",
                                      default_param_bw=4, default_quant_scheme=QuantScheme.post_training_tf,
                                      default_config_file=config_path)
        seconds = time.perf_counter() - t0
        s = sim(ada)
        s.set_and_freeze_param_encodings(os.path.join(tmp, "ada.encodings"))
        calibrate(s)
        return _sqnr(s.model, model, held_out, None), seconds

    for label, technique in (("nearest", nearest), ("SeqMSE", seq_mse), ("AdaRound", adaround)):
        row(label, technique)
    return rows, errors


def _line(name: str, library: str, rows: dict[str, tuple[float, float]]) -> str:
    cells = "".join(f" {rows[r][0]:8.2f}" for r in ("nearest", "SeqMSE", "AdaRound"))
    times = "".join(f" {rows[r][1]:7.1f}" for r in ("SeqMSE", "AdaRound"))
    return f"{name:<16} {library:<20}{cells}{times}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(zoo_models.ZOO), help="comma-separated zoo names")
    parser.add_argument("--iterations", type=int, default=500, help="AdaRound steps per layer")
    parser.add_argument("--candidates", type=int, default=20, help="Sequential MSE ranges per channel")
    parser.add_argument("--batches", type=int, default=zoo_models.CALIBRATION[0],
                        help="calibration batches (the zoo's batch size and length)")
    args = parser.parse_args()
    names = args.models.split(",")
    unknown = sorted(set(names) - set(zoo_models.ZOO))
    if unknown:
        parser.error(f"--models: unknown {unknown}; the zoo has {sorted(zoo_models.ZOO)}")
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    bench_adaround._without_stub_torchvision()
    with_aimet = importlib.util.find_spec("aimet_torch") is not None
    _, batch, length = zoo_models.CALIBRATION
    batches = args.batches
    print(f"W4 (per channel, min-max) A8; {batches} calibration batches of {batch} at length {length}, held out "
          f"{zoo_models.EVALUATION}; AdaRound {args.iterations} steps/layer, SeqMSE {args.candidates} candidates; "
          f"output SQNR dB vs float, technique seconds; threads {torch.get_num_threads()}")
    print(f"{'model':<16} {'library, config':<20} {'nearest':>8} {'SeqMSE':>8} {'AdaRound':>8} {'t SeqMSE':>7} "
          f"{'t Ada':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        config_path = os.path.join(tmp, "config.json")
        with open(config_path, "w") as f:
            json.dump(bench_adaround.PER_CHANNEL_CONFIG, f)
        for name in names:
            model, inputs, key = zoo_models.build(name)
            data = _data(inputs, 1, batches, batch, length)
            held_out = _data(inputs, 2, 2, *zoo_models.EVALUATION)
            print(_line(name, "quanta, default", run_quanta(model, data, held_out, key, args.iterations,
                                                            args.candidates)), flush=True)
            if name in CNNS and with_aimet:
                plain = Tensorized(model, key).eval()
                pixels = [x["pixel_values"] for x in data]
                held = [x["pixel_values"] for x in held_out]
                print(_line("", "quanta, AIMET's", run_quanta(plain, pixels, held, None, args.iterations,
                                                              args.candidates, config=bench_adaround.PER_CHANNEL_CONFIG,
                                                              tmp=tmp)), flush=True)
                rows, errors = run_aimet(plain, pixels, held, args.iterations, args.candidates, config_path, tmp)
                print(_line("", "aimet-torch, AIMET's", rows), flush=True)
                for label, error in errors.items():
                    print(f"{'':<16} (aimet-torch {label} failed: {error})")


if __name__ == "__main__":
    main()
