"""Fold a simulated BatchNorm into its layer's weight *and weight encoding* (AIMET's ``fold_all_batch_norms_to_scale``).

A sim built on an unfolded model keeps Conv/Linear → BatchNorm as two modules (the BatchNorm's output
quantizer standing for the pair, see :mod:`quanta.quantsim.placement`), which is how QAT trains with batch
statistics. To deploy, the BatchNorm has to go into the layer. Folding it into the weights alone would move them
off the grid the sim calibrated (or trained): with ``r = γ / sqrt(running_var + eps)`` per output channel,
``W' = r·W`` and ``b' = r·(b − running_mean) + β``, and the weight range follows: ``[min, max] → [r·min, r·max]``
(``[r·max, r·min]`` where ``r < 0``), so each quantized weight is ``r`` times the one before (the same integer
code, negated where ``r < 0``: ``round(W'/(|r|·s)) = ±round(W/s)``) and the folded layer computes what the sim
computed, to float rounding. One exception, AIMET's too: on a signed symmetric grid ``[-2^(b-1), 2^(b-1) - 1]`` a
weight at the bottom code of a channel with ``r < 0`` would need ``2^(b-1)``, and takes the top code, one step
less.

Which pairs fold: a layer (Conv1d/2d/3d, ConvTranspose with ``groups == 1``, Linear) whose only user is a
BatchNorm with running statistics, both quantized modules of ``sim.model``, the layer's own output not quantized
(the BatchNorm's output quantizer covers the pair; it moves to the layer), its bias not quantized, and its
weight quantizer an affine one with one range per output channel (or per block of one: a per-tensor range cannot
take a factor per channel). A pair that fails a condition is left as it is, with a warning that says why
(AIMET: a log line). The BatchNorm becomes ``nn.Identity``.

>>> import torch
>>> from torch import nn
>>> from quanta.quantsim import QuantizationSimModel
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).eval()
>>> x = torch.randn(4, 3, 8, 8)
>>> sim = QuantizationSimModel(model, x)  # unfolded: the BatchNorm is simulated
>>> sim.compute_encodings([x], progress=False)
>>> before = sim.model(x)
>>> pairs = fold_all_batch_norms_to_scale(sim)
>>> [(type(layer).__name__, type(bn).__name__) for layer, bn in pairs]
[('QuantizedConv2d', 'QuantizedBatchNorm2d')]
>>> type(sim.model.get_submodule("1")).__name__
'Identity'
>>> torch.allclose(sim.model(x), before, atol=1e-5)
True
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from quanta.nn.base import QuantizationMixin
from quanta.quantization.affine import AffineQuantizerBase
from quanta.quantsim.batch_norm_fold import (
    _CONV_T,
    FoldedPair,
    _fold_backward,
    _replace,
    _scale_shift,
    layer_bn_nodes,
    single_use_modules,
)
from quanta.quantsim.quantsim import QuantizationSimModel

__all__ = ["fold_all_batch_norms_to_scale"]


def _why_not(layer: nn.Module, bn: nn.Module) -> str | None:
    """Why ``layer → bn`` cannot fold into the weight encoding, or None if it can."""
    if not (isinstance(layer, QuantizationMixin) and isinstance(bn, QuantizationMixin)):
        return "both modules must be quantized modules of the sim"
    if layer.output_quantizers[0] is not None:
        return "the layer's output is quantized (the BatchNorm must share its supergroup)"
    if layer.param_quantizers._modules.get("bias") is not None:
        return "the layer's bias is quantized"
    if isinstance(layer, _CONV_T) and layer.groups != 1:
        return "a grouped ConvTranspose"
    q = layer.param_quantizers._modules.get("weight")
    if q is None:
        return "the layer's weight is not quantized"
    if not isinstance(q, AffineQuantizerBase):
        return f"the weight quantizer is a {type(q).__name__}, not an affine quantizer"
    channels = layer.weight.shape[layer._weight_axis()]
    if channels > 1 and (len(q.shape) <= layer._weight_axis() or q.shape[layer._weight_axis()] != channels):
        return f"the weight range is not per output channel (shape {tuple(q.shape)}; {channels} channels)"
    return None


def _scale_range(layer: QuantizationMixin, r: torch.Tensor) -> None:
    """``[min, max] → [r·min, r·max]`` per output channel (ends swapped where ``r < 0``)."""
    q = layer.param_quantizers["weight"]
    if not q.is_initialized():
        return  # calibration will see the folded weights
    view = [1] * len(q.shape)  # () per tensor: r has one element then
    if view:
        view[layer._weight_axis()] = -1
    r = r.to(q.min.dtype).reshape(view)
    lo, hi = q.min.detach() * r, q.max.detach() * r
    q.set_range(torch.minimum(lo, hi), torch.maximum(lo, hi))


def fold_all_batch_norms_to_scale(sim: QuantizationSimModel) -> list[FoldedPair]:
    """Fold every simulated Conv/Linear → BatchNorm pair of ``sim`` into the layer's weight and weight range.

    In place on ``sim.model`` (see the module docstring for the formula and the conditions).

    Args:
        sim: a :class:`~quanta.quantsim.QuantizationSimModel` built on a model whose BatchNorms were not folded
            (calibrated or not; an uncalibrated weight range is left to calibration).

    Returns:
        The folded ``(layer, bn)`` pairs (quantized modules; ``bn`` is no longer in the model).

    Raises TypeError if ``sim`` is not a QuantizationSimModel or was not captured as a graph (AIMET: an
    assertion).
    """
    if not isinstance(sim, QuantizationSimModel):
        raise TypeError(f"sim must be a QuantizationSimModel, got {type(sim).__name__}")
    graph = sim._prepared.graph
    if graph is None:
        raise TypeError("fold_all_batch_norms_to_scale needs a sim whose model was captured as a graph "
                        f"(this one: {sim.capture_method}, {'; '.join(sim.capture_errors.values())})")
    module = single_use_modules(sim.model, graph)
    names = {id(m): n for n, m in sim.model.named_modules()}
    pairs: list[FoldedPair] = []
    for src, node in layer_bn_nodes(graph, module):
        layer, bn = module(src), module(node)
        reason = _why_not(layer, bn)
        if reason is not None:
            warnings.warn(f"fold_all_batch_norms_to_scale: {names[id(bn)]} not folded into {names[id(layer)]}: "
                          f"{reason}", UserWarning, stacklevel=2)
            continue
        r, _ = _scale_shift(bn)
        with torch.no_grad():
            _fold_backward(layer, bn)
            if "bias" not in layer.param_quantizers:  # the fold gave the layer a bias: unquantized, as AIMET's
                layer.param_quantizers["bias"] = None
            _scale_range(layer, r)
        layer.output_quantizers[0] = bn.output_quantizers[0]
        _replace(sim.model, names[id(bn)], nn.Identity())
        pairs.append(FoldedPair(layer, bn, bn_follows_layer=True))
    return pairs
