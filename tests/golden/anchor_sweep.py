"""Shared by the anchor-sweep generators (``generate_*_sweep.py``, run beside the anchors in a scratch venv)
and their tests (``test_*_sweep.py``, run with quanta): seeded inputs and compact storage.

Inputs are never stored: both sides rebuild them from a seed with the functions
below (torch's CPU generator), and each recording keeps a short digest of the
input it saw, so that a test fails loudly if its rebuilt input differs.

Outputs are stored compactly by :func:`pack`: the raw little-endian bits of the
tensor, zlib-compressed, base64 (``"<dtype>:<base64>"``); :func:`unpack` gives
the tensor back bit for bit (NaN payloads, signed zeros and all).

Only torch, numpy and the standard library are imported: this file runs in the
anchors' venv too.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import os
import zlib

import numpy as np
import torch

__all__ = ["pack", "unpack", "digest", "bits_equal", "write_recording", "SPECIALS", "affine_input", "calibration_batches",
           "degenerate_input", "signed_specials_input", "float_input", "float8_input", "fpx_input"]

_BITS = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
         torch.bfloat16: torch.int16, torch.int64: torch.int64, torch.int32: torch.int32, torch.int16: torch.int16,
         torch.int8: torch.int8, torch.uint8: torch.uint8, torch.bool: torch.uint8,
         torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8, torch.float8_e4m3fnuz: torch.uint8,
         torch.float8_e5m2fnuz: torch.uint8}
_NAMES = {str(dt).removeprefix("torch."): dt for dt in _BITS}

#: Special values placed at the start of every input that includes them: NaN, +-inf, -0.0, +0.0,
#: the smallest float32 subnormal and values near the float32 limits.
SPECIALS = (math.nan, math.inf, -math.inf, -0.0, 0.0, 1e-45, -1e-45, 3.0e38, -3.0e38)


def _raw(t: torch.Tensor) -> bytes:
    a = t.detach().cpu().contiguous().view(_BITS[t.dtype]).numpy()
    return a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


def pack(t: torch.Tensor) -> str:
    """``"<dtype>:<base64(zlib(shuffled raw little-endian bits))>"`` (shape is the caller's to know).

    The bytes are shuffled (all first bytes of the elements, then all second bytes, ...),
    which lets zlib see the repeats in exponents and high bytes.
    """
    raw = np.frombuffer(_raw(t), dtype=np.uint8).reshape(-1, t.element_size()).T.tobytes()
    return f"{str(t.dtype).removeprefix('torch.')}:{base64.b64encode(zlib.compress(raw, 9)).decode()}"


def unpack(s: str, shape=None) -> torch.Tensor:
    """The tensor :func:`pack` stored, bit for bit (flat unless ``shape`` is given)."""
    name, data = s.split(":", 1)
    dtype = _NAMES[name]
    bits = _BITS[dtype]
    native = torch.empty((), dtype=bits).numpy().dtype
    raw = np.frombuffer(zlib.decompress(base64.b64decode(data)), dtype=np.uint8)
    raw = raw.reshape(native.itemsize, -1).T.tobytes()
    t = torch.from_numpy(np.frombuffer(raw, dtype=native.newbyteorder("<")).astype(native)).view(dtype)
    return t if shape is None else t.reshape(shape)


def digest(t: torch.Tensor) -> str:
    """A short digest of a tensor's dtype, shape and bits."""
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode() + _raw(t))
    return h.hexdigest()[:16]


def write_recording(doc: dict, generator_file: str, name: str, out_path: str | None = None) -> str:
    """Write ``doc`` as compact JSON to ``out_path`` or to ``name`` beside ``generator_file``; returns the path."""
    path = out_path or os.path.join(os.path.dirname(os.path.abspath(generator_file)), name)
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")
    return path


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: the same bits, or both NaN (any payload)."""
    a, b = a.detach().contiguous(), b.detach().contiguous()
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    same = a.view(_BITS[a.dtype]) == b.view(_BITS[b.dtype])
    if a.is_floating_point():
        same |= torch.isnan(a.float()) & torch.isnan(b.float())
    return same


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def affine_input(seed: int, shape: tuple[int, ...], scale: torch.Tensor, offset: torch.Tensor, qmin: int,
                 qmax: int, *, specials: bool = True) -> torch.Tensor:
    """Float32 values over an affine grid ``(q + o) * s`` and beyond it, ties included.

    ``scale``/``offset`` broadcast to ``shape`` (per tensor, per channel, or already
    expanded per block). Half the values are uniform over ``[qmin + o - 3, qmax + o + 3]``
    steps, a quarter exact half steps ``(k + 0.5) * s`` inside the grid (ties), a quarter
    exact grid points; then :data:`SPECIALS` at the start if ``specials``.
    """
    g = _gen(seed)
    n = math.prod(shape)
    s = torch.broadcast_to(scale.double(), shape).reshape(-1)
    o = torch.broadcast_to(offset.double(), shape).reshape(-1)
    lo, hi = qmin + o, qmax + o
    u = lo - 3 + torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo + 6)
    k = torch.floor(lo + torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo))
    kind = torch.randint(0, 4, (n,), generator=g)
    v = torch.where(kind == 0, k + 0.5, torch.where(kind == 1, k, u))
    x = (v * s).float()
    if specials:
        x[: len(SPECIALS)] = torch.tensor(SPECIALS, dtype=torch.float32)
    return x.reshape(shape)


def calibration_batches(seed: int, shape: tuple[int, ...], num_batches: int) -> list[torch.Tensor]:
    """Batches whose rows differ in sign and spread (row 0 positive only, row 1 negative only, row 2
    centred, row 3 skewed, then repeating), growing and shrinking from batch to batch."""
    g = _gen(seed)
    rows = shape[0]
    batches = []
    for b in range(num_batches):
        z = torch.randn(shape, generator=g, dtype=torch.float64)
        scale = 1.0 + 0.5 * math.sin(b + 1)
        out = torch.empty(shape, dtype=torch.float64)
        for r in range(rows):
            kind = r % 4
            if kind == 0:
                out[r] = 2.0 + z[r].abs() * scale
            elif kind == 1:
                out[r] = -0.5 - z[r].abs() * scale * 3
            elif kind == 2:
                out[r] = z[r] * scale
            else:
                out[r] = z[r].exp() * scale - 0.4
        batches.append(out.float())
    return batches


def degenerate_input(seed: int, shape: tuple[int, ...], group: int) -> torch.Tensor:
    """A calibration batch with a zero row, a tiny row (``1e-12`` times its values) and a constant group."""
    x = calibration_batches(seed, shape, 1)[0]
    x[0] = 0.0
    x[1] = x[1] * 1e-12
    x[2, :group] = 0.25
    return x


def signed_specials_input(seed: int, shape: tuple[int, ...], unsigned: bool) -> torch.Tensor:
    """A calibration batch (its absolute value if ``unsigned``) with :data:`SPECIALS` and ``2**-130`` in row 0
    (only the non-negative ones if ``unsigned``)."""
    x = calibration_batches(seed, shape, 1)[0]
    specials = [v for v in SPECIALS if not (unsigned and v < 0)] + [2.0**-130]
    if unsigned:
        x = x.abs()
    x[0, : len(specials)] = torch.tensor(specials)
    return x


def float_input(seed: int, n: int, lowest: int, highest: int, mantissa_bits: int, *,
                specials: bool = True) -> torch.Tensor:
    """Float32 values ``+-2**k * (1 + j / 2**(m + 2))`` for integer ``k`` in ``[lowest, highest]``.

    With ``m = mantissa_bits``: a quarter of the values lie on the format's grid
    of that binade, a quarter exactly half way (ties), half at quarter steps or at a
    random float32 mantissa; zero and :data:`SPECIALS` at the start if ``specials``.
    ``k`` is clipped to float32's range (``2**-149`` to below ``2**128``).
    """
    g = _gen(seed)
    k = torch.randint(lowest, highest + 1, (n,), generator=g).clamp(-149, 127).double()
    j = torch.randint(0, 2 ** (mantissa_bits + 2), (n,), generator=g).double()
    frac = torch.where(torch.rand(n, generator=g) < 0.25, torch.rand(n, generator=g, dtype=torch.float64),
                       j / 2 ** (mantissa_bits + 2))
    sign = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0).double()
    x = (sign * torch.exp2(k) * (1 + frac)).float()
    if specials:
        x[: len(SPECIALS)] = torch.tensor(SPECIALS, dtype=torch.float32)
    return x


def float8_input(seed: int, shape: tuple[int, int], exponent_bits: int, mantissa_bits: int) -> torch.Tensor:
    """:func:`float_input` over an IEEE-like format's binades (and a few beyond), rows scaled by
    ``1, 1e-3, 37, 2**-20`` (repeating), so that per-row scales differ."""
    bias = 2 ** (exponent_bits - 1) - 1
    x = float_input(seed, shape[0] * shape[1], -bias - mantissa_bits - 3, 2 ** (exponent_bits - 1) + 1,
                    mantissa_bits, specials=False).double().reshape(shape)
    rows = torch.tensor([1.0, 1e-3, 37.0, 2.0**-20], dtype=torch.float64).repeat(shape[0])[: shape[0]]
    return (x * rows[:, None]).float()


def fpx_input(seed: int, exponent_bits: int, mantissa_bits: int, n: int = 512) -> torch.Tensor:
    """:func:`float_input` over a format's binades with ``+-0``, ``+-1e-45`` and ``+-3e38`` first (no NaN/inf)."""
    bias = 2 ** (exponent_bits - 1) - 1
    x = float_input(seed, n, -bias - mantissa_bits - 3, 2 ** (exponent_bits - 1) + 1, mantissa_bits, specials=False)
    x[:6] = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 3e38, -3e38])
    return x
