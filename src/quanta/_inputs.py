"""How quanta feeds a model: one batch (a tensor, a tuple of positional inputs, or a dict of keyword inputs)
as ``(args, kwargs)``, and the same for a dummy input, checked.

>>> split_batch(5), split_batch((5, 2)), split_batch({"a": 5})
(((5,), {}), ((5, 2), {}), ((), {'a': 5}))
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["call_model", "split_batch", "split_dummy_input"]


def split_batch(batch: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` of one batch: ``((), dict(batch))`` for a dict, ``(batch, {})`` for a tuple, else
    ``((batch,), {})``. Nothing is checked (see :func:`split_dummy_input`)."""
    if isinstance(batch, Mapping):
        return (), dict(batch)
    return (batch if isinstance(batch, tuple) else (batch,)), {}


def call_model(model: Callable[..., Any], batch: Any) -> Any:
    """``model(**batch)`` for a dict, ``model(*batch)`` for a tuple, else ``model(batch)``.

    >>> def f(a, b=0):
    ...     return a - b
    >>> call_model(f, 5), call_model(f, (5, 2)), call_model(f, {"a": 5, "b": 3})
    (5, 3, 2)
    """
    args, kwargs = split_batch(batch)
    return model(*args, **kwargs)


def split_dummy_input(dummy_input: Any, forward: Callable[..., Any] | None = None
                      ) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    """``(args, kwargs)`` of a dummy input: a tensor or a tuple of tensors (positional inputs, ``kwargs`` empty),
    or a dict of keyword inputs (``args`` empty) that maps argument names to values, at least one a tensor.

    With ``forward``, a dict is bound to its signature: a name it does not take is a TypeError, and ``kwargs``
    comes back in the order of its parameters. Anything else is a TypeError that names ``dummy_input``.

    >>> def forward(input_ids, mask=None, use_cache=True): ...
    >>> x = torch.zeros(2)
    >>> split_dummy_input((x, x))[1], list(split_dummy_input({"use_cache": False, "input_ids": x}, forward)[1])
    ({}, ['input_ids', 'use_cache'])
    >>> split_dummy_input({"input_ids": x, "ids": x}, forward)
    Traceback (most recent call last):
    ...
    TypeError: dummy_input: got an unexpected keyword argument 'ids'
    """
    if isinstance(dummy_input, Mapping):
        if not dummy_input or not all(isinstance(k, str) for k in dummy_input):
            raise TypeError("dummy_input as a dict must map the forward's argument names (str) to inputs, got "
                            f"{list(dummy_input)[:4]!r}")
        kwargs = dict(dummy_input)
        if forward is not None:
            try:
                kwargs = dict(inspect.signature(forward).bind(**kwargs).arguments)
            except TypeError as e:
                raise TypeError(f"dummy_input: {e}") from None
        if not any(isinstance(v, torch.Tensor) for v in kwargs.values()):
            raise TypeError("dummy_input: the dict holds no tensor")
        return (), kwargs
    args = dummy_input if isinstance(dummy_input, tuple) else (dummy_input,)
    if not args or not all(isinstance(a, torch.Tensor) for a in args):
        raise TypeError(
            "dummy_input must be a tensor, a tuple of tensors (the positional inputs of the model's forward) or a "
            f"dict of keyword inputs, got {type(dummy_input).__name__}"
        )
    return args, {}
