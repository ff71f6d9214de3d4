"""QuantizedMultiheadAttention against torch.nn.MultiheadAttention and a hand-built QDQ reference.

Reference: ``F.multi_head_attention_forward`` on weights and inputs that were
fake-quantized with ``Q.affine.quantize_dequantize`` (the functional API) using
the calibrated quantizers' scale/offset, then the output QDQ'd the same way.
Both paths run the same float op on the same tensors, so they agree bit for bit.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import quanta.nn as qnn
import quanta.quantization as Q
from quanta.nn import QuantizedMultiheadAttention


@dataclass
class Case:
    name: str
    kwargs: dict = field(default_factory=dict)  # nn.MultiheadAttention(...) arguments besides (E, H)
    self_attention: bool = True
    seq: tuple[int, int] = (5, 5)  # (L, S)
    batch: int | None = 3  # None: unbatched input
    masks: str = ""  # "kpm" bool key padding, "float" float attn mask, "3d" per-head bool mask, "causal"
    call: dict = field(default_factory=dict)  # extra forward kwargs

    def __repr__(self) -> str:
        return self.name


E, H = 16, 4

CASES = [
    Case("self_seq_first"),
    Case("self_batch_first", {"batch_first": True}),
    Case("cross_batch_first", {"batch_first": True}, self_attention=False, seq=(4, 6)),
    Case("kdim_vdim", {"kdim": 6, "vdim": 10}, self_attention=False, seq=(4, 7)),
    Case("kdim_vdim_batch_first", {"kdim": 6, "vdim": 10, "batch_first": True}, self_attention=False, seq=(4, 7)),
    Case("bias_kv_zero_attn", {"add_bias_kv": True, "add_zero_attn": True}),
    Case("no_bias", {"bias": False, "batch_first": True}),
    Case("kpm_and_bool_mask", {"batch_first": True}, self_attention=False, seq=(4, 6), masks="kpm+bool"),
    Case("float_mask", {}, self_attention=False, seq=(4, 6), masks="float"),
    Case("3d_mask_per_head_weights", {}, masks="3d", call={"average_attn_weights": False}),
    Case("causal", {"batch_first": True}, masks="causal", call={"is_causal": True}),
    Case("no_weights", {"batch_first": True}, call={"need_weights": False}),
    Case("unbatched", {}, self_attention=False, seq=(4, 6), batch=None),
]


def _inputs(case: Case, mha: nn.MultiheadAttention, seed: int) -> tuple[tuple, dict]:
    g = torch.Generator().manual_seed(seed)
    (L, S), N = case.seq, case.batch

    def shape(n: int, d: int) -> tuple[int, ...]:
        if N is None:
            return (n, d)
        return (N, n, d) if mha.batch_first else (n, N, d)

    query = torch.randn(shape(L, E), generator=g)
    if case.self_attention:
        args = (query, query, query)
    else:
        args = (query, torch.randn(shape(S, mha.kdim), generator=g), torch.randn(shape(S, mha.vdim), generator=g))
    kw = dict(case.call)
    if "kpm" in case.masks:
        kpm = torch.zeros(N, S, dtype=torch.bool)
        kpm[:, -2:] = True
        kw["key_padding_mask"] = kpm
    if "float" in case.masks:
        kw["attn_mask"] = torch.randn(L, S, generator=g)
    if "bool" in case.masks:
        kw["attn_mask"] = torch.rand(L, S, generator=g) < 0.3
        kw["attn_mask"][:, 0] = False  # every query sees at least one key
    if "3d" in case.masks:
        kw["attn_mask"] = torch.rand(N * H, L, S, generator=g) < 0.3  # True = masked; the diagonal stays open
        kw["attn_mask"][:, torch.arange(L), torch.arange(L)] = False
    if "causal" in case.masks:
        kw["attn_mask"] = nn.Transformer.generate_square_subsequent_mask(L)
    return args, kw


def _make(case: Case, seed: int = 0) -> nn.MultiheadAttention:
    torch.manual_seed(seed)
    mha = nn.MultiheadAttention(E, H, **case.kwargs).eval()
    with torch.no_grad():  # torch zero-initialises the biases; make them matter
        for name, p in mha.named_parameters():
            if "bias" in name:
                p.normal_(0, 0.1)
    return mha


@pytest.fixture
def no_fastpath():
    """The float reference must take F.multi_head_attention_forward, not torch's native fast path."""
    before = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(before)


def _disable_all(qmha: QuantizedMultiheadAttention) -> None:
    for i in range(3):
        qmha.input_quantizers[i] = None
    for i in range(2):
        qmha.output_quantizers[i] = None
    for name in qmha.param_quantizers:
        qmha.param_quantizers[name] = None
    qmha.out_proj.param_quantizers["weight"] = None


def _plain(t):
    return None if t is None else t.as_subclass(torch.Tensor).detach()


def _fqdq(q, x):
    """QDQ with the functional API and the quantizer's own encoding (None: identity)."""
    if q is None or x is None:
        return x
    return Q.affine.quantize_dequantize(x.detach().as_subclass(torch.Tensor), q.get_scale().detach(),
                                        q.get_offset().detach(), qmin=q.qmin, qmax=q.qmax)


def _equal(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return torch.equal(_plain(a), _plain(b))


def _calibrated(case: Case, *, quantize_inputs: bool = False, quantize_weights_out: bool = False):
    mha = _make(case)
    qmha = QuantizedMultiheadAttention.from_module(mha)
    if quantize_inputs:
        qmha.input_quantizers = nn.ModuleList([qnn.default_activation_quantizer() for _ in range(3)])
    if quantize_weights_out:
        qmha.output_quantizers[1] = qnn.default_activation_quantizer()
    with qmha.compute_encodings():
        for seed in (1, 2):
            args, kw = _inputs(case, mha, seed)
            qmha(*args, **kw)
    return mha, qmha


def _reference(mha: nn.MultiheadAttention, qmha: QuantizedMultiheadAttention, args: tuple, kw: dict):
    """What the quantized module should compute, built from torch's functional op and quanta's functional QDQ."""
    pq = qmha.param_quantizers
    xs = [_fqdq(q, x) for q, x in zip(qmha.input_quantizers, args)]
    if args[0] is args[1] is args[2] and all(q is None for q in qmha.input_quantizers):
        xs = [args[0]] * 3
    batched = xs[0].dim() == 3
    if mha.batch_first and batched:
        xs = [x.transpose(0, 1) for x in xs]
    w = {n: _fqdq(pq[n] if n in pq else None, getattr(mha, n)) for n in
         ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight")}
    out, weights = F.multi_head_attention_forward(
        *xs, E, H, w["in_proj_weight"], mha.in_proj_bias, mha.bias_k, mha.bias_v, mha.add_zero_attn,
        mha.dropout, _fqdq(qmha.out_proj.param_quantizers["weight"], mha.out_proj.weight), mha.out_proj.bias,
        training=False, use_separate_proj_weight=not mha._qkv_same_embed_dim, q_proj_weight=w["q_proj_weight"],
        k_proj_weight=w["k_proj_weight"], v_proj_weight=w["v_proj_weight"], **kw,
    )
    if mha.batch_first and batched:
        out = out.transpose(0, 1)
    return _fqdq(qmha.output_quantizers[0], out), _fqdq(qmha.output_quantizers[1], weights)


def _sqnr_db(ref: torch.Tensor, approx: torch.Tensor) -> float:
    noise = (ref - approx).pow(2).mean()
    return float(10 * torch.log10(ref.pow(2).mean() / noise))


# -- float behaviour --------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=repr)
def test_disabled_quantizers_give_float_result(case, no_fastpath):
    mha = _make(case)
    qmha = QuantizedMultiheadAttention.from_module(mha)
    _disable_all(qmha)
    args, kw = _inputs(case, mha, seed=3)
    with torch.no_grad():
        out, weights = qmha(*args, **kw)
        ref_out, ref_weights = mha(*args, **kw)
    assert type(out) is torch.Tensor
    assert torch.equal(out, ref_out) and _equal(weights, ref_weights)
    assert (weights is None) == (kw.get("need_weights") is False)


def test_training_dropout_matches_float(no_fastpath):
    case = Case("dropout", {"dropout": 0.3, "batch_first": True})
    mha = _make(case).train()
    qmha = QuantizedMultiheadAttention.from_module(mha)
    _disable_all(qmha)
    args, kw = _inputs(case, mha, seed=4)
    torch.manual_seed(11)
    out, weights = qmha(*args, **kw)
    torch.manual_seed(11)
    ref_out, ref_weights = mha(*args, **kw)
    assert torch.equal(out, ref_out) and torch.equal(weights, ref_weights)
    qmha.eval()  # no dropout in eval: differs from the training result
    assert not torch.equal(qmha(*args, **kw)[0], out)


def test_self_attention_keeps_identity_for_the_packed_projection(monkeypatch):
    seen = []
    real = F.multi_head_attention_forward

    def spy(query, key, value, *args, **kwargs):
        seen.append((query is key, key is value))
        return real(query, key, value, *args, **kwargs)

    monkeypatch.setattr(F, "multi_head_attention_forward", spy)
    qmha = QuantizedMultiheadAttention(E, H, batch_first=True)
    x = torch.randn(2, 5, E)
    with qmha.compute_encodings():
        qmha(x, x, x)
    shared = qnn.default_activation_quantizer()
    qmha.input_quantizers = nn.ModuleList([shared, shared, shared])
    with qmha.compute_encodings():  # one quantizer in three slots is entered once
        qmha(x, x, x)
    qmha.input_quantizers[2] = qnn.default_activation_quantizer()  # value gets its own: key is query still
    with qmha.compute_encodings():
        qmha(x, x, x)
    assert seen == [(True, True), (True, True), (True, False)]


# -- quantized behaviour ----------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES, ids=repr)
@pytest.mark.parametrize("quantize_inputs", [False, True])
def test_matches_functional_reference_bit_exact(case, quantize_inputs):
    need_weights = case.call.get("need_weights", True)
    mha, qmha = _calibrated(case, quantize_inputs=quantize_inputs, quantize_weights_out=need_weights)
    args, kw = _inputs(case, mha, seed=5)
    with torch.no_grad():
        out, weights = qmha(*args, **kw)
        ref_out, ref_weights = _reference(mha, qmha, args, kw)
        float_out, _ = mha(*args, **kw)
    assert isinstance(out, Q.DequantizedTensor)
    assert torch.equal(_plain(out), ref_out) and _equal(weights, ref_weights)
    # the output is actually quantized: at most 256 levels, and not the float result
    assert torch.unique(_plain(out)).numel() <= 256
    assert not torch.equal(_plain(out), float_out)


def test_eval_no_grad_never_takes_the_native_fast_path():
    # batch_first self-attention in eval under no_grad is exactly where torch would use the fast path
    case = Case("fast", {"batch_first": True})
    mha, qmha = _calibrated(case)
    args, kw = _inputs(case, mha, seed=6)
    assert torch.backends.mha.get_fastpath_enabled()
    with torch.no_grad():
        out, _ = qmha(*args, **kw)
        ref_out, _ = _reference(mha, qmha, args, kw)
    assert torch.equal(_plain(out), ref_out)


@pytest.mark.parametrize("case", [CASES[1], CASES[3]], ids=repr)
def test_close_to_float(case):
    mha, qmha = _calibrated(case, quantize_inputs=True)
    args, kw = _inputs(case, mha, seed=7)
    with qmha.compute_encodings():  # calibrated on the data it sees: measures rounding, not clipping
        qmha(*args, **kw)
    with torch.no_grad():
        sqnr = _sqnr_db(mha(*args, **kw)[0], _plain(qmha(*args, **kw)[0]))
    assert sqnr > 30, sqnr


def test_gradients_reach_inputs_weights_and_quantizer_ranges():
    case = CASES[1]
    mha, qmha = _calibrated(case, quantize_inputs=True)
    qmha.train()
    query = torch.randn(3, 5, E, requires_grad=True)
    out, _ = qmha(query, query, query)
    (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(2))).sum().backward()
    grads = {
        "query": query.grad,
        "in_proj_weight": qmha.in_proj_weight.grad,
        "out_proj.weight": qmha.out_proj.weight.grad,
        "in_proj_bias": qmha.in_proj_bias.grad,
    }
    for path in ("param_quantizers.in_proj_weight", "output_quantizers.0", "input_quantizers.0",
                 "out_proj.param_quantizers.weight"):
        q = qmha.get_submodule(path)
        grads[f"{path}.min"], grads[f"{path}.max"] = q.min.grad, q.max.grad
    for name, g in grads.items():
        assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0, name
    assert mha.in_proj_weight.grad is qmha.in_proj_weight.grad  # one parameter


# -- quantizers and calibration ---------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"kdim": 6, "vdim": 10, "add_bias_kv": True}], ids=["packed", "separate"])
def test_default_quantizers(kwargs):
    mha = nn.MultiheadAttention(E, H, **kwargs)
    qmha = QuantizedMultiheadAttention.from_module(mha)
    assert list(qmha.input_quantizers) == [None, None, None]
    out_q, weights_q = qmha.output_quantizers
    assert (out_q.shape, out_q.qmin, out_q.qmax, out_q.symmetric) == ((), 0, 255, False)
    assert weights_q is None
    assert set(qmha.param_quantizers) == {n for n, _ in mha.named_parameters(recurse=False)}
    weights = ["in_proj_weight"] if not kwargs else ["q_proj_weight", "k_proj_weight", "v_proj_weight"]
    for name, q in qmha.param_quantizers.items():
        if name in weights:
            rows = getattr(mha, name).shape[0]
            assert (q.shape, q.qmin, q.qmax, q.symmetric) == ((rows, 1), -128, 127, True), name
        else:
            assert q is None, name
    assert isinstance(qmha.out_proj, qnn.QuantizedLinear)
    assert qmha.out_proj.param_quantizers["weight"].shape == (E, 1)
    assert qmha.out_proj.param_quantizers["bias"] is None
    assert list(qmha.out_proj.output_quantizers) == [None] and list(qmha.out_proj.input_quantizers) == [None]
    # the float module is untouched
    assert type(mha.out_proj) is nn.modules.linear.NonDynamicallyQuantizableLinear
    assert not hasattr(mha, "param_quantizers") and not hasattr(mha.out_proj, "param_quantizers")


def test_direct_construction():
    qmha = QuantizedMultiheadAttention(E, H, kdim=6, vdim=10, batch_first=True)
    assert isinstance(qmha, nn.MultiheadAttention) and qmha.batch_first
    assert qmha.param_quantizers["k_proj_weight"].shape == (E, 1)
    assert isinstance(qmha.out_proj, qnn.QuantizedLinear)
    q, k, v = torch.randn(2, 3, E), torch.randn(2, 4, 6), torch.randn(2, 4, 10)
    with qmha.compute_encodings():
        qmha(q, k, v)
    assert qmha(q, k, v)[0].shape == (2, 3, E)


def test_compute_encodings_initialises_out_proj_too():
    qmha = QuantizedMultiheadAttention.from_module(nn.MultiheadAttention(E, H))
    quantizers = [qmha.param_quantizers["in_proj_weight"], qmha.output_quantizers[0],
                  qmha.out_proj.param_quantizers["weight"]]
    assert not any(q.is_initialized() for q in quantizers)
    x = torch.randn(5, 2, E)
    with pytest.raises(RuntimeError, match="compute_encodings"):
        qmha(x, x, x)
    with qmha.compute_encodings():
        qmha(x, x, x)
    assert all(q.is_initialized() for q in quantizers)
    # the out_proj weight quantizer holds the per-channel encoding of that weight itself
    standalone = qnn.default_weight_quantizer(qmha.out_proj.weight)
    with standalone.compute_encodings():
        standalone(qmha.out_proj.weight)
    assert torch.equal(qmha.out_proj.param_quantizers["weight"].get_scale(), standalone.get_scale())


def test_out_proj_output_quantizer_is_honoured_if_set():
    case = CASES[0]
    mha, qmha = _calibrated(case)
    args, kw = _inputs(case, mha, seed=8)
    qmha.out_proj.output_quantizers[0] = Q.affine.QuantizeDequantize(shape=(), bitwidth=4, symmetric=False)
    with qmha.compute_encodings():
        qmha(*args, **kw)
    with torch.no_grad():
        out, _ = qmha(*args, **kw)
    assert torch.unique(_plain(out)).numel() <= 16  # the 4-bit quantizer ran before the 8-bit one


# -- construction, registry, state ----------------------------------------------------------------
def test_from_module_shares_parameters():
    mha = nn.MultiheadAttention(E, H, add_bias_kv=True)
    qmha = qnn.from_module(mha)
    assert type(qmha) is QuantizedMultiheadAttention
    assert qmha.in_proj_weight is mha.in_proj_weight and qmha.in_proj_bias is mha.in_proj_bias
    assert qmha.bias_k is mha.bias_k and qmha.bias_v is mha.bias_v
    assert qmha.out_proj.weight is mha.out_proj.weight and qmha.out_proj.bias is mha.out_proj.bias
    sep = nn.MultiheadAttention(E, H, kdim=6, vdim=10)
    qsep = QuantizedMultiheadAttention.from_module(sep)
    for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
        assert getattr(qsep, name) is getattr(sep, name)
    assert qsep.in_proj_weight is None
    for k in ("embed_dim", "num_heads", "kdim", "vdim", "batch_first", "dropout", "head_dim"):
        assert getattr(qsep, k) == getattr(sep, k), k
    with torch.no_grad():  # an in-place update of the float weight is seen by the quantized module
        mha.out_proj.weight.mul_(2)
    assert torch.equal(qmha.out_proj.weight, mha.out_proj.weight)


def test_registry_lookup():
    mha = nn.MultiheadAttention(E, H)
    assert qnn.quantized_class_for(mha) is QuantizedMultiheadAttention
    assert qnn.quantized_class_for(nn.MultiheadAttention) is QuantizedMultiheadAttention
    assert qnn.quantized_class_for(QuantizedMultiheadAttention(E, H)) is None


def test_deepcopy_and_state_dict_round_trip():
    case = CASES[1]
    mha, qmha = _calibrated(case)
    args, kw = _inputs(case, mha, seed=9)
    with torch.no_grad():
        expected = _plain(qmha(*args, **kw)[0])

        clone = copy.deepcopy(qmha)
        assert clone.in_proj_weight is not qmha.in_proj_weight
        assert torch.equal(_plain(clone(*args, **kw)[0]), expected)

        state = qmha.state_dict()
        assert "out_proj.param_quantizers.weight.min" in state and "param_quantizers.in_proj_weight.max" in state
        fresh = QuantizedMultiheadAttention(E, H, **case.kwargs).eval()
        fresh.load_state_dict(state)
        assert torch.equal(_plain(fresh(*args, **kw)[0]), expected)


def test_bad_inputs_raise():
    with pytest.raises(TypeError, match=r"needs a torch\.nn\.modules\.activation\.MultiheadAttention, got .*Linear"):
        QuantizedMultiheadAttention.from_module(nn.Linear(E, E))
    with pytest.raises(TypeError, match="QuantizedMultiheadAttention"):
        QuantizedMultiheadAttention.from_module(QuantizedMultiheadAttention(E, H))  # already quantized
    qmha = QuantizedMultiheadAttention(E, H)
    qmha.out_proj.input_quantizers[0] = qnn.default_activation_quantizer()
    x = torch.randn(5, 2, E)
    with pytest.raises(ValueError, match=r"out_proj\.input_quantizers\[0\].*set it to None"):
        qmha(x, x, x)
