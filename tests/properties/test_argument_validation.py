"""Bad arguments to every public function and constructor of the three dialects.

Each case is one test: it asserts the exception *type* (``TypeError`` for a wrong kind of
value, ``ValueError`` for a wrong value) and that the message names the offending argument,
so the user knows what to fix. A few inputs look suspicious but are valid and documented;
they are at the end (``ACCEPTED``), checked against their documented results.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import quanta.quantization.affine as A
from quanta.dtypes import (
    AffineQuantizedTensor,
    Float8Layout,
    FloatxTensorCoreLayout,
    PlainLayout,
    UintxLayout,
    to_affine_quantized_floatx,
    to_affine_quantized_floatx_static,
    to_affine_quantized_fpx,
    to_affine_quantized_intx,
    to_affine_quantized_intx_static,
)
from quanta.quantization import quant_primitives as P
from quanta.quantization.encoding_analyzer import MinMaxEncodingAnalyzer
from quanta.quantization.float import FloatQuantizeDequantize
from quanta.quantization.quant_primitives import MappingType, ZeroPointDomain
from quanta.tensor_quant import (
    FakeTensorQuantFunction,
    QuantDescriptor,
    TensorQuantFunction,
    TensorQuantizer,
    fake_tensor_quant,
    tensor_quant,
)

NAN, INF = math.nan, math.inf
X = torch.linspace(-2, 2, 32).reshape(4, 8)
S, O = torch.tensor(0.1), torch.tensor(0.0)
SC, ZP = torch.full((4,), 0.1), torch.zeros(4, dtype=torch.int32)  # torchao: per row of X
B = (1, 8)
CODES = torch.zeros(4, 8, dtype=torch.int8)
META = torch.device("meta")


def _init(q):
    q.set_range(-1.0, 1.0)
    return q


def _qdq_module(**kw):
    return _init(A.QuantizeDequantize((), 8, **kw))


CASES: list[tuple[str, object, type, str]] = []


def case(id_: str, exc: type, arg: str):
    """Register ``fn`` as a case: calling it raises ``exc`` with ``arg`` in the message."""
    def register(fn):
        CASES.append((id_, fn, exc, arg))
        return fn
    return register


def cases(id_: str, exc: type, arg: str, fns: dict):
    for name, fn in fns.items():
        CASES.append((f"{id_}/{name}", fn, exc, arg))


# ============================================================================== AIMET functional
QDQ, QQ, DQ = A.quantize_dequantize, A.quantize, A.dequantize
cases("aimet/integer input", TypeError, "tensor", {
    "quantize_dequantize": lambda: QDQ(torch.arange(8), S, O, 8),
    "quantize": lambda: QQ(torch.arange(8), S, O, 8),
})
cases("aimet/bool codes", TypeError, "tensor", {"dequantize": lambda: DQ(torch.tensor([True]), S, O)})
cases("aimet/scale of wrong shape", ValueError, "scale", {
    "quantize_dequantize": lambda: QDQ(X, torch.full((3,), 0.1), O, 8),
    "quantize": lambda: QQ(X, torch.full((4,), 0.1), torch.zeros(4), 8),
    "dequantize": lambda: DQ(X, torch.full((3, 1), 0.1), O),
})
for bad in (0.0, -0.0, -1.0, NAN, INF):
    cases(f"aimet/scale {bad}", ValueError, "scale", {
        "quantize_dequantize": lambda b=bad: QDQ(X, torch.tensor(b), O, 8),
        "quantize": lambda b=bad: QQ(X, torch.tensor(b), O, 8),
        "dequantize": lambda b=bad: DQ(X, torch.tensor(b), O),
        "python number": lambda b=bad: QDQ(X, b, 0.0, 8),
        "one bad channel": lambda b=bad: QDQ(X, torch.tensor([[0.1], [b], [0.1], [0.1]]), torch.zeros(4, 1), 8),
    })
for bad in (NAN, INF, -INF):
    cases(f"aimet/offset {bad}", ValueError, "offset", {
        "quantize_dequantize": lambda b=bad: QDQ(X, S, torch.tensor(b), 8),
        "quantize": lambda b=bad: QQ(X, S, torch.tensor(b), 8),
        "dequantize": lambda b=bad: DQ(X, S, torch.tensor(b)),
    })
cases("aimet/offset of wrong shape", ValueError, "offset", {
    "quantize_dequantize": lambda: QDQ(X, torch.full((4, 1), 0.1), torch.zeros(3), 8),
})
cases("aimet/qmin >= qmax", ValueError, "qmin", {
    "equal": lambda: QDQ(X, S, O, qmin=5, qmax=5),
    "greater": lambda: QQ(X, S, O, qmin=7, qmax=-8),
})
cases("aimet/qmin not an int", TypeError, "qmin", {
    "float": lambda: QDQ(X, S, O, qmin=0.5, qmax=7), "bool": lambda: QDQ(X, S, O, qmin=False, qmax=7),
})
cases("aimet/qmin without qmax", TypeError, "qmax", {"quantize": lambda: QQ(X, S, O, qmin=0)})
for bw, exc in ((0, ValueError), (33, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError),
                ("8", TypeError), (np.float32(8), TypeError)):
    cases(f"aimet/bitwidth {bw!r}", exc, "bitwidth", {
        "positional": lambda b=bw: QDQ(X, S, O, b),
        "keyword": lambda b=bw: QQ(X, S, O, bitwidth=b),
    })
cases("aimet/num_steps", ValueError, "num_steps", {"0": lambda: QDQ(X, S, O, num_steps=0)})
cases("aimet/num_steps not an int", TypeError, "num_steps", {"1.5": lambda: QDQ(X, S, O, num_steps=1.5)})
cases("aimet/signed not a bool", TypeError, "signed", {"1": lambda: QDQ(X, S, O, 8, 1)})
cases("aimet/two grids", TypeError, "bitwidth", {"bitwidth+qmin": lambda: QDQ(X, S, O, 8, qmin=0, qmax=3)})
cases("aimet/block_size does not divide", ValueError, "block_size", {
    "quantize_dequantize": lambda: QDQ(X, torch.full((4, 3), 0.1), torch.zeros(4, 3), 8, block_size=(1, 3)),
    "wildcard": lambda: QQ(X, torch.full((4, 3), 0.1), torch.zeros(4, 3), 8, block_size=(-1, -1)),
    "dequantize": lambda: DQ(X, torch.full((4, 3), 0.1), torch.zeros(4, 3), (1, 3)),
    "wrong length": lambda: QDQ(X, torch.full((4, 2), 0.1), torch.zeros(4, 2), 8, block_size=(4,)),
})
cases("aimet/block_size entries", ValueError, "block_size", {
    "0": lambda: QDQ(X, torch.full((4, 2), 0.1), torch.zeros(4, 2), 8, block_size=(1, 0)),
    "-2": lambda: QDQ(X, torch.full((4, 2), 0.1), torch.zeros(4, 2), 8, block_size=(1, -2)),
})
cases("aimet/block_size type", TypeError, "block_size", {
    "int": lambda: QDQ(X, torch.full((4, 2), 0.1), torch.zeros(4, 2), 8, block_size=4),
    "float entries": lambda: QDQ(X, torch.full((4, 2), 0.1), torch.zeros(4, 2), 8, block_size=(1, 4.0)),
})
cases("aimet/non-tensor input", TypeError, "tensor", {
    "list": lambda: QDQ(X.tolist(), S, O, 8),
    "numpy": lambda: QQ(X.numpy(), S, O, 8),
    "dequantize numpy": lambda: DQ(CODES.numpy(), S, O),
})
cases("aimet/non-tensor scale", TypeError, "scale", {
    "list": lambda: QDQ(X, [0.1], O, 8), "numpy array": lambda: QQ(X, np.array(0.1), O, 8),
    "numpy scalar": lambda: QDQ(X, np.float32(0.1), O, 8), "complex": lambda: QDQ(X, torch.tensor(0.1j), O, 8),
})
cases("aimet/non-tensor offset", TypeError, "offset", {
    "list": lambda: QDQ(X, S, [0.0], 8), "numpy": lambda: DQ(X, S, np.zeros(())),
})
cases("aimet/device mix", ValueError, "scale", {
    "meta scale": lambda: QDQ(X, S.to(META), O, 8),
    "meta input": lambda: QQ(X.to(META), S, O, 8),
    "dequantize": lambda: DQ(X, S.to(META), O),
})
cases("aimet/device mix offset", ValueError, "offset", {"meta offset": lambda: QDQ(X, S, O.to(META), 8)})
cases("aimet/out", ValueError, "out", {"wrong shape": lambda: QDQ(X, S, O, 8, out=torch.empty(3))})
cases("aimet/out type", TypeError, "out", {"list": lambda: QDQ(X, S, O, 8, out=[0.0])})
cases("aimet/unknown keyword", TypeError, "bitwdith", {"typo": lambda: QDQ(X, S, O, bitwdith=8)})

# ============================================================================== AIMET modules
MODULES = {"Quantize": A.Quantize, "QuantizeDequantize": A.QuantizeDequantize}
for mname, M in MODULES.items():
    for bw, exc in ((0, ValueError), (33, ValueError), (1.5, TypeError), (True, TypeError)):
        cases(f"{mname}/bitwidth {bw!r}", exc, "bitwidth", {"": lambda M=M, b=bw: M((), b)})
    cases(f"{mname}/qmin >= qmax", ValueError, "qmin", {"": lambda M=M: M((), qmin=3, qmax=3)})
    cases(f"{mname}/bitwidth and qmin", TypeError, "bitwidth", {"": lambda M=M: M((), 8, qmin=0, qmax=3)})
    cases(f"{mname}/no grid", TypeError, "bitwidth", {"": lambda M=M: M(())})
    cases(f"{mname}/symmetric", TypeError, "symmetric", {"": lambda M=M: M((), 8, symmetric=1)})
    cases(f"{mname}/shape", ValueError, "shape", {"negative": lambda M=M: M((-1,), 8)})
    cases(f"{mname}/shape type", TypeError, "shape", {"str": lambda M=M: M("a", 8)})
    cases(f"{mname}/block_size length", ValueError, "block_size", {"": lambda M=M: M((4,), 8, block_size=(1, 2))})
    cases(f"{mname}/block_size 0", ValueError, "block_size", {"": lambda M=M: M((4,), 8, block_size=(0,))})
    cases(f"{mname}/block_size does not divide", ValueError, "block_size", {
        "": lambda M=M: _init(M((4, 3), 8, block_size=(1, 3)))(X)})
    cases(f"{mname}/encoding_analyzer", TypeError, "encoding_analyzer", {
        "str": lambda M=M: M((), 8, encoding_analyzer="minmax")})
    cases(f"{mname}/encoding_analyzer shape", ValueError, "encoding_analyzer", {
        "": lambda M=M: M((4,), 8, encoding_analyzer=MinMaxEncodingAnalyzer((3,)))})
    cases(f"{mname}/integer input", TypeError, "input", {"": lambda M=M: _init(M((), 8))(torch.arange(4))})
    cases(f"{mname}/non-tensor input", TypeError, "input", {
        "list": lambda M=M: _init(M((), 8))([1.0]), "numpy": lambda M=M: _init(M((), 8))(np.ones(3))})
    cases(f"{mname}/device mix", ValueError, "input", {"meta input": lambda M=M: _init(M((), 8))(X.to(META))})
    cases(f"{mname}/set_range", ValueError, "min", {
        "NaN": lambda M=M: M((), 8).set_range(NAN, 1.0), "min > max": lambda M=M: M((), 8).set_range(1.0, 0.0),
        "shape": lambda M=M: M((4,), 8).set_range(torch.zeros(3), torch.ones(3))})
    cases(f"{mname}/set_encodings", TypeError, "encoding", {"dict": lambda M=M: M((), 8).set_encodings({})})

# ============================================================================== float formats
F = FloatQuantizeDequantize
for name, val, exc in (("0", 0, ValueError), ("9", 9, ValueError), ("1.5", 1.5, TypeError),
                       ("True", True, TypeError)):
    cases(f"float/exponent_bits {name}", exc, "exponent_bits", {"": lambda v=val: F(v, 3)})
for name, val, exc in (("24", 24, ValueError), ("-1", -1, ValueError), ("2.0", 2.0, TypeError)):
    cases(f"float/mantissa_bits {name}", exc, "mantissa_bits", {"": lambda v=val: F(4, v)})
cases("float/finite not a bool", TypeError, "finite", {"1": lambda: F(4, 3, finite=1)})
cases("float/unsigned_zero not a bool", TypeError, "unsigned_zero", {"str": lambda: F(4, 3, True, "yes")})
cases("float/unsigned_zero without finite", ValueError, "unsigned_zero", {"": lambda: F(4, 3, unsigned_zero=True)})
cases("float/dtype", ValueError, "dtype", {"int8": lambda: F(dtype=torch.int8),
                                          "float32": lambda: F(dtype=torch.float32)})
cases("float/dtype and bits", TypeError, "dtype", {"": lambda: F(4, 3, dtype=torch.float8_e4m3fn)})
cases("float/no format", TypeError, "exponent_bits", {"": lambda: F()})
cases("float/shape", TypeError, "shape", {"str": lambda: F(4, 3, shape="a")})
cases("float/block_size length", ValueError, "block_size", {"": lambda: F(4, 3, shape=(4,), block_size=(1, 2))})
cases("float/block_size does not divide", ValueError, "block_size", {
    "": lambda: F(4, 3, shape=(4, 3), block_size=(1, 3))(X)})
cases("float/integer input", TypeError, "input", {"": lambda: F(4, 3)(torch.arange(3))})
cases("float/non-tensor input", TypeError, "input", {"list": lambda: F(4, 3)([1.0]),
                                                     "numpy": lambda: F(4, 3)(np.ones(3, dtype=np.float32))})
cases("float/device mix", ValueError, "input", {"meta input": lambda: F(4, 3)(X.to(META))})
cases("float/set_range", ValueError, "maxval", {
    "0": lambda: F(4, 3).set_range(0.0), "-1": lambda: F(4, 3).set_range(-1.0),
    "NaN": lambda: F(4, 3).set_range(NAN), "inf": lambda: F(4, 3).set_range(INF),
    "shape": lambda: F(4, 3).set_range([1.0, 2.0])})

# ============================================================================== torchao primitives
QA, DQA, FQA, FQAM = P.quantize_affine, P.dequantize_affine, P.fake_quantize_affine, P.fake_quantize_affine_cachemask
CQ = P.choose_qparams_affine
cases("torchao/integer input", TypeError, "input", {
    "quantize_affine": lambda: QA(torch.arange(32).reshape(4, 8), B, SC, ZP, torch.int8),
    "fake_quantize_affine": lambda: FQA(torch.arange(32).reshape(4, 8), B, SC, ZP, torch.int8),
    "choose_qparams_affine": lambda: CQ(torch.arange(32).reshape(4, 8), MappingType.SYMMETRIC, B, torch.int8),
})
cases("torchao/codes of another dtype", ValueError, "input", {
    "dequantize_affine": lambda: DQA(CODES, B, SC, ZP, torch.uint8)})
cases("torchao/scale of wrong shape", ValueError, "scale", {
    "quantize_affine": lambda: QA(X, B, torch.ones(3), ZP, torch.int8),
    "dequantize_affine": lambda: DQA(CODES, B, torch.ones(3), ZP, torch.int8),
    "fake_quantize_affine": lambda: FQA(X, B, torch.ones(5), ZP, torch.int8),
    "fake_quantize_affine_cachemask": lambda: FQAM(X, B, torch.ones(2, 4), ZP, torch.int8),
})
cases("torchao/zero_point of wrong shape", ValueError, "zero_point", {
    "quantize_affine": lambda: QA(X, B, SC, torch.zeros(3), torch.int8),
    "dequantize_affine": lambda: DQA(CODES, B, SC, torch.zeros(5), torch.int8),
})
for bad in (0.0, -1.0, NAN, INF):
    cases(f"torchao/scale {bad}", ValueError, "scale", {
        "quantize_affine": lambda b=bad: QA(X, B, torch.tensor([0.1, b, 0.1, 0.1]), ZP, torch.int8),
        "dequantize_affine": lambda b=bad: DQA(CODES, B, torch.full((4,), b), ZP, torch.int8),
        "fake_quantize_affine": lambda b=bad: FQA(X, B, torch.full((4,), b), ZP, torch.int8),
        "fake_quantize_affine_cachemask": lambda b=bad: FQAM(X, B, torch.full((4,), b), ZP, torch.int8),
        "from_hp_to_intx_static": lambda b=bad: to_affine_quantized_intx_static(X, torch.full((4,), b), ZP, B,
                                                                               torch.int8),
    })
for bad in (NAN, INF):
    cases(f"torchao/zero_point {bad}", ValueError, "zero_point", {
        "quantize_affine": lambda b=bad: QA(X, B, SC, torch.full((4,), b), torch.int8),
        "fake_quantize_affine": lambda b=bad: FQA(X, B, SC, torch.full((4,), b), torch.int8),
        "FLOAT domain": lambda b=bad: DQA(CODES, B, SC, torch.full((4,), b), torch.int8,
                                          zero_point_domain=ZeroPointDomain.FLOAT),
    })
cases("torchao/quant_min >= quant_max", ValueError, "quant_min", {
    "quantize_affine": lambda: QA(X, B, SC, ZP, torch.int8, 5, 5),
    "dequantize_affine": lambda: DQA(CODES, B, SC, ZP, torch.int8, 7, -8),
    "fake_quantize_affine": lambda: FQA(X, B, SC, ZP, torch.int8, 3, 2),
    "choose_qparams_affine": lambda: CQ(X, MappingType.ASYMMETRIC, B, torch.int8, 3, 3),
    "from_hp_to_intx": lambda: to_affine_quantized_intx(X, MappingType.SYMMETRIC, B, torch.int8, 4, 4),
})
cases("torchao/quant_min outside the dtype", ValueError, "quant_min", {
    "quantize_affine": lambda: QA(X, B, SC, ZP, torch.int8, -200, 127)})
cases("torchao/quant_max outside the dtype", ValueError, "quant_max", {
    "quantize_affine": lambda: QA(X, B, SC, ZP, torch.uint4, 0, 16)})
cases("torchao/quant_min type", TypeError, "quant_min", {
    "1.5": lambda: QA(X, B, SC, ZP, torch.int8, 1.5, 5), "True": lambda: FQA(X, B, SC, ZP, torch.int8, True, 5)})
cases("torchao/dtype argument", ValueError, "output_dtype", {
    "quantize_affine float32": lambda: QA(X, B, SC, ZP, torch.float32),
    "quantize_affine float8": lambda: QA(X, B, SC, ZP, torch.float8_e4m3fn)})
cases("torchao/target_dtype", ValueError, "target_dtype", {
    "choose_qparams_affine": lambda: CQ(X, MappingType.SYMMETRIC, B, torch.float32),
    "from_hp_to_intx": lambda: to_affine_quantized_intx(X, MappingType.SYMMETRIC, B, torch.float16)})
cases("torchao/input_dtype", ValueError, "input_dtype", {
    "dequantize_affine": lambda: DQA(CODES, B, SC, ZP, torch.bool)})
cases("torchao/quant_dtype", ValueError, "quant_dtype", {"fake_quantize_affine": lambda: FQA(X, B, SC, ZP, "int8")})
cases("torchao/dequantize output_dtype", ValueError, "output_dtype", {
    "int32": lambda: DQA(CODES, B, SC, ZP, torch.int8, output_dtype=torch.int32)})
cases("torchao/block_size does not divide", ValueError, "block_size", {
    "quantize_affine": lambda: QA(X, (1, 3), SC, ZP, torch.int8),
    "dequantize_affine": lambda: DQA(CODES, (3, 8), SC, ZP, torch.int8),
    "fake_quantize_affine": lambda: FQA(X, (1, 5), SC, ZP, torch.int8),
    "choose_qparams_affine": lambda: CQ(X, MappingType.SYMMETRIC, (1, 3), torch.int8),
    "choose_qparams_affine_float8": lambda: P.choose_qparams_affine_float8(X, (1, 3)),
    "from_hp_to_intx": lambda: to_affine_quantized_intx(X, MappingType.SYMMETRIC, (1, 3), torch.int8),
    "from_hp_to_intx_static": lambda: to_affine_quantized_intx_static(X, SC, ZP, (3, 8), torch.int8),
    "from_hp_to_floatx": lambda: to_affine_quantized_floatx(X, (1, 3), torch.float8_e4m3fn),
    "from_hp_to_floatx_static": lambda: to_affine_quantized_floatx_static(X, torch.ones(4, 1), (1, 3),
                                                                          torch.float8_e4m3fn),
    "wrong length": lambda: QA(X, (8,), SC, ZP, torch.int8),
    "zero entry": lambda: to_affine_quantized_intx(X, MappingType.SYMMETRIC, (1, 0), torch.int8),
})
cases("torchao/block_size type", TypeError, "block_size", {
    "float entry": lambda: QA(X, (1, 8.0), SC, ZP, torch.int8),
    "int": lambda: CQ(X, MappingType.SYMMETRIC, 8, torch.int8),
    "from_hp_to_intx str": lambda: to_affine_quantized_intx(X, MappingType.SYMMETRIC, "18", torch.int8)})
cases("torchao/non-tensor input", TypeError, "input", {
    "quantize_affine list": lambda: QA(X.tolist(), B, SC, ZP, torch.int8),
    "quantize_affine numpy": lambda: QA(X.numpy(), B, SC, ZP, torch.int8),
    "dequantize_affine list": lambda: DQA(CODES.tolist(), B, SC, ZP, torch.int8),
    "fake_quantize_affine numpy": lambda: FQA(X.numpy(), B, SC, ZP, torch.int8),
    "choose_qparams_affine list": lambda: CQ(X.tolist(), MappingType.SYMMETRIC, B, torch.int8),
})
cases("torchao/non-tensor min_val", TypeError, "min_val", {
    "choose_qparams_affine_with_min_max": lambda: P.choose_qparams_affine_with_min_max(
        [0.0], torch.ones(1), MappingType.SYMMETRIC, (1,), torch.int8)})
cases("torchao/non-tensor scale", TypeError, "scale", {
    "list": lambda: QA(X, B, [0.1] * 4, ZP, torch.int8), "numpy": lambda: DQA(CODES, B, np.ones(4), ZP, torch.int8),
    "integer tensor": lambda: FQA(X, B, torch.ones(4, dtype=torch.int32), ZP, torch.int8)})
cases("torchao/non-tensor zero_point", TypeError, "zero_point", {"list": lambda: QA(X, B, SC, [0] * 4, torch.int8)})
cases("torchao/mapping_type", TypeError, "mapping_type", {
    "str": lambda: CQ(X, "symmetric", B, torch.int8),
    "from_hp_to_intx": lambda: to_affine_quantized_intx(X, 1, B, torch.int8)})
cases("torchao/zero_point_domain", ValueError, "zero_point_domain", {
    "None": lambda: CQ(X, MappingType.SYMMETRIC, B, torch.int8, zero_point_domain=None)})
cases("torchao/zero_point_domain type", TypeError, "zero_point_domain", {
    "str": lambda: QA(X, B, SC, ZP, torch.int8, zero_point_domain="INT")})
cases("torchao/eps", ValueError, "eps", {"-1": lambda: CQ(X, MappingType.SYMMETRIC, B, torch.int8, eps=-1.0),
                                         "NaN": lambda: CQ(X, MappingType.SYMMETRIC, B, torch.int8, eps=NAN)})
cases("torchao/scale_dtype", ValueError, "scale_dtype", {
    "int": lambda: CQ(X, MappingType.SYMMETRIC, B, torch.int8, scale_dtype=torch.int32)})
cases("torchao/min_val > max_val", ValueError, "min_val", {
    "": lambda: P.choose_qparams_affine_with_min_max(torch.ones(2), torch.zeros(2), MappingType.ASYMMETRIC, (1,),
                                                     torch.int8)})
cases("torchao/device mix", ValueError, "scale", {
    "quantize_affine": lambda: QA(X, B, SC.to(META), ZP, torch.int8),
    "dequantize_affine": lambda: DQA(CODES, B, SC.to(META), ZP, torch.int8),
    "fake_quantize_affine": lambda: FQA(X, B, SC.to(META), ZP, torch.int8),
    "quantize_affine_float8": lambda: P.quantize_affine_float8(X, torch.ones((), device=META)),
    "dequantize_affine_float8": lambda: P.dequantize_affine_float8(X.to(torch.float8_e4m3fn),
                                                                    torch.ones(4, 1, device=META)),
    "quantize_affine_fpx": lambda: P.quantize_affine_fpx(X, torch.ones(4, device=META), 3, 2),
    "from_hp_to_intx_static": lambda: to_affine_quantized_intx_static(X, SC.to(META), ZP, B, torch.int8),
})
cases("torchao/device mix zero_point", ValueError, "zero_point", {
    "quantize_affine": lambda: QA(X, B, SC, ZP.to(META), torch.int8),
    "dequantize_affine": lambda: DQA(CODES, B, SC, ZP.to(META), torch.int8)})
# float8
cases("torchao/float8 integer input", TypeError, "tensor", {
    "quantize_affine_float8": lambda: P.quantize_affine_float8(torch.arange(3), torch.tensor(1.0)),
    "choose_qparams_affine_float8": lambda: P.choose_qparams_affine_float8(torch.arange(4).reshape(1, 4), (1, 4)),
    "dequantize_affine_float8": lambda: P.dequantize_affine_float8(torch.arange(3), torch.tensor(1.0))})
cases("torchao/float8 non-tensor", TypeError, "tensor", {
    "list": lambda: P.quantize_affine_float8([1.0], torch.tensor(1.0)),
    "numpy": lambda: P.choose_qparams_affine_float8(X.numpy(), B)})
cases("torchao/float8 non-tensor scale", TypeError, "scale", {
    "list": lambda: P.quantize_affine_float8(X, [1.0]), "numpy": lambda: P.quantize_affine_float8(X, np.ones(1))})
cases("torchao/float8 scale of wrong shape", ValueError, "scale", {
    "quantize": lambda: P.quantize_affine_float8(X, torch.ones(3, 1)),
    "dequantize": lambda: P.dequantize_affine_float8(X.to(torch.float8_e4m3fn), torch.ones(3))})
for bad in (-1.0, NAN, INF):
    cases(f"torchao/float8 scale {bad}", ValueError, "scale", {
        "quantize": lambda b=bad: P.quantize_affine_float8(X, torch.tensor(b)),
        "dequantize": lambda b=bad: P.dequantize_affine_float8(X.to(torch.float8_e4m3fn), torch.tensor(b)),
        "from_hp_to_floatx_static": lambda b=bad: to_affine_quantized_floatx_static(
            X, torch.full((4, 1), b), B, torch.float8_e4m3fn)})
cases("torchao/float8_dtype", ValueError, "float8_dtype", {
    "quantize": lambda: P.quantize_affine_float8(X, torch.tensor(1.0), torch.int8),
    "choose": lambda: P.choose_qparams_affine_float8(X, B, torch.float16)})
cases("torchao/floatx target_dtype", ValueError, "target_dtype", {
    "from_hp_to_floatx": lambda: to_affine_quantized_floatx(X, B, torch.int8)})
# fpx
for bad in (0.0, -1.0, NAN, INF):
    cases(f"torchao/fpx scale {bad}", ValueError, "scale", {
        "quantize_affine_fpx": lambda b=bad: P.quantize_affine_fpx(X, torch.full((4,), b), 3, 2),
        "dequantize_affine_fpx": lambda b=bad: P.dequantize_affine_fpx(torch.zeros(4, 8, dtype=torch.uint8),
                                                                      torch.full((4,), b), 3, 2)})
cases("torchao/fpx scale count", ValueError, "scale", {
    "quantize_affine_fpx": lambda: P.quantize_affine_fpx(X, torch.ones(3), 3, 2)})
for name, e, m, exc in (("ebits 0", 0, 2, ValueError), ("ebits 1.5", 1.5, 2, TypeError),
                        ("ebits True", True, 2, TypeError), ("too wide", 9, 2, ValueError)):
    cases(f"torchao/fpx {name}", exc, "ebits", {
        "float_to_fpx": lambda e=e, m=m: P.float_to_fpx(X, e, m),
        "quantize_affine_fpx": lambda e=e, m=m: P.quantize_affine_fpx(X, torch.ones(4), e, m),
        "FloatxTensorCoreLayout": lambda e=e, m=m: FloatxTensorCoreLayout(e, m)})
cases("torchao/fpx mbits", TypeError, "mbits", {"float_to_fpx": lambda: P.float_to_fpx(X, 3, 2.0)})
cases("torchao/fpx non-tensor", TypeError, "tensor", {
    "quantize_affine_fpx": lambda: P.quantize_affine_fpx(X.tolist(), torch.ones(4), 3, 2),
    "choose_qparams_affine_fpx": lambda: P.choose_qparams_affine_fpx(X.numpy(), 3, 2),
    "dequantize_affine_fpx": lambda: P.dequantize_affine_fpx([[1]], torch.ones(1), 3, 2)})
cases("torchao/fpx codes out of range", ValueError, "codes", {
    "fpx_to_float": lambda: P.fpx_to_float(torch.full((2,), 255, dtype=torch.uint8), 3, 2)})
# AffineQuantizedTensor
cases("aqt/input_float", TypeError, "input_float", {
    "from_hp_to_intx int": lambda: to_affine_quantized_intx(torch.arange(32).reshape(4, 8), MappingType.SYMMETRIC,
                                                            B, torch.int8),
    "from_hp_to_intx list": lambda: to_affine_quantized_intx(X.tolist(), MappingType.SYMMETRIC, B, torch.int8),
    "from_hp_to_intx numpy": lambda: to_affine_quantized_intx(X.numpy(), MappingType.SYMMETRIC, B, torch.int8),
    "from_hp_to_intx_static": lambda: to_affine_quantized_intx_static(X.numpy(), SC, ZP, B, torch.int8),
    "from_hp_to_floatx": lambda: to_affine_quantized_floatx(X.tolist(), B, torch.float8_e4m3fn),
    "from_hp_to_fpx": lambda: to_affine_quantized_fpx(X.numpy(), FloatxTensorCoreLayout(3, 2)),
    "already quantized": lambda: to_affine_quantized_intx(
        to_affine_quantized_intx(X, MappingType.SYMMETRIC, B, torch.int8), MappingType.SYMMETRIC, B, torch.int8)})
cases("aqt/scale", TypeError, "scale", {
    "static list": lambda: to_affine_quantized_intx_static(X, [0.1] * 4, ZP, B, torch.int8),
    "floatx_static list": lambda: to_affine_quantized_floatx_static(X, [1.0], B, torch.float8_e4m3fn)})
cases("aqt/scale shape", ValueError, "scale", {
    "static": lambda: to_affine_quantized_intx_static(X, torch.ones(3), ZP, B, torch.int8)})
cases("aqt/_layout", TypeError, "_layout", {
    "from_hp_to_intx": lambda: to_affine_quantized_intx(X, MappingType.SYMMETRIC, B, torch.int8, _layout="plain"),
    "from_hp_to_floatx": lambda: to_affine_quantized_floatx(X, B, torch.float8_e4m3fn, _layout=PlainLayout()),
    "from_hp_to_fpx": lambda: to_affine_quantized_fpx(X, Float8Layout())})
cases("aqt/_layout range", ValueError, "_layout", {
    "int8 codes in uint4": lambda: to_affine_quantized_intx(X, MappingType.SYMMETRIC, B, torch.int8,
                                                           _layout=UintxLayout(torch.uint4))})
cases("aqt/fpx rank", ValueError, "2-D", {"1-D": lambda: to_affine_quantized_fpx(X[0], FloatxTensorCoreLayout(3, 2))})
cases("aqt/dequantize output_dtype", TypeError, "output_dtype", {
    "int8": lambda: to_affine_quantized_intx(X, MappingType.SYMMETRIC, B, torch.int8).dequantize(torch.int8)})
cases("aqt/constructor tensor_impl", TypeError, "tensor_impl", {
    "tensor": lambda: AffineQuantizedTensor(X, B, X.shape)})

# ============================================================================== TensorRT
TQ, FTQ = tensor_quant, fake_tensor_quant
AMAX = torch.tensor(2.0)
cases("trt/integer input", TypeError, "inputs", {
    "tensor_quant": lambda: TQ(torch.arange(4), AMAX), "fake_tensor_quant": lambda: FTQ(torch.arange(4), AMAX),
    "TensorQuantFunction": lambda: TensorQuantFunction.apply(torch.arange(4), AMAX, 8, False, True),
    "FakeTensorQuantFunction": lambda: FakeTensorQuantFunction.apply(torch.arange(4), AMAX, 8, False, True),
    "TensorQuantizer": lambda: TensorQuantizer(QuantDescriptor(amax=1.0))(torch.arange(3))})
cases("trt/non-tensor input", TypeError, "inputs", {
    "tensor_quant list": lambda: TQ([1.0], AMAX), "fake_tensor_quant numpy": lambda: FTQ(np.ones(3), AMAX),
    "TensorQuantizer list": lambda: TensorQuantizer(QuantDescriptor(amax=1.0))([1.0])})
cases("trt/amax of wrong shape", ValueError, "amax", {
    "fake_tensor_quant": lambda: FTQ(X, torch.ones(3)), "tensor_quant": lambda: TQ(X, torch.ones(1, 3)),
    "TensorQuantizer": lambda: TensorQuantizer(QuantDescriptor(amax=[1.0, 2.0, 3.0], axis=0))(X)})
for bad in (-1.0, NAN, INF):
    cases(f"trt/amax {bad}", ValueError, "amax", {
        "fake_tensor_quant": lambda b=bad: FTQ(X, torch.tensor(b)), "tensor_quant": lambda b=bad: TQ(X, b),
        "per axis": lambda b=bad: FTQ(X, torch.tensor([[1.0], [b], [1.0], [1.0]])),
        "QuantDescriptor": lambda b=bad: QuantDescriptor(amax=b)})
cases("trt/amax type", TypeError, "amax", {"str": lambda: FTQ(X, "1"), "bool": lambda: FTQ(X, True),
                                           "QuantDescriptor": lambda: QuantDescriptor(amax="1")})
for nb, exc in ((0, ValueError), (33, ValueError), (1.5, TypeError), (True, TypeError), ("8", TypeError)):
    cases(f"trt/num_bits {nb!r}", exc, "num_bits", {
        "tensor_quant": lambda n=nb: TQ(X, AMAX, n), "fake_tensor_quant": lambda n=nb: FTQ(X, AMAX, n),
        "QuantDescriptor": lambda n=nb: QuantDescriptor(num_bits=n)})
cases("trt/signed 1 bit", ValueError, "num_bits", {"fake_tensor_quant": lambda: FTQ(X, AMAX, 1)})
cases("trt/num_bits fp8 format", ValueError, "num_bits", {"(5, 2)": lambda: QuantDescriptor(num_bits=(5, 2))})
cases("trt/unsigned", TypeError, "unsigned", {
    "not a bool": lambda: FTQ(X, AMAX, 8, 1), "negative input": lambda: FTQ(X, AMAX, 8, True),
    "QuantDescriptor": lambda: QuantDescriptor(unsigned="yes")})
cases("trt/narrow_range", TypeError, "narrow_range", {"not a bool": lambda: TQ(X, AMAX, 8, False, None)})
cases("trt/device mix", ValueError, "amax", {
    "meta amax": lambda: FTQ(X, torch.ones((), device=META)),
    "meta input": lambda: TQ(X.to(META), AMAX)})
cases("trt/scale overflows float16", ValueError, "amax", {"": lambda: TQ(X.half(), torch.tensor(1e-4))})
cases("trt/QuantDescriptor axis", TypeError, "axis", {"1.5": lambda: QuantDescriptor(axis=1.5),
                                                      "learn_amax": lambda: QuantDescriptor(axis=0, learn_amax=True)})
cases("trt/QuantDescriptor calib_method", ValueError, "calib_method", {
    "": lambda: QuantDescriptor(calib_method="foo")})
cases("trt/QuantDescriptor scale_amax", ValueError, "scale_amax", {"-1": lambda: QuantDescriptor(scale_amax=-1.0)})
cases("trt/QuantDescriptor fp8 unsigned", ValueError, "unsigned", {
    "": lambda: QuantDescriptor(num_bits=(4, 3), unsigned=True)})
cases("trt/TensorQuantizer quant_desc", TypeError, "quant_desc", {"dict": lambda: TensorQuantizer({})})
cases("trt/TensorQuantizer axis", ValueError, "axis", {"5": lambda: TensorQuantizer(QuantDescriptor(axis=5))(X)})
cases("trt/TensorQuantizer disabled", TypeError, "disabled", {"1": lambda: TensorQuantizer(disabled=1)})


@pytest.mark.parametrize("fn,exc,arg", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_argument_raises_and_names_it(fn, exc, arg):
    with pytest.raises(exc) as info:
        fn()
    assert arg in str(info.value), f"message does not name {arg!r}: {info.value}"


def test_every_dialect_has_cases():
    prefixes = {c[0].split("/")[0] for c in CASES}
    assert {"aimet", "Quantize", "QuantizeDequantize", "float", "torchao", "aqt", "trt"} <= prefixes
    assert len(CASES) > 300


# ============================================================================== accepted, documented
def test_aimet_offset_outside_the_grid_is_accepted():
    """Any finite offset is valid (zero need not be on the grid): the formula applies as written."""
    x = torch.tensor([-1.0, 0.0, 3.0, 30.0])
    q = A.quantize(x, torch.tensor(0.5), torch.tensor(20.0), qmin=0, qmax=15)  # grid starts at 20 * 0.5 = 10
    assert q.tolist() == [0.0, 0.0, 0.0, 15.0]
    y = A.quantize_dequantize(x, torch.tensor(0.5), torch.tensor(20.0), qmin=0, qmax=15)
    assert y.tolist() == [10.0, 10.0, 10.0, 17.5]
    # fractional offsets too: round(0.3 / 0.5) - 0.25 = 0.75, (0.75 + 0.25) * 0.5 = 0.5
    assert A.quantize(torch.tensor([0.3]), torch.tensor(0.5), torch.tensor(0.25), 8).tolist() == [0.75]
    assert A.quantize_dequantize(torch.tensor([0.3]), torch.tensor(0.5), torch.tensor(0.25), 8).tolist() == [0.5]


def test_torchao_zero_point_outside_the_grid_is_accepted():
    """torchao leaves the zero point unclamped with preserve_zero=False; quantize_affine clamps the codes."""
    q = P.quantize_affine(torch.tensor([[0.0, 1.0]]), (1, 2), torch.tensor([0.5]), torch.tensor([200]), torch.int8)
    assert q.tolist() == [[127, 127]]


def test_float8_zero_scale_gives_zero_codes():
    q = P.quantize_affine_float8(torch.tensor([[1.0, -2.0]]), torch.tensor([[0.0]]))
    assert q.float().tolist() == [[0.0, 0.0]]


def test_tensorrt_amax_as_number_list_or_array_equals_tensor():
    want = fake_tensor_quant(X, torch.tensor(1.5))
    for amax in (1.5, [1.5], np.float32(1.5), np.array([1.5])):
        assert torch.equal(fake_tensor_quant(X, amax), want)


def test_float_module_reports_a_device_mix_after_to():
    f = FloatQuantizeDequantize(4, 3).to(META)
    with pytest.raises(ValueError, match="input is on cpu"):
        f(X)


def test_documented_not_implemented_fp8_formats():
    from quanta.tensor_quant import scaled_e4m3

    with pytest.raises(NotImplementedError, match="E=4, M=3"):
        scaled_e4m3(X, AMAX, 5, 2)
