"""Whole-model quantization simulation (AIMET's QuantSim): ``from quanta.quantsim import QuantizationSimModel``.

>>> import torch
>>> from torch import nn
>>> from quanta.quantsim import QuantizationSimModel
>>> model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 10))
>>> x = torch.randn(4, 3, 8, 8)
>>> sim = QuantizationSimModel(model, dummy_input=x, quant_scheme="min_max",
...                            default_param_bw=8, default_output_bw=8)
>>> sim.compute_encodings(lambda m, n: [m(x) for _ in range(n)], 2, progress=False)  # AIMET's callback form
>>> sim.model(x).shape
torch.Size([4, 10])

See :class:`QuantizationSimModel` (the facade), :mod:`quanta.quantsim.config` for the config
file, :mod:`quanta.quantsim.capture` and :mod:`quanta.quantsim.preparer` for how a model is captured and
its functional ops made quantizable, :mod:`quanta.quantsim.placement` for which quantizer goes where,
:mod:`quanta.quantsim.construction` for how they are built, :mod:`quanta.quantsim.calibrate` for
calibration and :mod:`quanta.quantsim.encodings_io` for encodings files.
"""

from quanta.quantsim.batch_norm_fold import fold_all_batch_norms
from quanta.quantsim.config import (
    INTEGER_ONLY,
    DataType,
    QuantizerSpec,
    QuantSimConfig,
    op_types_of,
)
from quanta.quantsim.capture import CaptureMethod, PreparedModel, prepare_model
from quanta.quantsim.quantsim import QuantizationSimModel
from quanta.quantsim.report import LayerSQNR, LayerSQNRReport
from quanta.quantsim.scheme import QuantScheme

__all__ = [
    "INTEGER_ONLY",
    "DataType",
    "LayerSQNR",
    "LayerSQNRReport",
    "CaptureMethod",
    "PreparedModel",
    "QuantScheme",
    "QuantSimConfig",
    "QuantizationSimModel",
    "QuantizerSpec",
    "fold_all_batch_norms",
    "op_types_of",
    "prepare_model",
]
