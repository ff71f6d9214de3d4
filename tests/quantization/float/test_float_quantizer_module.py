"""FloatQuantizeDequantize as an nn.Module (device/dtype moves)."""

import torch

from quanta.quantization.float import FloatQuantizeDequantize


def test_module_methods_that_use_nn_module_apply_work():
    # regression: a method named `_apply` shadowed nn.Module._apply, so .to()/.float()/.double() crashed
    q = FloatQuantizeDequantize(dtype=torch.float8_e4m3fn)
    assert q.to("cpu") is q
    q.double()
    assert q.maxval.dtype == torch.float64
    q.float()
    x = torch.tensor([0.3, -1.7])
    assert torch.equal(q(x), FloatQuantizeDequantize(dtype=torch.float8_e4m3fn)(x))
