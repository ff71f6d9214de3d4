"""Markers: the sim is exported with every quantizer swapped for a stub that computes the identity and leaves,
in the ONNX graph, a ``quanta_export::Marker`` node carrying the quantizer's name (so nothing depends on how the
exporter names or decomposes the ops around it); :mod:`quanta.export.onnx.rewrite` then replaces each marker.

A stub first records the shape and dtype of each tensor its quantizer sees, in one float forward pass; then
``torch.onnx.export`` runs with the stubs emitting markers (TorchScript exporter: an autograd function's
``symbolic``; torch.export-based one: a custom op and its onnxscript translation).

>>> import torch
>>> from torch import nn
>>> from quanta.quantsim import QuantizationSimModel
>>> sim = QuantizationSimModel(nn.Sequential(nn.Linear(4, 4)), torch.randn(2, 4))
>>> slots = quantizer_slots(sim)
>>> shown = [s for s in slots.values() if "input" not in s.name]  # (and the model input's, where quantized)
>>> [(s.name, s.tensor) for s in shown]
[('0.output_quantizers.0', '0.output.0'), ('0.param_quantizers.weight', '0.weight')]
>>> with stubs_in(slots):
...     _ = sim.model(torch.randn(3, 4))
>>> [s.stub.inputs for s in shown]
[[((3, 4), torch.float32)], [((4, 4), torch.float32)]]
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from quanta.export.protocol import QuantizedModelLike
from quanta.nn.base import QuantizationMixin
from quanta.quantization.base import QuantizerBase

__all__ = ["MARKER_DOMAIN", "MARKER_OP", "Slot", "Stub", "export_with_markers", "quantizer_slots", "scope_paths",
           "stubs_in"]

_TORCHSCRIPT_MAX_OPSET = 20  # the TorchScript exporter stops here; higher opsets go through onnx's version converter

MARKER_DOMAIN = "quanta_export"  # exists only between torch.onnx.export and the rewrite
MARKER_OP = "Marker"


class _Marker(torch.autograd.Function):
    """Identity that the TorchScript exporter writes as ``quanta_export::Marker(name=...)``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, name: str) -> torch.Tensor:  # type: ignore[override]
        return x.clone()

    @staticmethod
    def symbolic(g: Any, x: Any, name: str) -> Any:
        return g.op(f"{MARKER_DOMAIN}::{MARKER_OP}", x, name_s=name).setType(x.type())


_DYNAMO_OP: Any = None


def _dynamo_marker() -> tuple[Any, dict[Any, Any]]:
    """The marker as a torch custom op and its onnxscript translation, registered on first use."""
    global _DYNAMO_OP
    if _DYNAMO_OP is None:
        import onnx
        import onnxscript

        @torch.library.custom_op(f"{MARKER_DOMAIN}::marker", mutates_args=())
        def marker(x: torch.Tensor, name: str) -> torch.Tensor:
            return x.clone()

        @marker.register_fake
        def _(x: torch.Tensor, name: str) -> torch.Tensor:
            return torch.empty_like(x)

        schema = onnx.defs.OpSchema(
            MARKER_OP, MARKER_DOMAIN, 1,
            inputs=[onnx.defs.OpSchema.FormalParameter("x", "T")],
            outputs=[onnx.defs.OpSchema.FormalParameter("y", "T")],
            type_constraints=[("T", ["tensor(float)", "tensor(float16)", "tensor(bfloat16)", "tensor(double)"], "")],
            attributes=[onnx.defs.OpSchema.Attribute("name", onnx.defs.OpSchema.AttrType.STRING, "")],
        )
        op = onnxscript.values.Op(onnxscript.values.Opset(MARKER_DOMAIN, 1), MARKER_OP, schema)

        def translate(x: Any, name: str) -> Any:
            return op(x, name=name)

        _DYNAMO_OP = (torch.ops.quanta_export.marker, {torch.ops.quanta_export.marker.default: translate})
    return _DYNAMO_OP


class Stub(nn.Module):
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
class Slot:
    name: str  # as in sim.named_quantizers()
    quantizer: QuantizerBase
    stub: Stub
    tensor: str  # ONNX tensor name of the quantized value
    param: tuple[QuantizationMixin, str] | None  # (module, parameter name) for parameter quantizers
    places: list[tuple[nn.Module, str]] = field(default_factory=list)  # (parent, child key) holding it


_SLOT = re.compile(r"^(?:(?P<module>.*)\.)?(?P<kind>input_quantizers|output_quantizers|param_quantizers)"
                   r"\.(?P<key>[^.]+)$")


def quantizer_slots(sim: QuantizedModelLike) -> dict[int, Slot]:
    model = sim.model
    modules = dict(model.named_modules())
    slots: dict[int, Slot] = {}
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
        slots[id(q)] = Slot(name, q, Stub(name), tensor, param)
    for _, parent in model.named_modules(remove_duplicate=False):
        for key, child in parent._modules.items():
            if child is not None and id(child) in slots:
                slots[id(child)].places.append((parent, key))
    return slots


@contextlib.contextmanager
def stubs_in(slots: dict[int, Slot]) -> Iterator[None]:
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


def scope_paths(model: nn.Module) -> dict[nn.Module, str]:
    """The scope names ``torch.onnx`` (TorchScript) should give the modules a captured graph calls: their path,
    each numbered child joined to its container (``"layers.0.query"`` → ``"layers.0/query"``), so a tensor is
    named ``"/layers.0/query/Add_output_0"`` as when the original model calls ``layers.0`` and it calls its
    ``query`` (a ``ModuleList`` has no scope of its own; a ``Sequential`` has, in the original model:
    ``"/features/features.0/Conv_output_0"``, here ``"/features.0/Conv_output_0"``). Empty for a model that is
    not an ``fx.GraphModule``: its modules call each other, and the exporter's own scopes are the path.

    >>> from torch import fx
    >>> class Block(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.layers = nn.ModuleList([nn.Linear(2, 2)])
    ...     def forward(self, x):
    ...         return self.layers[0](x)
    >>> list(scope_paths(fx.symbolic_trace(Block())).values())
    ['layers.0']
    """
    from torch import fx

    if not isinstance(model, fx.GraphModule):
        return {}
    out: dict[nn.Module, str] = {}
    for node in model.graph.nodes:
        if node.op == "call_module":
            parts: list[str] = []
            for atom in str(node.target).split("."):
                if atom.isdecimal() and parts:
                    parts[-1] = f"{parts[-1]}.{atom}"
                else:
                    parts.append(atom)
            out[model.get_submodule(node.target)] = "/".join(parts)
    return out


@contextlib.contextmanager
def _scopes(paths: dict[nn.Module, str]) -> Iterator[None]:
    """Give the modules of ``paths`` those scope names in the TorchScript exporter's module map (torch's own
    names otherwise, and unchanged if this torch's exporter has no such map)."""
    try:
        from torch.onnx._internal.torchscript_exporter import utils as ts_utils

        original = ts_utils._setup_trace_module_map
        create = torch._C._jit_onnx_create_full_scope_name
    except (ImportError, AttributeError):  # pragma: no cover - another torch: the exporter's own names
        yield
        return

    def setup(model: Any, export_modules_as_functions: Any) -> Any:
        result = original(model, export_modules_as_functions)
        table = torch.jit._trace._trace_module_map
        if isinstance(table, dict):
            for module, path in paths.items():
                if module in table:
                    table[module] = create(torch.typename(type(module)), path)
        return result

    ts_utils._setup_trace_module_map = setup
    try:
        yield
    finally:
        ts_utils._setup_trace_module_map = original


def export_with_markers(model: nn.Module, args: tuple[torch.Tensor, ...], used: dict[int, Slot], target: int,
                        input_names: list[str], output_names: list[str], dynamo: bool,
                        scopes: dict[nn.Module, str] | None = None) -> Any:
    """``torch.onnx.export`` of ``model(*args)`` with the stubs of ``used`` emitting markers, as an opset-``target``
    ``onnx.ModelProto`` (converted up when the exporter stops below it); ``scopes``: see :func:`scope_paths`."""
    import onnx

    for s in used.values():
        s.stub.mode = "dynamo" if dynamo else "torchscript"
    with _quiet(), _scopes(scopes or {}):
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
