"""Which quantizer an ONNX tensor name means: the map that reads an encodings file keyed by ONNX tensor names
(AIMET's ``<prefix>.encodings``, or quanta's) back into a simulation.

The sim is exported in memory (the float graph, ``qdq=False``) with the names ``torch.onnx`` gives its
tensors, which are the names AIMET's export gives the same model's tensors. Graph inputs and outputs are
the exception: quanta names them after the forward's arguments and ``"output"``, AIMET leaves them to the
exporter (``"t.1"``, ``"25"``), so those are matched by position (:func:`file_io_names` reads them from the
``.onnx`` file written with the encodings).

>>> import torch
>>> from quanta.quantsim import QuantizationSimModel
>>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Flatten())
>>> sim = QuantizationSimModel(model, torch.randn(2, 4))
>>> m = tensor_map(sim, torch.randn(2, 4))
>>> m.quantized["0.weight"], m.quantized["/1/Relu_output_0"]
('0.param_quantizers.weight', '1.output_quantizers.0')
>>> m.inputs, m.outputs, m.output_sources, m.derived
(['input'], ['output'], {'output': '/1/Relu_output_0'}, {'output': '/1/Relu_output_0'})
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from quanta.export.protocol import QuantizedModelLike

__all__ = ["DATA_MOVEMENT_OPS", "Resolved", "TensorMap", "aimet_to_torch_name", "file_io_names", "resolve",
           "tensor_map"]

#: ops that move a tensor's values without changing them: AIMET repeats the input's encoding on their output
#: (``/Flatten_output_0``) where the sim has no quantizer
DATA_MOVEMENT_OPS = frozenset({"Identity", "Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Expand",
                               "Slice", "Split", "Gather", "Tile", "DepthToSpace", "SpaceToDepth", "MaxPool"})


@dataclass
class TensorMap:
    """The tensors of a sim's ONNX graph.

    Attributes:
        quantized: ONNX tensor name → quantizer name (as in ``sim.named_quantizers()``), every call.
        inputs, outputs: the graph's input and output names, in order.
        output_sources: graph output → the quantized tensor it carries (through data movement only).
        derived: tensors no quantizer quantizes that only move a quantized tensor's values
            (:data:`DATA_MOVEMENT_OPS`) → that quantized tensor.
        opset: the opset of the export.
    """

    quantized: dict[str, str]
    inputs: list[str]
    outputs: list[str]
    output_sources: dict[str, str] = field(default_factory=dict)
    derived: dict[str, str] = field(default_factory=dict)
    opset: int = 0


def tensor_map(sim: QuantizedModelLike, dummy_input: Any, *, opset: int | None = None) -> TensorMap:
    """Export ``sim`` (float graph, in memory) with ``dummy_input`` and map its tensor names to quantizers.

    ``opset`` (default: ``TORCH_DEFAULT_OPSET``, 20, what AIMET's export uses) decides how some ops are
    written (LayerNorm as one op or several) and so the names of their outputs: pass the opset of the file
    the names come from.
    """
    import warnings

    from quanta.export.onnx import export_onnx_model
    from quanta.export.onnx.plan import TORCH_DEFAULT_OPSET

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # unused quantizers: named where they matter
        exported = export_onnx_model(sim, dummy_input, qdq=False, opset=opset,
                                     min_opset=TORCH_DEFAULT_OPSET if opset is None else opset)
    quantized = {t: q for q, ts in exported.tensors.items() for t in ts}
    graph = exported.proto.graph
    source: dict[str, str] = {}  # tensor -> the quantized tensor whose values it carries
    for node in graph.node:  # topological order
        if node.op_type not in DATA_MOVEMENT_OPS or not node.input:
            continue
        x = node.input[0]
        origin = x if x in quantized else source.get(x)
        if origin is None:
            continue
        for y in node.output:
            if y and y not in quantized:
                source[y] = origin
    outputs = list(exported.outputs)
    sources = {o: (o if o in quantized else source[o]) for o in outputs if o in quantized or o in source}
    opset_used = next(o.version for o in exported.proto.opset_import if o.domain in ("", "ai.onnx"))
    return TensorMap(quantized, list(exported.inputs), outputs, sources, source, opset_used)


def file_io_names(path: str | os.PathLike) -> tuple[list[str], list[str], int] | None:
    """``(graph inputs, graph outputs, opset)`` of the ONNX file ``path``, or None if there is none (or onnx is
    not installed). Only the graph structure is read (no external weight data)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        return None
    try:
        import onnx
    except ImportError:  # pragma: no cover - optional dependency
        return None
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception:  # noqa: BLE001  (not an ONNX file: nothing to learn from it)
        return None
    initializers = {i.name for i in model.graph.initializer}
    inputs = [i.name for i in model.graph.input if i.name not in initializers]
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return inputs, [o.name for o in model.graph.output], opset


_AIMET_SPLIT = re.compile(r"#\d+(?:\.end)?(?=/)")
_DUP = re.compile(r"_dup_\d+$")
_COPY = re.compile(r"_\d+$")


def aimet_to_torch_name(name: str) -> str:
    """The ``torch.onnx`` name of a tensor AIMET's ``sim.export`` renamed: it names the nodes of a module that
    became several ONNX ops ``<module>``, ``<module>#1``, ..., the last ``<module>#<k>.end``, and their outputs
    after them.

    >>> aimet_to_torch_name("/qkv#1.end/Add_output_0")
    '/qkv/Add_output_0'
    """
    return _AIMET_SPLIT.sub("", name)


@dataclass
class Resolved:
    """What :func:`resolve` found for a file's names.

    Attributes:
        quantizers: file name → quantizer name.
        derived: names of tensors that only carry a quantized tensor's values (skipped).
        copies: names of converted copies of a weight (AIMET's ``sim.onnx.export`` stores a Linear's weight
            transposed for MatMul as ``"<module>.weight_0"``): the entry's axis is the copy's.
    """

    quantizers: dict[str, str] = field(default_factory=dict)
    derived: set[str] = field(default_factory=set)
    copies: set[str] = field(default_factory=set)


def resolve(names: list[str], tmap: TensorMap, file_io: tuple[list[str], list[str], int] | None) -> Resolved:
    """Which quantizer each of a file's ``names`` means, trying in turn: a name of ``tmap`` (the sim's own
    ONNX names); a graph input or output of the file's ONNX graph (``file_io``), by position; AIMET's renamed
    multi-op outputs (:func:`aimet_to_torch_name`); AIMET's ``"<tensor>_dup_<k>"`` (an Identity it inserts to
    give a quantizer its own copy of a tensor); ``"<weight>_<k>"``, a converted copy of a quantized weight."""
    io: dict[str, str] = {}  # the file's graph input/output name -> the sim's ONNX tensor name
    if file_io is not None:
        f_in, f_out, _ = file_io
        if len(f_in) == len(tmap.inputs):
            io.update(zip(f_in, tmap.inputs))
        if len(f_out) == len(tmap.outputs):
            io.update((f, tmap.output_sources.get(o, o)) for f, o in zip(f_out, tmap.outputs))
    initializers = {t for t, q in tmap.quantized.items() if ".param_quantizers." in q}
    out = Resolved()

    def tensor_of(name: str) -> str | None:
        for candidate in (name, io.get(name), aimet_to_torch_name(name)):
            if candidate is not None and (candidate in tmap.quantized or candidate in tmap.derived):
                return candidate
        return None

    for name in names:
        tensor = tensor_of(name)
        if tensor is None and _DUP.search(name):
            tensor = tensor_of(_DUP.sub("", name))
        if tensor is None and _COPY.search(name) and _COPY.sub("", name) in initializers:
            tensor = _COPY.sub("", name)
            out.copies.add(name)
        if tensor is None:
            continue
        if tensor in tmap.quantized:
            out.quantizers[name] = tmap.quantized[tensor]
        else:
            out.derived.add(name)
    return out
