"""Determinism of calibration: same data, same bits — across runs, batch orders and batch sizes.

* MinMax quantizers (per tensor, per channel, per block; AIMET affine, float formats,
  TensorRT's max calibrator): any permutation of the batches and any split of the
  same rows into batches give bit-identical ``min``/``max`` (and so scale/offset).
* Histogram analyzers (percentile, SQNR; TensorRT's histogram calibrator): two runs
  with the same batches give identical bits; without a growth limit quanta's
  histograms are documented to stream exactly, so batch order and split do not matter
  either.
* A whole ``QuantizationSimModel``: two fresh sims calibrated on the same batches are
  bit-identical (min_max, percentile, sqnr), and so are any permutation of the batches.
  Re-splitting the data keeps the bits with ``compute_encodings_sequential``; with the
  one-pass ``compute_encodings`` it does not, by design (see
  :func:`test_one_pass_sim_calibration_depends_on_the_batch_split`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import quanta.quantization as Q
from quanta.quantization.encoding_analyzer import PercentileEncodingAnalyzer, SqnrEncodingAnalyzer
from quanta.quantsim import QuantizationSimModel
from quanta.tensor_quant import QuantDescriptor, TensorQuantizer

ROWS, COLS = 48, 16


def _data() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(ROWS, COLS, generator=g)
    x[5, 3], x[40, 7], x[17, 0] = 40.0, -25.0, -0.0  # outliers in single rows and a negative zero
    x[:, 9] = x[:, 9].abs()  # an all-positive channel
    x[:, 10] = 0.0  # an all-zero (degenerate) channel
    return x


X = _data()


@st.composite
def batchings(draw, rows: int = ROWS, min_size: int = 1) -> list[torch.Tensor]:
    """The rows of X cut at random points into batches (each at least ``min_size`` rows), then shuffled."""
    cuts = draw(st.sets(st.integers(1, rows - 1), max_size=12))
    edges = [0, *sorted(cuts), rows]
    sizes = [b - a for a, b in zip(edges, edges[1:])]
    if min(sizes) < min_size:
        sizes = [rows]
    order = draw(st.permutations(range(len(sizes))))
    parts = list(X.split(sizes))
    return [parts[i] for i in order]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32)


def _snapshot(q: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of the quantizer's state (ranges, amax), as raw bits."""
    return {k: _bits(v.float()) if v.is_floating_point() else v.clone() for k, v in q.state_dict().items()}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    bad = [k for k in a if a[k].shape != b[k].shape or not torch.equal(a[k], b[k])]
    assert not bad, f"differ: {bad}"


# ============================================================================ single quantizers
def _calibrate_aimet(make: Callable[[], nn.Module], batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    q = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with q.compute_encodings():
            for b in batches:
                q(b)
    out = _snapshot(q)
    enc = q.get_encodings()
    out["__scale"] = _bits(enc.scale)
    if hasattr(enc, "offset"):
        out["__offset"] = _bits(torch.broadcast_to(enc.offset, enc.scale.shape).float())
    return out


def _calibrate_tensorrt(axis: int | None, calib: str, batches: list[torch.Tensor], *amax_args, **amax_kwargs):
    q = TensorQuantizer(QuantDescriptor(num_bits=8, axis=axis, calib_method=calib))
    q.disable_quant()
    q.enable_calib()
    for b in batches:
        q(b)
    q.load_calib_amax(*amax_args, **amax_kwargs)
    return {"amax": _bits(q.amax.float())}


MINMAX_QUANTIZERS: dict[str, Callable[[], nn.Module]] = {
    "per_tensor_asymmetric": lambda: Q.affine.QuantizeDequantize(shape=(), bitwidth=8, symmetric=False),
    "per_tensor_symmetric": lambda: Q.affine.QuantizeDequantize(shape=(), bitwidth=8, symmetric=True),
    "per_channel_symmetric": lambda: Q.affine.QuantizeDequantize(shape=(1, COLS), bitwidth=4, symmetric=True),
    "per_channel_asymmetric": lambda: Q.affine.QuantizeDequantize(shape=(1, COLS), bitwidth=8, symmetric=False),
    "per_block": lambda: Q.affine.QuantizeDequantize(shape=(1, COLS // 4), block_size=(-1, 4), bitwidth=4,
                                                     symmetric=True),
    "float_fp4_per_channel": lambda: Q.float.FloatQuantizeDequantize(exponent_bits=2, mantissa_bits=1, finite=True,
                                                                     shape=(1, COLS)),
    "float8_per_tensor": lambda: Q.float.FloatQuantizeDequantize(exponent_bits=4, mantissa_bits=3, finite=True),
}
MINMAX_REFERENCE = {name: _calibrate_aimet(make, [X]) for name, make in MINMAX_QUANTIZERS.items()}


@settings(max_examples=min(settings().max_examples, 15))  # each example calibrates all 7 quantizers
@given(batches=batchings())
def test_minmax_quantizers_ignore_batch_order_and_size(batches):
    for name, make in MINMAX_QUANTIZERS.items():
        _assert_same(_calibrate_aimet(make, batches), MINMAX_REFERENCE[name])


@settings(max_examples=min(settings().max_examples, 15))
@given(batches=batchings())
def test_tensorrt_max_calibrator_ignores_batch_order_and_size(batches):
    for axis in (None, 1):
        _assert_same(_calibrate_tensorrt(axis, "max", batches), _calibrate_tensorrt(axis, "max", [X]))


def test_minmax_ignores_non_finite_values_in_any_batch():
    """NaN/inf are skipped (with a warning) wherever they appear: same bits as the clean data."""
    dirty = X.clone()
    dirty[3, 2], dirty[30, 2], dirty[31, 5] = float("nan"), float("inf"), float("-inf")
    clean = X.clone()
    clean[3, 2], clean[30, 2], clean[31, 5] = clean[2, 2], clean[2, 2], clean[2, 5]  # a value seen anyway
    for name in ("per_tensor_asymmetric", "per_channel_asymmetric"):
        make = MINMAX_QUANTIZERS[name]
        _assert_same(_calibrate_aimet(make, list(dirty.split(7))), _calibrate_aimet(make, [clean]))


# ============================================================================ histogram analyzers
def _histogram_quantizer(kind: str, shape: tuple[int, ...]) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        analyzer = (PercentileEncodingAnalyzer(shape, num_bins=512, percentile=99.0) if kind == "percentile"
                    else SqnrEncodingAnalyzer(shape, num_bins=512))
        return Q.affine.QuantizeDequantize(shape=shape, bitwidth=8, symmetric=False, encoding_analyzer=analyzer)

    return make


HISTOGRAM_QUANTIZERS = {f"{kind}_{g}": _histogram_quantizer(kind, shape)
                        for kind in ("percentile", "sqnr") for g, shape in (("per_tensor", ()),
                                                                            ("per_channel", (1, COLS)))}


@pytest.mark.parametrize("name", list(HISTOGRAM_QUANTIZERS))
def test_histogram_analyzers_are_repeatable(name):
    make = HISTOGRAM_QUANTIZERS[name]
    batches = list(X.split(5))
    _assert_same(_calibrate_aimet(make, batches), _calibrate_aimet(make, batches))


@settings(max_examples=min(settings().max_examples, 10))
@given(batches=batchings())
def test_histogram_analyzers_stream_exactly(batches):
    """Documented: power-of-two bins anchored at zero merge exactly, so order and split do not matter."""
    for name, make in HISTOGRAM_QUANTIZERS.items():
        _assert_same(_calibrate_aimet(make, batches), _calibrate_aimet(make, [X]))


@pytest.mark.parametrize("method, kwargs", [("percentile", {"percentile": 99.9}), ("mse", {}), ("entropy", {})])
def test_tensorrt_histogram_calibrator_is_repeatable(method, kwargs):
    # without X's outliers: with grow_method="append" a value 16x the first batch's max appends ~30k bins, and
    # the mse/entropy searches then take minutes (their cost grows with the square of the bin count)
    batches = list(X.clamp(-3, 3).split(6))
    for axis in (None, 1):
        a = _calibrate_tensorrt(axis, "histogram", batches, method, **kwargs)
        b = _calibrate_tensorrt(axis, "histogram", batches, method, **kwargs)
        _assert_same(a, b)


# ============================================================================ whole sims
def _model_and_data(kind: str) -> tuple[nn.Module, torch.Tensor]:
    from quantsim_models import SmallCNN, TransformerBlock

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    if kind == "cnn":
        return SmallCNN().eval(), torch.randn(16, 3, 16, 16, generator=g)
    return TransformerBlock().eval(), torch.randn(16, 6, 32, generator=g)


MODELS = {kind: _model_and_data(kind) for kind in ("cnn", "transformer")}


def _sim_state(kind: str, batches: list[torch.Tensor], scheme: str = "min_max",
               sequential: bool = False) -> dict[str, torch.Tensor]:
    model, data = MODELS[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, data[:2], quant_scheme=scheme)
        if sequential:
            sim.compute_encodings_sequential(batches, progress=False)
        else:
            sim.compute_encodings(lambda m: [m(b) for b in batches], progress=False)
    return {k: _bits(v.float()) if v.is_floating_point() else v.clone()
            for k, v in sim.quantizer_state_dict().items()}


@pytest.mark.parametrize("scheme", ["min_max", "percentile", "sqnr"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_sim_calibration_is_repeatable(kind, scheme):
    batches = list(MODELS[kind][1].split(4))
    _assert_same(_sim_state(kind, batches, scheme), _sim_state(kind, batches, scheme))


@settings(max_examples=min(settings().max_examples, 6))  # each example builds and calibrates two sims
@given(order=st.permutations(range(4)))
def test_sim_calibration_ignores_batch_order(order):
    for kind in MODELS:
        batches = list(MODELS[kind][1].split(4))
        _assert_same(_sim_state(kind, [batches[i] for i in order]), _sim_state(kind, batches))


@settings(max_examples=min(settings().max_examples, 6))
@given(sizes=st.sampled_from([[16], [8, 8], [2, 6, 8], [4, 4, 4, 4], [6, 2, 2, 6], [10, 6]]),
       order=st.permutations(range(4)))
def test_sequential_sim_calibration_ignores_batch_order_and_size(sizes, order):
    """compute_encodings_sequential calibrates each op on inputs quantized with the final ranges of the ops
    before it, so the split does not matter (batches of >= 2 rows: SmallCNN's float convolution itself gives
    other bits for a batch of one, a PyTorch kernel choice)."""
    for kind in MODELS:
        data = MODELS[kind][1]
        parts = list(data.split(sizes))
        parts = [parts[i] for i in order if i < len(parts)]
        _assert_same(_sim_state(kind, parts, sequential=True), _sim_state(kind, [data], sequential=True))


def test_one_pass_sim_calibration_ignores_the_batch_split():
    """compute_encodings observes float activations (AIMET 2.42's rule: the activation quantizers pass their
    inputs on during calibration), so with a batch-size-invariant float model the split does not matter."""
    model, data = MODELS["transformer"]
    with torch.no_grad():  # the float model itself is batch-size invariant here
        assert torch.equal(torch.cat([model(b) for b in data.split(4)]), model(data))
    _assert_same(_sim_state("transformer", list(data.split(4))), _sim_state("transformer", [data]))
