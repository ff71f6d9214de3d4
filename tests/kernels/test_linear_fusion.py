"""The fused int4 op (several weights on one input) and the Inductor pass that rewrites decode graphs to it."""

import pytest
import torch

from quanta.kernels import int_linear_native as native
from quanta.kernels.int_linear import pack_int4_cpu
from quanta.kernels.linear_fusion import FuseSharedInputLinears, fuse_shared_input_linears

pytestmark = pytest.mark.skipif(native.ops() is None, reason=f"native kernels {native.status()}")

_ISAS = [i for i in native.ISA_NAMES if native.ISA_NAMES.index(i) <= native.ISA_NAMES.index(native.cpu_isa())]


def _weights(ns, k, group_size, seed):
    g = torch.Generator().manual_seed(seed)
    groups = -(-k // group_size)
    out = []
    for n in ns:
        codes = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
        out.append(pack_int4_cpu(codes, torch.rand(n, groups, generator=g) * 0.1 + 0.01,
                                 torch.randn(n, groups, generator=g) * 0.1, group_size))
    return out


@pytest.mark.parametrize("isa", _ISAS)
@pytest.mark.parametrize("m,ns,k,group_size", [(1, (45, 16, 16), 300, 32), (3, (64, 7), 128, 128),
                                               (7, (33, 200, 1), 2100, 64), (9, (20, 21), 256, 256)])
def test_multi_op_gives_each_weights_bits(isa, m, ns, k, group_size):
    """Columns off_i .. off_i + N_i of the fused op are the single op's bits on weight i (decode: one sequence of
    tiles; from 8 rows or off the bfloat16 path: the weights in turn)."""
    ws = _weights(ns, k, group_size, seed=m + k)
    g = torch.Generator().manual_seed(1)
    biases = [torch.randn(n, generator=g) if i % 2 else None for i, n in enumerate(ns)]
    single, multi = torch.ops.quanta_cpu.int4_weight_only_linear, torch.ops.quanta_cpu.int4_weight_only_linear_multi
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(m, k, generator=g).to(dtype)
        with native.force_isa(isa):
            want = torch.cat([single(x, p, sz, group_size, k, n, b) for (p, sz), n, b in zip(ws, ns, biases)], 1)
            got = multi(x, [p for p, _ in ws], [sz for _, sz in ws], group_size, k, list(ns), biases)
        assert got.shape == (m, sum(ns)) and got.dtype == dtype
        assert torch.equal(got, want), (isa, dtype)


def test_multi_op_checks_its_lists():
    (p0, s0), (p1, s1) = _weights((16, 32), 64, 32, seed=3)
    x = torch.randn(1, 64).to(torch.bfloat16)
    multi = torch.ops.quanta_cpu.int4_weight_only_linear_multi
    with pytest.raises(RuntimeError, match="same length"):
        multi(x, [p0, p1], [s0], 32, 64, [16, 32], [None, None])
    with pytest.raises(RuntimeError, match="packed must be"):
        multi(x, [p0, p1], [s0, s1], 32, 64, [16, 16], [None, None])  # weight 1 has 32 rows
    with pytest.raises(RuntimeError, match="bias"):
        multi(x, [p0, p1], [s0, s1], 32, 64, [16, 32], [None, torch.zeros(31)])


class _Counting(FuseSharedInputLinears):
    fused = 0

    def __call__(self, graph):
        type(self).fused += fuse_shared_input_linears(graph)


class _Block(torch.nn.Module):
    """q, k and v (v with a bias) from one input, then a projection of their concatenation."""

    def __init__(self):
        super().__init__()
        self.q, self.k = torch.nn.Linear(256, 256, bias=False), torch.nn.Linear(256, 64, bias=False)
        self.v, self.o = torch.nn.Linear(256, 64), torch.nn.Linear(384, 100)

    def forward(self, x):
        q = self.q(x).view(x.shape[0], 4, 64).transpose(0, 1).reshape(x.shape[0], 256)  # a view of a slice
        return self.o(torch.cat([q, self.k(x), self.v(x)], -1).relu())


def test_compiled_decode_step_fuses_the_shared_input_calls_and_keeps_the_bits():
    from quanta.quantization import Int4WeightOnlyConfig, quantize_

    torch.manual_seed(0)
    model = _Block().to(torch.bfloat16)
    quantize_(model, Int4WeightOnlyConfig(group_size=64))
    torch._dynamo.reset()
    _Counting.fused = 0
    compiled = torch.compile(model, dynamic=False, options={"post_grad_custom_post_pass": _Counting(),
                                                            "fx_graph_cache": False})
    with torch.inference_mode():
        for m, fused in ((1, 1), (3, 2), (9, 2)):  # from 8 rows the GEMM path: left as it is
            x = torch.randn(m, 256, dtype=torch.bfloat16)
            assert torch.equal(compiled(x), model(x))
            assert _Counting.fused == fused  # q, k and v: one call (o reads another input)


def test_pass_groups_views_of_one_input_and_leaves_prefill_and_lone_calls():
    from torch._subclasses.fake_tensor import FakeTensorMode

    single = torch.ops.quanta_cpu.int4_weight_only_linear.default
    (pq, sq), (pk, sk), (po, so) = _weights((32, 16, 48), 64, 32, seed=5)

    def build(rows):
        g = torch.fx.Graph()
        with FakeTensorMode() as mode:
            fake = {}
            h = g.placeholder("h")
            h.meta["val"] = mode.from_tensor(torch.zeros(1, rows, 64, dtype=torch.bfloat16))
            args = {}
            for name, t in (("pq", pq), ("sq", sq), ("pk", pk), ("sk", sk), ("po", po), ("so", so)):
                args[name] = g.placeholder(name)
                args[name].meta["val"] = fake[name] = mode.from_tensor(t)
            outs = []
            for p, s, n, x_of in (("pq", "sq", 32, "h"), ("pk", "sk", 16, "h"), ("po", "so", 48, "other")):
                src = h if x_of == "h" else g.call_function(torch.ops.aten.mul.Tensor, (h, 2))
                if x_of != "h":
                    src.meta["val"] = h.meta["val"] * 2
                x = g.call_function(torch.ops.aten.view.default, (src, [rows, 64]))  # a view of its own per call
                x.meta["val"] = src.meta["val"].view(rows, 64)
                y = g.call_function(single, (x, args[p], args[s], 32, 64, n, None))
                y.meta["val"] = x.meta["val"].new_empty((rows, n))
                outs.append(y)
            g.output(tuple(outs))
        return g

    g = build(1)
    assert fuse_shared_input_linears(g) == 1
    targets = [n.target for n in g.nodes if n.op == "call_function"]
    assert targets.count(single) == 1  # the call on another input stays
    assert targets.count(torch.ops.quanta_cpu.int4_weight_only_linear_multi.default) == 1
    g.lint()
    assert fuse_shared_input_linears(build(8)) == 0  # 8 rows: the GEMM path
