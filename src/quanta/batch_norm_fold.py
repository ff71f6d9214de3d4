"""AIMET's import path ``aimet_torch.batch_norm_fold``: see :mod:`quanta.quantsim.batch_norm_fold`.

>>> from quanta.batch_norm_fold import fold_all_batch_norms
>>> callable(fold_all_batch_norms)
True
"""

from quanta.quantsim.batch_norm_fold import FoldedPair, fold_all_batch_norms

__all__ = ["FoldedPair", "fold_all_batch_norms"]
