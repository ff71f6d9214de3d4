"""AIMET's import path ``aimet_torch.seq_mse``: see :mod:`quanta.quantsim.seq_mse`.

>>> from quanta.seq_mse import SeqMseParams, apply_seq_mse
>>> SeqMseParams(num_batches=4).num_candidates
20
"""

from quanta.quantsim.seq_mse import (
    SUPPORTED_MODULES,
    SUPPORTED_PARAM_BW,
    SeqMseLayerResult,
    SeqMseParams,
    SeqMseReport,
    apply_seq_mse,
    neg_sqnr,
)

__all__ = ["SUPPORTED_MODULES", "SUPPORTED_PARAM_BW", "SeqMseLayerResult", "SeqMseParams", "SeqMseReport",
           "apply_seq_mse", "neg_sqnr"]
