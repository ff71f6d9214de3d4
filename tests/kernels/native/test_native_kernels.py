"""The native kernel machinery: lazy build, fallback, determinism, layouts it covers."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from quanta.grids.affine import IntegerGrid
from quanta.kernels import affine as K
from quanta.kernels import native
from quanta.kernels.blocks import resolve_layout
from quanta.kernels.reference import quantize_dequantize_reference


def _run(code: str, **env) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=600)


def test_import_does_not_build_or_load(tmp_path):
    r = _run("""
        import quanta, quanta.quantization
        from quanta.kernels import native
        print(native.status())
    """, QUANTA_CACHE_DIR=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "not loaded yet"
    assert list(tmp_path.iterdir()) == []


def test_disabled_by_environment():
    r = _run("""
        import torch, quanta.quantization as Q
        from quanta.kernels import native
        y = Q.affine.quantize_dequantize(torch.tensor([0.26]), torch.tensor(0.1), torch.tensor(0.0), bitwidth=8)
        print(native.status(), y.item())
    """, QUANTA_NATIVE="0")
    assert r.returncode == 0, r.stderr
    status, value = r.stdout.strip().rsplit(" ", 1)
    assert status == "disabled by QUANTA_NATIVE=0" and float(value) == pytest.approx(0.3)


def test_failed_build_falls_back_to_eager_with_one_warning(tmp_path):
    r = _run("""
        import warnings, torch, quanta.quantization as Q
        from quanta.kernels import native
        from quanta.kernels.reference import quantize_dequantize_reference
        from quanta.grids.affine import IntegerGrid
        x = torch.randn(64, 64)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            y1 = Q.affine.quantize_dequantize(x, torch.tensor(0.01), torch.tensor(0.0), bitwidth=8)
            y2 = Q.affine.quantize_dequantize(x, torch.tensor(0.01), torch.tensor(0.0), bitwidth=8)
        ref = quantize_dequantize_reference(x, torch.tensor(0.01), torch.tensor(0.0), IntegerGrid(0, 255))
        print(len([m for m in w if "native kernels unavailable" in str(m.message)]), torch.equal(y1, ref),
              native.status().startswith("build or load failed"))
    """, QUANTA_CACHE_DIR=str(tmp_path), CXX="false")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "True", "True"]


@pytest.fixture
def lib():
    if native.library() is None:
        pytest.skip(f"native kernels unavailable: {native.status()}")
    return native.library()


@pytest.mark.parametrize(
    "x_shape, s_shape, block, psb",
    [
        ((4, 8), (), None, (1, 1, 32)),
        ((4, 8), (4, 1), None, (1, 4, 8)),
        ((4, 8), (1, 8), None, (4, 8, 1)),
        ((4, 8), (4, 2), (-1, 4), (1, 8, 4)),
        ((3, 4, 8), (4, 2), (-1, 4), (3, 8, 4)),
        ((2, 3, 5, 5), (3, 1, 1), None, (2, 3, 25)),
        ((4, 8), (2, 2), (2, 4), None),  # blocks in two separate dims: general (eager) path
    ],
)
def test_layout_coverage(x_shape, s_shape, block, psb):
    assert resolve_layout(x_shape, s_shape, block).psb() == psb


def test_non_contiguous_inputs(lib):
    g = IntegerGrid(-128, 127)
    x = torch.randn(16, 32).t()  # transposed view
    s = torch.rand(32, 1) * 0.05 + 0.01
    o = torch.zeros(32, 1)
    assert not x.is_contiguous()
    assert torch.equal(K.quantize_dequantize(x, s, o, g), quantize_dequantize_reference(x, s, o, g))
    xs = torch.randn(8, 64)[:, ::2]  # strided slice
    assert torch.equal(K.quantize_dequantize(xs, torch.tensor(0.02), torch.tensor(0.0), g),
                       quantize_dequantize_reference(xs, torch.tensor(0.02), torch.tensor(0.0), g))


@pytest.mark.parametrize("shape, s_shape, block", [((512, 256), (), None), ((512, 256), (512, 1), None),
                                                   ((64, 512), (1, 512), None), ((256, 256), (256, 4), (-1, 64))])
def test_gradient_sums_do_not_depend_on_thread_count(lib, shape, s_shape, block):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=gen)
    up = torch.randn(shape, generator=gen)
    grads = []
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            s = (torch.rand(s_shape, generator=torch.Generator().manual_seed(1)) * 0.05 + 0.01).requires_grad_()
            o = torch.zeros(s_shape).requires_grad_()
            K.quantize_dequantize(x, s, o, IntegerGrid(0, 255), block).backward(up)
            grads.append((s.grad.clone(), o.grad.clone()))
    finally:
        torch.set_num_threads(old)
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


def test_native_and_eager_gradients_agree(lib):
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(64, 128, generator=gen)
    up = torch.randn(64, 128, generator=gen)
    results = []
    for ctx in (native.disabled, lambda: torch.enable_grad()):
        with ctx():
            xs = x.clone().requires_grad_()
            s = torch.full((64, 2), 0.02).requires_grad_()
            o = torch.full((64, 2), -3.0).requires_grad_()
            K.quantize_dequantize(xs, s, o, IntegerGrid(0, 15), (-1, 64)).backward(up)
            results.append((xs.grad, s.grad, o.grad))
    assert torch.equal(results[0][0], results[1][0])  # elementwise: exact
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-5, atol=1e-5)  # sums: order may differ
    torch.testing.assert_close(results[0][2], results[1][2], rtol=1e-5, atol=1e-5)


def test_out_argument_reuses_the_buffer():
    g = IntegerGrid(0, 255)
    x = torch.randn(32, 32)
    buf = torch.empty_like(x)
    y = K.quantize_dequantize(x, torch.tensor(0.02), torch.tensor(0.0), g, out=buf)
    assert y.data_ptr() == buf.data_ptr()
    assert torch.equal(buf, quantize_dequantize_reference(x, torch.tensor(0.02), torch.tensor(0.0), g))
    x2 = x.clone()
    K.quantize_dequantize(x2, torch.tensor(0.02), torch.tensor(0.0), g, out=x2)  # in place
    assert torch.equal(x2, buf)
    with pytest.raises(ValueError, match="out must have shape"):
        K.quantize_dequantize(x, torch.tensor(0.02), torch.tensor(0.0), g, out=torch.empty(3))
    with pytest.raises(RuntimeError, match="autograd"):
        K.quantize_dequantize(x.requires_grad_(), torch.tensor(0.02), torch.tensor(0.0), g, out=buf)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("mode", [native.QDQ, native.Q])
@pytest.mark.parametrize("s_shape, block", [((), None), ((8, 1), None), ((8, 4), (-1, 8))])
def test_bound_call_equals_the_call_it_binds(lib, dtype, mode, s_shape, block):
    # ties x = (k + 0.5) * s included: the bound call passes the same constants through a struct
    gen = torch.Generator().manual_seed(3)
    s = torch.rand(s_shape, generator=gen) * 0.05 + 0.01
    o = torch.randint(-3, 3, s_shape, generator=gen).float()
    per_element = s.repeat_interleave(8, 1) if block else s
    x = ((torch.randint(-300, 300, (8, 32), generator=gen) + 0.5) * per_element).to(dtype)
    x[0] = torch.randn(32, generator=gen)
    p = K.plan(x, s_shape, IntegerGrid(-128, 127), block)
    call = p.native_call()
    fs, fo = p.flat(s), p.flat(o)
    bound = call.bind(mode, fs, fo)
    want, want_mask = call.forward(mode, x, fs, fo, want_mask=True)
    got, got_mask = bound.forward(x, want_mask=True)
    assert torch.equal(got, want) and torch.equal(got_mask, want_mask)
    inplace = x.clone()
    assert bound.forward(inplace, out=inplace)[0] is inplace and torch.equal(inplace, want)
    strided = torch.empty(32, 8, dtype=dtype).t()  # an out= that is not contiguous
    assert bound.forward(x, out=strided)[0] is strided and torch.equal(strided, want)
    assert torch.equal(bound.forward(x.t().contiguous().t())[0], want)  # a non-contiguous input


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_straight_through_equals_torch_where(dtype):
    gen = torch.Generator().manual_seed(5)
    g = torch.randn(37, 41, generator=gen).to(dtype)
    g[0, :4] = torch.tensor([float("nan"), -0.0, float("inf"), -float("inf")]).to(dtype)
    mask = torch.rand(37, 41, generator=gen) < 0.5
    mask[0, :4] = True
    for gg, mm in ((g, mask), (g.t(), mask.t())):  # contiguous and transposed
        got = native.straight_through(gg, mm)
        ref = torch.where(mm, gg, 0.0)
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert torch.equal(got.isnan(), ref.isnan())
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(ref))
        assert torch.equal(torch.signbit(got), torch.signbit(ref))
