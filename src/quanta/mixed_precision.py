"""AIMET's import path ``aimet_torch.mixed_precision``: see :mod:`quanta.quantsim.mixed_precision`.

>>> from quanta.mixed_precision import AMPSearchAlgo, choose_mixed_precision
>>> AMPSearchAlgo.Binary.value
3
"""

from quanta.quantsim.callbacks import CallbackFunc
from quanta.quantsim.config import DataType as QuantizationDataType
from quanta.quantsim.mixed_precision import (
    AMPSearchAlgo,
    EvalCallbackFactory,
    QuantizerGroup,
    choose_mixed_precision,
    find_quantizer_groups,
)

__all__ = ["AMPSearchAlgo", "CallbackFunc", "EvalCallbackFactory", "QuantizationDataType", "QuantizerGroup",
           "choose_mixed_precision", "find_quantizer_groups"]
