"""NVIDIA ModelOpt's quantization API on quanta's kernels (``import modelopt.torch.quantization as mtq`` →
``import quanta.modelopt as mtq``).

``mtq.quantize(model, config, forward_loop)`` gives the model's layers quantizers
(``<layer>.input_quantizer`` / ``weight_quantizer`` / ``output_quantizer``, ModelOpt's names),
configures them with ModelOpt's config format (wildcard ``quant_cfg`` entries, or the
legacy dict) and calibrates them (``"algorithm": "max"``). The named configs
(``INT8_DEFAULT_CFG``, ``FP8_DEFAULT_CFG``, ``INT4_BLOCKWISE_WEIGHT_ONLY_CFG``,
``MXFP8_DEFAULT_CFG``, ``NVFP4_DEFAULT_CFG``...) are ModelOpt 0.47's; where ModelOpt runs on
the CPU, quanta's outputs are ModelOpt's bit for bit, and the MX/NVFP4 configs, which
ModelOpt runs only on CUDA, run here on the CPU. ``mtq.auto_quantize`` picks a format per
layer under an effective-bits budget.

>>> import torch
>>> import quanta.modelopt as mtq
>>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
...                             torch.nn.Linear(8 * 6 * 6, 10))
>>> batches = [torch.randn(2, 3, 8, 8) for _ in range(2)]
>>> model = mtq.quantize(model, mtq.FP8_DEFAULT_CFG, lambda m: [m(b) for b in batches])
>>> mtq.print_quant_summary(model)  # doctest: +ELLIPSIS
0.input_quantizer ... TensorQuantizer((4, 3) bit fake per-tensor amax=... calibrator=MaxCalibrator quant)
...
6 TensorQuantizers found in model

Not here yet: the calibration algorithms other than ``"max"`` (SmoothQuant, AWQ, MSE: quanta runs
SmoothQuant/AWQ/GPTQ through ``quanta.quantization.quantize_``), real (non-fake) quantization,
learned amax, and quantized RNN/LSTM/GRU modules (left in float, with a warning).
"""

from quanta.modelopt.config import (
    FP8_DEFAULT_CFG,
    INT4_AWQ_CFG,
    INT4_BLOCKWISE_WEIGHT_ONLY_CFG,
    INT8_DEFAULT_CFG,
    INT8_SMOOTHQUANT_CFG,
    INT8_WEIGHT_ONLY_CFG,
    MXFP4_DEFAULT_CFG,
    MXFP8_DEFAULT_CFG,
    MXINT8_DEFAULT_CFG,
    NVFP4_DEFAULT_CFG,
    W4A8_AWQ_BETA_CFG,
    W4A16_NVFP4_CFG,
    QuantizerAttributeConfig,
    choices,
)
from quanta.modelopt.model_quant import (
    calibrate,
    disable_quantizer,
    enable_quantizer,
    fold_weight,
    is_quantized,
    print_quant_summary,
    quantize,
    set_quantizer_attribute,
    set_quantizer_by_cfg,
)
from quanta.modelopt.auto_quantize import auto_quantize
from quanta.modelopt.modules import QuantModule
from quanta.modelopt.tensor_quantizer import SequentialQuantizer, TensorQuantizer

__all__ = [
    "quantize", "calibrate", "set_quantizer_by_cfg", "set_quantizer_attribute", "disable_quantizer",
    "enable_quantizer", "print_quant_summary", "fold_weight", "is_quantized", "auto_quantize", "TensorQuantizer",
    "SequentialQuantizer", "QuantModule", "QuantizerAttributeConfig", "choices",
    "INT8_DEFAULT_CFG", "INT8_WEIGHT_ONLY_CFG", "INT8_SMOOTHQUANT_CFG", "FP8_DEFAULT_CFG",
    "INT4_BLOCKWISE_WEIGHT_ONLY_CFG", "INT4_AWQ_CFG", "W4A8_AWQ_BETA_CFG", "MXFP8_DEFAULT_CFG", "MXFP4_DEFAULT_CFG",
    "MXINT8_DEFAULT_CFG", "NVFP4_DEFAULT_CFG", "W4A16_NVFP4_CFG",
]
