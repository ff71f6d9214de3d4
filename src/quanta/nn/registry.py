"""Which quantized class replaces which float module.

Lookup is by exact type: a subclass of ``nn.Linear`` with its own ``forward``
is not silently given ``QuantizedLinear``'s forward; register it explicitly.
User registrations take precedence over the built-in table.

Adding a type takes a few lines:

>>> import torch
>>> from torch import nn
>>> import quanta.nn
>>> class Scale(nn.Module):
...     def __init__(self, n):
...         super().__init__()
...         self.weight = nn.Parameter(torch.ones(n))
...     def forward(self, x):
...         return x * self.weight
>>> class QuantizedScale(quanta.nn.QuantizationMixin, Scale):
...     def forward(self, x):
...         return self._qoutput(self._qinput(0, x) * self._qparam("weight"))
>>> quanta.nn.register(Scale, QuantizedScale)
>>> qm = quanta.nn.from_module(Scale(3))
>>> type(qm).__name__, quanta.nn.quantized_class_for(Scale(3)) is QuantizedScale
('QuantizedScale', True)
>>> quanta.nn.unregister(Scale)
"""

from __future__ import annotations

from torch import nn
from torch.nn.utils import parametrize

from quanta.nn.attention import QuantizedMultiheadAttention
from quanta.nn.base import QuantizationMixin
from quanta.nn.modules import BUILTIN

__all__ = ["from_module", "quantized_class_for", "register", "unregister"]

_USER: dict[type[nn.Module], type[nn.Module]] = {}
# Built-ins defined outside modules.py (attention.py imports QuantizedLinear from it, so it can't list them).
_BUILTIN_EXTRA: dict[type[nn.Module], type[nn.Module]] = {nn.MultiheadAttention: QuantizedMultiheadAttention}


def register(float_cls: type[nn.Module], quantized_cls: type[nn.Module], *, replace: bool = False) -> None:
    """Use ``quantized_cls`` for modules of exact type ``float_cls``.

    ``quantized_cls`` must subclass both :class:`QuantizationMixin` and
    ``float_cls``. Registering a type that already has a different quantized
    class raises ValueError unless ``replace=True``.
    """
    if not (isinstance(float_cls, type) and issubclass(float_cls, nn.Module)):
        raise TypeError(f"float_cls must be an nn.Module subclass, got {float_cls!r}")
    if not (isinstance(quantized_cls, type) and issubclass(quantized_cls, QuantizationMixin)
            and issubclass(quantized_cls, float_cls)):
        raise TypeError(
            f"quantized_cls must subclass quanta.nn.QuantizationMixin and {float_cls.__qualname__}, "
            f"got {quantized_cls!r}"
        )
    current = quantized_class_for(float_cls)
    if current is not None and current is not quantized_cls and not replace:
        raise ValueError(
            f"{float_cls.__qualname__} is already mapped to {current.__qualname__}; pass replace=True to override"
        )
    _USER[float_cls] = quantized_cls


def unregister(float_cls: type[nn.Module]) -> None:
    """Remove a user registration (built-in entries come back into effect). KeyError if there is none."""
    try:
        del _USER[float_cls]
    except KeyError:
        raise KeyError(f"{float_cls!r} has no user registration") from None


def quantized_class_for(module: nn.Module | type[nn.Module]) -> type[nn.Module] | None:
    """The quantized class for ``module`` (an instance or a class), or None if there is none.

    >>> import quanta.nn
    >>> quanta.nn.quantized_class_for(nn.Conv2d(1, 1, 1)).__name__
    'QuantizedConv2d'
    >>> quanta.nn.quantized_class_for(nn.Softsign()) is None
    True
    """
    cls = module if isinstance(module, type) else type(module)
    if not isinstance(module, type) and parametrize.is_parametrized(module):
        cls = cls.__mro__[1]  # torch's ParametrizedConv1d (weight norm) quantizes as the Conv1d it extends
    return _USER.get(cls) or BUILTIN.get(cls) or _BUILTIN_EXTRA.get(cls)


def from_module(module: nn.Module) -> nn.Module:
    """The quantized counterpart of ``module``, sharing its parameters (see ``QuantizationMixin.from_module``).

    Raises TypeError naming the type if no quantized class is registered for it.

    >>> import quanta.nn
    >>> quanta.nn.from_module(nn.Softsign())
    Traceback (most recent call last):
    ...
    TypeError: no quantized counterpart for torch.nn.modules.activation.Softsign; ...
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
    qcls = quantized_class_for(module)
    if qcls is None:
        t = type(module)
        raise TypeError(
            f"no quantized counterpart for {t.__module__}.{t.__qualname__}; "
            "add one with quanta.nn.register(float_cls, quantized_cls)"
        )
    return qcls.from_module(module)  # type: ignore[attr-defined]
