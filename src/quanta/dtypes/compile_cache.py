"""A stable key for quanta's tensor subclasses in ``torch.compile``'s caches.

PyTorch's AOT-autograd cache keys a compiled graph by the traced program and the
inputs' metadata; the graph a quantized weight traces to is chosen by quanta's
own Python code (which kernel op its ``linear`` calls), which that key does not
see. :func:`stable_hash_for_caching` adds it: a hash of the subclass, its
``__tensor_flatten__`` metadata, its inner tensors' shapes, dtypes and strides,
and the source of the modules that decide what quantized tensors trace to, so a
changed or upgraded quanta never reuses a graph traced by another.

>>> import torch
>>> from quanta.dtypes import to_affine_quantized_intx
>>> from quanta.encodings.torchao import MappingType
>>> w = to_affine_quantized_intx(torch.randn(4, 8), MappingType.SYMMETRIC, (1, 8), torch.int8)
>>> len(stable_hash_for_caching(w)) == 32 and stable_hash_for_caching(w) == stable_hash_for_caching(w.clone())
True
"""

from __future__ import annotations

import functools
import hashlib
import pathlib

import torch

__all__ = ["stable_hash_for_caching"]

# what decides the traced form of a quantized tensor's ops: its dispatch and the kernels it calls
_TRACED_FORM_SOURCES = ("dtypes", "kernels")


@functools.lru_cache(maxsize=1)
def _code_fingerprint() -> bytes:
    root = pathlib.Path(__file__).resolve().parent.parent
    h = hashlib.blake2b(digest_size=16)
    for sub in _TRACED_FORM_SOURCES:
        for path in sorted((root / sub).glob("*.py")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.digest()


def stable_hash_for_caching(t: torch.Tensor) -> str:
    """``_stable_hash_for_caching`` of a quanta tensor subclass (anything with ``__tensor_flatten__``)."""
    names, meta = t.__tensor_flatten__()
    h = hashlib.blake2b(_code_fingerprint(), digest_size=16)
    h.update(f"{type(t).__module__}.{type(t).__qualname__}|{meta!r}|{tuple(t.shape)}|{t.dtype}".encode())
    for name in names:
        inner = getattr(t, name)
        if hasattr(inner, "__tensor_flatten__"):
            h.update(stable_hash_for_caching(inner).encode())
        else:
            h.update(f"|{name}:{tuple(inner.shape)}:{inner.dtype}:{inner.stride()}".encode())
    return h.hexdigest()
