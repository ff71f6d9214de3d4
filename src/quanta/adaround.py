"""AIMET's import path ``aimet_torch.adaround``: see :mod:`quanta.quantsim.adaround`.

>>> from quanta.adaround import Adaround, AdaroundParameters
>>> callable(Adaround.apply_adaround)
True
"""

from quanta.quantsim.adaround import (
    Adaround,
    AdaroundLayerResult,
    AdaroundParameters,
    AdaroundReport,
    AdaroundSupportedModules,
    apply_adaround,
)

__all__ = ["Adaround", "AdaroundLayerResult", "AdaroundParameters", "AdaroundReport", "AdaroundSupportedModules",
           "apply_adaround"]
