"""AIMET encodings files, versions 0.6.1, 1.0.0 and 2.0.0: write, read and validate.

An encodings file maps tensor names to quantization parameters (AIMET's
"encoding format specification"). Writing takes quanta's
:class:`~quanta.encodings.affine.AffineEncoding` / :class:`~quanta.encodings.float.FloatEncoding`;
reading gives a :class:`FileEncoding` per tensor (flat scales, as the files store
them), which :meth:`FileEncoding.to_affine` / :meth:`FileEncoding.to_float` turn
back into a quanta encoding once the target's shape and grid are known
(:mod:`quanta.export.sim_encodings` does that for a QuantizationSimModel).

How quanta's ``(scale, offset, [qmin, qmax])`` maps to each version
(``offset = -zero_point``; a quanta code ``q`` means ``scale * (q + offset)``):

======================  ==============================  ==============================  =============================
quanta                  0.6.1 (one entry per channel)   1.0.0 (one entry per tensor)    2.0.0 (ONNX QuantizeLinear)
======================  ==============================  ==============================  =============================
integer / float         ``dtype`` ``"int"``/``"float"``  ``dtype`` ``"INT"``/``"FLOAT"``  ``output_dtype`` (``int8``...)
grid bitwidth           ``bitwidth``                    ``bw``                          in ``output_dtype``
signed grid             (from ``is_symmetric``)         (from ``is_sym``)               ``int*`` vs ``uint*``
symmetric quantizer     ``is_symmetric`` ``"True"``     ``is_sym`` ``true``             (not stored)
scale                   ``scale`` (float)               ``scale`` (flat list)           ``y_scale`` (float/list)
offset                  ``offset = offset + qmin``      ``offset = offset + qmin``      ``y_zero_point = -offset``
per-channel axis        (one entry per channel)         (implied: output channel)       ``axis``
per-block               not representable               ``PER_BLOCK`` + ``block_size``  ``axis`` + ``block_size``
======================  ==============================  ==============================  =============================

*Offsets.* Versions 0.6.1 and 1.0.0 count codes from the bottom of the grid
(AIMET's unsigned grid ``[0, 2**bw - 1]``), so their offset is ``offset + qmin``
and ``min = scale * offset``: a signed symmetric 8-bit quantizer (quanta offset
0, grid ``[-128, 127]``) is written ``offset = -128``, an unsigned asymmetric one
with its own offset (``qmin = 0``), a strict symmetric ``[-127, 127]`` one
``-127``. Version 2.0.0 uses the integers themselves: ``y_zero_point = -offset``
on the grid of ``output_dtype`` (``int8`` = ``[-128, 127]``). Reading back,
the target grid's ``qmin`` is subtracted again (:class:`OffsetOrigin`), so
export → import is exact for every grid quanta writes: full signed or unsigned
``b``-bit grids and strict symmetric ones (other ``qmin``/``qmax`` are refused).
2.0.0 has no way to say a grid is narrower than its dtype: a strict symmetric
grid is written as ``int8`` (re-importing into quanta keeps the narrow grid of
the target quantizer).

*Float.* In 0.6.1 and 1.0.0 a float entry holds only ``dtype`` and the
bitwidth (16: float16, 8: the target's float8 format), i.e. scale 1: an
encoding with another scale (a calibrated float8 ``maxval``) is refused at write
time; use 2.0.0, whose ``float8e4m3fn``, ``float8e4m3fnuz``, ``float8e5m2``,
``float8e5m2fnuz`` and ``float4e2m1`` carry ``y_scale`` (no ``y_zero_point``).
2.0.0 has no ``float16``/``bfloat16`` output type, so those are refused there.

Floats are written with Python's ``repr`` (shortest string that reads back to
the same double), so a float32 scale survives the round trip bit for bit.
Reading uses :mod:`json` only; nothing in a file is ever executed.

>>> import torch
>>> enc = AffineEncoding(torch.tensor(0.05), torch.tensor(-12.0), 8)         # unsigned, zero point 12
>>> doc = encodings_to_dict({"fc.output.0": enc}, {}, EncodingsVersion.V2_0_0)
>>> doc["encodings"]
[{'name': 'fc.output.0', 'output_dtype': 'uint8', 'y_scale': 0.05000000074505806, 'y_zero_point': 12}]
>>> back = read_encodings(doc).activations["fc.output.0"]
>>> back.to_affine((), None, enc.grid) == enc
True
"""

from __future__ import annotations

import enum
import json
import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Union

import torch

from quanta._files import atomic_write, read_json
from quanta.encodings.affine import AffineEncoding
from quanta.encodings.float import FloatEncoding
from quanta.grids.affine import MAX_BITWIDTH, IntegerGrid
from quanta.grids.float import (
    FLOAT8_E4M3FN,
    FLOAT8_E4M3FNUZ,
    FLOAT8_E5M2,
    FLOAT8_E5M2FNUZ,
    FP4_E2M1,
    FloatFormat,
)
from quanta.kernels.qparams import range_for_encoding

__all__ = [
    "EncodingsVersion",
    "KeyedBy",
    "LowPowerBlocks",
    "default_producer",
    "EncodingDtype",
    "Granularity",
    "OffsetOrigin",
    "FileEncoding",
    "EncodingsFile",
    "Encoding",
    "encodings_to_dict",
    "encodings_from_dict",
    "write_encodings",
    "write_json",
    "read_encodings",
    "parse_module_keyed",
]

#: What the writers accept.
Encoding = Union[AffineEncoding, FloatEncoding]


class EncodingsVersion(enum.Enum):
    """The AIMET encodings file versions quanta reads and writes (2.1.0 differs from 2.0.0 only in how it
    writes LPBQ entries)."""

    V0_6_1 = "0.6.1"
    V1_0_0 = "1.0.0"
    V2_0_0 = "2.0.0"
    V2_1_0 = "2.1.0"

    @property
    def is_2x(self) -> bool:
        """True for the ONNX QuantizeLinear style versions (2.0.0, 2.1.0): one ``encodings`` list."""
        return self in (EncodingsVersion.V2_0_0, EncodingsVersion.V2_1_0)

    @classmethod
    def parse(cls, value: "EncodingsVersion | str") -> "EncodingsVersion":
        """A member from itself or its version string.

        >>> EncodingsVersion.parse("2.0.0")
        <EncodingsVersion.V2_0_0: '2.0.0'>
        """
        if isinstance(value, cls):
            return value
        for member in cls:
            if member.value == value:
                return member
        raise ValueError(f"unsupported encodings version {value!r}; quanta reads and writes "
                         f"{', '.join(m.value for m in cls)}")


class EncodingDtype(enum.Enum):
    """Integer (affine) or floating-point quantization."""

    INT = "int"
    FLOAT = "float"


class Granularity(enum.Enum):
    """How many elements share a scale; the values are version 1.0.0's ``enc_type`` strings."""

    PER_TENSOR = "PER_TENSOR"
    PER_CHANNEL = "PER_CHANNEL"
    PER_BLOCK = "PER_BLOCK"


class KeyedBy(enum.Enum):
    """What an encodings file's names are.

    * ``TENSOR``: tensor names (``<prefix>.encodings``: the ONNX graph's tensors and initializers).
    * ``MODULE``: module names (AIMET's ``<prefix>_torch.encodings`` and ``save_encodings_to_json``):
      activations as ``{module: {"input"|"output": {index: entry}}}``, parameters as ``"<module>.<param>"``;
      :class:`EncodingsFile` names them ``"<module>.input.<i>"``, ``"<module>.output.<i>"``,
      ``"<module>.<param>"`` (see :mod:`quanta.export.torch_encodings`).
    """

    TENSOR = "tensor"
    MODULE = "module"


class OffsetOrigin(enum.Enum):
    """Which code a file's offset is counted from.

    * ``GRID_MIN`` (0.6.1, 1.0.0): from the grid's smallest code, ``min = scale * offset``;
      quanta's offset is ``offset - qmin``.
    * ``ZERO`` (2.0.0): codes are the integers of ``output_dtype``; quanta's offset is
      ``offset`` (``= -y_zero_point``).
    """

    GRID_MIN = "grid_min"
    ZERO = "zero"


# Name of each field's key in each version, for error messages.
_KEYS: dict[EncodingsVersion, dict[str, str]] = {
    EncodingsVersion.V0_6_1: {"dtype": "dtype", "bitwidth": "bitwidth", "symmetric": "is_symmetric",
                              "scale": "scale", "offset": "offset", "block_size": "block_size", "axis": "scale"},
    EncodingsVersion.V1_0_0: {"dtype": "dtype", "bitwidth": "bw", "symmetric": "is_sym", "scale": "scale",
                              "offset": "offset", "block_size": "block_size", "axis": "enc_type"},
    EncodingsVersion.V2_0_0: {"dtype": "output_dtype", "bitwidth": "output_dtype", "symmetric": "y_zero_point",
                              "scale": "y_scale", "offset": "y_zero_point", "block_size": "block_size",
                              "axis": "axis", "lpbq": "per_block_int_scale"},
}
_KEYS[EncodingsVersion.V1_0_0]["lpbq"] = "enc_type"
_KEYS[EncodingsVersion.V2_1_0] = {**_KEYS[EncodingsVersion.V2_0_0], "lpbq": "y_scale"}

# 2.0.0 output_dtype vocabulary (AIMET's spec; ONNX QuantizeLinear types).
_INT_DTYPES: dict[str, tuple[bool, int]] = {
    "int2": (True, 2), "uint2": (False, 2), "int4": (True, 4), "uint4": (False, 4), "int8": (True, 8),
    "uint8": (False, 8), "int16": (True, 16), "uint16": (False, 16), "int32": (True, 32),
}
_FLOAT_DTYPES: dict[str, FloatFormat] = {
    "float8e4m3fn": FLOAT8_E4M3FN, "float8e4m3fnuz": FLOAT8_E4M3FNUZ, "float8e5m2": FLOAT8_E5M2,
    "float8e5m2fnuz": FLOAT8_E5M2FNUZ, "float4e2m1": FP4_E2M1,
}


def _error(name: str, key: str, message: str) -> ValueError:
    return ValueError(f"encoding {name!r}, key {key!r}: {message}")


# ============================================================================ reading: the result
@dataclass(frozen=True, eq=False)
class LowPowerBlocks:
    """The two-level scales of an LPBQ entry (AIMET's ``GroupedBlockQuantizeDequantize``).

    In low-power blockwise quantization every block's scale is an integer times its channel's float scale,
    ``scale[c, b] = int_scale[c, b] * channel_scale[c]`` (float32), with ``int_scale`` in
    ``[1, 2**(decompressed_bitwidth - bitwidth)]``; codes are ``bitwidth``-bit (the file's ``compressed_bw``,
    2.x's ``output_dtype``), the integer scales widen them to ``decompressed_bitwidth`` bits (``bw``).

    Attributes:
        int_scale: int64, the file's per-block integers, shape ``(channels, blocks)`` (or the nested shape a
            2.x file gives them).
        channel_scale: float32, one per channel, shaped to broadcast against ``int_scale`` (``(channels, 1)``).
        decompressed_bitwidth: ``bw`` of 1.0.0 (None where the file does not say: 2.x).
    """

    int_scale: torch.Tensor
    channel_scale: torch.Tensor
    decompressed_bitwidth: int | None

    def block_scales(self) -> torch.Tensor:
        """The effective per-block scales, ``int_scale * channel_scale`` in float32, shaped as ``int_scale``.

        >>> LowPowerBlocks(torch.tensor([[2, 3]]), torch.tensor([[0.5]]), 8).block_scales()
        tensor([[1.0000, 1.5000]])
        """
        return self.int_scale.to(torch.float32) * self.channel_scale


@dataclass(frozen=True, eq=False)
class FileEncoding:
    """One tensor's encoding as a file stores it: flat scales and offsets plus layout hints.

    Attributes:
        name: tensor name.
        version: the file's version (its key names appear in error messages).
        dtype: integer or float quantization.
        bitwidth: bits per code (or per float value).
        scale: float32, 1-D, in the row-major order of the quantizer's scale
            tensor; None for a 0.6.1/1.0.0 float entry (scale 1: a plain cast).
        offset: int64, 1-D, counted from :attr:`origin` (None for floats).
        origin: see :class:`OffsetOrigin`.
        symmetric: the file's symmetric flag (None in 2.0.0, which has none).
        signed: signedness of the 2.0.0 ``output_dtype`` (None in 0.6.1/1.0.0).
        float_format: the 2.0.0 float format (None otherwise).
        axis: 2.0.0 channel (per-channel) or block (per-block) axis; may be negative.
        block_size: elements per block along the block axis, or None.
        shape: shape of a nested 2.0.0 ``y_scale`` (None for flat lists and scalars).
        lpbq: the two-level scales of an LPBQ entry (then :attr:`scale` holds the effective per-block scales,
            row-major ``(channels, blocks)``, and :attr:`bitwidth` the code width); None otherwise.
        shape_free: the entry says nothing about its layout (a ``_torch.encodings`` entry: one scale per
            element of the quantizer's scale, in its row-major order), so only the count is checked.
    """

    name: str
    version: EncodingsVersion
    dtype: EncodingDtype
    bitwidth: int
    scale: torch.Tensor | None
    offset: torch.Tensor | None = None
    origin: OffsetOrigin = OffsetOrigin.GRID_MIN
    symmetric: bool | None = None
    signed: bool | None = None
    float_format: FloatFormat | None = None
    axis: int | None = None
    block_size: int | None = None
    shape: tuple[int, ...] | None = None
    lpbq: LowPowerBlocks | None = None
    shape_free: bool = False

    @property
    def granularity(self) -> Granularity:
        """Per tensor, per channel or per block (from :attr:`block_size` and the number of scales)."""
        if self.block_size is not None:
            return Granularity.PER_BLOCK
        if self.scale is not None and self.scale.numel() > 1:
            return Granularity.PER_CHANNEL
        return Granularity.PER_TENSOR

    def key(self, field_name: str) -> str:
        """The key that holds ``field_name`` in this file's version (for error messages)."""
        return _KEYS[self.version][field_name]

    def error(self, field_name: str, message: str) -> ValueError:
        """A ValueError naming this entry and the key of ``field_name``."""
        return _error(self.name, self.key(field_name), message)

    # -- conversion to quanta encodings ------------------------------------------------
    def to_affine(self, shape: tuple[int, ...], block_size: tuple[int, ...] | None,
                  grid: IntegerGrid, *, symmetric: bool | None = None) -> AffineEncoding:
        """The :class:`AffineEncoding` for a quantizer of ``shape``/``block_size``/``grid``.

        Checks (each failure a ValueError naming this entry and its key): integer
        dtype, bitwidth and signedness (2.x) of ``grid``, the number of scales, axis
        and block size, and offsets (the zero point on the grid; the symmetric
        offset ``-round((qmin + qmax) / 2)`` for a symmetric quantizer, given as
        ``symmetric``, and for an entry that says it is symmetric).

        >>> fe = FileEncoding("w", EncodingsVersion.V1_0_0, EncodingDtype.INT, 8,
        ...                   torch.tensor([0.5, 0.25]), torch.tensor([-128, -128]), symmetric=True)
        >>> fe.to_affine((2, 1), None, IntegerGrid(-128, 127)).offset
        tensor([[0.],
                [0.]])
        """
        shape = tuple(int(s) for s in shape)
        if self.dtype is not EncodingDtype.INT:
            raise self.error("dtype", "a float encoding for an integer quantizer")
        if self.bitwidth != grid.bitwidth:
            raise self.error("bitwidth", f"bitwidth {self.bitwidth} differs from the quantizer's "
                                         f"{grid.bitwidth} (grid {grid})")
        if self.signed is not None and self.signed != grid.signed:
            raise self.error("dtype", f"{'signed' if self.signed else 'unsigned'} {self.bitwidth}-bit codes for a "
                                      f"quantizer with the {'signed' if grid.signed else 'unsigned'} grid {grid}")
        assert self.scale is not None and self.offset is not None
        self._check_layout(shape, block_size)
        offset = self.offset if self.origin is OffsetOrigin.ZERO else self.offset - grid.qmin
        zero_point = -offset
        if bool(((zero_point < grid.qmin) | (zero_point > grid.qmax)).any()):
            raise self.error("offset", f"zero point(s) off the grid {grid}: quanta keeps 0.0 representable "
                                       f"(offsets in quanta's convention: {_shortvalues(offset)})")
        # The values are the scale and offset: a symmetric flag must agree with them, and a symmetric quantizer
        # needs the symmetric offset; an asymmetric quantizer takes any offset on its grid, the symmetric one too
        # (AIMET's ONNX export guesses is_sym from the zero point: a uint8 zero point 128 reads "symmetric").
        want = -round((grid.qmin + grid.qmax) / 2)
        if self.symmetric and bool((offset != want).any()):
            raise self.error("symmetric", f"the entry is symmetric but its offsets are not the symmetric one of "
                                          f"{grid} (quanta offset {want}, got {_shortvalues(offset)})")
        if symmetric and bool((offset != want).any()):
            raise self.error("offset", f"a symmetric quantizer on {grid} needs quanta offset {want}, "
                                       f"got {_shortvalues(offset)}")
        scale = self.scale.reshape(shape)
        return AffineEncoding(scale, offset.to(scale.dtype).reshape(shape), grid, block_size=block_size)

    def to_float(self, shape: tuple[int, ...], block_size: tuple[int, ...] | None,
                 format: FloatFormat) -> FloatEncoding:
        """The :class:`FloatEncoding` for a float quantizer of ``shape``/``block_size``/``format``.

        A 0.6.1/1.0.0 entry has no scale: the result has scale 1 (a plain cast).

        >>> fe = FileEncoding("x", EncodingsVersion.V1_0_0, EncodingDtype.FLOAT, 16, None)
        >>> from quanta.grids.float import FLOAT16
        >>> fe.to_float((), None, FLOAT16).scale
        tensor(1.)
        """
        shape = tuple(int(s) for s in shape)
        if self.dtype is not EncodingDtype.FLOAT:
            raise self.error("dtype", f"an integer encoding for a {format.name()} quantizer")
        if self.bitwidth != format.bits:
            raise self.error("bitwidth", f"bitwidth {self.bitwidth} differs from the quantizer's "
                                         f"{format.bits} ({format.name()})")
        if self.float_format is not None and self.float_format != format:
            raise self.error("dtype", f"format {self.float_format.name()} differs from the quantizer's "
                                      f"{format.name()}")
        if self.scale is None:
            return FloatEncoding(torch.ones(shape), format, block_size)
        self._check_layout(shape, block_size)
        return FloatEncoding(self.scale.reshape(shape), format, block_size)

    def _check_layout(self, shape: tuple[int, ...], block_size: tuple[int, ...] | None) -> None:
        assert self.scale is not None
        n = math.prod(shape)
        if self.scale.numel() != n:
            raise self.error("scale", f"{self.scale.numel()} scale(s), the quantizer needs {n} (shape {shape})")
        if self.shape_free:
            return
        if self.shape is not None and len(self.shape) > 1 and self.shape != shape:
            raise self.error("scale", f"nested scale of shape {self.shape}, the quantizer's is {shape}")
        target = _layout(self.name, shape, block_size)
        axis = None
        if self.axis is not None and target.kind is not Granularity.PER_TENSOR:
            rank = len(shape)
            if not -rank <= self.axis < rank:
                raise self.error("axis", f"axis {self.axis} out of range for a scale of rank {rank}")
            axis = self.axis % rank
        if self.block_size is not None:
            if target.kind is not Granularity.PER_BLOCK:
                raise self.error("block_size", f"a per-block entry for a {target.kind.value.lower()} quantizer "
                                               f"(shape {shape}, block_size {block_size})")
            if self.block_size != target.block_size:
                raise self.error("block_size", f"block size {self.block_size} differs from the quantizer's "
                                               f"{target.block_size} (block_size {block_size})")
        elif target.kind is Granularity.PER_BLOCK:
            raise self.error("block_size", f"the quantizer is per-block (block_size {block_size}), the entry "
                                           "has no block size")
        if axis is not None and target.axis is not None and axis != target.axis:
            raise self.error("axis", f"axis {self.axis} differs from the quantizer's axis {target.axis} "
                                     f"(shape {shape})")


@dataclass
class EncodingsFile:
    """A parsed encodings file.

    Versions 2.0.0 and 2.1.0 keep one list and do not say which tensors are
    parameters: all their entries are in :attr:`activations` and :attr:`params`
    is empty. :attr:`encodings` gives every entry regardless of version.

    Attributes:
        keyed_by: tensor names (``<prefix>.encodings``) or module names (``<prefix>_torch.encodings``).
        producer: the file's informational ``producer`` object (``{"package": "aimet-torch", "version": ...}``).
        extra: other top-level keys the version does not define, kept as they are (informational: a top-level
            key never changes how a tensor is quantized; an unknown key inside an entry does, and is an error).
    """

    version: EncodingsVersion
    activations: dict[str, FileEncoding]
    params: dict[str, FileEncoding]
    excluded_layers: list[str] = field(default_factory=list)
    quantizer_args: dict[str, Any] = field(default_factory=dict)
    keyed_by: KeyedBy = KeyedBy.TENSOR
    producer: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def encodings(self) -> dict[str, FileEncoding]:
        """Every entry by tensor name (activations, then parameters)."""
        return {**self.activations, **self.params}


# ============================================================================ layouts
@dataclass(frozen=True)
class _Layout:
    kind: Granularity
    axis: int | None  # channel axis (per channel) or block axis (per block)
    block_size: int | None


def _layout(name: str, shape: tuple[int, ...], block_size: tuple[int, ...] | None) -> _Layout:
    """Granularity of a scale of ``shape``: one blocked dim at most, one channel dim for per-channel."""
    if math.prod(shape) == 1 and not any(b > 1 for b in (block_size or ())):
        return _Layout(Granularity.PER_TENSOR, None, None)
    blocked = [d for d, b in enumerate(block_size or ()) if b > 1]
    if len(blocked) > 1:
        raise _error(name, "block_size", f"block_size {block_size} blocks {len(blocked)} dimensions; "
                                         "AIMET encodings have one block axis")
    if blocked:
        return _Layout(Granularity.PER_BLOCK, blocked[0], block_size[blocked[0]])  # type: ignore[index]
    channels = [d for d, s in enumerate(shape) if s > 1]
    if len(channels) != 1:
        raise _error(name, "scale", f"scale of shape {shape} varies along {len(channels)} dimensions without a "
                                    "block_size; AIMET encodings have one channel axis")
    return _Layout(Granularity.PER_CHANNEL, channels[0], None)


# ============================================================================ writing
def _check_writable_grid(name: str, grid: IntegerGrid) -> None:
    b = grid.bitwidth
    full = (grid.qmin, grid.qmax) in ((0, 2**b - 1), (-(2 ** (b - 1)), 2 ** (b - 1) - 1))
    strict = grid.qmin == -grid.qmax and grid.qmax == 2 ** (b - 1) - 1
    if not (full or strict):
        raise _error(name, "bitwidth", f"grid {grid} is neither a full {b}-bit grid nor a strict symmetric one; "
                                       "AIMET encodings describe a grid by its bitwidth only")


def _symmetric_of(enc: AffineEncoding) -> bool:
    """True if every offset is the symmetric one, ``-round((qmin + qmax) / 2)``."""
    want = -round((enc.qmin + enc.qmax) / 2)
    return bool((enc.offset.detach() == want).all())


def _check_scale(name: str, key: str, scale: torch.Tensor) -> None:
    if scale.numel() == 0:
        raise _error(name, key, "the encoding has no scales")
    if not bool(torch.isfinite(scale).all()) or not bool((scale > 0).all()):
        raise _error(name, key, f"scales must be finite and positive, got {_shortvalues(scale)}")


class _Affine:
    """The parts of an AffineEncoding every writer needs, checked once."""

    def __init__(self, name: str, enc: AffineEncoding, symmetric: bool | None) -> None:
        _check_writable_grid(name, enc.grid)
        scale = enc.scale.detach().cpu()
        _check_scale(name, "scale", scale)
        offset = torch.broadcast_to(enc.offset.detach().cpu(), scale.shape)
        if not bool((offset == offset.round()).all()) or not bool(torch.isfinite(offset).all()):
            raise _error(name, "offset", f"offsets must be integers, got {_shortvalues(offset)}")
        self.layout = _layout(name, tuple(scale.shape), enc.block_size)
        self.grid = enc.grid
        self.scale = scale
        self.offsets = [int(v) for v in offset.reshape(-1).tolist()]  # quanta's convention
        self.symmetric = _symmetric_of(enc) if symmetric is None else bool(symmetric)
        # 0.6.1's min/max: a float32 range AIMET's loader (which derives scale and offset from min and max)
        # turns back into this scale and offset bit for bit, where one exists ((offset + qmin) * scale, AIMET's
        # own, is often an ulp off after max - min rounds)
        lo, hi, _ = range_for_encoding(scale.float(), offset.float(), enc.grid, symmetric=self.symmetric)
        self.min = lo.reshape(-1).tolist()
        self.max = hi.reshape(-1).tolist()

    @property
    def flat_scale(self) -> list[float]:
        return [float(v) for v in self.scale.reshape(-1).tolist()]

    @property
    def grid_min_offsets(self) -> list[int]:
        """Offsets counted from the grid's smallest code (0.6.1, 1.0.0)."""
        return [o + self.grid.qmin for o in self.offsets]


def _legacy_float(name: str, enc: FloatEncoding, version: EncodingsVersion) -> int:
    scale = enc.scale.detach().cpu()
    _check_scale(name, "scale", scale)
    if not bool((scale == 1).all()):
        raise _error(name, "dtype", f"{enc.format.name()} encoding with scale(s) {_shortvalues(scale)} (a calibrated "
                                    f"maxval): version {version.value} float entries hold only dtype and bitwidth "
                                    "(scale 1); write version 2.0.0, which stores y_scale for float8/float4")
    return enc.format.bits


def _entry_0_6_1(name: str, enc: Encoding, symmetric: bool | None, *, blocks: bool = False
                 ) -> list[dict[str, Any]]:
    """One dict per scale; ``blocks``: per-block scales too, in the row-major order of the scale tensor (the
    reader takes the layout from its quantizer, as AIMET's ``_torch.encodings`` does)."""
    if isinstance(enc, FloatEncoding):
        return [{"bitwidth": _legacy_float(name, enc, EncodingsVersion.V0_6_1), "dtype": "float"}]
    a = _Affine(name, enc, symmetric)
    if a.layout.kind is Granularity.PER_BLOCK and not blocks:
        raise _error(name, "block_size", f"per-block encoding (block_size {enc.block_size}) cannot be written in "
                                         "version 0.6.1 (one entry per channel only); write version 1.0.0 or 2.0.0")
    return [{"bitwidth": a.grid.bitwidth, "dtype": "int", "is_symmetric": str(a.symmetric),
             "max": float(hi), "min": float(lo), "offset": off, "scale": s}
            for s, off, lo, hi in zip(a.flat_scale, a.grid_min_offsets, a.min, a.max)]


def _lpbq_parts(name: str, enc: Encoding, lpbq: LowPowerBlocks) -> tuple[_Affine, torch.Tensor, torch.Tensor]:
    """``(affine, integer scales, channel scales)`` of an LPBQ encoding, checked against its block scales."""
    if not isinstance(enc, AffineEncoding):
        raise _error(name, "dtype", "an LPBQ encoding is an integer one")
    a = _Affine(name, enc, True)
    if a.layout.kind is not Granularity.PER_BLOCK:
        raise _error(name, "block_size", f"an LPBQ encoding is per block, got {a.layout.kind.value}")
    ints = lpbq.int_scale.detach().cpu().to(torch.int64).reshape(a.scale.shape)
    channel = lpbq.channel_scale.detach().cpu().to(torch.float32)
    if not torch.equal(lpbq.block_scales().reshape(a.scale.shape), a.scale.float()):
        raise _error(name, "scale", "the LPBQ integer and channel scales do not multiply to the encoding's block scales")
    return a, ints, channel


def _entry_lpbq_1_0_0(name: str, enc: Encoding, lpbq: LowPowerBlocks) -> dict[str, Any]:
    a, ints, channel = _lpbq_parts(name, enc, lpbq)
    bw = lpbq.decompressed_bitwidth
    if bw is None:
        raise _error(name, "bw", "an LPBQ entry of version 1.0.0 needs the decompressed bitwidth")
    return {"name": name, "dtype": "INT", "enc_type": "LPBQ", "bw": bw, "compressed_bw": a.grid.bitwidth,
            "is_sym": True, "scale": [float(v) for v in channel.reshape(-1).tolist()],
            "offset": [-(2 ** (bw - 1))] * channel.numel(), "per_block_int_scale": ints.reshape(-1).tolist(),
            "block_size": a.layout.block_size}


def _entry_lpbq_2x(name: str, enc: Encoding, lpbq: LowPowerBlocks, version: EncodingsVersion) -> dict[str, Any]:
    a, ints, channel = _lpbq_parts(name, enc, lpbq)
    entry: dict[str, Any] = {"name": name, "output_dtype": _int_dtype_name(name, a.grid)}
    if version is EncodingsVersion.V2_0_0:
        entry["per_block_int_scale"] = ints.tolist()
        entry["per_channel_float_scale"] = channel.reshape([*channel.shape, *[1] * (ints.dim() - channel.dim())]
                                                           ).tolist()
    else:
        wide = [d for d, n in enumerate(channel.shape) if n > 1]
        if len(wide) > 1:
            raise _error(name, "y_scale", f"channel scales of shape {tuple(channel.shape)}: version 2.1.0 has one "
                                          "channel axis")
        entry["y_scale"] = {"x": ints.tolist(), "x_scale": [float(v) for v in channel.reshape(-1).tolist()],
                            "axis": wide[0] if wide else 0}
    entry["axis"] = a.layout.axis
    entry["block_size"] = a.layout.block_size
    return entry


def _entry_1_0_0(name: str, enc: Encoding, symmetric: bool | None, lpbq: LowPowerBlocks | None = None
                 ) -> dict[str, Any]:
    if lpbq is not None:
        return _entry_lpbq_1_0_0(name, enc, lpbq)
    if isinstance(enc, FloatEncoding):
        bw = _legacy_float(name, enc, EncodingsVersion.V1_0_0)
        return {"name": name, "dtype": "FLOAT", "enc_type": Granularity.PER_TENSOR.value, "bw": bw}
    a = _Affine(name, enc, symmetric)
    entry: dict[str, Any] = {"name": name, "dtype": "INT", "enc_type": a.layout.kind.value, "bw": a.grid.bitwidth,
                             "is_sym": a.symmetric, "scale": a.flat_scale, "offset": a.grid_min_offsets}
    if a.layout.kind is Granularity.PER_BLOCK:
        entry["block_size"] = a.layout.block_size
    return entry


def _int_dtype_name(name: str, grid: IntegerGrid) -> str:
    dtype = f"{'int' if grid.signed else 'uint'}{grid.bitwidth}"
    if dtype not in _INT_DTYPES:
        raise _error(name, "output_dtype", f"no 2.0.0 output_dtype for the {grid.bitwidth}-bit grid {grid} "
                                           f"(one of {', '.join(_INT_DTYPES)}); write version 1.0.0")
    return dtype


def _shaped(values: torch.Tensor, layout: _Layout) -> Any:
    """A scalar per tensor, a flat list per channel, a nested list (the scale's own shape) per block."""
    if layout.kind is Granularity.PER_TENSOR:
        return values.reshape(-1)[0].item()
    if layout.kind is Granularity.PER_CHANNEL:
        return values.reshape(-1).tolist()
    return values.tolist()


def _entry_2_0_0(name: str, enc: Encoding, version: EncodingsVersion = EncodingsVersion.V2_0_0,
                 lpbq: LowPowerBlocks | None = None) -> dict[str, Any]:
    if lpbq is not None:
        return _entry_lpbq_2x(name, enc, lpbq, version)
    if isinstance(enc, FloatEncoding):
        dtype = next((k for k, f in _FLOAT_DTYPES.items() if f == enc.format), None)
        if dtype is None:
            raise _error(name, "output_dtype", f"version 2.0.0 has no output_dtype for {enc.format.name()} (it has "
                                               f"{', '.join(_FLOAT_DTYPES)}); write version 1.0.0 for float16")
        scale = enc.scale.detach().cpu()
        _check_scale(name, "y_scale", scale)
        layout = _layout(name, tuple(scale.shape), enc.block_size)
        entry: dict[str, Any] = {"name": name, "output_dtype": dtype, "y_scale": _shaped(scale, layout)}
    else:
        a = _Affine(name, enc, None)
        layout = a.layout
        entry = {"name": name, "output_dtype": _int_dtype_name(name, a.grid),
                 "y_scale": _shaped(a.scale, layout)}
        zero_points = -torch.tensor(a.offsets, dtype=torch.int64).reshape(a.scale.shape)
        if bool(zero_points.any()):
            entry["y_zero_point"] = _shaped(zero_points, layout)
    if layout.axis is not None:
        entry["axis"] = layout.axis
    if layout.block_size is not None:
        entry["block_size"] = layout.block_size
    return entry


def _check_names(activations: Mapping[str, Encoding], params: Mapping[str, Encoding]) -> None:
    for group, encs in (("activations", activations), ("params", params)):
        if not isinstance(encs, Mapping):
            raise TypeError(f"{group} must be a mapping of tensor names to encodings, got {type(encs).__name__}")
        for name, enc in encs.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"{group}: tensor names must be non-empty strings, got {name!r}")
            if not isinstance(enc, (AffineEncoding, FloatEncoding)):
                raise TypeError(f"{group}[{name!r}] must be an AffineEncoding or FloatEncoding, "
                                f"got {type(enc).__name__}")
    both = sorted(set(activations) & set(params))
    if both:
        raise ValueError(f"tensor names in both activations and params: {', '.join(both)}")


def encodings_to_dict(
    activations: Mapping[str, Encoding],
    params: Mapping[str, Encoding],
    version: EncodingsVersion | str = EncodingsVersion.V1_0_0,
    *,
    excluded_layers: Iterable[str] = (),
    quantizer_args: Mapping[str, Any] | None = None,
    symmetric: Mapping[str, bool] | None = None,
    producer: Mapping[str, Any] | None = None,
    lpbq: Mapping[str, LowPowerBlocks] | None = None,
) -> dict[str, Any]:
    """The JSON document of an encodings file of ``version``.

    Args:
        activations: tensor name → encoding of each activation.
        params: tensor name → encoding of each parameter.
        version: file version.
        excluded_layers, quantizer_args: written as given (0.6.1 and 1.0.0 only;
            versions 2.0.0 and 2.1.0 have neither, so giving them is an error).
        producer: the informational ``producer`` entry (default: :func:`default_producer`).
        lpbq: the two-level scales of LPBQ tensors by name (their encodings are the block scales): written
            as AIMET writes them (1.0.0 ``enc_type`` LPBQ; 2.0.0 ``per_block_int_scale`` and
            ``per_channel_float_scale``; 2.1.0 a ``y_scale`` object); 0.6.1 has no blocks.
        symmetric: the quantizers' symmetric flags by tensor name (0.6.1/1.0.0
            ``is_symmetric``/``is_sym``); a name not in it is symmetric when every
            offset is ``-round((qmin + qmax) / 2)``.

    Raises ValueError (naming the tensor and key) for what the version cannot
    hold: per-block in 0.6.1, a float scale other than 1 in 0.6.1/1.0.0,
    float16 or a bitwidth without an ``output_dtype`` in 2.0.0, non-finite or
    non-positive scales.

    >>> enc = AffineEncoding(torch.tensor([0.5, 0.25]).reshape(2, 1), torch.zeros(2, 1), 8, signed=True)
    >>> encodings_to_dict({}, {"fc.weight": enc}, "1.0.0")["param_encodings"]
    [{'name': 'fc.weight', 'dtype': 'INT', 'enc_type': 'PER_CHANNEL', 'bw': 8, 'is_sym': True,
      'scale': [0.5, 0.25], 'offset': [-128, -128]}]
    """
    version = EncodingsVersion.parse(version)
    _check_names(activations, params)
    excluded = list(excluded_layers)
    if not all(isinstance(x, str) for x in excluded):
        raise TypeError(f"excluded_layers must be strings, got {excluded!r}")
    args = dict(quantizer_args or {})
    flags = dict(symmetric or {})
    two_level = dict(lpbq or {})
    head = {"producer": dict(default_producer() if producer is None else producer), "version": version.value}
    if version.is_2x:
        if excluded or args:
            raise ValueError(f"version {version.value} files hold only 'encodings'; excluded_layers and "
                             "quantizer_args cannot be written (drop them, or write version 1.0.0)")
        entries = [_entry_2_0_0(n, e, version, two_level.get(n)) for n, e in {**activations, **params}.items()]
        return {**head, "encodings": entries}
    if version is EncodingsVersion.V0_6_1:
        acts: Any = {n: _entry_0_6_1(n, e, flags.get(n)) for n, e in activations.items()}
        pars: Any = {n: _entry_0_6_1(n, e, flags.get(n)) for n, e in params.items()}
    else:
        acts = [_entry_1_0_0(n, e, flags.get(n), two_level.get(n)) for n, e in activations.items()]
        pars = [_entry_1_0_0(n, e, flags.get(n), two_level.get(n)) for n, e in params.items()]
    return {**head, "activation_encodings": acts, "param_encodings": pars, "excluded_layers": excluded,
            "quantizer_args": args}


def default_producer() -> dict[str, str]:
    """The ``producer`` entry quanta writes (AIMET writes ``{"package": "aimet-torch", "version": ...}``).

    >>> default_producer()["package"]
    'quanta'
    """
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover - Python < 3.8
        return {"package": "quanta", "version": "unknown"}
    try:
        return {"package": "quanta", "version": version("quanta")}
    except PackageNotFoundError:  # pragma: no cover - running from a source tree that is not installed
        return {"package": "quanta", "version": "unknown"}


def write_encodings(
    path: str | os.PathLike,
    activations: Mapping[str, Encoding],
    params: Mapping[str, Encoding],
    version: EncodingsVersion | str = EncodingsVersion.V1_0_0,
    **kwargs: Any,
) -> None:
    """Write an encodings file atomically: a failure leaves an existing ``path`` as it was.

    ``kwargs`` are :func:`encodings_to_dict`'s keyword options.

    >>> import pathlib, tempfile
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "model.encodings"
    >>> write_encodings(p, {"x": AffineEncoding(torch.tensor(0.1), torch.tensor(0.0), 8)}, {}, "0.6.1")
    >>> read_encodings(p).activations["x"].scale
    tensor([0.1000])
    """
    write_json(path, encodings_to_dict(activations, params, version, **kwargs))


def write_json(path: str | os.PathLike, doc: Mapping[str, Any]) -> None:
    """Write an encodings document as JSON (indent 2, no NaN), atomically."""
    text = json.dumps(doc, indent=2, allow_nan=False)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    atomic_write(path, write)


# ============================================================================ reading
_INFO_KEYS = {"producer", "excluded_layers", "quantizer_args"}  # informational top-level keys each version has
_TOP_KEYS = {  # (required, informational); any other top-level key is kept in EncodingsFile.extra
    EncodingsVersion.V0_6_1: ({"version", "activation_encodings", "param_encodings"}, _INFO_KEYS),
    EncodingsVersion.V1_0_0: ({"version", "activation_encodings", "param_encodings"}, _INFO_KEYS),
    EncodingsVersion.V2_0_0: ({"version", "encodings"}, _INFO_KEYS),
    EncodingsVersion.V2_1_0: ({"version", "encodings"}, _INFO_KEYS),
}
_ENTRY_KEYS = {  # (required, optional) per version and dtype
    (EncodingsVersion.V0_6_1, EncodingDtype.INT): (
        {"bitwidth", "dtype", "is_symmetric", "max", "min", "offset", "scale"}, set()),
    (EncodingsVersion.V0_6_1, EncodingDtype.FLOAT): ({"bitwidth", "dtype"}, set()),
    (EncodingsVersion.V1_0_0, EncodingDtype.INT): (
        {"name", "dtype", "enc_type", "bw", "is_sym", "scale", "offset"}, {"block_size"}),
    (EncodingsVersion.V1_0_0, EncodingDtype.FLOAT): ({"name", "dtype", "enc_type", "bw"}, set()),
}
_LPBQ_1_0_0_KEYS = ({"name", "dtype", "enc_type", "bw", "compressed_bw", "is_sym", "scale", "offset",
                     "per_block_int_scale", "block_size"}, set())
_2X_KEYS = ({"name", "output_dtype"},
            {"y_scale", "y_zero_point", "axis", "block_size", "per_block_int_scale", "per_channel_float_scale"})

# Entry keys AIMET writes for quantization quanta does not simulate: named, with what they mean.
_UNSUPPORTED_KEYS = {
    "zero_point_shift": "a zero point shifted by half a step (AIMET's zero_point_shift)",
    "rows_per_block": "vector quantization (enc_type VECTOR)",
    "cols_per_block": "vector quantization (enc_type VECTOR)",
    "vector_dim": "vector quantization (enc_type VECTOR)",
    "vector_stride": "vector quantization (enc_type VECTOR)",
    "index_bw": "vector quantization (enc_type VECTOR)",
}


def _check_keys(name: str, entry: Mapping[str, Any], keys: tuple[set[str], set[str]], what: str) -> None:
    """Missing required keys and unknown keys are errors naming the key: inside an entry every key says how
    the tensor is quantized, so a key quanta does not know cannot be ignored."""
    required, optional = keys
    missing = sorted(required - set(entry))
    if missing:
        raise _error(name, missing[0], f"missing (a {what} entry needs {', '.join(sorted(required))})")
    unknown = sorted(set(entry) - required - optional)
    if unknown:
        known = [k for k in unknown if k in _UNSUPPORTED_KEYS]
        if known:
            raise _error(name, known[0], f"{_UNSUPPORTED_KEYS[known[0]]} is not supported by quanta")
        raise _error(name, unknown[0], f"unknown key (it would change how the tensor is quantized, so it is not "
                                       f"ignored); a {what} entry has {', '.join(sorted(required | optional))}")


def _int(name: str, key: str, value: Any, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error(name, key, f"must be an integer, got {type(value).__name__} {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise _error(name, key, f"must be in [{lo}, {hi}], got {value}")
    return value


def _bitwidth(name: str, key: str, value: Any) -> int:
    return _int(name, key, value, 1, MAX_BITWIDTH)


def _number(name: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _error(name, key, f"must be a number, got {type(value).__name__} {value!r}")
    return float(value)


def _scales(name: str, key: str, values: list[Any]) -> torch.Tensor:
    floats = [_number(name, key, v) for v in values]
    if not floats:
        raise _error(name, key, "is empty")
    bad = [v for v in floats if not (math.isfinite(v) and v > 0)]
    if bad:
        raise _error(name, key, f"scales must be finite and positive, got {bad[0]!r}")
    scale = torch.tensor(floats, dtype=torch.float32)
    if not bool((scale > 0).all()) or not bool(torch.isfinite(scale).all()):
        raise _error(name, key, "scales must be finite and positive in float32 (a value under- or overflows)")
    return scale


def _offsets(name: str, key: str, values: list[Any]) -> torch.Tensor:
    return torch.tensor([_int(name, key, v, -(2**MAX_BITWIDTH), 2**MAX_BITWIDTH) for v in values], dtype=torch.int64)


def _bool(name: str, key: str, value: Any, strings: bool) -> bool:
    if isinstance(value, bool):
        return value
    if strings and value in ("True", "False"):
        return value == "True"
    allowed = "true/false or the strings 'True'/'False'" if strings else "true or false"
    raise _error(name, key, f"must be {allowed}, got {value!r}")


def _mapping(name: str, value: Any) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"encoding {name!r}: each entry must be a JSON object, got {type(value).__name__}")
    return value


def _dtype(name: str, key: str, value: Any, names: dict[str, EncodingDtype]) -> EncodingDtype:
    if not isinstance(value, str) or value not in names:  # (a list or dict is unhashable: check the type first)
        raise _error(name, key, f"must be one of {', '.join(repr(k) for k in names)}, got {value!r}")
    return names[value]


def _parse_0_6_1(name: str, entries: Any, *, shape_free: bool = False) -> FileEncoding:
    """A 0.6.1 entry: a list of per-channel dicts (one dict alone, as ``_torch.encodings`` writes activations)."""
    v = EncodingsVersion.V0_6_1
    if shape_free and isinstance(entries, Mapping):
        entries = [entries]
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"encoding {name!r}: version 0.6.1 needs a non-empty list of entries (one per channel), "
                         f"got {type(entries).__name__}")
    entries = [_mapping(name, e) for e in entries]
    dtypes = {_dtype(name, "dtype", e.get("dtype"), {"int": EncodingDtype.INT, "float": EncodingDtype.FLOAT})
              for e in entries}
    if len(dtypes) > 1:
        raise _error(name, "dtype", "channels disagree on int/float")
    dtype = dtypes.pop()
    for e in entries:
        _check_keys(name, e, _ENTRY_KEYS[(v, dtype)], f"{v.value} {dtype.name}")
    bitwidths = {_bitwidth(name, "bitwidth", e["bitwidth"]) for e in entries}
    if len(bitwidths) > 1:
        raise _error(name, "bitwidth", f"channels disagree: {sorted(bitwidths)}")
    bitwidth = bitwidths.pop()
    if dtype is EncodingDtype.FLOAT:
        return FileEncoding(name, v, dtype, bitwidth, None)
    sym = {_bool(name, "is_symmetric", e["is_symmetric"], strings=True) for e in entries}
    if len(sym) > 1:
        raise _error(name, "is_symmetric", "channels disagree")
    for e in entries:
        _number(name, "min", e["min"]), _number(name, "max", e["max"])
    return FileEncoding(name, v, dtype, bitwidth, _scales(name, "scale", [e["scale"] for e in entries]),
                        _offsets(name, "offset", [e["offset"] for e in entries]), OffsetOrigin.GRID_MIN,
                        symmetric=sym.pop(), shape_free=shape_free)


def _parse_1_0_0(entry: Any, where: str) -> FileEncoding:
    v = EncodingsVersion.V1_0_0
    entry = _mapping(where, entry)
    name = _entry_name(entry, where)
    dtype = _dtype(name, "dtype", entry.get("dtype"), {"INT": EncodingDtype.INT, "FLOAT": EncodingDtype.FLOAT})
    kind = entry.get("enc_type")
    if kind == "LPBQ" and dtype is EncodingDtype.INT:
        return _parse_lpbq_1_0_0(name, entry)
    if kind == "VECTOR":
        raise _error(name, "enc_type", f"{_UNSUPPORTED_KEYS['rows_per_block']} is not supported by quanta")
    _check_keys(name, entry, _ENTRY_KEYS[(v, dtype)], f"{v.value} {dtype.name}")
    bitwidth = _bitwidth(name, "bw", entry["bw"])
    if not isinstance(kind, str) or kind not in {g.value for g in Granularity}:
        raise _error(name, "enc_type", f"must be one of {', '.join(g.value for g in Granularity)} or LPBQ, "
                                       f"got {kind!r}")
    kind = Granularity(kind)
    if dtype is EncodingDtype.FLOAT:
        return FileEncoding(name, v, dtype, bitwidth, None)
    symmetric = _bool(name, "is_sym", entry["is_sym"], strings=False)
    scale, offset = _scale_offset_lists(name, entry)
    if kind is Granularity.PER_TENSOR and scale.numel() != 1:
        raise _error(name, "scale", f"a PER_TENSOR entry has one scale, got {scale.numel()}")
    block_size = None
    if kind is Granularity.PER_BLOCK:
        if "block_size" not in entry:
            raise _error(name, "block_size", "missing (a PER_BLOCK entry needs it)")
        block_size = _int(name, "block_size", entry["block_size"], 1)
    elif "block_size" in entry:
        raise _error(name, "block_size", f"only PER_BLOCK entries have a block size (enc_type is {kind.value})")
    return FileEncoding(name, v, dtype, bitwidth, scale, offset, OffsetOrigin.GRID_MIN, symmetric=symmetric,
                        block_size=block_size)


def _scale_offset_lists(name: str, entry: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    for key in ("scale", "offset"):
        if not isinstance(entry[key], list):
            raise _error(name, key, f"must be a list, got {type(entry[key]).__name__}")
    scale = _scales(name, "scale", entry["scale"])
    offset = _offsets(name, "offset", entry["offset"])
    if offset.numel() != scale.numel():
        raise _error(name, "offset", f"{offset.numel()} offsets for {scale.numel()} scales")
    return scale, offset


def _int_scales(name: str, key: str, values: list[Any], hi: int | None) -> torch.Tensor:
    ints = torch.tensor([_int(name, key, x, 1, hi) for x in values], dtype=torch.int64)
    if not ints.numel():
        raise _error(name, key, "is empty")
    return ints


def _parse_lpbq_1_0_0(name: str, entry: Mapping[str, Any]) -> FileEncoding:
    """``enc_type: LPBQ``: ``bw`` is the decompressed bitwidth, ``compressed_bw`` the codes', ``scale`` one float
    per channel, ``offset`` ``-2**(bw - 1)`` per channel, ``per_block_int_scale`` (channels × blocks, flat)."""
    v = EncodingsVersion.V1_0_0
    _check_keys(name, entry, _LPBQ_1_0_0_KEYS, "1.0.0 LPBQ")
    decompressed = _bitwidth(name, "bw", entry["bw"])
    bits = _bitwidth(name, "compressed_bw", entry["compressed_bw"])
    if bits > decompressed:
        raise _error(name, "compressed_bw", f"{bits} exceeds the decompressed bitwidth bw={decompressed}")
    if not _bool(name, "is_sym", entry["is_sym"], strings=False):
        raise _error(name, "is_sym", "LPBQ entries are symmetric (true)")
    channel_scale, offset = _scale_offset_lists(name, entry)
    if bool((offset != -(2 ** (decompressed - 1))).any()):
        raise _error(name, "offset", f"LPBQ offsets are -2**(bw - 1) = {-(2 ** (decompressed - 1))}, "
                                     f"got {_shortvalues(offset)}")
    if not isinstance(entry["per_block_int_scale"], list):
        raise _error(name, "per_block_int_scale", "must be a list")
    ints = _int_scales(name, "per_block_int_scale", entry["per_block_int_scale"], 2 ** (decompressed - bits))
    channels = channel_scale.numel()
    if ints.numel() % channels:
        raise _error(name, "per_block_int_scale", f"{ints.numel()} integer scales for {channels} channels")
    blocks = LowPowerBlocks(ints.reshape(channels, -1), channel_scale.reshape(channels, 1), decompressed)
    scale = blocks.block_scales().reshape(-1)
    return FileEncoding(name, v, EncodingDtype.INT, bits, scale,
                        torch.full_like(ints.reshape(-1), -(2 ** (bits - 1))), OffsetOrigin.GRID_MIN,
                        symmetric=True, block_size=_int(name, "block_size", entry["block_size"], 1), lpbq=blocks)


def _nested(name: str, key: str, value: Any) -> tuple[list[Any], tuple[int, ...]]:
    """Flatten a scalar or a rectangular nested list; returns (values, shape)."""
    if not isinstance(value, list):
        return [value], ()
    if not value:
        raise _error(name, key, "is an empty list")
    if isinstance(value[0], list):
        parts = [_nested(name, key, v) if isinstance(v, list) else (None, None) for v in value]
        shapes = {p[1] for p in parts}
        if len(shapes) != 1 or None in shapes:
            raise _error(name, key, "nested lists must be rectangular")
        return [x for p in parts for x in p[0]], (len(value), *shapes.pop())  # type: ignore[union-attr,misc]
    if any(isinstance(v, list) for v in value):
        raise _error(name, key, "nested lists must be rectangular")
    return list(value), (len(value),)


def _lpbq_2x(name: str, entry: Mapping[str, Any], version: EncodingsVersion) -> LowPowerBlocks:
    """The two-level scales of a 2.x LPBQ entry: 2.0.0 writes
    ``per_block_int_scale`` and ``per_channel_float_scale`` (nested, broadcastable), 2.1.0 a ``y_scale`` object
    ``{"x": per-block integers, "x_scale": per-channel floats, "axis": their axis in x}``."""
    if "per_block_int_scale" in entry or "per_channel_float_scale" in entry:
        for key in ("per_block_int_scale", "per_channel_float_scale"):
            if key not in entry:
                raise _error(name, key, "missing (an LPBQ entry has per_block_int_scale and per_channel_float_scale)")
        if "y_scale" in entry:
            raise _error(name, "y_scale", "an LPBQ entry with per_block_int_scale has no y_scale")
        values, shape = _nested(name, "per_block_int_scale", entry["per_block_int_scale"])
        ints = _int_scales(name, "per_block_int_scale", values, None).reshape(shape)
        cvalues, cshape = _nested(name, "per_channel_float_scale", entry["per_channel_float_scale"])
        channel = _scales(name, "per_channel_float_scale", cvalues).reshape(cshape)
        try:
            torch.broadcast_shapes(cshape, shape)
        except RuntimeError:
            raise _error(name, "per_channel_float_scale", f"shape {cshape} does not broadcast to the integer "
                                                          f"scales' {shape}") from None
        return LowPowerBlocks(ints, channel, None)
    two = entry["y_scale"]
    if "input_dtype" in two:
        raise _error(name, "y_scale", f"float-coded scales (input_dtype {two.get('input_dtype')!r}, AIMET's NVFP4) "
                                      "are not supported by quanta")
    _check_keys(name, two, ({"x", "x_scale", "axis"}, set()), f"{version.value} two-level y_scale")
    values, shape = _nested(name, "y_scale", two["x"])
    ints = _int_scales(name, "y_scale", values, None).reshape(shape)
    axis = _int(name, "y_scale", two["axis"], -max(len(shape), 1), max(len(shape), 1) - 1)
    cvalues, cshape = _nested(name, "y_scale", two["x_scale"])
    channel = _scales(name, "y_scale", cvalues)
    if len(cshape) > 1 or (shape and channel.numel() != shape[axis]):
        raise _error(name, "y_scale", f"x_scale needs one scale per channel of x (shape {shape}, axis {axis}), "
                                      f"got shape {cshape}")
    view = [1] * len(shape)
    if shape:
        view[axis] = channel.numel()
    return LowPowerBlocks(ints, channel.reshape(view), None)


def _parse_2_0_0(entry: Any, where: str, version: EncodingsVersion = EncodingsVersion.V2_0_0) -> FileEncoding:
    v = version
    entry = _mapping(where, entry)
    name = _entry_name(entry, where)
    out = entry.get("output_dtype")
    if isinstance(out, str) and out in _INT_DTYPES:  # (a list or dict is unhashable: check the type first)
        dtype = EncodingDtype.INT
    elif isinstance(out, str) and out in _FLOAT_DTYPES:
        dtype = EncodingDtype.FLOAT
    elif "output_dtype" not in entry:
        raise _error(name, "output_dtype", "missing")
    else:
        extra = " (2.x has no float16/bfloat16 output type)" if out in ("float16", "bfloat16") else ""
        raise _error(name, "output_dtype", f"must be one of {', '.join([*_INT_DTYPES, *_FLOAT_DTYPES])}, "
                                           f"got {out!r}{extra}")
    _check_keys(name, entry, _2X_KEYS, f"{v.value} {dtype.name}")
    lpbq = None
    two_level = isinstance(entry.get("y_scale"), Mapping)
    if two_level and v is EncodingsVersion.V2_0_0:
        raise _error(name, "y_scale", "an object (two-level scales) is version 2.1.0's; 2.0.0 writes "
                                      "per_block_int_scale and per_channel_float_scale")
    if two_level or "per_block_int_scale" in entry or "per_channel_float_scale" in entry:
        if dtype is not EncodingDtype.INT:
            raise _error(name, "output_dtype", f"LPBQ entries have integer codes, got {out!r}")
        lpbq = _lpbq_2x(name, entry, v)
        scale, shape = lpbq.block_scales().reshape(-1), tuple(lpbq.int_scale.shape)
        if "block_size" not in entry or "axis" not in entry:
            raise _error(name, "block_size" if "block_size" not in entry else "axis",
                         "missing (an LPBQ entry needs its block axis and block size)")
    elif "y_scale" not in entry:
        raise _error(name, "y_scale", f"missing (a {v.value} entry needs name, output_dtype, y_scale)")
    else:
        values, shape = _nested(name, "y_scale", entry["y_scale"])
        scale = _scales(name, "y_scale", values)
    axis = _int(name, "axis", entry["axis"]) if "axis" in entry else None
    block_size = _int(name, "block_size", entry["block_size"], 1) if "block_size" in entry else None
    if scale.numel() > 1 and axis is None:
        raise _error(name, "axis", f"missing: {scale.numel()} scales need the channel or block axis")
    if block_size is not None and axis is None:
        raise _error(name, "axis", "missing: a per-block entry needs its block axis")
    if block_size is None and len(shape) > 1:
        raise _error(name, "y_scale", f"nested scale of shape {shape} without a block_size (per-channel scales "
                                      "are a flat list)")
    zero = torch.zeros(scale.numel(), dtype=torch.int64)
    if "y_zero_point" in entry:
        zvalues, zshape = _nested(name, "y_zero_point", entry["y_zero_point"])
        if zshape != shape:
            raise _error(name, "y_zero_point", f"shape {zshape} differs from y_scale's {shape}")
        zero = _offsets(name, "y_zero_point", zvalues)
    if lpbq is not None and bool(zero.any()):
        raise _error(name, "y_zero_point", "LPBQ entries are symmetric (zero points 0)")
    if dtype is EncodingDtype.FLOAT:
        if bool(zero.any()):
            raise _error(name, "y_zero_point", f"a {out} encoding has no zero point (must be 0)")
        fmt = _FLOAT_DTYPES[out]
        return FileEncoding(name, v, dtype, fmt.bits, scale, None, OffsetOrigin.ZERO, float_format=fmt,
                            axis=axis, block_size=block_size, shape=shape if len(shape) > 1 else None)
    signed, bits = _INT_DTYPES[out]
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    if bool(((zero < lo) | (zero > hi)).any()):
        raise _error(name, "y_zero_point", f"zero points must fit {out} [{lo}, {hi}], got {_shortvalues(zero)}")
    return FileEncoding(name, v, dtype, bits, scale, -zero, OffsetOrigin.ZERO, signed=signed, axis=axis,
                        block_size=block_size, shape=shape if len(shape) > 1 else None, lpbq=lpbq)


def _entry_name(entry: Mapping[str, Any], where: str) -> str:
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: key 'name' must be a non-empty string, got {name!r}")
    return name


def _list_of_entries(doc: Mapping[str, Any], key: str, version: EncodingsVersion) -> dict[str, FileEncoding]:
    value = doc[key]
    if not isinstance(value, list):
        raise ValueError(f"encodings file: key {key!r} must be a list of entries in version {version.value}, "
                         f"got {type(value).__name__}")
    out: dict[str, FileEncoding] = {}
    for i, entry in enumerate(value):
        where = f"{key}[{i}]"
        enc = _parse_2_0_0(entry, where, version) if version.is_2x else _parse_1_0_0(entry, where)
        if enc.name in out:
            raise ValueError(f"encoding {enc.name!r}, key 'name': appears twice in {key!r}")
        out[enc.name] = enc
    return out


def _dict_of_entries(doc: Mapping[str, Any], key: str) -> dict[str, FileEncoding]:
    value = doc[key]
    if not isinstance(value, Mapping):
        raise ValueError(f"encodings file: key {key!r} must map tensor names to lists of entries in version 0.6.1, "
                         f"got {type(value).__name__}")
    return {name: _parse_0_6_1(name, entries) for name, entries in value.items()}


def _keyed_by(doc: Mapping[str, Any], version: EncodingsVersion) -> KeyedBy:
    """Module-keyed (``_torch.encodings``) when ``activation_encodings`` maps module names to
    ``{"input"|"output": ...}`` objects (0.6.1 entries, whatever the version says), tensor-keyed otherwise."""
    if version.is_2x:
        return KeyedBy.TENSOR
    acts = doc.get("activation_encodings")
    if isinstance(acts, Mapping) and (version is EncodingsVersion.V1_0_0
                                      or any(isinstance(v, Mapping) for v in acts.values())):
        return KeyedBy.MODULE
    return KeyedBy.TENSOR


def parse_module_keyed(activations: Any, params: Any) -> tuple[dict[str, FileEncoding], dict[str, FileEncoding]]:
    """The entries of a ``_torch.encodings`` file (:mod:`quanta.export.torch_encodings`), named ``"<module>.input.<i>"`` / ``"<module>.output.<i>"`` /
    ``"<module>.<param>"``; each a 0.6.1 entry without layout (:attr:`FileEncoding.shape_free`).

    Raises ValueError naming the module and key for anything that is not this layout.
    """
    if not isinstance(activations, Mapping):
        raise ValueError(f"encodings file: key 'activation_encodings' must map module names to "
                         f"{{'input'|'output': {{index: entry}}}}, got {type(activations).__name__}")
    if not isinstance(params, Mapping):
        raise ValueError(f"encodings file: key 'param_encodings' must map parameter names to entries, "
                         f"got {type(params).__name__}")
    acts: dict[str, FileEncoding] = {}
    for module, slots in activations.items():
        if not isinstance(slots, Mapping):
            raise ValueError(f"activation_encodings[{module!r}] must be an object with 'input'/'output', "
                             f"got {type(slots).__name__}")
        for kind, entries in slots.items():
            if kind not in ("input", "output"):
                raise ValueError(f"activation_encodings[{module!r}]: unknown key {kind!r} (a module has "
                                 "'input' and 'output')")
            if not isinstance(entries, Mapping):
                raise ValueError(f"activation_encodings[{module!r}][{kind!r}] must map indices to entries, "
                                 f"got {type(entries).__name__}")
            for index, entry in entries.items():
                if not isinstance(index, str) or not index.isdecimal():
                    raise ValueError(f"activation_encodings[{module!r}][{kind!r}]: index {index!r} is not a "
                                     "non-negative integer")
                name = f"{module}.{kind}.{int(index)}" if module else f"{kind}.{int(index)}"
                acts[name] = _parse_0_6_1(name, entry, shape_free=True)
    pars = {name: _parse_0_6_1(name, entry, shape_free=True) for name, entry in params.items()}
    return acts, pars


def encodings_from_dict(doc: Mapping[str, Any]) -> EncodingsFile:
    """Parse and validate the JSON document of an encodings file (its version and layout are detected).

    Reads every file AIMET 2.x writes: ``<prefix>.encodings`` of versions 0.6.1, 1.0.0, 2.0.0 and 2.1.0
    (LPBQ entries included, :class:`LowPowerBlocks`), and the module-keyed ``<prefix>_torch.encodings`` /
    ``save_encodings_to_json`` files (:class:`KeyedBy`; a file without ``version`` is one of those).
    Top-level keys a version does not define are informational and kept (:attr:`EncodingsFile.extra`);
    unknown keys inside an entry are errors.

    Raises ValueError naming the entry and key for anything malformed: an
    unknown version, missing or unknown keys, wrong types, non-finite or
    non-positive scales, lists of different lengths, an unknown ``enc_type``.
    """
    if not isinstance(doc, Mapping):
        raise ValueError(f"encodings file: the top level must be a JSON object, got {type(doc).__name__}")
    if doc.get("format") == "quanta.quantsim.encodings":
        raise ValueError("this is a quanta save_encodings file, not an AIMET one; load it with "
                         "QuantizationSimModel.load_encodings")
    if "version" not in doc:
        if not isinstance(doc.get("activation_encodings"), Mapping) or "param_encodings" not in doc:
            raise ValueError("encodings file: key 'version' is missing (AIMET files say \"0.6.1\", \"1.0.0\", "
                             "\"2.0.0\" or \"2.1.0\"; only save_encodings_to_json files, with activation_encodings "
                             "and param_encodings, have none)")
        doc = {**doc, "version": EncodingsVersion.V0_6_1.value}  # AIMET's save_encodings_to_json: 0.6.1 entries
    try:
        version = EncodingsVersion.parse(doc["version"])
    except ValueError as e:
        raise ValueError(f"encodings file: key 'version': {e}") from None
    required, informational = _TOP_KEYS[version]
    missing = sorted(required - set(doc))
    if missing:
        raise ValueError(f"encodings file: key {missing[0]!r} is missing (version {version.value} needs "
                         f"{', '.join(sorted(required))})")
    excluded = doc.get("excluded_layers", [])
    if not isinstance(excluded, list) or not all(isinstance(x, str) for x in excluded):
        raise ValueError(f"encodings file: key 'excluded_layers' must be a list of strings, got {excluded!r}")
    args = doc.get("quantizer_args", {})
    if not isinstance(args, Mapping):
        raise ValueError(f"encodings file: key 'quantizer_args' must be an object, got {type(args).__name__}")
    keyed_by = _keyed_by(doc, version)
    if keyed_by is KeyedBy.MODULE:
        acts, params = parse_module_keyed(doc["activation_encodings"], doc["param_encodings"])
    elif version.is_2x:
        acts, params = _list_of_entries(doc, "encodings", version), {}
    elif version is EncodingsVersion.V1_0_0:
        acts = _list_of_entries(doc, "activation_encodings", version)
        params = _list_of_entries(doc, "param_encodings", version)
    else:
        acts = _dict_of_entries(doc, "activation_encodings")
        params = _dict_of_entries(doc, "param_encodings")
    both = sorted(set(acts) & set(params))
    if both:
        raise ValueError(f"encoding {both[0]!r}, key 'name': in both activation_encodings and param_encodings")
    extra = {k: v for k, v in doc.items() if k not in required | informational}
    return EncodingsFile(version, acts, params, list(excluded), dict(args), keyed_by, doc.get("producer"), extra)


def read_encodings(source: str | os.PathLike | Mapping[str, Any]) -> EncodingsFile:
    """Read an encodings file (a path, or its already-parsed JSON object); the version is detected.

    Only :mod:`json` is used: nothing in a file is executed. A missing file is
    a FileNotFoundError, anything malformed a ValueError naming the entry and key.

    >>> doc = {"version": "1.0.0", "activation_encodings": [], "param_encodings": [
    ...     {"name": "fc.weight", "dtype": "INT", "enc_type": "PER_TENSOR", "bw": 4, "is_sym": True,
    ...      "scale": [0.5], "offset": [-8]}]}
    >>> fe = read_encodings(doc).params["fc.weight"]
    >>> fe.bitwidth, fe.scale, fe.offset, fe.symmetric
    (4, tensor([0.5000]), tensor([-8]), True)
    """
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        doc = read_json(path, "encodings")
        try:
            return encodings_from_dict(doc)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    if isinstance(source, Mapping):
        return encodings_from_dict(source)
    raise TypeError(f"source must be a path or a mapping (the parsed JSON), got {type(source).__name__}")


def _shortvalues(t: torch.Tensor, limit: int = 6) -> str:
    vals = t.reshape(-1).tolist()
    text = ", ".join(repr(v) for v in vals[:limit])
    return f"[{text}{', ...' if len(vals) > limit else ''}]"
