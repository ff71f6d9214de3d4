"""Fold BatchNorm layers into the Conv/Linear layers next to them (AIMET's ``fold_all_batch_norms``).

At inference a BatchNorm is an affine map per channel, ``bn(z) = s·z + t`` with
``s = γ / sqrt(running_var + eps)`` and ``t = β − running_mean·s``; deployment
merges it into the adjacent layer, so the weights that get quantized are the
folded ones. Fold before building a :class:`~quanta.quantsim.QuantizationSimModel`
and the simulation quantizes what the device will run:

* **layer → BN** (backward fold): ``W'[o] = s[o]·W[o]``, ``b' = s·b + t``, for
  Conv1d/2d/3d, ConvTranspose1d/2d/3d (any groups) and Linear;
* **BN → layer** (forward fold): ``W'[:, c] = s[c]·W[:, c]``, ``b' = b + Σ W·t``,
  for Linear on 2-D input and for Conv1d/2d/3d with ``groups == 1`` and no
  padding (a padded border would see the zeros un-normalised).

A pair is folded only when the layer's output feeds nothing but the BN (or the
BN's output nothing but the layer), each module is called once in forward and
holds parameters of its own (tied weights are left alone).
The BN is replaced by ``nn.Identity``. The model is checked afterwards: on the
dummy input, in eval mode, the outputs must match the unfolded model's within
float rounding, else every change is undone and RuntimeError names the pairs.

>>> import torch
>>> from torch import nn
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4))
>>> pairs = fold_all_batch_norms(model.eval(), input_shapes=(1, 3, 8, 8))
>>> [(type(layer).__name__, type(bn).__name__) for layer, bn in pairs]
[('Conv2d', 'BatchNorm2d')]
>>> model[1]
Identity()
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx, nn

from quanta.nn.base import eval_mode

__all__ = ["FoldedPair", "fold_all_batch_norms"]

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_CONV_T = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
_LAYERS = (*_CONV, *_CONV_T, nn.Linear)
_BNS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


class FoldedPair(tuple):
    """A folded ``(layer, bn)`` pair, as AIMET returns it, that also says where the BatchNorm sat.

    ``bn_follows_layer`` is True for layer → BN (the BN normalised the layer's
    output, so its ``weight``/``bias`` describe that output: what high-bias
    absorption needs) and False for BN → layer.

    >>> from torch import nn
    >>> pair = FoldedPair(nn.Conv2d(1, 2, 1), nn.BatchNorm2d(2), bn_follows_layer=True)
    >>> layer, bn = pair
    >>> type(layer).__name__, pair.bn_follows_layer
    ('Conv2d', True)
    """

    bn_follows_layer: bool

    def __new__(cls, layer: nn.Module, bn: nn.Module, bn_follows_layer: bool) -> "FoldedPair":
        pair = super().__new__(cls, (layer, bn))
        pair.bn_follows_layer = bn_follows_layer
        return pair


def _inputs(input_shapes: Any, dummy_input: Any, device: torch.device) -> tuple:
    if dummy_input is not None:
        return tuple(dummy_input) if isinstance(dummy_input, (tuple, list)) else (dummy_input,)
    if input_shapes is None:
        raise TypeError("fold_all_batch_norms() needs input_shapes (a shape, or a list of shapes) or dummy_input")

    def shape(s: Any) -> tuple[int, ...]:
        if not isinstance(s, (tuple, list, torch.Size)) or not s or not all(
                isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in s):
            raise ValueError(f"input_shapes must be a shape of positive ints or a list of them, got {input_shapes!r}")
        return tuple(s)

    many = isinstance(input_shapes, (tuple, list)) and input_shapes and isinstance(input_shapes[0], (tuple, list))
    shapes = [shape(s) for s in input_shapes] if many else [shape(input_shapes)]
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randn(s, generator=gen).to(device) for s in shapes)


def _foldable_bn(bn: nn.Module) -> bool:
    return isinstance(bn, _BNS) and bn.running_mean is not None and bn.running_var is not None


def _forward_foldable(layer: nn.Module, bn_input_dims: int | None) -> bool:
    """BN → layer: Linear on 2-D input, or an unpadded, ungrouped convolution."""
    if isinstance(layer, nn.Linear):
        return bn_input_dims == 2
    if isinstance(layer, _CONV):
        padding = layer.padding
        unpadded = padding == "valid" or (not isinstance(padding, str) and all(p == 0 for p in padding))
        return unpadded and layer.groups == 1
    return False


def module_call_graph(model: nn.Module, args: tuple, who: str) -> fx.Graph:
    """A graph of ``model`` whose ``call_module`` nodes name ``model``'s own modules, from quanta's capture
    (torch.export, then torch.fx: :func:`~quanta.quantsim.capture.prepare_model`, which lifts Conv, BatchNorm,
    activation... calls back to the model's module objects under their names). TypeError, naming ``who``, if
    neither captures the model."""
    from quanta.quantsim.capture import prepare_model  # capture imports this module's package

    prepared = prepare_model(model, args)
    if not prepared.traced:
        raise TypeError(f"{who} could not capture {type(model).__name__} ({prepared.trace_error}); "
                        "nothing was changed")
    return prepared.graph


def single_use_modules(model: nn.Module, graph: fx.Graph) -> Callable[[Any], nn.Module | None]:
    """``node -> module``: the module of ``model`` a ``call_module`` node calls, if the graph calls it once and it
    holds parameters of its own (tied weights are left alone); None for any other node."""
    calls: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            calls[node.target] = calls.get(node.target, 0) + 1
    modules = dict(model.named_modules())
    owners: dict[int, int] = {}  # parameter -> how many modules hold it
    for _, m in model.named_modules(remove_duplicate=False):
        for p in m.parameters(recurse=False):
            owners[id(p)] = owners.get(id(p), 0) + 1

    def module(node: Any) -> nn.Module | None:
        if isinstance(node, fx.Node) and node.op == "call_module" and calls[node.target] == 1:
            m = modules.get(node.target)
            if m is not None and all(owners[id(p)] == 1 for p in m.parameters(recurse=False)):
                return m
        return None

    return module


def layer_bn_nodes(graph: fx.Graph, module: Callable[[Any], nn.Module | None]) -> list[tuple[fx.Node, fx.Node]]:
    """``(layer node, BN node)`` for every Conv/ConvTranspose/Linear whose only user is a BatchNorm with running
    statistics called on it alone (``module``: :func:`single_use_modules` of the graph's model)."""
    pairs = []
    for node in graph.nodes:
        src = node.args[0] if node.args else None
        if (_foldable_bn(module(node)) and len(node.args) == 1 and isinstance(module(src), _LAYERS)
                and len(src.users) == 1):
            pairs.append((src, node))
    return pairs


def _input_ranks(model: nn.Module, args: tuple, kinds: tuple) -> dict[str, int]:
    """The rank of the (first) input each module of ``kinds`` receives in one eval-mode run on ``args``."""
    ranks: dict[str, int] = {}

    def record(name: str, inputs: tuple) -> None:  # returns None: a pre-hook's return value replaces the inputs
        if inputs and isinstance(inputs[0], torch.Tensor):
            ranks.setdefault(name, inputs[0].dim())

    hooks = [m.register_forward_pre_hook(lambda _, inputs, name=name: record(name, inputs))
             for name, m in model.named_modules() if isinstance(m, kinds)]
    try:
        with eval_mode(model), torch.no_grad():
            model(*args)
    finally:
        for h in hooks:
            h.remove()
    return ranks


def _find_pairs(model: nn.Module, args: tuple) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(layer → BN pairs, BN → layer pairs)`` as module names, from quanta's capture of ``model``."""
    graph = module_call_graph(model, args, "fold_all_batch_norms()")
    bn_input_ranks = _input_ranks(model, args, _BNS)
    module = single_use_modules(model, graph)

    backward, forward, used = [], [], set()
    for src, node in layer_bn_nodes(graph, module):  # layer -> BN first: it always applies (AIMET's order too)
        backward.append((src.target, node.target))
        used.add(node.target)
    for node in graph.nodes:
        layer, src = module(node), node.args[0] if node.args else None
        if not isinstance(layer, _LAYERS) or len(node.args) != 1 or node.kwargs:
            continue
        bn = module(src)
        if not _foldable_bn(bn) or src.target in used or len(src.users) != 1:
            continue
        if _forward_foldable(layer, bn_input_ranks.get(src.target)):
            forward.append((src.target, node.target))
            used.add(src.target)
    return backward, forward


def _scale_shift(bn: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, t)`` of ``bn(z) = s·z + t`` at inference, in float64."""
    var, mean = bn.running_var.double(), bn.running_mean.double()
    gamma = bn.weight.double() if bn.weight is not None else torch.ones_like(var)
    beta = bn.bias.double() if bn.bias is not None else torch.zeros_like(var)
    s = gamma / torch.sqrt(var + bn.eps)
    return s, beta - mean * s


def _set(layer: nn.Module, weight: torch.Tensor, bias: torch.Tensor) -> None:
    with torch.no_grad():
        layer.weight.copy_(weight.to(layer.weight.dtype))
        if layer.bias is None:
            layer.bias = nn.Parameter(bias.to(layer.weight.dtype), requires_grad=layer.weight.requires_grad)
        else:
            layer.bias.copy_(bias.to(layer.bias.dtype))


def _bias(layer: nn.Module, n: int) -> torch.Tensor:
    return layer.bias.detach().double() if layer.bias is not None else torch.zeros(n, dtype=torch.float64,
                                                                                   device=layer.weight.device)


def _fold_backward(layer: nn.Module, bn: nn.Module) -> None:
    s, t = _scale_shift(bn)
    w = layer.weight.detach().double()
    if isinstance(layer, _CONV_T):  # (C_in, C_out / g, *k): output channel g·(C_out/g) + j sits at [group g, :, j]
        g = layer.groups
        per = w.shape[1]
        grouped = w.reshape(g, w.shape[0] // g, per, *w.shape[2:])
        w = (grouped * s.reshape(g, 1, per, *([1] * (w.dim() - 2)))).reshape(w.shape)
    else:
        w = w * s.reshape(-1, *([1] * (w.dim() - 1)))
    _set(layer, w, _bias(layer, s.numel()) * s + t)


def _fold_forward(bn: nn.Module, layer: nn.Module) -> None:
    s, t = _scale_shift(bn)
    w = layer.weight.detach().double()
    shape = (1, -1, *([1] * (w.dim() - 2)))
    bias = _bias(layer, w.shape[0]) + (w * t.reshape(shape)).flatten(1).sum(dim=1)
    _set(layer, w * s.reshape(shape), bias)


def _replace(model: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, new)


def _outputs(model: nn.Module, args: tuple) -> list[torch.Tensor]:
    with eval_mode(model), torch.no_grad():
        out = model(*args)
    return [t.detach().double() for t in torch.utils._pytree.tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


def fold_all_batch_norms(model: nn.Module, input_shapes: Sequence[int] | Sequence[Sequence[int]] | None = None,
                         dummy_input: torch.Tensor | tuple[torch.Tensor, ...] | None = None,
                         ) -> list[tuple[nn.Module, nn.Module]]:
    """Fold every foldable BatchNorm of ``model`` into its adjacent Conv/Linear layer, in place.

    Args:
        model: the float model (modified in place; its train/eval flags are kept).
        input_shapes: the input shape, or a list of shapes for several inputs
            (AIMET's argument; random inputs of these shapes drive the trace).
        dummy_input: a tensor or tuple of tensors the model accepts, instead of
            ``input_shapes``.

    Returns:
        ``(layer, bn)`` pairs, as in AIMET, for both fold directions; each ``bn``
        is the removed BatchNorm module (now ``nn.Identity`` in ``model``). Each
        pair is a :class:`FoldedPair`, whose ``bn_follows_layer`` tells the two
        directions apart.

    Raises TypeError without inputs or for a model neither torch.export nor torch.fx captures,
    ValueError for malformed ``input_shapes``, RuntimeError (with the model
    restored) if the folded model does not reproduce the original outputs.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    args = _inputs(input_shapes, dummy_input, device)
    backward, forward = _find_pairs(model, args)
    if not backward and not forward:
        return []
    modules = dict(model.named_modules())
    touched = {name for pair in (*backward, *forward) for name in pair if isinstance(modules[name], _LAYERS)}
    saved = {name: (modules[name].weight.detach().clone(),
                     None if modules[name].bias is None else modules[name].bias.detach().clone()) for name in touched}
    reference = _outputs(model, args)
    pairs: list[tuple[nn.Module, nn.Module]] = []
    for layer_name, bn_name in backward:
        _fold_backward(modules[layer_name], modules[bn_name])
        pairs.append(FoldedPair(modules[layer_name], modules[bn_name], bn_follows_layer=True))
    for bn_name, layer_name in forward:
        _fold_forward(modules[bn_name], modules[layer_name])
        pairs.append(FoldedPair(modules[layer_name], modules[bn_name], bn_follows_layer=False))
    bn_names = [bn for _, bn in backward] + [bn for bn, _ in forward]
    for name in bn_names:
        _replace(model, name, nn.Identity())
    folded = _outputs(model, args)
    worst = _mismatch(reference, folded)
    if worst is not None:
        for name in bn_names:
            _replace(model, name, modules[name])
        for name, (w, b) in saved.items():
            layer = modules[name]
            with torch.no_grad():
                layer.weight.copy_(w)
            if b is None:
                layer.bias = None
            else:
                with torch.no_grad():
                    layer.bias.copy_(b)
        raise RuntimeError(f"folding {bn_names} changed the model's outputs ({worst}); the model is restored")
    return pairs


def _mismatch(reference: list[torch.Tensor], folded: list[torch.Tensor]) -> str | None:
    """None if the outputs agree within float32 rounding of the folded weights, else what differs."""
    if len(reference) != len(folded) or any(a.shape != b.shape for a, b in zip(reference, folded)):
        return "output structure differs"
    for a, b in zip(reference, folded):
        scale = float(a.abs().max()) if a.numel() else 0.0
        if not math.isfinite(scale):
            continue
        diff = float((a - b).abs().max()) if a.numel() else 0.0
        if diff > 1e-4 * max(scale, 1e-6) + 1e-6:
            return f"max |difference| {diff:.3g} on outputs up to {scale:.3g}"
    return None

