"""The TensorRT ``pytorch_quantization`` dialect: amax-based tensor quantization.

Change the import prefix, keep the code::

    from pytorch_quantization.tensor_quant import fake_tensor_quant, QuantDescriptor
    from quanta.tensor_quant import fake_tensor_quant, QuantDescriptor  # same results

``scale = max_bound / amax`` is a multiplier; ``q = clamp(round(x * scale),
min_bound, max_bound)`` rounds half to even; ``fake = q / scale``. Functions
default to ``num_bits=8, unsigned=False, narrow_range=True``; the descriptor
(and so :class:`TensorQuantizer`) defaults to ``narrow_range=False``, as
NVIDIA's. The numerics live in :mod:`quanta.kernels.amax_quant`.

>>> x = torch.tensor([-2.0, -1.0, 0.5, 1.0, 3.0])
>>> tensor_quant(x, torch.tensor(1.0))
(tensor([-127., -127.,   64.,  127.,  127.]), tensor(127.))
>>> fake_tensor_quant(x, torch.tensor(1.0))
tensor([-1.0000, -1.0000,  0.5039,  1.0000,  1.0000])

Also here: :class:`TensorQuantizer` (NVIDIA's ``pytorch_quantization.nn.TensorQuantizer``),
the calibrators (``pytorch_quantization.calib`` → :mod:`quanta.tensor_quant.calib`)
and the predefined ``QUANT_DESC_*`` descriptors.
"""

from quanta.kernels.amax_quant import (
    FakeTensorQuantFunction,
    ScaledE4M3Function,
    TensorQuantFunction,
    e4m3_quant,
    fake_e4m3_quant,
    fake_tensor_quant,
    scaled_e4m3,
    tensor_quant,
    tensor_quant_bounds,
)
from quanta.tensor_quant.axis import reduce_amax
from quanta.tensor_quant.calib import (
    AnalyzerCalibrator,
    Calibrator,
    GrowMethod,
    HistogramCalibrator,
    HistogramMethod,
    MaxCalibrator,
)
from quanta.tensor_quant.clip import Clip
from quanta.tensor_quant.descriptor import (
    QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL,
    QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW,
    QUANT_DESC_8BIT_PER_TENSOR,
    QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR,
    CalibMethod,
    QuantDescriptor,
    ScaledQuantDescriptor,
)
from quanta.tensor_quant.quantizer import TensorQuantizer

__all__ = [
    "tensor_quant",
    "fake_tensor_quant",
    "scaled_e4m3",
    "e4m3_quant",
    "fake_e4m3_quant",
    "tensor_quant_bounds",
    "reduce_amax",
    "TensorQuantFunction",
    "FakeTensorQuantFunction",
    "ScaledE4M3Function",
    "ScaledQuantDescriptor",
    "QuantDescriptor",
    "CalibMethod",
    "TensorQuantizer",
    "Clip",
    "Calibrator",
    "AnalyzerCalibrator",
    "MaxCalibrator",
    "HistogramCalibrator",
    "HistogramMethod",
    "GrowMethod",
    "QUANT_DESC_8BIT_PER_TENSOR",
    "QUANT_DESC_UNSIGNED_8BIT_PER_TENSOR",
    "QUANT_DESC_8BIT_CONV1D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONV3D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_LINEAR_WEIGHT_PER_ROW",
    "QUANT_DESC_8BIT_CONVTRANSPOSE1D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE2D_WEIGHT_PER_CHANNEL",
    "QUANT_DESC_8BIT_CONVTRANSPOSE3D_WEIGHT_PER_CHANNEL",
]
