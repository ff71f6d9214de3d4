"""The two fast paths of quanta.nn inside a QuantizationSimModel (``plain_outputs``):

* inference (no autograd): a module's fresh output is fake-quantized in place by its output quantizer;
* training: QuantizedReLU + a fixed-range output quantizer run as one autograd node.

Each is compared with the same sim / module on the slow path (autograd on with an input that requires
grad, or ``plain_outputs=False``), bit for bit, and checked not to touch anything the caller keeps.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quanta.nn as qnn
from quanta.nn import QuantizationMixin
from quanta.quantsim import QuantizationSimModel
from tests.quantsim.quantsim_models import SmallCNN, TransformerBlock, make_cnn_data


def _plain(t):
    return t.as_subclass(torch.Tensor).detach() if isinstance(t, torch.Tensor) else t


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = _plain(a), _plain(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)) and torch.equal(a.isnan(), b.isnan()) \
        and torch.equal(torch.signbit(a), torch.signbit(b))


def _sim(model: nn.Module, *inputs: torch.Tensor, calib: int = 3, seed: int = 1) -> QuantizationSimModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, inputs if len(inputs) > 1 else inputs[0])
        g = torch.Generator().manual_seed(seed)
        batches = []
        for _ in range(calib):
            batches.append(tuple(x + 0.1 * torch.randn(x.shape, generator=g, dtype=x.dtype)
                                 if x.is_floating_point() else x for x in inputs))
        sim.compute_encodings(batches if len(inputs) > 1 else [b[0] for b in batches], progress=False)
    return sim


def _slow_path(sim: QuantizationSimModel):
    """Every quantized module with plain_outputs=False: neither fast path is taken."""
    for _, m in sim.quantized_modules():
        m.plain_outputs = False


def _fast_vs_autograd(sim: QuantizationSimModel, *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(no_grad output, enable_grad output with the float inputs requiring grad) of ``sim.model``."""
    before = [x.clone() for x in inputs]
    with torch.no_grad():
        fast = sim.model(*inputs)
    for x, b in zip(inputs, before):
        assert _bits_equal(x, b), "the fast path modified a caller's input"
    with torch.enable_grad():
        leaf = [x.detach().clone().requires_grad_() if x.is_floating_point() else x for x in inputs]
        slow = sim.model(*leaf)
    return fast, slow


# --------------------------------------------------------------------------- aliasing models
class ConcatOne(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        c = torch.cat([h], dim=1)
        return c + h  # h must still hold the Linear's (quantized) values, not c's


class MatMulVec(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b) + a.sum()


class PoolSame(nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = nn.AvgPool2d(1)
        self.apool = nn.AdaptiveAvgPool2d((4, 4))

    def forward(self, x):
        return self.pool(x) + self.apool(x) + x


class InplaceActs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.acts = nn.ModuleList([nn.ReLU(inplace=True), nn.ReLU6(inplace=True), nn.Hardtanh(-0.5, 0.5, inplace=True),
                                   nn.LeakyReLU(0.1, inplace=True), nn.ELU(inplace=True), nn.SiLU(inplace=True),
                                   nn.Mish(inplace=True), nn.Hardswish(inplace=True), nn.Hardsigmoid(inplace=True)])

    def forward(self, x):
        outs = []
        for act in self.acts:
            h = self.fc(x)
            outs.append(act(h) + h)
        return torch.stack(outs)


class ReuseFanOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(8, 8)
        self.fc3 = nn.Linear(8, 8)

    def forward(self, x):
        h = self.act(self.fc(x))
        a = self.fc2(h)  # fan-out: h feeds fc2, fc3 and the output
        b = self.fc3(h)
        return self.fc(a) + self.fc(b) + h  # fc reused twice


class Misc(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(30, 8, max_norm=1.0)
        self.ln = nn.LayerNorm(8, elementwise_affine=False)
        self.up = nn.ConvTranspose1d(8, 4, 3, stride=2)
        self.soft = nn.Softmax(dim=-1)

    def forward(self, idx):
        e = self.emb(idx)                      # (B, T, 8)
        h = self.ln(e)
        u = self.up(h.transpose(1, 2).contiguous(), output_size=[2 * idx.shape[1] + 1])
        return self.soft(u) + e.mean()


def _models():
    torch.manual_seed(0)
    return {
        "concat_one": (ConcatOne(), (torch.randn(4, 8),)),
        "matmul_1d": (MatMulVec(), (torch.randn(8), torch.randn(8))),
        "matmul_2d_1d": (MatMulVec(), (torch.randn(3, 8), torch.randn(8))),
        "pool_same_size": (PoolSame(), (torch.randn(2, 3, 4, 4),)),
        "inplace_acts": (InplaceActs(), (torch.randn(4, 8),)),
        "reuse_fanout": (ReuseFanOut(), (torch.randn(4, 8),)),
        "embedding_ln_convT": (Misc(), (torch.randint(0, 30, (2, 5)),)),
        "small_cnn": (SmallCNN(), (make_cnn_data(4)[0],)),
        "transformer": (TransformerBlock(), (torch.randn(2, 6, 32),)),
    }


@pytest.mark.parametrize("name", list(_models()))
def test_sim_no_grad_output_equals_autograd_output(name):
    model, inputs = _models()[name]
    sim = _sim(model.eval(), *inputs)
    params = {k: v.detach().clone() for k, v in sim.model.state_dict().items()}
    fast, slow = _fast_vs_autograd(sim, *inputs)
    assert _bits_equal(fast, slow)
    for k, v in sim.model.state_dict().items():  # no parameter / buffer / range overwritten
        assert _bits_equal(v, params[k]), k
    # and the whole thing equals the sim with both fast paths disabled
    with torch.no_grad():
        again = sim.model(*inputs)
        _slow_path(sim)
        reference = sim.model(*inputs)
    assert _bits_equal(again, fast)
    assert _bits_equal(reference, fast)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_sim_dtypes(dtype):
    torch.manual_seed(0)
    model = ReuseFanOut().to(dtype).eval()
    x = torch.randn(4, 8, dtype=dtype)
    sim = _sim(model, x)
    fast, slow = _fast_vs_autograd(sim, x)
    assert fast.dtype == dtype
    assert _bits_equal(fast, slow)


def test_sim_channels_last_and_inference_mode():
    torch.manual_seed(0)
    x = make_cnn_data(4)[0]
    sim = _sim(SmallCNN().eval(), x)
    xc = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        ref = sim.model(x)
        out_cl = sim.model(xc)
    with torch.inference_mode():
        out_inf = sim.model(x)
        out_inf_cl = sim.model(xc)
    assert torch.allclose(_plain(out_cl), _plain(ref), atol=1e-5)  # conv kernels may differ by layout
    assert _bits_equal(out_inf, ref)
    assert _bits_equal(out_inf_cl, out_cl)
    assert torch.equal(xc, x)


def test_batchnorm_train_mode_under_no_grad():
    """BatchNorm in train mode under no_grad: the output uses batch statistics and the running stats move;
    both must be the same as on the slow path."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
    x = torch.randn(4, 3, 8, 8)
    sim = _sim(model.eval(), x)
    slow = copy.deepcopy(sim)
    _slow_path(slow)
    sim.model.train()
    slow.model.train()
    with torch.no_grad():
        a = sim.model(x)
        b = slow.model(x)
    assert _bits_equal(a, b)
    for (k, v), (_, w) in zip(sim.model.state_dict().items(), slow.model.state_dict().items()):
        assert _bits_equal(v, w), k


def test_output_is_quantized_and_not_float():
    """Guard against the fast path being a no-op: the sim's output differs from the float model's and is on
    the output quantizer's grid."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16))
    x = torch.randn(32, 8)
    sim = _sim(model.eval(), x)
    with torch.no_grad():
        out = _plain(sim.model(x))
    assert not torch.equal(out, model(x).detach())
    assert torch.unique(out).numel() <= 256


# --------------------------------------------------------------------------- hooks
def test_quantizer_hooks_and_global_hooks_fire():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 4))
    x = torch.randn(4, 8)
    sim = _sim(model.eval(), x)
    with torch.no_grad():
        expected = _plain(sim.model(x))
    seen = []
    q = sim.model.get_submodule("0").output_quantizers[0]
    h1 = q.register_forward_hook(lambda m, i, o: seen.append("fwd"))
    h2 = q.register_forward_pre_hook(lambda m, i: seen.append("pre"))
    with torch.no_grad():
        out = sim.model(x)
    h1.remove()
    h2.remove()
    assert seen == ["pre", "fwd"]
    assert _bits_equal(out, expected)

    names = []
    g1 = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: names.append(type(m).__name__))
    try:
        with torch.no_grad():
            out = sim.model(x)
    finally:
        g1.remove()
    assert names.count("QuantizeDequantize") >= 3  # every output quantizer was called as a module
    assert _bits_equal(out, expected)

    pre = []
    g2 = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, i: pre.append(type(m).__name__))
    try:
        with torch.no_grad():
            out = sim.model(x)
    finally:
        g2.remove()
    assert pre.count("QuantizeDequantize") >= 3
    assert _bits_equal(out, expected)


def test_hook_modifying_quantizer_output_is_respected():
    """A forward hook on an output quantizer that returns a new value must see its value used."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8))
    x = torch.randn(4, 8)
    sim = _sim(model.eval(), x)
    h = sim.model.get_submodule("0").output_quantizers[0].register_forward_hook(lambda m, i, o: o * 0)
    try:
        with torch.no_grad():
            out = _plain(sim.model(x))
    finally:
        h.remove()
    assert torch.count_nonzero(out) == 0


# --------------------------------------------------------------------------- calibration
@pytest.mark.parametrize("model_name", ["small_cnn", "transformer", "reuse_fanout", "inplace_acts"])
def test_compute_encodings_unchanged_with_fast_paths_disabled(model_name):
    model, inputs = _models()[model_name]
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = QuantizationSimModel(model, inputs[0])
        b = QuantizationSimModel(model, inputs[0])
    _slow_path(b)
    g = torch.Generator().manual_seed(3)
    batches = [inputs[0] + 0.2 * torch.randn(inputs[0].shape, generator=g) for _ in range(3)]

    def calibrate(sim):  # a callback that also runs the model on a no-grad pass between calibration steps
        for xb in batches:
            sim(xb)

    a.compute_encodings(calibrate, progress=False)
    b.compute_encodings(calibrate, progress=False)
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert _bits_equal(sa[k], sb[k]), k


# --------------------------------------------------------------------------- fused ReLU (training)
def _relu_pair(lo=0.0, hi=1.5, learn=False, input_quantizer=False, dtype=torch.float32):
    fused = qnn.from_module(nn.ReLU())
    fused.output_quantizers[0].set_range(lo, hi)
    if input_quantizer:
        fused.input_quantizers[0] = qnn.default_activation_quantizer()
        fused.input_quantizers[0].set_range(-2.0, 2.0)
        fused.input_quantizers[0].requires_grad_(learn)
    fused.output_quantizers[0].requires_grad_(learn)
    fused.plain_outputs = True
    ref = copy.deepcopy(fused)
    ref.plain_outputs = False
    return fused, ref


EDGES = [-1.0, -0.0, 0.0, 1e-30, -1e-30, 0.003, 0.75, 1.5, 1.5 - 1e-3, 1.5 + 1e-3, 1.6, 3.0, 1e4,
         float("inf"), -float("inf"), float("nan")]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("input_quantizer", [False, True])
@pytest.mark.parametrize("rng", [(0.0, 1.5), (-0.7, 1.5), (0.25, 1.0)])
def test_fused_relu_bit_identical(dtype, input_quantizer, rng):
    fused, ref = _relu_pair(*rng, input_quantizer=input_quantizer)
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.tensor(EDGES, dtype=dtype), 2 * torch.randn(300, generator=g).to(dtype)])
    x = x.requires_grad_()
    grad = torch.randn(x.shape, generator=g).to(dtype)
    y = fused(x)
    assert type(y.grad_fn).__name__ == "_ReluQDQBackward"
    (dx,) = torch.autograd.grad(y, x, grad)
    y2 = ref(x)
    (dx2,) = torch.autograd.grad(y2, x, grad)
    assert _bits_equal(y, y2)
    assert _bits_equal(dx, dx2)


@pytest.mark.parametrize("input_quantizer", [False, True])
def test_fused_relu_learned_range_falls_back_with_same_range_grads(input_quantizer):
    fused, ref = _relu_pair(learn=True, input_quantizer=input_quantizer)
    x = torch.cat([torch.tensor(EDGES[:-3]), torch.randn(200, generator=torch.Generator().manual_seed(2))])
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    (fused(x1) * w).sum().backward()
    (ref(x2) * w).sum().backward()
    assert _bits_equal(x1.grad, x2.grad)
    for qa, qb in zip([*fused.input_quantizers, *fused.output_quantizers],
                      [*ref.input_quantizers, *ref.output_quantizers]):
        if qa is None:
            continue
        assert qa.max.grad is not None
        assert _bits_equal(qa.min.grad, qb.min.grad) and _bits_equal(qa.max.grad, qb.max.grad)
    assert float(fused.output_quantizers[0].max.grad.abs()) > 0


def test_fused_relu_gradient_penalty_like_unfused():
    """WGAN-GP style: the input gradient of a nonlinear loss, taken with create_graph=True, then
    differentiated again. The fused node's backward (and the quantizer's straight-through) must stay
    differentiable w.r.t. the incoming gradient: same bits as the two-step path for every grad."""
    results = []
    for plain in (True, False):
        torch.manual_seed(0)
        relu = qnn.from_module(nn.ReLU()).double()
        relu.output_quantizers[0].set_range(0.0, 1.5)
        relu.output_quantizers[0].requires_grad_(False)
        relu.plain_outputs = plain
        net = nn.Sequential(nn.Linear(8, 16).double(), relu, nn.Linear(16, 1).double())
        x = torch.randn(32, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
        loss = _plain_keep(net(x)).pow(2).sum()
        (g,) = torch.autograd.grad(loss, x, create_graph=True)
        g.pow(2).sum().backward()
        results.append([x.grad, net[0].weight.grad, net[2].weight.grad])
    for fused, unfused in zip(*results):
        assert fused is not None and _bits_equal(fused, unfused)
    assert float(results[0][1].abs().sum()) > 0  # the penalty really reaches the weights


def _plain_keep(t):
    return t.as_subclass(torch.Tensor)


def test_fused_relu_torch_compile():
    try:
        import torch._dynamo
    except Exception:  # noqa: BLE001
        pytest.skip("torch.compile unavailable")
    fused, ref = _relu_pair()
    x = torch.cat([torch.tensor(EDGES[:-3]), torch.randn(100)])
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    try:
        y1 = torch.compile(fused, backend="eager")(x1)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"torch.compile unavailable: {e}")
    y1.sum().backward()
    ref(x2).sum().backward()
    assert _bits_equal(y1, ref(x.clone()))
    assert _bits_equal(x1.grad, x2.grad)


def test_fused_relu_inplace_module_not_fused_and_correct():
    fused, ref = _relu_pair()
    fused.inplace = ref.inplace = True
    x = torch.randn(50)
    h1 = (x * 1.0).requires_grad_()
    y = fused(h1 * 1.0)
    assert type(y.grad_fn).__name__ != "_ReluQDQBackward"
    assert _bits_equal(y, ref(h1 * 1.0))


def _qat(fused: bool, steps: int = 4, scheme: str = "min_max", autocast: bool = False):
    torch.manual_seed(0)
    model = SmallCNN()
    x, y = make_cnn_data(32, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, x[:8], quant_scheme=scheme)
        sim.compute_encodings([x[:16]], progress=False)
    if not fused:
        _slow_path(sim)
    sim.model.train()
    opt = torch.optim.SGD(sim.model.parameters(), lr=0.05, momentum=0.9)
    losses, grad_fns = [], set()
    for i in range(steps):
        xb, yb = x[8 * (i % 4): 8 * (i % 4) + 8], y[8 * (i % 4): 8 * (i % 4) + 8]

        def record(m, inp, out):
            if out.grad_fn is not None:
                grad_fns.add(type(out.grad_fn).__name__)
        hooks = [m.register_forward_hook(record) for m in sim.model.modules() if isinstance(m, qnn.QuantizedReLU)]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = sim.model(xb)
            loss = F.cross_entropy(_plain_keep(out).float(), yb)
        for h in hooks:
            h.remove()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return torch.stack(losses), {k: v.detach().clone() for k, v in sim.model.state_dict().items()}, grad_fns


def test_qat_small_cnn_fused_equals_unfused():
    la, sa, fa = _qat(True)
    lb, sb, fb = _qat(False)
    assert "_ReluQDQBackward" in fa and "_ReluQDQBackward" not in fb  # both paths really taken
    assert _bits_equal(la, lb)
    for k in sa:
        assert _bits_equal(sa[k], sb[k]), k


@pytest.mark.parametrize("kw", [{"autocast": True}, {"scheme": "range_learning_min_max"}], ids=["bf16_autocast",
                                                                                                "range_learning"])
def test_qat_small_cnn_variants_fused_equals_unfused(kw):
    la, sa, fa = _qat(True, steps=3, **kw)
    lb, sb, _ = _qat(False, steps=3, **kw)
    assert _bits_equal(la, lb)
    for k in sa:
        assert _bits_equal(sa[k], sb[k]), k
    if "scheme" in kw:  # learned ranges: the two-step path, and the ranges did train
        assert "_ReluQDQBackward" not in fa


def test_sim_autocast_inference_equals_slow_path():
    torch.manual_seed(0)
    x = make_cnn_data(4)[0]
    sim = _sim(SmallCNN().eval(), x)
    slow = copy.deepcopy(sim)
    _slow_path(slow)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        a, b = sim.model(x), slow.model(x)
    assert a.dtype == torch.bfloat16
    assert _bits_equal(a, b)


def test_quantized_modules_are_quantization_mixins():  # sanity of the helper used everywhere above
    sim = _sim(ReuseFanOut().eval(), torch.randn(4, 8))
    mods = [m for _, m in sim.quantized_modules()]
    assert mods and all(isinstance(m, QuantizationMixin) and m.plain_outputs for m in mods)


# --------------------------------------------------------------------------- non-contiguous outputs, constant inputs
class ChannelsLastBlock(nn.Module):
    """A depthwise convolution on a permuted input (its output is channels last) and a channels-first LayerNorm
    (its output a permuted view), as in ConvNeXt."""

    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.norm = qnn.ChannelsFirstLayerNorm(8)
        self.pw = nn.Conv2d(8, 8, 1)

    def forward(self, x):  # x: (N, H, W, C)
        return self.pw(self.norm(self.dw(x.permute(0, 3, 1, 2))))


def test_channels_last_outputs_fast_path_equals_slow_path():
    torch.manual_seed(0)
    x = torch.randn(2, 6, 6, 8)
    model = ChannelsLastBlock().eval()
    assert not model.dw(x.permute(0, 3, 1, 2)).is_contiguous()  # the case at hand
    sim = _sim(model, x)
    with torch.no_grad():
        fast = sim.model(x)
    slow = copy.deepcopy(sim)
    _slow_path(slow)
    with torch.no_grad():
        reference = slow.model(x)
    assert _bits_equal(fast, reference)
    assert _bits_equal(fast, _fast_vs_autograd(sim, x)[1])


def test_owned_non_contiguous_output_is_quantized_in_a_contiguous_copy():
    from quanta.kernels import native

    q = qnn.default_activation_quantizer()
    q.set_range(-2.0, 2.0)
    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    before = x.clone()
    expected = _plain(q(x))
    with torch.no_grad():
        out = q._qdq_owned(x)
        assert out is not None and out is not x and out.is_contiguous() and expected.is_contiguous()
        assert _bits_equal(out, expected) and _bits_equal(x, before)
        with native.disabled():  # the eager kernel keeps the memory format: the quantizer is called as usual
            assert q._qdq_owned(x) is None
    assert q._qdq_owned(x) is None  # autograd on


def test_parameter_inputs_are_cached_like_parameters():
    """A parameter fed to a module's input (a captured graph's get_attr: DINOv2's layer scale, ViT's position
    embeddings) is fake-quantized once at inference, and again after any change a parameter's cache sees."""
    mul = qnn.QuantizedMultiply()
    scale = nn.Parameter(torch.rand(8) + 0.5)
    mul.input_quantizers[1] = qnn.default_activation_quantizer()
    x = torch.randn(4, 8)
    with mul.compute_encodings():
        mul(x, scale)
    mul.plain_outputs = True
    mul.eval()
    q = mul.input_quantizers[1]
    calls = []
    q.register_forward_hook(lambda m, a, o: calls.append(1))

    def reference():
        return _plain(mul.output_quantizers[0](x * _plain(q(scale))))

    with torch.no_grad():
        first = mul(x, scale)
        assert _bits_equal(mul(x, scale), first) and len(calls) == 1
        assert _bits_equal(first, reference())
        q.max.data.mul_(0.5)  # a range write through .data
        assert _bits_equal(mul(x, scale), reference())
        scale.mul_(2)  # an in-place update of the parameter
        assert _bits_equal(mul(x, scale), reference())
        plain_scale = scale.detach().clone()  # not a parameter: quantized on every call
        n = len(calls)
        mul(x, plain_scale), mul(x, plain_scale)
        assert len(calls) == n + 2
