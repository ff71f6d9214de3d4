"""Reading the model file of ``quanta quantize`` and ``quanta bench`` into a float ``nn.Module``.

The model is one of:

* a ``torch.export`` program (``torch.export.save``, usually ``.pt2``): loaded with ``torch.export.load``;
  the aten calls of its ``.module()`` (``aten.linear``, ``aten.conv2d``, ``aten.relu``, ...) are turned
  back into ``torch.nn`` modules (:func:`quanta.quantsim.capture.lift_exported`, the sim's own capture
  code), so that BatchNorm folding sees them;
* a state dict (``torch.save(model.state_dict())``, ``.pt``/``.pth``), loaded with
  ``torch.load(weights_only=True)``, with ``model_class="pkg.module:ClassName"``: imported, built
  without arguments and loaded with ``load_state_dict(strict=True)``.

A TorchScript file, or a file holding pickled Python objects, is refused with the fix in the message.
"""

from __future__ import annotations

import importlib
import json
import os
import warnings
import zipfile
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from quanta._text import shortlist
from quanta.tools._errors import first_line
from quanta.tools.measure import Batch, call_model

__all__ = ["LoadedModel", "archive_kind", "check_model_class", "lift_program", "load_model", "parse_model_class",
           "refused_global", "zip_names"]


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


def zip_names(path: str) -> list[str] | None:
    """The member names of the zip archive ``path`` (torch.save and torch.export write zips), or None."""
    if not zipfile.is_zipfile(path):
        return None
    try:
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    except (zipfile.BadZipFile, OSError):
        return None


def archive_kind(names: list[str]) -> str:
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

    A torch.export program comes as its ``.module()`` (aten calls);
    :func:`~quanta.tools.quantize_model.prepare_model_and_batches` then rebuilds modules from it with
    :func:`lift_program`.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"MODEL not found: {path}")
    if os.path.isdir(path):
        raise ValueError(f"MODEL {path} is a directory; pass a .pt2 (torch.export) or .pt (state dict) file")
    names = zip_names(path)
    kind = archive_kind(names) if names is not None else "unknown"
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
        raise ValueError(f"MODEL {path} holds pickled Python objects{refused_global(e)}, which quanta does not "
                         "unpickle (torch.load(weights_only=True)): save model.state_dict() and pass --model-class, "
                         "or save a torch.export program") from None
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


def refused_global(e: BaseException) -> str:
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
        raise ValueError(f"--model-class {spec}: cannot import {module_name!r} ({first_line(e)}); put its "
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
                         f"({first_line(e)}); give its __init__ defaults or wrap it in a class that does") from None
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
            parts.append(f"missing keys {shortlist(missing, limit=5)}")
        if unexpected:
            parts.append(f"unexpected keys {shortlist(unexpected, limit=5)}")
        if wrong:
            parts.append(f"shape mismatch (file vs model) {shortlist(wrong, limit=5)}")
        raise ValueError(f"MODEL {path} does not fit --model-class {spec}: {'; '.join(parts)}")
    model.load_state_dict(state, strict=True)


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
        raise ValueError(f"MODEL {path} could not be read as a torch.export program: {first_line(e)}") from None
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


def lift_program(gm: fx.GraphModule, example: Batch) -> fx.GraphModule:
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
