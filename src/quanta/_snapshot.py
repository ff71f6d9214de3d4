"""Snapshots of a module's own small tensors, for caches keyed on their values.

A cache of something computed from a quantizer's ``min``/``max`` must notice any change, including writes
through ``.data``, which bump no version counter; comparing values with ``torch.equal`` on every call costs
microseconds per tensor. A :class:`Snapshot` remembers where each tensor sits (which module, which slot), its
storage pointer, dtype and shape, and its bytes; for a CPU tensor NumPy can view, the bytes are read through a
view made once, so :meth:`Snapshot.unchanged` costs a few hundred nanoseconds per tensor. Other tensors (on
another device, or of a dtype NumPy lacks) are compared with ``torch.equal``.

Bytes, not values: ``-0.0`` after ``0.0`` counts as a change (the cached result is recomputed, which is
always safe), and so does a different NaN payload.

>>> q = torch.nn.Linear(2, 1)
>>> snap = Snapshot(q)
>>> snap.unchanged()
True
>>> _ = q.bias.data.fill_(3.0)  # no version bump, still seen
>>> snap.unchanged()
False
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["Snapshot"]


def _entry(slots: dict, key: str, tensor: torch.Tensor | None) -> tuple:
    """``(slots, key, tensor, pointer, NumPy view or None, saved bytes or a clone)``."""
    if tensor is None:
        return slots, key, None, 0, None, None
    t = tensor.detach()
    try:
        # a view of the tensor's current storage; it keeps that storage alive, so the pointer is never reused
        view = t.numpy() if t.device.type == "cpu" else None
    except (RuntimeError, TypeError):  # bfloat16, conjugate or negative bit: compare values instead
        view = None
    return slots, key, tensor, t.data_ptr(), view, view.tobytes() if view is not None else t.clone()


class Snapshot:
    """The parameters and buffers of ``module`` and of its submodules, as they are now.

    :meth:`unchanged` is True while every slot holds the same tensor object, at the same data pointer, with the
    same bytes, and no parameter, buffer or submodule has been added, removed or replaced. A tensor is assumed
    to change shape or dtype only with its data pointer (``t.data = other`` gives it ``other``'s; reinterpreting
    the same memory in place, ``t.data = t.data.view(...)``, is not seen).
    """

    __slots__ = ("_entries", "_structure")

    def __init__(self, module: nn.Module) -> None:
        self._entries = [_entry(slots, k, t) for m in module.modules() for slots in (m._parameters, m._buffers)
                         for k, t in slots.items()]
        self._structure = [(m._parameters, m._buffers, m._modules, len(m._parameters), len(m._buffers),
                            tuple(m._modules.values())) for m in module.modules()]

    def unchanged(self) -> bool:
        for params, buffers, modules, n_params, n_buffers, children in self._structure:
            if len(params) != n_params or len(buffers) != n_buffers or len(modules) != len(children):
                return False
            if children and not all(a is b for a, b in zip(modules.values(), children)):
                return False
        for slots, key, tensor, ptr, view, saved in self._entries:
            t = slots.get(key)
            if t is not tensor:
                return False
            if t is None:
                continue
            if t.data_ptr() != ptr:
                return False
            if view is not None:
                if view.tobytes() != saved:
                    return False
            elif t.device != saved.device or t.dtype != saved.dtype or t.shape != saved.shape \
                    or not torch.equal(t.detach(), saved):
                return False
        return True
