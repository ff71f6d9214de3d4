"""Concurrency: calibrated quantizers, sims and quantize_'d models used from 4 threads give the serial bits.

Each subject is calibrated (or quantized) once, then every input is run serially to
record the reference outputs. Then 4 threads (``ThreadPoolExecutor``, started together
behind a barrier) each run many forward passes over their own inputs, in their own order,
and every result must equal the reference bit for bit. Forward passes mutate caches
(quantizer plans and scale/offset caches, a sim's eval-mode cache of fake-quantized
weights, the per-shape plan cache that is cleared after 16 shapes), so a data race
would show here as a wrong or torn result or an exception.

Grad mode is thread-local in PyTorch: a ``torch.no_grad()`` in the main thread does not
reach worker threads, so each worker enters its own (as a user's server threads must).
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch
from torch import nn

import quanta.quantization as Q
from quanta.quantsim import QuantizationSimModel
from quanta.tensor_quant import QuantDescriptor, TensorQuantizer

THREADS = 4
ROUNDS = int(os.environ.get("QUANTA_STRESS_ROUNDS", "6"))  # passes of each thread over its inputs


def _plain(y: Any) -> torch.Tensor:
    return y.as_subclass(torch.Tensor) if isinstance(y, torch.Tensor) else y


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        bits = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16,
                torch.float64: torch.int64}[a.dtype]
        return torch.equal(a.contiguous().view(bits), b.contiguous().view(bits))
    return torch.equal(a, b)


@contextlib.contextmanager
def _frequent_switches(interval: float = 1e-5):
    """Let the interpreter switch threads every 10 µs (default 5 ms), so Python-level races interleave often."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def run_concurrently(fn: Callable[[torch.Tensor], Any], inputs: list[torch.Tensor], *, grad: bool = False) -> None:
    """Serial references first, then THREADS threads over disjoint input subsets; every result bit-identical."""
    with torch.set_grad_enabled(grad):
        reference = [_plain(fn(x)).detach().clone() for x in inputs]
    barrier = threading.Barrier(THREADS)

    def worker(t: int) -> list[str]:
        mine = list(range(t, len(inputs), THREADS)) or [t % len(inputs)]
        order = [i for _ in range(ROUNDS) for i in mine]
        random.Random(t).shuffle(order)
        problems = []
        barrier.wait()
        with torch.set_grad_enabled(grad):  # grad mode is per thread
            for i in order:
                y = _plain(fn(inputs[i])).detach()
                if not _same_bits(y, reference[i]):
                    diff = (y.float() - reference[i].float()).abs().max().item() if y.shape == reference[i].shape \
                        else f"shape {tuple(y.shape)} vs {tuple(reference[i].shape)}"
                    problems.append(f"thread {t}, input {i}: differs from serial (max |diff| {diff})")
        return problems

    with _frequent_switches(), ThreadPoolExecutor(THREADS) as pool:
        results = list(pool.map(worker, range(THREADS)))  # re-raises a worker's exception
    problems = [p for r in results for p in r]
    assert not problems, problems[:5]
    # and the serial results did not change after the concurrent phase
    with torch.set_grad_enabled(grad):
        assert all(_same_bits(_plain(fn(x)).detach(), ref) for x, ref in zip(inputs, reference))


def _inputs(shapes: list[tuple[int, ...]], seed: int = 0, scale: float = 1.0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g) * scale for s in shapes]


# ============================================================================ quantizers
def _calibrated(q: nn.Module, data: torch.Tensor) -> nn.Module:
    with q.compute_encodings():
        q(data)
    return q


def _affine_per_tensor() -> nn.Module:
    return _calibrated(Q.affine.QuantizeDequantize(shape=(), bitwidth=8, symmetric=False), torch.randn(64, 96) * 2)


def _affine_per_channel() -> nn.Module:
    return _calibrated(Q.affine.QuantizeDequantize(shape=(64, 1), bitwidth=4, symmetric=True), torch.randn(64, 96))


def _affine_per_block() -> nn.Module:
    return _calibrated(Q.affine.QuantizeDequantize(shape=(64, 3), block_size=(-1, 32), bitwidth=4, symmetric=True),
                       torch.randn(64, 96))


def _float_fp4() -> nn.Module:
    return _calibrated(Q.float.FloatQuantizeDequantize(exponent_bits=2, mantissa_bits=1, finite=True),
                       torch.randn(64, 96))


def _float8_cast() -> nn.Module:
    return Q.float.FloatQuantizeDequantize(dtype=torch.float8_e4m3fn)


def _tensor_quantizer(axis: int | None, calib: str) -> nn.Module:
    q = TensorQuantizer(QuantDescriptor(num_bits=8, axis=axis, calib_method=calib))
    q.disable_quant()
    q.enable_calib()
    q(torch.randn(64, 96, generator=torch.Generator().manual_seed(3)))
    if calib == "histogram":
        q.load_calib_amax("percentile", percentile=99.9)
    else:
        q.load_calib_amax()
    q.disable_calib()
    q.enable_quant()
    return q


QUANTIZERS: dict[str, tuple[Callable[[], nn.Module], list[tuple[int, ...]]]] = {
    # per-tensor: 20 different shapes, so the per-shape plan cache (cleared after 16) churns under the threads
    "affine_per_tensor": (_affine_per_tensor, [(8 + i, 24 + 3 * i) for i in range(20)]),
    "affine_per_channel": (_affine_per_channel, [(64, 96)] * 8 + [(64, 40)] * 4),
    "affine_per_block": (_affine_per_block, [(64, 96)] * 8),
    "float_fp4": (_float_fp4, [(64, 96)] * 6 + [(5, 7)] * 6),
    "float8_cast": (_float8_cast, [(64, 96)] * 8),
    "tensor_quantizer_per_tensor": (lambda: _tensor_quantizer(None, "max"), [(64, 96)] * 6 + [(3, 33)] * 6),
    "tensor_quantizer_per_channel": (lambda: _tensor_quantizer(0, "max"), [(64, 96)] * 8),
    "tensor_quantizer_histogram": (lambda: _tensor_quantizer(0, "histogram"), [(64, 96)] * 8),
}


@pytest.mark.parametrize("name", list(QUANTIZERS))
def test_quantizers_are_thread_safe(name):
    factory, shapes = QUANTIZERS[name]
    q = factory()
    run_concurrently(q, _inputs(shapes, seed=1, scale=1.5))


@pytest.mark.parametrize("name", ["affine_per_tensor", "affine_per_channel", "float_fp4"])
def test_quantizers_are_thread_safe_with_autograd(name):
    """Under autograd the quantizers take their one-node path (range gradients): same bits from every thread."""
    factory, shapes = QUANTIZERS[name]
    q = factory()
    run_concurrently(q, [x.requires_grad_() for x in _inputs(shapes[:8], seed=2)], grad=True)


def test_functional_api_is_thread_safe():
    scale = torch.rand(64, 1, generator=torch.Generator().manual_seed(4)) * 0.05 + 0.01
    offset = torch.zeros(64, 1)

    def fn(x):
        return Q.affine.quantize_dequantize(x, scale, offset, bitwidth=8, signed=True)

    run_concurrently(fn, _inputs([(64, 128)] * 8, seed=5, scale=2.0))


# ============================================================================ QuantizationSimModel
def _sim(kind: str) -> tuple[QuantizationSimModel, list[torch.Tensor]]:
    from quantsim_models import SmallCNN, TransformerBlock

    torch.manual_seed(0)
    if kind == "cnn":
        model, shapes = SmallCNN().eval(), [(2, 3, 16, 16)] * 6 + [(1, 3, 16, 16)] * 2
    else:
        model, shapes = TransformerBlock().eval(), [(2, 6, 32)] * 6 + [(1, 4, 32)] * 2
    calib = _inputs(shapes[:3], seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim = QuantizationSimModel(model, calib[0])
        sim.compute_encodings(lambda m: [m(x) for x in calib], progress=False)
    sim.model.eval()
    return sim, _inputs(shapes, seed=8)


@pytest.mark.parametrize("kind", ["cnn", "transformer"])
def test_sim_inference_is_thread_safe(kind):
    sim, inputs = _sim(kind)
    run_concurrently(sim.model, inputs)


@pytest.mark.parametrize("kind", ["cnn", "transformer"])
def test_sim_cold_weight_cache_is_thread_safe(kind):
    """The eval-mode weight cache is empty when the threads start (``eval()`` clears it): they all fill it at once."""
    sim, inputs = _sim(kind)
    with torch.no_grad():
        reference = [sim.model(x).clone() for x in inputs]
    for _ in range(3):
        sim.model.eval()  # drops every module's cache of fake-quantized weights
        barrier = threading.Barrier(THREADS)

        def worker(t: int) -> bool:
            barrier.wait()
            with torch.no_grad():
                return all(_same_bits(sim.model(inputs[i]), reference[i]) for i in range(t, len(inputs), THREADS))

        with _frequent_switches(), ThreadPoolExecutor(THREADS) as pool:
            assert all(pool.map(worker, range(THREADS)))


# ============================================================================ quantize_
QUANTIZE_CONFIGS = {
    "int8_weight_only": lambda: Q.Int8WeightOnlyConfig(),
    "int4_weight_only": lambda: Q.Int4WeightOnlyConfig(group_size=32),
    "int8_dynamic_activation_int8_weight": lambda: Q.Int8DynamicActivationInt8WeightConfig(),
}


@pytest.mark.parametrize("name", list(QUANTIZE_CONFIGS))
def test_quantized_model_is_thread_safe(name):
    from quantized_models import make_model

    model = make_model(seed=0).eval()
    Q.quantize_(model, QUANTIZE_CONFIGS[name]())
    run_concurrently(model, _inputs([(5, 128)] * 6 + [(1, 128)] * 3 + [(17, 128)] * 3, seed=9))
