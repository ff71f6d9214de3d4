"""AdaRound (AIMET's ``Adaround``): learn, weight by weight, whether to round up or down.

Rounding every weight to nearest minimises each weight's own error, not the
layer's output error; at 4 bits the difference costs accuracy. AdaRound (Nagel
et al., 2020) learns for every weight of a layer whether it goes to the floor
or the ceiling of its grid step, minimising the layer's output error on real
inputs plus a regulariser that drives every choice to 0 or 1
(:mod:`quanta.kernels.adaround` has the rounding)::

    loss = mean_i ‖f(x_i; QDQ_ada(W)) - f(x_i; W)‖²_(dim 1) + reg_param · Σ (1 - |2·h(alpha) - 1|^beta)

``x_i`` are the layer's inputs in the model whose earlier layers are already
adarounded (weights quantized, activations in float), ``f(x; W)`` the float
layer's output, passed through the activation that follows the layer when
there is one (ReLU, GELU, ...). ``beta`` falls from ``beta_range[0]`` to
``beta_range[1]`` on a cosine after ``warm_start`` of the iterations (during
which the regulariser is off); each iteration is one Adam step (lr 1e-3) on 32
inputs drawn at random. The quantization ranges are the weight quantizers' own
(computed from the weights before AdaRound) and stay fixed.

Layers are adarounded in the order the model runs them. Their inputs and float
outputs come from one pass over the captured graph, node after node over all
batches, with the float and the weight-quantized values side by side (values
no quantized weight has touched yet are held once): each layer's data is ready
when its turn comes, instead of running the model twice per layer as AIMET
does. When those values would not fit in memory, or the model was not
captured as a graph, the remaining layers stream: each layer's inputs are
collected by running the model up to that layer, batch after batch
(:mod:`quanta.quantsim.layer_data`).

Two ways in:

* :meth:`Adaround.apply_adaround` (AIMET's API): builds a sim with ``default_param_bw``-bit weights, adarounds
  it and returns a copy of the float model holding the adarounded weights, and writes the weight encodings
  (``<path>/<filename_prefix>.encodings``) to load and freeze in the sim you evaluate
  (:meth:`~quanta.quantsim.QuantizationSimModel.set_and_freeze_param_encodings`).
* :func:`apply_adaround`: adarounds an existing sim in place (any config: per-channel or per-block weights)
  and freezes its weight encodings.

>>> import torch
>>> from torch import nn
>>> from quanta.quantsim import QuantizationSimModel
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
>>> data = [torch.randn(64, 16) for _ in range(4)]
>>> sim = QuantizationSimModel(model, data[0], default_param_bw=4)
>>> sim.compute_encodings(data)
>>> params = AdaroundParameters(data, num_batches=4, default_num_iterations=200)
>>> report = apply_adaround(sim, params, progress=False)
>>> [layer.name for layer in report.layers]
['0', '2']
>>> all(layer.mse_adaround < layer.mse_nearest for layer in report.layers)
True
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from quanta.kernels.adaround import adarounded_qdq, hard_rounding, initial_alpha, rectified_sigmoid
from quanta.nn import QuantizationMixin
from quanta.nn.base import eval_mode, quantizers_off
from quanta.nn.functional import TransposedLinear
from quanta.quantization.affine import QuantizeDequantize
from quanta.quantization.affine.quantizer import AffineQuantizerBase
from quanta.quantsim import construction
from quanta.quantsim.layer_data import LayerData, LayerWalker, default_forward, model_inputs, run_order
from quanta._progress import make_bar
from quanta.quantsim.quantsim import QuantizationSimModel, _deepcopy
from quanta.quantsim.scheme import QuantScheme

__all__ = ["Adaround", "AdaroundLayerResult", "AdaroundParameters", "AdaroundReport",
           "AdaroundSupportedModules", "SAMPLES_PER_ITERATION", "apply_adaround"]

logger = logging.getLogger(__name__)

#: Layer types whose weights AdaRound learns to round (AIMET: Conv2d, ConvTranspose2d, Linear).
AdaroundSupportedModules = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
                            nn.ConvTranspose3d, TransposedLinear)

#: Activations whose output the reconstruction loss compares when one follows the layer (AIMET's list).
_ACTIVATIONS = (nn.ReLU6, nn.ReLU, nn.PReLU, nn.RReLU, nn.LeakyReLU, nn.Sigmoid, nn.LogSigmoid, nn.Softmin,
                nn.Softmax, nn.LogSoftmax, nn.Tanh, nn.Hardtanh, nn.ELU, nn.Hardshrink, nn.Hardsigmoid,
                nn.Hardswish, nn.SELU, nn.CELU, nn.GELU, nn.SiLU, nn.Mish, nn.Softplus, nn.Softshrink,
                nn.Softsign, nn.Tanhshrink, nn.Threshold, nn.GLU, nn.Softmax2d)

#: Inputs drawn (without replacement) for each optimisation step.
SAMPLES_PER_ITERATION = 32

_LEARNING_RATE = 1e-3  # Adam's default, as AIMET
_METRIC_SAMPLES = 256  # inputs on which a layer's output error is reported before and after


class AdaroundParameters:
    """What AdaRound learns from and how long (AIMET's ``AdaroundParameters``, same names and defaults).

    Args:
        data_loader: batches of model inputs (a DataLoader, a list...). A batch is passed to the model as
            AIMET does: a tensor as ``model(batch)``, a 2-tuple ``(inputs, labels)`` as ``model(inputs)`` (a
            tuple of inputs unpacked), a dict as ``model(**batch)``; other forms need ``forward_fn``.
        num_batches: how many batches to use (AIMET suggests about 2000 samples in all);
            ``len(data_loader)`` must be at least this when the loader has a length.
        default_num_iterations: optimisation steps per layer; None: 15000 if some weight has fewer than 8
            bits, else 10000 (AIMET's defaults).
        default_reg_param: weight of the rounding regulariser against the output error (0.01).
        default_beta_range: ``(start, end)`` of the regulariser's annealed exponent (``(20, 2)``).
        default_warm_start: share of the iterations before the regulariser starts (0.2).
        forward_fn: ``forward_fn(model, batch)`` runs one batch, for batches of other forms.

    >>> p = AdaroundParameters([torch.zeros(2, 3)] * 4, num_batches=2)
    >>> p.num_iterations, p.reg_param, p.beta_range, p.warm_start
    (None, 0.01, (20, 2), 0.2)
    """

    def __init__(
        self,
        data_loader: Iterable[Any],
        num_batches: int,
        default_num_iterations: int | None = None,
        default_reg_param: float = 0.01,
        default_beta_range: tuple[float, float] = (20, 2),
        default_warm_start: float = 0.2,
        forward_fn: Callable[[nn.Module, Any], Any] | None = None,
    ) -> None:
        if isinstance(data_loader, (torch.Tensor, str, bytes)) or not isinstance(data_loader, Iterable):
            raise TypeError(f"data_loader must be an iterable of batches (a DataLoader, a list), "
                            f"got {type(data_loader).__name__}")
        if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 1:
            raise ValueError(f"num_batches must be an int >= 1, got {num_batches!r}")
        if hasattr(data_loader, "__len__") and len(data_loader) < num_batches:  # type: ignore[arg-type]
            raise ValueError(f"num_batches={num_batches}: cannot fetch {num_batches} batches from a data_loader "
                             f"of length {len(data_loader)}")  # type: ignore[arg-type]
        if default_num_iterations is not None and (isinstance(default_num_iterations, bool) or not isinstance(
                default_num_iterations, int) or default_num_iterations < 1):
            raise ValueError(f"default_num_iterations must be None or an int >= 1, got {default_num_iterations!r}")
        if isinstance(default_reg_param, bool) or not isinstance(default_reg_param, (int, float)) \
                or not default_reg_param >= 0:
            raise ValueError(f"default_reg_param must be a number >= 0, got {default_reg_param!r}")
        try:
            start, end = (float(b) for b in default_beta_range)
        except (TypeError, ValueError):
            raise ValueError(f"default_beta_range must be (start_beta, end_beta), got {default_beta_range!r}") \
                from None
        if not (start > 0 and end > 0):
            raise ValueError(f"default_beta_range must hold two positive numbers, got {default_beta_range!r}")
        if isinstance(default_warm_start, bool) or not isinstance(default_warm_start, (int, float)) \
                or not 0 <= default_warm_start < 1:
            raise ValueError(f"default_warm_start must be a number in [0, 1), got {default_warm_start!r}")
        if forward_fn is not None and not callable(forward_fn):
            raise TypeError(f"forward_fn must be callable as forward_fn(model, batch), got {type(forward_fn).__name__}")
        self.data_loader = data_loader
        self.num_batches = num_batches
        self.num_iterations = default_num_iterations
        self.reg_param = default_reg_param
        self.beta_range = tuple(default_beta_range)
        self.warm_start = default_warm_start
        self.forward_fn = forward_fn


@dataclass
class AdaroundLayerResult:
    """One adarounded layer: its output error (mean squared, after the following activation if any, on up to
    256 of its inputs) with weights rounded to nearest and with the learned rounding."""

    name: str
    mse_nearest: float
    mse_adaround: float
    num_iterations: int
    seconds: float
    activation: str | None = None


@dataclass
class AdaroundReport:
    """What :func:`apply_adaround` did: per layer results in the order they were adarounded, and how the
    layers' data was collected (``"graph"``: one pass over the captured graph; ``"stream"``: the model run up
    to each layer; ``"graph+stream"``: graph until memory ran short)."""

    layers: list[AdaroundLayerResult] = field(default_factory=list)
    collection: str = "graph"
    seconds: float = 0.0

    def __str__(self) -> str:
        rows = [f"{'layer':<40} {'MSE nearest':>12} {'MSE adaround':>12} {'ratio':>7} {'s':>7}"]
        for r in self.layers:
            ratio = r.mse_adaround / r.mse_nearest if r.mse_nearest > 0 else float("nan")
            rows.append(f"{r.name:<40} {r.mse_nearest:>12.4g} {r.mse_adaround:>12.4g} {ratio:>7.3f} "
                        f"{r.seconds:>7.1f}")
        rows.append(f"{len(self.layers)} layers in {self.seconds:.1f} s (data: {self.collection})")
        return "\n".join(rows)


# ----------------------------------------------------------------------------------- the optimisation
def _beta(num_iterations: int, iteration: int, beta_range: tuple[float, float], warm_start: float) -> float:
    """The regulariser's exponent: cosine from ``beta_range[0]`` (end of warm start) to ``beta_range[1]``."""
    start, end = beta_range
    warm_end = warm_start * num_iterations
    rel = (iteration - warm_end) / (num_iterations - warm_end)
    return end + 0.5 * (start - end) * (1 + np.cos(rel * np.pi))  # numpy's cos, as AIMET (same bits)


def _reconstruction_loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """AIMET's ``mean(‖out - target‖²)`` with the norm over dim 1 (channels / features)."""
    return (torch.norm(out - target, p="fro", dim=1) ** 2).mean()


def _expanded(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A per-tensor/channel/block scale or offset repeated to the weight's ``shape``."""
    for dim, (n, size) in enumerate(zip(t.shape, shape)):
        if n not in (1, size):
            t = t.repeat_interleave(size // n, dim=dim)
    return t.expand(shape)


_CONV_TRANSPOSE = {nn.ConvTranspose1d: torch.nn.functional.conv_transpose1d,
                   nn.ConvTranspose2d: torch.nn.functional.conv_transpose2d,
                   nn.ConvTranspose3d: torch.nn.functional.conv_transpose3d}


def _float_forward(module: nn.Module, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What the float layer computes on ``x`` with ``weight`` in place of its own: the torch function its float
    class calls, directly (this runs once per optimisation step; a module call costs more than small layers)."""
    bias = module.bias
    if isinstance(module, nn.Linear):
        return torch.nn.functional.linear(x, weight, bias)
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return module._conv_forward(x, weight, bias)
    if isinstance(module, TransposedLinear):
        y = x.reshape(-1, x.shape[-1])
        y = torch.mm(y, weight) if bias is None else torch.addmm(bias, y, weight)
        return y.reshape(*x.shape[:-1], weight.shape[1])
    for cls, op in _CONV_TRANSPOSE.items():
        if isinstance(module, cls):
            if module.padding_mode != "zeros":
                raise ValueError(f"{type(module).__name__}: only zeros padding is supported")
            return op(x, weight, bias, module.stride, module.padding, module.output_padding, module.groups,
                      module.dilation)
    raise TypeError(f"AdaRound does not support {type(module).__name__}")  # pragma: no cover - filtered before


class _Layer:
    """One layer's AdaRound state: its float weight split into ``floor(w/s)`` and the learned ``alpha``."""

    def __init__(self, name: str, module: QuantizationMixin, activation: nn.Module | None) -> None:
        q = module.param_quantizers["weight"]
        w = module.weight.detach()
        self.name, self.module, self.activation = name, module, activation
        self.dtype = w.dtype
        w = w.float()
        self.scale = _expanded(q.get_scale(torch.float32).detach(), w.shape)
        self.offset = _expanded(q.get_offset(torch.float32).detach(), w.shape)
        self.qmin, self.qmax = q.qmin, q.qmax
        self.floor = torch.floor(w / self.scale)
        self.alpha = nn.Parameter(initial_alpha(w, self.scale))

    def weight(self, soft: bool) -> torch.Tensor:
        h = rectified_sigmoid(self.alpha) if soft else hard_rounding(self.alpha)
        return adarounded_qdq(self.floor, h, self.scale, self.offset, self.qmin, self.qmax)

    def output(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """The float layer on ``x`` with ``weight`` (and its own bias), then the activation."""
        y = _float_forward(self.module, x, weight.to(self.dtype))
        return y if self.activation is None else self.activation(y)

    def mse(self, x: torch.Tensor, target: torch.Tensor, soft: bool) -> float:
        with torch.no_grad():
            return float(torch.nn.functional.mse_loss(self.output(x, self.weight(soft)), target))


def _samples(name: str, module: nn.Module, inputs: list[torch.Tensor], outputs: list[torch.Tensor]
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """All batches' inputs and float outputs of a layer, one sample per row of dim 0 (as AIMET concatenates
    them). Batches whose shapes differ beyond dim 0 (padded to different sequence lengths) are concatenated
    token by token for a Linear layer, whose every token is a sample of its own."""
    if all(x.shape[1:] == inputs[0].shape[1:] for x in inputs):
        return torch.cat(inputs), torch.cat(outputs)
    if isinstance(module, (nn.Linear, TransposedLinear)):
        return (torch.cat([x.reshape(-1, x.shape[-1]) for x in inputs]),
                torch.cat([y.reshape(-1, y.shape[-1]) for y in outputs]))
    shapes = sorted({tuple(x.shape[1:]) for x in inputs})
    raise ValueError(f"adaround: the inputs of {name} differ in shape between batches {shapes}; give batches of "
                     "one shape")


def _optimize(layer: _Layer, inputs: torch.Tensor, targets: torch.Tensor, params: AdaroundParameters,
              num_iterations: int, soft_weights: bool = False) -> AdaroundLayerResult:
    """Learn ``layer.alpha`` on ``inputs`` (the quantized model's) against ``targets`` (the float layer's
    outputs), then write the adarounded weight into the layer: the hard-rounded one (on the grid), or with
    ``soft_weights`` the soft-rounded one as AIMET writes it (its weight quantizer rounds it to the same
    grid values wherever ``h(alpha)`` is not exactly 1/2)."""
    begin = time.perf_counter()
    with torch.no_grad():
        if layer.activation is not None:
            targets = layer.activation(targets)
    n = min(inputs.shape[0], _METRIC_SAMPLES)
    mse_nearest = layer.mse(inputs[:n], targets[:n], soft=False)
    optimizer = torch.optim.Adam([layer.alpha], lr=_LEARNING_RATE)
    warm_end = num_iterations * params.warm_start
    with torch.enable_grad():
        for iteration in range(num_iterations):
            pick = torch.randperm(inputs.shape[0])[:SAMPLES_PER_ITERATION]
            optimizer.zero_grad()
            loss = _reconstruction_loss(layer.output(inputs[pick], layer.weight(soft=True)), targets[pick])
            if iteration >= warm_end:
                h = rectified_sigmoid(layer.alpha)
                beta = _beta(num_iterations, iteration, params.beta_range, params.warm_start)
                loss = loss + params.reg_param * (1 - (2 * h - 1).abs().pow(beta)).sum()
            loss.backward()
            optimizer.step()
    mse_adaround = layer.mse(inputs[:n], targets[:n], soft=False)
    with torch.no_grad():
        layer.module.weight.copy_(layer.weight(soft=soft_weights).to(layer.dtype))
    act = None if layer.activation is None else type(layer.activation).__name__
    return AdaroundLayerResult(layer.name, mse_nearest, mse_adaround, num_iterations,
                               time.perf_counter() - begin, act)


# ----------------------------------------------------------------------------------- collecting the data
# ----------------------------------------------------------------------------------- entry points
def _following_activations(sim: QuantizationSimModel) -> dict[str, nn.Module]:
    """``{layer name: activation module}`` where the first op reading the layer's output is an activation."""
    graph = sim._prepared.graph
    if graph is None:
        return {}
    modules = dict(sim.model.named_modules())
    found: dict[str, nn.Module] = {}
    for node in graph.nodes:
        if node.op != "call_module" or not isinstance(modules.get(node.target), AdaroundSupportedModules):
            continue
        users = list(node.users)
        if users and users[0].op == "call_module" and isinstance(act := modules.get(users[0].target), _ACTIVATIONS):
            found.setdefault(str(node.target), act)
    return found


def _adaroundable(sim: QuantizationSimModel) -> list[tuple[str, QuantizationMixin]]:
    """The sim's layers AdaRound applies to: a supported type with an integer weight quantizer, and a weight of
    its own (AdaRound writes the rounded weight into the parameter: a tied one, such as GPT-2's ``lm_head`` and
    token embedding, would change the other module too)."""
    holders: dict[int, list[str]] = {}
    for name, module in sim.model.named_modules():
        for p in module.parameters(recurse=False):
            holders.setdefault(id(p), []).append(name)
    found = []
    for name, module in sim.model.named_modules():
        if not isinstance(module, QuantizationMixin) or not isinstance(module, AdaroundSupportedModules):
            continue
        q = module.param_quantizers["weight"] if "weight" in module.param_quantizers else None
        if q is None:
            continue
        if not isinstance(q, AffineQuantizerBase):
            logger.warning("adaround: %s has a %s weight quantizer (not an integer grid); left as it is",
                           name, type(q).__name__)
            continue
        if not q.is_initialized():
            raise RuntimeError(f"the weight quantizer of {name} has no encoding; compute the parameter encodings "
                               "first (sim.compute_encodings)")
        others = [n for n in holders.get(id(module.weight), ()) if n != name]  # computed weights: own
        if others:
            warnings.warn(f"adaround: {name} left at nearest rounding: its weight is tied to {', '.join(others)}, "
                          "which writing the rounded weight would change too", UserWarning, stacklevel=4)
            continue
        found.append((name, module))
    return found


def apply_adaround(sim: QuantizationSimModel, params: AdaroundParameters, *, progress: bool = True
                   ) -> AdaroundReport:
    """AdaRound every supported layer of ``sim`` in place and freeze its weight encodings.

    The weight quantizers must have their encodings (``sim.compute_encodings``, or loaded ones): AdaRound
    learns the rounding within those ranges, per tensor, channel or block. The float weights of ``sim.model``
    are replaced by the adarounded ones (on the grid, so the weight quantizers reproduce them exactly) and
    the weight encodings are frozen (a later ``compute_encodings`` keeps them). Activation quantizers play no
    part (they are off while AdaRound runs) and are left as they were: calibrate them afterwards.

    Args:
        sim: a :class:`~quanta.quantsim.QuantizationSimModel`.
        params: the data and schedule (:class:`AdaroundParameters`).
        progress: a bar per layer (tqdm or rich, when installed).

    Returns:
        An :class:`AdaroundReport` with every layer's output error before and after.

    Raises TypeError for arguments of the wrong type, ValueError when ``sim`` has no layer to adaround or the
    data loader yields no batch, RuntimeError for a weight quantizer without an encoding (nothing is changed
    then). Torch's random generator draws the samples: seed it for a repeatable result.
    """
    if not isinstance(sim, QuantizationSimModel):
        raise TypeError(f"sim must be a QuantizationSimModel, got {type(sim).__name__}")
    if not isinstance(params, AdaroundParameters):
        raise TypeError(f"params must be AdaroundParameters, got {type(params).__name__}")
    return _adaround(sim, params, progress=progress, soft_weights=False)


def _adaround(sim: QuantizationSimModel, params: AdaroundParameters, *, progress: bool, soft_weights: bool
              ) -> AdaroundReport:
    begin = time.perf_counter()
    layers = _adaroundable(sim)
    if not layers:
        raise ValueError("sim has no layer AdaRound applies to (Linear / Conv / ConvTranspose with an integer "
                         "weight quantizer)")
    num_iterations = params.num_iterations
    if num_iterations is None:  # AIMET's defaults
        num_iterations = 15000 if min(m.param_quantizers["weight"].bitwidth for _, m in layers) < 8 else 10000
    batches = list(itertools.islice(params.data_loader, params.num_batches))
    if not batches:
        raise ValueError("AdaroundParameters.data_loader yielded no batches")
    forward = params.forward_fn or default_forward
    qmodules = [m for m in sim.model.modules() if isinstance(m, QuantizationMixin)]
    report = AdaroundReport()
    activations = _following_activations(sim)
    with eval_mode(sim.model), quantizers_off(qmodules, params=False), torch.no_grad():
        calls = model_inputs(sim.model, batches, forward)
        layers, following = run_order(sim.model, layers, calls[0], _ACTIVATIONS)
        if sim._prepared.graph is None:  # no graph to read the consumers from: what the forward pass showed
            activations = following
        bar = make_bar(len(layers), enabled=progress, desc="adaround", unit="layer")

        def visit(name: str, module: QuantizationMixin, data: LayerData) -> None:
            bar.set_description(f"adaround {name}")
            layer = _Layer(name, module, activations.get(name))
            inputs, targets = _samples(name, module, data.quant_inputs, data.float_outputs)  # type: ignore[arg-type]
            with quantizers_off([module] if layer.activation is None else [module, layer.activation]):
                result = _optimize(layer, inputs, targets, params, num_iterations, soft_weights)
            logger.info("adaround %s: output MSE %.4g (nearest) -> %.4g", name, result.mse_nearest,
                        result.mse_adaround)
            report.layers.append(result)
            bar.advance()

        walker = LayerWalker(sim.model, sim._prepared.graph, layers, calls, float_outputs=True,
                             keep_float_weights=True)
        try:
            report.collection = walker.run(visit)
        finally:
            bar.close()
    for _, module in layers:
        q = module.param_quantizers["weight"]
        q.allow_overwrite(False)
        for p in q.parameters(recurse=False):
            p.requires_grad_(False)
    report.seconds = time.perf_counter() - begin
    return report


def _compute_param_encodings(sim: QuantizationSimModel) -> None:
    with torch.no_grad():
        for module in sim.qmodules():
            for pname, q in module.param_quantizers.items():
                if q is not None:
                    with q.compute_encodings():
                        q(getattr(module, pname))


def _write_param_encodings(sim: QuantizationSimModel, layers: Iterable[str], path: str) -> None:
    """AIMET's AdaRound file: ``{"param_encodings": {"<layer>.weight": [0.6.1 entries]}}`` (per-block weights,
    which 0.6.1 cannot hold, as version 1.0.0)."""
    from quanta.export.encodings import EncodingsVersion, encodings_to_dict, write_json

    params, symmetric = {}, {}
    for name in layers:
        q = sim.model.get_submodule(name).param_quantizers["weight"]
        params[f"{name}.weight"] = q.get_encodings()
        symmetric[f"{name}.weight"] = q.symmetric
    try:
        doc = encodings_to_dict({}, params, EncodingsVersion.V0_6_1, symmetric=symmetric)
        doc = {"param_encodings": doc["param_encodings"]}
    except ValueError:
        doc = encodings_to_dict({}, params, EncodingsVersion.V1_0_0, symmetric=symmetric)
        doc = {"version": doc["version"], "param_encodings": doc["param_encodings"]}
    write_json(path, doc)


class Adaround:
    """AIMET's ``Adaround`` (``aimet_torch.adaround``): see the module docstring.

    >>> import os, tempfile
    >>> import torch
    >>> from torch import nn
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3)).eval()
    >>> data = [torch.randn(8, 3, 12, 12) for _ in range(2)]
    >>> params = AdaroundParameters(data, num_batches=2, default_num_iterations=50)
    >>> out = tempfile.mkdtemp()
    >>> ada_model = Adaround.apply_adaround(model, data[0], params, path=out, filename_prefix="adaround",
    ...                                     default_param_bw=4)
    >>> sorted(json.load(open(os.path.join(out, "adaround.encodings")))["param_encodings"])
    ['0.weight', '2.weight']
    >>> sim = QuantizationSimModel(ada_model, data[0], default_param_bw=4)
    >>> sim.set_and_freeze_param_encodings(os.path.join(out, "adaround.encodings"))
    """

    @classmethod
    def apply_adaround(
        cls,
        model: nn.Module,
        dummy_input: torch.Tensor | tuple[torch.Tensor, ...],
        params: AdaroundParameters,
        path: str | os.PathLike,
        filename_prefix: str,
        default_param_bw: int = 4,
        param_bw_override_list: Sequence[tuple[nn.Module, int]] | None = None,
        ignore_quant_ops_list: Sequence[nn.Module] | None = None,
        default_quant_scheme: QuantScheme | str = "post_training_tf_enhanced",
        default_config_file: str | os.PathLike | Mapping | None = None,
    ) -> nn.Module:
        """A copy of ``model`` with adarounded weights; writes ``<path>/<filename_prefix>.encodings``.

        Args:
            model: the float model (not modified).
            dummy_input: an input ``model`` accepts (for capturing it).
            params: the data and schedule (:class:`AdaroundParameters`).
            path: directory of the encodings file (created if missing).
            filename_prefix: the file is ``<filename_prefix>.encodings``.
            default_param_bw: weight bitwidth (4 by default, as AIMET).
            param_bw_override_list: ``(module of model, bitwidth)`` pairs for layers of another bitwidth.
            ignore_quant_ops_list: modules of ``model`` left unquantized and not adarounded.
            default_quant_scheme: how the weight ranges are computed (AIMET's names accepted): SQNR
                (``"post_training_tf_enhanced"``, AIMET's default) or min-max (``"post_training_tf"``).
            default_config_file: the sim's config (see :class:`~quanta.quantsim.QuantizationSimModel`);
                None: quanta's default (per-channel weights).

        Returns:
            A deep copy of ``model`` whose adarounded layers hold their adarounded weights. Build the sim you
            evaluate from it with the same bitwidths and config, and load the file with
            :meth:`~quanta.quantsim.QuantizationSimModel.set_and_freeze_param_encodings` before
            ``compute_encodings`` (the encodings file fixes the ranges the rounding was learned in).
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if not isinstance(filename_prefix, str) or not filename_prefix or os.sep in filename_prefix:
            raise ValueError(f"filename_prefix must be a non-empty file name without '{os.sep}', "
                             f"got {filename_prefix!r}")
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a directory path, got {type(path).__name__}")
        if not isinstance(params, AdaroundParameters):
            raise TypeError(f"params must be AdaroundParameters, got {type(params).__name__}")
        names = {id(m): n for n, m in model.named_modules()}

        def name_of(module: Any, what: str) -> str:
            if not isinstance(module, nn.Module) or id(module) not in names:
                raise ValueError(f"{what} must hold modules of model, got {module!r:.80}")
            return names[id(module)]

        overrides = []
        for entry in param_bw_override_list or ():
            if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
                raise ValueError(f"param_bw_override_list must hold (module, bitwidth) pairs, got {entry!r:.80}")
            module, bw = entry
            if isinstance(bw, bool) or not isinstance(bw, int) or not 1 <= bw <= 32:
                raise ValueError(f"param_bw_override_list: bitwidth must be an int in [1, 32], got {bw!r}")
            overrides.append((name_of(module, "param_bw_override_list"), bw))
        ignored = [name_of(m, "ignore_quant_ops_list") for m in ignore_quant_ops_list or ()]

        # the scheme computes the weight ranges (AIMET's sim applies it to parameters too)
        sim = QuantizationSimModel(model, dummy_input, quant_scheme=default_quant_scheme,
                                   default_param_bw=default_param_bw, config_file=default_config_file,
                                   param_quant_scheme=default_quant_scheme)
        for name, bw in overrides:
            try:
                module = sim.model.get_submodule(name)
            except AttributeError:
                raise ValueError(f"param_bw_override_list: {name} is not a quantized layer of the sim") from None
            q = module.param_quantizers["weight"] if isinstance(module, QuantizationMixin) \
                and "weight" in module.param_quantizers else None
            if q is None:
                raise ValueError(f"param_bw_override_list: {name} has no weight quantizer")
            if type(q) is not QuantizeDequantize:
                raise ValueError(f"param_bw_override_list: cannot change the bitwidth of a {type(q).__name__}")
            module.param_quantizers["weight"] = construction.with_bitwidth(q, bw)
        excluded = []
        for name in ignored:
            with contextlib.suppress(AttributeError):
                excluded.append(sim.model.get_submodule(name))
        if excluded:
            sim.exclude_layers_from_quantization(excluded)
        _compute_param_encodings(sim)
        report = _adaround(sim, params, progress=True, soft_weights=True)  # the weights AIMET returns
        logger.info("adaround:\n%s", report)

        directory = os.fspath(path)
        os.makedirs(directory, exist_ok=True)
        done = [r.name for r in report.layers]
        _write_param_encodings(sim, done, os.path.join(directory, f"{filename_prefix}.encodings"))

        result = _deepcopy(model)
        own = dict(result.named_parameters())
        with torch.no_grad():
            for name in done:
                key = f"{name}.weight"
                if key not in own:
                    raise RuntimeError(f"adaround: the copy of the model has no parameter {key}")
                own[key].copy_(sim.model.get_submodule(name).weight)
        return result

    @classmethod
    def apply_adaround_with_cache(
        cls,
        model: nn.Module,
        dummy_input: torch.Tensor | tuple[torch.Tensor, ...],
        params: AdaroundParameters,
        path: str | os.PathLike,
        filename_prefix: str,
        default_param_bw: int = 4,
        param_bw_override_list: Sequence[tuple[nn.Module, int]] | None = None,
        ignore_quant_ops_list: Sequence[nn.Module] | None = None,
        default_quant_scheme: QuantScheme | str = "post_training_tf_enhanced",
        default_config_file: str | os.PathLike | Mapping | None = None,
        checkpoints_config: str | os.PathLike | None = None,
    ) -> nn.Module:
        """AIMET's variant of :meth:`apply_adaround` for models whose layer data do not fit: it caches each
        block's outputs as ``checkpoints_config`` (AIMET's JSON file of ``grouped_modules``) splits the model.

        quanta's layer data already come from one pass over the captured graph and stream past a memory budget
        whatever the call, so this is :meth:`apply_adaround` with the same arguments and result: the file is
        required and read, as AIMET requires it, and its split is not needed (a warning says so).

        Raises ValueError without ``checkpoints_config``, for a file that is not AIMET's JSON with a
        ``grouped_modules`` object, or one naming a module ``model`` lacks; otherwise as :meth:`apply_adaround`.
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if checkpoints_config is None:
            raise ValueError("apply_adaround_with_cache needs checkpoints_config, the path of AIMET's checkpoints "
                             "JSON file (or call apply_adaround, which needs none)")
        if not isinstance(checkpoints_config, (str, os.PathLike)):
            raise TypeError(f"checkpoints_config must be a file path, got {type(checkpoints_config).__name__}")
        try:
            with open(checkpoints_config, encoding="utf-8") as f:
                groups = json.load(f)["grouped_modules"]
            names = [n for block in dict(groups).values() for n in block]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"checkpoints_config {os.fspath(checkpoints_config)!r} is not AIMET's checkpoints "
                             f"file (a JSON object with 'grouped_modules'): {e}") from None
        modules = dict(model.named_modules())
        unknown = [n for n in names if n not in modules]
        if unknown:
            raise ValueError(f"checkpoints_config names modules model lacks: {', '.join(unknown[:5])}")
        warnings.warn("apply_adaround_with_cache: the checkpoints split is not needed (quanta collects every "
                      "layer's data in one pass over the captured graph, streaming past its memory budget); "
                      "running apply_adaround", UserWarning, stacklevel=2)
        return cls.apply_adaround(model, dummy_input, params, path, filename_prefix, default_param_bw,
                                  param_bw_override_list, ignore_quant_ops_list, default_quant_scheme,
                                  default_config_file)
