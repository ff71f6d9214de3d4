"""Small models quantized with every quantize_ config: shared by the serialization and safetensors tests."""

import torch
from torch import nn

from quanta.dtypes import (
    AffineQuantizedTensor,
    LinearActivationQuantizedTensor,
    UintxLayout,
)
from quanta.quantization import (
    Float8WeightOnlyConfig,
    FPXWeightOnlyConfig,
    Int4WeightOnlyConfig,
    Int8DynamicActivationInt8WeightConfig,
    Int8WeightOnlyConfig,
    IntxWeightOnlyConfig,
    PerGroup,
    PerTensor,
    quantize_,
)
from quanta.quantization.quant_primitives import MappingType

CONFIGS = {
    "int8_wo": lambda: Int8WeightOnlyConfig(),
    "int8_wo_g32": lambda: Int8WeightOnlyConfig(group_size=32),
    "int4_cpu_g32": lambda: Int4WeightOnlyConfig(group_size=32),
    "int4_uintx_g32": lambda: Int4WeightOnlyConfig(group_size=32, layout=UintxLayout(torch.uint4)),
    "int4_hqq": lambda: Int4WeightOnlyConfig(group_size=32, use_hqq=True),
    "int8_dyn": lambda: Int8DynamicActivationInt8WeightConfig(),
    "int8_dyn_asym": lambda: Int8DynamicActivationInt8WeightConfig(act_mapping_type=MappingType.ASYMMETRIC),
    "float8": lambda: Float8WeightOnlyConfig(),
    "float8_e5m2": lambda: Float8WeightOnlyConfig(torch.float8_e5m2),
    "intx_int4_g32": lambda: IntxWeightOnlyConfig(torch.int4, PerGroup(32)),
    "intx_uint3_g16": lambda: IntxWeightOnlyConfig(torch.uint3, PerGroup(16), MappingType.ASYMMETRIC),
    "intx_int8_tensor": lambda: IntxWeightOnlyConfig(torch.int8, PerTensor()),
    "fp6": lambda: FPXWeightOnlyConfig(3, 2),
    "fp4": lambda: FPXWeightOnlyConfig(2, 1),
}
NAMES = list(CONFIGS)


def make_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 32))


def quantized_model(name, seed=0):
    m = make_model(seed)
    report = quantize_(m, CONFIGS[name]())
    assert report.quantized == ["0", "2"] and not report.skipped
    return m


X = torch.randn(5, 128, generator=torch.Generator().manual_seed(5))


def is_quantized(t):
    return isinstance(t, (AffineQuantizedTensor, LinearActivationQuantizedTensor))
