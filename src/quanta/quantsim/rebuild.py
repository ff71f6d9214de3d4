"""Modules rebuilt from the aten calls of a torch.export program whose original modules are gone.

A program loaded from a ``.pt2`` file (``torch.export.load(path).module()``)
holds its parameters in plain ``nn.Module`` containers at the original paths;
``aten.linear(x, fc.weight, fc.bias)`` is all that is left of ``fc``.
:func:`rebuild` makes the module such a call stands for (``nn.Linear``,
``nn.Conv1d/2d/3d``, ``nn.ConvTranspose1d/2d``, ``nn.BatchNorm1d/2d`` in eval
mode, ``nn.LayerNorm``, ``nn.GroupNorm``, ``nn.Embedding``) holding the
container's own tensors, so capture can put it back in the graph
(:func:`quanta.quantsim.capture.lift_module_calls` checks it computes the same).

>>> import torch
>>> from torch import nn
>>> ep = torch.export.export(nn.Sequential(nn.Linear(4, 3)), (torch.randn(2, 4),))
>>> gm = ep.module()
>>> node = next(n for n in gm.graph.nodes if n.op == "call_function" and "linear" in str(n.target))
>>> rebuilt = rebuild(node, gm.get_submodule("0"))
>>> rebuilt, rebuilt.weight is gm.get_submodule("0").weight
(Linear(in_features=4, out_features=3, bias=True), True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

__all__ = ["rebuild"]

_aten = torch.ops.aten


def _arg(node: fx.Node, index: int, name: str, default: Any = None) -> Any:
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _pair(v: Any, n: int) -> tuple[int, ...]:
    return tuple(v) if isinstance(v, (list, tuple)) else (v,) * n


def _conv(dims: int) -> Callable[[fx.Node, dict[str, torch.Tensor]], Any]:
    cls = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]

    def build(node: fx.Node, t: dict[str, torch.Tensor]) -> nn.Module | None:
        w = t["weight"]
        if w.dim() != dims + 2:
            return None
        padding = _arg(node, 4, "padding", 0)
        padding = padding if isinstance(padding, str) else _pair(padding, dims)
        groups = _arg(node, 6, "groups", 1)
        return cls(w.shape[1] * groups, w.shape[0], tuple(w.shape[2:]), stride=_pair(_arg(node, 3, "stride", 1), dims),
                   padding=padding, dilation=_pair(_arg(node, 5, "dilation", 1), dims), groups=groups,
                   bias="bias" in t, device="meta")
    return build


def _conv_transpose(dims: int) -> Callable[[fx.Node, dict[str, torch.Tensor]], Any]:
    cls = {1: nn.ConvTranspose1d, 2: nn.ConvTranspose2d}[dims]

    def build(node: fx.Node, t: dict[str, torch.Tensor]) -> nn.Module | None:
        w = t["weight"]
        if w.dim() != dims + 2:
            return None
        groups = _arg(node, 6, "groups", 1)
        return cls(w.shape[0], w.shape[1] * groups, tuple(w.shape[2:]), stride=_pair(_arg(node, 3, "stride", 1), dims),
                   padding=_pair(_arg(node, 4, "padding", 0), dims),
                   output_padding=_pair(_arg(node, 5, "output_padding", 0), dims), groups=groups,
                   dilation=_pair(_arg(node, 7, "dilation", 1), dims), bias="bias" in t, device="meta")
    return build


def _linear(node: fx.Node, t: dict[str, torch.Tensor]) -> nn.Module | None:
    w = t["weight"]
    return nn.Linear(w.shape[1], w.shape[0], bias="bias" in t, device="meta") if w.dim() == 2 else None


def _batch_norm(node: fx.Node, t: dict[str, torch.Tensor]) -> nn.Module | None:
    if _arg(node, 5, "training", False) or "running_mean" not in t or "weight" not in t:
        return None
    val = node.args[0].meta.get("val") if isinstance(node.args[0], fx.Node) else None
    rank = val.dim() if isinstance(val, torch.Tensor) else None
    cls = {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d}.get(rank)  # type: ignore[arg-type]
    if cls is None:
        return None
    return cls(t["running_mean"].numel(), eps=_arg(node, 7, "eps", 1e-5), momentum=_arg(node, 6, "momentum", 0.1),
               device="meta")


def _layer_norm(node: fx.Node, t: dict[str, torch.Tensor]) -> nn.Module | None:
    shape = _arg(node, 1, "normalized_shape")
    if "weight" not in t:
        return None
    return nn.LayerNorm(tuple(shape), eps=_arg(node, 4, "eps", 1e-5), bias="bias" in t, device="meta")


def _group_norm(node: fx.Node, t: dict[str, torch.Tensor]) -> nn.Module | None:
    if "weight" not in t or "bias" not in t:
        return None
    return nn.GroupNorm(_arg(node, 1, "num_groups"), t["weight"].numel(), eps=_arg(node, 4, "eps", 1e-5),
                        device="meta")


def _embedding(node: fx.Node, t: dict[str, torch.Tensor]) -> nn.Module | None:
    if _arg(node, 4, "sparse", False) or _arg(node, 3, "scale_grad_by_freq", False):
        return None
    w = t["weight"]
    padding_idx = _arg(node, 2, "padding_idx", -1)
    return nn.Embedding(w.shape[0], w.shape[1], padding_idx=None if padding_idx == -1 else padding_idx,
                        device="meta")


# aten op -> (positions of (param name, arg index), index of the data input, builder)
_PARAM_OPS: dict[Any, tuple[tuple[tuple[str, int], ...], int, Callable[..., nn.Module | None]]] = {
    _aten.linear.default: ((("weight", 1), ("bias", 2)), 0, _linear),
    _aten.conv1d.default: ((("weight", 1), ("bias", 2)), 0, _conv(1)),
    _aten.conv2d.default: ((("weight", 1), ("bias", 2)), 0, _conv(2)),
    _aten.conv3d.default: ((("weight", 1), ("bias", 2)), 0, _conv(3)),
    _aten.conv1d.padding: ((("weight", 1), ("bias", 2)), 0, _conv(1)),
    _aten.conv2d.padding: ((("weight", 1), ("bias", 2)), 0, _conv(2)),
    _aten.conv3d.padding: ((("weight", 1), ("bias", 2)), 0, _conv(3)),
    _aten.conv_transpose1d.default: ((("weight", 1), ("bias", 2)), 0, _conv_transpose(1)),
    _aten.conv_transpose2d.input: ((("weight", 1), ("bias", 2)), 0, _conv_transpose(2)),
    _aten.batch_norm.default: ((("weight", 1), ("bias", 2), ("running_mean", 3), ("running_var", 4)), 0,
                               _batch_norm),
    _aten.layer_norm.default: ((("weight", 2), ("bias", 3)), 0, _layer_norm),
    _aten.group_norm.default: ((("weight", 2), ("bias", 3)), 0, _group_norm),
    _aten.embedding.default: ((("weight", 0),), 1, _embedding),
}




def rebuild(node: fx.Node, holder: nn.Module) -> nn.Module | None:
    """The module the aten call ``node`` stands for, holding ``holder``'s tensors (the same objects), or None
    if ``node`` is not such a call or its tensors are not exactly ``holder``'s."""
    entry = _PARAM_OPS.get(node.target)
    if entry is None:
        return None
    params, _, build = entry
    root = node.graph.owning_module
    tensors: dict[str, torch.Tensor] = {}
    for pname, index in params:
        a = _arg(node, index, pname)
        if a is None:
            continue
        if not isinstance(a, fx.Node) or a.op != "get_attr":
            return None
        value = root.get_submodule(str(a.target).rpartition(".")[0]) if "." in str(a.target) else root
        value = getattr(value, str(a.target).rpartition(".")[2], None)
        if not any(value is t for t in (*holder.parameters(recurse=False), *holder.buffers(recurse=False))):
            return None
        tensors[pname] = value
    if "weight" not in tensors:
        return None
    try:
        new = build(node, tensors)
    except (TypeError, ValueError):
        return None
    if new is None or set(new.state_dict()) - set(tensors) - {"num_batches_tracked"}:
        return None
    for key, value in tensors.items():
        if key in dict(new.named_parameters(recurse=False)):
            setattr(new, key, value if isinstance(value, nn.Parameter) else nn.Parameter(value, requires_grad=False))
        else:
            setattr(new, key, value)
    for name, buf in list(new.named_buffers(recurse=False)):
        if buf is not None and buf.is_meta:  # BatchNorm's num_batches_tracked: not read by the eval-mode call
            held = getattr(holder, name, None)
            setattr(new, name, held if isinstance(held, torch.Tensor) else torch.zeros((), dtype=buf.dtype))
    if any(t.is_meta for t in (*new.parameters(), *new.buffers())):
        return None
    return new.train(False)
