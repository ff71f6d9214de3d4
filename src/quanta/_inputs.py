"""How quanta feeds a model one batch: a tensor, a tuple of positional inputs, or a dict of keyword inputs."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["call_model"]


def call_model(model: Callable[..., Any], batch: Any) -> Any:
    """``model(**batch)`` for a dict, ``model(*batch)`` for a tuple, else ``model(batch)``.

    >>> def f(a, b=0):
    ...     return a - b
    >>> call_model(f, 5), call_model(f, (5, 2)), call_model(f, {"a": 5, "b": 3})
    (5, 3, 2)
    """
    if isinstance(batch, Mapping):
        return model(**batch)
    return model(*batch) if isinstance(batch, tuple) else model(batch)
