"""Saving quantized models: torch.save(weights_only), load_state_dict (assign and copy_), safetensors files."""

import copy
import io

import pytest
import torch
from quantized_models import NAMES, X, make_model, quantized_model
from quantized_models import is_quantized as _is_quantized
from torch import nn

from quanta.dtypes import (
    AffineQuantizedTensor,
    LinearActivationQuantizedTensor,
)
from quanta.quantization.quant_primitives import MappingType


# ------------------------------------------------------------------ torch.save / torch.load(weights_only=True)
@pytest.mark.parametrize("name", NAMES)
def test_torch_save_load_weights_only_assign(name):
    m = quantized_model(name)
    buf = io.BytesIO()
    torch.save(m.state_dict(), buf)
    buf.seek(0)
    sd = torch.load(buf, weights_only=True)
    assert type(sd["0.weight"]) is type(m[0].weight.data) or _is_quantized(sd["0.weight"])
    fresh = make_model(seed=1)
    fresh.load_state_dict(sd, assign=True)
    assert _is_quantized(fresh[0].weight) and _is_quantized(fresh[2].weight)
    assert torch.equal(fresh(X), m(X))


@pytest.mark.parametrize("name", NAMES)
def test_load_state_dict_copies_into_quantized_model(name):
    src = quantized_model(name, seed=0)
    dst = quantized_model(name, seed=1)
    assert not torch.equal(dst(X), src(X))
    kept = dst[0].weight
    dst.load_state_dict(src.state_dict())  # copy_ path
    assert dst[0].weight is kept  # in place
    assert torch.equal(dst[0].weight.dequantize(), src[0].weight.dequantize())
    assert torch.equal(dst(X), src(X))


def test_load_quantized_state_dict_into_float_model_dequantizes():
    src = quantized_model("int4_uintx_g32")
    dst = make_model(seed=3)
    dst.load_state_dict(src.state_dict())
    assert type(dst[0].weight) is nn.Parameter and not _is_quantized(dst[0].weight)
    assert torch.equal(dst[0].weight.data, src[0].weight.dequantize())


def test_load_float_state_dict_into_quantized_model_fails_cleanly():
    dst = quantized_model("int8_wo")
    before = dst[0].weight.dequantize()
    with pytest.raises(RuntimeError, match="quantize it first"):
        dst.load_state_dict(make_model(seed=4).state_dict())
    assert torch.equal(dst[0].weight.dequantize(), before)


def test_deepcopy_and_transposed_tensors_round_trip():
    m = quantized_model("intx_uint3_g16")
    m2 = copy.deepcopy(m)
    assert torch.equal(m2(X), m(X))
    w = m[0].weight
    lin = LinearActivationQuantizedTensor(
        AffineQuantizedTensor.from_hp_to_intx(torch.randn(32, 64), MappingType.SYMMETRIC, (1, 64), torch.int8),
        MappingType.ASYMMETRIC)
    state = {"t": w.t(), "lin_t": lin.t(), "plain": torch.arange(4)}
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    assert torch.equal(back["t"].dequantize(), w.dequantize().t())
    assert type(back["lin_t"]) is LinearActivationQuantizedTensor
    assert torch.equal(back["lin_t"].dequantize(), lin.dequantize().t())
