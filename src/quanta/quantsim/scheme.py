"""Quantization schemes of QuantizationSimModel: which statistics calibrate a quantizer.

>>> QuantScheme.parse("tf_enhanced")
<QuantScheme.SQNR: 'sqnr'>
>>> QuantScheme.parse("training_range_learning_with_tf_init").learns_ranges
True
"""

from __future__ import annotations

import enum

from quanta.quantization.encoding_analyzer import (
    EncodingAnalyzer,
    MinMaxEncodingAnalyzer,
    PercentileEncodingAnalyzer,
    SqnrEncodingAnalyzer,
)

__all__ = ["QuantScheme"]


class QuantScheme(enum.Enum):
    """How quantizer ranges are initialised, and whether QAT learns them.

    * ``MIN_MAX`` (AIMET ``post_training_tf``): the observed min/max.
    * ``PERCENTILE`` (``post_training_percentile``): the p-th percentile of a
      histogram (``p`` set by ``QuantizationSimModel.set_percentile_value``, default 99.99).
    * ``SQNR`` (``post_training_tf_enhanced``): the range that maximises
      quantized SQNR over a histogram.
    * ``RANGE_LEARNING_MIN_MAX`` / ``RANGE_LEARNING_SQNR`` (``training_range_learning_with_tf_init`` /
      ``..._with_tf_enhanced_init``): initialised like MIN_MAX / SQNR, then
      ``min``/``max`` train with the weights. With the post-training schemes
      the ranges stay frozen during QAT (``requires_grad=False``).
    """

    MIN_MAX = "min_max"
    PERCENTILE = "percentile"
    SQNR = "sqnr"
    RANGE_LEARNING_MIN_MAX = "range_learning_min_max"
    RANGE_LEARNING_SQNR = "range_learning_sqnr"

    @classmethod
    def parse(cls, value: "QuantScheme | str") -> "QuantScheme":
        """A QuantScheme from itself, its value, or an AIMET name (``post_training_tf``, ``tf_enhanced``, ...)."""
        if isinstance(value, QuantScheme):
            return value
        if not isinstance(value, str):
            # AIMET's own enum (aimet_common.defs.QuantScheme) has the names below
            value = getattr(value, "name", None) or repr(value)
        key = value.lower()
        if key in _ALIASES:
            return _ALIASES[key]
        raise ValueError(
            f"quant_scheme must be one of {sorted(_ALIASES)} or a quanta.quantsim.QuantScheme, got {value!r}"
        )

    @property
    def learns_ranges(self) -> bool:
        """Whether QAT trains the quantizers' ``min``/``max``."""
        return self in (QuantScheme.RANGE_LEARNING_MIN_MAX, QuantScheme.RANGE_LEARNING_SQNR)

    def encoding_analyzer(self, shape: tuple[int, ...], block_size: tuple[int, ...] | None = None, *,
                          percentile: float = 99.99) -> EncodingAnalyzer:
        """A fresh analyzer of this scheme for a quantizer of ``shape``."""
        if self in (QuantScheme.MIN_MAX, QuantScheme.RANGE_LEARNING_MIN_MAX):
            return MinMaxEncodingAnalyzer(shape, block_size)
        if self is QuantScheme.PERCENTILE:
            return PercentileEncodingAnalyzer(shape, percentile=percentile, block_size=block_size)
        return SqnrEncodingAnalyzer(shape, block_size=block_size)


_ALIASES = {
    "min_max": QuantScheme.MIN_MAX,
    "minmax": QuantScheme.MIN_MAX,
    "tf": QuantScheme.MIN_MAX,
    "post_training_tf": QuantScheme.MIN_MAX,
    "percentile": QuantScheme.PERCENTILE,
    "post_training_percentile": QuantScheme.PERCENTILE,
    "sqnr": QuantScheme.SQNR,
    "tf_enhanced": QuantScheme.SQNR,
    "post_training_tf_enhanced": QuantScheme.SQNR,
    "range_learning_min_max": QuantScheme.RANGE_LEARNING_MIN_MAX,
    "training_range_learning_with_tf_init": QuantScheme.RANGE_LEARNING_MIN_MAX,
    "range_learning_sqnr": QuantScheme.RANGE_LEARNING_SQNR,
    "training_range_learning_with_tf_enhanced_init": QuantScheme.RANGE_LEARNING_SQNR,
}
