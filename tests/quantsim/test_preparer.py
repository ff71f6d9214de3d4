"""quanta.quantsim.preparer: functional ops on float tensors become modules, everything else is left alone.

Reference for every case: the original model on the same input. The prepared
model runs the same float ops (now inside modules), so outputs must agree bit
for bit, and the original model must come out of ``prepare_model`` unchanged.
"""

from __future__ import annotations

import copy
import math
import operator
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

from quanta.nn import Add, Concat, Divide, MatMul, Multiply
from quanta.quantsim import CaptureMethod, PreparedModel, prepare_model
from quantsim_models import SmallCNN, TransformerBlock


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


class Fn(nn.Module):
    """A module whose forward is ``fn(self, *inputs)``: one functional op per test case."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x, y):
        return self.fn(x, y)


def _snapshot(model: nn.Module) -> tuple:
    return (
        [(name, type(m)) for name, m in model.named_modules()],
        {k: v.clone() for k, v in model.state_dict().items()},
        {name: m.training for name, m in model.named_modules()},
    )


def _assert_unchanged(model: nn.Module, before: tuple) -> None:
    modules, state, modes = _snapshot(model)
    assert modules == before[0]
    assert state.keys() == before[1].keys()
    for k, v in state.items():
        assert torch.equal(v, before[1][k]), k
    assert modes == before[2]


def _prepare_quietly(model, args, **kwargs) -> PreparedModel:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a model that traces must not warn
        return prepare_model(model, args, **kwargs)


# -- each supported op becomes one module ----------------------------------------------------------
X = torch.randn(2, 3, 4, generator=_gen(1))
Y = torch.randn(2, 3, 4, generator=_gen(2))
YT = torch.randn(2, 4, 3, generator=_gen(3))

# (id, fn(x, y), second input, expected kind (module name), module class, attributes to check)
OPS = [
    ("operator.add", lambda x, y: x + y, Y, "add", Add, {}),
    ("torch.add", lambda x, y: torch.add(x, y), Y, "add", Add, {}),
    ("Tensor.add", lambda x, y: x.add(y), Y, "add", Add, {}),
    ("add_scalar", lambda x, y: x + 1.5, Y, "add", Add, {}),
    ("operator.mul", lambda x, y: x * y, Y, "mul", Multiply, {}),
    ("torch.mul", lambda x, y: torch.mul(x, y), Y, "mul", Multiply, {}),
    ("Tensor.mul", lambda x, y: x.mul(y), Y, "mul", Multiply, {}),
    ("torch.matmul", lambda x, y: torch.matmul(x, y), YT, "matmul", MatMul, {}),
    ("operator.matmul", lambda x, y: x @ y, YT, "matmul", MatMul, {}),
    ("torch.bmm", lambda x, y: torch.bmm(x, y), YT, "matmul", MatMul, {}),
    ("Tensor.matmul", lambda x, y: x.matmul(y), YT, "matmul", MatMul, {}),
    ("cat_list_dim_kw", lambda x, y: torch.cat([x, y], dim=1), Y, "cat", Concat, {"dim": 1}),
    ("cat_tuple_dim_pos", lambda x, y: torch.cat((x, y, x), -1), Y, "cat", Concat, {"dim": -1}),
    ("cat_default_dim", lambda x, y: torch.cat([x, y]), Y, "cat", Concat, {"dim": 0}),
    ("torch.concat", lambda x, y: torch.concat([y, x], dim=2), Y, "cat", Concat, {"dim": 2}),
    ("torch.softmax", lambda x, y: torch.softmax(x, dim=-1), Y, "softmax", nn.Softmax, {"dim": -1}),
    ("Tensor.softmax", lambda x, y: x.softmax(1), Y, "softmax", nn.Softmax, {"dim": 1}),
    ("Tensor.softmax_kw", lambda x, y: x.softmax(dim=0), Y, "softmax", nn.Softmax, {"dim": 0}),
    ("F.relu", lambda x, y: F.relu(x), Y, "relu", nn.ReLU, {}),
    ("F.relu_inplace_false", lambda x, y: F.relu(x, inplace=False), Y, "relu", nn.ReLU, {"inplace": False}),
    ("torch.relu", lambda x, y: torch.relu(x), Y, "relu", nn.ReLU, {}),
    ("Tensor.relu", lambda x, y: x.relu(), Y, "relu", nn.ReLU, {}),
    ("F.gelu", lambda x, y: F.gelu(x), Y, "gelu", nn.GELU, {"approximate": "none"}),
    ("F.gelu_tanh", lambda x, y: F.gelu(x, approximate="tanh"), Y, "gelu", nn.GELU, {"approximate": "tanh"}),
    ("F.silu", lambda x, y: F.silu(x), Y, "silu", nn.SiLU, {}),
]


@pytest.mark.parametrize("fn, y, kind, cls, attrs", [o[1:] for o in OPS], ids=[o[0] for o in OPS])
def test_functional_op_becomes_module(fn, y, kind, cls, attrs):
    model = Fn(fn)
    prepared = _prepare_quietly(model, (X, y))
    assert prepared.traced and prepared.trace_error is None
    assert [(name, type(m)) for name, m in prepared.inserted] == [(kind, cls)]
    module = prepared.inserted[0][1]
    assert prepared.model.get_submodule(kind) is module
    for key, value in attrs.items():
        assert getattr(module, key) == value, key
    assert prepared.float_ops == []
    # the op is gone from the graph: one call_module node does the work
    calls = [n for n in prepared.graph.nodes if n.op in ("call_function", "call_method")]
    assert calls == []
    assert [n.target for n in prepared.graph.nodes if n.op == "call_module"] == [kind]
    assert torch.equal(prepared.model(X, y), fn(X, y))


def test_functional_softmax_becomes_module():
    fn = lambda x, y: F.softmax(x, dim=-1)  # noqa: E731
    prepared = _prepare_quietly(Fn(fn), (X, Y))
    assert [(name, type(m)) for name, m in prepared.inserted] == [("softmax", nn.Softmax)]
    assert prepared.inserted[0][1].dim == -1
    assert prepared.float_ops == []
    assert torch.equal(prepared.model(X, Y), fn(X, Y))


def test_repeated_ops_get_counters_in_graph_order():
    class M(nn.Module):
        def forward(self, x, y):
            a = x + y
            b = torch.matmul(a, y.transpose(1, 2))
            c = a.add(x)
            d = b @ c
            return torch.add(d, 1.0) * d

    prepared = _prepare_quietly(M(), (X, Y))
    names = [name for name, _ in prepared.inserted]
    assert names == ["add", "matmul", "add_1", "matmul_1", "add_2", "mul"]
    assert torch.equal(prepared.model(X, Y), M()(X, Y))


# -- names are scoped under the module whose forward made the call ------------------------------
class Attn(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.q = nn.Linear(dim, dim)

    def forward(self, x):
        s = torch.matmul(self.q(x), x.transpose(-1, -2)) / math.sqrt(x.shape[-1])
        return torch.softmax(s, dim=-1) @ x


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.attn = Attn(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        x = x + self.attn(x)
        return x + F.gelu(self.fc(x))


class Stack(nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(dim), Block(dim)])
        self.add = nn.Identity()  # takes the name "add" at the top level

    def forward(self, x):
        h = x
        for block in self.blocks:
            h = block(h)
        return self.add(h) + x


def test_inserted_modules_are_scoped_under_the_calling_module():
    torch.manual_seed(0)
    model = Stack().eval()
    x = torch.randn(2, 5, 8, generator=_gen(4))
    prepared = prepare_model(model, x, methods=("fx",))  # fx keeps the Identity as a module
    names = [name for name, _ in prepared.inserted]
    expected = []
    for i in (0, 1):
        expected += [f"blocks.{i}.attn.matmul", f"blocks.{i}.attn.div", f"blocks.{i}.attn.softmax",
                     f"blocks.{i}.attn.matmul_1", f"blocks.{i}.add", f"blocks.{i}.gelu", f"blocks.{i}.add_1"]
    expected.append("add_1")  # "add" is taken by the Identity
    assert names == expected
    for name, module in prepared.inserted:
        assert prepared.model.get_submodule(name) is module
    assert isinstance(prepared.model.get_submodule("add"), nn.Identity)
    assert prepared.float_ops == []
    assert torch.equal(prepared.model(x), model(x))


def test_graph_property():
    prepared = _prepare_quietly(Fn(lambda x, y: x + y), (X, Y))
    assert isinstance(prepared.model, fx.GraphModule) and prepared.graph is prepared.model.graph


# -- reference models --------------------------------------------------------------------------------
def test_transformer_block_prepared():
    torch.manual_seed(0)
    model = TransformerBlock().eval()
    x = torch.randn(2, 6, 32, generator=_gen(5))
    before = _snapshot(model)
    prepared = prepare_model(model, x)
    assert prepared.method is CaptureMethod.EXPORT
    assert [(n, type(m)) for n, m in prepared.inserted] == [
        ("matmul", MatMul), ("div", Divide), ("softmax", nn.Softmax), ("matmul_1", MatMul), ("add", Add),
        ("add_1", Add)]
    assert prepared.float_ops == []
    with torch.no_grad():
        assert torch.equal(prepared.model(x), model(x))
    _assert_unchanged(model, before)


def test_small_cnn_prepared():
    torch.manual_seed(0)
    model = SmallCNN().eval()
    x = torch.randn(2, 3, 16, 16, generator=_gen(6))
    before = _snapshot(model)
    prepared = prepare_model(model, x)
    assert [(n, type(m)) for n, m in prepared.inserted] == [("relu", nn.ReLU), ("relu_1", nn.ReLU)]
    assert prepared.float_ops == []  # flatten is a passthrough
    with torch.no_grad():
        assert torch.equal(prepared.model(x), model(x))
    _assert_unchanged(model, before)


def test_prepared_model_shares_parameters_and_leaves_the_original_alone():
    torch.manual_seed(0)
    model = Stack()
    x = torch.randn(2, 5, 8, generator=_gen(7))
    before = _snapshot(model)
    prepared = prepare_model(model, x)
    assert prepared.model is not model
    assert prepared.model.get_submodule("blocks.0.fc").weight is model.blocks[0].fc.weight
    _assert_unchanged(model, before)
    assert not any(name.endswith(("matmul", "softmax", "gelu")) for name, _ in model.named_modules())


def test_mixed_train_eval_modes_of_the_original_are_kept():
    torch.manual_seed(0)
    model = SmallCNN().train()
    model.bn1.eval()  # e.g. a frozen BatchNorm while fine-tuning
    before = _snapshot(model)
    prepare_model(model, torch.randn(2, 3, 16, 16, generator=_gen(8)))
    _assert_unchanged(model, before)


def test_failed_shape_propagation_keeps_modes():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5)).train()
    before = _snapshot(model)
    prepared = prepare_model(model, torch.randn(3, 5))  # wrong width: the linear fails during propagation
    assert prepared.traced is False and set(prepared.errors) == {CaptureMethod.EXPORT, CaptureMethod.FX}
    _assert_unchanged(model, before)


# -- what is not converted -----------------------------------------------------------------------------
def test_shape_arithmetic_and_integer_tensors_are_not_converted():
    class M(nn.Module):
        def forward(self, x, idx):
            n = x.size(0) + 1            # int arithmetic on a shape
            m = x.shape[1] * 2
            j = idx + 1                  # integer tensors
            k = torch.matmul(idx, idx.t()) * 3
            mask = (x > 0) & (x < 1)     # bool tensors
            return x.view(n - 1, m // 2, -1), j, k, mask

    x = torch.randn(2, 3, 4, generator=_gen(9))
    idx = torch.arange(6).reshape(2, 3)
    model = M()
    prepared = _prepare_quietly(model, (x, idx), methods=("fx",))  # torch.export folds the shape arithmetic
    assert prepared.traced
    assert prepared.inserted == []
    assert prepared.float_ops == []
    targets = [n.target for n in prepared.graph.nodes if n.op == "call_function"]
    assert targets.count(operator.add) == 2  # still plain Python / integer ops
    for got, want in zip(prepared.model(x, idx), model(x, idx)):
        assert torch.equal(got, want)


def test_value_changing_ops_without_counterpart_are_listed():
    class M(nn.Module):
        def forward(self, x, y):
            a = torch.exp(x)
            b = torch.pow(x, 3)
            c = torch.cos(x)
            d = torch.erf(y)
            return a + b + c + d

    prepared = _prepare_quietly(M(), (X, Y))
    assert prepared.float_ops == ["exp", "pow_1", "cos", "erf"]  # the graph's node names
    assert [n for n, _ in prepared.inserted] == ["add", "add_1", "add_2"]
    assert torch.equal(prepared.model(X, Y), M()(X, Y))


def test_passthrough_ops_are_not_listed():
    class M(nn.Module):
        def forward(self, x):
            a = x.view(2, 12).transpose(0, 1)
            b = torch.flatten(a.reshape(3, 8).permute(1, 0).contiguous())
            c = x[:, 1:, ::2].flatten(1)
            d = torch.transpose(x, 1, 2).unsqueeze(0).squeeze(0)
            return b, c, d, x.split(1, dim=0)[0], x.detach().clone()

    x = torch.randn(2, 3, 4, generator=_gen(10))
    prepared = _prepare_quietly(M(), x)
    assert prepared.traced and prepared.inserted == [] and prepared.float_ops == []
    for got, want in zip(prepared.model(x), M()(x)):
        assert torch.equal(got, want)


VARIANTS = [
    ("add_alpha", lambda x, y: torch.add(x, y, alpha=2)),
    ("softmax_dtype", lambda x, y: torch.softmax(x, dim=-1, dtype=torch.float64)),
    ("Tensor.softmax_dtype", lambda x, y: x.softmax(-1, dtype=torch.float64)),
    ("relu_inplace", lambda x, y: F.relu(x * 1.0, inplace=True) + 0.0),
    ("silu_inplace", lambda x, y: F.silu(x.clone(), inplace=True)),
]


def test_inplace_add_whose_input_is_not_read_again_becomes_a_module():
    prepared = _prepare_quietly(Fn(lambda x, y: x.clone().add_(y)), (X, Y))  # ResNet's `out += identity`
    assert [(n, type(m)) for n, m in prepared.inserted] == [("add", Add)]
    assert torch.equal(prepared.model(X, Y), X + Y)
    fn = lambda x, y: torch.cat([(z := x.clone()).add_(y), z])  # noqa: E731  (z read after the mutation)
    prepared = _prepare_quietly(Fn(fn), (X, Y))
    assert torch.equal(prepared.model(X, Y), fn(X, Y))


@pytest.mark.parametrize("fn", [v[1] for v in VARIANTS], ids=[v[0] for v in VARIANTS])
def test_variants_are_left_alone(fn):
    prepared = _prepare_quietly(Fn(fn), (X, Y))
    kinds = {type(m) for _, m in prepared.inserted}
    assert not kinds & {nn.ReLU, nn.SiLU, nn.Softmax}
    assert all(n.startswith(("mul", "add")) for n, _ in prepared.inserted)  # only the helper ops around it
    assert len(prepared.float_ops) == 1  # the variant itself stays a float op
    assert torch.equal(prepared.model(X, Y), fn(X, Y))


def test_add_with_alpha_stays_a_function_call():
    prepared = _prepare_quietly(Fn(lambda x, y: torch.add(x, y, alpha=2)), (X, Y))
    assert prepared.inserted == []
    node = next(n for n in prepared.graph.nodes if n.op == "call_function")
    assert node.target is torch.add and node.kwargs == {"alpha": 2}
    assert prepared.float_ops == [node.name]


# -- fallbacks and bad arguments --------------------------------------------------------------------
class DataDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return self.fc(x) + x
        return self.fc(x) * x


def test_untraceable_model_falls_back_with_warning():
    model = DataDependent()
    before = _snapshot(model)
    prepared = _prepare_quietly(model, torch.randn(3, 4, generator=_gen(11)))  # the sim warns, not this
    assert set(prepared.errors) == {CaptureMethod.EXPORT, CaptureMethod.FX}
    assert prepared.method is CaptureMethod.LEAVES and prepared.traced is False
    assert prepared.model is model
    assert prepared.graph is None
    assert prepared.inserted == [] and prepared.float_ops == []
    assert isinstance(prepared.trace_error, str) and prepared.trace_error
    assert "\n" not in prepared.trace_error
    _assert_unchanged(model, before)


def test_trace_false_skips_tracing_without_warning():
    model = TransformerBlock()
    prepared = _prepare_quietly(model, torch.randn(1, 4, 32), trace=False)
    assert prepared.traced is False and prepared.model is model and prepared.graph is None
    assert prepared.inserted == [] and prepared.float_ops == []
    assert "trace=False" in prepared.trace_error


@pytest.mark.parametrize("model", [lambda x: x, "model", None, [nn.Linear(2, 2)]],
                         ids=["function", "str", "None", "list"])
def test_non_module_model_is_a_type_error(model):
    with pytest.raises(TypeError, match="model must be an nn.Module"):
        prepare_model(model, torch.randn(2, 2))


def test_two_inputs_as_tuple():
    class M(nn.Module):
        def forward(self, a, b):
            return torch.cat([a, b], dim=1) * 2

    a, b = torch.randn(2, 3, generator=_gen(12)), torch.randn(2, 5, generator=_gen(13))
    prepared = _prepare_quietly(M(), (a, b))
    assert [(n, type(m)) for n, m in prepared.inserted] == [("cat", Concat), ("mul", Multiply)]
    assert prepared.inserted[0][1].dim == 1
    assert torch.equal(prepared.model(a, b), M()(a, b))


def test_prepare_does_not_run_in_training_mode():
    # shape propagation runs in eval mode: BatchNorm running statistics of the original are untouched
    model = nn.Sequential(nn.BatchNorm1d(4), nn.ReLU()).train()
    mean, var, tracked = (model[0].running_mean.clone(), model[0].running_var.clone(),
                          model[0].num_batches_tracked.clone())
    prepare_model(model, torch.randn(8, 4, generator=_gen(14)) * 3 + 1)
    assert torch.equal(model[0].running_mean, mean) and torch.equal(model[0].running_var, var)
    assert torch.equal(model[0].num_batches_tracked, tracked)
    assert model.training and model[0].training


def test_prepared_copy_is_independent():
    # deepcopy of a prepared model (what QuantizationSimModel(in_place=False) relies on) runs the same
    prepared = _prepare_quietly(Fn(lambda x, y: torch.softmax(x @ y, dim=-1)), (X, YT))
    clone = copy.deepcopy(prepared.model)
    assert torch.equal(clone(X, YT), prepared.model(X, YT))


# -- models plain torch.fx cannot trace, traced with the dummy input's dtypes --------------------------------
class _MaskedEncoderLayer(nn.Module):
    """Hugging Face style: an additive mask built with torch.finfo(x.dtype), positions made on x.device."""

    def __init__(self, d: int = 16, vocab: int = 50) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(32, d)
        self.bn = nn.BatchNorm1d(d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, input_ids, attention_mask):
        t = input_ids.shape[1]
        x = self.word(input_ids) + self.pos(torch.arange(t, device=input_ids.device))
        x = self.bn(x.transpose(1, 2)).transpose(1, 2)
        if x.dim() != 3:  # answered from the dummy input's rank
            raise ValueError("expected (batch, seq, dim)")
        mask = (1.0 - attention_mask[:, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        s = torch.matmul(self.q(x), self.k(x).transpose(-1, -2)) + mask
        return torch.tanh(torch.matmul(torch.softmax(s, dim=-1), self.v(x)))


def _masked_inputs():
    ids = torch.randint(0, 50, (3, 7), generator=_gen(4))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[:, 5:] = 0
    return ids, mask


def test_dtype_and_device_questions_are_answered_from_the_dummy_input():
    torch.manual_seed(0)
    model = _MaskedEncoderLayer().train()  # training mode: tracing must not update the BatchNorm statistics
    args = _masked_inputs()
    before, inputs_before = _snapshot(model), [a.clone() for a in args]
    with pytest.raises((TypeError, fx.proxy.TraceError)):
        fx.symbolic_trace(model)  # plain torch.fx: the rank test, then torch.finfo(Proxy), stop it
    prepared = _prepare_quietly(model, args, methods=("fx",))
    assert prepared.method is CaptureMethod.FX
    # the additive mask comes from an integer input: not an activation, so (1 - mask) * min is not quantized
    assert [name for name, _ in prepared.inserted] == ["add", "matmul", "add_1", "softmax", "matmul_1", "tanh"]
    assert prepared.float_ops == []
    _assert_unchanged(model, before)
    assert all(torch.equal(a, b) for a, b in zip(args, inputs_before))
    assert not any("quanta_value" in n.meta for n in prepared.graph.nodes)  # no tensors pinned in the graph
    model.eval()
    with torch.no_grad():
        assert torch.equal(prepared.model.eval()(*args), model(*args))
        other = torch.randint(0, 50, (5, 9)), torch.ones(5, 9, dtype=torch.long)  # shapes stay symbolic
        assert torch.equal(prepared.model(*other), model(*other))


def test_a_model_neither_tracer_handles_reports_the_plain_error():
    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x  # data-dependent: no tracer can follow it

    prepared = prepare_model(Branchy(), (torch.randn(3),))
    assert not prepared.traced and "symbolically traced variables cannot be used" in prepared.trace_error


@pytest.mark.parametrize("fn, kind, cls", [
    (torch.sigmoid, "sigmoid", nn.Sigmoid), (F.sigmoid, "sigmoid", nn.Sigmoid), (torch.tanh, "tanh", nn.Tanh),
    (lambda x: x.sigmoid(), "sigmoid", nn.Sigmoid), (lambda x: x.tanh(), "tanh", nn.Tanh),
    (F.relu6, "relu6", nn.ReLU6), (lambda x: F.leaky_relu(x, negative_slope=0.2), "leaky_relu", nn.LeakyReLU),
    (F.hardswish, "hardswish", nn.Hardswish), (F.hardsigmoid, "hardsigmoid", nn.Hardsigmoid),
    (F.mish, "mish", nn.Mish),
], ids=["torch.sigmoid", "F.sigmoid", "torch.tanh", "Tensor.sigmoid", "Tensor.tanh", "relu6", "leaky_relu",
        "hardswish", "hardsigmoid", "mish"])
def test_functional_activations_become_modules(fn, kind, cls):
    model = Fn(lambda x, y: fn(x) + 0 * y)
    prepared = _prepare_quietly(model, (X, Y))
    inserted = dict(prepared.inserted)
    assert isinstance(inserted[kind], cls)
    with torch.no_grad():
        assert torch.equal(prepared.model(X, Y), model(X, Y))
    if kind == "leaky_relu":
        assert inserted[kind].negative_slope == 0.2


# -- F.scaled_dot_product_attention: expanded into quantizable ops -------------------------------------------
class _Sdpa(nn.Module):
    def __init__(self, **kwargs) -> None:
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q, k, v, mask):
        kwargs = dict(self.kwargs)
        if kwargs.pop("use_mask", False):
            kwargs["attn_mask"] = mask
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


def _qkv(seq: int, seq_k: int | None = None, seed: int = 5):
    g = _gen(seed)
    seq_k = seq if seq_k is None else seq_k
    return (torch.randn(2, 3, seq, 8, generator=g), torch.randn(2, 3, seq_k, 8, generator=g),
            torch.randn(2, 3, seq_k, 8, generator=g))


@pytest.mark.parametrize("kwargs, mask_kind", [
    ({}, None), ({"scale": 0.3}, None), ({"is_causal": True}, None),
    ({"use_mask": True}, "float"), ({"use_mask": True}, "bool"), ({"use_mask": True, "is_causal": False}, "bool"),
], ids=["plain", "scale", "causal", "float_mask", "bool_mask", "bool_mask_kwargs"])
def test_sdpa_becomes_matmul_scale_softmax_matmul(kwargs, mask_kind):
    model = _Sdpa(**kwargs)

    def inputs(seq: int, seq_k: int):
        q, k, v = _qkv(seq, seq_k)
        if mask_kind == "bool":
            mask = torch.rand(seq, seq_k, generator=_gen(6)) > 0.3
            mask[:, 0] = True  # no fully masked row (softmax of all -inf is NaN in both)
        else:
            mask = torch.randn(2, 1, seq, seq_k, generator=_gen(6))
        return q, k, v, mask

    args = inputs(5, 5) if kwargs.get("is_causal") else inputs(5, 7)
    prepared = _prepare_quietly(model, args)
    kinds = [name for name, _ in prepared.inserted]
    assert kinds[:2] == ["matmul", "mul"] and kinds[-2:] == ["softmax", "matmul_1"]
    assert ("add" in kinds) == (mask_kind == "float")
    assert prepared.float_ops == []
    for shape in ((5, 7), (9, 4)) if not kwargs.get("is_causal") else ((5, 5), (9, 9)):
        a = inputs(*shape)
        torch.testing.assert_close(prepared.model(*a), model(*a), rtol=1e-5, atol=1e-6)  # float rounding only


def test_sdpa_with_grouped_query_attention_stays_a_float_op():
    model = _Sdpa(enable_gqa=True)
    q = torch.randn(1, 4, 5, 8, generator=_gen(7))
    kv = torch.randn(1, 2, 5, 8, generator=_gen(8))
    prepared = _prepare_quietly(model, (q, kv, kv, None))
    assert prepared.float_ops == ["scaled_dot_product_attention"] and prepared.inserted == []


def test_sdpa_in_a_sim_gets_its_attention_quantized():
    from quanta.quantsim import QuantizationSimModel

    q, k, v = _qkv(6)
    mask = torch.zeros(2, 1, 6, 6)
    sim = QuantizationSimModel(_Sdpa(use_mask=True), (q, k, v, mask))
    names = {n for n, _ in sim.named_quantizers()}
    assert {"matmul.output_quantizers.0", "mul.output_quantizers.0", "softmax.output_quantizers.0",
            "matmul_1.output_quantizers.0"} <= names
    sim.compute_encodings([(q, k, v, mask)], progress=False)
    with torch.no_grad():
        out = sim.model(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert 10 * torch.log10(ref.pow(2).sum() / (out - ref).pow(2).sum()) > 30
