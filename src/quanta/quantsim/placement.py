"""Quantizer placement: which slots of the quantized modules get a quantizer, and with which spec.

Pure: from the config (:class:`~quanta.quantsim.config.QuantSimConfig`, which answers for one slot of one
module at a time) and facts about the captured graph it returns :class:`~quanta.quantsim.config.QuantizerSpec`\\ s;
it builds no quantizer and changes no module (:mod:`quanta.quantsim.construction` does).

The config answers first, slot by slot (op types, module names, model inputs and outputs; a grid-preserving
op's output stays unquantized unless the config names its type). Then the graph, in the order aimet-torch
2.42's QuantSim applies the same rules:

1. supergroups, chains of ops that run fused on the target (Conv -> ReLU): only the last op's output is
   quantized, and only the first op's inputs; a BatchNorm that folds is looked through, a depthwise or 3-d
   convolution starts no chain;
2. a Conv/ConvTranspose/Linear whose only user is a BatchNorm folds it on the target: the BatchNorm's inputs
   and parameters stay in float and its output quantizer takes the convolution's (on or off);
3. AIMET's ``MatmulAdd`` pass when the config lists it: a matmul by a weight parameter whose only user adds a
   bias parameter is one op, so neither the matmul's output nor the bias is quantized;
4. AIMET's exception rules: a LayerNorm weight is symmetric only at 16 bits and more; with ``hw_version``
   V73 or later, Embedding and GroupNorm parameters take their output's bitwidth and symmetry; a MatMul's
   second input is 8-bit symmetric on V66-V69, and from V73 a 16-bit second input is symmetric and makes
   the first 16-bit;
5. a multiply or divide by a positive constant scalar of a quantized tensor is not requantized (its
   output lies on the input's grid, rescaled);
6. AIMET's encoding propagation: a ReLU's output quantizer also quantizes its producer's output (one
   quantizer object, :class:`Shared`), so do a concat's (on each input's producer) and, with an
   ``hw_version``, a resize's;

and parameters read directly in ``forward()`` are each quantized, per tensor, as an input of the op that
reads them; a concat gets one input slot per tensor it joins.

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
import math
import numbers
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import torch
from torch import fx, nn

from quanta.nn import QuantizationMixin
from quanta.nn import functional as qfunctional
from quanta.nn.modules import QuantizedConcat, QuantizedEmbedding
from quanta.quantsim.config import QuantizerSpec, QuantSimConfig, op_types_of
from quanta.quantsim.preparer import _PASSTHROUGH_MODULES, _changes_values

__all__ = ["Kind", "ModulePlacement", "Placed", "Shared", "place"]


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
class Shared:
    """A slot that holds the quantizer object built for another module's slot (AIMET's encoding propagation):
    output ``index`` of module ``module``, itself a :class:`Placed` slot."""

    module: str
    index: int


Slot = Placed | Shared | None


@dataclass(frozen=True)
class ModulePlacement:
    """The quantizers of one quantized module: one entry per slot, None where the slot stays empty.

    ``inputs`` has one entry per tensor a concat joins (else as many as the module's input slots);
    ``fixed_range`` is the config's ``encoding_constraints``, a ``(min, max)`` output range never recalibrated
    (``None`` for an end calibrated as usual).
    """

    inputs: tuple[Slot, ...]
    outputs: tuple[Slot, ...]
    params: Mapping[str, Placed | None]
    fixed_range: tuple[float | None, float | None] | None = None


# Where a slot is: (module name, "inputs" / "outputs" / "params", index or parameter name).
_Key = tuple[str, str, int | str]
_OLD_HTP = ("V66", "V68", "V69")  # HTP versions before 16-bit matmul weights
_FOLDING_TYPES = ("Conv", "ConvTranspose", "Gemm")  # ops a following BatchNorm folds into


def place(config: QuantSimConfig, model: nn.Module, modules: Iterable[tuple[str, QuantizationMixin]],
          graph: fx.Graph | None, param_inputs: Mapping[str, Mapping[int, str]] | None = None, *,
          output_bw: int = 8, param_bw: int = 8) -> dict[str, ModulePlacement]:
    """The placement of every module in ``modules`` (``(name, module)`` pairs of ``model``, not nested in
    another quantized module), by name.

    ``graph`` is the captured graph (None: not captured; then no module reads a model input or writes a
    model output, and no graph rule applies). ``param_inputs`` maps a module to ``{input index: parameter
    target}`` for parameters read directly in ``forward()`` and fed to that input. ``output_bw`` /
    ``param_bw`` are the sim's default bitwidths (some of AIMET's rules compare or copy bitwidths).
    """
    modules = list(modules)
    state = _State(config, model, dict(modules), graph, param_inputs or {}, output_bw, param_bw)
    for name, module in modules:
        state.configure(name, module)
    if graph is not None:
        state.apply_graph_rules()
    return state.result()


class _State:
    """Every slot's spec while the rules run: a :class:`Placed` (possibly with ``spec.enabled`` False, which
    later rules may read or turn on), :class:`Shared`, or None where the slot takes no quantizer."""

    def __init__(self, config: QuantSimConfig, model: nn.Module, modules: dict[str, QuantizationMixin],
                 graph: fx.Graph | None, param_inputs: Mapping[str, Mapping[int, str]], output_bw: int,
                 param_bw: int) -> None:
        self.config, self.model, self.modules, self.graph = config, model, modules, graph
        self.param_inputs, self.output_bw, self.param_bw = param_inputs, output_bw, param_bw
        self.slots: dict[str, dict[str, list[Slot] | dict[str, Placed | None]]] = {}
        self.fixed: dict[str, tuple[float | None, float | None] | None] = {}
        self._parameter_slots: set[_Key] = set()  # input slots fed by a parameter read in forward()
        self.nodes: dict[str, fx.Node] = {}  # module name -> its (first) call in the graph
        self.all_modules = dict(model.named_modules())
        if graph is not None:
            for node in graph.nodes:
                if node.op == "call_module" and node.target in modules:
                    self.nodes.setdefault(node.target, node)  # type: ignore[arg-type]
        self.fed, self.model_outputs = _graph_io(graph)
        self.arity = _concat_arity(graph, model)

    # -- the config, slot by slot ----------------------------------------------------------------------
    def configure(self, name: str, module: QuantizationMixin) -> None:
        config, op_types = self.config, op_types_of(module)
        params = {pname: (Placed(config.param_spec(name, op_types, pname), Kind.PARAMETER)
                          if getattr(module, pname) is not None else None)
                  for pname in module.param_quantizers}
        n_inputs = self.arity.get(name, len(module.input_quantizers))
        integer_input = isinstance(module, QuantizedEmbedding)
        inputs: list[Slot] = [None if integer_input else Placed(config.input_spec(name, op_types, i), Kind.ACTIVATION)
                              for i in range(n_inputs)]
        for i, target in self.param_inputs.get(name, {}).items():
            if i < n_inputs:  # a parameter read in forward(): quantized as one
                inputs[i] = _parameter_read(config, self.model, target)
                self._parameter_slots.add((name, "inputs", i))
        outputs: list[Slot] = [
            Placed(config.output_spec(name, op_types, i, is_model_output=name in self.model_outputs), Kind.ACTIVATION)
            for i in range(len(module.output_quantizers))]
        self.slots[name] = {"inputs": inputs, "outputs": outputs, "params": params}
        self.fixed[name] = config.encoding_constraints(name, op_types)

    # -- helpers -----------------------------------------------------------------------------------------
    def get(self, key: _Key) -> Slot:
        name, kind, index = key
        slots = self.slots[name][kind]
        if isinstance(slots, dict):
            return slots.get(index)  # type: ignore[arg-type]
        return slots[index] if 0 <= index < len(slots) else None  # type: ignore[operator]

    def set(self, key: _Key, slot: Slot) -> None:
        name, kind, index = key
        if self.get(key) is not None or isinstance(slot, Shared):
            self.slots[name][kind][index] = slot  # type: ignore[index]

    def switch(self, key: _Key, enabled: bool) -> None:
        placed = self.get(key)
        if isinstance(placed, Placed) and placed.spec.enabled != enabled:
            self.set(key, Placed(dataclasses.replace(placed.spec, enabled=enabled), placed.kind))

    def update(self, key: _Key, **changes: object) -> None:
        placed = self.get(key)
        if isinstance(placed, Placed):
            self.set(key, Placed(dataclasses.replace(placed.spec, **changes), placed.kind))  # type: ignore[arg-type]

    def enabled(self, key: _Key) -> bool:
        slot = self.get(key)
        return isinstance(slot, Shared) or (isinstance(slot, Placed) and slot.spec.enabled)

    def keys(self, name: str, kind: str) -> list[_Key]:
        slots = self.slots[name][kind]
        return [(name, kind, i) for i in (slots if isinstance(slots, dict) else range(len(slots)))]

    def module_of(self, node: fx.Node) -> str | None:
        """The quantized module ``node`` calls, or None."""
        if node.op == "call_module" and node.target in self.slots:
            return node.target  # type: ignore[return-value]
        return None

    def result(self) -> dict[str, ModulePlacement]:
        def final(slot: Slot) -> Slot:
            if isinstance(slot, Placed):
                return slot if slot.spec.enabled else None
            return slot

        return {name: ModulePlacement(tuple(final(s) for s in slots["inputs"]),  # type: ignore[union-attr]
                                      tuple(final(s) for s in slots["outputs"]),  # type: ignore[union-attr]
                                      {p: final(s) for p, s in slots["params"].items()},  # type: ignore[union-attr,misc]
                                      self.fixed[name])
                for name, slots in self.slots.items()}

    # -- the graph rules -----------------------------------------------------------------------------------
    def apply_graph_rules(self) -> None:
        folds = self._folding_pairs()
        self._supergroups({bn for _, bn in folds})
        for conv, bn in folds:
            self._fold(conv, bn)
        self._model_inputs()
        if "MatmulAdd" in self.config.supergroup_passes:
            self._matmul_add()
        self._exception_rules()
        self._constant_rescales()
        self._propagate_encodings()

    def _folding_pairs(self) -> list[tuple[str, str]]:
        """(conv, BatchNorm) module pairs where the BatchNorm is the conv's only user (AIMET: the BatchNorm
        folds into it on the target; not a grouped ConvTranspose)."""
        pairs = []
        for name, node in self.nodes.items():
            module = self.modules[name]
            if not set(op_types_of(module)) & set(_FOLDING_TYPES) or len(node.users) != 1:
                continue
            if isinstance(module, nn.modules.conv._ConvTransposeNd) and module.groups != 1:
                continue
            bn = self.module_of(next(iter(node.users)))
            if bn is not None and "BatchNormalization" in op_types_of(self.modules[bn]):
                pairs.append((name, bn))
        return pairs

    def _fold(self, conv: str, bn: str) -> None:
        for key in self.keys(bn, "inputs") + self.keys(bn, "params"):
            self.switch(key, False)
        for i, key in enumerate(self.keys(bn, "outputs")):
            self.switch(key, self.enabled((conv, "outputs", min(i, len(self.slots[conv]["outputs"]) - 1))))
        for key in self.keys(conv, "outputs"):
            self.switch(key, False)

    def _model_inputs(self) -> None:
        """The config's ``model_input`` for the input slots a floating-point model input feeds (after the
        supergroups, as in AIMET: a model input read by an op inside a chain is still quantized), except those
        of an op the config leaves in float (its output not quantized: the built-in default's residual adds),
        which reads its inputs in float."""
        for name, indices in self.fed.items():
            if name not in self.slots:
                continue
            op_types = op_types_of(self.modules[name])
            if self.slots[name]["outputs"] and not self.config.output_spec(name, op_types, 0).enabled:
                continue
            for i in indices:
                if isinstance(self.get((name, "inputs", i)), Placed) and (name, "inputs", i) not in self._parameter_slots:
                    spec = self.config.input_spec(name, op_types, i, is_model_input=True)
                    self.set((name, "inputs", i), Placed(spec, Kind.ACTIVATION))

    def _supergroups(self, folded: set[str]) -> None:
        for chain in _chains(self.graph, self.all_modules, self.slots, self.config.supergroups,
                             self.model_outputs, folded):
            for name in chain[1:]:
                for key in self.keys(name, "inputs"):
                    self.switch(key, False)
            for name in chain[:-1]:
                for key in self.keys(name, "outputs"):
                    self.switch(key, False)

    def _matmul_add(self) -> None:
        for name, node in self.nodes.items():
            if "MatMul" not in op_types_of(self.modules[name]) or 1 not in self.param_inputs.get(name, {}):
                continue
            if len(node.users) != 1:
                continue
            add = self.module_of(next(iter(node.users)))
            if add is None or "Add" not in op_types_of(self.modules[add]):
                continue
            add_node = self.nodes[add]
            bias = [i for i, target in self.param_inputs.get(add, {}).items()
                    if i < len(add_node.args) and add_node.args[i] is not node]
            if not bias:
                continue
            for key in self.keys(name, "outputs"):
                self.switch(key, False)
            for i in bias:
                self.switch((add, "inputs", i), False)

    def _exception_rules(self) -> None:
        hw = self.config.hw_version
        for name, module in self.modules.items():
            out = self.get((name, "outputs", 0)) if self.slots[name]["outputs"] else None
            if isinstance(module, nn.LayerNorm):
                weight = self.get((name, "params", "weight"))
                if isinstance(weight, Placed):
                    self.update((name, "params", "weight"), symmetric=(weight.spec.bitwidth or self.param_bw) >= 16)
            elif isinstance(module, (nn.Embedding, nn.GroupNorm)) and hw is not None and hw not in _OLD_HTP:
                if not isinstance(out, Placed) or (isinstance(module, nn.GroupNorm) and
                                                   self.get((name, "params", "weight")) is None):
                    continue
                for key in self.keys(name, "params"):
                    self.update(key, bitwidth=out.spec.bitwidth or self.output_bw, symmetric=out.spec.symmetric)
            elif isinstance(module, qfunctional.MatMul) and hw is not None:
                self._matmul_rule(name, hw)

    def _matmul_rule(self, name: str, hw: str) -> None:
        first, second = (self._target(name, i) for i in (0, 1))
        if hw in _OLD_HTP:
            if second is not None:
                self.update(second, symmetric=True, bitwidth=8)
            return
        if first is None or second is None:
            return
        placed = self.get(second)
        if isinstance(placed, Placed) and (placed.spec.bitwidth or self.output_bw) == 16:
            self.update(second, symmetric=True)
            self.update(first, bitwidth=16)

    def _target(self, name: str, index: int) -> _Key | None:
        """The quantizer that quantizes input ``index`` of module ``name``: its input quantizer if on, else the
        closest producer's output (or first input) quantizer, through ops that only move values."""
        if self.enabled((name, "inputs", index)):
            return name, "inputs", index
        node = self.nodes.get(name)
        if node is None or index >= len(node.args) or not isinstance(node.args[index], fx.Node):
            return None
        source: fx.Node | None = node.args[index]  # type: ignore[assignment]
        while source is not None:
            producer = self.module_of(source)
            if producer is not None:
                if self.enabled((producer, "outputs", 0)):
                    return producer, "outputs", 0
                if self.slots[producer]["inputs"] and self.enabled((producer, "inputs", 0)):
                    return producer, "inputs", 0
            elif source.op == "placeholder":
                return None
            tensors = [a for a in source.all_input_nodes if a.op != "get_attr"]
            source = tensors[0] if len(tensors) == 1 or (producer is None and tensors) else None
        return None

    def _constant_rescales(self) -> None:
        for name, node in self.nodes.items():
            module = self.modules[name]
            if not isinstance(module, (qfunctional.Multiply, qfunctional.Divide)) or len(node.args) != 2:
                continue
            data, scale = 0, 1
            if isinstance(module, qfunctional.Multiply) and _positive_scalar(node.args[1], self.model) is None:
                data, scale = 1, 0
            if _positive_scalar(node.args[scale], self.model) is None:
                continue
            target = self._target(name, data)
            if target is not None and self.enabled(target):
                self.switch((name, "inputs", scale), False)
                self.switch((name, "outputs", 0), False)

    def _propagate_encodings(self) -> None:
        hw = self.config.hw_version
        owner: dict[_Key, _Key] = {}  # a slot holding a shared quantizer -> the output slot that owns it

        def root(key: _Key) -> _Key:
            while key in owner:
                key = owner[key]
            return key

        def propagates(name: str) -> bool:
            module = self.modules[name]
            types = op_types_of(module)
            return (isinstance(module, nn.ReLU) or isinstance(module, QuantizedConcat)
                    or (hw is not None and "Resize" in types))

        for node in reversed(list(self.graph.nodes)):  # type: ignore[union-attr]
            name = self.module_of(node)
            if name is None or self.nodes.get(name) is not node or len(self.slots[name]["outputs"]) != 1:
                continue
            if not propagates(name) or not self.enabled((name, "outputs", 0)):
                continue
            source = root((name, "outputs", 0))
            fixed = self.fixed.get(source[0])
            for arg in node.args:
                if isinstance(arg, fx.Node):
                    self._share(arg, node, source, fixed is not None, owner)

    def _share(self, value: fx.Node, consumer: fx.Node, source: _Key, fixed: bool, owner: dict) -> None:
        if len(value.users) > 1 and fixed:
            return
        if value.op == "placeholder":
            name = self.module_of(consumer)
            if name is not None and value in consumer.args:
                key = (name, "inputs", consumer.args.index(value))
                if self.get(key) is not None:
                    self.slots[name]["inputs"][key[2]] = Shared(source[0], source[2])  # type: ignore[index]
                    owner[key] = source
            return
        producer = self.module_of(value)
        if producer is not None:
            key = (producer, "outputs", 0)
            if len(self.slots[producer]["outputs"]) == 1 and self.enabled(key) and key != source:
                self.slots[producer]["outputs"][0] = Shared(source[0], source[2])  # type: ignore[index]
                owner[key] = source
            return
        if _moves_values(value, self.all_modules) and not isinstance(
                self.all_modules.get(value.target) if value.op == "call_module" else None,  # type: ignore[arg-type]
                tuple(m for m in _PASSTHROUGH_MODULES if m is not nn.Identity)):
            for arg in value.all_input_nodes:
                self._share(arg, value, source, fixed, owner)


def _parameter_read(config: QuantSimConfig, model: nn.Module, target: str) -> Placed:
    """Per tensor, for parameter ``target`` (``owner.name``) read directly in forward(), as the config says for
    a parameter ``name`` of module ``owner``."""
    owner, _, pname = target.rpartition(".")
    module = model.get_submodule(owner) if owner else model
    spec = config.param_spec(owner or type(model).__name__, op_types_of(module), pname)
    return Placed(dataclasses.replace(spec, per_channel=False, block_size=None),  # the op sees a moved/indexed copy
                  Kind.PARAMETER)


def _positive_scalar(arg: object, model: nn.Module) -> float | None:
    """A constant positive finite scalar (a Python number, or a one-element tensor that is not a parameter)."""
    if isinstance(arg, fx.Node):
        if arg.op != "get_attr":
            return None
        value = model
        for part in arg.target.split("."):  # type: ignore[union-attr]
            value = getattr(value, part, None)
        if not isinstance(value, torch.Tensor) or isinstance(value, nn.Parameter) or value.numel() != 1:
            return None
        arg = value.item()
    if isinstance(arg, bool) or not isinstance(arg, numbers.Real):
        return None
    value = float(arg)
    return value if value > 0 and math.isfinite(value) else None


def _is_float(node: fx.Node) -> bool:
    """Whether a placeholder holds floating-point values (unknown: assumed so)."""
    value = node.meta.get("val", node.meta.get("quanta_value"))
    meta = node.meta.get("tensor_meta")
    dtype = getattr(value, "dtype", None) or getattr(meta, "dtype", None)
    return dtype is None or dtype.is_floating_point or dtype.is_complex


def _graph_io(graph: fx.Graph | None) -> tuple[dict[str, set[int]], set[str]]:
    """For each module fed by a floating-point model input (directly or through ops that only move values), the
    indices of those inputs; and the names of modules whose output is a model output."""
    fed: dict[str, set[int]] = {}
    out: set[str] = set()
    if graph is None:
        return fed, out
    from_input: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "placeholder":
            if _is_float(node):
                from_input.add(node)
        elif node.op == "call_module":
            for i, arg in enumerate(node.args):
                if isinstance(arg, fx.Node) and arg in from_input:
                    fed.setdefault(node.target, set()).add(i)  # type: ignore[arg-type]
        elif node.op in ("call_function", "call_method") and not _changes_values(node):
            tensors = [a for a in node.all_input_nodes if a.op != "get_attr"]
            if tensors and tensors[0] in from_input:
                from_input.add(node)
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


def _starts_no_chain(module: nn.Module) -> bool:
    """A depthwise or 3-d convolution (AIMET's targets run it unfused)."""
    if isinstance(module, (nn.Conv3d, nn.ConvTranspose3d)):
        return True
    if isinstance(module, nn.Conv2d | nn.Conv1d) and module.groups != 1:
        return module.weight.shape[1] == 1
    if isinstance(module, nn.ConvTranspose2d | nn.ConvTranspose1d) and module.groups != 1:
        return module.weight.shape[0] == module.groups
    return False


def _chains(graph: fx.Graph | None, modules: Mapping[str, nn.Module], quantized: Mapping[str, object],
            supergroups: tuple[tuple[str, ...], ...], model_outputs: set[str], folded: set[str]
            ) -> Iterator[list[str]]:
    """The module chains that match a supergroup (e.g. Conv -> ReLU), by name, longest groups first; an op
    belongs to one chain at most.

    A chain continues only through a node with one user that is not a model output; ops that only move
    values (dropout, view, ...) and the BatchNorms in ``folded`` may sit between its members."""
    if graph is None or not supergroups:
        return

    def types(node: fx.Node) -> tuple[str, ...]:
        if node.op != "call_module" or node.target not in quantized:
            return ()
        return op_types_of(modules[node.target])  # type: ignore[index]

    def skip(node: fx.Node) -> bool:
        return (_moves_values(node, modules) or node.target in folded) and len(node.users) == 1

    taken: set[str] = set()
    for group in sorted(supergroups, key=len, reverse=True):
        for node in graph.nodes:
            if group[0] not in types(node) or node.target in folded or _starts_no_chain(modules[node.target]):  # type: ignore[index]
                continue
            chain = [node]
            while len(chain) < len(group):
                cur = chain[-1]
                users = list(cur.users)
                if len(users) != 1 or cur.target in model_outputs:
                    break
                nxt = users[0]
                while skip(nxt):  # dropout, view, a folded BatchNorm ... in between
                    nxt = next(iter(nxt.users))
                if group[len(chain)] not in types(nxt):
                    break
                chain.append(nxt)
            names = [n.target for n in chain]
            if len(chain) == len(group) and not taken.intersection(names):  # type: ignore[arg-type]
                taken.update(names)  # type: ignore[arg-type]
                yield names  # type: ignore[misc]
