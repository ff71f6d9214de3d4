"""quanta's native integer-linear kernels: every instruction-set path, every shape class, threads, fallback.

The AVX-512, AVX2 and portable paths follow one summation order per path
(decode GEMV for fewer than 8 rows, prefill GEMM from 8), so they must agree bit
for bit; each must also agree with the reference implementation within the
documented float32 bound (the int8 dynamic path exactly). On CPUs with
AVX512-BF16, bfloat16 activations take vdpbf16ps paths with their own order
(int4 at every M, int8 from 8 rows): checked against the reference within their
bound, and for not depending on threads or on the rows beside a row. Shapes
cover K not a multiple of 16 or of the group, odd N, and M from 1 to 600.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from quanta.kernels import int_linear_native as native
from quanta.kernels import int_linear_reference as ref
from quanta.kernels.int_linear import (
    int4_cpu_linear,
    int8_dynamic_activation_linear,
    int8_weight_only_linear,
    pack_int4_cpu,
    prepare_int8_dynamic,
    prepare_int8_weight_only,
    quantize_per_token_int8,
)

pytestmark = pytest.mark.skipif(native.ops() is None, reason=f"native kernels {native.status()}")

_ISAS = native.ISA_NAMES[: native.ISA_NAMES.index(native.cpu_isa()) + 1] if native.ops() is not None else ()
# the instruction sets that share one order for every dtype (avx512_bf16 runs its own on bfloat16 activations)
_EXACT_ISAS = tuple(i for i in _ISAS if i != "avx512_bf16")
_HAS_BF16 = "avx512_bf16" in _ISAS
_U = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}

# (M, N, K): M around the GEMV/GEMM switch (8) and the register blocks (4 rows, 6 rows), N odd and around the
# 16-row tiles and 64-row panels, K around the 16-lane chunks, the 64-k int4 blocks and the 128-k GEMM blocks
SHAPES = [(1, 1, 1), (1, 33, 100), (2, 17, 16), (3, 65, 129), (4, 7, 63), (5, 31, 17), (7, 64, 64),
          (8, 9, 300), (9, 66, 65), (13, 130, 257), (16, 33, 4), (33, 5, 128), (64, 127, 31), (600, 19, 45)]


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _per_isa(fn, isas=_EXACT_ISAS):
    """``fn()`` on every instruction set of ``isas`` this CPU has: results by name."""
    out = {}
    for isa in isas:
        with native.force_isa(isa):
            out[isa] = fn()
    return out


def _assert_all_equal(results):
    first = next(iter(results.values()))
    for isa, y in results.items():
        assert torch.equal(y, first), f"{isa} differs from {next(iter(results))}"


def _assert_within_bound(y, x, w_deq, bias, dtype, extra_terms=2, w_mag=None):
    k = w_deq.shape[1]
    xd = x.double().reshape(-1, k)
    want = xd @ w_deq.T
    mag = xd.abs() @ (w_deq.abs() if w_mag is None else w_mag).T
    b = 0.0 if bias is None else bias.double().abs()
    tol = (k + extra_terms) * 2.0**-24 * mag + _U[dtype] * (want.abs() + b) + 1e-30
    if bias is not None:
        want = want + bias.double()
    err = (y.double().reshape(want.shape) - want).abs()
    assert bool((err <= tol).all()), f"max excess {float((err - tol).max()):.3g}"


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_int8_weight_only_every_isa_same_bits(m, n, k, dtype):
    g = _gen(m * 1000 + n + k)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    qw, s = prepare_int8_weight_only(w, torch.rand(n, generator=g) * 0.02 + 1e-3)
    x = torch.randn(m, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype) if n % 2 else None
    results = _per_isa(lambda: int8_weight_only_linear(x, qw, s, bias))
    _assert_all_equal(results)
    _assert_within_bound(results[_ISAS[0]], x, w.double() * s.double()[:, None], bias, dtype)


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("group_size", [32, 128])
def test_int4_every_isa_same_bits(m, n, k, group_size):
    g = _gen(m * 1000 + n + k + group_size)
    groups = -(-k // group_size)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    packed, sz = pack_int4_cpu(codes, torch.rand(n, groups, generator=g) * 0.1 + 0.01,
                               torch.randn(n, groups, generator=g) * 0.1, group_size)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    results = _per_isa(lambda: int4_cpu_linear(x, packed, sz, group_size, n))
    _assert_all_equal(results)
    w_deq = ref.int4_dequantize_reference(packed, sz, group_size, n, k).double()
    _assert_within_bound(results[_ISAS[0]], x, w_deq, None, torch.bfloat16)


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("symmetric", [True, False])
def test_int8_dynamic_every_isa_equals_the_integer_reference(m, n, k, symmetric):
    g = _gen(m * 1000 + n + k + symmetric)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    wt, s_w, cs = prepare_int8_dynamic(w, torch.rand(n, generator=g) * 0.01 + 1e-3)
    x = (torch.randn(m, k, generator=g) + 0.3).to(torch.bfloat16)
    bias = torch.randn(n, generator=g) if m % 2 else None
    q, s_x, z_x = quantize_per_token_int8(x, symmetric=symmetric)
    want = ref.int8_dynamic_reference(q, z_x, s_x, w, s_w, cs, bias, x.dtype)
    results = _per_isa(lambda: int8_dynamic_activation_linear(x, wt, s_w, cs, bias, act_symmetric=symmetric),
                       _ISAS)
    for isa, y in results.items():
        assert torch.equal(y, want), isa


@pytest.mark.parametrize("group_size", [64, 256])
def test_int4_group_sizes_64_and_256_every_isa(group_size):
    n, k = 45, 700
    g = _gen(group_size)
    groups = -(-k // group_size)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    packed, sz = pack_int4_cpu(codes, torch.rand(n, groups, generator=g), torch.randn(n, groups, generator=g),
                               group_size)
    for m in (1, 3, 12):
        x = torch.randn(m, k, generator=g)
        results = _per_isa(lambda: int4_cpu_linear(x, packed, sz, group_size, n))
        _assert_all_equal(results)
        w_deq = ref.int4_dequantize_reference(packed, sz, group_size, n, k).double()
        _assert_within_bound(results[_ISAS[0]], x, w_deq, None, torch.float32)


_BF16 = pytest.mark.skipif(not _HAS_BF16, reason="this CPU has no AVX512-BF16")


def _int4_weight(n, k, group_size, g):
    groups = -(-k // group_size)
    codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    packed, sz = pack_int4_cpu(codes, torch.rand(n, groups, generator=g) * 0.1 + 0.01,
                               torch.randn(n, groups, generator=g) * 0.1, group_size)
    return codes, packed, sz


@_BF16
@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("group_size", [32, 64, 128, 256])
def test_int4_bf16_path_within_its_bound(m, n, k, group_size):
    """The factored order (s * sum x (c - 8) + z * sum x per group): float32 error of |x| (|s (c - 8)| + |z|)."""
    g = _gen(m * 1000 + n + k + group_size + 1)
    codes, packed, sz = _int4_weight(n, k, group_size, g)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    with native.force_isa("avx512_bf16"):
        y = int4_cpu_linear(x, packed, sz, group_size, n)
    gi = torch.arange(k) // group_size
    s, z = (t.double()[:, gi] for t in ref.unpack_int4_scale_zero(sz, n))
    mag = (s * (codes.double() - 8)).abs() + z.abs()
    _assert_within_bound(y, x, ref.int4_dequantize_reference(packed, sz, group_size, n, k).double(), None,
                         torch.bfloat16, extra_terms=8, w_mag=mag)


@_BF16
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_int8_bf16_path_within_bound(m, n, k):
    g = _gen(m * 1000 + n + k + 2)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    qw, s = prepare_int8_weight_only(w, torch.rand(n, generator=g) * 0.02 + 1e-3)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    bias = torch.randn(n, generator=g).to(torch.bfloat16) if n % 2 else None
    with native.force_isa("avx512_bf16"):
        y = int8_weight_only_linear(x, qw, s, bias)
    _assert_within_bound(y, x, w.double() * s.double()[:, None], bias, torch.bfloat16, extra_terms=4)


@_BF16
@pytest.mark.parametrize("m,group_size", [(9, 32), (20, 256), (70, 128)])
def test_bf16_gemms_across_k_blocks_within_their_bounds(m, group_size):
    """K = 2148 takes two of the GEMM's k blocks (2048, then the rest), the chain carried through C between them."""
    g = _gen(m + group_size)
    n, k = 67, 2148
    codes, packed, sz = _int4_weight(n, k, group_size, g)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    qw, s = prepare_int8_weight_only(w, torch.rand(n, generator=g) * 0.02 + 1e-3)
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    with native.force_isa("avx512_bf16"):
        y4, y8 = int4_cpu_linear(x, packed, sz, group_size, n), int8_weight_only_linear(x, qw, s)
    gi = torch.arange(k) // group_size
    sc, z = (t.double()[:, gi] for t in ref.unpack_int4_scale_zero(sz, n))
    _assert_within_bound(y4, x, ref.int4_dequantize_reference(packed, sz, group_size, n, k).double(), None,
                         torch.bfloat16, extra_terms=8, w_mag=(sc * (codes.double() - 8)).abs() + z.abs())
    _assert_within_bound(y8, x, w.double() * s.double()[:, None], None, torch.bfloat16, extra_terms=4)


@_BF16
def test_bf16_paths_rows_do_not_depend_on_threads_or_the_other_rows(at_thread_counts):
    g = _gen(11)
    n, k = 70, 300
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    qw, s = prepare_int8_weight_only(w, torch.rand(n, generator=g))
    _, packed, sz = _int4_weight(n, k, 32, g)
    # 75 rows cross the 64-row blocks, and int4 takes them 6 at a time against half panels (15 rows: 3 at a time
    # against whole ones): the same sums in the same order
    x = torch.randn(75, k, generator=g).to(torch.bfloat16)
    calls = {"int8": lambda a: int8_weight_only_linear(a, qw, s),
             "int4": lambda a: int4_cpu_linear(a, packed, sz, 32, n)}
    for name, f in calls.items():
        one, *more = at_thread_counts(lambda: (f(x), f(x[:3])), (1, 2, 3))
        for other in more:
            assert torch.equal(one[0], other[0]) and torch.equal(one[1], other[1]), name
        assert torch.equal(f(x[10:30]), one[0][10:30]), name
        assert torch.equal(f(x[60:75]), one[0][60:75]), name
        assert torch.equal(f(x[1:2]), one[1][1:2]), name  # decode rows


def test_decode_rows_do_not_depend_on_threads(at_thread_counts):
    g = _gen(8)
    n, k = 333, 200  # 21 tiles of 16 rows: runs of 10 and 11 (2 threads), 7 each (3)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    qw, s = prepare_int8_weight_only(w, torch.rand(n, generator=g))
    _, packed, sz = _int4_weight(n, k, 64, g)
    x = torch.randn(3, k, generator=g)
    for isa in _EXACT_ISAS:
        with native.force_isa(isa):
            one, *more = at_thread_counts(lambda: (int8_weight_only_linear(x, qw, s),
                                                    int4_cpu_linear(x, packed, sz, 64, n)), (1, 2, 3, 8))
        for other in more:
            assert torch.equal(one[0], other[0]) and torch.equal(one[1], other[1]), isa


def test_the_rows_of_one_call_do_not_depend_on_threads_or_the_other_rows(at_thread_counts):
    g = _gen(7)
    n, k = 200, 333
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    qw, s = prepare_int8_weight_only(w, torch.rand(n, generator=g))
    x = torch.randn(40, k, generator=g)
    one, two = at_thread_counts(lambda: int8_weight_only_linear(x, qw, s), (1, 2))
    assert torch.equal(one, two)
    # a row's result is the same whichever rows share its call, within one path (GEMM: >= 8 rows)
    assert torch.equal(int8_weight_only_linear(x[10:30], qw, s), one[10:30])
    assert torch.equal(int8_weight_only_linear(x[1:2], qw, s), int8_weight_only_linear(x[1:4], qw, s)[:1])


def test_special_values_propagate():
    qw, s = prepare_int8_weight_only(torch.ones(3, 20, dtype=torch.int8), torch.ones(3))
    for m in (1, 9):
        x = torch.zeros(m, 20)
        x[0, 3] = float("nan")
        if m > 1:
            x[1, 4] = float("inf")
        y = int8_weight_only_linear(x, qw, s)
        assert torch.isnan(y[0]).all() and (m == 1 or torch.isposinf(y[1]).all())
        assert (y[2:] == 0).all()


_ONE_RUNTIME = """
    import json, torch
    from quanta.kernels.int_linear import int8_weight_only_linear, prepare_int8_weight_only
    int8_weight_only_linear(torch.randn(1, 16), *prepare_int8_weight_only(torch.ones(2, 16, dtype=torch.int8),
                                                                        torch.ones(2)))
    with open("/proc/self/maps") as f:
        print(json.dumps(sorted({line.split()[-1] for line in f if "libgomp" in line or "libiomp" in line})))
"""


def test_one_openmp_runtime_in_the_process():
    """The extension links torch's own OpenMP runtime: one pool for torch's ops and quanta's kernels (checked in a
    fresh process: this one may hold other libraries' runtimes, scikit-learn's libgomp for one)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/self/maps")
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_ONE_RUNTIME)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    runtimes = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(runtimes) <= 1, runtimes


def test_force_isa_checks_its_argument():
    with pytest.raises(ValueError, match="name must be one of"):
        with native.force_isa("sse9"):
            pass
    assert native.isa() == native.cpu_isa()


_FALLBACK = """
    import warnings, torch
    from quanta.kernels import int_linear_native as native
    from quanta.kernels.int_linear import int8_weight_only_linear, prepare_int8_weight_only, int4_cpu_linear, pack_int4_cpu
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        qw, s = prepare_int8_weight_only(torch.randint(-128, 128, (5, 40), dtype=torch.int8), torch.rand(5))
        x = torch.randn(3, 40)
        y1 = int8_weight_only_linear(x, qw, s)
        p, sz = pack_int4_cpu(torch.randint(0, 16, (5, 40), dtype=torch.uint8), torch.rand(5, 2), torch.rand(5, 2), 32)
        y2 = int4_cpu_linear(x, p, sz, 32, 5)
    msgs = [str(w.message) for w in rec if issubclass(w.category, RuntimeWarning)]
    assert len(msgs) == 1 and "unavailable" in msgs[0], msgs
    assert native.ops() is None and native.status().startswith("unavailable")
    want = (x.double() @ qw.double().T) * s.double()
    assert torch.allclose(y1.double(), want, rtol=1e-5, atol=1e-5)
    print("ok", y2.shape)
"""


def test_no_compiler_falls_back_with_one_warning(tmp_path):
    env = dict(os.environ, CXX=str(tmp_path / "no-such-compiler"), QUANTA_CACHE_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_FALLBACK)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["ok", "torch.Size([3,", "5])"]


def test_disabled_runs_the_fallback_with_close_results():
    g = _gen(9)
    w = torch.randint(-128, 128, (20, 48), generator=g, dtype=torch.int8)
    qw, s = prepare_int8_weight_only(w, torch.rand(20, generator=g))
    codes = torch.randint(0, 16, (20, 50), generator=g, dtype=torch.uint8)
    packed, sz = pack_int4_cpu(codes, torch.rand(20, 2, generator=g), torch.rand(20, 2, generator=g), 32)
    x = torch.randn(5, 48, generator=g)
    x4 = torch.randn(5, 50, generator=g)
    y8, y4 = int8_weight_only_linear(x, qw, s), int4_cpu_linear(x4, packed, sz, 32, 20)
    with native.disabled():
        assert native.ops() is None
        f8, f4 = int8_weight_only_linear(x, qw, s), int4_cpu_linear(x4, packed, sz, 32, 20)
    # torch's int8 kernel rounds activations and output to bfloat16; the reference is float32
    assert torch.allclose(f8, y8, rtol=2**-7, atol=2**-7 * float(y8.abs().max()))
    assert torch.allclose(f4, y4, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ torch.compile
@pytest.mark.parametrize("config", ["int8", "int4", "int8_dynamic", "int8_dynamic_asymmetric"])
def test_compiled_model_calls_the_native_kernels_in_one_graph(config):
    """The kernels have shape-only fake implementations: ``fullgraph=True`` traces a quantized model whole, the graph
    calls ``quanta_cpu`` ops directly (no Python wrapper op per call), and the results are eager's bits."""
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    from quanta.encodings.torchao import MappingType
    from quanta.quantization import (Int4WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig,
                                     Int8WeightOnlyConfig, quantize_)

    cfg = {"int8": Int8WeightOnlyConfig(), "int4": Int4WeightOnlyConfig(group_size=32),
           "int8_dynamic": Int8DynamicActivationInt8WeightConfig(),
           "int8_dynamic_asymmetric": Int8DynamicActivationInt8WeightConfig(act_mapping_type=MappingType.ASYMMETRIC),
           }[config]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 64), torch.nn.SiLU(), torch.nn.Linear(64, 48))
    model = model.to(torch.bfloat16)
    quantize_(model, cfg)
    torch._dynamo.reset()
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.inference_mode():
        for m in (1, 3, 20):  # decode and prefill paths
            x = torch.randn(m, 96, dtype=torch.bfloat16)
            assert torch.equal(compiled(x), model(x))
    code = "\n".join(g.code for g in backend.fw_graphs)
    assert "quanta_cpu." in code and "torch.ops.quanta." not in code, code


_COMPILE_FIRST = """
import torch
from torch._dynamo.testing import AotEagerAndRecordGraphs
from quanta.kernels import int_linear_native as native
from quanta.quantization import Int4WeightOnlyConfig, Int8DynamicActivationInt8WeightConfig, quantize_
torch.manual_seed(0)
assert native.status() == "not loaded yet"
for cfg in (Int4WeightOnlyConfig(group_size=32), Int8DynamicActivationInt8WeightConfig()):
    model = torch.nn.Sequential(torch.nn.Linear(96, 64), torch.nn.SiLU(), torch.nn.Linear(64, 48)).to(torch.bfloat16)
    quantize_(model, cfg)
    backend = AotEagerAndRecordGraphs()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch.inference_mode():
        compiled(torch.randn(1, 96, dtype=torch.bfloat16))  # traced before any eager call
    code = "\\n".join(g.code for g in backend.fw_graphs)
    print(type(cfg).__name__, "quanta_cpu." in code, "torch.ops.quanta." in code)
"""


def test_a_model_compiled_before_any_eager_call_gets_the_native_ops():
    """Tracing loads the native kernels if nothing has yet: else the graph would keep the Python ops (argument checks
    at every call) for as long as it is used."""
    r = subprocess.run([sys.executable, "-c", _COMPILE_FIRST], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["Int4WeightOnlyConfig", "True", "False",
                                "Int8DynamicActivationInt8WeightConfig", "True", "False"], r.stdout


def test_decode_attention_compiles_to_the_native_op():
    from torch._dynamo.testing import AotEagerAndRecordGraphs

    from quanta.kernels.decode_attention import decode_attention

    torch.manual_seed(0)
    q = torch.randn(2, 8, 1, 16, dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 11, 16, dtype=torch.bfloat16) for _ in range(2))
    mask = torch.ones(2, 11, dtype=torch.bool)
    mask[1, :3] = False
    torch._dynamo.reset()
    backend = AotEagerAndRecordGraphs()
    got = torch.compile(decode_attention, backend=backend, fullgraph=True)(q, k, v, None, mask)
    assert torch.equal(got, decode_attention(q, k, v, None, mask))
    assert "quanta_cpu.decode_attention" in "\n".join(g.code for g in backend.fw_graphs)


def test_compiled_dynamic_activations_carry_a_nan_row_to_its_outputs():
    """Traced code cannot raise on values as eager does (ValueError): a NaN input row gives NaN outputs there."""
    from quanta.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    quantize_(model, Int8DynamicActivationInt8WeightConfig())
    x = torch.randn(3, 64)
    x[1, 7] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        model(x)
    torch._dynamo.reset()
    with torch.inference_mode():
        y = torch.compile(model, backend="aot_eager", fullgraph=True)(x)
    assert torch.isnan(y[1]).all() and not torch.isnan(y[[0, 2]]).any()
    assert torch.equal(y[[0, 2]], model(x[[0, 2]]))


_PER_TOKEN_ROWS = [
    torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -2.5, -127.0]]),  # scale exactly 1: ties round to even
    torch.zeros(2, 5),                                              # scale clamps to 1e-5
    torch.full((1, 3), 3e-7),
    torch.tensor([[3e38, -3.3e38, 1.0]]),                          # near the end of float32 and bfloat16
    torch.tensor([[1e-42, -5e-43, 0.0]]),                          # subnormal
    torch.randn(4, 5632, generator=_gen(41)),
    torch.randn(50, 33, generator=_gen(42)) * torch.logspace(-20, 20, 50)[:, None],
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("x", _PER_TOKEN_ROWS, ids=lambda x: f"{tuple(x.shape)}")
def test_native_per_token_quantization_gives_the_torch_ops_bits(x, dtype):
    x = x.to(dtype)
    got = quantize_per_token_int8(x)
    with native.disabled():
        want = quantize_per_token_int8(x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]) and got[2] is None


def test_native_per_token_quantization_hypothesis():
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from hypothesis.extra.numpy import arrays

    @settings(max_examples=150, deadline=None)
    @given(arrays("float32", st.tuples(st.integers(1, 4), st.integers(1, 70)),
                  elements=st.floats(-1e6, 1e6, width=32, allow_subnormal=True)), st.booleans())
    def check(a, bf16):
        x = torch.from_numpy(a).to(torch.bfloat16 if bf16 else torch.float32)
        got = quantize_per_token_int8(x)
        with native.disabled():
            want = quantize_per_token_int8(x)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    check()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_per_token_quantization_raises_on_a_non_finite_row(bad, dtype):
    x = torch.randn(3, 8, generator=_gen(43)).to(dtype)
    x[1, 2] = bad
    with pytest.raises(ValueError, match="would be NaN"):
        quantize_per_token_int8(x)
