"""Layer 3: encodings, small value objects describing a quantization."""

from quanta.encodings.affine import AffineEncoding

__all__ = ["AffineEncoding"]
