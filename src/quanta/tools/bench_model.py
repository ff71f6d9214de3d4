"""``quanta bench``: compare quantization schemes on a user's saved model and data.

Loads the model and the data exactly as ``quanta quantize`` does
(:func:`~quanta.tools.quantize_model.prepare_model_and_batches`: a ``torch.export`` program or a state dict
with ``model_class``; a ``.pt``/``.npy`` tensor split into batches, a program's static batch size kept; for a
model with several inputs a ``.pt`` tuple of tensors or a dict keyed by the forward's parameter names, each batch a
tuple of inputs split alike, ``--eval`` holding the same inputs),
then measures, one row per scheme:

* ``float32``: the model itself, the baseline;
* ``QuantSim W8A8`` (simulated): a :class:`~quanta.quantsim.QuantizationSimModel` with the default
  config (or ``config_file``), calibrated with ``compute_encodings`` on the first ``num_batches`` batches
  of the data; its weight bytes count ``bits/8`` per quantized weight plus the scales;
* real storage with :func:`quanta.quantization.quantize_` on a copy of the float model:
  ``Int8WeightOnlyConfig()``, ``Int8DynamicActivationInt8WeightConfig()`` and
  ``Int4WeightOnlyConfig(group_size=32)``; these take ``nn.Linear`` layers only, and their weight bytes are
  the quantized tensors' ``storage_nbytes``.

Each row has the output SQNR vs the float model in dB over the evaluation data (``eval_path``, else all of
the calibration data), the weight bytes and their ratio to the float model's, and the forward latency
relative to the float model on one evaluation batch (the two timed in alternation, best of several
repetitions, eval mode, no grad). A scheme that fails on the model, or that quantizes no layer of it, is left
out with a note saying why; layers a config keeps in float are noted too. Input errors are ValueError /
FileNotFoundError naming the argument (the CLI prints them as one line, exit status 2).

>>> cfg = BenchConfig(progress=False)
>>> result = bench_model("model.pt2", "calib.npy", cfg)                    # doctest: +SKIP
>>> print(format_bench(result))                                           # doctest: +SKIP
"""

from __future__ import annotations

import copy
import math
import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quanta.tools.measure import (
    Batch,
    batch_shape,
    call_model,
    flat_outputs,
    format_batch_shape,
    set_eval,
    sqnr_db,
    time_ratio,
    weight_bytes,
)

__all__ = ["BenchConfig", "BenchResult", "BenchRow", "bench_model", "format_bench"]

SIMULATED = "simulated"
REAL = "real storage"
FLOAT = "float"


@dataclass(frozen=True)
class BenchConfig:
    """Settings of ``quanta bench`` (the CLI's flags default to these).

    ``batch_size`` None: ``quanta quantize``'s default, or a ``torch.export`` program's static batch size.
    ``num_batches`` None: calibrate on every batch of the data.
    """

    model_class: str | None = None
    config_file: Path | None = None
    batch_size: int | None = None
    num_batches: int | None = None
    progress: bool = True


@dataclass(frozen=True)
class BenchRow:
    """One scheme: ``sqnr_db`` is None for the float baseline (``inf``: outputs identical to float's; ``nan``:
    the float outputs are not finite); ``bytes_ratio`` is None when the float model stores no parameter."""

    scheme: str
    kind: str  # "float", "simulated" or "real storage"
    sqnr_db: float | None
    weight_bytes: int
    bytes_ratio: float | None
    time_ratio: float


@dataclass
class BenchResult:
    """What :func:`bench_model` measured (printed by :func:`format_bench`)."""

    rows: list[BenchRow]
    notes: list[str] = field(default_factory=list)
    eval_on_calibration_data: bool = False
    calibration_batches: int = 0
    eval_batches: int = 0
    batch_shape: tuple[Any, ...] = ()  # ints; for a model with several inputs, one shape per input

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (strict JSON: no NaN/Infinity tokens): a non-finite SQNR becomes the string ``"inf"``
        (outputs identical to float's), ``"-inf"`` (float outputs all zero) or ``"nan"``; None stays null
        (the float baseline)."""
        rows = []
        for r in self.rows:
            d = asdict(r)
            if d["sqnr_db"] is not None and not math.isfinite(d["sqnr_db"]):
                d["sqnr_db"] = "nan" if math.isnan(d["sqnr_db"]) else ("inf" if d["sqnr_db"] > 0 else "-inf")
            rows.append(d)
        return {"rows": rows, "notes": list(self.notes), "eval_on_calibration_data": self.eval_on_calibration_data,
                "calibration_batches": self.calibration_batches, "eval_batches": self.eval_batches,
                "batch_shape": _listed(self.batch_shape)}


def _listed(shape: tuple[Any, ...]) -> list[Any]:
    return [_listed(s) if isinstance(s, tuple) else s for s in shape]


def _real_storage_configs() -> list[tuple[str, Any]]:
    from quanta.quantization import (
        Int4WeightOnlyConfig,
        Int8DynamicActivationInt8WeightConfig,
        Int8WeightOnlyConfig,
    )

    return [("int8 weight-only", Int8WeightOnlyConfig()),
            ("int8 dyn-act + int8 weight", Int8DynamicActivationInt8WeightConfig()),
            ("int4 weight-only g32", Int4WeightOnlyConfig(group_size=32))]


def _one_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return " ".join(lines[0].split()) if lines else type(e).__name__


def _warning_notes(caught: list[warnings.WarningMessage], scheme: str) -> list[str]:
    notes: list[str] = []
    for w in caught:
        if issubclass(w.category, (DeprecationWarning, FutureWarning)):
            continue
        text = f"{scheme}: {' '.join(str(w.message).split())}"
        if text not in notes:
            notes.append(text)
    return notes


@torch.no_grad()
def _eval_outputs(model: nn.Module, batches: list[Batch]) -> torch.Tensor:
    set_eval(model)
    return torch.cat([flat_outputs(call_model(model, x)) for x in batches])


def bench_model(model_path: str | os.PathLike, data_path: str | os.PathLike, cfg: BenchConfig = BenchConfig(), *,
                eval_path: str | os.PathLike | None = None) -> BenchResult:
    """Measure every scheme on the model in ``model_path`` (see the module docstring)."""
    from quanta.quantization import quantize_
    from quanta.quantsim import QuantizationSimModel
    from quanta._progress import make_bar
    from quanta.tools.quantize_model import (
        load_quantsim_config,
        prepare_model_and_batches,
    )

    config = load_quantsim_config(cfg.config_file)
    prepared = prepare_model_and_batches(model_path, data_path, model_class=cfg.model_class,
                                         batch_size=cfg.batch_size, num_batches=cfg.num_batches, evaluate=True,
                                         eval_path=eval_path, data_arg="--data", eval_arg="--eval")
    model = set_eval(prepared.loaded.model)
    batches, eval_batches = prepared.batches, prepared.eval_batches
    notes = list(prepared.notes)
    if eval_path is None:
        notes.append(f"no --eval data: SQNR measured on the calibration data (all {len(eval_batches)} batches "
                     "of --data)")
    timing_batch = eval_batches[0]
    reference = _eval_outputs(model, eval_batches)
    if not bool(torch.isfinite(reference).all()):
        notes.append("the float model's outputs on the evaluation data are not all finite (NaN or inf in the "
                     "data?): SQNR is nan")
    base_bytes = weight_bytes(model)
    rows = [BenchRow("float32", FLOAT, None, base_bytes, 1.0 if base_bytes else None, 1.0)]

    def add(name: str, kind: str, candidate: nn.Module) -> None:
        out = _eval_outputs(candidate, eval_batches)
        nbytes = weight_bytes(candidate)
        rows.append(BenchRow(name, kind, sqnr_db(reference, out), nbytes, nbytes / base_bytes if base_bytes else None,
                             time_ratio(candidate, model, timing_batch)))

    real = _real_storage_configs()
    bar = make_bar(1 + len(real), enabled=cfg.progress, desc="quanta bench")
    try:
        name = "QuantSim W8A8"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                sim = QuantizationSimModel(model, batches[0], config_file=config)
            except ValueError as e:
                if config is not None:  # the user's config: an input error, as in quanta quantize
                    raise ValueError(f"--config {cfg.config_file} does not fit the model: {_one_line(e)}") from None
                sim = None
                notes.append(f"{name}: skipped, QuantizationSimModel failed: {_one_line(e)}")
            if sim is not None and not any(q is not None for _, m in sim.quantized_modules()
                                           for q in [*m.input_quantizers, *m.output_quantizers,
                                                     *m.param_quantizers.values()]):
                notes.append(f"{name}: skipped, QuantizationSimModel found nothing to quantize in the model")
                sim = None
            if sim is not None:
                sim.compute_encodings(batches, progress=False)
                add(name, SIMULATED, sim.model)
        notes.extend(_warning_notes(caught, name))
        bar.advance()

        for name, qcfg in real:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    candidate = copy.deepcopy(model)
                    report = quantize_(candidate, qcfg)
                    if not report.quantized:
                        why = "; ".join(f"{n or '<root>'}: {r}" for n, r in report.skipped.items()) or \
                            "the model has no nn.Linear layer"
                        notes.append(f"{name}: skipped, {type(qcfg).__name__} quantized no layer ({why})")
                    else:
                        add(name, REAL, candidate)
                        notes.extend(_warning_notes(caught, name))
                except Exception as e:  # noqa: BLE001  (a config the model does not support: a note, not a failure)
                    notes.append(f"{name}: skipped, {type(qcfg).__name__} failed on the model: {_one_line(e)}")
            bar.advance()
    finally:
        bar.close()
    return BenchResult(rows, notes, eval_path is None, len(batches), len(eval_batches), batch_shape(timing_batch))


def format_bench(result: BenchResult) -> str:
    """Fixed-width table of the rows, then one ``note:`` line per note."""
    lines = [f"{'scheme':<28} {'kind':<13} {'SQNR dB':>8} {'weights (bytes)':>15} {'vs fp32':>7} {'latency':>8}"]
    for r in result.rows:
        if r.sqnr_db is None:
            sq = "-"
        elif math.isinf(r.sqnr_db):
            sq = "inf"
        else:
            sq = f"{r.sqnr_db:.1f}"
        ratio = "-" if r.bytes_ratio is None else f"{r.bytes_ratio:.3f}"
        lines.append(f"{r.scheme:<28} {r.kind:<13} {sq:>8} {r.weight_bytes:>15,} {ratio:>7} "
                     f"{r.time_ratio:>7.2f}x")
    where = "the calibration data (--data)" if result.eval_on_calibration_data else "--eval"
    lines.append(f"calibrated on {result.calibration_batches} batches; SQNR vs float32 over {result.eval_batches} "
                 f"batches of {where}; latency vs float32 on one batch of {format_batch_shape(result.batch_shape)}")
    lines += [f"note: {n}" for n in result.notes]
    return "\n".join(lines)
