"""AIMET's import path ``aimet_torch.cross_layer_equalization``: see :mod:`quanta.quantsim.cross_layer_equalization`.

>>> from quanta.cross_layer_equalization import equalize_model
>>> callable(equalize_model)
True
"""

from quanta.quantsim.cross_layer_equalization import (
    ClsLayerType,
    ClsSetInfo,
    CrossLayerScaling,
    HighBiasFold,
    equalize_bn_folded_model,
    equalize_model,
)

__all__ = ["ClsLayerType", "ClsSetInfo", "CrossLayerScaling", "HighBiasFold", "equalize_bn_folded_model",
           "equalize_model"]
