"""Quantizer placement: which slots of the quantized modules get a quantizer, and with which spec.

Pure: from the config (:class:`~quanta.quantsim.config.QuantSimConfig`, which answers for one slot of one
module at a time) and facts about the captured graph it returns :class:`~quanta.quantsim.config.QuantizerSpec`\\ s;
it builds no quantizer and changes no module (:mod:`quanta.quantsim.construction` does). The graph facts:

* which modules read a model input or produce a model output (the config's ``model_input`` /
  ``model_output`` rules);
* how many tensors each concat joins (one input slot each);
* parameters read directly in ``forward()``: each is quantized, per tensor, as an input of the op that reads it;
* supergroups, chains of ops that run fused on the target (Conv -> ReLU): only the last op's output is quantized.

>>> import torch
>>> from torch import nn
>>> from quanta.quantsim import QuantSimConfig, prepare_model
>>> from quanta.quantsim.construction import quantize_modules, quantized_modules
>>> prepared = prepare_model(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), torch.randn(2, 8))
>>> _ = quantize_modules(prepared.model, prepared.method)  # quantized modules in place of the float ones
>>> modules = list(quantized_modules(prepared.model))
>>> placements = place(QuantSimConfig.load(), prepared.model, modules, prepared.graph)
>>> [p.outputs[0] is None for p in placements.values()]   # Linear -> ReLU: one output quantizer
[True, False, False]
>>> w = placements["0"].params["weight"]
>>> w.kind, w.spec.per_channel, placements["0"].params["bias"]
(<Kind.PARAMETER: 'parameter'>, True, None)
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from torch import fx, nn

from quanta.nn import QuantizationMixin
from quanta.nn.modules import QuantizedConcat, QuantizedEmbedding
from quanta.quantsim.config import QuantizerSpec, QuantSimConfig, op_types_of
from quanta.quantsim.preparer import _PASSTHROUGH_MODULES, _changes_values

__all__ = ["Kind", "ModulePlacement", "Placed", "place"]


class Kind(enum.Enum):
    """Which of the sim's defaults fill in what a spec leaves open."""

    ACTIVATION = "activation"  #: ``default_output_bw`` and ``quant_scheme``
    PARAMETER = "parameter"  #: ``default_param_bw`` and ``param_quant_scheme``


@dataclass(frozen=True)
class Placed:
    """One quantizer to build: its (enabled) spec and which defaults complete it."""

    spec: QuantizerSpec
    kind: Kind


@dataclass(frozen=True)
class ModulePlacement:
    """The quantizers of one quantized module: one entry per slot, None where the slot stays empty.

    ``inputs`` has one entry per tensor a concat joins (else as many as the module's input slots);
    ``fixed_range`` is the config's ``encoding_constraints``, a ``(min, max)`` output range never recalibrated.
    """

    inputs: tuple[Placed | None, ...]
    outputs: tuple[Placed | None, ...]
    params: Mapping[str, Placed | None]
    fixed_range: tuple[float, float] | None = None


def place(config: QuantSimConfig, model: nn.Module, modules: Iterable[tuple[str, QuantizationMixin]],
          graph: fx.Graph | None, param_inputs: Mapping[str, Mapping[int, str]] | None = None
          ) -> dict[str, ModulePlacement]:
    """The placement of every module in ``modules`` (``(name, module)`` pairs of ``model``, not nested in
    another quantized module), by name.

    ``graph`` is the captured graph (None: not captured; then no module reads a model input or writes a
    model output, and no supergroup applies). ``param_inputs`` maps a module to ``{input index: parameter
    target}`` for parameters read directly in ``forward()`` and fed to that input.
    """
    fed, out = _graph_io(graph)
    arity = _concat_arity(graph, model)
    fused = _fused(graph, model, config.supergroups, out)
    param_inputs = param_inputs or {}
    placements = {}
    for name, module in modules:
        op_types = op_types_of(module)
        params = {pname: _param(config.param_spec(name, op_types, pname), getattr(module, pname))
                  for pname in module.param_quantizers}
        n_inputs = arity.get(name, len(module.input_quantizers))
        integer_input = isinstance(module, QuantizedEmbedding)
        inputs = [None if integer_input else _activation(config.input_spec(name, op_types, i,
                                                                           is_model_input=name in fed))
                  for i in range(n_inputs)]
        for i, target in param_inputs.get(name, {}).items():
            if i < n_inputs:  # a parameter read in forward(): quantized as one
                inputs[i] = _parameter_read(config, model, target)
        outputs = [None if name in fused else _activation(config.output_spec(name, op_types, i,
                                                                             is_model_output=name in out))
                   for i in range(len(module.output_quantizers))]
        placements[name] = ModulePlacement(tuple(inputs), tuple(outputs), params,
                                           config.encoding_constraints(name, op_types))
    return placements


def _activation(spec: QuantizerSpec) -> Placed | None:
    return Placed(spec, Kind.ACTIVATION) if spec.enabled else None


def _param(spec: QuantizerSpec, param: object) -> Placed | None:
    return Placed(spec, Kind.PARAMETER) if spec.enabled and param is not None else None


def _parameter_read(config: QuantSimConfig, model: nn.Module, target: str) -> Placed | None:
    """Per tensor, for parameter ``target`` (``owner.name``) read directly in forward(), as the config says for
    a parameter ``name`` of module ``owner``."""
    owner, _, pname = target.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    spec = config.param_spec(owner or type(model).__name__, op_types_of(module), pname)
    if not spec.enabled:
        return None
    return Placed(dataclasses.replace(spec, per_channel=False, block_size=None),  # the op sees a moved/indexed copy
                  Kind.PARAMETER)


def _graph_io(graph: fx.Graph | None) -> tuple[set[str], set[str]]:
    """Names of modules fed by a model input, and of modules whose output is a model output."""
    fed: set[str] = set()
    out: set[str] = set()
    if graph is None:
        return fed, out
    for node in graph.nodes:
        if node.op == "call_module" and any(a.op == "placeholder" for a in node.all_input_nodes):
            fed.add(node.target)  # type: ignore[arg-type]
        if node.op == "output":
            out.update(a.target for a in node.all_input_nodes if a.op == "call_module")  # type: ignore[misc]
    return fed, out


def _concat_arity(graph: fx.Graph | None, model: nn.Module) -> dict[str, int]:
    """For every concat module the graph calls, how many tensors it joins."""
    if graph is None:
        return {}
    modules = dict(model.named_modules())
    return {n.target: len(n.args) for n in graph.nodes  # type: ignore[misc]
            if n.op == "call_module" and isinstance(modules.get(n.target), QuantizedConcat)}  # type: ignore[arg-type]


def _moves_values(node: fx.Node, modules: Mapping[str, nn.Module]) -> bool:
    """Whether ``node`` only moves or selects values (a dropout module, a view, a transpose, ...)."""
    if node.op == "call_module":
        return isinstance(modules.get(node.target), _PASSTHROUGH_MODULES)  # type: ignore[arg-type]
    return node.op in ("call_function", "call_method") and not _changes_values(node)


def _fused(graph: fx.Graph | None, model: nn.Module, supergroups: tuple[tuple[str, ...], ...],
           model_outputs: set[str]) -> set[str]:
    """Modules inside a supergroup (e.g. Conv -> ReLU) before its last op: their outputs are not quantized.

    A chain continues only through a node with one user that is not a model output; ops that only move
    values (dropout, view, ...) may sit between its members."""
    if graph is None or not supergroups:
        return set()
    modules = dict(model.named_modules())

    def types(node: fx.Node) -> tuple[str, ...]:
        module = modules.get(node.target) if node.op == "call_module" else None  # type: ignore[arg-type]
        return op_types_of(module) if isinstance(module, QuantizationMixin) else ()

    fused: set[str] = set()
    for group in supergroups:
        for node in graph.nodes:
            chain = [node]
            for op in group:
                cur = chain[-1]
                if op not in types(cur):
                    break
                if len(chain) == len(group):
                    chain.append(None)  # type: ignore[arg-type]  # matched
                    break
                users = list(cur.users)
                if len(users) != 1 or cur.target in model_outputs:
                    break
                nxt = users[0]
                while _moves_values(nxt, modules) and len(nxt.users) == 1:  # dropout, view, ... in between
                    nxt = next(iter(nxt.users))
                chain.append(nxt)
            if chain[-1] is None:
                fused.update(n.target for n in chain[:-2])  # type: ignore[misc]
    return fused
