"""Algebraic invariants of every dialect, over random shapes, granularities, grids, dtypes and scales.

What is checked, and the exact conditions (see docs/reliability.md):

* ``QDQ(x) == DQ(Q(x))`` bit for bit (NaN positions equal, every other bit pattern equal).
* ``Q(DQ(Q(x))) == Q(x)`` and ``QDQ(QDQ(x)) == QDQ(x)`` wherever the dtype that holds
  ``DQ``'s result resolves the grid there: ``ulp(y) <= s/2`` at ``y = DQ(Q(x))`` (always
  true in float32 for the grids and scales drawn here — asserted, so the condition is
  never vacuous there; float16/bfloat16 cannot resolve, e.g., ``1e-8``-sized steps).
* Error bound: for finite ``x`` inside the representable range ``[(qmin+o)·s, (qmax+o)·s]``
  with ``|x| + s <= finfo(dtype).max``::

      |QDQ(x) - x| <= s/2 + k·ulp32(|x| + s) + ulp_out(|x| + s)/2

  ``ulp_d(m)`` is the spacing of dtype ``d`` at magnitude ``m`` (the subnormal spacing
  below the normal range); ``k = 1`` for the dialects that divide by ``s`` (AIMET) or
  multiply by an exact ``1/s`` (TensorRT: ``scale`` is the multiplier, the step is
  ``1/scale``), ``k = 2`` for torchao's ``x * (1/s)`` (``1/s`` is rounded too).
  torchao casts codes and zero points to the output dtype before subtracting (as
  torchao does), so in float16/bfloat16 its bound holds where ``|q|``, ``|zp|`` and
  ``|q - zp|`` are exact in that dtype (``<= 2048`` / ``<= 256``).
* Monotonic: ``x <= y  =>  QDQ(x) <= QDQ(y)`` (same scale entry).
* One path: results do not depend on ``requires_grad`` / ``no_grad``.
* The dialects agree where they express the same quantization: AIMET ``offset = -zero_point``
  equals torchao, TensorRT's amax-symmetric equals AIMET with ``s = amax / max_bound`` on the
  same grid, AIMET float8 equals torchao float8 and TensorRT's e4m3 — bit for bit where the
  arithmetic coincides (power-of-two scales: ``x / s == x * (1/s)``), otherwise codes differ
  by at most one step and only next to a rounding tie.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import assume, given, note
from hypothesis import strategies as st

import quanta.quantization.affine as A
from quanta.quantization import quant_primitives as P
from quanta.quantization.float import FloatQuantizeDequantize
from quanta.quantization.quant_primitives import MappingType
from quanta.tensor_quant import fake_e4m3_quant, fake_tensor_quant, tensor_quant

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_MANTISSA = {torch.float32: 23, torch.float16: 10, torch.bfloat16: 7, torch.float64: 52}
_INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
             torch.float64: torch.int64}
_EXACT_INT = {torch.float16: 2**11, torch.bfloat16: 2**8, torch.float32: 2**24, torch.float64: 2**53}


# ----------------------------------------------------------------------------------------- helpers
def ulp(dtype: torch.dtype, mag: torch.Tensor) -> torch.Tensor:
    """Spacing of ``dtype`` at magnitude ``mag`` (float64), the subnormal spacing below the normal range."""
    fi = torch.finfo(dtype)
    m = mag.double().abs().clamp_min(fi.tiny)
    e = torch.floor(torch.log2(m))
    return torch.maximum(torch.exp2(e - _MANTISSA[dtype]), torch.tensor(fi.tiny * fi.eps, dtype=torch.float64))


def assert_bits(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    """Same dtype, shape, NaN positions and bit patterns elsewhere (so -0.0 != +0.0)."""
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    a, b = a.detach().contiguous(), b.detach().contiguous()
    na, nb = torch.isnan(a), torch.isnan(b)
    assert torch.equal(na, nb), f"{what}: NaN positions differ"
    diff = (a.view(_INT_VIEW[a.dtype]) != b.view(_INT_VIEW[b.dtype])) & ~na
    if bool(diff.any()):
        i = tuple(diff.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {int(diff.sum())} element(s) differ, first at {i}: {a[i].item()!r} vs "
                             f"{b[i].item()!r}")


def assert_values(a: torch.Tensor, b: torch.Tensor, what: str = "", where: torch.Tensor | None = None) -> None:
    """Equal values (``-0.0 == +0.0``) and NaN positions, optionally only ``where``."""
    a, b = a.detach().double(), b.detach().double()
    assert a.shape == b.shape, (what, a.shape, b.shape)
    keep = torch.ones_like(a, dtype=torch.bool) if where is None else where
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    bad = keep & ~same
    if bool(bad.any()):
        i = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {int(bad.sum())} element(s) differ, first at {i}: {a[i].item()!r} vs "
                             f"{b[i].item()!r}")


@dataclass
class Case:
    """One random quantization problem, in AIMET terms (torchao/TensorRT views derived from it)."""

    shape: tuple[int, ...]
    gran: str  # "tensor" | "channel" | "block"
    axis: int
    block: int
    qmin: int
    qmax: int
    grid_kwargs: dict
    dtype: torch.dtype
    scale: torch.Tensor  # float32, full rank (one entry per block)
    offset: torch.Tensor  # float32 integers, same shape
    strip: int  # leading singleton scale dims dropped for the AIMET call (its broadcast convention)
    seed: int

    @property
    def aimet_scale(self) -> torch.Tensor:
        return self.scale.reshape(self.scale.shape[self.strip:])

    @property
    def aimet_offset(self) -> torch.Tensor:
        return self.offset.reshape(self.offset.shape[self.strip:])

    @property
    def aimet_block_size(self) -> tuple[int, ...] | None:
        if self.gran != "block":
            return None
        return tuple(self.block if d == self.axis else -1 for d in range(len(self.shape)))[self.strip:]

    @property
    def torchao_block(self) -> tuple[int, ...]:
        if self.gran == "tensor":
            return self.shape
        b = 1 if self.gran == "channel" else self.block
        return tuple(b if d == self.axis else n for d, n in enumerate(self.shape))

    def expand(self, t: torch.Tensor) -> torch.Tensor:
        """A full-rank scale-shaped tensor repeated to the input's shape (float64)."""
        t = t.double()
        if self.gran == "block":
            t = t.repeat_interleave(self.block, dim=self.axis)
        return t.expand(self.shape)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def grids(draw):
    """(qmin, qmax, kwargs) from bitwidth 1–16 + signed, num_steps + signed, or explicit qmin/qmax."""
    kind = draw(st.sampled_from(["bitwidth", "num_steps", "explicit"]))
    if kind == "bitwidth":
        b, signed = draw(st.integers(1, 16)), draw(st.booleans())
        qmin, qmax = (-(2 ** (b - 1)), 2 ** (b - 1) - 1) if signed else (0, 2**b - 1)
        return qmin, qmax, {"bitwidth": b, "signed": signed}
    if kind == "num_steps":
        n, signed = draw(st.integers(1, 2**16 - 1)), draw(st.booleans())
        qmin, qmax = (-((n + 1) // 2), n // 2) if signed else (0, n)
        return qmin, qmax, {"num_steps": n, "signed": signed}
    bits = draw(st.integers(1, 16))
    span = draw(st.integers(1, 2**bits - 1))
    qmin = draw(st.integers(-(2**15), 2**15 - span))
    return qmin, qmin + span, {"qmin": qmin, "qmax": qmin + span}


@st.composite
def cases(draw, dtypes=DTYPES, max_numel: int = 512, grid=None, pow2_scale: bool | None = None):
    rank = draw(st.integers(1, 4))
    shape = list(draw(st.lists(st.sampled_from([1, 2, 3, 4, 6, 8]), min_size=rank, max_size=rank)))
    while math.prod(shape) > max_numel:  # keep examples small: halve the largest dimension
        i = shape.index(max(shape))
        shape[i] = max(1, shape[i] // 2)
    shape = tuple(shape)
    gran = draw(st.sampled_from(["tensor", "channel", "block"]))
    axis = draw(st.integers(0, rank - 1))
    block = draw(st.sampled_from(_divisors(shape[axis]))) if gran == "block" else 1
    qmin, qmax, grid_kwargs = draw(grids() if grid is None else grid)
    dtype = draw(st.sampled_from(dtypes))
    seed = draw(st.integers(0, 2**31 - 1))
    sshape = [1] * rank
    if gran == "channel":
        sshape[axis] = shape[axis]
    elif gran == "block":
        sshape[axis] = shape[axis] // block
    g = torch.Generator().manual_seed(seed)
    # scales log-uniform over [1e-8, 1e4] (or powers of two over the same span)
    exps = torch.rand(sshape, generator=g, dtype=torch.float64) * 12 - 8
    pow2 = draw(st.booleans()) if pow2_scale is None else pow2_scale
    scale = torch.exp2(torch.round(exps * math.log2(10))) if pow2 else torch.pow(10.0, exps)
    # offsets across the grid: zero on the grid ([-qmax, -qmin]) plus a few steps beyond either end
    offset = torch.randint(-qmax - 3, -qmin + 4, sshape, generator=g).double()
    # AIMET's scale may drop leading singleton dims (they broadcast): exercise both forms
    lead_ones = next((d for d, n in enumerate(sshape) if n != 1), rank)
    strip = draw(st.integers(0, lead_ones))
    return Case(shape, gran, axis, block, qmin, qmax, grid_kwargs, dtype, scale.float(), offset.float(), strip, seed)


def make_x(case: Case, s: torch.Tensor, o: torch.Tensor, *, specials: bool = True, nonnegative: bool = False
           ) -> torch.Tensor:
    """Values on, between (ties), near and beyond the grid, tiny/subnormal values, ±0 and (optionally) NaN/±inf.

    ``s``/``o`` are input-shaped float64 tensors: step and offset per element.
    """
    g = torch.Generator().manual_seed(case.seed ^ 0x5EED)
    shape = case.shape
    lo, hi = (case.qmin + o) * s, (case.qmax + o) * s
    u = torch.rand(shape, generator=g, dtype=torch.float64)
    k = torch.floor(case.qmin + o + u * (case.qmax - case.qmin + 1))  # integer grid positions
    kinds = torch.randint(0, 9 if specials else 7, shape, generator=g)
    tiny = torch.randn(shape, generator=g, dtype=torch.float64) * torch.pow(10.0, torch.rand(shape, generator=g,
                                                                            dtype=torch.float64) * 50 - 45)
    x = torch.where(kinds == 0, lo + (hi - lo) * u, torch.zeros((), dtype=torch.float64))  # inside
    x = torch.where(kinds == 1, (k + 0.5) * s, x)  # exact ties (before the cast to dtype)
    x = torch.where(kinds == 2, k * s, x)  # grid points
    x = torch.where(kinds == 3, lo - s * (1 + 20 * u), x)  # below the range
    x = torch.where(kinds == 4, hi + s * (1 + 20 * u), x)  # above the range
    x = torch.where(kinds == 5, tiny, x)  # tiny, subnormal
    x = torch.where(kinds == 6, torch.where(u < 0.5, 0.0, -0.0), x)  # ±0
    if specials:
        x = torch.where(kinds == 7, torch.where(u < 0.5, math.inf, -math.inf), x)
        x = torch.where(kinds == 8, math.nan, x)
    if nonnegative:
        x = x.abs()
    return x.to(case.dtype)


def nudge_up(x: torch.Tensor, seed: int) -> torch.Tensor:
    """``y >= x`` elementwise in ``x``'s dtype: x itself, its next float, or x plus a random amount."""
    g = torch.Generator().manual_seed(seed ^ 0xBEEF)
    u = torch.rand(x.shape, generator=g, dtype=torch.float64)
    xd = x.double()
    step = torch.where(u < 0.3, 0.0, xd.abs() * u * 0.2 + ulp(x.dtype, xd))
    y = (xd + step).to(x.dtype)
    y = torch.where(y < x, torch.nextafter(x, torch.full_like(x, math.inf)), y)
    return y


def check_bound(out: torch.Tensor, x: torch.Tensor, step: torch.Tensor, inside: torch.Tensor, k: int,
                what: str) -> None:
    xd = x.double()
    mag = xd.abs() + step
    bound = step / 2 + k * ulp(torch.float32, mag) + ulp(out.dtype, mag) / 2
    err = (out.double() - xd).abs()
    bad = inside & ~(err <= bound)
    if bool(bad.any()):
        i = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(f"{what}: |QDQ(x) - x| = {err[i].item()!r} > bound {bound[i].item()!r} at {i} "
                             f"(x={xd[i].item()!r}, step={step[i].item()!r}, out={out[i].item()!r})")


def check_monotonic(f, x: torch.Tensor, seed: int, what: str) -> None:
    y = nudge_up(x, seed)
    fx, fy = f(x).double(), f(y).double()
    ok = torch.isnan(fx) | torch.isnan(fy) | (fx <= fy)
    assert bool(ok.all()), f"{what}: not monotonic at {int((~ok).sum())} element(s)"


def resolvable(y: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """Where ``y``'s dtype resolves the grid: finite and ``ulp(y) <= step/2``."""
    return torch.isfinite(y) & (ulp(y.dtype, y.double()) <= step / 2)


def aimet_call(f, x, case, s=None, o=None, **extra):
    s = case.aimet_scale if s is None else s
    o = case.aimet_offset if o is None else o
    return f(x, s, o, **case.grid_kwargs, block_size=case.aimet_block_size, **extra)


def torchao_dtype(qmin: int, qmax: int) -> torch.dtype:
    for dt, (lo, hi) in ((torch.uint8, (0, 255)), (torch.int8, (-128, 127)), (torch.int16, (-(2**15), 2**15 - 1)),
                         (torch.int32, (-(2**31), 2**31 - 1))):
        if lo <= qmin and qmax <= hi:
            return dt
    raise AssertionError((qmin, qmax))


# ----------------------------------------------------------------------------------------- AIMET, functional
@given(case=cases())
def test_aimet_functional_invariants(case):
    s_full, o_full = case.expand(case.scale), case.expand(case.offset)
    x = make_x(case, s_full, o_full)
    note(f"{case}")
    qdq = aimet_call(A.quantize_dequantize, x, case)
    q = aimet_call(A.quantize, x, case)
    dq = A.dequantize(q, case.aimet_scale, case.aimet_offset, case.aimet_block_size)
    assert qdq.dtype == x.dtype and dq.dtype == q.dtype
    assert_bits(qdq, dq.to(x.dtype), "QDQ(x) vs DQ(Q(x))")

    # Q(DQ(Q(x))) == Q(x), QDQ idempotent: where the result's dtype resolves the grid
    ok = resolvable(dq, s_full)
    if q.dtype == torch.float32:
        assert bool(ok[~torch.isnan(x)].all()), "float32 must resolve every grid drawn here"
    assert_values(aimet_call(A.quantize, dq, case), q, "Q(DQ(Q(x)))", where=ok | torch.isnan(x))
    ok = resolvable(qdq, s_full) | ~torch.isfinite(qdq)
    assert_bits(torch.where(ok, aimet_call(A.quantize_dequantize, qdq, case), qdq), qdq, "QDQ(QDQ(x))")

    # codes lie on the grid
    finite = ~torch.isnan(q)
    assert bool(((q[finite] >= case.qmin) & (q[finite] <= case.qmax) & (q[finite] == q[finite].round())).all())

    # error bound inside the representable range
    lo, hi = (case.qmin + o_full) * s_full, (case.qmax + o_full) * s_full
    xd = x.double()
    inside = torch.isfinite(xd) & (xd >= lo) & (xd <= hi) & (xd.abs() + s_full <= torch.finfo(x.dtype).max)
    check_bound(qdq, x, s_full, inside, 1, "AIMET QDQ")
    check_monotonic(lambda t: aimet_call(A.quantize_dequantize, t, case), x, case.seed, "AIMET QDQ")

    # one path: requires_grad on the input or the scale does not change a bit
    xg = x.clone().requires_grad_()
    sg = case.aimet_scale.clone().requires_grad_()
    assert_bits(aimet_call(A.quantize_dequantize, xg, case, s=sg), qdq, "QDQ with requires_grad")
    assert_bits(aimet_call(A.quantize, xg, case, s=sg), q, "Q with requires_grad")


@st.composite
def wide_grids(draw):
    b, signed = draw(st.integers(17, 32)), draw(st.booleans())
    qmin, qmax = (-(2 ** (b - 1)), 2 ** (b - 1) - 1) if signed else (0, 2**b - 1)
    return qmin, qmax, {"bitwidth": b, "signed": signed}


@given(case=cases(dtypes=(torch.float32,), grid=wide_grids()))
def test_aimet_wide_grids_qdq_equals_dq_q(case):
    """17–32-bit grids (float64 arithmetic beyond 2**21): QDQ == DQ(Q) stays bit-exact.

    Regression: on [-2**24, 2**24 - 1] the codes were float32, DQ added ``q + o`` in float32 and
    rounded it (|q + o| up to 2**25) while QDQ computed in float64.
    """
    s_full, o_full = case.expand(case.scale), case.expand(case.offset)
    x = make_x(case, s_full, o_full)
    qdq = aimet_call(A.quantize_dequantize, x, case)
    q = aimet_call(A.quantize, x, case)
    dq = A.dequantize(q, case.aimet_scale, case.aimet_offset, case.aimet_block_size)
    assert_bits(qdq, dq.to(x.dtype), "QDQ(x) vs DQ(Q(x))")
    ok = resolvable(dq, s_full) | torch.isnan(x)  # float32 DQ values resolve grids up to ~2**22 steps
    assert_values(aimet_call(A.quantize, dq, case), q, "Q(DQ(Q(x)))", where=ok)


def test_aimet_signed_25_bit_grid_regression():
    x = torch.tensor([-1e30, 0.0, 1e30])
    s, o = torch.tensor(8587.7178), torch.tensor(-10522801.0)
    q = A.quantize(x, s, o, 25, True)
    assert q.dtype == torch.float64  # float32 holds the codes, but not q + o
    assert_bits(A.dequantize(q, s, o).float(), A.quantize_dequantize(x, s, o, 25, True))


@given(case=cases(dtypes=(torch.float32,), grid=wide_grids()), narrow=st.booleans())
def test_tensorrt_wide_grids_codes_over_scale_equal_fake(case, narrow):
    """num_bits 17–32: ``codes / scale == fake_tensor_quant`` bit for bit.

    Regression: for num_bits 22–25 the arithmetic ran in float64 but codes and scale came back in
    float32, so the returned scale was rounded and ``codes / scale`` differed from the fake result.
    """
    nb, unsigned = case.grid_kwargs["bitwidth"], not case.grid_kwargs["signed"]
    per_channel(case)
    mb = 2 ** (nb - 1 + int(unsigned)) - 1
    amax = (case.scale.double() * mb).float()
    step_full = case.expand(case.scale)
    x = make_x(case, step_full, torch.zeros_like(step_full), nonnegative=unsigned)
    codes, scale = tensor_quant(x, amax, nb, unsigned, narrow)
    fake = fake_tensor_quant(x, amax, nb, unsigned, narrow)
    assert codes.dtype == scale.dtype == (torch.float64 if nb >= 22 else torch.float32)
    assert_bits((codes / scale).to(x.dtype), fake, "codes / scale vs fake_tensor_quant")


# ----------------------------------------------------------------------------------------- AIMET, modules
@given(case=cases(), symmetric=st.booleans(), data=st.data())
def test_aimet_module_invariants(case, symmetric, data):
    """Quantize / QuantizeDequantize modules: equal to the functional API with their encoding, QDQ == DQ(Q)."""
    if "bitwidth" in case.grid_kwargs:
        b = case.grid_kwargs["bitwidth"]
        kwargs = {"bitwidth": b, "symmetric": symmetric}
        qmin, qmax = (-(2 ** (b - 1)), 2 ** (b - 1) - 1) if symmetric else (0, 2**b - 1)
    else:
        qmin, qmax = case.qmin, case.qmax
        kwargs = {"qmin": qmin, "qmax": qmax, "symmetric": symmetric}
    shape = tuple(case.aimet_scale.shape)
    qm = A.Quantize(shape, block_size=case.aimet_block_size, **kwargs)
    qdqm = A.QuantizeDequantize(shape, block_size=case.aimet_block_size, **kwargs)
    lo = ((qmin + case.aimet_offset.double()) * case.aimet_scale.double()).float()
    hi = ((qmax + case.aimet_offset.double()) * case.aimet_scale.double()).float()
    lo, hi = torch.minimum(lo, hi), torch.maximum(lo, hi)
    if data.draw(st.booleans(), label="range straddles zero"):
        lo, hi = torch.minimum(lo, torch.zeros(())), torch.maximum(hi, torch.zeros(()))
    for m in (qm, qdqm):
        m.set_range(lo, hi)
    enc = qdqm.get_encodings()
    s, o = enc.scale.detach(), enc.offset.detach()
    s_full, o_full = case.expand(s.reshape(case.scale.shape)), case.expand(o.reshape(case.scale.shape))
    x = make_x(case, s_full, o_full)
    grid = {"qmin": qmin, "qmax": qmax}
    with torch.no_grad():
        y = qdqm(x)
        q = qm(x)
    assert type(y).__name__ == "DequantizedTensor" and type(q).__name__ == "QuantizedTensor"
    y, qt = y.as_subclass(torch.Tensor), q
    q = q.as_subclass(torch.Tensor)
    assert_bits(y, A.quantize_dequantize(x, s, o, **grid, block_size=case.aimet_block_size), "module QDQ")
    assert_bits(q, A.quantize(x, s, o, **grid, block_size=case.aimet_block_size), "module Q")
    assert_bits(qt.dequantize().as_subclass(torch.Tensor).to(x.dtype), y, "Q module .dequantize() vs QDQ module")
    # values, not bits: Q keeps the sign of -0.0 (AIMET prints -0. codes), QDQ gives +0.0 (-0 + 0);
    # and only where the input dtype resolves the grid at QDQ(x)
    ok = resolvable(y, s_full)
    assert_values(qdqm(x).quantize().as_subclass(torch.Tensor), q, "QDQ module .quantize() vs Q module",
                  where=ok | torch.isnan(x))
    ok = ok | ~torch.isfinite(y)
    with torch.no_grad():
        assert_bits(torch.where(ok, qdqm(y).as_subclass(torch.Tensor), y), y, "QDQ module idempotent")
    # autograd on (input and range): same bits
    xg = x.clone().requires_grad_()
    assert_bits(qdqm(xg).as_subclass(torch.Tensor), y, "module QDQ with autograd")
    assert_bits(qm(xg).as_subclass(torch.Tensor), q, "module Q with autograd")


# ----------------------------------------------------------------------------------------- torchao
@given(case=cases())
def test_torchao_invariants(case):
    s = case.scale
    zp = (-case.offset).to(torch.int32)
    s_full, o_full = case.expand(s), case.expand(case.offset)
    x = make_x(case, s_full, o_full)
    x = torch.where(torch.isnan(x), torch.zeros((), dtype=x.dtype), x)  # a NaN code raises (special-value table)
    tdt, blk, qmin, qmax = torchao_dtype(case.qmin, case.qmax), case.torchao_block, case.qmin, case.qmax
    note(f"{case} {tdt}")
    q = P.quantize_affine(x, blk, s, zp, tdt, qmin, qmax)
    assert q.dtype == tdt and bool(((q >= qmin) & (q <= qmax)).all())
    dq = P.dequantize_affine(q, blk, s, zp, tdt, qmin, qmax, output_dtype=x.dtype)
    fq = P.fake_quantize_affine(x, blk, s, zp, tdt, qmin, qmax)
    assert_bits(fq, dq, "fake_quantize_affine vs dequantize_affine(quantize_affine)")
    fq2, mask = P.fake_quantize_affine_cachemask(x, blk, s, zp, tdt, qmin, qmax)
    assert_bits(fq2, fq, "fake_quantize_affine_cachemask")
    # the mask marks codes that were not clamped (torchao's arithmetic: x * (1/s) in float32, then + zp)
    raw = torch.round(x.float() * (1.0 / case.expand(s).float())).double() - o_full
    assert torch.equal(mask, (raw >= qmin) & (raw <= qmax)), "cachemask"
    # Q(DQ(Q(x))) == Q(x): DQ in float32 resolves every grid drawn here
    dq32 = P.dequantize_affine(q, blk, s, zp, tdt, qmin, qmax, output_dtype=torch.float32)
    assert torch.equal(P.quantize_affine(dq32, blk, s, zp, tdt, qmin, qmax), q), "Q(DQ(Q(x)))"
    # idempotence and the error bound, where codes and zero points are exact in the output dtype
    qi, zpi = q.long(), (-o_full).long()
    lim = _EXACT_INT[x.dtype]
    exact = (qi.abs() <= lim) & (zpi.abs() <= lim) & ((qi - zpi).abs() <= lim)
    ok = exact & (resolvable(fq, s_full) | ~torch.isfinite(fq))
    assert_bits(torch.where(ok, P.fake_quantize_affine(fq, blk, s, zp, tdt, qmin, qmax), fq), fq, "fake idempotent")
    xd = x.double()
    lo, hi = (qmin + o_full) * s_full, (qmax + o_full) * s_full
    inside = exact & torch.isfinite(xd) & (xd >= lo) & (xd <= hi) & (xd.abs() + s_full <= torch.finfo(x.dtype).max)
    check_bound(fq, x, s_full, inside, 2, "torchao fake_quantize_affine")
    check_monotonic(lambda t: P.fake_quantize_affine(t, blk, s, zp, tdt, qmin, qmax), x, case.seed, "torchao")


# ----------------------------------------------------------------------------------------- TensorRT
@st.composite
def trt_cases(draw, dtypes=DTYPES, pow2_scale=None):
    unsigned = draw(st.booleans())
    narrow = draw(st.booleans())
    nb = draw(st.integers(1 if unsigned else 2, 16))
    mb = 2 ** (nb - 1 + int(unsigned)) - 1
    min_b = 0 if unsigned else (-mb if narrow else -mb - 1)
    grid = st.just((min_b, mb, {"qmin": min_b, "qmax": mb}))
    case = draw(cases(dtypes=dtypes, grid=grid, pow2_scale=pow2_scale))
    return case, nb, unsigned, narrow, mb


def per_channel(case: Case) -> None:
    """Turn a per-block case into per-channel along the same axis (each block's scale repeated), offsets 0."""
    if case.gran == "block":
        rep = case.shape[case.axis] // case.scale.shape[case.axis]
        case.scale = case.scale.repeat_interleave(rep, dim=case.axis)
        case.gran, case.block, case.strip = "channel", 1, 0
    case.offset = torch.zeros_like(case.scale)


@given(tc=trt_cases())
def test_tensorrt_invariants(tc):
    case, nb, unsigned, narrow, mb = tc
    per_channel(case)  # TensorRT has no blocks: per tensor or per axis
    step = case.scale
    amax = (step.double() * mb).float()
    scale32 = torch.where(amax <= 2.0**-24, torch.ones(()), (torch.tensor(float(mb)) / amax))  # the multiplier
    step_full = case.expand(1.0 / scale32.double())
    x = make_x(case, step_full, torch.zeros_like(step_full), nonnegative=unsigned)
    note(f"{case} nb={nb} unsigned={unsigned} narrow={narrow}")
    args = (nb, unsigned, narrow)
    fake = fake_tensor_quant(x, amax, *args)
    assert fake.dtype == x.dtype
    min_b = 0 if unsigned else (-mb if narrow else -mb - 1)
    codes_dt = x.dtype if max(-min_b, mb) <= _EXACT_INT[x.dtype] else torch.float32
    if not bool(torch.isfinite(scale32.to(codes_dt)).all()):  # the returned scale overflows float16: ValueError
        with pytest.raises(ValueError, match="overflows"):
            tensor_quant(x, amax, *args)
    else:
        codes, scale = tensor_quant(x, amax, *args)
        assert codes.dtype == codes_dt and scale.dtype == codes_dt
        assert bool(((codes >= min_b) & (codes <= mb))[~torch.isnan(x)].all())
        if torch.equal(scale.float().reshape(-1), scale32.reshape(-1)):
            # DQ(Q(x)) = codes / scale, bit-exact whenever the returned scale is the one used (always in float32)
            assert_bits((codes / scale).to(x.dtype), fake, "fake_tensor_quant vs tensor_quant / scale")
        else:
            assert codes_dt != torch.float32, "float32 must return the scale it used"
        ok = resolvable(fake, case.expand(1.0 / scale32.double()))
        assert_values(tensor_quant(fake, amax, *args)[0], codes, "Q(DQ(Q(x)))", where=ok | torch.isnan(x))
    tiny = case.expand((amax <= 2.0**-24).double()) > 0
    assert bool((fake[tiny & ~torch.isnan(x)] == 0).all()), "amax <= 2**-24 gives zeros"
    ok = resolvable(fake, step_full) | ~torch.isfinite(fake)
    assert_bits(torch.where(ok, fake_tensor_quant(fake, amax, *args), fake), fake, "fake idempotent")
    xd = x.double()
    lo = min_b * step_full
    inside = ~tiny & torch.isfinite(xd) & (xd >= lo) & (xd <= mb * step_full) & \
        (xd.abs() + step_full <= torch.finfo(x.dtype).max)
    check_bound(fake, x, step_full, inside, 1, "fake_tensor_quant")
    check_monotonic(lambda t: fake_tensor_quant(t, amax, *args), x, case.seed, "fake_tensor_quant")
    assert_bits(fake_tensor_quant(x.clone().requires_grad_(), amax, *args), fake, "with requires_grad")


# ----------------------------------------------------------------------------------------- float formats
FORMATS = [
    {"dtype": torch.float8_e4m3fn}, {"dtype": torch.float8_e5m2}, {"dtype": torch.float8_e4m3fnuz},
    {"dtype": torch.float8_e5m2fnuz}, {"exponent_bits": 4, "mantissa_bits": 3},
    {"exponent_bits": 2, "mantissa_bits": 1, "finite": True}, {"exponent_bits": 3, "mantissa_bits": 2, "finite": True},
    {"exponent_bits": 2, "mantissa_bits": 3, "finite": True}, {"exponent_bits": 5, "mantissa_bits": 0},
    {"exponent_bits": 3, "mantissa_bits": 0, "finite": True},
]


@given(case=cases(grid=st.just((-1, 1, {}))), fmt=st.sampled_from(FORMATS))
def test_float_format_invariants(case, fmt):
    q = FloatQuantizeDequantize(shape=tuple(case.aimet_scale.shape), block_size=case.aimet_block_size, **fmt)
    fmax = q.format.max
    q.set_range((case.aimet_scale.double() * fmax).float())
    s = q.get_scale()
    s_full = case.expand(s.reshape(case.scale.shape))
    g = torch.Generator().manual_seed(case.seed)
    v = torch.randn(case.shape, generator=g, dtype=torch.float64) * torch.pow(
        2.0, torch.randint(-12, 12, case.shape, generator=g).double()) * fmax / 16
    x = (v * s_full).to(case.dtype)
    note(f"{case} {q}")
    y = q(x)
    assert type(y).__name__ == "DequantizedTensor"
    y = y.as_subclass(torch.Tensor)
    # DQ(Q(x)) through the tensor API: values of the format, then times the scale
    yq = q(x).quantize()
    assert_bits(yq.dequantize().as_subclass(torch.Tensor).to(x.dtype), y, "float QDQ vs DQ(Q)")
    # idempotent where the output dtype holds the format's values times s exactly enough
    c = yq.as_subclass(torch.Tensor).double()  # values of the format
    fmt_ulp = torch.exp2(torch.floor(torch.log2(c.abs().clamp_min(2.0 ** q.format.emin))) - q.format.mantissa_bits)
    ok = torch.isfinite(y) & (ulp(y.dtype, y.double()) <= fmt_ulp * s_full / 4)
    assert_bits(torch.where(ok, q(y).as_subclass(torch.Tensor), y), y, "float QDQ idempotent")
    # error bound: half the format's spacing at x/s (times s), inside ±max
    xd = x.double()
    inside = torch.isfinite(xd) & (xd.abs() <= fmax * s_full) & (xd.abs() + s_full * fmax / 4 <=
                                                                 torch.finfo(x.dtype).max)
    v = xd / s_full
    sp = torch.exp2(torch.floor(torch.log2(v.abs().clamp_min(2.0 ** q.format.emin))) - q.format.mantissa_bits)
    mag = xd.abs() + sp * s_full
    bound = sp * s_full / 2 + ulp(torch.float32, mag) + ulp(x.dtype, mag) / 2
    bad = inside & ~((y.double() - xd).abs() <= bound)
    assert not bool(bad.any()), f"float bound violated at {bad.nonzero()[0].tolist()}"
    check_monotonic(lambda t: q(t).as_subclass(torch.Tensor), x, case.seed, "float QDQ")
    assert_bits(q(x.clone().requires_grad_()).as_subclass(torch.Tensor), y, "float QDQ with requires_grad")


# ----------------------------------------------------------------------------------------- dialects agree
@given(case=cases(pow2_scale=True))
def test_aimet_equals_torchao_power_of_two_scales(case):
    """offset = -zero_point: codes, dequantized values and fake quantization are equal (±0 compare equal)."""
    s = case.scale
    zp = (-case.offset).to(torch.int32)
    s_full, o_full = case.expand(s), case.expand(case.offset)
    x = make_x(case, s_full, o_full)
    x = torch.where(torch.isnan(x), torch.zeros((), dtype=x.dtype), x)
    tdt, blk = torchao_dtype(case.qmin, case.qmax), case.torchao_block
    qa = aimet_call(A.quantize, x, case)
    qt = P.quantize_affine(x, blk, s, zp, tdt, case.qmin, case.qmax)
    assert_values(qa, qt, "AIMET quantize vs torchao quantize_affine")
    lim = _EXACT_INT[x.dtype]
    exact = (qt.long().abs() <= lim) & (zp.long().abs().max() <= lim) & ((qt.long() + o_full.long()).abs() <= lim)
    assert_values(aimet_call(A.quantize_dequantize, x, case), P.fake_quantize_affine(x, blk, s, zp, tdt, case.qmin,
                  case.qmax), "AIMET QDQ vs torchao fake_quantize_affine", where=exact)
    assert_values(A.dequantize(qt, case.aimet_scale, case.aimet_offset, case.aimet_block_size),
                  P.dequantize_affine(qt, blk, s, zp, tdt, case.qmin, case.qmax), "AIMET DQ vs torchao DQ")


@given(case=cases(dtypes=(torch.float32,), pow2_scale=False))
def test_aimet_and_torchao_codes_differ_only_next_to_ties(case):
    """Any scale: torchao's ``x * (1/s)`` and AIMET's ``x / s`` pick different codes only next to a tie."""
    s = case.scale
    zp = (-case.offset).to(torch.int32)
    s_full, o_full = case.expand(s), case.expand(case.offset)
    x = make_x(case, s_full, o_full, specials=False)
    qa = aimet_call(A.quantize, x, case).double()
    qt = P.quantize_affine(x, case.torchao_block, s, zp, torchao_dtype(case.qmin, case.qmax), case.qmin,
                           case.qmax).double()
    diff = qa != qt
    assert bool(((qa - qt).abs() <= 1).all())
    v = x.double() / s_full
    near_tie = (v - torch.floor(v) - 0.5).abs() <= 4 * ulp(torch.float32, v)
    assert bool(near_tie[diff].all()), "codes differ away from a tie"


@given(tc=trt_cases(pow2_scale=True))
def test_tensorrt_equals_aimet_on_the_same_grid(tc):
    """fake_tensor_quant(x, amax) == AIMET QDQ(x, s = amax / max_bound, offset 0) on [min_bound, max_bound]."""
    case, nb, unsigned, narrow, mb = tc
    per_channel(case)
    step = case.scale
    amax = (step.double() * mb).float()
    assume(bool((amax > 2.0**-24).all()))
    step_full = case.expand(step)
    x = make_x(case, step_full, torch.zeros_like(step_full), nonnegative=unsigned)
    min_b = 0 if unsigned else (-mb if narrow else -mb - 1)
    grid = {"qmin": min_b, "qmax": mb}
    zero = torch.zeros_like(case.aimet_scale)
    a = A.quantize_dequantize(x, case.aimet_scale, zero, **grid, block_size=case.aimet_block_size)
    t = fake_tensor_quant(x, amax, nb, unsigned, narrow)
    assert_values(a, t, "AIMET QDQ vs fake_tensor_quant")
    if x.dtype == torch.float32:
        qa = A.quantize(x, case.aimet_scale, zero, **grid, block_size=case.aimet_block_size)
        assert_values(qa, tensor_quant(x, amax, nb, unsigned, narrow)[0], "AIMET Q vs tensor_quant codes")


@given(case=cases(grid=st.just((-1, 1, {})), pow2_scale=True), fp8=st.sampled_from(
    [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]))
def test_float8_dialects_agree(case, fp8):
    """AIMET FloatQuantizeDequantize(dtype=fp8) == torchao quantize/dequantize_affine_float8 (any scale), and
    == TensorRT's fake_e4m3_quant for e4m3fn with a power-of-two scale."""
    block = None if case.gran != "block" else tuple(case.block if d == case.axis else -1
                                                     for d in range(len(case.shape)))
    q = FloatQuantizeDequantize(dtype=fp8, shape=tuple(case.scale.shape), block_size=block)
    fmax = q.format.max
    q.set_range((case.scale.double() * fmax).float())
    s = q.get_scale()
    g = torch.Generator().manual_seed(case.seed)
    s_full = case.expand(s)
    v = torch.randn(case.shape, generator=g, dtype=torch.float64) * torch.pow(
        2.0, torch.randint(-14, 10, case.shape, generator=g).double()) * fmax / 8
    x = (v * s_full).to(case.dtype)
    a = q(x).as_subclass(torch.Tensor)
    codes = P.quantize_affine_float8(x, s, fp8)
    t = P.dequantize_affine_float8(codes, s, output_dtype=x.dtype)
    assert_values(a, t, "AIMET float8 vs torchao float8")
    if fp8 == torch.float8_e4m3fn and case.gran == "tensor":
        r = fake_e4m3_quant(x, (s * 448.0).reshape(()))
        assert_values(a, r, "AIMET float8 vs TensorRT fake_e4m3_quant")


# ----------------------------------------------------------------------------------------- special values
# The tables of docs/numerics.md, row by row. ``SUB`` is the smallest subnormal of the input dtype;
# ``-0.0`` and ``+0.0`` are told apart (sign bits compared); a row whose expected value is an exception
# type must raise it. Every row runs in float32, float16 and bfloat16 unless it lists dtypes.
SUB, NSUB = "SUB", "NSUB"  # the smallest subnormal of the input dtype, and its negative
_S, _O = torch.tensor(0.5), torch.tensor(0.0)
_G = {"qmin": -8, "qmax": 7}


def _aimet_module(cls):
    m = cls((), **_G)
    m.set_range(-4.0, 3.5)  # scale 0.5, offset 0 on [-8, 7]
    return lambda x: m(x).as_subclass(torch.Tensor)


def _float(**fmt):
    q = FloatQuantizeDequantize(**fmt)
    return lambda x: q(x).as_subclass(torch.Tensor)


def _grad(f):
    def g(x):
        x = x.clone().requires_grad_()
        (d,) = torch.autograd.grad(f(x).sum(), x)
        return d
    return g


_AQ = lambda x: A.quantize(x, _S, _O, **_G)  # noqa: E731
_AQDQ = lambda x: A.quantize_dequantize(x, _S, _O, **_G)  # noqa: E731
_PQ = lambda x: P.quantize_affine(x, tuple(x.shape), _S, torch.tensor(0), torch.int8, -8, 7)  # noqa: E731
_PF = lambda x: P.fake_quantize_affine(x, tuple(x.shape), _S, torch.tensor(0), torch.int8, -8, 7)  # noqa: E731
_TF = lambda x: fake_tensor_quant(x, torch.tensor(3.5), 4)  # noqa: E731  [-7, 7], scale 2
_TQ = lambda x: tensor_quant(x, torch.tensor(3.5), 4)[0]  # noqa: E731


def _float8(fp8):
    return lambda x: P.quantize_affine_float8(x, torch.tensor(1.0), fp8).float()


def _aqt_intx(x):
    from quanta.dtypes import to_affine_quantized_intx

    return to_affine_quantized_intx(x.reshape(1, -1), MappingType.SYMMETRIC, (1, x.numel()), torch.int8).dequantize()


def _aqt_static(x):
    from quanta.dtypes import to_affine_quantized_intx_static

    return to_affine_quantized_intx_static(x.reshape(1, -1), torch.tensor([0.5]), torch.tensor([0]),
                                           (1, x.numel()), torch.int8, -8, 7).dequantize().reshape(-1)


NAN, INF = math.nan, math.inf
SPECIAL_ROWS = [
    # --- AIMET functional and modules: Q / QDQ on [-8, 7], s = 0.5, o = 0
    *[(f"aimet {name}", f, [NAN, INF, -INF, 0.0, -0.0, -0.1, SUB, NSUB, 0.25, 0.75],
       [NAN, 7.0, -8.0, 0.0, -0.0, -0.0, 0.0, -0.0, 0.0, 2.0], None)
      for name, f in (("quantize", _AQ), ("Quantize module", _aimet_module(A.Quantize)))],
    *[(f"aimet {name}", f, [NAN, INF, -INF, 0.0, -0.0, -0.1, SUB, NSUB, 0.25, 0.75],
       [NAN, 3.5, -4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0], None)
      for name, f in (("quantize_dequantize", _AQDQ),
                      ("QuantizeDequantize module", _aimet_module(A.QuantizeDequantize)))],
    ("aimet quantize offset 3: -0.0 is not special", lambda x: A.quantize(x, _S, torch.tensor(3.0), **_G),
     [-0.0, 0.0], [-3.0, -3.0], None),
    ("aimet dequantize", lambda x: A.dequantize(x, _S, _O), [NAN, INF, -INF, 0.0, -0.0],
     [NAN, INF, -INF, 0.0, 0.0], None),
    ("aimet quantize, subnormal scale", lambda x: A.quantize(x, torch.tensor(2.0**-149), _O, 8, True),
     [2 * 2.0**-149, 3 * 2.0**-149, -5 * 2.0**-149], [2.0, 3.0, -5.0], (torch.float32,)),
    ("aimet quantize, x/s overflows", lambda x: A.quantize(x, torch.tensor(2.0**-27), _O, 8, True),
     [3e38, -3e38], [127.0, -128.0], (torch.float32, torch.bfloat16)),
    ("aimet quantize_dequantize, x/s overflows",
     lambda x: A.quantize_dequantize(x, torch.tensor(2.0**-27), _O, 8, True),
     [3e38, -3e38], [127 * 2.0**-27, -128 * 2.0**-27], (torch.float32, torch.bfloat16)),
    ("aimet quantize input gradient, x/s overflows",
     _grad(lambda x: A.quantize(x, torch.tensor(2.0**-27), _O, 8, True)), [3e38, -3e38, 2.0**-27],
     [0.0, 0.0, 2.0**27], (torch.float32,)),
    ("aimet quantize, ds where x/s overflows", lambda x: _aimet_scale_grad(x), [3e38, 1.0], [0.0], (torch.float32,)),
    ("aimet QDQ input gradient", _grad(_AQDQ), [NAN, INF, -INF, -0.0, 3.5, 3.8, -4.2, -4.3],
     [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0], (torch.float32,)),
    ("aimet quantized_repr of NaN", lambda x: _repr(x), [NAN], ValueError, None),
    # --- float formats (FloatQuantizeDequantize, scale 1)
    ("float e4m3fn", _float(dtype=torch.float8_e4m3fn),
     [NAN, INF, -INF, 1000.0, -1000.0, -0.0, 0.0, 1.5 * 2.0**-9, 0.5 * 2.0**-9, -0.5 * 2.0**-9, -0.25 * 2.0**-9],
     [NAN, 448.0, -448.0, 448.0, -448.0, -0.0, 0.0, 2.0**-8, 0.0, -0.0, -0.0], None),
    ("float e4m3 (AIMET, IEEE-like)", _float(exponent_bits=4, mantissa_bits=3), [NAN, INF, -INF, 1000.0, -0.0],
     [NAN, 240.0, -240.0, 240.0, -0.0], None),
    ("float e4m3fnuz", _float(dtype=torch.float8_e4m3fnuz), [NAN, INF, -0.0, -(2.0**-12), 0.0],
     [NAN, 240.0, 0.0, 0.0, 0.0], None),
    ("float e5m2fnuz", _float(dtype=torch.float8_e5m2fnuz), [NAN, -INF, -0.0], [NAN, -57344.0, 0.0],
     (torch.float32, torch.bfloat16)),
    ("float MX e2m1", _float(exponent_bits=2, mantissa_bits=1, finite=True), [NAN, INF, -INF, -0.0, 0.25, -0.25, 7.0],
     [NAN, 6.0, -6.0, -0.0, 0.0, -0.0, 6.0], None),
    ("float input gradient", _grad(_float(dtype=torch.float8_e4m3fn)), [NAN, INF, -0.0, 100.0, 448.0, 500.0],
     [0.0, 0.0, 1.0, 1.0, 1.0, 0.0], (torch.float32,)),
    # --- torchao primitives: int8 codes on [-8, 7], scale 0.5, zero point 0
    ("torchao quantize_affine", lambda x: _PQ(x).float(), [INF, -INF, 0.0, -0.0, SUB, NSUB, 0.25, 0.75],
     [7.0, -8.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0], None),
    ("torchao quantize_affine NaN", _PQ, [1.0, NAN], ValueError, None),
    ("torchao fake_quantize_affine", _PF, [NAN, INF, -INF, 0.0, -0.0, -0.1, SUB, 0.75],
     [NAN, 3.5, -4.0, 0.0, 0.0, 0.0, 0.0, 1.0], None),
    ("torchao fake_quantize_affine input gradient", _grad(_PF), [NAN, INF, -0.0, 3.5, 3.8],
     [0.0, 0.0, 1.0, 1.0, 0.0], (torch.float32,)),
    ("torchao dequantize_affine", lambda x: P.dequantize_affine(x.to(torch.int8), tuple(x.shape), _S, torch.tensor(0),
                                                                 torch.int8, -8, 7), [-8.0, 0.0, 7.0],
     [-4.0, 0.0, 3.5], None),
    ("torchao choose_qparams_affine NaN", lambda x: _cq(x), [1.0, NAN], ValueError, None),
    ("torchao choose_qparams_affine inf", lambda x: _cq(x), [1.0, -INF], ValueError, None),
    ("torchao choose_qparams_affine ±0 block: scale eps", lambda x: _cq(x)[0].float(), [0.0, -0.0],
     [2.0**-23], (torch.float32,)),
    *[(f"torchao quantize_affine_float8 {fp8}", _float8(fp8),
       [NAN, INF, -INF, -0.0, 1000.0, 1.5 * 2.0**-9, 0.5 * 2.0**-9], [NAN, 448.0, -448.0, -0.0, 448.0, 2.0**-8, 0.0],
       None) for fp8 in (torch.float8_e4m3fn,)],
    ("torchao quantize_affine_float8 e4m3fnuz", _float8(torch.float8_e4m3fnuz), [NAN, INF, -0.0],
     [NAN, 240.0, 0.0], None),
    ("torchao quantize_affine_float8 zero scale", lambda x: P.quantize_affine_float8(x, torch.tensor(0.0)).float(),
     [1.0, -1.0, 0.0], [0.0, 0.0, 0.0], None),
    ("torchao choose_qparams_affine_float8 all-zero block: scale 1",
     lambda x: P.choose_qparams_affine_float8(x.reshape(1, -1), (1, x.numel())).reshape(-1),
     [0.0, -0.0], [1.0], None),
    ("torchao choose_qparams_affine_float8 NaN",
     lambda x: P.choose_qparams_affine_float8(x.reshape(1, -1), (1, x.numel())), [1.0, NAN], ValueError, None),
    ("torchao float_to_fpx e3m2", lambda x: P.float_to_fpx(x, 3, 2).float(), [INF, -INF, -0.0, 0.0, 1000.0, NSUB],
     [31.0, 63.0, 32.0, 0.0, 31.0, 32.0], None),
    ("torchao fpx round trip keeps -0.0", lambda x: P.fpx_to_float(P.float_to_fpx(x, 3, 2), 3, 2), [-0.0, INF],
     [-0.0, 28.0], None),
    ("torchao fpx ties to even, subnormals", lambda x: P.fpx_to_float(P.float_to_fpx(x, 3, 2), 3, 2),
     [1.5 * 2.0**-4, 0.5 * 2.0**-4, 2.5 * 2.0**-4, -1.5 * 2.0**-4], [0.125, 0.0, 0.125, -0.125], None),
    ("torchao float_to_fpx NaN", lambda x: P.float_to_fpx(x, 3, 2), [NAN], ValueError, None),
    ("torchao quantize_affine_fpx NaN", lambda x: P.quantize_affine_fpx(x.reshape(1, -1), torch.ones(1), 3, 2),
     [1.0, NAN], ValueError, None),
    ("torchao choose_qparams_affine_fpx NaN", lambda x: P.choose_qparams_affine_fpx(x.reshape(1, -1), 3, 2),
     [1.0, NAN], ValueError, None),
    ("torchao choose_qparams_affine_with_min_max NaN", lambda x: P.choose_qparams_affine_with_min_max(
        x[:1], x[1:], MappingType.ASYMMETRIC, (1,), torch.uint8), [NAN, 1.0], ValueError, None),
    ("aqt from_hp_to_intx NaN", _aqt_intx, [1.0, NAN], ValueError, None),
    ("aqt from_hp_to_intx inf", _aqt_intx, [1.0, INF], ValueError, None),
    ("aqt from_hp_to_intx_static", _aqt_static, [INF, -INF, -0.0, 0.75], [3.5, -4.0, 0.0, 1.0], None),
    ("aqt from_hp_to_intx_static NaN", _aqt_static, [NAN], ValueError, None),
    ("aqt from_hp_to_floatx all-zero block", lambda x: _aqt_floatx(x), [0.0, -0.0], [0.0, -0.0], None),
    ("aqt from_hp_to_fpx NaN", lambda x: _aqt_fpx(x), [1.0, NAN], ValueError, None),
    # --- TensorRT: 4 bits, narrow [-7, 7], amax 3.5 (scale 2)
    ("trt fake_tensor_quant", _TF, [NAN, INF, -INF, 0.0, -0.0, -0.1, SUB, NSUB, 100.0],
     [NAN, 3.5, -3.5, 0.0, -0.0, -0.0, 0.0, -0.0, 3.5], None),
    ("trt tensor_quant", _TQ, [NAN, INF, -INF, 0.0, -0.0, -0.1, SUB, NSUB, 100.0],
     [NAN, 7.0, -7.0, 0.0, -0.0, -0.0, 0.0, -0.0, 7.0], None),
    ("trt amax <= 2**-24", lambda x: fake_tensor_quant(x, torch.tensor(2.0**-24)),
     [NAN, INF, -INF, 1.0, -1.0, -0.0, SUB, NSUB], [NAN, 0.0, -0.0, 0.0, -0.0, -0.0, 0.0, -0.0], None),
    ("trt amax <= 2**-24: scale 1", lambda x: tensor_quant(x, torch.tensor(0.0))[1].reshape(1).float(), [1.0],
     [1.0], None),
    ("trt fake_e4m3_quant", lambda x: fake_e4m3_quant(x, torch.tensor(448.0)),
     [NAN, INF, -INF, -0.0, 0.0, 1000.0, SUB, NSUB],
     [NAN, 448.0, -448.0, -0.0, 0.0, 448.0, 0.0, -0.0], None),
    ("trt input gradient", _grad(_TF), [NAN, INF, -INF, -0.0, 3.5, -3.5, 3.6], [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0],
     (torch.float32,)),
]


def _aimet_scale_grad(x):
    s = torch.tensor(1e-8, requires_grad=True)
    (ds,) = torch.autograd.grad(A.quantize(x, s, _O, 8, True).sum(), s)
    return ds.reshape(1)


def _repr(x):
    q = A.Quantize((), **_G)
    q.set_range(-4.0, 3.5)
    return q(x).quantized_repr()


def _cq(x):
    return P.choose_qparams_affine(x.reshape(1, -1), MappingType.SYMMETRIC, (1, x.numel()), torch.int8)


def _aqt_floatx(x):
    from quanta.dtypes import to_affine_quantized_floatx

    return to_affine_quantized_floatx(x.reshape(1, -1), (1, x.numel()), torch.float8_e4m3fn).dequantize().reshape(-1)


def _aqt_fpx(x):
    from quanta.dtypes import FloatxTensorCoreLayout, to_affine_quantized_fpx

    return to_affine_quantized_fpx(x.reshape(1, -1), FloatxTensorCoreLayout(3, 2))


def _sub_value(v, dtype):
    fi = torch.finfo(dtype)
    return {SUB: fi.tiny * fi.eps, NSUB: -fi.tiny * fi.eps}.get(v, v) if isinstance(v, str) else v


_SPECIAL_PARAMS = [pytest.param(f, inp, exp, dt, id=f"{name}/{str(dt)[6:]}")
                   for name, f, inp, exp, dts in SPECIAL_ROWS
                   for dt in (dts or DTYPES)]


@pytest.mark.parametrize("fn,inputs,expected,dtype", _SPECIAL_PARAMS)
def test_special_values_table(fn, inputs, expected, dtype):
    x = torch.tensor([_sub_value(v, dtype) for v in inputs], dtype=torch.float64).to(dtype)
    if isinstance(expected, type):
        with pytest.raises(expected):
            fn(x)
        return
    got = fn(x).detach().reshape(-1).double()
    want = torch.tensor(expected, dtype=torch.float64)
    assert got.shape == want.shape, (got, want)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan), (got.tolist(), expected)
    g, w = got[~nan], want[~nan]
    assert torch.equal(g, w), (got.tolist(), expected)
    assert torch.equal(torch.signbit(g), torch.signbit(w)), f"sign of zero: {got.tolist()} vs {expected}"
