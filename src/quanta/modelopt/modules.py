"""ModelOpt's quantized modules: which torch modules get quantizers, under which names, and how they run.

``convert(model)`` turns, in place, every module of a registered class into its
quantized form (the same object, parameters and buffers; its class becomes a
subclass that adds quantizers):

* ``nn.Linear``, ``nn.Conv1d/2d/3d``, ``nn.ConvTranspose1d/2d/3d``: ``input_quantizer``,
  ``weight_quantizer`` (both 8-bit per tensor until a config sets them), ``output_quantizer``
  (disabled); the forward is the layer's own op on ``input_quantizer(x)`` and ``weight_quantizer(W)``.
* ``nn.LayerNorm``, ``nn.BatchNorm1d/2d/3d``, ``nn.InstanceNorm1d/2d/3d``, ``nn.LeakyReLU``,
  ``nn.MaxPool/AvgPool/AdaptiveAvgPool 1d/2d/3d``: ``input_quantizer`` and ``output_quantizer`` (disabled).
* ``nn.Embedding``: ``weight_quantizer`` and ``output_quantizer`` (its integer input is not quantized).

ModelOpt's registry also holds ``nn.RNN``/``LSTM``/``GRU``; quanta leaves them in float and
``convert`` says so once (:func:`convert` returns their names).
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from quanta.modelopt.tensor_quantizer import SequentialQuantizer, TensorQuantizer

__all__ = ["QuantModule", "convert", "is_quantized", "registered_class", "fold_weight"]


class QuantModule:
    """Mixin of every quantized module (``isinstance(m, QuantModule)`` finds them)."""

    def iter_weights_for_calibration(self):
        """``(weight, weight_quantizer)`` pairs (none for input-only modules)."""
        q = getattr(self, "weight_quantizer", None)
        if q is not None:
            yield self.weight, q

    @torch.no_grad()
    def fold_weight(self) -> None:
        """Write ``weight_quantizer(weight)`` into the weight and disable the quantizer."""
        q = getattr(self, "weight_quantizer", None)
        if q is None or not q.is_enabled:
            return
        self.weight.data.copy_(q(self.weight))
        q.disable()
        if isinstance(q, TensorQuantizer):
            q.reset_amax()


class _InputOnly(QuantModule):
    def _quant_setup(self) -> None:
        self.input_quantizer = TensorQuantizer()
        self.output_quantizer = TensorQuantizer()
        self.output_quantizer.disable()

    def forward(self, input, *args, **kwargs):
        out = super().forward(self.input_quantizer(input), *args, **kwargs)
        if isinstance(out, tuple):
            return (self.output_quantizer(out[0]), *out[1:])
        return self.output_quantizer(out)


class _WeightAndInput(_InputOnly):
    def _quant_setup(self) -> None:
        super()._quant_setup()
        self.weight_quantizer = TensorQuantizer()

    def _op(self, x: torch.Tensor, w: torch.Tensor, *args, **kwargs) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def forward(self, input, *args, **kwargs):
        override = self.__dict__.get("_forward_override")  # a calibration algorithm's (AWQ) forward
        if override is not None:
            return override(self, input, *args, **kwargs)
        return self.quant_forward(input, *args, **kwargs)

    def quant_forward(self, input, *args, **kwargs):
        """The layer's op on ``input_quantizer(input)`` and ``weight_quantizer(weight)``."""
        out = self._op(self.input_quantizer(input), self.weight_quantizer(self.weight), *args, **kwargs)
        return self.output_quantizer(out)


class _Linear(_WeightAndInput):
    def _op(self, x, w):
        return F.linear(x, w, self.bias)


class _Conv(_WeightAndInput):
    def _op(self, x, w):
        return self._conv_forward(x, w, self.bias)


_TRANSPOSED = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


class _ConvTranspose(_WeightAndInput):
    def _op(self, x, w, output_size=None):
        n = len(self.kernel_size)
        pad = self._output_padding(x, output_size, self.stride, self.padding, self.kernel_size, n, self.dilation)
        return _TRANSPOSED[n](x, w, self.bias, self.stride, self.padding, pad, self.groups, self.dilation)


class _Embedding(QuantModule):
    def _quant_setup(self) -> None:
        self.weight_quantizer = TensorQuantizer()
        self.output_quantizer = TensorQuantizer()
        self.output_quantizer.disable()

    def forward(self, input):
        w = self.weight_quantizer(self.weight)
        out = F.embedding(input, w, self.padding_idx, self.max_norm, self.norm_type, self.scale_grad_by_freq,
                          self.sparse)
        return self.output_quantizer(out)


# registry: torch class -> (ModelOpt's name for it, quantized mixin); most specific classes first
_REGISTRY: list[tuple[type, str, type]] = [
    (nn.Linear, "nn.Linear", _Linear),
    *((getattr(nn, f"Conv{d}d"), f"nn.Conv{d}d", _Conv) for d in (1, 2, 3)),
    *((getattr(nn, f"ConvTranspose{d}d"), f"nn.ConvTranspose{d}d", _ConvTranspose) for d in (1, 2, 3)),
    (nn.Embedding, "nn.Embedding", _Embedding),
    (nn.LayerNorm, "nn.LayerNorm", _InputOnly),
    (nn.LeakyReLU, "nn.LeakyReLU", _InputOnly),
    *((getattr(nn, f"{k}{d}d"), f"nn.{k}{d}d", _InputOnly)
      for k in ("BatchNorm", "InstanceNorm", "MaxPool", "AvgPool", "AdaptiveAvgPool") for d in (1, 2, 3)),
]
_BY_NAME = {name: cls for cls, name, _ in _REGISTRY}
_UNSUPPORTED = (nn.RNN, nn.LSTM, nn.GRU)
_CLASSES: dict[type, type] = {}


def registered_class(name: str) -> type:
    """The torch class ModelOpt's ``parent_class`` name stands for (``"nn.BatchNorm2d"``)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ValueError(f"parent_class {name!r} is not a quantized module class; known: {sorted(_BY_NAME)}") from None


def _quant_class(cls: type, mixin: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Quant{cls.__name__}", (mixin, cls), {"__module__": __name__})
    return _CLASSES[cls]


def is_quantized(model: nn.Module) -> bool:
    """Whether ``model`` holds quantized modules (it went through :func:`convert`)."""
    return any(isinstance(m, QuantModule) for m in model.modules())


def convert(model: nn.Module) -> list[str]:
    """Give every registered module of ``model`` its quantizers, in place; return the names left in float
    because quanta has no quantized form for them (RNN, LSTM, GRU)."""
    skipped = []
    for name, module in list(model.named_modules()):
        if isinstance(module, (QuantModule, TensorQuantizer, SequentialQuantizer)):
            continue
        if isinstance(module, _UNSUPPORTED):
            skipped.append(name)
            continue
        for cls, _, mixin in _REGISTRY:
            if type(module) is cls or (isinstance(module, cls) and type(module).forward is cls.forward):
                module.__class__ = _quant_class(type(module), mixin)
                module._quant_setup()
                break
    if skipped:
        warnings.warn(f"quanta.modelopt: {len(skipped)} recurrent module(s) stay in float (no quantized RNN/LSTM/"
                      f"GRU yet): {', '.join(skipped[:5])}{' ...' if len(skipped) > 5 else ''}", stacklevel=3)
    return skipped


def quantizers(model: nn.Module, match: Callable[[str, nn.Module], bool] | None = None):
    """``(name, quantizer)`` for every TensorQuantizer/SequentialQuantizer of ``model`` (that ``match`` accepts)."""
    for name, m in model.named_modules():
        if isinstance(m, (TensorQuantizer, SequentialQuantizer)) and (match is None or match(name, m)):
            yield name, m


def fold_weight(model: nn.Module) -> None:
    """Fold every enabled weight quantizer into its weight (ModelOpt's ``fold_weight``)."""
    for m in model.modules():
        if isinstance(m, QuantModule):
            m.fold_weight()
