"""What export needs from a simulated model: the typed seam between :mod:`quanta.quantsim` and :mod:`quanta.export`.

The export functions (:func:`~quanta.export.onnx.export_onnx`, :mod:`quanta.export.sim_encodings`)
take any object with these members and never import :mod:`quanta.quantsim`; a
:class:`~quanta.quantsim.QuantizationSimModel` is one. Both protocols are
``runtime_checkable``, so ``isinstance`` tells whether an object has the members
(not their types).

>>> import torch
>>> from quanta.quantsim import QuantizationSimModel
>>> sim = QuantizationSimModel(torch.nn.Sequential(torch.nn.Linear(4, 4)), torch.randn(2, 4))
>>> isinstance(sim, QuantizedModelLike), isinstance(sim, SimulationLike), isinstance(sim.model, QuantizedModelLike)
(True, True, False)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from enum import Enum
from typing import Protocol, runtime_checkable

from torch import nn

from quanta.nn import QuantizationMixin
from quanta.quantization.base import QuantizerBase

__all__ = ["QuantizedModelLike", "SimulationLike"]


@runtime_checkable
class QuantizedModelLike(Protocol):
    """A model whose quantizers can be exported: enough for ONNX export and for reading and setting encodings.

    Members:
        model: the ``nn.Module`` that runs the simulation (ONNX export traces its ``forward``).
        named_quantizers(): ``(name, quantizer)`` for every quantizer module of ``model``, named as in
            ``model.named_modules()`` (``"conv1.output_quantizers.0"``).
        quantized_modules(): ``(name, module)`` for every quantized module of ``model``
            (a :class:`~quanta.nn.QuantizationMixin`) that is not inside another one.
    """

    @property
    def model(self) -> nn.Module: ...

    def named_quantizers(self) -> Iterator[tuple[str, QuantizerBase]]: ...

    def quantized_modules(self) -> Iterator[tuple[str, QuantizationMixin]]: ...


@runtime_checkable
class SimulationLike(QuantizedModelLike, Protocol):
    """A :class:`QuantizedModelLike` with the simulation's defaults, which AIMET's encodings files record
    (``quantizer_args`` and ``excluded_layers``, versions 0.6.1 and 1.0.0).

    Members:
        quant_scheme: the activation calibration scheme; its ``value`` is quanta's name (``"min_max"``, ...).
        default_output_bw, default_param_bw: default bitwidths of activation and parameter quantizers.
        default_data_type: ``int`` or ``float`` grids, an enum whose ``value`` is ``"int"`` or ``"float"``.
        unquantized_modules: names of the modules kept in float.
    """

    @property
    def quant_scheme(self) -> Enum: ...

    @property
    def default_output_bw(self) -> int: ...

    @property
    def default_param_bw(self) -> int: ...

    @property
    def default_data_type(self) -> Enum: ...

    @property
    def unquantized_modules(self) -> Sequence[str]: ...
