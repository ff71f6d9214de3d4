"""AIMET's import path ``aimet_torch.bn_reestimation``: see :mod:`quanta.quantsim.bn_reestimation`.

>>> from quanta.bn_reestimation import reestimate_bn_stats
>>> callable(reestimate_bn_stats)
True
"""

from quanta.quantsim.bn_reestimation import DEFAULT_NUM_BATCHES, Handle, reestimate_bn_stats

__all__ = ["DEFAULT_NUM_BATCHES", "Handle", "reestimate_bn_stats"]
