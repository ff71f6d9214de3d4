"""The ONNX nodes and initializers one quantizer becomes, from its :class:`~quanta.export.onnx.plan.Plan`::

    integer grid      x ─ QuantizeLinear(s, zp) ─ DequantizeLinear(s, zp) ─▶
    float8 format     x ─ QuantizeLinear(s, 0 as float8, saturate) ─ DequantizeLinear ─▶
    float16/bfloat16  x ─ [Div s] ─ Clip(±max) ─ Cast(float16) ─ Cast(float) ─ [Mul s] ─▶

a grid narrower than its type first clamped to ``[s·(qmin - zp), s·(qmax - zp)]`` (Clip, or Max/Min per channel);
a stored (prequantized) weight only dequantized. Every name comes fresh from a :class:`Names`.

>>> import torch
>>> from quanta.quantization.affine import QuantizeDequantize
>>> from quanta.export.onnx.plan import quantizer_plan
>>> q = QuantizeDequantize((), 8, symmetric=False)
>>> q.set_range(torch.tensor(-1.0), torch.tensor(1.0))
>>> nodes, inits = qdq_nodes(quantizer_plan("q", q, (2, 3)), "x", "y", Names({"x", "y"}), clamp=False)
>>> [(n.op_type, list(n.input), list(n.output)) for n in nodes]
[('QuantizeLinear', ['x', 'x_scale', 'x_zero_point'], ['x_quantized']),
 ('DequantizeLinear', ['x_quantized', 'x_scale', 'x_zero_point'], ['y'])]
"""

from __future__ import annotations

from typing import Any

import torch

from quanta.export.onnx.elements import tensor_proto
from quanta.export.onnx.plan import Plan

__all__ = ["Names", "dq_nodes", "qdq_nodes", "uncast_nodes"]


class Names:
    """Fresh tensor names: exporter names that clash with the ones we introduce get renamed first."""

    def __init__(self, taken: set[str]) -> None:
        self.taken = set(taken)

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name


def _q_attrs(plan: Plan) -> dict[str, int]:
    g = plan.gran
    attrs = {} if g.axis is None else {"axis": g.axis}
    if g.block_size is not None:
        attrs["block_size"] = g.block_size
    return attrs


def _scale_zero_point(plan: Plan, base: str, names: Names) -> tuple[list[Any], str, str]:
    from onnx import TensorProto

    s, zp = names.fresh(f"{base}_scale"), names.fresh(f"{base}_zero_point")
    inits = [tensor_proto(s, plan.gran.onnx_param(plan.scale), TensorProto.FLOAT),
             tensor_proto(zp, plan.gran.onnx_param(plan.zero_point), plan.proto)]
    return inits, s, zp


def dq_nodes(plan: Plan, src: str, dst: str, names: Names) -> tuple[list[Any], list[Any]]:
    from onnx import helper

    inits, s, zp = _scale_zero_point(plan, src, names)
    node = helper.make_node("DequantizeLinear", [src, s, zp], [dst], name=names.fresh(f"{src}/DequantizeLinear"),
                            **_q_attrs(plan))
    return [node], inits


def qdq_nodes(plan: Plan, src: str, dst: str, names: Names, *, clamp: bool) -> tuple[list[Any], list[Any]]:
    from onnx import helper

    if plan.kind == "cast":
        return _cast_nodes(plan, src, dst, names)
    nodes: list[Any] = []
    inits: list[Any] = []
    x = src
    if clamp:  # the sim's grid is narrower than the ONNX type: clamp to the grid's range first (exact)
        lo = (plan.grid.qmin - plan.zero_point) * plan.scale
        hi = (plan.grid.qmax - plan.zero_point) * plan.scale
        n, i, x = _clamp_nodes(plan, x, lo, hi, names)
        nodes += n
        inits += i
    more, s, zp = _scale_zero_point(plan, src, names)
    inits += more
    q = names.fresh(f"{src}_quantized")
    nodes.append(helper.make_node("QuantizeLinear", [x, s, zp], [q], name=names.fresh(f"{src}/QuantizeLinear"),
                                  **_q_attrs(plan)))
    nodes.append(helper.make_node("DequantizeLinear", [q, s, zp], [dst], name=names.fresh(f"{src}/DequantizeLinear"),
                                  **_q_attrs(plan)))
    return nodes, inits


def _clamp_nodes(plan: Plan, x: str, lo: torch.Tensor, hi: torch.Tensor, names: Names
                 ) -> tuple[list[Any], list[Any], str]:
    """``clamp(x, lo, hi)`` with quantizer-shaped bounds: Clip when per tensor, else Max and Min."""
    from onnx import TensorProto, helper

    out = names.fresh(f"{x}_clamped")
    lo_name, hi_name = names.fresh(f"{x}_clamp_min"), names.fresh(f"{x}_clamp_max")
    if plan.gran.axis is None:
        inits = [tensor_proto(lo_name, lo.reshape(()), TensorProto.FLOAT),
                 tensor_proto(hi_name, hi.reshape(()), TensorProto.FLOAT)]
        return [helper.make_node("Clip", [x, lo_name, hi_name], [out], name=names.fresh(f"{x}/Clip"))], inits, out
    inits = [tensor_proto(lo_name, plan.gran.broadcastable(lo), TensorProto.FLOAT),
             tensor_proto(hi_name, plan.gran.broadcastable(hi), TensorProto.FLOAT)]
    mid = names.fresh(f"{x}_clamped_below")
    nodes = [helper.make_node("Max", [x, lo_name], [mid], name=names.fresh(f"{x}/Max")),
             helper.make_node("Min", [mid, hi_name], [out], name=names.fresh(f"{x}/Min"))]
    return nodes, inits, out


def _cast_nodes(plan: Plan, src: str, dst: str, names: Names) -> tuple[list[Any], list[Any]]:
    """``cast(x / s) * s`` for a 16-bit float format, saturating like the sim."""
    from onnx import TensorProto, helper

    nodes: list[Any] = []
    inits: list[Any] = []
    x = src
    scaled = not bool((plan.scale == 1).all())
    if scaled:
        s = names.fresh(f"{src}_scale")
        inits.append(tensor_proto(s, plan.gran.broadcastable(plan.scale), TensorProto.FLOAT))
        y = names.fresh(f"{src}_scaled")
        nodes.append(helper.make_node("Div", [x, s], [y], name=names.fresh(f"{src}/Div")))
        x = y
    lo, hi = names.fresh(f"{src}_clamp_min"), names.fresh(f"{src}_clamp_max")
    inits += [tensor_proto(lo, torch.tensor(-plan.fmax), TensorProto.FLOAT),
              tensor_proto(hi, torch.tensor(plan.fmax), TensorProto.FLOAT)]
    clipped, low, back = names.fresh(f"{src}_clamped"), names.fresh(f"{src}_cast"), names.fresh(f"{src}_uncast")
    nodes += [helper.make_node("Clip", [x, lo, hi], [clipped], name=names.fresh(f"{src}/Clip")),
              helper.make_node("Cast", [clipped], [low], to=plan.proto, name=names.fresh(f"{src}/Cast")),
              helper.make_node("Cast", [low], [back if scaled else dst], to=TensorProto.FLOAT,
                               name=names.fresh(f"{src}/Cast"))]
    if scaled:
        nodes.append(helper.make_node("Mul", [back, s], [dst], name=names.fresh(f"{src}/Mul")))
    return nodes, inits


def uncast_nodes(plan: Plan, src: str, dst: str, names: Names) -> tuple[list[Any], list[Any]]:
    """A stored 16-bit float weight back to float32 (times its scale)."""
    from onnx import TensorProto, helper

    scaled = not bool((plan.scale == 1).all())
    back = names.fresh(f"{src}_uncast") if scaled else dst
    nodes = [helper.make_node("Cast", [src], [back], to=TensorProto.FLOAT, name=names.fresh(f"{src}/Cast"))]
    inits: list[Any] = []
    if scaled:
        s = names.fresh(f"{src}_scale")
        inits.append(tensor_proto(s, plan.gran.broadcastable(plan.scale), TensorProto.FLOAT))
        nodes.append(helper.make_node("Mul", [back, s], [dst], name=names.fresh(f"{src}/Mul")))
    return nodes, inits
