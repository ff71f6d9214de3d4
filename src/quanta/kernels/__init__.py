"""Layer 2: the only code that rounds and clamps tensor elements."""
