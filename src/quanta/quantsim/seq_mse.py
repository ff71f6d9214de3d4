"""Sequential MSE (AIMET's ``apply_seq_mse``): weight ranges chosen for the layer's output, layer after layer.

A min-max weight range keeps every weight but spends the grid on the largest
ones; at 4 bits a narrower range (clipping a few weights) often gives a smaller
*output* error. Sequential MSE searches, for every output channel (and every
block of input channels, for per-block weights), ``num_candidates`` ranges
``k/n · [min, max]`` (``k = 1..n``, ``[min, max]`` the weight quantizer's
min-max range) and keeps the one of least output error on real inputs::

    loss_k = Σ_batches Σ_samples (F(x, W_k^q) - F(x, W))²     per output channel (and input block)

``F`` is the layer without its bias; ``W_k^q`` the weights fake-quantized with
the candidate range (AIMET's symmetric/asymmetric min-max of ``k/n · [min, max]``).
``x`` is the layer's input in the model whose earlier layers already have their
chosen ranges (weights quantized, activations in float): ``inp_symmetry="symqt"``
(the default); ``"symfp"`` takes the float model's input for both terms,
``"asym"`` the float input for ``F(x, W)`` and the quantized one for the other.
``loss_fn`` may also be ``"l1"`` or ``"sqnr"`` (the negative SQNR in dB).

As in AIMET, only Linear and Conv layers whose weights have at most 4 bits are
searched; activation quantizers and the weight quantizers of other layers are off
during the search and restored after it. The chosen ranges are frozen: calibrate
the activations afterwards with ``sim.compute_encodings``. The layers' data come
from :mod:`quanta.quantsim.layer_data` (one pass over the captured graph; the
model run up to each layer where memory or the capture does not allow it).

>>> import torch
>>> from torch import nn
>>> from quanta.quantsim import QuantizationSimModel
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
>>> data = [torch.randn(64, 16) for _ in range(4)]
>>> sim = QuantizationSimModel(model, data[0], default_param_bw=4)
>>> report = apply_seq_mse(sim, data, num_candidates=20, progress=False)
>>> [layer.name for layer in report.layers]
['0', '2']
>>> all(layer.loss_chosen <= layer.loss_min_max for layer in report.layers)
True
>>> sim.compute_encodings(data)  # the activations; the searched weight ranges stay
"""

from __future__ import annotations

import itertools
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from quanta._inputs import call_model
from quanta.nn import QuantizationMixin
from quanta.nn.base import eval_mode, quantizers_off
from quanta.nn.functional import TransposedLinear
from quanta.quantization.affine import QuantizeDequantize
from quanta.quantsim.layer_data import LayerData, LayerWalker, model_inputs, run_order
from quanta._progress import make_bar
from quanta.quantsim.quantsim import QuantizationSimModel

__all__ = ["SUPPORTED_MODULES", "SUPPORTED_PARAM_BW", "SeqMseLayerResult", "SeqMseParams", "SeqMseReport",
           "apply_seq_mse", "neg_sqnr"]

logger = logging.getLogger(__name__)

#: Layer types whose weight ranges are searched (AIMET's: Linear and Conv2d; quanta adds Conv1d, Conv3d and
#: TransposedLinear, GPT-2's ``Conv1D``: a Linear whose weight is stored ``(in, out)``).
SUPPORTED_MODULES = (nn.Linear, TransposedLinear, nn.Conv1d, nn.Conv2d, nn.Conv3d)

#: Weights of more bits keep their ranges (AIMET's rule: the search pays off where the grid is coarse).
SUPPORTED_PARAM_BW = 4

_INPUT_SYMMETRIES = ("symqt", "symfp", "asym")


def neg_sqnr(pred: torch.Tensor, target: torch.Tensor, eps: float = 1e-10, reduction: str = "none") -> torch.Tensor:
    """``-10·log10(mean(target²) / (mean((target - pred)²) + eps))`` over dim 0 (AIMET's SQNR loss)."""
    noise = torch.mean((target - pred) ** 2, 0, keepdim=True) + eps
    signal = torch.mean(target**2, 0, keepdim=True)
    return -(10 * torch.log10(signal / noise))


_LOSSES: dict[str, Callable[..., torch.Tensor]] = {"mse": F.mse_loss, "l1": F.l1_loss, "sqnr": neg_sqnr}


@dataclass
class SeqMseParams:
    """AIMET's ``SeqMseParams`` (same names and defaults).

    Args:
        num_batches: how many batches of the data loader to use (None: all).
        num_candidates: ranges searched per channel (``k/n`` of the min-max range, ``k = 1..n``).
        inp_symmetry: ``"symqt"``, ``"symfp"`` or ``"asym"`` (see the module).
        loss_fn: ``"mse"``, ``"l1"`` or ``"sqnr"``.
        forward_fn: ``forward_fn(model, batch)`` runs one batch (default: ``model(batch)``, a tuple
            unpacked, a dict as keywords).
    """

    num_batches: int | None = None
    num_candidates: int = 20
    inp_symmetry: str = "symqt"
    loss_fn: str = "mse"
    forward_fn: Callable[[nn.Module, Any], Any] | None = None

    def __post_init__(self) -> None:
        if self.num_batches is not None and (isinstance(self.num_batches, bool) or not isinstance(
                self.num_batches, int) or self.num_batches < 1):
            raise ValueError(f"num_batches must be None or an int >= 1, got {self.num_batches!r}")
        if isinstance(self.num_candidates, bool) or not isinstance(self.num_candidates, int) \
                or self.num_candidates < 1:
            raise ValueError(f"num_candidates must be an int >= 1, got {self.num_candidates!r}")
        if self.inp_symmetry not in _INPUT_SYMMETRIES:
            raise ValueError(f"inp_symmetry must be one of {_INPUT_SYMMETRIES}, got {self.inp_symmetry!r}")
        if self.loss_fn not in _LOSSES:
            raise ValueError(f"loss_fn must be one of {tuple(_LOSSES)}, got {self.loss_fn!r}")
        if self.forward_fn is not None and not callable(self.forward_fn):
            raise TypeError(f"forward_fn must be callable as forward_fn(model, batch), "
                            f"got {type(self.forward_fn).__name__}")

    def get_loss_fn(self) -> Callable[..., torch.Tensor]:
        """The loss function ``loss(pred, target, reduction="none")``."""
        return _LOSSES[self.loss_fn]


@dataclass
class SeqMseLayerResult:
    """One searched layer: its summed output error with the min-max range (the last candidate) and with the
    chosen ranges, and the mean chosen fraction ``k/n`` of the min-max range."""

    name: str
    loss_min_max: float
    loss_chosen: float
    mean_fraction: float


@dataclass
class SeqMseReport:
    """What :func:`apply_seq_mse` did, layer by layer, and how the layers' data was collected."""

    layers: list[SeqMseLayerResult] = field(default_factory=list)
    collection: str = "graph"
    seconds: float = 0.0

    def __str__(self) -> str:
        rows = [f"{'layer':<40} {'loss min-max':>12} {'loss chosen':>12} {'mean k/n':>9}"]
        rows += [f"{r.name:<40} {r.loss_min_max:>12.4g} {r.loss_chosen:>12.4g} {r.mean_fraction:>9.2f}"
                 for r in self.layers]
        rows.append(f"{len(self.layers)} layers in {self.seconds:.1f} s (data: {self.collection})")
        return "\n".join(rows)


# ----------------------------------------------------------------------------------- the search
def _set_candidate_range(q: QuantizeDequantize, lo: torch.Tensor, hi: torch.Tensor) -> None:
    """Give ``q`` the min-max encoding of the range ``[lo, hi]`` (per element of ``q``'s shape), as AIMET does:
    a fresh quantizer of the same grid calibrated on ``lo`` and ``hi`` (block ranges repeated over their block),
    so a symmetric quantizer gets its symmetric range."""
    fresh = QuantizeDequantize(q.shape, symmetric=q.symmetric, block_size=q.block_size, qmin=q.qmin, qmax=q.qmax)
    if q.block_size is not None:
        for axis, size in enumerate(q.block_size):
            if size not in (-1, 1):
                lo, hi = lo.repeat_interleave(size, axis), hi.repeat_interleave(size, axis)
    with torch.no_grad(), fresh.compute_encodings():
        fresh(torch.stack([lo, hi]))
    q.set_range(fresh.min.detach(), fresh.max.detach())


def _freeze(q: QuantizeDequantize) -> None:
    """A chosen range stays: not trained, not overwritten by a later ``compute_encodings``."""
    q.allow_overwrite(False)
    for p in q.parameters(recurse=False):
        p.requires_grad_(False)


def _input_block_size(module: nn.Module, q: QuantizeDequantize) -> int:
    """Input channels per block of the weight (all of them without blocks)."""
    axis = 0 if isinstance(module, TransposedLinear) else 1  # TransposedLinear: (in, out), blocks along dim 0
    in_channels = module.weight.shape[axis]
    return in_channels if q.block_size is None or len(q.shape) < 2 else in_channels // q.shape[axis]


def _recon_loss(pred: torch.Tensor, target: torch.Tensor, params: SeqMseParams) -> torch.Tensor:
    """Summed loss per channel (the last dim)."""
    channels = pred.shape[-1]
    loss = params.get_loss_fn()(pred.reshape(-1, channels), target.reshape(-1, channels), reduction="none")
    return loss.sum(0)


def _linear_loss(x: torch.Tensor, xq: torch.Tensor, w: torch.Tensor, wq: torch.Tensor, block: int,
                 params: SeqMseParams) -> torch.Tensor:
    """``(C_out, blocks)`` loss of a Linear layer, the blocks of input channels as a batch of matmuls."""
    out_channels, in_channels = w.shape
    blocks = in_channels // block
    x = x.reshape(-1, blocks, block).permute(1, 0, 2)
    xq = xq.reshape(-1, blocks, block).permute(1, 0, 2)
    w = w.reshape(out_channels, blocks, block).permute(1, 2, 0)
    wq = wq.reshape(out_channels, blocks, block).permute(1, 2, 0)
    xw = torch.bmm(x, w).permute(1, 2, 0)  # (N, C_out, blocks)
    xqwq = torch.bmm(xq, wq).permute(1, 2, 0)
    return params.get_loss_fn()(xw, xqwq, reduction="none").sum(0).view(out_channels, blocks)


def _conv_loss(module: nn.Module, x: torch.Tensor, xq: torch.Tensor, w: torch.Tensor, wq: torch.Tensor, block: int,
               params: SeqMseParams) -> torch.Tensor:
    """``(C_out, blocks)`` loss of a convolution, one convolution per block of input channels (no bias)."""
    groups = module.groups
    losses = []
    for xb, xqb, wb, wqb in zip(torch.split(x, block * groups, dim=1), torch.split(xq, block * groups, dim=1),
                                torch.split(w, block, dim=1), torch.split(wq, block, dim=1)):
        xqwq = module._conv_forward(xqb, wqb, None).movedim(1, -1)  # channels last: the loss is per channel
        xw = module._conv_forward(xb, wb, None).movedim(1, -1)
        losses.append(_recon_loss(xqwq, xw, params))
    return torch.stack(losses, dim=-1)


def _to_quantizer_shape(loss: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """A ``(C_out, blocks)`` loss summed over what one encoding covers, in the quantizer's ``shape``."""
    if not shape or shape[0] == 1:
        loss = loss.sum(0, keepdim=True)
    if len(shape) < 2 or shape[1] == 1:
        loss = loss.sum(1, keepdim=True)
    return loss.reshape(*loss.shape, *([1] * (len(shape) - 2))) if len(shape) >= 2 else loss.reshape(shape)


def _search(name: str, module: QuantizationMixin, xs: Sequence[torch.Tensor], xqs: Sequence[torch.Tensor],
            params: SeqMseParams) -> SeqMseLayerResult:
    """Choose and freeze the weight range of ``module`` (see the module docstring)."""
    q = module.param_quantizers["weight"]
    lo, hi = q.get_min().detach().clone(), q.get_max().detach().clone()
    n = params.num_candidates
    block = _input_block_size(module, q)
    transposed = isinstance(module, TransposedLinear)  # the same search on the (out, in) view of its weight
    w = module.weight.detach()
    losses = []
    for k in range(n):
        _set_candidate_range(q, lo / n * (k + 1), hi / n * (k + 1))
        wq = q(w).as_subclass(torch.Tensor)
        total: Any = 0
        for x, xq in zip(xs, xqs):
            if transposed:
                total = total + _linear_loss(x, xq, w.t(), wq.t(), block, params)
            elif isinstance(module, nn.Linear):
                total = total + _linear_loss(x, xq, w, wq, block, params)
            else:
                total = total + _conv_loss(module, x, xq, w, wq, block, params)
        losses.append(_to_quantizer_shape(total, tuple(reversed(q.shape))).t() if transposed
                      else _to_quantizer_shape(total, q.shape))
    stacked = torch.stack(losses)
    best = stacked.min(0)[1]
    _set_candidate_range(q, lo / n * (best + 1), hi / n * (best + 1))
    _freeze(q)
    chosen = stacked.gather(0, best[None]).sum()
    return SeqMseLayerResult(name, float(stacked[-1].sum()), float(chosen), float(((best + 1) / n).float().mean()))


# ----------------------------------------------------------------------------------- entry point
def _searchable(sim: QuantizationSimModel, excluded: set[int]) -> list[tuple[str, QuantizationMixin]]:
    found = []
    for name, module in sim.model.named_modules():
        if not (isinstance(module, QuantizationMixin) and isinstance(module, SUPPORTED_MODULES)) \
                or id(module) in excluded:
            continue
        q = module.param_quantizers["weight"] if "weight" in module.param_quantizers else None
        if type(q) is not QuantizeDequantize:
            if q is not None:
                logger.warning("seq_mse: %s has a %s weight quantizer; its range is left as it is", name,
                               type(q).__name__)
            continue
        if q.bitwidth > SUPPORTED_PARAM_BW:
            continue
        found.append((name, module))
    return found


def apply_seq_mse(*args: Any, **kwargs: Any) -> SeqMseReport:
    """Sequential MSE on ``sim`` in place (AIMET's two signatures).

    ``apply_seq_mse(sim, data_loader, num_candidates=20, forward_fn=None, modules_to_exclude=None,
    checkpoints_config=None, cache_dir=None, *, num_batches=None, inp_symmetry="symqt", loss_fn="mse",
    progress=True)``, or AIMET's deprecated ``apply_seq_mse(model, sim, data_loader, params: SeqMseParams,
    modules_to_exclude=None, ...)`` (``model``, the float model, only names the excluded modules: quanta's
    float reference is the sim with its quantizers off).

    Args:
        sim: a :class:`~quanta.quantsim.QuantizationSimModel`; the weight ranges of its Linear/Conv layers
            with weights of at most 4 bits are searched and frozen.
        data_loader: batches of model inputs (any iterable); all are used unless ``num_batches`` says fewer.
        num_candidates: ranges searched per output channel (per block for per-block weights).
        forward_fn: ``forward_fn(model, batch)`` runs one batch (default: ``model(batch)``, a tuple unpacked,
            a dict as keywords).
        modules_to_exclude: layers (of ``sim.model``, or of ``model`` in the deprecated form) to leave alone.
        checkpoints_config: AIMET's block-caching file; quanta collects each layer's data in one pass by
            itself, so it is not needed and, if given, ignored with a warning.
        cache_dir: a directory where every searched layer's range is saved (``<layer>.pt``) as soon as it is
            chosen, and from which a later call with the same directory loads the layers found there instead of
            searching them again (resuming an interrupted run).

    Returns:
        A :class:`SeqMseReport` (each layer's summed output error with the min-max range and with the chosen
        ranges).

    Raises TypeError / ValueError for arguments of the wrong type or value (nothing is changed then).
    """
    if args and isinstance(args[0], nn.Module) or "model" in kwargs:
        warnings.warn("apply_seq_mse(model, sim, data_loader, params, ...) is AIMET's deprecated signature; "
                      "use apply_seq_mse(sim, data_loader, ...)", DeprecationWarning, stacklevel=2)
        return _deprecated(*args, **kwargs)
    return _apply(*args, **kwargs)


def _deprecated(model: nn.Module, sim: QuantizationSimModel, data_loader: Iterable[Any], params: SeqMseParams,
                modules_to_exclude: Sequence[nn.Module] | None = None, checkpoints_config: str | None = None,
                cache_dir: str | os.PathLike | None = None, *, progress: bool = True) -> SeqMseReport:
    if not isinstance(params, SeqMseParams):
        raise TypeError(f"params must be SeqMseParams, got {type(params).__name__}")
    if not isinstance(sim, QuantizationSimModel):
        raise TypeError(f"sim must be a QuantizationSimModel, got {type(sim).__name__}")
    names = {id(m): n for n, m in model.named_modules()}
    excluded = []
    for m in modules_to_exclude or ():
        if id(m) in names:
            m = sim.model.get_submodule(names[id(m)])
        excluded.append(m)
    return _apply(sim, data_loader, params.num_candidates, params.forward_fn, excluded, checkpoints_config,
                  cache_dir, num_batches=params.num_batches, inp_symmetry=params.inp_symmetry,
                  loss_fn=params.loss_fn, progress=progress)


def _apply(sim: QuantizationSimModel, data_loader: Iterable[Any], num_candidates: int = 20,
           forward_fn: Callable[[nn.Module, Any], Any] | None = None,
           modules_to_exclude: Sequence[nn.Module] | None = None, checkpoints_config: str | None = None,
           cache_dir: str | os.PathLike | None = None, *, num_batches: int | None = None, inp_symmetry: str = "symqt",
           loss_fn: str = "mse", progress: bool = True) -> SeqMseReport:
    if not isinstance(sim, QuantizationSimModel):
        raise TypeError(f"sim must be a QuantizationSimModel, got {type(sim).__name__}")
    if isinstance(data_loader, (torch.Tensor, str, bytes)) or not isinstance(data_loader, Iterable):
        raise TypeError(f"data_loader must be an iterable of batches (a DataLoader, a list), "
                        f"got {type(data_loader).__name__}")
    params = SeqMseParams(num_batches, num_candidates, inp_symmetry, loss_fn, forward_fn)
    ours = {id(m) for m in sim.model.modules()}
    for m in modules_to_exclude or ():
        if not isinstance(m, nn.Module) or id(m) not in ours:
            raise ValueError(f"modules_to_exclude must hold modules of sim.model, got {m!r:.80}")
    if checkpoints_config is not None:
        warnings.warn("checkpoints_config is ignored: quanta collects every layer's inputs in one pass over the "
                      "captured graph (or streams them) by itself", UserWarning, stacklevel=3)
    if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(f"cache_dir must be a directory path, got {type(cache_dir).__name__}")
    begin = time.perf_counter()
    excluded = {id(m) for m in modules_to_exclude or ()}
    layers = _searchable(sim, excluded)
    if not layers:
        raise ValueError(f"sim has no layer Sequential MSE applies to (Linear / Conv with a weight quantizer of at "
                         f"most {SUPPORTED_PARAM_BW} bits, not excluded)")
    batches = list(data_loader if num_batches is None else itertools.islice(data_loader, num_batches))
    if not batches:
        raise ValueError("data_loader yielded no batches")
    searched = {id(m) for _, m in layers}
    qmodules = [m for m in sim.model.modules() if isinstance(m, QuantizationMixin)]
    others = [m for m in qmodules if id(m) not in searched]
    report = SeqMseReport()
    with eval_mode(sim.model), quantizers_off(qmodules, params=False), quantizers_off(others), torch.no_grad():
        for _, module in layers:  # the parameters' encodings; the weight's range is what candidates are fractions of
            for pname, q in module.param_quantizers.items():
                if q is not None:
                    q.allow_overwrite(True)  # as AIMET: recomputed even where frozen
                    with q.compute_encodings():
                        q(getattr(module, pname))
        layers = _load_cached(layers, cache_dir)
        calls = model_inputs(sim.model, batches, forward_fn or call_model)
        layers, _ = run_order(sim.model, layers, calls[0])
        bar = make_bar(len(layers), enabled=progress, desc="sequential mse", unit="layer")

        def visit(name: str, module: QuantizationMixin, data: LayerData) -> None:
            bar.set_description(f"sequential mse {name}")
            xq = data.quant_inputs
            x = data.float_inputs if inp_symmetry in ("symfp", "asym") else xq
            if inp_symmetry == "symfp":
                xq = x  # type: ignore[assignment]
            result = _search(name, module, x, xq, params)  # type: ignore[arg-type]
            logger.info("seq_mse %s: loss %.4g (min-max) -> %.4g", name, result.loss_min_max, result.loss_chosen)
            report.layers.append(result)
            if cache_dir is not None:
                _save_cached(name, module, cache_dir)
            bar.advance()

        walker = LayerWalker(sim.model, sim._prepared.graph, layers, calls,
                             float_inputs=inp_symmetry in ("symfp", "asym"))
        try:
            report.collection = walker.run(visit)
        finally:
            bar.close()
    report.seconds = time.perf_counter() - begin
    return report


def _cache_file(cache_dir: str | os.PathLike, name: str) -> str:
    return os.path.join(os.fspath(cache_dir), f"{name}.pt")


def _save_cached(name: str, module: QuantizationMixin, cache_dir: str | os.PathLike) -> None:
    from quanta._files import atomic_write

    os.makedirs(os.fspath(cache_dir), exist_ok=True)
    q = module.param_quantizers["weight"]
    state = {"min": q.min.detach().clone(), "max": q.max.detach().clone()}
    atomic_write(_cache_file(cache_dir, name), lambda tmp: torch.save(state, tmp))


def _load_cached(layers: list[tuple[str, QuantizationMixin]], cache_dir: str | os.PathLike | None
                 ) -> list[tuple[str, QuantizationMixin]]:
    """Set and freeze the ranges saved in ``cache_dir``; returns the layers still to search."""
    if cache_dir is None:
        return layers
    todo = []
    for name, module in layers:
        path = _cache_file(cache_dir, name)
        if not os.path.exists(path):
            todo.append((name, module))
            continue
        state = torch.load(path, weights_only=True)
        q = module.param_quantizers["weight"]
        if not (isinstance(state, dict) and set(state) == {"min", "max"}
                and all(isinstance(v, torch.Tensor) and tuple(v.shape) == q.shape for v in state.values())):
            raise ValueError(f"cache_dir: {path} does not hold a range of shape {q.shape} for layer {name}")
        q.set_range(state["min"], state["max"])
        _freeze(q)
        logger.info("seq_mse %s: range loaded from %s", name, path)
    return todo
