"""quanta.nn quantized modules against their float modules.

Reference for every module: the float module run on inputs and a weight that
were fake-quantized with ``Q.affine.quantize_dequantize`` (the functional API)
using the calibrated quantizers' scale/offset/grid, then the output QDQ'd the
same way. Both paths run the same float op on the same tensors, so they must
agree bit for bit.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import quanta.nn as qnn
import quanta.quantization as Q


@dataclass
class Case:
    name: str
    make: Callable[[], nn.Module]
    inputs: Callable[[torch.Generator], tuple[torch.Tensor, ...]]
    float_inputs: bool = True  # inputs are floating point (Embedding: indices)

    def __repr__(self) -> str:
        return self.name


def _randn(*shape):
    return lambda g: (torch.randn(*shape, generator=g),)


def _bn(cls, c):
    def make():
        m = cls(c)
        with torch.no_grad():
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.5, 0.5)
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 2.0)
        return m
    return make


CASES = [
    Case("Linear", lambda: nn.Linear(16, 8), _randn(4, 16)),
    Case("Conv1d", lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1), _randn(2, 4, 10)),
    Case("Conv2d", lambda: nn.Conv2d(3, 8, 3, padding=1, padding_mode="reflect"), _randn(2, 3, 8, 8)),
    Case("Conv2dGrouped", lambda: nn.Conv2d(4, 8, 3, dilation=2, groups=2, bias=False), _randn(2, 4, 9, 9)),
    Case("Conv3d", lambda: nn.Conv3d(2, 4, 3), _randn(1, 2, 5, 5, 5)),
    Case("ConvTranspose1d", lambda: nn.ConvTranspose1d(4, 6, 3, stride=2), _randn(2, 4, 7)),
    Case("ConvTranspose2d", lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, output_padding=1, groups=2),
         _randn(2, 4, 5, 5)),
    Case("Embedding", lambda: nn.Embedding(20, 8), lambda g: (torch.randint(0, 20, (3, 5), generator=g),),
         float_inputs=False),
    Case("LayerNorm", lambda: nn.LayerNorm(8), _randn(4, 8)),
    Case("GroupNorm", lambda: nn.GroupNorm(2, 6), _randn(2, 6, 4, 4)),
    Case("BatchNorm1d", _bn(nn.BatchNorm1d, 6), _randn(8, 6)),
    Case("BatchNorm2d", _bn(nn.BatchNorm2d, 3), _randn(4, 3, 5, 5)),
    Case("ReLU", nn.ReLU, _randn(4, 8)),
    Case("GELU", lambda: nn.GELU(approximate="tanh"), _randn(4, 8)),
    Case("SiLU", nn.SiLU, _randn(4, 8)),
    Case("Softmax", lambda: nn.Softmax(dim=-1), _randn(4, 8)),
    Case("Sigmoid", nn.Sigmoid, _randn(4, 8)),
    Case("Tanh", nn.Tanh, _randn(4, 8)),
    Case("ReLU6", nn.ReLU6, _randn(4, 8)),
    Case("Hardtanh", lambda: nn.Hardtanh(-0.5, 0.7), _randn(4, 8)),
    Case("LeakyReLU", lambda: nn.LeakyReLU(0.2), _randn(4, 8)),
    Case("Hardswish", nn.Hardswish, _randn(4, 8)),
    Case("Hardsigmoid", nn.Hardsigmoid, _randn(4, 8)),
    Case("ELU", lambda: nn.ELU(0.5), _randn(4, 8)),
    Case("Mish", nn.Mish, _randn(4, 8)),
    Case("AvgPool1d", lambda: nn.AvgPool1d(2), _randn(2, 3, 8)),
    Case("AvgPool2d", lambda: nn.AvgPool2d(3, stride=2, padding=1), _randn(2, 3, 8, 8)),
    Case("AvgPool3d", lambda: nn.AvgPool3d(2), _randn(1, 2, 4, 4, 4)),
    Case("AdaptiveAvgPool1d", lambda: nn.AdaptiveAvgPool1d(3), _randn(2, 3, 8)),
    Case("AdaptiveAvgPool2d", lambda: nn.AdaptiveAvgPool2d((2, 3)), _randn(2, 3, 8, 7)),
    Case("AdaptiveAvgPool3d", lambda: nn.AdaptiveAvgPool3d(1), _randn(1, 2, 4, 4, 4)),
    Case("Add", qnn.Add, lambda g: (torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g))),
    Case("Multiply", qnn.Multiply, lambda g: (torch.randn(4, 8, generator=g), torch.randn(4, 8, generator=g))),
    Case("MatMul", qnn.MatMul, lambda g: (torch.randn(4, 8, generator=g), torch.randn(8, 5, generator=g))),
    Case("Concat", lambda: qnn.Concat(dim=1),
         lambda g: tuple(torch.randn(2, k, generator=g) for k in (3, 4, 5))),
]
WEIGHTED = [c for c in CASES if c.name.startswith(("Linear", "Conv"))]


def _fqdq(q, x: torch.Tensor) -> torch.Tensor:
    """QDQ with the functional API and the quantizer's own encoding (None: identity)."""
    if q is None:
        return x
    return Q.affine.quantize_dequantize(x.detach(), q.get_scale().detach(), q.get_offset().detach(),
                                        qmin=q.qmin, qmax=q.qmax)


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(torch.Tensor).detach()


def _build(case: Case, *, quantize_inputs: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    fm = case.make().eval()
    qm = qnn.from_module(fm)
    n = len(case.inputs(torch.Generator().manual_seed(0)))
    if quantize_inputs and case.float_inputs:
        qm.input_quantizers = nn.ModuleList([qnn.default_activation_quantizer() for _ in range(n)])
    g = torch.Generator().manual_seed(seed + 1)
    with qm.compute_encodings():
        for _ in range(3):
            qm(*case.inputs(g))
    return fm, qm


def _reference(fm: nn.Module, qm: nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    ref = copy.deepcopy(fm)
    with torch.no_grad():
        for name, q in qm.param_quantizers.items():
            if q is not None:
                getattr(ref, name).copy_(_fqdq(q, getattr(ref, name)))
    qs = list(qm.input_quantizers) + [None] * (len(inputs) - len(qm.input_quantizers))
    xs = [_fqdq(q, x) if x.is_floating_point() else x for q, x in zip(qs, inputs)]
    with torch.no_grad():
        return _fqdq(qm.output_quantizers[0], ref(*xs))


def _sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    noise = (ref - approx).pow(2).mean()
    return float(10 * torch.log10(ref.pow(2).mean() / noise))


@pytest.mark.parametrize("case", CASES, ids=repr)
@pytest.mark.parametrize("quantize_inputs", [True, False])
def test_matches_functional_reference_bit_exact(case, quantize_inputs):
    fm, qm = _build(case, quantize_inputs=quantize_inputs)
    inputs = case.inputs(torch.Generator().manual_seed(7))
    with torch.no_grad():
        out = qm(*inputs)
    assert isinstance(out, Q.DequantizedTensor)
    expected = _reference(fm, qm, inputs)
    assert torch.equal(_plain(out), expected)
    # the output is actually quantized: at most 256 distinct levels, and not the float result
    assert torch.unique(_plain(out)).numel() <= 256
    assert not torch.equal(_plain(out), fm(*inputs).detach())


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_plain_outputs_without_autograd_are_the_same_values(case):
    """With ``plain_outputs`` (as inside a QuantizationSimModel) and no autograd, a fresh op output is
    fake-quantized in place: same bits as the reference, inputs untouched, a plain tensor out."""
    fm, qm = _build(case)
    qm.plain_outputs = True
    inputs = case.inputs(torch.Generator().manual_seed(7))
    before = [x.clone() for x in inputs]
    with torch.no_grad():
        out = qm(*inputs)
    assert type(out) is torch.Tensor
    assert torch.equal(out, _reference(fm, qm, inputs))
    assert all(torch.equal(x, b) for x, b in zip(inputs, before))
    with torch.enable_grad():  # autograd on: the usual out-of-place path, same values
        assert torch.equal(_plain(qm(*inputs)), out)


def test_inplace_activation_output_is_not_overwritten():
    """ReLU(inplace=True) returns its input: that tensor must keep ReLU's values, not get the quantized ones."""
    qm = qnn.from_module(nn.ReLU(inplace=True))
    qm.output_quantizers[0].set_range(0.0, 1.0)
    qm.plain_outputs = True
    x = 2 * torch.randn(64)
    x0 = x.clone()
    with torch.no_grad():
        out = qm(x)
    assert torch.equal(x, torch.relu(x0))  # what ReLU made of it; the quantizer clamps at 1.0
    assert not torch.equal(out, x) and out.max() <= 1.0
    assert torch.unique(out).numel() <= 256


def test_output_quantizer_hooks_still_run_with_plain_outputs():
    qm = qnn.from_module(nn.Linear(4, 3))
    with qm.compute_encodings():
        qm(torch.randn(8, 4))
    qm.plain_outputs = True
    seen = []
    handle = qm.output_quantizers[0].register_forward_hook(lambda m, args, out: seen.append(out))
    try:
        with torch.no_grad():
            out = qm(torch.randn(2, 4))
    finally:
        handle.remove()
    assert len(seen) == 1 and torch.equal(_plain(seen[0]), out)


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_default_quantizers(case):
    fm = case.make()
    qm = qnn.from_module(fm)
    assert isinstance(qm, type(fm)) and isinstance(qm, qnn.QuantizationMixin)
    assert isinstance(qm.input_quantizers, nn.ModuleList) and isinstance(qm.output_quantizers, nn.ModuleList)
    assert isinstance(qm.param_quantizers, nn.ModuleDict)
    assert all(q is None for q in qm.input_quantizers)
    (out_q,) = qm.output_quantizers
    assert isinstance(out_q, Q.affine.QuantizeDequantize)
    assert (out_q.shape, out_q.qmin, out_q.qmax, out_q.symmetric) == ((), 0, 255, False)
    assert set(qm.param_quantizers) == {n for n, _ in fm.named_parameters()}
    if "bias" in qm.param_quantizers:
        assert qm.param_quantizers["bias"] is None
    if case in WEIGHTED or case.name == "Embedding":
        wq = qm.param_quantizers["weight"]
        axis = 1 if "Transpose" in case.name else 0
        expected = [1] * fm.weight.dim()
        expected[axis] = fm.weight.shape[axis]
        assert (wq.shape, wq.qmin, wq.qmax, wq.symmetric) == (tuple(expected), -128, 127, True)
    if case.name.startswith("BatchNorm"):  # simulated BN: only the normalised output is quantized
        assert all(q is None for q in qm.param_quantizers.values())
    if case.name in {"LayerNorm", "GroupNorm"}:
        wq = qm.param_quantizers["weight"]
        assert (wq.shape, wq.qmin, wq.qmax, wq.symmetric) == ((), -128, 127, True)
    # the float module is untouched
    assert not hasattr(fm, "param_quantizers") and "output_quantizers" not in fm._modules


@pytest.mark.parametrize("case", WEIGHTED, ids=repr)
def test_close_to_float(case):
    fm, qm = _build(case, quantize_inputs=True)
    inputs = case.inputs(torch.Generator().manual_seed(3))
    with qm.compute_encodings():  # calibrated on the data it sees: measures rounding, not clipping
        qm(*inputs)
    with torch.no_grad():
        assert _sqnr_db(fm(*inputs), _plain(qm(*inputs))) > 30


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_disabled_quantizers_give_float_result(case):
    fm, qm = _build(case, quantize_inputs=True)
    for i in range(len(qm.input_quantizers)):
        qm.input_quantizers[i] = None
    qm.output_quantizers[0] = None
    for name in qm.param_quantizers:
        qm.param_quantizers[name] = None
    inputs = case.inputs(torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(qm(*inputs), fm(*inputs))


@pytest.mark.parametrize("case", CASES, ids=repr)
def test_gradients_reach_weights_and_inputs(case):
    fm, qm = _build(case, quantize_inputs=True)
    qm.train()
    inputs = tuple(x.requires_grad_() if x.is_floating_point() else x for x in case.inputs(torch.Generator()
                                                                                          .manual_seed(1)))
    out = qm(*inputs)
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(2))).sum().backward()
    grads = [x.grad for x in inputs if x.is_floating_point()]
    if "weight" in qm.param_quantizers:
        grads.append(qm.weight.grad)
        assert fm.weight.grad is qm.weight.grad  # one parameter
    assert grads
    for g in grads:
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0


@pytest.mark.parametrize("case", [c for c in CASES if "weight" in dict(c.make().named_parameters())], ids=repr)
def test_parameters_and_config_shared(case):
    fm = case.make()
    qm = qnn.from_module(fm)
    for name, p in fm.named_parameters():
        assert getattr(qm, name) is p and getattr(qm, name).data_ptr() == p.data_ptr()
    for name, b in fm.named_buffers():
        assert getattr(qm, name) is b
    for k, v in vars(fm).items():
        if not k.startswith("_"):
            assert getattr(qm, k) == v, k
    # an in-place update of the float weight is seen by the quantized module
    with torch.no_grad():
        fm.weight.mul_(2)
    assert torch.equal(qm.weight, fm.weight)


def test_compute_encodings_enters_every_quantizer():
    fm = nn.Linear(8, 4)
    qm = qnn.QuantizedLinear.from_module(fm)
    qm.input_quantizers[0] = qnn.default_activation_quantizer()
    qm.param_quantizers["bias"] = Q.affine.QuantizeDequantize(shape=(), bitwidth=8, symmetric=True)
    quantizers = [qm.input_quantizers[0], qm.output_quantizers[0], qm.param_quantizers["weight"],
                  qm.param_quantizers["bias"]]
    assert not any(q.is_initialized() for q in quantizers)
    with pytest.raises(RuntimeError, match="compute_encodings"):
        qm(torch.randn(2, 8))
    x = torch.randn(16, 8)
    with qm.compute_encodings():
        qm(x)
    assert all(q.is_initialized() for q in quantizers)
    # the weight quantizer holds the per-channel encoding of the weight itself
    standalone = qnn.default_weight_quantizer(fm.weight)
    with standalone.compute_encodings():
        standalone(fm.weight)
    assert torch.equal(qm.param_quantizers["weight"].get_scale(), standalone.get_scale())


def test_compute_encodings_error_leaves_quantizers_uncalibrated():
    qm = qnn.QuantizedLinear(8, 4)
    class Boom(Exception):
        pass

    with pytest.raises(Boom), qm.compute_encodings():
        qm(torch.randn(2, 8))
        raise Boom
    assert not qm.output_quantizers[0].is_initialized()
    assert not qm.param_quantizers["weight"].is_initialized()


def test_direct_construction_matches_from_module():
    qm = qnn.QuantizedConv2d(3, 8, 3, stride=2)
    assert isinstance(qm, nn.Conv2d) and qm.stride == (2, 2)
    assert qm.param_quantizers["weight"].shape == (8, 1, 1, 1)


def test_batchnorm_training_updates_running_stats_like_float():
    fm = nn.BatchNorm2d(3)
    ref = copy.deepcopy(fm)
    qm = qnn.from_module(fm)
    qm.output_quantizers[0] = None
    x = torch.randn(4, 3, 5, 5)
    assert torch.equal(qm(x), ref(x))
    assert torch.equal(fm.running_mean, ref.running_mean) and int(fm.num_batches_tracked) == 1


def test_conv_transpose_output_size():
    fm = nn.ConvTranspose2d(2, 3, 3, stride=2)
    qm = qnn.from_module(fm)
    with qm.compute_encodings():
        qm(torch.randn(1, 2, 4, 4), output_size=[10, 10])
    assert qm(torch.randn(1, 2, 4, 4), output_size=[10, 10]).shape == (1, 3, 10, 10)


def test_binary_ops_accept_scalars():
    add = qnn.QuantizedAdd()
    add.input_quantizers[0] = qnn.default_activation_quantizer()
    add.input_quantizers[1] = qnn.default_activation_quantizer()
    with pytest.warns(RuntimeWarning, match="no input was seen"), add.compute_encodings():
        add(torch.randn(8), 1.5)
    assert not add.input_quantizers[1].is_initialized()  # a scalar is not a tensor to quantize
    assert add(torch.zeros(3), 1.0).shape == (3,)


def test_concat_quantizer_count_must_match_inputs():
    cat = qnn.QuantizedConcat(dim=0)
    cat.input_quantizers[0] = qnn.default_activation_quantizer()
    with pytest.raises(ValueError, match="resize input_quantizers"):
        cat(torch.randn(2), torch.randn(3))


# -------------------------------------------------------------- ReLU + output quantizer as one node (training)
def _relu_pair(learn_range: bool = False, input_quantizer: bool = False):
    fused = qnn.from_module(nn.ReLU())
    fused.output_quantizers[0].set_range(0.0, 1.5)
    if input_quantizer:
        fused.input_quantizers[0] = qnn.default_activation_quantizer()
        fused.input_quantizers[0].set_range(-2.0, 2.0)
    fused.output_quantizers[0].requires_grad_(learn_range)
    fused.plain_outputs = True
    reference = copy.deepcopy(fused)
    reference.plain_outputs = False  # the two-step path: ReLU, then the quantizer module
    return fused, reference


def _saved_bytes(fn) -> int:
    storages: dict[int, int] = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


@pytest.mark.parametrize("input_quantizer", [False, True])
def test_relu_with_output_quantizer_is_one_node_with_the_same_values_and_gradients(input_quantizer):
    fused, reference = _relu_pair(input_quantizer=input_quantizer)
    x = torch.tensor([-1.0, -0.0, 0.0, 0.004, 0.3, 1.2, 1.5, 1.6, 3.0, float("nan")]).repeat(10)
    x = torch.cat([x, 2 * torch.randn(900, generator=torch.Generator().manual_seed(0))]).requires_grad_()
    grad = torch.randn(x.shape, generator=torch.Generator().manual_seed(1))
    y = fused(x)
    assert type(y) is torch.Tensor and type(y.grad_fn).__name__ == "_ReluQDQBackward"
    (dx,) = torch.autograd.grad(y, x, grad)
    y_ref = reference(x)
    (dx_ref,) = torch.autograd.grad(y_ref, x, grad)
    assert torch.equal(torch.nan_to_num(y), torch.nan_to_num(_plain(y_ref)))  # NaN in, NaN out on both paths
    assert torch.equal(y.isnan(), _plain(y_ref).isnan())
    assert torch.equal(dx, dx_ref)


def test_fused_relu_keeps_one_byte_per_element_for_backward():
    fused, reference = _relu_pair()
    x = torch.randn(4096, requires_grad=True)
    h = x * 1.0  # a non-leaf input, as inside a network
    assert _saved_bytes(lambda: fused(h)) == 4096  # the combined bool mask
    assert _saved_bytes(lambda: reference(h)) == 4096 * 4 + 4096  # ReLU's float output + the quantizer's mask


def test_relu_with_learned_range_takes_the_two_step_path():
    fused, reference = _relu_pair(learn_range=True)
    x = torch.randn(256, requires_grad=True)
    y = fused(x)
    assert type(y.grad_fn).__name__ != "_ReluQDQBackward"
    y.sum().backward()
    q = fused.output_quantizers[0]
    assert q.max.grad is not None and float(q.max.grad.abs().sum()) > 0
    reference(x).sum().backward()
    assert torch.equal(q.max.grad, reference.output_quantizers[0].max.grad)
