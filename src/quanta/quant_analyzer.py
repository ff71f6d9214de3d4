"""AIMET's import path ``aimet_torch.quant_analyzer``: see :mod:`quanta.quantsim.quant_analyzer`.

>>> from quanta.quant_analyzer import CallbackFunc, QuantAnalyzer
>>> callable(QuantAnalyzer.analyze)
True
"""

from quanta.quantsim.callbacks import CallbackFunc
from quanta.quantsim.quant_analyzer import QuantAnalysis, QuantAnalyzer

__all__ = ["CallbackFunc", "QuantAnalysis", "QuantAnalyzer"]
