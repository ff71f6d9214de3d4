"""The descriptor plumbing of pytorch_quantization's quantized modules: ``QuantInputMixin`` / ``QuantMixin`` (an
``input_quantizer`` and a ``weight_quantizer`` built from per-class default descriptors or keyword arguments),
shared by :mod:`quanta.tensor_quant.nn` and :mod:`quanta.tensor_quant.rnn`."""

from __future__ import annotations

import copy
from typing import Any

from quanta.tensor_quant.descriptor import QUANT_DESC_8BIT_PER_TENSOR, ScaledQuantDescriptor
from quanta.tensor_quant.quantizer import TensorQuantizer

__all__ = ["QuantInputMixin", "QuantMixin", "pop_quant_desc_in_kwargs"]


def _descriptor(value: object, what: str) -> ScaledQuantDescriptor:
    if not isinstance(value, ScaledQuantDescriptor):
        raise TypeError(f"{what} must be a QuantDescriptor, got {type(value).__name__}")
    if not value.fake_quant:
        raise ValueError(f"{what}: only fake quantization is supported in quantized modules (fake_quant=True)")
    return value


class QuantInputMixin:
    """An ``input_quantizer`` built from ``default_quant_desc_input`` or the ``quant_desc_input`` keyword."""

    default_quant_desc_input: ScaledQuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR

    @classmethod
    def set_default_quant_desc_input(cls, value: ScaledQuantDescriptor) -> None:
        """The input descriptor of the instances of ``cls`` (and its subclasses) built from now on."""
        cls.default_quant_desc_input = copy.deepcopy(_descriptor(value, "quant_desc_input"))

    def init_quantizer(self, quant_desc_input: ScaledQuantDescriptor) -> None:
        self._input_quantizer = TensorQuantizer(_descriptor(quant_desc_input, "quant_desc_input"))

    @property
    def input_quantizer(self) -> TensorQuantizer:
        return self._input_quantizer


class QuantMixin(QuantInputMixin):
    """``input_quantizer`` and ``weight_quantizer`` (``default_quant_desc_weight`` or ``quant_desc_weight``)."""

    default_quant_desc_weight: ScaledQuantDescriptor = QUANT_DESC_8BIT_PER_TENSOR

    @classmethod
    def set_default_quant_desc_weight(cls, value: ScaledQuantDescriptor) -> None:
        """The weight descriptor of the instances of ``cls`` (and its subclasses) built from now on."""
        cls.default_quant_desc_weight = copy.deepcopy(_descriptor(value, "quant_desc_weight"))

    def init_quantizer(self, quant_desc_input: ScaledQuantDescriptor,  # type: ignore[override]
                       quant_desc_weight: ScaledQuantDescriptor) -> None:
        super().init_quantizer(quant_desc_input)
        self._weight_quantizer = TensorQuantizer(_descriptor(quant_desc_weight, "quant_desc_weight"))

    @property
    def weight_quantizer(self) -> TensorQuantizer:
        return self._weight_quantizer


def pop_quant_desc_in_kwargs(quant_cls: type, input_only: bool = False, **kwargs: Any):
    """``(quant_desc_input, quant_desc_weight)`` (or the input one alone) from ``kwargs`` or ``quant_cls``'s
    defaults; ``TypeError`` for any other keyword, as pytorch_quantization."""
    desc_input = kwargs.pop("quant_desc_input", quant_cls.default_quant_desc_input)
    if input_only:
        if kwargs:
            raise TypeError(f"unused keyword arguments: {sorted(kwargs)}")
        return desc_input
    desc_weight = kwargs.pop("quant_desc_weight", quant_cls.default_quant_desc_weight)
    if kwargs:
        raise TypeError(f"unused keyword arguments: {sorted(kwargs)}")
    return desc_input, desc_weight
