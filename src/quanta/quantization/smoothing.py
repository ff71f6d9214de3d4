"""Per-input-channel scaling of Linear layers (SmoothQuant, AWQ): statistics, groups, folds, and the fallback.

Both algorithms rewrite ``y = x W^T`` as ``y = (x / s) (W diag(s))^T`` with a
scale ``s`` per input channel, chosen from the layer's calibration inputs, and
quantize ``W diag(s)``. Where ``x`` is the output of one op that only these
layers read, ``1 / s`` is **folded** into that op and costs nothing at run time:

* a normalization with a per-channel affine (LayerNorm, RMSNorm, ...): ``weight / s``, ``bias / s``;
* a Linear: its output rows ``weight[j] / s_j``, ``bias[j] / s_j``.

All the Linear layers reading that op's output form a group and share ``s``
(their weight columns all get ``* s``, those left in float included).
Everything else keeps ``s`` per layer inside the weight
(:class:`~quanta.dtypes.WeightTensorWithLinearActivationScaleMetadata`:
``F.linear(x / s, Q(W diag(s)))``).

**Which op produced a layer's input** is observed during calibration (the
Linear's input is the very tensor object the op returned, at every call), and
**whether a fold is exact** is checked, not assumed: the model runs once on the
first calibration batch it saw with every candidate fold applied with scales
``2^{+-1}`` (exact in floating point), and a fold that changes the output (the
op's output also feeds a residual add, Gemma's ``(1 + weight)`` RMSNorm, a tied
weight...) is dropped for the per-layer fallback. So folding never changes
what the float model computes beyond the rounding of ``weight / s``.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.utils import _pytree as pytree

from quanta.dtypes.activation_scale import WeightTensorWithLinearActivationScaleMetadata
from quanta.quantization.linear_like import (
    in_features,
    is_conv1d,
    is_linear_like,
    layer_input,
    linear_weight,
    stored_weight,
)
from quanta.quantization.observed import HessianObserver, output_mse
from quanta.quantization.quant_api import AOBaseConfig, LayerNotQuantizable, QuantizeReport

__all__ = ["InputStatistics", "SmoothingGroup", "prepare_smoothing", "convert_smoothing", "is_norm", "round_scale"]

_STATE = "_quanta_smoothing"
_MIXED = object()  # a Linear whose input came from different ops across calls


class InputStatistics:
    """Per input channel of a Linear: ``absmax`` (max ``|x|``), ``abs_mean`` (mean ``|x|``), over every row seen;
    optionally the Gram matrix (``gram``: a :class:`~quanta.quantization.observed.HessianObserver`) and the first
    ``sample_rows`` rows themselves (for the report).

    >>> st = InputStatistics(2, sample_rows=1)
    >>> st.update(torch.tensor([[1.0, -4.0], [-3.0, 2.0]]))
    >>> st.absmax, st.abs_mean, st.sample
    (tensor([3., 4.]), tensor([2., 3.]), tensor([[ 1., -4.]]))
    """

    def __init__(self, in_features: int, *, gram: bool = False, sample_rows: int = 0) -> None:
        self.in_features = in_features
        self.absmax = torch.zeros(in_features)
        self._abs_sum = torch.zeros(in_features, dtype=torch.float64)
        self.count = 0
        self.gram = HessianObserver(in_features) if gram else None
        self.sample_rows = sample_rows
        self._samples: list[torch.Tensor] = []
        self._sampled = 0

    def update(self, x: torch.Tensor) -> None:
        rows = x.detach().reshape(-1, self.in_features)
        a = rows.abs().float()
        if rows.shape[0]:
            self.absmax = torch.maximum(self.absmax, a.amax(0))
            self._abs_sum += a.sum(0, dtype=torch.float64)
        self.count += rows.shape[0]
        if self.gram is not None:
            self.gram.update(rows)
        if self._sampled < self.sample_rows:
            take = rows[: self.sample_rows - self._sampled].clone()
            self._samples.append(take)
            self._sampled += take.shape[0]

    @property
    def abs_mean(self) -> torch.Tensor:
        return (self._abs_sum / max(self.count, 1)).float()

    @property
    def sample(self) -> Optional[torch.Tensor]:
        return torch.cat(self._samples) if self._samples else None


def is_norm(module: nn.Module) -> bool:
    """A normalization whose output is ``normalized * weight (+ bias)`` per channel: the fold targets besides Linear
    (any module class named ``*Norm*`` with a 1-D ``weight``; an inexact one is caught by the fold check)."""
    w = getattr(module, "weight", None)
    b = getattr(module, "bias", None)
    return ("Norm" in type(module).__name__ and isinstance(w, nn.Parameter) and w.dim() == 1
            and (b is None or (isinstance(b, torch.Tensor) and tuple(b.shape) == tuple(w.shape))))


def _producer_kind(module: nn.Module) -> bool:
    return (is_linear_like(module) and type(module.weight) is nn.Parameter) or is_norm(module)


@dataclass
class _Prepared:
    """What the first step left on the root model (``model.__dict__[_STATE]``)."""

    stats: dict[str, InputStatistics] = field(default_factory=dict)
    producers: dict[str, Any] = field(default_factory=dict)  # every Linear -> producer name, _MIXED or None
    batch: Optional[tuple[tuple, dict]] = None
    handles: list = field(default_factory=list)
    active: bool = True  # False while convert runs the model (the fold check)

    def remove_hooks(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


def prepare_smoothing(model: nn.Module, selected: list[tuple[str, nn.Module]], report: QuantizeReport, *,
                      what: str, gram: bool, sample_rows: int) -> list[Callable[[], None]]:
    """The first step: observers on the selected Linears (others are listed in ``report.skipped``), producer
    tracking, the first batch recorded; returned as the change to make."""
    linears = []
    for fqn, module in selected:
        if is_linear_like(module):
            linears.append((fqn, module))
            report.observed.append(fqn)
        else:
            report.skipped[fqn] = f"{what} applies to nn.Linear (and Conv1D) layers, not {type(module).__name__}"

    def attach() -> None:
        old = model.__dict__.pop(_STATE, None)
        if old is not None:
            old.remove_hooks()
        state = _Prepared()
        outputs: dict[int, tuple[str, weakref.ref]] = {}
        for fqn, module in linears:
            stats = state.stats[fqn] = InputStatistics(in_features(module), gram=gram, sample_rows=sample_rows)
            state.handles.append(module.register_forward_pre_hook(
                lambda _m, args, kwargs, st=stats: st.update(layer_input(args, kwargs)) if state.active else None,
                with_kwargs=True))
        for name, module in model.named_modules():
            if _producer_kind(module):
                def record(_m, _args, out, name=name):
                    if state.active and isinstance(out, torch.Tensor):
                        outputs[id(out)] = (name, weakref.ref(out))
                state.handles.append(module.register_forward_hook(record))
            if is_linear_like(module):
                def consume(_m, args, kwargs, name=name):
                    if not state.active:
                        return
                    x = layer_input(args, kwargs)
                    hit = outputs.get(id(x))
                    producer = hit[0] if hit is not None and hit[1]() is x else None
                    before = state.producers.get(name, producer)
                    state.producers[name] = producer if before == producer else _MIXED
                state.handles.append(module.register_forward_pre_hook(consume, with_kwargs=True))

        def record_batch(_m, args, kwargs):
            if state.active and state.batch is None:
                detach = lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t  # noqa: E731
                state.batch = (pytree.tree_map(detach, tuple(args)), pytree.tree_map(detach, dict(kwargs)))
            outputs.clear()  # ids from an earlier call are not this call's tensors
        state.handles.append(model.register_forward_pre_hook(record_batch, with_kwargs=True))
        model.__dict__[_STATE] = state
    return [attach]


@dataclass
class SmoothingGroup:
    """Linear layers reading one op's output: ``producer`` (its name, or None for a layer on its own),
    ``consumers`` (every Linear reading it) and ``selected`` (those to quantize)."""

    producer: Optional[str]
    consumers: list[str]
    selected: list[str]


def _groups(state: _Prepared, selected: list[str]) -> list[SmoothingGroup]:
    by_producer: dict[str, list[str]] = {}
    for consumer, producer in state.producers.items():
        if isinstance(producer, str):
            by_producer.setdefault(producer, []).append(consumer)
    groups, grouped = [], set()
    for producer, consumers in by_producer.items():
        chosen = [c for c in consumers if c in selected]
        if chosen:
            groups.append(SmoothingGroup(producer, consumers, chosen))
            grouped.update(chosen)
    groups += [SmoothingGroup(None, [n], [n]) for n in selected if n not in grouped]
    return groups


# id(parameter) -> (parameter, its new value as the algorithms see it, whether it is stored transposed: Conv1D)
Values = dict[int, tuple[torch.Tensor, torch.Tensor, bool]]


def _current(values: Values, module: nn.Module, name: str = "weight") -> torch.Tensor:
    """A parameter's current value: ``[out, in]`` for a Linear or Conv1D weight, as stored otherwise."""
    p = getattr(module, name)
    if id(p) in values:
        return values[id(p)][1]
    return linear_weight(module) if name == "weight" and is_linear_like(module) else p.detach()


def _set(values: Values, module: nn.Module, name: str, value: torch.Tensor) -> None:
    p = getattr(module, name)
    values[id(p)] = (p, value, name == "weight" and is_conv1d(module))


def _fold(modules: dict[str, nn.Module], group: SmoothingGroup, s: torch.Tensor, values: Values) -> None:
    """New values for ``producer / s`` (its output channels) and every consumer's input channels ``* s``."""
    p = modules[group.producer]
    w = _current(values, p)
    _set(values, p, "weight", (w.float() / (s if w.dim() == 1 else s[:, None])).to(w.dtype))
    if getattr(p, "bias", None) is not None:
        b = _current(values, p, "bias")
        _set(values, p, "bias", (b.float() / s).to(b.dtype))
    for c in group.consumers:
        cw = _current(values, modules[c])
        _set(values, modules[c], "weight", (cw.float() * s).to(cw.dtype))


def _assign(values: Values) -> None:
    with torch.no_grad():
        for p, v, transposed in values.values():
            p.copy_(v.t() if transposed else v)


def _run(model: nn.Module, batch: tuple[tuple, dict]) -> list[torch.Tensor]:
    with torch.no_grad():
        out = model(*batch[0], **batch[1])
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    return [t.float() for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return False
        ref = float(x.norm())
        if not math.isfinite(ref) or float((x - y).norm()) > 1e-3 * max(ref, 1e-30):
            return False
    return True


def _exact_folds(model: nn.Module, modules: dict[str, nn.Module], groups: list[SmoothingGroup],
                 batch: tuple[tuple, dict]) -> set[str]:
    """Producers whose fold leaves the model's output unchanged (tested with scales 2^{+-1}, exact in float)."""
    candidates = [g for g in groups if g.producer is not None]
    if not candidates:
        return set()
    ref = _run(model, batch)
    if not ref:  # no float output to compare: no evidence that any fold is exact
        return set()
    gen = torch.Generator().manual_seed(0)

    def trial(gs: list[SmoothingGroup]) -> bool:
        values: Values = {}
        for g in gs:
            k = in_features(modules[g.consumers[0]])
            _fold(modules, g, 2.0 ** (torch.randint(0, 2, (k,), generator=gen) * 2 - 1).float(), values)
        saved = {i: (p, p.detach().clone(), False) for i, (p, _, _) in values.items()}
        try:
            _assign(values)
            return _same(ref, _run(model, batch))
        finally:
            _assign(saved)

    if trial(candidates):
        return {g.producer for g in candidates}
    return {g.producer for g in candidates if trial([g])}


def round_scale(s: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A finite positive scale, representable in the weights' dtype (both sides of the fold use the same value)."""
    s = torch.nan_to_num(s.float(), nan=1.0, posinf=1.0, neginf=1.0).clamp(min=1e-4, max=1e4)
    return s.to(dtype).float()


ChooseScale = Callable[[list[nn.Module], list[torch.Tensor], list[torch.Tensor], list[InputStatistics]],
                       torch.Tensor]


def convert_smoothing(model: nn.Module, selected: list[tuple[str, nn.Module]], report: QuantizeReport, *,
                      base_config: AOBaseConfig, choose_scale: ChooseScale, what: str) -> list[Callable[[], None]]:
    """The second step: a scale per group, folds where exact, then the base config's quantized weights.

    ``choose_scale(selected modules, their weights, every consumer's weight, the selected layers' statistics)
    -> s`` is the algorithm (weights ``[out, in]``: the current values, folds of earlier groups included).
    Nothing changes until the returned changes run: the folded float parameters, then the quantized weights.
    """
    state: Optional[_Prepared] = model.__dict__.get(_STATE)
    if state is None:
        raise ValueError(f"{what}(step='convert'): the model was not prepared; run quantize_ with step='prepare', "
                         "then calibration data through the model, then convert")
    modules = dict(model.named_modules())
    usable = []
    for fqn, module in selected:
        try:
            if not is_linear_like(module):
                raise LayerNotQuantizable(f"{what} applies to nn.Linear (and Conv1D) layers, not "
                                          f"{type(module).__name__}")
            stats = state.stats.get(fqn)
            if stats is None:
                raise LayerNotQuantizable(f"not prepared: run quantize_ with {what}(step='prepare') first")
            if stats.count == 0:
                raise LayerNotQuantizable(f"{what} saw no calibration input for this layer")
            base_config.quantize_weight(linear_weight(module), module)  # refuses early (shape, group size)
            usable.append(fqn)
        except LayerNotQuantizable as e:
            report.skipped[fqn] = str(e)
    groups = _groups(state, usable)
    state.active = False
    try:
        exact = _exact_folds(model, modules, groups, state.batch) if state.batch is not None else set()
    finally:
        state.active = True
    rtn = {n: base_config.quantize_weight(linear_weight(modules[n]), modules[n]) for n in usable}
    originals = {n: linear_weight(modules[n]).float().clone() for n in usable}
    # 1. a scale per group, and the folds (float values only); a Linear may be a consumer of one group
    #    and the producer of another, so nothing is quantized before every fold is known
    in_scale: dict[str, torch.Tensor] = {}  # layer -> the scale its input is divided by (fold or weight)
    out_scale: dict[str, torch.Tensor] = {}  # Linear producer -> the scale its output rows are divided by
    values: Values = {}
    for g in groups:
        if g.producer is not None and g.producer not in exact:
            # no exact fold (the producer's output is read by more than these Linears): each layer on its own
            singles = [SmoothingGroup(None, [n], [n]) for n in g.selected]
        else:
            singles = [g]
        for sg in [sg for sg in singles if sg.producer is None and is_conv1d(modules[sg.selected[0]])]:
            # a Conv1D's addmm cannot divide its input by a scale kept in the weight
            report.notes.setdefault(sg.selected[0], []).append("Conv1D with no exact fold: quantized without a "
                                                               "scale")
            singles.remove(sg)
        for sg in singles:
            dtype = modules[sg.selected[0]].weight.dtype
            s = round_scale(choose_scale([modules[n] for n in sg.selected],
                                         [_current(values, modules[n]) for n in sg.selected],
                                         [_current(values, modules[n]) for n in sg.consumers],
                                         [state.stats[n] for n in sg.selected]), dtype)
            if sg.producer is not None:
                _fold(modules, sg, s, values)
                if is_linear_like(modules[sg.producer]):
                    out_scale[sg.producer] = out_scale.get(sg.producer, 1.0) * s
            for n in sg.selected:
                in_scale[n] = s
                report.scale_folded_into[n] = sg.producer
    # 2. the quantized weights, from the final float values
    plan: dict[str, torch.Tensor] = {}  # [out, in] quantized weights
    for n in usable:
        m = modules[n]
        w = _current(values, m)
        folded_into = report.scale_folded_into.get(n)
        if folded_into is not None or n not in in_scale:
            plan[n] = base_config.quantize_weight(w, m)  # its columns carry the folded scale, or none
        else:
            s = in_scale[n]
            plan[n] = WeightTensorWithLinearActivationScaleMetadata(
                base_config.quantize_weight((w.float() * s).to(w.dtype), m), s.to(w.dtype))
        # what the layer now computes, in the original's terms: its input was divided by s_in (if folded), its
        # output rows by s_out (if it is the producer of a fold)
        s_in = in_scale[n] if folded_into is not None else None
        report.quantized.append(n)
        report.output_mse[n] = _errors(plan[n], rtn[n], originals[n], state.stats[n], s_in, out_scale.get(n))

    def finish() -> None:
        state.remove_hooks()
        model.__dict__.pop(_STATE, None)

    def install(module: nn.Module, weight: torch.Tensor) -> Callable[[], None]:
        return lambda: setattr(module, "weight", nn.Parameter(weight, requires_grad=False))
    return [finish, lambda: _assign(values)] + [install(modules[n], stored_weight(modules[n], plan[n]))
                                                for n in usable]


def _errors(quantized: torch.Tensor, rtn: torch.Tensor, original: torch.Tensor, stats: InputStatistics,
            s_in: Optional[torch.Tensor], s_out: Optional[torch.Tensor]) -> tuple[float, float]:
    """(round-to-nearest, algorithm) output MSE on the calibration inputs: from the Gram matrix when kept (every
    row), else on the sampled rows through the layer as it runs (activation quantization included).
    ``s_in``: what a fold now divides the layer's input by; ``s_out``: what a fold divides its output rows by."""
    s_in = torch.ones(original.shape[1]) if s_in is None else s_in
    s_out = torch.ones(original.shape[0]) if s_out is None else s_out
    if stats.gram is not None:
        h = stats.gram.hessian()
        effective = quantized.dequantize().float() / s_in * s_out[:, None]
        return output_mse(rtn.dequantize().float() - original, h), output_mse(effective - original, h)
    x = stats.sample.float()
    ref = nn.functional.linear(x, original)

    def mse(weight: torch.Tensor, inputs: torch.Tensor, rows: torch.Tensor) -> float:
        with torch.no_grad():
            out = nn.functional.linear(inputs.to(weight.dtype), weight).float() * rows
            return float((out - ref).pow(2).mean())
    return mse(rtn, x, torch.ones(())), mse(quantized, x / s_in, s_out)
