"""A simulated model under ``torch.compile(fullgraph=True)`` and ``torch.export`` (issue 15).

The fake-quant kernels are ``quanta::`` custom ops (:mod:`quanta.kernels.ops`) and the forward of the
quantizers and quantized modules takes no data-dependent Python branch while tracing, so:

* calibrated sims of a small MLP and a small CNN compile with no graph break and give the eager outputs
  **bit for bit** with inductor: every quantizer is one opaque op running the eager kernel, scale and offset
  are elementwise float32 formulas (no reduction, nothing to reassociate), and the float layers between them
  compute the same values here;
* ``torch.export`` (non-strict, dynamic batch) works and its module gives the eager outputs bit for bit;
* a QAT step with learned ranges gives the eager loss bit for bit, and the eager gradients bit for bit under
  ``aot_eager`` (the AOTAutograd graph with the custom ops and their backward, no codegen). With inductor
  the gradients may differ in the last bits, as the float model's own do (inductor's generated reductions,
  e.g. a bias gradient summed over the batch or BatchNorm's backward, sum in another order): float
  reassociation in torch's ops, not in quantization;
* the custom ops pass ``torch.library.opcheck`` and give the eager kernels' values and gradients, ties included.

Compilation is slow on CI's 2 cores: few models, small ones.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

from quanta.grids.affine import IntegerGrid
from quanta.grids.float import FLOAT8_E4M3FN
from quanta.kernels import affine, float_cast
from quanta.nn import QuantizedLinear
from quanta.quantization.affine import Quantize, QuantizeDequantize
from quanta.quantization.float import FloatQuantizeDequantize
from quanta.quantsim import QuantizationSimModel
from quantsim_models import SmallCNN, make_cnn_data

# deep-copying the sim's GraphModule (the QAT twins) makes torch's pytree warn about its own LeafSpec
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.detach().as_subclass(torch.Tensor), b.detach().as_subclass(torch.Tensor)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b) and torch.equal(a.signbit(), b.signbit())


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 8))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return SmallCNN().eval()


def _sim(model: nn.Module, x: torch.Tensor, **kwargs) -> QuantizationSimModel:
    g = torch.Generator().manual_seed(1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, x, **kwargs)
        sim.compute_encodings([x + 0.1 * torch.randn(x.shape, generator=g) for _ in range(2)], progress=False)
    return sim


def _data(name: str, n: int, seed: int) -> torch.Tensor:
    if name == "mlp":
        return torch.randn(n, 16, generator=torch.Generator().manual_seed(seed))
    return make_cnn_data(n, seed=seed)[0]


_MODELS = {"mlp": _mlp, "cnn": _cnn}


def _grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


# ------------------------------------------------------------------------------------ calibrated sims
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_calibrated_sim_compiles_fullgraph_bit_identical(name):
    x = _data(name, 8, seed=2)
    sim = _sim(_MODELS[name](), x)
    model = sim.model.eval()
    compiled = torch.compile(model, fullgraph=True)  # fullgraph: a graph break is an error
    with torch.no_grad():
        eager, out = model(x), compiled(x)
    assert _bits_equal(eager, out)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_calibrated_sim_exports_with_dynamic_batch(name):
    x = _data(name, 8, seed=2)
    sim = _sim(_MODELS[name](), x)
    model = sim.model.eval()
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: Dim.AUTO},), strict=False)
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert "quanta.quantize_dequantize.default" in targets
    assert not any("equal" in t or "item" in t or "_local_scalar_dense" in t for t in targets), targets
    other = _data(name, 5, seed=3)  # another batch size than the example input's
    with torch.no_grad():
        assert _bits_equal(ep.module()(other), model(other))
        assert _bits_equal(ep.module()(x), model(x))


def test_loaded_sim_exports():
    """A sim whose encodings come from load_state_dict (not calibration) is initialised while tracing too."""
    x = _data("mlp", 4, seed=2)
    sim = _sim(_mlp(), x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fresh = QuantizationSimModel(_mlp(), x)
    fresh.model.load_state_dict(sim.model.state_dict())
    ep = torch.export.export(fresh.model.eval(), (x,), strict=False)
    with torch.no_grad():
        assert _bits_equal(ep.module()(x), sim.model.eval()(x))


def test_uninitialized_quantizer_raises_while_tracing():
    x = _data("mlp", 4, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(_mlp(), x)  # never calibrated
    with pytest.raises(RuntimeError, match="not initialized"):
        torch.export.export(sim.model.eval(), (x,), strict=False)


# --------------------------------------------------------------------------------------------- QAT
def _qat_step(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    loss = F.mse_loss(model(x), target)
    loss.backward()
    return loss.detach()


@pytest.mark.parametrize("name, backend", [("mlp", "aot_eager"), ("cnn", "aot_eager"), ("mlp", "inductor")])
def test_qat_step_compiled_same_loss_and_gradients(name, backend):
    x = _data(name, 8, seed=2)
    sim = _sim(_MODELS[name](), x, quant_scheme="range_learning_min_max")
    eager = sim.model.train()
    traced = copy.deepcopy(eager)
    ranges = [n for n, p in eager.named_parameters() if n.endswith((".min", ".max")) and p.requires_grad]
    assert ranges, "range learning: min/max are parameters"
    target = torch.randn(eager(x).shape, generator=torch.Generator().manual_seed(4))
    eager.zero_grad()
    loss_eager = _qat_step(eager, x, target)
    loss_traced = _qat_step(torch.compile(traced, fullgraph=True, backend=backend), x, target)
    assert _bits_equal(loss_eager, loss_traced)  # the forward is bit-identical, inductor included
    ge, gt = _grads(eager), _grads(traced)
    assert ge.keys() == gt.keys() and set(ranges) <= ge.keys()
    assert all(ge[n].abs().sum() > 0 for n in ranges[:2]), "the ranges get gradients"
    if backend == "aot_eager":
        assert all(_bits_equal(ge[n], gt[n]) for n in ge), [n for n in ge if not _bits_equal(ge[n], gt[n])]
    else:  # inductor's own reductions (e.g. a bias gradient summed over the batch) may sum in another order
        for n in ge:
            torch.testing.assert_close(gt[n], ge[n], rtol=1e-5, atol=1e-6 * float(ge[n].abs().max()), msg=n)


def test_qat_sim_exports_in_train_mode():
    x = _data("mlp", 8, seed=2)
    sim = _sim(_mlp(), x, quant_scheme="range_learning_min_max")
    model = sim.model.train()
    ep = torch.export.export(model, (x,), strict=False)
    assert _bits_equal(ep.module()(x), model(x))


# ------------------------------------------------------------------------------- quantizers, float
def test_quantizers_compile_to_their_eager_values():
    """Q and float QDQ quantizers too; under tracing they return plain tensors with the eager values."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=g) * 3
    q = Quantize(shape=(6, 1), bitwidth=4, symmetric=True)
    q.set_range(-torch.rand(6, 1, generator=g) - 1, torch.rand(6, 1, generator=g) + 1)
    f = FloatQuantizeDequantize(dtype=torch.float8_e4m3fn, shape=(6, 1))
    f.set_range(torch.rand(6, 1, generator=g) + 2)
    for quantizer in (q, f):
        out = torch.compile(quantizer, fullgraph=True, backend="aot_eager")(x)
        assert type(out) is torch.Tensor
        assert _bits_equal(out, quantizer(x))


def test_float_output_quantizer_in_module_gradients():
    """A learnable float maxval: the compiled graph's gradients are the eager ones (aot_eager)."""
    torch.manual_seed(0)
    lin = QuantizedLinear(16, 8)
    lin.output_quantizers[0] = FloatQuantizeDequantize(dtype=torch.float8_e4m3fn)
    lin.output_quantizers[0].maxval = nn.Parameter(torch.tensor(2.0))
    with lin.compute_encodings():
        lin(torch.randn(32, 16))
    twin = copy.deepcopy(lin)
    x = torch.randn(4, 16)
    lin(x).square().sum().backward()
    torch.compile(twin, fullgraph=True, backend="aot_eager")(x).square().sum().backward()
    for (n, a), (_, b) in zip(lin.named_parameters(), twin.named_parameters()):
        assert _bits_equal(a.grad, b.grad), n


# ------------------------------------------------------------------------------------- custom ops
def _affine_cases():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=g)
    s_t, s_c, s_b = torch.tensor(0.02), torch.rand(6, 1, generator=g) * 0.02 + 0.01, torch.rand(6, 4, generator=g) * 0.3
    x_tie = torch.arange(-8, 8).float().add(0.5).mul(0.25).repeat(6, 1)  # exact ties of the per-tensor scale
    return {
        "per-tensor": (x, s_t, torch.tensor(-3.0), IntegerGrid(0, 255), None),
        "per-tensor ties": (x_tie, torch.tensor(0.25), torch.tensor(0.0), IntegerGrid(-8, 7), None),
        "per-channel": (x, s_c, torch.zeros(6, 1), IntegerGrid(-128, 127), None),
        "per-block": (x, s_b, torch.round(torch.randn(6, 4, generator=g)), IntegerGrid(-8, 7), (-1, 4)),
        "per-block fp16": (x.half(), s_b, torch.zeros(6, 4), IntegerGrid(0, 15), (1, 4)),
    }


@pytest.mark.parametrize("case", list(_affine_cases()))
@pytest.mark.parametrize("mode", ["qdq", "q"])
def test_affine_ops_equal_eager_kernels_with_gradients(case, mode):
    x, s, o, grid, block = _affine_cases()[case]
    eager_fn = affine.quantize_dequantize if mode == "qdq" else affine.quantize
    op = torch.ops.quanta.quantize_dequantize if mode == "qdq" else torch.ops.quanta.quantize
    leaves = [t.detach().clone().requires_grad_() for t in (x, s, o)]
    leaves2 = [t.detach().clone().requires_grad_() for t in (x, s, o)]
    ref = eager_fn(*leaves, grid, block)
    out = op(*leaves2, grid.qmin, grid.qmax, None if block is None else list(block))
    assert _bits_equal(ref, out)
    grad = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5)).to(ref.dtype)
    for a, b in zip(torch.autograd.grad(ref, leaves, grad), torch.autograd.grad(out, leaves2, grad)):
        assert _bits_equal(a, b)
    # only the input needs a gradient: eager keeps a mask, the op recomputes it -- same values
    xi, xj = x.clone().requires_grad_(), x.clone().requires_grad_()
    (da,) = torch.autograd.grad(eager_fn(xi, s, o, grid, block), xi, grad)
    (db,) = torch.autograd.grad(op(xj, s, o, grid.qmin, grid.qmax, None if block is None else list(block)), xj, grad)
    assert _bits_equal(da, db)


def _opcheck_cases():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=g, requires_grad=True)
    rg = lambda t: t.requires_grad_()  # noqa: E731
    return {
        "qdq per-tensor": (torch.ops.quanta.quantize_dequantize,
                           (x, rg(torch.tensor(0.02)), rg(torch.tensor(-3.0)), 0, 255, None)),
        "qdq per-channel": (torch.ops.quanta.quantize_dequantize,
                            (x, torch.rand(6, 1, generator=g) * 0.02 + 0.01, torch.zeros(6, 1), -128, 127, None)),
        "qdq per-block": (torch.ops.quanta.quantize_dequantize,
                          (x, rg(torch.rand(6, 4, generator=g) * 0.3), rg(torch.zeros(6, 4)), -8, 7, [-1, 4])),
        "q per-channel": (torch.ops.quanta.quantize,
                          (x, rg(torch.rand(6, 1, generator=g) * 0.02 + 0.01), torch.zeros(6, 1), -128, 127, None)),
        "dq float codes per-block": (torch.ops.quanta.dequantize,
                                     (rg(torch.randint(-8, 8, (6, 16), generator=g).float()),
                                      rg(torch.rand(6, 4, generator=g) + 0.1), rg(torch.zeros(6, 4)), [-1, 4], None)),
        "dq uint8 codes": (torch.ops.quanta.dequantize,
                           (torch.randint(0, 255, (6, 16), generator=g, dtype=torch.uint8),
                            torch.rand(6, 1, generator=g) + 0.1, torch.zeros(6, 1), None, torch.float16)),
        "float per-channel": (torch.ops.quanta.float_quantize_dequantize,
                              (x, rg(torch.rand(6, 1, generator=g) + 0.01), 4, 3, "fn", None)),
        "float fp4 per-block": (torch.ops.quanta.float_quantize_dequantize,
                                (x, rg(torch.rand(6, 2, generator=g) + 0.01), 2, 1, "finite", [-1, 8])),
    }


@pytest.mark.parametrize("case", list(_opcheck_cases()))
def test_custom_ops_pass_opcheck(case):
    op, args = _opcheck_cases()[case]
    result = torch.library.opcheck(op, args)
    assert all(v == "SUCCESS" for v in result.values()), result


def test_dequantize_op_gradients_equal_eager():
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-8, 8, (6, 16), generator=g).float()
    s, o = torch.rand(6, 4, generator=g) + 0.1, torch.round(torch.randn(6, 4, generator=g))
    a = [t.clone().requires_grad_() for t in (q, s, o)]
    b = [t.clone().requires_grad_() for t in (q, s, o)]
    ref = affine.dequantize(*a, (-1, 4))
    out = torch.ops.quanta.dequantize(*b, [-1, 4], None)
    assert _bits_equal(ref, out)
    grad = torch.randn(ref.shape, generator=g)
    for x, y in zip(torch.autograd.grad(ref, a, grad), torch.autograd.grad(out, b, grad)):
        assert _bits_equal(x, y)


def test_float_op_equals_eager_kernel_with_gradients():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=g) * 4
    x[0, :3] = torch.tensor([float("nan"), float("inf"), 1000.0])
    s = torch.rand(6, 1, generator=g) + 0.5
    a = [t.clone().requires_grad_() for t in (x, s)]
    b = [t.clone().requires_grad_() for t in (x, s)]
    ref = float_cast.quantize_dequantize(*a, FLOAT8_E4M3FN)
    out = torch.ops.quanta.float_quantize_dequantize(*b, 4, 3, "fn", None)
    assert _bits_equal(torch.nan_to_num(ref), torch.nan_to_num(out)) and torch.equal(ref.isnan(), out.isnan())
    grad = torch.randn(ref.shape, generator=g)
    for u, v in zip(torch.autograd.grad(ref, a, grad), torch.autograd.grad(out, b, grad)):
        assert _bits_equal(u, v)


def test_ops_reject_mismatched_offset():
    with pytest.raises(ValueError, match="offset shape"):
        torch.ops.quanta.quantize_dequantize(torch.randn(4, 8), torch.rand(4, 1), torch.zeros(1, 8), 0, 255, None)


# ------------------------------------------------------------------------ captured transformers (the zoo)
# Real captured sims (torch.export graphs of transformers models, keyword inputs), built and calibrated as
# tests/quantsim/test_zoo.py builds them: the sim's GraphModule compiles and exports as a whole.
_ZOO: dict[str, object] = {}


def _zoo(name: str):
    if name not in _ZOO:
        from zoo_models import simulate

        _ZOO[name] = simulate(name)
    return _ZOO[name]


def _zoo_inputs(z, seed: int = 2) -> dict:
    from zoo_models import EVALUATION

    torch.manual_seed(seed)
    return z.inputs(*EVALUATION)


@pytest.mark.parametrize("name", ["bert", "llama", "resnet"])
def test_zoo_sim_exports_bit_identical(name):
    z = _zoo(name)
    model, x = z.sim.model.eval(), _zoo_inputs(z)
    ep = torch.export.export(model, (), x, strict=False)
    assert "quanta.quantize_dequantize.default" in {str(n.target) for n in ep.graph.nodes}
    with torch.no_grad():
        assert _bits_equal(ep.module()(**x)[z.key], model(**x)[z.key])


def test_zoo_sim_compiles_fullgraph():
    """BERT's sim compiles with no graph break. Through AOTAutograd (``aot_eager``) it is bit-identical: the
    quantizers are opaque ops running the eager kernels. Inductor generates its own code for LayerNorm, softmax,
    GELU and tanh, whose values differ from the eager ATen kernels' in the last bits (the float model's compiled
    outputs differ from its eager ones the same way); a quantizer hides such a difference unless the value lies on
    a rounding boundary, where it becomes one step of that quantizer: a few elements of the output, by one step
    of the final LayerNorm's (16-bit) output quantizer."""
    z = _zoo("bert")
    model, x = z.sim.model.eval(), _zoo_inputs(z)
    with torch.no_grad():
        eager = model(**x)[z.key]
        exact = torch.compile(model, fullgraph=True, backend="aot_eager")(**x)[z.key]
        torch._dynamo.reset()
        inductor = torch.compile(model, fullgraph=True)(**x)[z.key]
    assert _bits_equal(exact, eager)
    step = float(dict(model.named_modules())["encoder.layer.1.output.LayerNorm"].output_quantizers[0].get_scale())
    differ = inductor != eager
    assert differ.float().mean() < 0.01
    torch.testing.assert_close(inductor, eager, rtol=0, atol=step * 1.001)


@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_zoo_qat_step_compiled_same_loss_and_gradients(name):
    """A training step (dropout on, BatchNorm in training mode) under ``torch.compile(fullgraph=True)``
    (``aot_eager``): the eager loss, gradients and BatchNorm statistics, bit for bit. Parameters whose output
    the loss does not use (BERT's pooler) get zero gradients there and None in eager mode.

    ResNet's BatchNorms get ``momentum=0.1``: the zoo settles their statistics with ``momentum=None`` (a
    cumulative average), whose factor ``1 / num_batches_tracked`` no tracer can take (torch's own BatchNorm
    fails the same way under ``fullgraph=True``)."""
    z = _zoo(name)
    x = _zoo_inputs(z)
    with torch.no_grad():
        target = torch.randn(z.sim.model.eval()(**x)[z.key].shape, generator=torch.Generator().manual_seed(4))
    eager = copy.deepcopy(z.sim.model).train()
    for m in eager.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.momentum = 0.1
    traced = copy.deepcopy(eager)
    compiled = torch.compile(traced, fullgraph=True, backend="aot_eager")
    losses = []
    for model in (eager, compiled):
        torch.manual_seed(7)  # the same dropout masks
        loss = F.mse_loss(model(**x)[z.key], target)
        loss.backward()
        losses.append(loss.detach())
    assert _bits_equal(*losses)
    ge, gt = _grads(eager), _grads(traced)
    assert ge and set(ge) <= set(gt) and all(not gt[n].any() for n in set(gt) - set(ge))
    assert all(_bits_equal(ge[n], gt[n]) for n in ge), [n for n in ge if not _bits_equal(ge[n], gt[n])]
    for (n, a), (_, b) in zip(eager.named_buffers(), traced.named_buffers()):
        assert _bits_equal(a, b), n
