"""Fuse the int4 linear kernels of a compiled decode step that share their input into one call (an Inductor pass).

A transformer layer computes its query, key and value projections (and an MLP's gate and up projections) from one
input. In a decode step each is a GEMV that streams its weight from memory, and each call starts its memory
streams cold: the key and value projections of a GQA model are small enough (256 rows of 2048 in issue 17's
Llama) that the start costs as much as the reading. :class:`FuseSharedInputLinears` rewrites the graph so that
the ``quanta_cpu.int4_weight_only_linear`` calls on one input (same ``K`` and group size) become one
``quanta_cpu.int4_weight_only_linear_multi`` call, whose threads stream the weights back to back, and slices of
its output. Every output keeps its bits (the fused op computes each weight's tiles exactly as the single op
does). Measured on issue 17's model (2 Zen 4 cores, alternating runs in one process): a token's GEMVs alone,
113 calls at 11.78 ms against 65 at 11.41 ms for groups of 128, 15.21 against 15.09 ms for groups of 32; a
compiled decode step 13.69 -> 13.29 ms (g128), 15.12 -> 15.05 ms (g32).

Only decode graphs are rewritten: calls whose input has fewer than 8 rows (the kernels' GEMV path; from 8 rows
the GEMM reads each weight once per block of rows anyway). The weights stay separate tensors.

Pass it to ``torch.compile`` as Inductor's post-grad pass::

    from quanta.kernels.linear_fusion import FuseSharedInputLinears

    step = torch.compile(model, options={"post_grad_custom_post_pass": FuseSharedInputLinears()})

>>> import torch
>>> g = torch.fx.Graph()
>>> fuse_shared_input_linears(g)  # nothing to fuse in an empty graph
0
"""

from __future__ import annotations

from typing import Any, Optional

import torch

try:  # torch >= 2.6: a pass that Inductor's FX graph cache can key on (its uuid)
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
except ImportError:  # earlier: Inductor takes any callable as the pass (and bypasses its cache)
    CustomGraphPass, get_hash_for_files = object, None

__all__ = ["FuseSharedInputLinears", "fuse_shared_input_linears"]

_GEMV_MAX_ROWS = 8  # the native kernels' decode path: fewer activation rows than this (kPrefillMinRows)


def _single_op() -> Optional[Any]:
    ns = getattr(torch.ops, "quanta_cpu", None)
    try:
        return ns.int4_weight_only_linear.default if ns is not None else None
    except (AttributeError, RuntimeError):  # the extension is not loaded: nothing of it can be in a graph
        return None


def _source(x: torch.fx.Node) -> tuple:
    """What ``x`` reads: the node under its chain of views, and ``x``'s shape (each linear call may view the
    same activations on its own)."""
    views = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default, torch.ops.aten.reshape.default)
    root = x
    while root.op == "call_function" and root.target in views and isinstance(root.args[0], torch.fx.Node):
        root = root.args[0]
    return root, tuple(x.meta["val"].shape)


def _rows(node: torch.fx.Node) -> Optional[int]:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and val.dim() == 2 and isinstance(val.shape[0], int):
        return val.shape[0]
    return None


def fuse_shared_input_linears(graph: torch.fx.Graph) -> int:
    """Rewrite ``graph`` in place: each set of two or more ``quanta_cpu.int4_weight_only_linear`` calls on the same
    input (the same node, or views of one node to the same shape), ``K`` and group size, whose input has fewer
    than 8 rows, becomes one ``quanta_cpu.int4_weight_only_linear_multi`` call in the place of the first, and a
    slice of its output for each. An input of a later call computed after the first (a bias converted to
    float32 right before its call) moves up to the fused call when it is a pure function of earlier nodes;
    otherwise the set is left as it is. Returns the number of fused calls made."""
    single = _single_op()
    if single is None:
        return 0
    multi = torch.ops.quanta_cpu.int4_weight_only_linear_multi.default
    groups: dict[tuple, list[torch.fx.Node]] = {}
    for node in graph.nodes:
        if node.op != "call_function" or node.target is not single or node.kwargs:
            continue
        x, _, _, group_size, k, _, _ = node.args
        rows = _rows(x) if isinstance(x, torch.fx.Node) else None
        if rows is not None and rows < _GEMV_MAX_ROWS:
            groups.setdefault((_source(x), group_size, k), []).append(node)
    fused = 0
    for (_, group_size, k), nodes in groups.items():
        if len(nodes) < 2:
            continue
        # the fused call takes the first call's place; an input computed after it (a bias converted right before
        # its own call) moves up when it is a pure function of nodes that come before
        first = nodes[0]
        order = {n: i for i, n in enumerate(graph.nodes)}
        before = {n for n in order if order[n] < order[first]}
        late = sorted({a for n in nodes[1:] for a in n.all_input_nodes if a not in before}, key=order.__getitem__)
        if any(a.op != "call_function" or a.is_impure() or not set(a.all_input_nodes) <= before for a in late):
            continue
        for a in late:
            first.prepend(a)
            before.add(a)
        x = first.args[0]
        packed, sz, ns, bias = ([n.args[i] for n in nodes] for i in (1, 2, 5, 6))
        with graph.inserting_before(first):
            call = graph.call_function(multi, (x, packed, sz, group_size, k, ns, bias))
        vals = [n.meta.get("val") for n in nodes]
        if all(isinstance(v, torch.Tensor) for v in vals):
            call.meta["val"] = torch.cat(vals, dim=1)  # fake tensors: the fused output's shape and dtype
        parts, offset = [], 0
        for n in ns:
            with graph.inserting_before(first):
                part = graph.call_function(torch.ops.aten.slice.Tensor, (call, 1, offset, offset + n))
            if "val" in call.meta:
                part.meta["val"] = call.meta["val"][:, offset:offset + n]
            parts.append(part)
            offset += n
        for node, part in zip(nodes, parts):
            node.replace_all_uses_with(part)
            graph.erase_node(node)
        fused += 1
    return fused


class FuseSharedInputLinears(CustomGraphPass):
    """:func:`fuse_shared_input_linears` as Inductor's ``post_grad_custom_post_pass`` (see the module docstring)."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        fuse_shared_input_linears(graph)

    def uuid(self) -> Optional[Any]:
        return get_hash_for_files((__file__,)) if get_hash_for_files is not None else None
