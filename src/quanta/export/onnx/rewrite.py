"""The rewrite of the exported graph: each marker replaced by its quantizer's nodes (or by nothing, for the
float graph), the quantized tensors named, then the graph's inputs and outputs named, dead nodes and
initializers dropped and the opset set.

Naming: the float tensor an encoding applies to, the input of its ``QuantizeLinear``, keeps the name
``torch.onnx`` gave it (``"/relu1/Relu_output_0"``, a graph input's name), as in AIMET's export; a weight
keeps its ``state_dict`` name ``"<module>.<param>"`` (an initializer; an exporter name that clashes with it
is renamed ``"<name>__export"``). A tensor with no name of its own gets quanta's tensor name
(``"<module>.input.<i>"`` / ``"<module>.output.<i>"``, ``"_<k>"`` appended if taken) on an Identity: the
second of two quantizers in a row (a producer's output quantizer, then a consumer's input quantizer), the
second quantizer of one tensor, the output of a quantized weight.
"""

from __future__ import annotations

from typing import Any

import torch

from quanta.export.onnx.elements import tensor_proto
from quanta.export.onnx.markers import MARKER_DOMAIN, MARKER_OP, Slot
from quanta.export.onnx.nodes import Names, dq_nodes, qdq_nodes, uncast_nodes
from quanta.export.onnx.plan import Plan, block_scaled_weight_values, int_codes, kernel_blocks
from quanta.kernels import float_cast
from quanta.quantization.base import QuantizerBase
from quanta.quantization.float import BlockScaledQuantizeDequantize

__all__ = ["finish", "replace_markers"]


def _all_names(graph: Any) -> set[str]:
    names = {i.name for i in graph.initializer} | {i.name for i in graph.input} | {o.name for o in graph.output}
    for n in graph.node:
        names.update(n.input)
        names.update(n.output)
    names.discard("")
    return names


def _rename_everywhere(graph: Any, mapping: dict[str, str]) -> None:
    if not mapping:
        return
    for n in graph.node:
        for i, x in enumerate(n.input):
            if x in mapping:
                n.input[i] = mapping[x]
        for i, x in enumerate(n.output):
            if x in mapping:
                n.output[i] = mapping[x]
    for coll in (graph.initializer, graph.input, graph.output, graph.value_info):
        for v in coll:
            if v.name in mapping:
                v.name = mapping[v.name]


def replace_markers(proto: Any, used: dict[int, Slot], plans: dict[str, Plan], *, qdq: bool, prequantize: bool
                    ) -> dict[str, list[str]]:
    """Replace each marker by its quantization nodes (or by nothing, ``qdq=False``) and name the tensors;
    returns ``{quantizer name: [tensor, ...]}``, one tensor per call of the quantizer, in graph order."""
    from onnx import helper

    graph = proto.graph
    by_name = {s.name: s for s in used.values()}
    markers = [n for n in graph.node if n.domain == MARKER_DOMAIN and n.op_type == MARKER_OP]
    marker_of = {id(n): next(a.s.decode() for a in n.attribute if a.name == "name") for n in markers}
    unknown = sorted(set(marker_of.values()) - set(by_name))
    if unknown:  # pragma: no cover - every marker comes from a stub
        raise RuntimeError(f"internal error: markers for unknown quantizers {unknown}")

    # Weight names are used as they are: move clashing exporter names out of the way.
    wanted = {s.tensor for s in used.values() if s.param is not None}
    existing = _all_names(graph)
    clashes = {}
    reserve = Names(existing | wanted)
    io_names = {i.name for i in graph.input} | {o.name for o in graph.output}
    for name in sorted(existing & wanted):
        if name in io_names:
            raise ValueError(f"the model's input or output {name!r} has the name of the weight {name!r}; rename "
                             "the forward argument")
        clashes[name] = reserve.fresh(f"{name}__export")
    _rename_everywhere(graph, clashes)
    names = Names(_all_names(graph) | wanted)
    graph_outputs = {o.name for o in graph.output}
    from_marker = {n.output[0] for n in markers}  # a marker's input among these: quantizers in a row

    alias: dict[str, str] = {}

    def resolve(name: str) -> str:
        seen = 0
        while name in alias:
            name = alias[name]
            seen += 1
            if seen > 100000:  # pragma: no cover
                raise RuntimeError("internal error: cyclic tensor renaming")
        return name

    targets: set[str] = set()
    weights_done: dict[str, str] = {}  # weight name -> tensor that feeds the consumers
    result: dict[str, list[str]] = {}
    new_nodes: list[Any] = []
    new_inits: list[Any] = []

    for node in graph.node:
        if id(node) not in marker_of:
            new_nodes.append(node)
            continue
        slot = by_name[marker_of[id(node)]]
        x, y = node.input[0], node.output[0]
        plan = plans.get(slot.name)
        if slot.param is not None:
            weight = slot.tensor
            if weight not in weights_done:
                nodes, inits, out = _weight_nodes(slot, plan, names, qdq=qdq, prequantize=prequantize)
                new_nodes += nodes
                new_inits += inits
                weights_done[weight] = out
                result.setdefault(slot.name, []).append(weight)
            source = weights_done[weight]
            if y in graph_outputs:
                new_nodes.append(helper.make_node("Identity", [source], [y], name=names.fresh(f"{weight}/Identity")))
            else:
                alias[y] = source
            continue

        current = resolve(x)
        if x in from_marker or x in targets or current in weights_done.values():
            # no float tensor of its own (it is another quantizer's output): quanta's name, on an Identity
            target = names.fresh(slot.tensor)
            new_nodes.append(helper.make_node("Identity", [current], [target], name=names.fresh(f"{target}/Identity")))
        else:
            target = current  # the name torch.onnx gave it
        targets.add(target)
        result.setdefault(slot.name, []).append(target)
        if not qdq:
            if y in graph_outputs:
                new_nodes.append(helper.make_node("Identity", [target], [y], name=names.fresh(f"{target}/Identity")))
            else:
                alias[y] = target
            continue
        out = y if y in graph_outputs else names.fresh(f"{target}_dequantized")
        nodes, inits = qdq_nodes(plan, target, out, names, clamp=plan.narrow)
        new_nodes += nodes
        new_inits += inits
        if out != y:
            alias[y] = out

    del graph.node[:]
    graph.node.extend(new_nodes)
    graph.initializer.extend(new_inits)
    _rename_everywhere(graph, {n: resolve(n) for n in _all_names(graph) | {v.name for v in graph.value_info}
                               if resolve(n) != n})
    return {s.name: result[s.name] for s in used.values() if s.name in result}


def _weight_nodes(slot: Slot, plan: Plan | None, names: Names, *, qdq: bool, prequantize: bool
                  ) -> tuple[list[Any], list[Any], str]:
    """Initializer ``slot.tensor`` and the nodes after it; returns (nodes, initializers, output tensor)."""
    from onnx import TensorProto

    module, pname = slot.param  # type: ignore[misc]
    w = getattr(module, pname).detach().float()
    name = slot.tensor
    if not qdq:
        return [], [tensor_proto(name, w, TensorProto.FLOAT)], name
    assert plan is not None
    out = names.fresh(f"{name}_dequantized")
    if isinstance(slot.quantizer, BlockScaledQuantizeDequantize):  # stored quantized: exactly the sim's elements
        nodes, inits = dq_nodes(plan, name, out, names)
        return nodes, [tensor_proto(name, block_scaled_weight_values(slot.quantizer, w), plan.proto), *inits], out
    if not prequantize:
        clamp = plan.narrow and not torch.equal(int_codes(plan, w, plan.grid.qmin, plan.grid.qmax),
                                                int_codes(plan, w, plan.itype.qmin, plan.itype.qmax))
        nodes, inits = qdq_nodes(plan, name, out, names, clamp=clamp)
        return nodes, [tensor_proto(name, w, TensorProto.FLOAT), *inits], out
    if plan.kind == "int":
        codes = int_codes(plan, w, plan.grid.qmin, plan.grid.qmax)
        nodes, inits = dq_nodes(plan, name, out, names)
        return nodes, [tensor_proto(name, codes, plan.proto), *inits], out
    values = float_cast.quantize(w, plan.scale, _format_of(slot.quantizer), kernel_blocks(plan))
    if plan.kind == "float8":
        nodes, inits = dq_nodes(plan, name, out, names)
        return nodes, [tensor_proto(name, values, plan.proto), *inits], out
    nodes, inits = uncast_nodes(plan, name, out, names)  # float16 / bfloat16 values, then Cast back
    return nodes, [tensor_proto(name, values, plan.proto), *inits], out


def _format_of(q: QuantizerBase) -> Any:
    return q.format  # type: ignore[attr-defined]


def finish(proto: Any, opset: int, input_names: list[str], output_names: list[str]) -> dict[str, str]:
    """Graph I/O names, dead nodes and initializers, opset imports and IR version; returns the renames
    ``{old: new}`` it made (graph inputs and outputs that did not have their names yet)."""
    from onnx import AttributeProto, helper

    graph = proto.graph
    # graph inputs / outputs by position
    mapping = {}
    if len(graph.input) == len(input_names):
        mapping.update((v.name, want) for v, want in zip(graph.input, input_names))
    if len(graph.output) == len(output_names):
        mapping.update((v.name, want) for v, want in zip(graph.output, output_names))
    mapping = {k: v for k, v in mapping.items() if k != v}
    renamed: dict[str, str] = {}
    if mapping:
        taken = _all_names(graph) - set(mapping)
        clash = {n: f"{n}__export" for n in taken if n in mapping.values()}
        _rename_everywhere(graph, clash)
        _rename_everywhere(graph, mapping)
        renamed = {**clash, **mapping}

    # The TorchScript exporter shares equal-valued parameters (Identity of one initializer): give each its own.
    inits_by_name = {i.name: i for i in graph.initializer}
    outputs = {o.name for o in graph.output}
    nodes = []
    for n in graph.node:
        if n.op_type == "Identity" and n.input[0] in inits_by_name and n.output[0] not in outputs \
                and n.output[0] not in inits_by_name:
            copy = type(inits_by_name[n.input[0]])()
            copy.CopyFrom(inits_by_name[n.input[0]])
            copy.name = n.output[0]
            graph.initializer.append(copy)
            inits_by_name[copy.name] = copy
        else:
            nodes.append(n)
    del graph.node[:]
    graph.node.extend(nodes)

    # dead code: nodes whose outputs no graph output needs
    needed = {o.name for o in graph.output}
    keep = []
    for n in reversed(list(graph.node)):
        if any(o in needed for o in n.output):
            keep.append(n)
            needed.update(i for i in n.input if i)
            for attr in n.attribute:  # subgraphs (If/Loop) read outer names
                subgraphs = [attr.g] if attr.type == AttributeProto.GRAPH else list(attr.graphs)
                for g in subgraphs:
                    needed.update(_all_names(g))
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    inits = [i for i in graph.initializer if i.name in needed]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    produced = {o for n in graph.node for o in n.output}
    seen: set[str] = set()
    infos = []
    for v in graph.value_info:
        if v.name in produced and v.name not in seen:
            seen.add(v.name)
            infos.append(v)
    del graph.value_info[:]
    graph.value_info.extend(infos)

    domains = {n.domain for n in graph.node}
    imports = [o for o in proto.opset_import
               if o.domain not in ("", "ai.onnx", MARKER_DOMAIN) and o.domain in domains]
    del proto.opset_import[:]
    proto.opset_import.extend([helper.make_opsetid("", opset), *imports])
    proto.ir_version = max(proto.ir_version, helper.find_min_ir_version_for(list(proto.opset_import)))
    return renamed
