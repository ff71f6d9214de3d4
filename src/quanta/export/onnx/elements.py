"""ONNX element types for quantized values, and initializers that hold a tensor in one of them exactly.

An integer grid gets the smallest type that holds it (:func:`int_type_for`); 4-bit values are packed two per
byte, the first in the low nibble.

>>> from quanta.grids.affine import IntegerGrid
>>> [int_type_for(IntegerGrid(lo, hi)).name for lo, hi in [(-8, 7), (0, 255), (-127, 127), (0, 2**16 - 1)]]
['int4', 'uint8', 'int8', 'uint16']
>>> t = tensor_proto("w", torch.tensor([1, -2, 3]), int_type_for(IntegerGrid(-8, 7)).proto)
>>> list(t.dims), t.raw_data.hex()
([3], 'e103')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from quanta.grids.affine import IntegerGrid

__all__ = ["IntType", "float16_types", "float8_types", "int_type_for", "int_types", "tensor_proto"]


@dataclass(frozen=True)
class IntType:
    name: str
    proto: int  # onnx.TensorProto data type
    qmin: int
    qmax: int
    opset: int  # lowest opset whose QuantizeLinear/DequantizeLinear take it
    numpy: str | None  # numpy dtype of the raw data (None: 4-bit, packed two per byte)


def int_types() -> list[IntType]:
    from onnx import TensorProto as T

    return [  # smallest first: a grid gets the first type that holds it
        IntType("int4", T.INT4, -8, 7, 21, None),
        IntType("uint4", T.UINT4, 0, 15, 21, None),
        IntType("int8", T.INT8, -128, 127, 13, "<i1"),
        IntType("uint8", T.UINT8, 0, 255, 13, "<u1"),
        IntType("int16", T.INT16, -(2**15), 2**15 - 1, 21, "<i2"),
        IntType("uint16", T.UINT16, 0, 2**16 - 1, 21, "<u2"),
    ]


def float8_types() -> dict[torch.dtype, int]:
    from onnx import TensorProto as T

    return {
        torch.float8_e4m3fn: T.FLOAT8E4M3FN,
        torch.float8_e5m2: T.FLOAT8E5M2,
        torch.float8_e4m3fnuz: T.FLOAT8E4M3FNUZ,
        torch.float8_e5m2fnuz: T.FLOAT8E5M2FNUZ,
    }


def float16_types() -> dict[torch.dtype, int]:
    from onnx import TensorProto as T

    return {torch.float16: T.FLOAT16, torch.bfloat16: T.BFLOAT16}


def int_type_for(grid: IntegerGrid) -> IntType | None:
    signed = grid.qmin < 0
    for t in int_types():
        if (t.qmin < 0) == signed and t.qmin <= grid.qmin and grid.qmax <= t.qmax:
            return t
    return None


def tensor_proto(name: str, values: torch.Tensor, proto: int) -> Any:
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
    elif proto == getattr(TensorProto, "FLOAT4E2M1", None):  # fp4 e2m1 values: their S|E|M codes, packed
        from quanta.grids.float import FP4_E2M1
        from quanta.kernels.fpx_codes import encode

        codes = encode(values.to(torch.float32).reshape(-1), FP4_E2M1).numpy().astype(np.uint8)
        if codes.size % 2:
            codes = np.append(codes, np.uint8(0))
        t.raw_data = (codes[0::2] | (codes[1::2] << 4)).astype(np.uint8).tobytes()
    elif proto in float8_types().values() or proto in (TensorProto.FLOAT16, TensorProto.BFLOAT16):
        dtype = {v: k for k, v in {**float8_types(), **float16_types()}.items()}[proto]
        raw = values.to(dtype).contiguous()
        t.raw_data = raw.view(torch.uint8 if raw.element_size() == 1 else torch.int16).numpy().astype(
            "<u1" if raw.element_size() == 1 else "<i2").tobytes()
    else:
        numpy_dtype = next(it.numpy for it in int_types() if it.proto == proto)
        t.raw_data = values.to(torch.int64).numpy().astype(numpy_dtype).tobytes()
    return t
