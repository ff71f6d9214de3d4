"""Export: AIMET encodings files (:mod:`quanta.export.encodings`, keyed by tensor; the module-keyed
``_torch.encodings``, :mod:`quanta.export.torch_encodings`), a QuantizationSimModel's
encodings in them (:mod:`quanta.export.sim_encodings`), and ONNX with QuantizeLinear/DequantizeLinear
(:mod:`quanta.export.onnx`; onnx itself is imported only when exporting)."""

from quanta.export.encodings import (
    EncodingDtype,
    EncodingsFile,
    EncodingsVersion,
    FileEncoding,
    Granularity,
    KeyedBy,
    LowPowerBlocks,
    OffsetOrigin,
    encodings_from_dict,
    encodings_to_dict,
    read_encodings,
    write_encodings,
)
from quanta.export.onnx import export_onnx
from quanta.export.sim_encodings import (
    apply_encodings,
    export_encodings,
    export_torch_encodings,
    sim_encodings,
    tensor_names,
)

__all__ = [
    "EncodingDtype",
    "EncodingsFile",
    "EncodingsVersion",
    "FileEncoding",
    "Granularity",
    "KeyedBy",
    "LowPowerBlocks",
    "OffsetOrigin",
    "apply_encodings",
    "encodings_from_dict",
    "encodings_to_dict",
    "export_encodings",
    "export_torch_encodings",
    "export_onnx",
    "read_encodings",
    "sim_encodings",
    "tensor_names",
    "write_encodings",
]
