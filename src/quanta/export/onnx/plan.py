"""What each quantizer becomes in ONNX, before any node or tensor is named: its element type, granularity
(per tensor, per axis, per block) in ONNX's terms, scale and zero point, and the lowest opset that expresses
it; and the opset of the whole graph.

>>> import torch
>>> from quanta.quantization.affine import QuantizeDequantize
>>> q = QuantizeDequantize((4, 2), 4, symmetric=True, block_size=(1, 8))
>>> q.set_range(-torch.ones(4, 2), torch.ones(4, 2))
>>> p = quantizer_plan("fc.param_quantizers.weight", q, (4, 16))
>>> p.what, p.gran.axis, p.gran.block_size, p.opset
('int4 per-block', 1, 8, 21)
>>> choose_opset({p.name: p}, None, dynamo=False)
21
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quanta.export.onnx.elements import IntType, float8_types, float16_types, int_type_for
from quanta.grids.affine import IntegerGrid
from quanta.kernels import affine as affine_kernels
from quanta.kernels.blocks import BlockLayout, resolve_layout
from quanta.quantization.affine.quantizer import QuantizeDequantize
from quanta.quantization.base import QuantizerBase
from quanta.kernels import block_scaled as block_kernels
from quanta.quantization.float import BlockScaledQuantizeDequantize, FloatQuantizeDequantize

__all__ = ["DYNAMO_MIN_OPSET", "MAX_OPSET", "MIN_OPSET", "TORCH_DEFAULT_OPSET", "Granularity", "Plan", "choose_opset", "granularity",
           "int_codes", "kernel_blocks", "plan_for_calls", "quantizer_plan", "block_scaled_weight_plan",
           "block_scaled_weight_values"]

#: Lowest opset written: per-axis QuantizeLinear/DequantizeLinear need 13.
MIN_OPSET = 13
#: the opset ``torch.onnx.export`` uses by default, and so AIMET's export (it decides how LayerNorm, GELU, ... are
#: written, and so the names of their outputs)
TORCH_DEFAULT_OPSET = 20
#: Highest opset accepted (what torch.onnx targets; onnxruntime 1.32 runs it).
MAX_OPSET = 23
DYNAMO_MIN_OPSET = 18  # the torch.export-based exporter's lowest opset


# ---------------------------------------------------------------------- granularity
@dataclass(frozen=True)
class Granularity:
    """How a quantizer's scale maps onto a tensor of ``shape`` in ONNX terms."""

    shape: tuple[int, ...]  # the quantized tensor's shape
    layout: BlockLayout
    blocks: tuple[int, ...]  # elements per scale entry, for every dim of ``shape``
    axis: int | None  # None: per tensor
    block_size: int | None  # None: per tensor or per axis

    @property
    def kind(self) -> str:
        return "tensor" if self.axis is None else "axis" if self.block_size is None else "block"

    def onnx_param(self, t: torch.Tensor) -> torch.Tensor:
        """A scale-shaped tensor in the layout QuantizeLinear wants: scalar, 1-D, or blocked (same rank)."""
        lead = len(self.shape) - len(self.layout.scale_shape)
        full = t.reshape((1,) * lead + self.layout.scale_shape)
        if self.axis is None:
            return full.reshape(())
        if self.block_size is None:
            return full.reshape(-1)
        for d, b in enumerate(self.blocks):  # other dims: one entry per element (ONNX's rule), by repetition
            if d != self.axis and b > 1:
                full = full.repeat_interleave(b, dim=d)
        return full.contiguous()

    def broadcastable(self, t: torch.Tensor) -> torch.Tensor:
        """A scale-shaped tensor repeated over its blocks, so it broadcasts (numpy rules) against the tensor."""
        out = t.reshape(self.layout.scale_shape)
        for d, (n, b) in enumerate(zip(self.layout.scale_shape, self.layout.block_size)):
            if n > 1 and b > 1:
                out = out.repeat_interleave(b, dim=d)
        return out.contiguous()


def granularity(name: str, shape: tuple[int, ...], qshape: tuple[int, ...],
                block_size: tuple[int, ...] | None) -> Granularity:
    try:
        layout = resolve_layout(shape, qshape, block_size)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    lead = len(shape) - len(layout.scale_shape)
    blocks = tuple(shape[:lead]) + layout.block_size
    counts = [s // b if b else 1 for s, b in zip(shape, blocks)]
    split = [d for d, n in enumerate(counts) if n > 1]
    if not split:
        return Granularity(shape, layout, blocks, None, None)
    if len(split) == 1 and blocks[split[0]] == 1:
        return Granularity(shape, layout, blocks, split[0], None)
    blocked = [d for d in split if blocks[d] > 1]
    axis = max(blocked, key=lambda d: blocks[d]) if blocked else split[0]
    return Granularity(shape, layout, blocks, axis, blocks[axis])


# ---------------------------------------------------------------------- per-quantizer plans
@dataclass
class Plan:
    """What one quantizer becomes in ONNX (everything but node and tensor names)."""

    name: str
    kind: str  # "int" | "float8" | "float4" | "cast"
    proto: int  # element type of the quantized values
    gran: Granularity
    scale: torch.Tensor  # quantizer-shaped
    zero_point: torch.Tensor | None  # quantizer-shaped codes (int, float8)
    grid: IntegerGrid | None  # int: the quantizer's grid
    itype: IntType | None
    fmax: float | None  # cast: the format's largest value
    opset: int
    what: str  # for messages, e.g. "int4 per-block"

    @property
    def narrow(self) -> bool:
        """True if the grid is a strict sub-range of the ONNX type (the sim clamps tighter than QuantizeLinear)."""
        return self.kind == "int" and (self.grid.qmin, self.grid.qmax) != (self.itype.qmin, self.itype.qmax)


def quantizer_plan(name: str, q: QuantizerBase, shape: tuple[int, ...]) -> Plan:
    if isinstance(q, QuantizeDequantize):
        enc = q.get_encodings()
        if enc is None:  # pragma: no cover - checked before
            raise RuntimeError(f"{name} is not initialised; run sim.compute_encodings() first")
        itype = int_type_for(q.grid)
        if itype is None:
            raise NotImplementedError(
                f"{name}: the grid [{q.grid.qmin}, {q.grid.qmax}] needs more than 16 bits; ONNX QuantizeLinear "
                "has no such type (export with qdq=False and an encodings file instead)")
        scale = enc.scale.detach().float()
        offset = torch.broadcast_to(enc.offset.detach().float(), scale.shape)
        gran = granularity(name, shape, tuple(q.shape), q.block_size)
        opset = max(itype.opset, 21 if gran.kind == "block" else MIN_OPSET)
        return Plan(name, "int", itype.proto, gran, scale, -offset, q.grid, itype, None, opset,
                    f"{itype.name} per-{gran.kind}")
    if isinstance(q, FloatQuantizeDequantize):
        dtype = q.format.torch_dtype
        scale = q.get_scale().detach().float()
        gran = granularity(name, shape, tuple(q.shape), q.block_size)
        if dtype in float8_types():
            opset = 21 if gran.kind == "block" else 19
            return Plan(name, "float8", float8_types()[dtype], gran, scale, torch.zeros_like(scale), None, None,
                        None, opset, f"{q.format.name()} per-{gran.kind}")
        if dtype in float16_types():
            return Plan(name, "cast", float16_types()[dtype], gran, scale, None, None, None, float(q.format.max),
                        MIN_OPSET, q.format.name())
        raise NotImplementedError(
            f"{name}: ONNX has no type for the float format {q.format.name()} (supported: float8 e4m3fn/e5m2/"
            "e4m3fnuz/e5m2fnuz, float16, bfloat16); export with qdq=False and an encodings file instead")
    if isinstance(q, BlockScaledQuantizeDequantize):
        raise NotImplementedError(
            f"{name}: {q.format.name} block scales are computed from each tensor at run time; ONNX's "
            "QuantizeLinear/DequantizeLinear (opset 23 blocks included) take the scales as inputs, so only "
            "weights (whose block scales are constants) export in these formats. Replace this activation "
            "quantizer before export, or keep the model in PyTorch")
    raise NotImplementedError(
        f"{name}: cannot export a {type(q).__name__} as QuantizeLinear/DequantizeLinear "
        "(supported: quanta.quantization.affine.QuantizeDequantize, "
        "quanta.quantization.float.FloatQuantizeDequantize)")


def block_scaled_weight_plan(name: str, q: BlockScaledQuantizeDequantize, weight: torch.Tensor) -> Plan:
    """The plan of an MX/NVFP4 weight quantizer: its block scales are the weight's, so they are constants here.

    MXFP8 -> float8 per-block Q/DQ (opset 21); MXINT8 -> int8 in ``[-127, 127]`` with scale ``X / 64`` (opset 21);
    MXFP4 / NVFP4 -> ``FLOAT4E2M1`` (opset 23; the NVFP4 scale is ``s_t * s_b`` per block). MX fp6 has no ONNX
    type (``NotImplementedError``). Every scale is exact, and the weight is written already quantized.
    """
    from onnx import TensorProto

    fmt = q.format
    w = weight.detach().float()
    if w.dim() != 2 or w.shape[1] % fmt.block_size:
        raise ValueError(f"{name}: {fmt.name} blocks need a 2-D [out, in] weight whose input features "
                         f"{fmt.block_size} divides, got shape {tuple(w.shape)}")
    gran = granularity(name, tuple(w.shape), (w.shape[0], w.shape[1] // fmt.block_size), (1, fmt.block_size))
    if q.is_nvfp4:
        pts = block_kernels.per_tensor_amax_to_scale(q.tensor_amax(w))
        _, sb = block_kernels.nvfp4_quantize(w, pts, fmt.block_size)
        scale = block_kernels.nvfp4_block_scales_hp(sb, pts)
        return Plan(name, "float4", TensorProto.FLOAT4E2M1, gran, scale, torch.zeros_like(scale), None, None, None,
                    23, "nvfp4 per-block")
    _, code = block_kernels.mx_quantize(w, fmt, q.scaling_mode)
    x = block_kernels.e8m0_to_float(code)
    if fmt.element is None:  # MXINT8: k * (X / 64), |k| <= 127
        grid = IntegerGrid(-127, 127)
        itype = int_type_for(grid)
        return Plan(name, "int", itype.proto, gran, x / 64, torch.zeros_like(x), grid, itype, None, 21,
                    "mxint8 per-block")
    if fmt.element_bits == 8:
        dtype = block_kernels.element_storage_dtype(fmt)
        return Plan(name, "float8", float8_types()[dtype], gran, x, torch.zeros_like(x), None, None, None, 21,
                    f"{fmt.name} per-block")
    if fmt.element_bits == 4:
        return Plan(name, "float4", TensorProto.FLOAT4E2M1, gran, x, torch.zeros_like(x), None, None, None, 23,
                    f"{fmt.name} per-block")
    raise NotImplementedError(f"{name}: ONNX has no type for {fmt.name}'s 6-bit elements (float8, float4 and int8 "
                              "MX weights export); keep this weight in PyTorch or use mxfp8/mxfp4")


def block_scaled_weight_values(q: BlockScaledQuantizeDequantize, weight: torch.Tensor) -> torch.Tensor:
    """The stored elements of an MX/NVFP4 weight (float values on the element grid; MXINT8: the integers k)."""
    fmt = q.format
    w = weight.detach().float()
    if q.is_nvfp4:
        return block_kernels.nvfp4_quantize(w, block_kernels.per_tensor_amax_to_scale(q.tensor_amax(w)),
                                            fmt.block_size)[0]
    p, _ = block_kernels.mx_quantize(w, fmt, q.scaling_mode)
    return p * 64 if fmt.element is None else p


def plan_for_calls(name: str, q: QuantizerBase, inputs: list[tuple[tuple[int, ...], torch.dtype]]) -> Plan:
    """The plan of quantizer ``name`` for the tensors it was called on (``(shape, dtype)`` each): one shape
    unless it is per tensor."""
    plan = quantizer_plan(name, q, inputs[0][0])
    shapes = {shape for shape, _ in inputs}
    if len(shapes) > 1 and plan.gran.kind != "tensor":
        raise NotImplementedError(f"{name} is applied to tensors of shapes {sorted(shapes)}; "
                                  f"a per-{plan.gran.kind} quantizer can be exported for one shape only")
    return plan


def int_codes(plan: Plan, w: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """``clamp(round(w / s) - o, qmin, qmax)`` with the sim's kernel."""
    return affine_kernels.quantize(w.detach().float(), plan.scale, -plan.zero_point, IntegerGrid(qmin, qmax),
                                   kernel_blocks(plan))


def kernel_blocks(plan: Plan) -> tuple[int, ...] | None:
    layout = plan.gran.layout
    return None if layout.is_broadcast else layout.block_size


def choose_opset(plans: dict[str, Plan], opset: int | None, dynamo: bool, floor: int = MIN_OPSET) -> int:
    """``opset``, checked against what each plan needs; None: the lowest (at least ``floor``) that expresses
    every plan."""
    floor = max(floor, DYNAMO_MIN_OPSET if dynamo else MIN_OPSET)
    if opset is None:
        return max([floor, *(p.opset for p in plans.values())])
    too_high = [p for p in plans.values() if p.opset > opset]
    if too_high:
        p = max(too_high, key=lambda p: p.opset)
        raise ValueError(f"opset {opset} is too low: {p.name} ({p.what}) needs opset {p.opset}"
                         + (f" (and {len(too_high) - 1} more quantizers)" if len(too_high) > 1 else ""))
    return opset
