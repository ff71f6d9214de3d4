"""Layer 1: quantization grids."""

from quanta.grids.affine import MAX_BITWIDTH, IntegerGrid, resolve_grid

__all__ = ["IntegerGrid", "MAX_BITWIDTH", "resolve_grid"]
