"""Per-layer SQNR of a QuantizationSimModel against its float self: find the sensitive layers.

For each quantized module two numbers, accumulated over all batches
(``SQNR = 10·log10(Σ ref² / Σ (out − ref)²)``, in dB):

* ``sqnr_db`` (cumulative): the module's output in the quantized model vs
  its output in the float model (all quantizers off) — the error built up so far;
* ``local_sqnr_db``: the module with its quantizers vs the same module without
  them, on the same input — the error this layer adds by itself. The lowest
  values point at the layers to keep at higher precision.

>>> import torch
>>> from torch import nn
>>> from quanta.quantsim import QuantizationSimModel
>>> torch.manual_seed(0) and None
>>> model = nn.Sequential(nn.Linear(8, 8), nn.Softsign(), nn.Linear(8, 2))
>>> x = torch.randn(64, 8)
>>> sim = QuantizationSimModel(model, x)
>>> sim.compute_encodings([x], progress=False)
>>> report = sim.layer_sqnr([x])
>>> [row.name for row in report.layers]   # Softsign: a quantized Pointwise module
['0', '1', '2']
>>> report.output_sqnr_db > 30
True
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from quanta._inputs import call_model
from quanta.export.protocol import QuantizedModelLike
from quanta.nn.base import QuantizationMixin, eval_mode, quantizers_off
from quanta.quantsim.config import op_types_of

__all__ = ["LayerSQNR", "LayerSQNRReport", "layer_sqnr"]


@dataclass(frozen=True)
class LayerSQNR:
    """One row of the report (SQNR in dB; ``inf`` when the output is exact)."""

    name: str
    op_type: str
    sqnr_db: float
    local_sqnr_db: float


@dataclass
class LayerSQNRReport:
    """Per-layer SQNR rows in execution order, and the SQNR of the model's output."""

    layers: list[LayerSQNR]
    output_sqnr_db: float

    def most_sensitive(self, k: int = 5) -> list[LayerSQNR]:
        """The ``k`` layers with the lowest local SQNR."""
        return sorted(self.layers, key=lambda r: r.local_sqnr_db)[:k]

    def to_table(self) -> str:
        """A fixed-width text table."""
        width = max([len("layer")] + [len(r.name) for r in self.layers])
        twidth = max([len("type")] + [len(r.op_type) for r in self.layers])
        lines = [f"{'layer':<{width}}  {'type':<{twidth}}  {'SQNR dB':>8}  {'local dB':>8}"]
        for r in self.layers:
            lines.append(f"{r.name:<{width}}  {r.op_type:<{twidth}}  {r.sqnr_db:>8.2f}  {r.local_sqnr_db:>8.2f}")
        lines.append(f"{'model output':<{width}}  {'':<{twidth}}  {self.output_sqnr_db:>8.2f}")
        return "\n".join(lines)

    __str__ = to_table

    def plot(self, path: str, *, title: str = "Per-layer SQNR") -> None:
        """Save a bar chart (PNG, SVG, ... by extension) of both SQNRs per layer. Needs matplotlib
        (``pip install quanta[plot]``)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError("LayerSQNRReport.plot needs matplotlib: pip install 'quanta[plot]'") from None
        names = [r.name for r in self.layers]
        cap = lambda v: min(v, 100.0)  # noqa: E731  (exact layers: inf, drawn at 100 dB)
        fig, ax = plt.subplots(figsize=(max(7.0, 0.35 * len(names) + 2), 4.5))
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], [cap(r.sqnr_db) for r in self.layers], width=0.4, label="vs float model")
        ax.bar([x + 0.2 for x in xs], [cap(r.local_sqnr_db) for r in self.layers], width=0.4, label="layer alone")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(names, rotation=60, ha="right", fontsize=8)
        ax.set_ylabel("SQNR (dB)")
        ax.set_title(f"{title}\nmodel output: {self.output_sqnr_db:.1f} dB", fontsize=10)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


@dataclass
class _Acc:
    """Error of one output stream summed over calls: signal and noise energies, and per call the mean squared
    error of all its output elements (``mse_sum`` over ``calls``; ``samples``: the calls' batch sizes)."""

    signal: float = 0.0
    noise: float = 0.0
    mse_sum: float = 0.0
    calls: int = 0
    samples: int = 0

    def add(self, ref: torch.Tensor, out: torch.Tensor) -> float:
        """Add one tensor pair; returns its noise energy."""
        ref64 = ref.detach().double()
        noise = float(((out.detach().double() - ref64) ** 2).sum())
        self.signal += float((ref64 * ref64).sum())
        self.noise += noise
        return noise

    def add_call(self, refs: list[torch.Tensor], outs: list[torch.Tensor]) -> None:
        """Add the outputs of one call."""
        pairs = [(r, o) for r, o in zip(refs, outs) if r.shape == o.shape]
        if not pairs:
            return
        noise = sum(self.add(r, o) for r, o in pairs)
        self.mse_sum += noise / max(1, sum(r.numel() for r, _ in pairs))
        self.calls += 1
        self.samples += pairs[0][0].shape[0] if pairs[0][0].dim() else 1

    def db(self) -> float:
        if self.noise == 0:
            return math.inf
        if self.signal == 0:
            return -math.inf
        return 10 * math.log10(self.signal / self.noise)


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x.as_subclass(torch.Tensor)] if x.is_floating_point() else []
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    return []


def _quantizers_disabled(module: nn.Module) -> AbstractContextManager[None]:
    """Every quantizer slot of ``module``'s quantized modules (nested ones too) is None inside the block."""
    return quantizers_off(m for m in module.modules() if isinstance(m, QuantizationMixin))


@dataclass
class _State:
    ref: dict[str, list[list[torch.Tensor]]] = field(default_factory=dict)
    calls: dict[str, int] = field(default_factory=dict)
    cumulative: dict[str, _Acc] = field(default_factory=dict)
    local: dict[str, _Acc] = field(default_factory=dict)
    recording: bool = True
    inner: bool = False


def layer_sqnr(sim: QuantizedModelLike, batches: Iterable[Any]) -> LayerSQNRReport:
    """Build a :class:`LayerSQNRReport` for ``sim`` (a :class:`~quanta.quantsim.QuantizationSimModel`, or any
    :class:`~quanta.export.protocol.QuantizedModelLike`) on ``batches`` (inputs, tuples of inputs, or dicts of
    keyword inputs)."""
    errors = measure_layer_errors(sim, batches)
    rows = [LayerSQNR(e.name, e.op_type, e.cumulative.db(), e.local.db()) for e in errors.layers]
    return LayerSQNRReport(rows, errors.output.db())


@dataclass
class _LayerErrors:
    name: str
    op_type: str
    cumulative: _Acc
    local: _Acc


@dataclass
class _ModelErrors:
    layers: list[_LayerErrors]
    output: _Acc


def measure_layer_errors(sim: QuantizedModelLike, batches: Iterable[Any],
                         modules: Iterable[tuple[str, nn.Module]] | None = None) -> _ModelErrors:
    """Per module, in execution order: the error of its output in the quantized model against the float model
    (``cumulative``) and against itself in float on the same input (``local``), accumulated over ``batches``;
    and the error of the model's output. One float pass and one quantized pass per batch, whatever the number
    of layers. ``modules``: ``(name, module)`` pairs of ``sim.model`` (default: the quantized modules with at
    least one quantizer)."""
    if modules is None:
        # modules whose quantizers are all off (e.g. BatchNorm in a Conv-BN-ReLU supergroup) add no error: no row
        modules = [(name, m) for name, m in sim.quantized_modules() if next(iter(m._quantizers()), None) is not None]
    modules = list(modules)
    state = _State()
    order: list[str] = []

    def hook(name: str, module: nn.Module):
        def fn(mod: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if state.inner:
                return
            outs = _tensors(output)
            if state.recording:
                state.ref.setdefault(name, []).append([t.clone() for t in outs])
                if name not in order:
                    order.append(name)
                return
            k = state.calls.get(name, 0)
            state.calls[name] = k + 1
            refs = state.ref[name][k] if k < len(state.ref.get(name, [])) else []
            state.cumulative.setdefault(name, _Acc()).add_call(refs, outs)
            state.inner = True
            try:  # the same module in float, nested quantized modules (MHA out_proj) too
                with _quantizers_disabled(mod):
                    plain = _tensors(mod(*args, **kwargs))
            finally:
                state.inner = False
            state.local.setdefault(name, _Acc()).add_call(plain, outs)
        return fn

    handles = [m.register_forward_hook(hook(name, m), with_kwargs=True) for name, m in modules]
    out_acc = _Acc()
    try:
        with eval_mode(sim.model), torch.no_grad():
            for batch in batches:
                state.ref.clear()
                state.calls.clear()
                state.recording = True
                with _quantizers_disabled(sim.model):
                    ref_out = _tensors(call_model(sim.model, batch))
                state.recording = False
                q_out = _tensors(call_model(sim.model, batch))
                out_acc.add_call(ref_out, q_out)
    finally:
        for h in handles:
            h.remove()
    types = {name: op_types_of(m)[0] if isinstance(m, QuantizationMixin) else type(m).__name__
             for name, m in modules}
    return _ModelErrors([_LayerErrors(name, types[name], state.cumulative[name], state.local.get(name, _Acc()))
                         for name in order if name in state.cumulative], out_acc)
