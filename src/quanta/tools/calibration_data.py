"""Reading the calibration data of ``quanta quantize`` and ``quanta bench`` and splitting it into batches.

The calibration data is a tensor in a ``.pt`` file (or a dict with an ``"x"`` or ``"inputs"`` tensor),
or a ``.npy`` file (``numpy.load(allow_pickle=False)``), split along dim 0 into batches; the first
batch is the dummy input. A model with several inputs (``model(input_ids, attention_mask)``) takes a ``.pt``
file holding a tuple/list of tensors (its positional inputs, in order) or a dict of tensors keyed by its
forward's parameter names (a torch.export program's input names), passed in the forward's order; every
input needs the same size along dim 0, and each batch is then a tuple split alike (``model(*batch)``;
floating-point inputs are cast to the model's dtype, integer ones such as token ids kept).
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

import torch
from torch import nn

from quanta._text import shortlist
from quanta.tools._errors import first_line
from quanta.tools.measure import Batch
from quanta.tools.model_files import archive_kind, refused_global, zip_names

__all__ = ["as_inputs", "forward_names", "load_calibration", "num_rows", "read_data", "resolve_data",
           "split_batches"]


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
    return resolve_data(read_data(path, arg), os.fspath(path), arg, input_names)


def read_data(path: str | os.PathLike, arg: str) -> Any:
    """The raw content of a data file: a tensor, a tuple of tensors or a dict (checked by :func:`resolve_data`)."""
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
            raise ValueError(f"{arg} {path}: {first_line(e)} (object arrays need pickle, which quanta does not "
                             "load; save a numeric array)") from None
        if array.dtype.kind not in "fiub":
            raise ValueError(f"{arg} {path}: a {array.dtype} array; expected numbers")
        return torch.from_numpy(np.ascontiguousarray(array))
    if zipfile.is_zipfile(path):
        names = zip_names(path) or []
        if archive_kind(names) != "torch_save":
            raise ValueError(f"{arg} {path} is a torch archive but not a torch.save file of a tensor")
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"{arg} {path} holds pickled Python objects{refused_global(e)}, which quanta does not "
                             "unpickle (torch.load(weights_only=True)); save a tensor") from None
        if isinstance(obj, (tuple, list)):
            if not obj or not all(isinstance(t, torch.Tensor) for t in obj):
                kinds = shortlist([type(t).__name__ for t in obj], limit=5)
                raise ValueError(f"{arg} {path}: a {type(obj).__name__} of inputs must hold tensors only, one per "
                                 f"input of the model (got {kinds or 'nothing'})")
            return tuple(obj)
        if isinstance(obj, (torch.Tensor, dict)):
            return obj
        raise ValueError(f"{arg} {path}: expected a tensor, a tuple/list of tensors or a dict of tensors, got "
                         f"{type(obj).__name__}")
    raise ValueError(f"{arg} {path}: not a .pt (torch.save) or .npy file")


def resolve_data(obj: Any, path: str, arg: str, input_names: list[str] | None) -> Batch:
    """``obj`` (from :func:`read_data`) as the model's inputs: one tensor, or a tuple in the forward's order."""
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
            raise ValueError(f"{arg} {path}: the dict has {shortlist(ordered, limit=5)} but not "
                             f"{shortlist(skipped, limit=5)}, which come(s) before them in the forward's parameters "
                             f"({shortlist(names, limit=5)}); "
                             "the inputs are passed in that order, so add the missing ones")
        for n in ordered:
            if not isinstance(obj[n], torch.Tensor):
                raise ValueError(  # noqa: TRY004  (an input error: exit status 2 with the CLI's other ValueErrors)
                    f"{arg} {path}: the dict's {n!r} is a {type(obj[n]).__name__}, not a tensor")
        return tuple(obj[n] for n in ordered), ordered
    for key in ("x", "inputs"):
        if isinstance(obj.get(key), torch.Tensor):
            return (obj[key],), [key]
    forward = f"({shortlist(names, limit=5)})" if names else "(unknown)"
    raise ValueError(f"{arg} {path}: a dict without an 'x' or 'inputs' tensor whose keys "
                     f"({shortlist(keys, limit=5)}) are not all names of the model's forward parameters {forward}")


def forward_names(model: nn.Module) -> list[str]:
    """The names of ``model.forward``'s positional parameters (for a torch.export program's ``.module()``:
    the program's input names)."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):  # pragma: no cover - a forward without a signature
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def as_inputs(batch: Batch) -> tuple[torch.Tensor, ...]:
    """A batch's inputs as a tuple (one tensor for a model with one input)."""
    return batch if isinstance(batch, tuple) else (batch,)


def num_rows(batch: Batch) -> int:
    """How many samples a batch holds (its inputs' common size along dim 0)."""
    return int(as_inputs(batch)[0].shape[0])


def split_batches(data: Batch, size: int, limit: int | None) -> list[Batch]:
    """``data`` split along dim 0 into batches of ``size`` (the last one smaller), the first ``limit`` of them."""
    if isinstance(data, tuple):
        batches: list[Batch] = list(zip(*(torch.split(t, size, dim=0) for t in data)))
    else:
        batches = list(torch.split(data, size, dim=0))
    return batches[:limit] if limit is not None else batches

