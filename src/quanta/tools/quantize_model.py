"""``quanta quantize``: calibrate a saved model with QuantizationSimModel and write what deployment needs.

Reads a model (:mod:`quanta.tools.model_files`) and calibration data (:mod:`quanta.tools.calibration_data`)
from files, builds a :class:`~quanta.quantsim.QuantizationSimModel`, calibrates it with
``compute_encodings`` and writes into the output directory:

* ``model.onnx`` + ``model.encodings``: :meth:`QuantizationSimModel.export` (QDQ graph and AIMET
  encodings of the chosen version); without ONNX only ``model.encodings`` (``save_encodings(path, version)``);
* ``quantsim.encodings.json``: quanta's lossless encodings (``save_encodings(path)``), which
  :meth:`QuantizationSimModel.load_encodings` reads back bit for bit;
* ``model.safetensors``: the model's state dict with every quantized parameter replaced by its
  fake-quantized value, and each such parameter's encoding in its metadata (:mod:`quanta.tools.weight_files`).

Errors in the inputs are ValueError / FileNotFoundError naming the argument and the fix (the CLI prints
them as one line, exit status 2).

>>> cfg = QuantizeConfig(progress=False)
>>> result = quantize_model("model.pt2", "calib.npy", "out", cfg)          # doctest: +SKIP
>>> print(format_summary(result))                                         # doctest: +SKIP
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quanta._text import shortlist
from quanta.export.encodings import EncodingsVersion
from quanta.quantsim.scheme import QuantScheme
from quanta.tools._errors import first_line
from quanta.tools.calibration_data import as_inputs, forward_names, num_rows, read_data, resolve_data, split_batches
from quanta.tools.measure import (
    Batch,
    batch_shape,
    call_model,
    flat_outputs,
    format_batch_shape,
    sqnr_db,
)
from quanta.tools.model_files import LoadedModel, lift_program, load_model
from quanta.tools.weight_files import save_fake_quantized_weights

__all__ = [
    "ModelAndBatches",
    "QuantizeConfig",
    "QuantizeResult",
    "format_summary",
    "load_quantsim_config",
    "parse_bitwidth",
    "parse_encoding_version",
    "parse_scheme",
    "prepare_model_and_batches",
    "quantize_model",
]

#: File names written into the output directory.
ONNX_FILE = "model.onnx"
ENCODINGS_FILE = "model.encodings"
TORCH_ENCODINGS_FILE = "model_torch.encodings"  # AIMET's module-keyed file, written by sim.export beside the ONNX
QUANTA_ENCODINGS_FILE = "quantsim.encodings.json"
WEIGHTS_FILE = "model.safetensors"
DEFAULT_BATCH_SIZE = 32


@dataclass(frozen=True)
class QuantizeConfig:
    """Settings of ``quanta quantize`` (the CLI's flags default to these).

    ``batch_size`` None means :data:`DEFAULT_BATCH_SIZE`, or the batch size a ``torch.export`` program
    was exported with when its batch dimension is static. ``num_batches`` None: every batch.
    """

    scheme: QuantScheme = QuantScheme.MIN_MAX
    param_bw: int = 8
    output_bw: int = 8
    encoding_version: EncodingsVersion = EncodingsVersion.V1_0_0
    config_file: Path | None = None
    model_class: str | None = None
    batch_size: int | None = None
    num_batches: int | None = None
    onnx: bool = True
    progress: bool = True
    fold_batch_norms: bool = False


# ---------------------------------------------------------------------- parsing the CLI's strings (once)
def parse_scheme(text: str) -> QuantScheme:
    """``--scheme``: a :class:`QuantScheme` from its name or an AIMET alias.

    >>> parse_scheme("tf_enhanced")
    <QuantScheme.SQNR: 'sqnr'>
    """
    try:
        return QuantScheme.parse(text)
    except ValueError:
        names = ", ".join(s.value for s in QuantScheme)
        raise ValueError(f"--scheme must be one of {names} (or an AIMET name such as post_training_tf), "
                         f"got {text!r}") from None


def parse_encoding_version(text: str) -> EncodingsVersion:
    """``--encoding-version``: ``"0.6.1"``, ``"1.0.0"`` or ``"2.0.0"``.

    >>> parse_encoding_version("2.0.0")
    <EncodingsVersion.V2_0_0: '2.0.0'>
    """
    try:
        return EncodingsVersion.parse(text)
    except ValueError:
        raise ValueError(f"--encoding-version must be one of {', '.join(v.value for v in EncodingsVersion)}, "
                         f"got {text!r}") from None


def parse_bitwidth(text: str) -> int:
    """``--param-bw`` / ``--output-bw``: an integer in [1, 32].

    >>> parse_bitwidth("4")
    4
    """
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a bitwidth (an integer in [1, 32]), got {text!r}") from None
    if not 1 <= value <= 32:
        raise ValueError(f"expected a bitwidth in [1, 32], got {value}")
    return value


# ---------------------------------------------------------------------- the job
@dataclass
class QuantizeResult:
    """What :func:`quantize_model` did (printed by :func:`format_summary`)."""

    out_dir: Path
    model_kind: str
    quantized_layers: list[tuple[str, str]]  # (name, type)
    unquantized_modules: list[str]
    float_ops: list[str]
    param_quantizers: int
    activation_quantizers: int
    num_batches: int
    batch_shape: tuple[Any, ...]  # ints; for several inputs, one shape per input
    sqnr_db: float
    files: dict[str, int]  # file name -> bytes
    notes: list[str] = field(default_factory=list)
    rebuilt: int = 0  # torch.export program: module calls rebuilt from its aten calls


def _run(model: nn.Module, x: Batch, what: str, arg: str = "--calib") -> Any:
    try:
        with torch.no_grad():
            return call_model(model, x)
    except Exception as e:  # noqa: BLE001  (shape/dtype mismatch between DATA and MODEL)
        dtypes = ", ".join(str(t.dtype).removeprefix("torch.") for t in as_inputs(x))
        raise ValueError(f"the model rejects {what} of {format_batch_shape(batch_shape(x))} and "
                         f"dtype{'s' if isinstance(x, tuple) else ''} {dtypes} from {arg}: {first_line(e)}") from None


def load_quantsim_config(path: str | os.PathLike | None) -> Any:
    """``--config``: the :class:`~quanta.quantsim.QuantSimConfig` in ``path`` (None: None, the built-in default)."""
    from quanta.quantsim import QuantSimConfig

    if path is None:
        return None
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--config file not found: {path}")
    try:
        return QuantSimConfig.load(path)
    except ValueError as e:  # names the file and the key
        raise ValueError(f"--config {first_line(e)}") from None


@dataclass
class ModelAndBatches:
    """A loaded float model and its data split into batches (:func:`prepare_model_and_batches`).

    Attributes:
        loaded: the model (a torch.export program's aten calls already rebuilt as modules).
        batches: the calibration batches (the first ``num_batches``); ``batches[0]`` is the dummy input. A
            batch is a tensor, or a tuple of tensors (the forward's positional inputs) for several inputs.
        eval_batches: with ``evaluate``, every batch of the evaluation data (``eval_path``, or all of the
            calibration data when there is none); else ``batches``.
        batch_size: the batch size used.
        notes: what was adapted (dtype casts, dropped last batches), one line each.
    """

    loaded: LoadedModel
    batches: list[Batch]
    eval_batches: list[Batch]
    batch_size: int
    notes: list[str] = field(default_factory=list)
    input_names: list[str] = field(default_factory=list)


def prepare_model_and_batches(model_path: str | os.PathLike, data_path: str | os.PathLike, *,
                              model_class: str | None = None, batch_size: int | None = None,
                              num_batches: int | None = None, evaluate: bool = False,
                              eval_path: str | os.PathLike | None = None, data_arg: str = "--calib",
                              eval_arg: str = "--eval") -> ModelAndBatches:
    """Load the data and the model as ``quanta quantize`` does and split the data into batches.

    ``batch_size`` None: :data:`DEFAULT_BATCH_SIZE`, or the static batch size of a ``torch.export`` program
    (whose last, smaller batch is then dropped); a program's static input shape is checked against the data.
    Floating-point data is cast to the model's dtype. The model is run on the first and the last batch
    of each data set so that data that does not fit fails here, naming ``data_arg`` / ``eval_arg``.
    ``evaluate``: also split the evaluation data (``eval_path``, else all of ``data_path``) into
    ``eval_batches``; otherwise ``eval_batches`` is ``batches``.
    """
    raw = read_data(data_path, data_arg)
    raw_eval = read_data(eval_path, eval_arg) if evaluate and eval_path is not None else None
    loaded = load_model(model_path, model_class)
    names = forward_names(loaded.model)
    data = resolve_data(raw, os.fspath(data_path), data_arg, names)
    eval_data = resolve_data(raw_eval, os.fspath(eval_path), eval_arg, names) if raw_eval is not None else None
    n_inputs = len(as_inputs(data))
    if eval_data is not None and len(as_inputs(eval_data)) != n_inputs:
        raise ValueError(f"{eval_arg} {eval_path} holds {len(as_inputs(eval_data))} input(s) but {data_arg} holds "
                         f"{n_inputs}: give both the same inputs of the model")
    if loaded.kind == "export" and len(loaded.input_shapes) != n_inputs:
        raise ValueError(f"{data_arg} {data_path} holds {n_inputs} input(s) but the torch.export program takes "
                         f"{len(loaded.input_shapes)} ({shortlist(names, limit=5)}): pass one tensor per input, "
                         "as a tuple or a dict keyed by these names in a .pt file")
    dtype = next((p.dtype for p in loaded.model.parameters() if p.is_floating_point()), torch.float32)
    notes: list[str] = []

    def cast(x: Batch, arg: str) -> Batch:
        out = []
        for t in as_inputs(x):
            if t.is_floating_point() and t.dtype != dtype:
                what = "calibration" if arg == "--calib" else arg
                note = (f"{what} data cast from {str(t.dtype).removeprefix('torch.')} to "
                        f"{str(dtype).removeprefix('torch.')}")
                if note not in notes:
                    notes.append(note)
                t = t.to(dtype)
            out.append(t)
        return tuple(out) if isinstance(x, tuple) else out[0]

    data = cast(data, data_arg)
    if eval_data is not None:
        eval_data = cast(eval_data, eval_arg)

    statics = loaded.input_shapes if loaded.kind == "export" else []
    static_batch = None
    if statics:
        for x, arg in ((data, data_arg), (eval_data, eval_arg)):
            if x is None:
                continue
            for i, (t, static) in enumerate(zip(as_inputs(x), statics)):
                if static is not None and (len(static) != t.dim() or any(
                        s is not None and s != d for s, d in zip(static[1:], t.shape[1:]))):
                    shown = tuple("?" if s is None else s for s in static)
                    which = "" if n_inputs == 1 else f" input {i}" + (f" ({names[i]})" if i < len(names) else "")
                    raise ValueError(f"{arg}{which} samples have shape {tuple(t.shape[1:])} but the torch.export "
                                     f"program takes input of shape {shown}: the data does not fit the model")
        static_batch = next((s[0] for s in statics if s is not None and s[0] is not None), None)
        if static_batch is not None:
            if batch_size is not None and batch_size != static_batch:
                raise ValueError(f"the torch.export program was exported with a static batch size of {static_batch}: "
                                 f"pass --batch-size {static_batch} (or re-export with a dynamic batch dimension, "
                                 "torch.export.Dim)")
            batch_size = static_batch
            for x, arg in ((data, data_arg), (eval_data, eval_arg)):
                if x is not None and num_rows(x) < batch_size:
                    raise ValueError(f"{arg} has {num_rows(x)} samples, fewer than the torch.export program's static "
                                     f"batch size {batch_size}")
    batch_size = batch_size or DEFAULT_BATCH_SIZE
    fixed = static_batch is not None

    def split(x: Batch, limit: int | None, what: str) -> list[Batch]:
        batches = split_batches(x, batch_size, limit)
        if fixed and num_rows(batches[-1]) != batch_size:
            notes.append(f"last {what}batch of {num_rows(batches[-1])} samples dropped (the program's batch size "
                         "is static)")
            batches = batches[:-1]
        return batches

    batches = split(data, num_batches, "")
    if eval_data is not None:
        eval_batches = split(eval_data, None, f"{eval_arg} ")
    elif evaluate and num_batches is not None:
        eval_batches = split(data, None, "evaluation ")
    else:
        eval_batches = batches
    dummy = batches[0]

    model = loaded.model
    if loaded.kind == "export":
        _run(model, dummy, "calibration batches", data_arg)
        model = loaded.model = lift_program(model, dummy)
        loaded.rebuilt = sum(1 for n in model.graph.nodes if n.op == "call_module")
    _run(model, dummy, "calibration batches", data_arg)
    if len(batches) > 1 and batch_shape(batches[-1]) != batch_shape(dummy):
        _run(model, batches[-1], "the last (smaller) calibration batch", data_arg)
    if eval_data is not None:
        _run(model, eval_batches[0], "evaluation batches", eval_arg)
        if len(eval_batches) > 1 and batch_shape(eval_batches[-1]) != batch_shape(eval_batches[0]):
            _run(model, eval_batches[-1], "the last (smaller) evaluation batch", eval_arg)
    elif eval_batches is not batches and batch_shape(eval_batches[-1]) != batch_shape(dummy):
        _run(model, eval_batches[-1], "the last (smaller) batch", data_arg)
    return ModelAndBatches(loaded, batches, eval_batches, batch_size, notes, names[:n_inputs])


def quantize_model(model_path: str | os.PathLike, calib_path: str | os.PathLike, out_dir: str | os.PathLike,
                   cfg: QuantizeConfig = QuantizeConfig(), *, log: Callable[[str], None] = print) -> QuantizeResult:
    """Load, calibrate, write (see the module docstring); ``log`` gets notes and warnings, one line each, once
    everything is written (a failed run raises and logs nothing)."""
    from quanta.quantsim import QuantizationSimModel

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a directory")
    config = load_quantsim_config(cfg.config_file)
    prepared = prepare_model_and_batches(model_path, calib_path, model_class=cfg.model_class,
                                         batch_size=cfg.batch_size, num_batches=cfg.num_batches)
    loaded, batches, dummy, model = prepared.loaded, prepared.batches, prepared.batches[0], prepared.loaded.model
    notes: list[str] = list(prepared.notes)
    warned: list[warnings.WarningMessage] = []  # logged at the end: a failed run prints only its error
    reference = flat_outputs(_run(model, dummy, "calibration batches"))
    if cfg.fold_batch_norms:
        from quanta.quantsim import fold_all_batch_norms

        try:
            pairs = fold_all_batch_norms(model, dummy_input=dummy)
        except TypeError as e:  # the model cannot be traced: nothing was folded
            raise ValueError(f"--fold-bn: {first_line(e)}") from None
        notes.append(f"folded {len(pairs)} BatchNorm layer(s) into the Conv/Linear layers next to them" if pairs
                     else "--fold-bn: no BatchNorm could be folded (none follows or precedes a Conv/Linear alone)")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            sim = QuantizationSimModel(model, dummy, quant_scheme=cfg.scheme, default_param_bw=cfg.param_bw,
                                       default_output_bw=cfg.output_bw, config_file=config)
        except ValueError as e:
            where = f"--config {cfg.config_file} does not fit the model" if config is not None else \
                "QuantizationSimModel"
            raise ValueError(f"{where}: {first_line(e)}") from None
    warned.extend(caught)
    quantized = [(name, type(m).__name__) for name, m in sim.quantized_modules()
                 if any(q is not None for q in [*m.input_quantizers, *m.output_quantizers,
                                                 *m.param_quantizers.values()])]
    if not quantized:
        hint = ""
        if loaded.kind == "export" and sim.float_ops:
            hint = (f"; its ops {shortlist(sorted(sim.float_ops), limit=5)} have no quantized counterpart quanta "
                    "can rebuild from a torch.export program: pass the state dict with --model-class instead")
        raise ValueError(f"QuantizationSimModel found nothing to quantize in MODEL {model_path}{hint}")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sim.compute_encodings(batches, progress=cfg.progress)
    warned.extend(caught)
    with torch.no_grad():
        sim.model.eval()
        sqnr = sqnr_db(reference, flat_outputs(call_model(sim.model, dummy)))

    version = cfg.encoding_version.value
    _check_version(sim, cfg.encoding_version)  # before anything is written
    out.mkdir(parents=True, exist_ok=True)
    written: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if cfg.onnx:
            try:
                sim.export(out, "model", dummy, encoding_version=version)
            except ImportError as e:
                raise ImportError(f"{first_line(e)}; or pass --no-onnx to write only the encodings") from None
            written += [ONNX_FILE, ENCODINGS_FILE, TORCH_ENCODINGS_FILE]
        else:
            sim.save_encodings(out / ENCODINGS_FILE, version=version)
            written.append(ENCODINGS_FILE)
    warned.extend(caught)
    sim.save_encodings(out / QUANTA_ENCODINGS_FILE)
    written.append(QUANTA_ENCODINGS_FILE)
    save_fake_quantized_weights(sim, out / WEIGHTS_FILE)
    written.append(WEIGHTS_FILE)

    named = dict(sim.named_quantizers())
    n_param = sum(1 for n in named if ".param_quantizers." in n)
    for note in notes:
        log(f"note: {note}")
    _log_warnings(warned, log)
    return QuantizeResult(out, loaded.kind, quantized, list(sim.unquantized_modules), list(sim.float_ops), n_param,
                          len(named) - n_param, len(batches), batch_shape(dummy), sqnr,
                          {f: (out / f).stat().st_size for f in written}, notes, loaded.rebuilt)


def _check_version(sim: Any, version: EncodingsVersion) -> None:
    from quanta.export.encodings import encodings_to_dict
    from quanta.export.sim_encodings import sim_encodings

    try:
        encodings_to_dict(*sim_encodings(sim), version)
    except ValueError as e:
        raise ValueError(f"--encoding-version {version.value} cannot hold these encodings: {first_line(e)}") from None


def _log_warnings(caught: list[warnings.WarningMessage], log: Callable[[str], None]) -> None:
    seen = set()
    for w in caught:
        if issubclass(w.category, (DeprecationWarning, FutureWarning)):
            continue
        text = " ".join(str(w.message).split())
        if text not in seen:
            seen.add(text)
            log(f"warning: {text}")


# ---------------------------------------------------------------------- report
def format_summary(result: QuantizeResult) -> str:
    """Human-readable summary of a :class:`QuantizeResult`."""
    kinds: dict[str, int] = {}
    for _, t in result.quantized_layers:
        kinds[t] = kinds.get(t, 0) + 1
    lines = [f"quantized {len(result.quantized_layers)} layers: "
             + ", ".join(f"{n} {k.removeprefix('Quantized')}" for k, n in kinds.items()),
             f"quantizers: {result.param_quantizers} parameter, {result.activation_quantizers} activation"]
    if result.unquantized_modules or result.float_ops:
        lines.append(f"kept in float: modules {shortlist(result.unquantized_modules, limit=5)}; "
                     f"ops {shortlist(result.float_ops, limit=5)}")
    if result.model_kind == "export":
        lines.append(f"torch.export program: rebuilt {result.rebuilt} module calls from its aten calls")
    lines.append(f"calibrated on {result.num_batches} batches of {format_batch_shape(result.batch_shape)}")
    sq = "inf (identical)" if math.isinf(result.sqnr_db) else f"{result.sqnr_db:.1f} dB"
    lines.append(f"output SQNR (sim vs float, first batch): {sq}")
    lines.append(f"files written to {result.out_dir}:")
    for name, size in result.files.items():
        lines.append(f"  {name:<26} {size:>12,} bytes")
    return "\n".join(lines)
