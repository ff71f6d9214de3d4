"""AIMET's import path ``aimet_torch.batch_norm_fold``: see :mod:`quanta.quantsim.batch_norm_fold` (float models)
and :mod:`quanta.quantsim.fold_to_scale` (a sim's simulated BatchNorms, into the weight encodings).

>>> from quanta.batch_norm_fold import fold_all_batch_norms, fold_all_batch_norms_to_scale
>>> callable(fold_all_batch_norms) and callable(fold_all_batch_norms_to_scale)
True
"""

from quanta.quantsim.batch_norm_fold import FoldedPair, fold_all_batch_norms
from quanta.quantsim.fold_to_scale import fold_all_batch_norms_to_scale

__all__ = ["FoldedPair", "fold_all_batch_norms", "fold_all_batch_norms_to_scale"]
