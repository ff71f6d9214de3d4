"""``quanta quantize``: calibrate a saved model with QuantizationSimModel and write what deployment needs.

Reads a model and calibration data from files, builds a
:class:`~quanta.quantsim.QuantizationSimModel`, calibrates it with
``compute_encodings`` and writes into the output directory:

* ``model.onnx`` + ``model.encodings``: :meth:`QuantizationSimModel.export` (QDQ graph and AIMET
  encodings of the chosen version); without ONNX only ``model.encodings`` (``save_encodings(path, version)``);
* ``quantsim.encodings.json``: quanta's lossless encodings (``save_encodings(path)``), which
  :meth:`QuantizationSimModel.load_encodings` reads back bit for bit;
* ``model.safetensors``: the model's state dict with every quantized parameter replaced by its
  fake-quantized value (float, on the quantization grid), and a ``"quanta.encodings"`` metadata entry
  (JSON) giving each such parameter's encoding: scale, offset, grid, granularity. No pickle.

The model is one of:

* a ``torch.export`` program (``torch.export.save``, usually ``.pt2``): loaded with ``torch.export.load``;
  the aten calls of its ``.module()`` (``aten.linear``, ``aten.conv2d``, ``aten.relu``, ...) are turned
  back into ``torch.nn`` modules (:func:`quanta.quantsim.capture.lift_exported`, the sim's own capture
  code), so that BatchNorm folding sees them;
* a state dict (``torch.save(model.state_dict())``, ``.pt``/``.pth``), loaded with
  ``torch.load(weights_only=True)``, with ``model_class="pkg.module:ClassName"``: imported, built
  without arguments and loaded with ``load_state_dict(strict=True)``.

A TorchScript file, or a file holding pickled Python objects, is refused with the fix in the message.
The calibration data is a tensor in a ``.pt`` file (or a dict with an ``"x"`` or ``"inputs"`` tensor),
or a ``.npy`` file (``numpy.load(allow_pickle=False)``), split along dim 0 into batches; the first
batch is the dummy input. A model with several inputs (``model(input_ids, attention_mask)``) takes a ``.pt``
file holding a tuple/list of tensors (its positional inputs, in order) or a dict of tensors keyed by its
forward's parameter names (a torch.export program's input names), passed in the forward's order; every
input needs the same size along dim 0, and each batch is then a tuple split alike (``model(*batch)``;
floating-point inputs are cast to the model's dtype, integer ones such as token ids kept). Errors in the inputs are ValueError / FileNotFoundError naming the argument
and the fix (the CLI prints them as one line, exit status 2).

>>> cfg = QuantizeConfig(progress=False)
>>> result = quantize_model("model.pt2", "calib.npy", "out", cfg)          # doctest: +SKIP
>>> print(format_summary(result))                                         # doctest: +SKIP
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import os
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx, nn

from quanta._text import shortlist
from quanta.export.encodings import EncodingsVersion
from quanta.quantsim.scheme import QuantScheme
from quanta.tools.measure import (
    Batch,
    batch_shape,
    call_model,
    flat_outputs,
    format_batch_shape,
    sqnr_db,
)

__all__ = [
    "LoadedModel",
    "ModelAndBatches",
    "QuantizeConfig",
    "QuantizeResult",
    "check_model_class",
    "format_summary",
    "load_calibration",
    "load_model",
    "load_quantsim_config",
    "parse_bitwidth",
    "parse_encoding_version",
    "parse_model_class",
    "parse_scheme",
    "prepare_model_and_batches",
    "quantize_model",
]

#: File names written into the output directory.
ONNX_FILE = "model.onnx"
ENCODINGS_FILE = "model.encodings"
QUANTA_ENCODINGS_FILE = "quantsim.encodings.json"
WEIGHTS_FILE = "model.safetensors"
#: safetensors metadata key of the weights' encodings (JSON).
WEIGHTS_METADATA_KEY = "quanta.encodings"
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


def parse_model_class(text: str) -> tuple[str, str]:
    """``--model-class``: ``"pkg.module:ClassName"`` → ``("pkg.module", "ClassName")`` (not imported yet).

    >>> parse_model_class("mypkg.nets:TinyNet")
    ('mypkg.nets', 'TinyNet')
    """
    module, sep, name = text.partition(":")
    ok = sep and module and name and all(p.isidentifier() for p in module.split(".")) and \
        all(p.isidentifier() for p in name.split("."))
    if not ok:
        raise ValueError(f"--model-class must look like pkg.module:ClassName, got {text!r}")
    return module, name


def check_model_class(text: str) -> str:
    """``--model-class``: ``text`` itself once :func:`parse_model_class` accepts its form (imported later)."""
    parse_model_class(text)
    return text


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


# ---------------------------------------------------------------------- model files
@dataclass
class LoadedModel:
    """A float model ready for QuantizationSimModel.

    Attributes:
        model: the module (eval mode; a torch.export program's ``.module()`` is in the mode it was exported in).
        kind: ``"export"`` (a torch.export program) or ``"state_dict"``.
        input_shape: the input shape a torch.export program was exported with (ints; None for a
            dynamic dimension), or None; its first input's for a program with several inputs.
        input_shapes: a torch.export program's input shapes, one per input (None for an input that is not a
            tensor); empty for a state dict.
        rebuilt: for a torch.export program, how many module calls were rebuilt from its aten calls.
    """

    model: nn.Module
    kind: str
    input_shape: tuple[int | None, ...] | None = None
    input_shapes: list[tuple[int | None, ...] | None] = field(default_factory=list)
    rebuilt: int = 0


def _zip_names(path: str) -> list[str] | None:
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except (zipfile.BadZipFile, OSError):
        return None


def _archive_kind(names: list[str]) -> str:
    """``"export"``, ``"torchscript"`` or ``"torch_save"`` from a torch zip archive's member names."""
    tails = {n.split("/", 1)[1] if "/" in n else n for n in names}
    if "archive_format" in tails or any(t.startswith("models/") and t.endswith(".json") for t in tails):
        return "export"
    if "constants.pkl" in tails or any(t.startswith("code/") for t in tails):
        return "torchscript"
    if "data.pkl" in tails:
        return "torch_save"
    return "unknown"


_TORCHSCRIPT = ("MODEL {path} is a TorchScript module; TorchScript modules cannot be re-quantized (quanta "
                "quantizes Python nn.Modules): save a torch.export program instead "
                "(torch.export.save(torch.export.export(model, (x,)), 'model.pt2')), or the state dict with "
                "--model-class")


def load_model(path: str | os.PathLike, model_class: str | None = None) -> LoadedModel:
    """The float model in ``path`` (see the module docstring), in eval mode.

    A torch.export program comes as its ``.module()`` (aten calls); :func:`prepare_model_and_batches` then
    rebuilds modules from it with ``_lift_exported``.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"MODEL not found: {path}")
    if os.path.isdir(path):
        raise ValueError(f"MODEL {path} is a directory; pass a .pt2 (torch.export) or .pt (state dict) file")
    names = _zip_names(path)
    kind = _archive_kind(names) if names is not None else "unknown"
    if kind == "torchscript":
        raise ValueError(_TORCHSCRIPT.format(path=path))
    if kind == "export":
        if model_class is not None:
            raise ValueError(f"--model-class is for state dicts, but MODEL {path} is a torch.export program "
                             "(it holds its own graph): drop --model-class")
        return _load_exported(path)
    not_a_model = ValueError(f"MODEL {path} is not a torch.export program (.pt2) nor a state dict saved with "
                             "torch.save (.pt/.pth)")
    if kind != "torch_save" and (names is not None or not _maybe_legacy_torch_save(path)):
        raise not_a_model
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (UnpicklingError and friends: refuse without running anything)
        raise ValueError(f"MODEL {path} holds pickled Python objects{_pickled(e)}, which quanta does not unpickle "
                         "(torch.load(weights_only=True)): save model.state_dict() and pass --model-class, or save "
                         "a torch.export program") from None
    state = _state_dict_of(obj, path)
    if model_class is None:
        raise ValueError(f"MODEL {path} is a state dict: pass --model-class pkg.module:ClassName (the nn.Module "
                         "class to load it into, importable and buildable without arguments)")
    model = _build_model(model_class)
    _load_state(model, state, model_class, path)
    return LoadedModel(model.eval(), "state_dict")


def _maybe_legacy_torch_save(path: str) -> bool:
    """Whether ``path`` starts like a pickle (torch.save's pre-1.6 format, ``_use_new_zipfile_serialization=False``)."""
    with open(path, "rb") as f:
        return f.read(1) == b"\x80"


def _pickled(e: BaseException) -> str:
    """`` (<class>)`` when torch's weights-only error names the global it refused, else ``""``."""
    import re

    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
    return f" ({found.group(1)})" if found else ""


def _state_dict_of(obj: Any, path: str) -> dict[str, torch.Tensor]:
    if isinstance(obj, dict) and not any(isinstance(v, torch.Tensor) for v in obj.values()):
        for key in ("state_dict", "model_state_dict", "model"):  # common checkpoint layouts
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    # an empty dict is the state dict of a model without parameters or buffers
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                            for k, v in obj.items()):
        raise ValueError(f"MODEL {path} does not hold a state dict (a dict of names to tensors), got "
                         f"{type(obj).__name__}: save model.state_dict()")
    return obj


def _build_model(spec: str) -> nn.Module:
    module_name, class_name = parse_model_class(spec)
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"--model-class {spec}: cannot import {module_name!r} ({_first_line(e)}); put its "
                         "directory on PYTHONPATH") from None
    obj: Any = module
    for part in class_name.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"--model-class {spec}: module {module_name!r} has no attribute {class_name!r}")
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, nn.Module)):
        raise ValueError(f"--model-class {spec}: {class_name} is not an nn.Module subclass "
                         f"(got {type(obj).__name__})")
    try:
        model = obj()
    except TypeError as e:
        raise ValueError(f"--model-class {spec}: {class_name}() cannot be built without arguments "
                         f"({_first_line(e)}); give its __init__ defaults or wrap it in a class that does") from None
    return model


def _load_state(model: nn.Module, state: dict[str, torch.Tensor], spec: str, path: str) -> None:
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    wrong = [f"{k} {tuple(state[k].shape)} vs {tuple(own[k].shape)}" for k in own
             if k in state and state[k].shape != own[k].shape]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"missing keys {_shortlist(missing)}")
        if unexpected:
            parts.append(f"unexpected keys {_shortlist(unexpected)}")
        if wrong:
            parts.append(f"shape mismatch (file vs model) {_shortlist(wrong)}")
        raise ValueError(f"MODEL {path} does not fit --model-class {spec}: {'; '.join(parts)}")
    model.load_state_dict(state, strict=True)


def _shortlist(names: list[str]) -> str:
    return shortlist(names, limit=5)



def _check_export_archive(path: str) -> None:
    """Refuse a ``.pt2`` archive holding pickles that ``torch.load(weights_only=True)`` cannot read.

    ``torch.export.load`` unpickles some payloads with ``weights_only=False`` (sample inputs after a failed
    weights-only attempt, ``use_pickle`` weights and constants, opaque objects), which can run code. Every
    such payload is checked first with the weights-only unpickler (which allows only tensors and plain
    containers); custom and opaque objects are refused outright.
    """
    import io

    def refuse(member: str) -> ValueError:
        return ValueError(f"MODEL {path}: the torch.export program holds pickled Python objects ({member}) that "
                          "torch.export.load would unpickle; quanta loads only plain tensors: re-export without "
                          "custom objects, or pass the state dict with --model-class")

    with zipfile.ZipFile(path) as z:
        members = {(n.split("/", 1)[1] if "/" in n else n): n for n in z.namelist() if not n.endswith("/")}
        raw: set[str] = set()  # tensor payloads stored as bytes, not pickles
        for tail, full in members.items():
            if tail.startswith(("data/weights/", "data/constants/")) and tail.endswith("_config.json"):
                try:
                    config = json.loads(z.read(full)).get("config") or {}
                except (ValueError, AttributeError):
                    raise ValueError(f"MODEL {path}: {tail} is not valid JSON; not a torch.export program") from None
                base = tail.rsplit("/", 1)[0] + "/"
                for entry in config.values():
                    name = str(entry.get("path_name", "")) if isinstance(entry, dict) else ""
                    if name.startswith(("custom_obj_", "opaque_obj_")):
                        raise refuse(base + name)
                    if isinstance(entry, dict) and not entry.get("use_pickle"):
                        raw.add(base + name)
        for tail, full in members.items():
            if tail in raw or tail.endswith(".json"):
                continue
            with z.open(full) as f:
                head = f.read(2)
            if head[:2] == b"PK" or head[:1] == b"\x80":  # a torch.save archive or a bare pickle
                try:
                    torch.load(io.BytesIO(z.read(full)), map_location="cpu", weights_only=True)
                except Exception:  # noqa: BLE001
                    raise refuse(tail) from None


def _load_exported(path: str) -> LoadedModel:
    _check_export_archive(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.export.load(path)
    except Exception as e:  # noqa: BLE001  (a corrupt or foreign archive)
        raise ValueError(f"MODEL {path} could not be read as a torch.export program: {_first_line(e)}") from None
    user_inputs = [s for s in program.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    if not user_inputs:
        raise ValueError(f"MODEL {path}: the torch.export program takes no input; quanta quantize feeds it the "
                         "calibration DATA")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm = program.module()
    shapes: list[tuple[int | None, ...] | None] = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            shapes.append(tuple(int(d) if isinstance(d, int) else None for d in val.shape)
                          if isinstance(val, torch.Tensor) else None)
    # its eval() raises; it was exported in the mode it runs in
    return LoadedModel(gm, "export", shapes[0] if shapes else None, shapes)


# ---------------------------------------------------------------------- torch.export programs
def _same_outputs(a: Any, b: Any) -> bool:
    """Same structure and bit-identical tensors (NaN equal to NaN at the same place)."""
    la, lb = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    return len(la) == len(lb) and all(
        (torch.equal(x, y) or (x.shape == y.shape and x.dtype == y.dtype and torch.equal(x.isnan(), y.isnan())
                               and torch.equal(torch.nan_to_num(x), torch.nan_to_num(y))))
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else x == y for x, y in zip(la, lb))


def _lift_exported(gm: fx.GraphModule, example: Batch) -> fx.GraphModule:
    """``gm`` (a torch.export program's ``.module()``) with its module calls rebuilt as ``torch.nn`` modules
    (:func:`quanta.quantsim.capture.lift_exported`), after checking that the program is deterministic."""
    from quanta.quantsim.capture import lift_exported

    with torch.no_grad():
        reference = call_model(gm, example)
        again = call_model(gm, example)
    if not _same_outputs(reference, again):
        raise ValueError("the torch.export program gives different outputs on two runs with the same input "
                         "(dropout or other randomness exported in training mode?): call model.eval() before "
                         "torch.export.export")
    args = example if isinstance(example, tuple) else (example,)
    return lift_exported(gm, args)


# ---------------------------------------------------------------------- calibration data
def load_calibration(path: str | os.PathLike, arg: str = "--calib",
                     input_names: list[str] | None = None) -> Batch:
    """The calibration inputs in ``path``: ``.npy`` (no pickle) or ``.pt`` (loaded with
    ``torch.load(weights_only=True)``); the format is told by content. Error messages name the file as ``arg``
    (the CLI flag it came from).

    A ``.pt`` file holds a tensor; a tuple/list of tensors (the model's positional inputs, in order); or a
    dict of tensors whose keys are all names of the model's forward parameters (``input_names``, in the
    forward's order; passed in that order, so they must not skip a parameter), else a dict with an ``"x"``
    or ``"inputs"`` tensor. Returns a tensor for one input, a tuple of tensors for several, all with the same
    (non-zero) size along dim 0.
    """
    return _resolve_data(_read_data(path, arg), os.fspath(path), arg, input_names)


def _read_data(path: str | os.PathLike, arg: str) -> Any:
    """The raw content of a data file: a tensor, a tuple of tensors or a dict (checked by :func:`_resolve_data`)."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{arg} file not found: {path}")
    if os.path.isdir(path):
        raise ValueError(f"{arg} {path} is a directory; pass a .pt or .npy file")
    with open(path, "rb") as f:
        magic = f.read(6)
    if magic == b"\x93NUMPY":
        import numpy as np

        try:
            array = np.load(path, allow_pickle=False)
        except ValueError as e:
            raise ValueError(f"{arg} {path}: {_first_line(e)} (object arrays need pickle, which quanta does not "
                             "load; save a numeric array)") from None
        if array.dtype.kind not in "fiub":
            raise ValueError(f"{arg} {path}: a {array.dtype} array; expected numbers")
        return torch.from_numpy(np.ascontiguousarray(array))
    if zipfile.is_zipfile(path):
        names = _zip_names(path) or []
        if _archive_kind(names) != "torch_save":
            raise ValueError(f"{arg} {path} is a torch archive but not a torch.save file of a tensor")
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"{arg} {path} holds pickled Python objects{_pickled(e)}, which quanta does not "
                             "unpickle (torch.load(weights_only=True)); save a tensor") from None
        if isinstance(obj, (tuple, list)):
            if not obj or not all(isinstance(t, torch.Tensor) for t in obj):
                kinds = _shortlist([type(t).__name__ for t in obj])
                raise ValueError(f"{arg} {path}: a {type(obj).__name__} of inputs must hold tensors only, one per "
                                 f"input of the model (got {kinds or 'nothing'})")
            return tuple(obj)
        if isinstance(obj, (torch.Tensor, dict)):
            return obj
        raise ValueError(f"{arg} {path}: expected a tensor, a tuple/list of tensors or a dict of tensors, got "
                         f"{type(obj).__name__}")
    raise ValueError(f"{arg} {path}: not a .pt (torch.save) or .npy file")


def _resolve_data(obj: Any, path: str, arg: str, input_names: list[str] | None) -> Batch:
    """``obj`` (from :func:`_read_data`) as the model's inputs: one tensor, or a tuple in the forward's order."""
    labels: list[str]
    if isinstance(obj, torch.Tensor):
        inputs, labels = (obj,), ["input"]
    elif isinstance(obj, tuple):
        inputs = obj
        labels = [f"input {i}" + (f" ({input_names[i]})" if input_names and i < len(input_names) else "")
                  for i in range(len(obj))]
    else:
        inputs, labels = _dict_inputs(obj, path, arg, input_names)
    for t, label in zip(inputs, labels):
        if t.dim() == 0 or t.shape[0] == 0:
            what = "a tensor" if len(inputs) == 1 else label
            raise ValueError(f"{arg} {path}: need samples along dim 0, got {what} of shape {tuple(t.shape)}")
    sizes = [t.shape[0] for t in inputs]
    if len(set(sizes)) > 1:
        bad = next(i for i, n in enumerate(sizes) if n != sizes[0])
        raise ValueError(f"{arg} {path}: every input needs the same number of samples along dim 0, but "
                         f"{labels[bad]} has {sizes[bad]} and {labels[0]} has {sizes[0]}")
    return inputs[0] if len(inputs) == 1 else tuple(inputs)


def _dict_inputs(obj: dict[Any, Any], path: str, arg: str, input_names: list[str] | None
                 ) -> tuple[tuple[torch.Tensor, ...], list[str]]:
    keys = [str(k) for k in obj]
    names = list(input_names or [])
    if names and obj and all(isinstance(k, str) and k in names for k in obj):
        ordered = [n for n in names if n in obj]
        if ordered != names[:len(ordered)]:
            skipped = [n for n in names[:names.index(ordered[-1])] if n not in obj]
            raise ValueError(f"{arg} {path}: the dict has {_shortlist(ordered)} but not {_shortlist(skipped)}, "
                             f"which come(s) before them in the forward's parameters ({_shortlist(names)}); "
                             "the inputs are passed in that order, so add the missing ones")
        for n in ordered:
            if not isinstance(obj[n], torch.Tensor):
                raise ValueError(  # noqa: TRY004  (an input error: exit status 2 with the CLI's other ValueErrors)
                    f"{arg} {path}: the dict's {n!r} is a {type(obj[n]).__name__}, not a tensor")
        return tuple(obj[n] for n in ordered), ordered
    for key in ("x", "inputs"):
        if isinstance(obj.get(key), torch.Tensor):
            return (obj[key],), [key]
    forward = f"({_shortlist(names)})" if names else "(unknown)"
    raise ValueError(f"{arg} {path}: a dict without an 'x' or 'inputs' tensor whose keys ({_shortlist(keys)}) are "
                     f"not all names of the model's forward parameters {forward}")


def _forward_names(model: nn.Module) -> list[str]:
    """The names of ``model.forward``'s positional parameters (for a torch.export program's ``.module()``:
    the program's input names)."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover - a forward without a signature
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _as_inputs(batch: Batch) -> tuple[torch.Tensor, ...]:
    return batch if isinstance(batch, tuple) else (batch,)


def _rows(batch: Batch) -> int:
    return int(_as_inputs(batch)[0].shape[0])


def _batches(data: Batch, size: int, limit: int | None) -> list[Batch]:
    if isinstance(data, tuple):
        batches: list[Batch] = list(zip(*(torch.split(t, size, dim=0) for t in data)))
    else:
        batches = list(torch.split(data, size, dim=0))
    return batches[:limit] if limit is not None else batches


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
        dtypes = ", ".join(str(t.dtype).removeprefix("torch.") for t in _as_inputs(x))
        raise ValueError(f"the model rejects {what} of {format_batch_shape(batch_shape(x))} and "
                         f"dtype{'s' if isinstance(x, tuple) else ''} {dtypes} from {arg}: {_first_line(e)}") from None


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
        raise ValueError(f"--config {_first_line(e)}") from None


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
    raw = _read_data(data_path, data_arg)
    raw_eval = _read_data(eval_path, eval_arg) if evaluate and eval_path is not None else None
    loaded = load_model(model_path, model_class)
    names = _forward_names(loaded.model)
    data = _resolve_data(raw, os.fspath(data_path), data_arg, names)
    eval_data = _resolve_data(raw_eval, os.fspath(eval_path), eval_arg, names) if raw_eval is not None else None
    n_inputs = len(_as_inputs(data))
    if eval_data is not None and len(_as_inputs(eval_data)) != n_inputs:
        raise ValueError(f"{eval_arg} {eval_path} holds {len(_as_inputs(eval_data))} input(s) but {data_arg} holds "
                         f"{n_inputs}: give both the same inputs of the model")
    if loaded.kind == "export" and len(loaded.input_shapes) != n_inputs:
        raise ValueError(f"{data_arg} {data_path} holds {n_inputs} input(s) but the torch.export program takes "
                         f"{len(loaded.input_shapes)} ({_shortlist(names)}): pass one tensor per input, as a tuple "
                         "or a dict keyed by these names in a .pt file")
    dtype = next((p.dtype for p in loaded.model.parameters() if p.is_floating_point()), torch.float32)
    notes: list[str] = []

    def cast(x: Batch, arg: str) -> Batch:
        out = []
        for t in _as_inputs(x):
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
            for i, (t, static) in enumerate(zip(_as_inputs(x), statics)):
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
                if x is not None and _rows(x) < batch_size:
                    raise ValueError(f"{arg} has {_rows(x)} samples, fewer than the torch.export program's static "
                                     f"batch size {batch_size}")
    batch_size = batch_size or DEFAULT_BATCH_SIZE
    fixed = static_batch is not None

    def split(x: Batch, limit: int | None, what: str) -> list[Batch]:
        batches = _batches(x, batch_size, limit)
        if fixed and _rows(batches[-1]) != batch_size:
            notes.append(f"last {what}batch of {_rows(batches[-1])} samples dropped (the program's batch size "
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
        model = loaded.model = _lift_exported(model, dummy)
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
            raise ValueError(f"--fold-bn: {_first_line(e)}") from None
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
            raise ValueError(f"{where}: {_first_line(e)}") from None
    warned.extend(caught)
    quantized = [(name, type(m).__name__) for name, m in sim.quantized_modules()
                 if any(q is not None for q in [*m.input_quantizers, *m.output_quantizers,
                                                 *m.param_quantizers.values()])]
    if not quantized:
        hint = ""
        if loaded.kind == "export" and sim.float_ops:
            hint = (f"; its ops {_shortlist(sorted(sim.float_ops))} have no quantized counterpart quanta can rebuild "
                    "from a torch.export program: pass the state dict with --model-class instead")
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
                raise ImportError(f"{_first_line(e)}; or pass --no-onnx to write only the encodings") from None
            written += [ONNX_FILE, ENCODINGS_FILE]
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
        raise ValueError(f"--encoding-version {version.value} cannot hold these encodings: {_first_line(e)}") from None


def _log_warnings(caught: list[warnings.WarningMessage], log: Callable[[str], None]) -> None:
    seen = set()
    for w in caught:
        if issubclass(w.category, (DeprecationWarning, FutureWarning)):
            continue
        text = " ".join(str(w.message).split())
        if text not in seen:
            seen.add(text)
            log(f"warning: {text}")


# ---------------------------------------------------------------------- fake-quantized weights
def weight_encodings(sim: Any) -> dict[str, dict[str, Any]]:
    """``{parameter name in the state dict: its encoding}`` for every quantized parameter of ``sim``.

    Each entry is the encoding's :meth:`~quanta.encodings.affine.AffineEncoding.to_dict` (``scale``,
    ``offset``, ``shape``, ``qmin``, ``qmax``, ``block_size``; float encodings: the format's bits) plus
    ``type`` (``"affine"``/``"float"``), ``quantizer``, ``bitwidth``, ``symmetric``, ``granularity``
    (``per_tensor``/``per_channel``/``per_block``) and ``axis`` (the channel axis, or None).
    """
    from quanta.encodings.float import FloatEncoding

    out: dict[str, dict[str, Any]] = {}
    for name, module in sim.quantized_modules():
        prefix = f"{name}." if name else ""
        for pname, q in module.param_quantizers.items():
            if q is None or not q.is_initialized():
                continue
            enc = q.get_encodings()
            scale_shape = tuple(enc.scale.shape)
            channel_axes = [d for d, s in enumerate(scale_shape) if s > 1]
            entry: dict[str, Any] = {
                "quantizer": f"{prefix}param_quantizers.{pname}",
                "type": "float" if isinstance(enc, FloatEncoding) else "affine",
                "granularity": enc.granularity,
                "axis": None if enc.granularity == "per_tensor" else _channel_axis(enc.block_size, channel_axes),
            }
            if isinstance(enc, FloatEncoding):
                entry.update(bitwidth=enc.format.bits, format=enc.format.name(), symmetric=True)
            else:
                entry.update(bitwidth=enc.grid.bitwidth, symmetric=bool(getattr(q, "symmetric", False)))
            entry.update(enc.to_dict())
            out[f"{prefix}{pname}"] = entry
    return out


def _channel_axis(block_size: tuple[int, ...] | None, varying: list[int]) -> int | None:
    if block_size is not None:
        unblocked = [d for d in varying if block_size[d] in (1, -1)]
        return unblocked[0] if unblocked else None
    return varying[0] if varying else None


def save_fake_quantized_weights(sim: Any, path: str | os.PathLike) -> None:
    """Write ``sim.model``'s float state dict, quantized parameters fake-quantized, to a safetensors file.

    Quantizer state is left out, so the keys are those of the float model. The ``"quanta.encodings"``
    metadata entry holds :func:`weight_encodings` as JSON. The file is written atomically by
    :func:`quanta.dtypes.serialization.save_quantized` and loads with ``safetensors.torch.load_file``.
    """
    from quanta.dtypes.serialization import save_quantized

    quantizer_prefixes = tuple(f"{n}." for n, _ in sim.named_quantizers())
    fake: dict[str, torch.Tensor] = {}
    for name, module in sim.quantized_modules():
        prefix = f"{name}." if name else ""
        for pname, q in module.param_quantizers.items():
            if q is not None and q.is_initialized():
                with torch.no_grad():
                    fake[f"{prefix}{pname}"] = q(getattr(module, pname)).as_subclass(torch.Tensor).detach().clone()
    state: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for key, t in sim.model.state_dict(keep_vars=False).items():
        if key.startswith(quantizer_prefixes):
            continue
        t = fake.get(key, t)
        t = t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t
        if t.untyped_storage().data_ptr() in seen:  # safetensors refuses shared storage (tied weights)
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        state[key] = t.detach().contiguous()
    meta = {WEIGHTS_METADATA_KEY: json.dumps(weight_encodings(sim)), "producer": "quanta quantize"}
    save_quantized(state, path, metadata=meta)


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
        lines.append(f"kept in float: modules {_shortlist(result.unquantized_modules)}; "
                     f"ops {_shortlist(result.float_ops)}")
    if result.model_kind == "export":
        lines.append(f"torch.export program: rebuilt {result.rebuilt} module calls from its aten calls")
    lines.append(f"calibrated on {result.num_batches} batches of {format_batch_shape(result.batch_shape)}")
    sq = "inf (identical)" if math.isinf(result.sqnr_db) else f"{result.sqnr_db:.1f} dB"
    lines.append(f"output SQNR (sim vs float, first batch): {sq}")
    lines.append(f"files written to {result.out_dir}:")
    for name, size in result.files.items():
        lines.append(f"  {name:<26} {size:>12,} bytes")
    return "\n".join(lines)
