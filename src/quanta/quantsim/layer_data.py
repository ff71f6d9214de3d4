"""Layer by layer through a sim: each layer's data for the layer-wise techniques (AdaRound, Sequential MSE).

A layer-wise technique changes a layer (its weights, its weight encodings), and
the next layer must then see inputs computed by the already-changed layers
before it. :class:`LayerWalker` hands each layer, in the order the model runs
them, its inputs in the sim (weights quantized, activations in float: the
caller turns the activation quantizers off) and, if asked, its inputs and
outputs in the float model, for every batch; the technique's ``visit`` then
changes the layer, and the walk goes on with the changed layer.

Two ways, one result:

* **graph** (the sim was captured as a graph): one pass over the graph, node after
  node over all batches, with the float and the weight-quantized values side by
  side (a value no quantized weight has touched yet is held once), each value
  dropped after its last use. Every layer's data is ready when its turn comes.
* **stream** (no graph, or the side-by-side values would take more than
  :data:`CACHE_MEMORY_FRACTION` of the memory available when the walk starts): for
  each remaining layer, the model runs up to that layer, batch after batch (and a
  second time in float for the float data), as AIMET does for every layer.

The float reference is the sim itself with its quantizers off; a layer whose
weights the technique changed (``keep_float_weights``) gets its original
weights back while the reference runs.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from quanta.nn import QuantizationMixin
from quanta.nn.base import quantizers_off
from quanta.quantsim.calibrate import run_node
from quanta.quantsim.capture import flat_inputs

__all__ = ["CACHE_MEMORY_FRACTION", "LayerData", "LayerWalker", "default_forward", "model_inputs", "run_order"]

logger = logging.getLogger(__name__)

#: Share of the memory available when a walk starts that the side-by-side values of the graph pass may use;
#: beyond it the remaining layers stream.
CACHE_MEMORY_FRACTION = 0.75


@dataclass
class LayerData:
    """One layer's data, one tensor per batch: its first input in the sim (``quant_inputs``), and when asked
    for, its first input and its output in the float model."""

    quant_inputs: list[torch.Tensor]
    float_inputs: list[torch.Tensor] | None = None
    float_outputs: list[torch.Tensor] | None = None


class _Stop(Exception):
    """Ends a forward pass once the wanted values are captured."""


def default_forward(model: nn.Module, batch: Any) -> Any:
    """Run one batch as AIMET's techniques do: a tensor as ``model(batch)``, a dict as ``model(**batch)``, an
    ``(inputs, labels)`` pair as ``model(inputs)`` (a tuple of inputs unpacked, a dict as keywords)."""
    if isinstance(batch, torch.Tensor):
        return model(batch)
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)) and len(batch) == 2:  # (inputs, labels)
        inputs = batch[0]
        if isinstance(inputs, Mapping):
            return model(**inputs)
        return model(*inputs) if isinstance(inputs, (tuple, list)) else model(inputs)
    raise TypeError(f"the data loader yielded a {type(batch).__name__}; pass forward_fn to say how a batch runs "
                    "the model (by default a tensor, an (inputs, labels) pair or a dict)")


def model_inputs(model: nn.Module, batches: Sequence[Any], forward_fn: Callable[[nn.Module, Any], Any]
                 ) -> list[tuple[tuple, dict]]:
    """The ``(args, kwargs)`` each batch calls ``model`` with (the model runs no further than its call)."""
    calls: list[tuple[tuple, dict]] = []

    def grab(module: nn.Module, args: tuple, kwargs: dict) -> None:
        calls.append((args, kwargs))
        raise _Stop

    handle = model.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        for b, batch in enumerate(batches):
            with contextlib.suppress(_Stop):
                forward_fn(model, batch)
            if len(calls) != b + 1:
                raise ValueError(f"forward_fn did not call the model for batch {b}")
    finally:
        handle.remove()
    return calls


def run_order(model: nn.Module, layers: list[tuple[str, QuantizationMixin]], call: tuple[tuple, dict],
              activations: tuple[type, ...] = ()) -> tuple[list[tuple[str, QuantizationMixin]], dict[str, nn.Module]]:
    """``layers`` in the order of their first call in one forward pass (layers never called are dropped, with a
    warning), and ``{layer name: module}`` for the layers whose output is next read by a module of one of the
    ``activations`` types."""
    order: list[QuantizationMixin] = []
    names = {m: n for n, m in layers}
    produced: dict[int, str] = {}  # id of a layer's output -> layer name, until something reads it
    following: dict[str, nn.Module] = {}

    def before(module: nn.Module, args: tuple) -> None:
        if module in names and module not in order:
            order.append(module)  # type: ignore[arg-type]
        if args and isinstance(args[0], torch.Tensor) and (name := produced.pop(id(args[0]), None)) is not None \
                and isinstance(module, activations):
            following[name] = module

    def after(module: nn.Module, args: tuple, output: Any) -> None:
        if module in names and isinstance(output, torch.Tensor) and names[module] not in following:
            produced[id(output)] = names[module]

    handles = []
    for m in model.modules():
        handles.append(m.register_forward_pre_hook(before))
        if m in names:
            handles.append(m.register_forward_hook(after))
    try:
        model(*call[0], **call[1])
    finally:
        for h in handles:
            h.remove()
    missing = [n for n, m in layers if m not in order]
    if missing:
        logger.warning("layers the model does not call are left as they are: %s", ", ".join(missing))
    return [(names[m], m) for m in order], following


def available_memory() -> float:
    """Bytes of memory available now (MemAvailable on Linux), or infinity when unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return math.inf


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, Mapping):
        return sum(_nbytes(v) for v in value.values())
    return 0


def _first_input(args: Any) -> torch.Tensor:
    x = args[0] if isinstance(args, (tuple, list)) else args
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"a layer-wise technique needs a tensor as the layer's first input, got {type(x).__name__}")
    return x


class _FloatWeights:
    """The float weights of changed layers, put back while the float reference runs."""

    def __init__(self) -> None:
        self.originals: dict[nn.Module, nn.Parameter] = {}

    def keep(self, module: nn.Module) -> None:
        self.originals[module] = nn.Parameter(module.weight.detach().clone(), requires_grad=False)

    @contextlib.contextmanager
    def restored(self, modules: Iterable[nn.Module]) -> Iterator[None]:
        chosen = {m: self.originals[m] for m in modules if m in self.originals}
        saved = {m: m._parameters["weight"] for m in chosen}
        try:
            for m, p in chosen.items():
                m._parameters["weight"] = p
            yield
        finally:
            for m, p in saved.items():
                m._parameters["weight"] = p


class LayerWalker:
    """Visit ``layers`` (``(name, module)`` in run order) of ``model`` with their data (see the module).

    Args:
        model: the sim's model, in eval mode, with its activation quantizers off.
        graph: the graph it was captured as, or None.
        layers: the layers to visit, in the order the model runs them.
        calls: ``(args, kwargs)`` of the model for every batch (:func:`model_inputs`).
        float_inputs / float_outputs: also collect the layer's input / output in the float model.
        keep_float_weights: ``visit`` changes the layer's weight: keep the original for the float reference.
    """

    def __init__(self, model: nn.Module, graph: fx.Graph | None, layers: list[tuple[str, QuantizationMixin]],
                 calls: list[tuple[tuple, dict]], *, float_inputs: bool = False, float_outputs: bool = False,
                 keep_float_weights: bool = False) -> None:
        self.model, self.graph, self.calls = model, graph, calls
        self.todo = dict(layers)  # name -> module, in the order they run
        self.names = {m: n for n, m in layers}
        self.want_float_inputs, self.want_float_outputs = float_inputs, float_outputs
        self.keep_float_weights = keep_float_weights
        self.qmodules = [m for m in model.modules() if isinstance(m, QuantizationMixin)]
        self.weights = _FloatWeights()

    def run(self, visit: Callable[[str, QuantizationMixin, LayerData], None]) -> str:
        """Visit every layer; returns how the data was collected: ``"graph"``, ``"stream"`` or
        ``"graph+stream"`` (memory ran short part way)."""
        budget = CACHE_MEMORY_FRACTION * available_memory()
        if self.graph is not None and self._by_graph(self.graph, budget, visit):
            return "graph"
        partly = self.graph is not None and len(self.todo) < len(self.names)
        self._by_stream(visit)
        return "graph+stream" if partly else "stream"

    def _visit(self, visit: Callable[[str, QuantizationMixin, LayerData], None], name: str,
               data: LayerData) -> None:
        module = self.todo.pop(name)
        if self.keep_float_weights:
            self.weights.keep(module)
        visit(name, module, data)

    @contextlib.contextmanager
    def _float_reference(self, modules: Iterable[nn.Module] | None = None) -> Iterator[None]:
        """Inside: ``modules`` (all by default) run in float with their original weights."""
        chosen = self.qmodules if modules is None else [
            q for m in modules for q in m.modules() if isinstance(q, QuantizationMixin)]
        with quantizers_off(chosen), self.weights.restored(chosen):
            yield

    # -- graph: one pass, float and quantized values side by side ------------------------------------
    def _by_graph(self, graph: fx.Graph, budget: float, visit: Callable) -> bool:
        """Visit the layers in one pass over ``graph``; False if memory ran short first (the layers not yet
        visited are left in :attr:`todo`)."""
        modules = dict(self.model.named_modules())
        nodes = list(graph.nodes)
        batches = range(len(self.calls))
        last_use: dict[fx.Node, int] = {}
        for i, node in enumerate(nodes):
            for a in node.all_input_nodes:
                last_use[a] = i
        quant: list[dict[fx.Node, Any]] = [{} for _ in batches]
        ref: list[dict[fx.Node, Any]] = [{} for _ in batches]
        shared: set[fx.Node] = set()  # nodes whose float and quantized values are the same (held once)
        placeholders = [n for n in nodes if n.op == "placeholder"]
        for b, (args, kwargs) in enumerate(self.calls):
            for ph, value in zip(placeholders, flat_inputs(self.model, args, kwargs)):  # type: ignore[arg-type]
                quant[b][ph] = value
        shared.update(placeholders)
        held = {n: sum(_nbytes(env[n]) for env in quant) for n in placeholders}
        seen: set[Any] = set()

        def float_env(b: int, inputs: list[fx.Node]) -> dict[fx.Node, Any]:
            return {a: quant[b][a] if a in shared else ref[b][a] for a in inputs}

        for i, node in enumerate(nodes):
            if node.op in ("placeholder", "output"):
                continue
            module = modules.get(node.target) if node.op == "call_module" else None  # type: ignore[arg-type]
            first_site = module is not None and node.target not in seen
            seen.add(node.target)
            inputs = node.all_input_nodes
            quantizes = isinstance(module, QuantizationMixin) and any(
                q is not None for q in module.param_quantizers.values())
            if all(a in shared for a in inputs) and not quantizes and module not in self.weights.originals:
                for env in quant:
                    env[node] = run_node(self.model, node, env)
                shared.add(node)
            else:
                with self._float_reference([] if module is None else [module]):
                    outs = [run_node(self.model, node, float_env(b, inputs)) for b in batches]
                if first_site and node.target in self.todo:
                    data = LayerData([_first_input(fx.node.map_arg(node.args, lambda n, b=b: quant[b][n]))
                                      for b in batches])
                    if self.want_float_inputs:
                        data.float_inputs = [_first_input(fx.node.map_arg(node.args, lambda n, b=b: float_env(
                            b, inputs)[n])) for b in batches]
                    if self.want_float_outputs:
                        data.float_outputs = outs
                    self._visit(visit, str(node.target), data)
                    del data
                for b in batches:
                    ref[b][node] = outs[b]
                    quant[b][node] = run_node(self.model, node, quant[b])
            for a in inputs:
                if last_use.get(a) == i:
                    for b in batches:
                        quant[b].pop(a, None)
                        ref[b].pop(a, None)
                    held.pop(a, None)
            held[node] = sum(_nbytes(q.get(node)) + _nbytes(r.get(node)) for q, r in zip(quant, ref))
            if not self.todo:
                return True
            if sum(held.values()) > budget:
                logger.info("graph pass needs more than %.2g GB; streaming the remaining %d layers",
                            budget / 2**30, len(self.todo))
                return False
        return not self.todo

    # -- stream: run the model up to each layer ---------------------------------------------------------
    def _by_stream(self, visit: Callable) -> None:
        for name in list(self.todo):
            module = self.todo[name]
            data = LayerData([self._capture(module, call, want_input=True) for call in self.calls])
            if self.want_float_inputs or self.want_float_outputs:
                with self._float_reference():
                    if self.want_float_inputs:
                        data.float_inputs = [self._capture(module, call, want_input=True) for call in self.calls]
                    if self.want_float_outputs:
                        data.float_outputs = [self._capture(module, call, want_input=False) for call in self.calls]
            self._visit(visit, name, data)

    def _capture(self, module: nn.Module, call: tuple[tuple, dict], want_input: bool) -> torch.Tensor:
        got: list[torch.Tensor] = []

        def hook(m: nn.Module, inputs: tuple, output: Any) -> None:
            got.append(_first_input(inputs) if want_input else output)
            raise _Stop

        handle = module.register_forward_hook(hook)
        try:
            with contextlib.suppress(_Stop):
                self.model(*call[0], **call[1])
        finally:
            handle.remove()
        if not got:
            raise RuntimeError(f"layer {self.names[module]} was not called by the model")
        return got[0].detach()
