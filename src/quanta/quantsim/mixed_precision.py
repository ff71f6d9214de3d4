"""Automatic mixed precision (AIMET's ``choose_mixed_precision``): the fewest bits that keep the accuracy.

Quantizers that must share a precision form a *quantizer group*: a Conv/Linear layer's weights (every
parameter quantizer of the layer) together with the activation quantizer that feeds it (its own input
quantizer, or the output quantizer of the op before it, looking through reshapes, flattens, dropout and max
pooling); layers fed by the same activation share one group. Every other activation quantizer is a group of its
own. A *candidate* is ``((activation bits, dtype), (parameter bits, dtype))``, e.g. ``((8, int), (4, int))`` for
W4A8; dtype ``float`` with 16 bits is fp16, with 32 bits no quantization.

The cost of a configuration is AIMET's BitOps: ``Σ_layers MACs × activation bits × weight bits`` over the
Conv/Linear layers (MACs per sample on ``dummy_input``; a float format's bits count ``√1.5×``), reported
relative to the baseline (every group at the best candidate, step 1), in both directions of phase 2 (AIMET's
bottom-up walk reports relative to the cheapest candidate, where it starts).

The search is AIMET's greedy two-phase algorithm:

1. Calibrate and evaluate the model with every group at each candidate (``eval_callback_for_phase2``); the best
   is the *baseline*, the cheapest the *minimum*. If the baseline already loses more than
   ``allowed_accuracy_drop`` against fp32, the sim is left at the baseline; if the minimum loses less, it is left at
   the minimum (both return None).
2. Phase 1: for each group and each cheaper candidate, the model with only that group quantized, at that
   candidate, is scored with ``eval_callback_for_phase1`` (a small dataset, or :meth:`EvalCallbackFactory.sqnr`).
   Sorted by score (then by larger bitwidths, larger BitOps saving, earlier group), this is the *accuracy list*:
   the least sensitive changes first.
3. Phase 2: starting from every group at the baseline, the changes of the accuracy list are applied
   cumulatively; a binary search (or interpolation, or every point) over that list finds the longest prefix
   whose ``eval_callback_for_phase2`` score stays within ``allowed_accuracy_drop`` of fp32 (None: the whole
   curve). Each evaluated prefix is a point of the Pareto curve (relative BitOps, score).
   With ``phase2_reverse=True`` (AIMET's bottom-up variant) phase 2 starts from every group at the cheapest
   candidate and reads the accuracy list backwards, most sensitive change first: at each entry
   ``(group, candidate)`` the group moves up to its next less sensitive candidate (after its last, the
   baseline); the search finds the shortest walk whose score is back within the budget (none: the baseline
   everywhere).
4. Refinement (quanta's, ``refine=True``): the scores along the list are not monotonic, so the search stops
   early; each later change is then tried alone on top of the chosen prefix and kept if the score stays within
   the budget (in reverse: each move of the chosen walk is undone, latest first, where the score allows). The
   sim is left at the chosen configuration, with its encodings computed.

Faster than AIMET where it counts: each candidate is calibrated once (step 1) and its encodings are kept in a
quantizer per slot and bitwidth, so phases 1 and 2 only swap quantizers instead of re-running calibration for
every point (so an activation's range is the one calibrated with every weight at that candidate's bitwidth).

Files in ``results_dir``: ``pareto_list.json`` (AIMET's layout: ``[relative BitOps, score, group as
[kind, name] pairs, candidate]``), ``quantizer_group_sensitivity.{html,png}`` (phase 1),
``pareto_curve.{html,png}`` (phase 2, with the budget), ``amp_info_list.json`` (timings and scores), and in
``.cache/`` the accuracy list and Pareto points, from which a run with ``clean_start=False`` resumes.

>>> import tempfile, torch
>>> from torch import nn
>>> from quanta.quantsim import QuantizationSimModel
>>> torch.manual_seed(0)  # doctest: +ELLIPSIS
<torch._C.Generator object at ...>
>>> model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).eval()
>>> data = [torch.randn(32, 16) for _ in range(2)]
>>> reference = [model(x) for x in data]
>>> def score(m):
...     return float(sum(torch.cosine_similarity(m(x), r, dim=1).mean() for x, r in zip(data, reference)) / 2)
>>> sim = QuantizationSimModel(model, data[0])
>>> W8A16, W4A8 = ((16, int), (8, int)), ((8, int), (4, int))
>>> with tempfile.TemporaryDirectory() as d:  # allowed_accuracy_drop None: the whole curve, down to all W4A8
...     pareto = choose_mixed_precision(sim, data[0], [W8A16, W4A8], score, score, None, d, True,
...                                     lambda m: [m(x) for x in data], progress=False)
>>> [group.label() for _, _, group, _ in pareto]  # least sensitive first; no BitOps saved: last
['0', '2', '2 (output)']
>>> pareto[-1][0]  # BitOps of W4A8 everywhere relative to W8A16
0.25
"""

from __future__ import annotations

import enum
import itertools
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from quanta._files import output_directory, write_json
from quanta._inputs import call_model
from quanta.nn import QuantizationMixin
from quanta.nn.base import eval_mode, quantizers_off
from quanta.quantization.affine import QuantizeDequantize
from quanta.quantization.base import QuantizerBase
from quanta.quantization.float import FloatQuantizeDequantize
from quanta.quantsim import charts, construction
from quanta.quantsim.callbacks import CallbackFunc, check_callback, evaluate_score
from quanta.quantsim.config import DataType, op_types_of
from quanta._progress import make_bar
from quanta.quantsim.quantsim import QuantizationSimModel

__all__ = ["AMPSearchAlgo", "CallbackFunc", "EvalCallbackFactory", "FLOATING_POINT_MULTIPLIER", "QuantizerGroup",
           "choose_mixed_precision", "find_quantizer_groups"]

#: a float format's bits count this much more than an integer's in BitOps (AIMET's factor)
FLOATING_POINT_MULTIPLIER = math.sqrt(1.5)

Precision = tuple[int, DataType]
Candidate = tuple[Precision, ...]  # ((act bits, dtype), (param bits, dtype)), or ((act bits, dtype),)


class AMPSearchAlgo(enum.IntEnum):
    """How phase 2 searches the accuracy list (AIMET's values)."""

    BruteForce = 1
    Interpolation = 2
    Binary = 3


@dataclass(frozen=True)
class QuantizerGroup:
    """Quantizers that take one candidate (bitwidth and data type) together.

    Named as AIMET names them: ``input_quantizers`` as
    ``<module>_input_quantizer_idx_<i>``, ``output_quantizers`` and ``parameter_quantizers`` by module name
    (all of that module's output / parameter quantizers); ``supported_kernel_ops``: the modules it feeds."""

    input_quantizers: tuple[str, ...] = ()
    output_quantizers: tuple[str, ...] = ()
    parameter_quantizers: tuple[str, ...] = ()
    supported_kernel_ops: tuple[str, ...] = ()

    def to_list(self) -> list[tuple[str, str]]:
        """``[("input" | "output" | "weight", name), ...]`` (AIMET's JSON form)."""
        return ([("input", n) for n in self.input_quantizers] + [("output", n) for n in self.output_quantizers]
                + [("weight", n) for n in self.parameter_quantizers])

    @property
    def has_params(self) -> bool:
        return bool(self.parameter_quantizers)

    def label(self) -> str:
        """A short name for charts: the layers whose weights it holds, else its activation quantizers."""
        if self.parameter_quantizers:
            return "+".join(self.parameter_quantizers)
        return "+".join([f"{n} (output)" for n in self.output_quantizers]
                        + [n.replace("_input_quantizer_idx_", " (input ") + ")" for n in self.input_quantizers])


# ---------------------------------------------------------------------------------------------- candidates
def _precision(value: Any, what: str) -> Precision:
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise ValueError(f"candidates: {what} must be a (bitwidth, dtype) pair, got {value!r}")
    bw, dtype = value
    if isinstance(bw, bool) or not isinstance(bw, int) or not 1 <= bw <= 32:
        raise ValueError(f"candidates: {what} bitwidth must be an int in [1, 32], got {bw!r}")
    dtype = DataType.parse(dtype, f"candidates: {what} dtype")
    if dtype is DataType.FLOAT and bw not in (16, 32):
        raise ValueError(f"candidates: {what}: float candidates are 16 (fp16) or 32 (no quantization) bits, got {bw}")
    return bw, dtype


def _candidate(value: Any) -> Candidate:
    """``((act bits, dtype), (param bits, dtype))`` checked and normalised (dtypes as :class:`DataType`)."""
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise ValueError("candidates must hold ((activation bitwidth, dtype), (parameter bitwidth, dtype)) pairs, "
                         f"got {value!r}")
    return _precision(value[0], "activation"), _precision(value[1], "parameter")


def _effective(p: Precision) -> float:
    return p[0] * FLOATING_POINT_MULTIPLIER if p[1] is DataType.FLOAT else float(p[0])


def candidate_str(c: Candidate) -> str:
    """``W: int4 / A: int8`` (AIMET's label)."""
    act = f"{c[0][1].value}{c[0][0]}"
    return f"W: {c[1][1].value}{c[1][0]} / A: {act}" if len(c) == 2 else f"A: {act}"


def _jsonable(c: Candidate) -> list:
    return [[bw, dtype.value] for bw, dtype in c]


def _from_json(c: list) -> Candidate:
    return tuple((int(bw), DataType(dtype)) for bw, dtype in c)


def _for_group(c: Candidate, group: QuantizerGroup) -> Candidate:
    return c if group.has_params else (c[0],)


# ---------------------------------------------------------------------------------------------- groups
@dataclass(eq=False)
class _Slot:
    """One quantizer slot: ``module.<kind>[key]``."""

    module: QuantizationMixin
    kind: str  # "input", "output", "param"
    key: int | str
    original: QuantizerBase
    variants: dict[Precision, QuantizerBase | None] = field(default_factory=dict)

    def set(self, q: QuantizerBase | None) -> None:
        if self.kind == "input":
            self.module.input_quantizers[self.key] = q
        elif self.kind == "output":
            self.module.output_quantizers[self.key] = q
        else:
            self.module.param_quantizers[self.key] = q

    def variant(self, p: Precision) -> QuantizerBase | None:
        """The quantizer of this slot at precision ``p`` (made once, then kept with its encodings)."""
        if p not in self.variants:
            bw, dtype = p
            if dtype is DataType.FLOAT:
                self.variants[p] = None if bw == 32 else FloatQuantizeDequantize(dtype=torch.float16)
            elif self.original.bitwidth == bw:
                self.variants[p] = self.original
            else:
                self.variants[p] = construction.with_bitwidth(self.original, bw)
        return self.variants[p]


@dataclass(eq=False)
class _Group:
    public: QuantizerGroup
    act: list[_Slot]
    params: list[_Slot]
    layers: list[str]  # Conv/Linear modules whose BitOps it sets (activation and weights)
    fed: list[str]  # Conv/Linear modules whose input precision it sets

    def apply(self, c: Candidate) -> None:
        for s in self.act:
            s.set(s.variant(c[0]))
        if len(c) == 2:
            for s in self.params:
                s.set(s.variant(c[1]))

    def off(self) -> None:
        for s in itertools.chain(self.act, self.params):
            s.set(None)


_INVARIANT_MODULES = (nn.Identity, nn.Flatten, nn.Unflatten, nn.modules.dropout._DropoutNd, nn.MaxPool1d,
                      nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d)
_INVARIANT_OPS = {"view", "reshape", "flatten", "permute", "transpose", "contiguous", "getitem", "squeeze",
                  "unsqueeze", "expand", "t", "clone", "detach", "unflatten", "dropout", "max_pool1d", "max_pool2d",
                  "max_pool3d", "identity", "select", "slice", "narrow", "split", "chunk", "unbind", "view_as",
                  "reshape_as", "expand_as", "alias", "_unsafe_view", "movedim", "swapaxes", "lift_fresh_copy"}
_WEIGHTED = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Linear)


def _op_name(node: fx.Node) -> str:
    """``reshape`` for ``aten.reshape.default``, ``torch.reshape``, ``"reshape"`` (a method) alike."""
    t = node.target
    schema = getattr(t, "_schema", None)
    if schema is not None:  # an aten OpOverload (torch.export)
        return schema.name.split("::")[-1]
    return (t if isinstance(t, str) else getattr(t, "__name__", str(t))).split(".")[-1]


def _feeding_slot(sim: QuantizationSimModel, node: fx.Node, slots: dict[tuple[int, str, Any], _Slot]
                  ) -> _Slot | None:
    """The activation quantizer whose output ``node``'s module reads: walk back from its first input through
    value-preserving ops to the producer's output quantizer."""
    args = [a for a in node.args if isinstance(a, fx.Node)]
    cur = args[0] if args else None
    while cur is not None:
        if cur.op == "call_module":
            m = sim.model.get_submodule(cur.target)
            if isinstance(m, QuantizationMixin) and len(m.output_quantizers) and m.output_quantizers[0] is not None:
                return slots.get((id(m), "output", 0))
            if not isinstance(m, _INVARIANT_MODULES):
                return None
        elif cur.op in ("call_function", "call_method"):
            if _op_name(cur) not in _INVARIANT_OPS:
                return None
        else:
            return None
        nxt = [a for a in cur.args if isinstance(a, fx.Node)]
        cur = nxt[0] if nxt else None
    return None


def _build_groups(sim: QuantizationSimModel) -> tuple[list[_Group], list[str]]:
    """The quantizer groups of ``sim`` in model order, and the groups left out (non-affine quantizers)."""
    named = dict(sim.model.named_modules())
    names = {id(m): n for n, m in named.items()}
    slots: dict[tuple[int, str, Any], _Slot] = {}
    order: list[_Slot] = []
    for _, m in sim.quantized_modules():
        for kind, items in (("input", enumerate(m.input_quantizers)), ("output", enumerate(m.output_quantizers)),
                            ("param", m.param_quantizers.items())):
            for key, q in items:
                if q is not None:
                    slot = _Slot(m, kind, key, q)
                    slots[(id(m), kind, key)] = slot
                    order.append(slot)
    graph = getattr(sim, "_prepared", None)
    graph = graph.graph if graph is not None else None
    nodes = {n.target: n for n in graph.nodes if n.op == "call_module"} if graph is not None else {}
    by_feed: dict[int, list[QuantizationMixin]] = {}  # id(feeding slot) -> weighted modules, in model order
    feed_of: dict[int, _Slot] = {}
    alone: list[QuantizationMixin] = []  # weighted modules without a feeding activation quantizer
    for name, m in sim.quantized_modules():
        if not (isinstance(m, _WEIGHTED) and any(q is not None for q in m.param_quantizers.values())):
            continue
        own = [slots[(id(m), "input", i)] for i, q in enumerate(m.input_quantizers) if q is not None]
        feed = own[0] if own else (_feeding_slot(sim, nodes[name], slots) if name in nodes else None)
        if feed is None:
            alone.append(m)
        else:
            by_feed.setdefault(id(feed), []).append(m)
            feed_of[id(feed)] = feed
    groups: list[_Group] = []
    used: set[int] = set()

    def act_names(s: _Slot) -> tuple[tuple[str, ...], tuple[str, ...]]:
        n = names[id(s.module)]
        return ((f"{n}_input_quantizer_idx_{s.key}",), ()) if s.kind == "input" else ((), (n,))

    def add(act: list[_Slot], layers: list[QuantizationMixin], fed: list[str]) -> None:
        params = [slots[(id(m), "param", k)] for m in layers for k, q in m.param_quantizers.items() if q is not None]
        ins = tuple(n for s in act for n in act_names(s)[0])
        outs = tuple(dict.fromkeys(n for s in act for n in act_names(s)[1]))
        layer_names = [names[id(m)] for m in layers]
        public = QuantizerGroup(ins, outs, tuple(layer_names), tuple(fed or layer_names))
        groups.append(_Group(public, act, params, layer_names, fed))
        used.update(id(s) for s in act + params)

    for slot in order:  # model order: a group appears where its first quantizer does
        if id(slot) in used:
            continue
        if slot.kind == "param":
            owner = slot.module
            if any(owner is m for m in alone):
                add([], [owner], [])
            continue
        if id(slot) in by_feed:
            layers = by_feed[id(slot)]
            add([slot], layers, [names[id(m)] for m in layers])
        else:
            add([slot], [], [])
    excluded = []
    kept = []
    for g in groups:
        bad = [s for s in g.act + g.params if type(s.original) is not QuantizeDequantize]
        if bad:
            excluded.append(g.public.label())
        else:
            kept.append(g)
    return kept, excluded


def find_quantizer_groups(sim: QuantizationSimModel) -> list[QuantizerGroup]:
    """The quantizer groups of ``sim`` in model order (see the module docstring)."""
    if not isinstance(sim, QuantizationSimModel):
        raise TypeError(f"sim must be a QuantizationSimModel, got {type(sim).__name__}")
    return [g.public for g in _build_groups(sim)[0]]


# ---------------------------------------------------------------------------------------------- cost
def _mac_counts(sim: QuantizationSimModel, dummy_input: Any) -> dict[str, int]:
    """MACs per sample of every Conv/Linear module on ``dummy_input`` (the model in float)."""
    macs: dict[str, int] = {}
    modules = [(n, m) for n, m in sim.model.named_modules() if isinstance(m, _WEIGHTED)]

    def hook(name: str):
        def fn(mod: nn.Module, args: tuple, out: Any) -> None:
            if not isinstance(out, torch.Tensor) or out.dim() == 0:
                return
            per_sample = out.numel() // max(1, out.shape[0]) if out.dim() > 1 else out.numel()
            if isinstance(mod, nn.Linear):
                k = mod.in_features
            else:
                k = mod.weight.shape[1] * math.prod(mod.weight.shape[2:])
                if isinstance(mod, nn.modules.conv._ConvTransposeNd):
                    k = mod.weight.shape[0] // mod.groups * math.prod(mod.weight.shape[2:])
            macs[name] = macs.get(name, 0) + per_sample * k
        return fn
    handles = [m.register_forward_hook(hook(n)) for n, m in modules]
    try:
        qmodules = [m for _, m in sim.quantized_modules()]
        with quantizers_off(qmodules), eval_mode(sim.model), torch.no_grad():
            call_model(sim.model, dummy_input)
    finally:
        for h in handles:
            h.remove()
    return macs


@dataclass
class _Cost:
    macs: dict[str, int]
    baseline: Candidate

    def bit_ops(self, config: dict[int, Candidate], groups: list[_Group]) -> float:
        """BitOps with group ``i`` at ``config[i]`` (absent: the baseline)."""
        act = {name: _effective(self.baseline[0]) for name in self.macs}
        wgt = {name: _effective(self.baseline[1]) for name in self.macs}
        for i, g in enumerate(groups):
            c = config.get(i)
            if c is None:
                continue
            for name in g.fed:
                act[name] = _effective(c[0])
            if len(c) == 2:
                for name in g.layers:
                    wgt[name] = _effective(c[1])
        return sum(self.macs[n] * act[n] * wgt[n] for n in self.macs)

    def uniform(self, c: Candidate) -> float:
        return sum(self.macs.values()) * _effective(c[0]) * _effective(c[1])


# ---------------------------------------------------------------------------------------------- search
def _binary_search_ascending(values: Sequence[Callable[[], float]], target: float) -> int:
    """Index of the first of ``values`` (ascending) at or above ``target`` (AIMET's search)."""
    left, right = 0, len(values) - 1
    if target <= values[left]():
        return left
    if target >= values[right]():
        return right
    while right - left > 1:
        mid = min(max(left + (right - left) // 2, left + 1), right - 1)
        v = values[mid]()
        if v < target:
            left = mid
        elif v > target:
            right = mid
        else:
            left = right = mid
    return left if values[left]() >= target else right


def _interpolation_search_ascending(values: Sequence[Callable[[], float]], target: float) -> int:
    left, right = 0, len(values) - 1
    lo, hi = values[left](), values[right]()
    if target <= lo:
        return left
    if target >= hi:
        return right
    while right - left > 1:
        frac = (target - lo) / (hi - lo) if hi != lo else 0.5
        mid = min(max(left + int(round((right - left) * frac)), left + 1), right - 1)
        v = values[mid]()
        if v < target:
            left, lo = mid, v
        elif v > target:
            right, hi = mid, v
        else:
            left = right = mid
    return left if values[left]() >= target else right


def _search_ascending(values: Sequence[Callable[[], float]], target: float, algo: AMPSearchAlgo) -> int:
    """The smallest index of ``values`` (scores of ever dearer configurations, roughly ascending) at or above
    ``target`` (the last when none is): phase 2 in reverse."""
    if algo is AMPSearchAlgo.BruteForce:
        meeting = [i for i, v in enumerate(values) if v() >= target]  # every point evaluated
        return meeting[0] if meeting else len(values) - 1
    fn = _binary_search_ascending if algo is AMPSearchAlgo.Binary else _interpolation_search_ascending
    return fn(values, target)


def _search(values: Sequence[Callable[[], float]], target: float, algo: AMPSearchAlgo) -> int:
    """The largest index of ``values`` (scores of ever cheaper configurations, roughly descending) still at or
    above ``target`` (0 when none is)."""
    if algo is AMPSearchAlgo.BruteForce:
        best = 0
        for i, v in enumerate(values):
            if v() >= target:
                best = i
        return best
    rev = list(reversed(values))
    fn = _binary_search_ascending if algo is AMPSearchAlgo.Binary else _interpolation_search_ascending
    return len(values) - 1 - fn(rev, target)


AccuracyEntry = tuple[QuantizerGroup, Candidate, float, float]
ParetoEntry = tuple[float, float, QuantizerGroup, Candidate]


class _MixedPrecision:
    def __init__(self, sim: QuantizationSimModel, dummy_input: Any, candidates: list[Candidate],
                 phase1: Callable[[nn.Module], Any], phase2: Callable[[nn.Module], Any],
                 forward_pass_callback: Callable[[nn.Module], Any], results_dir: str, clean_start: bool,
                 use_all_amp_candidates: bool, progress: bool) -> None:
        self.sim = sim
        self.phase1 = phase1
        self.phase2 = phase2
        self.forward = forward_pass_callback
        self.results_dir = results_dir
        self.clean_start = clean_start
        self.progress = progress
        self.groups, excluded = _build_groups(sim)
        if excluded:
            warnings.warn(f"choose_mixed_precision: {len(excluded)} quantizer groups keep their precision "
                          f"(not integer QuantizeDequantize quantizers): {', '.join(excluded[:5])}"
                          + (" ..." if len(excluded) > 5 else ""), UserWarning, stacklevel=3)
        if not self.groups:
            raise ValueError("sim has no quantizer group whose precision can change")
        self.supported = [self._supported(g, candidates, use_all_amp_candidates) for g in self.groups]
        self.options = [c for c in candidates if all(_for_group(c, g.public) in sup for g, sup in
                                                     zip(self.groups, self.supported))]
        if not self.options:
            raise ValueError("no candidate is supported by every quantizer group (the config's supported_kernels); "
                             "pass use_all_amp_candidates=True to ignore them")
        self.macs = _mac_counts(sim, dummy_input)
        self.fp32 = math.nan
        self.scores: list[tuple[float, Candidate]] = []
        self.baseline: Candidate = self.options[0]
        self.final_score = math.nan
        self.times: dict[str, float] = {}

    def _supported(self, g: _Group, candidates: list[Candidate], use_all: bool) -> list[Candidate]:
        mine = list(dict.fromkeys(_for_group(c, g.public) for c in candidates))
        if use_all:
            return mine
        allowed: set[Candidate] | None = None
        for name in g.public.supported_kernel_ops or g.layers:
            module = self.sim.model.get_submodule(name)
            kernels = self.sim.config.supported_kernels(op_types_of(module)[0])
            if kernels is None:
                continue
            here = set()
            for k in kernels:
                act = _precision((k["activation"]["bitwidth"], k["activation"]["dtype"]), "supported_kernels")
                if "param" in k:
                    par = _precision((k["param"]["bitwidth"], k["param"]["dtype"]), "supported_kernels")
                    here.add(_for_group((act, par), g.public))
                else:
                    here.add((act,))
            allowed = here if allowed is None else allowed & here
        return mine if allowed is None else [c for c in mine if c in allowed or (c[:1] in allowed)]

    # -- configurations ------------------------------------------------------------------------------
    def _all_off(self) -> Any:
        return quantizers_off([m for _, m in self.sim.quantized_modules()])

    def _set(self, config: dict[int, Candidate | None]) -> None:
        for i, g in enumerate(self.groups):
            c = config.get(i, self.baseline)
            if c is None:
                g.off()
            else:
                g.apply(_for_group(c, g.public))

    def _uniform(self, c: Candidate) -> dict[int, Candidate]:
        return {i: _for_group(c, g.public) for i, g in enumerate(self.groups)}

    def _evaluate(self, fn: Callable[[nn.Module], Any]) -> float:
        return evaluate_score(fn, self.sim.model, "eval callbacks")

    # -- steps -----------------------------------------------------------------------------------------
    def candidates_scores(self) -> None:
        with self._all_off():
            self.fp32 = self._evaluate(self.phase2)
        for c in self.options:
            self._set(self._uniform(c))
            self.sim.compute_encodings(self.forward, progress=False)  # every slot's quantizer at c: calibrated
            self.scores.append((self._evaluate(self.phase2), c))
        best = max(range(len(self.scores)), key=lambda i: (self.scores[i][0], -i))
        self.baseline = self.scores[best][1]
        self.cost = _Cost(self.macs, self.baseline)

    def lowest(self) -> tuple[float, Candidate]:
        return min(((s, c) for s, c in self.scores), key=lambda sc: (self.cost.uniform(sc[1]), -sc[0]))

    def accuracy_list(self) -> list[AccuracyEntry]:
        cache = os.path.join(self.results_dir, ".cache", "accuracy_list.json")
        done: dict[tuple[int, tuple], tuple[float, float]] = {}
        if os.path.isfile(cache):
            if self.clean_start:
                os.remove(cache)
            else:
                with open(cache, encoding="utf-8") as f:
                    for entry in json.load(f):
                        done[(entry["group_index"], tuple(map(tuple, entry["candidate"])))] = (entry["score"],
                                                                                              entry["bit_ops_reduction"])
        todo = [(i, c) for i, sup in enumerate(self.supported) for c in sup
                if c != _for_group(self.baseline, self.groups[i].public)]
        rows: list[tuple[int, Candidate, float, float]] = []
        bar = make_bar(len(todo), enabled=self.progress, desc="mixed precision phase 1", unit="eval")
        base_ops = self.cost.bit_ops({}, self.groups)
        try:
            with self._all_off():
                for i, c in todo:
                    key = (i, tuple(map(tuple, _jsonable(c))))
                    if key in done:
                        score, saving = done[key]
                    else:
                        self.groups[i].apply(c)
                        score = self._evaluate(self.phase1)
                        self.groups[i].off()
                        saving = base_ops - self.cost.bit_ops({i: c}, self.groups)
                    rows.append((i, c, score, saving))
                    self._save_accuracy_rows(rows, cache)
                    bar.advance()
        finally:
            bar.close()
            self._set({})

        def bits(c: Candidate) -> int:
            return sum(bw for bw, _ in c)
        # AIMET's order (score, larger bitwidths, larger saving, earlier group), with the changes that save no
        # BitOps (activations feeding no Conv/Linear) after the others: they cost accuracy for nothing in the cost
        rows.sort(key=lambda r: (r[3] > 0, r[2], bits(r[1]), r[3], -r[0]), reverse=True)
        self._rows = rows
        return [(self.groups[i].public, c, s, r) for i, c, s, r in rows]

    def _save_accuracy_rows(self, rows: list, path: str) -> None:
        write_json(path, [{"group_index": i, "group": self.groups[i].public.to_list(), "candidate": _jsonable(c),
                           "score": s, "bit_ops_reduction": r} for i, c, s, r in rows], indent=1)

    def _moves(self, reverse: bool) -> tuple[dict[int, Candidate], list[tuple[int, Candidate, Candidate]]]:
        """Phase 2's walk: the configuration it starts from and its moves ``(group, to, from)``.

        Forward, the accuracy list as is from the baseline. Reverse (AIMET's ``phase2_reverse``), from every group
        at the cheapest uniform candidate, the accuracy list read backwards (most sensitive change first): at each
        entry ``(group, candidate)`` the group moves up to the next of its candidates in that order (its next
        less sensitive one), or to the baseline after its last."""
        if not reverse:
            start: dict[int, Candidate] = {}
            current = {i: _for_group(self.baseline, g.public) for i, g in enumerate(self.groups)}
            moves = []
            for i, c, _, _ in self._rows:
                moves.append((i, c, current[i]))
                current[i] = c
            return start, moves
        rows = list(reversed(self._rows))
        order: dict[int, list[Candidate]] = {}
        for i, c, _, _ in rows:
            order.setdefault(i, []).append(c)
        start = self._uniform(self.lowest()[1])
        current = dict(start)
        moves = []
        for i, c, _, _ in rows:
            later = order[i][order[i].index(c) + 1:]
            to = later[0] if later else _for_group(self.baseline, self.groups[i].public)
            moves.append((i, to, current[i]))
            current[i] = to
        return start, moves

    def pareto(self, allowed_drop: float, algo: AMPSearchAlgo, refine: bool, reverse: bool = False
               ) -> list[ParetoEntry]:
        if not self._rows:  # no group has a cheaper candidate than the baseline
            self._set({})
            self.chosen = {}
            self.final_score = self._evaluate(self.phase2)
            return []
        start, moves = self._moves(reverse)
        base_ops = self.cost.bit_ops({}, self.groups)
        cache = os.path.join(self.results_dir, ".cache", "pareto_list_reverse.json" if reverse else "pareto_list.json")
        points: dict[int, ParetoEntry] = {}
        if os.path.isfile(cache) and not self.clean_start:
            with open(cache, encoding="utf-8") as f:
                saved = {(e["group_index"], tuple(map(tuple, e["candidate"]))): e for e in json.load(f)}
            for k, (i, c, _) in enumerate(moves):
                e = saved.get((i, tuple(map(tuple, _jsonable(c)))))
                if e is not None and e["prefix"] == k:
                    points[k] = (e["relative_bit_ops"], e["score"], self.groups[i].public, c)
        bar = make_bar(None, enabled=self.progress, desc="mixed precision phase 2", unit="eval")

        def config_of(k: int) -> dict[int, Candidate]:
            config = dict(start)
            for i, c, _ in moves[:k + 1]:
                config[i] = c
            return config

        def point(k: int) -> float:
            if k not in points:
                config = config_of(k)
                self._set(config)
                score = self._evaluate(self.phase2)
                i, c, _ = moves[k]
                points[k] = (self.cost.bit_ops(config, self.groups) / base_ops, score, self.groups[i].public, c)
                write_json(cache, [{"prefix": j, "group_index": moves[j][0], "candidate": _jsonable(moves[j][1]),
                                    "relative_bit_ops": p[0], "score": p[1]} for j, p in sorted(points.items())],
                           indent=1)
                bar.advance()
            return points[k][1]
        target = self.fp32 - allowed_drop
        try:
            values = [lambda k=k: point(k) for k in range(len(moves))]
            if not reverse:  # the longest prefix still within the budget
                k = _search(values, target, algo)
            elif math.isfinite(target):  # scores rise along the moves: the shortest prefix back within it
                k = _search_ascending(values, target, algo)
            else:  # no budget: the whole curve, and its cheapest point, the start
                for value in values:
                    value()
                k = -1
        finally:
            bar.close()
        if k < 0:
            chosen, met = dict(start), True
        else:
            met = points[k][1] >= target
            chosen = config_of(k) if met else {}  # no prefix keeps the budget: the baseline
        extra: list[ParetoEntry] = []
        if refine and math.isfinite(target) and (met or not reverse):
            # the scores along the list are not monotonic, so the search stops early: forward, try each later
            # change alone on top of the choice (every change, when none met the budget); reverse, try to undo
            # each move the choice made, latest first
            trials = ([(i, c) for i, c, _ in moves[k + 1 if met else 0:]] if not reverse else
                      [(i, previous) for i, _, previous in reversed(moves[:k + 1])])
            bar = make_bar(len(trials), enabled=self.progress, desc="mixed precision refine", unit="eval")
            try:
                for j, (i, c) in enumerate(trials):
                    if reverse and chosen.get(i) != moves[k - j][1]:  # moved again later: not this move's to undo
                        bar.advance()
                        continue
                    trial = {**chosen, i: c}
                    if trial != chosen:
                        self._set(trial)
                        score = self._evaluate(self.phase2)
                        if score >= target:
                            chosen = trial
                            extra.append((self.cost.bit_ops(trial, self.groups) / base_ops, score,
                                          self.groups[i].public, c))
                    bar.advance()
            finally:
                bar.close()
        self._set(chosen)
        self.chosen = chosen
        self.final_score = self._evaluate(self.phase2)
        return [points[j] for j in sorted(points)] + extra

    # -- files -------------------------------------------------------------------------------------------
    def write(self, accuracy: list[AccuracyEntry], pareto: list[ParetoEntry], allowed_drop: float) -> None:
        d = self.results_dir
        write_json(os.path.join(d, "pareto_list.json"),
                   [[p[0], p[1], p[2].to_list(), candidate_str(p[3])] for p in pareto], indent=1)
        chosen_ops = self.cost.bit_ops(self.chosen, self.groups) / self.cost.bit_ops({}, self.groups)
        info = [["fp32 accuracy", self.fp32], ["baseline candidate", candidate_str(self.baseline)],
                ["candidate scores", [[candidate_str(c), s] for s, c in self.scores]],
                ["Phase1 Time", self.times.get("phase1", 0.0) / 60], ["Phase2 Time", self.times.get("phase2", 0.0) / 60],
                ["final score", self.final_score], ["final relative BitOps", chosen_ops],
                ["phase2 eval count", len(pareto)],
                ["groups changed", sum(1 for i in self.chosen if self.chosen[i] != _for_group(
                    self.baseline, self.groups[i].public))], ["total groups", len(self.groups)]]
        write_json(os.path.join(d, "amp_info_list.json"), info, indent=1)
        # phase 1: one bar per (group, candidate), grouped by candidate
        labels = [f"{g.label()} [{candidate_str(c)}]" for g, c, _, _ in accuracy]
        png = charts.bar_chart(labels, {"score with only this group quantized": [s for _, _, s, _ in accuracy]},
                               ylabel="score", title="Quantizer group sensitivity (phase 1)",
                               baselines={"fp32": self.fp32}, zoom=True)
        charts.save_png(png, os.path.join(d, "quantizer_group_sensitivity.png"))
        page = charts.Page("Quantizer group sensitivity")
        page.paragraph(f"Each group alone at a cheaper candidate than the baseline {candidate_str(self.baseline)}, "
                       f"all other quantizers off; fp32 score {self.fp32:.6g}. Least sensitive first.")
        page.image(png, "sensitivity")
        page.table(["group", "candidate", "score", "BitOps saving"],
                   [[g.label(), candidate_str(c), s, r] for g, c, s, r in accuracy])
        page.write(os.path.join(d, "quantizer_group_sensitivity.html"))
        # phase 2: the curve
        xs = [p[0] for p in pareto]
        ys = [p[1] for p in pareto]
        uniform = {candidate_str(c): ([self.cost.uniform(c) / self.cost.uniform(self.baseline)], [s])
                   for s, c in self.scores}
        front = sorted(zip(xs, ys))
        png = charts.scatter_chart({"mixed precision (evaluated points)": (xs, ys), **uniform},
                                   xlabel="BitOps relative to the baseline", ylabel="score",
                                   title="Accuracy vs BitOps", front=([x for x, _ in front], [y for _, y in front]),
                                   hline=(f"budget (fp32 − {allowed_drop:g})", self.fp32 - allowed_drop)
                                   if math.isfinite(allowed_drop) else None)
        charts.save_png(png, os.path.join(d, "pareto_curve.png"))
        page = charts.Page("Accuracy vs BitOps")
        page.paragraph(f"fp32 {self.fp32:.6g}; chosen configuration: score {self.final_score:.6g} at "
                       f"{chosen_ops:.3f}× the baseline's BitOps ({candidate_str(self.baseline)}).")
        page.image(png, "pareto curve")
        page.table(["relative BitOps", "score", "last group changed", "to"],
                   [[p[0], p[1], p[2].label(), candidate_str(p[3])] for p in pareto])
        page.table(["uniform candidate", "relative BitOps", "score"],
                   [[candidate_str(c), self.cost.uniform(c) / self.cost.uniform(self.baseline), s]
                    for s, c in self.scores])
        page.write(os.path.join(d, "pareto_curve.html"))
        if png is None:
            charts.warn_no_matplotlib("choose_mixed_precision")


def choose_mixed_precision(
    sim: QuantizationSimModel,
    dummy_input: Any,
    candidates: Sequence[Any],
    eval_callback_for_phase1: Callable[[nn.Module], float],
    eval_callback_for_phase2: Callable[[nn.Module], float],
    allowed_accuracy_drop: float | None,
    results_dir: str | os.PathLike,
    clean_start: bool,
    forward_pass_callback: Callable[[nn.Module], Any],
    use_all_amp_candidates: bool = False,
    phase2_reverse: bool = False,
    phase1_optimize: bool = True,
    amp_search_algo: AMPSearchAlgo = AMPSearchAlgo.Binary,
    *,
    refine: bool = True,
    progress: bool = True,
) -> list[ParetoEntry] | None:
    """Choose a precision per quantizer group so the score stays within ``allowed_accuracy_drop`` of fp32 at the
    least BitOps; ``sim`` is left in that configuration, calibrated (see the module docstring).

    Args:
        sim: the simulated model (any config; its integer quantizers change bitwidth).
        dummy_input: an input of the model (counts the MACs).
        candidates: ``((activation bits, dtype), (parameter bits, dtype))`` pairs; dtype ``int``/``float``
            (types, names, :class:`~quanta.quantsim.DataType` or AIMET's ``QuantizationDataType``).
        eval_callback_for_phase1: ``fn(model)`` or :class:`CallbackFunc` scoring the sensitivity of one group
            (higher is better; a small dataset, or :meth:`EvalCallbackFactory.sqnr`).
        eval_callback_for_phase2: the score the budget is about (your accuracy).
        allowed_accuracy_drop: the budget below the fp32 score; None evaluates every point of the curve and
            leaves the sim at its cheapest point.
        results_dir: where the files go (created); its ``.cache`` lets a run resume.
        clean_start: forget ``results_dir/.cache`` first (True when anything in the model or sim changed).
        forward_pass_callback: calibration, ``fn(model)`` or :class:`CallbackFunc`.
        use_all_amp_candidates: ignore the config's ``supported_kernels`` (else each group only takes the
            candidates its layers' kernels support).
        phase2_reverse: AIMET's bottom-up phase 2: start from every group at the cheapest candidate and move the
            most sensitive groups up first, stopping at the shortest walk that meets the budget (see the module
            docstring); worth it when most groups must stay at the baseline.
        phase1_optimize: AIMET's switch to its faster phase 1, which calibrates every group at a candidate once
            and reuses it: quanta's phase 1 always does (``False`` changes nothing). AIMET's phase 3 (convert-op
            reduction) is off in aimet-torch 2.42 and not in quanta.
        amp_search_algo: :class:`AMPSearchAlgo` of phase 2.
        refine: after the search, try each later change of the accuracy list alone on top of the chosen
            configuration and keep those that stay within the budget (one more evaluation per remaining
            change; the scores along the list are not monotonic, so the search alone stops early).
        progress: progress bars over the evaluations.

    Returns:
        The evaluated Pareto points ``(BitOps relative to the baseline, score, group, candidate)``: first the
        accuracy-list prefixes the search evaluated, in list order (all changes up to that group applied), then
        the changes ``refine`` kept (each on top of the ones before); None after an early exit.
    """
    if not isinstance(sim, QuantizationSimModel):
        raise TypeError(f"sim must be a QuantizationSimModel, got {type(sim).__name__}")
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Iterable):
        raise TypeError(f"candidates must be a list of candidates, got {type(candidates).__name__}")
    cands = list(dict.fromkeys(_candidate(c) for c in candidates))
    if len(cands) < 2:
        raise ValueError(f"candidates must hold at least two different candidates, got {len(cands)}")
    phase1 = check_callback("eval_callback_for_phase1", eval_callback_for_phase1)
    phase2 = check_callback("eval_callback_for_phase2", eval_callback_for_phase2)
    forward = check_callback("forward_pass_callback", forward_pass_callback)
    if allowed_accuracy_drop is not None and (isinstance(allowed_accuracy_drop, bool)
                                              or not isinstance(allowed_accuracy_drop, (int, float))
                                              or not allowed_accuracy_drop >= 0):
        raise ValueError(f"allowed_accuracy_drop must be None or a number >= 0, got {allowed_accuracy_drop!r}")
    for name, flag in (("clean_start", clean_start), ("use_all_amp_candidates", use_all_amp_candidates),
                       ("phase2_reverse", phase2_reverse), ("phase1_optimize", phase1_optimize),
                       ("refine", refine)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {flag!r}")
    try:
        algo = AMPSearchAlgo(amp_search_algo)
    except ValueError:
        raise ValueError(f"amp_search_algo must be an AMPSearchAlgo, got {amp_search_algo!r}") from None
    results_dir = output_directory(results_dir)

    mp = _MixedPrecision(sim, dummy_input, cands, phase1, phase2, forward, results_dir, clean_start,
                         use_all_amp_candidates, progress)
    mp.candidates_scores()
    drop = math.inf if allowed_accuracy_drop is None else float(allowed_accuracy_drop)
    best_score = max(s for s, _ in mp.scores)
    low_score, low = mp.lowest()
    if allowed_accuracy_drop is not None:
        if mp.fp32 - best_score > drop:
            warnings.warn(f"choose_mixed_precision: even the best candidate {candidate_str(mp.baseline)} scores "
                          f"{best_score:.6g}, more than {drop:g} below fp32 ({mp.fp32:.6g}); sim left at it",
                          UserWarning, stacklevel=2)
            mp._set({})
            return None
        if mp.fp32 - low_score < drop:  # the cheapest candidate everywhere already meets the budget
            mp._set(mp._uniform(low))
            return None
    t0 = time.perf_counter()
    accuracy = mp.accuracy_list()
    mp.times["phase1"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    # None asks for the whole curve: every point (AIMET's binary search would evaluate only the last one)
    pareto = mp.pareto(drop, AMPSearchAlgo.BruteForce if allowed_accuracy_drop is None else algo, refine,
                       reverse=phase2_reverse)
    mp.times["phase2"] = time.perf_counter() - t0
    mp.write(accuracy, pareto, drop)
    return pareto


class EvalCallbackFactory:
    """Ready-made phase-1 callbacks (AIMET's ``EvalCallbackFactory``).

    Args:
        data_loader: batches of model inputs (a tuple: positional inputs; a dict: keyword inputs).
        forward_fn: ``forward_fn(model, batch)`` returning the output to compare (default: the model called
            on the batch).
    """

    def __init__(self, data_loader: Iterable[Any], forward_fn: Callable[[nn.Module, Any], Any] | None = None) -> None:
        if isinstance(data_loader, (torch.Tensor, str, bytes)) or not isinstance(data_loader, Iterable):
            raise TypeError(f"data_loader must be an iterable of batches, got {type(data_loader).__name__}")
        if forward_fn is not None and not callable(forward_fn):
            raise TypeError(f"forward_fn must be callable, got {type(forward_fn).__name__}")
        self._data = data_loader
        self._forward = forward_fn or (lambda model, batch: call_model(model, batch))

    def sqnr(self, num_samples: int = 128) -> Callable[[nn.Module], float]:
        """``fn(model)``: the SQNR (dB) of the model's output against the same model with every quantizer off,
        over the first ``num_samples`` samples (the float outputs are computed once, on the first call)."""
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
        cache: dict[int, list[torch.Tensor]] = {}

        def batches() -> Iterable[Any]:
            seen = 0
            for batch in self._data:
                if seen >= num_samples:
                    return
                first = batch if isinstance(batch, torch.Tensor) else next(
                    (t for t in (batch.values() if isinstance(batch, dict) else batch) if isinstance(t, torch.Tensor)),
                    None)
                seen += first.shape[0] if first is not None and first.dim() else 1
                yield batch

        def flat(out: Any) -> list[torch.Tensor]:
            if isinstance(out, torch.Tensor):
                return [out.detach().as_subclass(torch.Tensor).double()]
            values = out.values() if isinstance(out, dict) else out if isinstance(out, (list, tuple)) else ()
            return [t for v in values for t in flat(v)]

        def evaluate(model: nn.Module) -> float:
            signal = noise = 0.0
            qmodules = [m for m in model.modules() if isinstance(m, QuantizationMixin)]
            with torch.no_grad():
                for k, batch in enumerate(batches()):
                    if k not in cache:
                        with quantizers_off(qmodules):
                            cache[k] = flat(self._forward(model, batch))
                    for r, o in zip(cache[k], flat(self._forward(model, batch))):
                        signal += float((r * r).sum())
                        noise += float(((o - r) ** 2).sum())
            if noise == 0:
                return math.inf
            return 10 * math.log10(signal / noise) if signal > 0 else -math.inf
        return evaluate
