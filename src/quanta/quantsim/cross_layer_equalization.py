"""Cross-layer equalization (AIMET's ``equalize_model``): BN fold, cross-layer scaling, high-bias absorption.

Per-tensor weight quantization spends its grid on the widest output channel of a
layer; where channel ranges differ by orders of magnitude (depthwise-separable
networks such as MobileNet, after BatchNorm folding) the narrow channels round
to a few levels. CLE (Nagel et al., 2019, *Data-Free Quantization Through Weight
Equalization and Bias Correction*) moves range between consecutive layers
without changing what the float model computes:

* **Cross-layer scaling.** For ``y = W2 f(W1 x + b1) + b2`` with ``f``
  positively homogeneous (ReLU, PReLU or nothing), ``f(z / s) = f(z) / s`` for
  ``s > 0``: dividing output channel ``i`` of layer 1 (weights and bias) by
  ``s_i`` and multiplying input channel ``i`` of layer 2 by ``s_i`` leaves ``y``
  unchanged. With ``r1_i = max|W1[i, ...]|`` and ``r2_i = max|W2[:, i, ...]|``,
  ``s_i = r1_i / sqrt(r1_i · r2_i)`` makes both ranges ``sqrt(r1_i · r2_i)``.
  For conv → depthwise conv → conv, with the depthwise range ``r2_i`` per channel
  and ``c_i = cbrt(r1_i · r2_i · r3_i)``: ``s12 = r1 / c``, ``s23 = c / r3``,
  ``W1 /= s12``, ``W2 *= s12 / s23``, ``W3[:, i] *= s23`` (``b1 /= s12``,
  ``b2 /= s23``); every range becomes ``c_i``.
* **High-bias absorption.** Scaling can leave large biases, which widen the
  activation ranges. Where layer 1 had a BatchNorm (``γ``, ``β``, now folded),
  its output channel is roughly ``N(β/s, (γ/s)²)``; ``c = max(0, β/s − 3|γ/s|)``
  is subtracted from ``b1`` and ``W2 · c`` (summed over the kernel window) added
  to ``b2``. Through a ReLU this is exact wherever the pre-activation is at least
  ``c`` (all but a 3σ tail); with no activation between, the whole ``β/s`` moves,
  exactly. **Zero padding** breaks that: the shift reaches every output of
  layer 2 as the same ``W2 · c`` only if no output sees padded zeros (which
  would have to become ``-c``). AIMET absorbs into padded layers all the same,
  and so does quanta by default, reproducing AIMET's weights: the activations
  after the absorbed layers narrow, which is what per-tensor W8A8 needs, at the
  cost of every border output. Measured on torchvision's ImageNet MobileNetV2
  (``bench/real_weights/cle_mobilenet_v2.py``, fidelity to the float model):
  per-tensor W8A8 8.6 dB with exact absorption, 10.2 dB with AIMET's, but the
  float model itself moves to 14.1 dB and weights-only W8 drops from 14.8 to
  12.6 dB. ``absorb_through_padding=False`` absorbs only where it is exact
  (``padding=0``, a non-zero padding mode, ConvTranspose with kernel and stride
  1): the float function is kept, for weight-only flows.

``equalize_model`` runs AIMET's sequence: fold BatchNorms
(:func:`~quanta.quantsim.fold_all_batch_norms`), scale, absorb. ReLU6 is not
scale-equivariant, so a conv → ReLU6 → conv chain is not scaled and a warning
says so (as in aimet-torch ≥ 2.4; older AIMET replaced every ReLU6 by ReLU,
which changes the model: do that yourself first where accuracy allows). Layers as in
AIMET: Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d, ungrouped or depthwise
(``groups == in_channels == out_channels``); chains connected directly or
through an ``nn.ReLU``/``nn.PReLU`` module (``nn.Identity`` modules, such as
folded BatchNorms, are looked through), each output feeding only the next. The
graph is quanta's capture (torch.export, then torch.fx), so Hugging Face models
are searched too; padding by zeros between two layers (Hugging Face's TF-style
"same" padding is an explicit pad op) is looked through for scaling, which it
commutes with, and never absorbed across (AIMET's search stops there).
Cross-layer sets, as AIMET forms them from a chain: conv → conv, conv →
depthwise → conv, depthwise → conv. A channel whose range is 0 in either layer
keeps scale 1 (AIMET would divide by zero).

>>> import torch
>>> from torch import nn
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
>>> with torch.no_grad():
...     model[0].weight[0] *= 50  # one channel 50x wider than the rest
>>> x = torch.randn(2, 3, 8, 8)
>>> before = model(x)
>>> equalize_model(model, dummy_input=x)
>>> torch.allclose(model(x), before, rtol=1e-4, atol=1e-4)
True
>>> r1 = model[0].weight.abs().amax(dim=(1, 2, 3))
>>> r2 = model[2].weight.abs().amax(dim=(0, 2, 3))
>>> torch.allclose(r1, r2)  # each channel's range is now the same in both layers
True
"""

from __future__ import annotations

import enum
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import fx, nn

from quanta.nn.base import eval_mode
from quanta.quantsim.batch_norm_fold import (
    _inputs,
    _mismatch,
    _outputs,
    fold_all_batch_norms,
    module_call_graph,
    single_use_modules,
)

__all__ = [
    "ClsLayerType",
    "ClsSetInfo",
    "CrossLayerScaling",
    "HighBiasFold",
    "equalize_bn_folded_model",
    "equalize_model",
]

_CLS_LAYERS = (nn.Conv1d, nn.Conv2d, nn.ConvTranspose1d, nn.ConvTranspose2d)
_CLS_ACTIVATIONS = (nn.ReLU, nn.PReLU)
_TRANSPOSED = (nn.ConvTranspose1d, nn.ConvTranspose2d)


class ClsLayerType(enum.Enum):
    """How a layer takes part in cross-layer scaling."""

    Unsupported = 0
    Conv = 1  # ungrouped Conv1d/2d or ConvTranspose1d/2d
    DepthwiseConv = 2  # groups == in_channels == out_channels


def _layer_type(layer: nn.Module) -> ClsLayerType:
    if not isinstance(layer, _CLS_LAYERS):
        return ClsLayerType.Unsupported
    if layer.groups == 1:
        return ClsLayerType.Conv
    if layer.groups == layer.in_channels == layer.out_channels:
        return ClsLayerType.DepthwiseConv
    return ClsLayerType.Unsupported


def _out_in(layer: nn.Module) -> torch.Tensor:
    """The layer's weight as an in-place-writable view ``[out, in, *kernel]`` (ConvTranspose stores ``[in, out]``)."""
    w = layer.weight.detach()
    return w.transpose(0, 1) if isinstance(layer, _TRANSPOSED) and layer.groups == 1 else w


def _range_out(w: torch.Tensor) -> torch.Tensor:
    return w.abs().amax(dim=tuple(d for d in range(w.dim()) if d != 0))


def _range_in(w: torch.Tensor) -> torch.Tensor:
    return w.abs().amax(dim=tuple(d for d in range(w.dim()) if d != 1))


def _finite_or_one(s: torch.Tensor) -> torch.Tensor:
    """Scale 1 where a range was 0 (0/0, x/0) or anything else left no positive finite scale."""
    return torch.where(torch.isfinite(s) & (s > 0), s, torch.ones_like(s))


def _per_channel(v: torch.Tensor, w: torch.Tensor, dim: int) -> torch.Tensor:
    shape = [1] * w.dim()
    shape[dim] = -1
    return v.reshape(shape)


class ClsSetInfo:
    """One cross-layer set after scaling: its layer pairs with their scale factors (AIMET's class).

    Attributes:
        cls_pair_info_list: one :class:`ClsSetLayerPairInfo` for a pair of
            layers, two for conv → depthwise → conv.
    """

    class ClsSetLayerPairInfo:
        """Two consecutive scaled layers: ``layer1``'s output channel ``i`` was divided by ``scale_factor[i]``.

        ``relu_activation_between_layers`` is True when a ReLU/PReLU module sits
        between them (high-bias absorption then keeps the 3σ part of the bias);
        ``zero_padding_between_layers`` when a zero-padding op does (quanta
        looks through those; no absorption across them).
        """

        def __init__(self, layer1: nn.Module, layer2: nn.Module, scale_factor: np.ndarray,
                     relu_activation_between_layers: bool) -> None:
            self.layer1 = layer1
            self.layer2 = layer2
            self.scale_factor = scale_factor
            self.relu_activation_between_layers = relu_activation_between_layers
            self.zero_padding_between_layers = False  # set by scale_model: a pad op by zeros sits between

    def __init__(self, cls_pair_1: ClsSetLayerPairInfo, cls_pair_2: ClsSetLayerPairInfo | None = None) -> None:
        self.cls_pair_info_list = [cls_pair_1] if cls_pair_2 is None else [cls_pair_1, cls_pair_2]


def _check_set(cls_set: Sequence[nn.Module], size: int) -> None:
    if not isinstance(cls_set, (tuple, list)) or len(cls_set) != size:
        raise ValueError(f"cls_set must be a tuple of {size} layers, got {cls_set!r}")
    for layer in cls_set:
        if not isinstance(layer, _CLS_LAYERS):
            raise ValueError(f"cross-layer scaling supports Conv1d, Conv2d, ConvTranspose1d and ConvTranspose2d, "
                             f"got {type(layer).__name__}")


class CrossLayerScaling:
    """Cross-layer scaling of conv pairs and conv → depthwise → conv triples (AIMET's class; in place)."""

    @staticmethod
    def scale_cls_set_with_conv_layers(cls_set: Sequence[nn.Module]) -> np.ndarray:
        """Equalize ``(layer1, layer2)``; returns ``s = r1 / sqrt(r1 · r2)`` per channel (``layer1`` divided by it).

        >>> from torch import nn
        >>> a, b = nn.Conv2d(2, 3, 1, bias=False), nn.Conv2d(3, 2, 1, bias=False)
        >>> with torch.no_grad():
        ...     _ = a.weight.fill_(4.0), b.weight.fill_(1.0)
        >>> CrossLayerScaling.scale_cls_set_with_conv_layers((a, b))
        array([2., 2., 2.], dtype=float32)
        >>> float(a.weight.max()), float(b.weight.max())
        (2.0, 2.0)
        """
        _check_set(cls_set, 2)
        first, second = cls_set
        if _layer_type(second) is not ClsLayerType.Conv:
            raise ValueError(f"the second layer of a pair must be an ungrouped convolution, got groups="
                             f"{second.groups}")
        w0, w1 = _out_in(first), _out_in(second)
        if w0.shape[0] != w1.shape[1]:
            raise ValueError(f"layer1 has {w0.shape[0]} output channels but layer2 takes {w1.shape[1]} inputs")
        r0, r1 = _range_out(w0), _range_in(w1)
        s = _finite_or_one(r0 / torch.pow(r0 * r1, 0.5))
        with torch.no_grad():
            w0.mul_(_per_channel(1.0 / s, w0, 0))
            w1.mul_(_per_channel(s, w1, 1))
            if first.bias is not None:
                first.bias.mul_(1.0 / s)
        return s.cpu().numpy()

    @staticmethod
    def scale_cls_set_with_depthwise_layers(cls_set: Sequence[nn.Module]) -> tuple[np.ndarray, np.ndarray]:
        """Equalize conv → depthwise conv → conv; returns ``(s12, s23)`` (see the module docstring)."""
        _check_set(cls_set, 3)
        first, depthwise, last = cls_set
        if _layer_type(depthwise) is not ClsLayerType.DepthwiseConv:
            raise ValueError("the middle layer must be a depthwise convolution (groups == in_channels == "
                             f"out_channels), got groups={depthwise.groups}, in_channels={depthwise.in_channels}")
        if _layer_type(last) is not ClsLayerType.Conv:
            raise ValueError(f"the last layer must be an ungrouped convolution, got groups={last.groups}")
        w0, w1, w2 = _out_in(first), depthwise.weight.detach(), _out_in(last)
        if not w0.shape[0] == w1.shape[0] == w2.shape[1]:
            raise ValueError(f"channel counts differ: {w0.shape[0]} out of layer1, {w1.shape[0]} depthwise, "
                             f"{w2.shape[1]} into layer3")
        r0, r1, r2 = _range_out(w0), _range_out(w1), _range_in(w2)
        cube = torch.pow(r0 * r1 * r2, 1.0 / 3)
        s12, s23 = _finite_or_one(r0 / cube), _finite_or_one(cube / r2)
        with torch.no_grad():
            w0.mul_(_per_channel(1.0 / s12, w0, 0))
            w1.mul_(_per_channel(s12 * (1.0 / s23), w1, 0))
            w2.mul_(_per_channel(s23, w2, 1))
            if first.bias is not None:
                first.bias.mul_(1.0 / s12)
            if depthwise.bias is not None:
                depthwise.bias.mul_(1.0 / s23)
        return s12.cpu().numpy(), s23.cpu().numpy()

    @staticmethod
    def scale_cls_set(cls_set: Sequence[nn.Module]) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """A pair or a depthwise triple, whichever ``cls_set`` is."""
        if isinstance(cls_set, (tuple, list)) and len(cls_set) == 3:
            return CrossLayerScaling.scale_cls_set_with_depthwise_layers(cls_set)
        return CrossLayerScaling.scale_cls_set_with_conv_layers(cls_set)

    @staticmethod
    def scale_cls_sets(cls_sets: Sequence[Sequence[nn.Module]]) -> list:
        """:meth:`scale_cls_set` on each set, in order; their scale factors."""
        return [CrossLayerScaling.scale_cls_set(cls_set) for cls_set in cls_sets]

    @staticmethod
    def scale_model(model: nn.Module, input_shapes: Any = None, dummy_input: Any = None) -> list[ClsSetInfo]:
        """Scale every cross-layer set of ``model`` (found from a torch.fx trace); the sets with their factors."""
        args = _model_inputs(model, input_shapes, dummy_input, "CrossLayerScaling.scale_model")
        sets, padded_inputs = _find_cls_sets(model, args)
        infos = []
        for layers, relus in sets:
            factors = CrossLayerScaling.scale_cls_set(layers)
            if len(layers) == 2:
                factors = (factors,)
            pairs = [ClsSetInfo.ClsSetLayerPairInfo(layers[k], layers[k + 1], factors[k], relus[k])
                     for k in range(len(layers) - 1)]
            for pair in pairs:
                pair.zero_padding_between_layers = pair.layer2 in padded_inputs
            infos.append(ClsSetInfo(*pairs))
        return infos


class HighBiasFold:
    """High-bias absorption after cross-layer scaling (AIMET's class; in place)."""

    @staticmethod
    def bias_fold(cls_set_info_list: Sequence[ClsSetInfo], bn_layers: dict[nn.Module, nn.Module], *,
                  absorb_through_padding: bool = True) -> None:
        """Move the part of each ``layer1`` bias above 3σ into ``layer2``'s bias (see the module docstring).

        Args:
            cls_set_info_list: what :meth:`CrossLayerScaling.scale_model` returned.
            bn_layers: ``{layer: folded BatchNorm}`` for layers whose output a
                BatchNorm normalised; pairs whose ``layer1`` is not a key, or
                that lack a bias on either side, are left alone.
            absorb_through_padding: also absorb into a zero-padded ``layer2``
                (AIMET's behaviour, the default; changes the outputs near every
                border). False: only where the shift is exact.
        """
        if not isinstance(bn_layers, dict):
            raise TypeError(f"bn_layers must be a dict {{layer: BatchNorm}}, got {type(bn_layers).__name__}")
        if not isinstance(absorb_through_padding, bool):
            raise TypeError(f"absorb_through_padding must be a bool, got {absorb_through_padding!r}")
        for info in cls_set_info_list:
            for pair in info.cls_pair_info_list:
                bn = bn_layers.get(pair.layer1)
                if bn is None or pair.layer1.bias is None or pair.layer2.bias is None:
                    continue
                if bn.weight is None or bn.bias is None:  # affine=False: β = 0, nothing to absorb
                    continue
                if getattr(pair, "zero_padding_between_layers", False) or (
                        not absorb_through_padding and not _shift_reaches_every_output(pair.layer2)):
                    continue
                s = torch.as_tensor(np.asarray(pair.scale_factor), dtype=bn.bias.dtype, device=bn.bias.device)
                beta, gamma = bn.bias.detach() / s, bn.weight.detach() / s
                absorb = (beta - 3 * gamma.abs()).clamp_min(0) if pair.relu_activation_between_layers else beta
                w = _out_in(pair.layer2)
                per_in = w.flatten(2).sum(2) if w.dim() > 2 else w  # [out, in]: summed over the kernel window
                if _layer_type(pair.layer2) is ClsLayerType.DepthwiseConv:
                    correction = per_in.reshape(-1) * absorb
                else:
                    correction = per_in @ absorb
                with torch.no_grad():
                    pair.layer1.bias.sub_(absorb.to(pair.layer1.bias.dtype))
                    pair.layer2.bias.add_(correction.to(pair.layer2.bias.dtype))


def _shift_reaches_every_output(layer: nn.Module) -> bool:
    """Whether adding ``c`` to every input element adds the same ``W · c`` to every output (no zero borders)."""
    if isinstance(layer, _TRANSPOSED):  # outputs near the edges (or between strides) see only some kernel taps
        return all(k == 1 for k in layer.kernel_size) and all(st == 1 for st in layer.stride)
    if layer.padding_mode != "zeros" or layer.padding == "valid":
        return True
    if layer.padding == "same":
        return all(k == 1 for k in layer.kernel_size)
    return all(pad == 0 for pad in layer.padding)


_PAD_TARGETS = (torch.ops.aten.pad.default, torch.ops.aten.constant_pad_nd.default, torch.nn.functional.pad)


def _zero_padding(node: fx.Node, data: fx.Node) -> tuple[int, ...] | None:
    """The pad amounts if ``node`` pads ``data`` with zeros (constant mode, value 0), else None."""
    if node.op != "call_function" or node.target not in _PAD_TARGETS or not node.args or node.args[0] is not data:
        return None
    args = list(node.args[1:])
    pads = args[0] if args else node.kwargs.get("pad")
    mode = args[1] if len(args) > 1 else node.kwargs.get("mode", "constant")
    value = args[2] if len(args) > 2 else node.kwargs.get("value", 0.0)
    if node.target is torch.ops.aten.constant_pad_nd.default:
        mode, value = "constant", (args[1] if len(args) > 1 else node.kwargs.get("value", 0.0))
    if mode != "constant" or value not in (0, 0.0, None) or not isinstance(pads, (list, tuple)):
        return None
    if not all(isinstance(v, int) for v in pads):
        return None
    return tuple(pads)


# ------------------------------------------------------------------------------------------------ graph search
def _model_inputs(model: nn.Module, input_shapes: Any, dummy_input: Any, who: str) -> tuple:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if input_shapes is None and dummy_input is None:
        raise TypeError(f"{who}() needs input_shapes (a shape, or a list of shapes) or dummy_input")
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    return _inputs(input_shapes, dummy_input, device)


def _find_cls_sets(model: nn.Module, args: tuple
                   ) -> tuple[list[tuple[tuple[nn.Module, ...], tuple[bool, ...]]], set[nn.Module]]:
    """Cross-layer sets in model order, ``(layers, relu between each consecutive two)``, and the layers whose
    input came through zero padding (no high-bias absorption into those)."""
    graph = module_call_graph(model, args, "cross-layer equalization")
    own = single_use_modules(model, graph)

    def module_of(node: Any, kinds: tuple) -> nn.Module | None:
        """The module a node calls, if it is one of ``kinds``, used once, on one input, with its own parameters."""
        m = own(node)
        return m if isinstance(m, kinds) and len(node.args) == 1 and not node.kwargs else None

    def only_user(node: fx.Node) -> tuple[fx.Node | None, bool]:
        """The one node that uses ``node``'s output, past nn.Identity modules (a folded BatchNorm's place) and
        zero-padding ops (Hugging Face's TF-style "same" padding: scaling commutes with padding by zeros), and
        whether any of those ops padded."""
        padded = False
        while len(node.users) == 1:
            user = next(iter(node.users))
            pads = _zero_padding(user, node)
            if pads is not None:
                padded = padded or any(pads)
            elif module_of(user, (nn.Identity,)) is None:
                return user, padded
            node = user
        return None, padded

    def next_layer(node: fx.Node) -> tuple[fx.Node, bool, bool] | None:
        """``(layer, relu between, zero padding between)``: the layer this layer's output reaches alone."""
        relu, (user, padded) = False, only_user(node)
        if module_of(user, _CLS_ACTIVATIONS) is not None:
            relu, (user, more) = True, only_user(user)
            padded = padded or more
        return (user, relu, padded) if module_of(user, _CLS_LAYERS) is not None else None

    layer_nodes = [n for n in graph.nodes if module_of(n, _CLS_LAYERS) is not None]
    links = {n: next_layer(n) for n in layer_nodes}
    has_prev = {link[0] for link in links.values() if link is not None}
    sets, padded_inputs = [], set()
    for start in layer_nodes:
        if start in has_prev:
            continue
        chain, relus, node = [own(start)], [], start
        while links.get(node) is not None:
            node, relu, pad = links[node]
            chain.append(own(node))
            relus.append(relu)
            if pad:
                padded_inputs.add(chain[-1])
        sets += _chain_to_cls_sets(chain, relus)
    return sets, padded_inputs


def _chain_to_cls_sets(chain: list[nn.Module], relus: list[bool]) -> list[tuple[tuple[nn.Module, ...], tuple]]:
    """AIMET's sets from a chain: conv → conv, conv → depthwise → conv (the last conv then starts the next set),
    depthwise → conv; an unsupported layer (a grouped, non-depthwise convolution) breaks the chain."""
    kinds = [_layer_type(m) for m in chain]
    conv, dw = ClsLayerType.Conv, ClsLayerType.DepthwiseConv
    sets, i = [], 0
    while i < len(chain) - 1:
        a, b = kinds[i], kinds[i + 1]
        if a is conv and b is conv:
            sets.append(((chain[i], chain[i + 1]), (relus[i],)))
            i += 1
        elif a is conv and b is dw:
            if i + 2 < len(chain) and kinds[i + 2] is conv:
                sets.append(((chain[i], chain[i + 1], chain[i + 2]), (relus[i], relus[i + 1])))
                i += 2
            else:
                i += 1
        elif a is dw and b is conv:
            sets.append(((chain[i], chain[i + 1]), (relus[i],)))
            i += 1
        elif a is conv or a is dw:  # the next layer is unsupported (or a depthwise after a depthwise)
            i += 1 if b is dw else 2
        else:
            i += 1
    return sets


def _warn_relu6(model: nn.Module) -> None:
    names = [name for name, m in model.named_modules() if isinstance(m, nn.ReLU6)]
    if names:
        warnings.warn(f"cross-layer equalization does not scale across ReLU6 (it is not scale-equivariant): "
                      f"{len(names)} ReLU6 module(s) ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}) "
                      "end their chains. Replace them by nn.ReLU first if the model's accuracy allows (aimet-torch "
                      "before 2.4 did that silently)", UserWarning, stacklevel=3)


# ------------------------------------------------------------------------------------------------ entry points
def equalize_bn_folded_model(model: nn.Module, input_shapes: Any,
                             folded_pairs: Sequence[tuple[nn.Module, nn.Module]],
                             dummy_input: Any = None, *, absorb_through_padding: bool = True) -> list[ClsSetInfo]:
    """Cross-layer scaling and high-bias absorption on a model whose BatchNorms are already folded (in place).

    Args:
        model: the folded model.
        input_shapes: the input shape(s), or None with ``dummy_input``.
        folded_pairs: what :func:`~quanta.quantsim.fold_all_batch_norms`
            returned. Only pairs whose BatchNorm followed the layer feed high-bias
            absorption (a :class:`~quanta.quantsim.batch_norm_fold.FoldedPair`
            says which; plain ``(layer, bn)`` tuples are taken as layer → BN,
            as AIMET takes them).
        dummy_input: a tensor or tuple of tensors the model accepts.
        absorb_through_padding: absorb high biases into zero-padded layers too,
            as AIMET does (the default; see the module docstring). False keeps
            the float function: absorption only where it is exact.

    Returns:
        The scaled sets (AIMET returns None; the list is there to look at).

    Raises TypeError without inputs or for a model neither torch.export nor torch.fx captures, and
    RuntimeError (with the weights restored) if scaling changed the outputs.
    """
    args = _model_inputs(model, input_shapes, dummy_input, "equalize_bn_folded_model")
    bn_layers = {}
    for pair in folded_pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise TypeError(f"folded_pairs must hold (layer, bn) pairs, got {pair!r}")
        if getattr(pair, "bn_follows_layer", True):
            bn_layers[pair[0]] = pair[1]
    _warn_relu6(model)
    saved = {id(p): p.detach().clone() for p in model.parameters()}
    reference = _outputs(model, args)
    infos = CrossLayerScaling.scale_model(model, dummy_input=args)
    worst = _mismatch(reference, _outputs(model, args))
    if worst is not None:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(saved[id(p)])
        raise RuntimeError(f"cross-layer scaling changed the model's outputs ({worst}); the weights are restored")
    HighBiasFold.bias_fold(infos, bn_layers, absorb_through_padding=absorb_through_padding)
    return infos


def equalize_model(model: nn.Module, input_shapes: Any = None, dummy_input: Any = None, *,
                   absorb_through_padding: bool = True) -> None:
    """Cross-layer equalization of ``model``, in place: BN fold, cross-layer scaling, high-bias absorption.

    Args:
        model: the float model (in eval mode: BatchNorm statistics settled).
        input_shapes: the input shape, or a list of shapes (AIMET's argument;
            random inputs of these shapes drive the trace).
        dummy_input: a tensor or tuple of tensors the model accepts, instead.
        absorb_through_padding: absorb high biases into zero-padded layers too,
            reproducing aimet-torch's numbers exactly (the default; it moves
            every border output, see the module docstring). False absorbs only
            where the shift is exact, keeping the float function (better for
            weight-only quantization; AIMET's way is better for per-tensor W8A8).

    Raises TypeError without inputs or for a model neither torch.export nor torch.fx captures,
    ValueError for malformed ``input_shapes``, and RuntimeError (weights
    restored) if scaling would change the model's outputs.

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=8),
    ...                   nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    >>> equalize_model(m, input_shapes=(1, 3, 16, 16))
    >>> [type(layer).__name__ for layer in m]  # BatchNorms folded; conv -> depthwise -> conv scaled
    ['Conv2d', 'Identity', 'ReLU', 'Conv2d', 'Identity', 'ReLU', 'Conv2d']
    """
    args = _model_inputs(model, input_shapes, dummy_input, "equalize_model")
    with eval_mode(model):
        folded = fold_all_batch_norms(model, dummy_input=args)
        equalize_bn_folded_model(model, None, folded, dummy_input=args, absorb_through_padding=absorb_through_padding)
