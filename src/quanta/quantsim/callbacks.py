"""AIMET's ``CallbackFunc``: a function bundled with the extra argument it is called with.

AIMET's analysis tools take their forward-pass and evaluation callbacks as
``CallbackFunc(func, func_callback_args)`` and call ``func(model, func_callback_args)``.
quanta's tools take those, or any plain ``fn(model)``.

>>> cb = CallbackFunc(lambda model, scale: scale * 2, 21)
>>> cb("the model")
42
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from quanta.nn.base import eval_mode

__all__ = ["CallbackFunc", "check_callback", "evaluate_score"]


class CallbackFunc:
    """``func(model, func_callback_args)`` as a one-argument callable ``cb(model)``.

    Args:
        func: called as ``func(model, func_callback_args)``.
        func_callback_args: its second argument (anything: a data loader, a number of batches, ...).
    """

    def __init__(self, func: Callable[[Any, Any], Any], func_callback_args: Any = None) -> None:
        if not callable(func):
            raise TypeError(f"func must be callable, got {type(func).__name__}")
        self.func = func
        self.args = func_callback_args

    def __call__(self, model: Any) -> Any:
        return self.func(model, self.args)

    def __repr__(self) -> str:
        return f"CallbackFunc({getattr(self.func, '__qualname__', self.func)!r}, {type(self.args).__name__})"


def check_callback(name: str, value: Any) -> Callable[[Any], Any]:
    """``value`` itself when it is callable (a :class:`CallbackFunc` or a plain ``fn(model)``); TypeError
    naming ``name`` otherwise."""
    if not callable(value):
        raise TypeError(f"{name} must be a CallbackFunc or a callable fn(model), got {type(value).__name__}")
    return value


def evaluate_score(eval_callback: Callable[[nn.Module], Any], model: nn.Module,
                   name: str = "eval_callback") -> float:
    """``eval_callback(model)`` with the model in eval mode under ``torch.no_grad()`` (its modes restored), as a
    float; TypeError naming ``name`` when it does not return a number."""
    with eval_mode(model), torch.no_grad():
        value = eval_callback(model)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must return a number, got {type(value).__name__} {value!r:.60}") from None
