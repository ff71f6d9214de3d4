"""QuantizedTensor / DequantizedTensor: round trips, integer codes, and how the encoding travels.

Contract: DESIGN.md, "AIMET dialect" (``QuantizedTensor``/``DequantizedTensor`` bullet).
Expected values are computed by hand or from the formulas
``Q(x) = clamp(round(x/s) - o, qmin, qmax)`` and ``DQ(q) = (q + o) * s``.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch

from quanta.quantization.affine import Quantize, QuantizeDequantize
from quanta.tensors.quantized import DequantizedTensor, QuantizedTensor, QuantizedTensorBase

# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------

C, K, B = 4, 16, 4  # channels, row length, block size

GRANULARITIES = {
    # name: (quantizer kwargs, input shape)
    "per_tensor": (dict(shape=()), (C, K)),
    "per_channel": (dict(shape=(C, 1)), (C, K)),
    "per_block": (dict(shape=(C, K // B), block_size=(-1, B)), (C, K)),
}


def _calibrated(cls, granularity: str, *, symmetric: bool, bitwidth: int = 8, seed: int = 0):
    """A quantizer of ``cls`` calibrated on random data, and a fresh input that overshoots the range."""
    kwargs, in_shape = GRANULARITIES[granularity]
    q = cls(bitwidth=bitwidth, symmetric=symmetric, **kwargs)
    g = torch.Generator().manual_seed(seed)
    with q.compute_encodings():
        q(torch.randn(in_shape, generator=g))
    # 1.5x wider than the calibration data: some elements clamp at qmin/qmax.
    x = 1.5 * torch.randn(in_shape, generator=g)
    return q, x


def _expand(t: torch.Tensor, granularity: str) -> torch.Tensor:
    """Scale/offset of shape ``scale_shape`` repeated to the input shape (C, K), by hand."""
    if granularity == "per_tensor":
        return t.reshape(1, 1).expand(C, K)
    if granularity == "per_channel":
        return t.reshape(C, 1).expand(C, K)
    return t.reshape(C, K // B).repeat_interleave(B, dim=1)


def _per_tensor_qdq(x=None, *, qmin_qmax=(0, 255), lo=-10.0, hi=41.0) -> DequantizedTensor:
    """Per-tensor DequantizedTensor. With range [-10, 41] on [0, 255]: scale 0.2, offset -50."""
    q = QuantizeDequantize(shape=(), qmin=qmin_qmax[0], qmax=qmin_qmax[1])
    q.set_range(lo, hi)
    if x is None:
        x = torch.linspace(-12.0, 43.0, 24).reshape(4, 6)
    with torch.no_grad():
        return q(x)


def _per_channel_qdq() -> DequantizedTensor:
    q, x = _calibrated(QuantizeDequantize, "per_channel", symmetric=False)
    with torch.no_grad():
        return q(x)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Plain tensor view of ``t``'s data, for bit-exact comparisons that include signed zeros."""
    t = t.detach().as_subclass(torch.Tensor)
    int_dtype = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
                 torch.float64: torch.int64}[t.dtype]
    return t.view(int_dtype)


def _assert_bit_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape
    assert torch.equal(_bits(a), _bits(b)), (a, b)


# --------------------------------------------------------------------------------------------------
# quantize() / dequantize(): bit-exact, idempotent round trips
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("granularity", list(GRANULARITIES))
def test_round_trip_from_quantized_is_bit_exact(granularity, symmetric, dtype):
    q, x = _calibrated(Quantize, granularity, symmetric=symmetric)
    x = x.to(dtype)
    with torch.no_grad():
        x_q = q(x)
    assert type(x_q) is QuantizedTensor
    assert x_q.dtype == dtype

    x_dq = x_q.dequantize()
    assert type(x_dq) is DequantizedTensor
    assert x_dq.dtype == dtype
    assert x_dq.encoding == x_q.encoding

    # The codes are integers on the grid and some of them clamp (the input overshoots).
    codes = x_q.as_subclass(torch.Tensor)
    assert torch.equal(codes, codes.round())
    assert codes.min() >= q.qmin and codes.max() <= q.qmax
    assert bool((codes == q.qmax).any() or (codes == q.qmin).any())

    # DQ(q) = (q + o) * s, computed here by hand in float32 and cast to the input dtype.
    s = _expand(q.get_scale().detach(), granularity)
    o = _expand(q.get_offset().detach(), granularity)
    expected = ((codes.float() + o) * s).to(dtype)
    _assert_bit_equal(x_dq, expected)

    # quantize() of the dequantized tensor gives the codes back, bit for bit; and again.
    x_q2 = x_dq.quantize()
    assert type(x_q2) is QuantizedTensor
    _assert_bit_equal(x_q2, x_q)
    _assert_bit_equal(x_q2.dequantize(), x_dq)
    _assert_bit_equal(x_q2.dequantize().quantize(), x_q)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("granularity", list(GRANULARITIES))
def test_round_trip_from_dequantized_is_bit_exact(granularity, symmetric, dtype):
    q, x = _calibrated(QuantizeDequantize, granularity, symmetric=symmetric)
    x = x.to(dtype)
    with torch.no_grad():
        x_dq = q(x)
    assert type(x_dq) is DequantizedTensor
    assert x_dq.dtype == dtype

    x_q = x_dq.quantize()
    assert type(x_q) is QuantizedTensor
    assert x_q.encoding == x_dq.encoding
    _assert_bit_equal(x_q.dequantize(), x_dq)
    _assert_bit_equal(x_q.dequantize().quantize(), x_q)
    # QDQ == DQ(Q(x)) with the same encoding, computed by the Quantize module.
    qz = Quantize(bitwidth=8, symmetric=symmetric, **GRANULARITIES[granularity][0])
    qz.load_state_dict(q.state_dict())
    with torch.no_grad():
        _assert_bit_equal(qz(x).dequantize(), x_dq)


def test_quantize_and_dequantize_return_self_when_already_there():
    x_dq = _per_tensor_qdq()
    assert x_dq.dequantize() is x_dq
    x_q = x_dq.quantize()
    assert x_q.quantize() is x_q


def test_quantize_of_dequantized_tensor_matches_hand_computed_codes():
    # Range [-10, 41] on [0, 255]: s = 0.2, o = -50, so Q(x) = clamp(round(x / 0.2) + 50, 0, 255).
    x = torch.tensor([-12.0, -10.0, 0.0, 0.39, 3.521, 9.41, 41.0, 51.0])
    x_dq = _per_tensor_qdq(x)
    assert torch.equal(x_dq.quantize().as_subclass(torch.Tensor),
                       torch.tensor([0.0, 0.0, 50.0, 52.0, 68.0, 97.0, 255.0, 255.0]))


# --------------------------------------------------------------------------------------------------
# quantized_repr()
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bitwidth, symmetric, expected_dtype",
    [
        (8, True, torch.int8),  # [-128, 127]
        (8, False, torch.uint8),  # [0, 255]
        (4, False, torch.uint8),  # [0, 15]
        (4, True, torch.int8),  # [-8, 7]
        (16, True, torch.int16),  # [-32768, 32767]
        (16, False, torch.uint16),  # [0, 65535]
    ],
)
def test_quantized_repr_dtype_is_smallest_integer_dtype_holding_the_grid(bitwidth, symmetric, expected_dtype):
    q = Quantize(shape=(), bitwidth=bitwidth, symmetric=symmetric)
    qmin, qmax = q.qmin, q.qmax
    # scale 1 and offset 0 (symmetric) or offset 0 with min = 0 (asymmetric): codes == round(x), clamped.
    q.set_range(qmin, qmax)
    x = torch.tensor([float(qmin) - 5, float(qmin), float(qmin) + 1, 0.0, float(qmax) - 1, float(qmax), qmax + 7.0])
    with torch.no_grad():
        rep = q(x).quantized_repr()
    assert rep.dtype == expected_dtype
    assert not rep.requires_grad
    expected = [qmin, qmin, qmin + 1, 0, qmax - 1, qmax, qmax]
    assert rep.to(torch.int64).tolist() == expected


def test_quantized_repr_of_full_uint16_grid_keeps_extreme_codes():
    q = Quantize(shape=(), qmin=0, qmax=65535)
    q.set_range(0.0, 65535.0)  # s = 1, o = 0
    x = torch.tensor([0.0, 1.0, 2.5, 3.5, 32768.0, 65534.0, 65535.0, 70000.0, -3.0])
    with torch.no_grad():
        x_q = q(x)
    rep = x_q.quantized_repr()
    assert rep.dtype == torch.uint16
    # 2.5 -> 2 and 3.5 -> 4: round half to even.
    assert rep.to(torch.int64).tolist() == [0, 1, 2, 4, 32768, 65534, 65535, 65535, 0]


def test_quantized_repr_of_dequantized_tensor_equals_that_of_its_codes():
    x_dq = _per_tensor_qdq(torch.tensor([[0.39, 51.0], [3.521, 9.41]]))
    rep = x_dq.quantized_repr()
    assert rep.dtype == torch.uint8
    assert rep.tolist() == [[52, 255], [68, 97]]


def test_quantized_repr_turns_negative_zero_codes_into_zero():
    q = Quantize(shape=(), bitwidth=8, symmetric=True)
    q.set_range(-12.8, 12.7)  # s = 0.1, o = 0
    x = torch.tensor([-0.01, -0.04, 0.0, -0.0, 0.01, -0.26])
    with torch.no_grad():
        x_q = q(x)
    rep = x_q.quantized_repr()
    assert rep.dtype == torch.int8
    assert rep.tolist() == [0, 0, 0, 0, 0, -3]
    # The dequantized route gives the same integer codes.
    assert torch.equal(x_q.dequantize().quantized_repr(), rep)


@pytest.mark.parametrize("cls", [Quantize, QuantizeDequantize])
def test_quantized_repr_of_nan_raises_value_error(cls):
    q = cls(shape=(), bitwidth=8, symmetric=True)
    q.set_range(-1.0, 1.0)
    with torch.no_grad():
        t = q(torch.tensor([0.5, float("nan"), -0.25]))
    with pytest.raises(ValueError):
        t.quantized_repr()


# --------------------------------------------------------------------------------------------------
# which ops keep the encoding
# --------------------------------------------------------------------------------------------------


def _make(kind: str, granularity: str) -> QuantizedTensorBase:
    q, x = _calibrated(Quantize if kind == "q" else QuantizeDequantize, granularity, symmetric=False)
    with torch.no_grad():
        return q(x)


KEEPING_OPS = {
    "clone": lambda t: t.clone(),
    "torch.clone": lambda t: torch.clone(t),
    "detach": lambda t: t.detach(),
    "contiguous": lambda t: t.contiguous(),
    "to_float64": lambda t: t.to(torch.float64),
    "double": lambda t: t.double(),
}


@pytest.mark.parametrize("kind", ["q", "dq"])
@pytest.mark.parametrize("granularity", list(GRANULARITIES))
@pytest.mark.parametrize("op", list(KEEPING_OPS))
def test_value_preserving_ops_keep_the_encoding_at_any_granularity(op, granularity, kind):
    t = _make(kind, granularity)
    out = KEEPING_OPS[op](t)
    assert type(out) is type(t)
    assert out.encoding is not None
    assert out.encoding == t.encoding
    assert torch.equal(out.as_subclass(torch.Tensor).to(t.dtype), t.as_subclass(torch.Tensor))
    # The kept encoding still works: it maps the values to the same codes as before the op.
    if kind == "q":
        assert torch.equal(out.dequantize().quantize().as_subclass(torch.Tensor), out.as_subclass(torch.Tensor))
    else:
        assert torch.equal(out.quantize().as_subclass(torch.Tensor).to(t.dtype),
                           t.quantize().as_subclass(torch.Tensor))


@pytest.mark.parametrize("kind", ["q", "dq"])
@pytest.mark.parametrize("granularity", list(GRANULARITIES))
def test_torch_save_and_load_keep_type_values_and_encoding(granularity, kind):
    t = _make(kind, granularity)
    buf = io.BytesIO()
    torch.save(t, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert type(loaded) is type(t)
    assert loaded.encoding == t.encoding
    assert torch.equal(loaded.as_subclass(torch.Tensor), t.as_subclass(torch.Tensor))


PER_TENSOR_VIEW_OPS = {
    "view": lambda t: t.view(-1),
    "reshape": lambda t: t.reshape(2, -1),
    "torch.reshape": lambda t: torch.reshape(t, (-1, 2)),
    "transpose": lambda t: t.transpose(0, 1),
    "t": lambda t: t.t(),
    "index": lambda t: t[1],
    "slice": lambda t: t[:, 1:3],
    "flatten": lambda t: t.flatten(),
    "torch.flatten": lambda t: torch.flatten(t),
    "unsqueeze": lambda t: t.unsqueeze(0),
    "permute": lambda t: t.permute(1, 0),
}


@pytest.mark.parametrize("kind", ["q", "dq"])
@pytest.mark.parametrize("op", list(PER_TENSOR_VIEW_OPS))
def test_view_like_ops_keep_a_per_tensor_encoding(op, kind):
    t = _make(kind, "per_tensor")
    out = PER_TENSOR_VIEW_OPS[op](t)
    assert type(out) is type(t)
    assert out.encoding == t.encoding
    expected = PER_TENSOR_VIEW_OPS[op](t.as_subclass(torch.Tensor))
    assert torch.equal(out.as_subclass(torch.Tensor), expected)
    # The encoding is still usable on the new shape.
    other = out.dequantize() if kind == "q" else out.quantize()
    assert other.shape == out.shape


@pytest.mark.parametrize("kind", ["q", "dq"])
@pytest.mark.parametrize("granularity", ["per_channel", "per_block"])
@pytest.mark.parametrize("op", ["view", "reshape", "transpose", "index", "flatten", "permute"])
def test_view_like_ops_drop_a_per_channel_or_per_block_encoding(op, granularity, kind):
    t = _make(kind, granularity)
    out = PER_TENSOR_VIEW_OPS[op](t)
    assert type(out) is torch.Tensor
    assert not hasattr(out, "encoding")
    assert torch.equal(out, PER_TENSOR_VIEW_OPS[op](t.as_subclass(torch.Tensor)))
    # clone/detach of the same tensor keep it (checked in full above; here as a contrast).
    assert type(t.clone()) is type(t) and t.clone().encoding == t.encoding
    assert type(t.detach()) is type(t) and t.detach().encoding == t.encoding


ARITHMETIC_OPS = {
    "add_scalar": lambda t: t + 1,
    "radd_scalar": lambda t: 1 + t,
    "mul_self": lambda t: t * t,
    "sub_self": lambda t: t - t,
    "relu": lambda t: torch.relu(t),
    "neg": lambda t: -t,
    "sum": lambda t: t.sum(),
    "matmul": lambda t: t @ t.as_subclass(torch.Tensor).T,
}


@pytest.mark.parametrize("kind", ["q", "dq"])
@pytest.mark.parametrize("granularity", ["per_tensor", "per_channel"])
@pytest.mark.parametrize("op", list(ARITHMETIC_OPS))
def test_arithmetic_returns_plain_tensors(op, granularity, kind):
    t = _make(kind, granularity)
    out = ARITHMETIC_OPS[op](t)
    assert type(out) is torch.Tensor
    expected = ARITHMETIC_OPS[op](t.as_subclass(torch.Tensor))
    assert torch.equal(out, expected)


@pytest.mark.parametrize("kind", ["q", "dq"])
@pytest.mark.parametrize(
    "inplace",
    [
        pytest.param(lambda t: t.add_(1), id="add_"),
        pytest.param(lambda t: t.mul_(2), id="mul_"),
        pytest.param(lambda t: t.__iadd__(1), id="iadd"),
        pytest.param(lambda t: t.__setitem__(0, 5.0), id="setitem"),
    ],
)
def test_in_place_op_drops_the_encoding(inplace, kind):
    t = _make(kind, "per_tensor").clone()
    assert t.encoding is not None
    before = t.as_subclass(torch.Tensor).clone()
    inplace(t)
    assert not torch.equal(t.as_subclass(torch.Tensor), before)  # it really was written
    assert t.encoding is None


@pytest.mark.parametrize("kind", ["q", "dq"])
@pytest.mark.parametrize("method", ["quantize", "dequantize"])
def test_conversions_after_in_place_op_raise_runtime_error(method, kind):
    # After ``add_`` the values are no longer known to be on the grid, so neither form can be produced,
    # not even the "identity" one (a QuantizedTensor without an encoding is not a quantized tensor).
    t = _make(kind, "per_tensor").clone()
    t.add_(0.5)
    assert t.encoding is None
    with pytest.raises(RuntimeError):
        getattr(t, method)()


def test_quantized_repr_after_in_place_op_raises_runtime_error():
    t = _make("q", "per_tensor").clone()
    t.add_(1)
    with pytest.raises(RuntimeError):
        t.quantized_repr()


def test_cast_that_cannot_hold_16_bit_codes_returns_plain_tensor():
    q = Quantize(shape=(), bitwidth=16, symmetric=False)
    q.set_range(0.0, 65535.0)  # s = 1, o = 0
    with torch.no_grad():
        x_q = q(torch.tensor([0.0, 257.0, 4097.0, 65535.0]))
    assert x_q.dtype == torch.float32
    # bfloat16 holds integers exactly only up to 256 (257 -> 256), float16 up to 2048 (4097 -> 4096).
    for cast in (lambda t: t.bfloat16(), lambda t: t.to(torch.bfloat16), lambda t: t.half()):
        out = cast(x_q)
        assert type(out) is torch.Tensor
    # float64 still holds them: the encoding survives.
    out = x_q.to(torch.float64)
    assert type(out) is QuantizedTensor and out.encoding == x_q.encoding
    assert out.tolist() == [0.0, 257.0, 4097.0, 65535.0]


def test_cast_of_8_bit_codes_to_bfloat16_keeps_the_encoding():
    # Contrast with the 16-bit case: every code of [-128, 127] is exact in bfloat16.
    q = Quantize(shape=(), bitwidth=8, symmetric=True)
    q.set_range(-12.8, 12.7)
    with torch.no_grad():
        x_q = q(torch.tensor([-20.0, -0.3, 0.26, 12.7]))
    out = x_q.to(torch.bfloat16)
    assert type(out) is QuantizedTensor
    assert out.encoding == x_q.encoding
    assert out.float().tolist() == [-128.0, -3.0, 3.0, 127.0]


# --------------------------------------------------------------------------------------------------
# autograd
# --------------------------------------------------------------------------------------------------


def test_gradient_flows_through_dequantized_tensor_to_the_input():
    # Range [-10, 41], s = 0.2: inside elements get gradient 1 (STE), clamped ones 0.
    x = torch.tensor([-12.0, -10.0, 0.39, 3.521, 41.0, 43.0], requires_grad=True)
    q = QuantizeDequantize(shape=(), bitwidth=8)
    q.set_range(-10.0, 41.0)
    y = q(x)
    assert type(y) is DequantizedTensor and y.requires_grad
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    (y * weights).sum().backward()
    assert torch.equal(x.grad, torch.tensor([0.0, 2.0, 3.0, 4.0, 5.0, 0.0]))


def test_gradient_flows_through_quantize_then_dequantize():
    # d/dx DQ(Q(x)) = s * (1/s) * inside = inside.
    x = torch.tensor([-12.0, 0.39, 3.521, 43.0], requires_grad=True)
    q = Quantize(shape=(), bitwidth=8)
    q.set_range(-10.0, 41.0)
    x_q = q(x)
    x_dq = x_q.dequantize()
    assert type(x_dq) is DequantizedTensor and x_dq.requires_grad
    x_dq.sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([0.0, 1.0, 1.0, 0.0]))


def test_gradient_flows_through_view_like_op_on_dequantized_tensor():
    x = torch.linspace(-1.0, 1.0, 12).reshape(3, 4).requires_grad_()
    q = QuantizeDequantize(shape=(), bitwidth=8, symmetric=True)
    q.set_range(-2.0, 2.0)
    y = q(x).transpose(0, 1)
    assert type(y) is DequantizedTensor
    y[0].sum().backward()
    expected = torch.zeros(3, 4)
    expected[:, 0] = 1.0
    assert torch.equal(x.grad, expected)


# --------------------------------------------------------------------------------------------------
# copy / pickle
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["q", "dq"])
@pytest.mark.parametrize("granularity", list(GRANULARITIES))
def test_deepcopy_keeps_type_values_and_encoding(granularity, kind):
    t = _make(kind, granularity)
    c = copy.deepcopy(t)
    assert type(c) is type(t)
    assert c.encoding == t.encoding
    assert torch.equal(c.as_subclass(torch.Tensor), t.as_subclass(torch.Tensor))
    assert c.data_ptr() != t.data_ptr()


@pytest.mark.parametrize("kind", ["q", "dq"])
@pytest.mark.parametrize("granularity", list(GRANULARITIES))
def test_pickle_keeps_type_values_and_encoding(granularity, kind):
    t = _make(kind, granularity)
    p = pickle.loads(pickle.dumps(t))
    assert type(p) is type(t)
    assert p.encoding == t.encoding
    assert torch.equal(p.as_subclass(torch.Tensor), t.as_subclass(torch.Tensor))
    # Still converts exactly with its unpickled encoding.
    if kind == "q":
        assert torch.equal(p.dequantize().as_subclass(torch.Tensor), t.dequantize().as_subclass(torch.Tensor))
    else:
        assert torch.equal(p.quantize().as_subclass(torch.Tensor), t.quantize().as_subclass(torch.Tensor))
