"""Results do not depend on memory layout or on the number of threads, in every dialect.

Layout: the same logical tensor as contiguous, ``channels_last``/``channels_last_3d``, a strided
slice of a larger buffer, a view with a storage offset, an expanded (zero-stride) view and a
permuted (transposed) view must give bit-identical results; and a permuted input with the
granularity axis permuted accordingly gives the permuted result (``f(x.permute(p)) ==
f(x).permute(p)``).

Threads: ``torch.set_num_threads(1)`` and ``2`` give bit-identical forward results and
gradients (tensors large enough for the native kernels to split the work), and the previous
thread count is restored afterwards.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, note
from hypothesis import strategies as st

import quanta.quantization.affine as A
from quanta.dtypes import to_affine_quantized_intx_static
from quanta.kernels import native
from quanta.quantization import quant_primitives as P
from quanta.quantization.float import FloatQuantizeDequantize
from quanta.tensor_quant import fake_tensor_quant, tensor_quant

_INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
             torch.float64: torch.int64}


def assert_bits(a: torch.Tensor, b: torch.Tensor, what: str = "") -> None:
    assert a.dtype == b.dtype and a.shape == b.shape, (what, a.dtype, b.dtype, a.shape, b.shape)
    a, b = a.detach().contiguous(), b.detach().contiguous()
    if not a.is_floating_point():
        assert torch.equal(a, b), f"{what}: {int((a != b).sum())} element(s) differ"
        return
    na, nb = torch.isnan(a), torch.isnan(b)
    assert torch.equal(na, nb), f"{what}: NaN positions differ"
    diff = (a.view(_INT_VIEW[a.dtype]) != b.view(_INT_VIEW[b.dtype])) & ~na
    assert not bool(diff.any()), f"{what}: {int(diff.sum())} element(s) differ"


def plain(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t


@dataclass
class Setup:
    """A tensor ``x`` and one granularity, with the parameters of every dialect for it."""

    x: torch.Tensor
    gran: str
    axis: int
    block: int
    scale: torch.Tensor  # full rank, one entry per block
    offset: torch.Tensor

    @property
    def block_size(self) -> tuple[int, ...] | None:  # AIMET
        if self.gran != "block":
            return None
        return tuple(self.block if d == self.axis else -1 for d in range(self.x.dim()))

    @property
    def torchao_block(self) -> tuple[int, ...]:
        if self.gran == "tensor":
            return tuple(self.x.shape)
        b = 1 if self.gran == "channel" else self.block
        return tuple(b if d == self.axis else n for d, n in enumerate(self.x.shape))

    @property
    def amax_step(self) -> torch.Tensor:  # TensorRT: per tensor / per axis (a block's scale per element)
        if self.gran != "block":
            return self.scale
        return self.scale.repeat_interleave(self.block, dim=self.axis)

    def permuted(self, perm: tuple[int, ...]) -> "Setup":
        return Setup(self.x.permute(perm), self.gran, perm.index(self.axis), self.block,
                     self.scale.permute(perm), self.offset.permute(perm))

    def with_x(self, x: torch.Tensor) -> "Setup":
        return Setup(x, self.gran, self.axis, self.block, self.scale, self.offset)


def make_setup(shape, gran, axis, block, dtype, seed, qmin=-128, qmax=127) -> Setup:
    g = torch.Generator().manual_seed(seed)
    sshape = [1] * len(shape)
    if gran == "channel":
        sshape[axis] = shape[axis]
    elif gran == "block":
        sshape[axis] = shape[axis] // block
    scale = torch.pow(10.0, torch.rand(sshape, generator=g) * 4 - 3)
    offset = torch.randint(-qmax, -qmin + 1, sshape, generator=g).float()
    x = torch.randn(shape, generator=g, dtype=torch.float64) * scale.double().max() * 60
    # ties and specials sprinkled in
    flat = x.view(-1)
    n = flat.numel()
    idx = torch.randint(0, n, (max(1, n // 8),), generator=g)
    flat[idx] = torch.floor(flat[idx]) + 0.5
    flat[torch.randint(0, n, (1,), generator=g)] = math.nan
    flat[torch.randint(0, n, (1,), generator=g)] = -0.0
    return Setup(x.to(dtype), gran, axis, block, scale, offset)


# ----------------------------------------------------------------------------------------- every dialect
GRID = {"qmin": -128, "qmax": 127}


def run_all(s: Setup) -> dict[str, torch.Tensor]:
    """Every dialect's outputs for one setup (plain tensors)."""
    x = s.x
    out = {}
    out["aimet.qdq"] = A.quantize_dequantize(x, s.scale, s.offset, **GRID, block_size=s.block_size)
    out["aimet.q"] = A.quantize(x, s.scale, s.offset, **GRID, block_size=s.block_size)
    out["aimet.dq"] = A.dequantize(out["aimet.q"], s.scale, s.offset, s.block_size)
    qm = A.QuantizeDequantize(tuple(s.scale.shape), block_size=s.block_size, **GRID)
    qm.set_range((-128 + s.offset) * s.scale, (127 + s.offset) * s.scale)
    with torch.no_grad():
        out["aimet.module"] = plain(qm(x))
    fq = FloatQuantizeDequantize(dtype=torch.float8_e4m3fn, shape=tuple(s.scale.shape), block_size=s.block_size)
    fq.set_range(s.scale * 448.0)
    out["float.module"] = plain(fq(x))
    zp = (-s.offset).to(torch.int32)
    xs = torch.where(torch.isnan(x), torch.zeros((), dtype=x.dtype), x)  # NaN has no integer code
    out["torchao.q"] = P.quantize_affine(xs, s.torchao_block, s.scale, zp, torch.int8)
    out["torchao.dq"] = P.dequantize_affine(out["torchao.q"], s.torchao_block, s.scale, zp, torch.int8)
    out["torchao.fake"] = P.fake_quantize_affine(x, s.torchao_block, s.scale, zp, torch.int8)
    aqt = to_affine_quantized_intx_static(xs, s.scale, zp, s.torchao_block, torch.int8)
    out["torchao.aqt"] = aqt.dequantize()
    amax = s.amax_step * 127
    out["trt.fake"] = fake_tensor_quant(x, amax, 8)
    if x.dtype == torch.float32:
        out["trt.q"] = tensor_quant(x, amax, 8)[0]
    return out


@st.composite
def setups(draw):
    rank = draw(st.integers(2, 5))
    shape = list(draw(st.lists(st.sampled_from([1, 2, 3, 4, 6, 8]), min_size=rank, max_size=rank)))
    while math.prod(shape) > 768:
        i = shape.index(max(shape))
        shape[i] = max(1, shape[i] // 2)
    gran = draw(st.sampled_from(["tensor", "channel", "block"]))
    axis = draw(st.integers(0, rank - 1))
    divisors = [d for d in range(1, shape[axis] + 1) if shape[axis] % d == 0]
    block = draw(st.sampled_from(divisors)) if gran == "block" else 1
    dtype = draw(st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
    seed = draw(st.integers(0, 2**31 - 1))
    return make_setup(tuple(shape), gran, axis, block, dtype, seed)


def same_values_other_layouts(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """The same logical tensor in other memory layouts."""
    views = {}
    if x.dim() in (4, 5):
        fmt = torch.channels_last if x.dim() == 4 else torch.channels_last_3d
        views["channels_last"] = x.contiguous(memory_format=fmt)
    big = torch.full((*x.shape[:-1], 2 * x.shape[-1]), 7.0, dtype=x.dtype)
    big[..., ::2] = x
    views["strided_slice"] = big[..., ::2]
    padded = torch.full((x.shape[0] + 1, *x.shape[1:]), 7.0, dtype=x.dtype)
    padded[1:] = x
    views["storage_offset"] = padded[1:]
    perm = tuple(reversed(range(x.dim())))
    views["transposed_copy"] = x.permute(perm).contiguous().permute(perm)  # same shape, reversed strides
    if x.shape[0] == 1:
        views["expanded"] = x[:1].expand(x.shape)
    return views


@given(s=setups())
def test_results_do_not_depend_on_memory_layout(s):
    note(f"shape={tuple(s.x.shape)} gran={s.gran} axis={s.axis} block={s.block} dtype={s.x.dtype}")
    ref = run_all(s)
    for name, view in same_values_other_layouts(s.x).items():
        assert torch.equal(view.contiguous().view(_INT_VIEW[view.dtype]), s.x.contiguous().view(_INT_VIEW[s.x.dtype]))
        got = run_all(s.with_x(view))
        for k in ref:
            assert_bits(got[k].contiguous(), ref[k].contiguous(), f"{k} on a {name} input")


@given(s=setups(), data=st.data())
def test_permuted_input_gives_permuted_result(s, data):
    """``f(x.permute(p)) == f(x).permute(p)`` with the scale (channel/block axis) permuted too."""
    perm = tuple(data.draw(st.permutations(range(s.x.dim())), label="perm"))
    note(f"shape={tuple(s.x.shape)} gran={s.gran} axis={s.axis} block={s.block} dtype={s.x.dtype} perm={perm}")
    ref = run_all(s)
    sp = s.permuted(perm)
    got = run_all(sp)
    got_contig = run_all(sp.with_x(sp.x.contiguous()))
    for k in ref:
        assert_bits(got[k].contiguous(), ref[k].permute(perm).contiguous(), f"{k} permuted by {perm}")
        assert_bits(got[k].contiguous(), got_contig[k].contiguous(), f"{k}: permuted view vs its contiguous copy")


# ----------------------------------------------------------------------------------------- threads
@contextlib.contextmanager
def num_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _forward_and_grads(s: Setup) -> dict[str, torch.Tensor]:
    out = {k: v.detach().clone() for k, v in run_all(s).items()}
    # gradients of AIMET's QDQ (input, scale, offset) and Q, float QDQ (input, learnable maxval),
    # TensorRT fake quant (input), torchao fake quant (input, scale)
    x = s.x.clone().requires_grad_()
    sc, of = s.scale.clone().requires_grad_(), s.offset.clone().requires_grad_()
    g = torch.linspace(-1, 1, x.numel(), dtype=torch.float64).reshape(x.shape).to(x.dtype)
    y = A.quantize_dequantize(x, sc, of, **GRID, block_size=s.block_size)
    dx, ds, do = torch.autograd.grad(y, (x, sc, of), g)
    out.update({"aimet.qdq.dx": dx, "aimet.qdq.ds": ds, "aimet.qdq.do": do})
    y = A.quantize(x, sc, of, **GRID, block_size=s.block_size)
    dx, ds, do = torch.autograd.grad(y, (x, sc, of), g.to(y.dtype))
    out.update({"aimet.q.dx": dx, "aimet.q.ds": ds, "aimet.q.do": do})
    (dx,) = torch.autograd.grad(A.quantize_dequantize(x, s.scale, s.offset, **GRID, block_size=s.block_size), x, g)
    out["aimet.qdq.dx_only"] = dx
    fq = FloatQuantizeDequantize(dtype=torch.float8_e4m3fn, shape=tuple(s.scale.shape), block_size=s.block_size)
    fq.maxval = torch.nn.Parameter(s.scale * 448.0)
    dx, dm = torch.autograd.grad(plain(fq(x)), (x, fq.maxval), g)
    out.update({"float.dx": dx, "float.dmaxval": dm})
    (dx,) = torch.autograd.grad(fake_tensor_quant(x, s.amax_step * 127, 8), x, g)
    out["trt.dx"] = dx
    zp = (-s.offset).clone().requires_grad_()  # a float zero point, so it gets a gradient too
    y = P.fake_quantize_affine(x, s.torchao_block, sc, zp, torch.int8)
    dx, ds, dz = torch.autograd.grad(y, (x, sc, zp), g)
    out.update({"torchao.dx": dx, "torchao.ds": ds, "torchao.dzp": dz})
    y = P.fake_quantize_affine(x, s.torchao_block, sc, sc * 3, torch.int32, 0, 15,
                               zero_point_domain=P.ZeroPointDomain.FLOAT)
    (ds,) = torch.autograd.grad(y, sc, g)
    out["torchao.float_domain.ds"] = ds
    if s.gran == "tensor":  # a 0-dim scale, as choose_qparams_affine returns per tensor
        s0 = s.scale.reshape(()).clone().requires_grad_()
        y = P.fake_quantize_affine(x, s.torchao_block, s0, None, torch.int8)
        (out["torchao.ds_0dim"],) = torch.autograd.grad(y, s0, g)
    return out


@pytest.mark.parametrize("path", ["native", "eager"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gran,axis,block", [("tensor", 0, 1), ("channel", 0, 1), ("channel", 1, 1),
                                             ("block", 1, 32), ("block", 0, 4)])
def test_results_do_not_depend_on_thread_count(gran, axis, block, dtype, path):
    """65536 elements: several native work chunks, parallel forward and backward.

    Regression: per-tensor scale gradients of the eager affine path, of float formats
    (``maxval``) and of torchao's fake quantization (scale, zero point) were ``torch.sum``
    to one value, whose rounding depends on the thread count.
    """
    s = make_setup((64, 1024), gran, axis, block, dtype, seed=1234)
    before = torch.get_num_threads()
    def kernels():
        return native.disabled() if path == "eager" else contextlib.nullcontext()

    with kernels(), num_threads(1):
        one = _forward_and_grads(s)
    with kernels(), num_threads(2):
        two = _forward_and_grads(s)
    assert torch.get_num_threads() == before, "thread count restored"
    assert one.keys() == two.keys()
    for k in one:
        assert_bits(one[k], two[k], f"{k}: 1 vs 2 threads")
