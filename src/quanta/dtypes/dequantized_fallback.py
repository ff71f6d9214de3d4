"""What quanta's wrapper tensors (WeightTensorWithLinearActivationScaleMetadata, MXTensor, NVFP4Tensor) do with
an operation they have no implementation of: refuse it if it would write into the codes, else run it on the
dequantized tensor (a float copy), warning once per operation so that a transposed or sliced weight does not
silently become a float copy."""

from __future__ import annotations

import warnings
from typing import Any, Callable

__all__ = ["run_on_dequantized"]

_WARNED: set[str] = set()


def run_on_dequantized(func: Any, args: tuple, kwargs: dict, is_quantized: Callable[[Any], bool],
                       what: str) -> Any:
    """``func(*args, **kwargs)`` with every quantized argument dequantized (``TypeError`` for in-place ops)."""
    if func._schema.is_mutable:
        raise TypeError(f"{func} would modify a {what} in place; its codes are read-only")
    name = str(func)
    if name not in _WARNED:
        _WARNED.add(name)
        warnings.warn(f"quanta: {name} has no implementation for {what}; it runs on the dequantized tensor (a "
                      "float copy). This warning is shown once per operation.", stacklevel=4)

    def unwrap(a):
        return a.dequantize() if is_quantized(a) else a

    return func(*(unwrap(a) for a in args), **{k: unwrap(v) for k, v in kwargs.items()})
