"""ONNX export of a QuantizationSimModel with standard ``QuantizeLinear``/``DequantizeLinear`` nodes.

Every enabled quantizer of the sim becomes, on the tensor it quantizes::

    integer grid      x ─ QuantizeLinear(s, zp) ─ DequantizeLinear(s, zp) ─▶    int4 uint4 int8 uint8 int16 uint16
    float8 format     x ─ QuantizeLinear(s, 0 as float8, saturate) ─ DequantizeLinear ─▶
    float16/bfloat16  x ─ [Div s] ─ Clip(±max) ─ Cast(float16) ─ Cast(float) ─ [Mul s] ─▶

with ``s = scale`` and ``zp = -offset``, per tensor, per axis (``axis``) or per
block (``axis`` + ``block_size``, opset 21). A grid gets the smallest type that
holds it; a grid narrower than its type (strict symmetric ``[-127, 127]``,
3-bit, 6-bit) is clamped to ``[s·(qmin - zp), s·(qmax - zp)]`` first (Clip, or
Max/Min per channel): for activations always, for weights only where a weight
lies outside that range. The values then equal the sim's bit for bit: same
division ``x / s``, same rounding half to even, same clamping.

>>> import os, tempfile, torch
>>> from torch import nn
>>> from quanta.quantsim import QuantizationSimModel
>>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
>>> x = torch.randn(32, 8)
>>> sim = QuantizationSimModel(model, x)
>>> sim.compute_encodings([x], progress=False)
>>> path = os.path.join(tempfile.mkdtemp(), "model.onnx")
>>> names = export_onnx(sim, path, x)
>>> names
{'0.param_quantizers.weight': '0.weight', '1.output_quantizers.0': '1.output.0',
 '2.output_quantizers.0': '2.output.0', '2.param_quantizers.weight': '2.weight'}
>>> import onnx
>>> m = onnx.load(path)
>>> m.opset_import[0].version, [n.op_type for n in m.graph.node][:4]
(13, ['QuantizeLinear', 'DequantizeLinear', 'Gemm', 'Relu'])

Naming (shared with :mod:`quanta.export.sim_encodings`): the float tensor an
encoding applies to, the input of its ``QuantizeLinear``, is called
``"<module>.input.<i>"`` / ``"<module>.output.<i>"``; a weight keeps its
``state_dict`` name ``"<module>.<param>"`` (an initializer). Graph inputs keep
the model's argument names, the graph output is ``"output"`` (``"output_<i>"``
for several, the keys for a dict such as a Hugging Face ``ModelOutput``). So an
encodings file keyed by these names matches the graph.

How: the sim is exported with every quantizer swapped for a marker (a custom
op that carries the quantizer's name and computes the identity), by
``torch.onnx.export`` (the TorchScript exporter by default, ``dynamo=True`` for
the torch.export-based one); each marker is then replaced by the nodes above.
Nothing depends on how the exporter names or decomposes the ops around them.

Before exporting, one float forward pass of ``dummy_input`` records the shape
each quantizer sees (per-axis and per-block layouts depend on it).

Limits: static shapes (the dummy input's); float32 models; integer grids of at
most 16 bits; float formats that ONNX has (float8 e4m3fn/e5m2/e4m3fnuz/e5m2fnuz,
float16, bfloat16); NaN inputs of integer quantizers give the runtime's code,
not NaN; models up to the 2 GB protobuf limit. A quantizer applied twice (a
module called twice) names its second tensor ``"<name>_1"``; one quantizer
object in several slots is named after the first. Quantizers the forward pass
never calls, or whose outputs do not reach the model's outputs, are left out
(a UserWarning names them).

onnxruntime: with graph optimisations on, it may replace DequantizeLinear ->
MatMul by MatMulNBits, whose default ``accuracy_level`` 4 computes with int8
activations; set the session option ``session.qdq_matmulnbits_accuracy_level``
to ``"0"`` to keep float activations (matters for 16-bit activations).
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
import io
import logging
import os
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from quanta._text import shortlist as _shortlist
from quanta._files import atomic_write
from quanta.export.protocol import QuantizedModelLike
from quanta.grids.affine import IntegerGrid
from quanta.kernels import affine as affine_kernels
from quanta.kernels import float_cast
from quanta.kernels.blocks import BlockLayout, resolve_layout
from quanta.nn.base import QuantizationMixin, eval_mode
from quanta.quantization.affine.quantizer import QuantizeDequantize
from quanta.quantization.base import QuantizerBase
from quanta.quantization.float import FloatQuantizeDequantize

__all__ = ["export_onnx"]

#: Lowest opset written: per-axis QuantizeLinear/DequantizeLinear need 13.
MIN_OPSET = 13
#: Highest opset accepted (what torch.onnx targets; onnxruntime 1.32 runs it).
MAX_OPSET = 23
_TORCHSCRIPT_MAX_OPSET = 20  # the TorchScript exporter stops here; higher opsets go through onnx's version converter
_DYNAMO_MIN_OPSET = 18  # the torch.export-based exporter's lowest opset

_MARKER_DOMAIN = "quanta_export"  # exists only between torch.onnx.export and the rewrite below
_MARKER_OP = "Marker"


# ---------------------------------------------------------------------- ONNX element types
@dataclass(frozen=True)
class _IntType:
    name: str
    proto: int  # onnx.TensorProto data type
    qmin: int
    qmax: int
    opset: int  # lowest opset whose QuantizeLinear/DequantizeLinear take it
    numpy: str | None  # numpy dtype of the raw data (None: 4-bit, packed two per byte)


def _int_types() -> list[_IntType]:
    from onnx import TensorProto as T

    return [  # smallest first: a grid gets the first type that holds it
        _IntType("int4", T.INT4, -8, 7, 21, None),
        _IntType("uint4", T.UINT4, 0, 15, 21, None),
        _IntType("int8", T.INT8, -128, 127, 13, "<i1"),
        _IntType("uint8", T.UINT8, 0, 255, 13, "<u1"),
        _IntType("int16", T.INT16, -(2**15), 2**15 - 1, 21, "<i2"),
        _IntType("uint16", T.UINT16, 0, 2**16 - 1, 21, "<u2"),
    ]


def _float8_types() -> dict[torch.dtype, int]:
    from onnx import TensorProto as T

    return {
        torch.float8_e4m3fn: T.FLOAT8E4M3FN,
        torch.float8_e5m2: T.FLOAT8E5M2,
        torch.float8_e4m3fnuz: T.FLOAT8E4M3FNUZ,
        torch.float8_e5m2fnuz: T.FLOAT8E5M2FNUZ,
    }


def _float16_types() -> dict[torch.dtype, int]:
    from onnx import TensorProto as T

    return {torch.float16: T.FLOAT16, torch.bfloat16: T.BFLOAT16}


def _int_type_for(grid: IntegerGrid) -> _IntType | None:
    signed = grid.qmin < 0
    for t in _int_types():
        if (t.qmin < 0) == signed and t.qmin <= grid.qmin and grid.qmax <= t.qmax:
            return t
    return None


def _tensor_proto(name: str, values: torch.Tensor, proto: int) -> Any:
    """An initializer holding ``values`` (exact) as ONNX type ``proto``; 4-bit types are packed two per byte."""
    from onnx import TensorProto

    values = values.detach().cpu()
    t = TensorProto()
    t.name = name
    t.data_type = proto
    t.dims.extend(values.shape)
    if proto == TensorProto.FLOAT:
        t.raw_data = values.to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
    elif proto in (TensorProto.INT4, TensorProto.UINT4):
        codes = (values.to(torch.int64).reshape(-1).numpy() & 0xF).astype(np.uint8)
        if codes.size % 2:
            codes = np.append(codes, np.uint8(0))
        t.raw_data = (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8).tobytes()  # first element in the low nibble
    elif proto in _float8_types().values() or proto in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
        dtype = {v: k for k, v in {**_float8_types(), **_float16_types()}.items()}[proto]
        raw = values.to(dtype).contiguous()
        t.raw_data = raw.view(torch.uint8 if raw.element_size() == 1 else torch.int16).numpy().astype(
            "<u1" if raw.element_size() == 1 else "<i2").tobytes()
    else:
        numpy_dtype = next(it.numpy for it in _int_types() if it.proto == proto)
        t.raw_data = values.to(torch.int64).numpy().astype(numpy_dtype).tobytes()
    return t


# ---------------------------------------------------------------------- granularity
@dataclass(frozen=True)
class _Granularity:
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


def _granularity(name: str, shape: tuple[int, ...], qshape: tuple[int, ...],
                 block_size: tuple[int, ...] | None) -> _Granularity:
    try:
        layout = resolve_layout(shape, qshape, block_size)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    lead = len(shape) - len(layout.scale_shape)
    blocks = tuple(shape[:lead]) + layout.block_size
    counts = [s // b if b else 1 for s, b in zip(shape, blocks)]
    split = [d for d, n in enumerate(counts) if n > 1]
    if not split:
        return _Granularity(shape, layout, blocks, None, None)
    if len(split) == 1 and blocks[split[0]] == 1:
        return _Granularity(shape, layout, blocks, split[0], None)
    blocked = [d for d in split if blocks[d] > 1]
    axis = max(blocked, key=lambda d: blocks[d]) if blocked else split[0]
    return _Granularity(shape, layout, blocks, axis, blocks[axis])


# ---------------------------------------------------------------------- per-quantizer plans
@dataclass
class _Plan:
    """What one quantizer becomes in ONNX (everything but node and tensor names)."""

    name: str
    kind: str  # "int" | "float8" | "cast"
    proto: int  # element type of the quantized values
    gran: _Granularity
    scale: torch.Tensor  # quantizer-shaped
    zero_point: torch.Tensor | None  # quantizer-shaped codes (int, float8)
    grid: IntegerGrid | None  # int: the quantizer's grid
    itype: _IntType | None
    fmax: float | None  # cast: the format's largest value
    opset: int
    what: str  # for messages, e.g. "int4 per-block"

    @property
    def narrow(self) -> bool:
        """True if the grid is a strict sub-range of the ONNX type (the sim clamps tighter than QuantizeLinear)."""
        return self.kind == "int" and (self.grid.qmin, self.grid.qmax) != (self.itype.qmin, self.itype.qmax)


def _plan(name: str, q: QuantizerBase, shape: tuple[int, ...]) -> _Plan:
    if isinstance(q, QuantizeDequantize):
        enc = q.get_encodings()
        if enc is None:  # pragma: no cover - checked before
            raise RuntimeError(f"{name} is not initialised; run sim.compute_encodings() first")
        itype = _int_type_for(q.grid)
        if itype is None:
            raise NotImplementedError(
                f"{name}: the grid [{q.grid.qmin}, {q.grid.qmax}] needs more than 16 bits; ONNX QuantizeLinear "
                "has no such type (export with qdq=False and an encodings file instead)")
        scale = enc.scale.detach().float()
        offset = torch.broadcast_to(enc.offset.detach().float(), scale.shape)
        gran = _granularity(name, shape, tuple(q.shape), q.block_size)
        opset = max(itype.opset, 21 if gran.kind == "block" else MIN_OPSET)
        return _Plan(name, "int", itype.proto, gran, scale, -offset, q.grid, itype, None, opset,
                     f"{itype.name} per-{gran.kind}")
    if isinstance(q, FloatQuantizeDequantize):
        dtype = q.format.torch_dtype
        scale = q.get_scale().detach().float()
        gran = _granularity(name, shape, tuple(q.shape), q.block_size)
        if dtype in _float8_types():
            opset = 21 if gran.kind == "block" else 19
            return _Plan(name, "float8", _float8_types()[dtype], gran, scale, torch.zeros_like(scale), None, None,
                         None, opset, f"{q.format.name()} per-{gran.kind}")
        if dtype in _float16_types():
            return _Plan(name, "cast", _float16_types()[dtype], gran, scale, None, None, None, float(q.format.max),
                         MIN_OPSET, q.format.name())
        raise NotImplementedError(
            f"{name}: ONNX has no type for the float format {q.format.name()} (supported: float8 e4m3fn/e5m2/"
            "e4m3fnuz/e5m2fnuz, float16, bfloat16); export with qdq=False and an encodings file instead")
    raise NotImplementedError(
        f"{name}: cannot export a {type(q).__name__} as QuantizeLinear/DequantizeLinear "
        "(supported: quanta.quantization.affine.QuantizeDequantize, "
        "quanta.quantization.float.FloatQuantizeDequantize)")


def _plan_for_calls(slot: _Slot) -> _Plan:
    plan = _plan(slot.name, slot.quantizer, slot.stub.inputs[0][0])
    shapes = {shape for shape, _ in slot.stub.inputs}
    if len(shapes) > 1 and plan.gran.kind != "tensor":
        raise NotImplementedError(f"{slot.name} is applied to tensors of shapes {sorted(shapes)}; "
                                  f"a per-{plan.gran.kind} quantizer can be exported for one shape only")
    return plan


def _int_codes(plan: _Plan, w: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """``clamp(round(w / s) - o, qmin, qmax)`` with the sim's kernel."""
    return affine_kernels.quantize(w.detach().float(), plan.scale, -plan.zero_point, IntegerGrid(qmin, qmax),
                                   _kernel_blocks(plan))


def _kernel_blocks(plan: _Plan) -> tuple[int, ...] | None:
    layout = plan.gran.layout
    return None if layout.is_broadcast else layout.block_size


# ---------------------------------------------------------------------- markers
class _Marker(torch.autograd.Function):
    """Identity that the TorchScript exporter writes as ``quanta_export::Marker(name=...)``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, name: str) -> torch.Tensor:  # type: ignore[override]
        return x.clone()

    @staticmethod
    def symbolic(g: Any, x: Any, name: str) -> Any:
        return g.op(f"{_MARKER_DOMAIN}::{_MARKER_OP}", x, name_s=name).setType(x.type())


_DYNAMO_OP: Any = None


def _dynamo_marker() -> tuple[Any, dict[Any, Any]]:
    """The marker as a torch custom op and its onnxscript translation, registered on first use."""
    global _DYNAMO_OP
    if _DYNAMO_OP is None:
        import onnx
        import onnxscript

        @torch.library.custom_op(f"{_MARKER_DOMAIN}::marker", mutates_args=())
        def marker(x: torch.Tensor, name: str) -> torch.Tensor:
            return x.clone()

        @marker.register_fake
        def _(x: torch.Tensor, name: str) -> torch.Tensor:
            return torch.empty_like(x)

        schema = onnx.defs.OpSchema(
            _MARKER_OP, _MARKER_DOMAIN, 1,
            inputs=[onnx.defs.OpSchema.FormalParameter("x", "T")],
            outputs=[onnx.defs.OpSchema.FormalParameter("y", "T")],
            type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)", "tensor(double)"], "")],
            attributes=[onnx.defs.OpSchema.Attribute("name", onnx.defs.OpSchema.AttrType.STRING, "")],
        )
        op = onnxscript.values.Op(onnxscript.values.Opset(_MARKER_DOMAIN, 1), _MARKER_OP, schema)

        def translate(x: Any, name: str) -> Any:
            return op(x, name=name)

        _DYNAMO_OP = (torch.ops.quanta_export.marker, {torch.ops.quanta_export.marker.default: translate})
    return _DYNAMO_OP


class _Stub(nn.Module):
    """Stands in a quantizer's place during export: records shapes, then emits a marker."""

    _calibrating = True  # QuantizationMixin._qparam must not cache a traced value

    def __init__(self, name: str) -> None:
        super().__init__()
        self.qname = name
        self.mode = "record"  # "record" | "torchscript" | "dynamo"
        self.inputs: list[tuple[tuple[int, ...], torch.dtype]] = []

    def forward(self, x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        if self.mode == "record":
            self.inputs.append((tuple(x.shape), x.dtype))
            return x
        if self.mode == "dynamo":
            return _dynamo_marker()[0](x, self.qname)
        return _Marker.apply(x, self.qname)


@dataclass
class _Slot:
    name: str  # as in sim.named_quantizers()
    quantizer: QuantizerBase
    stub: _Stub
    tensor: str  # ONNX tensor name of the quantized value
    param: tuple[QuantizationMixin, str] | None  # (module, parameter name) for parameter quantizers
    places: list[tuple[nn.Module, str]] = field(default_factory=list)  # (parent, child key) holding it


_SLOT = re.compile(r"^(?:(?P<module>.*)\.)?(?P<kind>input_quantizers|output_quantizers|param_quantizers)"
                   r"\.(?P<key>[^.]+)$")


def _slots(sim: QuantizedModelLike) -> dict[int, _Slot]:
    model = sim.model
    modules = dict(model.named_modules())
    slots: dict[int, _Slot] = {}
    for name, q in sim.named_quantizers():
        if id(q) in slots:
            continue
        tensor, param = name, None
        m = _SLOT.match(name)
        if m is not None:
            owner = modules.get(m["module"] or "")
            prefix = f"{m['module']}." if m["module"] else ""
            if isinstance(owner, QuantizationMixin):
                if m["kind"] == "param_quantizers":
                    if isinstance(getattr(owner, m["key"], None), torch.Tensor):
                        tensor, param = f"{prefix}{m['key']}", (owner, m["key"])
                else:
                    tensor = f"{prefix}{'input' if m['kind'] == 'input_quantizers' else 'output'}.{m['key']}"
        slots[id(q)] = _Slot(name, q, _Stub(name), tensor, param)
    for _, parent in model.named_modules(remove_duplicate=False):
        for key, child in parent._modules.items():
            if child is not None and id(child) in slots:
                slots[id(child)].places.append((parent, key))
    return slots


@contextlib.contextmanager
def _stubs_in(slots: dict[int, _Slot]) -> Iterator[None]:
    try:
        for s in slots.values():
            for parent, key in s.places:
                parent._modules[key] = s.stub
        yield
    finally:
        for s in slots.values():
            for parent, key in s.places:
                parent._modules[key] = s.quantizer
            if s.param is not None:  # drop anything cached while the stub sat there
                s.param[0].__dict__.get("_qparam_cache", {}).pop(s.param[1], None)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the exporters' deprecation notices, tracer warnings and registry logging (errors still raise)."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._export", "onnxscript")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


# ---------------------------------------------------------------------- argument checks
class _Exported(nn.Module):
    """What the ONNX exporter traces: ``model`` called with the tensor inputs as positional arguments and the
    other keyword inputs (``use_cache=False``) fixed, returning the tensors of its output as a flat tuple
    (a ``ModelOutput`` holding a ``DynamicCache`` is not something the exporter takes)."""

    def __init__(self, model: nn.Module, names: list[str], fixed: dict[str, Any]) -> None:
        super().__init__()
        self.model, self.names, self.fixed = model, names, fixed

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(_flat_tensors(self.model(**dict(zip(self.names, tensors)), **self.fixed)))


def _check_inputs(dummy_input: Any, model: nn.Module) -> tuple[tuple[torch.Tensor, ...], dict[str, Any] | None]:
    """``(positional tensor inputs, None)``, or for a dict of keyword inputs ``(its tensors in the order of the
    forward's parameters, {name: value} of all of them)``."""
    if isinstance(dummy_input, Mapping):
        try:
            bound = inspect.signature(model.forward).bind(**dummy_input).arguments
        except TypeError as e:
            raise TypeError(f"dummy_input: {e}") from None
        tensors = tuple(v for v in bound.values() if isinstance(v, torch.Tensor))
        if not tensors:
            raise TypeError("dummy_input: the dict holds no tensor")
        return tensors, dict(bound)
    args = dummy_input if isinstance(dummy_input, tuple) else (dummy_input,)
    if not args or not all(isinstance(a, torch.Tensor) for a in args):
        raise TypeError(
            "dummy_input must be a tensor, a tuple of tensors (the positional inputs of sim.model) or a dict of "
            "keyword inputs, "
            f"got {type(dummy_input).__name__}")
    return args, None


def _input_names(model: nn.Module, n: int) -> list[str]:
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:n]
    if len(names) < n or len(set(names)) < n:
        names = ["input"] if n == 1 else [f"input_{i}" for i in range(n)]
    return names


def _flat_tensors(out: Any) -> list[torch.Tensor]:
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def _output_names(out: Any) -> list[str]:
    """``"output"`` for one tensor; the keys for a dict (``"last_hidden_state"``, nested ones joined with
    ``"."``); else ``"output_<i>"`` in flattening order."""
    pytree = torch.utils._pytree
    paths = [p for p, t in pytree.tree_flatten_with_path(out)[0] if isinstance(t, torch.Tensor)]
    if len(paths) == 1 and not isinstance(out, Mapping):
        return ["output"]
    if isinstance(out, Mapping):
        names = [".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in p) for p in paths]
        if len(set(names)) == len(names) and all(names):
            return names
    return [f"output_{i}" for i in range(len(paths))]


# ---------------------------------------------------------------------- export
def export_onnx(
    sim: QuantizedModelLike,
    path: str | os.PathLike,
    dummy_input: torch.Tensor | tuple[torch.Tensor, ...],
    *,
    qdq: bool = True,
    prequantize_weights: bool = False,
    opset: int | None = None,
    dynamo: bool = False,
) -> dict[str, str]:
    """Write ``sim`` as an ONNX model with QuantizeLinear/DequantizeLinear nodes; return quantizer → tensor names.

    Args:
        sim: a :class:`~quanta.quantsim.QuantizationSimModel` (calibrated, for ``qdq=True``), or any
            :class:`~quanta.export.protocol.QuantizedModelLike`.
        path: the ``.onnx`` file, written atomically (a failed export leaves an existing file intact).
        dummy_input: a tensor or tuple of tensors ``sim.model`` accepts, or a dict of its keyword inputs
            (the graph inputs are its tensors; other values, ``use_cache=False``, are fixed); the graph has
            their shapes.
        qdq: if False, write the float graph (no quantization nodes) with the same tensor names,
            for use with an encodings file.
        prequantize_weights: store quantized weights as integer (or float8 / float16) initializers
            feeding a DequantizeLinear, instead of float weights through QuantizeLinear and
            DequantizeLinear. Needs ``qdq=True``.
        opset: the ONNX opset; default: the lowest that expresses every quantizer (13 for
            8-bit grids, 19 for float8, 21 for int4/uint4/int16/uint16 and per-block). Must be
            in [13, 23], and not below what a quantizer needs (ValueError naming it).
        dynamo: use the torch.export-based exporter (opset 18 or higher) instead of the
            TorchScript one.

    Returns:
        ``{quantizer name (as in sim.named_quantizers()): ONNX tensor name}`` for every enabled
        quantizer the forward pass uses: ``"conv1.output_quantizers.0": "conv1.output.0"``,
        ``"conv1.param_quantizers.weight": "conv1.weight"``. The named tensor is the float
        input of the quantizer's QuantizeLinear (with ``prequantize_weights``, a weight's
        name is its integer initializer).

    Raises:
        TypeError: ``sim``, ``path`` or ``dummy_input`` of the wrong type.
        RuntimeError: a quantizer is not initialised (``qdq=True``).
        NotImplementedError: a quantizer ONNX cannot express (named).
        ValueError: a bad ``opset``, or ``prequantize_weights`` without ``qdq``.
    """
    if not isinstance(sim, QuantizedModelLike):
        raise TypeError("sim must be a quanta.quantsim.QuantizationSimModel (or another QuantizedModelLike: model, "
                        f"named_quantizers(), quantized_modules()), got {type(sim).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    args, keywords = _check_inputs(dummy_input, sim.model)
    for flag, value in (("qdq", qdq), ("prequantize_weights", prequantize_weights), ("dynamo", dynamo)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool, got {value!r}")
    if prequantize_weights and not qdq:
        raise ValueError("prequantize_weights=True needs qdq=True (a float graph has no quantized weights)")
    if opset is not None and (isinstance(opset, bool) or not isinstance(opset, int)):
        raise TypeError(f"opset must be an int or None, got {opset!r}")
    if opset is not None and not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"opset must be in [{MIN_OPSET}, {MAX_OPSET}], got {opset}")
    if opset is not None and dynamo and opset < _DYNAMO_MIN_OPSET:
        raise ValueError(f"dynamo=True exports opset {_DYNAMO_MIN_OPSET} or higher, got opset={opset}; "
                         "use dynamo=False for a lower opset")
    try:
        import onnx  # noqa: F401
    except ImportError:  # pragma: no cover - optional dependency
        raise ImportError("export_onnx needs the onnx package: pip install quanta[onnx]") from None
    if dynamo and importlib.util.find_spec("onnxscript") is None:
        raise ImportError("export_onnx(dynamo=True) needs onnxscript (torch's torch.export-based exporter): "
                          "pip install quanta[onnx]")

    slots = _slots(sim)
    model = sim.model
    with eval_mode(model), _stubs_in(slots):
        with torch.no_grad():
            result = model(**keywords) if keywords is not None else model(*args)  # records quantizers' shapes
            outputs = _flat_tensors(result)
        used = {k: s for k, s in slots.items() if s.stub.inputs}
        unused = [s.name for s in slots.values() if not s.stub.inputs]
        if unused:
            warnings.warn(f"export_onnx: the forward pass does not use quantizers {_shortlist(unused)}; "
                          "they are not in the ONNX graph", UserWarning, stacklevel=2)
        missing = [s.name for s in used.values() if not s.quantizer.is_initialized()]
        if qdq and missing:
            raise RuntimeError(f"quantizers not initialised: {_shortlist(missing)}; run sim.compute_encodings() "
                               "(or load encodings) before exporting with qdq=True")
        for s in used.values():
            dtypes = {d for _, d in s.stub.inputs}
            if dtypes != {torch.float32}:
                raise NotImplementedError(f"{s.name} quantizes a {sorted(map(str, dtypes))} tensor; only float32 "
                                          "models can be exported (call sim.model.float() first)")
        plans = {s.name: _plan_for_calls(s) for s in used.values()} if qdq else {}
        target = _choose_opset(plans, opset, dynamo)
        if keywords is not None:
            input_names = [k for k, v in keywords.items() if isinstance(v, torch.Tensor)]
            traced: nn.Module = _Exported(model, input_names,
                                          {k: v for k, v in keywords.items() if not isinstance(v, torch.Tensor)})
        else:
            input_names, traced = _input_names(model, len(args)), model
        output_names = _output_names(result)
        proto = _torch_export(traced, args, used, target, input_names, output_names, dynamo)

    names = _rewrite(proto, used, plans, qdq=qdq, prequantize=prequantize_weights)
    dropped = [s.name for s in used.values() if s.name not in names]
    if dropped:
        warnings.warn(f"export_onnx: the outputs of quantizers {_shortlist(dropped)} do not reach the model's "
                      "outputs; the exporter removed them", UserWarning, stacklevel=2)
    _finish(proto, target, input_names, output_names)

    def write(tmp: str) -> None:
        import onnx

        onnx.save_model(proto, tmp)

    atomic_write(path, write)
    return names



def _choose_opset(plans: dict[str, _Plan], opset: int | None, dynamo: bool) -> int:
    floor = _DYNAMO_MIN_OPSET if dynamo else MIN_OPSET
    if opset is None:
        return max([floor, *(p.opset for p in plans.values())])
    too_high = [p for p in plans.values() if p.opset > opset]
    if too_high:
        p = max(too_high, key=lambda p: p.opset)
        raise ValueError(f"opset {opset} is too low: {p.name} ({p.what}) needs opset {p.opset}"
                         + (f" (and {len(too_high) - 1} more quantizers)" if len(too_high) > 1 else ""))
    return opset


def _torch_export(model: nn.Module, args: tuple[torch.Tensor, ...], used: dict[int, _Slot], target: int,
                  input_names: list[str], output_names: list[str], dynamo: bool) -> Any:
    import onnx

    for s in used.values():
        s.stub.mode = "dynamo" if dynamo else "torchscript"
    with _quiet():
        if dynamo:
            _, table = _dynamo_marker()
            program = torch.onnx.export(model, args, dynamo=True, opset_version=target, input_names=input_names,
                                        output_names=output_names, custom_translation_table=table, verbose=False)
            proto = program.model_proto
        else:
            buffer = io.BytesIO()
            torch.onnx.export(model, args, buffer, dynamo=False, opset_version=min(target, _TORCHSCRIPT_MAX_OPSET),
                              input_names=input_names, output_names=output_names,
                              training=torch.onnx.TrainingMode.EVAL, do_constant_folding=True)
            proto = onnx.load_from_string(buffer.getvalue())
    version = _default_opset(proto)
    if version != target:
        from onnx import version_converter

        try:
            proto = version_converter.convert_version(proto, target)
        except Exception as e:  # noqa: BLE001  (the converter raises plain RuntimeErrors)
            raise RuntimeError(f"could not convert the exported opset-{version} graph to opset {target}: {e}") from e
    return proto


def _default_opset(proto: Any) -> int:
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


# ---------------------------------------------------------------------- graph rewrite
class _Names:
    """Fresh tensor names: exporter names that clash with the ones we introduce get renamed first."""

    def __init__(self, taken: set[str]) -> None:
        self.taken = set(taken)

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name


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


def _rewrite(proto: Any, used: dict[int, _Slot], plans: dict[str, _Plan], *, qdq: bool, prequantize: bool
             ) -> dict[str, str]:
    """Replace each marker by its quantization nodes (or by nothing, ``qdq=False``) and name the tensors."""
    from onnx import helper

    graph = proto.graph
    by_name = {s.name: s for s in used.values()}
    markers = [n for n in graph.node if n.domain == _MARKER_DOMAIN and n.op_type == _MARKER_OP]
    marker_of = {id(n): next(a.s.decode() for a in n.attribute if a.name == "name") for n in markers}
    unknown = sorted(set(marker_of.values()) - set(by_name))
    if unknown:  # pragma: no cover - every marker comes from a stub
        raise RuntimeError(f"internal error: markers for unknown quantizers {unknown}")

    # Names we introduce must not exist yet: move clashing exporter names out of the way.
    wanted = {s.tensor for s in used.values()}
    existing = _all_names(graph)
    clashes = {}
    reserve = _Names(existing | wanted)
    io_names = {i.name for i in graph.input} | {o.name for o in graph.output}
    for name in sorted(existing & wanted):
        if name in io_names:
            raise ValueError(f"the model's input or output {name!r} has the name export_onnx gives a quantized "
                             "tensor; rename the forward argument")
        clashes[name] = reserve.fresh(f"{name}__export")
    _rename_everywhere(graph, clashes)
    names = _Names(_all_names(graph) | wanted)  # the wanted names are used as they are, never made up
    graph_inputs = {i.name for i in graph.input}
    graph_outputs = {o.name for o in graph.output}
    initializers = {i.name for i in graph.initializer}

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
    result: dict[str, str] = {}
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
                result.setdefault(slot.name, weight)
            source = weights_done[weight]
            if y in graph_outputs:
                new_nodes.append(helper.make_node("Identity", [source], [y], name=names.fresh(f"{weight}/Identity")))
            else:
                alias[y] = source
            continue

        current = resolve(x)
        target = slot.tensor if slot.tensor not in targets else names.fresh(slot.tensor)  # a second call: "_1"
        targets.add(target)
        result.setdefault(slot.name, target)
        if current in graph_inputs or current in graph_outputs or current in initializers or current in targets \
                or current in weights_done.values():
            new_nodes.append(helper.make_node("Identity", [current], [target],
                                              name=names.fresh(f"{target}/Identity")))
        else:
            alias[current] = target
        if not qdq:
            if y in graph_outputs:
                new_nodes.append(helper.make_node("Identity", [target], [y], name=names.fresh(f"{target}/Identity")))
            else:
                alias[y] = target
            continue
        out = y if y in graph_outputs else names.fresh(f"{target}_dequantized")
        nodes, inits = _qdq_nodes(plan, target, out, names, clamp=plan.narrow)
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


def _weight_nodes(slot: _Slot, plan: _Plan | None, names: _Names, *, qdq: bool, prequantize: bool
                  ) -> tuple[list[Any], list[Any], str]:
    """Initializer ``slot.tensor`` and the nodes after it; returns (nodes, initializers, output tensor)."""
    from onnx import TensorProto

    module, pname = slot.param  # type: ignore[misc]
    w = getattr(module, pname).detach().float()
    name = slot.tensor
    if not qdq:
        return [], [_tensor_proto(name, w, TensorProto.FLOAT)], name
    assert plan is not None
    out = names.fresh(f"{name}_dequantized")
    if not prequantize:
        clamp = plan.narrow and not torch.equal(_int_codes(plan, w, plan.grid.qmin, plan.grid.qmax),
                                                _int_codes(plan, w, plan.itype.qmin, plan.itype.qmax))
        nodes, inits = _qdq_nodes(plan, name, out, names, clamp=clamp)
        return nodes, [_tensor_proto(name, w, TensorProto.FLOAT), *inits], out
    if plan.kind == "int":
        codes = _int_codes(plan, w, plan.grid.qmin, plan.grid.qmax)
        nodes, inits = _dq_nodes(plan, name, out, names)
        return nodes, [_tensor_proto(name, codes, plan.proto), *inits], out
    values = float_cast.quantize(w, plan.scale, _format_of(slot.quantizer), _kernel_blocks(plan))
    if plan.kind == "float8":
        nodes, inits = _dq_nodes(plan, name, out, names)
        return nodes, [_tensor_proto(name, values, plan.proto), *inits], out
    nodes, inits = _uncast_nodes(plan, name, out, names)  # float16 / bfloat16 values, then Cast back
    return nodes, [_tensor_proto(name, values, plan.proto), *inits], out


def _format_of(q: QuantizerBase) -> Any:
    return q.format  # type: ignore[attr-defined]


def _q_attrs(plan: _Plan) -> dict[str, int]:
    g = plan.gran
    attrs = {} if g.axis is None else {"axis": g.axis}
    if g.block_size is not None:
        attrs["block_size"] = g.block_size
    return attrs


def _scale_zero_point(plan: _Plan, base: str, names: _Names) -> tuple[list[Any], str, str]:
    from onnx import TensorProto

    s, zp = names.fresh(f"{base}_scale"), names.fresh(f"{base}_zero_point")
    inits = [_tensor_proto(s, plan.gran.onnx_param(plan.scale), TensorProto.FLOAT),
             _tensor_proto(zp, plan.gran.onnx_param(plan.zero_point), plan.proto)]
    return inits, s, zp


def _dq_nodes(plan: _Plan, src: str, dst: str, names: _Names) -> tuple[list[Any], list[Any]]:
    from onnx import helper

    inits, s, zp = _scale_zero_point(plan, src, names)
    node = helper.make_node("DequantizeLinear", [src, s, zp], [dst], name=names.fresh(f"{src}/DequantizeLinear"),
                            **_q_attrs(plan))
    return [node], inits


def _qdq_nodes(plan: _Plan, src: str, dst: str, names: _Names, *, clamp: bool) -> tuple[list[Any], list[Any]]:
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


def _clamp_nodes(plan: _Plan, x: str, lo: torch.Tensor, hi: torch.Tensor, names: _Names
                 ) -> tuple[list[Any], list[Any], str]:
    """``clamp(x, lo, hi)`` with quantizer-shaped bounds: Clip when per tensor, else Max and Min."""
    from onnx import TensorProto, helper

    out = names.fresh(f"{x}_clamped")
    lo_name, hi_name = names.fresh(f"{x}_clamp_min"), names.fresh(f"{x}_clamp_max")
    if plan.gran.axis is None:
        inits = [_tensor_proto(lo_name, lo.reshape(()), TensorProto.FLOAT),
                 _tensor_proto(hi_name, hi.reshape(()), TensorProto.FLOAT)]
        return [helper.make_node("Clip", [x, lo_name, hi_name], [out], name=names.fresh(f"{x}/Clip"))], inits, out
    inits = [_tensor_proto(lo_name, plan.gran.broadcastable(lo), TensorProto.FLOAT),
             _tensor_proto(hi_name, plan.gran.broadcastable(hi), TensorProto.FLOAT)]
    mid = names.fresh(f"{x}_clamped_below")
    nodes = [helper.make_node("Max", [x, lo_name], [mid], name=names.fresh(f"{x}/Max")),
             helper.make_node("Min", [mid, hi_name], [out], name=names.fresh(f"{x}/Min"))]
    return nodes, inits, out


def _cast_nodes(plan: _Plan, src: str, dst: str, names: _Names) -> tuple[list[Any], list[Any]]:
    """``cast(x / s) * s`` for a 16-bit float format, saturating like the sim."""
    from onnx import TensorProto, helper

    nodes: list[Any] = []
    inits: list[Any] = []
    x = src
    scaled = not bool((plan.scale == 1).all())
    if scaled:
        s = names.fresh(f"{src}_scale")
        inits.append(_tensor_proto(s, plan.gran.broadcastable(plan.scale), TensorProto.FLOAT))
        y = names.fresh(f"{src}_scaled")
        nodes.append(helper.make_node("Div", [x, s], [y], name=names.fresh(f"{src}/Div")))
        x = y
    lo, hi = names.fresh(f"{src}_clamp_min"), names.fresh(f"{src}_clamp_max")
    inits += [_tensor_proto(lo, torch.tensor(-plan.fmax), TensorProto.FLOAT),
              _tensor_proto(hi, torch.tensor(plan.fmax), TensorProto.FLOAT)]
    clipped, low, back = names.fresh(f"{src}_clamped"), names.fresh(f"{src}_cast"), names.fresh(f"{src}_uncast")
    nodes += [helper.make_node("Clip", [x, lo, hi], [clipped], name=names.fresh(f"{src}/Clip")),
              helper.make_node("Cast", [clipped], [low], to=plan.proto, name=names.fresh(f"{src}/Cast")),
              helper.make_node("Cast", [low], [back if scaled else dst], to=TensorProto.FLOAT,
                               name=names.fresh(f"{src}/Cast"))]
    if scaled:
        nodes.append(helper.make_node("Mul", [back, s], [dst], name=names.fresh(f"{src}/Mul")))
    return nodes, inits


def _uncast_nodes(plan: _Plan, src: str, dst: str, names: _Names) -> tuple[list[Any], list[Any]]:
    """A stored 16-bit float weight back to float32 (times its scale)."""
    from onnx import TensorProto, helper

    scaled = not bool((plan.scale == 1).all())
    back = names.fresh(f"{src}_uncast") if scaled else dst
    nodes = [helper.make_node("Cast", [src], [back], to=TensorProto.FLOAT, name=names.fresh(f"{src}/Cast"))]
    inits: list[Any] = []
    if scaled:
        s = names.fresh(f"{src}_scale")
        inits.append(_tensor_proto(s, plan.gran.broadcastable(plan.scale), TensorProto.FLOAT))
        nodes.append(helper.make_node("Mul", [back, s], [dst], name=names.fresh(f"{src}/Mul")))
    return nodes, inits


def _finish(proto: Any, opset: int, input_names: list[str], output_names: list[str]) -> None:
    """Graph I/O names, dead nodes and initializers, opset imports and IR version."""
    from onnx import AttributeProto, helper

    graph = proto.graph
    # graph inputs / outputs by position
    mapping = {}
    if len(graph.input) == len(input_names):
        mapping.update((v.name, want) for v, want in zip(graph.input, input_names))
    if len(graph.output) == len(output_names):
        mapping.update((v.name, want) for v, want in zip(graph.output, output_names))
    mapping = {k: v for k, v in mapping.items() if k != v}
    if mapping:
        taken = _all_names(graph) - set(mapping)
        clash = {n: f"{n}__export" for n in taken if n in mapping.values()}
        _rename_everywhere(graph, clash)
        _rename_everywhere(graph, mapping)

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
               if o.domain not in ("", "ai.onnx", _MARKER_DOMAIN) and o.domain in domains]
    del proto.opset_import[:]
    proto.opset_import.extend([helper.make_opsetid("", opset), *imports])
    proto.ir_version = max(proto.ir_version, helper.find_min_ir_version_for(list(proto.opset_import)))
