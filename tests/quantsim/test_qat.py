"""QuantizationSimModel end to end: W8A8 PTQ quality, W4A8 QAT, and the straight-through gradients.

* PTQ: the reference models of :mod:`quantsim_models` are trained briefly in
  float, then simulated at W8A8 (min_max) and compared with float on held-out
  data (output SQNR, loss, accuracy).
* QAT: at W4A8 with ``range_learning_min_max``, a few epochs of training on
  ``sim.model`` lower the task loss below the PTQ result and move the ranges;
  a post-training scheme keeps them frozen while the weights train.
* Gradients: in float64, the autograd gradients of the affine and float
  quantizers w.r.t. input and range equal central finite differences of the
  straight-through surrogate (``round(z)`` replaced by ``z + r``, with
  ``r = round(z) - z`` held at its value at the unperturbed point).

The numbers behind the thresholds are printed (``pytest -s``).
"""

from __future__ import annotations

import contextlib
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from quanta.grids.float import FLOAT8_E4M3FN, FP4_E2M1
from quanta.kernels import native
from quanta.kernels.float_cast import fake_cast
from quanta.quantization.affine import Quantize, QuantizeDequantize
from quanta.quantization.float import FloatQuantizeDequantize
from quanta.quantsim import INTEGER_ONLY, QuantizationSimModel, QuantSimConfig
from quantsim_models import SeqClassifier, SmallCNN, TransformerBlock, make_cnn_data, make_seq_data, sqnr_db

EPS32 = torch.finfo(torch.float32).eps


# ---------------------------------------------------------------------------------------- helpers
def _train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, lr: float, seed: int = 0,
           batch: int = 64) -> None:
    """Adam on every parameter of ``model`` (frozen ones included: they have no grad and stay as they are)."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(0, len(x), batch):
            idx = perm[i:i + batch]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()


@torch.no_grad()
def _evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """``(logits, loss, accuracy)`` in eval mode."""
    model.eval()
    out = model(x)
    out = out.as_subclass(torch.Tensor) if isinstance(out, torch.Tensor) else out
    return out, F.cross_entropy(out, y).item(), (out.argmax(1) == y).double().mean().item()


def _sim(model: nn.Module, dummy: torch.Tensor, **kwargs) -> QuantizationSimModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # ops kept in float (e.g. flatten / mean) are named in a warning
        return QuantizationSimModel(model, dummy, **kwargs)


def _ranges(sim: QuantizationSimModel) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {n: (q.min.detach().clone(), q.max.detach().clone()) for n, q in sim.named_quantizers()}


def _same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _batches(x: torch.Tensor, n: int, size: int) -> list[torch.Tensor]:
    return [x[i:i + size] for i in range(0, n, size)]


# ---------------------------------------------------------------------------------------- trained float models
class Task:
    def __init__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, n_train: int) -> None:
        self.model = model
        self.x_train, self.y_train = x[:n_train], y[:n_train]
        self.x_test, self.y_test = x[n_train:], y[n_train:]
        self.calibration = _batches(self.x_train, 512, 128)


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Training is reproducible bit for bit only at a fixed thread count: the thresholds were measured at 1."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def cnn_task() -> Task:
    torch.manual_seed(4)
    x, y = make_cnn_data(1280, seed=0)
    task = Task(SmallCNN(width=16), x, y, 1024)
    _train(task.model, task.x_train, task.y_train, epochs=8, lr=3e-3, seed=4)
    return task


@pytest.fixture(scope="module")
def seq_task() -> Task:
    # one draw split in two: the class directions of make_seq_data depend on its seed
    torch.manual_seed(0)
    x, y = make_seq_data(1024, seed=0)
    task = Task(SeqClassifier(), x, y, 768)
    # trained to ~0.56 loss (97% accuracy) only: at W4 the PTQ model then has a loss QAT can visibly lower
    _train(task.model, task.x_train, task.y_train, epochs=3, lr=1e-3)
    return task


def test_the_float_models_learned_their_tasks(cnn_task, seq_task):
    for task, acc_min in ((cnn_task, 0.9), (seq_task, 0.9)):
        _, loss, acc = _evaluate(task.model, task.x_test, task.y_test)
        print(f"\n{type(task.model).__name__} float: loss {loss:.4f} accuracy {acc:.4f}")
        assert acc >= acc_min


# ---------------------------------------------------------------------------------------- W8A8 PTQ
def test_cnn_w8a8_min_max_is_close_to_float(cnn_task):
    """Output SQNR >= 40 dB, loss and accuracy within 0.01 of float.

    The SQNR depends on the trained weights more than on the quantizers: this
    recipe gives 40.4-42.5 dB over model seeds 0-5 (42.1 for the seed used);
    narrower nets trained to a lower loss (width 8, loss ~0.02) give 36-39 dB,
    with per-channel 8-bit weights of the 27-tap first conv and the per-tensor
    ReLU outputs as the weakest quantizers (``sim.layer_sqnr``).
    """
    ref, loss, acc = _evaluate(cnn_task.model, cnn_task.x_test, cnn_task.y_test)
    sim = _sim(cnn_task.model, cnn_task.x_train[:8])
    sim.compute_encodings(cnn_task.calibration, progress=False)
    out, qloss, qacc = _evaluate(sim.model, cnn_task.x_test, cnn_task.y_test)
    sqnr = sqnr_db(ref, out)
    print(f"\nSmallCNN W8A8 min_max: output SQNR {sqnr:.2f} dB; loss {loss:.4f} -> {qloss:.4f}, "
          f"accuracy {acc:.4f} -> {qacc:.4f}")
    assert sqnr >= 40.0
    assert abs(qacc - acc) <= 0.01
    assert abs(qloss - loss) <= 0.01


def _block_sqnrs(block: nn.Module, x_cal: list[torch.Tensor], x_test: torch.Tensor) -> dict[str, tuple[float, int]]:
    """Output SQNR of ``block`` at W8A8 MinMax and its number of quantizers, per placement:

    ``default`` (traced, the built-in config: residual adds in float), ``integer_only`` (every tensor quantized),
    ``integer_only_add16`` (the adds at 16 bits) and ``modules_only`` (``trace=False``: functional ops in float,
    AIMET without its model preparer)."""
    block.eval()
    with torch.no_grad():
        ref = block(x_test)
    add16 = QuantSimConfig.load(INTEGER_ONLY).to_dict()
    add16["op_type"]["Add"] = {"bitwidth": 16}
    placements = {"default": {}, "integer_only": {"config_file": INTEGER_ONLY},
                  "integer_only_add16": {"config_file": add16}, "modules_only": {"trace": False}}
    result = {}
    for name, kwargs in placements.items():
        sim = _sim(block, x_test[:4], **kwargs)
        sim.compute_encodings(x_cal, progress=False)
        with torch.no_grad():
            result[name] = (sqnr_db(ref, sim.model(x_test)), sum(1 for _ in sim.named_quantizers()))
    return result


def _print_block_sqnrs(title: str, sqnrs: dict[str, tuple[float, int]]) -> None:
    print(f"\n{title} W8A8: " + ", ".join(f"{k} {db:.2f} dB ({n} quantizers)" for k, (db, n) in sqnrs.items()))


def test_transformer_block_w8a8_sqnr():
    """A freshly initialised block (no task of its own): the issue's acceptance number, >= 40 dB by default.

    Traced, the default quantizes every activation but the residual adds' outputs (LayerNorms, Linears, GELU,
    both matmuls, softmax): ~48 dB. Quantizing the adds too (INTEGER_ONLY) adds two 8-bit per-tensor
    quantizers on the widest tensors, each capping the output near 38.5 dB: ~35 dB. AIMET 2.42 measured
    on this block and data: 46.6 dB as is (module outputs only), 33.7 dB after its model preparer.
    """
    torch.manual_seed(0)
    block = TransformerBlock()
    x, _ = make_seq_data(512, seed=0)
    sqnrs = _block_sqnrs(block, _batches(x, 256, 64), x[256:])
    _print_block_sqnrs("TransformerBlock (untrained)", sqnrs)
    assert sqnrs["default"][0] >= 40.0
    assert sqnrs["integer_only"][0] >= 33.0
    assert sqnrs["integer_only_add16"][0] >= 45.0  # the recipe README gives for integer-only backends
    assert sqnrs["modules_only"][0] >= 40.0
    # the default quantizes the matmuls and softmax that trace=False leaves in float; INTEGER_ONLY the adds too
    assert sqnrs["modules_only"][1] < sqnrs["default"][1] < sqnrs["integer_only"][1]


def test_trained_transformer_block_w8a8_sqnr(seq_task):
    """The block of the trained SeqClassifier: training spreads the activations, every number drops a little."""
    sqnrs = _block_sqnrs(seq_task.model.block, seq_task.calibration, seq_task.x_test)
    _print_block_sqnrs("TransformerBlock (trained)", sqnrs)
    assert sqnrs["default"][0] >= 40.0
    assert sqnrs["integer_only"][0] >= 33.0
    assert sqnrs["default"][0] > sqnrs["integer_only"][0]


def test_seq_classifier_w8a8_min_max_is_close_to_float(seq_task):
    ref, loss, acc = _evaluate(seq_task.model, seq_task.x_test, seq_task.y_test)
    sim = _sim(seq_task.model, seq_task.x_train[:8])
    sim.compute_encodings(seq_task.calibration, progress=False)
    out, qloss, qacc = _evaluate(sim.model, seq_task.x_test, seq_task.y_test)
    sqnr = sqnr_db(ref, out)
    print(f"\nSeqClassifier W8A8 min_max: logits SQNR {sqnr:.2f} dB; loss {loss:.4f} -> {qloss:.4f}, "
          f"accuracy {acc:.4f} -> {qacc:.4f}")
    assert sqnr >= 40.0
    assert abs(qacc - acc) <= 0.01
    assert abs(qloss - loss) <= 0.01


# ---------------------------------------------------------------------------------------- W4A8 QAT
QAT = {
    # task fixture, param_quant_scheme, epochs, learning rate
    "cnn": ("cnn_task", "min_max", 2, 1e-3),
    "seq": ("seq_task", "min_max", 2, 1e-3),
    "cnn_weight_ranges_too": ("cnn_task", "range_learning_min_max", 2, 1e-3),
}


@pytest.mark.parametrize("name", sorted(QAT))
def test_w4a8_range_learning_qat_improves_on_ptq(name, request):
    fixture, param_scheme, epochs, lr = QAT[name]
    task: Task = request.getfixturevalue(fixture)
    sim = _sim(task.model, task.x_train[:8], quant_scheme="range_learning_min_max", default_param_bw=4,
               param_quant_scheme=param_scheme)
    sim.compute_encodings(task.calibration, progress=False)
    _, ptq_loss, ptq_acc = _evaluate(sim.model, task.x_test, task.y_test)
    names = {n for n, _ in sim.named_quantizers()}
    learned = {n for n, q in sim.named_quantizers() if q.min.requires_grad and q.max.requires_grad}
    frozen = {n for n, q in sim.named_quantizers() if not (q.min.requires_grad or q.max.requires_grad)}
    assert learned | frozen == names
    # activations learn their ranges; weights as param_quant_scheme says (min_max: frozen)
    weight_ranges = {n for n in names if ".param_quantizers." in n}
    assert weight_ranges and learned - weight_ranges
    assert frozen == (weight_ranges if param_scheme == "min_max" else set())
    before = _ranges(sim)
    weights = {n: p.detach().clone() for n, p in sim.model.named_parameters() if n.endswith("weight")}

    _train(sim.model, task.x_train, task.y_train, epochs=epochs, lr=lr, seed=1)

    _, qat_loss, qat_acc = _evaluate(sim.model, task.x_test, task.y_test)
    after = _ranges(sim)
    moved = {n for n in before if not _same(before[n], after[n])}
    print(f"\n{type(task.model).__name__} W4A8 (weights {param_scheme}): "
          f"PTQ loss {ptq_loss:.4f} accuracy {ptq_acc:.4f}; "
          f"QAT ({epochs} epochs) loss {qat_loss:.4f} accuracy {qat_acc:.4f}; "
          f"{len(moved)}/{len(learned)} learnable ranges moved")
    assert moved == learned
    assert all(not torch.equal(weights[n], p) for n, p in sim.model.named_parameters() if n in weights)
    assert qat_loss < 0.8 * ptq_loss
    assert qat_acc >= ptq_acc


def test_float8_range_learning_trains_maxval(cnn_task):
    """Float quantizers (``default_data_type=float``, 8 bits: e4m3fn) learn ``maxval`` with range learning only."""
    x, y = cnn_task.x_train[:256], cnn_task.y_train[:256]
    for scheme, learns in (("min_max", False), ("range_learning_min_max", True)):
        sim = _sim(cnn_task.model, x[:8], quant_scheme=scheme, param_quant_scheme=scheme, default_data_type=float)
        sim.compute_encodings(cnn_task.calibration[:1], progress=False)
        quantizers = dict(sim.named_quantizers())
        assert quantizers and all(isinstance(q, FloatQuantizeDequantize) for q in quantizers.values())
        assert all(isinstance(q.maxval, nn.Parameter) == learns for q in quantizers.values())
        before = {n: q.maxval.detach().clone() for n, q in quantizers.items()}
        _train(sim.model, x, y, epochs=1, lr=1e-3, seed=3)
        moved = {n for n, q in quantizers.items() if not torch.equal(before[n], q.maxval)}
        assert moved == (set(quantizers) if learns else set()), scheme


def test_post_training_scheme_keeps_ranges_fixed_while_weights_train(cnn_task):
    sim = _sim(cnn_task.model, cnn_task.x_train[:8], quant_scheme="min_max", default_param_bw=4)
    sim.compute_encodings(cnn_task.calibration, progress=False)
    assert all(not (q.min.requires_grad or q.max.requires_grad) for _, q in sim.named_quantizers())
    before = _ranges(sim)
    weights = {n: p.detach().clone() for n, p in sim.model.named_parameters() if n.endswith("weight")}
    _, ptq_loss, _ = _evaluate(sim.model, cnn_task.x_test, cnn_task.y_test)

    _train(sim.model, cnn_task.x_train[:512], cnn_task.y_train[:512], epochs=1, lr=1e-3, seed=2)

    _, loss, _ = _evaluate(sim.model, cnn_task.x_test, cnn_task.y_test)
    after = _ranges(sim)
    for n in before:
        assert _same(before[n], after[n]), n
    assert all(not torch.equal(weights[n], p) for n, p in sim.model.named_parameters() if n in weights)
    assert loss < ptq_loss


@pytest.mark.parametrize("scheme", ["min_max", "range_learning_min_max"])
@pytest.mark.parametrize("fixture", ["cnn_task", "seq_task"])
def test_one_training_step_under_anomaly_detection(fixture, scheme, request):
    task: Task = request.getfixturevalue(fixture)
    sim = _sim(task.model, task.x_train[:8], quant_scheme=scheme, param_quant_scheme=scheme, default_param_bw=4)
    sim.compute_encodings(task.calibration[:1], progress=False)
    opt = torch.optim.SGD(sim.model.parameters(), lr=1e-2)
    sim.model.train()
    with torch.autograd.set_detect_anomaly(True):
        loss = F.cross_entropy(sim.model(task.x_train[:32]), task.y_train[:32])
        opt.zero_grad()
        loss.backward()
    grads = [p.grad for p in sim.model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
    opt.step()


# ---------------------------------------------------------------------------------------- eval after training
# Under torch.no_grad() a quantized module reuses its fake-quantized weight while the weight and the range are
# unchanged (QuantizationMixin._qparam). The outputs must not depend on whether autograd is on.
def _eval_pair(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(output under no_grad, output with autograd on)``, both in eval mode."""
    model.eval()
    with torch.no_grad():
        cached = model(x)
    return cached, model(x).detach()


def _small_sim() -> tuple[QuantizationSimModel, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    x = torch.randn(32, 8)
    sim = _sim(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), x)
    sim.compute_encodings([x], progress=False)
    first = dict(sim.model.named_modules())["0"]
    cached, live = _eval_pair(sim.model, x)  # fills the cache
    assert torch.equal(cached, live)
    return sim, first, x


def test_eval_under_no_grad_sees_range_writes_through_data():
    # quantizer tensors are compared by value: even .data writes (no version bump) are seen without eval()
    sim, first, x = _small_sim()
    q = first.param_quantizers["weight"]
    q.min.data.mul_(0.5)
    q.max.data.mul_(0.5)
    with torch.no_grad():
        cached = sim.model(x)
    assert torch.equal(cached, sim.model(x).detach())


def test_eval_under_no_grad_sees_weight_writes_through_data_after_eval():
    # documented contract: a .data write bypasses version counters; calling eval() again drops the cache
    sim, first, x = _small_sim()
    first.weight.data.mul_(0.5)
    cached, live = _eval_pair(sim.model, x)
    assert torch.equal(cached, live)


def test_eval_under_no_grad_sees_in_place_weight_updates():
    sim, first, x = _small_sim()
    with torch.no_grad():
        first.weight.mul_(0.5)  # bumps the version counter, as optimizers and load_state_dict do
        cached = sim.model(x)
    assert torch.equal(cached, sim.model(x).detach())


def test_eval_under_no_grad_after_changing_the_dtype():
    sim, _, x = _small_sim()
    sim.model.double()
    cached, live = _eval_pair(sim.model, x.double())
    assert cached.dtype == live.dtype == torch.float64
    assert torch.equal(cached, live)


# ---------------------------------------------------------------------------------------- gradients vs finite diffs
def _expander(shape: tuple[int, ...], x_shape: tuple[int, ...], block_size: tuple[int, ...] | None):
    """Broadcast a ``shape``-shaped qparam to the input's shape (per tensor, per channel, or per block)."""
    def expand(t: torch.Tensor) -> torch.Tensor:
        for dim, (n_x, n_t) in enumerate(zip(x_shape, t.shape)):
            if n_t not in (1, n_x):
                t = t.repeat_interleave(n_x // n_t, dim=dim)
        return t.expand(x_shape)
    assert block_size is None or all(b in (-1, 1) or b * n == m for b, n, m in zip(block_size, shape, x_shape))
    return expand


def _s_min(n: int) -> float:
    return min(EPS32, 0.01 / n)


def _scale(mn: torch.Tensor, mx: torch.Tensor, n: int) -> torch.Tensor:
    return torch.clamp_min((mx - mn).abs(), n * _s_min(n)) / n


class AffineSurrogate:
    """The straight-through surrogate of the affine quantizers, as a differentiable function of (x, min, max).

    With ``N = qmax - qmin``, ``s = max(|max - min|, N s_min) / N`` (the clamp is
    kept), asymmetric ``o = clamp(min / s + r_o, qmin - qmax, 0) - qmin``,
    symmetric ``o = -round((qmin + qmax) / 2)``, and ``v = clamp(x / s + r_x - o, qmin, qmax)``:
    ``QDQ = (v + o) s`` and ``Q = v``. ``r_x = round(x/s) - x/s`` and
    ``r_o = round(min/s) - min/s`` are taken at the unperturbed point and held
    constant. The offset's rounding is straight-through too, like the kernel's
    (:func:`quanta.kernels.qparams.offset_from_range` uses ``ste_round``): the
    offset is *not* a constant, its gradient reaches ``min`` and the scale.
    """

    def __init__(self, q, x: torch.Tensor, expand) -> None:
        self.qmin, self.qmax, self.symmetric, self.expand = q.qmin, q.qmax, q.symmetric, expand
        self.dequantize = isinstance(q, QuantizeDequantize)
        self.n = self.qmax - self.qmin
        self.min0, self.max0, self.x0 = q.min.detach().clone(), q.max.detach().clone(), x
        s = _scale(self.min0, self.max0, self.n)
        self.r_o = torch.round(self.min0 / s) - self.min0 / s
        z = x / expand(s)
        self.r_x = torch.round(z) - z

    def offset(self, mn: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        if self.symmetric:
            return torch.full_like(s, -round((self.qmin + self.qmax) / 2))
        return torch.clamp(mn / s + self.r_o, self.qmin - self.qmax, 0) - self.qmin

    def __call__(self, x: torch.Tensor, mn: torch.Tensor, mx: torch.Tensor) -> torch.Tensor:
        s = _scale(mn, mx, self.n)
        o = self.offset(mn, s)
        S, O = self.expand(s), self.expand(o)
        v = torch.clamp(x / S + self.r_x - O, self.qmin, self.qmax)
        return (v + O) * S if self.dequantize else v

    def margins(self) -> dict[str, float]:
        """Distances (in units of the grid) from every tie and kink of the rounding and the clamps."""
        s = _scale(self.min0, self.max0, self.n)
        z = self.x0 / self.expand(s)
        o = self.offset(self.min0, s)
        v = torch.round(z) - self.expand(o)  # the kernel's clamp test is on the rounded value: an integer
        out = {
            "x rounding tie": float(((z - z.floor()) - 0.5).abs().min()),
            "clamp at qmin/qmax": float(torch.minimum((v - self.qmin).abs(), (v - self.qmax).abs()).min()),
            "scale clamp": float(((self.max0 - self.min0).abs() / (self.n * _s_min(self.n)) - 1).abs().min()),
        }
        if not self.symmetric:
            m = self.min0 / s
            out["offset rounding tie"] = float(((m - m.floor()) - 0.5).abs().min())
            r = m + self.r_o
            out["offset clamp"] = float(torch.minimum((r - (self.qmin - self.qmax)).abs(), r.abs()).min())
        return out


def _assert_gradient(name: str, got: torch.Tensor | None, expected: torch.Tensor) -> None:
    assert got is not None and got.shape == expected.shape, name
    atol = 1e-6 * max(1.0, float(expected.abs().max()))
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=atol, msg=lambda m: f"{name} gradient: {m}")


def _central_differences(f, args: list[torch.Tensor], which: int, h: float) -> torch.Tensor:
    t = args[which]
    grad = torch.empty_like(t)
    for i in range(t.numel()):
        plus, minus = t.clone(), t.clone()
        plus.view(-1)[i] += h
        minus.view(-1)[i] -= h
        up = f(*args[:which], plus, *args[which + 1:])
        down = f(*args[:which], minus, *args[which + 1:])
        grad.view(-1)[i] = (up - down) / (2 * h)
    return grad


def _inputs_on_grid(q, x_shape, expand, gen: torch.Generator) -> torch.Tensor:
    """Inputs ``s * (code + o + u)``, ``|u| <= 0.4``, with codes inside ``[qmin, qmax]`` and beyond either end.

    No code is ``qmin`` or ``qmax`` themselves: there the clamp has a kink.
    """
    s = _scale(q.min.detach(), q.max.detach(), q.qmax - q.qmin)
    if q.symmetric:
        o = torch.full_like(s, -round((q.qmin + q.qmax) / 2))
    else:
        o = torch.clamp(torch.round(q.min.detach() / s), q.qmin - q.qmax, 0) - q.qmin
    side = torch.randint(0, 3, x_shape, generator=gen)  # below, inside, above the grid: a third each
    step = torch.randint(1, 5, x_shape, generator=gen)
    inside = torch.randint(q.qmin + 1, q.qmax, x_shape, generator=gen)
    codes = torch.where(side == 0, q.qmin - step, torch.where(side == 2, q.qmax + step, inside)).double()
    u = (torch.rand(x_shape, generator=gen, dtype=torch.float64) - 0.5) * 0.8
    return (codes + expand(o) + u) * expand(s)


def _ranges_4bit(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` 4-bit ranges: ``min = -(k + 0.3) s``, ``max = min + 15 s``, so ``min / s`` is 0.2 from a tie."""
    s = torch.linspace(0.05, 0.4, n, dtype=torch.float64)
    k = torch.arange(n, dtype=torch.float64) % 13 + 1
    lo = -(k + 0.3) * s
    return lo, lo + 15 * s


AFFINE_CASES = {
    # shape, x shape, bitwidth, symmetric, block_size, min, max
    "per_tensor_asymmetric_8bit": ((), (6, 10), 8, False, None, -2.37, 3.11),
    "per_tensor_symmetric_8bit": ((), (6, 10), 8, True, None, -2.37, 3.11),
    "per_channel_asymmetric_4bit": ((6, 1), (6, 10), 4, False, None, *(t.view(6, 1) for t in _ranges_4bit(6))),
    "per_channel_symmetric_4bit": ((6, 1), (6, 10), 4, True, None, *(t.view(6, 1) for t in _ranges_4bit(6))),
    "per_block_asymmetric_4bit": ((6, 2), (6, 10), 4, False, (1, 5),
                                  *(t.view(6, 2) for t in _ranges_4bit(12))),
    # min > 0: round(min / s) > 0 is clamped to 0, the offset is constant -qmin
    "positive_range_offset_clamped": ((), (6, 10), 8, False, None, 0.53, 3.0),
    # max - min below N * s_min: the scale is clamped (constant), min still reaches the offset
    "tiny_range_scale_clamped": ((), (6, 10), 8, False, None, -3.3e-6, -3.29e-6),
}


@pytest.mark.parametrize("path", ["native", "eager"])
@pytest.mark.parametrize("cls", [QuantizeDequantize, Quantize], ids=["QDQ", "Q"])
@pytest.mark.parametrize("case", sorted(AFFINE_CASES))
def test_affine_gradients_match_finite_differences_of_the_ste_surrogate(case, cls, path):
    """Autograd of ``cls`` (float64 input and range) against central differences of :class:`AffineSurrogate`.

    Read from the kernels (``kernels/affine.py`` backward, ``kernels/range_affine.py``,
    ``kernels/qparams.py``): the gradients are exactly those of the plain STE
    surrogate, no term is treated differently. The offset's rounding is
    straight-through (not a constant), the scale clamp and the offset clamp
    pass no gradient where active, and the clamp test of the input is on the
    rounded value ``round(x/s) - o`` (inclusive), which is why no input sits on
    ``qmin``/``qmax`` exactly. Both the native and the eager kernel, and the
    input-only (mask) backward, are checked.
    """
    shape, x_shape, bits, symmetric, block_size, lo, hi = AFFINE_CASES[case]
    q = cls(shape, bits, symmetric, block_size=block_size).double()
    q.set_range(lo, hi)
    assert q.min.dtype == q.max.dtype == torch.float64
    expand = _expander(shape, x_shape, block_size)
    gen = torch.Generator().manual_seed(sum(map(ord, case)))
    x = _inputs_on_grid(q, x_shape, expand, gen)
    surrogate = AffineSurrogate(q, x, expand)
    margins = surrogate.margins()
    assert margins["x rounding tie"] > 0.05 and margins["clamp at qmin/qmax"] >= 1 - 1e-9, margins
    assert margins["scale clamp"] > 0.01, margins
    if not symmetric:
        assert margins["offset rounding tie"] > 0.05 and margins["offset clamp"] > 0.05, margins
    s = _scale(surrogate.min0, surrogate.max0, surrogate.n)
    v = torch.round(x / expand(s))
    v = v - expand(surrogate.offset(surrogate.min0, s))
    assert (v < q.qmin).any() and (v > q.qmax).any() and ((v > q.qmin) & (v < q.qmax)).any()

    w = torch.randn(x_shape, generator=gen, dtype=torch.float64)  # upstream gradient: loss = sum(w * q(x))
    xr = x.clone().requires_grad_()
    with native.disabled() if path == "eager" else contextlib.nullcontext():
        y = q(xr).as_subclass(torch.Tensor)
        (w * y).sum().backward()
        # only the input needs a gradient: the mask path
        q.min.requires_grad_(False), q.max.requires_grad_(False)
        xm = x.clone().requires_grad_()
        (w * q(xm).as_subclass(torch.Tensor)).sum().backward()
    assert y.dtype == torch.float64
    torch.testing.assert_close(y.detach(), surrogate(x, surrogate.min0, surrogate.max0), rtol=0, atol=1e-12)
    torch.testing.assert_close(xm.grad, xr.grad, rtol=0, atol=0)

    loss = lambda *args: (w * surrogate(*args)).sum()  # noqa: E731
    args = [x, surrogate.min0, surrogate.max0]
    h = 1e-4 * float(s.min())  # moves every x/s by at most ~1e-4 steps: no kink is crossed
    expected = [_central_differences(loss, args, i, h) for i in range(3)]
    got = [xr.grad, q.min.grad, q.max.grad]
    for name, g, e in zip(("input", "min", "max"), got, expected):
        _assert_gradient(name, g, e)
    if case == "tiny_range_scale_clamped":
        assert torch.equal(q.max.grad, torch.zeros_like(q.max.grad))  # the clamped scale does not depend on max
    if symmetric:
        torch.testing.assert_close(q.min.grad, -q.max.grad, rtol=0, atol=1e-12)  # only max - min matters


def _float_inputs(fmt, shape_x, scale: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``x = s * v``: ``|v|`` log-uniform up to ``0.9 max``, ~15% saturated (``1.1 max`` and more), no rounding ties."""
    lo, hi = math.log2(fmt.min_normal) - 1, math.log2(0.9 * fmt.max)
    mag = torch.exp2(lo + (hi - lo) * torch.rand(shape_x, generator=gen, dtype=torch.float64))
    saturated = torch.rand(shape_x, generator=gen) < 0.15
    mag = torch.where(saturated, fmt.max * (1.1 + torch.rand(shape_x, generator=gen, dtype=torch.float64)), mag)
    sign = torch.where(torch.rand(shape_x, generator=gen) < 0.5, -1.0, 1.0).double()
    v = sign * mag
    # move values off the midpoints between two codes: the float grid's step at v
    _, e = torch.frexp(v)
    step = torch.exp2((torch.clamp_min(e - 1, fmt.emin) - fmt.mantissa_bits).double())
    frac = (v / step) - torch.floor(v / step)
    v = torch.where((frac - 0.5).abs() < 0.1, v + 0.25 * step, v)
    return v * scale


def _float_tie_margin(fmt, v: torch.Tensor) -> float:
    """Smallest distance of ``v`` (unsaturated entries) from a midpoint between two codes, in steps."""
    v = v[v.abs() <= fmt.max]
    _, e = torch.frexp(v)
    step = torch.exp2((torch.clamp_min(e - 1, fmt.emin) - fmt.mantissa_bits).double())
    frac = (v / step) - torch.floor(v / step)
    return float((frac - 0.5).abs().min())


FLOAT_CASES = {
    "e4m3fn_per_tensor": (FLOAT8_E4M3FN, (), (6, 10), 3.7),
    "e4m3fn_per_channel": (FLOAT8_E4M3FN, (6, 1), (6, 10), torch.linspace(0.3, 5.0, 6).view(6, 1)),
    "fp4_e2m1_per_channel": (FP4_E2M1, (6, 1), (6, 10), torch.linspace(0.3, 5.0, 6).view(6, 1)),
}


@pytest.mark.parametrize("path", ["native", "eager"])
@pytest.mark.parametrize("case", sorted(FLOAT_CASES))
def test_float_quantizer_maxval_gradient_matches_finite_differences(case, path):
    """``QDQ = cast(x/s) s``, ``s = maxval / fmax``; surrogate: ``(x/s + r) s`` inside, ``sign(x) maxval`` saturated."""
    fmt, shape, x_shape, maxval = FLOAT_CASES[case]
    q = FloatQuantizeDequantize(exponent_bits=fmt.exponent_bits, mantissa_bits=fmt.mantissa_bits,
                                finite=fmt.special.value != "ieee", shape=shape).double()
    assert q.format == fmt
    q.set_range(maxval)
    q.maxval = nn.Parameter(q.maxval.detach().clone())  # how QuantizationSimModel makes it learnable
    m0 = q.maxval.detach().clone()
    expand = _expander(shape, x_shape, None)
    gen = torch.Generator().manual_seed(sum(map(ord, case)))
    x = _float_inputs(fmt, x_shape, expand(m0 / fmt.max), gen)
    v0 = x / expand(m0 / fmt.max)
    inside = v0.abs() <= fmt.max
    r = fake_cast(v0, fmt) - v0
    assert inside.any() and (~inside).any()
    assert float((v0.abs() - fmt.max).abs().min()) > 0.05 * fmt.max  # away from the saturation kink
    assert _float_tie_margin(fmt, v0) > 0.05  # and from rounding ties

    def surrogate(x: torch.Tensor, maxval: torch.Tensor) -> torch.Tensor:
        # the kernel tests saturation on the unrounded x / s (|x/s| <= max), not on the cast value
        s = expand(maxval / fmt.max)
        v = x / s
        return torch.where(v.abs() <= fmt.max, (v + r) * s, torch.sign(v) * fmt.max * s)

    w = torch.randn(x_shape, generator=gen, dtype=torch.float64)
    xr = x.clone().requires_grad_()
    with native.disabled() if path == "eager" else contextlib.nullcontext():
        y = q(xr).as_subclass(torch.Tensor)
        (w * y).sum().backward()
    torch.testing.assert_close(y.detach(), surrogate(x, m0), rtol=0, atol=1e-12)
    loss = lambda *args: (w * surrogate(*args)).sum()  # noqa: E731
    h = 1e-6 * float(m0.min())
    for name, g, i in (("input", xr.grad, 0), ("maxval", q.maxval.grad, 1)):
        _assert_gradient(name, g, _central_differences(loss, [x, m0], i, h))
