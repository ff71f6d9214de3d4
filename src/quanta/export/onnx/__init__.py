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
>>> names["0.param_quantizers.weight"], names["1.output_quantizers.0"], names["2.output_quantizers.0"]
('0.weight', '/1/Relu_output_0', '/2/Gemm_output_0')
>>> import onnx
>>> m = onnx.load(path)
>>> m.opset_import[0].version, [n.op_type for n in m.graph.node if n.op_type in ("Gemm", "Relu")]
(13, ['Gemm', 'Relu', 'Gemm'])

Naming, as in AIMET's export: the float tensor an encoding applies to, the input of its
``QuantizeLinear``, keeps the name ``torch.onnx`` gives it (``"/relu1/Relu_output_0"``: the op's module
scope, op type and output index; a graph input's name); a weight keeps its ``state_dict`` name
``"<module>.<param>"`` (an initializer). A captured model calls its modules from the top, so each gets
its path as scope (:func:`~quanta.export.onnx.markers.scope_paths`): ``"/layers.0/query/Add_output_0"``,
as when the original model runs. Where AIMET's names differ: a ``Sequential``'s own scope is not repeated
(``"/features.0/Conv_output_0"``, AIMET ``"/features/features.0/Conv_output_0"``), and a functional op
quanta turns into a module carries its name (``"/layers.0/softmax/Softmax_output_0"``, AIMET
``"/layers.0/Softmax_output_0"``). A tensor that has no name of its own in the float graph gets
quanta's tensor name ``"<module>.input.<i>"`` / ``"<module>.output.<i>"`` on an Identity: the second of two
quantizers in a row (a producer's output quantizer, then a consumer's input one) or of two quantizers of
one tensor. Graph inputs keep the model's argument names, the graph output is ``"output"``
(``"output_<i>"`` for several, the keys for a dict such as a Hugging Face ``ModelOutput``); AIMET leaves
those to the exporter (``"t.1"``, ``"25"``). So an encodings file keyed by these names matches the graph,
and the names of tensors inside the model are the ones AIMET's export gives the same model.

How: the sim is exported with every quantizer swapped for a marker (a custom
op that carries the quantizer's name and computes the identity), by
``torch.onnx.export`` (the TorchScript exporter by default, ``dynamo=True`` for
the torch.export-based one); each marker is then replaced by the nodes above.
Nothing depends on how the exporter names or decomposes the ops around them.
The steps live in :mod:`~quanta.export.onnx.plan` (what each quantizer becomes),
:mod:`~quanta.export.onnx.markers` (stubs, markers, ``torch.onnx.export``),
:mod:`~quanta.export.onnx.nodes` (the nodes of one quantizer) and
:mod:`~quanta.export.onnx.rewrite` (markers replaced, graph tidied).

Before exporting, one float forward pass of ``dummy_input`` records the shape
each quantizer sees (per-axis and per-block layouts depend on it).

Limits: static shapes (the dummy input's); float32 models; integer grids of at
most 16 bits; float formats that ONNX has (float8 e4m3fn/e5m2/e4m3fnuz/e5m2fnuz,
float16, bfloat16); NaN inputs of integer quantizers give the runtime's code,
not NaN; models up to the 2 GB protobuf limit. One quantizer object in several
slots is named after the first. Quantizers the forward pass
never calls, or whose outputs do not reach the model's outputs, are left out
(a UserWarning names them).

onnxruntime: with graph optimisations on, it may replace DequantizeLinear ->
MatMul by MatMulNBits, whose default ``accuracy_level`` 4 computes with int8
activations; set the session option ``session.qdq_matmulnbits_accuracy_level``
to ``"0"`` to keep float activations (matters for 16-bit activations).
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from quanta._files import atomic_write
from quanta._inputs import split_dummy_input
from quanta._text import shortlist as _shortlist
from quanta.export.onnx.markers import export_with_markers, quantizer_slots, scope_paths, stubs_in
from quanta.export.onnx.plan import (
    DYNAMO_MIN_OPSET,
    MAX_OPSET,
    MIN_OPSET,
    TORCH_DEFAULT_OPSET,
    choose_opset,
    block_scaled_weight_plan,
    plan_for_calls,
)
from quanta.export.onnx.rewrite import finish, replace_markers
from quanta.export.protocol import QuantizedModelLike
from quanta.nn.base import eval_mode
from quanta.quantization.float import BlockScaledQuantizeDequantize

__all__ = ["OnnxExport", "TORCH_DEFAULT_OPSET", "export_onnx", "export_onnx_model"]  # MIN/MAX_OPSET importable too


# ---------------------------------------------------------------------- export
@dataclass
class OnnxExport:
    """An exported graph and what it names.

    Attributes:
        proto: the ``onnx.ModelProto``.
        tensors: ``{quantizer name: [ONNX tensor name, ...]}``, one tensor per call of the quantizer (a
            module called twice is quantized twice), first call first.
        inputs, outputs: the graph's input and output names.
    """

    proto: Any
    tensors: dict[str, list[str]]
    inputs: list[str]
    outputs: list[str]

    def names(self) -> dict[str, str]:
        """``{quantizer name: the tensor of its first call}`` (what :func:`export_onnx` returns)."""
        return {q: t[0] for q, t in self.tensors.items()}

    def save(self, path: str | os.PathLike) -> None:
        """Write :attr:`proto` to ``path`` atomically (a failed write leaves an existing file intact)."""
        import onnx

        atomic_write(path, lambda tmp: onnx.save_model(self.proto, tmp))


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

    :func:`export_onnx_model` without the file, then saved.

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
        quantizer the forward pass uses: ``"relu1.output_quantizers.0": "/relu1/Relu_output_0"``,
        ``"conv1.param_quantizers.weight": "conv1.weight"``. The named tensor is the float
        input of the quantizer's QuantizeLinear (with ``prequantize_weights``, a weight's
        name is its integer initializer); a quantizer called twice is named after its first call
        (:func:`export_onnx_model` gives all).

    Raises:
        TypeError: ``sim``, ``path`` or ``dummy_input`` of the wrong type.
        RuntimeError: a quantizer is not initialised (``qdq=True``).
        NotImplementedError: a quantizer ONNX cannot express (named).
        ValueError: a bad ``opset``, or ``prequantize_weights`` without ``qdq``.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    exported = export_onnx_model(sim, dummy_input, qdq=qdq, prequantize_weights=prequantize_weights, opset=opset,
                                 dynamo=dynamo, _stacklevel=3)
    exported.save(path)
    return exported.names()


def export_onnx_model(
    sim: QuantizedModelLike,
    dummy_input: torch.Tensor | tuple[torch.Tensor, ...],
    *,
    qdq: bool = True,
    prequantize_weights: bool = False,
    opset: int | None = None,
    dynamo: bool = False,
    min_opset: int = MIN_OPSET,
    _stacklevel: int = 2,
) -> OnnxExport:
    """The ONNX model :func:`export_onnx` writes, in memory, with every tensor each quantizer quantizes.

    ``min_opset``: with ``opset=None``, the opset is the lowest at least ``min_opset`` that expresses every
    quantizer (:meth:`~quanta.quantsim.QuantizationSimModel.export` asks for ``TORCH_DEFAULT_OPSET``, 20, as
    AIMET's export uses: the opset decides how LayerNorm or GELU are written and so their tensor names).

    >>> import torch
    >>> from quanta.quantsim import QuantizationSimModel
    >>> sim = QuantizationSimModel(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), torch.randn(2, 4))
    >>> exported = export_onnx_model(sim, torch.randn(2, 4), qdq=False)
    >>> exported.tensors["1.output_quantizers.0"], exported.tensors["0.param_quantizers.weight"]
    (['/1/Relu_output_0'], ['0.weight'])
    >>> exported.inputs, exported.outputs
    (['input'], ['output'])
    """
    if not isinstance(sim, QuantizedModelLike):
        raise TypeError("sim must be a quanta.quantsim.QuantizationSimModel (or another QuantizedModelLike: model, "
                        f"named_quantizers(), quantized_modules()), got {type(sim).__name__}")
    args, keywords = split_dummy_input(dummy_input, sim.model.forward)
    for flag, value in (("qdq", qdq), ("prequantize_weights", prequantize_weights), ("dynamo", dynamo)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool, got {value!r}")
    if prequantize_weights and not qdq:
        raise ValueError("prequantize_weights=True needs qdq=True (a float graph has no quantized weights)")
    if opset is not None and (isinstance(opset, bool) or not isinstance(opset, int)):
        raise TypeError(f"opset must be an int or None, got {opset!r}")
    if opset is not None and not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"opset must be in [{MIN_OPSET}, {MAX_OPSET}], got {opset}")
    if opset is not None and dynamo and opset < DYNAMO_MIN_OPSET:
        raise ValueError(f"dynamo=True exports opset {DYNAMO_MIN_OPSET} or higher, got opset={opset}; "
                         "use dynamo=False for a lower opset")
    try:
        import onnx  # noqa: F401
    except ImportError:  # pragma: no cover - optional dependency
        raise ImportError("export_onnx needs the onnx package: pip install quanta[onnx]") from None
    if dynamo and importlib.util.find_spec("onnxscript") is None:
        raise ImportError("export_onnx(dynamo=True) needs onnxscript (torch's torch.export-based exporter): "
                          "pip install quanta[onnx]")

    slots = quantizer_slots(sim)
    model = sim.model
    with eval_mode(model), stubs_in(slots):
        with torch.no_grad():
            result = model(*args, **keywords)  # records the shapes the quantizers see
        used = {k: s for k, s in slots.items() if s.stub.inputs}
        unused = [s.name for s in slots.values() if not s.stub.inputs]
        if unused:
            warnings.warn(f"export_onnx: the forward pass does not use quantizers {_shortlist(unused)}; "
                          "they are not in the ONNX graph", UserWarning, stacklevel=_stacklevel)
        missing = [s.name for s in used.values() if not s.quantizer.is_initialized()]
        if qdq and missing:
            raise RuntimeError(f"quantizers not initialised: {_shortlist(missing)}; run sim.compute_encodings() "
                               "(or load encodings) before exporting with qdq=True")
        for s in used.values():
            dtypes = {d for _, d in s.stub.inputs}
            if dtypes != {torch.float32}:
                raise NotImplementedError(f"{s.name} quantizes a {sorted(map(str, dtypes))} tensor; only float32 "
                                          "models can be exported (call sim.model.float() first)")
        plans = {s.name: block_scaled_weight_plan(s.name, s.quantizer, getattr(*s.param))
                 if s.param is not None and isinstance(s.quantizer, BlockScaledQuantizeDequantize)
                 else plan_for_calls(s.name, s.quantizer, s.stub.inputs) for s in used.values()} if qdq else {}
        target = choose_opset(plans, opset, dynamo, min_opset)
        if keywords:  # the graph inputs are the dict's tensors, in the order of the forward's parameters
            input_names = [k for k, v in keywords.items() if isinstance(v, torch.Tensor)]
            args = tuple(keywords[k] for k in input_names)
            traced: nn.Module = _Exported(model, input_names,
                                          {k: v for k, v in keywords.items() if not isinstance(v, torch.Tensor)})
        else:
            input_names, traced = _input_names(model, len(args)), model
        output_names = _output_names(result)
        proto = export_with_markers(traced, args, used, target, input_names, output_names, dynamo, scope_paths(model))

    tensors = replace_markers(proto, used, plans, qdq=qdq, prequantize=prequantize_weights)
    dropped = [s.name for s in used.values() if s.name not in tensors]
    if dropped:
        warnings.warn(f"export_onnx: the outputs of quantizers {_shortlist(dropped)} do not reach the model's "
                      "outputs; the exporter removed them", UserWarning, stacklevel=_stacklevel)
    renamed = finish(proto, target, input_names, output_names)
    tensors = {q: [renamed.get(t, t) for t in ts] for q, ts in tensors.items()}
    return OnnxExport(proto, tensors, [i.name for i in proto.graph.input], [o.name for o in proto.graph.output])


# ---------------------------------------------------------------------- graph inputs and outputs
class _Exported(nn.Module):
    """What the ONNX exporter traces: ``model`` called with the tensor inputs as positional arguments and the
    other keyword inputs (``use_cache=False``) fixed, returning the tensors of its output as a flat tuple
    (a ``ModelOutput`` holding a ``DynamicCache`` is not something the exporter takes)."""

    def __init__(self, model: nn.Module, names: list[str], fixed: dict[str, Any]) -> None:
        super().__init__()
        self.model, self.names, self.fixed = model, names, fixed

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # .forward, not __call__: the model is the graph's root, no scope ("/model/...") of its own
        return tuple(_flat_tensors(self.model.forward(**dict(zip(self.names, tensors)), **self.fixed)))


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
