"""pytorch_quantization's ``quant_modules``: make ``torch.nn``'s layers build their quantized counterparts.

``initialize()`` replaces ``torch.nn.Linear``, ``Conv1d/2d/3d``, ``ConvTranspose1d/2d/3d``, ``MaxPool``,
``AvgPool`` and ``AdaptiveAvgPool 1d/2d/3d`` in the ``torch.nn`` namespace by the classes of
:mod:`quanta.tensor_quant.nn`, so that any model built afterwards (``torchvision.models.resnet50()``, your
own) has quantized layers; ``deactivate()`` puts the float classes back. As in pytorch_quantization this
changes the ``torch.nn`` module for the whole process (other threads building models meanwhile see it too),
and only code that looks the class up at build time (``nn.Linear(...)``, not a class imported before) is
affected. ``initialize()`` also works as a context manager that deactivates on exit:

>>> import torch
>>> from quanta.tensor_quant import quant_modules
>>> with quant_modules.initialize():
...     layer = torch.nn.Linear(4, 2)
>>> type(layer).__name__, torch.nn.Linear.__name__
('QuantLinear', 'Linear')

``float_module_list`` names the classes to leave alone (``["Linear"]``); ``custom_quant_modules`` adds
``(module, "Name", QuantClass)`` replacements.
"""

from __future__ import annotations

import threading
from types import ModuleType, TracebackType
from typing import Iterable, Optional

import torch

from quanta.tensor_quant import nn as quant_nn

__all__ = ["initialize", "deactivate", "QuantModuleReplacementHelper"]

_DEFAULT_QUANT_MAP: list[tuple[ModuleType, str, type]] = [
    (torch.nn, "Conv1d", quant_nn.QuantConv1d),
    (torch.nn, "Conv2d", quant_nn.QuantConv2d),
    (torch.nn, "Conv3d", quant_nn.QuantConv3d),
    (torch.nn, "ConvTranspose1d", quant_nn.QuantConvTranspose1d),
    (torch.nn, "ConvTranspose2d", quant_nn.QuantConvTranspose2d),
    (torch.nn, "ConvTranspose3d", quant_nn.QuantConvTranspose3d),
    (torch.nn, "Linear", quant_nn.QuantLinear),
    (torch.nn, "LSTM", quant_nn.QuantLSTM),
    (torch.nn, "LSTMCell", quant_nn.QuantLSTMCell),
    (torch.nn, "MaxPool1d", quant_nn.QuantMaxPool1d),
    (torch.nn, "MaxPool2d", quant_nn.QuantMaxPool2d),
    (torch.nn, "MaxPool3d", quant_nn.QuantMaxPool3d),
    (torch.nn, "AvgPool1d", quant_nn.QuantAvgPool1d),
    (torch.nn, "AvgPool2d", quant_nn.QuantAvgPool2d),
    (torch.nn, "AvgPool3d", quant_nn.QuantAvgPool3d),
    (torch.nn, "AdaptiveAvgPool1d", quant_nn.QuantAdaptiveAvgPool1d),
    (torch.nn, "AdaptiveAvgPool2d", quant_nn.QuantAdaptiveAvgPool2d),
    (torch.nn, "AdaptiveAvgPool3d", quant_nn.QuantAdaptiveAvgPool3d),
]


class QuantModuleReplacementHelper:
    """Swaps classes in their modules and back; one instance serves ``initialize``/``deactivate``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._replaced: list[tuple[ModuleType, str, type]] = []  # (module, name, original class)

    def apply(self, float_module_list: Optional[Iterable[str]] = None,
              custom_quant_modules: Optional[Iterable[tuple[ModuleType, str, type]]] = None) -> None:
        keep = _names(float_module_list, "float_module_list")
        entries = [e for e in _DEFAULT_QUANT_MAP if e[1] not in keep]
        for entry in custom_quant_modules or ():
            if (not isinstance(entry, tuple) or len(entry) != 3 or not isinstance(entry[0], ModuleType)
                    or not isinstance(entry[1], str) or not isinstance(entry[2], type)
                    or not hasattr(entry[0], entry[1])):
                raise TypeError("custom_quant_modules entries must be (module, 'ClassName', QuantClass) with the "
                                f"class present in the module, got {entry!r}")
            entries = [e for e in entries if (e[0], e[1]) != (entry[0], entry[1])] + [entry]
        with self._lock:
            if self._replaced:
                raise RuntimeError("quant_modules.initialize() is already active: call deactivate() first")
            for module, name, quant in entries:
                self._replaced.append((module, name, getattr(module, name)))
                setattr(module, name, quant)

    def restore(self) -> None:
        with self._lock:
            for module, name, original in reversed(self._replaced):
                setattr(module, name, original)
            self._replaced.clear()


def _names(value: Optional[Iterable[str]], what: str) -> set[str]:
    if value is None:
        return set()
    if isinstance(value, str) or not all(isinstance(v, str) for v in value):
        raise TypeError(f"{what} must be a list of class names such as ['Linear'], got {value!r}")
    names = set(value)
    known = {name for _, name, _ in _DEFAULT_QUANT_MAP}
    if names - known:
        raise ValueError(f"{what} names {sorted(names - known)}, which quant_modules does not replace "
                         f"(it replaces {sorted(known)})")
    return names


_HELPER = QuantModuleReplacementHelper()


class _Active:
    """What ``initialize()`` returns: usable as a context manager that deactivates on exit."""

    def __enter__(self) -> "_Active":
        return self

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException], tb: Optional[TracebackType]) -> None:
        deactivate()


def initialize(float_module_list: Optional[Iterable[str]] = None,
               custom_quant_modules: Optional[Iterable[tuple[ModuleType, str, type]]] = None) -> _Active:
    """Replace ``torch.nn``'s layer classes by their quantized counterparts (see the module docstring)."""
    _HELPER.apply(float_module_list, custom_quant_modules)
    return _Active()


def deactivate() -> None:
    """Put the float classes back (does nothing if ``initialize`` is not active)."""
    _HELPER.restore()
